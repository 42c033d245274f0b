"""The process's own stdin, stdout and stderr, and the one writer of the commands' own lines.

A lost console costs lines, never the command: ``say`` writes bytes straight to fd 1 or 2,
encoded for the stream with ``backslashreplace`` (``PYTHONIOENCODING=ascii`` and a non-ASCII
path cannot raise), and a stream that fails (closed, ``/dev/full``, a pipe whose reader is gone)
is lost from then on, quietly: the command goes on to its own exit status. Every command (run,
check, status, demo, standins, dev-manager) writes through it; the supervisor's console and
supervisor.log are written by ``logs.Console`` and ``logs.LogFile``, which contain their own.

``keep_std_fds_open`` runs in ``cli.main`` once the signals are held: a standard fd that was closed (``run >&-``)
is pointed at /dev/null, so no file or socket opened later can take its number (the console
would write into it), and ``flush_last`` runs last: Python's own buffered streams are flushed here,
where a failure is contained, not at interpreter exit ("Exception ignored ... BrokenPipeError").
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import sys
from typing import TextIO

STDOUT, STDERR = 1, 2
# A non-blocking stream (its fd shared with a program that set O_NONBLOCK) that takes nothing for this long is lost.
# A blocking one is waited for, as any command's output is (a terminal paused with Ctrl-S holds ``status`` there);
# the supervisor's own console never waits so: logs.Console writes it from a thread of its own.
SAY_STALL_S = 10.0

_lost: dict[int, str] = {}  # fd → why its lines are lost


def keep_std_fds_open() -> list[int]:
    """Point each of fds 0-2 that is closed at /dev/null; returns those that were."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:
        devnull = os.open(os.devnull, os.O_RDWR)
        if devnull != fd:
            os.dup2(devnull, fd, inheritable=True)
            os.close(devnull)
        if fd != 0:
            _lost[fd] = "closed at start"
    return closed


def lost(fd: int) -> str | None:
    """Why lines written to ``fd`` are lost, or None while they are not."""
    return _lost.get(fd)


def say(text: str, *, err: bool = False) -> None:
    """One line (or several) of a command's own output: written whole, or lost quietly."""
    fd = STDERR if err else STDOUT
    if fd in _lost:
        return
    stream = sys.stderr if err else sys.stdout
    _flush_quietly(stream, fd)  # what Python's stream holds (argparse writes there) goes first, in order
    view = memoryview(_encode(text + "\n", stream))
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # a non-blocking fd (shared with a program that set it so)
            if not select.select([], [fd], [], SAY_STALL_S)[1]:
                _lose(fd, "it takes nothing")
                return
        except OSError as exc:
            _lose(fd, exc.strerror or str(exc), exc.errno)
            return


def _encode(text: str, stream: TextIO | None) -> bytes:
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return text.encode(encoding, errors="backslashreplace")
    except LookupError:  # an encoding Python does not know (PYTHONIOENCODING=nonsense)
        return text.encode("utf-8", errors="backslashreplace")


def _lose(fd: int, why: str, code: int | None = None) -> None:
    _lost[fd] = why
    if code == errno.EPIPE:
        _to_devnull(fd)  # nothing later (a flush at exit, a child's inherited fd) meets the broken pipe again


def _to_devnull(fd: int) -> None:
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def _flush_quietly(stream: TextIO | None, fd: int) -> None:
    """Flush a Python stream; one that cannot be flushed is lost, its buffer emptied into /dev/null."""
    if stream is None:
        return
    try:
        stream.flush()
    except (OSError, ValueError) as exc:
        _lost.setdefault(fd, getattr(exc, "strerror", None) or str(exc))
        _to_devnull(fd)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def flush_last() -> None:
    """At a command's end: Python's own stdout and stderr flushed here, their failure contained."""
    _flush_quietly(sys.stdout, STDOUT)
    _flush_quietly(sys.stderr, STDERR)
