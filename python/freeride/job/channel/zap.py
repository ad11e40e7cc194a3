"""The hub's ZAP handler: libzmq asks it, for every connection, whether the client's
Curve public key may connect, before a single frame of that connection is delivered.

Only the keys derived from the job's three credentials (auth.curve_keys) pass, and each
connection is tagged with its key's kind (libzmq's User-Id, on every frame it delivers),
so the hub knows what a connection may do from the transport itself: a peer without a
credential never finishes the handshake (nothing it sends reaches the hub's thread, and
it holds no more than a handshake's frames), and a client's connection can never present
itself as a rank's. Served from the hub's own thread: a request is a dictionary lookup.
"""

from __future__ import annotations

from typing import Any

from .sockets import zmq_module

ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq looks for a context's ZAP handler
DOMAIN = b"freeride-queue"


class Zap:
    """Answers the ZAP requests of `ctx`'s sockets that set DOMAIN: `keys` maps each
    accepted Curve public key (Z85 text) to the kind the connection is tagged with."""

    def __init__(self, ctx: Any, keys: dict[bytes, str]) -> None:
        zmq = zmq_module()
        from zmq.utils import z85

        self._keys = {z85.decode(k): kind.encode() for k, kind in keys.items()}
        self.sock = ctx.socket(zmq.REP)
        self.sock.linger = 0
        self.sock.bind(ENDPOINT)
        self.denied = 0

    def answer(self) -> None:
        """Answers every request waiting."""
        zmq = zmq_module()
        for _ in range(1024):
            try:
                request = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.sock.send_multipart(self._reply(request))

    def _reply(self, request: list[bytes]) -> list[bytes]:
        # version, request id, domain, address, identity, mechanism, credentials...
        if len(request) < 6:
            return [b"1.0", b"", b"500", b"malformed request", b"", b""]
        version, request_id, domain, mechanism = request[0], request[1], request[2], request[5]
        kind = None
        if domain == DOMAIN and mechanism == b"CURVE" and len(request) == 7:
            kind = self._keys.get(request[6])
        if kind is None:
            self.denied += 1
            return [version, request_id, b"400", b"unknown key", b"", b""]
        return [version, request_id, b"200", b"OK", kind, b""]

    def close(self) -> None:
        self.sock.close(0)
