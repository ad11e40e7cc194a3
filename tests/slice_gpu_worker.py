"""The measurements of tests/test_slice_gpu.py, each in a fresh process.

A device-wide synchronisation that waits for a side launch that never ends cannot be
interrupted, and the process that issued it cannot exit cleanly either (CUDA's teardown
waits for the same work). So each measurement runs as
`python tests/slice_gpu_worker.py MODE JSON-ARGS` (started by gpu_worker.run_worker),
makes its synchronisations on daemon threads joined with a limit, and prints one line
`RESULT {json}`. After a hang the result says so ("hung": true) and the process leaves
with os._exit, skipping the interpreter's exit; the test then fails with the figures.

Nothing here imports torch, CuPy or freeride at module level (see gpu_worker.py).
"""

from __future__ import annotations

import math
import random
import re
import threading
import time

from gpu_worker import CYCLES_PER_MS, serve_stuck_aware, wait_for

# -- helpers ----------------------------------------------------------------------------------


class _Sync:
    """torch.cuda.synchronize() on a daemon thread: `ms` once it returned, None before."""

    def __init__(self, torch) -> None:
        self.ms: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(torch,), daemon=True)
        self._begin = time.perf_counter()
        self._thread.start()

    def _run(self, torch) -> None:
        try:
            torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 - reported in the result
            self.error = f"{type(exc).__name__}: {exc}"
        self.ms = (time.perf_counter() - self._begin) * 1e3

    def wait(self, seconds: float) -> bool:
        """Waits up to `seconds` more; True once the synchronisation returned."""
        self._thread.join(seconds)
        return self.ms is not None


def _harvester(fr, reserve: str, **kwargs):
    """A CUDA harvester with `reserve`, or (None, reason) where green contexts were asked
    for and the harvester fell back to the occupancy cap."""
    h = fr.Harvester("cuda:0", reserve=fr.Reserve(mechanism=reserve), **kwargs)
    if reserve == "green-context" and h.reserve_fallback is not None:
        reason = h.reserve_fallback
        h.close()
        return None, reason
    return h, None


def _fell_back(fr, reason: str) -> dict:
    return {
        "fallback": reason,
        "driver_has_green_contexts": bool(fr.backend_info()["devices"][0]["green_contexts"]),
    }


def slice_bound_s(fr, h) -> tuple[float, str]:
    """The longest a side launch may run on once the close ending its bubble is enqueued
    (the cap on the slice extension), in seconds, and where the figure came from:
    Harvester.slice_bound where the harvester has it, else the time slice times
    freeride._C.MAX_SLICES, else times 8 (the cap the review proposed)."""
    bound = getattr(h, "slice_bound", None)
    if bound is not None:
        return float(bound), "Harvester.slice_bound"
    slices = getattr(fr._C, "MAX_SLICES", None)
    if slices:
        return h.time_slice * int(slices), f"time_slice x freeride._C.MAX_SLICES ({slices})"
    return h.time_slice * 8, "time_slice x 8 (assumed: no slice_bound exposed)"


def _settings(fr, h) -> dict:
    """The start of a G1 result: what the harvester runs with, and no hang yet."""
    bound, bound_from = slice_bound_s(fr, h)
    return {
        "reserve_mechanism": h.reserve_mechanism,
        "time_slice": h.time_slice,
        "slice_bound": bound,
        "slice_bound_from": bound_from,
        "launches_at_opens": h.launches_at_opens,
        "hung": False,
    }


def _counts(h) -> dict:
    return h.launch_counts()._asdict()


# -- G1: a close/open pair no block saw -------------------------------------------------------


def mode_g1_pair(args: dict) -> dict:
    """Spin with `item_ns` items (2 ms) runs with the gate open. `reps` times: at a random
    point of an item, a close and an open on stream s with nothing between them (the GPU
    executes both within microseconds, while every block is inside an item, so no block
    sees the gate closed), s synchronised, then torch.cuda.synchronize() on a thread,
    waited for up to `limit_s`. Then the negative control of the detector, with
    `control`: a harvester with time_slice=None (its launch runs until the gate closes),
    side work running, the gate open: the same synchronisation must not return within
    `control_wait_s`, and must return once the gate is closed from the host."""
    import torch

    import freeride as fr

    reserve = args["reserve"]
    reps, item_ns = int(args.get("reps", 20)), int(args.get("item_ns", 2_000_000))
    limit_s = float(args.get("limit_s", 5.0))
    torch.cuda.init()
    torch.ones(1, device="cuda").cpu()
    s = torch.cuda.Stream()  # before any side work: creating a stream may wait for it
    torch.cuda.synchronize()
    h, fallback = _harvester(fr, reserve)
    if h is None:
        return _fell_back(fr, fallback)
    out = _settings(fr, h)
    # One-time costs of stream-ordered writes and of a synchronisation, before side work.
    h.gate.close(stream=s)
    h.gate.open(stream=s)
    s.synchronize()
    torch.cuda.synchronize()
    t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_ns))
    wait_for(lambda: t.items_done > 0, 60, "the Spin task started")
    rng = random.Random(1)
    syncs: list[float] = []
    for i in range(reps):
        before = t.items_done
        wait_for(lambda b=before: t.items_done > b, 10, "side work running before the pair")
        time.sleep(rng.uniform(0.0, 2.0) * item_ns / 1e9)  # anywhere in an item
        h.gate.close(stream=s)
        h.gate.open(stream=s)
        s.synchronize()
        sync = _Sync(torch)
        if not sync.wait(limit_s):
            out.update(hung=True, hung_at=i, sync_ms=syncs, launch_counts=_counts(h))
            # What held it: a side launch running on with the gate open ends at a close.
            h.gate.close(stream="host")
            out["released_by_host_close"] = sync.wait(limit_s)
            return out
        if sync.error:
            out.update(error=sync.error, sync_ms=syncs)
            return out
        syncs.append(round(sync.ms, 3))
    out["sync_ms"] = syncs
    out["launch_counts"] = _counts(h)
    out["running"] = not t.done()
    t.cancel()
    t.wait(30)
    h.close()
    if args.get("control", True):
        out["control"] = _control_unsliced(torch, fr, reserve, item_ns, args)
        out["exit_at_once"] = not out["control"].get("released", True)
    return out


def _control_unsliced(torch, fr, reserve, item_ns, args) -> dict:
    wait_s = float(args.get("control_wait_s", 1.0))
    h, fallback = _harvester(fr, reserve, time_slice=None)
    if h is None:
        return {"fallback": fallback}
    t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_ns))
    wait_for(lambda: t.items_done > 0, 60, "the control's Spin task started")
    sync = _Sync(torch)
    blocked = not sync.wait(wait_s)
    h.gate.close(stream="host")
    released = sync.wait(float(args.get("limit_s", 5.0)))
    out = {"blocked": blocked, "released": released, "sync_ms": sync.ms}
    if released:
        t.cancel()
        t.wait(30)
        h.close()
    return out


# -- G1 in a pipeline: an empty compute action ------------------------------------------------


def _recv(torch, train, comm, cycles: int) -> None:
    """A receive in the bubble: `comm` starts a kernel of `cycles` once `train` got here,
    and `train` waits for it (the host enqueues all of it at once, ahead of the GPU)."""
    here, received = torch.cuda.Event(), torch.cuda.Event()
    here.record(train)
    comm.wait_event(here)
    with torch.cuda.stream(comm):
        torch.cuda._sleep(cycles)
    received.record(comm)
    train.wait_event(received)


def mode_g1_pipeline(args: dict) -> dict:
    """`reps` recorded iterations of a manual loop on training stream T, with Spin
    (`item_ns` items) submitted: forward (a 1 ms compute action), a 3 ms receive, backward
    (1 ms), a 3 ms receive, then an empty compute action (DeepSpeed's ReduceTiedGrads with
    no tied modules: its close and open are adjacent in T's order). In the bubble after it
    (the gate open, its close not enqueued yet), torch.cuda.synchronize() on a thread,
    waited for up to `limit_s`; then the optimizer step (1 ms) and the iteration's end."""
    import torch

    import freeride as fr

    reserve = args["reserve"]
    reps, item_ns = int(args.get("reps", 20)), int(args.get("item_ns", 2_000_000))
    limit_s = float(args.get("limit_s", 5.0))
    compute = int(float(args.get("compute_ms", 1.0)) * CYCLES_PER_MS)
    recv = int(float(args.get("recv_ms", 3.0)) * CYCLES_PER_MS)
    torch.cuda.init()
    torch.ones(1, device="cuda").cpu()
    T, R = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    h, fallback = _harvester(fr, reserve)
    if h is None:
        return _fell_back(fr, fallback)
    out = _settings(fr, h)
    h.gate.close(stream=T)
    h.gate.open(stream=T)
    T.synchronize()
    torch.cuda.synchronize()
    h.gate.close(stream="host")
    t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_ns))
    time.sleep(0.05)  # the executor waits for an open
    syncs: list[float] = []
    items: list[int] = []
    for i in range(reps):
        before = t.items_done
        hung = None
        with torch.cuda.stream(T), h.iteration():
            with h.compute(label="forward"):
                torch.cuda._sleep(compute)
            _recv(torch, T, R, recv)
            with h.compute(label="backward"):
                torch.cuda._sleep(compute)
            _recv(torch, T, R, recv)
            with h.compute(label="reduce_tied_grads"):
                pass  # nothing enqueued: the close and the open are adjacent
            # The gate is open here and the close that ends this bubble is not enqueued.
            sync = _Sync(torch)
            if sync.wait(limit_s):
                with h.compute(label="optimizer"):
                    torch.cuda._sleep(compute)
            else:
                hung = sync
        # On a hang, leaving the iteration enqueued its close on T: did that release it?
        if hung is not None:
            out.update(hung=True, hung_at=i, sync_ms=syncs, launch_counts=_counts(h))
            out["released_by_the_next_close"] = hung.wait(limit_s)
            return out
        if sync.error:
            out.update(error=sync.error, sync_ms=syncs)
            return out
        syncs.append(round(sync.ms, 3))
        T.synchronize()
        items.append(t.items_done - before)
    out.update(sync_ms=syncs, items_per_iteration=items, launch_counts=_counts(h))
    t.cancel()
    t.wait(30)
    h.close()
    return out


# -- G4: a training grid larger than the reserve, in a bubble whose close is enqueued ---------

_BUSY_SRC = r"""
extern "C" __global__ void busy(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def _green_split(mechanism: str) -> tuple[int, int] | None:
    """(SMs in the green context, SMs of the device) from "green-context (120 of 132 SMs)"."""
    m = re.search(r"green-context \((\d+) of (\d+) SMs\)", mechanism)
    return (int(m.group(1)), int(m.group(2))) if m else None


def mode_g4(args: dict) -> dict:
    """Spin (`item_ns` items) with the gate closed; then, `reps` times, training stream T
    opens the gate, waits for a `bubble_ms` kernel on stream R (started at the open), and
    closes it: a bubble whose close is enqueued from its start. Once side items run and
    `settle_ms` later (past the launch's slice), a grid of 1024-thread blocks of `block_us`
    each is launched on a third stream X, between two timed events. The grid: 4 x SMs
    blocks under the occupancy cap (whose side grid leaves 768 threads per SM: no block
    fits beside it); in a green context, enough blocks that the SMs left out alone would
    need `green_factor` x the bound (4 x SMs would finish on them at once). Then the same
    grid `sliced_reps` times with the gate opened on T and no close enqueued (the slice
    bounds each launch), and, after the harvester is closed, alone on the idle GPU (the
    control). `max_slices`, where given, is the harvester's."""
    import cupy as cp
    import torch

    import freeride as fr

    reserve = args["reserve"]
    bubble_ms, block_us = float(args.get("bubble_ms", 100.0)), float(args.get("block_us", 20.0))
    item_ns, settle_ms = int(args.get("item_ns", 10_000)), float(args.get("settle_ms", 5.0))
    margin_ms = float(args.get("margin_ms", 10.0))
    reps, sliced_reps = int(args.get("reps", 3)), int(args.get("sliced_reps", 2))
    torch.cuda.init()
    torch.ones(1, device="cuda").cpu()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    per_sm = max(1, props.max_threads_per_multi_processor // 1024)
    busy = cp.RawModule(code=_BUSY_SRC).get_function("busy")
    # Streams, the kernel's module and a first launch before any side work (each may wait
    # for the device).
    T, R, X = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    xs = cp.cuda.ExternalStream(X.cuda_stream)
    ns = cp.uint64(int(block_us * 1000))

    def grid(blocks: int):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(X)
        busy((blocks,), (1024,), (ns,), stream=xs)
        end.record(X)
        return start, end

    _, warm = grid(sms)
    warm.synchronize()
    options = {"max_slices": int(args["max_slices"])} if "max_slices" in args else {}
    h, fallback = _harvester(fr, reserve, **options)
    if h is None:
        return _fell_back(fr, fallback)
    bound_s, bound_from = slice_bound_s(fr, h)
    bound_ms = bound_s * 1e3 + margin_ms
    blocks = 4 * sms
    split = _green_split(h.reserve_mechanism)
    if split is not None:
        left_out = max(1, split[1] - split[0])
        waves = math.ceil(float(args.get("green_factor", 2.0)) * bound_ms * 1000 / block_us)
        blocks = max(blocks, waves * per_sm * left_out)
    out: dict = {
        "reserve_mechanism": h.reserve_mechanism,
        "time_slice": h.time_slice,
        "slice_bound_ms": bound_s * 1e3,
        "slice_bound_from": bound_from,
        "bound_ms": bound_ms,
        "bubble_ms": bubble_ms,
        "sms": sms,
        "blocks": blocks,
        "blocks_per_sm": per_sm,
        "block_us": block_us,
        "green_split": split,
    }
    h.gate.close(stream="host")
    t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_ns))
    time.sleep(0.05)  # the executor waits for an open

    def bubble(close_enqueued: bool) -> dict:
        opened = torch.cuda.Event(enable_timing=True)
        closed = torch.cuda.Event(enable_timing=True)
        slept = torch.cuda.Event()
        with torch.cuda.stream(T):
            h.gate.open(stream=T)
            opened.record(T)
        if close_enqueued:
            R.wait_event(opened)
            with torch.cuda.stream(R):
                torch.cuda._sleep(int(bubble_ms * CYCLES_PER_MS))
            slept.record(R)
            T.wait_event(slept)
            with torch.cuda.stream(T):
                h.gate.close(stream=T)
                closed.record(T)
        before = t.items_done
        wait_for(lambda: t.items_done > before, 5, "side items in the bubble")
        time.sleep(settle_ms / 1000)  # past the launch's slice
        start, end = grid(blocks)
        wait_for(end.query, 10, "the training grid finished")
        if not close_enqueued:
            with torch.cuda.stream(T):
                h.gate.close(stream=T)
                closed.record(T)
        closed.synchronize()
        return {
            "grid_ms": round(start.elapsed_time(end), 3),
            "bubble_ms": round(opened.elapsed_time(closed), 3),
            "grid_began_ms": round(opened.elapsed_time(start), 3),
            "grid_ended_ms": round(opened.elapsed_time(end), 3),
        }

    out["extended"] = [bubble(True) for _ in range(reps)]
    out["sliced"] = [bubble(False) for _ in range(sliced_reps)]
    out["items_done"] = t.items_done
    out["launch_counts"] = _counts(h)
    t.cancel()
    t.wait(30)
    h.close()
    control = []
    for _ in range(3):
        start, end = grid(blocks)
        end.synchronize()
        control.append(round(start.elapsed_time(end), 3))
    out["control_ms"] = control
    return out


MODES = {"g1_pair": mode_g1_pair, "g1_pipeline": mode_g1_pipeline, "g4": mode_g4}


if __name__ == "__main__":
    serve_stuck_aware(MODES)
