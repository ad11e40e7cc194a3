// Device phases (issue 36 item 1, review G3): a launch queued at an open serves whatever
// phase is current when its bubble comes, not the one current when it was enqueued.
//
// Without it, each launch serves one phase (ctx.phase): a phase that completes while
// launches of it are queued ahead of the GPU leaves them stale, and phases ahead
// (phase_ahead_rule.hpp) reach one further phase per open at most. A task of many short
// phases (an iterative stencil, a solver's sweeps) then gets one or two phases per bubble
// and a host round trip for each further one.
//
// With it, a task whose phases all run one kernel over as many items with the same
// arguments (Task::supports_device_phases) is one phase of every phase's items to the
// executor: claim g of its one claim counter is item g % n of phase g / n, and the kernel
// (freeride::for_each_phase_item, preempt.cuh) keeps the phases in order on the device, a
// block that claims into a later phase waiting until every item before it is counted.
// Nothing on the host moves from phase to phase: launches at opens, successors, stale
// launches and ends all see one phase, so none of them stalls at a boundary.
//
// On by default for the CUDA backend since its GPU tests passed on an H200 at cf361a5,
// where a 30-phase task harvested 49-54% of 20 ms queued bubbles against 10-31% without
// and PageRank's item overhead was -40% against +31% (FREERIDE_DEVICE_PHASES=0 turns it
// off); the test queue backend takes it per executor. The host backend runs phases in
// order itself and never takes it.
#pragma once

#include <memory>

#include "task.hpp"

namespace freeride {

// `task` as the executor runs it: seen through device phases where `enabled` (the
// backend's switch) and the task can serve every phase from one launch and has more than
// one phase; itself otherwise.
std::shared_ptr<Task> with_device_phases(std::shared_ptr<Task> task, bool enabled);

}  // namespace freeride
