"""CUDA-only behaviour: stream-ordered gate writes, both gate placements, both launch
admissions, the fallback without stream memory operations, and the built-ins against
torch. The protocol tests of the other files also run on cuda (their `harvester` fixture)."""

import os
import time

import numpy as np
import pytest

import freeride as fr
from conftest import wait_until

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(
    params=[
        {},
        {"gate_in_host_memory": True},
        {"stream_wait": True},
        {"gate_in_host_memory": True, "stream_wait": True},
    ],
    ids=["device-gate", "host-gate", "stream-wait", "host-gate-stream-wait"],
)
def cuda_harvester(request):
    with fr.Harvester("cuda:0", **request.param) as h:
        yield h


def test_backend_info_reports_the_gpu():
    info = fr.backend_info()
    assert info["cuda"] and info["devices"]
    assert info["devices"][0]["sm_count"] > 0


def test_exactly_once_with_gate_flips(cuda_harvester):
    h = cuda_harvester
    # Sized to the device: each phase takes milliseconds however many SMs there are, so
    # the flips below (one per 0.5 ms) land inside phases.
    sms = fr.backend_info()["devices"][0]["sm_count"]
    task = fr.tasks.ItemCounter(sms * 32 * 25, phases=4, ns_per_item=50_000)
    t = h.submit(task)
    for _ in range(200):
        h.gate.close(stream="host")
        time.sleep(0.0002)
        h.gate.open(stream="host")
        time.sleep(0.0003)
    assert t.wait(timeout=120)
    result = t.result()
    assert (result.counts == 1).all()
    assert result.violations == 0
    assert t.launches > 4, "no launch was paused by a flip: the work was too short"


def test_stream_ordered_close_takes_effect_on_the_gpu(cuda_harvester):
    h = cuda_harvester
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~100 ms of GPU time before the close
        h.gate.close()
    # The host got past close() long before the GPU reaches it.
    assert h.gate.is_open
    stream.synchronize()
    assert not h.gate.is_open
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        h.gate.open()
    assert not h.gate.is_open
    stream.synchronize()
    assert h.gate.is_open


def test_no_item_runs_inside_compute(cuda_harvester):
    h = cuda_harvester
    stream = torch.cuda.Stream()
    task = fr.tasks.ItemCounter(1_000_000, ns_per_item=5_000)
    t = h.submit(task)
    wait_until(lambda: t.items_done > 100)
    with torch.cuda.stream(stream):
        h.gate.close()
        torch.cuda._sleep(100_000_000)
        stream.synchronize()  # by now the close has long taken effect
    time.sleep(0.01)
    frozen = t.items_done
    time.sleep(0.05)
    assert t.items_done == frozen
    with torch.cuda.stream(stream):
        h.gate.open()
    wait_until(lambda: t.items_done > frozen)
    t.cancel()
    assert t.wait(timeout=30)
    counts = task.snapshot().counts
    assert counts.max() == 1 and int(counts.sum()) == t.items_done


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saxpy_matches_torch(cuda_harvester, dtype):
    x = torch.randn(10_000_019, device="cuda", dtype=dtype)
    y = torch.randn(10_000_019, device="cuda", dtype=dtype)
    expected = y + 1.5 * x
    out = cuda_harvester.submit(fr.tasks.Saxpy(1.5, x, y)).result(timeout=60)
    assert out is y
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_device_mismatch_is_refused(cuda_harvester):
    with pytest.raises(ValueError, match="x must be on cuda:0"):
        cuda_harvester.submit(fr.tasks.Saxpy(1.0, torch.ones(8), torch.ones(8, device="cuda")))
    with pytest.raises(ValueError, match="numpy array"):
        cuda_harvester.submit(fr.tasks.Saxpy(1.0, np.ones(8, np.float32), np.ones(8, np.float32)))


def test_device_sync_while_gate_closed_does_not_hang():
    """A pending launch must never make torch.cuda.synchronize() wait for the gate."""
    with fr.Harvester("cuda:0") as h:
        t = h.submit(fr.tasks.Spin(10**9, 10_000))
        wait_until(lambda: t.items_done > 0)
        h.gate.close()
        torch.cuda.synchronize()
        time.sleep(0.01)
        torch.cuda.synchronize()
        h.gate.open()
        t.cancel()
        assert t.wait(timeout=30)


def test_close_with_gate_closed_returns(cuda_harvester):
    h = cuda_harvester
    t = h.submit(fr.tasks.Spin(10**9, 10_000))
    wait_until(lambda: t.items_done > 0)
    h.gate.close(stream="host")
    start = time.monotonic()
    h.close()
    assert time.monotonic() - start < 10
    assert t.state == "cancelled"


def test_fallback_without_stream_memops(monkeypatch):
    monkeypatch.setenv("FREERIDE_NO_STREAM_MEMOPS", "1")
    with fr.Harvester("cuda:0") as h:
        task = fr.tasks.ItemCounter(5_000, phases=3, ns_per_item=2_000)
        t = h.submit(task)
        for _ in range(50):
            h.gate.close(stream="host")
            h.gate.open(stream="host")
        assert t.wait(timeout=120)
        assert (t.result().counts == 1).all()
    assert os.environ["FREERIDE_NO_STREAM_MEMOPS"] == "1"


def test_image_tasks_match_the_host_backend(cuda_harvester):
    img = torch.rand(3, 2, 48, 40)
    with fr.Harvester("cpu", workers=2) as host:
        blur_ref = host.submit(fr.tasks.GaussianBlur(img, 1.7)).result()
        resize_ref = host.submit(fr.tasks.Resize(img, (31, 57))).result()
    blur = cuda_harvester.submit(fr.tasks.GaussianBlur(img.cuda(), 1.7)).result(timeout=60)
    resized = cuda_harvester.submit(fr.tasks.Resize(img.cuda(), (31, 57))).result(timeout=60)
    torch.testing.assert_close(blur.cpu(), blur_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(resized.cpu(), resize_ref, atol=1e-5, rtol=0)


def test_admission_sleeps_while_the_gate_is_closed():
    """While the gate is closed the executor thread sleeps on a bell, rung by the
    device's watcher thread once the stream-ordered open has taken effect, instead of
    polling the mirror (which cost 0.21 CPU-seconds per second: 200 yields, then a poll
    every 20 us)."""
    with fr.Harvester("cuda:0") as h:
        h.gate.close(stream="host")
        t = h.submit(fr.tasks.Spin(10**9, 10_000))
        time.sleep(0.1)  # the executor thread reaches its wait for the gate
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(1.0)
        used = (time.process_time() - cpu) / (time.monotonic() - wall)
        assert t.items_done == 0
        assert used < 0.05, f"{used:.3f} CPU-seconds per second with the gate closed"
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(10_000_000)
            h.gate.open()  # stream-ordered: the ring comes once the GPU gets there
        wait_until(lambda: t.items_done > 0)
        t.cancel()
        assert t.wait(timeout=30)


def test_process_exits_while_an_open_is_still_ahead_of_the_gpu(tmp_path):
    """The watcher thread waits for an event recorded behind an open the GPU has not
    reached yet; the interpreter must still exit at once and cleanly."""
    import subprocess
    import sys

    script = tmp_path / "exit_early.py"
    script.write_text(
        "import sys, torch, freeride as fr\n"
        "h = fr.Harvester('cuda:0')\n"
        "s = torch.cuda.Stream()\n"
        "with torch.cuda.stream(s):\n"
        "    h.gate.close()\n"
        "    torch.cuda._sleep(10_000_000_000)  # seconds of GPU time\n"
        "    h.gate.open()\n"
        "print('exiting', flush=True)\n"
        "sys.exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120
    )
    assert "exiting" in done.stdout, done.stderr
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr
