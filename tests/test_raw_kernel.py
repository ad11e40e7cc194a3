"""fr.tasks.RawKernel without a GPU: the ImportError without CuPy, bad inputs caught at
construction, arguments checked and packed against parameter sizes as the driver gives
them (here given explicitly, or taken from the PTX NVRTC builds), the path from
compile() to the core task with the driver's answers faked, the fallback for a driver
without cuFuncGetParamInfo, the host backend's refusal, and the digest of the headers in
the compile options. The tests that run kernels on a GPU are in test_raw_kernel_gpu.py."""

import os
import pathlib
import sys
import types
import warnings
from contextlib import nullcontext

import numpy as np
import pytest
from nvrtc import SCALE, NvrtcError, compile_ptx, find_nvrtc, ptx_param_sizes

import freeride as fr
from conftest import runner_launches
from freeride import _C
from freeride.tasks import _kernel_cache, raw_kernel
from freeride.tasks._signature import CTX_BYTES, check_sizes, pack, scalar_word

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = pathlib.Path(ROOT, "examples", "kernels.cu")


# Every scalar kind a kernel may take, with the argument RawKernel's rule gives each.
MANY = r"""
#include <freeride/preempt.cuh>
#include <cuda_fp16.h>
typedef struct { int a, b; } pair_t;
extern "C" __global__ void __launch_bounds__(128) many(
    const fr_item_ctx ctx, const float* __restrict__ x, double* y, void* raw, pair_t* pairs,
    char c, unsigned char uc, short s, unsigned short us, int i, unsigned u, long l,
    unsigned long ul, long long ll, unsigned long long ull, bool flag, float f, double d,
    __half h, size_t z) {
  freeride::for_each_item(ctx, [&](unsigned long long) {});
}
"""
MANY_SIZES = [8, 8, 8, 8, 1, 1, 2, 2, 4, 4, 8, 8, 8, 8, 1, 4, 8, 2, 8]


def many_args():
    x, y, raw = np.zeros(4, np.float32), np.zeros(2, np.float64), np.zeros(3, np.int16)
    return (x, y, raw, None, -3, 255, -300, 65535, -7, 2**32 - 1, -1, 2**64 - 1, -(2**63),
            2**63, True, 1.5, 1.5, np.float16(1.0), 10)  # fmt: skip


class DeviceArray:
    """A CUDA array as CuPy or numba shows one, with no CUDA behind it."""

    def __init__(self, ptr, n, typestr="<f4"):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
        }


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in CuPy module: RawKernel's construction only needs it importable, and
    compile() only its Device context."""
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(Device=lambda device: nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


@pytest.fixture
def fake_driver(fake_cupy, monkeypatch):
    """compile() with the compiler and the driver faked: every kernel name gets a handle,
    and _C.function_info answers with `sizes[name]` (all parameters, fr_item_ctx
    included; None: a driver without cuFuncGetParamInfo)."""
    sizes = {}

    def compile_module(source, names, options, device):
        return _kernel_cache.Compiled(None, {n: 0x1000 + i for i, n in enumerate(names)})

    def function_info(function):
        name = list(sizes)[function - 0x1000]
        return {
            "max_threads_per_block": 1024,
            "static_shared_bytes": 0,
            "max_dynamic_shared_bytes": 48 * 1024,
            "num_regs": 32,
            "param_sizes": sizes[name],
        }

    monkeypatch.setattr(_kernel_cache, "compile_module", compile_module)
    monkeypatch.setattr(raw_kernel, "function_info", function_info)
    return sizes


def test_without_cupy_import_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(ImportError, match=r"freeride\[cupy\]"):
        fr.tasks.RawKernel(SCALE, "scale", 10, (None, 2.0, 10))


def test_scalar_words_are_the_little_endian_bytes_of_the_parameter():
    assert scalar_word(1.5, 4, "k") == 0x3FC00000  # a float for 4 bytes is a float
    assert scalar_word(1.5, 8, "k") == 0x3FF8000000000000  # for 8 a double
    assert scalar_word(3, 4, "k") == 3  # an int is an integer: the driver knows no types
    assert scalar_word(-1, 4, "k") == 0xFFFFFFFF
    assert scalar_word(2**32 - 1, 4, "k") == 0xFFFFFFFF  # signed or unsigned
    assert scalar_word(-1, 1, "k") == 0xFF
    assert scalar_word(2**64 - 1, 8, "k") == 2**64 - 1
    assert scalar_word(-(2**63), 8, "k") == 2**63
    assert scalar_word(True, 1, "k") == 1
    # numpy scalars say what they are: the way to pass __half, or an int to a float.
    assert scalar_word(np.float32(3), 4, "k") == 0x40400000
    assert scalar_word(np.uint64(2**64 - 1), 8, "k") == 2**64 - 1
    assert scalar_word(np.int32(-1), 4, "k") == 0xFFFFFFFF
    assert scalar_word(np.float16(1.0), 2, "k") == 0x3C00
    assert scalar_word(np.bool_(True), 1, "k") == 1
    # Where the driver cannot say, only the values that carry their size.
    assert scalar_word(np.float64(1.5), None, "k") == 0x3FF8000000000000
    assert scalar_word(False, None, "k") == 0


@pytest.mark.parametrize(
    "value, size, error, match",
    [
        (2**32, 4, ValueError, r"4-byte integer parameter: must be in \[-2147483648, 4294967295\]"),
        (-(2**31) - 1, 4, ValueError, "must be in"),
        (2**64, 8, ValueError, "must be in"),
        (1, 16, TypeError, "an int goes as 1, 2, 4 or 8"),
        (1.5, 2, TypeError, r"np\.float16 for __half"),
        (1.5, 1, TypeError, "4-byte float or an 8-byte double"),
        (1e39, 4, ValueError, "out of range for a 4-byte float"),
        (True, 4, TypeError, "4-byte parameter in the compiled kernel, got a bool"),
        (np.float64(1.0), 4, TypeError, "got a float64 scalar \\(8 bytes\\)"),
        (np.int32(1), 8, TypeError, "an 8-byte parameter .* got an int32 scalar \\(4 bytes\\)"),
        ("2", 4, TypeError, "must be a number or a numpy scalar, got str"),
        (np.zeros(3), 4, TypeError, "4-byte parameter .* got an array .* 8-byte pointer"),
        (None, 4, TypeError, r"got None \(a null pointer\)"),
        (1, None, TypeError, "Python int, whose size .* CUDA 12.4 .* np.uint64\\(1\\)"),
        (2.5, None, TypeError, r"cannot report it .* np\.float32\(2\.5\)"),
    ],
)
def test_scalar_words_reject(value, size, error, match):
    with pytest.raises(error, match=match):
        scalar_word(value, size, "args[1] of kernel 'k'")


def test_sizes_from_the_driver_must_start_with_the_context():
    assert check_sizes([CTX_BYTES, 8, 4, 8], "scale") == [8, 4, 8]
    assert check_sizes([CTX_BYTES], "empty") == []
    for bad in ([8, 8, 4, 8], [], [CTX_BYTES + 8]):
        with pytest.raises(TypeError, match="the first parameter of kernel 'scale' must be"):
            check_sizes(bad, "scale")
    with pytest.raises(TypeError, match="parameter 2 of kernel 'k' \\(for args\\[1\\]\\) is 16"):
        check_sizes([CTX_BYTES, 8, 16], "k")


def test_pack_checks_count_and_sizes():
    x, y = np.zeros(4, np.float32), np.zeros(2, np.float64)
    words, _keep, memory = pack([8, 8, 4, 8], (x, None, 2.5, 10), "k", "host", -1)
    assert words == [x.ctypes.data, 0, 0x40200000, 10]
    assert memory == x.nbytes
    # The same buffer passed twice is charged once.
    assert pack([8, 8, 8], (x, y, y), "k", "host", -1)[2] == x.nbytes + y.nbytes
    with pytest.raises(TypeError, match=r"kernel 'k' takes 3 argument\(s\) after fr_item_ctx"):
        pack([8, 4, 8], (x, 2.5), "k", "host", -1)
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'k' is a 4-byte parameter.*array"):
        pack([8, 4, 8], (x, y, 10), "k", "host", -1)
    with pytest.raises(ValueError, match=r"args\[0\] of kernel 'k' is a numpy array"):
        pack([8], (x,), "k", "cuda", 0)  # host memory for a kernel on a GPU
    # Without sizes from the driver: what carries its size goes, plain numbers do not.
    words = pack(None, (x, None, np.float32(2.5), np.uint64(10)), "k", "host", -1)[0]
    assert words == [x.ctypes.data, 0, 0x40200000, 10]
    with pytest.raises(TypeError, match=r"args\[2\] of kernel 'k' is a Python float"):
        pack(None, (x, None, 2.5, np.uint64(10)), "k", "host", -1)


def test_bad_arguments_fail_at_construction(fake_cupy):
    RawKernel = fr.tasks.RawKernel
    with pytest.raises(TypeError, match=r"args\[0\] of kernel 'scale' must be an array.*str"):
        RawKernel(SCALE, "scale", 4, ("x", 2.0, 10))
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' .* got complex"):
        RawKernel(SCALE, "scale", 4, (None, 2j, 10))
    with pytest.raises(ValueError, match="items must be >= 1"):
        RawKernel(SCALE, "scale", 0, (None, 2.0, 10))
    with pytest.raises(ValueError, match="block must be <= 1024"):
        RawKernel(SCALE, "scale", 4, (None, 2.0, 10), block=2048)
    with pytest.raises(ValueError, match="one count or one per kernel name"):
        RawKernel(SCALE, "scale", [1, 2], (None, 2.0, 10))
    with pytest.raises(TypeError, match="source must be a non-empty string"):
        RawKernel("", "scale", 4, ())
    with pytest.raises(ValueError, match="name must be a kernel name"):
        RawKernel(SCALE, "2scale", 4, ())
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        RawKernel(SCALE, "scale", 4, "x")


def test_compile_checks_arguments_against_the_drivers_sizes(fake_driver):
    RawKernel = fr.tasks.RawKernel
    fake_driver["scale"] = [CTX_BYTES, 8, 4, 8]
    assert RawKernel(SCALE, "scale", 4, (None, 2.0, 10)).compile() == {"scale": 0x1000}
    assert RawKernel(SCALE, "scale", 4, (None, np.float32(2), np.uint64(10))).compile()
    with pytest.raises(TypeError, match=r"kernel 'scale' takes 3 argument\(s\) after fr_item"):
        RawKernel(SCALE, "scale", 4, (None, 2.0)).compile()
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' .* float64 scalar"):
        RawKernel(SCALE, "scale", 4, (None, np.float64(2), 10)).compile()
    with pytest.raises(ValueError, match=r"args\[2\] of kernel 'scale' .* must be in"):
        RawKernel(SCALE, "scale", 4, (None, 2.0, -(2**63) - 1)).compile()
    with pytest.raises(ValueError, match="block=2048|block must be"):
        RawKernel(SCALE, "scale", 4, (None, 2.0, 10), block=2048).compile()
    fake_driver["scale"] = [8, 8, 4, 8]  # a kernel without the fr_item_ctx
    with pytest.raises(TypeError, match="first parameter of kernel 'scale' must be `fr_item"):
        RawKernel(SCALE, "scale", 4, (None, 2.0, 10)).compile()


def test_kernels_sharing_args_must_have_the_same_sizes(fake_driver):
    two = SCALE + SCALE.replace("scale(", "other(").replace("float a", "double a")
    fake_driver.update(scale=[CTX_BYTES, 8, 4, 8], other=[CTX_BYTES, 8, 8, 8])
    with pytest.raises(TypeError, match="must take the same parameters.*\\[8, 4, 8\\] and"):
        fr.tasks.RawKernel(two, ["scale", "other"], 4, (None, 2.0, 10)).compile()


def test_submit_packs_the_words_for_the_core(fake_driver):
    """_build as submit() runs it on a GPU harvester, with the driver's answers faked: the
    core task is made (it only launches on a GPU) and charged the arrays' bytes."""
    fake_driver["scale"] = [CTX_BYTES, 8, 4, 8]
    x = DeviceArray(0xDEAD0000, 1000)
    harvester = ("cuda", 0)
    k = fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 1000))
    built = k._build(*harvester)
    assert built.core.memory_bytes == 4000
    assert built.result() == (x, 2.0, 1000)
    with pytest.raises(
        TypeError, match=r"args\[1\] of kernel 'scale' is a 4-byte parameter.*an 8-byte pointer"
    ):
        fr.tasks.RawKernel(SCALE, "scale", 4, (x, x, 1000))._build(*harvester)


def test_a_driver_without_param_info_warns_and_takes_only_sized_arguments(fake_driver):
    """The documented fallback where the driver predates cuFuncGetParamInfo."""
    fake_driver["scale"] = None
    harvester = ("cuda", 0)
    x = DeviceArray(0xDEAD0000, 10)
    sized = fr.tasks.RawKernel(SCALE, "scale", 4, (x, np.float32(2), np.uint64(10)))
    with pytest.warns(RuntimeWarning, match="CUDA 12.4 .* not checked"):
        assert sized._build(*harvester).core.memory_bytes == 40
    plain = fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' is a Python float"):
            plain._build(*harvester)


def test_phases_cycle_through_names(fake_cupy):
    two = SCALE + SCALE.replace("scale(", "other(")
    k = fr.tasks.RawKernel(two, ["scale", "other"], [3, 5], (None, 2.0, 10), phases=7)
    assert (k.names, k.items, k.phases) == (("scale", "other"), (3, 5), 7)
    assert fr.tasks.RawKernel(two, ["scale", "other"], 3, (None, 2.0, 10)).phases == 2


def test_host_backend_refuses_and_stays_usable(fake_cupy, host):
    k = fr.tasks.RawKernel(SCALE, "scale", 4, (None, 2.0, 10))
    with pytest.raises(fr.CudaUnavailableError, match="RawKernel runs CUDA kernels"):
        host.submit(k)
    host.gate.open(stream="host")
    assert host.submit(fr.tasks.Spin(items=10, ns_per_item=0)).wait(10)


def test_compile_error_carries_the_log():
    e = fr.KernelCompileError("did not compile", log="kernel.cu(3): error: oops")
    assert e.log.endswith("oops") and "oops" in str(e)


needs_nvrtc = pytest.mark.skipif(
    find_nvrtc() is None, reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)"
)
# The options CuPy adds to the ones RawKernel passes (CuPy also adds the CUDA headers).
CUPY_LIKE = ["-arch=compute_90", "--device-as-default-execution-space", "-ftz=true"]
CUDA_INCLUDE = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
if os.path.isfile(os.path.join(CUDA_INCLUDE, "cuda_fp16.h")):
    CUPY_LIKE.append(f"-I{CUDA_INCLUDE}")


@needs_nvrtc
@pytest.mark.parametrize(
    "source, kernel, sizes, args",
    [
        (SCALE, "scale", [8, 4, 8], (np.zeros(4, np.float32), 2.5, 10)),
        (MANY, "many", MANY_SIZES, many_args()),
        (EXAMPLE.read_text(), "scale_shift", [8, 8, 4, 4, 8], (None, None, 3.0, 1.0, 10)),
        (EXAMPLE.read_text(), "heat_step", [8, 8, 4, 8], (None, None, 0.25, 10)),
    ],
    ids=["scale", "many", "scale_shift", "heat_step"],
)
def test_nvrtc_sizes_take_the_arguments_the_rule_gives(source, kernel, sizes, args):
    """The parameter sizes of the kernels as NVRTC compiles them (read from the PTX: what
    cuFuncGetParamInfo reports on a GPU) start with the fr_item_ctx and take the
    arguments the documented rule gives each kind of parameter."""
    if "cuda_fp16.h" in source and f"-I{CUDA_INCLUDE}" not in CUPY_LIKE:
        pytest.skip("the CUDA headers (cuda_fp16.h) are not installed here")
    ptx = compile_ptx(source, [f"-I{fr.include_dir()}", *CUPY_LIKE])
    from_compiler = ptx_param_sizes(ptx, kernel)
    assert check_sizes(from_compiler, kernel) == sizes
    words = pack(from_compiler[1:], args, kernel, "host", -1)[0]
    assert len(words) == len(args)


@needs_nvrtc
def test_nvrtc_reports_errors_with_a_log():
    with pytest.raises(NvrtcError, match="undefined"):
        compile_ptx(SCALE.replace("x[i] *= a", "x[i] *= b"), [f"-I{fr.include_dir()}", *CUPY_LIKE])


def test_compile_options_name_the_headers_contents(tmp_path):
    """CuPy caches compiled modules on disk by source and options only: the options carry
    a digest of every shipped header (preempt.cuh and what it includes), so a header
    change (a new item protocol) compiles afresh instead of loading a module built
    against the old one."""
    folder = tmp_path / "include"
    (folder / "freeride").mkdir(parents=True)
    for header in (pathlib.Path(fr.include_dir()) / "freeride").iterdir():
        (folder / "freeride" / header.name).write_bytes(header.read_bytes())
    same = _kernel_cache._headers_define(str(folder))
    assert same == _kernel_cache._headers_define(fr.include_dir())
    (folder / "freeride" / "item_ctx.h").write_text("/* another protocol */\n")
    _kernel_cache._headers_define.cache_clear()
    assert _kernel_cache._headers_define(str(folder)) != same


def test_device_phases_need_one_kernel_and_reach_the_core(fake_driver):
    """device_phases=True (one launch may serve every phase: csrc/device_phases.hpp) is
    checked at construction and handed to the core task, which an executor with device
    phases then runs as one phase of every phase's items; without it, phase by phase."""
    RawKernel = fr.tasks.RawKernel
    two = SCALE + SCALE.replace("scale(", "other(")
    with pytest.raises(ValueError, match="device_phases=True needs one kernel for every phase"):
        RawKernel(two, ["scale", "other"], 4, (None, 2.0, 10), device_phases=True)
    with pytest.raises(TypeError, match="device_phases must be a bool, got int"):
        RawKernel(SCALE, "scale", 4, (None, 2.0, 10), device_phases=1)
    fake_driver["scale"] = [CTX_BYTES, 8, 4, 8]
    ex = _C._testing.queue_executor(device_phases=True)
    try:
        for index, (flag, items) in enumerate(((True, 12), (False, 4))):
            k = RawKernel(SCALE, "scale", 4, (None, 2.0, 10), phases=3, device_phases=flag)
            tid = ex.submit(k._build("cuda", 0).core, 0)
            assert runner_launches(ex, index).n_items == items
            assert ex.cancel(tid, False) and ex.wait(tid, 10)
    finally:
        ex.close(0.5)
