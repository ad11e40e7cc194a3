"""Gate write mechanisms (FREERIDE_GATE_WRITE): reported by backend_info() and the
executor, and, on a GPU, each one keeps items exactly-once across stream-ordered flips
and stops side work when it closes."""

import time

import pytest
from gpu_worker import finishes_within

import freeride as fr
from conftest import wait_until

MECHANISMS = ("batch", "memop", "copy", "kernel")


def test_backend_info_reports_the_gate_write_mechanism():
    info = fr.backend_info()
    if info["cuda"]:
        assert info["gate_write"] in MECHANISMS
        assert all(d["gate_write"] in MECHANISMS for d in info["devices"])
    else:
        assert info["gate_write"] == "host"


def test_host_backend_writes_the_gate_on_the_host():
    with fr.Harvester("cpu", workers=2) as h:
        assert h._ex.gate_write_mechanism == "host"


def _harvester(monkeypatch, mechanism: str, **options) -> fr.Harvester:
    monkeypatch.setenv("FREERIDE_GATE_WRITE", mechanism)
    h = fr.Harvester("cuda:0", **options)
    if h._ex.gate_write_mechanism != mechanism:
        used = h._ex.gate_write_mechanism
        h.close()
        pytest.skip(f"the driver does not offer {mechanism} here (fell back to {used})")
    return h


@pytest.mark.gpu
def test_unknown_mechanism_is_refused(monkeypatch):
    monkeypatch.setenv("FREERIDE_GATE_WRITE", "telepathy")
    with pytest.raises(ValueError, match="batch, memop, copy or kernel"):
        fr.Harvester("cuda:0")
    assert "invalid" in fr.backend_info()["gate_write"]
    # The refusal leaves no CUDA error behind on this thread for its next checked launch
    # (here a gate write kernel) to report as its own.
    monkeypatch.setenv("FREERIDE_GATE_WRITE", "kernel")
    with fr.Harvester("cuda:0") as h:
        assert h._ex.gate_write_mechanism == "kernel"
        h.gate.close(stream=0)
        h.gate.open(stream=0)


@pytest.mark.gpu
def test_batch_is_the_default_where_the_driver_has_it(monkeypatch):
    """Whether the driver has batched stream memory operations is what a harvester asking
    for "batch" gets; a harvester asking for nothing must then use the same. Negative
    control: asking for "copy" gets "copy", so the reported mechanism follows what is
    used and the comparison can fail."""
    monkeypatch.setenv("FREERIDE_GATE_WRITE", "batch")
    with fr.Harvester("cuda:0") as h:
        with_batch = h._ex.gate_write_mechanism
        # A batch keeps every write's fence (no NO_MEMORY_BARRIER: the v2 memory
        # operations do not support it).
        assert h.gate.write_fences == ("all" if with_batch == "batch" else None)
    monkeypatch.setenv("FREERIDE_GATE_WRITE", "copy")
    with fr.Harvester("cuda:0") as h:
        assert h._ex.gate_write_mechanism == "copy", "the mechanism asked for was not used"
        assert h.gate.write_fences is None
    monkeypatch.delenv("FREERIDE_GATE_WRITE")
    with fr.Harvester("cuda:0") as h:
        default = h._ex.gate_write_mechanism
        assert fr.backend_info()["gate_write"] == default
    print(f"asking for batch gets {with_batch}; the default is {default}")
    assert default == with_batch, f"the default is {default}, but this driver offers {with_batch}"
    if fr.backend_info()["devices"][0]["stream_mem_ops"]:
        assert default in ("batch", "memop")
    else:
        assert default == "copy"


@pytest.mark.gpu
@pytest.mark.parametrize("host_gate", [False, True], ids=["device-gate", "host-gate"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_exactly_once_with_stream_ordered_flips(monkeypatch, mechanism, host_gate):
    torch = pytest.importorskip("torch")
    h = _harvester(monkeypatch, mechanism, gate_in_host_memory=host_gate)
    with h:
        stream = torch.cuda.Stream()
        task = fr.tasks.ItemCounter(5_000, phases=3, ns_per_item=2_000)
        t = h.submit(task)
        x = torch.ones(1 << 20, device="cuda:0")
        with torch.cuda.stream(stream):
            for _ in range(200):
                h.gate.close(stream=stream)
                x.mul_(1.0)  # training's compute between the close and the open
                h.gate.open(stream=stream)
        finishes_within(60, stream.synchronize, "200 stream-ordered flips")
        assert h.gate.is_open
        assert t.wait(timeout=120)
        result = t.result()
        assert (result.counts == 1).all()
        assert result.violations == 0


@pytest.mark.gpu
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_stream_ordered_close_stops_side_work(monkeypatch, mechanism):
    torch = pytest.importorskip("torch")
    h = _harvester(monkeypatch, mechanism)
    with h:
        sms = fr.backend_info()["devices"][0]["sm_count"]
        task = fr.tasks.ItemCounter(sms * 32 * 10, phases=3, ns_per_item=5_000_000)
        t = h.submit(task)
        wait_until(lambda: t.items_done >= 20)
        stream = torch.cuda.Stream()
        h.gate.close(stream=stream)
        # The close has been executed in stream order.
        finishes_within(30, stream.synchronize, "the stream behind a stream-ordered close")
        assert not h.gate.is_open
        time.sleep(0.05)  # kernels exit within one 5 ms item; the relaunch waits
        frozen = t.items_done
        assert not t.wait(timeout=0.2)
        assert t.items_done == frozen
        assert int(task.snapshot().counts.sum()) == frozen
        assert frozen < t.items_total
        h.gate.open(stream=stream)
        assert t.wait(timeout=120)
        result = t.result()
        assert (result.counts == 1).all()
        assert result.violations == 0
