"""A task preempted for a more urgent one while its launches are queued at opens ahead of
the GPU (issue 36 item 1; csrc/withhold_rule.hpp, FREERIDE_WITHHOLD=1 on CUDA): those
launches run its items in their bubbles instead of nothing, since they all come before
the more urgent task's first launch at an open, and it is stopped where stopping would
let the more urgent task start sooner (no launch of it queued, the preempted task in its
last queued bubble).

Driven through the test queue backend (freeride_ext/queue_backend.hpp) with withholding
on; the launches end in the order the opens queued them, as on the one side stream.
"""

import threading
import time

import pytest

from conftest import queue_progress as _status
from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

QUEUE_SETTINGS = {"withhold": True}


def _open(ex):
    return _C._testing.queue_open(ex)


@pytest.mark.parametrize(
    "enabled, bubbles, urgent_queued, withholds",
    [
        (True, 2, False, True),  # a later bubble of its own: the urgent task waits anyway
        (True, 5, False, True),
        (True, 1, True, True),  # the urgent task's launch waits for a later open
        (True, 1, False, False),  # its last bubble: stopped, the urgent task may start in it
        (True, 0, False, False),
        (False, 5, True, False),  # off
    ],
)
def test_the_withhold_rule(enabled, bubbles, urgent_queued, withholds):
    assert _C._testing.withhold_preempted(enabled, bubbles, urgent_queued) is withholds


def test_no_withholding_under_one_hardware_queue():
    """The CUDA backend withholds only with launches at opens, and never under one
    hardware queue: the fence withhold() records on the side stream behind the withheld
    launches would hold the one queue, training's next close included, until the newest
    of them ends, which with that close pending behind the fence is only at the slice
    bound (never with time_slice=None; the review of 2026-11-28)."""
    withholds = _C._testing.withholds
    assert withholds(enabled=True, launch_at_opens=True, one_queue=False)
    assert not withholds(enabled=True, launch_at_opens=True, one_queue=True)
    assert not withholds(enabled=True, launch_at_opens=False, one_queue=False)
    assert not withholds(enabled=False, launch_at_opens=True, one_queue=False)


def _preempted(ex, items=50, queued=3, urgent_open=True):
    """A task of `items` items (runner 0) with `queued` launches at opens, and a more
    urgent task of 4 (runner 1) submitted then; with `urgent_open`, an open written after
    it, which carries the more urgent task's launch. (low, its launches, high, its.)"""
    low = ex.submit(_C.spin_task(items, 1, 1000), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(queued) == queued
    high = ex.submit(_C.spin_task(4, 1, 1000), 1)
    q_high = _launches(ex, 1)
    if urgent_open:
        wait_until(lambda: _open(ex) == (1, 1))
    return low, q_low, high, q_high


def _urgent_done(ex, high, q_high):
    q_high.end(4)
    assert ex.wait(high, 10) and _status(ex, high) == ("done", 4)


def test_a_preempted_tasks_launches_queued_ahead_run_its_items(ex):
    """Three launches of the running task are queued ahead when a more urgent task comes:
    it is armed for the next open at once, and the three run the first task's items (with
    the stop they ran none). Every item of both runs exactly once."""
    low, q_low, high, q_high = _preempted(ex)
    assert q_low.withheld and not q_low.stopped
    assert q_low.arrive(1) == 0, "a withheld task took a further launch"
    for _ in range(3):
        q_low.end(5)
    assert q_low.ran == 15
    _urgent_done(ex, high, q_high)
    wait_until(lambda: _status(ex, low)[1] == 15)
    wait_until(lambda: _open(ex) == (0, 1))  # resumed, armed again: no longer withheld
    assert not q_low.withheld
    q_low.end(35)
    assert ex.wait(low, 10) and _status(ex, low) == ("done", 50)
    assert q_low.ran == 50


def test_without_an_urgent_launch_queued_the_last_bubble_is_stopped(ex):
    """No open has been written since the more urgent task came: the preempted task runs
    its launches queued ahead but the last, which is stopped (the more urgent task may
    start inside that bubble once it has drained), and the more urgent task then runs
    from the executor's own launch."""
    low, q_low, high, q_high = _preempted(ex, urgent_open=False)
    wait_until(lambda: q_low.withheld)
    q_low.end(5)
    wait_until(lambda: q_low.pending == 2)
    assert not q_low.stopped, "stopped with two bubbles of its own left"
    q_low.end(5)
    wait_until(lambda: q_low.stopped)  # its last bubble, the urgent task has none queued
    q_low.end(5)  # began stopped: nothing
    assert q_low.ran == 10
    assert q_high.arrive(1, at_open=False) == 1
    _urgent_done(ex, high, q_high)
    wait_until(lambda: _status(ex, low)[1] == 10)


def test_an_urgent_launch_queued_keeps_the_last_bubble_withheld(ex):
    """The more urgent task took an open after the preempted task's launches: its launch
    waits for that open, so the preempted task's last queued bubble runs its items too."""
    _low, q_low, high, q_high = _preempted(ex, queued=2)
    q_low.end(5)
    wait_until(lambda: q_low.pending == 1)
    q_low.end(5)
    wait_until(lambda: q_low.pending == 0)
    assert not q_low.stopped and q_low.ran == 10
    _urgent_done(ex, high, q_high)


def test_a_single_bubble_is_stopped_as_before(ex):
    """One launch in flight, no urgent launch queued: stopped, as without withholding."""
    ex.submit(_C.spin_task(50, 1, 1000), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(1) == 1
    ex.submit(_C.spin_task(4, 1, 1000), 1)
    wait_until(lambda: q_low.stopped)
    assert q_low.withholds == 0


def test_a_cancel_stops_a_withheld_task(ex):
    """Cancelled while withheld: its launches left run nothing, and the task is cancelled
    with exactly the items that ran."""
    low, q_low, high, q_high = _preempted(ex)
    q_low.end(5)
    wait_until(lambda: q_low.pending == 2)
    assert ex.cancel(low, False)
    assert q_low.stopped
    q_low.end(5)
    q_low.end(5)
    assert ex.wait(low, 10) and _status(ex, low) == ("cancelled", 5)
    assert q_low.ran == 5
    _urgent_done(ex, high, q_high)


def test_a_withheld_task_that_finishes_its_items_is_done(ex):
    """The withheld launches run the preempted task's last items: it is done, and the
    launch left after them is stale."""
    low, q_low, high, q_high = _preempted(ex, items=8)
    q_low.end(5)
    q_low.end(5)  # three of them: the last
    wait_until(lambda: q_low.stopped)  # complete: the stale launch is stopped
    q_low.end(5)
    assert ex.wait(low, 10) and _status(ex, low) == ("done", 8)
    assert q_low.ran == 8
    _urgent_done(ex, high, q_high)


def test_close_stops_a_withheld_task_the_loop_is_not_running(ex):
    """A is withheld for U; U is cancelled and retired, and the loop drains U's runner
    when close() begins: A, the task run last but not the one running, is stopped too, so
    its launches left run nothing after close() began (a review's finding: they ran A's
    items until the loop came to A)."""
    low, q_low, high, _q_high = _preempted(ex)
    assert q_low.withheld
    assert ex.cancel(high, False)
    ex.wait(high, 0.05)  # a waiter retires it once inert
    q_low.end(5)
    time.sleep(0.1)
    thread = threading.Thread(target=lambda: ex.close(10.0))
    thread.start()
    wait_until(lambda: q_low.stopped)
    q_low.end(5)
    q_low.end(5)
    _launches(ex, 1).end(4)
    thread.join(15)
    assert not thread.is_alive()
    assert q_low.ran == 5 and _status(ex, low) == ("cancelled", 5)


def test_a_task_runnable_after_its_submit_preempts_the_task_run_last_before_it_is_armed():
    """U is submitted waiting for a dependency, so its submit preempts nothing; it becomes
    runnable while the loop drains a cancelled follower B before A, the task B followed,
    which still has launches queued: A is stopped or withheld before U is armed, never
    left to take U's opens as it was (a review's finding: on CUDA A's stop fence then
    landed behind U's launch, and A's settle waited for U's open)."""
    ex = _C._testing.queue_executor(followers=True, withhold=True)
    try:
        a = ex.submit(_C.spin_task(12, 1, 1000), 0)
        b = ex.submit(_C.spin_task(6, 1, 1000), 0)
        q_a = _launches(ex, 0)
        for _ in range(2):
            wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
            q_a.end(4)
        wait_until(lambda: _C._testing.queue_follower(ex) == 1)
        q_b = _launches(ex, 1)
        for _ in range(2):
            assert _C._testing.queue_open_one(ex) == [0, 1]
        assert ex.cancel(b, False)
        time.sleep(0.05)  # the loop drains B now, out of turn
        latch = _C._testing.Latch()
        u = _C._testing.submit_after_latch(ex, _C.spin_task(3, 1, 1000), 5, latch)
        time.sleep(0.05)
        assert not (q_a.stopped or q_a.withheld), "preempted for a task that could not run"
        latch.release()
        q_a.end(1)
        q_b.end(1)
        q_u = _launches(ex, 2)
        wait_until(lambda: _C._testing.queue_open_one(ex) == [2])
        assert q_a.stopped or q_a.withheld
        q_a.end(1)
        q_b.end(1)
        q_u.end(3)
        assert ex.wait(u, 10) and _status(ex, u) == ("done", 3)
        assert ex.wait(b, 10) and _status(ex, b)[0] == "cancelled"
        wait_until(lambda: _status(ex, a)[1] == q_a.ran)
    finally:
        ex.close(0.5)


def test_the_more_urgent_task_is_armed_while_the_withheld_launch_runs(ex):
    """The preempted task's oldest launch has begun (its bubble is on) when the more urgent
    task comes: withheld, it runs on to its close, and the more urgent task takes the next
    open meanwhile (the running launch's wait is interrupted, not only one that has not
    begun, as a stop's hand-back is)."""
    low = ex.submit(_C.spin_task(50, 1, 1000), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(2) == 2
    q_low.begin()
    high = ex.submit(_C.spin_task(4, 1, 1000), 1)
    q_high = _launches(ex, 1)
    wait_until(lambda: _open(ex) == (1, 1))
    assert q_low.withheld and not q_low.stopped and q_low.not_ended == 2
    q_low.end(5)
    q_low.end(5)
    _urgent_done(ex, high, q_high)
    wait_until(lambda: _status(ex, low)[1] == 10)
    assert q_low.ran == 10


def test_the_executors_own_launch_ahead_counts_as_a_bubble(ex):
    """The queue model counts bubbles as CudaRunner::bubbles_in_flight does: the oldest
    launch not ended, whether or not it waits for an open (here the executor's own, seen
    open on the gate's mirror), and each later one that waits for an open of its own. Two
    bubbles of its own ahead: the preempted task is withheld, not stopped."""
    ex.submit(_C.spin_task(50, 1, 1000), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(1, at_open=False) == 1
    assert q_low.arrive(1) == 1
    assert q_low.bubbles == 2
    ex.submit(_C.spin_task(4, 1, 1000), 1)
    wait_until(lambda: q_low.withheld or q_low.stopped)
    assert q_low.withheld and not q_low.stopped
    q_low.end(5)
    q_low.end(5)
