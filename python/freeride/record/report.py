"""The report a Harvester hands back: the bubble record plus what side work did in it.

A `Report` holds the raw record (iterations with their compute actions and bubbles, the
side launches, the tasks' totals) and derives every number from it, so a report gathered
from another rank (`to_dict` / `from_dict`, or pickled by
``torch.distributed.gather_object``) answers the same questions as a local one. It renders
as a text table (`summary`), a Chrome/Perfetto trace (`to_chrome_trace`,
`merge_chrome_traces`; `merge_with_profiler_trace` adds it to a torch.profiler trace)
and a PNG timeline (`plot`).

All times are integer nanoseconds on the recording's own timeline (see `report_model`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import textwrap
import warnings
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .model import Bubble, Compute, Iteration, SideLaunch, TaskSummary

__all__ = ["Report", "merge_chrome_traces", "merge_with_profiler_trace"]

_FORMAT = "freeride.report/1"
_FINAL_STATES = ("done", "failed", "cancelled")

# Fixed track ids so that the same track has the same tid on every rank of a merged trace.
_TID_ITERATIONS = 1
_TID_COMPUTE = 2
_TID_BUBBLES = 3
_TID_SIDE_BASE = 100


# --------------------------------------------------------------------------- intervals


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint union of half-open intervals; empty ones are dropped."""
    out: list[tuple[int, int]] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _length(merged: Sequence[tuple[int, int]]) -> int:
    return sum(e - s for s, e in merged)


def _overlap(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """Length of the intersection of two sorted disjoint interval lists (linear time)."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return total


# --------------------------------------------------------------------------- formatting


def _fmt_ns(ns: float) -> str:
    """A duration in the largest unit that keeps it >= 1 (ns, us, ms, s)."""
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3f} us"
    return f"{ns:.0f} ns"


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _pct(num: float, den: float) -> float:
    return 100.0 * num / den if den else 0.0


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _jsonable(value: Any) -> Any:
    """`value` with anything json cannot write (torch.device, paths, sets) turned into str,
    so that free-form settings never make to_dict unserialisable."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # NaN/inf are not JSON; a report must load in strict parsers (Perfetto, browsers).
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Construct a report_model dataclass from a dict, ignoring keys it does not know, so
    that a report written by a newer version with extra fields still loads."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# --------------------------------------------------------------------------- the report


@dataclass(repr=False)
class Report:
    """The bubble record of one rank and what side tasks did inside it.

    Every total is a property computed from `iterations`, `launches` and `tasks`, so a
    report can be edited, filtered or rebuilt from a dict and stays self-consistent.
    """

    device: str
    backend: str
    rank: int | None = None
    iterations: list[Iteration] = field(default_factory=list)
    launches: list[SideLaunch] = field(default_factory=list)
    tasks: list[TaskSummary] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    # Set by gather_reports(..., queue=q): the job queue's record on this rank (the
    # tasks placed here and, on the coordinator's rank, every placement decision).
    placement: dict[str, Any] = field(default_factory=dict)
    # Host backend: the Unix time in ns of the record's time 0, the clock of
    # torch.profiler's traces (profiling.py); None on a GPU, whose record is on the
    # device's own timeline.
    clock_origin_unix_ns: int | None = None

    # ----------------------------------------------------------------- interval views

    def _compute_intervals(self) -> list[tuple[int, int]]:
        return _merge((c.start_ns, c.end_ns) for it in self.iterations for c in it.compute)

    def _bubble_intervals(self) -> list[tuple[int, int]]:
        return _merge((b.start_ns, b.end_ns) for it in self.iterations for b in it.bubbles)

    def _launch_intervals(self) -> list[tuple[int, int]]:
        return _merge((x.start_ns, x.end_ns) for x in self.launches)

    # ----------------------------------------------------------------- totals

    @property
    def total_ns(self) -> int:
        """Sum of the recorded iterations' durations."""
        return sum(it.duration_ns for it in self.iterations)

    @property
    def compute_ns(self) -> int:
        """Time covered by compute actions (overlapping actions counted once)."""
        return _length(self._compute_intervals())

    @property
    def bubble_ns(self) -> int:
        """Time covered by bubbles."""
        return _length(self._bubble_intervals())

    @property
    def bubble_fraction(self) -> float:
        """bubble_ns / total_ns (0.0 for an empty report)."""
        total = self.total_ns
        return self.bubble_ns / total if total else 0.0

    @property
    def harvested_ns(self) -> int:
        """Bubble time during which at least one side launch was running.

        Launches of concurrent tasks are merged first, so this never exceeds bubble_ns.
        """
        return _overlap(self._launch_intervals(), self._bubble_intervals())

    @property
    def harvested_ns_per_task(self) -> dict[int, int]:
        """task_id -> bubble time during which that task had a launch running."""
        bubbles = self._bubble_intervals()
        by_task: dict[int, list[tuple[int, int]]] = {tid: [] for tid in self.task_names}
        for x in self.launches:
            by_task[x.task_id].append((x.start_ns, x.end_ns))
        return {tid: _overlap(_merge(spans), bubbles) for tid, spans in by_task.items()}

    @property
    def side_ns_outside_bubbles(self) -> int:
        """Time side launches overlapped compute actions: the overhead signal, ~0 when the
        gate does its job."""
        return _overlap(self._launch_intervals(), self._compute_intervals())

    @property
    def items_per_task(self) -> dict[int, int]:
        """task_id -> items completed by its recorded launches."""
        out: dict[int, int] = {}
        for x in self.launches:
            out[x.task_id] = out.get(x.task_id, 0) + x.items
        return out

    @property
    def overruns(self) -> int:
        """Iterative-task steps that did not fit their bubble, over all tasks."""
        return sum(t.overruns for t in self.tasks)

    @property
    def unharvested(self) -> list[str]:
        """Why bubble time went unharvested, where none of it was: an empty list when
        side work ran in some bubble or there were no bubbles. Each line states what the
        record shows (no task, tasks already final or still queued, how long the
        bubbles were), so a run that harvested nothing says why instead of just 0%."""
        if self.bubble_ns == 0 or self.harvested_ns > 0:
            return []
        reasons: list[str] = []
        states: dict[str, int] = {}
        for t in self.tasks:
            states[t.state] = states.get(t.state, 0) + 1
        if not self.tasks:
            reasons.append("no side task was submitted")
        elif not self.launches and all(s in _FINAL_STATES for s in states):
            reasons.append(
                "every side task had ended before the recorded iterations ("
                + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                + ")"
            )
        if states.get("queued"):
            reasons.append(
                f"{states['queued']} side task(s) still queued: none was admitted (the"
                " memory_budget, or a task of higher priority ahead of them)"
            )
        if self.launches:
            reasons.append(f"{len(self.launches)} side launch(es) recorded, none inside a bubble")
        durations = sorted(b.duration_ns for it in self.iterations for b in it.bubbles)
        if durations:
            reasons.append(
                f"{len(durations)} bubbles: median {_fmt_ns(durations[len(durations) // 2])},"
                f" longest {_fmt_ns(durations[-1])} (a side launch needs tens of"
                " microseconds to start after the gate opens)"
            )
        return reasons

    @property
    def hook_ns(self) -> int:
        """Host time the training thread spent in freeride's hooks (gate writes and
        recording), over the recorded iterations."""
        return sum(it.hook_ns for it in self.iterations)

    @property
    def estimated_overhead(self) -> float:
        """What harvesting cost training, as a fraction of total_ns.

        Host backend: the training thread's time in freeride's hooks. An item that passed
        the gate before a close finishes beside compute on a SCHED_IDLE worker, which
        yields its core to any training thread, so side work itself is not counted; what
        sharing cores costs beyond that (caches, a core taken for a few microseconds)
        shows only in measured iteration times (`freeride bench ranks`).

        GPU: the pause latency actually paid. For each compute action, the time side work
        was still running after the action started: min(end, action end) - action start
        for the launches that began before the action and ended after its start.
        Concurrent straddling launches count once (the action waits for the last one), so
        the per-action cost is taken from the latest-ending of them.
        """
        total = self.total_ns
        if not total:
            return 0.0
        if self.backend == "host":
            return self.hook_ns / total
        if not self.launches:
            return 0.0
        ordered = sorted((x.start_ns, x.end_ns) for x in self.launches)
        starts = [s for s, _ in ordered]
        # latest_end[i]: the latest end among launches ordered[0..i]; a running max lets
        # each compute start be answered with one bisect instead of a scan of launches.
        latest_end: list[int] = []
        running = -(2**63)
        for _, e in ordered:
            running = max(running, e)
            latest_end.append(running)
        paid = 0
        for it in self.iterations:
            for c in it.compute:
                i = bisect_left(starts, c.start_ns)  # launches with start < c.start_ns
                if i and latest_end[i - 1] > c.start_ns:
                    paid += max(0, min(latest_end[i - 1], c.end_ns) - c.start_ns)
        return paid / total

    @property
    def per_slot(self) -> list[dict[str, Any]]:
        """Bubble statistics by slot k across iterations: one dict per slot, sorted by slot,
        with ``slot``, ``count``, ``mean_ns``, ``min_ns``, ``max_ns`` and
        ``mean_free_memory`` (bytes, None where no free memory was recorded)."""
        durations: dict[int, list[int]] = {}
        memory: dict[int, list[int]] = {}
        for it in self.iterations:
            for b in it.bubbles:
                durations.setdefault(b.slot, []).append(b.duration_ns)
                if b.free_memory is not None:
                    memory.setdefault(b.slot, []).append(b.free_memory)
        out = []
        for slot in sorted(durations):
            d = durations[slot]
            m = memory.get(slot)
            out.append(
                {
                    "slot": slot,
                    "count": len(d),
                    "mean_ns": sum(d) / len(d),
                    "min_ns": min(d),
                    "max_ns": max(d),
                    "mean_free_memory": sum(m) / len(m) if m else None,
                }
            )
        return out

    @property
    def task_names(self) -> dict[int, str]:
        """task_id -> the task's repr, from the task summaries, else from its launches."""
        names = {x.task_id: x.task for x in self.launches}
        names.update({t.task_id: t.task for t in self.tasks})
        return dict(sorted(names.items()))

    def totals(self) -> dict[str, Any]:
        """Every derived total in one JSON-serialisable dict (task ids as str keys)."""
        return {
            "total_ns": self.total_ns,
            "compute_ns": self.compute_ns,
            "bubble_ns": self.bubble_ns,
            "bubble_fraction": self.bubble_fraction,
            "harvested_ns": self.harvested_ns,
            "harvested_ns_per_task": {str(k): v for k, v in self.harvested_ns_per_task.items()},
            "side_ns_outside_bubbles": self.side_ns_outside_bubbles,
            "items_per_task": {str(k): v for k, v in self.items_per_task.items()},
            "overruns": self.overruns,
            "hook_ns": self.hook_ns,
            "estimated_overhead": self.estimated_overhead,
            "per_slot": self.per_slot,
        }

    # ----------------------------------------------------------------- text

    def _where(self) -> str:
        rank = "-" if self.rank is None else str(self.rank)
        return f"{self.device} (backend {self.backend}, rank {rank})"

    def summary(self) -> str:
        """A readable, aligned text table of the report's totals, tasks and bubble slots."""
        total, bubble, harvested = self.total_ns, self.bubble_ns, self.harvested_ns
        n = len(self.iterations)
        rows = [
            ("device", self._where()),
            ("iterations", str(n)),
            (
                "total time",
                f"{_fmt_ns(total)}" + (f" ({_fmt_ns(total / n)} per iteration)" if n else ""),
            ),
            ("compute time", _fmt_ns(self.compute_ns)),
            ("bubble time", _fmt_ns(bubble)),
            ("bubble fraction", f"{100 * self.bubble_fraction:.1f}%"),
            ("harvested", f"{_fmt_ns(harvested)} ({_pct(harvested, bubble):.1f}% of bubble time)"),
            ("side outside bubbles", _fmt_ns(self.side_ns_outside_bubbles)),
            ("overruns", str(self.overruns)),
            ("time in hooks", _fmt_ns(self.hook_ns)),
            ("estimated overhead", f"{100 * self.estimated_overhead:.3f}%"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = ["freeride report"] + [f"  {k:<{width}}  {v}" for k, v in rows]
        why = self.unharvested
        if why:
            lines.append("  nothing harvested:")
            lines += [f"    - {reason}" for reason in why]

        names = self.task_names
        if names:
            items = self.items_per_task
            per_task = self.harvested_ns_per_task
            summaries = {t.task_id: t for t in self.tasks}
            table = [("id", "items", "done/total", "state", "harvested", "task")]
            for tid, name in names.items():
                t = summaries.get(tid)
                done = "-"
                if t is not None:
                    total_items = "?" if t.items_total is None else f"{t.items_total:,}"
                    done = f"{t.items_done:,}/{total_items}"
                table.append(
                    (
                        str(tid),
                        f"{items.get(tid, 0):,}",
                        done,
                        t.state if t is not None else "-",
                        _fmt_ns(per_task.get(tid, 0)),
                        name,
                    )
                )
            lines.append("  side tasks")
            lines += _table(table, right={0, 1, 2, 4})

        slots = self.per_slot
        if slots:
            shown = slots[:16]
            table = [("slot", "count", "mean", "min", "max", "free memory")]
            for s in shown:
                table.append(
                    (
                        str(s["slot"]),
                        str(s["count"]),
                        _fmt_ns(s["mean_ns"]),
                        _fmt_ns(s["min_ns"]),
                        _fmt_ns(s["max_ns"]),
                        _fmt_bytes(s["mean_free_memory"]),
                    )
                )
            lines.append("  bubbles by slot")
            lines += _table(table, right={0, 1, 2, 3, 4, 5})
            if len(slots) > len(shown):
                lines.append(f"    ... {len(slots) - len(shown)} more slots")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        # The dataclass repr would print every interval of a long run.
        return (
            f"Report(device={self.device!r}, backend={self.backend!r}, rank={self.rank!r}, "
            f"iterations={len(self.iterations)}, launches={len(self.launches)}, "
            f"tasks={len(self.tasks)}, bubble_fraction={self.bubble_fraction:.3f})"
        )

    # ----------------------------------------------------------------- dict round trip

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict holding the whole record plus ``totals``.

        Dict keys that are task ids are written as str (JSON objects only have string
        keys); `from_dict` turns them back into ints.
        """
        return {
            "format": _FORMAT,
            "device": self.device,
            "backend": self.backend,
            "rank": self.rank,
            "settings": _jsonable(self.settings),
            "iterations": [
                {
                    "index": it.index,
                    "start_ns": it.start_ns,
                    "end_ns": it.end_ns,
                    "hook_ns": it.hook_ns,
                    "compute": [
                        {"start_ns": c.start_ns, "end_ns": c.end_ns, "label": c.label}
                        for c in it.compute
                    ],
                    "bubbles": [
                        {
                            "iteration": b.iteration,
                            "slot": b.slot,
                            "start_ns": b.start_ns,
                            "end_ns": b.end_ns,
                            "free_memory": b.free_memory,
                            "side": {str(k): [v[0], v[1]] for k, v in b.side.items()},
                        }
                        for b in it.bubbles
                    ],
                }
                for it in self.iterations
            ],
            "launches": [
                {
                    "task_id": x.task_id,
                    "task": x.task,
                    "phase": x.phase,
                    "start_ns": x.start_ns,
                    "end_ns": x.end_ns,
                    "items": x.items,
                }
                for x in self.launches
            ],
            "tasks": [
                {
                    "task_id": t.task_id,
                    "task": t.task,
                    "state": t.state,
                    "items_done": t.items_done,
                    "items_total": t.items_total,
                    "overruns": t.overruns,
                }
                for t in self.tasks
            ],
            "placement": _jsonable(self.placement),
            "clock_origin_unix_ns": self.clock_origin_unix_ns,
            "totals": self.totals(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """The report `to_dict` wrote (also after a JSON round trip); ``totals`` is ignored
        since every total is recomputed from the record."""
        iterations = []
        for it in d.get("iterations", []):
            compute = [_build(Compute, c) for c in it.get("compute", [])]
            bubbles = []
            for b in it.get("bubbles", []):
                side = {int(k): (v[0], int(v[1])) for k, v in (b.get("side") or {}).items()}
                bubbles.append(_build(Bubble, {**b, "side": side}))
            iterations.append(_build(Iteration, {**it, "compute": compute, "bubbles": bubbles}))
        return cls(
            device=d["device"],
            backend=d["backend"],
            rank=d.get("rank"),
            iterations=iterations,
            launches=[_build(SideLaunch, x) for x in d.get("launches", [])],
            tasks=[_build(TaskSummary, t) for t in d.get("tasks", [])],
            settings=dict(d.get("settings") or {}),
            placement=dict(d.get("placement") or {}),
            clock_origin_unix_ns=d.get("clock_origin_unix_ns"),
        )

    # ----------------------------------------------------------------- chrome trace

    def _trace_events(self, pid: int, process_name: str, shift_ns: int = 0) -> list[dict[str, Any]]:
        """The report's trace events, `shift_ns` added to every time."""

        def span(name: str, cat: str, start_ns: int, end_ns: int, *rest: Any) -> dict[str, Any]:
            return _span(name, cat, start_ns + shift_ns, end_ns + shift_ns, *rest)

        names = self.task_names
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

        for it in self.iterations:
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
        for x in self.launches:
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

    def _trace_metadata(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "backend": self.backend,
            "rank": self.rank,
            "settings": _jsonable(self.settings),
            "placement": _jsonable(self.placement),
            "totals": self.totals(),
        }

    def _process_name(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"freeride {self.device}"

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the record as Chrome trace event JSON, for ui.perfetto.dev or
        chrome://tracing: tracks "iterations", "training compute", "bubbles" and one
        "side: <task>" per task, all as complete ("X") events in microseconds."""
        pid = self.rank if self.rank is not None else 0
        trace = {
            "traceEvents": self._trace_events(pid, self._process_name()),
            "displayTimeUnit": "ms",
            "metadata": {"freeride": _FORMAT, **self._trace_metadata()},
        }
        _write_json(path, trace)

    @staticmethod
    def merge_chrome_traces(reports: Sequence[Report], path: str | os.PathLike[str]) -> None:
        """Deprecated (one release): ``fr.merge_chrome_traces``, the one writer of merged
        traces."""
        warnings.warn(
            "Report.merge_chrome_traces is deprecated; use fr.merge_chrome_traces",
            DeprecationWarning,
            stacklevel=2,
        )
        merge_chrome_traces(reports, path)

    # ----------------------------------------------------------------- plot

    def plot(
        self,
        path: str | os.PathLike[str],
        iterations: Sequence[int] | None = None,
        *,
        gap_label: str | None = "not recorded",
    ) -> None:
        """Write a PNG timeline: rows for compute, bubbles and each side task.

        `iterations` are Iteration.index values to show; by default the last (up to) 3.
        `gap_label` names the time between two shown iterations that no iteration covers
        (None: leave it unnamed). Needs matplotlib; uses the Agg canvas directly, leaving
        pyplot's backend alone.
        """
        fig = self.timeline(iterations, gap_label=gap_label)
        fig.savefig(os.fspath(path), format="png", dpi=110)

    def timeline(
        self, iterations: Sequence[int] | None = None, *, gap_label: str | None = "not recorded"
    ) -> Any:
        """The matplotlib Figure that `plot` writes (same arguments), for notebooks and
        for drawing on further."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("Report.plot needs matplotlib: pip install matplotlib") from e

        if iterations is None:
            chosen = self.iterations[-3:]
        else:
            by_index = {it.index: it for it in self.iterations}
            missing = [i for i in iterations if i not in by_index]
            if missing:
                raise ValueError(
                    f"no recorded iteration with index {missing}; "
                    f"recorded: {sorted(by_index)[:10]}{'...' if len(by_index) > 10 else ''}"
                )
            chosen = sorted((by_index[i] for i in iterations), key=lambda it: it.start_ns)

        names = self.task_names
        lanes = _lane_names(names)
        rows = ["compute", "bubbles"] + [f"side: {lanes[tid]}" for tid in names]
        fig = Figure(figsize=(12, max(3.0, 1.6 + 0.55 * len(rows))), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_title(self._timeline_title(chosen), fontsize=10)

        if not chosen:
            ax.text(0.5, 0.5, "no iterations recorded", ha="center", va="center")
            ax.set_axis_off()
            return fig

        lo = min(it.start_ns for it in chosen)
        hi = max(it.end_ns for it in chosen)
        span_ms = max(hi - lo, 1) / 1e6
        height = 0.7
        y = {name: len(rows) - 1 - i for i, name in enumerate(rows)}  # first row on top

        def bars(items: Iterable[tuple[int, int]]) -> list[tuple[float, float]]:
            out = []
            for s, e in items:
                s, e = max(s, lo), min(e, hi)
                if e > s:
                    out.append((s / 1e6, (e - s) / 1e6))
            return out

        for it in chosen:
            comp = bars((c.start_ns, c.end_ns) for c in it.compute)
            ax.broken_barh(
                comp, (y["compute"] - height / 2, height), facecolors="tab:blue", edgecolor="white"
            )
            # Name the actions wide enough to hold a label; narrow ones would just overlap.
            for c in it.compute:
                w = (c.end_ns - c.start_ns) / 1e6
                if w > 0.06 * span_ms:
                    ax.text(
                        (c.start_ns + c.end_ns) / 2e6,
                        y["compute"],
                        c.label,
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white",
                        clip_on=True,
                    )
            bub = bars((b.start_ns, b.end_ns) for b in it.bubbles)
            ax.broken_barh(
                bub,
                (y["bubbles"] - height / 2, height),
                facecolors="lightgrey",
                edgecolor="grey",
                linewidth=0.5,
            )
            ax.axvline(it.start_ns / 1e6, color="black", linestyle="--", linewidth=0.8)
            ax.text(
                it.start_ns / 1e6,
                len(rows) - 0.35,
                f" iter {it.index}",
                fontsize=8,
                va="bottom",
                ha="left",
            )
        ax.axvline(hi / 1e6, color="black", linestyle="--", linewidth=0.8)

        # Time between two shown iterations belongs to none: shade it and say what it is,
        # so that it does not read as idle time nobody harvested.
        for before, after in itertools.pairwise(chosen):
            gap = after.start_ns - before.end_ns
            if gap <= 0:
                continue
            ax.axvspan(before.end_ns / 1e6, after.start_ns / 1e6, color="whitesmoke", zorder=0)
            if gap_label and gap > 0.06 * span_ms * 1e6:
                ax.text(
                    (before.end_ns + after.start_ns) / 2e6,
                    (len(rows) - 1) / 2,
                    "\n".join(textwrap.wrap(gap_label, 14)),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="dimgrey",
                    clip_on=True,
                )

        cmap = [
            "tab:orange",
            "tab:green",
            "tab:red",
            "tab:purple",
            "tab:brown",
            "tab:pink",
            "tab:olive",
            "tab:cyan",
        ]
        for k, tid in enumerate(names):
            row = rows[2 + k]
            side = bars((x.start_ns, x.end_ns) for x in self.launches if x.task_id == tid)
            ax.broken_barh(
                side,
                (y[row] - height / 2, height),
                facecolors=cmap[k % len(cmap)],
                edgecolor="none",
            )

        ax.set_yticks([y[r] for r in rows], rows, fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.1)
        pad = 0.01 * span_ms
        ax.set_xlim(lo / 1e6 - pad, hi / 1e6 + pad)
        ax.set_xlabel("time since recording start (ms)")
        ax.grid(axis="x", linewidth=0.3)
        return fig

    def _timeline_title(self, shown: Sequence[Iteration]) -> str:
        """Totals over every recorded iteration, and which of them the timeline shows."""
        n = len(self.iterations)
        head = (
            f"{self._where()}: {n} iteration{'s' if n != 1 else ''} recorded, "
            f"bubble fraction {100 * self.bubble_fraction:.1f}%, "
            f"harvested {_fmt_ns(self.harvested_ns)} "
            f"({_pct(self.harvested_ns, self.bubble_ns):.1f}% of bubble time)"
        )
        if not shown:
            return head
        indices = [it.index for it in shown]
        if len(indices) == 1:
            which = f"iteration {indices[0]}"
        elif indices == list(range(indices[0], indices[-1] + 1)):
            which = f"iterations {indices[0]}-{indices[-1]}"
        else:
            which = "iterations " + ", ".join(str(i) for i in indices)
        return f"{head}\nshown: {which} ({len(shown)} of {n})"


# --------------------------------------------------------------------------- helpers


def _lane_names(names: dict[int, str]) -> dict[int, str]:
    """task_id -> a timeline row name: the task's class (the repr up to its arguments,
    which may be long), with the task id where two tasks share a class."""
    short = {tid: name.split("(", 1)[0].strip() or name for tid, name in names.items()}
    counts: dict[str, int] = {}
    for name in short.values():
        counts[name] = counts.get(name, 0) + 1
    return {
        tid: f"{name} #{tid}" if counts[name] > 1 else _short(name, 32)
        for tid, name in short.items()
    }


def _table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """Rows aligned in columns (indented 4), `right` holding the right-aligned ones."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(r, widths))
        ]
        out.append("    " + "  ".join(cells).rstrip())
    return out


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


def _write_json(path: str | os.PathLike[str], obj: Any) -> None:
    # dumps + one write: json.dump's many small writes are several times slower on traces
    # with tens of thousands of events.
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _rank_pids(reports: Sequence[Report], used: set[Any], base: int = 0) -> list[int]:
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


def merge_chrome_traces(reports: Sequence[Report], path: str | os.PathLike[str]) -> None:
    """Write one Chrome trace holding several ranks' reports, one process per rank
    (pid = rank, named "rank N"); a report without a rank takes its position in
    `reports`, or the next free pid when that is taken.

    Each rank's times are on its own recording's timeline, so alignment across ranks is
    only as good as the recordings' common start.
    """
    events: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for rep, pid in zip(reports, _rank_pids(reports, set())):
        name = f"rank {rep.rank}" if rep.rank is not None else f"rank ? ({rep.device})"
        events += rep._trace_events(pid, name)
        ranks.append({"pid": pid, **rep._trace_metadata()})
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {"freeride": _FORMAT, "ranks": ranks},
    }
    _write_json(path, trace)


# Where freeride's processes go in a merged torch.profiler trace: far from real pids
# (and from the device indices kineto uses as pids of GPU tracks).
_PROFILER_PID_BASE = 1 << 30


def merge_with_profiler_trace(
    reports: Report | Sequence[Report],
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
    comes from a probe event on an idle stream (recorder.py, _gpu_mark_unix_ns). Pass
    `clock_origin_unix_ns` for reports without one (one made by hand, or whose probe
    was not reached), else they are refused with ValueError.
    """
    reps = [reports] if isinstance(reports, Report) else list(reports)
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
        events += rep._trace_events(pid, name, shift_ns=origin - base_ns)
        ranks.append({"pid": pid, "clock_origin_unix_ns": origin, **rep._trace_metadata()})
    trace["freeride"] = {"format": _FORMAT, "ranks": ranks}
    _write_json(path, trace)
