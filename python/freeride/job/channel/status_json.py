"""What a status session may say. Its messages are JSON, never a pickle (nothing a status
credential's holder sends runs on the leader), one part of at most STATUS_BYTES:
["hello"], ["bye"] or ["status", request, ticket] (ticket: an int, or null or left out
where the box has read no table: ../tickets.py)."""

from __future__ import annotations

import json

STATUS_BYTES = 4096  # the longest message a status session may send (JSON, one part)


def parse(box: str, payload: bytes) -> tuple | None:
    """The coordinator's message that `payload` from status box `box` stands for, or None
    for anything else. One list of at most three items, looked at before it is parsed:
    no nesting reaches the parser."""
    message = None
    if len(payload) <= STATUS_BYTES and payload.count(b"[") == 1 and b"{" not in payload:
        try:
            message = json.loads(payload)
        except Exception:  # noqa: BLE001 - whatever a holder of the key sends
            message = None
    if message in (["hello"], ["bye"]):
        return (message[0], box)
    if (
        isinstance(message, list)
        and len(message) in (2, 3)
        and message[0] == "status"
        and type(message[1]) is int
        and (len(message) == 2 or message[2] is None or type(message[2]) is int)
    ):
        return ("status", box, message[1], message[2] if len(message) == 3 else None)
    return None
