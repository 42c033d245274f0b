"""The optional events_url: every transition and verdict as newline-delimited JSON, secrets masked."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from helpers import Runner, sh, toml_str

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.manager import logship

SECRET = "evt-secret-0042"


class _Recorder(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.bodies.append((self.headers.get("Content-Type", ""), body))
            self.server.auth.add(self.headers.get("Authorization"))
        self.send_response(204)
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.lock = threading.Lock()
        self.bodies: list[tuple[str, bytes]] = []
        self.auth: set[str | None] = set()  # each POST's Authorization header (None: it had none)


@pytest.fixture
def events_server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_events_url_receives_every_transition_and_verdict(sup: Runner, events_server: _Server) -> None:
    manager = dev_manager(quiet=True).start()
    try:
        config = sup.write(f"""
[manager]
url = {toml_str(manager.url)}
label = "C.events"
events_url = "http://127.0.0.1:{events_server.server_address[1]}/events"
log_push_interval_s = 0.1

[[phases]]
name = "first"
command = {sh("echo one")}
env = {{ API_TOKEN = "{SECRET}" }}

[[phases]]
name = "second"
command = {sh("echo $API_TOKEN; exit 4")}
env = {{ API_TOKEN = "{SECRET}" }}
""")
        result = sup.run(config, timeout=60)
    finally:
        manager.stop()
    assert result.returncode == 4, result.output
    assert all(ctype == "application/x-ndjson" for ctype, _ in events_server.bodies)
    raw = b"".join(body for _, body in events_server.bodies)
    assert SECRET.encode() not in raw
    events = [json.loads(line) for line in raw.decode().splitlines()]
    assert all({"type", "time", "label", "uuid"} <= set(e) and e["label"] == "C.events" for e in events)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "supervisor" and events[0]["state"] == "started"
    assert events[-1]["type"] == "supervisor" and events[-1]["state"] == "exiting" and events[-1]["status"] == 4
    transitions = [(e["phase"], e["state"]) for e in events if e["type"] == "transition"]
    assert transitions[:4] == [("first", "starting"), ("first", "running"), ("first", "stopping"), ("first", "done")]
    assert ("second", "failed") in transitions
    verdicts = {(e["phase"], e["reason"], e["exit_code"]) for e in events if e["type"] == "verdict"}
    assert verdicts == {("first", "exit_code", 0), ("second", "exit_code", 4)}
    failed = next(e for e in events if e["type"] == "verdict" and e["phase"] == "second")
    assert failed["success"] is False and failed["status"] == 4 and failed["last_lines"] == ["***"]
    # Once registered, events carry the manager's uuid.
    assert any(e["uuid"] for e in events)


MGR_TOKEN = "mgr-tok-55aa77"


@pytest.mark.parametrize("credentials", ["", "sink:sink-pw-123@"])
def test_the_manager_token_never_goes_to_an_events_url_elsewhere(sup: Runner, events_server: _Server,
                                                                 managers: Callable[..., DevManager],
                                                                 credentials: str) -> None:
    """Another port of the same host is another origin (a Loki, a webhook beside the manager): it is sent only the
    credentials its own URL holds, as an HTTP client drops Authorization on a redirect to another host."""
    manager = managers()
    config = sup.write(f"""
[manager]
url = {toml_str(manager.url)}
label = "C.events"
token_env = "MGR_TOKEN"
events_url = "http://{credentials}127.0.0.1:{events_server.server_address[1]}/events"
log_push_interval_s = 0.1

[[phases]]
name = "only"
command = {sh("echo one")}
""")
    result = sup.run(config, env={"MGR_TOKEN": MGR_TOKEN}, timeout=60)
    assert result.returncode == 0, result.output
    assert events_server.bodies
    basic = "Basic " + base64.b64encode(credentials.removesuffix("@").encode()).decode()
    assert events_server.auth == ({basic} if credentials else {None})
    assert MGR_TOKEN not in result.output


# A child whose last lines are long: 20 of 20,000 bytes and its reason after them (the verdict keeps the last 20,
# each up to 64 KiB); then the events' backlog as log_backlog_bytes left it, and smaller than the verdict.
BIG_LINES = ("import sys\nfor i in range(20): print('row%02d ' % i + 'q' * 20000)\n"
             "print('fatal: disk quota exceeded'); sys.exit(1)")


@pytest.mark.parametrize("backlog", ["2MiB", "128KiB", "4KiB"])
def test_a_big_verdict_arrives_as_one_whole_json_event(sup: Runner, events_server: _Server,
                                                        managers: Callable[..., DevManager], backlog: str) -> None:
    """The events shipper cut the verdict mid-object at the push limit (a 258 KB line, no JSON), and with a backlog
    smaller than it dropped it with the events before it and sent a text note: every line is one whole object
    now, and the verdict's long lines are cut to fit it, its reason whole."""
    manager = managers()
    config = sup.write(f"""
[manager]
url = {toml_str(manager.url)}
label = "C.events"
events_url = "http://127.0.0.1:{events_server.server_address[1]}/events"
log_backlog_bytes = {toml_str(backlog)}

[[phases]]
name = "big"
command = ["python3", "-c", {toml_str(BIG_LINES)}]
""")
    result = sup.run(config, timeout=60)
    assert result.returncode == 1, result.output
    lines = b"".join(body for _, body in events_server.bodies).decode().splitlines()
    assert all(len(line) < logship.EVENT_MAX_BYTES for line in lines)
    events = [json.loads(line) for line in lines]
    assert [e["type"] for e in events].count("verdict") == 1 and "dropped" not in [e["type"] for e in events]
    verdict = next(e for e in events if e["type"] == "verdict")
    assert verdict["label"] == "C.events" and verdict["reason"] == "exit_code" and verdict["phase"] == "big"
    assert len(verdict["last_lines"]) == 20 and verdict["last_lines_cut"] == 19
    assert verdict["last_lines"][-1] == "fatal: disk quota exceeded"
    assert all(line.startswith("row") and line.endswith("q...") for line in verdict["last_lines"][:-1])
    assert events[-1]["type"] == "supervisor" and events[-1]["state"] == "exiting"
