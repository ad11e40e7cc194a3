"""Training overhead of a real multi-process pipeline on the host backend.

Runs `freeride demo`'s pipeline (one process per stage, gloo, a small transformer split
into stages, torch.distributed.pipelining's 1F1B), with the ranks started each in its
own session as torchrun starts them ("sessions") and all in one session ("one-session"),
and alternates, step by step in the same run, between harvesting (hooks attached, side
task submitted) and no side work (hooks detached). For each setting it prints the median
iteration time of both, the measured overhead (paired steps) with a bootstrap 95%
interval, and what the reports estimate (the training threads' time in freeride's
hooks), so the two can be compared. Side task "none" attaches the hooks without side
work: the hooks' own cost.

Host backend only: the stages share this machine's CPU cores, which is what is measured.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from .._stats import paired_overhead
from ..demo import LAUNCHES

MODES = ("cpu",)


def _settings(quick: bool) -> list[tuple[str, int, str]]:
    if quick:
        return [("sessions", 2, "spin")]
    return [
        (launch, stages, task)
        for launch in LAUNCHES
        for stages, task in ((2, "none"), (2, "spin"), (4, "none"), (4, "spin"))
    ]


def measure(mode: str, quick: bool) -> dict[str, Any]:
    from freeride import Report

    from ..demo import DemoConfig, check_config, job_step_times, spawn_ranks

    steps = 8 if quick else 160
    rng = np.random.default_rng(0)
    rows = []
    for launch, stages, task in _settings(quick):
        cfg = DemoConfig(
            stages=stages, microbatches=2 * stages, steps=steps, task=task, launch=launch
        )
        check_config(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "result.json")
            spawn_ranks(cfg, use_cuda=False, result_path=path)
            with open(path) as f:
                result = json.load(f)
        reports = [Report.from_dict(d) for d in result["reports"]]
        with_side, without = (np.asarray(t) for t in job_step_times(result["times"]))
        paired = paired_overhead(with_side, without, rng)
        estimate = float(np.mean([r.estimated_overhead for r in reports]))
        iterations = sum(len(r.iterations) for r in reports)
        rows.append(
            {
                "launch": launch,
                "stages": stages,
                "task": task,
                "host_idle": ",".join(sorted({str(r.settings.get("host_idle")) for r in reports})),
                "steps": f"{with_side.size}+{without.size}",
                "no_side_ms": float(np.median(without) * 1e3),
                "harvesting_ms": float(np.median(with_side) * 1e3),
                "overhead_pct": 100 * paired.median,
                "ci95_low_pct": 100 * paired.low,
                "ci95_high_pct": 100 * paired.high,
                "estimated_pct": 100 * estimate,
                "hooks_us_per_iter": sum(r.hook_ns for r in reports) / max(1, iterations) / 1e3,
                "harvested_pct": 100
                * sum(r.harvested_ns for r in reports)
                / max(1, sum(r.bubble_ns for r in reports)),
            }
        )
    return {
        "settings": {
            "schedule": "1f1b",
            "microbatches": "2 x stages",
            "steps": steps,
            "item_us": DemoConfig.item_us,
            "cpus": os.cpu_count(),
            "autogroup": _autogroup(),
        },
        "rows": rows,
        "notes": [
            (
                "overhead: median over step pairs of harvesting step / next step without side "
                "work - 1 (a step's time: its slowest rank's); ci95: bootstrap over pairs"
            ),
            (
                "launch: sessions, each rank in its own session (as torchrun starts its "
                "workers); one-session, all in the benchmark's session"
            ),
            (
                "host_idle: how the ranks' side threads kept out of other scheduling groups' "
                "way (Harvester.host_idle; FREERIDE_HOST_IDLE forces one)"
            ),
            (
                "estimated: the reports' estimate, the training threads' time in freeride's "
                "hooks over their recorded time (mean over ranks)"
            ),
        ],
    }


def _autogroup() -> str:
    """/proc/sys/kernel/sched_autogroup_enabled: "1" where every session is a scheduling
    group of its own (then the launch decides who competes for the cores), "0", or
    "absent" on a kernel without the feature."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip()
    except OSError:
        return "absent"
