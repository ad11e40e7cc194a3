"""Item overhead: every built-in task's preemptible kernels, never paused, against the
same kernels run plain (no gate, no claims, no counters: `for_each_item` with a context
without phase state runs a grid-stride loop over the items).

GPU: the plain run is timed with CUDA events around its kernels on one stream; the
preemptible run by the executor's own stream-ordered marks around each launch, so both
are kernel time and neither includes the host. The host backend runs the plain items on
the calling thread and the preemptible ones on one worker.

On a GPU PageRank's default row runs with device phases (one launch serves every phase,
each count a release), and the workload runs once more with them off
(`FREERIDE_DEVICE_PHASES=0`: one launch a phase at least, a host round trip between
phases), its row named "PageRank, one launch a phase", against the same plain time.
Results before device phases became the default (2026-11-28) have the opposite pair: the
default row one launch a phase, and a "PageRank, device phases" row.

Side-kernel bandwidth against a plain copy: a `copy` row moves the same bytes as the
Saxpy float32 workload (3 x its n floats: a buffer of 1.5 n floats read and one written;
GPU: torch's `copy_`, a device-to-device cudaMemcpyAsync on the whole device, outside the
reserve, timed with CUDA events; host: numpy's `copyto`), and every row with a bandwidth
gets `vs_copy_pct`, its preemptible GB/s against the copy's.

The one place the tooling goes under the public face: what it measures is the core's
own launches (a bound task's core run plain and through the executor, the launch log's
marks), which no user-facing call exposes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from freeride import Harvester, tasks

from . import environ


def measure(mode: str, quick: bool) -> dict:
    gpu = mode == "gpu"
    repeats = (3 if quick else 10) if not gpu else (3 if quick else 20)
    rows = []
    device = "cuda:0" if gpu else "cpu"
    mechanism = None
    device_phases = False
    # The reserve's cost: the same plain kernels on grids that take whole SMs.
    free = Harvester(device, workers=1, reserve=None) if gpu else None
    with Harvester(device, workers=1) as h, free or contextlib.nullcontext():
        h.gate.open(stream="host")
        mechanism = h.reserve_mechanism
        device_phases = h.device_phases
        for name, make, nbytes in _workloads(gpu, quick):
            # Once: validation and uploads are not timed.
            built = make()._build(h.backend, int(h.device.partition(":")[2] or -1))
            plain = _plain_seconds(h, built, repeats, gpu)
            items, launches = _preemptible_seconds(h, built, repeats, gpu)
            row = _overhead_row(name, plain, items, launches)
            if free is not None:
                whole = _plain_seconds(free, built, repeats, gpu)
                row["plain_no_reserve_ms"] = whole * 1000
                row["reserve_cost_pct"] = (plain / whole - 1) * 100
            row["plain_GBps"] = nbytes / plain / 1e9 if nbytes else None
            row["preemptible_GBps"] = nbytes / items / 1e9 if nbytes else None
            rows.append(row)
            if gpu and name.startswith("PageRank"):
                rows.append(_phase_launches_row(name, make, plain, repeats))
    copy = _copy_row(gpu, quick, repeats)
    for row in rows:
        side = row["preemptible_GBps"]
        row["vs_copy_pct"] = 100 * side / copy["plain_GBps"] if side else None
    rows.append(copy)
    return {
        "rows": rows,
        "settings": {
            "repeats": repeats,
            "quick": quick,
            "reserve_mechanism": mechanism,
            # Whether the default rows ran with device phases (the CUDA backend's default
            # since 2026-11-28; benchmarks/measure_table.py reads older results by it).
            "device_phases": device_phases,
        },
        "notes": [
            "plain: the same kernels without the item protocol (grid-stride over items)",
            (
                "GPU: both with the default reserve (settings.reserve_mechanism: a green"
                " context leaving whole SMs out, or side grids capped per SM); reserve_cost:"
                " plain with the reserve against plain on every SM at full occupancy"
            ),
            "host: the preemptible time includes the hand-off to the worker thread",
            (
                "GPU times are kernel times from stream-ordered events; GBps counts the bytes "
                "each task must read and write once"
            ),
            (
                "GPU: PageRank's default row runs with device phases (one launch serves"
                f" every phase); '{PHASE_LAUNCHES}': the same workload with"
                " FREERIDE_DEVICE_PHASES=0 (one launch a phase), against the same plain time"
            ),
            (
                f"{COPY_TASK}: Saxpy float32's bytes moved by a plain copy (GPU: torch copy_,"
                " device to device, on the whole device; host: numpy copyto); vs_copy_pct ="
                " preemptible GBps / the copy's GBps"
            ),
        ],
    }


COPY_TASK = "copy (Saxpy float32's bytes)"
PHASE_LAUNCHES = "PageRank, one launch a phase"


def _phase_launches_row(name: str, make: Callable[[], Any], plain: float, repeats: int) -> dict:
    """The same task's preemptible time with device phases off (FREERIDE_DEVICE_PHASES=0,
    read as a harvester is made: one launch a phase at least, the executor's round trip
    between phases) against the plain time measured above: what device phases save."""
    with environ(FREERIDE_DEVICE_PHASES="0"):
        h = Harvester("cuda:0", workers=1)
    with h:
        h.gate.open(stream="host")
        built = make()._build(h.backend, int(h.device.partition(":")[2] or -1))
        seconds, launches = _preemptible_seconds(h, built, repeats, True)
    rest = name.split(" ", 1)[1]
    row = _overhead_row(f"{PHASE_LAUNCHES}: {rest}", plain, seconds, launches)
    return {**row, "plain_GBps": None, "preemptible_GBps": None}


def _overhead_row(task: str, plain: float, preemptible: float, launches: int) -> dict:
    """A row's times (seconds in, ms out) and the item overhead they make."""
    return {
        "task": task,
        "plain_ms": plain * 1000,
        "preemptible_ms": preemptible * 1000,
        "item_overhead_pct": (preemptible / plain - 1) * 100,
        "launches": launches,
    }


def _saxpy_n(gpu: bool, quick: bool) -> int:
    """The Saxpy workloads' element count (_workloads)."""
    scale = (1 if quick else 4) if gpu else 1
    return (1 << 24) * scale if gpu else 1 << 18


def _copy_row(gpu: bool, quick: bool, repeats: int) -> dict:
    """A plain copy of as many bytes as Saxpy float32 moves (it reads x and y and writes
    y, 3 n floats; the copy reads and writes 1.5 n), timed as the plain kernels are."""
    count = _saxpy_n(gpu, quick) * 3 // 2
    nbytes = 2 * count * 4
    if gpu:
        import torch

        src = torch.rand(count, device="cuda")
        dst = torch.empty_like(src)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            dst.copy_(src)  # warm-up
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(repeats):
                dst.copy_(src)
            end.record(stream)
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000 / repeats
    else:
        host_src = np.random.default_rng(0).random(count, dtype=np.float32)
        host_dst = np.empty_like(host_src)
        np.copyto(host_dst, host_src)  # warm-up
        t0 = time.perf_counter()
        for _ in range(repeats):
            np.copyto(host_dst, host_src)
        seconds = (time.perf_counter() - t0) / repeats
    return {
        "task": COPY_TASK,
        "plain_ms": seconds * 1000,
        "preemptible_ms": None,
        "item_overhead_pct": None,
        "launches": None,
        "plain_GBps": nbytes / seconds / 1e9,
        "preemptible_GBps": None,
        "vs_copy_pct": None,
    }


def _workloads(
    gpu: bool, quick: bool, pagerank_iters: int = 5
) -> list[tuple[str, Callable[[], Any], int]]:
    """(name, task factory, bytes moved or 0). Sizes: large enough on a GPU that launch
    costs do not dominate; small on the host. `pagerank_iters` lets a caller that needs
    a long-running task have one (building a PageRank task sorts its graph on the host,
    too slow to resubmit often)."""
    rng = np.random.default_rng(0)
    scale = (1 if quick else 4) if gpu else 1

    def arr(shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        host = rng.standard_normal(shape).astype(dtype)
        if not gpu:
            return host
        import torch

        return torch.from_numpy(host).cuda()

    out: list[tuple[str, Callable[[], Any], int]] = []
    n = _saxpy_n(gpu, quick)
    for dtype in (np.float32, np.float64):
        x, y = arr((n,), dtype), arr((n,), dtype)
        size = 3 * n * np.dtype(dtype).itemsize
        out.append(
            (f"Saxpy {np.dtype(dtype).name}", lambda x=x, y=y: tasks.Saxpy(1e-3, x, y), size)
        )
    nodes, degree = (500_000 * scale, 16) if gpu else (5_000, 8)
    indices = rng.integers(0, nodes, size=nodes * degree, dtype=np.int64)
    indptr = np.arange(0, nodes * degree + 1, degree, dtype=np.int64)
    out.append(
        (
            f"PageRank {nodes} nodes x{degree}, {pagerank_iters} iters",
            lambda: tasks.PageRank(indptr, indices, iters=pagerank_iters),
            0,
        )
    )
    shape = (16 * scale, 3, 512, 512) if gpu else (2, 3, 64, 64)
    images = arr(shape)
    nbytes = 2 * int(np.prod(shape)) * 4
    out.append((f"GaussianBlur {shape}", lambda: tasks.GaussianBlur(images, 2.0), 2 * nbytes))
    big = (shape[2] * 3 // 2, shape[3] * 3 // 2)
    out.append((f"Resize {shape} -> {big}", lambda: tasks.Resize(images, big), 0))
    return out


def _plain_seconds(h: Harvester, built: Any, repeats: int, gpu: bool) -> float:
    ex = h._ex
    if not gpu:
        ex.run_plain(built.core, 0)  # warm-up
        t0 = time.perf_counter()
        for _ in range(repeats):
            ex.run_plain(built.core, 0)
        return (time.perf_counter() - t0) / repeats
    import torch

    stream = torch.cuda.Stream()
    ex.run_plain(built.core, stream.cuda_stream)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(repeats):
        ex.run_plain(built.core, stream.cuda_stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


def _preemptible_seconds(h: Harvester, built: Any, repeats: int, gpu: bool) -> tuple[float, int]:
    """Mean seconds per run and launches per run; the built task's core goes straight to
    the executor."""
    ex = h._ex

    def run() -> None:
        task_id = ex.submit(built.core, 0)
        try:
            if not ex.wait(task_id, 600.0):
                raise RuntimeError("a benchmark task did not finish within 600 s")
            state, *_rest, error = ex.status(task_id)
            if state != "done":
                raise RuntimeError(f"benchmark task ended {state}: {error}")
        finally:
            ex.forget(task_id)

    run()  # warm-up (and the kernels' first-launch costs)
    if not gpu:
        t0 = time.perf_counter()
        for _ in range(repeats):
            run()
        return (time.perf_counter() - t0) / repeats, 1
    ex.set_recording(True)
    ex.take_launch_log()
    total_ns, launches = 0, 0
    try:
        for _ in range(repeats):
            run()
            for _task, _phase, start, end, _items in ex.take_launch_log():
                if start and end:
                    total_ns += _elapsed(ex, start, end)
                    launches += 1
                for mark in (start, end):
                    if mark:
                        ex.release_mark(mark)
    finally:
        ex.set_recording(False)
    return total_ns / 1e9 / repeats, launches // repeats


def _elapsed(ex: Any, start: int, end: int) -> int:
    deadline = time.monotonic() + 10
    while True:
        ns = ex.elapsed_ns(start, end)
        if ns is not None:
            return ns
        if time.monotonic() > deadline:
            raise RuntimeError("a launch's end mark was not reached within 10 s")
        time.sleep(0.0005)
