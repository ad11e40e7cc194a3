"""What the job queue's attack tests (test_job_security.py, test_job_tickets.py) share:
a one-rank job in this process, and a ZeroMQ peer of its port that runs the protocol by
hand."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import freeride as fr
from freeride.job import auth

zmq = pytest.importorskip("zmq")
dist = pytest.importorskip("torch.distributed")


@contextlib.contextmanager
def one_rank_job(folder: Path, **queue_args: Any) -> Iterator[Any]:
    """A job of one rank (this process, gloo) whose queue wrote its secret file
    (queue.json) in `folder`, made private first; `queue_args` go to JobQueue."""
    os.chmod(folder, 0o700)
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    h = fr.Harvester("cpu", workers=2)
    h.gate.open(stream="host")
    try:
        q = fr.JobQueue(
            h, host="127.0.0.1", secret_file=folder / "queue.json", rank_timeout=3.0, **queue_args
        )
        try:
            yield q
        finally:
            q.close()
    finally:
        h.close()
        dist.destroy_process_group()


def _port(q) -> int:
    """The port of JobQueue `q`'s hub."""
    return int(q.address.rpartition(":")[2])


class Attacker:
    """A ZeroMQ peer of the queue's port that sends whatever frames it likes. Without a
    `credential` it knows the hub's public key (which is public) but holds no credential,
    so its Curve key is its own: the hub's ZAP handler refuses it, and it never finishes
    the transport handshake. With one, it connects under that credential's key of `kind`
    (a client holding the secret file, running the protocol by hand)."""

    def __init__(
        self,
        q,
        routing_id: bytes | None = None,
        credential: bytes | None = None,
        kind: str = auth.CLIENT_KIND,
    ) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if credential is None:
            public, private = zmq.curve_keypair()
        else:
            public, private = auth.curve_keys(credential, kind)
        self.sock.curve_serverkey = q.server_key.encode()
        self.sock.curve_publickey, self.sock.curve_secretkey = public, private
        self.sock.routing_id = routing_id or os.urandom(16)
        self.sock.connect(f"tcp://127.0.0.1:{_port(q)}")

    def send(self, *frames: bytes) -> None:
        """Sends without waiting (dropped where the transport never connects)."""
        try:
            self.sock.send_multipart(list(frames), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def recv(self, timeout: float = 2.0) -> list[bytes] | None:
        """The next frames other than beats, or None."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                return None
            frames = self.sock.recv_multipart()
            if frames != [b"beat"]:
                return frames
        return None

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
