// Executor: the next task armed while the one before drains launches that will run
// nothing (or, withheld for a more urgent task, its own items: withhold_rule.hpp), or
// following one in the tail of its last phase (follow_rule.hpp), so that the next opens
// carry its launches (PhaseRunner::arm, PhaseRunner::follow).
#include <algorithm>

#include "executor.hpp"
#include "follow_rule.hpp"
#include "withhold_rule.hpp"

namespace freeride {

void Executor::arm_next_locked(const Record* current, bool follow) {
  if (closing_ || !backend_->launches_at_opens()) return;
  Record* next = nullptr;
  for (const QueueKey& k : runnable_) {
    Record& c = *records_.at(k.second);
    if (&c == current || ((c.cancel_requested || c.complete) && c.failure.empty())) continue;
    // Its own launches in flight go first (it is the task run last, or was armed before;
    // a failed one's too: a launch that failed may have broken the context, and the next
    // task is armed once the failure is settled).
    if (c.runner && c.runner->in_flight()) return;
    if (!c.failure.empty()) continue;
    bool dependency_pending = false;
    if (pickable_locked(c, dependency_pending)) {
      next = &c;
      break;
    }
    // One whose dependency is pending is passed over, as pick_locked does; not one over
    // the memory budget: it may fit once `current`'s memory goes, and a less urgent task
    // admitted now would hold what it needs.
    if (!dependency_pending) return;
  }
  if (next == nullptr) return;
  Record* armed = armed_next_locked();
  preempt_last_for_locked(*next);
  if (armed == next) {
    // Armed already; taking opens again where something stopped it meanwhile (a more
    // urgent task that then could not run) and none of its launches is in flight. A
    // follower whose task stops takes the opens as the armed task from now on.
    try {
      next->runner->resume();
      if (arm_runner(*next->runner, follow)) armed_follows_ = follow;
    } catch (...) {
      // A broken context: its run() reports it.
    }
    return;
  }
  if (armed != nullptr && armed != current) {
    // A more urgent task came since: the one armed takes no further launch, and one it
    // took already is drained (as the task run last) before the more urgent is armed.
    stop_armed_locked(*armed);
    if (armed->runner->in_flight()) return;
  }
  armed_next_ = 0;
  armed_follows_ = false;
  if (!ready_to_run_locked(*next)) return;
  try {
    next->runner->resume();
    // Refused (another stream than the task it would follow): admitted, it waits its turn.
    if (!arm_runner(*next->runner, follow)) return;
  } catch (...) {
    return;  // a broken context: its run() reports it
  }
  armed_next_ = next->id;
  armed_follows_ = follow;
  next->state = TaskState::Running;
  publish_item_ns_locked(*next->runner);
}

bool Executor::preempt_locked(Record& r) {
  WithholdState st;
  st.enabled = backend_->withholds();
  st.bubbles = r.runner->bubbles_in_flight();
  const Record* armed = armed_next_locked();
  st.urgent_queued = armed != nullptr && armed != &r && !armed_follows_ &&
                     armed->runner->in_flight();
  const bool withhold = withhold_preempted(st);
  try {
    if (withhold) {
      r.runner->withhold();
    } else {
      r.runner->stop();
    }
  } catch (...) {
    // A sticky CUDA error: its next run() reports it.
  }
  return withhold;
}

void Executor::preempt_last_for_locked(const Record& next) {
  Record* last = last_run_locked();
  if (last == nullptr || last == &next || next.priority <= last->priority || !last->runner ||
      !last->runner->in_flight() || last->cancel_requested || last->complete ||
      !last->failure.empty()) {
    return;
  }
  preempt_locked(*last);
}

bool Executor::arm_runner(PhaseRunner& runner, bool follow) {
  if (follow) return runner.follow();
  runner.arm();
  return true;
}

void Executor::stop_armed_locked(Record& armed) {
  try {
    armed.runner->stop();
  } catch (...) {
    // A sticky CUDA error: its next run() reports it.
  }
  // Stopped, it follows nothing any more: once the task run last has nothing in flight,
  // it becomes the task run last, its launches drained as such.
  armed_follows_ = false;
}

bool Executor::in_tail_locked(const Record& r) const {
  FollowState st;
  st.enabled = backend_->followers();
  st.last_phase = r.phase + 1 == r.task->num_phases();
  const uint64_t n = r.task->num_items(r.phase);
  st.items_left = n - std::min(n, r.runner->done());
  st.items_per_open = r.items_per_open;
  st.in_flight = r.runner->launches_in_flight();
  return follow_next(st);
}

void Executor::publish_item_ns_locked(const PhaseRunner& running) {
  // The opens a training thread weighs against this are the armed task's, where one is
  // armed to take them (a follower's launches come after the running task's).
  const Record* armed = armed_follows_ ? nullptr : armed_next_locked();
  const PhaseRunner& taking = armed != nullptr ? *armed->runner : running;
  running_item_ns_.store(taking.block_item_ns(), std::memory_order_relaxed);
}

}  // namespace freeride
