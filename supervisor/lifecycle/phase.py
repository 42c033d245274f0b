"""A phase: one step of the lifecycle, an explicit state machine whose moves one function decides (states.py).

A phase runs in attempts (each a record of its own: attempt.py): its daemons one by one (each
waited for until ready), then its command, until the command exits, a daemon dies, a deadline
passes, the phase stalls or the supervisor shuts down. Its children are then stopped in reverse
start order, and the verdict that ended the attempt decides what comes next (its timers: pacing.py).

The Phase is the loop's side of the decision, in three parts, as tini's loop is: each callback that
reaches it (a child reaped, a timer, a readiness answer, a watcher's finding) gathers what happened into
an event (``states.Event``); ``_on`` asks ``states.decide`` what it does, moves, and carries out the
effects the answer names, in its order (``_carry_out``). Every timer and thread callback checks
``_is_current`` first: a late callback must never act on a newer attempt. What a phase does beyond
running children (writing a config, judging the output) comes from its hooks, told only a
HookContext. It reads the time from the loop's clock, and starts children through ``spawn``: tests
drive it with fake ones of both.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..config import ChildSpec, PhaseSpec
from ..engine.loop import ErrorHandler, contained, summary
from ..engine.process import Child, SpawnError
from ..engine.reaping import ExitStatus
from ..engine.survivors import kill_pids
from ..exits import EXIT_INTERNAL_ERROR
from . import resume
from . import verdict as v
from .attempt import Attempt, AttemptStart
from .children import ChildContext, Spawn, exit_verdict, start_child
from .hooks import NO_HOOKS, HookContext, PhaseHooks, Refusal, memory_preflight
from .pacing import Pacing
from .runtime import ResumeNeeds, Runtime, stop_in_order
from .states import (
    _ALLOWED,
    ATTEMPT_RUNS,
    FINAL_STATES,
    Aborted,
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
    ShutdownSettled,
    StartFailed,
    StopAsked,
    decide,
)
from .verdict import Verdict


class Phase:
    """One phase of the lifecycle: the only writer of its own state. ``shutting_down``: the lifecycle's
    word that the supervisor is shutting down (no new attempt, no decision: the shutdown settles it)."""

    def __init__(self, spec: PhaseSpec, rt: Runtime, on_change: Callable[[Phase], None],
                 hooks: PhaseHooks = NO_HOOKS, *, shutting_down: Callable[[], bool] = lambda: False,
                 record: resume.ResumeRecord | None = None, spawn: Spawn | None = None) -> None:
        self.spec = spec
        self._loop, self._log, self._clock = rt.loop, rt.log, rt.loop.clock
        self._evidence, self._verdicts, self._started = rt.evidence, rt.verdicts, rt.started
        self._state_dir = rt.state_dir
        self._resume_needs = ResumeNeeds(rt.loop, rt.log, rt.rebench, rt.evidence)
        self._spawn: Spawn = spawn or partial(start_child, rt.spawning)
        self._on_change, self._hooks = on_change, hooks
        self.shutting_down = shutting_down
        self.pacing = Pacing(spec, rt.loop, rt.rng)  # its timers; others only read them (timers.py: status)
        # Written by this class only (its state by transition; a test walks the table): what others read.
        self.state = PhaseState.PENDING
        self.since = self._clock.time()
        self.why = "not started"
        self.kept: list[Child] = []  # daemons with lifetime = "lifecycle", handed on at success
        self.parsed: Any = None  # what the output hook's parser read (None: no parser, or not run yet)
        self.facts: dict[str, Any] = {}  # what a later start needs to resume (kept in resume.json)
        self._record = record if record is not None else resume.ResumeRecord()  # the last run's facts
        self._attempt = Attempt(0, self._clock.monotonic())
        self._first_up_at: float | None = None  # wall time its service first came up
        self._extra_env: dict[str, str] = {}  # what the supervisor tells the phase (memory budget, hooks)

    # ------------------------------------------------------------ what others read

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def attempt(self) -> int:
        return self._attempt.number

    @property
    def children(self) -> list[Child]:  # this attempt's, in start order
        return list(self._attempt.children)

    @property
    def outcome(self) -> Verdict | None:  # what ended the current attempt (or refused the next one)
        return self._attempt.outcome

    @property
    def up(self) -> bool:
        """A service whose command runs and answered its ready check (it stays ``running`` to the outside)."""
        return self.state is PhaseState.RUNNING and self._attempt.up_at is not None

    @property
    def was_up(self) -> bool:
        return self._first_up_at is not None

    @property
    def progress(self) -> dict[str, Any] | None:  # the attempt's figures (progresswatch.py), None: not watched
        return self._attempt.progress.figures() if self._attempt.progress is not None else None

    @property
    def rt(self) -> ResumeNeeds:  # what resume.py reads of the phase's surroundings
        return self._resume_needs

    @property
    def command_child(self) -> Child | None:
        return self._attempt.command(self.spec.command)

    @property
    def kept_result(self) -> Any:
        """The parsed result this phase keeps as a fact (the bench's, resumed after a restart and shown
        by ``status``), else None: a parser whose result is only a verdict (the warm-up's) keeps none."""
        output = self._hooks.output
        return self.parsed if output is not None and output.fact is not None else None

    @property
    def current_attempt(self) -> Attempt:  # read-only, for the status view: its start (the ready wait), its start time
        return self._attempt

    def live_children(self) -> list[Child]:
        return [c for c in self._attempt.children + self.kept if c.running]

    # ------------------------------------------------------------ what the decision reads (states.Deciding)

    def broken(self) -> bool:
        return self._attempt.broken is not None

    def stop_over(self) -> bool:
        return self._attempt.stop_over

    def command_verdict(self) -> Verdict | None:
        command = self.command_child
        return self._verdicts.verdict_of(command) if command is not None else None

    def next_after(self, outcome: Verdict) -> tuple[Next, str, float]:
        return self.pacing.after(outcome, self._attempt)

    # ------------------------------------------------------------ the one road: event → decision → move, effects

    def transition(self, new: PhaseState, why: str) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"phase {self.name}: no transition {self.state} → {new}")
        old, self.state, self.since, self.why = self.state, new, self._clock.time(), why
        self._log(f"phase {self.name}: {old} → {new} ({why})")
        self._on_change(self)

    def _on(self, event: Event) -> None:
        """What ``event`` does, as states.decide says: the effects before the move, the move, those after."""
        step = decide(self, event)
        for effect in step.before:
            self._carry_out(effect)
        if step.state is not None:
            self.transition(step.state, step.why)
        for effect in step.after:
            self._carry_out(effect)
        if step.then is not None:
            self._on(step.then)

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
                    self._evidence.memory.reset_peak(self.name)
            case Effect.WATCH_ATTEMPT:
                self._watch_attempt()
            case Effect.BEGIN_START:
                self._begin_start()
            case Effect.CANCEL_START:
                self._attempt.cancel_start()
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
                if self._first_up_at is None:
                    self._first_up_at = self._clock.time()
                self._log(f"phase {self.name}: service is up")
            case Effect.TELL_LIFECYCLE:
                self._on_change(self)
            case Resume(parsed):
                self.parsed, self.facts = parsed, self._record.previous(self.name)
            case Outcome(verdict, record):
                # A verdict no child's exit recorded (no pid: the supervisor's own finding) is recorded now:
                # the masked one is what the attempt and the lifecycle keep.
                self._attempt.outcome = self._verdicts.record(verdict) if record and verdict.pid is None else verdict
            case MarkStopped(reason, detail):
                self._attempt.mark_stopped_for(reason, detail)
            case MarkBroken(verdict):
                self._attempt.broken = verdict
            case BackOff(delay):
                self.pacing.back_off(delay, lambda: self._on(BackoffOver()), self.fault_handler("the backoff timer"))
            case GatherFacts(why):
                resume.facts_of(self, self._hooks.output, lambda facts: self._on(FactsGathered(facts, why)))
            case KeepFacts(facts):
                self.facts = facts

    # ------------------------------------------------------------ events, as they reach the phase

    def start(self) -> None:
        """The lifecycle reached this phase (it calls this once): resumed, or its first attempt."""
        self._record.check(self, self._hooks.output, lambda resumed: self._on(Reached(resumed)))

    def _is_current(self, attempt: int, *states: PhaseState) -> bool:
        """A callback made for ``attempt`` may still act: that attempt is the phase's, in one of ``states``."""
        return attempt == self._attempt.number and self.state in states

    def _service_up(self) -> None:
        self._on(CameUp())

    def _child_exited(self, child: Child, status: ExitStatus) -> None:
        verdict = exit_verdict(child, status, phase=self.name, attempt=self.attempt,
                               daemon=child.spec is not self.spec.command, memory=self._evidence.memory,
                               earlier=self._verdicts)
        output, parser = self._hooks.output, self._attempt.parser
        if child.spec is self.spec.command and output is not None and parser is not None \
                and child.stop_reason is None:
            # Only a command that ended by itself is judged by its output: one the supervisor stopped
            # (its daemon died, shutdown) never printed its result, and that is not its failure.
            verdict = output.judge(verdict, parser.result, self._log)
        verdict = self._verdicts.record(verdict)  # masked: what the attempt and the lifecycle keep
        self._on(ChildExited(verdict, asked=child.stop_reason is not None, kept=child in self.kept,
                             ours=child in self._attempt.children))

    def _deadline_passed(self) -> None:
        if self.state in FINAL_STATES or self.shutting_down():
            return
        self._before_deciding()
        if self.state in FINAL_STATES or self.shutting_down():
            return
        detail = f"phase deadline timeout_s={self.spec.timeout_s:g} passed"
        self._log(f"phase {self.name}: {detail}")
        self._on(DeadlinePassed(detail, self._command_running()))

    def abort_attempt(self, reason: str, detail: str) -> None:
        """The supervisor ends the attempt (deadline, stall, too slow, a watcher's finding): the verdict says why."""
        self._on(Aborted(reason, detail, self._command_running()))

    def _stalled(self, silent: str) -> None:
        self._log(f"phase {self.name}: stalled: {silent} (stall_s={self.spec.stall_s:g})")
        self.abort_attempt(v.STALLED, f"stalled: {silent}")

    def abort(self) -> None:
        """The supervisor is shutting down: no new attempts; children are stopped by the lifecycle."""
        self._on(StopAsked())

    def settle_after_shutdown(self) -> None:
        """Every child of the run is stopped: the phase ends where it was."""
        self._on(ShutdownSettled())

    def _command_running(self) -> bool:
        command = self.command_child
        return command is not None and command.running

    def _before_deciding(self) -> None:
        """Before a stall or deadline decision: what the children already printed is read (a child that
        printed all along must not be judged silent on output still in its pipe), and the clock is
        looked at, so a freeze of the supervisor is said before what it caused."""
        self._attempt.drain()
        if self._evidence.freeze is not None:
            self._evidence.freeze.notice()

    # ------------------------------------------------------------ effects that take more than a line

    def hook_context(self) -> HookContext:
        """What a hook may know of this phase: its name, its memory, the GPUs' latest sample, state_dir, the log."""
        return HookContext(self.name, self._evidence.available_memory(self.spec.memory_max),
                           self._evidence.gpu_samples(), self._state_dir, self._log)

    def _prepare(self, first: bool) -> None:
        """The steps before an attempt that may refuse it (the memory preflight before the first, the prepare
        hook before each): what they return is added to the children's environment."""
        steps = [lambda ctx: memory_preflight(ctx, self.spec.min_memory)] if first else []
        if self._hooks.prepare is not None:
            steps.append(self._hooks.prepare)
        refusal = None
        for prepare in steps:
            prepared = prepare(self.hook_context())
            if isinstance(prepared, Refusal):
                refusal = prepared
                break
            self._extra_env.update(prepared)
        self._on(Prepared(refusal, first))

    def _watch_attempt(self) -> None:
        """The attempt's stall watch and progress figures, each acting only while the attempt is current."""
        attempt = self.attempt

        def current() -> bool:
            return self._is_current(attempt, *ATTEMPT_RUNS)

        self.pacing.watch_for_stall(self._evidence, self._attempt, drain=self._before_deciding, current=current,
                                    on_stall=self._stalled, on_error=self.fault_handler("the stall check"))
        self.pacing.watch_progress(self._evidence, self._attempt, self._log, current=current,
                                   on_too_slow=partial(self.abort_attempt, v.TOO_SLOW),
                                   on_error=self.fault_handler("the progress watch"))

    def _begin_start(self) -> None:
        self._attempt.start = AttemptStart(self.spec, self.attempt, self._loop, self._log, start=self._start_child,
                                           guarded=self.guarded, up=self._service_up,
                                           failed=lambda verdict: self._on(StartFailed(verdict)),
                                           command_started=lambda child: self._on(CommandStarted(child)))
        self._attempt.start.begin()

    def _start_child(self, spec: ChildSpec) -> Child | None:
        output, parser, reader = self._hooks.output, None, None
        if spec is self.spec.command and output is not None:
            # What the parser reads decides the phase: a parser that raises fails it (internal_error).
            parser = output.new_parser()
            reader = self.guarded(output.parser_name, parser.feed)
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
        self._started.forget(c for c in attempt.children if c not in self.kept)
        memory = self._evidence.memory
        if memory is not None and not self.kept:
            kill_pids(memory.leftover_pids(self.name), self._log,
                      f"still in phase {self.name}'s cgroup after its children stopped (escaped the process tree)")

    # ------------------------------------------------------------ the supervisor's own bugs

    def fault_handler(self, what: str) -> ErrorHandler:
        """The error handler for a callback this phase registers: ``what`` names the callback."""
        return lambda exc: self.fail_internally(what, exc)

    def guarded(self, what: str, callback: Callable[..., object]) -> Callable[..., None]:
        """``callback`` made unable to raise into its caller (a tap, a watcher, a thread's answer)."""
        return contained(callback, self.fault_handler(what))

    def fail_internally(self, what: str, exc: Exception) -> None:
        """A bug of the supervisor's own while handling this phase (``what`` raised ``exc``): logged once with its
        traceback; the phase fails for good with reason internal_error (states._broken)."""
        self._loop.faults.report(f"phase {self.name}: {what}", exc)
        detail = f"internal error in {what}: {summary(exc)} (a supervisor bug: the traceback is in supervisor.log)"
        self._on(Broken(v.without_exit(self.name, self.name, v.INTERNAL_ERROR, EXIT_INTERNAL_ERROR, detail,
                                       attempt=self.attempt)))
