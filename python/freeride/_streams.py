"""Turning the ``stream`` argument of gate writes into a CUDA stream handle, and what a
handle's state allows (a stream being captured into a CUDA graph)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ._C import IMMEDIATE, _stream_is_capturing
from .errors import StreamCaptureError

# The only stream handles that mean the same in every process: the default stream (0),
# cudaStreamLegacy (1) and cudaStreamPerThread (2). Any other int is a pointer nothing can
# check, and a wrong one crashes the driver instead of raising an error.
SPECIAL_HANDLES = (0, 1, 2)

_SPECIALS = "0 (default stream), 1 (cudaStreamLegacy), 2 (cudaStreamPerThread)"
_OBJECTS = f"a torch.cuda.Stream, a CuPy stream, or one of the special handles {_SPECIALS}"
STREAM_ARG = f"None (the current stream), 'host', {_OBJECTS}"
STREAM_TO_FOLLOW = f"None, {_OBJECTS}"


def check_stream(stream: Any, *, host: bool) -> None:
    """Refuses a `stream` argument that is wrong on every backend alike, before anything
    looks at a device: TypeError for what is no stream, ValueError for a value that
    cannot be one. `host`: whether "host" (write immediately) is allowed, as it is for
    gate writes; a stream to follow (submit) can be no string at all."""
    expected = STREAM_ARG if host else STREAM_TO_FOLLOW
    if isinstance(stream, str):
        if host and stream == "host":
            return
        if host:
            raise ValueError(f"stream must be {expected}; got {stream!r}")
        raise TypeError(f"stream must be {expected}; got the string {stream!r}")
    if isinstance(stream, bool):
        raise TypeError(f"stream must be {expected}; got a bool")
    if isinstance(stream, int):
        if stream not in SPECIAL_HANDLES:
            raise ValueError(
                f"stream={stream} is a raw stream handle freeride cannot check; pass the "
                "stream object instead (torch.cuda.ExternalStream(handle) or "
                f"cupy.cuda.ExternalStream(handle) wraps a raw handle), or one of the special "
                f"handles {_SPECIALS}"
            )
        return
    if stream is not None and _handle_of(stream) is None:
        raise TypeError(f"stream must be {expected}; got {type(stream).__name__}")


def stream_handle(stream: Any, kind: str, device: int, *, host: bool = True) -> int:
    """The handle to write the gate on (or to follow), or IMMEDIATE for an immediate
    write; check_stream() first, so every backend refuses the same arguments alike."""
    check_stream(stream, host=host)
    if kind == "host" or isinstance(stream, str):  # "host", the only string check_stream lets by
        # The host backend has no streams: its compute is synchronous, so now is in order.
        return IMMEDIATE
    if stream is None:
        return current_stream(device)
    if isinstance(stream, int):
        return stream
    stream_device = _device_of(stream)
    if stream_device is not None and stream_device != device:
        raise ValueError(f"stream is on cuda:{stream_device} but the harvester is on cuda:{device}")
    return _handle_of(stream)


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


# (torch module, its raw current-stream getter) once that torch has initialised CUDA: the
# gate asks for the current stream at every write on the training thread, and
# torch.cuda.is_available() (an environment lookup and a device count) followed by
# torch.cuda.current_stream() (a Stream object built, then its handle read) cost it
# microseconds where the getter is one call (what torch's compiled code calls,
# torch._C._cuda_getCurrentRawStream). Keyed on the module, so that a torch put in
# sys.modules later (tests' stand-ins) is asked itself.
_raw_getter: tuple[Any, Callable[[int], int]] | None = None


def current_stream(device: int) -> int:
    """Handle of the caller's current stream on `device` (torch's, else CuPy's, else the
    legacy default stream)."""
    global _raw_getter
    torch = sys.modules.get("torch")
    cached = _raw_getter
    if cached is not None and cached[0] is torch:
        return cached[1](device)
    if torch is not None and torch.cuda.is_available():
        handle = int(torch.cuda.current_stream(device).cuda_stream)
        getter = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        # current_stream() above initialised torch's CUDA (the getter does not).
        if getter is not None and torch.cuda.is_initialized():
            _raw_getter = (torch, getter)
        return handle
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return _cupy_current_stream(cupy, device)
    return 0  # the legacy default stream


def current_streams(device: int) -> list[int]:
    """Every stream a caller's inputs may still be written on: torch's current stream
    and, where CuPy is loaded and its current stream on `device` is another, CuPy's (a
    CuPy producer on a non-default stream while torch's current stream is the default)."""
    handles = [current_stream(device)]
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        handle = _cupy_current_stream(cupy, device)
        if handle not in handles:
            handles.append(handle)
    return handles


def _cupy_current_stream(cupy: Any, device: int) -> int:
    with cupy.cuda.Device(device):
        return int(cupy.cuda.get_current_stream().ptr)


_SPECIAL_NAMES = {
    0: "the default stream (0)",
    1: "cudaStreamLegacy (1)",
    2: "cudaStreamPerThread (2)",
}


# stream_is_capturing(handle, device): True while the CUDA stream `handle` of `device` is
# being captured into a graph (the legacy default stream also while another blocking
# stream captures); CUDA only. The binding itself (it returns a bool), not a wrapper: the
# gate asks before every recorded write on the training thread.
stream_is_capturing = _stream_is_capturing


def refuse_capturing(handles: list[int], device: int) -> None:
    """Raises StreamCaptureError if any of the CUDA stream `handles` is being captured.

    A task follows its submitter's streams by recording an event on each and making the
    side stream wait for it: on a capturing stream that record becomes a node of the
    user's graph and the side stream joins the capture, so side work would be replayed
    with the graph, and the capture would end unjoined (an error at its end)."""
    for handle in handles:
        if stream_is_capturing(handle, device):
            name = _SPECIAL_NAMES.get(handle, f"stream {handle:#x}")
            raise StreamCaptureError(
                f"{name} on cuda:{device} is being captured into a CUDA graph: submit() "
                "during graph capture is not supported (the side stream would become part "
                "of the graph). Submit the task before the capture begins or after it ends."
            )
