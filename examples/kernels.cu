// Side-task kernels for examples/raw_kernel.py, written against freeride's item protocol.
// Each kernel takes fr_item_ctx first and writes only the body of one item: the block
// runs it for every item it claims, and stops claiming as soon as training needs the GPU.
#include <freeride/preempt.cuh>

// y = a * x + b; one item is one tile of blockDim.x elements.
extern "C" __global__ void scale_shift(fr_item_ctx ctx, const float* x, float* y, float a,
                                       float b, unsigned long long n) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    const unsigned long long i = item * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
  });
}

// One explicit step of 1-D heat diffusion per phase, ping-ponging between u0 and u1:
// phase p reads what phase p - 1 wrote (phases never overlap). The ends stay fixed.
// for_each_phase_item gives each item's phase, so one launch may go on from phase to
// phase (RawKernel(..., device_phases=True)); the buffers are picked per item.
extern "C" __global__ void heat_step(fr_item_ctx ctx, float* u0, float* u1, float alpha,
                                     unsigned long long n) {
  freeride::for_each_phase_item(ctx, [&](unsigned long long phase, unsigned long long item) {
    const float* src = phase % 2 == 0 ? u0 : u1;
    float* dst = phase % 2 == 0 ? u1 : u0;
    const unsigned long long i = item * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (i == 0 || i == n - 1) {
      dst[i] = src[i];
    } else {
      dst[i] = src[i] + alpha * (src[i - 1] - 2.0f * src[i] + src[i + 1]);
    }
  });
}
