// Every CUDA kernel launcher of the core, in one place. Defined in kernels/*.cu; only
// compiled where the build has CUDA (FREERIDE_WITH_CUDA).
#pragma once

#include <cstdint>

#include "builtin_tasks.hpp"
#include "cuda/green_context_plan.hpp"
#include "task.hpp"

namespace freeride::kernels {

// Loads every built-in kernel into the current device's context (CUDA's lazy loading
// would otherwise do it at a first launch, synchronising the context then).
void preload_all();
void preload_gate_kernels();
void preload_spin_kernels();
void preload_saxpy_kernels();
void preload_item_counter_kernels();
void preload_pagerank_kernels();
void preload_image_kernels();
void preload_sm_census_kernels();

// Throws for a failed load of a built-in kernel (`error`, a cudaError_t, from `call`):
// KernelImageError where the driver has no code it can run on the current device (the
// message names the build's toolkit, PTX ISA and architectures, the driver's CUDA version
// and what to do: cuda/kernel_image.hpp), RuntimeFailure otherwise.
[[noreturn]] void load_failed(int error, const char* call);

// Gate fallbacks for devices without stream memory operations: a one-thread kernel that
// writes the word, and one that spins until the gate opens or `stop` becomes nonzero.
void launch_gate_write(volatile unsigned int* gate, unsigned int value, void* stream);
void launch_gate_wait(const volatile unsigned int* gate, const volatile unsigned int* stop,
                      void* stream);
// One thread writes %globaltimer to `out` (mapped host memory) and fences system-wide.
void launch_clock_stamp(volatile unsigned long long* out, void* stream);

// The green context's partition check (cuda/green_context_plan.hpp): on `stream`, as many
// one-warp blocks as `sm_count` SMs hold at once, each recording in `census` (device
// memory, zeroed) the SM it runs on, and holding its place until `hold_ns` after the first
// block began.
void launch_sm_census(SmCensus* census, int sm_count, uint64_t hold_ns, void* stream);

// Built-in tasks. Each enqueues one preemptible kernel for launch.ctx's phase.
void launch_spin(const CudaLaunch& launch, uint64_t ns_per_item);
// The kernel-slicing baseline: min(slice_blocks, items) blocks each claim one item and run
// it without reading the gate, so the launch as a whole is the unit of preemption.
void launch_spin_slice(const CudaLaunch& launch, uint64_t ns_per_item, uint64_t slice_blocks);
// y[i] += a * x[i] over n elements, `chunk` elements per item; dtype 0 = float32, 1 = float64.
void launch_saxpy(const CudaLaunch& launch, double a, const void* x, void* y, uint64_t n,
                  uint64_t chunk, int dtype);
// Test probe: counts[phase * items + item] += 1; violations += 1 for an item that starts
// before every item of the previous phase finished (phase_done counts per phase); times
// (optional) gets each item's start and end on %globaltimer.
void launch_item_counter(const CudaLaunch& launch, uint32_t* counts,
                         unsigned long long* phase_done, unsigned long long* violations,
                         unsigned long long* times, uint64_t items_per_phase,
                         uint64_t ns_per_item);

// PageRank: phase launch.ctx.phase of make_pagerank_task's two-phase iteration.
void launch_pagerank(const CudaLaunch& launch, const PageRankBuffers& buffers, double damping,
                     uint64_t nodes_per_item);

// Image tasks: phase launch.ctx.phase of make_gaussian_blur_task / make_resize_task.
void launch_gaussian_blur(const CudaLaunch& launch, const ImageShape& shape, uintptr_t in,
                          uintptr_t tmp, uintptr_t out, uintptr_t weights, int radius,
                          uint64_t rows_per_item);
void launch_resize(const CudaLaunch& launch, const ImageShape& shape, uintptr_t in, uintptr_t out,
                   uint64_t rows_per_item);

}  // namespace freeride::kernels
