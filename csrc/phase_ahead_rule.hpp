// Phases ahead (issue 36, review G3): what a stream-ordered open carries, and which
// counters a launch of a phase uses, where a phase boundary does not drain the launches
// queued ahead of the GPU.
//
// Without it, a phase's launches at opens queued ahead of the GPU when the phase completes
// must all end before the next phase begins (its counters are the same words), and the
// opens made meanwhile carry none: about twice the host's lead in bubbles lost at every
// phase. With it:
//
// - A runner keeps two sets of counters, used by phases alternately (phase % 2). The set
//   is cleared on the stream just before the first launch of its new phase is enqueued,
//   so in stream order after every launch of the phase that used it before (two phases
//   back, complete before the phase between began). A stale launch (its phase complete)
//   finds every item of its own phase claimed and leaves at its first claim.
// - The executor begins the next phase as soon as an ended launch says the current one is
//   complete, with stale launches still in flight (it takes their ends as before).
// - An open carries a launch of the current phase and, chained behind it, one of the next
//   phase, guarded: its blocks claim nothing unless the current phase is complete when it
//   begins (freeride/preempt.cuh: fr_item_ctx.after_done). Launches of one runner run one
//   after another on one stream, so that count cannot move while the guarded launch runs,
//   and the kernel boundary makes every item of the phase visible to it. A bubble in which
//   the current phase completes goes on with the next, from the GPU's own queue.
//
// Off by default (FREERIDE_PHASES_AHEAD=1 turns it on for the CUDA backend) until a GPU
// run has qualified it; the test queue backend takes it per executor.
#pragma once

#include <cstddef>
#include <cstdint>

#include "task.hpp"

namespace freeride {

// Sets of counters a runner alternates between. Two suffice: a phase begins only once the
// one before is complete, and an open launches at most the current phase and the next.
constexpr uint64_t kPhaseSlots = 2;

inline uint64_t phase_slot(uint64_t phase) { return phase % kPhaseSlots; }

struct PhaseAheadState {
  bool enabled = false;     // phases ahead on (FREERIDE_PHASES_AHEAD; a task with the protocol)
  uint64_t phase = 0;       // the runner's current phase (begun by the executor)
  uint64_t num_phases = 0;  // the task's
  bool phase_done = false;  // an ended launch counted every item of the current phase
  uint64_t next_items = 0;  // items of phase + 1 (0: none, or it is past the last)
  size_t room = 0;          // launches the runner can still enqueue (its ring's room)
};

// What one open carries: a launch of the current phase, of the next one (chained, guarded
// by the current), both or neither.
struct OpenLaunches {
  bool current = false;
  bool next = false;
};

inline OpenLaunches launches_at_open(const PhaseAheadState& s) {
  OpenLaunches out;
  out.current = !s.phase_done && s.room > 0;
  const bool has_next = s.enabled && s.phase + 1 < s.num_phases && s.next_items > 0;
  out.next = has_next && s.room > (out.current ? 1u : 0u);
  return out;
}

// The same for `task` at its current `phase`: the task's phases and the next one's items
// filled in from it (what both the CUDA runner and the test queue backend know).
inline OpenLaunches launches_at_open(const Task& task, bool enabled, uint64_t phase,
                                     bool phase_done, size_t room) {
  const uint64_t phases = task.num_phases();
  const uint64_t next_items = phase + 1 < phases ? task.num_items(phase + 1) : 0;
  return launches_at_open(PhaseAheadState{enabled, phase, phases, phase_done, next_items, room});
}

}  // namespace freeride
