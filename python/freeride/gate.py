"""The gate: the per-device word that says whether side work may run, and its one writer.

Every write goes through Gate.write(), whoever asks for it (h.gate, h.bubble(),
h.compute(), h.iteration(), a schedule's hooks): it numbers the write, remembers which
bubble slot an open starts, and takes the timestamps the bubble record asks for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._C import GATE_CLOSED, GATE_OPEN, IMMEDIATE
from ._streams import current_stream, stream_handle

_SEQ_MASK = 2**32 - 1
# slot_of() of a gate opened by hand, outside the bubbles of recorded iterations.
MANUAL_BUBBLE = -1
# Opens whose slot slot_of() answers (the iterative runner asks of the current one): the
# latest half to all of these.
_KEEP_SLOTS = 4096


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

    def __init__(
        self, executor: Any, kind: str, device: int, check_open: Callable[[], None]
    ) -> None:
        self._ex = executor
        self._kind = kind
        self._cuda = kind == "cuda"
        self._device = device
        self._check_open = check_open
        self._seq = 0
        self._seq_slot: dict[int, int] = {}  # sequence number of an open -> bubble slot
        self.written_open = True  # the value of the latest write, in stream order

    def open(self, stream: Any = None) -> None:
        """Lets side work run from this point of `stream` on."""
        self._check_open()
        self.write(GATE_OPEN, stream)

    def close(self, stream: Any = None) -> None:
        """Stops side work from this point of `stream` on: running side kernels exit at
        their next item boundary and no new one starts."""
        self._check_open()
        self.write(GATE_CLOSED, stream)

    def write(
        self,
        value: int,
        stream: Any,
        mark: bool = False,
        slot: int | None = None,
        launch: bool = True,
    ) -> int:
        """Writes `value` on `stream`; with `mark`, also returns a timestamp mark of when
        the write took effect (0 where none can be taken): after a close (side work has
        stopped), before an open (side work has not resumed), so recorded compute
        intervals contain no side work and bubbles hold all of it. `slot`: the bubble slot
        an open starts (none: a manual bubble), known to slot_of() before the write, so
        the iterative runner never sees the new gate value without it. `launch` (CUDA, a
        stream-ordered open): the open enqueues the running side task's launch for its
        bubble right away, in the GPU's queues ahead of what training enqueues next; False
        where the bubble is known to be too short to pay for one."""
        # The training thread writes twice around every compute action: locals, and the
        # common stream=None without check_stream's tests (None passes them all).
        self._seq = seq = (self._seq + 1) & _SEQ_MASK
        opening = value == GATE_OPEN
        if opening:
            seq_slot = self._seq_slot
            seq_slot[seq] = MANUAL_BUBBLE if slot is None else slot
            if len(seq_slot) > _KEEP_SLOTS:
                self._forget_oldest_slots()
        if stream is None:
            handle = current_stream(self._device) if self._cuda else IMMEDIATE
        else:
            handle = stream_handle(stream, self._kind, self._device)
        # One call for the capture query, the mark and the write: the mark is 0 where the
        # write is captured into a CUDA graph (every replay writes the gate, but an event
        # recorded in a capture is no point of the stream's timeline).
        mark_id = 0
        if mark:
            mark_id = self._ex.gate_write_marked(value, handle, seq, launch)
        else:
            self._ex.gate_write(value, handle, seq, launch)
        self.written_open = opening
        return mark_id

    def _forget_oldest_slots(self) -> None:
        for key in list(self._seq_slot)[: _KEEP_SLOTS // 2]:
            del self._seq_slot[key]

    def slot_of(self, seq: int) -> int | None:
        """Bubble slot opened by the write with sequence number `seq`: MANUAL_BUBBLE for
        an open outside recorded iterations (h.bubble(), h.gate.open()), None for a close
        (or a write this gate did not make)."""
        return self._seq_slot.get(seq)

    @property
    def is_open(self) -> bool:
        """The gate's value now (on a GPU: after every write that has taken effect)."""
        self._check_open()
        return self._ex.gate_read() == GATE_OPEN

    @property
    def seq(self) -> int:
        """Sequence number of the latest write that has taken effect."""
        return self._ex.gate_seq()

    @property
    def write_mechanism(self) -> str:
        """How a stream-ordered write reaches the gate: "batch", "memop", "copy" or
        "kernel" on CUDA (FREERIDE_GATE_WRITE and what the driver offers; see
        fr.backend_info()), "host" on the host backend."""
        return str(self._ex.gate_write_mechanism)

    @property
    def write_fences(self) -> str | None:
        """With "batch" writes: which of a write's parts wait for the stream's earlier
        writes ("all": every part keeps its memory fence); None with every other
        mechanism."""
        return str(self._ex.gate_write_fences) or None

    @property
    def address(self) -> int:
        """Address of the gate word as kernels see it (a device pointer on CUDA)."""
        return self._ex.gate_address

    def __repr__(self) -> str:
        return f"Gate(open={self._ex.gate_read() == GATE_OPEN})"
