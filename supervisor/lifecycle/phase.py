"""A phase: one step of the lifecycle, an explicit state machine, and the one function that decides its moves.

A phase runs in attempts (each a record of its own: attempt.py): its daemons one by one (each
waited for until ready), then its command, until the command exits, a daemon dies, a deadline
passes, the phase stalls or the supervisor shuts down. Its children are then stopped in reverse
start order, and the verdict that ended the attempt decides what comes next (its timers: ``Pacing``, attempt.py).

Two parts, as tini's loop is one readable loop of small steps:

- ``decide`` (first below) is the only place a phase's moves are decided: it takes what happened (an
  ``Event``: states.py names them all) and the phase as it is, and returns a ``Step``: the state it moves
  to, why, and the effects to carry out around the move. It only reads, but for two acts of bookkeeping: the
  pacing counts a restart and draws the backoff's jitter; a shutdown's first judgement (``failed_for_good``) holds.
- The ``Phase`` is the loop's side: each callback that reaches it (a child reaped, a timer, a readiness
  answer, a watcher's finding) gathers what happened into an event; ``_on`` asks ``decide``, carries out
  the step's effects before the move, moves (``transition``, which refuses a move not in the table and
  tells the lifecycle), and carries out those after, in the step's order (``_carry_out``).

A late callback must never act on a newer attempt: the settle's read and the watches check ``_is_current``;
the backoff's and the deadline's timers are Pacing's, and each checks the state it needs. Beyond running
children (writing a config, judging the output) a phase has its hooks, told only a HookContext. It reads the
loop's clock and starts children through ``spawn``: tests fake both. To add an event: docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..config import ChildSpec, PhaseSpec
from ..engine.loop import ErrorHandler, contained
from ..engine.process import Child, stop_in_order
from ..engine.reaping import ExitStatus
from ..engine.spawn import SpawnError
from ..engine.trees import kill_pids
from ..exits import EXIT_INTERNAL_ERROR
from ..text.show import summary
from . import resume
from . import verdict as v
from .attempt import Attempt, AttemptStart, ItsLifecycle, Pacing, Settle, Watched
from .children import ChildContext, Spawn, start_child
from .hooks import NO_HOOKS, HookContext, PhaseHooks, Refusal, memory_preflight
from .runtime import PhaseSurroundings, Runtime
from .states import (
    _ALLOWED,
    ATTEMPT_RUNS,
    FINAL_STATES,
    NOTHING,
    SHUTDOWN_WHY,
    Aborted,
    AllStopped,
    BackOff,
    BackoffOver,
    Broken,
    CameUp,
    ChildExited,
    ChildrenStopped,
    CommandStarted,
    DeadlinePassed,
    Doing,
    Effect,
    Event,
    FactsGathered,
    GatherFacts,
    KeepFacts,
    MarkBroken,
    MarkStopped,
    Next,
    Outcome,
    PhaseState,
    Prepared,
    Reached,
    Resume,
    Settled,
    StartFailed,
    Step,
    StopAsked,
    Timeline,
)

# How long a daemon found dying as its phase's command fails is waited for, so that its death decides the
# attempt (``_reap_dying_daemons``): the kernel frees its memory before it is reaped, seconds for a daemon of
# 100 GiB; one still not gone by then is decided after the command, as before.
DYING_DAEMON_WAIT_S = 2.0


def decide(phase: Phase, event: Event) -> Step:
    """The one place a phase's moves are decided: what ``event`` does to ``phase`` now (the Step to carry out)."""
    state, shutdown = phase.state, phase.shutting_down()
    match event:
        case Reached(resumed):
            if state is not PhaseState.PENDING or shutdown:
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
            if state is not PhaseState.RUNNING:
                return NOTHING  # the attempt ended while its readiness was being answered
            return Step(after=(Effect.MARK_UP, Effect.TELL_LIFECYCLE))
        case ChildExited(verdict, asked, kept, ours, command):
            if asked or shutdown:
                return NOTHING  # we asked for this; the stop in progress takes it from here
            if kept:
                return Step(after=(Effect.TELL_LIFECYCLE,))  # a kept daemon died: the lifecycle decides
            if not ours:
                return NOTHING
            if command and verdict.success and state is PhaseState.RUNNING \
                    and (waiting := phase.settle_pending()) is not None:  # its success stands unless a daemon dies
                return Step(PhaseState.SETTLING, waiting, before=(Outcome(verdict, record=False),),
                            after=(Effect.START_SETTLE,))
            return _end_attempt(phase, verdict)  # (in SETTLING, a daemon's death: it ends the attempt)
        case StartFailed(verdict):
            return _end_attempt(phase, verdict)
        case Aborted(reason, detail, command_running):
            if shutdown:
                return NOTHING  # a watch's finding in the stop's grace: the shutdown ends the attempt, not it
            if state is PhaseState.SETTLING and reason in v.TIMED_OUT:  # (a silent daemon: the command succeeded)
                return _end_attempt(phase, phase.outcome, f"{detail}; {phase.settle_cut_short()}")
            return _abort(phase, reason, detail, command_running)
        case DeadlinePassed(detail, command_running):
            if state in FINAL_STATES or shutdown:
                return NOTHING
            if state is PhaseState.BACKOFF:
                return _fail(v.without_exit(phase.name, phase.name, v.TIMEOUT, 1, detail, attempt=phase.attempt),
                             detail)
            if state is PhaseState.SETTLING:  # the command succeeded in time: its success stands
                return _end_attempt(phase, phase.outcome, f"{detail}; {phase.settle_cut_short()}")
            return _abort(phase, v.TIMEOUT, detail, command_running)  # in STOPPING its outcome decides
        case Settled(why, cut):
            if state is not PhaseState.SETTLING or shutdown:
                return NOTHING  # a daemon died or the deadline passed first; the shutdown ends it (done)
            return _end_attempt(phase, phase.outcome, f"{why}; {phase.settle_cut_short()}" if cut else why)
        case ChildrenStopped():
            return _after_the_stop(phase) if state is PhaseState.STOPPING else NOTHING
        case FactsGathered(facts, why):
            if state is not PhaseState.STOPPING:
                return NOTHING  # the shutdown ended it first (its outputs were still being listed)
            return Step(PhaseState.DONE, why, before=(KeepFacts(facts), Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))
        case BackoffOver():
            if state is not PhaseState.BACKOFF or shutdown or phase.pacing.deadline_expired():
                return NOTHING  # (past the deadline, after a freeze: its own timer, due too, fails the phase)
            return Step(after=(Effect.PREPARE_AGAIN,))
        case Broken(verdict):
            return _broken(phase, verdict)
        case StopAsked():  # an attempt under way is stopping from the shutdown's first signal, not its last child's
            moved = state in (PhaseState.STARTING, PhaseState.RUNNING)  # (SETTLING: AllStopped keeps its success)
            return Step(PhaseState.STOPPING if moved else None, SHUTDOWN_WHY if moved else "",
                        after=(Effect.CANCEL_TIMERS, Effect.CANCEL_START))
        case AllStopped():
            if state is PhaseState.SETTLING:  # its command had succeeded: done, as it would have been moments later
                return Step(PhaseState.STOPPING, SHUTDOWN_WHY, before=(Effect.CANCEL_SETTLE,), after=(
                    Effect.SWEEP, GatherFacts(f"completed in {phase.attempt} attempt(s) (then {SHUTDOWN_WHY})")))
            if state in ATTEMPT_RUNS:
                return Step(PhaseState.STOPPING, SHUTDOWN_WHY, then=AllStopped())
            if state is PhaseState.STOPPING and (failed := phase.failed_for_good()) is not None:
                return _fail_in_the_shutdown(failed)
            if state is PhaseState.STOPPING and phase.completed() and phase.stop_over():
                return NOTHING  # its facts are being gathered (its outputs listed): FactsGathered makes it done
            return NOTHING if state in FINAL_STATES else Step(PhaseState.STOPPED, SHUTDOWN_WHY)
    raise TypeError(f"not a phase event: {event!r}")  # pragma: no cover - the match covers Event


def _end_attempt(phase: Phase, outcome: v.Verdict | None, why: str = "", first: tuple[Doing, ...] = ()) -> Step:
    """The attempt is over: stop its children (reverse start order); ``ChildrenStopped`` then decides."""
    if phase.state not in ATTEMPT_RUNS:
        return NOTHING
    before: tuple[Doing, ...] = (*first, Effect.CANCEL_START)
    if phase.state is PhaseState.SETTLING:
        before += (Effect.CANCEL_SETTLE,)
    if outcome is not None:
        before += (Outcome(outcome),)
        if outcome.success and phase.spec.kind == "oneshot":
            before += (Effect.KEEP_DAEMONS,)  # the phase succeeded: its lifecycle daemons live on
    return Step(PhaseState.STOPPING, why or (outcome.detail if outcome else ""), before=before,
                after=(Effect.STOP_CHILDREN,))


def _abort(phase: Phase, reason: str, detail: str, command_running: bool) -> Step:
    """The supervisor ends the attempt: the verdicts of its children say why. A command that runs says how
    it ended by its exit; an attempt still at its daemons ends with a verdict of its own."""
    if phase.state not in ATTEMPT_RUNS:
        return NOTHING
    first = (MarkStopped(reason, detail),)
    if command_running:
        return _end_attempt(phase, None, detail, first)
    return _end_attempt(phase, v.without_exit(phase.name, phase.name, reason, 1, detail, attempt=phase.attempt,
                                              added=phase.reasons), first=first)


def _after_the_stop(phase: Phase) -> Step:
    """The attempt's children are stopped: what ended it decides what comes next (after_attempt)."""
    outcome, record = phase.outcome, False
    if outcome is None:  # the supervisor ended it: its exit says how (recorded as it was reaped)
        outcome = phase.command_verdict()
    if outcome is None:  # it survived SIGKILL past the wait (uninterruptible sleep): the stop's own why says how
        outcome, record = phase.never_reaped(), True
    swept = (Effect.SWEEP, Outcome(outcome, record))
    if phase.shutting_down():
        if (failed := phase.failed_for_good()) is not None:
            return Step(PhaseState.FAILED, _fail_in_the_shutdown(failed).why, before=swept)
        if phase.completed():
            # Its command had completed when the shutdown came during its daemons' stop: done, as it would have
            # been moments later, its facts kept (a next start resumes it: a passing bench is not run again).
            return Step(before=swept, after=(GatherFacts(f"completed in {phase.attempt} attempt(s) "
                                                         f"(then {SHUTDOWN_WHY})"),))
        return Step(PhaseState.STOPPED, SHUTDOWN_WHY, before=swept)
    step, why, delay = phase.next_after(outcome)
    if step is Next.DONE:
        return Step(before=swept, after=(GatherFacts(why),))
    if step is Next.FAIL:
        return Step(PhaseState.FAILED, why, before=(*swept, Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))
    return Step(PhaseState.BACKOFF, f"{why}; backoff {delay:.2f}s", before=swept, after=(BackOff(delay),))


def _fail_in_the_shutdown(outcome: v.Verdict) -> Step:
    """The attempt had failed for good (no retry or restart would follow) when a shutdown came during its stop:
    the phase fails, as it would have moments later, and its failure is the run's (lifecycle.shutdown)."""
    return Step(PhaseState.FAILED, f"{outcome.reason}: {outcome.detail} (then {SHUTDOWN_WHY})",
                before=(Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))


def _fail(verdict: v.Verdict, why: str) -> Step:
    """The supervisor's own finding (memory preflight, prepare, the deadline in a backoff) fails the phase for
    good: recorded as its outcome, since no child's exit says it."""
    return Step(PhaseState.FAILED, why, before=(Outcome(verdict), Effect.CANCEL_TIMERS, Effect.RELEASE_MEMORY))


def _broken(phase: Phase, verdict: v.Verdict) -> Step:
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


class Phase:
    """One phase of the lifecycle, the only writer of its own state; ``lifecycle``: its own (None: never shuts down)."""

    def __init__(self, spec: PhaseSpec, rt: Runtime, on_change: Callable[[Phase], None],
                 hooks: PhaseHooks = NO_HOOKS, *, lifecycle: ItsLifecycle | None = None,
                 record: resume.ResumeRecord | None = None, spawn: Spawn | None = None) -> None:
        self.spec = spec
        self.name = spec.name  # (read on every path: an attribute, not a call)
        self._loop, self._log, self._clock = rt.loop, rt.log, rt.loop.clock
        self._reaper, self._stuck = rt.spawning.reaper, rt.spawning.stuck
        self._evidence, self._verdicts, self._started = rt.evidence, rt.verdicts, rt.started
        self._state_dir = rt.state_dir
        self._resume_needs = PhaseSurroundings(rt.loop, rt.log, rt.rerun, rt.evidence)
        self.reasons = rt.reasons  # the plugin's verdict reasons, with their statuses (read-only)
        self._spawn: Spawn = spawn or partial(start_child, rt.spawning)
        self._on_change, self._hooks, self._lifecycle = on_change, hooks, lifecycle
        self.pacing = Pacing(spec, rt.loop, rt.rng)  # its timers; others only read them (status/snapshot.py)
        # Written by this class only (its state by transition; a test walks the table): what others read.
        self.state = PhaseState.PENDING
        self.since = self._clock.time()
        self.why = "not started"
        self.timeline = Timeline()  # when it started, came up and ended (status shows it)
        self.kept: list[Child] = []  # daemons with lifetime = "lifecycle", handed on at success
        self._judged_at_shutdown: tuple[v.Verdict | None] | None = None  # failed_for_good at the shutdown, kept
        self.parsed: Any = None  # what the output hook's parser read (None: no parser, or not run yet)
        # The fact name ``parsed`` is kept under (the bench's result, resumed after a restart and shown by
        # ``status`` under that name); None: a parser whose result is only a verdict (the warm-up's) keeps none.
        self.kept_as: str | None = hooks.output.fact if hooks.output is not None else None
        self.facts: dict[str, Any] = {}  # what a later start needs to resume (kept in resume.json)
        self._record = record if record is not None else resume.ResumeRecord()  # the last run's facts
        self._attempt = Attempt(0, self._clock.monotonic())
        self._extra_env: dict[str, str] = {}  # what the supervisor tells the phase (memory budget, hooks)
        self._preflight_env: dict[str, str] = {}  # the memory preflight's part of it (its first attempt's)
        self._deciding = 0  # how deep in _on: a step that is being carried out
        self._telling = False  # a move of this phase is being told (on_change)
        self._aborts_due: list[tuple[str, str]] = []  # aborts asked by a hearer of a move: run after its step

    # ------------------------------------------------------------ what others read

    @property
    def attempt(self) -> int:
        return self._attempt.number

    @property
    def attempt_started(self) -> float:  # when this attempt began, on the loop's monotonic clock
        return self._attempt.started

    @property
    def children(self) -> list[Child]:  # this attempt's, in start order
        return list(self._attempt.children)

    @property
    def outcome(self) -> v.Verdict | None:  # what ended the current attempt (or refused the next one)
        return self._attempt.outcome

    @property
    def up(self) -> bool:
        """A service whose command runs and answered its ready check (it stays ``running`` to the outside)."""
        return self.state is PhaseState.RUNNING and self._attempt.up_at is not None

    @property
    def was_up(self) -> bool:
        """Its service came up in some attempt (when: its timeline's ``up_at``, noted as the move is told)."""
        return self.timeline.up_at is not None

    @property
    def progress(self) -> dict[str, Any] | None:  # the attempt's figures (progresswatch.py), None: not watched
        return self._attempt.progress.figures() if self._attempt.progress is not None else None

    @property
    def resume_needs(self) -> PhaseSurroundings:  # what resume.py reads of the phase's surroundings
        return self._resume_needs

    @property
    def command_child(self) -> Child | None:
        return self._attempt.command(self.spec.command)

    @property
    def current_attempt(self) -> Attempt:  # read-only, for the status view: its start (the ready wait), its start time
        return self._attempt

    def live_children(self) -> list[Child]:  # (its kept daemons are among them: kept from its last attempt's)
        return [c for c in self._attempt.children if c.running or c.stopping]  # (stopping: what it left runs)

    # ------------------------------------------------------------ what the decision reads (decide, above)

    def shutting_down(self) -> bool:
        return self._lifecycle is not None and self._lifecycle.shutting_down

    def broken(self) -> bool:
        return self._attempt.broken is not None

    def stop_over(self) -> bool:
        return self._attempt.stop_over

    def command_verdict(self) -> v.Verdict | None:
        """Its command's verdict, kept by the attempt: the run's record keeps only the latest few of a phase, and
        a phase of many daemons stopped together pushed it out (read as "never reaped")."""
        return self._attempt.command_verdict

    def failed_for_good(self) -> v.Verdict | None:
        """The outcome of the attempt being stopped, where it is a failure no retry or restart would follow
        (the phase fails once the stop is over); else None. Only what ended the attempt before any shutdown
        counts (a timeout or a stall before its command's exit is in: ``outcome_to_come``): a command the
        shutdown stopped is no failure of its own. Once a shutdown came, the first answer
        holds (the lifecycle's as it decides its status, else the phase's as it is told: ``shut_down``): a stop's
        long grace must not turn a phase that had retries left into a failed one (the deadline passing
        meanwhile, a restart window shrinking), nor the reverse."""
        if self._judged_at_shutdown is not None:
            return self._judged_at_shutdown[0] if self.state is PhaseState.STOPPING else None
        outcome, judged = self.outcome or self._attempt.outcome_to_come(self.name, self.reasons), None
        if self.state is PhaseState.STOPPING and outcome is not None and not outcome.success \
                and self.pacing.fails_for_good(outcome, self._attempt):
            judged = outcome
        if self.shutting_down():
            self._judged_at_shutdown = (judged,)
        return judged

    def completed(self) -> bool:
        """A oneshot whose attempt ended by its command's success before any shutdown (being stopped now: its
        daemons). A command the shutdown stopped is no success of its own."""
        outcome = self.outcome
        return self.spec.kind == "oneshot" and outcome is not None and outcome.success and outcome.reason != v.STOPPED

    def never_reaped(self) -> v.Verdict:
        """The verdict of an attempt whose command was stopped and never reaped (it outlived its SIGKILL)."""
        command = self.command_child
        assert command is not None  # (an attempt that ends after its command started)
        return v.never_reaped(command, phase=self.name, attempt=self.attempt, added=self.reasons)

    def next_after(self, outcome: v.Verdict) -> tuple[Next, str, float]:
        return self.pacing.after(outcome, self._attempt)

    # ------------------------------------------------------------ the one road: event → decision → move, effects

    def transition(self, new: PhaseState, why: str) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"phase {self.name}: no transition {self.state} → {new}")
        old, self.state, self.since, self.why = self.state, new, self._clock.time(), why
        self._log(f"phase {self.name}: {old} → {new} ({why})")
        self._tell()

    def _tell(self) -> None:
        """Its hearers hear of the phase (a move, its service up, a kept daemon dead); an abort one of them asks
        for meanwhile waits for the step's end (abort_attempt)."""
        self.timeline.note(self.state, self.since, self.up, self._clock.time)
        self._telling = True
        try:
            self._on_change(self)
        finally:
            self._telling = False

    def _on(self, event: Event) -> None:
        """What ``event`` does, as decide says: the effects before the move, the move, those after. Then
        the aborts a hearer of the move asked for (abort_attempt), each decided in turn."""
        self._deciding += 1
        try:
            step = decide(self, event)
            for effect in step.before:
                self._carry_out(effect)
            if step.state is not None:
                self.transition(step.state, step.why)
            for effect in step.after:
                self._carry_out(effect)
            if step.then is not None:
                self._on(step.then)
        except BaseException:
            self._aborts_due.clear()  # asked of a step that did not end: not to be laid on a later attempt
            raise
        finally:
            self._deciding -= 1
        while self._deciding == 0 and self._aborts_due:
            reason, detail = self._aborts_due.pop(0)
            self.abort_attempt(reason, detail)

    def _carry_out(self, effect: Doing) -> None:
        match effect:
            case Effect.PREPARE_FIRST:
                self._prepare(first=True)
            case Effect.PREPARE_AGAIN:
                self._prepare(first=False)
            case Effect.START_DEADLINE:
                self.pacing.start_deadline(self._deadline_passed, self.fault_handler("the deadline timer"))
            case Effect.NEW_ATTEMPT:
                self._attempt = Attempt(self._attempt.number + 1, self._clock.monotonic())
                if self._evidence.memory is not None:
                    self._evidence.memory.new_attempt(self.name)
            case Effect.WATCH_ATTEMPT:
                self._watch_attempt()
            case Effect.BEGIN_START:
                self._begin_start()
            case Effect.CANCEL_START:
                self._attempt.end(self._clock.monotonic())
            case Effect.START_SETTLE:  # (cancelled as the attempt leaves SETTLING: CANCEL_SETTLE)
                self.pacing.start_settle(self._settle_timed_out, self.fault_handler("the settle timer"))
            case Effect.CANCEL_SETTLE:
                self.pacing.cancel_settle()
            case Effect.KEEP_DAEMONS:
                self.kept = [c for c in self._attempt.children if c.spec.lifetime == "lifecycle" and c.running]
            case Effect.STOP_CHILDREN:
                stopping = [c for c in reversed(self._attempt.children) if c not in self.kept]
                stop_in_order(self._loop, self._log, stopping, "phase attempt over",
                              self.guarded("the end of an attempt", lambda: self._on(ChildrenStopped())))
            case Effect.SWEEP:
                self._sweep()
            case Effect.CANCEL_TIMERS:
                self.pacing.cancel()
            case Effect.RELEASE_MEMORY:
                if not self.kept and self._evidence.memory is not None:
                    self._evidence.memory.release_phase(self.name)
            case Effect.MARK_UP:
                self._attempt.up_at = self._clock.monotonic()
                self._log(f"phase {self.name}: service is up")
            case Effect.TELL_LIFECYCLE:
                self._tell()
            case Resume(parsed):
                self.parsed, self.facts = parsed, self._record.previous(self.name)
            case Outcome(verdict, record):  # a finding of our own (no pid, no exit recorded it): recorded, masked
                self._attempt.outcome = self._verdicts.record(verdict) if record and verdict.pid is None else verdict
                if self._attempt.progress is not None:  # its last figures: a settled walk's, if it ended well
                    self._attempt.progress.finish(self._attempt.outcome.success)
            case MarkStopped(reason, detail):
                self._attempt.mark_stopped_for(reason, detail)
            case MarkBroken(verdict):
                self._attempt.broken = verdict
            case BackOff(delay):
                self.pacing.back_off(delay, lambda: self._on(BackoffOver()), self.fault_handler("the backoff timer"))
            case GatherFacts(why):
                resume.facts_of(self, self._hooks, lambda facts: self._on(FactsGathered(facts, why)))
            case KeepFacts(facts):
                self.facts = facts

    # ------------------------------------------------------------ events, as they reach the phase

    def start(self) -> None:
        """The lifecycle reached this phase (it calls this once): resumed, or its first attempt."""
        self._record.check(self, self._hooks, lambda resumed: self._on(Reached(resumed)))

    def _is_current(self, attempt: int, *states: PhaseState) -> bool:
        """A callback made for ``attempt`` may still act: that attempt is the phase's, in one of ``states``."""
        return attempt == self._attempt.number and self.state in states

    def _child_exited(self, child: Child, _pid: int, status: ExitStatus) -> None:
        verdict = v.exit_verdict(child, status, phase=self.name, attempt=self.attempt,
                                 daemon=child.spec is not self.spec.command, memory=self._evidence.memory,
                                 earlier=self._verdicts, added=self.reasons)
        output, parser = self._hooks.output, self._attempt.parser
        if child.spec is self.spec.command and output is not None and parser is not None \
                and child.stop_reason is None:
            # Only a command that ended by itself is judged by its output: one the supervisor stopped
            # (its daemon died, shutdown) never printed its result, and that is not its failure.
            verdict = output.judge(verdict, parser.result, self._log)
        verdict = self._verdicts.record(verdict)  # masked: what the attempt and the lifecycle keep
        command = child.spec is self.spec.command
        if command and child in self._attempt.children:
            self._attempt.command_verdict = verdict
            if not status.success and child.stop_reason is None:
                self._reap_dying_daemons()
            elif verdict.success and self._attempt.settle is not None:
                self._attempt.drain()  # the settle watch reads what the daemons printed before it is asked
        self._on(ChildExited(verdict, asked=child.stop_reason is not None, kept=child in self.kept,
                             ours=child in self._attempt.children, command=command))

    def _reap_dying_daemons(self) -> None:
        """The command failed by itself: if a daemon of its attempt is dying, it is reaped now, before the
        command's exit is decided. A dying daemon's sockets close before the kernel tells us it died (reaping.py
        ``reap_dying``), so the client it failed (a benchmark: "no answer from the daemon") can be reaped first:
        the command's verdict is recorded as it was reaped, and the daemon's death, the cause, ends the attempt
        (the command's exit, decided after it, then changes nothing)."""
        daemons = [child for child in self._attempt.children
                   if child.spec is not self.spec.command and child.running and child.stop_reason is None]
        if not daemons:
            return
        until = self._clock.monotonic() + DYING_DAEMON_WAIT_S  # (one bound for them all)
        with self._loop.holding("the reap of a dying daemon"):
            for daemon in daemons:
                if self.state not in ATTEMPT_RUNS:
                    return  # one was reaped: its death ended the attempt, and the stop of the rest has begun
                if daemon.running and daemon.stop_reason is None:
                    self._reaper.reap_dying(daemon.pid, max(0.0, until - self._clock.monotonic()))

    def _deadline_passed(self) -> None:
        if self.state in FINAL_STATES or self.shutting_down():
            return
        before = self.state
        self.look_before_deciding()
        if self.state in FINAL_STATES or self.shutting_down() or self.state is not before:
            return  # (what it printed moved it: a settle's end, read just now, decided first)
        detail = f"phase deadline timeout_s={self.spec.timeout_s:g} passed"
        self._log(f"phase {self.name}: {detail}")
        self._on(DeadlinePassed(detail, self._command_running()))

    def settle_pending(self) -> str | None:  # (the settle: hooks.py; the phase SETTLING: states.py)
        return self._attempt.settle.pending() if self._attempt.settle is not None else None

    def settle_cut_short(self) -> str:
        return self._attempt.settle.cut_short() if self._attempt.settle is not None else "no settle"

    def _settle_read(self, attempt: int, lines: list[bytes]) -> None:
        settle = self._attempt.settle  # (a kept daemon's lines after its attempt are read by none)
        if self._is_current(attempt, *ATTEMPT_RUNS) and settle is not None and settle.read(lines) is None \
                and self.state is PhaseState.SETTLING:
            self._on(Settled(f"{settle.hook.what}: over"))

    def _settle_timed_out(self) -> None:
        self._attempt.drain()  # (what was printed in time counts: its line may end the settle first)
        self._on(Settled(f"settle_timeout_s={self.spec.settle_timeout_s:g} passed", cut=True))

    def abort_attempt(self, reason: str, detail: str) -> None:
        """The supervisor ends the attempt (a stall, too slow, a watcher's finding): the verdict says why.
        Asked by a hearer of this phase's move (a plugin's listener that fails the phase as it starts to run),
        it waits until the move is told to every hearer and its step is carried out: run to completion, or
        the hearers after the asker would hear the abort's moves before the one they are being told of."""
        if self._telling:
            self._aborts_due.append((reason, detail))
            return
        self._on(Aborted(reason, detail, self._command_running()))

    # What the attempt's watches tell it (attempt.Watched).

    def still_running(self, attempt: int) -> bool:
        return self._is_current(attempt, *ATTEMPT_RUNS)

    def stalled(self, silent: str) -> None:
        self._log(f"phase {self.name}: stalled: {silent} (stall_s={self.spec.stall_s:g})")
        self.abort_attempt(v.STALLED, f"stalled: {silent}")

    def too_slow(self, why: str) -> None:
        self.abort_attempt(v.TOO_SLOW, why)

    def shut_down(self) -> None:
        """The supervisor is shutting down: no new attempts; children are stopped by the lifecycle."""
        self.failed_for_good()  # judged now, at the shutdown, once (where the lifecycle did not ask already)
        self._on(StopAsked())

    def end_after_shutdown(self) -> None:
        """Every child of the run is stopped: the phase ends where it was."""
        self._on(AllStopped())

    def _command_running(self) -> bool:
        command = self.command_child
        return command is not None and command.running

    def look_before_deciding(self) -> None:
        """Before a stall or deadline decision: what the children already printed is read (a child that
        printed all along must not be judged silent on output still in its pipe), and the clock is
        looked at, so a freeze of the supervisor is said before what it caused."""
        self._attempt.drain()
        if self._evidence.freeze is not None:
            self._evidence.freeze.notice()

    # ------------------------------------------------------------ effects that take more than a line

    def hook_context(self) -> HookContext:
        """What a hook may know of this phase: its name, its memory, the GPUs' latest reading, state_dir, the log."""
        return self._evidence.hook_context(self.name, self.spec.memory_max, self._state_dir, self._log)

    def _prepare(self, first: bool) -> None:
        """The steps before an attempt that may refuse it (a GPU known gone and the prepare hook before each, the
        memory preflight before the first): what they return is the children's added environment, the preflight's
        kept from the first attempt, the hook's this attempt's alone (a key it no longer gives is no longer set)."""
        refusal = self._evidence.gpu_refusal(self.spec.gpu_health)  # (a GPU known gone: no child started on it)
        if first and refusal is None:
            prepared = memory_preflight(self.hook_context(), self.spec.min_memory)
            if isinstance(prepared, Refusal):
                refusal = prepared
            else:
                self._preflight_env = dict(prepared)
        hook_env: dict[str, str] = {}
        if refusal is None and self._hooks.prepare is not None:
            prepared = self._hooks.prepare(self.hook_context())
            if isinstance(prepared, Refusal):
                refusal = prepared
            else:
                hook_env = dict(prepared)
        self._extra_env = {**self._preflight_env, **hook_env}
        self._on(Prepared(refusal, first))

    def _watch_attempt(self) -> None:
        """The attempt's stall watch and progress figures, each acting only while the attempt is current."""
        watched = Watched(self._attempt, self, self._lifecycle, self._evidence.memory)
        self.pacing.watch_for_stall(self._evidence, watched)
        self._attempt.progress = self.pacing.watch_progress(self._evidence, watched, self._log)

    def _begin_start(self) -> None:
        if self._hooks.settle is not None:
            self._attempt.settle = Settle(self._hooks.settle, self.spec.settle_timeout_s)
        self._attempt.start = AttemptStart(self.spec, self.attempt, self._loop, self._log, start=self._start_child,
                                           tell=self._on, guarded=self.guarded, own=self._started,
                                           freeze=self._evidence.freeze)
        self._attempt.start.begin()

    def _start_child(self, spec: ChildSpec) -> Child | None:
        output, parser, reader = self._hooks.output, None, None
        if spec is self.spec.command and output is not None:
            # What the parser reads decides the phase: a parser that raises fails it (internal_error).
            parser = output.new_parser()
            reader = self.guarded(output.parser_name, parser.feed)
        elif spec is not self.spec.command and self._attempt.settle is not None:
            reader = self.guarded(f"the settle watch ({self._attempt.settle.hook.what})",
                                  partial(self._settle_read, self.attempt))
        ctx = ChildContext(self.name, self.spec.memory_max, dict(self._extra_env), self.fault_handler)
        try:
            child = self._spawn(spec, ctx, reader, self._child_exited)
        except SpawnError as exc:
            self._on(StartFailed(v.without_exit(self.name, spec.name, v.SPAWN_FAILED, exc.status, exc.reason,
                                                attempt=self.attempt)))
            return None
        if parser is not None:
            self._attempt.parser, self.parsed = parser, parser.result
        self._attempt.children.append(child)
        self._started.add(child)
        return child

    def _sweep(self) -> None:
        """The attempt's children are stopped: a shutdown has no more to stop of them, and whatever is still
        in the phase's cgroup escaped every other way of finding it (double fork + setsid + a cleared
        environment): it goes too."""
        attempt = self._attempt
        attempt.stop_over = True
        self._started.forget([c for c in attempt.children if c not in self.kept])
        leftover = memory.leftover_pids(self.name) if (memory := self._evidence.memory) and not self.kept else []
        if leftover:  # (less a tree whose stop gave up past SIGKILL: said as that, never as escaped and killed)
            outlived = {proc.pid for child in attempt.children for proc in child.tree()}  # (a reaped leader's too)
            kill_pids([pid for pid in leftover if pid not in outlived], self._log,
                      f"still in phase {self.name}'s cgroup after its children stopped (escaped the process tree)",
                      self._stuck)

    # ------------------------------------------------------------ the supervisor's own bugs

    def fault_handler(self, what: str) -> ErrorHandler:
        """The error handler for a callback this phase registers: ``what`` names the callback."""
        return lambda exc: self.fail_internally(what, exc)

    def guarded(self, what: str, callback: Callable[..., object]) -> Callable[..., None]:
        """``callback`` made unable to raise into its caller (a tap, a watcher, a thread's answer)."""
        return contained(callback, self.fault_handler(what))

    def fail_internally(self, what: str, exc: Exception) -> None:
        """A bug of the supervisor's own while handling this phase (``what`` raised ``exc``): logged once with its
        traceback; the phase fails for good with reason internal_error (_broken, above)."""
        self._loop.faults.report(f"phase {self.name}: {what}", exc)
        detail = f"internal error in {what}: {summary(exc)} (a supervisor bug: the traceback is in supervisor.log)"
        self._on(Broken(v.without_exit(self.name, self.name, v.INTERNAL_ERROR, EXIT_INTERNAL_ERROR, detail,
                                       attempt=self.attempt)))
