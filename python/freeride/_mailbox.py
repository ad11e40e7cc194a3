"""Mailboxes in a torch.distributed TCPStore: the job queue's control plane.

A message to box B takes the next number from B's counter and is stored under that
number; B reads its numbers in order and deletes what it read. The store is the job
queue's own (not the training's), so nothing here touches the training's process groups.
Values are capped by the store (8 MiB), so large payloads are split into parts.
"""

from __future__ import annotations

import pickle
import threading
import time
from datetime import timedelta
from typing import Any

_PART = 4 << 20  # bytes per stored value


def connect(host: str, port: int, timeout_s: float) -> Any:
    """A client of the store at host:port (its own connection: a client is not shared
    between a thread that polls and threads that send)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


def serve(host: str, timeout_s: float) -> Any:
    """A store server on a free port of this host (and a client of it)."""
    import torch.distributed as dist

    return dist.TCPStore(
        host, 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


class Outbox:
    """Sends messages to any box; thread-safe."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._blob = 0

    def send(self, box: str, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            n = self._store.add(f"{box}/n", 1)
            self._store.set(f"{box}/{n}", data)

    def put_blob(self, key: str, data: bytes) -> int:
        """Stores `data` under `key` in parts; returns the number of parts."""
        parts = max(1, -(-len(data) // _PART))
        with self._lock:
            for i in range(parts):
                self._store.set(f"{key}/{i}", data[i * _PART : (i + 1) * _PART])
        return parts


class Inbox:
    """Reads one box, in order. Used by one thread at a time."""

    def __init__(self, store: Any, box: str) -> None:
        self._store = store
        self._box = box
        self._next = 1

    def poll(self) -> Any | None:
        """The next message, or None if it has not arrived."""
        key = f"{self._box}/{self._next}"
        if not self._store.check([key]):
            return None
        data = self._store.get(key)
        self._store.delete_key(key)
        self._next += 1
        return pickle.loads(data)

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

    def take_blob(self, key: str, parts: int) -> bytes:
        chunks = []
        for i in range(parts):
            part = f"{key}/{i}"
            chunks.append(self._store.get(part))
            self._store.delete_key(part)
        return b"".join(chunks)
