"""Why does a close free the GPU of Spin side work only ~7 ms later? (H200 run of
2026-11-27 at 51c0fe7, `freeride bench preempt --mode gpu`)

    python3 probe_pause.py                   # every variant, each in a fresh process
    python3 probe_pause.py --child VARIANT   # one variant; the parent runs these

That run measured a pause latency of ~7 ms at p50 (p99 9-10 ms) for Spin items of 1-100
us with the default harvester (4-5 ms with the gate in host memory), against 30-40 us for
the sliced grid behind stream waits; and even the FIRST block of the probe kernel started
~6.8 ms after the close, although the green context leaves 12 SMs free. Candidates:

- run-on: past its 2 ms time slice a launch claims on while the close that ends its bubble
  is pending (up to 8 slices), and since e697259 every block decides that at every claim
  by reading the latest close ordinal from mapped host memory: thousands of blocks reading
  one host line over PCIe starve the claims and the close's own writes to host memory.
- P1: the close's cuStreamBatchMemOp (every write with the default memory barrier: the
  H200's driver refused CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) waits for the side kernel.
- P2: launches at opens (FREERIDE_LAUNCH_AT_OPEN=1, the default) queue something in front
  of the probe.
- P3: the training and side streams share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).

A trial is bench preempt's: on a highest-priority CuPy stream T, a one-thread `stamp`
kernel, h.gate.close(T), a probe of 2 x SMs blocks of 1024 threads that each stamp their
start (two fill an SM: the last starts once side blocks have left every SM), h.gate.open(T)
and a stamp after the open. Pause latency = last probe block's start - the close stamp;
start latency = first block's start - the close stamp (the close's own execution: the first
blocks fit on the SMs the green context leaves out; under the occupancy cap only where a
1024-thread block fits beside side blocks). All on %globaltimer, in us. Each trial's
timing, after the previous trial's open (side work resumes there: a launch at the open, or
the executor's about 0.25 ms later):

- `0.3ms`: the host sleeps 0.3 ms, then enqueues: the close meets a launch within its slice
  and is pending for microseconds.
- `2ms`: a 2 ms sleep, bench preempt's spacing: the close comes near the slice's end.
- `3ms`: a 3 ms sleep. A launch past its slice with no close pending ends, and the
  executor relaunches within ~0.3 ms: this close usually meets a fresh launch, within its
  slice again (the run-on needs the close pending at the slice's end).
- `3ms-queued`: the host enqueues at once, the close behind a 3 ms one-thread kernel on T:
  the close is pending while the launch passes its slice, so it runs on (the run-on path)
  until the close executes about 1 ms later.

Each row gives the device's spacing (close stamp - previous open's stamp, p50), and per
trial the side launches the executor took, those enqueued at opens, and side items done.

Variants, each in a fresh child (CUDA and freeride read the environment when they start):
default; time_slice=None (no slice: nothing runs on or reads the close ordinal);
time_slice=0.0005; FREERIDE_GATE_WRITE=kernel (one-thread write kernels, no memory
operation; of the accepted values batch, memop, copy and kernel, copy still writes the
sequence words with the kernel); FREERIDE_LAUNCH_AT_OPEN=0; FREERIDE_SUCCESSORS=1 (what
the executor's next launch, queued behind the running one near its slice's end, adds to a
pause: its blocks start as the running one's leave, then exit at their first claim; off
by default until measured);
CUDA_DEVICE_MAX_CONNECTIONS=32
and =1; Reserve(mechanism="occupancy-cap"). Items: Spin(items=2**40, ns_per_item=1 and 20
us), 40 trials per timing. Each child first runs the same trials with no side work (no
harvester yet): its floor; the default child's are printed as the control rows.

Thresholds: a row is "fast" when its pause p50 is within FAST_US = 20 us of the p50 of its
own child's no-side-work row of the same timing, "SLOW" otherwise. The ANSWER lines:
- past the slice only: the default is SLOW at 3ms-queued and fast at 0.3ms -> the run-on
  read path; SLOW at 0.3ms too -> something costs every close, run-on or not.
- for each candidate's variant (time_slice=None: run-on, GATE_WRITE=kernel: P1,
  LAUNCH_AT_OPEN=0: P2, 32 connections: P3): "vanishes: yes" when the variant is fast in
  every row where the default is SLOW, "partly" in some, "no" in none; the p50s side by
  side. The other variants' SLOW rows follow.

Limits: each child CHILD_S = 25 s (a hung one is reported with its stacks, killed, and the
next variant runs), the whole probe TOTAL_S = 105 s (variants not started by then are
listed; with a last child's hang, its stacks and its kill, under 130 s), every trial's
wait TRIAL_LIMIT_S = 2 s (a pause is bounded by 8 slices, 16 ms). Exit status 1 when a
variant hung, failed or was not run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from _probe import bounded, hard_exit, note, result, wait_until

NAME = "probe_pause"
TRIALS = 40
ITEM_US = (1, 20)
FAST_US = 20.0
CHILD_S = 25.0
TOTAL_S = 105.0
MIN_CHILD_S = 10.0  # a child needs ~5 s to start: less left and it is not begun
TRIAL_LIMIT_S = 2.0
MARK = "PROBE_PAUSE_JSON "

# (label, host sleep before the enqueue in s, a training kernel ahead of the close in ns)
TIMINGS = (
    ("0.3ms", 0.0003, 0),
    ("2ms", 0.002, 0),
    ("3ms", 0.003, 0),
    ("3ms-queued", 0.0, 3_000_000),
)
WITHIN, PAST = "0.3ms", "3ms-queued"

# name -> (environment, Harvester arguments); in the order they run (the most telling
# first, should the budget run out).
VARIANTS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "default": ({}, {}),
    "time_slice=None": ({}, {"time_slice": None}),
    "FREERIDE_GATE_WRITE=kernel": ({"FREERIDE_GATE_WRITE": "kernel"}, {}),
    "FREERIDE_LAUNCH_AT_OPEN=0": ({"FREERIDE_LAUNCH_AT_OPEN": "0"}, {}),
    "FREERIDE_SUCCESSORS=1": ({"FREERIDE_SUCCESSORS": "1"}, {}),
    "CUDA_DEVICE_MAX_CONNECTIONS=32": ({"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, {}),
    "time_slice=0.0005": ({}, {"time_slice": 0.0005}),
    "reserve=occupancy-cap": ({}, {"reserve": "occupancy-cap"}),
    "CUDA_DEVICE_MAX_CONNECTIONS=1": ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, {}),
}
# Variables a variant sets: none leaks from the caller's environment into another variant.
ENV_KEYS = (
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "FREERIDE_GATE_WRITE",
    "FREERIDE_LAUNCH_AT_OPEN",
    "FREERIDE_SUCCESSORS",
    "FREERIDE_ADMISSION",
)
CANDIDATES = (
    ("time_slice=None", "run-on (no slice: no launch runs on or reads the close ordinal)"),
    ("FREERIDE_GATE_WRITE=kernel", "P1 (the close's memory-op writes wait for side kernels)"),
    ("FREERIDE_LAUNCH_AT_OPEN=0", "P2 (launches at opens queue work in front of the probe)"),
    ("CUDA_DEVICE_MAX_CONNECTIONS=32", "P3 (hardware queues shared with the side stream)"),
)

# bench preempt's kernels (python/freeride/cli/bench/__init__.py), copied so that this
# probe measures the same thing whatever the benchmark becomes; busy holds T for `ns`.
SRC = r"""
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void stamp(unsigned long long* out) { *out = now(); }
extern "C" __global__ void probe(unsigned long long* starts) {
  if (threadIdx.x == 0) starts[blockIdx.x] = now();
}
extern "C" __global__ void busy(unsigned long long ns) {
  unsigned long long t0 = now();
  while (now() - t0 < ns) {}
}
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the child: one variant --------------------------------------------------------------


def child(name: str) -> None:
    _, kwargs = VARIANTS[name]
    out: dict[str, Any] = {"variant": name, "rows": [], "info": {}}

    def emit(code: int, error: str | None = None) -> None:
        if error is not None:
            out["error"] = error
        print(MARK + json.dumps(out), flush=True)
        hard_exit(code)

    try:
        h = measure(kwargs, out, emit)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        emit(1, f"{type(exc).__name__}: {exc}")
    print(MARK + json.dumps(out), flush=True)  # before close: a hang there loses nothing
    closed = bounded(h.close, 10.0, "close")
    if not closed.done:
        note(NAME, f"Harvester.close() {closed}")
    hard_exit(0)  # CuPy's and CUDA's teardown measure nothing


def measure(kwargs: dict[str, Any], out: dict[str, Any], emit: Any) -> Any:
    """Fills out["rows"] and out["info"]; returns the harvester, still open."""
    import cupy as cp
    import numpy as np

    import freeride as fr

    sms = fr.backend_info()["devices"][0]["sm_count"]
    mod = cp.RawModule(code=SRC)
    stamp, probe, busy = (mod.get_function(n) for n in ("stamp", "probe", "busy"))
    blocks = 2 * sms
    # [close stamp, open stamp, each probe block's start]: one read back per trial.
    buf = cp.zeros(blocks + 2, dtype=cp.uint64)
    # The highest priority there is (CUDA clamps); made before the harvester, as stream
    # creation may wait for the device.
    train = cp.cuda.Stream(non_blocking=True, priority=-(2**16))
    done = cp.cuda.Event(disable_timing=True)
    last_open: list[int | None] = [None]

    def trial(h: Any, timing: tuple[str, float, int]) -> tuple[float, float, float | None]:
        _, sleep_s, ahead_ns = timing
        if sleep_s:
            time.sleep(sleep_s)
        with train:
            if ahead_ns:
                busy((1,), (1,), (np.uint64(ahead_ns),))
            stamp((1,), (1,), (buf,))
            if h is not None:
                h.gate.close(stream=train)
            probe((blocks,), (1024,), (buf[2:],))
            if h is not None:
                h.gate.open(stream=train)
            stamp((1,), (1,), (buf[1:],))
        done.record(train)
        deadline = time.perf_counter() + TRIAL_LIMIT_S
        while not done.done:
            if time.perf_counter() > deadline:
                emit(3, f"a trial ({timing[0]}) did not finish within {TRIAL_LIMIT_S} s")
            time.sleep(50e-6)
        v = buf.get(stream=train).astype(np.int64)
        close_t, open_t, starts = int(v[0]), int(v[1]), v[2:]
        spacing = None if last_open[0] is None else (close_t - last_open[0]) / 1000
        last_open[0] = open_t
        return (int(starts.max()) - close_t) / 1000, (int(starts.min()) - close_t) / 1000, spacing

    def row(h: Any, handle: Any, item_us: int, timing: tuple[str, float, int]) -> None:
        counts = h.launch_counts() if h is not None else None
        items = handle.items_done if handle is not None else 0
        got = [trial(h, timing) for _ in range(TRIALS)]
        pause = [g[0] for g in got]
        start = [g[1] for g in got]
        spacing = [g[2] for g in got if g[2] is not None]
        r: dict[str, Any] = {
            "item_us": item_us,
            "timing": timing[0],
            "p50": pct(pause, 0.5),
            "p99": pct(pause, 0.99),
            "max": max(pause),
            "start_p50": pct(start, 0.5),
            "start_p99": pct(start, 0.99),
            "spacing_p50_us": pct(spacing, 0.5) if spacing else None,
            "trials": len(got),
        }
        if h is not None:
            after = h.launch_counts()
            r["launches"] = after.launches - counts.launches
            r["at_opens"] = after.at_opens - counts.at_opens
            r["idle"] = after.idle - counts.idle
            r["items"] = handle.items_done - items
        out["rows"].append(r)

    for _ in range(3):  # module load and first launches, outside the figures
        trial(None, TIMINGS[0])
    for timing in TIMINGS:
        row(None, None, 0, timing)
    options = dict(kwargs)
    if "reserve" in options:
        options["reserve"] = fr.Reserve(mechanism=options["reserve"])
    h = fr.Harvester("cuda:0", **options)
    out["info"] = {
        "time_slice": h.time_slice,
        "slice_bound": h.slice_bound,
        "reserve": h.reserve_mechanism,
        "reserve_fallback": h.reserve_fallback,
        "gate_write": h.gate.write_mechanism,
        "fences": h.gate.write_fences,
        "launches_at_opens": h.launches_at_opens,
        "admission": h.admission,
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }
    for item_us in ITEM_US:
        handle = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_us * 1000))
        if not wait_until(lambda handle=handle: handle.items_done > 0, 10):
            emit(4, f"the Spin task of {item_us} us items never ran")
        time.sleep(0.02)
        for timing in TIMINGS:
            row(h, handle, item_us, timing)
        cancelled = bounded(lambda handle=handle: handle.cancel(timeout=10), 12.0, "cancel")
        if not cancelled.done:
            emit(5, f"cancel() of the {item_us} us task {cancelled}")
    return h


# -- the parent: every variant, the rows and the answers ----------------------------------


def run_variant(name: str, limit: float) -> dict[str, Any]:
    env = dict(os.environ)
    for key in ENV_KEYS:
        env.pop(key, None)
    env.update(VARIANTS[name][0])
    env["PYTHONFAULTHANDLER"] = "1"
    cmd = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--child", name]
    begin = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status = "ok"
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        status = f"HUNG (not done after {limit:.0f} s, killed)"
        note(NAME, f"{name}: not done after {limit:.0f} s; its stacks:\n{native_stacks(proc.pid)}")
        proc.send_signal(signal.SIGABRT)  # faulthandler prints the Python stacks
        try:
            stdout, stderr = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                stdout, stderr = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                stdout, stderr = "", "(the child did not die within 5 s of SIGKILL)"
    seconds = time.monotonic() - begin
    lines = [line for line in (stdout or "").splitlines() if line.startswith(MARK)]
    got: dict[str, Any] = json.loads(lines[-1][len(MARK) :]) if lines else {"rows": [], "info": {}}
    if status == "ok" and (proc.returncode != 0 or not lines):
        status = f"FAILED (exit {proc.returncode})"
    if got.get("error"):
        status = f"{status}: {got['error']}"
    if status != "ok":
        note(NAME, f"{name}: {status}; its stderr ends:\n{(stderr or '')[-3000:]}")
    got["status"] = status
    got["seconds"] = seconds
    return got


def native_stacks(pid: int) -> str:
    spy = shutil.which("py-spy")
    if spy is None:
        return "(no py-spy)"
    try:
        dumped = subprocess.run(
            [spy, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "(py-spy did not finish within 10 s)"
    return (dumped.stdout + dumped.stderr)[-8000:]


def floor_of(got: dict[str, Any], timing: str) -> float | None:
    for r in got["rows"]:
        if r["item_us"] == 0 and r["timing"] == timing:
            return r["p50"]
    return None


def is_fast(got: dict[str, Any], r: dict[str, Any], fallback: dict[str, Any] | None) -> bool:
    floor = floor_of(got, r["timing"])
    if floor is None and fallback is not None:
        floor = floor_of(fallback, r["timing"])
    return floor is not None and r["p50"] <= floor + FAST_US


def row_text(label: str, r: dict[str, Any], verdict: str) -> str:
    spacing = r.get("spacing_p50_us")
    extra = [f"spacing p50 {spacing / 1000:.2f} ms" if spacing is not None else "spacing n/a"]
    if "launches" in r:
        n = max(r["trials"], 1)
        extra.append(
            f"per trial: launches {r['launches'] / n:.2f}, at opens {r['at_opens'] / n:.2f}, "
            f"idle {r['idle'] / n:.2f}, items {r['items'] / n:.0f}"
        )
    return (
        f"{label} item={r['item_us']}us spacing={r['timing']}: pause p50/p99/max "
        f"{r['p50']:.1f}/{r['p99']:.1f}/{r['max']:.1f} us, start p50/p99 "
        f"{r['start_p50']:.1f}/{r['start_p99']:.1f} us, trials {r['trials']} "
        f"({'; '.join(extra)}){verdict}"
    )


def side_rows(got: dict[str, Any] | None) -> dict[tuple[int, str], dict[str, Any]]:
    if not got:
        return {}
    return {(r["item_us"], r["timing"]): r for r in got["rows"] if r["item_us"] > 0}


def report(name: str, got: dict[str, Any], default: dict[str, Any] | None) -> None:
    info = got.get("info") or {}
    if info:
        env = ", ".join(f"{k}={v}" for k, v in info["env"].items() if v is not None) or "none"
        result(
            NAME,
            f"{name}: time_slice {info['time_slice']} (bound {info['slice_bound']}), reserve "
            f"{info['reserve']}, gate write {info['gate_write']} (fences {info['fences']}), "
            f"launches at opens {info['launches_at_opens']}, admission {info['admission']}, "
            f"env {env}; child {got['seconds']:.1f} s, {got['status']}",
        )
    else:
        result(NAME, f"{name}: no harvester measured ({got['status']}, {got['seconds']:.1f} s)")
    if name == "default":
        for r in got["rows"]:
            if r["item_us"] == 0:
                result(NAME, row_text("no side work (control)", r, ""))
    for r in got["rows"]:
        if r["item_us"] > 0:
            verdict = "; fast" if is_fast(got, r, default) else "; SLOW"
            result(NAME, row_text(name, r, verdict))


def slow_keys(got: dict[str, Any]) -> list[tuple[int, str]]:
    return [k for k, r in side_rows(got).items() if not is_fast(got, r, None)]


def answers(results: dict[str, dict[str, Any]]) -> None:
    default = results.get("default")
    rows = side_rows(default)
    if not rows:
        answer(f"not answered: the default variant measured nothing ({_status(default)})")
        return
    slow = slow_keys(default)
    slow_timings = sorted({t for _, t in slow}, key=[t[0] for t in TIMINGS].index)
    fast_timings = [t[0] for t in TIMINGS if t[0] not in slow_timings]
    pattern = (
        f"the default is SLOW at {', '.join(slow_timings) or 'none'}, "
        f"fast at {', '.join(fast_timings) or 'none'}"
    )
    if not slow:
        answer(
            f"no long pause in any default row ({pattern}): (a) does not reproduce at this commit"
        )
    elif any(t == WITHIN for _, t in slow):
        answer(
            f"not only past the slice: {pattern}; a close that meets a launch within its "
            f"slice ({WITHIN}) is slow too, so something costs every close, run-on or not"
        )
    elif any(t == PAST for _, t in slow):
        answer(
            f"yes, only past the slice: {pattern}; slow where the launch runs on with the "
            f"close pending ({PAST}), fast within the slice ({WITHIN}) -> the run-on read path"
        )
    else:
        answer(
            f"timing-dependent: {pattern}; not slow with the close queued past the slice "
            f"({PAST}), so not the run-on read path alone"
        )
    for name, what in CANDIDATES:
        answer(candidate_line(name, what, results.get(name), default, slow))
    for name in VARIANTS:
        if name == "default" or name in dict(CANDIDATES):
            continue
        got = results.get(name)
        if not side_rows(got):
            answer(f"{name}: not measured ({_status(got)})")
            continue
        theirs = slow_keys(got)
        answer(f"{name}: SLOW at {_keys(theirs) or 'none'} (the default: {_keys(slow) or 'none'})")


def candidate_line(
    name: str,
    what: str,
    got: dict[str, Any] | None,
    default: dict[str, Any],
    slow: list[tuple[int, str]],
) -> str:
    rows = side_rows(got)
    if not rows:
        return f"{what}: not measured ({name}: {_status(got)})"
    if name == "FREERIDE_GATE_WRITE=kernel" and got["info"].get("gate_write") != "kernel":
        return f"{what}: not tested: {name} wrote the gate by {got['info'].get('gate_write')}"
    if not slow:
        return f"{what}: nothing to vanish (the default is fast everywhere); {name} SLOW at " + (
            _keys(slow_keys(got)) or "none"
        )
    theirs = side_rows(default)
    gone = [k for k in slow if k in rows and is_fast(got, rows[k], default)]
    verdict = "yes" if len(gone) == len(slow) else "partly" if gone else "no"
    side_by_side = ", ".join(
        f"{t} {i}us {theirs[(i, t)]['p50']:.0f} -> "
        + (f"{rows[(i, t)]['p50']:.0f}" if (i, t) in rows else "n/a")
        for i, t in slow
    )
    return (
        f"{what}: does the long pause vanish with {name}? {verdict} (fast in {len(gone)} of "
        f"{len(slow)} rows where the default is SLOW; pause p50 us, default -> {name}: "
        f"{side_by_side})"
    )


def _keys(keys: list[tuple[int, str]]) -> str:
    return ", ".join(f"{t} {i}us" for i, t in keys)


def _status(got: dict[str, Any] | None) -> str:
    return "not run" if got is None else got.get("status", "?")


def answer(text: str) -> None:
    print(f"ANSWER {NAME}: {text}", flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    begin = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    for name in VARIANTS:
        left = TOTAL_S - (time.monotonic() - begin)
        if left < MIN_CHILD_S:
            result(NAME, f"{name}: NOT RUN (the probe's {TOTAL_S:.0f} s budget is spent)")
            continue
        got = run_variant(name, min(CHILD_S, left))
        results[name] = got
        report(name, got, results.get("default"))
    answers(results)
    note(NAME, f"total {time.monotonic() - begin:.1f} s")
    # A variant that hung, failed or never ran shows as this probe's failure in the summary.
    if len(results) < len(VARIANTS) or any(g["status"] != "ok" for g in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
