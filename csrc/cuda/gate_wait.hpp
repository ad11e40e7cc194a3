// How a thread of the CUDA backend waits for the gate to open: what it does between its
// looks at the gate's host mirror (FREERIDE_ADMISSION). CUDA-free, so that tests drive it
// in every build with a bell and a word of their own.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "cuda/unrung_opens.hpp"
#include "doorbell.hpp"

namespace freeride::cuda {

// FREERIDE_ADMISSION. kRing (the default): the thread sleeps on the gate's bell, which the
// open watcher rings as each stream-ordered open takes effect, looking at the mirror
// anyway every UnrungOpens::poll(). kPoll: it sleeps kPollSleep between looks (for
// comparison). kSpin: it never sleeps while it waits for the gate, yielding between
// looks at the mirror and the bell instead (and the executor, waiting for a launch's
// end, yields too, but for a launch queued at an open that has not come): an open is
// seen within about a yield, without a wake-up (on an H200 at cf361a5, open seen ->
// first items took 286 us at p50 with the ring's two, 73 us polling), and one that rings
// nothing (an open replayed from a CUDA graph) as soon as one that does. It costs a host
// core for as long as a task waits.
enum class AdmissionMode { kRing, kPoll, kSpin };

// How long a wait for the gate spins on the mirror before it sleeps (kRing, kPoll).
constexpr std::chrono::microseconds kAdmissionSpin{20};
// kPoll: the sleep between looks at the mirror.
constexpr std::chrono::microseconds kPollSleep{20};
// kSpin: the longest the yields go on between full looks (the waiter's own predicates,
// which may take a lock a training thread also takes), where neither the gate's word nor
// the bell moved: what is read between them is lock-free.
constexpr std::chrono::microseconds kSpinLookEvery{1000};

// What a wait reads between its looks: the bell (rung by every open that takes effect
// where rings are on, and by whatever else ends a wait: a stop, a submit, a close), the
// unrung opens (where an open may come without a ring), the mode and, for kSpin, the
// longest stretch of yields between full looks.
struct GateWatch {
  Doorbell& bell;
  const UnrungOpens& unrung;
  AdmissionMode mode;
  std::chrono::microseconds spin_look_every = kSpinLookEvery;  // tests make it longer
};

// What a wait did, for tests: its full looks, its sleeps (on the bell or a timer) and its
// stretches of yields.
struct GateWaitCounts {
  uint64_t looks = 0;
  uint64_t sleeps = 0;
  uint64_t spins = 0;
};

// Between two looks of a wait that read `seen` rings and the gate's word `at` before its
// last look, with `deadline` to keep: per g.mode (see AdmissionMode). `word()` is the
// gate's state as the GPU last wrote it (any value that changes with every write that
// takes effect: the mirror and its sequence number); kSpin yields until it differs from
// `at` or the bell's count from `seen`, the deadline passes or g.spin_look_every has gone
// by. Both read before the look, so that a write or a ring landing during it ends the
// stretch at once.
template <typename Word>
void pause_between_looks(const GateWatch& g, uint64_t seen, uint64_t at,
                         std::chrono::steady_clock::time_point deadline, Word word,
                         GateWaitCounts* counts = nullptr) {
  using clock = std::chrono::steady_clock;
  const auto now = clock::now();
  if (now >= deadline) return;
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) +
                    std::chrono::microseconds(1);
  switch (g.mode) {
    case AdmissionMode::kSpin: {
      if (counts != nullptr) ++counts->spins;
      const auto until = std::min(deadline, now + g.spin_look_every);
      while (g.bell.rings() == seen && word() == at && clock::now() < until) {
        std::this_thread::yield();
      }
      return;
    }
    case AdmissionMode::kPoll:
      if (counts != nullptr) ++counts->sleeps;
      std::this_thread::sleep_for(std::min<std::chrono::microseconds>(kPollSleep, left));
      return;
    case AdmissionMode::kRing:
      if (counts != nullptr) ++counts->sleeps;
      g.bell.wait_for(seen, std::min(g.unrung.poll(), left));
      return;
  }
}

// Until is_open() holds (true), or stopped() holds or `deadline` passes (false). Under
// kRing and kPoll it yields for kAdmissionSpin first (gaps between compute actions are
// often that short, and a ring takes the watcher thread's wake-up and then this one's),
// then pauses between looks as pause_between_looks says; kSpin only ever yields. Whatever
// can make is_open() or stopped() true must ring g.bell or move word(), or is seen at the
// next full look (GateWatch::spin_look_every, UnrungOpens::poll(), kPollSleep).
template <typename Word, typename Stopped, typename IsOpen>
bool wait_for_gate(const GateWatch& g, std::chrono::steady_clock::time_point deadline,
                   Word word, Stopped stopped, IsOpen is_open,
                   GateWaitCounts* counts = nullptr) {
  const auto spin_until = std::chrono::steady_clock::now() + kAdmissionSpin;
  while (true) {
    // Before the checks: a ring or a write landing between them counts.
    const uint64_t seen = g.bell.rings();
    const uint64_t at = word();
    if (counts != nullptr) ++counts->looks;
    if (stopped()) return false;
    if (is_open()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (g.mode != AdmissionMode::kSpin && now < spin_until) {
      std::this_thread::yield();
    } else {
      pause_between_looks(g, seen, at, deadline, word, counts);
    }
  }
}

}  // namespace freeride::cuda
