"""Does a launch queued at an open hold other streams' work until the GPU reaches that open?
(review 2026-11-26, G2)

    FREERIDE_LAUNCH_AT_OPEN={1,0} python3 probe_channels.py {occupancy-cap,green-context}

With launches at opens on, every stream-ordered open enqueues the side task's launch
behind a wait for that open (cudaStreamWaitEvent on the side or green stream), long before
the training stream T gets there. If the driver expresses that wait as a semaphore acquire
that stalls its hardware queue, every stream sharing the queue (under the default
CUDA_DEVICE_MAX_CONNECTIONS=8 about one stream in 8: NCCL's, a copy stream, the step
stream) waits until T reaches the open: training overhead that no benchmark measures.

What it does: 24 independent streams are made first (streams spread round-robin over the
hardware queues), then the harvester (Spin task, gate closed from the host, the executor
waiting for an open). T gets a ~300 ms kernel, then an open and a close (with launches at
opens on, the open carries a launch). Then each of the 24 streams enqueues a 1 us kernel
and an event. Reported: when T reached its open (an event on T just before it), and when
each stream's event completed; a stream "held" completed no earlier than 5 ms before T
reached its open (an independent 1 us kernel completes in well under a millisecond).

Outcomes:
- held 0/24: nothing waited for T's future open.
- held k/24 with launches at opens on (k about 24/8 = 3), times near T's open, and fewer
  held in the run with FREERIDE_LAUNCH_AT_OPEN=0: the wait for a future open stalls its
  hardware queue (G2 confirmed); the streams held in both runs share T's own queue (the
  open's fenced write waits there for T's kernel), which is not G2.
- never done > 0: a stream was still held 3 s later, long after T's open: worse than G2.
- "the open carried no launch" with launches at opens on: the run tests nothing.
"""

from __future__ import annotations

import os
import sys
import time

from _probe import bounded, cycles_per_ms, hard_exit, note, result

NAME = "probe_channels"
OTHERS = 24
HOLD_MS = 300.0
HELD_SLACK_MS = 5.0


def main() -> None:
    mechanism = sys.argv[1] if len(sys.argv) > 1 else "occupancy-cap"
    import torch

    import freeride as fr

    torch.ones(1, device="cuda").cpu()
    cyc = cycles_per_ms(torch)
    # Every stream before the harvester: creating a stream may wait for the device.
    T = torch.cuda.Stream()
    others = [torch.cuda.Stream() for _ in range(OTHERS)]
    events = [torch.cuda.Event() for _ in range(OTHERS)]
    reached = torch.cuda.Event()
    h = fr.Harvester("cuda:0", reserve=fr.Reserve(mechanism=mechanism))
    note(
        NAME,
        f"reserve {h.reserve_mechanism} (fallback: {h.reserve_fallback}), launches at opens "
        f"{h.launches_at_opens}, CUDA_DEVICE_MAX_CONNECTIONS="
        f"{os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset (8)')}, "
        f"{cyc / 1e6:.2f} GHz",
    )
    t = h.submit(fr.tasks.Spin(10**9, 10_000))
    time.sleep(0.2)  # it runs with the gate open
    h.gate.close(stream="host")
    time.sleep(0.2)  # its launch ended; the executor waits for an open
    before = h.launch_counts()
    with torch.cuda.stream(T):
        torch.cuda._sleep(int(HOLD_MS * cyc))  # T reaches its open in ~300 ms
        reached.record()
        h.gate.open(stream=T)  # with launches at opens: a launch waiting for this point
        h.gate.close(stream=T)
    for s, e in zip(others, events, strict=True):  # independent work, enqueued after it
        with torch.cuda.stream(s):
            torch.cuda._sleep(1000)
            e.record()
    t0 = time.perf_counter()
    done: dict[int, float] = {}
    reached_ms = None
    while (len(done) < OTHERS or reached_ms is None) and time.perf_counter() - t0 < 3.0:
        now = (time.perf_counter() - t0) * 1e3
        if reached_ms is None and reached.query():
            reached_ms = now
        for i, e in enumerate(events):
            if i not in done and e.query():
                done[i] = now
    sync = bounded(T.synchronize, 10.0, "T.synchronize")
    after = h.launch_counts()
    carried = after.at_opens - before.at_opens
    if reached_ms is None:
        result(NAME, f"T did not reach its open within 3 s ({HOLD_MS:.0f} ms expected)")
        hard_exit(1)
    held = sorted(round(ms, 1) for ms in done.values() if ms >= reached_ms - HELD_SLACK_MS)
    free = sorted(round(ms, 2) for ms in done.values() if ms < reached_ms - HELD_SLACK_MS)
    never = OTHERS - len(done)
    result(
        NAME,
        f"{mechanism} -> {h.reserve_mechanism}, launches at opens {h.launches_at_opens}: "
        f"{len(held)}/{OTHERS} independent streams held until T's open "
        f"(T reached it at {reached_ms:.1f} ms; held streams done at ms {held}); "
        f"never done within 3 s: {never}; the others done by {max(free, default=0)} ms; "
        f"launches at this open: {carried}",
    )
    if h.launches_at_opens and carried == 0:
        result(NAME, "the open carried no launch: this run does not test G2")
    if not sync.done:
        result(NAME, f"T.synchronize() {sync}: hung after the close; leaving")
        hard_exit(2)
    t.cancel()
    closed = bounded(h.close, 30.0, "close")
    if not closed.done:
        result(NAME, f"Harvester.close() {closed}")
        hard_exit(3)


if __name__ == "__main__":
    main()
