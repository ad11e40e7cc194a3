"""Admission delay: how long a kernel that training launches while side work runs (the
gate open: NCCL's send/recv in a bubble, a stage's receive) takes to have every block
started, for every built-in side task and a RawKernel, against the same launch on an
idle GPU. Each side task runs once under each reserve mechanism: the occupancy cap
(the default) and a green context leaving whole SMs out (opt-in; where the driver has
none, its rows are left out and a note says why). RawKernel stays under the occupancy
cap in both.

Each probe block's first thread adds one to a counter in pinned host memory; the host
times from the launch call until the counter reaches the grid size. That is launch cost
plus admission delay; the idle rows give the launch cost alone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import Harvester, Reserve, tasks
from . import percentiles
from .items import _workloads

_PROBE_SRC = r"""
extern "C" __global__ void probe(unsigned int* counter) {
  if (threadIdx.x == 0) atomicAdd_system(counter, 1u);  // dynamic shared memory: unused
}
"""

_SCALE_SRC = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void scale(fr_item_ctx ctx, float* x, float a, unsigned long long n) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    unsigned long long i = item * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
  });
}
"""

# (name, grid, threads, dynamic shared bytes): a 1-block kernel, and the shape the
# default reserve keeps room for (NCCL-class blocks).
PROBES = (("1 x 1 thread", 1, 1, 0), ("32 x 512 threads, 48 KiB", 32, 512, 48 * 1024))


def measure(quick: bool) -> dict:
    import cupy as cp

    probe = cp.RawModule(code=_PROBE_SRC).get_function("probe")
    probe.max_dynamic_shared_size_bytes = 48 * 1024
    pinned = cp.cuda.alloc_pinned_memory(64)
    counter = np.frombuffer(pinned, dtype=np.uint32, count=1)
    train = cp.cuda.Stream(non_blocking=True, priority=-(2**16))  # clamped to the highest
    trials = 30 if quick else 200

    def delay_us(grid: int, threads: int, shared: int) -> float:
        counter[0] = 0
        t0 = time.perf_counter_ns()
        with train:
            probe((grid,), (threads,), (cp.uint64(pinned.ptr),), shared_mem=shared)
        deadline = t0 + 5_000_000_000
        while counter[0] < grid:
            if time.perf_counter_ns() > deadline:
                train.synchronize()
                break
        us = (time.perf_counter_ns() - t0) / 1000
        train.synchronize()
        return us

    rows = []
    for probe_name, grid, threads, shared in PROBES:
        for _ in range(5):
            delay_us(grid, threads, shared)  # warm-up
        rows.append(
            _row(
                "idle GPU (launch cost)",
                probe_name,
                [delay_us(grid, threads, shared) for _ in range(trials)],
            )
        )
    notes = [
        "delay = launch call to every probe block started (host clock, pinned counter)",
        "idle rows: the launch cost with no side work; the difference is admission delay",
    ]
    for reserve in RESERVES:
        for task_name, make in _side_tasks(quick):
            with Harvester("cuda:0", reserve=reserve) as h:
                if h.reserve_fallback is not None:
                    notes.append(f"no {reserve.mechanism} rows: {h.reserve_fallback}")
                    break
                keep = _KeepBusy(h, make)
                try:
                    for probe_name, grid, threads, shared in PROBES:
                        lat = []
                        for _ in range(trials):
                            keep.refill()
                            time.sleep(random.uniform(0.0005, 0.002))
                            lat.append(delay_us(grid, threads, shared))
                        rows.append(
                            _row(
                                task_name,
                                probe_name,
                                lat,
                                keep.launches(),
                                h.reserve_mechanism,
                            )
                        )
                finally:
                    keep.stop()
    return {
        "rows": rows,
        "settings": {
            "trials": trials,
            "reserve": "default shape; occupancy-cap and green-context",
            "time_slice_s": 0.002,
        },
        "notes": notes,
    }


# The default reserve under each mechanism: the green context opts in, not yet measured.
RESERVES = (Reserve(), Reserve(mechanism="green-context"))


def _row(
    task: str,
    probe: str,
    lat: list[float],
    side_launches: int | None = None,
    reserve: str = "none",
) -> dict:
    return {
        "variant": "admission",
        "task": task,
        "reserve": reserve,
        "probe": probe,
        "item_us": 0,
        **percentiles(lat),
        "trials": len(lat),
        "side_launches": side_launches,
    }


def _side_tasks(quick: bool) -> list[tuple[str, Callable[[], Any]]]:
    import torch

    out: list[tuple[str, Callable[[], Any]]] = [
        ("Spin 5 us", lambda: tasks.Spin(items=2**40, ns_per_item=5000)),
    ]
    out += [(name, make) for name, make, _ in _workloads(True, quick)]
    n = 1 << 24
    x = torch.ones(n, device="cuda:0")
    out.append(
        (
            "RawKernel scale",
            lambda: tasks.RawKernel(_SCALE_SRC, "scale", items=(n + 255) // 256, args=(x, 1.0, n)),
        )
    )
    return out


class _KeepBusy:
    """Keeps one task of a kind running: a finished one is replaced by a fresh one."""

    def __init__(self, h: Harvester, make: Callable[[], Any]) -> None:
        self._h, self._make = h, make
        self._handle = h.submit(make())
        self._launches = 0
        deadline = time.monotonic() + 30
        while self._handle.launches == 0 and time.monotonic() < deadline:
            time.sleep(0.001)

    def refill(self) -> None:
        if self._handle.done():
            self._launches += self._handle.launches
            self._handle.result()  # a failed side task fails the benchmark
            self._handle = self._h.submit(self._make())

    def launches(self) -> int:
        return self._launches + self._handle.launches

    def stop(self) -> None:
        self._handle.cancel()
