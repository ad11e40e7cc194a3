"""Argument checks shared by the API: clear errors naming the argument and what was
expected, before anything reaches the core."""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np


def check_count(value: Any, name: str, minimum: int = 1, maximum: int = 2**63 - 1) -> int:
    """An integer in [minimum, maximum]; counters are 64-bit, so item counts beyond
    32 bits are fine."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got a bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_float(value: Any, name: str) -> float:
    """A finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
