"""The benchmarks' CPU mode, as a smoke test: it checks the output's structure and that
every figure is a real measurement, never the speed (that is what the GPU runs are for)."""

import json
import math

import pytest

from freeride import bench

pytest.importorskip("torch")


@pytest.mark.parametrize(
    "name, columns",
    [
        ("preempt", {"variant", "item_us", "p50_us", "p99_us", "max_us"}),
        ("items", {"task", "plain_ms", "preemptible_ms", "item_overhead_pct", "launches"}),
        ("pipeline", {"variant", "iter_ms", "overhead_pct", "side_items", "harvest_eff_pct"}),
        (
            "ranks",
            {"stages", "task", "no_side_ms", "harvesting_ms", "overhead_pct", "estimated_pct"},
        ),
    ],
)
def test_cpu_mode_smoke(name, columns, tmp_path, capsys):
    out = tmp_path / f"{name}.json"
    result = bench.run(name, mode="cpu", out=str(out), quick=True)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for key in ("benchmark", "mode", "device", "date", "commit", "settings", "rows"):
        assert key in result
    assert result["rows"]
    for row in result["rows"]:
        assert columns <= set(row)
        for value in row.values():
            if isinstance(value, float):
                assert math.isfinite(value)
    printed = capsys.readouterr().out
    first = result["rows"][0]
    assert name in printed
    assert all(bench._fmt(v) in printed for v in first.values())


def test_pipeline_variants_do_side_work_only_when_allowed(tmp_path):
    result = bench.run("pipeline", mode="cpu", quick=True)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {
        "baseline",
        "freeride: spin",
        "freeride: saxpy",
        "freeride: pagerank",
        "freeride: blur",
        "stream priority only: spin",
        "naive: spin",
    }
    assert rows["baseline"]["side_items"] == 0
    assert rows["baseline"]["overhead_pct"] == 0.0
    for name, row in rows.items():
        if name != "baseline":
            assert row["side_items"] > 0, name


def test_preempt_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "preempt.png"
    bench.run("preempt", mode="cpu", quick=True, plot=str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ranks_measures_both_sides_and_the_hooks():
    # A real 2-rank gloo pipeline: both kinds of step ran, side work ran in the harvesting
    # ones, and the estimate is the hooks' measured time, not a constant.
    row = bench.run("ranks", mode="cpu", quick=True)["rows"][0]
    assert row["steps"] == "4+4"
    assert row["no_side_ms"] > 0 and row["harvesting_ms"] > 0
    assert row["ci95_low_pct"] <= row["overhead_pct"] <= row["ci95_high_pct"]
    assert row["harvested_pct"] > 0
    assert row["hooks_us_per_iter"] > 0
    assert 0 < row["estimated_pct"] < 100


def test_bad_benchmark_arguments():
    with pytest.raises(ValueError, match="benchmark must be one of"):
        bench.run("latency", mode="cpu")
    with pytest.raises(ValueError, match="mode must be"):
        bench.run("items", mode="tpu")
    with pytest.raises(ValueError, match="runs in mode cpu only"):
        bench.run("ranks", mode="gpu")
