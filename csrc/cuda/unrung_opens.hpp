// Whether the gate's bell alone admits side work, or an open may take effect without a
// ring, so that the executor's waits for the gate must look at the mirror every
// millisecond (review G14: otherwise the executor sleeps through compute).
//
// Once set it stays set: an open written while its stream was captured into a graph
// rings nothing at any replay (it is noted before the capture ends, so before a replay);
// an open whose event could not be recorded or queued rang nothing; and once opens came
// on two streams, the watcher (which waits for events in the order they were written)
// may ring one late, behind an open that the GPU reaches later on the other stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace freeride::cuda {

// The longest the executor thread sleeps on the gate's bell before it looks at the mirror
// anyway, once an open may come without a ring: the admission delay of such an open.
constexpr std::chrono::microseconds kAdmissionPoll{1000};
// The same while every open so far has rung: the bell is then the whole of admission, and
// the look only a backstop (a thousand wake-ups a second to find the gate closed, before).
constexpr std::chrono::microseconds kAdmissionBackstop{20000};

class UnrungOpens {
 public:
  // A stream-ordered open, as the training thread writes it: `captured` where its stream
  // is being captured into a graph, `stream` its stream's handle (the legacy stream's
  // is 0), `ambiguous` where that handle may name another stream on another thread (the
  // per-thread default stream's). Before the open is enqueued. Both return whether this
  // call set it: the caller then rings the bell, so that a waiter already asleep for
  // kAdmissionBackstop looks again, every kAdmissionPoll.
  bool note_open(uintptr_t stream, bool captured, bool ambiguous = false) noexcept {
    if (any()) return false;  // set for good: no exchange on the training thread's path
    const uintptr_t before = last_stream_.exchange(stream, std::memory_order_relaxed);
    if (captured || ambiguous || (before != kNoOpenYet && before != stream)) return set();
    return false;
  }
  // An open that may have taken effect without a ring: its ring could not be enqueued
  // (OpenWatcher::ring_after returned false), or an immediate write failed after it may
  // have been enqueued.
  bool note_unrung() noexcept { return set(); }

  bool any() const noexcept { return unrung_.load(std::memory_order_relaxed); }

  // The longest wait on the bell between looks at the mirror.
  std::chrono::microseconds poll() const noexcept {
    return any() ? kAdmissionPoll : kAdmissionBackstop;
  }

 private:
  bool set() noexcept { return !unrung_.exchange(true, std::memory_order_relaxed); }

  static constexpr uintptr_t kNoOpenYet = ~uintptr_t{0};
  std::atomic<uintptr_t> last_stream_{kNoOpenYet};
  std::atomic<bool> unrung_{false};
};

}  // namespace freeride::cuda
