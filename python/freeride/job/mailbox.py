"""Authenticated mailboxes in a TCPStore: the job queue's transport.

A message to box B takes the next number n from B's counter and is stored under "B/n" as
``HMAC-SHA256(secret, B, n, payload) || payload``; B reads its numbers in order, checks
the tag, deletes what it read, and only then unpickles. Anything whose tag does not
verify (a forgery, a replay under another box or number, garbage) is dropped and counted
(logged once per box), never unpickled. Large payloads ("blobs") are split into parts
below the store's 8 MiB value cap, each part tagged with its key, index and count.

The store is not authenticated itself (torch's TCPStore has no credentials): whoever
reaches its port can read, delete or overwrite keys, so it can delay or drop the queue's
messages (denial of service) but cannot make a rank run anything without the secret. A
number someone took and never wrote would stall the box: a hole older than `gap_s` while
later numbers exist is skipped and counted as dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import pickle
import secrets
import socket
import threading
import time
from datetime import timedelta
from typing import Any

log = logging.getLogger("freeride.job")

SECRET_BYTES = 32
_TAG = hashlib.sha256().digest_size
_PART = 4 << 20  # bytes per stored value
_PROOF_KEY = "fr-auth/proof"


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def _tag(secret: bytes, *fields: bytes) -> bytes:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for field in fields:  # length-prefixed, so no two field lists give the same input
        mac.update(len(field).to_bytes(8, "little"))
        mac.update(field)
    return mac.digest()


def connect(host: str, port: int, timeout_s: float) -> Any:
    """A client of the store at host:port (each thread that polls keeps its own: a client
    is not shared between a thread that blocks on it and others)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


def serve(host: str, timeout_s: float) -> Any:
    """A store server listening on `host`'s address only (not every interface), on a
    free port; torch takes the listening socket over."""
    import torch.distributed as dist

    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"host {host!r} does not resolve: {exc}") from None
    last: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        fd = sock.detach()  # the store closes it
        return dist.TCPStore(
            host,
            0,
            None,
            True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=fd,
        )
    raise ValueError(
        f"cannot listen on host {host!r} ({last}): give JobQueue(host=...) an address of "
        "this machine that the other ranks reach"
    )


def publish_proof(store: Any, secret: bytes) -> None:
    """Lets an outside client check its secret before it sends anything."""
    nonce = secrets.token_bytes(16)
    store.set(_PROOF_KEY, nonce + _tag(secret, b"proof", nonce))


def check_proof(store: Any, secret: bytes) -> bool:
    if not store.check([_PROOF_KEY]):
        return False
    data = bytes(store.get(_PROOF_KEY))
    nonce, tag = data[:16], data[16:]
    return hmac.compare_digest(tag, _tag(secret, b"proof", nonce))


class Outbox:
    """Sends messages to any box; thread-safe."""

    def __init__(self, store: Any, secret: bytes) -> None:
        self._store = store
        self._secret = secret
        self._lock = threading.Lock()

    def send(self, box: str, message: Any) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.send_raw(box, payload)

    def send_raw(self, box: str, payload: bytes) -> None:
        """Sends already-pickled bytes (tests use it to send verified garbage)."""
        with self._lock:
            n = self._store.add(f"{box}/n", 1)
            tag = _tag(self._secret, box.encode(), str(n).encode(), payload)
            self._store.set(f"{box}/{n}", tag + payload)

    def put_blob(self, key: str, data: bytes) -> int:
        """Stores `data` under `key` in tagged parts; returns the number of parts."""
        parts = max(1, -(-len(data) // _PART))
        with self._lock:
            for i in range(parts):
                chunk = data[i * _PART : (i + 1) * _PART]
                tag = _tag(self._secret, key.encode(), str(i).encode(), str(parts).encode(), chunk)
                self._store.set(f"{key}/{i}", tag + chunk)
        return parts

    def delete_blob(self, key: str, parts: int) -> None:
        with self._lock:
            for i in range(parts):
                self._store.delete_key(f"{key}/{i}")

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            return int(self._store.add(key, amount))

    def release(self) -> None:
        """Drops the store connection (its socket and torch's threads for it)."""
        with self._lock:
            self._store = _Released()


class Inbox:
    """Reads one box in order, verifying before unpickling. One thread at a time."""

    def __init__(self, store: Any, secret: bytes, box: str, gap_s: float = 5.0) -> None:
        self._store = store
        self._secret = secret
        self.box = box
        self._next = 1
        self._gap_s = gap_s
        self._gap_since: float | None = None
        self._gap_checked = 0.0
        self.dropped = 0  # stored values whose tag did not verify, and skipped holes
        self.malformed = 0  # verified values that did not unpickle
        self._warned = False

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "freeride job queue: dropped a message to %s (%s); further drops are "
                "counted in JobQueue.stats()",
                self.box,
                why,
            )

    def poll(self) -> Any | None:
        """The next verified message, or None if none has arrived."""
        for _ in range(64):  # bounded: a flood of forgeries cannot hold the caller
            key = f"{self.box}/{self._next}"
            if not self._store.check([key]):
                self._skip_stale_hole()
                return None
            self._gap_since = None
            data = bytes(self._store.get(key))
            self._store.delete_key(key)
            n = self._next
            self._next += 1
            tag, payload = data[:_TAG], data[_TAG:]
            expected = _tag(self._secret, self.box.encode(), str(n).encode(), payload)
            if len(tag) != _TAG or not hmac.compare_digest(tag, expected):
                self._drop("its tag does not verify")
                continue
            try:
                return pickle.loads(payload)
            except Exception:  # noqa: BLE001 - the job's own bytes, but unreadable
                self.malformed += 1
                log.warning(
                    "freeride job queue: a verified message to %s did not unpickle", self.box
                )
        return None

    def _skip_stale_hole(self) -> None:
        """Skips number `_next` if it stayed empty for gap_s while later ones were taken
        (someone took the number and never wrote it)."""
        now = time.monotonic()
        if now - self._gap_checked < 0.1:
            return
        self._gap_checked = now
        if int(self._store.add(f"{self.box}/n", 0)) < self._next:
            self._gap_since = None
            return
        if self._gap_since is None:
            self._gap_since = now
        elif now - self._gap_since > self._gap_s:
            self._gap_since = None
            self._next += 1
            self._drop("a number was taken and never written")

    def release(self) -> None:
        """Drops the store connection; the box reads nothing more."""
        self._store = _Released()

    def drain(self, quiet_s: float = 0.05) -> list[Any]:
        """Every message until none arrived for `quiet_s` seconds."""
        out: list[Any] = []
        deadline = time.monotonic() + quiet_s
        while time.monotonic() < deadline:
            message = self.poll()
            if message is None:
                time.sleep(0.002)
                continue
            out.append(message)
            deadline = time.monotonic() + quiet_s
        return out

    def take_blob(self, key: str, parts: int) -> bytes | None:
        """The blob's bytes, or None (counted as dropped) if a part is missing or forged."""
        chunks = []
        ok = True
        for i in range(parts):
            part = f"{key}/{i}"
            if not self._store.check([part]):
                ok = False
                continue
            data = bytes(self._store.get(part))
            self._store.delete_key(part)
            tag, chunk = data[:_TAG], data[_TAG:]
            expected = _tag(self._secret, key.encode(), str(i).encode(), str(parts).encode(), chunk)
            ok = ok and len(tag) == _TAG and hmac.compare_digest(tag, expected)
            chunks.append(chunk)
        if not ok:
            self._drop(f"result {key} is missing or does not verify")
            return None
        return b"".join(chunks)


class _Released:
    """Stands in for a store connection that was let go: every use fails clearly."""

    def __getattr__(self, name: str) -> Any:
        raise ConnectionError("the job queue's connection to its store was released")
