// y += a * x as a preemptible task (its plain run, for the item-overhead benchmark, is
// the same kernel with a context without phase state: see for_each_item).
#include <cuda_runtime.h>

#include <cstdint>

#include "check.hpp"
#include "freeride/preempt.cuh"
#include "common.cuh"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

constexpr int kThreads = 256;

// Explicitly rounded multiply and add: no FMA contraction, so the result is bit-identical
// to the host backend's `y[i] += a * x[i]`.
__device__ __forceinline__ float axpy1(float a, float x, float y) {
  return __fadd_rn(y, __fmul_rn(a, x));
}
__device__ __forceinline__ double axpy1(double a, double x, double y) {
  return __dadd_rn(y, __dmul_rn(a, x));
}

// x and y may alias (y += a * y), hence no __restrict__.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    saxpy_items(fr_item_ctx ctx, T a, const T* x, T* y, unsigned long long n,
                unsigned long long chunk) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    // The launcher guarantees item * chunk < n, so neither line can overflow.
    const unsigned long long begin = item * chunk;
    const unsigned long long end = (n - begin < chunk) ? n : begin + chunk;
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
      y[i] = axpy1(a, x[i], y[i]);
    }
  });
}

template <typename T>
void launch_items(const CudaLaunch& launch, double a, const void* x, void* y, uint64_t n,
                  uint64_t chunk) {
  auto kernel = saxpy_items<T>;
  const unsigned int blocks = persistent_grid(kernel, kThreads, launch, grid_items(launch.ctx));
  kernel<<<blocks, kThreads, 0,
           static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, static_cast<T>(a), static_cast<const T*>(x), static_cast<T*>(y), n, chunk);
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void preload_saxpy_kernels() {
  preload(saxpy_items<float>);
  preload(saxpy_items<double>);
}

void launch_saxpy(const CudaLaunch& launch, double a, const void* x, void* y, uint64_t n,
                  uint64_t chunk, int dtype) {
  check_context(launch, "Saxpy");
  FR_ARG(x != nullptr && y != nullptr, "Saxpy: x and y must not be null");
  FR_ARG(n > 0 && chunk > 0, "Saxpy: n and chunk must be positive, got " << n << ", " << chunk);
  FR_ARG(dtype == 0 || dtype == 1, "Saxpy: dtype must be 0 (float32) or 1 (float64), got " << dtype);
  // The kernel relies on every claimable item starting inside the array.
  const uint64_t items = n / chunk + (n % chunk != 0 ? 1 : 0);
  FR_ARG(launch.ctx.n_items <= items, "Saxpy: phase has " << launch.ctx.n_items
                                          << " items but the array only " << items);
  if (dtype == 0) {
    launch_items<float>(launch, a, x, y, n, chunk);
  } else {
    launch_items<double>(launch, a, x, y, n, chunk);
  }
}

}  // namespace freeride::kernels
