"""How often the job queue's ends show they are alive, by the job's size.

Each rank sends its stats (its heartbeat) every `every(ranks, rank_timeout)` seconds:
100 ms in a small job, and in a large one as often as keeps the leader at about
MESSAGES_PER_S stats a second (so a job of 4,096 ranks costs the leader what one of 500
does), never less often than five times per rank_timeout. The hub beats to each session it
sent nothing else half as often (`beat_every`). The default rank_timeout grows with the job past 500
ranks, so that a rank is declared lost only after several missed beats."""

from __future__ import annotations

MESSAGES_PER_S = 500
_SHORTEST_S = 0.1
_BEATS_PER_TIMEOUT = 5


def rank_timeout(ranks: int) -> float:
    """The default rank_timeout for a job of `ranks` ranks: 5 s, more past 500 ranks (41 s
    at 4,096)."""
    return max(5.0, ranks / 100)


def every(ranks: int, rank_timeout: float) -> float:
    """Seconds between a rank's stats (its liveness) in a job of `ranks` ranks."""
    return min(max(_SHORTEST_S, ranks / MESSAGES_PER_S), rank_timeout / _BEATS_PER_TIMEOUT)


def beat_every(ranks: int, rank_timeout: float) -> float:
    """Seconds the hub lets pass without a frame to a rank: twice the stats interval, so
    half the leader's liveness frames are beats. With the hub's sweep every quarter beat
    a rank hears the hub at least every half rank_timeout."""
    return 2 * every(ranks, rank_timeout)
