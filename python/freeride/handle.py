"""TaskHandle: the user's view of one submitted side task."""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _C
from .errors import MemoryBudgetError, TaskCancelledError, TaskFailedError


class _Status(NamedTuple):
    """Executor.status(id), field by field."""

    state: str
    items_done: int
    items_total: int
    phase: int
    launches: int
    error_kind: int  # _C.ERROR_* (freeride::ErrorKind), 0 for none
    error: str


class TaskHandle:
    """A submitted side task. States: 'queued', 'running', 'paused', 'done', 'failed',
    'cancelled'. 'paused' means started, not finished, and no item executing now (the
    gate is closed or a more urgent task runs)."""

    def __init__(self, executor: _C.Executor, task_id: int, task: Any, built: Any) -> None:
        self._ex = executor
        self._id = task_id
        self.task = task
        self._built = built  # keeps the task's buffers alive while the core uses them
        self._final_status: _Status | None = None

    def _status(self) -> _Status:
        if self._final_status is not None:
            return self._final_status
        status = _Status._make(self._ex.status(self._id))
        if status.state in ("done", "failed", "cancelled"):
            self._final_status = status
        return status

    @property
    def id(self) -> int:
        """The executor's id of this task."""
        return self._id

    @property
    def state(self) -> str:
        """One of 'queued', 'running', 'paused', 'done', 'failed', 'cancelled'."""
        return self._status().state

    @property
    def items_done(self) -> int:
        """Items finished so far over all phases; read without stopping the GPU."""
        return self._status().items_done

    @property
    def items_total(self) -> int:
        """Items of all phases together."""
        return self._status().items_total

    @property
    def progress(self) -> float:
        """items_done / items_total, from 0.0 to 1.0."""
        status = self._status()
        return status.items_done / status.items_total if status.items_total else 1.0

    @property
    def phase(self) -> int:
        """Index of the phase running now (the last one once done)."""
        return self._status().phase

    @property
    def overruns(self) -> int:
        """Steps that did not fit their bubble (iterative tasks); 0 for item tasks."""
        return 0

    @property
    def launches(self) -> int:
        """Preemptible launches so far: one more after every pause (on a GPU, also after
        every time slice)."""
        return self._status().launches

    def done(self) -> bool:
        """True once the task is final (done, failed or cancelled)."""
        return self.state in ("done", "failed", "cancelled")

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the task is final or `timeout` seconds passed; True if final.
        Releases the GIL while it waits."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be None or >= 0, got {timeout}")
        return self._ex.wait(self._id, -1.0 if timeout is None else float(timeout))

    def result(self, timeout: float | None = None) -> Any:
        """Waits for the task and returns its result; re-raises its error
        (TaskFailedError, MemoryBudgetError) or raises TaskCancelledError."""
        if not self.wait(timeout):
            raise TimeoutError(f"task {self._id} did not finish within {timeout} s")
        status = self._status()
        if status.state == "done":
            return self._built.result()
        if status.error_kind == _C.ERROR_MEMORY_BUDGET:
            raise MemoryBudgetError(status.error)
        if status.state == "cancelled":
            raise TaskCancelledError(f"task {self._id} ({self.task!r}) was {status.error}")
        raise TaskFailedError(status.error)

    def cancel(self, wait: bool = True) -> bool:
        """Starts no further item of the task; items already claimed finish (none is lost
        or repeated). With `wait`, returns once no item of it executes any more, so
        `items_done` is final (with ``stream_wait=True`` a launch held by a closed gate
        ends only when the gate opens: pass ``wait=False`` not to block on it). False if
        the task was already final."""
        return self._ex.cancel(self._id, bool(wait))

    def __repr__(self) -> str:
        state, done, total = self._status()[:3]  # a NamedTuple slices as a tuple
        return (
            f"TaskHandle(id={self._id}, task={self.task!r}, state={state!r}, items={done}/{total})"
        )
