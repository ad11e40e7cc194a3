"""fr.simulate against closed forms; its action orders are checked against real
schedules in test_pipeline.py."""

import pytest

import freeride as fr

pytest.importorskip("torch")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("ranks, m", [(2, 4), (4, 8), (8, 32)])
def test_classic_bubble_fraction(schedule, ranks, m):
    sim = fr.simulate.simulate(schedule, ranks, m, t_forward=1.0, t_backward=2.0)
    # (S - 1) / (M + S - 1): the well-known bubble of GPipe and 1F1B.
    assert sim.bubble_fraction == pytest.approx((ranks - 1) / (m + ranks - 1))
    assert sim.makespan == pytest.approx(3.0 * (m + ranks - 1))
    for rank in sim.ranks:
        assert sum(e - s for s, e in rank.bubbles) + rank.busy == pytest.approx(sim.makespan)


def test_schedules_rank_as_expected():
    f = {name: fr.simulate.simulate(name, 4, 8).bubble_fraction for name in fr.simulate.SCHEDULES}
    assert f["zero_bubble"] < f["interleaved"] < f["1f1b"]
    assert f["zbv"] < f["1f1b"] and f["dualpipev"] < f["1f1b"]


def test_communication_latency_widens_bubbles():
    a = fr.simulate.simulate("1f1b", 4, 8, t_comm=0.0)
    b = fr.simulate.simulate("1f1b", 4, 8, t_comm=0.5)
    assert b.makespan > a.makespan and b.bubble_fraction > a.bubble_fraction


def test_every_action_runs_once_in_dependency_order():
    sim = fr.simulate.simulate("zbv", 4, 8, t_comm=0.1)
    ends = {}
    for rank in sim.ranks:
        for action, start, end in rank.actions:
            key = (action.kind, action.stage, action.mb)
            assert key not in ends
            ends[key] = (start, end)
    for (kind, stage, mb), (start, _) in ends.items():
        if kind == "F" and stage > 0:
            assert start >= ends[("F", stage - 1, mb)][1]
        if kind == "W":
            assert start >= ends[("I", stage, mb)][1]
    assert len(ends) == 8 * 8 * 3  # 8 stages x 8 microbatches x (F, I, W)


def test_thousand_gpu_job():
    out = fr.simulate.harvestable_share(
        gpus=1000, tensor_parallel=8, pipeline_parallel=5, microbatches=16, t_comm=0.0
    )
    assert out["data_parallel"] == 25
    assert out["bubble_fraction"] == pytest.approx(4 / 20)  # (S - 1) / (M + S - 1)
    assert out["harvestable_gpu_hours_per_hour"] == pytest.approx(1000 * out["bubble_fraction"])
    synced = fr.simulate.harvestable_share(microbatches=16, t_comm=0.0, dp_sync=5.0)
    assert synced["bubble_fraction"] > out["bubble_fraction"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="schedule must be one of"):
        fr.simulate.simulate("pipedream", 4, 8)
    with pytest.raises(ValueError, match="microbatches must be >= 1"):
        fr.simulate.simulate("1f1b", 4, 0)
    with pytest.raises(ValueError, match="t_forward must be >= 0"):
        fr.simulate.simulate("1f1b", 4, 8, t_forward=-1)
    with pytest.raises(ValueError, match="multiple of tensor_parallel"):
        fr.simulate.harvestable_share(gpus=1000, tensor_parallel=8, pipeline_parallel=8)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        # Before, these gave a bubble fraction of 9.0, NaN or infinity rather than an error.
        (
            lambda: fr.simulate.simulate("zbv", 2, 4, t_backward_input=-5),
            ValueError,
            "t_backward_input must be >= 0, got -5.0",
        ),
        (
            lambda: fr.simulate.simulate("zbv", 2, 4, t_backward_weight=float("nan")),
            ValueError,
            "t_backward_weight must be finite, got nan",
        ),
        (lambda: fr.simulate.simulate(t_comm=float("inf")), ValueError, "t_comm must be finite"),
        (lambda: fr.simulate.simulate(ranks=2.0), TypeError, "ranks must be an integer, got float"),
        (
            lambda: fr.simulate.simulate(microbatches=None),
            TypeError,
            "microbatches must be an integer",
        ),
        (lambda: fr.simulate.simulate(None), TypeError, "schedule must be a str"),
        # A bare ZeroDivisionError, and negative GPU counts and fractions above 1, before.
        (
            lambda: fr.simulate.harvestable_share(tensor_parallel=0),
            ValueError,
            "tensor_parallel must be >= 1, got 0",
        ),
        (lambda: fr.simulate.harvestable_share(gpus=-40), ValueError, "gpus must be >= 1"),
        (
            lambda: fr.simulate.harvestable_share(dp_sync=-100),
            ValueError,
            "dp_sync must be >= 0, got -100.0",
        ),
    ],
)
def test_arguments_that_made_nonsense_are_refused(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
