"""Reserve: the room side kernels leave free on every SM for training's own kernels."""

from __future__ import annotations

from dataclasses import dataclass

from ._units import parse_memory
from .tasks._base import check_count


@dataclass(frozen=True)
class Reserve:
    """What side kernels leave free on every SM of the GPU, so that the kernels training
    launches while side work runs (NCCL's send/recv during a bubble, a stage's receive,
    the first kernels of the next compute) start at once instead of waiting for side
    blocks to finish.

    A persistent side grid at full occupancy leaves such a kernel no room: it would start
    only when side work stops, and a gate close ordered behind it on the training stream
    would never come. The default fits one NCCL-class block per SM: 512 threads with 64
    registers each and 48 KiB of shared memory.

    Cost: side grids are capped per SM (for the built-in Spin kernel, 128-thread blocks,
    12 of 16 blocks per SM on an H100); kernels heavy on registers or shared memory lose
    more. A side kernel whose single block does not fit beside the reserve fails with a
    clear error. The mechanism is an occupancy cap on every side launch (also for
    RawKernel, whose `grid` is capped the same way); it is not enforced on kernels that
    ignore freeride's grid sizing.

    Args:
        blocks: blocks of that shape to keep room for on every SM (0: no reserve).
        threads: threads per reserved block.
        registers_per_thread: registers per thread of a reserved block.
        shared_memory: shared memory per reserved block: bytes or a size string.
    """

    blocks: int = 1
    threads: int = 512
    registers_per_thread: int = 64
    shared_memory: int | str = "48KiB"

    def __post_init__(self) -> None:
        check_count(self.blocks, "reserve.blocks", 0, 32)
        check_count(self.threads, "reserve.threads", 1, 2048)
        check_count(self.registers_per_thread, "reserve.registers_per_thread", 0, 255)
        if self.shared_memory != 0:
            shared = parse_memory(self.shared_memory, "reserve.shared_memory")
            if shared > 2**30:
                raise ValueError(f"reserve.shared_memory must be at most 1GiB, got {shared}")

    @property
    def shared_bytes(self) -> int:
        """shared_memory in bytes."""
        return 0 if self.shared_memory == 0 else parse_memory(self.shared_memory)

    def as_tuple(self) -> tuple[int, int, int, int]:
        """(blocks, threads, registers_per_thread, shared bytes), as the extension takes it."""
        return (self.blocks, self.threads, self.registers_per_thread, self.shared_bytes)


DEFAULT_RESERVE = Reserve()
NO_RESERVE = Reserve(blocks=0)
