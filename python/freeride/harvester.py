"""Harvester: the per-device object that owns the gate, the side stream and the executor."""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from . import _abandoned, _shutdown
from ._C import MAX_SLICES, Executor
from ._checks import check_count, check_timeout, parse_memory
from ._closing import ABORT_DEADLINE_S, ABORT_STEP_TIMEOUT_S, Parts
from ._device import host_instead, resolve_device
from ._harvester_args import (
    check_time_slice,
    default_workers,
    usable_cores,
    warn_if_lazy_loading,
    warn_if_spinning_on_one_core,
)
from ._harvester_counts import BubbleStats
from ._harvester_mechanisms import BackendMechanisms
from ._streams import current_streams, refuse_capturing, stream_handle
from .attach import Attachment
from .errors import CudaUnavailableError, HarvesterClosedError
from .gate import Gate
from .handle import TaskHandle
from .iterative import IterativeHandle, IterativeRunner, IterativeTask
from .record.model import TaskSummary
from .record.recorder import Recorder, attribute_side_work
from .record.report import Report
from .reserve import DEFAULT_RESERVE, NO_RESERVE, Reserve
from .tasks._base import Task, build_within


def _rank() -> int | None:
    import sys

    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def _raise_closed() -> None:
    raise HarvesterClosedError("the harvester is closed")


def _weakly(
    method: Callable[[], None], if_gone: Callable[[], None] | None = None
) -> Callable[[], None]:
    """Calls `method` while its object lives (else `if_gone`) without keeping the object
    alive: what a harvester gives its recorder and gate must not point back at it."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()
        elif if_gone is not None:
            if_gone()

    return call


class Harvester(BackendMechanisms):
    """Runs side tasks on one device, only while its gate is open.

    Args:
        device: "auto" or None (cuda:0 when a GPU is usable, else the host backend),
            "cpu", "cuda", "cuda:N", an int N or a torch.device.
        memory_budget: device memory the side tasks running at once may hold: bytes,
            a size string ("8GiB", "512MB"), or None for no limit. A task waits until
            its memory fits beside theirs; its buffers are made at submit().
        workers: host backend only: threads that run items (default: half the cores).
        gate_in_host_memory: CUDA only: keep the gate in mapped pinned host memory
            instead of device memory: a host-side close then takes effect without a
            stream operation, but every side block's leader reads the gate across the bus
            before each item (one read per block per item, as with the device gate), and
            a close written on the training stream lands there later. For comparison in
            `freeride bench preempt`; the device-memory gate is the one to use.
        stream_wait: CUDA only: hold each launch on the side stream with
            cuStreamWaitValue32 until the gate opens, instead of admitting it when the
            executor thread sees the gate open. Not even an empty launch then reaches the
            GPU during compute, but a device-wide synchronisation (torch.cuda.synchronize,
            cudaFree, empty_cache) issued while the gate is closed and before its open
            waits forever, and everything queued behind the held launch on its hardware
            queue waits with it. Refused (ValueError) under CUDA_DEVICE_MAX_CONNECTIONS=1,
            where that queue is every stream's, the training stream's open included; with
            more connections safe only where training's streams do not share the side
            stream's queue. Off by default.
        reserve: CUDA only: what side kernels leave free for the kernels training
            launches while side work runs (see freeride.Reserve for the cost). The
            default leaves whole SMs out of side work through a green context (12 of 132
            on an H100) where the driver offers one, else caps every side grid's
            occupancy so that one 512-thread block with 48 KiB of shared memory still
            fits on every SM; see reserve_mechanism for what a harvester got. None:
            no reserve, side grids fill every SM, and such kernels wait for a side launch
            to end (its time slice, or the gate's close).
        time_slice: CUDA only: seconds after which a side launch claims no further item
            and is relaunched (if the gate is still open), so that a device-wide
            synchronisation issued while the gate is open (torch.cuda.synchronize,
            cudaFree, empty_cache) waits at most this long, or twice that where the
            executor's next launch was already queued behind the running one (with
            FREERIDE_SUCCESSORS=1, off by default: near the slice's end, so that the GPU
            goes on without a host round trip). While the close that ends the
            launch's bubble is already enqueued and has not yet taken effect, a
            synchronisation waits for that close anyway, and the launch runs on until it,
            for at most ``slice_bound`` in all (``max_slices`` slices: the longest a
            training kernel larger than the reserve, launched in a bubble on another
            stream, is confined to the reserve). None: a launch runs until the gate
            closes (or a stream-ordered close executes: a launch serves one bubble);
            then a call that synchronises the device made by the thread that
            would enqueue the close never returns (creating a stream, cudaFree,
            torch.cuda.synchronize while the gate is open, and the first launch of a
            kernel not yet loaded under CUDA's lazy module loading, the default since
            CUDA 12.2: each waits for the side launch). Make streams before side work
            starts, as a training process does, and set CUDA_MODULE_LOADING=EAGER (read
            when CUDA initialises) or launch every kernel once before side work starts;
            backend_info()["module_loading"] says which, and a CUDA harvester made with
            None warns (RuntimeWarning) where loading is lazy.
        max_slices: CUDA only: the most time slices a side launch claims items in all
            while the close that ends its bubble is already enqueued (1 to 10,000;
            default 8, 16 ms with the default slice). A bubble longer than that, queued
            ahead of the GPU, goes unharvested past it; a larger value harvests it, and
            confines a training kernel larger than the reserve, launched in the bubble on
            another stream, to the reserve for as long.

    Use it as a context manager, or call close().

    Interrupts: Ctrl-C in a training loop inside ``with fr.Harvester(...)`` leaves the
    block within milliseconds (the KeyboardInterrupt closes it on the way out), and a
    SIGTERM while a harvester is open closes it before the process dies by SIGTERM as
    before (only where SIGTERM had its default action: a handler of your own is never
    replaced). Either way side tasks stop at an item boundary (an item in flight
    finishes, no new one starts, none runs twice), every freeride thread is joined, and
    freeride's part takes milliseconds (on a machine whose cores are all busy, see
    "Ctrl-C and SIGTERM" in docs/guide.md). Waits on side work (``handle.wait()``,
    ``result()``, ``cancel()``, ``wait_all()``) let Ctrl-C through.
    """

    def __init__(
        self,
        device: Any = "auto",
        memory_budget: int | str | None = None,
        *,
        workers: int | None = None,
        gate_in_host_memory: bool = False,
        stream_wait: bool = False,
        reserve: Reserve | None = DEFAULT_RESERVE,
        time_slice: float | None = 0.002,
        max_slices: int = MAX_SLICES,
    ) -> None:
        _abandoned.release_passed()  # what earlier harvesters abandoned and the GPU passed
        self._kind, self._device_index = resolve_device(device)
        budget = parse_memory(memory_budget, "memory_budget")
        workers = default_workers() if workers is None else check_count(workers, "workers", 1, 1024)
        if not isinstance(gate_in_host_memory, bool):
            raise TypeError("gate_in_host_memory must be a bool")
        if not isinstance(stream_wait, bool):
            raise TypeError("stream_wait must be a bool")
        if reserve is None:
            reserve = NO_RESERVE
        if not isinstance(reserve, Reserve):
            raise TypeError(
                f"reserve must be a freeride.Reserve or None, got {type(reserve).__name__}"
            )
        self._reserve = reserve
        self._time_slice = check_time_slice(time_slice)
        self._max_slices = check_count(max_slices, "max_slices", 1, 10_000)

        def executor(kind: str, index: int) -> Executor:
            return Executor(
                kind,
                index,
                workers,
                gate_in_host_memory,
                stream_wait,
                budget,
                reserve.as_tuple(),
                0 if self._time_slice is None else max(1, round(self._time_slice * 1e9)),
                reserve_mechanism=reserve.mechanism,
                reserve_sms=reserve.sms or 0,
                max_slices=self._max_slices,
            )

        try:
            self._ex = executor(self._kind, self._device_index)
        except CudaUnavailableError as error:  # the GPU "auto" chose cannot run the kernels
            if not host_instead(device, error):
                raise
            self._kind, self._device_index = "host", -1
            self._ex = executor(self._kind, self._device_index)
        warn_if_lazy_loading(self._kind, self._time_slice)
        warn_if_spinning_on_one_core(str(self._ex.admission), usable_cores())
        self._lock = threading.Lock()
        self._closed = False
        # Every handle the user still holds, for tasks() and report()...
        self._handles: weakref.WeakSet[TaskHandle] = weakref.WeakSet()
        # Ids of final tasks whose handles are gone: the executor forgets their records
        # at the next _reap(), so a long run's memory does not grow with every task.
        self._orphans: collections.deque[int] = collections.deque()  # appended from any thread's GC
        # ...and, whatever the user holds, every task that is not final: its handle keeps
        # the task's buffers alive, and a side kernel may write them until it is final.
        self._live: dict[int, TaskHandle] = {}
        self.gate = Gate(
            self._ex, self._kind, self._device_index, _weakly(self._check_open, _raise_closed)
        )
        self._recorder = Recorder(self.gate, self._ex, self._kind, self._device_index)
        self._recorder.on_iteration_end = _weakly(self._reap)
        self._parts = Parts(self._ex, self._live)
        self._finalizer = weakref.finalize(self, self._parts.close)
        if self._kind == "cuda" and "torch" in sys.modules:
            # Now, before any side kernel runs: the runner makes its step stream, and
            # creating streams (torch's pool) while a persistent side grid held the GPU
            # was measured to block for over a minute.
            self._parts.iterative = self._new_runner()
        # SIGTERM closes it (and dies by SIGTERM as before); held weakly.
        _shutdown.register(self, self._abort)

    def _new_runner(self) -> IterativeRunner:
        return IterativeRunner(self._ex, self.gate, self._recorder, self._kind, self._device_index)

    @property
    def _iterative(self) -> IterativeRunner | None:
        """The runner of iterative tasks, once there is one."""
        return self._parts.iterative

    @property
    def device(self) -> str:
        """ "cpu" or "cuda:N"."""
        return "cpu" if self._kind == "host" else f"cuda:{self._device_index}"

    @property
    def backend(self) -> str:
        """ "host" or "cuda"."""
        return self._kind

    @property
    def side_stream(self) -> int:
        """Handle of the low-priority stream side kernels run on (0 on the host backend)."""
        return self._ex.side_stream

    @property
    def reserve(self) -> Reserve:
        """What side kernels leave free on every SM (CUDA; blocks == 0: nothing)."""
        return self._reserve

    @property
    def time_slice(self) -> float | None:
        """Longest a side launch keeps claiming items, in seconds (CUDA; None: no bound),
        unless the close that ends its bubble is already enqueued (see slice_bound)."""
        return self._time_slice

    @property
    def max_slices(self) -> int:
        """The most time slices a side launch claims items in all while the close that
        ends its bubble is already enqueued (CUDA)."""
        return self._max_slices

    @property
    def slice_bound(self) -> float | None:
        """Longest a side launch keeps claiming items when the close that ends its bubble
        is already enqueued, in seconds: ``max_slices`` time slices (CUDA; None: no bound)."""
        return None if self._time_slice is None else self._time_slice * self._max_slices

    @property
    def memory_budget(self) -> int | None:
        """Bytes side tasks may hold at once, or None for no limit."""
        return self._ex.memory_budget or None

    @property
    def memory_used(self) -> int:
        """Bytes held by the side tasks admitted now."""
        return self._ex.memory_used

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._closed

    def submit(
        self,
        task: Task | IterativeTask,
        priority: int = 0,
        *,
        stream: Any = None,
        name: str | None = None,
    ) -> TaskHandle | IterativeHandle:
        """Queues `task`; higher `priority` runs first, FIFO within a priority; `name`
        names its launches in report() (default: the task's repr). A task that
        would exceed the memory budget on its own comes back failed with MemoryBudgetError
        (the built-in tasks that make buffers are refused before making any).
        Item tasks (fr.tasks.*) run as preemptible kernels; an fr.IterativeTask runs its
        steps in the bubbles they are predicted to fit.

        Stream order: on a GPU the task's first kernel (an IterativeTask's setup() and
        steps, on the step stream) starts only after everything the current stream (and
        `stream`, if given: a torch.cuda.Stream, a CuPy stream, or the special handle 0,
        1 or 2; wrap any other raw handle in torch.cuda.ExternalStream) had enqueued when
        submit() was called, so inputs still being written there are complete before
        side work reads them. Until then a kernel task stays queued and other tasks run.
        The harvester holds the task and its buffers until it is final, whether or not
        the handle is kept; once ``wait()`` returns True its results are complete for
        any later work on any stream.

        Not during CUDA graph capture: if one of those streams is being captured, submit()
        raises StreamCaptureError (a RuntimeError) and leaves the capture as it was."""
        self._check_open()
        iterative = isinstance(task, IterativeTask)
        if not iterative and not isinstance(task, Task):
            raise TypeError(
                "task must be a freeride task (fr.tasks.*) or an fr.IterativeTask, "
                f"got {type(task).__name__}"
            )
        priority = check_count(priority, "priority", -(2**31), 2**31 - 1)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {type(name).__name__}")
        name = repr(task) if name is None else name
        after = self._streams_to_follow(stream)
        if self._kind == "cuda":
            # Before anything touches a stream or allocates: following a capturing stream
            # would pull the side stream into the user's graph.
            refuse_capturing(after, self._device_index)
        if iterative:
            with self._lock:
                self._check_open()
                if self._parts.iterative is None:
                    self._parts.iterative = self._new_runner()
                handle = self._parts.iterative.submit(task, priority, after, name)
                self._handles.add(handle)
            return handle
        built = build_within(task, self._kind, self._device_index, self._ex.memory_budget)
        self._reap()
        with self._lock:
            self._check_open()
            task_id = self._ex.submit(built.core, priority, after)
            handle = TaskHandle(self._ex, task_id, task, built)
            self._recorder.name_task(task_id, name)
            self._handles.add(handle)
            weakref.finalize(handle, self._orphans.append, task_id)
            self._live[task_id] = handle
        return handle

    def _streams_to_follow(self, stream: Any) -> list[int]:
        """Stream handles a new task's first launch waits for: the current stream (where
        its buffers were allocated and uploaded; CuPy's too, where CuPy is loaded and its
        current stream is another) and the caller's `stream`."""
        if stream is not None:
            handle = stream_handle(stream, self._kind, self._device_index, host=False)
        if self._kind != "cuda":
            return []
        handles = current_streams(self._device_index)
        if stream is not None and handle not in handles:
            handles.append(handle)
        return handles

    def _reap(self) -> None:
        """Lets go of the tasks that became final: their buffers may now be freed."""
        finished = self._ex.take_finished()
        if finished:
            with self._lock:
                for task_id in finished:
                    self._live.pop(task_id, None)
        if self._orphans:
            # A handle can die only once its task is final (until then _live holds it).
            while self._orphans:
                self._ex.forget(self._orphans.popleft())

    def wait_all(self, timeout: float | None = None) -> bool:
        """Blocks until every submitted task is final; True if they are."""
        self._check_open()
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._ex.wait_all(-1.0 if timeout is None else timeout):
            return False
        for handle in self.tasks():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not handle.wait(left):
                return False
        return True

    def compute(
        self, stream: Any = None, label: str = "compute"
    ) -> contextlib.AbstractContextManager[None]:
        """Closes the gate before the block's work on `stream` and, if it was open,
        reopens it after, in stream order: the manual hook for training loops freeride
        does not attach to. Inside ``iteration()`` it is recorded as a compute action.
        Raises HarvesterClosedError on entering once the harvester is closed."""
        if not isinstance(label, str):  # a report and its trace name the action by it
            raise TypeError(f"label must be a str, got {type(label).__name__}")
        return self._recorder.compute(label, stream, self._not_closed, self._check_open)

    @contextlib.contextmanager
    def bubble(self, stream: Any = None) -> Iterator[None]:
        """The opposite of compute(): opens the gate for the block, closes it after."""
        self.gate.open(stream)
        try:
            yield
        finally:
            if not self._closed:
                self.gate.close(stream)

    def iteration(self, stream: Any = None) -> contextlib.AbstractContextManager[None]:
        """One training iteration of a manual loop: opens the gate at the start, closes
        it at the end, and records its compute actions (``compute()`` blocks) and bubbles
        for ``report()``. attach() does the same around every schedule.step(). Raises
        HarvesterClosedError on entering once the harvester is closed."""
        return self._recorder.iteration(stream, self._not_closed, self._check_open)

    def attach(self, schedule: Any) -> None:
        """Harvests the bubbles of a torch.distributed.pipelining schedule (any kind,
        single- or multi-stage): the gate opens when step() starts, closes around every
        forward, backward, backward-input, backward-weight and loss computation of every
        stage on this rank, and closes when step() returns. Closes the gate now, so side
        work runs only inside steps. Undo with detach()."""
        self._check_open()
        if self._parts.attachment is not None:
            raise RuntimeError("this harvester is already attached to a schedule; detach() first")
        self._parts.attachment = Attachment(
            self._recorder, schedule, self._kind, self._device_index
        )
        self.gate.close()

    def attach_optimizer(self, optimizer: Any) -> None:
        """Keeps the gate closed through optimizer.step() (recorded as a compute action
        when it runs inside a step)."""
        self._check_open()
        if self._parts.attachment is None:
            raise RuntimeError("attach(schedule) before attach_optimizer()")
        self._parts.attachment.add_optimizer(self._recorder, optimizer)

    def detach(self) -> None:
        """Removes every hook attach() and attach_optimizer() placed, leaving the schedule,
        its stages and the optimizers exactly as they were. The gate stays closed."""
        self._parts.detach()

    def report(self, timeout: float = 30.0) -> Report:
        """The bubble record so far: every recorded iteration's compute actions and
        bubbles, the side launches and what they did in each bubble, and totals. Waits
        (up to `timeout` s) for the device to pass what was recorded and for the executor
        to take every side launch that ended in it (or ends at the gate's last close); a
        launch still running in an open bubble is in a later report."""
        self._check_open()
        timeout = check_timeout(timeout)
        self._reap()
        self._recorder.flush(block=True, timeout=math.inf if timeout is None else timeout)
        iterations = self._recorder.iterations()
        launches = self._recorder.launches()
        attribute_side_work(iterations, launches)
        tasks = [
            TaskSummary(h.id, repr(h.task), h.state, h.items_done, h.items_total, h.overruns)
            for h in self.tasks()
        ]
        return Report(
            device=self.device,
            backend=self._kind,
            rank=_rank(),
            iterations=iterations,
            launches=launches,
            tasks=tasks,
            settings={"memory_budget": self.memory_budget}
            | ({"host_idle": self.host_idle} if self._kind == "host" else {}),
            clock_origin_unix_ns=self._recorder.clock_origin_unix_ns,
            launch_counts=self.launch_counts()._asdict(),
        )

    def bubble_stats(self) -> BubbleStats:
        """What the bubble record predicts now, from the recorded iterations the device
        has passed: bubble time per iteration and the longest bubble (the median of each
        bubble slot's recent lengths, summed and the largest), and iterations begun. Any
        thread; never waits for the device."""
        self._check_open()
        self._recorder.flush(block=False)
        return BubbleStats(*(int(x) for x in self._recorder.bubble_stats()))

    def tasks(self) -> list[TaskHandle]:
        """Handles of the submitted tasks that are not final or still referenced."""
        self._reap()
        with self._lock:
            handles = set(self._handles) | set(self._live.values())
        return sorted(handles, key=lambda h: h.id)

    def close(self) -> None:
        """Cancels what has not finished, stops the executor thread and frees the side
        stream and every buffer. Returns promptly even with tasks running: items in
        flight finish, no new one starts, and every thread of the harvester is joined
        (an iterative task's step in flight is waited for up to
        iterative.CLOSE_TIMEOUT_S). Idempotent. A harvester dropped without close() is
        closed when its last reference goes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._finalizer()  # detaches, closes the runner and the executor, once
        finally:
            _shutdown.unregister(self)
        with self._lock:
            self._live.clear()

    def _abort(self) -> None:
        """close() after Ctrl-C, an exception leaving the with-block that is not an
        Exception (SystemExit), or SIGTERM (freeride._shutdown): the same, except that an
        iterative task's step in flight is waited for only ABORT_STEP_TIMEOUT_S."""
        self._parts.step_timeout = ABORT_STEP_TIMEOUT_S
        self._parts.deadline = ABORT_DEADLINE_S
        self.close()

    def _not_closed(self) -> bool:
        return not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise HarvesterClosedError("the harvester is closed")

    def __enter__(self) -> Harvester:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            self._abort()  # KeyboardInterrupt, SystemExit: the process is on its way out
        else:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Harvester(device={self.device!r}, {state})"
