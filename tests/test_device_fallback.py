"""device="auto" on a machine with a GPU that freeride's CUDA backend cannot use (a build
without it, a driver older than its runtime needs) warns once, naming the driver, what the
build needs and what to do, and `freeride info` prints the same; never a silent fallback
to the CPU. Checked without a GPU by faking what torch and the backend report."""

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings

import pytest

import freeride as fr
from conftest import HAS_GPU
from freeride import _device, info
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
    text on stderr and as gpu_unused; on a machine whose GPU freeride uses, neither."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(_STUB_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    proc = subprocess.run(
        [sys.executable, "-m", "freeride", "info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    if HAS_GPU:
        assert found["gpu_unused"] is None and "torch sees" not in proc.stderr
        return
    assert found["gpu_unused"].startswith("freeride: torch sees 3 CUDA device(s)")
    assert found["gpu_unused"] in proc.stderr
    assert found["reason"] in found["gpu_unused"]
