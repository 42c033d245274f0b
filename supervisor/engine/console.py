"""The console: the supervisor's stdout, written by a thread of its own so that the loop never blocks on it.

Every line for the terminal (the children's, prefixed with their label, and the supervisor's own) is
queued here and written with writev from a bounded backlog: a terminal that cannot keep up costs lines
(the next write says how many), never a blocked loop or a blocked child. The supervisor's own lines get
a little more room than the children's. A console that is lost (closed, EPIPE, a full disk) is said once
and costs console lines only: the log files keep everything.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

CONSOLE_BACKLOG_BYTES = 4 * 1024 * 1024
IOV_MAX = 1024
# The supervisor's own lines may exceed the backlog by this much before they too are dropped.
CONSOLE_OWN_LINES_EXTRA_BYTES = 1024 * 1024
# A console write that failed (other than for good) is tried again after this long.
RETRY_WRITE_S = 5.0


def clock() -> bytes:
    """The time of day a console or log line starts with: ``HH:MM:SS.mmm``."""
    global _second
    now = time.time()
    whole = int(now)
    second, text = _second
    if second != whole:  # localtime and strftime once a second, not once a line (they cost ~5 us a call)
        text = time.strftime("%H:%M:%S", time.localtime(whole)).encode()
        _second = (whole, text)  # one tuple, replaced whole: the console thread calls this too
    return text + b".%03d" % int(now % 1 * 1000)


_second: tuple[int, bytes] = (-1, b"")  # the last second clock() formatted, and its HH:MM:SS


def to_stderr(message: str) -> None:
    """The last resort for a line about the console or a log file itself: stderr, if it is there."""
    with contextlib.suppress(OSError, ValueError):
        print(f"[supervisor] {message}", file=sys.stderr, flush=True)


class Console:
    """Writes to the supervisor's stdout from a thread, never blocking the loop.

    A lost console costs console lines, never the run: stdout closed at start (``run >&-``), no
    thread to write it, or a write that fails (EPIPE: the reader is gone; ENOSPC: ``/dev/full``)
    make it ``lost``, said once through ``notify`` (run.py: supervisor.log, which keeps the
    supervisor's own lines). A reader that is gone or an fd that is closed never comes back; any
    other failure is tried again after RETRY_WRITE_S, and said when it works again.
    """

    def __init__(self, fd: int | None = None, enabled: bool = True) -> None:
        self.lost: str | None = None  # why console lines are lost, while they are
        self.notify: Callable[[str], None] = to_stderr  # hears of a loss after the start (run.py: the log)
        if fd is None:
            # None: fd 1 was not open when Python started (cli.main points it at /dev/null since).
            fd = sys.stdout.fileno() if sys.stdout is not None else None
            if fd is None:
                self.lost = "stdout is closed"
        self._fd = fd if fd is not None else -1
        self._enabled = enabled and self.lost is None
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._dropped = 0
        self._cond = threading.Condition()
        self._closing = False
        self._for_good = False  # lost with no way back: put() drops at once
        self._retry_at = 0.0
        self._lost_lines = 0  # dropped since it was lost
        self._thread = threading.Thread(target=self._write_forever, name="console", daemon=True)
        if self._enabled:
            try:
                self._thread.start()
            except RuntimeError as exc:  # "can't start new thread": nothing is written, not even from the loop
                self._enabled = False
                self.lost = f"no thread to write it ({exc})"
                to_stderr(f"console off: {self.lost}; supervisor.log has the supervisor's lines")
        self.lost_at_start = self.lost  # (a loss later is said by the writer itself, through notify)

    def put(self, *parts: bytes, own: bool = False) -> None:
        """Queue the parts of one write (kept apart: the writer hands them to writev, never joined here);
        ``own`` marks the supervisor's own lines, kept a little longer."""
        if not self._enabled or self._for_good:
            return
        size = sum(map(len, parts))
        if not size:
            return
        limit = CONSOLE_BACKLOG_BYTES + (CONSOLE_OWN_LINES_EXTRA_BYTES if own else 0)
        with self._cond:
            if self._queued + size > limit:
                self._dropped += sum(part.count(b"\n") for part in parts) or 1
                return
            self._queue.extend(parts)
            self._queued += size
            self._cond.notify()

    def _write_forever(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                chunks = list(self._queue)
                self._queue.clear()
                self._queued = 0
                dropped, self._dropped = self._dropped, 0
            if self.lost is not None and (self._for_good or time.monotonic() < self._retry_at):
                self._lost_lines += sum(c.count(b"\n") for c in chunks) + dropped
                continue
            if dropped:
                note = b"%s [supervisor] console too slow: %d lines dropped here (log files have them)\n"
                chunks.insert(0, note % (clock(), dropped))
            failure = self._write_all(chunks)
            if failure is not None:
                self._lose(failure, sum(c.count(b"\n") for c in chunks))
            elif self.lost is not None:
                self._back()

    def _write_all(self, chunks: list[bytes]) -> OSError | None:
        """writev the chunks in order, however many calls and partial writes it takes; the error that stopped it."""
        pending = [memoryview(c) for c in chunks if c]
        while pending:
            try:
                written = os.writev(self._fd, pending[:IOV_MAX])
            except BlockingIOError:
                time.sleep(0.01)
                continue
            except OSError as exc:
                return exc
            while written and pending:
                first = pending[0]
                if written >= len(first):
                    written -= len(first)
                    pending.pop(0)
                else:
                    pending[0] = first[written:]
                    written = 0
        return None

    def _lose(self, exc: OSError, lines: int) -> None:
        self._lost_lines += lines
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        if self.lost is not None:
            return  # said when it started
        # A reader that is gone (EPIPE) or an fd that is closed (EBADF) never comes back.
        self._for_good = exc.errno in (errno.EPIPE, errno.EBADF)
        self.lost = f"cannot write stdout ({exc.strerror or exc})"
        again = "for good" if self._for_good else f"until a write works again (tried every {RETRY_WRITE_S:g}s)"
        self._say(f"console: {self.lost}; console lines are lost {again}; supervisor.log has the supervisor's own")

    def _back(self) -> None:
        lost, self._lost_lines, self.lost = self._lost_lines, 0, None
        self._say(f"console: writing stdout works again; {lost} line(s) were lost there")

    def _say(self, message: str) -> None:
        with contextlib.suppress(Exception):  # the one who hears of it may be broken too: lines are lost then
            self.notify(message)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued (up to ``timeout``) and stop the writer."""
        if not self._enabled:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
