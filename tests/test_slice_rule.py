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


def test_harvester_reports_the_bound():
    with fr.Harvester("cpu", workers=1, time_slice=0.002) as h:
        assert h.slice_bound == pytest.approx(0.002 * _C.MAX_SLICES)
    with fr.Harvester("cpu", workers=1, time_slice=None) as h:
        assert h.slice_bound is None
