"""The lifecycle: the phases in order, and when the whole run is over, with which status.

Each phase is a state machine of its own (supervisor/lifecycle/phase.py; its states and the diagram of its
moves in supervisor/lifecycle/states.py).
The lifecycle starts the first phase still PENDING once every phase before it is past: DONE and
not held, or a service that has come up. A phase that fails for good, or a daemon kept for the
rest of the lifecycle that dies, shuts the whole run down: every child is stopped in reverse
start order, then the run ends with the status of what ended it.

What is the lifecycle's business, not a phase's, it keeps itself, by phase name: how far it has
come (the phases it started), which DONE phases it may not go past yet (``hold``/``release``, what
the bench gate drives), and whether the run is shutting down (``shutting_down``: each phase asks it,
and ``shutdown`` tells each one, ``shut_down``; the observers hear it once, ``shutdown_began``).

It holds the run's one exit status (``exit_status``, decided at its shutdown): the exit, the exit flush
and the status view read it here. Who reacts to a phase's move, a verdict or the shutdown is named in
one record, ``Observers`` (below), told in a fixed order after each, before the lifecycle's own
decision follows (``_phase_changed``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import PARAM_DONE, RUNNING, PhaseSpec, Plan
from ..engine.loop import EventLoop, Faults, Timer, contained, name_of
from ..engine.process import Child, stop_in_order
from ..engine.stopbudget import StopBudget
from ..exits import EXIT_FAILURE, EXIT_INTERNAL_ERROR, EXIT_OK
from ..state.firstseen import FirstSeen
from .children import Spawn
from .hooks import NO_HOOKS, PhaseHooks
from .phase import Phase
from .resume import SURVEY_BOUND_S, ResumeRecord
from .runtime import Runtime
from .states import (
    ATTEMPT_RUNS,
    FINAL_STATES,
    NOBODY,
    SHUTDOWN_WHY,
    Deaf,
    PhaseLike,
    PhaseState,
    PhaseView,
    ShutdownView,
)
from .verdict import Verdict

# How long the end of a shutdown waits for a completed phase's facts (its outputs listed off the loop, bounded by
# SURVEY_BOUND_S), before it ends the run without them; a stop signal's budget cuts it shorter.
FACTS_WAIT_S = SURVEY_BOUND_S + 5.0


class Lifecycle:
    """Runs the phases in order and decides when the whole run is over, and with which status."""

    def __init__(self, plan: Plan, rt: Runtime, on_finished: Callable[[], None],
                 hooks_for: Callable[[PhaseSpec], PhaseHooks] = lambda spec: NO_HOOKS,
                 record: ResumeRecord | None = None, spawn: Spawn | None = None) -> None:
        self.plan = plan
        self._loop, self._log, self._verdicts, self._started = rt.loop, rt.log, rt.verdicts, rt.started
        # What a phase does beyond running children comes from the hooks it is given (the prover's,
        # from the composition root): the lifecycle itself knows nothing of cuzk. ``record``: the last
        # run's facts (resume), offered to each phase. ``spawn``: how children start (tests: fake ones).
        self.phases = [Phase(spec, rt, self._phase_changed, hooks_for(spec), record=record, lifecycle=self,
                             spawn=spawn) for spec in plan.phases]
        self._reached: list[Phase] = []  # the phases started, in order
        self._holds: dict[str, str] = {}  # DONE phase's name → why the lifecycle may not go past it yet
        self._hold_ends: dict[str, float] = {}  # its name → when the holder lets it go at the latest (monotonic)
        self._on_finished = on_finished  # the run is over: every child stopped, ``exit_status`` final
        # Who reacts to each move, verdict and the shutdown, in order (the composition root names them); the
        # verdict record tells them of each verdict.
        self.observers = Observers(rt.loop, rt.loop.faults)
        assert rt.verdicts.observers is None, "the verdicts are heard by the lifecycle that records them"
        rt.verdicts.observers = self.observers
        self.shutdown_reason = ""
        self.shutting_down = False
        self.exit_status: int | None = None  # the run's one exit status, decided at the shutdown
        self.over = False  # the shutdown is done: every child stopped (or given up on past SIGKILL), every phase ended
        self.failure: Verdict | None = None
        self._phases_told = True  # (False while the shutdown tells each phase, after the stop's first signals)
        self._stop_over = False  # the shutdown's stop is over: every child is gone
        self._budget: StopBudget | None = None  # the shutdown's, where a stop signal from outside set one
        self._facts_timer: Timer | None = None  # the end of the wait for a completed phase's facts
        self._kill_until: float | None = None  # a kill-now's stop budget end (monotonic): the wait ends by then

    def start(self) -> None:
        self._advance()

    def current(self) -> Phase | None:
        """The phase the lifecycle is at: the last one started."""
        return self._reached[-1] if self._reached else None

    def _advance(self) -> None:
        if self.shutting_down:
            return
        for phase in self.phases:
            if phase.state is PhaseState.PENDING:
                if phase not in self._reached:  # else under way: resume may still be looking at its output files
                    self._reached.append(phase)
                    contained(phase.start, phase.fault_handler("its start"))()
                return
            if phase.name in self._holds:
                return  # done, but the lifecycle may not go past it yet (see hold)
            if phase.state is PhaseState.DONE:
                continue
            if phase.spec.kind == "service" and phase.was_up:
                continue
            return  # this phase is still on its way
        if all(p.state is PhaseState.DONE for p in self.phases):
            self._log("lifecycle complete: every phase done")
            self.shutdown("lifecycle complete", EXIT_OK)

    def kept_before(self, phase: str) -> list[Child]:
        """The daemons the phases before ``phase`` kept (``lifetime = "lifecycle"``), alive: a later phase may be
        what they work for, so its stall watch counts their bytes moved (evidence/stall.py)."""
        before = itertools.takewhile(lambda p: p.name != phase, self.phases)
        return [child for p in before for child in p.kept if child.running]

    def production_phases(self) -> list[Phase]:
        """The production service: the phase with ``report = "running"``, else the last service."""
        return [p for p in self.phases if p.spec.report == RUNNING] or \
            [p for p in self.phases if p.spec.kind == "service"][-1:]

    def hold(self, name: str, why: str, for_s: float | None = None) -> None:
        """The lifecycle may not go past phase ``name`` (DONE) until ``release``: the bench gate waits for
        the manager's verdict on the bench before production starts (ProductionControl, wiring.py).
        ``for_s``: how long the holder waits at most (status shows the time left)."""
        self._holds[name] = why
        if for_s is not None:
            self._hold_ends[name] = self._loop.clock.monotonic() + for_s

    def release(self, name: str) -> None:
        """The hold on phase ``name`` is over: the lifecycle moves on."""
        if name in self._holds:
            self._hold_ends.pop(name, None)
            self._log(f"phase {name}: hold released ({self._holds.pop(name)})")
            self._advance()

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        """A watcher's finding (a GPU fault, proofs failing) ends phase ``name``'s attempt with ``reason``, as a
        deadline or a stall would: its retries or restart policy then decide. False: it runs no attempt now."""
        phase = next((p for p in self.phases if p.name == name), None)
        if phase is None or self.shutting_down or phase.state not in ATTEMPT_RUNS:
            return False
        self._log(f"phase {name}: {reason}: {detail}")
        phase.abort_attempt(reason, detail)
        return True

    def held(self, name: str) -> str | None:
        """Why the lifecycle may not go past phase ``name`` yet, or None (status shows it)."""
        return self._holds.get(name)

    def hold_ends(self, name: str) -> float | None:
        """When the hold on phase ``name`` ends at the latest (monotonic), if its holder said."""
        return self._hold_ends.get(name) if name in self._holds else None

    def _phase_changed(self, phase: Phase) -> None:
        """A phase moved (or came up, or lost a kept daemon): the observers hear of it, then the lifecycle
        decides what follows for the run: shut down, go on to the next phase, or nothing yet."""
        self.observers.phase_changed(phase)
        if self.shutting_down:
            if phase.state is PhaseState.FAILED and self.failure is not None and self.failure.pid is None \
                    and self.failure.phase == phase.name and phase.outcome is not None:
                self.failure = phase.outcome  # judged by its reason at the shutdown (a timeout): now its exit's
            if self._stop_over and self._phases_told:
                self._end_once_final()  # (a phase's facts came in after the stop was over)
            return
        if phase.state is PhaseState.FAILED:
            self.failure = phase.outcome
            status = self.failure.status if self.failure else EXIT_FAILURE
            self.shutdown(f"phase {phase.name} failed", status or EXIT_FAILURE)
            return
        dead_kept = [c for c in phase.kept if not c.running]
        if dead_kept:
            child = dead_kept[0]
            self.failure = self._verdicts.verdict_of(child)
            status = self.failure.status if self.failure else EXIT_FAILURE
            self.shutdown(f"{child.label} (kept for the rest of the lifecycle) died", status or EXIT_FAILURE)
            return
        if phase.state is PhaseState.DONE or phase.up:
            self._advance()

    def forward(self, signum: int) -> list[Child]:
        """Send a signal to the command of every phase that runs one (a stopping phase's too: its command may be in
        its grace); returns who got it."""
        sent = []
        for phase in self.phases:
            child = phase.command_child
            if child is not None and child.running:
                child.send_group_signal(signum)
                sent.append(child)
        return sent

    def shutdown(self, why: str, status: int, budget: StopBudget | None = None) -> None:
        """Stop everything in reverse start order, then report ``status``; within ``budget`` where a stop
        signal from outside set one (each child's grace shrunk to fit)."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self._budget = budget
        failed = None if self.failure is not None else next(
            (judged for p in self.phases if (judged := p.failed_for_good()) is not None), None)
        said = why
        if failed is not None:
            # An attempt had failed for good and was being stopped when the stop came (a daemon's grace, a timed
            # out command's): the failure came first, and stays the run's (its status, the termination log, the
            # give-up), and so does why the run ends, as without the stop; the log says what came after it.
            self.failure = failed
            status = failed.status or EXIT_FAILURE
            why = f"phase {failed.phase} failed"
            said = f"{why} ({said} while its attempt was being stopped)"
        self.exit_status = status
        self.shutdown_reason = why
        self._log(f"shutting down: {said}")
        # The first wave's stop signal goes out first (Child.stop signals at once and scans the tree after; one
        # that is gone costs nothing): telling each phase (no new attempt, no start, its timers cancelled) is
        # bookkeeping of this same turn of the loop, where no child's exit is heard yet. A stop over at once
        # (nothing ran) ends the phases (end_after_shutdown) only once each was told (_finished).
        finish = contained(self._finished, self._finish_anyway)
        self._phases_told = False
        try:
            stop_in_order(self._loop, self._log, self._started.newest_first(), SHUTDOWN_WHY, finish, budget)
            for phase in self.phases:
                phase.shut_down()
        finally:  # (whatever raised: a stop that ends later must still end the run)
            self._phases_told = True
        # After the first stop signal is out: the observers may write to disk (the outbox fsyncs). They hear of
        # the shutdown before the phases end, whether the stop ends later (children to stop) or ended at once.
        try:
            self.observers.shutdown_began(ShutdownView(why, status, self.failure, production_was_up(self)), budget)
        finally:  # (a stop over at once must still end the run, whatever raised)
            if self._stop_over:
                finish()

    def stop_from_outside(self, why: str, status: int) -> None:
        """A decision made outside the run ends it (the manager's kill, observers.py): a shutdown while it runs.
        Learnt once every phase had completed (EXIT_OK: the exit was still telling the manager), the run did
        not end well after all: it exits ``status``, for ``why`` (the exit reads the status again after its
        flush, teardown.py). A failure's status, or a stop signal's, stays: it came first, and is what the run
        was ended for."""
        if not self.shutting_down:
            self.shutdown(why, status)
        elif self.exit_status == EXIT_OK and self.failure is None:
            self.exit_status, self.shutdown_reason = status, why

    def kill_everything_now(self, wait_until: float | None = None) -> None:
        """A second shutdown request: no more grace for anyone (``wait_until``: its stop budget's end, which ends
        the wait for a completed phase's facts too)."""
        if wait_until is not None:
            self._kill_until = wait_until if self._kill_until is None else min(self._kill_until, wait_until)
            if self._facts_timer is not None:
                self._arm_facts_timer()  # (the wait under way ends by then)
        for child in self._started:
            child.kill_now(SHUTDOWN_WHY, wait_until)

    def _finished(self) -> None:
        self._stop_over = True
        if not self._phases_told:
            return  # the stop was over at once: the shutdown ends the phases once it has told them
        for phase in self.phases:
            phase.end_after_shutdown()
        self._end_once_final()

    def _end_once_final(self) -> None:
        """The run ends once every phase reached its end (done, failed, stopped): a phase whose command completed
        before the shutdown waits for its facts (its outputs listed off the loop, at most resume.SURVEY_BOUND_S),
        then is done, kept for the next start to resume."""
        if self.over:
            return
        if all(phase.state in FINAL_STATES for phase in self.phases):
            assert self.exit_status is not None
            self._end(self.exit_status)
        else:  # (the listing answers within its bound; the timer is for a fault of ours)
            self._arm_facts_timer()

    def _arm_facts_timer(self) -> None:
        """The end of the wait for a completed phase's facts: FACTS_WAIT_S, or less where a stop budget or a
        kill-now's (docker's SIGKILL at its end) leaves less; a timer already due sooner stays."""
        now = self._loop.clock.monotonic()
        wait_s = FACTS_WAIT_S if self._budget is None else self._budget.sweep_s(FACTS_WAIT_S)
        if self._kill_until is not None:
            wait_s = min(wait_s, max(0.0, self._kill_until - now))
        timer = self._facts_timer
        if timer is not None:
            if timer.when <= now + wait_s:
                return
            timer.cancel()
        self._facts_timer = self._loop.call_later(wait_s, self._end_without_facts)

    def _end_without_facts(self) -> None:
        if not self.over:
            waiting = ", ".join(p.name for p in self.phases if p.state not in FINAL_STATES)
            self._log(f"shutdown: the facts of {waiting} did not come; the run ends without them")
            assert self.exit_status is not None
            self._end(self.exit_status)

    def _finish_anyway(self, exc: Exception) -> None:
        """Settling the phases raised: the run still ends, with the status it was ending with."""
        self._loop.faults.report("the end of the shutdown", exc)
        self._end(self.exit_status if self.exit_status is not None else EXIT_INTERNAL_ERROR)

    def _end(self, status: int) -> None:
        self.exit_status, self.over = status, True
        self.observers.run_over()  # the exit writes status.json, with the last batch in it
        self._on_finished()

    def status_at_exit(self) -> int:
        """What the supervisor exits with: the status the shutdown decided, once it is over. Not over (a bug broke
        the loop before the end): it ends here, with EXIT_FAILURE, which every later ask (teardown asks it more
        than once) then answers too."""
        if not self.over:
            self.exit_status, self.over = EXIT_FAILURE, True
        assert self.exit_status is not None
        return self.exit_status


def production_was_up(lifecycle: Lifecycle) -> bool:
    """Did the production service (``report = "running"``, else the last service) ever come up?"""
    return any(p.up or p.was_up for p in lifecycle.production_phases())


# ---------------------------------------------------------------- who hears the lifecycle


class Hears(Protocol):
    """An observer of the lifecycle: what it hears of a phase's move (or its service up, or a kept daemon
    dead), of a verdict recorded, of the shutdown. Each observer has the three, the ones it has no use for
    doing nothing (``Deaf``)."""

    def phase_changed(self, phase: Any) -> None: ...

    def verdict(self, verdict: Verdict) -> None: ...

    def shutdown_began(self, view: ShutdownView) -> None: ...


class StatusFile(Protocol):
    """status.json (status/file.py's StateFile): told once per batch of changes; ``what``, a phase that
    reached its end, is written at once even past the file's burst."""

    def changed(self, what: object = None) -> None: ...


class PluginEvents(Deaf):
    """What a plugin hears (wiring.Events): its listeners, added at its ``attach``, hear frozen views,
    never the Phase. The failure in a ShutdownView is the recorded verdict, masked where it was recorded
    (VerdictRecord): a give-up may quote it to the manager as it is."""

    def __init__(self) -> None:
        self.faults = Faults()  # (the Observers' own, once they hold this: a listener's bug is said as theirs)
        self._transition: list[Callable[[PhaseView], None]] = []
        self._shutdown: list[Callable[[ShutdownView], None]] = []
        self._verdict: list[Callable[[Verdict], None]] = []

    # What the plugin calls (wiring.Events).
    def on_transition(self, listener: Callable[[PhaseView], None]) -> None:
        self._transition.append(listener)

    def on_shutdown(self, listener: Callable[[ShutdownView], None]) -> None:
        self._shutdown.append(listener)

    def on_verdict(self, listener: Callable[[Verdict], None]) -> None:
        self._verdict.append(listener)

    # What the observers tell it: each listener in the order it was added, one that raises costing only itself.
    def phase_changed(self, phase: PhaseLike) -> None:
        if self._transition:
            view = PhaseView.of(phase)
            tell_each(self.faults, "listener", self._transition, view, phase=view.name)

    def verdict(self, verdict: Verdict) -> None:
        tell_each(self.faults, "verdict listener", self._verdict, verdict, phase=verdict.phase)

    def shutdown_began(self, view: ShutdownView) -> None:
        tell_each(self.faults, "shutdown listener", self._shutdown, view)


@dataclass
class Observers:
    """Who reacts to what the lifecycle decides, each by name, told in the order of the fields below (the
    Lifecycle makes the record, the composition root fills it: app/observers.py; a place left empty hears
    nothing):

    - ``resume``: first, so that a phase's facts are kept before anything else reads them;
    - ``clocks``: the instance's clocks (state/firstseen.py): a ``param-done`` phase done ends the fetch and
      starts the clock after it;
    - ``reporter``: the manager hears the why before the plugin's give-up (a shutdown's reason lines first);
    - ``plugin``: after the reporter, before status.json (which shows the plugin's hold);
    - ``first_writes``: at a shutdown under a stop signal's budget, status.json and the termination log are
      written before any child's grace runs (SIGKILL may end the budget);
    - ``status``: last, and once per batch of changes: the changes one event brings (a verdict, the
      attempt's end, the phase's, the lifecycle's shutdown) are written as one status.json at the end of
      the loop's turn, not one each; the batch that ends the run is the exit's to write (teardown.py).
    """

    loop: EventLoop | None = None  # where the status.json of a batch is written from (None: told at once)
    faults: Faults = field(default_factory=Faults)  # where an observer that raises is said (the loop's)
    resume: Hears = NOBODY
    clocks: FirstSeen | None = None
    reporter: Hears = NOBODY
    plugin: PluginEvents = field(default_factory=PluginEvents)
    first_writes: Hears = NOBODY
    status: StatusFile | None = None
    _status_due: Timer | None = field(default=None, init=False, repr=False)
    _status_final: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.plugin.faults = self.faults

    def phase_changed(self, phase: Any) -> None:
        # (a place left empty is not called, nor a plugin that listens to no transition)
        plugin = self.plugin if self.plugin._transition else NOBODY
        hearing = [self.resume.phase_changed] if self.resume is not NOBODY else []
        if self.clocks is not None and phase.spec.report == PARAM_DONE and phase.state is PhaseState.DONE:
            hearing.append(self._fetch_over)
        hearing += [o.phase_changed for o in (self.reporter, plugin) if o is not NOBODY]
        tell_each(self.faults, "listener", hearing, phase, phase=phase.spec.name)
        self._status_changed(phase)

    def verdict(self, verdict: Verdict) -> None:
        plugin = self.plugin if self.plugin._verdict else NOBODY
        hearing = [o.verdict for o in (self.reporter, plugin) if o is not NOBODY]
        tell_each(self.faults, "verdict listener", hearing, verdict, phase=verdict.phase)
        self._status_changed(verdict)

    def shutdown_began(self, view: ShutdownView, budget: StopBudget | None = None) -> None:
        """After the first stop signal is out: these may write to disk (the outbox fsyncs). The first writes only
        under a stop signal's ``budget``."""
        plugin = self.plugin if self.plugin._shutdown else NOBODY
        first_writes = self.first_writes if budget is not None else NOBODY
        hearing = [o.shutdown_began for o in (self.reporter, plugin, first_writes) if o is not NOBODY]
        if hearing:  # (no manager, no plugin listening, no budget: nobody)
            tell_each(self.faults, "shutdown listener", hearing, view)

    def _fetch_over(self, phase: Any) -> None:
        assert self.clocks is not None
        self.clocks.param_done()

    def run_over(self) -> None:
        """The lifecycle is over: the exit writes status.json after its sweep (teardown.py), with this last
        batch in it, so the batch's own write is not made."""
        if self._status_due is not None:
            self._status_due.cancel()
            self._status_due = None

    def _status_changed(self, what: object) -> None:
        """status.json is due at the end of this turn of the loop, once for every change until then; a phase
        that reached its end is what it is told of (written at once, even past the file's burst)."""
        if self.status is None:
            return
        if getattr(what, "state", None) in FINAL_STATES:
            self._status_final = what
        if self.loop is None:
            self._write_status()
        elif self._status_due is None:
            self._status_due = self.loop.call_later(0, self._write_status)

    def _write_status(self) -> None:
        self._status_due, final, self._status_final = None, self._status_final, None
        if self.status is not None:
            tell_each(self.faults, "listener", (self.status.changed,), final)


def tell_each(faults: Faults, kind: str, listeners: Iterable[Callable[[Any], None]], what: Any,
              phase: str | None = None) -> None:
    """Every listener hears of ``what``, in order, whichever raised before it: one that raises (reporting,
    the status file, a plugin's) is logged once and costs what it was for, never the lifecycle."""
    for listener in listeners:
        try:
            listener(what)
        except Exception as exc:
            faults.report(f"the {kind} {name_of(listener)}", exc, phase=phase)
