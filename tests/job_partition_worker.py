"""Rank processes for tests/test_job_faults.py's partition cases, a 2-rank job whose ranks
only harvest (gate open, no training):

- "resume": rank 1 runs a task placed there, then is cut off from the leader (its
  connection sends nothing) for longer than rank_timeout, then heard from again: the
  leader fails the task (RankLostError at the submitter) and tells rank 1, which must
  cancel it rather than leave it running.
- "no_close": rank 1 never calls close(): the leader's close() still returns within
  close_timeout and about a second, and rank 1's next submit() raises a clear error.

Each rank writes what it saw to rank<N>.json."""

from __future__ import annotations

import os
import time
from datetime import timedelta

from rank_result import report_and_exit

import freeride as fr
from freeride.cli.spawn import join_group
from freeride.job.placement import TaskSpec

RANK_TIMEOUT = 2.0
CLOSE_TIMEOUT = 2.0


def _spin(items: int, ns: int) -> TaskSpec:
    return TaskSpec(fr.tasks.Spin, kwargs={"items": items, "ns_per_item": ns})


def _wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _resume(queue: fr.JobQueue, rank: int, result: dict, outdir: str) -> None:
    # Rank 1 cuts itself off only once the leader has heard that the task runs: a task
    # whose start the leader never heard of is placed again, not lost, and with no other
    # rank to run it is never final (the submitter's result() timed out under a loaded
    # machine, where rank 1's "running" was still in its Link when the cut came).
    marker = os.path.join(outdir, "running-at-the-leader")
    if rank == 0:
        queue.leave()  # the task goes to rank 1
        handle = queue.submit(_spin(10**7, 1_000_000))
        if _wait(lambda: handle.state == "running", 30):
            open(marker, "w").close()
        try:
            handle.result(timeout=60)
            result["outcome"] = "done"
        except fr.RankLostError as exc:
            result["outcome"] = "lost"
            result["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001
            result["outcome"] = f"{type(exc).__name__}: {exc}"
        return
    assert _wait(lambda: "running" in queue.hosted().values(), 30), queue.hosted()
    assert _wait(lambda: os.path.exists(marker), 30), "the leader never heard the task run"
    local = dict(queue._agent.hosted())
    queue._link.hold(True)  # cut off: nothing this rank says reaches the leader
    time.sleep(RANK_TIMEOUT + 1.5)
    queue._link.hold(False)
    result["final_within_10s"] = _wait(lambda: all(h.done() for h in local.values()), 10)
    result["local_states"] = {tid: h.state for tid, h in local.items()}


def _no_close(queue: fr.JobQueue, rank: int, result: dict, outdir: str) -> None:
    if rank == 0:
        return  # closes at once below
    time.sleep(CLOSE_TIMEOUT + 3.0)  # "training" on, not closing
    try:
        queue.submit(_spin(10, 1000))
        result["submit_after"] = "accepted"
    except fr.FreerideError as exc:
        result["submit_after"] = type(exc).__name__


def run_rank(rank: int, world: int, outdir: str, scenario: str) -> None:
    def body(result: dict) -> None:
        join_group(rank, world, outdir, timeout=timedelta(seconds=60))
        with fr.Harvester("cpu", workers=1) as h:
            h.gate.open(stream="host")
            queue = fr.JobQueue(
                h, host="127.0.0.1", rank_timeout=RANK_TIMEOUT, close_timeout=CLOSE_TIMEOUT
            )
            {"resume": _resume, "no_close": _no_close}[scenario](queue, rank, result, outdir)
            started = time.monotonic()
            try:
                queue.close()
                result["close"] = "ok"
            except fr.RankLostError as exc:
                result["close"] = "lost"
                result["close_rank"] = exc.rank
            result["close_s"] = time.monotonic() - started
            result["stats"] = queue.stats()

    report_and_exit(rank, outdir, {"rank": rank, "scenario": scenario}, body)
