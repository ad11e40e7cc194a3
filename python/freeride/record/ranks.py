"""Multi-rank reports: every rank owns its harvester; these collect their reports."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from .report import Report


def gather_reports(
    report: Report, dst: int = 0, group: Any = None, queue: Any = None
) -> list[Report] | None:
    """Collects every rank's `report` on rank `dst` over torch.distributed (any backend:
    reports travel as plain dicts). Returns the reports ordered by rank on `dst` and None
    on the other ranks. Every rank of `group` must call it. With a JobQueue `queue`, each
    report carries the queue's record on its rank in ``report.placement`` (the tasks
    placed there; on the coordinator's rank, every placement decision)."""
    if not isinstance(report, Report):
        raise TypeError(f"report must be a freeride Report, got {type(report).__name__}")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("gather_reports() needs an initialised torch.distributed process group")
    if queue is not None:
        report.placement = queue.record()
    rank = dist.get_rank(group)
    payload = report.to_dict()
    out: list[Any] | None = [None] * dist.get_world_size(group) if rank == dst else None
    dist.gather_object(payload, out, dst=dst, group=group)
    if out is None:
        return None
    return [Report.from_dict(d) for d in out]


def _check_reports(reports: Any) -> list[Report]:
    """The tables' `reports`: a list (or other sequence) of Reports."""
    if reports is None:
        raise TypeError(
            "reports must be a list of freeride Reports, got None (gather_reports() "
            "returns None on every rank but dst)"
        )
    if isinstance(reports, (str, bytes, Mapping)) or not hasattr(reports, "__iter__"):
        raise TypeError(f"reports must be a list of freeride Reports, got {type(reports).__name__}")
    reports = list(reports)
    for i, r in enumerate(reports):
        if not isinstance(r, Report):
            raise TypeError(f"reports[{i}] must be a freeride Report, got {type(r).__name__}")
    return reports


STAGE_TABLE_LEGEND = (
    "iter ms: mean recorded iteration; bubbles: share of it the gate was open; harvested: "
    "share of bubble time with side work running; items: side items done; overhead: "
    "estimated cost to training (host backend: the training thread's time in freeride's "
    "hooks; GPU: side work still running when compute started)"
)


def stage_table(reports: list[Report], legend: bool = True) -> str:
    """A per-rank table: iteration time, bubble fraction, harvested share, side items and
    estimated overhead; with `legend`, followed by a line that explains the columns."""
    header = f"{'rank':>4}  {'iter ms':>8}  {'bubbles':>7}  {'harvested':>9}  {'items':>10}  {'overhead':>8}"
    rows = [header, "-" * len(header)]
    for r in _check_reports(reports):
        iters = max(1, len(r.iterations))
        harvested = r.harvested_ns / r.bubble_ns if r.bubble_ns else 0.0
        items = sum(r.items_per_task.values())
        rows.append(
            f"{r.rank if r.rank is not None else '-':>4}  {r.total_ns / iters / 1e6:>8.2f}  "
            f"{r.bubble_fraction:>7.1%}  {harvested:>9.1%}  {items:>10,}  "
            f"{r.estimated_overhead:>8.2%}"
        )
    if legend:
        rows += ["", *textwrap.wrap(STAGE_TABLE_LEGEND, width=88)]
    return "\n".join(rows)


def _job_order(job_id: str) -> tuple[int, int, str, int, str]:
    """Job task ids in submission order, not text order: the ranks' ("submitting
    rank:number") by rank, then outside clients' ("box prefix:number") by client, then
    any other; one key shape for all, so that ids of every kind compare."""
    head, _, tail = job_id.partition(":")
    if tail.isdecimal():  # (isdigit takes "²", which int() refuses)
        if head.isdecimal():
            return (0, int(head), "", int(tail), "")
        return (1, 0, head, int(tail), "")
    return (2, 0, "", 0, job_id)


PLACEMENT_TABLE_LEGEND = (
    "bubbles ms/it: the rank's bubble time per recorded iteration; task: job task id "
    "(submitting rank:number) and what it runs; state: as the rank last saw it; of "
    "bubbles: share of the rank's bubble time during which the task had side work running"
)


def placement_table(reports: list[Report], legend: bool = True) -> str:
    """Per rank: the job queue's tasks that ran there, their items and the share of the
    rank's bubble time each used (reports from gather_reports(..., queue=q)); with
    `legend`, followed by a line that explains the columns."""
    header = f"{'rank':>4}  {'bubbles ms/it':>13}  {'task':<40}  {'state':>9}  {'items':>10}  {'of bubbles':>10}"
    rows = [header, "-" * len(header)]
    reports = _check_reports(reports)
    for r in reports:
        iters = max(1, len(r.iterations))
        used = r.harvested_ns_per_task
        hosted = r.placement.get("hosted", {})
        first = True
        for job_id, entry in sorted(hosted.items(), key=lambda kv: _job_order(kv[0])):
            share = used.get(entry["local_id"], 0) / r.bubble_ns if r.bubble_ns else 0.0
            rank = (r.rank if r.rank is not None else "-") if first else ""
            bubbles = f"{r.bubble_ns / iters / 1e6:.2f}" if first else ""
            label = f"{job_id} {entry['label']}"[:40]
            rows.append(
                f"{rank:>4}  {bubbles:>13}  {label:<40}  {entry['state']:>9}  "
                f"{entry['items']:>10,}  {share:>10.1%}"
            )
            first = False
        if first:
            rank = r.rank if r.rank is not None else "-"
            rows.append(f"{rank:>4}  {r.bubble_ns / iters / 1e6:>13.2f}  {'(none)':<40}")
    decisions = [d for r in reports for d in r.placement.get("decisions", [])]
    if decisions:
        rows.append(
            f"{len(decisions)} placement decisions; the first: task {decisions[0]['task']} "
            f"-> rank {decisions[0]['rank']} ({decisions[0]['reason']})"
        )
    if legend:
        rows += ["", *textwrap.wrap(PLACEMENT_TABLE_LEGEND, width=88)]
    return "\n".join(rows)
