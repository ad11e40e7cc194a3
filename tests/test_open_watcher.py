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
    w = FakeWatcher()
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


def test_a_released_wait_rings_and_the_queue_keeps_order():
    w = FakeWatcher()
    begun = 0
    # The counters are this process's: count from where earlier fakes left them.
    while FakeWatcher.waits_begun(begun + 1, 0.0):
        begun += 1
    FakeWatcher.release(begun)
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


def _time_exit(how: str) -> float:
    """Seconds from the child's 'exiting' to its end; fails the test if it failed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXIT_IN_A_WAIT, how],
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


@pytest.mark.parametrize("how", ["open", "retired"])
def test_exit_does_not_wait_for_a_watcher_inside_a_wait(how):
    """The exit handler flags the watchers and returns: the process ends at once while its
    watcher thread waits for an event that never completes (it used to wait 2 s for the
    thread, and on a GPU for the GPU). The child first checks that a released wait rings,
    so the thread it leaves behind is really inside the wait. Control: the same child with
    that wait released before it exits, timed alike (the old handler exited as fast there
    and 2 s slower with the wait)."""
    waited = _time_exit(how)
    control = _time_exit("released")
    print(f"exit {waited:.3f} s after 'exiting' inside a wait; {control:.3f} s after none")
    assert waited < control + 1.0, (
        f"the process took {waited:.3f} s to exit with its watcher inside a wait, {control:.3f}"
        " s without: it waited for the watcher"
    )
