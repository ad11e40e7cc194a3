#include "capture_mode.hpp"

#include "check.hpp"

#ifdef FREERIDE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <optional>

#include "cuda/device_guard.hpp"
#endif

namespace freeride {

#ifdef FREERIDE_WITH_CUDA

bool stream_is_capturing(uintptr_t stream, int device) {
  // Only the special handles name a different stream on each device; a real handle
  // belongs to one device whichever is current, so the common case costs no device switch
  // (the recorder asks before every recorded gate write on the training thread).
  std::optional<DeviceGuard> guard;
  if (stream <= 2) guard.emplace(device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err =
      cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status);
  if (err == cudaSuccess) return status != cudaStreamCaptureStatusNone;
  // Not sticky, but left as the thread's last error it would surface as the next torch
  // kernel launch's failure.
  (void)cudaGetLastError();
  // The legacy default stream while a blocking stream captures: work enqueued on it
  // would take part in (and break) that capture, so for the caller it is capturing.
  if (err == cudaErrorStreamCaptureImplicit) return true;
  FR_THROW(RuntimeFailure, "CUDA error " << cudaGetErrorName(err)
                                         << " in cudaStreamIsCapturing: "
                                         << cudaGetErrorString(err));
}

bool relax_capture_mode() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

RelaxedCaptureScope::RelaxedCaptureScope() noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess) {
    previous_ = static_cast<int>(mode);
  } else {
    (void)cudaGetLastError();
  }
}

RelaxedCaptureScope::~RelaxedCaptureScope() {
  if (previous_ < 0) return;
  auto mode = static_cast<cudaStreamCaptureMode>(previous_);
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
}

#else

bool stream_is_capturing(uintptr_t, int) {
  FR_THROW(RuntimeFailure,
           "this build of freeride has no CUDA backend: no stream can be captured");
}

bool relax_capture_mode() { return false; }

RelaxedCaptureScope::RelaxedCaptureScope() noexcept = default;
RelaxedCaptureScope::~RelaxedCaptureScope() = default;

#endif

}  // namespace freeride
