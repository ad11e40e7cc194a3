// Executor: the thread that runs the side tasks (loop) and what it does after each
// launch's end.
#include <algorithm>
#include <chrono>
#include <exception>

#include "check.hpp"
#include "executor.hpp"
#include "thread_name.hpp"

namespace freeride {

namespace {

// How often an executor with nothing else to run asks again whether a queued task's
// stream dependency is ready. Nothing wakes it when the submitter's stream gets there (the
// dependency is an event on that stream), so this bounds how late the task starts after
// its inputs are complete: 1 ms is well inside a bubble, and costs an otherwise idle
// thread a thousand event queries a second, only while such a task waits.
constexpr std::chrono::milliseconds kDependencyPoll{1};

// After a launch that the gate let in but that ran no item, the next one waits for a
// newer open than the one it was admitted under, for at most this long at first, twice
// as long after each further such launch, up to kBackoffMaxS. On CUDA the executor admits
// on the gate's host mirror while kernels read the gate word, and an immediate (host)
// gate write racing a stream-ordered one can leave the mirror open over a closed gate
// until the next write: without the wait the executor would relaunch full grids every
// few tens of microseconds all through compute. A real new bubble (a newer open) ends
// the wait at once, as do submit, cancel and close.
constexpr double kBackoffMinS = 100e-6;
constexpr double kBackoffMaxS = 10e-3;

}  // namespace

void Executor::count_launch_locked(const LaunchMarks& marks, bool ran_nothing) {
  ++launches_;
  if (marks.at_open) ++open_launches_;
  if (ran_nothing) {
    ++idle_launches_;
    if (marks.at_open) ++idle_open_launches_;
  }
}


void Executor::loop() {
  name_this_thread("freeride-exec");
  backend_->on_executor_thread();
  double backoff_s = kBackoffMinS;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    // Made final (retired) or dropped while this thread drained something else.
    if (draining_ != nullptr && (!draining_->runner || is_final(draining_->state))) {
      draining_ = nullptr;
    }
    // An armed task made final (a cancelled follower drained out of turn, below) arms
    // nothing any more, and follows nothing.
    if (armed_next_ != 0 && armed_next_locked() == nullptr) {
      armed_next_ = 0;
      armed_follows_ = false;
    }
    // Runners of tasks already final (cancelled, retire_inert_locked) come first: their
    // launches are on the stream ahead of anything else (but for a cancelled armed task's,
    // queued behind the task before it: taken after those, which only waits longer). The
    // next task is armed first.
    if (!retiring_.empty()) {
      // (A task being drained is passed over only where it stops for good or for a more
      // urgent task; otherwise its launches in flight keep the next one unarmed.)
      const bool stopping = draining_ != nullptr && draining_->failure.empty() &&
                            (draining_->cancel_requested || draining_->complete ||
                             more_urgent_pickable_locked(*draining_));
      arm_next_locked(stopping ? draining_ : nullptr);
      drain_retiring_locked(lock);
      continue;
    }
    // Everything queued ahead of the task armed to follow has been taken: it is the task
    // run now (its launches at opens, if any, are drained below as such). Not while the
    // task run last still has launches in flight (one it follows, handed back from a run()
    // that has not taken them): those are drained first, below.
    // A follower cancelled with launches in flight: its ends first, while the task it
    // follows runs on (cancel() interrupted that one's run(), whose end may need a close
    // the canceller has yet to write). At close too: stopped and drained within the
    // deadline like the rest, not left to be abandoned unstopped.
    if (Record* armed = armed_follows_ ? armed_next_locked() : nullptr;
        armed != nullptr && (armed->cancel_requested || closing_) &&
        armed->runner->in_flight()) {
      draining_ = armed;  // the task it follows is the task run last: picked up after
      out_of_turn_ = armed->id;
    }
    if (draining_ == nullptr || draining_->id != out_of_turn_) out_of_turn_ = 0;
    // A follower only once the task it follows is final (its launches come behind that
    // one's at every open until then).
    if (draining_ == nullptr && armed_next_ != 0) {
      const Record* last = last_run_locked();
      if (last == nullptr || (!armed_follows_ && !last->runner->in_flight())) {
        last_run_ = armed_next_;
        armed_next_ = 0;
        armed_follows_ = false;
      }
    }
    Record* r = draining_;
    if (r == nullptr) {
      // Launches at opens the task run last took since this thread last looked (during a
      // backoff, or between its runs): drained before anything else, a close included.
      // Close refuses launches at opens before it sets closing_, so once this look (under
      // the lock) finds none and sees closing_, none can come.
      Record* last = last_run_locked();
      if (last != nullptr && last->runner->in_flight()) r = draining_ = last;
    }
    if (r == nullptr) {
      bool dependency_pending = false;
      while (!closing_ && (r = pick_locked(dependency_pending)) == nullptr) {
        // Nothing signals a dependency's completion: look again after a while.
        if (dependency_pending) {
          work_cv_.wait_for(lock, kDependencyPoll);
        } else {
          work_cv_.wait(lock);
        }
      }
      if (closing_) break;
      // Another task than the one run last: that one is being preempted (a more urgent
      // task came while no launch of it ran, so submit() did not stop it). Stopped now, it
      // takes no further launch at an open; those it took already end before anything
      // of this one goes on a stream they may share.
      Record* previous = last_run_locked();
      if (previous != nullptr && previous != r) {
        try {
          previous->runner->stop();
        } catch (...) {
          // A sticky CUDA error: its next run() reports it.
        }
        if (previous->runner->in_flight()) r = draining_ = previous;
      }
    }
    if (r != draining_ && !ready_to_run_locked(*r)) continue;
    // Not a follower drained out of turn: the task it follows, whose launches come first
    // on the stream, stays the task run last (a more urgent task stops it, a cancel
    // retires it, and it is drained next), even once another task is armed meanwhile.
    if (r->id != out_of_turn_) last_run_ = r->id;
    PhaseRunner* runner = r->runner.get();
    publish_item_ns_locked(*runner);
    // Picked from the queue: it may run. Draining: its launches in flight end and no
    // further one starts where it must stop (a close, a cancel, a failure, or a more
    // urgent task that could run now).
    const bool must_stop = draining_ != nullptr &&
                           (closing_ || r->cancel_requested || !r->failure.empty() ||
                            more_urgent_pickable_locked(*r));
    // For a more urgent task alone: withheld or stopped, asked again at each end taken
    // (withhold_rule.hpp), and first before that task is armed, so that nothing of this
    // one is enqueued behind its launches.
    const bool preempted = must_stop && !closing_ && !r->cancel_requested &&
                           r->failure.empty() && !r->complete;
    if (preempted) preempt_locked(*r);
    // Its launches left will run nothing (withheld: its own items, in bubbles before the
    // next task's first): the next task takes the opens meanwhile. (Not after a failure:
    // a launch that failed may have broken the context, and the next task is armed once
    // the failure is settled; one armed before it, because this one was stopping, keeps
    // its opens, and a broken context fails it too.)
    if (draining_ != nullptr && (must_stop || r->complete) && r->failure.empty()) {
      arm_next_locked(r);
    } else if (!must_stop && !r->complete && armed_next_ == 0 && r->failure.empty() &&
               in_tail_locked(*r)) {
      arm_next_locked(r, true);
    }
    active_ = r;
    r->state = TaskState::Running;
    ++r->launches;
    const uint64_t done_before = runner->done();
    // For the launch log: the phase it begins in (device phases: the one the items done
    // have reached; the launch may go on through later ones).
    const uint64_t phase = r->task->reported_phase(r->phase, r->items_before_phase + done_before);
    LaunchMarks marks;
    std::string error;
    bool abandoned = false;
    try {
      if (draining_ == nullptr) {
        runner->resume();
      } else if (must_stop && !preempted) {
        runner->stop();
      }
      lock.unlock();
      // Marked whether or not recording is on yet: a launch may wait for the gate from
      // before the first recorded iteration and run inside it. Kept if recording is on
      // when it ends.
      marks = runner->run(true);
    } catch (const Abandoned&) {
      abandoned = true;
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "side task failed";
    } catch (...) {
      error = "side task failed with a non-standard exception";
    }
    if (!lock.owns_lock()) lock.lock();
    active_ = nullptr;
    if (marks.handed_back) {
      // No end taken (PhaseRunner::hand_back): back to the top, where the next task is
      // armed before this one's launches are drained (or retired ones are).
      --r->launches;
      continue;
    }
    publish_item_ns_locked(*runner);
    // Logged below, or dropped with its marks (not recording, or no item ran).
    r->ends_logged = runner->launches_taken();
    if (marks.start != 0 && !recording_) {
      backend_->release_mark(marks.start);
      backend_->release_mark(marks.end);
    } else if (marks.start != 0) {
      launch_log_.push_back({r->id, phase, marks.start, marks.end, runner->done() - done_before});
      if (launch_log_.size() > kMaxLaunchLog) {
        backend_->release_mark(launch_log_.front().start_mark);
        backend_->release_mark(launch_log_.front().end_mark);
        launch_log_.pop_front();
      }
    }
    if (is_final(r->state)) {
      // Cancelled and retired while this launch ran (retire_inert_locked): the runner's
      // other launches are drained as a retiring runner's (an error or an abandon of this
      // run() shows there again); this launch's end is counted.
      // Cancelled: not idle, as below; done: its launches are stale.
      if (marks.admitted) {
        count_launch_locked(marks, r->state == TaskState::Done && runner->done() == done_before);
      }
      draining_ = nullptr;
      continue;
    }
    if (abandoned) {
      // Past close()'s deadline. Its launches may still run: the runner keeps (leaks)
      // what they write, and take_abandoned() tells the owner to keep the task's memory.
      draining_ = nullptr;
      abandon_locked(*r);
      continue;
    }

    const bool ran_nothing = marks.admitted && error.empty() &&
                             (!r->cancel_requested || r->complete) &&
                             runner->done() == done_before;
    count_launch_locked(marks, ran_nothing);
    if (marks.at_open && runner->done() > done_before) {
      const uint64_t ran = runner->done() - done_before;
      r->items_per_open = r->items_per_open == 0 ? ran : (3 * r->items_per_open + ran) / 4;
    }
    // Only a launch of the executor's own, admitted on the gate's mirror, that ran
    // nothing says the mirror may be stale (see kBackoffMinS).
    const bool idle_launch = ran_nothing && !marks.at_open && !marks.successor;
    // A complete task's launches left are stale: one that fails fails nothing of it (a
    // broken context shows in the next task's run()), as when it has retired.
    if (!error.empty() && r->failure.empty() && !r->complete) {
      r->failure = r->task->name() + ": " + error;
      // It takes no further launch (at an open, or the open watcher's) before the look
      // below: one enqueued after it would outlive the task and its memory.
      try {
        runner->stop();
      } catch (...) {
        // A sticky CUDA error: nothing runs any more.
      }
      // Its follower takes no further open: the next task runs once the failure settled.
      if (Record* armed = armed_next_locked(); armed != nullptr && armed_follows_) {
        stop_armed_locked(*armed);
      }
    }
    draining_ = runner->in_flight() ? r : nullptr;
    if (draining_ == nullptr) {
      settle_launch_locked(*r);
    } else if (runner->begins_phases_in_flight() && r->failure.empty() && !r->cancel_requested) {
      advance_in_flight_locked(*r);
    }
    // (Not after a cancel: a cancelled task stays cancelled, whoever looks first.)
    if (draining_ != nullptr && r->failure.empty() && !r->complete && !r->cancel_requested &&
        r->phase + 1 == r->task->num_phases() && runner->done() >= r->task->num_items(r->phase)) {
      // Its launches left in flight are stale: stopped, they are inert once the stop has
      // landed, and the task is done then, not when the GPU reaches their opens.
      r->complete = true;
      try {
        runner->stop();
      } catch (...) {
        // A sticky CUDA error: the next run() reports it.
      }
    }
    done_cv_.notify_all();
    if (draining_ != nullptr) continue;
    // No wait where something else is due: a close, or a more urgent task that can run
    // (one submitted during the launch stopped it: its ring came before this wait could
    // see it).
    const bool other_due = closing_ || more_urgent_pickable_locked(*r);
    if (!idle_launch || is_final(r->state) || other_due) {
      backoff_s = kBackoffMinS;
      continue;
    }
    // See kBackoffMinS. Outside the lock: submit, cancel and close interrupt the wait
    // (one that lands between here and the wait's start is seen within backoff_s).
    const uint32_t admitted_under = marks.gate_seq;
    lock.unlock();
    backend_->wait_next_open(admitted_under, backoff_s);
    backoff_s = std::min(2 * backoff_s, kBackoffMaxS);
    lock.lock();
  }
  loop_exited_ = true;
  done_cv_.notify_all();
}

void Executor::settle_launch_locked(Record& r) {
  if (!r.failure.empty()) {
    finish_locked(r, TaskState::Failed, ErrorKind::Failed, r.failure);
  } else if (r.cancel_requested && !r.complete) {  // a complete task is done, as below
    finish_locked(r, TaskState::Cancelled, ErrorKind::Cancelled, "cancelled");
  } else {
    try {
      advance_locked(r);
    } catch (const std::exception& e) {
      finish_locked(r, TaskState::Failed, ErrorKind::Failed, e.what());
    }
    // Held by the closed gate or preempted: it goes back to the queue as it is.
    if (!is_final(r.state)) r.state = TaskState::Paused;
  }
}

}  // namespace freeride
