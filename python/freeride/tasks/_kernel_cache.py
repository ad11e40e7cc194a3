"""User CUDA source compiled with CuPy (NVRTC), loaded once per device and kept.

A compiled module is kept for the life of the process: the core launches its functions
by handle from the executor's thread, so the module must never be unloaded while a task
may still use it. CuPy also caches the compiled binary on disk (~/.cupy/kernel_cache),
so a second process skips NVRTC as well.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import KernelCompileError

CUPY_HINT = "pip install 'freeride[cupy]'"


def require_cupy() -> Any:
    """The cupy module, or ImportError naming the extra that installs it."""
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            f"fr.tasks.RawKernel compiles CUDA source with CuPy, which is not installed: "
            f"{CUPY_HINT} (CuPy for CUDA 13). Import failed with: {e}"
        ) from None
    return cupy


@dataclass
class Compiled:
    """One module on one device: its functions by name (CUfunction handles)."""

    module: Any
    functions: dict[str, int]


@dataclass
class CacheInfo:
    hits: int = 0
    misses: int = 0
    size: int = 0


_lock = threading.Lock()
_cache: dict[tuple, Compiled] = {}
_info = CacheInfo()


@functools.cache
def _headers_define(folder: str) -> str:
    """A -D option naming the contents of freeride's headers. CuPy's on-disk cache keys a
    module by its source and options, not by what the source includes: without this, a
    kernel compiled against an older preempt.cuh (another fr_item_ctx, another item
    protocol) would be loaded from the cache after an upgrade."""
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(folder, "freeride").iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"-DFREERIDE_HEADERS=0x{digest.hexdigest()[:16]}"


def compile_module(
    source: str, names: Sequence[str], options: Sequence[str], device: int
) -> Compiled:
    """Compiles `source` for `device` (or finds it compiled) and looks up `names`."""
    from ..info import include_dir

    key = (source, tuple(options), tuple(names), device)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _info.hits += 1
            return hit
    cupy = require_cupy()
    opts = (f"-I{include_dir()}", _headers_define(include_dir()), *options)
    with cupy.cuda.Device(device):
        module = cupy.RawModule(code=source, options=opts)
        try:
            module.compile()
        except cupy.cuda.compiler.CompileException as e:
            raise KernelCompileError(
                f"RawKernel source did not compile for cuda:{device} (options {list(opts)})",
                log=e.get_message(),
            ) from None
        functions = {}
        for name in names:
            try:
                kernel = module.get_function(name)
                functions[name] = int(getattr(kernel, "kernel", kernel).ptr)
            except cupy.cuda.driver.CUDADriverError as e:
                raise KernelCompileError(
                    f"kernel {name!r} is not in the compiled module ({e}); a kernel must be "
                    'declared extern "C" for RawKernel to find it by name'
                ) from None
    compiled = Compiled(module, functions)
    with _lock:
        compiled = _cache.setdefault(key, compiled)
        _info.misses += 1
        _info.size = len(_cache)
    return compiled


def cache_info() -> CacheInfo:
    """Hits, misses and size of the in-process cache."""
    with _lock:
        return CacheInfo(_info.hits, _info.misses, len(_cache))
