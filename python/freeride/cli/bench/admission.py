"""Admission delay: how soon a kernel that training launches while side work runs (the
gate open: NCCL's send/recv in a bubble, a stage's receive) starts, for every built-in
side task and a RawKernel, against the same launch on an idle GPU in the same run.

Each side task runs once under each reserve mechanism: the occupancy cap (the default)
and a green context leaving whole SMs out (opt-in; where the driver has none, its rows
are left out and a note says why). RawKernel stays under the occupancy cap in both.
Probes go to two training streams: the highest priority there is, and priority 0, the
default of CUDA and torch (what most training code launches on; the side stream's
priority on GPUs whose least priority is 0).

Timing is on the device, so the host's launch cost is not in it. A one-thread marker
kernel and then the probe go to the training stream; the marker spins until the host,
after the probe's launch call has returned, sets a flag in pinned memory, spins 5 us
more (the probe is in the stream by then), and stamps %globaltimer as it ends. Every
probe block's first thread stamps its start. Delay = first block start - marker stamp
(`p50_us`, `p99_us`, `max_us`, `mean_us`); `all_p99_us` = the last block's.

Side work is kept resident for the whole measurement: tasks that finish are queued
ahead, as many as cover a refill interval by the task's measured duration (Spin and
PageRank run long by themselves). A trial is kept only if side items finished both
between the flag and the probe's start and in the 20 us after it, within one launch of
one task; otherwise it is `dropped` (no side grid seen around the probe: a phase or
time-slice relaunch, the switch to the next task). `late`: the marker timed out waiting
for the flag (the host stalled), so the trial says nothing.

Rows (`variant` "admission", `item_us` 0): `task` ("idle GPU (no side work)" for the
baseline), `reserve` (the harvester's reserve_mechanism, "none" for idle), `stream`,
`probe`, the delays above, `target_10us` ("pass" when p99 <= 10 us, else "miss";
"no data" when no trial was kept), `over_idle_p99_us` (p99 minus the idle row's of the
same stream and probe), `trials` (kept), `dropped`, `late`, `side_launches`. Settings
(`settings.admission` of bench preempt): `trials` per row before dropping, `target_us`,
`time_slice_s`, `stream_priorities` (as the driver clamped them), and `side_tasks`, one
entry per task and reserve: `task_ms` (one task alone; None: longer than 0.5 s) and
`queued` (tasks kept submitted, the running one included).
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from freeride import Harvester, Reserve, backend_info, tasks

from . import (
    DEVICE_CLOCK_SRC,
    MARKER_AFTER_GO_NS,
    MARKER_SRC,
    MARKER_TIMEOUT_NS,
    PROBE_SRC,
    percentiles,
)
from .items import _workloads

TARGET_US = 10.0  # issue 10: such a kernel starts within 10 us p99
TIME_SLICE_S = 0.002  # the harvester's default
AFTER_PROBE_NS = 20_000  # the residency check's window after the probe started
PROBE_START_TIMEOUT_S = 10.0
LONG_S = 0.5  # a task still running after this is long-running: nothing queued ahead
REFILL_WINDOW_S = 0.01  # queued work covers this much time between two refills
MAX_QUEUE = 32
RAW_REPS = 1024  # multiply-adds per element per item of the RawKernel: compute-bound

_SRC = (
    DEVICE_CLOCK_SRC
    + MARKER_SRC
    + PROBE_SRC  # launched with dynamic shared memory, which it leaves unused
)

_SCALE_SRC = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void scale(fr_item_ctx ctx, float* x, float a, unsigned long long n,
                                 unsigned int reps) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    unsigned long long i = item * blockDim.x + threadIdx.x;
    if (i < n) {
      float v = x[i];
      for (unsigned int r = 0; r < reps; ++r) v = v * a + 0.0f;
      x[i] = v;
    }
  });
}
"""

# (name, grid, threads, dynamic shared bytes): a 1-block kernel, and the shape the
# default reserve keeps room for (NCCL-class blocks).
PROBES = (("1 x 1 thread", 1, 1, 0), ("32 x 512 threads, 48 KiB", 32, 512, 48 * 1024))
# CUDA clamps a priority outside the device's range to the nearest end, so -2**16 is the
# highest there is; 0 is the default (torch's streams, cudaStreamCreate).
STREAMS = (("highest priority", -(2**16)), ("priority 0 (default)", 0))
# The default reserve under each mechanism: the green context opts in.
RESERVES = (Reserve(mechanism="occupancy-cap"), Reserve(mechanism="green-context"))
IDLE = "idle GPU (no side work)"


class Trial(NamedTuple):
    """One probe: "kept", "dropped" (no side work seen around it) or "late" (the marker
    timed out), and its first and last block's delay after the marker in us."""

    outcome: str
    first_us: float
    all_us: float


# Side work as the host sees it: items finished by the side tasks so far, and the task
# running with its launch count (None when none runs).
Sample = tuple[int, tuple[int, int] | None]


def resident(before: Sample, at_probe: Sample, after: Sample) -> bool:
    """Whether side work ran around a probe: items finished between the flag and the
    probe's start and after it, all within one launch of one task."""
    head = before[1]
    return head is not None and head == after[1] and before[0] < at_probe[0] < after[0]


def summarize(trials: Sequence[Trial], idle_p99_us: float | None) -> dict[str, Any]:
    """A row's measured columns from its trials; only kept trials count in the delays."""
    kept = [t for t in trials if t.outcome == "kept"]
    row: dict[str, Any]
    if kept:
        row = percentiles([t.first_us for t in kept])
        row["target_10us"] = "pass" if row["p99_us"] <= TARGET_US else "miss"
        row["all_p99_us"] = percentiles([t.all_us for t in kept])["p99_us"]
        row["over_idle_p99_us"] = None if idle_p99_us is None else row["p99_us"] - idle_p99_us
    else:
        row = dict.fromkeys(("p50_us", "p99_us", "max_us", "mean_us"))
        row.update(target_10us="no data", all_p99_us=None, over_idle_p99_us=None)
    row["trials"] = len(kept)
    row["dropped"] = sum(t.outcome == "dropped" for t in trials)
    row["late"] = sum(t.outcome == "late" for t in trials)
    return row


def measure(quick: bool) -> dict:
    import cupy as cp

    info = backend_info()["devices"][0]
    probe = _Probe(cp)
    streams = [(name, cp.cuda.Stream(non_blocking=True, priority=p)) for name, p in STREAMS]
    combos = [(s, p) for s in streams for p in PROBES]
    trials = 30 if quick else 200
    rng = random.Random(0)

    def run(side: _SideWork | None) -> dict[tuple[str, str], list[Trial]]:
        """`trials` probes of every stream and shape, interleaved in a random order so
        that each sees the same side work; a random pause before each lets side work
        refill the SMs after the previous probe."""
        out: dict[tuple[str, str], list[Trial]] = {(s[0], p[0]): [] for s, p in combos}
        for _ in range(trials):
            for (stream_name, stream), shape in rng.sample(combos, len(combos)):
                if side is not None:
                    side.refill()
                time.sleep(rng.uniform(0.0005, 0.002))
                out[stream_name, shape[0]].append(probe.trial(stream, shape, side))
        return out

    for (_, stream), shape in combos:
        for _ in range(5):
            probe.trial(stream, shape, None)  # warm-up: module load, first launches
    idle = run(None)
    idle_p99: dict[tuple[str, str], float | None] = {}
    rows = []
    for key, results in idle.items():
        row = summarize(results, None)
        idle_p99[key] = row["p99_us"]
        rows.append(_row(IDLE, "none", key, row, None))
    notes = [
        (
            "admission delay = first probe block start - the end of a marker kernel just"
            " before it on the same stream (%globaltimer; the probe was already in the"
            " stream), so launch cost is not in it; all_p99 = the last block's"
        ),
        (
            f"target_10us: p99 <= {TARGET_US:g} us; over_idle_p99 = p99 - the idle row's p99"
            " (same stream and probe)"
        ),
        (
            "side rows keep only trials with side items finishing around the probe, in one"
            " launch of one task; dropped = trials without, late = host stalled (marker"
            " timed out)"
        ),
        "RawKernel rows run under the occupancy cap with either mechanism",
    ]
    if not info.get("green_contexts", False):
        notes.append("no green-context rows: the driver has no green contexts")
    side_settings = []
    side_tasks = _side_tasks(quick, info["sm_count"])
    for reserve in RESERVES:
        if reserve.mechanism == "green-context" and not info.get("green_contexts", False):
            continue
        for task_name, make in side_tasks:
            with Harvester("cuda:0", reserve=reserve, time_slice=TIME_SLICE_S) as h:
                if h.reserve_fallback is not None:
                    notes.append(f"no {reserve.mechanism} rows: {h.reserve_fallback}")
                    break
                h.gate.open(stream="host")
                side = _SideWork(h, make, task_name)
                try:
                    measured = run(side)
                finally:
                    side.stop()
                side_settings.append(
                    {
                        "task": task_name,
                        "reserve": h.reserve_mechanism,
                        "task_ms": None if side.task_s is None else side.task_s * 1000,
                        "queued": side.depth,
                    }
                )
                for key, results in measured.items():
                    row = summarize(results, idle_p99[key])
                    rows.append(_row(task_name, h.reserve_mechanism, key, row, side.launches()))
    return {
        "rows": rows,
        "settings": {
            "trials": trials,
            "target_us": TARGET_US,
            "reserve": "default shape; occupancy-cap and green-context",
            "time_slice_s": TIME_SLICE_S,
            # as the driver clamped them (None: a CuPy without Stream.priority)
            "stream_priorities": {name: getattr(s, "priority", None) for name, s in streams},
            "marker_after_flag_us": MARKER_AFTER_GO_NS / 1000,
            "residency_window_after_probe_us": AFTER_PROBE_NS / 1000,
            # task_ms None: ran longer than LONG_S, nothing queued behind it but one
            "side_tasks": side_settings,
        },
        "notes": notes,
    }


def _row(
    task: str,
    reserve: str,
    key: tuple[str, str],
    measured: dict[str, Any],
    side_launches: int | None,
) -> dict:
    return {
        "variant": "admission",
        "task": task,
        "reserve": reserve,
        "stream": key[0],
        "probe": key[1],
        "item_us": 0,
        **measured,
        "side_launches": side_launches,
    }


class _Probe:
    """The marker and probe kernels and the pinned words they share with the host."""

    def __init__(self, cp: Any) -> None:
        mod = cp.RawModule(code=_SRC)
        self._marker, self._probe = mod.get_function("marker"), mod.get_function("probe")
        grid_max = max(grid for _, grid, _, _ in PROBES)
        # Pinned host memory is mapped at the same address on the device (UVA).
        self._go_mem = cp.cuda.alloc_pinned_memory(4)
        self._out_mem = cp.cuda.alloc_pinned_memory(8 * (1 + grid_max))
        self._go = np.frombuffer(self._go_mem, dtype=np.uint32, count=1)
        self._out = np.frombuffer(self._out_mem, dtype=np.uint64, count=1 + grid_max)
        self._args = (
            np.uint64(self._go_mem.ptr),
            np.uint64(self._out_mem.ptr),
            np.uint64(MARKER_TIMEOUT_NS),
            np.uint64(MARKER_AFTER_GO_NS),
        )
        self._starts = np.uint64(self._out_mem.ptr + 8)

    def trial(self, stream: Any, shape: tuple[str, int, int, int], side: _SideWork | None) -> Trial:
        _, grid, threads, shared = shape
        go, out = self._go, self._out
        go[0] = 0
        out[:] = 0  # both are visible to the kernels: a launch orders the host's stores
        with stream:
            self._marker((1,), (1,), self._args)
            self._probe((grid,), (threads,), (self._starts,), shared_mem=shared)
        sample = side.sample if side is not None else _no_side
        before = sample()
        go[0] = 1
        # Side work is sampled again once a probe block has started, and once more a
        # little later: the probe's start lies between the first two samples.
        deadline = time.perf_counter() + PROBE_START_TIMEOUT_S
        while out[1] == 0 and time.perf_counter() < deadline:
            pass
        at_probe = sample()
        until = time.perf_counter_ns() + AFTER_PROBE_NS
        while time.perf_counter_ns() < until:
            pass
        stream.synchronize()
        after = sample()
        mark = int(out[0])
        starts = out[1 : 1 + grid].astype(np.int64)
        if mark == 0:
            return Trial("late", math.nan, math.nan)
        first_us = (int(starts.min()) - mark) / 1000
        all_us = (int(starts.max()) - mark) / 1000
        if side is not None and not resident(before, at_probe, after):
            return Trial("dropped", first_us, all_us)
        return Trial("kept", first_us, all_us)


def _no_side() -> Sample:
    return 0, None


class _SideWork:
    """Keeps side tasks of one kind running through a measurement: tasks that finish are
    queued ahead of need, `depth` at a time (the executor runs them one after another,
    FIFO at one priority), and replaced at every refill."""

    def __init__(self, h: Harvester, make: Callable[[], Any], name: str) -> None:
        self._h, self._make = h, make
        self._finished_items = 0
        self._finished_launches = 0
        self._handles: deque[Any] = deque()
        # One task's duration with the GPU to itself, from the second run (the first pays
        # for compilation and first launches); None: longer than LONG_S.
        self.task_s: float | None = None
        running = None
        for _ in range(2):
            t0 = time.perf_counter()
            handle = h.submit(make())
            if not handle.wait(LONG_S):
                running = handle
                break
            self._retire(handle)
            self.task_s = time.perf_counter() - t0
        if running is not None:
            self.task_s = None
            self._handles.append(running)
            self.depth = 2  # one behind it, should it end
        else:
            assert self.task_s is not None
            ahead = math.ceil(REFILL_WINDOW_S / max(self.task_s, 1e-6))
            self.depth = min(MAX_QUEUE, 1 + ahead)
        self.refill()
        start = self.sample()[0]
        deadline = time.monotonic() + 30
        while self.sample()[0] == start:
            if time.monotonic() > deadline:
                raise RuntimeError(f"side task {name} did not start within 30 s")
            time.sleep(0.001)

    def _retire(self, handle: Any) -> None:
        self._finished_items += handle.items_done
        self._finished_launches += handle.launches
        handle.result()  # a failed side task fails the benchmark

    def refill(self) -> None:
        """Retires finished tasks and queues new ones up to `depth`."""
        while self._handles and self._handles[0].done():
            self._retire(self._handles.popleft())
        while len(self._handles) < self.depth:
            self._handles.append(self._h.submit(self._make()))

    def sample(self) -> Sample:
        """Items finished so far, and the running task with its launches. Tasks run in
        submission order, so the first one not final is the one running (or next)."""
        items = self._finished_items
        for handle in self._handles:
            # One status read per task: state, items and launches from the same moment.
            state, done, _total, _phase, launches, *_ = handle._status()
            items += done
            if state not in ("done", "failed", "cancelled"):
                return items, (handle.id, launches)
        return items, None

    def launches(self) -> int:
        """Side launches so far, over every task of this kind."""
        return self._finished_launches + sum(h.launches for h in self._handles)

    def stop(self) -> None:
        # Queued tasks first, so the executor starts none once the running one stops.
        for handle in reversed(self._handles):
            handle.cancel()


def _side_tasks(quick: bool, sms: int) -> list[tuple[str, Callable[[], Any]]]:
    import torch

    out: list[tuple[str, Callable[[], Any]]] = [
        ("Spin 5 us", lambda: tasks.Spin(items=2**40, ns_per_item=5000)),
    ]
    # PageRank's build sorts the graph on the host: it runs long instead of being resubmitted.
    out += [(name, make) for name, make, _ in _workloads(True, quick, pagerank_iters=100_000)]
    items = sms * 4096  # sized to the device: a task of many waves on any GPU
    n = items * 256
    x = torch.ones(n, device="cuda:0")
    out.append(
        (
            f"RawKernel scale x{RAW_REPS}",
            lambda: tasks.RawKernel(
                _SCALE_SRC, "scale", items=items, args=(x, 1.0, n, RAW_REPS), block=256
            ),
        )
    )
    return out
