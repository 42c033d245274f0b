"""A small file the kernel writes (cgroupfs, /proc), read as evidence: bounded, never waited on, text or refused.

Such a file is a few lines of ASCII. What stands in its place may be anything (a bind mount, a test's
directory, a FUSE filesystem): bytes that are not text, megabytes, a FIFO that never answers. None of that
may cost more than the one reading: it is a ``BadValue``, which its reader says (once) and counts as
evidence unavailable, never guessed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..text.units import is_ascii_digits

# The most such a file may hold (memory.stat is about 2 KiB): more is no kernel's.
READ_LIMIT = 64 * 1024


class BadValue(ValueError):
    """A kernel file held what no kernel writes there: bytes that are not text, a word where a number goes,
    a FIFO or a device in its place. Its reading is unavailable (never guessed), said by the one told."""


def read_small(path: Path) -> str | None:
    """The text of a small kernel file (cgroupfs, /proc); None where it cannot be read (absent, refused).

    Never waits on what stands in its place: opened non-blocking, and anything but a regular file (a FIFO,
    a device) is refused. Read to at most READ_LIMIT. Bytes that are not UTF-8 raise BadValue: the kernel
    writes only text there, so whatever wrote them is not the kernel, and nothing in it is believed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadValue("is not a regular file")
        chunks, size = [], 0
        while size <= READ_LIMIT:
            chunk = os.read(fd, READ_LIMIT + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    if size > READ_LIMIT:
        raise BadValue(f"holds over {READ_LIMIT} bytes")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(f"holds bytes that are not text (at byte {exc.start})") from None


def kernel_number(text: str) -> int:
    """A kernel counter or size: ASCII digits (a v1 counter may be negative: -1 is "no limit" written back)."""
    if not is_ascii_digits(text.removeprefix("-")):
        raise BadValue(f"holds {text[:40]!r} where a number goes")
    return int(text)
