"""The measurement of tests/test_profiling.py's GPU clock-origin test, in a fresh process
(`CUDA_DEVICE_MAX_CONNECTIONS` is read when the CUDA context is made): started by
gpu_worker.run_worker, prints one line `RESULT {json}`.

A GPU report's time 0 is the first recorded iteration's open mark, and its Unix time
(`clock_origin_unix_ns`) must be where the GPU passed that mark. Here the training stream
is idle when the iteration opens, so the GPU passes the mark within microseconds of its
enqueueing: between two host clock readings taken around the open. Then the report is
asked for with a backlog of training work queued behind the iteration, which anything on
the control stream waits for under one hardware queue.

Nothing here imports torch or freeride at module level (see gpu_worker.py).
"""

from __future__ import annotations

import os
import time

from gpu_worker import CYCLES_PER_MS, serve


def _backlog(torch, hold_ms: float, kernels: int = 10) -> None:
    """`hold_ms` of GPU work queued on the current stream as a training step queues it:
    kernels that each wait for the one before, then an event record that waits for the
    last (under one hardware queue nothing enqueued later gets past it)."""
    for _ in range(kernels):
        torch.cuda._sleep(int(hold_ms / kernels * CYCLES_PER_MS))
    torch.cuda.Event().record()


class _NoAnchor:
    """The harvester's executor, but without an answer from the clock anchor: the
    recorder then falls back to its probe (the way it took every GPU origin before)."""

    def __init__(self, ex) -> None:
        self._ex = ex

    def mark_unix_ns(self, mark, timeout):
        return None

    def __getattr__(self, name):
        return getattr(self._ex, name)


def _outside_ms(at_ns: int | None, lo_ns: int, hi_ns: int) -> float | None:
    """How far `at_ns` lies outside [lo_ns, hi_ns], in ms: negative before, positive
    after, 0 within; None for no time."""
    if at_ns is None:
        return None
    if at_ns < lo_ns:
        return (at_ns - lo_ns) / 1e6
    if at_ns > hi_ns:
        return (at_ns - hi_ns) / 1e6
    return 0.0


def mode_clock_origin(args: dict) -> dict:
    """The first iteration opens on an idle stream between host readings `opened_from`
    and `opened_to`; `compute_ms` of work inside it; `hold_ms` of work queued behind it;
    then report(). Reports where the report's origin lies against that window and how it
    was found, where mark_unix_ns places the same mark behind a fresh backlog, and, as
    the negative control, where the recorder's probe fallback places it behind another."""
    import torch

    import freeride as fr

    hold_ms = float(args.get("hold_ms", 300.0))
    compute_ms = float(args.get("compute_ms", 20.0))
    torch.cuda.init()
    train = torch.cuda.Stream()
    with torch.cuda.stream(train):
        torch.cuda._sleep(1)  # loaded before anything is timed (CUDA's lazy loading)
    torch.cuda.synchronize()
    out: dict = {
        "connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "hold_ms": hold_ms,
    }
    with fr.Harvester("cuda:0") as h, torch.cuda.stream(train):
        h.gate.close()  # a stream-ordered write's one-time costs, before the window
        train.synchronize()
        opened_from = time.time_ns()
        with h.iteration():
            opened_to = time.time_ns()
            torch.cuda._sleep(int(compute_ms * CYCLES_PER_MS))
        _backlog(torch, hold_ms)
        began = time.perf_counter()
        report = h.report()
        out["report_ms"] = (time.perf_counter() - began) * 1e3
        rec = h._recorder
        out["source"] = rec.clock_origin_source
        out["window_ms"] = (opened_to - opened_from) / 1e6
        out["origin_outside_ms"] = _outside_ms(report.clock_origin_unix_ns, opened_from, opened_to)
        # The first iteration's open mark, which the recorder keeps as its anchor until
        # the next iteration resolves.
        mark = rec._anchor[0]
        _backlog(torch, hold_ms)
        again = h._ex.mark_unix_ns(mark, 5.0)
        out["again_outside_ms"] = _outside_ms(again, opened_from, opened_to)
        _backlog(torch, hold_ms)
        rec._ex = _NoAnchor(rec._ex)
        try:
            probed = rec._gpu_mark_unix_ns(mark)
        finally:
            rec._ex = rec._ex._ex
        out["probe_source"] = rec.clock_origin_source
        out["probe_outside_ms"] = _outside_ms(probed, opened_from, opened_to)
        train.synchronize()
    return out


if __name__ == "__main__":
    serve({"clock_origin": mode_clock_origin})
