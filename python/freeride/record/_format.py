"""Text and JSON helpers shared by the report's renderings (report, trace, plot)."""

from __future__ import annotations

import math
from typing import Any

# Written into every dict and trace a report produces, so that readers can tell versions.
FORMAT = "freeride.report/1"


def fmt_ns(ns: float) -> str:
    """A duration in the largest unit that keeps it >= 1 (ns, us, ms, s)."""
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3f} us"
    return f"{ns:.0f} ns"


def pct(num: float, den: float) -> float:
    return 100.0 * num / den if den else 0.0


def where(device: str, backend: str, rank: int | None) -> str:
    """The words naming a report's origin, in its summary and its timeline's title."""
    return f"{device} (backend {backend}, rank {'-' if rank is None else rank})"


def jsonable(value: Any) -> Any:
    """`value` with anything json cannot write (torch.device, paths, sets) turned into str,
    so that free-form settings never make to_dict unserialisable."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # NaN/inf are not JSON; a report must load in strict parsers (Perfetto, browsers).
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)
