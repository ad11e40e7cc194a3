"""How often the job queue's ends show they are alive, by the job's size.

Each rank sends its stats (its heartbeat) and the hub beats to each session it sent
nothing else, every `every(ranks, rank_timeout)` seconds: 100 ms in a small job, and in a
large one as often as keeps the leader at about MESSAGES_PER_S liveness messages each
way (so a job of 4,096 ranks costs the leader what one of 1,000 does), never less often
than five times per rank_timeout. The default rank_timeout grows with the job past 1,000
ranks, so that a rank is declared lost only after several missed beats."""

from __future__ import annotations

MESSAGES_PER_S = 1000
_SHORTEST_S = 0.1
_BEATS_PER_TIMEOUT = 5


def rank_timeout(ranks: int) -> float:
    """The default rank_timeout for a job of `ranks` ranks: 5 s, more past 1,000 ranks
    (20 s at 4,096)."""
    return max(5.0, ranks / 200)


def every(ranks: int, rank_timeout: float) -> float:
    """Seconds between one end's liveness messages in a job of `ranks` ranks."""
    return min(max(_SHORTEST_S, ranks / MESSAGES_PER_S), rank_timeout / _BEATS_PER_TIMEOUT)
