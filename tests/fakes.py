"""Fakes for driving the real Phase and Lifecycle in-process: a clock moved by hand, children that are no process.

``FakeClock`` is what an ``EventLoop(clock=...)`` follows: a timer is due when it says so. ``FakeChildren.spawn``
is handed to a Phase (or a Lifecycle) as how it starts children: each ``FakeChild`` prints and exits when the
test says; asked to stop, it exits by SIGTERM on the loop's next turn (at the same fake time).
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from supervisor.config import ChildSpec
from supervisor.engine.loop import EventLoop
from supervisor.engine.reaping import ExitStatus
from supervisor.lifecycle.children import ChildContext, OnExit, Reader


class FakeClock:
    """Monotonic time that moves only when told; wall time is a fixed epoch plus it."""

    def __init__(self, epoch: float = 1_800_000_000.0) -> None:
        self.now, self._epoch = 0.0, epoch

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self._epoch + self.now


class _Closed:
    def close(self) -> None:
        pass


@dataclass
class FakeOutput:
    """What a phase reads of a child's output: when it last printed (on the fake clock), its last lines."""

    last_output_at: float = 0.0
    lines: list[str] = field(default_factory=list)
    file: _Closed = field(default_factory=_Closed)

    def last_lines(self, n: int = 20, *, begun: bool = False) -> list[str]:
        return self.lines[-n:]  # (a fake's lines are whole: none is begun and not ended)


@dataclass(eq=False)
class FakeChild:
    """A child that is no process: it prints and exits when the test says; a stop ends it by SIGTERM
    (``stop_takes`` later; never, when it ``outlives_kill``: the stop then ends unreaped, as a real one gives up)."""

    spec: ChildSpec
    pid: int
    clock: FakeClock
    loop: EventLoop
    on_exit: OnExit
    reader: Reader | None
    started_at: float
    output: FakeOutput = field(default_factory=FakeOutput)
    status: ExitStatus | None = None
    stop_reason: str | None = None
    stop_detail: str = ""
    job_stopped: str | None = None  # (job control: a fake is never stopped by SIGSTOP)
    sigkilled: bool = False  # (the supervisor sent it SIGKILL: a fake is only ever stopped by SIGTERM)
    forwarded: dict[int, float] = field(default_factory=dict)  # (signals forwarded from outside: a fake gets none)
    placement: None = None
    output_open: bool = False
    stop_asked_at: float | None = None
    stop_takes: float = 0.0  # seconds from the stop's first signal to its end (its grace, a slow shutdown)
    outlives_kill: bool = False  # in uninterruptible sleep: the stop ends (the wait given up), no exit ever comes
    tag: str = "fake"  # (what a real child's processes carry in their environment: a watch's tree has none of it)
    held: list[str] = field(default_factory=list)  # printed but not read yet (still in the pipe): drain_output reads it

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def running(self) -> bool:
        return self.status is None

    @property
    def stopping(self) -> bool:  # (its stop under way after its exit: a fake leaves nothing behind it)
        return False

    def say(self, line: str) -> None:
        self.output.last_output_at = self.clock.monotonic()
        self.output.lines.append(line)
        if self.reader is not None:
            self.reader([line.encode()])

    def exit(self, code: int | None = 0, sig: int | None = None) -> None:
        self.on_exit(self, self.pid, ExitStatus(code, sig))

    # What the phase calls on a child.
    def exited(self, status: ExitStatus) -> None:
        self.status = status

    def drain_output(self) -> None:
        """What it printed that is still in the pipe (``held``) is read now, as a real child's drain reads it."""
        held, self.held = self.held, []
        for line in held:
            self.say(line)

    def stop(self, loop: EventLoop, log: Callable[[str], None], reason: str, on_stopped: Callable[[], None]) -> None:
        if not self.running:
            on_stopped()
            return
        self.stop_asked_at = self.clock.monotonic()
        self.stop_reason = self.stop_reason or reason

        def gone() -> None:
            if self.running and not self.outlives_kill:
                self.exit(None, signal.SIGTERM)
            on_stopped()

        loop.call_later(self.stop_takes, gone)

    def kill_now(self, wait_until: float | None = None) -> None:
        pass

    def send_group_signal(self, sig: int) -> None:
        pass


class FakeChildren:
    """The phase's ``spawn``: every child it starts, fake, in start order."""

    def __init__(self, clock: FakeClock, loop: EventLoop) -> None:
        self.clock, self.loop = clock, loop
        self.started: list[FakeChild] = []
        self.envs: list[dict[str, str]] = []  # the environment the phase added, for each child in start order
        self._pids = itertools.count(1000)

    def spawn(self, spec: ChildSpec, ctx: ChildContext, reader: Reader | None, on_exit: OnExit) -> FakeChild:
        child = FakeChild(spec, next(self._pids), self.clock, self.loop, reader=reader, started_at=self.clock.time(),
                          # As the reaper's callback is in start_child: a bug in handling the exit fails the phase.
                          on_exit=ctx.guarded(f"the exit of {spec.label}", on_exit))
        self.started.append(child)
        self.envs.append(dict(ctx.env))
        return child

    @property
    def last(self) -> FakeChild:
        return self.started[-1]


class FailingProduction:
    """The ``ProductionControl`` a plugin's watch is handed (wiring.py), as far as a watch uses it: each phase it
    is told to fail, recorded (name, reason, detail)."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, str, str]] = []

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        self.failed.append((name, reason, detail))
        return True
