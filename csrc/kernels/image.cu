// GaussianBlur and Resize as preemptible kernels: an item is `rows` output rows of one
// plane, threads stride over its pixels. The arithmetic is image_ops.hpp's, as on the host.
#include <cuda_runtime.h>

#include <cstdint>

#include "check.hpp"
#include "common.cuh"
#include "freeride/preempt.cuh"
#include "image_ops.hpp"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

constexpr int kThreads = 256;

struct Rows {
  unsigned long long plane, y0, y1;
};

__device__ __forceinline__ Rows rows_of(unsigned long long item, unsigned long long out_h,
                                        unsigned long long rows) {
  const unsigned long long tiles = (out_h + rows - 1) / rows;
  Rows r;
  r.plane = item / tiles;
  r.y0 = (item % tiles) * rows;
  r.y1 = r.y0 + rows < out_h ? r.y0 + rows : out_h;
  return r;
}

__global__ void __launch_bounds__(kThreads)
    blur(fr_item_ctx ctx, ImageShape s, const void* in, float* tmp, void* out, const float* wt,
         int radius, unsigned long long rows) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    const Rows r = rows_of(item, s.out_h, rows);
    const long long h = static_cast<long long>(s.in_h), w = static_cast<long long>(s.in_w);
    const unsigned long long plane = r.plane * s.in_h * s.in_w;
    const unsigned long long count = (r.y1 - r.y0) * s.in_w;
    for (unsigned long long i = threadIdx.x; i < count; i += blockDim.x) {
      const unsigned long long y = r.y0 + i / s.in_w;
      const long long x = static_cast<long long>(i % s.in_w);
      float acc = 0.f;
      for (int k = -radius; k <= radius; ++k) {
        acc += wt[k + radius] *
               (ctx.phase == 0
                    ? image::load(in, s.dtype, plane + y * w + image::reflect(x + k, w))
                    : tmp[plane + image::reflect(static_cast<long long>(y) + k, h) * w + x]);
      }
      if (ctx.phase == 0) {
        tmp[plane + y * w + x] = acc;
      } else {
        image::store(out, s.dtype, plane + y * w + x, acc);
      }
    }
  });
}

__global__ void __launch_bounds__(kThreads)
    resize(fr_item_ctx ctx, ImageShape s, const void* in, void* out, unsigned long long rows) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    const Rows r = rows_of(item, s.out_h, rows);
    const unsigned long long src = r.plane * s.in_h * s.in_w;
    const unsigned long long dst = r.plane * s.out_h * s.out_w;
    const unsigned long long count = (r.y1 - r.y0) * s.out_w;
    for (unsigned long long i = threadIdx.x; i < count; i += blockDim.x) {
      const unsigned long long y = r.y0 + i / s.out_w;
      const unsigned long long x = i % s.out_w;
      const image::Tap ty = image::bilinear_tap(static_cast<long long>(y), s.in_h, s.out_h);
      const image::Tap tx = image::bilinear_tap(static_cast<long long>(x), s.in_w, s.out_w);
      const float a = image::load(in, s.dtype, src + ty.i0 * s.in_w + tx.i0);
      const float b = image::load(in, s.dtype, src + ty.i0 * s.in_w + tx.i1);
      const float c = image::load(in, s.dtype, src + ty.i1 * s.in_w + tx.i0);
      const float d = image::load(in, s.dtype, src + ty.i1 * s.in_w + tx.i1);
      const float top = (1.f - tx.w1) * a + tx.w1 * b;
      const float bottom = (1.f - tx.w1) * c + tx.w1 * d;
      image::store(out, s.dtype, dst + y * s.out_w + x, (1.f - ty.w1) * top + ty.w1 * bottom);
    }
  });
}

}  // namespace

void preload_image_kernels() {
  preload(blur);
  preload(resize);
}

void launch_gaussian_blur(const CudaLaunch& launch, const ImageShape& shape, uintptr_t in,
                          uintptr_t tmp, uintptr_t out, uintptr_t weights, int radius,
                          uint64_t rows_per_item) {
  const unsigned grid = persistent_grid(blur, kThreads, launch, grid_items(launch.ctx));
  blur<<<grid, kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, shape, reinterpret_cast<const void*>(in), reinterpret_cast<float*>(tmp),
      reinterpret_cast<void*>(out), reinterpret_cast<const float*>(weights), radius,
      rows_per_item);
  FR_CUDA_CHECK(cudaGetLastError());
}

void launch_resize(const CudaLaunch& launch, const ImageShape& shape, uintptr_t in, uintptr_t out,
                   uint64_t rows_per_item) {
  const unsigned grid = persistent_grid(resize, kThreads, launch, grid_items(launch.ctx));
  resize<<<grid, kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, shape, reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out),
      rows_per_item);
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
