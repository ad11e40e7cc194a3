"""How long the CUDA backend's executor sleeps on the gate's bell between looks at the
mirror (csrc/cuda/unrung_opens.hpp), driven through _C._testing.UnrungOpens. While every
open rings, the look is only a backstop and the executor sleeps through compute (review
G14: it woke every millisecond, a thousand times a second, to find the gate closed). Once
an open may take effect without a ring, admission rests on the look, every millisecond.
On a GPU, tests/test_gpu.py::test_admission_sleeps_while_the_gate_is_closed counts the
executor thread's wake-ups both ways."""

from freeride import _C

UnrungOpens = _C._testing.UnrungOpens

TRAIN, OTHER, LEGACY = 0x7F00_0000_1000, 0x7F00_0000_2000, 0


def test_while_every_open_rings_the_executor_looks_at_the_mirror_only_as_a_backstop():
    u = UnrungOpens()
    assert not u.any() and u.poll_us() >= 20_000
    for _ in range(5):
        u.note_open(TRAIN, captured=False)
    assert not u.any() and u.poll_us() >= 20_000


def test_an_open_captured_into_a_graph_makes_the_executor_look_every_millisecond():
    """Its replays ring nothing, whenever they come: noted at the capture, for good. The
    note says when it set the flag (then only), so that the backend rings the bell: a
    waiter already asleep for the backstop looks again, every millisecond."""
    u = UnrungOpens()
    assert u.note_open(TRAIN, captured=True) is True
    assert u.any() and u.poll_us() == 1_000
    assert u.note_open(TRAIN, captured=True) is False
    assert u.note_open(TRAIN, captured=False) is False
    assert u.any() and u.poll_us() == 1_000


def test_an_open_on_the_per_thread_default_stream_makes_the_executor_look_every_millisecond():
    """That handle names another stream on each thread: two threads' opens cannot be told
    apart by it."""
    u = UnrungOpens()
    assert u.note_open(2, captured=False, ambiguous=True) is True
    assert u.any() and u.poll_us() == 1_000


def test_an_open_whose_ring_could_not_be_enqueued_makes_the_executor_look_every_millisecond():
    u = UnrungOpens()
    assert u.note_open(TRAIN, captured=False) is False
    assert u.note_unrung() is True
    assert u.any() and u.poll_us() == 1_000
    assert u.note_unrung() is False


def test_opens_on_a_second_stream_make_the_executor_look_every_millisecond():
    """The watcher waits for opens in the order they were written: an open on one stream
    can wait in its queue behind one that the GPU reaches later on another. The legacy
    stream (handle 0) is a stream like another."""
    for first, second in ((TRAIN, OTHER), (LEGACY, TRAIN), (TRAIN, LEGACY)):
        u = UnrungOpens()
        u.note_open(first, captured=False)
        u.note_open(first, captured=False)
        assert not u.any(), (first, second)
        u.note_open(second, captured=False)
        assert u.any() and u.poll_us() == 1_000, (first, second)
        u.note_open(first, captured=False)
        assert u.any(), "once set, it stays set"
