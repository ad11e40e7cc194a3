"""`freeride demo`: a real multi-process pipeline with a side task in its bubbles.

Spawns one process per stage (no torchrun), trains a small transformer split into
stages with a torch.distributed.pipelining schedule over gloo (NCCL on GPUs), and
alternates steps with and without harvesting, so the two iteration times are measured
side by side in one run. Rank 0 prints the table and writes trace.json and timeline.png.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .simulate import SCHEDULES, stage_ids

TASKS = ("spin", "saxpy", "none")


@dataclass
class DemoConfig:
    schedule: str = "1f1b"
    stages: int = 4
    microbatches: int = 8
    steps: int = 12
    task: str = "spin"
    item_us: int = 50
    device: str = "auto"
    outdir: str = "."
    d_model: int = 64
    seq_len: int = 32
    micro_batch: int = 4


def _progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    elapsed = time.monotonic() - started
    sys.stderr.write(
        f"\r  [{'#' * filled}{'.' * (width - filled)}] step {done}/{total}  {elapsed:5.1f} s"
    )
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _side_task(fr: Any, cfg: DemoConfig, device: str) -> Any:
    if cfg.task == "spin":
        return fr.tasks.Spin(items=2**40, ns_per_item=cfg.item_us * 1000)
    import torch

    n = 1 << 22
    return fr.tasks.Saxpy(1e-6, torch.ones(n, device=device), torch.zeros(n, device=device))


def _rank_main(rank: int, cfg: DemoConfig, store: str, use_cuda: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, schedules

    import freeride as fr

    device = torch.device(f"cuda:{rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=cfg.stages,
    )
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
        handle = h.submit(_side_task(fr, cfg, str(device))) if cfg.task != "none" else None
        h.attach(sched)
        h.attach_optimizer(opt)
        step(0)  # warm-up: shape inference, allocator
        step(1)
        times = {True: [], False: []}
        started = time.monotonic()
        for i in range(cfg.steps):
            harvest = i % 2 == 0
            if not harvest:
                h.detach()  # no hooks, gate closed: a step without side work
            dist.barrier()
            t0 = time.perf_counter()
            step(i)
            times[harvest].append(time.perf_counter() - t0)
            if not harvest:
                h.attach(sched)
                h.attach_optimizer(opt)
            if rank == 0:
                _progress(i + 1, cfg.steps, started)
        report = h.report()
        items = handle.items_done if handle is not None else 0
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
        gathered = fr.gather_reports(report)
        times_all: list[Any] = [None] * cfg.stages if rank == 0 else None
        dist.gather_object(times, times_all, dst=0)
    if rank == 0:
        _print_summary(fr, cfg, gathered, times_all)
    dist.destroy_process_group()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def _print_summary(fr: Any, cfg: DemoConfig, reports: list[Any], times_all: list[Any]) -> None:
    os.makedirs(cfg.outdir, exist_ok=True)
    trace = os.path.join(cfg.outdir, "trace.json")
    png = os.path.join(cfg.outdir, "timeline.png")
    fr.merge_chrome_traces(reports, trace)
    try:
        reports[min(1, len(reports) - 1)].plot(png)
    except ImportError:
        png = "(skipped: pip install matplotlib)"
    with_side = max(_median(t[True]) for t in times_all)
    without = max(_median(t[False]) for t in times_all)
    bubble = sum(r.bubble_ns for r in reports)
    total = sum(r.total_ns for r in reports)
    harvested = sum(r.harvested_ns for r in reports)
    items = sum(r.settings.get("side_items", 0) for r in reports)
    unit = f"Spin items of {cfg.item_us} us" if cfg.task == "spin" else "Saxpy items"
    rows = [
        (
            "pipeline",
            (
                f"{cfg.stages} stages, {cfg.schedule}, {cfg.microbatches} microbatches, "
                f"{reports[0].backend} backend"
            ),
        ),
        ("bubble fraction", f"{bubble / total:.1%} of {total / 1e9:.2f} s recorded"),
        ("harvested time", f"{harvested / 1e9:.3f} s ({harvested / bubble:.0%} of bubble time)"),
        ("side work done", f"{items:,} {unit}"),
        ("iteration, no side work", f"{without * 1000:.1f} ms (median)"),
        (
            "iteration, harvesting",
            f"{with_side * 1000:.1f} ms ({(with_side - without) / without:+.1%})",
        ),
        ("trace", trace),
        ("timeline", png),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print()
    print(fr.stage_table(reports))


def run(cfg: DemoConfig) -> int:
    """Spawns the ranks and runs the demo; returns an exit code."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {cfg.task!r}")
    if cfg.stages < 2:
        raise ValueError(f"stages must be >= 2, got {cfg.stages}")
    if cfg.microbatches < cfg.stages:
        raise ValueError(f"microbatches must be >= stages ({cfg.stages}), got {cfg.microbatches}")
    if cfg.steps < 2:
        raise ValueError(f"steps must be >= 2, got {cfg.steps}")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("freeride demo needs PyTorch: pip install torch", file=sys.stderr)
        return 2
    # One GPU per stage: NCCL refuses two ranks on one device.
    use_cuda = cfg.device != "cpu" and torch.cuda.device_count() >= cfg.stages
    if cfg.device != "cpu" and torch.cuda.is_available() and not use_cuda:
        print(f"{torch.cuda.device_count()} GPU(s) for {cfg.stages} stages: running on the CPU")
    print(
        f"freeride demo: {cfg.stages}-stage {cfg.schedule} pipeline on "
        f"{'CUDA' if use_cuda else 'CPU (gloo)'}, side task {cfg.task}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(
            _rank_main,
            args=(cfg, os.path.join(tmp, "store"), use_cuda),
            nprocs=cfg.stages,
            join=True,
        )
    return 0
