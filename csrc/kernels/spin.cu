// Spin: a calibrated item that only burns time, for tests and benchmarks of pause latency
// and harvest (its item duration is known exactly, independent of the device's speed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "freeride/preempt.cuh"
#include "common.cuh"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) spin_kernel(fr_item_ctx ctx, unsigned long long ns) {
  freeride::for_each_item(ctx, [&](unsigned long long) {
    const unsigned long long start = global_ns();
    while (global_ns() - start < ns) {
    }
  });
}

}  // namespace

void launch_spin(const CudaLaunch& launch, uint64_t ns_per_item) {
  FR_ARG(launch.ctx.state != nullptr && launch.ctx.gate != nullptr,
         "Spin: launch context lacks gate or phase state");
  const unsigned int grid =
      persistent_grid(spin_kernel, kThreads, launch.sm_count, launch.ctx.n_items);
  spin_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, static_cast<unsigned long long>(ns_per_item));
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
