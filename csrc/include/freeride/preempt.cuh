// freeride's item protocol for preemptible kernels. A user kernel writes only the body
// of one item:
//
//   #include <freeride/preempt.cuh>
//   extern "C" __global__ void scale(fr_item_ctx ctx, float* x, float a, unsigned long long n) {
//     freeride::for_each_item(ctx, [&](unsigned long long item) {
//       unsigned long long i = item * blockDim.x + threadIdx.x;
//       if (i < n) x[i] *= a;
//     });
//   }
//
// Before claiming each item, the block's leader reads the gate (and the phase's stop
// flag); if side work must not run, the whole block exits. A claimed item always runs
// to completion, so an exited kernel has lost nothing and the next launch of the same
// phase resumes at the next unclaimed item: every item runs exactly once.
#pragma once

#include "item_ctx.h"

namespace freeride {

constexpr unsigned long long kNoItem = ~0ull;

__device__ __forceinline__ bool leader_thread() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// May side work start now? One volatile read each of the gate and the stop flag, by the
// block's leader only (claim_item), once per item: the other threads learn the answer
// through shared memory. Volatile loads skip L1, so the gate is read from L2 (device
// memory, where a close written on the training stream lands first). A harvester made
// with gate_in_host_memory=True hands kernels the mapped host word instead: then each
// read crosses the bus, still one per block per item (a close there is a host store, or a
// stream write into host memory, with nothing on the device to copy it to).
__device__ __forceinline__ bool may_run(const fr_item_ctx& ctx) {
  return *ctx.gate == FREERIDE_GATE_OPEN &&
         *reinterpret_cast<volatile unsigned int*>(&ctx.state->stop) == 0u;
}

// %globaltimer: nanoseconds, the same clock on every SM.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Leader only: claim the next item, or kNoItem when paused, out of time or the phase is
// drained. A block held back by the gate, the stop flag or the end of its time slice
// says so in `held` (once, as it exits). The slice bounds every launch even while the
// gate stays open: a device-wide synchronisation (torch.cuda.synchronize, cudaFree)
// then waits at most a slice, and between launches the executor may pick another task.
__device__ __forceinline__ unsigned long long claim_item(const fr_item_ctx& ctx,
                                                         unsigned long long started_ns) {
  if (!may_run(ctx) ||
      (ctx.slice_ns != 0ull && globaltimer_ns() - started_ns >= ctx.slice_ns)) {
    atomicAdd(&ctx.state->held, 1u);
    return kNoItem;
  }
  const unsigned long long item = atomicAdd(&ctx.state->next, 1ull);
  return item < ctx.n_items ? item : kNoItem;
}

// Leader only, after the whole block finished an item: publish its completion. The
// fence orders the item's writes before the count that lets the host start the next phase.
__device__ __forceinline__ void finish_item(const fr_item_ctx& ctx) {
  __threadfence_system();
  const unsigned long long done = atomicAdd(&ctx.state->done, 1ull) + 1ull;
  if (ctx.progress != nullptr) {
    // Stores from different blocks may land out of order; the host takes the maximum.
    *ctx.progress = done;
  }
}

// Runs body(item) for every item this block claims until the gate closes, the phase is
// stopped, the launch's time slice ends or no item is left. Every thread of the block must call it (it synchronises).
//
// A context without phase state (ctx.state == 0) runs the kernel plain: every item, in a
// grid-stride loop, with no gate, claims or counters. The item-overhead benchmark
// compares the two modes of the same kernel this way.
template <typename Body>
__device__ __forceinline__ void for_each_item(const fr_item_ctx& ctx, Body&& body) {
  if (ctx.state == 0) {
    for (unsigned long long item = blockIdx.x; item < ctx.n_items; item += gridDim.x) {
      body(item);
      __syncthreads();  // as between claimed items: the body may reuse shared memory
    }
    return;
  }
  __shared__ unsigned long long s_item;
  const unsigned long long started_ns = leader_thread() ? globaltimer_ns() : 0ull;
  while (true) {
    if (leader_thread()) s_item = claim_item(ctx, started_ns);
    __syncthreads();
    const unsigned long long item = s_item;
    if (item == kNoItem) return;  // uniform across the block
    body(item);
    __syncthreads();  // the item is complete, and s_item may be overwritten
    if (leader_thread()) finish_item(ctx);
  }
}

}  // namespace freeride
