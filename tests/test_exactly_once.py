"""Exactly once: under any storm of gate flips, submits, cancels and priorities, every item
of every phase runs once (or, for a cancelled task, at most once) and phases never overlap."""

import threading
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import freeride as fr

submit = st.tuples(
    st.just("submit"),
    st.integers(1, 300),  # items
    st.integers(1, 4),  # phases
    st.sampled_from([0, 0, 2_000, 20_000]),  # ns per item
    st.integers(-2, 2),  # priority
)
flip = st.tuples(st.sampled_from(["open", "close"]))
cancel = st.tuples(st.just("cancel"), st.integers(0, 50))
pause = st.tuples(st.just("sleep"), st.integers(0, 3))
storm = st.lists(st.one_of(submit, submit, flip, flip, cancel, pause), min_size=1, max_size=40)


def check_counts(handle):
    snap = handle.task.snapshot()
    counts = snap.counts
    assert snap.violations == 0, f"{snap.violations} items started before their phase could"
    assert counts.max(initial=0) <= 1, "an item ran twice"
    assert int(counts.sum()) == handle.items_done
    if handle.state == "done":
        assert (counts == 1).all(), "a finished task lost items"
        assert handle.items_done == handle.items_total
    else:
        assert handle.state in ("cancelled", "failed")
        # Phases run in order: any work in phase k means phase k-1 completed.
        started = [bool(row.any()) for row in counts]
        for k in range(1, len(counts)):
            if started[k]:
                assert (counts[k - 1] == 1).all()


def run_storm(h, ops):
    handles = []
    for op in ops:
        if op[0] == "submit":
            _, items, phases, ns, prio = op
            handles.append(h.submit(fr.tasks.ItemCounter(items, phases, ns), priority=prio))
        elif op[0] == "open":
            h.gate.open(stream="host")
        elif op[0] == "close":
            h.gate.close(stream="host")
        elif op[0] == "cancel" and handles:
            handles[op[1] % len(handles)].cancel()
        elif op[0] == "sleep":
            time.sleep(op[1] / 1000)
    h.gate.open(stream="host")
    assert h.wait_all(timeout=120)
    for handle in handles:
        check_counts(handle)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=storm, workers=st.integers(1, 4))
def test_exactly_once_under_random_storms(ops, workers):
    with fr.Harvester("cpu", workers=workers) as h:
        run_storm(h, ops)


def test_exactly_once_under_a_flipping_thread():
    """A thread flips the gate as fast as it can while multi-phase tasks run."""
    with fr.Harvester("cpu", workers=4) as h:
        stop = threading.Event()

        def flipper():
            rng = np.random.default_rng(7)
            while not stop.is_set():
                h.gate.close(stream="host")
                time.sleep(rng.uniform(0, 200e-6))
                h.gate.open(stream="host")
                time.sleep(rng.uniform(0, 300e-6))

        thread = threading.Thread(target=flipper)
        thread.start()
        try:
            handles = [
                h.submit(fr.tasks.ItemCounter(500, phases=4, ns_per_item=5_000), priority=p)
                for p in (0, 1, 0, 2)
            ]
            for handle in handles:
                assert handle.wait(timeout=120)
        finally:
            stop.set()
            thread.join()
        for handle in handles:
            assert handle.state == "done"
            check_counts(handle)
            assert handle.launches >= 4  # at least one launch per phase


def test_exactly_once_with_cancels_mid_phase():
    with fr.Harvester("cpu", workers=4) as h:
        handles = [
            h.submit(fr.tasks.ItemCounter(300, phases=3, ns_per_item=50_000)) for _ in range(4)
        ]
        time.sleep(0.02)
        for handle in handles[::2]:
            handle.cancel()
        assert h.wait_all(timeout=120)
        for handle in handles:
            check_counts(handle)
        assert [x.state for x in handles[1::2]] == ["done", "done"]
