"""The report a Harvester hands back: the bubble record plus what side work did in it.

A `Report` holds the raw record (iterations with their compute actions and bubbles, the
side launches, the tasks' totals) and derives every number from it, so a report gathered
from another rank (`to_dict` / `from_dict`, or pickled by
``torch.distributed.gather_object``) answers the same questions as a local one. It renders
as a text table (`summary`), a Chrome/Perfetto trace (`to_chrome_trace`; trace.py also
writes `merge_chrome_traces` and `merge_with_profiler_trace`) and a PNG timeline (`plot`,
drawn by plot.py).

All times are integer nanoseconds on the recording's own timeline (see `record/model.py`).
"""

from __future__ import annotations

import os
import warnings
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..handle import FINAL_STATES
from ._format import FORMAT, fmt_ns, jsonable, pct, where
from .model import Bubble, Compute, Iteration, SideLaunch, TaskSummary
from .plot import timeline_figure, write_timeline_png
from .trace import merge_chrome_traces, merge_with_profiler_trace, write_chrome_trace

__all__ = ["Report", "merge_chrome_traces", "merge_with_profiler_trace"]


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


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


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


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Construct a record.model dataclass from a dict, ignoring keys it does not know, so
    that a report written by a newer version with extra fields still loads. Its integer
    fields must be integers, and an interval must not end before it starts: either would
    load and fail later, far from the bad value (a total, a trace)."""
    known = {f.name: f for f in fields(cls)}
    kept = {k: v for k, v in data.items() if k in known}
    for name, value in kept.items():
        if known[name].type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{cls.__name__}.{name} must be an int, got {value!r}")
    if kept.get("end_ns", 0) < kept.get("start_ns", 0):
        raise ValueError(
            f"{cls.__name__} ends before it starts: start_ns {kept['start_ns']}, "
            f"end_ns {kept['end_ns']}"
        )
    return cls(**kept)


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
    # The Unix time in ns of the record's time 0, the clock of torch.profiler's traces
    # (profiling.py): the host backend's steady clock, or on a GPU the clock anchor's
    # answer for the first iteration's origin (or a probe's, where the anchor gave none);
    # None where neither answered in time, or no report waited for the answer yet.
    clock_origin_unix_ns: int | None = None
    # Harvester.launch_counts() when the report was taken: side launches, those that ran
    # no item, and those of each enqueued at opens (empty in a report without them).
    launch_counts: dict[str, int] = field(default_factory=dict)

    def _compute_intervals(self) -> list[tuple[int, int]]:
        return _merge((c.start_ns, c.end_ns) for it in self.iterations for c in it.compute)

    def _bubble_intervals(self) -> list[tuple[int, int]]:
        return _merge((b.start_ns, b.end_ns) for it in self.iterations for b in it.bubbles)

    def _launch_intervals(self) -> list[tuple[int, int]]:
        return _merge((x.start_ns, x.end_ns) for x in self.launches)

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
        elif not self.launches and all(s in FINAL_STATES for s in states):
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
                f"{len(durations)} bubbles: median {fmt_ns(durations[len(durations) // 2])},"
                f" longest {fmt_ns(durations[-1])} (a side launch needs tens of"
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

    def summary(self) -> str:
        """A readable, aligned text table of the report's totals, tasks and bubble slots."""
        total, bubble, harvested = self.total_ns, self.bubble_ns, self.harvested_ns
        n = len(self.iterations)
        rows = [
            ("device", where(self.device, self.backend, self.rank)),
            ("iterations", str(n)),
            (
                "total time",
                f"{fmt_ns(total)}" + (f" ({fmt_ns(total / n)} per iteration)" if n else ""),
            ),
            ("compute time", fmt_ns(self.compute_ns)),
            ("bubble time", fmt_ns(bubble)),
            ("bubble fraction", f"{100 * self.bubble_fraction:.1f}%"),
            ("harvested", f"{fmt_ns(harvested)} ({pct(harvested, bubble):.1f}% of bubble time)"),
            ("side outside bubbles", fmt_ns(self.side_ns_outside_bubbles)),
            ("overruns", str(self.overruns)),
            *self._launch_count_rows(),
            ("time in hooks", fmt_ns(self.hook_ns)),
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
                        fmt_ns(per_task.get(tid, 0)),
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
                        fmt_ns(s["mean_ns"]),
                        fmt_ns(s["min_ns"]),
                        fmt_ns(s["max_ns"]),
                        _fmt_bytes(s["mean_free_memory"]),
                    )
                )
            lines.append("  bubbles by slot")
            lines += _table(table, right={0, 1, 2, 3, 4, 5})
            if len(slots) > len(shown):
                lines.append(f"    ... {len(slots) - len(shown)} more slots")
        return "\n".join(lines)

    def _launch_count_rows(self) -> list[tuple[str, str]]:
        counts = self.launch_counts
        if not counts:
            return []
        launches, idle = counts.get("launches", 0), counts.get("idle", 0)
        at_opens, idle_at_opens = counts.get("at_opens", 0), counts.get("idle_at_opens", 0)
        text = f"{launches:,} ({at_opens:,} at opens), {idle:,} ran no item ({idle_at_opens:,})"
        skipped = counts.get("skipped_at_opens", 0)
        if skipped:
            text += f"; {skipped:,} opens left without, behind another stream's open"
        ahead = counts.get("max_lookahead", 0)
        if ahead:
            text += f"; up to {ahead:,} queued ahead of the GPU"
        beyond = counts.get("beyond_lookahead", 0)
        if beyond:
            text += f"; {beyond:,} opens left without, past the lookahead bound"
        served = counts.get("served_by_executor", 0)
        if served:
            text += f"; {served:,} launches at opens left out, the executor's there first"
        return [("side launches", text)]

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        # The dataclass repr would print every interval of a long run.
        return (
            f"Report(device={self.device!r}, backend={self.backend!r}, rank={self.rank!r}, "
            f"iterations={len(self.iterations)}, launches={len(self.launches)}, "
            f"tasks={len(self.tasks)}, bubble_fraction={self.bubble_fraction:.3f})"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict holding the whole record plus ``totals``.

        Dict keys that are task ids are written as str (JSON objects only have string
        keys); `from_dict` turns them back into ints.
        """
        return {
            "format": FORMAT,
            "device": self.device,
            "backend": self.backend,
            "rank": self.rank,
            "settings": jsonable(self.settings),
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
            "placement": jsonable(self.placement),
            "clock_origin_unix_ns": self.clock_origin_unix_ns,
            "launch_counts": dict(self.launch_counts),
            "totals": self.totals(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """The report `to_dict` wrote (also after a JSON round trip); ``totals`` is ignored
        since every total is recomputed from the record. ValueError where `d` is not one."""
        if not isinstance(d, Mapping):
            raise TypeError(f"d must be the dict Report.to_dict wrote, got {type(d).__name__}")
        if d.get("format", FORMAT) != FORMAT:
            raise ValueError(f"d is of format {d['format']!r}; this version reads {FORMAT!r}")
        try:
            return cls._from_dict(d)
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(
                f"d is not a report Report.to_dict wrote: {type(exc).__name__}: {exc}"
            ) from exc

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> Report:
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
            launch_counts={k: int(v) for k, v in (d.get("launch_counts") or {}).items()},
        )

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the record as Chrome trace event JSON, for ui.perfetto.dev or
        chrome://tracing: tracks "iterations", "training compute", "bubbles" and one
        "side: <task>" per task, all as complete ("X") events in microseconds."""
        write_chrome_trace(self, path)

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
        write_timeline_png(self, path, iterations, gap_label)

    def timeline(
        self, iterations: Sequence[int] | None = None, *, gap_label: str | None = "not recorded"
    ) -> Any:
        """The matplotlib Figure that `plot` writes (same arguments), for notebooks and
        for drawing on further."""
        return timeline_figure(self, iterations, gap_label)
