"""JobQueue: one side-task queue for the whole training job.

Any rank submits a TaskSpec; a coordinator on rank 0 places it on the rank with the most
measured bubble time per iteration and room in its memory budget (fr.placement.Policy),
re-evaluating as tasks finish and bubbles change; that rank builds the task from the spec
and runs it on its own Harvester; states and the result come back to the submitter's
handle. Each rank's agent thread reports its bubble time and free budget to the
coordinator.

Messages travel through a TCPStore of the queue's own, set up over a gloo group of the
queue's own: nothing touches the training's process groups (NCCL or otherwise).

A rank that leaves (leave(), or its harvester closes) hands the tasks it has not started
back to the queue; a task that has started stays where it runs until it is final, so no
item ever runs twice.
"""

from __future__ import annotations

import heapq
import itertools
import os
import pickle
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import _mailbox
from .errors import HarvesterClosedError, TaskCancelledError, TaskFailedError
from .placement import Decision, Policy, RankState, TaskSpec, map_nested

_FINAL = ("done", "failed", "cancelled")
_COORD = "fr-coord"
_GRACE_S = 1.0  # how long placement waits for every rank's first bubble measurement


def _agent_box(rank: int) -> str:
    return f"fr-agent/{rank}"


class RemoteHandle:
    """The submitter's view of a task placed by the job queue."""

    def __init__(self, queue: JobQueue, task_id: str, spec: TaskSpec) -> None:
        self._queue = queue
        self._id = task_id
        self.spec = spec
        self._cv = threading.Condition()
        self._state = "queued"
        self._rank: int | None = None
        self._items_done = 0
        self._items_total: int | None = None
        self._error: str | None = None
        self._result: Any = None

    @property
    def id(self) -> str:
        """ "<submitting rank>:<n>", unique in the job."""
        return self._id

    @property
    def state(self) -> str:
        """'queued' (not placed yet, or placed and not started), 'running', 'paused',
        'done', 'failed' or 'cancelled'."""
        with self._cv:
            return self._state

    @property
    def rank(self) -> int | None:
        """The rank the task was last placed on (None until placed)."""
        with self._cv:
            return self._rank

    @property
    def items_done(self) -> int:
        with self._cv:
            return self._items_done

    @property
    def items_total(self) -> int | None:
        with self._cv:
            return self._items_total

    @property
    def progress(self) -> float:
        with self._cv:
            if not self._items_total:
                return 1.0 if self._state == "done" else 0.0
            return min(1.0, self._items_done / self._items_total)

    def done(self) -> bool:
        """True once the task is final."""
        return self.state in _FINAL

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the task is final (or `timeout` s passed); True if final."""
        with self._cv:
            return self._cv.wait_for(lambda: self._state in _FINAL, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The task's result (see TaskSpec.result). Raises TaskFailedError naming the rank
        and the error, TaskCancelledError, or TimeoutError."""
        if not self.wait(timeout):
            raise TimeoutError(f"task {self._id} is not final after {timeout} s")
        with self._cv:
            if self._state == "failed":
                raise TaskFailedError(f"task {self._id} ({self.spec.label}): {self._error}")
            if self._state == "cancelled":
                raise TaskCancelledError(
                    f"task {self._id} ({self.spec.label}) was {self._error or 'cancelled'}"
                )
            return self._result

    def cancel(self, wait: bool = True, timeout: float | None = 30.0) -> bool:
        """Stops the task wherever it runs: no further item starts there. With `wait`,
        returns once it is final (True) or `timeout` passed (False)."""
        if not self.done():
            self._queue._send_coord(("cancel", self._id))
        return self.wait(timeout) if wait else self.done()

    def _update(
        self,
        state: str,
        rank: int | None,
        done: int,
        total: int | None,
        error: str | None,
        result: Any,
    ) -> None:
        with self._cv:
            if self._state in _FINAL:
                return
            self._state = state
            if rank is not None:
                self._rank = rank
            self._items_done = done
            self._items_total = total
            self._error = error
            self._result = result
            self._cv.notify_all()

    def __repr__(self) -> str:
        return f"RemoteHandle({self._id}, {self.spec.label}, {self.state}, rank={self.rank})"


@dataclass
class _Placed:
    """The coordinator's record of a task."""

    task_id: str
    spec_bytes: bytes
    spec: TaskSpec
    priority: int
    origin: int
    rank: int | None = None
    state: str = "queued"
    cancel: bool = False


class JobQueue:
    """A job-wide side-task queue. Collective: every rank of `group` (default: the whole
    world) constructs it with its own Harvester, and calls close() at the end.

    Args:
        harvester: this rank's Harvester, where tasks placed on this rank run.
        group: the ranks that share the queue (default: the world). The queue makes a
            gloo group of these ranks for its own setup and teardown.
        depth: tasks a rank holds at once (running or waiting in its harvester); more
            wait at the coordinator, so placement follows bubbles as they change.
        host: address of rank 0's control store (default: MASTER_ADDR, else this host's
            name).
        timeout: seconds for setup and each store operation.
    """

    def __init__(
        self,
        harvester: Any,
        *,
        group: Any = None,
        depth: int = 2,
        host: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        import torch.distributed as dist

        from .tasks._base import check_count

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("JobQueue needs an initialised torch.distributed process group")
        if harvester.closed:
            raise HarvesterClosedError("the harvester is closed")
        self._h = harvester
        self._policy = Policy(check_count(depth, "depth", 1, 1024))
        ranks = (
            list(range(dist.get_world_size()))
            if group is None
            else dist.get_process_group_ranks(group)
        )
        self._ranks = ranks
        self._gloo = dist.new_group(ranks, backend="gloo")  # collective
        self._rank = dist.get_rank()
        leader = ranks[0]
        address: list[Any] = [None]
        store = None
        if self._rank == leader:
            host = host or os.environ.get("MASTER_ADDR") or socket.gethostname()
            store = _mailbox.serve(host, timeout)
            address = [(host, store.port)]
        dist.broadcast_object_list(address, src=leader, group=self._gloo)
        self._server = store  # the leader keeps the server alive until close()
        host, port = address[0]
        self._outbox = _mailbox.Outbox(_mailbox.connect(host, port, timeout))
        self._inbox = _mailbox.Inbox(_mailbox.connect(host, port, timeout), _agent_box(self._rank))
        self._leader = leader
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._submitted: dict[str, RemoteHandle] = {}
        self._hosted: dict[str, Any] = {}  # task id -> local handle, on the running rank
        self._hosted_specs: dict[str, TaskSpec] = {}
        self._reported: dict[str, tuple] = {}
        self._cancelled: set[str] = set()  # hosted tasks the submitter cancelled
        self._history: dict[str, dict[str, Any]] = {}  # every task placed here, for record()
        self._left = False
        self._stop = threading.Event()
        self._coordinator: _Coordinator | None = None
        if self._rank == leader:
            coord_inbox = _mailbox.Inbox(_mailbox.connect(host, port, timeout), _COORD)
            self._coordinator = _Coordinator(self, coord_inbox, ranks)
        dist.barrier(group=self._gloo)
        self._agent = threading.Thread(
            target=self._agent_loop, name="freeride-jobqueue", daemon=True
        )
        self._agent.start()
        if self._coordinator is not None:
            self._coordinator.start()

    # -- the public API ----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank

    def submit(self, spec: TaskSpec, priority: int = 0) -> RemoteHandle:
        """Queues `spec` for the whole job; returns a handle on this rank. Higher
        `priority` is placed first."""
        from .tasks._base import check_count

        if not isinstance(spec, TaskSpec):
            raise TypeError(
                f"spec must be a freeride.placement.TaskSpec, got {type(spec).__name__}"
            )
        priority = check_count(priority, "priority", -(2**31), 2**31 - 1)
        data = spec.dumps()
        if self._stop.is_set():
            raise HarvesterClosedError("the job queue is closed")
        task_id = f"{self._rank}:{next(self._ids)}"
        handle = RemoteHandle(self, task_id, spec)
        with self._lock:
            self._submitted[task_id] = handle
        self._send_coord(("submit", task_id, data, priority, self._rank))
        return handle

    def leave(self) -> None:
        """This rank runs no more placed tasks: those it has not started go back to the
        queue (and run elsewhere); those it started finish here. Its own submissions are
        still served."""
        with self._lock:
            if self._left:
                return
            self._left = True
        self._hand_back(list(self._hosted))

    def decisions(self) -> list[Decision]:
        """Every placement so far (rank 0 only; empty elsewhere)."""
        return [] if self._coordinator is None else list(self._coordinator.decisions)

    def record(self) -> dict[str, Any]:
        """This rank's part of the job's placement record: the tasks placed here (job id
        -> label, local task id, last state, items) and, on the coordinator's rank, every
        decision. gather_reports(..., queue=q) attaches it to each rank's report."""
        with self._lock:
            hosted = {tid: dict(entry) for tid, entry in self._history.items()}
        out: dict[str, Any] = {"rank": self._rank, "hosted": hosted}
        if self._coordinator is not None:
            out["decisions"] = [
                {
                    "task": d.task,
                    "label": d.label,
                    "rank": d.rank,
                    "reason": d.reason,
                    "bubble_ms": d.bubble_ms,
                }
                for d in self._coordinator.decisions
            ]
        return out

    def hosted(self) -> dict[str, str]:
        """Tasks placed on this rank: id -> state."""
        with self._lock:
            return {tid: h.state for tid, h in self._hosted.items()}

    def close(self) -> None:
        """Collective. Stops placing, cancels what has not finished (on every rank), and
        marks every handle final; returns once the whole job has done so."""
        import torch.distributed as dist

        if self._stop.is_set():
            return
        self.leave()
        self._stop.set()
        self._agent.join()
        with self._lock:
            hosted = list(self._hosted.items())
        for _, handle in hosted:
            handle.cancel(wait=True)
        self._report_hosted()
        dist.barrier(group=self._gloo)  # every final state is in the coordinator's box
        if self._coordinator is not None:
            self._coordinator.stop()
            self._coordinator.drain_and_cancel()
        dist.barrier(group=self._gloo)  # every update is in its submitter's box
        for message in self._inbox.drain(quiet_s=0.01):
            self._handle(message)
        with self._lock:
            pending = [h for h in self._submitted.values() if not h.done()]
        for handle in pending:
            handle._update(
                "cancelled",
                None,
                handle.items_done,
                handle.items_total,
                "cancelled: the job queue closed",
                None,
            )
        dist.barrier(group=self._gloo)  # nobody uses the store any more
        self._server = None
        dist.destroy_process_group(self._gloo)

    def __enter__(self) -> JobQueue:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the agent: every rank ------------------------------------------------------------------

    def _send_coord(self, message: tuple) -> None:
        self._outbox.send(_COORD, message)

    def _agent_loop(self) -> None:
        idle = 0.001
        last_stats = 0.0
        while not self._stop.is_set():
            message = self._inbox.poll()
            if message is not None:
                self._handle(message)
                idle = 0.001
                continue
            self._report_hosted()
            if self._h.closed and not self._left:
                self.leave()
            now = time.monotonic()
            if now - last_stats > 0.1:
                last_stats = now
                self._send_stats()
            time.sleep(idle)
            idle = min(idle * 2, 0.01)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "run":
            _, task_id, spec_bytes, priority = message
            self._run(task_id, spec_bytes, priority)
        elif kind == "cancel":
            with self._lock:
                handle = self._hosted.get(message[1])
                self._cancelled.add(message[1])
            if handle is not None:
                handle.cancel(wait=False)
        elif kind == "update":
            _, task_id, state, rank, done, total, error, blob = message
            with self._lock:
                handle = self._submitted.get(task_id)
            if handle is None:
                return
            result = None
            if blob is not None:
                result = pickle.loads(self._inbox.take_blob(*blob))
            handle._update(state, rank, done, total, error, result)

    def _run(self, task_id: str, spec_bytes: bytes, priority: int) -> None:
        if self._left or self._h.closed:
            self._send_coord(("handback", self._rank, [task_id]))
            return
        try:
            spec = pickle.loads(spec_bytes)
            task = spec.build()
            handle = self._h.submit(task, priority)
        except HarvesterClosedError:
            self._send_coord(("handback", self._rank, [task_id]))
            return
        except Exception as exc:  # noqa: BLE001 - any failure to build is the task's
            self._send_coord(
                (
                    "state",
                    task_id,
                    self._rank,
                    "failed",
                    0,
                    None,
                    f"on rank {self._rank}: {type(exc).__name__}: {exc}",
                    None,
                )
            )
            return
        # The harvester's report names the local task after the job's.
        self._h._recorder.name_task(handle.id, f"{spec.label} [job task {task_id}]")
        with self._lock:
            self._hosted[task_id] = handle
            self._hosted_specs[task_id] = spec
            self._history[task_id] = {
                "label": spec.label,
                "local_id": handle.id,
                "state": "queued",
                "items": 0,
            }

    def _hand_back(self, task_ids: list[str]) -> None:
        """Cancels the given hosted tasks that have not started and returns them to the
        queue; a task that started in the meantime stays and finishes here."""
        back = []
        for task_id in task_ids:
            with self._lock:
                handle = self._hosted.get(task_id)
            if handle is None or handle.done() or _started(handle):
                continue
            handle.cancel(wait=True)
            if _started(handle):
                continue  # it began before the cancel landed: it is reported as it ends
            self._moved(task_id)
            back.append(task_id)
        self._send_coord(("handback", self._rank, back))

    def _moved(self, task_id: str) -> None:
        with self._lock:
            if task_id in self._history:
                self._history[task_id]["state"] = "moved"
        self._forget(task_id)

    def _forget(self, task_id: str) -> None:
        with self._lock:
            self._hosted.pop(task_id, None)
            self._hosted_specs.pop(task_id, None)
            self._reported.pop(task_id, None)
            self._cancelled.discard(task_id)

    def _report_hosted(self) -> None:
        """Sends the coordinator each hosted task's state when it changed; final ones
        carry their result and are forgotten here."""
        with self._lock:
            hosted = list(self._hosted.items())
        for task_id, handle in hosted:
            state = handle.state
            snapshot = (state, handle.items_done)
            if self._reported.get(task_id) == snapshot:
                continue
            self._reported[task_id] = snapshot
            with self._lock:
                if task_id in self._history:
                    self._history[task_id].update(state=state, items=handle.items_done)
            total = getattr(handle, "items_total", None)
            error, blob = None, None
            if (
                state == "cancelled"
                and not _started(handle)
                and task_id not in self._cancelled
                and (self._left or self._h.closed)
            ):
                # Cancelled by this rank leaving before any item ran: it moves.
                self._moved(task_id)
                self._send_coord(("handback", self._rank, [task_id]))
                continue
            if state in _FINAL:
                error, blob = self._outcome(task_id, handle)
                self._forget(task_id)
            self._send_coord(
                ("state", task_id, self._rank, state, handle.items_done, total, error, blob)
            )

    def _outcome(self, task_id: str, handle: Any) -> tuple[str | None, tuple | None]:
        """(error, result blob) of a final hosted task."""
        spec = self._hosted_specs.get(task_id)
        try:
            value = handle.result(timeout=0)
        except TaskCancelledError as exc:
            return f"cancelled on rank {self._rank}: {exc}", None
        except Exception as exc:  # noqa: BLE001 - reported to the submitter
            return f"on rank {self._rank}: {exc}", None
        if spec is None or spec.result == "discard":
            return None, None
        try:
            if spec.result == "return":
                payload = pickle.dumps(_portable(value), protocol=pickle.HIGHEST_PROTOCOL)
            else:
                path = spec.result.format(id=task_id.replace(":", "-"), rank=self._rank)
                import torch

                torch.save(_portable(value), path)
                payload = pickle.dumps(path)
        except Exception as exc:  # noqa: BLE001 - a result that cannot travel fails the task
            return f"on rank {self._rank}: the result could not be returned: {exc}", None
        key = f"fr-result/{task_id}"
        return None, (key, self._outbox.put_blob(key, payload))

    def _send_stats(self) -> None:
        recorder = self._h._recorder
        try:
            recorder.flush(block=False)
        except Exception:  # noqa: BLE001 - stats are best effort; a closed harvester has none
            return
        bubble, longest, iterations = recorder.bubble_stats()
        budget = self._h.memory_budget
        free = None if budget is None else max(0, budget - self._h.memory_used)
        self._send_coord(("stats", self._rank, bubble, longest, free, iterations))


def _started(handle: Any) -> bool:
    """Whether any item (or step) of a local task may have run."""
    return handle.items_done > 0 or getattr(handle, "launches", 0) > 0 or handle.state == "running"


def _portable(value: Any) -> Any:
    """`value` with tensors and device arrays moved to host memory, for the trip back."""
    return map_nested(value, _to_host)


def _to_host(value: Any) -> Any:
    module = type(value).__module__
    if module.startswith("torch") and hasattr(value, "cpu"):
        return value.detach().cpu()
    if module.startswith("cupy") and hasattr(value, "get"):
        return value.get()
    return value


class _Coordinator:
    """Rank 0's placement loop."""

    def __init__(self, queue: JobQueue, inbox: _mailbox.Inbox, ranks: list[int]) -> None:
        self._q = queue
        self._inbox = inbox
        self._ranks = {r: RankState(r) for r in ranks}
        self._tasks: dict[str, _Placed] = {}
        self._pending: list[tuple[int, int, str]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="freeride-placement", daemon=True)
        self.decisions: list[Decision] = []
        self._first_measured: float | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def drain_and_cancel(self) -> None:
        """At close: every message handled, every unplaced task cancelled."""
        for message in self._inbox.drain(quiet_s=0.01):
            self._handle(message)
        for task in self._tasks.values():
            if task.state not in _FINAL:
                self._final(
                    task, "cancelled", task.rank, 0, None, "cancelled: the job queue closed", None
                )

    def _loop(self) -> None:
        idle = 0.001
        while not self._stop.is_set():
            message = self._inbox.poll()
            if message is not None:
                self._handle(message)
                idle = 0.001
                continue
            self._place()
            time.sleep(idle)
            idle = min(idle * 2, 0.01)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "submit":
            _, task_id, data, priority, origin = message
            spec = pickle.loads(data)
            self._tasks[task_id] = _Placed(task_id, data, spec, priority, origin)
            heapq.heappush(self._pending, (-priority, next(self._seq), task_id))
        elif kind == "stats":
            _, rank, bubble, longest, free, iterations = message
            r = self._ranks[rank]
            r.bubble_ns, r.longest_bubble_ns, r.free_bytes, r.iterations = (
                bubble,
                longest,
                free,
                iterations,
            )
        elif kind == "state":
            _, task_id, rank, state, done, total, error, blob = message
            task = self._tasks.get(task_id)
            if task is None or task.state in _FINAL:
                return
            if state in _FINAL:
                self._final(task, state, rank, done, total, error, blob)
            else:
                task.state = state
                self._notify(task, state, rank, done, total, None, None)
        elif kind == "handback":
            _, rank, task_ids = message
            r = self._ranks[rank]
            r.alive = False
            for task_id in task_ids:
                task = self._tasks.get(task_id)
                r.outstanding.discard(task_id)
                r.iterative.discard(task_id)
                if task is None or task.state in _FINAL:
                    continue
                task.rank, task.state = None, "queued"
                if task.cancel:
                    self._final(task, "cancelled", rank, 0, None, "cancelled", None)
                    continue
                heapq.heappush(self._pending, (-task.priority, next(self._seq), task_id))
                self._notify(task, "queued", None, 0, None, None, None)
        elif kind == "cancel":
            task = self._tasks.get(message[1])
            if task is None or task.state in _FINAL:
                return
            task.cancel = True
            if task.rank is None:
                self._final(task, "cancelled", None, 0, None, "cancelled", None)
            else:
                self._q._outbox.send(_agent_box(task.rank), ("cancel", task.task_id))

    def _measuring(self, ranks: list[RankState]) -> bool:
        """True while some ranks have measured bubbles and others have not reported theirs
        yet (for at most _GRACE_S): placing then would favour whoever reported first."""
        measured = [r.bubble_ns > 0 for r in ranks if r.alive]
        if not any(measured):
            return False
        now = time.monotonic()
        if self._first_measured is None:
            self._first_measured = now
        return not all(measured) and now - self._first_measured < _GRACE_S

    def _place(self) -> None:
        """Places pending tasks, most urgent first, while some rank has room."""
        ranks = list(self._ranks.values())
        if self._measuring(ranks):
            return
        deferred = []
        while self._pending:
            entry = heapq.heappop(self._pending)
            task = self._tasks[entry[2]]
            if task.state in _FINAL or task.rank is not None:
                continue
            choice = self._q._policy.choose(task.spec, ranks)
            if choice is None:
                deferred.append(entry)
                if not any(r.alive and len(r.outstanding) < self._q._policy.depth for r in ranks):
                    break
                continue
            rank, reason = choice
            task.rank = rank
            r = self._ranks[rank]
            r.outstanding.add(task.task_id)
            if task.spec.is_iterative:
                r.iterative.add(task.task_id)
            self.decisions.append(
                Decision(
                    task.task_id,
                    task.spec.label,
                    rank,
                    reason,
                    {x.rank: x.bubble_ns / 1e6 for x in ranks},
                )
            )
            self._q._outbox.send(
                _agent_box(rank), ("run", task.task_id, task.spec_bytes, task.priority)
            )
            self._notify(task, "queued", rank, 0, None, None, None)
        for entry in deferred:
            heapq.heappush(self._pending, entry)

    def _final(
        self,
        task: _Placed,
        state: str,
        rank: int | None,
        done: int,
        total: int | None,
        error: str | None,
        blob: tuple | None,
    ) -> None:
        task.state = state
        if task.rank is not None:
            r = self._ranks[task.rank]
            r.outstanding.discard(task.task_id)
            r.iterative.discard(task.task_id)
        self._notify(task, state, rank, done, total, error, blob)

    def _notify(
        self,
        task: _Placed,
        state: str,
        rank: int | None,
        done: int,
        total: int | None,
        error: str | None,
        blob: tuple | None,
    ) -> None:
        self._q._outbox.send(
            _agent_box(task.origin), ("update", task.task_id, state, rank, done, total, error, blob)
        )
