"""Is side work starved only in queued bubbles that outlast the time slice? (H200 run of
2026-11-27 at 51c0fe7, tests/test_launch_at_open.py)

    python3 probe_queued_harvest.py

That run harvested only 0.20-0.26 of the open-gate rate in the 20 ms bubbles the host
queued ahead of the GPU (tests/gpu_worker.py's queued_bubbles; the test needs 0.5), where
the same test passed on 2026-11-25, before e697259. The leading explanation: past its 2 ms
slice a launch runs on while the close ending its bubble is pending (every close is
enqueued long before the GPU gets there), and since e697259 every block decides that at
every claim by reading the latest close ordinal from mapped host memory, so claims starve
for the rest of the bubble (up to 8 slices). A bubble that fits in one slice never takes
that path.

Runs of tests/gpu_worker.py's queued_bubbles (run_worker: a fresh process each, 5
iterations, 5 ms compute, Spin items of 20 us, the default reserve), one RESULT line each
with the harvest share, items, launches (at opens, idle at opens) and training overhead:
1. the default slice (2 ms) and 20 ms bubbles: the failure, run on for most of each bubble;
2. time_slice=0.05 and 20 ms bubbles: each bubble within one slice, nothing runs on;
3. the default slice and 1.5 ms bubbles: within one slice;
4. as 1 with CUDA_DEVICE_MAX_CONNECTIONS=1 (the test's other case);
5. time_slice=None and 20 ms bubbles: no slice, so nothing reads the close ordinal
   (last: the first dropped when the budget runs short).

ANSWER: harvest is "low" below LOW_SHARE = 0.5 (the test's threshold). Low in 1 and not in
2 and 3 -> low only when bubbles outlast the slice: the run-on path. Low in 2 or 3 too ->
not the run-on path alone. Not low in 1 -> the failure does not reproduce at this commit.

Limits: each run RUN_S = 25 s (run_worker reports a hung child with its stacks and kills
it), the whole probe TOTAL_S = 75 s; a run not started by then is listed. Exit status 1
when a run hung, failed or was not run.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from _probe import note, result, worker_failure

NAME = "probe_queued_harvest"
LOW_SHARE = 0.5
RUN_S = 25.0
TOTAL_S = 75.0
MIN_RUN_S = 12.0  # a worker needs ~8 s (torch, CUDA, the queue twice): less left, skip it
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "..", "tests")

# (label, environment, queued_bubbles arguments)
RUNS: tuple[tuple[str, dict[str, str], dict[str, Any]], ...] = (
    ("default slice, recv 20 ms", {}, {"recv_ms": 20.0}),
    ("time_slice=0.05, recv 20 ms", {}, {"recv_ms": 20.0, "time_slice": 0.05}),
    ("default slice, recv 1.5 ms", {}, {"recv_ms": 1.5}),
    (
        "default slice, recv 20 ms, CUDA_DEVICE_MAX_CONNECTIONS=1",
        {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        {"recv_ms": 20.0},
    ),
    ("time_slice=None, recv 20 ms", {}, {"recv_ms": 20.0, "time_slice": None}),
)


def run(label: str, env: dict[str, str], args: dict[str, Any], limit: float) -> dict | None:
    from gpu_worker import run_worker

    try:
        return run_worker("queued_bubbles", args, env=env, timeout=limit)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - pytest.fail's Failed is a BaseException
        result(NAME, f"{label}: FAILED ({worker_failure(NAME, label, exc)})")
        return None


def line(label: str, r: dict) -> str:
    return (
        f"{label}: harvest {r['harvest_share']:.3f} of the open-gate rate "
        f"({r['items_in_bubbles']} items in {r['iterations']} bubbles of {r['recv_ms']:g} ms; "
        f"{r['open_gate_items_per_s']:,.0f} items/s open), "
        f"{r.get('harvest_of_bubble_rate', 0.0):.3f} of one 10 ms bubble's rate "
        f"({r.get('bubble_items_per_s', 0.0):,.0f} items/s), launches {r['launches']} (at "
        f"opens {r['at_opens']}, idle at opens {r['idle_at_opens']}), overhead "
        f"{r['overhead_pct']:.2f}% ({r['queue_ms']:.1f} vs {r['baseline_ms']:.1f} ms), "
        f"time_slice {r['time_slice']} (bound {r['slice_bound']}), connections "
        f"{r['connections'] or 'default'}, reserve {r['reserve_mechanism']}, launches at "
        f"opens {r['launches_at_opens']}, queued ahead {r['queued_ahead']}"
    )


def answer(text: str) -> None:
    print(f"ANSWER {NAME}: {text}", flush=True)


def share(results: dict[str, dict | None], label: str) -> str:
    r = results.get(label)
    return "not measured" if r is None else f"{r['harvest_share']:.3f}"


def answers(results: dict[str, dict | None]) -> None:
    failing, *within = (label for label, _, _ in RUNS[:3])
    base = results.get(failing)
    if base is None:
        answer(f"not answered: '{failing}' was not measured")
        return
    if base["harvest_share"] >= LOW_SHARE:
        answer(
            f"the failure does not reproduce at this commit: '{failing}' harvested "
            f"{base['harvest_share']:.3f} >= {LOW_SHARE} (within one slice: "
            + ", ".join(f"'{w}' {share(results, w)}" for w in within)
            + ")"
        )
    else:
        measured = [w for w in within if results.get(w) is not None]
        low = [w for w in measured if results[w]["harvest_share"] < LOW_SHARE]
        shares = ", ".join(f"'{w}' {share(results, w)}" for w in within)
        if not measured:
            answer(f"not answered: '{failing}' {share(results, failing)}, nothing within a slice")
        elif low:
            answer(
                f"no: harvest is low within one slice too ({shares}; '{failing}' "
                f"{base['harvest_share']:.3f}): not the run-on path alone"
            )
        else:
            partial = "" if len(measured) == len(within) else " (of those measured)"
            answer(
                f"yes: harvest is low only when bubbles outlast the slice: '{failing}' "
                f"{base['harvest_share']:.3f} < {LOW_SHARE}, within one slice{partial} "
                f"{shares} -> the run-on path"
            )
    for label, _, _ in RUNS[3:]:
        answer(
            f"'{label}': harvest {share(results, label)} (the default: {share(results, failing)})"
        )


def main() -> None:
    sys.path.insert(0, os.path.abspath(TESTS))
    begin = time.monotonic()
    results: dict[str, dict | None] = {}
    for label, env, args in RUNS:
        left = TOTAL_S - (time.monotonic() - begin)
        if left < MIN_RUN_S:
            result(NAME, f"{label}: NOT RUN (the probe's {TOTAL_S:.0f} s budget is spent)")
            continue
        t0 = time.monotonic()
        r = run(label, env, args, min(RUN_S, left))
        results[label] = r
        if r is not None:
            result(NAME, f"{line(label, r)}; {time.monotonic() - t0:.1f} s")
    answers(results)
    note(NAME, f"total {time.monotonic() - begin:.1f} s")
    # A run that hung, failed or never ran shows as this probe's failure in the summary.
    if len(results) < len(RUNS) or any(r is None for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
