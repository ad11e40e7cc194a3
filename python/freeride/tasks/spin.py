"""Spin: items that busy-wait a calibrated time. For tests and benchmarks."""

from __future__ import annotations

from typing import Any

from .. import _C
from ._base import Built, Task, check_count, describe

# An item is the unit of preemption: the pause latency is one item's run time.
MAX_NS_PER_ITEM = 10**9


class Spin(Task):
    """`items` items per phase, each busy-waiting `ns_per_item` nanoseconds (on a GPU,
    every thread of the block waits on %globaltimer; on the host, a worker thread on
    the steady clock)."""

    def __init__(self, items: int, ns_per_item: int, phases: int = 1) -> None:
        self.items = check_count(items, "items")
        self.ns_per_item = check_count(ns_per_item, "ns_per_item", 0, MAX_NS_PER_ITEM)
        self.phases = check_count(phases, "phases")
        if self.items * self.phases > 2**63 - 1:
            raise ValueError("items * phases must fit in 63 bits")

    def _build(self, harvester: Any) -> Built:
        return Built(_C.spin_task(self.items, self.phases, self.ns_per_item))

    def __repr__(self) -> str:
        return describe(self, items=self.items, ns_per_item=self.ns_per_item, phases=self.phases)
