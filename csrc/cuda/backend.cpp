// The CUDA backend: a gate word on the device (or in mapped pinned host memory) with a
// host-visible mirror written in the same stream order, a lowest-priority side stream,
// and runners whose phase counters live in device memory across launches.
//
// A launch is admitted when the mirror reads open, not by a cuStreamWaitValue32 left
// pending on the side stream: a pending wait on a closed gate turns any device-wide
// synchronisation issued before the matching open (torch.cuda.synchronize, cudaFree,
// empty_cache, an OOM retry) into a deadlock, and with CUDA_DEVICE_MAX_CONNECTIONS=1 it
// blocks the training stream itself. Kernels still read the gate before every item, so
// a launch admitted just before a close exits at its next item boundary. The stream
// wait remains available as an option (stream_wait).
// While the gate is closed the executor thread sleeps: every stream-ordered open records
// an event that the backend's OpenWatcher thread waits for and then wakes it
// (ring_and_launch), so admission costs no CPU during compute.
//
// A gate write on a stream is one cuStreamBatchMemOp carrying the gate, its mirror and
// the sequence word (enqueue_gate_batch); FREERIDE_GATE_WRITE selects three
// cuStreamWriteValue32, copies or write kernels instead, for comparison (bench preempt)
// and where the driver lacks the batch.
//
// Side grids never fill an SM (the reserve, applied where each launcher sizes its grid),
// or, with a green-context reserve, built-in side kernels run in a green context that
// leaves whole SMs out (see try_green_context), and every launch ends after its time slice (blocks stop claiming; the executor
// relaunches): the kernels training launches while the gate is open find room at once,
// and a device-wide synchronisation waits at most a slice.
//
// Threads: the executor thread calls PhaseRunner::run/begin_phase; Python threads call
// gate_write (on the training hot path), stop/resume, done and gate_read. Every public
// method selects the device itself and puts the caller's device back afterwards.
//
// The parts: gate_memory.* (gate slots, pinned constants, slot pools), shared.* (the
// state the backend and its runners share, its gate writes and marks; green_context.cpp
// builds its green context as green_context_plan.* decides), admission.* (waiting for the
// gate), runner.* (launches and their ends), open_watcher.* (rings the bell once an open
// took effect), driver.* (driver entry points), and this file (the Backend: gate writes,
// marks, lifetime).
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "capture_mode.hpp"
#include "check.hpp"
#include "cuda/admission.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "cuda/gate_memory.hpp"
#include "cuda/open_watcher.hpp"
#include "cuda/runner.hpp"
#include "cuda/shared.hpp"
#include "launchers.hpp"
#include "withhold_rule.hpp"

namespace freeride {
namespace cuda {
namespace {

// How long shutdown waits for each of its streams to drain (see shutdown()).
constexpr std::chrono::seconds kShutdownWait{5};

SmLimits sm_limits(int device) {
  SmLimits sm;
  int major = 0;
  int minor = 0;
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  // Allocation units and sub-partitions have no attribute: by architecture.
  set_architecture_units(sm, major * 10 + minor);
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&sm.warp_size, cudaDevAttrWarpSize, device));
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&sm.threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&sm.blocks, cudaDevAttrMaxBlocksPerMultiprocessor, device));
  FR_CUDA_CHECK(
      cudaDeviceGetAttribute(&sm.registers, cudaDevAttrMaxRegistersPerMultiprocessor, device));
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&sm.shared_bytes,
                                       cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&sm.reserved_shared_per_block,
                                       cudaDevAttrReservedSharedMemoryPerBlock, device));
  return sm;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& options) : s_(std::make_shared<CudaShared>()) {
    // Its probes synchronise streams and load modules: a harvester made while another
    // thread captures a graph in global mode must not invalidate that capture (G15).
    const RelaxedCaptureScope relaxed;
    // First, before the device is looked at. Every stream shares one hardware queue
    // there: the pending wait would hold the training stream's own open (and everything
    // else) behind it.
    FR_ARG(!options.stream_wait || !single_connection(),
           "stream_wait=True cannot be used with CUDA_DEVICE_MAX_CONNECTIONS=1 (as Megatron-LM "
           "sets it): every stream then shares one hardware queue, and the launch held by "
           "the stream wait would hold the training stream's gate open (and all its other "
           "work) behind it, a deadlock. Use the default admission (stream_wait=False)");
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      FR_THROW(RuntimeFailure, "CUDA device " << device << " is not usable: cudaGetDeviceCount failed with "
                                              << cudaGetErrorName(err) << " ("
                                              << cudaGetErrorString(err) << ")");
    }
    FR_ARG(device >= 0 && device < count,
           "CUDA device " << device << " does not exist (" << count << " device(s) visible)");

    // Before anything is allocated: a misspelt mechanism fails the harvester, not a
    // training hook.
    const cuda_driver::GateWrite wanted = cuda_driver::requested_gate_write(options.gate_write);
    const AdmissionMode admission = admission_mode();
    const bool at_opens = launch_at_opens_enabled();
    const bool successors = successors_enabled();
    const bool phases_ahead = phases_ahead_enabled();
    device_phases_ = device_phases_enabled();
    const bool withhold = withhold_enabled();
    const bool followers = followers_enabled();
    const bool watcher_launch = watcher_launch_enabled();
    const uint64_t lookahead = lookahead_bound();
    const bool green_wanted = options.reserve_mechanism == "green-context";
    const bool balanced = balanced_workqueues_wanted();
    FR_ARG(green_wanted || options.reserve_mechanism == "occupancy-cap",
           "reserve.mechanism must be 'occupancy-cap' or 'green-context', got '"
               << options.reserve_mechanism << "'");
    FR_ARG(options.reserve_sms >= 0, "reserve.sms must not be negative, got " << options.reserve_sms);

    CudaShared& s = *s_;
    s.device = device;
    s.host_gate = options.gate_in_host_memory;
    s.stream_wait = options.stream_wait;
    s.reserve = options.reserve;
    s.slice_ns = options.slice_ns;
    s.max_slices = options.max_slices;
    DeviceGuard guard(device);
    FR_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_count, cudaDevAttrMultiProcessorCount, device));
    s.sm = sm_limits(device);
    if (s.reserve.blocks > 0) {
      FR_ARG(s.reserve.threads > 0 && s.reserve.registers_per_thread >= 0 &&
                 s.reserve.shared_bytes >= 0,
             "reserve: threads must be positive, registers and shared memory not negative");
      const KernelUse one_warp{32, 0, 0};
      FR_ARG(side_blocks_per_sm(s.sm, s.reserve, one_warp) > 0,
             "reserve of " << s.reserve.blocks << " block(s) of " << s.reserve.threads
                           << " threads, " << s.reserve.registers_per_thread
                           << " registers per thread and " << s.reserve.shared_bytes
                           << " bytes of shared memory leaves no room for side work on an SM "
                              "of device "
                           << device << " (" << s.sm.threads << " threads, " << s.sm.registers
                           << " registers, " << s.sm.shared_bytes << " bytes of shared memory)");
    }
    int least = 0;
    int greatest = 0;
    FR_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    // Stream priority only orders which waiting blocks the scheduler starts first when an
    // SM frees up: it never preempts a running block, and the least priority is the
    // default's (0), so a training stream made without a priority (torch's current stream)
    // is no more urgent than side work. What keeps side work out of training's way is the
    // gate, the reserve and the time slice. The control stream (immediate writes, reads)
    // gets the most urgent priority, so its few blocks-free operations are not held behind
    // waiting kernels of other streams.
    FR_CUDA_CHECK(cudaStreamCreateWithPriority(&s.side, cudaStreamNonBlocking, least));
    FR_CUDA_CHECK(cudaStreamCreateWithPriority(&s.control, cudaStreamNonBlocking, greatest));
    // Rings serve stream_wait too: iterative tasks wait for the gate on the host.
    s.admission = admission;
    if (s.ring()) s.watcher = std::make_unique<OpenWatcher>(device, s.stamps);
    // stream_wait holds every launch on the GPU already: launches at opens are its own.
    s.launch_at_opens = at_opens && !options.stream_wait;
    s.successors = successors && !options.stream_wait;
    s.phases_ahead = phases_ahead && s.launch_at_opens;
    s.followers = followers && s.launch_at_opens;
    withhold_ = freeride::withholds(withhold, s.launch_at_opens, single_connection());
    // The watcher's launch is run()'s, which stream_wait holds on the GPU already.
    s.watcher_launch = watcher_launch && s.watcher != nullptr && !options.stream_wait;
    if (s.watcher_launch) {
      // Weak: the watcher's thread outlives the backend (it ends once its events are
      // reached). Where its hold is the last (the backend closed and every runner gone
      // during the call), the shared state is destroyed on that thread, as on any other.
      s.watcher->on_reached([weak = std::weak_ptr<CudaShared>(s_)](uint32_t seq) {
        if (const auto shared = weak.lock()) shared->launch_at_reached(seq);
      });
    }
    s.lookahead_bound = lookahead;
    if (s.launch_at_opens) FR_CUDA_CHECK(cudaEventCreateWithFlags(&s.opened, cudaEventDisableTiming));
    s.balanced_wanted = balanced;
    if (green_wanted) s.try_green_context(options.reserve_sms, least);
    {
      std::lock_guard<std::mutex> lk(s.pool_mu);
      s.staging = s.words.acquire();
      s.zeros = s.words.acquire();
      s.clock_slot = s.words.acquire();
    }
    if (s.green_side != nullptr) {
      kernels::preload_gate_kernels();  // a lazy load would synchronise the context mid-trial
      kernels::preload_sm_census_kernels();  // and for the partition check, likewise
      s.try_green_stream();  // first: it decides whether the green context stays
      if (s.green_side != nullptr) s.check_green_partition();  // falls back on failure
      if (s.green_side != nullptr) s.preload_in_green_context();  // falls back on failure
    }
    cuda_driver::record_reserve_mechanism(
        device, {s.reserve_mechanism, s.reserve_fallback, s.green_sms_seen});
    // Fail (and allocate pinned memory) now rather than in a training hook: copies of a
    // host-memory gate's stream-ordered writes come from the constants as well.
    (void)gate_constants();
    s.gate = acquire_gate(device, s.host_gate);

    const uint32_t open = FREERIDE_GATE_OPEN;
    std::atomic_ref<unsigned int>(*s.gate.mirror).store(open);
    s.clear_close_slots();
    // The gate starts open under number 0 (the Python gate numbers its writes from 1),
    // noted as every open is: the executor's launches for that first bubble carry the
    // first close's ordinal (OpenOrdinals), not none, which would give them a slice under
    // time_slice=None (launch_slice_rule.hpp).
    std::atomic_ref<unsigned int>(s.gate.mirror[kMirrorSeq]).store(0u);
    s.open_ordinals.note(0u, s.closes.next());
    if (cuda_driver::memops_disabled_by_env()) {
      s.memops = false;
      s.memops_reason = "disabled by FREERIDE_NO_STREAM_MEMOPS";
    } else {
      // The trial writes OPEN, so on success it has also initialised the gate.
      s.memops = cuda_driver::probe_stream_mem_ops(device, s.control, s.gate.dev, open,
                                                   &s.memops_reason);
    }
    if (!s.host_gate && !s.memops) s.write_now(s.gate.dev, open);
    s.gate_write = wanted;
    if (s.gate_write == cuda_driver::GateWrite::kBatch) {
      const bool batch = s.memops && s.try_batch();
      if (s.memops) cuda_driver::record_batch_probe(device, batch);
      if (!batch) s.gate_write = cuda_driver::GateWrite::kMemop;
    }
    if (s.gate_write == cuda_driver::GateWrite::kMemop && !s.memops) {
      s.gate_write = cuda_driver::GateWrite::kCopy;
    }
    kernels::preload_all();
    s.anchor_clock();
  }

  ~CudaBackend() override {
    try {
      shutdown();
    } catch (...) {
    }
  }

  std::string kind() const override { return "cuda"; }
  int device() const override { return s_->device; }
  std::string gate_write_mechanism() const override {
    return cuda_driver::gate_write_name(s_->gate_write);
  }
  std::string gate_write_fences() const override {
    return s_->gate_write == cuda_driver::GateWrite::kBatch ? "all" : "";
  }
  std::string reserve_mechanism() const override { return s_->reserve_mechanism; }
  std::string reserve_fallback() const override { return s_->reserve_fallback; }
  std::string green_workqueues() const override {
    return s_->green_side != nullptr ? s_->green_workqueues : "";
  }

  // An immediate close carries no ordinal (freeride/slice.h): it has taken effect when it
  // returns, so it is never pending.
  void gate_write(uint32_t value, uintptr_t stream, uint32_t seq, bool launch) override {
    CudaShared& s = *s_;
    if (stream == kImmediate && s.host_gate) {
      s.write_gate_now(value, seq);
      return;
    }
    std::shared_lock<std::shared_mutex> lk(s.life);
    DeviceGuard guard(s.device);
    if (stream == kImmediate) {
      FR_CHECK(!s.shut_down, "immediate gate write after the CUDA backend was shut down");
      s.write_gate_now(value, seq);
      return;
    }
    const auto handle = reinterpret_cast<cudaStream_t>(stream);
    write_on_stream(value, handle, seq, launch, CudaShared::captures(handle));
  }

  // The training thread's open and close: the capture query, the mark and the write under
  // one lock of `life`, one device switch and one look at the capture state (review G9).
  uint64_t gate_write_marked(uint32_t value, uintptr_t stream, uint32_t seq,
                             bool launch) override {
    if (stream == kImmediate) return Backend::gate_write_marked(value, stream, seq, launch);
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    DeviceGuard guard(s.device);
    const auto handle = reinterpret_cast<cudaStream_t>(stream);
    const bool captured = CudaShared::captures(handle);
    const bool open = value == FREERIDE_GATE_OPEN;
    auto take_mark = [&]() -> uint64_t {
      if (captured) return 0;
      FR_CHECK(!s.shut_down, "mark() after the CUDA backend was shut down");
      return s.mark(handle);
    };
    const uint64_t before = open ? take_mark() : 0;
    write_on_stream(value, handle, seq, launch, captured);
    return open ? before : take_mark();
  }

  // A stream-ordered write; `captured`: `stream` is being captured into a CUDA graph.
  // Caller holds `life` shared and the device. Still allowed after shutdown (the gate is
  // never freed): a training hook that fires after close must not fail the training step.
  void write_on_stream(uint32_t value, cudaStream_t stream, uint32_t seq, bool launch,
                       bool captured) {
    CudaShared& s = *s_;
    if (value != FREERIDE_GATE_OPEN) {
      // A close captured into a graph takes effect only when (if ever) the graph is
      // replayed, and carries no ordinal.
      s.closes.close(!captured, [&](uint32_t ordinal) {
        s.enqueue_gate_write(value, stream, seq, ordinal);
      });
      return;
    }
    // Before the write: the executor must never see this open take effect unnoted. Not
    // one captured into a graph: every replay repeats its number, and would find it noted.
    if (!launch && !captured) s.skipped.note(seq);
    if (!captured) s.open_ordinals.note(seq, s.closes.next());
    if (s.unrung.note_open(reinterpret_cast<uintptr_t>(stream), captured,
                           stream == cudaStreamPerThread)) {
      s.gate.bell->ring();
    }
    s.enqueue_gate_write(value, stream, seq);
    // An open captured into a graph rings nothing and carries no launch; neither after
    // shutdown: the watcher is gone, and so is every runner.
    if (captured || s.shut_down) return;
    s.ring_and_launch(stream, seq, launch);
  }

  // The mirror: every write that has taken effect on the GPU, read without a copy.
  uint32_t gate_read() const override { return s_->mirror(); }
  uint32_t gate_seq() const override { return s_->mirror_seq(); }
  bool wait_open(double timeout_s) const override {
    const CudaShared& s = *s_;
    return wait_for_gate(s, std::chrono::steady_clock::now() + clamp_timeout(timeout_s),
                         [] { return false; }, [&] { return s.mirror() == FREERIDE_GATE_OPEN; });
  }
  // The mirror, then the number: an open writes its number first, so an open mirror
  // read before a number that differs from `seq` belongs to a newer open. An open
  // replayed from a CUDA graph repeats the number it was captured with and rings nothing,
  // so the wait also looks at the mirror every kAdmissionPoll once such an open was
  // written (CudaShared::unrung; under FREERIDE_ADMISSION=spin it looks all the time,
  // pause_between_looks), and a mirror seen closed and then open again is a new
  // bubble too (one shorter than that is missed, and the wait lasts its timeout, as
  // before). A ring that finds neither ends the wait (a submit, cancel or close:
  // interrupt_waits; the first launch an open enqueues, which the executor takes up; a
  // runner's stop or hand-back).
  bool wait_next_open(uint32_t seq, double timeout_s) const override {
    const CudaShared& s = *s_;
    Doorbell& bell = *s.gate.bell;
    const auto deadline = std::chrono::steady_clock::now() + clamp_timeout(timeout_s);
    bool closed_seen = false;
    while (true) {
      const uint64_t seen = bell.rings();  // before the look: a ring in between counts
      const uint64_t at = s.gate_word();   // and a write
      if (s.mirror() != FREERIDE_GATE_OPEN) {
        closed_seen = true;
      } else if (closed_seen || s.mirror_seq() != seq) {
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      pause_between_looks(s.gate_watch(), seen, at, deadline, [&] { return s.gate_word(); });
      if (bell.rings() != seen) {
        return s.mirror() == FREERIDE_GATE_OPEN && (closed_seen || s.mirror_seq() != seq);
      }
    }
  }

  // The executor thread queries and synchronises events while training may be capturing
  // a CUDA graph; in the default (global) capture mode such calls from another thread
  // would invalidate the capture. Relaxed mode lets them be.
  void on_executor_thread() override {
    tighten_timer_slack();  // the launch-end and admission polls sleep tens of microseconds
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
  }

  void interrupt_waits() override { s_->gate.bell->ring(); }

  std::string admission() const override {
    if (s_->stream_wait) return "stream-wait";
    switch (s_->admission) {
      case AdmissionMode::kPoll:
        return "poll";
      case AdmissionMode::kSpin:
        return "spin";
      case AdmissionMode::kRing:
        break;
    }
    return "ring";
  }

  bool launches_at_opens() const override { return s_->launch_at_opens; }
  bool followers() const override { return s_->followers; }
  bool device_phases() const override { return device_phases_; }
  bool withholds() const override { return withhold_; }
  uint64_t skipped_open_launches() const override { return s_->cross_stream_skips.load(); }
  uint64_t opens_served_by_executor() const override { return s_->executor_served_skips.load(); }
  uint64_t max_lookahead() const override { return s_->max_lookahead.load(); }
  uint64_t opens_beyond_lookahead() const override { return s_->beyond_lookahead.load(); }
  uint64_t watcher_launches() const override { return s_->watcher_launches.load(); }
  AdmissionStamps admission_stamps() const override { return s_->stamps->read(); }

  uint64_t mark(uintptr_t stream) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "mark() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return s.mark(stream == kImmediate ? s.control : reinterpret_cast<cudaStream_t>(stream));
  }

  void run_plain(Task& task, uintptr_t stream) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "run_plain() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    // Sized as the task's real launches are: in the green context where those run there.
    const bool green = stream == kImmediate && s.in_green(task);
    void* where = stream == kImmediate ? static_cast<void*>(s.stream_for(task))
                                       : reinterpret_cast<void*>(stream);
    const auto turn = s.green_turn(green);  // the executor may be launching there
    (void)cudaGetLastError();  // as in CudaRunner::run: only this run's errors count
    for (uint64_t phase = 0; phase < task.num_phases(); ++phase) {
      fr_item_ctx ctx{};  // no gate, no state: for_each_item runs every item, unchecked
      ctx.n_items = task.num_items(phase);
      ctx.phase = phase;
      task.launch_cuda(s.launch(ctx, where, green));
      FR_CUDA_CHECK(cudaGetLastError());
    }
  }

  int64_t elapsed_ns(uint64_t from, uint64_t to) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "elapsed_ns() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return s.elapsed_ns(from, to);
  }

  void release_mark(uint64_t id) override { s_->release_mark(id); }

  int64_t mark_unix_ns(uint64_t mark, double timeout_s) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "mark_unix_ns() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return s.mark_unix_ns(mark, timeout_s);
  }

  uintptr_t gate_address() const override { return reinterpret_cast<uintptr_t>(s_->gate.dev); }

  std::unique_ptr<StreamDependency> after_streams(const std::vector<uintptr_t>& streams) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "submit after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return make_dependency(streams);
  }

  std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<Task> task,
                                           std::unique_ptr<StreamDependency> after) override {
    FR_ARG(task != nullptr, "make_runner: task must not be null");
    FR_ARG(after == nullptr || is_cuda_dependency(after.get()),
           "make_runner: dependency of another backend");
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "make_runner() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return cuda::make_runner(s_, std::move(task), std::move(after));
  }

  // A run() held by the stream wait on a closed gate only gets to its (already set)
  // stop flag once the wait is let go. The wait is on the mirror, so a host store does
  // it, with no operation on any stream (one could queue behind the held launch). The
  // released kernel reads the device gate, still closed, and exits at once (or its stop
  // flag stops it); this harvester launches nothing more. Without stream_wait nothing is
  // ever held on the GPU: the stop flag ends the poll.
  void unblock() override {
    CudaShared& s = *s_;
    if (!s.stream_wait) return;
    std::atomic_ref<unsigned int>(*s.gate.mirror).store(FREERIDE_GATE_OPEN);
    s.gate.bell->ring();
  }

  uintptr_t side_stream() const override { return reinterpret_cast<uintptr_t>(s_->side); }

  void refuse_launches_at_opens() override { s_->refuse_launches_at_opens(); }

  bool reclaim_abandoned() override {
    CudaShared& s = *s_;
    std::unique_lock<std::shared_mutex> lk(s.life);
    if (!s.shut_down) return false;
    DeviceGuard guard(s.device);
    return s.reclaim();
  }

  void abandon_work() override { s_->abandoned = true; }

  void shutdown() override {
    CudaShared& s = *s_;
    std::unique_lock<std::shared_mutex> lk(s.life);
    if (s.shut_down) return;
    s.shut_down = true;
    DeviceGuard guard(s.device);
    // Whichever thread closes (a user's, the SIGTERM closer), beside a capture elsewhere.
    const RelaxedCaptureScope relaxed;
    // Side launches have ended (the executor took every end) unless some were abandoned;
    // stop-word writes still pending on control land before the pools' slabs may go to
    // another pool. Each wait is bounded: a stream that does not drain in time (one
    // hardware queue stalled behind a peer that died) leaves the slabs to leak rather than
    // hang the close.
    bool drained = !s.abandoned;
    cudaError_t err = cudaSuccess;
    for (cudaStream_t stream : {s.side, s.green_side, s.control}) {
      if (!drained || stream == nullptr) continue;
      const cudaError_t waited = s.wait_idle(stream, kShutdownWait);
      if (waited == cudaErrorNotReady) {
        drained = false;
      } else if (err == cudaSuccess) {
        err = waited;
      }
    }
    // Launches left on the GPU (abandoned, or a stream that did not drain in time): what
    // they may touch stays as it is until reclaim_abandoned() sees them gone, the green
    // context included (review G7), and no slab goes to another pool (G5).
    if (drained) {
      s.destroy_streams();
    } else {
      s.hold_for_launches_left();
    }
    s.destroy_events();
    {
      std::lock_guard<std::mutex> alk(s.arm_mu);
      if (s.opened != nullptr) (void)cudaEventDestroy(s.opened);
      s.opened = nullptr;
    }
    s.watcher.reset();  // its thread ends once the opens it waits for are reached
    {
      std::lock_guard<std::mutex> plk(s.pool_mu);
      s.orphaned = drained;
      // The backend's own staging slots count as released along with it.
      if (drained && s.runners == 0) s.free_pools();
    }
    if (err != cudaSuccess) throw_cuda(err, "waiting for the side streams", __FILE__, __LINE__);
  }

 private:
  std::shared_ptr<CudaShared> s_;
  bool device_phases_ = false;  // FREERIDE_DEVICE_PHASES, as read at construction
  bool withhold_ = false;       // FREERIDE_WITHHOLD (with launches at opens), likewise
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options) {
  return std::make_unique<cuda::CudaBackend>(device, options);
}

}  // namespace freeride
