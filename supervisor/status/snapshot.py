"""The snapshot: everything the status view shows, built in the loop from the loop's own objects.

One ``Snapshot`` (model.py), the same for the status socket, status.json (file.py) and /metrics (health.py):
the lifecycle and the verdict that failed it, each phase (its timers: what each has left, counted from one
``now``, pure functions; its timeline; its own cgroup's
memory against its memory_max), the running children with their usage (psutil), last lines and stop
grace, the GPU thread's latest sample, the memory evidence, the manager reporting (with its ledger of
calls), the latest verdicts, the log files, and each phase's facts for resume. What it reads is named
by the protocols below and handed in as arguments, once, in a ``Snapshotter`` (the composition root fills
it): it imports nothing of the lifecycle but its words (states.py) and, for its types alone, the
verdict's; nothing of the runtime or the reporting, so that they can change without it (and no import
circle runs through the status view).

Children's lines need no masking here: their bytes were masked where they entered the supervisor
(redact.SecretStream), and a verdict's last lines are taken from those.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from ..engine.trees import Proc, own_pid_namespace, own_start_ticks
from ..lifecycle.states import ATTEMPT_RUNS, FINAL_STATES, PhaseState, Timeline
from ..state.files import STATUS_VERSION, SUPERVISOR_LOG, child_log_name
from ..text.ansi import plain
from ..text.show import summary
from .model import (
    ChildStatus,
    DeadlineTimer,
    DownloadProgress,
    Exiting,
    Failure,
    GpuLeftOut,
    GpuSampleStatus,
    GpuStatus,
    HungCallStatus,
    LeftTimer,
    LifecycleStatus,
    LogFiles,
    ManagerStatus,
    MemoryHigh,
    MemoryStatus,
    PhaseMemory,
    PhaseStatus,
    ReadyTimer,
    Snapshot,
    StallTimer,
    StopTimer,
    Timers,
    Usage,
    VerdictStatus,
    WatchStatus,
)

if TYPE_CHECKING:
    from ..config import PhaseSpec
    from ..evidence.gpuwatch import Gpus
    from ..evidence.memory import MemoryEvidence
    from ..lifecycle.verdict import Verdict

SNAPSHOT_VERSION = STATUS_VERSION  # 2: written beside resume.json (what that says: state/files.py)
# What a snapshot carries at most (and status.json with it): the latest verdicts (the lifecycle keeps
# a few per phase), and each output line cut to this many characters (a line may be 64 KiB).
SNAPSHOT_VERDICTS = 50
SNAPSHOT_LINE_CHARS = 500
# The last lines of each running child the snapshot shows.
CHILD_LINES = 10
# The last lines of the verdict that failed the lifecycle, shown first by ``status`` (colour codes stripped).
FAILURE_LINES = 10
# A GPU reading older than this is no longer shown as current (status, /metrics, a plugin's machine figures): the
# GPU thread samples every second while anything wants samples (health does, for the run; a GPU or stall watch),
# so ten missed in a row mean none is coming (NVML hung, the thread gone) or nothing wanted one for a while.
GPU_READING_CURRENT_S = 10.0


# What the snapshot reads of the live objects, as read-only views (properties: a frozen dataclass, a plain attribute
# and a narrower type all fit them; mypy holds the live objects to them).
class LogFileView(Protocol):
    def ours_from(self) -> int | None: ...  # where the child's bytes begin in its log file (engine/logs.py)


class OutputView(Protocol):
    @property
    def last_output_at(self) -> float: ...  # monotonic time of its last byte, 0 if none yet

    @property
    def file(self) -> LogFileView: ...

    def last_lines(self, n: int | None = None) -> list[str]: ...


class ChildView(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def running(self) -> bool: ...  # its leader is not reaped yet

    def tree(self) -> list[Proc]: ...

    @property
    def started_at(self) -> float: ...

    @property
    def stop_reason(self) -> str | None: ...

    @property
    def job_stopped(self) -> str | None: ...

    @property
    def output(self) -> OutputView: ...

    @property
    def grace_s(self) -> float: ...  # the grace its stop under way gives it: stop_grace_s, or less under a stop budget

    @property
    def kill_at(self) -> float | None: ...


class PhaseSource(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> PhaseSpec: ...

    @property
    def since(self) -> float: ...

    @property
    def why(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def up(self) -> bool: ...

    @property
    def facts(self) -> dict[str, Any]: ...

    @property
    def state(self) -> object: ...  # a PhaseState (a str enum): shown as its value

    @property
    def parsed(self) -> Any: ...  # what its output parser read

    @property
    def kept_as(self) -> str | None: ...  # the fact name parsed is kept under (its key in the phase object); None: none

    @property
    def timeline(self) -> Timeline: ...  # when it left pending, first came up, came up this time, ended (wall times)

    @property
    def progress(self) -> dict[str, Any] | None: ...  # done_bytes, total_bytes, rate_bytes_s, eta_s (transfer.py)

    @property
    def pacing(self) -> PacingView: ...

    @property
    def current_attempt(self) -> AttemptView: ...

    def live_children(self) -> Sequence[ChildView]: ...


class LifecycleView(Protocol):
    @property
    def phases(self) -> Sequence[PhaseSource]: ...

    @property
    def shutting_down(self) -> bool: ...

    @property
    def exit_status(self) -> int | None: ...

    @property
    def over(self) -> bool: ...

    @property
    def shutdown_reason(self) -> str: ...

    @property
    def failure(self) -> Verdict | None: ...

    def current(self) -> PhaseSource | None: ...

    def held(self, name: str) -> str | None: ...

    def hold_ends(self, name: str) -> float | None: ...


class WatchesView(Protocol):
    """Every watch's state (watchstate.Watches): reading, blind since when, stopped."""

    def to_dict(self, now: float | None = None) -> dict[str, Any]: ...


class FactsView(Protocol):
    """What the last run learnt of each phase (resume.ResumeRecord)."""

    def previous(self, name: str) -> dict[str, Any]: ...


# ---------------------------------------------------------------- the clocks of a phase and a child

class StallSignsView(Protocol):
    def last_sign(self) -> float: ...

    def ages(self, now: float) -> dict[str, float]: ...

    def idle_output_age(self, now: float) -> float | None: ...  # output since the last sign, that said nothing moved

    @property
    def unmeasured(self) -> Mapping[str, str]: ...  # a sign not read this look, and why


class StallView(Protocol):
    @property
    def signs(self) -> StallSignsView: ...


class PacingView(Protocol):
    @property
    def deadline_at(self) -> float | None: ...

    @property
    def backoff_until(self) -> float | None: ...

    @property
    def settle_until(self) -> float | None: ...

    @property
    def stall(self) -> StallView | None: ...


class ReadySpec(Protocol):
    @property
    def ready_timeout_s(self) -> float: ...


class WaitedChild(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def spec(self) -> ReadySpec: ...


class StartView(Protocol):
    @property
    def waiting(self) -> tuple[WaitedChild, float] | None: ...


class AttemptView(Protocol):
    @property
    def start(self) -> StartView | None: ...


class TimedSpec(Protocol):  # (read-only: a PhaseSpec is frozen)
    @property
    def timeout_s(self) -> float | None: ...

    @property
    def stall_s(self) -> float | None: ...

    @property
    def settle_timeout_s(self) -> float: ...


class TimedPhase(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def since(self) -> float: ...

    @property
    def up(self) -> bool: ...

    @property
    def spec(self) -> TimedSpec: ...

    @property
    def state(self) -> object: ...

    @property
    def pacing(self) -> PacingView: ...

    @property
    def current_attempt(self) -> AttemptView: ...


def _secs(value: float) -> float:
    return round(max(0.0, value), 1)


def phase_timers(phase: TimedPhase, hold_ends: float | None, now: float) -> Timers:
    """The timers running for ``phase`` at monotonic ``now``: ``deadline`` (timeout_s), ``backoff`` (to the
    next attempt), ``stall`` (silence so far against stall_s), ``ready`` (the readiness wait under way against
    its ready_timeout_s), ``settle`` (the daemons kept after the command, against settle_timeout_s), ``hold`` (the
    lifecycle held at it, the bench gate's time left). Only those running."""
    state, spec, pacing = phase.state, phase.spec, phase.pacing
    if state in FINAL_STATES and hold_ends is None:
        return Timers()
    deadline_at, backoff_until, stall = pacing.deadline_at, pacing.backoff_until, pacing.stall
    deadline = DeadlineTimer(limit_s=spec.timeout_s, left_s=_secs(deadline_at - now)) \
        if deadline_at is not None and spec.timeout_s is not None and state not in FINAL_STATES else None
    backoff = LeftTimer(left_s=_secs(backoff_until - now)) \
        if state is PhaseState.BACKOFF and backoff_until is not None else None
    stalled = None
    if state in ATTEMPT_RUNS and stall is not None and spec.stall_s is not None:
        silent, idle = now - stall.signs.last_sign(), stall.signs.idle_output_age(now)
        stalled = StallTimer(limit_s=spec.stall_s, silent_s=_secs(silent), left_s=_secs(spec.stall_s - silent),
                             signs={what: _secs(age) for what, age in stall.signs.ages(now).items()},
                             unmeasured=dict(stall.signs.unmeasured),
                             idle_output_s=None if idle is None else _secs(idle))
    start = phase.current_attempt.start
    waiting = start.waiting if start is not None and state in ATTEMPT_RUNS else None
    ready = None
    if waiting is not None:
        child, since = waiting
        limit = child.spec.ready_timeout_s
        ready = ReadyTimer(child=child.label, limit_s=limit, waited_s=_secs(now - since),
                           left_s=_secs(limit - (now - since)))
    settle_until = pacing.settle_until
    settle = DeadlineTimer(limit_s=spec.settle_timeout_s, left_s=_secs(settle_until - now)) \
        if state is PhaseState.SETTLING and settle_until is not None else None
    hold = LeftTimer(left_s=_secs(hold_ends - now)) if hold_ends is not None else None
    return Timers(deadline=deadline, backoff=backoff, stall=stalled, ready=ready, settle=settle, hold=hold)


class StoppedChild(Protocol):
    @property
    def kill_at(self) -> float | None: ...


def stop_timer(child: StoppedChild, grace_s: float, now: float) -> StopTimer | None:
    """A child being stopped: its grace (stop_grace_s, or what a stop budget left of it) and how long until SIGKILL;
    None when not in its grace."""
    kill_at = child.kill_at
    if kill_at is None:
        return None
    return StopTimer(grace_s=grace_s, kill_in_s=_secs(kill_at - now))


# ---------------------------------------------------------------- the snapshot


def snapshot(*, role: str, started_at: float, config: str, lifecycle: LifecycleView, gpus: Gpus | None,
             memory: MemoryEvidence | None, verdicts: Sequence[Verdict], manager: Mapping[str, Any],
             resume: FactsView, usage: bool = True, log_dir: str | None = None,
             extras: Mapping[str, Sequence[Callable[[], Mapping[str, Any]]]] | None = None,
             watches: WatchesView | None = None, exiting: Exiting | None = None,
             listening: bool | None = None) -> Snapshot:
    """Everything the status view shows (call it in the loop). ``manager``: the reporting's status;
    ``log_dir``: where the log files are; ``extras``: what
    a plugin adds to a phase's object (Wiring.add_status); ``watches``: each watch's own state; ``exiting``:
    the exit waiting for the manager, once the lifecycle is over; ``listening``: the status socket is made.

    ``usage=False`` (the persisted file) leaves out what costs time to measure: the
    children's CPU and RSS, and a GPU sample (NVML's first load takes milliseconds). ``extras``: per phase,
    what a plugin adds to its JSON object (wiring.Wiring.add_status)."""
    current = lifecycle.current()
    now = time.monotonic()  # the loop's clock in a run (SYSTEM_CLOCK), which every timer counts on
    children = tuple(_child(phase.name, child, usage, now)
                     for phase in lifecycle.phases for child in phase.live_children())
    return Snapshot(
        version=SNAPSHOT_VERSION, pid=os.getpid(), pid_ns=own_pid_namespace(), pid_start=own_start_ticks(),
        role=role, started_at=started_at, written_at=time.time(), config=config,
        lifecycle=LifecycleStatus(state=_lifecycle_state(lifecycle, current),
                                  why=lifecycle.shutdown_reason, exit_status=lifecycle.exit_status,
                                  current=current.name if current else None,
                                  failure=_failure(lifecycle.failure, log_dir)),
        phases=tuple(PhaseStatus(**_phase(p, lifecycle.held(p.name), resume),
                                 timers=phase_timers(p, lifecycle.hold_ends(p.name), now),
                                 memory=_phase_memory(p, memory), plugin={**_kept(p), **_extras(p.name, extras)})
                     for p in lifecycle.phases),
        children=children,
        gpus=_gpus(gpus, usage),
        watches={name: WatchStatus(**state) for name, state in watches.to_dict(now).items()}
        if watches is not None else {},
        memory=_memory(memory),
        logs=LogFiles(dir=log_dir, supervisor=str(Path(log_dir) / SUPERVISOR_LOG)) if log_dir else None,
        manager=ManagerStatus.from_json(manager),
        verdicts=tuple(VerdictStatus(line=x.line(), record={
            **x.to_dict(), "last_lines": [s[:SNAPSHOT_LINE_CHARS] for s in x.last_lines]})
            for x in verdicts[-SNAPSHOT_VERDICTS:]),
        exiting=exiting,
        listening=listening,
    )


class ExitFlushView(Protocol):
    """The exit waiting for the manager (engine/exitflush.py's ExitFlush)."""

    @property
    def giving_up(self) -> bool: ...

    def seconds_left(self) -> float: ...


class FlushHolder(Protocol):
    """Where the exit flush is, once the lifecycle is over (engine/signals.py's SignalRouter: None before)."""

    @property
    def flush(self) -> ExitFlushView | None: ...


class ReporterSource(Protocol):
    """The reporting (manager/reporting.py's Reporter): its status, what the manager was told."""

    def status(self) -> Mapping[str, Any]: ...


@dataclass
class Snapshotter:
    """Where the snapshot of this run is read from, named once (the composition root fills it: app/observers.py);
    called, it is a snapshot. The same for the status socket, status.json and /metrics."""

    role: str
    started_at: float
    config: str
    lifecycle: LifecycleView
    gpus: Gpus | None
    memory: MemoryEvidence | None
    verdicts: Sequence[Verdict]
    resume: FactsView
    watches: WatchesView | None = None
    manager: ReporterSource | None = None  # None: no manager to report to
    log_dir: str | None = None
    flush: FlushHolder | None = None
    listening: bool = False  # the status socket is made (app/observers.py sets it once it is)
    # What a plugin adds to each phase's object (add_status): filled through add_status only.
    _extras: dict[str, list[Callable[[], Mapping[str, Any]]]] = field(default_factory=dict, init=False, repr=False)

    def __call__(self, usage: bool = True) -> Snapshot:
        holder = self.flush.flush if self.flush is not None else None  # the exit waiting for the manager
        # (the run's exit status is the Lifecycle's, the one holder of it; the flush only waits with it)
        exiting = Exiting(status=self.lifecycle.exit_status, flush_left_s=round(holder.seconds_left(), 1),
                          giving_up=holder.giving_up) if holder is not None else None
        return snapshot(role=self.role, started_at=self.started_at, config=self.config, lifecycle=self.lifecycle,
                        gpus=self.gpus, memory=self.memory, verdicts=self.verdicts,
                        manager=self.manager.status() if self.manager is not None else {"enabled": False},
                        resume=self.resume, usage=usage, extras=self._extras, log_dir=self.log_dir,
                        watches=self.watches, exiting=exiting, listening=self.listening)

    def persisted(self) -> Snapshot:
        """What status.json holds: no usage (see ``snapshot``)."""
        return self(usage=False)

    def add_status(self, name: str, provider: Callable[[], Mapping[str, Any]]) -> None:
        """What a plugin adds to phase ``name``'s object (wiring.Wiring.add_status)."""
        self._extras.setdefault(name, []).append(provider)


def _lifecycle_state(lifecycle: LifecycleView, current: PhaseSource | None) -> str:
    """``stopped`` once the run is over (its stop done, every phase settled: the exit's own writes, after its sweep
    SIGKILLed what was left), so that what is still alive then outlived that SIGKILL, said in the log, and is told
    from what a supervisor killed before it got there left running (command.writer_fate)."""
    if lifecycle.over:
        return "stopped"
    if lifecycle.shutting_down:
        return "stopping"
    return "starting" if current is None else "running"


def _phase(p: PhaseSource, hold: str | None, resume: FactsView) -> dict[str, Any]:
    return {"name": p.name, "kind": p.spec.kind, "state": str(p.state), "since": p.since, "why": p.why,
            "attempt": p.attempt, "up": p.up, "hold": hold, **vars(p.timeline),
            "progress": DownloadProgress.from_json(p.progress) if p.progress else None,
            # A phase not reached in this run keeps what an earlier run learnt about it.
            "facts": p.facts or resume.previous(p.name)}


def _kept(p: PhaseSource) -> dict[str, Any]:
    """What its output parser read and keeps, under the fact's name the plugin gave it (shown flat beside the
    core's keys, as a plugin's own keys are)."""
    return {p.kept_as: vars(p.parsed) if p.parsed else None} if p.kept_as else {}


def _extras(phase: str, extras: Mapping[str, Sequence[Callable[[], Mapping[str, Any]]]] | None) -> dict[str, Any]:
    """What the plugin adds to a phase's object; a provider that raises costs its keys, never the snapshot."""
    added: dict[str, Any] = {}
    for provider in (extras or {}).get(phase, ()):
        try:
            added.update(provider())
        except Exception as exc:
            added["status_error"] = summary(exc)
    return added


def _child(phase: str, child: ChildView, usage: bool, now: float) -> ChildStatus:
    last = child.output.last_output_at
    # Its leader reaped, its stop waiting for what it left (a oneshot's exit that left its group running): its pid
    # is no process of it any more (another's, maybe, since), the pids left are.
    left = () if child.running else tuple(sorted(proc.pid for proc in child.tree()))
    return ChildStatus(
        label=child.label, pid=child.pid, phase=phase, state="stopping" if child.stop_reason else
        f"stopped by {child.job_stopped}" if child.job_stopped else "running",
        started_at=child.started_at, last_output_at=(time.time() - (now - last)) if last else None,
        usage=(tree_usage(child.pid) if child.running else pids_usage(left)) if usage else None,
        stop=stop_timer(child, child.grace_s, now),
        last_lines=tuple(shown_line(line) for line in child.output.last_lines(CHILD_LINES)),
        log_from=child.output.file.ours_from(), left=left)


def shown_line(line: str) -> str:
    """A line as a person reads it in ``status``: colour codes taken out (ansi.plain), cut to SNAPSHOT_LINE_CHARS."""
    return plain(line)[:SNAPSHOT_LINE_CHARS]


def _failure(failure: Verdict | None, log_dir: str | None) -> Failure | None:
    """The verdict that failed the lifecycle, for ``status`` to lead with, and the log file that has the rest."""
    if failure is None:
        return None
    # A failure no child printed (the fitness check's refusal, a preflight's) has no log file of its own.
    log_file = Path(log_dir) / child_log_name(failure.phase, failure.child) if log_dir else None
    return Failure(phase=failure.phase, child=failure.child, reason=failure.reason, detail=failure.detail,
                   status=failure.status, exit_code=failure.exit_code, signal=failure.signal, at=failure.ended_at,
                   line=failure.line(), last_lines=tuple(shown_line(s) for s in failure.last_lines[-FAILURE_LINES:]),
                   log_file=str(log_file) if log_file is not None and log_file.exists() else None)


def _phase_memory(p: PhaseSource, memory: MemoryEvidence | None) -> PhaseMemory | None:
    """The phase's own cgroup (while it has one): usage and peak against its limit, which memory_max set."""
    memory_max = p.spec.memory_max
    mem_snap = memory.phase_snapshot(p.name) if memory is not None else None
    if mem_snap is None:
        return None if memory_max is None else PhaseMemory(memory_max=memory_max, cgroup=False)
    return PhaseMemory(memory_max=memory_max, cgroup=True, usage=mem_snap.usage, peak=mem_snap.peak,
                       limit=mem_snap.limit, oom_kills=mem_snap.oom_kills)


def _gpus(gpus: Gpus | None, usage: bool) -> GpuStatus:
    """The GPU thread's latest sample (a request keeps samples coming for a while): never NVML itself."""
    if gpus is None:
        return GpuStatus(available=False, why="not probed", samples=(), unresponsive=None, slow_calls=0)
    if usage:
        gpus.want_for()
    return gpu_status(gpus, samples=usage)


def gpu_status(gpus: Gpus, *, samples: bool = True) -> GpuStatus:
    """What the GPU thread last published (with ``samples``, each GPU's figures, their age, and whether they are
    still current), read once: never NVML itself."""
    now = time.monotonic()
    hung = gpus.unresponsive(now)
    reading = gpus.latest() if samples else None
    age = now - reading.at if reading is not None else None
    return GpuStatus(available=gpus.available, why=gpus.why,
                     samples=tuple(GpuSampleStatus(**vars(s)) for s in reading.samples) if reading else (),
                     left_out=tuple(GpuLeftOut(index, why) for index, why in reading.left_out) if reading else (),
                     unresponsive=HungCallStatus.from_json(hung.to_dict(now)) if hung is not None else None,
                     slow_calls=gpus.slow_calls, sampled_s_ago=round(age, 1) if age is not None else None,
                     samples_stale=age is not None and not reading_current(age, hung is not None))


def reading_current(age_s: float, hung: bool) -> bool:
    """Whether a GPU reading ``age_s`` old still stands for the GPUs now: none is once an NVML call hangs (the
    thread that samples is stuck in it) or past GPU_READING_CURRENT_S (samples stopped coming)."""
    return not hung and age_s <= GPU_READING_CURRENT_S


def _memory(memory: MemoryEvidence | None) -> MemoryStatus:
    if memory is None:
        return MemoryStatus(mode="unavailable", why="")
    mem_snap = memory.container_snapshot()
    return MemoryStatus(mode=memory.mode, why=memory.why, snapshot=mem_snap.describe() if mem_snap else None,
                        usage=mem_snap.usage if mem_snap else None, limit=mem_snap.limit if mem_snap else None,
                        peak=mem_snap.peak if mem_snap else None,
                        oom_kills=mem_snap.oom_kills if mem_snap else None,
                        # Each phase's last memory_high (memwatch.py): when, how full, the line said.
                        warnings={phase: MemoryHigh(at=w.at, fraction=round(w.fraction, 3), limit=w.limit,
                                                    line=w.line) for phase, w in memory.warned.items()})


def tree_usage(pid: int) -> Usage:
    """CPU seconds and RSS of a process and its descendants (psutil)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return Usage(processes=0, cpu_s=None, rss=None)
    return _usage(procs)


def pids_usage(pids: Sequence[int]) -> Usage:
    """CPU seconds and RSS of these processes (a child's tree as read already), those still there."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    return _usage(procs)


def _usage(procs: list[psutil.Process]) -> Usage:
    cpu = rss = 0.0
    count = 0
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                rss += proc.memory_info().rss
                count += 1
        except psutil.Error:
            continue
    return Usage(processes=count, cpu_s=round(cpu, 2), rss=int(rss))
