"""The host backend's side threads stay idle against every scheduling group, not only their
own (csrc/host_idle.hpp): where autogroup makes each session a group, SCHED_IDLE alone
lets a side worker take a group's share of the cores from busy processes in other
sessions; the idle cgroup, or backing off, keeps it out of their way."""

import os
import subprocess
import sys
import time

import pytest
from autogroup import why_sessions_share_a_group

import freeride as fr
from conftest import wait_until
from freeride import _C

# A Spin item's length: short against the measuring window.
ITEM_NS = 50_000
WINDOW_S = 1.0


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _auto() -> tuple[str, str]:
    with fr.Harvester("cpu", workers=1) as h:
        return h.host_idle, h.host_idle_reason


def _skip_unless_autogroup_applies() -> None:
    reason = why_sessions_share_a_group()
    if reason is not None:
        pytest.skip(reason)


def _thread_cpu_s(tid: int) -> float:
    # Linux's CPU-time clock of one thread of this process (MAKE_THREAD_CPUCLOCK(tid,
    # CPUCLOCK_SCHED)): nanosecond-exact, where /proc's ticks are 10 ms.
    return time.clock_gettime(((~tid) << 3) | 6)


def _new_workers(before: set[int], count: int) -> set[int]:
    """The `count` side workers a harvester just made: they name themselves once started."""
    wait_until(lambda: len(_workers() - before) == count)
    return _workers() - before


def _workers() -> set[int]:
    found = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "freeride-work":
                    found.add(int(tid))
        except OSError:
            pass  # a thread that just ended
    return found


def side_share_beside_other_sessions(monkeypatch, mechanism: str) -> tuple[str, float]:
    """The host harvester's mechanism under FREERIDE_HOST_IDLE=`mechanism`, and the share
    of a core its one side worker got over WINDOW_S while every core ran a busy process
    in a session of its own (as other ranks' training runs under torchrun)."""
    monkeypatch.setenv("FREERIDE_HOST_IDLE", mechanism)
    before = _workers()
    with fr.Harvester("cpu", workers=1) as h:
        (tid,) = _new_workers(before, 1)
        spinners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(_cores())
        ]
        try:
            time.sleep(0.3)  # they are running
            handle = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=ITEM_NS))
            time.sleep(0.1)
            start, t0 = _thread_cpu_s(tid), time.monotonic()
            time.sleep(WINDOW_S)
            share = (_thread_cpu_s(tid) - start) / (time.monotonic() - t0)
            handle.cancel()
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        return h.host_idle, share


def test_forced_mechanisms_and_their_reasons(monkeypatch):
    for mechanism in ("sched-idle", "backoff"):
        monkeypatch.setenv("FREERIDE_HOST_IDLE", mechanism)
        with fr.Harvester("cpu", workers=1) as h:
            assert h.host_idle == mechanism
            assert h.host_idle_reason.startswith(f"FREERIDE_HOST_IDLE={mechanism}")
            assert h.report().settings["host_idle"] == mechanism
    monkeypatch.setenv("FREERIDE_HOST_IDLE", "nice")
    with pytest.raises(ValueError, match="FREERIDE_HOST_IDLE must be auto, sched-idle"):
        fr.Harvester("cpu", workers=1)


def test_side_threads_join_the_idle_cgroup_and_training_does_not():
    _skip_unless_autogroup_applies()
    before = _workers()
    with fr.Harvester("cpu", workers=2) as h:
        if h.host_idle != "idle-cgroup":
            pytest.skip(f"no idle cgroup here: {h.host_idle_reason}")
        workers = _new_workers(before, 2)

        def joined(tid: int) -> bool:
            with open(f"/proc/self/task/{tid}/cgroup") as f:
                return "/freeride-idle\n" in f.read()

        # Each worker names itself, then joins, before it waits for its first launch.
        wait_until(lambda: all(joined(tid) for tid in workers))
        for tid in workers:
            assert os.sched_getscheduler(tid) == os.SCHED_IDLE
        with open("/proc/self/cgroup") as f:  # the main thread: training's
            assert "freeride-idle" not in f.read()


def test_without_an_idle_cgroup_a_session_leader_backs_off_and_others_keep_sched_idle():
    """Auto's fallback where the cgroup hierarchy is not writable (as for unprivileged
    users): backing off costs side work on a busy machine, so only a process that leads
    its session (torchrun's workers) takes it; one that shares its session most likely
    shares its group with its fellow ranks."""
    _skip_unless_autogroup_applies()
    if os.getsid(0) == os.getpid():
        pytest.skip("this test process leads its session")
    _C._testing.refuse_idle_cgroup(True)
    try:
        with fr.Harvester("cpu", workers=1) as h:
            assert h.host_idle == "sched-idle"
            assert "shares its session" in h.host_idle_reason
    finally:
        _C._testing.refuse_idle_cgroup(False)
    code = (
        "import os, freeride as fr; from freeride import _C;"
        "_C._testing.refuse_idle_cgroup(True);"
        "h = fr.Harvester('cpu', workers=1); print(h.host_idle, os.getsid(0) == os.getpid());"
        "h.close()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FREERIDE_TEST_HOOKS": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["backoff", "True"]


@pytest.mark.parametrize("mechanism", ["auto", "backoff"])
def test_side_worker_gives_busy_processes_in_other_sessions_their_cores(monkeypatch, mechanism):
    """The condition of issue 30, without a pipeline: with every core busy in other
    sessions, SCHED_IDLE alone still gets the worker a group's share (the control, about
    1 / (cores + 1) of the cores); the idle cgroup or backing off gets it next to
    nothing."""
    _skip_unless_autogroup_applies()
    chosen, share = side_share_beside_other_sessions(monkeypatch, mechanism)
    if chosen == "sched-idle":
        pytest.skip(f"auto kept sched-idle here: {_auto()[1]}")
    _, control = side_share_beside_other_sessions(monkeypatch, "sched-idle")
    assert control > 0.15, f"sched-idle's control got {control:.0%} of a core: no condition"
    assert share < 0.05, (
        f"{chosen}: the side worker got {share:.1%} of a core beside busy processes in "
        f"other sessions (sched-idle: {control:.0%})"
    )
