// CudaRunner's construction, destruction and phase control (begin_phase, run and what the
// executor asks of it), and the factories runner.hpp declares. Enqueueing launches is in
// runner_launch.cpp, waiting for their ends in runner_end.cpp.
#include "cuda/runner.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>

#include "capture_mode.hpp"
#include "check.hpp"
#include "cuda/admission.hpp"
#include "cuda/cuda_runner.hpp"
#include "cuda/dependency.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/stream_idle.hpp"
#include "freeride/item_ctx.h"

namespace freeride::cuda {

CudaRunner::CudaRunner(std::shared_ptr<CudaShared> shared, std::shared_ptr<Task> task,
                       std::unique_ptr<StreamDependency> after)
    : s_(std::move(shared)), task_(std::move(task)) {
  after_.reset(static_cast<CudaDependency*>(after.release()));
  CudaShared& s = *s_;
  green_ = s.in_green(*task_);
  ahead_ = s.phases_ahead && task_->follows_item_protocol();
  stream_ = s.stream_for(*task_);
  nvtx_name_ = "freeride: side launch (" + task_->name() + ")";
  FR_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  try {
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&stop_written_, cudaEventDisableTiming));
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&stop_fence_, cudaEventDisableTiming));
    if (s.stream_wait && stream_ != s.side) {
      FR_CUDA_CHECK(cudaEventCreateWithFlags(&bridge_, cudaEventDisableTiming));
    }
  } catch (...) {
    destroy_events();
    throw;
  }
  try {
    {
      std::lock_guard<std::mutex> lk(s.pool_mu);
      state_slot_ = s.states.acquire();
      try {
        word_slot_ = s.words.acquire();
      } catch (...) {
        s.states.release(state_slot_);
        throw;
      }
      ++s.runners;
    }
    for (uint64_t k = 0; k < kPhaseSlots; ++k) {
      state_[k] = reinterpret_cast<fr_phase_state*>(state_slot_.dev + k * kPhaseStateStride);
      const size_t progress = k == 0 ? 0 : kSecondProgressOffset;
      progress_dev_[k] = reinterpret_cast<unsigned long long*>(word_slot_.dev + progress);
      progress_host_[k] = reinterpret_cast<unsigned long long*>(word_slot_.host + progress);
      std::atomic_ref<unsigned long long>(*progress_host_[k]).store(0);
    }
    ring_.place(state_slot_, word_slot_);
    readback_host_ = reinterpret_cast<unsigned long long*>(word_slot_.host + kReadbackOffset);
    try {
      // A reused slot may hold a previous runner's stop flag and launch counters (a
      // launch that failed leaves its own behind). Cleared on the control stream, where
      // every later stop()/resume() write follows it in order; the first launch waits
      // for it (stop_written_). A copy, not a memset: it needs no SM. Nobody waits here:
      // the executor admits under its lock.
      FR_CUDA_CHECK(cudaMemcpyAsync(state_[0], s.zeros.host, kStateStride, cudaMemcpyHostToDevice,
                                    s.control));
      FR_CUDA_CHECK(cudaEventRecord(stop_written_, s.control));
      launch_waits_ = true;
    } catch (...) {
      // The copy may be enqueued: the slot goes back only once it has landed.
      (void)cudaStreamSynchronize(s.control);
      give_back_slots();
      throw;
    }
  } catch (...) {
    destroy_events();
    throw;
  }
  s.enlist(this);  // ~CudaRunner's disarm() takes it off
}

CudaRunner::~CudaRunner() {
  CudaShared& s = *s_;
  // The closing thread may run beside a capture in global mode on another thread.
  const RelaxedCaptureScope relaxed;
  s.disarm(this);  // no launch_at_open is in progress once this returns
  bool idle = true;
  {
    // Its streams destroyed (a shutdown that found them drained, or reclaim_abandoned
    // once the GPU had passed them): nothing of it is left to run, and a destroyed
    // stream's handle may not be used (it may name a stream made since).
    std::shared_lock<std::shared_mutex> life(s.life);
    std::lock_guard<std::mutex> lk(launch_mu_);
    if (!pending_.empty() && !s.streams_destroyed) idle = quietly_idle();
  }
  try {
    DeviceGuard guard(s.device);
    destroy_events();
  } catch (...) {
  }
  // A launch still enqueued (abandoned at close, or left by an error that broke nothing
  // else) may yet run and write the state and the end records: they are leaked, never
  // handed to another runner.
  if (idle) give_back_slots();
}

void CudaRunner::begin_phase(uint64_t phase, uint64_t n_items) {
  CudaShared& s = *s_;
  std::shared_lock<std::shared_mutex> life(s.life);
  FR_CHECK(!s.shut_down, "begin_phase() after the CUDA backend was shut down");
  DeviceGuard guard(s.device);
  std::lock_guard<std::mutex> lk(launch_mu_);
  if (ahead_) {
    // Launches of the phase before may be in flight: they claim from the other set of
    // counters. This phase's set is cleared before its first launch (claim_slot_locked),
    // which a launch chained at an open may have been already, and may have ended.
    FR_CHECK(!begun_ || phase == phase_ + 1,
             "begin_phase(" << phase << ") after phase " << phase_ << ": phases ahead go in order");
    phase_ = phase;
    n_items_ = n_items;
    const uint64_t k = slot_of(phase);
    // (An empty phase is done as it begins: nothing may launch for it meanwhile.)
    phase_done_ = n_items == 0 || (slot_phase_[k] == phase && ended_done_[k] >= n_items);
    begun_ = true;
    return;
  }
  // The previous phase's launches would claim this phase's items with that phase's
  // arguments: the executor begins a phase only once none is in flight. Checked before
  // the progress is zeroed, so that a refused call leaves done() where it was.
  FR_CHECK(pending_.empty(), "begin_phase() with launches of the task in flight");
  {
    // Idle: everything enqueued before (the previous phase's launches) has ended.
    const auto turn = s_->green_turn(green_);
    clear_set_locked(0, phase);
  }
  phase_ = phase;
  n_items_ = n_items;
  phase_done_ = n_items == 0;
  begun_ = true;
}

LaunchMarks CudaRunner::run(bool record) {
  CudaShared& s = *s_;
  std::shared_lock<std::shared_mutex> life(s.life);
  FR_CHECK(!s.shut_down, "run() after the CUDA backend was shut down");
  FR_CHECK(begun_, "run() before begin_phase()");
  throw_if_abandoned();
  DeviceGuard guard(s.device);
  if (s.stream_wait) return run_held(record);
  bool arm = false;
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    throw_arrival_error_locked();
    arm = takes_opens_locked();
  }
  if (arm) s.arm(this);
  // The open the wait saw: the launch below is for its bubble.
  std::optional<uint32_t> open_seq;
  if (!in_flight()) {
    // Until a launch at an open is enqueued, the gate's mirror reads open (an open that
    // carried no launch, or the rest of a bubble whose launch ended with its slice), or
    // a stop. Not under an open the training thread skipped (predicted too short for a
    // launch: SkippedOpens): a launch this late would land in the compute after it.
    if (!s.ring()) tighten_timer_slack();  // this thread only ever waits for the gate
    // A launch at an open that failed meanwhile (launch_at_open rang) ends the wait too:
    // its error is this run()'s, not one for the next open to bring, or a close to drop.
    auto arrived = [&] {
      std::lock_guard<std::mutex> lk(launch_mu_);
      return !pending_.empty() || !arrival_error_.empty();
    };
    // interrupt() ends it too (a cancelled follower's ends are taken meanwhile).
    const bool go = wait_for_gate(
        s, std::chrono::steady_clock::time_point::max(),
        [&] { return abandoned_.load() || interrupt_.load() || (stopping() && !in_flight()); },
        [&] {
          if (arrived()) return true;
          uint32_t seq = 0;
          if (!s.open_unskipped(&seq)) return false;
          open_seq = seq;
          return true;
        });
    throw_if_abandoned();
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      throw_arrival_error_locked();
    }
    if (!go && interrupt_.exchange(false)) {
      LaunchMarks untaken;
      untaken.handed_back = true;
      return untaken;
    }
    if (!go) return LaunchMarks{};  // stopped (or abandoned) while the gate was closed
  }
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    throw_arrival_error_locked();
    if (pending_.empty()) {
      if (stopping() || abandoned_.load()) return LaunchMarks{};
      // The number the wait saw the mirror open under, not read again: a close landing
      // since would give the close's, for which no ordinal is noted (next_close 0), and
      // a launch beginning after that close and the next open (queued behind training's
      // work under one hardware queue) would then serve the next bubble, with that
      // bubble's own launch waiting behind it on the stream and training behind that.
      // Only a wait that ended on a launch already made leaves none (never here).
      const uint32_t seq = open_seq ? *open_seq : s.mirror_seq();
      // Only here: a wait that ended on a launch already made (at the open, or by the
      // watcher) was no sight of the gate that this thread acted on.
      s.stamps->woke(seq);
      enqueue_locked(nullptr, seq, false, record, phase_);
      s.stamps->launched(seq);
    }
  }
  return finish_oldest();
}

// While a launch runs: the mirror, a multiple of freeride::kProgressEvery (or the
// phase's total) that lags the device's count. Exact after every launch (run() raised
// it to the ended launch's count), which is when the executor advances a phase or ends
// a task.
// With phases ahead, the current phase's set of counters, once cleared for it (before
// that, what it shows is the phase two back's).
uint64_t CudaRunner::done() const {
  uint64_t k = 0;
  if (ahead_) {
    std::lock_guard<std::mutex> lk(launch_mu_);
    k = slot_of(phase_);
    if (slot_phase_[k] != phase_) return 0;
  }
  return progress_seen(k);
}

// The oldest launch not seen to end has begun (its first block wrote its start).
bool CudaRunner::executing() const {
  std::lock_guard<std::mutex> lk(launch_mu_);
  if (pending_.empty()) return false;
  const uint64_t number = pending_.front().number;
  return ring_.started(number, launch_no_.load()) && !ring_.published(number);
}

bool CudaRunner::in_flight() const {
  std::lock_guard<std::mutex> lk(launch_mu_);
  return !pending_.empty();
}

uint64_t CudaRunner::launches_taken() const {
  std::lock_guard<std::mutex> lk(launch_mu_);
  return taken_;
}

// Launches end in order on the stream: those from the oldest on whose end has come.
uint64_t CudaRunner::launches_ending() const {
  std::lock_guard<std::mutex> lk(launch_mu_);
  uint64_t n = taken_;
  for (const Launch& l : pending_) {
    if (!end_has_come_locked(l)) break;
    ++n;
  }
  return n;
}

// The exact count of ended launches of the next phase (ahead_ only; the mirror is not
// used: it may still show the phase two back until that set is cleared).
uint64_t CudaRunner::done_ahead() const {
  if (!ahead_) return 0;
  std::lock_guard<std::mutex> lk(launch_mu_);
  const uint64_t next = phase_ + 1;
  const uint64_t k = slot_of(next);
  return begun_ && slot_phase_[k] == next ? ended_done_[k] : 0;
}

// Stopped, the stop word's latest write has landed (its event on the control stream has
// completed: a launch that begins from now on reads 1 at its first claim and claims
// nothing), and the oldest launch in flight has not begun. Launches begin in order, so
// none has: every launch that ran items has ended and been taken (done() is exact). Not
// for a task whose kernels ignore the stop word (the slicing baseline).
bool CudaRunner::inert() const {
  if (!stop_requested_.load() || abandoned_.load() || !task_->follows_item_protocol()) {
    return false;
  }
  try {
    return stop_landed_and_none_begun();
  } catch (...) {
    (void)cudaGetLastError();
    return false;  // a broken context: the executor's next run() reports it
  }
}

// Any thread (a training thread's cancel): the event query in relaxed capture mode, so
// that it cannot invalidate a capture another thread runs in global mode.
bool CudaRunner::stop_landed_and_none_begun() const {
  CudaShared& s = *s_;
  const RelaxedCaptureScope relaxed;
  std::shared_lock<std::shared_mutex> life(s.life);
  if (s.shut_down) return false;
  {
    DeviceGuard guard(s.device);
    std::lock_guard<std::mutex> slk(stop_mu_);
    if (device_stop_ != 1u) return false;
    const cudaError_t landed = cudaEventQuery(stop_written_);
    if (landed != cudaSuccess) {
      if (landed != cudaErrorNotReady) (void)cudaGetLastError();
      return false;
    }
    // A block that read the stop word before the write landed belongs to a launch whose
    // first block wrote its start to host memory just before (a posted write, with no
    // fence before the read): seen microseconds later. So the look that finds none begun
    // must come kInertSettle after one that saw the stop landed.
    const auto now = std::chrono::steady_clock::now();
    if (stop_landed_seen_ == std::chrono::steady_clock::time_point{}) stop_landed_seen_ = now;
    if (now - stop_landed_seen_ < kInertSettle) return false;
  }
  std::lock_guard<std::mutex> lk(launch_mu_);
  return !pending_.empty() && !ring_.started(pending_.front().number, launch_no_.load());
}

void CudaRunner::abandon() {
  abandoned_.store(true);
  s_->gate.bell->ring();
}

// Whether launch `l` (enqueued, not taken) has ended or ends without a further gate
// open: its end record is published; or the gate's mirror reads closed (blocks that
// began leave at their next item, one not begun finds the gate closed, one enqueued at
// an open ends by the close enqueued after it), a stop is requested, or the time slice
// it carries ends it (the harvester's, or under time_slice=None the default one a launch
// for an open without an ordinal keeps: launch_slice_rule.hpp). Not a launch held on the
// GPU by stream_wait's wait for an open that has not begun: it begins only once the gate
// opens. Caller holds launch_mu_.
bool CudaRunner::end_has_come_locked(const Launch& l) const {
  if (ring_.published(l.number)) return true;
  const bool open = s_->mirror() == FREERIDE_GATE_OPEN;
  if (s_->stream_wait && !open && !ring_.started(l.number, launch_no_.load())) return false;
  return !open || stop_requested_.load() || l.slice_ns > 0;
}

// Only with a launch in flight: a runner abandoned with none has nothing on the GPU.
void CudaRunner::throw_if_abandoned() const {
  if (abandoned_.load() && in_flight()) {
    FR_THROW(Abandoned, task_->name() << ": abandoned at close while a launch was "
                                         "enqueued or running");
  }
}

// In stream order behind every launch enqueued so far, so behind each launch of the phase
// two back that used the set (complete before the phase between began: what those find
// left is nothing, and they are ended before this clear runs).
void CudaRunner::claim_slot_locked(uint64_t phase) {
  const uint64_t k = slot_of(phase);
  if (ahead_ && slot_phase_[k] != phase) clear_set_locked(k, phase);
}

// Set k's [next, done] zeroed on the stream (its stop word and `held` stay), and the
// host's view of it starting again for `phase` (finish_oldest counts a launch only for
// its set's phase).
void CudaRunner::clear_set_locked(uint64_t k, uint64_t phase) {
  FR_CUDA_CHECK(cudaMemsetAsync(state_[k], 0, offsetof(fr_phase_state, stop), stream_));
  slot_phase_[k] = phase;
  ended_done_[k] = 0;
  // The mirror is zeroed now, at the enqueue; a launch of the set's phase before, still
  // in flight, may store to it after that (its blocks' stores land in no order). Such a
  // count could read as this phase complete (review of 2026-11-27): its mirror is then
  // left out until the set is cleared again.
  mirror_live_[k].store(std::none_of(pending_.begin(), pending_.end(),
                                     [&](const Launch& l) { return l.slot == k; }),
                        std::memory_order_release);
  std::lock_guard<std::mutex> plk(progress_mu_);
  std::atomic_ref<unsigned long long>(*progress_host_[k]).store(0);
  max_seen_[k] = 0;
}

// Whether the stream has nothing left to run, without throwing (destructor).
bool CudaRunner::quietly_idle() noexcept {
  try {
    DeviceGuard guard(s_->device);
    const auto turn = s_->green_turn(green_);
    return stream_idle(stream_);
  } catch (...) {
    (void)cudaGetLastError();
    return false;
  }
}

void CudaRunner::destroy_events() noexcept {
  for (cudaEvent_t* ev : {&event_, &stop_written_, &stop_fence_, &bridge_}) {
    if (*ev != nullptr) (void)cudaEventDestroy(*ev);
    *ev = nullptr;
  }
  (void)cudaGetLastError();
}

void CudaRunner::give_back_slots() noexcept {
  CudaShared& s = *s_;
  std::lock_guard<std::mutex> lk(s.pool_mu);
  if (state_slot_.dev == nullptr) return;
  s.states.release(state_slot_);
  s.words.release(word_slot_);
  state_slot_ = SlotPool::Slot{};
  word_slot_ = SlotPool::Slot{};
  --s.runners;
  if (s.orphaned && s.runners == 0) {
    try {
      DeviceGuard guard(s.device);
      s.free_pools();
    } catch (...) {
    }
  }
}

std::unique_ptr<StreamDependency> make_dependency(const std::vector<uintptr_t>& streams) {
  return std::make_unique<CudaDependency>(streams);
}

bool is_cuda_dependency(const StreamDependency* dependency) {
  return dynamic_cast<const CudaDependency*>(dependency) != nullptr;
}

std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<CudaShared> shared, std::shared_ptr<Task> task,
                                         std::unique_ptr<StreamDependency> after) {
  return std::make_unique<CudaRunner>(std::move(shared), std::move(task), std::move(after));
}

}  // namespace freeride::cuda
