"""The CUDA backend's wait for the gate (csrc/cuda/gate_wait.hpp) under each
FREERIDE_ADMISSION mode, driven with the test's own bell and gate word (no GPU): what the
waiting thread does between its looks. `ring` sleeps on the bell, `poll` sleeps a timer,
`spin` never sleeps: it yields, looking at the bell and the gate's word, and takes a full
look (the waiter's own predicates, which may take locks) only when either moved or every
SPIN_LOOK_EVERY_MS. Counts, not times, are asserted."""

from __future__ import annotations

import warnings

import pytest

from freeride import _C

T = _C._testing
LONG_MS = 10_000.0  # a wait that should end long before this


def test_spin_sees_an_open_that_rings_nothing_without_sleeping():
    """An open replayed from a CUDA graph moves the mirror and rings nothing: a spinning
    wait sees it at once, never having slept. Its stretches of yields are made longer than
    the wait here, and the gate closes again 200 ms after the open, so only the gate's word
    moving can have ended the stretch in time to see it open."""
    r = T.wait_for_gate("spin", "open", 5.0, LONG_MS, look_every_ms=LONG_MS, open_for_ms=200.0)
    assert r["opened"]
    assert r["sleeps"] == 0
    assert r["spins"] <= 1


def test_spin_sees_an_open_that_lands_during_a_look():
    """The gate's word is read before each look: an open that lands while a look is under
    way (after it read the gate) ends the stretch of yields at once, not after
    spin_look_every (made longer than the wait here)."""
    r = T.wait_for_gate("spin", "open during look", 0.0, LONG_MS, look_every_ms=LONG_MS)
    assert r["opened"]
    assert r["elapsed_ms"] < LONG_MS / 2
    assert (r["looks"], r["spins"], r["sleeps"]) == (2, 1, 0)


def test_ring_sleeps_on_the_bell_until_a_look_finds_an_unrung_open():
    """The control: the same open under `ring` is found by a look after a sleep on the
    bell (the 20 ms backstop, none of the open's doing)."""
    r = T.wait_for_gate("ring", "open", 5.0, LONG_MS)
    assert r["opened"]
    assert r["sleeps"] >= 1
    assert r["spins"] == 0


@pytest.mark.parametrize("mode", ["ring", "spin"])
def test_a_rung_open_ends_the_wait(mode):
    r = T.wait_for_gate(mode, "rung open", 5.0, LONG_MS, look_every_ms=LONG_MS, open_for_ms=200.0)
    assert r["opened"]


def test_poll_sleeps_between_looks():
    r = T.wait_for_gate("poll", "open", 5.0, LONG_MS)
    assert r["opened"]
    assert r["sleeps"] >= 1
    assert r["spins"] == 0


@pytest.mark.parametrize("mode", ["ring", "poll", "spin"])
def test_a_stop_ends_the_wait_long_before_its_timeout(mode):
    """A stop rings the bell and moves nothing else: the wait returns False long before
    its 10 s timeout, which spin's stretch of yields (made as long here) would reach were
    it deaf to the bell. (A bound of half the timeout on a wait that should take about
    5 ms: not a measure of speed.)"""
    r = T.wait_for_gate(mode, "stop", 5.0, LONG_MS, unrung=True, look_every_ms=LONG_MS)
    assert not r["opened"]
    assert r["elapsed_ms"] < LONG_MS / 2
    if mode == "spin":
        assert r["sleeps"] == 0 and r["spins"] <= 1


def test_spin_takes_full_looks_only_every_look_interval_while_nothing_moves():
    """Nothing moves for 60 ms: the spinning wait reads the bell and the word between
    yields, and calls the waiter's predicates about once every SPIN_LOOK_EVERY_MS (so a
    spinning executor takes its runner's lock about a thousand times a second, not at
    every yield)."""
    timeout_ms = 60.0
    r = T.wait_for_gate("spin", "none", 0.0, timeout_ms)
    assert not r["opened"]
    assert r["sleeps"] == 0
    assert 2 <= r["looks"] <= timeout_ms / T.SPIN_LOOK_EVERY_MS + 3


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"mode": "nap"}, "mode must be"),
        ({"event": "soon"}, "event must be"),
        ({"look_every_ms": 0.0}, "look_every_ms must be"),
    ],
)
def test_bad_arguments_are_refused(kw, match):
    args = {"mode": "spin", "event": "none", "event_ms": 0.0, "timeout_ms": 1.0} | kw
    with pytest.raises(ValueError, match=match):
        T.wait_for_gate(**args)


def test_the_mode_is_read_from_the_environment(monkeypatch):
    """FREERIDE_ADMISSION is read when a CUDA harvester is made: unset or "ring" (the
    default), "poll", "spin"; anything else is refused, naming the variable and the three."""
    if not hasattr(T, "admission_mode"):
        pytest.skip("this build of freeride has no CUDA backend")
    monkeypatch.delenv("FREERIDE_ADMISSION", raising=False)
    assert T.admission_mode() == "ring"
    for mode in ("ring", "poll", "spin"):
        monkeypatch.setenv("FREERIDE_ADMISSION", mode)
        assert T.admission_mode() == mode
    monkeypatch.setenv("FREERIDE_ADMISSION", "busy")
    with pytest.raises(ValueError, match="FREERIDE_ADMISSION must be 'ring', 'poll' or 'spin'"):
        T.admission_mode()


def _spin_warnings(admission, cores):
    from freeride import _harvester_args as harvester_args

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        harvester_args.warn_if_spinning_on_one_core(admission, cores)
    return [w for w in caught if "FREERIDE_ADMISSION=spin" in str(w.message)]


def test_spinning_on_the_training_threads_only_core_warns():
    """A harvester whose executor spins (h.admission "spin") in a process pinned to one
    core warns: the spin takes turns with the training thread there."""
    (warning,) = _spin_warnings("spin", 1)
    assert warning.category is RuntimeWarning
    assert "core to spare" in str(warning.message)


@pytest.mark.parametrize(("admission", "cores"), [("spin", 2), ("ring", 1), ("host", 1)])
def test_no_spin_warning_with_a_core_to_spare_or_without_spin(admission, cores):
    assert _spin_warnings(admission, cores) == []
