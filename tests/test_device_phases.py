"""Device phases (issue 36 item 1, review G3): a launch queued at an open serves whatever
phase is current when its bubble comes.

A task whose phases all run one kernel over as many items (Spin, ItemCounter, a RawKernel
with ``device_phases=True``) is one phase of every phase's items to the executor
(csrc/device_phases.hpp; on CUDA unless FREERIDE_DEVICE_PHASES=0): the kernel maps each claim
back to its phase and item and keeps the phases in order on the device
(freeride::for_each_phase_item in preempt.cuh). Without it, each launch serves the phase
current when it was enqueued, so launches queued ahead at opens go stale at every phase
boundary and a bubble runs one phase (two with phases ahead).

The test queue backend (freeride_ext/queue_backend.hpp) models the device: a launch runs
at most what its phase has left. What is tested here is the executor's side; the device
side (the phase order kept by the kernel: its release counts, acquire and barrier) is
checked in the PTX by tests/test_item_protocol.py, and by GPU tests in
tests/test_raw_kernel_gpu.py, tests/test_pagerank.py and tests/test_phases_ahead.py that
have not run on a GPU yet.
"""

import random
import time

import pytest

import freeride as fr
from conftest import queue_status as _status
from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

FINAL = ("done", "failed", "cancelled")


# The queue executor of conftest.py's `ex` fixture.
QUEUE_SETTINGS = {"device_phases": True}


def test_one_launch_at_an_open_serves_every_phase(ex):
    """Five phases of ten items: the runner sees one phase of fifty, and the one launch
    an open carried runs them all in its bubble."""
    task = ex.submit(_C.spin_task(10, 5, 1000), 0)
    q = _launches(ex, 0)
    assert q.n_items == 50 and q.phase == 0
    assert q.arrive(1) == 1
    q.end(50)
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("done", 50, 4)
    assert q.ran == 50


def test_the_executor_says_whether_its_backend_takes_device_phases(ex):
    """Harvester.device_phases reads the backend's switch: on for this queue backend (as
    on CUDA unless FREERIDE_DEVICE_PHASES=0), never on the host backend, whose workers
    keep the phases in order themselves."""
    assert ex.device_phases is True
    executor = _C._testing.queue_executor()
    try:
        assert executor.device_phases is False
    finally:
        executor.close(0.5)
    with fr.Harvester("cpu", workers=1) as h:
        assert h.device_phases is False


def test_without_device_phases_a_launch_serves_one_phase():
    """The control: the same task and launch on a backend without device phases runs one
    phase's items, and the executor moves through the phases one by one."""
    executor = _C._testing.queue_executor()
    try:
        task = executor.submit(_C.spin_task(10, 5, 1000), 0)
        q = _launches(executor, 0)
        assert q.n_items == 10
        assert q.arrive(1) == 1
        q.end(50)
        wait_until(lambda: q.phase == 1)
        assert q.ran == 10
        assert _status(executor, task)[1:] == (10, 1)
    finally:
        executor.close(0.5)


def test_launches_queued_ahead_serve_the_phase_current_when_they_run(ex):
    """Three opens queued ahead of the GPU. The first bubble runs phase 0 and part of
    phase 1; the second finishes phase 1 and runs into phase 2; none of them is stale, and
    status reports the phase the items done have reached."""
    task = ex.submit(_C.spin_task(10, 4, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    assert q.pending_phases == [(0, False)] * 3
    q.end(14)
    wait_until(lambda: _status(ex, task)[1] == 14)
    assert _status(ex, task)[2] == 1
    q.end(12)
    wait_until(lambda: _status(ex, task)[1] == 26)
    assert _status(ex, task)[2] == 2
    q.end(14)
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("done", 40, 3)
    assert ex.idle_open_launches == 0, "a launch queued ahead went stale"


def test_a_bubble_that_closes_mid_phase_resumes_there(ex):
    """A launch paused by a close in the middle of phase 2: the next open's launch goes on
    from the same claim, and every item counts once."""
    task = ex.submit(_C.spin_task(8, 3, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 1
    q.end(19)  # phases 0 and 1, and 3 of phase 2
    wait_until(lambda: q.pending == 0 and _status(ex, task)[0] == "paused")
    assert _status(ex, task) == ("paused", 19, 2)
    wait_until(lambda: q.arrive(1) == 1)
    q.end(100)
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("done", 24, 2)
    assert q.ran == 24


def test_only_tasks_that_can_serve_every_phase_are_seen_whole(ex):
    """A RawKernel says so itself (device_phases=True; one kernel); Spin and PageRank can;
    Spin's sliced baseline cannot; a task of one phase needs nothing. What the runner is given shows it: the
    items of every phase, or of the first."""
    runners = iter(range(100))

    def first_phase_items(task):
        tid = ex.submit(task, 0)
        n = _launches(ex, next(runners)).n_items
        assert ex.cancel(tid, False) and ex.wait(tid, 10)
        return n

    raw = _C.raw_kernel_task("k", [(1, 8, 32, 0, 0)], 4, [], device_phases=True)
    assert first_phase_items(raw) == 32
    assert first_phase_items(_C.raw_kernel_task("k", [(1, 8, 32, 0, 0)], 4, [])) == 8
    assert first_phase_items(_C.spin_task(6, 3, 1000, slice_blocks=4)) == 6
    assert first_phase_items(_C.spin_task(6, 3, 1000)) == 18
    assert first_phase_items(_C.spin_task(6, 1, 1000)) == 6
    # PageRank: 2 phases an iteration of as many items (addresses never launched here).
    pagerank = _C.pagerank_task(100, *range(1, 8), iters=3, damping=0.85, nodes_per_item=10)
    assert first_phase_items(pagerank) == 60


def test_a_raw_kernel_task_with_device_phases_needs_one_kernel():
    with pytest.raises(ValueError, match="device_phases needs one kernel for every phase, got 2"):
        _C.raw_kernel_task("k", [(1, 8, 32, 0, 0), (2, 8, 32, 0, 0)], 4, [], device_phases=True)
    _C.raw_kernel_task("k", [(1, 8, 32, 0, 0), (2, 8, 32, 0, 0)], 4, [])


def test_cancel_counts_what_the_launches_in_flight_ran(ex):
    """A cancel with launches of a task seen whole in flight: final once they have ended,
    the items they ran across phases counted exactly."""
    task = ex.submit(_C.spin_task(10, 3, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    q.begin()
    assert ex.cancel(task, False)
    wait_until(lambda: q.stopped)
    q.end(13)  # begun before the stop: it ran into phase 1
    q.end(10)  # began after it: nothing
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("cancelled", 13, 1)
    assert q.ran == 13


@pytest.mark.parametrize("seed", range(12))
def test_random_opens_and_ends_count_every_item_once(ex, seed):
    rng = random.Random(seed)
    phases, items = rng.randint(2, 9), rng.randint(1, 20)
    total = phases * items
    task = ex.submit(_C.spin_task(items, phases, 1000), 0)
    q = _launches(ex, 0)
    last_phase = 0
    deadline = time.monotonic() + 20
    while _status(ex, task)[0] not in FINAL and time.monotonic() < deadline:
        if q.not_ended and rng.random() < 0.6:
            q.end(rng.randint(0, 2 * items))
        elif q.arrive(rng.randint(1, 3)) == 0:
            time.sleep(0.001)
        _state, done, phase = _status(ex, task)
        assert done <= total and last_phase <= phase < phases
        assert phase == min(done // items, phases - 1)
        last_phase = phase
    assert ex.wait(task, 10)
    assert _status(ex, task)[:2] == ("done", total)
    assert q.ran == total
