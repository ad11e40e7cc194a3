"""CUDA's lazy module loading beside time_slice=None side work.

Under lazy loading (CUDA's default since 12.2) a kernel's first launch loads it, and
the load may synchronise the context: beside a side launch without a time slice, which
ends only at the gate's close, a thread that launches a kernel for the first time before
enqueueing that close never returns (tests/test_hardware_queues.py hung so on an H200).
backend_info() says how this process loads kernels, and Harvester(time_slice=None)
warns on CUDA where loading is lazy. The warning's logic is checked without a GPU by
faking what backend_info reports; on a GPU, what the driver reports is checked against
CUDA_MODULE_LOADING in fresh processes.
"""

import json
import os
import subprocess
import sys
import warnings

import pytest

import freeride as fr
from freeride import _harvester_args as harvester_args


def test_backend_info_reports_module_loading():
    info = fr.backend_info()
    assert "module_loading" in info
    if info["cuda"]:
        assert info["module_loading"] in ("lazy", "eager", None)
    else:
        assert info["module_loading"] is None  # no driver or device to ask


@pytest.fixture
def loading(monkeypatch):
    """fake(mode): backend_info, as the harvester reads it, reports `mode`."""

    def fake(mode):
        info = {**fr.backend_info(), "module_loading": mode}
        monkeypatch.setattr(harvester_args, "backend_info", lambda: info)

    return fake


def _caught(kind, time_slice):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _init_like(kind, time_slice)  # the line the warning must point at
    return [w for w in caught if "CUDA_MODULE_LOADING" in str(w.message)]


def _init_like(kind, time_slice):
    """Stands in for Harvester.__init__, which calls the check directly."""
    harvester_args.warn_if_lazy_loading(kind, time_slice)


def test_no_time_slice_under_lazy_loading_warns_at_the_caller(loading):
    loading("lazy")
    (warning,) = _caught("cuda", None)
    assert warning.category is RuntimeWarning
    text = str(warning.message)
    assert "time_slice=None" in text and "CUDA_MODULE_LOADING=EAGER" in text
    assert "launch every kernel once" in text
    # stacklevel: the frame that made the harvester (here, _caught), not freeride's.
    assert warning.filename == __file__
    with open(__file__) as f:
        assert "_init_like(kind, time_slice)" in f.read().splitlines()[warning.lineno - 1]


@pytest.mark.parametrize(
    ("mode", "kind", "time_slice"),
    [
        ("eager", "cuda", None),  # every kernel loaded when CUDA initialised
        (None, "cuda", None),  # unknown: nothing to say
        ("lazy", "cuda", 0.002),  # a sliced launch ends by itself
        ("lazy", "host", None),  # no kernels
    ],
)
def test_no_warning_where_a_first_launch_cannot_deadlock(loading, mode, kind, time_slice):
    loading(mode)
    assert _caught(kind, time_slice) == []


def test_a_host_harvester_without_a_slice_does_not_warn(loading):
    """Through the constructor: the negative control of the fake (lazy, yet the host
    backend has no kernels to load)."""
    loading("lazy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fr.Harvester("cpu", time_slice=None):
            pass
    assert not [w for w in caught if "CUDA_MODULE_LOADING" in str(w.message)]


_PROBE = "import json, freeride as fr; print(json.dumps(fr.backend_info()['module_loading']))"


@pytest.mark.gpu
@pytest.mark.parametrize(("env", "expected"), [("EAGER", "eager"), ("LAZY", "lazy")])
def test_gpu_module_loading_follows_the_environment(env, expected):
    """On a GPU the driver's answer follows CUDA_MODULE_LOADING, read when CUDA
    initialises: each value in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, "CUDA_MODULE_LOADING": env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == expected
