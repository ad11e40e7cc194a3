"""The job queue when a rank dies: a 3-rank gloo job loses a rank (SIGKILL) while that
rank runs a placed task, and a 2-rank job loses its leader."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

pytest.importorskip("torch")

import job_fault_worker
import job_partition_worker

BOUND_S = job_fault_worker.RANK_TIMEOUT + 3.0  # detection, plus a loaded 2-core machine


def _spawn(tmp_path, world: int, target, *args) -> tuple[list, dict[int, dict]]:
    """Runs target(rank, world, outdir, *args) in `world` spawned processes; returns them
    (ended) and each rank's rank<N>.json."""
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=target, args=(rank, world, str(tmp_path), *args))
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not alive, f"ranks still running after 120 s: {alive}"
    out = {}
    for rank in range(world):
        with open(os.path.join(tmp_path, f"rank{rank}.json")) as f:
            out[rank] = json.load(f)
    return procs, out


def _run(tmp_path, world: int, victim: int, submitter: int) -> dict[int, dict]:
    procs, out = _spawn(tmp_path, world, job_fault_worker.run_rank, victim, submitter)
    assert procs[victim].exitcode == -9, procs[victim].exitcode
    for rank in range(world):
        if rank != victim:
            assert out[rank]["ok"], out[rank].get("error")
    return out


@pytest.fixture(scope="module")
def lost_rank(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("lost_rank"), world=3, victim=2, submitter=1)


def test_the_task_on_a_killed_rank_fails_with_rank_lost_within_the_bound(lost_rank):
    killed_at = lost_rank[2]["killed_at"]
    lost = [o for o in lost_rank[1]["outcomes"] if o["state"] == "lost"]
    assert len(lost) == 1, lost_rank[1]["outcomes"]
    assert lost[0]["rank"] == 2 and "rank 2" in lost[0]["error"]
    assert lost[0]["at"] - killed_at < BOUND_S, lost[0]["at"] - killed_at


def test_tasks_waiting_on_the_killed_rank_run_elsewhere(lost_rank):
    waiting = [tid for tid, state in lost_rank[2]["hosted"].items() if state == "queued"]
    assert waiting, lost_rank[2]["hosted"]
    outcomes = {o["id"]: o for o in lost_rank[1]["outcomes"]}
    for tid in waiting:
        assert outcomes[tid]["state"] == "done" and outcomes[tid]["final_rank"] != 2
    assert sum(o["state"] == "done" for o in outcomes.values()) == len(outcomes) - 1


def test_survivors_close_with_a_clear_error_and_join_their_threads(lost_rank):
    # close() is collective: it can end only once the last survivor called it (and the
    # dead rank was declared lost).
    last_call = max([lost_rank[2]["killed_at"]] + [lost_rank[r]["close_started"] for r in (0, 1)])
    for rank in (0, 1):
        r = lost_rank[rank]
        assert r["close"] == "lost" and r["close_rank"] == 2, r
        assert "rank(s) 2" in r["close_error"]
        assert r["close_ended"] - last_call < BOUND_S, r["close_ended"] - last_call
        assert r["stats"]["lost_ranks"] == [2]
        assert r["threads_after"] == [], r["threads_after"]


def test_a_lost_leader_fails_every_handle_and_close_says_so(tmp_path):
    out = _run(tmp_path, world=2, victim=0, submitter=1)
    r = out[1]
    assert r["outcomes"] and all(o["state"] == "lost" and o["rank"] == 0 for o in r["outcomes"])
    assert r["close"] == "lost" and r["close_rank"] == 0
    assert r["threads_after"] == []


def _partition(tmp_path, scenario: str) -> dict[int, dict]:
    _, out = _spawn(tmp_path, 2, job_partition_worker.run_rank, scenario)
    for rank in range(2):
        assert out[rank]["ok"], out[rank].get("error")
    return out


def test_a_rank_declared_lost_that_is_heard_again_cancels_its_task(tmp_path):
    """Review D3's converse: liveness is the leader's own observation, and a rank it gave
    up on must not keep running what it was told failed. Rank 1 is cut off for longer than
    rank_timeout while it runs a placed task: the submitter's handle fails with
    RankLostError, and rank 1 is told (the leader sends "lost" to the lost rank too, and
    again whenever it is heard from) and cancels the task."""
    out = _partition(tmp_path, "resume")
    assert out[0]["outcome"] == "lost", out[0]
    assert "rank 1 was lost" in out[0]["error"]
    assert out[1]["final_within_10s"], out[1]
    assert set(out[1]["local_states"].values()) == {"cancelled"}, out[1]
    assert out[0]["close"] == "lost" and out[0]["close_rank"] == 1
    for rank in (0, 1):
        assert out[rank]["threads_after"] == [], out[rank]


def test_close_returns_within_its_bound_when_another_rank_never_closes(tmp_path):
    """Item 4: the leader's close() waits close_timeout (2 s) for rank 1, which never
    closes, then closes the queue for it: it returns within the bound, not for ever, and
    rank 1's next submit() raises a clear freeride error instead of hanging."""
    out = _partition(tmp_path, "no_close")
    bound = job_partition_worker.CLOSE_TIMEOUT + 1.5
    assert out[0]["close"] == "ok" and out[0]["close_s"] < bound, out[0]
    assert out[1]["submit_after"] in ("HarvesterClosedError", "RankLostError"), out[1]
    assert out[1]["close_s"] < bound, out[1]
    for rank in (0, 1):
        assert out[rank]["threads_after"] == [], out[rank]
