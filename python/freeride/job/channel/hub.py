"""The leader's end of the channel: a ROUTER socket that authenticates each connection
(ZAP on its Curve key, then challenge and response under its role's credential), keeps
a session per authenticated connection, and hands the coordinator (box, message) pairs."""

from __future__ import annotations

import collections
import logging
import pickle
import secrets
import threading
import time
from typing import Any

from .. import auth
from ..messages import MAX_MESSAGE, STATS_BYTES, agent_box, is_status_box
from . import frames as fr
from . import status_json
from .sockets import (
    ROUTING_ID_BYTES,
    Waker,
    end,
    new_socket,
    pump,
    raise_descriptor_limit,
    tcp,
    zmq_module,
)
from .zap import DOMAIN, Zap

log = logging.getLogger("freeride.job")

BEAT_S = 0.1  # how often the hub beats to a session it sent nothing else (small jobs)
_MAX_PENDING = 256  # handshakes in progress at once (more for a job of many ranks)
_HANDSHAKE_S = 10.0  # a handshake not finished by then is forgotten
_WHO_EVERY_S = 1.0
_ROLE_BYTES = 64  # the longest role a hello may name
_HELLO_EVERY_S = 0.25  # a connection's hellos answered at most this often
_HELLOS_PER_S = 2000  # hellos answered per second at most, beyond a burst of the pending
_CLIENT_IDLE_S = 60.0  # a client session not heard from this long ends
# Status sessions live at once, at most: one more ends the one heard from longest ago
# (its Link authenticates again when it next sends). The status credential is the one
# monitoring tools are given, and the hub walks every session at every beat: a holder
# opening connections without end would otherwise leave thousands for it to walk.
_STATUS_SESSIONS = 256
_REMEMBERED = 4096  # boxes of ended sessions kept for their Links' return, of each kind
_HELD_MESSAGES = 64  # messages of an ended session kept until its Link authenticates again
_HELD_BYTES = MAX_MESSAGE  # all ended sessions' held messages together, at most
# A status session's messages are table requests, of which the latest alone counts: one
# held a session, and a budget of their own, so that status sessions pushed out by the
# cap on them cannot take the clients' (round 5, S5).
_HELD_STATUS_MESSAGES = 1
_HELD_STATUS_BYTES = 1 << 20
# A rank's session heard within this long is live: no other session may take its box (its
# Link sends its stats at least every beat, pings every second otherwise).
_RANK_LIVE_S = 3.0
# The hub's shortest round: what a message waits at most before the hub takes it, for
# frames taken a few at a time when a job's ranks send a thousand a second.
_ROUND_S = 0.02
# Messages queued for each peer before new ones are dropped: a peer that does not read
# cannot make the hub hold more (beats are not queued behind a backlog: they are sent
# only to sessions sent nothing else for a beat).
_HWM = 1000


class _Session:
    __slots__ = ("box", "heard", "kind", "sent")

    def __init__(self, box: str, kind: str, now: float) -> None:
        self.box = box
        self.kind = kind
        self.heard = now
        self.sent = now


class Hub:
    """The leader's end: listens on `ip` (an address, not a name), authenticates each
    connection, and hands the coordinator (box, message) pairs from authenticated
    sessions. `ranks`: the ranks that may connect as ranks. `beat_s`: the longest a
    session goes without a frame from the hub (its Link's sign that the leader lives)."""

    def __init__(self, ip: str, secret: bytes, ranks: list[int], beat_s: float = BEAT_S) -> None:
        zmq = zmq_module()
        client = auth.client_credential(secret)
        status = auth.status_credential(client)
        self._credentials = {
            auth.RANK_KIND: secret,
            auth.CLIENT_KIND: client,
            auth.STATUS_KIND: status,
        }
        self._ranks = set(ranks)
        self._beat_s = beat_s
        self._ctx = zmq.Context()  # its own: term() ends its I/O thread, and its ZAP
        public, private = zmq.curve_keypair()
        self.public_key: bytes = public
        raise_descriptor_limit()
        # Bound before the router listens; and with ZAP_ENFORCE_DOMAIN, a connection
        # that no handler answers for is refused, never let through (with DOMAIN alone,
        # libzmq 4.3.5 lets it in).
        self._zap = Zap(
            self._ctx,
            {auth.curve_keys(c, kind)[0]: kind for kind, c in self._credentials.items()},
        )
        self._router = new_socket(self._ctx, zmq.ROUTER, ip, _HWM)
        self._router.curve_server = True
        self._router.curve_publickey = public
        self._router.curve_secretkey = private
        self._router.zap_domain = DOMAIN
        self._router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        # A Link that reconnects (its old connection half-open behind a NAT) takes its
        # routing id over at once. Only the Link knows its id (it travels encrypted), and
        # every frame's key kind is checked against its session's.
        self._router.router_handover = 1
        try:
            self.port: int = self._router.bind_to_random_port(tcp(ip))
        except zmq.ZMQError as exc:
            self._router.close(0)
            self._zap.close()
            self._ctx.term()
            raise ValueError(
                f"cannot listen on {ip} ({exc}): give JobQueue(host=...) an address of this "
                "machine that the other ranks reach"
            ) from None
        self._waker = Waker(self._ctx)
        self._lock = threading.Lock()
        self._out: collections.deque[tuple[str, bytes]] = collections.deque()
        # (box, message): a pickle as its session sent it, or (a status session's) the
        # message the hub made of its JSON, never bytes to unpickle.
        self._in: collections.deque[tuple[str, bytes | tuple]] = collections.deque()
        self._status_waiting: set[str] = set()  # status boxes with a table request in _in
        self._arrived = threading.Event()  # set when _in gains a message
        self._stats: dict[str, bytes] = {}  # each rank's latest stats, by box
        self._sessions: dict[bytes, _Session] = {}
        self._boxes: dict[str, bytes] = {}
        # routing id of an ended session -> its (box, key kind); _REMEMBERED of each kind,
        # oldest first in _ended_order, so that status sessions ending without end (each
        # `freeride status` says bye) never push out a client's box
        self._ended: dict[bytes, tuple[str, str]] = {}
        self._ended_order: dict[str, collections.OrderedDict[bytes, None]] = {
            auth.CLIENT_KIND: collections.OrderedDict(),
            auth.STATUS_KIND: collections.OrderedDict(),
        }
        self._held: dict[bytes, list[bytes]] = {}  # routing id (ended) -> messages
        self._held_bytes = 0
        self._held_status: set[bytes] = set()  # those of status sessions, apart
        self._held_status_bytes = 0
        self._max_pending = _MAX_PENDING + len(self._ranks)
        # routing id -> (client nonce, server nonce, role, when the hello came)
        self._pending: dict[bytes, tuple[bytes, bytes, bytes, float]] = {}
        self._who: dict[bytes, float] = {}
        self._hello_at: dict[bytes, float] = {}
        self._burst = float(self._max_pending)  # hellos that may be answered now
        self._burst_at = time.monotonic()
        self._stop = threading.Event()
        self.dropped = 0  # frames of no session, or of no known shape, or hellos over rate
        self.refused = 0  # handshakes refused: an unknown role, a role its key's kind may
        # not take, a proof that did not verify, or a rank's box its live session holds
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
        """The next (sender's box, message) from an authenticated session, or None.
        Nothing a status session sent is unpickled: the hub made its message."""
        while True:
            with self._lock:
                if not self._in:
                    return None
                box, payload = self._in.popleft()
                if not isinstance(payload, bytes):
                    if payload[0] == "status":
                        self._status_waiting.discard(box)
                    return box, payload
            if is_status_box(box):
                self.malformed += 1  # (never put there: _deliver makes a status box's)
                continue
            try:
                return box, pickle.loads(payload)
            except Exception:  # noqa: BLE001 - authenticated, but unreadable
                self.malformed += 1
                log.warning("freeride job queue: a message from %s did not unpickle", box)

    def take_stats(self) -> dict[str, bytes]:
        """Each rank's latest stats (messages.pack_stats) received since the last call,
        by box."""
        with self._lock:
            stats, self._stats = self._stats, {}
        return stats

    def wait(self, timeout: float) -> None:
        """Waits until a message may be waiting for poll() (or `timeout` s)."""
        if self._arrived.wait(timeout):
            self._arrived.clear()

    def drop(self, box: str) -> None:
        """Ends the session holding `box` (a client that said bye): it is beaten no more,
        and a Link that still sends is asked to authenticate again. Its box is
        remembered as a silent session's: a connection that says bye and authenticates
        again gets it back, not a new box to be sent a first table without a ticket."""
        with self._lock:
            rid = self._boxes.get(box)
            if rid is not None and rid in self._sessions:
                self._end_session(rid)

    def sessions(self) -> int:
        """Sessions open now."""
        with self._lock:
            return len(self._sessions)

    def heard_all(self) -> dict[str, float]:
        """When the hub last heard from each session, by box (one look for all)."""
        with self._lock:
            return {s.box: s.heard for s in self._sessions.values()}

    @property
    def denied(self) -> int:
        """Connections whose Curve key no credential of this queue yields."""
        return self._zap.denied

    def close(self) -> None:
        """Ends the thread and closes the socket (what it sent last still goes out)."""
        end(self._stop, self._waker, self._thread, [self._router, self._zap.sock], self._ctx)

    # -- the hub's thread ------------------------------------------------------------------

    def _serve(self) -> None:
        next_beat = 0.0

        def after_round() -> None:
            nonlocal next_beat
            self._flush()
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self._beat_s / 4
                self._beat(now)

        pump(
            self._router,
            self._waker,
            self._stop,
            self._on_frames,
            after_round,
            "hub",
            min(self._beat_s / 2, 0.25),
            copy=False,
            extra=(self._zap.sock, self._zap.answer),
            round_s=_ROUND_S,
            max_frames=fr.MAX_PARTS + 2,
        )
        try:
            self._flush()  # the last messages (byes, "closed") before the socket closes
        except Exception:
            log.debug("freeride job queue: the hub's last sends failed", exc_info=True)

    def _send(self, rid: bytes, *frames: Any) -> None:
        """Sends without waiting: beyond the peer's queue (or to a peer gone) it is
        dropped."""
        zmq = zmq_module()
        try:
            self._router.send_multipart([rid, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass

    def _on_frames(self, frames: list[Any]) -> None:
        # The routing id, the message's kind and its parts: no more parts than a message
        # may have are copied (libzmq has them already; a copy would double them).
        if not 2 <= len(frames) <= fr.MAX_PARTS + 2:
            self.dropped += 1
            return
        # The kind of credential the connection's Curve key came from (ZAP's User-Id).
        kind = frames[1].get("User-Id")
        rid, what, parts = frames[0].bytes, frames[1].bytes, frames[2:]
        if len(rid) != ROUTING_ID_BYTES:
            self.dropped += 1
            return
        now = time.monotonic()
        with self._lock:
            session = self._sessions.get(rid)
        if session is not None and session.kind != kind:
            session = None  # another key's connection with this id: not this session's
        if what == b"msg" and session is not None:
            if not self._fits(session.kind, parts):
                # Larger than a message may be; a status session's, no status message.
                if session.kind == auth.STATUS_KIND:
                    self.malformed += 1
                else:
                    self.dropped += 1
                return
            with self._lock:
                session.heard = now
            self._deliver(session.kind, session.box, fr.join([p.bytes for p in parts]))
        elif (
            what == b"stats"
            and session is not None
            and session.kind == auth.RANK_KIND
            and len(parts) == 1
            and len(parts[0]) == STATS_BYTES
        ):
            with self._lock:
                session.heard = now
                self._stats[session.box] = parts[0].bytes
        elif (
            what == b"hello"
            and len(parts) == 2
            and len(parts[0]) == auth.NONCE_BYTES
            and len(parts[1]) <= _ROLE_BYTES
        ):
            if self._may_answer_hello(rid, now):
                self._challenge(rid, parts[0].bytes, parts[1].bytes, kind, now)
        elif what == b"auth" and len(parts) == 1 and len(parts[0]) == auth.TAG_BYTES:
            self._authenticate(rid, parts[0].bytes, kind, now)
        elif what == b"ping" and not parts and session is not None:
            with self._lock:
                session.heard = now
        else:
            if session is None and what == b"msg":
                self._hold(rid, kind, parts)
            self.dropped += 1
            if session is None and what in (b"msg", b"ping"):
                self._ask_who(rid, now)

    @staticmethod
    def _fits(kind: str | None, parts: list[Any]) -> bool:
        """Whether `parts` may be one message of a session of `kind`: a status session's
        is one part of JSON, at most status_json.STATUS_BYTES; anyone else's at most a
        message."""
        if kind == auth.STATUS_KIND:
            return len(parts) == 1 and len(parts[0]) <= status_json.STATUS_BYTES
        return fr.fits(parts)

    def _hold(self, rid: bytes, kind: str | None, parts: list[Any]) -> None:
        """Keeps a message of an ended session's Link, sent before it heard "who", until
        it authenticates again (it does not send it twice): only from a connection of the
        ended session's key kind, _HELD_MESSAGES a session and _HELD_BYTES in all (a
        status session's: _HELD_STATUS_MESSAGES and _HELD_STATUS_BYTES)."""
        ended = self._ended.get(rid)
        if ended is None or ended[1] != kind or not self._fits(kind, parts):
            return
        size = sum(len(p) for p in parts)
        held = self._held.get(rid, [])
        status = kind == auth.STATUS_KIND
        most, used, budget = (
            (_HELD_STATUS_MESSAGES, self._held_status_bytes, _HELD_STATUS_BYTES)
            if status
            else (_HELD_MESSAGES, self._held_bytes, _HELD_BYTES)
        )
        if len(held) >= most or used + size > budget:
            log.warning(
                "freeride job queue: a message of %s, whose session had ended, was dropped:"
                " too many held",
                ended[0],
            )
            return
        held.append(fr.join([p.bytes for p in parts]))
        self._held[rid] = held
        if status:
            self._held_status.add(rid)
            self._held_status_bytes += size
        else:
            self._held_bytes += size

    def _unhold(self, rid: bytes) -> list[bytes]:
        held = self._held.pop(rid, [])
        size = sum(len(p) for p in held)
        if rid in self._held_status:
            self._held_status.discard(rid)
            self._held_status_bytes -= size
        else:
            self._held_bytes -= size
        return held

    def _deliver(self, kind: str, box: str, payload: bytes) -> None:
        """Hands the coordinator a message of the session holding `box`, of key `kind`: a
        status session's as the message its JSON stands for (one table request waiting
        at most a box), anyone else's as the pickle it sent."""
        message: bytes | tuple = payload
        if kind == auth.STATUS_KIND:
            made = self._status_message(box, payload)
            if made is None:
                return
            if made[0] == "status":
                with self._lock:
                    if box in self._status_waiting:  # its last one is not answered yet
                        self.dropped += 1
                        return
                    self._status_waiting.add(box)
            message = made
        with self._lock:
            self._in.append((box, message))
        self._arrived.set()

    def _status_message(self, box: str, payload: bytes) -> tuple | None:
        """A status session's message as the coordinator's message from `box`
        (status_json.parse), or None: dropped and counted."""
        made = status_json.parse(box, payload)
        if made is None:
            self.malformed += 1
        return made

    def _may_answer_hello(self, rid: bytes, now: float) -> bool:
        """Whether a hello is answered: at most one per connection every
        _HELLO_EVERY_S, and _HELLOS_PER_S in all after a burst as large as the pending
        handshakes may be (a job's ranks all starting at once). A hello not answered is
        said again by its Link."""
        if now - self._hello_at.get(rid, -1.0) < _HELLO_EVERY_S:
            self.dropped += 1
            return False
        self._burst = min(
            float(self._max_pending), self._burst + (now - self._burst_at) * _HELLOS_PER_S
        )
        self._burst_at = now
        if self._burst < 1.0:
            self.dropped += 1
            return False
        self._burst -= 1.0
        if len(self._hello_at) > 2 * self._max_pending:
            self._hello_at = {r: t for r, t in self._hello_at.items() if now - t < _HELLO_EVERY_S}
        self._hello_at[rid] = now
        return True

    def _ask_who(self, rid: bytes, now: float) -> None:
        """Tells a Link the hub has no session for it (it authenticates again)."""
        if now - self._who.get(rid, 0.0) < _WHO_EVERY_S:
            return
        if len(self._who) > 4096:
            self._who.clear()
        self._who[rid] = now
        self._hello_at.pop(rid, None)  # the hello it answers with is not one too many
        self._send(rid, b"who")

    def _credential(self, role: bytes, kind: str | None) -> bytes | None:
        """The credential a connection whose key is of `kind` must prove it holds for
        `role`; None for a role nobody may take, or that this connection's key may not."""
        if auth.kind_of(role) != kind or kind is None:
            return None
        if kind == auth.RANK_KIND:
            try:
                rank = int(role[5:])
            except ValueError:
                return None
            if rank not in self._ranks or role != auth.rank_role(rank):
                return None
        return self._credentials[kind]

    def _refuse(self, rid: bytes, why: str, answer: bytes = b"refused") -> None:
        self.refused += 1
        if self.refused == 1:
            log.warning("freeride job queue: refused a connection: %s", why)
        self._send(rid, answer)

    def _challenge(
        self, rid: bytes, client_nonce: bytes, role: bytes, kind: str | None, now: float
    ) -> None:
        credential = self._credential(role, kind)
        if credential is None:
            self._refuse(rid, f"it asked for a role its key ({kind}) may not take")
            return
        if rid not in self._pending and len(self._pending) >= self._max_pending:
            self._expire(now)
            if len(self._pending) >= self._max_pending:
                # The oldest goes (dicts keep insertion order): its proof will be answered
                # "who" and its Link says hello again.
                del self._pending[next(iter(self._pending))]
                self.dropped += 1
        server_nonce = auth.new_nonce()
        self._pending[rid] = (client_nonce, server_nonce, role, now)
        proof = auth.server_proof(credential, client_nonce, server_nonce, self.public_key)
        self._send(rid, b"challenge", server_nonce, proof)

    def _authenticate(self, rid: bytes, proof: bytes, kind: str | None, now: float) -> None:
        pending = self._pending.pop(rid, None)
        if pending is None or now - pending[3] > _HANDSHAKE_S:
            # Pushed out by newer ones, or too late: it starts again (at most once a second).
            self.dropped += 1
            self._ask_who(rid, now)
            return
        client_nonce, server_nonce, role, _ = pending
        credential = self._credential(role, kind)
        expected = auth.client_proof(credential or b"", client_nonce, server_nonce, role)
        if credential is None or not auth.same(expected, proof):
            self._refuse(rid, "its proof did not verify")
            return
        assert kind is not None
        with self._lock:
            box = self._box_for(rid, role, kind)
            waiting = self._unhold(rid)
            old = self._boxes.get(box)
            holder = self._sessions.get(old) if old is not None and old != rid else None
            taken = holder is not None and now - holder.heard < _RANK_LIVE_S
            if not taken:
                if holder is not None:  # the rank connected again: the new session holds it
                    self._sessions.pop(old, None)
                if kind == auth.STATUS_KIND and rid not in self._sessions:
                    self._make_room_for_status()
                self._sessions[rid] = _Session(box, kind, now)
                self._boxes[box] = rid
        if taken:
            self._refuse(rid, f"{box} is held by a live session", b"taken")
            return
        self._send(rid, b"welcome", box.encode())
        for payload in waiting:  # as a live session's: a status box's through its JSON
            self._deliver(kind, box, payload)
        self.dropped -= len(waiting)  # counted when held: delivered after all

    def _box_for(self, rid: bytes, role: bytes, kind: str) -> str:
        """The box a session of `role` holds: a rank's own; for a client (or status)
        Link authenticating again, or back after its session ended, the one it had."""
        if kind == auth.RANK_KIND:
            return agent_box(int(role[5:]))
        current = self._sessions.get(rid)
        if current is not None:
            return current.box
        prefix = "fr-status/" if kind == auth.STATUS_KIND else "fr-client/"
        ended = self._ended.pop(rid, None)
        if ended is not None:
            self._ended_order[ended[1]].pop(rid, None)
            if ended[1] == kind:
                return ended[0]
        return f"{prefix}{secrets.token_hex(8)}"

    def _make_room_for_status(self) -> None:
        """Ends the status session heard from longest ago where _STATUS_SESSIONS live.
        Caller holds the lock."""
        status = [
            (session.heard, rid)
            for rid, session in self._sessions.items()
            if session.kind == auth.STATUS_KIND
        ]
        if len(status) >= _STATUS_SESSIONS:
            self._end_session(min(status)[1])

    def _end_session(self, rid: bytes) -> None:
        """Ends a client or status session, remembering its box for its Link's return.
        Caller holds the lock."""
        session = self._sessions.pop(rid)
        self._boxes.pop(session.box, None)
        self._ended[rid] = (session.box, session.kind)
        order = self._ended_order[session.kind]
        order[rid] = None
        order.move_to_end(rid)
        if len(order) > _REMEMBERED:
            oldest = order.popitem(last=False)[0]
            del self._ended[oldest]
            self._unhold(oldest)

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
                session = self._sessions.get(rid) if rid is not None else None
                if session is not None:
                    session.sent = time.monotonic()
            if rid is not None:
                self._send(rid, b"msg", *fr.split(payload))

    def _beat(self, now: float) -> None:
        """Beats to each session sent nothing for a beat (every session hears from the
        hub at least that often, at a cost of one frame per session and beat at most),
        and ends client sessions silent for _CLIENT_IDLE_S."""
        beat = []
        with self._lock:
            for rid, session in list(self._sessions.items()):
                if session.kind != auth.RANK_KIND and now - session.heard > _CLIENT_IDLE_S:
                    self._end_session(rid)
                elif now - session.sent >= self._beat_s:
                    session.sent = now
                    beat.append(rid)
        for rid in beat:
            self._send(rid, b"beat")
        self._expire(now)
