"""GPU measurements that need a fresh process, and the helpers GPU tests use around them.

Some properties depend on how the CUDA context was made: `CUDA_DEVICE_MAX_CONNECTIONS`
(how many hardware queues the streams share) is read once, when the context is created,
so setting it in a test process whose context already exists changes nothing. Each
measurement here runs as `python tests/gpu_worker.py MODE JSON-ARGS` in a child whose
environment the parent sets before anything imports torch, and prints one line
`RESULT {json}` with its figures (the test asserts on them and prints them, so a run's log
has the numbers).

Nothing here imports torch, CuPy or freeride at module level: the tests import
`run_worker` and `finishes_within` from this file, and the child imports them only after
its environment is in place.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

RESULT = "RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))


# -- helpers for the tests -------------------------------------------------------------------


def run_worker(
    mode: str,
    args: dict | None = None,
    env: dict | None = None,
    timeout=120.0,
    worker: str = "gpu_worker.py",
):
    """Runs MODE of `worker` (a file of this folder that dispatches its modes as this one
    does) in a fresh Python process with `env` added to this environment (and
    CUDA_DEVICE_MAX_CONNECTIONS, FREERIDE_ADMISSION and FREERIDE_GATE_WRITE removed unless
    given), and returns its RESULT dict. Fails the calling test, with the child's output,
    if the child does not finish within `timeout` seconds or exits without a result."""
    import pytest

    child_env = dict(os.environ)
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "FREERIDE_ADMISSION", "FREERIDE_GATE_WRITE"):
        child_env.pop(key, None)
    child_env.update({k: str(v) for k, v in (env or {}).items()})
    child_env["PYTHONFAULTHANDLER"] = "1"
    cmd = [sys.executable, os.path.join(HERE, worker), mode, json.dumps(args or {})]
    proc = subprocess.Popen(
        cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = _hang_report(proc)
        pytest.fail(f"{worker} {mode} {env} did not finish within {timeout} s:\n{stacks}")
    out = stdout + stderr
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"{worker} {mode} {env} exited with {proc.returncode}:\n{out[-4000:]}")
    result = json.loads(lines[-1][len(RESULT) :])
    print(f"{worker} {mode} env={env} args={args}: {json.dumps(result)}")
    return result


def _hang_report(proc: subprocess.Popen) -> str:
    """Where a hung child is: its native stacks (py-spy, where installed), then its Python
    stacks (faulthandler prints them on SIGABRT), then it is killed."""
    native = ""
    spy = shutil.which("py-spy")
    if spy:
        try:
            dumped = subprocess.run(
                [spy, "dump", "--native", "--pid", str(proc.pid)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            native = dumped.stdout + dumped.stderr
        except subprocess.TimeoutExpired:  # the child is still signalled and reaped below
            native = "py-spy dump took more than 60 s"
    proc.send_signal(signal.SIGABRT)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return f"{_text(out)[-3000:]}{_text(err)[-6000:]}\n--- native stacks ---\n{native[-12000:]}"


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def finishes_within(seconds: float, fn, what: str):
    """Runs fn() in a daemon thread and returns its result; fails the test with `what` if
    it has not returned after `seconds` (a test that could otherwise only hang). The
    stuck thread is left behind: the test has failed, and its process should not be
    trusted for further GPU tests."""
    import pytest

    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised in the test's thread)
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"deadline: {what}")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{what} did not return within {seconds} s (hung)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def wait_for(predicate, timeout: float, what: str, pause: float = 0.001) -> None:
    """Asks `predicate` every `pause` seconds (0: without a pause, where the moment it
    turns true is measured) until it holds; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        if pause:
            time.sleep(pause)


# -- the measurements (run in the child) -----------------------------------------------------

# ~1 ms of GPU time at the ~2 GHz an H100 runs at (torch.cuda._sleep counts clock cycles).
CYCLES_PER_MS = 2_000_000


def _queued_behind_a_long_kernel(torch, hold_ms: float) -> dict:
    """The negative control of the hardware-queue tests, without freeride: a long kernel
    on a lowest-priority stream, followed on that stream by stream-ordered operations (an
    event record, a device-to-device copy and a device-to-host copy into pinned memory);
    then, on the training (current) stream, the same small `.cpu()` copy and a small
    kernel with a synchronisation. Where the streams share one hardware queue
    (CUDA_DEVICE_MAX_CONNECTIONS=1), the training stream's operations wait behind them
    until the long kernel ends."""
    side = torch.cuda.Stream(priority=0)  # CUDA's least priority
    x = torch.ones(16, device="cuda")
    src, dst = torch.ones(16, device="cuda"), torch.empty(16, device="cuda")
    pinned = torch.empty(16, pin_memory=True)
    x.cpu()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
        torch.cuda.Event().record(side)
        dst.copy_(src)
        pinned.copy_(src, non_blocking=True)
    time.sleep(0.01)  # the long kernel runs
    begin = time.perf_counter()
    x.cpu()
    copy_s = time.perf_counter() - begin
    begin = time.perf_counter()
    x.add_(1.0)
    torch.cuda.current_stream().synchronize()
    kernel_s = time.perf_counter() - begin
    still_running = not side.query()
    side.synchronize()
    return {
        "hold_ms": hold_ms,
        "copy_ms": copy_s * 1e3,
        "kernel_ms": kernel_s * 1e3,
        "side_running_after": still_running,
    }


def mode_hardware_queues(args: dict) -> dict:
    """Issue 20 item 1: with a long Spin running (items of `item_ns`), a small `.cpu()` copy
    on the training stream, then a gate close on it followed by a synchronisation of that
    stream, each timed on the host, `reps` times; for time_slice=None and the default
    slice. Then the negative control above."""
    import torch

    import freeride as fr

    item_ns, reps = int(args.get("item_ns", 100_000)), int(args.get("reps", 10))
    reserve = fr.Reserve(mechanism=args["reserve"]) if args.get("reserve") else fr.Reserve()
    torch.cuda.init()
    x = torch.ones(16, device="cuda")
    x.cpu()
    # Made before any side work, as a training process makes its streams. (The 2026-11-25
    # hang in cudaStreamCreateWithPriority was most likely the lazy load below: on
    # 2026-11-27 a probe created streams beside a time_slice=None launch in 0.1 ms.)
    other = torch.cuda.Stream()
    # Every kernel the measurement launches for the first time, launched once before any
    # side work: under CUDA's lazy loading (the default) a kernel's first launch loads it,
    # and loading may synchronise the context. With time_slice=None that waits for the
    # side launch, which ends only at a close this thread never gets to enqueue (seen on
    # an H200: stuck in cuLaunchKernel of torch.cuda._sleep).
    with torch.cuda.stream(other):
        torch.cuda._sleep(1)
    x.add_(1.0)
    torch.cuda.synchronize()
    out: dict = {"connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
    for label, kwargs in (("none", {"time_slice": None}), ("default", {})):
        with fr.Harvester("cuda:0", reserve=reserve, **kwargs) as h:
            train = torch.cuda.current_stream()
            h.gate.close()  # one-time costs of stream-ordered writes, before side work
            h.gate.open()
            train.synchronize()
            t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_ns))
            wait_for(lambda t=t: t.items_done > 0, 60, "the Spin task started")
            time.sleep(0.05)  # every block of the grid is up
            copies, closes, stalls = [], [], 0
            gc.disable()
            try:
                for _ in range(reps):
                    begin = time.perf_counter()
                    x.cpu()
                    copies.append(time.perf_counter() - begin)
                    begin = time.perf_counter()
                    h.gate.close()
                    train.synchronize()
                    closes.append(time.perf_counter() - begin)
                    h.gate.open()
                    before = t.items_done
                    try:
                        wait_for(lambda t=t, b=before: t.items_done > b, 10, "side work resumed")
                    except AssertionError:
                        stalls += 1
                    time.sleep(0.01)  # a launch well under way
            finally:
                gc.enable()
            loop = {  # what the loop measured, and the settings
                "copy_ms": [round(s * 1e3, 4) for s in copies],
                "close_ms": [round(s * 1e3, 4) for s in closes],
                "running": not t.done(),
                "resume_stalls": stalls,
                "launches": t.launches,
                "reserve_mechanism": h.reserve_mechanism,
                "admission": h.admission,
                "time_slice": h.time_slice,
            }
            # A long kernel on a second training stream (an NCCL-like one) while side work
            # relaunches every slice: a kernel on the first stream still starts at once.
            # (With time_slice=None and 100 us items each close and reopen of the loop
            # took effect inside an item: a launch that ran on through them held this
            # kernel for good behind the next open's launch under one hardware queue,
            # on an H200 at cf361a5. So the wait is bounded: a failure, not a hang.)
            with torch.cuda.stream(other):
                torch.cuda._sleep(int(50 * CYCLES_PER_MS))
            begin = time.perf_counter()
            x.add_(1.0)
            try:  # asked without a pause: the time until it completes is the figure
                wait_for(train.query, 5.0, "the training kernel", pause=0)
            except AssertionError:
                # Nothing this process enqueues gets past the launch ahead any more (a
                # close from the host goes through the control stream, behind it under
                # one hardware queue): report and leave without closing.
                out[label] = {**loop, "training_kernel_stuck": True}
                print(RESULT + json.dumps(out), flush=True)
                os._exit(0)
            beside_other = time.perf_counter() - begin
            other_still_running = not other.query()
            other.synchronize()
            # A more urgent task preempts the running one: its stop word goes on the
            # control stream (one hardware queue: behind nothing that waits for side work)
            # and the training stream's next copy must not wait for anything.
            urgent = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_ns), priority=1)
            begin = time.perf_counter()
            x.cpu()
            copy_after_preempt = time.perf_counter() - begin
            try:
                wait_for(lambda u=urgent: u.items_done > 0, 10, "the urgent task ran")
                urgent_ran = True
            except AssertionError:
                urgent_ran = False
            begin = time.perf_counter()
            urgent.cancel()
            t.cancel()
            cancel_s = time.perf_counter() - begin
            begin = time.perf_counter()
            x.cpu()
            copy_after_cancel = time.perf_counter() - begin
            t.wait(30)
            urgent.wait(30)
            out[label] = {
                "kernel_beside_other_stream_ms": round(beside_other * 1e3, 4),
                "training_kernel_stuck": False,
                "other_stream_was_running": other_still_running,
                "copy_after_preempt_ms": round(copy_after_preempt * 1e3, 4),
                "copy_after_cancel_ms": round(copy_after_cancel * 1e3, 4),
                "cancel_ms": round(cancel_s * 1e3, 4),
                "urgent_ran": urgent_ran,
                **loop,
            }
    out["item_ms"] = item_ns / 1e6
    out["control"] = _queued_behind_a_long_kernel(torch, hold_ms=300.0)
    return out


def mode_queue_control(args: dict) -> dict:
    """Only the negative control (no freeride), with `hold_ms` of GPU time."""
    import torch

    torch.cuda.init()
    return _queued_behind_a_long_kernel(torch, float(args.get("hold_ms", 300.0)))


def exec_wakeups() -> int:
    """Context switches of the executor threads ("freeride-exec") so far (each sleep that
    ends is one); probes/probe_admission.py counts with it too."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "freeride-exec":
                    continue
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def _admission_delays(torch, h, t, trials: int, blocker=None) -> dict:
    """`trials` times: close the gate from the host, let the launch end and the executor
    thread settle in its wait, then open the gate in stream order on a training stream
    (behind ~1 ms of GPU time, so the host is already watching). The host notes when the
    gate's mirror reads open and when the side task's first item after it is counted: the
    admission delay. `blocker`, a stream whose own open is still ahead of the GPU (its
    ring is first in the watcher's queue), makes the ring of every training open come only
    after it: admission then rests on the executor's look at the mirror every 1 ms."""
    train = torch.cuda.Stream(priority=-1)
    delays, stuck, in_order = [], 0, 0
    for _ in range(trials):
        h.gate.close(stream="host")
        time.sleep(0.02)
        before = t.items_done
        with torch.cuda.stream(train):
            torch.cuda._sleep(CYCLES_PER_MS)
            h.gate.open()
        deadline = time.perf_counter() + 2.0
        while not h.gate.is_open:
            if time.perf_counter() > deadline:
                break
        opened = time.perf_counter()
        if opened > deadline:
            stuck += 1
            train.synchronize()
            continue
        seq = h.gate.seq  # the open's: nothing else writes the gate meanwhile
        while t.items_done == before:
            if time.perf_counter() > deadline:
                break
        delays.append(time.perf_counter() - opened)
        # probe_admission splits its delays by these stamps, which only holds if each
        # is of the trial's own open and they come in the path's order.
        stamps = h._ex.admission_stamps
        steps = [stamps[k] for k in ("reached", "woke", "launched")]
        if all(st is not None and st[0] == seq for st in steps):
            in_order += steps[0][1] <= steps[1][1] <= steps[2][1]
    train.synchronize()
    h.gate.close(stream="host")
    out = {
        "delays_us": [round(d * 1e6, 1) for d in delays],
        "median_us": round(statistics.median(delays) * 1e6, 1) if delays else None,
        "stuck": stuck,
        "stamps_in_order": in_order,
    }
    if blocker is not None:
        out["blocker_still_ahead"] = not blocker.query()
    return out


def _closed_gate_cost(fr, h) -> dict:
    """With a task waiting for the closed gate: CPU time of the whole process and
    wake-ups of the executor thread, per second, over one second."""
    h.gate.close(stream="host")
    t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=1_000))
    time.sleep(0.2)  # the executor thread reaches its wait for the gate
    wake0, cpu0, wall0 = exec_wakeups(), time.process_time(), time.monotonic()
    time.sleep(1.0)
    wall = time.monotonic() - wall0
    return t, {
        "admission": h.admission,
        "cpu_per_s": (time.process_time() - cpu0) / wall,
        "wakeups_per_s": (exec_wakeups() - wake0) / wall,
        "items_while_closed": t.items_done,
    }


def mode_admission(args: dict) -> dict:
    """The closed gate's cost (above) under ring admission, then the admission delay of
    stream-ordered opens, and the same with the watcher held up by an open still ahead of
    the GPU on another stream (the negative control of the delay). Then the closed gate's
    cost again, now that opens came on two streams (the executor looks at the mirror
    every millisecond), and with FREERIDE_ADMISSION=poll (read when a harvester is made):
    the negative controls of the cost."""
    import torch

    import freeride as fr

    trials = int(args.get("trials", 30))
    torch.cuda.init()
    torch.ones(1, device="cuda").cpu()
    out: dict = {}
    with fr.Harvester("cuda:0") as h:
        t, out["ring_cost"] = _closed_gate_cost(fr, h)
        out["ring"] = _admission_delays(torch, h, t, trials)
        blocker = torch.cuda.Stream()
        with torch.cuda.stream(blocker):
            # Outlasts the trials (~25 ms each) by far; checked after them.
            torch.cuda._sleep(int((trials * 40 + 1000) * CYCLES_PER_MS))
            h.gate.open()
        out["watcher_held"] = _admission_delays(torch, h, t, trials, blocker)
        blocker.synchronize()
        h.gate.open(stream="host")
        t.cancel()
        out["ring_cancelled"] = t.wait(30)
        # Opens came on two streams: from now on the executor looks every millisecond.
        t, out["unrung_cost"] = _closed_gate_cost(fr, h)
        h.gate.open(stream="host")
        t.cancel()
        out["unrung_cancelled"] = t.wait(30)
    os.environ["FREERIDE_ADMISSION"] = "poll"
    with fr.Harvester("cuda:0") as h:
        t, out["poll_cost"] = _closed_gate_cost(fr, h)
        h.gate.open(stream="host")
        t.cancel()
        out["poll_cancelled"] = t.wait(30)
    return out


def mode_admission_env(args: dict) -> dict:
    """test_gate's admission check in a process whose environment was set before CUDA
    initialised: the admission the harvester reports, and a task submitted with the gate
    closed that a stream-ordered open on the default stream admits. Where
    CUDA_DEVICE_MAX_CONNECTIONS is set, the negative control first shows the setting took
    effect (or not)."""
    import torch

    import freeride as fr

    torch.cuda.init()
    out: dict = {"connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
    if out["connections"] is not None:
        out["control"] = _queued_behind_a_long_kernel(torch, hold_ms=300.0)
    with fr.Harvester("cuda:0") as h:
        out["admission"] = h.admission
        task = fr.tasks.ItemCounter(20_000, ns_per_item=2_000)
        h.gate.close(stream="host")
        t = h.submit(task)
        h.gate.open(stream=0)
        out["finished"] = t.wait(timeout=60)
        out["exactly_once"] = bool(out["finished"] and (t.result().counts == 1).all())
    return out


_PRIORITY_SRC = r"""
extern "C" __global__ void hold(unsigned long long ns, unsigned long long* last_end) {
  if (threadIdx.x == 0) {
    const unsigned long long t0 = now();
    while (now() - t0 < ns) {}
    atomicMax(last_end, now());
  }
}
"""


def mode_priority(args: dict) -> dict:
    """A plain grid of many waves of short blocks on the harvester's side stream, then,
    while it runs, a one-block kernel on a training stream of priority `priorities[i]`:
    how long before the side grid's end the training kernel started. The block scheduler
    hands a more urgent stream's blocks out as side blocks retire; at equal priority it
    hands out the earlier grid's blocks first, so the training kernel starts only in the
    side grid's last wave."""
    import cupy as cp
    import torch

    import freeride as fr
    from freeride.cli.bench import DEVICE_CLOCK_SRC, STAMP_SRC

    block_ns, waves = int(args.get("block_ns", 20_000)), int(args.get("waves", 5_000))
    torch.cuda.init()
    module = cp.RawModule(code=DEVICE_CLOCK_SRC + STAMP_SRC + _PRIORITY_SRC)
    hold, stamp = module.get_function("hold"), module.get_function("stamp")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = sms * 16 * waves  # 16 blocks of 128 threads fill an SM's 2048 threads
    last_end, at = cp.zeros(1, dtype=cp.uint64), cp.zeros(1, dtype=cp.uint64)
    out: dict = {"runs": []}
    with fr.Harvester("cuda:0") as h:
        side_torch = torch.cuda.ExternalStream(h.side_stream)
        out["side_priority"] = side_torch.priority
        side = cp.cuda.ExternalStream(h.side_stream)
        # torch's priorities: 0 is CUDA's least (the side stream's); -1 is more urgent.
        for priority in args.get("priorities", [-1, 0]):
            train_torch = torch.cuda.Stream(priority=priority)
            train = cp.cuda.ExternalStream(train_torch.cuda_stream)
            # Loaded and warmed up before the measurement.
            hold((1,), (128,), (cp.uint64(0), last_end), stream=side)
            stamp((1,), (1,), (at,), stream=train)
            cp.cuda.Device().synchronize()
            last_end.fill(0)
            at.fill(0)
            cp.cuda.Device().synchronize()
            begin = time.perf_counter()
            hold((blocks,), (128,), (cp.uint64(block_ns), last_end), stream=side)
            time.sleep(0.01)  # the side grid is running, with most of its waves to go
            stamp((1,), (1,), (at,), stream=train)
            train.synchronize()
            stamped_s = time.perf_counter() - begin
            side.synchronize()
            total_s = time.perf_counter() - begin
            gap_ns = int(last_end.get()[0]) - int(at.get()[0])
            out["runs"].append(
                {
                    "priority": train_torch.priority,
                    "gap_ms": gap_ns / 1e6,
                    "train_done_after_ms": stamped_s * 1e3,
                    "side_done_after_ms": total_s * 1e3,
                }
            )
    return out


def _queue_iterations(torch, h, train, comm, iterations: int, compute_ms: float, recv_ms: float):
    """Enqueues `iterations` of [close, compute, open, a "recv" of `recv_ms` on `comm`
    (after the open), the training stream waits for it, close, compute] on `train`, all
    from the host before the GPU gets to them (the caller holds the GPU with a kernel in
    front). Returns the events that bound the queued work on `train`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(train):
        start.record()
        for _ in range(iterations):
            h.gate.close()
            torch.cuda._sleep(int(compute_ms * CYCLES_PER_MS))
            h.gate.open()
            opened = torch.cuda.Event()
            opened.record()
            with torch.cuda.stream(comm):
                comm.wait_event(opened)
                torch.cuda._sleep(int(recv_ms * CYCLES_PER_MS))
                received = torch.cuda.Event()
                received.record()
            train.wait_event(received)
            h.gate.close()
            torch.cuda._sleep(int(compute_ms * CYCLES_PER_MS))
        end.record()
    return start, end


def _bubble_rate(torch, h, t, train, bubble_ms: float = 10.0, repeats: int = 3) -> float:
    """Items a second `t` runs in one bubble queued ahead of the GPU and shorter than the
    slice bound (`bubble_ms` of training's work between a stream-ordered open and close):
    the device's rate while one launch covers the bubble, the median of `repeats`. The
    open-gate rate (the gate opened from the host) is lower by the executor's relaunch at
    every slice end, since no close is pending there."""
    rates = []
    for _ in range(repeats):
        before = t.items_done  # exact: the gate is closed and the last launch's end taken
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(5 * CYCLES_PER_MS))  # the host runs ahead of the GPU
            h.gate.open()
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            torch.cuda._sleep(int(bubble_ms * CYCLES_PER_MS))
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            h.gate.close()
        train.synchronize()
        time.sleep(0.05)  # the executor takes the launch's end: items_done exact
        rates.append((t.items_done - before) / (begin.elapsed_time(end) / 1e3))
    return statistics.median(rates)


def mode_queued_bubbles(args: dict) -> dict:
    """Issue 27 item 1: side work in bubbles the host queued ahead of the GPU. With a Spin
    task submitted (its items `item_us` long), the host holds the GPU with `hold_ms` of
    work on the training stream, then queues `iterations` of close / compute / open /
    recv on a comm stream / wait for it / close / compute (_queue_iterations) before the
    GPU starts them. Items done while that runs are items done in those bubbles (the gate
    is closed everywhere else); their share of what the open gate runs in the same time
    (the open-gate rate, measured first with the gate opened from the host) is the
    harvest, and their share of what one launch runs in a 10 ms bubble queued ahead
    (_bubble_rate: no relaunch at the slice's end) is `harvest_of_bubble_rate`. The same queue without a side task gives the baseline of its GPU time, for
    the overhead. Reserve and launch at opens follow `reserve` and the environment
    (FREERIDE_LAUNCH_AT_OPEN), CUDA_DEVICE_MAX_CONNECTIONS the parent's setting; the time
    slice is `time_slice` where given (null: none), else the harvester's default, so that a
    bubble (`recv_ms`) can fit in one slice or outlast it; `max_slices` likewise."""
    import torch

    import freeride as fr

    item_us = float(args.get("item_us", 20.0))
    iterations = int(args.get("iterations", 5))
    compute_ms = float(args.get("compute_ms", 5.0))
    recv_ms = float(args.get("recv_ms", 20.0))
    hold_ms = float(args.get("hold_ms", 100.0))
    reserve = fr.Reserve(mechanism=args["reserve"]) if args.get("reserve") else fr.Reserve()
    options: dict = {"reserve": reserve}
    if "time_slice" in args:  # absent: the harvester's default; null: no slice at all
        options["time_slice"] = args["time_slice"]
    if "max_slices" in args:  # absent: the harvester's default
        options["max_slices"] = args["max_slices"]
    torch.cuda.init()
    out: dict = {
        "connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "launch_at_open_env": os.environ.get("FREERIDE_LAUNCH_AT_OPEN"),
        "item_us": item_us,
        "iterations": iterations,
        "recv_ms": recv_ms,
    }
    train = torch.cuda.Stream()
    comm = torch.cuda.Stream()
    with fr.Harvester("cuda:0", **options) as h:
        out["reserve_mechanism"] = h.reserve_mechanism
        out["launches_at_opens"] = h.launches_at_opens
        out["time_slice"] = h.time_slice
        out["slice_bound"] = h.slice_bound
        out["max_slices"] = getattr(h, "max_slices", None)
        # Baseline: the queue's GPU time without side work (after one warm-up).
        baseline = []
        for _ in range(2):
            with torch.cuda.stream(train):
                torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
            start, end = _queue_iterations(torch, h, train, comm, iterations, compute_ms, recv_ms)
            train.synchronize()
            baseline.append(start.elapsed_time(end))
        h.gate.close(stream="host")
        t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=int(item_us * 1000)))
        # The open-gate rate: the same task with the gate open from the host.
        h.gate.open(stream="host")
        wait_for(lambda: t.items_done > 0, 60, "the Spin task started")
        time.sleep(0.05)
        first, began = t.items_done, time.perf_counter()
        time.sleep(0.3)
        rate = (t.items_done - first) / (time.perf_counter() - began)
        h.gate.close(stream="host")
        time.sleep(0.05)  # the launch in flight ends at its next item
        bubble_rate = _bubble_rate(torch, h, t, train)
        counts_before = h.launch_counts()
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
        held = torch.cuda.Event()
        held.record(train)
        before = t.items_done
        start, end = _queue_iterations(torch, h, train, comm, iterations, compute_ms, recv_ms)
        queued_ahead = not held.query()  # the GPU had not reached the iterations yet
        train.synchronize()
        comm.synchronize()
        time.sleep(0.05)  # the executor takes the last launch's end
        items = t.items_done - before
        elapsed = start.elapsed_time(end)
        counts = h.launch_counts()
        t.cancel()
        t.wait(30)
    bubble_s = iterations * recv_ms / 1000
    out.update(
        {
            "queued_ahead": queued_ahead,
            "open_gate_items_per_s": rate,
            "items_in_bubbles": items,
            "harvest_share": items / (rate * bubble_s) if rate > 0 else 0.0,
            "bubble_items_per_s": bubble_rate,
            "harvest_of_bubble_rate": (
                items / (bubble_rate * bubble_s) if bubble_rate > 0 else 0.0
            ),
            "queue_ms": elapsed,
            "baseline_ms": min(baseline),
            "overhead_pct": (elapsed / min(baseline) - 1) * 100,
            "launches": counts.launches - counts_before.launches,
            "at_opens": counts.at_opens - counts_before.at_opens,
            "idle_at_opens": counts.idle_at_opens - counts_before.idle_at_opens,
            "max_lookahead": counts.max_lookahead,
        }
    )
    return out


def _open_gate_rate(t, total: int, limit_s: float = 60.0) -> float:
    """Items per second of task `t` (just submitted, gate opened from the host) while it
    runs to its end, phase boundaries included: sampled every 0.2 ms, between 5% and 95% of
    its `total` items (the first launch's admission and the last phase's tail left out),
    or over the whole run where too few samples fall in between. 0.0 if it never ran."""
    samples = [(time.perf_counter(), t.items_done)]
    deadline = time.monotonic() + limit_s
    while not t.done() and time.monotonic() < deadline:
        time.sleep(0.0002)
        samples.append((time.perf_counter(), t.items_done))
    samples.append((time.perf_counter(), t.items_done))
    inner = [(at, n) for at, n in samples if 0.05 * total <= n <= 0.95 * total]
    if len(inner) >= 3 and inner[-1][0] > inner[0][0] and inner[-1][1] > inner[0][1]:
        return (inner[-1][1] - inner[0][1]) / (inner[-1][0] - inner[0][0])
    moving = [(at, n) for at, n in samples if n > samples[0][1]]
    if not moving or samples[-1][0] <= samples[0][0]:
        return 0.0
    return (moving[-1][1] - samples[0][1]) / (moving[-1][0] - samples[0][0])


def mode_queued_phases(args: dict) -> dict:
    """Issue 36 (review G3): a task of many phases in bubbles queued ahead of the GPU, as
    mode_queued_bubbles queues them, with phases ahead on or off (FREERIDE_PHASES_AHEAD in
    the environment; both need FREERIDE_DEVICE_PHASES=0), or device phases (the
    default). An ItemCounter of `phases` phases of `items` items (`item_us` each)
    checks that no item started before the phase before had completed (a launch chained at
    an open claims only once it has) and, once the gate is opened from the host and the
    task finishes, that every item ran exactly once across stale, chained and ordinary
    launches. Reports the items and phases done in the bubbles, and their share of what the
    same task does with the gate open (`harvest_share`, as mode_queued_bubbles'): the
    open-gate rate is measured first, on a twin task run to its end with the gate opened
    from the host (_open_gate_rate: its phase boundaries included)."""
    import numpy as np
    import torch

    import freeride as fr

    item_us = float(args.get("item_us", 20.0))
    items = int(args.get("items", 400_000))
    phases = int(args.get("phases", 30))
    iterations = int(args.get("iterations", 5))
    compute_ms = float(args.get("compute_ms", 5.0))
    recv_ms = float(args.get("recv_ms", 20.0))
    hold_ms = float(args.get("hold_ms", 100.0))
    torch.cuda.init()
    out: dict = {
        "phases_ahead_env": os.environ.get("FREERIDE_PHASES_AHEAD"),
        "device_phases_env": os.environ.get("FREERIDE_DEVICE_PHASES"),
        "phases": phases,
    }
    train = torch.cuda.Stream()
    comm = torch.cuda.Stream()
    with fr.Harvester("cuda:0") as h:
        out["launches_at_opens"] = h.launches_at_opens
        out["device_phases"] = h.device_phases
        out["connections"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
        out["recv_ms"], out["iterations"] = recv_ms, iterations
        # The open-gate rate: a twin task run to its end with the gate open from the host.
        h.gate.close(stream="host")
        twin = h.submit(fr.tasks.ItemCounter(items, phases, ns_per_item=int(item_us * 1000)))
        h.gate.open(stream="host")
        rate = _open_gate_rate(twin, items * phases)
        twin.wait(60)
        out["open_gate_items_per_s"] = rate
        out["twin_state"] = twin.state
        h.gate.close(stream="host")
        time.sleep(0.05)  # the executor is back waiting for an open
        counts_before = h.launch_counts()  # the twin's launches are not the bubbles'
        probe = fr.tasks.ItemCounter(items, phases, ns_per_item=int(item_us * 1000))
        t = h.submit(probe)
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
        held = torch.cuda.Event()
        held.record(train)
        start, end = _queue_iterations(torch, h, train, comm, iterations, compute_ms, recv_ms)
        out["queued_ahead"] = not held.query()
        train.synchronize()
        comm.synchronize()
        time.sleep(0.1)  # the executor takes the launches' ends
        in_bubbles = t.items_done
        counts = h.launch_counts()
        seen = probe.snapshot()
        out.update(
            {
                "items_in_bubbles": int(in_bubbles),
                "phases_in_bubbles": int((seen.phase_done >= items).sum()),
                "harvest_items_per_bubble_ms": in_bubbles / (iterations * recv_ms),
                "harvest_share": (
                    in_bubbles / (rate * iterations * recv_ms / 1000) if rate > 0 else 0.0
                ),
                "violations_in_bubbles": int(seen.violations),
                "max_count_in_bubbles": int(seen.counts.max()),
                "launches": counts.launches - counts_before.launches,
                "at_opens": counts.at_opens - counts_before.at_opens,
                "idle_at_opens": counts.idle_at_opens - counts_before.idle_at_opens,
                "queue_ms": start.elapsed_time(end),
            }
        )
        h.gate.open(stream="host")
        finished = t.wait(120)
        final = probe.snapshot()
        out.update(
            {
                "finished": bool(finished),
                "state": t.state,
                "items_done": int(t.items_done),
                "violations": int(final.violations),
                "counts_all_one": bool(np.all(final.counts == 1)),
                "max_count": int(final.counts.max()),
            }
        )
    return out


def mode_cancel_ahead(args: dict) -> dict:
    """Review G3: cancel(wait=True) while the task's launches at `opens` opens are queued
    ahead of the GPU (the training stream holds it with `hold_ms` of work first). None has
    begun, so each will read the stop and claim nothing: the cancel must return without
    waiting for the GPU to reach them (before, it waited for all of them). Reports how long
    it took, whether the GPU had reached the first open by then, the items before and after
    the GPU went through the opens, and the launch counts."""
    import torch

    import freeride as fr

    opens = int(args.get("opens", 4))
    hold_ms = float(args.get("hold_ms", 300.0))
    torch.cuda.init()
    train = torch.cuda.Stream()
    out: dict = {"opens": opens, "hold_ms": hold_ms}
    with fr.Harvester("cuda:0") as h:
        out["launches_at_opens"] = h.launches_at_opens
        h.gate.close(stream="host")
        t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=20_000))
        time.sleep(0.1)  # admitted: its runner takes launches at opens
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
            reached = torch.cuda.Event()
            reached.record()
            for _ in range(opens):
                h.gate.open()
                torch.cuda._sleep(int(2 * CYCLES_PER_MS))
                h.gate.close()
                torch.cuda._sleep(CYCLES_PER_MS)
        queued = h.launch_counts()
        began = time.perf_counter()
        cancelled = t.cancel(wait=True, timeout=30)
        out["cancel_s"] = time.perf_counter() - began
        out["reached_at_cancel"] = reached.query()
        out["cancelled"] = bool(cancelled)
        out["state"] = t.state
        out["items_at_cancel"] = int(t.items_done)
        train.synchronize()
        time.sleep(0.1)  # the executor takes the retired launches' ends
        counts = h.launch_counts()
        out.update(
            {
                "items_after": int(t.items_done),
                "max_lookahead": queued.max_lookahead,
                "at_opens": counts.at_opens,
                "idle_at_opens": counts.idle_at_opens,
            }
        )
    return out


def mode_done_ahead(args: dict) -> dict:
    """A task that completes in the first of `opens` bubbles queued ahead of the GPU (5 ms
    of compute between them): its launches at the later opens are stale. wait() must
    return once they are inert (stopped, none begun), before the GPU reaches the last open,
    with the task done and every item counted. Reports when the wait returned against the
    GPU's progress."""
    import torch

    import freeride as fr

    opens = int(args.get("opens", 4))
    hold_ms = float(args.get("hold_ms", 200.0))
    torch.cuda.init()
    train = torch.cuda.Stream()
    out: dict = {"opens": opens}
    with fr.Harvester("cuda:0") as h:
        h.gate.close(stream="host")
        items = 64
        t = h.submit(fr.tasks.Spin(items=items, ns_per_item=10_000))
        time.sleep(0.1)
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
            last = torch.cuda.Event()
            for k in range(opens):
                if k == opens - 1:
                    last.record()
                h.gate.open()
                torch.cuda._sleep(int(2 * CYCLES_PER_MS))
                h.gate.close()
                torch.cuda._sleep(int(5 * CYCLES_PER_MS))
        out["done"] = bool(t.wait(timeout=30))
        out["last_open_reached_at_wait"] = last.query()
        out["state"] = t.state
        out["items_done"] = int(t.items_done)
        out["items"] = items
        train.synchronize()
        time.sleep(0.1)
        counts = h.launch_counts()
        out.update({"at_opens": counts.at_opens, "idle_at_opens": counts.idle_at_opens})
    return out


def mode_handover_ahead(args: dict) -> dict:
    """Issue 36's handover: a task's launches at `opens` opens are queued ahead of the GPU
    (behind `hold_ms` of training work) when a more urgent task is submitted; then the host
    writes `opens` more opens. The urgent task must be armed at once, so those later opens
    carry its launches: the launches at opens taken in all exceed the first `opens` (which
    run nothing: the first task was stopped before any began). Before, it was armed only
    once the GPU had passed the first `opens`, long after the host wrote the later ones,
    which then carried nothing. Also reports whether every task ended right (the urgent
    one done with every item) and the first task's items when the GPU has passed its
    `opens` launches (`low_items_queued`, read in `gap_ms` of training work before the
    next open): none where they were stopped, its own items where FREERIDE_WITHHOLD=1
    withheld them (csrc/withhold_rule.hpp)."""
    import torch

    import freeride as fr

    opens = int(args.get("opens", 4))
    hold_ms = float(args.get("hold_ms", 300.0))
    gap_ms = float(args.get("gap_ms", 50.0))
    torch.cuda.init()
    torch.cuda._sleep(1000)  # loaded before side work runs (a lazy load synchronises)
    torch.cuda.synchronize()
    train = torch.cuda.Stream()
    out: dict = {
        "opens": opens,
        "hold_ms": hold_ms,
        "follow": os.environ.get("FREERIDE_FOLLOW"),
        "withhold": os.environ.get("FREERIDE_WITHHOLD"),
    }

    def bubbles():
        for _ in range(opens):
            h.gate.open()
            torch.cuda._sleep(int(2 * CYCLES_PER_MS))
            h.gate.close()
            torch.cuda._sleep(CYCLES_PER_MS)

    with fr.Harvester("cuda:0") as h:
        out["launches_at_opens"] = h.launches_at_opens
        h.gate.close(stream="host")
        low = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=20_000))
        time.sleep(0.1)  # admitted and armed
        with torch.cuda.stream(train):
            torch.cuda._sleep(int(hold_ms * CYCLES_PER_MS))
            first = torch.cuda.Event()
            first.record()
            bubbles()
            passed = torch.cuda.Event()
            passed.record()
            torch.cuda._sleep(int(gap_ms * CYCLES_PER_MS))
        items = 256
        high = h.submit(fr.tasks.Spin(items=items, ns_per_item=10_000), priority=1)
        time.sleep(0.05)  # armed now, the GPU still held by the training work
        out["reached_at_arm"] = first.query()
        with torch.cuda.stream(train):
            bubbles()
        wait_for(passed.query, 30, "the GPU passed the first opens")
        time.sleep(gap_ms / 1000 / 2)  # their ends taken; the next open not yet reached
        out["low_items_queued"] = int(low.items_done)
        train.synchronize()
        out["high_done"] = bool(high.wait(timeout=30))
        out["high_items"] = int(high.items_done)
        out["items"] = items
        out["high_state"] = high.state
        counts = h.launch_counts()
        out["at_opens"] = counts.at_opens
        out["idle_at_opens"] = counts.idle_at_opens
        out["low_state"] = low.state
        low.cancel(wait=True, timeout=30)
    return out


def mode_watcher_launch(args: dict) -> dict:
    """Issue 36 item 1 (review G8): host-started launches with one wake-up. Run with
    FREERIDE_LAUNCH_AT_OPEN=0, so that no open carries a launch and every bubble's launch
    is host-started, and FREERIDE_WATCHER_LAUNCH as the parent sets it ("1": the open
    watcher's thread enqueues the launch when the GPU reaches the open, then rings; "0":
    it rings, and the woken executor launches). An ItemCounter of `items` items (`item_us`
    each), submitted with the gate closed, then `bubbles` stream-ordered bubbles on a
    training stream, one at a time: [`compute_ms` of GPU work, open, `bubble_ms` of GPU
    work, close], waited for, then the items done in it noted (the gate is closed
    everywhere else, which the last look, after a pause, checks). Then the gate is opened
    from the host and the task run to its end: every item exactly once."""
    import numpy as np
    import torch

    import freeride as fr

    item_us = float(args.get("item_us", 50.0))
    items = int(args.get("items", 2**22))
    bubbles = int(args.get("bubbles", 8))
    compute_ms = float(args.get("compute_ms", 2.0))
    bubble_ms = float(args.get("bubble_ms", 5.0))
    torch.cuda.init()
    torch.cuda._sleep(1000)  # loaded before side work runs (a lazy load synchronises)
    torch.cuda.synchronize()
    out: dict = {
        "env": {
            k: os.environ.get(k, "unset")
            for k in ("FREERIDE_LAUNCH_AT_OPEN", "FREERIDE_WATCHER_LAUNCH")
        },
        "bubbles": bubbles,
        "bubble_ms": bubble_ms,
        "item_us": item_us,
    }
    train = torch.cuda.Stream()
    with fr.Harvester("cuda:0") as h:
        out["launches_at_opens"] = h.launches_at_opens
        out["reserve_mechanism"] = h.reserve_mechanism
        h.gate.close(stream="host")
        task = fr.tasks.ItemCounter(items, ns_per_item=int(item_us * 1000))
        t = h.submit(task)
        time.sleep(0.2)  # admitted; the executor waits for the gate
        counts_before = h.launch_counts()
        watcher_before = h._ex.watcher_launches
        per_bubble = []
        for _ in range(bubbles):
            before = t.items_done
            with torch.cuda.stream(train):
                torch.cuda._sleep(int(compute_ms * CYCLES_PER_MS))
                h.gate.open()
                torch.cuda._sleep(int(bubble_ms * CYCLES_PER_MS))
                h.gate.close()
            train.synchronize()
            time.sleep(0.02)  # the executor takes the launch's end and waits again
            per_bubble.append(t.items_done - before)
        settled = t.items_done
        time.sleep(0.05)
        counts = h.launch_counts()
        out.update(
            {
                "items_per_bubble": per_bubble,
                "items_in_bubbles": sum(per_bubble),
                "items_while_closed": t.items_done - settled,
                "watcher_launches": h._ex.watcher_launches - watcher_before,
                "launches": counts.launches - counts_before.launches,
                "idle": counts.idle - counts_before.idle,
                "at_opens": counts.at_opens - counts_before.at_opens,
            }
        )
        h.gate.open(stream="host")
        finished = t.wait(120)
        final = task.snapshot()
        out.update(
            {
                "finished": bool(finished),
                "state": t.state,
                "items_done": int(t.items_done),
                "items": items,
                "counts_all_one": bool(np.all(final.counts == 1)),
                "max_count": int(final.counts.max()),
                "violations": int(final.violations),
            }
        )
    return out


MODES = {
    "handover_ahead": mode_handover_ahead,
    "queued_bubbles": mode_queued_bubbles,
    "cancel_ahead": mode_cancel_ahead,
    "done_ahead": mode_done_ahead,
    "queued_phases": mode_queued_phases,
    "hardware_queues": mode_hardware_queues,
    "queue_control": mode_queue_control,
    "admission": mode_admission,
    "admission_env": mode_admission_env,
    "priority": mode_priority,
    "watcher_launch": mode_watcher_launch,
}


def serve(modes: dict) -> None:
    """A worker file's entry point: runs MODE (argv[1]) of `modes` with the JSON args of
    argv[2] and prints its RESULT line."""
    mode = sys.argv[1]
    args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    print(RESULT + json.dumps(modes[mode](args)), flush=True)


def serve_stuck_aware(modes: dict) -> None:
    """serve() for measurements that may leave the GPU stuck: a mode that raises prints
    its traceback and the process leaves at once (status 1), and one whose result says
    "hung" or "exit_at_once" leaves at once after its RESULT line, skipping CUDA's
    teardown, which would wait for the stuck work."""
    import traceback

    mode = sys.argv[1]
    args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    try:
        result = modes[mode](args)
    except BaseException:  # noqa: BLE001 - the parent shows the traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # a GPU left busy must not hold the exit
    print(RESULT + json.dumps(result), flush=True)
    if result.get("hung") or result.get("exit_at_once"):
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    serve(MODES)
