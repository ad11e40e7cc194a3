"""Followers (issue 36 item 1, csrc/follow_rule.hpp; FREERIDE_FOLLOW=1 on CUDA): the next
task's launch is queued behind the running task's at each open once that one is in the
tail of its last phase, so a bubble in which it runs out of items goes on with the next
task. Also what becomes of a follower that is cancelled, preempted or closed while the
task it follows still has launches queued ahead of it.

Driven through the test queue backend (freeride_ext/queue_backend.hpp), as
tests/test_handover.py: the test ends the launches in the order the opens queued them.
"""

import threading
import time

import pytest

from conftest import queue_progress as _status
from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

FINAL = ("done", "failed", "cancelled")


def _cancel_waiting(ex, task):
    """cancel(task, wait=True) on a thread of its own, as a training thread's: (an event
    set once it returned True, the thread)."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: done.set() if ex.cancel(task, True) else None)
    thread.start()
    return done, thread


@pytest.mark.parametrize(
    "args, follows",
    [
        ((True, True, 6, 4, 0), False),  # two launches' worth left, one more to come
        ((True, True, 4, 4, 0), True),
        ((True, True, 12, 4, 2), True),  # two queued ahead and this open's cover it
        ((True, True, 13, 4, 2), False),
        ((True, False, 1, 4, 0), False),  # not the last phase
        ((True, True, 1, 0, 0), False),  # nothing measured yet
        ((True, True, 0, 0, 0), False),  # ... even with nothing left to cover
        ((False, True, 1, 4, 0), False),  # off
    ],
)
def test_the_follow_rule(args, follows):
    """csrc/follow_rule.hpp: the next task follows at opens once what the launches queued
    ahead and the open's own can run covers what the last phase has left."""
    assert _C._testing.follow_next(*args) is follows


@pytest.fixture
def follow_ex():
    """An executor on the queue backend with followers on, closed after the test."""
    ex = _C._testing.queue_executor(followers=True)
    yield ex
    ex.close(0.5)


def _tail(ex, priority_a=0):
    """A (12 items) in its tail after two launches of 4 at opens (not after the first: 8
    left), B following it."""
    a = ex.submit(_C.spin_task(12, 1, 1000), priority_a)
    b = ex.submit(_C.spin_task(6, 1, 1000), 0)
    q_a = _launches(ex, 0)
    for _ in range(2):
        assert _C._testing.queue_follower(ex) == -1
        wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
        q_a.end(4)
    wait_until(lambda: _C._testing.queue_follower(ex) == 1)
    return a, b, q_a, _launches(ex, 1)


def test_the_next_task_follows_one_in_its_tail(follow_ex):
    """A's launches at opens ran 4 items each; with 4 of 12 left the next task B follows
    it: each open queues A's launch and then B's, so B takes the rest of the bubble where
    A runs out of items. B's items run once, and count when the executor takes its ends."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(4)  # its last 4
    q_b.end(6)  # the rest of the bubble
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 12)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)
    assert (q_a.ran, q_b.ran) == (12, 6)


def test_without_followers_the_next_task_waits_for_the_end():
    """The same without FREERIDE_FOLLOW: no follower, B is armed only once A is complete."""
    ex = _C._testing.queue_executor()
    try:
        a = ex.submit(_C.spin_task(10, 1, 1000), 0)
        ex.submit(_C.spin_task(6, 1, 1000), 0)
        q_a = _launches(ex, 0)
        for _ in range(2):
            wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
            q_a.end(4)
        wait_until(lambda: _status(ex, a)[1] == 8)
        time.sleep(0.05)
        assert _C._testing.queue_follower(ex) == -1
        assert _C._testing.queue_open_one(ex) == [0]
    finally:
        ex.close(0.5)


def test_a_more_urgent_task_stops_the_follower(follow_ex):
    """B follows A; U, more urgent, stops both: B takes no further open and U is armed
    once A's and B's launches in flight have drained. Every task's items run once."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    u = ex.submit(_C.spin_task(3, 1, 1000), 5)
    wait_until(lambda: q_a.stopped and q_b.stopped)
    assert _C._testing.queue_open_one(ex) == []
    q_a.end(5)  # began stopped: nothing
    q_b.end(5)
    q_u = _launches(ex, 2)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [2])
    q_u.end(3)
    assert ex.wait(u, 10) and _status(ex, u) == ("done", 3)
    deadline = time.monotonic() + 10
    while not all(_status(ex, t)[0] == "done" for t in (a, b)):
        assert time.monotonic() < deadline, [ex.status(t) for t in (a, b)]
        for index in _C._testing.queue_open_one(ex):
            (q_a, q_b)[index].end(5)
        time.sleep(0.001)
    assert (q_a.ran, q_b.ran, q_u.ran) == (12, 6, 3)


def test_a_followers_launch_adds_nothing_to_the_lookahead():
    """A follower's launch is chained behind the armed runner's at the same open: no wait
    of its own, so with bound 2 both runners keep taking two opens ahead."""
    ex = _C._testing.queue_executor(max_lookahead=2, followers=True)
    try:
        ex.submit(_C.spin_task(10, 1, 1000), 0)
        ex.submit(_C.spin_task(6, 1, 1000), 0)
        q_a = _launches(ex, 0)
        wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
        q_a.end(8)
        wait_until(lambda: _C._testing.queue_follower(ex) == 1)
        assert _C._testing.queue_open_one(ex) == [0, 1]
        assert _C._testing.queue_open_one(ex) == [0, 1]
        assert _C._testing.queue_open_one(ex) == []
    finally:
        ex.close(0.5)


def test_cancelling_a_follower_does_not_wait_for_the_task_it_follows(follow_ex):
    """B's launch chained at an open has begun behind A's; A's launch at the next open
    runs on (A is not stopped). cancel(B, wait=True) returns once B's own launch has left
    (it reads the stop at its next claim), not once A's bubble closes, which a training
    thread cancelling before it writes that close would wait for for ever (a review's
    finding)."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(1)  # a short bubble: A has items left
    q_b.begin()  # B's chained launch takes the rest of it
    done, thread = _cancel_waiting(ex, b)
    time.sleep(0.1)
    q_b.end(3)  # it leaves at its next claim, having seen the stop
    assert done.wait(5), "the cancel waited for the launch of the task B follows"
    thread.join()
    assert _status(ex, b) == ("cancelled", 3)
    assert _status(ex, a)[0] not in FINAL and not q_a.stopped
    q_a.end(1)
    q_b.end(5)  # began stopped: nothing
    wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
    q_a.end(5)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 12)
    assert (q_a.ran, q_b.ran) == (12, 3)


def test_a_more_urgent_task_in_its_tail_keeps_its_follower(follow_ex):
    """A (more urgent than B) ran 1 item in a short bubble and has no launch in flight:
    B, following it, is not stopped and demoted for it (a review's finding: B's chained
    launch then ran nothing, open after open)."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex, priority_a=1)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(1)
    q_b.end(2)
    time.sleep(0.1)
    assert not q_b.stopped and _C._testing.queue_follower(ex) == 1
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(3)
    q_b.end(4)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 12)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)


def test_a_failure_stops_the_follower(follow_ex):
    """A launch of the followed task fails: its follower takes no further open, and runs
    only once the failure has settled (the next task is not admitted past a failure)."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.fail("broken launch", False)
    wait_until(lambda: q_b.stopped)
    assert _C._testing.queue_open_one(ex) == []
    q_b.end(2)  # began stopped: nothing
    q_a.end(0)
    q_b.end(2)
    assert ex.wait(a, 10) and _status(ex, a)[0] == "failed"
    wait_until(lambda: _C._testing.queue_open_one(ex) == [1])
    q_b.end(6)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)


def test_cancelling_a_follower_while_the_task_it_follows_waits_for_a_launch(follow_ex):
    """B follows A; A's launch ended in a short bubble, so A's run() waits for its next
    launch (not for an end) when a training thread cancels B with B's launch in flight:
    the cancel returns once B's launch has ended, without waiting for the next open,
    which that thread would write only after it (a review's finding: the interrupt was
    seen only by a wait for an end)."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(1)  # A has items left; its run() waits for a launch again
    q_b.begin()
    time.sleep(0.1)
    done, thread = _cancel_waiting(ex, b)
    time.sleep(0.1)
    q_b.end(2)
    assert done.wait(5), "the cancel waited for the next open"
    thread.join()
    assert _status(ex, b) == ("cancelled", 2)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
    q_a.end(3)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 12)


def test_a_more_urgent_task_stops_the_task_a_cancelled_follower_followed(follow_ex):
    """B, following A, is cancelled with launches in flight and drained before A; then U,
    more urgent, comes: A is stopped too, its launches queued ahead run nothing, and a
    cancel of A returns once they have drained, while U runs (a review's finding: A was
    no longer the task run last, nobody stopped or drained it until U was final)."""
    ex = follow_ex
    a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    assert _C._testing.queue_open_one(ex) == [0, 1]
    assert ex.cancel(b, False)
    time.sleep(0.1)
    u = ex.submit(_C.spin_task(3, 1, 1000), 5)
    wait_until(lambda: q_a.stopped)
    for _ in range(2):
        q_a.end(1)  # began stopped: nothing
        q_b.end(1)
    q_u = _launches(ex, 2)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [2])
    assert ex.cancel(a, True) and _status(ex, a) == ("cancelled", 8)
    assert q_a.ran == 8
    q_u.end(3)
    assert ex.wait(u, 10) and _status(ex, u) == ("done", 3)


def test_close_stops_and_drains_a_followers_launches(follow_ex):
    """Close while B, following A, has a launch queued and A has none: B is stopped and
    its launch drained within close's deadline, not abandoned unstopped at once (a
    review's finding)."""
    ex = follow_ex
    _a, b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(1)
    q_b.end(1)
    q_a.end(1)  # A has nothing left in flight; B's second launch is still queued
    time.sleep(0.1)
    closed = threading.Event()
    thread = threading.Thread(target=lambda: (ex.close(10.0), closed.set()))
    thread.start()
    wait_until(lambda: q_b.stopped)
    assert not closed.is_set(), "close returned without draining the follower's launch"
    q_b.end(1)  # began stopped: nothing
    assert closed.wait(5)
    thread.join()
    assert ex.take_abandoned() == []
    assert _status(ex, b) == ("cancelled", 1) and q_b.ran == 1


def test_a_launch_of_the_executors_own_measures_no_items_per_open(follow_ex):
    """The follow rule weighs what a launch at an open runs (items_per_open): a launch of
    the executor's own (admitted on the gate's mirror: its slice is no bubble) measures
    nothing. After one that ran 10 of A's 12 items, nothing is measured yet, so B does not
    follow: the next open carries A's launch alone."""
    ex = follow_ex
    a = ex.submit(_C.spin_task(12, 1, 1000), 0)
    b = ex.submit(_C.spin_task(6, 1, 1000), 0)
    q_a = _launches(ex, 0)
    assert q_a.arrive(1, at_open=False) == 1
    q_a.end(10)
    wait_until(lambda: q_a.runs >= 2)  # its end taken and the next launch weighed
    assert _C._testing.queue_follower(ex) == -1
    assert _C._testing.queue_open_one(ex) == [0]
    q_a.end(2)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 12)
    q_b = _launches(ex, 1)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [1])
    q_b.end(6)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)


def test_a_stopped_followers_launches_are_drained_before_the_more_urgent_task_runs(follow_ex):
    """B follows A with a launch in flight; U, more urgent, stops both. A stopped follower
    follows nothing any more: once A's launch has drained, B's is drained as the task run
    last's (its end taken as it comes), not left behind U's until U is done."""
    ex = follow_ex
    _a, _b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    u = ex.submit(_C.spin_task(3, 1, 1000), 5)
    wait_until(lambda: q_a.stopped and q_b.stopped)
    q_a.end(5)  # began stopped: nothing
    q_b.end(5)
    wait_until(lambda: q_b.pending == 0)
    q_u = _launches(ex, 2)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [2])
    q_u.end(3)
    assert ex.wait(u, 10) and _status(ex, u) == ("done", 3)
    assert (q_a.ran, q_b.ran) == (8, 0)


def test_a_task_follows_only_in_its_last_phase(follow_ex):
    """A has two phases of 8 items; its launch at an open ran 4. With 4 of phase 0 left
    the rule's cover is met, but phase 1 is to come: B does not follow (its launches would
    run ahead of A's next phase). In phase 1, with 4 left, B follows."""
    ex = follow_ex
    a = ex.submit(_C.spin_task(8, 2, 1000), 0)
    b = ex.submit(_C.spin_task(6, 1, 1000), 0)
    q_a = _launches(ex, 0)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
    q_a.end(4)
    wait_until(lambda: q_a.runs >= 2)  # its end taken and the next launch weighed
    assert _C._testing.queue_follower(ex) == -1
    assert _C._testing.queue_open_one(ex) == [0]
    q_a.end(4)  # phase 0 complete
    wait_until(lambda: q_a.phase == 1)
    wait_until(lambda: _C._testing.queue_open_one(ex) == [0])
    q_a.end(4)
    wait_until(lambda: _C._testing.queue_follower(ex) == 1)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(4)
    q_b = _launches(ex, 1)
    q_b.end(6)
    assert ex.wait(a, 10) and _status(ex, a) == ("done", 16)
    assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)


def test_a_report_does_not_wait_for_a_followers_launches(follow_ex):
    """wait_launches_taken (what a report waits for) takes the ends of the launches ending
    now, but not a follower's: those are taken once the task it follows has drained, which
    may take further opens (a later report has them). A's launch has ended and been taken;
    B's, chained behind it, has not ended: the wait returns at once."""
    ex = follow_ex
    a, _b, q_a, q_b = _tail(ex)
    assert _C._testing.queue_open_one(ex) == [0, 1]
    q_a.end(2)
    wait_until(lambda: _status(ex, a)[1] == 10)
    assert ex.wait_launches_taken(2.0)
    assert q_b.not_ended == 1
