"""Side work in the bubbles the host queued ahead of the GPU (issue 27 item 1).

The host runs far ahead of the GPU: by the time the GPU executes an open, training has
queued its wait for a neighbour's data and its next compute. A side launch enqueued only
once the host sees the open take effect lands behind all of that, and with one hardware
queue (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-LM sets it) it cannot start before its
bubble is over. So each stream-ordered open enqueues the running task's launch at once,
at the open's point of host order (Harvester.launches_at_opens).

The GPU tests run tests/gpu_worker.py's `queued_bubbles` in a fresh process for each
connection count (the variable is read when the CUDA context is made): five iterations of
[close, compute, open, a 20 ms "recv" on a comm stream, wait for it, close, compute],
queued by the host behind 100 ms of GPU work, with a Spin task submitted. Side items must
run in those bubbles at a good share of what the open gate runs, for 1 connection and the
default, in a green context and under the occupancy cap (the primary context's side
stream, which RawKernel tasks use). The negative control turns the launches at opens off
(FREERIDE_LAUNCH_AT_OPEN=0) under one connection, where the review (F2) predicts almost
nothing is harvested; if that control fails, the prediction was wrong on that GPU, which
is worth knowing, not a defect of the mechanism under test.

The CPU tests check what decides which opens carry a launch.
"""

import pytest
from gpu_worker import run_worker
from test_recorder import FakeCudaExecutor, _recorder, fake_free_memory

import freeride as fr
from freeride import _C
from freeride._C import GATE_OPEN
from freeride.record.recorder import (
    ITEM_SKIP_PROBE_EVERY,
    MIN_LAUNCH_BUBBLE_ITEMS,
    MIN_LAUNCH_BUBBLE_NS,
)

HARVEST_SHARE = 0.5  # of the open-gate rate over the bubbles' time
OVERHEAD_PCT = 5.0  # of the queue's GPU time without side work


def _queued(connections, reserve, launch_at_open=True):
    env = {}
    if connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    if not launch_at_open:
        env["FREERIDE_LAUNCH_AT_OPEN"] = "0"
    return run_worker("queued_bubbles", {"reserve": reserve}, env=env, timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize("reserve", ["green-context", "occupancy-cap"])
@pytest.mark.parametrize("connections", [1, None], ids=["one-queue", "default-queues"])
def test_side_work_runs_in_bubbles_queued_ahead_of_the_gpu(connections, reserve):
    r = _queued(connections, reserve)
    print(
        f"connections={r['connections']} reserve={r['reserve_mechanism']}: harvest "
        f"{r['harvest_share']:.3f} of the open-gate rate ({r['items_in_bubbles']} items), "
        f"overhead {r['overhead_pct']:.2f}% ({r['queue_ms']:.1f} vs {r['baseline_ms']:.1f} "
        f"ms), launches {r['launches']} ({r['at_opens']} at opens, {r['idle_at_opens']} idle)"
    )
    assert r["queued_ahead"], "the GPU reached the iterations before the host queued them all"
    assert r["launches_at_opens"]
    assert r["at_opens"] >= 5, "an open of the queue carried no launch"
    assert r["harvest_share"] >= HARVEST_SHARE, (
        f"side work ran {r['harvest_share']:.3f} of the open-gate rate in bubbles queued "
        "ahead of the GPU"
    )
    assert r["overhead_pct"] < OVERHEAD_PCT


@pytest.mark.gpu
def test_cancel_returns_before_the_gpu_reaches_the_opens_queued_ahead():
    """Review G3: cancel(wait=True) on the training thread waited until the GPU reached
    every open the host had queued a launch at (a device synchronisation in effect). With
    none of them begun it returns once the stop has landed; they run nothing when their
    opens come (tests/gpu_worker.py's cancel_ahead: four opens behind 300 ms of work)."""
    r = run_worker("cancel_ahead", {}, timeout=120)
    print(
        f"cancel took {r['cancel_s'] * 1e3:.2f} ms with {r['max_lookahead']} opens queued "
        f"ahead (GPU at the first open: {r['reached_at_cancel']}); launches at opens "
        f"{r['at_opens']} ({r['idle_at_opens']} idle)"
    )
    assert r["launches_at_opens"] and r["max_lookahead"] >= 1, r
    assert r["cancelled"] and r["state"] == "cancelled", r
    assert not r["reached_at_cancel"], "the cancel waited for the GPU to reach the opens"
    assert r["cancel_s"] < r["hold_ms"] / 2000, r
    # They ran nothing: no item counted after the GPU went through their opens. (They are
    # not counted idle: a cancelled task's launches never are, the executor's rule that
    # tests/test_launches_in_flight.py's cancel test checks; the H200 run at cf361a5
    # failed on this line, which asserted the opposite.)
    assert r["items_after"] == r["items_at_cancel"], r
    assert r["at_opens"] == r["opens"] and r["idle_at_opens"] == 0, r


@pytest.mark.gpu
def test_a_task_done_in_its_first_bubble_does_not_wait_for_the_opens_queued_ahead():
    """A task done in the first of four bubbles queued ahead: wait() returns once its
    stale launches are inert, before the GPU reaches the last open (tests/gpu_worker.py's
    done_ahead)."""
    r = run_worker("done_ahead", {}, timeout=120)
    print(
        f"done {r['done']} ({r['items_done']} of {r['items']} items); GPU at the last open "
        f"when wait returned: {r['last_open_reached_at_wait']}; launches at opens "
        f"{r['at_opens']} ({r['idle_at_opens']} idle)"
    )
    assert r["done"] and r["state"] == "done" and r["items_done"] == r["items"], r
    assert not r["last_open_reached_at_wait"], "wait() waited for the stale launches' opens"


@pytest.mark.gpu
@pytest.mark.parametrize("follow, withhold", [("0", "0"), ("1", "0"), ("0", "1")])
def test_a_more_urgent_task_takes_the_opens_the_host_writes_while_launches_queued_ahead_drain(
    follow, withhold
):
    """Issue 36's handover (tests/gpu_worker.py's handover_ahead): a more urgent task
    submitted while four launches of the running one are queued ahead of the GPU is armed
    at once, so the next four opens the host writes carry its launches; with followers on
    (FREERIDE_FOLLOW=1) too. Where withheld (FREERIDE_WITHHOLD=1) the four queued ahead
    run the preempted task's items; stopped, they run none unless the stop word's write
    on the control stream shares a hardware queue with them and lands behind them
    (printed, not asserted)."""
    env = {"FREERIDE_FOLLOW": follow, "FREERIDE_WITHHOLD": withhold}
    r = run_worker("handover_ahead", {}, env=env, timeout=120)
    print(
        f"FREERIDE_FOLLOW={follow} FREERIDE_WITHHOLD={withhold}: launches at opens "
        f"{r['at_opens']} ({r['idle_at_opens']} idle) for {r['opens']} + {r['opens']} opens; "
        f"GPU at the first open when armed: {r['reached_at_arm']}; the preempted task's "
        f"items in its {r['opens']} queued ahead: {r['low_items_queued']}; urgent task "
        f"{r['high_state']} ({r['high_items']} of {r['items']})"
    )
    assert r["launches_at_opens"], r
    assert not r["reached_at_arm"], "the GPU reached the opens before the test could arm"
    assert r["high_done"] and r["high_items"] == r["items"], r
    assert r["at_opens"] > r["opens"], "the opens written after the submit carried nothing"
    if withhold == "1":
        assert r["low_items_queued"] > 0, "the withheld launches ran none of their task's items"


@pytest.mark.gpu
def test_negative_control_launches_made_when_the_host_sees_the_open_find_the_bubble_over():
    r = _queued(1, "green-context", launch_at_open=False)
    print(
        f"launches at opens off, one queue: harvest {r['harvest_share']:.3f} "
        f"({r['items_in_bubbles']} items), launches {r['launches']}"
    )
    assert r["queued_ahead"]
    assert not r["launches_at_opens"] and r["at_opens"] == 0
    assert r["harvest_share"] < 0.2, (
        "with launches only when the host sees an open, side work still ran "
        f"{r['harvest_share']:.3f} of the open-gate rate in bubbles queued ahead under one "
        "hardware queue: the review's F2 prediction does not hold on this GPU"
    )


class _Clocked(FakeCudaExecutor):
    """The fake CUDA executor of test_recorder with a settable time between marks, noting
    each open's `launch`."""

    def __init__(self):
        super().__init__()
        self.gap = 1000
        self.opens = []  # (seq, launch)

    def mark(self, stream):
        self.now += self.gap - 1000  # the base class adds 1000
        return super().mark(stream)

    def gate_write(self, value, stream, seq, launch=True):
        if value == GATE_OPEN:
            self.opens.append((seq, launch))
        super().gate_write(value, stream, seq, launch)


def test_a_recorded_open_carries_a_launch_only_where_its_slot_pays_for_one(monkeypatch):
    """Slot 0 (the iteration's start to the first compute action) is long and slot 1
    (between two compute actions with nothing in between) short: once their lengths are
    known, opens of slot 1 carry no launch; before that every open does, as do manual
    opens."""
    fake_free_memory(monkeypatch, lambda device: 1)
    ex = _Clocked()
    rec = _recorder(ex, "cuda", 0)
    for _ in range(6):
        ex.gap = 1000
        rec.begin_iteration(0)
        ex.gap = 3 * MIN_LAUNCH_BUBBLE_NS  # slot 0 ends this long after its open
        rec.compute_begin("a", 0)
        ex.gap = 1000  # slots 1 and 2: a microsecond each
        rec.compute_end(0)
        rec.compute_begin("b", 0)
        rec.compute_end(0)
        rec.end_iteration(0)
        rec.flush(block=True, timeout=5)  # the slots' lengths are learnt
    slot_of = rec._gate.slot_of
    first = [launch for seq, launch in ex.opens[:3]]
    later = {slot_of(seq): launch for seq, launch in ex.opens[-3:]}
    assert first == [True, True, True], "opens before any slot length was known"
    assert rec.predicted_slot_ns(1) < MIN_LAUNCH_BUBBLE_NS <= rec.predicted_slot_ns(0)
    assert later == {0: True, 1: False, 2: False}, later
    rec._gate.open(0)
    assert ex.opens[-1][1] is True


def test_a_slots_prediction_follows_the_bubbles_resolved_since(monkeypatch):
    """The predicted length of each slot is kept as its bubbles resolve, not computed at
    every open: once the slot grows long, the median of its recent bubbles moves past the
    floor, and from then on (after the flush that resolved them, as on a GPU) its opens
    carry launches again; bubble_stats() and predicted_slot_ns() say the same."""
    fake_free_memory(monkeypatch, lambda device: 1)
    ex = _Clocked()
    rec = _recorder(ex, "cuda", 0)

    def iteration(slot_1_ns):
        ex.gap = 1000
        rec.begin_iteration(0)
        ex.gap = 3 * MIN_LAUNCH_BUBBLE_NS
        rec.compute_begin("a", 0)
        ex.gap = slot_1_ns
        rec.compute_end(0)  # slot 1 opens ...
        rec.compute_begin("b", 0)  # ... and lasts slot_1_ns
        rec.compute_end(0)
        rec.end_iteration(0)
        return dict(ex.opens[-3:][1:2])  # {seq: launch} of slot 1's open

    short, long = MIN_LAUNCH_BUBBLE_NS // 10, 4 * MIN_LAUNCH_BUBBLE_NS
    for _ in range(3):
        iteration(short)
        rec.flush(block=True, timeout=5)
    assert list(iteration(short).values()) == [False]
    assert rec.predicted_slot_ns(1) == pytest.approx(short, rel=0.05)
    rec.flush(block=True, timeout=5)
    # Slot 1 now runs long: 5 of its last 9 bubbles long moves the (upper) median.
    for _ in range(5):
        iteration(long)
    assert rec.predicted_slot_ns(1) == pytest.approx(short, rel=0.05)  # not resolved yet
    assert list(iteration(short).values()) == [False]
    rec.flush(block=True, timeout=5)
    assert rec.predicted_slot_ns(1) == pytest.approx(long, rel=0.05)
    bubble_ns, longest, _ = rec.bubble_stats()
    assert longest == rec.predicted_slot_ns(1)
    assert bubble_ns == sum(rec.predicted_slot_ns(k) for k in rec.known_slots())
    assert list(iteration(short).values()) == [True]


def test_a_slot_carries_a_launch_only_if_it_holds_several_of_the_tasks_items(monkeypatch):
    """Review G10: the 50 µs floor ignored how long the task's items are. A block holds
    its SM up to an item past the close, so a slot of 150 µs pays for a task of 10 µs
    items but not for one of 100 µs items (MIN_LAUNCH_BUBBLE_ITEMS of them do not fit);
    the item time is the executor's measurement of the task run last."""
    fake_free_memory(monkeypatch, lambda device: 1)
    ex = _Clocked()
    rec = _recorder(ex, "cuda", 0)
    slot_ns = 3 * MIN_LAUNCH_BUBBLE_NS
    for _ in range(6):
        ex.gap = 1000
        rec.begin_iteration(0)
        ex.gap = slot_ns
        rec.compute_begin("a", 0)
        ex.gap = 1000
        rec.compute_end(0)
        rec.end_iteration(0)
        rec.flush(block=True, timeout=5)
    assert rec.predicted_slot_ns(0) == pytest.approx(slot_ns, rel=0.05)

    def opens_slot_0(item_ns):
        ex.running_item_ns = item_ns
        rec.begin_iteration(0)
        rec.compute_begin("a", 0)
        rec.compute_end(0)
        rec.end_iteration(0)
        return ex.opens[-2][1]  # the iteration's first open: slot 0's

    assert opens_slot_0(0) is True  # no measurement yet: the floor alone
    assert opens_slot_0(10_000) is True
    assert slot_ns < MIN_LAUNCH_BUBBLE_ITEMS * 100_000
    # Skipped, but one in ITEM_SKIP_PROBE_EVERY carries a launch anyway: the item time is
    # measured again, so an estimate too high cannot keep the task out for good.
    carried = [opens_slot_0(100_000) for _ in range(2 * ITEM_SKIP_PROBE_EVERY)]
    assert carried.count(True) == 2, carried


def test_the_launch_rule_at_its_bounds(monkeypatch):
    """Recorder._launch_pays at each bound: a slot of exactly the floor pays (with items
    short enough), one a nanosecond shorter does not; a slot of exactly
    MIN_LAUNCH_BUBBLE_ITEMS items pays, one of one item fewer is skipped (but for the
    one-in-ITEM_SKIP_PROBE_EVERY probe)."""
    fake_free_memory(monkeypatch, lambda device: 1)
    ex = _Clocked()
    rec = _recorder(ex, "cuda", 0)
    ex.running_item_ns = MIN_LAUNCH_BUBBLE_NS // (2 * MIN_LAUNCH_BUBBLE_ITEMS)
    rec._slot_median[0] = MIN_LAUNCH_BUBBLE_NS
    assert rec._launch_pays(0) is True
    rec._slot_median[0] = MIN_LAUNCH_BUBBLE_NS - 1
    assert rec._launch_pays(0) is False
    ex.running_item_ns = MIN_LAUNCH_BUBBLE_NS  # items as long as the floor
    rec._slot_median[0] = MIN_LAUNCH_BUBBLE_ITEMS * ex.running_item_ns
    assert rec._launch_pays(0) is True
    rec._slot_median[0] = (MIN_LAUNCH_BUBBLE_ITEMS - 1) * ex.running_item_ns
    assert [rec._launch_pays(0) for _ in range(ITEM_SKIP_PROBE_EVERY - 1)] == [False] * (
        ITEM_SKIP_PROBE_EVERY - 1
    )


def test_the_executor_measures_the_running_tasks_item_time(host):
    """What the skip above weighs a slot against: the time one worker (a CUDA block) spends
    on one item of the task run last, measured from its launches (here 2 ms Spin items on
    the host backend: each worker's items, timed)."""
    assert host._ex.running_item_ns == 0
    task = host.submit(fr.tasks.Spin(items=8, ns_per_item=2_000_000))
    assert task.wait(30)
    # Wall time per item: at least the item, more where the idle-priority workers wait
    # for a core (a busy machine).
    assert host._ex.running_item_ns >= 2_000_000


def test_the_host_backend_makes_no_launches_at_opens(host):
    assert host.launches_at_opens is False
    task = host.submit(fr.tasks.Spin(items=64, ns_per_item=1000))
    assert task.wait(30)
    counts = host.launch_counts()
    assert counts.launches >= 1 and counts.at_opens == 0 and counts.idle_at_opens == 0


def test_the_report_carries_the_launch_counts_through_a_round_trip(host):
    with host.iteration():
        pass
    rep = host.report()
    assert rep.launch_counts == host.launch_counts()._asdict()
    again = fr.Report.from_dict(rep.to_dict())
    assert again.launch_counts == rep.launch_counts
    assert "side launches" in rep.summary()


def test_a_launchs_item_time_from_its_end_record():
    """The CUDA runner's measurement (freeride/item_time.hpp): a launch of `blocks` blocks
    that finished `items` items in `duration` spent duration x blocks / items per item
    and block; one that finished fewer items than it had blocks says nothing; the
    estimate moves a quarter of the way to each new measurement."""
    T = _C._testing
    assert T.launch_block_item_ns(2_000_000, 100, 1_000) == 200_000
    assert T.launch_block_item_ns(2_000_000, 100, 99) == 0
    assert T.launch_block_item_ns(0, 100, 1_000) == 0
    assert T.launch_block_item_ns(-1, 100, 1_000) == 0
    assert T.launch_block_item_ns(2**62, 2**31, 2**31) == 2**62  # no overflow in the product
    assert T.smoothed_item_ns(0, 800) == 800
    assert T.smoothed_item_ns(800, 0) == 800
    assert T.smoothed_item_ns(800, 1600) == 1000


def test_the_executor_stays_out_of_opens_skipped_for_their_length():
    """Review G10's second half: an open the training thread wrote without a launch (its
    slot too short) must not get the executor's own launch either, which would come a
    host round trip late and land in the next compute. The CUDA backend notes such opens
    by sequence number before it enqueues them; the executor's wait for the gate passes
    over a mirror open under a noted one. The last KEPT are remembered (more than a
    pipeline iteration's opens queued ahead), and sequence number 0 is one like another."""
    skipped = _C._testing.SkippedOpens()
    kept = _C._testing.SkippedOpens.KEPT
    assert kept >= 32
    assert not skipped.contains(0)
    skipped.note(0)
    skipped.note(7)
    assert skipped.contains(0) and skipped.contains(7) and not skipped.contains(8)
    for seq in range(100, 100 + kept - 2):
        skipped.note(seq)
    assert skipped.contains(0) and skipped.contains(100 + kept - 3)
    skipped.note(2**32 - 1)  # the oldest (0) is forgotten
    assert not skipped.contains(0) and skipped.contains(7) and skipped.contains(2**32 - 1)


@pytest.mark.gpu
def test_an_open_written_without_a_launch_gets_none_from_the_executor_either():
    """On a GPU: a 5 ms bubble opened with launch=False (as the recorder opens a slot too
    short for the running task) runs no side launch at all; the same bubble opened with a
    launch runs one. Before, the executor launched into the first one a host round trip
    after the open took effect."""
    import time

    import torch
    from gpu_worker import CYCLES_PER_MS

    torch.cuda.init()
    train = torch.cuda.Stream()
    torch.cuda._sleep(1000)  # loaded before side work runs (a lazy load synchronises)
    torch.cuda.synchronize()
    with fr.Harvester("cuda:0") as h:
        h.gate.close(stream="host")
        t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=20_000))

        def bubble(launch: bool) -> int:
            before = h.launch_counts().launches
            with torch.cuda.stream(train):
                h.gate.write(GATE_OPEN, train, launch=launch)
                torch.cuda._sleep(int(5 * CYCLES_PER_MS))
                h.gate.close(stream=train)
            train.synchronize()
            time.sleep(0.05)  # the executor takes any launch's end
            return h.launch_counts().launches - before

        skipped = bubble(False)
        carried = bubble(True)
        t.cancel()
        assert t.wait(30)
    assert carried >= 1, "the control bubble ran no launch: the test proves nothing"
    assert skipped == 0, f"{skipped} launch(es) in a bubble opened without one"


def test_the_executor_queues_a_successor_only_behind_one_running_launch():
    """Issue 36: a launch that ends at its slice while its bubble goes on can hand over to
    the executor's next launch, already queued behind it, instead of a host round trip.
    The rule (freeride/successor_rule.hpp): switched on, a time slice, one launch pending,
    begun and near its slice's end, items running (progress moved: a launch a stale mirror
    let in must end and start the executor's backoff), the gate open, work left, no stop,
    a task that follows the item protocol. Never behind a launch queued ahead that has not
    begun, never a second one."""
    q = _C._testing.queue_successor
    assert q()
    for off in (
        {"enabled": False},
        {"has_slice": False},
        {"pending": 0},
        {"pending": 2},
        {"newest_running": False},
        {"progressed": False},
        {"gate_open": False},
        {"stopping": True},
        {"phase_done": True},
        {"follows_protocol": False},
    ):
        assert not q(**off), off


@pytest.mark.parametrize(
    "variable, hook, default, on, off",
    [
        ("FREERIDE_SUCCESSORS", "successors_enabled", False, "1", "0"),
        ("FREERIDE_PHASES_AHEAD", "phases_ahead_enabled", False, "1", "0"),
        ("FREERIDE_DEVICE_PHASES", "device_phases_enabled", True, "1", "0"),
        ("FREERIDE_WATCHER_LAUNCH", "watcher_launch_enabled", False, "1", "0"),
        ("FREERIDE_GREEN_WORKQUEUE", "balanced_workqueues_wanted", False, "balanced", "shared"),
    ],
)
def test_switches_read_as_a_harvester_is_made(monkeypatch, variable, hook, default, on, off):
    """FREERIDE_SUCCESSORS, FREERIDE_PHASES_AHEAD (csrc/phase_ahead_rule.hpp),
    FREERIDE_DEVICE_PHASES (csrc/device_phases.hpp), FREERIDE_WATCHER_LAUNCH
    (csrc/watcher_launch_rule.hpp) and FREERIDE_GREEN_WORKQUEUE (the green context's own
    workqueues) are read when a CUDA harvester is made, as FREERIDE_LAUNCH_AT_OPEN is: off
    unless turned on until a GPU run has qualified them, device phases on unless "0"
    (qualified on an H200 at cf361a5); any other value is refused there, naming the
    variable and both values."""
    if not hasattr(_C._testing, hook):
        pytest.skip("this build of freeride has no CUDA backend")
    read = getattr(_C._testing, hook)
    monkeypatch.delenv(variable, raising=False)
    assert read() is default
    monkeypatch.setenv(variable, on)
    assert read() is True
    monkeypatch.setenv(variable, off)
    assert read() is False
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ValueError, match=f"{variable} must be '.+' or '.+'"):
        read()


def test_an_open_behind_another_streams_queued_open_gets_no_launch():
    """Review G11: launches at opens run in order on one side stream, each after its own
    open. An open on stream B while the newest launch still waits for stream A's open
    (not begun) would hold B's launch until A gets there, however far behind A runs: it
    is left out and counted. Opens on the same stream, behind a launch that has begun, or
    behind the executor's own launch queue as before."""
    rule = _C._testing.waits_behind_another_stream
    assert rule(newest_at_open=True, newest_begun=False, same_stream=False)
    assert not rule(newest_at_open=True, newest_begun=False, same_stream=True)
    assert not rule(newest_at_open=True, newest_begun=True, same_stream=False)
    assert not rule(newest_at_open=False, newest_begun=False, same_stream=False)


def test_the_report_shows_opens_left_without_a_launch():
    counts = {"launches": 3, "idle": 1, "at_opens": 2, "idle_at_opens": 0}
    report = fr.Report(device="cuda:0", backend="cuda", launch_counts=counts)
    assert "left without" not in report.summary()
    report = fr.Report(
        device="cuda:0", backend="cuda", launch_counts={**counts, "skipped_at_opens": 4}
    )
    assert "4 opens left without, behind another stream's open" in report.summary()
    assert fr.Report.from_dict(report.to_dict()).launch_counts["skipped_at_opens"] == 4
    report.launch_counts["max_lookahead"] = 12
    assert "up to 12 queued ahead of the GPU" in report.summary()


def test_the_host_backend_queues_nothing_ahead(host):
    """The lookahead (launches at opens queued ahead of the GPU, not yet begun) is a CUDA
    figure: the host backend's writes are immediate, so it reports none."""
    task = host.submit(fr.tasks.Spin(items=64, ns_per_item=1000))
    assert task.wait(30)
    counts = host.launch_counts()
    assert counts.max_lookahead == 0 and counts.skipped_at_opens == 0


@pytest.mark.gpu
def test_opens_on_a_second_stream_behind_a_lagging_one_are_counted_not_queued():
    """On a GPU: stream A is held by a 200 ms kernel, then opens and closes the gate; stream
    B, free, then opens and closes it too, with a Spin task running. B's open finds the
    newest launch at an open waiting for A's (not begun): it is left out and counted."""
    import time

    import torch
    from gpu_worker import CYCLES_PER_MS

    torch.cuda.init()
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda._sleep(1000)  # loaded before side work runs (a lazy load synchronises)
    torch.cuda.synchronize()
    with fr.Harvester("cuda:0") as h:
        h.gate.close(stream="host")
        t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=20_000))
        time.sleep(0.2)  # admitted, and its runner armed for launches at opens
        before = h.launch_counts().skipped_at_opens
        with torch.cuda.stream(a):
            torch.cuda._sleep(int(200 * CYCLES_PER_MS))
            h.gate.open(stream=a)
            torch.cuda._sleep(int(2 * CYCLES_PER_MS))
            h.gate.close(stream=a)
        with torch.cuda.stream(b):
            h.gate.open(stream=b)
            torch.cuda._sleep(int(2 * CYCLES_PER_MS))
            h.gate.close(stream=b)
        skipped = h.launch_counts().skipped_at_opens - before
        torch.cuda.synchronize()
        t.cancel()
        assert t.wait(30)
    assert skipped == 1, skipped
