"""The next task takes the opens while the launches of the one before drain (issue 36,
item 1): a more urgent task, a cancel, or a task whose every item is done arms the next
task at once, so the next stream-ordered open the training thread writes carries the next
task's launch, queued on the stream behind launches that will run nothing. Before, those
opens carried no launch until the GPU had reached every open the host had queued a launch
at: about the host's lead in bubbles lost at every task switch.

Driven through the test queue backend (freeride_ext/queue_backend.hpp): `queue_open`
launches the runner armed then, as CudaShared::launch_at_open does, and the test ends the
launches in the order the opens queued them, as the one side stream does.
"""

import random
import time

import pytest

from conftest import wait_until
from freeride import _C

FINAL = ("done", "failed", "cancelled")


@pytest.fixture
def ex():
    executor = _C._testing.queue_executor()
    yield executor
    executor.close(0.5)


def _launches(ex, index):
    q = _C._testing.queue_launches(ex, index)
    wait_until(lambda: q.begun)
    return q


def _open(ex):
    return _C._testing.queue_open(ex)


def _status(ex, task):
    state, items = ex.status(task)[:2]
    return state, items


def test_a_more_urgent_task_takes_the_next_open_before_any_launch_queued_ahead_began(ex):
    """None of the running task's three launches has begun (the GPU is in compute): the
    more urgent task is armed at once (PhaseRunner::hand_back), not when the GPU reaches
    the first of those opens."""
    low = ex.submit(_C.spin_task(50, 1, 1000), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(3) == 3
    high = ex.submit(_C.spin_task(4, 1, 1000), 1)
    q_high = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    assert q_low.not_ended == 3 and q_low.stopped
    for _ in range(3):
        q_low.end(5)  # began stopped: nothing
    q_high.end(4)
    assert ex.wait(high, 10) and _status(ex, high) == ("done", 4)
    wait_until(lambda: _open(ex) == (0, 1))  # the first task resumed, armed again
    q_low.end(50)
    assert ex.wait(low, 10) and _status(ex, low) == ("done", 50)
    assert q_low.ran == 50


def test_a_cancel_without_waiting_arms_the_next_task(ex):
    """cancel(wait=False) with launches queued ahead: the queued task takes the next open."""
    task = ex.submit(_C.spin_task(50, 1, 1000), 0)
    other = ex.submit(_C.spin_task(3, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    assert ex.cancel(task, False)
    q_other = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    q.end(5)
    q.end(5)
    q_other.end(3)
    assert ex.wait(task, 10) and _status(ex, task) == ("cancelled", 0)
    assert ex.wait(other, 10) and _status(ex, other) == ("done", 3)


def test_the_task_queued_behind_one_that_completes_takes_the_next_open(ex):
    """Every item ran in the first of three launches queued ahead: the task queued behind
    takes the next open, while the two stale launches are still in flight."""
    task = ex.submit(_C.spin_task(10, 1, 1000), 0)
    other = ex.submit(_C.spin_task(3, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.end(10)
    q_other = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    assert q.not_ended == 2
    q.end(0)
    q.end(0)
    q_other.end(3)
    assert ex.wait(other, 10) and _status(ex, other) == ("done", 3)
    assert _status(ex, task) == ("done", 10) and q.ran == 10


def test_a_yet_more_urgent_task_waits_for_the_armed_tasks_launches(ex):
    """A armed B (more urgent), B took two opens; C, more urgent still, stops B (no
    further open for it) and is armed once B's launches are drained. Each task runs its
    items exactly once, most urgent first."""
    a = ex.submit(_C.spin_task(20, 1, 1000), 0)
    q_a = _launches(ex, 0)
    assert q_a.arrive(1) == 1
    b = ex.submit(_C.spin_task(20, 1, 1000), 1)
    q_b = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    assert _open(ex) == (1, 1)
    c = ex.submit(_C.spin_task(5, 1, 1000), 2)
    wait_until(lambda: q_b.stopped)
    assert _open(ex)[1] == 0, "a stopped task took a launch at an open"
    q_a.end(7)  # began stopped: nothing
    q_b.end(7)
    q_b.end(7)
    q_c = _launches(ex, 2)
    wait_until(lambda: _open(ex) == (2, 1))
    q_c.end(5)
    assert ex.wait(c, 10) and _status(ex, c) == ("done", 5)
    wait_until(lambda: _open(ex) == (1, 1))
    q_b.end(20)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 20)
    wait_until(lambda: _open(ex) == (0, 1))
    q_a.end(20)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 20)
    assert (q_a.ran, q_b.ran, q_c.ran) == (20, 20, 5)


@pytest.mark.parametrize("seed", range(16))
def test_random_switches_run_every_item_exactly_once(seed):
    """Opens, ends (in the order the opens queued them, as on the one side stream),
    submits of random urgency and cancels, interleaved at random, with and without phases
    ahead: every task ends done with every item or cancelled, each with exactly the items
    the model's device ran, and the memory comes back."""
    rng = random.Random(seed)
    ex = _C._testing.queue_executor(memory_budget=10**9, phases_ahead=seed % 2 == 1)
    stream = []  # runner index of every launch queued at an open, oldest first
    ids = []
    try:

        def submit():
            task = ex.submit(
                _C.spin_task(rng.randint(1, 12), rng.randint(1, 3), 1000), rng.randint(0, 2)
            )
            ids.append(task)

        def queues():
            made = []
            for index in range(len(ids)):
                try:
                    made.append(_C._testing.queue_launches(ex, index, timeout=0.0))
                except RuntimeError:
                    break
            return made

        def step(action):
            if action == "open":
                index, taken = _open(ex)
                stream.extend([index] * taken)
            elif action == "end" and stream:
                queues()[stream.pop(0)].end(rng.randint(0, 5))
            elif action == "submit":
                submit()
            elif action == "cancel" and ids:
                ex.cancel(rng.choice(ids), False)

        submit()
        for _ in range(60):
            step(rng.choice(["open", "open", "end", "end", "submit", "cancel"]))
            time.sleep(rng.random() * 0.002)
        deadline = time.monotonic() + 20
        while not all(_status(ex, t)[0] in FINAL for t in ids):
            assert time.monotonic() < deadline, [ex.status(t) for t in ids]
            if stream:
                queues()[stream.pop(0)].end(5)
            else:
                index, taken = _open(ex)
                stream.extend([index] * taken)
                time.sleep(0.001)
        while stream:
            queues()[stream.pop(0)].end(5)
        made = queues()
        assert len(made) <= len(ids)
        # Runners are made in admission order, which is not submission order: match each
        # task to its runner by what ran, checking every runner's count is some task's.
        ran = sorted(q.ran for q in made)
        for task in ids:
            state, items = _status(ex, task)
            assert state in ("done", "cancelled"), ex.status(task)
        counted = sorted(_status(ex, t)[1] for t in ids if _status(ex, t)[1] > 0)
        assert counted == [r for r in ran if r > 0]
        for task in ids:
            state, items = _status(ex, task)
            if state == "done":
                assert items == ex.status(task)[2]
        wait_until(lambda: ex.memory_used == 0)
    finally:
        ex.close(0.5)
