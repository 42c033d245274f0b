"""Output: the console, and child bytes → line splitter → console, per-child file, ring of last lines.

The console is the supervisor's stdout, written by a thread of its own (``Console``) so that the loop never
blocks on it. Every line for the terminal (the children's, prefixed with their label, unless ``console =
false``; the supervisor's own, in ``supervisor.log`` too) is queued there and written with writev from a
bounded backlog: a terminal that cannot keep up costs lines (the next write says how many), never a blocked
loop or a blocked child; the supervisor's own lines get a little more room. A console that is lost (closed,
EPIPE, a full disk) is said once and costs console lines only: the log files keep everything.

Children write into pipes that the loop drains as fast as they fill, so a child is never blocked by a slow
consumer beyond the pipe buffer; the per-child file receives the exact bytes (secrets masked), but for a
line that one stream or an earlier attempt left open, ended there before another's bytes; the ring keeps
the last lines for failure reports. A lone ``\r`` ends a line as ``\n`` does (progress readouts), and a
10 MB line without either is cut into pieces of ``MAX_LINE_BYTES``, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from ..state.files import ROLLED, open_regular
from ..text import Log
from ..text.redact import Redactor, SecretStream
from .loop import ErrorHandler, contained, is_contained, name_of

MAX_LINE_BYTES = 64 * 1024
# A console or log file write that failed (other than for good) is tried again after this long (a full disk
# is not hammered with a write per line, and a disk that comes and goes is said at most this often).
RETRY_WRITE_S = 5.0
CONSOLE_BACKLOG_BYTES = 4 * 1024 * 1024
IOV_MAX = 1024
# A console that cannot keep up (a reader that does not read, a paused terminal) is said in supervisor.log at the
# first line it drops, then at most this often: a slow terminal that fills and drains its backlog in turn is one
# line a minute, never one a drain.
CONSOLE_SLOW_SAY_S = 60.0
# The supervisor's own lines may exceed the backlog by this much before they too are dropped.
CONSOLE_OWN_LINES_EXTRA_BYTES = 1024 * 1024


# ---------------------------------------------------------------- the console


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


def ends_cut(data: bytes, done: int, before: bool) -> bool:
    """Does a file end inside a line once a write of ``data`` failed after ``done`` bytes (``before``: before it)?"""
    return data[done - 1:done] != b"\n" if done else before


def _fstat(fd: int) -> os.stat_result | None:
    """What ``fd`` is open on; None where it is not open (stdout or stderr closed)."""
    with contextlib.suppress(OSError):
        return os.fstat(fd)
    return None


def roll_over(path: str | Path) -> int:
    """``path`` becomes ``<name>.1`` (the older ``.1`` is gone) and a new, empty file takes its name: its fd
    (append, close-on-exec, 0644). How every file the supervisor writes without end rolls over."""
    os.replace(path, f"{path}{ROLLED}")
    return open_to_append(path)


def open_to_append(path: str | Path) -> int:
    """An fd that appends to the log file ``path`` (created 0644, close-on-exec): only ever a regular file, a
    FIFO put in log_dir in its place is refused (state/files.py ``open_regular``) rather than block the loop."""
    return open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def to_stderr(message: str) -> None:
    """The last resort for a line about the console or a log file itself: stderr, if it is there."""
    with contextlib.suppress(OSError, ValueError):
        print(f"[supervisor] {message}", file=sys.stderr, flush=True)


class Console:
    """Writes to the supervisor's stdout from a thread, never blocking the loop.

    A lost console costs console lines, never the run: stdout closed at start (``run >&-``), no thread to write it, or
    a write that fails (EPIPE: the reader is gone; ENOSPC: ``/dev/full``) make it ``lost``, said once through
    ``notify`` (startup.py's become_init: supervisor.log, which keeps the supervisor's own lines). A reader that is
    gone or an fd that is closed never comes back; any other failure is tried again after RETRY_WRITE_S, and said when
    it works again. A console that takes lines slower than they come drops them past CONSOLE_BACKLOG_BYTES: counted on
    the console itself once it drains, and through ``notify`` too (at most every CONSOLE_SLOW_SAY_S), since a reader
    that never reads never sees its own note. Every dropped line is counted there: a stretch within a minute of the
    last word with the next that is said, or at the close, as are the lines stdout never took."""

    def __init__(self, fd: int | None = None, enabled: bool = True, roll_at: int = 0, children: bool = True) -> None:
        self.lost: str | None = None  # why console lines are lost, while they are
        self.notify: Log = to_stderr  # hears of a loss after the start (become_init: the log)
        if fd is None:
            # None: fd 1 was not open when Python started (cli.main points it at /dev/null since).
            fd = sys.stdout.fileno() if sys.stdout is not None else None
            if fd is None:
                self.lost = "stdout is closed"
        self._fd = fd if fd is not None else -1
        self._enabled = enabled and self.lost is None
        self._children = children  # the children's lines too (``console = false``: the supervisor's own only)
        info = _fstat(self._fd) if roll_at > 0 and self._enabled else None
        self._roll_at = roll_at if info is not None and stat.S_ISREG(info.st_mode) else 0
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._dropped = 0
        self._cond = threading.Condition()
        self._closing = False
        self._for_good = False  # lost with no way back: put() drops at once
        self._retry_at = 0.0
        self._lost_lines = 0  # dropped since it was lost
        self._slow_said_at: float | None = None  # (monotonic) when dropping was last said through notify
        self._slow_open = False  # dropping was said, its drain not yet
        self._slow_lines = 0  # dropped and not yet counted through notify: told when it drains, or at the close
        self._batch: list[bytes] = []  # what the writer writes now, and how many of its bytes a write returned: the
        self._batch_done = 0  # rest is counted lost when the write fails, or at a close that stdout leaves it stuck
        self._cut = False  # a failed write ended inside a line: a \n ends it first at the next write, as in LogFile
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
        if not self._enabled or self._for_good or not (own or self._children):
            return
        size = sum(map(len, parts))
        if not size:
            return
        limit = CONSOLE_BACKLOG_BYTES + (CONSOLE_OWN_LINES_EXTRA_BYTES if own else 0)
        with self._cond:
            if self._queued + size <= limit:
                self._queue.extend(parts)
                self._queued += size
                self._cond.notify()
                return
            lines = sum(part.count(b"\n") for part in parts) or 1
            self._dropped += lines
            now = time.monotonic()
            self._slow_lines += lines
            first = not self._slow_open and (self._slow_said_at is None
                                             or now - self._slow_said_at >= CONSOLE_SLOW_SAY_S)
            if first:
                self._slow_open, self._slow_said_at = True, now
        if first:  # (outside the lock: notify may write to this console too, and drop there)
            self._say("console: stdout takes lines slower than they come (a reader that does not read, a paused "
                      "terminal?): console lines are dropped until it drains; the log files have them")

    def _write_forever(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                chunks = self._batch = list(self._queue)
                self._queue.clear()
                self._queued = self._batch_done = 0
                dropped, self._dropped = self._dropped, 0
            if self.lost is not None and (self._for_good or time.monotonic() < self._retry_at):
                self._lost_lines += sum(c.count(b"\n") for c in chunks) + dropped
                with self._cond:  # (counted as lost, not as dropped too; the stretch of drops ends in the loss)
                    self._slow_lines -= dropped
                    self._slow_open = self._slow_open and self._dropped > 0
                continue
            if dropped:
                note = b"%s [supervisor] console too slow: %d lines dropped here (log files have them)\n"
                chunks.insert(0, note % (clock(), dropped))
            if self._cut:
                chunks.insert(0, b"\n")
            failure = self._write_rolling(chunks)
            if failure is not None:
                self._lose(failure)
                continue
            if self.lost is not None:
                self._back()
            if dropped:
                self._drained()  # (if nothing was dropped meanwhile)

    def _write_rolling(self, chunks: list[bytes]) -> OSError | None:
        """Write the chunks, rolling the file over at the end of the line that fills it, inside a chunk too (a
        child's batch of lines is one): a backlog taken in one batch (a slow disk, a starved thread) must not
        carry the file far past ``roll_at``."""
        if not self._roll_at:
            return self._write_all(chunks)
        size = info.st_size if (info := _fstat(self._fd)) is not None else 0  # (else the write below says why)
        pending, ready = list(chunks), []
        while pending and self._roll_at:
            chunk = pending.pop(0)
            end = chunk.find(b"\n", max(self._roll_at - size - 1, 0)) + 1 if size + len(chunk) >= self._roll_at else 0
            if not end:
                ready.append(chunk)
                size += len(chunk)
                continue
            failure = self._write_all([*ready, chunk[:end]])
            if failure is not None:
                return failure
            ready, size = [], 0
            self._roll_if_full()  # (cannot roll: said once, _roll_at is 0 and the rest goes on as it is)
            if end < len(chunk):
                pending.insert(0, chunk[end:])
        return self._write_all(ready + pending)

    def _roll_if_full(self) -> None:
        """stdout into a regular file (Vast's onstart: ``nohup ... > /var/log/entrypoint.log``) would grow for as
        long as the instance proves, curio's output and all: past ``roll_at`` bytes it becomes ``<name>.1`` and a
        new file takes its place, on fd 1 and on fd 2 where that is the same file, as log_dir's files roll.
        A file it cannot roll (deleted, renamed out of reach, a read-only dir) is said once and grows on."""
        try:
            info = os.fstat(self._fd)
            if info.st_size < self._roll_at:
                return
            path = os.readlink(f"/proc/self/fd/{self._fd}")
            if not path.startswith("/") or path.endswith(" (deleted)"):
                raise OSError(f"its name is {path!r}")
            new = roll_over(path)
            try:
                for fd in (self._fd, 2):
                    if fd == self._fd or ((other := _fstat(fd)) is not None and os.path.samestat(other, info)):
                        os.dup2(new, fd)
            finally:
                os.close(new)
        except OSError as exc:
            self._roll_at = 0
            self.notify(f"console: stdout is a file that cannot be rolled over ({exc}); it grows on")

    def _write_all(self, chunks: list[bytes]) -> OSError | None:
        """writev the chunks in order, however many calls and partial writes it takes; the error that stopped it."""
        pending = [memoryview(c) for c in chunks if c]
        while pending:
            try:
                written = os.writev(self._fd, pending[:IOV_MAX])
                self._batch_done += written
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

    def _unwritten(self) -> int:
        """The batch's lines not written whole (a cut one too; the \n that ends an earlier cut one is no line)."""
        return b"".join(self._batch)[max(self._batch_done, self._cut):].count(b"\n")

    def _lose(self, exc: OSError) -> None:
        self._lost_lines += self._unwritten()
        self._cut = ends_cut(b"".join(self._batch), self._batch_done, self._cut)
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        if self.lost is not None:
            return  # said when it started
        # A reader that is gone (EPIPE) or an fd that is closed (EBADF) never comes back.
        self._for_good = exc.errno in (errno.EPIPE, errno.EBADF)
        self.lost = f"cannot write stdout ({exc.strerror or exc})"
        again = "for good" if self._for_good else f"until a write works again (tried every {RETRY_WRITE_S:g}s)"
        self._say(f"console: {self.lost}; console lines are lost {again}; supervisor.log has the supervisor's own")

    def _drained(self) -> None:
        """A batch with dropped lines was written: unless more were dropped while it was (the backlog filled
        again), the console keeps up again, said if its dropping was, with every line dropped since the last
        count said (a stretch not said, within a minute of the last word, is counted with this one)."""
        with self._cond:
            if self._dropped or not self._slow_open:
                return
            said, self._slow_lines, self._slow_open = self._slow_lines, 0, False
        self._say(f"console: stdout drains again; {said} line(s) were dropped there")

    def _back(self) -> None:
        lost, self._lost_lines, self.lost, self._cut = self._lost_lines, 0, None, False
        self._say(f"console: writing stdout works again; {lost} line(s) were lost there")

    def _say(self, message: str) -> None:
        with contextlib.suppress(Exception):  # the one who hears of it may be broken too: lines are lost then
            self.notify(message)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued (up to ``timeout``) and stop the writer; what it could not write is counted."""
        if not self._enabled:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        with self._cond:
            uncounted, self._slow_lines = self._slow_lines, 0
            # A writer still stuck (stdout not read: ``run | sleep``) is left to the exit: its lines never reach stdout.
            unwritten = sum(c.count(b"\n") for c in self._queue) + self._unwritten() if self._thread.is_alive() else 0
        if uncounted:  # (dropped in a stretch not said, or one that never drained)
            self._say(f"console: {uncounted} line(s) were dropped there since the last count")
        if unwritten:
            self._say(f"console: {unwritten} line(s) never reached stdout: it did not drain within {timeout:.1f}s")


# ---------------------------------------------------------------- the log files

class LineSplitter:
    """Bytes in, complete lines out; a line longer than ``max_line`` comes out in pieces.

    ``\n`` ends a line, and so does a lone ``\r``: a progress readout that redraws itself in place
    (``\r 40%``, ``\r 41%``, ...) gives a line per redraw, not one line when 64 KiB have piled up. Between two ``\n``,
    each non-empty stretch that a ``\r`` ends is a line; the stretch the ``\n`` ends is one too unless it is empty
    after such lines. So ``\r\n`` is one line end, a run of ``\r`` makes no empty lines, and a line of nothing but
    ``\r`` is one empty line (as a terminal shows it). Lines never hold a ``\r``. Where the reads were cut never
    changes the lines."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._partial = b""
        self._shown = False  # the line in progress already gave a piece that a \r ended
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        data = self._partial + data if self._partial else data
        # One memchr decides: the common chunk, without \r, goes straight to the split.
        lines = self._split_cr(data) if b"\r" in data else data.split(b"\n")
        if lines is not None:
            self._partial = lines.pop()
            if self._shown and lines:
                self._shown = False
                if not lines[0]:
                    del lines[0]  # the \n after "40%\r": that line was given already
        else:
            lines = self._split_redraws(data.replace(b"\r\n", b"\n"))
        if len(self._partial) > self._max:
            # Emit whole pieces but keep a non-empty tail, so where the reads were cut never
            # changes the lines (a line of exactly max bytes must not gain an empty one).
            cut = (len(self._partial) - 1) // self._max * self._max
            lines.extend(self._partial[i : i + self._max] for i in range(0, cut, self._max))
            self._partial = self._partial[cut:]
        # (max over map(len) runs in C: a Python-level scan per line was the hot path at ~10M lines/GiB)
        if len(data) > self._max and max(map(len, lines), default=0) > self._max:
            lines = [piece for line in lines for piece in self._pieces(line)]
        return lines

    @staticmethod
    def _split_cr(data: bytes) -> list[bytes] | None:
        """The pieces of ``data`` split at its line ends when each of them is CR LF or LF (a CR LF text split in C, no
        pass per line: bytes.replace of CR LF costs twice as much); None when it holds a lone \r, a redraw."""
        pieces = data.split(b"\r\n")
        rest = b"".join(pieces)
        if b"\r" not in rest:
            return pieces if b"\n" not in rest else data.replace(b"\r\n", b"\n").split(b"\n")
        return None

    def _split_redraws(self, data: bytes) -> list[bytes]:
        """The lines of ``data`` that holds a lone \r (CR LF already made LF)."""
        segments = data.split(b"\n")
        tail = segments.pop()
        lines: list[bytes] = []
        shown = self._shown
        for segment in segments:
            pieces = [p for p in segment.split(b"\r") if p] if b"\r" in segment else [segment] if segment else []
            if pieces:
                lines.extend(pieces)
            elif not shown:
                lines.append(b"")
            shown = False
        if b"\r" in tail:
            *ended, tail = tail.split(b"\r")
            ended = [p for p in ended if p]
            lines.extend(ended)
            shown = shown or bool(ended)
        self._partial, self._shown = tail, shown
        return lines

    def flush(self) -> list[bytes]:
        rest, self._partial, self._shown = self._partial, b"", False
        return [rest] if rest else []

    @classmethod
    def lines_of(cls, data: bytes) -> list[bytes]:
        """Every line of ``data`` read back whole (a log file's tail), split as it came: the last one too."""
        return (splitter := cls()).feed(data) + splitter.flush()

    def pending(self) -> bytes:
        """The line begun and not ended yet (b"" if none), left where it is."""
        return self._partial

    def _pieces(self, line: bytes) -> list[bytes]:
        return [line[i : i + self._max] for i in range(0, len(line), self._max)] or [line]  # (an empty line: itself)


class LogFile:
    """An append-only file that rolls over to ``<name>.1`` once it exceeds ``max_bytes``.

    A full or failing disk costs log lines, never supervision: every write, roll and close contains its ``OSError``,
    says once that the file cannot be written, drops what comes while it cannot (counting the bytes), tries again every
    ``RETRY_WRITE_S``, and says when it works again (if only for one write), or at its close that it still fails, with
    the bytes lost. Writes go straight to the fd (no userspace buffer): nothing is left over to fail again at close."""

    CUT = "\0cut"  # whose line the file ends in when none of ours goes on with it: an earlier writer's, a cut one

    def __init__(self, path: Path, max_bytes: int, notify: Log | None = None) -> None:
        self.path = path
        self._max = max_bytes
        self._fd: int | None = None
        self._size = 0
        self._open_line: str | None = None  # whose line the file ends inside (a stream's, CUT's), None: none
        self.notify: Log = notify or to_stderr  # hears of a failure (the supervisor's log); stderr until told
        self._lock = threading.Lock()  # the outbox thread logs through the supervisor's file too
        self._failing_since: float | None = None  # monotonic time of the first failed write
        self._retry_at = 0.0
        self._lost = 0  # bytes dropped since the file stopped taking writes
        self._kept_on: list[int] = []  # fds of others moved onto the new file at each roll (keep_on_this_file)
        self._ours_from: int | None = None  # where this writer's bytes begin in the file (set once it is opened)

    def write(self, data: bytes, stream: str = "") -> None:
        """``stream``: whose bytes (a child's stdout, its stderr): a line one left open is ended before another's."""
        for note in self.write_unsaid(data, stream):
            self.notify(note)

    def write_unsaid(self, data: bytes, stream: str = "") -> list[str]:
        """``write``, leaving what there is to say of the file (it failed, it works again) to the caller."""
        if not data:
            return []
        with self._lock:
            if self._failing_since is not None and time.monotonic() < self._retry_at:
                self._lost += len(data)
                return []
            lost = self._lost
            try:
                self._append(data, stream)
            except OSError as exc:
                # Some of it written (room came back, this write filled it again): it worked again, and fails anew.
                return (self._recovered(lost) if self._lost - lost < len(data) else []) + self._failed(exc)
            return self._recovered(lost)

    def _append(self, data: bytes, stream: str) -> None:
        done, given = 0, len(data)  # bytes of ``data`` written, and the caller's (a line's end put first is ours)
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = open_to_append(self.path)
                self._size = os.fstat(self._fd).st_size
                if self._ours_from is None:
                    self._ours_from = self._size
                    if self._size:  # an attempt before this one may have died inside a line: ours begins on a new one
                        with contextlib.suppress(OSError), open(f"/proc/self/fd/{self._fd}", "rb", 0) as before:
                            last = os.pread(before.fileno(), 1, self._size - 1)
                            self._open_line = None if last == b"\n" else self.CUT
            if self._open_line is not None and self._open_line != stream:
                data = b"\n" + data  # as on the console, no line holds two streams' bytes (nor two attempts')
            parts: list[bytes | None] = [data]  # None: roll over there
            if self._max and self._size + len(data) > self._max and self._size:
                # Rolled at a line's end: a line under way (block-buffered output ends anywhere) ends in the old file.
                end = data.find(b"\n") + 1 if self._open_line is not None else 0
                parts = [data[:end], None, data[end:]]
            for part in parts:
                if part is None:
                    self._roll()
                    continue
                view = memoryview(part)
                while view:
                    written = os.write(self._fd, view)
                    self._size += written
                    done += written
                    view = view[written:]
            self._open_line = None if data.endswith(b"\n") else stream
        except OSError:  # a write cut short (a full disk): its rest is lost, and so the rest of the line it ends in
            self._lost += min(given, len(data) - done)
            cut = ends_cut(data, done, self._open_line is not None)
            self._open_line = self.CUT if cut else None  # (ended before the next bytes, the same stream's too)
            raise

    def keep_on_this_file(self, fd: int) -> None:
        """``fd`` (another writer's, opened on ``path``: a fatal fault's last words) is moved onto the new file at each
        roll: the old one becomes ``.1`` and, at the next roll, is deleted, and what is written to it then is lost."""
        self._kept_on.append(fd)

    def ours_from(self) -> int | None:
        """Where this writer's bytes begin in ``path`` (what comes before is an earlier run's): before its first
        write, the file's size now; None where the file cannot be looked at. For ``status`` reading the file's
        tail after the supervisor is gone (status/command.py)."""
        if self._ours_from is not None:
            return self._ours_from
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
        except OSError:
            return None

    def _roll(self) -> None:
        self._close_fd()
        self._fd = roll_over(self.path)
        self._size = self._ours_from = 0  # (the new file is empty, and all ours)
        for fd in self._kept_on:
            with contextlib.suppress(OSError):  # (it stays on the old file: no worse than before the roll)
                os.dup2(self._fd, fd, inheritable=False)

    def _failed(self, exc: OSError) -> list[str]:
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        if self._failing_since is not None:
            return []  # said when it started
        self._failing_since = time.monotonic()
        return [f"cannot write {self.path}: {exc.strerror or exc}; its lines are dropped until it can be "
                f"written again (tried every {RETRY_WRITE_S:g}s); supervision goes on"]

    def _recovered(self, lost: int, how: str = "works again") -> list[str]:  # (or is closed still failing)
        if self._failing_since is None:
            return []
        self._lost -= lost
        for_s, self._failing_since = time.monotonic() - self._failing_since, None
        return [f"writing {self.path} {how}; {lost} byte(s) of output were lost there over {for_s:.1f}s"]

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):  # (close reports a late write error; nothing is pending here)
                os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._close_fd()
            notes = self._recovered(self._lost, "ends still failing")
        for note in notes:
            self.notify(note)


Reader = Callable[[list[bytes]], None]  # a reader of a child's output lines, besides the console, file and ring


class ChildOutput:
    """Everything one child prints, fanned out to the console, its file and its ring.

    Each pipe's bytes are masked first, as they enter (redact.SecretStream, which may hold back the end of a read until
    it knows it is no secret), then split into lines: every reader downstream, the file included, gets bytes already
    masked, and a line cut at 64 KiB cannot cut a secret."""

    def __init__(self, label: str, console: Console, file: LogFile, ring_lines: int,
                 redactor: Redactor | None = None, readers: Sequence[Reader] = (),
                 on_fault: Callable[[str], ErrorHandler] | None = None) -> None:
        """``readers``: who else reads the lines (a parser, the log shipper), each after the one before it;
        ``on_fault``: what a reader that raises is said as (what raised → its handler). Each reader is called
        through it, so that one raising costs neither the lines nor the readers after it."""
        self.label = label
        self._redactor = redactor if redactor else None
        self._readers = tuple(reader if on_fault is None or is_contained(reader)
                              else contained(reader, on_fault(f"the output tap {name_of(reader)}"))
                              for reader in readers)
        self._prefix = b" [" + label.encode() + b"] "
        self._console = console
        self.file = file
        self.ring: deque[bytes] = deque(maxlen=ring_lines)
        self._pipes: dict[str, tuple[SecretStream | None, LineSplitter]] = {}
        self.bytes_seen = 0
        self.last_output_at = 0.0  # monotonic time of the last byte

    def feed(self, stream: str, data: bytes) -> None:
        self.bytes_seen += len(data)
        self.last_output_at = time.monotonic()
        secrets, splitter = self._pipe(stream)
        if secrets is not None:
            data = secrets.feed(data)
        self._take(stream, splitter, data)

    def close_stream(self, stream: str) -> None:
        if (pipe := self._pipes.pop(stream, None)) is None:
            return
        secrets, splitter = pipe
        if secrets is not None:
            self._take(stream, splitter, secrets.close())
        self._emit(splitter.flush())

    def _pipe(self, stream: str) -> tuple[SecretStream | None, LineSplitter]:
        if (pipe := self._pipes.get(stream)) is None:
            pipe = self._pipes[stream] = (self._redactor.stream() if self._redactor else None, LineSplitter())
        return pipe

    def _take(self, stream: str, splitter: LineSplitter, data: bytes) -> None:
        if data:
            self.file.write(data, stream)
            self._emit(splitter.feed(data))

    def _emit(self, lines: list[bytes]) -> None:
        if not lines:
            return
        maxlen = self.ring.maxlen
        self.ring.extend(lines[-maxlen:] if maxlen is not None else lines)
        head = clock() + self._prefix
        # head + line + newline for every line in one C-level join; the three parts go to writev as they are.
        self._console.put(head, (b"\n" + head).join(lines), b"\n")
        # The readers last: what one of them makes the supervisor do (a settle's end stops the daemons, a parser's
        # finding ends an attempt) is logged after the lines that caused it, and a verdict quotes them.
        for reader in self._readers:
            reader(lines)

    def last_lines(self, n: int | None = None, *, begun: bool = False) -> list[str]:
        """The last ``n`` lines (all the ring holds if None). ``begun``: the lines begun and not ended on the
        pipes still open come last, left where they are: a child's last words without a newline (an error
        printed with ``printf``) while a grandchild holds the pipe, so no end of file says them yet; their end that
        could still begin a secret, held back from every reader, as the mask (SecretStream.held_shown)."""
        lines = list(self.ring)
        if begun:
            lines += [tail for secrets, splitter in self._pipes.values()
                      if (tail := splitter.pending() + (secrets.held_shown() if secrets is not None else b""))]
        lines = lines[-n:] if n else lines
        return [line.decode("utf-8", errors="replace") for line in lines]


class Unshipped(str):
    """An own line the log shipper leaves alone, because its content reaches the manager another way:
    a failure's verdict line and its quoted child lines, which Reporter.verdict pushes durably from the
    verdict itself (shipping the logged copy too would show each failure twice in the setup tab)."""

    __slots__ = ()


class SupervisorLog:
    """The supervisor's own lines: console (with priority), ``supervisor.log``, and the shipper that ships them.

    Every own line enters here and is masked here, once (redact.py), before anything reads it. A line
    given as ``Unshipped`` goes to the console and the file only: the shipper never sees it."""

    def __init__(self, console: Console, file: LogFile | None, ship: Log | None = None) -> None:
        """``ship``: the log shipper, given every line but the Unshipped ones."""
        self._console = console
        self.file = file  # (closed by the teardown, last but the console: what it lost is said there)
        if file is not None:
            file.notify = self._to_console  # not through itself: it is the file that cannot be written
        self.redactor: Redactor | None = None
        self._ship = ship
        self._held: list[str] | None = None  # the holding thread's lines, said when its act is over
        self._holder = 0

    def held(self, act: Callable[[], object]) -> None:
        """``act()`` with the lines this thread says meanwhile held, then said in order. A stop signal's handling
        is run so (signals.SignalRouter): its signals go out before its lines are written and the console's
        thread is woken (that thread takes the GIL at our next write and the stop would wait for it: +0.1 ms to
        SIGTERM's forwarding). Another thread's lines are not held."""
        if self._held is not None:  # (a hold inside a hold: its lines are the outer one's)
            act()
            return
        self._held, self._holder = [], threading.get_ident()
        try:
            act()
        finally:
            lines, self._held = self._held, None
            for line in lines:
                self(line)

    def __call__(self, message: str) -> None:
        if self._held is not None and threading.get_ident() == self._holder:
            self._held.append(message)
            return
        ship = not isinstance(message, Unshipped)  # (asked before masking: the mask makes a plain str)
        if self.redactor is not None:
            message = self.redactor.text(message)
        shipper = self._ship if ship else None  # (read once: another thread may stop the shipping meanwhile)
        if shipper is not None:
            shipper(message)
        line = clock() + b" [supervisor] " + message.encode("utf-8", errors="replace") + b"\n"
        # The file is written before the console's put: the put wakes the console's thread, which would take
        # the GIL at the file's write and hold us up (the signal path's lines come before its signal). What
        # there is to say of the file still follows the line on the console.
        notes: list[str] = []
        if self.file is not None:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z ").encode()
            notes = self.file.write_unsaid(stamp + line.split(b" ", 1)[1])
        self._console.put(line, own=True)
        for note in notes:
            self._to_console(note)  # (the file's notify)

    def stop_shipping(self) -> None:
        """No manager to ship to: the lines go to the console and the file only."""
        self._ship = None

    def _to_console(self, message: str) -> None:
        self._console.put(clock() + b" [supervisor] " + message.encode("utf-8", errors="replace") + b"\n", own=True)
