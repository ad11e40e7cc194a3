"""fr.tasks.RawKernel without a GPU: the ImportError without CuPy, bad inputs caught at
construction, arguments checked and packed against parameter sizes as the driver gives
them (here given explicitly, or taken from the PTX NVRTC builds), the path from
compile() to the core task with the driver's answers faked, the fallback for a driver
without cuFuncGetParamInfo, and the host backend's refusal."""

import os
import pathlib
import sys
import time
import types
import warnings
from contextlib import nullcontext

import numpy as np
import pytest
from nvrtc import SCALE, NvrtcError, compile_ptx, find_nvrtc, ptx_param_sizes

import freeride as fr
from conftest import wait_until
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


# ---- On a GPU (with CuPy): the same kernels compiled by CuPy and run by the executor ----

COUNT = r"""
#include <freeride/preempt.cuh>
// counts[phase * items + item] += 1, and a violation for an item that starts before the
// previous phase finished.
extern "C" __global__ void count(fr_item_ctx ctx, unsigned int* counts,
                                 unsigned long long* phase_done, unsigned int* violations,
                                 unsigned long long ns) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    if (threadIdx.x == 0) {
      if (ctx.phase > 0 && phase_done[ctx.phase - 1] != ctx.n_items) atomicAdd(violations, 1u);
      unsigned long long t0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      for (unsigned long long t = t0; t - t0 < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      atomicAdd(&counts[ctx.phase * ctx.n_items + item], 1u);
      __threadfence();
      atomicAdd(&phase_done[ctx.phase], 1ull);
    }
  });
}
"""


@pytest.fixture
def gpu():
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    torch = pytest.importorskip("torch")
    with fr.Harvester("cuda:0", memory_budget="1GiB") as h:
        yield h, torch


@pytest.fixture
def gpu_no_slice():
    """A harvester without a time slice: a launch ends only when its phase completes or
    the gate closes, so launches beyond one per phase count the pauses."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    torch = pytest.importorskip("torch")
    with fr.Harvester("cuda:0", memory_budget="1GiB", time_slice=None) as h:
        yield h, torch


def _count_buffers(torch, items, phases):
    # The kernel takes unsigned pointers: views give the tensors the dtypes it names.
    counts = torch.zeros(items * phases, dtype=torch.int32, device="cuda").view(torch.uint32)
    done = torch.zeros(phases, dtype=torch.int64, device="cuda").view(torch.uint64)
    violations = torch.zeros(1, dtype=torch.int32, device="cuda").view(torch.uint32)
    return counts, done, violations


@pytest.mark.gpu
def test_gpu_scale_matches_torch(gpu):
    h, torch = gpu
    n = 1_000_003
    x = torch.randn(n, device="cuda")
    expected = x * 2.5
    h.gate.open()
    handle = h.submit(fr.tasks.RawKernel(SCALE, "scale", (n + 255) // 256, (x, 2.5, n)))
    assert handle.result(timeout=60)[0] is x
    torch.cuda.synchronize()
    assert torch.equal(x, expected)


@pytest.mark.gpu
def test_gpu_driver_reports_the_parameter_sizes_and_numpy_scalars_run(gpu):
    """The driver's sizes (cuFuncGetParamInfo) are those the rule packs for: the context
    first, then pointer, float, unsigned long long. numpy scalars give the same result
    as plain numbers."""
    h, torch = gpu
    k = fr.tasks.RawKernel(SCALE, "scale", 1, (None, 2.0, 0))
    info = fr._C.function_info(k.compile()["scale"])
    assert info["param_sizes"] == [CTX_BYTES, 8, 4, 8], info
    h.gate.open()
    x = torch.ones(1000, device="cuda")
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, np.float32(2.5), np.uint64(1000)))).result(
        60
    )
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 1000))).result(60)
    torch.cuda.synchronize()
    assert torch.all(x == 5.0)


@pytest.mark.gpu
def test_gpu_exactly_once_across_phases_under_gate_flips(gpu_no_slice):
    """Every item once across phases under flips from another thread. No time slice, so
    launches beyond the phases are flips that paused one. Negative control: the same
    kernel without flips runs in one launch per phase."""
    import threading

    h, torch = gpu_no_slice
    items, phases = 20_000, 3  # 100 us items: each phase spans several gate flips
    quiet_buffers = _count_buffers(torch, items, phases)
    quiet = h.submit(
        fr.tasks.RawKernel(COUNT, "count", items, (*quiet_buffers, 100_000), phases=phases)
    )
    quiet.result(timeout=120)
    assert torch.all(quiet_buffers[0].view(torch.int32) == 1)
    assert quiet.launches <= phases + 1, f"{quiet.launches} launches without flips or slices"
    counts, done, violations = _count_buffers(torch, items, phases)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            h.gate.open(stream="host")
            time.sleep(0.0007)
            h.gate.close(stream="host")
            time.sleep(0.0003)

    k = fr.tasks.RawKernel(
        COUNT, "count", items, (counts, done, violations, 100_000), phases=phases
    )
    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        handle = h.submit(k)
        assert handle.wait(120)
    finally:
        stop.set()
        flipper.join()
    handle.result()
    print(f"launches: {quiet.launches} without flips, {handle.launches} with")
    assert handle.launches > quiet.launches, "no launch was paused by a flip"
    assert torch.all(counts.view(torch.int32) == 1)
    assert int(violations.view(torch.int32)[0]) == 0


@pytest.mark.gpu
def test_gpu_example_kernels_match_numpy(gpu):
    h, torch = gpu
    source = EXAMPLE.read_text()
    n, steps = 100_000, 31
    u0 = torch.zeros(n, device="cuda")
    u0[n // 2 - 50 : n // 2 + 50] = 100.0
    initial = u0.cpu().numpy()
    u1 = torch.empty_like(u0)
    h.gate.open()
    tiles = (n + 255) // 256
    h.submit(
        fr.tasks.RawKernel(source, "heat_step", tiles, (u0, u1, 0.25, n), phases=steps)
    ).result(60)
    ref = initial.copy()
    for _ in range(steps):
        nxt = ref.copy()
        nxt[1:-1] = ref[1:-1] + np.float32(0.25) * (ref[:-2] - 2 * ref[1:-1] + ref[2:])
        ref = nxt
    out = (u1 if steps % 2 else u0).cpu().numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_gpu_compile_errors_and_bad_arguments_leave_the_harvester_usable(gpu):
    h, torch = gpu
    broken = SCALE.replace("x[i] *= a", "x[i] *= b")
    with pytest.raises(fr.KernelCompileError) as info:
        h.submit(fr.tasks.RawKernel(broken, "scale", 4, (None, 2.0, 10)))
    assert "undefined" in info.value.log
    not_c = SCALE.replace('extern "C" ', "")
    with pytest.raises(fr.KernelCompileError, match='extern "C"'):
        h.submit(fr.tasks.RawKernel(not_c, "scale", 4, (None, 2.0, 10)))
    # Count and sizes, from the driver (cuFuncGetParamInfo), at submit.
    x = torch.zeros(10, device="cuda")
    with pytest.raises(TypeError, match=r"kernel 'scale' takes 3 argument\(s\) after fr_item"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0)))
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' .* float64 scalar"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, np.float64(2.0), 10)))
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' is a 4-byte .* array"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, x, 10)))
    no_ctx = (
        SCALE.replace("fr_item_ctx ctx, ", "")
        .replace(
            "freeride::for_each_item(ctx, [&](unsigned long long item) {",
            "{ unsigned long long item = 0;",
        )
        .replace("});", "}")
    )
    with pytest.raises(TypeError, match="first parameter of kernel 'scale' must be `fr_item_ctx"):
        h.submit(fr.tasks.RawKernel(no_ctx, "scale", 4, (x, 2.0, 10)))
    with pytest.raises(ValueError, match="must be on cuda:0"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (torch.zeros(10), 2.0, 10)))
    bounded = SCALE.replace("__global__ void", "__global__ void __launch_bounds__(64)")
    with pytest.raises(ValueError, match="exceeds what kernel 'scale' can run with"):
        h.submit(fr.tasks.RawKernel(bounded, "scale", 4, (None, 2.0, 10), block=128))
    with pytest.raises(fr.MemoryBudgetError):
        big = torch.zeros(300 * 2**20, dtype=torch.float32, device="cuda")  # 1.2 GiB > budget
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (big, 2.0, 10))).result(10)
    del big
    h.gate.open()
    x = torch.ones(10, device="cuda")
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 1, (x, 3.0, 10))).result(60)
    assert torch.all(x == 3.0)


@pytest.mark.gpu
def test_gpu_compile_cache_and_memory_accounting(gpu):
    h, torch = gpu
    source = SCALE.replace("*= a", "*= a * 1.0f")  # a module no other test compiled
    before = fr.tasks.RawKernel.cache_info()
    x = torch.ones(1 << 20, device="cuda")
    k = fr.tasks.RawKernel(source, "scale", 4096, (x, 1.0, 1 << 20))
    functions = k.compile()
    assert fr.tasks.RawKernel.cache_info().misses == before.misses + 1
    again = fr.tasks.RawKernel(source, "scale", 4096, (x, 1.0, 1 << 20))
    assert again.compile() == functions
    assert fr.tasks.RawKernel.cache_info().hits >= before.hits + 1
    # With the gate closed the task is admitted, holding its memory, and cannot finish
    # (and give the memory back) before the poll sees it.
    h.gate.close(stream="host")
    handle = h.submit(again)
    wait_until(lambda: h.memory_used == x.numel() * 4)
    assert not handle.done()
    h.gate.open(stream="host")
    handle.result(timeout=60)
    wait_until(lambda: h.memory_used == 0)


SKIPS_THE_LOOP = r"""
#include <freeride/preempt.cuh>
// Phase 0 runs the item loop; phase 1 returns before it (a kernel bug): its launches
// would end with nothing done and nobody held back by the gate, forever.
extern "C" __global__ void lazy(fr_item_ctx ctx, unsigned int* touched) {
  if (ctx.phase == 1) {
    if (threadIdx.x == 0) atomicAdd(touched, 1u);
    return;
  }
  freeride::for_each_item(ctx, [&](unsigned long long) {});
}
"""


@pytest.mark.gpu
def test_gpu_kernel_that_skips_the_item_loop_fails_instead_of_looping(gpu):
    h, torch = gpu
    touched = torch.zeros(1, dtype=torch.int32, device="cuda").view(torch.uint32)
    h.gate.open()
    handle = h.submit(fr.tasks.RawKernel(SKIPS_THE_LOOP, "lazy", 1000, (touched,), phases=2))
    assert handle.wait(timeout=60), "the broken kernel was relaunched instead of failing"
    with pytest.raises(fr.TaskFailedError, match="must call freeride::for_each_item"):
        handle.result()
    assert handle.launches == 2  # phase 0 once, phase 1 once: never relaunched
    assert handle.items_done == 1000
    # The harvester goes on: a correct kernel runs after it.
    x = torch.ones(10, device="cuda")
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 1, (x, 3.0, 10))).result(60)
    assert torch.all(x == 3.0)


@pytest.mark.gpu
def test_gpu_paused_launches_of_a_correct_kernel_are_not_taken_for_a_broken_one(gpu_no_slice):
    """Launches cut short by the gate end with the phase unfinished too; they must go on.
    No time slice, so only the gate cuts the phase. Negative control: without flips the
    phase runs in one launch, which the flipped run must clearly exceed."""
    h, torch = gpu_no_slice
    # Sized to the device: 3200 items of 50 us per SM, on at most 8 blocks of 256 threads
    # per SM, take at least 20 ms of open gate, so the 20 flips below (one per 3 ms) cut
    # the phase many times on any GPU.
    items = fr.backend_info()["devices"][0]["sm_count"] * 8 * 400
    h.gate.open()
    quiet_buffers = _count_buffers(torch, items, 1)
    quiet = h.submit(fr.tasks.RawKernel(COUNT, "count", items, (*quiet_buffers, 50_000)))
    quiet.result(timeout=120)
    assert quiet.launches <= 2, f"{quiet.launches} launches without flips or slices"
    counts, done, violations = _count_buffers(torch, items, 1)
    handle = h.submit(fr.tasks.RawKernel(COUNT, "count", items, (counts, done, violations, 50_000)))
    for _ in range(20):
        time.sleep(0.002)
        h.gate.close(stream="host")
        time.sleep(0.001)
        h.gate.open(stream="host")
    handle.result(timeout=120)
    print(f"launches: {quiet.launches} without flips, {handle.launches} with 20 flips")
    assert handle.launches > quiet.launches + 3, (
        f"{handle.launches} launches with flips against {quiet.launches} without: the phase "
        "was hardly cut"
    )
    assert torch.all(counts.view(torch.int32) == 1)


@pytest.mark.gpu
def test_gpu_example_script_runs():
    """examples/raw_kernel.py end to end: both tasks in the bubbles of a stand-in loop,
    checked against torch and numpy by the script itself."""
    pytest.importorskip("cupy", reason="the example needs CuPy")
    import subprocess

    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "raw_kernel.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "both results match" in proc.stdout


FAULTS = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void wild(fr_item_ctx ctx, float* p) {
  freeride::for_each_item(ctx, [&](unsigned long long) {
    if (threadIdx.x == 0) p[0] = 1.0f;  // p is a null pointer: an illegal address
  });
}
"""

_FAULT_CHILD = f"""
import sys, torch, freeride as fr
source = {FAULTS!r}
with fr.Harvester("cuda:0") as h:
    h.gate.open()
    t = h.submit(fr.tasks.RawKernel(source, "wild", 4, (None,)))
    t.wait(60)
    print("state", t.state)
    try:
        t.result()
    except fr.TaskFailedError as e:
        print("error", e)
    try:
        torch.ones(4, device="cuda").sum().item()
        print("context usable")
    except Exception as e:
        print("context unusable:", type(e).__name__)
"""


@pytest.mark.gpu
def test_gpu_faulting_kernel_fails_its_task_and_poisons_only_its_process():
    """What docs/guide.md says is true: an illegal address fails the task with CUDA's error
    (no crash), and the CUDA context of that process is then unusable, training included.
    Which is why untrusted kernels are tried in a separate process first."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy")
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _FAULT_CHILD],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), out[-3000:]  # an exception at exit, never a signal
    assert "state failed" in proc.stdout, out[-3000:]
    assert "illegal" in proc.stdout.lower(), out[-3000:]
    assert "context unusable" in proc.stdout, out[-3000:]


_PRODUCE = r"""
extern "C" __global__ void produce(float* x, unsigned long long n, unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    x[i] = 1.0f;
  }
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("current", [True, False], ids=["current-stream", "other-stream"])
def test_submit_follows_cupys_current_stream_on_a_gpu(gpu, current):
    """Issue 20 item 3: CuPy inputs produced on CuPy's current stream (not torch's) are
    complete before the side task reads them. A producer kernel spins 50 ms, then writes
    x = 1; Saxpy (y += 2 x) submitted right after must see every 1. Negative control
    (other-stream): the same producer on a CuPy stream that is not current when
    submit() is called, which freeride cannot know about: Saxpy then runs during the
    producer's 50 ms spin and reads zeros, so y is not all 2 (proving the check can
    fail)."""
    cupy = pytest.importorskip("cupy")
    h, _ = gpu
    n = 1 << 20
    x = cupy.zeros(n, dtype=cupy.float32)
    y = cupy.zeros(n, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    produce = cupy.RawKernel(_PRODUCE, "produce")
    producer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        produce((64,), (256,), (x, cupy.uint64(n), cupy.uint64(50_000_000)))
    if current:
        with producer:
            task = h.submit(fr.tasks.Saxpy(2.0, x, y))
    else:
        task = h.submit(fr.tasks.Saxpy(2.0, x, y))
    assert task.wait(timeout=30)
    producer.synchronize()
    low = float(y.min())
    if current:
        assert low == 2.0, (
            f"Saxpy read inputs before the producer on CuPy's stream wrote them: {low}"
        )
    else:
        assert low == 0.0, (
            f"negative control: Saxpy should have overtaken the producer, y.min()={low}"
        )


def test_compile_options_name_the_headers_contents(tmp_path):
    """CuPy caches compiled modules on disk by source and options only: the options carry
    a digest of preempt.cuh and item_ctx.h, so a header change (a new item protocol)
    compiles afresh instead of loading a module built against the old one."""
    folder = tmp_path / "include"
    (folder / "freeride").mkdir(parents=True)
    for name in ("preempt.cuh", "item_ctx.h"):
        (folder / "freeride" / name).write_bytes(
            (pathlib.Path(fr.include_dir()) / "freeride" / name).read_bytes()
        )
    same = _kernel_cache._headers_define(str(folder))
    assert same == _kernel_cache._headers_define(fr.include_dir())
    (folder / "freeride" / "item_ctx.h").write_text("/* another protocol */\n")
    _kernel_cache._headers_define.cache_clear()
    assert _kernel_cache._headers_define(str(folder)) != same
