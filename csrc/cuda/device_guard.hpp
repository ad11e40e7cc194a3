// Selecting a device (or keeping a context) for one call without changing the caller's.
// CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include "check.hpp"
#include "cuda/driver.hpp"

namespace freeride {

// The devices this process sees; throws InvalidArgument unless `device` is one of them.
inline int require_device(int device) {
  int count = 0;
  FR_CUDA_CHECK(cudaGetDeviceCount(&count));
  FR_ARG(device >= 0 && device < count,
         "device must be between 0 and " << count - 1 << ", got " << device);
  return count;
}

// Selects `device` for the calling thread and puts the caller's device back. The caller's
// device is restored only where its primary context already exists: restoring the
// default device 0 of a thread that never chose one would create a context (hundreds of
// MiB) on a GPU this process may not otherwise use.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    FR_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device_) FR_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (prev_ != device_ && cuda_driver::primary_context_active(prev_)) {
      (void)cudaSetDevice(prev_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

// Keeps the calling thread's current context across a launch into a green context's
// stream from a thread that is not the executor's (a training thread at its open): the
// runtime resolves the stream's context itself, and this makes sure that whatever it does
// to the thread's current context, training's is current again afterwards. Best effort:
// where the driver lacks the calls there is nothing to restore with.
class KeepCurrentContext {
 public:
  explicit KeepCurrentContext(bool active) {
    const cuda_driver::Api& a = cuda_driver::api();
    if (!active || a.ctx_get_current == nullptr || a.ctx_set_current == nullptr) return;
    if (a.ctx_get_current(&saved_) == CUDA_SUCCESS) armed_ = true;
  }
  ~KeepCurrentContext() {
    if (!armed_) return;
    const cuda_driver::Api& a = cuda_driver::api();
    CUcontext now = nullptr;
    if (a.ctx_get_current(&now) == CUDA_SUCCESS && now != saved_) (void)a.ctx_set_current(saved_);
  }
  KeepCurrentContext(const KeepCurrentContext&) = delete;
  KeepCurrentContext& operator=(const KeepCurrentContext&) = delete;

 private:
  CUcontext saved_ = nullptr;
  bool armed_ = false;
};

}  // namespace freeride
