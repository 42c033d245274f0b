"""The bench gate: production waits for the manager's verdict on the benchmark.

The one place the lifecycle waits on the manager. When the bench phase is done and
its ``bench-done`` is queued, the lifecycle is held there until the manager answers:
``passed: true`` lets production start; ``passed: false`` means the manager is
destroying the instance, so production never starts and the supervisor shuts down
with EXIT_BENCH_REJECTED. A manager that does not answer within ``bench_gate_s``
(or refuses the call for good) does not keep production waiting: it starts anyway,
and a later ``passed: false`` still stops it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import ManagerSpec
from ..exits import EXIT_BENCH_REJECTED
from ..loop import EventLoop, Timer

if TYPE_CHECKING:
    from ..lifecycle import Lifecycle
    from ..phase import Phase

# Why the lifecycle does not go past the bench phase (the status view shows it).
GATE_HOLD = "waiting for the manager's answer to bench-done"

Log = Callable[[str], None]


class BenchGate:
    """Holds the lifecycle at the bench phase until the manager answered, or the gate's time is up."""

    def __init__(self, spec: ManagerSpec, lifecycle: Lifecycle, loop: EventLoop, log: Log) -> None:
        self._spec = spec
        self._lifecycle = lifecycle
        self._loop = loop
        self._log = log
        self._held: Phase | None = None  # at most one: config lets one phase report bench-done
        self._timer: Timer | None = None

    def hold(self, phase: Phase) -> None:
        """The bench phase is done and its bench-done queued: production waits (``bench_gate_s`` 0: never)."""
        if self._spec.bench_gate_s <= 0:
            return
        self._held = phase
        self._lifecycle.hold(phase, GATE_HOLD)
        self._timer = self._loop.call_later(self._spec.bench_gate_s, self._expired)

    def answered(self, passed: bool, rate: float) -> None:
        """The manager's answer to bench-done (it may come after the gate expired)."""
        if passed:
            self._log(f"manager: benchmark passed (rate {rate:g}/h >= min_rate {self._spec.min_rate:g})")
            self._release()
            return
        why = (f"the manager rejected the benchmark (rate {rate:g}/h < min_rate {self._spec.min_rate:g}) and is "
               "destroying this instance: not starting production")
        self._log(why)
        self._lifecycle.shutdown(why, EXIT_BENCH_REJECTED)

    def refused(self) -> None:
        """bench-done was refused for good: no answer will ever come, so waiting out the gate is pointless."""
        if self._held is not None:
            self._log("manager: starting production without the manager's verdict on the bench")
            self._release()

    def _expired(self) -> None:
        if self._held is not None:
            self._log(f"manager: no answer to bench-done after {self._spec.bench_gate_s:g}s; starting production "
                      "anyway (a later passed: false still stops it)")
            self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        held, self._held = self._held, None
        if held is not None:
            self._lifecycle.release(held)
