"""RemoteHandle: the submitter's view of a task placed by the job queue."""

from __future__ import annotations

import pickle
import threading
from typing import Any, Protocol

from ..errors import RankLostError, TaskCancelledError, TaskFailedError
from ..handle import FINAL_STATES
from .messages import Update
from .placement import TaskSpec


class _Owner(Protocol):
    def _send_coord(self, message: tuple) -> None: ...


class RemoteHandle:
    """The submitter's view of a task placed by the job queue (on a rank or an outside
    client); follows the Handle protocol (fr.Handle)."""

    def __init__(self, owner: _Owner, task_id: str, spec: TaskSpec) -> None:
        self._owner = owner
        self._id = task_id
        self.spec = spec
        self._cv = threading.Condition()
        self._state = "queued"
        self._rank: int | None = None
        self._items_done = 0
        self._items_total: int | None = None
        self._error: str | None = None
        self._error_kind: str | None = None
        self._result: Any = None

    @property
    def id(self) -> str:
        """ "<submitting rank>:<n>" (or "c<client>:<n>"), unique in the job."""
        return self._id

    @property
    def state(self) -> str:
        """'queued' (not placed yet, or placed and not started), 'running', 'paused',
        'done', 'failed' or 'cancelled'."""
        with self._cv:
            return self._state

    @property
    def rank(self) -> int | None:
        """The rank the task was last placed on (None until placed)."""
        with self._cv:
            return self._rank

    @property
    def items_done(self) -> int:
        """Items (or steps) finished, as last reported by the running rank."""
        with self._cv:
            return self._items_done

    @property
    def items_total(self) -> int | None:
        """Items of the task (None until the running rank reports them)."""
        with self._cv:
            return self._items_total

    @property
    def progress(self) -> float:
        """items_done / items_total, from 0.0 to 1.0 (0.0 while unknown)."""
        with self._cv:
            if not self._items_total:
                return 1.0 if self._state == "done" else 0.0
            return min(1.0, self._items_done / self._items_total)

    def done(self) -> bool:
        """True once the task is final."""
        return self.state in FINAL_STATES

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the task is final (or `timeout` s passed); True if final."""
        with self._cv:
            return self._cv.wait_for(lambda: self._state in FINAL_STATES, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The task's result (see TaskSpec.result). Raises TaskFailedError naming the rank
        and the error, RankLostError when the rank running it (or the queue's leader) was
        lost, TaskCancelledError, or TimeoutError."""
        if not self.wait(timeout):
            raise TimeoutError(f"task {self._id} is not final after {timeout} s")
        with self._cv:
            if self._state == "failed":
                message = f"task {self._id} ({self.spec.label}): {self._error}"
                if self._error_kind == "rank_lost":
                    raise RankLostError(message, self._rank)
                raise TaskFailedError(message)
            if self._state == "cancelled":
                raise TaskCancelledError(
                    f"task {self._id} ({self.spec.label}) was {self._error or 'cancelled'}"
                )
            return self._result

    def cancel(self, wait: bool = True, timeout: float | None = 30.0) -> bool:
        """Stops the task wherever it runs: no further item starts there. With `wait`,
        returns once it is final (True) or `timeout` seconds passed (False; None: no
        limit); without, whether it is final already. True for a task already final. See
        Handle.cancel."""
        if not self.done():
            try:
                self._owner._send_coord(("cancel", self._id))
            except Exception:  # noqa: BLE001 - the queue is gone: nothing runs it any more
                self._final("cancelled", "cancelled (the job queue is gone)")
        return self.wait(timeout) if wait else self.done()

    def _update(
        self,
        state: str,
        rank: int | None,
        done: int,
        total: int | None,
        error: str | None,
        result: Any,
        error_kind: str | None = None,
    ) -> None:
        with self._cv:
            if self._state in FINAL_STATES:
                return
            self._state = state
            if rank is not None:
                self._rank = rank
            self._items_done = done
            self._items_total = total
            self._error = error
            self._error_kind = error_kind
            self._result = result
            self._cv.notify_all()

    def _apply(self, update: Update) -> None:
        """Applies an "update" message; a result that does not unpickle fails the task."""
        state, rank, done, total, error, kind, data = update
        result = None
        if data is not None:
            try:
                result = pickle.loads(data)
            except Exception:  # noqa: BLE001 - the result, not the reader, is broken
                state, error, kind = "failed", "its result could not be read back", "failed"
        self._update(state, rank, done, total, error, result, kind)

    def _final(
        self, state: str, error: str, error_kind: str | None = None, rank: int | None = None
    ) -> None:
        """Marks the task final here (the queue could not tell us)."""
        with self._cv:
            self._update(state, rank, self._items_done, self._items_total, error, None, error_kind)

    def __repr__(self) -> str:
        return f"RemoteHandle({self._id}, {self.spec.label}, {self.state}, rank={self.rank})"
