"""Logs catch up with the calls: a call the outbox delivered resets the log shipper's retry backoff.

Measured before: after an outage the calls arrived 2.7 s after the manager came back, the logs 11.3 s (their
backoff had grown to 30 s). Here the manager asks the log pushes for a 300 s pause (Retry-After); once a
call is delivered the shipper pushes at once, long before that pause would have run out. And the other way
round: a push taken after the outage sends the call that waits out its own pause at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import ManagerSpec
from supervisor.engine.loop import EventLoop
from supervisor.manager.client import ManagerClient, TransientError
from supervisor.manager.logship import Shipper, log_push_sender
from supervisor.manager.outbox import Outbox
from supervisor.manager.sender import CallKinds, Sender

WAIT_S = 20.0  # an upper bound against hanging, never a measure (the pause asked for is 300 s)
PAUSE_S = 300


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            away = self.server.away
            self.server.seen.append((self.path, "refused" if away else "taken"))
        if away:
            self.send_response(503)
            self.send_header("Retry-After", str(self.server.pauses.get(self.path, 0)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "11")
        self.end_headers()
        self.wfile.write(b'{"ok":true}')


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.away = True
        self.pauses = {"/api/log-push": PAUSE_S}  # the Retry-After each path is answered with while away
        self.seen: list[tuple[str, str]] = []

    def taken(self) -> list[str]:
        with self.lock:
            return [path for path, what in self.seen if what == "taken"]


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_shipper_backing_off_pushes_at_once_when_the_manager_answers_again() -> None:
    sent: list[str] = []
    failures = [TransientError("HTTP 503", retry_after_s=PAUSE_S)]

    def send(source: str, body: str, seq: str) -> None:
        if failures:
            raise failures.pop()
        sent.append(body)

    shipper = Shipper("log shipping", send, lambda: True, 1.0, 1 << 20, lambda line: None)
    shipper.add("setup", ["during the outage"])
    assert not shipper.ship_once() and sent == []  # refused: the manager asked for 300 s
    assert not shipper.ship_once() and sent == []  # and the shipper keeps to it
    shipper.manager_answers()  # a call was delivered: the manager is back
    assert shipper.ship_once() and sent == ["during the outage\n"]
    assert shipper.backoff_resets == 1
    shipper.manager_answers()  # not backing off: nothing to reset
    assert shipper.backoff_resets == 1


def registered_before(server: _Server, tmp_path: Path) -> tuple[ManagerSpec, ManagerClient, EventLoop, Outbox,
                                                                  list[str]]:
    """A manager client to ``server``, a loop, an outbox of an instance an earlier start registered (C.1, u-1),
    and the list the supervisor's lines go to."""
    spec = ManagerSpec(url=f"http://127.0.0.1:{server.server_address[1]}", label="C.1", connect_timeout_s=2.0,
                       read_timeout_s=2.0)
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    outbox.put("label", "C.1")
    outbox.put("uuid", "u-1")
    return spec, ManagerClient(spec), EventLoop(), outbox, []


def stop_all(sender: Sender, shipper: Shipper, outbox: Outbox, loop: EventLoop) -> None:
    sender.ask_to_stop()
    sender.join(WAIT_S)
    shipper.stop(1.0)
    outbox.close()
    loop.close()


def test_logs_follow_the_first_call_delivered_after_an_outage(server: _Server, tmp_path: Path) -> None:
    spec, client, loop, outbox, log = registered_before(server, tmp_path)
    shipper = Shipper("log shipping", log_push_sender(client, lambda: "u-1"), lambda: True, 0.05, 1 << 20,
                      log.append)
    sender = Sender(spec, outbox, client, loop, log.append, CallKinds(), on_identity=lambda uuid, fields: None,
                    on_delivered=shipper.manager_answers)
    try:
        sender.restore_identity()
        shipper.add("setup", ["a line from the outage"])
        assert not shipper.ship_once()  # the manager is away: the shipper now waits PAUSE_S
        shipper.start()
        outbox.add("param-done", {})
        sender.start()
        deadline = time.monotonic() + WAIT_S
        loop.run_until(lambda: len(server.seen) >= 2 or time.monotonic() > deadline, 0.02)  # param-done refused
        with server.lock:
            server.away = False
        loop.run_until(lambda: "/api/log-push" in server.taken() or time.monotonic() > deadline, 0.02)
        assert server.taken() == ["/param-done", "/api/log-push"], (server.seen, log)
        # The server has the push; the shipper counts it once the answer is back on its own thread.
        loop.run_until(lambda: shipper.pushed >= 1 or time.monotonic() > deadline, 0.02)
        assert shipper.backoff_resets >= 1 and shipper.pushed == 1
    finally:
        stop_all(sender, shipper, outbox, loop)


def test_a_push_taken_after_an_outage_sends_the_call_waiting_out_its_pause_at_once(server: _Server,
                                                                                 tmp_path: Path) -> None:
    # The call waits out what the manager asked (300 s here; the backoff alone grows to 30 s) while the log shipper,
    # retrying every second, finds the manager back first: the call goes then, not minutes later.
    server.pauses = {"/param-done": PAUSE_S}
    spec, client, loop, outbox, log = registered_before(server, tmp_path)
    sender = Sender(spec, outbox, client, loop, log.append, CallKinds(), on_identity=lambda uuid, fields: None)
    shipper = Shipper("log shipping", log_push_sender(client, lambda: "u-1"), lambda: True, 0.05, 1 << 20,
                      log.append, on_back=sender.retry_now)
    try:
        sender.restore_identity()
        outbox.add("param-done", {})
        sender.start()
        deadline = time.monotonic() + WAIT_S
        loop.run_until(lambda: any(f"retry 1 in {PAUSE_S}" in line for line in log) or time.monotonic() > deadline,
                       0.02)
        assert any(f"retry 1 in {PAUSE_S}" in line for line in log), log
        shipper.add("setup", ["a line from the outage"])
        assert not shipper.ship_once()  # refused too: its next try comes in a second
        with server.lock:
            server.away = False
        shipper.start()
        loop.run_until(lambda: "/param-done" in server.taken() or time.monotonic() > deadline, 0.02)
        assert server.taken() == ["/api/log-push", "/param-done"], (server.seen, log)
    finally:
        stop_all(sender, shipper, outbox, loop)


def test_a_retry_said_on_the_loop_later_says_its_own_number(server: _Server, tmp_path: Path) -> None:
    # The sender's line for its first retry was made when the loop ran it, reading the retry count then: a retry
    # hurried meanwhile (the exit flush's start, the manager answering the logs) made it say "retry 2", and no line
    # said the first (the exit flush's test waited for "retry 1" in vain, on a loaded machine).
    server.pauses = {"/param-done": PAUSE_S}
    spec, client, loop, outbox, log = registered_before(server, tmp_path)
    sender = Sender(spec, outbox, client, loop, log.append, CallKinds(), on_identity=lambda uuid, fields: None)
    shipper = Shipper("log shipping", log_push_sender(client, lambda: "u-1"), lambda: True, 0.05, 1 << 20,
                      log.append)
    try:
        sender.restore_identity()
        outbox.add("param-done", {})
        sender.start()
        deadline = time.monotonic() + WAIT_S
        while sender.failed_attempts < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # (the loop not run: the first retry's line waits in it)
        sender.retry_now()
        while sender.failed_attempts < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender.failed_attempts >= 2
        loop.run_until(lambda: any("retry" in line for line in log) or time.monotonic() > deadline, 0.02)
        said = [line for line in log if "param-done not delivered" in line]
        assert said and said[0].endswith(f"; retry 1 in {PAUSE_S:.1f}s"), log
    finally:
        stop_all(sender, shipper, outbox, loop)
