"""Reports as Chrome/Perfetto trace event JSON: one report (`write_chrome_trace`, behind
`Report.to_chrome_trace`), several ranks' in one trace (`merge_chrome_traces`), or added to
a torch.profiler trace on its clock (`merge_with_profiler_trace`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ._format import FORMAT, jsonable
from .model import Iteration, SideLaunch

__all__ = ["merge_chrome_traces", "merge_with_profiler_trace", "write_chrome_trace"]

# Fixed track ids so that the same track has the same tid on every rank of a merged trace.
_TID_ITERATIONS = 1
_TID_COMPUTE = 2
_TID_BUBBLES = 3
_TID_SIDE_BASE = 100

# Where freeride's processes go in a merged torch.profiler trace: far from real pids
# (and from the device indices kineto uses as pids of GPU tracks).
_PROFILER_PID_BASE = 1 << 30


class _ReportView(Protocol):
    """What a trace reads of a Report; report.py imports this module, so it cannot import
    Report back."""

    device: str
    backend: str
    rank: int | None
    iterations: list[Iteration]
    launches: list[SideLaunch]
    settings: dict[str, Any]
    placement: dict[str, Any]
    clock_origin_unix_ns: int | None

    @property
    def task_names(self) -> dict[int, str]: ...

    def totals(self) -> dict[str, Any]: ...


def _is_view(rep: Any) -> bool:
    return all(hasattr(rep, a) for a in ("device", "rank", "iterations", "launches"))


def _report_list(reports: Any, single: bool) -> list[Any]:
    """`reports` as a list, each checked to be a report (not a str, a path, None), before a
    file is read or written; with `single`, one report alone is taken too."""
    if not isinstance(reports, (str, bytes)) and isinstance(reports, Iterable):
        reps = list(reports)
        for i, rep in enumerate(reps):
            if not _is_view(rep):
                raise TypeError(f"reports[{i}] must be a freeride Report, got {type(rep).__name__}")
        return reps
    # A Report is not iterable, which tells one report from a collection of them.
    if single and _is_view(reports):
        return [reports]
    wanted = "a freeride Report or a list of them" if single else "a list of freeride Reports"
    raise TypeError(f"reports must be {wanted}, got {type(reports).__name__}")


def write_chrome_trace(report: _ReportView, path: str | os.PathLike[str]) -> None:
    pid = report.rank if report.rank is not None else 0
    name = f"rank {report.rank}" if report.rank is not None else f"freeride {report.device}"
    trace = {
        "traceEvents": _events(report, pid, name),
        "displayTimeUnit": "ms",
        "metadata": {"freeride": FORMAT, **_metadata(report)},
    }
    _write_json(path, trace)


def merge_chrome_traces(reports: Sequence[_ReportView], path: str | os.PathLike[str]) -> None:
    """Write one Chrome trace holding several ranks' reports, one process per rank
    (pid = rank, named "rank N"); a report without a rank takes its position in
    `reports`, or the next free pid when that is taken.

    Each rank's times are on its own recording's timeline, so alignment across ranks is
    only as good as the recordings' common start.
    """
    reports = _report_list(reports, single=False)
    events: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for rep, pid in zip(reports, _rank_pids(reports, set())):
        name = f"rank {rep.rank}" if rep.rank is not None else f"rank ? ({rep.device})"
        events += _events(rep, pid, name)
        ranks.append({"pid": pid, **_metadata(rep)})
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {"freeride": FORMAT, "ranks": ranks},
    }
    _write_json(path, trace)


def merge_with_profiler_trace(
    reports: _ReportView | Sequence[_ReportView],
    profiler_trace: str | os.PathLike[str],
    path: str | os.PathLike[str],
    clock_origin_unix_ns: int | None = None,
) -> None:
    """Write the Chrome trace torch.profiler exported (`profiler_trace`, from
    ``prof.export_chrome_trace``) with each report's tracks added on the profiler's
    clock: a process "freeride rank N" (or "freeride <device>") per report, holding the
    tracks "iterations", "training compute", "bubbles" and one "side: <task>" per task,
    beside the profiler's own processes. Side launches run on freeride's threads, so
    this is where they meet the profiler's timeline; the live "freeride: bubble <k>"
    ranges (profiling.py) are already in the profiler's trace.

    The clock: torch.profiler's "ts" is microseconds after the trace's top-level
    "baseTimeNanoseconds", and their sum is Unix time. A report of the host backend
    knows the Unix time of its time 0 (`Report.clock_origin_unix_ns`); a GPU report's
    comes from the clock anchor, a stamp kernel whose store into host memory freeride
    watches land, whatever work was queued ahead of it (recorder.py,
    _gpu_mark_unix_ns; a probe event only where the anchor gives no answer). Pass
    `clock_origin_unix_ns` for reports without one (one made by hand, or whose device
    answered neither way within a second), else they are refused with ValueError.
    """
    reps = _report_list(reports, single=True)
    _check_path(path)
    _check_path(profiler_trace, "profiler_trace")
    with open(profiler_trace, encoding="utf-8") as f:
        trace = json.load(f)
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    events = trace.setdefault("traceEvents", [])
    used = {e.get("pid") for e in events}
    ranks: list[dict[str, Any]] = []
    for rep, pid in zip(reps, _rank_pids(reps, used, _PROFILER_PID_BASE)):
        origin = rep.clock_origin_unix_ns
        if origin is None:
            origin = clock_origin_unix_ns
        if origin is None:
            raise ValueError(
                f"the report of {rep.device} has no host clock origin (a GPU record is on "
                "the device's timeline): pass clock_origin_unix_ns"
            )
        name = f"freeride rank {rep.rank}" if rep.rank is not None else f"freeride {rep.device}"
        events += _events(rep, pid, name, shift_ns=origin - base_ns)
        ranks.append({"pid": pid, "clock_origin_unix_ns": origin, **_metadata(rep)})
    trace["freeride"] = {"format": FORMAT, "ranks": ranks}
    _write_json(path, trace)


def _events(
    report: _ReportView, pid: int, process_name: str, shift_ns: int = 0
) -> list[dict[str, Any]]:
    """The report's trace events, `shift_ns` added to every time."""

    def span(name: str, cat: str, start_ns: int, end_ns: int, *rest: Any) -> dict[str, Any]:
        return _span(name, cat, start_ns + shift_ns, end_ns + shift_ns, *rest)

    names = report.task_names
    events: list[dict[str, Any]] = [
        _meta("process_name", pid, 0, {"name": process_name}),
        _meta("process_sort_index", pid, 0, {"sort_index": pid}),
    ]
    tracks = [
        (_TID_ITERATIONS, "iterations"),
        (_TID_COMPUTE, "training compute"),
        (_TID_BUBBLES, "bubbles"),
    ] + [(_TID_SIDE_BASE + tid, f"side: {name}") for tid, name in names.items()]
    for order, (tid, name) in enumerate(tracks):
        events.append(_meta("thread_name", pid, tid, {"name": name}))
        events.append(_meta("thread_sort_index", pid, tid, {"sort_index": order}))

    for it in report.iterations:
        it_bubble = sum(b.duration_ns for b in it.bubbles)
        events.append(
            span(
                f"iteration {it.index}",
                "iteration",
                it.start_ns,
                it.end_ns,
                pid,
                _TID_ITERATIONS,
                {
                    "index": it.index,
                    "duration_us": it.duration_ns / 1e3,
                    "bubble_fraction": it_bubble / it.duration_ns if it.duration_ns else 0.0,
                },
            )
        )
        for c in it.compute:
            events.append(
                span(
                    c.label,
                    "compute",
                    c.start_ns,
                    c.end_ns,
                    pid,
                    _TID_COMPUTE,
                    {"iteration": it.index, "duration_us": (c.end_ns - c.start_ns) / 1e3},
                )
            )
        for b in it.bubbles:
            events.append(
                span(
                    f"bubble {b.slot}",
                    "bubble",
                    b.start_ns,
                    b.end_ns,
                    pid,
                    _TID_BUBBLES,
                    {
                        "iteration": b.iteration,
                        "slot": b.slot,
                        "duration_us": b.duration_ns / 1e3,
                        "free_memory": b.free_memory,
                        "side_items": {
                            f"{k}: {names.get(k, '?')}": v[0] for k, v in b.side.items()
                        },
                        "side_us": {
                            f"{k}: {names.get(k, '?')}": v[1] / 1e3 for k, v in b.side.items()
                        },
                    },
                )
            )
    for x in report.launches:
        events.append(
            span(
                f"phase {x.phase}",
                "side",
                x.start_ns,
                x.end_ns,
                pid,
                _TID_SIDE_BASE + x.task_id,
                {
                    "task_id": x.task_id,
                    "task": x.task,
                    "phase": x.phase,
                    "items": x.items,
                    "duration_us": (x.end_ns - x.start_ns) / 1e3,
                },
            )
        )
    return events


def _metadata(report: _ReportView) -> dict[str, Any]:
    return {
        "device": report.device,
        "backend": report.backend,
        "rank": report.rank,
        "settings": jsonable(report.settings),
        "placement": jsonable(report.placement),
        "totals": report.totals(),
    }


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _span(
    name: str, cat: str, start_ns: int, end_ns: int, pid: int, tid: int, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start_ns / 1e3,
        "dur": max(0, end_ns - start_ns) / 1e3,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _check_path(path: Any, name: str = "path") -> None:
    """A file name: open() would take an int (or a bool) for a file descriptor, write
    there and close it (True: stdout)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike file name, got {type(path).__name__}")


def _write_json(path: str | os.PathLike[str], obj: Any) -> None:
    # dumps + one write: json.dump's many small writes are several times slower on traces
    # with tens of thousands of events.
    _check_path(path)
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _rank_pids(reports: Sequence[_ReportView], used: set[Any], base: int = 0) -> list[int]:
    """A pid per report: base + its rank, or base + its position in `reports` for a
    report without a rank; the next free pid when that is taken."""
    pids = []
    for i, rep in enumerate(reports):
        pid = base + (rep.rank if rep.rank is not None else i)
        while pid in used:
            pid += 1
        used.add(pid)
        pids.append(pid)
    return pids
