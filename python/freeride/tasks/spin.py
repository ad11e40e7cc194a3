"""Spin: items that busy-wait a calibrated time. For tests and benchmarks."""

from __future__ import annotations

from .._C import spin_task
from .._checks import check_count
from ._base import BoundTask, Task, describe

# An item is the unit of preemption: the pause latency is one item's run time.
MAX_NS_PER_ITEM = 10**9


class Spin(Task):
    """`items` items per phase, each busy-waiting `ns_per_item` nanoseconds (on a GPU,
    every thread of the block waits on %globaltimer; on the host, a worker thread on
    the steady clock).

    `slice_blocks` > 0 makes the CUDA kernel the kernel-slicing baseline of the
    benchmarks (as in Tally or REEF): each launch is a slice of up to `slice_blocks`
    blocks, one item each, that never reads the gate, so a close waits for the whole
    slice. Pair it with ``Harvester(stream_wait=True)`` to hold slices behind stream
    waits. The host backend ignores it.
    """

    def __init__(
        self, items: int, ns_per_item: int, phases: int = 1, slice_blocks: int = 0
    ) -> None:
        self.items = check_count(items, "items")
        self.ns_per_item = check_count(ns_per_item, "ns_per_item", 0, MAX_NS_PER_ITEM)
        self.phases = check_count(phases, "phases")
        self.slice_blocks = check_count(slice_blocks, "slice_blocks", 0, 2**30)
        if self.items * self.phases > 2**63 - 1:
            raise ValueError("items * phases must fit in 63 bits")

    def _build(self, kind: str, device: int) -> BoundTask:
        return BoundTask(spin_task(self.items, self.phases, self.ns_per_item, self.slice_blocks))

    def __repr__(self) -> str:
        return describe(self, items=self.items, ns_per_item=self.ns_per_item, phases=self.phases)
