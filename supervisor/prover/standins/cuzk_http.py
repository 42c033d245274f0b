"""The stand-in cuzk-daemon's two HTTP faces: the proving service (``POST /prove`` on listen) and
the status API (``GET /status`` on status_listen), over TCP (IPv4 or IPv6) or a unix socket.

They only route: the daemon behind them (cuzk_daemon.Daemon) proves and says its status.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from . import knobs, output


class Owner(Protocol):
    """What the servers ask of the daemon."""

    def status(self) -> dict[str, Any]: ...

    def prove(self, body: dict[str, Any], answer: Callable[[dict[str, Any]], None]) -> None:
        """Prove what ``body`` asks; ``answer`` sends the result (before anything the daemon does after)."""


class Server(output.QuietHangups, ThreadingHTTPServer):
    daemon_threads = True
    role = "main"
    owner: Owner

    def server_bind(self) -> None:  # skip HTTPServer's getfqdn lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", 0


class _Server6(Server):
    address_family = socket.AF_INET6


class _UnixServer(Server):
    address_family = socket.AF_UNIX

    def get_request(self) -> tuple[socket.socket, Any]:
        request, _ = self.socket.accept()
        return request, ("unix", 0)


def make_server(addr: tuple[str, Any], role: str, owner: Owner) -> Server:
    """A server for ``addr`` (as knobs.parse_addr gives it), not serving yet; ``role`` is
    ``main`` (POST /prove) or ``status`` (GET /status)."""
    kind, where = addr
    cls: type[Server]
    if kind == "unix":
        os.makedirs(os.path.dirname(where) or ".", exist_ok=True)
        if os.path.exists(where):
            os.unlink(where)  # a stale socket left by a SIGTERM'd daemon
        cls = _UnixServer
    else:
        cls = _Server6 if ":" in where[0] else Server
    server = cls(where, Handler)
    server.role = role
    server.owner = owner
    return server


class Handler(BaseHTTPRequestHandler):
    server_version = "cuzk-daemon-standin"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_json(self) -> dict[str, Any]:
        """The request's JSON object ({} when there is none, or it is unreadable or not an object)."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        except (ValueError, OSError):
            body = {}
        return body if isinstance(body, dict) else {}

    def send_json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if output.silenced():
            knobs.sleep_forever()
        path = self.path.split("?", 1)[0].rstrip("/")
        if self.server.role == "status" and path in ("/status", ""):
            self.send_json(200, self.server.owner.status())
        else:
            self.send_json(404, {"error": f"not found: {self.path}"})

    def do_POST(self) -> None:
        if output.silenced():
            knobs.sleep_forever()
        if self.server.role == "main" and self.path.split("?", 1)[0] == "/prove":
            self.server.owner.prove(self.read_json(), lambda result: self.send_json(200, result))
        else:
            self.send_json(404, {"error": f"not found: {self.path}"})
