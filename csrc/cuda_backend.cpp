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
// (enqueue_ring), so admission costs no CPU during compute.
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
#include <cuda_runtime_api.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "check.hpp"
#include "cuda_driver.hpp"
#include "device_guard.hpp"
#include "doorbell.hpp"
#include "freeride/item_ctx.h"
#include "open_watcher.hpp"
#include "launchers.hpp"

namespace freeride {
namespace {

static_assert(std::is_same_v<uint32_t, unsigned int>, "gate words are 32-bit unsigned int");
static_assert(offsetof(fr_phase_state, next) == 0 && offsetof(fr_phase_state, done) == 8 &&
                  offsetof(fr_phase_state, stop) == 16 && offsetof(fr_phase_state, held) == 20,
              "begin_phase zeroes [next, done] as one range in front of stop; a launch that "
              "ended without its end record reads back [done, stop, held] as one copy");

constexpr size_t kGateStride = 128;           // one gate per 128-byte line: no false sharing
constexpr size_t kGateSlabBytes = 64 * 1024;  // 512 gates per allocation
constexpr size_t kStateStride = 128;          // fr_phase_state slots, one line each
// Host words of a runner: [0, 8) progress mirror, [8, 48) the launch end record,
// [48, 64) the fallback read-back [done, stop, held].
constexpr size_t kWordStride = 64;
constexpr size_t kEndOffset = 8;
constexpr size_t kReadbackOffset = 48;
static_assert(kEndOffset + sizeof(fr_launch_end) <= kReadbackOffset &&
              kReadbackOffset + 16 <= kWordStride && kEndOffset % 8 == 0);
constexpr size_t kSlotsPerSlab = 1024;
static_assert(sizeof(fr_phase_state) <= kStateStride && sizeof(fr_phase_state) <= kWordStride);

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  detail::Msg os;
  os << "CUDA error " << cudaGetErrorName(err) << " in " << call << ": "
     << cudaGetErrorString(err) << detail::where(file, line);
  throw RuntimeFailure(os.str());
}

// Mapped pinned host memory and its device view; throws (freeing nothing left behind).
void alloc_mapped(size_t bytes, char** host, char** dev) {
  void* h = nullptr;
  FR_CUDA_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  void* d = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&d, h, 0);
  if (err != cudaSuccess) {
    (void)cudaFreeHost(h);
    throw_cuda(err, "cudaHostGetDevicePointer", __FILE__, __LINE__);
  }
  *host = static_cast<char*>(h);
  *dev = static_cast<char*>(d);
}

// ---------------------------------------------------------------------------------------
// Gates: a per-device, process-lifetime pool. Never freed and never reused: a training
// stream may still hold stream-ordered writes to a gate after its harvester closed, and
// they must neither land in freed memory nor flip a later harvester's gate.

struct GateSlot {
  unsigned int* dev = nullptr;         // the word kernels read, as the device sees it
  unsigned int* mirror = nullptr;      // host view of the host-visible copy; for a
                                       // host-memory gate, the gate itself
  unsigned int* mirror_dev = nullptr;  // device view of that copy (== dev for a host gate)
  // Rung once an open has taken effect (the backend's OpenWatcher), and by stops: the
  // executor thread sleeps on it while the gate is closed. As long-lived as the gate,
  // because the watcher may ring it for an open that a training stream reaches after the
  // harvester closed.
  Doorbell* bell = nullptr;
};

GateSlot acquire_gate(int device, bool host_memory) {
  struct Slab {
    char* dev = nullptr;
    char* host = nullptr;      // mapped pinned: the mirrors (or host-memory gates)
    char* host_dev = nullptr;  // device view of `host`
    size_t used = kGateSlabBytes;  // "full": the first acquire allocates
  };
  static std::mutex mu;
  static auto* slabs = new std::map<std::pair<int, bool>, Slab>();  // leaked on purpose
  std::lock_guard<std::mutex> lk(mu);
  Slab& slab = (*slabs)[{device, host_memory}];
  if (slab.used + kGateStride > kGateSlabBytes) {
    Slab fresh;
    fresh.used = 0;
    alloc_mapped(kGateSlabBytes, &fresh.host, &fresh.host_dev);
    if (host_memory) {
      fresh.dev = fresh.host_dev;
    } else {
      void* dev = nullptr;
      FR_CUDA_CHECK(cudaMalloc(&dev, kGateSlabBytes));
      fresh.dev = static_cast<char*>(dev);
    }
    slab = fresh;  // the previous slab is abandoned, not freed
  }
  GateSlot slot;
  slot.dev = reinterpret_cast<unsigned int*>(slab.dev + slab.used);
  slot.mirror = reinterpret_cast<unsigned int*>(slab.host + slab.used);
  slot.mirror_dev = reinterpret_cast<unsigned int*>(slab.host_dev + slab.used);
  slot.bell = new Doorbell();  // leaked on purpose, like the gate
  slab.used += kGateStride;
  return slot;
}

// Process-lifetime pinned constants {CLOSED, OPEN}: the source of stream-ordered gate
// writes by copy on the fallback path. Never freed, for the same reason as the gates.
const unsigned int* gate_constants() {
  static std::mutex mu;
  static unsigned int* constants = nullptr;
  std::lock_guard<std::mutex> lk(mu);
  if (constants == nullptr) {
    void* p = nullptr;
    FR_CUDA_CHECK(cudaHostAlloc(&p, 2 * sizeof(unsigned int), cudaHostAllocPortable));
    constants = static_cast<unsigned int*>(p);
    constants[FREERIDE_GATE_CLOSED] = FREERIDE_GATE_CLOSED;
    constants[FREERIDE_GATE_OPEN] = FREERIDE_GATE_OPEN;
  }
  return constants;
}

// ---------------------------------------------------------------------------------------
// Backend-owned slot pools: one allocation per kSlotsPerSlab slots, reused via a free
// list. The caller serialises access (CudaShared::pool_mu).

class SlotPool {
 public:
  struct Slot {
    char* dev = nullptr;   // device address
    char* host = nullptr;  // host address (mapped host pools only)
  };

  SlotPool(bool host_memory, size_t stride) : host_memory_(host_memory), stride_(stride) {}
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;
  ~SlotPool() { free_all(); }

  Slot acquire() {
    if (free_.empty()) grow();
    Slot slot = free_.back();
    free_.pop_back();
    // A reused host slot may hold the previous runner's progress.
    if (slot.host != nullptr) std::memset(slot.host, 0, stride_);
    return slot;
  }

  // Cannot reallocate: every slot came from free_, whose capacity covers all of them.
  void release(Slot slot) noexcept { free_.push_back(slot); }

  void free_all() noexcept {
    for (void* base : slabs_) {
      if (host_memory_) {
        (void)cudaFreeHost(base);
      } else {
        (void)cudaFree(base);
      }
    }
    slabs_.clear();
    free_.clear();
    // Errors here (e.g. at process exit) must not surface as a later launch's error.
    (void)cudaGetLastError();
  }

 private:
  void grow() {
    slabs_.reserve(slabs_.size() + 1);
    free_.reserve((slabs_.size() + 1) * kSlotsPerSlab);
    const size_t bytes = kSlotsPerSlab * stride_;
    Slot base;
    if (host_memory_) {
      char* host = nullptr;
      char* dev = nullptr;
      alloc_mapped(bytes, &host, &dev);
      slabs_.push_back(host);
      base.host = static_cast<char*>(host);
      base.dev = static_cast<char*>(dev);
    } else {
      void* dev = nullptr;
      FR_CUDA_CHECK(cudaMalloc(&dev, bytes));
      slabs_.push_back(dev);
      base.dev = static_cast<char*>(dev);
    }
    // Reversed, so that slots are handed out in address order.
    for (size_t i = kSlotsPerSlab; i-- > 0;) {
      Slot s;
      s.dev = base.dev + i * stride_;
      if (base.host != nullptr) s.host = base.host + i * stride_;
      free_.push_back(s);
    }
  }

  bool host_memory_;
  size_t stride_;
  std::vector<void*> slabs_;
  std::vector<Slot> free_;
};

// ---------------------------------------------------------------------------------------
// State shared by the backend and its runners. Runners may outlive shutdown() (the
// executor drops them later), so their memory is released only once both the backend is
// shut down and the last runner is gone.

struct CudaShared {
  int device = -1;
  bool host_gate = false;
  bool stream_wait = false;  // admit launches with cuStreamWaitValue32 instead of polling
  bool memops = false;  // stream memory operations usable on this device
  std::string memops_reason;
  // How gate writes on a stream are made, and the flags of a batch's unfenced writes.
  cuda_driver::GateWrite gate_write = cuda_driver::GateWrite::kCopy;
  unsigned int batch_flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  int sm_count = 0;
  SmLimits sm;
  SmReserve reserve;
  uint64_t slice_ns = 0;
  cudaStream_t side = nullptr;
  cudaStream_t control = nullptr;
  GateSlot gate;
  // How a closed gate is waited for: by the bell, which `watcher` rings once a
  // stream-ordered open has taken effect (enqueue_ring), or by polling the mirror
  // (FREERIDE_ADMISSION=poll). Null where polling, and after shutdown.
  std::unique_ptr<OpenWatcher> watcher;
  bool ring = true;
  // Green-context reserve: the context and the lowest-priority stream in it that tasks
  // which may (Task::runs_in_green_context) run on instead of `side`. Null otherwise.
  CUgreenCtx green = nullptr;
  cudaStream_t green_side = nullptr;
  int green_sms = 0;
  std::string reserve_mechanism = "occupancy-cap";
  std::string reserve_fallback;
  // A green context is used from one thread at a time: the executor's launches and a
  // plain run's (run_plain, from a benchmark's thread) take turns on its stream.
  mutable std::mutex green_mu;
  std::unique_lock<std::mutex> green_turn(bool green) const {
    return green ? std::unique_lock<std::mutex>(green_mu) : std::unique_lock<std::mutex>();
  }

  // Shared by every operation, exclusive for shutdown(): shutdown cannot pull streams
  // out from under a call in progress. Readers never wait for each other.
  std::shared_mutex life;
  bool shut_down = false;  // written under `life` held exclusively

  std::mutex pool_mu;  // guards the pools, `runners`, `orphaned`
  SlotPool states{false, kStateStride};
  SlotPool words{true, kWordStride};
  int runners = 0;
  bool orphaned = false;  // shut down: free the pools when the last runner goes
  bool pools_freed = false;

  std::mutex staging_mu;       // guards `staging`
  SlotPool::Slot staging;      // pinned bounce word for immediate reads and copies
  SlotPool::Slot zeros;        // pinned zeros (never written) to clear a phase state

  CudaShared() = default;
  CudaShared(const CudaShared&) = delete;
  CudaShared& operator=(const CudaShared&) = delete;

  ~CudaShared() {
    // A backend whose constructor refused its arguments (an unknown gate write or reserve
    // mechanism, a device that does not exist) made nothing, and has no device yet:
    // cudaSetDevice(-1) would leave cudaErrorInvalidDevice as the thread's last error,
    // for the next launch checked on it (run_plain, a kernel gate write) to report.
    if (device < 0) return;
    try {
      DeviceGuard guard(device);
      destroy_streams();
      free_pools();
    } catch (...) {
      // Destructors never throw; at process exit the runtime may already be gone.
      (void)cudaGetLastError();
    }
  }

  void destroy_streams() noexcept {
    if (side != nullptr) (void)cudaStreamDestroy(side);
    if (control != nullptr) (void)cudaStreamDestroy(control);
    side = nullptr;
    control = nullptr;
    destroy_green();
    (void)cudaGetLastError();
  }

  // The stream first: cuGreenCtxDestroy leaves a green context's streams behind, leaked.
  void destroy_green() noexcept {
    const cuda_driver::Api& a = cuda_driver::api();
    if (green_side != nullptr) (void)a.stream_destroy(reinterpret_cast<CUstream>(green_side));
    if (green != nullptr) (void)a.green_ctx_destroy(green);
    green_side = nullptr;
    green = nullptr;
  }

  // Where a task's launches and their bookkeeping go.
  bool in_green(const Task& task) const {
    return green_side != nullptr && task.runs_in_green_context();
  }
  cudaStream_t stream_for(const Task& task) const { return in_green(task) ? green_side : side; }

  // Builds the green context for Reserve(mechanism="green-context"), or records in
  // reserve_fallback why not (the occupancy cap then applies to every task). Throws only
  // for a reserve_sms that no partition of this device can leave out.
  //
  // Runtime-API launches into its stream: the driver API's own stream (cuGreenCtxStreamCreate)
  // is handed to <<<>>> launches and cudaMemsetAsync/cudaMemcpyAsync/cudaEventRecord as a
  // cudaStream_t. Documented: the CUDA Programming Guide, "Green Contexts" (4.6): using
  // them needs "no GPU code (kernel) changes, just small host-side changes (e.g., green
  // context creation and stream creation for this green context)"; cuda.h (13.0),
  // cuStreamGetCtx: a green-context stream's context is the one cuCtxFromGreenCtx
  // returns, "a normal primary context but with the resources of the specified green
  // context", and cuStreamGetCtx_v2 names the device's primary context for it, which is
  // where the runtime loaded the built-in kernels; PyTorch's torch.cuda.green_contexts
  // documents runtime-launched operations on such a stream as running on the green
  // context's resources, synchronised with other streams by events. Measured: a standalone
  // probe program on an H100 (not freeride) launched nvcc-compiled kernels with <<<>>> on
  // such a stream (120 of 132 SMs) and a 32 x 512-thread probe started within 8.5 us.
  void try_green_context(int reserved_wanted, int least_priority) {
    const cuda_driver::Api& a = cuda_driver::api();
    if (!a.has_green_contexts()) {
      reserve_fallback = "the driver offers no green contexts (CUDA 12.5 or later needed): " +
                         a.green_error;
      return;
    }
    auto failed = [&](const char* call, int res) {
      reserve_fallback = std::string(call) + " failed: " + cuda_driver::error_name(res);
    };
    CUdevice dev = 0;
    int res = a.device_get(&dev, device);
    if (res != CUDA_SUCCESS) return failed("cuDeviceGet", res);
    CUdevResource all{};
    res = a.device_get_dev_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (res != CUDA_SUCCESS) return failed("cuDeviceGetDevResource", res);
    // Drivers before CUDA 13 leave the partition rules zero: plan_green_context applies
    // their documented guideline then.
    int major = 0;
    int minor = 0;
    FR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    const int total = static_cast<int>(all.sm.smCount);
    const GreenContextStep plan = plan_green_context(
        total, reserved_wanted, static_cast<int>(all.sm.minSmPartitionSize),
        static_cast<int>(all.sm.smCoscheduledAlignment), major * 10 + minor, device);
    FR_ARG(plan.action != GreenContextStep::Action::kRefuse, plan.message);
    if (plan.action != GreenContextStep::Action::kAsk) {
      reserve_fallback = plan.message;
      return;
    }
    CUdevResource group{};
    CUdevResource rest{};
    unsigned int groups = 1;
    res = a.sm_resource_split_by_count(&group, &groups, &all, &rest, 0,
                                       static_cast<unsigned int>(plan.sms));
    if (res != CUDA_SUCCESS) return failed("cuDevSmResourceSplitByCount", res);
    const GreenContextStep split =
        check_green_split(plan, total, groups, static_cast<int>(group.sm.smCount));
    if (split.action != GreenContextStep::Action::kUse) {
      reserve_fallback = split.message;
      return;
    }
    const int got = split.sms;
    CUdevResourceDesc desc = nullptr;
    res = a.resource_generate_desc(&desc, &group, 1);
    if (res != CUDA_SUCCESS) return failed("cuDevResourceGenerateDesc", res);
    CUgreenCtx ctx = nullptr;
    res = a.green_ctx_create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (res != CUDA_SUCCESS) return failed("cuGreenCtxCreate", res);
    CUstream stream = nullptr;
    // Lowest priority, like `side` (see there for what that does and does not buy).
    res = a.green_ctx_stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, least_priority);
    if (res != CUDA_SUCCESS) {
      (void)a.green_ctx_destroy(ctx);
      return failed("cuGreenCtxStreamCreate", res);
    }
    green = ctx;
    green_side = reinterpret_cast<cudaStream_t>(stream);
    green_sms = got;
    reserve_mechanism = (detail::Msg() << "green-context (" << got << " of " << total << " SMs)")
                            .str();
  }

  // Runs, once on the green context's stream, every kind of runtime-API call a task's
  // launches put there (run, begin_phase, mark, drain_side): an event of the primary
  // context recorded on it and waited for by it, a memset, a built-in kernel, a copy, and
  // the elapsed time from an event on the primary context's side stream to one on it.
  // Only the kernel launch is measured to work on such a stream (the probe program
  // above); cuEventRecord documents that event and stream "must be from the same
  // context", and a green context's stream belongs to the context cuCtxFromGreenCtx
  // returns. Where any call is refused, the green context goes and the occupancy cap
  // applies with the reason in reserve_fallback, instead of every launch of every task
  // failing later. Needs `staging`; throws only where the context itself failed.
  void try_green_stream() {
    std::string refused;
    // [0]: the end of the trial; [1] on the side stream, [2] on the green one: a timed
    // pair across the two contexts, as the recorder resolves a launch's marks against an
    // anchor on the training stream.
    cudaEvent_t ev[3] = {nullptr, nullptr, nullptr};
    SlotPool::Slot slot;
    {
      std::lock_guard<std::mutex> lk(pool_mu);
      slot = states.acquire();
    }
    auto try_call = [&](cudaError_t err, const char* call) {
      if (err == cudaSuccess || !refused.empty()) return refused.empty();
      (void)cudaGetLastError();
      refused = std::string(call) + " failed: " + cudaGetErrorName(err);
      return false;
    };
    constexpr unsigned int kProbe = 0x600dfeedu;
    auto* word = reinterpret_cast<unsigned int*>(slot.dev);
    auto* seen = reinterpret_cast<volatile unsigned int*>(staging.host);
    *seen = 0u;
    bool ok = try_call(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags") &&
              try_call(cudaEventCreateWithFlags(&ev[1], cudaEventDefault),
                       "cudaEventCreateWithFlags") &&
              try_call(cudaEventCreateWithFlags(&ev[2], cudaEventDefault),
                       "cudaEventCreateWithFlags") &&
              try_call(cudaEventRecord(ev[1], side), "cudaEventRecord on the side stream") &&
              try_call(cudaStreamWaitEvent(green_side, ev[1], 0), "cudaStreamWaitEvent") &&
              try_call(cudaMemsetAsync(word, 0, sizeof(fr_phase_state), green_side),
                       "cudaMemsetAsync");
    if (ok) {
      try {
        kernels::launch_gate_write(word, kProbe, green_side);
      } catch (const std::exception& e) {
        (void)cudaGetLastError();
        refused = std::string("a built-in kernel launch failed: ") + e.what();
        ok = false;
      }
    }
    ok = ok &&
         try_call(cudaEventRecord(ev[2], green_side), "cudaEventRecord") &&
         try_call(cudaMemcpyAsync(staging.host, word, sizeof(unsigned int),
                                  cudaMemcpyDeviceToHost, green_side),
                  "cudaMemcpyAsync") &&
         try_call(cudaEventRecord(ev[0], green_side), "cudaEventRecord");
    // Whatever was enqueued finishes before the slot goes back. A failure to wait for it
    // is the context's own (a synchronisation the green stream refused is retried
    // device-wide): that throws.
    cudaError_t waited = ok ? cudaEventSynchronize(ev[0]) : cudaStreamSynchronize(green_side);
    if (!ok && waited != cudaSuccess) {
      (void)cudaGetLastError();
      waited = cudaDeviceSynchronize();
    }
    if (ok && waited == cudaSuccess) {
      float ms = 0.f;
      ok = try_call(cudaEventElapsedTime(&ms, ev[1], ev[2]), "cudaEventElapsedTime");
    }
    for (cudaEvent_t e : ev) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    {
      std::lock_guard<std::mutex> lk(pool_mu);
      states.release(slot);
    }
    FR_CUDA_CHECK(waited);
    if (ok && *seen != kProbe) {
      refused = "a kernel on it wrote nothing";
      ok = false;
    }
    if (ok) return;
    destroy_green();
    (void)cudaGetLastError();
    green_sms = 0;
    reserve_mechanism = "occupancy-cap";
    reserve_fallback = "the green context's stream refused the runtime API: " + refused;
  }

  // Loads every built-in kernel into the green context now, on the thread that makes the
  // harvester, before any side work runs: with CUDA's lazy loading a kernel is loaded
  // into a context at its first launch there, which synchronises that context, on the
  // executor thread in the middle of side work. cudaFuncGetAttributes loads a kernel
  // into the current context, so the green context is made current around it. Where the
  // driver lacks the calls, the first launches load lazily, as before.
  void preload_in_green_context() {
    const cuda_driver::Api& a = cuda_driver::api();
    if (a.ctx_from_green_ctx == nullptr || a.ctx_get_current == nullptr ||
        a.ctx_set_current == nullptr) {
      return;
    }
    CUcontext green_ctx = nullptr;
    CUcontext previous = nullptr;
    if (a.ctx_from_green_ctx(&green_ctx, green) != CUDA_SUCCESS ||
        a.ctx_get_current(&previous) != CUDA_SUCCESS ||
        a.ctx_set_current(green_ctx) != CUDA_SUCCESS) {
      return;
    }
    std::exception_ptr error;
    try {
      kernels::preload_all();
    } catch (...) {
      error = std::current_exception();
    }
    (void)a.ctx_set_current(previous);
    (void)cudaGetLastError();
    if (error) std::rethrow_exception(error);
  }

  // Caller holds pool_mu (or is the destructor).
  void free_pools() noexcept {
    if (pools_freed) return;
    pools_freed = true;
    states.free_all();
    words.free_all();
  }

  // In the green context the SMs left out are the room: grids are sized for the
  // context's SMs at full occupancy, with no per-SM cap. A task that runs beside it on
  // the primary context (RawKernel) keeps the per-SM cap and is sized for the green
  // context's SMs too: the block scheduler spreads a grid over every SM, so its blocks
  // also land on the SMs left out, and fewer of them leave those SMs emptier (with the
  // cap, room for `reserve` is left on every SM whatever).
  CudaLaunch launch(const fr_item_ctx& ctx, void* stream, bool in_green_context) const {
    if (in_green_context) return CudaLaunch{ctx, stream, green_sms, device, sm, SmReserve{0}};
    const int sms = green_side != nullptr ? green_sms : sm_count;
    return CudaLaunch{ctx, stream, sms, device, sm, reserve};
  }

  // Stream-ordered write of a 32-bit word on `stream`, by `how` (never kBatch: see
  // enqueue_gate_write).
  void enqueue_write(unsigned int* word, uint32_t value, cudaStream_t stream,
                     cuda_driver::GateWrite how) const {
    if (how == cuda_driver::GateWrite::kMemop) {
      const CUresult res = cuda_driver::api().stream_write_value32(
          stream, cuda_driver::device_ptr(word), value, CU_STREAM_WRITE_VALUE_DEFAULT);
      if (res != CUDA_SUCCESS) {
        cuda_driver::throw_driver_error(res, "cuStreamWriteValue32", __FILE__, __LINE__);
      }
      return;
    }
    // Copy from pinned constants. A copy needs no SM, while a write kernel could not start
    // until a full-occupancy side kernel drains, which would turn the pause latency into
    // the rest of the phase. cudaMemcpyDefault: the word may be device memory or mapped
    // host memory (a mirror or a host gate). Sequence numbers have no constant to copy
    // from: they take the kernel.
    if (how == cuda_driver::GateWrite::kCopy &&
        (value == FREERIDE_GATE_OPEN || value == FREERIDE_GATE_CLOSED)) {
      const cudaError_t err = cudaMemcpyAsync(word, gate_constants() + value, sizeof(unsigned int),
                                              cudaMemcpyDefault, stream);
      if (err != cudaSuccess) throw_cuda(err, "cudaMemcpyAsync (gate write)", __FILE__, __LINE__);
      return;
    }
    kernels::launch_gate_write(word, value, stream);
  }

  // Immediate write of a device-memory word: through the high-priority control stream,
  // complete (visible to the device) on return.
  void write_now(unsigned int* word, uint32_t value) {
    if (memops) {
      enqueue_write(word, value, control, cuda_driver::GateWrite::kMemop);
      FR_CUDA_CHECK(cudaStreamSynchronize(control));
      return;
    }
    // Fallback: a copy rather than the write kernel, for the SM reason above.
    std::lock_guard<std::mutex> lk(staging_mu);
    auto* src = reinterpret_cast<unsigned int*>(staging.host);
    *src = value;
    FR_CUDA_CHECK(cudaMemcpyAsync(word, src, sizeof(unsigned int), cudaMemcpyHostToDevice, control));
    FR_CUDA_CHECK(cudaStreamSynchronize(control));
  }

  // Stream-ordered gate write: the word kernels read, then its host mirror, so that a
  // mirror reading open implies the gate is open. The sequence word (beside the mirror)
  // goes before an open and after a close: a close is never held behind it, and an open
  // is seen with its own sequence number.
  void enqueue_gate_write(uint32_t value, cudaStream_t stream, uint32_t seq) const {
    if (gate_write == cuda_driver::GateWrite::kBatch) {
      const CUresult res = enqueue_gate_batch(value, stream, seq, batch_flags);
      if (res != CUDA_SUCCESS) {
        cuda_driver::throw_driver_error(res, "cuStreamBatchMemOp (gate write)", __FILE__, __LINE__);
      }
      return;
    }
    if (value == FREERIDE_GATE_OPEN) enqueue_write(gate.mirror_dev + 1, seq, stream, gate_write);
    enqueue_write(gate.dev, value, stream, gate_write);
    if (!host_gate) enqueue_write(gate.mirror_dev, value, stream, gate_write);
    if (value != FREERIDE_GATE_OPEN) enqueue_write(gate.mirror_dev + 1, seq, stream, gate_write);
  }

  // The same writes, in the same order, as one batch: one operation for the stream to
  // execute instead of three. Every write of a batch is fenced by default (all of the
  // stream's earlier writes visible first), and each fence is a wait on the training
  // stream; `relaxed_flags` drops it where the order argued above does not need it. The
  // gate word keeps its fence: it is ordered after the preceding kernel's work (and, on
  // an open, after the sequence word). So does the mirror of an open, which must not be
  // seen open before the gate is. The mirror of a close may land early (the host then
  // admits nothing a little sooner). The sequence word of a close keeps its fence too:
  // the iterative runner reads the mirror, then the number, and a number seen before the
  // closed mirror would make a closing bubble look like a new one.
  CUresult enqueue_gate_batch(uint32_t value, cudaStream_t stream, uint32_t seq,
                              unsigned int relaxed_flags) const {
    CUstreamBatchMemOpParams ops[3];
    unsigned int count = 0;
    auto add = [&](unsigned int* word, uint32_t v, unsigned int flags) {
      CUstreamBatchMemOpParams& op = ops[count++];
      std::memset(&op, 0, sizeof(op));
      op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      op.writeValue.address = cuda_driver::device_ptr(word);
      op.writeValue.value = v;
      op.writeValue.flags = flags;
    };
    const bool open = value == FREERIDE_GATE_OPEN;
    if (open) add(gate.mirror_dev + 1, seq, relaxed_flags);
    add(gate.dev, value, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (!host_gate) add(gate.mirror_dev, value, open ? CU_STREAM_WRITE_VALUE_DEFAULT : relaxed_flags);
    if (!open) add(gate.mirror_dev + 1, seq, CU_STREAM_WRITE_VALUE_DEFAULT);
    return cuda_driver::api().stream_batch_mem_op(stream, count, ops, 0);
  }

  // Whether the driver takes the batch of an open, tried on the control stream with the
  // gate's current words (the constructor's state: nothing else writes them yet). The
  // driver documents CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER as unsupported by the v2
  // memory operations that cuStreamBatchMemOp resolves to: where it refuses the flag,
  // the batch keeps every fence.
  bool try_batch() {
    if (cuda_driver::api().stream_batch_mem_op == nullptr) return false;
    const uint32_t seq = mirror_seq();
    for (unsigned int flags : {static_cast<unsigned int>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
                               static_cast<unsigned int>(CU_STREAM_WRITE_VALUE_DEFAULT)}) {
      const CUresult res = enqueue_gate_batch(FREERIDE_GATE_OPEN, control, seq, flags);
      FR_CUDA_CHECK(cudaStreamSynchronize(control));
      if (res == CUDA_SUCCESS) {
        batch_flags = flags;
        return true;
      }
    }
    return false;
  }

  // Immediate gate write, complete on return.
  // In the stream-ordered writes' order: the sequence number before an open and after a
  // close, so a reader of the mirror, then the number, never takes a closing bubble for a
  // new one. With stream_wait an open stores the mirror first: launches held by the
  // stream wait (on the mirror) are let go before the device word's write goes on the
  // control stream, which may share the held launch's hardware queue and would
  // otherwise wait behind it for good.
  void write_gate_now(uint32_t value, uint32_t seq) {
    const bool open = value == FREERIDE_GATE_OPEN;
    if (open) std::atomic_ref<unsigned int>(gate.mirror[1]).store(seq);
    if (open && stream_wait) std::atomic_ref<unsigned int>(*gate.mirror).store(value);
    if (!host_gate) write_now(gate.dev, value);
    std::atomic_ref<unsigned int>(*gate.mirror).store(value);
    if (!open) std::atomic_ref<unsigned int>(gate.mirror[1]).store(seq);
    if (open) gate.bell->ring();
  }

  // Has gate.bell rung once `stream` reaches this point (just after an open's writes, so
  // the mirror reads open by then): one event record on the training stream. Caller
  // holds `life` shared (shutdown drops the watcher under it held exclusively: no ring
  // after), with the device current. Never throws: the open
  // itself is enqueued, and where no ring comes the executor thread still looks at the
  // mirror every kAdmissionPoll. Skipped on a stream being captured into a graph, where
  // waiting for an event recorded in the capture would invalidate it.
  void enqueue_ring(cudaStream_t stream) noexcept {
    if (watcher == nullptr) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return;
    }
    (void)watcher->ring_after(stream, gate.bell);
  }

  uint32_t mirror() const { return std::atomic_ref<unsigned int>(*gate.mirror).load(); }
  uint32_t mirror_seq() const { return std::atomic_ref<unsigned int>(gate.mirror[1]).load(); }

  // Marks: pooled timing events. Their ids are the executor's and Python's handles. A
  // derived mark is another mark plus an offset measured on the device (a launch's end:
  // its start mark plus the kernel's own %globaltimer duration), so that no event has to
  // be recorded behind a kernel that may still run.
  std::mutex marks_mu;
  std::unordered_map<uint64_t, cudaEvent_t> marks;
  std::unordered_map<uint64_t, std::pair<uint64_t, int64_t>> derived;  // id -> (mark, ns)
  std::vector<cudaEvent_t> free_events;
  uint64_t next_mark = 1;

  uint64_t mark(cudaStream_t stream) {
    std::lock_guard<std::mutex> lk(marks_mu);
    cudaEvent_t ev = nullptr;
    if (free_events.empty()) {
      FR_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDefault));
    } else {
      ev = free_events.back();
      free_events.pop_back();
    }
    const cudaError_t err = cudaEventRecord(ev, stream);
    if (err != cudaSuccess) {
      free_events.push_back(ev);
      throw_cuda(err, "cudaEventRecord (mark)", __FILE__, __LINE__);
    }
    const uint64_t id = next_mark++;
    marks.emplace(id, ev);
    return id;
  }

  uint64_t derive_mark(uint64_t base, int64_t offset_ns) {
    std::lock_guard<std::mutex> lk(marks_mu);
    FR_ARG(marks.count(base) != 0, "unknown mark " << base);
    const uint64_t id = next_mark++;
    derived.emplace(id, std::make_pair(base, offset_ns));
    return id;
  }

  // Caller holds marks_mu: the event mark under `id` and the offset from it.
  std::pair<uint64_t, int64_t> resolve_locked(uint64_t id) const {
    auto it = derived.find(id);
    return it == derived.end() ? std::make_pair(id, int64_t{0}) : it->second;
  }

  int64_t elapsed_ns(uint64_t from_id, uint64_t to_id) {
    std::lock_guard<std::mutex> lk(marks_mu);
    const auto [from, from_ns] = resolve_locked(from_id);
    const auto [to, to_ns] = resolve_locked(to_id);
    auto a = marks.find(from);
    auto b = marks.find(to);
    FR_ARG(a != marks.end() && b != marks.end(), "unknown mark " << from_id << " or " << to_id);
    float ms = 0.f;
    const cudaError_t err = cudaEventElapsedTime(&ms, a->second, b->second);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not sticky, but must not surface as a launch's error
      return kPending;
    }
    if (err != cudaSuccess) throw_cuda(err, "cudaEventElapsedTime", __FILE__, __LINE__);
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6) + (to_ns - from_ns);
  }

  void release_mark(uint64_t id) noexcept {
    std::lock_guard<std::mutex> lk(marks_mu);
    if (derived.erase(id) != 0) return;
    auto it = marks.find(id);
    if (it == marks.end()) return;
    free_events.push_back(it->second);
    marks.erase(it);
  }

  void destroy_events() noexcept {
    std::lock_guard<std::mutex> lk(marks_mu);
    for (auto& [id, ev] : marks) (void)cudaEventDestroy(ev);
    for (cudaEvent_t ev : free_events) (void)cudaEventDestroy(ev);
    marks.clear();
    derived.clear();
    free_events.clear();
    (void)cudaGetLastError();
  }
};

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

// The longest the executor thread sleeps on the gate's bell before it looks at the mirror
// anyway: the admission delay where no ring comes (an open enqueued while its stream was
// being captured into a graph, or one whose ring could not be enqueued).
constexpr std::chrono::microseconds kAdmissionPoll{1000};
// How long a wait for the gate spins on the mirror before it sleeps.
constexpr std::chrono::microseconds kAdmissionSpin{20};
// Without rings (FREERIDE_ADMISSION=poll): the sleep between looks at the mirror.
constexpr std::chrono::microseconds kPollSleep{20};

// Sleeps between looks at the mirror would overshoot by the default 50 us timer slack.
void tighten_timer_slack() {
#ifdef __linux__
  thread_local bool done = false;
  if (!done) {
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    done = true;
  }
#endif
}

// Until the gate's host mirror reads open (true), or stopped() holds or `deadline` passes
// (false). Spins (yielding) for kAdmissionSpin first: gaps between compute actions are
// often that short, and a ring takes the watcher thread's wake-up and then this one's.
// Then sleeps on the bell, rung when a stream-ordered open has taken effect
// (enqueue_ring) and on an immediate open, looking anyway every kAdmissionPoll; or, where
// rings are off, polls every kPollSleep.
template <typename Stopped, typename IsOpen>
bool wait_for_gate(const CudaShared& s, std::chrono::steady_clock::time_point deadline,
                   Stopped stopped, IsOpen is_open) {
  Doorbell& bell = *s.gate.bell;
  const auto spin_until = std::chrono::steady_clock::now() + kAdmissionSpin;
  while (true) {
    const uint64_t seen = bell.rings();  // before the checks: a ring between them counts
    if (stopped()) return false;
    if (is_open()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (now < spin_until) {
      std::this_thread::yield();
    } else if (s.ring) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      bell.wait_for(seen, std::min(kAdmissionPoll, left + std::chrono::microseconds(1)));
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

// Whether CUDA_DEVICE_MAX_CONNECTIONS asks for one hardware queue per device (read as the
// driver reads it, when the context is made: a later change has no effect, and this
// reads the environment of now, which is what a process that sets it up front has).
bool single_connection() {
  const char* value = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return value != nullptr && std::strtol(value, nullptr, 10) == 1;
}

// Whether gate opens ring the executor's bell (FREERIDE_ADMISSION "ring", the default:
// see OpenWatcher) or it polls the mirror ("poll", for comparison in bench preempt).
bool admission_rings() {
  const char* mode = std::getenv("FREERIDE_ADMISSION");
  const std::string wanted = mode == nullptr ? "" : mode;
  FR_ARG(wanted.empty() || wanted == "ring" || wanted == "poll",
         "FREERIDE_ADMISSION must be 'ring' or 'poll', got '" << wanted << "'");
  return wanted != "poll";
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

// ---------------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& options) : s_(std::make_shared<CudaShared>()) {
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
    const bool ring = admission_rings();
    const bool green_wanted = options.reserve_mechanism == "green-context";
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
    s.ring = ring;
    if (s.ring) s.watcher = std::make_unique<OpenWatcher>(device);
    if (green_wanted) s.try_green_context(options.reserve_sms, least);
    {
      std::lock_guard<std::mutex> lk(s.pool_mu);
      s.staging = s.words.acquire();
      s.zeros = s.words.acquire();
    }
    if (s.green_side != nullptr) {
      kernels::preload_gate_kernels();  // a lazy load would synchronise the context mid-trial
      s.preload_in_green_context();
      s.try_green_stream();
    }
    cuda_driver::record_reserve_mechanism(device, {s.reserve_mechanism, s.reserve_fallback});
    // Fail (and allocate pinned memory) now rather than in a training hook: copies of a
    // host-memory gate's stream-ordered writes come from the constants as well.
    (void)gate_constants();
    s.gate = acquire_gate(device, s.host_gate);

    const uint32_t open = FREERIDE_GATE_OPEN;
    std::atomic_ref<unsigned int>(*s.gate.mirror).store(open);
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
    if (s_->gate_write != cuda_driver::GateWrite::kBatch) return "";
    return s_->batch_flags == CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER ? "gate and open's mirror"
                                                                       : "all";
  }
  std::string reserve_mechanism() const override { return s_->reserve_mechanism; }
  std::string reserve_fallback() const override { return s_->reserve_fallback; }

  void gate_write(uint32_t value, uintptr_t stream, uint32_t seq) override {
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
    // Still allowed after shutdown (the gate is never freed): a training hook that fires
    // after close must not fail the training step.
    s.enqueue_gate_write(value, reinterpret_cast<cudaStream_t>(stream), seq);
    // No ring after shutdown: the watcher is gone (enqueue_ring).
    if (value == FREERIDE_GATE_OPEN) s.enqueue_ring(reinterpret_cast<cudaStream_t>(stream));
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
  // read before a number that differs from `seq` belongs to a newer open.
  bool wait_next_open(uint32_t seq, double timeout_s) const override {
    const CudaShared& s = *s_;
    return wait_for_ring(*s.gate.bell, timeout_s, [&] {
      return s.mirror() == FREERIDE_GATE_OPEN && s.mirror_seq() != seq;
    });
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
    return s_->ring ? "ring" : "poll";
  }

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

  uintptr_t gate_address() const override { return reinterpret_cast<uintptr_t>(s_->gate.dev); }

  std::unique_ptr<StreamDependency> after_streams(const std::vector<uintptr_t>& streams) override {
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "submit after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return std::make_unique<CudaDependency>(streams);
  }

  std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<Task> task,
                                           std::unique_ptr<StreamDependency> after) override {
    FR_ARG(task != nullptr, "make_runner: task must not be null");
    FR_ARG(after == nullptr || dynamic_cast<CudaDependency*>(after.get()) != nullptr,
           "make_runner: dependency of another backend");
    CudaShared& s = *s_;
    std::shared_lock<std::shared_mutex> lk(s.life);
    FR_CHECK(!s.shut_down, "make_runner() after the CUDA backend was shut down");
    DeviceGuard guard(s.device);
    return std::make_unique<CudaRunner>(s_, std::move(task), std::move(after));
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

  void shutdown() override {
    CudaShared& s = *s_;
    std::unique_lock<std::shared_mutex> lk(s.life);
    if (s.shut_down) return;
    s.shut_down = true;
    DeviceGuard guard(s.device);
    cudaError_t err = cudaStreamSynchronize(s.side);
    if (s.green_side != nullptr) {
      const cudaError_t green_err = cudaStreamSynchronize(s.green_side);
      if (err == cudaSuccess) err = green_err;
    }
    // Stop-word writes still pending there land before the pools may be freed.
    const cudaError_t control_err = cudaStreamSynchronize(s.control);
    if (err == cudaSuccess) err = control_err;
    s.destroy_streams();
    s.destroy_events();
    s.watcher.reset();  // its thread ends once the opens it waits for are reached
    {
      std::lock_guard<std::mutex> plk(s.pool_mu);
      s.orphaned = true;
      // The backend's own staging slots count as released along with it.
      if (s.runners == 0) s.free_pools();
    }
    if (err != cudaSuccess) throw_cuda(err, "cudaStreamSynchronize (side stream)", __FILE__, __LINE__);
  }

 private:
  std::shared_ptr<CudaShared> s_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options) {
  return std::make_unique<CudaBackend>(device, options);
}

}  // namespace freeride
