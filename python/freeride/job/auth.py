"""The job queue's credentials and the proofs built on them.

Roles are credentials, not claims. Three, each derived from the one before by HMAC (so
none yields the one it came from):

- the job's secret, which the leader makes and shares only with the job's ranks (over
  their gloo group): the ranks' credential;
- the client credential (`client_credential`, what the secret file carries): outside
  clients submit, cancel their own tasks and ask for status;
- the status credential (`status_credential`, what a status file carries): it may only
  ask for the task table, and nothing it sends is unpickled.

Each credential yields a CurveZMQ key pair of its own (`curve_keys`): the hub's ZAP
handler accepts a connection only under one of the three public keys and tags it with
that role's kind, so a peer without a credential never finishes the transport handshake
and no connection can act as more than its key allows. On top of that, a connection
names its role in its first frame and both ends prove they hold that role's credential
by challenge and response over fresh nonces (see channel/): the client's
nonce comes first, the server answers with its own nonce and a tag over both (and over
its public key), then the client answers with a tag over both in the other order and the
role. A rank's role therefore needs the job's secret: no client can take it. A tag is
HMAC-SHA256 under the credential over length-prefixed fields with a label, so no tag of
one kind verifies as another, and a tag seen on one connection is worth nothing on the
next (the other side's nonce is new). Tags are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_BYTES = 32
NONCE_BYTES = 32
TAG_BYTES = hashlib.sha256().digest_size


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def tag(secret: bytes, *fields: bytes) -> bytes:
    """HMAC-SHA256 under `secret` over length-prefixed `fields` (no two field lists give
    the same input)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for field in fields:
        mac.update(len(field).to_bytes(8, "little"))
        mac.update(field)
    return mac.digest()


CLIENT_ROLE = b"client"
STATUS_ROLE = b"status"
# What the hub's ZAP handler tags a connection with: the kind of credential its Curve key
# was derived from (a rank's role also names the rank, which the handshake proves).
RANK_KIND, CLIENT_KIND, STATUS_KIND = "rank", "client", "status"


def rank_role(rank: int) -> bytes:
    return b"rank:%d" % rank


def client_credential(secret: bytes) -> bytes:
    """What outside clients hold instead of the job's secret (the secret file's): proofs
    under it make a connection a client, never a rank."""
    return tag(secret, b"freeride-queue-client-credential")


def status_credential(client: bytes) -> bytes:
    """What a read-only status file carries, from the client credential: proofs under it
    make a connection that may only ask for the task table."""
    return tag(client, b"freeride-queue-status-credential")


def kind_of(role: bytes) -> str | None:
    """The kind of credential `role` needs (RANK_KIND, CLIENT_KIND, STATUS_KIND), or
    None for a role nobody may take."""
    if role == CLIENT_ROLE:
        return CLIENT_KIND
    if role == STATUS_ROLE:
        return STATUS_KIND
    if role.startswith(b"rank:"):
        return RANK_KIND
    return None


def curve_keys(credential: bytes, kind: str) -> tuple[bytes, bytes]:
    """(public, secret) CurveZMQ keys, Z85 text, that a holder of `credential` connects
    with as `kind`: a Curve secret key is any 32 bytes (the curve clamps them), here an
    HMAC of the credential, and its public key follows from it."""
    import zmq
    import zmq.utils.z85

    secret = zmq.utils.z85.encode(tag(credential, b"freeride-queue-curve-key", kind.encode()))
    return zmq.curve_public(secret), secret


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes, key: bytes) -> bytes:
    """The server's answer to a client's nonce: it holds the secret, now, under `key`."""
    return tag(secret, b"freeride-queue-server", client_nonce, server_nonce, key)


def client_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes, role: bytes) -> bytes:
    """The client's answer to the server's nonce, for the role it asks for."""
    return tag(secret, b"freeride-queue-client", server_nonce, client_nonce, role)


def same(expected: bytes, got: object) -> bool:
    """Constant-time equality of a tag and whatever arrived."""
    return isinstance(got, bytes) and len(got) == TAG_BYTES and hmac.compare_digest(expected, got)
