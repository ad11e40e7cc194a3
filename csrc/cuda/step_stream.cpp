#include "cuda/step_stream.hpp"

#include "check.hpp"

#ifdef FREERIDE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "cuda/device_guard.hpp"
#endif

namespace freeride {

#ifdef FREERIDE_WITH_CUDA

uintptr_t step_stream(int device) {
  const int count = require_device(device);
  static std::mutex mu;
  // Leaked on purpose: no destructor at exit may run while an abandoned step thread
  // still reads the table or enqueues on one of its streams.
  static auto* streams = new std::vector<cudaStream_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (streams->size() < static_cast<size_t>(count)) streams->resize(count, nullptr);
  cudaStream_t& stream = (*streams)[device];
  if (stream == nullptr) {
    DeviceGuard guard(device);
    int least = 0;
    int greatest = 0;
    FR_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    // Non-blocking: the legacy default stream, which a training loop may still use,
    // must not order steps (or be ordered by them) implicitly.
    cudaStream_t made = nullptr;
    FR_CUDA_CHECK(cudaStreamCreateWithPriority(&made, cudaStreamNonBlocking, least));
    stream = made;
  }
  return reinterpret_cast<uintptr_t>(stream);
}

#else

uintptr_t step_stream(int) {
  FR_THROW(RuntimeFailure, "this build of freeride has no CUDA backend: no step stream");
}

#endif

}  // namespace freeride
