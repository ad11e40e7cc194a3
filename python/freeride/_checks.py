"""Argument checks shared by the API: clear errors naming the argument and what was
expected, before anything reaches the core; memory sizes such as ``"8GiB"``."""

from __future__ import annotations

import math
import operator
import re
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


def check_bool(value: Any, name: str) -> bool:
    """A bool (numpy's too): bool() of a string or an array would read "no" as True, or
    raise numpy's ambiguity error naming no argument."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    """Seconds to wait: None or infinity (no limit, None), or a number >= 0. NaN, a
    negative number, a bool or a string would otherwise wait for ever or fail deep in a
    wait."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be None or a number of seconds, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be None or >= 0, got {value}")
    return None if math.isinf(value) else value


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
_MAX = 2**64 - 1


def parse_memory(value: int | str | None, name: str = "memory_budget") -> int:
    """Bytes from an int or a size string; None means unlimited and returns 0.

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB)
    powers of 1024.
    """
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of bytes or a size string, got a bool")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
        if value > _MAX:
            raise ValueError(f"{name} must fit in 64 bits, got {value}")
        return value
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be an int (bytes), a size string like '8GiB', or None; "
            f"got {type(value).__name__}"
        )
    match = _SIZE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{name}: cannot parse {value!r}; expected a size such as '8GiB', '512MB' or '1000000'"
        )
    nbytes = int(float(match.group(1)) * _UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if nbytes > _MAX:
        raise ValueError(f"{name} must fit in 64 bits, got {value!r}")
    return nbytes
