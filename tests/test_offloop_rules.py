"""supervisor.engine.offloop's ``Bounded`` rules in-process, on a real EventLoop (the thread calls go through its real
self-pipe): exactly one of answer, failure and bound is acted on, the rest dropped; ``cancel`` silences all of
them and stops the bound's timer; a failure without an ``on_error`` reaches the loop's faults; a machine that
refuses a thread is a ``NoThread`` failure for the owner, never an exception out of ``run_bounded``. What
tests/test_offloop.py covers (answer first, bound first, the work raising, the signal mask) is not repeated."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from supervisor.engine import offloop
from supervisor.engine.loop import EventLoop
from supervisor.engine.offloop import Bounded, NoThread, run_bounded

NEVER_S = 3600.0  # a bound no test waits out


@pytest.fixture
def loop() -> Iterator[EventLoop]:
    loop = EventLoop()
    yield loop
    loop.close()


def spin(loop: EventLoop, until: object = None, timeout: float = 10) -> None:
    """Run the loop until ``until()`` holds (or, without one, until what is queued now has run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loop.run_once(max_wait=0.02)
        if until is None or until():  # type: ignore[operator]
            return


class Heard:
    def __init__(self) -> None:
        self.events: list[object] = []

    def answer(self, value: object) -> None:
        self.events.append(("answer", value))

    def overdue(self) -> None:
        self.events.append("overdue")

    def error(self, exc: Exception) -> None:
        self.events.append(("error", type(exc).__name__, str(exc)))


def test_an_answer_then_a_failure_acts_on_the_answer_only(loop: EventLoop) -> None:
    heard = Heard()
    bounded: Bounded[int] = Bounded(loop, NEVER_S, heard.answer, heard.overdue, heard.error)
    bounded.answer(1)
    bounded.fail(OSError("late"))
    bounded.answer(2)
    spin(loop)
    spin(loop)
    assert heard.events == [("answer", 1)] and bounded.settled


def test_a_failure_then_an_answer_acts_on_the_failure_only(loop: EventLoop) -> None:
    heard = Heard()
    bounded: Bounded[int] = Bounded(loop, NEVER_S, heard.answer, heard.overdue, heard.error)
    bounded.fail(OSError(5, "Input/output error"))
    bounded.answer(1)
    spin(loop)
    spin(loop)
    assert heard.events == [("error", "OSError", "[Errno 5] Input/output error")]


def test_settling_cancels_the_bound(loop: EventLoop) -> None:
    """Once answered, no timer of it is left in the loop (a long bound must not keep the loop's next wake)."""
    heard = Heard()
    assert loop.next_due() is None
    bounded: Bounded[int] = Bounded(loop, NEVER_S, heard.answer, heard.overdue, heard.error)
    assert loop.next_due() is not None
    bounded.answer(7)
    spin(loop, lambda: heard.events)
    assert heard.events == [("answer", 7)]
    assert loop.next_due() is None


def test_cancel_silences_the_answer_and_the_bound(loop: EventLoop) -> None:
    heard = Heard()
    bounded: Bounded[int] = Bounded(loop, 0.0, heard.answer, heard.overdue, heard.error)
    bounded.cancel()
    bounded.answer(1)
    bounded.fail(RuntimeError("nobody wants it"))
    spin(loop)
    spin(loop)
    assert heard.events == [] and bounded.settled
    assert loop.next_due() is None


def test_the_bound_first_then_answer_and_failure_both_dropped(loop: EventLoop) -> None:
    heard = Heard()
    bounded: Bounded[int] = Bounded(loop, 0.0, heard.answer, heard.overdue, heard.error)
    spin(loop, lambda: heard.events)
    bounded.answer(1)
    bounded.fail(OSError("too late"))
    spin(loop)
    spin(loop)
    assert heard.events == ["overdue"]


def test_a_failure_without_an_error_handler_is_the_loops_fault(loop: EventLoop) -> None:
    """Said once with its traceback by the loop's Faults, contained: the loop goes on."""
    said: list[str] = []
    loop.faults.log = said.append
    heard = Heard()
    bounded: Bounded[int] = Bounded(loop, NEVER_S, heard.answer, heard.overdue)
    bounded.fail(OSError("unhandled"))
    spin(loop, lambda: said)
    assert said[0].startswith("internal error in a call from a thread") and "OSError: unhandled" in said[0], said
    assert any("raise exc" in line for line in said[1:]), "the first time, with its traceback"
    assert heard.events == []


def test_the_answer_is_acted_on_in_the_loops_thread_not_the_workers(loop: EventLoop) -> None:
    threads: list[str] = []
    run_bounded(loop, "worker-x", lambda: threading.current_thread().name, NEVER_S,
                lambda worker: threads.extend([worker, threading.current_thread().name]), lambda: None)
    spin(loop, lambda: threads)
    assert threads == ["worker-x", threading.current_thread().name]


def test_no_thread_to_be_had_is_a_no_thread_failure_for_the_owner(loop: EventLoop,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """pids.max reached, RLIMIT_AS: threading raises RuntimeError("can't start new thread"); the owner hears
    it through on_error like any failure, naming the work, and run_bounded itself does not raise."""

    def refuse(name: str, target: object) -> threading.Thread:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(offloop, "worker_thread", refuse)
    heard = Heard()
    bounded = run_bounded(loop, "gpu-probe", lambda: 1, NEVER_S, heard.answer, heard.overdue, heard.error)
    spin(loop, lambda: heard.events)
    assert heard.events == [("error", "NoThread", "no thread for gpu-probe (can't start new thread)")]
    assert bounded.settled and loop.next_due() is None
    assert issubclass(NoThread, RuntimeError)


def test_a_real_refusal_to_start_a_thread_reaches_the_owner(loop: EventLoop,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, with the refusal coming out of threading.Thread.start itself (the real call site)."""

    def start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", start)
    heard = Heard()
    run_bounded(loop, "statvfs", lambda: 1, NEVER_S, heard.answer, heard.overdue, heard.error)
    monkeypatch.undo()
    spin(loop, lambda: heard.events)
    assert heard.events == [("error", "NoThread", "no thread for statvfs (can't start new thread)")]


def test_many_bounded_calls_each_hear_their_own_answer(loop: EventLoop) -> None:
    got: dict[int, object] = {}
    for i in range(20):
        run_bounded(loop, f"job-{i}", lambda i=i: i * i, NEVER_S, lambda v, i=i: got.__setitem__(i, v),
                    lambda i=i: got.__setitem__(i, "overdue"))
    spin(loop, lambda: len(got) == 20)
    assert got == {i: i * i for i in range(20)}
    assert loop.next_due() is None, "every bound was cancelled by its answer"


def test_a_worker_thread_is_a_named_daemon_running_its_target() -> None:
    ran = threading.Event()
    thread = offloop.worker_thread("named-one", ran.set)
    thread.join(10)
    assert ran.is_set() and thread.name == "named-one" and thread.daemon
