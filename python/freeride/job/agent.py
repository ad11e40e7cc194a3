"""A rank's agent: runs the tasks placed on its rank on the rank's Harvester, reports
their states and results, and delivers the coordinator's updates to the handles of the
tasks this rank submitted."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections import OrderedDict
from typing import Any

from ..errors import HarvesterClosedError, TaskCancelledError
from ..handle import FINAL_STATES
from . import messages as m
from .channel import Link
from .files import write_atomically
from .handle import RemoteHandle
from .placement import TaskSpec, map_nested
from .serving import Serving

log = logging.getLogger("freeride.job")

_KEEP_HISTORY = 2_000


class Agent(Serving):
    """One per rank; its thread reads what the coordinator sends this rank."""

    def __init__(self, harvester: Any, rank: int, link: Link) -> None:
        super().__init__("freeride-jobqueue", cuda=harvester.backend == "cuda")
        self._h = harvester
        self.rank = rank
        self._link = link
        self.lock = threading.Lock()
        self._report_lock = threading.Lock()
        self.submitted: dict[str, RemoteHandle] = {}
        self._hosted: dict[str, Any] = {}  # task id -> local handle
        self._hosted_specs: dict[str, TaskSpec] = {}
        self._reported: dict[str, tuple] = {}
        self._cancelled: set[str] = set()  # hosted tasks the submitter cancelled
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.left = False
        self.lost: set[int] = set()
        self.bye = threading.Event()
        self.malformed = 0

    @property
    def dropped(self) -> int:
        return self._link.dropped

    @property
    def unreadable(self) -> int:
        return self._link.malformed

    def _send_coord(self, message: tuple) -> None:
        self._link.send(message)

    def step(self) -> bool:
        message = self._link.poll()
        if message is not None:
            self.handle(message)
            return True
        self.report_hosted()
        if self._h.closed and not self.left:
            self.leave()
        return False

    # -- messages ----------------------------------------------------------------------------

    def handle(self, message: Any) -> None:
        """Acts on one verified message; a malformed one is counted and logged."""
        try:
            message = m.to_agent(message)
        except m.Malformed as exc:
            self.malformed += 1
            log.warning(
                "freeride job queue: rank %d dropped a malformed message: %s", self.rank, exc
            )
            return
        kind = message[0]
        if kind == "run":
            self._run(*message[1:])
        elif kind == "cancel":
            with self.lock:
                handle = self._hosted.get(message[1])
                self._cancelled.add(message[1])
            if handle is not None:
                handle.cancel(wait=False)
        elif kind == "update":
            self._update(*message[1:])
        elif kind == "lost":
            self.lost.add(message[1])
            if message[1] == self.rank:
                # The queue gave up on this rank (it was not heard from for rank_timeout)
                # and failed what runs here: nothing of it may go on running.
                log.warning(
                    "freeride job queue: rank %d was declared lost; cancelling its tasks",
                    self.rank,
                )
                self.left = True
                self.cancel_hosted(wait=False)
                self.bye.set()
        elif kind == "bye":
            self.bye.set()
        else:  # "status" and "closed" are for outside clients
            self.malformed += 1

    def _update(self, task_id: str, *fields: Any) -> None:
        with self.lock:
            handle = self.submitted.get(task_id)
        if handle is None:
            return
        update = m.Update(*fields)
        handle._apply(update)
        if update.state in FINAL_STATES:
            with self.lock:
                self.submitted.pop(task_id, None)

    def _run(self, task_id: str, spec_bytes: bytes, priority: int) -> None:
        if self.left or self._h.closed:
            self._send_coord(("handback", self.rank, [task_id]))
            return
        try:
            spec = pickle.loads(spec_bytes)
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"not a TaskSpec but {type(spec).__name__}")
            task = spec.build()
            # The harvester's report names the local task after the job's.
            handle = self._h.submit(task, priority, name=f"{spec.label} [job task {task_id}]")
        except HarvesterClosedError:
            self._send_coord(("handback", self.rank, [task_id]))
            return
        except Exception as exc:  # noqa: BLE001 - any failure to build is the task's
            self._send_coord(
                (
                    "state",
                    task_id,
                    self.rank,
                    "failed",
                    0,
                    None,
                    f"on rank {self.rank}: {type(exc).__name__}: {exc}",
                    "failed",
                    None,
                )
            )
            return
        with self.lock:
            self._hosted[task_id] = handle
            self._hosted_specs[task_id] = spec
            self.history[task_id] = {
                "label": spec.label,
                "local_id": handle.id,
                "state": "queued",
                "items": 0,
            }
            while len(self.history) > _KEEP_HISTORY:
                self.history.popitem(last=False)

    # -- hosted tasks ------------------------------------------------------------------------

    def hosted(self) -> dict[str, Any]:
        with self.lock:
            return dict(self._hosted)

    def leave(self) -> None:
        with self.lock:
            if self.left:
                return
            self.left = True
        self.hand_back(list(self.hosted()))

    def hand_back(self, task_ids: list[str]) -> None:
        """Cancels the given hosted tasks that have not started and returns them to the
        queue; a task that started in the meantime stays and finishes here."""
        back = []
        for task_id in task_ids:
            with self.lock:
                handle = self._hosted.get(task_id)
            if handle is None or handle.done() or _started(handle):
                continue
            handle.cancel(wait=True)
            if _started(handle):
                continue  # it began before the cancel landed: it is reported as it ends
            self._moved(task_id)
            back.append(task_id)
        self._send_coord(("handback", self.rank, back))

    def cancel_hosted(self, wait: bool = True, timeout: float | None = 30.0) -> None:
        """Cancels every hosted task (items in flight finish, no new one starts); with
        `wait`, waits up to `timeout` s in all."""
        handles = list(self.hosted().values())
        for handle in handles:
            handle.cancel(wait=False)
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            for handle in handles:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                handle.wait(left)

    def _moved(self, task_id: str) -> None:
        with self.lock:
            if task_id in self.history:
                self.history[task_id]["state"] = "moved"
        self._forget(task_id)

    def _forget(self, task_id: str) -> None:
        with self.lock:
            self._hosted.pop(task_id, None)
            self._hosted_specs.pop(task_id, None)
            self._reported.pop(task_id, None)
            self._cancelled.discard(task_id)

    def report_hosted(self) -> None:
        """Sends the coordinator each hosted task's state when it changed; final ones
        carry their result and are forgotten here."""
        with self._report_lock:
            for task_id, handle in self.hosted().items():
                self._report(task_id, handle)

    def _report(self, task_id: str, handle: Any) -> None:
        state = handle.state
        snapshot = (state, handle.items_done)
        if self._reported.get(task_id) == snapshot:
            return
        self._reported[task_id] = snapshot
        with self.lock:
            if task_id in self.history:
                self.history[task_id].update(state=state, items=handle.items_done)
        total = getattr(handle, "items_total", None)
        if (
            state == "cancelled"
            and not _started(handle)
            and task_id not in self._cancelled
            and (self.left or self._h.closed)
        ):
            # Cancelled by this rank leaving before any item ran: it moves.
            self._moved(task_id)
            self._send_coord(("handback", self.rank, [task_id]))
            return
        error, kind, blob = None, None, None
        if state in FINAL_STATES:
            error, kind, blob = self._outcome(task_id, handle)
            self._forget(task_id)
        self._send_coord(
            ("state", task_id, self.rank, state, handle.items_done, total, error, kind, blob)
        )

    def _outcome(self, task_id: str, handle: Any) -> tuple[str | None, str | None, bytes | None]:
        """(error, error kind, pickled result) of a final hosted task."""
        spec = self._hosted_specs.get(task_id)
        try:
            value = handle.result(timeout=0)
        except TaskCancelledError as exc:
            return f"cancelled on rank {self.rank}: {exc}", "cancelled", None
        except Exception as exc:  # noqa: BLE001 - reported to the submitter
            return f"on rank {self.rank}: {exc}", "failed", None
        if spec is None or spec.result == "discard":
            return None, None, None
        try:
            if spec.result == "return":
                payload = pickle.dumps(_portable(value), protocol=pickle.HIGHEST_PROTOCOL)
            else:
                path = spec.result.format(id=task_id.replace(":", "-"), rank=self.rank)
                import torch

                portable = _portable(value)
                write_atomically(path, lambda f: torch.save(portable, f))
                payload = pickle.dumps(path)
        except Exception as exc:  # noqa: BLE001 - a result that cannot travel fails the task
            return (f"on rank {self.rank}: the result could not be returned: {exc}", "failed", None)
        if len(payload) > m.MAX_PAYLOAD:
            error = (
                f"on rank {self.rank}: the result is {len(payload)} bytes pickled, more than "
                f"the queue carries ({m.MAX_PAYLOAD}); give the TaskSpec result='<path>' instead"
            )
            return error, "failed", None
        return None, None, payload

    def stats(self) -> bytes:
        """This rank's bubbles and free budget, packed (messages.pack_stats): also its
        heartbeat, so it is sent even when the harvester has nothing to tell."""
        bubble, longest, iterations = 0, 0, 0
        try:
            bubble, longest, iterations = self._h.bubble_stats()
        except Exception:  # noqa: BLE001, S110 - a closed harvester has no record, still alive
            pass
        budget = self._h.memory_budget
        free = None
        if budget is not None:
            try:
                free = max(0, int(budget - self._h.memory_used))
            except Exception:  # noqa: BLE001
                free = 0
        return m.pack_stats(bubble, longest, free, iterations)


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
