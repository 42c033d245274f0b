"""Why a child ended: one structured record per ended child.

The reason is decided from evidence: the wait status from the reaper and what
the supervisor itself did to the child (stopped it for a timeout, for a
shutdown, because its phase was over). Exit 137 alone never means OOM.

``VerdictRecord`` is where every verdict enters the supervisor's records: masked once, kept (the latest few
per phase), said, and heard by the lifecycle's observers.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol, overload

from ..engine.logs import Unshipped
from ..engine.process import Child
from ..engine.reaping import ExitStatus
from ..engine.signals import signal_name
from ..evidence.memory import MemoryEvidence, MemoryReport
from ..exits import EXIT_FAILURE, EXIT_TIMEOUT
from ..text import Log
from ..text.show import fmt_bytes, logged

# Reasons a child ended. Success is reason "exit_code" with exit_code 0.
EXIT_CODE = "exit_code"
SIGNAL = "signal"
OOM_KILLED = "oom_killed"
TIMEOUT = "timeout"
STALLED = "stalled"
SPAWN_FAILED = "spawn_failed"
PORT_IN_USE = "port_in_use"  # a daemon's ready port was already held by another process: it was not started
DAEMON_DIED = "daemon_died"
INSUFFICIENT_MEMORY = "insufficient_memory"
INSUFFICIENT_DISK = "insufficient_disk"  # fitness: too little free space for the parameters, PCE or state
GPU_UNAVAILABLE = "gpu_unavailable"  # fitness: no NVML, a GPU missing, unreachable or taken by another process
GPU_UNRESPONSIVE = "gpu_unresponsive"  # NVML did not answer within its bound (Xid 119, a crashed driver)
TOO_SLOW = "too_slow"  # it can no longer finish in time: a download past its deadline, a bench below min_rate
GPU_FAULT = "gpu_fault"  # a fatal Xid, a GPU lost or NVML gone ("Unknown Error"): the machine needs replacing
STOPPED = "stopped"  # the supervisor ended it on purpose (phase over, shutdown)
INTERNAL_ERROR = "internal_error"  # a bug of the supervisor's own while handling the phase (never the child's)

REASONS = (EXIT_CODE, SIGNAL, OOM_KILLED, TIMEOUT, STALLED, SPAWN_FAILED, PORT_IN_USE, DAEMON_DIED, INSUFFICIENT_MEMORY,
           INSUFFICIENT_DISK, GPU_UNAVAILABLE, GPU_UNRESPONSIVE, GPU_FAULT, TOO_SLOW, STOPPED, INTERNAL_ERROR)
# The reasons a plugin adds (plugin.py ``Plugin.reasons``: its output parser's failure, its watch's finding), each
# with the status a failure for it exits with: reason → status. Handed to the verdict's makers by the Runtime.
AddedReasons = Mapping[str, int]
NO_REASONS_ADDED: AddedReasons = MappingProxyType({})
# An attempt that ended for one of these is never retried or restarted: a bug of ours (retrying would only
# hide it), a GPU that is gone (no attempt on this machine can succeed), a download or bench that cannot
# make it in time (another attempt runs on the same link and GPUs, against the same clock).
FOR_GOOD = (INTERNAL_ERROR, GPU_FAULT, TOO_SLOW)
LAST_LINES = 20
# What the supervisor decided was over for time: the run exits EXIT_TIMEOUT (124) as timeout(1) does,
# whatever the child did on the stop signal. A download or bench too slow to make it is one of these.
TIMED_OUT = (TIMEOUT, STALLED, TOO_SLOW)
# What a watcher of the supervisor's found (a GPU gone, NVML that no longer answers; a plugin's watch registers its
# own findings with EXIT_FAILURE): EXIT_FAILURE, not the child's own answer to being stopped for it.
FOUND_BY_WATCHERS = (GPU_FAULT, GPU_UNRESPONSIVE)


@dataclass(frozen=True)
class Verdict:
    phase: str
    child: str
    pid: int | None
    reason: str
    success: bool
    status: int  # what the supervisor exits with if this verdict fails the lifecycle
    detail: str
    attempt: int = 1
    started_at: float | None = None
    ended_at: float = field(default_factory=time.time)
    exit_code: int | None = None
    signal: str | None = None
    core_dumped: bool = False
    oom_kills: int | None = None  # OOM kills in its cgroup during its life; None: unknown
    memory_peak: int | None = None  # bytes, the peak of its cgroup
    memory_scope: str = "none"  # "phase" (its own cgroup), "shared" (the supervisor's), "none"
    last_lines: tuple[str, ...] = ()

    def line(self) -> str:
        """One log line with the reason and the key numbers."""
        parts = [f"phase={self.phase}", f"child={self.child}"]
        if self.pid is not None:
            parts.append(f"pid={self.pid}")
        parts.append(f"reason={self.reason}")
        if self.exit_code is not None:
            parts.append(f"exit_code={self.exit_code}")
        if self.signal is not None:
            parts.append(f"signal={self.signal}")
        if self.core_dumped:
            parts.append("core_dumped=yes")
        if self.oom_kills:
            parts.append(f"oom_kills={self.oom_kills}")
        elif self.oom_kills is None and self.signal == "SIGKILL":
            parts.append("oom=unknown")
        if self.memory_peak is not None:
            parts.append(f"peak={fmt_bytes(self.memory_peak)}({self.memory_scope})")
        if self.started_at is not None:
            parts.append(f"ran={self.ended_at - self.started_at:.1f}s")
        parts.append(f"attempt={self.attempt}")
        if self.detail:
            parts.append(f"detail={logged(self.detail)}")
        return " ".join(parts)

    def masked(self, mask: Callable[[str], str]) -> Verdict:
        """The verdict with the supervisor's words in it masked (its last lines were, where they were read)."""
        return replace(self, phase=mask(self.phase), child=mask(self.child), detail=mask(self.detail))

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["last_lines"] = list(self.last_lines)
        return record


_NONE_FORWARDED: Mapping[int, float] = MappingProxyType({})  # (from_exit's default: none forwarded)


def from_exit(phase: str, child: str, pid: int, status: ExitStatus, *, stop_reason: str | None,
              daemon: bool, attempt: int, started_at: float, last_lines: list[str],
              memory: MemoryReport | None = None, stop_detail: str = "", victims: tuple[str, ...] = (),
              sigkilled: bool = False, forwarded: Mapping[int, float] = _NONE_FORWARDED,
              added: AddedReasons = NO_REASONS_ADDED) -> Verdict:
    """Decide why a reaped child ended, from its wait status, what we did, and the OOM counter.

    ``victims``: the OOM kills in its cgroup during its life that are already known (its siblings'
    own ``oom_killed`` verdicts), named rather than guessed at: a SIGKILL they account for is not this
    child's OOM kill. ``sigkilled``: the supervisor sent it SIGKILL (the grace of a stop ran out).
    ``forwarded``: the signals from outside the supervisor forwarded to it, each with how long before its end
    (a SIGHUP it did not handle, or a wrapper's exit 128+n on one). ``added``:
    the plugin's reasons (a stop for one of them keeps it, as for the core's).
    """
    success = status.success
    oom = memory.oom_kills if memory is not None else None
    scope = memory.scope if memory is not None else "none"
    # SIGKILL while the cgroup's oom_kill counter rose by more than the kills already known, and not ours: the
    # kernel's OOM killer, not a person (during a stop's grace too: what it did on the way out was cut by it).
    oom_killed = status.signal == signal.SIGKILL and oom is not None and oom > len(victims) and not sigkilled
    if stop_reason is not None and not oom_killed:
        # We asked it to end: what it did on the way out is not its failure.
        reason = stopped_for(stop_reason, added)
        success = reason == STOPPED
        if sigkilled and status.signal == signal.SIGKILL:
            # Whose SIGKILL it was: a daemon that never ends on its stop signal (cuzk-daemon serves on after
            # SIGINT) ends so at every phase's end, and "killed by SIGKILL" alone would leave the kernel's open.
            detail = f"{stop_detail or stop_reason}; killed by the supervisor's SIGKILL (status {status.shell_status})"
        else:
            detail = f"{stop_detail or stop_reason}; {status.describe()} after the supervisor stopped it"
    elif oom_killed:
        reason, success = OOM_KILLED, False
        detail = (f"{'daemon ' if daemon else ''}killed by the OOM killer: SIGKILL while oom_kill rose by "
                  f"{oom} in its {scope} cgroup")
        if stop_reason is not None:
            detail += f", while the supervisor was stopping it ({stop_detail or stop_reason})"
    elif daemon:
        reason, success = DAEMON_DIED, False
        detail = f"daemon {status.describe()} while its phase needed it"
    elif status.signal is not None:
        reason, detail = SIGNAL, status.describe() + _forwarded_before(status.signal, forwarded)
    else:
        reason, detail = EXIT_CODE, status.describe()
        if status.code is not None and status.code > 128:  # (a shell's, a wrapper's answer to signal code-128)
            detail += _forwarded_before(status.code - 128, forwarded)
    if oom and reason != OOM_KILLED and len(victims) >= oom:
        detail += f"; {oom} OOM kill(s) in its {scope} cgroup during its life, of {', '.join(victims)}"
    elif oom and reason != OOM_KILLED:
        detail += (f"; {oom} OOM kill(s) in its {scope} cgroup during its life (the victim was another process "
                   "there: one of its descendants, or a daemon or sibling sharing the cgroup)")
    failed_status = failure_status(reason, status.shell_status or 1, added)  # a failure never exits 0
    return Verdict(
        phase=phase, child=child, pid=pid, reason=reason, success=success,
        status=0 if success else failed_status, detail=detail, attempt=attempt,
        started_at=started_at, exit_code=status.code, signal=status.signal_name,
        core_dumped=status.core_dumped, last_lines=tuple(last_lines[-LAST_LINES:]),
        oom_kills=oom, memory_peak=memory.peak if memory is not None else None, memory_scope=scope,
    )


def without_exit(phase: str, child: str, reason: str, status: int, detail: str, *, attempt: int,
                 pid: int | None = None, started_at: float | None = None,
                 last_lines: list[str] | None = None, added: AddedReasons = NO_REASONS_ADDED) -> Verdict:
    """A failure decided without a wait status: spawn failed, deadline in backoff, not ready."""
    return Verdict(
        phase=phase, child=child, pid=pid, reason=reason, success=False, status=failure_status(reason, status, added),
        detail=detail, attempt=attempt, started_at=started_at, last_lines=tuple((last_lines or [])[-LAST_LINES:]),
    )


def stopped_for(stop_reason: str | None, added: AddedReasons) -> str:
    """The reason of a child the supervisor stopped: the stop's own where it is a reason (a GPU fault, a stall, the
    plugin's), else ``stopped`` (a shutdown, its phase's end)."""
    return stop_reason if stop_reason is not None and (stop_reason in REASONS or stop_reason in added) else STOPPED


def never_reaped(child: Child, *, phase: str, attempt: int, added: AddedReasons = NO_REASONS_ADDED) -> Verdict:
    """``child`` was stopped and outlived its SIGKILL past the wait (uninterruptible sleep: a GPU fault, a hung
    mount), so no exit says how it ended: the stop's own why does (a GPU fault stays a GPU fault). No pid:
    the verdict is the supervisor's finding, recorded as the attempt's outcome (an exit never recorded it)."""
    reason = stopped_for(child.stop_reason, added)
    detail = f"{child.stop_detail or reason}; pid {child.pid} outlived SIGKILL and was never reaped"
    return without_exit(phase, child.spec.name, reason, 1, detail, attempt=attempt, started_at=child.started_at,
                        last_lines=child.output.last_lines(), added=added)


def _forwarded_before(signum: int, forwarded: Mapping[int, float]) -> str:
    """", 0.2s after a SIGHUP from outside was forwarded to it": the fact, not a cause (a person may have sent the
    same signal to the child since)."""
    if signum not in forwarded:
        return ""
    return f", {max(0.0, forwarded[signum]):.1f}s after a {signal_name(signum)} from outside was forwarded to it"


def failure_status(reason: str, status: int, added: AddedReasons = NO_REASONS_ADDED) -> int:
    """What a failure of ``reason`` exits with: a deadline, a stall or too_slow gives EXIT_TIMEOUT (as
    timeout(1)), a watcher's finding EXIT_FAILURE, a plugin's reason the status it registered (``added``),
    anything else the status it carries."""
    if reason in TIMED_OUT:
        return EXIT_TIMEOUT
    if reason in FOUND_BY_WATCHERS:
        return EXIT_FAILURE
    return added.get(reason, status)


def exit_verdict(child: Child, status: ExitStatus, *, phase: str, attempt: int, daemon: bool,
                 memory: MemoryEvidence | None, earlier: Iterable[Verdict],
                 added: AddedReasons = NO_REASONS_ADDED) -> Verdict:
    """``child`` of ``phase`` was reaped: its last output read, its log closed, how it ended judged.
    ``earlier``: the verdicts recorded so far (its siblings' OOM kills are named from them); ``added``: the
    plugin's reasons."""
    child.exited(status)
    child.drain_output()
    if not child.output_open:
        child.output.file.close()
    report = memory.report(child.placement) if memory and child.placement else None
    verdict = from_exit(
        phase, child.spec.name, child.pid, status, stop_reason=child.stop_reason,
        daemon=daemon, attempt=attempt, started_at=child.started_at,
        last_lines=child.output.last_lines(begun=True), memory=report, stop_detail=child.stop_detail,
        sigkilled=child.sigkilled, forwarded={sig: (child.ended_at or at) - at for sig, at in child.forwarded.items()},
        victims=tuple(f"{x.child} (pid {x.pid})" for x in earlier if x.phase == phase
                      and x.reason == OOM_KILLED and x.pid != child.pid and x.ended_at >= child.started_at),
        added=added,
    )
    warned = memory.warned.get(phase) if memory is not None else None
    # Only a warning the memory gave before the kill: a tick between the kill and the reap reads the cgroup at
    # 100% still, and its memory_high came after the kill was seen.
    where = child.placement.cgroup if child.placement is not None else None
    killed_at = memory.kill_seen_at.get(where.path, math.inf) if memory is not None and where is not None else math.inf
    if verdict.reason == OOM_KILLED and warned is not None and child.started_at <= warned.at < killed_at:
        verdict = replace(verdict, detail=f"{verdict.detail}; {warned.note()}")
    return verdict


# ---------------------------------------------------------------- the record

# Verdicts kept per phase in VerdictRecord (the status view, status.json and lookups by pid).
VERDICTS_KEPT_PER_PHASE = 20


class HearsVerdicts(Protocol):
    """Who hears each verdict recorded: the Lifecycle's Observers (lifecycle.py)."""

    def verdict(self, verdict: Verdict) -> None: ...


class VerdictRecord(Sequence[Verdict]):
    """Every verdict recorded (the latest few per phase), oldest first; ``observers`` hear of each.

    This is where a verdict enters the supervisor's records, so it is masked here, once (redact.py): the
    log, the status view and status.json, the reporting, a plugin's give-up reason and the termination
    log all read the masked record, never the verdict as it was made."""

    def __init__(self, log: Log, mask: Callable[[str], str] | None = None,
                 observers: HearsVerdicts | None = None) -> None:
        self.log, self._mask = log, mask
        self.verdicts: list[Verdict] = []
        self.observers = observers  # who hears each verdict: the Lifecycle's Observers (None: nobody yet)

    @overload
    def __getitem__(self, index: int) -> Verdict: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Verdict]: ...

    def __getitem__(self, index: int | slice) -> Verdict | Sequence[Verdict]:
        return self.verdicts[index]

    def __len__(self) -> int:
        return len(self.verdicts)

    def __iter__(self) -> Iterator[Verdict]:
        return iter(self.verdicts)  # the list's own iterator, not Sequence's one __getitem__ call per verdict

    def record(self, verdict: Verdict) -> Verdict:
        """Keep ``verdict`` masked, say it, tell the observers; the masked record is what callers keep."""
        if self._mask is not None:
            verdict = verdict.masked(self._mask)
        self.verdicts.append(verdict)
        # The latest few per phase: a service restarting in a loop must not grow memory (and
        # status.json) without end; a lookup by pid only ever wants a verdict just recorded.
        same_phase = [i for i, x in enumerate(self.verdicts) if x.phase == verdict.phase]
        if len(same_phase) > VERDICTS_KEPT_PER_PHASE:
            del self.verdicts[same_phase[0]]
        if verdict.success or verdict.reason == STOPPED:
            self.log(f"ended: {verdict.line()}")
        else:
            # Unshipped: Reporter.verdict pushes the verdict itself to the manager, durably.
            self.log(Unshipped(f"FAILED: {verdict.line()}"))
            for line in verdict.last_lines[-5:]:
                self.log(Unshipped(f"  | {line}"))
        if self.observers is not None:
            self.observers.verdict(verdict)
        return verdict

    def verdict_of(self, child: Child) -> Verdict | None:
        """The latest verdict recorded for ``child`` (by pid), if it was reaped."""
        return next((x for x in reversed(self.verdicts) if x.pid == child.pid), None)
