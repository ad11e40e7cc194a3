#include "graph_layout.hpp"

#include <vector>

#include "check.hpp"

namespace freeride {

void csr_transpose(const int64_t* indptr, const int64_t* indices, int64_t n, int64_t edges,
                   int64_t* in_indptr, int64_t* in_indices) {
  FR_ARG(n >= 1, "a graph needs at least 1 node, got " << n);
  FR_ARG(indptr[0] == 0 && indptr[n] == edges,
         "indptr must run from 0 to the edge count " << edges << ", got " << indptr[0]
                                                     << " to " << indptr[n]);
  for (int64_t v = 0; v <= n; ++v) in_indptr[v] = 0;
  for (int64_t e = 0; e < edges; ++e) {
    const int64_t dst = indices[e];
    FR_ARG(dst >= 0 && dst < n, "indices must be in [0, " << n << "), found " << dst);
    ++in_indptr[dst + 1];
  }
  for (int64_t v = 0; v < n; ++v) in_indptr[v + 1] += in_indptr[v];
  std::vector<int64_t> next(in_indptr, in_indptr + n);
  for (int64_t src = 0; src < n; ++src) {
    const int64_t begin = indptr[src];
    const int64_t end = indptr[src + 1];
    FR_ARG(begin <= end, "indptr must be non-decreasing; indptr[" << src + 1 << "] < indptr["
                                                                  << src << "]");
    FR_ARG(end <= edges, "indptr[" << src + 1 << "] (" << end << ") exceeds the edge count "
                                   << edges);
    for (int64_t e = begin; e < end; ++e) in_indices[next[indices[e]]++] = src;
  }
}

}  // namespace freeride
