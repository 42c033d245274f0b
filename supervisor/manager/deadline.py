"""One HTTP call made with requests, cut at a total deadline: connect, send, status line, headers and body.

requests' ``timeout`` is per socket operation: a server that sends one byte a second never trips
it, and a call could last forever. Here every call gets a session and a connection of its own (no
pool shared with another call, so a stuck call blocks nobody else), and a watchdog timer that,
when the deadline passes, shuts the call's socket down from its own thread: the blocked read in
the caller's thread returns at once and the call fails (``Watchdog.fired`` says why).

The socket is shut down through a duplicate of its descriptor, taken when the connection is made
and closed when the call ends: the descriptor number can never be one that another socket reuses
in between, and TLS on top of it is cut the same way.

Not covered: a DNS lookup (getaddrinfo cannot be interrupted); connecting is bounded by the
connect timeout per address.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

# Imported where a call is made, never at the package's import (requests is heavy; check and status never load
# it): by client.py when a client is made (a run with a manager), by prover/production.py on the proofs watch's
# reading thread.
import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection


class Watchdog:
    """Shuts down the sockets of one call once ``deadline_s`` has passed, unless the call finished first."""

    def __init__(self, deadline_s: float) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._finished = False
        self.fired = False
        self.unarmed: str | None = None  # why no deadline thread could be started (the call went on without)
        self.deadline_s = deadline_s
        self._timer = threading.Timer(deadline_s, self._fire)
        self._timer.daemon = True
        self._timer.name = "http-deadline"

    def start(self) -> None:
        try:
            self._timer.start()
        except RuntimeError as exc:  # "can't start new thread": pids.max or RLIMIT_NPROC is reached
            # The call goes on, bounded by its connect and read timeouts alone (not the whole answer's deadline):
            # a report that goes out is worth more than the bound on a manager that trickles its answer.
            self.unarmed = str(exc)

    def watch(self, sock: socket.socket) -> None:
        """A socket of this call, just connected: cut it at the deadline (at once if that has passed)."""
        dup = sock.dup()
        with self._lock:
            kept = not self._finished
            if kept:
                self._sockets.append(dup)
                if self.fired:
                    _shut(dup)
        if not kept:
            dup.close()

    def _fire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.fired = True
            for dup in self._sockets:
                _shut(dup)

    def finish(self) -> None:
        """The call is over (answered or failed): no shutdown can come after this returns."""
        self._timer.cancel()
        with self._lock:
            self._finished = True
            sockets, self._sockets = self._sockets, []
        for dup in sockets:
            dup.close()


def _shut(dup: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the peer
        dup.shutdown(socket.SHUT_RDWR)


class _Watched:
    """Mixed into urllib3's connections: the socket connected is told to the call's watchdog (for TLS, before
    the handshake, which a server could drip too)."""

    def __init__(self, *args: Any, watchdog: Watchdog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        self._watchdog.watch(sock)
        return sock


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


class _DeadlineAdapter(HTTPAdapter):
    """An adapter whose connections ``watchdog`` watches; made per call, so its pool is the call's own."""

    def __init__(self, watchdog: Watchdog) -> None:
        self._watchdog = watchdog
        super().__init__(pool_connections=1, pool_maxsize=1, max_retries=0)

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:  # requests >= 2.32.2
        return self._watched(super().get_connection_with_tls_context(*args, **kwargs))

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:  # older requests
        return self._watched(super().get_connection(*args, **kwargs))

    def _watched(self, pool: Any) -> Any:
        pool.ConnectionCls = _WatchedHTTPSConnection if pool.scheme == "https" else _WatchedHTTPConnection
        pool.conn_kw["watchdog"] = self._watchdog
        return pool


@contextlib.contextmanager
def deadline_session(deadline_s: float, headers: dict[str, str]) -> Iterator[tuple[requests.Session, Watchdog]]:
    """A session for exactly one call, cut at ``deadline_s`` from now; closed (with its socket) on exit."""
    watchdog = Watchdog(deadline_s)
    session = requests.Session()
    session.headers.update(headers)
    adapter = _DeadlineAdapter(watchdog)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    watchdog.start()
    try:
        yield session, watchdog
    finally:
        watchdog.finish()
        session.close()
