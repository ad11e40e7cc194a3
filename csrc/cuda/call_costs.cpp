#include "cuda/call_costs.hpp"

#include "check.hpp"

#ifdef FREERIDE_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>

#include "capture_mode.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "launchers.hpp"
#include "test_switches.hpp"
#endif

namespace freeride {

#ifdef FREERIDE_WITH_CUDA

namespace {

// The longest the measurement waits for its streams as it ends.
constexpr std::chrono::seconds kDrainDeadline{5};

// What the measurement holds, freed whatever happens (made by init(), after the object
// exists, so that the destructor frees what a failed init() made). A stream wait on
// mapped host memory holds `stream` while a block is timed: block k waits until the word
// reaches k (CU_STREAM_WAIT_VALUE_GEQ), and the host releases it by storing k. GEQ is
// cyclic, (int32_t)(*addr - k) >= 0, so the largest unsigned value would release no
// wait: the destructor stores the latest k issued, which releases every wait before it,
// and then waits for the stream a bounded time (a timed call that threw inside a held
// block leaves the stream held until then). Where the stream does not drain, what a
// wait may still read is leaked rather than freed.
class Bench {
 public:
  explicit Bench(int device) : device_(device) {}

  void init() {
    FR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FR_CUDA_CHECK(cudaStreamCreateWithFlags(&other_, cudaStreamNonBlocking));
    // The mark's kind (CudaShared::mark) and the watcher's (OpenWatcher).
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&timing_, cudaEventDefault));
    FR_CUDA_CHECK(
        cudaEventCreateWithFlags(&ring_, cudaEventBlockingSync | cudaEventDisableTiming));
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&other_done_, cudaEventDisableTiming));
    FR_CUDA_CHECK(cudaEventRecord(other_done_, other_));
    FR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&words_), 8 * sizeof(unsigned int)));
    FR_CUDA_CHECK(cudaMemsetAsync(words_, 0, 8 * sizeof(unsigned int), stream_));
    FR_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&hold_), sizeof(unsigned int),
                                cudaHostAllocMapped | cudaHostAllocPortable));
    std::atomic_ref<unsigned int>(*hold_).store(0u);
    FR_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hold_dev_), hold_, 0));
    const cuda_driver::Api& a = cuda_driver::api();
    std::string why;
    memops_ = a.has_memops() && !cuda_driver::memops_disabled_by_env() &&
              cuda_driver::probe_stream_mem_ops(device_, reinterpret_cast<CUstream>(stream_),
                                                 words_ + 6, 1u, &why, /*record=*/false);
    FR_CUDA_CHECK(cudaStreamSynchronize(other_));
    FR_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // Before any block holds the stream: a lazy load at the kernel's first launch would
    // synchronise the context, and so wait for the held stream, which only this thread
    // releases.
    kernels::preload_gate_kernels();
  }

  ~Bench() {
    if (hold_ != nullptr) std::atomic_ref<unsigned int>(*hold_).store(blocks_);
    const bool drained = drains(stream_) && drains(other_);
    if (timing_ != nullptr) (void)cudaEventDestroy(timing_);
    if (ring_ != nullptr) (void)cudaEventDestroy(ring_);
    if (other_done_ != nullptr) (void)cudaEventDestroy(other_done_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (other_ != nullptr) (void)cudaStreamDestroy(other_);
    // cudaFree would wait for the whole device, the stream still held included.
    if (drained && words_ != nullptr) (void)cudaFree(words_);
    if (drained && hold_ != nullptr) (void)cudaFreeHost(hold_);
    (void)cudaGetLastError();
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  bool held() const { return memops_; }

  // Times `call` `calls` times (one untimed block first) into `out`.
  template <typename Call>
  void time(CallCost& out, int calls, Call&& call) {
    block(kCallCostBlock, nullptr, call);
    out.ns.reserve(static_cast<size_t>(calls));
    for (int done = 0; done < calls; done += kCallCostBlock) {
      block(std::min(kCallCostBlock, calls - done), &out.ns, call);
    }
  }

  // The calls a pair makes, each as the backend makes it.
  void device_guard() { const DeviceGuard guard(device_); }
  void capture_query() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FR_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  }
  static void relaxed_scope() { const RelaxedCaptureScope relaxed; }
  void record_timing() { FR_CUDA_CHECK(cudaEventRecord(timing_, stream_)); }
  void record_ring() { FR_CUDA_CHECK(cudaEventRecord(ring_, stream_)); }
  void batch_write() {
    CUstreamBatchMemOpParams ops[4];
    for (unsigned int i = 0; i < 4; ++i) ops[i] = cuda_driver::write_value_op(words_ + i, i + 1);
    FR_DRV_CHECK(cuda_driver::api().stream_batch_mem_op(stream_, 4, ops, 0));
  }
  void wait_event() { FR_CUDA_CHECK(cudaStreamWaitEvent(stream_, other_done_, 0)); }
  void launch() { kernels::launch_gate_write(words_ + 4, 1u, stream_); }
  static void keep_context() { const KeepCurrentContext keep(true); }

 private:
  // Whether `stream` (none: true) finished its work within kDrainDeadline.
  static bool drains(cudaStream_t stream) {
    if (stream == nullptr) return true;
    const auto deadline = std::chrono::steady_clock::now() + kDrainDeadline;
    while (true) {
      const cudaError_t err = cudaStreamQuery(stream);
      if (err == cudaSuccess) return true;
      if (err != cudaErrorNotReady || std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  template <typename Call>
  void block(int n, std::vector<int64_t>* out, Call& call) {
    const unsigned int k = ++blocks_;
    if (memops_) {
      FR_DRV_CHECK(cuda_driver::api().stream_wait_value32(
          stream_, cuda_driver::device_ptr(hold_dev_), k, CU_STREAM_WAIT_VALUE_GEQ));
    }
    for (int i = 0; i < n; ++i) {
      if (test_switches::fail_call_costs_block() == k) {
        FR_THROW(RuntimeFailure, "a timed call failed in held block " << k << " (test)");
      }
      const auto t0 = std::chrono::steady_clock::now();
      call();
      const auto t1 = std::chrono::steady_clock::now();
      if (out != nullptr) {
        out->push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
      }
    }
    std::atomic_ref<unsigned int>(*hold_).store(k);
    FR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  int device_;
  bool memops_ = false;
  unsigned int blocks_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t other_ = nullptr;
  cudaEvent_t timing_ = nullptr;
  cudaEvent_t ring_ = nullptr;
  cudaEvent_t other_done_ = nullptr;
  unsigned int* words_ = nullptr;     // device memory: the batch's and the kernel's targets
  unsigned int* hold_ = nullptr;      // mapped pinned host memory: the held wait's word
  unsigned int* hold_dev_ = nullptr;  // its device address
};

}  // namespace

CallCosts measure_call_costs(int device, int calls) {
  FR_ARG(calls >= 1 && calls <= 1000000, "calls must be between 1 and 1000000, got " << calls);
  (void)require_device(device);
  const RelaxedCaptureScope relaxed;  // beside a capture on another thread
  DeviceGuard guard(device);
  Bench b(device);
  b.init();
  CallCosts out;
  out.held = b.held();
  auto measure = [&](const char* what, auto&& call) {
    CallCost c;
    c.call = what;
    b.time(c, calls, call);
    out.calls.push_back(std::move(c));
  };
  measure("clock pair, nothing between (the timer's floor)", [] {});
  measure("device guard (cudaGetDevice): every gate write and mark",
          [&] { b.device_guard(); });
  measure("capture query (cudaStreamIsCapturing): every gate write",
          [&] { b.capture_query(); });
  measure("relaxed capture mode (cudaThreadExchangeStreamCaptureMode, twice): every mark",
          [] { Bench::relaxed_scope(); });
  measure("mark's event record (cudaEventRecord, a timing event): every mark, two a pair",
          [&] { b.record_timing(); });
  measure(
      "ring's event record (cudaEventRecord, a blocking-sync event): every open (admission "
      "ring)",
      [&] { b.record_ring(); });
  const cuda_driver::Api& a = cuda_driver::api();
  CallCost batch;
  batch.call = "gate write (cuStreamBatchMemOp, four 32-bit writes): every close and open";
  if (a.stream_batch_mem_op == nullptr) {
    batch.unavailable = "the driver has no cuStreamBatchMemOp: " + a.batch_error;
  } else if (!b.held()) {
    batch.unavailable = "stream memory operations are off or missing";
  } else {
    try {
      b.time(batch, calls, [&] { b.batch_write(); });
    } catch (const std::exception& e) {
      // A driver that has the entry point but refuses the batch (the backend then writes
      // the gate another way: cuda_driver::usable_gate_write). The next block's release
      // covers this one's wait too (CU_STREAM_WAIT_VALUE_GEQ).
      batch.ns.clear();
      batch.unavailable = std::string("the driver refused the batch: ") + e.what();
    }
  }
  out.calls.push_back(std::move(batch));
  measure("wait for the open (cudaStreamWaitEvent): a launch at an open",
          [&] { b.wait_event(); });
  measure(
      "launch (a kernel of two parameters, then cudaGetLastError): a launch at an open, "
      "whose parameters are the item context",
      [&] { b.launch(); });
  measure("context kept (cuCtxGetCurrent, twice): a launch at an open into a green context",
          [] { Bench::keep_context(); });
  return out;
}

#else

CallCosts measure_call_costs(int, int) {
  FR_THROW(RuntimeFailure, "this build of freeride has no CUDA backend: no CUDA calls to time");
}

#endif

}  // namespace freeride
