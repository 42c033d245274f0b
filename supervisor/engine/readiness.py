"""Is a daemon ready? Ask it for real: a TCP or unix-socket connect, an HTTP 2xx, a file made or changed since
the daemon started (``since``: one an earlier attempt or run left is not its answer), or the first of several
of these to pass (a plugin's kind is made of these: the prover's ``ready = "cuzk"`` is its ``/status``, else its
listen port, supervisor/prover/ready.py).

A log line is never proof (cuzk-daemon prints "ready" before it binds its
socket), and neither is an answer from another process: on a local address a TCP or HTTP
answer counts only when the listening socket belongs to the daemon's own tree (``owner``:
ports.Ownership). Probes block, so each wait runs in a thread that posts its answer back
to the loop; the loop stays free to read output and reap. A wait whose bound is found passed right after a
freeze of the supervisor (tick.py: its probing thread was stopped with it) asks once more before it fails: the
answer it has is from before the freeze.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

from ..config import ReadyCheck
from .loop import EventLoop
from .offloop import Bounded, run_bounded
from .ports import is_local
from .tick import FreezeWatch

READY_POLL_S = 0.2
# A probe's first timeout. A probe that timed out is followed by one given twice as long, up to the time left in
# the wait: an endpoint that answers, but slowly (a /status busy while the daemon warms up), is waited for, and a
# request lost on the way is asked again soon (the wait's bound is the loop's timer, whatever a probe does).
PROBE_TIMEOUT_S = 2.0
# A file's times are stamped from the kernel's coarse clock, up to a tick (10 ms at HZ=100) behind time.time()
# (7 ms measured on a test machine): a file the daemon wrote just after its start may read as a few ms
# before it. Small enough that a file the last attempt's daemon wrote, stopped and a backoff ago, never counts.
FILE_STAMP_SLACK_S = 0.05

# Whose listener answered on (host, port): None when the daemon's own, else why the answer does not count.
Owner = Callable[[str, int], "str | None"]


class Answer(NamedTuple):
    why_not: str | None  # None: ready
    timed_out: bool = False  # given up at its timeout (the next probe is given longer)


def probe(check: ReadyCheck, timeout: float = PROBE_TIMEOUT_S, owner: Owner | None = None,
          since: float | None = None) -> str | None:
    """None when ready, else a short reason why not. ``owner``: asked once a local TCP or HTTP probe answered.
    ``since``: when the daemon started (time.time(), taken before its fork): a file counts only if made or
    changed since (None: any file that exists)."""
    return ask(check, timeout, owner, since).why_not


def ask(check: ReadyCheck, timeout: float, owner: Owner | None = None, since: float | None = None) -> Answer:
    """``probe``'s answer, and whether it timed out."""
    if check.kind == "any":
        return _ask_any(check, timeout, owner, since)
    try:
        return Answer(_probe_once(check, timeout, owner, since))
    except TimeoutError:  # (an OSError: caught first)
        return Answer(f"{check.describe()}: timed out after {timeout:.3g}s", timed_out=True)
    except OSError as exc:
        return Answer(f"{check.describe()}: {exc.strerror or exc}")
    except Exception as exc:  # http.client.HTTPException and its kin: a garbled answer is "not ready"
        return Answer(f"{check.describe()}: bad HTTP answer: {type(exc).__name__}")


def _probe_once(check: ReadyCheck, timeout: float, owner: Owner | None, since: float | None) -> str | None:
    if check.kind == "file":
        return _fresh(check.target, since)
    if check.kind == "tcp":
        with socket.create_connection((check.host, check.port), timeout=timeout):
            pass
        return _owned(check, owner)
    if check.kind == "unix":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(check.target)
            return None
    why_not = _probe_http(check.target, timeout)
    return why_not if why_not is not None else _owned(check, owner)


def _owned(check: ReadyCheck, owner: Owner | None) -> str | None:
    """An answer on a local address counts only from the daemon's own listener (a remote one: not ours to ask)."""
    return owner(check.host, check.port) if owner is not None and is_local(check.host) else None


def _fresh(path: str, since: float | None) -> str | None:
    """Is the file there, made or changed (its mtime, or its ctime: a rename into place) since ``since``?"""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return f"{path} does not exist yet"
    changed = max(stat.st_mtime, stat.st_ctime)
    if since is None or changed >= since - FILE_STAMP_SLACK_S:
        return None
    return f"{path} exists but is older than this start (changed {since - changed:.1f}s before it)"


def _ask_any(check: ReadyCheck, timeout: float, owner: Owner | None, since: float | None) -> Answer:
    """Ready as soon as one alternative is (each given its share of ``timeout``); else every reason, joined."""
    reasons, timed_out = [], False
    for alternative in check.alternatives:
        answer = ask(alternative, timeout / max(1, len(check.alternatives)), owner, since)
        if answer.why_not is None:
            return answer
        reasons.append(answer.why_not)
        timed_out = timed_out or answer.timed_out
    return Answer("; ".join(reasons) or "no alternatives to probe", timed_out)


def _probe_http(url: str, timeout: float) -> str | None:
    import http.client  # with ssl, only for configs that probe over HTTP
    import ssl

    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=ssl._create_unverified_context()
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "prover-supervisor"})
        response = conn.getresponse()
        response.read(64 * 1024)
        if 200 <= response.status < 300:
            return None
        return f"{url}: HTTP {response.status}"
    finally:
        conn.close()


class ReadinessWait:
    """Probes ``check`` every READY_POLL_S until it passes or ``timeout_s`` runs out, whichever comes first
    acted on once, on the loop (offloop.Bounded). Each probe is given PROBE_TIMEOUT_S, or twice the last one's
    after a probe that timed out, never more than the time left.

    The bound is the loop's timer, not the thread's clock: a probe may block for good (an HTTP answer
    that arrives a byte at a time, a ``file`` check on a hung mount, a slow DNS lookup), and the phase
    must still fail at ``timeout_s``, saying what the probe was doing: ``on_timeout`` gets "not ready after
    {timeout_s}s: " and why. Where no thread can be started for it (pids.max, RLIMIT_NPROC), readiness cannot
    be waited for without blocking the loop: ``on_timeout`` gets "could not be waited for: " and that reason at
    once (from the loop, after this returns), so the phase fails saying why instead of waiting for nothing,
    and without claiming it waited. ``owner``, ``since``: see ``probe``.

    ``freeze``: the supervisor's freeze watch (tick.py; None: none). Where the bound is found passed and the
    supervisor thawed since the latest answer's probe began, that answer (and the thread's silence since: it was
    stopped too) says nothing of the daemon now: one more probe, off the loop and bounded by a probe's own
    timeout, decides, as the phase deadline reads the pipes after a thaw before it fails anything."""

    def __init__(self, loop: EventLoop, check: ReadyCheck, timeout_s: float,
                 on_ready: Callable[[], None], on_timeout: Callable[[str], None], owner: Owner | None = None,
                 since: float | None = None, freeze: FreezeWatch | None = None) -> None:
        self._cancelled = threading.Event()
        self._loop, self._freeze = loop, freeze
        self._owner, self._since = owner, since
        self._check = check
        self._why_not = f"{check.describe()}: not probed yet"  # the latest probe's answer (set by the thread)
        # The probe under way: when it began (monotonic) and the timeout it was given; None between probes. Set by
        # the thread, read by the loop at the bound: one tuple, so that the loop never pairs one probe's start with
        # the next one's timeout.
        self._under_way: tuple[float, float] | None = None
        self._answered = False  # a probe has answered (not ready) at least once
        # When the probe of the latest answer began, on the loop's clock (the freeze watch's): the wait's start
        # until one answered.
        self._asked_at = loop.clock.monotonic()
        self._timeout_s = timeout_s
        self._again: Bounded[Answer] | None = None  # the one probe after a freeze, under way
        self._bound = Bounded[None](loop, timeout_s, lambda _: on_ready(),
                                    lambda: self._overdue(on_ready, on_timeout))
        self._thread = threading.Thread(target=self._wait, name=f"ready:{check.describe()}", daemon=True)
        try:
            self._thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            self._bound.cancel()
            why = f"could not be waited for: no thread could be started to probe {check.describe()} ({exc})"
            self._bound = Bounded[None](loop, 0, lambda _: None, lambda: on_timeout(why))

    def _wait(self) -> None:
        bound = self._bound  # (its own: never the probe after a freeze's)
        ends = time.monotonic() + self._timeout_s  # (the thread's clock: the bound itself is the loop's timer)
        grown = PROBE_TIMEOUT_S
        while not self._cancelled.is_set():
            now, asked_at = time.monotonic(), self._loop.clock.monotonic()
            # Never past the wait's end: a probe given longer would only hold its thread after the wait is over.
            given = max(min(grown, ends - now), 0.1)
            self._under_way = (now, given)
            answer = ask(self._check, given, self._owner, self._since)
            self._under_way = None
            if answer.why_not is None:
                bound.answer(None)
                return
            self._why_not, self._answered, self._asked_at = answer.why_not, True, asked_at
            grown = grown * 2 if answer.timed_out else PROBE_TIMEOUT_S
            self._cancelled.wait(READY_POLL_S)

    def _overdue(self, on_ready: Callable[[], None], on_timeout: Callable[[str], None]) -> None:
        self._cancelled.set()  # (the thread probes no more once the one under way returns, if ever)
        if self._thawed_since_asked():
            self._ask_again(on_ready, on_timeout)
            return
        on_timeout(f"not ready after {self._timeout_s:g}s: {self._why()}")

    def _thawed_since_asked(self) -> bool:
        """Was the supervisor frozen after the latest answer's probe began (or, with none, the wait began)?"""
        if self._freeze is None:
            return False
        self._freeze.notice()  # (a freeze the tick has not looked at yet: said before what it caused)
        thawed = self._freeze.thawed_at
        return thawed is not None and thawed > self._asked_at

    def _ask_again(self, on_ready: Callable[[], None], on_timeout: Callable[[str], None]) -> None:
        """One fresh probe, its answer the wait's: ready, or not ready saying why (not a second wait)."""
        check, given = self._check, PROBE_TIMEOUT_S
        failed = f"not ready after {self._timeout_s:g}s: "
        after = " (asked again after the supervisor was frozen)"

        def answered(answer: Answer) -> None:
            if answer.why_not is None:
                on_ready()
            else:
                on_timeout(f"{failed}{answer.why_not}{after}")

        def unasked(exc: Exception) -> None:  # (no thread to be had: the answer from before the freeze stands)
            on_timeout(f"{failed}{self._why()}; not asked again after the supervisor was frozen: {exc}")

        self._again = run_bounded(
            self._loop, f"ready:{check.describe()}", lambda: ask(check, given, self._owner, self._since),
            given + READY_POLL_S, answered,
            lambda: on_timeout(f"{failed}{check.describe()}: a probe has not returned after {given:g}s{after}"),
            on_error=unasked)

    def _why(self) -> str:
        """Why it is not ready at the bound: the latest probe's answer ("timed out after 4s"), unless the probe
        under way has run for a while (half a first probe's timeout: it may never return, an answer a byte at a
        time, a hung mount) or none answered yet; then that probe, with the answer before it. A probe just begun
        is only the next try: the answer before it says why."""
        under_way = self._under_way
        if under_way is None:
            return self._why_not
        since, given = under_way
        took = time.monotonic() - since
        # (by more than a poll: the bound's timer may fire a moment after a probe given the time left is due)
        hung = took > given + READY_POLL_S
        if self._answered and took < PROBE_TIMEOUT_S / 2:
            return self._why_not
        hint = " (an answer that never ends, a hung mount?)" if hung else ""
        before = f"; before it: {self._why_not}" if self._answered else ""
        return f"{self._check.describe()}: a probe has not returned after {took:.1f}s{hint}{before}"

    def cancel(self) -> None:
        self._cancelled.set()
        self._bound.cancel()
        if self._again is not None:
            self._again.cancel()
