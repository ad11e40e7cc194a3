// Helpers shared by the built-in kernels: grid sizing and the GPU's nanosecond clock.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "task.hpp"

namespace freeride::kernels {

// A launch context is preemptible (gate and phase state) or plain (neither: the
// benchmarks' reference run of the same kernel, see for_each_item).
inline void check_context(const CudaLaunch& launch, const char* task) {
  const bool preemptible = launch.ctx.state != nullptr && launch.ctx.gate != nullptr;
  const bool plain = launch.ctx.state == nullptr && launch.ctx.gate == nullptr &&
                     launch.ctx.progress == nullptr;
  FR_ARG(preemptible || plain, task << ": launch context must have both gate and phase state, "
                                       "or neither (a plain run)");
}

// %globaltimer: nanoseconds, the same clock on every SM.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Loads `kernel` into the current context now. CUDA loads kernels lazily by default, and
// a lazy load synchronises the context: at a first launch in the middle of training it
// would wait for every running kernel, side kernels (and through them the gate) included.
template <typename Kernel>
void preload(Kernel kernel) {
  cudaFuncAttributes attributes{};
  FR_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
}

// Blocks of `kernel` that fit on the device at once.
template <typename Kernel>
uint64_t resident_blocks(Kernel kernel, int threads, int sm_count) {
  int per_sm = 0;
  FR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return static_cast<uint64_t>(std::max(per_sm, 1)) * static_cast<uint64_t>(std::max(sm_count, 1));
}

// Persistent grid: no more blocks than can be resident at once (nor than items), so every
// block is running and polling the gate rather than queued behind the others.
template <typename Kernel>
unsigned int persistent_grid(Kernel kernel, int threads, int sm_count, uint64_t items) {
  return static_cast<unsigned int>(
      std::max<uint64_t>(1, std::min<uint64_t>(resident_blocks(kernel, threads, sm_count), items)));
}

}  // namespace freeride::kernels
