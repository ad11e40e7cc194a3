// Executor: the queue of side tasks, their admission, phases and launches, and the
// thread that runs them (loop). Closing is in executor_close.cpp.
#include "executor.hpp"

#include <algorithm>
#include <chrono>
#include <exception>

#include "check.hpp"
#include "doorbell.hpp"
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

const char* state_name(TaskState state) {
  switch (state) {
    case TaskState::Queued: return "queued";
    case TaskState::Running: return "running";
    case TaskState::Paused: return "paused";
    case TaskState::Done: return "done";
    case TaskState::Failed: return "failed";
    case TaskState::Cancelled: return "cancelled";
  }
  return "unknown";
}

Executor::Executor(std::unique_ptr<Backend> backend, uint64_t memory_budget)
    : backend_(std::move(backend)), budget_(memory_budget) {
  FR_ARG(backend_ != nullptr, "backend must not be null");
  thread_ = std::thread([this] { loop(); });
}

Executor::~Executor() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; close() already did all it could.
  }
}

uint64_t Executor::submit(std::shared_ptr<Task> task, int priority,
                          const std::vector<uintptr_t>& after) {
  // Captured on the submitting thread, now: the side stream must not overtake what the
  // caller enqueued before submit (inputs being written, buffers being zeroed).
  std::unique_ptr<StreamDependency> dependency;
  if (!after.empty()) dependency = backend_->after_streams(after);
  return submit_after(std::move(task), priority, std::move(dependency));
}

uint64_t Executor::submit_after(std::shared_ptr<Task> task, int priority,
                                std::unique_ptr<StreamDependency> dependency) {
  FR_ARG(task != nullptr, "task must not be null");
  const uint64_t total = task->total_items();
  std::lock_guard<std::mutex> lock(mutex_);
  FR_CHECK(!closing_, "the harvester is closed");
  auto rec = std::make_unique<Record>();
  Record& r = *rec;
  r.id = next_id_++;
  r.priority = priority;
  r.items_total = total;
  r.memory_bytes = task->memory_bytes();
  r.task = std::move(task);
  r.after = std::move(dependency);
  records_.emplace(r.id, std::move(rec));
  if (budget_ > 0 && r.memory_bytes > budget_) {
    detail::Msg os;
    os << r.task->name() << " needs " << r.memory_bytes << " bytes of device memory, more than "
       << "the harvester's whole memory_budget of " << budget_ << " bytes";
    finish_locked(r, TaskState::Failed, ErrorKind::MemoryBudget, os.str());
    return r.id;
  }
  runnable_.insert(key(r));
  // A more urgent task takes over at the running one's next item boundary; the
  // preempted task keeps its counters and resumes later.
  if (active_ != nullptr && active_->runner && priority > active_->priority) {
    active_->runner->stop();
    active_->runner->hand_back();  // the loop arms this one without waiting for an open
  } else if (active_ != nullptr && active_->runner &&
             (active_->cancel_requested || active_->complete)) {
    active_->runner->hand_back();  // the loop drains launches that run nothing: as above
  } else if (!retiring_.empty()) {
    retiring_.front().runner->hand_back();  // the runner the loop drains first
  }
  // ... and one armed to follow it (arm_next_locked) takes no further launch at an open.
  if (Record* armed = armed_next_locked(); armed != nullptr && priority > armed->priority) {
    armed->runner->stop();
  }
  work_cv_.notify_all();
  backend_->interrupt_waits();  // a loop backing off (kBackoffMinS) looks at the queue again
  return r.id;
}

Executor::Record& Executor::record_locked(uint64_t id) const {
  auto it = records_.find(id);
  FR_ARG(it != records_.end(), "unknown task id " << id);
  return *it->second;
}

TaskStatus Executor::status(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Record& r = record_locked(id);
  TaskStatus s;
  s.state = r.state;
  // Started, not final and no item executing (held by the gate or preempted): paused.
  if (r.state == TaskState::Running && !r.runner->executing()) s.state = TaskState::Paused;
  s.items_done =
      r.items_before_phase + (r.runner ? r.runner->done() + r.runner->done_ahead() : 0);
  s.items_total = r.items_total;
  s.phase = r.phase;
  s.launches = r.launches;
  s.error_kind = r.error_kind;
  s.error = r.error;
  return s;
}

bool Executor::wait(uint64_t id, double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  record_locked(id);
  return wait_locked(lock, timeout_s, [&] {
    auto it = records_.find(id);
    return it == records_.end() || is_final(it->second->state);
  });
}

bool Executor::wait_all(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  return wait_locked(lock, timeout_s, [&] {
    for (const auto& [id, r] : records_) {
      if (!is_final(r->state)) return false;
    }
    return true;
  });
}

bool Executor::cancel(uint64_t id, bool wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  Record& r = record_locked(id);
  if (is_final(r.state)) return false;
  // Stopped first: no launch at an open is taken once stop() returns, so in_flight() then
  // says for good whether launches are left for the loop to drain.
  if (r.runner) r.runner->stop();
  if (&r == active_) r.runner->hand_back();  // the next task is armed at once
  if (&r == active_ || (r.runner && r.runner->in_flight())) {
    // Items already claimed finish; the loop marks it cancelled when the launch exits
    // (a backoff in progress ends now: the launches left are to be drained).
    r.cancel_requested = true;
    backend_->interrupt_waits();
    done_cv_.notify_all();  // waiters already asleep start looking for it going inert
    if (wait) wait_locked(lock, -1.0, [&] { return is_final(r.state); });
  } else {
    finish_locked(r, TaskState::Cancelled, ErrorKind::Cancelled, "cancelled");
    backend_->interrupt_waits();
  }
  return true;
}

std::vector<uint64_t> Executor::take_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> out;
  out.swap(finished_);
  return out;
}

void Executor::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Retiring& t : retiring_) {
    if (t.id == id) {
      t.forgotten = true;
      return;
    }
  }
  auto it = records_.find(id);
  if (it != records_.end() && is_final(it->second->state)) records_.erase(it);
}

uint64_t Executor::memory_used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

void Executor::set_recording(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  recording_ = on;
}

std::vector<LaunchRecord> Executor::take_launch_log() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LaunchRecord> out(launch_log_.begin(), launch_log_.end());
  launch_log_.clear();
  return out;
}

bool Executor::wait_launches_taken(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + clamp_timeout(timeout_s);
  // The launches ending now, per task: (id, how many ends must have been logged). Not
  // those that begin later: on CUDA a task relaunches at every time slice while the gate
  // stays open, and each of those launches ends by itself too.
  // A runner of a task that is final already is retiring (a cancel, retire_inert_locked)
  // or gone: its ends count once taken, or all of them were.
  struct Ending {
    uint64_t id;
    const PhaseRunner* runner;
    uint64_t n;
  };
  std::vector<Ending> ending;
  for (const auto& [id, r] : records_) {
    if (!r->runner) continue;
    const uint64_t n = r->runner->launches_ending();
    if (n > r->ends_logged) ending.push_back({id, r->runner.get(), n});
  }
  for (const Retiring& t : retiring_) {
    const uint64_t n = t.runner->launches_ending();
    if (n > t.runner->launches_taken()) ending.push_back({t.id, t.runner.get(), n});
  }
  return done_cv_.wait_until(lock, deadline, [&] {
    if (closing_) return true;  // close() takes or abandons them; nothing is logged after
    for (const Ending& e : ending) {
      auto it = records_.find(e.id);
      if (it != records_.end() && it->second->runner.get() == e.runner) {
        if (it->second->ends_logged < e.n) return false;
        continue;
      }
      for (const Retiring& t : retiring_) {
        if (t.runner.get() == e.runner && e.runner->launches_taken() < e.n) return false;
      }
    }
    return true;
  });
}

uint64_t Executor::launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return launches_;
}

uint64_t Executor::idle_launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_launches_;
}

uint64_t Executor::open_launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_launches_;
}

uint64_t Executor::idle_open_launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_open_launches_;
}

std::vector<uint64_t> Executor::take_abandoned() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> out;
  out.swap(abandoned_);
  return out;
}

bool Executor::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closing_;
}

bool Executor::pickable_locked(const Record& r, bool& dependency_pending) const {
  if (r.admitted) return true;
  // A task waits in the queue until the memory of running ones is released.
  if (budget_ != 0 && used_ + r.memory_bytes > budget_) return false;
  // ... and until the work its submitter had enqueued has run: an admitted task would
  // hold this thread until then, and a stream that never gets there would hold it for
  // good. ready() does not block.
  if (r.after && !r.after->ready()) {
    dependency_pending = true;
    return false;
  }
  return true;
}

Executor::Record* Executor::pick_locked(bool& dependency_pending) {
  dependency_pending = false;
  for (const QueueKey& k : runnable_) {
    Record& r = *records_.at(k.second);
    if (pickable_locked(r, dependency_pending)) return &r;
  }
  return nullptr;
}

Executor::Record* Executor::last_run_locked() {
  auto it = records_.find(last_run_);
  if (it == records_.end() || !it->second->runner || is_final(it->second->state)) return nullptr;
  return it->second.get();
}

Executor::Record* Executor::armed_next_locked() {
  auto it = records_.find(armed_next_);
  if (it == records_.end() || !it->second->runner || is_final(it->second->state)) return nullptr;
  return it->second.get();
}

void Executor::arm_next_locked(const Record* stopping) {
  if (closing_ || !backend_->launches_at_opens()) return;
  Record* next = nullptr;
  bool dependency_pending = false;
  for (const QueueKey& k : runnable_) {
    Record& c = *records_.at(k.second);
    if (&c == stopping || c.cancel_requested || c.complete || !c.failure.empty()) continue;
    // Its own launches in flight go first (it is the task run last, or was armed before).
    if (c.runner && c.runner->in_flight()) return;
    if (pickable_locked(c, dependency_pending)) {
      next = &c;
      break;
    }
  }
  if (next == nullptr || next->id == armed_next_) return;
  if (Record* armed = armed_next_locked(); armed != nullptr && armed != stopping) {
    // A more urgent task came since: the one armed takes no further launch, and one it
    // took already is drained (as the task run last) before the more urgent is armed.
    try {
      armed->runner->stop();
    } catch (...) {
      // A sticky CUDA error: its next run() reports it.
    }
    if (armed->runner->in_flight()) return;
  }
  armed_next_ = 0;
  try {
    if (!next->admitted) admit_locked(*next);
  } catch (const std::exception& e) {
    finish_locked(*next, TaskState::Failed, ErrorKind::Failed, e.what());
    return;
  }
  if (is_final(next->state)) return;  // every phase was empty
  try {
    next->runner->resume();
    next->runner->arm();
  } catch (...) {
    return;  // a broken context: its run() reports it
  }
  armed_next_ = next->id;
  next->state = TaskState::Running;
  publish_item_ns_locked(*next->runner);
}

void Executor::publish_item_ns_locked(const PhaseRunner& running) {
  // The opens a training thread weighs against this are the armed task's, where one is.
  const Record* armed = armed_next_locked();
  const PhaseRunner& taking = armed != nullptr ? *armed->runner : running;
  running_item_ns_.store(taking.block_item_ns(), std::memory_order_relaxed);
}

bool Executor::more_urgent_pickable_locked(const Record& r) const {
  bool dependency_pending = false;
  for (const QueueKey& k : runnable_) {
    if (k.first >= key(r).first) return false;  // the queue is in order of urgency
    if (pickable_locked(*records_.at(k.second), dependency_pending)) return true;
  }
  return false;
}

void Executor::admit_locked(Record& r) {
  r.admitted = true;
  used_ += r.memory_bytes;
  r.runner = backend_->make_runner(r.task, std::move(r.after));
  r.phase = 0;
  r.runner->begin_phase(0, r.task->num_items(0));
  advance_locked(r);
}

// Moves past every completed phase; a phase starts only after the previous one completed.
void Executor::advance_locked(Record& r) {
  while (r.runner->done() >= r.task->num_items(r.phase)) {
    if (r.phase + 1 == r.task->num_phases()) {
      finish_done_locked(r);
      return;
    }
    begin_next_phase_locked(r);
  }
}

void Executor::begin_next_phase_locked(Record& r) {
  r.runner->begin_phase(r.phase + 1, r.task->num_items(r.phase + 1));
  r.items_before_phase += r.task->num_items(r.phase);
  ++r.phase;
}

// Its last phase complete: every item counted, whether its runner is done (advance_locked),
// retiring or abandoned with stale launches.
void Executor::finish_done_locked(Record& r, std::vector<uint64_t>* named_by, bool retire) {
  r.items_before_phase += r.task->num_items(r.phase);
  finish_locked(r, TaskState::Done, ErrorKind::None, "", named_by, retire);
}

// Phases ahead (phase_ahead_rule.hpp): past every completed phase while launches are in
// flight, but never to the task's end, which waits for them (its memory is in use until
// they ended). A failure is the task's, raised once they have.
void Executor::advance_in_flight_locked(Record& r) {
  try {
    while (r.phase + 1 < r.task->num_phases() &&
           r.runner->done() >= r.task->num_items(r.phase)) {
      begin_next_phase_locked(r);
    }
  } catch (const std::exception& e) {
    r.failure = r.task->name() + ": " + e.what();
  }
}

void Executor::finish_locked(Record& r, TaskState state, ErrorKind kind, std::string error,
                             std::vector<uint64_t>* named_by, bool retire) {
  // Done: advance_locked already counted every phase. Otherwise keep what the current
  // phase finished (and, with phases ahead, the next), so items_done stays exact after a
  // cancel or a failure.
  if (r.runner && state != TaskState::Done) {
    r.items_before_phase += r.runner->done() + r.runner->done_ahead();
  }
  r.state = state;
  r.error_kind = kind;
  r.error = std::move(error);
  runnable_.erase(key(r));
  const uint64_t charged = r.admitted ? r.memory_bytes : 0;
  r.admitted = false;
  if (retire && r.runner) {
    retiring_.push_back({r.id, std::move(r.runner), charged, false, state == TaskState::Done});
  } else {
    r.runner.reset();
    (named_by != nullptr ? *named_by : finished_).push_back(r.id);
    used_ -= charged;
  }
  r.task.reset();
  r.after.reset();
  done_cv_.notify_all();
  work_cv_.notify_all();  // released memory may admit a queued task; a runner to drain
}

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
    // Runners of tasks already final (cancelled, retire_inert_locked) come first: their
    // launches are on the stream ahead of anything else. The next task is armed first.
    if (!retiring_.empty()) {
      arm_next_locked(draining_);
      drain_retiring_locked(lock);
      continue;
    }
    // Everything queued ahead of the task armed to follow has been taken: it is the task
    // run now (its launches at opens, if any, are drained below as such).
    if (draining_ == nullptr && armed_next_ != 0) {
      last_run_ = armed_next_;
      armed_next_ = 0;
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
    if (r != draining_) {
      try {
        if (!r->admitted) admit_locked(*r);
      } catch (const std::exception& e) {
        finish_locked(*r, TaskState::Failed, ErrorKind::Failed, e.what());
        continue;
      }
      if (is_final(r->state)) continue;  // every phase was empty
    }
    last_run_ = r->id;
    PhaseRunner* runner = r->runner.get();
    publish_item_ns_locked(*runner);
    // Picked from the queue: it may run. Draining: its launches in flight end and no
    // further one starts where it must stop (a close, a cancel, a failure, or a more
    // urgent task that could run now).
    const bool must_stop = draining_ != nullptr &&
                           (closing_ || r->cancel_requested || !r->failure.empty() ||
                            more_urgent_pickable_locked(*r));
    // Its launches left will run nothing: the next task takes the opens meanwhile. (Not
    // after a failure: a launch that failed may have broken the context, and the next
    // task is admitted once the failure is settled.)
    if (draining_ != nullptr && (must_stop || r->complete) && r->failure.empty()) {
      arm_next_locked(r);
    }
    active_ = r;
    r->state = TaskState::Running;
    ++r->launches;
    const uint64_t done_before = runner->done();
    const uint64_t phase = r->phase;
    LaunchMarks marks;
    std::string error;
    bool abandoned = false;
    try {
      if (draining_ == nullptr) {
        runner->resume();
      } else if (must_stop) {
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
    // Only a launch of the executor's own, admitted on the gate's mirror, that ran
    // nothing says the mirror may be stale (see kBackoffMinS).
    const bool idle_launch = ran_nothing && !marks.at_open && !marks.successor;
    // A complete task's launches left are stale: one that fails fails nothing of it (a
    // broken context shows in the next task's run()), as when it has retired.
    if (!error.empty() && r->failure.empty() && !r->complete) {
      r->failure = r->task->name() + ": " + error;
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
