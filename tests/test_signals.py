"""Ctrl-C and SIGTERM: a training loop with a harvester, interrupted, ends fast, with every
freeride thread joined and no side item lost or run twice (tests/signal_worker.py is the
interrupted process); and the SIGTERM handler's registry in-process."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import freeride as fr
from freeride import _shutdown

WORKER = Path(__file__).with_name("signal_worker.py")
# From the signal to the end of freeride's shutdown in the child (the bound).
SHUTDOWN_BOUND_S = 0.5
# From the signal to the child's exit: never hang the suite (torch's own exit is slow).
EXIT_BOUND_S = 10.0

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="thread names come from /proc (Linux)"
)


def _spawn(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path, dict]:
    """Starts the worker and waits for its "ready" line: the freeride threads it had."""
    out = tmp_path / f"{mode}.json"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(out), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120.0  # torch's import is slow on a loaded 2-core box
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
        line = proc.stdout.readline() if ready else ""
        if line.startswith("ready "):
            return proc, out, json.loads(line[len("ready ") :])
        if not line and (proc.poll() is not None or time.monotonic() > deadline):
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"worker never got ready (rc {proc.returncode}):\n{err}")


def _interrupt(proc: subprocess.Popen, sig: int) -> tuple[float, float, str]:
    """Sends `sig`; (when it was sent, seconds until the process was gone, its stderr)."""
    time.sleep(0.2)  # side work runs meanwhile
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"worker still running {EXIT_BOUND_S} s after signal {sig}:\n{err}")
    return sent, time.monotonic() - sent, err


def _check_shutdown(out: Path, sent: float, err: str) -> dict:
    assert out.exists(), f"the worker wrote no report:\n{err}"
    report = json.loads(out.read_text())
    # Every freeride thread joined: the executor, its workers, the iterative runner,
    # the SIGTERM watchdog and the shutdown helper (C++ threads by their OS names).
    assert report["threads"] == {"python": [], "os": []}, report["threads"]
    took = report["done_at"] - sent
    assert 0 < took < SHUTDOWN_BOUND_S, f"freeride's shutdown ended {took:.3f} s after the signal"
    return report


def _check_items(report: dict) -> None:
    """The ItemCounter was running when the signal came: cancelled, with every item that
    ran counted once (none twice), and exactly the items_done the executor reported
    (the items in flight finished, and none started after)."""
    assert report["state"] == "cancelled"
    assert report["max_count"] <= 1
    assert report["items_done"] > 0
    assert report["counted"] == report["items_done"]


def _check_had_threads(seen: dict) -> None:
    """The assertions on threads after the signal mean something: they ran before it."""
    assert "freeride-exec" in seen["os"]
    assert "freeride-work" in seen["os"]
    assert "freeride-term" in seen["os"]  # the SIGTERM watchdog, while a harvester is open


@linux_only
def test_sigint_in_training_loop(tmp_path):
    pytest.importorskip("torch")
    proc, out, seen = _spawn(tmp_path, "loop")
    _check_had_threads(seen)
    assert seen["python"] == ["freeride-iterative"]
    sent, _, err = _interrupt(proc, signal.SIGINT)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    _check_items(_check_shutdown(out, sent, err))


@linux_only
def test_sigterm_in_training_loop(tmp_path):
    pytest.importorskip("torch")
    proc, out, seen = _spawn(tmp_path, "loop")
    _check_had_threads(seen)
    sent, exited, err = _interrupt(proc, signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM, err  # still dies by SIGTERM
    _check_items(_check_shutdown(out, sent, err))
    # No atexit, no interpreter teardown: the process is gone right after freeride's part.
    assert exited < SHUTDOWN_BOUND_S + 1.0


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_in_training_loop_with_a_job_queue(tmp_path, sig):
    """The same loop inside `with fr.JobQueue(h)`: the queue leaves (abort) instead of
    waiting for other ranks, and its threads are joined with the harvester's."""
    pytest.importorskip("torch")
    proc, out, seen = _spawn(tmp_path, "queue")
    _check_had_threads(seen)
    assert {"freeride-jobqueue", "freeride-jobqueue-beat", "freeride-jobqueue-coord"} <= set(
        seen["python"]
    )
    sent, _, err = _interrupt(proc, sig)
    if sig == signal.SIGINT:
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
    else:
        assert proc.returncode == -signal.SIGTERM, err
    _check_items(_check_shutdown(out, sent, err))


@linux_only
def test_sigint_in_handle_wait(tmp_path):
    """A training loop waiting for a side task (handle.wait(), never ending) still
    gets Ctrl-C: the wait runs Python's signal handlers every few ms."""
    proc, out, _ = _spawn(tmp_path, "wait")
    sent, _, err = _interrupt(proc, signal.SIGINT)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    _check_shutdown(out, sent, err)


@linux_only
def test_sigterm_with_main_thread_stuck_in_native_code(tmp_path):
    """A main thread blocked in native code never runs Python's SIGTERM handler; the
    watchdog ends the process as SIGTERM's default action would, after the grace."""
    pytest.importorskip("torch")
    proc, out, _ = _spawn(tmp_path, "stuck")
    _, exited, err = _interrupt(proc, signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM, err
    assert exited < _shutdown.SIGTERM_GRACE_S + 1.5
    assert not out.exists()  # no cleanup was possible


# The Ctrl-C tests above, as the suite runs them when it is started the way CI runners,
# batch systems and scripts start commands: in the background of a shell without job
# control (which ignores SIGINT and SIGQUIT in its background children), under nohup
# (SIGHUP ignored), in a session of its own (no controlling terminal), with no input.
_BACKGROUND_JOB = ["sh", "-c", 'nohup "$@" </dev/null & wait $!', "sh"]
_CTRL_C_TESTS = [
    "test_sigint_in_training_loop",
    f"test_signal_in_training_loop_with_a_job_queue[{int(signal.SIGINT)}]",
    "test_sigint_in_handle_wait",
]


def _run_as_background_job(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_BACKGROUND_JOB, *args],
        check=False,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        timeout=timeout,
    )


@linux_only
@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup here")
def test_ctrl_c_tests_pass_started_as_a_background_job():
    """The Ctrl-C tests set up the disposition they test: they pass where the suite
    itself was started with SIGINT ignored and no terminal."""
    pytest.importorskip("torch")
    probe = (
        "import json, os, signal\n"
        "try:\n"
        "    os.close(os.open('/dev/tty', os.O_RDWR))\n"
        "    tty = True\n"
        "except OSError:\n"
        "    tty = False\n"
        "print(json.dumps([signal.getsignal(signal.SIGINT) == signal.SIG_IGN,\n"
        "                  signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, tty]))\n"
    )
    seen = _run_as_background_job([sys.executable, "-c", probe], timeout=60.0)
    assert seen.returncode == 0, seen.stdout
    # What the run below starts with: SIGINT and SIGHUP ignored, no terminal.
    assert json.loads(seen.stdout.strip().splitlines()[-1]) == [True, True, False]
    here = Path(__file__)
    ids = [f"{here}::{name}" for name in _CTRL_C_TESTS]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids]
    run = _run_as_background_job(args, timeout=600.0)
    tail = "\n".join(run.stdout.splitlines()[-30:])
    assert run.returncode == 0, tail
    assert f"{len(ids)} passed" in tail, tail


# -- the registry, in this process ----------------------------------------------------------


def _on_main_thread():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")


def test_handler_installed_only_while_a_harvester_is_open():
    _on_main_thread()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with fr.Harvester("cpu", workers=1) as h:
        assert signal.getsignal(signal.SIGTERM) is _shutdown._on_sigterm
        assert h in _shutdown.registered()
        with fr.Harvester("cpu", workers=1) as h2:
            assert _shutdown.registered()[-2:] == [h, h2]
        assert signal.getsignal(signal.SIGTERM) is _shutdown._on_sigterm
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert h not in _shutdown.registered()
    assert not fr._C._sigterm_guard_armed()


def test_users_sigterm_handler_is_never_replaced():
    _on_main_thread()

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with fr.Harvester("cpu", workers=1) as h:
            assert signal.getsignal(signal.SIGTERM) is mine
            assert h in _shutdown.registered()  # close_all() still closes it
            assert not fr._C._sigterm_guard_armed()
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_harvester_dropped_without_close_leaves_the_registry():
    import gc

    h = fr.Harvester("cpu", workers=1)
    assert h in _shutdown.registered()
    del h
    gc.collect()
    assert not any(isinstance(o, fr.Harvester) for o in _shutdown.registered())


def test_close_all_closes_newest_first_and_skips_errors():
    order = []

    class Thing:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail
            _shutdown.register(self, self.abort)

        def abort(self):
            order.append(self.name)
            _shutdown.unregister(self)
            if self.fail:
                raise RuntimeError("boom")

    things = [Thing("a"), Thing("b", fail=True), Thing("c")]
    with fr.Harvester("cpu", workers=1) as h:
        assert _shutdown.close_all(timeout=5.0)
        assert h.closed
    assert order == ["c", "b", "a"]
    assert _shutdown.registered() == []
    del things


def test_keyboard_interrupt_leaves_the_with_block_fast():
    """KeyboardInterrupt with a task running and an iterative step in flight: the block
    is left without waiting out the step (close() would give it CLOSE_TIMEOUT_S)."""
    started, release = threading.Event(), threading.Event()

    class Slow(fr.IterativeTask):
        def step(self):
            started.set()
            release.wait(10.0)

        def finished(self):
            return False

    with pytest.raises(KeyboardInterrupt), fr.Harvester("cpu", workers=1) as h:
        h.submit(fr.tasks.Spin(items=10**9, ns_per_item=20_000))
        step = h.submit(Slow())
        runner = h._iterative._thread
        assert started.wait(10.0)
        t0 = time.monotonic()
        raise KeyboardInterrupt
    took = time.monotonic() - t0
    release.set()  # the abandoned step returns, and its thread ends
    runner.join(10.0)
    assert took < 0.5
    assert h.closed
    assert step.state == "failed"  # abandoned mid-step, marked so
    assert not runner.is_alive()
