"""Helpers shared by the stand-in programs: knobs, timing, failures, signals, output.

Environment knobs read by every stand-in:

``STANDIN_SPEED`` (float, default 1.0)
    Multiplies every *built-in* simulated duration (proof time, chunk interval, ...).
    Tests use e.g. 0.05. Durations given explicitly through a ``STANDIN_*_S`` /
    ``STANDIN_RUN_SECONDS`` knob are wall-clock seconds and are NOT scaled.
``STANDIN_FAIL`` / ``STANDIN_FAIL_<PROG>``
    Failure mode; the program-specific form (``<PROG>`` one of ``PARAMFETCH``,
    ``CUZK_DAEMON``, ``CUZK_BENCH``, ``CURIO``) wins over the generic one, so one
    program of a lifecycle can be made to fail while the others behave. Modes:

    * ``crash``: print an error line (stderr), exit 3 at the program's partway point.
    * ``exit:N``: print an error line (stderr), exit N at the partway point.
    * ``hang``: at the partway point go silent forever; signals still act as usual.
    * ``oom``: at the partway point print one line, then allocate 16 MiB chunks
      (every page touched) until killed. ``STANDIN_OOM_LIMIT`` (bytes-with-units,
      default ``2GiB``; ``0`` = no cap) caps it: reaching the cap, or a MemoryError,
      makes the program SIGKILL itself, as the kernel OOM killer would (status -9).
    * ``ignore-term``: SIGTERM and SIGINT are ignored from the start; at the partway
      point the program goes silent forever, so only SIGKILL ends it.
    * ``segv``: at the partway point the program kills itself with SIGSEGV.
    * ``orphan``: at start, fork a child that calls ``os.setsid()`` and sleeps (a
      setsid escapee, outside the program's process group), then carry on normally.
      Its pid is printed (``spawned helper process pid=N``) and written to
      ``STANDIN_ORPHAN_PIDFILE`` if set; it exits by itself after
      ``STANDIN_ORPHAN_MAX_S`` (default 600 s) so a forgotten one does not live forever.
``STANDIN_FAIL_AFTER`` (int, default 1)
    cuzk-daemon only: its partway point is after that many proofs completed
    (0 = during the first proof, in PCE extraction). Others' partway points are
    fixed, right after their first output lines (see each module).
``STANDIN_FAIL_TIMES`` + ``STANDIN_FAIL_STATE``
    Fail only the first N runs: the file ``STANDIN_FAIL_STATE`` counts runs started
    with the failure active; once it reaches N, the failure knob is ignored
    (for restart / retry tests).

Every line is written whole and flushed at once (stdout is a pipe in a supervisor).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

PROGRAMS = ("paramfetch", "cuzk-daemon", "cuzk-bench", "curio")
SIMPLE_MODES = ("crash", "hang", "oom", "ignore-term", "segv", "orphan")
OOM_CHUNK = 16 * 1024 * 1024
PAGE = 4096

_program = "standin"
_mode: str | None = None
_silent = False
_fired = False
_out_lock = threading.RLock()
_ignoring_term = False


class UsageError(Exception):
    """A bad command line or knob: the caller prints it and exits non-zero."""


# ---------------------------------------------------------------- output


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


# ---------------------------------------------------------------- knobs and timing


def speed() -> float:
    """``STANDIN_SPEED``: factor applied to built-in durations (default 1.0)."""
    try:
        value = float(os.environ.get("STANDIN_SPEED", "1") or "1")
    except ValueError:
        return 1.0
    return value if value >= 0 else 1.0


def scaled(seconds: float) -> float:
    """A built-in duration scaled by ``STANDIN_SPEED``."""
    return seconds * speed()


def env_seconds(name: str, default: float) -> float:
    """Wall-clock seconds from env ``name`` if set (may be ``inf``), else ``default`` scaled."""
    raw = os.environ.get(name, "").strip()
    if raw:
        try:
            value = float(raw)
            if value >= 0:
                return value
        except ValueError:
            pass
        err(f"warning: ignoring {name}={raw!r} (want seconds)")
    return scaled(default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        err(f"warning: ignoring {name}={raw!r} (want an integer)")
        return default


def env_size(name: str, default: int) -> int:
    """Bytes from env ``name`` (a number, or bytes-with-units such as ``8MiB``)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_size(raw, require_unit=False)
    except ValueError:
        err(f"warning: ignoring {name}={raw!r} (want a size such as 1048576 or 1MiB)")
        return default


def sleep(seconds: float) -> None:
    """Sleep wall-clock seconds; ``inf`` sleeps forever."""
    if seconds == float("inf"):
        sleep_forever()
    if seconds > 0:
        time.sleep(seconds)


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?)(b?)\s*$", re.IGNORECASE)
_UNIT_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def parse_size(text: str, require_unit: bool = True) -> int:
    """Bytes-with-units as go-units ``RAMInBytes`` reads them (all binary: 1KB = 1KiB = 1024).

    With ``require_unit`` a bare number is refused, as ``curio fetch-params 32`` is.
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"invalid size: {text!r}")
    number, prefix, binary, byte = match.groups()
    if require_unit and not (prefix or byte):
        raise ValueError(f"invalid size: {text!r}: missing unit")
    if binary and not prefix:
        raise ValueError(f"invalid size: {text!r}")
    return int(float(number) * 1024 ** _UNIT_POWER[prefix.lower()])


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} TiB"


def parse_addr(text: str) -> tuple[str, Any]:
    """Listen/connect address.

    ``unix:///p`` -> ("unix", "/p"); ``http://h:p`` or ``h:p`` -> ("tcp", (h, p)).
    """
    raw = text.strip()
    if raw.startswith("unix://"):
        path = raw[len("unix://"):]
        if not path:
            raise ValueError(f"invalid listen address {text!r}")
        return "unix", path
    for prefix in ("http://", "https://", "tcp://", "grpc://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):]
            break
    raw = raw.split("/", 1)[0]
    host, sep, port = raw.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise ValueError(f"invalid listen address {text!r}")
    return "tcp", (host.strip("[]") or "0.0.0.0", int(port))


# ---------------------------------------------------------------- signals


def handle_signal(signum: int, handler: Callable[[int, Any], Any] | int) -> None:
    """Install a handler, unless ``ignore-term`` is active for SIGTERM/SIGINT."""
    if _ignoring_term and signum in (signal.SIGTERM, signal.SIGINT):
        return
    signal.signal(signum, handler)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------- failures


def setup(program: str) -> str | None:
    """Record the program, read its failure mode, apply start-time parts; return the mode.

    Raises UsageError for an unknown mode so a typo in a test config is loud.
    """
    global _program, _mode, _ignoring_term
    _program = program
    key = "STANDIN_FAIL_" + program.upper().replace("-", "_")
    raw = os.environ.get(key, "").strip() or os.environ.get("STANDIN_FAIL", "").strip()
    if not raw or raw.lower() in ("none", "0", "off"):
        return None
    mode = raw.lower()
    if mode not in SIMPLE_MODES and not re.fullmatch(r"exit:\d{1,3}", mode):
        raise UsageError(f"unknown STANDIN_FAIL mode {raw!r} (want one of {', '.join(SIMPLE_MODES)}, exit:N)")
    if not _count_failure_run():
        return None
    _mode = mode
    if mode == "ignore-term":
        _ignoring_term = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif mode == "orphan":
        spawn_orphan()
    return mode


def _count_failure_run() -> bool:
    """Honour STANDIN_FAIL_TIMES/STANDIN_FAIL_STATE: False once enough runs have failed."""
    times_raw = os.environ.get("STANDIN_FAIL_TIMES", "").strip()
    state = os.environ.get("STANDIN_FAIL_STATE", "").strip()
    if not times_raw or not state:
        return True
    try:
        times = int(times_raw)
    except ValueError:
        raise UsageError(f"STANDIN_FAIL_TIMES={times_raw!r} is not an integer") from None
    try:
        with open(state) as fh:
            done = int(fh.read().strip() or "0")
    except (OSError, ValueError):
        done = 0
    if done >= times:
        return False
    with open(state, "w") as fh:
        fh.write(f"{done + 1}\n")
    return True


def mode() -> str | None:
    """The active failure mode (after setup), or None."""
    return _mode


def partway_pending() -> bool:
    """True while a partway failure is configured and has not fired yet."""
    return _mode is not None and _mode != "orphan" and not _fired


def partway() -> None:
    """Called by a program at its partway point: run the configured failure (once)."""
    global _fired
    if not partway_pending():
        return
    _fired = True
    fail_now(_mode or "")


def fail_now(how: str) -> None:
    """Carry out failure ``how`` right now (may not return)."""
    if how == "crash":
        err(crash_line())
        os._exit(3)
    elif how.startswith("exit:"):
        code = int(how.split(":", 1)[1])
        err(f"error: exiting with status {code} (STANDIN_FAIL={how})")
        os._exit(code)
    elif how in ("hang", "ignore-term"):
        silence()
        sleep_forever()
    elif how == "oom":
        hog_memory()
    elif how == "segv":
        _flush_all()
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5)
        os._exit(139)


def crash_line() -> str:
    if _program == "cuzk-daemon":
        return "thread 'tokio-runtime-worker' panicked at cuzk-core/src/prover.rs:412:17: simulated crash"
    if _program == "curio":
        return "panic: simulated crash (STANDIN_FAIL=crash)"
    return "error: simulated crash (STANDIN_FAIL=crash)"


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def hog_memory() -> None:
    """Allocate 16 MiB chunks, touching every page, until killed (or the cap: SIGKILL self)."""
    limit = env_size("STANDIN_OOM_LIMIT", 2 * 1024**3)
    out(f"allocating memory in 16 MiB chunks until killed (STANDIN_FAIL=oom, cap={human_bytes(limit)})")
    chunks: list[bytearray] = []
    touch = b"\x01" * (OOM_CHUNK // PAGE)
    pause = scaled(0.02)
    while True:
        try:
            chunk = bytearray(OOM_CHUNK)
            chunk[::PAGE] = touch
            chunks.append(chunk)
        except MemoryError:
            _oom_kill()
        if limit and len(chunks) * OOM_CHUNK >= limit:
            _oom_kill()
        if pause:
            time.sleep(pause)


def _oom_kill() -> None:
    _flush_all()
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)


def spawn_orphan() -> int:
    """Fork a child that leaves our session (setsid) and sleeps: an escapee. Returns its pid."""
    try:
        max_s = float(os.environ.get("STANDIN_ORPHAN_MAX_S", "") or 600.0)
    except ValueError:
        max_s = 600.0
    _flush_all()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.setsid()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            deadline = time.monotonic() + max_s
            while time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.01, deadline - time.monotonic())))
        finally:
            os._exit(0)
    pidfile = os.environ.get("STANDIN_ORPHAN_PIDFILE", "").strip()
    if pidfile:
        with open(pidfile, "w") as fh:
            fh.write(f"{pid}\n")
    out(f"spawned helper process pid={pid}")
    return pid
