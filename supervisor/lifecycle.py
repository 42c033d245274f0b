"""The lifecycle: the phases in order, and when the whole run is over, with which status.

Each phase is a state machine of its own (supervisor/phase.py; its states and the diagram of its
moves in supervisor/states.py).
The lifecycle starts the first phase still PENDING once every phase before it is past: DONE and
not held, or a service that has come up. A phase that fails for good, or a daemon kept for the
rest of the lifecycle that dies, shuts the whole run down: every child is stopped in reverse
start order, then the run ends with the status of what ended it.
"""

from __future__ import annotations

from collections.abc import Callable

from .config import PhaseSpec, Plan
from .exits import EXIT_FAILURE, EXIT_INTERNAL_ERROR, EXIT_OK
from .hooks import NO_HOOKS, PhaseHooks
from .loop import contained
from .phase import Phase
from .process import Child
from .resume import ResumeRecord
from .runtime import VERDICTS_KEPT_PER_PHASE, Runtime, stop_in_order, tell_listeners
from .states import FINAL_STATES, PhaseState
from .verdict import Verdict

# Other modules and the tests import these from here.
__all__ = ["FINAL_STATES", "VERDICTS_KEPT_PER_PHASE", "Lifecycle", "Phase", "PhaseState", "Runtime",
           "stop_in_order"]


class Lifecycle:
    """Runs the phases in order and decides when the whole run is over, and with which status."""

    def __init__(self, plan: Plan, rt: Runtime, on_finished: Callable[[int], None],
                 hooks_for: Callable[[PhaseSpec], PhaseHooks] = lambda spec: NO_HOOKS,
                 record: ResumeRecord | None = None) -> None:
        self.plan = plan
        self.rt = rt
        # What a phase does beyond running children comes from the hooks it is given (the prover's,
        # from run.py): the lifecycle itself knows nothing of cuzk.
        # The last run's facts (resume), offered to each phase.
        self.phases = [Phase(spec, rt, self._phase_changed, hooks_for(spec), record) for spec in plan.phases]
        self._on_finished = on_finished
        self.listeners: list[Callable[[Phase], None]] = []  # every phase transition (reporting, status)
        self.on_shutdown: list[Callable[[str, int], None]] = []
        self.shutdown_reason = ""
        self.shutting_down = False
        self.exit_status: int | None = None
        self.failure: Verdict | None = None

    def start(self) -> None:
        self._advance()

    def current(self) -> Phase | None:
        """The phase the lifecycle is at: the last one started."""
        started = [p for p in self.phases if p.started]
        return started[-1] if started else None

    def _advance(self) -> None:
        if self.shutting_down:
            return
        for phase in self.phases:
            if phase.state is PhaseState.PENDING:
                contained(phase.start, phase.fault_handler("its start"))()
                return
            if phase.hold is not None:
                return  # done, but the lifecycle may not go past it yet (see hold)
            if phase.state is PhaseState.DONE:
                continue
            if phase.spec.kind == "service" and phase.was_up:
                continue
            return  # this phase is still on its way
        if all(p.state is PhaseState.DONE for p in self.phases):
            self.rt.log("lifecycle complete: every phase done")
            self.shutdown("lifecycle complete", EXIT_OK)

    def production(self) -> list[Phase]:
        """The production service: the phase with ``report = "running"``, else the last service."""
        return [p for p in self.phases if p.spec.report == "running"] or \
            [p for p in self.phases if p.spec.kind == "service"][-1:]

    def hold(self, phase: Phase, why: str) -> None:
        """The lifecycle may not go past ``phase`` (DONE) until ``release``: the bench gate waits for the
        manager's verdict on the bench before production starts."""
        phase.hold = why  # the lifecycle's mark on the phase: hold and release are its only writers

    def release(self, phase: Phase) -> None:
        """The hold on ``phase`` is over: the lifecycle moves on."""
        if phase.hold is not None:
            self.rt.log(f"phase {phase.name}: hold released ({phase.hold})")
            phase.hold = None
            self._advance()

    def _phase_changed(self, phase: Phase) -> None:
        tell_listeners(self.rt, "listener", self.listeners, phase, phase=phase.name)
        if self.shutting_down:
            return
        if phase.state is PhaseState.FAILED:
            self.failure = phase.outcome
            status = phase.outcome.status if phase.outcome else EXIT_FAILURE
            self.shutdown(f"phase {phase.name} failed", status or EXIT_FAILURE)
            return
        dead_kept = [c for c in phase.kept if not c.running]
        if dead_kept:
            child = dead_kept[0]
            self.failure = self.rt.verdict_of(child)
            status = self.failure.status if self.failure else EXIT_FAILURE
            self.shutdown(f"{child.label} (kept for the rest of the lifecycle) died", status or EXIT_FAILURE)
            return
        if phase.state is PhaseState.DONE or phase.up:
            self._advance()

    def forward(self, signum: int) -> list[Child]:
        """Send a signal to the command of every phase that runs one; returns who got it."""
        sent = []
        for phase in self.phases:
            child = phase.command_child
            if phase.state is PhaseState.RUNNING and child is not None and child.running:
                child.send_group_signal(signum)
                sent.append(child)
        return sent

    def shutdown(self, why: str, status: int) -> None:
        """Stop everything in reverse start order, then report ``status``."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self.exit_status = status
        self.shutdown_reason = why
        self.rt.log(f"shutting down: {why}")
        for phase in self.phases:
            phase.abort()
        # Child.stop signals at once and scans the tree after; one that is gone costs nothing.
        stop_in_order(self.rt, list(reversed(self.rt.started)), "supervisor shutdown",
                        contained(self._finished, self._finish_anyway))
        # After the first stop signal is out: listeners may write to disk (the outbox fsyncs).
        tell_listeners(self.rt, "shutdown listener", self.on_shutdown, why, status)

    def kill_everything_now(self) -> None:
        """A second shutdown request: no more grace for anyone."""
        for child in self.rt.started:
            child.kill_now()

    def _finished(self) -> None:
        for phase in self.phases:
            phase.settle_after_shutdown()
        assert self.exit_status is not None
        self._on_finished(self.exit_status)

    def _finish_anyway(self, exc: Exception) -> None:
        """Settling the phases raised: the run still ends, with the status it was ending with."""
        self.rt.loop.faults.report("the end of the shutdown", exc)
        self._on_finished(self.exit_status if self.exit_status is not None else EXIT_INTERNAL_ERROR)
