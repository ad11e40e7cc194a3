"""What a long run samples of its own process to find leaks: resident memory, threads and
open file descriptors, and how a series of samples drifts."""

from __future__ import annotations

import os

WARMUP_SHARE = 0.1  # the part of the run before the "after warm-up" sample
WINDOW_SHARE = 0.2  # drift: max over the last 20% - max over the 20% after warm-up


def sample() -> dict[str, float]:
    """This process's resident memory (MiB), threads and open file descriptors."""
    rss_kib = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
                break
    return {
        "rss_mib": rss_kib / 1024,
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def fd_kinds() -> dict[str, int]:
    """This process's open file descriptors by kind: socket, pipe, anon_inode:[eventfd],
    a file's path..."""
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        kind = target.split(":[")[0] if target.startswith(("socket:", "pipe:")) else target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def difference(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What changed between two fd_kinds() (after - before), kinds that did not left out."""
    keys = sorted(set(before) | set(after))
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) != before.get(k, 0)
    }


def drift(series: list[dict[str, float]], key: str, seconds: float) -> dict[str, float]:
    """`key` after warm-up and at the end, and max over the last WINDOW_SHARE of the run
    minus max over the WINDOW_SHARE after the warm-up (WARMUP_SHARE)."""
    warm_end = WARMUP_SHARE * seconds
    after = [s for s in series if s["t_s"] >= warm_end] or series[-1:]
    first = [s[key] for s in after if s["t_s"] <= warm_end + WINDOW_SHARE * seconds]
    last = [s[key] for s in series if s["t_s"] >= (1 - WINDOW_SHARE) * seconds]
    first = first or [after[0][key]]
    last = last or [series[-1][key]]
    return {
        "after_warmup": after[0][key],
        "end": series[-1][key],
        "drift": max(last) - max(first),
    }
