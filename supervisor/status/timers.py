"""The status view's clocks: what each running timer has left, and when each phase started and ended.

Read, never set. A phase's timers are its pacing's (the deadline, the backoff, the latest attempt's stall
watch: attempt.py's Pacing), its attempt's start (the readiness wait under way: attempt.py) and the lifecycle's hold on
it (the bench gate counts down through ``Lifecycle.hold(..., for_s=)``); a child being stopped has its grace
before SIGKILL (``Child.kill_at``). They all run on the loop's monotonic clock, so what is shown is seconds
(left, waited, silent), counted from the ``now`` handed in: pure functions, tested in-process.

The timeline (when each phase left pending, came up, ended: wall time) is not the phase's business: a
lifecycle listener, ``Timeline``, notes it from the transitions it hears.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..lifecycle.states import ATTEMPT_RUNS, FINAL_STATES, Deaf, PhaseState
from .model import DeadlineTimer, LeftTimer, ReadyTimer, StallTimer, StopTimer, Timers


class StallWatchView(Protocol):
    def last_sign(self) -> float: ...

    def ages(self, now: float) -> dict[str, float]: ...


class StallView(Protocol):
    @property
    def watch(self) -> StallWatchView: ...


class PacingView(Protocol):
    @property
    def deadline_at(self) -> float | None: ...

    @property
    def backoff_until(self) -> float | None: ...

    @property
    def stall(self) -> StallView | None: ...


class ReadySpec(Protocol):
    ready_timeout_s: float


class WaitedChild(Protocol):
    label: str
    spec: ReadySpec


class StartView(Protocol):
    @property
    def waiting(self) -> tuple[WaitedChild, float] | None: ...


class AttemptView(Protocol):
    start: StartView | None


class TimedSpec(Protocol):
    timeout_s: float | None
    stall_s: float | None


class TimedPhase(Protocol):
    name: str
    spec: TimedSpec
    since: float
    up: bool

    @property
    def state(self) -> object: ...

    @property
    def pacing(self) -> PacingView: ...

    @property
    def current_attempt(self) -> AttemptView: ...


def _secs(value: float) -> float:
    return round(max(0.0, value), 1)


def phase_timers(phase: TimedPhase, hold_ends: float | None, now: float) -> Timers:
    """The timers running for ``phase`` at monotonic ``now``: ``deadline`` (timeout_s), ``backoff`` (to the
    next attempt), ``stall`` (silence so far against stall_s), ``ready`` (the readiness wait under way against
    its ready_timeout_s), ``hold`` (the lifecycle held at it, the bench gate's time left). Only those running."""
    state, spec, pacing = phase.state, phase.spec, phase.pacing
    if state in FINAL_STATES and hold_ends is None:
        return Timers()
    deadline_at, backoff_until, stall = pacing.deadline_at, pacing.backoff_until, pacing.stall
    deadline = DeadlineTimer(limit_s=spec.timeout_s, left_s=_secs(deadline_at - now)) \
        if deadline_at is not None and spec.timeout_s is not None and state not in FINAL_STATES else None
    backoff = LeftTimer(left_s=_secs(backoff_until - now)) \
        if state is PhaseState.BACKOFF and backoff_until is not None else None
    stalled = None
    if state in ATTEMPT_RUNS and stall is not None and spec.stall_s is not None:
        silent = now - stall.watch.last_sign()
        stalled = StallTimer(limit_s=spec.stall_s, silent_s=_secs(silent), left_s=_secs(spec.stall_s - silent),
                             signs={what: _secs(age) for what, age in stall.watch.ages(now).items()})
    start = phase.current_attempt.start
    waiting = start.waiting if start is not None and state in ATTEMPT_RUNS else None
    ready = None
    if waiting is not None:
        child, since = waiting
        limit = child.spec.ready_timeout_s
        ready = ReadyTimer(child=child.label, limit_s=limit, waited_s=_secs(now - since),
                           left_s=_secs(limit - (now - since)))
    hold = LeftTimer(left_s=_secs(hold_ends - now)) if hold_ends is not None else None
    return Timers(deadline=deadline, backoff=backoff, stall=stalled, ready=ready, hold=hold)


class StoppedChild(Protocol):
    @property
    def kill_at(self) -> float | None: ...


def stop_timer(child: StoppedChild, grace_s: float, now: float) -> StopTimer | None:
    """A child being stopped: its grace (stop_grace_s, or what a stop budget left of it) and how long until SIGKILL;
    None when not in its grace."""
    kill_at = child.kill_at
    if kill_at is None:
        return None
    return StopTimer(grace_s=grace_s, kill_in_s=_secs(kill_at - now))


class Timeline(Deaf):
    """When each phase left pending, came up and reached its end (wall time, the phase's ``since``), by name.

    An observer of every transition (``phase_changed``); what a later transition says is kept, the first start and
    the first time up are not overwritten (a service restarted is the same phase, started once). ``up_since`` is
    the one that moves: when the attempt up now came up (the headline's "up 3h"), None while it is not up."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now  # the loop's wall clock, the one a phase's ``since`` is read on
        self._started: dict[str, float] = {}
        self._up: dict[str, float] = {}
        self._up_since: dict[str, float] = {}  # while it is up: when this attempt came up (a restart starts it anew)
        self._ended: dict[str, float] = {}

    def phase_changed(self, phase: TimedPhase) -> None:
        if phase.state is PhaseState.PENDING:
            return
        if phase.state not in FINAL_STATES:  # (resumed, refused or stopped before it ran: it never started)
            self._started.setdefault(phase.name, phase.since)
        if phase.up:
            now = self._now()  # (no move of its own: it stays running)
            self._up.setdefault(phase.name, now)
            self._up_since.setdefault(phase.name, now)
        else:
            self._up_since.pop(phase.name, None)
        if phase.state in FINAL_STATES:
            self._ended.setdefault(phase.name, phase.since)

    def of(self, name: str) -> dict[str, float | None]:
        return {"started_at": self._started.get(name), "up_at": self._up.get(name),
                "up_since": self._up_since.get(name), "ended_at": self._ended.get(name)}
