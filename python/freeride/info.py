"""What this build and machine offer (backend_info), where the public headers are
(include_dir), and the version."""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

from ._C import backend_info as core_backend_info

try:
    __version__ = metadata.version("freeride")  # one source: pyproject.toml
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"


def backend_info() -> dict[str, Any]:
    """What this build and machine offer: ``cuda`` (a usable GPU), ``cuda_built``,
    ``devices`` (name, SMs, compute capability, ``stream_mem_ops``), ``stream_mem_ops``
    (all devices support them), ``runtime_version``, ``driver_version``, ``version``,
    ``reserve_mechanism`` (how side kernels leave room for training's kernels on a GPU:
    ``"occupancy-cap"``, a per-SM cap on every side grid, or ``"green-context (120 of 132
    SMs)"``, side kernels in a green context of that many SMs; see fr.Reserve. Per device
    under ``devices``: what the most recent harvester on it used, ``"occupancy-cap"``
    before any, with ``reserve_fallback``, why green-context was asked for and not used,
    and ``green_contexts``, whether the driver has them; the top-level value joins the
    devices' and ``reserve_fallback`` is the first device's reason, if any), ``gate_write``
    (how a harvester made now would write the gate on a stream: ``"batch"``, ``"memop"``,
    ``"copy"`` or ``"kernel"``, as chosen by FREERIDE_GATE_WRITE and what the driver
    offers; ``"host"`` without a GPU; one value per device under ``devices``), and
    ``reason`` when cuda is False."""
    info = dict(core_backend_info())
    info["stream_mem_ops"] = bool(info["devices"]) and all(
        d["stream_mem_ops"] for d in info["devices"]
    )
    info["version"] = __version__
    info["default_backend"] = "cuda" if info["cuda"] else "host"
    mechanisms = dict.fromkeys(d.get("reserve_mechanism", "occupancy-cap") for d in info["devices"])
    info["reserve_mechanism"] = ",".join(mechanisms) if mechanisms else "occupancy-cap"
    fallbacks = [d["reserve_fallback"] for d in info["devices"] if d.get("reserve_fallback")]
    info["reserve_fallback"] = fallbacks[0] if fallbacks else None
    per_device = dict.fromkeys(d["gate_write"] for d in info["devices"])
    info["gate_write"] = ",".join(per_device) if info["cuda"] and per_device else "host"
    return info


# The oldest CUDA toolkit the CUDA backend builds with (cmake/FreerideCudaFloor.cmake says
# why; tests/test_cuda_toolkits.py checks the two agree).
CUDA_TOOLKIT_FLOOR = "12.5"


def include_dir() -> str:
    """Folder holding freeride/preempt.cuh, for compiling user kernels
    (``-I`` + this path, then ``#include <freeride/preempt.cuh>``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "include")
    if os.path.isfile(os.path.join(installed, "freeride", "preempt.cuh")):
        return installed
    source = os.path.normpath(os.path.join(here, "..", "..", "csrc", "include"))
    if os.path.isfile(os.path.join(source, "freeride", "preempt.cuh")):
        return source
    raise FileNotFoundError("freeride's headers are missing from this installation")
