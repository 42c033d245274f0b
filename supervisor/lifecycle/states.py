"""A phase's states, every way it moves between them, and the words its one decision is made in.

``_ALLOWED`` is every move a phase can make: ``Phase.transition`` (supervisor/lifecycle/phase.py) refuses any
other; the diagram below is the same table drawn, and tests/test_phase_states.py walks every cell of it.

The decision itself is ``phase.decide``: it takes what happened to a phase (an ``Event``, below: its command
started, a child exited, a timer fired, its service came up, a watcher found it too slow, the supervisor
shuts down, ...) and returns a ``Step``: the state it moves to (if any), why, and the effects (``Effect``
and the records after it) the phase carries out around the move, as Pebble's servstate handlers do with
their one ``transition``. What comes after an attempt (done, retry, restart, fail: ``after_attempt``) and
how long a backoff is (``backoff_delay``) are pure rules, here beside the words; so is a phase's
``Timeline`` (when it started, came up, ended), which it notes at each move it tells.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
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
    SETTLING = "settling"  # the command succeeded; its daemons finish what it started (the settle hook)
    STOPPING = "stopping"  # the attempt is over; its children are being stopped
    BACKOFF = "backoff"  # waiting before the next attempt
    DONE = "done"  # completed (oneshot exit 0, or a service that ended cleanly)
    FAILED = "failed"  # failed for good
    STOPPED = "stopped"  # ended by a supervisor shutdown


# Every state a phase can be in and every way it moves; Phase.transition refuses any other.
#
#           +----------------------- next attempt ------------------------+
#           v                                                             |
#  PENDING -----> STARTING -----------------> RUNNING ---> SETTLING    BACKOFF ---> FAILED   deadline, our bug,
#   | | |  attempt   |    daemons ready,         |  settle    |          ^  |                 prepare refused
#   | | |            |    command started        |            |          |  +------> STOPPED  shutdown
#   | | |            |                           |            |          |
#   | | |            +-------> STOPPING <--------+------------+          |
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
# SETTLING: the command succeeded and the phase's settle hook reads in its daemons' output that they still do
# something the command started; they are kept until it reads that over, settle_timeout_s, the deadline, a stall or
# too_slow comes (the success stands), or a daemon dies or a watch finds a fault (that verdict ends the attempt).
#
# DONE, FAILED and STOPPED are final. A phase has no flag beside its state: a service that is up stays
# RUNNING to the outside while its attempt's record (supervisor/lifecycle/attempt.py) says when it came up; what
# else the lifecycle decides by (how far it got, the phases it holds at, a shutdown) is the
# Lifecycle's own record, by phase name.
_ALLOWED: dict[PhaseState, set[PhaseState]] = {
    PhaseState.PENDING: {PhaseState.STARTING, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.STARTING: {PhaseState.RUNNING, PhaseState.STOPPING},
    PhaseState.RUNNING: {PhaseState.SETTLING, PhaseState.STOPPING},
    PhaseState.SETTLING: {PhaseState.STOPPING},
    PhaseState.STOPPING: {PhaseState.BACKOFF, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.BACKOFF: {PhaseState.STARTING, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.DONE: set(),
    PhaseState.FAILED: set(),
    PhaseState.STOPPED: set(),
}
FINAL_STATES = frozenset({PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED})
# An attempt whose children are not being stopped.
ATTEMPT_RUNS = (PhaseState.STARTING, PhaseState.RUNNING, PhaseState.SETTLING)
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
    attempt's children; ``command``: the phase's command (else a daemon)."""

    verdict: Verdict
    asked: bool
    kept: bool
    ours: bool
    command: bool = False


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
class Settled:
    """The settle is over: its hook read that the daemons are done (``cut`` False), or its bound passed (True)."""

    why: str
    cut: bool = False


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
class AllStopped:
    """Every child of the run is stopped: the phase ends where it was (STOPPED, if it was not over)."""


Event = (Reached | Prepared | CommandStarted | CameUp | ChildExited | StartFailed | Aborted | DeadlinePassed
         | Settled | ChildrenStopped | FactsGathered | BackoffOver | Broken | StopAsked | AllStopped)


# ---------------------------------------------------------------- effects: what the phase carries out


class Effect(enum.Enum):
    """What a step asks of the phase beyond its move (those that carry a value are the classes below)."""

    PREPARE_FIRST = "run the memory preflight and the prepare hook, then say Prepared (first attempt)"
    PREPARE_AGAIN = "run the prepare hook, then say Prepared (a later attempt)"
    START_DEADLINE = "set timeout_s's timer, once, before the first attempt"
    NEW_ATTEMPT = "a new attempt's record, the phase's memory peak reset"
    WATCH_ATTEMPT = "the attempt's stall and progress watches"
    BEGIN_START = "start the attempt's daemons, then its command"
    CANCEL_START = "the attempt is over: start no more of its children; hear no more readiness answers"
    START_SETTLE = "settle_timeout_s's timer: Settled(cut) when it is up"
    CANCEL_SETTLE = "the settle's timer cancelled"
    KEEP_DAEMONS = "the daemons with lifetime = lifecycle live on into the later phases"
    STOP_CHILDREN = "stop the attempt's other children in reverse start order, then say ChildrenStopped"
    SWEEP = "forget the stopped children; kill what escaped into the phase's cgroup"
    CANCEL_TIMERS = "the deadline, backoff and settle timers cancelled"
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
    then ``after``; ``then``: the event that follows at once (a shutdown ends a running attempt in two moves)."""

    state: PhaseState | None = None
    why: str = ""
    before: tuple[Doing, ...] = ()
    after: tuple[Doing, ...] = ()
    then: Event | None = None


NOTHING = Step()


# ---------------------------------------------------------------- after an attempt: the rules


class Next(enum.Enum):
    DONE = "done"
    FAIL = "fail"  # for good
    AGAIN = "again"  # another attempt after a backoff (a oneshot's retry, a service's restart)


def after_attempt(spec: PhaseSpec, outcome: Verdict, attempt: int, *, deadline_expired: bool,
                  restart_times: list[float], now: float, forgiven: int = 0, never_up: int = 0,
                  found: int = 0) -> tuple[Next, str]:
    """What follows the attempt ``outcome`` ended, and why. ``restart_times``: when the service was
    restarted before (monotonic), against its restart_burst; ``forgiven``: a oneshot's attempts, this one
    among them, that got further and are not counted against its retries (retry_while_progressing);
    ``never_up``: a service's attempts in a row, this one among them, that never came up; ``found``: those in a
    row that a watch's finding ended (attempt.py ``Attempt.found_by_watch``)."""
    if outcome.reason in v.FOR_GOOD:  # a bug of ours, a GPU gone, too slow to make it: another attempt cannot succeed
        why = outcome.detail if outcome.reason == v.INTERNAL_ERROR else f"{outcome.reason}: {outcome.detail}"
        return Next.FAIL, why
    if spec.kind == "oneshot":
        return _retry_or_fail(spec, outcome, attempt, deadline_expired, forgiven)
    policy = spec.restart
    if policy == "no" or (policy == "on-failure" and outcome.success):
        if outcome.success:  # (its reason, exit_code, would read as a failure)
            return Next.DONE, f"service ended cleanly (restart = {policy!r})"
        return Next.FAIL, f"service ended: {outcome.reason} (restart = {policy!r})"
    if burst_exceeded(restart_times, now, spec.restart_burst, spec.restart_window_s):
        return Next.FAIL, (f"{outcome.reason}; restarted {spec.restart_burst} times within "
                           f"{spec.restart_window_s:g}s (restart_burst): giving up")
    # The window never trips for attempts each longer than window / burst (a ready wait of 900 s against 5 in
    # 300 s): a service that never comes up would be restarted for good. One that was up between its crashes is
    # judged by the window alone.
    if never_up > spec.restart_burst:
        return Next.FAIL, (f"{outcome.reason}; restarted {spec.restart_burst} times in a row without coming up "
                           "(restart_burst): giving up")
    # So for attempts a watch ends (a stall, NVML hung, a plugin's watch): each lives as long as its watch takes
    # to judge, minutes, and a fault a restart does not cure would be restarted for good, billed.
    if found > spec.restart_burst:
        return Next.FAIL, (f"{outcome.reason}; restarted {spec.restart_burst} times in a row, each attempt ended by "
                           "a watch's finding (restart_burst): giving up")
    return Next.AGAIN, f"{outcome.reason}; restart = {policy!r}"


def _retry_or_fail(spec: PhaseSpec, outcome: Verdict, attempt: int, deadline_expired: bool,
                   forgiven: int) -> tuple[Next, str]:
    if outcome.success:
        return Next.DONE, f"completed in {attempt} attempt(s)"
    if outcome.reason == v.TIMEOUT and deadline_expired:
        return Next.FAIL, f"{outcome.reason}: {outcome.detail}"
    if deadline_expired:  # it passed while the attempt was being stopped: no attempt after it
        return Next.FAIL, f"{outcome.reason}; the phase deadline timeout_s={spec.timeout_s:g} passed: no retry"
    counted = attempt - forgiven
    spared = f"{forgiven} attempt(s) that got further not counted" if forgiven else ""
    if counted > spec.retries:
        tries = "no retries configured" if not spec.retries else f"all {spec.retries} retries used"
        return Next.FAIL, f"{outcome.reason} ({tries}{'; ' + spared if spared else ''})"
    if spared:
        return Next.AGAIN, f"{outcome.reason}; {counted} of {spec.retries} retries used, {spared}"
    return Next.AGAIN, f"{outcome.reason}; retry {counted} of {spec.retries}"


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
    parsed: Any

    @property
    def name(self) -> str: ...

    @property
    def was_up(self) -> bool: ...


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


@dataclass
class Timeline:
    """When a phase left pending, first came up, came up this time (None while not up: the headline's "up 3h"
    counts from it), and reached its end: wall times, the phase's ``since``. What a later move says is kept; the
    first start and the first time up are never overwritten (a restarted service is the same phase, started
    once), and a phase resumed, refused or stopped before it ran never started."""

    started_at: float | None = None
    up_at: float | None = None
    up_since: float | None = None
    ended_at: float | None = None

    def note(self, state: PhaseState, since: float, up: bool, now: Callable[[], float]) -> None:
        """The phase is ``state`` since ``since`` (``up``: its service answers); ``now``: the clock of ``since``,
        read when it comes up (no move of its own: it stays running)."""
        if state is PhaseState.PENDING:
            return
        if state not in FINAL_STATES and self.started_at is None:
            self.started_at = since
        if up:
            if self.up_since is None:
                self.up_since = now()
            if self.up_at is None:
                self.up_at = self.up_since
        else:
            self.up_since = None
        if state in FINAL_STATES and self.ended_at is None:
            self.ended_at = since


@dataclass(frozen=True)
class ShutdownView:
    """The lifecycle is shutting down: why, with which status, what failed it, and whether production was ever up."""

    why: str
    status: int
    failure: Verdict | None  # the verdict that failed the lifecycle (masked); None: a stop, a completed run, ...
    production_was_up: bool  # the production service (``report = "running"``, else the last service) came up


class Deaf:
    """An observer that hears and does nothing: a place in ``Observers`` left empty, and the base of those
    that hear only some of it."""

    def phase_changed(self, phase: Any) -> None:
        pass

    def verdict(self, verdict: Verdict) -> None:
        pass

    def shutdown_began(self, view: ShutdownView) -> None:
        pass


NOBODY = Deaf()
