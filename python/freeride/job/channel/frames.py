"""How a message larger than one frame travels: in parts of at most FRAME_BYTES each.

Every socket of the channel refuses a frame larger than FRAME_BYTES (libzmq's
maxmsgsize, which holds for the transport handshake's command frames too), so nobody,
authenticated or not, makes the other end buffer more than that for one frame. A message
is the frames after its kind: at most MAX_PARTS of them, joined on arrival."""

from __future__ import annotations

from ..messages import MAX_MESSAGE

FRAME_BYTES = 64 << 10
# What a socket accepts per frame: a part of FRAME_BYTES, as Curve carries it (libzmq
# checks the encrypted frame, which adds its command name, nonce, flags and MAC).
WIRE_FRAME_BYTES = FRAME_BYTES + 1024
MAX_PARTS = -(-MAX_MESSAGE // FRAME_BYTES)


def split(payload: bytes) -> list[bytes | memoryview]:
    """`payload` as the parts a message carries (views, not copies)."""
    if len(payload) <= FRAME_BYTES:
        return [payload]
    view = memoryview(payload)
    return [view[i : i + FRAME_BYTES] for i in range(0, len(payload), FRAME_BYTES)]


def join(parts: list[bytes]) -> bytes:
    return parts[0] if len(parts) == 1 else b"".join(parts)


def fits(parts: list[bytes]) -> bool:
    """Whether `parts` are the parts of one message (not more than a message may be)."""
    return 1 <= len(parts) <= MAX_PARTS
