"""Pause latency and Saxpy throughput on a GPU (a first look; `freeride bench` grows from it).

Pause latency, as DESIGN.md defines it: the delay between the gate's close taking effect
on the training stream and the start of the next training kernel, when that kernel needs
every SM. Per trial, on a high-priority "training" stream: a one-thread kernel stamps
%globaltimer, the gate closes (stream-ordered), then a probe kernel with two 1024-thread
blocks per SM stamps each block's start. Latency = last block start - close stamp. The
same probe without side work gives the launch floor, reported beside it.

Needs CuPy (for the stamp kernels) and a CUDA build of freeride. Usage:
    python benchmarks/pause_latency.py [--out results.json] [--trials 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import datetime, timezone

import cupy as cp
import numpy as np

import freeride as fr

_SRC = r"""
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void stamp(unsigned long long* out) { *out = now(); }
extern "C" __global__ void probe(unsigned long long* starts) {
  if (threadIdx.x == 0) starts[blockIdx.x] = now();
}
"""
_MOD = cp.RawModule(code=_SRC)
_STAMP = _MOD.get_function("stamp")
_PROBE = _MOD.get_function("probe")


def _trials(h, stream, n_trials, sms):
    blocks = 2 * sms
    close_t = cp.zeros(1, dtype=cp.uint64)
    starts = cp.zeros(blocks, dtype=cp.uint64)
    out = []
    for _ in range(n_trials):
        with stream:
            _STAMP((1,), (1,), (close_t,))
            if h is not None:
                h.gate.close(stream=stream.ptr)
            _PROBE((blocks,), (1024,), (starts,))
            if h is not None:
                h.gate.open(stream=stream.ptr)
        stream.synchronize()
        out.append(int(starts.max().get()) - int(close_t.get()[0]))
        time.sleep(0.002)  # let the side task resume and fill the GPU again
    return np.array(out, dtype=np.float64) / 1000.0  # microseconds


def _summary(us):
    return {
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "max_us": float(us.max()),
        "mean_us": float(us.mean()),
        "trials": int(us.size),
    }


def pause_latency(item_us, gate_in_host_memory, trials, sms):
    stream = cp.cuda.Stream(non_blocking=True, priority=-5)
    with fr.Harvester("cuda:0", gate_in_host_memory=gate_in_host_memory) as h:
        t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=item_us * 1000))
        deadline = time.monotonic() + 10
        while t.items_done == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        us = _trials(h, stream, trials, sms)
        items = t.items_done
        t.cancel()
        t.wait(30)
    res = _summary(us)
    res.update(item_us=item_us, gate="host" if gate_in_host_memory else "device", items=items)
    return res


def saxpy_throughput(n, repeats):
    x = cp.random.standard_normal(n, dtype=cp.float32)
    y = cp.random.standard_normal(n, dtype=cp.float32)
    nbytes = 3 * n * 4
    stream = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    fr._C.saxpy_plain(1.0001, x.data.ptr, y.data.ptr, n, 0, stream.ptr)  # warm-up
    stream.synchronize()
    start.record(stream)
    for _ in range(repeats):
        fr._C.saxpy_plain(1.0001, x.data.ptr, y.data.ptr, n, 0, stream.ptr)
    end.record(stream)
    end.synchronize()
    plain_s = cp.cuda.get_elapsed_time(start, end) / 1000 / repeats
    with fr.Harvester("cuda:0") as h:
        h.submit(fr.tasks.Saxpy(1.0001, x, y)).wait()  # warm-up
        t0 = time.perf_counter()
        for _ in range(repeats):
            h.submit(fr.tasks.Saxpy(1.0001, x, y)).wait()
        item_s = (time.perf_counter() - t0) / repeats
    return {
        "n": n,
        "plain_GBps": nbytes / plain_s / 1e9,
        "preemptible_GBps": nbytes / item_s / 1e9,
        "item_overhead_pct": (item_s / plain_s - 1) * 100,
        "note": "preemptible time is host-timed per task (submit to done), plain is event-timed",
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--commit", default=None, help="commit measured (default: git HEAD)")
    args = parser.parse_args()
    info = fr.backend_info()
    dev = info["devices"][0]
    sms = dev["sm_count"]
    stream = cp.cuda.Stream(non_blocking=True, priority=-5)
    floor = _summary(_trials(None, stream, args.trials, sms))
    rows = [
        pause_latency(item, host, args.trials, sms)
        for host in (False, True)
        for item in (5, 20, 100)
    ]
    saxpy = saxpy_throughput(256 * 2**20, 20)
    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
        ).stdout.strip()
    )
    result = {
        "device": dev["name"],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "host": platform.node(),
        "freeride": info["version"],
        "driver_version": info["driver_version"],
        "settings": {
            "trials": args.trials,
            "probe_blocks": 2 * sms,
            "probe_threads": 1024,
            "spin_threads": 128,
        },
        "launch_floor": floor,
        "pause_latency": rows,
        "saxpy": saxpy,
    }
    print(f"device {dev['name']}, commit {commit}")
    print(
        f"launch floor (no side work): p50 {floor['p50_us']:.1f} us, p99 {floor['p99_us']:.1f} us"
    )
    print(f"{'gate':>6} {'item us':>8} {'p50 us':>8} {'p99 us':>8} {'max us':>8}")
    for r in rows:
        print(
            f"{r['gate']:>6} {r['item_us']:>8} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} "
            f"{r['max_us']:>8.1f}"
        )
    print(
        f"saxpy: plain {saxpy['plain_GBps']:.0f} GB/s, preemptible "
        f"{saxpy['preemptible_GBps']:.0f} GB/s ({saxpy['item_overhead_pct']:+.1f}%)"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
