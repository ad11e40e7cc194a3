// Executor: closing (close(): stop what runs, let launches in flight end until the
// deadline, abandon the rest) and what abandoning leaves for the owner.
#include <chrono>
#include <exception>

#include "check.hpp"
#include "doorbell.hpp"
#include "executor.hpp"
#include "thread_name.hpp"

namespace freeride {
namespace {

constexpr const char* kAbandonedMessage =
    "cancelled: the harvester was closed while a launch of the task was still enqueued or "
    "running on the GPU (abandoned)";

}  // namespace

void Executor::abandon_locked(Record& r) {
  // Named by take_abandoned(), never by take_finished(): its owner must keep its memory,
  // not let go of it as of a task that is merely final (review G17). A complete task (its
  // launches left are stale) is done, as it would be had a waiter retired it.
  if (r.complete && r.failure.empty()) {
    finish_done_locked(r, &abandoned_);
    return;
  }
  finish_locked(r, TaskState::Cancelled, ErrorKind::Cancelled, kAbandonedMessage, &abandoned_);
}

bool Executor::reclaim_abandoned() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    FR_CHECK(closed_, "reclaim_abandoned() before close()");
  }
  return backend_->reclaim_abandoned();
}

void Executor::close(double deadline_s) {
  std::lock_guard<std::mutex> close_lock(close_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
  }
  backend_->refuse_launches_at_opens();  // before closing_: see loop()
  std::unique_lock<std::mutex> lock(mutex_);
  closing_ = true;
  done_cv_.notify_all();  // wait_launches_taken() waits no more
  // Whatever fails, the executor thread is joined and every record made final before the
  // error is raised: a joinable std::thread destroyed later would std::terminate the
  // process. So a stop that fails (a sticky CUDA error) is kept for later, as is a nudge.
  std::exception_ptr error;
  // Every runner that may have launches queued at opens, not only the one running: the
  // task run last (withheld for a more urgent one, its launches run its items until
  // stopped), one drained and the one armed.
  for (Record* r : {active_, draining_, last_run_locked(), armed_next_locked()}) {
    try {
      if (r != nullptr && r->runner) r->runner->stop();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  work_cv_.notify_all();
  // Every side thread is told at once and may run at normal priority: on a busy machine
  // an idle-priority thread waits for a free core at each wake-up, and a close used to
  // need several such wake-ups one after the other (the workers to finish the launch,
  // this loop to exit, the workers again to exit).
  lock.unlock();
  leave_idle_priority(thread_);
  backend_->begin_shutdown();
  backend_->interrupt_waits();
  lock.lock();
  const auto deadline = std::chrono::steady_clock::now() + clamp_timeout(deadline_s);
  bool abandoning = false;
  // A launch held by a closed gate (cuda: a stream wait) must be let through to see its
  // stop flag; keep nudging until the loop has left it. A nudge that fails is not retried.
  // Launches in flight (queued ahead at opens) end as the GPU reaches them; past the
  // deadline they are abandoned (PhaseRunner::abandon), and the loop leaves at its next
  // look.
  while (!loop_exited_) {
    if (!abandoning && std::chrono::steady_clock::now() >= deadline) {
      abandoning = true;
      for (auto& [id, r] : records_) {
        if (r->runner) r->runner->abandon();
      }
      for (Retiring& t : retiring_) t.runner->abandon();
    }
    lock.unlock();
    if (!error) {
      try {
        backend_->unblock();
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    done_cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return loop_exited_; });
  }
  lock.unlock();
  if (thread_.joinable()) thread_.join();
  lock.lock();
  // A backstop as below: the loop drains retiring runners before it can exit.
  for (Retiring& t : retiring_) {
    const bool left = t.runner->in_flight();
    if (left) t.runner->abandon();
    (left ? abandoned_ : finished_).push_back(t.id);
    used_ -= t.memory_bytes;
  }
  retiring_.clear();
  for (auto& [id, r] : records_) {
    // Left in flight (the loop drains or abandons every launch it can see, so this is a
    // backstop): such a launch may still run, and is abandoned like the others.
    if (r->runner && !is_final(r->state) && r->runner->in_flight()) {
      r->runner->abandon();
      abandon_locked(*r);
    }
    if (!is_final(r->state)) {
      finish_locked(*r, TaskState::Cancelled, ErrorKind::Cancelled,
                    "cancelled: the harvester was closed");
    }
  }
  const bool any_abandoned = !abandoned_.empty();
  lock.unlock();
  try {
    // Abandoned launches may still run: the backend then waits for none of its streams and
    // frees nothing they may write.
    if (any_abandoned) backend_->abandon_work();
    backend_->shutdown();
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  lock.lock();
  closed_ = true;
  done_cv_.notify_all();
  if (error) std::rethrow_exception(error);
}
}  // namespace freeride
