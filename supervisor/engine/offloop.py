"""Work the loop must not wait for: calls that can block on a driver, a filesystem or a peer.

The loop thread never makes such a call (an NVML call hangs for 45 s under Xid 119, a statvfs
of a hung FUSE or NFS mount never returns and cannot be interrupted). A worker thread makes it
(``worker_thread``: a daemon that leaves the supervisor's signals to the loop's thread), and the
answer comes back into the loop through ``call_soon_threadsafe``.

``Bounded`` is one such answer awaited for at most ``bound_s``: whichever comes first, the
answer or the bound, is acted on, once, on the loop. A bound that passes is a finding for its
owner to say, never something to wait out; the answer that comes after it is dropped. The
thread itself is never waited for (it may sit in the kernel for good) and never doubled.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from .loop import ErrorHandler, EventLoop
from .signals import CAUGHT

T = TypeVar("T")


def worker_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """Run ``target`` on a new daemon thread named ``name`` that blocks the signals the loop handles:
    a signal must wake the loop's thread, never one that sits in a hung call."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)  # a hung one must not hold up the exit
    thread.start()
    return thread


class NoThread(RuntimeError):
    """A worker thread could not be started: the machine refused it (a limit), not a bug of ours."""


class Overdue(Exception):
    """A thread's answer did not come within its bound (``answer_within``)."""


def answer_within(name: str, work: Callable[[], T], bound_s: float) -> T:
    """Before the loop runs: ``work()`` on a thread of its own, its result if it comes within ``bound_s``;
    else Overdue (the thread is left where it sits: it may be in the kernel for good). What the work
    raised is raised here; NoThread where no thread is to be had."""
    done = threading.Event()
    outcome: list[tuple[bool, object]] = []

    def job() -> None:
        try:
            outcome.append((True, work()))
        except Exception as exc:  # raised again on the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    try:
        worker_thread(name, job)
    except RuntimeError as exc:
        raise NoThread(f"no thread for {name} ({exc})") from None
    if not done.wait(bound_s):
        raise Overdue(f"no answer within {bound_s:g} s")
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, Exception)
        raise value
    return value  # type: ignore[return-value]


class Bounded(Generic[T]):
    """One answer from a thread, or its bound passing first: ``on_answer(value)`` or ``on_overdue()``,
    exactly one of them, on the loop. What the work raised goes to ``on_error`` (else the loop's faults)."""

    def __init__(self, loop: EventLoop, bound_s: float, on_answer: Callable[[T], None],
                 on_overdue: Callable[[], None], on_error: ErrorHandler | None = None) -> None:
        self._loop, self._on_answer, self._on_overdue, self._on_error = loop, on_answer, on_overdue, on_error
        self.settled = False
        self._timer = loop.call_later(bound_s, self._overdue, on_error=on_error)

    def answer(self, value: T) -> None:
        """From any thread: the work is done."""
        self._loop.call_soon_threadsafe(lambda: self._settle(value), self._on_error)

    def fail(self, exc: Exception) -> None:
        """From any thread: the work raised ``exc``; it is raised again on the loop, for ``on_error``."""

        def reraise() -> None:
            if self._close():
                raise exc

        self._loop.call_soon_threadsafe(reraise, self._on_error)

    def cancel(self) -> None:
        """Neither will be acted on (the owner no longer wants to know)."""
        self._close()

    def _settle(self, value: T) -> None:
        if self._close():
            self._on_answer(value)

    def _overdue(self) -> None:
        if self._close():
            self._on_overdue()

    def _close(self) -> bool:
        """True for the first of answer, failure and bound; the rest are too late."""
        if self.settled:
            return False
        self.settled = True
        self._timer.cancel()
        return True


def run_bounded(loop: EventLoop, name: str, work: Callable[[], T], bound_s: float, on_answer: Callable[[T], None],
                on_overdue: Callable[[], None], on_error: ErrorHandler | None = None) -> Bounded[T]:
    """``work()`` on a thread of its own; its result to ``on_answer``, or ``on_overdue`` after ``bound_s``."""
    bounded: Bounded[T] = Bounded(loop, bound_s, on_answer, on_overdue, on_error)

    def job() -> None:
        try:
            value = work()
        except Exception as exc:  # handed to the loop: the owner's error handler decides
            bounded.fail(exc)
            return
        bounded.answer(value)

    try:
        worker_thread(name, job)
    except RuntimeError as exc:  # no thread to be had (pids.max, RLIMIT_AS): the owner hears it like any failure
        bounded.fail(NoThread(f"no thread for {name} ({exc})"))
    return bounded
