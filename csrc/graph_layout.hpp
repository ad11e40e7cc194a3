// Graph layouts the built-in graph tasks need, made on the host before upload.
#pragma once

#include <cstdint>

namespace freeride {

// The in-links of a directed graph given by its out-links in CSR form (`indptr`: n + 1
// offsets, `indices`: the edges' destinations, each in [0, n)): CSC as `in_indptr`
// (n + 1) and `in_indices` (the edges' sources, grouped by destination; within one, in the
// order of the out-links, as a stable sort of `indices` would give). A counting sort,
// O(n + edges): a stable comparison sort of a million edges took a quarter of a second
// of every PageRank's submit. Throws InvalidArgument on offsets or destinations out of
// range.
void csr_transpose(const int64_t* indptr, const int64_t* indices, int64_t n, int64_t edges,
                   int64_t* in_indptr, int64_t* in_indices);

}  // namespace freeride
