"""benchmarks/measure_table.py, the table of run_gpu.sh's `measure` step, on the CPU: every
row of issue 36's list is there whatever the inputs, met and missed are decided against
the targets, missing inputs say "not run", and a run cut short never breaks the table.

The inputs mimic each source's real format: the bench JSONs are the H200 run's of
2026-11-27 (benchmarks/results/h200-2026-11-27/) or built from their rows, the probes'
and the harvest matrix's JSON are written as the probes write them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "h200-2026-11-27"


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


mt = _load("measure_table", ROOT / "benchmarks" / "measure_table.py")

# 10 pause (close queued ahead; host-enqueued) + 5 admission + 12 harvest + 5 held
# + 8 overhead + 6 items + 3 bw + 6 host (2 hooks, the CUDA calls alone, with a launch,
# 2 gate writes alone) + 2 executor sleep + 1 training admission
ROWS = 58
AHEAD = "gate in device memory, close queued ahead"
HOST_ENQUEUED = "gate in device memory, close enqueued as the GPU waits"


# -- inputs as the step writes them -------------------------------------------------------


def admission(
    p99: float, at_opens: bool, watcher: bool = False, mode: str = "ring", **extra
) -> dict:
    """probe_admission.py --json: its keys, with delays whose p99 is `p99`; `watcher`, run
    with FREERIDE_WATCHER_LAUNCH=1 (its launches counted); `mode`, FREERIDE_ADMISSION."""
    delays = sorted([p99 / 2] * 150 + [p99] * 50)
    env = {
        "FREERIDE_LAUNCH_AT_OPEN": "unset" if at_opens else "0",
        "FREERIDE_ADMISSION": "unset" if mode == "ring" else mode,
    }
    if watcher:
        env["FREERIDE_WATCHER_LAUNCH"] = "1"
        extra = {"watcher_launches": 190, **extra}
    return {
        "probe": "probe_admission",
        "trials": 200,
        "env": env,
        "admission": mode,
        "launches_at_opens": at_opens,
        "reserve": "green-context (120 of 132 SMs)",
        "delays_us": delays,
        "kept": 200,
        "stuck": 0,
        "p50_us": p99 / 2,
        "p90_us": p99,
        "p99_us": p99,
        "min_us": delays[0],
        "max_us": delays[-1],
        **extra,
    }


def channels(held: int, never: int = 0, carried: int = 1, bound: str = "unset") -> dict:
    """probe_channels.py --json."""
    return {
        "probe": "probe_channels",
        "mechanism": "occupancy-cap",
        "opens": 4,
        "others": 24,
        "max_lookahead_env": bound,
        "connections": "unset (8)",
        "reserve": "occupancy-cap",
        "launches_at_opens": True,
        "held": held,
        "held_done_ms": [299.1] * held,
        "never_done": never,
        "reached_ms": 299.0,
        "launches_at_these_opens": carried,
        "beyond_lookahead": 0 if bound == "unset" else 3,
        "max_lookahead": 4,
    }


def bubbles_result(share: float, **extra) -> dict:
    """tests/gpu_worker.py's queued_bubbles result."""
    return {
        "connections": None,
        "launch_at_open_env": None,
        "item_us": 20.0,
        "iterations": 5,
        "recv_ms": 20.0,
        "reserve_mechanism": "occupancy-cap",
        "launches_at_opens": True,
        "time_slice": 0.002,
        "slice_bound": 0.004,
        "queued_ahead": True,
        "open_gate_items_per_s": 3.1e7,
        "items_in_bubbles": int(share * 3.1e7 * 0.1),
        "harvest_share": share,
        "queue_ms": 150.2,
        "baseline_ms": 150.0,
        "overhead_pct": 0.13,
        "launches": 5,
        "at_opens": 5,
        "idle_at_opens": 0,
        "max_lookahead": 2,
        **extra,
    }


def phases_result(share: float, **extra) -> dict:
    """tests/gpu_worker.py's queued_phases result."""
    return {
        "phases_ahead_env": "1",
        "phases": 30,
        "launches_at_opens": True,
        "connections": None,
        "recv_ms": 20.0,
        "iterations": 5,
        "open_gate_items_per_s": 1e8,
        "twin_state": "done",
        "queued_ahead": True,
        "items_in_bubbles": int(share * 1e7),
        "phases_in_bubbles": 12,
        "harvest_items_per_bubble_ms": share * 1e5,
        "harvest_share": share,
        "violations_in_bubbles": 0,
        "max_count_in_bubbles": 1,
        "launches": 20,
        "at_opens": 10,
        "idle_at_opens": 0,
        "queue_ms": 150.0,
        "finished": True,
        "state": "done",
        "items_done": 12_000_000,
        "violations": 0,
        "counts_all_one": True,
        "max_count": 1,
        **extra,
    }


def harvest(runs: dict[str, dict], complete: bool = True) -> dict:
    """probe_harvest_matrix.py --json: `runs` maps a key to {"result": ...} or {"error": ...}."""
    return {
        "probe": "probe_harvest_matrix",
        "planned": [key for key, _ in mt.HARVEST_ROWS],
        "runs": [
            {"key": key, "label": key, "mode": "m", "env": {}, "args": {}, **got, "seconds": 6.0}
            for key, got in runs.items()
        ],
        "complete": complete,
    }


def bench(name: str) -> dict:
    return json.loads((H200 / f"bench-{name}.json").read_text())


def preempt_now(p99_ahead: float = 15.0) -> dict:
    """The H200's preempt JSON as bench preempt now writes it: the pause measured from the
    close taking effect (p99 `p99_ahead`, in every row of the default variant), and the
    H200's figures, whose clock started before the host's close call, as the rows of the
    host-enqueued variant."""
    data = bench("preempt")
    data["settings"]["pause_from"] = "close queued ahead (marker)"
    for row in list(data["rows"]):
        if row["variant"] == mt.PAUSE_VARIANT:
            data["rows"].append({**row, "variant": mt.PAUSE_VARIANT + mt.HOST_ENQUEUED})
            row.update(p50_us=p99_ahead / 2, p99_us=p99_ahead, max_us=p99_ahead + 1)
    return data


def items_with_copy(copy_gbps: float = 4000.0) -> dict:
    """The H200's items JSON with the copy row and column `bench items` now adds."""
    data = bench("items")
    for row in data["rows"]:
        side = row["preemptible_GBps"]
        row["vs_copy_pct"] = 100 * side / copy_gbps if side else None
    data["rows"].append(
        {
            "task": "copy (Saxpy float32's bytes)",
            "plain_ms": 0.2,
            "preemptible_ms": None,
            "item_overhead_pct": None,
            "launches": None,
            "plain_GBps": copy_gbps,
            "preemptible_GBps": None,
            "vs_copy_pct": None,
        }
    )
    return data


def write(folder: pathlib.Path, name: str, data) -> None:
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def full_folder(folder: pathlib.Path) -> pathlib.Path:
    """Every input of a complete run: the H200's bench JSONs and probes that meet targets."""
    folder.mkdir(parents=True, exist_ok=True)
    write(folder, "preempt.json", preempt_now())
    write(folder, "pipeline.json", bench("pipeline"))
    write(folder, "items.json", items_with_copy())
    write(folder, "admission_at_open.json", admission(8.0, True))
    write(folder, "admission_ring.json", admission(25.0, False))
    write(folder, "admission_poll.json", admission(40.0, False, mode="poll"))
    write(folder, "admission_watcher.json", admission(28.0, False, watcher=True))
    write(folder, "admission_spin.json", admission(20.0, False, mode="spin", closed_cpu_per_s=1.0))
    for reserve in mt.RESERVES:
        for la in mt.LOOKAHEADS:
            bound = "unset" if la == "none" else la
            write(folder, mt.channels_file(reserve, la), channels(0, bound=bound))
    write(folder, mt.BALANCED_CHANNELS, channels(0) | {"green_workqueues": "balanced"})
    runs = {key: {"result": harvest_result(key, 0.9)} for key, _ in mt.HARVEST_ROWS}
    write(folder, "harvest.json", harvest(runs))
    write(folder, "hooks.json", hooks_result(8.0))
    return folder


def harvest_result(key: str, share: float) -> dict:
    """The worker's result for the matrix run `key`, as a run of that setting gives it."""
    if "phases" in key:
        return phases_result(share)
    if key.endswith("-slices16"):
        return bubbles_result(share, max_slices=16, slice_bound=0.032)
    return bubbles_result(share, max_slices=8)


def hooks_result(p50_us: float, backend: str = "cuda") -> dict:
    """freeride bench hooks --mode gpu's JSON: both rows at `p50_us` per pair."""
    rows = [
        {"backend": backend, "hooks": name, "part": "all", "pairs": 32000, "p50_ns": p50_us * 1000}
        | {"p99_ns": p50_us * 1500, "mean_ns": p50_us * 1100}
        for name in ("h.compute()", "attach()")
    ]
    return {"benchmark": "hooks", "mode": "gpu", "device": "NVIDIA H200", "rows": rows}


def by_setting(rows, metric_start: str) -> dict[str, object]:
    return {r.setting: r for r in rows if r.metric.startswith(metric_start)}


# -- the tests -----------------------------------------------------------------------------


def test_every_row_is_there_and_not_run_without_inputs(tmp_path):
    rows = mt.rows_of(str(tmp_path))
    assert len(rows) == ROWS
    assert {r.verdict for r in rows} == {mt.NOT_RUN}
    metrics = [r.metric for r in rows]
    for start in (
        "pause latency",
        "side admission",
        "harvest",
        "other-stream kernels held",
        "training overhead",
        "item overhead",
        "side-kernel bandwidth",
        "host cost per close+open pair",
        "executor wake-ups",
        "training-kernel admission",
    ):
        assert any(m.startswith(start) for m in metrics), start
    text = mt.table(str(tmp_path / "absent"))  # not even the folder: still the table
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert len(lines) == ROWS + 2  # and the header and its rule
    assert all(ln.count(" | ") == 4 and ln.endswith(" |") for ln in lines)
    counts = f"0 met, 0 missed, 0 failed, {ROWS} not run, 0 no target ({ROWS} rows)"
    assert text.splitlines()[-1] == counts


def test_the_h200_run_of_2026_11_27_read_as_it_was(tmp_path):
    # The table reads the real bench JSONs to the figures benchmarks/README.md took from
    # them by hand.
    folder = full_folder(tmp_path)
    write(folder, "preempt.json", bench("preempt"))
    (folder / "hooks.json").unlink()  # bench hooks did not run on that GPU
    rows = mt.rows_of(str(folder))
    assert len(rows) == ROWS
    pause = by_setting(rows, "pause latency")
    # Its clock started before the host's close call: the host-enqueued rows, no target.
    ten = pause[f"10 µs items, {HOST_ENQUEUED}"]
    assert (ten.verdict, ten.target) == (mt.NO_TARGET, "—")
    assert "9,343" in ten.measured and "300 trials" in ten.measured
    ahead = [r for s, r in pause.items() if AHEAD in s]
    assert len(ahead) == 5 and {r.verdict for r in ahead} == {mt.NOT_RUN}
    assert all("older bench preempt" in r.measured for r in ahead)
    assert pause[f"10 µs items, {AHEAD}"].target == "p99 ≤ 20 µs"
    items = by_setting(rows, "item overhead")
    assert items["Saxpy float32"].verdict == mt.MET
    assert "-19.74%" in items["Saxpy float32"].measured
    # Before device phases: its PageRank ran one launch a phase.
    apart = items["PageRank, one launch a phase: 2000000 nodes x16, 5 iters"]
    assert apart.verdict == mt.MISSED and "+31.50%" in apart.measured
    assert items["PageRank, device phases (default)"].verdict == mt.NOT_RUN
    overhead = by_setting(rows, "training overhead")
    assert overhead["saxpy, 8 queues (default)"].verdict == mt.MET
    assert "0.45%" in overhead["saxpy, 8 queues (default)"].measured
    assert overhead["spin, 1 queue"].verdict == mt.MISSED
    host = by_setting(rows, "host cost")
    compute, attach, calls, at_open, ring, poll = host.values()
    # bench hooks had not run on a GPU then: the writes alone stand in for the pair.
    assert (compute.verdict, attach.verdict, calls.verdict) == (mt.NOT_RUN,) * 3
    assert at_open.verdict == mt.MISSED and "gate writes alone" in at_open.measured
    assert "637 of 640" in at_open.measured
    assert (ring.verdict, poll.verdict) == (mt.NO_TARGET, mt.NO_TARGET)
    assert "p50 7.22" in poll.measured
    (training,) = [r for r in rows if r.metric.startswith("training-kernel admission")]
    assert training.verdict == mt.MISSED and training.measured.startswith("40 of 56 rows")
    bandwidth = by_setting(rows, "side-kernel bandwidth")
    assert {r.verdict for r in bandwidth.values()} == {mt.NO_TARGET}
    assert "87% of the copy's 4,000 GB/s" in bandwidth["Saxpy float32"].measured


@pytest.mark.parametrize(
    "extra, verdict, shown",
    [
        ({"closed_wakeups_per_s": 51.2, "closed_cpu_per_s": 0.004}, mt.MET, "51 a second"),
        ({"closed_wakeups_per_s": 100.0}, mt.MET, "100 a second"),
        ({"closed_wakeups_per_s": 1003.0}, mt.MISSED, "1,003 a second"),
        ({}, mt.FAILED, "no wake-up count"),
    ],
)
def test_executor_wakeups_against_the_target(tmp_path, extra, verdict, shown):
    """probe_admission's closed-gate second: the executor sleeps through compute when it
    wakes at most 100 times a second (its 20 ms backstop is 50; the 1 ms look was 1,000)."""
    write(tmp_path, "admission_at_open.json", admission(8.0, True, **extra))
    rows = by_setting(mt.rows_of(str(tmp_path)), "executor wake-ups")
    row = rows["launches at opens (default)"]
    assert row.verdict == verdict and shown in row.measured, row
    assert rows["host-started: executor, ring (FREERIDE_LAUNCH_AT_OPEN=0)"].verdict == mt.NOT_RUN


def test_a_bench_items_json_without_the_copy_row(tmp_path):
    write(tmp_path, "items.json", bench("items"))  # as written before the copy row
    bandwidth = by_setting(mt.rows_of(str(tmp_path)), "side-kernel bandwidth")
    assert {r.verdict for r in bandwidth.values()} == {mt.NOT_RUN}
    assert "no copy row" in bandwidth["Saxpy float32"].measured


RING = "host-started: executor, ring"
WATCHER = "host-started: the watcher launches"
SPIN = "host-started: executor, FREERIDE_ADMISSION=spin"
CAP = "channels_occupancy-cap_lookahead_none.json"
GREEN = "channels_green-context_lookahead_1.json"


@pytest.mark.parametrize(
    "name, data, start, setting, verdict",
    [
        ("admission_at_open.json", admission(10.0, True), "side admission", "device", mt.MET),
        ("admission_at_open.json", admission(10.01, True), "side admission", "device", mt.MISSED),
        ("admission_ring.json", admission(30.0, False), "side admission", RING, mt.MET),
        ("admission_ring.json", admission(30.5, False), "side admission", RING, mt.MISSED),
        ("admission_watcher.json", admission(30.0, False, True), "side adm", WATCHER, mt.MET),
        ("admission_watcher.json", admission(30.5, False, True), "side adm", WATCHER, mt.MISSED),
        ("admission_spin.json", admission(30.0, False, mode="spin"), "side adm", SPIN, mt.MET),
        ("admission_spin.json", admission(30.5, False, mode="spin"), "side adm", SPIN, mt.MISSED),
        (CAP, channels(0), "other-stream", "occupancy-cap, no", mt.MET),
        (CAP, channels(1), "other-stream", "occupancy-cap, no", mt.MISSED),
        (GREEN, channels(0, never=1, bound="1"), "other-stream", "green-context, look", mt.MISSED),
    ],
)
def test_met_and_missed_against_the_targets(tmp_path, name, data, start, setting, verdict):
    write(tmp_path, name, data)
    rows = mt.rows_of(str(tmp_path))
    [row] = [r for r in rows if r.metric.startswith(start) and r.setting.startswith(setting)]
    assert row.verdict == verdict, row


@pytest.mark.parametrize("share, verdict", [(0.85, mt.MET), (0.849, mt.MISSED), (0.0, mt.MISSED)])
def test_harvest_against_85_percent(tmp_path, share, verdict):
    write(tmp_path, "harvest.json", harvest({"spin-20ms-8q": {"result": bubbles_result(share)}}))
    row = mt.harvest_rows(mt.load(str(tmp_path), "harvest.json"))[0]
    assert row.verdict == verdict
    assert f"{share:.1%}" in row.measured


@pytest.mark.parametrize("value, verdict", [(20.0, mt.MET), (20.5, mt.MISSED)])
def test_pause_target_boundary(tmp_path, value, verdict):
    # p99 <= 20 us at 10 us items
    data = preempt_now()
    for row in data["rows"]:
        if row["variant"] == mt.PAUSE_VARIANT and row["item_us"] == 10:
            row["p99_us"] = value
    write(tmp_path, "preempt.json", data)
    pause = by_setting(mt.rows_of(str(tmp_path)), "pause latency")
    assert pause[f"10 µs items, {AHEAD}"].verdict == verdict
    # The host-enqueued rows have no target, whatever their figures (9,343 µs here).
    assert {r.verdict for s, r in pause.items() if HOST_ENQUEUED in s} == {mt.NO_TARGET}
    assert pause[f"5 µs items, {AHEAD}"].verdict == mt.NO_TARGET


def test_the_table_and_bench_preempt_name_the_pause_rows_alike():
    """measure_table keeps its own copy of bench preempt's names (it reads JSON files and
    imports nothing of freeride): they must agree, or the pause rows read "not run"."""
    preempt = pytest.importorskip("freeride.cli.bench.preempt")
    assert preempt.PAUSE_VARIANT == mt.PAUSE_VARIANT
    assert preempt.HOST_ENQUEUED == mt.HOST_ENQUEUED
    assert preempt.PAUSE_FROM


@pytest.mark.parametrize("late", [None, math.nan])
def test_a_pause_row_without_a_figure_is_not_judged(tmp_path, late):
    """A row whose every trial was late has no figure (None; NaN, as a JSON may carry):
    it ran and failed, neither a miss nor a pass."""
    data = preempt_now()
    for row in data["rows"]:
        if row["variant"] == mt.PAUSE_VARIANT and row["item_us"] == 10:
            row.update(p50_us=late, p99_us=late, max_us=late, trials=0, late=300)
    write(tmp_path, "preempt.json", data)
    pause = by_setting(mt.rows_of(str(tmp_path)), "pause latency")
    row = pause[f"10 µs items, {AHEAD}"]
    assert row.verdict == mt.FAILED and "every trial late (300)" in row.measured
    assert pause[f"20 µs items, {AHEAD}"].verdict == mt.NO_TARGET


def test_a_pause_row_says_how_many_trials_were_late():
    """Trials the host released too late are left out of the figures; the row says how
    many, so that a figure of few trials is read as such."""
    data = preempt_now(p99_ahead=15.0)
    for row in data["rows"]:
        if row["variant"] == mt.PAUSE_VARIANT and row["item_us"] == 10:
            row.update(trials=280, late=20)
    rows = mt.pause_rows(mt.Source(data, ""))
    row = next(r for r in rows if r.setting == f"10 µs items, {AHEAD}")
    assert "(280 trials, 20 late, left out)" in row.measured and row.verdict == mt.MET


@pytest.mark.parametrize("pct, verdict", [(0.5, mt.MET), (0.51, mt.MISSED)])
def test_overhead_and_item_overhead_boundaries(tmp_path, pct, verdict):
    pipeline = bench("pipeline")
    for row in pipeline["rows"]:
        row["overhead_pct"] = pct
    items = items_with_copy()
    # The H200 run predates the row of device phases: one made from PageRank's.
    pagerank = next(r for r in items["rows"] if r["task"].startswith("PageRank "))
    device = {
        **pagerank,
        "task": pagerank["task"].replace("PageRank ", "PageRank, device phases: "),
    }
    items["rows"].append(device)
    for row in items["rows"]:
        if row["item_overhead_pct"] is not None:
            row["item_overhead_pct"] = pct * 6  # 3.0 and 3.06 against <= 3%
    write(tmp_path, "pipeline.json", pipeline)
    write(tmp_path, "items.json", items)
    rows = mt.rows_of(str(tmp_path))
    assert {r.verdict for r in rows if r.metric.startswith("training overhead")} == {verdict}
    assert {r.verdict for r in rows if r.metric.startswith("item overhead")} == {verdict}


def test_overhead_rows_say_what_a_close_costs_and_what_the_iterations_were(tmp_path):
    # The H200's JSON predates the per-close column: rows without it keep their text.
    old = bench("pipeline")
    write(tmp_path, "pipeline.json", old)
    before = [r for r in mt.rows_of(str(tmp_path)) if r.metric.startswith("training overhead")]
    assert before and all("a close" not in r.measured for r in before)
    new = bench("pipeline")
    new["settings"].update(closes_per_iteration=16, t_forward_ms=4.0, iterations_per_variant=5)
    for row in new["rows"]:
        row["overhead_us_per_close"] = 12.34 if row["variant"].startswith("freeride") else None
    write(tmp_path, "pipeline.json", new)
    rows = [r for r in mt.rows_of(str(tmp_path)) if r.metric.startswith("training overhead")]
    assert rows and all(r.verdict in (mt.MET, mt.MISSED) for r in rows)
    for r in rows:
        assert " (12.3 µs a close; harvest " in r.measured, r.measured
        assert "5 iterations of 16 closes and 4 ms forwards)" in r.measured, r.measured
    # With bench preempt's gate writes beside it: how much of a close they are (the H200's
    # batch, gate in device memory, ring: 9.08 µs a pair on the training stream).
    write(tmp_path, "preempt.json", preempt_now())
    rows = [r for r in mt.rows_of(str(tmp_path)) if r.metric.startswith("training overhead")]
    for r in rows:
        assert "(12.3 µs a close, the gate writes alone 9.08 µs a pair; harvest " in r.measured


@pytest.mark.parametrize("p50_us, verdict", [(10.0, mt.MET), (10.01, mt.MISSED)])
def test_host_cost_boundary(tmp_path, p50_us, verdict):
    """The host cost per pair is bench hooks' (the metric's definition: the hooks around a
    compute action, bubble record on), judged at its p50."""
    write(tmp_path, "hooks.json", hooks_result(p50_us))
    host = by_setting(mt.rows_of(str(tmp_path)), "host cost")
    compute, attach = (host[setting] for _, setting in mt.HOOK_ROWS)
    assert compute.verdict == attach.verdict == verdict
    assert f"p50 {mt.us(p50_us)} / p99" in compute.measured


def test_a_hooks_row_that_could_not_run_says_why(tmp_path):
    """bench hooks writes its attach() row without figures where torch.distributed is
    missing: the row fails with that reason, h.compute()'s stands."""
    data = hooks_result(8.0)
    data["rows"][1] = {"backend": "cuda", "hooks": "attach()", "unavailable": "no torch (x)"}
    write(tmp_path, "hooks.json", data)
    host = by_setting(mt.rows_of(str(tmp_path)), "host cost")
    compute, attach = (host[setting] for _, setting in mt.HOOK_ROWS)
    assert compute.verdict == mt.MET
    assert attach.verdict == mt.FAILED and "unavailable: no torch (x)" in attach.measured


CALLS_SETTING = "each kind of CUDA call a pair makes, timed alone (hook_cost.py), p50"


def test_the_cuda_calls_of_a_pair_one_by_one(tmp_path):
    """hook_cost.py's "CUDA call" rows in one row without a target: each call's short name
    and p50 (the batch a driver refused, without figures, as a dash); a run whose calls
    could not be timed at all fails with the reason; bench hooks alone (no such rows)
    leaves the row not run."""
    data = hooks_result(8.0)
    data["rows"] += [
        {
            "backend": "cuda",
            "hooks": "CUDA call",
            "part": "device guard (cudaGetDevice): x",
            "pairs": 4096,
            "p50_ns": 40,
            "p99_ns": 90,
            "mean_ns": 45,
        },
        {
            "backend": "cuda",
            "hooks": "CUDA call",
            "part": "gate write (cuStreamBatchMemOp, 4)",
            "unavailable": "the driver refused the batch",
        },
        {
            "backend": "cuda",
            "hooks": "CUDA call",
            "part": "launch (a kernel): at an open",
            "pairs": 4096,
            "p50_ns": 3210,
            "p99_ns": 5000,
            "mean_ns": 3300,
        },
    ]
    write(tmp_path, "hooks.json", data)
    row = by_setting(mt.rows_of(str(tmp_path)), "host cost")[CALLS_SETTING]
    assert row.verdict == mt.NO_TARGET
    assert row.measured == "device guard 0.04, gate write —, launch 3.21 µs"

    data = hooks_result(8.0)
    data["rows"].append({"backend": "cuda", "hooks": "CUDA call", "unavailable": "no device"})
    write(tmp_path, "hooks.json", data)
    row = by_setting(mt.rows_of(str(tmp_path)), "host cost")[CALLS_SETTING]
    assert row.verdict == mt.FAILED and row.measured == "unavailable: no device"

    write(tmp_path, "hooks.json", hooks_result(8.0))
    row = by_setting(mt.rows_of(str(tmp_path)), "host cost")[CALLS_SETTING]
    assert row.verdict == mt.NOT_RUN


def test_host_cost_of_a_cpu_run_of_bench_hooks_is_no_gpu_figure(tmp_path):
    """The host backend's rows (a `--mode cpu` run) measure no CUDA pair: not run."""
    write(tmp_path, "hooks.json", hooks_result(3.0, backend="host"))
    host = by_setting(mt.rows_of(str(tmp_path)), "host cost")
    assert {host[setting].verdict for _, setting in mt.HOOK_ROWS} == {mt.NOT_RUN}


def test_a_run_cut_short(tmp_path):
    # The harvest matrix stopped after two runs, one of which failed; preempt.json was
    # cut mid-write; a probe wrote its figures, then hung in its teardown; another failed
    # before any figure; the G2 probe's opens carried no launch; the pipeline bench
    # exited with an error before writing (run_gpu.sh's stand-in).
    runs = {
        "spin-20ms-8q": {"result": bubbles_result(0.5, queued_ahead=False)},
        "spin-20ms-1q": {"error": "gpu_worker.py queued_bubbles did not finish within 40 s"},
    }
    write(tmp_path, "harvest.json", harvest(runs, complete=False))
    write(tmp_path, "preempt.json", json.dumps(bench("preempt"))[:5000])
    write(tmp_path, "admission_at_open.json", admission(9.0, True, error="Harvester.close() x"))
    failed = {"probe": "probe_admission", "trials": 200, "error": "the Spin task never ran"}
    write(tmp_path, "admission_ring.json", failed)
    write(tmp_path, mt.channels_file("occupancy-cap", "none"), channels(0, carried=0))
    stand_in = {"stand_in": True, "error": "measure_bench_pipeline timed out (its limit)"}
    write(tmp_path, "pipeline.json", stand_in)
    rows = mt.rows_of(str(tmp_path))
    assert len(rows) == ROWS
    h = by_setting(rows, "harvest")
    first, second, *rest = h.values()
    assert first.verdict == mt.MISSED and "NOT queued ahead" in first.measured
    assert second.verdict == mt.FAILED and "did not finish" in second.measured
    assert {r.verdict for r in rest} == {mt.NOT_RUN}
    assert all("not reached" in r.measured for r in rest)
    pause = by_setting(rows, "pause latency")
    assert {r.verdict for r in pause.values()} == {mt.NOT_RUN}
    assert "unreadable" in next(iter(pause.values())).measured
    adm = by_setting(rows, "side admission")
    at_open, ring, poll, watcher, spin = adm.values()
    assert at_open.verdict == mt.MET and "then: Harvester.close()" in at_open.measured
    assert ring.verdict == mt.FAILED and "never ran" in ring.measured
    assert poll.verdict == watcher.verdict == spin.verdict == mt.NOT_RUN
    held = by_setting(rows, "other-stream")
    assert held["occupancy-cap, no lookahead bound"].verdict == mt.FAILED
    overhead = [r for r in rows if r.metric.startswith("training overhead")]
    assert {r.verdict for r in overhead} == {mt.FAILED}
    assert "timed out" in overhead[0].measured
    mt.table(str(tmp_path))  # and the table itself


def test_partial_results_inside_a_json(tmp_path):
    # A preempt JSON that lacks some rows (a run of another version) and harvest results
    # without a share: those rows alone say so.
    data = preempt_now(p99_ahead=25.0)
    data["rows"] = [
        r for r in data["rows"] if r.get("item_us") != 20 and r["variant"] != "admission"
    ]
    write(tmp_path, "preempt.json", data)
    write(tmp_path, "harvest.json", harvest({"spin-20ms-8q": {"result": {"queued_ahead": True}}}))
    rows = mt.rows_of(str(tmp_path))
    pause = by_setting(rows, "pause latency")
    assert pause[f"20 µs items, {AHEAD}"].verdict == mt.NOT_RUN
    assert pause[f"20 µs items, {HOST_ENQUEUED}"].verdict == mt.NOT_RUN
    assert pause[f"10 µs items, {AHEAD}"].verdict == mt.MISSED
    (training,) = [r for r in rows if r.metric.startswith("training-kernel admission")]
    assert training.verdict == mt.FAILED
    assert by_setting(rows, "harvest")[mt.HARVEST_ROWS[0][1]].verdict == mt.FAILED


def test_admission_probe_run_with_the_wrong_setting(tmp_path):
    write(tmp_path, "admission_ring.json", admission(5.0, True))  # launches at opens on
    adm = by_setting(mt.rows_of(str(tmp_path)), "side admission")
    ring = adm["host-started: executor, ring (FREERIDE_LAUNCH_AT_OPEN=0)"]
    assert ring.verdict == mt.FAILED


@pytest.mark.parametrize(
    "name, ran, setting",
    [
        ("admission_spin.json", "ring", mt.SPIN_SETTING),
        ("admission_poll.json", "spin", "host-started: executor, FREERIDE_ADMISSION=poll"),
        ("admission_ring.json", "poll", RING + " (FREERIDE_LAUNCH_AT_OPEN=0)"),
    ],
)
def test_an_admission_row_is_of_its_mode(tmp_path, name, ran, setting):
    """A row's figure comes from a probe run under its FREERIDE_ADMISSION (the harvester's
    own report, `admission`), or the row fails naming what ran."""
    write(tmp_path, name, admission(5.0, False, mode=ran))
    row = by_setting(mt.rows_of(str(tmp_path)), "side admission")[setting]
    assert row.verdict == mt.FAILED and f"ran with admission {ran}" in row.measured, row


def test_the_spin_row_says_what_it_costs_the_host(tmp_path):
    rows = mt.rows_of(str(full_folder(tmp_path)))
    row = by_setting(rows, "side admission")[mt.SPIN_SETTING]
    assert row.verdict == mt.MET and "1.00 CPU-s a second" in row.measured, row


@pytest.mark.parametrize(
    "name, data, why",
    [
        # The watcher's row from a run without the switch, and ones whose watcher enqueued
        # nothing or few of the launches, or that did not count them (a build without it,
        # or a rule that seldom let it): the executor's figure, not the watcher's.
        ("admission_watcher.json", admission(5.0, False), "FREERIDE_WATCHER_LAUNCH unset"),
        (
            "admission_watcher.json",
            admission(5.0, False, True, watcher_launches=0),
            "enqueued 0 of 200",
        ),
        (
            "admission_watcher.json",
            admission(5.0, False, True, watcher_launches=2),
            "enqueued 2 of 200",
        ),
        (
            "admission_watcher.json",
            admission(5.0, False, True, watcher_launches=None),
            "no count of the watcher's launches",
        ),
        ("admission_watcher.json", admission(5.0, True, True), "launches at opens True"),
        # The executor's ring row from a run with the watcher's launch on.
        ("admission_ring.json", admission(5.0, False, True), "FREERIDE_WATCHER_LAUNCH 1"),
    ],
)
def test_the_watcher_row_is_of_its_setting(tmp_path, name, data, why):
    write(tmp_path, name, data)
    adm = by_setting(mt.rows_of(str(tmp_path)), "side admission")
    key = mt.WATCHER_SETTING if "watcher" in name else RING + " (FREERIDE_LAUNCH_AT_OPEN=0)"
    row = adm[key]
    assert row.verdict == mt.FAILED and why in row.measured, row


@pytest.mark.parametrize("served, shown", [(None, False), (0, False), (7, True)])
def test_the_device_started_row_says_how_many_opens_the_executor_served(tmp_path, served, shown):
    # A launch at an open left out because the executor launched for it first: that
    # trial's open was host-started after all (a probe before the count has none).
    write(tmp_path, "admission_at_open.json", admission(5.0, True, served_by_executor=served))
    rows = by_setting(mt.rows_of(str(tmp_path)), "side admission")
    row = rows["device-started: launches at opens (default)"]
    assert row.verdict == mt.MET
    assert ("7 opens' launches left out, the executor's there first" in row.measured) is shown


def test_the_watcher_row_reads_its_launch_count(tmp_path):
    rows = mt.rows_of(str(full_folder(tmp_path)))
    row = by_setting(rows, "side admission")[mt.WATCHER_SETTING]
    assert row.verdict == mt.MET and "190 launches the watcher's" in row.measured


def _probe_module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))
    try:
        return _load(name, ROOT / "benchmarks" / "probes" / f"{name}.py")
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "probes"))


def test_the_admission_split_takes_only_stamps_of_the_trials_open(tmp_path):
    """probe_admission's split of a host-started admission: a gap counts only where both
    of its readings are of the trial's own open (an older open's stamp: the step did not
    happen for this one); its parts reach the row, with the steps no trial had left out."""
    probe = _probe_module("probe_admission")
    parts: dict = {}
    ms = 1_000_000
    stamps = {"reached": (7, 2 * ms), "woke": (7, 3 * ms), "launched": (6, 9 * ms)}
    probe.split_admission(parts, stamps, 7, 1 * ms, 5 * ms)
    # The launch's stamp is of open 6: the chain skips it, woke->items spans its place.
    assert parts == {"seen->reached": [1000.0], "reached->woke": [1000.0], "woke->items": [2000.0]}
    probe.split_admission(parts, None, 7, 1 * ms, 5 * ms)  # a build without stamps
    probe.split_admission(parts, {"reached": None, "woke": None, "launched": None}, 7, 0, ms)
    assert parts["seen->items"] == [1000.0] and sum(map(len, parts.values())) == 4
    del parts["seen->items"]
    summary = {name: {"trials": len(v), "p50_us": v[0]} for name, v in parts.items()}
    assert probe.parts_text(summary) == (
        "seen->reached 1000 (1), reached->woke 1000 (1), woke->items 2000 (1)"
    )
    folder = full_folder(tmp_path)
    data = json.loads((folder / "admission_ring.json").read_text())
    write(folder, "admission_ring.json", {**data, "parts": summary})
    row = by_setting(mt.rows_of(str(folder)), "side admission")[
        RING + " (FREERIDE_LAUNCH_AT_OPEN=0)"
    ]
    assert "split, p50: seen→reached 1,000, reached→woke 1,000, woke→items 2,000 µs" in row.measured


def test_a_max_slices_run_is_of_its_setting(tmp_path):
    """The max_slices=16 rows take a run whose harvester had 16 (its result says so); a run
    of a build without the argument, or with the default, fails naming what ran."""
    key = "spin-20ms-8q-slices16"
    for ran in (None, 8):
        result = bubbles_result(0.9) if ran is None else bubbles_result(0.9, max_slices=ran)
        write(tmp_path, "harvest.json", harvest({key: {"result": result}}))
        row = by_setting(mt.rows_of(str(tmp_path)), "harvest")[dict(mt.HARVEST_ROWS)[key]]
        assert row.verdict == mt.FAILED and f"ran with max_slices {ran}" in row.measured, row
    write(tmp_path, "harvest.json", harvest({key: {"result": harvest_result(key, 0.9)}}))
    row = by_setting(mt.rows_of(str(tmp_path)), "harvest")[dict(mt.HARVEST_ROWS)[key]]
    assert row.verdict == mt.MET and "run on 32 ms at most" in row.measured, row


GREEN_RESERVE = "green-context (120 of 132 SMs)"


@pytest.mark.parametrize(
    ("had", "reserve", "verdict", "text"),
    [
        ("balanced", GREEN_RESERVE, mt.MET, "0 of 24 held"),
        (
            "shared (balanced not had: the driver is CUDA 13.0)",
            GREEN_RESERVE,
            mt.NOT_RUN,
            "not had: shared (balanced not had: the driver is CUDA 13.0)",
        ),
        (None, "occupancy-cap", mt.NOT_RUN, "no green context: the reserve was occupancy-cap"),
        (None, GREEN_RESERVE, mt.NOT_RUN, "no workqueue report"),
    ],
)
def test_the_green_contexts_own_workqueues_row(tmp_path, had, reserve, verdict, text):
    """G2's probe with FREERIDE_GREEN_WORKQUEUE=balanced measures the setting only where
    the harvester had the workqueues (a CUDA 13.1 driver); elsewhere the row says why not,
    and is not counted as met."""
    write(
        tmp_path, mt.BALANCED_CHANNELS, channels(0) | {"green_workqueues": had, "reserve": reserve}
    )
    row = by_setting(mt.rows_of(str(tmp_path)), "other-stream")[mt.BALANCED_SETTING]
    assert row.verdict == verdict and text in row.measured, row


def test_harvest_rows_are_the_matrix_runs():
    matrix = _probe_module("probe_harvest_matrix")
    assert [r[0] for r in matrix.RUNS] == [key for key, _ in mt.HARVEST_ROWS]
    for key, _label, mode, env, args in matrix.RUNS:
        assert mode == ("queued_phases" if key.startswith("phases") else "queued_bubbles")
        assert (env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1") == ("-1q" in key)
        if mode == "queued_phases":
            # Device phases are the default (no switch set); the phases-ahead runs turn
            # them off, or they would serve every phase and measure nothing of their own.
            device = env.get("FREERIDE_DEVICE_PHASES", "1")
            assert device == ("1" if "-device" in key else "0")
            assert env.get("FREERIDE_PHASES_AHEAD", "0") == ("0" if "-device" in key else key[-1])
        assert args.get("recv_ms", 20.0) >= 0.2  # the target's bubbles: >= 200 us
        assert ("max_slices" in args) == key.endswith("-slices16")
        assert args.get("max_slices", 16) == 16


def test_main_prints_and_writes_the_table(tmp_path, capsys):
    folder = full_folder(tmp_path / "in")
    out = tmp_path / "table.md"
    assert mt.main([str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert printed.startswith("Measured in one run (issue 36): NVIDIA H200, commit 51c0fe7")
    assert "| metric | setting | measured | target | verdict |" in printed


def test_run_gpu_sh_measure_step_writes_what_the_table_reads():
    script = ROOT / "benchmarks" / "run_gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert 'STEPS="build measure"' in text and "MEASURE_BUDGET:-480" in text
    assert '--out "$m/$bench.json"' in text  # measure_bench's output
    for name in mt.FILES.values():
        stem = name.removesuffix(".json")
        assert f'"$m/{name}"' in text or f"measure_bench $deadline {stem} " in text, name
    assert '"$m/channels_${r}_lookahead_${la}.json"' in text
    assert f'"$m/{mt.BALANCED_CHANNELS}"' in text
    assert f"for r in {' '.join(mt.RESERVES)}; do" in text
    assert f"for la in {' '.join(mt.LOOKAHEADS)}; do" in text
    assert 'benchmarks/measure_table.py "$m"' in text


def test_probe_percentile_matches_the_benchmarks():
    np = pytest.importorskip("numpy")
    probe = _load("_probe", ROOT / "benchmarks" / "probes" / "_probe.py")
    rng = np.random.default_rng(0)
    for values in ([3.0], [1.0, 2.0], list(rng.random(7)), list(rng.exponential(10, 200))):
        for q in (50, 90, 99):
            assert math.isclose(probe.percentile(values, q), np.percentile(values, q))


def test_open_gate_rate_of_a_many_phase_task():
    # tests/gpu_worker.py's _open_gate_rate on a stand-in handle: items at a steady rate
    # after a slow start, and a pause at every phase boundary the rate must include.
    import time

    from gpu_worker import _open_gate_rate

    class Task:
        total, rate = 60_000, 1e6  # 60 ms of items in 6 phases, a 2 ms boundary each

        def __init__(self):
            self.t0 = time.perf_counter() + 0.005  # the first launch's admission

        @property
        def items_done(self):
            elapsed = time.perf_counter() - self.t0
            if elapsed <= 0:
                return 0
            phase, within = divmod(elapsed, 0.012)
            done = phase * 10_000 + min(within, 0.010) * self.rate
            return int(min(done, self.total))

        def done(self):
            return self.items_done >= self.total

    got = _open_gate_rate(Task(), Task.total)
    # 10,000 items every 12 ms: 833k/s, not the 1M/s of a phase alone; the host's
    # sampling on a busy 2-core machine leaves it within a few percent.
    assert got == pytest.approx(10_000 / 0.012, rel=0.1)


def _item(task: str, pct: float) -> dict:
    return {"task": task, "item_overhead_pct": pct, "plain_ms": 10.0, "preemptible_ms": 11.0}


def test_pagerank_rows_with_device_phases_the_default():
    """bench items since device phases became the default: its "PageRank" row runs with
    them, and "PageRank, one launch a phase" (FREERIDE_DEVICE_PHASES=0) without; each is
    its own table row, named for what it ran, although both names start with "PageRank";
    a missing one says not run."""
    newer = {"device_phases": True}
    both = mt.Source(
        {
            "rows": [
                _item("PageRank, one launch a phase: 50 nodes x2, 5 iters", 9.0),
                _item("PageRank 50 nodes x2, 5 iters", 1.0),
            ],
            "settings": newer,
        },
        "",
    )
    items = {r.setting: r for r in mt.item_rows(both)}
    assert items["PageRank, device phases (default): 50 nodes x2, 5 iters"].verdict == mt.MET
    assert items["PageRank, one launch a phase: 50 nodes x2, 5 iters"].verdict == mt.MISSED
    alone = mt.Source(
        {"rows": [_item("PageRank 50 nodes x2, 5 iters", 1.0)], "settings": newer}, ""
    )
    settings = {r.setting: r.verdict for r in mt.item_rows(alone)}
    assert settings["PageRank, one launch a phase"] == mt.NOT_RUN
    assert settings["PageRank, device phases (default): 50 nodes x2, 5 iters"] == mt.MET


def test_pagerank_rows_of_a_result_from_before_device_phases_were_the_default():
    """Before 2026-11-28 (no settings.device_phases) bench items' "PageRank" row ran one
    launch a phase and its "PageRank, device phases" row, where there is one, ran with
    them (FREERIDE_DEVICE_PHASES=1): the table names each for what it ran, as it names a
    newer result's."""
    older = mt.Source(
        {
            "rows": [
                _item("PageRank, device phases: 50 nodes x2, 5 iters", 1.0),
                _item("PageRank 50 nodes x2, 5 iters", 9.0),
            ]
        },
        "",
    )
    items = {r.setting: r for r in mt.item_rows(older)}
    assert items["PageRank, device phases (default): 50 nodes x2, 5 iters"].verdict == mt.MET
    assert items["PageRank, one launch a phase: 50 nodes x2, 5 iters"].verdict == mt.MISSED


def test_the_launch_at_open_host_cost_adds_the_launch_to_the_pair(tmp_path):
    """The pair with the launch an open enqueues: bench hooks' h.compute() pair, or in a
    run without it the ring row's gate writes (their loop's training kernels taken off),
    plus the launch; never the launch variant's "no task" row, which before 2026-11-28
    still held a training kernel's launch per pair (the H200's 28.5 µs against the ring
    row's 16.7)."""
    data = preempt_now()
    for row in data["rows"]:
        if row.get("metric") == "close+open host cost" and row.get("admission") == "ring":
            row.update(p50_us=6.0, p99_us=7.0)
    base = {"variant": "launch at open", "mechanism": "batch", "gate": "device", "item_us": 0}
    data["rows"] = [r for r in data["rows"] if r.get("variant") != "launch at open"] + [
        {
            **base,
            "metric": "launch at open host cost",
            "p50_us": 3.5,
            "p99_us": 5.0,
            "opens_with_launch": 78,
            "opens": 80,
        },
        {**base, "metric": "close+open host cost, no task", "p50_us": 28.5, "p99_us": 29.6},
    ]
    write(tmp_path, "preempt.json", data)
    launch = "hooks: h.compute() with the side launch an open enqueues (launch at open)"
    row = by_setting(mt.rows_of(str(tmp_path)), "host cost")[launch]
    assert row.measured.startswith("gate writes alone (no bench hooks in this run) 6.00 + ")
    assert "launch 3.50 = 9.50 µs" in row.measured
    assert "78 of 80 opens carried one" in row.measured
    assert row.verdict == mt.MET
    # With bench hooks in the run, its h.compute() pair is the pair.
    write(tmp_path, "hooks.json", hooks_result(7.0))
    row = by_setting(mt.rows_of(str(tmp_path)), "host cost")[launch]
    assert row.measured.startswith("pair (bench hooks) 7.00 + launch 3.50 = 10.5 µs")
    assert row.verdict == mt.MISSED


def test_a_harvest_run_that_did_not_run_its_settings_device_phases_fails(tmp_path):
    """The many-phase runs say whether their harvester took device phases (gpu_worker's
    queued_phases): a device-phases row measured without them, or a phases-ahead row
    measured with them (the switch not set where the default changed), is not that
    setting's figure."""
    off = {**bubbles_result(0.9), "phases_in_bubbles": 5, "device_phases": False}
    on = {**off, "device_phases": True}
    runs = {
        "phases-20ms-8q-device1": {"result": off},
        "phases-20ms-1q-device1": {"result": on},
        "phases-20ms-8q-ahead0": {"result": on},
        "phases-20ms-1q-ahead0": {"result": off},
    }
    write(tmp_path, "harvest.json", harvest(runs))
    rows = {r.setting: r for r in mt.harvest_rows(mt.load(str(tmp_path), "harvest.json"))}
    label = dict(mt.HARVEST_ROWS)
    bad = rows[label["phases-20ms-8q-device1"]]
    assert bad.verdict == mt.FAILED and "device phases off: not this setting" in bad.measured
    assert rows[label["phases-20ms-1q-device1"]].verdict == mt.MET
    assert rows[label["phases-20ms-8q-ahead0"]].verdict == mt.FAILED
    assert rows[label["phases-20ms-1q-ahead0"]].verdict == mt.MET


def test_harvest_rows_give_the_share_of_one_bubbles_rate_beside(tmp_path):
    """Spin's runs also say what share of one launch's rate in a 10 ms bubble they ran (the
    open gate's rate pays a relaunch at every slice end); the verdict stays on the open
    gate's share, the issue's metric."""
    result = {**bubbles_result(0.80), "harvest_of_bubble_rate": 0.75, "bubble_items_per_s": 6.4e7}
    write(tmp_path, "harvest.json", harvest({"spin-20ms-8q": {"result": result}}))
    row = mt.harvest_rows(mt.load(str(tmp_path), "harvest.json"))[0]
    assert "75.0% of one 10 ms bubble's rate (64,000,000 items/s)" in row.measured
    assert row.verdict == mt.MISSED and "80.0%" in row.measured
