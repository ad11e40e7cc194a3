"""`freeride demo`: a real multi-process pipeline with a side task in its bubbles.

Spawns one process per stage (no torchrun; by default each in its own session, as
torchrun starts them), trains a small transformer split into stages with a
torch.distributed.pipelining schedule over gloo (NCCL on GPUs), and alternates steps with
and without harvesting, so the two iteration times are measured side by side in one run.
Rank 0 prints the table and writes trace.json and timeline.png.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, TextIO

from freeride.simulate import SCHEDULES, stage_ids

from ._stats import PairedOverhead, paired_overhead
from .spawn import join_group, run_ranks

TASKS = ("spin", "saxpy", "none")
DEVICES = ("auto", "cpu", "cuda")
# How the ranks are started: each in its own session, as torchrun's workers are, or all in
# this process's session. Where autogroup is on, every session is a scheduling group of
# its own, which is what decides whose threads compete for the cores as equals.
LAUNCHES = ("sessions", "one-session")
# Bounds of the command line's numbers; the demo spawns one process per stage.
MAX_STAGES = 64
MAX_ITEM_US = 1_000_000  # Spin's longest item (fr.tasks.Spin: 1 s)
# Steps run before harvesting starts (shape inference, allocator, gloo connections); they
# are neither recorded nor timed.
WARMUP_STEPS = 2
# The Spin task must outlast any run: 2**40 items never run out (the count is not shown).
_ENDLESS = 2**40
# --placement: Spin tasks submitted on rank 0, each about this much work, per stage; more
# than the ranks hold at once (fr.JobQueue's depth), so they flow as ranks finish theirs.
PLACED_TASKS_PER_STAGE = 3
PLACED_TASK_MS = 20
_PLACEMENT_WARMUP_S = 0.35


@dataclass
class DemoConfig:
    schedule: str = "1f1b"
    stages: int = 4
    microbatches: int = 8
    steps: int = 20
    task: str = "spin"
    item_us: int = 50
    device: str = "auto"
    outdir: str = "."
    placement: bool = False
    launch: str = "sessions"
    d_model: int = 64
    seq_len: int = 32
    micro_batch: int = 4


class ConfigError(ValueError):
    """A demo setting out of range; `option` names the command-line option."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


def min_microbatches(schedule: str, stages: int) -> int:
    """The fewest microbatches torch's `schedule` accepts with `stages` ranks here: one per
    pipeline stage (two stages per rank for the V-shaped DualPipeV)."""
    return stages * (2 if schedule == "dualpipev" else 1)


def check_config(cfg: DemoConfig) -> None:
    """Raises ConfigError for the first setting the demo cannot run with."""
    if cfg.schedule not in SCHEDULES:
        raise ConfigError("--schedule", f"must be one of {sorted(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.task not in TASKS:
        raise ConfigError("--task", f"must be one of {list(TASKS)}, got {cfg.task!r}")
    if cfg.device not in DEVICES:
        raise ConfigError(
            "--device",
            f"must be one of {list(DEVICES)} (stage i runs on cuda:i), got {cfg.device!r}",
        )
    if not 2 <= cfg.stages <= MAX_STAGES:
        raise ConfigError("--stages", f"must be in [2, {MAX_STAGES}], got {cfg.stages}")
    least = min_microbatches(cfg.schedule, cfg.stages)
    if cfg.microbatches < least:
        raise ConfigError(
            "--microbatches",
            f"must be >= {least} for {cfg.schedule} on {cfg.stages} stages, got {cfg.microbatches}",
        )
    if cfg.schedule in ("interleaved", "zero_bubble"):
        # torch splits the microbatches into rounds of --stages and needs whole rounds.
        rounds = max(1, cfg.microbatches // cfg.stages)
        if cfg.microbatches % rounds:
            raise ConfigError(
                "--microbatches",
                f"must be a multiple of {rounds} for {cfg.schedule} on {cfg.stages} stages "
                f"({cfg.microbatches} // {cfg.stages} = {rounds} rounds), e.g. "
                f"{rounds * cfg.stages}, got {cfg.microbatches}",
            )
    if cfg.launch not in LAUNCHES:
        raise ConfigError("--launch", f"must be one of {list(LAUNCHES)}, got {cfg.launch!r}")
    if cfg.placement and cfg.task != "spin":
        raise ConfigError("--placement", f"places Spin tasks: use --task spin, got {cfg.task!r}")
    if cfg.steps < 2:
        raise ConfigError(
            "--steps", f"must be >= 2 (one with and one without side work), got {cfg.steps}"
        )
    if not 1 <= cfg.item_us <= MAX_ITEM_US:
        raise ConfigError("--item-us", f"must be in [1, {MAX_ITEM_US}], got {cfg.item_us}")


def check_outdir(outdir: str) -> None:
    """Creates `outdir` if needed and checks a file can be written there, so a bad path
    fails before the run rather than after it (losing the results)."""
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise ConfigError("--outdir", f"{outdir!r} is a file, not a folder")
    try:
        os.makedirs(outdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=outdir):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError("--outdir", f"cannot write to {outdir!r}: {reason}") from None


def choose_cuda(cfg: DemoConfig, gpus: int, fr_cuda: bool, reason: str) -> bool:
    """Whether the ranks run on GPUs: `gpus` visible to torch, `fr_cuda` whether
    freeride's CUDA backend is usable (`reason` why not). One GPU per stage, since NCCL
    refuses two ranks on one device. Raises ConfigError when --device cuda cannot be met."""
    if cfg.device == "cpu":
        return False
    usable = fr_cuda and gpus >= cfg.stages
    if cfg.device == "cuda" and not usable:
        why = (
            f"freeride cannot use CUDA here ({reason})"
            if not fr_cuda
            else f"{gpus} GPU(s) visible for {cfg.stages} stages (one per stage)"
        )
        raise ConfigError("--device", f"cuda was asked for but {why}; use --device cpu")
    return usable


class Progress:
    """One step of the run at a time: a bar redrawn in place on a terminal, a plain line
    per step otherwise (a log must not fill with carriage returns)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()

    def step(self, done: int, harvesting: bool) -> None:
        """Reports that `done` of the steps have finished, the last one with side work
        if `harvesting`."""
        elapsed = time.monotonic() - self.started
        kind = "harvesting" if harvesting else "no side work"
        if self.tty:
            width = 30
            filled = int(width * done / self.total)
            bar = "#" * filled + "." * (width - filled)
            end = "\n" if done == self.total else ""
            self.stream.write(f"\r  [{bar}] step {done}/{self.total}  {elapsed:5.1f} s{end}")
        else:
            self.stream.write(f"  step {done}/{self.total} ({kind})  {elapsed:.1f} s\n")
        self.stream.flush()


_SAXPY_N = 1 << 22


def _side_task(fr: Any, cfg: DemoConfig, device: str) -> Any:
    if cfg.task == "spin":
        return fr.tasks.Spin(items=_ENDLESS, ns_per_item=cfg.item_us * 1000)
    import torch

    n = _SAXPY_N
    return fr.tasks.Saxpy(1e-6, torch.ones(n, device=device), torch.zeros(n, device=device))


def placed_items(cfg: DemoConfig) -> int:
    """Items of each task --placement submits."""
    return max(1, PLACED_TASK_MS * 1000 // cfg.item_us)


def describe_task(cfg: DemoConfig) -> str:
    """The side task in words, for the summary."""
    if cfg.placement:
        return (
            f"{_n_placed(cfg)} Spin tasks of {placed_items(cfg):,} x "
            f"{cfg.item_us} us items, submitted on rank 0 to fr.JobQueue"
        )
    if cfg.task == "spin":
        return f"Spin, {cfg.item_us} us items, more than the run can finish"
    if cfg.task == "saxpy":
        return f"Saxpy over {_SAXPY_N:,} floats"
    return "none (--task none)"


def describe_launch(cfg: DemoConfig) -> str:
    """How the ranks were started, for the summary."""
    if cfg.launch == "sessions":
        return "each rank in its own session (as torchrun starts them)"
    return "all ranks in one session"


def describe_work(cfg: DemoConfig, items: int) -> str:
    """The side work done, for the summary."""
    if cfg.task == "none":
        return "none (--task none)"
    unit = f"Spin items of {cfg.item_us} us" if cfg.task == "spin" else "Saxpy items"
    return f"{items:,} {unit}"


def _rank_main(
    rank: int, cfg: DemoConfig, folder: str, use_cuda: bool, result_path: str | None = None
) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, schedules

    import freeride as fr

    device = torch.device(f"cuda:{rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    join_group(rank, cfg.stages, folder, "nccl" if use_cuda else "gloo")
    cls_name, per_rank, _ = SCHEDULES[cfg.schedule]
    multi = per_rank > 1
    num_stages = cfg.stages * per_rank
    ids = stage_ids(cfg.schedule, rank, cfg.stages)
    torch.manual_seed(0)
    layers = [
        nn.TransformerEncoderLayer(cfg.d_model, 4, 2 * cfg.d_model, dropout=0.0, batch_first=True)
        for _ in range(num_stages)
    ]
    stages = [PipelineStage(layers[i].to(device), i, num_stages, device) for i in ids]
    cls = getattr(schedules, cls_name)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    sched = (
        cls(stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
        if multi
        else cls(stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    )
    opt = torch.optim.AdamW([p for i in ids for p in layers[i].parameters()], lr=1e-3)
    g = torch.Generator().manual_seed(1)
    shape = (cfg.micro_batch * cfg.microbatches, cfg.seq_len, cfg.d_model)
    batches = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(2)]

    def step(i: int) -> None:
        x, y = (t.to(device) for t in batches[i % 2])
        opt.zero_grad()
        if 0 in ids and num_stages - 1 in ids:
            sched.step(x, target=y)
        elif 0 in ids:
            sched.step(x)
        elif num_stages - 1 in ids:
            sched.step(target=y)
        else:
            sched.step()
        opt.step()
        if use_cuda:
            torch.cuda.synchronize()

    with fr.Harvester(str(device) if use_cuda else "cpu", workers=1) as h:
        # Warm-up before anything is attached or submitted: not recorded, not timed, and
        # no side work runs yet (the totals describe the measured steps only).
        for i in range(WARMUP_STEPS):
            step(i)
        queue = fr.JobQueue(h) if cfg.placement else None  # collective
        queue_made = time.monotonic()
        h.attach(sched)  # closes the gate: from here side work runs only inside steps
        h.attach_optimizer(opt)
        own_task = cfg.task != "none" and queue is None
        handle = h.submit(_side_task(fr, cfg, str(device))) if own_task else None
        placed: list[Any] = []
        times: dict[str, list[float]] = {"with": [], "without": []}
        progress = Progress(cfg.steps) if rank == 0 else None
        for i in range(cfg.steps):
            harvest = i % 2 == 0
            if not harvest:
                h.detach()  # no hooks, gate closed: a step without side work, not recorded
            dist.barrier()
            t0 = time.perf_counter()
            step(i)
            times["with" if harvest else "without"].append(time.perf_counter() - t0)
            if not harvest:
                h.attach(sched)
                h.attach_optimizer(opt)
            if queue is not None and rank == 0 and i == min(2, cfg.steps - 1):
                # Every rank has recorded two steps; the queue's agents report bubbles
                # every 100 ms, so a few reports must have reached the coordinator, which
                # places by them. (Untimed: the other ranks wait at the next barrier.)
                time.sleep(max(0.0, _PLACEMENT_WARMUP_S - (time.monotonic() - queue_made)))
                placed = [queue.submit(_placed_spec(fr, cfg)) for _ in range(_n_placed(cfg))]
            if progress is not None:
                progress.step(i + 1, harvest)
        for task in placed:
            task.cancel(wait=True)  # whatever the run did not finish, wherever it is
        if queue is not None:
            dist.barrier()  # every rank's record shows the cancels before it is gathered
        report = h.report()
        items = handle.items_done if handle is not None else sum(report.items_per_task.values())
        if handle is not None:
            handle.cancel()
        report.settings.update(
            {
                "schedule": cfg.schedule,
                "stages": cfg.stages,
                "microbatches": cfg.microbatches,
                "task": cfg.task,
                "side_items": items,
            }
        )
        gathered = fr.gather_reports(report, queue=queue)
        times_all: list[Any] = [None] * cfg.stages if rank == 0 else None
        dist.gather_object(times, times_all, dst=0)
        if queue is not None:
            queue.close()  # collective
    if rank == 0:
        if result_path is None:
            _print_summary(fr, cfg, gathered, times_all)
        else:
            with open(result_path, "w") as f:
                json.dump({"reports": [r.to_dict() for r in gathered], "times": times_all}, f)
    dist.destroy_process_group()


def _n_placed(cfg: DemoConfig) -> int:
    return PLACED_TASKS_PER_STAGE * cfg.stages


def _placed_spec(fr: Any, cfg: DemoConfig) -> Any:
    from freeride import TaskSpec

    return TaskSpec(
        fr.tasks.Spin, kwargs={"items": placed_items(cfg), "ns_per_item": cfg.item_us * 1000}
    )


def job_step_times(times_all: list[dict[str, list[float]]]) -> tuple[list[float], list[float]]:
    """Each step's time for the job, harvesting steps and steps without side work: its
    slowest rank's (the ranks meet at a barrier before every step). `times_all`: every
    rank's {"with": [s, ...], "without": [...]}, as spawn_ranks writes them."""
    with_side = [max(step) for step in zip(*(t["with"] for t in times_all))]
    without = [max(step) for step in zip(*(t["without"] for t in times_all))]
    return with_side, without


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def harvesting_text(with_side: float, paired: PairedOverhead) -> str:
    """The summary's harvesting line: the median harvesting step (`with_side`, seconds)
    and the paired cost with its bootstrap 95% interval, which says when the run cannot
    tell that cost from none (on a machine with few cores, the steps vary by more than
    harvesting costs)."""
    text = f"{with_side * 1000:.1f} ms ({paired.median:+.1%}, median over {paired.pairs} step pair{'s' * (paired.pairs != 1)}"
    if paired.pairs < 2:
        return text + "; too few for an interval)"
    text += f", 95% interval {paired.low:+.1%} to {paired.high:+.1%}"
    return text + (": within noise on this machine)" if paired.within_noise else ")")


def _print_summary(fr: Any, cfg: DemoConfig, reports: list[Any], times_all: list[Any]) -> None:
    trace = os.path.join(cfg.outdir, "trace.json")
    png = os.path.join(cfg.outdir, "timeline.png")
    fr.merge_chrome_traces(reports, trace)
    try:
        # Recorded iterations are the harvesting steps; each is followed by a step without
        # side work that is not recorded, which the timeline shows as a gap.
        reports[min(1, len(reports) - 1)].plot(png, gap_label="step without side work")
    except ImportError:
        png = "(skipped: pip install matplotlib)"
    with_side = max(_median(t["with"]) for t in times_all)
    without = max(_median(t["without"]) for t in times_all)
    # A step's time is its slowest rank's; each harvesting step is compared with the step
    # without side work right after it, which cancels the machine's slow drifts.
    paired = paired_overhead(*job_step_times(times_all))
    bubble = sum(r.bubble_ns for r in reports)
    total = sum(r.total_ns for r in reports)
    harvested = sum(r.harvested_ns for r in reports)
    items = sum(r.settings.get("side_items", 0) for r in reports)
    recorded = len(reports[0].iterations)
    rows = [
        (
            "pipeline",
            (
                f"{cfg.stages} stages, {cfg.schedule}, {cfg.microbatches} microbatches, "
                f"{reports[0].backend} backend"
            ),
        ),
        ("launch", describe_launch(cfg)),
        ("side task", describe_task(cfg)),
        (
            "bubble fraction",
            (
                f"{bubble / total:.1%} of {total / 1e9:.2f} s recorded "
                f"({recorded} harvesting steps per rank, warm-up excluded)"
            ),
        ),
        ("harvested time", f"{harvested / 1e9:.3f} s ({harvested / bubble:.0%} of bubble time)"),
        ("side work done", describe_work(cfg, items)),
        ("iteration, no side work", f"{without * 1000:.1f} ms (median)"),
        ("iteration, harvesting", harvesting_text(with_side, paired)),
        ("trace", trace),
        ("timeline", png),
    ]
    if reports[0].backend == "host":
        # How the side threads kept out of other ranks' way (Harvester.host_idle): the
        # launch decides which ranks share a scheduling group.
        used = sorted({str(r.settings.get("host_idle", "?")) for r in reports})
        rows.insert(2, ("host side threads", ", ".join(used)))
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print()
    print(fr.stage_table(reports))
    if cfg.placement:
        print()
        print("job-wide placement: tasks submitted on rank 0, placed by fr.JobQueue")
        print(fr.placement_table(reports))
    if reports[0].backend == "host":
        print(
            "host backend: side work shares the CPU cores with training; what that costs "
            "beyond the hooks' time shows only in the iteration times (freeride bench ranks)"
        )


def run(cfg: DemoConfig) -> int:
    """Spawns the ranks and runs the demo; returns an exit code. Raises ConfigError (a
    ValueError) for a setting out of range, an output folder that cannot be written, or
    --device cuda where no GPU per stage is usable."""
    check_config(cfg)
    check_outdir(cfg.outdir)
    try:
        import torch
    except ImportError:
        print("freeride demo needs PyTorch: pip install torch", file=sys.stderr)
        return 2
    from freeride import backend_info

    info = backend_info()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    use_cuda = choose_cuda(cfg, gpus, info["cuda"], info.get("reason", ""))
    if cfg.device == "auto" and gpus and not use_cuda:
        why = "" if info["cuda"] else f" (freeride: {info.get('reason', '')})"
        print(f"{gpus} GPU(s) for {cfg.stages} stages{why}: running on the CPU")
    print(
        f"freeride demo: {cfg.stages}-stage {cfg.schedule} pipeline on "
        f"{'CUDA' if use_cuda else 'CPU (gloo)'}, side task {cfg.task}"
    )
    sys.stdout.flush()  # before the ranks write: a pipe would otherwise reorder the lines
    spawn_ranks(cfg, use_cuda)
    return 0


def spawn_ranks(cfg: DemoConfig, use_cuda: bool, result_path: str | None = None) -> None:
    """Runs the pipeline, one process per stage. Rank 0 prints the summary, or with
    `result_path` writes the gathered reports (Report.to_dict) and every rank's step times
    ({"with": [s, ...], "without": [...]}) there as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        run_ranks(
            _rank_main,
            cfg.stages,
            cfg,
            tmp,
            use_cuda,
            result_path,
            sessions=cfg.launch == "sessions",
        )
