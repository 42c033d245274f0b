"""The setup tab reads in the order things happened, whichever road a line took (docs/manager.md, Logs).

A failure's verdict goes by the outbox (durable), the lines logged after it by the log shipper; each backs
off on its own while the manager is away, and whichever tried first once it was back used to win: lines
logged after the failure came before it. Now the shipper holds a source while the outbox has a durable push
of it pending. Real Reporter (its Sender, Outbox and Shipper), the real dev-manager on 127.0.0.1 and its
faults; the supervisor's own log reaches the shipper the way the app's does (EarlyLines).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from supervisor.app.cli import dev_manager
from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager
from supervisor.engine.exitflush import ExitFlush
from supervisor.engine.loop import EventLoop
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.states import PhaseState
from supervisor.manager.logship import EarlyLines
from supervisor.manager.reporting import Reporter
from supervisor.manager.sender import Sender
from supervisor.state import files as state_files
from supervisor.text.redact import Redactor

WAIT_S = 30.0  # an upper bound against hanging, never a measure
FAILED = "prover-supervisor: FAILED: phase=bench reason=oom_killed"
MARKS = ("before the failure", "FAILED", "after the failure", "exiting with status", "not delivered yet",
         "second start")


@pytest.fixture
def manager() -> Iterator[DevManager]:
    mgr = dev_manager(port=0, quiet=True).start()
    yield mgr
    mgr.stop()


class Supervisor:
    """A Reporter as the app makes one: its own log tapped into the shipper's ``setup`` (EarlyLines)."""

    def __init__(self, manager: DevManager, state_dir: Path, read_timeout_s: float = 5.0) -> None:
        self.loop = EventLoop()
        self.said: list[str] = []
        early = EarlyLines()
        spec = ManagerSpec(url=manager.url, label="C.5150", connect_timeout_s=2.0, read_timeout_s=read_timeout_s,
                           log_push_interval_s=0.2)
        self.reporter = Reporter(spec, state_dir, self.loop, lambda line: self.log(line, early), lambda k, v: None,
                                 Redactor(), early)
        self.reporter.start()

    def log(self, line: str, early: EarlyLines) -> None:
        self.said.append(line)
        early.tap(line)

    def run_until(self, done: Callable[[], object], what: str) -> None:
        """Run the loop (the sender's answers are taken in there) until ``done()``."""
        deadline = time.monotonic() + WAIT_S
        self.loop.run_until(lambda: bool(done()) or time.monotonic() > deadline, 0.02)
        assert done(), f"{what}: not within {WAIT_S:g}s; the supervisor said: {self.said[-10:]}"

    def drained(self) -> bool:
        outbox = self.reporter.outbox
        return outbox is not None and outbox.pending() == 0 and not self.reporter.status()["log_backlog"]

    def stop(self, status: int, why: str) -> None:
        def wait(flush: ExitFlush, until: Callable[[], bool]) -> None:
            self.loop.run_until(until, 0.02)

        self.reporter.stop(status, why, wait)


def faults(manager: DevManager, body: dict[str, object]) -> None:
    assert requests.post(manager.url + "/dev/faults", json=body, timeout=5).status_code == 200


def setup_tab(manager: DevManager, uuid: str | None) -> list[str]:
    """The marked lines of the instance's setup tab, in the order the manager got them."""
    text = manager.state.snapshot()["logs"].get(uuid or "", {}).get("setup", "")
    return [line for line in text.splitlines() if any(mark in line for mark in MARKS)]


def refused_pushes(manager: DevManager) -> int:
    return sum(1 for c in manager.state.snapshot()["calls"] if c["path"] == "/api/log-push" and c["status"] == 503)


def taken_pushes(manager: DevManager) -> int:
    return sum(1 for c in manager.state.snapshot()["calls"] if c["path"] == "/api/log-push" and c["status"] == 204)


def registered(manager: DevManager, tmp_path: Path, read_timeout_s: float = 5.0) -> Supervisor:
    """A supervisor the manager knows, whose first own line is in its setup tab, and whose shipper has heard
    every answer: a push still in flight when the failure is pushed would be taken into the outbox too, and be
    sent twice (docs/manager.md: twice rather than out of order), which is not what these tests are about."""
    sup = Supervisor(manager, tmp_path, read_timeout_s)
    sup.run_until(lambda: sup.reporter.uuid, "registered")
    sup.reporter.ship_own_line("before the failure")
    logs = sup.reporter._logs  # (its count of pushes taken: no other way to see that none is in flight)
    assert logs is not None
    sup.run_until(lambda: setup_tab(manager, sup.reporter.uuid) and logs.pushed == taken_pushes(manager),
                  "the first line shipped")
    return sup


def failed_while_the_manager_refuses_pushes(manager: DevManager, tmp_path: Path) -> tuple[Supervisor, str | None]:
    """A registered supervisor whose failure's push the manager refused (it refuses every log push from now on),
    and its uuid."""
    sup = registered(manager, tmp_path)
    faults(manager, {"path": "/api/log-push", "status": 503})
    sup.reporter.push_text("setup", FAILED)
    sup.run_until(lambda: refused_pushes(manager), "the failure's push refused")
    return sup, sup.reporter.uuid


def test_lines_logged_after_a_failure_wait_behind_its_durable_push_the_manager_asked_to_wait(
        manager: DevManager, tmp_path: Path) -> None:
    # The failure's push is refused with Retry-After 3 (the outbox waits that long); the shipper, never refused,
    # would push the lines logged meanwhile at its next interval, ahead of the failure: they wait instead.
    sup = registered(manager, tmp_path)
    faults(manager, {"path": "/api/log-push", "status": 503, "retry_after": 3, "count": 1})
    sup.reporter.push_text("setup", FAILED)
    sup.run_until(lambda: refused_pushes(manager), "the failure's push refused")
    for k in range(3):
        sup.reporter.ship_own_line(f"after the failure, {k}")
    sup.run_until(lambda: len(setup_tab(manager, sup.reporter.uuid)) >= 5 and sup.drained(), "everything shipped")
    assert setup_tab(manager, sup.reporter.uuid) == [
        "[supervisor] before the failure", FAILED, *(f"[supervisor] after the failure, {k}" for k in range(3))]
    sup.stop(0, "test over")


def test_lines_still_held_at_the_exit_go_behind_it_into_the_outbox_and_the_next_start_delivers_them_in_order(
        manager: DevManager, tmp_path: Path) -> None:
    # The manager refuses every log push until the supervisor has exited: the failure, the lines after it and
    # the exit's own lines (said after its "exiting" push) stay in the outbox, in that order; the next start
    # delivers them before its own lines.
    sup, uuid = failed_while_the_manager_refuses_pushes(manager, tmp_path)
    for k in range(3):
        sup.reporter.ship_own_line(f"after the failure, {k}")
    sup.stop(1, "test failure")
    assert any("not delivered yet" in line for line in sup.said)
    faults(manager, {})
    again = Supervisor(manager, tmp_path)
    again.reporter.ship_own_line("second start")
    again.run_until(lambda: again.drained() and any("second start" in line for line in setup_tab(manager, uuid)),
                    "the next start delivered everything")
    tab = setup_tab(manager, uuid)
    assert tab == [
        "[supervisor] before the failure", FAILED, *(f"[supervisor] after the failure, {k}" for k in range(3)),
        "prover-supervisor exiting with status 1: test failure", tab[6], "[supervisor] second start"], tab
    assert "not delivered yet" in tab[6]
    again.stop(0, "test over")


def started_again_without_the_outboxs_thread(manager: DevManager, tmp_path: Path,
                                             patched: pytest.MonkeyPatch) -> tuple[str | None, Supervisor]:
    """A registered start, over; then the next start of its state_dir, whose outbox sender could not start its
    thread (pids.max): the earlier start's uuid, and the new start."""
    first = registered(manager, tmp_path)
    uuid = first.reporter.uuid
    first.stop(0, "first start over")

    def cannot_start(self: object) -> None:
        raise RuntimeError("can't start new thread")

    patched.setattr(Sender, "start", cannot_start)
    return uuid, Supervisor(manager, tmp_path)


def test_without_the_outboxs_thread_a_source_is_not_held_behind_what_never_goes(
        manager: DevManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A start whose outbox sender could not start its thread (pids.max): its durable pushes stay pending for the
    # whole run, and the source they hold would hold every later line with them. Its uuid is the earlier start's.
    uuid, again = started_again_without_the_outboxs_thread(manager, tmp_path, monkeypatch)
    assert any("cannot start the thread of the outbox's sender" in line for line in again.said), again.said
    again.reporter.push_text("setup", FAILED)
    again.reporter.ship_own_line("after the failure, 0")
    again.run_until(lambda: "[supervisor] after the failure, 0" in setup_tab(manager, uuid), "the later line shipped")
    assert FAILED not in setup_tab(manager, uuid)  # (it waits in the outbox for a start that can send it)
    again.stop(1, "test over")


def test_without_the_outboxs_thread_the_lines_before_a_failure_are_shipped_not_left_behind_later_numbers(
        manager: DevManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Moved into the outbox with their numbers, they waited there for the next start while the shipper pushed
    # higher numbers of the same run: a manager keeping the highest number seen (as docs/manager.md says it may)
    # then dropped them whole. With no sender to hold the source, the shipper keeps them and ships them in order.
    with monkeypatch.context() as patched:
        uuid, again = started_again_without_the_outboxs_thread(manager, tmp_path, patched)
        faults(manager, {"path": "/api/log-push", "status": 503, "count": 1})
        refused = refused_pushes(manager)
        for k in range(3):
            again.reporter.ship_own_line(f"before the failure {k}")
        again.run_until(lambda: refused_pushes(manager) > refused, "the shipper's push refused")
        again.reporter.push_text("setup", FAILED)
        again.reporter.ship_own_line("after the failure, 0")
        again.run_until(lambda: "[supervisor] after the failure, 0" in setup_tab(manager, uuid), "the later line")
        again.stop(1, "test over")
    third = Supervisor(manager, tmp_path)
    third.run_until(third.drained, "the outbox delivered")
    third.stop(0, "over")
    tab = setup_tab(manager, uuid)
    assert FAILED in "\n".join(tab), tab
    before = [line for line in tab if "before the failure " in line]
    assert before == [f"[supervisor] before the failure {k}" for k in range(3)], tab
    assert tab.index(before[-1]) < tab.index("[supervisor] after the failure, 0"), tab


def test_a_durable_push_an_earlier_start_left_pending_holds_the_next_starts_lines_behind_it(
        manager: DevManager, tmp_path: Path) -> None:
    # The failure's push is still in the outbox when the supervisor exits; the next start's sender sends it first,
    # and the manager asks it to wait (Retry-After 3): the lines the new start logs meanwhile wait behind it, as
    # they would behind a durable push of its own.
    sup, uuid = failed_while_the_manager_refuses_pushes(manager, tmp_path)
    sup.stop(1, "test failure")
    faults(manager, {"path": "/api/log-push", "status": 503, "retry_after": 3, "count": 1})
    refused = refused_pushes(manager)
    again = Supervisor(manager, tmp_path)
    again.run_until(lambda: refused_pushes(manager) > refused, "the pending failure's push refused once more")
    again.reporter.ship_own_line("second start")
    again.run_until(lambda: again.drained() and any("second start" in line for line in setup_tab(manager, uuid)),
                    "the next start delivered everything")
    tab = setup_tab(manager, uuid)
    assert tab.index(FAILED) < tab.index("[supervisor] second start"), tab
    again.stop(0, "test over")


def test_a_service_restarted_and_up_again_reports_running_once_a_start(manager: DevManager, tmp_path: Path) -> None:
    # ``running`` says the instance reached production: a restarted service coming up again (or any later move
    # of it while up) is no new report, and the manager's row is not moved again.
    sup = registered(manager, tmp_path)
    spec = SimpleNamespace(kind="service", report="running")
    for attempt in (1, 1, 2):  # up; a move with no change (a kept daemon died); up again after a restart
        sup.reporter.phase_changed(SimpleNamespace(name="serve", spec=spec, state=PhaseState.RUNNING, why="",
                                                   attempt=attempt, up=True, was_up=True, parsed=None))
    outbox = sup.reporter.outbox
    assert outbox is not None
    assert [h["kind"] for h in outbox.history(without="log")].count("running") == 1
    sup.stop(0, "test over")


def test_a_stopped_childs_verdict_is_no_failure_pushed_to_the_manager(manager: DevManager, tmp_path: Path) -> None:
    # A shutdown stops every child on purpose: their verdicts (``stopped``) are recorded, never pushed as FAILED.
    sup = registered(manager, tmp_path)
    sup.reporter.verdict(v.without_exit("serve", "serve", v.STOPPED, 0, "supervisor shutdown", attempt=1))
    sup.reporter.verdict(v.without_exit("bench", "bench", v.OOM_KILLED, 137, "killed by the OOM killer", attempt=1))
    outbox = sup.reporter.outbox
    assert outbox is not None
    pushed_texts = [json.loads(h["payload"])["text"] for h in outbox.history() if h["kind"] == "log"]
    assert [t for t in pushed_texts if "FAILED" in t] == [next(t for t in pushed_texts if "oom_killed" in t)]
    assert not any("reason=stopped" in t for t in pushed_texts), pushed_texts
    sup.stop(0, "test over")


def test_queued_lines_moved_into_a_failures_push_keep_their_numbers_and_a_repeat_of_it_is_kept_once(
        manager: DevManager, tmp_path: Path) -> None:
    # The lines the shipper still had (its push refused) go into the outbox ahead of the failure. That push is
    # answered after the read timeout, so the outbox sends it again, though the manager stores it: the lines
    # carry their X-Log-Seq numbers there too, and a manager that reads them keeps each once (a slow manager
    # stored one block of them 7 times in a 30-minute soak).
    sup = registered(manager, tmp_path, read_timeout_s=2.0)
    uuid = sup.reporter.uuid
    # (Retry-After: the shipper must not push them again itself before the failure takes them)
    faults(manager, {"path": "/api/log-push", "status": 503, "retry_after": 30, "count": 1})
    moved = [f"before the failure {k}" for k in range(5)]
    for line in moved:
        sup.reporter.ship_own_line(line)
    sup.run_until(lambda: refused_pushes(manager), "the shipper's push refused")
    faults(manager, {"path": "/api/log-push", "delay_s": 3.0, "count": 1})  # past the 2 s read timeout
    sup.reporter.push_text("setup", FAILED)

    def carried_twice() -> bool:  # (the late answer's call is noted once its delay is over)
        calls = manager.state.snapshot()["calls"]
        return sum(moved[0] in c.get("head", "") for c in calls if c["path"] == "/api/log-push") == 2

    sup.run_until(lambda: sup.drained() and carried_twice(), "the moved lines' push stored, then sent again")
    dropped = manager.state.snapshot()["log_seq"]["duplicate_lines"]
    sup.stop(1, "test over")
    tab = setup_tab(manager, uuid)
    assert [line.split("] ", 1)[-1] for line in tab if "before the failure " in line] == moved, tab
    failed_at = [i for i, line in enumerate(tab) if FAILED in line]
    assert len(failed_at) == 1 and failed_at[0] > max(i for i, line in enumerate(tab) if moved[-1] in line), tab
    assert dropped >= len(moved), "kept once for their numbers"  # (more: a push of its own that timed out too)


def test_lines_of_a_source_not_held_left_at_the_exit_are_said_lost(manager: DevManager, tmp_path: Path) -> None:
    # The manager refuses every log push: the failure's push holds setup (its lines go into the outbox at the
    # exit), but a child's source that nothing held keeps its lines in the shipper, which ends with the exit.
    # They were thrown away without a word, and the count of calls left out the held lines moved in after it.
    sup, _ = failed_while_the_manager_refuses_pushes(manager, tmp_path)
    sup.reporter.ship_lines("cuzk", "bench/cuzk-daemon", [b"proving 1", b"proving 2", b"proving 3"])
    sup.reporter.ship_own_line("after the failure, 0")
    sup.stop(1, "test failure")
    lost = [line for line in sup.said if "not delivered at the exit" in line]
    assert len(lost) == 1 and lost[0].startswith("log shipping: 3 line(s) of 'cuzk' ("), sup.said
    [counted] = [line for line in sup.said if "not delivered yet" in line]
    said = int(counted.split("manager: ")[1].split(" ")[0])
    with sqlite3.connect(f"file:{state_files.path(tmp_path, state_files.OUTBOX)}?mode=ro", uri=True) as db:
        pending = db.execute("SELECT COUNT(*) FROM calls WHERE state = 'pending'").fetchone()[0]
    # Every call pending but the push that carries the count's own line and the loss's (moved in after them).
    assert said == pending - 1 and said >= 3, (counted, pending)
