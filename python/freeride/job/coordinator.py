"""The job queue's coordinator: one thread on the queue's leader rank that places tasks,
relays their states to whoever submitted them, notices ranks that went silent, and runs
the queue's close."""

from __future__ import annotations

import heapq
import itertools
import logging
import pickle
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from ..handle import FINAL_STATES
from . import liveness
from . import messages as m
from .channel import Hub
from .placement import Decision, Policy, RankState, TaskSpec
from .serving import Serving
from .tickets import Tickets

log = logging.getLogger("freeride.job")

_GRACE_S = 1.0  # how long placement waits for every rank's first bubble measurement
_KEEP_FINAL = 2_000  # final tasks kept for status(); older ones are forgotten
_CLOSED_CLIENTS = 8192  # twice the ended sessions the hub remembers (channel/hub.py)
_KEEP_DECISIONS = 2_000
# With messages waiting without a break, placement and liveness still run this often: a
# flood (of table requests, say) delays them by at most this.
_HOUSEKEEP_S = 0.05
# The task table is built for one box at most this often (each is a walk of every task and
# up to thousands of rows sent); a request that comes sooner is answered then, with the
# latest of its box's requests.
_TABLE_EVERY_S = 0.1
# Status readers' boxes kept to be told "closed": as many as the hub keeps their sessions.
_STATUS_BOXES = 256


@dataclass
class _Placed:
    """The coordinator's record of a task."""

    task_id: str
    spec_bytes: bytes | None
    spec: TaskSpec | None
    label: str
    priority: int
    reply: str  # the submitter's box
    rank: int | None = None
    state: str = "queued"
    cancel: bool = False
    done: int = 0
    total: int | None = None


class Coordinator(Serving):
    """The leader's placement loop, on the messages of `hub` (whose sessions say who
    sent each). `leader`: this rank, whose liveness is never in question here. `cuda`:
    this rank's harvester is on a GPU, so the thread is relaxed for graph capture
    (unpickling a spec whose arguments hold CUDA tensors allocates)."""

    def __init__(
        self,
        policy: Policy,
        hub: Hub,
        ranks: list[int],
        leader: int,
        rank_timeout: float,
        cuda: bool = False,
    ) -> None:
        # Messages wake it (Hub.wait); the pause only bounds how late liveness is read.
        super().__init__("freeride-jobqueue-coord", max_idle=0.05, cuda=cuda)
        self._policy = policy
        self._hub = hub
        self._ranks = {r: RankState(r) for r in ranks}
        self._all_ranks = frozenset(ranks)
        self._leader = leader
        self._rank_timeout = rank_timeout
        self._started = time.monotonic()
        self._liveness_read = 0.0
        self._stats_read = 0.0
        # Liveness is read a few times per stats interval: more often finds nothing new.
        self._liveness_every = max(0.25, liveness.every(len(ranks), rank_timeout) / 2)
        self._told_lost: dict[int, float] = {}
        self._lost: set[int] = set()
        self._closing: set[int] = set()
        self._gone: set[int] = set()
        self._clients: set[str] = set()
        # Status readers' boxes, told "closed" at the end: the latest _STATUS_BOXES to say
        # hello (a box per session, and sessions come and go without end), never closed
        # boxes (nothing is sent them but what they ask).
        self._status_boxes: OrderedDict[str, None] = OrderedDict()
        self._closed_boxes: set[str] = set()
        # Clients' closed boxes, oldest first: the latest _CLOSED_CLIENTS are kept, not
        # one for every client that ever said bye (an older box, which the hub has
        # forgotten too, can take no message)
        self._closed_clients: deque[str] = deque()
        self._tasks: dict[str, _Placed] = {}
        self._finals: deque[str] = deque()
        self._pending: list[tuple[int, int, str]] = []
        self._seq = itertools.count()
        self._finished = threading.Event()  # close ran: every final state sent
        self._finish_now = threading.Event()  # the leader's close() ran out of time
        self._bye_at: float | None = None
        self._first_measured: float | None = None
        self.decisions: deque[Decision] = deque(maxlen=_KEEP_DECISIONS)
        self.malformed = 0
        self._busy_since: float | None = None  # when messages began to come without a break
        self._tickets = Tickets()  # each box's last table: its ticket, when it went
        self._table_due: dict[str, int] = {}  # box -> its latest request not answered yet

    # -- lifetime ----------------------------------------------------------------------------

    def finish(self) -> None:
        """Closes the queue now, whichever ranks have not closed yet (the leader's close()
        waited as long as it may): what is not final ends cancelled, and every rank and
        client is told. Returns at once; the thread does it."""
        self._finish_now.set()

    @property
    def lost(self) -> set[int]:
        return set(self._lost)

    def step(self) -> bool:
        """Handles one message, or (with none waiting, or after _HOUSEKEEP_S of messages
        without a break) checks liveness, answers the table requests that waited and
        places; ends the thread once the close is over. A burst shorter than that is
        handled whole before anything of it is placed, most urgent first."""
        now = time.monotonic()
        flood = self._busy_since is not None and now - self._busy_since >= _HOUSEKEEP_S
        if not flood:
            received = self._hub.poll()
            if received is not None:
                if self._busy_since is None:
                    self._busy_since = now
                self.handle(*received)
                return True
        self._busy_since = now if flood else None
        self._answer_tables(now)
        self._read_stats()
        self._check_liveness()
        if not self._finished.is_set():
            if self._finish_now.is_set() or self._closing | self._lost >= self._all_ranks:
                self._finish()
            else:
                self._place()
        elif self._all_gone():
            self.halt()
        return flood  # messages are waiting, not looked at: again at once

    def idle(self, seconds: float) -> None:
        """Sleeps until the hub has a message (or `seconds`): a job's stats arrive a
        thousand times a second, each one a wake-up, never a poll in between."""
        self._hub.wait(seconds)

    def _all_gone(self) -> bool:
        waiting = self._closing - self._gone
        if not waiting:
            return True
        # A rank that closed but never says it is gone is treated as lost after the bound.
        return self._bye_at is not None and time.monotonic() - self._bye_at > self._rank_timeout

    # -- messages ----------------------------------------------------------------------------

    def handle(self, sender: str, message: Any) -> None:
        """Acts on one message from `sender`'s authenticated session; a malformed one,
        or one whose fields speak for someone else, is counted and logged."""
        try:
            message = m.to_coordinator(message)
            kind = message[0]
            rank = m.rank_of(sender)
            if rank is not None and rank in self._lost and kind != "gone":
                self._tell_lost(rank, sender)
                return
            if m.is_status_box(sender) and kind not in ("hello", "status", "bye"):
                raise m.Malformed(f"{kind!r} from {sender}, whose credential only reads status")
            if kind in ("state", "handback", "closing", "gone"):
                claimed = message[1] if kind != "state" else message[2]
                if claimed != rank or rank not in self._ranks:
                    raise m.Malformed(f"{kind!r} for rank {claimed} from {sender}")
            elif kind in ("submit", "hello", "status", "bye"):
                box = message[4] if kind == "submit" else message[1]
                if box != sender:
                    raise m.Malformed(f"{kind!r} names box {box!r} but came from {sender}")
                if kind == "submit" and not message[1].startswith(m.task_prefix(sender)):
                    raise m.Malformed(f"task id {message[1]!r} is not of {sender}'s")
            elif kind == "cancel" and rank is None:
                task = self._tasks.get(message[1])
                if task is not None and task.reply != sender:
                    raise m.Malformed(f"{sender} cancels {message[1]!r}, a task not its own")
            getattr(self, "_on_" + kind)(*message[1:])
        except m.Malformed as exc:
            self.malformed += 1
            log.warning("freeride job queue: coordinator dropped a malformed message: %s", exc)

    def _on_submit(self, task_id: str, data: bytes, priority: int, reply: str) -> None:
        if task_id in self._tasks:
            raise m.Malformed(f"task id {task_id!r} is taken")
        try:
            spec = pickle.loads(data)
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"not a TaskSpec but {type(spec).__name__}")
            label = spec.label
        except Exception as exc:  # noqa: BLE001 - fails the task, not the coordinator
            task = _Placed(task_id, None, None, "?", priority, reply)
            self._tasks[task_id] = task
            error = f"the spec could not be read: {type(exc).__name__}: {exc}"
            self._final(task, m.Update("failed", None, 0, None, error, "failed"))
            return
        self._tasks[task_id] = _Placed(task_id, data, spec, label, priority, reply)
        if self._finished.is_set():
            self._final(
                self._tasks[task_id],
                m.Update(
                    "cancelled", None, 0, None, "cancelled: the job queue closed", "cancelled"
                ),
            )
            return
        heapq.heappush(self._pending, (-priority, next(self._seq), task_id))

    def _read_stats(self) -> None:
        """Every rank's latest stats, at most 10 times a second (the hub keeps the latest
        of each; a job of thousands of ranks sends a thousand a second)."""
        now = time.monotonic()
        if now - self._stats_read < 0.1:
            return
        self._stats_read = now
        for box, raw in self._hub.take_stats().items():
            rank = m.rank_of(box)
            values = m.unpack_stats(raw)
            if rank is None or rank not in self._ranks or values is None:
                self.malformed += 1
            elif rank in self._lost:
                self._tell_lost(rank, box)
            else:
                self._on_stats(rank, *values)

    def _on_stats(
        self, rank: int, bubble: int, longest: int, free: int | None, iterations: int
    ) -> None:
        r = self._ranks[rank]
        r.bubble_ns, r.longest_bubble_ns, r.free_bytes, r.iterations = (
            bubble,
            longest,
            free,
            iterations,
        )

    def _on_state(
        self,
        task_id: str,
        rank: int,
        state: str,
        done: int,
        total: int | None,
        error: str | None,
        kind: str | None,
        result: bytes | None,
    ) -> None:
        task = self._tasks.get(task_id)
        if task is None or task.state in FINAL_STATES or task.rank != rank:
            return
        if state in FINAL_STATES:
            self._final(task, m.Update(state, rank, done, total, error, kind, result))
        else:
            task.state, task.done, task.total = state, done, total
            self._notify(task, m.Update(state, rank, done, total))

    def _on_handback(self, rank: int, task_ids: list[str]) -> None:
        r = self._ranks[rank]
        r.alive = False  # a rank hands back only when it leaves or its harvester closed
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            r.outstanding.discard(task_id)
            r.iterative.discard(task_id)
            if task is None or task.state in FINAL_STATES or task.rank != rank:
                continue
            self._requeue(task)

    def _on_cancel(self, task_id: str) -> None:
        task = self._tasks.get(task_id)
        if task is None or task.state in FINAL_STATES:
            return
        task.cancel = True
        if task.rank is None:
            self._final(
                task, m.Update("cancelled", None, task.done, task.total, "cancelled", "cancelled")
            )
        else:
            self._send(m.agent_box(task.rank), ("cancel", task.task_id))

    def _on_closing(self, rank: int) -> None:
        self._closing.add(rank)
        self._ranks[rank].alive = False
        if self._finished.is_set():  # late: it still gets its bye
            self._hub.send(m.agent_box(rank), ("bye",))

    def _on_gone(self, rank: int) -> None:
        self._gone.add(rank)
        if rank not in self._closing:  # left without closing (abort): like a lost rank,
            self._depart(rank, lost=False)  # but its own reports already came in

    def _on_hello(self, box: str) -> None:
        if m.is_status_box(box):
            self._status_boxes[box] = None
            self._status_boxes.move_to_end(box)
            while len(self._status_boxes) > _STATUS_BOXES:
                self._status_boxes.popitem(last=False)
        else:
            self._clients.add(box)
        if self._finished.is_set():
            self._send(box, ("closed",))

    def _on_status(self, box: str, request: int, ticket: int | None) -> None:
        now = time.monotonic()
        if not self._tickets.admits(box, ticket, now):
            return  # it has not read its last table (counted): at most one queued a box
        if not self._table_may_go(box, now):
            self._table_due[box] = request  # answered by _answer_tables, with the latest
            return
        self._send_table(box, request, now)

    @property
    def unanswered(self) -> int:
        """Table requests not answered: they did not present their box's last ticket,
        and no waiver was due (tickets.py)."""
        return self._tickets.refused

    def _table_may_go(self, box: str, now: float) -> bool:
        """Whether `box`'s last table went at least _TABLE_EVERY_S ago (or never)."""
        sent = self._tickets.sent_at(box)
        return sent is None or now - sent >= _TABLE_EVERY_S

    def _answer_tables(self, now: float) -> None:
        """Answers the table requests that came too soon after their box's last table,
        once they may be."""
        for box, request in list(self._table_due.items()):
            if self._table_may_go(box, now):
                del self._table_due[box]
                self._send_table(box, request, now)

    def _send_table(self, box: str, request: int, now: float) -> None:
        """Sends `box` the task table, answering `request`, with the fresh ticket its next
        request must present (tickets.py)."""
        if box in self._closed_boxes:
            return  # nothing goes there (_send): no table to build, no ticket to keep
        rows = [
            {
                "id": t.task_id,
                "label": t.label,
                "state": t.state,
                "rank": t.rank,
                "items_done": t.done,
                "items_total": t.total,
                "priority": t.priority,
                "origin": t.reply,
            }
            for t in self._tasks.values()
        ]
        self._send(box, ("status", request, self._tickets.issue(box, now), rows))

    def _on_bye(self, box: str) -> None:
        if m.is_status_box(box):
            # Nothing is sent a status box but what it asks for: it needs no closed mark
            # (one a session, and status sessions come and go without end).
            # Its ticket is kept: the hub gives its box back to its connection if it
            # authenticates again, and a box whose ticket a bye cleared would be sent a
            # table more each time.
            self._status_boxes.pop(box, None)
            self._table_due.pop(box, None)
        else:
            self._clients.discard(box)
            self._closed_boxes.add(box)
            self._closed_clients.append(box)
            while len(self._closed_clients) > _CLOSED_CLIENTS:
                self._closed_boxes.discard(self._closed_clients.popleft())
            self._tickets.forget(box)  # closed: never sent a table again
            self._table_due.pop(box, None)
        self._hub.drop(box)  # its session ends: beaten no more

    # -- ranks that go away -------------------------------------------------------------------

    def _check_liveness(self) -> None:
        """A few times per stats interval: a rank the hub has not heard from for
        rank_timeout (each sends its stats every liveness.every) is lost. The leader's own
        rank is never checked: this thread running is its liveness."""
        now = time.monotonic()
        if now - self._liveness_read < self._liveness_every:
            return
        self._liveness_read = now
        heard_all = self._hub.heard_all()
        for rank in self._ranks:
            if rank == self._leader or rank in self._lost or rank in self._gone:
                continue
            heard = heard_all.get(m.agent_box(rank))
            if now - (self._started if heard is None else heard) > self._rank_timeout:
                self._depart(rank, lost=True)

    def _tell_lost(self, rank: int, box: str) -> None:
        """A lost rank is heard from again: it is told (once a second at most), and
        cancels what it runs; its messages are not acted on."""
        now = time.monotonic()
        if now - self._told_lost.get(rank, 0.0) >= 1.0:
            self._told_lost[rank] = now
            self._hub.send(box, ("lost", rank))

    def _depart(self, rank: int, lost: bool) -> None:
        """`rank` is gone for good: its unstarted tasks go elsewhere, its started ones fail
        (lost) and the tasks it submitted are cancelled (nobody waits for them)."""
        if lost:
            self._lost.add(rank)
            log.warning(
                "freeride job queue: rank %d sent nothing for %.1f s: declared lost",
                rank,
                self._rank_timeout,
            )
        r = self._ranks[rank]
        r.alive = False
        box = m.agent_box(rank)
        self._closed_boxes.add(box)
        for task in list(self._tasks.values()):
            if task.state in FINAL_STATES:
                continue
            if task.rank == rank:
                r.outstanding.discard(task.task_id)
                r.iterative.discard(task.task_id)
                if task.state == "queued" or not lost:
                    self._requeue(task)
                else:
                    error = (
                        f"rank {rank} was lost while the task ran there "
                        f"(silent for {self._rank_timeout:g} s)"
                    )
                    self._final(
                        task, m.Update("failed", rank, task.done, task.total, error, "rank_lost")
                    )
            if task.reply == box and task.state not in FINAL_STATES:
                self._on_cancel(task.task_id)
        if lost:  # the lost rank too: if it lives after all, it must not wait for us
            for other in self._ranks:
                if other == rank or (other not in self._lost and other not in self._gone):
                    self._hub.send(m.agent_box(other), ("lost", rank))

    def _requeue(self, task: _Placed) -> None:
        task.rank, task.state = None, "queued"
        if task.cancel:
            self._final(
                task, m.Update("cancelled", None, task.done, task.total, "cancelled", "cancelled")
            )
            return
        heapq.heappush(self._pending, (-task.priority, next(self._seq), task.task_id))
        self._notify(task, m.Update("queued", None, 0, None))

    # -- placement ---------------------------------------------------------------------------

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
        if not self._pending:
            return  # (most idle steps: nothing to walk the ranks for)
        ranks = list(self._ranks.values())
        if self._measuring(ranks):
            return
        deferred = []
        while self._pending:
            entry = heapq.heappop(self._pending)
            task = self._tasks.get(entry[2])
            if task is None or task.state in FINAL_STATES or task.rank is not None:
                continue
            choice = self._policy.choose(task.spec, ranks)
            if choice is None:
                deferred.append(entry)
                if not any(r.alive and len(r.outstanding) < self._policy.depth for r in ranks):
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
                    task.label,
                    rank,
                    reason,
                    {x.rank: x.bubble_ns / 1e6 for x in ranks},
                )
            )
            self._send(m.agent_box(rank), ("run", task.task_id, task.spec_bytes, task.priority))
            self._notify(task, m.Update("queued", rank, 0, None))
        for entry in deferred:
            heapq.heappush(self._pending, entry)

    # -- closing -----------------------------------------------------------------------------

    def _finish(self) -> None:
        """Every rank is closing or lost: cancel what is left and say goodbye."""
        for task in list(self._tasks.values()):
            if task.state not in FINAL_STATES:
                closed = "cancelled: the job queue closed"
                self._final(
                    task,
                    m.Update("cancelled", task.rank, task.done, task.total, closed, "cancelled"),
                )
        # Every rank still there, closing or not (a forced finish): a rank that has not
        # closed yet learns the queue is closed, and its close() returns at once.
        for rank in set(self._ranks) - self._gone - self._lost:
            self._hub.send(m.agent_box(rank), ("bye",))
        for box in [*self._clients, *self._status_boxes]:
            self._send(box, ("closed",))
        self._bye_at = time.monotonic()
        self._finished.set()

    # -- telling submitters ------------------------------------------------------------------

    def _final(self, task: _Placed, update: m.Update) -> None:
        task.state, task.done, task.total = update.state, update.done, update.total
        if task.rank is not None:
            r = self._ranks[task.rank]
            r.outstanding.discard(task.task_id)
            r.iterative.discard(task.task_id)
        task.spec_bytes = task.spec = None  # a final task keeps only what status() shows
        self._finals.append(task.task_id)
        while len(self._finals) > _KEEP_FINAL:
            self._tasks.pop(self._finals.popleft(), None)
        self._notify(task, update)

    def _notify(self, task: _Placed, update: m.Update) -> None:
        self._send(task.reply, ("update", task.task_id, *update))

    def _send(self, box: str, message: tuple) -> None:
        """Sends unless `box` is closed (a lost or departed rank, a client that left);
        "lost" and "bye" go through the hub directly, closed or not."""
        if box not in self._closed_boxes:
            self._hub.send(box, message)
