"""The lifecycle's own record, in-process: the phases it holds at (by name), how far it got, its shutdown.

A real Lifecycle with real Phases on a loop whose clock is fake, and fake children (tests/fakes.py): what
the bench gate drives (``hold``/``release`` by phase name), what status reads (``held``, ``current``), and
that a shutdown is every phase's to obey, the lifecycle's word asked by each (no flag of their own).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChildren, FakeClock

from supervisor.config import parse_plan
from supervisor.engine.logs import Console
from supervisor.engine.loop import EventLoop
from supervisor.engine.reaping import Reaper
from supervisor.evidence.progress import ProgressProbe
from supervisor.lifecycle import resume
from supervisor.lifecycle.lifecycle import Lifecycle
from supervisor.lifecycle.phase import Phase
from supervisor.lifecycle.runtime import ChildKit, MachineEvidence, Runtime
from supervisor.lifecycle.states import PhaseState, PhaseView

TWO_ONESHOTS = """
[[phases]]
name = "bench"
command = ["fake"]

[[phases]]
name = "production"
command = ["fake"]
"""

RESTARTING_SERVICE = """
[[phases]]
name = "svc"
kind = "service"
command = ["fake"]
restart = "always"
backoff_s = 5
backoff_jitter = 0
"""


@dataclass
class Run:
    lifecycle: Lifecycle
    clock: FakeClock
    loop: EventLoop
    children: FakeChildren
    log: list[str]
    finished: list[int]

    def phase(self, name: str) -> Phase:
        return next(p for p in self.lifecycle.phases if p.name == name)

    def run_until(self, t: float) -> None:
        while (due := self.loop.next_due()) is not None and due <= t:
            self.clock.now = max(self.clock.now, due)
            self.loop.run_once(max_wait=0)
        self.clock.now = max(self.clock.now, t)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    made: list[Run] = []
    walkers: list[ProgressProbe] = []

    def make(toml: str) -> Run:
        clock = FakeClock()
        loop = EventLoop(clock=clock)
        log: list[str] = []
        # (no I/O thread: fake children are no processes; the walker thread, for a phase with progress_path, is
        # closed with the run)
        evidence = MachineEvidence(io=None)
        walkers.append(evidence.progress)
        rt = Runtime.of(ChildKit(loop=loop, reaper=Reaper(lambda pid, status: None), console=Console(enabled=False),
                                 log=log.append, log_dir=tmp_path, ring_lines=10, log_file_max_bytes=4096,
                                 base_env={}), evidence, state_dir=tmp_path)
        children = FakeChildren(clock, loop)
        finished: list[int] = []
        lifecycle = Lifecycle(parse_plan(toml, "test.toml", {}), rt, lambda: finished.append(lifecycle.exit_status),
                              spawn=children.spawn)
        made.append(Run(lifecycle, clock, loop, children, log, finished))
        return made[-1]

    yield make  # type: ignore[misc]
    for r in made:
        r.loop.close()
    for walker in walkers:
        walker.close()


def test_a_phase_held_by_name_is_not_gone_past_until_released(run) -> None:
    r = run(TWO_ONESHOTS)
    lifecycle = r.lifecycle

    def gate(phase: PhaseView) -> None:  # as the bench gate does, from a listener, once the bench is done
        if phase.name == "bench" and phase.state is PhaseState.DONE:
            lifecycle.hold("bench", "waiting for the manager's answer")

    lifecycle.observers.plugin.on_transition(gate)
    lifecycle.start()
    assert lifecycle.current() is r.phase("bench")
    r.children.last.exit(0)
    r.run_until(1.0)
    assert r.phase("bench").state is PhaseState.DONE
    assert r.phase("production").state is PhaseState.PENDING and len(r.children.started) == 1
    assert lifecycle.held("bench") == "waiting for the manager's answer" and lifecycle.held("production") is None
    assert lifecycle.current() is r.phase("bench")
    lifecycle.release("bench")
    assert "phase bench: hold released (waiting for the manager's answer)" in r.log
    assert lifecycle.held("bench") is None
    assert r.phase("production").state is PhaseState.RUNNING and len(r.children.started) == 2
    assert lifecycle.current() is r.phase("production")
    lifecycle.release("bench")  # released already: nothing more
    assert r.log.count("phase bench: hold released (waiting for the manager's answer)") == 1
    r.children.last.exit(0)
    r.run_until(2.0)
    assert r.finished == [0]


def test_a_hold_set_as_the_phase_is_done_keeps_the_next_one_pending_until_released(run) -> None:
    """What the plugin's bench gate does: hold the phase by name from its transition listener, release later."""
    r = run(TWO_ONESHOTS)
    bench = r.phase("bench")
    r.lifecycle.observers.plugin.on_transition(lambda p: r.lifecycle.hold(p.name, "held")
                                               if p.name == bench.name and p.state is PhaseState.DONE else None)
    r.lifecycle.start()
    r.children.last.exit(0)
    r.run_until(1.0)
    assert r.lifecycle.held("bench") == "held" and r.phase("production").state is PhaseState.PENDING
    r.lifecycle.release("bench")
    assert r.phase("production").state is PhaseState.RUNNING and r.lifecycle.held("bench") is None


def test_a_shutdown_during_a_backoff_is_over_at_once_and_starts_no_new_attempt(run) -> None:
    # The stop's signals go out before the phases are told (lifecycle.shutdown); with nothing to stop the
    # stop is over at once, and still the phase hears the shutdown (its backoff cancelled) before it ends.
    r = run(RESTARTING_SERVICE)
    r.lifecycle.start()
    r.run_until(1.0)
    r.children.last.exit(1)
    svc = r.phase("svc")
    assert svc.state is PhaseState.BACKOFF and r.loop.next_due() is not None
    r.lifecycle.shutdown("received SIGTERM", 143)
    assert r.finished == [143] and svc.state is PhaseState.STOPPED
    assert r.loop.next_due() is None  # the backoff's timer is cancelled: nothing of the phase is left to run
    r.run_until(100.0)  # well past the 5s backoff
    assert svc.state is PhaseState.STOPPED and svc.why == "supervisor shutdown"
    assert len(r.children.started) == 1
    assert r.finished == [143]


def test_a_shutdown_while_running_stops_the_child_and_the_phase_ends_stopped(run) -> None:
    r = run(RESTARTING_SERVICE)
    r.lifecycle.start()
    svc, child = r.phase("svc"), r.children.last
    assert svc.up and svc.was_up
    r.run_until(2.0)
    r.lifecycle.shutdown("received SIGTERM", 143)
    assert child.stop_asked_at == 2.0
    r.run_until(100.0)
    assert not child.running
    assert [line for line in r.log if line.startswith("phase svc: ")][-2:] == [
        "phase svc: running → stopping (supervisor shutdown)", "phase svc: stopping → stopped (supervisor shutdown)"]
    assert len(r.children.started) == 1  # the shutdown's own stop is no reason to restart it
    assert r.finished == [143]


def test_a_phase_failed_from_a_transition_listener_is_heard_in_order_by_every_listener(run) -> None:
    # What the prover's bench clock does when the manager's deadline has passed already: it hears the phase
    # come to RUNNING and fails it at once, from inside the telling of that move. Every listener after it,
    # and the phase's timeline, must still hear of RUNNING before the moves the failure brings (run to completion).
    r = run(TWO_ONESHOTS)
    lifecycle = r.lifecycle
    first: list[tuple[str, PhaseState]] = []
    later: list[tuple[str, PhaseState]] = []

    def fail_when_running(view: PhaseView) -> None:
        first.append((view.name, view.state))
        if view.name == "bench" and view.state is PhaseState.RUNNING:
            assert lifecycle.fail_phase("bench", "too_slow", "past the manager's deadline")

    lifecycle.observers.plugin.on_transition(fail_when_running)
    lifecycle.observers.plugin.on_transition(lambda view: later.append((view.name, view.state)))
    lifecycle.start()
    r.run_until(1.0)
    bench = [state for name, state in later if name == "bench"]
    assert bench[:3] == [PhaseState.STARTING, PhaseState.RUNNING, PhaseState.STOPPING], later
    assert [s for n, s in first if n == "bench"] == bench  # both heard the same moves, in the same order
    assert len(bench) == len(set(bench)), f"a move heard twice: {later}"
    assert r.phase("bench").state is PhaseState.FAILED
    assert r.phase("bench").outcome is not None and r.phase("bench").outcome.reason == "too_slow"
    assert r.finished and r.finished[0] != 0


ONESHOT_WITH_A_DAEMON = """
[[phases]]
name = "bench"
command = ["fake"]

[[phases.daemons]]
name = "daemon"
command = ["fake"]
stop_grace_s = 30
"""


def test_a_stop_signal_during_a_failed_attempts_stop_keeps_the_failure(run) -> None:
    # The bench exits 1 (no retries): its daemon is being stopped (a 30 s grace) when docker stop comes. The
    # failure came first: the phase fails, the run's failure and status are the bench's, not 143.
    r = run(ONESHOT_WITH_A_DAEMON)
    lifecycle = r.lifecycle
    lifecycle.start()
    daemon, command = r.children.started
    daemon.stop_takes = 30.0
    command.exit(1)
    bench = r.phase("bench")
    assert bench.state is PhaseState.STOPPING and bench.outcome is not None
    r.run_until(5.0)
    lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(100.0)
    assert bench.state is PhaseState.FAILED, bench.why
    assert bench.why.startswith("exit_code: ") and bench.why.endswith("(then supervisor shutdown)"), bench.why
    assert lifecycle.failure is bench.outcome and lifecycle.failure.reason == "exit_code"
    # And why the run ends is the failure, as without the signal (the give-up's reason, status, the exit's line).
    assert r.finished == [1] and lifecycle.shutdown_reason == "phase bench failed"


ONESHOT_WITH_A_DEADLINE = """
[[phases]]
name = "fetch"
command = ["fake"]
timeout_s = 1
stop_grace_s = 30
"""


def test_a_stop_signal_while_a_timed_out_command_is_stopped_keeps_the_timeout(run) -> None:
    # timeout_s passed: the command is being stopped (it ignores SIGTERM for its 30 s grace) when docker stop
    # comes. No exit says how the attempt ended yet, but the supervisor ended it for a reason that fails the
    # phase: the timeout came first and stays the run's (124), as an exit_code failure does (above). It ended 143,
    # the phase stopped, the give-up never sent.
    r = run(ONESHOT_WITH_A_DEADLINE)
    lifecycle = r.lifecycle
    lifecycle.start()
    [command] = r.children.started
    command.stop_takes = 30.0
    r.run_until(2.5)
    fetch = r.phase("fetch")
    assert fetch.state is PhaseState.STOPPING and fetch.outcome is None  # its exit is awaited
    lifecycle.shutdown("received SIGTERM", 143)
    assert lifecycle.failure is not None and lifecycle.failure.reason == "timeout", lifecycle.failure
    r.run_until(100.0)
    assert fetch.state is PhaseState.FAILED, fetch.why
    assert fetch.why.startswith("timeout: ") and fetch.why.endswith("(then supervisor shutdown)"), fetch.why
    assert fetch.outcome is not None and fetch.outcome.reason == "timeout" and fetch.outcome.pid == command.pid
    assert lifecycle.failure is fetch.outcome, "once its exit is in, the run's failure is the exit's verdict"
    assert r.finished == [124] and lifecycle.shutdown_reason == "phase fetch failed"


@pytest.mark.parametrize("retries", [0, 2])
def test_a_stop_signal_while_a_stalled_command_is_stopped_fails_the_phase_only_where_no_retry_is_left(
        run, retries: int) -> None:
    # The stall watch ended the attempt: with no retry left that is the phase's failure (124, as above); with one
    # left it is not, and the stop signal ends the run as usual (143).
    r = run(ONESHOT_WITH_A_DEADLINE.replace("timeout_s = 1\n", f"stall_s = 600\nretries = {retries}\n"))
    lifecycle = r.lifecycle
    lifecycle.start()
    [command] = r.children.started
    command.stop_takes = 30.0
    fetch = r.phase("fetch")
    fetch.stalled("no output for 10s")
    assert fetch.state is PhaseState.STOPPING and fetch.outcome is None
    r.run_until(5.0)
    lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(100.0)
    if retries:
        assert fetch.state is PhaseState.STOPPED and lifecycle.failure is None and r.finished == [143], fetch.why
    else:
        assert fetch.state is PhaseState.FAILED and fetch.why.startswith("stalled: "), fetch.why
        assert lifecycle.failure is not None and lifecycle.failure.reason == "stalled"
        assert r.finished == [124]


def test_a_stop_signal_during_a_stop_that_a_retry_would_follow_is_the_runs_end(run) -> None:
    # With a retry left the attempt's failure is not the phase's: the stop signal ends the run as usual (143).
    r = run(ONESHOT_WITH_A_DAEMON.replace('command = ["fake"]\n\n', 'command = ["fake"]\nretries = 2\n\n', 1))
    lifecycle = r.lifecycle
    lifecycle.start()
    daemon, command = r.children.started
    daemon.stop_takes = 30.0
    command.exit(1)
    lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(100.0)
    assert r.phase("bench").state is PhaseState.STOPPED and lifecycle.failure is None
    assert r.finished == [143] and lifecycle.shutdown_reason == "received SIGTERM"


def test_what_a_shutdown_judged_of_an_attempt_holds_however_long_the_stop_takes(run) -> None:
    # A retry left when the stop signal came (the run ends 143), but the phase's deadline passed during the
    # daemon's 30 s grace: asked again at the stop's end, the phase read "failed for good" and ended failed, its
    # status contradicting the run's 143 (and no failure of the run's to say why).
    r = run(ONESHOT_WITH_A_DAEMON.replace('command = ["fake"]\n\n', 'command = ["fake"]\nretries = 2\n'
                                                                    'timeout_s = 10\n\n', 1))
    lifecycle = r.lifecycle
    lifecycle.start()
    daemon, command = r.children.started
    daemon.stop_takes = 30.0
    command.exit(1)
    r.run_until(1.0)
    lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(100.0)
    bench = r.phase("bench")
    assert bench.state is PhaseState.STOPPED, (bench.state, bench.why)
    assert lifecycle.failure is None and r.finished == [143]


def shut_down_while_the_bench_is_listed(run: Any, tmp_path: Path, output: bytes | None = None) -> Run:
    """The bench (its outputs under tmp_path/params, ``output`` one file there) passed, its daemon stopped, its
    outputs being listed (the test holds resume.output_files) when the shutdown comes (at 5 s); run to 6 s."""
    (tmp_path / "params").mkdir()
    if output is not None:
        (tmp_path / "params" / "a.params").write_bytes(output)
    r = run(BENCH_WITH_ITS_DAEMON.replace('name = "bench"\n', f'name = "bench"\nstall_s = 600\nprogress_path = '
                                                                f'"{tmp_path / "params"}"\n', 1))
    r.lifecycle.start()
    r.run_until(1.0)
    daemon, command = r.children.started
    daemon.stop_takes = 2.0
    command.exit(0)
    r.run_until(5.0)  # the daemon is stopped: the listing is under way
    assert r.phase("bench").state is PhaseState.STOPPING
    r.lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(6.0)
    return r


def test_a_completed_phase_whose_outputs_are_still_listed_at_the_stops_end_is_done(
        run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The bench's command passed and its outputs were being listed (off the loop: a big cache, a slow mount) when
    # the shutdown's stop ended: the phase was ended "stopped", the listing's answer dropped, its facts lost,
    # and the next start ran it again. The run now ends once the listing answers, the phase done.
    listing = threading.Event()
    real = resume.output_files

    def slow_listing(path: str) -> dict[str, int] | None:
        listing.wait(30)
        return real(path)

    monkeypatch.setattr(resume, "output_files", slow_listing)
    r = shut_down_while_the_bench_is_listed(run, tmp_path, b"p")
    bench = r.phase("bench")
    assert bench.state is PhaseState.STOPPING and r.finished == [], "the run waits for the bench's facts"
    listing.set()
    deadline = time.monotonic() + 10
    while not r.finished and time.monotonic() < deadline:
        r.loop.run_once(max_wait=0.1)  # (the listing's answer comes from its thread)
    assert bench.state is PhaseState.DONE, (bench.state, bench.why)
    assert bench.facts.get("outputs") == {"a.params": 1}
    assert r.finished == [143]


def test_the_wait_for_a_completed_phases_facts_ends_at_a_kill_nows_budget(
        run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second stop signal (docker stop after the supervisor began its own shutdown) kills at once, and docker's
    # SIGKILL comes at its budget's end: the wait for a listing that hangs must not outlast it.
    hung = threading.Event()
    monkeypatch.setattr(resume, "output_files", lambda path: hung.wait(30))  # (a hung listing)
    r = shut_down_while_the_bench_is_listed(run, tmp_path)
    assert r.finished == [], "the run waits for the bench's facts"
    r.lifecycle.kill_everything_now(wait_until=8.0)
    r.run_until(7.9)
    assert r.finished == []
    r.run_until(8.0)
    hung.set()
    assert r.finished == [143] and any("did not come" in line for line in r.log), r.log


def test_a_service_failed_by_a_hearer_of_its_coming_up_is_heard_up_first_by_every_listener(run) -> None:
    # The same run to completion for "its service is up" (no move of its own: the phase is told again): a
    # listener that fails it there, as the production watch may, does so after every hearer heard it up.
    r = run(RESTARTING_SERVICE.replace('restart = "always"', 'restart = "no"'))
    lifecycle = r.lifecycle
    later: list[tuple[PhaseState, bool]] = []

    def fail_when_up(view: PhaseView) -> None:
        if view.up:
            assert lifecycle.fail_phase("svc", "too_slow", "no proof in the window")

    lifecycle.observers.plugin.on_transition(fail_when_up)
    lifecycle.observers.plugin.on_transition(lambda view: later.append((view.state, view.up)))
    lifecycle.start()
    r.run_until(10.0)
    assert later[:3] == [(PhaseState.STARTING, False), (PhaseState.RUNNING, False), (PhaseState.RUNNING, True)], later
    assert later[3] == (PhaseState.STOPPING, False), later
    assert r.phase("svc").state is PhaseState.FAILED


BENCH_WITH_ITS_DAEMON = ONESHOT_WITH_A_DAEMON + """
[[phases]]
name = "production"
command = ["fake"]
"""


def test_a_oneshot_that_completed_is_done_though_a_shutdown_came_during_its_daemons_stop(run) -> None:
    # The bench's command passed; its daemon (cuzk, 30 s of grace) was being stopped when docker stop came: the
    # phase ended stopped, its facts were never kept, and the next start ran the bench again.
    r = run(BENCH_WITH_ITS_DAEMON)
    r.lifecycle.start()
    r.run_until(1.0)
    daemon, command = r.children.started
    daemon.stop_takes = 5.0
    command.exit(0)
    bench = r.phase("bench")
    assert bench.state is PhaseState.STOPPING
    r.run_until(2.0)
    r.lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(10.0)
    assert bench.state is PhaseState.DONE, (bench.state, bench.why)
    assert bench.why == "completed in 1 attempt(s) (then supervisor shutdown)"
    assert "done_at" in bench.facts  # what the next start resumes it by
    assert r.phase("production").state is PhaseState.STOPPED and len(r.children.started) == 2  # never started
    assert r.finished == [143]


def test_a_command_the_shutdown_stopped_is_no_success_of_its_own(run) -> None:
    r = run(BENCH_WITH_ITS_DAEMON)
    r.lifecycle.start()
    r.run_until(1.0)
    r.lifecycle.shutdown("received SIGTERM", 143)
    r.run_until(10.0)
    assert r.phase("bench").state is PhaseState.STOPPED and r.finished == [143]


def test_a_phase_of_many_daemons_stopped_together_keeps_its_commands_verdict(run) -> None:
    # The run keeps the latest 20 verdicts of a phase: 25 daemons stopped after the command pushed its verdict
    # out, and the attempt read as one whose command "outlived SIGKILL and was never reaped".
    daemons = "".join(f'\n[[phases.daemons]]\nname = "d{i}"\ncommand = ["fake"]\n' for i in range(25))
    r = run(f'[[phases]]\nname = "work"\ncommand = ["fake"]\ntimeout_s = 100\n{daemons}')
    r.lifecycle.start()
    r.run_until(200.0)
    work = r.phase("work")
    assert len(r.children.started) == 26 and work.state is PhaseState.FAILED, (work.state, work.why)
    assert work.outcome is not None and work.outcome.reason == "timeout", work.outcome
    assert "never reaped" not in work.outcome.detail, work.outcome.detail


def test_after_a_freeze_past_the_backoff_and_the_deadline_no_attempt_starts(run) -> None:
    # Both timers were due when the loop came back (SIGSTOP, a frozen cgroup); the backoff's fired first and
    # started an attempt past timeout_s, which the deadline then killed.
    r = run('[[phases]]\nname = "o"\ncommand = ["fake"]\nretries = 5\ntimeout_s = 10\nbackoff_s = 2\n'
            'backoff_jitter = 0\n')
    r.lifecycle.start()
    r.run_until(5.0)
    r.children.last.exit(1)
    r.loop.run_once(max_wait=0)
    assert r.phase("o").state is PhaseState.BACKOFF
    r.clock.now = 50.0  # frozen for 45 s: the backoff (at 7) and the deadline (at 10) are both overdue
    r.run_until(60.0)
    o = r.phase("o")
    assert o.state is PhaseState.FAILED and o.outcome is not None and o.outcome.reason == "timeout", o.why
    assert len(r.children.started) == 1, "an attempt was started past the deadline"


def test_a_daemon_kept_for_the_lifecycle_is_one_live_child_of_its_done_phase(run) -> None:
    # It stays among its attempt's children and is also the phase's kept: status listed it twice.
    r = run("""
[[phases]]
name = "bench"
command = ["fake"]

[[phases.daemons]]
name = "keep"
command = ["fake"]
lifetime = "lifecycle"

[[phases]]
name = "production"
command = ["fake"]
""")
    r.lifecycle.start()
    keep, bench = r.children.started
    bench.exit(0)
    r.run_until(1.0)
    phase = r.phase("bench")
    assert phase.state is PhaseState.DONE and phase.kept == [keep]
    assert phase.live_children() == [keep]
    assert r.phase("production").state is PhaseState.RUNNING
