// How the CUDA backend waits for the gate to open: on the bell its watcher rings, looking
// at the host mirror; and the environment settings that choose how.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "cuda/shared.hpp"

namespace freeride::cuda {

// How long a wait for the gate spins on the mirror before it sleeps.
constexpr std::chrono::microseconds kAdmissionSpin{20};
// Without rings (FREERIDE_ADMISSION=poll): the sleep between looks at the mirror.
constexpr std::chrono::microseconds kPollSleep{20};

// Sleeps between looks at the mirror would overshoot by the default 50 us timer slack:
// this thread's slack becomes 1 us (once per thread).
void tighten_timer_slack();

// Until the gate's host mirror reads open (true), or stopped() holds or `deadline` passes
// (false). Spins (yielding) for kAdmissionSpin first: gaps between compute actions are
// often that short, and a ring takes the watcher thread's wake-up and then this one's.
// Then sleeps on the bell, rung when a stream-ordered open has taken effect
// (ring_and_launch) and on an immediate open, looking anyway every unrung.poll(); or,
// where rings are off, polls every kPollSleep.
template <typename Stopped, typename IsOpen>
bool wait_for_gate(const CudaShared& s, std::chrono::steady_clock::time_point deadline,
                   Stopped stopped, IsOpen is_open) {
  Doorbell& bell = *s.gate.bell;
  const auto spin_until = std::chrono::steady_clock::now() + kAdmissionSpin;
  while (true) {
    const uint64_t seen = bell.rings();  // before the checks: a ring between them counts
    if (stopped()) return false;
    if (is_open()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (now < spin_until) {
      std::this_thread::yield();
    } else if (s.ring) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      bell.wait_for(seen, std::min(s.unrung.poll(), left + std::chrono::microseconds(1)));
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

// Whether CUDA_DEVICE_MAX_CONNECTIONS asks for one hardware queue per device (read as the
// driver reads it, when the context is made: a later change has no effect, and this
// reads the environment of now, which is what a process that sets it up front has).
bool single_connection();

// Whether stream-ordered opens enqueue the running task's next launch
// (FREERIDE_LAUNCH_AT_OPEN "1", the default; "0" turns it off: the executor alone then
// launches, when it sees the gate open, as a comparison for benchmarks and tests). Throws
// InvalidArgument for another value.
bool launch_at_opens_enabled();

// Whether the executor queues its next launch behind the one running (freeride/
// successor_rule.hpp; FREERIDE_SUCCESSORS "0", the default, or "1", until a GPU run has
// measured it). Throws InvalidArgument for another value.
bool successors_enabled();

// Whether a runner begins a phase with launches of the one before in flight and chains a
// launch of the next phase at opens (phase_ahead_rule.hpp; FREERIDE_PHASES_AHEAD "0", the
// default, or "1", until a GPU run has qualified it). Throws InvalidArgument for another
// value.
bool phases_ahead_enabled();

// Whether a task that can serve every phase from one launch does (device_phases.hpp;
// FREERIDE_DEVICE_PHASES "1", the default since its tests passed on an H200 at cf361a5,
// or "0": one launch a phase, for comparison). Throws InvalidArgument for another value.
bool device_phases_enabled();

// Whether the executor queues the next task behind one in the tail of its last phase
// (follow_rule.hpp; FREERIDE_FOLLOW "0", the default, or "1", until a GPU run has
// measured it). Throws InvalidArgument for another value.
bool followers_enabled();

// Whether the open watcher's thread enqueues the executor's launch itself when the GPU
// reaches an open that carried none (watcher_launch_rule.hpp; FREERIDE_WATCHER_LAUNCH "0",
// the default, or "1", until a GPU run has measured it). Throws InvalidArgument for
// another value.
bool watcher_launch_enabled();

// Whether a task preempted for a more urgent one runs the items of its launches already
// queued at opens instead of stopping them (withhold_rule.hpp; FREERIDE_WITHHOLD "0", the
// default, or "1", until a GPU run has qualified it). Throws InvalidArgument for another
// value.
bool withhold_enabled();

// The lookahead bound (open_launch_rule.hpp's within_lookahead): FREERIDE_MAX_LOOKAHEAD, a
// whole number of opens, 0 (the default) for none. Throws InvalidArgument for anything
// else.
uint64_t lookahead_bound();

// Whether gate opens ring the executor's bell (FREERIDE_ADMISSION "ring", the default:
// see OpenWatcher) or it polls the mirror ("poll", for comparison in bench preempt).
// Throws InvalidArgument for another value.
bool admission_rings();

}  // namespace freeride::cuda
