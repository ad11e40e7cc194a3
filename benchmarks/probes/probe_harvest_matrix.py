"""How much of the open-gate time does side work harvest in bubbles the host queued ahead of
the GPU, under 1 and 8 hardware queues, for a single-phase and a many-phase task? (issue
36: "measured in one run"; the harvest target is >= 85% in bubbles of >= 200 us)

    python3 probe_harvest_matrix.py [--budget S] [--json PATH] [--only KEY ...]

Runs tests/gpu_worker.py's workers (run_worker: a fresh process each, so that
CUDA_DEVICE_MAX_CONNECTIONS takes effect; unset means the driver's default, 8):
- queued_bubbles: a single-phase Spin (20 us items) in 5 bubbles of 20 ms, and in 20
  bubbles of 0.5 ms (short, still >= 200 us), each under 8 and 1 hardware queues; then
  (after the short ones) the 20 ms bubbles again with Harvester(max_slices=16), whose
  launches run on for 32 ms instead of 16 ms once the bubble's close is enqueued;
- queued_phases: a 30-phase ItemCounter (20 us items) in 5 bubbles of 20 ms, under 8 and 1
  hardware queues, with device phases (the default), then (last, after the short Spin
  bubbles) with device phases off (FREERIDE_DEVICE_PHASES=0) and phases ahead off
  (FREERIDE_PHASES_AHEAD=0, the default) and on (1).
Each run's harvest share = items done in the bubbles / (the task's open-gate rate x the
bubbles' time); the open-gate rate is the same task's with the gate opened from the host.
One RESULT line per run, in the order above (most important first: runs the budget leaves
out are the last).

`--json PATH` writes {"runs": [...], "planned": [...], "complete": bool} after every run
(each run: key, label, mode, env, args, seconds, and `result` (the worker's dict) or
`error`), so a probe cut short still leaves what it measured; benchmarks/measure_table.py
reads it. `--budget S` (default 150): no run starts with less than MIN_RUN_S left, and
none gets more than RUN_S or what is left; those not run are listed. Exit status 1 when a
run failed or was not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from _probe import note, result, worker_failure, write_json

NAME = "probe_harvest_matrix"
RUN_S = 40.0
MIN_RUN_S = 12.0  # a worker needs ~8 s (torch, CUDA, the queue twice): less left, skip it
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "tests")

# (key, label, worker mode, environment, arguments). benchmarks/measure_table.py keeps one
# row per key (tests/test_measure_table.py checks that the two lists agree).
RUNS: tuple[tuple[str, str, str, dict[str, str], dict[str, Any]], ...] = (
    ("spin-20ms-8q", "Spin, 5 bubbles of 20 ms, 8 queues", "queued_bubbles", {}, {}),
    (
        "spin-20ms-1q",
        "Spin, 5 bubbles of 20 ms, 1 queue",
        "queued_bubbles",
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        {},
    ),
    (
        "phases-20ms-8q-device1",
        "ItemCounter 30 phases, 5 bubbles of 20 ms, 8 queues, device phases (default)",
        "queued_phases",
        {},
        {},
    ),
    (
        "phases-20ms-1q-device1",
        "ItemCounter 30 phases, 5 bubbles of 20 ms, 1 queue, device phases (default)",
        "queued_phases",
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        {},
    ),
    (
        "spin-0.5ms-8q",
        "Spin, 20 bubbles of 0.5 ms, 8 queues",
        "queued_bubbles",
        {},
        {"recv_ms": 0.5, "iterations": 20},
    ),
    (
        "spin-0.5ms-1q",
        "Spin, 20 bubbles of 0.5 ms, 1 queue",
        "queued_bubbles",
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        {"recv_ms": 0.5, "iterations": 20},
    ),
    (
        "spin-20ms-8q-slices16",
        "Spin, 5 bubbles of 20 ms, 8 queues, Harvester(max_slices=16)",
        "queued_bubbles",
        {},
        {"max_slices": 16},
    ),
    (
        "spin-20ms-1q-slices16",
        "Spin, 5 bubbles of 20 ms, 1 queue, Harvester(max_slices=16)",
        "queued_bubbles",
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        {"max_slices": 16},
    ),
    (
        "phases-20ms-8q-ahead0",
        "ItemCounter 30 phases, 5 bubbles of 20 ms, 8 queues, device phases off, phases ahead off",
        "queued_phases",
        {"FREERIDE_DEVICE_PHASES": "0", "FREERIDE_PHASES_AHEAD": "0"},
        {},
    ),
    (
        "phases-20ms-1q-ahead0",
        "ItemCounter 30 phases, 5 bubbles of 20 ms, 1 queue, device phases off, phases ahead off",
        "queued_phases",
        {
            "FREERIDE_DEVICE_PHASES": "0",
            "FREERIDE_PHASES_AHEAD": "0",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        {},
    ),
    (
        "phases-20ms-8q-ahead1",
        "ItemCounter 30 phases, 5 bubbles of 20 ms, 8 queues, device phases off, phases ahead on",
        "queued_phases",
        {"FREERIDE_DEVICE_PHASES": "0", "FREERIDE_PHASES_AHEAD": "1"},
        {},
    ),
    (
        "phases-20ms-1q-ahead1",
        "ItemCounter 30 phases, 5 bubbles of 20 ms, 1 queue, device phases off, phases ahead on",
        "queued_phases",
        {
            "FREERIDE_DEVICE_PHASES": "0",
            "FREERIDE_PHASES_AHEAD": "1",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        {},
    ),
)


def run(key: str, mode: str, env: dict[str, str], args: dict[str, Any], limit: float) -> dict:
    """One worker; {"result": its dict} or {"error": why}."""
    from gpu_worker import run_worker

    try:
        return {"result": run_worker(mode, args, env=env, timeout=limit)}
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - pytest.fail's Failed is a BaseException
        return {"error": worker_failure(NAME, key, exc)}


def line(label: str, r: dict) -> str:
    """A run's RESULT text: the harvest share and what explains it."""
    text = (
        f"{label}: harvest {r.get('harvest_share', 0.0):.3f} of the open-gate rate "
        f"({r.get('items_in_bubbles')} items in {r.get('iterations')} bubbles of "
        f"{r.get('recv_ms')} ms; {r.get('open_gate_items_per_s', 0.0):,.0f} items/s open), "
    )
    if "harvest_of_bubble_rate" in r:  # Spin's: against one launch's rate in a bubble
        text += (
            f"{r['harvest_of_bubble_rate']:.3f} of one 10 ms bubble's rate "
            f"({r.get('bubble_items_per_s', 0.0):,.0f} items/s), "
        )
    text += (
        f"launches {r.get('launches')} (at opens {r.get('at_opens')}, idle at opens "
        f"{r.get('idle_at_opens')}), queued ahead {r.get('queued_ahead')}"
    )
    if "overhead_pct" in r:
        text += f", overhead {r['overhead_pct']:.2f}%"
    if "phases_in_bubbles" in r:
        text += (
            f", phases in the bubbles {r['phases_in_bubbles']} of {r.get('phases')}, "
            f"violations {r.get('violations_in_bubbles')}, finished {r.get('finished')} "
            f"(every item once: {r.get('counts_all_one')})"
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description="harvest share in queued bubbles (issue 36)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for every run")
    parser.add_argument("--json", default=None, help="write the runs here as JSON")
    parser.add_argument("--only", nargs="*", default=None, help="run only these keys")
    opts = parser.parse_args()
    sys.path.insert(0, os.path.abspath(TESTS))
    planned = [r for r in RUNS if opts.only is None or r[0] in opts.only]
    begin = time.monotonic()
    doc: dict[str, Any] = {"probe": NAME, "planned": [r[0] for r in planned], "runs": []}
    write_json(opts.json, {**doc, "complete": False})
    failed = False
    for key, label, mode, env, args in planned:
        left = opts.budget - (time.monotonic() - begin)
        if left < MIN_RUN_S:
            result(NAME, f"{label}: NOT RUN (the probe's {opts.budget:.0f} s budget is spent)")
            failed = True
            continue
        t0 = time.monotonic()
        got = run(key, mode, env, args, min(RUN_S, left))
        seconds = time.monotonic() - t0
        entry = {"key": key, "label": label, "mode": mode, "env": env, "args": args}
        doc["runs"].append({**entry, **got, "seconds": seconds})
        done = len(doc["runs"]) == len(planned)
        write_json(opts.json, {**doc, "complete": done})
        if "result" in got:
            result(NAME, f"{line(label, got['result'])}; {seconds:.1f} s")
        else:
            failed = True
            result(NAME, f"{label}: FAILED ({got['error']})")
    note(NAME, f"total {time.monotonic() - begin:.1f} s")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
