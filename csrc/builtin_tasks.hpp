// The built-in tasks of the core: each has a host item function and a CUDA launcher.
// Pointers refer to memory on the harvester's device; the Python layer validates them.
#pragma once

#include <cstdint>
#include <memory>

#include "task.hpp"

namespace freeride {

// Every item busy-waits ns_per_item nanoseconds (globaltimer on the GPU). slice_blocks > 0
// turns the CUDA kernel into the kernel-slicing baseline of the benchmarks: each launch is
// a non-preemptible slice of up to slice_blocks blocks, one item each, that ignores the gate.
std::shared_ptr<Task> make_spin_task(uint64_t items, uint64_t phases, uint64_t ns_per_item,
                                     uint64_t slice_blocks);

// y += a * x over n elements of dtype (0 = float32, 1 = float64), `chunk` elements an item.
std::shared_ptr<Task> make_saxpy_task(double a, uintptr_t x, uintptr_t y, uint64_t n,
                                      uint64_t chunk, int dtype);

// Test probe for the item protocol: counts is uint32[phases * items], phase_done and
// violations are uint64[phases] and uint64[1], all zeroed by the caller. Item
// (fail_phase, fail_item) throws, to test failure handling (-1: none; host backend only).
// times (0: none) is uint64[phases * items * 2]: each item's start and end, steady-clock
// ns on the host, %globaltimer ns on a GPU.
std::shared_ptr<Task> make_item_counter_task(uint64_t items, uint64_t phases, uintptr_t counts,
                                             uintptr_t phase_done, uintptr_t violations,
                                             uintptr_t times, uint64_t ns_per_item,
                                             int64_t fail_phase, int64_t fail_item);

// PageRank by pull over in-links, two phases per iteration: phase 2k computes every
// node's contribution rank[u] * inv_outdeg[u] and adds the rank of dangling nodes
// (inv_outdeg 0) to dangling[k]; phase 2k+1 sets next[v] = (1 - d) / n + d * (sum of
// in-neighbours' contributions + dangling[k] / n). Iteration k reads ranks[k % 2] and
// writes ranks[(k + 1) % 2]. All arrays are on the harvester's device, in CSC form
// (in_indptr: n + 1 int64, in_indices: int64), doubles otherwise; dangling is zeroed.
struct PageRankBuffers {
  uint64_t n = 0;
  uintptr_t in_indptr = 0, in_indices = 0, inv_outdeg = 0;
  uintptr_t rank_a = 0, rank_b = 0, contrib = 0, dangling = 0;
};
std::shared_ptr<Task> make_pagerank_task(const PageRankBuffers& buffers, uint64_t iters,
                                         double damping, uint64_t nodes_per_item);

// Image batches: `planes` planes (N * C) of h x w pixels, contiguous; dtype 0 = uint8,
// 1 = float32 for input and output. An item is `rows` output rows of one plane.
struct ImageShape {
  uint64_t planes = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int dtype = 0;
};

// Separable Gaussian blur (reflect borders, as scipy.ndimage's default): phase 0 filters
// rows into `tmp` (float32, same shape), phase 1 filters columns into `out`. `weights`
// holds 2 * radius + 1 normalised float taps on the harvester's device.
std::shared_ptr<Task> make_gaussian_blur_task(const ImageShape& shape, uintptr_t in, uintptr_t tmp,
                                              uintptr_t out, uintptr_t weights, int radius,
                                              uint64_t rows_per_item);

// Bilinear resize with align_corners=False (torch.nn.functional.interpolate's).
std::shared_ptr<Task> make_resize_task(const ImageShape& shape, uintptr_t in, uintptr_t out,
                                       uint64_t rows_per_item);

}  // namespace freeride
