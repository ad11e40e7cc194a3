"""The freeride command.

freeride demo   train a small multi-process pipeline with a side task in its bubbles
freeride bench  measure pause latency, item overhead or training overhead
freeride info   print what this build and machine offer (CUDA, devices, versions)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from . import backend_info
from .simulate import SCHEDULES

_HELP = argparse.ArgumentDefaultsHelpFormatter


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (hi None: no upper bound)."""
    bounds = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


def demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .demo import ConfigError, DemoConfig, run

    cfg = DemoConfig(
        schedule=args.schedule,
        stages=args.stages,
        microbatches=args.microbatches,
        steps=args.steps,
        task=args.task,
        item_us=args.item_us,
        placement=args.placement,
        device=args.device,
        outdir=args.outdir,
    )
    try:
        return run(cfg)
    except ConfigError as exc:  # raised before any process is spawned
        parser.error(f"argument {exc.option}: {exc.message}")


def _check_writable_file(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    """Fails now, not after a run of minutes, when `path` cannot be written."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        parser.error(f"argument {option}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or os.path.isdir(path):
        parser.error(f"argument {option}: cannot write {path!r}")


def bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.mode == "gpu":
        info = backend_info()
        if not info["cuda"]:
            parser.error(
                f"argument --mode: gpu needs a usable CUDA GPU, and there is none here "
                f"({info['reason']}); use --mode cpu or auto"
            )
    if args.plot is not None and args.name != "preempt":
        parser.error(f"argument --plot: only preempt draws a plot, not {args.name}")
    _check_writable_file(parser, "--out", args.out)
    _check_writable_file(parser, "--plot", args.plot)
    from .bench import run

    run(args.name, mode=args.mode, out=args.out, quick=args.quick, plot=args.plot)
    return 0


def info(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print(json.dumps(backend_info(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: sub-commands demo, bench and info."""
    from .demo import DEVICES, MAX_ITEM_US, MAX_STAGES, TASKS, DemoConfig

    parser = argparse.ArgumentParser(
        prog="freeride",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench,info}")
    p = sub.add_parser(
        "demo",
        help="a real multi-process pipeline with a side task in its bubbles",
        description="Train a small transformer split into --stages processes with a "
        "torch.distributed.pipelining schedule and run a side task in its bubbles; writes "
        "trace.json and timeline.png to --outdir.",
        formatter_class=_HELP,
    )
    p.add_argument(
        "--schedule",
        default="1f1b",
        choices=sorted(SCHEDULES),
        help="the torch.distributed.pipelining schedule",
    )
    p.add_argument(
        "--stages", type=_int_in(2, MAX_STAGES), default=4, help="pipeline ranks (processes)"
    )
    p.add_argument(
        "--microbatches",
        type=_int_in(1),
        default=8,
        help="microbatches per step: at least --stages (2x --stages for dualpipev)",
    )
    p.add_argument(
        "--steps",
        type=_int_in(2),
        default=DemoConfig.steps,
        help="measured steps, alternately with and without side work (after 2 warm-up steps)",
    )
    p.add_argument("--task", default="spin", choices=list(TASKS), help="the side task")
    p.add_argument(
        "--item-us",
        type=_int_in(1, MAX_ITEM_US),
        default=50,
        help="Spin item length in microseconds",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=list(DEVICES),
        help="auto: one GPU per stage if there are enough, else the CPU; cuda: stage i on "
        "cuda:i, or fail",
    )
    p.add_argument("--outdir", default=".", help="where trace.json and timeline.png go")
    p.add_argument(
        "--placement",
        action="store_true",
        help="submit Spin tasks once, on rank 0, to a job-wide fr.JobQueue, and show which "
        "ranks ran them (those with the most bubble time get the most)",
    )
    p.set_defaults(func=demo, parser=p)

    p = sub.add_parser(
        "bench",
        help="run a benchmark: preempt, items, pipeline or ranks",
        description="Run one benchmark, print its table and optionally write it as JSON.",
        formatter_class=_HELP,
    )
    p.add_argument(
        "name",
        choices=["preempt", "items", "pipeline", "ranks"],
        help="preempt: pause latency; items: item overhead; pipeline: training overhead "
        "and harvest efficiency (one-process stage emulator); ranks: training overhead of "
        "a real multi-process gloo pipeline on the host backend",
    )
    p.add_argument(
        "--mode",
        default="auto",
        choices=["auto", "cpu", "gpu"],
        help="gpu: the CUDA backend (fails without a GPU); cpu: small sizes on the host "
        "backend; auto: gpu where one is usable",
    )
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("--quick", action="store_true", help="small sizes (the CI smoke test)")
    p.add_argument("--plot", default=None, help="preempt only: write a PNG of latency vs item")
    p.set_defaults(func=bench, parser=p)

    p = sub.add_parser(
        "info",
        help="print what this build and machine offer",
        description="Print fr.backend_info() as JSON.",
        formatter_class=_HELP,
    )
    p.set_defaults(func=info, parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the freeride command; returns its exit code (2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    return args.func(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
