"""The job queue's messages and their shapes.

Every message is a tuple whose first field names its kind. A verified message is still
checked against its kind's shape before anything acts on it, so a malformed one (a bug,
a version mismatch, a holder of the secret sending nonsense) is rejected with a reason
instead of raising inside a serving thread.

Every message travels over an authenticated connection (channel/), and the hub tells
the coordinator whose box it came from: a rank's ("fr-agent/<rank>") or an outside
client's ("fr-client/<random>"), or a status reader's ("fr-status/<random>": its hello,
status and bye only, which the hub builds from JSON). The coordinator acts on a message only where its fields
agree with its sender (a rank speaks for itself, a submitter names its own box and task
ids of its own prefix, see `task_prefix`).

To the coordinator:
    ("submit", task_id, spec_bytes, priority, reply_box)
    ("cancel", task_id)
    (a rank's stats are not a message: a frame of their own, pack_stats, that the hub keeps)
    ("state", task_id, rank, state, items_done, items_total | None, error | None,
        error_kind | None, result | None)
    ("handback", rank, [task_id, ...])
    ("closing", rank)       the rank is closing: place nothing more there
    ("gone", rank)          the rank's agent has stopped (after close, or abort)
    ("hello", reply_box)    an outside client connected
    ("status", reply_box, request, ticket | None)   asks for the task table, presenting
                            the ticket of the last table the box was sent (tickets.py:
                            unanswered without it, but for a box's first, or after a wait)
    ("bye", reply_box)      the client closed: send nothing more there
To a rank's agent or a client:
    ("run", task_id, spec_bytes, priority)
    ("cancel", task_id)
    ("update", task_id, state, rank | None, items_done, items_total | None, error | None,
        error_kind | None, result | None)
    ("lost", rank)          the queue declared `rank` lost (sent to the rank itself too,
                            if it is heard from again: it cancels what it runs)
    ("bye",)                every final state the coordinator will send has been sent
    ("status", request, ticket, rows)   the table, and the ticket the box's next request
                            presents
    ("closed",)             (to clients) the queue closed
`result` is the pickled result of a final "done" (TaskSpec.result "return" or a path).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from ..handle import FINAL_STATES

MAX_MESSAGE = 256 << 20  # bytes; the channel refuses a message of more parts than this fills
# The most a spec or a result may pickle to: room for the rest of its message.
MAX_PAYLOAD = MAX_MESSAGE - (1 << 20)


# A rank's stats, its heartbeat, travel as a frame of their own, not pickled: (bubble ns,
# longest bubble ns, free bytes or -1 for none, iterations). The hub keeps only each
# rank's latest, and the coordinator reads them all at once, so a job of thousands of
# ranks costs the leader a dictionary store per heartbeat, not a message to act on.
_STATS = struct.Struct("<QQqQ")
STATS_BYTES = _STATS.size
_U64 = (1 << 64) - 1


def _u64(v: int) -> int:
    return min(max(0, int(v)), _U64)


def pack_stats(bubble: int, longest: int, free: int | None, iterations: int) -> bytes:
    """A rank's stats as the frame its Link sends (free None: no memory budget)."""
    free_field = -1 if free is None else min(max(0, int(free)), (1 << 63) - 1)
    return _STATS.pack(_u64(bubble), _u64(longest), free_field, _u64(iterations))


def unpack_stats(raw: bytes) -> tuple[int, int, int | None, int] | None:
    """(bubble, longest, free | None, iterations), or None for a frame that is not
    stats (a wrong size, a negative free other than -1)."""
    if len(raw) != STATS_BYTES:
        return None
    bubble, longest, free, iterations = _STATS.unpack(raw)
    if free < -1:
        return None
    return bubble, longest, None if free == -1 else free, iterations


def spec_payload(spec: Any) -> bytes:
    """`spec` (a TaskSpec) pickled for "submit", or ValueError where the channel cannot
    carry it (it would drop the message, and the task would stay queued for ever)."""
    data = spec.dumps()
    if len(data) > MAX_PAYLOAD:
        raise ValueError(
            f"the spec pickles to {len(data)} bytes, more than the job queue carries "
            f"({MAX_PAYLOAD}): pass large inputs as fr.Load(...) placeholders, built where "
            "the task runs, or as paths"
        )
    return data


# A tuple: membership of an unhashable value (a fuzzed message) is False, not an error.
STATES = ("queued", "running", "paused", *sorted(FINAL_STATES))
ERROR_KINDS = ("failed", "cancelled", "rank_lost")


def agent_box(rank: int) -> str:
    return f"fr-agent/{rank}"


def rank_of(box: str) -> int | None:
    """The rank whose agent box `box` is; None for a client's."""
    if box.startswith("fr-agent/"):
        try:
            return int(box[len("fr-agent/") :])
        except ValueError:
            return None
    return None


def is_status_box(box: str) -> bool:
    """Whether `box` is a status reader's (it may only say hello, status and bye)."""
    return box.startswith("fr-status/")


def task_prefix(box: str) -> str:
    """What the ids of tasks submitted from `box` begin with: "<rank>:" for a rank,
    "c<random>:" for a client (its box's random name), so ids never collide and nobody
    names a task of another's."""
    rank = rank_of(box)
    if rank is not None:
        return f"{rank}:"
    return f"c{box.rsplit('/', 1)[-1]}:"


class Update(NamedTuple):
    """A task's state as its submitter hears it: the fields of an "update" message after
    the task id."""

    state: str
    rank: int | None
    done: int
    total: int | None
    error: str | None = None
    kind: str | None = None  # one of ERROR_KINDS, with an error
    result: bytes | None = None  # the pickled result, with a final "done"


class Malformed(ValueError):
    """A message that does not have its kind's shape."""


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _count(v: Any) -> bool:
    return _int(v) and v >= 0


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _str(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 4096


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _bytes(v: Any) -> bool:
    return isinstance(v, bytes)


def _state(v: Any) -> bool:
    return v in STATES


def _error_kind(v: Any) -> bool:
    return v is None or v in ERROR_KINDS


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(_str(x) for x in v)


def _rows(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _box(v: Any) -> bool:
    return _str(v) and v.startswith(("fr-agent/", "fr-client/", "fr-status/"))


_RANK = _count
_TO_COORD: dict[str, tuple[Callable[[Any], bool], ...]] = {
    "submit": (_str, _bytes, _int, _box),
    "cancel": (_str,),
    "state": (_str, _RANK, _state, _count, _opt(_count), _opt(_text), _error_kind, _opt(_bytes)),
    "handback": (_RANK, _ids),
    "closing": (_RANK,),
    "gone": (_RANK,),
    "hello": (_box,),
    "status": (_box, _int, _opt(_int)),
    "bye": (_box,),
}
_TO_AGENT: dict[str, tuple[Callable[[Any], bool], ...]] = {
    "run": (_str, _bytes, _int),
    "cancel": (_str,),
    "update": (
        _str,
        _state,
        _opt(_RANK),
        _count,
        _opt(_count),
        _opt(_text),
        _error_kind,
        _opt(_bytes),
    ),
    "lost": (_RANK,),
    "bye": (),
    "status": (_int, _int, _rows),
    "closed": (),
}


def _check(message: Any, shapes: dict[str, tuple[Callable[[Any], bool], ...]]) -> tuple:
    if not isinstance(message, tuple) or not message:
        raise Malformed(f"not a non-empty tuple: {type(message).__name__}")
    kind = message[0]
    shape = shapes.get(kind) if isinstance(kind, str) else None
    if shape is None:
        raise Malformed(f"unknown kind {kind!r}")
    if len(message) != len(shape) + 1:
        raise Malformed(f"{kind!r} takes {len(shape)} fields, got {len(message) - 1}")
    for i, (check, value) in enumerate(zip(shape, message[1:]), 1):
        if not check(value):
            raise Malformed(f"{kind!r} field {i} is not valid: {value!r:.80}")
    return message


def to_coordinator(message: Any) -> tuple:
    """`message` if it has the shape of a message to the coordinator, else Malformed."""
    return _check(message, _TO_COORD)


def to_agent(message: Any) -> tuple:
    """`message` if it has the shape of a message to an agent or client, else Malformed."""
    return _check(message, _TO_AGENT)
