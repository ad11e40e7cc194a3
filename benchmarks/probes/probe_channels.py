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

`--opens N` (default 1) queues N open/close pairs on T after its long kernel (a 10 us
kernel between pairs), each of which may carry a launch: with the lookahead bound
(FREERIDE_MAX_LOOKAHEAD=K, read when the harvester is made) only the first K carry one
and the others are counted as `beyond_lookahead` (Harvester.launch_counts()); the RESULT
line names the bound and that count. `--json PATH` also writes the figures there (held,
never done, launches carried, beyond the lookahead, the settings; an `error` where the
probe stopped early), for benchmarks/measure_table.py.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import NoReturn

from _probe import bounded, cycles_per_ms, hard_exit, note, result, write_json

NAME = "probe_channels"
OTHERS = 24
HOLD_MS = 300.0
HELD_SLACK_MS = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description="other streams held by launches at opens (G2)")
    parser.add_argument(
        "mechanism", nargs="?", default="occupancy-cap", choices=("occupancy-cap", "green-context")
    )
    parser.add_argument("--opens", type=int, default=1, help="open/close pairs queued on T")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    mechanism, opens = args.mechanism, max(1, args.opens)
    bound = os.environ.get("FREERIDE_MAX_LOOKAHEAD", "unset")
    out: dict = {
        "probe": NAME,
        "mechanism": mechanism,
        "opens": opens,
        "others": OTHERS,
        "max_lookahead_env": bound,
        "connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset (8)"),
    }

    def fail(text: str, code: int) -> NoReturn:
        result(NAME, text)
        write_json(args.json, {**out, "error": text})
        hard_exit(code)

    try:
        measure(args, out, fail)
    except Exception as exc:  # the JSON says why, then the traceback as usual
        write_json(args.json, {**out, "error": f"{type(exc).__name__}: {exc}"})
        raise


def measure(args: argparse.Namespace, out: dict, fail: Callable[[str, int], NoReturn]) -> None:
    mechanism, opens = args.mechanism, max(1, args.opens)
    bound = out["max_lookahead_env"]
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
        f"{cyc / 1e6:.2f} GHz, FREERIDE_MAX_LOOKAHEAD={bound}, {opens} open(s) on T, "
        f"green context's workqueues: {getattr(h, 'green_workqueues', 'unknown')}",
    )
    out.update(
        reserve=h.reserve_mechanism,
        launches_at_opens=h.launches_at_opens,
        green_workqueues=getattr(h, "green_workqueues", None),
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
        for _ in range(opens - 1):  # more opens ahead: the lookahead bound's subject
            torch.cuda._sleep(int(0.01 * cyc))
            h.gate.open(stream=T)
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
    beyond = after.beyond_lookahead - before.beyond_lookahead
    if reached_ms is None:
        fail(f"T did not reach its open within 3 s ({HOLD_MS:.0f} ms expected)", 1)
    held = sorted(round(ms, 1) for ms in done.values() if ms >= reached_ms - HELD_SLACK_MS)
    free = sorted(round(ms, 2) for ms in done.values() if ms < reached_ms - HELD_SLACK_MS)
    never = OTHERS - len(done)
    out.update(
        held=len(held),
        held_done_ms=held,
        never_done=never,
        reached_ms=reached_ms,
        launches_at_these_opens=carried,
        beyond_lookahead=beyond,
        max_lookahead=after.max_lookahead,
    )
    write_json(args.json, out)  # the figures, before the teardown can hang
    result(
        NAME,
        f"{mechanism} -> {h.reserve_mechanism}, launches at opens {h.launches_at_opens}: "
        f"{len(held)}/{OTHERS} independent streams held until T's open "
        f"(T reached it at {reached_ms:.1f} ms; held streams done at ms {held}); "
        f"never done within 3 s: {never}; the others done by {max(free, default=0)} ms; "
        f"launches at {'this open' if opens == 1 else f'these {opens} opens'}: {carried}; "
        f"FREERIDE_MAX_LOOKAHEAD={bound}: opens left without a launch {beyond}",
    )
    if h.launches_at_opens and carried == 0:
        result(NAME, "the open carried no launch: this run does not test G2")
    if not sync.done:
        fail(f"T.synchronize() {sync}: hung after the close; leaving", 2)
    t.cancel()
    closed = bounded(h.close, 30.0, "close")
    if not closed.done:
        fail(f"Harvester.close() {closed}", 3)


if __name__ == "__main__":
    main()
