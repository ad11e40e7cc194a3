"""Iterative side tasks: PyTorch work made of step() calls that cannot stop mid-step.

A step is started only inside a bubble it is predicted to fit: the harvester learns the
length of each bubble slot of the schedule (the k-th bubble of an iteration) from the
bubble record, and each task's step time from its own steps. A gate opened by hand
(``with h.bubble():``, ``h.gate.open()``) has no learned length: steps start there
whenever it is open, as before any iteration was recorded. Steps run on one runner
thread per harvester; a step still running when the bubble closed counts as an overrun.

On a GPU, setup(), step() and teardown() run on the device's step stream (made by the
core at the device's least urgent priority and handed to no one else), not on the
executor's side stream: work queued there behind a persistent item kernel would start
only once the gate closed, i.e. during compute. A task's first GPU work is stream-ordered
after everything the submitting thread's current stream, and submit's `stream`, had
enqueued when it called submit() (e.g. producing the task's inputs). On the host backend
there are no streams.
"""

from __future__ import annotations

import contextlib
import heapq
import importlib
import itertools
import operator
import sys
import threading
import time
from typing import Any

from ._C import GATE_OPEN, _relax_capture_mode, step_stream
from ._checks import check_bool, check_count, check_timeout, parse_memory
from .errors import MemoryBudgetError, TaskCancelledError, TaskFailedError
from .gate import MANUAL_BUBBLE, Gate
from .record.recorder import Recorder

# Ids of iterative tasks, far from the executor's, so reports can mix both.
_IDS = itertools.count(1 << 40)
# A step must fit this many times its recent worst duration into what is left.
_MARGIN = 1.1
# The step-time estimate is the worst of the last few steps; the first step is left out
# (lazy allocation, optimizer state, autotuning make it slower than the rest).
_RECENT_STEPS = 3
# A task whose estimate fits no bubble is measured again at the start of the longest
# bubble once every this many such bubbles, instead of waiting forever.
_REMEASURE_EVERY = 8
# Longest sleep in the extension (GIL released) while waiting for a bubble, between
# checks for cancel, close and a more urgent task: what bounds how late they are noticed,
# and how late an open that rings nothing (a graph replay's) is noticed.
_WAIT_S = 2e-3
_WAIT_NS = int(_WAIT_S * 1e9)
# Whether an open seen after the gate was seen closed is a new bubble even when it carries
# the number of the bubble judged last (what a replayed CUDA graph writes). Tests turn it
# off to show the runner starving across replays without it.
_REOPEN_IS_NEW_BUBBLE = True
# How long close() waits for a running step before abandoning it.
CLOSE_TIMEOUT_S = 5.0


def _memory_bytes(task: Any) -> int:
    """The task's memory_bytes in bytes: an int or a size string such as "8GiB" (0 or None:
    none), checked as the harvester's memory_budget is (not truncated, not NaN)."""
    value = getattr(task, "memory_bytes", 0)
    if value is None:
        return 0
    if not isinstance(value, (bool, str)):
        with contextlib.suppress(TypeError):
            value = operator.index(value)  # numpy's integers too
    if type(value) is int and value == 0:
        return 0
    return parse_memory(value, f"{type(task).__name__}.memory_bytes")


class IterativeTask:
    """Base class of side work made of Python steps (e.g. one optimizer step of a small
    model per step()). Override step() and usually setup(), finished(), teardown() and
    result(). `memory_bytes` is charged to the harvester's memory budget; `total_steps`
    (if known) gives progress."""

    memory_bytes: int = 0
    total_steps: int | None = None

    def setup(self) -> None:
        """Called once before the first step (allocate, load); on a GPU, on the step
        stream, after the work the caller had enqueued (on its current stream and
        submit's `stream`) when it submitted the task."""

    def step(self) -> None:
        """One unit of work; must not block on the training (it runs in its bubbles)."""
        raise NotImplementedError

    def finished(self) -> bool:
        """True once no more steps are needed."""
        return False

    def teardown(self) -> None:
        """Called once at the end, also after a failure or a cancel (free memory)."""

    def result(self) -> Any:
        """What the handle's result() returns once the task is done."""
        return None


class IterativeHandle:
    """Handle of a submitted IterativeTask; follows the Handle protocol (fr.Handle), as
    TaskHandle does, where an item is one step."""

    def __init__(self, runner: IterativeRunner, task: IterativeTask, priority: int) -> None:
        self._runner = runner
        self.task = task
        self.priority = priority
        self._id = next(_IDS)
        self._state = "queued"
        self._steps = 0
        self._overruns = 0
        self._error: BaseException | None = None
        self._cancel = False
        self._set_up = False
        self._need = 0  # its memory_bytes, read and checked once at submit
        self._reserved = 0
        self._step_ns: list[int] = []
        self._warmup_ns: int | None = None
        self._starved = 0
        # CUDA events recorded at submit on the streams the task follows (the current
        # stream and submit's `stream`); the step stream waits for them before setup().
        self._ready: list[Any] = []
        self._done = threading.Event()

    @property
    def id(self) -> int:
        """This task's id (shared id space with item tasks in reports)."""
        return self._id

    @property
    def state(self) -> str:
        """'queued', 'running' (a step executes), 'paused' (waiting for a bubble that
        fits), 'done', 'failed' or 'cancelled'."""
        return self._state

    @property
    def items_done(self) -> int:
        """Steps finished."""
        return self._steps

    @property
    def items_total(self) -> int | None:
        """The task's total_steps, if it declares one."""
        return self.task.total_steps

    @property
    def progress(self) -> float:
        """Steps done over total_steps (1.0 once done; 0.0 while unknown)."""
        if self._state == "done":
            return 1.0
        total = self.task.total_steps
        return min(1.0, self._steps / total) if total else 0.0

    @property
    def overruns(self) -> int:
        """Steps still running when their bubble closed."""
        return self._overruns

    @property
    def step_ns(self) -> int | None:
        """The step time the scheduler plans with (recent worst), once measured."""
        return max(self._step_ns[-_RECENT_STEPS:]) if self._step_ns else None

    def done(self) -> bool:
        """True once the task is final."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the task is final or `timeout` seconds passed; True if final."""
        timeout = check_timeout(timeout)
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """Waits and returns task.result(); re-raises the task's error as
        TaskFailedError (with the original as __cause__), or raises TaskCancelledError."""
        if not self.wait(timeout):
            raise TimeoutError(f"task {self._id} did not finish within {timeout} s")
        if self._state == "done":
            return self.task.result()
        if isinstance(self._error, MemoryBudgetError):
            raise self._error
        if self._state == "cancelled":
            raise TaskCancelledError(f"task {self._id} ({self.task!r}) was cancelled")
        raise TaskFailedError(f"{self.task!r} failed: {self._error!r}") from self._error

    def cancel(self, wait: bool = True, timeout: float | None = None) -> bool:
        """No further step starts; with `wait`, returns once a running step finished and
        the task is final, or `timeout` seconds passed (None: no limit). False if the task
        was already final, or with `wait` not final within `timeout`. See Handle.cancel."""
        wait = check_bool(wait, "wait")
        timeout = check_timeout(timeout)
        if self.done():
            return False
        self._runner.cancel(self)
        return self._done.wait(timeout) if wait else True

    def __repr__(self) -> str:
        return f"IterativeHandle(id={self._id}, task={self.task!r}, state={self._state!r}, steps={self._steps})"


class IterativeRunner:
    """One thread per harvester that runs iterative tasks' steps in fitting bubbles."""

    def __init__(
        self, executor: Any, gate: Gate, recorder: Recorder, kind: str, device: int
    ) -> None:
        # Not the harvester: this runner's thread would keep it alive until close().
        self._ex = executor
        self._gate = gate
        self._recorder = recorder
        self._kind = kind
        self._device = device
        self._lock = threading.Condition()
        self._queue: list[tuple[int, int, IterativeHandle]] = []
        self._seq = itertools.count()
        self._closing = False
        self._reserved = 0
        # The bubble (gate sequence number) this thread last looked at, and when it opened
        # as far as this thread can tell: a second step in it has only what is left of it.
        self._bubble_seq: int | None = None
        self._bubble_seen_ns = 0
        # When this thread last saw the gate closed, since that bubble opened (None: it has
        # not): the next open is another bubble, whatever its number. Replays of a captured
        # CUDA graph write the numbers of capture time again, so a number alone cannot
        # tell bubbles apart.
        self._closed_seen_ns: int | None = None
        # Only where opens ring (the open watcher, the host backend) does a wait for one
        # end at the open; FREERIDE_ADMISSION=poll polls the mirror in the extension.
        self._rings = executor.admission != "poll"
        # Set here when torch is already loaded, else by the runner's thread before the
        # first setup(); only that thread writes it afterwards.
        self._stream: Any = None
        torch = self._torch()
        if torch is not None and torch.cuda.is_available():
            self._stream = self._new_stream(torch)
        self._thread = threading.Thread(target=self._main, name="freeride-iterative", daemon=True)
        self._thread.start()

    @property
    def step_stream(self) -> Any:
        """The torch.cuda.ExternalStream that setup(), step() and teardown() run on (None
        on the host backend, or until a GPU runner has torch to wrap it with)."""
        return self._stream

    def _torch(self) -> Any:
        """torch if this runner is on a GPU and torch is loaded, else None."""
        return sys.modules.get("torch") if self._kind == "cuda" else None

    def _require_torch(self) -> Any:
        """torch with CUDA, imported if need be: steps on a GPU run on torch streams."""
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                torch = importlib.import_module("torch")
            except ImportError as exc:
                raise RuntimeError("iterative tasks on a GPU need PyTorch") from exc
        if not torch.cuda.is_available():
            raise RuntimeError("iterative tasks on a GPU need a PyTorch built with CUDA")
        return torch

    def _new_stream(self, torch: Any) -> Any:
        # The core's step stream, not one from torch's pool: torch hands its pool streams
        # out round-robin, so a user's torch.cuda.Stream() could be the same CUDA stream
        # and steps would queue behind training work. The core never destroys it: close()
        # may abandon a thread whose hung step still uses it.
        device = torch.device("cuda", self._device)
        return torch.cuda.ExternalStream(step_stream(self._device), device=device)

    # -- called by the harvester ----------------------------------------------------------------

    def submit(
        self, task: IterativeTask, priority: int, after: list[int], name: str
    ) -> IterativeHandle:
        """Queues `task`; its setup() waits for the work enqueued so far on the stream
        handles `after` (the harvester's streams to follow; empty on the host)."""
        bind = getattr(task, "bind", None)
        if bind is not None:  # the task checks its data against the harvester's device
            bind(self._kind, self._device)
        ready = self._record_ready(after)
        handle = IterativeHandle(self, task, priority)
        self._recorder.name_task(handle.id, name)
        need = handle._need = _memory_bytes(task)
        total = getattr(task, "total_steps", None)
        if total is not None:  # progress divides by it
            check_count(total, f"{type(task).__name__}.total_steps", minimum=0)
        budget = self._ex.memory_budget
        if budget and need > budget:
            self._finish(
                handle,
                "failed",
                MemoryBudgetError(
                    f"{task!r} needs {need} bytes of device memory, more than the harvester's "
                    f"whole memory_budget of {budget} bytes"
                ),
            )
            return handle
        handle._ready = ready
        with self._lock:
            heapq.heappush(self._queue, (-priority, next(self._seq), handle))
            self._lock.notify_all()
        return handle

    def _record_ready(self, after: list[int]) -> list[Any]:
        """One event per stream handle in `after`, recorded now, on the submitting thread:
        stream order in, so setup() waits for what the caller enqueued before submit."""
        if self._kind != "cuda" or not after:
            return []
        torch = self._require_torch()
        device = torch.device("cuda", self._device)
        events = []
        for handle in after:
            # Handles 0 and 1 (cudaStreamLegacy) are the default stream: ExternalStream(0)
            # would be a pool stream, and torch refuses 1 (an odd id is one of its own).
            stream = (
                torch.cuda.default_stream(device)
                if handle in (0, 1)
                else torch.cuda.ExternalStream(handle, device=device)
            )
            event = torch.cuda.Event()
            event.record(stream)
            events.append(event)
        return events

    def cancel(self, handle: IterativeHandle) -> None:
        with self._lock:
            handle._cancel = True
            self._lock.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Cancels every task and waits up to `timeout` s for a running step. A step that
        never returns cannot be interrupted from Python: its task is marked failed and the
        (daemon) thread abandoned, so closing the harvester never hangs on side work."""
        with self._lock:
            self._closing = True
            for _, _, handle in self._queue:
                handle._cancel = True
            self._lock.notify_all()
        if threading.current_thread() is self._thread:
            # Closed from a step (its harvester finalised here): the loop ends after it.
            return
        timeout = CLOSE_TIMEOUT_S if timeout is None else timeout
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._lock:
                stuck = [h for _, _, h in self._queue if not h.done()]
            for handle in stuck:
                handle._error = TimeoutError(
                    f"step() did not return within {timeout} s of close(); abandoned"
                )
                handle._state = "failed"
                handle._done.set()

    # -- the thread -----------------------------------------------------------------------------

    def _finish(self, handle: IterativeHandle, state: str, error: BaseException | None = None):
        if handle.done():  # abandoned by close() while its step hung
            return
        if handle._set_up:
            try:
                with self._on_step_stream():
                    handle.task.teardown()
            except BaseException as exc:  # noqa: BLE001 - user code: a failing teardown fails it
                if error is None and state == "done":
                    state, error = "failed", exc
        with self._lock:
            self._reserved -= handle._reserved
            handle._reserved = 0
            self._lock.notify_all()
        handle._error = error
        handle._state = state
        handle._done.set()

    def _pick(self) -> IterativeHandle | None:
        """Highest priority first; a task waits until its memory fits the budget."""
        budget = self._ex.memory_budget
        for _, _, handle in sorted(self._queue):
            if handle._cancel:
                return handle
            if (
                handle._reserved
                or not budget
                or (self._ex.memory_used + self._reserved + handle._need <= budget)
            ):
                return handle
        return None

    def _main(self) -> None:
        if self._kind == "cuda":
            # Steps allocate, sync the step stream and query events while training may be
            # capturing a CUDA graph on its own thread; in the default (global) capture
            # mode any of those calls from this thread would invalidate that capture.
            _relax_capture_mode()
        while True:
            with self._lock:
                while not self._closing and self._pick() is None:
                    self._lock.wait(0.05)
                if self._closing:
                    pending = [h for _, _, h in self._queue]
                    self._queue.clear()
                    break
                handle = self._pick()
                if not handle._reserved:
                    handle._reserved = handle._need
                    self._reserved += handle._reserved
            if handle._cancel:
                self._drop(handle)
                self._finish(handle, "cancelled")
            else:
                self._serve(handle)
            handle = None  # (a final task, its model and data, is not kept until the next)
        for handle in pending:
            if not handle.done():
                self._finish(handle, "cancelled")

    def _drop(self, handle: IterativeHandle) -> None:
        with self._lock:
            self._queue = [entry for entry in self._queue if entry[2] is not handle]
            heapq.heapify(self._queue)

    def _preempted(self, handle: IterativeHandle) -> bool:
        """A more urgent iterative task is queued."""
        with self._lock:
            best = min(self._queue) if self._queue else None
        return best is not None and best[2] is not handle and -best[0] > handle.priority

    def _serve(self, handle: IterativeHandle) -> None:
        """Runs steps of `handle` until it ends, is cancelled or a more urgent task waits."""
        task = handle.task
        try:
            if not handle._set_up:
                stream = self._stream_for_steps()
                for event in handle._ready:
                    stream.wait_event(event)
                handle._ready = []
                handle._set_up = True
                with self._on_step_stream():
                    task.setup()
            while not handle._cancel and not self._closing and not self._preempted(handle):
                handle._state = "paused" if handle._steps else "queued"
                seq = self._wait_for_fit(handle)
                if seq is None:
                    continue
                self._one_step(handle, seq)
                if task.finished():
                    self._drop(handle)
                    self._finish(handle, "done")
                    return
            if handle._cancel or self._closing:
                self._drop(handle)
                self._finish(handle, "cancelled")
        # BaseException: a step that raises SystemExit (or any other non-Exception) fails
        # its task too; let through, it would end this thread and every task behind it.
        except BaseException as exc:  # noqa: BLE001 - user code: any error fails this task only
            self._drop(handle)
            self._finish(handle, "failed", exc)

    def _stream_for_steps(self) -> Any:
        """The step stream, made now if torch was not loaded when the runner started (a
        task may import it in setup()); None on the host backend."""
        if self._kind != "cuda":
            return None
        if self._stream is None:
            self._stream = self._new_stream(self._require_torch())
        return self._stream

    def _on_step_stream(self):
        if self._stream is None:
            return contextlib.nullcontext()
        return sys.modules["torch"].cuda.stream(self._stream)

    def _wait_for_fit(self, handle: IterativeHandle) -> int | None:
        """Waits for a bubble with room for one step; its sequence number, or
        None when the task should stop waiting (cancel, close, preemption).

        Each bubble is judged once: within a bubble the answer only gets worse (less of
        it is left, and the prediction it is judged against is learnt from finished
        iterations, not from this one), so a bubble without room is slept through in the
        extension until the next one, not polled. Every sleep is at most _WAIT_S, so
        cancel(), close() and a more urgent task are noticed within that.

        A bubble is new when its open carries a number other than the last one judged
        (eager training: every write has a new number, and its open rings), or when this
        thread saw the gate closed since (a replayed CUDA graph repeats the numbers it
        was captured with and its opens ring nothing: the close and the reopening are
        noticed by a look at the mirror after each sleep, at most _WAIT_S late). An open
        that did not ring is counted from the last moment it was known not to have
        happened, so a replayed bubble is never thought longer than it is."""
        judged = False  # the bubble self._bubble_seq was judged here and had no room
        opened_after: int | None = None  # where the open seen next did not ring
        while not handle._cancel and not self._closing:
            if not judged:
                look = time.monotonic_ns()
                if self._ex.gate_read() == GATE_OPEN:
                    seq = self._ex.gate_seq()
                    now = time.monotonic_ns()
                    reopened = self._closed_seen_ns is not None and _REOPEN_IS_NEW_BUBBLE
                    if seq != self._bubble_seq or reopened:
                        self._new_bubble(seq, now if opened_after is None else opened_after)
                    opened_after = None
                    if self._fits(handle, seq, now - self._bubble_seen_ns):
                        # A more urgent task submitted meanwhile gets this bubble instead.
                        return None if self._preempted(handle) else seq
                    judged = True
                    continue
                self._closed_seen_ns = look
                if not self._rings:
                    # Nothing rings: the extension polls the mirror, so an open is seen
                    # within microseconds.
                    if not self._ex.gate_wait_open(_WAIT_S) and self._preempted(handle):
                        return None
                    continue
            # Sleep until a newer open rings. Never woken by closes, so nothing runs here
            # during compute while training runs eagerly.
            last = self._bubble_seq if self._bubble_seq is not None else self._ex.gate_seq()
            since = time.monotonic_ns()
            if self._ex.gate_wait_next_open(last, _WAIT_S):
                # Ended early: by the open's ring, at the open (or by an interrupt from a
                # submit or cancel). At its end: an open that rang nothing, some time
                # after the wait began.
                rang = time.monotonic_ns() - since < _WAIT_NS
                judged, opened_after = False, None if rang else since
                continue
            look = time.monotonic_ns()
            if self._ex.gate_read() != GATE_OPEN:
                self._closed_seen_ns = look
            elif self._closed_seen_ns is not None and _REOPEN_IS_NEW_BUBBLE:
                # Open again after a close, with the number judged last: a replayed graph's
                # open, which rang nothing. It took effect after the look that saw the
                # gate closed.
                judged, opened_after = False, self._closed_seen_ns
                continue
            if self._preempted(handle):
                return None
        return None

    def _new_bubble(self, seq: int, opened_ns: int) -> None:
        self._bubble_seq, self._bubble_seen_ns = seq, opened_ns
        self._closed_seen_ns = None
        if self._recorder.recording:
            # A new bubble: learn from the iterations the device has finished.
            self._recorder.flush(block=False)

    def _fits(self, handle: IterativeHandle, seq: int, elapsed_ns: int) -> bool:
        recorder = self._recorder
        if not recorder.recording:
            return True  # no schedule recorded: the gate alone says when
        slot = self._gate.slot_of(seq)
        if slot is None:
            return False  # `seq` is a close that raced the gate read: ask again
        if slot == MANUAL_BUBBLE:
            # Opened by hand (h.bubble(), h.gate.open()), for side work: nothing predicts
            # how long it stays open, so the gate alone says when, as before recording.
            # (Attached and recorded loops close the gate between their iterations.)
            return True
        predicted = recorder.predicted_slot_ns(slot)
        if predicted is None:
            return False  # learn this slot's length first
        step = handle.step_ns
        longest = max((recorder.predicted_slot_ns(k) or 0) for k in recorder.known_slots())
        if step is not None and step * _MARGIN <= longest:
            return step * _MARGIN <= predicted - elapsed_ns
        # No estimate yet, or one that fits no bubble of the schedule: measure the step at
        # the start of the longest bubble (each time when unmeasured; now and then when
        # starved, so that one slow step cannot shut the task out for good).
        if predicted < longest or elapsed_ns >= predicted // 4:
            return False
        if step is None:
            return True
        handle._starved += 1
        if handle._starved < _REMEASURE_EVERY:
            return False
        handle._starved = 0
        return True

    def _one_step(self, handle: IterativeHandle, seq: int) -> None:
        handle._state = "running"
        stream = self._stream
        where = 0 if stream is None else int(stream.cuda_stream)  # the host ignores it
        start = self._ex.mark(where)
        try:
            with self._on_step_stream():
                handle.task.step()
        except BaseException:
            self._ex.release_mark(start)  # the step failed: nothing will time it
            raise
        end = self._ex.mark(where)
        if stream is not None:
            stream.synchronize()
        elapsed = self._ex.elapsed_ns(start, end)
        handle._steps += 1
        if elapsed is not None:
            if handle._warmup_ns is None:
                handle._warmup_ns = elapsed
            else:
                handle._step_ns.append(elapsed)
                del handle._step_ns[:-_RECENT_STEPS]
        # The gate moved on (its sequence changed) before the step was over: an overrun.
        if self._ex.gate_seq() != seq or self._ex.gate_read() != GATE_OPEN:
            handle._overruns += 1
        if self._recorder.recording:
            self._recorder.add_launch_marks(handle.id, 0, start, end, 1)
        else:
            self._ex.release_mark(start)
            self._ex.release_mark(end)
