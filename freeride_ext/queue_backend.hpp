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
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "check.hpp"
#include "doorbell.hpp"
#include "open_launch_rule.hpp"
#include "phase_ahead_rule.hpp"
#include "task.hpp"

namespace freeride {

struct QueuedLaunches;

// Which runner the backend's opens launch (CudaShared::armed): the one armed last, by
// run() or arm(), until it is destroyed; and the one following it (follow()), whose
// launch each open queues behind the armed one's.
struct ArmSlot {
  std::mutex mu;
  std::weak_ptr<QueuedLaunches> armed;
  std::weak_ptr<QueuedLaunches> follower;
};

// One runner's launches, shared by the runner and the test (which may outlive it).
struct QueuedLaunches {
  static constexpr size_t kCapacity = 32;  // as kLaunchRing: the most a runner takes

  std::mutex mu;
  std::condition_variable cv;
  struct Launch {
    int64_t items = -1;  // what it ran once ended; -1 while it has not
    bool at_open = true;  // false: the executor's own (seen open on the mirror)
    uint64_t phase = 0;   // the phase it launches
    bool guarded = false;  // chained at an open behind phase - 1's (phases ahead)
    bool waits_open = false;  // the first of an open's launches (the lookahead counts them)
    bool begun = false;       // its blocks have started (begin(), or its end)
    bool saw_stop = false;    // it began with the stop set: it claims nothing
  };
  std::deque<Launch> pending;
  uint64_t phases = 0;  // begin_phase() calls
  uint64_t phase = 0;   // the current phase (the last begun)
  uint64_t n_items = 0;
  uint64_t done = 0;    // the current phase's, as the runner reports it
  bool phase_done = false;
  // Phases ahead (phase_ahead_rule.hpp): begin_phase() with launches in flight, and
  // opens that chain a guarded launch of the next phase. The model's device: what every
  // phase finished (a launch's items are capped by what its phase has left, and a guarded
  // one runs none unless the phase before is complete as it ends).
  bool phases_ahead = false;
  std::shared_ptr<Task> task;
  // The lookahead bound (open_launch_rule.hpp), and the opens past it left without a launch
  // (the backend's count, shared by its runners). The model's "not begun": not ended.
  uint64_t lookahead_bound = 0;
  std::shared_ptr<std::atomic<uint64_t>> beyond_lookahead;
  std::map<uint64_t, uint64_t> phase_done_items;
  uint64_t ran = 0;  // items every ended launch ran, in all
  bool stopped = false;
  bool abandoned = false;
  std::string failure;  // the next run() throws it (see fail())
  bool failure_drops = true;
  bool stop_fails = false;  // stop() throws, as a stop write does on a broken context
  // The backend's: set once it refuses launches at opens (close), and what an arrival
  // rings (an open's launch ends a backoff, as CudaRunner::launch_at_open's ring does).
  std::shared_ptr<std::atomic<bool>> refusing = std::make_shared<std::atomic<bool>>(false);
  Doorbell* bell = nullptr;
  std::shared_ptr<ArmSlot> arm_slot;
  size_t index = 0;     // the backend's made_ order
  uint64_t runs = 0;    // run() calls
  uint64_t taken = 0;   // ends run() took (or dropped with a failure)
  uint64_t stops = 0;   // stop() calls
  bool hand_back = false;  // PhaseRunner::hand_back, until a run() returns for it
  bool interrupt = false;  // PhaseRunner::interrupt, likewise

  // Launches enqueued at opens, as the CUDA runner takes them: none before its first
  // phase begins, once stopped, once the phase is done, when kCapacity are pending or
  // once the backend refuses them. How many were taken. `at_open` false: launches of the
  // executor's own instead (taken whatever the backend refuses: the executor makes them).
  // With phases ahead, an open takes what launches_at_open says (one launch or two), and
  // the count is of launches; the executor's own launch the current phase only.
  // `others`: launches of other runners waiting for their opens (the lookahead counts
  // them too: CudaShared::launch_at_open's WaitingOpens). `chained`: a follower's launch
  // right behind the armed runner's at the same open, which waits for none of its own.
  size_t arrive(size_t count, bool at_open = true, uint64_t others = 0, bool chained = false) {
    size_t taken = 0;
    {
      std::lock_guard<std::mutex> lk(mu);
      for (size_t open = 0; open < count; ++open) {
        if (phases == 0 || stopped || abandoned || (at_open && refusing->load())) break;
        const OpenLaunches go = launches_at_open(*task, phases_ahead && at_open, phase,
                                                 phase_done, kCapacity - pending.size());
        if (!go.current && !go.next) break;
        if (at_open && !chained && !within_lookahead(waiting_locked() + others, lookahead_bound)) {
          if (beyond_lookahead) beyond_lookahead->fetch_add(1);
          continue;
        }
        const bool waits = at_open && !chained;
        if (go.current) pending.push_back({-1, at_open, phase, false, waits});
        if (go.next) pending.push_back({-1, at_open, phase + 1, true, waits && !go.current});
        taken += (go.current ? 1 : 0) + (go.next ? 1 : 0);
      }
      cv.notify_all();
    }
    if (taken > 0 && bell != nullptr) bell->ring();
    return taken;
  }

  // Launches waiting for their opens (the model's "not begun": not ended; caller holds mu).
  uint64_t waiting_locked() const {
    uint64_t n = 0;
    for (const Launch& l : pending) n += l.waits_open && l.items < 0 ? 1 : 0;
    return n;
  }

  // As CudaRunner::takes_opens_locked (caller holds mu).
  bool takes_opens_locked() const {
    return phases > 0 && pending.empty() && !stopped &&
           (!phase_done || (phases_ahead && phase + 1 < task->num_phases()));
  }

  // Launch `l` begins now, if it had not (caller holds mu): it sees the stop as it is.
  void begin_locked(Launch& l) {
    if (l.begun) return;
    l.begun = true;
    l.saw_stop = stopped;
  }

  // The oldest launch not yet begun begins (its first block starts): with the stop set, it
  // will claim nothing, as a kernel reads the stop word at its first claim.
  void begin() {
    std::lock_guard<std::mutex> lk(mu);
    for (Launch& l : pending) {
      if (!l.begun) {
        begin_locked(l);
        return;
      }
    }
    FR_THROW(InvalidArgument, "no launch is waiting to begin");
  }

  // The oldest launch not yet ended ends (beginning now if it had not), having run `items`
  // items: fewer where its phase has fewer left, none where it began stopped or is guarded
  // and the phase before is not complete.
  void end(int64_t items) {
    FR_ARG(items >= 0, "items must not be negative");
    std::lock_guard<std::mutex> lk(mu);
    for (Launch& l : pending) {
      if (l.items < 0) {
        begin_locked(l);
        uint64_t& finished = phase_done_items[l.phase];
        const bool ready =
            !l.guarded || phase_done_items[l.phase - 1] >= task->num_items(l.phase - 1);
        uint64_t can = l.saw_stop || !ready ? 0 : static_cast<uint64_t>(items);
        can = std::min<uint64_t>(can, task->num_items(l.phase) - finished);
        finished += can;
        l.items = static_cast<int64_t>(can);
        ran += can;
        cv.notify_all();
        return;
      }
    }
    FR_THROW(InvalidArgument, "no launch is pending");
  }

  // The next run() throws `message`: with `drop_pending`, as after a kernel fault (nothing
  // enqueued behind it runs: every pending launch is gone); otherwise as after a launch
  // that broke the item protocol (that launch ended, the others are still to come).
  void fail(std::string message, bool drop_pending) {
    std::lock_guard<std::mutex> lk(mu);
    failure = std::move(message);
    failure_drops = drop_pending;
    cv.notify_all();
  }
};

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
    q.cv.wait(lk, [&] { return !q.pending.empty() || q.stopped || q.abandoned; });
    if (q.pending.empty()) return LaunchMarks{};
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
  void resume() override {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->stopped = false;
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

class QueueBackend final : public Backend {
 public:
  explicit QueueBackend(bool phases_ahead = false, uint64_t lookahead_bound = 0,
                        bool followers = false)
      : phases_ahead_(phases_ahead), lookahead_bound_(lookahead_bound), followers_(followers) {}
  uint64_t opens_beyond_lookahead() const override { return beyond_lookahead_->load(); }
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
  bool followers() const override { return followers_; }
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
    q->phases_ahead = phases_ahead_ && task->follows_item_protocol();
    q->lookahead_bound = lookahead_bound_;
    q->beyond_lookahead = beyond_lookahead_;
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
  std::pair<int64_t, size_t> open(size_t count) {
    int64_t armed = -1;
    size_t taken = 0;
    for (size_t n = 0; n < count; ++n) {
      const auto [index, queued] = open_one_counted();
      armed = index;
      taken += queued;
    }
    return {armed, taken};
  }
  // One open: the indices of the runners whose launches it queued, in stream order (the
  // armed runner's, then its follower's, chained behind where the armed one took one).
  std::vector<int64_t> open_one() {
    std::vector<int64_t> queued;
    open_one_counted(&queued);
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
  bool phases_ahead_ = false;
  uint64_t lookahead_bound_ = 0;
  bool followers_ = false;
  std::shared_ptr<std::atomic<uint64_t>> beyond_lookahead_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<bool>> refusing_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<ArmSlot> arm_ = std::make_shared<ArmSlot>();
  uint32_t gate_ = 1u;
  uint32_t seq_ = 0;
  bool abandoned_work_ = false;
  std::vector<std::shared_ptr<QueuedLaunches>> made_;

  // One open, as CudaShared::launch_at_open: (the armed runner's index or -1, what it
  // took); every launch queued appended to `queued` by runner index.
  std::pair<int64_t, size_t> open_one_counted(std::vector<int64_t>* queued = nullptr) {
    std::shared_ptr<QueuedLaunches> armed;
    std::shared_ptr<QueuedLaunches> follower;
    {
      std::lock_guard<std::mutex> lk(arm_->mu);
      armed = arm_->armed.lock();
      follower = arm_->follower.lock();
    }
    auto others_of = [&](const std::shared_ptr<QueuedLaunches>& q) {
      std::vector<std::shared_ptr<QueuedLaunches>> made;
      {
        std::lock_guard<std::mutex> lk(mu_);
        made = made_;
      }
      uint64_t n = 0;
      for (const auto& other : made) {
        if (other == q) continue;
        std::lock_guard<std::mutex> lk(other->mu);
        n += other->waiting_locked();
      }
      return n;
    };
    auto note = [&](const std::shared_ptr<QueuedLaunches>& q, size_t n) {
      for (; queued != nullptr && n > 0; --n) queued->push_back(static_cast<int64_t>(q->index));
    };
    size_t took = 0;
    if (armed) {
      took = armed->arrive(1, true, others_of(armed));
      note(armed, took);
    }
    if (follower) note(follower, follower->arrive(1, true, others_of(follower), took > 0));
    return {armed ? static_cast<int64_t>(armed->index) : -1, took};
  }
};

}  // namespace freeride
