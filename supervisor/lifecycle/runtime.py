"""What the phases share, in parts, so that each part has a name and a type of its own:

- ``ChildKit``: what starting a child needs (the loop, the reaper, the console and log files, the
  environment, the cgroups, the shipper): children.start_child, and the reporter's ``export_env``;
- ``MachineEvidence``: what the phases' decisions read of the machine (memory, GPUs, the progress walker and
  the I/O thread, the freeze watch, the instance's clocks, the watches' states): the stall and progress
  watches, the hook context, the memory preflight;
- ``verdicts``: every verdict recorded (verdict.py's ``VerdictRecord``: masked, once, and heard);
- ``started``: every child in start order (engine/process.py's ``StartOrder``: a shutdown stops them in
  reverse, wave by wave).

``Runtime`` is the parts as the composition root made them; the Lifecycle hands it to each phase, which keeps
the parts it uses (phase.py's ``Phase.__init__``) and passes on only those (its watches get ``MachineEvidence``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.clock import Clock
from ..engine.logs import Console
from ..engine.loop import EventLoop
from ..engine.process import StartOrder
from ..engine.reaping import Reaper
from ..engine.tick import FreezeWatch
from ..engine.trees import StuckBeforeExec
from ..evidence.cgroups import mem_total
from ..evidence.gpuwatch import Gpus
from ..evidence.iowatch import IoProbe
from ..evidence.memory import MemoryEvidence
from ..evidence.progress import ProgressProbe
from ..evidence.watchstate import Watches
from ..state.firstseen import FirstSeen
from ..text import Log
from ..text.redact import Redactor
from . import verdict as v
from .gpuhealth import GpuHealth
from .hooks import HookContext, Refusal, capped
from .resume import NO_RERUN, Rerun
from .verdict import VerdictRecord


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
    # Children killed before their exec that did not go: the phases' sweeps say them as that, not as escapees.
    stuck: StuckBeforeExec = field(default_factory=StuckBeforeExec)

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
    # Notices the supervisor itself was frozen (engine/tick.py's start_the_tick, from run.py).
    freeze: FreezeWatch | None = None
    first_seen: FirstSeen | None = None  # when the instance first started and registered: deadlines count from it
    # The process names of the downloaders that allocate a file by writing it before its control file (a plugin's
    # ``allocators``): the progress watch tells their allocation from what they got (iowatch.py).
    allocators: frozenset[str] = frozenset()
    watches: Watches = field(default_factory=Watches)  # every watch's state: reading, blind, stopped (watchstate.py)
    # The GPU health of the phases that use GPUs (gpuhealth.py, a tick's watcher): a GPU known gone refuses their
    # attempts before a child starts on it. None: no phase uses GPUs, or no GPU thread.
    gpu_health: GpuHealth | None = None

    def available_memory(self, cap: int | None = None) -> int | None:
        """The machine's memory for children: the tightest cgroup limit, else MemTotal; at most ``cap``
        (a phase's memory_max)."""
        return capped(self.memory.available_memory() if self.memory is not None else mem_total(), cap)

    def gpu_refusal(self, uses_gpus: bool) -> Refusal | None:
        """Why the next attempt of a phase (that uses GPUs, ``uses_gpus``) may not start: a fatal GPU fault known."""
        return self.gpu_health.refusal(uses_gpus) if self.gpu_health is not None else None

    def hook_context(self, phase: str, cap: int | None, state_dir: Path, log: Log) -> HookContext:
        """What a hook may know of ``phase`` (memory_max ``cap``): its memory, the GPUs of one reading (those it
        has, and why each it lacks is left out), state_dir, the log."""
        reading = self.gpus.latest() if self.gpus is not None else None
        return HookContext(phase, self.available_memory(cap), reading.samples if reading is not None else (),
                           state_dir, log, reading.left_out if reading is not None else ())


@dataclass
class Runtime:
    """The shared parts, as the composition root made them once: the Lifecycle hands it to each phase."""

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
        Lifecycle names its Observers there)."""
        return cls(spawning.loop, spawning.log, spawning, evidence or MachineEvidence(memory=spawning.memory),
                   VerdictRecord(spawning.log, spawning.redactor.text if spawning.redactor else None),  # none: no mask
                   **rest)


@dataclass(frozen=True)
class PhaseSurroundings:
    """A phase's surroundings as resume.py reads them (``phase.resume_needs``, its ResumeNeeds): the log, the
    loop, what is run again, the machine the phase runs on. Nothing else reads it."""

    loop: EventLoop
    log: Log
    rerun: Rerun
    evidence: MachineEvidence

    @property
    def gpus(self) -> Gpus | None:
        return self.evidence.gpus

    def available_memory(self, cap: int | None = None) -> int | None:
        return self.evidence.available_memory(cap)
