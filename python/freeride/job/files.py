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

from .mailbox import SECRET_BYTES


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


def write_secret_file(path: str | os.PathLike, address: str, secret: bytes) -> None:
    """Writes {"address", "secret"} to `path`, readable by its owner only (0600)."""
    data = json.dumps({"address": address, "secret": secret.hex()}).encode()
    write_atomically(path, lambda f: f.write(data), mode=0o600)


def read_secret_file(path: str | os.PathLike) -> tuple[str, bytes]:
    """(address, secret) from a file JobQueue(secret_file=...) wrote. Refuses a file
    that others than its owner can read: the secret lets its holder run code as the job."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"secret_file {path!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"secret_file {path!r} cannot be read as the queue's JSON: {exc}"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(
            f"secret_file {path!r} has mode {stat.S_IMODE(mode):04o}: others than its owner "
            f"can read the job's secret; chmod 600 {path}"
        )
    if not (
        isinstance(data, dict)
        and isinstance(data.get("address"), str)
        and isinstance(data.get("secret"), str)
    ):
        raise ValueError(  # noqa: TRY004 - a bad file's content, not a bad argument
            f"secret_file {path!r} lacks 'address' and 'secret'"
        )
    return data["address"], secret_bytes(data["secret"], "secret_file's secret")


def secret_bytes(secret: bytes | str, name: str) -> bytes:
    if isinstance(secret, str):
        try:
            secret = bytes.fromhex(secret)
        except ValueError:
            raise ValueError(f"{name} must be {SECRET_BYTES * 2} hex digits") from None
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise ValueError(f"{name} must be {SECRET_BYTES} bytes (or {SECRET_BYTES * 2} hex digits)")
    return secret
