// PageRank as a preemptible task: two phases per iteration (contributions and dangling
// mass, then the pull over in-links), items of `nodes_per_item` nodes, as many in every
// phase (so one launch may serve them all: device phases). Mirrors PageRankTask::run_item
// in builtin_tasks.cpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "check.hpp"
#include "common.cuh"
#include "freeride/preempt.cuh"
#include "launchers.hpp"

namespace freeride::kernels {
namespace {

constexpr int kThreads = 256;

// One item of each phase, for the two kernels below and the one of device phases.

// Contributions and dangling mass of `per_item` nodes. Every thread of the block (it
// synchronises); `lost` is the block's shared scratch.
__device__ __forceinline__ void contributions_item(unsigned long long item, const double* rank,
                                                   const double* inv_outdeg, double* contrib,
                                                   double* dangling_k, unsigned long long n,
                                                   unsigned long long per_item, double* lost) {
  const unsigned long long begin = item * per_item;
  const unsigned long long end = (n - begin < per_item) ? n : begin + per_item;
  double mine = 0.0;
  for (unsigned long long u = begin + threadIdx.x; u < end; u += blockDim.x) {
    const double r = rank[u];
    contrib[u] = r * inv_outdeg[u];
    if (inv_outdeg[u] == 0.0) mine += r;
  }
  for (int off = 16; off > 0; off /= 2) mine += __shfl_down_sync(0xffffffffu, mine, off);
  if (threadIdx.x % 32 == 0) lost[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += lost[w];
    if (total != 0.0) atomicAdd(dangling_k, total);
  }
}

// The pull over in-links of `per_item` nodes.
__device__ __forceinline__ void pull_item(unsigned long long item, const int64_t* indptr,
                                          const int64_t* indices, const double* contrib,
                                          const double* dangling_k, double* next,
                                          unsigned long long n, unsigned long long per_item,
                                          double damping) {
  const unsigned long long begin = item * per_item;
  const unsigned long long end = (n - begin < per_item) ? n : begin + per_item;
  const double nd = static_cast<double>(n);
  const double base = (1.0 - damping) / nd + damping * (*dangling_k) / nd;
  for (unsigned long long v = begin + threadIdx.x; v < end; v += blockDim.x) {
    double sum = 0.0;
    for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) sum += contrib[indices[e]];
    next[v] = base + damping * sum;
  }
}

__global__ void __launch_bounds__(kThreads)
    contributions(fr_item_ctx ctx, const double* rank, const double* inv_outdeg, double* contrib,
                  double* dangling_k, unsigned long long n, unsigned long long per_item) {
  __shared__ double lost[kThreads / 32];
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    contributions_item(item, rank, inv_outdeg, contrib, dangling_k, n, per_item, lost);
  });
}

__global__ void __launch_bounds__(kThreads)
    pull(fr_item_ctx ctx, const int64_t* indptr, const int64_t* indices, const double* contrib,
         const double* dangling_k, double* next, unsigned long long n, unsigned long long per_item,
         double damping) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    pull_item(item, indptr, indices, contrib, dangling_k, next, n, per_item, damping);
  });
}

// Device phases (csrc/device_phases.hpp): every phase from one launch, phase p being
// iteration p / 2's contributions (p even) or pull (p odd). What a phase reads of the one
// before (contrib, the dangling mass, the ranks) it reads with plain loads: those buffers
// change during the launch.
__global__ void __launch_bounds__(kThreads)
    iterations(fr_item_ctx ctx, double* rank_a, double* rank_b, const double* inv_outdeg,
               double* contrib, double* dangling, const int64_t* indptr, const int64_t* indices,
               unsigned long long n, unsigned long long per_item, double damping) {
  __shared__ double lost[kThreads / 32];
  freeride::for_each_phase_item(ctx, [&](unsigned long long phase, unsigned long long item) {
    const unsigned long long k = phase / 2;
    double* rank = k % 2 == 0 ? rank_a : rank_b;
    double* next = k % 2 == 0 ? rank_b : rank_a;
    if (phase % 2 == 0) {  // uniform across the block: contributions_item synchronises
      contributions_item(item, rank, inv_outdeg, contrib, dangling + k, n, per_item, lost);
    } else {
      pull_item(item, indptr, indices, contrib, dangling + k, next, n, per_item, damping);
    }
  });
}

}  // namespace

void preload_pagerank_kernels() {
  preload(contributions);
  preload(pull);
  preload(iterations);
}

void launch_pagerank(const CudaLaunch& launch, const PageRankBuffers& b, double damping,
                     uint64_t nodes_per_item) {
  check_context(launch, "PageRank");
  auto stream = static_cast<cudaStream_t>(launch.stream);
  if (launch.ctx.phase_items != 0) {
    const unsigned grid = persistent_grid(iterations, kThreads, launch, grid_items(launch.ctx));
    iterations<<<grid, kThreads, 0, stream>>>(
        launch.ctx, reinterpret_cast<double*>(b.rank_a), reinterpret_cast<double*>(b.rank_b),
        reinterpret_cast<const double*>(b.inv_outdeg), reinterpret_cast<double*>(b.contrib),
        reinterpret_cast<double*>(b.dangling), reinterpret_cast<const int64_t*>(b.in_indptr),
        reinterpret_cast<const int64_t*>(b.in_indices), b.n, nodes_per_item, damping);
    FR_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const uint64_t k = launch.ctx.phase / 2;
  const auto* rank = reinterpret_cast<const double*>(k % 2 == 0 ? b.rank_a : b.rank_b);
  auto* next = reinterpret_cast<double*>(k % 2 == 0 ? b.rank_b : b.rank_a);
  auto* contrib = reinterpret_cast<double*>(b.contrib);
  auto* dangling_k = reinterpret_cast<double*>(b.dangling) + k;
  if (launch.ctx.phase % 2 == 0) {
    const unsigned grid = persistent_grid(contributions, kThreads, launch, grid_items(launch.ctx));
    contributions<<<grid, kThreads, 0, stream>>>(launch.ctx, rank,
                                                 reinterpret_cast<const double*>(b.inv_outdeg),
                                                 contrib, dangling_k, b.n, nodes_per_item);
  } else {
    const unsigned grid = persistent_grid(pull, kThreads, launch, grid_items(launch.ctx));
    pull<<<grid, kThreads, 0, stream>>>(launch.ctx, reinterpret_cast<const int64_t*>(b.in_indptr),
                                        reinterpret_cast<const int64_t*>(b.in_indices), contrib,
                                        dangling_k, next, b.n, nodes_per_item, damping);
  }
  FR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace freeride::kernels
