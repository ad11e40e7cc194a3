"""The Harvester's checks of its own arguments, apart from the class."""

from __future__ import annotations

import os
import warnings
from typing import Any

from ._checks import check_float
from .info import backend_info


def check_time_slice(value: Any) -> float | None:
    if value is None:
        return None
    value = check_float(value, "time_slice")
    if not 1e-5 <= value <= 60:
        raise ValueError(f"time_slice must be between 1e-05 and 60 seconds (or None), got {value}")
    return value


def warn_if_lazy_loading(kind: str, time_slice: float | None) -> None:
    """Warns where a CUDA harvester without a time slice meets CUDA's lazy module
    loading (backend_info()["module_loading"]): a kernel's first launch may then wait for
    a side launch that only the gate's close ends."""
    if kind != "cuda" or time_slice is not None:
        return
    if backend_info().get("module_loading") != "lazy":
        return
    # warn_if_lazy_loading <- Harvester.__init__ <- the caller
    warnings.warn(
        "freeride: Harvester(time_slice=None) with CUDA's lazy module loading (the default "
        "since CUDA 12.2): the first launch of a kernel not yet loaded may synchronise the "
        "device, which waits for a side launch running with the gate open, and that launch "
        "ends only at the gate's close; a thread that launches such a kernel before "
        "enqueueing the close never returns. Set CUDA_MODULE_LOADING=EAGER in the "
        "environment before CUDA initialises, or launch every kernel once before side work "
        "starts.",
        RuntimeWarning,
        stacklevel=3,
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def warn_if_spinning_on_one_core(admission: str, cores: int) -> None:
    """Warns where FREERIDE_ADMISSION=spin meets a process that may run on one core: the
    executor's spin then shares it with the training thread."""
    if admission != "spin" or cores >= 2:
        return
    # warn_if_spinning_on_one_core <- Harvester.__init__ <- the caller
    warnings.warn(
        f"freeride: FREERIDE_ADMISSION=spin in a process that may run on {cores} core: the "
        "executor thread yields between looks at the gate while a task waits, on the core "
        "the training thread needs. Give the process a core to spare (its CPU affinity), "
        "or leave FREERIDE_ADMISSION unset.",
        RuntimeWarning,
        stacklevel=3,
    )


def default_workers() -> int:
    return max(1, (os.cpu_count() or 2) // 2)
