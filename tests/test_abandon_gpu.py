"""What a close that leaves launches on the GPU keeps, and when it lets go (review G5,
G7), on a GPU. Each case runs in a fresh process (tests/abandon_gpu_worker.py), so a
hang fails the test with the child's stacks instead of hanging the run."""

import pytest
from gpu_worker import run_worker

pytestmark = pytest.mark.gpu

MECHANISMS = ["occupancy-cap", "green-context"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_slabs_held_for_launches_left_go_to_no_later_pool_until_reclaimed(mechanism):
    """Review G5: slabs "leaked" because a stream did not drain were handed to the
    process-wide keep anyway by the pools' destructors, so a later harvester got memory an
    old launch could still write. Closed with its streams reading busy (test switch), a
    harvester's slabs must stay out of the keep, its executor kept for later; once the
    streams read idle, the next look reclaims them (the keep grows)."""
    r = run_worker("held_slabs", {"mechanism": mechanism}, worker="abandon_gpu_worker.py")
    assert r["held"] == r["before"], r
    assert r["executors_held"] == r["executors_before"] + 1, r
    assert r["still_held"] == r["executors_held"], r
    assert r["released"] == r["executors_before"], r
    assert r["after"] > r["before"], r


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_close_abandons_a_queued_launch_and_reclaims_it_once_passed(mechanism):
    """Review G7: the green context was destroyed under an abandoned launch still queued
    in its stream (undocumented: the destroy may wait for it, voiding close's deadline,
    or take the context from under it). A launch at an open queued behind 3 s of training
    work: close with a 0.5 s deadline returns within about a second, the task cancelled
    as abandoned with a warning; CUDA works once training got through; and what was held
    for the launch is let go after it ran."""
    r = run_worker(
        "abandon_queued",
        {"mechanism": mechanism, "hold_ms": 3000, "deadline": 0.5},
        worker="abandon_gpu_worker.py",
        timeout=60,
    )
    assert r["close_s"] < 1.5, r
    assert r["state"] == "cancelled" and r["warned"] >= 1, r
    assert r["kept_after_close"] == r["kept_before"] + 1, r
    assert r["context_ok"], r
