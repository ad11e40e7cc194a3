#include "cuda/runner.hpp"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>

#include "check.hpp"
#include "cuda/admission.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "freeride/item_ctx.h"
#include "launchers.hpp"

namespace freeride::cuda {
namespace {

// An NVTX range on the calling thread for as long as it lives: each side launch, from its
// enqueueing to the host's seeing its end, on the executor thread, so that Nsight Systems
// shows side work beside the bubbles (python/freeride/profiling.py pushes those). NVTX is
// header-only and costs a pointer test per call unless a tool (nsys) injects itself.
class NvtxRange {
 public:
  explicit NvtxRange(const char* message) { nvtxRangePushA(message); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Waiting for a launch's end (CudaRunner::wait_for_end): spin this long, then sleep
// kEndPoll between looks at the end record where the end is near (the gate's mirror
// closed, a stop, the phase's items all claimed, the time slice about to end: a relaunch
// waits for that look, and 50 us is 2.5% of the default 2 ms slice), kEndPollFar where
// nothing says so (a launch that runs on in an open gate: fewer wake-ups beside
// training), and ask the driver whether the stream is idle (a kernel that failed, or one
// that left without its end record) every kStreamQueryEvery.
constexpr std::chrono::microseconds kEndSpin{20};
constexpr std::chrono::microseconds kEndPoll{50};
constexpr std::chrono::microseconds kEndPollFar{250};
constexpr std::chrono::microseconds kStreamQueryEvery{1000};

// Whether everything enqueued on `stream` has completed: a question to the driver, never
// an operation on the stream. Throws the error of a failed kernel (cleared from the
// thread's last error, which cudaStreamQuery also sets for "not ready").
bool stream_idle(cudaStream_t stream) {
  const cudaError_t err = cudaStreamQuery(stream);
  if (err == cudaSuccess) return true;
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
  if (err == cudaErrorNotReady) return false;
  throw_cuda(err, "cudaStreamQuery (side stream)", __FILE__, __LINE__);
}

// Until `stream` is idle, asking (stream_idle). After a launch's end record, the kernel
// is retiring: microseconds.
void settle_stream(cudaStream_t stream) {
  const auto started = std::chrono::steady_clock::now();
  while (!stream_idle(stream)) {
    if (std::chrono::steady_clock::now() - started < kEndSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kEndPoll);
    }
  }
}

// Events recorded on the submitter's streams at submit; the side stream waits on them
// before the task's first launch.
class CudaDependency final : public StreamDependency {
 public:
  explicit CudaDependency(const std::vector<uintptr_t>& streams) {
    FR_CUDA_CHECK(cudaGetDevice(&device_));
    try {
      for (uintptr_t stream : streams) {
        cudaEvent_t ev = nullptr;
        FR_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        events_.push_back(ev);
        const cudaError_t err = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
        if (err != cudaSuccess) {
          (void)cudaGetLastError();
          throw_cuda(err, "cudaEventRecord (the stream the task was submitted after)", __FILE__,
                     __LINE__);
        }
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaDependency() override { destroy(); }
  CudaDependency(const CudaDependency&) = delete;
  CudaDependency& operator=(const CudaDependency&) = delete;

  // cudaEventQuery does not block (it reads the event's state), so the executor may ask
  // under its lock. On the event's device: on a thread with no current context the
  // runtime would otherwise create device 0's.
  bool ready() const override {
    try {
      DeviceGuard guard(device_);
      for (cudaEvent_t ev : events_) {
        const cudaError_t err = cudaEventQuery(ev);
        if (err == cudaErrorNotReady) {
          // Not an error of this thread's work: keep it out of a later cudaGetLastError().
          if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
          return false;
        }
        // Any other error: "ready", so the first launch runs into it and reports it.
        if (err != cudaSuccess) return true;
      }
    } catch (...) {
      return true;  // the device could not be made current: the launch reports why
    }
    return true;
  }

  // The side stream's next work waits for every captured stream. Destroying the events
  // afterwards is fine: a wait holds on to what it waits for.
  void enqueue_wait(cudaStream_t side) const {
    for (cudaEvent_t ev : events_) FR_CUDA_CHECK(cudaStreamWaitEvent(side, ev, 0));
  }

 private:
  void destroy() noexcept {
    for (cudaEvent_t ev : events_) (void)cudaEventDestroy(ev);
    events_.clear();
    (void)cudaGetLastError();
  }

  int device_ = 0;
  std::vector<cudaEvent_t> events_;
};

// ---------------------------------------------------------------------------------------

class CudaRunner final : public PhaseRunner {
 public:
  CudaRunner(std::shared_ptr<CudaShared> shared, std::shared_ptr<Task> task,
             std::unique_ptr<StreamDependency> after)
      : s_(std::move(shared)), task_(std::move(task)) {
    after_.reset(static_cast<CudaDependency*>(after.release()));
    CudaShared& s = *s_;
    green_ = s.in_green(*task_);
    stream_ = s.stream_for(*task_);
    nvtx_name_ = "freeride: side launch (" + task_->name() + ")";
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventBlockingSync | cudaEventDisableTiming));
    try {
      FR_CUDA_CHECK(cudaEventCreateWithFlags(&stop_written_, cudaEventDisableTiming));
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
      state_ = reinterpret_cast<fr_phase_state*>(state_slot_.dev);
      progress_dev_ = reinterpret_cast<unsigned long long*>(word_slot_.dev);
      progress_host_ = reinterpret_cast<unsigned long long*>(word_slot_.host);
      end_host_ = reinterpret_cast<fr_launch_end*>(word_slot_.host + kEndOffset);
      end_dev_ = reinterpret_cast<fr_launch_end*>(word_slot_.dev + kEndOffset);
      readback_host_ = reinterpret_cast<unsigned long long*>(word_slot_.host + kReadbackOffset);
      try {
        // A reused slot may hold a previous runner's stop flag. Cleared on the control
        // stream, where every later stop()/resume() write follows it in order; the first
        // launch waits for it (stop_written_). Nobody waits here: the executor admits
        // under its lock.
        FR_CUDA_CHECK(cudaMemcpyAsync(state_, s.zeros.host, sizeof(fr_phase_state),
                                      cudaMemcpyHostToDevice, s.control));
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
  }

  ~CudaRunner() override {
    try {
      DeviceGuard guard(s_->device);
      destroy_events();
    } catch (...) {
    }
    give_back_slots();
  }

  void begin_phase(uint64_t phase, uint64_t n_items) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "begin_phase() after the CUDA backend was shut down");
    FR_CHECK(!executing_.load(), "begin_phase() while a launch of the task is in flight");
    DeviceGuard guard(s.device);
    // Only [next, done]: `stop` belongs to stop()/resume(). On the side stream, so it is
    // ordered after this task's previous launch and before its next one.
    {
      const auto turn = s.green_turn(green_);
      FR_CUDA_CHECK(cudaMemsetAsync(state_, 0, offsetof(fr_phase_state, stop), stream_));
    }
    {
      std::lock_guard<std::mutex> plk(progress_mu_);
      std::atomic_ref<unsigned long long>(*progress_host_).store(0);
      max_seen_ = 0;
    }
    phase_ = phase;
    n_items_ = n_items;
    begun_ = true;
  }

  LaunchMarks run(bool record) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "run() after the CUDA backend was shut down");
    FR_CHECK(begun_, "run() before begin_phase()");
    LaunchMarks marks;
    if (!s.stream_wait && !wait_for_open()) return marks;  // stopped while the gate was closed
    marks.admitted = true;
    marks.gate_seq = s.mirror_seq();  // after the open mirror: the open's number, or newer
    DeviceGuard guard(s.device);

    struct ClearOnExit {
      std::atomic<bool>& flag;
      ~ClearOnExit() { flag.store(false); }
    };
    executing_.store(true);
    ClearOnExit clear{executing_};
    auto turn = s.green_turn(green_);  // until the launch is enqueued

    {
      // The latest stop-word write on the control stream lands before anything of this
      // launch reads the word: the kernel, and before it stream_wait's gate-wait kernel
      // (on the side stream, which stream_ follows through the bridge below).
      std::lock_guard<std::mutex> slk(stop_mu_);
      if (launch_waits_) {
        FR_CUDA_CHECK(cudaStreamWaitEvent(s.stream_wait ? s.side : stream_, stop_written_, 0));
        launch_waits_ = false;
      }
    }

    // stream_wait: nothing of this launch may start while the gate is closed. Stop is not
    // part of the memop wait's condition: close() releases a waiting launch with unblock().
    // The wait stays on the primary context's side stream whatever stream the task runs
    // on; an event carries it over to a green-context stream.
    if (!s.stream_wait) {
      // Admitted by wait_for_open() above.
    } else if (s.memops) {
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

    try {
      if (s.stream_wait && stream_ != s.side) {
        FR_CUDA_CHECK(cudaEventRecord(bridge_, s.side));
        FR_CUDA_CHECK(cudaStreamWaitEvent(stream_, bridge_, 0));
      }
      if (after_) {
        after_->enqueue_wait(stream_);
        after_.reset();
      }
      // Before the kernel, on a stream whose previous work has completed (see below):
      // it takes effect at once.
      if (record) marks.start = s.mark(stream_);
      fr_item_ctx ctx{};
      ctx.gate = s.gate.dev;
      ctx.state = state_;
      ctx.progress = progress_dev_;
      ctx.n_items = n_items_;
      ctx.phase = phase_;
      ctx.slice_ns = s.slice_ns;
      ctx.end = end_dev_;
      ctx.launch = ++launch_no_;
      // An error a previous task's failure left as this thread's last error (a handled
      // one: a sticky error fails every call anyway) must not be taken for this launch's.
      (void)cudaGetLastError();
      task_->launch_cuda(s.launch(ctx, stream_, green_));
      FR_CUDA_CHECK(cudaGetLastError());
    } catch (...) {
      if (turn.owns_lock()) turn.unlock();
      drain_side();
      s.release_mark(marks.start);
      throw;
    }
    if (turn.owns_lock()) turn.unlock();
    const NvtxRange range(nvtx_name_.c_str());
    // Nothing goes on the stream behind the kernel (not the count's read-back, not an
    // event: either would hold everything queued after it on its hardware queue until
    // the kernel ends). The kernel's last block reports the end; the host polls for it.
    LaunchEnd end;
    try {
      end = wait_for_end(launch_no_);
    } catch (...) {
      s.release_mark(marks.start);
      throw;
    }
    if (marks.start != 0) {
      if (end.duration_ns >= 0) {
        // The end is the start mark plus the kernel's own duration: the start mark is
        // taken when the stream reaches the launch, its first block may start a little
        // later (the launch's latency, or SMs still busy), so the launch is drawn that
        // much early in the record.
        marks.end = s.derive_mark(marks.start, end.duration_ns);
      } else {
        s.release_mark(marks.start);  // no end record: no times either
        marks.start = 0;
      }
    }
    raise_progress(end.done);
    check_protocol(end.done, end.held);
    return marks;
  }

  // Both return without waiting for the GPU: the executor calls them under its lock, and
  // submit() and cancel() on a training thread. A launch that waits for the gate to open
  // is woken by the bell and sees stop_requested_.
  void stop() override {
    set_stop(1u);
    s_->gate.bell->ring();
  }
  void resume() override { set_stop(0u); }

  // While a launch runs: the mirror, a multiple of freeride::kProgressEvery (or the
  // phase's total) that lags the device's count. Exact after every launch (run() raised
  // it to the read-back count), which is when the executor advances a phase or ends a task.
  uint64_t done() const override {
    std::lock_guard<std::mutex> lk(progress_mu_);
    const uint64_t mirror = std::atomic_ref<unsigned long long>(*progress_host_).load();
    max_seen_ = std::max<uint64_t>(max_seen_, mirror);
    return max_seen_;
  }

  bool executing() const override { return executing_.load(); }

 private:
  // The stop word is written on the control stream without waiting: writes made there
  // land in the order they were made, after the constructor's clear, and the next launch
  // waits for the latest one (stop_written_). A value already written is not written
  // again, so the resume() before every relaunch costs nothing.
  void set_stop(uint32_t value) {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);  // before stop_mu_, as in run()
    std::lock_guard<std::mutex> slk(stop_mu_);
    stop_requested_.store(value != 0u);
    if (s.shut_down || device_stop_ == value) return;  // shut down: nothing runs any more
    DeviceGuard guard(s.device);
    // 0 and 1 are the gate constants' values, so the copy fallback needs no kernel.
    static_assert(FREERIDE_GATE_CLOSED == 0u && FREERIDE_GATE_OPEN == 1u);
    s.enqueue_write(stop_word(), value, s.control,
                    s.memops ? cuda_driver::GateWrite::kMemop : cuda_driver::GateWrite::kCopy);
    FR_CUDA_CHECK(cudaEventRecord(stop_written_, s.control));
    device_stop_ = value;
    launch_waits_ = true;
  }

  // Until the gate's host mirror reads open (true) or stop() is requested (false); the
  // bell also rings on stop().
  bool wait_for_open() const {
    if (!s_->ring) tighten_timer_slack();  // this thread only ever waits for the gate
    const CudaShared& s = *s_;
    return wait_for_gate(s, std::chrono::steady_clock::time_point::max(),
                         [&] { return stop_requested_.load(); },
                         [&] { return s.mirror() == FREERIDE_GATE_OPEN; });
  }

  // What the host learns of a launch that ended. duration_ns < 0: no end record (the
  // counts were read back instead).
  struct LaunchEnd {
    uint64_t done = 0;
    uint32_t held = 0;
    int64_t duration_ns = -1;
  };

  // Until launch `launch` has ended: its end record's number appears (written by the
  // kernel's last block), or the stream turns out idle without it (a kernel that left
  // the item protocol: the counts are read back then, with nothing left running for the
  // copy to queue behind). Spins (yielding) kEndSpin, then sleeps kEndPoll between looks
  // at the record, and asks the driver about the stream only every kStreamQueryEvery (a
  // failed kernel shows there). Returns once the stream is idle: the next launch's
  // operations never queue behind this kernel either.
  LaunchEnd wait_for_end(uint64_t launch) {
    using clock = std::chrono::steady_clock;
    const auto started = clock::now();
    auto next_query = started + kStreamQueryEvery;
    const uint64_t slice_ns = s_->slice_ns;
    const auto slice_end = slice_ns == 0 ? clock::time_point::max()
                                         : started + std::chrono::nanoseconds(slice_ns);
    auto end_is_near = [&](clock::time_point now) {
      return s_->mirror() != FREERIDE_GATE_OPEN || stop_requested_.load() ||
             std::atomic_ref<unsigned long long>(*progress_host_).load() >= n_items_ ||
             now + kEndPollFar + kEndPoll >= slice_end;
    };
    while (true) {
      if (end_published(launch)) {
        const auto turn = s_->green_turn(green_);
        settle_stream(stream_);
        return read_end();
      }
      const auto now = clock::now();
      if (now >= next_query) {
        auto turn = s_->green_turn(green_);
        if (stream_idle(stream_)) {
          if (end_published(launch)) return read_end();
          return read_back();
        }
        if (turn.owns_lock()) turn.unlock();
        next_query = now + kStreamQueryEvery;
      }
      if (now - started < kEndSpin) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(end_is_near(now) ? kEndPoll : kEndPollFar);
      }
    }
  }

  bool end_published(uint64_t launch) const {
    return std::atomic_ref<unsigned long long>(end_host_->launch).load(std::memory_order_acquire) ==
           launch;
  }

  LaunchEnd read_end() const {
    LaunchEnd end;
    end.done = std::atomic_ref<unsigned long long>(end_host_->done).load();
    end.held = static_cast<uint32_t>(std::atomic_ref<unsigned long long>(end_host_->held).load());
    const uint64_t start = std::atomic_ref<unsigned long long>(end_host_->start_ns).load();
    const uint64_t stop = std::atomic_ref<unsigned long long>(end_host_->end_ns).load();
    end.duration_ns = start != 0 && stop >= start ? static_cast<int64_t>(stop - start) : -1;
    return end;
  }

  // The launch ended without its end record: [done, stop, held] copied from the phase
  // state, on the (idle) stream, waited for on a blocking-sync event.
  LaunchEnd read_back() {
    FR_CUDA_CHECK(cudaMemcpyAsync(readback_host_, done_word(), 16, cudaMemcpyDeviceToHost,
                                  stream_));
    FR_CUDA_CHECK(cudaEventRecord(event_, stream_));
    FR_CUDA_CHECK(cudaEventSynchronize(event_));
    LaunchEnd end;
    end.done = std::atomic_ref<unsigned long long>(readback_host_[0]).load();
    end.held = std::atomic_ref<unsigned int>(reinterpret_cast<unsigned int*>(readback_host_ + 1)[1])
                   .load();
    return end;
  }

  void destroy_events() noexcept {
    for (cudaEvent_t* ev : {&event_, &stop_written_, &bridge_}) {
      if (*ev != nullptr) (void)cudaEventDestroy(*ev);
      *ev = nullptr;
    }
    (void)cudaGetLastError();
  }

  // Every block of a launch exits either because no item is left or because the gate or
  // the stop flag held it back (and counted itself in `held`). A launch that ends with
  // the phase unfinished and nobody held back ran a kernel that never entered the item
  // loop (or left it early): relaunching it would only repeat that, forever.
  void check_protocol(uint64_t done, uint32_t held) {
    const bool held_back = held != last_held_;
    last_held_ = held;
    if (done >= n_items_ || held_back || !task_->follows_item_protocol()) return;
    FR_THROW(RuntimeFailure,
             "a launch of phase " << phase_ << " ended with " << done << " of " << n_items_
                                  << " items done although no block was held back by the gate "
                                     "or a stop: the kernel must call freeride::for_each_item"
                                     "(ctx, ...) in every block and not return before it ends, "
                                     "or it would be relaunched forever");
  }

  // Addresses inside the device-memory state, computed without dereferencing it.
  unsigned int* stop_word() const {
    return reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(state_) +
                                           offsetof(fr_phase_state, stop));
  }
  const void* done_word() const {
    return reinterpret_cast<const char*>(state_) + offsetof(fr_phase_state, done);
  }

  void raise_progress(uint64_t value) {
    std::lock_guard<std::mutex> lk(progress_mu_);
    max_seen_ = std::max(max_seen_, value);
  }

  // Best effort after a failed enqueue: run() must not return while items it enqueued
  // may still execute. Waits by asking, never by enqueueing.
  void drain_side() noexcept {
    try {
      const auto turn = s_->green_turn(green_);
      settle_stream(stream_);
      if (stream_ != s_->side) settle_stream(s_->side);  // a gate wait there
    } catch (...) {
    }
    (void)cudaGetLastError();
  }

  void give_back_slots() noexcept {
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

  std::shared_ptr<CudaShared> s_;
  std::shared_ptr<Task> task_;
  SlotPool::Slot state_slot_;
  SlotPool::Slot word_slot_;
  fr_phase_state* state_ = nullptr;               // device memory
  unsigned long long* progress_dev_ = nullptr;    // word slot [0], device view
  unsigned long long* progress_host_ = nullptr;   // word slot [0], host view
  fr_launch_end* end_host_ = nullptr;             // word slot end record, host view
  fr_launch_end* end_dev_ = nullptr;              // the same, device view
  unsigned long long* readback_host_ = nullptr;   // word slot: [done, stop, held]
  uint64_t launch_no_ = 0;                        // the last launch's number (executor thread)
  std::string nvtx_name_;                         // NvtxRange's message
  cudaEvent_t event_ = nullptr;                   // read_back()'s
  // The stream this task's launches and their bookkeeping go to: the side stream, or the
  // green context's. bridge_: stream_wait's admission on `side`, carried over to stream_.
  cudaStream_t stream_ = nullptr;
  bool green_ = false;
  cudaEvent_t bridge_ = nullptr;
  std::unique_ptr<CudaDependency> after_;  // waited for by the first launch, then dropped
  uint32_t last_held_ = 0;  // `held` after the previous launch (slots start zeroed)

  std::atomic<bool> executing_{false};
  std::atomic<bool> stop_requested_{false};  // host copy of the stop flag, for admission
  // Guards the three below: stop()/resume() on any thread, run() on the executor's.
  std::mutex stop_mu_;
  uint32_t device_stop_ = 0;         // the stop word's value as last enqueued
  cudaEvent_t stop_written_ = nullptr;  // recorded on the control stream after that write
  bool launch_waits_ = false;        // the next launch must wait for stop_written_
  mutable std::mutex progress_mu_;
  mutable uint64_t max_seen_ = 0;  // done() never goes backwards within a phase
  uint64_t phase_ = 0;
  uint64_t n_items_ = 0;
  bool begun_ = false;  // executor thread only
};


}  // namespace

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
