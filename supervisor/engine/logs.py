"""Output: child bytes → line splitter → console, per-child file, ring of last lines.

Children write into pipes that the loop drains as fast as they fill, so a child
is never blocked by a slow consumer beyond the pipe buffer: the console is
written by its own thread (console.py) from a bounded backlog that drops lines (and says how
many) when the terminal cannot keep up; the per-child file receives the exact
bytes (secrets masked); the ring keeps the last lines for failure reports. A lone
``\r`` ends a line as ``\n`` does (progress readouts), and a 10 MB line without
either is cut into pieces of ``MAX_LINE_BYTES``, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..text.redact import Redactor, SecretStream
from .console import Console, clock, to_stderr

MAX_LINE_BYTES = 64 * 1024
# A log file that could not be written is tried again after this long (a full disk is not
# hammered with a write per line, and a disk that comes and goes is said at most this often).
RETRY_WRITE_S = 5.0


# The supervisor's own lines, in log_dir.
SUPERVISOR_LOG = "supervisor.log"


def child_log_name(phase: str, child: str) -> str:
    """The file in log_dir a child's output goes to: ``<phase>.log`` for the phase's command, else
    ``<phase>.<child>.log`` (a daemon)."""
    return f"{phase}.log" if child == phase else f"{phase}.{child}.log"


class LineSplitter:
    """Bytes in, complete lines out; a line longer than ``max_line`` comes out in pieces.

    ``\n`` ends a line, and so does a lone ``\r``: a progress readout that redraws itself in place
    (``\r 40%``, ``\r 41%``, ...) gives a line per redraw, not one line when 64 KiB have piled up.
    Between two ``\n``, each non-empty stretch that a ``\r`` ends is a line; the stretch the ``\n``
    ends is one too unless it is empty after such lines. So ``\r\n`` is one line end, a run of
    ``\r`` makes no empty lines, and a line of nothing but ``\r`` is one empty line (as a terminal
    shows it). Lines never hold a ``\r``. Where the reads were cut never changes the lines.
    """

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
        """The pieces of ``data`` split at its line ends when each of them is CR LF or LF (a CR LF
        text split in C, no pass per line: bytes.replace of CR LF costs twice as much); None when it
        holds a lone \r, a redraw."""
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

    def _pieces(self, line: bytes) -> list[bytes]:
        if len(line) <= self._max:
            return [line]
        return [line[i : i + self._max] for i in range(0, len(line), self._max)]


class LogFile:
    """An append-only file that rolls over to ``<name>.1`` once it exceeds ``max_bytes``.

    A full or failing disk costs log lines, never supervision: every write, roll and
    close contains its ``OSError``, says once that the file cannot be written, drops
    what comes while it cannot (counting the bytes), tries again every
    ``RETRY_WRITE_S``, and says when it works again. Writes go straight to the file
    descriptor (no userspace buffer): nothing is left over to fail again at close.
    """

    def __init__(self, path: Path, max_bytes: int, notify: Callable[[str], None] | None = None) -> None:
        self.path = path
        self._max = max_bytes
        self._fd: int | None = None
        self._size = 0
        # Whoever hears of a failure (the supervisor's log); stderr until told otherwise.
        self.notify: Callable[[str], None] = notify or to_stderr
        self._lock = threading.Lock()  # the outbox thread logs through the supervisor's file too
        self._failing_since: float | None = None  # monotonic time of the first failed write
        self._retry_at = 0.0
        self._lost = 0  # bytes dropped since the file stopped taking writes

    def write(self, data: bytes) -> None:
        note = self.write_unsaid(data)
        if note:
            self.notify(note)

    def write_unsaid(self, data: bytes) -> str | None:
        """``write``, leaving what there is to say of the file (it failed, it works again) to the caller."""
        if not data:
            return None
        with self._lock:
            if self._failing_since is not None and time.monotonic() < self._retry_at:
                self._lost += len(data)
                return None
            try:
                self._append(data)
            except OSError as exc:
                return self._failed(exc)
            return self._recovered()

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._size = os.fstat(self._fd).st_size
            if self._max and self._size + len(data) > self._max and self._size:
                self._roll()
            while view:
                written = os.write(self._fd, view)
                self._size += written
                view = view[written:]
        except OSError:
            self._lost += len(view)  # what did not make it (a write cut short by a full disk: its rest)
            raise

    def _roll(self) -> None:
        self._close_fd()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._size = 0

    def _failed(self, exc: OSError) -> str | None:
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        if self._failing_since is not None:
            return None  # said when it started
        self._failing_since = time.monotonic()
        return (f"cannot write {self.path}: {exc.strerror or exc}; its lines are dropped until it can be "
                f"written again (tried every {RETRY_WRITE_S:g}s); supervision goes on")

    def _recovered(self) -> str | None:
        if self._failing_since is None:
            return None
        lost, self._lost = self._lost, 0
        for_s, self._failing_since = time.monotonic() - self._failing_since, None
        return f"writing {self.path} works again; {lost} byte(s) of output were lost there over {for_s:.1f}s"

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):  # (close reports a late write error; nothing is pending here)
                os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._close_fd()


class ChildOutput:
    """Everything one child prints, fanned out to the console, its file and its ring.

    Each pipe's bytes are masked first, as they enter (redact.SecretStream, which may hold back the
    end of a read until it knows it is no secret), then split into lines: every reader downstream,
    the file included, gets bytes already masked, and a line cut at 64 KiB cannot cut a secret.
    """

    def __init__(self, label: str, console: Console, file: LogFile, ring_lines: int,
                 redactor: Redactor | None = None) -> None:
        self.label = label
        self._redactor = redactor if redactor else None
        self.taps: list[Callable[[list[bytes]], None]] = []  # more readers of the lines (parser, shipper)
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
        self._take(splitter, data)

    def close_stream(self, stream: str) -> None:
        pipe = self._pipes.pop(stream, None)
        if pipe is None:
            return
        secrets, splitter = pipe
        if secrets is not None:
            self._take(splitter, secrets.close())
        self._emit(splitter.flush())

    def _pipe(self, stream: str) -> tuple[SecretStream | None, LineSplitter]:
        pipe = self._pipes.get(stream)
        if pipe is None:
            pipe = self._pipes[stream] = (self._redactor.stream() if self._redactor else None, LineSplitter())
        return pipe

    def _take(self, splitter: LineSplitter, data: bytes) -> None:
        if data:
            self.file.write(data)
            self._emit(splitter.feed(data))

    def _emit(self, lines: list[bytes]) -> None:
        if not lines:
            return
        for tap in self.taps:
            tap(lines)
        maxlen = self.ring.maxlen
        self.ring.extend(lines[-maxlen:] if maxlen is not None else lines)
        head = clock() + self._prefix
        # head + line + newline for every line in one C-level join; the three parts go to writev as they are.
        self._console.put(head, (b"\n" + head).join(lines), b"\n")

    def last_lines(self, n: int | None = None) -> list[str]:
        lines = list(self.ring)[-n:] if n else list(self.ring)
        return [line.decode("utf-8", errors="replace") for line in lines]


class Unshipped(str):
    """An own line the log shipper leaves alone, because its content reaches the manager another way:
    a failure's verdict line and its quoted child lines, which Reporter.verdict pushes durably from the
    verdict itself (shipping the logged copy too would show each failure twice in the setup tab)."""

    __slots__ = ()


class SupervisorLog:
    """The supervisor's own lines: console (with priority), ``supervisor.log``, and the taps that ship them.

    Every own line enters here and is masked here, once (redact.py), before anything reads it. A line
    given as ``Unshipped`` goes to the console and the file only: the taps never see it."""

    def __init__(self, console: Console, file: LogFile | None) -> None:
        self._console = console
        self._file = file
        if file is not None:
            file.notify = self._to_console  # not through itself: it is the file that cannot be written
        self.redactor: Redactor | None = None
        self.taps: list[Callable[[str], None]] = []  # the log shipper: every line but the Unshipped ones

    def __call__(self, message: str) -> None:
        ship = not isinstance(message, Unshipped)  # (asked before masking: the mask makes a plain str)
        if self.redactor:
            message = self.redactor.text(message)
        if ship:
            for tap in self.taps:
                tap(message)
        line = clock() + b" [supervisor] " + message.encode("utf-8", errors="replace") + b"\n"
        # The file is written before the console's put: the put wakes the console's thread, which would take
        # the GIL at the file's write and hold us up (the signal path's lines come before its signal). What
        # there is to say of the file still follows the line on the console.
        note = None
        if self._file is not None:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z ").encode()
            note = self._file.write_unsaid(stamp + line.split(b" ", 1)[1])
        self._console.put(line, own=True)
        if note:
            self._file.notify(note)

    def _to_console(self, message: str) -> None:
        self._console.put(clock() + b" [supervisor] " + message.encode("utf-8", errors="replace") + b"\n", own=True)
