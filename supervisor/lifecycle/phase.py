"""A phase: one step of the lifecycle, an explicit state machine (its states and moves: states.py).

A phase runs in attempts (each a record of its own: attempt.py): its daemons one by one (each
waited for until ready), then its command, until the command exits, a daemon dies, a deadline
passes, the phase stalls or the supervisor shuts down. Its children are then stopped in reverse
start order, and the verdict that ended the attempt decides what comes next (supervisor/lifecycle/policy.py;
its timers: pacing.py). Every timer and thread callback checks ``_is_current`` first: a late
callback must never act on a newer attempt. What a phase does beyond running children (writing a
config, judging the output) comes from its hooks, told only a HookContext. It reads the time from
the loop's clock, and starts children through ``spawn``: tests drive it with fake ones of both.
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
from .attempt import Attempt
from .children import ChildContext, Spawn, exit_verdict, start_child
from .hooks import NO_HOOKS, HookContext, PhaseHooks, Refusal
from .pacing import Pacing
from .policy import Next, memory_preflight
from .runtime import ResumeNeeds, Runtime, stop_in_order
from .starting import AttemptStart
from .states import _ALLOWED, ATTEMPT_RUNS, FINAL_STATES, PhaseState
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
        self._resume_needs = ResumeNeeds(rt.loop, rt.log, rt.rerun, rt.evidence)
        self._reasons = rt.reasons  # the plugin's verdict reasons, with their statuses
        self._spawn: Spawn = spawn or partial(start_child, rt.spawning)
        self._on_change, self._hooks, self._shutting_down = on_change, hooks, shutting_down
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
    def kept_as(self) -> str | None:
        """The fact name its output parser's result is kept under (``status`` shows it under that name), or None."""
        output = self._hooks.output
        return output.fact if output is not None else None

    @property
    def current_attempt(self) -> Attempt:  # read-only, for the status view: its start (the ready wait), its start time
        return self._attempt

    def live_children(self) -> list[Child]:
        return [c for c in self._attempt.children + self.kept if c.running]

    # ------------------------------------------------------------ transitions

    def transition(self, new: PhaseState, why: str) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"phase {self.name}: no transition {self.state} → {new}")
        old, self.state, self.since, self.why = self.state, new, self._clock.time(), why
        self._log(f"phase {self.name}: {old} → {new} ({why})")
        self._on_change(self)

    def _is_current(self, attempt: int, *states: PhaseState) -> bool:
        """A callback made for ``attempt`` may still act: that attempt is the phase's, in one of ``states``."""
        return attempt == self._attempt.number and self.state in states

    def start(self) -> None:
        """The lifecycle reached this phase (it calls this once): resumed, or its first attempt."""
        self._record.check(self, self._hooks.output, self._resume_or_run)

    def _resume_or_run(self, resumed: tuple[str, Any] | None) -> None:
        """Resume's answer (at once, or once its look at the output files came back): done, or run."""
        if self.state is not PhaseState.PENDING or self._shutting_down():
            return  # the supervisor shut down meanwhile
        if resumed is not None:
            why, self.parsed = resumed
            self.facts = self._record.previous(self.name)
            self.transition(PhaseState.DONE, f"resumed: {why}")
            return
        if not self._prepared(lambda ctx: memory_preflight(ctx, self.spec.min_memory)):
            return
        self.pacing.start_deadline(self._deadline_passed, self.fault_handler("the deadline timer"))
        self._start_attempt()

    def hook_context(self) -> HookContext:
        """What a hook may know of this phase: its name, its memory, the GPUs' latest sample, state_dir, the log."""
        return HookContext(self.name, self._evidence.available_memory(self.spec.memory_max),
                           self._evidence.gpu_samples(), self._state_dir, self._log)

    def _prepared(self, prepare: Callable[[HookContext], dict[str, str] | Refusal]) -> bool:
        """A step before running (the memory preflight, the prepare hook): what it returns is added to the
        children's environment; a refusal fails the phase (False)."""
        prepared = prepare(self.hook_context())
        if isinstance(prepared, Refusal):
            self._fail(prepared.reason, prepared.detail)
            return False
        self._extra_env.update(prepared)
        return True

    # ------------------------------------------------------------ an attempt

    def _start_attempt(self) -> None:
        hook = self._hooks.prepare
        if hook is not None and not self._prepared(hook):
            return
        self._attempt = Attempt(self._attempt.number + 1, self._clock.monotonic())
        if self._evidence.memory is not None:
            self._evidence.memory.reset_peak(self.name)
        self.transition(PhaseState.STARTING, f"attempt {self.attempt}")
        attempt = self.attempt
        self.pacing.watch_for_stall(self._evidence, self._attempt, drain=self._before_deciding,
                                     current=lambda: self._is_current(attempt, *ATTEMPT_RUNS),
                                     on_stall=self._stalled, on_error=self.fault_handler("the stall check"))
        self.pacing.watch_progress(self._evidence, self._attempt, self._log, current=lambda: self._is_current(
            attempt, *ATTEMPT_RUNS), on_too_slow=partial(self.abort_attempt, v.TOO_SLOW),
            on_error=self.fault_handler("the progress watch"))
        self._attempt.start = AttemptStart(self.spec, self.attempt, self._loop, self._log, start=self._start_child,
                                           guarded=self.guarded, up=self._service_up, failed=self._end_attempt,
                                           command_started=lambda child: self.transition(
                                               PhaseState.RUNNING, f"{child.label} pid {child.pid}"))
        self._attempt.start.begin()

    def _service_up(self) -> None:
        self._attempt.up_at = self._clock.monotonic()
        if self._first_up_at is None:
            self._first_up_at = self._clock.time()
        self._log(f"phase {self.name}: service is up")
        self._on_change(self)

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
            self._end_attempt(v.without_exit(self.name, spec.name, v.SPAWN_FAILED, exc.status, exc.reason,
                                             attempt=self.attempt))
            return None
        if parser is not None:
            self._attempt.parser, self.parsed = parser, parser.result
        self._attempt.children.append(child)
        self._started.add(child)
        return child

    # ------------------------------------------------------------ events

    def _child_exited(self, child: Child, status: ExitStatus) -> None:
        verdict = exit_verdict(child, status, phase=self.name, attempt=self.attempt,
                               daemon=child.spec is not self.spec.command, memory=self._evidence.memory,
                               earlier=self._verdicts, added=self._reasons)
        output, parser = self._hooks.output, self._attempt.parser
        if child.spec is self.spec.command and output is not None and parser is not None \
                and child.stop_reason is None:
            # Only a command that ended by itself is judged by its output: one the supervisor stopped
            # (its daemon died, shutdown) never printed its result, and that is not its failure.
            verdict = output.judge(verdict, parser.result, self._log)
        verdict = self._verdicts.record(verdict)  # masked: what the attempt and the lifecycle keep
        if child.stop_reason is not None or self._shutting_down():
            return  # we asked for this; the stop in progress takes it from here
        if child in self.kept:
            self._on_change(self)  # a kept daemon died: the lifecycle decides
            return
        if child in self._attempt.children and self.state in ATTEMPT_RUNS:
            self._end_attempt(verdict)

    def _deadline_passed(self) -> None:
        if self.state in FINAL_STATES or self._shutting_down():
            return
        self._before_deciding()
        if self.state in FINAL_STATES or self._shutting_down():
            return
        detail = f"phase deadline timeout_s={self.spec.timeout_s:g} passed"
        self._log(f"phase {self.name}: {detail}")
        if self.state is PhaseState.BACKOFF:
            self._fail(v.TIMEOUT, detail)
            return
        self.abort_attempt(v.TIMEOUT, detail)
        # In STOPPING the attempt is ending anyway; its outcome decides.

    def abort_attempt(self, reason: str, detail: str) -> None:
        """The supervisor ends the attempt (deadline, stall, too slow, a watcher's finding): the verdict says why."""
        if self.state not in ATTEMPT_RUNS:
            return
        self._attempt.mark_stopped_for(reason, detail)
        command = self.command_child
        if command is None or not command.running:  # still waiting for daemons
            self._end_attempt(v.without_exit(self.name, self.name, reason, 1, detail, attempt=self.attempt,
                                             added=self._reasons))
        else:
            self._end_attempt(None, why=detail)

    def _stalled(self, silent: str) -> None:
        self._log(f"phase {self.name}: stalled: {silent} (stall_s={self.spec.stall_s:g})")
        self.abort_attempt(v.STALLED, f"stalled: {silent}")

    def _before_deciding(self) -> None:
        """Before a stall or deadline decision: what the children already printed is read (a child that
        printed all along must not be judged silent on output still in its pipe), and the clock is
        looked at, so a freeze of the supervisor is said before what it caused."""
        self._attempt.drain()
        if self._evidence.freeze is not None:
            self._evidence.freeze.notice()

    # ------------------------------------------------------------ the end of an attempt

    def _end_attempt(self, outcome: Verdict | None, why: str = "") -> None:
        """The attempt is over: stop its children (reverse start order), then decide."""
        if self.state not in ATTEMPT_RUNS:
            return
        attempt = self._attempt
        attempt.cancel_start()
        if outcome is not None and outcome.pid is None:
            outcome = self._verdicts.record(outcome)  # no child will be reaped for it: record it now
        attempt.outcome = outcome
        if outcome is not None and outcome.success and self.spec.kind == "oneshot":
            # The phase succeeded: daemons with lifetime = "lifecycle" live on into the later phases.
            self.kept = [c for c in attempt.children if c.spec.lifetime == "lifecycle" and c.running]
        self.transition(PhaseState.STOPPING, why or (outcome.detail if outcome else ""))
        stop_in_order(self._loop, self._log, [c for c in reversed(attempt.children) if c not in self.kept],
                      "phase attempt over", self.guarded("the end of an attempt", self._attempt_stopped))

    def _attempt_stopped(self) -> None:
        if self.state is not PhaseState.STOPPING:
            return
        attempt = self._attempt
        attempt.stop_over = True
        self._started.forget(c for c in attempt.children if c not in self.kept)
        memory = self._evidence.memory
        if memory is not None and not self.kept:
            # Whatever is still in the phase's cgroup escaped every other way of finding it
            # (double fork + setsid + a cleared environment): it goes too.
            kill_pids(memory.leftover_pids(self.name), self._log,
                      f"still in phase {self.name}'s cgroup after its children stopped (escaped the process tree)")
        if attempt.outcome is None:
            # The supervisor ended it (the deadline, a stall): the command's verdict says how it ended.
            command = self.command_child
            attempt.outcome = self._verdicts.verdict_of(command) if command is not None else None
        outcome = attempt.outcome
        if outcome is None:  # pragma: no cover - the command is always reaped before this point
            outcome = attempt.outcome = v.without_exit(self.name, self.name, v.TIMEOUT, 1, "deadline",
                                                       attempt=self.attempt)
        if self._shutting_down():
            self.transition(PhaseState.STOPPED, "supervisor shutdown")
            return
        step, why, delay = self.pacing.after(outcome, attempt)
        if step is Next.DONE:
            self._done(why)
        elif step is Next.FAIL:
            self._fail(None, why)
        else:
            self._back_off(why, delay)

    def _back_off(self, why: str, delay: float) -> None:
        self.transition(PhaseState.BACKOFF, f"{why}; next attempt in {delay:.2f}s")
        self.pacing.back_off(delay, self._backoff_over, self.fault_handler("the backoff timer"))

    def _backoff_over(self) -> None:
        if self.state is PhaseState.BACKOFF and not self._shutting_down():
            self._start_attempt()

    # ------------------------------------------------------------ the end of the phase

    def _done(self, why: str) -> None:
        """Done: once resume has its facts (its output files are listed off the loop), the phase concludes."""

        def conclude(facts: dict[str, Any]) -> None:
            if self.state is not PhaseState.STOPPING or self._shutting_down():
                return  # the supervisor shut down meanwhile: the shutdown settles the phase
            self.facts = facts
            self._conclude(PhaseState.DONE, why)

        resume.facts_of(self, self._hooks.output, conclude)

    def _fail(self, reason: str | None, detail: str, status: int = 1) -> None:
        """The one road to FAILED. ``reason``: the supervisor's own finding (memory preflight, prepare,
        the deadline in a backoff), recorded as the outcome since no child's exit says it; None when
        the outcome already recorded (the attempt's verdict, an internal error) says why."""
        if reason is not None:
            self._attempt.outcome = self._verdicts.record(
                v.without_exit(self.name, self.name, reason, status, detail, attempt=self.attempt))
        self._conclude(PhaseState.FAILED, detail)

    def _conclude(self, state: PhaseState, why: str) -> None:
        self.pacing.cancel()
        if not self.kept and self._evidence.memory is not None:
            self._evidence.memory.release_phase(self.name)
        self.transition(state, why)

    # ------------------------------------------------------------ the supervisor's own bugs

    def fault_handler(self, what: str) -> ErrorHandler:
        """The error handler for a callback this phase registers: ``what`` names the callback."""
        return lambda exc: self.fail_internally(what, exc)

    def guarded(self, what: str, callback: Callable[..., object]) -> Callable[..., None]:
        """``callback`` made unable to raise into its caller (a tap, a watcher, a thread's answer)."""
        return contained(callback, self.fault_handler(what))

    def fail_internally(self, what: str, exc: Exception) -> None:
        """A bug of the supervisor's own while handling this phase (``what`` raised ``exc``): logged once with its
        traceback; the phase fails for good with reason internal_error (retrying would only hide the bug). Its
        children are stopped on purpose, so their verdicts read ``stopped``: it is not their failure."""
        self._loop.faults.report(f"phase {self.name}: {what}", exc)
        attempt = self._attempt
        if self.state in FINAL_STATES or attempt.broken is not None or self._shutting_down():
            return  # failed already, or the shutdown ends it anyway: the log line above is all
        detail = f"internal error in {what}: {summary(exc)} (a supervisor bug: the traceback is in supervisor.log)"
        broken = attempt.broken = v.without_exit(self.name, self.name, v.INTERNAL_ERROR, EXIT_INTERNAL_ERROR, detail,
                                                 attempt=self.attempt)
        if self.state in ATTEMPT_RUNS:
            attempt.mark_stopped_for(v.STOPPED, detail)
            self._end_attempt(broken)  # records it; _attempt_stopped then fails the phase
            return
        if self.state is PhaseState.STOPPING and not attempt.stop_over:
            attempt.outcome = self._verdicts.record(broken)
            return  # the stop in progress ends in _attempt_stopped, which sees the outcome
        self._fail(v.INTERNAL_ERROR, detail, EXIT_INTERNAL_ERROR)

    # ------------------------------------------------------------ shutdown

    def abort(self) -> None:
        """The supervisor is shutting down: no new attempts; children are stopped by the lifecycle."""
        self.pacing.cancel()
        self._attempt.cancel_start()

    def settle_after_shutdown(self) -> None:
        if self.state in ATTEMPT_RUNS:
            self.transition(PhaseState.STOPPING, "supervisor shutdown")
        if self.state not in FINAL_STATES:
            self.transition(PhaseState.STOPPED, "supervisor shutdown")
