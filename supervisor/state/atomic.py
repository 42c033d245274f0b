"""A file in state_dir written whole or not at all, and read back bounded.

status.json (statefile.py) and resume.json (resume.py) are both replaced atomically, so a reader
or the next start never sees half a file, and both are read back knowing they may be anything at
all: a FIFO someone put there, /dev/zero behind a link, a file far bigger than we ever write. A
foundation: the standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, fsynced first: a crash leaves the old file or the new one, never a
    mix. Mode 0600 (like the status socket: what state_dir holds is for root's eyes). Raises OSError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a half-written copy must not keep the space a full disk needs back
        raise


def read_regular_file(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them: a FIFO must not hang us, nor /dev/zero fill memory.
    Raises OSError (FileNotFoundError where there is none) or ValueError (not a regular file, too big)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes, more than the {limit} it can be")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)
