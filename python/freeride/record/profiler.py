"""Bubbles on the profilers' timelines: live ranges while a profiler records, and the
clock that puts a report's times beside a torch.profiler trace.

Live ranges: while torch's profiler records (``torch.profiler.profile``,
``torch.autograd.profiler.profile`` or ``emit_nvtx``), the recorder opens a range
``"freeride: bubble <k>"`` on the training thread when bubble slot *k* opens and closes
it when the gate next closes, through the same record-function machinery as
``torch.profiler.record_function``. On a GPU it also starts an NVTX range of the same
name (``torch.cuda.nvtx.range_start``/``range_end``) so that Nsight Systems shows it;
with the environment variable ``FREERIDE_NVTX=1`` the NVTX ranges are made whenever
torch is imported, profiler or not (Nsight Systems cannot be detected from inside the
process). On a GPU these ranges are host time, when the training thread enqueued the
gate writes, not when the device ran them; the report's bubbles are the device's times.

Nothing here imports torch: without torch in ``sys.modules`` or without a profiler
recording, an open costs one check and a close one attribute test.

Side launches run on freeride's own threads and are known to torch.profiler only after
the fact, from the launch log: ``merge_with_profiler_trace`` (report.py) adds them, with
the bubbles and compute actions, to an exported torch.profiler trace on the profiler's
clock. On a GPU the executor thread also makes each launch an NVTX range
(csrc/cuda/runner_end.cpp), which Nsight Systems shows live.

The profiler's clock (torch 2.13, read from exported traces): an event's ``ts`` is in
microseconds and ``ts * 1000 + baseTimeNanoseconds`` (a top-level key of the trace) is
Unix time in nanoseconds (CLOCK_REALTIME). The host backend's record is on the steady
clock (CLOCK_MONOTONIC, ``time.monotonic_ns()``); `unix_offset_ns` converts.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

BUBBLE_RANGE = "freeride: bubble"

_NVTX_ALWAYS = os.environ.get("FREERIDE_NVTX", "") not in ("", "0")


# (torch module, its _profiler_enabled): asked at every recorded open on the training
# thread, so looked up once per torch module rather than through three attributes each
# time. Keyed on the module, as a torch put in sys.modules later is asked itself.
_enabled_query: tuple[Any, Any] | None = None


def profiler_enabled() -> bool:
    """Whether torch's profiler records on this thread. False without importing torch
    when torch is not imported."""
    global _enabled_query
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    cached = _enabled_query
    if cached is None or cached[0] is not torch:
        try:
            cached = _enabled_query = (torch, torch._C._autograd._profiler_enabled)
        except AttributeError:  # a torch without it, or one still being imported
            return False
    return bool(cached[1]())


def _enter(torch: Any, name: str) -> Any:
    """Starts a record-function range that can end in another call (what
    torch.profiler.record_function does in __enter__)."""
    return torch.ops.profiler._record_function_enter_new(name, None)


def _exit(torch: Any, handle: Any) -> None:
    torch.ops.profiler._record_function_exit._RecordFunction(handle)


class BubbleRanges:
    """The profiler ranges of the bubble now open on the training thread (one Recorder
    each; training thread only)."""

    __slots__ = ("_cuda", "_nvtx", "_record")

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._record: Any = None  # record-function handle of the open range
        self._nvtx: int | None = None  # NVTX range id of the open range

    def open(self, slot: int) -> None:
        """Bubble slot `slot` has opened: starts its ranges if a profiler records."""
        if self._record is not None or self._nvtx is not None:
            self.close()
        recording = profiler_enabled()
        nvtx = self._cuda and (recording or _NVTX_ALWAYS)
        if not (recording or nvtx):
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        name = f"{BUBBLE_RANGE} {slot}"
        if recording:
            self._record = _enter(torch, name)
        if nvtx:
            self._nvtx = torch.cuda.nvtx.range_start(name)

    def close(self) -> None:
        """The gate has closed: ends the open bubble's ranges, if any."""
        if self._record is None and self._nvtx is None:
            return
        torch = sys.modules["torch"]
        record, self._record = self._record, None
        nvtx, self._nvtx = self._nvtx, None
        if nvtx is not None:
            torch.cuda.nvtx.range_end(nvtx)
        if record is not None:
            _exit(torch, record)


def unix_offset_ns() -> int:
    """Unix time minus steady-clock time, in ns: adds to a ``time.monotonic_ns()`` value
    (the host backend's clock) to give the clock of torch.profiler's traces. The closest
    of a few samples, to within a microsecond."""
    best: tuple[int, int] | None = None
    for _ in range(5):
        m0 = time.monotonic_ns()
        wall = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, wall - (m0 + m1) // 2)
    assert best is not None
    return best[1]
