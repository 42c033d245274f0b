"""The exit reports while the loop still runs (issue 14, class 5).

Real supervisors against the dev-manager on 127.0.0.1: a give-up whose first ``/bench-done`` gets
a 500 is still delivered; the manager going away and coming back during the give-up flush; a
SIGTERM during the flush (as PID 1 too) leaves the manager a short window and the exit status
stays the lifecycle's; a second one ends it. The flush's own rules (deadline, stall, cut) are
pure and tested in-process, as is the loop refusing a thread's answer once closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import (
    PY,
    REPO,
    Runner,
    clean_env,
    needs_unshare,
    outbox_rows,
    pushed,
    read,
    sh,
    supervisor_pid,
    toml_str,
    wait_for,
)

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.engine.exitflush import (
    EXIT_FLUSH_S,
    EXIT_STALL_S,
    FINISH_MIN_S,
    FLUSH_AFTER_TERM_S,
    GIVE_UP_FLUSH_S,
    ExitFlush,
)
from supervisor.engine.loop import EventLoop
from supervisor.engine.stopbudget import CLOSE_S
from supervisor.manager.sender import FLUSH_RETRY_MAX_S

NO_EBADF = "Bad file descriptor"


@pytest.fixture
def managers() -> Iterator[list[DevManager]]:
    """Dev-managers started by the test (quiet), all stopped at its end."""
    started: list[DevManager] = []
    yield started
    for mgr in started:
        mgr.stop()


def start_manager(managers: list[DevManager]) -> DevManager:
    mgr = dev_manager(port=0, quiet=True).start()
    managers.append(mgr)
    return mgr


class Outage:
    """The manager's address as the supervisor sees it: a TCP relay to the dev-manager that can go away
    (its port refuses connections, every open one is cut: keep-alive connections too) and come back on
    the same port. (Stopping a dev-manager closes its listener, but not the connections it serves.)"""

    def __init__(self, backend: DevManager) -> None:
        self._backend = ("127.0.0.1", backend.port)
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return listener

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection(self._backend, timeout=10)
            except OSError:
                return  # the listener was closed: the manager is away
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # (close alone does not wake the thread blocked in accept)
        self._listener.close()
        with self._lock:
            cut, self._open = self._open, []
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def up(self) -> None:
        self._listener = self._listen(self.port)


@pytest.fixture
def outage(managers: list[DevManager]) -> Iterator[Outage]:
    relay = Outage(start_manager(managers))
    yield relay
    relay.down()


def give_up_config(sup: Runner, mgr: DevManager | Outage, gate: Path | None = None) -> Path:
    """One phase that fails with 4 (after ``gate`` exists): before production, so the instance is given up."""
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done; " if gate else ""
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "C.flush"
        min_rate = 1

        [[phases]]
        name = "fetch"
        command = {sh(wait + "echo fetch failing; exit 4")}
        report = "param-done"
        """)


def instance(mgr: DevManager) -> dict[str, Any]:
    [inst] = mgr.state.snapshot()["instances"].values()
    return inst


class Watched:
    """A supervisor whose console goes to a file, watched while it runs."""

    def __init__(self, sup: Runner, config: Path, pid1: bool = False) -> None:
        self.path = sup.tmp / "console.txt"
        with open(self.path, "wb") as out:
            self.proc = subprocess.Popen(sup.argv(config, pid1=pid1), stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(), cwd=REPO, start_new_session=True)
        sup.procs.append(self.proc)  # type: ignore[arg-type]
        self.pid = supervisor_pid(self.proc, pid1)

    def text(self) -> str:
        return read(self.path)

    def wait_text(self, needle: str, timeout: float = 30) -> None:
        wait_for(lambda: needle in self.text() or self.proc.poll() is not None, timeout, 0.02)
        assert needle in self.text(), f"no {needle!r}; console:\n{self.text()[-4000:]}"

    def finish(self, timeout: float = 90) -> int:
        return self.proc.wait(timeout)


# ---------------------------------------------------------------- the sender keeps delivering during the flush


def test_a_give_up_whose_first_bench_done_gets_a_500_is_still_delivered(sup: Runner,
                                                                        managers: list[DevManager]) -> None:
    mgr = start_manager(managers)
    fault = {"status": 500, "count": 1, "path": "/bench-done"}
    assert requests.post(mgr.url + "/dev/faults", json=fault, timeout=5).status_code == 200
    result = sup.run(give_up_config(sup, mgr), timeout=90)
    out = result.output
    assert result.returncode == 4, out
    assert "manager: bench-done not delivered (POST /bench-done: HTTP 500" in out  # the retry was said, in the loop
    assert instance(mgr)["history"] == ["registered", "killed"], out
    assert [c["status"] for c in mgr.state.snapshot()["calls"] if c["path"] == "/bench-done"] == [500, 200]
    assert NO_EBADF not in out and "Traceback" not in out, out


def test_the_manager_away_and_back_during_the_give_up_flush(sup: Runner, managers: list[DevManager],
                                                            outage: Outage) -> None:
    gate, mgr = sup.tmp / "fail-now", managers[0]
    run = Watched(sup, give_up_config(sup, outage, gate))
    wait_for(lambda: mgr.state.snapshot()["instances"], timeout=30)  # registered while the manager was there
    outage.down()
    gate.touch()
    run.wait_text("manager: waiting up to 60s for the give-up to be delivered")
    run.wait_text("not delivered (")  # the sender retries, with the loop still taking its lines
    # Meanwhile the status socket answers: the lifecycle is over, the supervisor is exiting.
    shown = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                           capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env())
    snap = json.loads(shown.stdout)
    assert shown.returncode == 0 and snap["live"], shown.stdout + shown.stderr
    assert snap["lifecycle"]["state"] == "stopped" and snap["exiting"]["status"] == 4, snap["exiting"]
    assert snap["exiting"]["giving_up"] is True
    text = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env()).stdout
    assert re.search(r"; exit 4; the exit waits up to \d+s more for the give-up to be delivered "
                     r"\(\d+ call\(s\) pending\)$", text.splitlines()[0]), text  # (the text said nothing of it)
    outage.up()
    assert run.finish() == 4, run.text()
    assert instance(mgr)["history"] == ["registered", "killed"], run.text()
    saved = json.loads((sup.state_dir / "status.json").read_text())
    assert "exiting" not in saved, saved["exiting"]  # the wait is over: the last state written says no more of it
    assert NO_EBADF not in run.text() and "Traceback" not in run.text(), run.text()
    assert not [row for row in outbox_rows(sup) if row[2] == "pending"], outbox_rows(sup)


def test_a_manager_back_late_in_the_give_up_flush_still_hears_the_give_up(sup: Runner,
                                                                         managers: list[DevManager]) -> None:
    """The manager answers 503 from the give-up's first try, and again at 60 % of the flush's 60 s. The retries
    backed off to 30 s: tried at about 0, 1, 3, 7, 15 and 31 s, the next would have been at 61 s, and a manager back
    in the flush's last ~half heard nothing (the row stayed registered until its timeout). Once the flush has
    begun a retry waits at most FLUSH_RETRY_MAX_S."""
    mgr = start_manager(managers)
    gate = sup.tmp / "fail-now"
    run = Watched(sup, give_up_config(sup, mgr, gate))
    wait_for(lambda: mgr.state.snapshot()["instances"], timeout=30)
    assert requests.post(mgr.url + "/dev/faults", json={"status": 503}, timeout=5).status_code == 200
    gate.touch()
    run.wait_text("manager: waiting up to 60s for the give-up to be delivered")
    time.sleep(GIVE_UP_FLUSH_S * 0.6)
    assert requests.post(mgr.url + "/dev/faults", json={}, timeout=5).status_code == 200
    back = time.time()
    assert run.finish() == 4, run.text()
    assert instance(mgr)["history"] == ["registered", "killed"], run.text()
    [heard] = [c["time"] for c in mgr.state.snapshot()["calls"] if c["path"] == "/bench-done" and c["status"] == 200]
    assert heard - back < FLUSH_RETRY_MAX_S + 5, "the give-up waited out a long backoff"  # (+ the calls before it)
    assert not [row for row in outbox_rows(sup) if row[2] == "pending"], outbox_rows(sup)


def test_the_flush_sends_at_once_a_call_waiting_out_its_retry(sup: Runner, managers: list[DevManager]) -> None:
    """The register waits out a pause (a Retry-After of 100 s here; the backoff alone grows to 30 s over an outage)
    and the manager answers again. The flush's 10 s went by while the sender slept: nothing delivered, the
    failure's reason and the exiting line left in the outbox. Now the flush's start sends the call at once."""
    mgr = start_manager(managers)
    fault = {"status": 503, "retry_after": 100, "count": 1, "path": "/register"}
    assert requests.post(mgr.url + "/dev/faults", json=fault, timeout=5).status_code == 200
    gate = sup.tmp / "fail-now"
    run = Watched(sup, sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "C.hurry"
        give_up_on_failure = false

        [[phases]]
        name = "work"
        command = {sh(f"while [ ! -e {gate} ]; do sleep 0.05; done; echo 'ERROR: disk exploded'; exit 3")}
        """))
    run.wait_text("manager: register not delivered (POST /register: HTTP 503")
    gate.touch()
    assert run.finish(60) == 3, run.text()
    out = run.text()
    assert "not delivered yet" not in out and not [row for row in outbox_rows(sup) if row[2] == "pending"], out
    setup = pushed(mgr)["setup"]
    assert "prover-supervisor: FAILED: phase=work" in setup and "  | ERROR: disk exploded" in setup, setup
    assert "prover-supervisor exiting with status 3" in setup, setup
    first, second = [call["time"] for call in mgr.state.snapshot()["calls"] if call["path"] == "/register"]
    assert second - first < 60, "the register waited out its pause"


# ---------------------------------------------------------------- a stop signal during the flush


@needs_unshare
def test_sigterm_during_the_give_up_flush_as_pid1_leaves_the_manager_a_few_seconds(
        sup: Runner, managers: list[DevManager], outage: Outage) -> None:
    """docker stop's SIGTERM during the 60 s give-up flush: a short window (SIGKILL follows in 10 s), in which the
    manager, back, gets the give-up; the exit status is the lifecycle's 4, not 143."""
    gate, mgr = sup.tmp / "fail-now", managers[0]
    run = Watched(sup, give_up_config(sup, outage, gate), pid1=True)
    wait_for(lambda: mgr.state.snapshot()["instances"], timeout=30)
    outage.down()
    gate.touch()
    run.wait_text("manager: waiting up to 60s for the give-up to be delivered")
    run.wait_text("; retry 1 in ")  # the first try failed: the next one comes within about a second
    os.kill(run.pid, signal.SIGTERM)
    run.wait_text(f"SIGTERM during the exit flush: giving the manager {FLUSH_AFTER_TERM_S:g}s more, "
                  "then exiting with status 4")
    outage.up()
    assert run.finish() == 4, run.text()
    assert instance(mgr)["history"] == ["registered", "killed"], run.text()
    assert "as pid1;" in run.text().splitlines()[0]
    assert NO_EBADF not in run.text() and "Traceback" not in run.text(), run.text()


def test_a_second_stop_signal_ends_the_flush_now_with_the_lifecycles_status(
        sup: Runner, managers: list[DevManager], outage: Outage) -> None:
    gate, mgr = sup.tmp / "fail-now", managers[0]
    run = Watched(sup, give_up_config(sup, outage, gate))
    wait_for(lambda: mgr.state.snapshot()["instances"], timeout=30)
    outage.down()  # and it stays away
    gate.touch()
    run.wait_text("manager: waiting up to 60s for the give-up to be delivered")
    os.kill(run.pid, signal.SIGTERM)
    run.wait_text("SIGTERM during the exit flush: giving the manager")
    os.kill(run.pid, signal.SIGINT)
    assert run.finish() == 4, run.text()
    out = run.text()
    assert "SIGINT again during the exit flush: exiting now with status 4" in out, out
    assert "call(s) not delivered yet; they stay in the outbox for the next start" in out
    pending = [kind for _, kind, state in outbox_rows(sup) if state == "pending"]
    assert "bench-done" in pending, pending  # the give-up waits for the next start
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


# ---------------------------------------------------------------- the flush's rules, in-process


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_flush_ends_when_the_outbox_is_empty() -> None:
    left = [3]
    flush = ExitFlush(lambda: left[0], lambda: True, 0, giving_up=False, clock=Clock())
    assert not flush.over()
    left[0] = 0
    assert flush.over()


def test_a_stalled_flush_gives_up_after_the_stall_but_a_give_up_waits_its_whole_window() -> None:
    clock, failures = Clock(), [0]
    plain = ExitFlush(lambda: 2, lambda: True, 0, giving_up=False, clock=clock, failures=lambda: failures[0])
    give_up = ExitFlush(lambda: 2, lambda: True, 4, giving_up=True, clock=clock, failures=lambda: failures[0])
    failures[0] += 1  # the manager is down: an attempt failed
    clock.now += EXIT_STALL_S + 0.1
    assert plain.over() and not give_up.over()
    clock.now += GIVE_UP_FLUSH_S
    assert give_up.over()


def test_once_the_call_waited_for_is_delivered_the_rest_waits_as_in_any_exit() -> None:
    # The give-up went (ahead of a log push whose route fails, manager/sender.py); the push kept failing, and
    # the exit waited out the give-up's whole window for it.
    clock, failures, waited = Clock(), [0], [True]
    flush = ExitFlush(lambda: 2, lambda: True, 4, giving_up=True, clock=clock, failures=lambda: failures[0],
                      waited_for=lambda: waited[0])
    failures[0] += 1
    clock.now += EXIT_STALL_S + 0.1
    assert not flush.over() and flush.giving_up, "the give-up is still waited for"
    waited[0] = False  # delivered
    assert not flush.over() and not flush.giving_up
    assert flush.deadline == clock.now + EXIT_FLUSH_S
    failures[0] += 1  # the push behind fails again
    clock.now += EXIT_STALL_S + 0.1
    assert flush.over(), "the stall rule holds again"


def test_a_slow_manager_that_fails_nothing_is_waited_for_until_the_deadline() -> None:
    # Each call answered in 2.5 s: no call went out for longer than the stall, but none failed either. The flush
    # gave up on it after EXIT_STALL_S, and the failure's reason lines stayed in the outbox.
    clock, left, failures = Clock(), [3], [0]
    flush = ExitFlush(lambda: left[0], lambda: True, 1, giving_up=False, clock=clock, failures=lambda: failures[0])
    clock.now += EXIT_STALL_S * 2
    assert not flush.over(), "slow is not down"
    left[0] -= 1
    assert not flush.over()  # a call went out
    failures[0] += 1  # then one fails: down after all
    clock.now += EXIT_STALL_S - 0.1
    assert not flush.over()
    clock.now += 0.2
    assert flush.over()
    slow = ExitFlush(lambda: 1, lambda: True, 1, giving_up=False, clock=clock, failures=lambda: failures[0])
    clock.now += EXIT_FLUSH_S - 0.1
    assert not slow.over()
    clock.now += 0.2
    assert slow.over(), "the deadline holds"


def test_progress_keeps_a_plain_flush_going_until_its_deadline() -> None:
    clock, left = Clock(), [100]
    flush = ExitFlush(lambda: left[0], lambda: True, 0, giving_up=False, clock=clock)
    while clock.now + EXIT_STALL_S / 2 < 1000.0 + EXIT_FLUSH_S:
        clock.now += EXIT_STALL_S / 2
        left[0] -= 1
        assert not flush.over()
    clock.now = 1000.0 + EXIT_FLUSH_S
    assert flush.over()


def test_a_flush_with_no_sender_is_over_at_once() -> None:
    assert ExitFlush(lambda: 5, lambda: False, 0, giving_up=True, clock=Clock()).over()


def test_a_stop_signal_cuts_the_flush_and_a_second_ends_it() -> None:
    clock = Clock()
    flush = ExitFlush(lambda: 1, lambda: True, 4, giving_up=True, clock=clock)
    said = flush.cut("SIGTERM")
    assert said == f"SIGTERM during the exit flush: giving the manager {FLUSH_AFTER_TERM_S:g}s more, then " \
                   "exiting with status 4"
    clock.now += FLUSH_AFTER_TERM_S - 0.1
    assert not flush.over()
    clock.now += 0.2
    assert flush.over()
    assert flush.end("SIGINT") == "SIGINT again during the exit flush: exiting now with status 4"
    assert flush.time_is_up()


def test_a_cut_never_lengthens_the_flush() -> None:
    clock = Clock()
    flush = ExitFlush(lambda: 1, lambda: True, 0, giving_up=False, clock=clock)
    clock.now += EXIT_FLUSH_S - 1
    assert "giving the manager 1s more" in flush.cut("SIGTERM")


def test_a_stop_signal_taken_late_is_counted_from_when_it_came() -> None:
    # It came during the exit's sweep (5 s, the loop not running) and was taken as the flush began: its 5 s and its
    # budget were counted from then, and the exit came 10.5 s after it, past docker's SIGKILL.
    clock = Clock()
    flush = ExitFlush(lambda: 1, lambda: True, 5, giving_up=True, clock=clock)
    came = clock.now - 4.0
    said = flush.cut("SIGTERM", budget_s=8.0, came=came)
    assert flush.deadline == came + FLUSH_AFTER_TERM_S and flush.budget_end == came + 8.0
    assert said == "SIGTERM 4.0s ago, before the exit flush: giving the manager 1s more, then exiting with status 5"
    clock.now = came + FLUSH_AFTER_TERM_S
    assert flush.over()


def test_the_finish_gets_its_minimum_past_the_deadline_but_not_past_a_stop_budget() -> None:
    # The sender's end and the shippers' last push got FINISH_MIN_S after a flush that ran to its deadline, under
    # a stop budget too: past CLOSE_S before its end, into docker stop's SIGKILL (an exit 8.2 s after SIGTERM).
    clock = Clock()
    free = ExitFlush(lambda: 1, lambda: True, 0, giving_up=False, clock=clock)
    budgeted = ExitFlush(lambda: 1, lambda: True, 143, giving_up=False, clock=clock)
    budgeted.within_budget(clock.now + 2.0)
    assert budgeted.deadline == clock.now + 2.0 - CLOSE_S
    clock.now = budgeted.deadline  # the wait ran to the budget's flush deadline
    assert budgeted.budget_left_s() == CLOSE_S
    for flush in (free, budgeted):
        flush.finish()
    assert not free.finished() and free.finish_s(FINISH_MIN_S) == FINISH_MIN_S  # no budget: as before
    assert budgeted.finished() and budgeted.finish_s(FINISH_MIN_S) == 0.0
    clock.now = free.deadline
    free.finish()
    assert not free.finished()
    clock.now += FINISH_MIN_S
    assert free.finished() and free.budget_left_s() is None


def test_under_a_long_budget_the_finish_keeps_its_minimum_inside_it() -> None:
    clock = Clock()
    flush = ExitFlush(lambda: 1, lambda: True, 143, giving_up=False, clock=clock)
    flush.within_budget(clock.now + 60.0)
    assert flush.deadline == clock.now + EXIT_FLUSH_S  # its own deadline is the earlier
    clock.now = flush.deadline
    flush.finish()
    assert not flush.finished() and flush.budget_left_s() is None
    clock.now += FINISH_MIN_S
    assert flush.finished()


def test_a_stop_signal_during_the_finish_caps_it_at_its_budget() -> None:
    # No budget (the supervisor's own stop), then docker stop's SIGTERM as the finish begins: its budget ends it.
    clock = Clock()
    flush = ExitFlush(lambda: 1, lambda: True, 3, giving_up=False, clock=clock)
    clock.now = flush.deadline
    flush.finish()
    flush.cut("SIGTERM", budget_s=0.7)
    assert flush.budget_end == clock.now + 0.7
    assert flush.finish_s(1.0) == pytest.approx(0.7 - CLOSE_S)
    clock.now += 0.7 - CLOSE_S
    assert flush.finished()


def test_a_closed_loop_drops_a_threads_late_answer() -> None:
    """The sender's retry after the exit must not write into a closed (or reused) wake-up fd."""
    loop = EventLoop()
    ran: list[str] = []
    loop.close()
    errors: list[BaseException] = []

    def late() -> None:
        try:
            loop.call_soon_threadsafe(lambda: ran.append("late"))
        except BaseException as exc:  # whatever it raised is the failure
            errors.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    thread.join(10)
    assert errors == [] and ran == []


def test_run_until_takes_a_threads_answer_while_it_waits() -> None:
    loop = EventLoop()
    got: list[str] = []
    try:
        threading.Timer(0.05, lambda: loop.call_soon_threadsafe(lambda: got.append("answer"))).start()
        deadline = time.monotonic() + 30
        loop.run_until(lambda: bool(got) or time.monotonic() > deadline, 0.05)
        assert got == ["answer"]
    finally:
        loop.close()
