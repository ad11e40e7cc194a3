"""The job queue's message channel: the leader's Hub (a ZeroMQ ROUTER socket) and a Link
(a DEALER socket) for each rank and each outside client, over CurveZMQ.

The leader owns the queue's state: every message goes to it or comes from it, over a
connection only the two ends can read or write, so nothing anyone else sends can change
what it counts, whom it hears from or where a reply goes. Why this shape and not a shared
key-value store: a store's keys (counters, boxes, beats) can be written by whoever
reaches its port, and one bad write could break the connection the whole queue shared.

- CurveZMQ encrypts and authenticates every frame of a connection (pyzmq bundles it:
  nothing more to install). A Link pins the hub's public key, shared over the queue's own
  gloo group or written in its secret file, so a server without the hub's private key
  cannot even finish the transport handshake: it never sees a byte of the queue's.
- Curve alone lets anyone connect. Credentials decide who may talk, and as what: a
  connection names its role (a rank, or an outside client) with its nonce and is
  authenticated by mutual challenge and response under that role's credential (auth.py:
  the job's secret for a rank, the client credential for a client), and a Link sends
  nothing but its nonce and role before the hub has proved it holds the credential too.
  A rank's box is never handed to a second session while the first is heard from.
- A Link picks a random 128-bit routing id, which travels inside Curve's encrypted
  handshake: the hub keys its sessions by it, so nobody else can present it (a reconnect
  of the same Link keeps its session), and gives each outside client a box of its own
  with a random name.
- Nothing from a connection that has not authenticated is unpickled or kept: handshake
  frames have fixed shapes and sizes, anything else is dropped (answered "who" at most
  once a second, so a Link whose session the hub lost authenticates again). At most
  `_MAX_PENDING` handshakes (more for a job of many ranks) wait at once, each at most
  `_HANDSHAKE_S`; a new one pushes out the oldest, and the proof of a handshake pushed out
  is answered "who". A Link that is not welcomed says hello again after a backoff with
  jitter, so handshakes lost to a crowd of them (a job of thousands of ranks starting at
  once) are retried, not waited for until the timeout.
- Sessions end: a client's at its bye (the coordinator drops it) or after `_CLIENT_IDLE_S`
  without a frame (a Link pings every second); a client Link that comes back later with
  the same routing id gets its box back (the last `_REMEMBERED` are remembered), and what
  it sent before it noticed (up to `_HELD_MESSAGES`) is delivered once it has
  authenticated again, never before.
- One thread owns each socket. Sends never wait: what a peer does not read within its
  queue (`_HWM` messages) is dropped and counted, so no peer can stall the hub.
- Liveness is what the leader observes: the hub notes when it last heard from each
  session, and beats to every session every `BEAT_S`, which is how Links notice a silent
  leader. Nobody else can move either clock.

Not protected: anyone who reaches the port can open connections (each costs a handshake
slot for `_HANDSHAKE_S`, and a descriptor of the leader's process: the hub raises the
process's soft limit on descriptors to its hard limit, and a transport handshake not done
within `_TRANSPORT_HANDSHAKE_MS` is closed), and anyone on the path can drop or delay the
queue's packets.
"""

from __future__ import annotations

import collections
import itertools
import logging
import pickle
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import QueueAuthError
from . import auth
from .messages import MAX_MESSAGE, agent_box

log = logging.getLogger("freeride.job")

BEAT_S = 0.1  # the hub beats to every session this often
_ROUTING_ID_BYTES = 16
_MAX_PENDING = 256  # handshakes in progress at once
_HANDSHAKE_S = 10.0  # a handshake not finished by then is forgotten
_WHO_EVERY_S = 1.0
_ROLE_BYTES = 64  # the longest role a hello may name
_CLIENT_IDLE_S = 60.0  # a client session not heard from this long ends
_REMEMBERED = 4096  # boxes of ended client sessions kept for their Links' return
_HELD_MESSAGES = 64  # messages of an ended session kept until its Link authenticates again
_HELLO_AGAIN_S = (0.5, 4.0)  # a Link's first wait for an answer to its hello, and the most
# A rank's session heard within this long is live: no other session may take its box (its
# Link pings every second and sends its stats every BEAT_S).
_RANK_LIVE_S = 3.0
_HWM = 100_000  # messages queued per peer before new ones are dropped
_LINGER_MS = 200  # how long a closing socket may still send what it queued
_TRANSPORT_HANDSHAKE_MS = 5000  # ZMTP/Curve's own handshake (libzmq's default: 30 s)
_MAX_DESCRIPTORS = 1 << 20  # the soft limit the hub raises to, where the hard one is higher
_ids = itertools.count()


def raise_descriptor_limit() -> int:
    """Raises this process's soft limit on open descriptors to its hard limit (at most
    _MAX_DESCRIPTORS): idle connections to the hub's port each hold one, and at a soft
    limit of 1024 a thousand of them would leave training unable to open a file.
    Returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, _MAX_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            log.debug("freeride job queue: could not raise RLIMIT_NOFILE", exc_info=True)
    return soft


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as exc:  # pragma: no cover - a dependency of freeride
        raise RuntimeError(
            "the job queue needs pyzmq (pip install pyzmq), a dependency of freeride"
        ) from exc
    if not zmq.has("curve"):  # pragma: no cover - pyzmq's wheels all have it
        raise RuntimeError("the job queue needs a pyzmq built with CurveZMQ")
    return zmq


def _tcp(ip: str, port: int | None = None) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"tcp://{host}" if port is None else f"tcp://{host}:{port}"


def resolve(host: str) -> str:
    """The first address `host` resolves to (ValueError naming it if none)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"host {host!r} does not resolve: {exc}") from None
    return infos[0][4][0]


def _socket(ctx: Any, kind: int, ip: str) -> Any:
    zmq = _zmq()
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = _HWM
    sock.maxmsgsize = MAX_MESSAGE
    if ":" in ip:
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class _Waker:
    """Wakes a socket-owning thread from any thread (an inproc pair; sends under a
    lock, since a zmq socket is not thread-safe)."""

    def __init__(self, ctx: Any) -> None:
        zmq = _zmq()
        name = f"inproc://freeride-wake-{next(_ids)}"
        self.rx = ctx.socket(zmq.PULL)
        self.rx.linger = 0
        self.rx.bind(name)
        self._tx = ctx.socket(zmq.PUSH)
        self._tx.linger = 0
        self._tx.connect(name)
        self._lock = threading.Lock()

    def ring(self) -> None:
        zmq = _zmq()
        with self._lock:
            try:
                self._tx.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # already ringing, or closed

    def clear(self) -> None:
        zmq = _zmq()
        while True:
            try:
                self.rx.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return

    def close(self) -> None:
        with self._lock:
            self._tx.close(0)
        self.rx.close(0)


def _pump(
    sock: Any,
    waker: _Waker,
    stop: threading.Event,
    on_frames: Callable[[list[bytes]], None],
    after_round: Callable[[], None],
    what: str,
) -> None:
    """The loop of a socket's owning thread until `stop`: waits (at most BEAT_S / 2) for
    frames or a ring, hands each frame list to `on_frames` (at most 1024 a round, so sends
    and beats go on under a flood), then calls `after_round`. A round that raises is
    logged the first time; the loop goes on."""
    zmq = _zmq()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(waker.rx, zmq.POLLIN)
    failures = 0
    while not stop.is_set():
        try:
            events = dict(poller.poll(int(BEAT_S * 1000 / 2)))
            if waker.rx in events:
                waker.clear()
            if sock in events:
                for _ in range(1024):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    on_frames(frames)
            after_round()
        except Exception:
            failures += 1
            if failures == 1:
                log.exception("freeride job queue: the %s's thread failed a round", what)


def _end(
    stop: threading.Event, waker: _Waker, thread: threading.Thread, sock: Any, ctx: Any
) -> None:
    """Stops a socket's owning thread, joins it (5 s at most), then closes the socket,
    lingering _LINGER_MS so that what its last round sent still goes out, and the
    context (its I/O thread ends). A thread that would not end keeps them."""
    stop.set()
    waker.ring()
    if thread is not threading.current_thread():
        thread.join(5.0)
    if not thread.is_alive():
        sock.close(_LINGER_MS)
        waker.close()
        ctx.term()


class _Session:
    __slots__ = ("box", "heard")

    def __init__(self, box: str, heard: float) -> None:
        self.box = box
        self.heard = heard


class Hub:
    """The leader's end: listens on `ip` (an address, not a name), authenticates each
    connection, and hands the coordinator (box, message) pairs from authenticated
    sessions. `ranks`: the ranks that may connect as ranks."""

    def __init__(self, ip: str, secret: bytes, ranks: list[int]) -> None:
        zmq = _zmq()
        self._secret = secret
        self._client_credential = auth.client_credential(secret)
        self._ranks = set(ranks)
        self._ctx = zmq.Context()  # its own: term() ends its I/O thread
        public, private = zmq.curve_keypair()
        self.public_key: bytes = public
        raise_descriptor_limit()
        self._router = _socket(self._ctx, zmq.ROUTER, ip)
        self._router.handshake_ivl = _TRANSPORT_HANDSHAKE_MS
        self._router.curve_server = True
        self._router.curve_publickey = public
        self._router.curve_secretkey = private
        try:
            self.port: int = self._router.bind_to_random_port(_tcp(ip))
        except zmq.ZMQError as exc:
            self._router.close(0)
            self._ctx.term()
            raise ValueError(
                f"cannot listen on {ip} ({exc}): give JobQueue(host=...) an address of this "
                "machine that the other ranks reach"
            ) from None
        self._waker = _Waker(self._ctx)
        self._lock = threading.Lock()
        self._out: collections.deque[tuple[str, bytes]] = collections.deque()
        self._in: collections.deque[tuple[str, bytes]] = collections.deque()
        self._sessions: dict[bytes, _Session] = {}
        self._boxes: dict[str, bytes] = {}
        self._ended: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._held: dict[bytes, list[bytes]] = {}  # routing id (ended) -> messages
        self._max_pending = _MAX_PENDING + len(self._ranks)
        # routing id -> (client nonce, server nonce, role, when the hello came)
        self._pending: dict[bytes, tuple[bytes, bytes, bytes, float]] = {}
        self._who: dict[bytes, float] = {}
        self._stop = threading.Event()
        self.dropped = 0  # frames of no session, or of no known shape
        self.refused = 0  # handshakes refused: an unknown role, a proof that did not
        # verify, or a rank's box its live session holds
        self.malformed = 0  # authenticated messages that did not unpickle
        self._thread = threading.Thread(target=self._serve, name="freeride-jobqueue-hub")
        self._thread.daemon = True
        self._thread.start()

    # -- the coordinator's side ------------------------------------------------------------

    def send(self, box: str, message: Any) -> None:
        """Queues `message` for whoever holds `box` (dropped, counted, if nobody does by
        the time the hub's thread sends it). Never waits."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._out.append((box, payload))
        self._waker.ring()

    def poll(self) -> tuple[str, Any] | None:
        """The next (sender's box, message) from an authenticated session, or None."""
        while True:
            with self._lock:
                if not self._in:
                    return None
                box, payload = self._in.popleft()
            try:
                return box, pickle.loads(payload)
            except Exception:  # noqa: BLE001 - authenticated, but unreadable
                self.malformed += 1
                log.warning("freeride job queue: a message from %s did not unpickle", box)

    def drop(self, box: str) -> None:
        """Ends the session holding `box` (a client that said bye): it is beaten no more,
        and a Link that still sends is asked to authenticate again."""
        with self._lock:
            rid = self._boxes.pop(box, None)
            if rid is not None:
                self._sessions.pop(rid, None)

    def sessions(self) -> int:
        """Sessions open now."""
        with self._lock:
            return len(self._sessions)

    def heard(self, box: str) -> float | None:
        """When (time.monotonic()) the hub last heard from `box`'s session; None if no
        session holds it."""
        with self._lock:
            rid = self._boxes.get(box)
            session = self._sessions.get(rid) if rid is not None else None
            return None if session is None else session.heard

    def close(self) -> None:
        """Ends the thread and closes the socket (what it sent last still goes out)."""
        _end(self._stop, self._waker, self._thread, self._router, self._ctx)

    # -- the hub's thread ------------------------------------------------------------------

    def _serve(self) -> None:
        next_beat = 0.0

        def after_round() -> None:
            nonlocal next_beat
            self._flush()
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + BEAT_S
                self._beat(now)

        _pump(self._router, self._waker, self._stop, self._on_frames, after_round, "hub")
        try:
            self._flush()  # the last messages (byes, "closed") before the socket closes
        except Exception:
            log.debug("freeride job queue: the hub's last sends failed", exc_info=True)

    def _send(self, rid: bytes, *frames: bytes) -> None:
        """Sends without waiting: beyond the peer's queue (or to a peer gone) it is
        dropped."""
        zmq = _zmq()
        try:
            self._router.send_multipart([rid, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _on_frames(self, frames: list[bytes]) -> None:
        rid, body = frames[0], frames[1:]
        if len(rid) != _ROUTING_ID_BYTES or not body:
            self.dropped += 1
            return
        kind, now = body[0], time.monotonic()
        with self._lock:
            session = self._sessions.get(rid)
        if kind == b"msg" and len(body) == 2 and session is not None:
            with self._lock:
                session.heard = now
                self._in.append((session.box, body[1]))
        elif (
            kind == b"hello"
            and len(body) == 3
            and len(body[1]) == auth.NONCE_BYTES
            and len(body[2]) <= _ROLE_BYTES
        ):
            self._challenge(rid, body[1], body[2], now)
        elif kind == b"auth" and len(body) == 2:
            self._authenticate(rid, body[1], now)
        elif kind == b"ping" and len(body) == 1 and session is not None:
            with self._lock:
                session.heard = now
        else:
            if session is None and kind == b"msg" and len(body) == 2 and rid in self._ended:
                held = self._held.setdefault(rid, [])
                if len(held) < _HELD_MESSAGES:  # delivered once it authenticates again
                    held.append(body[1])
            self.dropped += 1
            if session is None and kind in (b"msg", b"ping"):
                self._ask_who(rid, now)

    def _ask_who(self, rid: bytes, now: float) -> None:
        """Tells a Link the hub has no session for it (it authenticates again)."""
        if now - self._who.get(rid, 0.0) < _WHO_EVERY_S:
            return
        if len(self._who) > 4096:
            self._who.clear()
        self._who[rid] = now
        self._send(rid, b"who")

    def _credential(self, role: bytes) -> bytes | None:
        """The credential a connection in `role` must prove it holds; None for a role
        nobody may take."""
        if role == auth.CLIENT_ROLE:
            return self._client_credential
        if role.startswith(b"rank:"):
            try:
                rank = int(role[5:])
            except ValueError:
                return None
            return self._secret if rank in self._ranks and role == auth.rank_role(rank) else None
        return None

    def _refuse(self, rid: bytes, why: str, answer: bytes = b"refused") -> None:
        self.refused += 1
        if self.refused == 1:
            log.warning("freeride job queue: refused a connection: %s", why)
        self._send(rid, answer)

    def _challenge(self, rid: bytes, client_nonce: bytes, role: bytes, now: float) -> None:
        credential = self._credential(role)
        if credential is None:
            self._refuse(rid, "it asked for a role nobody may take")
            return
        if rid not in self._pending and len(self._pending) >= self._max_pending:
            self._expire(now)
            if len(self._pending) >= self._max_pending:
                # The oldest goes (dicts keep insertion order): handshakes left half done
                # by the hundred cannot keep a real peer out, only race it.
                del self._pending[next(iter(self._pending))]
                self.dropped += 1
        server_nonce = auth.new_nonce()
        self._pending[rid] = (client_nonce, server_nonce, role, now)
        proof = auth.server_proof(credential, client_nonce, server_nonce, self.public_key)
        self._send(rid, b"challenge", server_nonce, proof)

    def _authenticate(self, rid: bytes, proof: bytes, now: float) -> None:
        pending = self._pending.pop(rid, None)
        if pending is None or now - pending[3] > _HANDSHAKE_S:
            # Pushed out by newer ones, or too late: it starts again (at most once a second).
            self.dropped += 1
            self._ask_who(rid, now)
            return
        client_nonce, server_nonce, role, _ = pending
        credential = self._credential(role)
        expected = auth.client_proof(credential or b"", client_nonce, server_nonce, role)
        if credential is None or not auth.same(expected, proof):
            self._refuse(rid, "its proof did not verify")
            return
        rank = role.startswith(b"rank:")
        with self._lock:
            if rank:
                box = agent_box(int(role[5:]))
            else:  # a client Link authenticating again, or back after its session
                # ended, keeps its box
                current = self._sessions.get(rid)
                box = (
                    current.box
                    if current is not None
                    else self._ended.pop(rid, None) or f"fr-client/{secrets.token_hex(8)}"
                )
            waiting = self._held.pop(rid, [])
            old = self._boxes.get(box)
            holder = self._sessions.get(old) if old is not None and old != rid else None
            taken = holder is not None and now - holder.heard < _RANK_LIVE_S
            if not taken:
                if holder is not None:  # the rank connected again: the new session holds it
                    self._sessions.pop(old, None)
                self._sessions[rid] = _Session(box, now)
                self._boxes[box] = rid
        if taken:
            self._refuse(rid, f"{box} is held by a live session", b"taken")
            return
        self._send(rid, b"welcome", box.encode())
        if waiting:
            with self._lock:
                self._in.extend((box, payload) for payload in waiting)
            self.dropped -= len(waiting)  # counted when held: delivered after all

    def _expire(self, now: float) -> None:
        for rid, (*_, begun) in list(self._pending.items()):
            if now - begun > _HANDSHAKE_S:
                del self._pending[rid]

    def _flush(self) -> None:
        while True:
            with self._lock:
                if not self._out:
                    return
                box, payload = self._out.popleft()
                rid = self._boxes.get(box)
            if rid is not None:
                self._send(rid, b"msg", payload)

    def _beat(self, now: float) -> None:
        with self._lock:
            for rid, session in list(self._sessions.items()):
                if session.box.startswith("fr-client/") and now - session.heard > _CLIENT_IDLE_S:
                    del self._sessions[rid]
                    self._boxes.pop(session.box, None)
                    self._ended[rid] = session.box
                    if len(self._ended) > _REMEMBERED:
                        self._held.pop(self._ended.popitem(last=False)[0], None)
            rids = list(self._sessions)
        for rid in rids:
            self._send(rid, b"beat")
        self._expire(now)


class Link:
    """One end of a connection to the hub at `ip`:`port` whose public key is
    `server_key`, as `role` (auth.rank_role(n), with the job's secret as `secret`, or
    auth.CLIENT_ROLE with the client credential). Authenticates before it returns:
    QueueAuthError if the hub refuses the credential (or fails to prove it holds it), or
    another live session holds the rank's box; ConnectionError if no hub with that key
    answers within `timeout` s. `address` names the hub in errors."""

    def __init__(
        self,
        ip: str,
        port: int,
        secret: bytes,
        server_key: bytes,
        role: bytes,
        timeout: float,
        address: str,
    ) -> None:
        zmq = _zmq()
        self._secret = secret
        self._server_key = server_key
        self._role = role
        self._address = address
        self._ctx = zmq.Context()
        self._dealer = _socket(self._ctx, zmq.DEALER, ip)
        public, private = zmq.curve_keypair()
        try:
            self._dealer.curve_serverkey = server_key
        except zmq.ZMQError:
            self._dealer.close(0)
            self._ctx.term()
            raise ValueError(
                "server_key is not a CurveZMQ public key (40 Z85 characters)"
            ) from None
        self._dealer.curve_publickey = public
        self._dealer.curve_secretkey = private
        self._dealer.routing_id = secrets.token_bytes(_ROUTING_ID_BYTES)
        self._dealer.connect(_tcp(ip, port))
        self._lock = threading.Lock()
        self._in: collections.deque[bytes] = collections.deque()
        self._out: collections.deque[bytes] = collections.deque(maxlen=_HWM)
        self._nonce: bytes | None = None
        # Nonces of this handshake's earlier hellos: a challenge to one is stale, not forged.
        self._stale: collections.deque[bytes] = collections.deque(maxlen=8)
        self._hello_at = 0.0
        self._ready = False
        self._held = threading.Event()
        self.heard = time.monotonic()
        self.dropped = 0  # frames of no known shape, or a challenge that did not verify
        self.malformed = 0  # messages that did not unpickle
        self.box = ""
        try:
            self._handshake(time.monotonic() + timeout)
        except BaseException:
            self._dealer.close(0)
            self._ctx.term()
            raise
        self._waker = _Waker(self._ctx)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="freeride-jobqueue-link")
        self._thread.daemon = True
        self._thread.start()

    def _handshake(self, deadline: float) -> None:
        """Until welcomed: says hello, and again after a backoff with jitter (from
        _HELLO_AGAIN_S[0], doubling up to [1]) or at once when the hub asks "who" (its
        pending handshake was pushed out by a crowd of others), until `deadline`."""
        zmq = _zmq()
        wait = _HELLO_AGAIN_S[0]
        hellos, answered = 0, False
        next_hello = 0.0
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
            if not self._dealer.poll(int(left * 1000) + 1):
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
        again, up to its queue's length)."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._out.append(payload)
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
        """Seconds since the hub was last heard from (it beats every BEAT_S)."""
        return time.monotonic() - self.heard

    def close(self) -> None:
        """Ends the thread and closes the socket (what it sent last still goes out)."""
        _end(self._stop, self._waker, self._thread, self._dealer, self._ctx)

    # -- the Link's thread -----------------------------------------------------------------

    def _serve(self) -> None:
        zmq = _zmq()
        last_ping = 0.0

        def after_round() -> None:
            nonlocal last_ping
            now = time.monotonic()
            if self._ready and not self._held.is_set() and now - last_ping >= 1.0:
                last_ping = now  # a client with nothing to say still has a session
                self._dealer.send_multipart([b"ping"], zmq.NOBLOCK)
            elif not self._ready and now - self._hello_at >= _HELLO_AGAIN_S[1] * (
                1.0 + random.random()
            ):
                self._hello()  # authenticating again, and that hello was lost: again
            self._flush()

        _pump(self._dealer, self._waker, self._stop, self._on_frames, after_round, "link")
        try:
            self._flush()  # the last messages ("gone", "bye") before the socket closes
        except Exception:
            log.debug("freeride job queue: a link's last sends failed", exc_info=True)

    def _on_frames(self, frames: list[bytes]) -> None:
        kind = frames[0] if frames else b""
        if kind == b"msg" and len(frames) == 2 and self._ready:
            self.heard = time.monotonic()
            with self._lock:
                self._in.append(frames[1])
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
        zmq = _zmq()
        while self._ready and not self._held.is_set():
            with self._lock:
                if not self._out:
                    return
                payload = self._out.popleft()
            try:
                self._dealer.send_multipart([b"msg", payload], zmq.NOBLOCK)
            except zmq.Again:
                with self._lock:
                    self._out.appendleft(payload)  # the hub is not reading: later
                return
