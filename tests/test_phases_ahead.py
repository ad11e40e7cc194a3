"""Phases ahead (issue 36, review G3): a phase boundary does not drain the launches queued
ahead of the GPU, and an open chains a guarded launch of the next phase.

Without it, a phase's launches at opens still queued when the phase completes must all end
before the next phase begins, and the opens made meanwhile carry none. With it
(csrc/phase_ahead_rule.hpp; FREERIDE_PHASES_AHEAD=1 on CUDA) the executor begins the next
phase as soon as an ended launch says the current one is complete, and each open carries a
launch of the current phase and one of the next, which runs only if the current phase is
complete when it begins. The test queue backend (freeride_ext/queue_backend.hpp) models the
device: a launch runs at most what its phase has left, a guarded one nothing unless the
phase before is complete. What is tested here is the executor's side and the rule both
backends take; the device side (freeride/preempt.cuh's phase_ready and the CUDA runner's
two sets of counters) has not run on a GPU yet.
"""

import random
import time

import pytest
from gpu_worker import run_worker

from conftest import queue_status as _status
from conftest import runner_launches as _launches
from conftest import wait_until
from freeride import _C

FINAL = ("done", "failed", "cancelled")


# The queue executor of conftest.py's `ex` fixture.
QUEUE_SETTINGS = {"phases_ahead": True}


def test_rule_an_open_carries_the_current_phase_and_chains_the_next():
    rule = _C._testing.launches_at_open
    # enabled, phase, num_phases, phase_done, next_items, room
    assert rule(True, 0, 3, False, 5, 32) == (True, True)
    assert rule(True, 0, 3, True, 5, 32) == (False, True), "a complete phase: only the next"
    assert rule(True, 2, 3, False, 0, 32) == (True, False), "no phase after the last"
    assert rule(True, 2, 3, False, 5, 32) == (True, False), "the last: whatever next_items"
    assert rule(True, 0, 3, False, 0, 32) == (True, False), "an empty next phase is not chained"
    assert rule(True, 0, 3, False, 5, 1) == (True, False), "room for one launch only"
    assert rule(True, 0, 3, True, 5, 0) == (False, False), "a full ring takes none"
    # Off: one launch of the current phase, none once it is complete (the drain).
    assert rule(False, 0, 3, False, 5, 32) == (True, False)
    assert rule(False, 0, 3, True, 5, 32) == (False, False)
    assert [_C._testing.phase_slot(p) for p in range(5)] == [0, 1, 0, 1, 0]


def test_the_next_phase_begins_with_stale_launches_still_in_flight(ex):
    """Phase 0 completes in the first of three opens' launches: phase 1 begins at once,
    while the rest are still queued, and the chained launch behind it runs phase 1 in the
    same bubble. The stale launches run nothing; every item counts exactly once."""
    task = ex.submit(_C.spin_task(10, 3, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(3) == 6
    assert q.pending_phases == [(0, False), (1, True)] * 3
    q.end(10)  # phase 0 complete
    wait_until(lambda: q.phase == 1)
    assert q.pending == 5, "phase 1 began only once the launches in flight had ended"
    q.end(10)  # the chained launch runs phase 1 whole
    wait_until(lambda: q.phase == 2)
    assert _status(ex, task)[1:] == (20, 2)
    # An open now carries phase 2 (the last: nothing chained), behind the stale launches.
    assert q.arrive(1) == 1
    assert q.pending_phases[-1] == (2, False)
    for _ in range(4):
        q.end(10)  # stale: phases 0 and 1 are complete
    assert _status(ex, task)[0] not in FINAL
    q.end(10)
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("done", 30, 2)
    assert q.ran == 30
    assert ex.idle_open_launches == 4


def test_opens_made_after_a_phase_completes_carry_the_next_phase(ex):
    """The loss the drain caused: opens made while the stale launches are still queued
    carried no launch. Here they carry the new current phase and chain the one after."""
    task = ex.submit(_C.spin_task(8, 3, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 4
    q.end(8)
    wait_until(lambda: q.phase == 1)
    assert q.arrive(1) == 2
    assert q.pending_phases == [(1, True), (0, False), (1, True), (1, False), (2, True)]
    q.end(3)  # the first chained launch: phase 0 is complete, it runs 3 of phase 1
    q.end(5)  # stale phase 0: nothing
    q.end(5)  # phase 1's rest
    wait_until(lambda: q.phase == 2)
    q.end(5)  # phase 1 complete: nothing left
    q.end(8)  # guarded on phase 1, which is complete: phase 2
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("done", 24, 2)
    assert q.ran == 24


def test_a_guarded_launch_runs_nothing_until_the_phase_before_is_complete(ex):
    """A bubble that closes before the current phase completes: the launch chained behind
    it must not claim the next phase's items (their inputs are not ready). The task then
    waits for a later bubble, where the same pair completes both phases."""
    task = ex.submit(_C.spin_task(10, 2, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 2
    q.end(4)
    q.end(10)  # guarded: phase 0 has 4 of 10
    wait_until(lambda: q.pending == 0 and _status(ex, task)[0] == "paused")
    assert _status(ex, task) == ("paused", 4, 0)
    assert q.ran == 4
    wait_until(lambda: q.arrive(1) == 2)
    q.end(6)
    q.end(10)
    assert ex.wait(task, 10)
    assert _status(ex, task) == ("done", 20, 1)


def test_cancel_with_launches_of_two_phases_in_flight(ex):
    """A cancel stops both phases' launches; the task is final once they have ended, with
    the items they ran counted exactly (the next phase's once it had begun)."""
    task = ex.submit(_C.spin_task(10, 3, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(2) == 4
    q.end(10)
    wait_until(lambda: q.phase == 1)
    q.begin()  # the chained launch: phase 1 is running
    assert ex.cancel(task, False)
    wait_until(lambda: q.stopped)
    assert q.arrive(1) == 0
    q.end(3)
    assert ex.wait(task, 10)  # the two left have not begun: they will run nothing
    assert _status(ex, task)[:2] == ("cancelled", 13)
    q.end(4)
    q.end(4)
    wait_until(lambda: task in ex.take_finished())
    assert q.ran == 13


@pytest.mark.parametrize("seed", range(12))
def test_random_opens_and_ends_count_every_item_once(ex, seed):
    """Opens and ends in a random order, with random amounts: whatever the interleaving,
    the executor begins phases in order, never loses or repeats an item (the model's
    device ran exactly the task's items) and the task ends done."""
    rng = random.Random(seed)
    phases = rng.randint(2, 6)
    items = rng.randint(1, 12)
    task = ex.submit(_C.spin_task(items, phases, 1000), 0)
    q = _launches(ex, 0)
    total = items * phases
    deadline = time.monotonic() + 30
    while _status(ex, task)[0] not in FINAL:
        assert time.monotonic() < deadline, "the task made no progress"
        if q.not_ended and rng.random() < 0.6:
            q.end(rng.randint(0, items))
        elif q.arrive(rng.randint(1, 3)) == 0:
            time.sleep(0.001)  # the executor has yet to take an end or begin a phase
        _state, done, phase = _status(ex, task)
        assert done <= total and 0 <= phase < phases
    assert ex.wait(task, 10)
    assert _status(ex, task)[:2] == ("done", total)
    assert q.ran == total


def test_off_by_default_the_next_phase_waits_for_the_drain():
    """Without phases ahead the queue backend keeps the drain (the CUDA default until a
    GPU run qualifies phases ahead): no launch is chained, and the phase does not begin
    while launches are in flight."""
    executor = _C._testing.queue_executor()
    try:
        task = executor.submit(_C.spin_task(4, 2, 1000), 0)
        q = _launches(executor, 0)
        assert q.arrive(2) == 2
        assert q.pending_phases == [(0, False), (0, False)]
        q.end(4)
        wait_until(lambda: _status(executor, task)[1] == 4)
        assert q.phase == 0 and q.arrive(1) == 0
        q.end(0)
        wait_until(lambda: q.phase == 1)
    finally:
        executor.close(0.5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "env",
    [
        # Device phases are on by default and would serve this task's every phase.
        {"FREERIDE_PHASES_AHEAD": "1", "FREERIDE_DEVICE_PHASES": "0"},
        {"FREERIDE_PHASES_AHEAD": "0", "FREERIDE_DEVICE_PHASES": "0"},
        {},
    ],
    ids=["ahead", "drain", "device"],
)
def test_many_phases_in_bubbles_queued_ahead_keep_the_item_protocol(env):
    """On a GPU (tests/gpu_worker.py's queued_phases): an ItemCounter of 30 phases of about
    4 ms each in five 20 ms bubbles queued ahead of the GPU. No item may start before the
    phase before completed (the guard of a chained launch; with device phases
    (tests/test_device_phases.py), the kernel's wait at a boundary and its fences), every
    item runs exactly once in the end, and the items and phases done in the bubbles are
    printed for each mode (phases ahead should do about twice the phases per bubble: a
    chain of one; device phases as many as fit in a bubble)."""
    r = run_worker("queued_phases", {}, env=env, timeout=300)
    print(
        f"{env}: {r['items_in_bubbles']} items, {r['phases_in_bubbles']} "
        f"phases in the bubbles; launches {r['launches']} ({r['at_opens']} at opens, "
        f"{r['idle_at_opens']} idle); queued ahead {r['queued_ahead']}"
    )
    assert r["launches_at_opens"]
    # The harvester took the case's device phases (not an inherited switch's).
    assert r["device_phases"] is (env.get("FREERIDE_DEVICE_PHASES", "1") != "0"), r
    assert r["violations_in_bubbles"] == 0 and r["max_count_in_bubbles"] <= 1
    assert r["finished"] and r["state"] == "done", r
    assert r["violations"] == 0 and r["counts_all_one"], r


def test_a_cancel_keeps_the_next_phases_items_a_chained_launch_ran(ex):
    """Review finding F6: a chained launch that began before the stop (its phase before
    had completed on the GPU, the host had not yet taken that end) runs items of the next
    phase; the cancel keeps the executor from beginning that phase, so those items were
    left out of items_done. The runner reports them (PhaseRunner::done_ahead)."""
    task = ex.submit(_C.spin_task(10, 2, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 2
    q.begin()
    q.begin()  # the chained launch began too, before the stop
    assert ex.cancel(task, False)
    wait_until(lambda: q.stopped)
    q.end(10)
    q.end(4)
    assert ex.wait(task, 10)
    assert _status(ex, task)[:2] == ("cancelled", 14)
    assert q.ran == 14


def test_a_cancelled_task_begins_no_further_phase_while_its_launches_drain(ex):
    """Phases ahead begin a phase with launches in flight, but not a cancelled task's: the
    launch running at the cancel completes phase 0, yet phase 1 does not begin (the
    cancelled task stays cancelled, nothing of it set up again under its stopped
    launches); it is final once they have ended, with the items they ran."""
    task = ex.submit(_C.spin_task(10, 3, 1000), 0)
    q = _launches(ex, 0)
    assert q.arrive(1) == 2  # phase 0's launch, phase 1's chained behind it
    q.begin()
    assert ex.cancel(task, False)
    wait_until(lambda: q.stopped)
    q.end(10)  # phase 0 complete
    q.end(4)  # the chained launch began stopped: nothing
    assert ex.wait(task, 10)
    assert _status(ex, task)[:2] == ("cancelled", 10)
    assert q.phase == 0, "a phase began after the cancel"
    assert q.ran == 10
