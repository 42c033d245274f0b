"""The outbox's sender, in-process, against a real HTTP server on 127.0.0.1: one handler per call kind.

The core's kinds (register, param-done, running, log) and one a plugin registers are delivered in the
outbox's order; a kind nobody handles is refused for good in one line and holds nothing up; what an
answer means runs on the loop's thread, what later calls need at once on the sender's; the register
body and answer carry the fields a plugin adds. No prover here: these are the core's tests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import ManagerSpec
from supervisor.engine.loop import EventLoop
from supervisor.lifecycle.states import PhaseState
from supervisor.lifecycle.verdict import Verdict
from supervisor.manager import sender as sender_mod
from supervisor.manager.answers import AnswerError
from supervisor.manager.client import LOG_PUSH_LIMIT, Answer, ManagerClient, TransientError
from supervisor.manager.outbox import Outbox
from supervisor.manager.reporting import core_report_due
from supervisor.manager.sender import CallKinds, Sender
from supervisor.text.redact import MASK, Redactor
from supervisor.wiring import CallKind, PhaseView

WAIT_S = 20.0  # an upper bound against hanging, never a measure


class _Recorder(BaseHTTPRequestHandler):
    """Answers every POST from ``server.answers`` (path → (status, JSON body)), 200 {"ok": true} by default,
    and notes each call: its path, its JSON body (or its text), its X-Instance-UUID."""

    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body: Any = json.loads(data)
        except ValueError:
            body = data.decode()
        status, answer = self.server.answers.get(self.path, (200, {"ok": True}))
        with self.server.lock:
            self.server.seen.append((self.path, body, self.headers.get("X-Instance-UUID")))
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.answers: dict[str, tuple[int, Any]] = {"/register": (200, {"uuid": "u-1", "widget_id": "w9"})}
        self.seen: list[tuple[str, Any, str | None]] = []
        self.lock = threading.Lock()

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _, _ in self.seen]


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


class Delivery:
    """A Sender on a real outbox and loop, the log it writes, and the loop run until something holds."""

    def __init__(self, server: _Server, tmp_path: Path, calls: CallKinds) -> None:
        self.spec = ManagerSpec(url=f"http://127.0.0.1:{server.server_address[1]}", label="C.kinds",
                                connect_timeout_s=2.0, read_timeout_s=2.0)
        self.loop = EventLoop()
        self.outbox = Outbox(tmp_path / "outbox.sqlite3")
        self.lines: list[str] = []
        self.identities: list[tuple[str, dict[str, str | None]]] = []
        self.loop_thread = threading.current_thread()
        self.sender = Sender(self.spec, self.outbox, ManagerClient(self.spec), self.loop, self.lines.append, calls,
                             on_identity=lambda uuid, fields: self.identities.append((uuid, dict(fields))))

    def registered_before(self) -> None:
        """As an earlier start left it: this label registered as u-1, the identity restored from the outbox."""
        self.outbox.put("label", "C.kinds")
        self.outbox.put("uuid", "u-1")
        self.sender.restore_identity()

    def run_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        self.loop.run_until(lambda: done() or time.monotonic() > deadline, 0.02)
        assert done(), f"not done within {WAIT_S:g}s; log: {self.lines}"

    def close(self) -> None:
        self.sender.ask_to_stop()
        self.sender.join(WAIT_S)
        self.outbox.close()
        self.loop.close()


@pytest.fixture
def delivery(server: _Server, tmp_path: Path) -> Iterator[Callable[[CallKinds], Delivery]]:
    made: list[Delivery] = []

    def make(calls: CallKinds) -> Delivery:
        made.append(Delivery(server, tmp_path, calls))
        return made[-1]

    yield make
    for d in made:
        d.close()


def widget_kind(heard: list[Any], threads: list[str]) -> CallKind:
    """A plugin's call kind: ``POST /widget-done`` with the uuid and the payload's count; its answer's ``ok``."""

    def attempt(client: ManagerClient, payload: Any, uuid: str | None) -> Answer:
        answer = client.request("POST", "/widget-done", json_body={"uuid": uuid, "count": payload["count"]})
        if not isinstance(answer.body, dict) or not isinstance(answer.body.get("ok"), bool):
            raise TransientError("the manager answered /widget-done without a boolean 'ok'")
        return Answer(answer.status, {"ok": answer.body["ok"]})

    def keep(payload: Any, body: Any) -> None:
        threads.append(threading.current_thread().name)

    def delivered(payload: Any, body: Any) -> None:
        threads.append(threading.current_thread().name)
        heard.append(("delivered", payload["count"], body))

    return CallKind(attempt, keep=keep, delivered=delivered, refused=lambda payload: heard.append(("refused",)))


def test_a_plugin_kind_is_delivered_in_order_with_the_cores(delivery: Callable[[CallKinds], Delivery],
                                                            server: _Server) -> None:
    heard: list[Any] = []
    threads: list[str] = []
    calls = CallKinds()
    calls.add("widget-done", widget_kind(heard, threads))
    d = delivery(calls)
    d.sender.restore_identity()  # no uuid yet: a register is queued first
    for kind, payload in [("param-done", {}), ("widget-done", {"count": 3}), ("running", {}),
                          ("log", {"source": "setup", "text": "a line\n"})]:
        d.outbox.add(kind, payload)
    d.sender.start()
    d.run_until(lambda: not d.outbox.pending() and bool(heard))
    assert server.paths() == ["/register", "/param-done", "/widget-done", "/running", "/api/log-push"]
    assert server.seen[2][1] == {"uuid": "u-1", "count": 3}
    assert server.seen[4][1] == "a line\n" and server.seen[4][2] == "u-1"
    assert heard == [("delivered", 3, {"ok": True})]
    # keep on the sender's thread (before the next call), delivered on the loop's (this test's) thread
    assert threads == ["outbox", d.loop_thread.name]
    assert d.outbox.delivered_answer("widget-done") == {"ok": True}


def test_an_unknown_kind_is_refused_for_good_in_one_line_and_holds_nothing_up(
        delivery: Callable[[CallKinds], Delivery], server: _Server) -> None:
    d = delivery(CallKinds())
    d.registered_before()
    mystery = d.outbox.add("bench-done", {"rate": 1.0})  # a plugin's kind, with no plugin loaded now
    d.outbox.add("running", {})
    d.sender.start()
    d.run_until(lambda: not d.outbox.pending() and any("refused for good" in line for line in d.lines))
    assert server.paths() == ["/running"]  # the unknown one never went out
    said = [line for line in d.lines if "refused for good" in line]
    assert said == [f"manager: outbox call {mystery} refused for good: no handler for the call kind 'bench-done' "
                    "(written by another version?)"], d.lines
    states = {row["id"]: row["state"] for row in d.outbox.history()}
    assert states[mystery] == "failed"
    assert d.sender.alive()


def registered_with(delivery: Callable[[CallKinds], Delivery], widget: CallKind) -> tuple[Delivery, list[str]]:
    """A delivery with the ``widget-done`` kind, registered by an earlier start (uuid u-1), and what its loop's
    faults say (a contained bug's traceback)."""
    calls = CallKinds()
    calls.add("widget-done", widget)
    d = delivery(calls)
    said: list[str] = []
    d.loop.faults.log = said.append
    d.registered_before()
    return d, said

def test_a_bug_in_a_kinds_delivery_is_said_outlived_and_holds_up_its_call_only_a_few_tries(
        delivery: Callable[[CallKinds], Delivery], server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # A plugin's body builder that raises (a bug, not the manager's answer): the outbox's only deliverer must
    # not die of it (every later report, the give-up among them, would stay undelivered). The bug is said
    # once with its traceback; the call meets it BUG_TRIES times, is failed, and the calls behind it go.
    monkeypatch.setattr(sender_mod, "BUG_WAIT_S", 0.01)
    tries: list[int] = []

    def broken(client: ManagerClient, payload: Any, uuid: str | None) -> Answer:
        tries.append(payload["count"])
        raise KeyError("field")

    d, said = registered_with(delivery, CallKind(broken))
    broken_id = d.outbox.add("widget-done", {"count": 1})
    d.outbox.add("running", {})
    d.sender.start()
    d.run_until(lambda: not d.outbox.pending() and any("failed for good" in line for line in d.lines))
    assert server.paths() == ["/running"] and d.sender.alive()
    assert tries == [1] * sender_mod.BUG_TRIES
    assert {row["id"]: row["state"] for row in d.outbox.history()}[broken_id] == "failed"
    assert [line for line in d.lines if "failed for good" in line] == [
        f"manager: widget-done failed for good: a bug of ours met {sender_mod.BUG_TRIES} times (KeyError: "
        "'field'); the calls behind it go on"]
    assert said[0] == "internal error in the outbox sender: KeyError: 'field' (contained; the supervisor goes on)"
    assert any("Traceback" in line for line in said)



def test_a_bug_in_the_registration_never_fails_it(delivery: Callable[[CallKinds], Delivery], server: _Server,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Every other call needs the uuid: a register failed for a bug would only be queued again, and again.
    monkeypatch.setattr(sender_mod, "BUG_WAIT_S", 0.01)
    tries: list[int] = []

    def broken(self: Sender) -> Answer:
        tries.append(1)
        raise KeyError("field")

    monkeypatch.setattr(Sender, "_register", broken)
    d = delivery(CallKinds())
    d.loop.faults.log = [].append
    d.sender.restore_identity()  # no uuid yet: a register is queued first
    d.sender.start()
    d.run_until(lambda: len(tries) > 2 * sender_mod.BUG_TRIES)
    assert d.sender.alive() and not any("failed for good" in line for line in d.lines), d.lines
    assert [row["state"] for row in d.outbox.history()] == ["pending"]

def test_what_the_machine_refuses_while_delivering_holds_the_call_up_but_never_fails_it(
        delivery: Callable[[CallKinds], Delivery], server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # No file descriptor left (an OSError, not a bug): not the call's fault. One line, no traceback, and
    # the call goes once the machine gives what it needs.
    monkeypatch.setattr(sender_mod, "BUG_WAIT_S", 0.01)
    tries: list[int] = []

    def starved(client: ManagerClient, payload: Any, uuid: str | None) -> Answer:
        tries.append(1)
        if len(tries) <= sender_mod.BUG_TRIES + 1:
            raise OSError(24, "Too many open files")
        return client.request("POST", "/widget-done", json_body={"uuid": uuid})

    d, said = registered_with(delivery, CallKind(starved))
    d.outbox.add("widget-done", {})
    d.sender.start()
    d.run_until(lambda: not d.outbox.pending())
    assert server.paths() == ["/widget-done"] and said == []
    assert [line for line in d.lines if "held up" in line] == [
        "manager: delivery held up (OSError: [Errno 24] Too many open files); trying again in 0.01s"]
    assert all(row["state"] == "delivered" for row in d.outbox.history())

def test_a_refusal_is_told_to_its_kind_on_the_loops_thread(delivery: Callable[[CallKinds], Delivery],
                                                            server: _Server) -> None:
    heard: list[Any] = []
    calls = CallKinds()
    calls.add("widget-done", widget_kind(heard, []))
    server.answers["/widget-done"] = (404, {"error": "unknown uuid"})
    d = delivery(calls)
    d.registered_before()
    d.outbox.add("widget-done", {"count": 1})
    d.sender.start()
    d.run_until(lambda: bool(heard))
    assert heard == [("refused",)]
    assert any(line.startswith("manager: widget-done refused for good: HTTP 404") for line in d.lines), d.lines


def checked_widget_id(value: Any) -> str | None:
    if value is None:
        return None
    if not (isinstance(value, str) and value.startswith("w")):
        raise AnswerError(f"widget_id is not a widget's: {value!r}")
    return value


def test_register_carries_a_plugins_fields_and_keeps_the_answers_after_checking_them(
        delivery: Callable[[CallKinds], Delivery], server: _Server) -> None:
    calls = CallKinds()
    calls.add_register_fields(lambda: {"min_widgets": 2.5})
    calls.add_answer_field("widget_id", checked_widget_id)
    server.answers["/register"] = (200, {"uuid": "u-1", "widget_id": 42})  # fails the plugin's check
    d = delivery(calls)
    d.sender.restore_identity()
    d.sender.start()
    d.run_until(lambda: any("unusable widget_id" in line for line in d.lines))
    assert d.sender.uuid is None and d.identities == []  # retried, never kept
    server.answers["/register"] = (200, {"uuid": "u-2", "widget_id": "w9"})
    d.run_until(lambda: bool(d.identities))
    assert server.seen[0][1] == {"label": "C.kinds", "min_widgets": 2.5}  # the label first, then the fields
    assert d.identities == [("u-2", {"widget_id": "w9"})]
    assert d.outbox.get("uuid") == "u-2" and d.outbox.get("widget_id") == "w9"
    assert "manager: registered: uuid u-2, widget_id w9" in d.lines
    assert any("the manager answered /register with an unusable widget_id is not a widget's: 42" in line
               for line in d.lines), d.lines


def test_an_identity_kept_by_an_earlier_start_is_held_to_the_plugins_check(
        delivery: Callable[[CallKinds], Delivery]) -> None:
    calls = CallKinds()
    calls.add_answer_field("widget_id", checked_widget_id)
    d = delivery(calls)
    d.outbox.put("label", "C.kinds")
    d.outbox.put("uuid", "u-1")
    d.outbox.put("widget_id", "7")  # written by an older version: not a widget's
    d.sender.restore_identity()
    assert d.sender.uuid is None and d.outbox.get("uuid") == "" and d.outbox.get("widget_id") == ""
    assert d.outbox.pending_of("register") == 1
    assert any("the identity kept from an earlier start is unusable (widget_id is not a widget's" in line
               for line in d.lines), d.lines


def test_a_log_push_of_any_text_goes_out_in_whole_characters_within_what_the_manager_keeps(
        delivery: Callable[[CallKinds], Delivery], server: _Server) -> None:
    # Text with a lone surrogate (bytes from the environment that are not UTF-8) raised in a strict encode: a "bug
    # of ours" three times, then the failure's report failed for good. And a text queued whole by an older version,
    # cut at 256 KiB, was cut inside a character (this recorder's strict decode refuses that).
    d = delivery(CallKinds())
    d.registered_before()
    d.outbox.add("log", {"source": "setup", "text": "cannot run /nonexistent/\udcff\udcfeprog\n"})
    d.outbox.add("log", {"source": "setup", "text": "x" + "é" * 200000})
    d.sender.start()
    d.run_until(lambda: not d.outbox.pending())
    assert [row["state"] for row in d.outbox.history()] == ["delivered", "delivered"], d.lines
    assert [body for _, body, _ in server.seen] == ["cannot run /nonexistent/??prog\n",
                                                   "x" + "é" * ((LOG_PUSH_LIMIT - 1) // 2)]


def test_a_kind_has_one_handler() -> None:
    calls = CallKinds()
    for taken in ("register", "param-done", "running", "log"):
        with pytest.raises(ValueError, match="has a handler already"):
            calls.add(taken, CallKind(lambda client, payload, uuid: Answer(200, None)))


# ---------------------------------------------------------------- pure: what the core reports, a verdict masked


def view(report: str | None, state: PhaseState, up: bool = False, kind: str = "oneshot") -> PhaseView:
    return PhaseView("p", kind, state, "why", 1, up, False, report, None)


@pytest.mark.parametrize(("phase", "due"), [
    (view("param-done", PhaseState.DONE), "param-done"),
    (view("param-done", PhaseState.RUNNING), None),
    (view("running", PhaseState.RUNNING, up=True, kind="service"), "running"),
    (view("running", PhaseState.RUNNING, up=False, kind="service"), None),
    (view("bench-done", PhaseState.DONE), None),  # a plugin's kind: the plugin reports it, not the core
    (view(None, PhaseState.DONE), None),
])
def test_the_core_reports_param_done_when_done_and_running_when_up(phase: PhaseView, due: str | None) -> None:
    assert core_report_due(phase) == due


def test_a_verdict_masked_keeps_all_but_its_words() -> None:
    """Verdict.masked (what VerdictRecord.record applies, once): the words masked, the rest as it was."""
    secret = "tok-SECRET-42"
    verdict = Verdict(phase="p", child="p/p", pid=7, reason="spawn_failed", success=False, status=1,
                      detail=f"cannot run --token={secret}", last_lines=("a *** line",))
    shown = verdict.masked(Redactor([secret]).text)
    assert secret not in shown.line() and f"--token={MASK}" in shown.detail
    assert shown.last_lines == verdict.last_lines and shown.status == 1


def test_a_call_queued_behind_a_log_push_whose_route_fails_goes_at_once_not_after_its_backoff(
        delivery: Callable[[CallKinds], Delivery], server: _Server) -> None:
    """The manager answers /api/log-push 500 (its log store broken), every other route well. Past LOG_ROUTE_TRIES
    such answers the calls behind the push go first, but one queued while the push waited out its backoff (4 s
    after its 4th try, up to 30 s) waited for the push's next try: a report held up to 30 s. The wake cuts that
    wait now; another log push queued meanwhile does not (it would only be refused again sooner)."""
    server.answers["/api/log-push"] = (500, {"error": "broken"})
    d = delivery(CallKinds())
    d.registered_before()
    push = d.outbox.add("log", {"source": "setup", "text": "the reason\n"})
    d.sender.start()
    d.run_until(lambda: server.paths().count("/api/log-push") == sender_mod.LOG_ROUTE_TRIES + 1)
    d.outbox.add("log", {"source": "setup", "text": "a later line\n"})
    d.sender.wake()
    waited = time.monotonic() + 0.5
    d.loop.run_until(lambda: time.monotonic() > waited, 0.02)
    assert server.paths().count("/api/log-push") == sender_mod.LOG_ROUTE_TRIES + 1, "a log push cut the backoff"
    queued = time.monotonic()
    d.outbox.add("param-done", {})
    d.sender.wake()  # (as Reporter.queue does)
    d.run_until(lambda: "/param-done" in server.paths())
    assert time.monotonic() - queued < 2.0, "held behind the log push's backoff (4 s and more)"
    assert d.outbox.is_pending(push), "the push stays pending, tried again after the calls behind it"
