"""JobQueue: one side-task queue for the whole training job.

Any rank (or an outside client holding the queue's secret, see fr.JobClient) submits a
TaskSpec; a coordinator on the group's first rank places it on the rank with the most
measured bubble time per iteration and room in its memory budget (fr.placement.Policy),
re-evaluating as tasks finish and bubbles change; that rank builds the task from the spec
and runs it on its own Harvester; states and the result come back to the submitter's
handle.

Messages travel over a channel whose server is the leader (channel/): ZeroMQ
connections encrypted with CurveZMQ, each authenticated by challenge and response under
a secret the leader makes and shares over a gloo group of the queue's own, so only the
job's ranks and clients holding the secret talk to the queue, and the leader alone keeps
its state (task ids, placements, liveness). Each rank sends its stats every 100 ms (less
often in a job of more than 50 ranks, see liveness.py) and the leader beats to each rank
it sent nothing else; a rank the leader has not heard from for `rank_timeout` is declared
lost: the tasks it had not started go elsewhere, the ones it ran fail with RankLostError
(and are cancelled there if it is heard from again), and close() says so.

A rank that leaves (leave(), or its harvester closes) hands the tasks it has not started
back to the queue; a task that has started stays where it runs until it is final, so no
item ever runs twice.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

from .. import _shutdown
from .._C import _relax_capture_mode
from .._checks import check_count, check_float
from ..errors import HarvesterClosedError, RankLostError
from . import auth, channel, files, liveness
from . import messages as m
from .agent import Agent
from .coordinator import Coordinator
from .handle import RemoteHandle
from .placement import Decision, Policy, TaskSpec

log = logging.getLogger("freeride.job")

_HOST_BYTES = 256
_KEY_BYTES = 40  # a CurveZMQ public key, Z85 text
_WILDCARDS = ("0.0.0.0", "::", "", "*")


# The longest timeout taken (about 31 years): the gloo group's comes as a timedelta, whose
# days are a C int (1e300 s failed deep in its construction).
_MAX_TIMEOUT_S = 1e9


class JobQueue:
    """A job-wide side-task queue. Collective: every rank of `group` (default: the whole
    world) constructs it with its own Harvester, and calls close() at the end.

    Args:
        harvester: this rank's Harvester, where tasks placed on this rank run.
        group: the ranks that share the queue (default: the world). The queue makes a
            gloo group of these ranks for its own setup.
        depth: tasks a rank holds at once (running or waiting in its harvester); more
            wait at the coordinator, so placement follows bubbles as they change.
        host: the address the leader's channel listens on and the others connect to
            (default: MASTER_ADDR, else this host's name); it listens there only. A
            wildcard ("0.0.0.0", "::") would listen on every interface: refused where it
            comes from MASTER_ADDR, allowed with a warning where given here.
        timeout: seconds for setup (each rank's connection included).
        rank_timeout: a rank (or the leader) not heard from for this long is declared
            lost (default: 5 s, more in a job of more than 500 ranks: the number of
            ranks / 100 s).
        close_timeout: how long close() waits for the other ranks to close too; it
            returns within this plus about a second whatever the others do.
        secret_file: if given, the leader writes the queue's address, the client
            credential (never the job's secret: a client can never act as a rank) and
            public key there (JSON, mode 0600) for outside clients (fr.JobQueue.connect,
            `freeride submit`), and removes it at close() or abort(). Whoever can read
            it can run code as the job: put it in a directory only you can write.
        status_file: like secret_file, with a read-only credential: its holder (e.g.
            `freeride status --queue FILE`) may read the task table and nothing more;
            nothing it sends is unpickled.
    """

    def __init__(
        self,
        harvester: Any,
        *,
        group: Any = None,
        depth: int = 2,
        host: str | None = None,
        timeout: float = 60.0,
        rank_timeout: float | None = None,
        close_timeout: float = 5.0,
        secret_file: str | os.PathLike | None = None,
        status_file: str | os.PathLike | None = None,
    ) -> None:
        import torch.distributed as dist

        if not hasattr(harvester, "submit") or not hasattr(harvester, "closed"):
            raise TypeError(
                f"harvester must be this rank's fr.Harvester, got {type(harvester).__name__}"
            )
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("JobQueue needs an initialised torch.distributed process group")
        if harvester.closed:
            raise HarvesterClosedError("the harvester is closed")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            # (also what dist.new_group hands a rank outside the group it made)
            raise TypeError(
                "group must be None (the world) or a torch.distributed ProcessGroup this "
                f"rank belongs to, got {type(group).__name__}"
            )
        if host is not None and not isinstance(host, str):
            raise TypeError(f"host must be None or a str address, got {type(host).__name__}")
        if (
            secret_file is not None
            and status_file is not None
            and os.path.abspath(os.fspath(secret_file)) == os.path.abspath(os.fspath(status_file))
        ):
            # The status file would be written over the secret file: the client
            # credential lost, and the read-only one left where clients look for theirs.
            raise ValueError(f"status_file must not be secret_file ({os.fspath(secret_file)!r})")
        self._h = harvester
        self._cuda = harvester.backend == "cuda"
        self._policy = Policy(check_count(depth, "depth", 1, 1024))
        timeout = check_float(timeout, "timeout")
        self._close_timeout = check_float(close_timeout, "close_timeout")
        if timeout <= 0 or self._close_timeout < 0:
            raise ValueError(
                "timeout must be a positive number of seconds, close_timeout at least 0"
            )
        if timeout > _MAX_TIMEOUT_S:
            raise ValueError(f"timeout must be at most {_MAX_TIMEOUT_S:g} s, got {timeout:g}")
        ranks = (
            list(range(dist.get_world_size()))
            if group is None
            else dist.get_process_group_ranks(group)
        )
        self._ranks = ranks
        self._rank_timeout = (
            liveness.rank_timeout(len(ranks))
            if rank_timeout is None
            else check_float(rank_timeout, "rank_timeout")
        )
        if self._rank_timeout <= 0:
            raise ValueError("rank_timeout must be a positive number of seconds")
        self._beat_s = liveness.every(len(ranks), self._rank_timeout)
        self._gloo = dist.new_group(ranks, backend="gloo", timeout=timedelta(seconds=timeout))
        self._rank = dist.get_rank()
        self._leader = ranks[0]
        is_leader = self._rank == self._leader
        hub, secret, port, key = None, b"", 0, b""
        error: BaseException | None = None
        self._files: list[tuple[str, tuple[int, int, bytes]]] = []
        if is_leader:
            try:
                host, ip = _listen_address(host)
                secret = auth.new_secret()
                hub = channel.Hub(
                    ip,
                    secret,
                    ranks,
                    beat_s=liveness.beat_every(len(ranks), self._rank_timeout),
                )
                port, key = hub.port, hub.public_key
                client = auth.client_credential(secret)
                for path, credential, role in (
                    (secret_file, client, "client"),
                    (status_file, auth.status_credential(client), "status"),
                ):
                    if path is not None:
                        path = os.fspath(path)
                        written = files.write_secret_file(
                            path, f"{_url_host(host)}:{port}", credential, key, role
                        )
                        self._files.append((path, written))
            except BaseException as exc:  # noqa: BLE001 - the others must hear of it
                error, port = exc, 0
                for written_file in self._files:
                    files.remove_secret_file(*written_file)
                if hub is not None:
                    hub.close()
                    hub = None
        host, port, secret, key = self._share(host or "", port, secret, key)
        if error is not None:
            raise error
        if port == 0:
            raise RuntimeError(
                f"the job queue's leader (rank {self._leader}) could not start its channel; "
                "its error says why"
            )
        self._hub = hub  # the leader's; closed last
        self.address = f"{_url_host(host)}:{port}"
        self.server_key = key.decode()
        try:
            self._link = channel.Link(
                channel.resolve(host),
                port,
                secret,
                key,
                auth.rank_role(self._rank),
                timeout,
                self.address,
                ping_s=self._beat_s,
            )
        except BaseException:
            if hub is not None:
                hub.close()
            raise
        self._agent = Agent(harvester, self._rank, self._link)
        self._coordinator: Coordinator | None = None
        if hub is not None:
            self._coordinator = Coordinator(
                self._policy, hub, ranks, self._rank, self._rank_timeout, cuda=self._cuda
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

    def _share(
        self, host: str, port: int, secret: bytes, key: bytes
    ) -> tuple[str, int, bytes, bytes]:
        """The leader's address, the secret and the channel's public key, to every rank
        over the queue's own gloo group: raw bytes, nothing unpickled."""
        import torch
        import torch.distributed as dist

        size = auth.SECRET_BYTES + _KEY_BYTES + 2 + _HOST_BYTES
        buf = torch.zeros(size, dtype=torch.uint8)
        if self._rank == self._leader:
            name = host.encode()[:_HOST_BYTES]
            raw = (
                secret.ljust(auth.SECRET_BYTES, b"\0")
                + key.ljust(_KEY_BYTES, b"\0")
                + port.to_bytes(2, "little")
                + name
            )
            buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        dist.broadcast(buf, src=self._leader, group=self._gloo)
        raw = bytes(buf.tolist())
        secret, raw = raw[: auth.SECRET_BYTES], raw[auth.SECRET_BYTES :]
        key, raw = raw[:_KEY_BYTES], raw[_KEY_BYTES:]
        port = int.from_bytes(raw[:2], "little")
        host = raw[2:].rstrip(b"\0").decode()
        return host, port, secret, key

    # -- the public API ----------------------------------------------------------------------

    @staticmethod
    def connect(
        address: str | None = None,
        secret: bytes | str | None = None,
        *,
        server_key: bytes | str | None = None,
        secret_file: str | os.PathLike | None = None,
        timeout: float = 10.0,
    ) -> Any:
        """A client of a running job's queue from a process that is not one of its ranks
        (fr.JobClient): `address` ("host:port"), `secret` (the client credential, bytes or
        hex: the secret file's "secret") and `server_key` (the queue's public key,
        JobQueue.server_key), or the `secret_file` the job wrote (JobQueue(secret_file=
        ...)). A wrong credential raises fr.QueueAuthError before anything but the proof
        is sent."""
        from .client import JobClient

        return JobClient(
            address, secret, server_key=server_key, secret_file=secret_file, timeout=timeout
        )

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
        data = m.spec_payload(spec)
        if self._broken is not None:
            raise RankLostError(str(self._broken), self._broken.rank)
        if self._closed:
            raise HarvesterClosedError("the job queue is closed")
        with self._lock:
            self._ids += 1
            task_id = f"{self._rank}:{self._ids}"
        if self._agent.bye.is_set():
            raise HarvesterClosedError("the job queue was closed by its leader")
        handle = RemoteHandle(self, task_id, spec)
        with self._agent.lock:
            self._agent.submitted[task_id] = handle
        self._send_coord(("submit", task_id, data, priority, m.agent_box(self._rank)))
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
        """What the queue turned away on this rank: "dropped" (frames of no authenticated
        session or of no known shape, never unpickled), "denied" (connections whose Curve
        key is no credential's, refused by the transport, on the leader), "refused"
        (connections whose proof did not verify, on the leader), "malformed"
        (authenticated but of no known shape, or speaking for someone else),
        "unanswered" (table requests without the ticket of their box's last table and
        with no waiver due, on the leader), "lost_ranks" (ranks declared lost), and "sessions"
        (connections authenticated now, on the leader; 0 elsewhere)."""
        dropped = self._agent.dropped
        malformed = self._agent.malformed + self._agent.unreadable
        refused = sessions = denied = unanswered = 0
        lost = set(self._agent.lost)
        coord = self._coordinator
        if coord is not None and self._hub is not None:
            dropped += self._hub.dropped
            refused += self._hub.refused
            denied = self._hub.denied
            sessions = self._hub.sessions()
            malformed += coord.malformed + self._hub.malformed
            unanswered = coord.unanswered
            lost |= coord.lost
        if self._broken is not None and self._broken.rank is not None:
            lost.add(self._broken.rank)
        return {
            "dropped": dropped,
            "denied": denied,
            "refused": refused,
            "malformed": malformed,
            "unanswered": unanswered,
            "lost_ranks": sorted(lost),
            "sessions": sessions,
        }

    def close(self) -> None:
        """Collective. Stops placing, cancels what has not finished (on every rank), and
        marks every handle final. Waits up to close_timeout for the other ranks to close
        too and returns within about a second more whatever they do: a rank that has not
        closed by then finds the queue closed (its submit() raises), and the leader
        cancels what was left. Raises RankLostError naming ranks that were lost."""
        if self._closed:
            return
        self._closed = True
        _shutdown.unregister(self)
        deadline = time.monotonic() + self._close_timeout
        abandoned: list[str] = []
        try:
            self._agent.leave()
            self._agent.cancel_hosted(wait=True, timeout=self._left(deadline))
            self._agent.report_hosted()
            self._send_coord(("closing", self._rank))
            coord = self._coordinator
            while not self._agent.bye.wait(0.02):  # every rank closing (or lost)
                if self._broken is not None:
                    break
                if time.monotonic() >= deadline:
                    if coord is not None:
                        coord.finish()  # closes it for the others now
                        if self._agent.bye.wait(1.0):
                            break
                    abandoned = self._unfinished()
                    break
            self._agent.stop(1.0)
            self._send_coord(("gone", self._rank))
            if coord is not None:
                coord.join(max(0.0, min(1.0, self._left(deadline + 1.0))))
        finally:
            self._teardown("cancelled: the job queue closed")
        if abandoned:
            log.warning(
                "freeride job queue: close() on rank %d waited %.1f s for the other ranks and "
                "left without them; tasks cancelled here: %s",
                self._rank,
                self._close_timeout,
                ", ".join(abandoned) or "none",
            )
        lost = self.stats()["lost_ranks"]
        if lost:
            names = ", ".join(str(r) for r in lost)
            raise RankLostError(
                f"the job queue closed without rank(s) {names}, which stopped answering "
                f"(not heard from for more than {self._rank_timeout:g} s); their running "
                "tasks failed with RankLostError",
                lost[0],
            )

    @staticmethod
    def _left(deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())

    def _unfinished(self) -> list[str]:
        """Ids of this rank's submissions not final yet (teardown cancels them)."""
        with self._agent.lock:
            return sorted(t for t, h in self._agent.submitted.items() if not h.done())

    def abort(self) -> None:
        """Leaves the queue now, without waiting for the other ranks (what an exception or
        a signal does): tasks placed here that have not started go back to the queue,
        started ones are cancelled (items in flight finish, waited for up to
        close_timeout), this rank's own submissions end cancelled, and every queue thread
        on this rank is joined. If this rank leads the queue, the others find it lost."""
        if self._closed:
            return
        self._closed = True
        _shutdown.unregister(self)
        try:
            self._agent.left = True
            self._agent.hand_back(list(self._agent.hosted()))
            self._agent.cancel_hosted(wait=True, timeout=self._close_timeout)
            self._agent.report_hosted()
            self._agent.stop(1.0)
            self._send_coord(("gone", self._rank))
        finally:
            self._teardown("cancelled: this rank left the job queue")

    def _teardown(self, why: str) -> None:
        """Joins this rank's queue threads, makes every handle here final, closes the
        connections (the leader's channel last) and removes the secret file."""
        self._agent.stop(1.0)
        if self._coordinator is not None:
            self._coordinator.stop(1.0)
        self._stop_beat.set()
        if self._beat is not threading.current_thread():
            self._beat.join(1.0)
        with self._agent.lock:
            pending = list(self._agent.submitted.values())
            self._agent.submitted.clear()
        for handle in pending:
            handle._final("cancelled", why, "cancelled")
        self._link.close()
        if self._hub is not None:
            self._hub.close()
        for written_file in self._files:
            files.remove_secret_file(*written_file)
        self._files = []
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
        self._link.send(message)  # never waits, never raises for the network's sake

    def _beat_loop(self) -> None:
        """Every beat (liveness.every): sends this rank's stats (its liveness, as the
        leader sees it); notices a leader not heard from for rank_timeout (it sends at
        least a beat every beat)."""
        if self._cuda:
            # Each beat reads the bubble record (CUDA event timings) while training may be
            # capturing a CUDA graph on its own thread: in the default (global) capture
            # mode that call from this thread would invalidate the capture.
            _relax_capture_mode()
        is_leader = self._rank == self._leader
        while not self._stop_beat.wait(self._beat_s):
            try:
                self._link.send_stats(self._agent.stats())
            except Exception:
                log.debug("freeride job queue: a beat failed", exc_info=True)
            if not is_leader and self._link.silent_for() > self._rank_timeout:
                self._leader_lost(f"was not heard from for {self._rank_timeout:g} s")
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


def _is_wildcard(name: str, ip: str | None) -> bool:
    """Whether listening on `name` (resolved to `ip`) listens on every interface: the
    address it resolves to, not its spelling, decides (0, 0.0, 0x0, ::0, a host name that
    resolves to 0.0.0.0, ::ffff:0.0.0.0 all do)."""
    if name.strip("[]") in _WILDCARDS or ip is None:
        return name.strip("[]") in _WILDCARDS
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_unspecified


def _listen_address(host: str | None) -> tuple[str, str]:
    """(the name the others connect to, the address to listen on) for the leader: `host`,
    else MASTER_ADDR, else this host's name. A wildcard from MASTER_ADDR is refused (it
    would listen on every interface); one given as `host` is allowed, with a warning, and
    the others connect to this host's name."""
    explicit = host is not None
    name = host if explicit else os.environ.get("MASTER_ADDR") or socket.gethostname()
    ip = None if name.strip("[]") in _WILDCARDS else channel.resolve(name.strip("[]"))
    if _is_wildcard(name, ip):
        if not explicit:
            raise ValueError(
                f"MASTER_ADDR is {name!r}, a wildcard: the job queue would listen on every "
                "interface. Give JobQueue(host=...) the address the ranks reach each other "
                f"on (or host={name!r} to listen on every interface after all)"
            )
        warnings.warn(
            f"JobQueue(host={name!r}) listens on every interface: anyone who reaches this "
            "machine can open connections to the queue (they still need its secret)",
            stacklevel=3,
        )
        return socket.gethostname(), ip or name.strip("[]") or "0.0.0.0"
    return name, ip


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
