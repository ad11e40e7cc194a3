// Executor: cancelled tasks made final while their launches are still queued ahead of
// the GPU (retire_inert_locked), and draining those launches' ends before anything else.
#include <mutex>

#include "check.hpp"
#include "executor.hpp"

namespace freeride {

bool Executor::retirable(const Record* r) {
  return r != nullptr && r->runner && !is_final(r->state) && (r->cancel_requested || r->complete) &&
         r->failure.empty() && r->runner->in_flight();
}

// Only these can have launches in flight: the task run last, one the loop drains before
// the next (draining_, which may be another once a next task was armed) and the next
// task armed meanwhile (the loop drains every other before it runs another).
bool Executor::retire_pending_locked() {
  return retirable(last_run_locked()) || retirable(draining_) || retirable(armed_next_locked());
}

// A complete task is done (whether or not a cancel came after): every item ran, and the
// last phase's items are counted here, as advance_locked would once they had ended.
void Executor::retire_inert_locked() {
  for (Record* r : {last_run_locked(), draining_, armed_next_locked()}) {
    if (!retirable(r) || !r->runner->inert()) continue;
    if (r->complete) {
      finish_done_locked(*r, nullptr, true);
    } else {
      finish_locked(*r, TaskState::Cancelled, ErrorKind::Cancelled, "cancelled", nullptr, true);
    }
  }
}

void Executor::drain_retiring_locked(std::unique_lock<std::mutex>& lock) {
  Retiring& t = retiring_.front();  // a deque's push_back leaves references to it valid
  PhaseRunner* runner = t.runner.get();
  bool abandoned = false;
  if (runner->in_flight()) {
    const uint64_t done_before = runner->done();
    LaunchMarks marks;
    lock.unlock();
    try {
      marks = runner->run(false);
    } catch (const Abandoned&) {
      abandoned = true;
    } catch (...) {
      // The task is final; a launch that failed after it went inert fails nothing of it
      // (a broken context shows in the next task's run()). Its ends are gone with it.
    }
    lock.lock();
    // Its marks are nobody's (the task is final, nothing of it is recorded any more).
    if (marks.start != 0) {
      backend_->release_mark(marks.start);
      backend_->release_mark(marks.end);
    }
    if (marks.admitted) count_launch_locked(marks, t.done && runner->done() == done_before);
  }
  if (!abandoned && runner->in_flight()) return;
  // Abandoned at close: its launches may still run, so its memory stays (take_abandoned).
  (abandoned ? abandoned_ : finished_).push_back(t.id);
  used_ -= t.memory_bytes;
  if (t.forgotten) records_.erase(t.id);
  retiring_.pop_front();
  done_cv_.notify_all();
  work_cv_.notify_all();
}

}  // namespace freeride
