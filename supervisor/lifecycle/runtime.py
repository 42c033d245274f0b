"""What the phases share, in parts, each handed only to whoever needs it:

- ``ChildKit``: what starting a child needs (the loop, the reaper, the console and log files, the
  environment, the cgroups, the shipper): children.start_child, and the reporter's ``export_env``;
- ``MachineEvidence``: what the phases' decisions read of the machine (memory, GPUs, progress_path,
  the freeze watch): the stall watch, the hook context, the memory preflight;
- ``VerdictRecord``: every verdict recorded (masked, once), the observers (observers.py) told of each;
- ``StartOrder``: every child in start order (a shutdown stops them in reverse, wave by wave:
  ``stop_in_order``).

``Runtime`` is the parts as the composition root made them; the Lifecycle hands each phase its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from ..engine.clock import Clock
from ..engine.freeze import FreezeWatch
from ..engine.logs import Console, Unshipped
from ..engine.loop import EventLoop, Faults
from ..engine.process import Child
from ..engine.reaping import Reaper
from ..engine.stopbudget import StopBudget
from ..evidence.cgroups import mem_total
from ..evidence.gpu import GpuSample
from ..evidence.gpuwatch import Gpus
from ..evidence.iowatch import IoProbe
from ..evidence.memory import MemoryEvidence
from ..evidence.progress import ProgressProbe
from ..evidence.watchstate import Watches
from ..state.firstseen import FirstSeen
from ..text import Log
from ..text.redact import Redactor
from . import verdict as v
from .hooks import capped
from .observers import Observers
from .resume import NO_RERUN, Rerun
from .verdict import Verdict

# Verdicts kept per phase in VerdictRecord (the status view, status.json and lookups by pid).
VERDICTS_KEPT_PER_PHASE = 20


@dataclass
class ChildKit:
    """What starting a child needs: where its output goes, its environment and cgroup, who reaps it."""

    loop: EventLoop
    reaper: Reaper
    console: Console
    log: Log
    log_dir: Path
    ring_lines: int
    log_file_max_bytes: int
    base_env: dict[str, str]  # every child's environment; export_env adds to it
    # What children set their oom_score_adj to (startup.py decides: protect_from_oom_killer).
    child_oom_score_adj: int | None = None
    memory: MemoryEvidence | None = None  # the phase cgroups a child is placed in
    redactor: Redactor | None = None
    ship_lines: Callable[[str, str, list[bytes]], None] | None = None  # (source, label, lines) to the manager

    @property
    def clock(self) -> Clock:
        return self.loop.clock

    def export_env(self, name: str, value: str) -> None:
        """Children started from now on get ``name=value`` in their environment (running ones keep theirs)."""
        self.base_env[name] = value


@dataclass
class MachineEvidence:
    """What the phases' decisions read of the machine, measured elsewhere (cgroups, the GPU thread, the
    progress walker, the tick): never a blocking call."""

    memory: MemoryEvidence | None = None
    gpus: Gpus | None = None  # the GPU thread's latest readings (supervisor/evidence/gpuwatch.py)
    progress: ProgressProbe = field(default_factory=ProgressProbe)  # the walker thread, for every phase
    # The I/O thread: the attempts' trees' bytes (iowatch.py); None: no I/O evidence (fake children, no processes).
    io: IoProbe | None = field(default_factory=IoProbe)
    freeze: FreezeWatch | None = None  # notices the supervisor itself was frozen (freeze.start_the_tick, from run.py)
    first_seen: FirstSeen | None = None  # when the instance first started and registered: deadlines count from it
    watches: Watches = field(default_factory=Watches)  # every watch's state: reading, blind, stopped (watchstate.py)

    def available_memory(self, cap: int | None = None) -> int | None:
        """The machine's memory for children: the tightest cgroup limit, else MemTotal; at most ``cap``
        (a phase's memory_max)."""
        return capped(self.memory.available_memory() if self.memory is not None else mem_total(), cap)

    def gpu_samples(self) -> tuple[GpuSample, ...]:
        """The GPU thread's latest sample (empty: none yet, or no GPU)."""
        return tuple(self.gpus.samples()) if self.gpus is not None else ()


class VerdictRecord(Sequence[Verdict]):
    """Every verdict recorded (the latest few per phase), oldest first; ``observers`` hear of each.

    This is where a verdict enters the supervisor's records, so it is masked here, once (redact.py): the
    log, the status view and status.json, the reporting, a plugin's give-up reason and the termination
    log all read the masked record, never the verdict as it was made."""

    def __init__(self, log: Log, faults: Faults, mask: Callable[[str], str] | None = None,
                 observers: Observers | None = None) -> None:
        self.log, self.faults, self._mask = log, faults, mask
        self.verdicts: list[Verdict] = []
        self.observers = observers if observers is not None else Observers()

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
        if verdict.success or verdict.reason == v.STOPPED:
            self.log(f"ended: {verdict.line()}")
        else:
            # Unshipped: Reporter.verdict pushes the verdict itself to the manager, durably.
            self.log(Unshipped(f"FAILED: {verdict.line()}"))
            for line in verdict.last_lines[-5:]:
                self.log(Unshipped(f"  | {line}"))
        self.observers.verdict(verdict)
        return verdict

    def verdict_of(self, child: Child) -> Verdict | None:
        """The latest verdict recorded for ``child`` (by pid), if it was reaped."""
        return next((x for x in reversed(self.verdicts) if x.pid == child.pid), None)


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


@dataclass
class Runtime:
    """The shared parts, as the composition root made them once: the Lifecycle gives each phase its parts."""

    loop: EventLoop
    log: Log
    spawning: ChildKit
    evidence: MachineEvidence
    verdicts: VerdictRecord
    started: StartOrder = field(default_factory=StartOrder)
    state_dir: Path = Path(".")
    rerun: Rerun = NO_RERUN  # resume kinds run again although their evidence holds (a plugin's switch of ``run``)
    reasons: v.AddedReasons = field(default_factory=lambda: v.NO_REASONS_ADDED)  # a plugin's, with their statuses
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def of(cls, spawning: ChildKit, evidence: MachineEvidence | None = None, **rest: Any) -> Runtime:
        """The parts around ``spawning`` (its loop and log), the verdict record new, heard by no one yet (the
        composition root names the observers: app/observers.py)."""
        return cls(spawning.loop, spawning.log, spawning, evidence or MachineEvidence(memory=spawning.memory),
                   VerdictRecord(spawning.log, spawning.loop.faults,
                                 spawning.redactor.text if spawning.redactor else None,  # no secrets: no mask
                                 Observers(spawning.loop, spawning.loop.faults)), **rest)

    @property
    def observers(self) -> Observers:
        """Who reacts to what the lifecycle decides (the verdict record tells them of each verdict)."""
        return self.verdicts.observers


@dataclass(frozen=True)
class ResumeNeeds:
    """What resume.py reads as ``phase.rt`` (its ResumeRuntime: the log, the loop, what is run again, the
    machine the phase runs on): nothing else reads it."""

    loop: EventLoop
    log: Log
    rerun: Rerun
    evidence: MachineEvidence

    @property
    def gpus(self) -> Gpus | None:
        return self.evidence.gpus

    def available_memory(self, cap: int | None = None) -> int | None:
        return self.evidence.available_memory(cap)


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
            waves_left = len(self._waves)
            wave = self._waves.pop(0)
            self._pending, self._starting = len(wave), True
            for child in wave:
                if self._budget is None:
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
