"""ItemCounter: a probe of the item protocol, for tests and the GPU protocol checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._C import item_counter_task
from .._checks import check_bool, check_count
from ._base import BoundTask, Task, describe, to_numpy, zeros
from .spin import MAX_NS_PER_ITEM


@dataclass
class ItemCounts:
    """What an ItemCounter saw: runs of each item, items finished per phase, and how
    many items started before the previous phase had completed."""

    counts: np.ndarray  # uint32 [phases, items]
    phase_done: np.ndarray  # uint64 [phases]
    violations: int
    # uint64 [phases, items, 2]: start and end of each item (steady-clock ns on the host
    # backend, %globaltimer ns on a GPU; 0 for items that did not run), if recorded
    times: np.ndarray | None = None


class ItemCounter(Task):
    """Every item adds one to its own counter (and optionally spins `ns_per_item`), and
    checks that the previous phase had completed when it started. After any pattern of
    pauses and cancels, every counter must be 0 or 1, and all 1 for a finished task.
    `fail_at=(phase, item)` makes that item raise (host backend only), to test failures;
    `record_times` keeps every item's start and end time."""

    def __init__(
        self,
        items: int,
        phases: int = 1,
        ns_per_item: int = 0,
        fail_at: tuple[int, int] | None = None,
        record_times: bool = False,
    ) -> None:
        self.items = check_count(items, "items", 1, 2**31)
        self.phases = check_count(phases, "phases", 1, 2**16)
        self.ns_per_item = check_count(ns_per_item, "ns_per_item", 0, MAX_NS_PER_ITEM)
        if self.items * self.phases > 2**28:
            raise ValueError("items * phases must be at most 2**28 (one uint32 counter each)")
        if fail_at is not None:
            if not isinstance(fail_at, tuple) or len(fail_at) != 2:
                raise TypeError("fail_at must be None or a (phase, item) tuple")
            fail_at = (
                check_count(fail_at[0], "fail_at[0]", 0, self.phases - 1),
                check_count(fail_at[1], "fail_at[1]", 0, self.items - 1),
            )
        self.fail_at = fail_at
        self.record_times = check_bool(record_times, "record_times")
        self._last = None

    def _memory_need(self, kind: str, device: int) -> int:
        return (4 + 16 * self.record_times) * self.items * self.phases + 8 * self.phases + 8

    def _work(self) -> tuple[int, int]:
        return self.phases, self.items

    def _build(self, kind: str, device: int) -> BoundTask:
        counts, counts_ptr = zeros((self.phases, self.items), "uint32", kind, device)
        phase_done, phase_done_ptr = zeros((self.phases,), "uint64", kind, device)
        violations, violations_ptr = zeros((1,), "uint64", kind, device)
        times, times_ptr = None, 0
        if self.record_times:
            times, times_ptr = zeros((self.phases, self.items, 2), "uint64", kind, device)
        fail_phase, fail_item = self.fail_at if self.fail_at is not None else (-1, -1)
        core = item_counter_task(
            self.items,
            self.phases,
            counts_ptr,
            phase_done_ptr,
            violations_ptr,
            times_ptr,
            self.ns_per_item,
            fail_phase,
            fail_item,
        )
        core.memory_bytes = self._memory_need(kind, device)

        def read() -> ItemCounts:
            return ItemCounts(
                to_numpy(counts),
                to_numpy(phase_done),
                int(to_numpy(violations)[0]),
                None if times is None else to_numpy(times),
            )

        built = BoundTask(core, read, keep=(counts, phase_done, violations, times))
        self._last = built
        return built

    def snapshot(self) -> ItemCounts:
        """The counters of the latest submission, whatever the task's state."""
        if self._last is None:
            raise RuntimeError("ItemCounter was not submitted yet")
        return self._last.result()

    def __repr__(self) -> str:
        return describe(self, items=self.items, phases=self.phases, ns_per_item=self.ns_per_item)
