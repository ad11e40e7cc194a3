"""An open the executor saw take effect before the training thread enqueued its launch
(csrc/open_launch_rule.hpp's served_by_executor), through the test queue backend
(freeride_ext/queue_backend.hpp, which takes the CUDA runner's rule).

The training thread writes an open, then enqueues the launch at it. Where the GPU had
caught up with the host, the open takes effect at once, and an executor that looks
without waiting for a ring (FREERIDE_ADMISSION=spin or poll, or the ring's first looks)
may see it first and launch for it itself. A launch at the open enqueued after that one
would wait for it on the side stream, and it ends only with this bubble's close, which
training enqueues after the open's launch: under one hardware queue training's work, the
close included, would wait behind the waiting launch for the slice bound, or for good
with time_slice=None. So that open's launch is left out and counted
(Harvester.launch_counts().served_by_executor): the executor's serves the bubble. Not where
that launch has ended, or its runner's stop is ahead of the open's launch: it leaves at
its next claim then, and a launch behind it waits an item at most."""

import pytest
from gpu_worker import run_worker

import freeride as fr
from conftest import queue_progress as _status
from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C


def _open(ex, seq):
    """One stream-ordered open numbered `seq`: (the armed runner's index, launches taken)."""
    return _C._testing.queue_open(ex, 1, 0, seq)


@pytest.mark.parametrize(
    "newest_at_open, holds, newest_seq, seq, left_out",
    [
        (False, True, 7, 7, True),  # the executor's own launch for this very open
        (False, True, 6, 7, False),  # ... for an earlier open: its close comes before this
        (False, False, 7, 7, False),  # ... ended, or stopped: it holds nothing up
        (True, True, 7, 7, False),  # a launch at the open (the same thread's: never two)
        (False, True, 0, 0, False),  # no open known: nothing is served
        (False, True, 0, 7, False),
        (False, True, 2**32 - 1, 2**32 - 1, True),
    ],
)
def test_the_rule(newest_at_open, holds, newest_seq, seq, left_out):
    rule = _C._testing.served_by_executor
    assert rule(newest_at_open, holds, newest_seq, seq) is left_out


def test_an_open_the_executor_launched_for_first_carries_no_second_launch(ex):
    t = ex.submit(_C.spin_task(20, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1, at_open=False, seq=7) == 1  # the executor saw open 7 take effect
    assert _open(ex, 7) == (0, 0), "its launch would wait behind the executor's"
    assert ex.opens_served_by_executor == 1
    assert q.pending == 1
    # The next open's launch queues behind the executor's as ever: that one ends with
    # open 7's bubble, whose close training enqueued before open 8.
    assert _open(ex, 8) == (0, 1)
    assert ex.opens_served_by_executor == 1 and q.pending == 2
    q.end(5)
    q.end(15)
    assert ex.wait(t, 10) and _status(ex, t) == ("done", 20)


def test_an_executor_launch_for_an_earlier_open_leaves_the_next_its_launch(ex):
    t = ex.submit(_C.spin_task(10, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1, at_open=False, seq=7) == 1
    assert _open(ex, 8) == (0, 1)
    assert ex.opens_served_by_executor == 0
    q.end(4)
    q.end(6)
    assert ex.wait(t, 10) and _status(ex, t) == ("done", 10)


def test_behind_an_ended_launch_the_open_keeps_its_launch(ex):
    """The executor's launch for the open ended (its end not yet taken): the open's own
    launch begins at once behind it, and runs the rest of the bubble."""
    t = ex.submit(_C.spin_task(20, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1, at_open=False, seq=7) == 1
    q.end(5)
    assert _open(ex, 7) == (0, 1)
    assert ex.opens_served_by_executor == 0
    q.end(15)
    assert ex.wait(t, 10) and _status(ex, t) == ("done", 20)


def test_behind_a_stopped_launch_the_followers_open_keeps_its_launch():
    """The task followed is cancelled while the executor's launch for the open is in
    flight: that launch leaves at its next claim (its stop is ahead of anything enqueued
    now), so the follower's launch at the same open is queued behind it, not left out."""
    ex = _C._testing.queue_executor(followers=True)
    try:
        a, b, q_a, q_b = _tail_with_follower(ex)
        assert q_a.arrive(1, at_open=False, seq=3) == 1
        assert ex.cancel(a, False)
        wait_until(lambda: q_a.stopped)
        _C._testing.queue_open(ex, 1, 0, 3)
        assert ex.opens_served_by_executor == 0
        assert q_b.pending == 1
        q_a.end(0)
        q_b.end(6)
        assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)
    finally:
        ex.close(0.5)


def test_a_launch_at_the_same_open_is_not_the_executors(ex):
    """Only the executor's own launch serves the open: behind the launch at open 7 (the
    model's second open numbered 7 stands for any launch at an open), the rule leaves
    nothing out."""
    ex.submit(_C.spin_task(1000, 1, 1000), 0)
    q = _launches(ex, 0)
    wait_until(lambda: _open(ex, 7) == (0, 1))
    assert _open(ex, 7) == (0, 1)
    assert ex.opens_served_by_executor == 0
    q.end(0)
    q.end(0)


def _tail_with_follower(ex):
    """A (12 items) after two launches of 4 at opens 1 and 2: in its tail, B (6 items)
    following it. (A, B, A's launches, B's launches)."""
    a = ex.submit(_C.spin_task(12, 1, 1000), 0)
    b = ex.submit(_C.spin_task(6, 1, 1000), 0)
    q_a = _launches(ex, 0)
    for seq in (1, 2):
        wait_until(lambda seq=seq: _open(ex, seq) == (0, 1))
        q_a.end(4)
    wait_until(lambda: _C._testing.queue_follower(ex) == 1)
    return a, b, q_a, _launches(ex, 1)


def test_the_follower_is_left_out_too():
    """With a follower the armed runner's launch is left out, and the follower's, not
    chained behind a launch of this open, would wait behind the executor's too."""
    ex = _C._testing.queue_executor(followers=True)
    try:
        a, b, q_a, q_b = _tail_with_follower(ex)
        assert q_a.arrive(1, at_open=False, seq=3) == 1
        assert _C._testing.queue_open(ex, 1, 0, 3) == (0, 0)
        assert ex.opens_served_by_executor == 2
        assert (q_a.pending, q_b.pending) == (1, 0)
        q_a.end(4)
        assert ex.wait(a, 10) and _status(ex, a) == ("done", 12)
        wait_until(lambda: _open(ex, 4)[0] == 1)
        q_b.end(6)
        assert ex.wait(b, 10) and _status(ex, b) == ("done", 6)
    finally:
        ex.close(0.5)


def test_the_count_is_reported():
    counts = {"launches": 3, "at_opens": 2, "served_by_executor": 2}
    report = fr.Report(device="cuda:0", backend="cuda", launch_counts=counts)
    assert "2 launches at opens left out, the executor's there first" in report.summary()
    assert fr.Report.from_dict(report.to_dict()).launch_counts["served_by_executor"] == 2
    with fr.Harvester("cpu", workers=1) as h:
        assert h.launch_counts().served_by_executor == 0


@pytest.mark.gpu
def test_an_open_seen_first_under_one_hardware_queue_does_not_hold_training():
    """On a GPU, under one hardware queue with time_slice=None: each open's launch is
    enqueued 3 ms after its writes (the test switch), so the executor, looking all the time
    (FREERIDE_ADMISSION=spin), sees every open of an idle GPU take effect first and
    launches for it. Each open's own launch is left out, and training's kernel after each
    bubble runs (without the rule it waited behind the open's launch, which waited for
    the executor's, which waited for a close behind them all: for good)."""
    if not fr.backend_info()["cuda"]:
        pytest.skip("needs a CUDA GPU (the race and the hold are the GPU's)")
    r = run_worker(
        "seen_first",
        {"opens": 10, "delay_us": 3000, "bubble_ms": 5.0},
        env={"CUDA_DEVICE_MAX_CONNECTIONS": "1", "FREERIDE_ADMISSION": "spin"},
        timeout=120,
        worker="open_seen_first_worker.py",
    )
    assert r["admission"] == "spin" and r["launches_at_opens"], r
    assert r["stuck_at"] is None, f"training's kernel stuck after bubble {r['stuck_at']}: {r}"
    assert r["served_by_executor"] >= 1, r
    assert r["items"] > 0, r
