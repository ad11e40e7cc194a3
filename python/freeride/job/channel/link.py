"""A peer's end of the channel (a rank's, or an outside client's): a DEALER socket that
connects under its role's Curve key, authenticates, and then carries messages to and
from the hub, pinging when it has nothing else to say."""

from __future__ import annotations

import collections
import json
import logging
import pickle
import random
import secrets
import threading
import time
from typing import Any

from ...errors import QueueAuthError
from .. import auth
from . import frames as fr
from .sockets import ROUTING_ID_BYTES, Waker, end, new_socket, pump, tcp, zmq_module

log = logging.getLogger("freeride.job")

_HELLO_AGAIN_S = (0.5, 4.0)  # a Link's first wait for an answer to its hello, and the most
_HWM = 100_000  # messages a Link queues for the hub before new ones are dropped
PING_S = 1.0  # a Link that sent nothing for this long pings (its session's liveness)


class Link:
    """One end of a connection to the hub at `ip`:`port` whose public key is
    `server_key`, as `role` (auth.rank_role(n), with the job's secret as `credential`;
    auth.CLIENT_ROLE with the client credential; auth.STATUS_ROLE with the status
    credential). Authenticates before it returns: QueueAuthError if the hub refuses the
    credential (at the transport, or its proof), or another live session holds the
    rank's box; ConnectionError if no hub with that key answers within `timeout` s.
    `address` names the hub in errors. `ping_s`: the longest the Link stays silent.
    `context`: a zmq.Context to share (many Links in one process: one I/O thread for all,
    as a benchmark of thousands of ranks needs), which close() leaves open; None: one of
    the Link's own."""

    def __init__(
        self,
        ip: str,
        port: int,
        credential: bytes,
        server_key: bytes,
        role: bytes,
        timeout: float,
        address: str,
        ping_s: float = PING_S,
        context: Any = None,
    ) -> None:
        zmq = zmq_module()
        kind = auth.kind_of(role)
        if kind is None:
            raise ValueError(f"role must be a rank's, a client's or status, got {role!r}")
        self._secret = credential
        self._server_key = server_key
        self._role = role
        self._json = kind == auth.STATUS_KIND  # a status session's messages are never pickled
        self._address = address
        self._ping_s = ping_s
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._dealer = new_socket(self._ctx, zmq.DEALER, ip, _HWM)
        public, private = auth.curve_keys(credential, kind)
        try:
            self._dealer.curve_serverkey = server_key
        except zmq.ZMQError:
            self._dealer.close(0)
            self._term()
            raise ValueError(
                "server_key is not a CurveZMQ public key (40 Z85 characters)"
            ) from None
        self._dealer.curve_publickey = public
        self._dealer.curve_secretkey = private
        self._dealer.routing_id = secrets.token_bytes(ROUTING_ID_BYTES)
        # Watched during the handshake only: the hub's ZAP handler refusing this key is
        # a wrong credential, said at once instead of after the timeout.
        self._monitor = self._dealer.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._dealer.connect(tcp(ip, port))
        self._lock = threading.Lock()
        self._in: collections.deque[bytes] = collections.deque()
        self._out: collections.deque[bytes] = collections.deque(maxlen=_HWM)
        self._stats: bytes | None = None  # the latest stats not yet sent (a rank's)
        self._nonce: bytes | None = None
        # Nonces of this handshake's earlier hellos: a challenge to one is stale, not forged.
        self._stale: collections.deque[bytes] = collections.deque(maxlen=8)
        self._hello_at = 0.0
        self._sent_at = 0.0
        self._ready = False
        self._held = threading.Event()
        self.heard = time.monotonic()
        self.dropped = 0  # frames of no known shape, or a challenge that did not verify
        self.malformed = 0  # messages that did not unpickle
        self.box = ""
        try:
            self._handshake(time.monotonic() + timeout)
        except BaseException:
            self._unmonitor()
            self._dealer.close(0)
            self._term()
            raise
        self._unmonitor()
        self._waker = Waker(self._ctx)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="freeride-jobqueue-link")
        self._thread.daemon = True
        self._thread.start()

    def _term(self) -> None:
        if self._own_ctx:
            self._ctx.term()

    def _unmonitor(self) -> None:
        if self._monitor is not None:
            self._dealer.disable_monitor()
            self._monitor.close(0)
            self._monitor = None

    def _handshake(self, deadline: float) -> None:
        """Until welcomed: says hello, and again after a backoff with jitter (from
        _HELLO_AGAIN_S[0], doubling up to [1]) or at once when the hub asks "who" (its
        pending handshake was pushed out by a crowd of others), until `deadline`."""
        zmq = zmq_module()
        wait = _HELLO_AGAIN_S[0]
        hellos, answered = 0, False
        next_hello = 0.0
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            now = time.monotonic()
            if now >= next_hello:
                self._hello()
                hellos += 1
                next_hello = now + wait * (1.0 + random.random())
                wait = min(2 * wait, _HELLO_AGAIN_S[1])
            if now >= deadline:
                raise ConnectionError(self._no_welcome(answered, hellos, deadline))
            left = min(deadline, next_hello) - now
            events = dict(poller.poll(int(left * 1000) + 1))
            if self._monitor in events:
                self._monitor.recv_multipart()
                raise QueueAuthError(
                    f"refused: the job queue at {self._address} does not know this "
                    f"credential's key for the role {self._role.decode(errors='replace')!r} "
                    "(the secret does not match; an outside client's secret file holds a "
                    "client's credential, never a rank's); nothing was sent"
                )
            if self._dealer not in events:
                continue
            frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            answered = answered or bool(frames) and frames[0] in (b"challenge", b"who")
            if frames == [b"who"]:
                next_hello = 0.0  # the hub forgot this handshake: again, now
                continue
            outcome = self._on_handshake(frames)
            if outcome == "refused":
                raise QueueAuthError(
                    f"refused: the secret does not match the job queue at {self._address} "
                    f"for the role {self._role.decode(errors='replace')!r} (an outside "
                    "client's secret file holds a client's credential, never a rank's); "
                    "nothing but the proof was sent"
                )
            if outcome == "taken":
                raise QueueAuthError(
                    f"refused: {self._role.decode(errors='replace')} is connected to the job "
                    f"queue at {self._address} already, and heard from: a rank's box is "
                    "never handed to a second connection while the first lives"
                )
            if outcome == "forged":
                # The server holds the queue's private key (Curve's handshake passed), so
                # most likely this secret is not the queue's; either way the two ends do
                # not share one, and the client has sent nothing but its nonce.
                raise QueueAuthError(
                    f"refused: the secret does not match the job queue at {self._address} "
                    "(its proof does not verify under this secret); nothing was sent"
                )
            if self._ready:
                return

    def _no_welcome(self, answered: bool, hellos: int, deadline: float) -> str:
        if answered:
            return (
                f"the job queue at {self._address} answered but did not finish the handshake "
                f"in time ({hellos} hello(s) sent): it is overloaded, or too many "
                "connections are being made at once; nothing but nonces and proofs was sent"
            )
        return (
            f"no job queue answers at {self._address} (none with this queue's server key, "
            f"or none at all; {hellos} hello(s) sent); nothing was sent"
        )

    def _hello(self) -> None:
        if self._nonce is not None:
            self._stale.append(self._nonce)
        self._nonce = auth.new_nonce()
        self._ready = False
        self._hello_at = time.monotonic()
        self._dealer.send_multipart([b"hello", self._nonce, self._role])

    def _on_handshake(self, frames: list[bytes]) -> str:
        """Steps the handshake on a frame; "refused", "taken", "forged" or "" (go on). A
        challenge to an earlier hello of this handshake is stale and ignored: its proof
        verifies under that hello's nonce, which the hub no longer holds."""
        kind = frames[0] if frames else b""
        if kind == b"challenge" and len(frames) == 3 and self._nonce is not None:
            expected = auth.server_proof(self._secret, self._nonce, frames[1], self._server_key)
            if not auth.same(expected, frames[2]):
                stale = any(
                    auth.same(
                        auth.server_proof(self._secret, n, frames[1], self._server_key), frames[2]
                    )
                    for n in self._stale
                )
                if stale:
                    return ""
                self._nonce = None
                return "forged"
            proof = auth.client_proof(self._secret, self._nonce, frames[1], self._role)
            self._dealer.send_multipart([b"auth", proof])
            self._nonce = None
        elif kind == b"welcome" and len(frames) == 2 and not self._ready:
            self.box = frames[1].decode(errors="replace")
            self._ready = True
            self._stale.clear()
        elif kind == b"refused":
            return "refused"
        elif kind == b"taken":
            return "taken"
        return ""

    # -- any thread ------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queues `message` for the hub; never waits (held while the Link authenticates
        again, up to its queue's length). A status Link sends JSON: its messages are
        lists of strings and numbers."""
        if self._json:
            payload = json.dumps(list(message[:1]) + list(message[2:])).encode()
        else:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._out.append(payload)
        self._waker.ring()

    def send_stats(self, packed: bytes) -> None:
        """Queues a rank's stats (messages.pack_stats), replacing any not sent yet: only
        the latest matters. Never waits."""
        with self._lock:
            self._stats = packed
        self._waker.ring()

    def poll(self) -> Any | None:
        """The next message from the hub, or None."""
        while True:
            with self._lock:
                if not self._in:
                    return None
                payload = self._in.popleft()
            try:
                return pickle.loads(payload)
            except Exception:  # noqa: BLE001 - authenticated, but unreadable
                self.malformed += 1
                log.warning("freeride job queue: a message from the hub did not unpickle")

    def hold(self, on: bool) -> None:
        """While held, the Link sends nothing (what it is given waits): how tests cut a
        rank off from the leader without killing it."""
        if on:
            self._held.set()
        else:
            self._held.clear()
            self._waker.ring()

    def silent_for(self) -> float:
        """Seconds since the hub was last heard from (it sends at least a beat every
        beat)."""
        return time.monotonic() - self.heard

    def close(self) -> None:
        """Ends the thread and closes the socket (what it sent last still goes out)."""
        end(
            self._stop,
            self._waker,
            self._thread,
            [self._dealer],
            self._ctx if self._own_ctx else None,
        )

    # -- the Link's thread -----------------------------------------------------------------

    def _serve(self) -> None:
        zmq = zmq_module()

        def after_round() -> None:
            now = time.monotonic()
            if self._ready and not self._held.is_set() and now - self._sent_at >= self._ping_s:
                self._sent_at = now  # nothing said for a while: the session lives
                self._dealer.send_multipart([b"ping"], zmq.NOBLOCK)
            elif not self._ready and now - self._hello_at >= _HELLO_AGAIN_S[1] * (
                1.0 + random.random()
            ):
                self._hello()  # authenticating again, and that hello was lost: again
            self._flush()

        pump(
            self._dealer,
            self._waker,
            self._stop,
            self._on_frames,
            after_round,
            "link",
            min(self._ping_s / 2, 0.5),
        )
        try:
            self._flush()  # the last messages ("gone", "bye") before the socket closes
        except Exception:
            log.debug("freeride job queue: a link's last sends failed", exc_info=True)

    def _on_frames(self, frames: list[bytes]) -> None:
        kind = frames[0] if frames else b""
        if kind == b"msg" and self._ready and fr.fits(frames[1:]):
            self.heard = time.monotonic()
            with self._lock:
                self._in.append(fr.join(frames[1:]))
        elif kind == b"beat" and len(frames) == 1:
            self.heard = time.monotonic()
        elif kind == b"who" and len(frames) == 1:
            self._hello()  # the hub lost this session (it restarted its count): again
        elif kind in (b"challenge", b"welcome", b"refused", b"taken"):
            if self._on_handshake(frames):
                self.dropped += 1
                log.warning("freeride job queue: authenticating again with the hub failed")
        else:
            self.dropped += 1

    def _flush(self) -> None:
        zmq = zmq_module()
        if self._ready and not self._held.is_set() and self._stats is not None:
            with self._lock:
                packed, self._stats = self._stats, None
            try:
                self._dealer.send_multipart([b"stats", packed], zmq.NOBLOCK)
                self._sent_at = time.monotonic()
            except zmq.Again:
                pass  # the next one replaces it
        while self._ready and not self._held.is_set():
            with self._lock:
                if not self._out:
                    return
                payload = self._out.popleft()
            try:
                self._dealer.send_multipart([b"msg", *fr.split(payload)], zmq.NOBLOCK)
                self._sent_at = time.monotonic()
            except zmq.Again:
                with self._lock:
                    self._out.appendleft(payload)  # the hub is not reading: later
                return
