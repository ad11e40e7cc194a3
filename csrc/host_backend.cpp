// The host backend: the gate is an atomic word and a "kernel" is a pool of worker
// threads running the same claim-then-check loop as preempt.cuh, so the whole protocol
// runs and is tested on a machine without a GPU.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "admission_stamps.hpp"
#include "atomic_bounds.hpp"
#include "backend.hpp"
#include "check.hpp"
#include "doorbell.hpp"
#include "host_idle.hpp"
#include "steady_clock.hpp"
#include "test_switches.hpp"
#include "thread_name.hpp"

namespace freeride {
namespace {

class HostBackend;

// How often a worker gives its core back between items (see HostRunner::work): often
// enough that a yielding training thread waits at most about one item, rarely enough
// that the syscall (about a microsecond) stays a few percent of short items.
constexpr int64_t kYieldEveryNs = 20'000;

class HostRunner final : public PhaseRunner {
 public:
  HostRunner(HostBackend& backend, std::shared_ptr<Task> task)
      : backend_(backend), task_(std::move(task)) {}

  void begin_phase(uint64_t phase, uint64_t n_items) override {
    phase_ = phase;
    n_items_ = n_items;
    next_.store(0);
    done_.store(0);
  }
  // Called by run() before the workers start: the launch belongs to the bubble opened by
  // the gate write `seq`.
  void begin_launch(uint32_t seq) {
    std::lock_guard<std::mutex> lock(take_mutex_);
    launch_seq_ = seq;
    first_start_ns_.store(INT64_MAX);
    last_end_ns_.store(INT64_MIN);
    workers_left_.store(false);
    live_ = true;
  }
  // The last worker out of a launch (HostBackend::worker_main): its end has come, whenever
  // the executor thread, at idle priority, gets a core to take it.
  void workers_left() { workers_left_.store(true); }
  LaunchMarks run(bool record) override;
  void stop() override;
  void resume() override { stop_.store(false); }
  uint64_t done() const override { return done_.load(); }
  bool executing() const override { return executing_.load(); }
  uint64_t launches_taken() const override {
    std::lock_guard<std::mutex> lock(take_mutex_);
    return taken_;
  }
  uint64_t launches_ending() const override {
    std::lock_guard<std::mutex> lock(take_mutex_);
    return taken_ + (live_ && end_has_come() ? 1 : 0);
  }
  // A worker's mean item time, over every item this task ran (a worker is the host's
  // block: it runs its items one after another).
  uint64_t block_item_ns() const override {
    const uint64_t items = items_timed_.load(std::memory_order_relaxed);
    return items == 0 ? 0 : item_ns_total_.load(std::memory_order_relaxed) / items;
  }

  // The claim loop of one worker: exits when the gate closes, stop is set, an item
  // failed or no item is left. A claimed item always runs to completion, even when the
  // gate closes meanwhile (HostBackend::gate_write does not wait for it).
  //
  // A worker also leaves once the gate was written again since the launch was admitted
  // (`seq` moved on): a worker that gets a core only after a close and the next open
  // must not carry the launch into a later bubble, so that a launch's marks (its first
  // item's start, its last item's end) lie within one bubble.
  void work(const std::atomic<uint32_t>& gate, const std::atomic<uint32_t>& seq) {
    int64_t first = INT64_MAX;
    int64_t last = INT64_MIN;
    int64_t yielded = steady_now_ns();
    // Before the first item too: a worker woken by an open may find the cores wanted.
    int64_t looked = yielded - kYieldEveryNs;
    while (true) {
      // Read before the gate: an item that passes the check started before any later
      // close was stored, so a launch's first mark lies inside the bubble it ran in (its
      // last may lie after the close, by the rest of an item).
      const int64_t start = steady_now_ns();
      if (gate.load() != FREERIDE_GATE_OPEN || seq.load() != launch_seq_ || stop_.load() ||
          backend_items_see_closed()) {
        break;
      }
      // HostIdle "backoff": across scheduling groups SCHED_IDLE does not make this thread
      // give way, so it steps aside itself while a thread waits for a core. Checked as
      // often as the yield below (the read costs about a microsecond).
      if (start - looked >= kYieldEveryNs) {
        looked = start;
        if (backend_crowded()) {
          std::this_thread::sleep_for(std::chrono::nanoseconds(HostIdle::kStepAsideNs));
          looked = steady_now_ns() - kYieldEveryNs;  // and look again at once
          continue;
        }
      }
      const uint64_t item = next_.fetch_add(1);
      if (item >= n_items_) break;
      try {
        task_->run_item(phase_, item);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        stop_.store(true);
        break;
      }
      last = steady_now_ns();
      first = std::min(first, start);
      item_ns_total_.fetch_add(static_cast<uint64_t>(last - start), std::memory_order_relaxed);
      done_.fetch_add(1);
      items_timed_.fetch_add(1, std::memory_order_relaxed);
      // A training thread that yields its core rather than sleeping (gloo's buffer
      // teardown spins on sched_yield) hands it to this idle-priority worker, which
      // would keep it for a whole scheduler slice (measured: up to 3.6 ms); yielding
      // back between items bounds that to one item.
      if (last - yielded >= kYieldEveryNs) {
        std::this_thread::yield();
        yielded = steady_now_ns();
      }
    }
    if (first != INT64_MAX) {
      atomic_min(first_start_ns_, first);
      atomic_max(last_end_ns_, last);
    }
  }

  bool stop_requested() const { return stop_.load(); }

 private:
  bool backend_items_see_closed() const;
  // Whether the launch in progress has ended or ends at its workers' next look: they
  // have all left, or each leaves before its next item (see work()). Caller holds
  // take_mutex_ with a launch live.
  bool end_has_come() const;
  // run(), once the workers have left: the launch's end is taken.
  void take_end() {
    std::lock_guard<std::mutex> lock(take_mutex_);
    ++taken_;
    live_ = false;
  }
  bool backend_crowded() const;

  HostBackend& backend_;
  std::shared_ptr<Task> task_;
  uint64_t phase_ = 0;
  uint64_t n_items_ = 0;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> item_ns_total_{0};  // block_item_ns(): every item's time, summed
  std::atomic<uint64_t> items_timed_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> executing_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
  // The launch in progress: the gate write it was admitted under, and the steady-clock
  // span of the items it ran (INT64_MAX / INT64_MIN while none has finished).
  uint32_t launch_seq_ = 0;
  std::atomic<int64_t> first_start_ns_{INT64_MAX};
  std::atomic<int64_t> last_end_ns_{INT64_MIN};
  // launches_taken() / launches_ending(): live_ from the launch's start (begin_launch)
  // until run() takes its end; taken_ counts the ends taken. Written on the executor
  // thread, read by whoever waits for the launch log.
  mutable std::mutex take_mutex_;
  bool live_ = false;
  uint64_t taken_ = 0;
  std::atomic<bool> workers_left_{false};
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(int workers) {
    FR_ARG(workers >= 1 && workers <= 1024, "workers must be in [1, 1024], got " << workers);
    threads_.reserve(workers);
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_main(); });
  }
  ~HostBackend() override { shutdown(); }

  std::string kind() const override { return "host"; }
  int device() const override { return -1; }
  std::string gate_write_mechanism() const override { return "host"; }
  std::string host_idle() const override { return idle_.mechanism(); }
  std::string host_idle_reason() const override { return idle_.reason(); }
  const HostIdle& idle() const { return idle_; }

  // Lock-free, and a close does not wait for the items in flight: the training thread
  // must never wait on a side thread. The workers run SCHED_IDLE, so one preempted
  // mid-item (by another rank's thread on a busy machine) would hold the close until a
  // core fell idle; and raising it to normal priority for the wait needs RLIMIT_NICE,
  // which unprivileged users lack. As on a GPU, where side blocks finish their current
  // item while training's kernels start, an item that passed the gate before the close
  // runs to its end beside compute, on a thread that yields its core to any training
  // thread that wants it. The number goes before an open and after a close, as on a GPU:
  // a reader of the gate, then the number, never takes a closing bubble for a new one.
  void gate_write(uint32_t value, uintptr_t /*stream*/, uint32_t seq, bool /*launch*/) override {
    const bool open = value == FREERIDE_GATE_OPEN;
    if (open) seq_.store(seq);
    gate_.store(value);
    if (!open) seq_.store(seq);
    if (open) wake_waiters();
  }

  uint32_t gate_read() const override { return gate_.load(); }
  uint32_t gate_seq() const override { return seq_.load(); }
  bool wait_open(double timeout_s) const override {
    return wait_for_open(bell_, timeout_s, [&] { return gate_.load() == FREERIDE_GATE_OPEN; });
  }
  bool wait_next_open(uint32_t seq, double timeout_s) const override {
    return wait_for_ring(bell_, timeout_s, [&] {
      return gate_.load() == FREERIDE_GATE_OPEN && seq_.load() != seq;
    });
  }

  uint64_t mark(uintptr_t /*stream*/) override { return mark_at(steady_now_ns()); }
  // A mark for a steady-clock time already taken (a launch's first and last item).
  uint64_t mark_at(int64_t ns) {
    std::lock_guard<std::mutex> lock(marks_mutex_);
    const uint64_t id = next_mark_++;
    marks_.emplace(id, ns);
    return id;
  }
  // Mark 0 is the steady clock's epoch: elapsed_ns(0, m) is m's absolute time, which
  // lines marks up with other steady-clock timestamps (std::chrono, time.monotonic_ns).
  int64_t elapsed_ns(uint64_t from, uint64_t to) override {
    std::lock_guard<std::mutex> lock(marks_mutex_);
    auto b = marks_.find(to);
    FR_ARG(b != marks_.end(), "unknown mark " << to);
    if (from == 0) return b->second;
    auto a = marks_.find(from);
    FR_ARG(a != marks_.end(), "unknown mark " << from);
    return b->second - a->second;
  }
  void release_mark(uint64_t id) override {
    std::lock_guard<std::mutex> lock(marks_mutex_);
    marks_.erase(id);
  }
  // A host mark is a steady-clock reading, taken when it was made: exact, never waits.
  // The system clock less the steady clock, read between two steady readings, converts
  // it (to within those readings' distance, well under a microsecond).
  int64_t mark_unix_ns(uint64_t mark, double /*timeout_s*/) override {
    int64_t at = 0;
    {
      std::lock_guard<std::mutex> lock(marks_mutex_);
      auto it = marks_.find(mark);
      FR_ARG(it != marks_.end(), "unknown mark " << mark);
      at = it->second;
    }
    const int64_t before = steady_now_ns();
    const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    const int64_t after = steady_now_ns();
    return at + wall - (before + (after - before) / 2);
  }
  uintptr_t gate_address() const override { return reinterpret_cast<uintptr_t>(&gate_); }

  // Host compute is synchronous: whatever the submitter did before submit is complete.
  std::unique_ptr<StreamDependency> after_streams(const std::vector<uintptr_t>&) override {
    return nullptr;
  }

  std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<Task> task,
                                           std::unique_ptr<StreamDependency>) override {
    FR_CHECK(!closed_, "host backend is shut down");
    return std::make_unique<HostRunner>(*this, std::move(task));
  }

  void run_plain(Task& task, uintptr_t) override {
    for (uint64_t phase = 0; phase < task.num_phases(); ++phase) {
      for (uint64_t item = 0; item < task.num_items(phase); ++item) task.run_item(phase, item);
    }
  }

  bool shutting_down() const { return closed_.load(); }
  void unblock() override { wake_waiters(); }
  void interrupt_waits() override { wake_waiters(); }
  void test_items_see_gate_closed(bool on) override { items_see_closed_.store(on); }
  bool items_see_closed() const { return items_see_closed_.load(std::memory_order_relaxed); }
  // Measured on 2 cores (4-rank gloo 1F1B): a normal-priority executor thread, woken at
  // every gate open and again when the workers leave after a close, preempted training
  // threads often enough to triple the time spent in the hooks.
  void on_executor_thread() override { idle_.enter(); }
  AdmissionStamps admission_stamps() const override { return stamps_.read(); }
  uintptr_t side_stream() const override { return 0; }

  // The workers leave as soon as they are idle: one still in a launch finishes its item,
  // leaves the launch (the executor's stop flag), and exits without waiting to be woken
  // again by shutdown().
  void begin_shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    for (auto& t : threads_) leave_idle_priority(t);
    idle_.leave_all();
    work_cv_.notify_all();
    wake_waiters();
  }

  void shutdown() override {
    begin_shutdown();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  // Blocks until the gate is open or the runner is stopped; true if the gate is open,
  // with `seq` the sequence number of the write that opened it.
  bool wait_for_gate(const HostRunner& runner, uint32_t& seq) {
    while (true) {
      const uint64_t epoch = wake_epoch_.load();
      if (closed_.load() || runner.stop_requested()) return false;
      if (gate_.load() == FREERIDE_GATE_OPEN) break;
      wake_epoch_.wait(epoch);
    }
    // Read after the open was seen: a newer write's number at worst, whose launch then
    // ends at once (HostRunner::work checks the gate and the number before each item).
    seq = seq_.load();
    stamps_.woke(seq);
    return true;
  }

  // One launch, admitted under the gate write `seq`: every worker runs runner.work()
  // once; returns when all have exited. After begin_shutdown() it runs nothing (the
  // workers may be gone): the launch ends with no item run, as one stopped before the
  // gate opened.
  void launch(HostRunner& runner, uint32_t seq) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) return;
    job_ = &runner;
    running_ = static_cast<int>(threads_.size());
    ++generation_;
    work_cv_.notify_all();
    stamps_.launched(seq);
    done_cv_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }

  // A waiter reads the epoch before its predicate and sleeps only while the epoch is
  // unchanged, so a gate open, stop or shutdown between the two is never missed.
  void wake_waiters() {
    wake_epoch_.fetch_add(1);
    wake_epoch_.notify_all();
    bell_.ring();
  }

 private:
  void worker_main() {
    name_this_thread("freeride-work");
    idle_.enter();
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      work_cv_.wait(lock, [&] { return closed_ || generation_ != seen; });
      if (closed_ && generation_ == seen) return;
      seen = generation_;
      HostRunner* job = job_;
      lock.unlock();
      job->work(gate_, seq_);
      lock.lock();
      if (--running_ == 0) {
        job->workers_left();
        done_cv_.notify_all();
      }
    }
  }

  HostIdle idle_;
  std::atomic<uint32_t> gate_{FREERIDE_GATE_OPEN};
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> wake_epoch_{0};  // bumped by gate opens, stops and shutdown
  mutable Doorbell bell_;                 // rung with it, for wait_open()'s timeout
  AdmissionStamper stamps_;  // no watcher here: `reached` stays unstamped
  std::mutex marks_mutex_;
  std::unordered_map<uint64_t, int64_t> marks_;
  uint64_t next_mark_ = 1;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> threads_;
  HostRunner* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  std::atomic<bool> closed_{false};  // written under mutex_, read lock-free by waiters
  std::atomic<bool> items_see_closed_{false};  // test_items_see_gate_closed
};

bool HostRunner::backend_items_see_closed() const { return backend_.items_see_closed(); }
bool HostRunner::backend_crowded() const { return backend_.idle().crowded(); }

bool HostRunner::end_has_come() const {
  return workers_left_.load() || backend_.gate_read() != FREERIDE_GATE_OPEN ||
         backend_.gate_seq() != launch_seq_ || stop_.load() || backend_.shutting_down() ||
         backend_items_see_closed();
}

// A launch's marks are its first item's start and its last item's end, taken by the
// workers: not when this thread gets around to it. The workers run SCHED_IDLE, so after a
// close they (and then this thread) may wait for a core until training pauses, and marks
// taken here would stretch the launch over compute it never ran in. A launch that ran no
// item has no marks.
LaunchMarks HostRunner::run(bool record) {
  LaunchMarks marks;
  uint32_t seq = 0;
  if (!backend_.wait_for_gate(*this, seq)) return marks;
  marks.admitted = true;
  marks.gate_seq = seq;
  begin_launch(seq);
  executing_.store(true);
  backend_.launch(*this, seq);
  test_switches::delay_launch_end();
  executing_.store(false);
  take_end();
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
  const int64_t first = first_start_ns_.load();
  if (record && first != INT64_MAX) {
    marks.start = backend_.mark_at(first);
    marks.end = backend_.mark_at(last_end_ns_.load());
  }
  return marks;
}

void HostRunner::stop() {
  stop_.store(true);
  backend_.wake_waiters();
}

}  // namespace

std::unique_ptr<Backend> make_host_backend(int workers) {
  return std::make_unique<HostBackend>(workers);
}

}  // namespace freeride
