// The host backend: the gate is an atomic word and a "kernel" is a pool of worker
// threads running the same claim-then-check loop as preempt.cuh, so the whole protocol
// runs and is tested on a machine without a GPU.
#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend.hpp"
#include "check.hpp"

namespace freeride {
namespace {

class HostBackend;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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
  LaunchMarks run(bool record) override;
  void stop() override;
  void resume() override { stop_.store(false); }
  uint64_t done() const override { return done_.load(); }
  bool executing() const override { return executing_.load(); }

  // The claim loop of one worker: exits when the gate closes, stop is set, an item
  // failed or no item is left. A claimed item always runs to completion. `active` is
  // raised before the gate is read and lowered after the item: with sequentially
  // consistent operations on both words, a closer that stored CLOSED and then sees
  // active == 0 knows no item runs and none will start (HostBackend::gate_write).
  void work(const std::atomic<uint32_t>& gate, std::atomic<int>& active) {
    while (true) {
      active.fetch_add(1);
      if (gate.load() != FREERIDE_GATE_OPEN || stop_.load()) break;
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
      done_.fetch_add(1);
      if (active.fetch_sub(1) == 1) active.notify_all();
    }
    if (active.fetch_sub(1) == 1) active.notify_all();
  }

  bool stop_requested() const { return stop_.load(); }

 private:
  HostBackend& backend_;
  std::shared_ptr<Task> task_;
  uint64_t phase_ = 0;
  uint64_t n_items_ = 0;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> executing_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
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

  void gate_write(uint32_t value, uintptr_t /*stream*/, uint32_t seq) override {
    // Host work is synchronous, so a write "in stream order" is a write now.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seq_.store(seq);
      gate_.store(value);
    }
    gate_cv_.notify_all();
    // A close takes effect once the items that passed the gate before it have finished:
    // at most one item's run time, the host backend's pause latency.
    if (value != FREERIDE_GATE_OPEN) wait_for_items();
  }

  // Sleeps until no item executes. The workers run SCHED_IDLE, so while training waits
  // on them they get normal priority back: otherwise busy cores (other ranks, other
  // processes) could starve an item the training thread is waiting for.
  void wait_for_items() {
    int active = active_.load();
    if (active == 0) return;
    set_workers_idle(false);
    while (active > 0) {
      active_.wait(active);
      active = active_.load();
    }
    set_workers_idle(true);
  }

  void set_workers_idle(bool idle) {
#ifdef __linux__
    sched_param param{};
    param.sched_priority = 0;
    const int policy = idle ? SCHED_IDLE : SCHED_OTHER;
    std::lock_guard<std::mutex> lock(threads_mutex_);
    for (auto& t : threads_) (void)pthread_setschedparam(t.native_handle(), policy, &param);
#else
    (void)idle;
#endif
  }
  uint32_t gate_read() const override { return gate_.load(); }
  uint32_t gate_seq() const override { return seq_.load(); }

  uint64_t mark(uintptr_t /*stream*/) override {
    const int64_t now = steady_ns();
    std::lock_guard<std::mutex> lock(marks_mutex_);
    const uint64_t id = next_mark_++;
    marks_.emplace(id, now);
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

  void unblock() override { wake_waiters(); }
  uintptr_t side_stream() const override { return 0; }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return;
      closed_ = true;
    }
    work_cv_.notify_all();
    gate_cv_.notify_all();
    std::lock_guard<std::mutex> lock(threads_mutex_);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  // Blocks until the gate is open or the runner is stopped; true if the gate is open.
  bool wait_for_gate(const HostRunner& runner) {
    std::unique_lock<std::mutex> lock(mutex_);
    gate_cv_.wait(lock, [&] {
      return closed_ || runner.stop_requested() ||
             gate_.load(std::memory_order_acquire) == FREERIDE_GATE_OPEN;
    });
    return !closed_ && !runner.stop_requested();
  }

  // One launch: every worker runs runner.work() once; returns when all have exited.
  void launch(HostRunner& runner) {
    std::unique_lock<std::mutex> lock(mutex_);
    FR_CHECK(!closed_, "host backend is shut down");
    job_ = &runner;
    running_ = static_cast<int>(threads_.size());
    ++generation_;
    work_cv_.notify_all();
    done_cv_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }

  // Taking the lock before notifying makes sure a waiter either saw the new stop flag
  // in its predicate or is already asleep and gets this notification.
  void wake_waiters() {
    { std::lock_guard<std::mutex> lock(mutex_); }
    gate_cv_.notify_all();
  }

 private:
  void worker_main() {
#ifdef __linux__
    // The host's equivalent of the lowest-priority side stream: SCHED_IDLE threads get a
    // core only when nothing else wants it, so side items take no CPU from training.
    // Best effort: where the policy is refused, the workers run at normal priority.
    sched_param param{};
    param.sched_priority = 0;
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
#endif
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      work_cv_.wait(lock, [&] { return closed_ || generation_ != seen; });
      if (closed_ && generation_ == seen) return;
      seen = generation_;
      HostRunner* job = job_;
      lock.unlock();
      job->work(gate_, active_);
      lock.lock();
      if (--running_ == 0) done_cv_.notify_all();
    }
  }

  std::atomic<uint32_t> gate_{FREERIDE_GATE_OPEN};
  std::atomic<uint32_t> seq_{0};
  std::atomic<int> active_{0};  // workers between their gate check and the end of an item
  std::mutex threads_mutex_;    // threads_ against shutdown while a close boosts them
  std::mutex marks_mutex_;
  std::unordered_map<uint64_t, int64_t> marks_;
  uint64_t next_mark_ = 1;
  std::mutex mutex_;
  std::condition_variable gate_cv_, work_cv_, done_cv_;
  std::vector<std::thread> threads_;
  HostRunner* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool closed_ = false;
};

LaunchMarks HostRunner::run(bool record) {
  LaunchMarks marks;
  if (!backend_.wait_for_gate(*this)) return marks;
  if (record) marks.start = backend_.mark(0);
  executing_.store(true);
  backend_.launch(*this);
  executing_.store(false);
  if (record) marks.end = backend_.mark(0);
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    if (record) {
      backend_.release_mark(marks.start);
      backend_.release_mark(marks.end);
    }
    std::rethrow_exception(error);
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
