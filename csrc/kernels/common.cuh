// Helpers shared by the built-in kernels: grid sizing and the GPU's nanosecond clock.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "freeride/preempt.cuh"
#include "cuda/launch_shapes.hpp"
#include "cuda/occupancy.hpp"
#include "launchers.hpp"
#include "task.hpp"
#include "test_switches.hpp"

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

using freeride::globaltimer_ns;

// body(phase, item) for every item this block claims: through for_each_phase_item in a
// kernel built for device phases (kPhases), through for_each_item otherwise (its phase
// ctx.phase). Two builds of a kernel rather than one that serves both: device phases
// cost registers (and so resident blocks) that a launch of one phase would pay for too.
template <bool kPhases, typename Body>
__device__ __forceinline__ void each_item(const fr_item_ctx& ctx, Body&& body) {
  if constexpr (kPhases) {
    freeride::for_each_phase_item(ctx, body);
  } else {
    freeride::for_each_item(ctx, [&](unsigned long long item) { body(ctx.phase, item); });
  }
}

// Loads `kernel` into the current context now. CUDA loads kernels lazily by default, and
// a lazy load synchronises the context: at a first launch in the middle of training it
// would wait for every running kernel, side kernels (and through them the gate) included.
// The first place a build without code the driver can run on the device fails (no
// machine code for it and PTX the driver cannot JIT): load_failed words that error.
template <typename Kernel>
void preload(Kernel kernel) {
  cudaFuncAttributes attributes{};
  const cudaError_t err =
      test_switches::fail_kernel_load() == test_switches::KernelLoadFailure::kEverywhere
          ? cudaErrorUnsupportedPtxVersion
          : cudaFuncGetAttributes(&attributes, kernel);
  if (err != cudaSuccess) load_failed(err, "cudaFuncGetAttributes");
}

// Persistent grid: every block resident at once (so each is running and polling the
// gate rather than queued behind the others), no more blocks than items, and never so
// many per SM that the launch's reserve no longer fits beside them: the kernels training
// launches during a bubble must start at once. Also asks for a shared-memory carveout
// that keeps the reserve's shared memory configured next to the side blocks. In a green
// context (green-context reserve) the launch carries no per-SM reserve and the context's
// SM count: the SMs left out of it are the room. What it asks CUDA is asked once per
// backend (launch.shapes): a launch at an open sizes its grid on a training thread.
template <typename Kernel>
unsigned int persistent_grid(Kernel kernel, int threads, const CudaLaunch& launch,
                             uint64_t items, int dynamic_shared_bytes = 0) {
  const void* function = reinterpret_cast<const void*>(kernel);
  int per_sm = cached_occupancy(launch.shapes, function, threads, dynamic_shared_bytes, [&] {
    int blocks = 0;
    FR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads,
                                                                dynamic_shared_bytes));
    return blocks;
  });
  if (launch.reserve.blocks > 0 && launch.sm.threads > 0) {
    const LaunchShapes::Attributes known = cached_attributes(launch.shapes, function, [&] {
      cudaFuncAttributes attributes{};
      FR_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
      return LaunchShapes::Attributes{attributes.numRegs,
                                      static_cast<int>(attributes.sharedSizeBytes)};
    });
    const KernelUse use{threads, known.registers_per_thread,
                        known.static_shared_bytes + dynamic_shared_bytes};
    per_sm = std::min(per_sm, side_blocks_per_sm(launch.sm, launch.reserve, use));
    FR_CHECK(per_sm > 0, "a block of " << threads << " threads does not fit on an SM beside "
                                       "the harvester's reserve");
    const int carveout = carveout_percent(launch.sm, launch.reserve, use, per_sm);
    apply_carveout(launch.shapes, function, carveout, [&](int percent) {
      FR_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
    });
  }
  const uint64_t resident =
      static_cast<uint64_t>(std::max(per_sm, 1)) * static_cast<uint64_t>(std::max(launch.sm_count, 1));
  return static_cast<unsigned int>(std::max<uint64_t>(1, std::min<uint64_t>(resident, items)));
}

}  // namespace freeride::kernels
