"""The open watcher (csrc/cuda/open_watcher.cpp) without a GPU: its queue, its thread and
what the process's exit does, driven through _C._testing.FakeWatcher, whose fake events'
waits end only when the test releases them. The CUDA events themselves (blocking-sync,
waited for with the driver's cuEventSynchronize) are tested on a GPU by
tests/test_gpu.py::test_process_exits_while_an_open_is_still_ahead_of_the_gpu."""

import subprocess
import sys
import textwrap
import time

import pytest

from conftest import wait_until
from freeride import _C

FakeWatcher = _C._testing.FakeWatcher

# Run in a child, which exits while its watcher thread is inside a wait that never ends:
# the fake events' counters are per process, and the exit is what is measured.
_EXIT_IN_A_WAIT = textwrap.dedent(
    """
    import sys, time
    from freeride import _C
    FakeWatcher = _C._testing.FakeWatcher
    w = FakeWatcher(hook=sys.argv[2] == "hooked")
    # The fakes work: a wait begins, and its end rings.
    assert w.ring_after() and FakeWatcher.waits_begun(1, 10.0)
    assert w.rings() == 0
    FakeWatcher.release(1)
    deadline = time.monotonic() + 10
    while w.rings() < 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert w.rings() == 1, "a released wait did not ring"
    # A wait that never ends, as for an open the GPU has not reached (or never will).
    assert w.ring_after() and FakeWatcher.waits_begun(2, 10.0)
    if sys.argv[1] == "retired":
        w.retire()  # as the harvester's close does before the interpreter exits
    if sys.argv[1] == "released":  # the control: no thread is inside a wait at exit
        FakeWatcher.release(2)
        while w.rings() < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert w.rings() == 2
    print("exiting", flush=True)
    sys.exit(0)
    """
)


def _waits_so_far() -> int:
    """The waits this process's fakes have begun (and all released): the counters are
    this process's, so each test counts from where earlier fakes left them."""
    begun = 0
    while FakeWatcher.waits_begun(begun + 1, 0.0):
        begun += 1
    FakeWatcher.release(begun)
    return begun


def test_a_released_wait_rings_and_the_queue_keeps_order():
    w = FakeWatcher()
    begun = _waits_so_far()
    assert all(w.ring_after() for _ in range(3))
    assert FakeWatcher.waits_begun(begun + 1, 10.0)
    time.sleep(0.05)
    # One wait at a time, in order: the second has not begun while the first is held.
    assert not FakeWatcher.waits_begun(begun + 2, 0.0)
    assert w.rings() == 0
    FakeWatcher.release(begun + 1)
    wait_until(lambda: w.rings() == 1)
    assert FakeWatcher.waits_begun(begun + 2, 10.0)
    FakeWatcher.release(begun + 3)
    wait_until(lambda: w.rings() == 3)
    w.retire()


def test_work_after_an_open_is_handed_its_event_before_the_thread_can_wait_for_it():
    """Review G9's one event per open: the launch at an open waits for the watcher's
    event instead of recording its own, so it must be handed that event before the
    watcher's thread can wait for it (and, once waited for, record it again for another
    open): until the hand-over returns, no wait on it begins, whatever is released."""
    w = FakeWatcher()
    begun = _waits_so_far()
    handed = []

    def then(event):
        FakeWatcher.release(begun + 1)  # its wait could end at once, were it queued
        handed.append((event, FakeWatcher.waits_begun(begun + 1, 0.1), w.rings()))

    assert w.ring_after(5, then=then)
    assert len(handed) == 1
    event, waited, rings = handed[0]
    assert event != 0 and not waited and rings == 0
    wait_until(lambda: w.rings() == 1)
    # Where no hand-over is asked for, nothing changes.
    assert w.ring_after(6)
    wait_until(lambda: FakeWatcher.waits_begun(begun + 2, 0.0))
    FakeWatcher.release(begun + 2)
    wait_until(lambda: w.rings() == 2)
    w.retire()


def test_the_hook_gets_each_events_open_before_its_ring_in_order():
    """FREERIDE_WATCHER_LAUNCH's plumbing: the watcher's thread calls its hook with the
    number of the open each event was recorded for, once that event's wait has ended and
    before its bell rings (so the CUDA backend's launch is enqueued before the executor is
    woken), one event at a time, in recording order; numbers are 32 bits."""
    w = FakeWatcher(hook=True)
    begun = _waits_so_far()
    seqs = [10, 11, 2**32 - 1]
    assert all(w.ring_after(seq) for seq in seqs)
    assert FakeWatcher.waits_begun(begun + 1, 10.0)
    time.sleep(0.05)
    assert w.reached() == [] and w.rings() == 0  # nothing before the GPU reaches the open
    FakeWatcher.release(begun + 1)
    wait_until(lambda: w.rings() == 1)
    assert w.reached() == [(10, 0)]
    FakeWatcher.release(begun + 3)
    wait_until(lambda: w.rings() == 3)
    assert w.reached() == [(10, 0), (11, 1), (2**32 - 1, 2)]
    w.retire()


def test_each_reached_open_is_stamped_with_its_number_before_its_ring():
    """The split of a host-started admission (csrc/admission_stamps.hpp, read by
    probes/probe_admission.py): as each wait returns the watcher stamps the open's number
    and the time on Python's monotonic clock, before it rings; the stamp is the latest
    open reached, never one still ahead."""
    w = FakeWatcher()
    begun = _waits_so_far()
    assert w.reached_stamp() is None
    assert w.ring_after(40) and w.ring_after(41)
    assert FakeWatcher.waits_begun(begun + 1, 10.0)
    time.sleep(0.02)
    assert w.reached_stamp() is None  # the GPU has reached neither open
    released = time.monotonic_ns()
    FakeWatcher.release(begun + 1)
    wait_until(lambda: w.rings() == 1)
    rung_seen = time.monotonic_ns()
    seq, at = w.reached_stamp()
    assert seq == 40 and released <= at <= rung_seen
    FakeWatcher.release(begun + 2)
    wait_until(lambda: w.rings() == 2)
    seq, later = w.reached_stamp()
    assert seq == 41 and later >= at
    w.retire()


def test_a_hook_that_throws_costs_neither_the_ring_nor_the_next_events():
    w = FakeWatcher(hook=True, throw_at=21)
    begun = _waits_so_far()
    assert all(w.ring_after(seq) for seq in (20, 21, 22))
    FakeWatcher.release(begun + 3)
    wait_until(lambda: w.rings() == 3)
    assert [seq for seq, _ in w.reached()] == [20, 21, 22]
    w.retire()


def test_no_hook_call_once_the_watcher_is_retired():
    """A backend's shutdown retires its watcher while the thread still waits for opens the
    GPU has not reached: they still ring (the thread drains its queue), but the hook, which
    would launch side work into a backend shutting down, is not called for them."""
    w = FakeWatcher(hook=True)
    begun = _waits_so_far()
    assert w.ring_after(30) and w.ring_after(31)
    assert FakeWatcher.waits_begun(begun + 1, 10.0)
    w.retire()
    FakeWatcher.release(begun + 2)
    wait_until(lambda: w.rings() == 2)
    assert w.reached() == []


def _time_exit(how: str, hook: str = "plain") -> float:
    """Seconds from the child's 'exiting' to its end; fails the test if it failed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXIT_IN_A_WAIT, how, hook],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        said = time.monotonic()
        assert line.strip() == "exiting", line + proc.stderr.read()
        proc.wait(timeout=30)
        waited = time.monotonic() - said
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "terminate called" not in err
    return waited


@pytest.mark.parametrize("hook", ["plain", "hooked"])
@pytest.mark.parametrize("how", ["open", "retired"])
def test_exit_does_not_wait_for_a_watcher_inside_a_wait(how, hook):
    """The exit handler flags the watchers and returns: the process ends at once while its
    watcher thread waits for an event that never completes (it used to wait 2 s for the
    thread, and on a GPU for the GPU). The child first checks that a released wait rings,
    so the thread it leaves behind is really inside the wait. Control: the same child with
    that wait released before it exits, timed alike (the old handler exited as fast there
    and 2 s slower with the wait). Likewise with a hook (FREERIDE_WATCHER_LAUNCH's), for
    which the exit handler waits only while a call is under way."""
    waited = _time_exit(how, hook)
    control = _time_exit("released", hook)
    print(f"exit {waited:.3f} s after 'exiting' inside a wait; {control:.3f} s after none")
    assert waited < control + 1.0, (
        f"the process took {waited:.3f} s to exit with its watcher inside a wait, {control:.3f}"
        " s without: it waited for the watcher"
    )
