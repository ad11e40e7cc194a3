"""Validation of array arguments (torch tensors, numpy arrays, CUDA array interface)
before any pointer reaches the core."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ArrayRef:
    """A validated, contiguous array: its address, length and dtype name."""

    obj: Any
    ptr: int
    size: int
    dtype: str
    nbytes: int


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def as_array(
    x: Any,
    name: str,
    kind: str,
    device: int,
    dtypes: Sequence[str] | None = ("float32", "float64"),
    writable: bool = False,
) -> ArrayRef:
    """Checks that `x` is a non-empty contiguous array of one of `dtypes` on the harvester's
    device (kind "host" or "cuda", index `device`) and returns its address. `dtypes`
    None accepts any dtype."""
    where = "cpu" if kind == "host" else f"cuda:{device}"
    if _is_torch_tensor(x):
        check_dense(x, name)
        dev = x.device
        on_it = (
            dev.type == "cpu"
            if kind == "host"
            else (dev.type == "cuda" and (dev.index or 0) == device)
        )
        if not on_it:
            raise ValueError(f"{name} must be on {where} (the harvester's device), got {dev}")
        dtype = str(x.dtype).replace("torch.", "")
        contiguous = x.is_contiguous()
        if writable and x.requires_grad:
            raise ValueError(f"{name} must not require grad: side tasks write it in place")
        ref = ArrayRef(
            x, int(x.data_ptr()), int(x.numel()), dtype, int(x.numel() * x.element_size())
        )
        # torch keeps no read-only flag: a tensor over a read-only mapping (from_numpy of
        # a memmap opened "r") would fault the side task's first write.
        if writable and kind == "host" and ref.nbytes > 0 and not _host_writable(ref):
            raise ValueError(f"{name} must be writable: its memory is mapped read-only")
    elif isinstance(x, np.ndarray):
        if kind != "host":
            raise ValueError(
                f"{name} is a numpy array (host memory) but the harvester is on {where}"
            )
        dtype = x.dtype.name
        if not x.dtype.isnative:
            raise TypeError(f"{name} must be in this machine's byte order, got dtype {x.dtype.str}")
        contiguous = x.flags.c_contiguous
        if writable and not x.flags.writeable:
            raise ValueError(f"{name} must be writable")
        ref = ArrayRef(x, int(x.ctypes.data), int(x.size), dtype, int(x.nbytes))
    elif hasattr(x, "__cuda_array_interface__"):
        if kind == "host":
            raise ValueError(f"{name} is in CUDA memory but the harvester is on cpu")
        cai = x.__cuda_array_interface__
        dtype = np.dtype(cai["typestr"]).name
        if not np.dtype(cai["typestr"]).isnative:
            raise TypeError(f"{name} must be in this machine's byte order, got {cai['typestr']}")
        size = int(np.prod(cai["shape"])) if cai["shape"] else 1
        itemsize = np.dtype(cai["typestr"]).itemsize
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(cai["shape"], itemsize)
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ValueError(f"{name} must be writable")
        dev = getattr(getattr(x, "device", None), "id", None)
        if isinstance(dev, int) and dev != device:
            raise ValueError(f"{name} must be on {where} (the harvester's device), got cuda:{dev}")
        ref = ArrayRef(x, int(ptr), size, dtype, size * itemsize)
    else:
        raise TypeError(
            f"{name} must be a torch tensor, a numpy array or a CUDA array; got {type(x).__name__}"
        )
    if dtypes is not None and ref.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {ref.dtype}")
    if not contiguous:
        raise ValueError(f"{name} must be contiguous; call .contiguous() first")
    if ref.size <= 0:
        raise ValueError(f"{name} must not be empty")
    return ref


def check_dense(x: Any, name: str) -> None:
    """Refuses a torch tensor whose elements are not laid out densely in its storage (a
    sparse or nested tensor has no single data pointer to hand the core)."""
    layout = getattr(x, "layout", None)
    if layout is not None and str(layout) != "torch.strided":
        raise TypeError(f"{name} must be a dense tensor; got layout {layout} (call .to_dense())")
    if getattr(x, "is_nested", False):  # torch.nested's default layout says strided
        raise TypeError(f"{name} must be a dense tensor, got a nested tensor")


def _host_writable(ref: ArrayRef) -> bool:
    """Whether every page of `ref`'s bytes lies in a writable mapping of this process
    (/proc/self/maps); True where that cannot be read (not Linux)."""
    start, end = ref.ptr, ref.ptr + ref.nbytes
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:
        return True
    covered = start
    for line in lines:
        span, perms = line.split(maxsplit=2)[:2]
        low, high = (int(v, 16) for v in span.split("-"))
        if low <= covered < high:
            if "w" not in perms:
                return False
            covered = high
            if covered >= end:
                return True
    return covered >= end


def _c_strides(shape: Sequence[int], itemsize: int) -> tuple:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))
