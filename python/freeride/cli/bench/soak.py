"""A soak run of the job queue on a real pipeline: nothing lost, repeated or leaked.

Two processes train `freeride demo`'s pipeline (gloo, a small transformer split into two
stages, torch.distributed.pipelining's 1F1B) for `minutes`, each with a host-backend
Harvester and an fr.JobQueue. Meanwhile a submitter thread on rank 1 keeps a few
ItemCounter tasks in flight through the queue (coordinator on rank 0): most run to the
end, some are cancelled once part of their items ran, some right after they were
submitted. Every item of an ItemCounter adds one to its own counter, so after any pattern
of placements and cancels a finished task must show every counter at 1 and a cancelled
one only 0s and 1s, as many 1s as its handle's items_done. The counters are read twice:
as the result the queue returns (finished tasks), and on the rank that ran them (every
task: the spec's factory is soak.counter, which keeps each counter it builds until the
submitter has seen the task final).

Every few seconds (at most 5 s, more often in a short run) and at the start and the end
each rank samples its resident memory (VmRSS), threads (/proc/self/task) and open file
descriptors (/proc/self/fd). Drift: the highest sample over the last 20% of the run
minus the highest over the 20% after the warm-up (the first 10%).

Host backend only, like `ranks`: it measures the queue's and the harvester's
bookkeeping over time, not the device. `bench.run("soak", options={"minutes": M,
"sizes": "tiny"})` submits tasks of a few 1 us items instead, about a hundred a second
on two cores: the queue's own records and messages then dominate, and its caps (the
coordinator keeps the last 2,000 final tasks) are reached within minutes.
"""

from __future__ import annotations

import gc
import json
import os
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import spawn
from ._resources import difference, drift, fd_kinds, sample

MODES = ("cpu",)

DEFAULT_MINUTES = 10.0
QUICK_MINUTES = 0.1
WORLD = 2
SUBMITTER = 1  # the coordinator runs on rank 0: submissions cross between processes
IN_FLIGHT = 6  # tasks the submitter keeps unfinished (the queue holds 2 per rank)
SAMPLE_EVERY_S = 5.0
# What happens to a task: runs to the end, cancelled once part of it ran, or cancelled
# right after it was submitted (wherever it is by then).
PLANS = (("finish", 6), ("cancel-running", 3), ("cancel-at-once", 1))
# Task sizes: items and phases drawn uniformly from these ranges, the item time (ns) from
# the list. "mixed" (the default): tens of milliseconds of work per task; "tiny": a few
# items, so the queue's own messages and records dominate (2,000 tasks within minutes).
SIZES = {
    "mixed": {"items": (50, 600), "phases": (1, 3), "ns_per_item": (20_000, 50_000, 100_000)},
    "tiny": {"items": (1, 20), "phases": (1, 1), "ns_per_item": (1_000,)},
}
FINAL = ("done", "failed", "cancelled")


_built: dict[int, list[Any]] = {}
_built_lock = threading.Lock()


def counter(tag: int, items: int, phases: int, ns_per_item: int) -> Any:
    """An fr.tasks.ItemCounter, kept in this process under `tag` until swept, so its
    counters can be read whatever becomes of the task (a cancelled task returns none)."""
    from freeride.tasks import ItemCounter

    task = ItemCounter(items=items, phases=phases, ns_per_item=ns_per_item)
    with _built_lock:
        _built.setdefault(tag, []).append(task)
    return task


def _sweep(tags: list[int]) -> dict[int, tuple[int, np.ndarray | None]]:
    """For each tag: (times this process built it, its counters summed over those
    builds, as uint8 capped at 255; None if never built or never run). Forgets them."""
    out: dict[int, tuple[int, np.ndarray | None]] = {}
    for tag in tags:
        with _built_lock:
            tasks = _built.pop(tag, [])
        total = None
        for task in tasks:
            try:
                counts = task.snapshot().counts
            except RuntimeError:  # built, never submitted (the harvester refused it)
                continue
            total = counts.astype(np.uint32) if total is None else total + counts
        if total is not None and total.any():
            out[tag] = (len(tasks), np.minimum(total, 255).astype(np.uint8))
        else:
            out[tag] = (len(tasks), None)
    return out


@dataclass
class _Live:
    tag: int
    handle: Any
    items: int
    phases: int
    plan: str
    cancel_after: int = 0  # cancel-running: once items_done reaches this
    cancel_sent: bool = False


@dataclass
class Totals:
    """What the submitter saw, checked against the counters of the ranks that ran it."""

    submitted: int = 0
    done: int = 0
    cancelled: int = 0
    cancelled_before_any_item: int = 0
    failed: int = 0
    rank_lost: int = 0
    stuck: int = 0  # not final 30 s after the final cancel
    items_run: int = 0  # counters at 1, over every task
    items_lost: int = 0  # counters at 0 in finished tasks
    items_repeated: int = 0  # counters above 1, in any task
    returned_mismatch: int = 0  # finished tasks whose returned counters differ
    items_done_mismatch: int = 0  # tasks whose items_done is not the number of 1s
    phase_violations: int = 0  # items that started before the previous phase ended
    built_twice: int = 0  # tasks built more than once (moved before starting: allowed)
    errors: list[str] = field(default_factory=list)  # the first few, in words

    def note(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)


class Submitter(threading.Thread):
    """Keeps IN_FLIGHT ItemCounter tasks unfinished in the queue until stopped; hands the
    ones that became final to check() (in the training thread, at a sample point)."""

    def __init__(
        self, queue: Any, seed: int, sizes: str = "mixed", in_flight: int = IN_FLIGHT
    ) -> None:
        super().__init__(name="soak-submitter", daemon=True)
        self._queue = queue
        self._sizes = SIZES[sizes]
        self._rng = random.Random(seed)
        self._in_flight = in_flight
        self._live: dict[int, _Live] = {}
        self._final: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._tags = 0
        self.totals = Totals()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._turn()
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the rank
            self.error = exc

    def stop(self, timeout: float = 30.0) -> None:
        """Stops submitting, cancels what is not final and waits for it (`timeout` s)."""
        self._stopping.set()
        self.join()
        deadline = time.monotonic() + timeout
        for live in list(self._live.values()):
            live.handle.cancel(wait=False)
        for live in list(self._live.values()):
            live.handle.wait(max(0.0, deadline - time.monotonic()))
        self._reap()
        for live in self._live.values():
            self.totals.stuck += 1
            self.totals.note(f"task {live.tag} not final after the last cancel ({live.handle!r})")

    def take_final(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            out, self._final = self._final, {}
        return out

    def _turn(self) -> None:
        self._reap()
        for live in self._live.values():
            if (
                live.plan == "cancel-running"
                and not live.cancel_sent
                and live.handle.items_done >= live.cancel_after
            ):
                live.handle.cancel(wait=False)
                live.cancel_sent = True
        while len(self._live) < self._in_flight:
            self._submit()

    def _submit(self) -> None:
        from freeride import TaskSpec

        rng = self._rng
        tag = self._tags
        self._tags += 1
        sizes = self._sizes
        items = rng.randint(*sizes["items"])
        phases = rng.randint(*sizes["phases"])
        kwargs = {
            "tag": tag,
            "items": items,
            "phases": phases,
            "ns_per_item": rng.choice(sizes["ns_per_item"]),
        }
        spec = TaskSpec(f"{__name__}:counter", kwargs=kwargs, result="return", name=f"soak {tag}")
        plan = rng.choices([p for p, _ in PLANS], weights=[w for _, w in PLANS])[0]
        handle = self._queue.submit(spec)
        self.totals.submitted += 1
        live = _Live(tag, handle, items, phases, plan)
        if plan == "cancel-running":
            live.cancel_after = rng.randint(1, max(1, items * phases - 1))
        elif plan == "cancel-at-once":
            handle.cancel(wait=False)
            live.cancel_sent = True
        self._live[tag] = live

    def _reap(self) -> None:
        import freeride as fr

        lost_error = getattr(fr, "RankLostError", None)
        for tag, live in list(self._live.items()):
            handle = live.handle
            if not handle.done():
                continue
            del self._live[tag]
            info: dict[str, Any] = {
                "state": handle.state,
                "items_done": handle.items_done,
                "items": live.items,
                "phases": live.phases,
                "counts": None,
                "violations": 0,
                "error": None,
            }
            try:
                value = handle.result(timeout=0)
                info["counts"] = np.minimum(value.counts, 255).astype(np.uint8)
                info["violations"] = int(value.violations)
            except fr.TaskCancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 - counted below
                info["error"] = f"{type(exc).__name__}: {exc}"
                if lost_error is not None and isinstance(exc, lost_error):
                    info["state"] = "lost"
            with self._lock:
                self._final[tag] = info


def check(totals: Totals, final: dict[int, dict[str, Any]], ran: list[dict]) -> None:
    """Adds to `totals` what the final tasks in `final` (the submitter's view) and `ran`
    (every rank's _sweep() of the same tags) show."""
    for tag, info in final.items():
        counts = None
        builds = 0
        for per_rank in ran:
            n, rank_counts = per_rank.get(tag, (0, None))
            builds += n
            if rank_counts is not None:
                c = rank_counts.astype(np.uint32)
                counts = c if counts is None else counts + c
        shape = (info["phases"], info["items"])
        counts = np.zeros(shape, np.uint32) if counts is None else counts
        ones = int(np.count_nonzero(counts == 1))
        repeated = int(np.count_nonzero(counts > 1))
        totals.items_run += ones
        totals.items_repeated += repeated
        totals.built_twice += builds > 1
        state = info["state"]
        if repeated:
            totals.note(f"task {tag} ({state}): {repeated} items ran more than once")
        if state == "done":
            totals.done += 1
            lost = int(np.count_nonzero(counts == 0))
            totals.items_lost += lost
            if lost:
                totals.note(f"task {tag} finished with {lost} items never run")
            returned = info["counts"]
            if returned is None or not np.array_equal(returned, counts):
                totals.returned_mismatch += 1
                totals.note(f"task {tag}: the returned counters differ from the rank's")
            totals.phase_violations += info["violations"]
        elif state == "cancelled":
            totals.cancelled += 1
            totals.cancelled_before_any_item += ones == 0
        elif state == "lost":
            totals.rank_lost += 1
            totals.note(f"task {tag}: {info['error']}")
        else:
            totals.failed += 1
            totals.note(f"task {tag} {state}: {info['error']}")
        if state in ("done", "cancelled") and info["items_done"] != ones:
            totals.items_done_mismatch += 1
            totals.note(
                f"task {tag} ({state}): items_done {info['items_done']}, {ones} counters at 1"
            )


def _start_attacker(secret_file: str, folder: str) -> tuple[Any, Any, str]:
    """Starts _attacker.run, knowing what `secret_file` (the leader's) tells, in a
    process of its own."""
    import multiprocessing

    from . import _attacker

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    path = os.path.join(folder, "attacker.json")
    proc = ctx.Process(target=_attacker.run, args=(secret_file, path, stop), daemon=True)
    proc.start()
    return proc, stop, path


def _stop_attacker(proc: Any, stop: Any, path: str) -> dict[str, Any]:
    stop.set()
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
        return {"error": "the attacker did not stop within 30 s"}
    proc.close()  # its sentinel pipe, which the descriptor count would see
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        return {"error": f"no counts from the attacker (exit code {proc.exitcode}): {exc}"}


def _rank_main(
    rank: int,
    folder: str,
    seconds: float,
    seed: int,
    sizes: str,
    result_path: str,
    attack: bool = False,
) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, schedules

    import freeride as fr

    from ..demo import WARMUP_STEPS, DemoConfig

    cfg = DemoConfig(stages=WORLD, microbatches=2 * WORLD)
    torch.set_num_threads(1)
    spawn.join_group(rank, WORLD, folder)
    torch.manual_seed(0)
    layers = [
        nn.TransformerEncoderLayer(cfg.d_model, 4, 2 * cfg.d_model, dropout=0.0, batch_first=True)
        for _ in range(WORLD)
    ]
    stage = PipelineStage(layers[rank], rank, WORLD, torch.device("cpu"))

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    sched = schedules.Schedule1F1B(stage, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(layers[rank].parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    shape = (cfg.micro_batch * cfg.microbatches, cfg.seq_len, cfg.d_model)
    x, y = torch.randn(shape, generator=g), torch.randn(shape, generator=g)

    def step() -> None:
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y)
        opt.step()

    every = min(SAMPLE_EVERY_S, max(0.2, seconds / 20))
    series: list[dict[str, float]] = []
    totals = Totals()
    flags = torch.zeros(2, dtype=torch.int64)  # rank 0's: go on, sample now
    steps = 0
    with fr.Harvester("cpu", workers=1) as h:
        for _ in range(WARMUP_STEPS):
            step()
        before = sample()
        before_fds = fd_kinds()
        secret_file = os.path.join(folder, "queue.json") if attack else None
        queue = fr.JobQueue(h, secret_file=secret_file)  # collective
        h.attach(sched)
        h.attach_optimizer(opt)
        submitter = Submitter(queue, seed, sizes) if rank == SUBMITTER else None
        attacker = (
            _start_attacker(secret_file, folder) if secret_file is not None and rank == 0 else None
        )
        attacked: dict[str, Any] | None = None

        def sample_and_check(t: float) -> None:
            now = sample()
            if submitter is not None and submitter.is_alive():
                now["threads"] -= 1  # the soak's own thread, not freeride's
            series.append({"t_s": t, "steps": steps, **now})
            final = submitter.take_final() if submitter is not None else {}
            tags = [list(final)]
            dist.broadcast_object_list(tags, src=SUBMITTER)
            ran = _sweep(tags[0])
            gathered: list[Any] = [None] * WORLD if rank == SUBMITTER else None
            dist.gather_object(ran, gathered, dst=SUBMITTER)
            if submitter is not None:
                check(submitter.totals, final, gathered)

        dist.barrier()
        start = time.monotonic()
        sample_and_check(0.0)
        if submitter is not None:
            submitter.start()
        next_sample = every
        while True:
            if rank == 0:
                elapsed = time.monotonic() - start
                flags[0] = int(elapsed < seconds)
                flags[1] = int(elapsed >= next_sample and elapsed < seconds)
            dist.broadcast(flags, src=0)
            if not flags[0]:
                break
            step()
            steps += 1
            if flags[1]:
                sample_and_check(time.monotonic() - start)
                next_sample += every
        h.detach()
        ended = time.monotonic() - start
        if submitter is not None:
            submitter.stop()
            if submitter.error is not None:
                raise submitter.error
        sample_and_check(ended)  # every task final: the last counters are checked here
        if attacker is not None:
            attacked = _stop_attacker(*attacker)
        stats = queue.stats() if hasattr(queue, "stats") else None
        queue.close()  # collective
        closed = sample()  # the harvester still open, as in `before`
        if submitter is not None:
            totals = submitter.totals
        submitter = queue = None
        gc.collect()
        dropped = sample()  # and once nothing refers to the queue any more
        left_fds = difference(before_fds, fd_kinds())
    out: list[Any] = [None] * WORLD if rank == 0 else None
    mine = {
        "rank": rank,
        "series": series,
        "before_queue": before,
        "after_close": closed,
        "after_drop": dropped,
        "fds_left": left_fds,
        "steps": steps,
        "seconds": ended,
        "queue_stats": stats,
        "totals": totals.__dict__ if rank == SUBMITTER else None,
        "attacker": attacked,
    }
    dist.gather_object(mine, out, dst=0)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def run_ranks(
    seconds: float, seed: int = 0, sizes: str = "mixed", attack: bool = False
) -> list[dict[str, Any]]:
    """Runs the soak for `seconds` on WORLD processes with tasks of `sizes` (a key of
    SIZES), with an attacker at the leader's port if `attack`; returns what each rank
    saw."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        spawn.run_ranks(_rank_main, WORLD, tmp, seconds, seed, sizes, path, attack)
        with open(path) as f:
            return json.load(f)


def measure(
    mode: str,
    quick: bool,
    minutes: float | None = None,
    sizes: str = "mixed",
    attack: bool = False,
) -> dict[str, Any]:
    if minutes is None:
        minutes = QUICK_MINUTES if quick else DEFAULT_MINUTES
    if not minutes > 0:
        raise ValueError(f"minutes must be positive, got {minutes!r}")
    if sizes not in SIZES:
        raise ValueError(f"sizes must be one of {sorted(SIZES)}, got {sizes!r}")
    seconds = 60.0 * minutes
    ranks = run_ranks(seconds, sizes=sizes, attack=attack)
    totals = next(r["totals"] for r in ranks if r["totals"] is not None)
    attacked = next((r["attacker"] for r in ranks if r.get("attacker")), None)
    rows = []
    for r in ranks:
        rss = drift(r["series"], "rss_mib", r["seconds"])
        threads = drift(r["series"], "threads", r["seconds"])
        fds = drift(r["series"], "fds", r["seconds"])
        rows.append(
            {
                "rank": r["rank"],
                "steps": r["steps"],
                "samples": len(r["series"]),
                "rss_start_mib": r["series"][0]["rss_mib"],
                "rss_warm_mib": rss["after_warmup"],
                "rss_end_mib": rss["end"],
                "rss_drift_mib": rss["drift"],
                "threads_warm": threads["after_warmup"],
                "threads_end": threads["end"],
                "fds_warm": fds["after_warmup"],
                "fds_end": fds["end"],
                "threads_no_queue": r["before_queue"]["threads"],
                "threads_closed": r["after_close"]["threads"],
                "fds_no_queue": r["before_queue"]["fds"],
                "fds_closed": r["after_close"]["fds"],
                "threads_dropped": r["after_drop"]["threads"],
                "fds_dropped": r["after_drop"]["fds"],
            }
        )
    sound = (
        totals["items_lost"] == 0
        and totals["items_repeated"] == 0
        and totals["returned_mismatch"] == 0
        and totals["items_done_mismatch"] == 0
        and totals["phase_violations"] == 0
        and totals["failed"] == 0
        and totals["rank_lost"] == 0
        and totals["stuck"] == 0
    )
    notes = [
        (
            f"tasks: {totals['submitted']} submitted, {totals['done']} done, "
            f"{totals['cancelled']} cancelled ({totals['cancelled_before_any_item']} before any "
            f"item), {totals['failed']} failed, {totals['rank_lost']} on a lost rank, "
            f"{totals['stuck']} stuck"
        ),
        (
            f"items: {totals['items_run']:,} run, {totals['items_lost']} lost, "
            f"{totals['items_repeated']} repeated; {totals['items_done_mismatch']} items_done "
            f"mismatches, {totals['returned_mismatch']} returned-counter mismatches, "
            f"{totals['phase_violations']} phase-order violations: "
            f"{'sound' if sound else 'NOT SOUND'}"
        ),
        (
            "drift: max over the last 20% of the run - max over the 20% after warm-up (the "
            "first 10%); warm/end: the first sample after warm-up and the last one, queue "
            "open (threads: without the soak's submitter thread); no_queue/closed/dropped: "
            "before the JobQueue was made, after its close(), and once no reference to it was "
            "left (gc.collect()), the harvester open each time"
        ),
        *(
            f"rank {r['rank']}: descriptors left by the dropped queue: {r['fds_left']}"
            for r in ranks
            if r["fds_left"]
        ),
        *totals["errors"],
        *(
            [
                "attacker at the leader's port all along: "
                + ", ".join(
                    f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in attacked.items()
                )
            ]
            if attacked
            else []
        ),
    ]
    return {
        "settings": {
            "minutes": minutes,
            "ranks": WORLD,
            "schedule": "1f1b",
            "microbatches": 2 * WORLD,
            "submitter_rank": SUBMITTER,
            "in_flight": IN_FLIGHT,
            "plans": dict(PLANS),
            "sizes": sizes,
            "attack": attack,
            **{k: list(v) for k, v in SIZES[sizes].items()},
            "sample_every_s": min(SAMPLE_EVERY_S, max(0.2, seconds / 20)),
            "cpus": os.cpu_count(),
        },
        "rows": rows,
        "tasks": totals,
        "sound": sound,
        "attacker": attacked,
        "queue_stats": [r["queue_stats"] for r in ranks],
        "series": {
            str(r["rank"]): [
                [s["t_s"], s["steps"], s["rss_mib"], s["threads"], s["fds"]] for s in r["series"]
            ]
            for r in ranks
        },
        "series_columns": ["t_s", "steps", "rss_mib", "threads", "fds"],
        "notes": notes,
    }
