"""What the hub and each Link share: pyzmq, addresses, the sockets' limits, the waker
that lets other threads reach a socket's owner, and that owner's loop."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .frames import WIRE_FRAME_BYTES

log = logging.getLogger("freeride.job")

ROUTING_ID_BYTES = 16
LINGER_MS = 200  # how long a closing socket may still send what it queued
TRANSPORT_HANDSHAKE_MS = 5000  # ZMTP/Curve's own handshake (libzmq's default: 30 s)
# A dead connection (half-open behind a NAT that forgot it, a host gone) is found by the
# kernel, at no cost to the hub: data unacknowledged for MAX_RETRANSMIT_MS closes it
# (TCP_USER_TIMEOUT; a Link sends at least every beat, so its side notices and
# reconnects), and an idle one by TCP keepalive. Not ZMTP heartbeats: each is a
# Curve-boxed PING and PONG through the hub's I/O thread (800 each a second from 4,096
# ranks at one per 5 s), and on the hub's ROUTER libzmq 4.3.5 aborts with them (assert
# !_io_error in stream_engine_base.cpp) on a connection refused during its handshake.
# The hub's end of a dead connection is replaced at once by the Link's reconnection
# (ROUTER_HANDOVER).
MAX_RETRANSMIT_MS = 10_000
KEEPALIVE_S = (30, 5, 6)  # TCP keepalive: idle before the first probe, between, how many
MAX_DESCRIPTORS = 1 << 20  # the soft limit the hub raises to, where the hard one is higher
_ids = itertools.count()


def zmq_module() -> Any:
    try:
        import zmq
    except ImportError as exc:  # pragma: no cover - a dependency of freeride
        raise RuntimeError(
            "the job queue needs pyzmq (pip install pyzmq), a dependency of freeride"
        ) from exc
    if not zmq.has("curve"):  # pragma: no cover - pyzmq's wheels all have it
        raise RuntimeError("the job queue needs a pyzmq built with CurveZMQ")
    return zmq


def tcp(ip: str, port: int | None = None) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"tcp://{host}" if port is None else f"tcp://{host}:{port}"


def resolve(host: str) -> str:
    """The first address `host` resolves to (ValueError naming it if none)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"host {host!r} does not resolve: {exc}") from None
    return infos[0][4][0]


def raise_descriptor_limit() -> int:
    """Raises this process's soft limit on open descriptors to its hard limit (at most
    MAX_DESCRIPTORS): idle connections to the hub's port each hold one, and at a soft
    limit of 1024 a thousand of them would leave training unable to open a file.
    Returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            log.debug("freeride job queue: could not raise RLIMIT_NOFILE", exc_info=True)
    return soft


def new_socket(ctx: Any, kind: int, ip: str, hwm: int) -> Any:
    """A socket whose frames are at most WIRE_FRAME_BYTES each, so that no peer (nor anyone
    before the transport handshake: libzmq applies the limit to its command frames too)
    makes the other end hold more than that for one frame; larger messages travel in
    several frames (frames.py)."""
    zmq = zmq_module()
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = hwm
    sock.maxmsgsize = WIRE_FRAME_BYTES
    sock.handshake_ivl = TRANSPORT_HANDSHAKE_MS
    sock.tcp_keepalive = 1
    sock.tcp_keepalive_idle, sock.tcp_keepalive_intvl, sock.tcp_keepalive_cnt = KEEPALIVE_S
    sock.tcp_maxrt = MAX_RETRANSMIT_MS
    if ":" in ip:
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class Waker:
    """Wakes a socket-owning thread from any thread (an inproc pair; sends under a
    lock, since a zmq socket is not thread-safe)."""

    def __init__(self, ctx: Any) -> None:
        zmq = zmq_module()
        name = f"inproc://freeride-wake-{next(_ids)}"
        self.rx = ctx.socket(zmq.PULL)
        self.rx.linger = 0
        self.rx.bind(name)
        self._tx = ctx.socket(zmq.PUSH)
        self._tx.linger = 0
        self._tx.connect(name)
        self._lock = threading.Lock()

    def ring(self) -> None:
        zmq = zmq_module()
        with self._lock:
            try:
                self._tx.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # already ringing, or closed

    def clear(self) -> None:
        zmq = zmq_module()
        while True:
            try:
                self.rx.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return

    def close(self) -> None:
        with self._lock:
            self._tx.close(0)
        self.rx.close(0)


# Frames a bounded pump reads a round: a legal message has up to MAX_PARTS + 2 (4,098),
# and a round's reading must stay within a few milliseconds of the beats.
FRAMES_PER_ROUND = 8192


class FrameReader:
    """A socket's messages, read frame by frame, at most a budget of frames at a time: a
    message of many frames, legal or not, costs its sender rounds, each followed by the
    thread's sends and beats, not one long stall of the thread (recv_multipart builds an
    object for every frame of a message before anything can look at it: 400,000 empty
    frames, 14 MB, held a leader's hub for 6.7 s and got a live rank declared lost).
    Past `max_frames` the rest of a message is read into a scratch byte and dropped; the
    message is then reported as an empty list. Multipart messages arrive whole, so a
    message begun is read on at once, in the next round where the budget ran out."""

    def __init__(self, sock: Any, max_frames: int, copy: bool = True) -> None:
        self._sock = sock
        self._max = max_frames
        self._copy = copy
        self._frames: list[Any] = []
        self._oversize = False
        self._scratch = bytearray(1)
        # pyzmq 26 and later: a frame read into the scratch byte, no object made for it.
        self._into = getattr(sock, "recv_into", None)

    @property
    def in_progress(self) -> bool:
        """A message is part read: read on without waiting for the poller."""
        return bool(self._frames) or self._oversize

    def messages(self, budget: int) -> Iterator[list[Any]]:
        """The messages completed within `budget` frames read now (an empty list for one
        past max_frames); stops early where the socket has nothing more."""
        zmq = zmq_module()
        sock = self._sock
        while budget > 0:
            try:
                if self._oversize and self._into is not None:
                    self._into(self._scratch, flags=zmq.NOBLOCK)
                elif self._oversize:
                    sock.recv(zmq.NOBLOCK, copy=False)
                else:
                    self._frames.append(sock.recv(zmq.NOBLOCK, copy=self._copy))
            except zmq.Again:
                return
            budget -= 1
            if not sock.rcvmore:
                frames, self._frames, self._oversize = self._frames, [], False
                yield frames
            elif not self._oversize and len(self._frames) >= self._max:
                self._frames, self._oversize = [], True


def pump(
    sock: Any,
    waker: Waker,
    stop: threading.Event,
    on_frames: Callable[[list[Any]], None],
    after_round: Callable[[], None],
    what: str,
    wait_s: float,
    copy: bool = True,
    extra: tuple[Any, Callable[[], None]] | None = None,
    round_s: float = 0.0,
    max_frames: int | None = None,
) -> None:
    """The loop of a socket's owning thread until `stop`: waits (at most `wait_s`) for
    frames or a ring, hands each frame list to `on_frames` (at most 1024 a round, so sends
    and beats go on under a flood; zmq Frames where not `copy`), then calls
    `after_round`. `extra`: another (socket, handler) this thread serves. `round_s`: the
    shortest round, so that frames arriving a thousand a second are taken a few at a time,
    not each with a wake-up of its own. `max_frames`: read through a FrameReader, at
    most FRAMES_PER_ROUND frames a round, a message of more than `max_frames` frames
    handed over as an empty list (a socket that listens to peers who may not be
    trusted). A message whose handling raises is dropped alone:
    the round goes on, and `after_round` (the sends and beats) is called whatever came
    before it. Failures are logged the first time, then at most once a minute with their
    count; the loop goes on."""
    zmq = zmq_module()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(waker.rx, zmq.POLLIN)
    if extra is not None:
        poller.register(extra[0], zmq.POLLIN)
    failed = _Failures(what)
    reader = FrameReader(sock, max_frames, copy) if max_frames is not None else None
    began = 0.0
    while not stop.is_set():
        try:
            if round_s > 0:
                rest = began + round_s - time.monotonic()
                if rest > 0 and stop.wait(rest):
                    break
                began = time.monotonic()
            busy = reader is not None and reader.in_progress
            events = dict(poller.poll(0 if busy else int(wait_s * 1000)))
            if waker.rx in events:
                waker.clear()
            if extra is not None and extra[0] in events:
                extra[1]()
            if reader is not None and (busy or sock in events):
                for frames in reader.messages(FRAMES_PER_ROUND):
                    try:
                        on_frames(frames)
                    except Exception:  # noqa: BLE001 - that message alone is dropped
                        failed.note("a message")
            elif sock in events:
                for _ in range(1024):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
                    except zmq.Again:
                        break
                    try:
                        on_frames(frames)
                    except Exception:  # noqa: BLE001 - that message alone is dropped
                        failed.note("a message")
        except Exception:  # noqa: BLE001 - logged by note(); the loop goes on
            failed.note("a round")
        try:
            after_round()
        except Exception:  # noqa: BLE001 - logged by note(); the loop goes on
            failed.note("its sends")


class _Failures:
    """A socket thread's failures, logged the first time and then at most once a minute
    with how many came since the start: a peer that sends what raises cannot flood the
    log, nor hide behind the first."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._count = 0
        self._logged_at = -float("inf")

    def note(self, where: str) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._logged_at < 60.0:
            return
        self._logged_at = now
        log.exception(
            "freeride job queue: the %s's thread failed (%s; %d failures so far)",
            self._what,
            where,
            self._count,
        )


def end(
    stop: threading.Event,
    waker: Waker,
    thread: threading.Thread,
    socks: list[Any],
    ctx: Any | None,
) -> None:
    """Stops a socket's owning thread, joins it (5 s at most), then closes its sockets
    (the first lingering LINGER_MS so that what its last round sent still goes out) and
    the context if given (its I/O thread ends). A thread that would not end keeps them."""
    stop.set()
    waker.ring()
    if thread is not threading.current_thread():
        thread.join(5.0)
    if not thread.is_alive():
        socks[0].close(LINGER_MS)
        for sock in socks[1:]:
            sock.close(0)
        waker.close()
        if ctx is not None:
            ctx.term()
