"""The phase's transition table, in-process: every allowed transition works, every other raises.

Pure: a real Phase on a real Runtime, but no child is started and the loop never runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.config import parse_plan
from supervisor.engine.logs import Console
from supervisor.engine.loop import EventLoop
from supervisor.engine.reaping import Reaper
from supervisor.lifecycle.attempt import Attempt
from supervisor.lifecycle.phase import Phase, decide
from supervisor.lifecycle.runtime import ChildKit, Runtime
from supervisor.lifecycle.states import _ALLOWED, FINAL_STATES, SHUTDOWN_WHY, CameUp, Effect, PhaseState, StopAsked

SERVICE = """
[[phases]]
name = "svc"
kind = "service"
command = ["true"]
"""

ALL_PAIRS = list(itertools.product(PhaseState, PhaseState))


class Seen:
    """What the phase told: its log lines and every phase it reported changed."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changes: list[PhaseState] = []


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def phase(tmp_path: Path, seen: Seen) -> Iterator[Phase]:
    loop = EventLoop()
    rt = Runtime.of(ChildKit(loop=loop, reaper=Reaper(lambda pid, status: None), console=Console(enabled=False),
                             log=seen.lines.append, log_dir=tmp_path, ring_lines=10, log_file_max_bytes=4096,
                             base_env={}))
    spec = parse_plan(SERVICE, "test.toml", {}).phases[0]
    yield Phase(spec, rt, lambda p: seen.changes.append(p.state))
    loop.close()


@pytest.mark.parametrize(("old", "new"), [p for p in ALL_PAIRS if p[1] in _ALLOWED[p[0]]],
                         ids=lambda s: str(s))
def test_an_allowed_transition_moves_the_phase_logs_it_and_tells_the_lifecycle(
        phase: Phase, seen: Seen, old: PhaseState, new: PhaseState) -> None:
    phase.state = old
    phase.transition(new, "because")
    assert phase.state is new
    assert phase.why == "because"
    assert seen.changes == [new]
    assert seen.lines == [f"phase svc: {old} → {new} (because)"]


@pytest.mark.parametrize(("old", "new"), [p for p in ALL_PAIRS if p[1] not in _ALLOWED[p[0]]],
                         ids=lambda s: str(s))
def test_any_other_transition_raises_and_changes_nothing(
        phase: Phase, seen: Seen, old: PhaseState, new: PhaseState) -> None:
    phase.state, why, since = old, phase.why, phase.since
    with pytest.raises(RuntimeError, match=f"no transition {old} → {new}"):
        phase.transition(new, "because")
    assert (phase.state, phase.why, phase.since) == (old, why, since)
    assert seen.changes == [] and seen.lines == []


def test_the_final_states_are_the_ones_without_a_way_out() -> None:
    assert set(_ALLOWED) == set(PhaseState)
    assert {s for s, out in _ALLOWED.items() if not out} == FINAL_STATES


def reachable(start: PhaseState) -> set[PhaseState]:
    """Every state a phase in ``start`` can come to, ``start`` included."""
    found, todo = {start}, [start]
    while todo:
        for new in _ALLOWED[todo.pop()] - found:
            found.add(new)
            todo.append(new)
    return found


def test_every_state_is_reachable_from_pending_and_can_reach_an_end() -> None:
    assert reachable(PhaseState.PENDING) == set(PhaseState)
    for state in set(PhaseState) - FINAL_STATES:
        assert reachable(state) & FINAL_STATES, f"{state} can never end"


def test_a_service_is_up_only_while_it_runs(phase: Phase) -> None:
    """``up`` follows the state: any move away from RUNNING clears it (the lifecycle reads it)."""
    phase.state = PhaseState.STARTING
    phase.transition(PhaseState.RUNNING, "command started")
    assert phase.up is False and phase.was_up is False  # running, not yet up (its ready check)
    phase._on(CameUp())  # what its ready check passing tells the phase
    assert phase.up is True and phase.was_up is True
    phase.transition(PhaseState.STOPPING, "it exited")
    assert phase.up is False
    assert phase.was_up is True


def test_a_callback_acts_only_for_the_current_attempt_in_the_states_it_names(phase: Phase) -> None:
    phase._attempt, phase.state = Attempt(2, started=0.0), PhaseState.RUNNING
    assert phase._is_current(2, PhaseState.STARTING, PhaseState.RUNNING)
    assert not phase._is_current(1, PhaseState.STARTING, PhaseState.RUNNING)  # a late answer for attempt 1
    assert not phase._is_current(2, PhaseState.STARTING)  # the attempt has moved on


class _ShuttingDown:
    shutting_down = True


@pytest.mark.parametrize("state", [PhaseState.STARTING, PhaseState.RUNNING])
def test_a_shutdown_shows_a_running_attempt_stopping_at_once(phase: Phase, state: PhaseState) -> None:
    """Told of the shutdown, an attempt that runs is stopping from then on, not once its last child is gone: a
    daemon taking its grace kept it "running" (and up) long after its command was reaped."""
    phase.state = state
    phase._lifecycle = _ShuttingDown()  # type: ignore[assignment]
    step = decide(phase, StopAsked())
    assert (step.state, step.why) == (PhaseState.STOPPING, SHUTDOWN_WHY)
    assert step.after == (Effect.CANCEL_TIMERS, Effect.CANCEL_START)


@pytest.mark.parametrize("state", [s for s in PhaseState if s not in (PhaseState.STARTING, PhaseState.RUNNING)])
def test_a_shutdown_moves_no_other_state_when_it_is_told(phase: Phase, state: PhaseState) -> None:
    """A settling phase's command succeeded (AllStopped keeps that); the others are stopping or over."""
    phase.state = state
    phase._lifecycle = _ShuttingDown()  # type: ignore[assignment]
    assert decide(phase, StopAsked()).state is None
