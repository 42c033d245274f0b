"""The fleet manager's HTTP API (shared/domain/manager-api.md), as a client that trusts nothing it is answered.

One call, ``request``, is one attempt:

- within a total deadline (``call_deadline_s``: connect + read timeout) for connecting, sending,
  the status line, the headers and the body, enforced by cutting the call's socket (deadline.py):
  requests' own timeouts are per socket read, and a manager that drips its answer never trips them;
- on a connection of its own: a stuck call never holds up another thread's call, or the exit,
  beyond its deadline;
- reading at most ``MAX_ANSWER_BYTES`` of an answer (every real one is tiny): more is an error,
  never read into memory;
- refusing redirects: requests would turn a POST into a bodiless GET on a 301/302 and count it
  delivered. A 3xx is an error naming the status and the Location, retried like a manager that is
  down, so nothing is counted as delivered or lost; the client says it once in one clear line.

Connection errors, timeouts, 3xx, 5xx, the 4xx that say the call was not taken yet (408, 425, 429:
RETRY_LATER) and an answer the call cannot parse (garbage) are transient (``TransientError``), and so is a
2xx that is not the manager's "done" where a call expects one (``expect="ok"``: a 204, or ``{"ok": true}``;
a proxy's 200 page is not the manager's, and the call it answered was never handled):
``with_retries`` repeats them with exponential backoff and jitter (tenacity), waiting at least what a 429
or 503 asks in ``Retry-After`` (up to RETRY_AFTER_MAX_S; a date in it is read on the manager's clock, its
answer's ``Date``). Any other 4xx is permanent (``PermanentError``): retrying the same call cannot help. What an answer
must hold is checked by answers.py before anything keeps it.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal

from ..config import ManagerSpec
from ..lifecycle.states import backoff_delay
from ..text import Log
from ..text.redact import Redactor, shown_url, url_secrets
from ..text.show import cut, shown_bytes

# requests and tenacity are imported when a client is made, not with this module: a
# supervisor without a manager should not pay their start-up time and memory.

# Retry pacing for manager calls (seconds): 0.5, 1, 2, ... capped, with jitter.
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 30.0
RETRY_JITTER_S = 1.0
# A Retry-After is honoured up to this long: a manager asking for an hour is waited on for 5 minutes.
RETRY_AFTER_MAX_S = 300.0
# The 4xx that refuse the call only for now (RFC 9110/6585/8470): the request came too slowly (408), too early
# (425), too often (429). The manager did not act on it, and the same call may go again; one 408 from a proxy
# in front of it must not lose a param-done for good.
RETRY_LATER = (408, 425, 429)
# Every real answer is a few dozen bytes; a bigger one is not the manager's (a proxy's page, an attack).
MAX_ANSWER_BYTES = 64 * 1024
MAX_ANSWER_TEXT = "64 KiB"
READ_CHUNK_BYTES = 8 * 1024
# The manager reads at most 256 KiB of one log push and silently drops the rest.
LOG_PUSH_LIMIT = 256 * 1024
# Every log push says which lines it carries: ``<run>:<source>:<first>-<last>``, numbered per source from 1 in
# each supervisor process (``run``): the shipper's pushes, and its lines moved into the outbox ahead of a durable
# push. One sent again after a timeout carries the same numbers (and maybe more lines after them): a receiver that
# keeps the highest number seen per run and source can drop what it already has. Today's manager ignores the
# header; the dev-manager drops the duplicates (docs/manager.md).
SEQ_HEADER = "X-Log-Seq"
USER_AGENT = "prover-supervisor"
SHOWN_CHARS = 200  # of an answer or a Location, in an error line
# An object's address in an error's text (requests' ConnectionError names its connection object): it differs at
# every attempt, and is no change of the cause.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_HTTP_STATUS = re.compile(r".*?HTTP \d{3}")


def text_body(text: str, limit: int | None = None) -> bytes:
    """``text`` as a push carries it: UTF-8 whatever it holds, at most ``limit`` bytes, cut after a whole character.

    The one encoding of what is pushed (the log shipper's bodies and their sizes, the outbox's durable pushes,
    the events). Text may hold what UTF-8 cannot: bytes from the environment that are not UTF-8 (a command of
    ``${PROG}``) stay in Python's str as lone surrogates, and a strict encode raised on them, which killed the
    log shipping, the failure report and the exit flush. They are replaced, as the console replaces them."""
    data = text.encode("utf-8", errors="replace")
    if limit is None or len(data) <= limit:
        return data
    return data[:limit].decode("utf-8", errors="ignore").encode()  # (ignore: the character cut in two)


def error_cause(error: str) -> str:
    """What tells one failed call's cause from another (a watch says its blindness again only for another: the
    row watch, the shippers): an answer's HTTP status, not the body that came with it (a request id, a time:
    every call would be "another cause"); else the text, an object's address left out."""
    status = _HTTP_STATUS.match(error)
    return status.group(0) if status else _ADDRESS.sub("0x…", error)


def call_deadline_s(spec: ManagerSpec) -> float:
    """The most one call may take, start to end: as long as connecting and one read may take."""
    return spec.connect_timeout_s + spec.read_timeout_s


class TransientError(Exception):
    """Worth retrying: the manager is down, slow, overloaded, redirecting, or answered garbage.

    ``retry_after_s``: how long the manager asked to be left alone (429/503 Retry-After), if it did; ``status``:
    the HTTP status it answered with (None: no answer, or one not judged by its status)."""

    def __init__(self, message: str, retry_after_s: float | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status = status


class PermanentError(Exception):
    """A 4xx other than RETRY_LATER's: retrying the same call cannot help."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {cut(body, 300)}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # parsed JSON, or None (204, or any answer taken: Expect "any")
    # The manager's clock less ours, from the answer's Date header (whole seconds: within a second or so); None
    # where it sent none. Its row's times are its clock's (row.py reads them on ours).
    clock_offset_s: float | None = None


# What a call takes for a 2xx: "json", a JSON body, parsed; "ok", the manager's "done" (a 204, or a JSON object with
# "ok": true, as /param-done, /running and /api/log-push answer: anything else, a proxy's page above all, answered
# a call the manager never handled); "any", whatever it is, unread (a user's events_url, whose answers are its own).
Expect = Literal["json", "ok", "any"]


class ManagerClient:
    """Calls the manager at ``spec.url``; safe to use from several threads at once (nothing is shared)."""

    def __init__(self, spec: ManagerSpec, token: str | None = None, warn: Log | None = None) -> None:
        assert spec.url is not None
        # What a call imports is imported here, at start, where a failure turns the reporting off in one line
        # (missing, or no file descriptor left to read it): never half-imported on the sender's thread.
        import requests  # noqa: F401
        import tenacity  # noqa: F401

        from . import deadline  # noqa: F401

        self.base = spec.url
        self.timeout = (spec.connect_timeout_s, spec.read_timeout_s)
        self.deadline_s = call_deadline_s(spec)
        # Identity: compressed answers are not asked for, so a bounded read is a bounded answer.
        self._headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        # An error of requests may quote the URL, password and all.
        self._mask = Redactor(url_secrets(spec.url)).text
        self._warn = warn
        self._said_lock = threading.Lock()
        self._said: set[str] = set()  # what was warned of once (it lasts: a redirect, a shortage of threads)

    def request(self, method: str, path: str, *, json_body: dict[str, Any] | None = None,
                data: bytes | None = None, headers: dict[str, str] | None = None,
                expect: Expect = "json", max_bytes: int = MAX_ANSWER_BYTES) -> Answer:
        """One attempt. Raises TransientError or PermanentError. ``expect``: what a 2xx must be (Expect).
        ``max_bytes``: the most of an answer read (a read of the whole fleet, ``GET /status``, may hold more than
        MAX_ANSWER_BYTES; still a bound)."""
        from .deadline import deadline_session

        with deadline_session(self.deadline_s, self._headers) as (session, watchdog):
            if watchdog.unarmed is not None:
                self._warn_once("unarmed", f"manager: no thread for a call's {self.deadline_s:g}s deadline "
                                f"({watchdog.unarmed}); calls go on, cut by connect_timeout_s and read_timeout_s "
                                "alone while threads are short")
            try:
                response = session.request(method, self.base + path, json=json_body, data=data, headers=headers,
                                           timeout=self.timeout, allow_redirects=False, stream=True)
                with response:
                    return self._answer(method, path, response, expect, max_bytes)
            except Exception as exc:
                if watchdog.fired:  # whatever the cut socket made the read raise
                    raise TransientError(f"{method} {path}: no complete answer within {self.deadline_s:g}s "
                                         "(connect_timeout_s + read_timeout_s)") from None
                if isinstance(exc, TransientError | PermanentError) or not _is_exchange_error(exc):
                    raise
                raise TransientError(self._mask(f"{method} {path}: {_describe(exc)}")) from None

    def _warn_once(self, about: str, line: str) -> None:
        """``line`` is warned of the first time ``about`` is met only (calls come from the sender's thread and the
        log shipper's)."""
        with self._said_lock:
            first = about not in self._said
            self._said.add(about)
        if first and self._warn is not None:
            self._warn(line)

    def _answer(self, method: str, path: str, response: Any, expect: Expect, max_bytes: int) -> Answer:
        status = response.status_code
        if 300 <= status < 400:
            raise TransientError(self._redirected(method, path, status, response.headers.get("Location")))
        offset = _clock_offset(response.headers.get("Date"))
        if 200 <= status < 300 and (expect == "any" or status == 204):
            return Answer(status, None, offset)  # the body is not read: this connection is closed after the call
        data = self._body(method, path, response, max_bytes)
        if not 200 <= status < 500 or status in RETRY_LATER:
            # (a Retry-After date is the manager's clock's: counted from its Date, where it said one)
            theirs = time.time() + (offset or 0.0)
            asked = retry_after_s(response.headers.get("Retry-After"), theirs) if status in (429, 503) else None
            raise TransientError(f"{method} {path}: HTTP {status}: {shown_bytes(data, SHOWN_CHARS)}", asked, status)
        if status >= 400:
            raise PermanentError(status, shown_bytes(data, MAX_ANSWER_BYTES))
        try:
            body = json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, NaN, a number of 5000 digits, [[[[...
            raise TransientError(f"{method} {path}: HTTP {status} with a body that is not JSON: "
                                 f"{shown_bytes(data, 100)}") from None
        if expect == "ok" and not (isinstance(body, dict) and body.get("ok") is True):
            raise TransientError(f'{method} {path}: HTTP {status} without "ok": true: {shown_bytes(data, 100)}')
        return Answer(status, body, offset)

    def _body(self, method: str, path: str, response: Any, max_bytes: int = MAX_ANSWER_BYTES) -> bytes:
        """At most ``max_bytes`` of the answer's body, as sent; more is a TransientError, not read."""
        shown_max = MAX_ANSWER_TEXT if max_bytes == MAX_ANSWER_BYTES else f"{max_bytes // 1024} KiB"
        too_big = TransientError(f"{method} {path}: answer larger than {shown_max}")
        declared = (response.headers.get("Content-Length") or "").strip()
        if declared.isascii() and declared.isdigit() and (len(declared) > 12 or int(declared) > max_bytes):
            raise too_big
        encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise TransientError(f"{method} {path}: answer encoded as {shown_bytes(encoding.encode(), 40)}, "
                                 "which was not asked for")
        chunks: list[bytes] = []
        size = 0
        while chunk := response.raw.read(READ_CHUNK_BYTES, decode_content=False):
            size += len(chunk)
            if size > max_bytes:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def _redirected(self, method: str, path: str, status: int, location: str | None) -> str:
        where = shown_bytes(self._mask(shown_url(location)).encode(), SHOWN_CHARS) if location else "(no Location)"
        line = (f"the manager answered {status} → {where}: redirects are not followed; "
                "check [manager] url")
        self._warn_once("redirect", f"manager: {method} {path}: {line}")
        return f"{method} {path}: {line}"

    def with_retries(self, attempt: Callable[[], Answer], stop: threading.Event,
                     on_retry: Callable[[str, float], None], sleep: Callable[[float], None] | None = None,
                     longest: Callable[[], float | None] = lambda: None) -> Answer:
        """Repeat ``attempt`` while it fails transiently, until it succeeds or ``stop`` is set. ``sleep`` waits
        between the attempts (``stop.wait`` unless given: one that returns early must return once ``stop`` is
        set too). ``longest``: the most a wait may be when it begins (None: what the backoff or a Retry-After
        says; the sender's exit flush makes it short)."""
        import tenacity

        def wait(state: Any) -> float:  # a tenacity.RetryCallState
            exc = state.outcome.exception() if state.outcome else None
            wanted = next_wait_s(retry_wait_s(state.attempt_number), getattr(exc, "retry_after_s", None))
            most = longest()
            return wanted if most is None else min(wanted, most)

        def pause(seconds: float) -> None:
            stop.wait(seconds)

        def before_sleep(state: Any) -> None:
            exc = state.outcome.exception() if state.outcome else None
            on_retry(str(exc), state.next_action.sleep if state.next_action else 0.0)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientError),
            wait=wait,
            stop=tenacity.stop_when_event_set(stop),
            sleep=sleep or pause,
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)


# ---------------------------------------------------------------- pure helpers


def retry_after_s(value: str | None, now: float) -> float | None:
    """A Retry-After header (delay-seconds or an HTTP date) as seconds from ``now``, in 0..RETRY_AFTER_MAX_S;
    None if absent or not one of the two forms (garbage is ignored, not obeyed)."""
    text = (value or "").strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        return RETRY_AFTER_MAX_S if len(text.lstrip("0")) > 6 else min(float(text), RETRY_AFTER_MAX_S)
    stamp = http_date(text)
    return None if stamp is None else min(max(0.0, stamp - now), RETRY_AFTER_MAX_S)


def http_date(text: str) -> float | None:
    """An HTTP date (``Sun, 06 Nov 1994 08:49:37 GMT``: the Date header, Retry-After's date form) as epoch
    seconds; None where it is none (garbage is ignored, never obeyed)."""
    from email.utils import parsedate_to_datetime  # (imported at the first answer: email is not light)

    try:
        when = parsedate_to_datetime(text)
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None


def _clock_offset(date: str | None) -> float | None:
    """The sender's clock less ours, from a Date header read now; None without one. (Date has whole seconds and
    is written before the answer travels: this is within a second or two.)"""
    stamp = http_date(date.strip()) if date else None
    return None if stamp is None else stamp - time.time()


def retry_wait_s(attempts: int) -> float:
    """The wait after the ``attempts``-th failed try: RETRY_INITIAL_S doubled each time (the phases' own backoff
    rule, with no spread), plus up to RETRY_JITTER_S, at most RETRY_MAX_S. (Not tenacity's jittered backoff: its
    arguments changed from 8.x to 9.2, and the package allows both.)"""
    doubled = backoff_delay(max(attempts, 1), RETRY_INITIAL_S, 2.0, RETRY_MAX_S, jitter=0.0, rand=0.0)
    return min(RETRY_MAX_S, doubled + random.uniform(0, RETRY_JITTER_S))


def next_wait_s(backoff_s: float, asked_s: float | None) -> float:
    """How long to wait before the next attempt: the backoff, or what the manager asked if that is longer."""
    if asked_s is None:
        return backoff_s
    return max(backoff_s, min(asked_s, RETRY_AFTER_MAX_S))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number an answer may hold")


def _is_exchange_error(exc: Exception) -> bool:
    """What a misbehaving peer can make a call raise: requests', urllib3's and http.client's errors, I/O."""
    import http.client

    import requests
    import urllib3

    return isinstance(exc, requests.RequestException | urllib3.exceptions.HTTPError | http.client.HTTPException
                      | OSError | ValueError)


def _describe(exc: Exception) -> str:
    import requests

    if isinstance(exc, requests.Timeout):
        return f"timed out ({exc.__class__.__name__})"
    return f"{exc.__class__.__name__}: {shown_bytes(str(exc).encode(errors='replace'), SHOWN_CHARS)}"
