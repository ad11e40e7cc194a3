"""`freeride info`'s readable summary of fr.backend_info(): what the build holds, what the
machine offers, and where side tasks will run."""

from __future__ import annotations

from typing import Any


def _cuda_version(value: int) -> str:
    """A CUDA version as the runtime and driver report it (12040) as people write it."""
    return f"{value // 1000}.{value % 1000 // 10}" if value else "none"


def _build(info: dict[str, Any]) -> str:
    build = info.get("cuda_build")
    if not info.get("cuda_built"):
        return "host backend only (built without CUDA: no nvcc was found at build time)"
    if not build:
        return "CUDA backend compiled in"
    major, minor = build["toolkit"]
    archs = build["architectures"].replace(",", " ") or "?"
    ptx = f", PTX ISA {build['ptx_isa']}" if build.get("ptx_isa") else ""
    return f"CUDA backend compiled in: nvcc {major}.{minor}, architectures {archs}{ptx}"


def _device(dev: dict[str, Any]) -> str:
    major, minor = dev["compute_capability"]
    parts = [
        f"compute capability {major}.{minor}",
        f"{dev['sm_count']} SMs",
        f"gate writes {dev['gate_write']}",
        "stream memory operations " + ("yes" if dev["stream_mem_ops"] else "no"),
        "green contexts " + ("yes" if dev.get("green_contexts") else "no"),
    ]
    return f"{dev['name']}: " + ", ".join(parts)


def summary(info: dict[str, Any]) -> str:
    """Lines for a person: the version and where side tasks run with device="auto", the
    build, CUDA's runtime and driver (and why CUDA is unusable, where it is), each device,
    how kernels are loaded, the reserve (where CUDA is usable), and why a GPU goes unused, where one does."""
    where = "CUDA" if info["default_backend"] == "cuda" else "the host backend (CPU threads)"
    lines = [f'freeride {info["version"]}: side tasks run on {where} with device="auto"']
    rows = [("build", _build(info))]
    cuda = (
        f"runtime {_cuda_version(info['runtime_version'])}, "
        f"driver {_cuda_version(info['driver_version'])}"
    )
    if not info["cuda"] and info.get("reason"):
        error = f" ({info['cuda_error']})" if info.get("cuda_error") else ""
        cuda += f": unusable, {info['reason']}{error}"
    rows.append(("CUDA", cuda))
    devices = info.get("devices") or []
    if not devices:
        rows.append(("devices", "none"))
    for dev in devices:
        rows.append((f"device {dev['index']}", _device(dev)))
    if info.get("module_loading"):
        loading = info["module_loading"]
        if loading == "lazy":
            loading += " (each kernel at its first launch; see time_slice=None in the guide)"
        rows.append(("loading", loading))
    if info["cuda"]:
        reserve = info["reserve_mechanism"]
        if info.get("reserve_fallback"):
            reserve += f" (green context not used: {info['reserve_fallback']})"
        rows.append(("reserve", reserve))
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name:<{width}}  {text}" for name, text in rows]
    if info.get("gpu_unused"):
        lines.append(f"GPU unused: {info['gpu_unused']}")
    return "\n".join(lines)
