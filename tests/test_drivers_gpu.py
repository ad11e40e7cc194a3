"""The fallbacks for older drivers, forced on a new one (every test marked gpu; the host
parts are in test_device_fallback.py and test_open_watcher.py).

FREERIDE_DRIVER_API_MAX=<CUDA_VERSION> makes the CUDA backend treat every driver entry
point newer than that version as missing, as a driver of that version would (read once
per process, so each case runs in a child): 12040 is a CUDA 12.4 driver (r550: green
contexts but no stream in one), 12030 one without cuFuncGetParamInfo.
FREERIDE_DRIVER_HIDE=<names> takes single entry points away (the gate writes' batch and
stream memory operations, which every driver freeride runs on has). Test hooks force the
failures no entry point selects: loading the built-in kernels into the green context (F6),
and a driver that cannot JIT the build's PTX (G18), everywhere or only in the green
context. Each checks that the harvester still does its work (or, for an explicit device
the kernels cannot load on, raises an error naming the versions) and says what it fell
back to and why, beside a control without the switch.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

import freeride as fr
from freeride import _C, _device
from freeride.errors import CudaFallbackWarning

RESULT = "RESULT "

# Makes a harvester with the default reserve, runs an ItemCounter through it and reports
# what it used.
_HARVEST = textwrap.dedent(
    """
    import json
    import freeride as fr
    with fr.Harvester("cuda:0") as h:
        h.gate.open(stream="host")
        counts = h.submit(fr.tasks.ItemCounter(20_000, phases=2)).result(60)
        dev = fr.backend_info()["devices"][0]
        print("RESULT " + json.dumps({
            "mechanism": h.reserve_mechanism,
            "fallback": h.reserve_fallback,
            "green_contexts": dev["green_contexts"],
            "info_fallback": dev["reserve_fallback"],
            "counts": [int(counts.counts.min()), int(counts.counts.max())],
            "violations": int(counts.violations),
        }))
    """
)


def _child(script: str, env: dict | None = None, timeout: float = 180) -> dict:
    switches = ("FREERIDE_DRIVER_API_MAX", "FREERIDE_DRIVER_HIDE", "FREERIDE_GATE_WRITE")
    child_env = {k: v for k, v in os.environ.items() if k not in switches}
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    result = json.loads(lines[-1][len(RESULT) :])
    print(f"env={env}: {result}")
    return result


def _every_item_once(result: dict) -> None:
    assert result["counts"] == [1, 1] and result["violations"] == 0, result


@pytest.mark.gpu
def test_a_driver_without_green_context_streams_falls_back_to_the_occupancy_cap():
    """A CUDA 12.4 driver (r550) has the green-context calls but no stream in one: the
    default reserve is the occupancy cap, with the reason, and side work runs as before.
    Control: the same child on this driver uses the green context."""
    control = _child(_HARVEST)
    _every_item_once(control)
    if not control["green_contexts"]:
        pytest.skip(f"this driver has no green contexts itself: {control['fallback']}")
    assert control["mechanism"].startswith("green-context ("), control

    old = _child(_HARVEST, {"FREERIDE_DRIVER_API_MAX": "12040"})
    _every_item_once(old)
    assert old["mechanism"] == "occupancy-cap"
    assert old["green_contexts"] is False
    assert old["fallback"].startswith("the driver offers no green contexts"), old
    assert "cuGreenCtxStreamCreate: the driver is older than CUDA 12.5" in old["fallback"]
    assert "FREERIDE_DRIVER_API_MAX=12040" in old["fallback"]
    assert old["info_fallback"] == old["fallback"]


# The gate written in stream order on a training stream by whatever mechanism the driver
# leaves: side work waits while it is closed and runs once it opens.
_GATE = textwrap.dedent(
    """
    import json, time
    import torch
    import freeride as fr
    with fr.Harvester("cuda:0") as h:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            h.gate.close()
        s.synchronize()
        t = h.submit(fr.tasks.ItemCounter(20_000, phases=2))
        time.sleep(0.2)
        while_closed = t.items_done
        with torch.cuda.stream(s):
            h.gate.open()
        counts = t.result(60)
        dev = fr.backend_info()["devices"][0]
        print("RESULT " + json.dumps({
            "mechanism": h.gate.write_mechanism,
            "info": dev["gate_write"],
            "stream_mem_ops": dev["stream_mem_ops"],
            "while_closed": while_closed,
            "counts": [int(counts.counts.min()), int(counts.counts.max())],
            "violations": int(counts.violations),
        }))
    """
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hide", "expected"),
    [("cuStreamBatchMemOp", "memop"), ("cuStreamWriteValue32", "copy")],
    ids=["no-batch", "no-memops"],
)
def test_gate_writes_fall_back_where_the_driver_lacks_the_entry_point(hide, expected):
    """batch falls back to memop without cuStreamBatchMemOp, memop to copy without the
    stream memory operations (no driver freeride runs on lacks them: FREERIDE_DRIVER_HIDE
    takes them away). The gate still holds side work while closed. Control: batch."""
    pytest.importorskip("torch")
    control = _child(_GATE)
    assert control["mechanism"] == control["info"] == "batch", control
    assert control["while_closed"] == 0
    _every_item_once(control)
    old = _child(_GATE, {"FREERIDE_DRIVER_HIDE": hide})
    assert old["mechanism"] == old["info"] == expected, old
    assert old["stream_mem_ops"] is (expected == "memop")
    assert old["while_closed"] == 0
    _every_item_once(old)


_RAW = textwrap.dedent(
    """
    import json, warnings
    import numpy as np
    import torch
    import freeride as fr
    from nvrtc import SCALE
    with fr.Harvester("cuda:0") as h:
        h.gate.open(stream="host")
        x = torch.ones(1000, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            args = (x, np.float32(2.5), np.uint64(1000))
            h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, args)).result(60)
        refused = ""
        try:
            h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 1000))).result(60)
        except TypeError as e:
            refused = str(e)
        torch.cuda.synchronize()
        print("RESULT " + json.dumps({
            "warnings": [m for m in map(str, (w.message for w in caught))
                         if "kernel parameters" in m],
            "refused": refused,
            "x": sorted(set(x.tolist())),
        }))
    """
)


@pytest.mark.gpu
def test_a_driver_without_parameter_sizes_runs_raw_kernels_unchecked():
    """A CUDA 12.3 driver has no cuFuncGetParamInfo: RawKernel warns that the arguments
    are not checked, runs with numpy scalars and refuses plain Python numbers. Control:
    on this driver the plain numbers run, without the warning."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    pytest.importorskip("torch")
    env = {"PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    control = _child(_RAW, env)
    assert control == {"warnings": [], "refused": "", "x": [5.0]}  # scaled by 2.5, then 2
    old = _child(_RAW, {**env, "FREERIDE_DRIVER_API_MAX": "12030"})
    assert old["x"] == [2.5], old  # the second, with a plain float, never ran
    (warning,) = old["warnings"]
    assert "cannot report kernel parameters" in warning
    assert "FREERIDE_DRIVER_API_MAX=12030 hides it" in warning
    assert "is a Python float" in old["refused"], old


@pytest.mark.gpu
def test_a_failed_green_preload_falls_back_to_the_occupancy_cap():
    """F6: where loading the built-in kernels into the green context fails, the harvester
    is made with the occupancy cap and says why, instead of failing. Control: without the
    hook the same harvester keeps its green context."""
    with fr.Harvester("cuda:0") as h:
        control = (h.reserve_mechanism, h.reserve_fallback)
    if not fr.backend_info()["devices"][0]["green_contexts"]:
        pytest.skip(f"this driver has no green contexts: {control[1]}")
    assert control[0].startswith("green-context ("), control
    _C._testing.fail_green_preload(True)
    try:
        with fr.Harvester("cuda:0") as h:
            assert h.reserve_mechanism == "occupancy-cap"
            assert h.reserve_fallback.startswith("preload in the green context failed: "), (
                h.reserve_fallback
            )
            assert "forced by freeride._C._testing.fail_green_preload" in h.reserve_fallback
            assert fr.backend_info()["reserve_fallback"] == h.reserve_fallback
            h.gate.open(stream="host")
            counts = h.submit(fr.tasks.ItemCounter(20_000, phases=2)).result(60)
            assert counts.counts.min() == 1 and counts.counts.max() == 1
            assert counts.violations == 0
    finally:
        _C._testing.fail_green_preload(False)
    with fr.Harvester("cuda:0") as h:
        assert h.reserve_mechanism == control[0]  # the hook is off again


@pytest.mark.gpu
def test_auto_picks_the_gpu_without_a_warning():
    """The negative control of CudaFallbackWarning: where the CUDA backend works, auto uses
    it and says nothing, torch imported or not."""
    pytest.importorskip("torch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fr.Harvester("auto") as h:
            assert h.backend == "cuda"
    assert not [w for w in caught if issubclass(w.category, CudaFallbackWarning)]
    assert fr.backend_info()["gpu_unused"] is None


def _versions():
    """What the kernel load error must name on this machine: (compute capability, driver's
    CUDA version) as it writes them."""
    info = fr.backend_info()
    major, minor = info["devices"][0]["compute_capability"]
    driver = info["driver_version"]
    return f"compute capability {major}.{minor}", f"CUDA {driver // 1000}.{driver % 1000 // 10}"


def _names_the_versions(text):
    capability, driver = _versions()
    assert "cudaErrorUnsupportedPtxVersion" in text, text
    assert f"on CUDA device 0 ({capability})" in text, text
    assert re.search(r"built by the CUDA \d+\.\d toolkit \(PTX ISA \d+\.\d+\)", text), text
    assert f"the NVIDIA driver supports {driver}" in text, text
    assert "To use this GPU, install an NVIDIA driver that supports CUDA " in text, text


@pytest.mark.gpu
def test_kernels_the_driver_cannot_jit_raise_for_cuda_and_fall_back_for_auto(monkeypatch):
    """G18: where no built-in kernel loads (forced: cudaErrorUnsupportedPtxVersion, as a
    driver too old for the build's PTX on a GPU without machine code), an explicit device
    raises CudaUnavailableError naming the toolkit, PTX ISA, driver and compute capability,
    and device="auto" warns once with the same text and runs on the host backend. Control:
    without the switch the same harvester is a CUDA one."""
    monkeypatch.setattr(_device, "_cuda_unusable", None)  # as in a new process, and after
    _C._testing.fail_kernel_load("everywhere")
    try:
        for device in ("cuda:0", "cuda", 0):
            with pytest.raises(fr.CudaUnavailableError) as raised:
                fr.Harvester(device)
            _names_the_versions(str(raised.value))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with fr.Harvester("auto") as h:
                assert h.backend == "host"
                h.gate.open(stream="host")
                h.submit(fr.tasks.Spin(8, 1000)).result(60)
        (warning,) = [w for w in caught if issubclass(w.category, CudaFallbackWarning)]
        assert str(raised.value) in str(warning.message)
        _names_the_versions(str(warning.message))
    finally:
        _C._testing.fail_kernel_load("")
    with fr.Harvester("cuda:0") as h:
        assert h.backend == "cuda"  # the switch is off again


@pytest.mark.gpu
def test_a_green_context_the_driver_cannot_jit_into_falls_back_naming_the_versions():
    """G18: where the built-in kernels load on the device but not into the green context
    (forced, as above), the harvester falls back to the occupancy cap, and its reason names
    the versions as the error would. Control: without the switch it keeps the green
    context."""
    with fr.Harvester("cuda:0") as h:
        control = (h.reserve_mechanism, h.reserve_fallback)
    if not fr.backend_info()["devices"][0]["green_contexts"]:
        pytest.skip(f"this driver has no green contexts: {control[1]}")
    assert control[0].startswith("green-context ("), control
    _C._testing.fail_kernel_load("green-context")
    try:
        with fr.Harvester("cuda:0") as h:
            assert h.reserve_mechanism == "occupancy-cap"
            assert h.reserve_fallback.startswith(
                "preload in the green context failed: freeride's built-in kernels cannot be "
                "loaded on CUDA device 0"
            ), h.reserve_fallback
            _names_the_versions(h.reserve_fallback)
            h.gate.open(stream="host")
            counts = h.submit(fr.tasks.ItemCounter(20_000, phases=2)).result(60)
            assert counts.counts.min() == 1 and counts.counts.max() == 1
            assert counts.violations == 0
    finally:
        _C._testing.fail_kernel_load("")
    with fr.Harvester("cuda:0") as h:
        assert h.reserve_mechanism == control[0]  # the switch is off again
