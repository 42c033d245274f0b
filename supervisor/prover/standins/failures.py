"""The stand-ins' failure modes (``STANDIN_FAIL``), and signal handlers installed under them.

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
    * ``segv``: at the partway point the program kills itself with SIGSEGV (from whichever thread reached it).
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
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .knobs import UsageError, env_size, human_bytes, scaled, sleep_forever
from .output import err, flush_all, out, silence

SIMPLE_MODES = ("crash", "hang", "oom", "ignore-term", "segv", "orphan")
OOM_CHUNK = 16 * 1024 * 1024
PAGE = 4096

_program = "standin"
_mode: str | None = None
_fired = False
_ignoring_term = False


def handle_signal(signum: int, handler: Callable[[int, Any], Any] | int) -> None:
    """Install a handler, unless ``ignore-term`` is active for SIGTERM/SIGINT."""
    if _ignoring_term and signum in (signal.SIGTERM, signal.SIGINT):
        return
    signal.signal(signum, handler)


def start_thread(thread: threading.Thread, stops: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Start ``thread`` with the stop signals held. A stand-in whose stop handler raises in the main thread
    (as Go's context cancellation unwinds) must not raise inside ``Thread.start``: between its bookkeeping and
    the new thread's, the new thread dies with a KeyError traceback, or the start raises KeyError in the
    handler's place. Held, the signal is taken right after, where the main thread can take it. (The thread
    keeps them held: the main thread takes them, as Python's handlers run there anyway.)"""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
        flush_all()
        _die_of(signal.SIGSEGV)
        time.sleep(5)
        os._exit(139)


def _die_of(signum: int) -> None:
    """Send ourselves ``signum`` with its default action (death), from whichever thread the failure point is on:
    paramfetch's file threads and the daemon's request threads reach it off the main thread, where
    ``signal.signal`` raises ValueError (the stand-in printed a traceback and went on as if nothing happened).
    Python installs no handler for a fatal signal; faulthandler may (PYTHONFAULTHANDLER), and any thread may take
    its off: its dump of Python frames is no real program's. A handler of our own is reset where allowed."""
    if faulthandler.is_enabled():
        faulthandler.disable()
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signum) != signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def crash_line() -> str:
    if _program == "cuzk-daemon":
        return "thread 'tokio-runtime-worker' panicked at cuzk-core/src/prover.rs:412:17: simulated crash"
    if _program == "curio":
        return "panic: simulated crash (STANDIN_FAIL=crash)"
    return "error: simulated crash (STANDIN_FAIL=crash)"


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
    flush_all()
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)


def spawn_orphan() -> int:
    """Fork a child that leaves our session (setsid) and sleeps: an escapee. Returns its pid."""
    try:
        max_s = float(os.environ.get("STANDIN_ORPHAN_MAX_S", "") or 600.0)
    except ValueError:
        max_s = 600.0
    flush_all()
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
