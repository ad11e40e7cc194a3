"""The paired cost of harvesting, with its bootstrap interval: one definition for
`freeride demo`'s cost line and `freeride bench ranks`' rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_ROUNDS = 2000


@dataclass(frozen=True)
class PairedOverhead:
    """The median over step pairs of with / without - 1 (`median`), a bootstrap 95%
    interval of that median (`low`, `high`), and how many pairs it comes from."""

    median: float
    low: float
    high: float
    pairs: int

    @property
    def within_noise(self) -> bool:
        """The interval holds 0: the run cannot tell harvesting's cost from no cost."""
        return self.low <= 0.0 <= self.high


def paired_overhead(
    with_side: Sequence[float],
    without: Sequence[float],
    rng: np.random.Generator | None = None,
    rounds: int = BOOTSTRAP_ROUNDS,
) -> PairedOverhead:
    """Each harvesting step's time against the step without side work right after it
    (`with_side[i]` against `without[i]`; the longer list is cut to the shorter). Pairs
    of neighbouring steps cancel the machine's slow drifts, which on a shared virtual
    machine are larger than the effect measured. `rng` draws the bootstrap resamples
    (seeded 0 when None, so a run's figures are reproducible from its step times)."""
    n = min(len(with_side), len(without))
    if n < 1:
        raise ValueError("paired_overhead needs at least one pair of steps")
    ratios = np.asarray(with_side[:n], dtype=float) / np.asarray(without[:n], dtype=float) - 1.0
    rng = np.random.default_rng(0) if rng is None else rng
    resampled = rng.choice(ratios, size=(rounds, n))
    low, high = np.percentile(np.median(resampled, axis=1), [2.5, 97.5])
    return PairedOverhead(float(np.median(ratios)), float(low), float(high), n)
