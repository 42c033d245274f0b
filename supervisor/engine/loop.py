"""The one event loop: a selector over pipes and the signal wake-up pipe, plus timers.

Nothing here polls: the loop sleeps in ``select`` until a file descriptor is
readable or the next timer is due. Its readers: the signal inbox, the
children's output pipes, the status socket and the cgroups' OOM events. Its
timers: phase deadlines, backoffs and stall checks, stop graces, the bench
gate, the status file's coalescing, the health heartbeat and the freeze tick.
Threads hand work back with ``call_soon_threadsafe``, which wakes the selector
through a pipe: the readiness probes, the manager's sender, and the bounded
off-loop jobs (supervisor/engine/offloop.py: the fitness check, resume's file lists).
The other threads (the console writer, the log shippers, the health server,
the GPU thread, the progress probe) never call into the loop: the loop reads
what the last two published.

The loop outlives any one callback: an exception raised by a reader, a timer
or a thread call is contained where it was raised. It goes to the error
handler its owner registered with the callback (a phase fails itself with
reason ``internal_error``), or, where there is none, to ``faults``, which logs
it with its traceback once; then the loop goes on with the next callback. A
bug in handling one child's output must never take down the supervision of
every child (the shutdown sweep would SIGKILL them all).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import math
import os
import selectors
import sys
import threading
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ParamSpec

from ..text import Log
from ..text.show import summary
from .clock import SYSTEM_CLOCK, Clock

Callback = Callable[[], object]  # (what it returns is not looked at)
# What the owner of a callback does with an exception the callback raised.
ErrorHandler = Callable[[Exception], None]
P = ParamSpec("P")

# The longest one select() sleeps. epoll's timeout is an int of milliseconds: 2**31 ms
# (24.86 days) and more raise OverflowError. A later timer is simply looked at again.
MAX_SLEEP_S = 3600.0
# A reader nobody answers for that raises this many times in a row is no longer watched (as
# sd-event disables a source whose callback fails): a readable fd it never drains would
# otherwise spin the loop at full CPU.
READER_FAULTS_MAX = 100
# How many of the latest holds (``EventLoop.holding``) the loop keeps for the freeze watch: more than one turn
# of the loop ever makes (a phase's starts), so that a jump they explain is never said as a freeze.
HOLDS_KEPT = 1024


@dataclass
class Hold:
    """A stretch in which the loop's thread was held by a call it had to wait for (``EventLoop.holding``)."""

    began: float  # monotonic, the loop's clock
    why: str
    ended: float | None = None  # None: still holding
    # Of the stretch, the seconds the whole supervisor was stopped (SIGSTOP, docker pause) that the call noticed
    # (spawn's wait does): a freeze within the hold, which the hold does not explain.
    paused_s: float = 0.0

    def paused(self, seconds: float) -> None:
        self.paused_s += seconds


@dataclass(order=True)
class Timer:
    when: float
    seq: int
    callback: Callback = field(compare=False)
    cancelled: bool = field(default=False, compare=False)
    on_error: ErrorHandler | None = field(default=None, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class Faults:
    """Says what a contained exception was: with its traceback the first time a place raises it,
    then only a count now and then (a tap that raises on every line must not flood the log)."""

    def __init__(self, log: Log | None = None) -> None:
        self.log: Log = log or _to_stderr  # startup.py sets the supervisor's own log
        self._seen: Counter[tuple[str, str]] = Counter()

    def report(self, where: str, exc: BaseException, phase: str | None = None) -> None:
        """Say it; ``phase`` (the phase it happened for) is told but is not part of what counts as
        "the same fault": a listener that raises for every phase is one fault."""
        key = (where, type(exc).__name__)
        self._seen[key] += 1
        times = self._seen[key]
        if phase is not None:
            where = f"{where} (phase {phase})"
        if times == 1:
            lines = [f"internal error in {where}: {summary(exc)} (contained; the supervisor goes on)"]
            lines += [f"  | {line}" for chunk in traceback.format_exception(exc) for line in chunk.rstrip().split("\n")]
        elif _is_power_of_ten(times):
            lines = [f"internal error in {where} again: {summary(exc)} ({times} times so far)"]
        else:
            return
        self._say(lines)

    def _say(self, lines: list[str]) -> None:
        try:
            for line in lines:
                self.log(line)
        except Exception:  # the log itself is broken: stderr is what is left
            for line in lines:
                _to_stderr(line)

    def count(self, where: str) -> int:
        return sum(n for (place, _), n in self._seen.items() if place == where)


def contained(callback: Callable[P, object], on_error: ErrorHandler) -> Callable[P, None]:
    """``callback`` as a function whose exceptions go to ``on_error``, not to its caller (a tap,
    a watcher, a thread's answer); only a broken ``on_error`` itself can still raise.

    While ``on_error`` runs, the callback is not called again: a broken log tap whose handler
    logs would otherwise raise into its own handler, forever.
    """
    handling = False

    def call(*args: P.args, **kwargs: P.kwargs) -> None:
        nonlocal handling
        if handling:
            return
        try:
            callback(*args, **kwargs)
        except Exception as exc:
            handling = True
            try:
                on_error(exc)
            finally:
                handling = False

    call.contains = callback  # type: ignore[attr-defined]
    call.__qualname__ = name_of(callback)
    return call


def is_contained(callback: Callable[..., object]) -> bool:
    """Whether ``callback`` came from ``contained`` (and so can never raise)."""
    return hasattr(callback, "contains")


def name_of(callback: Callable[..., object]) -> str:
    """A callback's name for a line: a partial is named by its function, never by its arguments (a whole outbox
    call, payload and all, which would also make each report of one bug a new one)."""
    while isinstance(callback, functools.partial):
        callback = callback.func
    return getattr(callback, "__qualname__", None) or repr(callback)


class EventLoop:
    """``clock``: what its timers follow, and what everything holding the loop reads the time from (a test
    moves a fake one by hand: a timer is due when that clock says so)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._selector = selectors.DefaultSelector()
        self._timers: list[Timer] = []
        self._seq = itertools.count()
        self._calls: deque[tuple[Callback, ErrorHandler | None]] = deque()
        self._calls_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False
        self.faults = Faults()
        self._reader_faults: dict[int, int] = {}  # fd → how many times in a row its reader raised
        self.add_reader(self._wake_r, self._run_thread_calls)
        self._stopped = False
        # The latest ``holding`` stretches, over (tick.py tells them from a freeze): several starts in one turn
        # (a phase of daemons without a readiness check) each hold the loop, one after the other.
        self.holds: deque[Hold] = deque(maxlen=HOLDS_KEPT)

    # ------------------------------------------------------------ registration

    def add_reader(self, fd: int, callback: Callback, on_error: ErrorHandler | None = None) -> None:
        self._selector.register(fd, selectors.EVENT_READ, (callback, on_error))

    def remove_reader(self, fd: int) -> None:
        self._reader_faults.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def call_later(self, delay: float, callback: Callback, on_error: ErrorHandler | None = None) -> Timer:
        timer = Timer(self.clock.monotonic() + sane_delay(delay), next(self._seq), callback, on_error=on_error)
        heapq.heappush(self._timers, timer)
        return timer

    def call_soon_threadsafe(self, callback: Callback, on_error: ErrorHandler | None = None) -> None:
        with self._calls_lock:
            if self._closed:
                return  # a thread's late answer after the exit: nowhere to go (and the fd may be another's now)
            self._calls.append((callback, on_error))
            # A full pipe is already full of wake-ups: the loop will run the call.
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"\0")

    @contextlib.contextmanager
    def holding(self, why: str) -> Iterator[Hold]:
        """Mark a call that holds the loop's thread for a bounded while (a spawn waiting for its exec): a long
        one is then told apart from a freeze of the whole supervisor. The call may say, on the Hold, how much
        of its time the supervisor was stopped."""
        hold = Hold(self.clock.monotonic(), why)
        try:
            yield hold
        finally:
            hold.ended = self.clock.monotonic()
            self.holds.append(hold)

    # ------------------------------------------------------------ running

    def stop(self) -> None:
        self._stopped = True

    def run(self) -> None:
        self._stopped = False
        while not self._stopped:
            self.run_once()

    def run_until(self, done: Callable[[], bool], poll_s: float) -> None:
        """Run callbacks until ``done()``, looked at after every pass and at least every ``poll_s``: it may
        hang on what no fd announces (another thread's progress, the clock)."""
        while not done():
            self.run_once(max_wait=poll_s)

    def run_once(self, max_wait: float | None = None) -> None:
        timeout = self._next_timeout()
        if max_wait is not None:
            timeout = max_wait if timeout is None else min(timeout, max_wait)
        for key, _ in self._selector.select(timeout):
            self._run_reader(key.fd, *key.data)
        self._run_due_timers()

    def _run_reader(self, fd: int, callback: Callback, on_error: ErrorHandler | None) -> None:
        try:
            callback()
        except Exception as exc:
            # Named only here: a reader runs for every chunk of every child's output.
            where = f"the reader of fd {fd} ({name_of(callback)})"
            self.contain(exc, on_error, where)
            self._reader_faults[fd] = self._reader_faults.get(fd, 0) + 1
            if on_error is None and self._reader_faults[fd] >= READER_FAULTS_MAX:
                self.faults.log(f"{where} raised {READER_FAULTS_MAX} times in a row: no longer watched")
                self.remove_reader(fd)
        else:
            if self._reader_faults:
                self._reader_faults.pop(fd, None)

    def run_contained(self, callback: Callback, on_error: ErrorHandler | None, where: str) -> None:
        """Run one callback; whatever it raises goes to its owner's handler, else to ``faults``."""
        try:
            callback()
        except Exception as exc:
            self.contain(exc, on_error, where)

    def contain(self, exc: Exception, on_error: ErrorHandler | None, where: str) -> None:
        if on_error is not None:
            try:
                on_error(exc)
                return
            except Exception as second:  # the handler is broken too: both are said
                self.faults.report(f"the error handler of {where}", second)
        self.faults.report(where, exc)

    def next_due(self) -> float | None:
        """When the next timer is due (on ``clock``'s monotonic time), or None: no timer is set."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None

    def _next_timeout(self) -> float | None:
        due = self.next_due()
        if due is None:
            return None
        return min(MAX_SLEEP_S, max(0.0, due - self.clock.monotonic()))

    def _run_due_timers(self) -> None:
        now = self.clock.monotonic()
        while self._timers and self._timers[0].when <= now:
            timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.run_contained(timer.callback, timer.on_error, f"a timer ({name_of(timer.callback)})")

    def _run_thread_calls(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._calls_lock:
                if not self._calls:
                    return
                call, on_error = self._calls.popleft()
            self.run_contained(call, on_error, f"a call from a thread ({name_of(call)})")

    def close(self) -> None:
        """After this a thread's ``call_soon_threadsafe`` is dropped: the exit closes the loop only once the
        threads that answer into it (the sender) were given their time."""
        with self._calls_lock:
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._selector.close()


def sane_delay(delay: float) -> float:
    """A delay the timer heap can order: never negative; too big for a float, or NaN (no time
    at all), is never (the loop's sleep is capped at MAX_SLEEP_S, so never is safe)."""
    try:
        seconds = float(delay)
    except OverflowError:
        return math.inf
    if math.isnan(seconds):
        return math.inf
    return max(0.0, seconds)


def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


def _to_stderr(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"[supervisor] {line}", file=sys.stderr, flush=True)
