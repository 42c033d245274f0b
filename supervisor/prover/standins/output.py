"""What the stand-in programs print, and how: whole lines, flushed at once (stdout is a pipe in a supervisor).

``out``/``err`` write one whole line and flush it; the ``hang`` failure silences them (``silence``), a
signal handler that reports its action speaks again (``unsilence``). ``golog`` prints the go-log (zap)
lines curio and paramfetch print (JSON with ``GOLOG_LOG_FMT=json``). ``QuietHangups``: an HTTP server
whose client hangs up says nothing, as the real daemon just drops the connection.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from datetime import UTC, datetime
from typing import Any

_silent = False
_out_lock = threading.RLock()


def init_streams() -> None:
    """UTF-8, line-buffered stdout/stderr whatever the locale (the real programs print UTF-8)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(OSError, ValueError):
                reconfigure(encoding="utf-8", errors="replace", line_buffering=True)


def out(line: str) -> None:
    """Write one whole line to stdout and flush it (nothing while silenced by ``hang``)."""
    _write(sys.stdout, line)


def err(line: str) -> None:
    """Write one whole line to stderr and flush it (nothing while silenced)."""
    _write(sys.stderr, line)


def _write(stream: Any, line: str) -> None:
    if _silent:
        return
    with _out_lock:
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # reader went away (EPIPE included): keep going quietly, as the real programs mostly do


# A client that hung up before its answer was written (a bench killed mid-proof, a probe that gave up).
HANGUPS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class QuietHangups:
    """Mixin for a ``socketserver`` server: a client's hang-up is not an error worth a traceback (the
    real daemon just drops the connection); anything else is still reported as usual."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], HANGUPS):
            return
        super().handle_error(request, client_address)  # type: ignore[misc]


def silence() -> None:
    """Stop all further output (the ``hang`` failure)."""
    global _silent
    _silent = True


def unsilence() -> None:
    """Allow output again (a signal handler reporting its action)."""
    global _silent
    _silent = False


def silenced() -> bool:
    return _silent


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def golog(logger: str, level: str, msg: str, caller: str = "", **fields: Any) -> None:
    """A go-log (zap) line as curio and paramfetch print them; JSON when ``GOLOG_LOG_FMT=json``."""
    caller = caller or f"{logger}/{logger}.go:{100 + len(msg) % 300}"
    if os.environ.get("GOLOG_LOG_FMT", "").lower() == "json":
        import json

        record = {"level": level.lower(), "ts": now_iso(), "logger": logger, "caller": caller, "msg": msg}
        record.update(fields)
        out(json.dumps(record, separators=(",", ":")))
        return
    line = f"{now_iso()}\t{level.upper()}\t{logger}\t{caller}\t{msg}"
    if fields:
        import json

        line += "\t" + json.dumps(fields, separators=(", ", ": "))
    out(line)


def flush_all() -> None:
    """Both streams flushed (before the process dies by a signal, or forks)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
