"""CUDA graph capture beside freeride: submit() refuses to follow a capturing stream,
the iterative runner's thread does not invalidate another thread's capture, and
iterations recorded inside a capture leave report() working.

The GPU tests ran on H200s (2026-11-27); they skip where no GPU is present. The first
tests check the bindings without one."""

import contextlib
import threading
import time
from datetime import timedelta

import pytest
from capture_worker import CAPTURES, CAPTURING, capture_and_replay, run_worker, work

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
    """Property: the query answers True for the capturing stream and False before and
    after. (Not asserted: the legacy default stream. torch captures on a non-blocking
    stream, which the legacy stream does not synchronise with, so it would not join the
    capture, and on an H200 with driver 580 the driver answered False for it.)"""
    torch = _torch()
    x = torch.ones(16, device="cuda")
    g = torch.cuda.CUDAGraph()
    assert not _C._stream_is_capturing(int(torch.cuda.current_stream().cuda_stream), 0)
    with torch.cuda.graph(g):
        inside = _C._stream_is_capturing(int(torch.cuda.current_stream().cuda_stream), 0)
        y = x * 2
    assert inside
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


# -- F5: freeride's threads beside captures on the training thread -------------------------

_BUILT: list[tuple[str, bool]] = []  # (thread, inside a capture) of each queue-built task


def spin_for_the_queue(items: int) -> fr.tasks.Spin:
    """The job queue's factory (by reference): records where and when the agent built it."""
    _BUILT.append((threading.current_thread().name, CAPTURING.is_set()))
    return fr.tasks.Spin(items=items, ns_per_item=1000)


@contextlib.contextmanager
def _job_queue(h):
    """A one-rank gloo job (this process) with a JobQueue on `h`."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        q = fr.JobQueue(h, host="127.0.0.1", rank_timeout=5.0)
        try:
            yield q
        finally:
            q.close()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _recorded_harvester_with_spin(torch):
    """A harvester with two recorded iterations, the gate open, and a Spin task running
    that never finishes while it is open: the executor thread relaunches it every time
    slice (event records and queries) through the captures. Yields (h, x)."""
    with fr.Harvester("cuda") as h:
        x = torch.randn(1 << 16, device=h.device)
        for _ in range(2):
            with h.iteration(), h.compute(label="F"):
                work(x, 0.0)
        h.gate.open(stream="host")  # side work runs through the captures
        spin = h.submit(fr.tasks.Spin(2**40, 20_000))
        deadline = time.monotonic() + 30
        while spin.state != "running":
            assert time.monotonic() < deadline and not spin.done(), spin.state
            time.sleep(0.001)
        yield h, x
        assert not spin.done(), f"the Spin task ended beside the captures: {spin.state}"
        assert spin.cancel(timeout=30) and spin.state == "cancelled", spin.state


@pytest.mark.gpu
def test_captures_beside_a_spin_task_and_a_busy_job_queue():
    """F5. Property: 20 captures on the training thread in the default global mode, each
    holding gate writes, end without cudaErrorStreamCaptureInvalidated and replay to the
    eager result, while (a) a Spin task runs (the executor and watcher threads) and (c) a
    one-rank JobQueue's threads work: the beat reads h.bubble_stats() every 100 ms and the
    agent builds and submits tasks placed through the queue. The queue's tasks all finish
    and the Spin task does not fail. Without relaxed job threads, a beat or a build landing
    in a capture invalidates it (the negative control below shows such a call does)."""
    torch = _torch()
    _BUILT.clear()
    with _recorded_harvester_with_spin(torch) as (h, x):
        beats = []
        real_stats = h.bubble_stats

        def counted_stats():
            beats.append((threading.current_thread().name, CAPTURING.is_set()))
            return real_stats()

        h.bubble_stats = counted_stats  # what the beat thread calls on this harvester
        with _job_queue(h) as q:
            handles = []

            def feed(q=q, handles=handles):
                # Above the Spin task's priority: they run (and the agent builds more)
                # while it never finishes.
                spec = fr.TaskSpec(spin_for_the_queue, kwargs={"items": 50})
                handles.extend(q.submit(spec, priority=1) for _ in range(2))

            errors, matched = capture_and_replay(torch, h, x, before_each=feed)
            for handle in handles:
                assert handle.wait(60) and handle.state == "done", handle
    assert errors == [], f"{len(errors)} of {CAPTURES} captures failed: {errors[0]}"
    assert matched == CAPTURES
    # The test proves something only where the threads acted during captures.
    assert any(name == "freeride-jobqueue-beat" and inside for name, inside in beats), beats
    assert any(name == "freeride-jobqueue" and inside for name, inside in _BUILT), _BUILT


def _captures_beside(torch, h, x, calls: dict) -> dict:
    """capture_and_replay() on this thread while a thread of the user's own (in the
    default global capture mode) makes each of `calls` (name: fn) in turn, in a loop.
    Returns how many of each began and ended inside one capture, the thread's errors,
    and the captures' errors and matched replays."""
    stop = threading.Event()
    inside = dict.fromkeys(calls, 0)
    made, thread_errors = [0], []

    def beside():
        while not stop.is_set():
            for name, call in calls.items():
                during = CAPTURING.is_set()
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - handed to the test
                    thread_errors.append(exc)
                inside[name] += during and CAPTURING.is_set()
            made[0] += 1

    thread = threading.Thread(target=beside)
    thread.start()
    try:
        errors, matched = capture_and_replay(torch, h, x)
    finally:
        stop.set()
        thread.join(60)
    assert errors == [], f"{len(errors)} of {CAPTURES} captures failed: {errors[0]}"
    assert thread_errors == [], thread_errors[:3]
    assert matched == CAPTURES
    return {"inside": inside, "rounds": made[0]}


@pytest.mark.gpu
def test_captures_beside_a_thread_reading_bubble_stats():
    """F5. Property: with a Spin task running and a thread of the user's own (in the
    default global capture mode) calling h.bubble_stats() in a tight loop after two
    recorded iterations (the recorder resolves the Spin task's logged launches through
    cudaEventElapsedTime on that thread), 20 captures on the training thread end without
    cudaErrorStreamCaptureInvalidated and replay to the eager result, and the loop sees no
    error. Needs the core to relax the capture mode around its own CUDA calls (a scoped
    cudaThreadExchangeStreamCaptureMode in CudaShared::elapsed_ns and mark): Python cannot
    relax a thread it does not own."""
    torch = _torch()
    with _recorded_harvester_with_spin(torch) as (h, x):
        r = _captures_beside(torch, h, x, {"bubble_stats": h.bubble_stats})
    inside = r["inside"]["bubble_stats"]
    assert inside > CAPTURES, f"only {inside} of {r['rounds']} reads during captures"


def _make_and_close_a_cuda_executor() -> None:
    _C.Executor("cuda", 0, 1, False, False, 0, (0, 0, 0, 0), 2_000_000).close(1.0)


@pytest.mark.gpu
def test_captures_beside_free_memory_samples_and_backends_being_made():
    """Review G15. Property: a thread of the user's own, in the default global capture
    mode, that samples free device memory as the recorder does once per iteration
    (_C.free_device_memory: cudaMemGetInfo, relaxed inside) and makes and closes CUDA
    executors (the backend's constructor synchronises its control stream, allocates and
    loads modules; its shutdown queries streams: all relaxed inside) in a loop, while 20
    captures run on the training thread: none is invalidated, the thread sees no error,
    and both kinds of call landed inside captures."""
    torch = _torch()
    with fr.Harvester("cuda") as h:
        x = torch.randn(1 << 16, device=h.device)
        r = _captures_beside(
            torch,
            h,
            x,
            {
                "free_memory": lambda: _C.free_device_memory(0),
                "backend": _make_and_close_a_cuda_executor,
            },
        )
    assert r["inside"]["free_memory"] > 0 and r["inside"]["backend"] > 0, r


@pytest.mark.gpu
def test_negative_control_an_unsafe_call_from_another_thread_breaks_captures():
    """Negative control for the two tests above: a thread in the default global mode
    querying an event in a loop (what torch's NCCL watchdog did before it relaxed its
    thread) breaks captures on the training thread, and the detectors those tests use see
    it: captures that fail at their end, or the querying thread's own errors. With that
    thread gone, the same captures succeed again. In a fresh process: it invalidates
    captures on purpose."""
    _torch()
    result = run_worker("unsafe_query")
    assert result["queries_inside"] > 0, "no query ran during a capture: nothing was shown"
    assert result["failed"] > 0 or result["query_errors"] > 0, result
    assert result["failed_after"] == 0 and result["matched_after"] == CAPTURES, result


# -- F10: iterative tasks across replays of a captured iteration ---------------------------

REPLAYS, WARM_REPLAYS = 50, 3
COMPUTE_MS, BUBBLE_MS, STEP_MS = 10.0, 20.0, 2.0


def _cycles_per_ms(torch) -> float:
    """torch.cuda._sleep's clock cycles per millisecond on this device."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


class SleepSteps(fr.IterativeTask):
    """Each step keeps the step stream busy for a fixed GPU time (one block)."""

    def __init__(self, torch, cycles: int) -> None:
        self.torch = torch
        self.cycles = cycles

    def step(self) -> None:
        self.torch.cuda._sleep(self.cycles)


@pytest.mark.gpu
@pytest.mark.parametrize("notice_reopens", [True, False], ids=["fixed", "negative-control"])
def test_iterative_steps_keep_running_across_graph_replays(monkeypatch, notice_reopens):
    """F10. Property: after 3 recorded eager iterations (a 10 ms compute action, then a
    20 ms wait: bubble slot 1), one iteration captured with torch.cuda.graph and replayed
    50 times keeps the runner stepping: a replay writes the gate with the numbers of
    capture time and its opens ring nothing, yet each replayed bubble, where a 2 ms step
    fits the slot's predicted 20 ms, gets steps. Negative control: with reopenings not
    taken for new bubbles (the runner before the fix), the steps stop after the first
    replays."""
    torch = _torch()
    monkeypatch.setattr(fr.iterative, "_REOPEN_IS_NEW_BUBBLE", notice_reopens)
    per_ms = _cycles_per_ms(torch)
    with fr.Harvester("cuda") as h:
        train = torch.cuda.Stream(device=h.device)
        handle = h.submit(SleepSteps(torch, int(STEP_MS * per_ms)))
        deadline = time.monotonic() + 30
        while handle.step_ns is None:  # nothing recorded yet: steps run while it is open
            assert time.monotonic() < deadline and not handle.done(), handle.state
            time.sleep(0.001)

        def iteration():
            with torch.cuda.stream(train), h.iteration():
                with h.compute(label="F"):
                    torch.cuda._sleep(int(COMPUTE_MS * per_ms))
                torch.cuda._sleep(int(BUBBLE_MS * per_ms))  # a wait: the bubble

        for _ in range(3):
            iteration()
        torch.cuda.synchronize()
        h.bubble_stats()  # resolves the record
        predicted = h._recorder.predicted_slot_ns(1)
        assert predicted is not None and predicted >= 0.8 * BUBBLE_MS * 1e6, predicted
        eager_seq = h.gate.seq
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=train):
            iteration()
        warm = torch.cuda.Event()
        with torch.cuda.stream(train):
            for i in range(REPLAYS):
                g.replay()
                if i == WARM_REPLAYS - 1:
                    warm.record()
        warm.synchronize()
        steps_at_warm = handle.items_done
        train.synchronize()
        time.sleep(0.05)  # a step in flight ends
        replayed_seq = h.gate.seq
        steps = handle.items_done - steps_at_warm
        assert not handle.done(), handle.state
        handle.cancel()
    # The replays wrote the numbers of capture time: newer than the eager ones, and the same
    # after every replay (the close ending the captured iteration).
    assert replayed_seq == eager_seq + 4, (eager_seq, replayed_seq)
    replayed = REPLAYS - WARM_REPLAYS
    print(f"notice_reopens={notice_reopens}: {steps} steps in {replayed} replays")
    if notice_reopens:
        assert steps >= replayed, f"{steps} steps in {replayed} replayed bubbles"
    else:
        # At most one bubble's worth: an open of the other (slot 0) number caught by chance.
        assert steps <= BUBBLE_MS / STEP_MS, f"{steps} steps in {replayed} replayed bubbles"
