// Executor: the queue of side tasks, their admission and phases. The thread that runs
// them is in executor_loop.cpp, arming the next task in executor_handover.cpp, closing in
// executor_close.cpp and retiring in executor_retire.cpp.
#include "executor.hpp"

#include <algorithm>
#include <chrono>
#include <exception>

#include "check.hpp"
#include "device_phases.hpp"
#include "doorbell.hpp"

namespace freeride {

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
  task = with_device_phases(std::move(task), backend_->device_phases());
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
  bool dependency_pending = false;
  const bool can_run = pickable_locked(r, dependency_pending);
  // A more urgent task that can run now takes over at the running one's next item
  // boundary, or, where the running one's launches are queued at opens ahead of the GPU,
  // at the first open written from now on (withhold_rule.hpp); the preempted task keeps
  // its counters and resumes later. One that cannot run yet (its dependency pending, its
  // memory over budget) stops nothing: it takes over at the end of the running launch
  // once it can, as the loop finds it then.
  if (active_ != nullptr && active_->runner && priority > active_->priority && can_run) {
    if (preempt_locked(*active_)) {
      active_->runner->interrupt();  // its launch runs on: the loop arms this one meanwhile
    } else {
      active_->runner->hand_back();  // the loop arms this one without waiting for an open
    }
  } else if (active_ != nullptr && active_->runner &&
             (active_->cancel_requested || active_->complete)) {
    active_->runner->hand_back();  // the loop drains launches that run nothing: as above
  } else if (!retiring_.empty()) {
    retiring_.front().runner->hand_back();  // the runner the loop drains first
  }
  // The task run last, where that is not the one running (the loop drains a cancelled
  // follower out of turn, or is between runs), with launches queued ahead: preempted too,
  // where this one can run now, or its launches would go on running its items until the
  // loop came to it.
  if (can_run && last_run_locked() != active_) preempt_last_for_locked(r);
  // ... and one armed to follow it (arm_next_locked) takes no further launch at an open,
  // where this one can run now (else the loop would arm that one again).
  if (Record* armed = armed_next_locked();
      armed != nullptr && priority > armed->priority && can_run) {
    stop_armed_locked(*armed);
  }
  work_cv_.notify_all();
  backend_->interrupt_waits();  // a loop backing off (executor_loop.cpp) looks at the queue again
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
  s.phase = r.task ? r.task->reported_phase(r.phase, s.items_done) : r.phase;  // final: none
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
  if (r.id == armed_next_ && armed_follows_ && r.runner && r.runner->in_flight() &&
      active_ != nullptr && active_ != &r && active_->runner) {
    // A follower's launches come behind the running task's: the loop takes them first.
    active_->runner->interrupt();
  }
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
    // A follower: its ends are taken once the task it follows has drained, which may
    // take further opens (a later report has them).
    if (!r->runner || (id == armed_next_ && armed_follows_)) continue;
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

Executor::Record* Executor::admitted_record_locked(uint64_t id) {
  auto it = records_.find(id);
  if (it == records_.end() || !it->second->runner || is_final(it->second->state)) return nullptr;
  return it->second.get();
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

bool Executor::ready_to_run_locked(Record& r) {
  try {
    if (!r.admitted) admit_locked(r);
  } catch (const std::exception& e) {
    finish_locked(r, TaskState::Failed, ErrorKind::Failed, e.what());
    return false;
  }
  return !is_final(r.state);  // done at admission where every phase was empty
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
  if (r.task) r.phase = r.task->reported_phase(r.phase, r.items_before_phase);  // status()'s
  r.task.reset();
  r.after.reset();
  done_cv_.notify_all();
  work_cv_.notify_all();  // released memory may admit a queued task; a runner to drain
}
}  // namespace freeride
