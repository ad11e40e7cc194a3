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

# A Spin item's length: short against the measuring window.
ITEM_NS = 50_000
WINDOW_S = 1.0


def _cores() -> int:
    return len(os.sched_getaffinity(0))


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


def test_side_threads_join_the_idle_cgroup_and_training_does_not(monkeypatch):
    _skip_unless_autogroup_applies()
    monkeypatch.setenv("FREERIDE_HOST_IDLE", "idle-cgroup")
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


def _auto_in_a_session_leader(refuse_idle_cgroup: bool) -> tuple[str, str]:
    """Auto's choice in a process that leads its session, as torchrun's workers do."""
    code = (
        "import os, sys, freeride as fr; from freeride import _C\n"
        f"_C._testing.refuse_idle_cgroup({refuse_idle_cgroup})\n"
        "assert os.getsid(0) == os.getpid()\n"
        "with fr.Harvester('cpu', workers=1) as h: print(h.host_idle, h.host_idle_reason)"
    )
    env = {**os.environ, "FREERIDE_TEST_HOOKS": "1"}
    env.pop("FREERIDE_HOST_IDLE", None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    mechanism, _, reason = out.stdout.strip().partition(" ")
    return mechanism, reason


def test_auto_guards_a_session_leader_and_leaves_a_shared_session_at_sched_idle(monkeypatch):
    """Under autogroup, a rank that leads its session (torchrun's) is a group of its own:
    its side threads join the idle cgroup, or back off where none can be joined (as for
    unprivileged users). A process that shares its session most likely shares its group
    with the ranks it was started with, against which SCHED_IDLE alone is idle: it keeps
    that, and the side work it gets on a busy machine."""
    _skip_unless_autogroup_applies()
    monkeypatch.delenv("FREERIDE_HOST_IDLE", raising=False)
    if os.getsid(0) != os.getpid():
        with fr.Harvester("cpu", workers=1) as h:
            assert h.host_idle == "sched-idle"
            assert "shares its session" in h.host_idle_reason
    mechanism, reason = _auto_in_a_session_leader(refuse_idle_cgroup=False)
    assert mechanism in ("idle-cgroup", "backoff"), reason
    assert "leads its session" in reason
    mechanism, reason = _auto_in_a_session_leader(refuse_idle_cgroup=True)
    assert mechanism == "backoff", reason
    assert "forced by freeride._C._testing.refuse_idle_cgroup" in reason


@pytest.mark.parametrize("mechanism", ["idle-cgroup", "backoff"])
def test_side_worker_gives_busy_processes_in_other_sessions_their_cores(monkeypatch, mechanism):
    """The condition of issue 30, without a pipeline: with every core busy in other
    sessions, SCHED_IDLE alone still gets the worker a group's share of the cores (the
    control); the idle cgroup or backing off gets it next to nothing."""
    _skip_unless_autogroup_applies()
    chosen, share = side_share_beside_other_sessions(monkeypatch, mechanism)
    if chosen != mechanism:
        pytest.skip(f"{mechanism} cannot be had here: {chosen} instead")
    _, control = side_share_beside_other_sessions(monkeypatch, "sched-idle")
    if control < 0.05:
        # Measured 6% to 50% on a shared 2-core VM, depending on what else ran there.
        pytest.skip(f"too busy a machine to show the condition: sched-idle got {control:.1%}")
    assert share < min(0.05, control / 3), (
        f"{chosen}: the side worker got {share:.1%} of a core beside busy processes in "
        f"other sessions (sched-idle: {control:.0%})"
    )
