"""The recorder on a GPU's terms, without a GPU: a fake executor stands in for the CUDA
backend (marks are ids with times, a mark 0 is unknown to it, as to the real one), and
the capture query and free-memory query are faked."""

import time

import pytest

import freeride as fr
from conftest import wait_until
from freeride import _C, gate
from freeride._C import GATE_CLOSED, GATE_OPEN
from freeride.record import recorder
from freeride.record.recorder import Recorder
from freeride.record.report import Report


class FakeCudaExecutor:
    """Marks, gate writes and timings as the CUDA backend answers them."""

    def __init__(self):
        self.now = 0
        self.times: dict[int, int] = {}
        self.next_mark = 1
        self.writes: list[tuple[int, int]] = []
        self.released: list[int] = []
        self.running_item_ns = 0  # Executor.running_item_ns: not measured yet
        # Unix time of the fake clock's 0, for mark_unix_ns (the clock anchor); None: the
        # anchor gives no answer. The marks it was asked about, with their timeouts.
        self.unix_base: int | None = None
        self.unix_asked: list[tuple[int, float]] = []

    def set_recording(self, on):
        pass

    def mark(self, stream):
        self.now += 1000
        mark = self.next_mark
        self.next_mark += 1
        self.times[mark] = self.now
        return mark

    def gate_write(self, value, stream, seq, launch=True):
        self.writes.append((value, stream))

    @staticmethod
    def is_capturing(stream):
        """The CUDA backend's capture query; the `capture` fixture answers it."""
        return False

    def gate_write_marked(self, value, stream, seq, launch=True):
        """As the CUDA backend: no mark on a stream being captured, else the mark before
        an open and after a close."""
        if stream != _C.IMMEDIATE and self.is_capturing(stream):
            self.gate_write(value, stream, seq, launch)
            return 0
        if value == GATE_OPEN:
            mark = self.mark(stream)
            self.gate_write(value, stream, seq, launch)
            return mark
        self.gate_write(value, stream, seq, launch)
        return self.mark(stream)

    def elapsed_ns(self, a, b):
        if a not in self.times or b not in self.times:
            raise ValueError(f"unknown mark {a} or {b}")  # as the CUDA backend does
        return self.times[b] - self.times[a]

    def release_mark(self, mark):
        self.released.append(mark)
        self.times.pop(mark, None)

    def mark_unix_ns(self, mark, timeout):
        if mark not in self.times:
            raise ValueError(f"unknown mark {mark}")  # as the CUDA backend does
        self.unix_asked.append((mark, timeout))
        return None if self.unix_base is None else self.unix_base + self.times[mark]

    def take_launch_log(self):
        return []

    def wait_launches_taken(self, timeout):
        return True


def _recorder(ex, kind, device):
    """A recorder writing through its own gate, as a harvester builds them."""
    return Recorder(gate.Gate(ex, kind, device, lambda: None), ex, kind, device)


def iteration(rec, bubbles=3):
    """One recorded iteration with `bubbles` bubbles (slots), on the default stream."""
    rec.begin_iteration(0)
    for _ in range(bubbles - 1):
        rec.compute_begin("F", 0)
        rec.compute_end(0)
    rec.end_iteration(0)


def fake_free_memory(monkeypatch, free_device_memory):
    """The recorder's query of free device memory (there is no device here)."""
    monkeypatch.setattr(recorder, "free_device_memory", free_device_memory)


@pytest.fixture
def capture(monkeypatch):
    """state["on"] says whether the (fake) stream is being captured; free memory is
    faked too (there is no device to ask)."""
    state = {"on": False, "asked": 0}
    fake_free_memory(monkeypatch, lambda device: 1)

    def capturing(handle):
        state["asked"] += 1
        return state["on"]

    monkeypatch.setattr(FakeCudaExecutor, "is_capturing", staticmethod(capturing))
    return state


def test_iterations_recorded_inside_a_capture_are_left_out(capture):
    """Property: a write inside a capture still writes the gate (it is captured into the
    graph) but takes no timestamp, and the iteration is left out of the record, so
    report() later neither fails on the captured marks nor waits for them."""
    ex = FakeCudaExecutor()
    rec = _recorder(ex, "cuda", 0)
    iteration(rec)
    capture["on"] = True
    marks_before = ex.next_mark
    iteration(rec)
    assert ex.next_mark == marks_before, "a mark was taken on a capturing stream"
    capture["on"] = False
    iteration(rec)
    assert len(ex.writes) == 3 * 6  # every open and close written, captured or not
    rec.flush(block=True, timeout=5)
    its = rec.iterations()
    assert [it.index for it in its] == [0, 2]
    assert all(len(it.bubbles) == 3 and len(it.compute) == 2 for it in its)
    assert its[1].start_ns > its[0].end_ns  # timed against the last timed iteration
    assert capture["asked"] > 0
    Report(device="cuda:0", backend="cuda", iterations=its)  # builds from what was kept


def test_a_capture_that_begins_mid_iteration_leaves_that_iteration_out(capture):
    ex = FakeCudaExecutor()
    rec = _recorder(ex, "cuda", 0)
    iteration(rec)
    rec.begin_iteration(0)
    rec.compute_begin("F", 0)
    taken = ex.next_mark - 1  # marks of this iteration so far, before the capture
    capture["on"] = True
    rec.compute_end(0)
    rec.end_iteration(0)
    capture["on"] = False
    iteration(rec)
    rec.flush(block=True, timeout=5)
    assert [it.index for it in rec.iterations()] == [0, 2]
    # The left-out iteration's own marks are given back, not leaked.
    assert {taken - 1, taken} <= set(ex.released)


def test_the_host_backend_never_asks_about_capture(capture):
    ex = FakeCudaExecutor()
    rec = _recorder(ex, "host", -1)
    ex.elapsed_ns = lambda a, b: 0 if a == 0 else FakeCudaExecutor.elapsed_ns(ex, a, b)
    iteration(rec)
    rec.flush(block=True, timeout=5)
    assert capture["asked"] == 0 and len(rec.iterations()) == 1


def test_a_write_on_the_current_stream_asks_for_it_at_each_write(capture, monkeypatch):
    """stream=None (every hook's default) is the current stream at the time of each
    write, looked up each time (torch.cuda.stream() may change it between two writes);
    any other stream argument is still checked."""
    streams = iter([0x7F00_0000_0001, 0x7F00_0000_0002])
    monkeypatch.setattr(gate, "current_stream", lambda device: next(streams))
    ex = FakeCudaExecutor()
    g = gate.Gate(ex, "cuda", 0, lambda: None)
    assert g.write(GATE_CLOSED, None, mark=True) > 0
    g.write(GATE_OPEN, None)
    assert ex.writes == [(GATE_CLOSED, 0x7F00_0000_0001), (GATE_OPEN, 0x7F00_0000_0002)]
    with pytest.raises(ValueError, match="raw stream handle"):
        g.write(GATE_CLOSED, 12345)


def test_attachs_wrapper_counts_its_test_and_label_as_hook_time(capture):
    """attach()'s wrapper times itself from its first step: whether the call computes and
    its label are the hook's work, as the gate writes are (one span, not one each)."""
    from freeride.attach import _compute_wrapper

    def computes(args, kwargs):
        time.sleep(0.002)
        return args[0]

    def label(args, kwargs):
        time.sleep(0.002)
        return "F"

    rec = _recorder(FakeCudaExecutor(), "cuda", 0)
    wrapped = _compute_wrapper(rec, label, computes)(lambda computes: "ran")
    rec.begin_iteration(0)
    assert wrapped(True) == "ran"  # the test, the label and a compute action
    assert wrapped(False) == "ran"  # the test alone
    rec.end_iteration(0)
    rec.flush(block=True, timeout=5)
    (it,) = rec.iterations()
    assert [c.label for c in it.compute] == ["F"]
    assert it.hook_ns >= 3 * 2_000_000


def test_free_memory_is_sampled_once_per_iteration_over_the_slots_in_turn(capture, monkeypatch):
    """Property: cudaMemGetInfo (freeride's own, in relaxed capture mode) runs once per recorded iteration (not at every open), at
    one bubble's start, the slots taking turns, so every slot's mean free memory is
    still reported from values taken at that slot's start; the other bubbles have None."""
    asked = []

    def free_device_memory(device):
        asked.append(device)
        return 1000 * len(asked)

    fake_free_memory(monkeypatch, free_device_memory)
    ex = FakeCudaExecutor()
    rec = _recorder(ex, "cuda", 3)
    for _ in range(7):
        iteration(rec, bubbles=3)
    assert asked == [3] * 7
    rec.flush(block=True, timeout=5)
    its = rec.iterations()
    sampled = [[b.slot for b in it.bubbles if b.free_memory is not None] for it in its]
    # The first iteration knows no bubble count yet: slot 0; then iteration i samples
    # slot i mod 3.
    assert sampled == [[0], [1], [2], [0], [1], [2], [0]]
    per_slot = Report(device="cuda:0", backend="cuda", iterations=its).per_slot
    assert all(s["mean_free_memory"] is not None for s in per_slot)


def test_no_free_memory_is_sampled_inside_a_capture(capture, monkeypatch):
    asked = []
    fake_free_memory(monkeypatch, lambda d: asked.append(d) or 1)
    rec = _recorder(FakeCudaExecutor(), "cuda", 0)
    capture["on"] = True
    iteration(rec)
    assert asked == []


def test_gate_write_and_mark_bindings_reach_the_backend_on_both_paths(host):
    """The bindings keep the GIL for stream-ordered writes and marks and release it only
    for immediate writes; both paths must still reach the backend."""
    ex = host._ex
    ex.gate_write(_C.GATE_CLOSED, 0, 7)
    assert ex.gate_read() == _C.GATE_CLOSED and ex.gate_seq() == 7
    ex.gate_write(_C.GATE_OPEN, _C.IMMEDIATE, 8)
    assert ex.gate_read() == _C.GATE_OPEN and ex.gate_seq() == 8
    a, b = ex.mark(0), ex.mark(_C.IMMEDIATE)
    assert ex.elapsed_ns(a, b) >= 0
    ex.release_mark(a)
    ex.release_mark(b)
    # The gate's marked write (the recorder's, on the training thread): one call for the
    # write and its mark, on both paths.
    closed = ex.gate_write_marked(_C.GATE_CLOSED, 0, 9)
    assert closed > 0 and ex.gate_read() == _C.GATE_CLOSED and ex.gate_seq() == 9
    opened = ex.gate_write_marked(_C.GATE_OPEN, _C.IMMEDIATE, 10, launch=False)
    assert opened > 0 and ex.gate_read() == _C.GATE_OPEN and ex.gate_seq() == 10
    assert ex.elapsed_ns(closed, opened) >= 0
    ex.release_mark(closed)
    ex.release_mark(opened)


def test_gpu_record_takes_its_wall_clock_origin_from_the_clock_anchor(capture):
    """merge_with_profiler_trace needs the record's time 0 on the wall clock. On a GPU the
    marks are CUDA events: the backend places the first iteration's open on the wall clock
    (Executor.mark_unix_ns, the clock anchor), once the iteration has resolved. No probe
    mark is taken then."""
    ex = FakeCudaExecutor()
    ex.unix_base = 10**18
    rec = _recorder(ex, "cuda", 0)
    iteration(rec)
    marks = ex.next_mark
    rec.flush(block=True, timeout=1.0)
    origin = 1  # the iteration's first mark
    assert ex.unix_asked == [(origin, recorder.CLOCK_ORIGIN_TIMEOUT_S)]
    assert rec.clock_origin_unix_ns == 10**18 + ex.times[origin]
    assert rec.clock_origin_source == "clock-anchor"
    assert ex.next_mark == marks  # no probe
    rec.flush(block=True, timeout=1.0)
    assert len(ex.unix_asked) == 1  # asked once, for the first iteration only


def test_gpu_origin_is_asked_for_only_once_the_gpu_passed_the_iteration(capture):
    """A flush while the first iteration's marks are still ahead of the GPU (a backlog
    flush on the training thread, flush(block=False)) does not ask for the origin, which
    would wait there for the GPU to get to it."""

    class Behind(FakeCudaExecutor):
        reached = False

        def elapsed_ns(self, a, b):
            return super().elapsed_ns(a, b) if self.reached else None

    ex = Behind()
    ex.unix_base = 10**18
    rec = _recorder(ex, "cuda", 0)
    iteration(rec)
    rec.flush(block=False)
    assert ex.unix_asked == [] and rec.clock_origin_unix_ns is None
    assert rec.clock_origin_source is None
    ex.reached = True
    rec.flush(block=True, timeout=1.0)
    assert ex.unix_asked == [(1, recorder.CLOCK_ORIGIN_TIMEOUT_S)]
    assert rec.clock_origin_unix_ns == 10**18 + ex.times[1]


def test_gpu_origin_is_asked_only_by_a_flush_that_may_wait(capture):
    """The origin's wall time may wait for the control stream behind training's backlog
    (one hardware queue: up to CLOCK_ORIGIN_TIMEOUT_S): a flush that may not wait (the
    training thread's backlog flush, bubble_stats) leaves it owed, even with the GPU past
    the iteration, and keeps its mark (not released as an old anchor) for the next flush
    that may wait, which asks once and then lets the mark go, once."""
    ex = FakeCudaExecutor()
    ex.unix_base = 10**18
    rec = _recorder(ex, "cuda", 0)
    origin = ex.next_mark  # the first iteration's first mark
    iteration(rec)
    rec.flush(block=False)
    assert len(rec.iterations()) == 1  # resolved...
    assert ex.unix_asked == [] and rec.clock_origin_unix_ns is None  # ...but not asked
    iteration(rec)
    iteration(rec)
    rec.flush(block=False)
    assert len(rec.iterations()) == 3 and ex.unix_asked == []
    assert origin not in ex.released and origin in ex.times  # kept for the answer
    rec.flush(block=True, timeout=1.0)
    assert ex.unix_asked == [(origin, recorder.CLOCK_ORIGIN_TIMEOUT_S)]
    assert rec.clock_origin_unix_ns == 10**18 + 1000  # the fake clock's first mark
    assert ex.released.count(origin) == 1
    rec.flush(block=True, timeout=1.0)
    assert len(ex.unix_asked) == 1 and ex.released.count(origin) == 1


def test_gpu_record_falls_back_to_a_probe_where_the_anchor_gives_no_answer(capture, monkeypatch):
    """Where mark_unix_ns gives no answer, a probe mark on the control stream, taken when
    the first iteration resolves, ties the marks to time.time_ns(): exact only where the
    probe is reached at once. Here the fake GPU is 5 ms past the iteration's start when
    the probe is taken."""
    ex = FakeCudaExecutor()
    rec = _recorder(ex, "cuda", 0)
    iteration(rec)
    ex.now += 5_000_000  # the GPU time between the iteration's last mark and now
    monkeypatch.setattr(recorder.time, "time_ns", lambda: 10**18)
    origin = 1  # the iteration's first mark
    origin_at = ex.times[origin]
    probes = []
    mark = ex.mark

    def probe(stream):
        probes.append((stream, mark(stream)))
        return probes[-1][1]

    monkeypatch.setattr(ex, "mark", probe)
    rec.flush(block=True, timeout=1.0)
    [(stream, probe_mark)] = probes
    assert stream == _C.IMMEDIATE  # the control stream, idle: reached at once
    probe_at = ex.now  # the fake clock as the probe mark set it
    assert rec.clock_origin_unix_ns == 10**18 - (probe_at - origin_at)
    assert rec.clock_origin_source == "probe"
    assert ex.unix_asked == [(origin, recorder.CLOCK_ORIGIN_TIMEOUT_S)]  # asked first
    assert probe_mark in ex.released  # the probe mark went back


def test_gpu_record_has_no_origin_where_neither_way_answers_in_time(capture, monkeypatch):
    """The anchor gives no answer and the probe is never reached: no origin, within
    CLOCK_ORIGIN_TIMEOUT_S for both ways together, and the probe mark goes back."""

    class Stuck(FakeCudaExecutor):
        def elapsed_ns(self, a, b):
            if self.probe in (a, b):
                return None
            return super().elapsed_ns(a, b)

        def mark(self, stream):
            made = super().mark(stream)
            if stream == _C.IMMEDIATE:
                self.probe = made
            return made

    ex = Stuck()
    ex.probe = -1
    monkeypatch.setattr(recorder, "CLOCK_ORIGIN_TIMEOUT_S", 0.05)
    rec = _recorder(ex, "cuda", 0)
    iteration(rec)
    began = time.monotonic()
    rec.flush(block=True, timeout=5.0)
    assert time.monotonic() - began < 2.0
    assert rec.clock_origin_unix_ns is None and rec.clock_origin_source is None
    assert ex.probe in ex.released
    assert len(rec.iterations()) == 1  # the record itself is whole


def test_host_mark_unix_ns_binding(host):
    """Executor.mark_unix_ns on the host backend: a steady-clock mark on the wall clock,
    at once; bad timeouts and unknown marks are refused with ValueError."""
    ex = host._ex
    before = time.time_ns()
    mark = ex.mark(_C.IMMEDIATE)
    after = time.time_ns()
    at = ex.mark_unix_ns(mark, 0.0)
    assert before - 1_000_000 <= at <= after + 1_000_000
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            ex.mark_unix_ns(mark, bad)
    ex.release_mark(mark)
    with pytest.raises(ValueError, match="unknown mark"):
        ex.mark_unix_ns(mark, 1.0)


def test_host_record_origin_is_the_steady_clock_on_the_wall_clock(host):
    """The host backend's origin stays the steady clock's (exact): the first iteration's
    open, between the wall-clock readings around it."""
    before = time.time_ns()
    with host.iteration():
        after = time.time_ns()
    report = host.report()
    assert host._recorder.clock_origin_source == "steady-clock"
    assert before - 1_000_000 <= report.clock_origin_unix_ns <= after + 1_000_000


def test_bubble_stats_predict_from_the_recorded_iterations(host):
    """Before any iteration nothing is predicted; after a few, the per-iteration bubble
    time is the sum of the slots' medians and the longest bubble one of them."""
    assert tuple(host.bubble_stats()) == (0, 0, 0)
    for _ in range(4):
        with host.iteration():
            time.sleep(0.004)  # slot 0
            with host.compute():
                time.sleep(0.002)
            time.sleep(0.008)  # slot 1
    host.report()  # resolves what was recorded
    stats = host.bubble_stats()
    assert stats.iterations == 4
    assert 0.008e9 <= stats.longest_ns < stats.per_iteration_ns
    assert stats.per_iteration_ns >= 0.012e9


def test_submit_names_a_task_in_the_report(host):
    with host.iteration():
        named = host.submit(fr.tasks.Spin(4, 1000), name="my side job")
        plain = host.submit(fr.tasks.Spin(4, 1000))
        assert named.wait(timeout=30) and plain.wait(timeout=30)
    names = {launch.task_id: launch.task for launch in host.report().launches}
    assert names[named.id] == "my side job"
    assert names[plain.id] == repr(plain.task)
    with pytest.raises(TypeError, match="name must be a str"):
        host.submit(fr.tasks.Spin(1, 1), name=5)


# -- side launches whose end the executor takes late -----------------------------------------

# How late the executor takes each launch's end where a test asks for it: far longer than
# a training thread takes from closing the gate to asking for its report.
LATE_END_MS = 500


@pytest.fixture
def late_launch_ends():
    """The host executor takes every launch's end LATE_END_MS after its workers left it
    (_C._testing.delay_launch_end), as its idle-priority thread does on a machine whose
    cores are all busy."""
    _C._testing.delay_launch_end(LATE_END_MS)
    try:
        yield
    finally:
        _C._testing.delay_launch_end(0)


def _items_in_a_bubble(h, handle, at_least=10):
    """One recorded iteration, one bubble: open until the task has run `at_least` items."""
    with h.iteration():
        wait_until(lambda: handle.items_done >= at_least, timeout=30.0)


def test_report_has_the_launches_whose_end_the_executor_has_not_taken(late_launch_ends):
    """Property: every item a launch ran in a recorded bubble is in the report taken right
    after the iteration, although the executor takes the launch's end only later (under
    load the report used to list no launch while items_done > 0)."""
    with fr.Harvester("cpu", workers=1) as h:
        h.gate.close()
        handle = h.submit(fr.tasks.ItemCounter(10**6, ns_per_item=20_000))
        _items_in_a_bubble(h, handle)
        rep = h.report()
        done = handle.items_done  # the gate is closed: no item runs any more
        assert done >= 10
        assert rep.launches, "the bubble's launch is missing from the report"
        assert rep.items_per_task == {handle.id: done}
        [it] = rep.iterations
        assert all(it.start_ns <= x.start_ns < it.end_ns for x in rep.launches)
        # Each launch spans its items, one worker running them one after another: from
        # its workers' first item start to their last item end.
        assert all(x.end_ns - x.start_ns >= 20_000 * x.items for x in rep.launches)
        # Drawn in the bubble (pro-rated: its last item may end after the close).
        side = sum(b.side.get(handle.id, (0.0, 0))[0] for b in it.bubbles)
        assert 0 < side <= done


def test_the_report_waits_only_for_launches_whose_end_has_come():
    """Executor.wait_launches_taken, which report() calls, on the host: a launch running
    on in an open bubble is not waited for (a report taken then does not wait for the
    task to finish); once the gate closes its end has come, and the wait lasts until the
    executor has taken it, here held back until the test lets it go."""
    with fr.Harvester("cpu", workers=1) as h:
        handle = h.submit(fr.tasks.ItemCounter(10**6, ns_per_item=20_000))
        wait_until(lambda: handle.items_done > 0)  # the gate is open: it runs on
        _C._testing.delay_launch_end(60_000)
        try:
            assert h._ex.wait_launches_taken(0.0)
            h.gate.close()
            assert not h._ex.wait_launches_taken(0.0)  # ended, its end not taken
            assert not h._ex.wait_launches_taken(0.05)
            assert h.launch_counts().launches == 0
        finally:
            _C._testing.delay_launch_end(0)
        assert h._ex.wait_launches_taken(30.0)
        assert h.launch_counts().launches == 1  # taken by the time the wait returned


def test_a_compute_action_that_failed_to_enter_leaves_the_next_one_whole(host):
    """A compute action whose gate write raised (here a stream that is no stream) was not
    entered: the next one closes the gate as usual. Before, the failed one stayed counted
    as entered, and every later compute action ran nested in it, with the gate open."""
    with pytest.raises(ValueError), host.compute(stream=12345):
        pass
    with host.iteration():
        assert host.gate.is_open
        with host.compute():
            assert not host.gate.is_open
        assert host.gate.is_open
