// Withholding (issue 36 item 1: "an urgent task ... takes effect at the next open without
// draining the host's lead"): what becomes of launches queued at opens ahead of the GPU
// when their task is preempted for a more urgent one. The more urgent task is armed at
// once, so the first open the training thread writes after that carries its first launch.
// The opens written before carry the preempted task's: an enqueued launch runs the kernel
// it was enqueued with (CUDA has no call that changes what a launch queued on a stream
// will run), and every one of them comes before the urgent task's first launch at an
// open in the GPU's queue (one side stream, in host order). Stopped, they run nothing,
// the host's lead in bubbles lost at every preemption. Withheld (PhaseRunner::withhold),
// they take no further open but run the preempted task's items in their bubbles, which
// costs the more urgent task nothing while it has a launch at an open queued (it cannot
// begin before that open).
//
// Where it has none yet, a host-started launch of it can come once the preempted task's
// launches have drained, inside the bubble of the last of them if that one was stopped.
// So the preempted task is withheld only while the more urgent task has launches in
// flight or the preempted task has launches in at least two bubbles (the one it is in
// and a later one): the executor asks again at each end it takes, and stops it once
// neither holds, before the last of its bubbles. Off by default (FREERIDE_WITHHOLD=1)
// until a GPU run has qualified it.
#pragma once

#include <cstdint>

namespace freeride {

struct WithholdState {
  bool enabled = false;         // FREERIDE_WITHHOLD (Backend::withholds)
  uint64_t bubbles = 0;         // the preempted task's: PhaseRunner::bubbles_in_flight
  bool urgent_queued = false;   // the task armed for the opens has launches in flight
};

inline bool withhold_preempted(const WithholdState& s) {
  return s.enabled && (s.urgent_queued || s.bubbles >= 2);
}

// Whether the CUDA backend withholds at all: FREERIDE_WITHHOLD, with launches at opens,
// and not under one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1). withhold() records a
// fence on the side stream behind the withheld launches (settle() must not wait for the
// more urgent task's launches behind them); in one queue that fence holds everything
// enqueued after it, training's next close included, until the newest withheld launch
// ends, and that launch, its bubble's close pending behind the fence, ends only at the
// slice bound (never with time_slice=None). A stop ends them at their next claim instead
// (the review of 2026-11-28).
inline bool withholds(bool enabled, bool launch_at_opens, bool one_queue) {
  return enabled && launch_at_opens && !one_queue;
}

}  // namespace freeride
