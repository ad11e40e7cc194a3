// The per-device executor: a priority queue of side tasks and one C++ thread that runs
// them phase by phase through a backend, behind the gate.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "doorbell.hpp"
#include "task.hpp"

namespace freeride {

enum class TaskState : int { Queued = 0, Running, Paused, Done, Failed, Cancelled };
enum class ErrorKind : int { None = 0, Failed, MemoryBudget, Cancelled };

struct TaskStatus {
  TaskState state = TaskState::Queued;
  uint64_t items_done = 0;
  uint64_t items_total = 0;
  uint64_t phase = 0;
  uint64_t launches = 0;  // kernel launches so far (one more after every pause)
  ErrorKind error_kind = ErrorKind::None;
  std::string error;
};

// One launch of a phase, for the bubble record: its marks are the backend's.
struct LaunchRecord {
  uint64_t task_id = 0;
  uint64_t phase = 0;  // the phase it began in (device phases: one may go on past it)
  uint64_t start_mark = 0;
  uint64_t end_mark = 0;
  uint64_t items = 0;  // items the launch finished
};

class Executor {
 public:
  // memory_budget: bytes of device memory side tasks may hold at once; 0 = unlimited.
  Executor(std::unique_ptr<Backend> backend, uint64_t memory_budget);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  Backend& backend() { return *backend_; }

  // Queues a task; higher priority first, FIFO within a priority. A task larger than
  // the whole budget is returned already failed with ErrorKind::MemoryBudget. The task's
  // first launch waits for the work enqueued on `after` (stream handles) before this call;
  // until that work has run the task stays queued and other tasks run.
  uint64_t submit(std::shared_ptr<Task> task, int priority,
                  const std::vector<uintptr_t>& after = {});
  // submit() with the dependency already made (nullptr: none): tests drive the executor
  // on the host backend with one whose readiness they control.
  uint64_t submit_after(std::shared_ptr<Task> task, int priority,
                        std::unique_ptr<StreamDependency> dependency);

  TaskStatus status(uint64_t id) const;
  // Blocks until the task is final or timeout_s passed (negative: no timeout).
  bool wait(uint64_t id, double timeout_s);
  // Blocks until every submitted task is final.
  bool wait_all(double timeout_s);
  // No further item of the task starts. With `wait`, returns once none executes any more
  // (a launch held by a stream wait on a closed gate ends only when the gate opens).
  // False if the task was already final.
  bool cancel(uint64_t id, bool wait);
  // Drops a final task's record.
  void forget(uint64_t id);
  // Ids of the tasks that became final since the last call: the Python layer then lets go
  // of the buffers it held for them (never earlier: a kernel may use them until then).
  // Not abandoned ones (take_abandoned()).
  std::vector<uint64_t> take_finished();

  // Stops the thread, cancels what is not final, frees the backend. Idempotent. Launches
  // still enqueued (queued ahead of the GPU at opens) are waited for up to `deadline_s`
  // seconds (they end once the GPU reaches their bubbles); past it, every launch still
  // enqueued or running is abandoned: its task is cancelled at once, what such a launch
  // may still write (its counters, the task's memory) is never freed or reused, and
  // take_abandoned() names the task, so that its owner keeps its memory too. The thread
  // never waits on the GPU without looking at that deadline, so close() returns within
  // about deadline_s plus a millisecond.
  void close(double deadline_s = kCloseDeadlineS);
  bool closed() const;
  static constexpr double kCloseDeadlineS = 5.0;

  // Ids of the tasks whose launches close() abandoned (once each; take_finished() never
  // names them).
  std::vector<uint64_t> take_abandoned();
  // After close(): whether what the abandoned launches may write has been released,
  // which the backend does once the device is seen to have passed them (true where none
  // was abandoned). The tasks' owner keeps their memory until this says true. Never
  // blocks: ask again later.
  bool reclaim_abandoned();

  uint64_t memory_budget() const { return budget_; }
  uint64_t memory_used() const;

  // While recording, every launch that ends is logged with its marks (a launch that began
  // waiting for the gate before recording started included); take_launch_log() hands the log
  // over (the caller then owns and releases its marks). The log keeps at most
  // kMaxLaunchLog launches; older ones are dropped with their marks.
  void set_recording(bool on);
  std::vector<LaunchRecord> take_launch_log();
  static constexpr size_t kMaxLaunchLog = 1 << 20;
  // Blocks until this thread has taken every launch whose end has come, or comes without
  // a further gate open, at the time of the call (PhaseRunner::launches_ending: on the
  // host its workers left or the gate reads closed; on CUDA its end record is published,
  // or the gate reads closed, or its time slice ends it), so that the launch log holds
  // them; true then, or once closing; false after timeout_s. This thread takes a launch's
  // end, and may wait for a core to do so (idle priority on a busy machine): a report
  // taken right after an iteration must not miss the iteration's last launches for it.
  // A launch running on in an open bubble, and launches begun after the call, are not
  // waited for.
  bool wait_launches_taken(double timeout_s);

  // Launches so far, and those among them that the gate let in but that ran no item.
  uint64_t launches() const;
  uint64_t idle_launches() const;
  // Among those: launches enqueued at stream-ordered opens (CUDA), and those of them that
  // ran no item (their bubble was over before they began, or their phase was done).
  uint64_t open_launches() const;
  uint64_t idle_open_launches() const;

  // How long one block spends on one item of the task run last (PhaseRunner::
  // block_item_ns; 0 until measured): what a training thread weighs a bubble's predicted
  // length against before its open carries a launch. Lock-free: read at every open.
  uint64_t running_item_ns() const { return running_item_ns_.load(std::memory_order_relaxed); }

 private:
  struct Record {
    uint64_t id = 0;
    int priority = 0;
    std::shared_ptr<Task> task;
    std::unique_ptr<PhaseRunner> runner;  // exists while admitted and not final
    std::unique_ptr<StreamDependency> after;  // handed to the runner at admission
    TaskState state = TaskState::Queued;
    uint64_t phase = 0;
    uint64_t items_before_phase = 0;  // items of the phases already completed
    uint64_t items_total = 0;
    uint64_t memory_bytes = 0;
    uint64_t launches = 0;
    // The runner's launches_taken() when this thread last took a launch's end: the ends
    // it has taken and logged (wait_launches_taken).
    uint64_t ends_logged = 0;
    // Items its launches at opens ran each, lately (follow_rule.hpp; 0: none ran any yet).
    uint64_t items_per_open = 0;
    bool admitted = false;
    bool cancel_requested = false;
    // Every item is done while launches of it are still in flight (queued ahead at opens,
    // stale): stopped, it is made final (done) as soon as they are inert, as a cancelled
    // task is (retire_inert_locked).
    bool complete = false;
    // A launch failed while others were still in flight: the task fails with `failure`
    // once they have ended.
    std::string failure;
    ErrorKind error_kind = ErrorKind::None;
    std::string error;
  };
  using QueueKey = std::pair<int64_t, uint64_t>;  // (-priority, id): begin() runs first

  static bool is_final(TaskState s) {
    return s == TaskState::Done || s == TaskState::Failed || s == TaskState::Cancelled;
  }
  static QueueKey key(const Record& r) { return {-static_cast<int64_t>(r.priority), r.id}; }

  void loop();
  // The next task to run: the first of runnable_ that is admitted, or fits in the memory
  // budget and whose dependency is ready. dependency_pending: some task was passed over
  // only because its dependency is not ready yet.
  Record* pick_locked(bool& dependency_pending);
  // Whether `r` could run now (pick_locked's test for one task).
  bool pickable_locked(const Record& r, bool& dependency_pending) const;
  // Whether a task more urgent than `r` could run now: only such a task ends a backoff
  // or stops a task whose launches are in flight (one that cannot run yet, its
  // dependency pending or its memory over budget, would only make the executor spin).
  bool more_urgent_pickable_locked(const Record& r) const;
  // Task `id`, while it is admitted and not final; else nullptr.
  Record* admitted_record_locked(uint64_t id);
  // The task run last; the task armed to follow (arm_next_locked). As above.
  Record* last_run_locked() { return admitted_record_locked(last_run_); }
  Record* armed_next_locked() { return admitted_record_locked(armed_next_); }
  // Before this thread waits for the ends of launches that will run nothing (`current`'s,
  // or a retired runner's): the next task is admitted and armed (PhaseRunner::arm), so
  // the opens the training thread writes meanwhile carry its launches, queued on the
  // stream behind those. It becomes the task run last once they are taken. Not while
  // closing, and not where the most urgent task has launches in flight of its own.
  // `follow`: `current` runs on, in the tail of its last phase, and the next task follows
  // it at opens (PhaseRunner::follow, follow_rule.hpp).
  void arm_next_locked(const Record* current, bool follow = false);
  // `r`, the task run last, is preempted for a more urgent task that can run now: its
  // launches already queued at opens run on (withheld) or stop (withhold_rule.hpp).
  // Before the more urgent task is armed, where it is not yet. True where withheld.
  bool preempt_locked(Record& r);
  // Before `next` is armed: the task run last, less urgent, with launches in flight and
  // not otherwise stopping, is preempted (whichever path arms `next`: the loop's, the
  // retiring branch, a follower drained out of turn), so that its stop fence lands before
  // any launch of `next` on the stream.
  void preempt_last_for_locked(const Record& next);
  // runner.follow() or runner.arm(); false where the runner refused to follow.
  static bool arm_runner(PhaseRunner& runner, bool follow);
  // Whether `r`, about to run, is in the tail where the next task follows it.
  bool in_tail_locked(const Record& r) const;
  // running_item_ns_ from `running`, or from the task armed to follow where there is one.
  void publish_item_ns_locked(const PhaseRunner& running);
  // After the last launch in flight of `r` ended: it fails (a launch failed), is
  // cancelled, moves on to its next phase or is done, or waits in the queue.
  void settle_launch_locked(Record& r);
  void admit_locked(Record& r);
  // Admitted (admit_locked) where it was not yet: false where that failed (the task has
  // failed) or left it final (every phase empty).
  bool ready_to_run_locked(Record& r);
  void advance_locked(Record& r);
  void advance_in_flight_locked(Record& r);
  // The next phase begun, and the count moved past the one complete (only once the
  // runner took it: a begin_phase that throws leaves the record on the complete phase).
  void begin_next_phase_locked(Record& r);
  // Done, its last phase's items counted (finish_locked's arguments otherwise).
  void finish_done_locked(Record& r, std::vector<uint64_t>* named_by = nullptr,
                          bool retire = false);
  // The task's id goes to take_finished()'s list, or to `named_by` where given. `retire`:
  // its runner, launches still in flight, goes to retiring_ instead of away, and the id
  // and memory follow once they have ended (drain_retiring_locked).
  void finish_locked(Record& r, TaskState state, ErrorKind kind, std::string error,
                     std::vector<uint64_t>* named_by = nullptr, bool retire = false);
  // A cancelled task whose launches in flight will run no item any more (PhaseRunner::
  // inert) is made final now, its runner retired (on CUDA: without waiting for the GPU to
  // reach the opens those launches were queued for). Waiters call it as they wait.
  void retire_inert_locked();
  bool retire_pending_locked();
  // Whether `r` (may be null) is a cancelled or complete task with launches in flight.
  static bool retirable(const Record* r);
  // Takes one end of the oldest retiring runner's launches (the lock is released while it
  // waits); once none is left, names the task in take_finished() (or take_abandoned()).
  void drain_retiring_locked(std::unique_lock<std::mutex>& lock);
  // Counts a launch whose end was taken (ran_nothing: it ran no item, not cancelled).
  void count_launch_locked(const LaunchMarks& marks, bool ran_nothing);
  // Cancelled at close with launches that may still run: see take_abandoned().
  void abandon_locked(Record& r);
  Record& record_locked(uint64_t id) const;
  // Waits on done_cv_ until ready() or timeout_s (negative: forever); ready()'s result.
  // While a cancelled task's launches are in flight it looks every kRetirePoll whether
  // they have gone inert (nothing signals that: it happens on the device).
  static constexpr std::chrono::milliseconds kRetirePoll{1};
  template <typename Ready>
  bool wait_locked(std::unique_lock<std::mutex>& lock, double timeout_s, Ready ready) {
    using clock = std::chrono::steady_clock;
    const bool forever = timeout_s < 0;
    const auto deadline = forever ? clock::time_point::max() : clock::now() + clamp_timeout(timeout_s);
    while (true) {
      retire_inert_locked();
      if (ready()) return true;
      const auto now = clock::now();
      if (!forever && now >= deadline) return false;
      if (retire_pending_locked()) {
        done_cv_.wait_until(lock, forever ? now + kRetirePoll : std::min(deadline, now + kRetirePoll));
      } else if (forever) {
        done_cv_.wait(lock);
      } else {
        done_cv_.wait_until(lock, deadline);
      }
    }
  }

  std::unique_ptr<Backend> backend_;
  const uint64_t budget_;
  uint64_t used_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // the loop waits here for runnable work
  std::condition_variable done_cv_;  // wait() and close() wait here
  std::unordered_map<uint64_t, std::unique_ptr<Record>> records_;
  std::set<QueueKey> runnable_;  // queued or paused tasks
  Record* active_ = nullptr;
  uint64_t last_run_ = 0;  // id of the task run last (see loop())
  // A task whose runner has launches in flight (enqueued at opens ahead of the GPU) is
  // run again, one ended launch per run(), before anything else: nothing else may go on
  // the stream behind those launches, and the task is not final until they have ended.
  Record* draining_ = nullptr;
  uint64_t armed_next_ = 0;  // id of the task arm_next_locked armed (0: none)
  // A cancelled follower drained before the task it follows (loop()): not the task run
  // last while it is drained (0: none).
  uint64_t out_of_turn_ = 0;
  // It follows the task run last (PhaseRunner::follow), which still takes the opens: it
  // becomes the task run last only once that one is final, or once it stopped following.
  bool armed_follows_ = false;
  // The armed task takes no further open (a more urgent task, a failure before it).
  void stop_armed_locked(Record& armed);
  uint64_t next_id_ = 1;
  bool recording_ = false;
  uint64_t launches_ = 0;
  uint64_t idle_launches_ = 0;
  uint64_t open_launches_ = 0;
  uint64_t idle_open_launches_ = 0;
  std::atomic<uint64_t> running_item_ns_{0};
  std::vector<uint64_t> abandoned_;
  std::deque<LaunchRecord> launch_log_;
  std::vector<uint64_t> finished_;
  // Runners of tasks made final while their launches were in flight (retire_inert_locked):
  // the loop takes their ends before anything else, then the ids and memory go.
  struct Retiring {
    uint64_t id = 0;
    std::unique_ptr<PhaseRunner> runner;
    uint64_t memory_bytes = 0;  // still charged against the budget until they ended
    bool forgotten = false;     // forget() came first: the record goes once drained (the
                                // loop may still hold it, inside run() when it retired)
    bool done = false;          // retired done (its launches are stale: idle if they ran
                                // nothing), not cancelled (a cancelled task's are not idle)
  };
  std::deque<Retiring> retiring_;
  bool closing_ = false;
  bool loop_exited_ = false;
  bool closed_ = false;
  std::mutex close_mutex_;
  std::thread thread_;
};

const char* state_name(TaskState state);

}  // namespace freeride
