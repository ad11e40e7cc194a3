"""Host-started launches with one wake-up (issue 36 item 1, review G8;
FREERIDE_WATCHER_LAUNCH=1, off by default until a GPU run has measured it).

An open that carries no launch with none in flight (launches at opens off, the first
bubble after a submit) is host-started. Before, through two sleeping
threads in series: the open watcher wakes when the GPU reaches the open and rings, then
the executor wakes from the bell and launches (266 us median on an H200). With the switch
on, the watcher's thread enqueues the executor's launch itself, then rings: one wake-up.
It launches only where the executor's run() would at that moment
(csrc/watcher_launch_rule.hpp); the executor takes the launch's end as its own.

The CPU tests check that rule (the switch: test_launch_at_open.py);
tests/test_open_watcher.py checks the watcher's plumbing (each event's open number,
handed to its hook before its ring). The GPU test runs host-started bubbles with it on
and off (tests/gpu_worker.py's watcher_launch).
"""

import pytest
from gpu_worker import run_worker

from freeride import _C


def test_the_watcher_launches_only_where_the_executor_would():
    """Each condition on its own keeps the watcher out. Not with a launch enqueued and its
    end not taken (the common case, an open that carried one: the executor takes that
    one's end), not where the runner takes no launch now (its phase done, an error, a full
    ring), not after a stop or an abandon, not while the gate's mirror reads closed (a
    bubble already over), not where the mirror's number is not this open's (a later open,
    whose own event comes next, or an immediate one), not into an open the training
    thread wrote without a launch on purpose (too short: the executor stays out too), not
    while another runner's launch is enqueued on the same stream with its end not taken (a
    task drained or retired while this one is armed: its launches may wait for later
    opens, and one enqueued now would run behind them, in a later bubble; run() itself
    launches only once they are taken)."""
    rule = _C._testing.watcher_launches
    assert rule()
    for off in (
        {"enabled": False},
        {"pending": True},
        {"accepting": False},
        {"stopping": True},
        {"gate_open": False},
        {"same_open": False},
        {"skipped": True},
        {"others_pending": True},
    ):
        assert not rule(**off), off


def test_the_host_backend_counts_no_watcher_launch(host):
    import freeride as fr

    task = host.submit(fr.tasks.Spin(items=64, ns_per_item=1000))
    assert task.wait(30)
    assert host._ex.watcher_launches == 0


@pytest.mark.gpu
@pytest.mark.parametrize("watcher", ["1", "0"], ids=["watcher-launch", "executor-launch"])
def test_host_started_bubbles_run_side_items_every_item_once(watcher):
    """Launches at opens off (FREERIDE_LAUNCH_AT_OPEN=0): every bubble's launch is
    host-started. With the watcher's launch on, most opens' launches are the watcher's (the
    executor can come first only where its look at the mirror, every millisecond, falls
    between the open taking effect and the watcher's launch); with it off (the control)
    none is. Either way side items run in every 5 ms bubble, none while the gate is
    closed, and every item exactly once."""
    env = {"FREERIDE_LAUNCH_AT_OPEN": "0", "FREERIDE_WATCHER_LAUNCH": watcher}
    r = run_worker("watcher_launch", {}, env=env, timeout=120)
    print(
        f"FREERIDE_WATCHER_LAUNCH={watcher}: {r['watcher_launches']} of {r['launches']} "
        f"launches the watcher's ({r['idle']} idle) over {r['bubbles']} bubbles; items per "
        f"bubble {r['items_per_bubble']}; {r['items_done']} of {r['items']} done, "
        f"max count {r['max_count']}"
    )
    assert not r["launches_at_opens"] and r["at_opens"] == 0, r
    assert all(n > 0 for n in r["items_per_bubble"]), "a bubble ran no side item"
    assert r["items_while_closed"] == 0, r
    if watcher == "1":
        assert r["watcher_launches"] >= r["bubbles"] // 2, r
    else:
        assert r["watcher_launches"] == 0, r
    assert r["finished"] and r["state"] == "done" and r["items_done"] == r["items"], r
    assert r["counts_all_one"] and r["violations"] == 0, r
