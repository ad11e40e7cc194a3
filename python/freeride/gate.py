"""The gate: the per-device word that says whether side work may run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _C
from .record.recorder import Recorder


class Gate:
    """Open: side work may run. Closed: no side item starts.

    Writes are stream-ordered: ``close(stream)`` takes effect when the GPU reaches that
    point of `stream`, not when the host calls it. ``stream=None`` means the current
    stream of the harvester's device; ``stream="host"`` writes immediately. A stream is a
    torch.cuda.Stream or a CuPy stream (torch.cuda.ExternalStream wraps a raw handle), or
    one of the special handles 0 (default stream), 1 (cudaStreamLegacy) and 2
    (cudaStreamPerThread); any other int is refused, as it cannot be checked. On the host
    backend every write is immediate (its compute is synchronous); as on a GPU, a close
    does not wait for the side items that had already started: they finish on their
    idle-priority worker threads beside whatever runs next.
    """

    def __init__(self, recorder: Recorder, executor: Any, check_open: Callable[[], None]) -> None:
        self._recorder = recorder
        self._ex = executor
        self._check_open = check_open

    def open(self, stream: Any = None) -> None:
        """Lets side work run from this point of `stream` on."""
        self._check_open()
        self._recorder.open_gate(stream)

    def close(self, stream: Any = None) -> None:
        """Stops side work from this point of `stream` on: running side kernels exit at
        their next item boundary and no new one starts."""
        self._check_open()
        self._recorder.close_gate(stream)

    @property
    def is_open(self) -> bool:
        """The gate's value now (on a GPU: after every write that has taken effect)."""
        self._check_open()
        return self._ex.gate_read() == _C.GATE_OPEN

    @property
    def seq(self) -> int:
        """Sequence number of the latest write that has taken effect."""
        return self._ex.gate_seq()

    @property
    def address(self) -> int:
        """Address of the gate word as kernels see it (a device pointer on CUDA)."""
        return self._ex.gate_address

    def __repr__(self) -> str:
        return f"Gate(open={self._ex.gate_read() == _C.GATE_OPEN})"
