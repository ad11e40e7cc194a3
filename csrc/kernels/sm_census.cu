// The green context's partition check (CudaShared::check_green_partition): a grid whose
// blocks record the SMs they ran on.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "common.cuh"
#include "cuda/green_context_plan.hpp"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

constexpr int kThreads = 32;

__device__ __forceinline__ unsigned int sm_id() {
  unsigned int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// The leader records its SM, then holds the block's place until `hold_ns` after the
// first block began: blocks that fill their SMs while others wait are what makes the
// scheduler put the rest wherever else it may (a short block could leave its SM free
// for the next one, and a whole grid could run on a few SMs). Read once as the block
// starts: %smid may change if a block is preempted and resumed elsewhere.
__global__ void __launch_bounds__(kThreads) sm_census_kernel(SmCensus* census,
                                                             unsigned long long hold_ns) {
  if (threadIdx.x != 0) return;
  const unsigned int sm = sm_id();
  if (sm < 32u * SmCensus::kWords) {
    atomicOr(&census->seen[sm / 32u], 1u << (sm % 32u));
  } else {
    atomicAdd(&census->beyond, 1u);
  }
  atomicAdd(&census->blocks, 1u);
  const unsigned long long now = globaltimer_ns();
  unsigned long long first = atomicCAS(&census->start_ns, 0ull, now);
  if (first == 0ull) first = now;
  // Also bounded in the SM's own cycles (a hold of at most 16 cycles per nanosecond asked
  // for, 8 ms at 2 GHz for 1 ms), so that the grid ends even on a device whose
  // %globaltimer stood still: a grid spinning on for good would hold the partition.
  const long long cycles = clock64();
  const long long most = 16 * static_cast<long long>(hold_ns);
  // Signed: another SM's first start may read a little ahead of this one's clock.
  while (static_cast<long long>(globaltimer_ns() - first) < static_cast<long long>(hold_ns) &&
         clock64() - cycles < most) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(1000);
#endif
  }
}

}  // namespace

void preload_sm_census_kernels() { preload(sm_census_kernel); }

void launch_sm_census(SmCensus* census, int sm_count, uint64_t hold_ns, void* stream) {
  FR_ARG(census != nullptr && sm_count > 0, "SM census: a census and SMs needed");
  // Occupancy is a property of the kernel and the device, the same in any context on it.
  int per_sm = 0;
  FR_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sm_census_kernel, kThreads, 0));
  // Every block the whole device could hold at once: with each held in place, the grid
  // needs every SM it is allowed to use.
  const unsigned int blocks = static_cast<unsigned int>(std::max(per_sm, 4) * sm_count);
  sm_census_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(census, hold_ns);
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
