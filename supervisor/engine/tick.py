"""The tick: once every TICK_S the loop looks at its own clock (a freeze of the whole supervisor noticed) and
lets the machine-wide watchers speak.

A cgroup freeze (``docker pause``; Vast pauses interruptible instances), a SIGSTOP (Ctrl-Z) or a
paused VM stops every thread of the supervisor while the monotonic clock goes on. Right after
the thaw every silence measured across the freeze is the supervisor's own blindness, not the
children's: a child frozen with it printed nothing, and one that was not has its output waiting
in the pipe. So ``FreezeWatch.notice`` compares the clock with when the supervisor last looked
(the tick, every TICK_S, and every stall check); a jump of more than FREEZE_MIN_S is a freeze. It
is said, with how long, and ``thawed_at`` moves: every stall window restarts there
(supervisor/evidence/stall.py), and a download's rate windows leave the frozen time out
(supervisor/evidence/progresswatch.py). Deadlines (``timeout_s``) keep counting: the manager's do. A jump that
the loop's own bounded wait explains (``EventLoop.holding``: a spawn whose exec hangs) is said as that:
the supervisor did not look either, so the windows restart all the same.

The same tick (``Tick``) lets the off-loop watchers say what they saw: a hung NVML call
(supervisor/evidence/gpuwatch.py), a walk that does not end (supervisor/evidence/progress.py). Both read the time from
a ``Clock`` (the loop's), so a test moves it by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..text import Log
from .clock import SYSTEM_CLOCK, Clock
from .loop import EventLoop, Hold, name_of

# The tick: how often the loop looks at its own clock (and lets the watchers speak).
TICK_S = 1.0
# A jump of the monotonic clock between two looks longer than this is a freeze (two missed ticks:
# a busy or starved loop is late by a fraction of that).
FREEZE_MIN_S = 3.0

Watcher = Callable[[float], list[str]]  # now (monotonic) → lines to say


class FreezeWatch:
    """Notices a jump of the monotonic clock between two looks; ``thawed_at`` is the last thaw (or None)."""

    def __init__(self, log: Log, now: float | None = None, min_s: float = FREEZE_MIN_S,
                 clock: Clock = SYSTEM_CLOCK, holds: Callable[[], Sequence[Hold]] = tuple) -> None:
        self._log, self._min_s, self._clock, self._holds = log, min_s, clock, holds
        self.last_seen = clock.monotonic() if now is None else now
        self.thawed_at: float | None = None
        self.frozen_s = 0.0  # how long the last freeze was
        # ... of it, what no hold of the loop's own explains: the supervisor itself stopped, its threads and maybe its
        # children with it (during a hold they went on: a download's link time too, tick.py's readers know).
        self.stopped_s = 0.0
        self.freezes = 0

    def notice(self, now: float | None = None) -> float | None:
        """Look at the clock: the seconds the supervisor was frozen if it just was (said once), else None."""
        now = self._clock.monotonic() if now is None else now
        gap = now - self.last_seen
        self.last_seen = max(self.last_seen, now)
        if gap <= self._min_s:
            return None
        self.thawed_at, self.frozen_s = now, gap
        held, why = self._held_within(now - gap, now)
        self.stopped_s = max(0.0, gap - held)
        if why and gap - held <= self._min_s:
            self._log(f"the supervisor's loop was held for {gap:.1f}s by {why}; "
                      "stall windows restart now, deadlines keep counting")
            return gap
        self.freezes += 1
        self._log(f"the supervisor was frozen (SIGSTOP, cgroup freezer, docker pause?) for {gap:.1f}s; "
                  "stall windows restart now, deadlines keep counting")
        return gap

    def _held_within(self, since: float, now: float) -> tuple[float, str]:
        """How long the loop's own holds took of the stretch ``since``..``now`` (less what of them the supervisor
        was stopped), and by what ("" if none)."""
        spans = [(max(hold.began, since), min(hold.ended, now), hold) for hold in self._holds()
                 if hold.ended is not None and hold.ended > since and hold.began < now]
        if not spans:
            return 0.0, ""
        held = sum(end - start - hold.paused_s for start, end, hold in spans)
        longest = max(spans, key=lambda span: span[1] - span[0])[2]
        return held, longest.why if len(spans) == 1 else f"{longest.why} and {len(spans) - 1} more"


class Tick:
    """Every TICK_S on the loop: the freeze watch looks at the clock, then each watcher says what it saw."""

    def __init__(self, loop: EventLoop, freeze: FreezeWatch, watchers: list[Watcher], log: Log,
                 interval: float = TICK_S) -> None:
        self._loop, self._freeze, self._watchers, self._log = loop, freeze, watchers, log
        self._interval = interval

    def start(self) -> None:
        self._freeze.last_seen = self._loop.clock.monotonic()  # the clock starts now, not when the watch was made
        self._loop.call_later(self._interval, self._tick)

    def _tick(self) -> None:
        self._loop.call_later(self._interval, self._tick)  # first: a watcher that raises is not the last tick
        now = self._loop.clock.monotonic()
        self._freeze.notice(now)
        for watcher in self._watchers:
            try:  # each watcher contained: one that raises silences neither the others nor the next tick
                lines = watcher(now)
            except Exception as exc:
                self._loop.faults.report(f"the tick's watcher {name_of(watcher)}", exc)
                continue
            for line in lines:
                self._log(line)


def start_the_tick(loop: EventLoop, log: Log, watchers: list[Watcher]) -> FreezeWatch:
    """The freeze watch, looked at by a tick from now on, with ``watchers`` speaking at each tick."""
    freeze = FreezeWatch(log, clock=loop.clock, holds=lambda: loop.holds)
    Tick(loop, freeze, watchers, log).start()
    return freeze
