"""What a harvester's close abandoned (side launches still enqueued or running on the GPU
past its deadline), kept until the GPU has passed it.

A launch left on the GPU may still write its task's buffers and the slots, streams and
green context its backend held for it: none of that may be freed or handed out again
while it may run, or training's allocator could give the memory to training and a late
side kernel would write into it. So the task handles (their buffers) and the executor (its
backend) are kept here; whenever a harvester is made or closed, each executor is asked
whether the GPU has passed its launches since (``reclaim_abandoned``: a question to the
driver, nothing enqueued), and what it says is passed is let go. A process that abandons a
launch every epoch therefore holds only the launches not yet passed, not every one it ever
abandoned.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_kept: list[tuple[Any, list[Any]]] = []


def keep(executor: Any, handles: list[Any]) -> None:
    """Keeps `executor` (closed) and the handles of its abandoned tasks until the GPU has
    passed its launches."""
    with _lock:
        _kept.append((executor, handles))


def release_passed() -> int:
    """Lets go of every kept executor whose launches the GPU has passed (and of its
    handles); how many are still kept."""
    with _lock:
        entries = list(_kept)
    gone = [entry for entry in entries if passed(entry[0])]
    with _lock:
        for entry in gone:
            _kept.remove(entry)
        return len(_kept)


def kept() -> int:
    """How many closed executors are kept for launches the GPU has not yet passed."""
    with _lock:
        return len(_kept)


def passed(executor: Any) -> bool:
    """Whether the GPU has passed every launch `executor` (closed) left; False where it
    cannot say (a broken context: its device cannot even be made current)."""
    try:
        return bool(executor.reclaim_abandoned())
    except RuntimeError:  # it cannot say: keep it, as its launches' fate is unknown
        return False
