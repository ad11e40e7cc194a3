"""What this build and machine offer (backend_info), where the public headers are
(include_dir), the version, and why a GPU this machine has goes unused (gpu_unused)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from ._C import backend_info as core_backend_info

try:
    __version__ = metadata.version("freeride")  # one source: setup.py (VERSION)
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"


def backend_info() -> dict[str, Any]:
    """What this build and machine offer: ``cuda`` (a usable GPU), ``cuda_built``,
    ``cuda_build`` (with cuda_built: ``toolkit``, the nvcc that compiled the CUDA code as
    (major, minor), ``architectures``, its CMAKE_CUDA_ARCHITECTURES joined by ",", and
    ``ptx_isa``; None without),
    ``devices`` (name, SMs, compute capability, ``stream_mem_ops``), ``stream_mem_ops``
    (all devices support them), ``runtime_version``, ``driver_version``, ``version``,
    ``reserve_mechanism`` (how side kernels leave room for training's kernels on a GPU:
    ``"occupancy-cap"``, a per-SM cap on every side grid, or ``"green-context (120 of 132
    SMs)"``, side kernels in a green context of that many SMs; see fr.Reserve. Per device
    under ``devices``: what the most recent harvester on it used, ``"occupancy-cap"``
    before any, with ``reserve_fallback``, why green-context was asked for and not used,
    ``green_sms_seen``, on how many SMs the check that launches stay in the green context
    saw its blocks run (0: none counted), and ``green_contexts``, whether the driver has
    them; the top-level value joins the
    devices' and ``reserve_fallback`` is the first device's reason, if any), ``gate_write``
    (how a harvester made now would write the gate on a stream: ``"batch"``, ``"memop"``,
    ``"copy"`` or ``"kernel"``, as chosen by FREERIDE_GATE_WRITE and what the driver
    offers; ``"host"`` without a GPU; one value per device under ``devices``), and
    ``reason`` and ``cuda_error`` (the CUDA runtime's name for the failure, e.g.
    ``"cudaErrorInsufficientDriver"``) when cuda is False, ``module_loading``: how the
    driver loads kernels in this process, ``"lazy"`` (each at its first launch, CUDA's
    default since 12.2; a first launch may then wait for the whole device, see
    Harvester's ``time_slice``) or ``"eager"`` (``CUDA_MODULE_LOADING=EAGER``, read when
    CUDA initialises), None without a driver or device, and ``gpu_unused``: None, or why
    this machine has a GPU freeride's CUDA backend cannot use (torch, if already imported,
    sees one, or an NVIDIA driver is installed), with what is needed and what to do; the
    text ``device="auto"`` warns with and ``freeride info`` prints."""
    info = dict(core_backend_info())
    info.setdefault("module_loading", None)  # an extension built before the key
    info.setdefault("cuda_build", None)
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
    info["gpu_unused"] = gpu_unused(info, torch_gpus(), kernel_driver_version())
    return info


# The oldest CUDA toolkit the CUDA backend builds with (cmake/FreerideCudaFloor.cmake says
# why; tests/test_cuda_toolkits.py checks the two agree).
CUDA_TOOLKIT_FLOOR = "12.5"
# The oldest driver branch each CUDA major version's runtime runs on (CUDA's minor version
# compatibility): what a build of freeride with that runtime needs.
_DRIVER_FOR_RUNTIME = {12: "r525", 13: "r580"}
# Where Linux's NVIDIA kernel module says its version (the driver's name users know).
NVIDIA_PROC_VERSION = "/proc/driver/nvidia/version"


def _cuda_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def torch_gpus() -> int | None:
    """How many CUDA devices torch sees, where torch is already imported (None where it
    is not, or sees none). Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken or stub torch tells nothing
        return None


def kernel_driver_version(path: str = NVIDIA_PROC_VERSION) -> str | None:
    """The loaded NVIDIA kernel module's version (e.g. "535.104.05"), None where unknown."""
    try:
        with open(path) as f:
            text = f.read(4096)
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def gpu_unused(
    info: Mapping[str, Any], torch_gpus: int | None, kernel_driver: str | None = None
) -> str | None:
    """Why freeride's CUDA backend cannot use a GPU this machine has, as a message naming
    the driver, what this build needs and what to do; None where the backend is usable or
    nothing says there is a GPU. `info`: backend_info()'s keys cuda, cuda_built, reason,
    cuda_error, driver_version, runtime_version. A GPU is there where `torch_gpus` (how
    many devices torch sees) is positive, or where the build's own runtime found a driver
    that failed it (not one that sees no device: CUDA_VISIBLE_DEVICES may hide them all
    on purpose). `kernel_driver`: the NVIDIA kernel module's version, to name the driver."""
    if info.get("cuda"):
        return None
    driver = int(info.get("driver_version") or 0)
    error = info.get("cuda_error") or ""
    driver_failed = bool(info.get("cuda_built")) and driver > 0 and error != "cudaErrorNoDevice"
    if not torch_gpus and not driver_failed:
        return None
    seen = (
        f"torch sees {torch_gpus} CUDA device(s)" if torch_gpus else "an NVIDIA driver is installed"
    )
    parts = [
        (
            f"freeride: {seen}, but freeride's CUDA backend cannot use "
            f"{'them' if (torch_gpus or 1) > 1 else 'it'}, so device='auto' runs side tasks on "
            "the host backend (CPU threads) instead."
        )
    ]
    if driver > 0 or kernel_driver:
        supports = f" supports CUDA {_cuda_version(driver)}" if driver > 0 else " is loaded"
        parts.append(f"The NVIDIA driver{f' {kernel_driver}' if kernel_driver else ''}{supports}.")
    how = "its nvcc on PATH, then FREERIDE_CUDA=1 pip install . from a clone"
    if not info.get("cuda_built"):
        reason = info.get("reason") or "built without CUDA"
        parts.append(
            f"This build of freeride has no CUDA backend ({reason}: no nvcc when it was built)."
        )
        drivers = ", ".join(f"{v}.x: {b}+" for v, b in sorted(_DRIVER_FOR_RUNTIME.items()))
        todo = (
            f"build freeride with a CUDA {CUDA_TOOLKIT_FLOOR}+ toolkit whose runtime this "
            f"driver runs ({drivers}; {how})"
        )
    else:
        runtime = int(info.get("runtime_version") or 0)
        major = runtime // 1000
        branch = _DRIVER_FOR_RUNTIME.get(major)
        needs = f"driver {branch} or newer" if branch else f"driver for CUDA {major}.x"
        parts.append(
            f"This freeride was built with the CUDA {_cuda_version(runtime)} runtime, which "
            f"needs an NVIDIA {needs}; its CUDA backend says: {info.get('reason') or error}."
        )
        if error == "cudaErrorInsufficientDriver":
            todo = f"install an NVIDIA {needs}"
            if major > 12:  # a 12.x build runs on older drivers
                todo += (
                    f", or build freeride with a CUDA 12.x toolkit ({CUDA_TOOLKIT_FLOOR} or "
                    f"later), whose runtime runs on {_DRIVER_FOR_RUNTIME[12]}+ drivers ({how})"
                )
        else:
            todo = "fix what the CUDA backend says"
    parts.append(
        f"To harvest on the GPU, {todo}; or pass device='cpu' to choose the host backend and "
        "silence this."
    )
    return " ".join(parts)


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
