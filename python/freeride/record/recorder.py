"""The bubble record: gate writes of the training loop, timestamped in the training
stream's own timeline, turned into compute intervals and bubbles per iteration.

CUDA graphs: a gate write on a stream being captured is captured with the graph, as
intended (every replay then writes the gate), but no timestamp is taken there: an event
recorded inside a capture is a graph node, never a point of the stream's timeline, and
timing it fails. An iteration with such a write ran nothing when it was recorded (a
capture only builds the graph), so it is left out of the record; replays run no hooks
and are not recorded either."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._C import GATE_CLOSED, GATE_OPEN, IMMEDIATE, free_device_memory
from ..gate import Gate
from .model import Bubble, Compute, Iteration, SideLaunch
from .profiler import BubbleRanges, unix_offset_ns

_MAX_PENDING = 64
# A recorded open carries the running side task's launch (CUDA: Gate.write's `launch`)
# unless its slot's recent bubbles were shorter than this: such a launch finds its bubble
# over before its blocks are up (a launch takes some microseconds to reach the SMs), and
# still costs the GPU its dispatch and the training thread its enqueue.
MIN_LAUNCH_BUBBLE_NS = 50_000
# ... nor shorter than this many of the task's items (its blocks' measured item time):
# a block holds its SM up to an item past the close, so a bubble of a few items would
# hand training's next compute more of the side task than the bubble gave it.
MIN_LAUNCH_BUBBLE_ITEMS = 4
# Of the opens long enough for the floor but skipped for the task's items, every this
# many carries a launch anyway: the item time is measured again from it. An estimate too
# high (a launch slowed by what shared its SMs, a phase of longer items) would otherwise
# keep the task out of those bubbles for good, since only launches measure it.
ITEM_SKIP_PROBE_EVERY = 16
# Longest a GPU record's time 0 takes to place on the wall clock (_gpu_mark_unix_ns), both
# ways together: beyond it the device is busy beyond reason, and the report has no origin.
CLOCK_ORIGIN_TIMEOUT_S = 1.0

_clock = time.perf_counter_ns  # the hooks' own timer (add_hook_ns), read 4 times a pair


@dataclass
class _Pending:
    """An iteration whose marks the GPU may not have reached yet."""

    index: int
    origin: int  # mark id of the iteration's start (0: none, see Gate.write)
    # (kind, label, mark, free_memory): kind "open" or "close"; mark 0 where the write was
    # captured into a CUDA graph
    events: list[tuple[str, str, int, int | None]] = field(default_factory=list)
    hook_ns: int = 0  # the training thread's time in freeride's hooks (add_hook_ns)


class Recorder:
    """Records when the training loop's gate writes took effect (the writes themselves
    are the gate's) and what the hooks cost the training thread. One per harvester;
    used by attach(), compute(), iteration() and the engine integrations."""

    def __init__(
        self, gate: Gate, ex: Any, kind: str, device: int, keep_iterations: int = 1000
    ) -> None:
        self._gate = gate
        self._ex = ex
        self._kind = kind
        self._device = device
        self._depth = 0  # nesting of compute actions: only the outermost writes
        self._saved_open: list[bool] = []
        self._current: _Pending | None = None
        self._hook_target: _Pending | None = None  # the iteration add_hook_ns adds to
        self._pending: deque[_Pending] = deque()
        self._iterations: deque[Iteration] = deque(maxlen=keep_iterations)
        self._launches: deque[SideLaunch] = deque()
        self._raw_launches: list[tuple] = []
        self._anchor: tuple[int, int] | None = None  # (mark, ns since recording start)
        # GPU: the first iteration's origin mark once the GPU has passed it, while its wall
        # time is still to be asked (_settle_origin): only by a flush that may wait, as
        # the answer can wait for the control stream behind training's backlog. Kept (not
        # released as an old anchor) until then.
        self._origin_owed: int | None = None
        self._next_index = 0
        self._slot = 0
        # Free device memory is sampled at one bubble per iteration, the slots in turn:
        # cudaMemGetInfo costs tens of microseconds of the training thread, too much for
        # every open. The slot sampled in the current iteration, and how many bubbles the
        # last one had.
        self._memory_slot = 0
        self._slots_last = 1
        self._slot_ns: dict[int, deque[int]] = {}  # slot -> recent durations
        # slot -> median of _slot_ns[slot], set whenever that history changes (under
        # _shared): every recorded open asks for its slot's, and a single dict read is
        # atomic, so the training thread takes no lock and sorts nothing for it.
        self._slot_median: dict[int, int] = {}
        self._item_skips = 0  # opens skipped for the task's items (ITEM_SKIP_PROBE_EVERY)
        self._task_names: dict[int, str] = {}
        # The iterative runner's thread reads slot predictions and adds launches while the
        # training thread records: these two structures are shared.
        self._shared = threading.Lock()
        self._resolving = threading.Lock()  # one flush at a time (training or runner thread)
        self.clock_origin_ns: int | None = None  # host backend: steady-clock ns of time 0
        self.clock_origin_unix_ns: int | None = None  # the same as Unix time (profiling.py)
        # How clock_origin_unix_ns was found: "steady-clock" (host), "clock-anchor" or
        # "probe" (GPU, see _gpu_mark_unix_ns); None while there is none.
        self.clock_origin_source: str | None = None
        # Profiler ranges of the open bubble (profiling.py); training thread only.
        self._ranges = BubbleRanges(kind == "cuda")
        self._cuda = kind == "cuda"
        self.recording = False
        # Called after every recorded iteration (the harvester lets go of final tasks).
        self.on_iteration_end: Callable[[], None] | None = None

    def _free_memory(self, slot: int, mark: int) -> int | None:
        """Free device memory now if `slot` is the one sampled this iteration (and the
        open has a timestamp: an iteration without one is left out), else None. Callers
        on the hot path test the slot first, and call only for the sampled one."""
        if not self._cuda or slot != self._memory_slot or not mark:
            return None
        # freeride's own query, in relaxed capture mode (torch's would run in the training
        # thread's mode, and could invalidate a graph another thread captures).
        return int(free_device_memory(self._device))

    def begin_iteration(self, stream: Any = None) -> None:
        """Opens the gate at the start of an iteration (schedule.step())."""
        if self._current is not None:
            raise RuntimeError("an iteration is already being recorded (nested step()?)")
        if not self.recording:
            self.recording = True
            self._ex.set_recording(True)
        self._slot = 0
        self._memory_slot = self._next_index % self._slots_last
        mark = self._gate.write(GATE_OPEN, stream, mark=True, slot=0, launch=self._launch_pays(0))
        self._current = _Pending(self._next_index, mark)
        self._hook_target = self._current
        self._next_index += 1
        self._current.events.append(("open", "", mark, self._free_memory(0, mark)))
        self._ranges.open(0)

    def end_iteration(self, stream: Any = None) -> None:
        """Closes the gate at the end of an iteration."""
        current = self._current
        if current is None:
            return
        self._ranges.close()
        mark = self._gate.write(GATE_CLOSED, stream, mark=True)
        current.events.append(("close", "", mark, None))
        self._slots_last = self._slot + 1
        self._current = None
        self._depth = 0
        self._saved_open.clear()
        self._pending.append(current)
        # Resolution is left to report() and the iterative runner's thread, off the
        # training thread; only a backlog (nobody asking) is resolved here.
        if len(self._pending) > _MAX_PENDING:
            self.flush(block=False)
        if self.on_iteration_end is not None:
            self.on_iteration_end()

    # compute_begin and compute_end run around every compute action on the training
    # thread: positional arguments and locals instead of keywords and repeated attribute
    # reads, since each costs the thread tens of nanoseconds there.

    def compute_begin(self, label: str, stream: Any = None) -> None:
        """Closes the gate before a compute action."""
        self._depth += 1
        if self._depth > 1:
            return
        gate = self._gate
        self._saved_open.append(gate.written_open)
        try:
            self._ranges.close()
            current = self._current
            if current is None:
                gate.write(GATE_CLOSED, stream)
            else:
                mark = gate.write(GATE_CLOSED, stream, True)
                current.events.append(("close", label, mark, None))
        except BaseException:
            # Not entered (a bad stream, a failed write): the next compute action closes
            # the gate itself, not one nested in this one.
            self._saved_open.pop()
            self._depth -= 1
            raise

    def compute_end(self, stream: Any = None) -> None:
        """After a compute action: reopens the gate if it was open before it."""
        depth = self._depth
        if depth == 0:
            return
        self._depth = depth = depth - 1
        if depth > 0:
            return
        if not self._saved_open.pop():
            return
        current = self._current
        if current is None:
            self._gate.write(GATE_OPEN, stream, False, None, True)
            return
        self._slot = slot = self._slot + 1
        launch = self._launch_pays(slot) if self._cuda else True
        mark = self._gate.write(GATE_OPEN, stream, True, slot, launch)
        memory = self._free_memory(slot, mark) if slot == self._memory_slot else None
        current.events.append(("open", "", mark, memory))
        self._ranges.open(slot)

    def add_hook_ns(self, ns: int) -> None:
        """Adds time the training thread spent in a hook (gate writes, recording, the
        hook's own bookkeeping) to the iteration being recorded, or the one just ended:
        what harvesting costs the training thread directly. The hooks time themselves
        around everything but the training work they wrap."""
        target = self._hook_target
        if target is not None:
            target.hook_ns += ns

    def timed(self, work: Callable[..., Any], *args: Any) -> Any:
        """`work(*args)`, its time added to the iteration (add_hook_ns): how every hook
        runs its own part, so that what harvesting costs the training thread is counted
        the same way everywhere."""
        t0 = _clock()
        try:
            return work(*args)
        finally:
            self.add_hook_ns(_clock() - t0)

    def compute(
        self,
        label: str,
        stream: Any = None,
        live: Callable[[], bool] | None = None,
        check: Callable[[], None] | None = None,
        since_ns: int | None = None,
    ) -> ComputeAction:
        """A context manager: its block is a compute action. The gate is closed before it
        and, if it was open, reopened after (unless `live()` says the owner closed
        meanwhile). `check()` runs first on entering (it may raise: nothing is written
        then). `since_ns`: a ``time.perf_counter_ns()`` reading from which the hook's time
        counts instead of the entry (the caller's own work for the hook before, such as
        its label, is counted with it)."""
        return ComputeAction(self, label, stream, live, check, since_ns)

    def iteration(
        self,
        stream: Any = None,
        live: Callable[[], bool] | None = None,
        check: Callable[[], None] | None = None,
    ) -> RecordedIteration:
        """A context manager: its block is one recorded iteration. The gate opens at its
        start and closes at its end (unless `live()` says the owner closed meanwhile);
        `check()` runs first on entering (it may raise: nothing is written then)."""
        return RecordedIteration(self, stream, live, check)

    def _launch_pays(self, slot: int) -> bool:
        """Whether an open of `slot` should carry a side launch: yes until the slot's
        length is known, then only if it is at least MIN_LAUNCH_BUBBLE_NS and
        MIN_LAUNCH_BUBBLE_ITEMS of the running task's items. The host backend enqueues
        nothing (its writes are immediate): nothing to look up on its training thread."""
        if not self._cuda:
            return True
        predicted = self._slot_median.get(slot)
        if predicted is None:
            return True
        if predicted < MIN_LAUNCH_BUBBLE_NS:
            return False
        if predicted >= MIN_LAUNCH_BUBBLE_ITEMS * self._ex.running_item_ns:
            return True
        self._item_skips += 1
        return self._item_skips % ITEM_SKIP_PROBE_EVERY == 0

    # -- what iterative tasks ask -----------------------------------------------------------

    def predicted_slot_ns(self, slot: int) -> int | None:
        """Median of the slot's recent durations, once it has been measured. Any thread
        (one dict read: the median is kept as the durations come in)."""
        return self._slot_median.get(slot)

    def known_slots(self) -> list[int]:
        """Slots whose length has been measured."""
        with self._shared:
            return list(self._slot_ns)

    def bubble_stats(self) -> tuple[int, int, int]:
        """(bubble ns per iteration, longest bubble ns, iterations begun): the median of
        each slot's recent lengths, summed and the largest. Any thread."""
        with self._shared:
            medians = list(self._slot_median.values())
        return sum(medians), max(medians, default=0), self._next_index

    # -- resolution ------------------------------------------------------------------------

    def name_task(self, task_id: int, name: str) -> None:
        """Names a task's launches in the report. Only the newest 8192 names are kept
        (a launch is named when its marks resolve, within a flush of its end)."""
        self._task_names[task_id] = name
        if len(self._task_names) > 8192:
            for old in list(self._task_names)[:4096]:
                del self._task_names[old]

    def add_launch_marks(self, task_id: int, phase: int, start: int, end: int, items: int) -> None:
        """A side launch whose marks still have to be resolved."""
        with self._shared:
            self._raw_launches.append((task_id, phase, start, end, items))

    def flush(self, block: bool, timeout: float = 30.0) -> None:
        """Resolves every iteration and launch the device has passed. With `block`, waits
        (up to `timeout` s) until everything recorded so far is resolved: the device has
        passed every recorded iteration, and the executor has taken every launch whose
        end has come or comes without a further open (Executor.wait_launches_taken), in
        that order (a launch the executor starts in a recorded bubble once the device
        gets there is among them). A launch still running on in an open bubble is not
        waited for: a later flush has it once it ended."""
        deadline = time.monotonic() + timeout
        taken = not block
        while True:
            with self._resolving:
                log = self._ex.take_launch_log()
                with self._shared:
                    self._raw_launches.extend(log)
                iterations_done = self._resolve_iterations()
                if block and self._origin_owed is not None:
                    self._settle_origin()
                done = iterations_done and self._resolve_launches()
            if not block or time.monotonic() > deadline:
                return
            if iterations_done and not taken:
                # The executor takes a launch's end on its own thread, which may wait for a
                # core long after the launch ended: a report taken right after an iteration
                # lost the iteration's last launches (all of them, under load).
                self._ex.wait_launches_taken(max(0.0, deadline - time.monotonic()))
                taken = True
                continue
            if done:
                return
            time.sleep(0.001)

    def _elapsed(self, a: int, b: int) -> int | None:
        return self._ex.elapsed_ns(a, b)

    def _gpu_mark_unix_ns(self, origin: int) -> int | None:
        """Unix time of the GPU mark `origin` (one the GPU has passed), for
        merge_with_profiler_trace; clock_origin_source says which way it was found.

        "clock-anchor", the backend's own answer (Executor.mark_unix_ns): a stamp kernel
        on the control stream writes the GPU clock into host memory between two events,
        and a freeride thread watches that word. The wall time the stamp lands, less its
        place after the first event, is that event's wall time, however much training
        work was queued ahead of the stamp; `origin` is that less the GPU time between
        them.

        "probe", only where the anchor gives no answer (a backend without one, or none
        within the time): a probe mark taken now on the control stream (IMMEDIATE), and
        the wall time now less the GPU time from `origin` to the probe. That is exact
        only where the probe is reached at once: with one hardware queue
        (CUDA_DEVICE_MAX_CONNECTIONS=1) the probe waits behind training's whole backlog,
        and the origin comes out early by that wait.

        None if neither answers within CLOCK_ORIGIN_TIMEOUT_S (a device busy beyond
        reason)."""
        deadline = time.monotonic() + CLOCK_ORIGIN_TIMEOUT_S
        at = self._ex.mark_unix_ns(origin, CLOCK_ORIGIN_TIMEOUT_S)
        if at is not None:
            self.clock_origin_source = "clock-anchor"
            return at
        wall = time.time_ns()
        probe = self._ex.mark(IMMEDIATE)
        try:
            while (since := self._elapsed(origin, probe)) is None:
                if time.monotonic() > deadline:
                    return None
                time.sleep(20e-6)
            self.clock_origin_source = "probe"
            return wall - since
        finally:
            self._ex.release_mark(probe)

    def _settle_origin(self) -> None:
        """The record's time 0 on the wall clock, from the origin mark owed (see
        _origin_owed), which then goes back unless it is still the anchor."""
        owed = self._origin_owed
        self._origin_owed = None
        self.clock_origin_unix_ns = self._gpu_mark_unix_ns(owed)
        if self._anchor is None or self._anchor[0] != owed:
            self._ex.release_mark(owed)

    def _resolve_iterations(self) -> bool:
        while self._pending:
            pend = self._pending[0]
            if any(mark == 0 for _, _, mark, _ in pend.events):
                # Recorded while its stream was captured (module doc): nothing to time.
                # The anchor stays the last timed iteration's, so later ones line up.
                for _, _, mark, _ in pend.events:
                    if mark:
                        self._ex.release_mark(mark)
                self._pending.popleft()
                continue
            if self._anchor is None:
                origin_ns = 0
                if self._kind == "host":
                    self.clock_origin_ns = self._elapsed(0, pend.origin)
                    if self.clock_origin_ns is not None:
                        self.clock_origin_unix_ns = self.clock_origin_ns + unix_offset_ns()
                        self.clock_origin_source = "steady-clock"
            else:
                delta = self._elapsed(self._anchor[0], pend.origin)
                if delta is None:
                    return False
                origin_ns = self._anchor[1] + delta
            offsets = []
            for _, _, mark, _ in pend.events:
                rel = self._elapsed(pend.origin, mark)
                if rel is None:
                    return False
                offsets.append(origin_ns + rel)
            if self._anchor is None and self._kind != "host":
                # Only now: every mark of the iteration timed, so the GPU has passed the
                # origin. Its wall time is asked by the next flush that may wait.
                self._origin_owed = pend.origin
            self._iterations.append(self._build(pend, offsets))
            for _, _, mark, _ in pend.events:
                if mark != pend.origin:
                    self._ex.release_mark(mark)
            if self._anchor is not None and self._anchor[0] != self._origin_owed:
                self._ex.release_mark(self._anchor[0])
            self._anchor = (pend.origin, origin_ns)
            self._pending.popleft()
        return True

    def _build(self, pend: _Pending, times: list[int]) -> Iteration:
        it = Iteration(pend.index, times[0], times[-1], hook_ns=pend.hook_ns)
        open_at: int | None = None
        open_mem: int | None = None
        close_at: int | None = None
        label = ""
        slot = 0
        for (kind, lab, _, mem), t in zip(pend.events, times):
            if kind == "open":
                if close_at is not None:
                    it.compute.append(Compute(close_at, t, label))
                    close_at = None
                open_at, open_mem = t, mem
            else:
                if open_at is not None:
                    it.bubbles.append(Bubble(pend.index, slot, open_at, t, open_mem))
                    with self._shared:
                        history = self._slot_ns.setdefault(slot, deque(maxlen=16))
                        history.append(t - open_at)
                        self._slot_median[slot] = _median(history)
                    slot += 1
                    open_at = None
                close_at, label = t, lab
        return it

    def _resolve_launches(self) -> bool:
        if self._anchor is None:
            return True  # nothing to measure them against until an iteration resolves
        anchor, anchor_ns = self._anchor
        with self._shared:
            raw, self._raw_launches = self._raw_launches, []
        left = []
        for task_id, phase, start, end, items in raw:
            a = self._elapsed(anchor, start)
            b = self._elapsed(anchor, end)
            if a is None or b is None:
                left.append((task_id, phase, start, end, items))
                continue
            name = self._task_names.get(task_id, f"task {task_id}")
            self._launches.append(
                SideLaunch(task_id, name, phase, anchor_ns + a, anchor_ns + b, items)
            )
            self._ex.release_mark(start)
            self._ex.release_mark(end)
        with self._shared:
            self._raw_launches[:0] = left
        # Launches older than every kept iteration are no longer needed.
        if self._iterations:
            first = self._iterations[0].start_ns
            while self._launches and self._launches[0].end_ns < first:
                self._launches.popleft()
        return not left

    # -- output ----------------------------------------------------------------------------

    def iterations(self) -> list[Iteration]:
        return list(self._iterations)

    def launches(self) -> list[SideLaunch]:
        return sorted(self._launches, key=lambda launch: launch.start_ns)


def _median(values: Any) -> int:
    """The upper median of a non-empty collection."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def attribute_side_work(iterations: list[Iteration], launches: list[SideLaunch]) -> None:
    """Fills each bubble's `side` with the side work that overlapped it: task id ->
    (items pro-rated by overlap, nanoseconds of overlap)."""
    ordered = sorted(launches, key=lambda launch: launch.start_ns)
    first = 0
    for it in iterations:
        for bubble in it.bubbles:
            bubble.side = {}
            while first < len(ordered) and ordered[first].end_ns <= bubble.start_ns:
                first += 1
            for launch in ordered[first:]:
                if launch.start_ns >= bubble.end_ns:
                    break
                overlap = min(launch.end_ns, bubble.end_ns) - max(launch.start_ns, bubble.start_ns)
                if overlap <= 0:
                    continue
                span = max(1, launch.end_ns - launch.start_ns)
                items, ns = bubble.side.get(launch.task_id, (0.0, 0))
                bubble.side[launch.task_id] = (items + launch.items * overlap / span, ns + overlap)


class ComputeAction:
    """``with recorder.compute(...)``: one compute action (Recorder.compute). A class of
    its own rather than a generator context manager: the training thread enters and
    leaves one around every compute action, and a generator's frame and the
    contextmanager machinery around it cost it about a microsecond a pair."""

    __slots__ = ("_check", "_label", "_live", "_rec", "_since", "_stream")

    def __init__(
        self,
        rec: Recorder,
        label: str,
        stream: Any,
        live: Callable[[], bool] | None,
        check: Callable[[], None] | None,
        since_ns: int | None,
    ) -> None:
        self._rec = rec
        self._label = label
        self._stream = stream
        self._live = live
        self._check = check
        self._since = since_ns

    # add_hook_ns inlined (the iteration the hook's time goes to): a call less each way.

    def __enter__(self) -> None:
        if self._check is not None:
            self._check()
        rec = self._rec
        t0 = _clock() if self._since is None else self._since
        try:
            rec.compute_begin(self._label, self._stream)
        finally:
            target = rec._hook_target
            if target is not None:
                target.hook_ns += _clock() - t0

    def __exit__(self, *exc: object) -> None:
        live = self._live
        if live is None or live():
            rec = self._rec
            t0 = _clock()
            try:
                rec.compute_end(self._stream)
            finally:
                target = rec._hook_target
                if target is not None:
                    target.hook_ns += _clock() - t0


class RecordedIteration:
    """``with recorder.iteration(...)``: one recorded iteration (Recorder.iteration)."""

    __slots__ = ("_check", "_live", "_rec", "_stream")

    def __init__(
        self,
        rec: Recorder,
        stream: Any,
        live: Callable[[], bool] | None,
        check: Callable[[], None] | None,
    ) -> None:
        self._rec = rec
        self._stream = stream
        self._live = live
        self._check = check

    def __enter__(self) -> None:
        if self._check is not None:
            self._check()
        self._rec.timed(self._rec.begin_iteration, self._stream)

    def __exit__(self, *exc: object) -> None:
        if self._live is None or self._live():
            self._rec.timed(self._rec.end_iteration, self._stream)
