"""The files the job queue writes and reads: the secret file outside clients connect
with, and results saved by path. Both are written to a temporary file beside their
path and renamed into place, so no reader (and no interrupted writer) ever leaves half a
file under the path."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from typing import IO

from .auth import SECRET_BYTES

# How the secret file is opened to read: never through a symbolic link (the checks are
# made on the descriptor), and without blocking, since a FIFO planted at the path would
# otherwise hold open() until someone writes to it (a regular file reads the same).
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


def write_atomically(
    path: str | os.PathLike, write: Callable[[IO[bytes]], None], mode: int | None = None
) -> None:
    """write(f) into a temporary file beside `path`, then a rename onto `path`. `mode`:
    the file's permissions (None: what open() would give a new file, under the umask)."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(path)), prefix=".freeride-", suffix=".tmp"
    )
    try:
        os.fchmod(fd, _new_file_mode() if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _new_file_mode() -> int:
    """0666 less the process's umask (read without os.umask, which would change it for
    every thread for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    return 0o644


ROLES = ("client", "status")  # what a secret file's credential is for


def write_secret_file(
    path: str | os.PathLike, address: str, secret: bytes, server_key: bytes, role: str = "client"
) -> tuple[int, int, bytes]:
    """Writes {"address", "secret", "server_key", "role"} to `path`, readable by its
    owner only (0600); returns what remove_secret_file needs to know the file again.
    `secret`: the credential of `role` ("client": submit and watch; "status": only read
    the task table). A path someone else's file holds in a directory others may write
    (sticky /tmp) cannot be replaced: PermissionError naming the file, its owner and what
    to do."""
    path = os.fspath(path)
    data = json.dumps(
        {
            "address": address,
            "secret": secret.hex(),
            "server_key": server_key.decode(),
            "role": role,
        }
    ).encode()
    try:
        write_atomically(path, lambda f: f.write(data), mode=0o600)
    except PermissionError as exc:
        owner = _owner_of(path)
        raise PermissionError(
            f"secret_file {path!r} cannot be written ({exc.strerror})"
            + (f": a file of uid {owner} is there" if owner is not None else "")
            + "; give JobQueue(secret_file=...) a path in a directory only you can write "
            "(mkdir -m 700 DIR)"
        ) from None
    st = os.stat(path, follow_symlinks=False)
    return st.st_dev, st.st_ino, data


def remove_secret_file(path: str | os.PathLike, written: tuple[int, int, bytes]) -> None:
    """Removes `path` if it is still the file write_secret_file wrote (same device, inode
    and content: an inode number alone may be reused by a file made since): once the
    queue has closed, nobody should find its address and secret."""
    path = os.fspath(path)
    try:
        fd = os.open(path, _READ_FLAGS)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            ours = (st.st_dev, st.st_ino) == written[:2] and f.read(1 << 16) == written[2]
        if ours:
            os.unlink(path)
    except OSError:
        pass  # gone already, or not ours to remove


def _owner_of(path: str) -> int | None:
    try:
        return os.stat(path, follow_symlinks=False).st_uid
    except OSError:
        return None


def read_secret_file(path: str | os.PathLike) -> tuple[str, bytes, bytes, str]:
    """(address, credential, server_key, role) from a file JobQueue(secret_file=...) or
    JobQueue(status_file=...) wrote (role "client" or "status").

    Opened without following a symbolic link and checked on the open descriptor (so
    what is checked is what is read): it must be a regular file owned by this user (or
    by root), which nobody else may read or write. Its secret lets the holder run code
    as the job, and whoever supplies the file chooses the queue the client talks to.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise FileNotFoundError(f"secret_file {path!r} does not exist") from None
    except OSError as exc:
        if os.path.islink(path):
            raise PermissionError(
                f"secret_file {path!r} is a symbolic link: give the file's own path"
            ) from None
        raise PermissionError(f"secret_file {path!r} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"secret_file {path!r} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(
                f"secret_file {path!r} belongs to uid {st.st_uid}, not to this user "
                f"({os.geteuid()}) or root: whoever wrote it chooses the queue you talk to"
            )
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(
                f"secret_file {path!r} has mode {stat.S_IMODE(st.st_mode):04o}: others than "
                f"its owner can read or write the job's secret; chmod 600 {path}"
            )
        try:
            data = json.loads(f.read(1 << 16))
        except ValueError as exc:
            raise ValueError(
                f"secret_file {path!r} cannot be read as the queue's JSON: {exc}"
            ) from None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("address"), str)
        and isinstance(data.get("secret"), str)
        and isinstance(data.get("server_key"), str)
    ):
        raise ValueError(  # noqa: TRY004 - a bad file's content, not a bad argument
            f"secret_file {path!r} lacks 'address', 'secret' and 'server_key'"
        )
    role = data.get("role", "client")
    if role not in ROLES:
        raise ValueError(f"secret_file {path!r} has role {role!r}, not one of {ROLES}")
    key = server_key_bytes(data["server_key"], "secret_file's server_key")
    return data["address"], secret_bytes(data["secret"], "secret_file's secret"), key, role


def server_key_bytes(key: bytes | str, name: str) -> bytes:
    """A CurveZMQ public key in its 40-character Z85 text, as bytes."""
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes) or len(key) != 40:
        raise ValueError(f"{name} must be the queue's public key: 40 Z85 characters")
    return key


def secret_bytes(secret: bytes | str, name: str) -> bytes:
    if isinstance(secret, str):
        try:
            secret = bytes.fromhex(secret)
        except ValueError:
            raise ValueError(f"{name} must be {SECRET_BYTES * 2} hex digits") from None
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise ValueError(f"{name} must be {SECRET_BYTES} bytes (or {SECRET_BYTES * 2} hex digits)")
    return secret
