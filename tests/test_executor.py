import threading
import time

import numpy as np
import pytest

import freeride as fr
from conftest import os_threads, wait_until
from freeride import _C


def test_priorities_higher_first_fifo_within(host):
    host.gate.close(stream="host")
    order = []
    low = host.submit(fr.tasks.ItemCounter(8, ns_per_item=5_000_000), priority=0)
    high_a = host.submit(fr.tasks.ItemCounter(8, ns_per_item=5_000_000), priority=5)
    high_b = host.submit(fr.tasks.ItemCounter(8, ns_per_item=5_000_000), priority=5)
    mid = host.submit(fr.tasks.ItemCounter(8, ns_per_item=5_000_000), priority=2)
    handles = {"low": low, "high_a": high_a, "high_b": high_b, "mid": mid}

    def watch():
        pending = dict(handles)
        while pending:
            for name, h in list(pending.items()):
                if h.done():
                    order.append(name)
                    del pending[name]
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    host.gate.open(stream="host")
    assert host.wait_all(timeout=30)
    watcher.join()
    assert order == ["high_a", "high_b", "mid", "low"]
    for h in handles.values():
        assert (h.result().counts == 1).all()


def test_higher_priority_preempts_running_task(host):
    low = host.submit(fr.tasks.ItemCounter(2000, ns_per_item=500_000), priority=0)
    wait_until(lambda: low.items_done > 10)
    high = host.submit(fr.tasks.ItemCounter(40, ns_per_item=100_000), priority=1)
    assert high.wait(timeout=30)
    assert not low.done()  # low had far more work left; it yielded at an item boundary
    low.cancel()
    low.wait(timeout=30)
    counts = low.task.snapshot().counts
    assert counts.max() == 1
    assert int(counts.sum()) == low.items_done
    assert (high.result().counts == 1).all()


def test_failing_task_reports_and_others_continue(harvester):
    if harvester.backend != "host":
        pytest.skip("injected item failures exist on the host backend only")
    bad = harvester.submit(fr.tasks.ItemCounter(100, phases=2, fail_at=(1, 17)))
    good = harvester.submit(fr.tasks.ItemCounter(100, phases=2))
    assert bad.wait(timeout=30) and good.wait(timeout=30)
    assert bad.state == "failed"
    with pytest.raises(fr.TaskFailedError, match="injected failure at phase 1, item 17"):
        bad.result()
    counts = bad.task.snapshot().counts
    assert (counts[0] == 1).all() and counts[1, 17] == 0 and counts.max() == 1
    assert (good.result().counts == 1).all()
    after = harvester.submit(fr.tasks.Spin(10, 1000))
    assert after.wait(timeout=30) and after.state == "done"


def test_cancel_queued_running_and_finished(host):
    host.gate.close(stream="host")
    queued = host.submit(fr.tasks.Spin(10, 1000))
    assert queued.cancel()
    assert queued.state == "cancelled"
    with pytest.raises(fr.TaskCancelledError):
        queued.result()
    host.gate.open(stream="host")
    running = host.submit(fr.tasks.ItemCounter(5000, ns_per_item=200_000))
    wait_until(lambda: running.items_done > 5)
    assert running.cancel()
    assert running.wait(timeout=10)
    assert running.state == "cancelled"
    snap = running.task.snapshot()
    assert snap.counts.max() == 1 and int(snap.counts.sum()) == running.items_done
    finished = host.submit(fr.tasks.Spin(4, 1000))
    assert finished.wait(timeout=10)
    assert not finished.cancel()
    assert finished.state == "done"


def test_progress_and_items_done_grow_while_running(host):
    t = host.submit(fr.tasks.Spin(400, 500_000, phases=2))
    wait_until(lambda: 0 < t.items_done < 800)
    assert 0.0 < t.progress < 1.0
    assert t.items_total == 800
    assert t.wait(timeout=60)
    assert t.progress == 1.0 and t.items_done == 800


def test_memory_budget_rejects_oversized_task(host):
    with fr.Harvester("cpu", memory_budget="4KiB", workers=2) as h:
        big = h.submit(fr.tasks.Saxpy(2.0, np.ones(4096, np.float32), np.ones(4096, np.float32)))
        small_y = np.ones(64, np.float32)
        small = h.submit(fr.tasks.Saxpy(2.0, np.ones(64, np.float32), small_y))
        assert big.wait(timeout=10) and small.wait(timeout=10)
        assert big.state == "failed"
        with pytest.raises(fr.MemoryBudgetError, match="memory_budget"):
            big.result()
        assert small.state == "done"
        np.testing.assert_array_equal(small_y, np.full(64, 3.0, np.float32))
        assert h.memory_used == 0


def test_memory_budget_queues_until_memory_is_released():
    with fr.Harvester("cpu", memory_budget=3000, workers=2) as h:
        h.gate.close(stream="host")
        a = h.submit(fr.tasks.ItemCounter(500))  # 2000 + 16 bytes
        b = h.submit(fr.tasks.ItemCounter(500))
        h.gate.open(stream="host")
        assert a.wait(timeout=30) and b.wait(timeout=30)
        assert a.state == b.state == "done"
        assert h.memory_used == 0


def test_close_with_running_tasks_returns_and_leaves_no_thread():
    before = os_threads()
    h = fr.Harvester("cpu", workers=4)
    # 4 workers, the executor thread, and the SIGTERM watchdog while a harvester is open
    # (freeride._shutdown: on the main thread, where SIGTERM had its default action)
    assert os_threads() == before + 5 + fr._C._sigterm_guard_armed()
    running = h.submit(fr.tasks.Spin(100_000, 1_000_000))
    queued = h.submit(fr.tasks.Spin(10, 1_000))
    wait_until(lambda: running.items_done > 0)
    h.close()
    assert os_threads() == before
    assert running.state == "cancelled" and queued.state == "cancelled"
    assert running.items_done < 100_000
    with pytest.raises(fr.TaskCancelledError, match="closed"):
        queued.result()


def test_close_while_gate_closed_and_task_waiting():
    before = os_threads()
    h = fr.Harvester("cpu", workers=2)
    h.gate.close(stream="host")
    t = h.submit(fr.tasks.Spin(10, 1000))
    time.sleep(0.05)
    h.close()
    assert t.state == "cancelled"
    assert os_threads() == before


# A task whose submit-time stream dependency is not ready yet must not hold the executor.
# The host backend has no streams; a latch the test releases stands in for one.


def _latched(h, priority=0):
    """Submits a short Spin that waits for a latch; returns (task id, latch)."""
    latch = _C._testing.Latch()
    task = _C.spin_task(20, 1, 1000)
    return _C._testing.submit_after_latch(h._ex, task, priority, latch), latch


def _returns(call):
    """True if call() returned within 30 s (a call held by the dependency never would)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=30)
    return not thread.is_alive()


def test_task_waiting_on_its_dependency_lets_later_tasks_run(host):
    blocked, latch = _latched(host, priority=5)
    later = host.submit(fr.tasks.ItemCounter(50), priority=0)
    assert later.wait(timeout=30)
    assert (later.result().counts == 1).all()
    state, items_done = host._ex.status(blocked)[:2]
    assert state == "queued" and items_done == 0
    latch.release()
    assert host._ex.wait(blocked, 30.0)
    assert host._ex.status(blocked)[:3] == ("done", 20, 20)


def test_cancel_of_a_task_waiting_on_its_dependency_returns(host):
    blocked, _latch = _latched(host)
    time.sleep(0.01)  # the executor has looked at it and passed it over
    assert _returns(lambda: host._ex.cancel(blocked, True))
    assert host._ex.status(blocked)[0] == "cancelled"
    after = host.submit(fr.tasks.Spin(10, 1000))
    assert after.wait(timeout=30) and after.state == "done"


def test_close_with_a_task_waiting_on_its_dependency_returns():
    before = os_threads()
    h = fr.Harvester("cpu", workers=2)
    blocked, _latch = _latched(h)
    time.sleep(0.01)
    assert _returns(h.close)
    assert h._ex.status(blocked)[0] == "cancelled"
    # _returns' own thread has been joined, but its OS thread may take a moment to go.
    wait_until(lambda: os_threads() == before)


def test_closed_harvester_refuses_work(host):
    host.close()
    host.close()  # idempotent
    with pytest.raises(fr.HarvesterClosedError):
        host.submit(fr.tasks.Spin(1, 1))
    with pytest.raises(fr.HarvesterClosedError):
        host.gate.close()
    with pytest.raises(fr.HarvesterClosedError), host.compute():
        pass


def test_many_harvesters_open_and_close_without_leaks():
    before = os_threads()
    for _ in range(20):
        with fr.Harvester("cpu", workers=3) as h:
            h.submit(fr.tasks.Spin(50, 10_000))
    assert os_threads() == before


def test_a_launch_waiting_since_before_recording_is_recorded():
    """A task submitted while the gate is closed waits for it in its first launch; once
    the first recorded iteration opens the gate, that launch runs inside the iteration
    and must be in the record like every later one."""
    with fr.Harvester("cpu", workers=1) as h:
        h.gate.close()
        handle = h.submit(fr.tasks.Spin(10**9, 20_000))
        wait_until(lambda: handle.state == "paused")  # admitted, waiting for the gate
        # The first iteration's launch is the one under test; SCHED_IDLE workers may need
        # more (bounded) on a loaded machine before any item runs.
        for _ in range(200):
            with h.iteration():
                time.sleep(0.02)  # a bubble
                with h.compute(label="F"):
                    time.sleep(0.005)
                time.sleep(0.01)
            if handle.items_done > 0:
                break
        handle.cancel()
        report = h.report()
    assert handle.items_done > 0
    assert sum(report.items_per_task.values()) == handle.items_done


def test_launches_that_run_no_item_back_off_until_a_new_open(host):
    """Issue 20 item 4's race, on the host backend: items see the gate closed while the
    executor's admission reads it open (on CUDA: a stale open mirror over a closed gate
    word, left by an immediate write racing a stream-ordered one). Each launch then runs
    no item; without the backoff the executor relaunched at once, thousands of times a
    second (the negative control below counts what the same half second gives when every
    launch gets a fresh open). With it, launches wait for a newer open, at most
    100 us, 200 us, ... up to 10 ms: a few dozen in half a second. A real new open
    still lets the next launch in at once, and nothing runs twice."""
    ex = host._ex
    task = host.submit(fr.tasks.ItemCounter(64))
    assert task.wait(timeout=30)
    _C._testing.items_see_gate_closed(ex, True)
    try:
        counter = host.submit(fr.tasks.ItemCounter(64))
        wait_until(lambda: ex.idle_launches >= 1, timeout=10)
        before = ex.launches
        time.sleep(0.5)
        stale = ex.launches - before
        assert counter.items_done == 0
        # Negative control: every launch under a newer open is let in at once. 200 opens
        # (immediate writes) in the same time give nearly as many launches.
        before = ex.launches
        for _ in range(200):
            host.gate.close(stream="host")
            host.gate.open(stream="host")
            time.sleep(0.0025)
        fresh = ex.launches - before
    finally:
        _C._testing.items_see_gate_closed(ex, False)
    assert stale <= 80, f"{stale} launches in 0.5 s with a stale open gate"
    # Most of the 200 opens let a launch in; the stale gate let in a quarter as many.
    assert fresh >= 100 and fresh >= 2 * stale, (fresh, stale)
    host.gate.close(stream="host")
    host.gate.open(stream="host")
    assert counter.wait(timeout=30)
    assert (counter.result().counts == 1).all()


def test_a_more_urgent_task_that_cannot_run_does_not_end_the_backoff(host):
    """Review F11: the backoff after launches that the gate let in but that ran nothing
    ended at once whenever a more urgent task was queued, even one that cannot run (its
    dependency pending): launches came back to back, the storm the backoff exists to stop.
    Only a more urgent task that can run ends it now. Negative control: once that task's
    dependency is ready it runs (and its launches are no storm either)."""
    ex = host._ex
    latch = _C._testing.Latch()
    _C._testing.items_see_gate_closed(ex, True)
    try:
        counter = host.submit(fr.tasks.ItemCounter(64))
        wait_until(lambda: ex.idle_launches >= 1, timeout=10)
        bound = fr.tasks.ItemCounter(8)._build("host", -1)  # holds the task's buffers
        blocked = _C._testing.submit_after_latch(ex, bound.core, 1, latch)
        time.sleep(0.05)
        before = ex.launches
        time.sleep(0.5)
        stale = ex.launches - before
        assert ex.status(blocked)[0] == "queued"
    finally:
        _C._testing.items_see_gate_closed(ex, False)
    assert stale <= 80, f"{stale} launches in 0.5 s: the queued task ended every backoff"
    latch.release()
    assert ex.wait(blocked, 30)
    host.gate.close(stream="host")
    host.gate.open(stream="host")
    assert counter.wait(timeout=30)


def _cuda_executor(stream_wait):
    return _C.Executor("cuda", 0, 1, False, stream_wait, 0, (0, 0, 0, 0), 0)


@pytest.mark.skipif(not _C.CUDA_BUILT, reason="this build has no CUDA backend")
@pytest.mark.parametrize("connections", ["1", "8"])
def test_stream_wait_is_refused_under_one_hardware_queue(monkeypatch, connections):
    """Issue 20 item 2: under CUDA_DEVICE_MAX_CONNECTIONS=1 the launch held by the stream
    wait would hold the training stream's own gate open behind it, so the mode is refused
    before anything touches a device (checked here without one). Negative control: with 8
    connections the same call gets past that check (and, without a GPU, fails later on the
    device, for another reason)."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections)
    with pytest.raises((ValueError, RuntimeError)) as refused:
        ex = _cuda_executor(stream_wait=True)
        ex.close()  # a GPU machine with 8 connections builds it: nothing to refuse
        pytest.skip("a GPU is present: nothing below the refusal to check here")
    mentions = "CUDA_DEVICE_MAX_CONNECTIONS=1" in str(refused.value)
    assert mentions == (connections == "1"), str(refused.value)
    if connections == "1":
        assert refused.type is ValueError


def test_wait_next_open_sleeps_until_a_newer_open(host):
    """Backend::wait_next_open, which the executor's backoff and the iterative runner use:
    False while the gate stays on the open it was given (and through a close), True once
    a newer open has taken effect, and a submit ends the wait early (returning False)."""
    ex = host._ex
    host.gate.open(stream="host")
    seq = ex.gate_seq()
    t0 = time.monotonic()
    assert ex.gate_wait_next_open(seq, 0.05) is False
    assert time.monotonic() - t0 >= 0.04
    host.gate.close(stream="host")
    assert ex.gate_wait_next_open(seq, 0.02) is False  # a close is no new open

    def reopen():
        time.sleep(0.05)
        host.gate.open(stream="host")

    opener = threading.Thread(target=reopen)
    opener.start()
    t0 = time.monotonic()
    assert ex.gate_wait_next_open(seq, 10.0) is True
    assert time.monotonic() - t0 < 5.0
    opener.join()
    # Interrupted: a submit rings, the wait returns without a newer open.
    seq = ex.gate_seq()
    done = []
    waiter = threading.Thread(target=lambda: done.append(ex.gate_wait_next_open(seq, 10.0)))
    waiter.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    host.submit(fr.tasks.ItemCounter(4)).wait(timeout=30)
    waiter.join(timeout=5.0)
    assert not waiter.is_alive() and done == [False]
    assert time.monotonic() - t0 < 5.0


def test_admission_stamps_place_the_executors_wake_and_launch_after_the_open(host):
    """What probes/probe_admission.py splits a host-started admission by: once an open
    admits a launch, the executor's wake-up and its launch are stamped with that open's
    number, in that order, on Python's monotonic clock, after the open and before the
    first item is seen. The host backend has no watcher: `reached` stays unstamped."""
    assert host._ex.admission_stamps == {"reached": None, "woke": None, "launched": None}
    host.gate.close()
    t = host.submit(fr.tasks.ItemCounter(10**6, ns_per_item=1_000))
    time.sleep(0.05)
    opened = time.monotonic_ns()
    host.gate.open()
    seq = host.gate.seq  # the host's writes take effect as they are made
    wait_until(lambda: t.items_done > 0)
    seen = time.monotonic_ns()
    stamps = host._ex.admission_stamps
    assert stamps["reached"] is None
    (woke_seq, woke), (launched_seq, launched) = stamps["woke"], stamps["launched"]
    assert woke_seq == launched_seq == seq
    assert opened <= woke <= launched <= seen
    t.cancel()
