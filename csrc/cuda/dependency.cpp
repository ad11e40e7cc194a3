#include "cuda/dependency.hpp"

#include "capture_mode.hpp"
#include "check.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/gate_memory.hpp"

namespace freeride::cuda {

CudaDependency::CudaDependency(const std::vector<uintptr_t>& streams) {
  // Records and creations beside a capture another thread runs (submit() refused a
  // capturing stream of its own already).
  const RelaxedCaptureScope relaxed;
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

CudaDependency::~CudaDependency() { destroy(); }

bool CudaDependency::ready() const {
  try {
    DeviceGuard guard(device_);
    const RelaxedCaptureScope relaxed;
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

void CudaDependency::enqueue_wait(cudaStream_t stream) const {
  for (cudaEvent_t ev : events_) FR_CUDA_CHECK(cudaStreamWaitEvent(stream, ev, 0));
}

void CudaDependency::destroy() noexcept {
  for (cudaEvent_t ev : events_) (void)cudaEventDestroy(ev);
  events_.clear();
  (void)cudaGetLastError();
}

}  // namespace freeride::cuda
