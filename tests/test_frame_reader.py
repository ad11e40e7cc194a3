"""The hub's reading of its socket (python/freeride/job/channel/sockets.py, FrameReader):
frame by frame, a budget of frames at a time, so that a message of many frames costs its
sender rounds of the hub's thread, each followed by its sends and beats, and not one long
stall. A security review (round 5) held a leader's hub for 6.7 s with one status
session's message of 400,000 empty frames, and a live rank was declared lost."""

import pytest

zmq = pytest.importorskip("zmq")

from freeride.job.channel.sockets import FrameReader


@pytest.fixture
def pair():
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    tx.bind("inproc://frame-reader")
    rx.connect("inproc://frame-reader")
    yield tx, rx
    tx.close(0)
    rx.close(0)
    ctx.term()


@pytest.mark.parametrize("copy", [True, False])
def test_each_round_reads_at_most_its_budget_and_an_oversized_message_is_dropped(pair, copy):
    tx, rx = pair
    tx.send_multipart([b""] * 20_000)  # past the reader's 10 frames: dropped
    tx.send_multipart([b"x", b"y"])
    tx.send_multipart([b"z"] * 10)  # exactly the limit: kept
    assert rx.poll(10_000)  # the first frame is there (inproc: at once)
    reader = FrameReader(rx, max_frames=10, copy=copy)
    got, rounds = [], 0
    while rounds < 100 and len(got) < 3:
        rounds += 1
        before = len(got)
        got += [[bytes(f) for f in m] for m in reader.messages(1000)]
        # A round that completes nothing still leaves the message in progress, to be
        # read on at once (not after the poller's wait).
        assert reader.in_progress or len(got) > before
    assert rounds == 21  # 20,012 frames, 1,000 a round
    assert got == [[], [b"x", b"y"], [b"z"] * 10]
    assert not reader.in_progress
    assert list(reader.messages(1000)) == []  # nothing more: no wait, no error
