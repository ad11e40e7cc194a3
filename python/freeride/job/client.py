"""JobClient: submits to and watches a running job's queue from a process that is not one
of its ranks (the side-task manager's seat), with the queue's secret."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Any

from .._checks import check_count, check_float
from . import auth, channel
from . import messages as m
from .files import read_secret_file, secret_bytes, server_key_bytes
from .handle import RemoteHandle
from .placement import TaskSpec
from .serving import Serving

log = logging.getLogger("freeride.job")

# A table request not answered within this long is made again, with the latest ticket:
# the request, or its table, may have been lost on the way (a reconnect; a session the
# hub ended), and the leader waives a lost table's ticket after tickets.WAIVE_S.
_ASK_AGAIN_S = 0.5


def _split_address(address: str) -> tuple[str, int]:
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"address must be 'host:port', got {address!r}")
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"address must be 'host:port', got {address!r}") from None
    if not host or not 0 < number < 65536:
        raise ValueError(f"address must be 'host:port' with a port in 1..65535, got {address!r}")
    return host, number


class JobClient:
    """A client of a running job's queue (see fr.JobQueue.connect). Tasks it submits run
    in the job like any rank's; they outlive the client (close() stops their updates
    here, unless `cancel=True`)."""

    def __init__(
        self,
        address: str | None = None,
        secret: bytes | str | None = None,
        *,
        server_key: bytes | str | None = None,
        secret_file: str | os.PathLike | None = None,
        timeout: float = 10.0,
    ) -> None:
        role = "client"
        if secret_file is not None:
            if address is not None or secret is not None or server_key is not None:
                raise TypeError("give either secret_file or address, secret and server_key")
            address, key, public, role = read_secret_file(secret_file)
        else:
            if address is None or secret is None or server_key is None:
                raise TypeError(
                    "JobQueue.connect needs address, secret and server_key, or secret_file"
                )
            key = secret_bytes(secret, "secret")
            public = server_key_bytes(server_key, "server_key")
        host, port = _split_address(address)
        self._timeout = check_float(timeout, "timeout")
        if self._timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.address = address
        try:
            ip = channel.resolve(host)
        except ValueError as exc:
            raise ConnectionError(f"no job queue answers at {address}: {exc}") from None
        # QueueAuthError (a wrong secret, or a server that does not prove it holds it) and
        # ConnectionError (no queue with this key answers) come from here.
        self.read_only = role == "status"
        self._link = channel.Link(
            ip,
            port,
            key,
            public,
            auth.STATUS_ROLE if self.read_only else auth.CLIENT_ROLE,
            self._timeout,
            address,
        )
        self._box = self._link.box
        self._prefix = m.task_prefix(self._box)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._handles: dict[str, RemoteHandle] = {}
        # The latest table received, (request, rows), and its ticket, which the next
        # request presents: recorded whatever request it answers, a timed-out one's too.
        self._table: tuple[int, list[dict]] | None = None
        self._ticket: int | None = None
        self._replied = threading.Condition(self._lock)
        self._requests = itertools.count(1)
        self.closed_by_job = False
        self._closed = False
        self._link.send(("hello", self._box))
        self._reader = Serving("freeride-jobclient", self._step, max_idle=0.02)
        self._reader.start()

    @staticmethod
    def check_secret_file(path: str | os.PathLike) -> None:
        """Checks, without connecting, that `path` is a secret file a client may use: the
        rules JobClient(secret_file=path) applies. Raises FileNotFoundError if it is
        missing, PermissionError if others than its owner may read or write it (its
        secret lets the holder run code as the job), ValueError if it is not a queue's
        JSON with 'address' and 'secret'."""
        read_secret_file(path)

    def _send_coord(self, message: tuple) -> None:
        self._link.send(message)

    def submit(self, spec: TaskSpec, priority: int = 0) -> RemoteHandle:
        """Queues `spec` in the job; returns a handle that follows it."""
        if self.read_only:
            raise PermissionError(
                "this client connected with a status file, which may only read the task "
                "table: submit with the job's secret file"
            )
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"spec must be a freeride.TaskSpec, got {type(spec).__name__}")
        priority = check_count(priority, "priority", -(2**31), 2**31 - 1)
        data = m.spec_payload(spec)
        if self._closed or self.closed_by_job:
            raise RuntimeError("the client is closed" if self._closed else "the job queue closed")
        task_id = f"{self._prefix}{next(self._ids)}"
        handle = RemoteHandle(self, task_id, spec)
        with self._lock:
            self._handles[task_id] = handle
        self._send_coord(("submit", task_id, data, priority, self._box))
        return handle

    def status(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every task the queue knows (the last 2,000 final ones included): dicts with
        "id", "label", "state", "rank", "items_done", "items_total", "priority" and
        "origin" (the submitter's box). Asks again every _ASK_AGAIN_S until answered (or
        `timeout` s): any table answering this call's requests, or a later one, will do."""
        deadline = time.monotonic() + check_float(timeout, "timeout")
        first = ask_at = None
        with self._replied:
            while True:
                table = self._table
                if first is not None and table is not None and table[0] >= first:
                    return [dict(row) for row in table[1]]  # (another call may have it)
                now = time.monotonic()
                if now >= deadline or self.closed_by_job:
                    raise TimeoutError(
                        f"the job queue at {self.address} did not answer within {timeout} s"
                    )
                if ask_at is None or now >= ask_at:
                    request = next(self._requests)
                    first = request if first is None else first
                    self._send_coord(("status", self._box, request, self._ticket))
                    ask_at = now + _ASK_AGAIN_S
                self._replied.wait(min(deadline, ask_at) - now)

    def close(self, cancel: bool = False) -> None:
        """Stops following this client's tasks (with `cancel`, cancels those not final
        first) and joins the client's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            handles = [h for h in self._handles.values() if not h.done()]
        if cancel:
            for handle in handles:
                handle.cancel(wait=False)
        self._send_coord(("bye", self._box))
        self._reader.stop(1.0)
        self._link.close()  # sends what is queued (the bye) first, briefly

    def __enter__(self) -> JobClient:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _step(self) -> bool:
        message = self._link.poll()
        if message is None:
            if not self.closed_by_job and self._link.silent_for() > self._timeout:
                self._job_gone()  # the hub beats every 100 ms: it is gone
                self._reader.halt()
            return False
        try:
            self._handle(m.to_agent(message))
        except m.Malformed as exc:
            log.warning("freeride job client: dropped a malformed message: %s", exc)
        return True

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "update":
            with self._lock:
                handle = self._handles.get(message[1])
            if handle is not None:
                handle._apply(m.Update(*message[2:]))
        elif kind == "status":
            with self._replied:
                self._table, self._ticket = (message[1], message[3]), message[2]
                self._replied.notify_all()
        elif kind == "closed":
            self.closed_by_job = True
            with self._replied:
                self._replied.notify_all()

    def _job_gone(self) -> None:
        self.closed_by_job = True
        with self._lock:
            handles = list(self._handles.values())
        for handle in handles:
            handle._final("failed", f"the job queue at {self.address} is gone", "rank_lost")
        with self._replied:
            self._replied.notify_all()

    def __repr__(self) -> str:
        return f"JobClient({self.address}, box={self._box})"
