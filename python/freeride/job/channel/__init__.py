"""The job queue's message channel: the leader's Hub (a ZeroMQ ROUTER socket) and a Link
(a DEALER socket) for each rank and each outside client, over CurveZMQ.

The leader owns the queue's state: every message goes to it or comes from it, over a
connection only the two ends can read or write, so nothing anyone else sends can change
what it counts, whom it hears from or where a reply goes. Why this shape and not a shared
key-value store: a store's keys (counters, boxes, beats) can be written by whoever
reaches its port, and one bad write could break the connection the whole queue shared.

- CurveZMQ encrypts and authenticates every frame of a connection (pyzmq bundles it:
  nothing more to install). A Link pins the hub's public key, shared over the queue's own
  gloo group or written in its secret file, so a server without the hub's private key
  cannot even finish the transport handshake: it never sees a byte of the queue's.
- Each of the three credentials (a rank's, a client's, a status reader's; auth.py)
  yields a Curve key pair of its own, and the hub's ZAP handler (zap.py) lets a
  connection finish the transport handshake only under one of those three keys, tagged
  with its kind. A peer without a credential therefore never gets a frame to the hub's
  thread, and a connection can never act as more than its key's kind.
- On that, a connection names its role (a rank, a client, a status reader) with its
  nonce and is authenticated by mutual challenge and response under that role's
  credential; a Link sends nothing but its nonce and role before the hub has proved it
  holds the credential too. A rank's box is never handed to a second session while the
  first is heard from. A status session's messages are JSON, never unpickled.
- A Link picks a random 128-bit routing id, which travels inside Curve's encrypted
  handshake: the hub keys its sessions by it (a reconnect of the same Link keeps its
  session and takes over a half-open connection at once: ROUTER_HANDOVER), and gives each
  outside client a box of its own with a random name.
- Nothing from a connection that has not authenticated is unpickled or kept: handshake
  frames have fixed shapes and sizes, anything else is dropped (answered "who" at most
  once a second, so a Link whose session the hub lost authenticates again). Every frame is
  at most 64 KiB (frames.py), before and after authentication. At most `_MAX_PENDING`
  handshakes (more for a job of many ranks) wait at once, each at most `_HANDSHAKE_S`; a
  new one pushes out the oldest, and the proof of a handshake pushed out is answered
  "who". Hellos are answered at most 4 times a second per connection, and 2,000 a second
  in all after a burst. A Link that is not welcomed says hello again after a backoff with
  jitter, so handshakes lost to a crowd (a job of thousands of ranks starting at once)
  are retried, not waited for until the timeout.
- Sessions end: a client's at its bye (the coordinator drops it) or after
  `_CLIENT_IDLE_S` without a frame; a client Link that comes back later with the same
  routing id gets its box back (the last `_REMEMBERED` are remembered; after a bye too,
  so that a connection cannot make itself new boxes, each a first task table asked for
  without a ticket: ../tickets.py), and what it sent
  before it noticed (up to `_HELD_MESSAGES`) is delivered once it has authenticated
  again, never before.
- One thread owns each socket. Sends never wait: what a peer does not read within its
  queue is dropped and counted, so no peer can stall the hub.
- Liveness is what the leader observes, at a cost that does not grow with time: the hub
  notes when it last heard from each session (a Link that has sent nothing for its ping
  interval pings), and sends a beat only to a session it sent nothing else for a beat
  (liveness.py sets both by the job's size), which is how Links notice a silent leader.
  A rank's stats are a fixed frame the hub keeps (the latest per rank) for the
  coordinator to read in bulk. The kernel closes dead connections (TCP_USER_TIMEOUT,
  keepalive). Nobody else can move either clock.

Not protected: anyone who reaches the port can open connections (each costs a descriptor
of the leader's process for at most the transport handshake's 5 s, and at most one frame
of 64 KiB: the hub raises the process's soft limit on descriptors to its hard limit), and
anyone on the path can drop or delay the queue's packets.

sockets.py  pyzmq, addresses, socket limits, the waker and a socket owner's loop
frames.py   messages in parts of at most 64 KiB
zap.py      the ZAP handler: which Curve keys may connect, and as what
hub.py      Hub, the leader's end
link.py     Link, a rank's or client's end
"""

from .hub import BEAT_S, Hub
from .link import Link
from .sockets import raise_descriptor_limit, resolve

__all__ = ["BEAT_S", "Hub", "Link", "raise_descriptor_limit", "resolve"]
