"""What closing a harvester stops (its attachment, its iterative runner, its executor),
held apart from the Harvester so that its finalizer can hold it, and the deadlines of a
close: launches still in flight past them are abandoned and their memory kept."""

from __future__ import annotations

import threading
import warnings
from typing import Any

from . import _abandoned
from .attach import Attachment
from .handle import TaskHandle
from .iterative import IterativeRunner

# After an interrupt or a signal (_abort), how long close waits for an iterative task's
# step in flight before abandoning it (close() itself: iterative.CLOSE_TIMEOUT_S).
ABORT_STEP_TIMEOUT_S = 0.2
# How long close waits for side launches still in flight on the GPU (CUDA: launches
# queued ahead at opens end once the GPU reaches their bubbles) before it abandons them
# (their tasks cancelled, their memory kept until the GPU has passed them, a warning), so
# that a launch that never ends (an item that never returns, a training stream stalled by
# a peer that died) cannot hang close or the interpreter's exit. After an interrupt or a
# signal: ABORT_DEADLINE_S.
CLOSE_DEADLINE_S = 5.0
ABORT_DEADLINE_S = 0.5


class Parts:
    """What closing a harvester stops, held apart from the Harvester: its finalizer holds
    this, so a harvester dropped without close() is closed as soon as its last reference
    goes, instead of whenever the cyclic GC runs."""

    def __init__(self, executor: Any, live: dict[int, TaskHandle]) -> None:
        self.ex = executor
        self.live = live  # the harvester's tasks that are not final, by id
        self.iterative: IterativeRunner | None = None
        self.attachment: Attachment | None = None
        self.step_timeout: float | None = None  # None: the runner's CLOSE_TIMEOUT_S
        self.deadline = CLOSE_DEADLINE_S

    def detach(self) -> None:
        if self.attachment is not None:
            self.attachment.detach()
            self.attachment = None

    def close(self) -> None:
        self.detach()
        if self.iterative is not None:
            self.iterative.close(self.step_timeout)
        # At the interpreter's exit (the main thread has stopped: atexit and the
        # finalizers run) nothing is left to protect: the process and its CUDA context
        # end now, launches still queued on the GPU with them.
        exiting = not threading.main_thread().is_alive()
        try:
            # Every task is final once it returns; nothing runs any more but what it
            # abandoned.
            self.ex.close(0.0 if exiting else self.deadline)
        finally:
            self._keep_abandoned(warn=not exiting)

    def _keep_abandoned(self, warn: bool) -> None:
        # Abandoned tasks are never among those take_finished() names, so _reap() on
        # another thread cannot have let go of their handles since close() returned.
        abandoned = self.ex.take_abandoned()
        if abandoned or not _abandoned.passed(self.ex):
            handles = [self.live.get(task_id) for task_id in abandoned]
            _abandoned.keep(self.ex, [h for h in handles if h is not None])
        _abandoned.release_passed()
        if abandoned and warn:
            self._warn_abandoned(len(abandoned))

    def _warn_abandoned(self, count: int) -> None:
        warnings.warn(
            f"freeride: closing the harvester abandoned {count} side task(s) whose "
            f"launches were still enqueued or running on the GPU after {self.deadline} s "
            "(an item that never returns, or a training stream that stopped short of their "
            "bubbles): they are final (cancelled, or done where every item had run), and "
            "their memory is kept until the GPU has passed "
            "them (looked at whenever a harvester is made or closed), so that a launch still "
            "running never writes memory reused by training",
            RuntimeWarning,
            stacklevel=4,
        )
