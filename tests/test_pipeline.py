"""Attaching to real torch.distributed.pipelining schedules, multi-process over gloo."""

import json

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

import pipeline_worker

from conftest import run_ranks
from freeride import simulate


def check_simulator_matches(results, world, name, n_micro):
    """fr.simulate runs each rank's actions in the order the real schedule ran them."""
    order = simulate.schedule_order(name, world, n_micro)
    for rank, res in enumerate(results):
        assert [a.label for a in order[rank]] == res["order"]


def run(world, name, tmp_path, n_micro=4, steps=3, side="items"):
    if not pipeline_worker.available(name):
        pytest.skip(f"torch {torch.__version__} has no {name}")
    return run_ranks(
        pipeline_worker.run_rank, world, tmp_path, world, name, n_micro, steps, str(tmp_path), side
    )


def check_loss_only_on_the_last_stage(results, world, name):
    """torch calls _maybe_compute_loss for every stage; only the last stage's call computes
    a loss, so only it is a compute action."""
    last = world * simulate.SCHEDULES[name][1] - 1
    assert [s for res in results for s in res["loss_stages"]] == [last]


def check_items_run_only_in_bubbles(results, steps):
    for res in results:
        assert res["identical"], "harvesting changed losses, gradients or weights"
        assert res["detach_restores"]
        assert res["iterations"] == steps
        assert res["partition_errors"] == [0] * steps  # bubbles + compute = iteration
        assert res["max_count"] <= 1
        # Items start only while the gate is open. A SCHED_IDLE worker preempted between
        # its gate check and the item's clock read may start it late, rarely; ignoring
        # the gate would start about a fifth of them inside compute.
        late = res["items_started_in_compute"]
        assert late <= max(2, res["items_done"] // 100), f"{late} items started in compute"
        assert res["items_timed"] == res["items_done"]
        # The report lists every launch that ran items in the recorded iterations.
        assert res["side_launch_items"] >= res["items_in_iterations"]
    # Side work progressed in the bubbles.
    assert sum(res["items_in_iterations"] for res in results) > 0


@pytest.mark.parametrize(
    "world, name",
    [
        (2, "gpipe"),
        (2, "1f1b"),
        (2, "interleaved"),
        (4, "1f1b"),
        (4, "interleaved"),
        (4, "gpipe"),
    ],
)
def test_side_items_run_only_in_bubbles(world, name, tmp_path):
    results = run(world, name, tmp_path, n_micro=2 * world)
    check_items_run_only_in_bubbles(results, steps=3)
    check_simulator_matches(results, world, name, 2 * world)
    check_loss_only_on_the_last_stage(results, world, name)
    labels = set().union(*(res["compute_labels"] for res in results))
    assert {"F", "B"} <= labels
    assert results[0]["gathered_ranks"] == list(range(world))
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    assert {"training compute", "bubbles"} <= names
    if (tmp_path / "timeline.png").exists():
        assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["looped_bfs", "zero_bubble", "zbv", "dualpipev"])
def test_other_schedules(name, tmp_path):
    results = run(2, name, tmp_path, n_micro=4)
    check_items_run_only_in_bubbles(results, steps=3)
    check_simulator_matches(results, 2, name, 4)
    check_loss_only_on_the_last_stage(results, 2, name)
    if name != "looped_bfs":
        labels = set().union(*(res["compute_labels"] for res in results))
        assert "W" in labels or "I" in labels  # split backward recorded


def test_failing_iterative_task_leaves_training_intact(tmp_path):
    # An unmeasured step starts only early in the longest bubble of a learned schedule:
    # enough iterations that a loaded machine's late polls cannot miss every chance.
    results = run(2, "1f1b", tmp_path, steps=8, side="fail")
    for res in results:
        assert res["identical"]
        assert res["side_state"] == "failed"
        assert "side task step exploded" in res["side_error"]
