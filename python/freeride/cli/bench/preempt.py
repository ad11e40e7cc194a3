"""Pause latency: how long after the gate closes side work is still running, against
item duration. On the GPU the clock starts as the close takes effect on the training
stream (the close queued ahead, behind a marker that holds the stream until the host has
enqueued it), and once more for the default harvester with the host enqueuing the close
as the GPU waits for it, its call then in the figure. The GPU mode also measures the
baselines (stream priority only, naive co-location), the delay a training kernel queued
right after the close sees, the admission delay of kernels launched while the gate is
open (bench/admission.py), and each gate write mechanism's cost on the training stream
and visibility latency (bench/gate_write.py)."""

from __future__ import annotations

import random
import time

from freeride import Harvester, tasks

from . import (
    DEVICE_CLOCK_SRC,
    MARKER_AFTER_GO_NS,
    MARKER_SRC,
    MARKER_TIMEOUT_NS,
    PROBE_SRC,
    STAMP_SRC,
    percentiles,
)
from .admission import measure as measure_admission
from .gate_write import measure as measure_gate_write

ITEM_US = (1, 5, 10, 20, 100)  # 10: the target is stated for 10 us items
PAUSE_VARIANT = "freeride, gate in device memory"  # the harvester's default
FLOOR = "no side work (launch floor)"
# The variants measured with the host enqueuing the close as the GPU waits for it.
HOST_ENQUEUED = ", close enqueued as the GPU waits"
# settings["pause_from"]: where the pause's clock starts (benchmarks/measure_table.py
# reads it; a result without it is of the older stamp, before the host's close call).
PAUSE_FROM = "close queued ahead (marker)"


def plot(result: dict, path: str) -> None:
    """Pause latency (p50 and p99) against item duration, one line per variant."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    variants = dict.fromkeys(r["variant"] for r in result["rows"] if r["item_us"] > 0)
    for variant in variants:
        rows = sorted(
            (
                r
                for r in result["rows"]
                if r["variant"] == variant and r.get("p50_us") is not None  # None: all late
            ),
            key=lambda r: r["item_us"],
        )
        x = [r["item_us"] for r in rows]
        line = ax.plot(x, [r["p50_us"] for r in rows], marker="o", label=f"{variant} p50")
        ax.plot(
            x,
            [r["p99_us"] for r in rows],
            marker="x",
            linestyle="--",
            color=line[0].get_color(),
            label=f"{variant} p99",
        )
    ax.plot([1, 100], [2, 200], color="grey", linewidth=0.8, label="2x item duration")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("item duration (us)")
    ax.set_ylabel("pause latency (us)")
    ax.set_title(f"pause latency, {result['device']}, {result['commit']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(path)


def measure(mode: str, quick: bool) -> dict:
    return _cpu(quick) if mode == "cpu" else _gpu(quick)


def _cpu(quick: bool) -> dict:
    """Host backend: the close returns once in-flight items have finished, so the time
    a close takes is the pause latency the training thread pays."""
    trials = 50 if quick else 500
    rows = []
    for item_us in ITEM_US:
        with Harvester("cpu", workers=2) as h:
            handle = h.submit(tasks.Spin(items=2**40, ns_per_item=item_us * 1000))
            while handle.items_done == 0:
                time.sleep(0.001)
            lat = []
            for _ in range(trials):
                time.sleep(random.uniform(0.0005, 0.002))  # side work refills the workers
                t0 = time.perf_counter_ns()
                h.gate.close(stream="host")
                lat.append((time.perf_counter_ns() - t0) / 1000)
                h.gate.open(stream="host")
            handle.cancel()
        rows.append(
            {"variant": "freeride host", "item_us": item_us, **percentiles(lat), "trials": trials}
        )
    return {
        "rows": rows,
        "settings": {"workers": 2, "trials": trials},
        "notes": [
            "host backend: latency = time gate.close() takes to drain in-flight items",
            "gate write mechanisms (FREERIDE_GATE_WRITE) are measured in GPU mode only",
        ],
    }


_STAMP_SRC = (
    DEVICE_CLOCK_SRC
    + STAMP_SRC
    + MARKER_SRC
    + PROBE_SRC
    + r"""
extern "C" __global__ void plain_spin(unsigned long long ns, unsigned long long reps) {
  for (unsigned long long r = 0; r < reps; ++r) {
    unsigned long long t0 = now();
    while (now() - t0 < ns) {}
  }
}
"""
)


def _gpu(quick: bool) -> dict:
    import cupy as cp
    import numpy as np

    from freeride import backend_info

    sms = backend_info()["devices"][0]["sm_count"]
    mod = cp.RawModule(code=_STAMP_SRC)
    stamp, marker, probe, plain_spin = (
        mod.get_function(n) for n in ("stamp", "marker", "probe", "plain_spin")
    )
    trials = 50 if quick else 300
    blocks = 2 * sms  # two 1024-thread blocks per SM: the probe needs every SM
    close_t = cp.zeros(1, dtype=cp.uint64)
    starts = cp.zeros(blocks, dtype=cp.uint64)
    # Pinned host memory is mapped at the same address on the device (UVA).
    go_mem = cp.cuda.alloc_pinned_memory(4)
    go = np.frombuffer(go_mem, dtype=np.uint32, count=1)
    marker_args = (
        np.uint64(go_mem.ptr),
        close_t,
        np.uint64(MARKER_TIMEOUT_NS),
        np.uint64(MARKER_AFTER_GO_NS),
    )
    # CUDA clamps a priority outside the device's range to the nearest end, so this is
    # the highest priority there is (CuPy 14 has no deviceGetStreamPriorityRange).
    least, greatest = 0, -(2**16)  # CUDA's least priority is 0
    train = cp.cuda.Stream(non_blocking=True, priority=greatest)

    def trial(gate_stream, h, ahead: bool = True) -> tuple[float, float] | None:
        """(pause latency, start delay): when the probe's last and first blocks started,
        after the close's place on the training stream. The probe fills every SM, so its
        last block starts once side work has left the whole device. `ahead`: the close,
        the probe and the open are queued behind a marker that holds the stream until the
        host has enqueued them all, so the clock starts as the close takes effect (the
        metric); otherwise behind a stamp, and the host enqueues them as the GPU waits (the
        host's close call is in the figure). None: the marker saw no flag (a stalled host)."""
        with train:
            if ahead:
                go[0] = 0  # seen by the marker: a launch orders the host's earlier stores
                marker((1,), (1,), marker_args)
            else:
                stamp((1,), (1,), (close_t,))
            if h is not None:
                h.gate.close(stream=gate_stream)
            probe((blocks,), (1024,), (starts,))
            if h is not None:
                h.gate.open(stream=gate_stream)
        go[0] = 1
        train.synchronize()
        t = int(close_t.get()[0])
        if t == 0:
            return None
        s = starts.get().astype("int64")
        return (int(s.max()) - t) / 1000.0, (int(s.min()) - t) / 1000.0

    def row(variant: str, item_us: int, results: list[tuple[float, float] | None]) -> dict:
        kept = [r for r in results if r is not None]
        if kept:
            pause = percentiles([r[0] for r in kept])
            start = percentiles([r[1] for r in kept])
        else:  # every trial late: no figure (None, as admission rows have it)
            pause = dict.fromkeys(("p50_us", "p99_us", "max_us", "mean_us"))
            start = dict.fromkeys(("p50_us", "p99_us"))
        return {
            "variant": variant,
            "item_us": item_us,
            **pause,
            "start_p50_us": start["p50_us"],
            "start_p99_us": start["p99_us"],
            "trials": len(kept),
            "late": len(results) - len(kept),
        }

    rows = [
        row(FLOOR, 0, [trial(None, None) for _ in range(trials)]),
        row(FLOOR + HOST_ENQUEUED, 0, [trial(None, None, False) for _ in range(trials)]),
    ]
    # freeride (gate in device or mapped host memory), and the kernel-slicing baseline:
    # one wave of one-item blocks per launch, each slice held behind a stream wait; then
    # the default once more with the host enqueuing as the GPU waits.
    variants = (
        (PAUSE_VARIANT, {}, 0, True),
        ("freeride, gate in host memory", {"gate_in_host_memory": True}, 0, True),
        ("sliced grid behind stream waits", {"stream_wait": True}, sms * 16, True),
        (PAUSE_VARIANT + HOST_ENQUEUED, {}, 0, False),
    )
    for name, options, slice_blocks, ahead in variants:
        for item_us in ITEM_US:
            with Harvester("cuda:0", **options) as h:
                side = tasks.Spin(
                    items=2**40, ns_per_item=item_us * 1000, slice_blocks=slice_blocks
                )
                handle = h.submit(side)
                while handle.items_done == 0:
                    time.sleep(0.001)
                results = []
                for _ in range(trials):
                    time.sleep(0.002)
                    results.append(trial(train, h, ahead))
                handle.cancel()
            rows.append(row(name, item_us, results))
    # Baselines without a gate: a non-preemptible kernel of the same items, on the
    # lowest-priority stream (stream priority only) and at the training stream's own
    # priority (naive co-location).
    for variant, priority in (("stream priority only", least), ("naive co-location", greatest)):
        side = cp.cuda.Stream(non_blocking=True, priority=priority)
        for item_us in ITEM_US:
            results = []
            for _ in range(max(10, trials // 5)):
                with side:  # ~20 ms of side work resident on every SM
                    plain_spin((sms * 16,), (128,), (item_us * 1000, max(1, 20_000 // item_us)))
                time.sleep(0.002)
                results.append(trial(None, None))
                side.synchronize()
            rows.append(row(variant, item_us, results))
    admission = measure_admission(quick)
    rows += admission["rows"]
    gate_write = measure_gate_write(quick)
    rows += gate_write["rows"]
    return {
        "rows": rows,
        "settings": {
            "admission": admission["settings"],
            "gate_write": gate_write["settings"],
            "trials": trials,
            "pause_from": PAUSE_FROM,
            "marker_after_flag_us": MARKER_AFTER_GO_NS / 1000,
            "probe_blocks": blocks,
            "probe_threads": 1024,
            "spin_threads": 128,
            "slice_blocks": sms * 16,
        },
        "notes": [
            (
                "pause latency (p50/p99/max) = last probe block start - the marker's stamp"
                " just before the close on the training stream (close, probe and open"
                " queued behind it): the device is free of side work"
            ),
            (
                f"rows ending '{HOST_ENQUEUED}': the stamp is taken before the host enqueues"
                " the close, so the host's close call is in the figure (the GPU waits for"
                " the host)"
            ),
            (
                "start_* = first probe block start - that stamp: the delay a training kernel"
                " queued right after the close sees before it starts"
            ),
            "baselines: side kernels of the same items without a gate",
            *admission["notes"],
            *gate_write["notes"],
        ],
    }
