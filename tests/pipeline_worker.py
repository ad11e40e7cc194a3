"""A real multi-process pipeline on CPU (gloo) for the attach tests. Each rank trains a
few steps without harvesting and the same steps with harvesting, and checks what only it
can see; the parent test reads the JSON each rank writes."""

from __future__ import annotations

import os

import torch
from rank_result import run_and_report
from torch import nn
from torch.distributed.pipelining import PipelineStage, schedules

import freeride as fr
from freeride import simulate
from freeride.cli.spawn import join_group

D = 32
BATCH = 8


def available(name: str) -> bool:
    return hasattr(schedules, simulate.SCHEDULES[name][0])


def _model(num_stages: int) -> list[nn.Module]:
    torch.manual_seed(1234)
    return [
        nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D), nn.Tanh())
        for _ in range(num_stages)
    ]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def train_steps(schedule, opt, generator, steps, rows, width, first, last, on_step=None):
    """`steps` schedule steps, each followed by an optimizer step, on random batches of
    `rows` x `width` from `generator`; `first` / `last`: this rank holds the first stage
    (feeds the input) / the last (gets the target). Returns each step's losses;
    `on_step(step)` runs after each step."""
    losses_all = []
    for step in range(steps):
        x = torch.randn(rows, width, generator=generator)
        target = torch.randn(rows, width, generator=generator)
        opt.zero_grad()
        losses: list = []
        args = (x,) if first else ()
        kw = {"target": target, "losses": losses} if last else {}
        schedule.step(*args, **kw)
        opt.step()
        losses_all.append([float(v.detach()) for v in losses])
        if on_step is not None:
            on_step(step)
    return losses_all


def _train(rank, world, name, n_micro, steps, harvester=None, side=None, out=None):
    cls_name, per_rank, _ = simulate.SCHEDULES[name]
    num_stages = world * per_rank
    ids = simulate.stage_ids(name, rank, world)
    modules = _model(num_stages)
    stages = [PipelineStage(modules[i], i, num_stages, torch.device("cpu")) for i in ids]
    cls = getattr(schedules, cls_name)
    kwargs = {"n_microbatches": n_micro, "loss_fn": _loss}
    schedule = cls(stages, **kwargs) if per_rank > 1 else cls(stages[0], **kwargs)
    params = [p for i in ids for p in modules[i].parameters()]
    opt = torch.optim.SGD(params, lr=0.05)
    before = {}
    if harvester is not None:
        objs = [schedule, *stages, opt]
        before = {id(o): {k: v for k, v in vars(o).items() if callable(v)} for o in objs}
        harvester.attach(schedule)
        harvester.attach_optimizer(opt)
    g = torch.Generator().manual_seed(99)
    losses_all = train_steps(
        schedule, opt, g, steps, BATCH * n_micro, D, 0 in ids, num_stages - 1 in ids
    )
    grads = [p.grad.clone() for p in params]
    weights = [p.detach().clone() for p in params]
    if harvester is not None:
        out["report"] = harvester.report()
        harvester.detach()
        after = {id(o): {k: v for k, v in vars(o).items() if callable(v)} for o in objs}
        out["detach_restores"] = after == before
    return losses_all, grads, weights


def _rank_body(
    rank: int, world: int, name: str, n_micro: int, steps: int, outdir: str, side: str, result: dict
) -> None:
    join_group(rank, world, outdir)
    torch.set_num_threads(1)
    base_losses, base_grads, base_weights = _train(rank, world, name, n_micro, steps)
    with fr.Harvester("cpu", workers=1) as h:
        extra: dict = {}
        if side == "items":
            task = fr.tasks.ItemCounter(10**6, ns_per_item=20_000, record_times=True)
        else:
            task = FailingStep()
        handle = h.submit(task)
        losses, grads, weights = _train(rank, world, name, n_micro, steps, h, side, extra)
        report = extra["report"]
        result["identical"] = (
            losses == base_losses
            and all(torch.equal(a, b) for a, b in zip(grads, base_grads))
            and all(torch.equal(a, b) for a, b in zip(weights, base_weights))
        )
        result["detach_restores"] = extra["detach_restores"]
        result["iterations"] = len(report.iterations)
        result["partition_errors"] = [
            it.duration_ns
            - sum(b.duration_ns for b in it.bubbles)
            - sum(c.end_ns - c.start_ns for c in it.compute)
            for it in report.iterations
        ]
        result["order"] = [
            c.label for c in report.iterations[0].compute if not c.label.startswith("loss")
        ]
        result["compute_labels"] = sorted(
            {c.label.split()[0] for it in report.iterations for c in it.compute}
        )
        # Stages whose loss was recorded as a compute action (only the last stage's).
        result["loss_stages"] = sorted(
            {
                int(c.label.split()[1][1:])
                for it in report.iterations
                for c in it.compute
                if c.label.startswith("loss")
            }
        )
        result["bubble_fraction"] = report.bubble_fraction
        if side == "items":
            handle.cancel()
            snap = task.snapshot()
            result["items_done"] = handle.items_done
            result["max_count"] = int(snap.counts.max())
            origin = h._recorder.clock_origin_ns
            spans = [
                (origin + c.start_ns, origin + c.end_ns)
                for it in report.iterations
                for c in it.compute
            ]
            ran = snap.times.reshape(-1, 2)
            ran = ran[ran[:, 0] > 0]
            # A close does not wait for the items in flight: an item may straddle a
            # compute action's start (the pause latency), but one that starts inside
            # compute passed the gate after the close, unless its worker lost its
            # core between the gate check and the item's first clock read.
            started_inside = straddling = 0
            for start, end in ran.tolist():
                for c0, c1 in spans:
                    if c0 <= start < c1:
                        started_inside += 1
                        break
                    if start < c0 < end:
                        straddling += 1
                        break
            result["items_started_in_compute"] = started_inside
            result["items_straddling_compute"] = straddling
            result["items_timed"] = len(ran)
            result["side_launch_items"] = sum(report.items_per_task.values())
            # Items that began inside a recorded iteration: each ran in a launch the report
            # must list (the launches begun before attach() closed the gate are not).
            windows = [(origin + it.start_ns, origin + it.end_ns) for it in report.iterations]
            result["items_in_iterations"] = sum(
                any(w0 <= start < w1 for w0, w1 in windows) for start, _ in ran.tolist()
            )
        else:
            handle.wait(30)
            result["side_state"] = handle.state
            result["side_error"] = repr(handle._error)
        if rank == 0:
            report.to_chrome_trace(os.path.join(outdir, "trace.json"))
            try:
                report.plot(os.path.join(outdir, "timeline.png"))
            except ImportError:
                pass
        gathered = fr.gather_reports(report)
        if rank == 0:
            result["gathered_ranks"] = [r.rank for r in gathered]
            result["table"] = fr.stage_table(gathered)


def run_rank(
    rank: int, world: int, name: str, n_micro: int, steps: int, outdir: str, side: str
) -> None:
    run_and_report(
        rank,
        outdir,
        lambda result: _rank_body(rank, world, name, n_micro, steps, outdir, side, result),
    )


class FailingStep(fr.IterativeTask):
    """An iterative side task whose step raises: it must end failed, training unharmed."""

    def step(self) -> None:
        raise ValueError("side task step exploded")
