"""NVRTC through ctypes, for tests that need no GPU: the compiler RawKernel uses (CuPy
calls the same library) compiles user kernels and freeride's headers to PTX here, and
the PTX says what the compiler made of each kernel's parameters."""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys


def find_nvrtc() -> str | None:
    """Path of libnvrtc: the nvidia-cuda-nvrtc wheel, else the CUDA toolkit."""
    candidates = []
    for base in sys.path:
        candidates += glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libnvrtc.so*"))
        candidates += glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates += glob.glob(os.path.join(cuda, "lib64", "libnvrtc.so*"))
    candidates = [c for c in candidates if "builtins" not in c]
    return candidates[0] if candidates else None


# A kernel written against freeride's header whose body has no barrier and no volatile
# access: what its PTX holds of either comes from for_each_item.
SCALE = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void scale(fr_item_ctx ctx, float* x, float a, unsigned long long n) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    unsigned long long i = item * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
  });
}
"""


class NvrtcError(Exception):
    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


def compile_ptx(source: str, options: list[str], name: str = "kernel.cu") -> str:
    """PTX of `source`, or NvrtcError carrying the compiler log."""
    path = find_nvrtc()
    if path is None:
        raise FileNotFoundError("libnvrtc not found")
    lib = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    check = _checker(lib)
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None))
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        res = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
        log = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetProgramLog(prog, log))
        if res != 0:
            raise NvrtcError(log.value.decode(errors="replace"))
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        ptx = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetPTX(prog, ptx))
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _checker(lib):
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(res: int) -> None:
        if res != 0:
            raise RuntimeError(f"NVRTC call failed: {lib.nvrtcGetErrorString(res).decode()}")

    return check


_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+\w+(?:\[(\d+)\])?")
_BITS = {
    "u8": 1,
    "s8": 1,
    "b8": 1,
    "u16": 2,
    "s16": 2,
    "b16": 2,
    "f16": 2,
    "u32": 4,
    "s32": 4,
    "b32": 4,
    "f32": 4,
    "u64": 8,
    "s64": 8,
    "b64": 8,
    "f64": 8,
}


def ptx_param_sizes(ptx: str, kernel: str) -> list[int]:
    """Bytes of each parameter of .entry `kernel` in the PTX."""
    m = re.search(r"\.entry\s+" + re.escape(kernel) + r"\s*\((.*?)\)", ptx, re.DOTALL)
    if m is None:
        raise KeyError(f"no .entry {kernel} in the PTX")
    sizes = []
    for kind, count in _PARAM.findall(m.group(1)):
        sizes.append(_BITS[kind] * (int(count) if count else 1))
    return sizes
