"""Resolving the ``device`` argument of a Harvester."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from ._C import backend_info
from .errors import CudaFallbackWarning, CudaUnavailableError
from .info import gpu_unused, kernel_driver_version, torch_gpus

_CUDA = re.compile(r"^cuda(?::(\d+))?$")
# The CUDA version newer driver entry points are hidden above (csrc/cuda/driver.hpp).
_DRIVER_API_MAX = "FREERIDE_DRIVER_API_MAX"
_warned_fallback = False
# Why the CUDA backend "auto" chose could not be made (the driver cannot run the build's
# kernels on the GPU): warned once, and later "auto"s take the host backend at once.
_cuda_unusable: str | None = None


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
        if info["cuda"] and _cuda_unusable is None:
            _check_driver_api_max()
            return "cuda", 0
        if not info["cuda"]:
            _warn_fallback_once(info)
        return "host", -1
    if text in ("cpu", "host"):
        return "host", -1
    match = _CUDA.match(text)
    if match is None:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {device!r}")
    return "cuda", _check_cuda(int(match.group(1) or 0))


def host_instead(device: Any, error: CudaUnavailableError) -> bool:
    """Whether a harvester asked for `device` takes the host backend where making the CUDA
    backend resolve_device chose raised `error`, as where the driver cannot run the
    build's kernels on the GPU (no machine code for it, and PTX the driver cannot JIT):
    for "auto" (and None) only, warning once per process with the error, which names the
    versions and what to do. An explicit CUDA device raises it as it is."""
    global _cuda_unusable
    if not (device is None or (isinstance(device, str) and device.strip().lower() == "auto")):
        return False
    if _cuda_unusable is None:
        _cuda_unusable = str(error)
        # host_instead <- Harvester.__init__ <- the caller
        warnings.warn(
            f"freeride: device='auto' runs side tasks on the host backend (CPU threads): "
            f"{error} Pass device='cpu' to choose the host backend without this warning.",
            CudaFallbackWarning,
            stacklevel=3,
        )
    return True


def _warn_fallback_once(info: dict[str, Any]) -> None:
    """Warns (once per process) where "auto" falls back to the host backend although the
    machine has a GPU: never silently on a GPU machine."""
    global _warned_fallback
    if _warned_fallback:
        return
    message = gpu_unused(info, torch_gpus(), kernel_driver_version())
    if message is not None:
        _warned_fallback = True
        # resolve_device <- Harvester.__init__ <- the caller
        warnings.warn(message, CudaFallbackWarning, stacklevel=4)


def _check_driver_api_max() -> None:
    """The CUDA backend ignores a FREERIDE_DRIVER_API_MAX that is not a version number:
    refuse it before a harvester is made, rather than test a fallback that never runs."""
    value = os.environ.get(_DRIVER_API_MAX, "")
    if value and not re.fullmatch(r"[0-9]+", value):
        raise ValueError(
            f"{_DRIVER_API_MAX} must be a CUDA version as CUDA_VERSION writes it (12040 for "
            f"CUDA 12.4), got {value!r}"
        )


def _check_cuda(index: int) -> int:
    _check_driver_api_max()
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
