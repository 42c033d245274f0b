"""Real hung mounts for the tests: FUSE filesystems whose server never answers.

``hung_mount``: the test process opens /dev/fuse and mounts it (mount(2), as root) but never reads a request,
not even FUSE_INIT. Every stat, statvfs or readdir under the mount then blocks in the kernel (state D), as on
a hung FUSE or NFS parameter cache, and no signal but SIGKILL ends the wait (the request is still the
kernel's: a fatal signal takes it back). Closing the device aborts the connection: whatever waits gets
ENOTCONN, and the mount is detached.

``held_mount``: a server that answers FUSE_INIT, then reads every request and answers none. Once a request
is in the server's hands the kernel cannot take it back, and a caller waits for the answer even past SIGKILL
(request_wait_answer's last, uninterruptible wait): the process stays, in state D with SIGKILL pending,
until the connection is aborted, as under a FUSE daemon wedged mid-request.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

MNT_DETACH = 2
FUSE_INIT = 26
# fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("<IIQQIIIHH")
# fuse_out_header: len, error, unique
OUT_HEADER = struct.Struct("<IiQ")
# fuse_init_out as a protocol 7.22 server sends it (FUSE_COMPAT_22_INIT_OUT_SIZE: the kernel takes the short
# reply of a minor up to 22): major, minor, max_readahead, flags, max_background, congestion_threshold, max_write
INIT_OUT_22 = struct.Struct("<IIIIHHI")
# What a read of /dev/fuse must offer at least (FUSE_MIN_READ_BUFFER is 8192, more with a big max_write).
READ_BUFFER = 1 << 18


@contextlib.contextmanager
def hung_mount(where: Path) -> Iterator[Path]:
    """A FUSE mount on ``where`` that never answers, for the ``with`` block (skips where none can be made)."""
    with _mounted(where) as fd:
        del fd  # never read: the requests stay the kernel's
        yield where


class HeldMount:
    """A FUSE mount whose server holds every request after FUSE_INIT unanswered (``held``: how many it read).

    Its device is open in the test process, close-on-exec: a process forked from the test that makes a request
    under the mount before any exec holds the device open too, and ``release`` cannot end its wait; fork,
    close ``fd`` in the child, then use the mount."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.held = 0
        self.fd = fd
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._serve, name="held-fuse", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Abort the connection: every request held ends with ENOTCONN, and a caller killed meanwhile dies.
        The server's thread is stopped first: a read in progress holds the device open, and its close would
        then not abort the connection."""
        if self.fd < 0:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(10)
        os.close(self.fd)
        os.close(self._stop_r)
        os.close(self._stop_w)
        self.fd = -1

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            try:
                request = os.read(self.fd, READ_BUFFER)
            except OSError:
                return  # (the connection was aborted)
            _, opcode, unique, *_ = IN_HEADER.unpack_from(request)
            if opcode != FUSE_INIT:
                self.held += 1  # read, so the kernel's: never answered (a FUSE_INTERRUPT for it neither)
                continue
            (readahead,) = struct.unpack_from("<I", request, IN_HEADER.size + 8)  # fuse_init_in's, after major, minor
            body = INIT_OUT_22.pack(7, 22, readahead, 0, 0, 0, 4096)
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), 0, unique) + body)


@contextlib.contextmanager
def held_mount(where: Path) -> Iterator[HeldMount]:
    """A FUSE mount on ``where`` whose server holds every request (see the module's docstring), for the ``with``
    block; ``release()`` ends it earlier (skips where none can be made)."""
    with _mounted(where) as fd:
        mount = HeldMount(where, fd)
        try:
            yield mount
        finally:
            mount.release()


@contextlib.contextmanager
def _mounted(where: Path) -> Iterator[int]:
    """/dev/fuse opened and mounted on ``where``; the device closed (the connection aborted: every call still
    waiting gets ENOTCONN) and the mount detached after the block."""
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
        yield fd
    finally:
        with contextlib.suppress(OSError):  # (closed already where a held mount was released)
            os.close(fd)
        libc.umount2(os.fsencode(where), MNT_DETACH)
