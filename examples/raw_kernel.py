"""A user CUDA kernel as a side task, in the bubbles of a (stand-in) training loop.

Needs a GPU, torch and CuPy (``pip install 'freeride[cupy]'``). Run:

    python examples/raw_kernel.py

The kernels are in examples/kernels.cu. Writing one takes three steps:

1. ``#include <freeride/preempt.cuh>``; take ``fr_item_ctx ctx`` as the first parameter
   and declare the kernel ``extern "C"``.
2. Put the work of one item (here: one tile of elements) in the lambda given to
   ``freeride::for_each_item``. An item must be independent of the others in its phase;
   it may run on any block and at any time, and it runs exactly once.
3. Submit ``fr.tasks.RawKernel(source, name, items, args)``. For iterative algorithms,
   give ``phases``: phases run one after another, and the kernel reads its phase from
   ``freeride::for_each_phase_item`` (or ``ctx.phase``). With ``device_phases=True``
   (one kernel for every phase, its phase from ``for_each_phase_item``) one launch may
   go on from phase to phase on the GPU (unless ``FREERIDE_DEVICE_PHASES=0``): many
   short phases then fill a bubble.
   In ``args``, tensors go to pointers, a Python float to a ``float`` (or ``double``)
   and a Python int to an integer of the parameter's size; a numpy scalar
   (``np.float32(3)``) says its type exactly. The driver tells RawKernel each
   parameter's size, not its type: write ``3.0``, not ``3``, for a ``float``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

import freeride as fr

HERE = os.path.dirname(os.path.abspath(__file__))


def heat_reference(u: np.ndarray, alpha: float, steps: int) -> np.ndarray:
    u = u.astype(np.float32).copy()
    for _ in range(steps):
        nxt = u.copy()
        nxt[1:-1] = u[1:-1] + np.float32(alpha) * (u[:-2] - 2 * u[1:-1] + u[2:])
        u = nxt
    return u


def main() -> None:
    if not fr.backend_info()["cuda"]:
        raise SystemExit(f"this example needs a GPU: {fr.backend_info()['reason']}")
    with open(os.path.join(HERE, "kernels.cu")) as f:
        source = f.read()
    n, block, steps = 1 << 22, 256, 200
    tiles = (n + block - 1) // block
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    u0 = torch.zeros(n, device="cuda")
    u0[n // 2 - 1000 : n // 2 + 1000] = 100.0
    u1 = torch.empty_like(u0)
    initial = u0.cpu().numpy()

    # Stand-in training: a few milliseconds of matrix products on the default stream per
    # step, then an idle gap where a real pipeline stage would wait for its neighbour.
    a = torch.randn(2048, 2048, device="cuda")
    with fr.Harvester("cuda:0", memory_budget="2GiB") as h:
        scale = h.submit(fr.tasks.RawKernel(source, "scale_shift", tiles, (x, y, 3.0, 1.0, n)))
        heat = h.submit(
            fr.tasks.RawKernel(
                source, "heat_step", tiles, (u0, u1, 0.25, n), phases=steps, device_phases=True
            )
        )
        t0 = time.perf_counter()
        while not (scale.done() and heat.done()):
            with h.iteration():  # opens the gate, records compute and bubbles
                with h.compute(label="forward"):
                    for _ in range(8):
                        a = torch.tanh(a @ a * 1e-3)
                # The stage waits for its neighbour, as a pipeline stage does once its
                # compute is done: the GPU idles with the gate open, a bubble. (A loop that
                # only enqueued would run ahead of the GPU, and its bubbles would shrink to
                # the microseconds between one compute's end and the next one's start.)
                torch.cuda.current_stream().synchronize()
                time.sleep(0.002)
        elapsed = time.perf_counter() - t0
        # Once done, the results are complete for any later work on any stream.
        scale.result()
        heat.result()
        print(h.report().summary())

    # The kernel's a * x + b is one fused multiply-add (nvcc contracts it), rounded once;
    # torch's 3.0 * x + 1.0 rounds twice, so where 3x + 1 nears 0 the two differ by up
    # to half an ulp of 1.0 (6e-8): beyond allclose's default atol of 1e-8.
    assert torch.allclose(y, 3.0 * x + 1.0, rtol=1e-6, atol=1e-6), "scale_shift gave a wrong result"
    result = (u0 if steps % 2 == 0 else u1).cpu().numpy()
    err = float(np.abs(result - heat_reference(initial, 0.25, steps)).max())
    print(f"scale_shift: {tiles} items; heat_step: {steps} phases x {tiles} items")
    print(f"done in {elapsed:.2f} s of training; heat max error vs numpy {err:.2e}")
    assert err < 1e-3, err
    print("both results match")


if __name__ == "__main__":
    main()
