"""Resolving the ``device`` argument of a Harvester."""

from __future__ import annotations

import re
from typing import Any

from ._C import backend_info
from .errors import CudaUnavailableError

_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def resolve_device(device: Any) -> tuple[str, int]:
    """Returns ("host", -1) or ("cuda", index) for None/"auto", "cpu", "cuda", "cuda:N",
    an int N or a torch.device."""
    if device is None:
        device = "auto"
    if isinstance(device, bool):
        raise TypeError("device must be 'auto', 'cpu', 'cuda', 'cuda:N' or an int, got a bool")
    if isinstance(device, int):
        return "cuda", _check_cuda(device)
    if not isinstance(device, str):
        if type(device).__module__ == "torch" and type(device).__name__ == "device":
            device = str(device)
        else:
            raise TypeError(
                "device must be 'auto', 'cpu', 'cuda', 'cuda:N', an int or a torch.device; "
                f"got {type(device).__name__}"
            )
    text = device.strip().lower()
    if text == "auto":
        info = backend_info()
        return ("cuda", 0) if info["cuda"] else ("host", -1)
    if text in ("cpu", "host"):
        return "host", -1
    match = _CUDA.match(text)
    if match is None:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {device!r}")
    return "cuda", _check_cuda(int(match.group(1) or 0))


def _check_cuda(index: int) -> int:
    info = backend_info()
    if not info["cuda"]:
        raise CudaUnavailableError(
            f"device cuda:{index} was requested but CUDA is unavailable here: {info['reason']}. "
            "Use device='cpu' (or 'auto') for the host backend."
        )
    count = len(info["devices"])
    if not 0 <= index < count:
        raise ValueError(f"device index must be in [0, {count}), got {index}")
    return index
