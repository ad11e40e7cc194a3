"""A report's timeline figure (behind `Report.timeline` and `Report.plot`): rows for
compute, bubbles and each side task over a few recorded iterations. Needs matplotlib,
imported only when a figure is drawn."""

from __future__ import annotations

import itertools
import os
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ._format import fmt_ns, pct, where
from .model import Iteration, SideLaunch

__all__ = ["timeline_figure", "write_timeline_png"]
_HEIGHT = 0.7  # of a bar, in rows
_SIDE_COLOURS = (
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
)


class _ReportView(Protocol):
    """What the timeline reads of a Report; report.py imports this module, so it cannot
    import Report back."""

    device: str
    backend: str
    rank: int | None
    iterations: list[Iteration]
    launches: list[SideLaunch]

    @property
    def task_names(self) -> dict[int, str]: ...

    @property
    def bubble_ns(self) -> int: ...

    @property
    def bubble_fraction(self) -> float: ...

    @property
    def harvested_ns(self) -> int: ...


def write_timeline_png(
    report: _ReportView,
    path: str | os.PathLike[str],
    iterations: Sequence[int] | None,
    gap_label: str | None,
) -> None:
    fig = timeline_figure(report, iterations, gap_label)
    fig.savefig(os.fspath(path), format="png", dpi=110)


def timeline_figure(
    report: _ReportView, iterations: Sequence[int] | None, gap_label: str | None
) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("Report.plot needs matplotlib: pip install matplotlib") from e

    chosen = _chosen(report.iterations, iterations)
    names = report.task_names
    lanes = _lane_names(names)
    rows = ["compute", "bubbles"] + [f"side: {lanes[tid]}" for tid in names]
    fig = Figure(figsize=(12, max(3.0, 1.6 + 0.55 * len(rows))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(_title(report, chosen), fontsize=10)
    if not chosen:
        ax.text(0.5, 0.5, "no iterations recorded", ha="center", va="center")
        ax.set_axis_off()
        return fig

    lo = min(it.start_ns for it in chosen)
    hi = max(it.end_ns for it in chosen)
    y = {name: len(rows) - 1 - i for i, name in enumerate(rows)}  # first row on top
    _draw_iterations(ax, chosen, y, len(rows) - 0.35, lo, hi)
    _draw_gaps(ax, chosen, gap_label, (len(rows) - 1) / 2, lo, hi)
    for k, tid in enumerate(names):
        side = _bars(((x.start_ns, x.end_ns) for x in report.launches if x.task_id == tid), lo, hi)
        ax.broken_barh(
            side,
            (y[rows[2 + k]] - _HEIGHT / 2, _HEIGHT),
            facecolors=_SIDE_COLOURS[k % len(_SIDE_COLOURS)],
            edgecolor="none",
        )

    ax.set_yticks([y[r] for r in rows], rows, fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.1)
    pad = 0.01 * _span_ms(lo, hi)
    ax.set_xlim(lo / 1e6 - pad, hi / 1e6 + pad)
    ax.set_xlabel("time since recording start (ms)")
    ax.grid(axis="x", linewidth=0.3)
    return fig


def _chosen(recorded: list[Iteration], indices: Sequence[int] | None) -> list[Iteration]:
    """The iterations to show, in time order: those with the given indices, by default the
    last (up to) 3."""
    if indices is None:
        return recorded[-3:]
    by_index = {it.index: it for it in recorded}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise ValueError(
            f"no recorded iteration with index {missing}; "
            f"recorded: {sorted(by_index)[:10]}{'...' if len(by_index) > 10 else ''}"
        )
    return sorted((by_index[i] for i in indices), key=lambda it: it.start_ns)


def _draw_iterations(
    ax: Any, chosen: list[Iteration], y: dict[str, int], label_y: float, lo: int, hi: int
) -> None:
    """The compute and bubble rows, and a line at each iteration's start, named at
    height `label_y`."""
    span_ms = _span_ms(lo, hi)
    for it in chosen:
        comp = _bars(((c.start_ns, c.end_ns) for c in it.compute), lo, hi)
        ax.broken_barh(
            comp, (y["compute"] - _HEIGHT / 2, _HEIGHT), facecolors="tab:blue", edgecolor="white"
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
        bub = _bars(((b.start_ns, b.end_ns) for b in it.bubbles), lo, hi)
        ax.broken_barh(
            bub,
            (y["bubbles"] - _HEIGHT / 2, _HEIGHT),
            facecolors="lightgrey",
            edgecolor="grey",
            linewidth=0.5,
        )
        ax.axvline(it.start_ns / 1e6, color="black", linestyle="--", linewidth=0.8)
        ax.text(
            it.start_ns / 1e6,
            label_y,
            f" iter {it.index}",
            fontsize=8,
            va="bottom",
            ha="left",
        )
    ax.axvline(hi / 1e6, color="black", linestyle="--", linewidth=0.8)


def _draw_gaps(
    ax: Any, chosen: list[Iteration], gap_label: str | None, y_mid: float, lo: int, hi: int
) -> None:
    """Time between two shown iterations belongs to none: shade it and say what it is, so
    that it does not read as idle time nobody harvested."""
    span_ms = _span_ms(lo, hi)
    for before, after in itertools.pairwise(chosen):
        gap = after.start_ns - before.end_ns
        if gap <= 0:
            continue
        ax.axvspan(before.end_ns / 1e6, after.start_ns / 1e6, color="whitesmoke", zorder=0)
        if gap_label and gap > 0.06 * span_ms * 1e6:
            ax.text(
                (before.end_ns + after.start_ns) / 2e6,
                y_mid,
                "\n".join(textwrap.wrap(gap_label, 14)),
                ha="center",
                va="center",
                fontsize=8,
                color="dimgrey",
                clip_on=True,
            )


def _bars(items: Iterable[tuple[int, int]], lo: int, hi: int) -> list[tuple[float, float]]:
    """(start, width) in ms of each interval's part inside [lo, hi), for broken_barh."""
    out = []
    for s, e in items:
        s, e = max(s, lo), min(e, hi)
        if e > s:
            out.append((s / 1e6, (e - s) / 1e6))
    return out


def _span_ms(lo: int, hi: int) -> float:
    return max(hi - lo, 1) / 1e6


def _title(report: _ReportView, shown: Sequence[Iteration]) -> str:
    """Totals over every recorded iteration, and which of them the timeline shows."""
    n = len(report.iterations)
    head = (
        f"{where(report.device, report.backend, report.rank)}: "
        f"{n} iteration{'s' if n != 1 else ''} recorded, "
        f"bubble fraction {100 * report.bubble_fraction:.1f}%, "
        f"harvested {fmt_ns(report.harvested_ns)} "
        f"({pct(report.harvested_ns, report.bubble_ns):.1f}% of bubble time)"
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


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
