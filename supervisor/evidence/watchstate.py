"""Every watch's own health: reading, blind since when, or stopped; said once, and again when it reads again.

A watch (the GPU thread's sampling and its Xid events, the proofs in production, the memory of the running
phases) is part of the supervisor, held to its rule: it never dies, hangs, floods or lies without a word.
So each one reports here what became of each attempt to read (``read``: a good reading; ``miss``: no
reading, with why: an error, a timeout, an answer that is no answer), and the tick (``Watches.check``)
says, once, the moment a watch has had no reading for longer than its own window ("proofs watch: no
reading for 121 s (its window is 120 s): cuzk /status: timed out"), and once more when it reads again. A
watch that reads only now and then (the manager's row, every few minutes) has no window to wait out: one
failed reading makes it blind (``blinded``), said at once, and again only when the cause of its misses
changes. A watch that has nothing to read for now (production not up, nobody wanting GPU samples) is
``idle``, never blind. A watch whose thread ended unexpectedly says so (``failed``) and is restarted by its
owner: ``run_restarting`` is that containment, one for every watch's thread (the GPU thread, the I/O
thread, the progress walker). ``status`` shows each one.

``Repeats`` keeps a line that comes thousands of times a second (an Xid storm) to one line and a count
a period. Both are made for any thread: the watches' threads report, the loop's tick speaks.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..text.show import one_line, summary

READING = "reading"
BLIND = "blind"
IDLE = "idle"
STOPPED = "stopped"
STARTING = "starting"
# The why of a miss is kept this short (an answer's own text can be anything, of any size).
WHY_CHARS = 300
# A repeated line is said once, then counted, and the count said at most once a period.
REPEATS_PERIOD_S = 60.0
# At most this many distinct repeated lines are counted at once (each one said at its first coming).
REPEATS_KEYS_MAX = 256
# Lines a watch keeps for the tick to say at most (a state nobody looks at must not grow without end).
UNSAID_MAX = 10
# A watch's thread that failed (a bug of ours) starts again after this long, doubling up to the most: a bug
# that fails every round costs a few lines an hour, never a spin.
THREAD_RESTART_S = 1.0
THREAD_RESTART_MAX_S = 60.0

Clock = Callable[[], float]


def short(why: object) -> str:
    """A why, in one line and at most WHY_CHARS."""
    return one_line(why, WHY_CHARS, "…")


def said_error(exc: BaseException) -> str:
    """An exception as a watch says it: its class and text, short."""
    return short(summary(exc))


@dataclass(frozen=True)
class Words:
    """How a watch says what it lacks and that it has it again: ``<name>: <none> for 40 s``, ``<name>: still
    <none>, for another cause``, ``<name>: <again>`` (``{seconds}``: how long it had none). The default is a
    watch that reads; the log shipper delivers pushes (manager/logship.py)."""

    none: str = "no reading"
    again: str = "reading again after {seconds:.0f} s without one"


READS = Words()


class WatchState:
    """One watch: what it read last and when, and what it says of itself (``check``, on the loop).

    ``on_demand``: the watch reads only when it has something to read (the log shipper pushes only while lines
    wait): its window counts from its first miss after a reading, not from that reading, which may be an hour
    old when the next one fails (a quiet hour is no blindness)."""

    def __init__(self, name: str, window_s: float, *, clock: Clock = time.monotonic, words: Words = READS,
                 on_demand: bool = False) -> None:
        self.name, self.window_s, self._clock = name, window_s, clock
        self.words, self._on_demand = words, on_demand
        self._lock = threading.Lock()
        self._state = STARTING
        self._since = clock()  # monotonic: when the present state (or the wait for a reading) began
        self._last_read: float | None = None
        self._why = ""
        self.readings = 0
        self.misses = 0
        self.failures = 0  # the watch's thread (or tick) ended unexpectedly, and was restarted
        self._said_blind = False
        self._cause: str | None = None  # what the watch's blindness was last said for (``blinded``, ``miss``'s cause)
        self._miss_cause: str | None = None  # the cause of its latest miss, given (``miss``): adopted once blind
        self._missing = False  # a miss since the latest reading (``on_demand``: the window runs from the first)
        self._unsaid: list[str] = []  # lines the owner's thread asked to say (a failure), for the loop's tick

    def read(self, now: float | None = None) -> None:
        """A good reading."""
        now = self._clock() if now is None else now
        with self._lock:
            self.readings += 1
            if self._said_blind:
                self._say(f"{self.name}: {self.words.again.format(seconds=now - self._since)}")
            self._said_blind, self._cause, self._miss_cause, self._missing = False, None, None, False
            self._state, self._since, self._last_read, self._why = READING, now, now, ""

    def miss(self, why: str, now: float | None = None, cause: str | None = None) -> None:
        """One reading that failed (an error, a timeout, an answer out of bounds): no reading, the watch goes on.
        With ``cause`` (what tells one cause from another), a watch said blind says so again, once, when the
        cause of its misses changes; without, only its return is said."""
        now = self._clock() if now is None else now
        with self._lock:
            self.misses += 1
            self._why = short(why)
            if self._state in (IDLE, STOPPED):  # waiting for a reading from now on
                self._state, self._since = STARTING, now
            elif self._on_demand and not self._missing:  # the wait for a reading begins with this miss
                self._since = now
            self._missing = True
            self._miss_cause = cause
            if cause is not None and self._state == BLIND and self._said_blind and cause != self._cause:
                self._cause = cause
                self._say(f"{self.name}: still {self.words.none}, for another cause ({self._why})")

    def blinded(self, why: str, then: str, cause: str | None = None, now: float | None = None) -> None:
        """One reading that failed, for a watch that reads only now and then: blind at once, said on the next
        check with ``then`` (what it cannot see meanwhile), and again only when ``cause`` (``why`` unless given:
        what tells one cause from another) changes; ``read`` says when it reads again."""
        now = self._clock() if now is None else now
        with self._lock:
            self.misses += 1
            self._why = short(why)
            cause = cause if cause is not None else self._why
            if self._state == BLIND and cause == self._cause:
                return
            if self._state != BLIND:
                if self._state in (IDLE, STOPPED):
                    self._since = now
                self._say(f"{self.name}: {self.words.none} ({self._why}); {then}")
            else:
                self._say(f"{self.name}: still {self.words.none}, for another cause ({self._why})")
            self._state, self._said_blind, self._cause = BLIND, True, cause

    def idle(self, why: str = "") -> None:
        """Nothing to read for now (nobody wants it): not blind, whatever the time since the last reading."""
        with self._lock:
            if self._state != IDLE:
                self._state, self._since, self._why, self._said_blind = IDLE, self._clock(), short(why), False
                self._missing = False

    def wake(self, now: float | None = None) -> None:
        """Wanted again after ``idle``: the window counts from now."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._state in (IDLE, STOPPED):
                self._state, self._since = STARTING, now

    def failed(self, why: str, then: str) -> None:
        """The watch's thread (or tick) ended unexpectedly: said once on the next tick, with ``then`` (what now)."""
        with self._lock:
            self.failures += 1
            self._why = short(why)
            self._say(f"{self.name}: stopped unexpectedly ({self._why}); {then}")

    def say(self, line: str) -> None:
        """A line of the watch's own for the next tick (from any thread): what it found of its evidence."""
        with self._lock:
            self._say(line)

    def _say(self, line: str) -> None:
        """(under the lock) A line for the next tick; past UNSAID_MAX, only the counts tell."""
        if len(self._unsaid) < UNSAID_MAX:
            self._unsaid.append(line)

    def stop(self, why: str) -> None:
        """The watch ended for good (its owner's decision, said by it): shown as stopped."""
        with self._lock:
            self._state, self._since, self._why, self._said_blind = STOPPED, self._clock(), short(why), False

    def check(self, now: float | None = None, thawed_at: float | None = None) -> list[str]:
        """The lines to say now (on the loop): blind once past the window, reading again, a failure. The window
        counts from ``thawed_at`` at the earliest (the supervisor itself was frozen until then: tick.py)."""
        now = self._clock() if now is None else now
        with self._lock:
            lines, self._unsaid = self._unsaid, []
            since = self._since if thawed_at is None else max(self._since, thawed_at)
            waiting = not self._on_demand or self._missing  # on demand, no miss yet: nothing waited for, no blindness
            if self._state in (READING, STARTING) and waiting and now - since > self.window_s:
                self._state, self._said_blind, self._cause = BLIND, True, self._miss_cause
                lines.append(f"{self.name}: {self.words.none} for {now - since:.0f} s "
                             f"(its window is {self.window_s:g} s): {self._why or 'no answer yet'}")
            return lines

    @property
    def current(self) -> str:
        """reading, blind, idle, stopped or starting (blind from the first check past the window)."""
        with self._lock:
            return self._state

    @property
    def why(self) -> str:
        """Why its last reading failed ('' after a good one), blind yet or not."""
        with self._lock:
            return self._why

    def blind_why(self) -> str | None:
        """Why the watch is blind (its last miss, or that no answer came), or None while it is not."""
        with self._lock:
            return (self._why or "no answer yet") if self._state == BLIND else None

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """For status: the state, since when (epoch seconds), the last reading's age, why, the counts."""
        now = self._clock() if now is None else now
        wall = time.time()
        with self._lock:
            return {"state": self._state, "since": round(wall - (now - self._since), 3),
                    "last_reading_s_ago": None if self._last_read is None else round(now - self._last_read, 1),
                    "why": self._why or None,
                    # (a window of math.inf: a watch never blind; JSON has no infinity, status shows none)
                    "window_s": self.window_s if math.isfinite(self.window_s) else None,
                    "readings": self.readings, "misses": self.misses, "failures": self.failures}


def run_restarting(run: Callable[[], None], state: WatchState, what: str, cond: threading.Condition,
                   closed: Callable[[], bool], reset: Callable[[Exception], None], *,
                   restart_s: float = THREAD_RESTART_S, restart_max_s: float = THREAD_RESTART_MAX_S) -> None:
    """A watch's thread body (``run``), contained: it runs until it returns. Should it raise (a bug of ours)
    while its owner is not closed (``closed()``, read under the owner's ``cond``), ``reset`` (under ``cond``)
    drops what the failed run left (a measure of before the failure must never read as the latest), the failure
    is said and counted on ``state`` (``failed``: "<what> failed: <the exception>"), and ``run`` starts again
    after ``restart_s``, doubling up to ``restart_max_s``; a close during that wait ends it. Without this the
    thread would die for good and its watch would read as blind for the rest of the run, without a word of why."""
    while True:
        try:
            run()
            return
        except Exception as exc:  # a bug of ours: said, and the thread starts again (the supervision goes on)
            with cond:
                if closed():
                    return
                reset(exc)
            state.failed(f"{what} failed: {said_error(exc)}", f"started again in {restart_s:g} s")
            if not _wait_unless_closed(cond, closed, restart_s):
                return
            restart_s = min(restart_max_s, restart_s * 2)


def _wait_unless_closed(cond: threading.Condition, closed: Callable[[], bool], seconds: float) -> bool:
    """Wait ``seconds`` on ``cond`` (only a close ends it early: a new watch must not hurry a failing thread
    back); False once closed."""
    deadline = time.monotonic() + seconds
    with cond:
        while not closed():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            cond.wait(left)
        return False


class Watches:
    """Every watch's state, by name: one tick watcher for all of them, one status key (``watches``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, WatchState] = {}
        self._shown: dict[str, WatchState] = {}  # said by their own reader (show): in status, not in the tick
        self.thawed_at: Callable[[], float | None] = lambda: None  # the supervisor's last thaw (run.py: tick.py's)

    def add(self, *states: WatchState) -> None:
        with self._lock:
            for state in states:
                self._states[state.name] = state

    def show(self, *states: WatchState) -> None:
        """Watches that say their own lines where they read (the manager's row watch, on the sender's thread):
        in status with the others, never said by the tick too (two threads would share one watch's lines)."""
        with self._lock:
            for state in states:
                self._shown[state.name] = state

    def new(self, name: str, window_s: float) -> WatchState:
        """A watch's state, registered under ``name`` (the plugin's watches come through here)."""
        state = WatchState(name, window_s)
        self.add(state)
        return state

    def check(self, now: float | None = None) -> list[str]:
        with self._lock:
            states = list(self._states.values())
        thawed_at = self.thawed_at()
        return [line for state in states for line in state.check(now, thawed_at)]

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        with self._lock:
            states = [*self._states.values(), *self._shown.values()]
        return {state.name: state.to_dict(now) for state in states}


class Repeats:
    """A line that repeats (same ``key``): said at its first coming, then counted; every ``period_s`` the count
    of the ones not said ("Xid 13 on GPU 0: 41,233 more in the last 60 s"). A line that must not pass as one
    (an NVML call that hung again) is said at each coming, up to ``said`` lines a period, each with how many times
    it came and since when ("... hung again (2nd time in 40 s)"). Any thread may ``note``."""

    def __init__(self, period_s: float = REPEATS_PERIOD_S, *, clock: Clock = time.monotonic) -> None:
        self._period_s, self._clock = period_s, clock
        self._lock = threading.Lock()
        self._counted: dict[str, _Repeated] = {}
        self.dropped = 0  # repeats of keys past REPEATS_KEYS_MAX: counted here only

    def note(self, key: str, line: str, what: str | None = None, count: int = 1, *, said: int = 1,
             again: Callable[[str], str] | None = None) -> list[str]:
        """``line`` ``count`` times: the lines to say now (the line itself at its first coming; with ``again``, a
        repeat's own line, given "2nd time in 40 s", while the period has said fewer than ``said`` lines)."""
        now = self._clock()
        with self._lock:
            entry = self._counted.get(key)
            if entry is None:
                if len(self._counted) >= REPEATS_KEYS_MAX:
                    self.dropped += count
                    return []
                self._counted[key] = _Repeated(what or key, count - 1, now, now, count, repeated=count > 1)
                return [line]
            entry.comings += count
            entry.repeated = True
            if again is not None and count == 1 and entry.said < said:
                entry.said += 1
                lines = [again(f"{ordinal(entry.comings)} time in {now - entry.first:.0f} s")]
            else:
                entry.unsaid += count
                lines = []
        return [*lines, *self.due(now)]

    def due(self, now: float | None = None) -> list[str]:
        """The counts whose period is over; a key with no repeat for a whole period is forgotten (said again next
        time)."""
        now = self._clock() if now is None else now
        lines = []
        with self._lock:
            for key, entry in list(self._counted.items()):
                if now - entry.start < self._period_s:
                    continue
                if entry.unsaid:
                    lines.append(f"{entry.what}: {entry.unsaid:,} more in the last {now - entry.start:.0f} s")
                if entry.repeated:
                    entry.unsaid, entry.start, entry.said, entry.repeated = 0, now, 0, False
                else:
                    del self._counted[key]
        return lines


@dataclass
class _Repeated:
    """One repeated line: what its count says, the repeats not said in this period, when the period began, when
    the line first came and how often since; the lines said in this period, and whether it came again in it."""

    what: str
    unsaid: int
    start: float
    first: float
    comings: int
    said: int = 1
    repeated: bool = False


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st..."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
