"""The benchmarks' CPU mode, as a smoke test: it checks the output's structure and that
every figure is a real measurement, never the speed (that is what the GPU runs are for)."""

import importlib.util
import json
import math
import pathlib

import pytest

from freeride.cli import bench

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
        ("hooks", {"backend", "hooks", "part", "pairs", "p50_ns", "p99_ns", "mean_ns"}),
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
    # Each close's share of the overhead, for freeride's variants only (the others close
    # nothing): the iteration's extra time over the closes the stage's actions made.
    closes = result["settings"]["closes_per_iteration"]
    assert closes == 16  # stage 1 of a 4-stage 1F1B, 8 microbatches: 8 forwards, 8 backwards
    base = rows["baseline"]["iter_ms"]
    for name, row in rows.items():
        if name.startswith("freeride"):
            expected = (row["iter_ms"] - base) * 1000 / closes
            assert row["overhead_us_per_close"] == pytest.approx(expected), name
        else:
            assert row["overhead_us_per_close"] is None, name


def test_pipeline_iterations_keep_the_actions_length():
    # --iterations shortens the run without shortening the compute actions (--quick
    # shortens both, and each close then weighs four times as much).
    full = bench.run("pipeline", mode="cpu", options={"iterations": 1})["settings"]
    assert full["iterations_per_variant"] == 1
    assert full["t_forward_ms"] == 4.0
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="iterations must be a positive int"):
            bench.run("pipeline", mode="cpu", quick=True, options={"iterations": bad})


def test_items_has_a_copy_row_to_read_bandwidth_against():
    # The plain copy of Saxpy float32's bytes, and each bandwidth row's share of it.
    from freeride.cli.bench.items import COPY_TASK

    result = bench.run("items", mode="cpu", quick=True)
    rows = {r["task"]: r for r in result["rows"]}
    copy = rows.pop(COPY_TASK)
    assert copy["plain_ms"] > 0 and copy["plain_GBps"] > 0
    assert copy["preemptible_GBps"] is None and copy["vs_copy_pct"] is None
    saxpy = rows["Saxpy float32"]
    # The same bytes: Saxpy float32 moves 3 n floats, so its plain GB/s x its time is the
    # copy's GB/s x the copy's time.
    moved = saxpy["plain_GBps"] * saxpy["plain_ms"]
    assert copy["plain_GBps"] * copy["plain_ms"] == pytest.approx(moved)
    for row in rows.values():
        assert "vs_copy_pct" in row
        if row["preemptible_GBps"] is None:
            assert row["vs_copy_pct"] is None
        else:
            expected = 100 * row["preemptible_GBps"] / copy["plain_GBps"]
            assert row["vs_copy_pct"] == pytest.approx(expected)
    assert any(COPY_TASK in note for note in result["notes"])


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


def test_hooks_times_every_pair_of_both_ways_of_calling_them():
    """Shape, never speed: a row for h.compute() and one for attach(), each with every
    pair it ran timed and its percentiles in order (none of them a constant)."""
    result = bench.run("hooks", mode="cpu", quick=True)
    rows = {row["hooks"]: row for row in result["rows"]}
    assert set(rows) == {"h.compute()", "attach()"}
    settings = result["settings"]
    assert (
        rows["h.compute()"]["pairs"] == settings["iterations"] * settings["actions_per_iteration"]
    )
    # Each step of the attached schedule: a forward, a loss and a backward per microbatch.
    assert rows["attach()"]["pairs"] % (3 * settings["attach_microbatches"]) == 0
    for row in rows.values():
        assert row["backend"] == "host" and row["part"] == "all"
        assert 0 < row["p50_ns"] <= row["p99_ns"]
        assert row["mean_ns"] > 0
    assert any("close+open pair" in note for note in result["notes"])


def test_hooks_keep_the_compute_row_when_attach_fails(monkeypatch):
    # attach() runs on whatever torch the machine has: its failure is its row's, and the
    # h.compute() row (the metric's own) stands.
    from freeride.cli.bench import hooks

    def broken(*_):
        raise RuntimeError("gloo refused")

    monkeypatch.setattr(hooks, "_attach_row", broken)
    result = hooks.measure("cpu", quick=True)
    rows = {row["hooks"]: row for row in result["rows"]}
    assert rows["h.compute()"]["pairs"] > 0
    assert rows["attach()"] == {
        "backend": "host",
        "hooks": "attach()",
        "unavailable": "attach() failed: RuntimeError: gloo refused",
    }


def _load_hook_cost():
    """benchmarks/hook_cost.py as a module (benchmarks/ is not a package)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "hook_cost.py"
    spec = importlib.util.spec_from_file_location("hook_cost", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hook_cost_adds_the_cuda_paths_python_part(tmp_path, capsys):
    """benchmarks/hook_cost.py: bench hooks' rows and two more, of the recorder and gate
    of kind "cuda" over the stub, whose output says they are the Python part only; the
    queries it stubbed are the real ones again afterwards."""
    from freeride import _streams
    from freeride.record import recorder

    before = (recorder.free_device_memory, _streams.current_stream)
    hook_cost = _load_hook_cost()
    out = tmp_path / "hooks.json"
    result = hook_cost.run("cpu", quick=True, out=str(out))
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    stub = [row for row in result["rows"] if row["backend"] == "cuda stub"]
    assert [row["hooks"] for row in stub] == ["Recorder.compute()", "attach() wrapper"]
    for row in stub:
        assert row["part"] == "Python"
        assert row["pairs"] == result["settings"]["iterations"] * hook_cost.hooks.ACTIONS
        assert 0 < row["p50_ns"] <= row["p99_ns"]
    printed = capsys.readouterr().out
    assert "the Python part only" in printed and "bench preempt" in printed
    after = (recorder.free_device_memory, _streams.current_stream)
    assert after == before


def test_call_costs_refuse_what_they_cannot_measure():
    """_C.measure_call_costs (hook_cost.py's "CUDA call" rows) names a bad count, and
    without a usable GPU refuses with the runtime's reason; hook_cost.py then gives one
    row that says why instead of figures."""
    from conftest import HAS_GPU
    from freeride import _C

    for calls in (0, 1_000_001):
        with pytest.raises(ValueError, match="calls must be between 1 and 1000000"):
            _C.measure_call_costs(0, calls)
    if HAS_GPU:
        pytest.skip("a GPU is here: test_call_costs_on_a_gpu measures")
    with pytest.raises(RuntimeError, match="cuda|CUDA"):
        _C.measure_call_costs(0, 8)
    rows, settings = _load_hook_cost().call_rows(quick=True)
    assert settings == {}
    assert len(rows) == 1 and rows[0]["hooks"] == "CUDA call" and rows[0]["unavailable"]


def test_hook_cost_keeps_its_rows_whatever_the_call_timing_does(tmp_path, monkeypatch):
    """hook_cost.py's GPU mode writes its JSON before it times the CUDA calls (a deadline
    that kills it there leaves the hooks' rows), and a failure of any kind in the timing
    becomes the one row that says why."""
    from freeride import _C
    from freeride.cli.bench import hooks as bench_hooks

    hook_cost = _load_hook_cost()
    out = tmp_path / "hooks.json"
    measured = bench_hooks.measure("cpu", True)
    monkeypatch.setattr(hook_cost.hooks, "measure", lambda mode, quick: measured)
    header = bench.header  # a header of "gpu" would name the GPU
    monkeypatch.setattr(bench, "header", lambda name, mode, quick: header(name, "cpu", quick))
    written: list[list[str]] = []

    def timing_fails(device: int, calls: int) -> dict:
        written.append([row["hooks"] for row in json.loads(out.read_text())["rows"]])
        raise MemoryError("pinned memory is exhausted")

    monkeypatch.setattr(_C, "measure_call_costs", timing_fails)
    result = hook_cost.run("gpu", quick=True, out=str(out))
    (before,) = written
    assert "h.compute()" in before and "CUDA call" not in before
    (row,) = [row for row in result["rows"] if row["hooks"] == "CUDA call"]
    assert row["unavailable"] == "MemoryError: pinned memory is exhausted"
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))


@pytest.mark.gpu
def test_call_costs_on_a_gpu():
    """Each kind of call a pair makes, timed on cuda:0: the clock's floor first, then
    every kind with a figure per call (or, for the batched write alone, the reason the
    driver gives none); hook_cost.py's rows carry them less the floor."""
    import freeride as fr
    from freeride import _C

    measured = _C.measure_call_costs(0, 100)
    assert measured["held"] is bool(fr.backend_info()["devices"][0]["stream_mem_ops"])
    calls = measured["calls"]
    assert calls[0]["call"].startswith("clock pair")
    assert len(calls) == 10
    for kind in calls:
        if kind["unavailable"]:
            assert "cuStreamBatchMemOp" in kind["call"] and not kind["ns"]
            continue
        assert len(kind["ns"]) == 100 and all(0 <= ns < 1_000_000_000 for ns in kind["ns"])
    rows, settings = _load_hook_cost().call_rows(quick=True)
    assert settings["calls_per_kind"] == 256 and len(rows) == 9
    for row in rows:
        assert row["hooks"] == "CUDA call" and ("unavailable" in row or row["pairs"] == 256)


@pytest.mark.gpu
def test_call_costs_let_go_of_a_held_stream_when_a_call_fails():
    """A timed call that throws while a stream wait holds the measurement's stream: the
    error reaches the caller within seconds (the release covers every wait issued; the
    largest unsigned value would release none, CU_STREAM_WAIT_VALUE_GEQ being cyclic), the
    process-wide answer on stream memory operations is the same as before, and the next
    measurement runs."""
    import threading

    import freeride as fr
    from freeride import _C

    before = fr.backend_info()["devices"][0]["stream_mem_ops"]
    outcome: list[BaseException | dict] = []

    def measure() -> None:
        try:
            outcome.append(_C.measure_call_costs(0, 8))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    _C._testing.fail_call_costs_block(3)
    try:
        worker = threading.Thread(target=measure, daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "measure_call_costs hung after a failure in a held block"
    finally:
        _C._testing.fail_call_costs_block(0)
    (failed,) = outcome
    assert isinstance(failed, RuntimeError) and "held block 3" in str(failed)
    assert fr.backend_info()["devices"][0]["stream_mem_ops"] == before
    again = _C.measure_call_costs(0, 8)
    assert len(again["calls"]) == 10


def test_bad_benchmark_arguments():
    with pytest.raises(ValueError, match="benchmark must be one of"):
        bench.run("latency", mode="cpu")
    with pytest.raises(ValueError, match="mode must be"):
        bench.run("items", mode="tpu")
    with pytest.raises(ValueError, match="runs in mode cpu only"):
        bench.run("ranks", mode="gpu")


def test_admission_keeps_only_probes_with_side_work_around_them():
    # (items finished so far, (running task, its launches)) before the probe was released,
    # once it had started, and after it: the GPU-only benchmark's residency rule.
    from freeride.cli.bench.admission import resident

    head = (7, 3)
    assert resident((10, head), (20, head), (30, head))
    assert not resident((10, head), (10, head), (30, head))  # nothing finished before it
    assert not resident((10, head), (20, head), (20, head))  # nor after it
    assert not resident((10, head), (20, head), (30, (7, 4)))  # a relaunch in between
    assert not resident((10, head), (20, head), (30, (8, 1)))  # the next task took over
    assert not resident((10, head), (20, head), (30, None))  # the task ended
    assert not resident((10, None), (20, None), (30, None))


def test_admission_summary_counts_only_kept_probes():
    import numpy as np

    from freeride.cli.bench.admission import TARGET_US, Trial, summarize

    kept = [Trial("kept", float(us), float(us) + 1) for us in range(1, 101)]
    trials = kept + [Trial("dropped", 0.5, 0.5)] * 3 + [Trial("late", math.nan, math.nan)]
    row = summarize(trials, idle_p99_us=2.0)
    p99 = float(np.percentile(np.arange(1, 101), 99))
    assert (row["trials"], row["dropped"], row["late"]) == (100, 3, 1)
    assert row["p50_us"] == pytest.approx(50.5)  # the dropped 0.5s would pull it down
    assert row["p99_us"] == pytest.approx(p99)
    assert row["max_us"] == 100.0
    assert row["all_p99_us"] == pytest.approx(p99 + 1)
    assert row["over_idle_p99_us"] == pytest.approx(p99 - 2.0)
    assert row["target_10us"] == "miss"

    at_target = summarize([Trial("kept", TARGET_US, TARGET_US)] * 10, idle_p99_us=None)
    assert at_target["target_10us"] == "pass"
    assert at_target["over_idle_p99_us"] is None

    none_kept = summarize([Trial("dropped", 1.0, 1.0)], idle_p99_us=2.0)
    assert none_kept["target_10us"] == "no data"
    assert none_kept["trials"] == 0 and none_kept["dropped"] == 1
    assert none_kept["p99_us"] is None
