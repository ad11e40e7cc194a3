"""PageRank over a directed graph, as a preemptible multi-phase side task."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import check_dense
from .._C import csr_transpose, pagerank_task
from .._checks import check_count, check_float
from ._base import BoundTask, Task, describe, to_numpy, upload, zeros

# Nodes per item: a few microseconds of work for a block on a GPU.
_NODES_PER_ITEM = 2048
_INT64_MAX = 2**63 - 1


def _host_int_array(x: Any, name: str) -> np.ndarray:
    """A 1-D integer array on the host (torch tensors are copied there for validation)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        check_dense(x, name)
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        x = x.get()
    elif not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(x).__name__}")
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
    # Past int64's range an unsigned value would wrap to a negative one, and the error
    # would name a value the caller never passed.
    if x.dtype.kind == "u" and x.size and int(x.max()) > _INT64_MAX:
        raise ValueError(f"{name} must fit in int64 (at most {_INT64_MAX}), found {int(x.max())}")
    return x.astype(np.int64, copy=False)


class PageRank(Task):
    """PageRank of a directed graph in CSR form whose row i lists the out-links of node i
    (`indptr`, `indices` as torch tensors or numpy arrays, or a scipy.sparse matrix as
    `indptr`). Dangling nodes spread their rank uniformly; parallel edges count each.
    `iters` power iterations, two preemptible phases each. The result is float64 ranks
    summing to 1 (a torch tensor on the harvester's device when the input was torch)."""

    def __init__(
        self,
        indptr: Any,
        indices: Any = None,
        *,
        iters: int = 20,
        damping: float = 0.85,
        nodes_per_item: int | None = None,
    ) -> None:
        if hasattr(indptr, "tocsr"):  # scipy.sparse
            if indices is not None:
                raise TypeError("pass either a scipy.sparse matrix or (indptr, indices)")
            csr = indptr.tocsr()
            if csr.shape[0] != csr.shape[1]:
                raise ValueError(f"the adjacency matrix must be square, got {csr.shape}")
            indptr, indices = csr.indptr, csr.indices
        elif indices is None:
            raise TypeError("indices is required with indptr")
        self._torch_input = type(indptr).__module__.startswith("torch")
        self.indptr = _host_int_array(indptr, "indptr")
        self.indices = _host_int_array(indices, "indices")
        self.iters = check_count(iters, "iters", 1, 100_000)
        self.damping = check_float(damping, "damping")
        if not 0.0 <= self.damping <= 1.0:
            raise ValueError(f"damping must be in [0, 1], got {self.damping}")
        self.nodes_per_item = (
            _NODES_PER_ITEM
            if nodes_per_item is None
            else check_count(nodes_per_item, "nodes_per_item")
        )
        self._validate()

    def _validate(self) -> None:
        ptr, idx = self.indptr, self.indices
        if ptr.size < 2:
            raise ValueError("indptr must have at least 2 entries (a graph of at least 1 node)")
        if ptr[0] != 0:
            raise ValueError(f"indptr[0] must be 0, got {ptr[0]}")
        if np.any(np.diff(ptr) < 0):
            first = int(np.argmax(np.diff(ptr) < 0))
            raise ValueError(
                f"indptr must be non-decreasing; indptr[{first + 1}] < indptr[{first}]"
            )
        if ptr[-1] != idx.size:
            raise ValueError(f"indptr[-1] ({ptr[-1]}) must equal len(indices) ({idx.size})")
        n = ptr.size - 1
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise ValueError(f"indices must be in [0, {n}) (the node count); found {bad}")

    @property
    def n(self) -> int:
        return self.indptr.size - 1

    def _work(self) -> tuple[int, int]:
        # two phases an iteration, each over every node, nodes_per_item an item
        return 2 * self.iters, -(-self.n // self.nodes_per_item)

    def _memory_need(self, kind: str, device: int) -> int:
        # int64 in-links (n + 1 offsets, at least one index), float64 inverse out-degrees,
        # two rank vectors and the contributions, and one dangling sum an iteration.
        return 8 * ((self.n + 1) + max(1, int(self.indices.size)) + 4 * self.n + self.iters)

    def _build(self, kind: str, device: int) -> BoundTask:
        n, ptr, idx = self.n, self.indptr, self.indices
        # Pull needs in-links: the CSC of the same graph, built once on the host.
        in_indptr, in_indices = csr_transpose(ptr, idx)
        outdeg = np.diff(ptr).astype(np.float64)
        inv = np.divide(1.0, outdeg, out=np.zeros(n), where=outdeg > 0)
        bufs = {
            "in_indptr": upload(in_indptr, kind, device),
            "in_indices": upload(
                in_indices if in_indices.size else np.zeros(1, np.int64), kind, device
            ),
            "inv_outdeg": upload(inv, kind, device),
            "rank_a": upload(np.full(n, 1.0 / n), kind, device),
            "rank_b": zeros((n,), "float64", kind, device),
            "contrib": zeros((n,), "float64", kind, device),
            "dangling": zeros((self.iters,), "float64", kind, device),
        }
        core = pagerank_task(
            n,
            *(
                bufs[k][1]
                for k in (
                    "in_indptr",
                    "in_indices",
                    "inv_outdeg",
                    "rank_a",
                    "rank_b",
                    "contrib",
                    "dangling",
                )
            ),
            self.iters,
            self.damping,
            self.nodes_per_item,
        )
        core.memory_bytes = self._memory_need(kind, device)
        final = bufs["rank_a" if self.iters % 2 == 0 else "rank_b"][0]

        def result() -> Any:
            if self._torch_input:
                import torch

                return (
                    final.clone()
                    if isinstance(final, torch.Tensor)
                    else torch.from_numpy(final.copy())
                )
            return to_numpy(final)

        return BoundTask(core, result, keep=tuple(b[0] for b in bufs.values()))

    def __repr__(self) -> str:
        return describe(
            self, nodes=self.n, edges=int(self.indices.size), iters=self.iters, damping=self.damping
        )
