// ItemCounter: the test probe for the exactly-once and phase-ordering rules. It mirrors
// ItemCounterTask::run_item in builtin_tasks.cpp, one leader thread per item.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "freeride/preempt.cuh"
#include "common.cuh"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

constexpr int kThreads = 256;

template <bool kPhases>
__global__ void __launch_bounds__(kThreads)
    item_counter_kernel(fr_item_ctx ctx, unsigned int* counts, unsigned long long* phase_done,
                        unsigned long long* violations, unsigned long long* times,
                        unsigned long long items_per_phase, unsigned long long ns) {
  each_item<kPhases>(ctx, [&](unsigned long long phase, unsigned long long item) {
    if (!freeride::leader_thread()) return;
    const unsigned long long slot = phase * items_per_phase + item;
    if (times != nullptr) times[2 * slot] = globaltimer_ns();
    if (phase > 0) {
      // Written by earlier launches or, with device phases, by other blocks of this one
      // before for_each_phase_item let this phase begin; volatile so the read is not
      // served from a stale L1 line.
      const unsigned long long prev =
          *reinterpret_cast<volatile unsigned long long*>(&phase_done[phase - 1]);
      if (prev != items_per_phase) atomicAdd(violations, 1ull);
    }
    atomicAdd(&counts[slot], 1u);
    if (ns > 0) {
      const unsigned long long start = globaltimer_ns();
      while (globaltimer_ns() - start < ns) {
      }
    }
    if (times != nullptr) times[2 * slot + 1] = globaltimer_ns();
    // The count above must be visible before this item is reported as finished.
    __threadfence();
    atomicAdd(&phase_done[phase], 1ull);
  });
}

}  // namespace

void preload_item_counter_kernels() {
  preload(item_counter_kernel<false>);
  preload(item_counter_kernel<true>);
}

void launch_item_counter(const CudaLaunch& launch, uint32_t* counts,
                         unsigned long long* phase_done, unsigned long long* violations,
                         unsigned long long* times, uint64_t items_per_phase,
                         uint64_t ns_per_item) {
  FR_ARG(launch.ctx.state != nullptr && launch.ctx.gate != nullptr,
         "ItemCounter: launch context lacks gate or phase state");
  FR_ARG(counts != nullptr && phase_done != nullptr && violations != nullptr,
         "ItemCounter: counter buffers must not be null");
  // Item indices index counts[phase * items_per_phase + item]: more items would write past
  // the row of their phase. With device phases a launch's items are every phase's.
  const uint64_t per_phase = grid_items(launch.ctx);  // one phase's
  FR_ARG(per_phase <= items_per_phase,
         "ItemCounter: phase has " << per_phase << " items, more than items_per_phase "
                                   << items_per_phase);
  auto* kernel =
      launch.ctx.phase_items != 0 ? item_counter_kernel<true> : item_counter_kernel<false>;
  const unsigned int blocks = persistent_grid(kernel, kThreads, launch, grid_items(launch.ctx));
  kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(launch.stream)>>>(
      launch.ctx, counts, phase_done, violations, times, items_per_phase, ns_per_item);
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
