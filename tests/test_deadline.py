"""supervisor/manager/deadline.py with real sockets on 127.0.0.1: a call is cut at its total deadline however slowly the
server drips its answer, a prompt answer is untouched, and the watchdog never cuts a call that has finished."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import requests

from supervisor.manager.deadline import Watchdog, deadline_session

# Generous bounds only so that a broken cut cannot hang the suite; they decide nothing.
HANG_GUARD_S = 30


class DripServer:
    """Answers every request with a status line and headers, then its body one byte per ``gap_s``."""

    def __init__(self, body: bytes, gap_s: float) -> None:
        self.body = body
        self.gap_s = gap_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.served = 0
        self.cut = threading.Event()  # the client went away before the body was all sent
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.served += 1
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
                try:
                    conn.sendall(head.encode())
                    for i in range(len(self.body)):
                        if self.stop.wait(self.gap_s):
                            return
                        conn.sendall(self.body[i:i + 1])
                except OSError:
                    self.cut.set()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(HANG_GUARD_S)


@pytest.fixture
def dripping() -> Iterator[DripServer]:
    server = DripServer(b"x" * 10_000, gap_s=0.05)  # ~500 s for the whole body: only a cut ends the call
    yield server
    server.close()


@pytest.fixture
def prompt() -> Iterator[DripServer]:
    server = DripServer(b'{"ok": true}', gap_s=0)
    yield server
    server.close()


def test_a_dripping_answer_is_cut_at_the_deadline(dripping: DripServer) -> None:
    errors: list[BaseException] = []
    fired: list[bool] = []

    def call() -> None:
        with deadline_session(0.5, {}) as (session, watchdog):
            try:
                # The per-operation timeout alone never trips: a byte comes every 0.05 s.
                body = session.get(f"http://127.0.0.1:{dripping.port}/", timeout=5).content
                errors.append(AssertionError(f"the whole body came: {len(body)} bytes"))
            except requests.RequestException as exc:
                errors.append(exc)
            fired.append(watchdog.fired)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "the call was not cut"
    assert len(errors) == 1 and isinstance(errors[0], requests.RequestException) and fired == [True], (errors, fired)
    assert dripping.served == 1


def test_a_prompt_answer_is_read_whole_and_the_watchdog_does_not_fire(prompt: DripServer) -> None:
    with deadline_session(HANG_GUARD_S, {"X-Test": "1"}) as (session, watchdog):
        answer = session.get(f"http://127.0.0.1:{prompt.port}/", timeout=5)
        assert answer.status_code == 200 and answer.json() == {"ok": True}
        assert session.headers["X-Test"] == "1"
    assert not watchdog.fired


def test_each_session_is_its_own_connection(prompt: DripServer) -> None:
    """No pool shared between calls: a stuck call can hold no other call's connection."""
    for _ in range(3):
        with deadline_session(HANG_GUARD_S, {}) as (session, _watchdog):
            assert session.get(f"http://127.0.0.1:{prompt.port}/", timeout=5).ok
    assert prompt.served == 3


def test_a_watchdog_that_fires_shuts_the_watched_socket_down() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        dog = Watchdog(HANG_GUARD_S)
        dog.watch(ours)
        dog._fire()  # the timer's callback, called now instead of in HANG_GUARD_S
        assert dog.fired
        assert theirs.recv(1) == b""  # the peer sees the shutdown: the blocked read would return
        dog.finish()


def test_a_socket_watched_after_the_deadline_passed_is_shut_down_at_once() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        dog = Watchdog(HANG_GUARD_S)
        dog._fire()
        dog.watch(ours)
        assert theirs.recv(1) == b""
        dog.finish()


def test_a_finished_watchdog_never_fires_nor_keeps_a_socket() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        dog = Watchdog(HANG_GUARD_S)
        dog.start()
        dog.finish()
        dog._fire()  # a timer that raced the finish
        assert not dog.fired
        dog.watch(ours)  # a connection made after the end is not cut either
        ours.sendall(b"still open")
        assert theirs.recv(32) == b"still open"
