"""A phase's attempts: one attempt's record, made afresh for each (number 0: before the first), its start,
and the pacing between them.

Beside the phase's state (supervisor/lifecycle/states.py) the record (``Attempt``) is all an attempt knows:
when it began, its children in start order, the start of its children under way and its output parser,
when its service came up, whether its children are all stopped, and what ended it (or the supervisor's own
bug that did). A new attempt starts with a new record, so nothing of the last one can leak into it.

Its start (``AttemptStart``): its daemons one by one, each waited for until ready where it has a ready
check, then its command; a service's command with a ready check is waited for too, until the service is
up. A child whose readiness is a local TCP port starts only once that port is free (else the attempt fails
``port_in_use``, naming the holder), and only its own listener makes it ready (ports.py); likewise a ready file
counts only if made or changed since the child's start, not one an earlier attempt left. What it learns
goes back to its phase as the events the phase decides on (states.py: ``CommandStarted``, ``CameUp``,
``StartFailed``), told to the one function that decides; once ``cancel``led (the attempt is over, or the
supervisor shuts down) nothing more is: a readiness answer that comes late is dropped here.

Their pacing (``Pacing``, last): what lies between attempts and across them, on the loop's clock: the
phase's deadline, the backoff before the next attempt, the restarts counted against restart_burst, and
each attempt's stall and progress watches. The phase owns one; the status view only reads it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from ..config import ChildSpec, PhaseSpec
from ..engine import ports
from ..engine.loop import Callback, ErrorHandler, EventLoop, Timer
from ..engine.process import Child
from ..engine.readiness import ReadinessWait
from ..engine.tick import FreezeWatch
from ..evidence.cgroups import MemoryCgroup
from ..evidence.memory import MemoryEvidence
from ..evidence.progresswatch import ProgressWatch
from ..evidence.stall import StallMonitor
from ..exits import EXIT_FAILURE
from ..text import Log
from . import verdict as v
from .hooks import OutputLife, OutputParser, ProgressReading, ReadsProgress, SettleHook
from .runtime import MachineEvidence
from .states import CameUp, CommandStarted, Event, Next, StartFailed, after_attempt, backoff_delay, within_window
from .verdict import Verdict

# An attempt "got further" (retry_while_progressing) when what the next attempt keeps of its download rose by this
# much at least (progresswatch.py's ``gained``: the complete files, with progress_path); without progress_path
# what its processes wrote counts, and a failure's own lines (a 404, a DNS error, aria2c's ERROR block: a few
# hundred bytes into a pipe) must not count as progress. Far below a parameter file.
GOT_FURTHER_MIN_BYTES = 64 << 10
# A child that could not be started for want of what starting it takes (its port check's socket): the status a
# shell reports for a command found but not run, as engine/spawn.py's SpawnError has it.
CANNOT_START = 126


class Settle:
    """An attempt's settle (hooks.py): its hook's watch, fed its daemons' output, and what it is said in."""

    def __init__(self, hook: SettleHook, timeout_s: float) -> None:
        self.hook, self.watch, self._timeout_s = hook, hook.new_watch(), timeout_s

    def pending(self) -> str | None:
        """What the daemons still do for the command, as the watch reads it; None: nothing."""
        said = self.watch.pending()
        return None if said is None else \
            f"waiting for {self.hook.what}: {said} (at most settle_timeout_s={self._timeout_s:g})"

    def read(self, lines: list[bytes]) -> str | None:
        """Feed the watch ``lines``: what is still pending after them."""
        self.watch.feed(lines)
        return self.pending()

    def cut_short(self) -> str:
        return f"{self.hook.what} cut short: {self.hook.cut_short}"


@dataclass
class Attempt:
    number: int  # 1, 2, ...; 0 before the first
    started: float  # monotonic (the phase's clock): when it began
    children: list[Child] = field(default_factory=list)  # in start order
    outcome: Verdict | None = None  # what ended it (or refused the next one: prepare, a deadline in backoff)
    command_verdict: Verdict | None = None  # its command's, as recorded when it was reaped
    up_at: float | None = None  # monotonic: when its service came up (command running, ready check passed)
    stop_over: bool = False  # its children are all stopped: what ended it decides what comes next
    broken: Verdict | None = None  # a bug of the supervisor's own failed it (internal_error)
    parser: OutputParser | None = None  # the reader of its command's output (the output hook's)
    settle: Settle | None = None  # the reader of its daemons' output (a phase with a settle hook)
    progress: ProgressWatch | None = None  # its progress figures (a phase with progress_total)
    start: AttemptStart | None = None  # its children being started in order (daemons, readiness, command)
    ended_for: tuple[str, str] | None = None  # the reason and detail the supervisor ended it for (MarkStopped)
    ended: float | None = None  # monotonic: when it was over (its outcome decided), before its children's stop

    def command(self, spec: ChildSpec) -> Child | None:
        """Its child started for ``spec`` (the phase's command), if started yet."""
        return next((c for c in self.children if c.spec is spec), None)

    def ran_for(self, now: float) -> float:
        """How long it ran: to its end, where it is over. Its children's stop is no part of it: a daemon killed
        after a long stop_grace_s must not make an attempt that failed at once look like one that ran well."""
        return (self.ended if self.ended is not None else now) - self.started

    def end(self, now: float) -> None:
        """It is over at ``now`` (the first end holds): no more of its children is started, and no readiness
        answer is heard any more."""
        self.ended = self.ended if self.ended is not None else now
        if self.start is not None:
            self.start.cancel()

    def mark_stopped_for(self, reason: str, detail: str) -> None:
        """The verdicts of its children about to be stopped say why (unless one already does)."""
        self.ended_for = self.ended_for or (reason, detail)
        for child in self.children:
            if child.stop_reason is None:
                child.stop_reason, child.stop_detail = reason, detail

    def outcome_to_come(self, phase: str, added: v.AddedReasons) -> Verdict | None:
        """Its outcome; where none is in yet, the one it will have: the supervisor ended it for a reason (a
        timeout, a stall) while its command ran, whose exit, still to come, says how it ended, that reason named
        (verdict.py's stopped_for). None: nothing ended it yet but, perhaps, a shutdown."""
        if self.outcome is not None or self.ended_for is None:
            return self.outcome
        reason, detail = self.ended_for
        if v.stopped_for(reason, added) == v.STOPPED:
            return None
        return v.without_exit(phase, phase, reason, 1, detail, attempt=self.number, added=added)

    def found_by_watch(self, outcome: Verdict) -> bool:
        """Whether a watch's finding ended it (a stall, NVML hung, a plugin's watch's reason): the supervisor
        ended it for that reason, and ``outcome`` says so (not the child's own failure before it; not a shutdown,
        a bug of ours or the phase deadline, none of them a watch's)."""
        return self.ended_for is not None and self.ended_for[0] == outcome.reason \
            and outcome.reason not in (v.STOPPED, v.TIMEOUT)

    def progress_reading(self) -> ProgressReading | None:
        """What its command's output parser read of the download (a result that ReadsProgress), if any."""
        result = self.parser.result if self.parser is not None else None
        return result.progress() if isinstance(result, ReadsProgress) else None

    def drain(self) -> None:
        """Read what its children already printed (output waiting in a pipe is a sign of life)."""
        for child in self.children:
            child.drain_output()

    def roots(self) -> list[tuple[int, str]]:
        """Its children's pids and tags: the trees whose I/O is its sign of life (iowatch.py)."""
        return [(c.pid, c.tag) for c in self.children]

    def last_outputs(self, command: ChildSpec | None = None) -> list[float]:
        """When each of its children last printed a sign of life (monotonic), those that ever did: any byte, but
        for ``command`` (its phase's) where its parser marks idle lines: its last read with a line not idle
        (hooks.OutputLife)."""
        life = self.parser if isinstance(self.parser, OutputLife) else None
        outputs = [life.life_at if life is not None and c.spec is command else c.output.last_output_at
                   for c in self.children]
        return [at for at in outputs if at]

    def idle_output(self) -> float | None:
        """When its command's output last said nothing moved (a read of idle lines alone; monotonic), where its
        parser marks idle lines: the status view and the verdict say it beside the output's silence."""
        return self.parser.idle_at if isinstance(self.parser, OutputLife) else None


class ItsLifecycle(Protocol):
    """What a phase reads of its lifecycle (lifecycle.py): whether it shuts down (then the shutdown ends it), and
    the daemons the phases before it kept (``lifetime = "lifecycle"``), alive, which its attempts' watches read."""

    shutting_down: bool

    def kept_before(self, phase: str) -> list[Child]: ...


class ItsPhase(Protocol):
    """What an attempt's watches tell its phase (lifecycle/phase.py's Phase)."""

    name: str
    spec: PhaseSpec  # (its command's output is read by the attempt's parser)

    # attempt ``attempt`` is the phase's, starting, running or settling
    def still_running(self, attempt: int) -> bool: ...

    def look_before_deciding(self) -> None: ...  # its children's output read, the clock looked at

    def stalled(self, silent: str) -> None: ...

    def too_slow(self, why: str) -> None: ...

    def fail_internally(self, what: str, exc: Exception) -> None: ...


class Watched:
    """One attempt as its watches see it (evidence/stall.py's StallingAttempt, evidence/progresswatch.py's
    DownloadingAttempt): its process trees and its phase's cgroup, its output and its parser's reading, whether it
    is still its phase's, and where what they find goes. One object in place of a bag of callables. ``lifecycle``:
    its phase's, which names the daemons kept for it (None: none); ``memory``: where its phase's cgroup is known."""

    def __init__(self, attempt: Attempt, phase: ItsPhase, lifecycle: ItsLifecycle | None = None,
                 memory: MemoryEvidence | None = None) -> None:
        self._attempt, self._phase, self._lifecycle, self._memory = attempt, phase, lifecycle, memory

    def roots(self) -> list[tuple[int, str]]:
        return self._attempt.roots()

    def cgroup(self) -> MemoryCgroup | None:
        """Its phase's own cgroup (per-phase mode; None: none): its processes are the attempt's, wherever they went."""
        return self._memory.own_cgroup(self._phase.name) if self._memory is not None else None

    def kept(self) -> list[Child]:
        """The daemons the phases before its phase kept, alive: what it may wait on (stall.py counts their work)."""
        return self._lifecycle.kept_before(self._phase.name) if self._lifecycle is not None else []

    def last_outputs(self) -> list[float]:
        return self._attempt.last_outputs(self._phase.spec.command)

    def idle_output(self) -> float | None:
        return self._attempt.idle_output()

    def reading(self) -> ProgressReading | None:
        return self._attempt.progress_reading()

    def drain(self) -> None:
        self._phase.look_before_deciding()

    def current(self) -> bool:
        return self._phase.still_running(self._attempt.number)

    def stalled(self, silent: str) -> None:
        # What the reaper saw of job control explains a silence the signs alone cannot: said in the verdict too.
        held = [f"{c.label} stopped by {c.job_stopped}" for c in self._attempt.children if c.running and c.job_stopped]
        self._phase.stalled(silent + (f"; {', '.join(held)} (job control: nothing runs until SIGCONT)" if held else ""))

    def too_slow(self, why: str) -> None:
        self._phase.too_slow(why)

    def fault(self, what: str, exc: Exception) -> None:
        self._phase.fail_internally(what, exc)


Guard = Callable[[str, Callable[..., object]], Callable[..., None]]  # (what, callback) → it, unable to raise


class AttemptStart:
    """``start`` starts one child (None: it could not, and said so: the attempt is over); ``tell`` is the phase's
    decision, told what the start learns; ``guarded`` makes a callback from a thread unable to raise; ``own``:
    the supervisor's children (runtime.py's ``started``), by whose labels a port's holder is named; ``freeze``:
    the supervisor's freeze watch, which a readiness wait asks before it fails (readiness.py)."""

    def __init__(self, spec: PhaseSpec, attempt: int, loop: EventLoop, log: Log, *,
                 start: Callable[[ChildSpec], Child | None], tell: Callable[[Event], None], guarded: Guard,
                 own: Iterable[Child] = (), freeze: FreezeWatch | None = None) -> None:
        self._spec, self._attempt, self._loop, self._log, self._freeze = spec, attempt, loop, log, freeze
        self._start, self._tell, self._guarded = start, tell, guarded
        self._own = own  # every child of the supervisor's not known to be over (a port's holder may be one)
        self._ready: ReadinessWait | None = None  # the wait under way, if any
        self._waiting: tuple[Child, float] | None = None  # the child waited for, and since when (monotonic)
        self._over = False

    def begin(self) -> None:
        self._daemon(0)

    @property
    def waiting(self) -> tuple[Child, float] | None:
        """The child whose readiness is being waited for, and since when (monotonic): for the status view."""
        return None if self._over else self._waiting

    def cancel(self) -> None:
        self._over = True
        if self._ready is not None:
            self._ready.cancel()

    def _daemon(self, index: int) -> None:
        """From daemon ``index`` on, each started in turn, in a loop (never a call per daemon: a phase of a
        thousand daemons is a thousand turns, not a thousand nested calls). A readiness wait ends the loop:
        its answer picks up at the next daemon; a port held by another ends the attempt."""
        while not self._over:  # over: a late readiness answer for an attempt that is already over
            if index == len(self._spec.daemons):
                self._command()
                return
            spec = self._spec.daemons[index]
            if not self._free(spec):
                return
            since = _before_start()
            child = self._start(spec)
            if child is None:
                return
            if spec.ready is not None:
                self._log(f"waiting for {spec.label} to be ready: {spec.ready.describe()} "
                          f"(at most {spec.ready_timeout_s:g}s)")
                self._wait_until_ready(child, since, partial(self._daemon_ready, child, index))
                return
            index += 1

    def _daemon_ready(self, child: Child, index: int) -> None:
        if not self._over:
            self._log(f"{child.label} is ready ({child.spec.ready.describe() if child.spec.ready else ''})")
            self._daemon(index + 1)

    def _command(self) -> None:
        if self._spec.kind != "service" or self._free(self._spec.command):
            self._start_command()

    def _start_command(self) -> None:
        since = _before_start()
        child = self._start(self._spec.command)
        if child is None:
            return
        self._tell(CommandStarted(child))
        if self._spec.kind != "service" or self._over:  # (over: a hearer of the start ended the attempt)
            return
        if self._spec.command.ready is None:
            self._tell(CameUp())
            return
        self._wait_until_ready(child, since, lambda: None if self._over else self._tell(CameUp()))

    def _free(self, spec: ChildSpec) -> bool:
        """Are the ports ``spec`` is to listen on free? If not, the attempt fails naming the holder (looked for
        in a thread; its answer ends the attempt). The bind test runs here (in-kernel, it cannot block)."""
        if self._over:
            return False
        try:
            taken = ports.taken(spec.ready)
        except ports.Unchecked as exc:  # (its daemon cannot be started either: failed as its start would be)
            self._tell(StartFailed(v.without_exit(self._spec.name, spec.name, v.SPAWN_FAILED, CANNOT_START,
                                                  f"{spec.label} not started: {exc}", attempt=self._attempt)))
            return False
        if taken is None:
            return True
        host, port = taken
        what = f"the port check of {spec.phase}/{spec.name}"
        answer = self._guarded(what, lambda holder, unknown: self._port_taken(spec, host, port, holder, unknown))
        ports.find_holder(self._loop, host, port, answer, [(c.label, c.pid, c.tag) for c in self._own if c.running])
        return False

    def _port_taken(self, spec: ChildSpec, host: str, port: int, holder: ports.Holder | None, unknown: str) -> None:
        if self._over:
            return
        detail = f"{spec.phase}/{spec.name} not started: {ports.taken_detail(host, port, holder, unknown)}"
        self._log(detail)
        self._tell(StartFailed(v.without_exit(self._spec.name, spec.name, v.PORT_IN_USE, EXIT_FAILURE, detail,
                                              attempt=self._attempt)))

    def _wait_until_ready(self, child: Child, since: float, on_ready: Callable[[], None]) -> None:
        assert child.spec.ready is not None
        what = f"the readiness wait of {child.label}"
        owner = None
        if ports.local_ports(child.spec.ready):
            def say(why: str) -> None:  # from the readiness thread
                self._loop.call_soon_threadsafe(lambda: None if self._over else self._log(f"{child.label}: {why}"))
            owner = ports.Ownership(child.pid, child.tag, say)
        self._waiting = (child, self._loop.clock.monotonic())

        def answered(then: Callable[..., None]) -> Callable[..., None]:
            def answer(*args: object) -> None:
                self._waiting = None
                then(*args)
            return answer

        self._ready = ReadinessWait(self._loop, child.spec.ready, child.spec.ready_timeout_s,
                                    on_ready=self._guarded(what, answered(on_ready)),
                                    on_timeout=self._guarded(what, answered(lambda why: self._not_ready(child, why))),
                                    owner=owner, since=since, freeze=self._freeze)

    def _not_ready(self, child: Child, why: str) -> None:
        """``why``: "not ready after Ns: …", or "could not be waited for: …" (ReadinessWait). The attempt's failure
        is this verdict: the child's stop that follows is its consequence (``stopped``, saying it), not a second
        failure (as a broken phase's children read)."""
        if self._over:
            return
        detail = f"{child.label} {why}"
        child.stop_reason, child.stop_detail = v.STOPPED, detail
        self._tell(StartFailed(v.without_exit(
            self._spec.name, child.spec.name, v.TIMEOUT, 1, detail, attempt=self._attempt,
            started_at=child.started_at, last_lines=child.output.last_lines(),
        )))


def _before_start() -> float:
    """The time a ready file must be newer than (readiness.py ``since``): the wall clock, not the loop's (it is
    held to the kernel's file stamps), read before the fork, since child.started_at is read after the exec and
    a daemon may write its file in between."""
    return time.time()


# ---------------------------------------------------------------- the pacing of a phase's attempts


class Pacing:
    """A phase's timers, on the loop's clock: its deadline, the backoff before its next attempt, the restarts
    counted against its restart_burst, and each attempt's stall and progress watches.

    The rules (pure functions in states.py): the n-th failure in a row waits ``backoff_delay(n)`` with
    ``backoff_jitter`` drawn from the runtime's random source; an attempt that ran ``backoff_reset_s`` or
    longer (to its end, not its children's stop: ``Attempt.ran_for``) starts the count again (0: never);
    ``restart_burst`` restarts of a service within ``restart_window_s`` fail it, and so do ``restart_burst``
    restarts in a row without it coming up once, or each ended by a watch's finding, however far apart;
    ``timeout_s`` counts from the first attempt across every later one; ``stall_s`` of silence of every sign of
    progress stalls an attempt (stall.py); a download that cannot make ``progress_deadline_s`` ends its attempt
    too_slow (progresswatch.py). Tests drive them with a fake clock (tests/test_pacing_rules.py,
    tests/test_phase_timing.py)."""

    def __init__(self, spec: PhaseSpec, loop: EventLoop, rng: random.Random) -> None:
        self._spec, self._loop, self._rng = spec, loop, rng
        self.consecutive_failures = 0
        self.restart_times: list[float] = []  # when the service was restarted (monotonic), for restart_burst
        self.forgiven = 0  # attempts that got further, not counted against retries (retry_while_progressing)
        self.never_up = 0  # a service's latest attempts in a row that never came up, against restart_burst
        self.found = 0  # and those a watch's finding ended (a stall, NVML hung, a plugin's watch), against it too
        self._deadline: Timer | None = None
        self._backoff: Timer | None = None
        self._settle: Timer | None = None
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

    def start_settle(self, over: Callback, on_error: ErrorHandler) -> None:
        """``settle_timeout_s`` from now (the command succeeded; its daemons are kept): ``over`` when it is up."""
        self._settle = self._loop.call_later(self._spec.settle_timeout_s, over, on_error=on_error)

    def cancel_settle(self) -> None:
        if self._settle is not None:
            self._settle.cancel()

    @property
    def settle_until(self) -> float | None:
        """When the settle's bound is up (monotonic), while the daemons are kept after the command: for the status."""
        return _due(self._settle)

    @property
    def backoff_until(self) -> float | None:
        """When the next attempt starts (monotonic), while a backoff runs: for the status view."""
        return _due(self._backoff)

    def deadline_expired(self) -> bool:
        return self._deadline is not None and self._deadline.when <= self.now()

    def fails_for_good(self, outcome: Verdict, attempt: Attempt) -> bool:
        """Would ``outcome`` fail the phase, no retry or restart after it? (``after``'s answer, nothing counted.)"""
        step, _ = after_attempt(self._spec, outcome, attempt.number, deadline_expired=self.deadline_expired(),
                                restart_times=self.restart_times, now=self.now(),
                                forgiven=self._forgiven_with(outcome, attempt), never_up=self._never_up_with(attempt),
                                found=self._found_with(outcome, attempt))
        return step is Next.FAIL

    def after(self, outcome: Verdict, attempt: Attempt) -> tuple[Next, str, float]:
        """What follows ``attempt``, which ``outcome`` ended, and why: done, failed for good, or another
        attempt after the backoff returned (0 for the others). A service's restart is counted now."""
        now = self.now()
        forgiven, never_up = self._forgiven_with(outcome, attempt), self._never_up_with(attempt)
        found = self._found_with(outcome, attempt)
        step, why = after_attempt(self._spec, outcome, attempt.number, deadline_expired=self.deadline_expired(),
                                  restart_times=self.restart_times, now=now, forgiven=forgiven, never_up=never_up,
                                  found=found)
        self.forgiven, self.never_up, self.found = forgiven, never_up, found
        if step is not Next.AGAIN:
            return step, why, 0.0
        if self._spec.kind != "oneshot":  # (what after_attempt restarts: every kind but a oneshot)
            self.restarted(now)
        return step, why, self.next_delay(attempt.ran_for(now))

    def _forgiven_with(self, outcome: Verdict, attempt: Attempt) -> int:
        """The attempts not counted against retries, ``attempt`` among them where it failed having got further
        (what the next one keeps of its download rose)."""
        got_further = (self._spec.retry_while_progressing and not outcome.success and attempt.progress is not None
                       and attempt.progress.gained() >= GOT_FURTHER_MIN_BYTES)
        return self.forgiven + int(got_further)

    def _never_up_with(self, attempt: Attempt) -> int:
        """The latest attempts in a row that never came up, ``attempt`` among them (one that came up: none)."""
        return 0 if attempt.up_at is not None else self.never_up + 1

    def _found_with(self, outcome: Verdict, attempt: Attempt) -> int:
        """The latest attempts in a row that a watch's finding ended, ``attempt`` among them where one did. How long
        each lived says nothing (a watch takes minutes to judge): only one that came up and ended otherwise (its
        own exit, a daemon's death: the window judges those) breaks the row; one that never came up neither breaks
        nor counts (``never_up`` counts it)."""
        if attempt.up_at is None:
            return self.found
        return self.found + 1 if attempt.found_by_watch(outcome) else 0

    def watch_for_stall(self, evidence: MachineEvidence, attempt: Watched) -> None:
        """For a phase with stall_s: ``attempt`` is told once it stalls, while it is current."""
        spec = self._spec
        if spec.stall_s is not None:
            self.stall = StallMonitor(self._loop, spec.stall_s, spec.progress_path, evidence, attempt)

    def watch_progress(self, evidence: MachineEvidence, attempt: Watched, log: Log) -> ProgressWatch | None:
        """For a phase with progress_total: the attempt's figures (progresswatch.py); ``attempt`` is told once it
        cannot make progress_deadline_s."""
        if self._spec.progress_total is None:
            return None
        return ProgressWatch(self._spec, self._loop, log, evidence, attempt)

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
        for timer in (self._deadline, self._backoff, self._settle):
            if timer is not None:
                timer.cancel()


def _due(timer: Timer | None) -> float | None:
    return timer.when if timer is not None and not timer.cancelled else None
