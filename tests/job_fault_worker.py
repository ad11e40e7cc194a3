"""Rank processes for tests/test_job_faults.py: a job whose ranks only harvest (gate
open, no training), one of which dies by SIGKILL while it runs a placed task. Each rank
writes what it saw to rank<N>.json."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

from rank_result import report_and_exit, write_result

import freeride as fr
from freeride.cli.spawn import join_group
from freeride.job.placement import TaskSpec

RANK_TIMEOUT = 2.0


def _spin(items: int, ns: int) -> TaskSpec:
    return TaskSpec(fr.tasks.Spin, kwargs={"items": items, "ns_per_item": ns})


def _die_once_running(queue: fr.JobQueue, outdir: str, rank: int) -> None:
    """SIGKILLs this process once a task placed here has started and the coordinator has
    heard so (the agent reports within milliseconds; a task the coordinator still
    believes queued would be placed again instead)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "running" in queue.hosted().values():
            time.sleep(0.5)
            write_result(outdir, rank, {"killed_at": time.time(), "hosted": queue.hosted()})
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)


def run_rank(rank: int, world: int, outdir: str, victim: int, submitter: int) -> None:
    """`submitter` submits 2 tasks per rank (depth 2: one runs, one waits on each rank);
    `victim` dies once its first one runs."""

    def body(result: dict) -> None:
        join_group(rank, world, outdir, timeout=timedelta(seconds=60))
        with fr.Harvester("cpu", workers=1) as h:
            h.gate.open(stream="host")
            queue = fr.JobQueue(h, host="127.0.0.1", rank_timeout=RANK_TIMEOUT)
            handles = []
            if rank == submitter:
                # Long enough that every rank is still running its first when the victim
                # dies; the waiting ones finish quickly once they start.
                handles = [queue.submit(_spin(1500, 1_000_000)) for _ in range(world)]
                handles += [queue.submit(_spin(50, 1000)) for _ in range(world)]
            if rank == victim:
                _die_once_running(queue, outdir, rank)
            if rank == submitter:
                outcomes = []
                for handle in handles:
                    entry = {"id": handle.id}
                    try:
                        handle.result(timeout=60)
                        entry["state"] = "done"
                    except fr.RankLostError as exc:
                        entry.update(state="lost", rank=exc.rank, error=str(exc), at=time.time())
                    except Exception as exc:  # noqa: BLE001
                        entry.update(state=type(exc).__name__, error=str(exc))
                    entry["final_rank"] = handle.rank
                    outcomes.append(entry)
                result["outcomes"] = outcomes
            result["decisions"] = [{"task": d.task, "rank": d.rank} for d in queue.decisions()]
            started = time.monotonic()
            result["close_started"] = time.time()
            try:
                queue.close()
                result["close"] = "ok"
            except fr.RankLostError as exc:
                result["close"] = "lost"
                result["close_rank"] = exc.rank
                result["close_error"] = str(exc)
            result["close_s"] = time.monotonic() - started
            result["close_ended"] = time.time()
            result["stats"] = queue.stats()

    report_and_exit(rank, outdir, {"rank": rank}, body)
