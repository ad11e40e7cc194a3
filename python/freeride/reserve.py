"""Reserve: the room side kernels leave free for training's own kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

    Two mechanisms keep that room (``Harvester.reserve_mechanism`` and
    ``backend_info()["reserve_mechanism"]`` say which one a harvester uses):

    ``"occupancy-cap"`` (the default): every side grid is capped per SM so that
    ``blocks`` blocks of the given shape still fit beside it, counted as the CUDA
    occupancy calculator counts (whole warps, registers per SM sub-partition, shared
    memory in allocation units). Cost: the built-in Spin kernel (128-thread blocks, 18
    registers per thread for sm_90) keeps 10 of 16 blocks per SM on an H100; kernels
    heavy on registers or shared memory lose more. A side kernel whose single block does not fit
    beside the reserve fails with a clear error. RawKernel's ``grid`` is capped the same
    way; the cap is not enforced on kernels that ignore freeride's grid sizing.

    ``"green-context"`` (opt-in, not yet run on a GPU by freeride; needs a CUDA 12.5 or
    later driver): the built-in side kernels run on a stream of a CUDA green context that
    holds every SM but ``sms`` whole ones, at full occupancy on the SMs it holds, so
    training's kernels always find those ``sms`` SMs free. Cost: the reserved SMs are lost
    to side work altogether (on an H100, 12 of 132 SMs, 9%, by default). RawKernel tasks
    stay on the primary context under the occupancy cap (launching CuPy-loaded functions
    into a green context's stream is not documented). Where the driver has no green
    contexts, the split fails or the green context's stream refuses one of the runtime
    calls side launches make (tried once when the harvester starts), the harvester falls
    back to the occupancy cap and ``Harvester.reserve_fallback`` says why.

    Args:
        blocks: blocks of that shape to keep room for on every SM (0: no reserve); with
            "green-context", for RawKernel tasks and the fallback.
        threads: threads per reserved block.
        registers_per_thread: registers per thread of a reserved block.
        shared_memory: shared memory per reserved block: bytes or a size string.
        mechanism: "occupancy-cap" or "green-context".
        sms: "green-context" only: SMs to leave out of the green context, at least; the
            driver partitions in steps (8 SMs on Hopper), so more may be left out. None:
            8 rounded up to the driver's step.
    """

    blocks: int = 1
    threads: int = 512
    registers_per_thread: int = 64
    shared_memory: int | str = "48KiB"
    mechanism: Literal["occupancy-cap", "green-context"] = "occupancy-cap"
    sms: int | None = None

    def __post_init__(self) -> None:
        check_count(self.blocks, "reserve.blocks", 0, 32)
        check_count(self.threads, "reserve.threads", 1, 2048)
        check_count(self.registers_per_thread, "reserve.registers_per_thread", 0, 255)
        if self.shared_memory != 0:
            shared = parse_memory(self.shared_memory, "reserve.shared_memory")
            if shared > 2**30:
                raise ValueError(f"reserve.shared_memory must be at most 1GiB, got {shared}")
        if self.mechanism not in MECHANISMS:
            raise ValueError(
                f"reserve.mechanism must be one of {', '.join(map(repr, MECHANISMS))}, "
                f"got {self.mechanism!r}"
            )
        if self.sms is not None:
            if self.mechanism != "green-context":
                raise ValueError("reserve.sms applies to mechanism='green-context' only")
            # The device's SM count is checked when a harvester builds the green context.
            check_count(self.sms, "reserve.sms", 1, 1024)

    @property
    def shared_bytes(self) -> int:
        """shared_memory in bytes."""
        return 0 if self.shared_memory == 0 else parse_memory(self.shared_memory)

    def as_tuple(self) -> tuple[int, int, int, int]:
        """(blocks, threads, registers_per_thread, shared bytes), as the extension takes it."""
        return (self.blocks, self.threads, self.registers_per_thread, self.shared_bytes)


MECHANISMS = ("occupancy-cap", "green-context")
DEFAULT_RESERVE = Reserve()
NO_RESERVE = Reserve(blocks=0)
