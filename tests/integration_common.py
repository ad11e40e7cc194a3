"""What the engine-integration workers share: the CPU stand-ins the engines need, and the
side-work summary each rank reports (items, where they started, the bubble record)."""

from __future__ import annotations

from rank_result import run_and_report  # noqa: F401 - the workers take it from here

import freeride as fr


def cpu_patches() -> None:
    """megatron-core on CPU (in a rank process only): torch.cuda.current_device() names the
    CPU, and torch.zeros(..., device="cuda") (the schedules' token counter) lands there."""
    import torch

    torch.cuda.current_device = lambda: torch.device("cpu")
    zeros = torch.zeros

    def cpu_zeros(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return zeros(*args, **kwargs)

    torch.zeros = cpu_zeros


def side_summary(h: fr.Harvester, task, handle) -> dict:
    """Cancels the side task and summarizes what it did against the bubble record, taken
    after the cancel (which returns once no item runs: every launch has ended and is in
    the record)."""
    handle.cancel()
    report = h.report()
    snap = task.snapshot()
    origin = h._recorder.clock_origin_ns
    spans = [
        (origin + c.start_ns, origin + c.end_ns) for it in report.iterations for c in it.compute
    ]
    ran = snap.times.reshape(-1, 2)
    ran = ran[ran[:, 0] > 0]
    started_inside = 0
    for start, _ in ran.tolist():
        if any(c0 <= start < c1 for c0, c1 in spans):
            started_inside += 1
    return {
        "items_done": handle.items_done,
        "max_count": int(snap.counts.max()),
        "items_timed": len(ran),
        "items_started_in_compute": started_inside,
        "side_launch_items": sum(report.items_per_task.values()),
        "iterations": len(report.iterations),
        "partition_errors": [
            it.duration_ns
            - sum(b.duration_ns for b in it.bubbles)
            - sum(c.end_ns - c.start_ns for c in it.compute)
            for it in report.iterations
        ],
        "labels": [[c.label for c in it.compute] for it in report.iterations],
    }


def all_progressed(handle) -> bool:
    """Whether the side task has run items on every rank (collective, default group)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if handle.items_done > 0 else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


# Extra harvested steps allowed after the compared ones, until side work has progressed on
# every rank: the side workers run at SCHED_IDLE, so on a loaded CI machine the few short
# bubbles of the compared steps can pass without a core for them.
MAX_EXTRA_STEPS = 400


def side_task() -> fr.tasks.ItemCounter:
    return fr.tasks.ItemCounter(10**6, ns_per_item=20_000, record_times=True)


def globals_of(module, names) -> dict:
    return {n: vars(module)[n] for n in names}
