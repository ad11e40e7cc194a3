// Gate fallbacks for devices where stream memory operations are unusable (or disabled
// with FREERIDE_NO_STREAM_MEMOPS=1): one-thread kernels standing in for
// cuStreamWriteValue32 and cuStreamWaitValue32.
#include <cuda_runtime.h>

#include "check.hpp"
#include "common.cuh"
#include "freeride/item_ctx.h"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

__global__ void gate_write_kernel(volatile unsigned int* word, unsigned int value) {
  *word = value;
  // Side kernels poll the word from other SMs, and a host-memory gate is read over the
  // bus: make the store visible system-wide before the stream moves on.
  __threadfence_system();
}

// Holds the side stream until the gate opens. The stop flag lets close() and cancel()
// release a launch that would otherwise wait for a gate nobody will open again.
__global__ void gate_wait_kernel(const volatile unsigned int* gate,
                                 const volatile unsigned int* stop) {
  while (*gate != FREERIDE_GATE_OPEN && *stop == 0u) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    // Back off: the word is the gate's host mirror (see CudaRunner::run), so every read
    // crosses the bus; a microsecond is well inside the admission delay.
    __nanosleep(1000);
#endif
  }
}

// Writes %globaltimer to host-visible memory: where the device clock kernels read stands
// against the marks' event timeline (CudaShared::anchor_clock).
__global__ void clock_stamp_kernel(volatile unsigned long long* out) {
  *out = globaltimer_ns();
  __threadfence_system();
}

}  // namespace

void preload_gate_kernels() {
  preload(gate_write_kernel);
  preload(gate_wait_kernel);
  preload(clock_stamp_kernel);
}

void launch_clock_stamp(volatile unsigned long long* out, void* stream) {
  FR_ARG(out != nullptr, "clock stamp: word must not be null");
  clock_stamp_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(out);
  FR_CUDA_CHECK(cudaGetLastError());
}

void preload_all() {
  preload_gate_kernels();
  preload_spin_kernels();
  preload_saxpy_kernels();
  preload_item_counter_kernels();
  preload_pagerank_kernels();
  preload_image_kernels();
  preload_sm_census_kernels();
}

void launch_gate_write(volatile unsigned int* gate, unsigned int value, void* stream) {
  FR_ARG(gate != nullptr, "gate write: word must not be null");
  gate_write_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(gate, value);
  FR_CUDA_CHECK(cudaGetLastError());
}

void launch_gate_wait(const volatile unsigned int* gate, const volatile unsigned int* stop,
                      void* stream) {
  FR_ARG(gate != nullptr && stop != nullptr, "gate wait: gate and stop must not be null");
  gate_wait_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(gate, stop);
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
