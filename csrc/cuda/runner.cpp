#include "cuda/runner.hpp"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "capture_mode.hpp"
#include "check.hpp"
#include "cuda/admission.hpp"
#include "cuda/dependency.hpp"
#include "cuda/launch_ring.hpp"
#include "cuda/stream_idle.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "freeride/item_ctx.h"
#include "launchers.hpp"

namespace freeride::cuda {
namespace {

// An NVTX range on the calling thread for as long as it lives: each side launch, from the
// executor's taking it up to the host's seeing its end, on the executor thread, so that
// Nsight Systems shows side work beside the bubbles (python/freeride/profiling.py pushes
// those). NVTX is header-only and costs a pointer test per call unless a tool (nsys)
// injects itself.
class NvtxRange {
 public:
  explicit NvtxRange(const char* message) { nvtxRangePushA(message); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Waiting for a launch's end (CudaRunner::wait_for_end): spin this long, then sleep
// kEndPoll between looks at the end record where the end is near (the gate's mirror
// closed, a stop, the phase's items all claimed: a relaunch waits for that look, and 50 us
// is 2.5% of the default 2 ms slice), kEndPollFar where nothing says so (a launch that
// runs on in an open gate, or one queued ahead that has not begun: fewer wake-ups beside
// training; an open rings the bell and ends such a sleep), and ask the driver whether the
// stream is idle (a kernel that failed, or one that left without its end record) every
// kStreamQueryEvery.
constexpr std::chrono::microseconds kEndSpin{20};
constexpr std::chrono::microseconds kEndPoll{50};
constexpr std::chrono::microseconds kEndPollFar{250};
constexpr std::chrono::microseconds kStreamQueryEvery{1000};

// One task's phases on the side (or green-context) stream.
//
// Launches come from two places. A training thread's stream-ordered open enqueues one
// (launch_at_open: the runner is armed while the executor runs it), ordered after the
// open by an event, at the open's point of host order; and the executor enqueues one
// itself when it sees the gate open with none enqueued (a bubble whose open carried none,
// a relaunch after a launch's time slice). Launches queue back to back on the one stream,
// each with its own counters and end record (rings of kLaunchRing, by launch number), and
// the executor takes their ends in order, one per run(). Nothing else is enqueued on the
// stream while any is enqueued and not seen to end: everything the executor enqueues
// (its own launch, a phase's reset, a read-back) goes to an idle stream, so it never
// waits behind a launch whose bubble has not come.
//
// A phase's launches at opens may be queued ahead of the GPU when the phase ends: they
// claim no item (every item of their phase is claimed) and are taken like any other; the
// executor begins the next phase, whose counters are reset on the stream, only once the
// last of them ended (it never calls begin_phase() with launches in flight).
class CudaRunner final : public PhaseRunner, public OpenLauncher {
 public:
  CudaRunner(std::shared_ptr<CudaShared> shared, std::shared_ptr<Task> task,
             std::unique_ptr<StreamDependency> after)
      : s_(std::move(shared)), task_(std::move(task)) {
    after_.reset(static_cast<CudaDependency*>(after.release()));
    CudaShared& s = *s_;
    green_ = s.in_green(*task_);
    stream_ = s.stream_for(*task_);
    nvtx_name_ = "freeride: side launch (" + task_->name() + ")";
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
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
      ring_.place(state_slot_, word_slot_);
      progress_dev_ = reinterpret_cast<unsigned long long*>(word_slot_.dev);
      progress_host_ = reinterpret_cast<unsigned long long*>(word_slot_.host);
      readback_host_ = reinterpret_cast<unsigned long long*>(word_slot_.host + kReadbackOffset);
      try {
        // A reused slot may hold a previous runner's stop flag and launch counters (a
        // launch that failed leaves its own behind). Cleared on the control stream, where
        // every later stop()/resume() write follows it in order; the first launch waits
        // for it (stop_written_). A copy, not a memset: it needs no SM. Nobody waits here:
        // the executor admits under its lock.
        FR_CUDA_CHECK(cudaMemcpyAsync(state_, s.zeros.host, kStateStride, cudaMemcpyHostToDevice,
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
  }

  ~CudaRunner() override {
    CudaShared& s = *s_;
    // The closing thread may run beside a capture in global mode on another thread.
    const RelaxedCaptureScope relaxed;
    s.disarm(this);  // no launch_at_open is in progress once this returns
    bool idle = true;
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      if (!pending_.empty()) idle = quietly_idle();
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

  void begin_phase(uint64_t phase, uint64_t n_items) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> life(s.life);
    FR_CHECK(!s.shut_down, "begin_phase() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    std::lock_guard<std::mutex> lk(launch_mu_);
    {
      std::lock_guard<std::mutex> plk(progress_mu_);
      std::atomic_ref<unsigned long long>(*progress_host_).store(0);
      max_seen_ = 0;
    }
    // The previous phase's launches would claim this phase's items with that phase's
    // arguments: the executor begins a phase only once none is in flight.
    FR_CHECK(pending_.empty(), "begin_phase() with launches of the task in flight");
    phase_ = phase;
    n_items_ = n_items;
    phase_done_ = false;
    begun_ = true;
    reset_counters_locked();
  }

  LaunchMarks run(bool record) override {
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
      if (pending_.empty()) {
        arm = s.launch_at_opens && !stop_requested_.load() && !phase_done_;
      }
    }
    if (arm) s.arm(this);
    if (!in_flight()) {
      // Until a launch at an open is enqueued, the gate's mirror reads open (an open that
      // carried no launch, or the rest of a bubble whose launch ended with its slice), or
      // a stop.
      if (!s.ring) tighten_timer_slack();  // this thread only ever waits for the gate
      const bool go = wait_for_gate(
          s, std::chrono::steady_clock::time_point::max(),
          [&] { return abandoned_.load() || (stop_requested_.load() && !in_flight()); },
          [&] { return in_flight() || s.mirror() == FREERIDE_GATE_OPEN; });
      throw_if_abandoned();
      if (!go) return LaunchMarks{};  // stopped (or abandoned) while the gate was closed
    }
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      throw_arrival_error_locked();
      if (pending_.empty()) {
        if (stop_requested_.load() || abandoned_.load()) return LaunchMarks{};
        const uint32_t seq = s.mirror_seq();  // after the open mirror: the open's, or newer
        enqueue_locked(nullptr, nullptr, seq, false, record);
      }
    }
    return finish_oldest();
  }

  void launch_at_open(cudaStream_t training, cudaEvent_t opened, uint32_t seq) noexcept override {
    bool rang = false;
    try {
      std::lock_guard<std::mutex> lk(launch_mu_);
      if (!accepting_locked()) return;
      enqueue_locked(training, opened, seq, true, true);
      rang = true;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(launch_mu_);
      arrival_error_ = std::string("a launch at a gate open failed: ") + e.what();
      rang = true;
    } catch (...) {
      std::lock_guard<std::mutex> lk(launch_mu_);
      arrival_error_ = "a launch at a gate open failed";
      rang = true;
    }
    // Training's next launch must not see this call's errors as its own.
    (void)cudaGetLastError();
    if (rang) s_->gate.bell->ring();  // the executor takes it up (or the error)
  }

  // Both return without waiting for the GPU: the executor calls them under its lock, and
  // submit() and cancel() on a training thread. A launch that waits for the gate to open
  // is woken by the bell and sees stop_requested_; a stop also ends launches at opens:
  // one in progress (it holds launch_mu_) is enqueued by the time stop() returns, and none
  // after, so in_flight() then counts every launch the stop leaves to drain.
  void stop() override {
    set_stop(1u);
    { const std::lock_guard<std::mutex> lk(launch_mu_); }
    s_->gate.bell->ring();
  }
  void resume() override { set_stop(0u); }

  // While a launch runs: the mirror, a multiple of freeride::kProgressEvery (or the
  // phase's total) that lags the device's count. Exact after every launch (run() raised
  // it to the ended launch's count), which is when the executor advances a phase or ends
  // a task.
  uint64_t done() const override {
    std::lock_guard<std::mutex> lk(progress_mu_);
    const uint64_t mirror = std::atomic_ref<unsigned long long>(*progress_host_).load();
    max_seen_ = std::max<uint64_t>(max_seen_, mirror);
    return max_seen_;
  }

  // The oldest launch not seen to end has begun (its first block wrote its start).
  bool executing() const override {
    std::lock_guard<std::mutex> lk(launch_mu_);
    if (pending_.empty()) return false;
    const uint64_t number = pending_.front().number;
    return ring_.started(number, launch_no_.load()) && !ring_.published(number);
  }

  bool in_flight() const override {
    std::lock_guard<std::mutex> lk(launch_mu_);
    return !pending_.empty();
  }

  uint64_t launches_taken() const override {
    std::lock_guard<std::mutex> lk(launch_mu_);
    return taken_;
  }

  // Launches end in order on the stream: those from the oldest on whose end has come.
  uint64_t launches_ending() const override {
    std::lock_guard<std::mutex> lk(launch_mu_);
    uint64_t n = taken_;
    for (const Launch& l : pending_) {
      if (!end_has_come_locked(l)) break;
      ++n;
    }
    return n;
  }

  void abandon() override {
    abandoned_.store(true);
    s_->gate.bell->ring();
  }

 private:
  // A launch enqueued and not yet seen to end.
  struct Launch {
    uint64_t number = 0;
    uint64_t n_items = 0;  // that phase's items
    bool record = false;   // marks wanted
    uint32_t gate_seq = 0;  // the open it was enqueued at (or seen under)
    bool at_open = false;
  };

  // Whether a training thread's open may enqueue a launch now. Caller holds launch_mu_.
  bool accepting_locked() const {
    return begun_ && !phase_done_ && !stop_requested_.load() && task_->follows_item_protocol() &&
           !abandoned_.load() && arrival_error_.empty() && pending_.size() < kLaunchRing &&
           !s_->shut_down;
  }

  // Whether launch `l` (enqueued, not taken) has ended or ends without a further gate
  // open: its end record is published; or the gate's mirror reads closed (blocks that
  // began leave at their next item, one not begun finds the gate closed, one enqueued at
  // an open ends by the close enqueued after it), a stop is requested, or the time slice
  // ends it. Not a launch held on the GPU by stream_wait's wait for an open that has not
  // begun: it begins only once the gate opens. Caller holds launch_mu_.
  bool end_has_come_locked(const Launch& l) const {
    if (ring_.published(l.number)) return true;
    const bool open = s_->mirror() == FREERIDE_GATE_OPEN;
    if (s_->stream_wait && !open && !ring_.started(l.number, launch_no_.load())) return false;
    return !open || stop_requested_.load() || s_->slice_ns > 0;
  }

  // Only with a launch in flight: a runner abandoned with none has nothing on the GPU.
  void throw_if_abandoned() const {
    if (abandoned_.load() && in_flight()) {
      FR_THROW(Abandoned, task_->name() << ": abandoned at close while a launch was "
                                           "enqueued or running");
    }
  }

  void throw_arrival_error_locked() {
    if (arrival_error_.empty()) return;
    std::string error;
    error.swap(arrival_error_);
    throw RuntimeFailure(error);
  }

  // Enqueues one launch of the current phase on stream_; caller holds launch_mu_. With
  // `training`, after the work enqueued there so far (`opened` is recorded there and
  // waited for). stream_wait: held by a memory wait on the gate's mirror first.
  void enqueue_locked(cudaStream_t training, cudaEvent_t opened, uint32_t seq, bool at_open,
                      bool record) {
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
    if (training != nullptr) {
      FR_CUDA_CHECK(cudaEventRecord(opened, training));
      FR_CUDA_CHECK(cudaStreamWaitEvent(stream_, opened, 0));
    }
    if (s.stream_wait) hold_until_open();
    if (after_) {
      after_->enqueue_wait(stream_);
      after_.reset();
    }
    Launch l;
    l.number = number;
    l.n_items = n_items_;
    l.gate_seq = seq;
    l.at_open = at_open;
    l.record = record;
    fr_item_ctx ctx{};
    ctx.gate = s.gate.dev;
    ctx.state = state_;
    ctx.progress = progress_dev_;
    ctx.n_items = n_items_;
    ctx.phase = phase_;
    ctx.slice_ns = s.slice_ns;
    ctx.end = ring_.end_dev(number);
    ctx.launch = number;
    ctx.run = ring_.run_dev(number);
    ctx.latest_close = s.latest_close_dev();
    ctx.closes_executed = s.close_slots();
    try {
      // An error a previous task's failure left as this thread's last error (a handled
      // one: a sticky error fails every call anyway) must not be taken for this launch's.
      (void)cudaGetLastError();
      task_->launch_cuda(s.launch(ctx, stream_, green_));
      FR_CUDA_CHECK(cudaGetLastError());
    } catch (...) {
      (void)cudaGetLastError();
      if (s.stream_wait) drain_side();
      throw;
    }
    launch_no_ = number;
    pending_.push_back(l);
  }

  // stream_wait: nothing of the launch may start while the gate is closed. Stop is not
  // part of the memop wait's condition: close() releases a waiting launch with unblock().
  // The wait stays on the primary context's side stream whatever stream the task runs
  // on; an event carries it over to a green-context stream.
  void hold_until_open() {
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
  LaunchMarks run_held(bool record) {
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      throw_arrival_error_locked();
      if (pending_.empty()) {
        enqueue_locked(nullptr, nullptr, s_->mirror_seq(), false, record);
      }
    }
    return finish_oldest();
  }

  // Waits for the oldest enqueued launch to end and takes it: its counts (the phase's
  // progress), its marks and the item protocol's check.
  LaunchMarks finish_oldest() {
    CudaShared& s = *s_;
    Launch l;
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      FR_CHECK(!pending_.empty(), "no launch to take");
      l = pending_.front();
    }
    const NvtxRange range(nvtx_name_.c_str());
    LaunchEnd end;
    try {
      end = wait_for_end(l);
    } catch (const Abandoned&) {
      throw;  // still enqueued: ~CudaRunner leaks what it may write
    } catch (...) {
      // A CUDA error (a kernel that faulted): the context is broken, nothing enqueued
      // after it runs.
      std::lock_guard<std::mutex> lk(launch_mu_);
      taken_ += pending_.size();  // none of them ends now: their failure is taken instead
      pending_.clear();
      throw;
    }
    LaunchMarks marks;
    marks.admitted = true;
    marks.gate_seq = l.gate_seq;
    marks.at_open = l.at_open;
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      pending_.pop_front();
      ++taken_;
      raise_progress(end.done);
      if (end.done >= l.n_items) phase_done_ = true;  // no further launch at an open
    }
    settle();
    if (l.record && end.duration_ns >= 0) {
      // Where its first block began and its last block left (no end record: no times).
      std::tie(marks.start, marks.end) =
          s.launch_marks(end.start_ns, end.start_ns + static_cast<uint64_t>(end.duration_ns));
    }
    if (end.broken) {
      // This launch has ended; those enqueued after it still run (the executor takes
      // them before the task fails, its memory still in use until then).
      FR_THROW(RuntimeFailure,
               task_->name() << ": a launch of phase " << phase_ << " ended without every "
                             << "block leaving through freeride::for_each_item: the kernel "
                                "must call freeride::for_each_item(ctx, ...) in every block and "
                                "not return before it ends, or it would be relaunched for ever");
    }
    check_protocol(end.done, end.held, l.n_items);
    return marks;
  }

  // Until launch `l` has ended: its end record's number appears (written by the kernel's
  // last block), or it turns out to have ended without one (the stream is idle, or the
  // next launch has begun: a kernel that left the item protocol). Spins (yielding)
  // kEndSpin, then sleeps between looks at the record (on the bell while the launch has
  // not begun: an open rings it), and asks the driver about the stream only every
  // kStreamQueryEvery (a failed kernel shows there).
  LaunchEnd wait_for_end(const Launch& l) {
    using clock = std::chrono::steady_clock;
    const auto started_wait = clock::now();
    auto next_query = started_wait + kStreamQueryEvery;
    auto end_is_near = [&] {
      return s_->mirror() != FREERIDE_GATE_OPEN || stop_requested_.load() ||
             std::atomic_ref<unsigned long long>(*progress_host_).load() >= l.n_items;
    };
    while (true) {
      throw_if_abandoned();
      if (ring_.published(l.number)) return ring_.read(l.number);
      const auto now = clock::now();
      if (now >= next_query) {
        bool idle = false;
        {
          const auto turn = s_->green_turn(green_);
          idle = stream_idle(stream_);
        }
        // The next launch begins only once this one has completed, after its record was
        // written: looked at before the record, so a record that arrived meanwhile is
        // seen below, not taken for a missing one.
        const bool next_began = !idle && ring_.started(l.number + 1, launch_no_.load());
        if (ring_.published(l.number)) return ring_.read(l.number);
        if (idle || next_began) return ended_without_record(l, idle);
        next_query = now + kStreamQueryEvery;
      }
      if (now - started_wait < kEndSpin) {
        std::this_thread::yield();
      } else if (!ring_.started(l.number, launch_no_.load())) {
        Doorbell& bell = *s_->gate.bell;
        const uint64_t seen = bell.rings();
        if (!ring_.started(l.number, launch_no_.load()) && !abandoned_.load()) {
          bell.wait_for(seen, kEndPollFar);
        }
      } else {
        std::this_thread::sleep_for(end_is_near() ? kEndPoll : kEndPollFar);
      }
    }
  }

  // Launch `l` ended without its end record: some block left without leave_launch (a
  // kernel that returned before for_each_item or left it early). For a task that follows
  // the item protocol that is a broken kernel, and relaunching it would repeat that for
  // ever: it fails (finish_oldest). Otherwise (the kernel-slicing baseline) its counts
  // are read back, on the stream once idle, and its launch counters cleared there for
  // their next launch.
  LaunchEnd ended_without_record(const Launch& l, bool stream_is_idle) {
    if (task_->follows_item_protocol() || !stream_is_idle) {
      // (Without the protocol and with later launches enqueued, nothing may be read back
      // behind them: it fails too.)
      LaunchEnd broken;
      broken.broken = true;
      return broken;
    }
    return read_back(l.number);
  }

  // [done, stop, held] copied from the phase state and the launch's counters cleared, on
  // the stream, idle: enqueued under launch_mu_ with this launch the only one pending (a
  // task without the item protocol takes no launch at an open, accepting_locked, and this
  // is asserted rather than assumed: review G13), then waited for by asking, never in a
  // wait that close's deadline cannot end.
  LaunchEnd read_back(uint64_t number) {
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      const auto turn = s_->green_turn(green_);
      FR_CHECK(pending_.size() == 1 && stream_idle(stream_),
               task_->name() << ": a launch ended without its end record while another was "
                                "enqueued behind it: nothing can be read back");
      FR_CUDA_CHECK(cudaMemsetAsync(ring_.run_dev(number), 0, sizeof(fr_launch_run), stream_));
      FR_CUDA_CHECK(cudaMemcpyAsync(readback_host_, done_word(), 16, cudaMemcpyDeviceToHost,
                                    stream_));
      FR_CUDA_CHECK(cudaEventRecord(event_, stream_));
    }
    while (true) {
      throw_if_abandoned();
      const cudaError_t err = cudaEventQuery(event_);
      if (err == cudaSuccess) break;
      if (err != cudaErrorNotReady) throw_cuda(err, "cudaEventQuery (read-back)", __FILE__, __LINE__);
      (void)cudaGetLastError();
      std::this_thread::sleep_for(kEndPoll);
    }
    LaunchEnd end;
    end.done = std::atomic_ref<unsigned long long>(readback_host_[0]).load();
    end.held = std::atomic_ref<unsigned int>(reinterpret_cast<unsigned int*>(readback_host_ + 1)[1])
                   .load();
    return end;
  }

  // The current phase's [next, done] zeroed on the stream, idle: everything enqueued
  // before (the previous phase's launches) has ended. Caller holds launch_mu_.
  void reset_counters_locked() {
    const auto turn = s_->green_turn(green_);
    FR_CUDA_CHECK(cudaMemsetAsync(state_, 0, offsetof(fr_phase_state, stop), stream_));
  }

  // After an end was taken: until the stream is idle, so that the next thing the executor
  // enqueues (its own launch, a phase's reset, a read-back) does not queue behind the
  // kernel, which retires microseconds after its last block wrote the record. Asking,
  // without launch_mu_ (review G12): a kernel that goes on working after for_each_item
  // would otherwise hold a training thread's open, which takes launch_mu_ with the GIL
  // held. Ends early where a launch at an open is enqueued meanwhile (the executor takes
  // that one next, and it is stream-ordered behind this kernel anyway) or the runner is
  // abandoned (close's deadline).
  void settle() {
    const auto begun = std::chrono::steady_clock::now();
    while (!abandoned_.load()) {
      {
        std::lock_guard<std::mutex> lk(launch_mu_);
        if (!pending_.empty()) return;
        const auto turn = s_->green_turn(green_);
        if (stream_idle(stream_)) return;
      }
      if (std::chrono::steady_clock::now() - begun < kEndSpin) {
        std::this_thread::yield();
      } else {
        Doorbell& bell = *s_->gate.bell;  // an abandon rings it
        bell.wait_for(bell.rings(), kEndPoll);
      }
    }
  }

  // Whether the stream has nothing left to run, without throwing (destructor).
  bool quietly_idle() noexcept {
    try {
      DeviceGuard guard(s_->device);
      const auto turn = s_->green_turn(green_);
      return stream_idle(stream_);
    } catch (...) {
      (void)cudaGetLastError();
      return false;
    }
  }

  // Best effort after a failed enqueue in stream_wait mode: a gate wait kernel may be
  // held on `side`. Waits by asking, never by enqueueing.
  void drain_side() noexcept {
    try {
      const auto turn = s_->green_turn(green_);
      while (!stream_idle(stream_) || !stream_idle(s_->side)) std::this_thread::sleep_for(kEndPoll);
    } catch (...) {
    }
    (void)cudaGetLastError();
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
  // its phase unfinished and nobody held back ran a kernel that never entered the item
  // loop (or left it early): relaunching it would only repeat that, forever.
  void check_protocol(uint64_t done, uint32_t held, uint64_t n_items) {
    const bool held_back = held != last_held_;
    last_held_ = held;
    if (done >= n_items || held_back || !task_->follows_item_protocol()) return;
    FR_THROW(RuntimeFailure,
             "a launch of phase " << phase_ << " ended with " << done << " of " << n_items
                                  << " items done although no block was held back by the gate "
                                     "or a stop: the kernel must call freeride::for_each_item"
                                     "(ctx, ...) in every block and not return before it ends, "
                                     "or it would be relaunched forever");
  }

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
  unsigned long long* readback_host_ = nullptr;   // word slot: [done, stop, held]
  LaunchRing ring_;                               // each launch's counters and end record
  std::string nvtx_name_;                         // NvtxRange's message
  cudaEvent_t event_ = nullptr;                   // read_back()'s
  // The stream this task's launches and their bookkeeping go to: the side stream, or the
  // green context's. bridge_: stream_wait's admission on `side`, carried over to stream_.
  cudaStream_t stream_ = nullptr;
  bool green_ = false;
  cudaEvent_t bridge_ = nullptr;
  uint32_t last_held_ = 0;  // `held` after the previous launch (slots start zeroed)

  // Guards what enqueueing a launch reads and writes: the executor's thread and training
  // threads (launch_at_open) both enqueue. Never held while waiting for the GPU, except
  // settle_locked's microseconds.
  mutable std::mutex launch_mu_;
  std::deque<Launch> pending_;            // enqueued, end not taken yet; oldest first
  uint64_t taken_ = 0;                    // launches_taken(): ends taken from pending_
  std::atomic<uint64_t> launch_no_{0};    // the last launch enqueued (written under launch_mu_)
  std::unique_ptr<CudaDependency> after_;  // waited for by the first launch, then dropped
  std::string arrival_error_;             // a launch at an open failed: run() raises it
  uint64_t phase_ = 0;
  uint64_t n_items_ = 0;
  bool begun_ = false;
  bool phase_done_ = false;     // an ended launch counted every item of the phase

  std::atomic<bool> abandoned_{false};
  std::atomic<bool> stop_requested_{false};  // host copy of the stop flag, for admission
  // Guards the three below: stop()/resume() on any thread, launches on theirs.
  std::mutex stop_mu_;
  uint32_t device_stop_ = 0;         // the stop word's value as last enqueued
  cudaEvent_t stop_written_ = nullptr;  // recorded on the control stream after that write
  bool launch_waits_ = false;        // the next launch must wait for stop_written_
  mutable std::mutex progress_mu_;
  mutable uint64_t max_seen_ = 0;  // done() never goes backwards within a phase
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
