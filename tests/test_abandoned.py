"""What closes abandoned is kept until the GPU has passed it, then let go
(python/freeride/_abandoned.py): a process that abandons a launch every epoch must not
grow without bound."""

import freeride as fr
from freeride import _abandoned


class FakeExecutor:
    """An executor closed with launches left: reclaim_abandoned() says whether the GPU has
    passed them."""

    def __init__(self) -> None:
        self.passed = False
        self.asked = 0

    def reclaim_abandoned(self) -> bool:
        self.asked += 1
        return self.passed


class Broken:
    def reclaim_abandoned(self) -> bool:
        raise RuntimeError("reclaim_abandoned() before close()")


def test_kept_until_passed_then_let_go():
    before = _abandoned.kept()
    ex = FakeExecutor()
    handle = object()
    _abandoned.keep(ex, [handle])
    assert _abandoned.release_passed() == before + 1
    assert ex.asked == 1
    ex.passed = True
    assert _abandoned.release_passed() == before
    assert _abandoned.kept() == before


def test_an_executor_that_cannot_say_stays_kept():
    before = _abandoned.kept()
    broken = Broken()
    _abandoned.keep(broken, [])
    try:
        assert _abandoned.release_passed() == before + 1
    finally:
        with _abandoned._lock:
            _abandoned._kept.remove((broken, []))


def test_making_a_harvester_lets_go_of_what_was_passed():
    ex = FakeExecutor()
    ex.passed = True
    _abandoned.keep(ex, [])
    with fr.Harvester("cpu", workers=1):
        assert ex.asked >= 1
        assert all(kept is not ex for kept, _ in _abandoned._kept)


def test_a_close_whose_executor_cannot_say_keeps_it_and_does_not_raise():
    """A closed executor that cannot answer reclaim_abandoned() (a broken context: its
    device cannot even be made current) is kept, as release_passed keeps one, instead of
    the error leaving close() (from its `finally`, over close's own outcome)."""
    from freeride._closing import Parts

    class ClosedBroken(Broken):
        def close(self, deadline: float) -> None:
            pass

        def take_abandoned(self) -> list[int]:
            return []

    before = _abandoned.kept()
    ex = ClosedBroken()
    Parts(ex, {}).close()
    try:
        assert any(kept is ex for kept, _ in _abandoned._kept)
        assert _abandoned.kept() == before + 1
    finally:
        with _abandoned._lock:
            _abandoned._kept[:] = [e for e in _abandoned._kept if e[0] is not ex]
