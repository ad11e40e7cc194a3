"""`freeride bench soak`, short: a 2-rank gloo pipeline whose job queue is fed and
cancelled for a few seconds loses and repeats no item and leaves no thread or file
descriptor behind (the 10-minute run is in benchmarks/results/)."""

import json

import pytest

from freeride.cli import bench
from freeride.cli.bench import soak


def test_drift_compares_the_last_fifth_with_the_fifth_after_warm_up():
    series = [{"t_s": float(t), "x": v} for t, v in enumerate([9, 1, 2, 3, 2, 2, 2, 2, 4, 5, 3])]
    # 10 s: warm-up [0, 1), after it [1, 3], last fifth [8, 10]
    assert soak.drift(series, "x", 10.0) == {"after_warmup": 1, "end": 3, "drift": 5 - 3}


def test_only_soak_takes_minutes():
    with pytest.raises(ValueError, match="takes no option minutes"):
        bench.run("items", mode="cpu", options={"minutes": 1})


def test_short_soak_loses_repeats_and_leaks_nothing(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "soak.json"
    result = bench.run("soak", mode="cpu", out=str(out), options={"minutes": 0.1})
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["settings"]["minutes"] == 0.1
    tasks = result["tasks"]
    assert result["sound"], result["notes"]
    assert tasks["items_lost"] == 0 and tasks["items_repeated"] == 0, tasks
    assert tasks["items_done_mismatch"] == 0 and tasks["returned_mismatch"] == 0, tasks
    assert tasks["failed"] == tasks["rank_lost"] == tasks["stuck"] == 0, tasks
    assert tasks["done"] > 0 and tasks["cancelled"] > 0, tasks
    assert tasks["done"] + tasks["cancelled"] == tasks["submitted"], tasks
    assert tasks["items_run"] > 0
    for stats in result["queue_stats"]:
        assert stats is None or (stats["dropped"] == stats["malformed"] == 0), stats
    assert [row["rank"] for row in result["rows"]] == [0, 1]
    for row in result["rows"]:
        assert row["steps"] > 0 and row["samples"] >= 10, row
        # While the queue runs: the same threads and descriptors at the end as after the
        # warm-up, and memory within a loose bound.
        assert row["threads_end"] == row["threads_warm"], row
        assert row["fds_end"] == row["fds_warm"], row
        assert row["rss_end_mib"] - row["rss_warm_mib"] < 50, row
        # Once closed and dropped, the queue's threads are gone too.
        assert row["threads_dropped"] == row["threads_no_queue"], row


def test_a_short_soak_with_an_attacker_at_the_port_stays_sound(tmp_path):
    """Review round 3's attacks all at once, for the whole run (idle connections, a frame
    of 255 MiB announced before the handshake, hello floods from keyless peers and from a
    client-credential holder): no item lost or repeated, nothing failed, every keyless
    peer refused by the transport, the huge frame cut off early, and the queue's threads
    the same at the end as after the warm-up."""
    pytest.importorskip("torch")
    result = bench.run("soak", mode="cpu", options={"minutes": 0.15, "attack": True})
    assert result["settings"]["attack"] is True
    tasks = result["tasks"]
    assert result["sound"], result["notes"]
    assert tasks["failed"] == tasks["rank_lost"] == tasks["stuck"] == 0, tasks
    assert tasks["done"] > 0, tasks
    attacked = result["attacker"]
    assert "error" not in attacked, attacked
    assert attacked["keyless_hellos"] > 0, attacked
    assert attacked["client_hellos"] > 0 and attacked["idle_held"] >= 50, attacked
    assert attacked["huge_frames"] > 0 and attacked["huge_bytes_in"] < (8 << 20), attacked
    assert result["queue_stats"][0]["denied"] > 0, result["queue_stats"]
    for row in result["rows"]:
        assert row["threads_end"] == row["threads_warm"], row
