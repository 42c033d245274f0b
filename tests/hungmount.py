"""A real hung mount for the tests: a FUSE filesystem whose server never answers.

The test process opens /dev/fuse and mounts it (mount(2), as root) but never reads a request, not even
FUSE_INIT. Every stat, statvfs or readdir under the mount then blocks in the kernel (state D), as on a
hung FUSE or NFS parameter cache, and no signal but SIGKILL ends the wait. Closing the device aborts the
connection: whatever waits gets ENOTCONN, and the mount is detached.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

MNT_DETACH = 2


@contextlib.contextmanager
def hung_mount(where: Path) -> Iterator[Path]:
    """A FUSE mount on ``where`` that never answers, for the ``with`` block (skips where none can be made)."""
    if os.geteuid() != 0:
        pytest.skip("not root: cannot mount a FUSE filesystem")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse: cannot make a hung mount")
    where.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        pytest.skip(f"cannot open /dev/fuse: {exc.strerror}")
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"hung", os.fsencode(where), b"fuse.hung", 0, options) != 0:
        error = ctypes.get_errno()
        os.close(fd)
        pytest.skip(f"mount -t fuse failed: {os.strerror(error)}")
    try:
        yield where
    finally:
        os.close(fd)  # the connection is aborted: every call still waiting gets ENOTCONN
        libc.umount2(os.fsencode(where), MNT_DETACH)
