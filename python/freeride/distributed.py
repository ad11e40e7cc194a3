"""Multi-rank reports: every rank owns its harvester; these collect their reports."""

from __future__ import annotations

from typing import Any

from .report import Report


def gather_reports(report: Report, dst: int = 0, group: Any = None) -> list[Report] | None:
    """Collects every rank's `report` on rank `dst` over torch.distributed (any backend:
    reports travel as plain dicts). Returns the reports ordered by rank on `dst` and None
    on the other ranks. Every rank of `group` must call it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("gather_reports() needs an initialised torch.distributed process group")
    if not isinstance(report, Report):
        raise TypeError(f"report must be a freeride Report, got {type(report).__name__}")
    rank = dist.get_rank(group)
    payload = report.to_dict()
    out: list[Any] | None = [None] * dist.get_world_size(group) if rank == dst else None
    dist.gather_object(payload, out, dst=dst, group=group)
    if out is None:
        return None
    return [Report.from_dict(d) for d in out]


def stage_table(reports: list[Report]) -> str:
    """A per-rank table: iteration time, bubble fraction, harvested share, side items and
    estimated overhead."""
    header = f"{'rank':>4}  {'iter ms':>8}  {'bubbles':>7}  {'harvested':>9}  {'items':>10}  {'overhead':>8}"
    rows = [header, "-" * len(header)]
    for r in reports:
        iters = max(1, len(r.iterations))
        harvested = r.harvested_ns / r.bubble_ns if r.bubble_ns else 0.0
        items = sum(r.items_per_task.values())
        rows.append(
            f"{r.rank if r.rank is not None else '-':>4}  {r.total_ns / iters / 1e6:>8.2f}  "
            f"{r.bubble_fraction:>7.1%}  {harvested:>9.1%}  {items:>10,}  "
            f"{r.estimated_overhead:>8.2%}"
        )
    return "\n".join(rows)
