"""Turning the ``stream`` argument of gate writes into a CUDA stream handle."""

from __future__ import annotations

import sys
from typing import Any

from . import _C

STREAM_ARG = "None (current stream), 'host', an int handle, a torch.cuda.Stream or a cupy Stream"


def stream_handle(stream: Any, kind: str, device: int) -> int:
    """The handle to write the gate on, or _C.IMMEDIATE for an immediate write."""
    if isinstance(stream, str):
        if stream == "host":
            return _C.IMMEDIATE
        raise ValueError(f"stream must be {STREAM_ARG}; got {stream!r}")
    if isinstance(stream, bool):
        raise TypeError(f"stream must be {STREAM_ARG}; got a bool")
    if isinstance(stream, int) and not 0 <= stream < 2**64 - 1:
        raise ValueError(f"stream handle must be a non-negative 64-bit integer, got {stream}")
    if kind == "host":
        # The host backend has no streams: its compute is synchronous, so now is in order.
        if stream is None or isinstance(stream, int) or _handle_of(stream) is not None:
            return _C.IMMEDIATE
        raise TypeError(f"stream must be {STREAM_ARG}; got {type(stream).__name__}")
    if stream is None:
        return current_stream(device)
    if isinstance(stream, int):
        return stream
    handle = _handle_of(stream)
    if handle is None:
        raise TypeError(f"stream must be {STREAM_ARG}; got {type(stream).__name__}")
    stream_device = _device_of(stream)
    if stream_device is not None and stream_device != device:
        raise ValueError(f"stream is on cuda:{stream_device} but the harvester is on cuda:{device}")
    return handle


def _handle_of(stream: Any):
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "ptr") and type(stream).__module__.startswith("cupy"):
        return int(stream.ptr)
    return None


def _device_of(stream: Any):
    dev = getattr(stream, "device", None)
    if dev is not None and getattr(dev, "type", None) == "cuda":
        return dev.index if dev.index is not None else 0
    device_id = getattr(stream, "device_id", None)
    return int(device_id) if isinstance(device_id, int) else None


def current_stream(device: int) -> int:
    """Handle of the caller's current stream on `device` (torch's, else CuPy's, else the
    legacy default stream)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_stream(device).cuda_stream)
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return int(cupy.cuda.get_current_stream().ptr)
    return 0  # the legacy default stream
