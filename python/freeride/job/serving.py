"""Serving: the thread behind each of the job queue's serving loops (a rank's agent, the
coordinator, an outside client's reader)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._C import _relax_capture_mode

log = logging.getLogger("freeride.job")


class Serving:
    """A daemon thread that calls `step()` until stopped: again at once while a step was
    busy, else after a pause that doubles from 1 ms up to `max_idle`. A step that raises
    is logged (the first time) and the thread keeps serving: one fault, one malformed
    message or one store hiccup never ends it. With `cuda` (a rank whose harvester is on a
    GPU), the thread puts itself into relaxed CUDA graph capture mode first."""

    def __init__(
        self,
        name: str,
        step: Callable[[], bool] | None = None,
        max_idle: float = 0.01,
        cuda: bool = False,
    ) -> None:
        if step is not None:
            self.step = step  # type: ignore[method-assign]
        self._cuda = cuda
        self._max_idle = max_idle
        self._stop = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def step(self) -> bool:
        """One round of work; True if there was some (a message handled)."""
        raise NotImplementedError

    def idle(self, seconds: float) -> None:
        """Waits after a step with nothing to do: `seconds`, or less where a subclass
        knows work has come."""
        time.sleep(seconds)

    def start(self) -> None:
        self._thread.start()

    def halt(self) -> None:
        """Asks the thread to end after its current step, without waiting for it."""
        self._stop.set()

    def stop(self, timeout: float | None = None) -> None:
        """Ends the thread and joins it (unless called from it)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Waits for the thread to end by itself; True once it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _serve(self) -> None:
        if self._cuda:
            # Steps reach CUDA (bubble stats read event timings; building and submitting a
            # task allocates and records events) while training may be capturing a CUDA
            # graph on its own thread: in the default (global) capture mode any of those
            # calls from this thread would invalidate that capture.
            _relax_capture_mode()
        idle = 0.001
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception:
                self._failures += 1
                if self._failures == 1:
                    log.exception("freeride job queue: %s: a step failed", self._thread.name)
                busy = False
                idle = self._max_idle
            if busy:
                idle = 0.001
                continue
            self.idle(idle)
            idle = min(idle * 2, self._max_idle)
