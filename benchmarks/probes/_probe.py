"""What the probes of this folder share: bounded waits, result lines and a hard exit.

A probe asks the GPU one question and prints its answer on lines that start with
``RESULT <probe>:`` (what it measured, with the numbers) and, for a yes/no question,
``ANSWER <probe>:``; benchmarks/run_gpu.sh copies those lines into its summary. Every wait
on the GPU runs in a daemon thread joined with a limit (`bounded`), so a probe reports a
hang instead of hanging; after one it leaves with `hard_exit`, which skips the interpreter's
exit (CUDA's teardown would wait for the stuck work too).

Nothing here imports torch or CuPy: each probe imports what it needs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from typing import Any

# torch.cuda._sleep counts clock cycles: about 2 million per ms at the ~2 GHz an H100 or
# H200 runs at under load (tests/gpu_worker.py uses the same figure). cycles_per_ms()
# measures it where the figure matters.
CYCLES_PER_MS = 2_000_000


class Bounded:
    """The outcome of one bounded call: `done` (it returned or raised within the limit),
    its `value` or `error`, and `seconds` (how long it took, or the limit)."""

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.thread: threading.Thread | None = None

    def join(self, limit: float) -> bool:
        """Waits up to `limit` more seconds for a call that had not returned; True once it
        has."""
        if self.thread is not None:
            self.thread.join(limit)
        return self.done

    def __repr__(self) -> str:
        if not self.done:
            return f"not returned after {self.seconds:.3f} s"
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        return f"returned in {self.seconds * 1e3:.2f} ms"


def bounded(fn: Any, limit: float, name: str = "bounded call") -> Bounded:
    """Runs fn() in a daemon thread and waits up to `limit` seconds for it. A call still
    running then is left running (its thread is a daemon); the result says so."""
    out = Bounded()

    def target() -> None:
        begin = time.perf_counter()
        try:
            out.value = fn()
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            out.error = exc
        out.seconds = time.perf_counter() - begin
        out.done = True

    out.thread = threading.Thread(target=target, daemon=True, name=name)
    begin = time.perf_counter()
    out.thread.start()
    out.thread.join(limit)
    if not out.done:
        out.seconds = time.perf_counter() - begin
    return out


def result(probe: str, text: str) -> None:
    print(f"RESULT {probe}: {text}", flush=True)


def answer(probe: str, text: str) -> None:
    print(f"ANSWER {probe}: {text}", flush=True)


def note(probe: str, text: str) -> None:
    print(f"{probe}: {text}", flush=True)


def worker_failure(probe: str, label: str, exc: BaseException) -> str:
    """A worker run that brought no result (tests/gpu_worker.py's run_worker failed the
    call: a hang, a crash, no RESULT): its output noted in full, and why in one line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [repr(exc)]
    note(probe, f"{label}: no result from the worker:\n{str(exc)[-6000:]}")
    return lines[0][:200] + ("" if len(lines) == 1 else f" ... {lines[-1][:200]}")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, interpolated between the two nearest as
    numpy's default does (so it matches the benchmarks' p50/p99); the value of a single one."""
    if not values:
        raise ValueError("percentile of no values")
    if len(values) == 1:
        return float(values[0])
    if q >= 100:
        return float(max(values))
    if q <= 0:
        return float(min(values))
    cuts = statistics.quantiles(values, n=1000, method="inclusive")  # 999 cut points
    return float(cuts[round(q * 10) - 1])


def write_json(path: str | None, data: dict) -> None:
    """Writes `data` as JSON at `path` (nothing where path is None), through a temporary
    file renamed into place, so a reader never sees half a file: a probe killed while
    writing leaves the previous version or none."""
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def hard_exit(code: int) -> None:
    """Leaves at once, without the interpreter's exit or CUDA's teardown (after a hang:
    both could wait for the stuck work)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cycles_per_ms(torch: Any) -> float:
    """torch.cuda._sleep's clock cycles per millisecond on this device, measured."""
    torch.cuda._sleep(1000)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20 * CYCLES_PER_MS)
    end.record()
    end.synchronize()
    return 20 * CYCLES_PER_MS / start.elapsed_time(end)


def wait_until(predicate: Any, timeout: float, interval: float = 0.0005) -> bool:
    """Polls predicate until true; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
