"""The snapshot: everything the status view shows, built in the loop from the loop's own objects.

One ``Snapshot`` (model.py), the same for the status socket, status.json (file.py) and /metrics (health.py):
the lifecycle and the verdict that failed it, each phase (its timers, its timeline, its own cgroup's
memory against its memory_max), the running children with their usage (psutil), last lines and stop
grace, the GPU thread's latest sample, the memory evidence, the manager reporting (with its ledger of
calls), the latest verdicts, the log files, and each phase's facts for resume. What it reads is named
by the protocols below (and timers.py's) and handed in as arguments: it imports nothing of the
lifecycle, the runtime or the reporting, so that they can change without it (and no import circle
runs through the status view).

Children's lines need no masking here: their bytes were masked where they entered the supervisor
(redact.SecretStream), and a verdict's last lines are taken from those.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from ..state.files import SUPERVISOR_LOG, child_log_name
from ..text.ansi import plain
from .model import (
    ChildStatus,
    DownloadProgress,
    Exiting,
    Failure,
    GpuSampleStatus,
    GpuStatus,
    HungCallStatus,
    LifecycleStatus,
    LogFiles,
    ManagerStatus,
    MemoryHigh,
    MemoryStatus,
    PhaseMemory,
    PhaseStatus,
    Snapshot,
    Usage,
    VerdictStatus,
    WatchStatus,
)
from .timers import AttemptView, PacingView, Timeline, phase_timers, stop_timer

if TYPE_CHECKING:
    from ..config import PhaseSpec
    from ..evidence.gpuwatch import Gpus
    from ..evidence.memory import MemoryEvidence
    from ..lifecycle.verdict import Verdict

SNAPSHOT_VERSION = 1
# What a snapshot carries at most (and status.json with it): the latest verdicts (the lifecycle keeps
# a few per phase), and each output line cut to this many characters (a line may be 64 KiB).
SNAPSHOT_VERDICTS = 50
SNAPSHOT_LINE_CHARS = 500
# The last lines of each running child the snapshot shows.
CHILD_LINES = 10
# The last lines of the verdict that failed the lifecycle, shown first by ``status`` (colour codes stripped).
FAILURE_LINES = 10


class OutputView(Protocol):
    last_output_at: float  # monotonic time of its last byte, 0 if none yet

    def last_lines(self, n: int | None = None) -> list[str]: ...


class ChildView(Protocol):
    label: str
    pid: int
    started_at: float
    stop_reason: str | None
    output: OutputView
    grace_s: float  # the grace its stop under way gives it: stop_grace_s, or less under a stop budget

    @property
    def kill_at(self) -> float | None: ...


class PhaseView(Protocol):
    name: str
    spec: PhaseSpec
    since: float
    why: str
    attempt: int
    up: bool
    facts: dict[str, Any]

    @property
    def state(self) -> object: ...  # a PhaseState (a str enum): shown as its value

    parsed: Any  # what its output parser read
    kept_as: str | None  # the fact name parsed is kept under (its key in the phase's object); None: not kept

    @property
    def progress(self) -> dict[str, Any] | None: ...  # done_bytes, total_bytes, rate_bytes_s, eta_s (transfer.py)
    def pacing(self) -> PacingView: ...

    @property
    def current_attempt(self) -> AttemptView: ...

    def live_children(self) -> Sequence[ChildView]: ...


class LifecycleView(Protocol):
    phases: Sequence[PhaseView]
    shutting_down: bool
    exit_status: int | None
    shutdown_reason: str
    failure: Verdict | None

    def current(self) -> PhaseView | None: ...

    def held(self, name: str) -> str | None: ...

    def hold_ends(self, name: str) -> float | None: ...


class WatchesView(Protocol):
    """Every watch's state (watchstate.Watches): reading, blind since when, stopped."""

    def to_dict(self, now: float | None = None) -> dict[str, Any]: ...


class FactsView(Protocol):
    """What the last run learnt of each phase (resume.ResumeRecord)."""

    def previous(self, name: str) -> dict[str, Any]: ...


def snapshot(*, role: str, started_at: float, config: str, lifecycle: LifecycleView, gpus: Gpus | None,
             memory: MemoryEvidence | None, verdicts: Sequence[Verdict], manager: Mapping[str, Any],
             resume: FactsView, usage: bool = True, timeline: Timeline | None = None,
             log_dir: str | None = None,
             extras: Mapping[str, Sequence[Callable[[], Mapping[str, Any]]]] | None = None,
             watches: WatchesView | None = None, exiting: Exiting | None = None) -> Snapshot:
    """Everything the status view shows (call it in the loop). ``manager``: the reporting's status;
    ``timeline``: when each phase started and ended; ``log_dir``: where the log files are; ``extras``: what
    a plugin adds to a phase's object (Wiring.add_status); ``watches``: each watch's own state; ``exiting``:
    the exit waiting for the manager, once the lifecycle is over.

    ``usage=False`` (the persisted file) leaves out what costs time to measure: the
    children's CPU and RSS, and a GPU sample (NVML's first load takes milliseconds). ``extras``: per phase,
    what a plugin adds to its JSON object (wiring.Wiring.add_status)."""
    current = lifecycle.current()
    now = time.monotonic()  # the loop's clock: every timer is counted from it
    children = tuple(_child(phase.name, child, usage, now)
                     for phase in lifecycle.phases for child in phase.live_children())
    timeline = timeline or Timeline()
    return Snapshot(
        version=SNAPSHOT_VERSION, pid=os.getpid(), role=role, started_at=started_at, written_at=time.time(),
        config=config,
        lifecycle=LifecycleStatus(state=_lifecycle_state(lifecycle, current, bool(children)),
                                  why=lifecycle.shutdown_reason, exit_status=lifecycle.exit_status,
                                  current=current.name if current else None,
                                  failure=_failure(lifecycle.failure, log_dir)),
        phases=tuple(PhaseStatus(**_phase(p, lifecycle.held(p.name), resume), **timeline.of(p.name),
                                 timers=phase_timers(p, lifecycle.hold_ends(p.name), now),
                                 memory=_phase_memory(p, memory), plugin={**_kept(p), **_extras(p.name, extras)})
                     for p in lifecycle.phases),
        children=children,
        gpus=_gpus(gpus, usage),
        watches={name: WatchStatus.from_json(state) for name, state in watches.to_dict(now).items()}
        if watches is not None else {},
        memory=_memory(memory),
        logs=LogFiles(dir=log_dir, supervisor=str(Path(log_dir) / SUPERVISOR_LOG)) if log_dir else None,
        manager=ManagerStatus.from_json(manager),
        verdicts=tuple(VerdictStatus(line=x.line(), record={
            **x.to_dict(), "last_lines": [s[:SNAPSHOT_LINE_CHARS] for s in x.last_lines]})
            for x in verdicts[-SNAPSHOT_VERDICTS:]),
        exiting=exiting,
    )


def _lifecycle_state(lifecycle: LifecycleView, current: PhaseView | None, children_left: bool) -> str:
    if lifecycle.shutting_down:
        return "stopping" if lifecycle.exit_status is None or children_left else "stopped"
    return "starting" if current is None else "running"


def _phase(p: PhaseView, hold: str | None, resume: FactsView) -> dict[str, Any]:
    return {"name": p.name, "kind": p.spec.kind, "state": str(p.state), "since": p.since, "why": p.why,
            "attempt": p.attempt, "up": p.up, "hold": hold,
            "progress": DownloadProgress.from_json(p.progress) if p.progress else None,
            # A phase not reached in this run keeps what an earlier run learnt about it.
            "facts": p.facts or resume.previous(p.name)}


def _kept(p: PhaseView) -> dict[str, Any]:
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
            added["status_error"] = f"{type(exc).__name__}: {exc}"
    return added


def _child(phase: str, child: ChildView, usage: bool, now: float) -> ChildStatus:
    last = child.output.last_output_at
    return ChildStatus(
        label=child.label, pid=child.pid, phase=phase, state="stopping" if child.stop_reason else "running",
        started_at=child.started_at, last_output_at=(time.time() - (now - last)) if last else None,
        usage=tree_usage(child.pid) if usage else None, stop=stop_timer(child, child.grace_s, now),
        last_lines=tuple(line[:SNAPSHOT_LINE_CHARS] for line in child.output.last_lines(CHILD_LINES)))


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


def _phase_memory(p: PhaseView, memory: MemoryEvidence | None) -> PhaseMemory | None:
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
    hung = gpus.unresponsive()
    return GpuStatus(available=gpus.available, why=gpus.why, samples=gpu_samples(gpus) if usage else (),
                     unresponsive=HungCallStatus.from_json(hung.to_dict(time.monotonic())) if hung is not None
                     else None,
                     slow_calls=gpus.slow_calls)


def gpu_samples(gpus: Gpus | None) -> tuple[GpuSampleStatus, ...]:
    """The GPU thread's latest sample of every GPU, as the status shows it (never NVML itself)."""
    return tuple(GpuSampleStatus(**vars(s)) for s in gpus.samples()) if gpus is not None else ()


def _memory(memory: MemoryEvidence | None) -> MemoryStatus:
    if memory is None:
        return MemoryStatus(mode="unavailable", why="")
    mem_snap = memory.shared.snapshot() if memory.shared is not None else None
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
