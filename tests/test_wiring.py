"""What a plugin is handed (wiring.py: Events, the lifecycle's PluginEvents), in-process: listeners hear views,
never the Phase; the shutdown view carries the failure masked and whether production was up; a listener
that raises is named as the plugin's own in the fault report. Also the supervisor's own lines: an
``Unshipped`` one never reaches the log shipper's tap (the verdict is pushed from the object instead), and
the lines said while a signal is handled come after it, in order.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import FrozenInstanceError
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.engine.logs import Console, SupervisorLog, Unshipped
from supervisor.engine.loop import EventLoop, Faults
from supervisor.lifecycle.lifecycle import Observers, PluginEvents, production_was_up
from supervisor.lifecycle.states import PhaseState
from supervisor.lifecycle.verdict import Verdict, VerdictRecord
from supervisor.text.redact import MASK, Redactor
from supervisor.wiring import PhaseView, ShutdownView

SECRET = "hunter2-secret"


def phase(name: str, kind: str = "oneshot", report: str | None = None, **state: Any) -> SimpleNamespace:
    fields = {"state": PhaseState.PENDING, "why": "not started", "attempt": 0, "up": False, "was_up": False,
              "parsed": None, **state}
    return SimpleNamespace(name=name, spec=SimpleNamespace(name=name, kind=kind, report=report), hold=None, **fields)


class Lifecycle:
    """What the lifecycle's PluginEvents are told from (supervisor.lifecycle.lifecycle.Lifecycle): its phases, its
    failure, its production; the observers record it tells them through."""

    def __init__(self, faults: Faults | None = None) -> None:
        self.phases = [phase("bench", report="bench-done"), phase("curio", kind="service", report="running")]
        self.observers = Observers(faults=faults or Faults())
        self.failure: Verdict | None = None

    def production_phases(self) -> list[Any]:
        return [p for p in self.phases if p.spec.report == "running"]

    def transition(self, phase: Any) -> None:
        """What the Lifecycle does at each move: its observers hear of the phase."""
        self.observers.phase_changed(phase)

    def shutting_down(self, why: str, status: int) -> None:
        """What the Lifecycle does at its shutdown: its observers hear the view of it."""
        self.observers.shutdown_began(ShutdownView(why, status, self.failure, production_was_up(self)))


def events_of(lifecycle: Lifecycle) -> PluginEvents:
    return lifecycle.observers.plugin


def test_a_transition_listener_hears_a_frozen_view() -> None:
    lifecycle = Lifecycle()
    heard: list[PhaseView] = []
    events_of(lifecycle).on_transition(heard.append)
    bench = lifecycle.phases[0]
    bench.state, bench.why, bench.attempt, bench.parsed = PhaseState.DONE, "exit 0", 2, {"rate": 1}
    lifecycle.transition(bench)
    assert heard == [PhaseView("bench", "oneshot", PhaseState.DONE, "exit 0", 2, False, False, "bench-done",
                               {"rate": 1})]
    with pytest.raises(FrozenInstanceError):
        heard[0].state = PhaseState.FAILED  # type: ignore[misc]


def test_the_shutdown_view_has_the_failure_masked_and_whether_production_was_up() -> None:
    lifecycle = Lifecycle()
    heard: list[ShutdownView] = []
    events_of(lifecycle).on_shutdown(heard.append)
    said: list[str] = []
    record = VerdictRecord(said.append, Redactor([SECRET]).text)
    # The lifecycle's failure is a recorded verdict: masked where it was recorded, once.
    lifecycle.failure = record.record(Verdict(phase="bench", child="bench", pid=1, reason="exit_code",
                                              success=False, status=3, detail=f"token {SECRET}"))
    lifecycle.shutting_down("phase bench failed", 3)
    lifecycle.phases[1].was_up = True
    lifecycle.shutting_down("phase curio failed", 3)
    assert [(v.why, v.status, v.production_was_up) for v in heard] == [("phase bench failed", 3, False),
                                                                        ("phase curio failed", 3, True)]
    assert heard[0].failure is not None and heard[0].failure.detail == f"token {MASK}"
    assert SECRET not in heard[0].failure.line()
    assert record[0] is lifecycle.failure and not any(SECRET in line for line in said), said


def test_a_verdict_is_masked_where_it_is_recorded_and_every_reader_gets_the_masked_one() -> None:
    said: list[str] = []
    heard: list[Verdict] = []
    observers = Observers()
    observers.plugin.on_verdict(heard.append)
    record = VerdictRecord(said.append, Redactor([SECRET]).text, observers)
    made = Verdict(phase="work", child="work", pid=None, reason="spawn_failed", success=False, status=127,
                   detail=f"/opt/{SECRET}/curio: not found", last_lines=["already masked ***"])
    kept = record.record(made)
    assert kept.detail == f"/opt/{MASK}/curio: not found" and kept.last_lines == made.last_lines
    assert heard == [kept] and list(record) == [kept]
    assert said and not any(SECRET in line for line in said), said
    assert made.detail.count(SECRET) == 1  # the verdict as made is untouched (frozen): only the record is kept
    plain = VerdictRecord(said.append)  # no secrets known: kept as made
    assert plain.record(made) is made


def test_verdict_listeners_hear_the_verdict_object() -> None:
    verdicts: list[Any] = []
    lifecycle = Lifecycle()
    events_of(lifecycle).on_verdict(verdicts.append)
    record = VerdictRecord(lambda line: None, observers=lifecycle.observers)
    made = Verdict(phase="bench", child="bench", pid=1, reason="exit_code", success=True, status=0, detail="")
    assert verdicts == [record.record(made)]


def test_a_plugin_listener_that_raises_is_named_as_its_own() -> None:
    loop = EventLoop()
    said: list[str] = []
    loop.faults.log = said.append
    lifecycle = Lifecycle(loop.faults)

    def broken_bench_listener(view: PhaseView) -> None:
        raise RuntimeError("boom")

    try:
        events_of(lifecycle).on_transition(broken_bench_listener)
        lifecycle.transition(lifecycle.phases[0])
    finally:
        loop.close()
    assert any("broken_bench_listener" in line and "RuntimeError: boom" in line for line in said), said


def test_a_log_that_stopped_shipping_ships_nothing_more() -> None:
    """No manager: the lines held for it stop going to the shipper; the console still has them."""
    console = Console(enabled=False)
    shipped: list[str] = []
    log = SupervisorLog(console, None, ship=shipped.append)
    log("before")
    log.stop_shipping()
    log("after")
    assert shipped == ["before"]


def test_an_unshipped_line_is_logged_but_never_tapped() -> None:
    console = Console(enabled=False)
    tapped: list[str] = []
    log = SupervisorLog(console, None, ship=tapped.append)
    log.redactor = Redactor([SECRET])
    log(f"manager: queued {SECRET}")
    log(Unshipped("FAILED: phase=p child=p reason=exit_code"))
    log(Unshipped("  | the child's last line"))
    log("  | a contained fault's traceback, quoted the same way")  # shipped: only the Unshipped ones are not
    assert tapped == [f"manager: queued {MASK}", "  | a contained fault's traceback, quoted the same way"]


def test_the_lines_said_while_a_signal_is_handled_come_after_it_in_order_and_no_other_threads() -> None:
    # A stop signal's handling runs with its lines held (signals.SignalRouter): its signals go out before
    # anything is written. Every line still comes, in order; a line of another thread meanwhile is not held.
    console = Console(enabled=False)
    said: list[str] = []
    log = SupervisorLog(console, None, ship=said.append)

    def other_thread() -> None:
        log("the sender: a line of its own")

    def handle(signum: int) -> None:
        log(f"signal {signum}: first")
        log.held(lambda: log(f"nested {signum}"))  # a hold inside one: its lines are the outer one's
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert said == ["the sender: a line of its own"]  # ours are not out yet
        log(Unshipped("FAILED: not shipped, still held and then logged"))
        log(f"signal {signum}: last")

    log.held(lambda: handle(15))
    assert said == ["the sender: a line of its own", "signal 15: first", "nested 15", "signal 15: last"]
    log("after the handling: said at once")
    assert said[-1] == "after the handling: said at once"


def test_the_router_holds_a_stop_signals_lines_until_its_stop_is_out_and_nothing_else() -> None:
    from supervisor.engine.signals import SignalRouter

    events: list[str] = []

    class Lifecycle:
        shutting_down = False

        def shutdown(self, why: str, status: int, budget: object = None) -> None:
            events.append(f"shutdown {why} {status}")

        def forward(self, signum: int) -> list[object]:
            events.append(f"forward {signum}")
            return []

    def held(act) -> None:
        events.append("hold")
        act()
        events.append("release")

    router = SignalRouter(SimpleNamespace(reap=lambda: events.append("reap")), events.append, held=held)
    router.lifecycle = Lifecycle()
    router.handle(signal.SIGCHLD)
    router.handle(signal.SIGUSR1)
    assert events == ["reap", f"forward {int(signal.SIGUSR1)}",
                      "SIGUSR1 forwarded to nobody (no phase command running)"]
    events.clear()
    router.handle(signal.SIGTERM)
    assert events[0] == "hold" and events[-1] == "release", events
    assert "shutdown received SIGTERM 143" in events and any(e.startswith("SIGTERM (") for e in events)
