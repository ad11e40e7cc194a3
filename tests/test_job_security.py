"""The job queue's control plane against what reaches its port: forged and replayed
messages, verified but malformed ones (fuzzed), and outside clients with and without the
job's secret. One rank (this process) holds the queue; the test plays everyone else."""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import threading
from datetime import timedelta

import pytest

import freeride as fr
from conftest import wait_until
from freeride.job import mailbox
from freeride.job import messages as m
from freeride.job.placement import TaskSpec

torch = pytest.importorskip("torch")
dist = torch.distributed
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


class Boom:
    """A pickle that runs a command when loaded: what an attacker stores."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A one-rank job (this process) with a harvester and a queue that wrote its secret."""
    folder = tmp_path_factory.mktemp("job")
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    h = fr.Harvester("cpu", workers=2)
    h.gate.open(stream="host")
    q = fr.JobQueue(h, host="127.0.0.1", secret_file=folder / "queue.json", rank_timeout=3.0)
    yield q, folder
    q.close()
    h.close()
    dist.destroy_process_group()


def _raw_client(q) -> object:
    host, _, port = q.address.rpartition(":")
    return dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=10))


def _spin(items: int = 20) -> TaskSpec:
    return TaskSpec(fr.tasks.Spin, kwargs={"items": items, "ns_per_item": 1000})


def _still_works(q) -> None:
    handle = q.submit(_spin())
    assert handle.wait(20), handle
    assert handle.state == "done" and handle.items_done == 20


def _queue_threads_alive() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("freeride-jobqueue")}


def test_store_listens_only_on_the_address_given(job):
    q, _ = job
    port = int(q.address.rpartition(":")[2])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, lport = local.split(":")
                if int(lport, 16) == port and state == "0A":  # LISTEN
                    listening.append(addr)
    assert listening == ["0100007F"], listening  # 127.0.0.1 only, not 0.0.0.0 or ::


def test_unauthenticated_pickles_run_nothing_and_the_queue_keeps_serving(job, tmp_path):
    q, _ = job
    marker = tmp_path / "pwned"
    attacker = _raw_client(q)
    before = q.stats()["dropped"]
    for box in (m.agent_box(0), m.COORD):
        n = attacker.add(f"{box}/n", 1)
        attacker.set(f"{box}/{n}", pickle.dumps(Boom(str(marker))))
        n = attacker.add(f"{box}/n", 1)
        attacker.set(f"{box}/{n}", pickle.dumps(7))  # well formed, but not ours
    wait_until(lambda: q.stats()["dropped"] >= before + 4, timeout=10)
    _still_works(q)
    assert not marker.exists()
    assert {"freeride-jobqueue", "freeride-jobqueue-coord"} <= _queue_threads_alive()


def test_a_replayed_message_does_not_verify_under_another_number(job):
    q, _ = job
    attacker = _raw_client(q)
    box = m.COORD
    # A genuine message, read off the store by an eavesdropper before the coordinator
    # takes it, stored again under the next number: its tag names the old number.
    out = mailbox.Outbox(attacker, q._secret)
    payload = pickle.dumps(("cancel", "nobody:1"))
    tag_for = {}
    n = attacker.add(f"{box}/n", 0) + 1
    out.send_raw(box, payload)
    tag_for[n] = bytes(attacker.get(f"{box}/{n}")) if attacker.check([f"{box}/{n}"]) else None
    before = q.stats()["dropped"]
    if tag_for[n] is None:
        pytest.skip("the coordinator read the message before the eavesdropper")
    n2 = attacker.add(f"{box}/n", 1)
    attacker.set(f"{box}/{n2}", tag_for[n])
    wait_until(lambda: q.stats()["dropped"] >= before + 1, timeout=10)


def test_a_taken_number_never_written_does_not_stall_the_box(job):
    q, _ = job
    attacker = _raw_client(q)
    attacker.add(f"{m.agent_box(0)}/n", 1)  # a hole in the rank's box
    attacker.add(f"{m.COORD}/n", 1)  # and in the coordinator's
    before = q.stats()["dropped"]
    _still_works(q)  # its messages wait behind the holes, then pass
    assert q.stats()["dropped"] >= before + 2


_FIELD = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | st.sampled_from(["0:1", "c1:1", m.agent_box(0), m.client_box(1), "fr-coord", "done"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_KINDS = st.sampled_from(
    [
        "submit",
        "cancel",
        "stats",
        "state",
        "handback",
        "closing",
        "gone",
        "hello",
        "status",
        "bye",
        "run",
        "update",
        "lost",
        "closed",
        "nonsense",
    ]
)
_MESSAGES = st.one_of(
    st.tuples(_KINDS).flatmap(
        lambda k: st.lists(_FIELD, max_size=9).map(lambda fields: (k[0], *fields))
    ),
    _FIELD,
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(message=_MESSAGES)
def test_shape_checks_reject_or_accept_without_raising_anything_else(message):
    for check in (m.to_coordinator, m.to_agent):
        try:
            checked = check(message)
        except m.Malformed:
            continue
        assert checked is message


@hypothesis.settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(messages=st.lists(_MESSAGES, min_size=1, max_size=4))
def test_verified_but_malformed_messages_never_kill_a_thread(job, messages):
    q, _ = job
    out = mailbox.Outbox(_raw_client(q), q._secret)
    for message in messages:
        # Only shapes that cannot stop the job's real work: no "closing"/"gone"/"bye" for
        # the live rank 0 (those are legitimate requests to end its part).
        if isinstance(message, tuple) and message and message[0] in ("closing", "gone", "bye"):
            continue
        for box in (m.COORD, m.agent_box(0)):
            out.send(box, message)
    _still_works(q)
    assert {"freeride-jobqueue", "freeride-jobqueue-coord", "freeride-jobqueue-beat"} <= (
        _queue_threads_alive()
    )


def test_a_spec_that_fails_to_build_fails_its_task_only(job):
    q, _ = job
    bad = q.submit(TaskSpec("freeride.tasks:Spin", kwargs={"items": -1}))
    with pytest.raises(fr.TaskFailedError, match="rank 0"):
        bad.result(timeout=20)
    _still_works(q)


def test_secret_file_is_owner_only_and_names_the_queue(job):
    q, folder = job
    path = folder / "queue.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["address"] == q.address and bytes.fromhex(data["secret"]) == q._secret


def test_outside_client_with_the_secret_submits_and_watches(job):
    _, folder = job
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


def test_outside_client_without_the_secret_is_refused_and_sends_nothing(job, tmp_path):
    q, _ = job
    before = dict(q.stats())
    clients = _raw_client(q).add("fr-clients", 0)
    with pytest.raises(fr.QueueAuthError, match="refused"):
        fr.JobQueue.connect(q.address, b"\x01" * 32)
    assert isinstance(fr.QueueAuthError("x"), PermissionError)
    assert _raw_client(q).add("fr-clients", 0) == clients  # it never opened a box
    assert q.stats() == before
    # A readable-by-others secret file is refused before any connection.
    leaky = tmp_path / "leaky.json"
    leaky.write_text(json.dumps({"address": q.address, "secret": q._secret.hex()}))
    os.chmod(leaky, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        fr.JobQueue.connect(secret_file=leaky)


@pytest.mark.parametrize(
    ("address", "secret", "match"),
    [
        ("nohostport", b"\0" * 32, "host:port"),
        ("127.0.0.1:0", b"\0" * 32, "port"),
        ("127.0.0.1:1", b"short", "32 bytes"),
        ("127.0.0.1:1", "zz", "hex digits"),
    ],
)
def test_connect_checks_its_arguments(address, secret, match):
    with pytest.raises(ValueError, match=match):
        fr.JobQueue.connect(address, secret)


def test_connect_to_nothing_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="no job queue answers"):
        fr.JobQueue.connect(f"127.0.0.1:{port}", b"\0" * 32, timeout=1.0)
