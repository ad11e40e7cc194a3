"""The freeride command.

freeride demo    train a small multi-process pipeline with a side task in its bubbles
freeride bench   measure pause latency, item overhead, training overhead, hook cost or a soak run
freeride submit  submit a side task to a running job's queue (from outside the job)
freeride status  list the tasks a running job's queue knows
freeride info    print what this build and machine offer (CUDA, devices, versions)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from freeride import JobClient, TaskSpec, backend_info
from freeride.simulate import SCHEDULES

from .info_text import summary

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


def _float_in(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a number in (lo, hi] (hi may be infinite)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not lo < value <= hi:  # also refuses nan
            bounds = f"> {lo:g}" if hi == float("inf") else f"> {lo:g} and <= {hi:g}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    return parse


def _json_of(kind: type, what: str) -> Callable[[str], Any]:
    """An argparse type: JSON text of a `what` (a list or an object), or @PATH to read it
    from a file (arguments on the command line are visible to every local user in ps;
    a file can be private)."""

    def parse(text: str) -> Any:
        source = repr(text)
        if text.startswith("@"):
            path, source = text[1:], f"the file {text[1:]!r}"
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read(_ARGS_FILE_BYTES + 1)
            except OSError as exc:
                raise argparse.ArgumentTypeError(f"cannot read {source}: {exc.strerror}") from None
            if len(text) > _ARGS_FILE_BYTES:
                raise argparse.ArgumentTypeError(
                    f"{source} is larger than {_ARGS_FILE_BYTES} bytes: pass large inputs "
                    "as paths the task reads"
                )
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(
                f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}) in "
                f"{source:.200}"
            ) from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(
                f"must be a JSON {what}, got {type(value).__name__} in {source:.200}"
            )
        return value

    return parse


_ARGS_FILE_BYTES = 16 << 20
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _factory(text: str) -> str:
    """An argparse type: a "package.module:qualified.name" reference (resolved on the rank
    that builds the task, so it is not imported here)."""
    if not _FACTORY.match(text):
        raise argparse.ArgumentTypeError(
            f"must be 'module:qualname', e.g. freeride.tasks:Spin, got {text!r}"
        )
    return text


def _memory(text: str) -> str:
    """An argparse type: a memory size such as 2GiB (kept as written for the TaskSpec,
    which checks it by its own rules)."""
    try:
        TaskSpec("freeride.tasks:Spin", memory=text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("memory: ")) from None
    return text


def _queue_file(parser: argparse.ArgumentParser, path: str) -> None:
    """Refuses, as an argparse error, a --queue file that is missing, not a queue's
    secret file, or open to other users (its secret lets the holder run code as the
    job). The rules are the job client's own (fr.JobClient.check_secret_file)."""
    try:
        JobClient.check_secret_file(path)
    except FileNotFoundError:
        parser.error(f"argument --queue: no such file: {path!r}")
    except PermissionError as exc:  # group or others may read or write it
        parser.error(f"argument --queue: refusing it: {exc}")
    except ValueError as exc:
        parser.error(f"argument --queue: {exc}")


def _refused(command: str, exc: Exception) -> int:
    text = str(exc)
    print(
        f"freeride {command}: {text if text.startswith('refused') else f'refused: {text}'}",
        file=sys.stderr,
    )
    return 2


def _connect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """A JobClient of the queue in --queue, or an exit: 2 if the queue refused the
    secret, 1 if it could not be reached."""
    from freeride import JobQueue, QueueAuthError

    _queue_file(parser, args.queue)
    try:
        return JobQueue.connect(secret_file=args.queue, timeout=args.connect_timeout)
    except QueueAuthError as exc:  # a wrong secret: nothing was sent
        raise SystemExit(_refused(args.command, exc)) from None
    except (OSError, RuntimeError, ValueError) as exc:  # ConnectionError: nobody answers
        print(f"freeride {args.command}: cannot reach the queue: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def submit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from freeride import FreerideError, RankLostError, TaskCancelledError, TaskFailedError

    if args.timeout is not None and not args.wait:
        parser.error("argument --timeout: only with --wait")
    try:
        spec = TaskSpec(
            args.factory,
            args=tuple(args.args),
            kwargs=args.kwargs,
            memory=args.memory,
            result=args.result,
            name=args.name,
        )
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    with _connect(args, parser) as client:
        try:
            handle = client.submit(spec, priority=args.priority)
        except (FreerideError, RuntimeError) as exc:  # the queue closed or cannot be reached
            print(f"freeride submit: {exc}", file=sys.stderr)
            return 1
        print(handle.id, flush=True)
        if not args.wait:
            return 0
        try:
            value = handle.result(timeout=args.timeout)
        except TimeoutError:
            print(
                f"{handle.state} after {args.timeout:g} s (the task stays in the queue)",
                flush=True,
            )
            return 124
        except TaskCancelledError as exc:
            print(f"cancelled: {exc}", flush=True)
            return 1
        except TaskFailedError as exc:
            print(f"failed: {exc}", flush=True)
            return 1
        except RankLostError as exc:  # the rank running it (or the queue's leader) died
            print(f"lost: {exc}", flush=True)
            return 1
        total = handle.items_total
        items = f", {handle.items_done:,}/{total:,} items" if total else ""
        print(f"done (rank {handle.rank}{items})")
        print(f"result: {value!r}")
    return 0


def _job_order(task_id: str) -> tuple:
    """Task ids in submission order, not text order: the ranks' ("<rank>:<n>"), then the
    clients' ("c<client>:<n>"), then anything else."""
    head, _, tail = str(task_id).partition(":")
    client = head.startswith("c")
    number = head[1:] if client else head
    if number.isdecimal() and tail.isdecimal():
        return (int(client), int(number), int(tail))
    return (2, 0, 0, str(task_id))


def status_table(tasks: list[dict[str, Any]]) -> str:
    """JobClient.status()'s tasks as an aligned text table, in submission order."""
    if not tasks:
        return "no tasks"
    cols = ("id", "label", "state", "rank", "items", "priority", "origin")
    rows = []
    for t in sorted(tasks, key=lambda t: _job_order(t.get("id", ""))):
        done, total = t.get("items_done"), t.get("items_total")
        items = "-" if done is None else f"{done:,}" + (f"/{total:,}" if total else "")
        row = {c: t.get(c) for c in cols}
        row["items"] = items
        rows.append(["-" if row[c] is None else str(row[c]) for c in cols])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    left = {"id", "label"}
    fmt = [(str.ljust if c in left else str.rjust) for c in cols]
    lines = ["  ".join(f(c, w) for f, c, w in zip(fmt, cols, widths)).rstrip()]
    lines += ["  ".join(f(v, w) for f, v, w in zip(fmt, r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with _connect(args, parser) as client:
        try:
            tasks = client.status(timeout=args.timeout)
        except TimeoutError as exc:
            print(f"freeride status: no answer from the queue: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(tasks, indent=2) if args.json else status_table(tasks))
    return 0


def demo_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .demo import ConfigError, DemoConfig, run

    cfg = DemoConfig(
        schedule=args.schedule,
        stages=args.stages,
        microbatches=args.microbatches,
        steps=args.steps,
        task=args.task,
        item_us=args.item_us,
        placement=args.placement,
        launch=args.launch,
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


def bench_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import importlib

    modes = getattr(
        importlib.import_module(f".bench.{args.name}", __package__), "MODES", ("cpu", "gpu")
    )
    if args.mode == "gpu" and "gpu" not in modes:
        parser.error(f"argument --mode: {args.name} runs on the host backend only: use cpu")
    if args.mode == "gpu":
        info = backend_info()
        if not info["cuda"]:
            parser.error(
                f"argument --mode: gpu needs a usable CUDA GPU, and there is none here "
                f"({info['reason']}); use --mode cpu or auto"
            )
    if args.plot is not None and args.name != "preempt":
        parser.error(f"argument --plot: only preempt draws a plot, not {args.name}")
    if args.minutes is not None and args.name != "soak":
        parser.error(f"argument --minutes: only soak runs for a set time, not {args.name}")
    if args.attack and args.name != "soak":
        parser.error(f"argument --attack: only soak runs with an attacker, not {args.name}")
    if args.iterations is not None and args.name != "pipeline":
        parser.error(f"argument --iterations: only pipeline takes it, not {args.name}")
    _check_writable_file(parser, "--out", args.out)
    _check_writable_file(parser, "--plot", args.plot)
    from .bench import run

    options: dict[str, Any] = {} if args.minutes is None else {"minutes": args.minutes}
    if args.attack:
        options["attack"] = True
    if args.iterations is not None:
        options["iterations"] = args.iterations
    run(
        args.name,
        mode=args.mode,
        out=args.out,
        quick=args.quick,
        plot=args.plot,
        options=options or None,
    )
    return 0


def info(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # Asking torch is how a GPU that freeride's CUDA backend cannot use shows (a build
    # without it sees no GPU at all): a library must not import torch, this command may.
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - no torch, or a broken one: it tells nothing
        pass
    found = backend_info()
    if not args.json:
        print(summary(found))
        return 0
    print(json.dumps(found, indent=2))
    if found["gpu_unused"]:
        print(found["gpu_unused"], file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: sub-commands demo, bench, submit, status and info."""
    from .demo import DEVICES, LAUNCHES, MAX_ITEM_US, MAX_STAGES, TASKS, DemoConfig

    parser = argparse.ArgumentParser(
        prog="freeride",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{demo,bench,submit,status,info}"
    )
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
        "--launch",
        default=DemoConfig.launch,
        choices=list(LAUNCHES),
        help="sessions: each rank in its own session, as torchrun starts its workers; "
        "one-session: all ranks in this one (where autogroup is on, the kernel shares the "
        "cores between sessions first)",
    )
    p.add_argument(
        "--placement",
        action="store_true",
        help="submit Spin tasks once, on rank 0, to a job-wide fr.JobQueue, and show which "
        "ranks ran them (those with the most bubble time get the most)",
    )
    p.set_defaults(func=demo_command, parser=p)

    p = sub.add_parser(
        "bench",
        help="run a benchmark: preempt, items, pipeline, ranks, soak or hooks",
        description="Run one benchmark, print its table and optionally write it as JSON.",
        formatter_class=_HELP,
    )
    p.add_argument(
        "name",
        choices=["preempt", "items", "pipeline", "ranks", "soak", "hooks"],
        help="preempt: pause latency; items: item overhead; pipeline: training overhead "
        "and harvest efficiency (one-process stage emulator); ranks: training overhead of "
        "a real multi-process gloo pipeline on the host backend; soak: a job queue fed and "
        "cancelled for --minutes on a 2-rank gloo pipeline (no item lost or repeated; "
        "memory, threads and file descriptors over time); hooks: the training thread's "
        "time per close+open pair of freeride's hooks (h.compute() and attach())",
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
    p.add_argument(
        "--minutes",
        type=_float_in(0, 24 * 60),
        default=None,
        help="soak only: how long to train and feed the queue (a fraction works: 0.1 is 6 "
        "s); None: 10, or 0.1 with --quick",
    )
    p.add_argument(
        "--attack",
        action="store_true",
        help="soak only: a process attacks the queue's port all along (idle connections, "
        "huge frames before the handshake, hello floods with and without a credential)",
    )
    p.add_argument(
        "--iterations",
        type=_int_in(1, 1000),
        default=None,
        help="pipeline only: iterations a variant (None: 20, or 3 with --quick); unlike "
        "--quick it keeps the compute actions' length, so each close weighs as in the "
        "full run",
    )
    p.set_defaults(func=bench_command, parser=p)

    # What submit and status share: the queue they reach, and how long they try.
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--queue",
        required=True,
        metavar="FILE",
        help="the secret file the job's fr.JobQueue(..., secret_file=FILE) wrote (or, for "
        "status, the read-only one of status_file=FILE): JSON with the queue's address and "
        "a credential, mode 0600 (refused if others may read it)",
    )
    client.add_argument(
        "--connect-timeout",
        type=_float_in(0, float("inf")),
        default=10.0,
        help="seconds to reach the queue",
    )
    p = sub.add_parser(
        "submit",
        help="submit a side task to a running job's queue",
        description="Build fr.TaskSpec(FACTORY, args, kwargs, ...) and submit it to the "
        "job queue named by --queue, from a process outside the job; prints the task's id. "
        "With --wait, also waits and prints its final state and the repr of its result; "
        "the exit code is 0 if it finished, 1 if it failed, was cancelled or its rank was "
        "lost, 124 if --timeout passed first (the task stays queued), 2 for a bad argument "
        "or a secret the queue refused.",
        formatter_class=_HELP,
        parents=[client],
    )
    p.add_argument(
        "factory",
        metavar="FACTORY",
        type=_factory,
        help="'module:qualname' of a task class or function, importable on every rank "
        "(e.g. freeride.tasks:Spin)",
    )
    p.add_argument(
        "--args",
        type=_json_of(list, "list"),
        default=[],
        help="FACTORY's positional arguments as a JSON list, or @FILE holding one (ps shows "
        "a command line to every local user; a file can be read by you alone)",
    )
    p.add_argument(
        "--kwargs",
        type=_json_of(dict, "object"),
        default={},
        help='FACTORY\'s keyword arguments as a JSON object, e.g. \'{"items": 1000, "ns_per_item": 50000}\', or '
        "@FILE holding one",
    )
    p.add_argument(
        "--priority", type=_int_in(-(2**31), 2**31 - 1), default=0, help="placed first if higher"
    )
    p.add_argument("--name", default=None, help="the task's label; None: FACTORY")
    p.add_argument(
        "--memory",
        type=_memory,
        default=None,
        help="device memory the task will hold, e.g. 2GiB: only ranks with that much free "
        "budget run it",
    )
    p.add_argument(
        "--result",
        default="return",
        metavar="return|discard|PATH",
        help="return: the result comes back (--wait prints its repr); discard; or a path on "
        "the running rank (may hold {id} and {rank}) where it is saved with torch.save",
    )
    p.add_argument("--wait", action="store_true", help="wait for the task and print its end")
    p.add_argument(
        "--timeout",
        type=_float_in(0, float("inf")),
        default=None,
        help="with --wait: seconds to wait at most; None: until the task is final",
    )
    p.set_defaults(func=submit, parser=p)

    p = sub.add_parser(
        "status",
        help="list the tasks a running job's queue knows",
        description="Print one line per task the job queue named by --queue knows: id, "
        "label, state, rank, items done/total, priority and origin (the submitting rank, "
        "or the client).",
        formatter_class=_HELP,
        parents=[client],
    )
    p.add_argument("--json", action="store_true", help="print JobClient.status() as JSON")
    p.add_argument(
        "--timeout",
        type=_float_in(0, float("inf")),
        default=5.0,
        help="seconds to wait for the queue's answer",
    )
    p.set_defaults(func=status, parser=p)

    p = sub.add_parser(
        "info",
        help="print what this build and machine offer",
        description="Print a summary of what this build and machine offer: where side "
        "tasks run with device='auto', the build (CUDA backend, nvcc, architectures), the "
        "CUDA runtime and driver, each device, the reserve (where CUDA is usable), and why a GPU goes unused where "
        "freeride's CUDA backend cannot use one that torch sees or whose driver is "
        "installed (the warning device='auto' gives).",
        formatter_class=_HELP,
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print fr.backend_info() as JSON instead (and why a GPU goes unused on stderr)",
    )
    p.set_defaults(func=info, parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the freeride command; returns its exit code (2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    return args.func(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
