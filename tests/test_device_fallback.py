"""device="auto" on a machine with a GPU that freeride's CUDA backend cannot use (a build
without it, a driver older than its runtime needs, a driver that cannot run the build's
kernels on the GPU) warns once, naming the driver, what the build needs and what to do,
and `freeride info` prints the same for the first two; never a silent fallback to the CPU.
An explicit CUDA device raises instead. Checked without a GPU by faking what torch and the
backend report (tests/test_drivers_gpu.py forces the kernel load failure on a GPU)."""

import json
import os
import re
import subprocess
import sys
import textwrap
import types
import warnings

import pytest

import freeride as fr
from conftest import HAS_GPU
from freeride import _C, _device, harvester, info
from freeride.errors import CudaFallbackWarning

# What a CUDA 13 build reports on a machine whose r535 driver supports CUDA 12.2.
OLD_DRIVER = {
    "cuda": False,
    "cuda_built": True,
    "runtime_version": 13000,
    "driver_version": 12020,
    "devices": [],
    "cuda_error": "cudaErrorInsufficientDriver",
    "reason": "the NVIDIA driver supports CUDA 12.2, older than the CUDA 13.0 runtime "
    "freeride was built with: update the driver",
}
HOST_BUILD = {
    "cuda": False,
    "cuda_built": False,
    "runtime_version": 0,
    "driver_version": 0,
    "devices": [],
    "cuda_error": "",
    "reason": "built without CUDA",
}
NO_DRIVER = {**OLD_DRIVER, "driver_version": 0, "reason": "no NVIDIA driver found"}


def fake_torch(gpus: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: gpus > 0, device_count=lambda: gpus)
    return torch


@pytest.fixture
def fresh(monkeypatch):
    """resolve_device as in a new process: nothing warned yet, no torch imported, no
    kernel module version; `set(torch=, info=, driver=)` fakes them."""
    monkeypatch.setattr(_device, "_warned_fallback", False)
    monkeypatch.setattr(_device, "_cuda_unusable", None)
    monkeypatch.setitem(sys.modules, "torch", None)  # sys.modules.get: not imported
    monkeypatch.setattr(_device, "kernel_driver_version", lambda: None)

    def set_(torch=None, backend=None, driver=None):
        if torch is not None:
            monkeypatch.setitem(sys.modules, "torch", torch)
        if backend is not None:
            monkeypatch.setattr(_device, "backend_info", lambda: dict(backend))
        monkeypatch.setattr(_device, "kernel_driver_version", lambda: driver)

    return set_


def _auto(device="auto"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolved = _device.resolve_device(device)
    return resolved, [w for w in caught if issubclass(w.category, CudaFallbackWarning)]


@pytest.mark.skipif(HAS_GPU, reason="the host backend is what auto picks only without a GPU")
def test_auto_warns_once_where_torch_sees_a_gpu_freeride_cannot_use(fresh):
    fresh(torch=fake_torch(2))
    resolved, caught = _auto()
    assert resolved == ("host", -1)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert issubclass(CudaFallbackWarning, RuntimeWarning)
    assert "torch sees 2 CUDA device(s)" in text
    assert "host backend" in text and "device='cpu'" in text
    assert fr.backend_info()["reason"] in text  # this machine's own reason
    # Once per process: neither the next "auto" nor None warns again.
    assert _auto() == (("host", -1), [])
    assert _auto(None) == (("host", -1), [])


@pytest.mark.skipif(HAS_GPU, reason="the host backend is what auto picks only without a GPU")
def test_choosing_the_host_backend_explicitly_does_not_warn(fresh):
    fresh(torch=fake_torch(2))
    assert _auto("cpu") == (("host", -1), [])
    assert _auto("host") == (("host", -1), [])
    _, caught = _auto()  # the negative control: auto still does
    assert len(caught) == 1


def test_a_driver_older_than_the_runtime_is_named_with_what_is_needed(fresh):
    fresh(torch=fake_torch(8), backend=OLD_DRIVER, driver="535.104.05")
    resolved, caught = _auto()
    assert resolved == ("host", -1)
    (warning,) = caught
    text = str(warning.message)
    assert "torch sees 8 CUDA device(s)" in text
    assert "The NVIDIA driver 535.104.05 supports CUDA 12.2." in text
    assert "built with the CUDA 13.0 runtime, which needs an NVIDIA driver r580 or newer" in text
    assert "install an NVIDIA driver r580 or newer" in text
    assert f"a CUDA 12.x toolkit ({info.CUDA_TOOLKIT_FLOOR} or later)" in text
    assert "runs on r525+ drivers" in text
    assert "FREERIDE_CUDA=1" in text and "device='cpu'" in text


def test_a_cuda_12_build_names_its_own_driver_floor():
    text = info.gpu_unused({**OLD_DRIVER, "runtime_version": 12050, "driver_version": 11080}, 1)
    assert "built with the CUDA 12.5 runtime, which needs an NVIDIA driver r525 or newer" in text
    assert "install an NVIDIA driver r525 or newer;" in text
    assert "CUDA 12.x toolkit" not in text  # no older build to fall back to


def test_an_old_driver_warns_without_torch(fresh):
    """The build's own runtime found a driver it cannot use: a GPU machine, torch or not."""
    fresh(backend=OLD_DRIVER)
    _, caught = _auto()
    assert len(caught) == 1
    assert "an NVIDIA driver is installed" in str(caught[0].message)


@pytest.mark.parametrize(
    "backend",
    [
        NO_DRIVER,
        HOST_BUILD,
        {**OLD_DRIVER, "cuda_error": "cudaErrorNoDevice", "reason": "sees no CUDA device"},
    ],
    ids=["no-driver", "host-build", "devices-hidden"],
)
def test_no_warning_where_nothing_says_there_is_a_gpu(fresh, backend):
    """No driver, a host build without torch, or every device hidden (CUDA_VISIBLE_DEVICES
    set empty on purpose): a CPU machine as far as anyone can tell."""
    fresh(backend=backend)
    assert _auto() == (("host", -1), [])


def test_a_host_build_on_a_gpu_machine_says_to_rebuild(fresh):
    fresh(torch=fake_torch(1), backend=HOST_BUILD, driver="580.65.06")
    _, (warning,) = _auto()
    text = str(warning.message)
    assert "The NVIDIA driver 580.65.06 is loaded." in text
    assert "has no CUDA backend" in text
    assert f"CUDA {info.CUDA_TOOLKIT_FLOOR}+ toolkit whose runtime this driver runs" in text
    assert "(12.x: r525+, 13.x: r580+;" in text and "FREERIDE_CUDA=1" in text


@pytest.mark.skipif(HAS_GPU, reason="the host backend is what auto picks only without a GPU")
def test_the_harvester_warns_at_the_callers_line(fresh):
    fresh(torch=fake_torch(1))
    with pytest.warns(CudaFallbackWarning) as caught:
        h = fr.Harvester("auto")
    h.close()
    assert caught[0].filename == __file__


def test_kernel_driver_version_reads_the_module_line(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC "
        "2023\nGCC version:  gcc version 12.2.0\n"
    )
    assert info.kernel_driver_version(str(proc)) == "535.104.05"
    open_kernel = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release"
    proc.write_text(open_kernel)
    assert info.kernel_driver_version(str(proc)) == "580.65.06"
    assert info.kernel_driver_version(str(tmp_path / "missing")) is None


def test_a_malformed_driver_api_max_is_refused(monkeypatch):
    """FREERIDE_DRIVER_API_MAX hides driver entry points newer than a CUDA version, to
    reach older drivers' fallbacks; one that is no version number would hide nothing."""
    monkeypatch.setenv("FREERIDE_DRIVER_API_MAX", "12.4")
    with pytest.raises(
        ValueError, match=r"FREERIDE_DRIVER_API_MAX must be .*\(12040 for CUDA 12.4\), got '12.4'"
    ):
        fr.Harvester("cuda")
    monkeypatch.setenv("FREERIDE_DRIVER_API_MAX", "12040")
    if not HAS_GPU:  # a well-formed one gets as far as the missing GPU
        with pytest.raises(fr.CudaUnavailableError):
            fr.Harvester("cuda")


_STUB_TORCH = textwrap.dedent(
    """
    import types
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 3)
    """
)


def test_freeride_info_prints_the_diagnosis(tmp_path):
    """`freeride info` asks torch (here a stub that sees 3 GPUs) and prints the warning's
    text: in its summary, and with --json on stderr and as gpu_unused; on a machine whose
    GPU freeride uses, neither."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(_STUB_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))

    def info(*args):
        proc = subprocess.run(
            [sys.executable, "-m", "freeride", "info", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    proc = info("--json")
    found = json.loads(proc.stdout)
    readable = info().stdout
    if HAS_GPU:
        assert found["gpu_unused"] is None and "torch sees" not in proc.stderr
        assert "GPU unused" not in readable
        return
    assert found["gpu_unused"].startswith("freeride: torch sees 3 CUDA device(s)")
    assert found["gpu_unused"] in proc.stderr
    assert found["reason"] in found["gpu_unused"]
    assert f"GPU unused: {found['gpu_unused']}" in readable


# -- a driver that cannot run the build's kernels on the GPU ---------------------------------

# What backend_info says on a machine whose GPU the runtime can use: the failure comes only
# when the CUDA backend loads its kernels.
USABLE = {
    "cuda": True,
    "cuda_built": True,
    "runtime_version": 13000,
    "driver_version": 12080,
    "devices": [{"index": 0, "name": "a Blackwell", "sm_count": 148}],
    "cuda_error": "",
    "reason": "",
}
# A Blackwell GPU (no machine code in the default build) on an r570 driver (CUDA 12.8),
# which cannot JIT the CUDA 13.0 toolkit's PTX.
BLACKWELL = {
    "error": "cudaErrorUnsupportedPtxVersion",
    "device": 0,
    "compute_capability": 100,
    "toolkit": 13000,
    "ptx_isa": "9.0",
    "architectures": "80-real,90",
    "runtime": 13000,
    "driver": 12080,
}


def _message(**changes):
    return _C._testing.kernel_image_message(**{**BLACKWELL, **changes})


def test_a_driver_too_old_for_the_ptx_is_named_with_what_to_do():
    text = _message()
    assert text.startswith(
        "freeride's built-in kernels cannot be loaded on CUDA device 0 (compute capability "
        "10.0): cudaErrorUnsupportedPtxVersion."
    )
    assert "built by the CUDA 13.0 toolkit (PTX ISA 9.0) for the CUDA architectures 80-real;90" in (
        text
    )
    assert "the NVIDIA driver supports CUDA 12.8 (the runtime linked in is CUDA 13.0)" in text
    assert "must JIT-compile its PTX" in text and "no newer than the CUDA version" in text
    assert "install an NVIDIA driver that supports CUDA 13.0 or later (r580 or newer)" in text
    assert 'FREERIDE_CUDA_ARCHS="80-real;90;100-real" pip install .' in text
    assert "supports compute capability 10.0" in text
    # A 12.9 build's PTX needs r575; a toolkit newer than the table names no branch.
    assert "CUDA 12.9 or later (r575 or newer)" in _message(toolkit=12090, ptx_isa="8.8")
    assert "CUDA 13.2 or later, or rebuild" in _message(toolkit=13020)


def test_a_device_older_than_the_ptx_needs_a_rebuild_not_a_driver():
    text = _message(error="cudaErrorNoKernelImageForDevice", compute_capability=75)
    assert "(compute capability 7.5)" in text
    assert "its PTX is for newer architectures only" in text
    assert "install an NVIDIA driver" not in text  # no driver runs compute_90 PTX on a 7.5
    assert 'FREERIDE_CUDA_ARCHS="80-real;90;75-real"' in text


def test_machine_code_the_driver_refuses_needs_a_driver_not_a_rebuild():
    text = _message(error="cudaErrorInvalidDeviceFunction", compute_capability=90)
    assert "has machine code for this device's architecture, and the driver refused it" in text
    assert text.endswith(
        "install an NVIDIA driver that supports CUDA 13.0 or later (r580 or newer)."
    )


def test_architectures_it_cannot_read_are_not_added_to():
    text = _message(architectures="native")
    assert "for the CUDA architectures native;" in text
    assert "The driver must JIT-compile the build's PTX for this device" in text
    assert 'FREERIDE_CUDA_ARCHS="100" pip install .' in text


@pytest.mark.parametrize(
    ("error", "todo"),
    [
        ("cudaErrorJitCompilationDisabled", "unset CUDA_DISABLE_PTX_JIT, or rebuild"),
        ("cudaErrorJitCompilerNotFound", "install the NVIDIA driver's PTX JIT compiler, or"),
    ],
)
def test_a_jit_that_is_off_or_missing_says_so(error, todo):
    text = _message(error=error, driver=13000)
    assert todo in text
    assert "install an NVIDIA driver that supports" not in text


def test_which_load_errors_mean_no_usable_code():
    for error in (
        "cudaErrorUnsupportedPtxVersion",
        "cudaErrorNoKernelImageForDevice",
        "cudaErrorInvalidPtx",
        "cudaErrorJitCompilerNotFound",
        "cudaErrorJitCompilationDisabled",
        "cudaErrorInvalidKernelImage",
        "cudaErrorInvalidDeviceFunction",
    ):
        assert _C._testing.is_kernel_image_error(error), error
    for error in ("cudaErrorMemoryAllocation", "cudaErrorIllegalAddress", ""):
        assert not _C._testing.is_kernel_image_error(error), error


@pytest.mark.skipif(not _C.CUDA_BUILT, reason="the facts are the CUDA build's")
def test_the_build_names_its_own_toolkit_ptx_and_architectures():
    """What CMake hands load_error.cu: nvcc's PTX ISA (asked at configure time) and the
    build's architectures, and the runtime's version."""
    text = _C._testing.kernel_load_error()
    runtime = fr.backend_info()["runtime_version"]
    assert f"(the runtime linked in is CUDA {runtime // 1000}.{runtime % 1000 // 10})" in text
    assert re.search(
        r"built by the CUDA \d+\.\d toolkit \(PTX ISA \d+\.\d+\) for the CUDA "
        r"architectures [0-9][^ ]*;",
        text,
    ), text


def test_the_error_reaches_python_as_cuda_unavailable():
    with pytest.raises(fr.CudaUnavailableError, match="^no code here$"):
        _C._testing.raise_kernel_image_error("no code here")


class _NoKernelsOnCuda:
    """The Executor of a machine whose driver cannot run the build's kernels on its GPU:
    the CUDA backend raises what the core raises there; the host backend is the real one."""

    def __init__(self, kind, *args, **kwargs):
        if kind == "cuda":
            raise fr.CudaUnavailableError(_message())
        self._real = _C.Executor(kind, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_auto_takes_the_host_backend_where_the_driver_cannot_run_the_kernels(fresh, monkeypatch):
    fresh(backend=USABLE)
    monkeypatch.setattr(harvester, "Executor", _NoKernelsOnCuda)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fr.Harvester("auto") as h:
            assert h.backend == "host" and h.device == "cpu"
            h.gate.open(stream="host")
            h.submit(fr.tasks.Spin(4, 1000)).result(30)
    (warning,) = [w for w in caught if issubclass(w.category, CudaFallbackWarning)]
    text = str(warning.message)
    assert text.startswith("freeride: device='auto' runs side tasks on the host backend")
    assert _message() in text  # the versions and what to do
    assert text.endswith("Pass device='cpu' to choose the host backend without this warning.")
    assert warning.filename == __file__  # the caller's line
    # Once per process: later "auto"s go to the host backend at once, without a warning.
    assert _auto() == (("host", -1), [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fr.Harvester(None).close()
    assert not [w for w in caught if issubclass(w.category, CudaFallbackWarning)]


@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0])
def test_an_explicit_cuda_device_raises_the_versions_instead(fresh, monkeypatch, device):
    fresh(backend=USABLE)
    monkeypatch.setattr(harvester, "Executor", _NoKernelsOnCuda)
    with pytest.raises(fr.CudaUnavailableError) as raised:
        fr.Harvester(device)
    assert str(raised.value) == _message()
    assert _device._cuda_unusable is None  # auto still tries the GPU
