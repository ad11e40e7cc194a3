"""The lookahead bound (issue 36, review G2): how many opens ahead of the GPU may carry a
side launch that waits for them.

Each launch at an open waits on the side stream for its open, long before training gets
there; under shared hardware queues another stream on the side stream's queue may be held
behind that wait. FREERIDE_MAX_LOOKAHEAD=N (CUDA; none by default: the H200 run of
2026-11-27 saw no stream held, 0 of 24) leaves an open without a launch while N launches
at earlier opens wait for theirs, and counts it (Harvester.launch_counts().
beyond_lookahead). The test queue backend (freeride_ext/queue_backend.hpp) takes the same
rule (csrc/open_launch_rule.hpp), its "not begun" being "not ended".
"""

import pytest

import freeride as fr
from conftest import runner_launches as _launches
from freeride import _C


def test_rule_counts_opens_waiting_against_the_bound():
    within = _C._testing.within_lookahead
    assert within(0, 0) and within(100, 0), "0: no bound"
    assert within(0, 1) and not within(1, 1)
    assert within(1, 2) and not within(2, 2) and not within(3, 2)


def test_opens_past_the_bound_carry_no_launch_and_are_counted():
    ex = _C._testing.queue_executor(max_lookahead=2)
    try:
        task = ex.submit(_C.spin_task(10, 1, 1000), 0)
        q = _launches(ex, 0)
        assert q.arrive(5) == 2
        assert ex.opens_beyond_lookahead == 3
        q.end(4)  # one has run: one more open may carry a launch
        assert q.arrive(2) == 1
        assert ex.opens_beyond_lookahead == 4
        q.end(3)
        q.end(3)
        assert ex.wait(task, 10)
        assert ex.status(task)[:2] == ("done", 10)
    finally:
        ex.close(0.5)


def test_without_a_bound_every_open_carries_a_launch():
    ex = _C._testing.queue_executor()
    try:
        ex.submit(_C.spin_task(10, 1, 1000), 0)
        q = _launches(ex, 0)
        assert q.arrive(8) == 8
        assert ex.opens_beyond_lookahead == 0
        for _ in range(8):
            q.end(0)
    finally:
        ex.close(0.5)


def test_a_launch_chained_at_an_open_does_not_count_as_an_open_ahead():
    """Phases ahead: the next phase's launch chained behind the current one's waits for no
    open of its own (it is behind that launch on the stream): a bound of one still lets
    each open carry both."""
    ex = _C._testing.queue_executor(phases_ahead=True, max_lookahead=1)
    try:
        task = ex.submit(_C.spin_task(5, 2, 1000), 0)
        q = _launches(ex, 0)
        assert q.arrive(3) == 2
        assert q.pending_phases == [(0, False), (1, True)]
        assert ex.opens_beyond_lookahead == 2
        q.end(5)
        q.end(5)
        assert ex.wait(task, 10)
        assert ex.status(task)[:2] == ("done", 10)
    finally:
        ex.close(0.5)


def test_the_report_shows_opens_left_past_the_bound():
    counts = {"launches": 9, "at_opens": 7, "max_lookahead": 2, "beyond_lookahead": 5}
    report = fr.Report(device="cuda:0", backend="cuda", launch_counts=counts)
    assert "5 opens left without, past the lookahead bound" in report.summary()
    assert fr.Report.from_dict(report.to_dict()).launch_counts["beyond_lookahead"] == 5


def test_the_host_backend_bounds_nothing(host):
    assert host.launch_counts().beyond_lookahead == 0


def test_the_bound_is_read_from_the_environment(monkeypatch):
    """FREERIDE_MAX_LOOKAHEAD is read when a CUDA harvester is made: unset or 0 for no
    bound, a whole number of opens otherwise; anything else is refused, naming it."""
    if not hasattr(_C._testing, "lookahead_bound"):
        pytest.skip("this build of freeride has no CUDA backend")
    monkeypatch.delenv("FREERIDE_MAX_LOOKAHEAD", raising=False)
    assert _C._testing.lookahead_bound() == 0
    monkeypatch.setenv("FREERIDE_MAX_LOOKAHEAD", "2")
    assert _C._testing.lookahead_bound() == 2
    for bad in ("-1", "two", "1.5", "99999999"):
        monkeypatch.setenv("FREERIDE_MAX_LOOKAHEAD", bad)
        with pytest.raises(ValueError, match="FREERIDE_MAX_LOOKAHEAD"):
            _C._testing.lookahead_bound()
