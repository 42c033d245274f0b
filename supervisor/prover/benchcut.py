"""The bench cut: a benchmark that can no longer pass is stopped (reason ``too_slow``) and the instance
given up, rather than run its proofs to the end of its deadline before bench-done says no.

The manager passes a bench whose rate, proofs per hour, is at least ``min_rate``; cuzk-bench computes the
rate from ITS total time: completed proofs / total time. With N proofs to run, once that time exceeds
N / min_rate hours no result can pass, whatever the remaining proofs do: even all N completed give less.
Its clock starts after ours (its own start-up, reading the C1 file), so the elapsed time is counted from
the first ``[k/N]`` proof line we read, seen at most BENCH_CUT_CHECK_S late: cuzk-bench's own time is
surely longer by then. That costs the first proof's time (a minute or two) and never stops a bench that
could still pass. N is that line's N; without a manager (no min_rate, nobody to judge) nothing is cut.
The stop goes through the core's ProductionControl (``fail_phase``): the phase fails for good, and the
fleet protocol's give-up (fleet.py) destroys the instance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..lifecycle import verdict as v
from ..lifecycle.states import PhaseState
from .bench import BenchResult
from .fleet import BENCH_DONE, fleet_settings, row_min_rate

if TYPE_CHECKING:
    from ..engine.loop import Timer
    from ..manager.row import Row
    from ..wiring import PhaseView, ProductionControl, Wiring

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
    return (f"the bench cannot pass any more: {elapsed_s / 60:.1f} min since its first proof line, {done} of "
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
        if self._first_at is None and sum(parsed.proofs.values()):
            self._first_at = self._now()
        if self._first_at is not None and parsed.expected:
            why = hopeless(parsed.expected, parsed.proofs.get("COMPLETED", 0), self._now() - self._first_at,
                           self._min_rate)
            if why is not None:
                why += f"; min_rate {self._min_rate:g}/h is {self._min_rate_from}"
                self._watching = None
                self._production.fail_phase(watching[0], v.TOO_SLOW, why)  # it says the why, once
                return
        self._call_later(BENCH_CUT_CHECK_S, lambda: self.check(watching))


def attach(wiring: Wiring) -> None:
    """Part of the prover's Plugin.attach: the cut, where a manager judges the bench by its min_rate."""
    if wiring.manager is None:
        return
    cut = BenchCut(fleet_settings(wiring.plan).min_rate, wiring.production, wiring.call_later)
    wiring.manager.on_row(cut.heard_row)
    wiring.events.on_transition(cut.transition)
