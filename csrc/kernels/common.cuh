// Helpers shared by the built-in kernels: grid sizing and the GPU's nanosecond clock.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"

namespace freeride::kernels {

// %globaltimer: nanoseconds, the same clock on every SM.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
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
