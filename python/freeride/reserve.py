"""Reserve: the room side kernels leave free for training's own kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._checks import check_count, parse_memory


@dataclass(frozen=True)
class Reserve:
    """What side kernels leave free for the kernels training launches while side work
    runs (NCCL's send/recv during a bubble, a stage's receive, the first kernels of the
    next compute), so that those start at once instead of waiting for side blocks.

    A persistent side grid at full occupancy leaves such a kernel no room: it would start
    only when side work stops (or its time slice ends), and a gate close ordered behind it
    on the training stream would wait as long.

    Two mechanisms keep that room (``Harvester.reserve_mechanism`` and
    ``backend_info()["reserve_mechanism"]`` say which one a harvester uses):

    ``"green-context"`` (the default where the driver offers it: CUDA 12.5 or later):
    the built-in side kernels run on a lowest-priority stream of a CUDA green context that
    holds every SM but ``sms`` whole ones, at full occupancy on the SMs it holds, so
    training's kernels always find those SMs free, however large their blocks. Cost: the
    SMs left out are lost to side work altogether (on an H100, 12 of 132, 9%, by default).
    RawKernel tasks stay on the primary context under the occupancy cap below (launching
    CuPy-loaded functions into a green context's stream is not documented), with their
    grids also limited to the green context's SM count; the block scheduler may still
    place some of their blocks on the SMs left out, so a large kernel of training's can
    find those SMs partly taken (each keeps room for ``blocks`` blocks of the reserve's
    shape). Where the
    driver has no green contexts, the split fails or the green context's stream refuses
    one of the runtime calls side launches make (tried once when the harvester starts),
    the harvester falls back to the occupancy cap and ``Harvester.reserve_fallback`` says
    why.

    ``"occupancy-cap"``: every side grid is capped per SM so that ``blocks`` blocks of the
    given shape still fit beside it on every SM, counted as the CUDA occupancy calculator
    counts (whole warps, registers per SM sub-partition, shared memory in allocation
    units). The default shape, 512 threads with 64 registers each and 48 KiB of shared
    memory, is a mid-sized communication block. NCCL's own kernels are larger: those of
    NCCL 2.32 for sm_90 use 96 registers per thread, 37 KiB of static plus 80 KiB of
    dynamic shared memory and up to 640 threads per block, nearly a whole SM, so under
    the cap such a block may wait for side blocks to leave (at most one item after the
    gate closes, one time slice while it stays open); only whole SMs (green context) give
    it room at once. Cost: the built-in Spin kernel (128-thread blocks, 23 registers per
    thread for sm_90 with nvcc 13.0) keeps 10 of 16 blocks per SM on an H100; kernels heavy on registers
    or shared memory lose more. A side kernel whose single block does not fit beside the
    reserve fails with a clear error. RawKernel's ``grid`` is capped the same way; the cap
    is not enforced on kernels that ignore freeride's grid sizing.

    Args:
        blocks: blocks of that shape to keep room for on every SM (0: no reserve); with
            "green-context", for RawKernel tasks and the fallback.
        threads: threads per reserved block.
        registers_per_thread: registers per thread of a reserved block.
        shared_memory: shared memory per reserved block: bytes or a size string.
        mechanism: "green-context" (falls back to the cap where unavailable) or
            "occupancy-cap".
        sms: "green-context" only: SMs to leave out of the green context, at least; the
            driver partitions in steps (8 SMs on Hopper), so more may be left out. None:
            8 rounded up to the driver's step (12 of an H100's 132: the context takes
            120). Each SM left out holds one NCCL block, and NCCL launches one block per
            channel: a pipeline's send/recv kernels whose channels outnumber the SMs left
            out (``NCCL_DEBUG=INFO`` prints the channel counts; ``NCCL_MAX_P2P_NCHANNELS``
            sets them) wait with their remaining blocks for side blocks to leave: at most
            one item after the gate closes, at most one ``time_slice`` while it stays open
            (with ``time_slice=None``, until it closes). Raise ``sms`` to the channel
            count to have none wait.
    """

    blocks: int = 1
    threads: int = 512
    registers_per_thread: int = 64
    shared_memory: int | str = "48KiB"
    mechanism: Literal["green-context", "occupancy-cap"] = "green-context"
    sms: int | None = None

    def __post_init__(self) -> None:
        check_count(self.blocks, "reserve.blocks", 0, 32)
        check_count(self.threads, "reserve.threads", 1, 1024)  # CUDA's largest block
        check_count(self.registers_per_thread, "reserve.registers_per_thread", 0, 255)
        if isinstance(self.shared_memory, bool) or not isinstance(self.shared_memory, (int, str)):
            raise TypeError(
                "reserve.shared_memory must be bytes (an int) or a size string such as "
                f"'48KiB', got {type(self.shared_memory).__name__}"
            )
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


MECHANISMS = ("green-context", "occupancy-cap")
DEFAULT_RESERVE = Reserve()
NO_RESERVE = Reserve(blocks=0, mechanism="occupancy-cap")
