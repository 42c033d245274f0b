"""``prover-supervisor dev-manager``: a stand-in for the fleet manager's API, on 127.0.0.1.

A tool, not part of the supervision: a stand-in of the external fleet manager (tests, the demo, local runs)
that imports nothing of the supervisor but its text helpers (``stdio``, ``show``) and its faults (faults.py).

Same routes, states and answers as shared/domain/manager-api.md: ``/register`` (idempotent per label while not killed),
``/param-done``, ``/running`` (404 ``instance not found or already killed`` for a killed row and an unknown uuid
alike, as the real one),
``/runner-id`` (200 for a killed row too), ``GET /status`` (every row, its times as the real one writes them)
and the UI's ``POST /api/kill`` (devmanager/rows.py), ``/api/log-push`` (at most 256 KiB of a body is kept, the rest
silently dropped); 400 / 404 / 405 where the real one gives them. It prints every call it receives. The
routes and row fields of the protocol spoken over it (the prover's fleet protocol: ``/bench-done``, the
min_rate) are a plugin's ``DevExtension``, handed in by the composition root (cli.py ``dev_extension``): each
route answers a row of the instance its body's uuid names (404 without one), under the rows' lock.

For tests and local runs it has extra routes under ``/dev/``: ``GET /dev/state`` (instances, the calls
in order, the ``GET /status`` reads apart as ``reads``, each with ``after``: how many calls came before it,
the pushed logs), ``POST /dev/faults``: how the next ``count`` API calls (of one ``path``, if given) fail or
are answered badly: ``status`` (with ``retry_after``), ``delay_s``, ``garbage``, ``reset``, ``redirect``
(with ``location``), ``huge_body_bytes``, ``answer``, ``drip_bytes_per_s``; see devmanager/faults.py; ``POST
/dev/forget``: the manager forgets instances, as after a database reset or its 7-day cleanup (``{}``:
every one; ``{"uuid": U}``: that one; ``{"always": true}``: every instance from now on, right after its
register is answered; a uuid it does not know is answered 404 ``instance not found``, as the real one
does); ``POST /dev/row``: a row's state, kill_reason, times or a plugin's fields set as the manager's own
decisions would leave them (its monitor's kills, a row registered long ago; devmanager/rows.py).
Unlike today's manager it reads ``X-Log-Seq`` on log pushes and keeps each numbered line once (a push
retried after a read timeout is not stored twice; docs/manager.md).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..text.show import cut
from ..text.stdio import say
from .faults import FaultPlan, answer_instead, drip, faults_from, response_bytes
from .rows import NO_ROW_RULES, UI_KILL_REASON, Instance, RowRules, edit_row, status_rows

LOG_PUSH_LIMIT = 256 * 1024
LOG_RING_BYTES = 4 * 1024 * 1024
HEAD_CHARS = 200  # of each log push, kept in the call list (``GET /dev/state``)
NOT_FOUND = "instance not found"  # the real manager's words for a uuid it has no row for
POST_ROUTES = ("/register", "/param-done", "/running", "/api/log-push", "/api/kill")  # the core's

# A plugin's POST route: (the row its body's uuid names, the body) → its answer (200). It runs under the rows'
# lock, and may change the row (Instance.move, Instance.kill, its fields in ``extra``).
Route = Callable[[Instance, dict[str, Any]], dict[str, Any]]



# ---------------------------------------------------------------- log lines, each kept once

# (logship.SEQ_HEADER: the dev-manager shares none of the supervisor's protocol code)
SEQ_HEADER = "X-Log-Seq"


@dataclass
class LineSequence:
    """What ``X-Log-Seq`` (``<run>:<source>:<first>-<last>``) let through: the highest line number kept per
    uuid, run and source, and how much came again (a push retried after a timeout it had in fact made)."""

    highest: dict[tuple[str, str, str], int] = field(default_factory=dict)
    pushes: int = 0
    numbered: int = 0  # pushes that carried the header
    duplicate_pushes: int = 0  # pushes with at least one line already kept
    duplicate_lines: int = 0
    lines: int = 0  # numbered lines received, duplicates included

    def keep_new(self, uuid: str, header: str | None, text: str) -> str:
        """The part of a pushed body not received before (all of it without a well-formed header)."""
        self.pushes += 1
        numbers = _parse_seq(header)
        if numbers is None:
            return text
        run, source, first, last = numbers
        self.numbered += 1
        self.lines += last - first + 1
        key = (uuid, run, source)
        seen = self.highest.get(key, 0)
        self.highest[key] = max(seen, last)
        if seen < first:
            return text
        repeated = min(seen, last) - first + 1
        self.duplicate_pushes += 1
        self.duplicate_lines += repeated
        lines = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
        # The numbered lines are the last last-first+1 of the body (a "dropped" note may come first, and
        # came the first time too): keep only the ones past what was seen.
        fresh = lines[len(lines) - (last - first + 1) + repeated:] if last > seen else []
        return "".join(line + "\n" for line in fresh)

    def summary(self) -> dict[str, int]:
        return {"pushes": self.pushes, "numbered": self.numbered, "lines": self.lines,
                "duplicate_pushes": self.duplicate_pushes, "duplicate_lines": self.duplicate_lines}


def _parse_seq(header: str | None) -> tuple[str, str, int, int] | None:
    if not header:
        return None
    try:
        run, source, span = header.rsplit(":", 2)
        first, last = (int(n) for n in span.split("-", 1))
    except ValueError:
        return None
    return (run, source, first, last) if 1 <= first <= last else None


@dataclass(frozen=True)
class DevExtension:
    """What a plugin's protocol adds to the dev-manager: its POST routes (path → Route) and its rows' rules."""

    routes: Mapping[str, Route] = field(default_factory=dict)
    rows: RowRules = NO_ROW_RULES


NO_EXTENSION = DevExtension()


class DevManagerState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instances: dict[str, Instance] = {}
        self.calls: list[dict[str, Any]] = []
        self.reads: list[dict[str, Any]] = []  # GET /status (they are not in ``calls``)
        self.logs: dict[str, dict[str, str]] = {}  # uuid → source → text
        self.faults = FaultPlan()
        self.seen = LineSequence()
        self.forget_always = False  # POST /dev/forget {"always": true}: every register is forgotten at once
        self._runner_ids = itertools.count(1)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"instances": {k: v.to_dict() for k, v in self.instances.items()}, "calls": list(self.calls),
                    "reads": list(self.reads), "logs": {k: dict(v) for k, v in self.logs.items()},
                    "log_seq": self.seen.summary()}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    late_fault: FaultPlan | None = None  # this request's fault that spoils a real answer (answer, drip)

    def handle_one_request(self) -> None:
        self.late_fault = None  # one connection carries several requests: a fault is one call's
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # we print our own one line per call

    # ------------------------------------------------------------ plumbing

    def _send(self, status: int, body: Any = None, raw: bytes | None = None, head: str | None = None) -> None:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        late = self.late_fault
        if late is not None and late.answer is not None:
            data, raw, status = late.answer.encode(), late.answer.encode(), 200 if status == 204 else status
        if status == 204:
            data = b""  # 204 has no body; ``body`` is only what gets printed
        # Noted before the answer goes out: a client's next call (on another handler thread) must not be
        # noted before this one, or the call list would not be in the order the calls were made.
        self.server.note(self.command, self.path, status, body if raw is None else raw[:80].decode(errors="replace"),
                         head)
        headers = [("Content-Type", "application/json" if raw is None else "text/plain")] if data else []
        headers.append(("Content-Length", str(len(data))))
        if late is not None and late.drip_bytes_per_s > 0:
            self.close_connection = True
            reason = self.responses.get(status, ("",))[0]
            drip(self.wfile, response_bytes(status, reason, headers, data), late.drip_bytes_per_s,
                 self.server.stopping)
            return
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _body(self, limit: int | None = None) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        return data[:limit] if limit is not None else data

    def _json(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self._body() or b"{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _fault(self) -> bool:
        """Apply the configured fault to this API call; True if the call was answered by it."""
        state = self.server.state
        with state.lock:
            faults = state.faults
            active = faults.count != 0 and faults.path in (None, urlsplit(self.path).path)
            if active and faults.count > 0:
                faults.count -= 1
            f = faults.copy() if active else None
        if f is None:
            return False
        if f.delay_s:
            time.sleep(f.delay_s)
        if not f.answers_instead:
            self.late_fault = f  # answer, drip: the call is handled, its answer spoilt (_send)
            return False
        self._body()
        answer_instead(self, f)
        return True

    # ------------------------------------------------------------ routes

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/dev/state":
            self._send(200, self.server.state.snapshot())
            return
        if parts.path in POST_ROUTES or parts.path in self.server.extension.routes:
            self._send(405, {"error": "method not allowed"})
            return
        if parts.path not in ("/runner-id", "/status"):
            self._send(404, {"error": "not found"})
            return
        if self._fault():
            return
        if parts.path == "/status":
            with self.server.state.lock:
                rows = status_rows(list(self.server.state.instances.values()))
            self._send(200, rows)
            return
        uuid = (parse_qs(parts.query).get("uuid") or [""])[0]
        if not uuid:
            self._send(400, {"error": "uuid required"})
            return
        with self.server.state.lock:
            inst = self.server.state.instances.get(uuid)
        if inst is None:
            self._send(404, {"error": NOT_FOUND})
        else:
            self._send(200, {"runner_id": inst.runner_id})

    def do_PUT(self) -> None:
        self._send(405, {"error": "method not allowed"})

    do_DELETE = do_PUT

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path == "/dev/faults":
            try:
                faults = faults_from(self._json() or {})
            except (ValueError, TypeError) as exc:  # a typo'd fault must not pass for "no fault"
                self._send(400, {"error": str(exc)})
                return
            with self.server.state.lock:
                self.server.state.faults = faults
            self._send(200, {"ok": True})
            return
        if path == "/dev/forget":
            self._forget(self._json() or {})
            return
        if path == "/dev/row":
            self._edit_row(self._json() or {})
            return
        route = self.server.extension.routes.get(path)
        if path not in POST_ROUTES and route is None:
            self._send(404, {"error": "not found"})
            return
        if self._fault():
            return
        if path == "/api/log-push":
            self._log_push()
            return
        body = self._json()
        path = path.removeprefix("/api")
        if body is None:
            self._send(400, {"error": "body must be a JSON object"})
            return
        if route is not None:
            self._plugin_route(route, body)
            return
        getattr(self, "_" + path.strip("/").replace("-", "_"))(body)

    def _plugin_route(self, route: Route, body: dict[str, Any]) -> None:
        inst = self._instance(body)
        if inst is None:
            return
        try:
            with self.server.state.lock:
                answer = route(inst, body)
        except ValueError as exc:  # a field of the wrong type: Go's decoder refuses the body
            self._send(400, {"error": str(exc)})
            return
        self._send(200, answer)

    def _register(self, body: dict[str, Any]) -> None:
        label = body.get("label")
        if not label or not isinstance(label, str):
            self._send(400, {"error": "label required"})
            return
        rules = self.server.extension.rows
        state = self.server.state
        try:
            fields = rules.registered(body)
        except ValueError as exc:  # a field of the wrong type: Go's decoder refuses the body
            self._send(400, {"error": str(exc)})
            return
        with state.lock:
            inst = next((i for i in state.instances.values() if i.label == label and i.state != "killed"), None)
            if inst is None:  # a plugin's fields are the first registration's (the real one keeps its min_rate)
                inst = Instance(str(uuidlib.uuid4()), label, next(state._runner_ids), extra=fields, rules=rules)
                state.instances[inst.uuid] = inst
            if state.forget_always:
                del state.instances[inst.uuid]
        self._send(200, {"uuid": inst.uuid, "runner_id": inst.runner_id})

    def _forget(self, body: dict[str, Any]) -> None:
        """``POST /dev/forget``: instances the manager no longer knows (see the module docstring)."""
        state = self.server.state
        with state.lock:
            uuid = body.get("uuid")
            forgotten = [u for u in state.instances if uuid is None or u == uuid]
            for u in forgotten:
                del state.instances[u]
            state.forget_always = bool(body.get("always", state.forget_always))
        self._send(200, {"ok": True, "forgotten": forgotten})

    def _edit_row(self, body: dict[str, Any]) -> None:
        """``POST /dev/row``: a row's fields set as the manager's own decisions would (devmanager/rows.py)."""
        inst = self._instance(body)
        try:
            if inst is not None:
                with self.server.state.lock:
                    edit_row(inst, body)
                self._send(200, {"ok": True})
        except (ValueError, TypeError) as exc:
            self._send(400, {"error": str(exc)})

    def _kill(self, body: dict[str, Any]) -> None:
        """The UI's kill: the row is marked killed "manually killed via UI" (the machine is not ours to destroy)."""
        inst = self._instance(body)
        if inst is not None:
            with self.server.state.lock:
                inst.kill(UI_KILL_REASON)
            self._send(200, {"ok": True})

    def _instance(self, body: dict[str, Any]) -> Instance | None:
        with self.server.state.lock:
            inst = self.server.state.instances.get(str(body.get("uuid", "")))
        if inst is None:
            self._send(404, {"error": NOT_FOUND})
        return inst

    def _move(self, inst: Instance, state: str) -> None:
        with self.server.state.lock:
            inst.move(state)

    def _param_done(self, body: dict[str, Any]) -> None:
        inst = self._instance(body)
        if inst is None:
            return
        if inst.state == "registered":
            self._move(inst, "params_done")
        self._send(200, {"ok": True})

    def _running(self, body: dict[str, Any]) -> None:
        with self.server.state.lock:
            inst = self.server.state.instances.get(str(body.get("uuid", "")))
        # The real one's words, either way (shared/domain/manager-api.md): only /runner-id tells the two apart.
        if inst is None or inst.state == "killed":
            self._send(404, {"error": f"{NOT_FOUND} or already killed"})
            return
        self._move(inst, "running")
        self._send(200, {"ok": True})

    def _log_push(self) -> None:
        uuid = self.headers.get("X-Instance-UUID")
        data = self._body(LOG_PUSH_LIMIT)  # the real manager silently drops what is past 256 KiB
        if not uuid:
            self._send(400, {"error": "X-Instance-UUID required"})
            return
        source = self.headers.get("X-Log-Source") or "unknown"
        text = data.decode("utf-8", errors="replace")
        state = self.server.state
        with state.lock:
            text = state.seen.keep_new(uuid, self.headers.get(SEQ_HEADER), text)
            per_source = state.logs.setdefault(uuid, {})
            per_source[source] = (per_source.get(source, "") + text)[-LOG_RING_BYTES:]
        lines = data.count(b"\n")
        # The start of each push stays in the call list: tests check what was said before a give-up.
        self._send(204, f"{source}: {len(data)} bytes, {lines} line(s)",
                   head=data[:HEAD_CHARS].decode(errors="replace"))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: DevManagerState, quiet: bool,
                 extension: DevExtension = NO_EXTENSION) -> None:
        super().__init__(address, _Handler)
        self.state = state
        self.quiet = quiet
        self.extension = extension
        self.stopping = threading.Event()  # ends the answers a fault writes slowly

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up on an answer: its right
            super().handle_error(request, client_address)

    def note(self, method: str, path: str, status: int, body: Any, head: str | None = None) -> None:
        entry: dict[str, Any] = {"time": time.time(), "method": method, "path": path, "status": status}
        if head is not None:
            entry["head"] = head
        if path.startswith("/status"):  # a read of the whole fleet: kept apart, with how many calls came before
            with self.state.lock:
                self.state.reads.append({**entry, "after": len(self.state.calls)})
        elif not path.startswith("/dev/"):
            with self.state.lock:
                self.state.calls.append(entry)
        if not self.quiet:
            shown = cut(json.dumps(body), 160) if body is not None else ""
            say(f"dev-manager: {method} {path} -> {status} {shown}")


class DevManager:
    """The stand-in server, in a background thread of this process; ``extension``: a plugin's routes and rows."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", quiet: bool = False,
                 state: DevManagerState | None = None, extension: DevExtension = NO_EXTENSION) -> None:
        self.state = state or DevManagerState()
        self._server = _Server((host, port), self.state, quiet, extension)
        self.port = int(self._server.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="dev-manager", daemon=True)

    def start(self) -> DevManager:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()


def serve(port: int, extension: DevExtension = NO_EXTENSION) -> int:
    """The ``dev-manager`` command: serve in the foreground until interrupted (with a plugin's ``extension``)."""
    try:
        manager = DevManager(port, extension=extension)
    except OSError as exc:
        say(f"dev-manager: cannot listen on 127.0.0.1:{port}: {exc.strerror}", err=True)
        return 2
    # Its lines are a courtesy: a stdout that is lost (``| head -1``) costs them, never the serving.
    say(f"dev-manager: serving the manager API on {manager.url} (Ctrl-C to stop)")
    try:
        manager._server.serve_forever()  # Ctrl-C: KeyboardInterrupt, said by the CLI (exit 130)
    finally:
        manager._server.server_close()
    return 0
