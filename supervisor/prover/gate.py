"""The bench gate: production waits for the manager's verdict on the benchmark.

The one place the lifecycle waits on the manager. When the bench phase is done and
its ``bench-done`` is queued, the lifecycle is held there until the manager answers:
``passed: true`` lets production start; ``passed: false`` means the manager is
destroying the instance, so production never starts (or, let through already, is
stopped) and the supervisor shuts down with EXIT_BENCH_REJECTED. A manager that does not answer within ``bench_gate_s``
(or refuses the call for good) does not keep production waiting: it starts anyway,
and a later ``passed: false`` still stops it. The gate drives production through the
core's ProductionControl (wiring.py), by phase name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..text import Log
from .reasons import EXIT_BENCH_REJECTED

if TYPE_CHECKING:
    from ..engine.loop import Timer
    from ..wiring import ProductionControl

# Why the lifecycle does not go past the bench phase (the status view shows it).
GATE_HOLD = "waiting for the manager's answer to bench-done"

CallLater = Callable[[float, Callable[[], None]], "Timer"]


class BenchGate:
    """Holds the lifecycle at the bench phase until the manager answered, or the gate's time is up."""

    def __init__(self, bench_gate_s: float, min_rate: float, production: ProductionControl, call_later: CallLater,
                 log: Log) -> None:
        self._gate_s = bench_gate_s
        self._own_min_rate = min_rate  # this instance's ($MIN_RATE or [manager] min_rate), as it registers
        self._min_rate = min_rate  # the one the manager judges by: its row's, once a row said it
        self._production = production
        self._call_later = call_later
        self._log = log
        self._held: str | None = None  # the phase held; at most one: config lets one phase report bench-done
        self._timer: Timer | None = None

    @property
    def held(self) -> str | None:
        return self._held

    def hold(self, phase_name: str) -> None:
        """The bench phase is done and its bench-done queued: production waits (``bench_gate_s`` 0: never)."""
        if self._gate_s <= 0:
            return
        self._held = phase_name
        self._production.hold(phase_name, GATE_HOLD, for_s=self._gate_s)
        self._timer = self._call_later(self._gate_s, self._expired)

    def answered(self, passed: bool, rate: float) -> None:
        """The manager's answer to bench-done (it may come after the gate expired)."""
        min_rate = self._min_rate
        if passed:
            self._log(f"manager: benchmark passed (rate {rate:g}/h >= min_rate {min_rate:g})")
            self._release()
            return
        # Held, production never started; else the gate let it through (its time ran out, or it never held:
        # bench_gate_s = 0), and it is stopped now.
        then = "not starting production" if self._held is not None else \
            "stopping the run (production was let through before the answer)"
        why = f"the manager rejected the benchmark (rate {rate:g}/h < min_rate {min_rate:g}) and is destroying " \
              f"this instance: {then}"
        self._log(why)
        self._production.stop_from_outside(why, EXIT_BENCH_REJECTED)

    def heard_min_rate(self, min_rate: float | None) -> None:
        """The manager keeps the min_rate of the label's first registration: its row's (as the manager reads it,
        fleet.row_min_rate; None: the row does not say) is the one that judges."""
        if min_rate is None or min_rate == self._min_rate:
            return
        if min_rate == self._own_min_rate:  # (a row registered anew, its old one forgotten: this start's own)
            self._log(f"manager: its row's min_rate is this instance's {min_rate:g}/h now (a new row; the one "
                      f"before held {self._min_rate:g}/h): the manager judges the bench by it")
        else:  # (compared with this instance's own: the min_rate judged by so far may be an older row's)
            self._log(f"manager: its row's min_rate {min_rate:g}/h differs from this instance's "
                      f"{self._own_min_rate:g}/h ($MIN_RATE or [manager] min_rate): the manager judges the bench by "
                      "its own (kept from the label's first registration), and so does the bench cut")
        self._min_rate = min_rate

    def refused(self) -> None:
        """bench-done was refused for good: no answer will ever come, so waiting out the gate is pointless."""
        if self._held is not None:
            self._log("manager: starting production without the manager's verdict on the bench")
            self._release()

    def _expired(self) -> None:
        if self._held is not None:
            self._log(f"manager: no answer to bench-done after {self._gate_s:g}s; starting "
                      "production anyway (a later passed: false still stops it)")
            self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        held, self._held = self._held, None
        if held is not None:
            self._production.release(held)
