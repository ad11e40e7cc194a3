"""Side kernels, small enough for compute-sanitizer's memcheck to finish in about a minute.

    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
        python3 benchmarks/probes/memcheck_small.py [--n 65536] [--bubbles 8]

memcheck serialises kernels and slows each one many times, so examples/raw_kernel.py (4M
elements, 200 phases, 2048x2048 matrix products between bubbles, torch) ran into its 60 s
limit on the H200. This runs the same RawKernels (examples/kernels.cu: scale_shift, and
heat_step over a few phases) and two built-in tasks (Saxpy, ItemCounter over two phases)
on `--n` elements, with CuPy only (no torch, whose start under memcheck is slow), in
`--bubbles` bubbles: even ones opened and closed from the host, odd ones opened in stream
order on a training stream (a memory-op gate write and a launch queued at the open) and
closed from the host. No training kernel runs while a stream-ordered close is pending, so
the serialisation cannot stall a side launch that waits for one. Then the gate stays open
until every task is done, and each result is checked against CuPy/numpy.

API errors are left out: freeride meets CUDA_ERROR_INVALID_VALUE by design (the end of a
RawKernel's parameters in cuFuncGetParamInfo; a driver refusing the barrier-free batched
gate write), which memcheck would count as errors.

Outcome: memcheck's own report (its exit status is 99 on an error it found), and a line
"RESULT memcheck_small: ..." with every check; exit status 1 if a result is wrong or a
task did not finish within its limit.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _probe import bounded, hard_exit, result

NAME = "memcheck_small"
HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "..", "examples", "kernels.cu")
BLOCK = 256
STEPS = 4  # heat_step phases
ALPHA = 0.25


def heat_reference(u: np.ndarray, steps: int) -> np.ndarray:
    u = u.astype(np.float32).copy()
    for _ in range(steps):
        nxt = u.copy()
        nxt[1:-1] = u[1:-1] + np.float32(ALPHA) * (u[:-2] - 2 * u[1:-1] + u[2:])
        u = nxt
    return u


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 16, help="elements (default 65536)")
    parser.add_argument("--bubbles", type=int, default=8, help="bubbles (default 8)")
    args = parser.parse_args()
    import cupy as cp

    import freeride as fr

    n = max(args.n, 4096)
    tiles = (n + BLOCK - 1) // BLOCK
    with open(KERNELS) as f:
        source = f.read()
    x = cp.random.standard_normal(n, dtype=cp.float32)
    y = cp.zeros(n, dtype=cp.float32)
    u0 = cp.zeros(n, dtype=cp.float32)
    u0[n // 2 - 100 : n // 2 + 100] = 100.0
    u1 = cp.zeros_like(u0)
    initial = cp.asnumpy(u0)
    sx = cp.random.standard_normal(n, dtype=cp.float32)
    sy = cp.random.standard_normal(n, dtype=cp.float32)
    saxpy_expected = sy + cp.float32(1.5) * sx
    train = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()

    h = fr.Harvester("cuda:0", memory_budget="1GiB")
    h.gate.close(stream="host")
    tasks = {
        "scale_shift": h.submit(
            fr.tasks.RawKernel(source, "scale_shift", tiles, (x, y, 3.0, 1.0, n))
        ),
        "heat_step": h.submit(
            fr.tasks.RawKernel(source, "heat_step", tiles, (u0, u1, ALPHA, n), phases=STEPS)
        ),
        "saxpy": h.submit(fr.tasks.Saxpy(1.5, sx, sy)),
        "item_counter": h.submit(fr.tasks.ItemCounter(4096, phases=2, ns_per_item=1_000)),
    }
    began = time.perf_counter()
    for i in range(args.bubbles):
        if i % 2 == 0:
            h.gate.open(stream="host")
        else:
            h.gate.open(stream=train)  # a memory-op write, and a launch queued at it
            if not bounded(train.synchronize, 30.0).done:
                result(NAME, f"bubble {i}: the stream-ordered open never took effect")
                hard_exit(1)
        time.sleep(0.02)
        h.gate.close(stream="host")
        time.sleep(0.005)
    h.gate.open(stream="host")
    unfinished = [k for k, t in tasks.items() if not bounded(lambda t=t: t.wait(60), 65.0).value]
    elapsed = time.perf_counter() - began
    checks: dict[str, bool] = {}
    if not unfinished:
        tasks["scale_shift"].result()
        tasks["heat_step"].result()
        cp.cuda.Device().synchronize()
        checks["scale_shift"] = bool(cp.allclose(y, 3.0 * x + 1.0, rtol=1e-6, atol=1e-6))
        heat = cp.asnumpy(u0 if STEPS % 2 == 0 else u1)
        checks["heat_step"] = float(np.abs(heat - heat_reference(initial, STEPS)).max()) < 1e-3
        checks["saxpy"] = bool(cp.allclose(tasks["saxpy"].result(), saxpy_expected, atol=1e-5))
        checks["item_counter"] = bool((tasks["item_counter"].result().counts == 1).all())
    counts, mech = h.launch_counts(), h.reserve_mechanism
    closed = bounded(h.close, 30.0, "close")
    result(
        NAME,
        f"n={n}, {args.bubbles} bubbles, {elapsed:.1f} s, reserve {mech}, "
        f"{counts}: unfinished {unfinished or 'none'}; checks {checks}; close {closed}",
    )
    if unfinished or not all(checks.values()) or not closed.done:
        hard_exit(1)


if __name__ == "__main__":
    main()
