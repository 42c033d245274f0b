"""What ends a benchmark that can no longer pass in time, on the manager's terms (reason ``too_slow``, never
retried: the instance is given up rather than billed for a bench the manager will refuse or kill):
the manager's benchmark clock (``BenchClock``) and the min_rate cut (``BenchCut``).

**The clock.** The manager kills a row still in ``params_done`` 45 minutes after its ``param_done_at``
("benchmark timeout (45min)", shared/domain/manager-api.md), whatever the supervisor does: a restart mid-bench gets no
fresh budget from it. So every phase after the ``report = "param-done"`` phase, up to the
``report = "bench-done"`` one (the warm-up, the bench), is held to ``[manager] bench_deadline_s`` (default
2700 s) from the row's ``param_done_at`` once a row said it, else the fetch's own end (firstseen.py's
FirstSeen.clock: kept across restarts, shown in status with its source). A phase of that stretch running, or
starting, past it is failed ``too_slow`` (never retried: the instance is given up): its proofs would end after
the manager's kill, and a bench-done then would un-kill a row whose machine is being destroyed. Each phase's
own ``timeout_s`` still holds within it.

Only while the manager's clock runs: its row in ``params_done`` (its other states have no such timeout: a
container restarted days into production that benches again is not given up), or, with no row read this start,
once a param-done reached the manager (this start or an earlier one) and until a bench-done was delivered and
passed (the row has moved on then). A param-done still in the outbox has started no clock: a start killed
after its fetch, while the manager was away, left only the fetch's end, and judged on it the restart gave a
healthy instance up at the warm-up's start, before its first row read said ``registered``.

**The cut.** A benchmark that can no longer reach min_rate is stopped (reason ``too_slow``) and the
instance given up, rather than run its proofs to the end of its deadline before bench-done says no.

The manager passes a bench whose rate, proofs per hour, is at least ``min_rate``; cuzk-bench computes the
rate from ITS total time: completed proofs / total time. With N proofs to run, once that time exceeds
N / min_rate hours no result can pass, whatever the remaining proofs do: even all N completed give less.
Its clock starts after ours (its own start-up, reading the C1 file), right after it prints its header
(``=== Batch Benchmark ===``, with ``count: N``), so the elapsed time is counted from the header we read,
seen at most BENCH_CUT_CHECK_S late: cuzk-bench's own time is surely longer by then, and a bench that could
still pass is never stopped. Not from its first proof line: with ``-j`` above 1 the real tool prints none
until every proof was submitted (count − j of them done), and a cut counted from there came too late to
matter. A bench that prints no header is counted from its first ``[k/N]`` line. N is the header's count
(else that line's N); without a manager (no min_rate, nobody to judge) nothing is cut.
The stop goes through the core's ProductionControl (``fail_phase``): the phase fails for good, and the
fleet protocol's give-up (fleet.py) destroys the instance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import PARAM_DONE
from ..lifecycle import verdict as v
from ..lifecycle.states import PhaseState
from ..manager.row import utc_text
from ..text.show import span
from .bench import BenchResult
from .fleet import BENCH_DONE, fleet_settings, row_min_rate

if TYPE_CHECKING:
    from ..engine.loop import Timer
    from ..manager.row import Row
    from ..wiring import ManagerLink, PhaseView, ProductionControl, Wiring


# ---------------------------------------------------------------- the manager's benchmark clock

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
    if PARAM_DONE not in reports or BENCH_DONE not in reports:
        return set()
    start, end = reports.index(PARAM_DONE) + 1, reports.index(BENCH_DONE) + 1
    return set(names[start:end])


def past_deadline(at: float, source: str, deadline_s: float, now: float) -> str | None:
    """Why the benchmark clock started at ``at`` (what that is: ``source``) is past ``deadline_s``; None: it is not."""
    over = now - (at + deadline_s)
    if over < 0:
        return None
    return (f"the manager's benchmark timeout passed {span(over)} ago (bench_deadline_s={deadline_s:g} from "
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
        if self._link.delivered_answer(PARAM_DONE) is None:
            return False  # (undelivered: the row is still registered, whatever the fetch's end says)
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
        ended = False
        try:
            ended = self._look(watching)
        finally:  # a look that raised (a bug of ours, said once by the loop) is not the last: the deadline still fires
            if not ended:
                self._call_later(BENCH_CLOCK_CHECK_S, lambda: self.check(watching))

    def _look(self, watching: tuple[str, int]) -> bool:
        """Fail the phase if it runs past the deadline; whether it did (its looks end)."""
        clock = self._link.clock(BENCH_CLOCK) if self._runs() else None
        why = past_deadline(*clock, self._deadline_s, self._now()) if clock is not None else None
        if why is None:
            return False
        self._watching = None
        self._production.fail_phase(watching[0], v.TOO_SLOW, why)  # it says the why, once
        return True


def attach_clock(wiring: Wiring) -> None:
    """Part of the prover's Plugin.attach: the clock, where a manager's benchmark timeout applies."""
    deadline_s = fleet_settings(wiring.plan).bench_deadline_s
    phases = stretch([(p.name, p.report) for p in wiring.plan.phases])
    if wiring.manager is None or deadline_s <= 0 or not phases:
        return
    wiring.manager.deadline(BENCH_CLOCK, deadline_s)
    clock = BenchClock(deadline_s, phases, wiring.manager, wiring.production, wiring.call_later)
    wiring.manager.on_row(clock.heard_row)
    wiring.events.on_transition(clock.transition)


# ---------------------------------------------------------------- the min_rate cut

# How often a running bench is looked at.
BENCH_CUT_CHECK_S = 2.0


def hopeless(expected: int, done: int, elapsed_s: float, min_rate: float) -> str | None:
    """Why a bench of ``expected`` proofs, ``done`` completed after ``elapsed_s`` (at least its own total time
    so far), can no longer reach ``min_rate`` proofs/h; None while it still can (or nothing is known)."""
    if expected <= 0 or min_rate <= 0 or elapsed_s <= 0:
        return None
    limit_s = expected / min_rate * 3600
    if elapsed_s <= limit_s:
        return None
    best = expected / elapsed_s * 3600
    return (f"the bench cannot pass any more: {elapsed_s / 60:.1f} min since it began, {done} of "
            f"{expected} proofs done; the best rate still possible is {best:.1f}/h < min_rate {min_rate:g}/h "
            f"({expected} proofs needed {limit_s / 60:.1f} min at most)")


class BenchCut:
    """Watches the ``report = "bench-done"`` phase while its command runs."""

    def __init__(self, min_rate: float, production: ProductionControl,
                 call_later: Callable[[float, Callable[[], None]], Timer],
                 now: Callable[[], float] = time.monotonic) -> None:
        # No log of its own: fail_phase says the why, once.
        self._min_rate, self._production, self._call_later, self._now = min_rate, production, call_later, now
        self._min_rate_from = "this instance's ($MIN_RATE or [manager] min_rate)"
        self._watching: tuple[str, int] | None = None  # (phase, attempt) running
        self._parsed: BenchResult | None = None
        self._first_at: float | None = None

    def heard_row(self, row: Row) -> None:
        """The manager judges by its row's min_rate (the label's first registration's): so does the cut."""
        min_rate = row_min_rate(row)
        if min_rate is not None:
            self._min_rate, self._min_rate_from = min_rate, "the manager's row's"

    def transition(self, view: PhaseView) -> None:
        if view.report != BENCH_DONE:
            return
        if view.state is not PhaseState.RUNNING or not isinstance(view.parsed, BenchResult):
            self._watching = None
            return
        self._watching, self._parsed, self._first_at = (view.name, view.attempt), view.parsed, None
        watching = self._watching
        self._call_later(BENCH_CUT_CHECK_S, lambda: self.check(watching))

    def check(self, watching: tuple[str, int]) -> None:
        parsed = self._parsed
        if watching != self._watching or parsed is None or parsed.summary_seen:
            return  # another attempt, or it ended: its summary judges it
        ended = False
        try:
            ended = self._look(watching, parsed)
        finally:  # a look that raised (a bug of ours, said once by the loop) is not the last: the cut still comes
            if not ended:
                self._call_later(BENCH_CUT_CHECK_S, lambda: self.check(watching))

    def _look(self, watching: tuple[str, int], parsed: BenchResult) -> bool:
        """Stop the bench if it can no longer reach min_rate; whether it did (its looks end)."""
        if self._first_at is None and (parsed.started or sum(parsed.proofs.values()) > 0):
            self._first_at = self._now()
        if self._first_at is None or not parsed.expected:
            return False
        why = hopeless(parsed.expected, parsed.proofs.get("COMPLETED", 0), self._now() - self._first_at,
                       self._min_rate)
        if why is None:
            return False
        why += f"; min_rate {self._min_rate:g}/h is {self._min_rate_from}"
        self._watching = None
        self._production.fail_phase(watching[0], v.TOO_SLOW, why)  # it says the why, once
        return True


def attach_cut(wiring: Wiring) -> None:
    """Part of the prover's Plugin.attach: the cut, where a manager judges the bench by its min_rate."""
    if wiring.manager is None:
        return
    cut = BenchCut(fleet_settings(wiring.plan).min_rate, wiring.production, wiring.call_later)
    wiring.manager.on_row(cut.heard_row)
    wiring.events.on_transition(cut.transition)
