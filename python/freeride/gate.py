"""The gate: the per-device word that says whether side work may run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _C
from ._streams import stream_handle


class Gate:
    """Open: side work may run. Closed: no side item starts.

    Writes are stream-ordered: ``close(stream)`` takes effect when the GPU reaches that
    point of `stream`, not when the host calls it. ``stream=None`` means the current
    stream of the harvester's device; ``stream="host"`` writes immediately. On the host
    backend every write is immediate (its compute is synchronous).
    """

    def __init__(
        self, executor: _C.Executor, kind: str, device: int, check_open: Callable[[], None]
    ) -> None:
        self._ex = executor
        self._kind = kind
        self._device = device
        self._check_open = check_open

    def open(self, stream: Any = None) -> None:
        """Lets side work run from this point of `stream` on."""
        self._write(_C.GATE_OPEN, stream)

    def close(self, stream: Any = None) -> None:
        """Stops side work from this point of `stream` on: running side kernels exit at
        their next item boundary and no new one starts."""
        self._write(_C.GATE_CLOSED, stream)

    @property
    def is_open(self) -> bool:
        """The gate's value now (on a GPU: after every write that has taken effect)."""
        self._check_open()
        return self._ex.gate_read() == _C.GATE_OPEN

    @property
    def address(self) -> int:
        """Address of the gate word as kernels see it (a device pointer on CUDA)."""
        return self._ex.gate_address

    @property
    def seq(self) -> int:
        """Sequence number of the latest write that has taken effect."""
        return self._ex.gate_seq()

    def _write(self, value: int, stream: Any, seq: int = 0) -> None:
        self._check_open()
        self._ex.gate_write(value, stream_handle(stream, self._kind, self._device), seq)

    def __repr__(self) -> str:
        return f"Gate(device={'cpu' if self._kind == 'host' else f'cuda:{self._device}'})"
