// CudaRunner: enqueueing launches (the executor's own, those at stream-ordered opens on a
// training thread, stream_wait's hold on the gate's mirror) and the stop word they read.
#include "cuda/cuda_runner.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "check.hpp"
#include "cuda/dependency.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "freeride/item_ctx.h"
#include "atomic_bounds.hpp"
#include "capture_mode.hpp"
#include "launch_slice_rule.hpp"
#include "launchers.hpp"
#include "open_launch_rule.hpp"
#include "successor_rule.hpp"
#include "watcher_launch_rule.hpp"

namespace freeride::cuda {

bool CudaRunner::launch_at_open(cudaStream_t training, cudaEvent_t opened, uint32_t seq,
                                const OpenContext& context) noexcept {
  bool rang = false;
  bool waits = false;
  try {
    std::lock_guard<std::mutex> lk(launch_mu_);
    if (!open_for_launches_locked()) return false;
    const bool had_pending = !pending_.empty();
    const OpenLaunches go =
        launches_at_open(*task_, ahead_, phase_, phase_done_, kLaunchRing - pending_.size());
    if (!go.current && !go.next) return false;
    // What waits for opens on the stream and the hardware queues: this runner's launches
    // and any other's (a task drained while this one is armed, one this one follows).
    WaitingOpens waiting = context.others;
    waiting_opens_locked(waiting, stream_);
    if (!context.chained) {
      if (waiting.newest_stamp != 0 &&
          served_by_executor(waiting.newest_at_open, waiting.newest_holds, waiting.newest_seq,
                             seq)) {
        s_->executor_served_skips.fetch_add(1);
        return false;
      }
      if (waiting.newest_stamp != 0 &&
          waits_behind_another_stream(waiting.newest_at_open, waiting.newest_begun,
                                      waiting.newest_training == training)) {
        s_->cross_stream_skips.fetch_add(1);
        return false;
      }
      // Counted once per open: what this open adds is one more waiting for its open (a
      // launch chained behind it waits for none).
      if (!within_lookahead(waiting.count, s_->lookahead_bound)) {
        s_->beyond_lookahead.fetch_add(1);
        return false;
      }
    }
    // Chained behind the armed runner's launch at this open (a follower's): no wait of
    // its own, it begins once that one has left.
    cudaEvent_t waits_on = context.chained ? nullptr : opened;
    if (waits_on != nullptr && !context.recorded) {
      FR_CUDA_CHECK(cudaEventRecord(opened, training));
    }
    if (go.current) {
      enqueue_locked(waits_on, seq, true, true, phase_);
      pending_.back().training = training;
      waits = waits_on != nullptr;
      waits_on = nullptr;
    }
    if (go.next) {
      // Behind the current phase's launch on the stream where there is one (so after the
      // open already), guarded by that phase's completion.
      enqueue_locked(waits_on, seq, true, true, phase_ + 1, true);
      pending_.back().training = training;
      waits = waits || waits_on != nullptr;
    }
    if (waits) atomic_max(s_->max_lookahead, waiting.count + 1);
    // Behind launches of its own the executor waits for the oldest one's end, which this
    // launch does not bring nearer: no wake-up for it (a futex wake on the training
    // thread, and one for the executor, at nearly every open; review G9). That wait sees
    // the oldest begin by the watcher's ring at its open, where it waits for one, else
    // by its own looks (wait_for_end's kEndPollFar, kNotBegunWait): a ring here, when
    // the host wrote a later open, told it nothing about when the GPU began the oldest.
    rang = !had_pending;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(launch_mu_);
    arrival_error_ = std::string("a launch at a gate open failed: ") + e.what();
    rang = true;
  } catch (...) {
    std::lock_guard<std::mutex> lk(launch_mu_);
    arrival_error_ = "a launch at a gate open failed";
    rang = true;
  }
  // This call's errors must not be left to be taken for a later call's. The last error
  // cleared is this module's own: the CUDA runtime is linked statically (CMakeLists.txt),
  // and the runtime keeps the last error per instance of itself and host thread, so an
  // error torch's or the user's runtime holds for the training thread is left for them
  // to see (cudaGetLastError's documentation; tests/test_build.py checks the link).
  (void)cudaGetLastError();
  if (rang) s_->gate.bell->ring();  // the executor takes it up (or the error)
  return waits;
}

bool CudaRunner::launch_at_reached_open(uint32_t seq, bool others_pending) noexcept {
  CudaShared& s = *s_;
  bool launched = false;
  try {
    std::lock_guard<std::mutex> lk(launch_mu_);
    ReachedOpen o;
    o.enabled = s.watcher_launch && !s.stream_wait;
    o.pending = !pending_.empty();
    o.accepting = accepting_locked();
    o.stopping = stopping() || abandoned_.load();
    // The mirror, then the number, as run() reads them: an open writes its number first.
    o.gate_open = s.mirror() == FREERIDE_GATE_OPEN;
    o.same_open = s.mirror_seq() == seq;
    o.skipped = s.skipped.contains(seq);
    o.others_pending = others_pending;
    if (!watcher_launches(o)) return false;
    DeviceGuard guard(s.device);
    // The executor's thread leaves its current context to the runtime, which resolves a
    // green-context stream's context itself: it makes only runtime calls on streams. This
    // thread's next call is the driver's wait on an event of the primary context, so the
    // primary context is kept current across the launch, as on a training thread.
    const KeepCurrentContext keep(green_);
    // Marked, as the executor's own launches are (run(true)).
    enqueue_locked(nullptr, seq, false, true, phase_);
    s.stamps->launched(seq);
    launched = true;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(launch_mu_);
    arrival_error_ = std::string("a launch at an open the GPU reached failed: ") + e.what();
  } catch (...) {
    std::lock_guard<std::mutex> lk(launch_mu_);
    arrival_error_ = "a launch at an open the GPU reached failed";
  }
  // The watcher's next wait must not end on this call's error, nor report it.
  (void)cudaGetLastError();
  return launched;
}

bool CudaRunner::begun_after(uint64_t stamp) const noexcept {
  try {
    std::lock_guard<std::mutex> lk(launch_mu_);
    if (taken_stamp_ > stamp) return true;
    for (const Launch& l : pending_) {
      if (l.stamp > stamp && ring_.started(l.number, launch_no_.load())) return true;
    }
  } catch (...) {
  }
  return false;
}

bool CudaRunner::pending_on(cudaStream_t stream) const noexcept {
  try {
    std::lock_guard<std::mutex> lk(launch_mu_);
    return stream == stream_ && !pending_.empty();
  } catch (...) {
    return true;  // cannot tell: as if pending, so no launch is made behind it
  }
}

void CudaRunner::add_waiting_opens(WaitingOpens& into, cudaStream_t stream) const noexcept {
  try {
    std::lock_guard<std::mutex> lk(launch_mu_);
    waiting_opens_locked(into, stream);
  } catch (...) {
  }
}

// The newest launch that waits for an open of its own, or the executor's (a launch chained
// behind another waits for none): what a launch enqueued now on the stream waits behind.
void CudaRunner::waiting_opens_locked(WaitingOpens& into, cudaStream_t stream) const {
  into.count += opens_ahead_locked();
  if (stream != stream_) return;
  auto newest = std::find_if(pending_.rbegin(), pending_.rend(),
                             [](const Launch& l) { return l.waits_open || !l.at_open; });
  if (newest == pending_.rend() || newest->stamp <= into.newest_stamp) return;
  into.newest_stamp = newest->stamp;
  into.newest_at_open = newest->at_open;
  into.newest_begun = ring_.started(newest->number, launch_no_.load());
  into.newest_training = newest->training;
  into.newest_seq = newest->gate_seq;
  // Until the bubble's close, unless it has ended or this runner's stop is ahead of
  // whatever is enqueued next (it leaves at its next claim then).
  into.newest_holds = !ring_.published(newest->number) &&
                      !stop_enqueued_.load(std::memory_order_acquire);
}

// Both return without waiting for the GPU: the executor calls them under its lock, and
// submit() and cancel() on a training thread. A launch that waits for the gate to open
// is woken by the bell and sees stop_requested_; a stop also ends launches at opens:
// one in progress (it holds launch_mu_) is enqueued by the time stop() returns, and none
// after, so in_flight() then counts every launch the stop leaves to drain.
void CudaRunner::stop() {
  // Rung however it ends: stop_requested_ is set before the stop word's CUDA calls, and a
  // waiter must see it now even where one of those throws.
  struct RingAtEnd {
    Doorbell& bell;
    ~RingAtEnd() { bell.ring(); }
  } ring{*s_->gate.bell};
  set_stop(1u);
  // After a launch at an open in progress (it saw no stop): no further one is taken.
  std::shared_lock<std::shared_mutex> life(s_->life);  // before launch_mu_, as elsewhere
  const std::lock_guard<std::mutex> lk(launch_mu_);
  fence_stopped_locked();
}

// The stop word stays as it is: launches already enqueued claim on. The fence is
// recorded now, behind them and before the more urgent task is armed (the executor
// withholds first), so that settle() does not wait for that task's launches behind it.
void CudaRunner::withhold() {
  withheld_.store(true);
  std::shared_lock<std::shared_mutex> life(s_->life);  // before launch_mu_, as elsewhere
  {
    const std::lock_guard<std::mutex> lk(launch_mu_);
    fence_stopped_locked();
  }
  s_->gate.bell->ring();  // a run() waiting for the gate with nothing in flight returns
}

void CudaRunner::resume() {
  withheld_.store(false);
  set_stop(0u);
  hand_back_.store(false);  // one meant for the stopped runner's wait
  interrupt_.store(false);  // likewise (the executor resumes only before a fresh run())
  const std::lock_guard<std::mutex> lk(launch_mu_);
  stop_fenced_ = false;
}

void CudaRunner::fence_stopped_locked() {
  CudaShared& s = *s_;
  // Recorded already for this stop: it takes no launch since, and a fence recorded again
  // would land behind the next task's launches, at opens yet to come.
  if (stop_fenced_ || s.shut_down || stop_fence_ == nullptr) return;
  try {
    const RelaxedCaptureScope relaxed;  // a cancel from a thread beside a capture
    DeviceGuard guard(s.device);
    const auto turn = s.green_turn(green_);
    FR_CUDA_CHECK(cudaEventRecord(stop_fence_, stream_));
    stop_fenced_ = true;
  } catch (...) {
    (void)cudaGetLastError();
  }
}

void CudaRunner::arm() {
  CudaShared& s = *s_;
  if (s.stream_wait) return;
  bool arm = false;
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    arm = begun_ && takes_opens_locked();
  }
  if (arm) s.arm(this);
}

void CudaRunner::hand_back() {
  hand_back_.store(true);
  s_->gate.bell->ring();  // wait_for_end sleeps on it while its launch has not begun
}

bool CudaRunner::follow() {
  CudaShared& s = *s_;
  if (s.stream_wait || !s.followers) return false;
  bool follow = false;
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    follow = begun_ && takes_opens_locked();
  }
  return follow && s.follow(this);
}

void CudaRunner::interrupt() {
  interrupt_.store(true);
  s_->gate.bell->ring();
}

uint64_t CudaRunner::launches_in_flight() const {
  std::lock_guard<std::mutex> lk(launch_mu_);
  return pending_.size();
}

uint64_t CudaRunner::bubbles_in_flight() const {
  std::lock_guard<std::mutex> lk(launch_mu_);
  uint64_t bubbles = 0;
  for (const Launch& l : pending_) {
    if (ring_.published(l.number)) continue;  // ended: its bubble is over
    // The oldest not ended is in a bubble, whatever it waits for; each later one that
    // waits for an open of its own is in a later one (a chained launch, or a successor,
    // runs in its predecessor's).
    if (bubbles == 0 || l.waits_open) ++bubbles;
  }
  return bubbles;
}

// Armed for the watcher's launches too (launch_at_reached_open), with launches at opens
// off: CudaShared::launch_at_open enqueues nothing then (no `opened` event).
bool CudaRunner::takes_opens_locked() const {
  return (s_->launch_at_opens || s_->watcher_launch) && pending_.empty() &&
         !stopping() &&
         (!phase_done_ || (ahead_ && phase_ + 1 < task_->num_phases()));
}

// The executor's thread, waiting for the oldest launch's end once it has begun. The
// successor is admitted on the mirror as the executor's own launches are (and, like
// them, not under an open written without a launch).
void CudaRunner::maybe_queue_successor(bool progressed) noexcept {
  CudaShared& s = *s_;
  std::lock_guard<std::mutex> lk(launch_mu_);
  try {
    SuccessorState st;
    st.enabled = s.successors;
    st.has_slice = s.slice_ns != 0;
    st.pending = pending_.size();
    st.newest_running = !pending_.empty() &&
                        ring_.started(pending_.back().number, launch_no_.load()) &&
                        !ring_.published(pending_.back().number);
    st.progressed = progressed;
    uint32_t open_seq = 0;
    st.gate_open = s.open_unskipped(&open_seq);
    st.stopping = stopping() || abandoned_.load();
    // (A successor runs the current phase: not behind a launch of the next.)
    st.phase_done = phase_done_ || progress_seen(slot_of(phase_)) >= n_items_ ||
                    (!pending_.empty() && pending_.back().phase != phase_);
    st.follows_protocol = task_->follows_item_protocol();
    if (!queue_successor(st) || !accepting_locked()) return;
    const bool record = pending_.back().record;
    // For the open the gate was seen open under (open_unskipped: its ordinal).
    enqueue_locked(nullptr, open_seq, false, record, phase_);
    pending_.back().successor = true;
  } catch (const std::exception& e) {
    arrival_error_ = std::string("queueing a successor launch failed: ") + e.what();
  } catch (...) {
    arrival_error_ = "queueing a successor launch failed";
  }
  (void)cudaGetLastError();
}

// Launches begin in the order they were enqueued (one stream): those not begun are the
// newest, counted from the back until one has.
uint64_t CudaRunner::opens_ahead_locked() const {
  uint64_t ahead = 0;
  for (auto l = pending_.rbegin(); l != pending_.rend(); ++l) {
    if (ring_.started(l->number, launch_no_.load())) break;
    if (l->waits_open) ++ahead;
  }
  return ahead;
}

bool CudaRunner::open_for_launches_locked() const {
  return begun_ && !stopping() && task_->follows_item_protocol() &&
         !abandoned_.load() && arrival_error_.empty() && !s_->shut_down;
}

// Whether a launch of the current phase may be enqueued now. Caller holds launch_mu_.
bool CudaRunner::accepting_locked() const {
  return open_for_launches_locked() && !phase_done_ && pending_.size() < kLaunchRing;
}

void CudaRunner::throw_arrival_error_locked() {
  if (arrival_error_.empty()) return;
  std::string error;
  error.swap(arrival_error_);
  throw RuntimeFailure(error);
}

// Enqueues one launch of `phase` (the current one, or with phases ahead the next,
// `guarded` by the current's completion) on stream_; caller holds launch_mu_. With
// `opened` (an event recorded at an open on a training stream), after it: it waits for
// that open. stream_wait: held by a memory wait on the gate's mirror first.
void CudaRunner::enqueue_locked(cudaEvent_t opened, uint32_t seq, bool at_open, bool record,
                                uint64_t phase, bool guarded) {
  CudaShared& s = *s_;
  const uint64_t number = launch_no_ + 1;
  ring_.clear(number);
  auto turn = s.green_turn(green_);
  const KeepCurrentContext keep(green_ && at_open);
  {
    // The latest stop-word write on the control stream lands before anything of this
    // launch reads the word (and before stream_wait's gate wait, on `side`).
    std::lock_guard<std::mutex> slk(stop_mu_);
    if (launch_waits_) {
      FR_CUDA_CHECK(cudaStreamWaitEvent(s.stream_wait ? s.side : stream_, stop_written_, 0));
      launch_waits_ = false;
    }
  }
  // Before the wait for the open: it needs only what is enqueued before it to have ended.
  claim_slot_locked(phase);
  if (opened != nullptr) FR_CUDA_CHECK(cudaStreamWaitEvent(stream_, opened, 0));
  Launch l;
  l.number = number;
  l.stamp = s.launch_stamps.fetch_add(1) + 1;
  l.phase = phase;
  l.slot = slot_of(phase);
  l.guarded = guarded;
  l.waits_open = opened != nullptr;
  l.n_items = phase == phase_ ? n_items_ : task_->num_items(phase);
  l.gate_seq = seq;
  l.at_open = at_open;
  l.record = record;
  try {
    // hold_until_open's wait may be on `side` already when a later step fails.
    if (s.stream_wait) hold_until_open();
    if (after_) {
      after_->enqueue_wait(stream_);
      after_.reset();
    }
    fr_item_ctx ctx{};
    ctx.gate = s.gate.dev;
    ctx.state = state_[l.slot];
    ctx.progress = progress_dev_[l.slot];
    ctx.n_items = l.n_items;
    ctx.phase = phase;
    if (guarded) {
      const fr_phase_state* before = state_[slot_of(phase - 1)];
      ctx.after_done = &before->done;
      ctx.after_items = task_->num_items(phase - 1);
    }
    ctx.end = ring_.end_dev(number);
    ctx.launch = number;
    ctx.run = ring_.run_dev(number);
    ctx.latest_close = s.latest_close_dev();
    ctx.closes_executed = s.close_slots();
    // At an open: on the thread that wrote it, before it can enqueue the bubble's close.
    // The executor's and the watcher's launches for the bubble of open `seq`: what was
    // noted as that open was written (none under stream_wait, whose launches wait on the
    // GPU for whichever open comes next).
    ctx.next_close = at_open         ? s.closes.next()
                     : s.stream_wait ? 0u
                                     : s.open_ordinals.next_close(seq);
    ctx.slice_ns = launch_slice_ns(s.slice_ns, at_open, ctx.next_close, s.stream_wait);
    l.slice_ns = ctx.slice_ns;
    // The harvester's bound where it has a slice; under time_slice=None the slice above
    // is the hang guard's, bounded by the default (launch_slice_rule.hpp).
    ctx.max_slices = s.slice_ns == 0 ? 0u : s.max_slices;
    // An error a previous task's failure left as this thread's last error (a handled
    // one: a sticky error fails every call anyway) must not be taken for this launch's.
    (void)cudaGetLastError();
    task_->launch_cuda(s.launch(ctx, stream_, green_));
    FR_CUDA_CHECK(cudaGetLastError());
  } catch (...) {
    (void)cudaGetLastError();
    if (s.stream_wait) {
      // drain_side takes the green context's turn itself: a second lock of the same
      // mutex on this thread would never return.
      if (turn.owns_lock()) turn.unlock();
      drain_side();
    }
    throw;
  }
  launch_no_ = number;
  newest_stamp_ = l.stamp;
  pending_.push_back(l);
}

// stream_wait: nothing of the launch may start while the gate is closed. Stop is not
// part of the memop wait's condition: close() releases a waiting launch with unblock().
// The wait stays on the primary context's side stream whatever stream the task runs
// on; an event carries it over to a green-context stream.
void CudaRunner::hold_until_open() {
  CudaShared& s = *s_;
  if (s.memops) {
    // On the gate's host mirror, not the device word: whatever is queued behind this
    // wait (on its hardware queue, which other streams may share) is released by a
    // host store (write_gate_now, unblock), never by an operation on some stream that
    // could itself be queued behind the wait.
    const CUresult res = cuda_driver::api().stream_wait_value32(
        s.side, cuda_driver::device_ptr(s.gate.mirror_dev), FREERIDE_GATE_OPEN,
        CU_STREAM_WAIT_VALUE_EQ);
    if (res != CUDA_SUCCESS) {
      cuda_driver::throw_driver_error(res, "cuStreamWaitValue32", __FILE__, __LINE__);
    }
  } else {
    kernels::launch_gate_wait(s.gate.mirror_dev, stop_word(), s.side);
  }
  if (stream_ != s.side) {
    FR_CUDA_CHECK(cudaEventRecord(bridge_, s.side));
    FR_CUDA_CHECK(cudaStreamWaitEvent(stream_, bridge_, 0));
  }
}

// The stream_wait admission: each launch is enqueued at once, held on the GPU by the
// wait on the mirror, and its end taken; no launch at opens.
LaunchMarks CudaRunner::run_held(bool record) {
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    throw_arrival_error_locked();
    if (pending_.empty()) {
      enqueue_locked(nullptr, s_->mirror_seq(), false, record, phase_);
    }
  }
  return finish_oldest();
}

// The stop word is written on the control stream without waiting: writes made there
// land in the order they were made, after the constructor's clear, and the next launch
// waits for the latest one (stop_written_). A value already written is not written
// again, so the resume() before every relaunch costs nothing.
void CudaRunner::set_stop(uint32_t value) {
  CudaShared& s = *s_;
  std::shared_lock<std::shared_mutex> lk(s.life);  // before stop_mu_, as in run()
  std::lock_guard<std::mutex> slk(stop_mu_);
  stop_requested_.store(value != 0u);
  if (s.shut_down || device_stop_ == value) return;  // shut down: nothing runs any more
  DeviceGuard guard(s.device);
  // 0 and 1 are the gate constants' values, so the copy fallback needs no kernel.
  static_assert(FREERIDE_GATE_CLOSED == 0u && FREERIDE_GATE_OPEN == 1u);
  // With phases ahead, launches of two phases may be queued: each set of counters has
  // its own stop word, and both are written (in order, on the control stream).
  for (uint64_t k = 0; k < (ahead_ ? kPhaseSlots : 1); ++k) {
    s.enqueue_write(stop_word(k), value, s.control,
                    s.memops ? cuda_driver::GateWrite::kMemop : cuda_driver::GateWrite::kCopy);
  }
  FR_CUDA_CHECK(cudaEventRecord(stop_written_, s.control));
  stop_landed_seen_ = {};
  device_stop_ = value;
  stop_enqueued_.store(value != 0u, std::memory_order_release);
  launch_waits_ = true;
}

// Addresses inside the device-memory state, computed without dereferencing it.
unsigned int* CudaRunner::stop_word(uint64_t slot) const {
  return reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(state_[slot]) +
                                         offsetof(fr_phase_state, stop));
}
const void* CudaRunner::done_word(uint64_t slot) const {
  return reinterpret_cast<const char*>(state_[slot]) + offsetof(fr_phase_state, done);
}

}  // namespace freeride::cuda
