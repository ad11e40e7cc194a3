// When the executor queues a successor: a launch of its own, enqueued behind the one
// running now, which the GPU starts the moment that one ends (issue 36). Without one, a
// launch that ends at its time slice while the bubble goes on (no close pending yet)
// leaves the SMs idle for the host's round trip: the executor's thread sees the end
// record, wakes and enqueues the next launch, some hundreds of microseconds.
//
// A successor costs a device-wide synchronisation issued meanwhile one more slice: it
// waits for the running launch and, if it was enqueued before the call, its successor
// (a successor is enqueued only once its predecessor has begun, so never more than that).
// One that finds the gate closed exits at its first claim.
#pragma once

#include <cstddef>

namespace freeride {

struct SuccessorState {
  bool enabled = true;       // FREERIDE_SUCCESSORS
  size_t pending = 0;        // launches enqueued whose end was not taken yet
  bool newest_begun = false;  // the newest of them has begun on the GPU
  bool gate_open = false;    // the gate's mirror, and not under an open written without a launch
  bool stopping = false;     // a stop is requested, or the runner is abandoned
  bool phase_done = false;   // an ended launch counted every item of the phase
  bool follows_protocol = false;  // a task without the item protocol is read back, alone
};

// One launch running, the gate open, work left: queue the next behind it. Not behind a
// launch queued ahead (it has not begun: the bubble it waits for may be far off, and a
// successor would only lengthen the queue others wait behind), nor a second one.
inline bool queue_successor(const SuccessorState& s) {
  return s.enabled && s.pending == 1 && s.newest_begun && s.gate_open && !s.stopping &&
         !s.phase_done && s.follows_protocol;
}

}  // namespace freeride
