// The host backend: the gate is an atomic word and a "kernel" is a pool of worker
// threads running the same claim-then-check loop as preempt.cuh, so the whole protocol
// runs and is tested on a machine without a GPU.
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "check.hpp"

namespace freeride {
namespace {

class HostBackend;

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
  void run() override;
  void stop() override;
  void resume() override { stop_.store(false); }
  uint64_t done() const override { return done_.load(); }
  bool executing() const override { return executing_.load(); }

  // The claim loop of one worker: exits when the gate closes, stop is set, an item
  // failed or no item is left. A claimed item always runs to completion.
  void work(const std::atomic<uint32_t>& gate) {
    while (gate.load(std::memory_order_acquire) == FREERIDE_GATE_OPEN && !stop_.load()) {
      const uint64_t item = next_.fetch_add(1);
      if (item >= n_items_) return;
      try {
        task_->run_item(phase_, item);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        stop_.store(true);
        return;
      }
      done_.fetch_add(1, std::memory_order_release);
    }
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

  void gate_write(uint32_t value, uintptr_t /*stream*/) override {
    // Host work is synchronous, so a write "in stream order" is a write now.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gate_.store(value, std::memory_order_release);
    }
    gate_cv_.notify_all();
  }
  uint32_t gate_read() const override { return gate_.load(std::memory_order_acquire); }
  uintptr_t gate_address() const override { return reinterpret_cast<uintptr_t>(&gate_); }

  std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<Task> task) override {
    FR_CHECK(!closed_, "host backend is shut down");
    return std::make_unique<HostRunner>(*this, std::move(task));
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
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      work_cv_.wait(lock, [&] { return closed_ || generation_ != seen; });
      if (closed_ && generation_ == seen) return;
      seen = generation_;
      HostRunner* job = job_;
      lock.unlock();
      job->work(gate_);
      lock.lock();
      if (--running_ == 0) done_cv_.notify_all();
    }
  }

  std::atomic<uint32_t> gate_{FREERIDE_GATE_OPEN};
  std::mutex mutex_;
  std::condition_variable gate_cv_, work_cv_, done_cv_;
  std::vector<std::thread> threads_;
  HostRunner* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool closed_ = false;
};

void HostRunner::run() {
  if (!backend_.wait_for_gate(*this)) return;
  executing_.store(true);
  backend_.launch(*this);
  executing_.store(false);
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
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
