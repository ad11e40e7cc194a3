"""The executor with launches in flight: what the CUDA backend's launches at opens put it
through (issue 27 item 1), driven without a GPU.

On CUDA a stream-ordered open enqueues the running task's launch for its bubble at once,
so with the host ahead of the GPU a task has several launches enqueued whose ends come
later, in order. The executor must then take every one of them before anything else goes
on the stream (no other task runs, no next phase begins), a more urgent task waits for
them, and a cancel or a failure makes the task final only once they have ended; past
close()'s deadline they are abandoned. The test queue backend (freeride_ext/
queue_backend.hpp, through _C._testing) gives the executor launches of exactly that shape,
enqueued and ended by the test.
"""

import random
import threading
import time

import pytest

from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

FINAL = ("done", "failed", "cancelled")


def _task(items, phases=1):
    return _C.spin_task(items, phases, 1000)


def _state(ex, task_id):
    return ex.status(task_id)[0]


def _items(ex, task_id):
    return ex.status(task_id)[1]


def _phase(ex, task_id):
    return ex.status(task_id)[3]


def test_launches_in_flight_are_taken_in_order_and_counted():
    """Three launches enqueued at once, ended one by one: each one's items count, the task
    is done once the last has ended, and all three are counted as launches at opens."""
    ex = _C._testing.queue_executor()
    try:
        task = ex.submit(_task(10), 0)
        q = _launches(ex, 0)
        assert q.arrive(3) == 3
        q.end(4)
        wait_until(lambda: _items(ex, task) == 4)
        assert _state(ex, task) not in FINAL
        q.end(4)
        q.end(2)
        assert ex.wait(task, 10)
        assert _state(ex, task) == "done" and _items(ex, task) == 10
        assert ex.open_launches == 3 and ex.idle_open_launches == 0
    finally:
        ex.close(0.5)


def test_a_phase_begins_only_after_its_stale_launches_end(ex):
    """Phase 0 ends in the first of three launches enqueued ahead: the runner takes no
    further launch at an open, the two already enqueued are stale (they run nothing and
    count as idle), and phase 1 begins only once they have ended, since its counters
    cannot be reset under them."""
    task = ex.submit(_task(4, phases=2), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.end(4)
    wait_until(lambda: _items(ex, task) == 4)
    assert q.arrive(1) == 0, "a launch at an open was taken after its phase was done"
    time.sleep(0.05)
    assert _phase(ex, task) == 0, "the next phase began under launches still in flight"
    q.end(0)
    q.end(0)
    wait_until(lambda: _phase(ex, task) == 1)
    assert ex.idle_open_launches == 2
    wait_until(lambda: q.arrive(1) == 1)
    q.end(4)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "done" and _items(ex, task) == 8


def test_a_more_urgent_task_takes_the_opens_while_the_launches_in_flight_drain(ex):
    """A more urgent task stops the running one (it takes no further launch). The one
    running on the GPU ends at its next item boundary; the more urgent task is then armed,
    so the next open carries its launch, queued behind the stopped task's launch still in
    flight, which claims nothing. The first task resumes after it."""
    low = ex.submit(_task(100), 0)
    q_low = _launches(ex, 0)
    assert q_low.arrive(2) == 2
    q_low.begin()  # the first is running on the GPU
    high = ex.submit(_task(5), 1)
    wait_until(lambda: q_low.stopped)
    assert q_low.arrive(1) == 0, "a stopped task took a launch at an open"
    q_low.end(1)
    q_high = _launches(ex, 1)
    wait_until(lambda: _C._testing.queue_open(ex) == (1, 1))
    assert q_low.pending == 1, "the stopped task's launch left before the open"
    q_low.end(1)  # began after the stop: it claims nothing
    q_high.end(5)
    assert ex.wait(high, 10) and _state(ex, high) == "done"
    wait_until(lambda: not q_low.stopped)  # resumed
    wait_until(lambda: q_low.arrive(1) == 1)
    q_low.end(99)
    assert ex.wait(low, 10) and _items(ex, low) == 100
    assert q_low.ran == 100


def test_cancel_is_final_once_no_launch_in_flight_can_run_an_item(ex):
    """A cancelled task's launch running when the stop came may still run items: the task
    is final only once it has ended, with its items counted exactly. The launches queued
    behind it have not begun: they will read the stop and claim nothing (PhaseRunner::
    inert), so the task is final then, without waiting for the GPU to reach their opens;
    its memory goes only once they have ended too (take_finished)."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.begin()
    assert ex.cancel(task, False)
    time.sleep(0.05)
    assert _state(ex, task) not in FINAL
    assert q.stopped and q.arrive(1) == 0
    q.end(3)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "cancelled" and _items(ex, task) == 3
    assert q.pending == 2
    time.sleep(0.05)
    assert task not in ex.take_finished(), "its memory went with launches still in flight"
    q.end(5)  # began stopped: nothing
    q.end(5)
    wait_until(lambda: q.pending == 0)
    wait_until(lambda: task in ex.take_finished())
    assert _items(ex, task) == 3 and q.ran == 3
    # A cancelled task's launches are not counted idle, whoever waited (the loop's rule).
    assert ex.open_launches == 3 and ex.idle_open_launches == 0


def test_cancel_wait_returns_before_the_gpu_reaches_the_opens_queued_ahead(ex):
    """Review G3: cancel(wait=True) on the training thread waited until the GPU reached
    the last open the host had queued a launch at, in effect a device synchronisation.
    With none of them begun it returns at once, the task final; a task submitted then
    takes the next open, its launch queued behind those, which claim nothing."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(4) == 4
    started = time.monotonic()
    assert ex.cancel(task, True)
    assert time.monotonic() - started < 2.0
    assert _state(ex, task) == "cancelled" and _items(ex, task) == 0
    other = ex.submit(_task(2), 0)
    q_other = _launches(ex, 1)
    wait_until(lambda: _C._testing.queue_open(ex) == (1, 1))
    assert q.pending == 4
    for _ in range(4):
        q.end(1)
    q_other.end(2)
    assert ex.wait(other, 10) and _state(ex, other) == "done"
    assert q.ran == 0
    wait_until(lambda: task in ex.take_finished())


@pytest.mark.parametrize("drop_pending", [False, True])
def test_a_failure_with_launches_in_flight(ex, drop_pending):
    """A launch that failed with others still enqueued (a broken launch: drop_pending
    False) fails the task once those have ended; a fault (drop_pending: nothing behind it
    runs) at once. Either way with the failure's message."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.fail("broken launch", drop_pending)
    if not drop_pending:
        time.sleep(0.05)
        assert _state(ex, task) not in FINAL, "final with two launches still in flight"
        assert q.stopped
        q.end(0)
        q.end(0)
    assert ex.wait(task, 10)
    state, *_, error = ex.status(task)
    assert state == "failed" and "broken launch" in error


def test_the_launch_log_waits_for_every_launch_in_flight(ex):
    """Executor.wait_launches_taken, which report() calls before taking the launch log:
    launches enqueued at opens end by themselves (at the close after their open, or their
    time slice), so it waits until the executor has taken every one of them, in order;
    a task merely waiting for a launch holds nothing up."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    wait_until(lambda: q.runs >= 1)
    assert ex.wait_launches_taken(0.0)
    assert q.arrive(3) == 3
    assert not ex.wait_launches_taken(0.0)
    q.end(4)
    q.end(5)
    assert not ex.wait_launches_taken(0.05)  # the third is still in flight
    q.end(6)
    assert ex.wait_launches_taken(10.0)
    assert ex.open_launches == 3  # all three taken when the wait returned
    assert _items(ex, task) == 15


def test_a_close_ends_the_wait_for_the_launch_log():
    """A launch in flight that never ends (a stalled stream) holds the wait only until
    the harvester closes: the wait and close() never wait for each other."""
    ex = _C._testing.queue_executor()
    ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 1
    result = []
    waiter = threading.Thread(target=lambda: result.append(ex.wait_launches_taken(60.0)))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()
    ex.close(0.3)
    waiter.join(10.0)
    assert not waiter.is_alive() and result == [True]


def test_close_waits_for_launches_that_end_in_time():
    ex = _C._testing.queue_executor()
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 1
    q.begin()  # running when the close comes
    closer = threading.Thread(target=ex.close, args=(5.0,))
    started = time.monotonic()
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive()
    q.end(7)
    closer.join(5)
    assert not closer.is_alive() and time.monotonic() - started < 2.0
    assert ex.take_abandoned() == []
    assert not _C._testing.queue_abandoned_work(ex)
    assert _state(ex, task) == "cancelled" and _items(ex, task) == 7


def test_close_abandons_launches_in_flight_past_its_deadline():
    """A launch that never ends (an item that never returns, a training stream stalled
    for good) must not hang close: past the deadline the task is cancelled as abandoned,
    named by take_abandoned() (its owner keeps its memory), and the backend told not to
    wait for or free what the launch may still write."""
    ex = _C._testing.queue_executor()
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    started = time.monotonic()
    ex.close(0.3)
    took = time.monotonic() - started
    assert 0.25 <= took < 2.0, took
    assert q.abandoned
    assert ex.take_abandoned() == [task]
    assert ex.take_abandoned() == []  # once
    assert _C._testing.queue_abandoned_work(ex)
    state, *_, error = ex.status(task)
    assert state == "cancelled" and "abandoned" in error


def test_close_abandons_nothing_without_launches_in_flight():
    """Negative control: a task merely waiting for a launch is stopped by close at once,
    with nothing abandoned."""
    ex = _C._testing.queue_executor()
    task = ex.submit(_task(100), 0)
    _launches(ex, 0)
    started = time.monotonic()
    ex.close(5.0)
    assert time.monotonic() - started < 1.0
    assert ex.take_abandoned() == []
    assert not _C._testing.queue_abandoned_work(ex)
    assert _state(ex, task) == "cancelled"


def test_close_joins_its_thread_when_the_stop_fails():
    """Review F8: close() stopped the running task outside the code that makes it join its
    thread and finish every task whatever fails, so a stop that threw (a sticky CUDA
    error) left the thread running and the harvester half closed. Now close() joins, makes
    every task final, and then raises the stop's error."""
    ex = _C._testing.queue_executor()
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    wait_until(lambda: q.runs >= 1)  # the executor waits in run() for a launch
    q.make_stop_fail()
    with pytest.raises(RuntimeError, match="stop write failed"):
        ex.close(0.3)
    assert ex.closed
    assert _state(ex, task) == "cancelled"
    ex.close(0.3)  # idempotent: nothing left to raise


def _into_backoff(ex):
    """A task whose launch of the executor's own ran nothing (a stale open mirror):
    the executor then backs off, held there (queue_hold_backoffs) until a submit, cancel
    or close. Returns the task and its launches."""
    _C._testing.queue_hold_backoffs(ex, True)
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(1, at_open=False) == 1
    q.end(0)
    assert _C._testing.queue_wait_backoffs(ex, 1)
    return task, q


def test_close_drains_a_launch_that_arrived_during_a_backoff():
    """Review G6: close() stopped only the task running at that moment; during a backoff
    none is, and a launch at an open taken meanwhile was left at close neither drained
    nor abandoned: the task ended plain "cancelled", its buffers were freed with the
    launch still queued on the GPU. Now the launch is drained (the test ends it) and the
    task is final only after it."""
    ex = _C._testing.queue_executor()
    task, q = _into_backoff(ex)
    assert q.arrive(1) == 1  # a training thread's open during the backoff
    q.begin()  # and its bubble has come
    closer = threading.Thread(target=ex.close, args=(5.0,))
    closer.start()
    wait_until(lambda: q.stopped)  # the loop looked, drains it, and stopped the task
    assert closer.is_alive() and _state(ex, task) not in FINAL
    q.end(3)
    closer.join(5)
    assert not closer.is_alive()
    assert q.pending == 0
    assert ex.take_abandoned() == []
    assert _state(ex, task) == "cancelled" and _items(ex, task) == 3


def test_close_abandons_a_launch_that_arrived_during_a_backoff_past_its_deadline():
    """The same launch that never ends: abandoned at the deadline, never plain-cancelled
    with a launch pending."""
    ex = _C._testing.queue_executor()
    task, q = _into_backoff(ex)
    assert q.arrive(1) == 1
    ex.close(0.3)
    assert q.abandoned
    assert ex.take_abandoned() == [task]
    assert _C._testing.queue_abandoned_work(ex)


def test_close_refuses_launches_at_opens_before_the_executor_sees_it_closing():
    """From close()'s start no open enqueues a launch (the CUDA backend disarms its
    runners), so the executor, once it sees the close and finds nothing in flight, leaves
    nothing behind; launches of the executor's own are not affected by that refusal."""
    ex = _C._testing.queue_executor()
    task, q = _into_backoff(ex)
    ex.close(5.0)
    assert q.arrive(1) == 0
    assert q.pending == 0 and ex.take_abandoned() == []
    assert _state(ex, task) == "cancelled"


def test_cancel_drains_a_launch_that_arrived_during_a_backoff():
    """cancel() of a task with no launch running (in a backoff) made it final at once,
    though a launch at an open taken since the executor last looked was still pending:
    now cancel stops it first (no launch is taken after that) and, with a launch left,
    leaves the task to the executor, final only once that launch has ended."""
    ex = _C._testing.queue_executor()
    try:
        task, q = _into_backoff(ex)
        assert q.arrive(1) == 1
        assert ex.cancel(task, False)
        assert q.stopped and q.arrive(1) == 0
        assert _state(ex, task) not in FINAL
        q.end(2)
        assert ex.wait(task, 10)
        assert _state(ex, task) == "cancelled" and q.pending == 0
    finally:
        ex.close(0.5)


def test_abandoned_tasks_are_named_by_take_abandoned_never_by_take_finished():
    """Review G17: an abandoned task was also among take_finished()'s ids, and the
    training thread's _reap() could let go of its handle (its buffers) between close()
    returning and the harvester keeping the abandoned ones. Now only take_abandoned()
    names it."""
    ex = _C._testing.queue_executor()
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 1
    ex.close(0.2)
    assert task not in ex.take_finished()
    assert ex.take_abandoned() == [task]


def test_reclaim_abandoned_once_the_launches_have_ended():
    """What abandoned launches may write is released only once they have ended: the
    backend says so (CUDA: its streams idle) when asked after close, never before."""
    ex = _C._testing.queue_executor()
    with pytest.raises(RuntimeError, match="before close"):
        ex.reclaim_abandoned()
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    ex.close(0.2)
    assert ex.take_abandoned() == [task]
    assert not ex.reclaim_abandoned()
    q.end(0)
    assert not ex.reclaim_abandoned()
    q.end(0)
    assert ex.reclaim_abandoned()


def test_reclaim_with_nothing_abandoned():
    ex = _C._testing.queue_executor()
    ex.close(0.2)
    assert ex.reclaim_abandoned()


def test_a_retired_task_forgotten_before_its_launches_ended_is_dropped_after_them(ex):
    """forget() of a task made final by a cancel while its launches were still queued (and
    the executor thread inside run() on them): the record is dropped once they have ended,
    not under the executor's feet (a use after free before)."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    wait_until(lambda: q.runs >= 1)  # the executor waits inside run() for the first end
    assert ex.cancel(task, True)
    ex.forget(task)
    assert _state(ex, task) == "cancelled", "dropped while its launches were in flight"
    for _ in range(3):
        q.end(1)
    wait_until(lambda: q.pending == 0)

    def dropped():
        try:
            ex.status(task)
        except ValueError:
            return True
        return False

    wait_until(dropped)
    other = ex.submit(_task(1), 0)
    q_other = _launches(ex, 1)
    wait_until(lambda: q_other.arrive(1) == 1)
    q_other.end(1)
    assert ex.wait(other, 10) and _state(ex, other) == "done"


def test_the_launches_of_a_retired_task_count_among_those_ending(ex):
    """wait_launches_taken (what a report waits for) counts a cancelled task's launches
    still queued: the task is final, its launches' ends are not taken yet."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    assert ex.cancel(task, True)
    assert not ex.wait_launches_taken(0.1)
    q.end(0)
    q.end(0)
    assert ex.wait_launches_taken(5)
    assert ex.open_launches == 2 and ex.idle_open_launches == 0


@pytest.mark.parametrize("seed", range(24))
def test_cancel_races_the_ends_of_launches_in_flight(seed):
    """A cancel(wait=True) against a thread beginning and ending the launches in flight at
    random moments (the waiter retiring the task races the executor taking ends), with and
    without phases ahead: whatever the order, the task ends cancelled or done with every
    item the device ran counted once, its id named once by take_finished() and only after
    its launches ended, and its memory back (a review's stress test of the retiring path)."""
    rng = random.Random(seed)
    ahead = seed % 2 == 1
    ex = _C._testing.queue_executor(memory_budget=10**9, phases_ahead=ahead)
    try:
        task = ex.submit(_C.spin_task(6, 3, 1000), 0)
        q = _launches(ex, 0)
        n = q.arrive(rng.randint(1, 5))
        plan = [(rng.random() < 0.5, rng.random() * 0.002, rng.randint(0, 4)) for _ in range(n)]
        plan = plan[: rng.randint(0, n)]

        def ender():
            for begin, pause, items in plan:
                try:
                    if begin:
                        q.begin()
                    time.sleep(pause)
                    q.end(items)
                except (RuntimeError, ValueError):  # none left to begin or end
                    return

        thread = threading.Thread(target=ender)
        thread.start()
        time.sleep(rng.random() * 0.003)
        ex.cancel(task, True)
        thread.join()
        named = ex.take_finished()
        assert task not in named or q.pending == 0, "named with launches in flight"
        while q.not_ended:
            q.end(3)
        wait_until(lambda: q.pending == 0)
        wait_until(lambda: named.extend(ex.take_finished()) or task in named)
        time.sleep(0.01)
        named += ex.take_finished()
        state, items = ex.status(task)[:2]
        assert state in ("cancelled", "done")
        assert items == q.ran
        assert named.count(task) == 1
        assert ex.memory_used == 0 and ex.take_abandoned() == []
    finally:
        ex.close(0.5)


def test_a_task_whose_items_are_all_done_is_done_before_its_stale_launches_end(ex):
    """Every item ran in the first of three launches queued ahead: the other two are stale
    (nothing left to claim). A wait (or result()) on the task returns once they are inert,
    the task done with every item, not when the GPU reaches their opens; its memory goes
    once they have ended. The next task takes the opens meanwhile."""
    task = ex.submit(_task(10), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.end(10)
    wait_until(lambda: q.stopped)  # complete: stopped, its stale launches will claim nothing
    assert ex.wait(task, 10)
    assert _state(ex, task) == "done" and _items(ex, task) == 10
    assert q.pending == 2
    time.sleep(0.05)
    assert task not in ex.take_finished()
    other = ex.submit(_task(1), 0)
    q_other = _launches(ex, 1)
    wait_until(lambda: _C._testing.queue_open(ex) == (1, 1))
    assert task not in ex.take_finished()
    q.end(0)
    q.end(0)
    wait_until(lambda: task in ex.take_finished())
    q_other.end(1)
    assert ex.wait(other, 10) and _state(ex, other) == "done"
    assert ex.idle_open_launches == 2 and q.ran == 10  # the stale ones ran nothing


def test_a_complete_task_is_done_even_if_cancelled_while_its_stale_launches_drain(ex):
    task = ex.submit(_task(4), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    q.end(4)
    wait_until(lambda: q.stopped)
    ex.cancel(task, False)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "done" and _items(ex, task) == 4
    q.end(0)


def test_an_executors_own_launch_that_ran_nothing_is_idle_but_not_an_idle_open_launch(ex):
    """The idle counts tell the two kinds of launch apart: a launch of the executor's own
    (admitted on the gate's mirror, not queued at an open) that ran nothing counts as an
    idle launch, not as an idle launch at an open; one at an open that ran nothing counts
    as both."""
    task, _q = _into_backoff(ex)
    assert ex.launches == 1 and ex.idle_launches == 1
    assert ex.open_launches == 0 and ex.idle_open_launches == 0
    assert ex.cancel(task, False)
    assert ex.wait(task, 10) and _state(ex, task) == "cancelled"
    other = ex.submit(_task(4, phases=2), 0)
    q_other = _launches(ex, 1)
    assert q_other.arrive(2) == 2
    q_other.end(4)
    q_other.end(0)  # stale: its phase was done
    wait_until(lambda: ex.launches == 3)
    assert ex.idle_launches == 2 and ex.open_launches == 2 and ex.idle_open_launches == 1
    wait_until(lambda: q_other.arrive(1) == 1)
    q_other.end(4)
    assert ex.wait(other, 10) and _state(ex, other) == "done"


def test_a_stale_launch_that_fails_fails_nothing_of_a_complete_task(ex):
    """Every item ran in the first of three launches queued ahead; the next one then fails
    (a kernel fault: the rest are gone with it). The task is complete: its launches left
    were stale, and a failure among them fails nothing of it (a broken context shows in
    the next task's run()); it ends done with every item."""
    task = ex.submit(_task(10), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.end(10)
    wait_until(lambda: q.stopped)  # its end taken: complete, stopped
    q.fail("a fault in a stale launch")
    wait_until(lambda: q.pending == 0)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "done" and _items(ex, task) == 10


def test_a_task_between_phases_is_not_complete_while_its_stale_launches_drain(ex):
    """Phase 0 of two ends in the first of three launches queued ahead: the other two are
    stale, but the task is not complete (its last phase is to come), so a waiter meanwhile
    does not make it final as a complete task's would be (retired done once its stale
    launches are inert): it goes on to phase 1 once they have ended."""
    task = ex.submit(_task(4, phases=2), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.end(4)
    wait_until(lambda: _items(ex, task) == 4)
    assert not ex.wait(task, 0.3)
    assert _state(ex, task) not in FINAL and not q.stopped
    q.end(0)
    q.end(0)
    wait_until(lambda: _phase(ex, task) == 1)
    wait_until(lambda: q.arrive(1) == 1)
    q.end(4)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "done" and _items(ex, task) == 8


def test_a_more_urgent_task_during_an_own_launch_that_runs_nothing_is_not_held_back(ex):
    """The executor's own launch (admitted on the gate's mirror) runs nothing, but a more
    urgent task came while it ran: the executor runs that task instead of backing off (the
    submit's ring came before any backoff could hear it). With each backoff held until the
    next submit, cancel or close, one here would hold the more urgent task until then."""
    _C._testing.queue_hold_backoffs(ex, True)
    low, high, q = _urgent_during_own_launch(ex)
    q.end(5)  # began after the stop: nothing
    _run_armed(ex, high)
    assert not _C._testing.queue_wait_backoffs(ex, 1, 0.05)
    assert _state(ex, low) not in FINAL and q.ran == 0


def _urgent_during_own_launch(ex):
    """A task whose launch of the executor's own (admitted on the gate's mirror) is
    running, and a more urgent task submitted meanwhile, once that launch is stopped:
    (the task, the more urgent one, the first's launches)."""
    low = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(1, at_open=False) == 1
    wait_until(lambda: q.runs >= 1)  # the launch is the one running
    high = ex.submit(_task(3), 1)
    wait_until(lambda: q.stopped)
    return low, high, q


def _run_armed(ex, task):
    """The armed task (the second admitted) takes an open and runs its 3 items."""
    q = _launches(ex, 1)
    wait_until(lambda: _C._testing.queue_open(ex) == (1, 1))
    q.end(3)
    assert ex.wait(task, 10) and _state(ex, task) == "done"


def test_a_complete_task_cancelled_while_its_stale_launches_drain_is_done_with_no_waiter(ex):
    """As above, with nobody waiting (no waiter retires it once its stale launches are
    inert): the executor drains them itself, and the complete task is done all the same."""
    task = ex.submit(_task(4), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    q.end(4)
    wait_until(lambda: q.stopped)
    assert ex.cancel(task, False)
    q.end(0)
    wait_until(lambda: _state(ex, task) in FINAL)
    assert _state(ex, task) == "done" and _items(ex, task) == 4


def test_a_failed_task_cancelled_while_its_launches_drain_stays_failed(ex):
    """A launch fails with two more of the task's queued behind it (stopped: they will
    claim nothing); the task is then cancelled. A waiter does not retire it as a cancelled
    task's inert launches would be: its launches are drained first (a failure may have
    broken the context), and it ends failed, not cancelled."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 3
    q.fail("a broken launch", drop_pending=False)
    wait_until(lambda: q.pending == 2 and q.stopped)
    assert ex.cancel(task, False)
    assert not ex.wait(task, 0.3)
    q.end(0)
    q.end(0)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "failed"


def test_a_retired_runners_memory_goes_once_its_launches_have_ended():
    """A cancelled task's inert launches in flight: a waiter makes it final (retired), but
    its memory stays charged until they have ended (they may still read it); then it goes,
    and a task that fits only in that memory is admitted."""
    ex = _C._testing.queue_executor(memory_budget=1000)
    try:
        first = _task(100)
        first.memory_bytes = 600
        task = ex.submit(first, 0)
        q = _launches(ex, 0)
        assert q.arrive(2) == 2
        assert ex.cancel(task, False)
        assert ex.wait(task, 10) and _state(ex, task) == "cancelled"
        assert ex.memory_used == 600
        q.end(0)  # began stopped: nothing
        q.end(0)
        wait_until(lambda: task in ex.take_finished())
        assert ex.memory_used == 0
        second = _task(5)
        second.memory_bytes = 600
        other = ex.submit(second, 0)
        q_other = _launches(ex, 1)
        wait_until(lambda: _C._testing.queue_open(ex) == (1, 1))
        q_other.end(5)
        assert ex.wait(other, 10) and _state(ex, other) == "done"
        wait_until(lambda: ex.memory_used == 0)
    finally:
        ex.close(0.5)


def test_close_abandons_a_retired_runners_launch_that_never_ends(ex):
    """A cancelled task retired by a waiter (final, its inert launches left to drain)
    whose launch never ends: close() abandons it at the deadline and returns, the task
    named by take_abandoned(), not take_finished() (its memory may still be read)."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    assert ex.cancel(task, False)
    assert ex.wait(task, 10) and _state(ex, task) == "cancelled"
    closer = threading.Thread(target=ex.close, args=(0.3,))
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close() did not return"
    assert task in ex.take_abandoned()
    assert task not in ex.take_finished()


def test_close_stops_the_armed_task_at_once(ex):
    """A was stopped for U, more urgent; U is armed and took an open while A's launches
    drain. close() stops every runner that may have launches queued at opens, the armed
    one too, at once: U's launch claims nothing if it begins before the loop comes to it
    (the loop is still waiting for A's launches)."""
    a = ex.submit(_C.spin_task(20, 1, 1000), 0)
    q_a = _launches(ex, 0)
    assert q_a.arrive(2) == 2
    u = ex.submit(_C.spin_task(20, 1, 1000), 1)
    q_u = _launches(ex, 1)
    wait_until(lambda: _C._testing.queue_open(ex) == (1, 1))
    closer = threading.Thread(target=ex.close, args=(30.0,))
    closer.start()
    try:
        wait_until(lambda: q_u.stopped, timeout=5)
        q_u.begin()  # began stopped: it will claim nothing
    finally:
        q_a.end(0)
        q_a.end(0)
        q_u.end(20)
        closer.join(10)
    assert not closer.is_alive()
    assert q_u.ran == 0 and ex.take_abandoned() == []
    assert _state(ex, a) == "cancelled" and _state(ex, u) == "cancelled"


def test_close_refuses_launches_at_opens_even_where_a_stop_failed():
    """close() refuses launches at opens before anything else: a runner whose stop failed
    (a sticky CUDA error) takes no launch at an open written while the close goes on, so
    nothing is left in flight to abandon."""
    ex = _C._testing.queue_executor()
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    wait_until(lambda: q.runs >= 1)  # the executor waits in run() for a launch
    q.make_stop_fail()
    errors = []

    def close():
        try:
            ex.close(1.0)
        except RuntimeError as e:
            errors.append(e)

    closer = threading.Thread(target=close)
    closer.start()
    wait_until(lambda: ex.closed)
    assert _C._testing.queue_open(ex)[1] == 0, "a launch at an open was taken during close"
    closer.join(10)
    assert not closer.is_alive()
    assert errors and "stop write failed" in str(errors[0])
    assert _state(ex, task) == "cancelled" and ex.take_abandoned() == []


def test_a_task_as_urgent_as_the_one_run_last_does_not_stop_its_launches_in_flight(ex):
    """During a backoff (no launch running) the task run last took a launch at an open; a
    task of the same priority submitted then waits its turn: only a more urgent one stops
    the task run last (preempt_last_for_locked), so that launch runs its items."""
    task, q = _into_backoff(ex)
    assert q.arrive(1) == 1  # a training thread's open during the backoff
    other = ex.submit(_task(5), 0)
    q.end(3)
    wait_until(lambda: _items(ex, task) == 3)
    assert not q.stopped and q.ran == 3
    assert _state(ex, other) not in FINAL


def test_a_hand_back_leaves_the_executors_own_launch_to_end(ex):
    """The queue model hands a launch back untaken (PhaseRunner::hand_back) only while it
    waits for its open, as CudaRunner::wait_for_end does: a launch of the executor's own
    (admitted on the gate's mirror) is taken when it ends, so a more urgent task submitted
    while it runs is armed after it, not while it is still in flight."""
    low, high, q = _urgent_during_own_launch(ex)
    time.sleep(0.1)
    assert _C._testing.queue_open(ex)[1] == 0, "armed with the running launch in flight"
    q.end(5)  # began after the stop: nothing
    _run_armed(ex, high)
    assert _state(ex, low) not in FINAL


def test_a_cancelled_tasks_launches_drained_by_the_loop_are_not_idle(ex):
    """A cancelled task's launches that run nothing because of the cancel are not idle
    launches, whoever takes their ends: here the loop drains them (nobody waits, so none
    is retired)."""
    task = ex.submit(_task(100), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    assert ex.cancel(task, False)
    q.end(0)
    q.end(0)
    wait_until(lambda: _state(ex, task) in FINAL)
    assert _state(ex, task) == "cancelled"
    assert ex.open_launches == 2 and ex.idle_open_launches == 0 and ex.idle_launches == 0


def test_a_stale_launch_at_an_open_starts_no_backoff(ex):
    """Only a launch of the executor's own that ran nothing says the gate's mirror may be
    stale and starts a backoff: a stale launch at an open (its phase was done) does not,
    so the next phase's launch is taken as soon as it ends."""
    _C._testing.queue_hold_backoffs(ex, True)
    task = ex.submit(_task(4, phases=2), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 2
    q.end(4)
    q.end(0)  # stale: its phase was done
    wait_until(lambda: _phase(ex, task) == 1)
    assert not _C._testing.queue_wait_backoffs(ex, 1, 0.2)
    wait_until(lambda: q.arrive(1) == 1)
    q.end(4)
    assert ex.wait(task, 10)
    assert _state(ex, task) == "done" and _items(ex, task) == 8
