"""The dev-manager's faults: how the next API calls are answered badly, for tests of a client that trusts nothing.

``POST /dev/faults`` takes one JSON object; its keys (anything else is refused with 400):

- ``count``: how many API calls get the fault (default: every one until the faults are set again);
  ``path``: only calls to this route get it (and count it down), the others are answered as usual.
- Answered instead of the call (the call is not handled: no state changes):
  ``status`` (an HTTP status; with ``retry_after``, a ``Retry-After`` header, as in a 429 or 503),
  ``garbage`` (200 with an HTML page), ``reset`` (the connection reset), ``redirect`` (that 3xx status,
  e.g. 301, 302, 307, with ``location``, default ``/moved`` + the path), ``huge_body_bytes`` (200 with a
  body of that many bytes, written as it goes, never held whole).
- The call is handled, then answered badly: ``answer`` (any JSON value, sent as the body instead of the
  real one: ``{"uuid": {"a": 1}}``, ``true``, a uuid with CR LF or NUL, a 200 KB uuid), ``drip_bytes_per_s``
  (the answer, status line and headers included, written that many bytes a second).
- ``delay_s``: wait that long before any of the above (or before the real answer).
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import asdict, dataclass, fields
from io import BufferedIOBase
from typing import Any

HUGE_CHUNK_BYTES = 64 * 1024
MAX_HUGE_BODY_BYTES = 1 << 34  # 16 GiB: whatever a test asks, the count stays an int HTTP can carry
DEFAULT_LOCATION = "/moved"


@dataclass
class FaultPlan:
    """The faults the dev-manager answers with until cleared (POST /dev/faults): what, how often, on which route."""

    status: int | None = None
    delay_s: float = 0.0
    garbage: bool = False
    reset: bool = False
    count: int = 0  # how many API calls still get the fault (-1: all until cleared)
    path: str | None = None  # only calls to this route get it (None: every API call)
    retry_after: str | None = None  # sent as Retry-After with ``status``
    redirect: int | None = None  # a 3xx answered instead, with ``location``
    location: str | None = None
    huge_body_bytes: int = 0
    answer: str | None = None  # JSON text sent instead of the real answer (the call is handled)
    drip_bytes_per_s: float = 0.0

    def copy(self) -> FaultPlan:
        return FaultPlan(**asdict(self))

    @property
    def answers_instead(self) -> bool:
        """The call is not handled: the fault is its whole answer."""
        return bool(self.reset or self.garbage or self.status or self.redirect or self.huge_body_bytes)


class FaultRequestError(ValueError):
    """A /dev/faults body the dev-manager cannot act on: one line, answered with 400."""


_KEYS = {f.name for f in fields(FaultPlan)}


def faults_from(body: Any) -> FaultPlan:
    """The faults a /dev/faults body asks for (``{}``: none)."""
    if not isinstance(body, dict):
        raise FaultRequestError("the body must be a JSON object")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise FaultRequestError(f"unknown fault key(s) {unknown}; known: {sorted(_KEYS)}")
    values = dict(body)
    if "answer" in values:
        values["answer"] = json.dumps(values["answer"])
    if "retry_after" in values and values["retry_after"] is not None:
        values["retry_after"] = str(values["retry_after"])
    if values.get("redirect") is not None and not 300 <= int(values["redirect"]) < 400:
        raise FaultRequestError(f"redirect must be a 3xx status, got {values['redirect']!r}")
    if int(values.get("huge_body_bytes") or 0) > MAX_HUGE_BODY_BYTES:
        raise FaultRequestError(f"huge_body_bytes: at most {MAX_HUGE_BODY_BYTES}")
    faults = FaultPlan(**values)
    if "count" not in body:
        faults.count = -1 if body else 0
    return faults


def response_bytes(status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> bytes:
    """A whole HTTP/1.1 response, for writing at the pace a fault asks."""
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("latin-1") + data


def drip(out: BufferedIOBase, data: bytes, bytes_per_s: float, stopping: threading.Event) -> bool:
    """Write ``data`` a byte at a time, ``bytes_per_s`` a second; False if the client left (or the server
    stops) before the end."""
    pause = 1.0 / bytes_per_s
    for i in range(len(data)):
        try:
            out.write(data[i:i + 1])
            out.flush()
        except OSError:
            return False
        if stopping.wait(pause):
            return False
    return True


def write_huge(out: BufferedIOBase, size: int, stopping: threading.Event) -> int:
    """``size`` bytes of a JSON-looking body, 64 KiB at a time; how many were written before the client left."""
    prefix, suffix = b'{"uuid": "', b'"}'
    block = b"a" * HUGE_CHUNK_BYTES
    written = 0
    try:
        out.write(prefix[:size])
        written = min(size, len(prefix))
        while written < size - len(suffix) and not stopping.is_set():
            n = min(HUGE_CHUNK_BYTES, size - len(suffix) - written)
            out.write(block[:n])
            written += n
        if written < size:
            out.write(suffix[: size - written])
            written = size
        out.flush()
    except OSError:
        pass
    return written


def answer_instead(handler: Any, f: FaultPlan) -> None:
    """Answer the call (its body already read) with the fault alone: ``handler`` is the dev-manager's."""
    if f.reset:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        handler.connection.close()
        handler.close_connection = True
        handler.server.note(handler.command, handler.path, 0, "connection reset (fault)")
        return
    if f.garbage:
        handler._send(200, raw=b"<html>this is not json</html>")
        return
    headers: list[tuple[str, str]] = []
    if f.redirect:
        status, data = f.redirect, b""
        headers.append(("Location", f.location or DEFAULT_LOCATION + handler.path))
        said: Any = f"redirect to {headers[0][1]} (fault)"
    elif f.huge_body_bytes:
        status, data, said = 200, b"", f"a body of {f.huge_body_bytes} bytes (fault)"
    else:
        assert f.status is not None
        status, data = f.status, json.dumps({"error": "injected fault"}).encode()
        said = {"error": "injected fault", "retry_after": f.retry_after}
        if f.retry_after is not None:
            headers.append(("Retry-After", f.retry_after))
    handler.server.note(handler.command, handler.path, status, said)
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(f.huge_body_bytes or len(data)))
    handler.end_headers()
    if f.huge_body_bytes:
        handler.close_connection = True
        write_huge(handler.wfile, f.huge_body_bytes, handler.server.stopping)
    elif data:
        handler.wfile.write(data)
