"""The prover's side of the manager's own view: min_rate from its row (the gate, the bench cut), the
benchmark clock (benchlimits.py) on the manager's param_done_at, and a row whose min_rate differs, end to end.

In-process on a fake clock and hand-run timers, as tests/prover/test_benchcut_rules.py; then one real
supervisor against the dev-manager, whose row keeps the min_rate of the label's first registration.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from helpers import Runner, wait_for
from profilekit import BENCH_30_PER_H, ZERO_RATE_BENCH, fleet_config
from test_benchcut_rules import Production, Rig

from supervisor.app.cli import dev_manager
from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager
from supervisor.engine.loop import EventLoop
from supervisor.exits import EXIT_TIMEOUT
from supervisor.lifecycle.states import PhaseState
from supervisor.manager import client as client_mod
from supervisor.manager.client import ManagerClient
from supervisor.manager.outbox import Outbox
from supervisor.manager.row import Row, RowError, find_row, utc_text
from supervisor.manager.rowwatch import RowReading
from supervisor.manager.sender import CallKinds, Sender
from supervisor.prover.bench import BenchResult
from supervisor.prover.benchlimits import BENCH_CLOCK, BENCH_CLOCK_CHECK_S, BenchClock, past_deadline, stretch
from supervisor.prover.fleet import FLEET_ROW, bench_done_call, row_min_rate
from supervisor.prover.gate import BenchGate
from supervisor.prover.reasons import EXIT_BENCH_REJECTED
from supervisor.state import files as state_files
from supervisor.wiring import PhaseView

WAIT_S = 60
NOW = float(calendar.timegm((2026, 12, 1, 12, 0, 0)))
ROW = {"uuid": "u-1", "label": "C.7", "runner_id": 3, "state": "registered", "min_rate": 60.0,
       "registered_at": "2026-12-01 10:31:00"}


def test_the_fleet_protocols_row_fields_are_read_with_the_cores() -> None:
    """What the core's row rules hold (tests/test_managerrow_rules.py) for the fleet protocol's fields."""
    row, notes = find_row([{**ROW, "uuid": "u-2", "state": "killed"}, ROW], "u-1", NOW, FLEET_ROW)
    assert row == Row("u-1", "registered", registered_at=NOW - 89 * 60,
                      extra={"min_rate": 60.0, "bench_rate": None, "bench_done_at": None})
    assert notes == [] and row_min_rate(row) == 60.0
    passed, _ = find_row([{**ROW, "state": "bench_done", "bench_done_at": "2026-12-01 11:00:00", "bench_rate": 61.5}],
                         "u-1", NOW, FLEET_ROW)
    assert passed is not None and passed.extra == {"min_rate": 60.0, "bench_rate": 61.5, "bench_done_at": NOW - 3600}


@pytest.mark.parametrize(("raw", "why"), [
    ({**ROW, "min_rate": "fast"}, "min_rate is not a number"),
    ({**ROW, "min_rate": float("inf")}, "min_rate is not a number"),
])
def test_a_row_of_the_wrong_shape_is_no_evidence(raw: dict[str, object], why: str) -> None:
    with pytest.raises(RowError, match=why):
        find_row([raw], "u-1", NOW, FLEET_ROW)


def test_the_bench_cut_judges_by_the_rows_min_rate_and_says_so() -> None:
    rig = Rig(min_rate=1.0)  # ours would never cut: 4 proofs need 4 h at 1/h
    rig.cut.heard_row(Row("u", "params_done", extra={"min_rate": 3600.0}))  # the manager's: 4 proofs in 4 s
    rig.cut.transition(rig.view(parsed=BenchResult(proofs={"COMPLETED": 1}, expected=4)))
    rig.run_timers(1.0)  # the first proof line seen
    rig.run_timers(6.0)
    [(name, reason, detail)] = rig.production.failed
    assert (name, reason) == ("bench", "too_slow")
    assert detail.endswith("; min_rate 3600/h is the manager's row's"), detail


def test_the_cut_says_when_it_used_its_own_min_rate() -> None:
    rig = Rig(min_rate=3600.0)
    rig.cut.heard_row(Row("u", "params_done"))  # a row without min_rate: ours stays
    rig.cut.transition(rig.view(parsed=BenchResult(proofs={"COMPLETED": 1}, expected=4)))
    rig.run_timers(1.0)
    rig.run_timers(6.0)
    [(_, _, detail)] = rig.production.failed
    assert detail.endswith("; min_rate 3600/h is this instance's ($MIN_RATE or [manager] min_rate)"), detail


def test_the_gate_says_once_that_the_rows_min_rate_differs_and_uses_it() -> None:
    lines: list[str] = []
    gate = BenchGate(0.0, 50.0, Production(), lambda delay, cb: None, lines.append)  # type: ignore[arg-type]
    gate.heard_min_rate(50.0)
    gate.heard_min_rate(None)  # a row that does not say
    assert lines == []
    gate.heard_min_rate(80.0)
    gate.heard_min_rate(80.0)
    assert len(lines) == 1 and "its row's min_rate 80/h differs from this instance's 50/h" in lines[0], lines
    gate.answered(True, 90.0)
    assert lines[-1] == "manager: benchmark passed (rate 90/h >= min_rate 80)"


def test_a_new_rows_min_rate_is_compared_with_this_instances_own_not_an_older_rows() -> None:
    # The label's first row held 1/h; forgotten, it was registered again with this instance's 100/h. The line
    # said "differs from this instance's 1/h": the older row's, not this instance's.
    lines: list[str] = []
    gate = BenchGate(0.0, 100.0, Production(), lambda delay, cb: None, lines.append)  # type: ignore[arg-type]
    gate.heard_min_rate(1.0)
    gate.heard_min_rate(100.0)
    assert len(lines) == 2 and "its row's min_rate 1/h differs from this instance's 100/h" in lines[0], lines
    assert lines[1] == ("manager: its row's min_rate is this instance's 100/h now (a new row; the one before held "
                        "1/h): the manager judges the bench by it"), lines
    gate.heard_min_rate(40.0)
    assert "its row's min_rate 40/h differs from this instance's 100/h" in lines[-1], lines


def test_the_stretch_is_after_the_param_done_phase_up_to_the_bench_done_one() -> None:
    plan = [("fetch", "param-done"), ("warmup", None), ("bench", "bench-done"), ("curio", "running")]
    assert stretch(plan) == {"warmup", "bench"}
    assert stretch([("warmup", None), ("bench", "bench-done")]) == set()  # no param-done: no manager clock
    assert stretch([("fetch", "param-done"), ("curio", "running")]) == set()


def test_past_deadline_names_the_clock_and_its_source() -> None:
    assert past_deadline(1000.0, "the manager's param_done_at", 2700.0, 3699.0) is None
    why = past_deadline(1_800_000_000.0, "the manager's param_done_at", 2700.0, 1_800_000_000.0 + 2760.0)
    assert why is not None and why.startswith("the manager's benchmark timeout passed 60s ago"), why
    assert f"(bench_deadline_s=2700 from the manager's param_done_at, {utc_text(1_800_000_000.0)} UTC)" in why


class Link:
    def __init__(self) -> None:
        self.clocks: dict[str, tuple[float, str]] = {}
        self.answers: dict[str, Any] = {}

    def clock(self, name: str) -> tuple[float, str] | None:
        return self.clocks.get(name)

    def delivered_answer(self, kind: str) -> Any:
        return self.answers.get(kind)


class ClockRig:
    def __init__(self) -> None:
        self.now = 10_000.0
        self.timers: list[Callable[[], None]] = []
        self.link, self.production = Link(), Production()
        self.link.answers["param-done"] = {"ok": True}  # the fetch's end reached the manager: its clock runs
        self.clock = BenchClock(2700.0, {"warmup", "bench"}, self.link, self.production,  # type: ignore[arg-type]
                                lambda delay, cb: self.timers.append(cb), now=lambda: self.now)  # type: ignore

    def view(self, name: str, state: PhaseState = PhaseState.RUNNING, attempt: int = 1) -> PhaseView:
        return PhaseView(name, "oneshot", state, "", attempt, False, False, None, None)

    def run_timers(self, at: float) -> None:
        self.now = at
        due, self.timers = self.timers, []
        for cb in due:
            cb()


def test_a_phase_started_past_the_managers_benchmark_clock_is_failed_at_once() -> None:
    rig = ClockRig()
    rig.link.clocks[BENCH_CLOCK] = (rig.now - 2800.0, "the manager's param_done_at")  # a restart mid-bench
    rig.clock.transition(rig.view("bench", attempt=2))
    [(name, reason, detail)] = rig.production.failed
    assert (name, reason) == ("bench", "too_slow") and "the manager's param_done_at" in detail, detail
    assert rig.timers == []


def test_a_running_phase_is_failed_when_the_clock_runs_out_and_only_its_attempt() -> None:
    rig = ClockRig()
    rig.clock.transition(rig.view("curio"))  # not of the stretch
    assert rig.timers == []
    rig.clock.transition(rig.view("warmup"))  # no clock known yet: looked at again
    assert len(rig.timers) == 1 and rig.production.failed == []
    rig.link.clocks[BENCH_CLOCK] = (rig.now, "the fetch's end (param-done)")
    rig.run_timers(rig.now + BENCH_CLOCK_CHECK_S)
    rig.clock.transition(rig.view("warmup", PhaseState.DONE))  # the warm-up ended: its looks stop
    rig.run_timers(rig.now + 3000.0)
    assert rig.production.failed == [] and rig.timers == []
    rig.clock.transition(rig.view("bench"))
    [(name, reason, detail)] = rig.production.failed
    assert (name, reason) == ("bench", "too_slow") and "the fetch's end (param-done)" in detail


def test_a_row_whose_min_rate_differs_judges_the_bench(sup: Runner, manager: DevManager) -> None:
    # The label was first registered with min_rate 100: the manager keeps it, whatever this start sends.
    first = requests.post(manager.url + "/register", json={"label": "C.5150", "min_rate": 100}, timeout=5).json()
    config = fleet_config(sup, manager.url, "C.5150", ZERO_RATE_BENCH, service_s=1, bench_after_s=0.5)
    started = time.monotonic()
    result = sup.run(config, timeout=WAIT_S)
    assert time.monotonic() - started < WAIT_S
    assert result.returncode == EXIT_BENCH_REJECTED, result.output
    out = result.output
    assert ("manager: its row's min_rate 100/h differs from this instance's 1/h ($MIN_RATE or [manager] min_rate): "
            "the manager judges the bench by its own") in out, out
    assert "the manager rejected the benchmark (rate 0/h < min_rate 100)" in out, out
    rows: list[dict[str, Any]] = requests.get(manager.url + "/status", timeout=5).json()
    assert [(r["uuid"], r["min_rate"], r["state"]) for r in rows] == [(first["uuid"], 100.0, "killed")]


def test_the_clock_judges_as_soon_as_the_param_done_is_delivered(sup: Runner, manager: DevManager) -> None:
    """The row is read right after the param-done is delivered: the clock hears params_done (and its
    param_done_at) then. It heard the row only at the next periodic read (row_check_s, 300 s by default), and the
    read at registration said ``registered``: a bench far past bench_deadline_s ran on unjudged, and passed."""
    cfg = fleet_config(sup, manager.url, "C.6060", BENCH_30_PER_H, bench_after_s=60)
    cfg.write_text(cfg.read_text().replace("[manager]\n", "[manager]\nbench_deadline_s = 1\n", 1))
    result = sup.run(cfg, timeout=WAIT_S + 60)
    assert result.returncode == EXIT_TIMEOUT, result.output
    out = result.output
    assert "phase=bench" in out and "reason=too_slow" in out, out
    assert "the manager's benchmark timeout passed" in out and "(bench_deadline_s=1 from the manager's " \
        "param_done_at" in out, out
    # The give-up the manager took: its row read after it says killed, and the bench clock no longer runs.
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())["manager"]
    assert snap["row"]["row"]["state"] == "killed" and snap["clocks"] == {}, snap


def test_the_clock_runs_only_while_the_row_is_in_params_done() -> None:
    rig = ClockRig()
    rig.link.clocks[BENCH_CLOCK] = (rig.now - 3 * 86400.0, "the fetch's end (param-done)")  # days into production
    rig.clock.heard_row(Row("u", "running"))  # restarted, benching again: the manager has no timeout for it
    rig.clock.transition(rig.view("warmup"))
    assert rig.production.failed == [] and len(rig.timers) == 1
    rig.clock.heard_row(Row("u", "params_done"))
    rig.run_timers(rig.now + BENCH_CLOCK_CHECK_S)
    assert [(n, r) for n, r, _ in rig.production.failed] == [("warmup", "too_slow")]


def test_a_param_done_still_undelivered_has_started_no_clock() -> None:
    """A start killed after its fetch while /param-done failed, restarted past bench_deadline_s: before this
    start's first row read, the fetch's end is no anchor, since the manager's clock starts only with the param-done
    (its row is still registered). It used to fail the warm-up too_slow at once and give a healthy instance up."""
    rig = ClockRig()
    del rig.link.answers["param-done"]  # queued by the earlier start, still in the outbox
    rig.link.clocks[BENCH_CLOCK] = (rig.now - 2800.0, "the fetch's end (param-done)")
    rig.clock.transition(rig.view("warmup"))
    rig.run_timers(rig.now + BENCH_CLOCK_CHECK_S)
    assert rig.production.failed == [] and len(rig.timers) == 1
    rig.clock.heard_row(Row("u", "registered"))  # this start's first row read: the manager's clock has not started
    rig.link.answers["param-done"] = {"ok": True}  # delivered: the row moves on, but is read as registered yet
    rig.run_timers(rig.now + BENCH_CLOCK_CHECK_S)
    assert rig.production.failed == []
    rig.link.clocks[BENCH_CLOCK] = (rig.now - 2800.0, "the manager's param_done_at")  # a row that says so
    rig.clock.heard_row(Row("u", "params_done"))
    rig.run_timers(rig.now + BENCH_CLOCK_CHECK_S)
    assert [(n, r) for n, r, _ in rig.production.failed] == [("warmup", "too_slow")]


def test_without_a_row_the_clock_stops_once_a_bench_done_passed() -> None:
    rig = ClockRig()
    rig.link.clocks[BENCH_CLOCK] = (rig.now - 3 * 86400.0, "the fetch's end (param-done)")
    rig.link.answers["bench-done"] = {"passed": True}  # delivered before this restart: the row moved on
    rig.clock.transition(rig.view("bench"))
    assert rig.production.failed == []
    rig.link.answers["bench-done"] = None
    rig.run_timers(rig.now + BENCH_CLOCK_CHECK_S)
    assert [(n, r) for n, r, _ in rig.production.failed] == [("bench", "too_slow")]


class _Kills:
    """The manager's view as the sender tells it (view.py): the kills it hears as the manager's own."""

    def __init__(self) -> None:
        self.heard: list[Row] = []

    def heard_row(self, reading: RowReading) -> None:
        pass

    def heard_kill(self, row: Row) -> None:
        self.heard.append(row)

    def registered_again(self, old: str, new: str) -> None:
        pass


class _FleetSender:
    """A real Sender speaking the fleet protocol's bench-done (its loop, outbox and client) to a dev-manager of its
    own: ``answered`` the gate's word on each bench-done answered, ``lines`` what the sender said, ``kills`` the
    kills its view heard. ``passed: false`` retires the instance, as the fleet protocol does (ManagerLink.retire)."""

    def __init__(self, tmp_path: Path, label: str, read_timeout_s: float, row_check_s: float = 300.0) -> None:
        self.mgr = dev_manager(port=0, quiet=True).start()
        spec = ManagerSpec(url=self.mgr.url, label=label, connect_timeout_s=2.0, read_timeout_s=read_timeout_s,
                           row_check_s=row_check_s)
        self.loop, self.outbox, self.lines = EventLoop(), Outbox(tmp_path / "outbox.sqlite3"), []
        self.answered: list[bool] = []
        calls = CallKinds()
        calls.row = FLEET_ROW
        calls.add("bench-done", bench_done_call(SimpleNamespace(bench_done_reason=False),  # type: ignore[arg-type]
                                                answered=lambda passed, rate: self.answered.append(passed),
                                                refused=lambda: None, rejected=lambda why: self.sender.retire()))
        self.kills = _Kills()
        self.sender = Sender(spec, self.outbox, ManagerClient(spec), self.loop, self.lines.append, calls,
                             on_identity=lambda u, f: None, view=self.kills)

    def run_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        self.loop.run_until(lambda: done() or time.monotonic() > deadline, 0.02)
        assert done(), self.lines

    def registered(self) -> str:
        """Started and registered; its uuid."""
        self.sender.restore_identity()
        self.sender.start()
        self.run_until(lambda: self.sender.uuid is not None)
        assert self.sender.uuid is not None
        return self.sender.uuid

    def post(self, path: str, body: dict[str, Any]) -> None:
        requests.post(f"{self.mgr.url}{path}", json=body, timeout=5).raise_for_status()

    def queue(self, kind: str, payload: dict[str, Any]) -> None:
        self.outbox.add(kind, payload)
        self.sender.wake()

    def close(self) -> None:
        self.sender.ask_to_stop()
        self.sender.join(10)
        self.outbox.close()
        self.loop.close()
        self.mgr.stop()


def test_a_bench_done_retried_through_an_outage_does_not_un_kill_a_row_killed_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The row was read once, before the first attempt; the retries went on for minutes through the outage. The
    # manager's monitor killed the row meanwhile ("benchmark timeout (45min)"), and the bench-done that got
    # through at last moved it from killed back to bench_done (the route has no state check): a machine being
    # destroyed went to production. Each retry reads the row first.
    monkeypatch.setattr(client_mod, "RETRY_INITIAL_S", 0.05)
    monkeypatch.setattr(client_mod, "RETRY_MAX_S", 0.2)
    monkeypatch.setattr(client_mod, "RETRY_JITTER_S", 0.01)
    fleet = _FleetSender(tmp_path, "C.unkill", read_timeout_s=2.0)
    lines, outbox = fleet.lines, fleet.outbox
    try:
        uuid = fleet.registered()
        fleet.post("/param-done", {"uuid": uuid})
        fleet.post("/dev/faults", {"status": 503, "path": "/bench-done"})
        fleet.queue("bench-done", {"rate": 61.5})
        fleet.run_until(lambda: any("bench-done not delivered" in line for line in lines))
        fleet.post("/dev/row", {"uuid": uuid, "state": "killed", "kill_reason": "benchmark timeout (45min)"})
        fleet.post("/dev/faults", {})  # the outage ends
        fleet.run_until(lambda: not outbox.pending())
        (row,) = fleet.mgr.state.snapshot()["instances"].values()
        assert row["state"] == "killed" and row["kill_reason"] == "benchmark timeout (45min)", row
        assert [(c["kind"], c["state"]) for c in outbox.history()][-1] == ("bench-done", "failed")
        fleet.run_until(lambda: any("bench-done not sent: the manager killed this instance" in line for line in lines))
        assert fleet.answered == []
    finally:
        fleet.close()


def test_a_kill_that_lands_while_bench_done_is_in_flight_sends_no_running(tmp_path: Path) -> None:
    # The row was read just before bench-done (not killed); the manager killed it while bench-done's answer was on
    # its way (its UI, or the 45-minute monitor pass, up to a minute late); bench-done then moved the row back to
    # bench_done, killed_at and kill_reason kept. The row is killed by those fields whatever its state: the next
    # read before /running learns the kill, and /running (which would succeed) never goes out.
    fleet = _FleetSender(tmp_path, "C.inflight", read_timeout_s=5.0)
    mgr, outbox = fleet.mgr, fleet.outbox

    def reads() -> int:
        return len(mgr.state.snapshot()["reads"])

    try:
        uuid = fleet.registered()
        fleet.post("/param-done", {"uuid": uuid})
        fleet.post("/dev/faults", {"path": "/bench-done", "count": 1, "delay_s": 2.0})
        before = reads()
        fleet.queue("bench-done", {"rate": 61.5})
        fleet.run_until(lambda: reads() > before)  # the row read before the call: not killed
        time.sleep(0.5)  # bench-done on its way, its answer 2 s off
        fleet.post("/api/kill", {"uuid": uuid, "vast_id": 4711})
        fleet.run_until(lambda: fleet.answered == [True])
        (row,) = mgr.state.snapshot()["instances"].values()
        assert row["state"] == "bench_done" and row["kill_reason"] == "manually killed via UI", row  # un-killed
        fleet.queue("running", {})
        fleet.run_until(lambda: not outbox.pending())
        assert [(c["kind"], c["state"]) for c in outbox.history()][-1] == ("running", "failed")
        assert "/running" not in [c["path"] for c in mgr.state.snapshot()["calls"]]
        assert fleet.sender.killed is not None and fleet.sender.killed.kill_reason == "manually killed via UI"
        fleet.run_until(lambda: any(line.startswith("manager: running not sent: the manager killed this instance at ")
                                    and line.endswith(": manually killed via UI (its row moved to bench_done after "
                                                      "the kill)") for line in fleet.lines))
    finally:
        fleet.close()


def test_the_kill_a_passed_false_meant_is_not_told_as_the_managers_own(tmp_path: Path) -> None:
    # bench-done below min_rate: the manager kills the row on it, and the fleet protocol retires the instance when
    # its answer is heard on the loop (exit 69, the rejection). The row read right after the answer, on the sender's
    # thread, says killed: that kill is the answer's consequence, never the manager's own (exit 80), however the
    # two threads interleave. Here the loop does not run until that read is done: the kill was told, the retire
    # not yet heard when the sender's thread decided.
    fleet = _FleetSender(tmp_path, "C.rejected", read_timeout_s=5.0)
    mgr = fleet.mgr

    def reads() -> int:
        return len(mgr.state.snapshot()["reads"])

    try:
        uuid = fleet.registered()
        fleet.post("/param-done", {"uuid": uuid})
        before = reads()
        fleet.queue("bench-done", {"rate": 0.5})  # (the row's min_rate is the manager's 50)
        wait_for(lambda: reads() >= before + 2 and fleet.sender.killed is not None, 20)  # before it, after it
        seen: list[bool] = []
        fleet.loop.call_soon_threadsafe(lambda: seen.append(True))  # (after what the sender handed over)
        fleet.run_until(lambda: bool(seen))
        assert fleet.answered == [False]
        killed = fleet.sender.killed
        assert killed is not None and killed.kill_reason == "bench_rate 0.5 below min_rate 50.0", killed
        assert fleet.kills.heard == [], fleet.kills.heard
    finally:
        fleet.close()


def test_a_call_queued_while_a_forgotten_uuid_is_looked_up_stands_alone_under_the_new_one(tmp_path: Path) -> None:
    # The periodic read finds the row gone (the manager's database reset) and asks /runner-id; meanwhile production
    # comes up and queues running. The label is registered again; the last call delivered (bench-done) was sent
    # again after running, and moved the new row from running back to bench_done (taken in any state). The later
    # call stands alone under the new uuid, as after a 404 on it.
    fleet = _FleetSender(tmp_path, "C.forgotten", read_timeout_s=5.0, row_check_s=5.0)
    mgr = fleet.mgr

    def reads() -> int:
        return len(mgr.state.snapshot()["reads"])

    try:
        uuid = fleet.registered()
        fleet.post("/param-done", {"uuid": uuid})
        fleet.queue("bench-done", {"rate": 61.5})
        fleet.run_until(lambda: fleet.answered == [True])
        fleet.post("/dev/forget", {"uuid": uuid})
        fleet.post("/dev/faults", {"path": "/runner-id", "count": 1, "delay_s": 2.0})
        before = reads()
        fleet.run_until(lambda: reads() > before)  # the periodic read: not listed; /runner-id asked, 2 s to answer
        fleet.queue("running", {})
        fleet.run_until(lambda: not fleet.outbox.pending() and fleet.sender.uuid not in (None, uuid))
        row = mgr.state.snapshot()["instances"][fleet.sender.uuid]
        assert row["history"] == ["registered", "running"], row["history"]
        fleet.run_until(lambda: any("registering again" in line for line in fleet.lines))
        said = next(line for line in fleet.lines if "registering again" in line)
        assert "bench-done sent again" not in said, said
    finally:
        fleet.close()


def test_a_rows_min_rate_of_0_or_less_is_the_managers_50() -> None:
    # shared/domain/manager-api.md: "min_rate <= 0 means 50": a row holding 0 is judged by 50, so the cut and the gate
    # judge so.
    assert row_min_rate(Row("u", "registered", extra={"min_rate": 0.0})) == 50.0
    assert row_min_rate(Row("u", "registered", extra={"min_rate": 12.5})) == 12.5
    assert row_min_rate(Row("u", "registered")) is None
