// Selecting a device for one call without changing the caller's. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include "check.hpp"
#include "cuda/driver.hpp"

namespace freeride {

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

}  // namespace freeride
