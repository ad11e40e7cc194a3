"""Table tickets: how the leader knows a box read its last task table before it sends
another.

Every table the coordinator sends carries a fresh random ticket, and the box's next table
request must present it. ZeroMQ keeps what a connection has not read at the hub (up to
its high-water mark, 1,000 messages, each table up to thousands of rows), and a ticket is
in nothing but the table it came with: a peer that asks without end and never reads has
one table queued towards it, not one a request. A request without the ticket is not
answered, and counted.

A reader can lose a table through no fault of its own: the hub drops a table whose box's
session ended before it went out (silent for a minute, or pushed out by the cap on status
sessions), and a Link that reconnects takes its routing id over to the new connection
(ROUTER_HANDOVER), losing what the old one had queued. So a box whose last table went
`WAIVE_S` ago or more is answered without its ticket. Each waiver in a row (no right
ticket presented in between) doubles the wait for the next: in t seconds a box that never
reads is sent at most 1 + log2(1 + t / WAIVE_S) tables (17 in a day), while a reader that
lost a table waits WAIVE_S once and is back to its tickets at the next table it reads.

The state is kept for the latest `KEEP` boxes sent a table. A box is a connection's for
as long as the hub remembers it (its live sessions, and the latest 4,096 ended ones,
whose Links get their boxes back), so a box's state is forgotten only once thousands of
other boxes were sent tables since, and a connection cannot clear its own by asking
again; a forgotten box's next request needs no ticket, as a new box's.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

WAIVE_S = 1.0
KEEP = 8192  # twice the boxes the hub remembers (its ended sessions', plus live ones)


class _Box:
    __slots__ = ("sent", "ticket", "waivers")

    def __init__(self) -> None:
        self.ticket = 0
        self.sent = 0.0
        self.waivers = 0


class Tickets:
    """The ticket of the last table sent each box, when it went, and the waivers in a row
    it was given since a right ticket. Used from the coordinator's thread alone."""

    def __init__(self, keep: int = KEEP, waive_s: float = WAIVE_S) -> None:
        self._boxes: OrderedDict[str, _Box] = OrderedDict()
        self._keep = keep
        self._waive_s = waive_s
        self.refused = 0  # table requests not answered: no right ticket, and too soon

    def admits(self, box: str, ticket: int | None, now: float) -> bool:
        """Whether a table request of `box` presenting `ticket` (None: none) may be
        answered: its box was never sent a table (or is forgotten), it presents the
        ticket of the last one, or the waiver's wait is over. A refusal is counted."""
        state = self._boxes.get(box)
        if state is None:
            return True
        if ticket is not None and ticket == state.ticket:
            state.waivers = 0
            return True
        if now - state.sent >= self._waive_s * 2**state.waivers:
            state.waivers += 1
            return True
        self.refused += 1
        return False

    def issue(self, box: str, now: float) -> int:
        """A fresh ticket for the table about to be sent to `box`, which its next request
        must present."""
        state = self._boxes.pop(box, None) or _Box()
        state.ticket = secrets.randbits(63)
        state.sent = now
        self._boxes[box] = state  # the latest served last: the oldest is forgotten first
        while len(self._boxes) > self._keep:
            self._boxes.popitem(last=False)
        return state.ticket

    def sent_at(self, box: str) -> float | None:
        """When `box`'s last table went (None: never, or forgotten)."""
        state = self._boxes.get(box)
        return None if state is None else state.sent

    def forget(self, box: str) -> None:
        """Forgets `box` (one nothing is sent to again)."""
        self._boxes.pop(box, None)

    def __len__(self) -> int:
        return len(self._boxes)
