"""The one event loop: a selector over pipes and the signal fd, plus timers.

Nothing here polls: the loop sleeps in ``select`` until a file descriptor is
readable or the next timer is due. Threads (readiness probes, the console
writer, later the manager sender) hand work back with ``call_soon_threadsafe``,
which wakes the selector through a pipe.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Callback = Callable[[], None]


@dataclass(order=True)
class Timer:
    when: float
    seq: int
    callback: Callback = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._timers: list[Timer] = []
        self._seq = itertools.count()
        self._calls: deque[Callback] = deque()
        self._calls_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.add_reader(self._wake_r, self._run_thread_calls)
        self._stopped = False

    # ------------------------------------------------------------ registration

    def add_reader(self, fd: int, callback: Callback) -> None:
        self._selector.register(fd, selectors.EVENT_READ, callback)

    def remove_reader(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def call_later(self, delay: float, callback: Callback) -> Timer:
        timer = Timer(time.monotonic() + max(0.0, delay), next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        return timer

    def call_soon_threadsafe(self, callback: Callback) -> None:
        with self._calls_lock:
            self._calls.append(callback)
        # A full pipe is already full of wake-ups: the loop will run the call.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    # ------------------------------------------------------------ running

    def stop(self) -> None:
        self._stopped = True

    def run(self) -> None:
        self._stopped = False
        while not self._stopped:
            self.run_once()

    def run_once(self, max_wait: float | None = None) -> None:
        timeout = self._next_timeout()
        if max_wait is not None:
            timeout = max_wait if timeout is None else min(timeout, max_wait)
        for key, _ in self._selector.select(timeout):
            key.data()
        self._run_due_timers()

    def _next_timeout(self) -> float | None:
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        if not self._timers:
            return None
        return max(0.0, self._timers[0].when - time.monotonic())

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0].when <= now:
            timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback()

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
                call = self._calls.popleft()
            call()

    def close(self) -> None:
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
