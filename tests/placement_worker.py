"""A 4-rank gloo pipeline (1F1B) whose stage 1 is ten times heavier than the others, so
the other ranks wait for it: their bubbles are long, rank 1's short. Every rank trains
the same steps twice, without and with a harvester and a JobQueue; rank 1 (the least
bubble time) submits side tasks for the whole job, one of which it cancels while it runs
on another rank, and rank 3 leaves the queue mid-run. Each rank writes what only it can
see to rank<N>.json."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from pipeline_worker import _loss, train_steps
from rank_result import run_and_report
from torch import nn
from torch.distributed.pipelining import PipelineStage, schedules

import freeride as fr
from freeride.cli.spawn import join_group
from freeride.job.placement import TaskSpec

D = 64
HEAVY = 32768
BATCH = 8
MICRO = 4
WARMUP = 6
STEPS = 14
SUBMITTER = 1
LEAVER = 3
LEAVE_AT = 8  # from this step on, rank 3 leaves once it holds a task it has not started
TASKS = 10


def _modules(world: int) -> list[nn.Module]:
    torch.manual_seed(4321)
    out = []
    for stage in range(world):
        hidden = HEAVY if stage == SUBMITTER else 2 * D
        out.append(nn.Sequential(nn.Linear(D, hidden), nn.Tanh(), nn.Linear(hidden, D)))
    return out


def _train(rank, world, steps, on_step=None, h=None):
    module = _modules(world)[rank]
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = schedules.Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    if h is not None:
        h.attach(schedule)
        h.attach_optimizer(opt)
    g = torch.Generator().manual_seed(7)
    losses_all = train_steps(
        schedule, opt, g, steps, BATCH * MICRO, D, rank == 0, rank == world - 1, on_step
    )
    if h is not None:
        h.detach()
    weights = [p.detach().clone() for p in module.parameters()]
    return losses_all, weights


class CountSteps(fr.IterativeTask):
    """An iterative side task: five 1 ms steps; its result is the step count."""

    total_steps = 5

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        time.sleep(0.001)
        self.steps += 1

    def finished(self) -> bool:
        return self.steps >= self.total_steps

    def result(self) -> int:
        return self.steps


def _spin(items: int, ns: int) -> TaskSpec:
    return TaskSpec(fr.tasks.Spin, kwargs={"items": items, "ns_per_item": ns})


def _rank_body(rank: int, world: int, outdir: str, result: dict) -> None:
    join_group(rank, world, outdir)
    torch.set_num_threads(1)
    base_losses, base_weights = _train(rank, world, WARMUP + STEPS)
    with fr.Harvester("cpu", workers=1) as h:
        queue = fr.JobQueue(h)
        handles: list = []
        state: dict = {}

        def on_step(step: int) -> None:
            if step == WARMUP - 1 and rank == SUBMITTER:
                # Bubbles are measured by now: place a long task (cancelled below)
                # and short ones.
                state["long"] = queue.submit(_spin(10**9, 50_000), priority=1)
                handles.extend(queue.submit(_spin(2000, 50_000)) for _ in range(TASKS))
                state["iterative"] = queue.submit(TaskSpec(CountSteps, step_ms=1.0), priority=2)
            if rank == SUBMITTER and "long" in state and "cancel_at" not in state:
                long = state["long"]
                if long.items_done > 0 and not long.done():
                    state["cancel_at"] = step
                    state["long_rank"] = long.rank
                    state["long_cancelled"] = long.cancel(wait=True, timeout=30)
                    state["long_items"] = long.items_done
            if step >= LEAVE_AT and rank == LEAVER and "hosted_at_leave" not in result:
                hosted = queue.hosted()
                if "queued" in hosted.values():
                    result["hosted_at_leave"] = hosted
                    queue.leave()

        losses, weights = _train(rank, world, WARMUP + STEPS, on_step, h)
        result["identical"] = losses == base_losses and all(
            torch.equal(a, b) for a, b in zip(weights, base_weights)
        )
        bubble = h._recorder.bubble_stats()[0]
        result["bubble_ms"] = bubble / 1e6
        # Training is over: let the rest of the side work finish with the gate open.
        h.gate.open(stream="host")
        if rank == SUBMITTER:
            deadline = time.monotonic() + 120
            for handle in handles:
                handle.wait(max(0.0, deadline - time.monotonic()))
            long = state["long"]
            if "cancel_at" not in state:
                long.cancel(wait=True, timeout=30)
            result["tasks"] = [
                {"id": t.id, "state": t.state, "rank": t.rank, "items": t.items_done}
                for t in handles
            ]
            it = state["iterative"]
            result["iterative"] = {
                "id": it.id,
                "rank": it.rank,
                "result": it.result(timeout=max(0.0, deadline - time.monotonic())),
            }
            result["long"] = {
                "state": long.state,
                "rank": state.get("long_rank", long.rank),
                "cancelled": state.get("long_cancelled"),
                "items_at_cancel": state.get("long_items"),
                "items_after": long.items_done,
            }
            try:
                long.result(timeout=0)
            except fr.TaskCancelledError as exc:
                result["long_error"] = str(exc)
        dist.barrier()
        reports = fr.gather_reports(h.report(), queue=queue)
        if rank == 0:
            result["table"] = fr.placement_table(reports)
            result["hosted_by_rank"] = {
                r.rank: sorted(r.placement.get("hosted", {})) for r in reports
            }
            result["report_decisions"] = len(reports[0].placement.get("decisions", []))
            result["named_tasks"] = sorted(
                name for r in reports for name in r.task_names.values() if "[job task" in name
            )
            result["decisions"] = [
                {
                    "task": d.task,
                    "label": d.label,
                    "rank": d.rank,
                    "reason": d.reason,
                    "bubble_ms": d.bubble_ms,
                }
                for d in queue.decisions()
            ]
        queue.close()
        result["threads_after_close"] = sorted(
            t.name for t in __import__("threading").enumerate() if "jobqueue" in t.name
        )


def run_rank(rank: int, world: int, outdir: str) -> None:
    run_and_report(rank, outdir, lambda result: _rank_body(rank, world, outdir, result))
