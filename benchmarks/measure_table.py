"""The table of benchmarks/run_gpu.sh's `measure` step: every figure of issue 36's
"measured in one run" against its target.

    python3 benchmarks/measure_table.py DIR [--out FILE]

Reads what the step wrote into DIR (the file names are FILES and channels_file() below):
the JSON of `freeride bench preempt|pipeline|items|hooks`, of probes/probe_admission.py (at
opens, the executor's ring, poll, the watcher's launch), of probes/probe_channels.py (each reserve, with the
lookahead bound unset and 1) and of probes/probe_harvest_matrix.py, and prints one
markdown table: metric, setting, measured value, target, verdict. Verdicts: `met`,
`missed`, `not run` (no output: not started, or cut short before writing), `failed` (it
ran and gave no figure, or a figure that does not measure the metric) and `no target`
(reported for reference). Every figure shown is one of the inputs', or a ratio or sum of
two of them where the cell says so (a bandwidth's share of the copy's; a pair's host cost
plus its launch's). A missing or truncated input leaves its rows `not run` (`failed`
where run_gpu.sh's stand-in says the item exited with an error) and never stops the
table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from typing import Any, NamedTuple

MET, MISSED, NOT_RUN, FAILED, NO_TARGET = "met", "missed", "not run", "failed", "no target"

FILES = {
    "preempt": "preempt.json",
    "pipeline": "pipeline.json",
    "items": "items.json",
    "hooks": "hooks.json",
    "harvest": "harvest.json",
    "admission_at_open": "admission_at_open.json",
    "admission_ring": "admission_ring.json",
    "admission_poll": "admission_poll.json",
    "admission_watcher": "admission_watcher.json",
    "admission_spin": "admission_spin.json",
}
RESERVES = ("occupancy-cap", "green-context")
LOOKAHEADS = ("none", "1")  # FREERIDE_MAX_LOOKAHEAD unset, and 1


def channels_file(reserve: str, lookahead: str) -> str:
    return f"channels_{reserve}_lookahead_{lookahead}.json"


# G2's probe in a green context with workqueues of its own (FREERIDE_GREEN_WORKQUEUE=
# balanced, CUDA 13.1 drivers), no lookahead bound.
BALANCED_CHANNELS = "channels_green-context_workqueues_balanced.json"
BALANCED_SETTING = "green-context with its own workqueues (FREERIDE_GREEN_WORKQUEUE=balanced)"


# Targets (benchmarks/README.md, issue 36).
PAUSE_ITEM_US = (1, 5, 10, 20, 100)
PAUSE_TARGET = (10, 20.0)  # p99 <= 20 us with 10 us items
DEVICE_ADMISSION_US = 10.0
HOST_ADMISSION_US = 30.0
HARVEST_SHARE = 0.85
OVERHEAD_PCT = 0.5
ITEM_OVERHEAD_PCT = 3.0
PAIR_HOST_US = 10.0
TRAINING_ADMISSION_US = 10.0
# The executor sleeps through compute: with every open rung its own looks at the gate's
# mirror are a 20 ms backstop, 50 a second (1 ms looks, 1,000 a second, before).
EXECUTOR_WAKEUPS_PER_S = 100.0

PAUSE_VARIANT = "freeride, gate in device memory"
# bench preempt's (freeride/cli/bench/preempt.py): the suffix of the variant measured with
# the host enqueuing the close as the GPU waits, and settings["pause_from"], present where
# the pause is measured from the close taking effect (a marker holds the stream until the
# close is queued). A result without it is of the older bench, whose only pause rows had
# the clock start before the host's close call: those are the host-enqueued rows here.
HOST_ENQUEUED = ", close enqueued as the GPU waits"
# The harvest matrix's runs, one row each (probes/probe_harvest_matrix.py's RUNS keys).
HARVEST_ROWS = (
    ("spin-20ms-8q", "single-phase Spin, 5 bubbles of 20 ms, 8 queues (default)"),
    ("spin-20ms-1q", "single-phase Spin, 5 bubbles of 20 ms, 1 queue"),
    (
        "phases-20ms-8q-device1",
        "30-phase ItemCounter, 20 ms bubbles, 8 queues, device phases (default)",
    ),
    (
        "phases-20ms-1q-device1",
        "30-phase ItemCounter, 20 ms bubbles, 1 queue, device phases (default)",
    ),
    ("spin-0.5ms-8q", "single-phase Spin, 20 bubbles of 0.5 ms, 8 queues (default)"),
    ("spin-0.5ms-1q", "single-phase Spin, 20 bubbles of 0.5 ms, 1 queue"),
    ("spin-20ms-8q-slices16", "single-phase Spin, 5 bubbles of 20 ms, 8 queues, max_slices=16"),
    ("spin-20ms-1q-slices16", "single-phase Spin, 5 bubbles of 20 ms, 1 queue, max_slices=16"),
    (
        "phases-20ms-8q-ahead0",
        "30-phase ItemCounter, 20 ms bubbles, 8 queues, device phases off, phases ahead off",
    ),
    (
        "phases-20ms-1q-ahead0",
        "30-phase ItemCounter, 20 ms bubbles, 1 queue, device phases off, phases ahead off",
    ),
    (
        "phases-20ms-8q-ahead1",
        "30-phase ItemCounter, 20 ms bubbles, 8 queues, device phases off, phases ahead on",
    ),
    (
        "phases-20ms-1q-ahead1",
        "30-phase ItemCounter, 20 ms bubbles, 1 queue, device phases off, phases ahead on",
    ),
)
PIPELINE_TASKS = ("saxpy", "blur", "pagerank", "spin")
PIPELINE_CONNECTIONS = (("default", "8 queues (default)"), ("1", "1 queue"))
ITEM_TASKS = ("Saxpy float32", "Saxpy float64", "PageRank", "GaussianBlur", "Resize")
# bench items' PageRank rows (freeride/cli/bench/items.py): where settings.device_phases
# says so (since 2026-11-28) the default row ran with device phases and PHASE_LAUNCHES one
# launch a phase; before, the default row ran one launch a phase and OLD_DEVICE_PHASES
# (where there is one) with device phases.
PHASE_LAUNCHES = "PageRank, one launch a phase"
OLD_DEVICE_PHASES = "PageRank, device phases"
BANDWIDTH_TASKS = ("Saxpy float32", "Saxpy float64", "GaussianBlur")
COPY_PREFIX = "copy"


class Row(NamedTuple):
    metric: str
    setting: str
    measured: str
    target: str
    verdict: str


class Source(NamedTuple):
    """One input: its data, or why there is none (`missing`: the text for its rows;
    `failed`: the item ran and failed, as the stand-in run_gpu.sh writes for an item that
    exited with an error before writing its output says)."""

    data: Any
    missing: str
    failed: bool = False


def load(folder: str, name: str) -> Source:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return Source(None, f"no {name}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        return Source(None, f"{name} unreadable (cut short?): {type(exc).__name__}")
    if isinstance(data, dict) and data.get("stand_in"):
        return Source(None, str(data.get("error", "failed")), failed=True)
    return Source(data, "")


def judge(ok: bool) -> str:
    return MET if ok else MISSED


def us(value: float) -> str:
    """Microseconds as the table shows them."""
    if abs(value) < 10:
        return f"{value:.2f}"
    if abs(value) < 1000:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _num(value: Any) -> bool:
    """A figure: a finite number (NaN or infinity, as a JSON may carry, is none)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _not_run(metric: str, setting: str, target: str, source: Source) -> Row:
    """The row of a figure the inputs lack: not run, or failed where the item failed."""
    verdict = FAILED if source.failed else NOT_RUN
    return Row(metric, setting, source.missing or "absent from the output", target, verdict)


# -- the rows, in the order of the list -------------------------------------------


def pause_rows(preempt: Source) -> list[Row]:
    """The pause as defined (from the close taking effect: the target applies), then as
    the training thread sees it where the GPU waits for the host to enqueue the close
    (that call in the figure: no target; the host cost rows hold its target)."""
    metric = "pause latency p50 / p99 / max"
    data = preempt.data or {}
    ahead = bool((data.get("settings") or {}).get("pause_from"))
    found: dict[str, dict] = {"ahead": {}, "host": {}}
    for r in data.get("rows", []):
        if r.get("variant") == PAUSE_VARIANT:
            found["ahead" if ahead else "host"][r.get("item_us")] = r
        elif r.get("variant") == PAUSE_VARIANT + HOST_ENQUEUED:
            found["host"][r.get("item_us")] = r
    rows = []
    for kind, suffix in (("ahead", "close queued ahead"), ("host", HOST_ENQUEUED[2:])):
        for item in PAUSE_ITEM_US:
            setting = f"{item} µs items, gate in device memory, {suffix}"
            target, limit = ("—", None)
            if kind == "ahead" and item == PAUSE_TARGET[0]:
                target, limit = f"p99 ≤ {PAUSE_TARGET[1]:g} µs", PAUSE_TARGET[1]
            r = found[kind].get(item)
            if r is None and kind == "ahead" and preempt.data is not None and not ahead:
                why = (
                    "not measured: an older bench preempt, its clock started before the close call"
                )
                rows.append(Row(metric, setting, why, target, NOT_RUN))
                continue
            if r is None:
                rows.append(_not_run(metric, setting, target, preempt))
                continue
            if not _num(r.get("p99_us")):  # it ran: every trial late (the host stalled)
                why = f"no figure: every trial late ({r.get('late', 'count not given')})"
                rows.append(Row(metric, setting, why, target, FAILED))
                continue
            late = f", {r['late']} late, left out" if r.get("late") else ""
            measured = (
                f"{us(r['p50_us'])} / {us(r['p99_us'])} / {us(r['max_us'])} µs "
                f"({r.get('trials')} trials{late})"
            )
            verdict = NO_TARGET if limit is None else judge(r["p99_us"] <= limit)
            rows.append(Row(metric, setting, measured, target, verdict))
    return rows


def _not_this_setting(d: dict, at_opens: bool, watcher: bool, admission: str = "ring") -> str:
    """Why probe_admission's output `d` is not of the row's setting ("" where it is)."""
    if d.get("launches_at_opens") is not None and d["launches_at_opens"] != at_opens:
        return f"ran with launches at opens {d['launches_at_opens']}: not this setting"
    if d.get("admission") is not None and d["admission"] != admission:
        return f"ran with admission {d['admission']}: not this setting"
    ran = (d.get("env") or {}).get("FREERIDE_WATCHER_LAUNCH", "unset") == "1"
    if ran != watcher:
        return f"ran with FREERIDE_WATCHER_LAUNCH {'1' if ran else 'unset'}: not this setting"
    if watcher:
        # Most trials' launches must be the watcher's, or the figure is the executor's.
        launched, kept = d.get("watcher_launches"), d.get("kept")
        if not _num(launched):
            return "no count of the watcher's launches: not this setting"
        if _num(kept) and launched * 2 < kept:
            return f"the watcher enqueued {launched} of {kept} trials' launches: not this setting"
    return ""


def _split_text(parts) -> str:
    """probe_admission's split of its delays (its `parts`: each step's p50 and how many
    trials had it), as "seen→reached 180, reached→woke 30 µs"; "" where none was had."""
    if not isinstance(parts, dict):
        return ""
    shown = [
        f"{name.replace('->', '→')} {us(p['p50_us'])}"
        for name, p in parts.items()
        if isinstance(p, dict) and p.get("trials") and _num(p.get("p50_us"))
    ]
    return ", ".join(shown) + " µs" if shown else ""


WATCHER_SETTING = (
    "host-started: the watcher launches, one wake-up "
    "(FREERIDE_LAUNCH_AT_OPEN=0, FREERIDE_WATCHER_LAUNCH=1)"
)


RING_SETTING = "host-started: executor, ring (FREERIDE_LAUNCH_AT_OPEN=0)"
SPIN_SETTING = (
    "host-started: executor, FREERIDE_ADMISSION=spin (a host core while a task waits; "
    "FREERIDE_LAUNCH_AT_OPEN=0)"
)


def side_admission_rows(
    at_open: Source, ring: Source, poll: Source, watcher: Source, spin: Source
) -> list[Row]:
    metric = "side admission p50 / p99 (open seen → first items)"
    device, host = DEVICE_ADMISSION_US, HOST_ADMISSION_US
    cases = (
        (at_open, "device-started: launches at opens (default)", device, True, False, "ring"),
        (ring, RING_SETTING, host, False, False, "ring"),
        (poll, "host-started: executor, FREERIDE_ADMISSION=poll", host, False, False, "poll"),
        (watcher, WATCHER_SETTING, host, False, True, "ring"),
        (spin, SPIN_SETTING, host, False, False, "spin"),
    )
    rows = []
    for source, setting, limit, at_opens, watcher_on, admission in cases:
        target = f"p99 ≤ {limit:g} µs"
        d = source.data
        if d is None:
            rows.append(_not_run(metric, setting, target, source))
            continue
        wrong = _not_this_setting(d, at_opens, watcher_on, admission)
        if wrong:
            rows.append(Row(metric, setting, wrong, target, FAILED))
            continue
        if not _num(d.get("p99_us")):
            why = d.get("error") or f"every trial stuck ({d.get('stuck')})"
            rows.append(Row(metric, setting, f"no figure: {why}", target, FAILED))
            continue
        measured = (
            f"{us(d['p50_us'])} / {us(d['p99_us'])} µs ({d.get('kept')} of {d.get('trials')} "
            f"trials, stuck {d.get('stuck')})"
        )
        if watcher_on and _num(d.get("watcher_launches")):
            measured += f"; {d['watcher_launches']} launches the watcher's"
        if at_opens and _num(d.get("served_by_executor")) and d["served_by_executor"] > 0:
            served = d["served_by_executor"]
            measured += f"; {served} opens' launches left out, the executor's there first"
        if admission == "spin" and _num(d.get("closed_cpu_per_s")):
            measured += f"; gate closed, task waiting: {d['closed_cpu_per_s']:.2f} CPU-s a second"
        split = _split_text(d.get("parts"))
        if split:
            measured += f"; split, p50: {split}"
        if d.get("error"):
            measured += f"; then: {d['error']}"
        rows.append(Row(metric, setting, measured, target, judge(d["p99_us"] <= limit)))
    return rows


def harvest_rows(harvest: Source) -> list[Row]:
    metric = "harvest of open-gate time, queued bubbles"
    target = f"≥ {HARVEST_SHARE:.0%}"
    data = harvest.data or {}
    runs = {r.get("key"): r for r in data.get("runs", [])}
    rows = []
    for key, setting in HARVEST_ROWS:
        run = runs.get(key)
        if run is None:
            missing = harvest
            if harvest.data is not None:
                planned = key in data.get("planned", [key])
                why = "not reached (budget, or cut short)" if planned else "not in the run's plan"
                missing = Source(None, why)
            rows.append(_not_run(metric, setting, target, missing))
            continue
        r = run.get("result")
        if not isinstance(r, dict) or not _num(r.get("harvest_share")):
            why = run.get("error") or "no harvest share in the worker's result"
            rows.append(Row(metric, setting, f"no figure: {why}", target, FAILED))
            continue
        share = r["harvest_share"]
        items = r.get("items_in_bubbles")
        measured = f"{share:.1%} ({f'{items:,}' if _num(items) else items} items in the bubbles"
        if _num(r.get("open_gate_items_per_s")):
            measured += f"; open gate {r['open_gate_items_per_s']:,.0f} items/s"
        measured += ")"
        if _num(r.get("harvest_of_bubble_rate")):
            # The open gate's rate (the gate opened from the host) pays a relaunch at every
            # slice end; one launch in a bubble shorter than the bound does not.
            measured += (
                f"; {r['harvest_of_bubble_rate']:.1%} of one 10 ms bubble's rate "
                f"({r.get('bubble_items_per_s', 0):,.0f} items/s)"
            )
        if r.get("queued_ahead") is False:
            measured += "; NOT queued ahead: the GPU caught up with the host"
        wanted = key.startswith("phases") and "-device" in key
        if key.startswith("phases") and r.get("device_phases", wanted) != wanted:
            ran = "on" if r["device_phases"] else "off"
            why = f"{measured}; ran with device phases {ran}: not this setting"
            rows.append(Row(metric, setting, why, target, FAILED))
            continue
        slices = 16 if key.endswith("-slices16") else None
        if slices is not None and r.get("max_slices") != slices:
            why = f"{measured}; ran with max_slices {r.get('max_slices')}: not this setting"
            rows.append(Row(metric, setting, why, target, FAILED))
            continue
        if _num(r.get("slice_bound")):
            measured += f"; launches run on {r['slice_bound'] * 1e3:g} ms at most"
        if "phases_in_bubbles" in r:
            measured += f"; {r['phases_in_bubbles']} phases in the bubbles"
            if r.get("violations_in_bubbles") or r.get("violations"):
                measured += f"; item protocol VIOLATED ({r.get('violations')})"
            if r.get("finished") is False or r.get("counts_all_one") is False:
                measured += "; NOT every item once"
        rows.append(Row(metric, setting, measured, target, judge(share >= HARVEST_SHARE)))
    return rows


def held_rows(channels: dict[tuple[str, str], Source], balanced: Source) -> list[Row]:
    rows = []
    for reserve in RESERVES:
        for lookahead in LOOKAHEADS:
            bound = "no lookahead bound" if lookahead == "none" else f"lookahead bound {lookahead}"
            rows.append(_held_row(f"{reserve}, {bound}", channels[(reserve, lookahead)]))
    d = balanced.data
    had = None if d is None else d.get("green_workqueues")
    if d is not None and had != "balanced" and not d.get("error"):
        # The driver gave none (before CUDA 13.1), the green context fell back, or this
        # build cannot ask: nothing of the setting was measured.
        reserve = str(d.get("reserve"))
        if had:
            why = f"not had: {had}"
        elif "reserve" in d and not reserve.startswith("green-context"):
            why = f"no green context: the reserve was {reserve}"
        else:
            why = "no workqueue report in the probe's output"
        rows.append(Row(HELD_METRIC, BALANCED_SETTING, why, HELD_TARGET, NOT_RUN))
    else:
        rows.append(_held_row(BALANCED_SETTING, balanced))
    return rows


HELD_METRIC = "other-stream kernels held (G2 probe)"
HELD_TARGET = "0 of 24"


def _held_row(setting: str, source: Source) -> Row:
    """One run of probe_channels.py: how many of the other streams' kernels waited."""
    d = source.data
    if d is None:
        return _not_run(HELD_METRIC, setting, HELD_TARGET, source)
    if not _num(d.get("held")):
        why = d.get("error") or "no count in the output"
        return Row(HELD_METRIC, setting, f"no figure: {why}", HELD_TARGET, FAILED)
    others, never = d.get("others", 24), d.get("never_done", 0)
    carried = d.get("launches_at_these_opens")
    measured = (
        f"{d['held']} of {others} held, {never} never done; {d.get('opens')} opens: "
        f"{carried} carried a launch, {d.get('beyond_lookahead')} left without "
        "(beyond the bound)"
    )
    if d.get("launches_at_opens") and carried == 0:
        measured += "; the opens carried no launch: tests nothing"
        return Row(HELD_METRIC, setting, measured, HELD_TARGET, FAILED)
    if d.get("error"):
        measured += f"; then: {d['error']}"
    return Row(HELD_METRIC, setting, measured, HELD_TARGET, judge(d["held"] == never == 0))


def overhead_rows(pipeline: Source, preempt: Source | None = None) -> list[Row]:
    """bench pipeline's overhead per side task and hardware queues; with what a close cost
    training where the run says, and beside it what the gate's writes alone take on the
    training stream (bench preempt's close+open cost, no side work): the rest of a close's
    cost is the pause, about the item in flight."""
    metric = "training overhead (bench pipeline)"
    target = f"≤ {OVERHEAD_PCT:g}%"
    found = {}
    for r in (pipeline.data or {}).get("rows", []):
        found[(r.get("variant"), str(r.get("connections")))] = r
    settings = (pipeline.data or {}).get("settings") or {}
    iters = settings.get("iterations_per_variant")
    # What the percentage is of: each close costs about an item in flight, whatever the
    # actions' length, so the same closes weigh four times as much in --quick's 1 ms
    # forwards as in the emulation's own 4 ms.
    ran = f"{iters} iterations"
    if _num(settings.get("t_forward_ms")) and settings.get("closes_per_iteration"):
        ran += (
            f" of {settings['closes_per_iteration']} closes and {settings['t_forward_ms']:g} ms "
            "forwards"
        )
    writes = None
    if preempt is not None:
        writes = _gate_row(
            preempt,
            "close+open cost",
            variant="gate write",
            mechanism="batch",
            gate="device",
            admission="ring",
        )
        writes = writes if writes is not None and _num(writes.get("p50_us")) else None
    rows = []
    for connections, shown in PIPELINE_CONNECTIONS:
        for task in PIPELINE_TASKS:
            setting = f"{task}, {shown}"
            r = found.get((f"freeride: {task}", connections))
            if r is None or not _num(r.get("overhead_pct")):
                rows.append(_not_run(metric, setting, target, pipeline))
                continue
            parts = []
            if _num(r.get("overhead_us_per_close")):
                close = f"{us(r['overhead_us_per_close'])} µs a close"
                if writes is not None:
                    close += f", the gate writes alone {us(writes['p50_us'])} µs a pair"
                parts.append(close)
            if _num(r.get("harvest_eff_pct")):
                parts.append(f"harvest {r['harvest_eff_pct']:.1f}%, {ran}")
            measured = f"{r['overhead_pct']:.2f}%"
            if parts:
                measured += f" ({'; '.join(parts)})"
            verdict = judge(r["overhead_pct"] <= OVERHEAD_PCT)
            rows.append(Row(metric, setting, measured, target, verdict))
    return rows


def _item_row(items: Source, prefix: str) -> dict | None:
    """The row whose task is `prefix` and then a space, a colon or nothing ("PageRank"
    is not "PageRank, one launch a phase")."""
    for r in (items.data or {}).get("rows", []):
        task = str(r.get("task", ""))
        if task.startswith(prefix) and task[len(prefix) : len(prefix) + 1] in ("", " ", ":"):
            return r
    return None


def _pagerank_rows(items: Source) -> list[tuple[str, dict | None]]:
    """(setting, bench items' row) for PageRank with device phases, the default, and with
    one launch a phase; an older result names its rows the other way round."""
    newer = ((items.data or {}).get("settings") or {}).get("device_phases") is True
    device = _item_row(items, "PageRank" if newer else OLD_DEVICE_PHASES)
    apart = _item_row(items, PHASE_LAUNCHES if newer else "PageRank")
    return [("PageRank, device phases (default)", device), (PHASE_LAUNCHES, apart)]


def _workload(task: str) -> str:
    """The workload of a bench items row's task: "50 nodes x2, 5 iters" from "PageRank 50
    nodes x2, 5 iters" and from "PageRank, one launch a phase: 50 nodes x2, 5 iters"."""
    _, colon, rest = task.partition(": ")
    return rest if colon else task.partition(" ")[2]


def item_rows(items: Source) -> list[Row]:
    metric = "item overhead vs a plain kernel (bench items)"
    target = f"≤ {ITEM_OVERHEAD_PCT:g}%"
    wanted: list[tuple[str, dict | None]] = []
    for prefix in ITEM_TASKS:
        if prefix == "PageRank":
            wanted += _pagerank_rows(items)
        else:
            wanted.append((prefix, _item_row(items, prefix)))
    rows = []
    for name, r in wanted:
        if r is None or not _num(r.get("item_overhead_pct")):
            rows.append(_not_run(metric, name, target, items))
            continue
        setting = r["task"] if name in ITEM_TASKS else f"{name}: {_workload(str(r['task']))}"
        measured = (
            f"{r['item_overhead_pct']:+.2f}% (plain {r['plain_ms']:.3f} ms, preemptible "
            f"{r['preemptible_ms']:.3f} ms)"
        )
        verdict = judge(r["item_overhead_pct"] <= ITEM_OVERHEAD_PCT)
        rows.append(Row(metric, setting, measured, target, verdict))
    return rows


def bandwidth_rows(items: Source) -> list[Row]:
    metric = "side-kernel bandwidth vs a plain copy (bench items)"
    target = "—"
    copy = _item_row(items, COPY_PREFIX)
    rows = []
    for prefix in BANDWIDTH_TASKS:
        r = _item_row(items, prefix)
        if r is None or not _num(r.get("preemptible_GBps")):
            rows.append(_not_run(metric, prefix, target, items))
            continue
        if copy is None or not _num(copy.get("plain_GBps")):
            measured = f"preemptible {r['preemptible_GBps']:,.0f} GB/s; no copy row"
            rows.append(Row(metric, r["task"], measured, target, NOT_RUN))
            continue
        share = r["preemptible_GBps"] / copy["plain_GBps"]
        measured = (
            f"preemptible {r['preemptible_GBps']:,.0f} GB/s = {share:.0%} of the copy's "
            f"{copy['plain_GBps']:,.0f} GB/s (plain kernel {r['plain_GBps']:,.0f} GB/s)"
        )
        rows.append(Row(metric, r["task"], measured, target, NO_TARGET))
    return rows


def _gate_row(preempt: Source, metric: str, **match: str) -> dict | None:
    for r in (preempt.data or {}).get("rows", []):
        if r.get("metric") == metric and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


# bench hooks' rows (freeride/cli/bench/hooks.py), the metric's own measurement: the
# training thread's time in the hooks around one compute action, bubble record on.
HOOK_ROWS = (
    ("h.compute()", "hooks: h.compute(), bubble record on, no side task"),
    ("attach()", "hooks: attach() to a torch pipelining schedule, bubble record on, no side task"),
)


def host_cost_rows(preempt: Source, hooks: Source) -> list[Row]:
    """The host cost per close+open pair (docs/design.md's metric: the training thread's
    time in the hooks around one compute action, bubble record on): bench hooks' rows,
    then the same pair with the launch an open enqueues for a running task (bench
    preempt's launch row added to h.compute()'s), and bench preempt's gate writes alone
    (no record, no Python of the hooks), for reference."""
    metric = "host cost per close+open pair"
    target = f"≤ {PAIR_HOST_US:g} µs (p50)"
    rows = []
    found = {}
    for name, setting in HOOK_ROWS:
        r = _hooks_row(hooks, name)
        if r is None:
            why = _unavailable(hooks, hooks=name, backend="cuda")
            if why is not None:
                rows.append(Row(metric, setting, f"unavailable: {why}", target, FAILED))
            else:
                rows.append(_not_run(metric, setting, target, hooks))
            continue
        found[name] = r
        measured = (
            f"p50 {us(r['p50_ns'] / 1000)} / p99 {us(r['p99_ns'] / 1000)} µs "
            f"({r.get('pairs')} pairs)"
        )
        rows.append(
            Row(metric, setting, measured, target, judge(r["p50_ns"] / 1000 <= PAIR_HOST_US))
        )
    rows.append(_call_costs_row(hooks))
    setting = "hooks: h.compute() with the side launch an open enqueues (launch at open)"
    extra = _gate_row(preempt, "launch at open host cost", variant="launch at open")
    base = {"variant": "gate write", "mechanism": "batch", "gate": "device"}
    ring = _gate_row(preempt, "close+open host cost", admission="ring", **base)
    pair, pair_text = None, ""
    if "h.compute()" in found:
        pair, pair_text = found["h.compute()"]["p50_ns"] / 1000, "pair (bench hooks)"
    elif ring is not None:
        # A run without bench hooks: the gate writes alone stand in for the pair.
        pair, pair_text = ring["p50_us"], "gate writes alone (no bench hooks in this run)"
    if pair is None or extra is None:
        why = _unavailable(preempt, variant="launch at open")
        if why is not None:
            rows.append(Row(metric, setting, why, target, FAILED))
        else:
            rows.append(_not_run(metric, setting, target, preempt if extra is None else hooks))
    else:
        # The launch is the difference of two loops of bench preempt, with and without a
        # task (its "no task" row held the loop's own training kernel before 2026-11-28).
        total = pair + extra["p50_us"]
        measured = (
            f"{pair_text} {us(pair)} + launch {us(extra['p50_us'])} = {us(total)} µs "
            f"(sum of p50s; the launch's p99 {us(extra['p99_us'])}; "
            f"{extra.get('opens_with_launch')} of {extra.get('opens')} opens carried one)"
        )
        rows.append(Row(metric, setting, measured, target, judge(total <= PAIR_HOST_US)))
    for admission, setting in (
        ("ring", "gate writes alone (bench preempt): batch, gate in device memory, ring"),
        (
            "poll",
            "gate writes alone (bench preempt): batch, device memory, FREERIDE_ADMISSION=poll",
        ),
    ):
        r = _gate_row(preempt, "close+open host cost", admission=admission, **base)
        if r is None:
            why = _unavailable(preempt, admission=admission, **base)
            if why is not None:
                rows.append(Row(metric, setting, f"unavailable: {why}", "—", FAILED))
            else:
                rows.append(_not_run(metric, setting, "—", preempt))
            continue
        measured = f"p50 {us(r['p50_us'])} / p99 {us(r['p99_us'])} µs"
        rows.append(Row(metric, setting, measured, "—", NO_TARGET))
    return rows


def _call_costs_row(hooks: Source) -> Row:
    """Where the pair's C++ part goes: hook_cost.py's "CUDA call" rows, each kind of call a
    pair makes timed alone (p50, less the clock's floor), for reference."""
    metric = "host cost per close+open pair"
    setting = "each kind of CUDA call a pair makes, timed alone (hook_cost.py), p50"
    why = _unavailable(hooks, hooks="CUDA call", backend="cuda", part=None)
    if why is not None:  # none could be timed (one row, of no call, says why)
        return Row(metric, setting, f"unavailable: {why}", "—", FAILED)
    calls = [
        r
        for r in (hooks.data or {}).get("rows", [])
        if r.get("hooks") == "CUDA call" and r.get("backend") == "cuda"
    ]
    if not calls:
        return _not_run(metric, setting, "—", hooks)
    parts = []
    for r in calls:
        name = str(r.get("part", "?")).split(" (")[0]
        parts.append(f"{name} {us(r['p50_ns'] / 1000)}" if _num(r.get("p50_ns")) else f"{name} —")
    return Row(metric, setting, ", ".join(parts) + " µs", "—", NO_TARGET)


def _hooks_row(hooks: Source, name: str) -> dict | None:
    """bench hooks' row of `name` on cuda with a figure (the host backend's, of a CPU run,
    is no GPU's figure)."""
    for r in (hooks.data or {}).get("rows", []):
        if r.get("hooks") == name and r.get("backend") == "cuda" and _num(r.get("p50_ns")):
            return r
    return None


def _unavailable(source: Source, **match: str | None) -> str | None:
    """Why the row of `source` matching `match` has no figures (the bench's `unavailable`:
    a mechanism the driver lacks, a switch that turned it off, no torch.distributed), or
    None where no such row is."""
    for r in (source.data or {}).get("rows", []):
        if r.get("unavailable") and all(r.get(k) == v for k, v in match.items()):
            return str(r["unavailable"])
    return None


def training_admission_rows(preempt: Source) -> list[Row]:
    metric = "training-kernel admission p99 while side work runs (bench preempt)"
    setting = "every side task × reserve × stream × probe shape"
    target = f"p99 ≤ {TRAINING_ADMISSION_US:g} µs"
    judged = [
        r
        for r in (preempt.data or {}).get("rows", [])
        if r.get("variant") == "admission"
        and r.get("reserve") != "none"
        and r.get("target_10us") in ("pass", "miss")
        and _num(r.get("p99_us"))
    ]
    if preempt.data is None:
        return [_not_run(metric, setting, target, preempt)]
    if not judged:
        return [Row(metric, setting, "no admission row with data", target, FAILED)]
    passed = sum(r["p99_us"] <= TRAINING_ADMISSION_US for r in judged)
    worst = max(judged, key=lambda r: r["p99_us"])
    measured = (
        f"{passed} of {len(judged)} rows meet it; worst p99 {us(worst['p99_us'])} µs "
        f"({worst.get('task')}, {worst.get('reserve')}, {worst.get('stream')}, "
        f"{worst.get('probe')})"
    )
    return [Row(metric, setting, measured, target, judge(passed == len(judged)))]


def executor_sleep_rows(at_open: Source, ring: Source) -> list[Row]:
    """probe_admission's first second, gate closed and the task waiting for it: how often
    the executor thread woke, and the process's CPU."""
    metric = "executor wake-ups while the gate is closed (sleeps through compute)"
    target = f"≤ {EXECUTOR_WAKEUPS_PER_S:g} a second"
    rows = []
    for source, setting in (
        (at_open, "launches at opens (default)"),
        (ring, RING_SETTING),
    ):
        d = source.data
        if d is None:
            rows.append(_not_run(metric, setting, target, source))
            continue
        rate, cpu = d.get("closed_wakeups_per_s"), d.get("closed_cpu_per_s")
        if not _num(rate):
            why = d.get("error") or "no wake-up count in the probe's output"
            rows.append(Row(metric, setting, f"no figure: {why}", target, FAILED))
            continue
        measured = f"{rate:,.0f} a second"
        if _num(cpu):
            measured += f"; the process {cpu:.3f} CPU-s a second"
        rows.append(Row(metric, setting, measured, target, judge(rate <= EXECUTOR_WAKEUPS_PER_S)))
    return rows


# -- the table ----------------------------------------------------------------------------


def rows_of(folder: str) -> list[Row]:
    src = {key: load(folder, name) for key, name in FILES.items()}
    channels = {(r, la): load(folder, channels_file(r, la)) for r in RESERVES for la in LOOKAHEADS}
    return [
        *pause_rows(src["preempt"]),
        *side_admission_rows(
            src["admission_at_open"],
            src["admission_ring"],
            src["admission_poll"],
            src["admission_watcher"],
            src["admission_spin"],
        ),
        *harvest_rows(src["harvest"]),
        *held_rows(channels, load(folder, BALANCED_CHANNELS)),
        *overhead_rows(src["pipeline"], src["preempt"]),
        *item_rows(src["items"]),
        *bandwidth_rows(src["items"]),
        *host_cost_rows(src["preempt"], src["hooks"]),
        *executor_sleep_rows(src["admission_at_open"], src["admission_ring"]),
        *training_admission_rows(src["preempt"]),
    ]


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def heading(folder: str) -> str:
    """Which run the table is of: device, commit and date of the first bench JSON there."""
    for key in ("preempt", "items", "pipeline"):
        d = load(folder, FILES[key]).data
        if isinstance(d, dict) and d.get("device"):
            return f"{d['device']}, commit {d.get('commit')}, {d.get('date')}"
    return "no benchmark output"


def table(folder: str) -> str:
    rows = rows_of(folder)
    lines = [
        f"Measured in one run (issue 36): {heading(folder)}",
        "",
        "| metric | setting | measured | target | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    counts = Counter(row.verdict for row in rows)
    order = (MET, MISSED, FAILED, NOT_RUN, NO_TARGET)
    lines += ["", ", ".join(f"{counts[v]} {v}" for v in order) + f" ({len(rows)} rows)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the measure step's table of targets")
    parser.add_argument("folder", help="where the measure step wrote its JSON")
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    text = table(args.folder)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
