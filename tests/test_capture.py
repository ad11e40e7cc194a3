"""CUDA graph capture beside freeride: submit() refuses to follow a capturing stream,
the iterative runner's thread does not invalidate another thread's capture, and
iterations recorded inside a capture leave report() working.

The GPU tests have not yet been run on a GPU; they skip where none is present. The
first tests check the bindings without one."""

import threading
import time

import pytest

import freeride as fr
from conftest import HAS_GPU
from freeride import _C, StreamCaptureError


def _in_thread(fn):
    """fn() on a fresh thread (a capture mode set there leaves this thread's alone)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_relax_capture_mode_is_a_no_op_without_a_gpu():
    """True where a CUDA device is usable; False (and no error) in builds without CUDA or
    on machines without a driver."""
    assert _in_thread(_C._relax_capture_mode) is HAS_GPU


@pytest.mark.skipif(HAS_GPU, reason="checks the answer where no GPU is usable")
def test_capture_query_raises_without_a_gpu():
    with pytest.raises(RuntimeError):
        _C._stream_is_capturing(0, 0)


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.mark.gpu
def test_capture_query_sees_torchs_capture():
    """Property: the query answers True for the capturing stream (and for the legacy
    default stream, which would join the capture) and False before and after."""
    torch = _torch()
    x = torch.ones(16, device="cuda")
    g = torch.cuda.CUDAGraph()
    assert not _C._stream_is_capturing(int(torch.cuda.current_stream().cuda_stream), 0)
    with torch.cuda.graph(g):
        inside = _C._stream_is_capturing(int(torch.cuda.current_stream().cuda_stream), 0)
        legacy = _C._stream_is_capturing(0, 0)
        y = x * 2
    assert inside and legacy
    assert not _C._stream_is_capturing(int(torch.cuda.current_stream().cuda_stream), 0)
    g.replay()
    torch.cuda.synchronize()
    assert bool((y == 2).all())


class Busy(fr.IterativeTask):
    """Steps that allocate, compute and sync on the step stream (what a training step of
    a small model does), counting steps."""

    def __init__(self, torch):
        self.torch = torch
        self.steps = 0

    def setup(self):
        self.a = self.torch.randn(256, 256, device="cuda")

    def step(self):
        b = self.a @ self.a  # a new allocation from torch's pool
        float(b[0, 0])  # a sync of the step stream
        self.steps += 1


@pytest.mark.gpu
def test_submit_during_capture_raises_and_leaves_the_capture_valid():
    """Property: submit() of an item task and of an iterative task inside a capture
    raises StreamCaptureError naming the stream, and the capture still ends without
    error and replays correctly (had submit followed the capturing stream, the side
    stream would have joined the capture and ending it would fail as unjoined). After the
    capture, submit works."""
    torch = _torch()
    with fr.Harvester("cuda") as h:
        x = torch.ones(1024, device=h.device)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            handle = int(torch.cuda.current_stream().cuda_stream)
            with pytest.raises(StreamCaptureError, match=f"{handle:#x}.*graph capture"):
                h.submit(fr.tasks.Spin(8, 1000))
            with pytest.raises(StreamCaptureError, match="graph capture"):
                h.submit(Busy(torch))
            z = y + 1
        g.replay()
        torch.cuda.synchronize()
        assert bool((z == 3).all())
        assert h.tasks() == []
        task = h.submit(fr.tasks.Spin(8, 1000))
        assert task.wait(timeout=30) and task.state == "done"


@pytest.mark.gpu
def test_iterative_steps_beside_a_capture_do_not_invalidate_it():
    """Property: while the runner's thread steps (allocating and syncing on the step
    stream), captures on the training thread in the default global mode still succeed
    and replay correctly, and the task does not fail. Without relaxed mode on the runner
    thread its sync would be refused during the capture and invalidate it."""
    torch = _torch()
    with fr.Harvester("cuda") as h:
        task = Busy(torch)
        handle = h.submit(task)  # no iterations recorded: steps run whenever it is open
        deadline = time.monotonic() + 30
        while task.steps < 5:
            assert time.monotonic() < deadline and not handle.done(), handle.state
            time.sleep(0.01)
        x = torch.ones(1 << 16, device=h.device)
        overlapped = 0
        for _ in range(20):
            g = torch.cuda.CUDAGraph()
            before = task.steps
            with torch.cuda.graph(g):  # capture_error_mode="global", torch's default
                y = x
                for _ in range(500):  # long enough for steps to run meanwhile
                    y = y + 1
            overlapped += task.steps > before
            g.replay()
            torch.cuda.synchronize()
            assert bool((y == 501).all())
        assert not handle.done(), f"the task ended beside the captures: {handle.state}"
        assert overlapped > 0, "no step ran during any capture: the test proved nothing"
        handle.cancel()
        assert handle.state == "cancelled"


@pytest.mark.gpu
def test_an_iteration_recorded_inside_a_capture_leaves_report_working():
    """Property: report() after an iteration recorded inside a capture returns promptly
    with the iterations that ran outside it (the captured one ran nothing and is left
    out), and replays of the graph write the gate without breaking later records."""
    torch = _torch()
    with fr.Harvester("cuda") as h:
        x = torch.ones(1 << 16, device=h.device)
        for _ in range(2):
            with h.iteration(), h.compute(label="F"):
                y = x * 2
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g), h.iteration(), h.compute(label="F"):
            y = x * 3
        for _ in range(3):
            g.replay()
        with h.iteration(), h.compute(label="F"):
            y = x * 4
        torch.cuda.synchronize()
        start = time.monotonic()
        report = h.report()
        assert time.monotonic() - start < 10
        assert [it.index for it in report.iterations] == [0, 1, 3]
        for it in report.iterations:
            assert len(it.compute) == 1 and len(it.bubbles) == 2
            assert all(b.end_ns >= b.start_ns for b in it.bubbles)
        assert bool((y == 4).all())
