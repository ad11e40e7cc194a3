"""Saxpy: y += a * x, a memory-bound side task."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import as_array
from .._C import saxpy_task
from .._checks import check_count, check_float
from ._base import BoundTask, Task, describe

# Bytes of x per item: small enough that an item takes microseconds even when every
# resident block shares the memory bandwidth, large enough to amortise the claim.
_ITEM_BYTES = 16384
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Saxpy(Task):
    """y += a * x over float32 or float64 tensors of the same size, in place.

    `chunk` is the number of elements per item (default: 16 KiB of x). The result is y.
    """

    def __init__(self, a: float, x: Any, y: Any, chunk: int | None = None) -> None:
        self.a = check_float(a, "a")
        self.x = x
        self.y = y
        self.chunk = None if chunk is None else check_count(chunk, "chunk")

    def _build(self, kind: str, device: int) -> BoundTask:
        x = as_array(self.x, "x", kind, device)
        y = as_array(self.y, "y", kind, device, writable=True)
        if x.dtype != y.dtype:
            raise TypeError(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
        # The kernels take `a` in the arrays' dtype: a float32 past its range is inf, and
        # every result with it.
        if x.dtype == "float32" and abs(self.a) > _FLOAT32_MAX:
            raise ValueError(f"a must be within float32's range for float32 arrays, got {self.a}")
        if x.size != y.size:
            raise ValueError(
                f"x and y must have the same number of elements, got {x.size} and {y.size}"
            )
        # Items run in any order: where y's elements are also x's, each result would
        # depend on whether the item holding its x ran first.
        if x.ptr < y.ptr + y.nbytes and y.ptr < x.ptr + x.nbytes:
            raise ValueError("x and y must not share memory (they overlap)")
        itemsize = x.nbytes // x.size
        chunk = self.chunk or max(1, _ITEM_BYTES // itemsize)
        core = saxpy_task(self.a, x.ptr, y.ptr, x.size, chunk, 0 if x.dtype == "float32" else 1)
        core.memory_bytes = x.nbytes + y.nbytes
        return BoundTask(core, lambda: self.y, keep=(x, y))

    def __repr__(self) -> str:
        try:  # (a nested tensor's shape raises: submit names the task before checking it)
            shape = tuple(self.x.shape)
        except Exception:  # noqa: BLE001
            shape = None
        return describe(self, a=self.a, shape=shape)
