"""What every side task gives the harvester: a core task plus how to read its result."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._C import unbuilt_task


class BoundTask:
    """A task bound to one harvester: the core task, its result reader, and references
    to every buffer the core uses (they must outlive the task)."""

    def __init__(
        self, core: Any, result: Callable[[], Any] = lambda: None, keep: Sequence[Any] = ()
    ) -> None:
        self.core = core
        self._result = result
        self.keep = tuple(keep)

    def result(self) -> Any:
        return self._result()


class Task:
    """Base class of the side tasks built from preemptible items."""

    def _build(self, kind: str, device: int) -> BoundTask:
        """Validates the task against a harvester's backend `kind` ("host" or "cuda") and
        `device` (the CUDA ordinal; -1 on the host) and creates the core task."""
        raise TypeError(
            f"{type(self).__name__} builds no side task: submit one of fr.tasks' tasks "
            "(Spin, Saxpy, PageRank, ...), a RawKernel, or a Task subclass that builds one"
        )

    def _memory_need(self, kind: str, device: int) -> int | None:
        """The `memory_bytes` _build would give the core on backend `kind` and `device`,
        told before anything is allocated, after the checks of the task's inputs that
        need no allocation (bad input is reported as such, not as over the budget); None
        where it cannot be told without building (the task is then built, and the
        executor checks what it holds). A task needing more than the harvester's whole
        budget is refused without its buffers being made: on a GPU they would take
        memory training may need."""
        return None

    def _work(self) -> tuple[int, int]:
        """(phases, items a phase) of the core _build would make, for the handle of a
        task refused before it was built (a task with _memory_need has them)."""
        raise NotImplementedError


def build_within(task: Task, kind: str, device: int, budget: int) -> BoundTask:
    """`task` built for a harvester of backend `kind` on `device` whose memory budget is
    `budget` bytes (0: none); where it needs more than the whole budget (as far as
    _memory_need tells), an unbuilt placeholder of the same phases and items that the
    executor fails at submit, with nothing allocated."""
    need = task._memory_need(kind, device) if budget else None
    if need is not None and need > budget:
        return BoundTask(unbuilt_task(type(task).__name__, need, *task._work()))
    return task._build(kind, device)


def zeros(
    shape: tuple[int, ...], dtype: str, kind: str, device: int, library: str = "torch"
) -> tuple[Any, int]:
    """A zeroed buffer on the harvester's device and its address: numpy on the host,
    torch (or CuPy) on a GPU; CuPy first with `library` "cupy" (an output that follows a
    CuPy input)."""
    if kind == "host":
        arr = np.zeros(shape, dtype=dtype)
        return arr, int(arr.ctypes.data)
    if library != "cupy":
        try:
            import torch

            arr = torch.zeros(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")
            return arr, int(arr.data_ptr())
        except ImportError:
            pass
    cupy = sys.modules.get("cupy")
    if cupy is None:
        try:
            import cupy
        except ImportError:
            raise ImportError("buffers on a GPU need torch or cupy; install one of them") from None
    with cupy.cuda.Device(device):
        arr = cupy.zeros(shape, dtype=dtype)
    return arr, int(arr.data.ptr)


def upload(arr: np.ndarray, kind: str, device: int) -> tuple[Any, int]:
    """A copy of a host array on the harvester's device, and its address."""
    buf, ptr = zeros(arr.shape, arr.dtype.name, kind, device)
    if kind == "host":
        buf[...] = arr
    elif hasattr(buf, "copy_"):
        import torch

        buf.copy_(torch.from_numpy(np.ascontiguousarray(arr)))
    else:
        buf.set(np.ascontiguousarray(arr))
    return buf, ptr


def to_numpy(arr: Any) -> np.ndarray:
    """Host copy of a buffer made by zeros()."""
    if isinstance(arr, np.ndarray):
        return arr.copy()
    if hasattr(arr, "cpu"):
        return arr.cpu().numpy()
    return arr.get()


def describe(task: Any, **fields: Any | None) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return f"{type(task).__name__}({inner})"
