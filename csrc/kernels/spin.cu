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

template <bool kPhases>
__global__ void __launch_bounds__(kThreads) spin_kernel(fr_item_ctx ctx, unsigned long long ns) {
  each_item<kPhases>(ctx, [&](unsigned long long, unsigned long long) {
    const unsigned long long start = globaltimer_ns();
    while (globaltimer_ns() - start < ns) {
    }
  });
}

// One item per block, claimed without reading the gate or the stop flag: a slice that,
// once admitted, runs to its end as a plain kernel would.
__global__ void __launch_bounds__(kThreads) spin_slice_kernel(fr_item_ctx ctx, unsigned long long ns) {
  __shared__ unsigned long long s_item;
  if (freeride::leader_thread()) {
    (void)freeride::enter_launch(ctx);
    s_item = atomicAdd(&ctx.state->next, 1ull);
  }
  __syncthreads();
  if (s_item < ctx.n_items) {  // uniform across the block
    const unsigned long long start = globaltimer_ns();
    while (globaltimer_ns() - start < ns) {
    }
    __syncthreads();
    if (freeride::leader_thread()) freeride::finish_item(ctx);
  }
  freeride::leave_launch(ctx);
}

}  // namespace

void preload_spin_kernels() {
  preload(spin_kernel<false>);
  preload(spin_kernel<true>);
  preload(spin_slice_kernel);
}

void launch_spin_slice(const CudaLaunch& launch, uint64_t ns_per_item, uint64_t slice_blocks) {
  FR_ARG(launch.ctx.state != nullptr, "Spin: launch context lacks phase state");
  const unsigned int grid = static_cast<unsigned int>(
      std::max<uint64_t>(1, std::min<uint64_t>({slice_blocks, launch.ctx.n_items, 1u << 30})));
  spin_slice_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, static_cast<unsigned long long>(ns_per_item));
  FR_CUDA_CHECK(cudaGetLastError());
}

void launch_spin(const CudaLaunch& launch, uint64_t ns_per_item) {
  check_context(launch, "Spin");
  auto* kernel = launch.ctx.phase_items != 0 ? spin_kernel<true> : spin_kernel<false>;
  const unsigned int grid = persistent_grid(kernel, kThreads, launch, grid_items(launch.ctx));
  kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, static_cast<unsigned long long>(ns_per_item));
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
