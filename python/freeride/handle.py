"""Handle, the protocol of every view of a submitted side task, and TaskHandle, the view
of one item task."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from ._C import ERROR_MEMORY_BUDGET, Executor
from ._checks import check_bool, check_timeout
from .errors import MemoryBudgetError, TaskCancelledError, TaskFailedError

FINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled"})
"""The states a task never leaves: every handle's `state` ends in one of them, and
`done()` is ``state in FINAL_STATES``."""


@runtime_checkable
class Handle(Protocol):
    """What every handle of a submitted side task offers, whichever submitted it:
    fr.TaskHandle (an item task, from Harvester.submit), fr.IterativeHandle (an
    fr.IterativeTask, from Harvester.submit) and fr.RemoteHandle (a task placed by the
    job-wide queue, from JobQueue.submit or JobClient.submit). Annotate with it code that
    takes any of them::

        def watch(handle: fr.Handle) -> None: ...

    ``isinstance(x, fr.Handle)`` checks only that the members exist. States: 'queued',
    'running', 'paused' (started, not finished, no item executing now), then one of
    FINAL_STATES ('done', 'failed', 'cancelled'), never left. A task's error is read
    through result(), which raises it. Members that only some handles have: `task` (the
    task object; TaskHandle, IterativeHandle), `spec` and `rank` (RemoteHandle), `phase`
    and `launches` (TaskHandle), `overruns` (TaskHandle, IterativeHandle)."""

    @property
    def id(self) -> int | str:
        """The task's id: an int for a local task (TaskHandle, IterativeHandle, in one id
        space), a "<rank>:<n>" or "c<client>:<n>" string for a RemoteHandle."""
        ...

    @property
    def state(self) -> str:
        """'queued', 'running', 'paused', 'done', 'failed' or 'cancelled'."""
        ...

    @property
    def items_done(self) -> int:
        """Items finished so far (steps, for an iterative task)."""
        ...

    @property
    def items_total(self) -> int | None:
        """Items of the task; None while unknown (an iterative task without total_steps,
        a remote task before its rank reports it). Always an int on a TaskHandle."""
        ...

    @property
    def progress(self) -> float:
        """items_done / items_total, from 0.0 to 1.0 (1.0 once done; 0.0 while the total
        is unknown)."""
        ...

    def done(self) -> bool:
        """True once the task is final (its state is in FINAL_STATES)."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the task is final or `timeout` seconds passed (None: no limit);
        True if final."""
        ...

    def result(self, timeout: float | None = None) -> Any:
        """Waits for the task (TimeoutError after `timeout` seconds) and returns its
        result; raises its error: TaskFailedError (RankLostError for a remote task whose
        rank was lost), MemoryBudgetError, or TaskCancelledError."""
        ...

    def cancel(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Starts no further item (or step) of the task; items already claimed finish
        (none is lost or repeated). Safe on a final task.

        `wait`: return once the task is final, so `items_done` no longer changes (False:
        return at once). `timeout`: the most seconds to wait for that; None waits without
        a limit, except on a RemoteHandle, whose default is 30 s (the queue may be gone).

        Returns a bool. TaskHandle and IterativeHandle: True if this call cancelled the
        task (and, with `wait`, it became final within `timeout`); False if it was already
        final (or did not become final in time). RemoteHandle: whether the task is final
        now (with `wait`: it became final within `timeout`), so True for a task already
        final. Read state for what happened."""
        ...


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
    """A submitted item task; follows the Handle protocol (fr.Handle). States: 'queued',
    'running', 'paused', 'done', 'failed', 'cancelled'. 'paused' means started, not
    finished, and no item executing now (the gate is closed or a more urgent task runs)."""

    def __init__(self, executor: Executor, task_id: int, task: Any, built: Any) -> None:
        self._ex = executor
        self._id = task_id
        self.task = task
        self._built = built  # keeps the task's buffers alive while the core uses them
        self._final_status: _Status | None = None

    def _status(self) -> _Status:
        if self._final_status is not None:
            return self._final_status
        status = _Status._make(self._ex.status(self._id))
        if status.state in FINAL_STATES:
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
        return self.state in FINAL_STATES

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the task is final or `timeout` seconds passed; True if final.
        Releases the GIL while it waits."""
        timeout = check_timeout(timeout)
        return self._ex.wait(self._id, -1.0 if timeout is None else timeout)

    def result(self, timeout: float | None = None) -> Any:
        """Waits for the task and returns its result; re-raises its error
        (TaskFailedError, MemoryBudgetError) or raises TaskCancelledError."""
        if not self.wait(timeout):
            raise TimeoutError(f"task {self._id} did not finish within {timeout} s")
        status = self._status()
        if status.state == "done":
            return self._built.result()
        if status.error_kind == ERROR_MEMORY_BUDGET:
            raise MemoryBudgetError(status.error)
        if status.state == "cancelled":
            raise TaskCancelledError(f"task {self._id} ({self.task!r}) was {status.error}")
        raise TaskFailedError(status.error)

    def cancel(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Starts no further item of the task; items already claimed finish (none is lost
        or repeated). With `wait`, returns once no item of it executes any more, so
        `items_done` is final (with ``stream_wait=True`` a launch held by a closed gate
        ends only when the gate opens: pass ``wait=False`` or a `timeout` not to block on
        it). On CUDA that does not wait for the GPU to reach the bubbles the host queued
        launches for ahead of it: those that have not begun claim nothing, and the
        harvester keeps the task's memory until they have ended. False if the task was
        already final, or with `wait` not final within `timeout` seconds (None: no
        limit). See Handle.cancel."""
        wait = check_bool(wait, "wait")
        timeout = check_timeout(timeout)
        cancelled = self._ex.cancel(self._id, False)
        if cancelled and wait:
            # What the core's cancel(id, wait=True) does, with a limit: the task is final
            # once the launch running its claimed items exits.
            return self.wait(timeout)
        return cancelled

    def __repr__(self) -> str:
        state, done, total = self._status()[:3]  # a NamedTuple slices as a tuple
        return (
            f"TaskHandle(id={self._id}, task={self.task!r}, state={state!r}, items={done}/{total})"
        )
