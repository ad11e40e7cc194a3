"""Gate write mechanisms (FREERIDE_GATE_WRITE): what each costs the training stream and
how soon a side kernel sees it, for the gate in device and in mapped host memory.

Cost: a stream of short kernels on the training stream, with a close and open pair (or a
close alone) inserted between every two kernels, against the same stream without them;
CUDA events around both, the difference per inserted write. A long kernel in front keeps
the GPU busy while the host enqueues, so host overhead does not show as GPU time; the
host's own time per insertion (the training thread's cost) is a row of its own. The batch
mechanism is measured twice: with an event recorded behind every open for the executor's
watcher (FREERIDE_ADMISSION=ring, the default) and with the executor polling instead
("poll"), which shows what the ring costs the training stream.

Launch at open: the host time of a close and open pair with a side task running, whose
runner takes a launch at every stream-ordered open, less the same pair with none: what
enqueueing a bubble's side launch at its open costs the training thread.

Visibility: a kernel just before the write records %globaltimer as it ends; a one-thread
watcher on another stream spins on the gate word and records %globaltimer when it sees
the new value. The difference covers the kernel's retirement, the write and the poll.
"""

from __future__ import annotations

import time
from typing import Any

from freeride import Harvester

from . import DEVICE_CLOCK_SRC, environ, percentiles

MECHANISMS = ("batch", "memop", "copy", "kernel")
# (gate write mechanism, admission): every mechanism as by default, and batch polling.
CONFIGS = tuple((m, "ring") for m in MECHANISMS) + (("batch", "poll"),)
PLACEMENTS = (("device", False), ("host", True))

_SRC = (
    DEVICE_CLOCK_SRC
    + r"""
extern "C" __global__ void spin_for(unsigned long long ns, unsigned long long* end) {
  const unsigned long long t0 = now();
  while (now() - t0 < ns) {}
  if (end != 0 && threadIdx.x == 0) *end = now();
}
// out: [started, saw closed, saw open]; a value left 0 was not seen before the timeout.
extern "C" __global__ void watch(const volatile unsigned int* gate, unsigned long long* out,
                                 unsigned long long timeout_ns) {
  const unsigned long long t0 = now();
  out[0] = t0;
  while (*gate != 0u) { if (now() - t0 > timeout_ns) return; }
  out[1] = now();
  while (*gate != 1u) { if (now() - t0 > timeout_ns) return; }
  out[2] = now();
}
"""
)

KERNEL_NS = 10_000  # the short training kernels of the cost stream
WATCH_LEAD_NS = 200_000  # lets the watcher become resident before the close


def measure(quick: bool) -> dict:
    """Rows for every mechanism the driver offers, in both gate placements; a mechanism
    that falls back (the driver lacks it) gets a row that says so."""
    import cupy as cp

    mod = cp.RawModule(code=_SRC)
    spin_for, watch = mod.get_function("spin_for"), mod.get_function("watch")
    train = cp.cuda.Stream(non_blocking=True, priority=-(2**16))  # clamped to the highest
    watcher = cp.cuda.Stream(non_blocking=True)
    # Every inserted write is up to three stream operations, and a stream holds about a
    # thousand pending ones before the host blocks: past that it could no longer run ahead.
    kernels = 50 if quick else 100
    repeats = 5 if quick else 40
    trials = 30 if quick else 300
    rows: list[dict[str, Any]] = []
    for mechanism, admission in CONFIGS:
        with environ(FREERIDE_GATE_WRITE=mechanism, FREERIDE_ADMISSION=admission):
            for placement, host_gate in PLACEMENTS:
                with Harvester("cuda:0", gate_in_host_memory=host_gate) as h:
                    used = h.gate.write_mechanism
                    base = {
                        "variant": "gate write",
                        "mechanism": mechanism,
                        "gate": placement,
                        "admission": h.admission,
                    }
                    if h.gate.write_fences:
                        base["fenced"] = h.gate.write_fences
                    if used != mechanism:
                        rows.append({**base, "item_us": 0, "unavailable": f"fell back to {used}"})
                        continue
                    for what in ("close+open", "close"):
                        runs = [
                            _extra_us(cp, h, train, spin_for, kernels, what) for _ in range(repeats)
                        ]
                        starved = sum(s for _, s, _ in runs)
                        rows.append(
                            _row(base, f"{what} cost", [e for e, _, _ in runs], starved=starved)
                        )
                        rows.append(_row(base, f"{what} host cost", [h_us for _, _, h_us in runs]))
                    if admission != "ring":
                        continue  # visibility does not depend on how the executor waits
                    seen_close, seen_open, missed = [], [], 0
                    for _ in range(trials):
                        got = _visibility_us(cp, h, train, watcher, spin_for, watch)
                        if got is None:
                            missed += 1
                        else:
                            seen_close.append(got[0])
                            seen_open.append(got[1])
                    if seen_close:
                        rows.append(_row(base, "close visibility", seen_close, missed))
                        rows.append(_row(base, "open visibility", seen_open, missed))
    rows += _launch_at_open_rows(cp, train, spin_for, repeats)
    return {
        "rows": rows,
        "settings": {
            "kernel_us": KERNEL_NS / 1000,
            "kernels_per_stream": kernels,
            "cost_repeats": repeats,
            "visibility_trials": trials,
        },
        "notes": [
            (
                "gate write cost = (stream of short kernels with a close+open pair, or a"
                " close, between kernels - without) / kernels: CUDA events, per insertion"
            ),
            (
                "gate write host cost = host time of the enqueueing loop with the writes -"
                " without, per insertion (the training thread's cost; admission 'ring' adds"
                " an event record to every open)"
            ),
            (
                "gate write visibility = watcher's globaltimer on seeing the new value -"
                " globaltimer at the end of the kernel just before the write"
            ),
            (
                "launch at open host cost = host time of an open that enqueues the running"
                " side task's launch (Harvester.launches_at_opens) - of the same open with no"
                f" task running, per open, {OPENS_AHEAD} opens queued ahead of the GPU; its"
                " 'no task' row: the close+open pairs' host time, less the same loop's"
                " training kernels alone"
            ),
        ],
    }


# Opens queued ahead of the GPU per measurement of the launch at open: under the number
# of launches a runner takes in flight (kLaunchRing), so that every one carries a launch.
OPENS_AHEAD = 16


def _launch_at_open_rows(cp: Any, train: Any, spin_for: Any, repeats: int) -> list[dict]:
    """The training thread's cost of the launch an open enqueues for the running task:
    the host time per close and open, with a Spin task running (its runner armed: each
    open enqueues a launch) and with none, behind a kernel that holds the GPU meanwhile."""
    from freeride import tasks

    def host_us_per_pair(h: Harvester) -> float:
        # The loop's training kernel is the user's cost, not the pair's: the same loop
        # without the pairs is taken off, as _extra_us does.
        took = {}
        for pairs in (False, True):
            with train:
                spin_for((1,), (32,), (cp.uint64(OPENS_AHEAD * 200_000), cp.uint64(0)))
                begin = time.perf_counter()
                for _ in range(OPENS_AHEAD):
                    if pairs:
                        h.gate.close(stream=train)
                    spin_for((1,), (32,), (cp.uint64(KERNEL_NS), cp.uint64(0)))
                    if pairs:
                        h.gate.open(stream=train)
                took[pairs] = (time.perf_counter() - begin) * 1e6 / OPENS_AHEAD
            train.synchronize()
        return took[True] - took[False]

    with Harvester("cuda:0") as h:
        base = {"variant": "launch at open", "mechanism": h.gate.write_mechanism, "gate": "device"}
        if not h.launches_at_opens:
            return [{**base, "item_us": 0, "unavailable": "FREERIDE_LAUNCH_AT_OPEN=0"}]
        idle = [host_us_per_pair(h) for _ in range(repeats)]
        task = h.submit(tasks.Spin(items=2**40, ns_per_item=KERNEL_NS))
        h.gate.open(stream="host")
        deadline = time.monotonic() + 30
        while task.items_done == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        before = h.launch_counts()
        busy = [host_us_per_pair(h) for _ in range(repeats)]
        after = h.launch_counts()
        task.cancel()
        h.gate.open(stream="host")
    extra = [b - i for b, i in zip(busy, idle)]
    row = _row(base, "launch at open host cost", extra)
    row["opens_with_launch"] = after.at_opens - before.at_opens
    row["opens"] = OPENS_AHEAD * repeats
    idle_row = _row(base, "close+open host cost, no task", idle)
    # Results before 2026-11-28 left the loop's training kernel in this row.
    idle_row["less_the_kernel"] = True
    return [row, idle_row]


def _row(
    base: dict, metric: str, values_us: list[float], missed: int = 0, starved: int = 0
) -> dict:
    row = {**base, "metric": metric, "item_us": 0, **percentiles(values_us)}
    row["trials"] = len(values_us)
    if missed:
        row["missed"] = missed  # watcher not resident in time, or the write never seen
    if starved:
        row["starved"] = starved  # the GPU caught up with the host: host time may show
    return row


def _extra_us(
    cp: Any, h: Harvester, train: Any, spin_for: Any, kernels: int, what: str
) -> tuple[float, bool, float]:
    """Extra training-stream time per inserted close+open pair (or close), in us, whether
    the GPU reached the measured stream before the host had enqueued all of it, and the
    extra host time per insertion, in us (what the training thread pays)."""
    lead_ns = kernels * 200_000  # outlasts the host's enqueueing of the whole stream

    def elapsed_us(insert: bool) -> tuple[float, bool, float]:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with train:
            spin_for((1,), (32,), (cp.uint64(lead_ns), cp.uint64(0)))
            start.record()
            host_start = time.perf_counter()
            for _ in range(kernels):
                spin_for((1,), (32,), (cp.uint64(KERNEL_NS), cp.uint64(0)))
                if insert:
                    h.gate.close(stream=train)
                    if what == "close+open":
                        h.gate.open(stream=train)
            host_us = (time.perf_counter() - host_start) * 1e6
            end.record()
        starved = start.done
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1000.0, starved, host_us

    plain, starved_plain, host_plain = elapsed_us(False)
    gated, starved_gated, host_gated = elapsed_us(True)
    h.gate.open(stream="host")
    return (
        (gated - plain) / kernels,
        starved_plain or starved_gated,
        (host_gated - host_plain) / kernels,
    )


def _visibility_us(
    cp: Any, h: Harvester, train: Any, watcher: Any, spin_for: Any, watch: Any
) -> tuple[float, float] | None:
    """(close, open) visibility in us, or None where the trial did not measure it."""
    out = cp.zeros(3, dtype=cp.uint64)
    before_close = cp.zeros(1, dtype=cp.uint64)
    before_open = cp.zeros(1, dtype=cp.uint64)
    with watcher:
        watch((1,), (1,), (cp.uint64(h.gate.address), out, cp.uint64(1_000_000_000)))
    with train:
        spin_for((1,), (32,), (cp.uint64(WATCH_LEAD_NS), before_close))
        h.gate.close(stream=train)
        spin_for((1,), (32,), (cp.uint64(50_000), before_open))
        h.gate.open(stream=train)
    train.synchronize()
    watcher.synchronize()
    started, closed, opened = (int(v) for v in out.get())
    t_close, t_open = int(before_close.get()[0]), int(before_open.get()[0])
    if closed == 0 or opened == 0 or started >= t_close:
        return None
    return (closed - t_close) / 1000.0, (opened - t_open) / 1000.0
