"""The bubble record's data model: what a Harvester records per training iteration.

Times are integers in nanoseconds since the start of the recording, taken from the
training stream's own timeline (CUDA events on a GPU; the steady clock on the host
backend, whose compute is synchronous).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Compute:
    """One compute action (forward, backward, backward-input, backward-weight, loss,
    optimizer step) on this rank."""

    start_ns: int
    end_ns: int
    label: str  # e.g. "F s1 mb3", "B s0 mb2", "W s1 mb0", "loss s3 mb1", "optimizer"


@dataclass
class Bubble:
    """The gap between two compute actions of one iteration (or between the iteration's
    start and its first action, or its last action and its end)."""

    iteration: int
    slot: int  # k: the k-th bubble of the iteration, counted from 0
    start_ns: int
    end_ns: int
    # Bytes free on the device when the bubble began: read at one bubble per iteration,
    # the slots in turn (None on the others, and on the host backend).
    free_memory: int | None = None
    # Side work that ran inside this bubble: task id -> (items, nanoseconds), items
    # pro-rated by how much of each launch overlaps the bubble.
    side: dict[int, tuple[float, int]] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Iteration:
    """One schedule.step() (or one `with h.iteration():` block)."""

    index: int
    start_ns: int
    end_ns: int
    compute: list[Compute] = field(default_factory=list)
    bubbles: list[Bubble] = field(default_factory=list)
    # Host time the training thread spent in freeride's hooks during this iteration.
    hook_ns: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class SideLaunch:
    """One preemptible launch of a side task (or one step of an iterative task)."""

    task_id: int
    task: str  # the task's repr, e.g. "Spin(items=..., ...)"
    phase: int
    start_ns: int
    end_ns: int
    items: int


@dataclass
class TaskSummary:
    """A side task's totals at the time of the report."""

    task_id: int
    task: str
    state: str
    items_done: int
    items_total: int | None
    overruns: int = 0  # iterative tasks: steps that did not fit their bubble
