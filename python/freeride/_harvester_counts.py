"""What a Harvester reports of its launches and bubbles, as named tuples."""

from __future__ import annotations

from typing import NamedTuple


class LaunchCounts(NamedTuple):
    """Harvester.launch_counts(): the side launches so far."""

    launches: int  # launches whose end the executor took
    idle: int  # of those, launches that ran no item (a cancelled task's are not counted)
    at_opens: int  # of those, launches enqueued at stream-ordered opens (CUDA)
    idle_at_opens: int  # of those, launches at opens that ran no item (the same)
    # Stream-ordered opens that got no launch because it would have waited behind another
    # training stream's open (CUDA; gate writes are meant to come from one stream).
    skipped_at_opens: int = 0
    # The most launches at opens queued ahead of the GPU at once, not yet begun (CUDA): how
    # far ahead of the GPU the host runs, in bubbles.
    max_lookahead: int = 0
    # Stream-ordered opens that got no launch because that many were queued ahead already
    # (CUDA: FREERIDE_MAX_LOOKAHEAD, none by default).
    beyond_lookahead: int = 0
    # Launches at opens left out because the executor had launched for the same open
    # already, having seen it take effect first (CUDA: a GPU that had caught up with the
    # host; that launch serves the bubble). A follower's counts too.
    served_by_executor: int = 0


class BubbleStats(NamedTuple):
    """Harvester.bubble_stats(): the record's prediction of this device's bubbles."""

    per_iteration_ns: int
    longest_ns: int
    iterations: int
