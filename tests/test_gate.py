import time

import pytest
from gpu_worker import run_worker

import freeride as fr
from conftest import wait_until


def test_gate_starts_open_and_toggles(harvester):
    assert harvester.gate.is_open
    harvester.gate.close(stream="host")
    assert not harvester.gate.is_open
    harvester.gate.open(stream="host")
    assert harvester.gate.is_open


def test_compute_closes_then_reopens(harvester):
    with harvester.compute(stream="host"):
        assert not harvester.gate.is_open
    assert harvester.gate.is_open


def test_compute_reopens_after_exception(host):
    with pytest.raises(KeyError), host.compute():
        raise KeyError("training step failed")
    assert host.gate.is_open


def test_bubble_opens_then_closes(host):
    host.gate.close()
    with host.bubble():
        assert host.gate.is_open
    assert not host.gate.is_open


def test_gate_closed_holds_queued_work(harvester):
    harvester.gate.close(stream="host")
    t = harvester.submit(fr.tasks.ItemCounter(64, phases=2))
    assert not t.wait(timeout=0.2)
    assert t.items_done == 0
    assert t.state in ("queued", "running", "paused")
    harvester.gate.open(stream="host")
    assert t.wait(timeout=30)
    counts = t.result()
    assert (counts.counts == 1).all()
    assert counts.violations == 0


def test_close_mid_run_stops_items_and_reopen_resumes(harvester):
    if harvester.backend == "host":
        task = fr.tasks.ItemCounter(400, phases=3, ns_per_item=200_000)
    else:
        # Sized to the device: about ten waves of 5 ms items per phase on any GPU, so the
        # close lands mid-phase (on 132 SMs, 400 items finished before it).
        sms = fr.backend_info()["devices"][harvester._device_index]["sm_count"]
        task = fr.tasks.ItemCounter(sms * 32 * 10, phases=3, ns_per_item=5_000_000)
    t = harvester.submit(task)
    wait_until(lambda: t.items_done >= 20)
    harvester.gate.close(stream="host")
    # The pause has taken effect once no item executes; from then on nothing starts.
    if harvester.backend == "host":
        wait_until(lambda: t.state == "paused")
    else:
        time.sleep(0.05)  # kernels exit within one item; the relaunch waits on the gate
    frozen = t.items_done
    assert not t.wait(timeout=0.2)
    assert t.items_done == frozen
    snap = task.snapshot()
    assert int(snap.counts.sum()) == frozen
    assert frozen < t.items_total
    harvester.gate.open(stream="host")
    assert t.wait(timeout=60)
    result = t.result()
    assert (result.counts == 1).all()
    assert result.violations == 0
    assert t.launches >= 2


def test_wait_open_sleeps_until_an_open(harvester):
    """The extension's wait for the gate (iterative tasks sleep on it with the GIL
    released): times out while closed, returns once another thread opens it."""
    import threading

    ex = harvester._ex
    assert ex.gate_wait_open(0.0)  # open already
    harvester.gate.close(stream="host")
    start = time.monotonic()
    assert not ex.gate_wait_open(0.05)
    assert time.monotonic() - start >= 0.05
    opener = threading.Timer(0.05, lambda: harvester.gate.open(stream="host"))
    opener.start()
    try:
        assert ex.gate_wait_open(30.0)  # woken by the open, long before the timeout
    finally:
        opener.join()
    assert harvester.gate.is_open


def test_admission_is_reported(monkeypatch):
    with fr.Harvester("cpu") as h:
        assert h.admission == "host"
    monkeypatch.setenv("FREERIDE_ADMISSION", "sometimes")
    if fr.backend_info()["cuda"]:
        with pytest.raises(ValueError, match="FREERIDE_ADMISSION"):
            fr.Harvester("cuda:0")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "ring"),
        ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "ring"),  # nothing blocking in any stream
        ({"FREERIDE_ADMISSION": "poll"}, "poll"),
        ({"FREERIDE_ADMISSION": "spin"}, "spin"),
    ],
    ids=["default", "one-connection", "poll", "spin"],
)
def test_cuda_admission_follows_the_environment(env, expected):
    """Each case in a fresh process whose environment is set before CUDA initialises
    (CUDA_DEVICE_MAX_CONNECTIONS is read when the context is made: set later, it has no
    effect). Negative control for the one-connection case: in that process, a training
    `.cpu()` waits behind an event queued after a long kernel on another stream, which
    shows the single hardware queue is really in effect while the harvester admits work
    opened in stream order on the default stream."""
    result = run_worker("admission_env", {}, env, timeout=120)
    assert result["admission"] == expected
    assert result["finished"], "the task opened in stream order was not admitted within 60 s"
    assert result["exactly_once"]
    if "CUDA_DEVICE_MAX_CONNECTIONS" in env:
        control = result["control"]
        assert control["copy_ms"] > 50, (
            f"negative control: the training .cpu() took {control['copy_ms']:.3f} ms behind "
            f"a {control['hold_ms']:.0f} ms kernel and an event: CUDA_DEVICE_MAX_CONNECTIONS=1 "
            "did not take effect in the child"
        )


def test_gate_says_how_it_is_written(host):
    assert host.gate.write_mechanism == "host"
    assert host.gate.write_fences is None
