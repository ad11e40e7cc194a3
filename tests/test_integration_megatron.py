"""fr.integrations.megatron against megatron-core's own schedules, 1F1B and interleaved on
two gloo ranks (CPU), and the non-pipelined schedule on one."""

import importlib.util

import pytest

pytest.importorskip("torch")
# Found, not imported: the engine is imported only in the rank processes.
if (
    importlib.util.find_spec("megatron") is None
    or importlib.util.find_spec("megatron.core") is None
):
    pytest.skip("megatron-core is not installed (the test extra)", allow_module_level=True)

import megatron_worker

from conftest import run_ranks

pytestmark = pytest.mark.integration


def run(world, vp, tmp_path, steps=3):
    return run_ranks(megatron_worker.run_rank, world, tmp_path, world, vp, steps, str(tmp_path))


def check_common(results, steps):
    for res in results:
        assert res["identical"], "harvesting changed losses or weights"
        assert res["gate_closed_after_attach"]
        # the compared steps, and any more it took for side work to run on every rank
        assert res["iterations"] >= steps
        assert set(res["partition_errors"]) == {0}
        # Every forward-compute and backward-compute region megatron times ran with the
        # gate closed, inside a compute action freeride recorded.
        assert res["compute_regions"] > 0
        assert res["compute_regions_gate_open"] == 0
        labels = [lab for it in res["labels"] for lab in it]
        assert sum(lab.startswith("F") for lab in labels) == res["forward_regions"]
        assert sum(lab == "B" for lab in labels) == res["backward_regions"]
        # config.finalize_model_grads_func: a compute action once per training schedule,
        # and the config's own function again after each
        assert res["finalize_calls"] == res["iterations"]
        assert res["finalize_gate_open"] == 0
        assert res["finalize_restored"]
        assert all(it[-1] == "finalize_grads" for it in res["labels"])
        assert res["replaced"] and res["replaced_same"]
        assert res["closed_refused"]
        assert res["detach_restores"]
        assert res["closed_passthrough"] and res["closed_restores"]
        assert res["max_count"] <= 1
        assert res["items_timed"] == res["items_done"]
        late = res["items_started_in_compute"]
        assert late <= max(2, res["items_done"] // 100), f"{late} items started in compute"


@pytest.mark.parametrize(
    "vp, schedule",
    [
        (None, "forward_backward_pipelining_without_interleaving"),
        (2, "forward_backward_pipelining_with_interleaving"),
    ],
    ids=["1f1b", "interleaved"],
)
def test_megatron_pipeline(vp, schedule, tmp_path):
    results = run(2, vp, tmp_path)
    check_common(results, steps=3)
    for res in results:
        assert res["schedule"] == schedule
        # p2p regions are bubbles: megatron's send/recv timers ran with the gate open.
        assert res["p2p_regions"] > 0
        assert res["p2p_regions_gate_closed"] == 0
        # Side work progressed on every rank, inside the bubbles.
        assert res["items_done"] > 0
        assert res["side_launch_items"] > 0
    assert results[1]["base_losses"][0], "the last stage reports the losses"
    if vp is not None:
        for res in results:
            assert "combined 1F1B" in res["refused"]
        labels = {lab for res in results for it in res["labels"] for lab in it}
        assert {"F mb0 c0", "F mb0 c1"} <= labels


def test_megatron_no_pipelining_and_refusals(tmp_path):
    (res,) = run(1, None, tmp_path, steps=2)
    check_common([res], steps=2)
    assert res["schedule"] == "forward_backward_no_pipelining"
    assert "combined 1F1B" in res["refused"]
    assert "get_forward_backward_func() before" in res["stale_refused"]
