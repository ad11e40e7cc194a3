// The CUDA backend's wait for the gate to open (gate_wait.hpp over its shared state), and
// the environment settings that choose how it admits and launches side work.
#pragma once

#include <chrono>
#include <cstdint>

#include "cuda/gate_wait.hpp"
#include "cuda/shared.hpp"

namespace freeride::cuda {

// Sleeps between looks at the mirror would overshoot by the default 50 us timer slack:
// this thread's slack becomes 1 us (once per thread).
void tighten_timer_slack();

// A wait for the gate as the CUDA backend's threads make it (gate_wait.hpp): on `s`'s
// bell, unrung opens and admission mode, the mirror and its number for the gate's word.
template <typename Stopped, typename IsOpen>
bool wait_for_gate(const CudaShared& s, std::chrono::steady_clock::time_point deadline,
                   Stopped stopped, IsOpen is_open) {
  return wait_for_gate(s.gate_watch(), deadline, [&] { return s.gate_word(); }, stopped,
                       is_open);
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

// Whether the green context asks for workqueues of its own: FREERIDE_GREEN_WORKQUEUE
// "shared" (the default: the device's, as every context's) or "balanced"
// (CudaShared::try_green_context). Throws InvalidArgument for another value.
bool balanced_workqueues_wanted();

// How the executor learns that an open took effect (gate_wait.hpp's AdmissionMode):
// FREERIDE_ADMISSION "ring" (the default: the open watcher rings its bell), "poll" (it
// sleeps between looks at the mirror, for comparison in bench preempt) or "spin" (it
// yields between looks, and the watcher still rings). Throws InvalidArgument for another
// value.
AdmissionMode admission_mode();

}  // namespace freeride::cuda
