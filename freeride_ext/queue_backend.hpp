// A backend whose launches a test enqueues and ends by hand: the shape of the CUDA
// backend's launches at opens (queued ahead of the GPU, ended in order, idle once their
// phase is done, abandoned at close) with nothing underneath, so that tests drive the
// executor through every state those launches put it in without a GPU. Only _C._testing
// (test_hooks.cpp) uses it, so it lives beside the bindings, not in the core.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "check.hpp"
#include "doorbell.hpp"
#include "queued_launches.hpp"
#include "task.hpp"

namespace freeride {

class QueuedRunner final : public PhaseRunner {
 public:
  explicit QueuedRunner(std::shared_ptr<QueuedLaunches> q) : q_(std::move(q)) {}
  ~QueuedRunner() override {
    std::lock_guard<std::mutex> lk(q_->arm_slot->mu);
    if (q_->arm_slot->armed.lock() == q_) q_->arm_slot->armed.reset();
    if (q_->arm_slot->follower.lock() == q_) q_->arm_slot->follower.reset();
  }
  QueuedRunner(const QueuedRunner&) = delete;
  QueuedRunner& operator=(const QueuedRunner&) = delete;

  void arm() override { (void)arm_if_taking(); }
  bool follow() override { return arm_if_taking(true); }
  void interrupt() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->interrupt = true;
    q_->cv.notify_all();
  }
  uint64_t launches_in_flight() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return q_->pending.size();
  }
  uint64_t bubbles_in_flight() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return q_->bubbles_locked();
  }

  void begin_phase(uint64_t phase, uint64_t n_items) override {
    std::lock_guard<std::mutex> lk(q_->mu);
    FR_CHECK(q_->phases_ahead || q_->pending.empty(), "begin_phase() with launches in flight");
    FR_CHECK(!q_->phases_ahead || q_->phases == 0 || phase == q_->phase + 1,
             "phases ahead: begin_phase(" << phase << ") after phase " << q_->phase);
    ++q_->phases;
    q_->phase = phase;
    q_->n_items = n_items;
    q_->done = q_->phases_ahead ? q_->phase_done_items[phase] : 0;
    q_->phase_done = q_->phases_ahead && q_->done >= n_items;
  }
  bool begins_phases_in_flight() const override { return q_->phases_ahead; }
  uint64_t done_ahead() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    if (!q_->phases_ahead) return 0;
    auto it = q_->phase_done_items.find(q_->phase + 1);
    return it == q_->phase_done_items.end() ? 0 : it->second;
  }

  // One launch's end, oldest first; with none pending, waits for one (or a stop).
  LaunchMarks run(bool) override {
    (void)arm_if_taking();  // as CudaRunner::run
    QueuedLaunches& q = *q_;
    std::unique_lock<std::mutex> lk(q.mu);
    ++q.runs;
    q.cv.wait(lk, [&] {
      return !q.pending.empty() || q.stopped || q.withheld || q.abandoned || q.interrupt;
    });
    if (q.pending.empty()) {
      LaunchMarks none;
      none.handed_back = q.interrupt && !q.abandoned;  // as CudaRunner::run's wait
      q.interrupt = false;
      return none;
    }
    while (true) {
      q.cv.wait(lk, [&] {
        return q.pending.front().items >= 0 || q.abandoned || !q.failure.empty() ||
               q.hand_back || q.interrupt;
      });
      const bool waiting = q.pending.front().items < 0 && !q.abandoned && q.failure.empty();
      if (waiting && q.interrupt) {
        q.interrupt = false;
        LaunchMarks untaken;
        untaken.handed_back = true;
        return untaken;
      }
      if (!q.hand_back || !waiting) break;
      q.hand_back = false;  // once, whether or not it hands back
      if (!q.pending.front().begun && q.pending.front().waits_open) {
        LaunchMarks untaken;
        untaken.handed_back = true;
        return untaken;
      }
    }
    if (!q.failure.empty()) {
      std::string failure;
      failure.swap(q.failure);
      if (q.failure_drops) {
        q.taken += q.pending.size();
        q.pending.clear();
      } else {
        ++q.taken;
        q.pending.pop_front();
      }
      throw RuntimeFailure(failure);
    }
    if (q.pending.front().items < 0) throw Abandoned("abandoned at close (test backend)");
    const QueuedLaunches::Launch l = q.pending.front();
    q.pending.pop_front();
    ++q.taken;
    LaunchMarks marks;
    marks.admitted = true;
    marks.at_open = l.at_open;
    if (q.phases_ahead) {
      q.done = q.phase_done_items[q.phase];
    } else {
      q.done = std::min<uint64_t>(q.n_items, q.done + static_cast<uint64_t>(l.items));
    }
    if (q.done >= q.n_items) q.phase_done = true;
    return marks;
  }

  void stop() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    if (q_->stop_fails) throw RuntimeFailure("the stop write failed (test backend)");
    q_->stopped = true;
    ++q_->stops;
    q_->cv.notify_all();
  }
  // The model's withheld launches begin as any other (begin_locked: saw_stop is the stop
  // alone), so they run what the test ends them with.
  void withhold() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->withheld = true;
    ++q_->withholds;
    q_->cv.notify_all();
  }
  void resume() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->stopped = false;
    q_->withheld = false;
    q_->hand_back = false;  // as CudaRunner::resume: one meant for an earlier wait
    q_->interrupt = false;
  }
  void hand_back() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->hand_back = true;
    q_->cv.notify_all();
  }
  uint64_t done() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return q_->done;
  }
  bool executing() const override { return false; }
  // As the CUDA runner's: stopped (the model's stop lands at once) and the oldest launch in
  // flight has not begun.
  bool inert() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return q_->stopped && !q_->pending.empty() && !q_->pending.front().begun;
  }
  bool in_flight() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return !q_->pending.empty();
  }
  // Every launch enqueued counts as ending, as CUDA's launches at opens with a time slice
  // do (here the test ends them).
  uint64_t launches_taken() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return q_->taken;
  }
  uint64_t launches_ending() const override {
    std::lock_guard<std::mutex> lk(q_->mu);
    return q_->taken + q_->pending.size();
  }
  void abandon() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->abandoned = true;
    q_->cv.notify_all();
  }

 private:
  bool arm_if_taking(bool follow = false) {
    bool takes = false;
    {
      std::lock_guard<std::mutex> lk(q_->mu);
      takes = q_->takes_opens_locked();
    }
    if (!takes || q_->refusing->load()) return false;
    ArmSlot& slot = *q_->arm_slot;
    std::lock_guard<std::mutex> lk(slot.mu);
    if (!follow) {
      slot.armed = q_;
      if (slot.follower.lock() == q_) slot.follower.reset();
      return true;
    }
    if (slot.armed.lock() == q_) return false;
    slot.follower = q_;
    return true;
  }

  std::shared_ptr<QueuedLaunches> q_;
};

// The CUDA backend's switches the model follows (each off by default; the CUDA backend
// reads them from the environment, a test passes them by name).
struct QueueSwitches {
  bool phases_ahead = false;     // csrc/phase_ahead_rule.hpp
  uint64_t lookahead_bound = 0;  // csrc/open_launch_rule.hpp; 0: none
  bool followers = false;        // csrc/follow_rule.hpp
  bool device_phases = false;    // csrc/device_phases.hpp
  bool withhold = false;         // csrc/withhold_rule.hpp
};

class QueueBackend final : public Backend {
 public:
  explicit QueueBackend(const QueueSwitches& switches = {}) : on_(switches) {}
  bool device_phases() const override { return on_.device_phases; }
  bool withholds() const override { return on_.withhold; }
  uint64_t opens_beyond_lookahead() const override { return beyond_lookahead_->load(); }
  uint64_t skipped_open_launches() const override { return cross_stream_skips_->load(); }
  uint64_t opens_served_by_executor() const override { return executor_served_skips_->load(); }
  std::string kind() const override { return "queue"; }
  int device() const override { return -1; }
  std::string gate_write_mechanism() const override { return "host"; }
  void gate_write(uint32_t value, uintptr_t, uint32_t seq, bool) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      gate_ = value;
      seq_ = seq;
    }
    bell_.ring();
  }
  uint32_t gate_read() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return gate_;
  }
  uint32_t gate_seq() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return seq_;
  }
  bool wait_open(double timeout_s) const override {
    return wait_for_open(bell_, timeout_s, [&] { return gate_read() == 1u; });
  }
  bool wait_next_open(uint32_t seq, double timeout_s) const override {
    std::unique_lock<std::mutex> lk(mu_);
    ++backoffs_;
    backoff_cv_.notify_all();
    if (hold_backoffs_) {  // until interrupt_waits(), whatever rings or times out
      const uint64_t interrupts = interrupts_;
      backoff_cv_.wait(lk, [&] { return interrupts_ != interrupts; });
      return false;
    }
    lk.unlock();
    return wait_for_ring(bell_, timeout_s, [&] { return gate_read() == 1u && gate_seq() != seq; });
  }
  void interrupt_waits() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++interrupts_;
    }
    backoff_cv_.notify_all();
    bell_.ring();
  }
  void refuse_launches_at_opens() override {
    refusing_->store(true);
    std::lock_guard<std::mutex> lk(arm_->mu);
    arm_->armed.reset();
    arm_->follower.reset();
  }
  bool launches_at_opens() const override { return true; }
  bool followers() const override { return on_.followers; }
  uint64_t mark(uintptr_t) override { return 0; }
  int64_t elapsed_ns(uint64_t, uint64_t) override { return kPending; }
  void release_mark(uint64_t) override {}
  uintptr_t gate_address() const override { return 0; }
  std::unique_ptr<StreamDependency> after_streams(const std::vector<uintptr_t>&) override {
    return nullptr;
  }
  std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<Task> task,
                                           std::unique_ptr<StreamDependency>) override {
    auto q = std::make_shared<QueuedLaunches>();
    q->phases_ahead = on_.phases_ahead && task->follows_item_protocol();
    q->lookahead_bound = on_.lookahead_bound;
    q->beyond_lookahead = beyond_lookahead_;
    q->cross_stream_skips = cross_stream_skips_;
    q->executor_served_skips = executor_served_skips_;
    q->stamps = stamps_;
    q->task = std::move(task);
    q->refusing = refusing_;
    q->bell = &bell_;
    q->arm_slot = arm_;
    {
      std::lock_guard<std::mutex> lk(mu_);
      q->index = made_.size();
      made_.push_back(q);
    }
    made_cv_.notify_all();
    return std::make_unique<QueuedRunner>(std::move(q));
  }
  void unblock() override {}
  void run_plain(Task&, uintptr_t) override {
    FR_THROW(RuntimeFailure, "the test queue backend runs nothing plain");
  }
  uintptr_t side_stream() const override { return 0; }
  void abandon_work() override {
    std::lock_guard<std::mutex> lk(mu_);
    abandoned_work_ = true;
  }
  void shutdown() override {}
  // Once every launch left pending (abandoned) has ended: the test ends them by hand.
  bool reclaim_abandoned() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& q : made_) {
      std::lock_guard<std::mutex> qlk(q->mu);
      for (const QueuedLaunches::Launch& l : q->pending) {
        if (l.items < 0) return false;
      }
    }
    return true;
  }

  // The launches of the `index`-th runner made (in admission order), once it is made.
  std::shared_ptr<QueuedLaunches> launches(size_t index, double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    const bool made = made_cv_.wait_for(lk, clamp_timeout(timeout_s),
                                        [&] { return made_.size() > index; });
    FR_CHECK(made, "runner " << index << " was not made within " << timeout_s << " s");
    return made_[index];
  }
  // `count` stream-ordered opens (open_one): (the armed runner's index in admission order,
  // or -1 where none is armed, and how many launches it took). The follower's show in its
  // own launches (follower()).
  // `stream`: the training stream they are written on (the cross-stream rule); `seq`: the
  // first one's number, each next one's one more (0: not given).
  std::pair<int64_t, size_t> open(size_t count, uint64_t stream = 0, uint32_t seq = 0) {
    int64_t armed = -1;
    size_t taken = 0;
    for (size_t n = 0; n < count; ++n) {
      const uint32_t number = seq == 0u ? 0u : seq + static_cast<uint32_t>(n);
      const auto [index, queued] = open_one_counted(nullptr, stream, number);
      armed = index;
      taken += queued;
    }
    return {armed, taken};
  }
  // One open: the indices of the runners whose launches it queued, in stream order (the
  // armed runner's, then its follower's, chained behind where the armed one took one).
  std::vector<int64_t> open_one(uint64_t stream = 0) {
    std::vector<int64_t> queued;
    open_one_counted(&queued, stream);
    return queued;
  }
  // The index of the runner following the armed one (-1: none).
  int64_t follower() {
    std::lock_guard<std::mutex> lk(arm_->mu);
    const auto f = arm_->follower.lock();
    return f ? static_cast<int64_t>(f->index) : -1;
  }
  bool abandoned_work() const {
    std::lock_guard<std::mutex> lk(mu_);
    return abandoned_work_;
  }

  // Backoffs: while held, each wait_next_open() lasts until interrupt_waits() (a submit,
  // cancel or close), so a test can act while the executor is inside one. How many began.
  void hold_backoffs(bool on) {
    std::lock_guard<std::mutex> lk(mu_);
    hold_backoffs_ = on;
  }
  bool wait_backoffs(uint64_t count, double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    return backoff_cv_.wait_for(lk, clamp_timeout(timeout_s), [&] { return backoffs_ >= count; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable made_cv_;
  mutable Doorbell bell_;
  mutable std::condition_variable backoff_cv_;
  mutable uint64_t backoffs_ = 0;
  uint64_t interrupts_ = 0;
  bool hold_backoffs_ = false;
  const QueueSwitches on_;
  std::shared_ptr<std::atomic<uint64_t>> beyond_lookahead_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> cross_stream_skips_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> executor_served_skips_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> stamps_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<bool>> refusing_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<ArmSlot> arm_ = std::make_shared<ArmSlot>();
  uint32_t gate_ = 1u;
  uint32_t seq_ = 0;
  bool abandoned_work_ = false;
  std::vector<std::shared_ptr<QueuedLaunches>> made_;

  // One open, as CudaShared::launch_at_open: (the armed runner's index or -1, what it
  // took); every launch queued appended to `queued` by runner index.
  std::pair<int64_t, size_t> open_one_counted(std::vector<int64_t>* queued, uint64_t stream,
                                              uint32_t seq = 0) {
    std::shared_ptr<QueuedLaunches> armed;
    std::shared_ptr<QueuedLaunches> follower;
    {
      std::lock_guard<std::mutex> lk(arm_->mu);
      armed = arm_->armed.lock();
      follower = arm_->follower.lock();
    }
    // Other runners' launches: those waiting for their opens, and the newest on the side
    // stream (CudaShared::launch_at_open's context_for).
    auto others_of = [&](const std::shared_ptr<QueuedLaunches>& q) {
      std::vector<std::shared_ptr<QueuedLaunches>> made;
      {
        std::lock_guard<std::mutex> lk(mu_);
        made = made_;
      }
      std::pair<uint64_t, QueuedLaunches::Newest> out;
      for (const auto& other : made) {
        if (other == q) continue;
        std::lock_guard<std::mutex> lk(other->mu);
        out.first += other->waiting_locked();
        out.second = QueuedLaunches::newer(out.second, other->newest_locked());
      }
      return out;
    };
    auto note = [&](const std::shared_ptr<QueuedLaunches>& q, size_t n) {
      for (; queued != nullptr && n > 0; --n) queued->push_back(static_cast<int64_t>(q->index));
    };
    size_t took = 0;
    if (armed) {
      const auto [waiting, newest] = others_of(armed);
      took = armed->arrive(1, true, waiting, false, stream, &newest, seq);
      note(armed, took);
    }
    if (follower) {
      const auto [waiting, newest] = others_of(follower);
      note(follower, follower->arrive(1, true, waiting, took > 0, stream, &newest, seq));
    }
    return {armed ? static_cast<int64_t>(armed->index) : -1, took};
  }
};

}  // namespace freeride
