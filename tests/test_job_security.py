"""The job queue under attack, on loopback: each finding of the security review of
2026-11-25 as an attack on today's channel (an attacker who reaches the port without the
secret, a rogue server, another local user), plus what held before (verify before
unpickling, shapes checked, threads survive).

Against the store-based design these attacks succeeded: one SET of a counter broke
every rank's connection (D1), one ADD stalled a box for decades (D2), a counter held still
made a live rank lost (D3), a lowered counter handed a client another's box (R1), the
fixed proof could be copied (S2), the secret file was read by path with no owner check
(S1) and outlived the job (S3), and a wildcard MASTER_ADDR listened everywhere (B1). The
channel has no shared state to write: the tests below show what each attack now gets.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import pickle
import shutil
import socket
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from job_harness import Attacker, one_rank_job

import freeride as fr
from conftest import wait_until
from freeride.job import auth, channel, files
from freeride.job import coordinator as coordinator_module
from freeride.job import messages as m
from freeride.job.channel import hub as hub_module
from freeride.job.channel import sockets as channel_sockets
from freeride.job.placement import Policy, TaskSpec

torch = pytest.importorskip("torch")
zmq = pytest.importorskip("zmq")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


class Boom:
    """A pickle that runs a command when loaded: what an attacker sends."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A one-rank job (this process) with a harvester and a queue that wrote its secret
    file."""
    folder = tmp_path_factory.mktemp("job")
    with one_rank_job(folder) as q:
        secret = bytes.fromhex(json.loads((folder / "queue.json").read_text())["secret"])
        yield q, folder, secret


def _port(q) -> int:
    return int(q.address.rpartition(":")[2])


def _spin(items: int = 20) -> TaskSpec:
    return TaskSpec(fr.tasks.Spin, kwargs={"items": items, "ns_per_item": 1000})


def _still_works(q) -> None:
    handle = q.submit(_spin())
    assert handle.wait(20), handle
    assert handle.state == "done" and handle.items_done == 20


def _queue_threads_alive() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("freeride-jobqueue")}


# -- B1: binding --------------------------------------------------------------------------


def _listening(port: int) -> list[str]:
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, lport = local.split(":")
                if int(lport, 16) == port and state == "0A":  # LISTEN
                    addresses.append(addr)
    return addresses


def test_the_channel_listens_only_on_the_address_given(job):
    q, _, _ = job
    assert _listening(_port(q)) == ["0100007F"]  # 127.0.0.1 only, not 0.0.0.0 or ::


def test_a_wildcard_master_addr_is_refused_and_an_explicit_one_warned(job, monkeypatch):
    """B1: MASTER_ADDR=0.0.0.0 (single-node launch scripts) would listen on every
    interface: refused with the remedy; host="0.0.0.0" given explicitly listens there with
    a warning."""
    q, _, _ = job
    monkeypatch.setenv("MASTER_ADDR", "0.0.0.0")
    with pytest.raises(ValueError, match="wildcard"):
        fr.JobQueue(q._h)
    with pytest.warns(UserWarning, match="every interface"):
        wide = fr.JobQueue(q._h, host="0.0.0.0")
    try:
        assert _listening(_port(wide)) == ["00000000"]
    finally:
        wide.close()


# -- D1, D2, D4: nothing unauthenticated is read, and nothing stalls -------------------------


@pytest.mark.parametrize(
    "spelling", ["0", "0.0", "000.000.000.000", "0x0", "::0", "0:0:0:0:0:0:0:0", "::ffff:0.0.0.0"]
)
def test_every_spelling_of_a_wildcard_is_a_wildcard(monkeypatch, spelling):
    """Review J5: the refusal compared strings, so MASTER_ADDR=0, 0x0, ::0 and the like
    listened on every interface without a word. The resolved address decides now: each
    is refused from MASTER_ADDR, and warned about as an explicit host."""
    from freeride.job import queue as job_queue

    if ":" in spelling and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    monkeypatch.setenv("MASTER_ADDR", spelling)
    with pytest.raises(ValueError, match="wildcard"):
        job_queue._listen_address(None)
    with pytest.warns(UserWarning, match="every interface"):
        _, ip = job_queue._listen_address(spelling)
    assert ipaddress.ip_address(ip).is_unspecified or ip == "::ffff:0.0.0.0"


def test_a_real_address_is_not_taken_for_a_wildcard(monkeypatch):
    from freeride.job import queue as job_queue

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert job_queue._listen_address(None) == ("127.0.0.1", "127.0.0.1")


def test_unauthenticated_frames_run_nothing_and_the_queue_keeps_serving(job, tmp_path):
    """D1/D2, review J4/J7: an attacker who knows the hub's public key but holds no
    credential sends pickles, forged frames, handshake frames and garbage: its key is no
    credential's, so the hub's ZAP handler refuses its connection and not one frame
    reaches the hub's thread (nothing dropped, nothing answered, the refusal counted).
    A client holding the secret file, sending the same by hand outside a session, is
    told to authenticate and nothing else; garbage on a raw TCP connection is dropped by
    the transport. Nothing is unpickled and the queue goes on placing."""
    q, _, credential = job
    marker = tmp_path / "pwned"
    boom = pickle.dumps(Boom(str(marker)))
    frames = [
        (b"msg", boom),
        (b"msg", pickle.dumps(("submit", "0:999", boom, 0, m.agent_box(0)))),
        (b"msg", (10**9).to_bytes(8, "little"), boom),
        (b"hello", b"short"),
        (b"auth", b"x" * 32),  # no challenge was asked for
        (b"ping",),
        (b"\xff" * 100,),
    ]
    before, denied = q.stats()["dropped"], q._hub.denied
    attacker = Attacker(q)
    try:
        for f in frames:
            attacker.send(*f)
        assert attacker.recv() is None
        wait_until(lambda: q._hub.denied > denied, timeout=10)
        assert q.stats()["dropped"] == before
        # Fails closed: without an answer from the handler, no connection.
        assert q._hub._router.getsockopt(zmq.ZAP_ENFORCE_DOMAIN) == 1
    finally:
        attacker.close()
    attacker = Attacker(q, credential=credential)
    try:
        for f in frames:
            attacker.send(*f)
        assert attacker.recv() == [b"who"]  # "authenticate first", and nothing else
        wait_until(lambda: q.stats()["dropped"] >= before + 7, timeout=10)
    finally:
        attacker.close()
    with socket.create_connection(("127.0.0.1", _port(q))) as raw:
        raw.sendall(os.urandom(4096) + boom)
    _still_works(q)
    assert not marker.exists()
    assert {"freeride-jobqueue", "freeride-jobqueue-coord", "freeride-jobqueue-hub"} <= (
        _queue_threads_alive()
    )


def test_handshakes_left_half_done_do_not_stall_the_queue(job):
    """D4: 300 connections that say hello and never answer the challenge (more than the
    hub keeps at once) cost the queue nothing: it places, and a real client still
    connects."""
    q, folder, credential = job
    attackers = [Attacker(q, credential=credential) for _ in range(300)]
    try:
        for a in attackers:
            a.send(b"hello", os.urandom(auth.NONCE_BYTES), auth.CLIENT_ROLE)
        time.sleep(0.5)
        _still_works(q)
        with fr.JobQueue.connect(secret_file=folder / "queue.json", timeout=10) as client:
            assert client.submit(_spin()).wait(20)
    finally:
        for a in attackers:
            a.close()


def test_a_wrong_proof_is_refused_and_its_sender_stays_unauthenticated(job, tmp_path):
    q, _, credential = job
    marker = tmp_path / "pwned"
    before = q.stats()
    attacker = Attacker(q, credential=credential)
    try:
        attacker.send(b"hello", os.urandom(auth.NONCE_BYTES), auth.CLIENT_ROLE)
        challenge = attacker.recv()
        assert challenge is not None and challenge[0] == b"challenge"
        attacker.send(b"auth", os.urandom(auth.TAG_BYTES))
        assert attacker.recv() == [b"refused"]
        attacker.send(b"msg", pickle.dumps(Boom(str(marker))))
        assert attacker.recv() == [b"who"]
    finally:
        attacker.close()
    assert q.stats()["refused"] == before["refused"] + 1
    _still_works(q)
    assert not marker.exists()


# -- J1: roles are credentials -------------------------------------------------------------


class Handshaker(Attacker):
    """A peer that runs the handshake itself, with a credential and a role of its choice
    (what a client holding the secret file could do without freeride's Link)."""

    def handshake(self, credential: bytes, role: bytes) -> list[bytes] | None:
        nonce = os.urandom(auth.NONCE_BYTES)
        self.send(b"hello", nonce, role)
        challenge = self.recv()
        if challenge is None or challenge[0] != b"challenge":
            return challenge
        server_nonce = challenge[1]
        self.send(b"auth", auth.client_proof(credential, nonce, server_nonce, role))
        return self.recv()


def test_the_secret_file_holds_a_client_credential_not_the_jobs_secret(job):
    """Review J1: ranks and clients shared one secret, so whoever held the secret file
    could prove any role. The file now holds the client credential, an HMAC of the job's
    secret (which only the ranks hold) from which the secret cannot be computed."""
    q, _, credential = job
    assert credential == auth.client_credential(q._link._secret)
    assert credential != q._link._secret


@pytest.mark.parametrize("role", [b"rank:0", b"rank:1", b"rank:00", b"rank:-0", b"leader", b""])
def test_a_client_credential_never_gets_a_ranks_role(job, role):
    """Review J1: a client holding the secret file logged in as rank:N, was handed rank
    N's box (dropping the rank's own session), received other clients' task specs, sent
    forged results other clients unpickled, and could end the queue with one message.
    Now a rank's role needs the job's secret: under the client credential the handshake
    is refused (for a role of no rank, or no role at all, before any challenge), and the
    rank keeps its box: the queue goes on placing on it."""
    q, _, credential = job
    before = q.stats()["refused"]
    attacker = Handshaker(q, credential=credential)
    try:
        assert attacker.handshake(credential, role) == [b"refused"]
        attacker.send(b"msg", pickle.dumps(("closing", 0)))
        assert attacker.recv() == [b"who"]
    finally:
        attacker.close()
    assert q.stats()["refused"] == before + 1
    _still_works(q)


def test_a_live_ranks_box_is_never_handed_to_a_second_session(job):
    """Review J1: a new session for a rank's box popped the rank's own. Even with the
    job's secret (a second process of the job), a rank's box held by a session heard from
    within the last seconds is refused ("taken"), and the rank's session goes on."""
    q, _, _ = job
    attacker = Handshaker(q, credential=q._link._secret, kind=auth.RANK_KIND)
    try:
        assert attacker.handshake(q._link._secret, auth.rank_role(0)) == [b"taken"]
    finally:
        attacker.close()
    with pytest.raises(fr.QueueAuthError, match="already, and heard from"):
        channel.Link(
            "127.0.0.1",
            _port(q),
            q._link._secret,
            q.server_key.encode(),
            auth.rank_role(0),
            5.0,
            q.address,
        )
    _still_works(q)


def test_a_client_cannot_end_the_queue_or_speak_for_a_rank(job):
    """What a rank alone may say ("closing", "state", "stats", "handback", "gone"), a
    client session sends in vain: each is counted as malformed, and the queue keeps
    serving every client."""
    q, folder, _ = job
    before = q.stats()["malformed"]
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        link = client._link
        link.send(("closing", 0))
        link.send(("gone", 0))
        link.send(("stats", 0, 10**12, 10**12, None, 1))
        link.send(("handback", 0, []))
        link.send(("state", "0:1", 0, "done", 1, 1, None, "done", pickle.dumps(1)))
        wait_until(lambda: q.stats()["malformed"] >= before + 5, timeout=10)
        assert client.submit(_spin()).wait(20)
    _still_works(q)


# -- J2, J3: handshakes in crowds, sessions that end ----------------------------------------


@pytest.fixture
def bare_hub():
    """A hub of its own (no coordinator) on loopback for a 4-rank job, and its secret."""
    secret = auth.new_secret()
    hub = channel.Hub("127.0.0.1", secret, [0, 1, 2, 3])
    yield hub, secret
    hub.close()


def _link(hub, secret: bytes, role: bytes = auth.CLIENT_ROLE, timeout: float = 20.0):
    credential = auth.client_credential(secret) if role == auth.CLIENT_ROLE else secret
    return channel.Link(
        "127.0.0.1", hub.port, credential, hub.public_key, role, timeout, "test hub"
    )


def test_handshakes_pushed_out_by_a_crowd_are_retried_not_lost(bare_hub, monkeypatch):
    """Review J2: beyond the hub's pending handshakes, the oldest was pushed out, its
    proof dropped with no answer, and its Link (which never said hello again) failed after
    its whole timeout, blaming the server key: 98-344 of 600 Links at once. Here the table
    holds 4 handshakes (plus one per rank) and 60 Links authenticate at once from threads:
    a pushed-out proof is answered "who" and a Link not welcomed says hello again after a
    backoff with jitter, so every one is welcomed, in a fraction of its timeout."""
    hub, secret = bare_hub
    monkeypatch.setattr(hub, "_max_pending", 8)
    links, errors = [], []
    start = threading.Barrier(60)

    def connect() -> None:
        start.wait()
        try:
            links.append(_link(hub, secret, timeout=30.0))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=connect) for _ in range(60)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - began
    try:
        assert errors == [], errors[:3]
        assert len(links) == 60 and hub.sessions() == 60
        assert len({link.box for link in links}) == 60
        assert took < 25.0, took
    finally:
        for link in links:
            link.close()


def test_a_handshake_that_is_never_welcomed_names_the_real_cause(bare_hub, monkeypatch):
    """A hub that answers hellos but never welcomes (here: every proof is pushed out at
    once) makes the Link give up at its timeout with an error saying the queue answered
    and did not finish, not that no queue with this key exists."""
    hub, secret = bare_hub
    monkeypatch.setattr(hub, "_authenticate", lambda *args: None)
    with pytest.raises(ConnectionError, match="answered but did not finish the handshake"):
        _link(hub, secret, timeout=2.0)


def test_client_sessions_end_at_bye_and_after_silence(job, monkeypatch):
    """Review J3: sessions were never removed, and the hub beat to every session ever
    opened every 100 ms (20,000 stale sessions cost half a core of the training rank's
    process; every `freeride status` added one). A client's session now ends at its bye
    (the coordinator drops it) and after a silence (its Link pings every second)."""
    q, folder, _ = job
    before = q.stats()["sessions"]
    for _ in range(3):
        with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
            client.status()
            assert q.stats()["sessions"] == before + 1
        wait_until(lambda: q.stats()["sessions"] == before, timeout=10)
    monkeypatch.setattr(hub_module, "_CLIENT_IDLE_S", 2.5)  # (a Link pings every second)
    client = fr.JobQueue.connect(secret_file=folder / "queue.json")
    try:
        box = client._link.box
        client._link.hold(True)  # silent: no pings
        wait_until(lambda: q.stats()["sessions"] == before, timeout=10)
        client._link.hold(False)
        # Its next ping is answered "who": it authenticates again and keeps its box (the
        # hub remembers the boxes of ended sessions by routing id, which only it can show).
        handle = client.submit(_spin())
        assert handle.wait(20) and handle.state == "done"
        assert client._link.box == box
    finally:
        client.close()


def test_a_spec_too_large_for_the_channel_is_refused_at_submit(job, monkeypatch):
    """Review J8: a spec that pickled to more than the channel carries vanished (zmq
    dropped the message) while submit() returned normally, and its handle stayed queued.
    Now submit() raises, on a rank and on a client, naming what to do; nothing is sent, and
    the next submit works. (The limit is lowered here instead of pickling 256 MiB.)"""
    q, folder, _ = job
    monkeypatch.setattr(m, "MAX_PAYLOAD", 4096)
    big = TaskSpec(fr.tasks.Spin, kwargs={"items": 1, "ns_per_item": 1, "pad": b"x" * 8192})
    with pytest.raises(ValueError, match=r"more than the job queue carries.*fr\.Load"):
        q.submit(big)
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        with pytest.raises(ValueError, match="more than the job queue carries"):
            client.submit(big)
        assert client.submit(_spin()).wait(20)
    _still_works(q)


def test_the_leader_can_hold_many_idle_connections(job):
    """Review J6: at a soft limit of 1024 descriptors, 1,100 idle connections to the
    queue's port left training unable to open a file (EMFILE). The hub raises the leader
    process's soft limit to its hard limit, and closes a transport handshake not done in
    5 s (libzmq's default was 30 s)."""
    import resource

    q, _, _ = job
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = channel_sockets.MAX_DESCRIPTORS
    if hard != resource.RLIM_INFINITY:
        want = min(hard, want)
    assert soft == resource.RLIM_INFINITY or soft >= want
    assert q._hub._router.handshake_ivl == channel_sockets.TRANSPORT_HANDSHAKE_MS <= 5000


# -- J4, J7, J9, J11: what the transport allows ----------------------------------------------


def _zmtp_greeting(mechanism: bytes = b"CURVE") -> bytes:
    """ZMTP 3.0's greeting: signature, version, mechanism, as-server, filler."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + bytes(32)


def test_a_huge_frame_before_authentication_closes_the_connection(job):
    """Review J4: every socket accepted frames of up to 256 MiB before any
    authentication, the transport handshake's command frames included, so a raw TCP peer
    with no key held about 250 MiB of the leader's memory per connection for 30 s. Frames
    are now at most 64 KiB everywhere: a command frame announcing 255 MiB closes the
    connection before the hub buffers it."""
    q, _, _ = job
    with socket.create_connection(("127.0.0.1", _port(q))) as raw:
        raw.settimeout(10)
        raw.sendall(_zmtp_greeting())
        size = 255 << 20
        header = b"\x06" + size.to_bytes(8, "big")  # a long command frame
        closed = False
        try:
            raw.sendall(header)
            chunk = os.urandom(1 << 16)
            deadline = time.monotonic() + 10
            sent = 0
            while time.monotonic() < deadline and sent < (64 << 20):
                raw.sendall(chunk)
                sent += len(chunk)
            raw.recv(1 << 16)  # the hub's greeting, then its close
            closed = raw.recv(1 << 16) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        assert closed, f"the hub still reads after {sent >> 20} MiB of one frame"
        assert sent < (64 << 20)
    _still_works(q)


def test_messages_larger_than_a_frame_travel_in_parts(job, tmp_path):
    """Frames are at most 64 KiB, so a spec and a result of more travel as several frames
    of one message: a Saxpy on 200,000 floats (1.6 MB of spec, 800 kB of result) runs from
    a rank and from a client and comes back whole."""
    q, folder, _ = job
    x = torch.arange(200_000, dtype=torch.float32)
    y = torch.ones(200_000, dtype=torch.float32)
    spec = TaskSpec(fr.tasks.Saxpy, args=(2.0, x, y))
    assert len(spec.dumps()) > 10 * (64 << 10)
    handle = q.submit(spec)
    assert handle.wait(30) and handle.state == "done", handle
    assert torch.equal(handle.result(), 2.0 * x + y)
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        handle = client.submit(spec)
        assert handle.wait(30) and handle.state == "done", handle
        assert torch.equal(handle.result(), 2.0 * x + y)


def test_hellos_are_answered_at_most_four_times_a_second_per_connection(job):
    """Review J7: each hello cost an HMAC and a challenge queued for a peer that may never
    read it (2.9 GB of the leader's memory for a flood). Now no connection without a
    credential gets a hello through at all (test above); one with the client's key is
    answered at most once per 250 ms, and at most 1,000 challenges queue for it."""
    q, _, credential = job
    attacker = Attacker(q, credential=credential)
    try:
        before = q.stats()["dropped"]
        for _ in range(200):
            attacker.send(b"hello", os.urandom(auth.NONCE_BYTES), auth.CLIENT_ROLE)
        challenges = 0
        while (frames := attacker.recv(0.5)) is not None:
            challenges += frames[0] == b"challenge"
        assert 1 <= challenges <= 3, challenges
        assert q.stats()["dropped"] >= before + 190
        assert q._hub._router.sndhwm <= 1000
    finally:
        attacker.close()
    _still_works(q)


def test_a_reconnecting_link_takes_its_session_over_at_once(job):
    """Review J9: a Link whose old connection the hub still held (half-open behind a NAT)
    reconnected with the same routing id, and the ROUTER ignored the new connection: the
    rank was never heard again. The hub now lets a reconnection take its routing id over
    (ROUTER_HANDOVER): frames on the new connection reach the session at once, and the
    hub's answers go there. TCP_USER_TIMEOUT closes a Link's connection whose data goes
    unacknowledged (so it reconnects), and TCP keepalive finds an idle dead one."""
    q, folder, credential = job
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        rid = client._link._dealer.routing_id
        assert client._link._dealer.tcp_maxrt > 0 and q._hub._router.tcp_keepalive == 1
        # The same Link's key and routing id on a new connection: its "reconnect".
        again = Attacker(q, routing_id=rid, credential=credential)
        try:
            began = time.monotonic()
            again.send(b"msg", pickle.dumps(("status", client._box, 99, None)))
            reply = again.recv(5.0)
            assert reply is not None and reply[0] == b"msg", reply
            assert pickle.loads(b"".join(reply[1:]))[:2] == ("status", 99)
            assert time.monotonic() - began < 1.0
        finally:
            again.close()


def test_the_harvester_argument_must_be_a_harvester(job):
    q, _, _ = job
    with pytest.raises(TypeError, match="harvester must be this rank's fr.Harvester, got NoneType"):
        fr.JobQueue(None)
    with pytest.raises(TypeError, match="host must be None or a str address, got int"):
        fr.JobQueue(q._h, host=5)
    with pytest.raises(ValueError, match="timeout must be at most 1e"):
        fr.JobQueue(q._h, host="127.0.0.1", timeout=1e300)
    with pytest.raises(TypeError, match="group must be None .the world. or a torch.distributed"):
        fr.JobQueue(q._h, group="x")


def test_the_status_file_must_not_be_the_secret_file(job, tmp_path):
    """Both at one path, the status file was written over the secret file: the client
    credential lost, and the read-only one where clients look for theirs."""
    q, _, _ = job
    path = tmp_path / "queue.json"
    with pytest.raises(ValueError, match="status_file must not be secret_file"):
        fr.JobQueue(q._h, host="127.0.0.1", secret_file=path, status_file=str(path))
    assert not path.exists()


def test_a_status_file_reads_the_table_and_nothing_more(job, tmp_path):
    """Review J11: one credential gave full rights, so a user who only watches the queue
    could submit code. JobQueue(status_file=...) writes a read-only credential: its
    client reads the task table; submit() refuses, and its connection's key may take no
    other role. What a status session sends is JSON, never unpickled on the leader: a
    pickle, or a submit, from one is dropped and counted."""
    q0, _, _ = job
    status = tmp_path / "status.json"
    q = fr.JobQueue(q0._h, host="127.0.0.1", status_file=status, rank_timeout=3.0)
    marker = tmp_path / "pwned"
    try:
        data = json.loads(status.read_text())
        assert data["role"] == "status" and stat.S_IMODE(os.stat(status).st_mode) == 0o600
        credential = bytes.fromhex(data["secret"])
        assert credential == auth.status_credential(auth.client_credential(q._link._secret))
        handle = q.submit(_spin())
        assert handle.wait(20)
        with fr.JobQueue.connect(secret_file=status) as watcher:
            assert watcher.read_only
            assert handle.id in {row["id"] for row in watcher.status()}
            with pytest.raises(PermissionError, match="only read the task table"):
                watcher.submit(_spin())
            before = q.stats()["malformed"]
            watcher._link._json = False  # a status session that pickles anyway
            watcher._link.send(Boom(str(marker)))
            watcher._link.send(("submit", "c1:1", _spin().dumps(), 0, watcher._box))
            wait_until(lambda: q.stats()["malformed"] >= before + 2, timeout=10)
        for role in (auth.CLIENT_ROLE, auth.rank_role(0)):
            attacker = Handshaker(q, credential=credential, kind=auth.STATUS_KIND)
            try:
                assert attacker.handshake(credential, role) == [b"refused"]
            finally:
                attacker.close()
        _still_works(q)
        assert not marker.exists()
    finally:
        q.close()
    assert not status.exists()


def test_liveness_costs_the_leader_what_five_hundred_ranks_would():
    """Review J3 and the 4,096-rank target: every rank sent its stats and the hub beat to
    every session every 100 ms, 81,920 messages a second for 4,096 ranks. Both now
    happen every liveness.every(ranks, rank_timeout) s: 100 ms in small jobs, and about
    500 a second each way in a large one, never fewer than five per rank_timeout."""
    from freeride.job import liveness

    assert liveness.every(2, liveness.rank_timeout(2)) == pytest.approx(0.1)
    assert liveness.every(2, 0.3) == pytest.approx(0.06)
    for ranks in (500, 1024, 2048, 4096, 16384):
        timeout = liveness.rank_timeout(ranks)
        every = liveness.every(ranks, timeout)
        assert ranks / every <= 1.05 * liveness.MESSAGES_PER_S
        assert timeout >= 5 * every and timeout >= 5.0
    assert liveness.rank_timeout(4096) == pytest.approx(40.96)
    assert liveness.beat_every(4096, 40.96) == 2 * liveness.every(4096, 40.96)
    assert liveness.beat_every(4096, 40.96) * 1.25 <= 40.96 / 2


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_under_every_flood_at_once_a_client_still_connects_within_a_second(job, tmp_path):
    """Review J4, J6, J7 together, as the attacker of `bench soak --attack` does them from
    a process of its own: 50 idle connections held, frames of 255 MiB announced before the
    handshake, keyless peers and a client-credential holder saying hello in floods. Before:
    each huge frame held about 250 MiB of the leader's memory, and 600 hello-flooding
    connections kept every client out and cost 2.2 GB. Now a real client connects within
    a second, every time, and the leader's memory grows by less than 64 MiB."""
    import multiprocessing

    from freeride.cli.bench import _attacker

    q, folder, credential = job
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    out = tmp_path / "attacker.json"
    proc = ctx.Process(
        target=_attacker.run,
        args=(str(folder / "queue.json"), str(out), stop),
        daemon=True,
    )
    assert _attacker.client_keys(credential) == auth.curve_keys(credential, auth.CLIENT_KIND)
    denied = q._hub.denied
    rss_before = _rss_mib()
    fds_before = len(os.listdir("/proc/self/fd"))
    proc.start()
    try:
        time.sleep(2.0)  # the floods under way
        took = []
        for _ in range(3):
            began = time.monotonic()
            with fr.JobQueue.connect(secret_file=folder / "queue.json", timeout=10) as client:
                took.append(time.monotonic() - began)
                assert client.status() is not None
        rss_during = _rss_mib()
        fds_during = len(os.listdir("/proc/self/fd"))
        _still_works(q)
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    counts = json.loads(out.read_text())
    assert counts["keyless_hellos"] > 0 and counts["idle_held"] >= 50, counts
    assert counts["huge_frames"] > 0 and counts["huge_bytes_in"] < (8 << 20), counts
    assert max(took) < 1.0, took
    assert q._hub.denied > denied  # every keyless peer refused by the transport
    assert rss_during - rss_before < 64, (rss_before, rss_during)
    assert fds_during - fds_before < 200, (fds_before, fds_during)


def test_only_a_ranks_session_may_send_stats(job):
    """A rank's stats travel as a frame of their own that the hub keeps for the
    coordinator (not a pickled message): a client's session sending one is dropped and
    counted, and never reaches the placement's view of any rank."""
    q, _, credential = job
    attacker = Handshaker(q, credential=credential)
    try:
        welcome = attacker.handshake(credential, auth.CLIENT_ROLE)
        assert welcome is not None and welcome[0] == b"welcome", welcome
        before = q.stats()["dropped"]
        attacker.send(b"stats", m.pack_stats(10**15, 10**15, 1 << 40, 7))
        wait_until(lambda: q.stats()["dropped"] > before, timeout=10)
        assert not any(box.startswith("fr-client/") for box in q._hub._stats)
        assert q._coordinator._ranks[0].iterations != 7
    finally:
        attacker.close()
    assert m.unpack_stats(m.pack_stats(1, 2, None, 3)) == (1, 2, None, 3)
    assert m.unpack_stats(b"short") is None


def test_the_hub_beats_only_sessions_it_sent_nothing_else(bare_hub, monkeypatch):
    """A session the hub sends messages to gets no beats besides (they would only add to
    what the leader sends); an idle one gets one every beat."""
    hub, secret = bare_hub
    busy, idle = _link(hub, secret), _link(hub, secret)
    rids = {busy._dealer.routing_id: "busy", idle._dealer.routing_id: "idle"}
    beats = {"busy": 0, "idle": 0}
    send = hub._send

    def counting(rid, *frames):
        if frames == (b"beat",) and rid in rids:
            beats[rids[rid]] += 1
        send(rid, *frames)

    monkeypatch.setattr(hub, "_send", counting)
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            hub.send(busy.box, ("status", 1, []))
            time.sleep(0.02)
        assert beats["idle"] >= 5, beats
        assert beats["busy"] <= 1, beats
    finally:
        busy.close()
        idle.close()


# -- S2, C1: a rogue server, and an eavesdropper -----------------------------------------------


def _rogue_router():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    public, private = zmq.curve_keypair()
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = public, private
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return ctx, sock, port, public


def test_a_server_without_the_queues_key_gets_nothing(job):
    """S2, C1: a rogue server on an address the client was pointed at (the job ended and
    its port was taken, or a planted file named it) cannot finish Curve's handshake
    without the queue's private key: the client gives up with ConnectionError and the
    rogue receives nothing at all."""
    q, _, secret = job
    ctx, sock, port, _ = _rogue_router()
    try:
        with pytest.raises(ConnectionError, match="no job queue answers"):
            fr.JobQueue.connect(f"127.0.0.1:{port}", secret, server_key=q.server_key, timeout=1.0)
        assert not sock.poll(200), "the rogue server received a message"
    finally:
        sock.close(0)
        ctx.term()


def test_a_replayed_server_proof_is_refused_and_the_client_sends_nothing_more(job):
    """S2: a rogue server that holds a key the client trusts (planted with a file) but not
    the secret can only replay a proof it saw: bound to another connection's nonce, it
    does not verify, and the client sends nothing after its hello."""
    _, _, secret = job
    ctx, sock, port, public = _rogue_router()
    received = []

    def rogue() -> None:
        old_nonce, server_nonce = os.urandom(32), os.urandom(32)
        recorded = auth.server_proof(secret, old_nonce, server_nonce, public)
        while sock.poll(3000):
            frames = sock.recv_multipart()
            received.append(frames[1:])
            if frames[1] == b"hello":
                sock.send_multipart([frames[0], b"challenge", server_nonce, recorded])

    thread = threading.Thread(target=rogue)
    thread.start()
    try:
        with pytest.raises(fr.QueueAuthError, match="does not verify"):
            fr.JobQueue.connect(f"127.0.0.1:{port}", secret, server_key=public, timeout=5.0)
    finally:
        thread.join()
        sock.close(0)
        ctx.term()
    assert [frames[0] for frames in received] == [b"hello"], received


def test_specs_and_results_are_not_readable_on_the_wire(job, tmp_path):
    """C1: a man in the middle (a TCP relay the client connects through) records every
    byte both ways; neither the task's label nor its result appears in them."""
    q, _, secret = job
    listener = socket.create_server(("127.0.0.1", 0))
    seen = bytearray()

    def pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                seen.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def relay() -> None:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", _port(q)))
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    label = "payroll-2026-q4-" + os.urandom(4).hex()
    spec = TaskSpec(
        fr.tasks.Saxpy,
        args=(2.0, torch.full((64,), 3.0), torch.full((64,), 1000.25)),
        name=label,
    )
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with fr.JobQueue.connect(address, secret, server_key=q.server_key) as client:
        result = client.submit(spec).result(timeout=20)
    listener.close()
    assert float(result[0]) == 1006.25
    assert len(seen) > 1000, "the relay saw no traffic: it proves nothing"
    assert label.encode() not in seen and b"payroll" not in seen
    assert torch.full((4,), 1006.25).numpy().tobytes() not in seen


# -- R1: client identities ---------------------------------------------------------------------


def test_clients_get_unguessable_boxes_and_cannot_act_for_each_other(job):
    """R1: each client's box is random, its task ids are its own, and a client (even one
    holding the secret) cannot submit under another's ids, have replies sent to another's
    box, or cancel another's task: each such message is refused, and the victim's task
    runs on."""
    q, folder, _ = job
    with (
        fr.JobQueue.connect(secret_file=folder / "queue.json") as a,
        fr.JobQueue.connect(secret_file=folder / "queue.json") as b,
    ):
        assert a._box != b._box and len(a._box.rsplit("/", 1)[1]) == 16
        victim = a.submit(_spin(10**9))
        wait_until(lambda: victim.state == "running", timeout=20)
        before = q.stats()["malformed"]
        spec = _spin().dumps()
        b._link.send(("submit", a._prefix + "77", spec, 0, b._box))  # a's id
        b._link.send(("submit", b._prefix + "78", spec, 0, a._box))  # replies to a's box
        b._link.send(("status", a._box, 1, None))
        b._link.send(("bye", a._box))
        b._link.send(("cancel", victim.id))
        wait_until(lambda: q.stats()["malformed"] >= before + 5, timeout=10)
        assert victim.state == "running"
        ids = {row["id"] for row in b.status()}
        assert a._prefix + "77" not in ids and b._prefix + "78" not in ids
        assert victim.cancel(timeout=20)


# -- D3: liveness is what the leader hears ----------------------------------------------------


def test_a_flood_of_connections_does_not_make_a_live_rank_lost(job):
    """D3: nothing anyone else sends moves the leader's view of a rank (there is no
    counter to hold still): under a flood of unauthenticated frames for longer than
    rank_timeout (3 s), no rank is declared lost."""
    q, _, _ = job
    attacker = Attacker(q)
    try:
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            for _ in range(100):
                attacker.send(b"msg", b"stats")
            time.sleep(0.01)
    finally:
        attacker.close()
    assert q.stats()["lost_ranks"] == []
    _still_works(q)


# -- authenticated but malformed ---------------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=3),
)
_kinds = st.sampled_from(
    ["submit", "cancel", "stats", "state", "handback", "run", "update", "lost", "status", "x"]
)
_messages = st.one_of(
    _values,
    st.tuples(_kinds),
    st.builds(lambda k, rest: (k, *rest), _kinds, st.lists(_values, max_size=9)),
)


@hypothesis.given(message=_messages)
@hypothesis.settings(max_examples=300, deadline=None)
def test_shape_checks_reject_or_accept_without_raising_anything_else(message):
    for check in (m.to_coordinator, m.to_agent):
        try:
            check(message)
        except m.Malformed:
            pass


@hypothesis.given(messages=st.lists(_messages, min_size=1, max_size=20))
@hypothesis.settings(max_examples=10, deadline=None)
def test_authenticated_but_malformed_messages_never_kill_a_thread(job, messages):
    q, folder, _ = job
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        for message in messages:
            client._link.send(message)
        _still_works(q)
    assert {"freeride-jobqueue", "freeride-jobqueue-coord", "freeride-jobqueue-hub"} <= (
        _queue_threads_alive()
    )


def test_a_spec_that_fails_to_build_fails_its_task_only(job):
    q, _, _ = job
    bad = q.submit(TaskSpec("freeride.tasks:Spin", kwargs={"items": -1}))
    with pytest.raises(fr.TaskFailedError, match="rank 0"):
        bad.result(timeout=20)
    _still_works(q)


# -- outside clients as users see them ---------------------------------------------------------


def test_secret_file_is_owner_only_and_names_the_queue(job):
    q, folder, _secret = job
    path = folder / "queue.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["address"] == q.address and data["server_key"] == q.server_key
    assert len(bytes.fromhex(data["secret"])) == auth.SECRET_BYTES


def test_outside_client_with_the_secret_submits_and_watches(job):
    _, folder, _ = job
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        handle = client.submit(_spin(50), priority=3)
        assert handle.wait(20)
        assert handle.result() is None and handle.items_done == 50 and handle.rank == 0
        assert handle.id.startswith("c")
        rows = {row["id"]: row for row in client.status()}
        assert rows[handle.id]["state"] == "done" and rows[handle.id]["priority"] == 3
        cancelled = client.submit(_spin(10**9))
        wait_until(lambda: cancelled.items_done > 0 or cancelled.state == "running")
        assert cancelled.cancel(timeout=20)
        with pytest.raises(fr.TaskCancelledError):
            cancelled.result()
    assert not any(t.name == "freeride-jobclient" for t in threading.enumerate())


def test_a_wrong_secret_is_refused_and_says_so(job):
    """D5: a wrong secret, no queue at all and a wrong server key each say what they
    are."""
    q, _, _ = job
    before = q.stats()["refused"]
    with pytest.raises(fr.QueueAuthError, match="the secret does not match.*nothing was sent"):
        fr.JobQueue.connect(q.address, b"\x01" * 32, server_key=q.server_key)
    assert isinstance(fr.QueueAuthError("x"), PermissionError)
    assert q.stats()["refused"] == before  # it checked the hub's proof and stopped
    _, public = zmq.curve_keypair()
    with pytest.raises(ConnectionError, match="none with this queue's server key"):
        fr.JobQueue.connect(q.address, b"\x01" * 32, server_key=public, timeout=1.0)


@pytest.mark.parametrize(
    ("address", "secret", "key", "match"),
    [
        ("nohostport", b"\0" * 32, "k" * 40, "host:port"),
        ("127.0.0.1:0", b"\0" * 32, "k" * 40, "port"),
        ("127.0.0.1:1", b"short", "k" * 40, "32 bytes"),
        ("127.0.0.1:1", "zz", "k" * 40, "hex digits"),
        ("127.0.0.1:1", b"\0" * 32, "short", "40 Z85"),
    ],
)
def test_connect_checks_its_arguments(address, secret, key, match):
    with pytest.raises(ValueError, match=match):
        fr.JobQueue.connect(address, secret, server_key=key)


def test_connect_to_nothing_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, public = zmq.curve_keypair()
    with pytest.raises(ConnectionError, match="no job queue answers"):
        fr.JobQueue.connect(f"127.0.0.1:{port}", b"\0" * 32, server_key=public, timeout=1.0)


# -- S1, S3, S4: the secret file ----------------------------------------------------------------


def _queue_file(path, mode: int = 0o600) -> str:
    path.write_text(
        json.dumps({"address": "127.0.0.1:1", "secret": "ab" * 32, "server_key": "k" * 40})
    )
    os.chmod(path, mode)
    return str(path)


def test_a_symlinked_secret_file_is_refused(tmp_path):
    """S1: the name is opened without following a link (the planted-link variant)."""
    target = _queue_file(tmp_path / "real.json")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(PermissionError, match="symbolic link"):
        files.read_secret_file(link)
    assert files.read_secret_file(target)[0] == "127.0.0.1:1"


def test_a_secret_file_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(PermissionError, match="not a regular file"):
        files.read_secret_file(fifo)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_a_secret_file_others_may_read_or_write_is_refused(tmp_path, mode):
    with pytest.raises(PermissionError, match="chmod 600"):
        files.read_secret_file(_queue_file(tmp_path / "q.json", mode))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file another owner")
def test_a_secret_file_of_another_user_is_refused(tmp_path):
    """S1a: a 0600 file someone else owns (planted in a shared directory) is refused, as
    root too: whoever wrote it chooses the queue the client talks to."""
    path = _queue_file(tmp_path / "planted.json")
    os.chown(path, 12345, 12345)
    with pytest.raises(PermissionError, match="belongs to uid 12345"):
        files.read_secret_file(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")
def test_a_squatted_secret_file_path_gives_a_clear_error(tmp_path):
    """S4: in a sticky directory (/tmp-like), another user's file at the path cannot be
    replaced: the writer gets a PermissionError naming the file, its owner and the remedy
    (run as uid 65534, since root may replace anything)."""
    base = tempfile.mkdtemp(prefix="freeride-s4-", dir="/tmp")  # reachable by uid 65534
    os.chmod(base, 0o755)
    shared = Path(base) / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    squat = _queue_file(shared / "queue.json")
    os.chown(squat, 12345, 12345)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: only os and the already imported files module
        message = "no error"
        try:
            os.setuid(65534)
            files.write_secret_file(squat, "h:1", b"x" * 32, b"k" * 40)
        except PermissionError as exc:
            message = f"PermissionError: {exc}"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            message = f"{type(exc).__name__}: {exc}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        said = f.read()
    assert said.startswith("PermissionError:"), said
    assert "a file of uid 12345 is there" in said and "mkdir -m 700" in said
    assert sorted(os.listdir(shared)) == ["queue.json"]  # no temporary file left behind
    shutil.rmtree(base)


def test_the_secret_file_is_removed_at_close_and_at_abort(job, tmp_path):
    """S3: once the queue is closed (or aborted), its address and secret are not left
    on disk; a file someone else put at the path since is left alone."""
    q0, _, _ = job
    for how in ("close", "abort", "replaced"):
        path = tmp_path / f"{how}.json"
        q = fr.JobQueue(q0._h, host="127.0.0.1", secret_file=path)
        assert path.exists()
        if how == "replaced":
            os.unlink(path)
            _queue_file(path)
        getattr(q, "abort" if how == "abort" else "close")()
        assert path.exists() == (how == "replaced"), how


def test_the_hub_counts_sessions_by_routing_id_not_by_what_peers_claim(job):
    """A peer presenting an authenticated Link's routing id on a new connection is turned
    away while that Link is connected (ZeroMQ's ROUTER refuses a duplicate id), and its
    frames never reach the coordinator."""
    q, folder, _ = job
    with fr.JobQueue.connect(secret_file=folder / "queue.json") as client:
        rid = client._link._dealer.routing_id
        before = q.stats()["malformed"]
        attacker = Attacker(q, routing_id=rid)
        try:
            attacker.send(b"msg", pickle.dumps(("bye", client._box)))
            assert attacker.recv(1.0) is None
        finally:
            attacker.close()
        assert q.stats()["malformed"] == before
        assert client.submit(_spin()).wait(20)


def test_no_warning_or_error_leaks_the_secret(job, caplog):
    q, _folder, secret = job
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(fr.QueueAuthError) as info:
            fr.JobQueue.connect(q.address, secret[::-1], server_key=q.server_key)
    text = str(info.value) + caplog.text + " ".join(str(w.message) for w in caught)
    assert secret.hex() not in text and secret.hex()[:16] not in text
    assert channel.BEAT_S > 0  # (the module the queue talks through)


# -- round 4: a status credential reads the table, and nothing else ------------------------


@pytest.fixture
def status_queue(job, tmp_path):
    """A second queue on the job's harvester that wrote a status file, and the status
    credential in it."""
    q0, _, _ = job
    status = tmp_path / "status.json"
    q = fr.JobQueue(q0._h, host="127.0.0.1", status_file=status, rank_timeout=3.0)
    try:
        yield q, bytes.fromhex(json.loads(status.read_text())["secret"])
    finally:
        q.close()


def _status_session(q, credential: bytes) -> Handshaker:
    peer = Handshaker(q, credential=credential, kind=auth.STATUS_KIND)
    answer = peer.handshake(credential, auth.STATUS_ROLE)
    assert answer is not None and answer[0] == b"welcome", answer
    return peer


def test_a_status_sessions_held_message_is_never_unpickled(status_queue, tmp_path, monkeypatch):
    """Round 4, S1: a pickle a status session sent after its session had ended was held,
    then handed to the coordinator as it was when the session came back, past the check
    that nothing a status session sends is unpickled: code ran on the leader. Held
    messages now go the live ones' way: a status session's is JSON or nothing."""
    q, credential = status_queue
    marker = tmp_path / "pwned"
    monkeypatch.setattr(hub_module, "_CLIENT_IDLE_S", 1.0)
    before = q.stats()
    peer = _status_session(q, credential)
    try:
        wait_until(lambda: q.stats()["sessions"] == before["sessions"], timeout=10)  # ended
        peer.send(b"msg", pickle.dumps(Boom(str(marker))))
        assert peer.recv() == [b"who"]
        answer = peer.handshake(credential, auth.STATUS_ROLE)
        assert answer is not None and answer[0] == b"welcome"
        wait_until(lambda: q.stats()["malformed"] > before["malformed"], timeout=10)
    finally:
        peer.close()
    _still_works(q)
    assert not marker.exists()


def test_a_status_session_nesting_json_deep_stops_nothing(status_queue):
    """Round 4, S2: JSON nested deeper than the parser's recursion limit raised
    RecursionError, which the hub's JSON check did not catch; each such message cost the
    hub's round its sends and beats, and ranks declared the leader lost. A status
    message is now looked at before it is parsed, and a message whose handling raises
    costs that message alone."""
    q, credential = status_queue
    before = q.stats()["malformed"]
    peer = _status_session(q, credential)
    try:
        deep = b"[" * 1500 + b"]" * 1500
        assert hub_module.Hub._status_message(q._hub, "fr-status/x", deep) is None
        for _ in range(50):
            peer.send(b"msg", deep)
        wait_until(lambda: q.stats()["malformed"] >= before + 50, timeout=10)
        assert peer.recv(timeout=2.0) is None  # nothing but beats came meanwhile
        peer.send(b"msg", json.dumps(["status", 7]).encode())
        answer = peer.recv(timeout=5.0)
        assert answer is not None and answer[0] == b"msg"
    finally:
        peer.close()
    _still_works(q)


def test_a_message_whose_handling_raises_costs_that_message_alone():
    """sockets.pump: a frame handler that raises drops that message; the round's other
    messages are handled and its after_round (the hub's sends and beats) runs."""
    ctx = zmq.Context()
    rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    rx.bind("inproc://pump-test")
    tx.connect("inproc://pump-test")
    waker = channel_sockets.Waker(ctx)
    stop = threading.Event()
    handled, rounds = [], []

    def on_frames(frames: list[bytes]) -> None:
        if frames == [b"bad"]:
            raise RecursionError("what a peer's message made the handler do")
        handled.append(frames)

    thread = threading.Thread(
        target=channel_sockets.pump,
        args=(rx, waker, stop, on_frames, lambda: rounds.append(1), "test", 0.05),
    )
    thread.start()
    try:
        for frame in (b"bad", b"good", b"bad", b"also good"):
            tx.send(frame)
        wait_until(lambda: len(handled) == 2, timeout=5)
        seen = len(rounds)
        wait_until(lambda: len(rounds) > seen, timeout=5)
        assert handled == [[b"good"], [b"also good"]]
    finally:
        stop.set()
        waker.ring()
        thread.join(5)
        rx.close(0)
        tx.close(0)
        waker.close()
        ctx.term()


def test_a_status_message_is_one_small_part(status_queue):
    """Round 4, S3: every part of any message was copied before its shape was looked at,
    so a status session's message of thousands of parts held hundreds of MiB of the
    leader's memory. A status session's message is one part of at most 4 KiB, or
    malformed; nothing else of it is copied."""
    q, credential = status_queue
    before = q.stats()["malformed"]
    peer = _status_session(q, credential)
    try:
        peer.send(b"msg", b'["status", 1]', b'["status", 2]')
        peer.send(b"msg", b"[" + b" " * 5000 + b"]")
        wait_until(lambda: q.stats()["malformed"] >= before + 2, timeout=10)
    finally:
        peer.close()


def test_a_message_of_many_frames_is_read_in_rounds_and_dropped(status_queue):
    """Round 5, S2: the hub built an object for every frame of a message before looking at
    it, so one status session's message of 400,000 empty frames (14 MB) held its thread
    for 6.7 s, beats included, and a live rank was declared lost. It now reads a budget
    of frames a round (tests/test_frame_reader.py), drops the rest of a message past what
    one may have, and serves on."""
    q, credential = status_queue
    before = q.stats()["dropped"]
    peer = _status_session(q, credential)
    try:
        peer.send(b"msg", *([b""] * 100_000))
        wait_until(lambda: q.stats()["dropped"] >= before + 1, timeout=30)
    finally:
        peer.close()
    _status_session(q, credential).close()  # the hub still answers handshakes


def test_held_messages_are_bounded_and_only_of_the_ended_sessions_kind(bare_hub, monkeypatch):
    """Round 4, S1 and S3: a message from the routing id of an ended session is held for
    its Link's return only from a key of that session's kind, at most _HELD_MESSAGES a
    session and _HELD_BYTES in all; what the hub holds is freed as it is handed over."""
    hub, _ = bare_hub
    monkeypatch.setattr(hub_module, "_HELD_BYTES", 1000)
    rid, other = os.urandom(16), os.urandom(16)
    hub._ended[rid] = ("fr-client/aa", auth.CLIENT_KIND)
    hub._ended[other] = ("fr-client/bb", auth.CLIENT_KIND)
    part = [zmq.Frame(b"x" * 300)]
    hub._hold(rid, auth.STATUS_KIND, part)  # another kind's key: not its session's
    hub._hold(os.urandom(16), auth.CLIENT_KIND, part)  # no ended session
    assert hub._held == {} and hub._held_bytes == 0
    for _ in range(3):
        hub._hold(rid, auth.CLIENT_KIND, part)
    hub._hold(other, auth.CLIENT_KIND, part)  # a fourth would pass the bytes' bound
    assert len(hub._held[rid]) == 3 and other not in hub._held
    assert hub._held_bytes == 900
    assert hub._unhold(rid) == [b"x" * 300] * 3 and hub._held_bytes == 0


def test_the_closed_client_boxes_the_coordinator_keeps_are_bounded(job, monkeypatch):
    """A box is marked closed at its client's bye so that nothing more is sent there: one
    mark for every client that ever connected, never let go. The latest
    _CLOSED_CLIENTS are kept (an older box the hub has forgotten too); a lost rank's
    box stays closed."""
    q, _, _ = job
    coord = q._coordinator
    monkeypatch.setattr(coordinator_module, "_CLOSED_CLIENTS", 3)
    before = set(coord._closed_boxes)
    boxes = [f"fr-client/{i:016x}" for i in range(10)]
    for box in boxes:
        coord._on_bye(box)
    closed = set(coord._closed_boxes)
    assert set(boxes[-3:]) <= closed and not closed & set(boxes[:-3])
    assert {b for b in before if not b.startswith("fr-client/")} <= closed


def test_ended_status_sessions_never_push_out_a_clients_box(bare_hub, monkeypatch):
    """Every `freeride status` ends its session with a bye, and the hub remembers the box
    of each ended session for its Link's return: status sessions ending without end
    pushed the boxes of clients that had gone quiet for a while out of that memory, and
    such a client coming back got a new box, its handles no longer followed. Each kind
    has its own _REMEMBERED."""
    hub, _ = bare_hub
    monkeypatch.setattr(hub_module, "_REMEMBERED", 3)
    client = os.urandom(16)
    with hub._lock:
        hub._sessions[client] = hub_module._Session("fr-client/aa", auth.CLIENT_KIND, 0.0)
        hub._end_session(client)
        for _ in range(50):
            rid = os.urandom(16)
            hub._sessions[rid] = hub_module._Session(
                "fr-status/" + rid.hex()[:6], auth.STATUS_KIND, 0.0
            )
            hub._end_session(rid)
        assert len(hub._ended) == 4  # the client's and the latest 3 status sessions'
        assert hub._box_for(client, auth.CLIENT_ROLE, auth.CLIENT_KIND) == "fr-client/aa"
        assert client not in hub._ended and len(hub._ended_order[auth.CLIENT_KIND]) == 0
        for _ in range(4):  # clients push out clients, the oldest first
            rid = os.urandom(16)
            hub._sessions[rid] = hub_module._Session(
                "fr-client/" + rid.hex(), auth.CLIENT_KIND, 0.0
            )
            hub._end_session(rid)
        assert len(hub._ended) == 6 and len(hub._ended_order[auth.STATUS_KIND]) == 3


def test_status_sessions_hold_apart_from_clients(bare_hub, monkeypatch):
    """Round 5, S5: status sessions pushed out by the cap on them could each keep 64
    held messages of 4 KiB, and about a thousand of them took the 256 MiB every client's
    held messages share: a returning client's were then dropped. A status session's are
    table requests, the latest alone counting: one held a session, in a budget apart."""
    hub, _ = bare_hub
    monkeypatch.setattr(hub_module, "_HELD_STATUS_BYTES", 500)
    monkeypatch.setattr(hub_module, "_HELD_BYTES", 1000)
    status = [os.urandom(16) for _ in range(3)]
    for rid in status:
        hub._ended[rid] = ("fr-status/" + rid.hex()[:4], auth.STATUS_KIND)
    client = os.urandom(16)
    hub._ended[client] = ("fr-client/aa", auth.CLIENT_KIND)
    payload = b'["status", 1]' + b" " * 200
    request = [zmq.Frame(payload)]
    for rid in status:
        for _ in range(3):
            hub._hold(rid, auth.STATUS_KIND, request)
    # One a session, and the third passes the status sessions' 500 bytes.
    assert [len(hub._held.get(rid, [])) for rid in status] == [1, 1, 0]
    assert hub._held_status_bytes == 2 * len(payload) and hub._held_bytes == 0
    for _ in range(3):  # the clients' budget is untouched
        hub._hold(client, auth.CLIENT_KIND, [zmq.Frame(b"x" * 300)])
    assert len(hub._held[client]) == 3 and hub._held_bytes == 900
    assert hub._unhold(status[0]) == [payload]
    assert hub._held_status_bytes == len(payload) and hub._held_bytes == 900


def test_table_requests_are_paced_and_placement_goes_on_under_a_flood(job):
    """Round 4, S4: the coordinator handled every waiting message before it placed or
    looked at liveness, and built the whole task table for each request: a status
    session's flood of requests stalled placement for as long as it lasted. Now the
    hub keeps one table request a status box has waiting, the coordinator answers a box
    at most every _TABLE_EVERY_S (the latest request of a box that asked sooner, later)
    and places and reads liveness every _HOUSEKEEP_S under messages without a break."""
    from freeride.job import coordinator as coordinator_module

    class FloodHub:
        """Table requests from one box, without end (each with the last table's ticket:
        a box that reads its tables)."""

        def __init__(self) -> None:
            self.request = 0
            self.ticket = None
            self.sent: list[tuple[str, Any]] = []

        def poll(self):
            self.request += 1
            return ("fr-client/aa", ("status", "fr-client/aa", self.request, self.ticket))

        def send(self, box: str, message: Any) -> None:
            self.sent.append((box, message))
            if message[0] == "status":
                self.ticket = message[2]

        def take_stats(self) -> dict:
            return {}

        def heard_all(self) -> dict:
            return {}

        def wait(self, timeout: float) -> None:
            time.sleep(timeout)

    hub = FloodHub()
    coord = coordinator_module.Coordinator(Policy(4), hub, [0], 0, 3.0)
    housekept = []
    coord._read_stats = lambda: housekept.append(time.monotonic())
    began = time.monotonic()
    while time.monotonic() - began < 0.5:
        coord.step()
    tables = [msg for box, msg in hub.sent if msg[0] == "status"]
    assert 2 <= len(tables) <= 7, len(tables)  # every 0.1 s, not once a request
    assert tables[-1][1] > tables[0][1] + 1  # the latest of those that came meanwhile
    gaps = [b - a for a, b in itertools.pairwise(housekept)]
    assert len(housekept) >= 3 and max(gaps) < 0.3, gaps  # every 0.05 s, not never


def test_status_boxes_leave_no_state_behind(monkeypatch):
    """Round 5, S4: every status session's hello added its box to the clients told
    "closed" at the end, and its bye to the closed boxes, both for ever: a box a session,
    and sessions come and go without end. Now the latest _STATUS_BOXES are kept to be
    told, and a status box's bye leaves nothing; clients' boxes are kept as before."""
    from freeride.job import coordinator as coordinator_module

    monkeypatch.setattr(coordinator_module, "_STATUS_BOXES", 4)

    class Hub:
        def __init__(self) -> None:
            self.sent: list[tuple[str, Any]] = []
            self.dropped: list[str] = []

        def send(self, box: str, message: Any) -> None:
            self.sent.append((box, message))

        def drop(self, box: str) -> None:
            self.dropped.append(box)

    hub = Hub()
    coord = coordinator_module.Coordinator(Policy(4), hub, [0], 0, 3.0)
    boxes = [f"fr-status/{k:04x}" for k in range(10)]
    for box in boxes[:3]:
        coord.handle(box, ("hello", box))
        coord.handle(box, ("bye", box))
    for box in boxes[3:]:  # seven sessions that never say bye: the latest four kept
        coord.handle(box, ("hello", box))
    coord.handle("fr-client/aa", ("hello", "fr-client/aa"))
    coord.handle("fr-client/bb", ("hello", "fr-client/bb"))
    coord.handle("fr-client/bb", ("bye", "fr-client/bb"))
    assert coord.malformed == 0
    assert list(coord._status_boxes) == boxes[6:]
    assert coord._closed_boxes == {"fr-client/bb"}
    assert hub.dropped == [*boxes[:3], "fr-client/bb"]
    coord._finish()
    told = {box for box, message in hub.sent if message == ("closed",)}
    assert told == {*boxes[6:], "fr-client/aa"}


def test_labels_are_bounded():
    """Round 4, C1: a task's label had no bound and was kept for 2,000 final tasks and
    sent in every table: three 88 MiB names broke status() for everyone. A label is at
    most LABEL_CHARS, and always a string."""
    from freeride.job.placement import LABEL_CHARS

    assert TaskSpec(fr.tasks.Spin, name="n" * 10_000).label == "n" * (LABEL_CHARS - 1) + "…"
    assert TaskSpec(fr.tasks.Spin).label == "Spin"
    assert TaskSpec("mypkg.tasks:make", name="short").label == "short"
    odd = TaskSpec(fr.tasks.Spin)
    object.__setattr__(odd, "name", 12345)  # what an unpickled spec may hold
    assert isinstance(odd.label, str)


def test_status_sessions_are_bounded(status_queue, monkeypatch):
    """Round 4, S5: a status credential's holder opening connections without end left a
    session for each, 60 s long, that the hub walked at every beat (5-9 ms a beat at
    2,700). At most _STATUS_SESSIONS live at once: one more ends the one heard from
    longest ago, whose next message is answered "who" (its Link authenticates again),
    and the job's own sessions are untouched."""
    q, credential = status_queue
    monkeypatch.setattr(hub_module, "_STATUS_SESSIONS", 3)
    before = q.stats()["sessions"]
    peers = []
    try:
        for _ in range(5):
            peers.append(_status_session(q, credential))
        assert q.stats()["sessions"] == before + 3
        peers[0].send(b"msg", json.dumps(["status", 1]).encode())
        assert peers[0].recv() == [b"who"]  # ended: the two oldest made room
        peers[4].send(b"msg", json.dumps(["status", 2]).encode())
        answer = peers[4].recv(timeout=5.0)
        assert answer is not None and answer[0] == b"msg"
    finally:
        for peer in peers:
            peer.close()
    _still_works(q)
