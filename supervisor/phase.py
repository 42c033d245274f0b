"""A phase: one step of the lifecycle, an explicit state machine (its states and moves: states.py).

A phase runs in attempts: its daemons one by one (each waited for until ready), then its command,
until the command exits, a daemon dies, a deadline passes, the phase stalls or the supervisor shuts
down. Its children are then stopped in reverse start order, and the verdict that ended the attempt
decides what comes next (supervisor/policy.py). Every timer and thread callback checks
``_is_current`` first: a late callback must never act on a newer attempt. What a phase does
beyond running children (writing a config, judging the output) comes from its hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import resume
from . import verdict as v
from .backoff import backoff_delay, within_window
from .children import exit_verdict, start_child
from .config import ChildSpec, PhaseSpec
from .exits import EXIT_INTERNAL_ERROR
from .hooks import NO_HOOKS, HookContext, OutputParser, PhaseHooks, Refusal
from .loop import ErrorHandler, Timer, contained, summary
from .policy import Next, after_attempt, memory_preflight
from .process import Child, SpawnError
from .readiness import ReadinessWait
from .reaping import ExitStatus
from .runtime import Runtime, stop_in_order
from .stall import StallMonitor
from .states import _ALLOWED, ATTEMPT_RUNS, FINAL_STATES, PhaseState
from .survivors import kill_pids
from .verdict import Verdict


class Phase:
    """One phase of the lifecycle: the only writer of its own state (``hold`` aside: Lifecycle's)."""

    def __init__(self, spec: PhaseSpec, rt: Runtime, on_change: Callable[[Phase], None],
                 hooks: PhaseHooks = NO_HOOKS, record: resume.ResumeRecord | None = None) -> None:
        self.spec = spec
        self.rt = rt
        self._on_change = on_change
        self._hooks = hooks
        self.state = PhaseState.PENDING
        self.since = time.time()
        self.why = "not started"
        self.attempt = 0
        self.children: list[Child] = []  # this attempt's, in start order
        self.kept: list[Child] = []  # daemons with lifetime = "lifecycle", handed on at success
        self.outcome: Verdict | None = None  # what ended the current attempt
        self.up = False  # a service whose command runs (and answered its ready check)
        self.was_up = False
        self._consecutive_failures = 0
        self._restart_times: list[float] = []
        self._attempt_mono = 0.0
        self._deadline: Timer | None = None
        self._backoff: Timer | None = None
        self._ready: ReadinessWait | None = None
        self._aborting = False
        self.extra_env: dict[str, str] = {}  # what the supervisor tells the phase (memory budget, hooks)
        self.facts: dict[str, Any] = {}  # what a later start needs to resume (kept in resume.json)
        self._record = record if record is not None else resume.ResumeRecord()  # the last run's facts
        self.hold: str | None = None  # why the lifecycle may not go past this DONE phase yet (Lifecycle writes it)
        self.started = False  # the lifecycle reached it (a phase stopped before that never started)
        self.parsed: Any = None  # what the output hook's parser read (None: no parser, or not run yet)
        self._parser: OutputParser | None = None
        self._broken: Verdict | None = None  # the supervisor's own bug failed this phase (internal_error)
        self._stop_over = False  # this attempt's children are all stopped (see fail_internally)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def command_child(self) -> Child | None:
        return next((c for c in self.children if c.spec is self.spec.command), None)

    @property
    def kept_result(self) -> Any:
        """The parsed result this phase keeps as a fact (the bench's, resumed after a restart and shown
        by ``status``), else None: a parser whose result is only a verdict (the warm-up's) keeps none."""
        output = self._hooks.output
        return self.parsed if output is not None and output.fact is not None else None

    # ------------------------------------------------------------ transitions

    def transition(self, new: PhaseState, why: str) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"phase {self.name}: no transition {self.state} → {new}")
        old, self.state, self.since, self.why = self.state, new, time.time(), why
        if new is not PhaseState.RUNNING or self.spec.kind != "service":
            self.up = False
        self.rt.log(f"phase {self.name}: {old} → {new} ({why})")
        self._on_change(self)

    def _is_current(self, attempt: int, *states: PhaseState) -> bool:
        """A callback made for ``attempt`` may still act: that attempt is the phase's, in one of ``states``."""
        return attempt == self.attempt and self.state in states

    def start(self) -> None:
        if self.started:
            return  # under way: resume may still be looking at its output files (off the loop)
        self.started = True
        self._record.check(self, self._hooks.output, self._resume_or_run)

    def _resume_or_run(self, resumed: tuple[str, Any] | None) -> None:
        """Resume's answer (at once, or once its look at the output files came back): done, or run."""
        if self.state is not PhaseState.PENDING or self._aborting:
            return  # the supervisor shut down meanwhile
        if resumed is not None:
            why, self.parsed = resumed
            self.facts = self._record.previous(self.name)
            self.transition(PhaseState.DONE, f"resumed: {why}")
            return
        if not self._prepared(lambda: memory_preflight(self)):
            return
        if self.spec.timeout_s is not None:
            self._deadline = self.rt.loop.call_later(self.spec.timeout_s, self._deadline_passed,
                                                     on_error=self.fault_handler("the deadline timer"))
        self._start_attempt()

    def available_memory(self) -> int | None:
        """What this phase can have: the machine's (cgroup limit or MemTotal), capped by its memory_max."""
        return self.rt.available_memory(self.spec.memory_max)

    def hook_context(self) -> HookContext:
        """What a hook may know of this phase: its name, its memory, the GPUs' latest sample, state_dir, the log."""
        gpus = self.rt.gpus.samples() if self.rt.gpus is not None else ()
        return HookContext(self.name, self.available_memory(), tuple(gpus), self.rt.state_dir, self.rt.log)

    def _prepared(self, prepare: Callable[[], dict[str, str] | Refusal]) -> bool:
        """A step before running (the memory preflight, the prepare hook): what it returns is added to the
        children's environment; a refusal fails the phase (False)."""
        prepared = prepare()
        if isinstance(prepared, Refusal):
            self._fail(prepared.reason, prepared.detail)
            return False
        self.extra_env.update(prepared)
        return True

    # ------------------------------------------------------------ an attempt

    def _start_attempt(self) -> None:
        hook = self._hooks.prepare
        if hook is not None and not self._prepared(lambda: hook(self.hook_context())):
            return
        self.attempt += 1
        self.children = []
        self.outcome = None
        self._attempt_mono = time.monotonic()
        if self.rt.memory is not None:
            self.rt.memory.reset_peak(self.name)
        self.transition(PhaseState.STARTING, f"attempt {self.attempt}")
        if self.spec.stall_s is not None:
            self._watch_for_stall(self.attempt)
        self._start_daemon(0, self.attempt)

    def _start_daemon(self, index: int, attempt: int) -> None:
        if not self._is_current(attempt, PhaseState.STARTING):
            return  # a late readiness answer for an attempt that is already over
        if index == len(self.spec.daemons):
            self._start_command()
            return
        spec = self.spec.daemons[index]
        child = self._spawn(spec)
        if child is None:
            return
        if spec.ready is None:
            self._start_daemon(index + 1, attempt)
            return
        self.rt.log(f"waiting for {spec.label} to be ready: {spec.ready.describe()} "
                    f"(at most {spec.ready_timeout_s:g}s)")
        self._wait_until_ready(child, attempt, lambda: self._daemon_ready(child, index, attempt))

    def _wait_until_ready(self, child: Child, attempt: int, on_ready: Callable[[], None]) -> None:
        assert child.spec.ready is not None
        what = f"the readiness wait of {child.label}"
        self._ready = ReadinessWait(self.rt.loop, child.spec.ready, child.spec.ready_timeout_s,
                                    on_ready=self.guarded(what, on_ready),
                                    on_timeout=self.guarded(what, lambda why: self._not_ready(child, attempt, why)))

    def _daemon_ready(self, child: Child, index: int, attempt: int) -> None:
        if self._is_current(attempt, PhaseState.STARTING):
            self.rt.log(f"{child.label} is ready ({child.spec.ready.describe() if child.spec.ready else ''})")
            self._start_daemon(index + 1, attempt)

    def _not_ready(self, child: Child, attempt: int, why: str) -> None:
        if not self._is_current(attempt, *ATTEMPT_RUNS):
            return
        detail = f"{child.label} not ready after {child.spec.ready_timeout_s:g}s: {why}"
        child.stop_reason = v.TIMEOUT
        self._end_attempt(v.without_exit(
            self.name, child.spec.name, v.TIMEOUT, 1, detail, attempt=attempt,
            started_at=child.started_at, last_lines=child.output.last_lines(),
        ))

    def _start_command(self) -> None:
        child = self._spawn(self.spec.command)
        if child is None:
            return
        self.transition(PhaseState.RUNNING, f"{child.label} pid {child.pid}")
        if self.spec.kind != "service":
            return
        if self.spec.command.ready is None:
            self._service_up()
            return
        attempt = self.attempt
        self._wait_until_ready(child, attempt, lambda: self._service_up()
                               if self._is_current(attempt, PhaseState.RUNNING) else None)

    def _service_up(self) -> None:
        self.up = self.was_up = True
        self.rt.log(f"phase {self.name}: service is up")
        self._on_change(self)

    def _spawn(self, spec: ChildSpec) -> Child | None:
        output, parser, reader = self._hooks.output, None, None
        if spec is self.spec.command and output is not None:
            # What the parser reads decides the phase: a parser that raises fails it (internal_error).
            parser = output.new_parser()
            reader = self.guarded(output.parser_name, parser.feed)
        try:
            child = start_child(self, spec, reader, self._child_exited)
        except SpawnError as exc:
            self._end_attempt(v.without_exit(self.name, spec.name, v.SPAWN_FAILED, exc.status, exc.reason,
                                             attempt=self.attempt))
            return None
        if parser is not None:
            self._parser, self.parsed = parser, parser.result
        self.children.append(child)
        self.rt.started.append(child)
        return child

    # ------------------------------------------------------------ events

    def _child_exited(self, child: Child, status: ExitStatus) -> None:
        verdict = exit_verdict(self, child, status)
        output, parser = self._hooks.output, self._parser
        if child.spec is self.spec.command and output is not None and parser is not None \
                and child.stop_reason is None:
            # Only a command that ended by itself is judged by its output: one the supervisor stopped
            # (its daemon died, shutdown) never printed its result, and that is not its failure.
            verdict = output.judge(verdict, parser.result, self.rt.log)
        self.rt.record(verdict)
        if child.stop_reason is not None or self._aborting:
            return  # we asked for this; the stop in progress takes it from here
        if child in self.kept:
            self._on_change(self)  # a kept daemon died: the lifecycle decides
            return
        if child in self.children and self.state in ATTEMPT_RUNS:
            self._end_attempt(verdict)

    def _deadline_passed(self) -> None:
        if self.state in FINAL_STATES or self._aborting:
            return
        self._before_deciding()
        if self.state in FINAL_STATES or self._aborting:
            return
        detail = f"phase deadline timeout_s={self.spec.timeout_s:g} passed"
        self.rt.log(f"phase {self.name}: {detail}")
        if self.state is PhaseState.BACKOFF:
            self._fail(v.TIMEOUT, detail)
            return
        self._abort_attempt(v.TIMEOUT, detail)
        # In STOPPING the attempt is ending anyway; its outcome decides.

    def _abort_attempt(self, reason: str, detail: str) -> None:
        """The supervisor ends the attempt (deadline, stall): the command's verdict carries why."""
        if self.state not in ATTEMPT_RUNS:
            return
        self._mark_stopped_for(reason, detail)
        command = self.command_child
        if command is None or not command.running:  # still waiting for daemons
            self._end_attempt(v.without_exit(self.name, self.name, reason, 1, detail, attempt=self.attempt))
        else:
            self._end_attempt(None, why=detail)

    def _mark_stopped_for(self, reason: str, detail: str) -> None:
        """The verdicts of the children about to be stopped say why (unless one already does)."""
        for child in self.children:
            if child.stop_reason is None:
                child.stop_reason, child.stop_detail = reason, detail

    def _watch_for_stall(self, attempt: int) -> None:
        assert self.spec.stall_s is not None

        def stalled(silent: str) -> None:
            self.rt.log(f"phase {self.name}: stalled: {silent} (stall_s={self.spec.stall_s:g})")
            self._abort_attempt(v.STALLED, f"stalled: {silent}")

        StallMonitor(self.rt.loop, self.spec.stall_s, self.rt.gpus, self.rt.progress, self.spec.progress_path,
                     freeze=self.rt.freeze,
                     last_outputs=lambda: [c.output.last_output_at for c in self.children if c.output.last_output_at],
                     drain=self._before_deciding, current=lambda: self._is_current(attempt, *ATTEMPT_RUNS),
                     on_stall=stalled, on_error=self.fault_handler("the stall check"))

    def _before_deciding(self) -> None:
        """Before a stall or deadline decision: what the children already printed is read (a child that
        printed all along must not be judged silent on output still in its pipe), and the clock is
        looked at, so a freeze of the supervisor is said before what it caused."""
        for child in self.children:
            child.drain_output()
        if self.rt.freeze is not None:
            self.rt.freeze.notice()

    # ------------------------------------------------------------ the end of an attempt

    def _end_attempt(self, outcome: Verdict | None, why: str = "") -> None:
        """The attempt is over: stop its children (reverse start order), then decide."""
        if self.state not in ATTEMPT_RUNS:
            return
        if self._ready is not None:
            self._ready.cancel()
        self.outcome = outcome
        if outcome is not None and outcome.pid is None:
            self.rt.record(outcome)  # no child will be reaped for it: record it now
        if outcome is not None and outcome.success and self.spec.kind == "oneshot":
            # The phase succeeded: daemons with lifetime = "lifecycle" live on into the later phases.
            self.kept = [c for c in self.children if c.spec.lifetime == "lifecycle" and c.running]
        self._stop_over = False
        self.transition(PhaseState.STOPPING, why or (outcome.detail if outcome else ""))
        stop_in_order(self.rt, [c for c in reversed(self.children) if c not in self.kept],
                        "phase attempt over", self.guarded("the end of an attempt", self._attempt_stopped))

    def _attempt_stopped(self) -> None:
        if self.state is not PhaseState.STOPPING:
            return
        self._stop_over = True
        finished = set(map(id, self.children)) - set(map(id, self.kept))
        self.rt.started = [c for c in self.rt.started if id(c) not in finished]
        if self.rt.memory is not None and not self.kept:
            # Whatever is still in the phase's cgroup escaped every other way of finding it
            # (double fork + setsid + a cleared environment): it goes too.
            kill_pids(self.rt.memory.leftover_pids(self.name), self.rt.log,
                      f"still in phase {self.name}'s cgroup after its children stopped (escaped the process tree)")
        if self.outcome is None:
            # The supervisor ended it (the deadline, a stall): the command's verdict says how it ended.
            command = self.command_child
            self.outcome = self.rt.verdict_of(command) if command is not None else None
        outcome = self.outcome
        if outcome is None:  # pragma: no cover - the command is always reaped before this point
            outcome = self.outcome = v.without_exit(self.name, self.name, v.TIMEOUT, 1, "deadline",
                                                    attempt=self.attempt)
        if self._aborting:
            self.transition(PhaseState.STOPPED, "supervisor shutdown")
            return
        now = time.monotonic()
        step, why = after_attempt(self.spec, outcome, self.attempt, deadline_expired=self._deadline_expired(),
                                  restart_times=self._restart_times, now=now)
        if step is Next.DONE:
            self._done(why)
        elif step is Next.FAIL:
            self._fail(None, why)
        else:
            if self.spec.kind == "service":
                self._restart_times = [*within_window(self._restart_times, now, self.spec.restart_window_s), now]
            self._schedule_next_attempt(why)

    def _schedule_next_attempt(self, why: str) -> None:
        ran_for = time.monotonic() - self._attempt_mono
        # An attempt that ran well for a while earns a fresh start of the backoff.
        if ran_for >= self.spec.backoff_reset_s > 0:
            self._consecutive_failures = 0
        self._consecutive_failures += 1
        delay = backoff_delay(self._consecutive_failures, self.spec.backoff_s, self.spec.backoff_factor,
                              self.spec.backoff_max_s, self.spec.backoff_jitter, self.rt.rng.random())
        self.transition(PhaseState.BACKOFF, f"{why}; next attempt in {delay:.2f}s")
        self._backoff = self.rt.loop.call_later(delay, self._backoff_over,
                                                on_error=self.fault_handler("the backoff timer"))

    def _backoff_over(self) -> None:
        if self.state is PhaseState.BACKOFF and not self._aborting:
            self._start_attempt()

    def _deadline_expired(self) -> bool:
        return self._deadline is not None and self._deadline.when <= time.monotonic()

    # ------------------------------------------------------------ the end of the phase

    def _done(self, why: str) -> None:
        """Done: once resume has its facts (its output files are listed off the loop), the phase concludes."""

        def conclude(facts: dict[str, Any]) -> None:
            if self.state is not PhaseState.STOPPING or self._aborting:
                return  # the supervisor shut down meanwhile: the shutdown settles the phase
            self.facts = facts
            self._conclude(PhaseState.DONE, why)

        resume.facts_of(self, self._hooks.output, conclude)

    def _fail(self, reason: str | None, detail: str, status: int = 1) -> None:
        """The one road to FAILED. ``reason``: the supervisor's own finding (memory preflight, prepare,
        the deadline in a backoff), recorded as the outcome since no child's exit says it; None when
        the outcome already recorded (the attempt's verdict, an internal error) says why."""
        if reason is not None:
            self.outcome = v.without_exit(self.name, self.name, reason, status, detail, attempt=self.attempt)
            self.rt.record(self.outcome)
        self._conclude(PhaseState.FAILED, detail)

    def _conclude(self, state: PhaseState, why: str) -> None:
        self._cancel_timers()
        if not self.kept and self.rt.memory is not None:
            self.rt.memory.release_phase(self.name)
        self.transition(state, why)

    # ------------------------------------------------------------ the supervisor's own bugs

    def fault_handler(self, what: str) -> ErrorHandler:
        """The error handler for a callback this phase registers: ``what`` names the callback."""
        return lambda exc: self.fail_internally(what, exc)

    def guarded(self, what: str, callback: Callable[..., object]) -> Callable[..., None]:
        """``callback`` made unable to raise into its caller (a tap, a watcher, a thread's answer)."""
        return contained(callback, self.fault_handler(what))

    def fail_internally(self, what: str, exc: Exception) -> None:
        """A bug of the supervisor's own while handling this phase (``what`` raised ``exc``).

        Logged once with its traceback; the phase fails for good with reason internal_error
        (retrying would only hide the bug) and the lifecycle takes it from there. Its children
        are stopped on purpose, so their verdicts read ``stopped``: it is not their failure.
        """
        self.rt.loop.faults.report(f"phase {self.name}: {what}", exc)
        if self.state in FINAL_STATES or self._broken is not None or self._aborting:
            return  # failed already, or the shutdown ends it anyway: the log line above is all
        detail = f"internal error in {what}: {summary(exc)} (a supervisor bug: the traceback is in supervisor.log)"
        self._broken = v.without_exit(self.name, self.name, v.INTERNAL_ERROR, EXIT_INTERNAL_ERROR, detail,
                                      attempt=self.attempt)
        if self.state in ATTEMPT_RUNS:
            self._mark_stopped_for(v.STOPPED, detail)
            self._end_attempt(self._broken)  # records it; _attempt_stopped then fails the phase
            return
        if self.state is PhaseState.STOPPING and not self._stop_over:
            self.outcome = self._broken
            self.rt.record(self._broken)
            return  # the stop in progress ends in _attempt_stopped, which sees the outcome
        self._fail(v.INTERNAL_ERROR, detail, EXIT_INTERNAL_ERROR)

    # ------------------------------------------------------------ shutdown

    def abort(self) -> None:
        """The supervisor is shutting down: no new attempts; children are stopped by the lifecycle."""
        self._aborting = True
        self._cancel_timers()
        if self._ready is not None:
            self._ready.cancel()

    def _cancel_timers(self) -> None:
        for timer in (self._deadline, self._backoff):
            if timer is not None:
                timer.cancel()

    def settle_after_shutdown(self) -> None:
        if self.state in ATTEMPT_RUNS:
            self.transition(PhaseState.STOPPING, "supervisor shutdown")
        if self.state not in FINAL_STATES:
            self.transition(PhaseState.STOPPED, "supervisor shutdown")

    def live_children(self) -> list[Child]:
        return [c for c in self.children + self.kept if c.running]
