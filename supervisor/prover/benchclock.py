"""The manager's benchmark clock: the warm-up and the bench share one budget, counted on the manager's clock.

The manager kills a row still in ``params_done`` 45 minutes after its ``param_done_at`` ("benchmark timeout
(45min)", manager-api.md), whatever the supervisor does: a restart mid-bench gets no fresh budget from it.
So every phase after the ``report = "param-done"`` phase, up to the ``report = "bench-done"`` one (the
warm-up, the bench), is held to ``[manager] bench_deadline_s`` (default 2700 s) from the earlier of the row's
``param_done_at`` and the fetch's own end (firstseen.py: kept across restarts, shown in status with its
source). A phase of that stretch running, or starting, past it is failed ``too_slow`` (never retried: the
instance is given up): its proofs would end after the manager's kill, and a bench-done then would un-kill a
row whose machine is being destroyed. Each phase's own ``timeout_s`` still holds within it.

Only while the manager's clock runs: its row in ``params_done`` (its other states have no such timeout: a
container restarted days into production that benches again is not given up), or, with no row read, until
a bench-done was delivered and passed (the row has moved on then).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..evidence.transfer import duration
from ..lifecycle import verdict as v
from ..lifecycle.states import PhaseState
from ..manager.row import utc_text
from .fleet import BENCH_DONE, fleet_settings

if TYPE_CHECKING:
    from ..engine.loop import Timer
    from ..manager.row import Row
    from ..wiring import ManagerLink, PhaseView, ProductionControl, Wiring

# The prover's name for the core's clock after the fetch (firstseen.py AFTER_FETCH_CLOCK: Plugin.clocks): the
# name ManagerLink.clock is asked by and status shows.
BENCH_CLOCK = "bench"
# How often a running phase of the stretch is looked at.
BENCH_CLOCK_CHECK_S = 5.0
PARAMS_DONE = "params_done"  # the one state the manager's benchmark timeout applies to


def stretch(phases: list[tuple[str, str | None]]) -> set[str]:
    """The names of the phases after the param-done one, up to and with the bench-done one (``(name, report)``
    in the plan's order); none without both."""
    names = [name for name, _ in phases]
    reports = [report for _, report in phases]
    if "param-done" not in reports or BENCH_DONE not in reports:
        return set()
    start, end = reports.index("param-done") + 1, reports.index(BENCH_DONE) + 1
    return set(names[start:end])


def past_deadline(at: float, source: str, deadline_s: float, now: float) -> str | None:
    """Why the benchmark clock started at ``at`` (what that is: ``source``) is past ``deadline_s``; None: it is not."""
    over = now - (at + deadline_s)
    if over < 0:
        return None
    return (f"the manager's benchmark timeout passed {duration(over)} ago (bench_deadline_s={deadline_s:g} from "
            f"{source}, {utc_text(at)} UTC): it kills this instance at its next pass")


class BenchClock:
    """Fails a phase of the stretch that runs past the manager's benchmark deadline."""

    def __init__(self, deadline_s: float, phases: set[str], link: ManagerLink, production: ProductionControl,
                 call_later: Callable[[float, Callable[[], None]], Timer],
                 now: Callable[[], float] = time.time) -> None:
        self._deadline_s, self._phases, self._link = deadline_s, phases, link
        self._production, self._call_later, self._now = production, call_later, now
        self._watching: tuple[str, int] | None = None  # (phase, attempt) running
        self._state: str | None = None  # the row's state, as last read (None: never read)

    def heard_row(self, row: Row) -> None:
        self._state = row.state

    def _runs(self) -> bool:
        """Does the manager's benchmark clock run for this instance now?"""
        if self._state is not None:
            return self._state == PARAMS_DONE
        answer = self._link.delivered_answer(BENCH_DONE)
        return not (isinstance(answer, dict) and answer.get("passed") is True)

    def transition(self, view: PhaseView) -> None:
        if view.name not in self._phases:
            return
        if view.state is not PhaseState.RUNNING:
            if self._watching is not None and self._watching[0] == view.name:
                self._watching = None
            return
        self._watching = (view.name, view.attempt)
        self.check(self._watching)

    def check(self, watching: tuple[str, int]) -> None:
        if watching != self._watching:
            return  # another attempt, or it ended
        clock = self._link.clock(BENCH_CLOCK) if self._runs() else None
        why = past_deadline(*clock, self._deadline_s, self._now()) if clock is not None else None
        if why is not None:
            self._watching = None
            self._production.fail_phase(watching[0], v.TOO_SLOW, why)  # it says the why, once
            return
        self._call_later(BENCH_CLOCK_CHECK_S, lambda: self.check(watching))


def attach(wiring: Wiring) -> None:
    """Part of the prover's Plugin.attach: where a manager's benchmark timeout applies."""
    deadline_s = fleet_settings(wiring.plan).bench_deadline_s
    phases = stretch([(p.name, p.report) for p in wiring.plan.phases])
    if wiring.manager is None or deadline_s <= 0 or not phases:
        return
    wiring.manager.deadline(BENCH_CLOCK, deadline_s)
    clock = BenchClock(deadline_s, phases, wiring.manager, wiring.production, wiring.call_later)
    wiring.manager.on_row(clock.heard_row)
    wiring.events.on_transition(clock.transition)
