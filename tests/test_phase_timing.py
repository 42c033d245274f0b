"""The phase's timing rules, in-process, on a fake clock: backoff, the restart burst, the deadline, the stall.

The real Phase runs on a real EventLoop whose clock is a ``FakeClock`` (tests/fakes.py): a timer is due when the
fake clock says so, and the test moves the clock from one due timer to the next (``Drive``). Its children
are fakes that never run a process (``FakeChildren``, handed to the phase as its ``spawn``): the test
says when one prints and when it exits; asked to stop, one exits by SIGTERM at once. So every time
asserted below is exact, what the fake clock showed when the phase moved, and nothing sleeps (as
Pebble's servstate tests do with their fake time).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeChildren, FakeClock

from supervisor.config import parse_plan
from supervisor.engine.logs import Console
from supervisor.engine.loop import EventLoop
from supervisor.engine.reaping import Reaper
from supervisor.engine.tick import FREEZE_MIN_S, FreezeWatch
from supervisor.evidence.stall import check_interval
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.hooks import NO_HOOKS, PhaseHooks, SettleHook
from supervisor.lifecycle.phase import Phase
from supervisor.lifecycle.runtime import ChildKit, MachineEvidence, Runtime
from supervisor.lifecycle.states import PhaseState, backoff_delay
from supervisor.plugin import Plugin
from supervisor.status.model import DeadlineTimer
from supervisor.status.snapshot import phase_timers

SEED = 20260101


@dataclass
class Drive:
    """One phase on a fake clock; ``moves``: (time, state, why) at each transition."""

    phase: Phase
    clock: FakeClock
    loop: EventLoop
    children: FakeChildren
    rt: Runtime
    log: list[str]
    moves: list[tuple[float, PhaseState, str]]

    def run_until(self, t: float) -> None:
        """Move the clock to ``t``, from due timer to due timer, running each when it is due."""
        while (due := self.loop.next_due()) is not None and due <= t:
            self.clock.now = max(self.clock.now, due)
            self.loop.run_once(max_wait=0)
        self.clock.now = max(self.clock.now, t)

    def jump(self, seconds: float) -> None:
        """The whole supervisor frozen for ``seconds``: the clock moves on, no timer runs meanwhile."""
        self.clock.now += seconds
        self.loop.run_once(max_wait=0)

    def times_of(self, state: PhaseState) -> list[float]:
        return [t for t, s, _ in self.moves if s is state]

    def verdicts(self) -> list[v.Verdict]:
        return list(self.rt.verdicts)


@pytest.fixture
def drive(tmp_path: Path) -> Iterator[Callable[..., Drive]]:
    loops: list[EventLoop] = []

    def make(toml: str, *, freeze: bool = False, hooks: PhaseHooks = NO_HOOKS, plugin: Plugin | None = None) -> Drive:
        clock = FakeClock()
        loop = EventLoop(clock=clock)
        loops.append(loop)
        log: list[str] = []
        kit = ChildKit(loop=loop, reaper=Reaper(lambda pid, status: None), console=Console(enabled=False),
                       log=log.append, log_dir=tmp_path, ring_lines=10, log_file_max_bytes=4096, base_env={})
        # (no I/O thread: fake children are no processes, their pids are nobody's or somebody else's)
        evidence = MachineEvidence(freeze=FreezeWatch(log.append, clock=clock) if freeze else None, io=None)
        rt = Runtime.of(kit, evidence, rng=random.Random(SEED), state_dir=tmp_path)
        children = FakeChildren(clock, loop)
        moves: list[tuple[float, PhaseState, str]] = []

        def changed(phase: Phase) -> None:
            if not moves or moves[-1][1] is not phase.state or moves[-1][2] != phase.why:
                moves.append((clock.monotonic(), phase.state, phase.why))

        spec = parse_plan(toml, "test.toml", {}, plugin).phases[0]
        phase = Phase(spec, rt, changed, hooks, spawn=children.spawn)
        return Drive(phase, clock, loop, children, rt, log, moves)

    yield make
    for loop in loops:
        loop.close()


def oneshot(**keys: object) -> str:
    return _phase("oneshot", keys)


def service(**keys: object) -> str:
    return _phase("service", keys)


def _phase(kind: str, keys: dict[str, object]) -> str:
    lines = "\n".join(f"{k} = {val!r}" if not isinstance(val, str) else f'{k} = "{val}"' for k, val in keys.items())
    return f'[[phases]]\nname = "p"\nkind = "{kind}"\ncommand = ["fake"]\n{lines}\n'


def draws(n: int) -> list[float]:
    """The first ``n`` numbers the phase's seeded random source gives (its only use: the backoff's jitter)."""
    rng = random.Random(SEED)
    return [rng.random() for _ in range(n)]


# ---------------------------------------------------------------- backoff


def test_each_backoff_is_backoff_delay_of_the_failures_so_far_with_the_seeded_jitter(drive) -> None:
    d = drive(oneshot(retries=3, backoff_s=1.0, backoff_factor=2.0, backoff_max_s=30.0, backoff_jitter=0.5))
    d.phase.start()
    starts, rands = [0.0], draws(3)
    for n in range(1, 4):
        d.run_until(starts[-1] + 0.5)
        d.children.last.exit(1)  # every attempt fails half a second in
        delay = backoff_delay(n, 1.0, 2.0, 30.0, 0.5, rands[n - 1])
        assert d.phase.state is PhaseState.BACKOFF
        assert d.moves[-1] == (starts[-1] + 0.5, PhaseState.BACKOFF,
                               f"exit_code; retry {n} of 3; backoff {delay:.2f}s")
        starts.append(starts[-1] + 0.5 + delay)
        d.run_until(starts[-1])
        assert d.phase.state is PhaseState.RUNNING and d.phase.attempt == n + 1  # no daemons: started at once
    assert d.times_of(PhaseState.STARTING) == starts
    assert len(set(starts[i + 1] - starts[i] for i in range(3))) == 3  # the jitter moved each one
    d.run_until(starts[-1] + 0.5)
    d.children.last.exit(1)
    assert d.phase.state is PhaseState.FAILED
    assert d.moves[-1] == (starts[-1] + 0.5, PhaseState.FAILED, "exit_code (all 3 retries used)")
    assert d.phase.outcome is not None and d.phase.outcome.reason == v.EXIT_CODE


def test_what_a_prepare_hook_no_longer_gives_is_no_longer_in_the_next_attempts_environment(drive) -> None:
    # The environment a hook returned was added to, never replaced: a key it gave the first attempt and not the
    # second reached the second's children all the same. The memory preflight's part stays from the first.
    given = iter([{"STALE": "1", "KEPT": "a"}, {"KEPT": "b"}])
    d = drive(oneshot(retries=1, backoff_s=1.0, backoff_jitter=0.0, min_memory="1KiB"),
              hooks=PhaseHooks(prepare=lambda ctx: next(given)))
    d.phase.start()
    d.run_until(0.5)
    d.children.last.exit(1)
    d.run_until(2.0)
    first, second = d.children.envs
    assert first["STALE"] == "1" and first["KEPT"] == "a"
    assert "STALE" not in second and second["KEPT"] == "b"
    preflight = {k: v for k, v in first.items() if k not in ("STALE", "KEPT")}
    assert preflight and all(second[k] == v for k, v in preflight.items()), (first, second)


def test_an_attempt_that_ran_backoff_reset_s_starts_the_backoff_again(drive) -> None:
    d = drive(service(restart="always", backoff_s=1.0, backoff_factor=2.0, backoff_max_s=60.0, backoff_jitter=0.0,
                      backoff_reset_s=10.0, restart_burst=100))
    d.phase.start()
    delays = []
    for ran in (1.0, 1.0, 1.0, 12.0, 1.0):  # the fourth attempt runs longer than backoff_reset_s
        assert d.phase.up  # a service without a ready check is up once its command runs
        d.run_until(d.clock.now + ran)
        d.children.last.exit(1)
        assert not d.phase.up and d.phase.was_up
        delays.append(float(d.moves[-1][2].rsplit("backoff ", 1)[1].rstrip("s")))
        d.run_until(d.clock.now + delays[-1])
    assert delays == [1.0, 2.0, 4.0, 1.0, 2.0]


@pytest.mark.parametrize("kind", [dict(kind="service", restart="always", restart_burst=100),
                                  dict(kind="oneshot", retries=10)], ids=["service", "oneshot"])
def test_the_stop_grace_of_a_failed_attempt_is_no_time_it_ran_for_backoff_reset_s(drive, kind) -> None:
    # Its command fails at once; its daemon ignores SIGTERM and is killed after its 2.5s grace. The attempt ran
    # no time at all: measured after the stop, it "ran" 2.5s >= backoff_reset_s, and the backoff never grew.
    keys = dict(backoff_s=0.5, backoff_factor=2.0, backoff_max_s=60.0, backoff_jitter=0.0, backoff_reset_s=2.0)
    d = drive(_phase(kind.pop("kind"), {**kind, **keys}) + '[[phases.daemons]]\nname = "d"\ncommand = ["fake"]\n')
    d.phase.start()
    delays = []
    for _ in range(4):
        d.children.started[-2].stop_takes = 2.5  # this attempt's daemon
        d.children.last.exit(1)
        d.run_until(d.clock.now + 2.5)
        assert d.phase.state is PhaseState.BACKOFF, d.moves[-1]
        delays.append(float(d.moves[-1][2].rsplit("backoff ", 1)[1].rstrip("s")))
        d.run_until(d.clock.now + delays[-1])
    assert delays == [0.5, 1.0, 2.0, 4.0]


# ---------------------------------------------------------------- the restart burst


def test_restart_burst_restarts_within_restart_window_s_fail_the_service(drive) -> None:
    d = drive(service(restart="always", restart_burst=3, restart_window_s=60.0, backoff_s=1.0, backoff_factor=1.0,
                      backoff_jitter=0.0))
    d.phase.start()
    for _ in range(3):
        d.run_until(d.clock.now + 2.0)
        d.children.last.exit(1)
        assert d.phase.state is PhaseState.BACKOFF
        d.run_until(d.clock.now + 1.0)
    assert d.times_of(PhaseState.STARTING) == [0.0, 3.0, 6.0, 9.0]
    d.run_until(11.0)
    d.children.last.exit(1)  # the fourth end within 60s: three restarts already happened in the window
    assert d.phase.state is PhaseState.FAILED
    assert d.moves[-1] == (11.0, PhaseState.FAILED,
                           "exit_code; restarted 3 times within 60s (restart_burst): giving up")
    assert d.loop.next_due() is None  # no backoff left waiting


def test_restarts_spread_out_wider_than_the_window_never_fail_the_service(drive) -> None:
    d = drive(service(restart="always", restart_burst=3, restart_window_s=60.0, backoff_s=1.0, backoff_factor=1.0,
                      backoff_jitter=0.0, backoff_reset_s=0.0))
    d.phase.start()
    for _ in range(10):  # each attempt runs 25s: never three restarts within 60s
        d.run_until(d.clock.now + 25.0)
        d.children.last.exit(1)
        assert d.phase.state is PhaseState.BACKOFF, d.moves[-1]
        d.run_until(d.clock.now + 1.0)
    assert d.phase.state is PhaseState.RUNNING and d.phase.attempt == 11
    assert d.times_of(PhaseState.STARTING) == [26.0 * n for n in range(11)]


def test_a_service_that_never_comes_up_fails_after_restart_burst_restarts_however_long_each_wait(
        drive, tmp_path: Path) -> None:
    # The profile's curio: a ready wait of 900 s, 5 restarts within 300 s. Its attempts are 900 s apart, so the
    # window never holds more than one restart: a curio that never came up was restarted every 15 min for good.
    d = drive(service(restart="always", ready=str(tmp_path / "never"), ready_timeout_s=900.0, restart_burst=5,
                      restart_window_s=300.0, backoff_s=1.0, backoff_factor=1.0, backoff_jitter=0.0))
    d.phase.start()
    d.run_until(100_000.0)
    assert d.phase.state is PhaseState.FAILED and not d.phase.was_up
    assert d.times_of(PhaseState.STARTING) == [901.0 * n for n in range(6)]  # the first attempt and 5 restarts
    assert d.moves[-1] == (901.0 * 5 + 900.0, PhaseState.FAILED,
                           "timeout; restarted 5 times in a row without coming up (restart_burst): giving up")


# ---------------------------------------------------------------- the deadline


def test_the_deadline_counts_across_attempts_and_stops_a_running_one_with_reason_timeout(drive) -> None:
    d = drive(oneshot(timeout_s=10.0, retries=5, backoff_s=1.0, backoff_factor=1.0, backoff_jitter=0.0))
    d.phase.start()
    d.run_until(3.0)
    d.children.last.exit(1)
    d.run_until(4.0)
    second = d.children.last
    assert d.phase.attempt == 2 and d.phase.state is PhaseState.RUNNING
    d.run_until(9.999)
    assert d.phase.state is PhaseState.RUNNING  # not a moment early
    d.run_until(10.0)
    assert second.stop_asked_at == 10.0  # 10s after the first attempt began, not after the second
    assert "phase p: phase deadline timeout_s=10 passed" in d.log
    assert [s for _, s, _ in d.moves[-2:]] == [PhaseState.STOPPING, PhaseState.FAILED]
    assert d.times_of(PhaseState.FAILED) == [10.0]
    outcome = d.phase.outcome
    assert outcome is not None and outcome.reason == v.TIMEOUT and outcome.child == "p" and outcome.attempt == 2
    assert outcome.detail.startswith("phase deadline timeout_s=10 passed; ")
    assert d.verdicts()[-1] == outcome


def test_a_deadline_that_passes_in_backoff_fails_the_phase_at_once(drive) -> None:
    d = drive(oneshot(timeout_s=5.0, retries=5, backoff_s=10.0, backoff_max_s=10.0, backoff_jitter=0.0))
    d.phase.start()
    d.run_until(2.0)
    d.children.last.exit(1)
    assert d.phase.state is PhaseState.BACKOFF
    d.run_until(100.0)
    assert d.moves[-1] == (5.0, PhaseState.FAILED, "phase deadline timeout_s=5 passed")
    assert len(d.children.started) == 1  # the backoff's attempt never came
    outcome = d.phase.outcome
    assert outcome is not None and (outcome.reason, outcome.pid, outcome.attempt) == (v.TIMEOUT, None, 1)
    assert [x.reason for x in d.verdicts()] == [v.EXIT_CODE, v.TIMEOUT]


# ---------------------------------------------------------------- the stall


WITH_A_DAEMON = """
[[phases]]
name = "p"
command = ["fake"]
timeout_s = 10.0
retries = 3
backoff_s = 1.0
backoff_jitter = 0.0

[[phases.daemons]]
name = "d"
command = ["fake"]
"""


def test_a_deadline_that_passes_while_an_attempt_is_stopped_leaves_no_retry(drive) -> None:
    # The command fails at 8s; its daemon takes 5s to stop (its grace), and the whole-phase deadline passes
    # at 10s in the middle of that stop. The failure's retry would start an attempt past the deadline, with
    # no deadline left to end it: the phase fails instead, its outcome still the command's own.
    d = drive(WITH_A_DAEMON)
    d.phase.start()
    daemon = d.children.started[0]
    daemon.stop_takes = 5.0
    d.run_until(8.0)
    d.children.last.exit(1)
    d.run_until(9.0)
    assert d.phase.state is PhaseState.STOPPING
    d.run_until(10.0)
    assert "phase p: phase deadline timeout_s=10 passed" in d.log
    d.run_until(100.0)
    assert d.phase.state is PhaseState.FAILED and d.times_of(PhaseState.FAILED) == [13.0]
    assert len(d.children.started) == 2  # no second attempt
    assert d.phase.why == "exit_code; the phase deadline timeout_s=10 passed: no retry"
    outcome = d.phase.outcome
    assert outcome is not None and outcome.reason == v.EXIT_CODE and outcome.child == "p"


def test_a_command_that_outlives_its_sigkill_ends_the_attempt_with_the_stops_own_reason(drive) -> None:
    # A GPU fault leaves the process in uninterruptible sleep: SIGKILL cannot end it, and the stop gives up
    # waiting without an exit. The attempt's outcome is then the abort's reason (a GPU fault fails for good),
    # recorded, never a made-up timeout that a restart policy would retry.
    d = drive(service(restart="always", backoff_s=1.0, backoff_jitter=0.0))
    d.phase.start()
    d.run_until(5.0)
    d.children.last.outlives_kill = True
    d.phase.abort_attempt(v.GPU_FAULT, "Xid 79 on GPU 0")
    d.run_until(100.0)
    assert d.phase.state is PhaseState.FAILED and len(d.children.started) == 1
    outcome = d.phase.outcome
    assert outcome is not None and outcome.reason == v.GPU_FAULT and outcome.child == "p"
    pid = d.children.last.pid
    assert outcome.detail == f"Xid 79 on GPU 0; pid {pid} outlived SIGKILL and was never reaped"
    assert d.verdicts()[-1] == outcome  # recorded: no exit recorded it


def test_a_watchs_finding_during_a_shutdown_is_not_the_attempts_failure(drive) -> None:
    # After SIGTERM the phase stays running until the shutdown ends it; a stall found in that grace must
    # not fail it (nor be reported as a failure): the shutdown ends the attempt.
    d = drive(service(restart="always", stall_s=30.0))
    lifecycle = SimpleNamespace(shutting_down=False)
    d.phase._lifecycle = lifecycle
    d.phase.start()
    d.run_until(5.0)
    lifecycle.shutting_down = True  # the shutdown's stop has begun; the child takes its grace
    d.run_until(100.0)  # far past stall_s of silence
    assert any("stalled" in line for line in d.log)  # the watch found it: the phase did not act on it
    assert d.phase.state is PhaseState.RUNNING and d.phase.outcome is None and not d.verdicts()
    assert d.children.last.running


def test_a_service_failed_as_its_command_starts_is_never_up(drive, tmp_path: Path) -> None:
    # Its daemon's readiness answered, the command starts, and a hearer of the move to running (a plugin's
    # listener) fails the service there and then: the attempt is over before the command's start is
    # done, so the service was never up (the lifecycle must not go past it, nor production count as run).
    (tmp_path / "ready").touch()
    # Stamped as a file its daemon wrote after its start (a file from before the start does not count).
    os.utime(tmp_path / "ready", (time.time() + 60, time.time() + 60))
    d = drive(service(restart="no") + f'[[phases.daemons]]\nname = "d"\ncommand = ["fake"]\n'
                                       f'ready = "{tmp_path / "ready"}"\n')
    told: list[tuple[PhaseState, bool]] = []

    def fail_as_it_runs(phase: Phase) -> None:
        told.append((phase.state, phase.was_up))
        if phase.state is PhaseState.RUNNING and len(told) == 2:
            phase.abort_attempt(v.TOO_SLOW, "failed as it starts")

    d.phase._on_change = fail_as_it_runs
    d.phase.start()
    for _ in range(200):  # the ready file is looked at off the loop: its answer comes back in real time
        if d.phase.state is PhaseState.FAILED:
            break
        d.loop.run_once(max_wait=0.05)
    assert d.phase.state is PhaseState.FAILED and not d.phase.was_up
    assert "phase p: service is up" not in d.log
    assert [state for state, _ in told] == [PhaseState.STARTING, PhaseState.RUNNING, PhaseState.STOPPING,
                                           PhaseState.FAILED]

def test_stall_s_of_silence_stops_the_attempt_with_reason_stalled(drive) -> None:
    d = drive(oneshot(stall_s=5.0))
    d.phase.start()
    assert check_interval(5.0) == 0.5
    d.run_until(4.999)
    assert d.phase.state is PhaseState.RUNNING
    d.run_until(30.0)
    assert d.children.last.stop_asked_at == 5.0
    assert "phase p: stalled: no output for 5.0s (no GPU visible) (stall_s=5)" in d.log
    assert d.moves[-1][:2] == (5.0, PhaseState.FAILED)
    outcome = d.phase.outcome
    assert outcome is not None and outcome.reason == v.STALLED
    assert outcome.detail.startswith("stalled: no output for 5.0s (no GPU visible); ")


def test_output_restarts_the_stall_window(drive) -> None:
    d = drive(oneshot(stall_s=5.0))
    d.phase.start()
    for t in (3.0, 7.0):
        d.run_until(t)
        d.children.last.say(f"working at {t:g}")
    d.run_until(11.999)
    assert d.phase.state is PhaseState.RUNNING
    d.run_until(30.0)
    assert d.children.last.stop_asked_at == 12.0  # 5s after the last line, at 7
    assert d.phase.outcome is not None and d.phase.outcome.reason == v.STALLED


def test_a_freeze_of_the_supervisor_restarts_the_stall_window_at_the_thaw(drive) -> None:
    d = drive(oneshot(stall_s=5.0), freeze=True)
    d.phase.start()
    d.run_until(2.0)
    d.jump(FREEZE_MIN_S + 1.0)  # frozen from 2 to 6: 6s of silence, most of it the supervisor's own blindness
    assert d.clock.now == 6.0
    assert "the supervisor was frozen (SIGSTOP, cgroup freezer, docker pause?) for 4.0s; " \
           "stall windows restart now, deadlines keep counting" in d.log
    assert d.phase.state is PhaseState.RUNNING
    d.run_until(10.999)
    assert d.phase.state is PhaseState.RUNNING
    d.run_until(30.0)
    assert d.children.last.stop_asked_at == 11.0  # 5s after the thaw
    assert d.phase.outcome is not None and d.phase.outcome.reason == v.STALLED


def test_without_the_freeze_watch_the_same_silence_is_a_stall(drive) -> None:
    """The control for the test above: the same jump, nobody noticing it, is taken as silence."""
    d = drive(oneshot(stall_s=5.0))
    d.phase.start()
    d.run_until(2.0)
    d.jump(FREEZE_MIN_S + 1.0)
    assert d.children.last.stop_asked_at == 6.0
    assert d.phase.outcome is not None and d.phase.outcome.reason == v.STALLED


# ---------------------------------------------------------------- the settle


class Building:
    """A daemon's cache built on a thread of its own after its first request (the test's settle watch): pending
    from its "building" line to its "built" or "failed" line."""

    def __init__(self) -> None:
        self.building = False

    def feed(self, lines: list[bytes]) -> None:
        for line in lines:
            if line.startswith(b"building"):
                self.building = True
            elif line.startswith((b"built", b"failed")):
                self.building = False

    def pending(self) -> str | None:
        return "the cache is being built" if self.building else None


CACHE = SettleHook("the daemon's cache", Building, "the next daemon builds it again")
SETTLES = Plugin("test", settles={"cache": CACHE})
SETTLING = """
[[phases]]
name = "p"
command = ["fake"]
timeout_s = 100.0
retries = 1
backoff_s = 1.0
backoff_jitter = 0.0
settle = "cache"
settle_timeout_s = 20.0

[[phases.daemons]]
name = "d"
command = ["fake"]
"""


def settling(drive, exits_at: float | None = 5.0, code: int = 0) -> tuple[Drive, object, object]:
    """The phase started, its daemon building its cache from 1s, its command exiting ``code`` at ``exits_at``
    (None: not yet): the drive, the daemon, the command."""
    d = drive(SETTLING, hooks=PhaseHooks(settle=CACHE), plugin=SETTLES)
    d.phase.start()
    d.run_until(1.0)
    daemon, command = d.children.started
    if exits_at is not None:
        daemon.say("building the cache")
        d.run_until(exits_at)
        command.exit(code)
    return d, daemon, command


def test_the_daemons_are_kept_after_the_command_until_the_settle_reads_their_work_over(drive) -> None:
    d, daemon, _ = settling(drive)
    assert d.phase.state is PhaseState.SETTLING and daemon.running and daemon.stop_asked_at is None
    assert d.phase.why == ("waiting for the daemon's cache: the cache is being built "
                           "(at most settle_timeout_s=20)")
    assert d.phase.outcome is not None and d.phase.outcome.success  # the command's, unless a daemon dies
    d.run_until(9.0)
    timers = phase_timers(d.phase, None, d.clock.monotonic())
    assert timers.settle == DeadlineTimer(limit_s=20.0, left_s=16.0), timers  # (what status shows)
    d.run_until(12.0)
    daemon.say("built the cache")
    assert daemon.stop_asked_at == 12.0
    assert phase_timers(d.phase, None, d.clock.monotonic()).settle is None
    d.run_until(13.0)
    assert d.phase.state is PhaseState.DONE and [s for _, s, _ in d.moves] == [
        PhaseState.STARTING, PhaseState.RUNNING, PhaseState.SETTLING, PhaseState.STOPPING, PhaseState.DONE]
    assert d.times_of(PhaseState.STOPPING) == [12.0]
    assert [why for _, s, why in d.moves if s is PhaseState.STOPPING] == ["the daemon's cache: over"]


def test_nothing_pending_at_the_commands_exit_stops_the_daemons_at_once(drive) -> None:
    d, daemon, command = settling(drive, exits_at=None)
    daemon.say("building the cache")
    daemon.say("built the cache")  # (before the command's exit: read before it is decided)
    d.run_until(5.0)
    command.exit(0)
    assert PhaseState.SETTLING not in [s for _, s, _ in d.moves]
    assert daemon.stop_asked_at == 5.0
    d.run_until(6.0)
    assert d.phase.state is PhaseState.DONE


def test_a_settle_that_does_not_end_is_cut_at_settle_timeout_s_and_the_success_stands(drive) -> None:
    d, daemon, _ = settling(drive)
    d.run_until(24.999)
    assert d.phase.state is PhaseState.SETTLING and daemon.stop_asked_at is None
    d.run_until(30.0)
    assert daemon.stop_asked_at == 25.0
    assert d.phase.state is PhaseState.DONE
    assert [why for _, s, why in d.moves if s is PhaseState.STOPPING] == [
        "settle_timeout_s=20 passed; the daemon's cache cut short: the next daemon builds it again"]


def test_a_daemon_that_dies_while_settling_ends_the_attempt_with_its_verdict(drive) -> None:
    # (The real case: the daemon OOM-killed as it builds what its first request started.)
    d, daemon, _ = settling(drive)
    d.run_until(8.0)
    daemon.exit(None, 9)
    outcome = d.phase.outcome
    assert outcome is not None and outcome.reason == v.DAEMON_DIED and outcome.child == "d"
    assert [(t, s) for t, s, _ in d.moves][-2:] == [(8.0, PhaseState.STOPPING), (8.0, PhaseState.BACKOFF)]
    d.run_until(9.5)
    assert d.phase.state is PhaseState.RUNNING and d.phase.attempt == 2  # its retry, after the backoff


def test_a_deadline_that_passes_while_settling_stops_the_daemons_and_the_success_stands(drive) -> None:
    d, daemon, _ = settling(drive, exits_at=95.0)
    d.run_until(100.0)
    assert daemon.stop_asked_at == 100.0
    d.run_until(101.0)
    assert d.phase.state is PhaseState.DONE and len(d.children.started) == 2
    assert [why for _, s, why in d.moves if s is PhaseState.STOPPING] == [
        "phase deadline timeout_s=100 passed; the daemon's cache cut short: the next daemon builds it again"]


def test_a_settles_end_still_in_the_pipe_at_the_deadline_is_read_first_and_decides(drive) -> None:
    # The deadline reads what the children printed before it decides: the daemon's last line ends the settle,
    # and the deadline, now moot, is not said (nor blamed for the stop).
    d, daemon, _ = settling(drive, exits_at=95.0)
    daemon.held.append("built the cache")
    d.run_until(101.0)
    assert d.phase.state is PhaseState.DONE
    assert [why for _, s, why in d.moves if s is PhaseState.STOPPING] == ["the daemon's cache: over"]
    assert not any("deadline" in line for line in d.log), d.log


def test_a_stall_while_settling_cuts_the_settle_and_the_success_stands(drive) -> None:
    # A daemon working silently for its command is no failure of that command; a fault found meanwhile is.
    d, _, _ = settling(drive)
    d.phase.abort_attempt(v.STALLED, "stalled: no output for 60.0s")  # (what the stall watch's finding does)
    d.run_until(6.0)
    assert d.phase.state is PhaseState.DONE and d.phase.outcome is not None and d.phase.outcome.success
    assert [why for _, s, why in d.moves if s is PhaseState.STOPPING] == [
        "stalled: no output for 60.0s; the daemon's cache cut short: the next daemon builds it again"]
    faulted, _, _ = settling(drive)
    faulted.phase.abort_attempt(v.GPU_FAULT, "Xid 79 on GPU 0")
    faulted.run_until(200.0)
    assert faulted.phase.state is PhaseState.FAILED
    assert faulted.phase.outcome is not None and faulted.phase.outcome.reason == v.GPU_FAULT


def test_a_command_that_failed_never_settles(drive) -> None:
    d, daemon, _ = settling(drive, code=1)
    assert daemon.stop_asked_at == 5.0 and PhaseState.SETTLING not in [s for _, s, _ in d.moves]


def test_a_shutdown_while_settling_leaves_the_phase_done(drive) -> None:
    # Its command had succeeded: done, as it would have been moments later (a next start resumes it).
    d, daemon, _ = settling(drive)
    lifecycle = SimpleNamespace(shutting_down=True)
    d.phase._lifecycle = lifecycle
    d.phase.shut_down()
    daemon.exit(None, 15)  # (the lifecycle stops every child)
    d.phase.end_after_shutdown()
    d.run_until(10.0)
    assert d.phase.state is PhaseState.DONE, d.moves


def test_the_settles_end_said_in_a_shutdowns_grace_leaves_the_phase_done(drive) -> None:
    # The real daemon serves on in its SIGINT grace, its extraction thread too: its end line can come then. The
    # shutdown, not the line, settles the phase (done); the line starts no stop of its own.
    d, daemon, _ = settling(drive)
    d.phase._lifecycle = SimpleNamespace(shutting_down=True)
    d.phase.shut_down()
    daemon.say("built the cache")
    assert d.phase.state is PhaseState.SETTLING and daemon.stop_asked_at is None
    daemon.exit(None, 15)
    d.phase.end_after_shutdown()
    d.run_until(10.0)
    assert d.phase.state is PhaseState.DONE, d.moves
