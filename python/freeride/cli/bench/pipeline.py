"""Pipeline overhead and harvest: a one-device stage emulator.

fr.simulate lays out the chosen stage's compute actions and waits for one iteration of
an S-stage, M-microbatch schedule; this process plays that stage: real compute for each
action (matrix products on the device: a transformer layer's worth of work) and, for each
wait, a timed wait (a sleep on the host; a one-block wait kernel on a GPU, which holds the
stream as a real receive does). Iterations alternate, in one run, between: no side task;
freeride with each side task (Spin, Saxpy, PageRank, GaussianBlur); stream priority only
(the same side kernels on the lowest-priority stream, the gate always open); and naive
co-location (plain kernels on a normal-priority stream; on the host, a normal-priority
thread). Training overhead compares iteration times in the same run; harvest efficiency
is the side work done during training over what an idle device does in the total bubble
time.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from freeride import Harvester, simulate, tasks

from . import environ

ITEM_US = 20
AT_DEFAULT_PRIORITY = ", training at priority 0"


# The hardware queues the GPU measurement runs under, each in a fresh process (the
# variable is read when the CUDA context is made): the default, and one as Megatron-LM sets
# it, where a side launch made only when the host sees an open would queue behind
# everything training enqueued meanwhile.
CONNECTIONS = (None, "1")
_CHILD = "FREERIDE_BENCH_PIPELINE_CHILD"


def measure(mode: str, quick: bool, iterations: int | None = None) -> dict:
    """`iterations` a variant (default 20, 3 with `quick`); `quick` also shortens the
    compute actions fourfold, which weighs each close four times as much against an
    iteration: `iterations` alone keeps the emulation's own lengths for a short run."""
    if iterations is not None and (
        isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1
    ):
        raise ValueError(f"iterations must be a positive int, got {iterations!r}")
    if mode != "gpu" or os.environ.get(_CHILD):
        return _measure_here(mode, quick, iterations)
    runs = [_measure_in_child(quick, iterations, connections) for connections in CONNECTIONS]
    rows = [row for run in runs for row in run["rows"]]
    notes = [
        f"{note} [connections={run['connections']}]" for run in runs for note in run["notes"][:1]
    ]
    return {
        "rows": rows,
        "settings": {**runs[0]["settings"], "connections": [run["connections"] for run in runs]},
        "notes": notes + runs[0]["notes"][1:],
    }


def _measure_in_child(quick: bool, iterations: int | None, connections: str | None) -> dict:
    """_measure_here in a fresh process with CUDA_DEVICE_MAX_CONNECTIONS as given; its
    rows carry the setting."""
    env = dict(os.environ, **{_CHILD: "1"})
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    code = (
        "import json, sys; from freeride.cli.bench.pipeline import _measure_here; "
        f"print('RESULT ' + json.dumps(_measure_here('gpu', {quick!r}, {iterations!r})))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"the pipeline benchmark with CUDA_DEVICE_MAX_CONNECTIONS={connections} failed "
            f"({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    result = json.loads(lines[-1][len("RESULT ") :])
    shown = connections or "default"
    result["connections"] = shown
    for row in result["rows"]:
        row["connections"] = shown
    return result


def _measure_here(mode: str, quick: bool, iterations: int | None = None) -> dict:
    schedule, stages, microbatches, stage = "1f1b", 4, 8, 1
    iters = iterations or (3 if quick else 20)
    t_f_ms = 1.0 if quick else 4.0
    sim = simulate.simulate(
        schedule,
        stages,
        microbatches,
        t_forward=t_f_ms,
        t_backward=2 * t_f_ms,
        t_comm=0.05 * t_f_ms,
    )
    timeline = sim.ranks[stage]
    closes = len(timeline.actions)  # h.compute() closes the gate before each action
    dev = _Device(mode)
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(Harvester("cuda:0" if mode == "gpu" else "cpu", workers=1))
        seen = None
        if mode == "gpu":
            # The same side work with launches made only when the executor sees an open
            # (FREERIDE_LAUNCH_AT_OPEN=0, read when a harvester is made): what launching at
            # the opens buys, above all under one hardware queue.
            with environ(FREERIDE_LAUNCH_AT_OPEN="0"):
                seen = stack.enter_context(Harvester("cuda:0", workers=1))
        variants = _variants(h, mode, seen)
        idle = {name: side.idle_rate() for name, side in variants.items() if side is not None}
        times: dict[str, list[float]] = {name: [] for name in variants}
        items = dict.fromkeys(variants, 0)
        bubble_ms = dict.fromkeys(variants, 0.0)
        for _ in range(2):  # warm-up: first iterations pay for allocation and caches
            _iteration(h, dev, timeline, gated=False)
        for i in range(iters * len(variants)):
            name = list(variants)[i % len(variants)]
            side = variants[name]
            if side is not None:
                side.start()
            gate_of = side.h if side is not None else h
            with dev.training_stream(high=not name.endswith(AT_DEFAULT_PRIORITY)):
                dev.sync()
                elapsed, waited = _iteration(
                    gate_of, dev, timeline, gated=name.startswith("freeride")
                )
            if side is not None:
                items[name] += side.stop()
            times[name].append(elapsed)
            bubble_ms[name] += waited
    rows = []
    for name in variants:
        own = "baseline" + AT_DEFAULT_PRIORITY if name.endswith(AT_DEFAULT_PRIORITY) else ""
        base = statistics.median(times[own or "baseline"])
        med = statistics.median(times[name])
        capacity = idle.get(name, 0.0) * bubble_ms[name] / 1000
        rows.append(
            {
                "variant": name,
                "iter_ms": med,
                "overhead_pct": (med / base - 1) * 100,
                # What each close costs training, whatever the compute's length: the
                # figure that carries over to another model's iteration.
                "overhead_us_per_close": (
                    (med - base) * 1000 / closes if name.startswith("freeride") else None
                ),
                "side_items": items[name],
                "harvest_eff_pct": 100 * items[name] / capacity if capacity else 0.0,
            }
        )
    return {
        "rows": rows,
        "settings": {
            "schedule": schedule,
            "stages": stages,
            "microbatches": microbatches,
            "stage": stage,
            "iterations_per_variant": iters,
            "closes_per_iteration": closes,
            "t_forward_ms": t_f_ms,
            "t_backward_ms": 2 * t_f_ms,
            "spin_item_us": ITEM_US,
            "simulated_bubble_fraction": timeline.bubble_fraction,
        },
        "notes": [
            "idle side throughput (items/s): "
            + ", ".join(f"{k} {v:,.0f}" for k, v in idle.items()),
            "harvest_eff_pct = side items during training / (idle rate x bubble time)",
            (
                f"overhead_us_per_close = (iter_ms - baseline's) / {closes} closes an "
                "iteration: a pause costs about one item in flight, so this, not the "
                "percentage, carries over to compute actions of another length"
            ),
            (
                "GPU: training runs on a torch stream of the highest priority; the rows "
                f"'{AT_DEFAULT_PRIORITY.strip(', ')}' run it at priority 0 (torch's default, "
                "the side stream's too), overhead against their own baseline"
            ),
        ],
    }


class _Side:
    """Side work that runs while started: a freeride task kept fed (resubmitted when it
    finishes), or a naive co-runner. stop() returns the items done since start()."""

    def __init__(
        self,
        h: Harvester,
        factory: Callable[[], Any] | None = None,
        gate_open: bool = False,
        naive: Callable[[threading.Event], int] | None = None,
    ) -> None:
        self.h, self.factory, self.gate_open, self.naive = h, factory, gate_open, naive
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._items = 0

    def start(self) -> None:
        self._stop.clear()
        self._items = 0
        if self.gate_open:
            self.h.gate.open(stream="host")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        if self.gate_open:
            self.h.gate.close(stream="host")
        return self._items

    def idle_rate(self) -> float:
        """Items per second with the device to itself."""
        opened = self.factory is not None and not self.gate_open
        if opened:
            self.h.gate.open(stream="host")
        self.start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        done = self.stop()
        elapsed = 0.3 + (time.perf_counter() - t0)
        if opened:
            self.h.gate.close(stream="host")
        return done / elapsed

    def _run(self) -> None:
        if self.naive is not None:
            self._items = self.naive(self._stop)
            return
        while not self._stop.is_set():
            handle = self.h.submit(self.factory())
            while not handle.wait(0.002):
                if self._stop.is_set():
                    handle.cancel()
                    break
            self._items += handle.items_done


def _variants(h: Harvester, mode: str, seen: Harvester | None = None) -> dict[str, _Side | None]:
    gpu = mode == "gpu"
    rng = np.random.default_rng(0)

    def spin() -> Any:
        return tasks.Spin(items=2**40, ns_per_item=ITEM_US * 1000)

    n = (1 << 24) if gpu else (1 << 16)
    x, y = _buffers(gpu, (n,), 2)
    nodes = 200_000 if gpu else 2_000
    indices = rng.integers(0, nodes, size=nodes * 8, dtype=np.int64)
    indptr = np.arange(0, nodes * 8 + 1, 8, dtype=np.int64)
    (images,) = _buffers(gpu, (64, 3, 256, 256) if gpu else (2, 3, 32, 32), 1)
    out: dict[str, _Side | None] = {"baseline": None}
    out["freeride: spin"] = _Side(h, spin)
    if seen is not None:
        out["freeride: spin, launched when seen open"] = _Side(seen, spin)
    out["freeride: saxpy"] = _Side(h, lambda: tasks.Saxpy(1e-6, x, y))
    out["freeride: pagerank"] = _Side(
        h, lambda: tasks.PageRank(indptr, indices, iters=10_000 if gpu else 20)
    )
    out["freeride: blur"] = _Side(h, lambda: tasks.GaussianBlur(images, 2.0))
    out["stream priority only: spin"] = _Side(h, spin, gate_open=True)
    out["naive: spin"] = _Side(h, naive=_naive_gpu() if gpu else _naive_cpu)
    if gpu:  # what the training stream's priority buys
        out["baseline" + AT_DEFAULT_PRIORITY] = None
        out["freeride: spin" + AT_DEFAULT_PRIORITY] = _Side(h, spin)
    return out


def _buffers(gpu: bool, shape: tuple[int, ...], count: int) -> list[Any]:
    if gpu:
        import torch

        return [torch.rand(shape, device="cuda") for _ in range(count)]
    rng = np.random.default_rng(1)
    return [rng.random(shape, dtype=np.float32) for _ in range(count)]


def _naive_cpu(stop: threading.Event) -> int:
    """A normal-priority thread doing matrix products (numpy releases the GIL)."""
    a = np.random.default_rng(2).random((128, 128))
    done = 0
    while not stop.is_set():
        np.dot(a, a)
        done += 1
    return done


def _naive_gpu() -> Callable[[threading.Event], int]:
    """Plain (non-preemptible) spin kernels on a normal-priority stream, kept two deep."""
    import cupy as cp

    from freeride import backend_info

    from .preempt import _STAMP_SRC

    sms = backend_info()["devices"][0]["sm_count"]
    plain_spin = cp.RawModule(code=_STAMP_SRC).get_function("plain_spin")
    stream = cp.cuda.Stream(non_blocking=True)
    blocks = sms * 16

    def run(stop: threading.Event) -> int:
        launched, events = 0, []
        while not stop.is_set():
            with stream:
                plain_spin((blocks,), (128,), (ITEM_US * 1000, 1))
            events.append(stream.record())
            launched += blocks
            if len(events) > 2:
                events.pop(0).synchronize()
        stream.synchronize()
        return launched

    return run


def _iteration(
    h: Harvester, dev: _Device, timeline: simulate.RankTimeline, gated: bool
) -> tuple[float, float]:
    """Plays one iteration of the stage; returns its duration and the time it spent
    waiting for neighbours (the bubbles), in ms."""
    t0 = dev.start()
    clock = waited = 0.0
    ctx = h.iteration() if gated else contextlib.nullcontext()
    with ctx:
        for action, start, end in timeline.actions:
            if start > clock:
                waited += dev.wait(start - clock)
            if gated:
                with h.compute(label=action.label):
                    dev.compute(end - start)
            else:
                dev.compute(end - start)
            clock = end
        if timeline.makespan > clock:
            waited += dev.wait(timeline.makespan - clock)
    return dev.stop(t0), waited


class _Device:
    """Compute and waits of a given length, on the host or on the current CUDA stream."""

    def __init__(self, mode: str) -> None:
        import torch

        self.torch = torch
        self.gpu = mode == "gpu"
        # Made now, before any side work: torch creates its stream pool on first use.
        self._high = torch.cuda.Stream(priority=-100) if self.gpu else None  # the highest
        dev = "cuda" if self.gpu else "cpu"
        torch.manual_seed(0)
        size = 2048 if self.gpu else 192
        self.a = torch.randn(size, size, device=dev)
        self.b = torch.randn(size, size, device=dev)
        self.c = torch.empty_like(self.a)
        self.per_ms = self._calibrate()
        if self.gpu:
            self.cycles_per_ms = self._calibrate_sleep()

    def _matmuls(self, count: int) -> None:
        for _ in range(count):
            self.torch.mm(self.a, self.b, out=self.c)  # out= must not alias an input
            self.a, self.c = self.c, self.a
            self.a.mul_(1e-3)

    def _calibrate(self) -> float:
        self._matmuls(3)
        self.sync()
        t0 = time.perf_counter()
        self._matmuls(20)
        self.sync()
        return 20 / ((time.perf_counter() - t0) * 1000)

    def _calibrate_sleep(self) -> float:
        self.torch.cuda._sleep(1_000_000)
        self.sync()
        t0 = time.perf_counter()
        self.torch.cuda._sleep(10_000_000)
        self.sync()
        return 10_000_000 / ((time.perf_counter() - t0) * 1000)

    def training_stream(self, high: bool) -> Any:
        """Runs the stage on a stream of the highest priority (`high`) or on torch's
        default stream (priority 0, the same as the side stream); a no-op on the host."""
        if not self.gpu:
            return contextlib.nullcontext()
        torch = self.torch
        return torch.cuda.stream(self._high if high else torch.cuda.default_stream())

    def compute(self, ms: float) -> None:
        self._matmuls(max(1, round(ms * self.per_ms)))

    def wait(self, ms: float) -> float:
        """Waits `ms` in stream order; returns the wait's length: as asked on a GPU (a
        one-block kernel of calibrated cycles), as measured on the host (sleeps overrun)."""
        if self.gpu:
            self.torch.cuda._sleep(int(ms * self.cycles_per_ms))
            return ms
        t0 = time.perf_counter()
        time.sleep(ms / 1000)
        return (time.perf_counter() - t0) * 1000

    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def start(self):
        if self.gpu:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, t0) -> float:
        if self.gpu:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            return t0.elapsed_time(ev)
        return (time.perf_counter() - t0) * 1000
