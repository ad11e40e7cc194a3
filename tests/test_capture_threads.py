"""Every thread freeride starts in Python that can reach CUDA while training captures a
CUDA graph on its own thread puts itself into relaxed capture mode first (in the default
global mode, its event queries, records and allocations would invalidate that capture).

Checked without a GPU: `_relax_capture_mode` is replaced where each module imported it by
a recorder of the calling thread's name, and each component is started as a rank whose
harvester is on a GPU would start it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import freeride as fr
from conftest import wait_until
from freeride import iterative
from freeride.job import queue, serving

torch = pytest.importorskip("torch")
dist = torch.distributed

QUEUE_THREADS = {"freeride-jobqueue", "freeride-jobqueue-coord", "freeride-jobqueue-beat"}


class _Calls:
    """Stands in for _C._relax_capture_mode: records which thread called it."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            self.threads.append(threading.current_thread().name)
        return True

    def names(self) -> set[str]:
        with self._lock:
            return set(self.threads)


@pytest.fixture
def calls(monkeypatch):
    recorder = _Calls()
    for module in (serving, queue, iterative):
        monkeypatch.setattr(module, "_relax_capture_mode", recorder)
    return recorder


class _OnGpu:
    """A host harvester that says it is on a GPU: the job queue decides from `backend`
    whether its threads may reach CUDA."""

    def __init__(self, h: fr.Harvester) -> None:
        self._h = h

    backend = "cuda"

    def __getattr__(self, name):
        return getattr(self._h, name)


@pytest.fixture
def world():
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _queue_threads_relaxed(h, calls: _Calls) -> set[str]:
    """The queue threads that called the relax function while a one-rank queue served."""
    q = fr.JobQueue(h, host="127.0.0.1", rank_timeout=3.0)
    try:
        spec = fr.TaskSpec(fr.tasks.Spin, kwargs={"items": 4, "ns_per_item": 1000})
        handle = q.submit(spec)  # the agent builds it on its thread
        assert handle.wait(20) and handle.state == "done", handle
    finally:
        q.close()  # joins every queue thread: each has run its start by now
    return calls.names() & QUEUE_THREADS


def test_job_queue_threads_relax_on_a_gpu_rank_only(calls, world):
    """Property: on a rank whose harvester is on a GPU, the agent, coordinator and beat
    threads each call the relax function from their own thread, before serving; on a host
    rank none does (it would start the CUDA runtime in a process that does not use it)."""
    with fr.Harvester("cpu", workers=1) as host:
        host.gate.open(stream="host")
        assert _queue_threads_relaxed(host, calls) == set()
        assert _queue_threads_relaxed(_OnGpu(host), calls) == QUEUE_THREADS
    # Each thread switched itself once, at its start.
    assert sorted(calls.threads) == sorted(QUEUE_THREADS)


def test_serving_relaxes_its_own_thread_before_its_first_step(calls):
    """Property: Serving(cuda=True) calls the relax function on its thread before step()
    runs there; Serving() (an outside client's reader, which never reaches CUDA) does not."""
    order: list[str] = []
    calls_before = len(calls.threads)

    def step() -> bool:
        order.append("relaxed" if len(calls.threads) > calls_before else "step first")
        return False

    for cuda in (True, False):
        loop = serving.Serving(f"test-serving-{cuda}", step, max_idle=0.001, cuda=cuda)
        loop.start()
        wait_until(lambda: order)
        loop.stop(timeout=5)
        assert order[0] == ("relaxed" if cuda else "step first")
        order.clear()
        calls_before = len(calls.threads)
    assert calls.threads == ["test-serving-True"]


def test_iterative_runner_relaxes_its_thread_on_a_gpu_only(calls):
    """Property: the iterative runner's thread calls the relax function (once, from that
    thread) when its harvester is on a GPU, and not on the host backend."""
    with fr.Harvester("cpu", workers=1) as h:
        assert calls.names() == set()  # the harvester's own runner: host, not relaxed
        runner = iterative.IterativeRunner(h._ex, h.gate, h._recorder, "cuda", 0)
        try:
            wait_until(lambda: calls.threads)
        finally:
            runner.close()
    assert calls.threads == ["freeride-iterative"]
