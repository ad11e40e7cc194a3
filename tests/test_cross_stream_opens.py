"""Opens written on two training streams (review G11), through the executor on the test
queue backend (freeride_ext/queue_backend.hpp, which takes the CUDA runner's rule:
csrc/open_launch_rule.hpp's waits_behind_another_stream).

Launches at opens run in order on one side stream, each after its own open. An open on
stream B while the newest launch still waits for stream A's open (not begun) would hold
B's launch until the GPU reaches A's open, however far behind A runs: that open is left
without a launch and counted (Harvester.launch_counts().skipped_at_opens). Opens on the
same stream, behind a launch that has begun, or behind the executor's own launch queue as
before. The rule itself is tested in tests/test_launch_at_open.py; GPU:
test_opens_on_a_second_stream_behind_a_lagging_one_are_counted_not_queued there."""

from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

A, B = 1, 2  # two training streams


def _open(ex, stream):
    return _C._testing.queue_open(ex, 1, stream)


def _armed(ex):
    """The task's runner, armed: an open on stream A takes its launch."""
    q = _launches(ex, 0)
    wait_until(lambda: _open(ex, A) == (0, 1))
    return q


def test_an_open_on_another_stream_behind_a_launch_waiting_for_its_open_is_counted_not_queued(ex):
    ex.submit(_C.spin_task(1000, 1, 1000), 0)
    q = _armed(ex)
    assert _open(ex, B) == (0, 0)
    assert ex.skipped_open_launches == 1
    assert q.pending == 1
    # Opens on A go on queuing behind A's.
    assert _open(ex, A) == (0, 1)
    assert _open(ex, B) == (0, 0)
    assert ex.skipped_open_launches == 2 and q.pending == 2


def test_an_open_on_another_stream_queues_once_the_newest_launch_has_begun(ex):
    ex.submit(_C.spin_task(1000, 1, 1000), 0)
    q = _armed(ex)
    assert _open(ex, A) == (0, 1)
    q.begin()  # the older of the two began: the newer still waits for its open on A
    assert _open(ex, B) == (0, 0)
    q.begin()
    assert _open(ex, B) == (0, 1), "the newest launch has begun: B's waits for nothing of A's"
    assert ex.skipped_open_launches == 1
    # Now B's launch is the newest, waiting for B's open: an open on A is the other stream.
    assert _open(ex, A) == (0, 0)
    assert ex.skipped_open_launches == 2
    for _ in range(3):
        q.end(0)


def test_an_open_on_another_stream_behind_the_executors_own_launch_is_queued(ex):
    """The executor's own launch waits for no open: nothing to hold another stream's."""
    ex.submit(_C.spin_task(1000, 1, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1, at_open=False) == 1
    assert _open(ex, B) == (0, 1)
    assert ex.skipped_open_launches == 0
    q.end(0)
    q.end(0)


def test_the_newest_launch_is_looked_for_across_runners(ex):
    """A task drained behind a more urgent one: the more urgent task's open on another
    stream than the drained task's launch still waiting for its open is counted, not
    queued behind it (CudaShared::launch_at_open weighs every runner's launches)."""
    low = ex.submit(_C.spin_task(1000, 1, 1000), 0)
    q_low = _armed(ex)
    high = ex.submit(_C.spin_task(10, 1, 1000), 1)
    q_high = _launches(ex, 1)
    assert _open(ex, B) == (1, 0), "behind the low task's launch waiting for A's open"
    assert ex.skipped_open_launches == 1
    assert _open(ex, A) == (1, 1)
    assert q_high.pending == 1
    q_low.end(0)  # it began stopped: it ran nothing
    q_high.end(10)
    assert ex.wait(high, 10)
    assert ex.status(high)[:2] == ("done", 10)
    assert ex.status(low)[1] == 0
