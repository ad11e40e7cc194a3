"""Table tickets (round 6, S3): a holder of the status credential (or the client one) that
asked for task tables and never read them made the leader's process keep every answer
queued for its connection, up to the hub's high-water mark of 1,000 tables of thousands
of rows each. Every table now carries a fresh ticket, and a box's next request must
present it (job/tickets.py): a box that does not read has one table queued, and one more
only after a wait that doubles each time."""

from __future__ import annotations

import collections
import json
import math
import os
import pickle
import threading
import time
import types

import pytest
from job_harness import Attacker, one_rank_job

import freeride as fr
from conftest import wait_until
from freeride.job import auth, tickets
from freeride.job import messages as m
from freeride.job.channel import hub as hub_module

zmq = pytest.importorskip("zmq")


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """A one-rank job (this process) whose queue wrote a secret file and a status file."""
    folder = tmp_path_factory.mktemp("job")
    with one_rank_job(folder, status_file=folder / "status.json") as q:
        credentials = {
            role: bytes.fromhex(json.loads((folder / f"{name}.json").read_text())["secret"])
            for role, name in ((auth.CLIENT_KIND, "queue"), (auth.STATUS_KIND, "status"))
        }
        yield q, folder, credentials


@pytest.fixture
def tables(queue, monkeypatch):
    """Tables the leader's coordinator hands its hub, counted by box: what ZeroMQ then
    keeps queued for a connection that does not read."""
    q = queue[0]
    counts: collections.Counter[str] = collections.Counter()
    send = q._hub.send

    def counting(box, message):
        if message[0] == "status":
            counts[box] += 1
        send(box, message)

    monkeypatch.setattr(q._hub, "send", counting)
    return counts


@pytest.fixture
def waive_after(queue, monkeypatch):
    """Sets how long the leader waits before it answers a request without its ticket."""

    def set_to(seconds: float) -> None:
        monkeypatch.setattr(queue[0]._coordinator._tickets, "_waive_s", seconds)

    return set_to


class Peer(Attacker):
    """A connection that runs the protocol by hand with a credential of `kind`: it reads
    only when told to (a Link's thread always reads)."""

    def __init__(self, q, credential: bytes, kind: str) -> None:
        super().__init__(q, credential=credential, kind=kind)
        self.kind, self.credential = kind, credential
        self.box = self.handshake()

    def handshake(self) -> str:
        role = auth.STATUS_ROLE if self.kind == auth.STATUS_KIND else auth.CLIENT_ROLE
        nonce = os.urandom(auth.NONCE_BYTES)
        self.sock.send_multipart([b"hello", nonce, role])
        challenge = self.recv()
        while challenge == [b"who"]:  # (asked to authenticate: it is)
            challenge = self.recv()
        assert challenge is not None and challenge[0] == b"challenge", challenge
        proof = auth.client_proof(self.credential, nonce, challenge[1], role)
        self.sock.send_multipart([b"auth", proof])
        welcome = self.recv()
        assert welcome is not None and welcome[0] == b"welcome", welcome
        return welcome[1].decode()

    def ask(self, request: int, ticket: int | None = None) -> None:
        """A table request, as a status reader's JSON or a client's pickle."""
        if self.kind == auth.STATUS_KIND:
            payload = json.dumps(["status", request, ticket]).encode()
        else:
            payload = pickle.dumps(("status", self.box, request, ticket))
        self.sock.send_multipart([b"msg", payload], zmq.NOBLOCK)

    def recv(self, timeout: float = 5.0) -> list[bytes] | None:
        return super().recv(timeout)

    def table(self, timeout: float = 5.0) -> tuple | None:
        """The next table, ("status", request, ticket, rows), or None."""
        frames = self.recv(timeout)
        if frames is None:
            return None
        assert frames[0] == b"msg", frames
        return m.to_agent(pickle.loads(b"".join(frames[1:])))


KINDS = [auth.STATUS_KIND, auth.CLIENT_KIND]


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_that_never_reads_is_sent_one_table(queue, tables, waive_after, kind):
    """S3: 300 table requests over a second from a connection that never reads left up to
    a table each queued at the hub. Now it is sent one (the first needs no ticket), the
    rest go unanswered and counted, and a status reader that reads meanwhile is answered
    every time."""
    q, folder, credentials = queue
    waive_after(60.0)
    before = q.stats()["unanswered"]
    peer = Peer(q, credentials[kind], kind)
    answered = []
    stop = threading.Event()

    def watch() -> None:
        with fr.JobQueue.connect(secret_file=folder / "status.json") as watcher:
            while not stop.is_set():
                answered.append(watcher.status(timeout=5.0))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for request in range(1, 301):
            peer.ask(request)
            time.sleep(0.004)
        wait_until(lambda: q.stats()["unanswered"] > before, timeout=10)
        time.sleep(0.3)  # what was still on its way is answered, or not, by now
        stop.set()
        watcher.join(10)
        assert tables[peer.box] == 1, tables
        assert len(answered) >= 3, len(answered)
    finally:
        stop.set()
        peer.close()


def test_a_wrong_ticket_is_not_answered_and_the_right_one_is(queue, tables, waive_after):
    q, _, credentials = queue
    waive_after(60.0)
    peer = Peer(q, credentials[auth.STATUS_KIND], auth.STATUS_KIND)
    try:
        peer.ask(1)  # a box's first request needs no ticket
        first = peer.table()
        assert first is not None and first[:2] == ("status", 1)
        ticket = first[2]
        before = q.stats()
        for wrong in (None, ticket ^ 1, ticket + 2**40):
            peer.ask(2, wrong)
            assert peer.table(timeout=0.5) is None
        wait_until(lambda: q.stats()["unanswered"] == before["unanswered"] + 3, timeout=5)
        # A ticket of another type is no ticket: malformed, before the coordinator sees it.
        for text in (
            b'["status", 3, "%d"]' % ticket,
            b'["status", 3, true]',
            b'["status", 3, 1.5]',
        ):
            peer.sock.send_multipart([b"msg", text])
        wait_until(lambda: q.stats()["malformed"] == before["malformed"] + 3, timeout=5)
        assert peer.table(timeout=0.3) is None
        peer.ask(4, ticket)
        second = peer.table()
        assert second is not None and second[:2] == ("status", 4)
        assert second[2] != ticket  # a fresh ticket a table
        peer.ask(5, ticket)  # the one before is spent
        assert peer.table(timeout=0.5) is None
        peer.ask(6, second[2])
        third = peer.table()
        assert third is not None and third[1] == 6
        assert tables[peer.box] == 3
    finally:
        peer.close()


def test_status_works_again_and_again_and_after_a_timeout(queue, tables, waive_after):
    """JobClient.status() presents the ticket of the last table it received, whatever
    request that table answered: one that came after its status() had timed out too (no
    waiver here: the ticket alone lets the next status() through at once)."""
    q, folder, _ = queue
    waive_after(60.0)
    before = q.stats()["unanswered"]
    with fr.JobQueue.connect(secret_file=folder / "status.json") as client:
        for _ in range(20):
            assert isinstance(client.status(), list)
        assert tables[client._box] == 20
        client._link.hold(True)  # its request waits: no answer in time
        with pytest.raises(TimeoutError):
            client.status(timeout=0.2)
        client._link.hold(False)
        wait_until(lambda: tables[client._box] == 21, timeout=5)  # the late table went
        time.sleep(0.3)  # and came
        for _ in range(5):
            assert isinstance(client.status(timeout=5.0), list)
    assert q.stats()["unanswered"] == before


@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_table_is_waived_after_a_wait_that_doubles(queue, tables, waive_after, kind):
    """The fallback: a table can be lost on its way (a session the hub ended, a reconnect's
    takeover), and its ticket with it. A box whose last table went WAIVE_S ago is answered
    without the ticket; each waiver in a row doubles the wait for the next, and a right
    ticket starts the count again."""
    q, _, credentials = queue
    waive_s = 0.5
    waive_after(waive_s)
    peer = Peer(q, credentials[kind], kind)
    try:
        peer.ask(1)
        ticket = peer.table()[2]
        peer.ask(2, ticket)
        assert peer.table() is not None  # "lost": its ticket is never noted
        sent = time.monotonic()  # (the table went before it came)
        for waivers in range(3):
            wait = waive_s * 2**waivers
            peer.ask(10 * waivers + 3, ticket)  # the ticket before: refused until the wait
            assert peer.table(timeout=wait * 0.6) is None
            time.sleep(max(0.0, sent + wait - time.monotonic()) + 0.05)
            peer.ask(10 * waivers + 4, ticket)
            waived = peer.table()
            sent = time.monotonic()
            assert waived is not None and waived[1] == 10 * waivers + 4  # and "lost" too
        peer.ask(100, waived[2])  # read at last: its ticket, and the count starts again
        assert peer.table() is not None
        peer.ask(101)  # lost again: the first wait is WAIVE_S again, not 8 of them
        assert peer.table(timeout=0.2) is None
        time.sleep(waive_s)
        peer.ask(102)
        assert peer.table()[1] == 102
        assert tables[peer.box] == 7
    finally:
        peer.close()


def test_status_recovers_from_a_table_lost_on_its_way(queue, monkeypatch):
    """JobClient.status() asks again until answered: after a table the hub never delivered
    (its ticket lost with it), the leader waives the ticket after WAIVE_S, and status()
    returns within its timeout."""
    q, folder, _ = queue
    with fr.JobQueue.connect(secret_file=folder / "status.json") as client:
        client.status()
        send, lost = q._hub.send, []

        def losing(box, message):
            if box == client._box and message[0] == "status" and not lost:
                lost.append(message)  # never reaches the client
                return
            send(box, message)

        monkeypatch.setattr(q._hub, "send", losing)
        before = q.stats()["unanswered"]
        began = time.monotonic()
        assert isinstance(client.status(timeout=5.0), list)
        assert lost and time.monotonic() - began >= tickets.WAIVE_S * 0.9
        assert q.stats()["unanswered"] > before  # its asks between


def test_a_bye_does_not_buy_a_connection_a_new_box(queue, tables, waive_after):
    """A status box's ticket outlives its bye: the hub gives the box back to the same
    connection when it authenticates again (as it does a silent session's), so saying bye
    and hello again does not make a fresh box whose first table needs no ticket."""
    q, _, credentials = queue
    waive_after(60.0)
    peer = Peer(q, credentials[auth.STATUS_KIND], auth.STATUS_KIND)
    try:
        box = peer.box
        peer.ask(1)
        assert peer.table() is not None  # read, but its ticket is "forgotten" below
        for cycle in range(3):
            peer.sock.send_multipart([b"msg", b'["bye"]'])
            wait_until(lambda: box not in q._hub._boxes, timeout=5)
            peer.ask(2 + cycle)  # held for its return (answered "who", once a second)
            time.sleep(0.3)  # (a connection's hellos are answered 4 times a second)
            assert peer.handshake() == box
            peer.ask(10 + cycle)
            assert peer.table(timeout=0.5) is None
        assert sum(tables.values()) == 1  # (another box would have been sent its first)
    finally:
        peer.close()


def test_a_clients_ticket_is_forgotten_at_its_bye(queue):
    q, folder, _ = queue
    coord = q._coordinator
    client = fr.JobQueue.connect(secret_file=folder / "queue.json")
    box = client._box
    client.status()
    assert coord._tickets.sent_at(box) is not None
    client.close()
    wait_until(lambda: coord._tickets.sent_at(box) is None, timeout=5)


def test_the_ticket_state_is_bounded_and_a_forgotten_box_asks_as_a_new_one():
    box_tickets = tickets.Tickets(keep=4, waive_s=60.0)
    issued = {f"fr-status/{k}": box_tickets.issue(f"fr-status/{k}", 0.0) for k in range(10)}
    assert len(box_tickets) == 4
    assert box_tickets.admits("fr-status/0", None, 1.0)  # forgotten: as a new box
    assert not box_tickets.admits("fr-status/9", None, 1.0)
    assert not box_tickets.admits("fr-status/9", issued["fr-status/8"], 1.0)
    assert box_tickets.admits("fr-status/9", issued["fr-status/9"], 1.0)
    assert box_tickets.refused == 2
    box_tickets.forget("fr-status/9")
    assert len(box_tickets) == 3 and box_tickets.sent_at("fr-status/9") is None


def test_a_box_that_never_reads_gets_logarithmically_many_tables():
    """The waiver's bound: asking every 10 ms for 1,000 s without reading, a box is sent
    1 + log2(1 + t / WAIVE_S) tables at most (10 here), not one every WAIVE_S."""
    box_tickets = tickets.Tickets(waive_s=1.0)
    sent = 0
    for step in range(100_000):
        now = step * 0.01
        if box_tickets.admits("fr-status/x", None, now):
            box_tickets.issue("fr-status/x", now)
            sent += 1
    assert sent == 1 + math.floor(math.log2(1 + 1000 / 1.0)) == 10


def test_the_status_message_formats():
    hub = types.SimpleNamespace(malformed=0)
    made = hub_module.Hub._status_message
    assert made(hub, "fr-status/x", b'["status", 1]') == ("status", "fr-status/x", 1, None)
    assert made(hub, "fr-status/x", b'["status", 1, null]') == ("status", "fr-status/x", 1, None)
    assert made(hub, "fr-status/x", b'["status", 1, 77]') == ("status", "fr-status/x", 1, 77)
    for bad in (
        b'["status", 1, "77"]',
        b'["status", 1, true]',
        b'["status", 1, 7.0]',
        b'["status", 1, [77]]',
        b'["status", 1, 77, 78]',
        b'["status"]',
    ):
        assert made(hub, "fr-status/x", bad) is None, bad
    assert hub.malformed == 6
    assert m.to_coordinator(("status", "fr-client/a", 1, None))
    assert m.to_coordinator(("status", "fr-client/a", 1, 2**62))
    assert m.to_agent(("status", 1, 2**62, []))
    for bad in (
        ("status", "fr-client/a", 1),
        ("status", "fr-client/a", 1, "t"),
        ("status", "fr-client/a", 1, 2**64),
        ("status", "fr-client/a", 1, True),
    ):
        with pytest.raises(m.Malformed):
            m.to_coordinator(bad)
    with pytest.raises(m.Malformed):
        m.to_agent(("status", 1, []))
