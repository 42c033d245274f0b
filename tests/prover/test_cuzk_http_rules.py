"""The stand-in cuzk-daemon's HTTP faces (standins/cuzk_http.py), served in-process by a real server.

What the module promises: ``make_server`` builds a server for a TCP (IPv4 or IPv6) or unix address, not yet
serving, and clears a stale socket file; the ``status`` role answers ``GET /status`` (and ``/``) with the
owner's status, the ``main`` role answers ``POST /prove`` with what the owner's ``answer`` sends, the body
handed over as a JSON object ({} for none, unreadable or not an object); anything else is a JSON 404; a
client's hang-up is not reported.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.prover.standins import cuzk_http


class Owner:
    """A daemon behind the servers: a fixed status, and a prove that records its body and answers it."""

    def __init__(self, status: dict[str, Any] | None = None) -> None:
        self.status_doc = status or {"state": "ready", "gpus": 1}
        self.bodies: list[dict[str, Any]] = []
        self.after_answer = threading.Event()  # set by a test: what the daemon does after its answer
        self.hold_after_answer = False
        self.finished = threading.Event()

    def status(self) -> dict[str, Any]:
        return self.status_doc

    def prove(self, body: dict[str, Any], answer: Callable[[dict[str, Any]], None]) -> None:
        self.bodies.append(body)
        answer({"proof": "ok", "echo": body})
        if self.hold_after_answer:
            self.after_answer.wait(30)
        self.finished.set()


@contextlib.contextmanager
def serving(addr: tuple[str, Any], role: str, owner: Owner) -> Iterator[cuzk_http.Server]:
    server = cuzk_http.make_server(addr, role, owner)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def connection(server: cuzk_http.Server) -> http.client.HTTPConnection:
    if server.address_family == socket.AF_UNIX:
        return UnixHTTPConnection(server.server_address)  # type: ignore[arg-type]
    host, port = server.server_address[:2]
    return http.client.HTTPConnection(str(host), int(port), timeout=10)


def call(server: cuzk_http.Server, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    conn = connection(server)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, resp.getheader("Content-Type") or "", json.loads(raw)
    finally:
        conn.close()


TCP = ("tcp", ("127.0.0.1", 0))


def test_status_role_answers_the_owners_status_at_status_and_root() -> None:
    owner = Owner({"state": "ready", "pending": 3})
    with serving(TCP, "status", owner) as server:
        for path in ("/status", "/status/", "/status?verbose=1", "/"):
            code, ctype, doc = call(server, "GET", path)
            assert (code, doc) == (200, {"state": "ready", "pending": 3}), path
            assert ctype == "application/json"


def test_status_role_has_no_other_routes_and_no_prove() -> None:
    owner = Owner()
    with serving(TCP, "status", owner) as server:
        code, _, doc = call(server, "GET", "/debug/nothing")
        assert code == 404 and doc == {"error": "not found: /debug/nothing"}
        code, _, doc = call(server, "POST", "/prove", b"{}", {"Content-Length": "2"})
        assert code == 404 and "/prove" in doc["error"]
    assert owner.bodies == []


def test_main_role_proves_the_json_body_and_answers_with_the_result() -> None:
    owner = Owner()
    body = json.dumps({"kind": "porep", "sector": 7}).encode()
    with serving(TCP, "main", owner) as server:
        code, ctype, doc = call(server, "POST", "/prove?trace=1", body,
                                {"Content-Type": "application/json", "Content-Length": str(len(body))})
    assert code == 200 and ctype == "application/json"
    assert doc == {"proof": "ok", "echo": {"kind": "porep", "sector": 7}}
    assert owner.bodies == [{"kind": "porep", "sector": 7}]


def test_main_role_hands_over_an_empty_object_for_a_body_that_is_not_one() -> None:
    owner = Owner()
    with serving(TCP, "main", owner) as server:
        for raw in (b"", b"not json", b"[1, 2]", b'"text"', b"\xff\xfe"):
            headers = {"Content-Length": str(len(raw))} if raw else {}
            code, _, doc = call(server, "POST", "/prove", raw or None, headers)
            assert code == 200 and doc["echo"] == {}, raw
    assert owner.bodies == [{}] * 5


def test_main_role_does_not_serve_status() -> None:
    owner = Owner()
    with serving(TCP, "main", owner) as server:
        code, _, doc = call(server, "GET", "/status")
        assert code == 404 and doc["error"] == "not found: /status"
        code, _, _ = call(server, "POST", "/prove/extra", b"{}", {"Content-Length": "2"})
        assert code == 404
    assert owner.bodies == []


def test_the_answer_reaches_the_client_before_what_the_daemon_does_after() -> None:
    owner = Owner()
    owner.hold_after_answer = True
    with serving(TCP, "main", owner) as server:
        code, _, doc = call(server, "POST", "/prove", b'{"n": 1}', {"Content-Length": "8"})
        # The client has its whole answer while the daemon is still busy after it.
        assert code == 200 and doc["echo"] == {"n": 1}
        assert not owner.finished.is_set()
        owner.after_answer.set()
        assert owner.finished.wait(10)


def test_unix_server_makes_its_directory_and_replaces_a_stale_socket(tmp_path: Path) -> None:
    path = tmp_path / "run" / "deep" / "cuzk-status.sock"
    owner = Owner({"state": "ready"})
    with serving(("unix", str(path)), "status", owner) as server:
        assert server.address_family == socket.AF_UNIX
        code, _, doc = call(server, "GET", "/status")
        assert (code, doc) == (200, {"state": "ready"})
    # A daemon SIGTERM'd leaves its socket file behind; the next one binds over it.
    assert path.exists()
    with serving(("unix", str(path)), "status", owner) as server:
        code, _, _ = call(server, "GET", "/status")
        assert code == 200


def test_ipv6_address_gets_an_ipv6_server() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    owner = Owner()
    with serving(("tcp", ("::1", 0)), "status", owner) as server:
        assert server.address_family == socket.AF_INET6
        code, _, _ = call(server, "GET", "/status")
        assert code == 200


def test_a_client_that_hangs_up_is_not_reported(capsys: pytest.CaptureFixture[str]) -> None:
    owner = Owner()
    with serving(TCP, "main", owner) as server:
        try:
            raise BrokenPipeError("client went away")
        except BrokenPipeError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        # Anything that is not a hang-up is still reported, as socketserver does.
        try:
            raise RuntimeError("a real fault")
        except RuntimeError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "RuntimeError: a real fault" in capsys.readouterr().err
