"""The `stream` argument: stream objects and the special handles 0, 1 and 2 are taken; any
other int is refused before anything reaches CUDA (a wrong raw handle would crash the
driver rather than raise), so these run without a GPU."""

import sys

import pytest

import freeride as fr
from freeride import _C
from freeride._streams import stream_handle

RAW_HANDLES = [3, 12345, 0x7F00_DEAD_BEEF, 2**64 - 1, -1]


class FakeTorchStream:
    """What the harvester reads of a torch.cuda.Stream: its handle and device."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle
        self.device = None


class AddOne(fr.IterativeTask):
    """The lightest iterative task: one step."""

    total_steps = 1

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1

    def finished(self) -> bool:
        return self.steps >= 1


# Every `stream` argument is checked by one function (freeride._streams.check_stream)
# before any backend looks at it, so a wrong one fails the same way on the host and on a
# GPU. Gate writes take "host" (write now); a stream to follow (submit) takes no string.
BAD = [
    # (stream, error for a gate write, error for submit, what the message names)
    ("banana", ValueError, TypeError, "banana"),
    ("host", None, TypeError, "'host'"),
    (True, TypeError, TypeError, "bool"),
    (1.5, TypeError, TypeError, "float"),
    (object(), TypeError, TypeError, "object"),
    *[(raw, ValueError, ValueError, "ExternalStream") for raw in RAW_HANDLES],
]


@pytest.mark.parametrize("kind", ["host", "cuda"])
@pytest.mark.parametrize("stream, write_error, follow_error, says", BAD)
def test_one_behaviour_on_every_backend(kind, stream, write_error, follow_error, says):
    device = -1 if kind == "host" else 0
    if write_error is None:
        assert stream_handle(stream, kind, device) == _C.IMMEDIATE
    else:
        with pytest.raises(write_error, match=rf"stream.*{says}|{says}.*stream"):
            stream_handle(stream, kind, device)
    with pytest.raises(follow_error, match=rf"stream.*{says}|{says}.*stream"):
        stream_handle(stream, kind, device, host=False)


TASKS = {"kernel": lambda: fr.tasks.Spin(1, 1), "iterative": AddOne}


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("stream, write_error, follow_error, says", BAD)
def test_every_public_stream_argument_refuses_alike(
    host, task, stream, write_error, follow_error, says
):
    """The harvester's methods refuse before anything is written or queued."""
    with pytest.raises(follow_error, match="stream"):
        host.submit(TASKS[task](), stream=stream)
    assert host.tasks() == []  # nothing was queued
    if write_error is None:
        return
    for write in (host.gate.close, host.gate.open):
        with pytest.raises(write_error, match="stream"):
            write(stream=stream)
    for block in (host.compute, host.iteration, host.bubble):
        with pytest.raises(write_error, match="stream"), block(stream=stream):
            pass
    assert host.gate.is_open


@pytest.mark.parametrize("special", [0, 1, 2])
def test_special_handles_are_taken_as_they_are(special):
    assert stream_handle(special, "cuda", 0) == special
    assert stream_handle(special, "host", -1) == _C.IMMEDIATE


def test_a_stream_object_gives_its_handle():
    # Any handle a stream object carries is taken: the object vouches for it.
    assert stream_handle(FakeTorchStream(0x7F00_DEAD_BEEF), "cuda", 0) == 0x7F00_DEAD_BEEF


@pytest.mark.parametrize("task", sorted(TASKS))
def test_special_handles_and_stream_objects_work_on_the_host(host, task):
    for stream in (None, 0, 1, 2, FakeTorchStream(12345)):
        host.gate.close(stream=stream)
        assert not host.gate.is_open
        host.gate.open(stream=stream)
        handle = host.submit(TASKS[task](), stream=stream)
        assert handle.wait(timeout=30) and handle.state == "done"


class _FakeCupy:
    """What _streams reads of CuPy: the current stream of the current device."""

    def __init__(self, ptr: int) -> None:
        outer = self
        self.devices: list[int] = []

        class Device:
            def __init__(self, index: int) -> None:
                self.index = index

            def __enter__(self):
                outer.devices.append(self.index)

            def __exit__(self, *exc):
                return False

        class Stream:
            def __init__(self) -> None:
                self.ptr = ptr

        class Cuda:
            pass

        Cuda.Device = Device
        Cuda.get_current_stream = staticmethod(Stream)
        self.cuda = Cuda


class _FakeTorch:
    class cuda:
        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def current_stream(device: int) -> FakeTorchStream:
            return FakeTorchStream(0)


def test_submit_also_follows_cupys_current_stream(monkeypatch):
    """Inputs a CuPy kernel writes on CuPy's (non-default) current stream while torch's
    current stream is the default: the task waits for both."""
    from freeride import _streams

    cupy = _FakeCupy(0x7F00_0000_C0FE)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch)
    assert _streams.current_streams(1) == [0, 0x7F00_0000_C0FE]
    assert cupy.devices == [1]  # asked on the harvester's device
    same = _FakeCupy(0)
    monkeypatch.setitem(sys.modules, "cupy", same)
    assert _streams.current_streams(0) == [0]  # one stream, followed once


def test_refuse_capturing_names_the_stream(monkeypatch):
    from freeride import _streams

    capturing = {0x7F00_0000_0001, 0}
    monkeypatch.setattr(_streams, "stream_is_capturing", lambda h, d: h in capturing)
    _streams.refuse_capturing([0x7F00_0000_0002], 0)  # not capturing: nothing raised
    with pytest.raises(fr.StreamCaptureError, match=r"stream 0x7f0000000001 on cuda:1"):
        _streams.refuse_capturing([0x7F00_0000_0002, 0x7F00_0000_0001], 1)
    with pytest.raises(RuntimeError, match=r"the default stream \(0\).*before .* or after"):
        _streams.refuse_capturing([0], 0)
    assert issubclass(fr.StreamCaptureError, fr.FreerideError)


def test_submit_during_capture_is_refused_before_anything_is_queued(host, monkeypatch):
    """The cuda path of submit() with the capture query faked (no GPU here): item and
    iterative tasks alike are refused, and nothing is queued or started."""
    from freeride import _streams, harvester

    captured = 0x7F00_0000_0001
    monkeypatch.setattr(host, "_kind", "cuda")
    monkeypatch.setattr(harvester, "current_streams", lambda device: [captured])
    monkeypatch.setattr(_streams, "stream_is_capturing", lambda h, d: h == captured)
    with pytest.raises(fr.StreamCaptureError, match="submit\\(\\) during graph capture"):
        host.submit(fr.tasks.Spin(4, 1000))
    with pytest.raises(fr.StreamCaptureError, match="stream 0x7f0000000001"):
        host.submit(fr.IterativeTask())
    assert host.tasks() == [] and host._iterative is None


def test_submit_on_the_host_never_asks_about_capture(host, monkeypatch):
    from freeride import _streams

    def fail(*args):
        raise AssertionError("capture query on the host backend")

    monkeypatch.setattr(_streams, "stream_is_capturing", fail)
    assert host.submit(fr.tasks.Spin(4, 1000)).wait(timeout=30)


class _TorchWithRawStreams:
    """A CUDA torch as the gate's current-stream lookup sees it: the full path
    (torch.cuda.current_stream, which initialises CUDA) and the raw getter, each counting
    its calls; the current stream is `handle`."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.full_calls = 0
        self.raw_calls = 0
        self.initialized = False
        outer = self

        class cuda:
            @staticmethod
            def is_available() -> bool:
                return True

            @staticmethod
            def is_initialized() -> bool:
                return outer.initialized

            @staticmethod
            def current_stream(device: int) -> FakeTorchStream:
                outer.full_calls += 1
                outer.initialized = True
                return FakeTorchStream(outer.handle)

        class _C:
            @staticmethod
            def _cuda_getCurrentRawStream(device: int) -> int:
                outer.raw_calls += 1
                return outer.handle

        self.cuda = cuda
        self._C = _C


def test_the_current_stream_is_read_through_torchs_raw_getter_once_cuda_is_up(monkeypatch):
    """The gate reads the current stream at every write: after the first, full lookup
    (which initialises torch's CUDA) it takes torch's raw getter, one call. The getter is
    remembered per torch module: another torch in sys.modules is asked itself (a cache
    that outlived its module would answer with the old one's stream)."""
    from freeride import _streams

    monkeypatch.setattr(_streams, "_raw_getter", None)
    first = _TorchWithRawStreams(0x7F00_0000_0A01)
    monkeypatch.setitem(sys.modules, "torch", first)
    assert [_streams.current_stream(0) for _ in range(3)] == [first.handle] * 3
    assert (first.full_calls, first.raw_calls) == (1, 2)
    first.handle = 0x7F00_0000_0A02  # torch.cuda.stream(s) made another one current
    assert _streams.current_stream(0) == 0x7F00_0000_0A02
    second = _TorchWithRawStreams(0x7F00_0000_0B01)
    monkeypatch.setitem(sys.modules, "torch", second)
    assert _streams.current_stream(1) == second.handle
    assert second.full_calls == 1
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch)  # a torch without the getter
    assert _streams.current_stream(0) == 0
    monkeypatch.setitem(sys.modules, "torch", second)
    assert _streams.current_stream(0) == second.handle
    assert (second.full_calls, second.raw_calls) == (1, 1)
