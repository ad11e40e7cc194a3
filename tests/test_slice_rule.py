"""How long a side launch may claim items (freeride/slice.h), checked on the CPU.

Past its time slice a launch claims on only while the close that ends its bubble is
already in the GPU's queues: a device-wide synchronisation then waits for that close
anyway. If a launch ran on while the host had not enqueued that close, a synchronisation
the host issues (cudaFree inside an allocation, torch.cuda.synchronize, empty_cache)
would wait for a launch that only the blocked host could end: training deadlocks. These
tests drive the host's close ledger (csrc/cuda/close_ledger.hpp) against a model of the
device's close slots, and ask the kernels' own decision (the same host-device functions
the kernels compile) at claims, over the three cases the 2026-11-26 review found
deadlocking (G1) and the valid one. The GPU tests in test_slice_gpu.py run the same
cases on a device.
"""

import itertools

import pytest

import freeride as fr
from freeride import _C

T = _C._testing
SLICE = 2_000_000  # ns
PAST = 3 * SLICE  # past the slice, within the bound on running on
WITHIN, EXTENDABLE, OVER = 0, 1, 2


def claims_past_slice(model: "T.CloseModel") -> bool:
    """Whether a block of a launch past its slice, the gate reading open, claims."""
    return model.may_claim(True, PAST, SLICE)


def test_valid_case_close_enqueued_not_executed_lets_the_launch_run_on():
    """The launch's bubble opened, the host has enqueued the bubble's close: it is pending,
    and a block past its slice claims on until it takes effect, then stops."""
    m = T.CloseModel()
    m.enqueue_close()  # the close before the bubble
    m.execute()
    assert not claims_past_slice(m)  # no close of this bubble enqueued yet: the slice bounds
    m.enqueue_close()  # the host enqueues the bubble's close
    assert m.pending and claims_past_slice(m)
    m.execute()
    assert not m.pending and not claims_past_slice(m)


def test_close_and_open_passing_unseen_mid_item_do_not_extend_the_next_bubble():
    """Review G1, case 1: a compute action shorter than the item in flight (DeepSpeed's
    ReduceTiedGrads without tied modules) closes and reopens the gate while a block is
    inside an item; it never sees the gate closed. The count of closes changed since the
    launch, so the old rule ran on, without a slice, into a bubble whose close the host
    had not enqueued. Now the close has executed: nothing is pending, the slice bounds."""
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()
    # The launch at bubble j's open runs; the host enqueues close j+1 and open j+1.
    m.enqueue_close()
    m.execute()  # takes effect while the block is mid-item: unseen
    assert not m.pending
    assert not claims_past_slice(m)
    # Later the host enqueues the next close: the launch may run on until it.
    m.enqueue_close()
    assert claims_past_slice(m)


def test_immediate_close_is_never_pending():
    """Review G1, case 2: an immediate close (gate.close("host"), attach()'s) counted while
    a launch at an open was queued ahead made that launch, once it began, run without a
    slice. An immediate close has taken effect when it returns and carries no ordinal:
    the backend never gives it to the ledger, so it leaves what a launch decides as it
    was (the model has nothing to enqueue for it)."""
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()
    latest = m.latest
    # (the immediate close happens here: no ledger call, no slot write)
    assert m.latest == latest and not m.pending
    assert not claims_past_slice(m)


def test_close_on_another_stream_that_executed_is_not_pending():
    """Review G1, case 3: a close on another stream that executes before the launch's
    open changed the count; the old rule then ran on. Executed, it is not pending."""
    m = T.CloseModel()
    m.enqueue_close(stream=1)
    m.execute(stream=1)
    assert not claims_past_slice(m)


def test_an_older_close_executing_late_on_another_stream_does_not_read_as_pending():
    """Closes on two streams execute out of the order they were enqueued: the latest
    executes first, then an older one. A single 'last executed' word would then hold the
    older ordinal and read as pending for ever (a launch running on with no close
    coming); each ordinal has its slot, so the latest still reads as executed."""
    m = T.CloseModel()
    m.enqueue_close(stream=0)  # older, on a lagging stream
    m.enqueue_close(stream=1)  # the latest
    assert m.pending
    m.execute(stream=1)
    assert not m.pending
    m.execute(stream=0)
    assert not m.pending and not claims_past_slice(m)


def test_a_close_captured_into_a_graph_carries_no_ordinal():
    """A close written into a graph capture runs only when (if ever) the graph is
    replayed, and a replay would write its captured ordinal again much later, over a
    newer close's slot: it is not counted, so it neither reads as pending nor disturbs
    the slots."""
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()
    latest = m.latest
    m.enqueue_close(captured=True)
    assert m.latest == latest and not m.pending
    m.execute()  # the replay
    assert m.latest == latest and not m.pending


def test_a_close_whose_enqueue_failed_is_never_pending():
    """The ordinal is published only once the close is in its stream: a failed enqueue
    leaves nothing that would read as pending for ever."""
    m = T.CloseModel()
    with pytest.raises(RuntimeError, match="enqueue failed"):
        m.enqueue_close(fail=True)
    assert m.latest == 0 and not m.pending
    m.enqueue_close()
    assert m.latest == 1 and m.pending


def test_many_closes_in_flight_on_one_stream():
    """More closes queued ahead than there are slots (a host far ahead of the GPU): the
    latest reads as pending until it, the last in its stream, has executed."""
    m = T.CloseModel()
    for _ in range(10):
        m.enqueue_close()
    for _ in range(9):
        m.execute()
        assert m.pending
    m.execute()
    assert not m.pending


def test_slice_time_bounds_running_on_to_max_slices():
    """Review G4: running on is bounded, to MAX_SLICES slices from the launch's start, so
    that a training kernel larger than the reserve launched in a bubble on another stream
    gets the GPU within that bound even while the bubble's close is pending."""
    n = _C.MAX_SLICES
    assert n == 8
    assert T.slice_time(0, SLICE) == WITHIN
    assert T.slice_time(SLICE - 1, SLICE) == WITHIN
    assert T.slice_time(SLICE, SLICE) == EXTENDABLE
    assert T.slice_time(n * SLICE - 1, SLICE) == EXTENDABLE
    assert T.slice_time(n * SLICE, SLICE) == OVER
    assert T.slice_time(2**64 - 1, 2**64 - 1) == EXTENDABLE  # no overflow in the bound
    assert T.slice_time(2**64 - 1, 1) == OVER
    assert T.slice_time(10**15, 0) == WITHIN  # time_slice=None: no slice, no bound
    m = T.CloseModel()
    m.enqueue_close()
    assert m.pending
    assert m.may_claim(True, n * SLICE - 1, SLICE)
    assert not m.may_claim(True, n * SLICE, SLICE)
    assert not m.may_claim(False, 0, SLICE)  # a closed gate: never


@pytest.mark.parametrize("most", [1, 2, 32, 2**32 - 1])
def test_the_bound_is_the_launchs_max_slices(most):
    """Harvester(max_slices=N) bounds running on to N slices (fr_item_ctx.max_slices; 0
    is the default, MAX_SLICES): 1 is no running on at all past the slice."""
    assert T.slice_time(SLICE, SLICE, most) == (OVER if most == 1 else EXTENDABLE)
    assert T.slice_time(most * SLICE - 1, SLICE, most) == (WITHIN if most == 1 else EXTENDABLE)
    assert T.slice_time(most * SLICE, SLICE, most) == OVER
    assert T.slice_time(2**64 - 1, 2**64 - 1, most) == (OVER if most == 1 else EXTENDABLE)
    m = T.CloseModel()
    m.enqueue_close()
    assert m.may_claim(True, most * SLICE - 1, SLICE, most)
    assert not m.may_claim(True, most * SLICE, SLICE, most)
    # The default, spelt out or not.
    n = _C.MAX_SLICES
    assert m.may_claim(True, n * SLICE - 1, SLICE, 0) and not m.may_claim(True, n * SLICE, SLICE, 0)


def test_harvester_reports_the_bound():
    with fr.Harvester("cpu", workers=1, time_slice=0.002) as h:
        assert h.max_slices == _C.MAX_SLICES
        assert h.slice_bound == pytest.approx(0.002 * _C.MAX_SLICES)
    with fr.Harvester("cpu", workers=1, time_slice=0.002, max_slices=32) as h:
        assert h.max_slices == 32
        assert h.slice_bound == pytest.approx(0.064)
    with fr.Harvester("cpu", workers=1, time_slice=None) as h:
        assert h.slice_bound is None


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, "max_slices must be >= 1"),
        (10_001, ValueError, "max_slices must be <= 10000"),
        (2.5, TypeError, "max_slices must be an integer"),
        (True, TypeError, "max_slices must be an integer"),
    ],
)
def test_a_bad_max_slices_is_refused(value, error, match):
    with pytest.raises(error, match=match):
        fr.Harvester("cpu", workers=1, max_slices=value)


# A launch never runs in two bubbles (freeride/slice.h: closed_since). On an H200
# (2026-11-27, commit cf361a5) tests/test_hardware_queues.py hung: with time_slice=None
# and 100 us items, a close and the next open both took effect while blocks were inside
# an item, so the launch ran on into the next bubble; that bubble's own launch, enqueued
# at its open, waited behind it on the stream, and under one hardware queue every
# training kernel after it waited too, for a close that training could enqueue only
# after them.
NO_SLICE = 0  # time_slice=None
LONG = 10**15  # ns: any time at all


def test_a_close_executed_since_the_launch_began_ends_it_though_the_gate_reopened():
    """The launch at bubble j's open began; bubble j's close executes unseen (mid-item) and
    bubble j+1's open reopens the gate. Every later claim of that launch is refused:
    within its slice, past it with bubble j+1's close pending, and with no slice at all.
    The launch at bubble j+1's open, which begins once it has left, claims."""
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()  # the close before bubble j
    m.begin_block()
    assert m.may_claim(True, 0, SLICE) and m.may_claim(True, LONG, NO_SLICE)
    m.enqueue_close()
    m.execute()  # bubble j's close: unseen, the gate is open again
    assert m.closed_since_start
    m.enqueue_close()  # bubble j+1's close, enqueued: pending
    assert m.pending
    assert not m.may_claim(True, 0, SLICE)
    assert not m.may_claim(True, PAST, SLICE)
    assert not m.may_claim(True, LONG, NO_SLICE)
    m.end_launch()
    m.begin_block()  # bubble j+1's launch
    assert not m.closed_since_start
    assert m.may_claim(True, 0, SLICE) and m.may_claim(True, PAST, SLICE)
    assert m.may_claim(True, LONG, NO_SLICE)


def test_the_launch_keeps_its_earliest_look():
    """A block that becomes resident only after the close executed (another block left,
    or training's kernels held the SMs) looks at slots that already show it: the launch
    keeps the earliest look, so that block claims nothing either."""
    m = T.CloseModel()
    m.begin_block()  # the first block, before any close (the slots all 0)
    m.enqueue_close()
    m.execute()
    m.begin_block()  # a late block
    assert m.closed_since_start and not m.may_claim(True, 0, SLICE)


def test_the_word_falls_with_every_close_in_any_slot():
    """closes_word changes with every close that writes a slot, from the zeros the slots
    start with and as each slot's ordinal is replaced by the one four closes later; and
    it is never 0 (the launch's 'not looked yet') over these."""
    slots = [0, 0, 0, 0]
    words = [T.closes_word(*slots)]
    for ordinal in range(1, 14):
        slots[ordinal % 4] = ordinal
        words.append(T.closes_word(*slots))
    assert all(b < a for a, b in itertools.pairwise(words)), words
    assert 0 not in words


def test_a_close_without_an_ordinal_ends_no_launch():
    """A close captured into a graph writes no slot (its replay could not be told from a
    stale one), and an immediate close gives the ledger nothing: neither ends a launch
    this way (the gate itself still stops it while it reads closed)."""
    m = T.CloseModel()
    m.begin_block()
    m.enqueue_close(captured=True)
    m.execute()
    assert not m.closed_since_start and m.may_claim(True, 0, SLICE)


def test_a_close_on_another_stream_ends_the_launch_early_not_late():
    """With gate writes on two streams a close of the other stream executing ends the
    launch too: its bubble's rest goes to the launch after it, never one bubble more."""
    m = T.CloseModel()
    m.begin_block()
    m.enqueue_close(stream=1)
    m.execute(stream=1)
    assert m.closed_since_start and not m.may_claim(True, 0, SLICE)


def test_a_launch_that_has_not_looked_goes_without_the_rule():
    """0 is 'no look yet' (a context without close slots never looks): the claim is
    decided as before, by the gate, the slice and whether a close is pending."""
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()
    assert not m.closed_since_start and m.may_claim(True, 0, SLICE)


def test_a_launch_made_at_an_open_ends_with_its_bubble_however_late_it_begins():
    """Bubble j's launch is queued behind the one before it on its stream and begins only
    when that has left: after bubble j's close and bubble j+1's open have both taken
    effect (a bubble and the compute after it shorter than an item). Its first look
    already shows that close, but the host told it its bubble's close's ordinal at the
    open: it claims nothing, with or without a slice, and bubble j+1's launch, made at its
    own open, claims."""
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()  # the close before bubble j
    m.launch_at_open()  # bubble j's open: its launch enqueued, not begun
    m.enqueue_close()
    m.execute()  # bubble j's close
    # bubble j+1's open takes effect; bubble j's launch begins only now
    m.begin_block()
    assert not m.closed_since_start  # its own look cannot tell
    assert m.bubble_over
    assert not m.may_claim(True, 0, SLICE) and not m.may_claim(True, LONG, NO_SLICE)
    m.end_launch()
    m.launch_at_open()  # bubble j+1's launch, made at its open
    m.begin_block()
    assert not m.bubble_over and m.may_claim(True, LONG, NO_SLICE)
    m.enqueue_close()  # bubble j+1's close, pending: the launch runs on past its slice
    assert m.may_claim(True, PAST, SLICE)
    m.execute()
    assert m.bubble_over and not m.may_claim(True, 0, SLICE)


def test_a_close_of_another_stream_enqueued_after_the_open_ends_the_bubble_early():
    """The ordinal after the open may go to a close on another stream: once that executes
    the launch ends, early, never a bubble late; one enqueued before the open does not."""
    m = T.CloseModel()
    m.enqueue_close(stream=1)  # before the open
    m.launch_at_open()
    m.begin_block()
    m.execute(stream=1)
    assert not m.bubble_over  # (its first look, taken before, ends it by itself)
    m.end_launch()
    m.launch_at_open()
    m.begin_block()
    m.enqueue_close(stream=1)
    m.enqueue_close(stream=0)  # the bubble's own close
    m.execute(stream=1)
    assert m.bubble_over


def test_the_executors_launch_ends_with_its_bubble_though_made_after_its_close_was_enqueued():
    """The executor launches for an open once the gate's mirror reads it open: by then a
    host running ahead has enqueued that bubble's close, and under one hardware queue the
    launch may begin only after the close has executed (behind training's queued work),
    with the gate open again for the next bubble. Its own look cannot tell; the ordinal
    noted as the open was written (OpenOrdinals) ends it with its bubble."""
    m, opens = T.CloseModel(), T.OpenOrdinals()
    m.enqueue_close()
    m.execute()  # the close before bubble j
    opens.note(7, m.next_ordinal)  # bubble j's open, number 7, written
    m.enqueue_close()  # bubble j's close: the host runs ahead
    m.execute()  # ... and it takes effect before the executor's launch begins
    m.launch_for(opens.next_close(7))
    m.begin_block()
    assert not m.closed_since_start and m.bubble_over
    assert not m.may_claim(True, 0, SLICE) and not m.may_claim(True, LONG, NO_SLICE)
    m.end_launch()
    m.launch_for(0)  # an open none was noted for: its own look alone, as before
    m.begin_block()
    assert m.may_claim(True, LONG, NO_SLICE)


def test_a_launch_for_an_open_with_no_ordinal_keeps_a_slice_under_time_slice_none():
    """The executor's or the watcher's launch for an open none was noted for (an open
    replayed from a CUDA graph, or one forgotten among KEPT newer ones) has its own look
    alone: begun after its bubble's close and the next open, it serves the next bubble
    (above). Under one hardware queue that bubble's launch waits behind it on the stream,
    with training's next close behind that: with time_slice=None nothing would end it, a
    hang (review of 2026-11-28). Such a launch keeps the default slice
    (csrc/launch_slice_rule.hpp): it ends at the slice where no close is pending, and
    where one is (that close, behind it) at the bound of MAX_SLICES slices, a stall
    instead of a hang; every other launch carries the harvester's slice as it is."""
    default = T.launch_slice_ns(NO_SLICE, at_open=False, next_close=0, stream_wait=False)
    assert default == 2_000_000  # Harvester's default time_slice, 2 ms
    assert T.launch_slice_ns(NO_SLICE, at_open=False, next_close=7, stream_wait=False) == 0
    assert T.launch_slice_ns(NO_SLICE, at_open=True, next_close=7, stream_wait=False) == 0
    # A launch at an open keeps the harvester's setting whatever it was given: the
    # training thread reads the ledger as it writes the open, so it always has an ordinal.
    assert T.launch_slice_ns(NO_SLICE, at_open=True, next_close=0, stream_wait=False) == 0
    assert T.launch_slice_ns(NO_SLICE, at_open=False, next_close=0, stream_wait=True) == 0
    assert T.launch_slice_ns(3 * SLICE, at_open=False, next_close=0, stream_wait=False) == (
        3 * SLICE
    )
    m = T.CloseModel()
    m.enqueue_close()
    m.execute()  # the close before the bubble
    m.enqueue_close()
    m.execute()  # the bubble's close, before the launch begins: the next bubble is open
    m.launch_for(0)
    m.begin_block()
    assert m.may_claim(True, LONG, NO_SLICE)  # with no slice it would claim for ever
    assert not m.may_claim(True, LONG, default)  # with one it stops: no close pending
    assert m.may_claim(True, 0, default)  # (within its slice it serves what it finds)
    m.enqueue_close()  # the next bubble's close, queued behind that bubble's launch
    assert m.may_claim(True, 3 * default, default)  # pending: it runs on past the slice
    assert not m.may_claim(True, 8 * default, default)  # ... to the bound, no further


def test_open_ordinals_keep_the_recent_opens():
    """An open's ordinal is found by its number until KEPT later opens were noted; one
    never noted (an open captured into a graph) has none: 0, the launch's own look."""
    opens = T.OpenOrdinals()
    opens.note(5, 3)
    assert opens.next_close(5) == 3 and opens.next_close(6) == 0
    for seq in range(100, 100 + T.OpenOrdinals.KEPT):
        opens.note(seq, 9)
    assert opens.next_close(5) == 0 and opens.next_close(100) == 9


def test_every_close_slot_ends_its_bubble():
    """Each of the four slots, twice round: a close the host enqueued is pending until it
    executes, and once it has, a launch made at the open before it (and one begun before
    it) is over, whichever slot its ordinal writes (close_pending selects the slot with
    constant indices, bubble_over looks at all four: each branch must hold)."""
    m = T.CloseModel()
    for _ in range(9):
        m.launch_at_open()
        m.begin_block()
        m.enqueue_close()
        assert m.pending and not m.bubble_over and not m.closed_since_start
        m.execute()
        assert not m.pending and m.bubble_over and m.closed_since_start
        m.end_launch()


def test_ordinals_wrap_past_zero():
    """Close ordinals are 32 bits and wrap after four billion closes, skipping 0, which
    the slots hold before any close ("none yet"): a close numbered 0 would never read as
    pending nor end a bubble."""
    assert T.close_ordinal_after(0) == 1
    assert T.close_ordinal_after(41) == 42
    assert T.close_ordinal_after(2**32 - 1) == 1
