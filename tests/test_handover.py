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

from conftest import queue_progress as _status
from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

FINAL = ("done", "failed", "cancelled")


def _open(ex):
    return _C._testing.queue_open(ex)


def _urgent_over_queued(ex, running, urgent, queued):
    """`running` (task, priority) with `queued` launches queued at opens, none begun; then
    `urgent` (task, a higher priority) submitted and armed for the next open. (running's
    id, its launches, urgent's id, its launches)."""
    low = ex.submit(*running)
    q_low = _launches(ex, 0)
    assert q_low.arrive(queued) == queued
    high = ex.submit(*urgent)
    q_high = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    return low, q_low, high, q_high


def test_a_more_urgent_task_takes_the_next_open_before_any_launch_queued_ahead_began(ex):
    """None of the running task's three launches has begun (the GPU is in compute): the
    more urgent task is armed at once (PhaseRunner::hand_back), not when the GPU reaches
    the first of those opens."""
    low, q_low, high, q_high = _urgent_over_queued(
        ex, (_C.spin_task(50, 1, 1000), 0), (_C.spin_task(4, 1, 1000), 1), 3
    )
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


@pytest.mark.parametrize("submitted", ["before", "after it completes"])
def test_the_task_queued_behind_one_that_completes_takes_the_next_open(ex, submitted):
    """Every item ran in the first of three launches queued ahead: the next task takes
    the next open, while the two stale launches are still in flight, whether it was
    queued behind the task or submitted only once the task was complete and its stale
    launches draining (the drain is handed back, as for a cancelled task: the next open
    carries its launch, not nothing until the GPU reaches the stale launches)."""
    task = ex.submit(_C.spin_task(10, 1, 1000), 0)
    if submitted == "before":
        other = ex.submit(_C.spin_task(3, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.end(10)
    if submitted != "before":
        wait_until(lambda: q.stopped)  # complete: stopped, its stale launches drain
        other = ex.submit(_C.spin_task(3, 1, 1000), 0)
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
    a, q_a, b, q_b = _urgent_over_queued(
        ex, (_C.spin_task(20, 1, 1000), 0), (_C.spin_task(20, 1, 1000), 1), 1
    )
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


@pytest.mark.parametrize("seed", range(32))
def test_random_switches_run_every_item_exactly_once(seed):
    """Opens (on one of two training streams: one behind the other's launch waiting for
    its open gets none, review G11), begins and ends (in the order the opens queued
    them, as on the one side stream), submits of random urgency and cancels,
    interleaved at random, with and without phases ahead, followers, withholding (a
    preempted task's launches queued ahead run its items) and device phases (each of the
    16 combinations twice): every task ends done with
    every item or cancelled, each with exactly the items the model's device ran, and the
    memory comes back."""
    rng = random.Random(seed)
    ex = _C._testing.queue_executor(
        memory_budget=10**9,
        phases_ahead=seed % 2 == 1,
        followers=seed % 4 >= 2,
        withhold=seed % 8 >= 4,
        device_phases=seed % 16 >= 8,
    )
    stream = []  # runner index of every launch queued at an open, oldest first
    begun = [0]  # how many of them (the oldest) have begun
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
                stream.extend(_C._testing.queue_open_one(ex, rng.choice([0, 0, 0, 1])))
            elif action == "begin" and begun[0] < len(stream):
                queues()[stream[begun[0]]].begin()
                begun[0] += 1
            elif action == "end" and stream:
                queues()[stream.pop(0)].end(rng.randint(0, 5))
                begun[0] = max(0, begun[0] - 1)
            elif action == "submit":
                submit()
            elif action == "cancel" and ids:
                ex.cancel(rng.choice(ids), False)

        submit()
        for _ in range(60):
            step(rng.choice(["open", "open", "begin", "end", "end", "submit", "cancel"]))
            time.sleep(rng.random() * 0.002)
        deadline = time.monotonic() + 20
        while not all(_status(ex, t)[0] in FINAL for t in ids):
            assert time.monotonic() < deadline, [ex.status(t) for t in ids]
            if stream:
                queues()[stream.pop(0)].end(5)
            else:
                stream.extend(_C._testing.queue_open_one(ex))
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


def _sized(items, memory):
    task = _C.spin_task(items, 1, 1000)
    task.memory_bytes = memory
    return task


def test_a_less_urgent_task_is_not_armed_past_one_over_the_budget():
    """A (60 of 110 bytes) completes with stale launches queued; X (80, more urgent) fits
    only once A's memory goes, Y (40) fits now. Y is not armed ahead of X: it would hold
    the memory X needs until Y's end (a review's finding). X runs first."""
    ex = _C._testing.queue_executor(memory_budget=110)
    try:
        a = ex.submit(_sized(10, 60), 5)
        q_a = _launches(ex, 0)
        assert q_a.arrive(3) == 3
        x = ex.submit(_sized(5, 80), 2)
        y = ex.submit(_sized(50, 40), 1)
        q_a.end(10)
        time.sleep(0.1)
        assert _open(ex)[1] == 0, "an open carried a launch of the less urgent task"
        q_a.end(0)
        q_a.end(0)
        assert ex.wait(a, 10)
        q_x = _launches(ex, 1)
        wait_until(lambda: _open(ex) == (1, 1))
        q_x.end(5)
        assert ex.wait(x, 10) and _status(ex, x) == ("done", 5)
        q_y = _launches(ex, 2)
        wait_until(lambda: _open(ex) == (2, 1))
        q_y.end(50)
        assert ex.wait(y, 10) and _status(ex, y) == ("done", 50)
    finally:
        ex.close(0.5)


def test_a_retired_armed_task_hands_the_opens_back_to_the_paused_more_urgent_one(ex):
    """A (priority 1) was stopped for B (2), B armed and took an open, then B is cancelled
    while A's launch still drains: Y (0) is not armed ahead of A (a review's finding). A
    resumes first."""
    a = ex.submit(_C.spin_task(20, 1, 1000), 1)
    q_a = _launches(ex, 0)
    assert q_a.arrive(2) == 2
    b = ex.submit(_C.spin_task(20, 1, 1000), 2)
    q_b = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    y = ex.submit(_C.spin_task(20, 1, 1000), 0)
    assert ex.cancel(b, True)
    q_a.end(0)
    time.sleep(0.1)
    assert _open(ex)[1] == 0, "the least urgent task took an open ahead of the paused one"
    q_a.end(0)
    q_b.end(0)
    wait_until(lambda: _open(ex) == (0, 1))
    q_a.end(20)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 20)
    q_y = _launches(ex, 2)
    wait_until(lambda: _open(ex) == (2, 1))
    q_y.end(20)
    assert ex.wait(y, 10) and _status(ex, y) == ("done", 20)


def test_an_armed_task_is_not_stopped_for_a_task_that_cannot_run():
    """X is armed while A drains; C, more urgent but over the memory budget, cannot run:
    X keeps taking the opens (a review's finding: it was stopped, and the opens carried
    nothing until A's launches had drained)."""
    ex = _C._testing.queue_executor(memory_budget=100)
    try:
        ex.submit(_sized(20, 10), 0)
        q_a = _launches(ex, 0)
        assert q_a.arrive(3) == 3
        x = ex.submit(_sized(20, 10), 1)
        q_x = _launches(ex, 1)
        wait_until(lambda: _open(ex) == (1, 1))
        ex.submit(_sized(5, 90), 2)
        time.sleep(0.1)
        assert not q_x.stopped
        assert _open(ex) == (1, 1)
        for _ in range(3):
            q_a.end(0)
        q_x.end(10)
        q_x.end(10)
        assert ex.wait(x, 10) and _status(ex, x) == ("done", 20)
    finally:
        ex.close(0.5)


def test_the_lookahead_bound_counts_the_stopped_tasks_launches():
    """Bound 3: A has 2 launches waiting for their opens when B, more urgent, is armed.
    Those still wait on the stream and the hardware queues, so B takes one open, not
    three (a review's finding: the bound was per runner)."""
    ex = _C._testing.queue_executor(max_lookahead=3)
    try:
        ex.submit(_C.spin_task(20, 1, 1000), 0)
        q_a = _launches(ex, 0)
        assert q_a.arrive(2) == 2
        ex.submit(_C.spin_task(20, 1, 1000), 1)
        q_b = _launches(ex, 1)
        wait_until(lambda: _open(ex) == (1, 1))
        assert _C._testing.queue_open(ex, 2) == (1, 0)
        assert ex.opens_beyond_lookahead >= 2
        q_a.end(0)
        assert _open(ex) == (1, 1)
        assert q_b.pending == 2
    finally:
        ex.close(0.5)


def test_a_more_urgent_task_that_cannot_run_yet_stops_nothing(ex):
    """A more urgent task submitted waiting for its dependency leaves the running task's
    launches queued ahead running its items; once the dependency is ready, the next end
    the executor takes stops it, and the more urgent task takes the next open."""
    low = ex.submit(_C.spin_task(50, 1, 1000), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(2) == 2
    latch = _C._testing.Latch()
    high = _C._testing.submit_after_latch(ex, _C.spin_task(4, 1, 1000), 1, latch)
    time.sleep(0.05)
    assert not q_low.stopped, "stopped for a task that could not run"
    q_low.end(5)
    wait_until(lambda: _status(ex, low)[1] == 5)
    latch.release()
    q_low.end(0)  # as the loop looks again: whether stopped or not, nothing more to run
    q_high = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    q_high.end(4)
    assert ex.wait(high, 10) and _status(ex, high) == ("done", 4)
    assert q_low.ran == 5


def test_a_failed_task_cancelled_with_launches_in_flight_keeps_the_next_task_unarmed(ex):
    """F (priority 1) was stopped for X (2), X armed and took an open; then F's launch
    fails, with two of F's launches still in flight, and F is cancelled too. X is
    cancelled and retired (a waiter): the loop drains X's runner first and arms the next
    task meanwhile, but not G (0) past F: a failed task's launches are drained before
    anything is armed (the failure may have broken the context), cancelled or not."""
    f, q_f, x, q_x = _urgent_over_queued(
        ex, (_C.spin_task(100, 1, 1000), 1), (_C.spin_task(20, 1, 1000), 2), 3
    )
    g = ex.submit(_C.spin_task(5, 1, 1000), 0)  # waits behind both
    q_f.fail("a broken launch", drop_pending=False)
    wait_until(lambda: q_f.pending == 2)
    assert ex.cancel(f, False)
    assert ex.cancel(x, False)
    assert ex.wait(x, 10)  # inert: retired, its launch left to drain
    q_f.end(0)  # began stopped: nothing
    wait_until(lambda: q_x.runs >= 1)  # the loop drains the retired runner now
    assert _open(ex)[1] == 0, "a task was armed while a failed task's launches were in flight"
    q_x.end(0)
    q_f.end(0)
    assert ex.wait(f, 10) and _status(ex, f)[0] == "failed"
    q_g = _launches(ex, 2)
    wait_until(lambda: _open(ex) == (2, 1))
    q_g.end(5)
    assert ex.wait(g, 10) and _status(ex, g) == ("done", 5)
    assert _status(ex, x)[0] == "cancelled"


def test_a_task_as_urgent_as_the_running_one_does_not_stop_it(ex):
    """A task submitted with the running task's priority takes over nothing: only a more
    urgent one preempts the running task, so the running task's launches queued ahead go
    on running its items, and the new task runs after it."""
    a = ex.submit(_C.spin_task(20, 1, 1000), 0)
    q_a = _launches(ex, 0)
    assert q_a.arrive(2) == 2
    wait_until(lambda: q_a.runs >= 1)  # its launch is the one running
    b = ex.submit(_C.spin_task(5, 1, 1000), 0)
    q_a.end(10)
    wait_until(lambda: _status(ex, a)[1] == 10)
    assert not q_a.stopped
    q_a.end(10)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 20)
    q_b = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    q_b.end(5)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 5)
