"""The job queue with 1,024 ranks joining at once (issue 35), on loopback: the machinery
of benchmarks/queue_scale.py (a leader's Hub and Coordinator here, the ranks' Links in
worker processes). Checks that every rank gets in and none is declared lost while they
all beat; how fast, and at what CPU, is the benchmark's to say (timings flake on shared
machines), so the only bound on time is one that keeps a hang from lasting."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("zmq")

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "queue_scale.py"
RANKS = 1024


def load_benchmark():
    """benchmarks/queue_scale.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("queue_scale", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_1024_ranks_get_in_at_once_and_none_is_lost():
    queue_scale = load_benchmark()
    # Workers at normal priority: niced ones (the benchmark's default, for the leader's
    # figure) would be starved by any other load here, and go silent for real.
    result = queue_scale.run(ranks=RANKS, procs=8, window=3.0, settle=1.0, nice=0, budget=180)
    assert result["failed"] == 0, result["errors"]
    assert result["in"] == RANKS
    assert result["sessions"] == RANKS
    assert result["all_in_s"] is not None
    assert result["coordinator"]["lost"] == 0, result["coordinator"]["lost_ranks"]
    assert result["workers"]["received"].get("lost", 0) == 0
    assert result["hub"]["refused"] == result["hub"]["malformed"] == 0
    assert result["coordinator"]["malformed"] == 0
