// When the executor queues a successor: a launch of its own, enqueued behind the one
// running now, which the GPU starts the moment that one ends (issue 36). Without one, a
// launch that ends at its time slice while the bubble goes on (no close pending yet)
// leaves the SMs idle for the host's round trip: the executor's thread sees the end
// record, wakes and enqueues the next launch (266 us median on an H200).
//
// Off by default (FREERIDE_SUCCESSORS=1 turns it on) until a GPU run has measured it and
// checked two things no CPU can: that a device-wide synchronisation issued in a bubble
// with no close enqueued still returns (CUDA documents that it waits for the tasks
// requested before it; a successor queued after the call should not count), and what a
// successor that finds the gate closed costs the pause (its blocks start as the running
// launch's leave, then exit at their first claim).
//
// A successor costs a device-wide synchronisation issued meanwhile one more slice: it
// waits for the running launch and, if it was enqueued before the call, its successor
// (never more than one is queued).
#pragma once

#include <cstddef>

namespace freeride {

// How long before the running launch's slice ends (by the host's clock, from when it saw
// the launch begin) the successor is decided: at least the host's round trip, so that it
// is in the queue when the slice ends, and late enough that the launch's bubble has shown
// it goes on (a bubble shorter than the slice gets none, which would land in the compute
// after it).
constexpr long long kHandOverLeadNs = 300000;

struct SuccessorState {
  bool enabled = false;        // FREERIDE_SUCCESSORS
  bool has_slice = false;      // a time slice (none: a launch runs until the close)
  size_t pending = 0;          // launches enqueued whose end was not taken yet
  bool newest_running = false;  // the newest has begun and is near its slice's end
  bool progressed = false;     // the phase's progress moved since it began: items run
  bool gate_open = false;      // the gate's mirror, not under an open written without a launch
  bool stopping = false;       // a stop is requested, or the runner is abandoned
  bool phase_done = false;     // every item of the phase is done or claimed
  bool follows_protocol = false;  // a task without the item protocol is read back, alone
};

// One launch running near its slice's end, items running, the gate open, work left:
// queue the next behind it. Not behind a launch queued ahead that has not begun (the
// bubble it waits for may be far off), nor a second one; not where a launch that ran
// nothing may have been let in by a stale mirror (no progress: the executor's backoff
// must see it end first).
inline bool queue_successor(const SuccessorState& s) {
  return s.enabled && s.has_slice && s.pending == 1 && s.newest_running && s.progressed &&
         s.gate_open && !s.stopping && !s.phase_done && s.follows_protocol;
}

}  // namespace freeride
