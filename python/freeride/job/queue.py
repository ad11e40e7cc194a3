"""JobQueue: one side-task queue for the whole training job.

Any rank (or an outside client holding the queue's secret, see fr.JobClient) submits a
TaskSpec; a coordinator on the group's first rank places it on the rank with the most
measured bubble time per iteration and room in its memory budget (fr.placement.Policy),
re-evaluating as tasks finish and bubbles change; that rank builds the task from the spec
and runs it on its own Harvester; states and the result come back to the submitter's
handle.

Messages travel through a TCPStore of the queue's own, listening only on the address the
job uses, and every message carries an HMAC under a secret the leader makes and shares
over a gloo group of the queue's own (never through the store): a message that does not
verify is dropped unread. Each rank heartbeats every 100 ms; a rank silent for
`rank_timeout` is declared lost: the tasks it had not started go elsewhere, the ones it
ran fail with RankLostError, and the others' close() says so instead of hanging.

A rank that leaves (leave(), or its harvester closes) hands the tasks it has not started
back to the queue; a task that has started stays where it runs until it is final, so no
item ever runs twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from .. import _shutdown
from .._C import _relax_capture_mode
from .._checks import check_count, check_float
from ..errors import HarvesterClosedError, RankLostError
from . import files, mailbox
from . import messages as m
from .agent import Agent
from .coordinator import Coordinator
from .handle import RemoteHandle
from .placement import Decision, Policy, TaskSpec

log = logging.getLogger("freeride.job")

_BEAT_S = 0.1
_GAP_S = 2.0  # a number taken and not written for this long is skipped (see mailbox)
_HOST_BYTES = 256


class JobQueue:
    """A job-wide side-task queue. Collective: every rank of `group` (default: the whole
    world) constructs it with its own Harvester, and calls close() at the end.

    Args:
        harvester: this rank's Harvester, where tasks placed on this rank run.
        group: the ranks that share the queue (default: the world). The queue makes a
            gloo group of these ranks for its own setup.
        depth: tasks a rank holds at once (running or waiting in its harvester); more
            wait at the coordinator, so placement follows bubbles as they change.
        host: address the leader's control store listens on and the others connect to
            (default: MASTER_ADDR, else this host's name); it listens there only.
        timeout: seconds for setup and each store operation.
        rank_timeout: a rank (or the leader) that sends nothing for this long is
            declared lost.
        secret_file: if given, the leader writes the queue's address and secret there
            (JSON, mode 0600) for outside clients (fr.JobQueue.connect, `freeride
            submit`). Whoever can read it can run code as the job.
    """

    def __init__(
        self,
        harvester: Any,
        *,
        group: Any = None,
        depth: int = 2,
        host: str | None = None,
        timeout: float = 60.0,
        rank_timeout: float = 5.0,
        secret_file: str | os.PathLike | None = None,
    ) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("JobQueue needs an initialised torch.distributed process group")
        if harvester.closed:
            raise HarvesterClosedError("the harvester is closed")
        self._h = harvester
        self._cuda = harvester.backend == "cuda"
        self._policy = Policy(check_count(depth, "depth", 1, 1024))
        timeout = check_float(timeout, "timeout")
        self._rank_timeout = check_float(rank_timeout, "rank_timeout")
        if timeout <= 0 or self._rank_timeout <= 0:
            raise ValueError("timeout and rank_timeout must be positive numbers of seconds")
        ranks = (
            list(range(dist.get_world_size()))
            if group is None
            else dist.get_process_group_ranks(group)
        )
        self._ranks = ranks
        self._gloo = dist.new_group(ranks, backend="gloo", timeout=timedelta(seconds=timeout))
        self._rank = dist.get_rank()
        self._leader = ranks[0]
        is_leader = self._rank == self._leader
        server, secret, port = None, b"", 0
        error: BaseException | None = None
        if is_leader:
            host = host or os.environ.get("MASTER_ADDR") or socket.gethostname()
            try:
                secret = mailbox.new_secret()
                server = mailbox.serve(host, timeout)
                port = server.port
                mailbox.publish_proof(server, secret)
                if secret_file is not None:
                    files.write_secret_file(secret_file, f"{_url_host(host)}:{port}", secret)
            except BaseException as exc:  # noqa: BLE001 - the others must hear of it
                error, port = exc, 0
        host, port, secret = self._share(host or "", port, secret)
        if error is not None:
            raise error
        if port == 0:
            raise RuntimeError(
                f"the job queue's leader (rank {self._leader}) could not start its store; "
                "its error says why"
            )
        self._server = server  # the leader keeps the server alive until close()
        self._secret = secret
        self.address = f"{_url_host(host)}:{port}"
        self._out = mailbox.Outbox(mailbox.connect(host, port, timeout), secret)
        inbox = mailbox.Inbox(
            mailbox.connect(host, port, timeout),
            secret,
            m.agent_box(self._rank),
            gap_s=_GAP_S,
        )
        self._agent = Agent(harvester, self._rank, self._out, inbox)
        self._coordinator: Coordinator | None = None
        if is_leader:
            coord_inbox = mailbox.Inbox(
                mailbox.connect(host, port, timeout), secret, m.COORD, gap_s=_GAP_S
            )
            self._coordinator = Coordinator(
                self._policy, self._out, coord_inbox, ranks, self._rank_timeout, cuda=self._cuda
            )
        self._ids = 0
        self._lock = threading.Lock()
        self._closed = False
        self._broken: RankLostError | None = None
        self._stop_beat = threading.Event()
        self._beat = threading.Thread(
            target=self._beat_loop, name="freeride-jobqueue-beat", daemon=True
        )
        dist.barrier(group=self._gloo)
        self._agent.start()
        if self._coordinator is not None:
            self._coordinator.start()
        self._beat.start()
        _shutdown.register(self, self.abort)

    def _share(self, host: str, port: int, secret: bytes) -> tuple[str, int, bytes]:
        """The leader's store address and the secret, to every rank over the queue's own
        gloo group: raw bytes, nothing unpickled."""
        import torch
        import torch.distributed as dist

        buf = torch.zeros(mailbox.SECRET_BYTES + 2 + _HOST_BYTES, dtype=torch.uint8)
        if self._rank == self._leader:
            name = host.encode()[:_HOST_BYTES]
            raw = secret.ljust(mailbox.SECRET_BYTES, b"\0") + port.to_bytes(2, "little") + name
            buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        dist.broadcast(buf, src=self._leader, group=self._gloo)
        raw = bytes(buf.tolist())
        secret = raw[: mailbox.SECRET_BYTES]
        port = int.from_bytes(raw[mailbox.SECRET_BYTES : mailbox.SECRET_BYTES + 2], "little")
        host = raw[mailbox.SECRET_BYTES + 2 :].rstrip(b"\0").decode()
        return host, port, secret

    # -- the public API ----------------------------------------------------------------------

    @staticmethod
    def connect(
        address: str | None = None,
        secret: bytes | str | None = None,
        *,
        secret_file: str | os.PathLike | None = None,
        timeout: float = 10.0,
    ) -> Any:
        """A client of a running job's queue from a process that is not one of its ranks
        (fr.JobClient): `address` ("host:port") and `secret` (bytes or hex), or the
        `secret_file` the job wrote (JobQueue(secret_file=...)). A wrong secret raises
        fr.QueueAuthError before anything is sent."""
        from .client import JobClient

        return JobClient(address, secret, secret_file=secret_file, timeout=timeout)

    @property
    def rank(self) -> int:
        """This rank."""
        return self._rank

    def submit(self, spec: TaskSpec, priority: int = 0) -> RemoteHandle:
        """Queues `spec` for the whole job; returns a handle on this rank. Higher
        `priority` is placed first."""
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"spec must be a freeride.TaskSpec, got {type(spec).__name__}")
        priority = check_count(priority, "priority", -(2**31), 2**31 - 1)
        data = spec.dumps()
        if self._broken is not None:
            raise RankLostError(str(self._broken), self._broken.rank)
        if self._closed:
            raise HarvesterClosedError("the job queue is closed")
        with self._lock:
            self._ids += 1
            task_id = f"{self._rank}:{self._ids}"
        handle = RemoteHandle(self, task_id, spec)
        with self._agent.lock:
            self._agent.submitted[task_id] = handle
        try:
            self._send_coord(("submit", task_id, data, priority, m.agent_box(self._rank)))
        except Exception as exc:  # noqa: BLE001 - torch raises several kinds
            with self._agent.lock:
                self._agent.submitted.pop(task_id, None)
            raise RankLostError(
                f"the job queue's leader (rank {self._leader}) cannot be reached: {exc}",
                self._leader,
            ) from None
        return handle

    def leave(self) -> None:
        """This rank runs no more placed tasks: those it has not started go back to the
        queue (and run elsewhere); those it started finish here. Its own submissions are
        still served."""
        self._agent.leave()

    def decisions(self) -> list[Decision]:
        """Every placement so far (the leader only, the last 2,000; empty elsewhere)."""
        return [] if self._coordinator is None else list(self._coordinator.decisions)

    def record(self) -> dict[str, Any]:
        """This rank's part of the job's placement record: the tasks placed here (job id
        -> label, local task id, last state, items) and, on the coordinator's rank, every
        decision. gather_reports(..., queue=q) attaches it to each rank's report."""
        with self._agent.lock:
            hosted = {tid: dict(entry) for tid, entry in self._agent.history.items()}
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
                for d in self.decisions()
            ]
        return out

    def hosted(self) -> dict[str, str]:
        """Tasks placed on this rank: id -> state."""
        return {tid: h.state for tid, h in self._agent.hosted().items()}

    def stats(self) -> dict[str, Any]:
        """What the queue turned away on this rank: "dropped" (messages whose tag did not
        verify, never unpickled), "malformed" (verified but of no known shape), and
        "lost_ranks" (ranks declared lost)."""
        dropped = self._agent.dropped
        malformed = self._agent.malformed + self._agent.unreadable
        lost = set(self._agent.lost)
        coord = self._coordinator
        if coord is not None:
            dropped += coord._inbox.dropped
            malformed += coord.malformed + coord._inbox.malformed
            lost |= coord.lost
        if self._broken is not None and self._broken.rank is not None:
            lost.add(self._broken.rank)
        return {"dropped": dropped, "malformed": malformed, "lost_ranks": sorted(lost)}

    def close(self) -> None:
        """Collective. Stops placing, cancels what has not finished (on every rank), and
        marks every handle final; returns once the whole job has done so. A rank that was
        lost is not waited for: close() then finishes here and raises RankLostError
        naming it."""
        if self._closed:
            return
        self._closed = True
        _shutdown.unregister(self)
        try:
            self._quietly(self._agent.leave)
            self._agent.cancel_hosted(wait=True)
            self._quietly(self._agent.report_hosted)
            self._quietly(self._send_coord, ("closing", self._rank))
            while not self._agent.bye.wait(0.05):  # every rank closing (or lost)
                if self._broken is not None:
                    break
            self._agent.stop()
            self._quietly(self._send_coord, ("gone", self._rank))
            if self._coordinator is not None:
                self._coordinator.join(self._rank_timeout + 1.0)
        finally:
            self._teardown("cancelled: the job queue closed")
        lost = self.stats()["lost_ranks"]
        if lost:
            names = ", ".join(str(r) for r in lost)
            raise RankLostError(
                f"the job queue closed without rank(s) {names}, which stopped answering "
                f"(silent for more than {self._rank_timeout:g} s); their running tasks "
                "failed with RankLostError",
                lost[0],
            )

    def abort(self) -> None:
        """Leaves the queue now, without waiting for the other ranks (what an exception or
        a signal does): tasks placed here that have not started go back to the queue,
        started ones are cancelled (items in flight finish), this rank's own submissions
        end cancelled, and every queue thread on this rank is joined. If this rank leads
        the queue, the others find it lost."""
        if self._closed:
            return
        self._closed = True
        _shutdown.unregister(self)
        try:
            self._agent.left = True
            self._quietly(self._agent.hand_back, list(self._agent.hosted()))
            self._agent.cancel_hosted(wait=True)
            self._quietly(self._agent.report_hosted)
            self._agent.stop()
            self._quietly(self._send_coord, ("gone", self._rank))
        finally:
            self._teardown("cancelled: this rank left the job queue")

    def _teardown(self, why: str) -> None:
        """Joins this rank's queue threads and makes every handle here final."""
        self._agent.stop()
        if self._coordinator is not None:
            self._coordinator.stop()
        self._stop_beat.set()
        if self._beat is not threading.current_thread():
            self._beat.join()
        with self._agent.lock:
            pending = list(self._agent.submitted.values())
            self._agent.submitted.clear()
        for handle in pending:
            handle._final("cancelled", why, "cancelled")
        # Let go of every store connection now (sockets, torch's threads for them), not
        # whenever the queue object is collected; the leader's server goes last.
        self._agent.release()
        if self._coordinator is not None:
            self._coordinator.release()
        self._out.release()
        self._server = None
        try:
            import torch.distributed as dist

            dist.destroy_process_group(self._gloo)
        except Exception:  # noqa: BLE001, S110 - the world may be gone already
            pass
        self._gloo = None  # its threads (gloo's loops) go with the last reference

    def __enter__(self) -> JobQueue:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """close() after a clean exit; abort() (local, immediate) after an exception or
        an interrupt, which the other ranks may not share."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- this rank's threads ----------------------------------------------------------------

    def _send_coord(self, message: tuple) -> None:
        self._out.send(m.COORD, message)

    def _quietly(self, fn: Any, *args: Any) -> None:
        """fn(*args) unless the leader is gone already; a store that fails means it is."""
        if self._broken is not None:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - torch raises several kinds
            self._leader_lost(f"cannot be reached ({type(exc).__name__})")

    def _beat_loop(self) -> None:
        """Every 100 ms: raises this rank's beat counter (its liveness) and sends its
        stats; watches the leader's counter to notice a lost leader."""
        if self._cuda:
            # Each beat reads the bubble record (CUDA event timings) while training may be
            # capturing a CUDA graph on its own thread: in the default (global) capture
            # mode that call from this thread would invalidate the capture.
            _relax_capture_mode()
        is_leader = self._rank == self._leader
        leader_beat = m.beat_key(self._leader)
        last_value, last_change = -1, time.monotonic()
        while not self._stop_beat.wait(_BEAT_S):
            try:
                self._out.add(m.beat_key(self._rank), 1)
                self._send_coord(self._agent.stats_message())
                value = last_value if is_leader else self._out.add(leader_beat, 0)
            except Exception:  # noqa: BLE001 - an unreachable leader is a silent one
                value = last_value
            now = time.monotonic()
            if value != last_value:
                last_value, last_change = value, now
            elif not is_leader and now - last_change > self._rank_timeout:
                self._leader_lost(f"was silent for {self._rank_timeout:g} s")
                return

    def _leader_lost(self, how: str) -> None:
        if self._broken is not None or self._rank == self._leader:
            return
        self._broken = RankLostError(
            f"the job queue's leader, rank {self._leader}, {how}: the queue stopped",
            self._leader,
        )
        log.warning("freeride job queue: %s", self._broken)
        self._agent.lost.add(self._leader)
        with self._agent.lock:
            pending = list(self._agent.submitted.values())
        for handle in pending:
            handle._final("failed", str(self._broken), "rank_lost", self._leader)
        self._agent.cancel_hosted(wait=False)
        self._agent.bye.set()
        self._agent.halt()  # its store is gone: nothing more to read


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
