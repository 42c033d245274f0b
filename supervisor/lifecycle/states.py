"""A phase's states, every way it moves between them, and the one function that decides each move.

``decide`` takes what happened to a phase (an ``Event``: its command started, a child exited, a timer fired,
its service came up, a watcher found it too slow, the supervisor shuts down, ...) and returns a ``Step``: the
state it moves to (if any), why, and the effects the phase carries out around the move (start an attempt,
stop its children, back off, record its outcome, ...). It decides, and does nothing itself: the Phase
(supervisor/lifecycle/phase.py) gathers what an event is made of, asks, moves, and carries out the effects,
in the order the Step gives them, as Pebble's servstate handlers do with their one ``transition``.
``Phase.transition`` refuses any move not in ``_ALLOWED``; the diagram below is the same table drawn, and
tests/test_phase_states.py walks every cell of it.

What comes after an attempt (done, retry, restart, fail: ``after_attempt``) and how long a backoff is
(``backoff_delay``) are pure rules of their own, here beside the one that applies them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import verdict as v
from .verdict import Verdict

if TYPE_CHECKING:
    from ..config import PhaseSpec
    from ..engine.process import Child
    from .hooks import Refusal


class PhaseState(enum.StrEnum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # daemons being started and waited for
    RUNNING = "running"  # the command runs
    STOPPING = "stopping"  # the attempt is over; its children are being stopped
    BACKOFF = "backoff"  # waiting before the next attempt
    DONE = "done"  # completed (oneshot exit 0, or a service that ended cleanly)
    FAILED = "failed"  # failed for good
    STOPPED = "stopped"  # ended by a supervisor shutdown


# Every state a phase can be in and every way it moves; Phase.transition refuses any other.
#
#           +----------------------- next attempt ------------------------+
#           v                                                             |
#  PENDING -----> STARTING -----------------> RUNNING                  BACKOFF ---> FAILED   deadline, our bug,
#   | | |  attempt   |    daemons ready,         |                       ^  |                 prepare refused
#   | | |            |    command started        |                       |  +------> STOPPED  shutdown
#   | | |            |                           |                       |
#   | | |            +-------> STOPPING <--------+                       |
#   | | |   spawn failed, not    | | | |    the command or a daemon      |
#   | | |   ready, a daemon      | | | |    ended, deadline, stall,      |
#   | | |   died, deadline,      | | | |    shutdown, our bug            |
#   | | |   stall, shutdown,     | | | |                                 |
#   | | |   our bug              | | | +-------- retry / restart --------+
#   | | |                        | | +-----> DONE     it succeeded (a service: it ended cleanly)
#   | | |                        | +-------> FAILED   no retries left, restart_burst, deadline, our bug
#   | | |                        +---------> STOPPED  supervisor shutdown
#   | | +-----> DONE     resumed: done in an earlier run, and its evidence still holds
#   | +-------> FAILED   memory preflight, prepare refused, our bug
#   +---------> STOPPED  the supervisor shut down before the lifecycle reached it
#
# DONE, FAILED and STOPPED are final. A phase has no flag beside its state: a service that is up stays
# RUNNING to the outside while its attempt's record (supervisor/lifecycle/attempt.py) says when it came up; what
# else the lifecycle decides by (how far it got, the phases it holds at, a shutdown) is the
# Lifecycle's own record, by phase name.
_ALLOWED: dict[PhaseState, set[PhaseState]] = {
    PhaseState.PENDING: {PhaseState.STARTING, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.STARTING: {PhaseState.RUNNING, PhaseState.STOPPING},
    PhaseState.RUNNING: {PhaseState.STOPPING},
    PhaseState.STOPPING: {PhaseState.BACKOFF, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.BACKOFF: {PhaseState.STARTING, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.DONE: set(),
    PhaseState.FAILED: set(),
    PhaseState.STOPPED: set(),
}
FINAL_STATES = frozenset({PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED})
ATTEMPT_RUNS = (PhaseState.STARTING, PhaseState.RUNNING)  # an attempt whose children are not being stopped
# Why a phase ends or an attempt's children stop when the supervisor shuts down (every phase, the same words).
SHUTDOWN_WHY = "supervisor shutdown"


# ---------------------------------------------------------------- events: what can happen to a phase


@dataclass(frozen=True)
class Reached:
    """The lifecycle reached the phase, and resume answered: (why, what its parser read) when it need not
    run again (done in an earlier run, its evidence still holds), else None."""

    resumed: tuple[str, Any] | None


@dataclass(frozen=True)
class Prepared:
    """Before an attempt, the steps that may refuse it ran (the memory preflight before the ``first``, the
    prepare hook before each): ``refusal`` is why the phase cannot run, None when it can."""

    refusal: Refusal | None
    first: bool


@dataclass(frozen=True)
class CommandStarted:
    child: Child


@dataclass(frozen=True)
class CameUp:
    """The service's command answered its ready check (or has none)."""


@dataclass(frozen=True)
class ChildExited:
    """A child of the phase was reaped and judged; ``verdict`` is recorded. ``asked``: the supervisor had
    asked it to stop; ``kept``: a daemon kept for the rest of the lifecycle; ``ours``: one of the current
    attempt's children."""

    verdict: Verdict
    asked: bool
    kept: bool
    ours: bool


@dataclass(frozen=True)
class StartFailed:
    """The attempt's children could not all be started: spawn failed, a port was held, not ready in time."""

    verdict: Verdict


@dataclass(frozen=True)
class Aborted:
    """The supervisor ends the attempt: a stall, too slow, a watcher's finding (``reason``, ``detail``).
    ``command_running``: its command runs (its exit then says how it ended), else it is still at its daemons."""

    reason: str
    detail: str
    command_running: bool


@dataclass(frozen=True)
class DeadlinePassed:
    """timeout_s since the first attempt is up (the children's output read first, a freeze said)."""

    detail: str
    command_running: bool


@dataclass(frozen=True)
class ChildrenStopped:
    """Every child of the attempt that was stopping is gone (the kept daemons live on)."""


@dataclass(frozen=True)
class FactsGathered:
    """Resume's facts of a phase that is done are in (its output files listed off the loop)."""

    facts: dict[str, Any]
    why: str


@dataclass(frozen=True)
class BackoffOver:
    pass


@dataclass(frozen=True)
class Broken:
    """A bug of the supervisor's own while handling the phase: ``verdict`` says which (internal_error)."""

    verdict: Verdict


@dataclass(frozen=True)
class StopAsked:
    """The supervisor shuts down: no new attempt, no more of this one started (the lifecycle stops the children)."""


@dataclass(frozen=True)
class ShutdownSettled:
    """Every child of the run is stopped: the phase ends where it was (STOPPED, if it was not over)."""


Event = (Reached | Prepared | CommandStarted | CameUp | ChildExited | StartFailed | Aborted | DeadlinePassed
         | ChildrenStopped | FactsGathered | BackoffOver | Broken | StopAsked | ShutdownSettled)


# ---------------------------------------------------------------- effects: what the phase carries out


class Effect(enum.Enum):
    """What a step asks of the phase beyond its move (those that carry a value are the classes below)."""

    PREPARE_FIRST = "run the memory preflight and the prepare hook, then say Prepared (first attempt)"
    PREPARE_AGAIN = "run the prepare hook, then say Prepared (a later attempt)"
    START_DEADLINE = "set timeout_s's timer, once, before the first attempt"
    NEW_ATTEMPT = "a new attempt's record, the phase's memory peak reset"
    WATCH_ATTEMPT = "the attempt's stall and progress watches"
    BEGIN_START = "start the attempt's daemons, then its command"
    CANCEL_START = "start no more of the attempt's children; hear no more readiness answers"
    KEEP_DAEMONS = "the daemons with lifetime = lifecycle live on into the later phases"
    STOP_CHILDREN = "stop the attempt's other children in reverse start order, then say ChildrenStopped"
    SWEEP = "forget the stopped children; kill what escaped into the phase's cgroup"
    CANCEL_TIMERS = "the deadline and the backoff timers cancelled"
    RELEASE_MEMORY = "the phase's cgroup removed (unless daemons live on in it)"
    MARK_UP = "the attempt's service is up (the first time: the phase's too)"
    TELL_LIFECYCLE = "the lifecycle hears of the phase with no move (up, a kept daemon died)"


@dataclass(frozen=True)
class Resume:
    """Take what the last run learnt: ``parsed`` and the record's facts."""

    parsed: Any


@dataclass(frozen=True)
class Outcome:
    """``verdict`` ended the attempt (or refused the next one): recorded first where no child's exit did it
    (one without a pid), unless ``record`` is False (a verdict the record already holds)."""

    verdict: Verdict
    record: bool = True


@dataclass(frozen=True)
class MarkStopped:
    """The verdicts of the attempt's children about to be stopped say why (unless one already does)."""

    reason: str
    detail: str


@dataclass(frozen=True)
class MarkBroken:
    verdict: Verdict


@dataclass(frozen=True)
class BackOff:
    delay: float


@dataclass(frozen=True)
class GatherFacts:
    """Resume's facts of the attempt that succeeded (listed off the loop), then say FactsGathered(why)."""

    why: str


@dataclass(frozen=True)
class KeepFacts:
    facts: dict[str, Any]


Doing = Effect | Resume | Outcome | MarkStopped | MarkBroken | BackOff | GatherFacts | KeepFacts


@dataclass(frozen=True)
class Step:
    """What one event does: ``before`` carried out, then the move to ``state`` (None: no move) for ``why``,
    then ``after``; ``then``: the event that follows at once (a shutdown settles in two moves)."""

    state: PhaseState | None = None
    why: str = ""
    before: tuple[Doing, ...] = ()
    after: tuple[Doing, ...] = ()
    then: Event | None = None


NOTHING = Step()


class Deciding(Protocol):
    """What ``decide`` reads of a phase (supervisor.lifecycle.phase.Phase)."""

    spec: PhaseSpec
    state: PhaseState

    @property
    def name(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def outcome(self) -> Verdict | None: ...

    def shutting_down(self) -> bool: ...

    def broken(self) -> bool: ...

    def stop_over(self) -> bool: ...

    def command_verdict(self) -> Verdict | None: ...

    def next_after(self, outcome: Verdict) -> tuple[Next, str, float]: ...


def decide(phase: Deciding, event: Event) -> Step:
    """The one place a phase's moves are decided: what ``event`` does to ``phase`` now."""
    state, over = phase.state, phase.shutting_down()
    match event:
        case Reached(resumed):
            if state is not PhaseState.PENDING or over:
                return NOTHING  # the supervisor shut down while resume looked
            if resumed is not None:
                why, parsed = resumed
                return Step(PhaseState.DONE, f"resumed: {why}", before=(Resume(parsed),))
            return Step(after=(Effect.PREPARE_FIRST,))
        case Prepared(refusal, first):
            if refusal is not None:
                return _fail(v.without_exit(phase.name, phase.name, refusal.reason, 1, refusal.detail,
                                            attempt=phase.attempt), refusal.detail)
            setup = (Effect.START_DEADLINE, Effect.NEW_ATTEMPT) if first else (Effect.NEW_ATTEMPT,)
            return Step(PhaseState.STARTING, f"attempt {phase.attempt + 1}", before=setup,
                        after=(Effect.WATCH_ATTEMPT, Effect.BEGIN_START))
        case CommandStarted(child):
            return Step(PhaseState.RUNNING, f"{child.label} pid {child.pid}")
        case CameUp():
            return Step(after=(Effect.MARK_UP, Effect.TELL_LIFECYCLE))
        case ChildExited(verdict, asked, kept, ours):
            if asked or over:
                return NOTHING  # we asked for this; the stop in progress takes it from here
            if kept:
                return Step(after=(Effect.TELL_LIFECYCLE,))  # a kept daemon died: the lifecycle decides
            return _end_attempt(phase, verdict) if ours else NOTHING
        case StartFailed(verdict):
            return _end_attempt(phase, verdict)
        case Aborted(reason, detail, command_running):
            return _abort(phase, reason, detail, command_running)
        case DeadlinePassed(detail, command_running):
            if state in FINAL_STATES or over:
                return NOTHING
            if state is PhaseState.BACKOFF:
                return _fail(v.without_exit(phase.name, phase.name, v.TIMEOUT, 1, detail, attempt=phase.attempt),
                             detail)
            return _abort(phase, v.TIMEOUT, detail, command_running)  # in STOPPING its outcome decides
        case ChildrenStopped():
            return _after_the_stop(phase) if state is PhaseState.STOPPING else NOTHING
        case FactsGathered(facts, why):
            if state is not PhaseState.STOPPING or over:
                return NOTHING  # the supervisor shut down meanwhile: the shutdown settles the phase
            return Step(PhaseState.DONE, why, before=(KeepFacts(facts), Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))
        case BackoffOver():
            return Step(after=(Effect.PREPARE_AGAIN,)) if state is PhaseState.BACKOFF and not over else NOTHING
        case Broken(verdict):
            return _broken(phase, verdict)
        case StopAsked():
            return Step(after=(Effect.CANCEL_TIMERS, Effect.CANCEL_START))
        case ShutdownSettled():
            if state in ATTEMPT_RUNS:
                return Step(PhaseState.STOPPING, SHUTDOWN_WHY, then=ShutdownSettled())
            return NOTHING if state in FINAL_STATES else Step(PhaseState.STOPPED, SHUTDOWN_WHY)
    raise TypeError(f"not a phase event: {event!r}")  # pragma: no cover - the match covers Event


def _end_attempt(phase: Deciding, outcome: Verdict | None, why: str = "", first: tuple[Doing, ...] = ()) -> Step:
    """The attempt is over: stop its children (reverse start order); ``ChildrenStopped`` then decides."""
    if phase.state not in ATTEMPT_RUNS:
        return NOTHING
    before: tuple[Doing, ...] = (*first, Effect.CANCEL_START)
    if outcome is not None:
        before += (Outcome(outcome),)
        if outcome.success and phase.spec.kind == "oneshot":
            before += (Effect.KEEP_DAEMONS,)  # the phase succeeded: its lifecycle daemons live on
    return Step(PhaseState.STOPPING, why or (outcome.detail if outcome else ""), before=before,
                after=(Effect.STOP_CHILDREN,))


def _abort(phase: Deciding, reason: str, detail: str, command_running: bool) -> Step:
    """The supervisor ends the attempt: the verdicts of its children say why. A command that runs says how
    it ended by its exit; an attempt still at its daemons ends with a verdict of its own."""
    if phase.state not in ATTEMPT_RUNS:
        return NOTHING
    first = (MarkStopped(reason, detail),)
    if command_running:
        return _end_attempt(phase, None, detail, first)
    return _end_attempt(phase, v.without_exit(phase.name, phase.name, reason, 1, detail, attempt=phase.attempt),
                        first=first)


def _after_the_stop(phase: Deciding) -> Step:
    """The attempt's children are stopped: what ended it decides what comes next (after_attempt)."""
    outcome = phase.outcome or phase.command_verdict()  # the supervisor ended it: the command's verdict says how
    if outcome is None:  # pragma: no cover - the command is always reaped before this point
        outcome = v.without_exit(phase.name, phase.name, v.TIMEOUT, 1, "deadline", attempt=phase.attempt)
    swept = (Effect.SWEEP,) if phase.outcome is not None else (Effect.SWEEP, Outcome(outcome, record=False))
    if phase.shutting_down():
        return Step(PhaseState.STOPPED, SHUTDOWN_WHY, before=swept)
    step, why, delay = phase.next_after(outcome)
    if step is Next.DONE:
        return Step(before=swept, after=(GatherFacts(why),))
    if step is Next.FAIL:
        return Step(PhaseState.FAILED, why, before=(*swept, Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))
    return Step(PhaseState.BACKOFF, f"{why}; next attempt in {delay:.2f}s", before=swept, after=(BackOff(delay),))


def _fail(verdict: Verdict, why: str) -> Step:
    """The supervisor's own finding (memory preflight, prepare, the deadline in a backoff) fails the phase for
    good: recorded as its outcome, since no child's exit says it."""
    return Step(PhaseState.FAILED, why, before=(Outcome(verdict), Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))


def _broken(phase: Deciding, verdict: Verdict) -> Step:
    """A bug of ours fails the phase for good (retrying would only hide it). Its children are stopped on
    purpose, so their verdicts read ``stopped``: it is not their failure."""
    state = phase.state
    if state in FINAL_STATES or phase.broken() or phase.shutting_down():
        return NOTHING  # failed already, or the shutdown ends it anyway: the fault's log line is all
    marked = (MarkBroken(verdict),)
    if state in ATTEMPT_RUNS:
        return _end_attempt(phase, verdict, first=(*marked, MarkStopped(v.STOPPED, verdict.detail)))
    if state is PhaseState.STOPPING and not phase.stop_over():
        return Step(before=(*marked, Outcome(verdict)))  # the stop in progress ends, and sees the outcome
    return Step(PhaseState.FAILED, verdict.detail,
                before=(*marked, Outcome(verdict), Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))


# ---------------------------------------------------------------- after an attempt: the rules


class Next(enum.Enum):
    DONE = "done"
    FAIL = "fail"  # for good
    AGAIN = "again"  # another attempt after a backoff (a oneshot's retry, a service's restart)


def after_attempt(spec: PhaseSpec, outcome: Verdict, attempt: int, *, deadline_expired: bool,
                  restart_times: list[float], now: float) -> tuple[Next, str]:
    """What follows the attempt ``outcome`` ended, and why. ``restart_times``: when the service was
    restarted before (monotonic), against its restart_burst."""
    if outcome.reason in v.FOR_GOOD:  # a bug of ours, a GPU gone: another attempt cannot succeed
        why = outcome.detail if outcome.reason == v.INTERNAL_ERROR else f"{outcome.reason}: {outcome.detail}"
        return Next.FAIL, why
    if spec.kind == "oneshot":
        return _retry_or_fail(spec, outcome, attempt, deadline_expired)
    policy = spec.restart
    if policy == "no" or (policy == "on-failure" and outcome.success):
        return Next.DONE if outcome.success else Next.FAIL, f"service ended: {outcome.reason} (restart = {policy!r})"
    if burst_exceeded(restart_times, now, spec.restart_burst, spec.restart_window_s):
        return Next.FAIL, (f"{outcome.reason}; restarted {spec.restart_burst} times within "
                           f"{spec.restart_window_s:g}s (restart_burst): giving up")
    return Next.AGAIN, f"{outcome.reason}; restart = {policy!r}"


def _retry_or_fail(spec: PhaseSpec, outcome: Verdict, attempt: int, deadline_expired: bool) -> tuple[Next, str]:
    if outcome.success:
        return Next.DONE, f"completed in {attempt} attempt(s)"
    if outcome.reason == v.TIMEOUT and deadline_expired:
        return Next.FAIL, f"{outcome.reason}: {outcome.detail}"
    if attempt > spec.retries:
        tries = "no retries configured" if not spec.retries else f"all {spec.retries} retries used"
        return Next.FAIL, f"{outcome.reason} ({tries})"
    return Next.AGAIN, f"{outcome.reason}; retry {attempt} of {spec.retries}"


def backoff_delay(failures: int, base: float, factor: float, cap: float, jitter: float, rand: float) -> float:
    """Seconds to wait before the next try after ``failures`` consecutive failures (1, 2, ...).

    base × factor^(failures-1), capped at ``cap``, then spread by ±``jitter``
    (a fraction) using ``rand`` in [0, 1) so that a fleet restarted together
    does not retry in lockstep. Never negative, never above ``cap``.
    """
    if failures < 1:
        return 0.0
    exponent = min(failures - 1, 64)  # beyond this the cap has long won; avoid float overflow
    raw = min(cap, base * factor**exponent)
    spread = raw * jitter * (2.0 * rand - 1.0)
    return max(0.0, min(cap, raw + spread))


def within_window(times: Iterable[float], now: float, window: float) -> list[float]:
    """The times that fall inside the last ``window`` seconds before ``now``."""
    return [t for t in times if now - t < window]


def burst_exceeded(restart_times: Iterable[float], now: float, burst: int, window: float) -> bool:
    """True when ``burst`` restarts already happened inside the window: no more restarts."""
    return len(within_window(restart_times, now, window)) >= burst


# ---------------------------------------------------------------- what others are shown of a phase


class PhaseLike(Protocol):
    """What a PhaseView is made from (supervisor.lifecycle.phase.Phase)."""

    spec: Any  # its PhaseSpec: kind, report
    state: PhaseState
    why: str
    attempt: int
    up: bool
    was_up: bool
    parsed: Any

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class PhaseView:
    """A phase as a listener sees it at one transition: a copy, so nothing of the phase can be changed."""

    name: str
    kind: str  # "oneshot" | "service"
    state: PhaseState
    why: str
    attempt: int
    up: bool  # a service whose command runs and answered its ready check
    was_up: bool
    report: str | None  # the phase's ``report`` key: the manager call it triggers
    parsed: Any  # what its output parser read (None: no parser, or not run yet)

    @classmethod
    def of(cls, phase: PhaseLike) -> PhaseView:
        return cls(phase.name, phase.spec.kind, phase.state, phase.why, phase.attempt, phase.up, phase.was_up,
                   phase.spec.report, phase.parsed)


@dataclass(frozen=True)
class ShutdownView:
    """The lifecycle is shutting down: why, with which status, what failed it, and whether production was ever up."""

    why: str
    status: int
    failure: Verdict | None  # the verdict that failed the lifecycle (masked); None: a stop, a completed run, ...
    production_was_up: bool  # the production service (``report = "running"``, else the last service) came up
