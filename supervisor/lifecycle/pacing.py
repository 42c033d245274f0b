"""A phase's timers: its deadline, the backoff before its next attempt, the restarts counted
against its restart_burst, and each attempt's stall watch, all on the loop's clock.

The rules (pure functions in states.py, beside the decision that applies them): the n-th failure in a row waits
``backoff_delay(n)`` with ``backoff_jitter`` drawn from the runtime's random source; an attempt that
ran ``backoff_reset_s`` or longer starts the count again; ``restart_burst`` restarts of a service
within ``restart_window_s`` fail it; ``timeout_s`` counts from the first attempt across every later
one; ``stall_s`` of silence of every sign of progress stalls an attempt (stall.py); a download that cannot
make ``progress_deadline_s`` ends its attempt too_slow (progresswatch.py). Tests drive them
with a fake clock (tests/test_phase_timing.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..config import PhaseSpec
from ..engine.loop import Callback, ErrorHandler, EventLoop, Timer
from ..evidence.progresswatch import ProgressWatch
from ..evidence.stall import StallMonitor
from ..text import Log
from .attempt import Attempt
from .runtime import MachineEvidence
from .states import Next, after_attempt, backoff_delay, within_window
from .verdict import Verdict


class Pacing:
    def __init__(self, spec: PhaseSpec, loop: EventLoop, rng: random.Random) -> None:
        self._spec, self._loop, self._rng = spec, loop, rng
        self.consecutive_failures = 0
        self.restart_times: list[float] = []  # when the service was restarted (monotonic), for restart_burst
        self._deadline: Timer | None = None
        self._backoff: Timer | None = None
        self.stall: StallMonitor | None = None  # the latest attempt's stall watch (read by the status view)

    def now(self) -> float:
        return self._loop.clock.monotonic()

    def start_deadline(self, passed: Callback, on_error: ErrorHandler) -> None:
        """``timeout_s`` from now (once, before the first attempt): ``passed`` when it is up."""
        if self._spec.timeout_s is not None:
            self._deadline = self._loop.call_later(self._spec.timeout_s, passed, on_error=on_error)

    @property
    def deadline_at(self) -> float | None:
        """When ``timeout_s`` is up (monotonic, the loop's clock), while the deadline is set: for the status view."""
        return _due(self._deadline)

    @property
    def backoff_until(self) -> float | None:
        """When the next attempt starts (monotonic), while a backoff runs: for the status view."""
        return _due(self._backoff)

    def deadline_expired(self) -> bool:
        return self._deadline is not None and self._deadline.when <= self.now()

    def after(self, outcome: Verdict, attempt: Attempt) -> tuple[Next, str, float]:
        """What follows ``attempt``, which ``outcome`` ended, and why: done, failed for good, or another
        attempt after the backoff returned (0 for the others). A service's restart is counted now."""
        now = self.now()
        step, why = after_attempt(self._spec, outcome, attempt.number, deadline_expired=self.deadline_expired(),
                                  restart_times=self.restart_times, now=now)
        if step is not Next.AGAIN:
            return step, why, 0.0
        if self._spec.kind == "service":
            self.restarted(now)
        return step, why, self.next_delay(attempt.ran_for(now))

    def watch_for_stall(self, evidence: MachineEvidence, attempt: Attempt, *, drain: Callback,
                        current: Callable[[], bool], on_stall: Callable[[str], None], on_error: ErrorHandler) -> None:
        """For a phase with stall_s: ``on_stall`` (what was silent) once ``attempt`` stalls, while ``current()``."""
        spec = self._spec
        if spec.stall_s is not None:
            self.stall = StallMonitor(self._loop, spec.stall_s, evidence.gpus, evidence.progress, spec.progress_path,
                                      freeze=evidence.freeze, io=evidence.io, roots=attempt.roots,
                                      last_outputs=attempt.last_outputs, drain=drain,
                                      current=current, on_stall=on_stall, on_error=on_error)

    def watch_progress(self, evidence: MachineEvidence, attempt: Attempt, log: Log, *,
                       current: Callable[[], bool], on_too_slow: Callable[[str], None],
                       on_error: ErrorHandler) -> None:
        """For a phase with progress_total: ``attempt``'s figures (progresswatch.py); ``on_too_slow`` (why) once
        it cannot make progress_deadline_s."""
        if self._spec.progress_total is not None:
            attempt.progress = ProgressWatch(self._spec, self._loop, log, evidence.progress, evidence.first_seen,
                                             io=evidence.io, roots=attempt.roots,
                                             reading=attempt.progress_reading, current=current,
                                             on_too_slow=on_too_slow, on_error=on_error)

    def restarted(self, now: float) -> None:
        """A service is restarted at ``now``: counted against its restart_burst (those out of the window fall)."""
        self.restart_times = [*within_window(self.restart_times, now, self._spec.restart_window_s), now]

    def next_delay(self, ran_for: float) -> float:
        """The backoff before the next attempt, after one that ran ``ran_for`` seconds and failed."""
        spec = self._spec
        # An attempt that ran well for a while earns a fresh start of the backoff.
        if ran_for >= spec.backoff_reset_s > 0:
            self.consecutive_failures = 0
        self.consecutive_failures += 1
        return backoff_delay(self.consecutive_failures, spec.backoff_s, spec.backoff_factor, spec.backoff_max_s,
                             spec.backoff_jitter, self._rng.random())

    def back_off(self, delay: float, over: Callback, on_error: ErrorHandler) -> None:
        self._backoff = self._loop.call_later(delay, over, on_error=on_error)

    def cancel(self) -> None:
        for timer in (self._deadline, self._backoff):
            if timer is not None:
                timer.cancel()


def _due(timer: Timer | None) -> float | None:
    return timer.when if timer is not None and not timer.cancelled else None
