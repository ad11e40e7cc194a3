"""The ``freeride`` command: ``freeride demo`` and ``freeride info``."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from . import Harvester, backend_info, tasks


def _compute_step(size: int, rng: np.random.Generator) -> None:
    a = rng.standard_normal((size, size), dtype=np.float32)
    for _ in range(4):
        a = np.tanh(a @ a * (1.0 / size))


def _train(
    h: Harvester, iters: int, actions: int, bubble_s: float, size: int, harvest: bool
) -> tuple:
    """A stand-in for one pipeline stage: compute actions separated by waits for
    neighbours (sleeps). Returns (seconds, compute seconds)."""
    rng = np.random.default_rng(0)
    compute = 0.0
    start = time.perf_counter()
    for _ in range(iters):
        for _ in range(actions):
            t0 = time.perf_counter()
            with h.compute():
                _compute_step(size, rng)
            compute += time.perf_counter() - t0
            if not harvest:
                h.gate.close()
            time.sleep(bubble_s)  # the bubble: waiting for an activation or a gradient
    return time.perf_counter() - start, compute


def _idle_rate(h: Harvester, ns_per_item: int, seconds: float = 0.3) -> float:
    """Side items per second on an otherwise idle device."""
    handle = h.submit(tasks.Spin(items=10**9, ns_per_item=ns_per_item))
    time.sleep(0.05)  # warm-up
    before, t0 = handle.items_done, time.perf_counter()
    time.sleep(seconds)
    rate = (handle.items_done - before) / (time.perf_counter() - t0)
    handle.cancel()
    handle.wait(10)
    return rate


def demo(args: argparse.Namespace) -> int:
    info = backend_info()
    device = "cpu" if args.device == "auto" and not info["cuda"] else args.device
    ns = args.item_us * 1000
    bubble = args.bubble_ms / 1000
    with Harvester(device, workers=args.workers) as h:
        print(f"freeride demo on {h.device} ({h.backend} backend)")
        rate = _idle_rate(h, ns)
        h.gate.close(stream="host")
        # Baseline: the same loop with the gate kept closed, so no side work runs.
        base_s, _ = _train(h, args.iters, args.actions, bubble, args.size, False)
        handle = h.submit(tasks.Spin(items=10**9, ns_per_item=ns))
        h.gate.open(stream="host")
        side_s, compute_s = _train(h, args.iters, args.actions, bubble, args.size, True)
        h.gate.close(stream="host")
        items = handle.items_done
        handle.cancel()
        handle.wait(10)
    bubble_s = side_s - compute_s
    rows = [
        (
            "iterations",
            (
                f"{args.iters} x {args.actions} compute actions, "
                f"{args.bubble_ms:g} ms bubble after each"
            ),
        ),
        ("bubble fraction", f"{bubble_s / side_s:.1%} ({bubble_s:.3f} s of {side_s:.3f} s)"),
        ("side work done", f"{items:,} Spin items of {args.item_us} us"),
        (
            "harvest efficiency",
            (
                f"{items / (rate * bubble_s):.0%} of what an idle device "
                f"does in that bubble time ({rate:,.0f} items/s)"
            ),
        ),
        ("iteration, no side work", f"{base_s / args.iters * 1000:.2f} ms"),
        (
            "iteration, harvesting",
            (f"{side_s / args.iters * 1000:.2f} ms ({(side_s - base_s) / base_s:+.1%})"),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    return 0


def info(_: argparse.Namespace) -> int:
    print(json.dumps(backend_info(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freeride", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run a side task in the bubbles of a stand-in training loop")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--actions", type=int, default=4, help="compute actions per iteration")
    p.add_argument("--bubble-ms", type=float, default=5.0, help="wait after each action")
    p.add_argument("--size", type=int, default=192, help="matrix size of a compute action")
    p.add_argument("--item-us", type=int, default=50, help="side item length in microseconds")
    p.add_argument("--workers", type=int, default=1, help="host backend worker threads")
    p.set_defaults(func=demo)
    p = sub.add_parser("info", help="print what this build and machine offer")
    p.set_defaults(func=info)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
