"""Does creating a stream wait for running side kernels, and for a bubble whose close is
already enqueued? (review 2026-11-26, Q3's open question)

    python3 probe_stream_create.py {occupancy-cap,green-context}

On the H200 (driver 580) torch's first torch.cuda.Stream() (cudaStreamCreateWithPriority)
waited for a running side launch. If stream creation waits for every running kernel
(device-wide), it waits at most a time slice while the gate is open; if it waits for side
kernels in particular, or the side launch runs on to its bubble's enqueued close (the
slice extension), a stream or NCCL communicator created in a bubble waits for that bubble.

Each line times one CuPy stream creation (cudaStreamCreateWithFlags, non-blocking) made
on a fresh thread, with a 2 s limit ("blocked" past it):
1. a training kernel (~300 ms) runs, no harvester: does creation wait for any running
   kernel? ~0 ms: no; ~300 ms: yes, it is device-wide.
2. side work running with the gate open, time_slice=0.002: expect at most about a slice
   plus an item if it waits (the launch ends at its slice and the executor relaunches).
3. the same inside a 300 ms bubble whose close is already enqueued on the training stream
   (open; wait for a 300 ms kernel on another stream; close): if creation waits for the
   side launch, it waits until the extension ends: the whole bubble before the cap of
   G4, at most Harvester.slice_bound after it.
4. side work running with the gate open, time_slice=None: the launch runs until the gate
   closes, so "blocked" means creation waits for side kernels; ~0 ms means it does not.
"""

from __future__ import annotations

import sys
import time

from _probe import bounded, cycles_per_ms, hard_exit, note, result, wait_until

NAME = "probe_stream_create"
LIMIT_S = 2.0


def main() -> None:
    mechanism = sys.argv[1] if len(sys.argv) > 1 else "occupancy-cap"
    import cupy as cp
    import torch

    import freeride as fr

    torch.ones(1, device="cuda").cpu()
    cyc = cycles_per_ms(torch)
    made: list = []  # keeps the streams alive: destroying one is not what is timed

    def create():
        made.append(cp.cuda.Stream(non_blocking=True))

    create()  # CuPy's one-time costs
    busy, T, R = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()

    def create_ms() -> str:
        c = bounded(create, LIMIT_S, "create")
        if not c.done:
            return f"blocked (over {LIMIT_S:.0f} s)"
        if c.error is not None:
            return f"error {c.error}"
        return f"{c.seconds * 1e3:.2f} ms"

    with torch.cuda.stream(busy):
        torch.cuda._sleep(int(300 * cyc))
    time.sleep(0.01)
    result(NAME, f"a 300 ms training kernel running, no harvester: create {create_ms()}")
    if not bounded(busy.synchronize, 10.0).done:
        hard_exit(1)

    for slice_s in (0.002, None):
        h = fr.Harvester("cuda:0", reserve=fr.Reserve(mechanism=mechanism), time_slice=slice_s)
        mech = h.reserve_mechanism
        bound = getattr(h, "slice_bound", None)
        note(NAME, f"reserve {mech} (fallback {h.reserve_fallback}), slice_bound {bound}")
        t = h.submit(fr.tasks.Spin(10**9, 10_000))
        if not wait_until(lambda t=t: t.items_done > 0, 30):
            result(NAME, "the Spin task never ran")
            hard_exit(2)
        time.sleep(0.1)
        result(NAME, f"{mech}, time_slice={slice_s}, gate open: create {create_ms()}")
        if slice_s is not None:
            # A bubble whose close is enqueued: T opens, waits for R's 300 ms, closes.
            h.gate.close(stream="host")
            time.sleep(0.02)
            opened, slept = torch.cuda.Event(), torch.cuda.Event()
            with torch.cuda.stream(T):
                h.gate.open(stream=T)
                opened.record()
            with torch.cuda.stream(R):
                R.wait_event(opened)
                torch.cuda._sleep(int(300 * cyc))
                slept.record()
            with torch.cuda.stream(T):
                T.wait_event(slept)
                h.gate.close(stream=T)
            before = t.items_done
            wait_until(lambda t=t, b=before: t.items_done > b, 1.0)
            time.sleep(0.01)  # past the launch's slice: the extension, if any, holds
            inside = not slept.query()
            text = create_ms()
            result(
                NAME,
                f"{mech}, time_slice={slice_s}, in a 300 ms bubble whose close is enqueued "
                f"(bubble still on when creating: {inside}): create {text}",
            )
            if not bounded(T.synchronize, 10.0).done:
                hard_exit(3)
            h.gate.open(stream="host")
        t.cancel()  # with time_slice=None this ends the launch a blocked create waits for
        done = bounded(lambda t=t: t.wait(30), 35.0)
        closed = bounded(h.close, 30.0, "close")
        synced = bounded(torch.cuda.synchronize, 10.0)
        if not (done.done and closed.done and synced.done):
            result(NAME, f"cleanup hung: cancel {done}, close {closed}, sync {synced}")
            hard_exit(4)
    # A create blocked above (time_slice=None) has returned by now, once the side launch ended.
    note(NAME, f"{len(made)} streams made in all")


if __name__ == "__main__":
    main()
