"""An attacker beside the soak's job queue (`bench soak --attack`): a process that keeps
hitting the leader's port, for the whole run, with what the security reviews found:

- idle TCP connections, held (review J6), 50 at a time;
- raw TCP peers with no key that announce a 255 MiB frame in the transport handshake
  and stream into it (J4);
- peers that know the public key but hold no credential, saying hello again and again
  (J7: the hub's ZAP handler refuses their key);
- a peer with the client credential (a secret-file holder) flooding hellos and frames
  outside a session (J7 from the inside: rate-limited and dropped).

It knows what the secret file tells (the address, the public key and the client
credential) and derives the client's Curve key as the channel documents, without
freeride's internals: what a holder of the file could do by hand. It counts what it did
and reports it when told to stop."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import time
from typing import Any

_IDLE = 50
_ROUND_S = 0.2


def _greeting() -> bytes:
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + bytes(32)


def _huge_frame(host: str, port: int) -> int:
    """One raw peer announcing a 255 MiB command frame; the bytes it got in before the
    leader closed it."""
    sent = 0
    try:
        with socket.create_connection((host, port), timeout=2) as raw:
            raw.sendall(_greeting() + b"\x06" + (255 << 20).to_bytes(8, "big"))
            chunk = os.urandom(1 << 16)
            while sent < (8 << 20):
                raw.sendall(chunk)
                sent += len(chunk)
    except OSError:
        pass
    return sent


_NONCE_BYTES = 32
_CLIENT_ROLE = b"client"


def client_keys(credential: bytes) -> tuple[bytes, bytes]:
    """The client's Curve key pair (Z85), derived from the client credential: HMAC-SHA256
    over length-prefixed fields, the curve's secret key, and its public key."""
    import zmq
    from zmq.utils import z85

    mac = hmac.new(credential, digestmod=hashlib.sha256)
    for field in (b"freeride-queue-curve-key", b"client"):
        mac.update(len(field).to_bytes(8, "little"))
        mac.update(field)
    secret = z85.encode(mac.digest())
    return zmq.curve_public(secret), secret


def run(secret_file: str, out_path: str, stop) -> None:
    """Attacks the queue that `secret_file` names until `stop` (a multiprocessing Event)
    is set; writes its counts as JSON to `out_path`."""
    import zmq

    with open(secret_file) as f:
        known = json.load(f)
    address, server_key = known["address"], known["server_key"].encode()
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    ctx = zmq.Context()
    counts = {"idle_held": 0, "huge_frames": 0, "huge_bytes_in": 0, "keyless_hellos": 0}
    counts["client_hellos"] = counts["client_frames"] = 0
    idle: list[socket.socket] = []
    client = ctx.socket(zmq.DEALER)
    client.linger = 0
    client.sndhwm = 1000
    client.curve_serverkey = server_key
    client.curve_publickey, client.curve_secretkey = client_keys(bytes.fromhex(known["secret"]))
    client.connect(f"tcp://{host}:{port}")

    def keyless() -> Any:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.sndhwm = 100
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.connect(f"tcp://{host}:{port}")
        return sock

    strangers = [keyless() for _ in range(8)]
    try:
        while not stop.is_set():
            while len(idle) < _IDLE:
                try:
                    idle.append(socket.create_connection((host, port), timeout=2))
                    counts["idle_held"] += 1
                except OSError:
                    break
            counts["huge_bytes_in"] = max(counts["huge_bytes_in"], _huge_frame(host, port))
            counts["huge_frames"] += 1
            for sock in strangers:
                # Attempts: the transport refuses these peers, so most never get a pipe
                # to queue a hello on (zmq.Again), which is the point.
                for _ in range(20):
                    counts["keyless_hellos"] += 1
                    try:
                        sock.send_multipart(
                            [b"hello", os.urandom(_NONCE_BYTES), _CLIENT_ROLE],
                            zmq.NOBLOCK,
                        )
                    except zmq.Again:
                        break
            for _ in range(50):
                try:
                    client.send_multipart(
                        [b"hello", os.urandom(_NONCE_BYTES), _CLIENT_ROLE], zmq.NOBLOCK
                    )
                    client.send_multipart([b"msg", os.urandom(64)], zmq.NOBLOCK)
                    counts["client_hellos"] += 1
                    counts["client_frames"] += 1
                except zmq.Again:
                    break
            while client.poll(0):
                client.recv_multipart()  # challenges and "who": read and ignored
            # Idle connections the leader closed (its transport handshake limit) are
            # opened again next round.
            idle = [s for s in idle if _still_open(s)]
            time.sleep(_ROUND_S)
    finally:
        for s in idle:
            s.close()
        for sock in [*strangers, client]:
            sock.close(0)
        ctx.term()
        with open(out_path, "w") as f:
            json.dump(counts, f)


def _still_open(sock: socket.socket) -> bool:
    try:
        sock.setblocking(False)
        data = sock.recv(1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        data = b""
    if data == b"":
        sock.close()
        return False
    return True
