"""The prover's fleet protocol in-process (prover/fleet.py, prover/gate.py): the bench gate driven through a
fake ProductionControl and timers set by hand, the give-up decided as a pure function, bench-done and the
give-up queued through a ManagerLink that records, the answers' checks, and bench-done's call against a
real HTTP server on 127.0.0.1. End to end (a real supervisor, the dev-manager): tests/test_reporting.py,
tests/test_manager.py, tests/test_exit_flush.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.config import ManagerSpec
from supervisor.lifecycle.states import PhaseState
from supervisor.lifecycle.verdict import Verdict
from supervisor.manager.answers import AnswerError, Identity, register_answer
from supervisor.manager.client import ManagerClient, TransientError
from supervisor.prover.fleet import (
    BENCH_DONE,
    FLEET_ROW,
    REASON_MAX_CHARS,
    RUNNER_ID,
    RUNNER_ID_MAX,
    Fleet,
    FleetSettings,
    GiveUp,
    attach,
    bench_answer,
    bench_done_call,
    check_runner_id,
    decide_give_up,
)
from supervisor.prover.gate import GATE_HOLD, BenchGate
from supervisor.prover.reasons import EXIT_BENCH_REJECTED
from supervisor.wiring import CallKind, PhaseView, RowFields, ShutdownView, Wiring

# ---------------------------------------------------------------- stand-ins of what the core hands in


@dataclass
class Production:
    """A ProductionControl that notes what it was asked."""

    asked: list[tuple[Any, ...]] = field(default_factory=list)

    def hold(self, phase_name: str, why: str, for_s: float | None = None) -> None:
        self.asked.append(("hold", phase_name, why))

    def release(self, phase_name: str) -> None:
        self.asked.append(("release", phase_name))

    def stop_from_outside(self, why: str, status: int) -> None:
        self.asked.append(("stop", why, status))


class Timers:
    """``call_later`` whose timers fire when the test says so."""

    def __init__(self) -> None:
        self.set: list[tuple[float, Callable[[], None], SimpleNamespace]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        timer = SimpleNamespace(cancelled=False)
        timer.cancel = lambda: setattr(timer, "cancelled", True)
        self.set.append((delay, callback, timer))
        return timer

    def fire_all(self) -> None:
        for _, callback, timer in self.set:
            if not timer.cancelled:
                callback()


@dataclass
class Link:
    """A ManagerLink that records: what an earlier start left (answers, pending calls) is given."""

    answers: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    queued: list[tuple[str, dict[str, Any], str, str | None]] = field(default_factory=list)
    kinds: dict[str, CallKind] = field(default_factory=dict)
    register_fields: list[Callable[[], Mapping[str, Any]]] = field(default_factory=list)
    row_fields: list[RowFields] = field(default_factory=list)
    heard: dict[str, Any] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)
    row_listeners: list[Callable[[Any], None]] = field(default_factory=list)
    kill_listeners: list[Callable[[Any], None]] = field(default_factory=list)
    clocks: dict[str, tuple[float, str]] = field(default_factory=dict)
    on: bool = True

    def reporting(self) -> bool:
        return self.on

    def queue(self, kind: str, payload: Mapping[str, Any], *, said: str = "",
              exit_waits_for: str | None = None) -> None:
        self.queued.append((kind, dict(payload), said, exit_waits_for))

    def delivered_answer(self, kind: str) -> Any:
        return self.answers.get(kind)

    def pending_of(self, kind: str) -> int:
        return self.pending.get(kind, 0)

    def handle(self, kind: str, call: CallKind) -> None:
        self.kinds[kind] = call

    def add_register_fields(self, fields: Callable[[], Mapping[str, Any]]) -> None:
        self.register_fields.append(fields)

    def hear_register_field(self, name: str, check: Any, on_known: Callable[[str | None], None]) -> None:
        self.heard[name] = (check, on_known)

    def add_row_fields(self, fields: RowFields) -> None:
        self.row_fields.append(fields)

    def push_text(self, source: str, text: str) -> None:
        raise AssertionError("the fleet protocol pushes no text of its own")

    def retire(self, reason: str) -> None:
        self.retired.append(reason)

    def give_up(self, reason: str, kind: str, payload: Mapping[str, Any], *, said: str = "",
                exit_waits_for: str | None = None) -> None:
        """The marker with its call first (what a restart queues again), then the call, as the Reporter does."""
        self.retire(reason)
        self.queue(kind, payload, said=said, exit_waits_for=exit_waits_for)

    def on_row(self, listener: Callable[[Any], None]) -> None:
        self.row_listeners.append(listener)

    def on_killed(self, listener: Callable[[Any], None]) -> None:
        self.kill_listeners.append(listener)

    def clock(self, name: str) -> tuple[float, str] | None:
        return self.clocks.get(name)


SETTINGS = FleetSettings(min_rate=50.0, bench_gate_s=300.0, give_up_on_failure=True, bench_done_reason=False)


def gate_with(settings: FleetSettings = SETTINGS) -> tuple[BenchGate, Production, Timers, list[str]]:
    production, timers, lines = Production(), Timers(), []
    return BenchGate(settings.bench_gate_s, settings.min_rate, production, timers.call_later, lines.append), \
        production, timers, lines


# ---------------------------------------------------------------- the gate


def test_the_gate_holds_production_and_a_pass_releases_it() -> None:
    gate, production, timers, lines = gate_with()
    gate.hold("bench")
    assert production.asked == [("hold", "bench", GATE_HOLD)]
    assert [delay for delay, _, _ in timers.set] == [300.0]
    gate.answered(True, 61.5)
    assert production.asked[-1] == ("release", "bench")
    assert "manager: benchmark passed (rate 61.5/h >= min_rate 50)" in lines
    timers.fire_all()  # the gate's timer was cancelled: nothing released twice
    assert production.asked.count(("release", "bench")) == 1 and gate.held is None


def test_passed_false_shuts_the_run_down_with_69() -> None:
    gate, production, _, lines = gate_with()
    gate.hold("bench")
    gate.answered(False, 12.0)
    why = ("the manager rejected the benchmark (rate 12/h < min_rate 50) and is destroying this instance: "
           "not starting production")
    assert production.asked[-1] == ("stop", why, EXIT_BENCH_REJECTED) and EXIT_BENCH_REJECTED == 69
    assert ("release", "bench") not in production.asked
    assert why in lines


def test_the_gates_expiry_starts_production_and_a_late_rejection_still_stops_it() -> None:
    gate, production, timers, lines = gate_with()
    gate.hold("bench")
    timers.fire_all()
    assert production.asked[-1] == ("release", "bench")
    assert "manager: no answer to bench-done after 300s; starting production anyway (a later passed: false " \
           "still stops it)" in lines
    gate.answered(False, 1.0)
    assert production.asked[-1][0] == "stop" and production.asked[-1][2] == EXIT_BENCH_REJECTED
    # Production runs: the line says it is stopped, never that it is "not starting".
    assert production.asked[-1][1] == ("the manager rejected the benchmark (rate 1/h < min_rate 50) and is destroying "
                                       "this instance: stopping the run (production was let through before the "
                                       "answer)"), production.asked[-1]


def test_a_refused_bench_done_releases_at_once_and_only_a_held_gate() -> None:
    gate, production, _, lines = gate_with()
    gate.refused()  # nothing held: nothing to release
    assert production.asked == []
    gate.hold("bench")
    gate.refused()
    assert production.asked[-1] == ("release", "bench")
    assert "manager: starting production without the manager's verdict on the bench" in lines


def test_a_gate_of_zero_seconds_never_holds() -> None:
    gate, production, timers, _ = gate_with(FleetSettings(50.0, 0.0, True, False))
    gate.hold("bench")
    assert production.asked == [] and timers.set == []


# ---------------------------------------------------------------- the give-up, decided


@pytest.mark.parametrize(("failed", "switch", "answer", "decision"), [
    (False, True, None, GiveUp.NO_FAILURE),
    (False, False, None, GiveUp.NO_FAILURE),  # a stop is no failure, switch or not
    (True, False, None, GiveUp.SWITCHED_OFF),
    (True, False, {"passed": False}, GiveUp.SWITCHED_OFF),  # the switch is said before anything else
    (True, True, {"passed": False}, GiveUp.ALREADY_KILLED),
    (True, True, None, GiveUp.GIVE_UP),  # failed before the bench was ever reported
    (True, True, {"passed": True}, GiveUp.GIVE_UP),  # passed: production never came up, or failed for good
    (True, True, {}, GiveUp.GIVE_UP),  # an earlier give-up's answer (nothing kept)
])
def test_the_give_up_is_a_function_of_failure_switch_and_the_last_answer(
        failed: bool, switch: bool, answer: Any, decision: GiveUp) -> None:
    assert decide_give_up(failed, switch, answer) is decision


def test_production_that_failed_for_good_after_it_was_up_is_given_up_too() -> None:
    link = Link()
    fleet, _, lines = fleet_with(link)
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5)))
    link.answers[BENCH_DONE] = {"passed": True}
    fleet.shut_down(ShutdownView("phase curio failed", 3, FAILURE, True))
    assert [payload.get("failed") for _, payload, _, _ in link.queued] == [None, True]
    assert lines[-1].endswith("; production was up, and failed for good")


# ---------------------------------------------------------------- bench-done and the give-up, queued


def bench_done(parsed: Any, state: PhaseState = PhaseState.DONE, report: str | None = BENCH_DONE) -> PhaseView:
    return PhaseView("bench", "oneshot", state, "exit 0", 1, False, False, report, parsed)


def fleet_with(link: Link, settings: FleetSettings = SETTINGS) -> tuple[Fleet, Production, list[str]]:
    gate, production, _, lines = gate_with(settings)
    return Fleet(settings, link, gate, lines.append), production, lines


FAILURE = Verdict(phase="curio", child="curio", pid=9, reason="exit_code", success=False, status=3,
                  detail="exit code 3 " + "x" * 2000)


def test_the_bench_phase_done_queues_its_rate_and_holds_production() -> None:
    link = Link()
    fleet, production, _ = fleet_with(link)
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5), state=PhaseState.RUNNING))
    fleet.transition(bench_done(None, report="param-done"))
    assert link.queued == [] and production.asked == []
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5)))
    assert link.queued == [(BENCH_DONE, {"rate": 61.5}, " (rate 61.5/h)", None)]
    assert production.asked == [("hold", "bench", GATE_HOLD)]


def test_a_bench_done_without_a_rate_is_never_reported_at_zero() -> None:
    # The config refuses a bench-done phase that no cuzk-bench parser reads (its rate); were one done all the
    # same with no rate, a rate of 0 would have the manager destroy an instance whose bench passed.
    link = Link()
    fleet, production, said = fleet_with(link)
    fleet.transition(bench_done(None))
    assert link.queued == [] and production.asked == []
    assert said == ["manager: phase bench is done but its output gave no rate; bench-done not sent"]


def test_nothing_is_reported_while_the_reporting_is_off() -> None:
    link = Link(on=False)
    fleet, production, _ = fleet_with(link)
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5)))
    fleet.shut_down(ShutdownView("phase curio failed", 3, FAILURE, False))
    assert link.queued == [] and production.asked == []


def test_a_bench_done_passed_before_this_restart_is_not_sent_again() -> None:
    link = Link(answers={BENCH_DONE: {"passed": True}})
    fleet, production, lines = fleet_with(link)
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5)))
    assert link.queued == [] and production.asked == []
    assert "manager: bench-done was delivered and passed before this restart; not sent again" in lines


def test_a_bench_done_still_queued_from_before_the_restart_is_waited_for() -> None:
    link = Link(pending={BENCH_DONE: 1})
    fleet, production, lines = fleet_with(link)
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5)))
    assert link.queued == [] and production.asked == [("hold", "bench", GATE_HOLD)]
    assert "manager: a bench-done from before this restart is still queued; waiting for its answer" in lines


def test_a_failure_before_production_gives_the_instance_up_with_the_reason() -> None:
    link = Link()
    fleet, _, lines = fleet_with(link)
    fleet.shut_down(ShutdownView("phase paramfetch failed", 3, FAILURE, False))
    [(kind, payload, said, waits)] = link.queued
    assert (kind, said, waits) == (BENCH_DONE, " (rate 0/h)", "the give-up")
    assert payload["rate"] == 0.0 and payload["failed"] is True
    assert payload["reason"] == FAILURE.line()[:REASON_MAX_CHARS] and len(payload["reason"]) == REASON_MAX_CHARS
    assert lines[-1] == "manager: giving the instance up (phase paramfetch failed): bench-done with rate 0 after " \
                        "the reason line"


def test_a_give_up_after_a_passed_bench_says_so() -> None:
    link = Link()
    fleet, _, lines = fleet_with(link)
    fleet.transition(bench_done(SimpleNamespace(rate_per_hour=61.5)))
    link.answers[BENCH_DONE] = {"passed": True}
    fleet.shut_down(ShutdownView("phase curio failed", 3, FAILURE, False))
    assert [payload.get("failed") for _, payload, _, _ in link.queued] == [None, True]  # queued again, regardless
    assert lines[-1].endswith("; the bench had passed, but production never came up")


@pytest.mark.parametrize(("view", "answers", "settings"), [
    (ShutdownView("received SIGTERM", 143, None, False), {}, SETTINGS),  # a stop: no failure
    (ShutdownView("lifecycle complete", 0, None, False), {}, SETTINGS),
    (ShutdownView("phase x failed", 3, FAILURE, False), {BENCH_DONE: {"passed": False}}, SETTINGS),
    (ShutdownView("phase x failed", 3, FAILURE, False), {}, FleetSettings(50.0, 300.0, False, False)),
])
def test_no_give_up_without_a_failure_or_when_switched_off(
        view: ShutdownView, answers: dict[str, Any], settings: FleetSettings) -> None:
    link = Link(answers=answers)
    fleet, _, lines = fleet_with(link, settings)
    fleet.shut_down(view)
    assert link.queued == []
    switched_off = "manager: not giving the instance up (give_up_on_failure = false); the manager's timeout will end it"
    assert (switched_off in lines) is (not settings.give_up_on_failure)


def test_attach_adds_the_fleet_protocol_to_the_reporting_and_nothing_without_a_manager() -> None:
    events: dict[str, list[Any]] = {"transition": [], "shutdown": [], "verdict": []}
    env: dict[str, str] = {}
    link = Link()

    def wiring(manager: Link | None) -> Wiring:
        plan = SimpleNamespace(manager=ManagerSpec(url="http://127.0.0.1:9"),
                               extensions={"manager": {"min_rate": 7.5, "bench_gate_s": 30.0}})
        return Wiring(plan=plan, events=SimpleNamespace(on_transition=events["transition"].append,  # type: ignore
                                                        on_shutdown=events["shutdown"].append,
                                                        on_verdict=events["verdict"].append),
                      production=Production(), manager=manager, export_env=env.__setitem__,
                      call_later=Timers().call_later, log=lambda line: None)

    attach(wiring(None))
    assert events == {"transition": [], "shutdown": [], "verdict": []}
    attach(wiring(link))
    assert list(link.kinds) == [BENCH_DONE]
    assert [fields() for fields in link.register_fields] == [{"min_rate": 7.5}]
    assert link.row_fields == [FLEET_ROW]  # its row's min_rate, rate and bench_done state are read
    check, on_known = link.heard[RUNNER_ID]
    assert check(7) == "7"
    on_known("7")
    on_known(None)  # no runner id given: none exported
    assert env == {"RUNNER_ID": "7"}
    assert len(events["transition"]) == 1 and len(events["shutdown"]) == 1


# ---------------------------------------------------------------- the answers' checks (answers.py's rules)


@pytest.mark.parametrize(("runner_id", "kept"), [(7, "7"), (0, "0"), ("12", "12"), (None, None), ("", None),
                                                 (RUNNER_ID_MAX, str(RUNNER_ID_MAX)),
                                                 # (a manager's float: refused as "not a whole number", every retry)
                                                 (7.0, "7"), (-0.0, "0")])
def test_a_runner_id_is_a_whole_number_or_none(runner_id: Any, kept: str | None) -> None:
    assert check_runner_id(runner_id) == kept
    assert register_answer({"uuid": "u-1", "runner_id": runner_id}, {RUNNER_ID: check_runner_id}).fields == \
        {RUNNER_ID: kept}


def test_an_absent_runner_id_is_none() -> None:
    assert register_answer({"uuid": "u-1"}, {RUNNER_ID: check_runner_id}) == Identity("u-1", {RUNNER_ID: None})


@pytest.mark.parametrize("runner_id", [True, False, 1.5, float("nan"), float("inf"), -1.0, float(RUNNER_ID_MAX + 1),
                                       -1, RUNNER_ID_MAX + 1, "NaN", "1e3", "7.0", "-1",
                                       "١٢", " 7", "7\n", "9" * 30, [7], {"id": 7}])
def test_an_unusable_runner_id_is_refused(runner_id: Any) -> None:
    with pytest.raises(AnswerError) as info:
        register_answer({"uuid": "u-1", "runner_id": runner_id}, {RUNNER_ID: check_runner_id})
    assert str(info.value).startswith("unusable runner_id "), info.value


def test_a_runner_id_of_too_many_digits_is_shown_short() -> None:
    with pytest.raises(AnswerError) as big:
        check_runner_id(10 ** 5000)  # more digits than Python will print
    assert "a number with too many digits" in str(big.value)


@pytest.mark.parametrize("passed", [True, False])
def test_bench_done_passed_is_a_boolean(passed: bool) -> None:
    assert bench_answer({"ok": True, "passed": passed}) is passed


@pytest.mark.parametrize("body", [{"ok": True}, {"passed": 1}, {"passed": "true"}, {"passed": None}, True, [], None])
def test_bench_done_without_a_boolean_passed_is_refused(body: Any) -> None:
    with pytest.raises(AnswerError, match="without a boolean 'passed'"):
        bench_answer(body)


# ---------------------------------------------------------------- bench-done's call, against a real server


class _BenchManager(BaseHTTPRequestHandler):
    server: Any
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.bodies.append((self.path, body))
        raw = json.dumps(self.server.answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def bench_manager() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BenchManager)
    server.daemon_threads = True
    server.bodies, server.answer = [], {"ok": True, "passed": True}  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("send_reason", [True, False])
def test_bench_done_carries_the_rate_and_the_reason_only_when_asked(bench_manager: Any, send_reason: bool) -> None:
    client = ManagerClient(ManagerSpec(url=f"http://127.0.0.1:{bench_manager.server_address[1]}"))
    answered: list[tuple[bool, float]] = []
    refused: list[bool] = []
    call = bench_done_call(FleetSettings(50.0, 300.0, True, send_reason), lambda passed, rate: answered.append(
        (passed, rate)), lambda: refused.append(True))
    give_up = {"rate": 0.0, "failed": True, "reason": "phase=x reason=exit_code"}
    kept = call.attempt(client, give_up, "u-1").body
    assert kept == {"passed": True}
    expected = {"uuid": "u-1", "rate": 0.0, **({"reason": "phase=x reason=exit_code"} if send_reason else {})}
    assert bench_manager.bodies == [("/bench-done", expected)]
    assert call.delivered is not None and call.refused is not None
    call.delivered(give_up, kept)  # a give-up's answer lets nothing through
    call.delivered({"rate": 61.5}, kept)
    assert answered == [(True, 61.5)]
    call.refused({"rate": 61.5})
    assert refused == [True]
    bench_manager.answer = {"ok": True}  # no boolean passed: retried like a manager that is down
    with pytest.raises(TransientError, match="the manager answered /bench-done without a boolean 'passed'"):
        call.attempt(client, {"rate": 61.5}, "u-1")
