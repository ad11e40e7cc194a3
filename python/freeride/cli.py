"""The ``freeride`` command: ``freeride demo`` and ``freeride info``."""

from __future__ import annotations

import argparse
import json
import sys

from . import backend_info
from .simulate import SCHEDULES


def demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run

    return run(
        DemoConfig(
            schedule=args.schedule,
            stages=args.stages,
            microbatches=args.microbatches,
            steps=args.steps,
            task=args.task,
            item_us=args.item_us,
            device=args.device,
            outdir=args.outdir,
        )
    )


def bench(args: argparse.Namespace) -> int:
    from .bench import run

    run(args.name, mode=args.mode, out=args.out, quick=args.quick, plot=args.plot)
    return 0


def info(_: argparse.Namespace) -> int:
    print(json.dumps(backend_info(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freeride", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="a real multi-process pipeline with a side task in its bubbles")
    p.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    p.add_argument("--stages", type=int, default=4, help="pipeline ranks (processes)")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=12, help="measured steps (half of them harvest)")
    p.add_argument("--task", default="spin", choices=["spin", "saxpy", "none"])
    p.add_argument("--item-us", type=int, default=50, help="Spin item length in microseconds")
    p.add_argument("--device", default="auto", help="auto (GPU if present) or cpu")
    p.add_argument("--outdir", default=".", help="where trace.json and timeline.png go")
    p.set_defaults(func=demo)
    p = sub.add_parser("bench", help="run a benchmark: preempt, items or pipeline")
    p.add_argument("name", choices=["preempt", "items", "pipeline"])
    p.add_argument("--mode", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("--quick", action="store_true", help="small sizes (the CI smoke test)")
    p.add_argument("--plot", default=None, help="preempt: write a PNG of latency vs item")
    p.set_defaults(func=bench)
    p = sub.add_parser("info", help="print what this build and machine offer")
    p.set_defaults(func=info)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
