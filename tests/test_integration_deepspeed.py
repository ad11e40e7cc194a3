"""fr.integrations.deepspeed against a real DeepSpeed PipelineEngine on two gloo ranks
(CPU accelerator)."""

import importlib.util

import pytest

pytest.importorskip("torch")
# Found, not imported: the engine is imported only in the rank processes.
if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed is not installed (the test extra)", allow_module_level=True)

import deepspeed_worker

from conftest import run_ranks

pytestmark = pytest.mark.integration


def test_deepspeed_pipeline_engine(tmp_path):
    steps = 3
    results = run_ranks(deepspeed_worker.run_rank, 2, tmp_path, 2, steps, str(tmp_path))
    for res in results:
        assert res["identical"], "harvesting changed losses or weights"
        assert res["detach_restores_untrained"] and res["detach_restores"]
        assert res["gate_closed_after_attach"]
        # the compared steps, and any more it took for side work to run on every rank
        assert res["iterations"] >= steps
        assert set(res["partition_errors"]) == {0}
        assert res["forwards_seen"] > 0 and res["forwards_gate_open"] == 0
        for labels in res["labels"]:
            kinds = [lab.split()[0] for lab in labels]
            assert kinds.count("F") == deepspeed_worker.N_MICRO
            assert kinds.count("B") == deepspeed_worker.N_MICRO
            assert kinds.count("optimizer") == 1
            assert "reduce_grads" in kinds
        assert res["replaced"]
        assert "PipelineEngine" in res["refused_type"]
        assert "Prefetch" in res["refused_unknown"]
        assert res["closed_passthrough"] and res["closed_restores"]
        # Side work progressed on every rank, only in the bubbles.
        assert res["items_done"] > 0
        assert res["side_launch_items"] > 0
        assert res["max_count"] <= 1
        assert res["items_timed"] == res["items_done"]
        late = res["items_started_in_compute"]
        assert late <= max(2, res["items_done"] // 100), f"{late} items started in compute"
