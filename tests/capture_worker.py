"""CUDA graph captures beside other threads: the helpers tests/test_capture.py uses, and
the negative control that runs in a fresh process.

An invalidated capture leaves torch's capture machinery (the graph, its memory pool, the
capturing stream) in whatever state a failed capture_end leaves it, so the control that
invalidates captures on purpose runs as `python tests/capture_worker.py MODE JSON-ARGS`
and prints one line `RESULT {json}`, as tests/gpu_worker.py does. Nothing here imports
torch or freeride at module level.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

RESULT = "RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))

CAPTURES = 20
CAPTURED_OPS = 200
# Each capture stays open this long (a host sleep inside it), so work on other threads
# (the job queue's beat every 100 ms, the agent's builds) lands inside captures, not only
# between them.
CAPTURE_HOLD_S = 0.05
# Set while the training thread captures: threads beside it note what they did inside one.
CAPTURING = threading.Event()


def work(x: Any, k: float) -> Any:
    """Elementwise steps: the same kernels eagerly and replayed, so results are equal."""
    y = x
    for _ in range(CAPTURED_OPS):
        y = y * 0.5 + k
    return y


def capture_and_replay(
    torch: Any, h: Any, x: Any, before_each: Any = None
) -> tuple[list[str], int]:
    """CAPTURES captures in torch's default (global) capture mode on this thread, each
    with gate writes (h.compute on the capturing stream) around work whose eager result is
    known; each capture that ended is replayed and compared (a mismatch fails here).
    Returns the errors of the captures that failed, and how many replays matched."""
    errors: list[str] = []
    matched = 0
    stream = torch.cuda.current_stream()
    for i in range(CAPTURES):
        k = float(i + 1)
        expected = work(x, k)
        torch.cuda.synchronize()
        if before_each is not None:
            before_each()
        g = torch.cuda.CUDAGraph()
        CAPTURING.set()
        try:
            with torch.cuda.graph(g):
                with h.compute(label="captured"):
                    out = work(x, k)
                time.sleep(CAPTURE_HOLD_S)
        except Exception as exc:  # noqa: BLE001 - cudaErrorStreamCaptureInvalidated, mostly
            errors.append(f"{type(exc).__name__}: {exc}")
            # A failed capture_end leaves torch's capture stream current.
            torch.cuda.set_stream(stream)
            torch.cuda.synchronize()
            continue
        finally:
            CAPTURING.clear()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"capture {i}: the replay differs from eager"
        matched += 1
    return errors, matched


# -- helpers for the tests -------------------------------------------------------------------


def run_worker(mode: str, args: dict | None = None, timeout: float = 300.0) -> dict:
    """Runs MODE of this file in a fresh Python process (gpu_worker.run_worker) and
    returns its RESULT dict."""
    from gpu_worker import run_worker as run

    return run(mode, args, timeout=timeout, worker="capture_worker.py")


# -- modes (in the child) --------------------------------------------------------------------


def mode_unsafe_query(args: dict) -> dict:
    """Captures on this (training) thread while a thread in the default global capture
    mode queries a CUDA event in a loop (what torch's NCCL watchdog did before it relaxed
    its thread); then, with that thread gone, the same captures again."""
    import torch

    import freeride as fr

    with fr.Harvester("cuda") as h:
        x = torch.randn(1 << 16, device=h.device)
        event = torch.cuda.Event()
        event.record()
        torch.cuda.synchronize()
        stop = threading.Event()
        queries = {"inside": 0, "errors": 0, "first_error": ""}

        def query() -> None:
            while not stop.is_set():
                inside = CAPTURING.is_set()
                try:
                    event.query()  # cudaEventQuery: "potentially unsafe" in global mode
                except RuntimeError as exc:
                    queries["errors"] += 1
                    queries["first_error"] = queries["first_error"] or str(exc)
                    time.sleep(0.001)
                queries["inside"] += inside
                # Lets the capturing thread have the GIL: a loop that never sleeps holds it
                # for the whole switch interval at a time, and 20 captures took 100 s.
                time.sleep(20e-6)

        querier = threading.Thread(target=query)
        querier.start()
        try:
            errors, matched = capture_and_replay(torch, h, x)
        finally:
            stop.set()
            querier.join(30)
        again, matched_again = capture_and_replay(torch, h, x)
    return {
        "failed": len(errors),
        "matched": matched,
        "first_failure": errors[0] if errors else "",
        "queries_inside": queries["inside"],
        "query_errors": queries["errors"],
        "first_query_error": queries["first_error"],
        "failed_after": len(again),
        "matched_after": matched_again,
    }


MODES = {"unsafe_query": mode_unsafe_query}


def main() -> None:
    mode = sys.argv[1]
    args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    print(RESULT + json.dumps(MODES[mode](args)), flush=True)


if __name__ == "__main__":
    main()
