"""Child processes, once started (spawn.py starts them): their output pipes, and the stop of a whole tree.

The reaper owns ``waitpid``: a child is told its exit status (``exited``), never waits for it.

Stopping a child stops its tree: the stop signal to its process group, and after the grace period
(shorter under a stop budget: stopbudget.py) SIGKILL to the group and to every descendant still
alive. A descendant that called ``setsid`` has left the group and, once its parent dies, the parent
chain too; it is still found through the tag every child carries in its environment
(``PROVER_SUPERVISOR_TAG``), which its own children inherit. One that also cleared its environment
is found only by the phase cgroup it was born in: the memory module says which pids and cgroups are
left, and trees.py sweeps them.

A child's stamps (its start and end, when it was SIGKILLed) come from the ``Clock`` it was spawned
with (the loop's); only its reaping's stamp is the process table's own clock, which it is compared with.

Who is in a tree comes from the process table's shared reading (trees.py), and a stop's poll
asks for it only once the leader is reaped and its group is empty: 200 daemons stopping together
cost a reading of /proc per poll, not 200.

Many children stop in order (``stop_in_order``): reverse start order (``StartOrder``), wave by wave, the
daemons of one phase together.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..config import ChildSpec
from ..text import Log
from .clock import SYSTEM_CLOCK, Clock
from .logs import ChildOutput
from .loop import ErrorHandler, EventLoop, Timer
from .reaping import ExitStatus
from .signals import signal_name
from .stopbudget import StopBudget

# What the sweeps (trees.py) share with the Child's own stop.
from .trees import KILL_WAIT_S, PROCESS_TABLE, STOP_POLL_S, Proc, ProcessTable, signal_quietly

READ_CHUNK = 256 * 1024


@dataclass
class Child:
    spec: ChildSpec
    pid: int
    tag: str
    output: ChildOutput
    pipes: dict[str, int]  # "stdout" / "stderr" → the read end of its pipe (attach_output reads them)
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False)
    started_at: float = 0.0  # wall time (clock.time()) of its start: set by spawn
    status: ExitStatus | None = None
    ended_at: float | None = None
    reaped_mono: float | None = None  # the process table's monotonic time of its reaping (trees.py)
    stop_reason: str | None = None
    stop_detail: str = ""  # what the supervisor saw that made it stop the child (for the verdict)
    # Its memory cgroup and the OOM counter at its start (an evidence.memory.Placement, which this layer
    # below the evidence only carries): lifecycle/children.py sets it at the spawn and reads it at the exit.
    placement: Any = None
    table: ProcessTable = field(default=PROCESS_TABLE, repr=False)  # who belongs to its tree
    _streams: dict[int, str] = field(default_factory=dict)  # open pipe fd → "stdout" / "stderr"
    _loop: EventLoop | None = None
    _on_eof: Callable[[Child], None] = lambda child: None
    _stop_waiters: list[Callable[[], None]] = field(default_factory=list)
    forwarded: dict[int, float] = field(default_factory=dict)  # signal from outside → when last forwarded to it
    _stopping: bool = False
    _kill_timer: Timer | None = None
    _killed_at: float | None = None
    grace_s: float = 0.0  # the grace its stop under way gives it (set as it begins; shorter under a budget)
    job_stopped: str | None = None  # the signal that stopped it (SIGSTOP, SIGTSTP: job control), until continued
    _wait_until: float | None = None  # a stop budget's end: past it a tree that survives SIGKILL is not waited for

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def running(self) -> bool:
        return self.status is None

    @property
    def sigkilled(self) -> bool:
        """The supervisor sent its tree SIGKILL: the grace of its stop ran out, a second stop request, a stop that
        broke, or SIGKILL as its stop signal."""
        return self._killed_at is not None or (self.stop_reason is not None and self.spec.stop_signal == signal.SIGKILL)

    @property
    def stopping(self) -> bool:
        """Its stop is under way: after its leader's exit too, while what it left in its tree still runs (a
        oneshot that exited 0 leaving a process in its group holds its phase's end until the grace's SIGKILL)."""
        return self._stopping

    @property
    def kill_at(self) -> float | None:
        """While it is being stopped and its grace runs: when SIGKILL follows (monotonic, the loop's clock)."""
        timer = self._kill_timer
        if not self._stopping or timer is None or timer.cancelled or self._killed_at is not None:
            return None
        return timer.when

    def job_control(self, stopped_by: str | None) -> None:
        """The reaper saw it stopped (by that signal) or continued (None)."""
        self.job_stopped = stopped_by

    def exited(self, status: ExitStatus) -> None:
        """Called by the reaper's owner when ``waitpid`` returned this child's status."""
        self.status = status
        self.ended_at = self.clock.time()
        self.reaped_mono = time.monotonic()  # compared with the process table's readings, on its clock

    # ------------------------------------------------------------ signals

    def send_group_signal(self, sig: int) -> None:
        """Forward a signal to the child's process group (while the group is surely its own)."""
        if self.running:
            self.forwarded[sig] = self.clock.time()
            signal_quietly(os.killpg, self.pid, sig)

    def kill_now(self, reason: str, wait_until: float | None = None) -> None:
        """SIGKILL the whole tree at once, no grace (a second shutdown request), for ``reason``: a child whose
        stop had not begun (its wave still waited) is stopped by us all the same, and its verdict says so.
        ``wait_until``: a stop budget's end, past which a tree that survives SIGKILL is not waited for (the
        earlier one holds)."""
        if wait_until is not None:
            self._wait_until = wait_until if self._wait_until is None else min(self._wait_until, wait_until)
        if not self.gone():
            self.stop_reason = self.stop_reason or reason
            self._killed_at = self._killed_at or self.clock.monotonic()
            self._signal_tree(signal.SIGKILL, self.tree())

    # ------------------------------------------------------------ stopping

    def stop(self, loop: EventLoop, log: Log, reason: str, on_stopped: Callable[[], None],
             grace_s: float | None = None, wait_until: float | None = None) -> None:
        """Stop the whole tree: stop signal, grace, SIGKILL; ``on_stopped`` once nothing is left. A stop budget
        shortens the grace (``grace_s``), of a stop under way too, and ends the wait at ``wait_until``."""
        self._stop_waiters.append(on_stopped)
        self._wait_until = self._wait_until if wait_until is None else wait_until
        if self._stopping:
            if grace_s is not None:
                self._hasten(loop, log, grace_s)
            return
        self._stopping = True
        self.stop_reason = self.stop_reason or reason
        self.grace_s = self.spec.stop_grace_s if grace_s is None else grace_s
        try:
            self._begin_stop(loop, log, reason)
        except Exception as exc:  # whoever waits on this stop must not wait forever
            self._stop_broke(loop, exc)

    def _begin_stop(self, loop: EventLoop, log: Log, reason: str) -> None:
        sig, group = self.spec.stop_signal, self.running
        if group:
            # The group first, at once: the tree's reading below may read /proc. Then SIGCONT, as systemd sends it:
            # a stopped process (SIGSTOP, SIGTTIN from a tty it read) keeps the stop signal pending until it is
            # continued, and would wait out its whole grace for SIGKILL, its own clean stop never run.
            self._signal_group(sig, wake=True)
            # Then the CPU to the signalled: the scheduler lets a running task finish its slice before a task
            # it woke (up to ~1.5 ms on 2 cores), and ours goes on reading /proc; the child's own stop comes first.
            os.sched_yield()
        if self.gone():
            self._stop_done()  # reaped, nothing of its tree alive: stopped already, no need to look again
            return
        members = self.tree()
        # (its leader reaped, the group is signalled below while members of it live)
        log(f"stopping {self.label} ({reason}): {signal_name(sig)} to "
            f"{self._signalled(members, group or self._group_is_ours(members))}, grace {self._grace_text()}")
        self._signal_tree(sig, members, group_done=group, wake=True)
        self._kill_timer = loop.call_later(self.grace_s, lambda: self._kill(loop, log),
                                           on_error=lambda exc: self._stop_broke(loop, exc))
        self._check_stopped(loop, log)

    def _hasten(self, loop: EventLoop, log: Log, grace_s: float) -> None:
        """A stop under way (its phase's end) when the budget came: SIGKILL no later than ``grace_s`` from now."""
        timer, now = self._kill_timer, self.clock.monotonic()
        if timer is not None and not timer.cancelled and self._killed_at is None and timer.when > now + grace_s:
            timer.cancel()
            self.grace_s -= timer.when - now - grace_s  # the grace it gets in all
            log(f"{self.label}: grace cut to {self._grace_text()}: SIGKILL in {grace_s:.1f}s")
            self._kill_timer = loop.call_later(grace_s, lambda: self._kill(loop, log),
                                               on_error=lambda exc: self._stop_broke(loop, exc))

    def _grace_text(self) -> str:
        grace, own = self.grace_s, self.spec.stop_grace_s
        return f"{grace:g}s" if grace >= own else f"{grace:.1f}s (of {own:g}s: the stop budget)"

    def _kill(self, loop: EventLoop, log: Log) -> None:
        if self.gone():
            return
        members = self.tree()
        group = self._group_is_ours(members)
        # (its leader reaped: not it, what it left, which its stop waited for)
        still = "still running" if self.running else "exited, and what it left still runs"
        log(f"{self.label}: {still} after {self._grace_text()} grace: SIGKILL to {self._signalled(members, group)}")
        self._killed_at = self.clock.monotonic()
        self._signal_tree(signal.SIGKILL, members)

    def _check_stopped(self, loop: EventLoop, log: Log) -> None:
        if not self.gone():
            now = self.clock.monotonic()
            if self._killed_at is not None and now - self._killed_at > KILL_WAIT_S:
                log(f"{self.label}: {self._describe_tree(self.tree())} survived SIGKILL for {KILL_WAIT_S:g}s "
                    "(uninterruptible sleep?); giving up waiting")
            elif self._killed_at is not None and self._wait_until is not None and now >= self._wait_until:
                log(f"{self.label}: {self._describe_tree(self.tree())} survived SIGKILL for "
                    f"{now - self._killed_at:.1f}s (uninterruptible sleep?); the stop budget is spent: not waited for")
            else:
                if self._killed_at is not None:
                    self._signal_tree(signal.SIGKILL, self.tree())  # catch anything forked since
                loop.call_later(STOP_POLL_S, lambda: self._check_stopped(loop, log),
                                on_error=lambda exc: self._stop_broke(loop, exc))
                return
        self._stop_done()

    def gone(self) -> bool:
        """Nothing of its tree is left. Asked every poll of a stop, so the cheap answers first: a
        leader not yet reaped, or a live member of its group (one syscall), mean it is not gone;
        only then the shared reading of the process table, for what left the group."""
        if self.running or _group_alive(self.pid):
            return False
        return not self.tree()

    def _stop_done(self) -> None:
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        waiters, self._stop_waiters = self._stop_waiters, []
        self._stopping = False
        for waiter in waiters:
            waiter()

    def _stop_broke(self, loop: EventLoop, exc: Exception) -> None:
        """The stop sequence itself raised. A phase's end, or the whole shutdown, waits on this stop:
        SIGKILL the group without the broken part, and wait only for the leader to be reaped (the
        tree scan may be what broke); the exit sweep kills whatever of the tree is left at the end."""
        loop.faults.report(f"stopping {self.label}", exc)
        self._killed_at = self._killed_at or self.clock.monotonic()
        if self.running:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
        self._await_reaped(loop)

    def _await_reaped(self, loop: EventLoop) -> None:
        assert self._killed_at is not None
        if self.running and self.clock.monotonic() - self._killed_at < KILL_WAIT_S:
            loop.call_later(STOP_POLL_S, lambda: self._await_reaped(loop))
            return
        self._stop_done()

    def _signal_tree(self, sig: int, members: list[Proc], group_done: bool = False, wake: bool = False) -> None:
        # The group first, in one atomic call, while it surely still is ours (_group_is_ours).
        # ``wake``: SIGCONT after ``sig`` (a stop signal).
        if not group_done and self._group_is_ours(members):
            self._signal_group(sig, wake)
        for proc in members:
            if proc.pgid != self.pid:
                signal_quietly(os.kill, proc.pid, sig)
                if wake:
                    signal_quietly(os.kill, proc.pid, signal.SIGCONT)

    def _group_is_ours(self, members: list[Proc]) -> bool:
        """Its process group may be signalled as a whole: the leader is alive or a zombie (its pid, hence the
        pgid, is not reused), or members of the group are still alive."""
        return self.running or any(p.pgid == self.pid for p in members)

    def _signal_group(self, sig: int, wake: bool = False) -> None:
        """``sig`` to the child's process group; ``wake``: SIGCONT after it (a stop signal)."""
        signal_quietly(os.killpg, self.pid, sig)
        if wake:
            signal_quietly(os.killpg, self.pid, signal.SIGCONT)

    def tree(self) -> list[Proc]:
        """Every live process of this child's tree, the leader included while it lives: from the
        process table's shared reading, one taken after the leader was reaped once it was."""
        newer_than = self.reaped_mono if self.reaped_mono is not None else -math.inf
        return self.table.snapshot(newer_than).tree(self.pid, self.tag)

    def _signalled(self, members: list[Proc], group: bool) -> str:
        """Whom a signal went to: its process group (one killpg: whoever is in it then; once its leader was reaped,
        the pids still in it), and one by one each member of its tree that left the group (``members``: read after
        the group's signal)."""
        outside = [p for p in members if p.pgid != self.pid]
        whom = f"process group {self.pid}"
        if group and not self.running:  # (a pid of its own no more: the group is named by what is left in it)
            left = [p for p in members if p.pgid == self.pid]
            whom = f"its process group {self.pid} (pid {self.pid} exited; {_named_pids(left)} still running)"
        if not outside:
            return whom if group else f"pid {self.pid}"
        apart = f"{len(outside)} process(es) of its tree outside the group [{_pids(outside)}]"
        return f"{whom} and {apart}" if group else apart

    def _describe_tree(self, members: list[Proc]) -> str:
        """What of its tree is alive (a survivor of SIGKILL): each process, in its group or not."""
        return f"the tree of pid {self.pid}: {len(members)} process(es) [{_pids(members)}]" if members else \
            f"pid {self.pid}"

    # ------------------------------------------------------------ output

    def attach_output(self, loop: EventLoop, on_eof: Callable[[Child], None],
                      on_error: ErrorHandler | None = None) -> None:
        """Read its pipes in the loop; what reading them raises goes to ``on_error`` (its phase's)."""
        self._loop, self._on_eof = loop, on_eof
        for stream, fd in self.pipes.items():
            os.set_blocking(fd, False)
            self._streams[fd] = stream
            loop.add_reader(fd, partial(self._read, fd), on_error)

    def _read(self, fd: int) -> bool:
        """Read what one pipe has; False when nothing more is there right now."""
        if fd not in self._streams:
            return False  # closed by a drain earlier in this same loop turn
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        stream = self._streams[fd]
        if data:
            self.output.feed(stream, data)
            return True
        assert self._loop is not None
        self._loop.remove_reader(fd)
        os.close(fd)
        del self._streams[fd]
        self.output.close_stream(stream)
        if not self._streams:
            self._on_eof(self)
        return False

    def drain_output(self) -> None:
        """Take in everything already written, so a verdict's last lines are really the last."""
        for fd in list(self._streams):
            for _ in range(64):  # bounded: a grandchild may still be writing as fast as we read
                if not self._read(fd):
                    break

    @property
    def output_open(self) -> bool:
        return bool(self._streams)


def _pids(procs: list[Proc]) -> str:
    """Their pids in a line, the first 8."""
    pids = sorted(p.pid for p in procs)
    return ", ".join(str(p) for p in pids[:8]) + (", ..." if len(pids) > 8 else "")


def _named_pids(procs: list[Proc]) -> str:
    """"pid 4242", or "pids 4242, 4243" (the first 8)."""
    return f"pid{'s' if len(procs) > 1 else ''} {_pids(procs)}"


def _group_alive(pgid: int) -> bool:
    """Whether the process group ``pgid`` has a member (a zombie counts: it still holds the group)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- many children, in order


class StartOrder:
    """Every child started and not yet known to be over, in start order."""

    def __init__(self) -> None:
        self._children: list[Child] = []

    def __iter__(self) -> Iterator[Child]:
        return iter(list(self._children))

    def add(self, child: Child) -> None:
        self._children.append(child)

    def forget(self, children: Iterable[Child]) -> None:
        """``children`` are over (their attempt's stop ended): a shutdown has no more to stop of them."""
        gone = {id(c) for c in children}
        self._children = [c for c in self._children if id(c) not in gone]

    def newest_first(self) -> list[Child]:
        return list(reversed(self._children))


def stop_in_order(loop: EventLoop, log: Log, children: list[Child], reason: str, then: Callable[[], None],
                  budget: StopBudget | None = None) -> None:
    """Stop each child's tree in the order given (reverse start order), wave after wave; then ``then``.

    A wave is one child, or the daemons of one phase that come one after another: they have no order
    among themselves but their start's, so they are signalled together, in that order, and waited for
    together (200 daemons stop in their grace period, not one after the other). The next wave starts
    once the whole wave is gone: a phase's command is gone before its daemons get their signal, and a
    later phase before an earlier one. Under a stop ``budget`` each wave's graces are shrunk to its share.
    """
    _Waves(loop, log, stop_waves(children), reason, then, budget).next()


def stop_waves(children: list[Child]) -> list[list[Child]]:
    """``children`` cut into waves (see stop_in_order), in order."""
    waves: list[list[Child]] = []
    for child in children:
        phase = _daemon_of(child)
        if phase is not None and waves and _daemon_of(waves[-1][-1]) == phase:
            waves[-1].append(child)
        else:
            waves.append([child])
    return waves


def _daemon_of(child: Child) -> str | None:
    """The phase ``child`` is a daemon of; None for a phase's command (no daemon is named like its phase)."""
    return child.spec.phase if child.spec.name != child.spec.phase else None


def _stops_anything(wave: list[Child]) -> bool:
    return any(child.running or not child.gone() for child in wave)


class _Waves:
    """Stops the waves one after the other, each once the one before it is gone."""

    def __init__(self, loop: EventLoop, log: Log, waves: list[list[Child]], reason: str,
                 then: Callable[[], None], budget: StopBudget | None = None) -> None:
        self._loop, self._log, self._waves, self._reason, self._then = loop, log, waves, reason, then
        self._budget = budget
        self._pending = 0  # stops of the current wave not yet over
        self._starting = False  # the current wave's stops are being begun (some may end at once)

    def next(self) -> None:
        # A loop, not a call per wave: children already gone end their stop at once, and a chain of
        # those must not recurse once per child.
        while self._waves:
            # Under a budget, a wave with nothing left to stop (its children reaped, their trees gone: a phase whose
            # command had ended, its daemons still stopping) takes no share of it, and no grace of its is "cut".
            waves_left = len(self._waves) if self._budget is None else sum(map(_stops_anything, self._waves))
            wave = self._waves.pop(0)
            self._pending, self._starting = len(wave), True
            for child in wave:
                if self._budget is None or child.gone():
                    child.stop(self._loop, self._log, self._reason, self._one_stopped)
                    continue
                grace = self._budget.grace(child.label, child.spec.stop_grace_s, waves_left)
                child.stop(self._loop, self._log, self._reason, self._one_stopped, grace, self._budget.wait_until)
            self._starting = False
            if self._pending:
                return  # the wave's last stop to end goes on from here
        self._then()

    def _one_stopped(self) -> None:
        self._pending -= 1
        if not self._pending and not self._starting:
            self.next()
