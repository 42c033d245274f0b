"""Units of manager reporting: the HTTP client, the outbox, the log shipper, the dev-manager, redaction, bench parsing.

Real HTTP on 127.0.0.1 (a tiny server of our own, or the dev-manager), real SQLite files; no mocks of the network.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import Runner, free_port, pyc, sh, toml_str, wait_for

from supervisor.app.cli import dev_manager
from supervisor.config import ManagerSpec
from supervisor.devmanager.server import LOG_PUSH_LIMIT, DevManager
from supervisor.engine.loop import EventLoop
from supervisor.manager import client as manager
from supervisor.manager import logship
from supervisor.manager import outbox as outbox_mod
from supervisor.manager.client import Answer, ManagerClient, PermanentError, TransientError
from supervisor.manager.logship import PUSH_MAX_BYTES, Shipper, log_push_sender
from supervisor.manager.outbox import Call, Outbox
from supervisor.manager.sender import CallKinds, Sender
from supervisor.text.redact import MASK, Redactor, looks_secret

# ---------------------------------------------------------------- a tiny server with canned answers


class _Canned(BaseHTTPRequestHandler):
    server: _CannedServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        if body:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _route(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                 "body": body})
        path = self.path
        if path == "/ok":
            self._answer(200, b'{"uuid": "u-1", "runner_id": 7}')
        elif path == "/empty":
            self._answer(204)
        elif path == "/missing":
            self._answer(404, b'{"error": "unknown uuid"}')
        elif path == "/bad":
            self._answer(400, b"label required", "text/plain")
        elif path == "/boom":
            self._answer(500, b'{"error": "internal"}')
        elif path == "/busy":
            self._answer(429, b"slow down", "text/plain")
        elif path == "/unavailable":
            self._answer(503, b"maintenance", "text/plain")
        elif path == "/slow":
            time.sleep(1.0)
            self._answer(200, b'{"ok": true}')
        elif path == "/garbage":
            self._answer(200, b"<html>this is not json</html>", "text/html")
        elif path == "/done":
            self._answer(200, b'{"ok": true}')
        elif path == "/not-done":
            self._answer(200, b'{"ok": false}')
        elif path in HOSTILE:
            HOSTILE[path](self)
        else:
            self._answer(404, b'{"error": "no route"}')

    def _answer_with(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _route
    do_POST = _route


def _raw(handler: _Canned, head: bytes, body: Iterator[bytes]) -> None:
    """Write an answer as given (headers and all), until it ends or the client leaves."""
    handler.close_connection = True
    try:
        handler.wfile.write(head)
        for chunk in body:
            handler.wfile.write(chunk)
            handler.wfile.flush()
    except OSError:
        pass


def _drip(handler: _Canned) -> None:
    data = b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}'
    _raw(handler, b"", (data[i:i + 1] for i in range(len(data)) if not time.sleep(0.2)))


def _skewed(handler: _Canned, skew_s: float, asks_s: float) -> None:
    theirs = time.time() + skew_s
    _raw(handler, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nDate: "
         + formatdate(theirs, usegmt=True).encode() + b"\r\nRetry-After: "
         + formatdate(theirs + asks_s, usegmt=True).encode() + b"\r\n\r\n", iter(()))


# Made once: the server's own allocations must not count in what the client is measured to hold.
MIB_OF_X = b"x" * (1 << 20)
CHUNK_OF_Y = b"2000\r\n" + b"y" * 0x2000 + b"\r\n"


HOSTILE: dict[str, Callable[[_Canned], None]] = {
    # Says 100 MB and sends them (1 MiB at a time): the client must not wait for them, nor keep them.
    "/huge-declared": lambda h: _raw(h, b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n",
                                     (MIB_OF_X for _ in range(100))),
    # Says nothing of its size: chunked, without end.
    "/huge-chunked": lambda h: _raw(h, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                    (CHUNK_OF_Y for _ in range(10_000))),
    "/gzip": lambda h: _raw(h, b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
                            + str(len(GZIPPED)).encode() + b"\r\n\r\n", iter([GZIPPED])),
    "/moved": lambda h: h._answer_with(302, {"Location": "http://127.0.0.1:9/elsewhere"}),
    "/later": lambda h: h._answer_with(429, {"Retry-After": "1"}),
    "/later-date": lambda h: h._answer_with(503, {"Retry-After": "Thu, 01 Jan 2099 00:00:00 GMT"}),
    "/later-garbage": lambda h: h._answer_with(503, {"Retry-After": "soon, maybe"}),
    "/too-slow": lambda h: h._answer_with(408, {}),
    "/too-early": lambda h: h._answer_with(425, {}),
    # A manager whose clock runs 10 minutes ahead of ours asks for 5 s, one 10 minutes behind for 120 s: each in
    # a date of its own clock, beside the Date that says it.
    "/later-ahead": lambda h: _skewed(h, 600.0, 5.0),
    "/later-behind": lambda h: _skewed(h, -600.0, 120.0),
    "/drip": _drip,
    # No length said, the connection closed after the body: only the read itself bounds it (one byte over, at it).
    "/just-over": lambda h: _raw(h, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", iter([ANSWER_AT_BOUND + b" "])),
    "/just-at": lambda h: _raw(h, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", iter([ANSWER_AT_BOUND])),
}
GZIPPED = gzip.compress(b'{"uuid": "u-1"}')
_PADDED = b'{"uuid": "u-1", "pad": "'
ANSWER_AT_BOUND = _PADDED + b"p" * (manager.MAX_ANSWER_BYTES - len(_PADDED) - 2) + b'"}'


class _CannedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Canned)
        self.seen: list[dict[str, Any]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # /slow writes to a socket the client already gave up on


@pytest.fixture
def canned() -> Iterator[_CannedServer]:
    server = _CannedServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(server: _CannedServer, token: str | None = None, read_timeout_s: float = 0.3) -> ManagerClient:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    return ManagerClient(ManagerSpec(url=url, label="C.unit", connect_timeout_s=1.0, read_timeout_s=read_timeout_s),
                         token)


@pytest.fixture(scope="module")
def devmgr() -> Iterator[DevManager]:
    """One for the module (its stop waits out a 0.5 s poll): tests use their own labels and look at their calls."""
    mgr = dev_manager(quiet=True).start()
    yield mgr
    mgr.stop()


# ---------------------------------------------------------------- ManagerClient.request


def as_sent(answer: Answer) -> tuple[int, object]:
    """An answer's status and body; its Date, from a server on this machine's clock, read as no offset at all."""
    assert answer.clock_offset_s is not None and abs(answer.clock_offset_s) < 5, answer
    return answer.status, answer.body


def test_client_200_json_is_parsed(canned: _CannedServer) -> None:
    answer = _client(canned).request("POST", "/ok", json_body={"label": "C.unit", "min_rate": 50})
    assert as_sent(answer) == (200, {"uuid": "u-1", "runner_id": 7})
    assert json.loads(canned.seen[0]["body"]) == {"label": "C.unit", "min_rate": 50}
    assert canned.seen[0]["headers"]["User-Agent"] == manager.USER_AGENT


def test_client_204_has_no_body(canned: _CannedServer) -> None:
    assert as_sent(_client(canned).request("POST", "/empty", data=b"text\n")) == (204, None)


def test_client_expecting_any_answer_ignores_the_body(canned: _CannedServer) -> None:
    assert as_sent(_client(canned).request("POST", "/garbage", expect="any")) == (200, None)


def test_client_expecting_the_managers_done_takes_ok_true_or_204_and_nothing_else(canned: _CannedServer) -> None:
    """/param-done, /running and /api/log-push: a proxy's 200 page (or any 2xx but the manager's "done") answered a
    call the manager never handled; it was counted delivered, and the row stayed where it was."""
    client = _client(canned)
    assert as_sent(client.request("POST", "/done", expect="ok")) == (200, {"ok": True})
    assert as_sent(client.request("POST", "/empty", expect="ok")) == (204, None)
    for path, said in (("/garbage", "with a body that is not JSON: <html>this is not json</html>"),
                       ("/not-done", 'without "ok": true: {"ok": false}'),
                       ("/ok", 'without "ok": true: {"uuid": "u-1", "runner_id": 7}')):
        with pytest.raises(TransientError) as info:
            client.request("POST", path, expect="ok")
        assert str(info.value) == f"POST {path}: HTTP 200 {said}", info.value


@pytest.mark.parametrize(("path", "status", "body"), [("/missing", 404, "unknown uuid"), ("/bad", 400, "label")])
def test_client_4xx_is_permanent_with_the_body(canned: _CannedServer, path: str, status: int, body: str) -> None:
    with pytest.raises(PermanentError) as info:
        _client(canned).request("POST", path, json_body={"uuid": "nope"})
    assert info.value.status == status
    assert body in info.value.body
    assert f"HTTP {status}" in str(info.value)


@pytest.mark.parametrize(("path", "status"), [("/boom", 500), ("/busy", 429), ("/unavailable", 503),
                                            ("/too-slow", 408), ("/too-early", 425)])
def test_client_5xx_and_the_4xx_of_not_yet_are_transient(canned: _CannedServer, path: str, status: int) -> None:
    with pytest.raises(TransientError, match=f"HTTP {status}"):
        _client(canned).request("POST", path, json_body={})


def test_client_read_timeout_is_transient(canned: _CannedServer) -> None:
    started = time.monotonic()
    with pytest.raises(TransientError, match="timed out"):
        _client(canned, read_timeout_s=0.2).request("POST", "/slow", json_body={})
    assert time.monotonic() - started < 0.9  # the read timeout cut it, not the server's answer


def test_client_garbage_json_is_transient(canned: _CannedServer) -> None:
    with pytest.raises(TransientError, match="not JSON"):
        _client(canned).request("POST", "/garbage", json_body={})


def test_client_connection_refused_is_transient() -> None:

    client = ManagerClient(ManagerSpec(url=f"http://127.0.0.1:{free_port()}", label="C.unit",
                                       connect_timeout_s=0.5, read_timeout_s=0.5))
    with pytest.raises(TransientError, match="ConnectionError"):
        client.request("POST", "/register", json_body={"label": "C.unit"})


def test_client_sends_the_bearer_token(canned: _CannedServer) -> None:
    _client(canned, token="tok-123456").request("POST", "/empty", data=b"x")
    assert canned.seen[0]["headers"]["Authorization"] == "Bearer tok-123456"
    _client(canned).request("POST", "/empty", data=b"x")
    assert "Authorization" not in canned.seen[1]["headers"]


def test_with_retries_retries_transient_then_delivers(canned: _CannedServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(manager, "RETRY_JITTER_S", 0.01)
    client = _client(canned)
    paths = iter(["/boom", "/busy", "/ok"])
    retries: list[str] = []
    answer = client.with_retries(lambda: client.request("POST", next(paths), json_body={}), threading.Event(),
                                 lambda error, delay: retries.append(error))
    assert answer.body == {"uuid": "u-1", "runner_id": 7}
    assert len(retries) == 2 and "HTTP 500" in retries[0] and "HTTP 429" in retries[1]


def test_with_retries_does_not_retry_a_permanent_error(canned: _CannedServer) -> None:
    client = _client(canned)
    retries: list[str] = []
    with pytest.raises(PermanentError):
        client.with_retries(lambda: client.request("POST", "/missing", json_body={}), threading.Event(),
                            lambda error, delay: retries.append(error))
    assert retries == []
    assert len(canned.seen) == 1


def test_with_retries_gives_up_when_stopped(canned: _CannedServer) -> None:
    client = _client(canned)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(TransientError):
        client.with_retries(lambda: client.request("POST", "/boom", json_body={}), stop, lambda e, d: None)
    assert time.monotonic() - started < 3.0


def test_client_never_reads_more_than_the_answer_bound(canned: _CannedServer) -> None:
    """An answer over MAX_ANSWER_BYTES, declared or not, is an error, and what was read of it is little."""
    import tracemalloc

    client = _client(canned, read_timeout_s=5.0)
    client.request("POST", "/ok", json_body={})  # what the first call imports is not the answer's
    tracemalloc.start()
    try:
        for path in ("/huge-declared", "/huge-chunked"):
            with pytest.raises(TransientError, match="answer larger than 64 KiB"):
                client.request("POST", path, json_body={})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * manager.MAX_ANSWER_BYTES, f"{peak} bytes were held for an answer that is refused"


def test_the_answer_bound_is_exact_when_the_size_is_not_said(canned: _CannedServer) -> None:
    client = _client(canned, read_timeout_s=5.0)
    assert client.request("POST", "/just-at", json_body={}).body["uuid"] == "u-1"
    with pytest.raises(TransientError, match="answer larger than 64 KiB"):
        client.request("POST", "/just-over", json_body={})


def test_client_refuses_an_encoding_it_did_not_ask_for(canned: _CannedServer) -> None:
    with pytest.raises(TransientError, match="answer encoded as gzip, which was not asked for"):
        _client(canned).request("POST", "/gzip", json_body={})
    assert canned.seen[0]["headers"]["Accept-Encoding"] == "identity"


def test_client_does_not_follow_a_redirect_and_says_so_once(canned: _CannedServer) -> None:
    said: list[str] = []
    url = f"http://127.0.0.1:{canned.server_address[1]}"
    client = ManagerClient(ManagerSpec(url=url, label="C.unit", connect_timeout_s=1.0, read_timeout_s=1.0),
                           warn=said.append)
    for _ in range(3):
        with pytest.raises(TransientError) as info:
            client.request("POST", "/moved", json_body={"uuid": "u-1"})
        assert str(info.value) == ("POST /moved: the manager answered 302 → http://127.0.0.1:9/elsewhere: "
                                   "redirects are not followed; check [manager] url")
    assert said == ["manager: POST /moved: the manager answered 302 → http://127.0.0.1:9/elsewhere: redirects "
                    "are not followed; check [manager] url"]
    assert [c["path"] for c in canned.seen] == ["/moved"] * 3, "the redirect was followed"


@pytest.mark.parametrize(("path", "asked"), [("/later", 1.0), ("/later-date", manager.RETRY_AFTER_MAX_S),
                                              ("/later-garbage", None), ("/boom", None)])
def test_client_reads_retry_after(canned: _CannedServer, path: str, asked: float | None) -> None:
    with pytest.raises(TransientError) as info:
        _client(canned).request("POST", path, json_body={})
    assert info.value.retry_after_s == asked


@pytest.mark.parametrize(("path", "asked"), [("/later-ahead", 5.0), ("/later-behind", 120.0)])
def test_a_retry_after_date_is_read_on_the_managers_clock(canned: _CannedServer, path: str, asked: float) -> None:
    """Its date is the manager's clock's, as its answer's Date is: ours would wait 300 s for 5, or 0 for 120."""
    with pytest.raises(TransientError) as info:
        _client(canned).request("POST", path, json_body={})
    assert info.value.retry_after_s is not None and abs(info.value.retry_after_s - asked) <= 2.0, info.value


def test_with_retries_waits_at_least_what_retry_after_asks(canned: _CannedServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(manager, "RETRY_JITTER_S", 0.01)
    client = _client(canned)
    paths = iter(["/later", "/boom", "/ok"])
    delays: list[float] = []
    client.with_retries(lambda: client.request("POST", next(paths), json_body={}), threading.Event(),
                        lambda error, delay: delays.append(delay))
    assert delays[0] >= 1.0, "the retry came sooner than the manager's Retry-After: 1"
    assert delays[1] < 1.0, "a 500 without Retry-After is paced by the backoff alone"


def test_client_cuts_a_dripping_answer_at_the_call_deadline(canned: _CannedServer) -> None:
    """Each byte comes well inside the read timeout (0.2 s apart, timeout 0.5 s): only the deadline ends it."""
    url = f"http://127.0.0.1:{canned.server_address[1]}"
    spec = ManagerSpec(url=url, label="C.unit", connect_timeout_s=0.5, read_timeout_s=0.5)
    assert manager.call_deadline_s(spec) == 1.0
    with pytest.raises(TransientError, match=r"POST /drip: no complete answer within 1s"):
        ManagerClient(spec).request("POST", "/drip", json_body={})


def test_client_cuts_a_dripping_tls_answer_at_the_call_deadline(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Over TLS the socket read from is a wrapper: the watchdog cuts the TCP socket under it all the same."""
    import shutil
    import socket
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl(1) here to make a certificate for the TLS server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}":
                tls.send(bytes([byte]))
                if stop.wait(0.2):
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    spec = ManagerSpec(url=f"https://localhost:{listener.getsockname()[1]}", label="C.unit", connect_timeout_s=1.0,
                       read_timeout_s=0.5)
    try:
        with pytest.raises(TransientError, match=r"POST /drip: no complete answer within 1.5s"):
            ManagerClient(spec).request("POST", "/drip", json_body={})
    finally:
        stop.set()
        listener.close()
        thread.join(5)


# ---------------------------------------------------------------- Outbox


def test_outbox_order_and_states(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.sqlite3")
    ids = [box.add(kind, {"n": i}) for i, kind in enumerate(["register", "param-done", "bench-done", "running"])]
    assert ids == sorted(ids)
    assert box.pending() == 4
    first = box.next_pending()
    assert first is not None and (first.kind, first.payload) == ("register", {"n": 0})
    box.attempted(first.id, "connection refused")
    box.attempted(first.id, "connection refused")
    box.delivered(first.id, {"uuid": "u"})
    second = box.next_pending()
    assert second is not None and second.kind == "param-done"
    box.failed(second.id, "HTTP 404: unknown uuid", sent=True)
    third = box.next_pending()
    assert third is not None and (third.kind, third.payload) == ("bench-done", {"n": 2})
    assert box.pending() == 2
    states = {h["kind"]: h for h in box.history()}
    assert states["register"]["state"] == "delivered" and states["register"]["attempts"] == 3
    assert states["param-done"]["state"] == "failed" and "404" in states["param-done"]["last_error"]
    assert [h["kind"] for h in box.history()] == ["register", "param-done", "bench-done", "running"]
    box.close()


def test_outbox_finds_a_call_by_kind_and_exact_payload_in_any_state(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    assert box.find("bench-done", {"rate": 0.0}) is None
    first = box.add("bench-done", {"rate": 0.0, "failed": True})
    assert box.find("bench-done", {"rate": 0.0, "failed": True}) == (first, "pending")
    assert box.find("bench-done", {"rate": 0.0}) is None  # the payload whole, not a part of it
    assert box.find("running", {"rate": 0.0, "failed": True}) is None
    box.failed(first, "refused", sent=True)
    assert box.find("bench-done", {"rate": 0.0, "failed": True}) == (first, "failed")
    again = box.add("bench-done", {"rate": 0.0, "failed": True})
    box.delivered(again, {"passed": False})
    assert box.find("bench-done", {"rate": 0.0, "failed": True}) == (again, "delivered")  # the latest
    box.close()


def test_outbox_begun_anew_answers_for_this_instances_calls_only(tmp_path: Path) -> None:
    """A state_dir of another label: what was delivered for it is not this instance's, after a restart too;
    the ledger keeps it all."""
    box = Outbox(tmp_path / "o.sqlite3")
    old = box.add("bench-done", {"rate": 120.0})
    box.delivered(old, {"passed": True})
    box.delivered(box.add("log", {"source": "setup", "text": "old"}))
    box.begin_anew()
    assert box.delivered_answer("bench-done") is None
    assert box.last_delivered_of(["bench-done"]) is None and box.delivered_payloads("log", 5) == []
    assert box.find("bench-done", {"rate": 120.0}) is None
    new = box.add("bench-done", {"rate": 90.0})
    box.delivered(new, {"passed": True, "rate": 90})
    box.close()
    again = Outbox(tmp_path / "o.sqlite3")
    assert again.delivered_answer("bench-done") == {"passed": True, "rate": 90}
    assert again.find("bench-done", {"rate": 90.0}) == (new, "delivered")
    assert [h["kind"] for h in again.history()] == ["bench-done", "log", "bench-done"]
    again.close()


def test_outbox_fails_the_pending_calls_it_is_told_to(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    ids = [box.add(kind, {}) for kind in ("register", "param-done", "log", "running")]
    assert box.fail_pending("set aside", lambda call: call.kind != "register" and call.id != ids[2]) == [
        "param-done", "running"]
    assert [h["state"] for h in box.history()] == ["pending", "failed", "pending", "failed"]
    assert box.history()[1]["last_error"] == "set aside"
    assert box.fail_pending("none", lambda call: False) == []
    box.close()


def test_outbox_adds_unless_a_call_of_the_kinds_is_pending(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    running = box.add("running", {})
    assert box.add_unless_pending("param-done", {"again": 1}, ["param-done", "running"]) is None
    assert box.pending() == 1
    box.delivered(running)
    again = box.add_unless_pending("param-done", {"again": 1}, ["param-done", "running"])
    nxt = box.next_pending()
    assert again is not None and nxt is not None and (nxt.id, nxt.kind, nxt.payload) == (again, "param-done",
                                                                                         {"again": 1})
    assert box.add_unless_pending("log", {}, []) is not None  # no kinds: nothing holds it back
    box.close()

def test_outbox_keeps_a_bounded_tail_of_finished_calls_and_every_kinds_last_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Production pushes a summary every few minutes through the outbox: kept forever, the file would grow for
    # as long as the instance proves. The newest KEEP_FINISHED finished calls stay (the ledger, the repush),
    # each kind's last delivered answer whatever its age (what a restart reads), and every pending call.
    monkeypatch.setattr(outbox_mod, "KEEP_FINISHED", 5)
    monkeypatch.setattr(outbox_mod, "PRUNE_EVERY", 4)
    box = Outbox(tmp_path / "o.sqlite3")
    register = box.add("register", {})
    box.delivered(register, {"uuid": "u"})
    refused = box.add("param-done", {})
    box.failed(refused, "HTTP 400", sent=True)
    waiting = box.add("bench-done", {"rate": 1.0})  # never delivered: pending, kept whatever its age
    logs = []
    for i in range(10):
        logs.append(box.add("log", {"text": f"summary {i}"}))
        box.delivered(logs[-1])
    with sqlite3.connect(tmp_path / "o.sqlite3") as db:
        kept = [row[0] for row in db.execute("SELECT id FROM calls ORDER BY id")]
    # 12 finished so far: pruned at the 4th, 8th and 12th; the newest 5 finished stay, with the register's answer.
    assert kept == [register, waiting, *logs[-5:]], kept
    assert box.delivered_answer("register") == {"uuid": "u"} and box.pending() == 1
    assert [p["text"] for p in box.delivered_payloads("log", 3)] == ["summary 7", "summary 8", "summary 9"]
    box.close()


def test_outbox_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    box = Outbox(path)
    done = box.add("register", {"label": "C.1"})
    box.delivered(done, {"uuid": "u"})
    box.add("param-done", {})
    box.add("bench-done", {"rate": 61.5})
    box.put("uuid", "u-1")
    box.put("uuid", "u-2")
    box.put("label", "C.1")
    box.close()
    again = Outbox(path)
    assert again.corrupt_note is None
    assert again.pending() == 2
    call = again.next_pending()
    assert call is not None and call.kind == "param-done"
    again.delivered(call.id)
    call = again.next_pending()
    assert call is not None and (call.kind, call.payload) == ("bench-done", {"rate": 61.5})
    assert again.get("uuid") == "u-2" and again.get("label") == "C.1" and again.get("nothing") is None
    again.close()
    # What another process (sqlite3) sees: the same rows.
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT kind, state FROM calls ORDER BY id").fetchall()
    assert rows == [("register", "delivered"), ("param-done", "delivered"), ("bench-done", "pending")]


def test_outbox_corrupt_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    path.write_bytes(b"this is not a database, not at all" * 200)
    box = Outbox(path)
    assert box.corrupt_note is not None and "moved to" in box.corrupt_note
    aside = list(tmp_path.glob("outbox.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    assert box.pending() == 0
    box.add("register", {})
    assert box.pending() == 1
    box.close()
    assert Outbox(path).pending() == 1  # the clean one is a real database


@pytest.mark.parametrize(("sql", "said"), [
    ("CREATE TABLE calls (x INTEGER);", "calls has no column id, kind, payload, created, state, attempts"),
    ("CREATE TABLE facts (k TEXT, v TEXT);", "not the outbox's tables: facts, and no calls"),
    ("CREATE TABLE calls (id INTEGER PRIMARY KEY, kind TEXT, payload TEXT, created REAL, state TEXT, attempts INTEGER, "
     "finished REAL, last_error TEXT, response TEXT); CREATE TABLE facts (k TEXT, v TEXT);",
     "facts has no column key, value"),
    # (another program's database: the outbox's tables were added to it, and it was made WAL and written)
    ("CREATE TABLE users (name TEXT);", "not the outbox's tables: users, and no calls"),
    # (every column, no key: a row of NULL id could never be marked failed, and the sender read it for ever)
    ("CREATE TABLE calls (id, kind, payload, created, state, attempts, finished, last_error, response);"
     "INSERT INTO calls VALUES (NULL, 'x', '{}', 1.0, 'pending', 0, NULL, NULL, NULL);",
     "calls is not keyed by an INTEGER PRIMARY KEY id"),
])
def test_an_outbox_of_foreign_tables_is_moved_aside(tmp_path: Path, sql: str, said: str) -> None:
    # Its integrity check passed, and every query failed on the missing column, at every start: manager reporting
    # off ("it could not start"), or each call failed by the sender's bug rule.
    path = tmp_path / "outbox.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(sql)
    box = Outbox(path)
    assert box.corrupt_note is not None and said in box.corrupt_note and "moved to" in box.corrupt_note, \
        box.corrupt_note
    assert len(list(tmp_path.glob("outbox.sqlite3.corrupt-*"))) == 1
    call_id = box.add("register", {"label": "C.1"})
    assert [c.id for c in _drain(box)] == [call_id]
    box.close()


def test_a_pending_call_that_is_unreadable_is_failed_in_one_line_and_the_next_one_comes(tmp_path: Path) -> None:
    # A payload that was no JSON (a row another program wrote) raised in the sender thread at every start: one
    # internal error, and no call was delivered after it, for ever.
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path)
    bad, kept = box.add("param-done", {}), box.add("running", {"ok": 1})
    box.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE calls SET payload = '{not json' WHERE id = ?", (bad,))
    notes: list[str] = []
    box = Outbox(path, notes.append)
    assert box.pending() == 2
    call = box.next_pending()
    assert call is not None and (call.id, call.kind, call.payload) == (kept, "running", {"ok": 1})
    assert notes == [f"outbox: call {bad} ('param-done') is unreadable (its payload is no JSON object, or a field "
                     "is of the wrong type); failed, not sent"], notes
    assert box.pending() == 1 and box.pending_calls("param-done") == []
    box.close()


def test_an_own_from_fact_that_is_no_call_id_takes_the_calls_so_far_for_another_instances(tmp_path: Path) -> None:
    # int() of it raised as the outbox opened: manager reporting off for the whole run, at every start.
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path)
    box.delivered(box.add("register", {"label": "C.1"}), {"uuid": "u-old"})
    box.put(outbox_mod.OWN_FROM, "x")
    box.close()
    notes: list[str] = []
    box = Outbox(path, notes.append)
    assert notes == ["outbox: its own_from fact 'x' is no call id; the calls so far are taken for another "
                     "instance's"], notes
    assert box.delivered_answer("register") is None  # (the instance registers again: the manager's is idempotent)
    box.close()


class _ReadFailsAtCheck:
    """A connection to the outbox file whose integrity check fails as a passing read error does (a full disk, an
    I/O error: not SQLITE_CORRUPT); everything else goes to the real connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("PRAGMA quick_check"):
            exc = sqlite3.OperationalError("disk I/O error")
            exc.sqlite_errorname = "SQLITE_IOERR"  # type: ignore[attr-defined]
            raise exc
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_outbox_whose_check_fails_with_a_passing_error_is_not_moved_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A read that fails at start for a reason other than damage (a full disk) is no reason to move a sound file
    # aside: its calls are read into memory and the file stays where it is.
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path)
    kept = [box.add("param-done", {}), box.add("bench-done", {"rate": 90.0})]
    box.put("uuid", "u-3")
    box.close()
    real_connect = sqlite3.connect

    def connect(database: Any, *args: Any, **kwargs: Any) -> Any:
        db = real_connect(database, *args, **kwargs)
        return _ReadFailsAtCheck(db) if str(database) == str(path) else db

    monkeypatch.setattr(outbox_mod, "RETRY_WRITE_S", 3600.0)
    monkeypatch.setattr(sqlite3, "connect", connect)
    notes: list[str] = []
    box = Outbox(path, notes.append)
    monkeypatch.setattr(sqlite3, "connect", real_connect)
    assert box.corrupt_note is None, box.corrupt_note
    assert not list(tmp_path.glob("outbox.sqlite3.corrupt-*"))
    assert box.in_memory and any("cannot read it" in n for n in notes), notes
    assert box.get("uuid") == "u-3" and [c.id for c in _drain(box)] == kept
    box.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT id, state FROM calls ORDER BY id").fetchall() == [(i, "delivered") for i in kept]


def _damaged_outbox(path: Path, pages_of: str) -> tuple[list[int], int]:
    """An outbox with 300 calls (100 pending) and 200 facts, then the root page of ``pages_of`` (a table or
    index) overwritten with garbage, WAL and SHM left beside it as a SIGKILL leaves them. Returns the pending
    ids and the page size."""
    box = Outbox(path)
    pending = []
    for n in range(300):
        call_id = box.add("log", {"text": f"call {n} " + "z" * 200})
        if n % 3:
            box.delivered(call_id, None)
        else:
            pending.append(call_id)
    box.put("uuid", "u-salvaged")
    for n in range(200):
        box.put(f"fact-{n:03d}", "v" * 100)
    box._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the pages are in the main file now
    page_size = box._db.execute("PRAGMA page_size").fetchone()[0]
    root = box._db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (pages_of,)).fetchone()[0]
    box.add("running", {})  # one more, in the WAL only
    with open(path, "r+b") as f:  # while the outbox is open (and its WAL and SHM exist): a torn write
        f.seek((root - 1) * page_size)
        f.write(b"\xde\xad\xbe\xef" * (page_size // 4))
    # Left as a killed process leaves it: no close, so no checkpoint.
    return pending, page_size


def test_outbox_with_a_bad_index_page_keeps_every_call_and_fact(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    pending, _ = _damaged_outbox(path, "sqlite_autoindex_facts_1")
    box = Outbox(path)
    assert box.corrupt_note is not None and "damaged" in box.corrupt_note and "moved to" in box.corrupt_note
    aside = sorted(p.name for p in tmp_path.glob("outbox.sqlite3.corrupt-*"))
    assert len(aside) in (1, 2, 3) and aside[0].endswith(tuple("0123456789")), aside  # the file, its WAL, SHM
    assert box.get("uuid") == "u-salvaged" and box.get("fact-199") == "v" * 100
    assert box.pending() == len(pending) + 1  # the index held no call: all of them are kept
    assert [c.id for c in _drain(box)][:len(pending)] == pending
    box.close()
    again = Outbox(path)  # and the next start finds a sound file: no crash loop
    assert again.corrupt_note is None and again.get("uuid") == "u-salvaged"
    again.close()


def test_outbox_with_a_bad_table_page_keeps_what_is_readable(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    pending, _ = _damaged_outbox(path, "calls")
    box = Outbox(path)
    assert box.corrupt_note is not None and "damaged" in box.corrupt_note
    # The root of the calls table is gone: the calls under it cannot be reached, the facts can.
    assert box.get("uuid") == "u-salvaged"
    kept = box.pending()
    assert kept <= len(pending) + 1
    box.add("param-done", {})
    assert box.pending() == kept + 1
    box.close()
    assert Outbox(path).corrupt_note is None


def test_outbox_is_thread_safe(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")

    def adder(n: int) -> None:
        for i in range(20):
            box.add("log", {"n": n * 100 + i})

    threads = [threading.Thread(target=adder, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert box.pending() == 80
    assert len({c.id for c in _drain(box)}) == 80
    box.close()


def _drain(box: Outbox) -> list[Call]:
    calls = []
    while (call := box.next_pending()) is not None:
        box.delivered(call.id)
        calls.append(call)
    return calls


# ---------------------------------------------------------------- Redactor


def test_redactor_masks_text_and_bytes() -> None:
    r = Redactor(["s3cr3t-value-123", "s3cr3t", "abc", ""])
    assert bool(r)
    # Longest first: no "***-value-123" leftovers; too-short values are not secrets.
    assert r.text("token=s3cr3t-value-123 other=s3cr3t abc") == f"token={MASK} other={MASK} abc"
    assert r.data(b"x s3cr3t-value-123 y") == b"x " + MASK.encode() + b" y"
    assert not Redactor([])
    assert Redactor([]).text("s3cr3t") == "s3cr3t"


def test_redactor_from_environments() -> None:
    env = {"API_TOKEN": "tok-aaaa", "DB_PASSWORD": "pw-bbbb", "CONTAINER_API_KEY": "key-cccc",
           "MY_AUTH": "auth-dddd", "HOME": "/root-eeee", "SHORT_KEY": "x"}
    r = Redactor.from_environments([env], extra_names=["MY_AUTH"])
    text = " ".join(env.values())
    assert r.text(text) == f"{MASK} {MASK} {MASK} {MASK} /root-eeee x"


@pytest.mark.parametrize(("name", "secret"), [("API_TOKEN", True), ("aws_secret", True), ("DB_PASSWD", True),
                                              ("CONTAINER_API_KEY", True), ("KEYRING", False), ("PATH", False),
                                              ("TOKEN_FILE", False)])
def test_looks_secret(name: str, secret: bool) -> None:
    assert looks_secret(name) is secret


# ---------------------------------------------------------------- bench output


# ---------------------------------------------------------------- Shipper


class _Recorder:
    def __init__(self, fail_first: int = 0, error: type[Exception] = TransientError) -> None:
        self.bodies: list[tuple[str, str]] = []
        self.seqs: list[str] = []  # the X-Log-Seq of every attempt
        self.fail_first = fail_first
        self.error = error
        self.attempts = 0

    def __call__(self, source: str, body: str, seq: str = "") -> None:
        self.attempts += 1
        self.seqs.append(seq)
        if self.attempts <= self.fail_first:
            if self.error is PermanentError:
                raise PermanentError(404, "unknown uuid")
            raise self.error("manager down")
        self.bodies.append((source, body))


def _shipper(send: Any, backlog: int = 64 * 1024 * 1024, ready: Any = None) -> tuple[Shipper, list[str]]:
    said: list[str] = []
    return Shipper("log shipping", send, ready or (lambda: True), 60.0, backlog, said.append), said


def test_take_never_exceeds_the_push_limit() -> None:
    send = _Recorder()
    shipper, _ = _shipper(send)
    lines = [f"line {i:06d} " + ("é" * 60 if i % 2 else "x" * 150) for i in range(20000)]  # ~3.3 MB in bytes
    shipper.add("curio", lines)
    body, count, dropped, seq = shipper._take_numbered("curio")
    assert seq == f"{shipper.run_id}:curio:1-{count}"
    assert 0 < count < len(lines) and dropped == 0
    assert len(body.encode()) <= PUSH_MAX_BYTES < LOG_PUSH_LIMIT
    assert body.endswith("\n") and body.split("\n")[0] == lines[0]
    assert body.rstrip("\n").split("\n") == lines[:count]


def test_ship_once_splits_a_flood_into_pushes_under_256k() -> None:
    send = _Recorder()
    shipper, _ = _shipper(send)
    lines = [f"line {i:06d} " + ("ü" * 50 if i % 3 else "y" * 120) for i in range(30000)]
    shipper.add("benchdaemon", lines)
    assert shipper.ship_once()
    sizes = [len(body.encode()) for _, body in send.bodies]
    assert len(sizes) > 5
    assert max(sizes) <= 256 * 1024
    got = [line for _, body in send.bodies for line in body.rstrip("\n").split("\n")]
    assert got == lines  # all of them, in order, none twice
    assert {source for source, _ in send.bodies} == {"benchdaemon"}
    assert shipper.backlog() == {}
    assert shipper.pushed == len(sizes)


def test_one_huge_line_is_cut_to_the_limit() -> None:
    send = _Recorder()
    shipper, _ = _shipper(send)
    shipper.add("setup", ["z" * (400 * 1024), "after"])
    assert shipper.ship_once()
    sizes = [len(body.encode()) for _, body in send.bodies]
    assert max(sizes) <= 256 * 1024
    assert send.bodies[-1][1] == "after\n"


def test_backlog_drops_oldest_and_the_next_push_says_how_many() -> None:
    send = _Recorder()
    shipper, _ = _shipper(send, backlog=10_000)
    lines = [f"{i:05d}" + "q" * 94 for i in range(1000)]  # 100 bytes each with the newline
    shipper.add("curio", lines)
    assert sum(shipper.backlog().values()) <= 10_000
    assert shipper.ship_once()
    body = "".join(b for _, b in send.bodies)
    first, *rest = body.rstrip("\n").split("\n")
    # (the manager answered every push: the backlog filled faster than they went, and the note says no more)
    assert first == "[prover-supervisor: 900 older line(s) dropped from a full backlog (log_backlog_bytes)]"
    assert rest == lines[900:]
    # The note is said once, not on every later push.
    shipper.add("curio", ["later"])
    assert shipper.ship_once()
    assert send.bodies[-1][1] == "later\n"


def test_failed_push_is_kept_and_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logship, "PUSH_RETRY_S", 0.0)
    send = _Recorder(fail_first=1)
    shipper, _ = _shipper(send, backlog=1000)
    shipper.add("curio", [f"{i:03d}" + "w" * 96 for i in range(20)])  # 2000 bytes: 10 dropped
    assert not shipper.ship_once()
    assert send.bodies == [] and send.attempts == 1
    assert shipper.ship_once()
    body = send.bodies[0][1].rstrip("\n").split("\n")
    assert body[0].startswith("[prover-supervisor: 10 older line(s) dropped")
    assert body[1:] == [f"{i:03d}" + "w" * 96 for i in range(10, 20)]


def _log_pushes(mgr: DevManager) -> list[dict[str, Any]]:
    return [c for c in mgr.state.snapshot()["calls"] if c["path"] == "/api/log-push"]


def test_a_push_asked_to_wait_is_not_sent_before_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logship, "PUSH_RETRY_S", 0.0)  # the backoff alone would push again at once
    mgr = dev_manager(quiet=True).start()
    try:
        _post(mgr, "/dev/faults", {"status": 503, "retry_after": 30, "count": 1, "path": "/api/log-push"})
        client = ManagerClient(ManagerSpec(url=mgr.url, label="C.unit", read_timeout_s=5.0))
        shipper, _ = _shipper(log_push_sender(client, lambda: "u-wait"))
        shipper.add("setup", ["asked to wait"])
        assert not shipper.ship_once()
        assert not shipper.ship_once()
        assert len(_log_pushes(mgr)) == 1, "pushed again before the manager's Retry-After"
        assert shipper.backlog() == {"setup": len("asked to wait") + 1}
    finally:
        mgr.stop()


def test_a_redirected_push_is_kept_and_delivered_once_the_manager_behaves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logship, "PUSH_RETRY_S", 0.0)
    mgr = dev_manager(quiet=True).start()
    try:
        _post(mgr, "/dev/faults", {"redirect": 302, "count": 1, "path": "/api/log-push"})
        client = ManagerClient(ManagerSpec(url=mgr.url, label="C.unit", read_timeout_s=5.0))
        shipper, said = _shipper(log_push_sender(client, lambda: "u-moved"))
        shipper.add("setup", ["kept through a redirect"])
        assert not shipper.ship_once() and shipper.pushed == 0
        assert shipper.ship_once() and shipper.pushed == 1
        assert mgr.state.snapshot()["logs"]["u-moved"]["setup"] == "kept through a redirect\n"
        assert [c["status"] for c in _log_pushes(mgr)] == [302, 204]
        assert said == [], "a redirect is no refusal: nothing was dropped"
    finally:
        mgr.stop()


def test_refused_push_is_dropped_and_said_once() -> None:
    send = _Recorder(fail_first=2, error=PermanentError)
    shipper, said = _shipper(send)
    shipper.add("curio", ["a"])
    assert shipper.ship_once()
    shipper.add("curio", ["b"])
    assert shipper.ship_once()
    shipper.add("curio", ["c"])
    assert shipper.ship_once()
    assert send.bodies == [("curio", "c\n")]
    assert len([s for s in said if "refused" in s]) == 1


def test_nothing_is_pushed_until_ready() -> None:
    send = _Recorder()
    ready = {"uuid": ""}
    shipper, _ = _shipper(send, ready=lambda: bool(ready["uuid"]))
    shipper.add("setup", ["early"])
    assert not shipper.ship_once()
    assert send.attempts == 0
    ready["uuid"] = "u"
    assert shipper.ship_once()
    assert send.bodies == [("setup", "early\n")]


def test_shipper_thread_pushes_to_the_dev_manager(devmgr: DevManager) -> None:
    client = ManagerClient(ManagerSpec(url=devmgr.url, label="C.unit", read_timeout_s=5.0))
    uuid = client.request("POST", "/register", json_body={"label": "C.ship"}).body["uuid"]
    shipper = Shipper("log shipping", log_push_sender(client, lambda: uuid), lambda: True, 0.05, 8 * 1024 * 1024,
                      lambda s: None)
    shipper.start()
    lines = [f"daemon line {i:06d} " + "d" * 80 for i in range(12000)]  # ~1.1 MB
    shipper.add("benchdaemon", lines[:6000])
    shipper.add("benchdaemon", lines[6000:])
    shipper.add("setup", ["[supervisor] hello"])
    shipper.stop(5.0)
    snap = devmgr.state.snapshot()
    assert snap["logs"][uuid]["benchdaemon"] == "\n".join(lines) + "\n"  # nothing cut at 256 KiB
    assert snap["logs"][uuid]["setup"] == "[supervisor] hello\n"
    wait_for(lambda: len([c for c in devmgr.state.snapshot()["calls"] if c["path"] == "/api/log-push"]) >= 5, 5)
    assert all(c["status"] == 204 for c in devmgr.state.snapshot()["calls"] if c["path"] == "/api/log-push")


# ---------------------------------------------------------------- the dev-manager's routes


def _post(mgr: DevManager, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(mgr.url + path, json=body, timeout=5)


def test_devmanager_register_is_idempotent_per_label(devmgr: DevManager) -> None:
    a = _post(devmgr, "/register", {"label": "C.1", "min_rate": 10})
    b = _post(devmgr, "/register", {"label": "C.1", "min_rate": 10})
    c = _post(devmgr, "/register", {"label": "C.2"})
    assert a.status_code == b.status_code == c.status_code == 200
    assert a.json() == b.json()
    assert c.json()["uuid"] != a.json()["uuid"] and c.json()["runner_id"] != a.json()["runner_id"]
    insts = [i for i in devmgr.state.snapshot()["instances"].values() if i["label"] in ("C.1", "C.2")]
    assert len(insts) == 2
    assert next(i for i in insts if i["label"] == "C.2")["min_rate"] == 50  # min_rate <= 0 or missing means 50


def test_devmanager_lifecycle_and_kill(devmgr: DevManager) -> None:
    reg = _post(devmgr, "/register", {"label": "C.3", "min_rate": 60}).json()
    uuid = reg["uuid"]
    assert _post(devmgr, "/param-done", {"uuid": uuid}).json() == {"ok": True}
    assert _post(devmgr, "/param-done", {"uuid": uuid}).json() == {"ok": True}  # a no-op now
    assert _post(devmgr, "/bench-done", {"uuid": uuid, "rate": 61.5}).json() == {"ok": True, "passed": True}
    assert _post(devmgr, "/running", {"uuid": uuid}).json() == {"ok": True}
    inst = devmgr.state.snapshot()["instances"][uuid]
    assert inst["history"] == ["registered", "params_done", "bench_done", "running"]
    assert inst["rate"] == 61.5
    # A second instance fails its bench: killed, running refused, and its label registers afresh.
    other = _post(devmgr, "/register", {"label": "C.4", "min_rate": 60}).json()
    assert _post(devmgr, "/bench-done", {"uuid": other["uuid"], "rate": 12}).json() == {"ok": True, "passed": False}
    assert devmgr.state.snapshot()["instances"][other["uuid"]]["state"] == "killed"
    assert _post(devmgr, "/running", {"uuid": other["uuid"]}).status_code == 404
    again = _post(devmgr, "/register", {"label": "C.4", "min_rate": 60}).json()
    assert again["uuid"] != other["uuid"]


def test_devmanager_errors(devmgr: DevManager) -> None:
    assert _post(devmgr, "/register", {"min_rate": 3}).status_code == 400
    assert requests.post(devmgr.url + "/register", data=b"not json", timeout=5).status_code == 400
    assert requests.get(devmgr.url + "/register", timeout=5).status_code == 405
    assert requests.get(devmgr.url + "/param-done", timeout=5).status_code == 405
    for path in ("/param-done", "/bench-done", "/running"):
        assert _post(devmgr, path, {"uuid": "no-such-uuid", "rate": 99}).status_code == 404, path
    assert requests.get(devmgr.url + "/runner-id", params={"uuid": "no-such-uuid"}, timeout=5).status_code == 404
    assert requests.get(devmgr.url + "/runner-id", timeout=5).status_code == 400
    assert requests.post(devmgr.url + "/api/log-push", data=b"x\n", timeout=5).status_code == 400


def test_devmanager_refuses_numbers_that_are_not_json_numbers_as_gos_decoder_does(devmgr: DevManager) -> None:
    # The real handlers decode into a float64: "61.5" or true is a 400, not a rate of 0 (a kinder stand-in would
    # let a client that sends strings pass its tests and be refused by the real manager).
    assert _post(devmgr, "/register", {"label": "C.types", "min_rate": "60"}).status_code == 400
    uuid = _post(devmgr, "/register", {"label": "C.types", "min_rate": 60}).json()["uuid"]
    for rate in ("61.5", True, [61.5]):
        answer = _post(devmgr, "/bench-done", {"uuid": uuid, "rate": rate})
        assert answer.status_code == 400 and "cannot unmarshal" in answer.json()["error"], (rate, answer.text)
    assert devmgr.state.snapshot()["instances"][uuid]["state"] == "registered"  # refused: nothing changed
    assert _post(devmgr, "/bench-done", {"uuid": uuid, "rate": None}).json() == {"ok": True, "passed": False}


def test_devmanager_stamps_bench_done_at_at_every_call_pass_or_fail(devmgr: DevManager) -> None:
    uuid = _post(devmgr, "/register", {"label": "C.stamps", "min_rate": 60}).json()["uuid"]
    assert _post(devmgr, "/bench-done", {"uuid": uuid, "rate": 12}).json()["passed"] is False
    first = devmgr.state.snapshot()["instances"][uuid]["bench_done_at"]
    assert first is not None  # a failed bench-done is stamped too, as the real one stamps it
    time.sleep(0.01)
    assert _post(devmgr, "/bench-done", {"uuid": uuid, "rate": 61.5}).json()["passed"] is True
    row = devmgr.state.snapshot()["instances"][uuid]
    assert row["bench_done_at"] > first and row["rate"] == 61.5 and row["state"] == "bench_done"


def test_devmanager_runner_id(devmgr: DevManager) -> None:
    reg = _post(devmgr, "/register", {"label": "C.5"}).json()
    got = requests.get(devmgr.url + "/runner-id", params={"uuid": reg["uuid"]}, timeout=5)
    assert got.status_code == 200 and got.json() == {"runner_id": reg["runner_id"]}


def test_devmanager_log_push_keeps_256k_of_one_body(devmgr: DevManager) -> None:
    uuid = _post(devmgr, "/register", {"label": "C.6"}).json()["uuid"]
    body = b"".join(b"%07d " % i + b"L" * 91 + b"\n" for i in range(4000))  # 400000 bytes
    got = requests.post(devmgr.url + "/api/log-push", data=body, timeout=5,
                        headers={"X-Instance-UUID": uuid, "X-Log-Source": "cuzk"})
    assert got.status_code == 204 and got.content == b""
    requests.post(devmgr.url + "/api/log-push", data=b"no source\n", headers={"X-Instance-UUID": uuid}, timeout=5)
    logs = devmgr.state.snapshot()["logs"][uuid]
    assert logs["cuzk"].encode() == body[:LOG_PUSH_LIMIT]
    assert logs["unknown"] == "no source\n"


def test_devmanager_faults() -> None:
    # A dev-manager of its own: it notes a call just after answering it, so a shared one's list may still grow.
    devmgr = dev_manager(quiet=True).start()
    try:
        requests.post(devmgr.url + "/dev/faults", json={"status": 500, "count": 2}, timeout=5)
        assert _post(devmgr, "/register", {"label": "C.7"}).status_code == 500
        assert _post(devmgr, "/register", {"label": "C.7"}).status_code == 500
        assert _post(devmgr, "/register", {"label": "C.7"}).status_code == 200
        requests.post(devmgr.url + "/dev/faults", json={"garbage": True, "count": 1}, timeout=5)
        garbage = _post(devmgr, "/register", {"label": "C.7"})
        assert garbage.status_code == 200 and garbage.text.startswith("<html>")
        requests.post(devmgr.url + "/dev/faults", json={"reset": True, "count": 1}, timeout=5)
        with pytest.raises(requests.ConnectionError):
            requests.post(devmgr.url + "/register", json={"label": "C.7"}, timeout=5)
        assert _post(devmgr, "/register", {"label": "C.7"}).status_code == 200
        wait_for(lambda: len(devmgr.state.snapshot()["calls"]) == 6, 5)
        statuses = [c["status"] for c in devmgr.state.snapshot()["calls"]]
        assert statuses == [500, 500, 200, 200, 0, 200]
    finally:
        devmgr.stop()


def test_devmanager_misbehaves_as_asked() -> None:
    """The hostile faults (devmanager/faults.py), seen by a plain client: what each one sends, and a typo refused."""
    devmgr = dev_manager(quiet=True).start()
    try:
        assert _post(devmgr, "/dev/faults", {"statuss": 500}).status_code == 400  # not silently "no fault"
        _post(devmgr, "/dev/faults", {"redirect": 307, "location": "http://x/y", "count": 1})
        moved = requests.post(devmgr.url + "/register", json={"label": "C.8"}, timeout=5, allow_redirects=False)
        assert (moved.status_code, moved.headers["Location"]) == (307, "http://x/y")
        _post(devmgr, "/dev/faults", {"status": 429, "retry_after": 7, "count": 1})
        later = _post(devmgr, "/register", {"label": "C.8"})
        assert (later.status_code, later.headers["Retry-After"]) == (429, "7")
        _post(devmgr, "/dev/faults", {"answer": {"uuid": "a\r\nb"}, "count": 1})
        assert _post(devmgr, "/register", {"label": "C.8"}).json() == {"uuid": "a\r\nb"}
        assert len(devmgr.state.snapshot()["instances"]) == 1, "a spoilt answer's call is still handled"
        _post(devmgr, "/dev/faults", {"huge_body_bytes": 3_000_000, "count": 1})
        huge = requests.post(devmgr.url + "/register", json={"label": "C.8"}, timeout=5, stream=True)
        assert huge.headers["Content-Length"] == "3000000"
        assert sum(len(chunk) for chunk in huge.iter_content(1 << 16)) == 3_000_000
        _post(devmgr, "/dev/faults", {"drip_bytes_per_s": 50, "count": 1})
        started = time.monotonic()
        dripped = _post(devmgr, "/register", {"label": "C.8"})
        assert dripped.status_code == 200 and dripped.json()["uuid"]
        assert time.monotonic() - started > 1.0, "a ~100-byte answer at 50 bytes/s came at once"
        assert _post(devmgr, "/register", {"label": "C.8"}).status_code == 200  # every fault used up
    finally:
        devmgr.stop()


# ---------------------------------------------------------------- giving the instance up (real supervisor, dev-manager)

BENCH_OK = """
print("=== Batch Summary ===")
print("completed:     2")
print("failed:        0")
print("throughput:    1.000 proofs/min (60.0s/proof)")
"""
_labels = iter(range(1_000_000))


def give_up_config(sup: Runner, mgr: DevManager, manager_keys: str = "", fetch: str = "true",
                   production: str | None = None, port: int | None = None, bench: bool = True) -> tuple[Any, str]:
    """fetch (param-done) → bench (bench-done, 60/h against min_rate 1) → prod (by default a service that fails
    before it is up)."""
    label = f"C.give-up-{next(_labels)}"
    bench_phase = f"""
        [[phases]]
        name = "bench"
        command = {pyc(BENCH_OK)}
        parse = "cuzk-bench"
        report = "bench-done"
        """ if bench else ""
    config = sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1
        bench_gate_s = 5
        {manager_keys}

        [[phases]]
        name = "fetch"
        command = {sh(fetch)}
        report = "param-done"
        {bench_phase}
        [[phases]]
        name = "prod"
        kind = "service"
        restart = "no"
        command = {production or sh("exit 5")}
        ready = "tcp://127.0.0.1:{port or free_port()}"
        report = "running"
        """)
    return config, label


def instance_of(mgr: DevManager, label: str) -> dict[str, Any]:
    [inst] = [i for i in mgr.state.snapshot()["instances"].values() if i["label"] == label]
    return inst


def bench_done_calls(mgr: DevManager, before: int) -> int:
    return sum(1 for c in mgr.state.snapshot()["calls"][before:] if c["path"] == "/bench-done")


@pytest.mark.parametrize("switch", ["give_up_on_failure = false", "report_bench_failure = false"])
def test_give_up_off_leaves_the_instance_to_the_managers_timeout(sup: Runner, devmgr: DevManager,
                                                                 switch: str) -> None:
    before = len(devmgr.state.snapshot()["calls"])
    config, label = give_up_config(sup, devmgr, switch, fetch="exit 4")
    result = sup.run(config, timeout=30)
    assert result.returncode == 4, result.output
    assert "manager: not giving the instance up (give_up_on_failure = false)" in result.output
    assert instance_of(devmgr, label)["history"] == ["registered"]
    assert bench_done_calls(devmgr, before) == 0


@pytest.mark.parametrize("send_reason", [True, False])
def test_bench_done_reason_is_sent_only_when_asked(sup: Runner, devmgr: DevManager,
                                                   send_reason: bool) -> None:
    config, label = give_up_config(sup, devmgr, f"bench_done_reason = {str(send_reason).lower()}", fetch="exit 4")
    result = sup.run(config, timeout=30)
    assert result.returncode == 4, result.output
    inst = instance_of(devmgr, label)
    assert inst["history"] == ["registered", "killed"], inst
    computed = "bench_rate 0.0 below min_rate 1.0"
    if send_reason:
        assert inst["kill_reason"].startswith(computed + "; reason: phase=fetch child=fetch "), inst
        assert "reason=exit_code exit_code=4" in inst["kill_reason"], inst
    else:
        assert inst["kill_reason"] == computed, inst


def test_production_that_never_came_up_gives_the_instance_up_after_a_passed_bench(
        sup: Runner, devmgr: DevManager) -> None:
    """The bench passed, then curio failed for good before it was ever up: the supervisor exits and the
    manager has no timeout for bench_done, so the instance would be paid for with nothing proving.
    A second bench-done, with rate 0 and after the reason line, gives it up."""
    before = len(devmgr.state.snapshot()["calls"])
    config, label = give_up_config(sup, devmgr)
    result = sup.run(config, timeout=30)
    out = result.output
    assert result.returncode == 5, out
    assert "giving the instance up (phase prod failed): bench-done with rate 0 after the reason line; the bench " \
           "had passed, but production never came up" in out, out
    assert bench_done_calls(devmgr, before) == 2
    calls = [c for c in devmgr.state.snapshot()["calls"][before:] if c["path"] in ("/bench-done", "/api/log-push")]
    failure_push = max(i for i, c in enumerate(calls) if c["path"] == "/api/log-push" and "FAILED" in str(c))
    give_up = max(i for i, c in enumerate(calls) if c["path"] == "/bench-done")
    assert failure_push < give_up, calls  # the reason reached the manager's log before the instance went
    assert instance_of(devmgr, label)["history"] == ["registered", "params_done", "bench_done", "killed"]


def test_a_failure_for_good_after_production_was_up_is_a_give_up(sup: Runner, devmgr: DevManager) -> None:
    # Production came up, then failed for good (restart = "no"): an instance billed for days that proves
    # nothing is given up too (issue 16; it was not before).
    port = free_port()
    before = len(devmgr.state.snapshot()["calls"])
    config, label = give_up_config(sup, devmgr, production=pyc(SERVE_THEN_FAIL.replace("PORT", str(port))),
                                   port=port, bench=False)
    result = sup.run(config, timeout=30)
    assert result.returncode == 6, result.output
    assert "giving the instance up (phase prod failed)" in result.output, result.output
    assert "production was up, and failed for good" in result.output
    assert bench_done_calls(devmgr, before) == 1
    assert instance_of(devmgr, label)["history"] == ["registered", "params_done", "running", "killed"]


SERVE_THEN_FAIL = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", PORT)); s.listen()
time.sleep(1.5)
sys.exit(6)
"""
# ---------------------------------------------------------------- duplicates after a read timeout (X-Log-Seq)

SLOW_EVERY = 5  # one push in this many is answered after the client's read timeout
PUSHES = 20


def test_retried_pushes_carry_the_same_numbers_and_the_dev_manager_keeps_each_line_once() -> None:
    """Every SLOW_EVERY-th push is held by the dev-manager past the read timeout: the supervisor takes it for
    lost and sends it again, the manager already has it. Measured: how many lines arrive twice (the price of
    at-least-once); and with X-Log-Seq the dev-manager keeps every line exactly once, in order."""
    mgr = dev_manager(quiet=True).start()
    try:
        client = ManagerClient(ManagerSpec(url=mgr.url, label="C.unit", connect_timeout_s=1.0, read_timeout_s=0.3))
        uuid = client.request("POST", "/register", json_body={"label": "C.dups"}).body["uuid"]
        shipper = Shipper("log shipping", log_push_sender(client, lambda: uuid), lambda: True, 60.0, 1 << 24,
                          lambda s: None)
        sent: list[str] = []
        slow = 0
        for push in range(PUSHES):
            lines = [f"push {push} line {n}" for n in range(10)]
            shipper.add("curio", lines)
            sent += lines
            if push % SLOW_EVERY == SLOW_EVERY - 1:
                _post(mgr, "/dev/faults", {"delay_s": 0.6, "count": 1})  # answered after the 0.3 s read timeout
                slow += 1
                assert shipper.ship_once() is False  # timed out: kept to be sent again
            wait_for(shipper.ship_once, 10, 0.05)
        snap = mgr.state.snapshot()
    finally:
        mgr.stop()
    counts = snap["log_seq"]
    assert counts["numbered"] == counts["pushes"] == PUSHES + slow
    assert counts["duplicate_pushes"] == slow
    assert counts["duplicate_lines"] == slow * 10
    assert snap["logs"][uuid]["curio"] == "".join(line + "\n" for line in sent), "each line once, in order"
    rate = counts["duplicate_lines"] / len(sent)
    print(f"\nlog pushes answered after the read timeout: {slow}/{PUSHES}; lines that arrived twice: "
          f"{counts['duplicate_lines']}/{len(sent)} = {rate:.0%}; kept twice with X-Log-Seq: 0")


def test_seq_numbers_skip_lines_dropped_from_the_backlog_and_repeat_after_a_put_back() -> None:
    recorder = _Recorder(fail_first=1)
    shipper, _ = _shipper(recorder, backlog=100)
    shipper.add("setup", [f"line {i:02d} " + "x" * 20 for i in range(10)])  # 30 bytes a line: 3 fit, 7 dropped
    assert shipper.ship_once() is False
    shipper._retry_at = 0.0
    assert shipper.ship_once() is True
    run = shipper.run_id
    assert recorder.seqs == [f"{run}:setup:8-10", f"{run}:setup:8-10"], recorder.seqs
    shipper.add("setup", ["next"])
    shipper.ship_once()
    assert recorder.seqs[-1] == f"{run}:setup:11-11"


def test_devmanager_keeps_the_new_part_of_an_overlapping_push(devmgr: DevManager) -> None:
    uuid = _post(devmgr, "/register", {"label": "C.overlap"}).json()["uuid"]

    def push(seq: str, body: str) -> None:
        requests.post(devmgr.url + "/api/log-push", data=body.encode(), timeout=5,
                      headers={"X-Instance-UUID": uuid, "X-Log-Source": "curio", "X-Log-Seq": seq})

    push("r1:curio:1-2", "a\nb\n")
    push("r1:curio:1-3", "[prover-supervisor: 1 older line(s) dropped]\na\nb\nc\n")  # a retry that grew
    push("r1:curio:2-3", "b\nc\n")  # all seen
    push("r2:curio:1-1", "a\n")  # another supervisor process numbers from 1 again
    push("garbage", "no numbers\n")  # kept as it is
    assert devmgr.state.snapshot()["logs"][uuid]["curio"] == "a\nb\nc\na\nno numbers\n"


def test_devmanager_fault_limited_to_one_route() -> None:
    """``"path"`` in /dev/faults: only that route's calls get the fault, and only they count it down."""
    devmgr = dev_manager(quiet=True).start()
    try:
        requests.post(devmgr.url + "/dev/faults", json={"status": 400, "count": 1, "path": "/register"}, timeout=5)
        assert _post(devmgr, "/param-done", {"uuid": "nobody"}).status_code == 404  # answered as usual
        refused = _post(devmgr, "/register", {"label": "C.8"})
        assert refused.status_code == 400 and refused.json() == {"error": "injected fault"}
        assert _post(devmgr, "/register", {"label": "C.8"}).status_code == 200  # the count is spent
        wait_for(lambda: len(devmgr.state.snapshot()["calls"]) == 3, 5)
        assert [c["status"] for c in devmgr.state.snapshot()["calls"]] == [404, 400, 200]
    finally:
        devmgr.stop()


def test_outbox_next_pending_of_finds_a_kind_behind_others(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    first = box.add("param-done")
    register = box.add("register", {"label": "C.9"})
    assert box.next_pending().id == first  # type: ignore[union-attr]
    found = box.next_pending_of("register")
    assert found is not None and found.id == register and found.payload == {"label": "C.9"}
    box.delivered(register, {"uuid": "u"})
    assert box.next_pending_of("register") is None
    box.close()


def test_no_attempt_goes_out_once_the_sender_is_asked_to_stop(tmp_path: Path) -> None:
    # tenacity tried once more after the sleep the stop cut short: a delivery after the exit had closed the
    # outbox was never recorded, and the call went again at the next start.
    mgr = dev_manager(port=0, quiet=True).start()
    spec = ManagerSpec(url=mgr.url, label="C.stop", connect_timeout_s=2.0, read_timeout_s=2.0)
    loop, outbox, lines = EventLoop(), Outbox(tmp_path / "outbox.sqlite3"), []
    sender = Sender(spec, outbox, ManagerClient(spec), loop, lines.append, CallKinds(), on_identity=lambda u, f: None)
    try:
        sender.restore_identity()
        sender.start()
        deadline = time.monotonic() + 20
        loop.run_until(lambda: sender.uuid is not None or time.monotonic() > deadline, 0.02)
        requests.post(f"{mgr.url}/dev/faults", json={"status": 503, "path": "/param-done"}, timeout=5)
        outbox.add("param-done", {})
        sender.wake()
        loop.run_until(lambda: any("param-done not delivered" in line for line in lines)
                       or time.monotonic() > deadline, 0.02)
        assert any("param-done not delivered" in line for line in lines), lines
        requests.post(f"{mgr.url}/dev/faults", json={}, timeout=5)  # the manager answers again, but
        sender.ask_to_stop()  # the supervisor is exiting: the sleep before the retry is cut short
        sender.join(10)
        (row,) = mgr.state.snapshot()["instances"].values()
        assert row["state"] == "registered", "a call went out after the stop was asked"
        assert outbox.pending() == 1  # it stays for the next start
    finally:
        sender.ask_to_stop()
        outbox.close()
        loop.close()
        mgr.stop()
