"""Pipeline overhead and harvest: a one-device stage emulator.

fr.simulate lays out the chosen stage's compute actions and waits for one iteration of
an S-stage, M-microbatch schedule; this process plays that stage: real compute for each
action (matrix products on the device: a transformer layer's worth of work) and, for each
wait, a timed wait (a sleep on the host; a one-block wait kernel on a GPU, which holds the
stream as a real receive does). Iterations alternate between: no side task; freeride with
a side task; and naive co-location (the same side work with the gate always open).
Training overhead compares iteration times in the same run; harvest efficiency is the side
work done during training over what an idle device does in the total bubble time.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from .. import Harvester, simulate, tasks

MODES = ("baseline", "freeride", "naive")


def measure(mode: str, quick: bool) -> dict:
    schedule, stages, microbatches, stage = "1f1b", 4, 8, 1
    iters = 3 if quick else 20
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
    dev = _Device(mode)
    item_us = 20
    with Harvester("cuda:0" if mode == "gpu" else "cpu", workers=1) as h:
        idle_rate = _idle_rate(h, item_us)
        times = {m: [] for m in MODES}
        items = {m: 0 for m in MODES}
        bubble_ms = {m: 0.0 for m in MODES}
        for i in range(iters * len(MODES)):
            m = MODES[i % len(MODES)]
            handle = None
            if m != "baseline":
                handle = h.submit(tasks.Spin(items=2**40, ns_per_item=item_us * 1000))
            if m == "naive":
                h.gate.open(stream="host")
            dev.sync()
            elapsed = _iteration(h, dev, timeline, gated=m != "naive")
            if handle is not None:
                handle.cancel()
                items[m] += handle.items_done
            h.gate.close(stream="host")
            times[m].append(elapsed)
            # The waits stretch with the machine (a late wake-up is still waiting), so
            # the bubble time is the measured iteration's share the schedule leaves idle.
            bubble_ms[m] += elapsed * timeline.bubble_fraction
    base = statistics.median(times["baseline"])
    rows = []
    for m in MODES:
        med = statistics.median(times[m])
        capacity = idle_rate * bubble_ms[m] / 1000
        rows.append(
            {
                "variant": m,
                "iter_ms": med,
                "overhead_pct": (med / base - 1) * 100,
                "side_items": items[m],
                "harvest_eff_pct": 100 * items[m] / capacity if capacity else 0.0,
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
            "t_forward_ms": t_f_ms,
            "t_backward_ms": 2 * t_f_ms,
            "side_item_us": item_us,
            "simulated_bubble_fraction": timeline.bubble_fraction,
        },
        "notes": [f"idle side throughput {idle_rate:,.0f} items/s"],
    }


def _idle_rate(h: Harvester, item_us: int) -> float:
    h.gate.open(stream="host")
    handle = h.submit(tasks.Spin(items=2**40, ns_per_item=item_us * 1000))
    time.sleep(0.05)
    before, t0 = handle.items_done, time.perf_counter()
    time.sleep(0.3)
    rate = (handle.items_done - before) / (time.perf_counter() - t0)
    handle.cancel()
    h.gate.close(stream="host")
    return rate


def _iteration(h: Harvester, dev: _Device, timeline: simulate.RankTimeline, gated: bool) -> float:
    """Plays one iteration of the stage; returns its duration in ms."""
    t0 = dev.start()
    clock = 0.0
    ctx = h.iteration() if gated else contextlib.nullcontext()
    with ctx:
        for action, start, end in timeline.actions:
            if start > clock:
                dev.wait(start - clock)
            if gated:
                with h.compute(label=action.label):
                    dev.compute(end - start)
            else:
                dev.compute(end - start)
            clock = end
        if timeline.makespan > clock:
            dev.wait(timeline.makespan - clock)
    return dev.stop(t0)


class _Device:
    """Compute and waits of a given length, on the host or on the current CUDA stream."""

    def __init__(self, mode: str) -> None:
        import torch

        self.torch = torch
        self.gpu = mode == "gpu"
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

    def compute(self, ms: float) -> None:
        self._matmuls(max(1, round(ms * self.per_ms)))

    def wait(self, ms: float) -> None:
        if self.gpu:
            self.torch.cuda._sleep(int(ms * self.cycles_per_ms))
        else:
            time.sleep(ms / 1000)

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
