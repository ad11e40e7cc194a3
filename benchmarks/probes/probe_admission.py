"""Where does the side admission delay come from: the wake-ups, or the launch? (review
2026-11-26, G8)

    FREERIDE_LAUNCH_AT_OPEN=0 python3 probe_admission.py                         # ring
    FREERIDE_LAUNCH_AT_OPEN=0 FREERIDE_ADMISSION=poll python3 probe_admission.py # poll
    FREERIDE_LAUNCH_AT_OPEN=0 FREERIDE_WATCHER_LAUNCH=1 python3 probe_admission.py # watcher
    FREERIDE_LAUNCH_AT_OPEN=0 FREERIDE_ADMISSION=spin python3 probe_admission.py # spin
    python3 probe_admission.py                                                   # at-open

The H200 measured a 266 us median (min 157 us) from a stream-ordered open taking effect
to the side task's first item when the executor admits the launch itself ("ring": a
watcher thread wakes from a blocking-sync event, rings the executor's bell, the executor
wakes and launches). The review attributes most of it to the two sleeping-thread wake-ups.

Each of 40 trials: close the gate from the host and let the side launch end; on a
training stream (priority -1) a ~1 ms kernel, then a stream-ordered open; the host spins
until it sees the open take effect (the gate's mirror), then until the task's item count
moves (published every 8 items; items of 1 us). Delay = the second minus the first, on
the host's clock (a few us of Python included). Every spin has a 2 s limit ("stuck").

Outcomes (the review's prediction): poll's median about 40-80 us, far below ring's ~266
us, confirms that the wake-ups dominate the executor's path; poll close to ring says the
launch itself (or the first item) costs it. At-open about 10-20 us: the launch queued at
the open is the fast path (it can even start before the host sees the mirror: then the
delay is about 0). "stuck" trials mean an open never took effect or nothing ran after it.
Watcher (issue 36 item 1, FREERIDE_WATCHER_LAUNCH=1): the watcher's thread launches as it
wakes, then rings, so one wake-up is left of ring's two; its launches are counted
(`watcher_launches` in the JSON). Spin (FREERIDE_ADMISSION=spin): no wake-up at all, the
executor yielding between looks at the mirror while the task waits: what is left is its
launch and the first items (the probe's own look at the mirror spins too), for a host
core, which the closed-gate second below shows (expected: about 1 CPU-s a second).

First, with the gate closed from the host and the task waiting for it, the executor
thread's wake-ups (context switches of "freeride-exec", from /proc) and the process's CPU
time over one second: issue 36's "the executor sleeps through compute". Opens all come
from one stream here, so every one rings: the executor's own looks at the mirror are the
20 ms backstop (about 50 a second; 1 ms looks, about 1,000, before 995a586).

Each trial is also split by the executor's stamps (`admission_stamps`, on the clock of
time.monotonic_ns): the watcher's wait for the open's event returned (`reached`), the
executor saw the gate open (`woke`), the launch it made was enqueued (`launched`); with
the host's own readings (`seen`, `items`) they give the parts of the delay, each a median
over the trials whose stamps are of their own open (`parts` in the JSON; the result line
lists them): each the gap between two readings next to each other among those a trial
has (CHAIN below says which each mode has).

`--trials N` (default 40) sets the number of trials (the measure step of
benchmarks/run_gpu.sh runs 200, enough for a p99); `--json PATH` also writes the
figures there (every delay, p50/p90/p99, the settings; an `error` where the probe
stopped early), for benchmarks/measure_table.py.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from _probe import bounded, cycles_per_ms, hard_exit, percentile, result, wait_until, write_json

NAME = "probe_admission"
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests")
TRIALS = 40
SPIN_LIMIT_S = 2.0
IDLE_S = 1.0  # how long the closed gate's cost is measured


# The readings of one trial, in the order the admission passes them: the host sees the
# mirror open, the watcher's wait for the open's event returns, the executor sees the gate
# open and launches, the host's launch is enqueued, the host sees the first items. A part
# is the gap between two readings next to each other among those the trial has, named by
# its ends, and only stamps of the trial's own open count (an older open's: the step did
# not happen for this one). So each mode gets its own chain: ring seen->reached (the
# blocking-sync event's wake-up), reached->woke (the bell's), woke->launched (the
# executor's path), launched->items (the GPU's start, the count's publication); poll
# seen->woke (its look) on; the watcher's launch reached->launched; launches at opens
# seen->reached->items (the GPU's own launch). "reached" may come before "seen": both wait
# for the same write, so parts are signed.
CHAIN = ("seen", "reached", "woke", "launched", "items")


def split_admission(parts: dict[str, list[float]], stamps, seq: int, seen: int, items: int) -> None:
    """Adds one trial's parts to `parts` (µs, by name): `stamps` is the executor's
    admission_stamps (None: a build without them), `seen` and `items` the host's own
    readings of the trial's open `seq`, on the same clock."""
    if stamps is None:
        return
    at = {"seen": seen, "items": items}
    for step in ("reached", "woke", "launched"):
        stamp = stamps.get(step)
        if stamp is not None and stamp[0] == seq:
            at[step] = stamp[1]
    present = [name for name in CHAIN if name in at]
    for a, b in itertools.pairwise(present):
        parts.setdefault(f"{a}->{b}", []).append((at[b] - at[a]) / 1e3)


def parts_text(parts: dict) -> str:
    """The parts' medians as the result line shows them (those no trial had left out)."""
    shown = [
        f"{name} {p['p50_us']:.0f} ({p['trials']})" for name, p in parts.items() if p["trials"]
    ]
    return ", ".join(shown) if shown else "no stamps of the trials' opens"


def main() -> None:
    parser = argparse.ArgumentParser(description="open seen -> first side items (G8)")
    parser.add_argument("--trials", type=int, default=TRIALS)
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    trials = max(1, args.trials)
    out: dict = {
        "probe": NAME,
        "trials": trials,
        "env": {
            k: os.environ.get(k, "unset")
            for k in ("FREERIDE_LAUNCH_AT_OPEN", "FREERIDE_ADMISSION", "FREERIDE_WATCHER_LAUNCH")
        },
    }

    def fail(text: str, code: int) -> NoReturn:
        result(NAME, text)
        write_json(args.json, {**out, "error": text})
        hard_exit(code)

    try:
        measure(args, trials, out, fail)
    except Exception as exc:  # the JSON says why, then the traceback as usual
        write_json(args.json, {**out, "error": f"{type(exc).__name__}: {exc}"})
        raise


def measure(
    args: argparse.Namespace, trials: int, out: dict, fail: Callable[[str, int], NoReturn]
) -> None:
    import torch

    import freeride as fr

    sys.path.insert(0, os.path.abspath(TESTS))
    from gpu_worker import exec_wakeups

    torch.ones(1, device="cuda").cpu()
    cyc = cycles_per_ms(torch)
    train = torch.cuda.Stream(priority=-1)  # before the harvester: creation may wait
    d: list[float] = []
    stuck = 0
    h = fr.Harvester("cuda:0")
    t = h.submit(fr.tasks.Spin(2**40, 1_000))
    out.update(
        admission=h.admission, launches_at_opens=h.launches_at_opens, reserve=h.reserve_mechanism
    )
    if not wait_until(lambda: t.items_done > 0, 30):
        fail("the Spin task never ran", 1)
    time.sleep(0.1)
    # The closed gate's cost: the executor thread waits for an open (no launch in flight).
    h.gate.close(stream="host")
    time.sleep(0.2)
    wake0, cpu0, wall0 = exec_wakeups(), time.process_time(), time.monotonic()
    time.sleep(IDLE_S)
    wall = time.monotonic() - wall0
    out.update(
        closed_wakeups_per_s=(exec_wakeups() - wake0) / wall,
        closed_cpu_per_s=(time.process_time() - cpu0) / wall,
    )
    parts: dict[str, list[float]] = {}
    for _ in range(trials):
        h.gate.close(stream="host")
        time.sleep(0.02)  # the launch in flight ends; the executor waits for an open
        before = t.items_done
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(cyc))
            h.gate.open()
        # time.monotonic_ns: the clock of the executor's stamps (admission_stamps).
        deadline = time.monotonic_ns() + int(SPIN_LIMIT_S * 1e9)
        while not h.gate.is_open and time.monotonic_ns() < deadline:
            pass
        t0 = time.monotonic_ns()
        seq = h.gate.seq  # the open's: nothing else writes the gate meanwhile
        while t.items_done == before and time.monotonic_ns() < deadline:
            pass
        t1 = time.monotonic_ns()
        if t1 >= deadline:
            stuck += 1
            if not bounded(train.synchronize, 10.0).done:
                fail("the training stream never reached its open", 2)
            continue
        d.append((t1 - t0) / 1e3)
        split_admission(parts, getattr(h._ex, "admission_stamps", None), seq, t0, t1)
    h.gate.close(stream="host")
    t.cancel()
    watcher_launches = getattr(h._ex, "watcher_launches", None)  # None: a build without it
    how = (
        f"admission={h.admission} launches_at_opens={h.launches_at_opens} "
        f"(FREERIDE_LAUNCH_AT_OPEN={os.environ.get('FREERIDE_LAUNCH_AT_OPEN', 'unset')}, "
        f"FREERIDE_ADMISSION={os.environ.get('FREERIDE_ADMISSION', 'unset')}, "
        f"FREERIDE_WATCHER_LAUNCH={os.environ.get('FREERIDE_WATCHER_LAUNCH', 'unset')}: "
        f"{watcher_launches} launches the watcher's), reserve {h.reserve_mechanism}"
    )
    d.sort()
    out.update(delays_us=d, kept=len(d), stuck=stuck, watcher_launches=watcher_launches)
    # Launches at opens left out because the executor launched for the open first (a
    # look at an open that took effect before its launch was enqueued): how often the
    # trials' opens were host-started after all.
    out["served_by_executor"] = getattr(h.launch_counts(), "served_by_executor", None)
    if d:
        figures = {f"p{q}_us": percentile(d, q) for q in (50, 90, 99)}
        out.update(figures, min_us=d[0], max_us=d[-1])
    out["parts"] = {
        name: {"trials": len(v), "p50_us": percentile(sorted(v), 50) if v else None}
        for name, v in parts.items()
    }
    write_json(args.json, out)  # the figures, before the teardown can hang
    if not bounded(lambda: t.wait(30), 35.0).done:
        fail("the cancelled task did not end within 35 s", 3)
    closed = bounded(h.close, 30.0, "close")
    if not closed.done:
        fail(f"Harvester.close() {closed}", 4)
    if not d:
        result(NAME, f"{how}: every one of {trials} trials stuck")
        return
    result(
        NAME,
        f"{how}: open seen -> first items, over {len(d)} trials: median "
        f"{out['p50_us']:.0f} us, p90 {out['p90_us']:.0f} us, p99 {out['p99_us']:.0f} us, "
        f"min {d[0]:.0f} us, max {d[-1]:.0f} us; stuck {stuck}; gate closed: the executor "
        f"woke {out['closed_wakeups_per_s']:.0f} times a second, the process used "
        f"{out['closed_cpu_per_s']:.3f} CPU-s a second; split (median us, trials): "
        + parts_text(out["parts"]),
    )


if __name__ == "__main__":
    main()
