"""What every phase shares: the loop, the reaper, the logs, the children's environment, and the
start order of every child (a shutdown stops them in reverse, wave by wave: stop_in_order)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import verdict as v
from .cgroups import mem_total
from .console import Console
from .freeze import FreezeWatch
from .gpuwatch import Gpus
from .logs import Unshipped
from .loop import EventLoop, name_of
from .memory import MemoryEvidence
from .policy import capped
from .process import Child
from .progress import ProgressProbe
from .reaping import Reaper
from .redact import Redactor
from .verdict import Verdict

Log = Callable[[str], None]

# Verdicts kept per phase in Runtime.verdicts (the status view, status.json and lookups by pid).
VERDICTS_KEPT_PER_PHASE = 20


@dataclass
class Runtime:
    """What phases share: the loop, the reaper, the logs, and the start order of every child."""

    loop: EventLoop
    reaper: Reaper
    console: Console
    log: Log
    log_dir: Path
    ring_lines: int
    log_file_max_bytes: int
    base_env: dict[str, str]  # every child's environment; export_env adds to it
    child_oom_score_adj: int | None = None  # what children set their oom_score_adj to (run.py decides)
    memory: MemoryEvidence | None = None
    gpus: Gpus | None = None  # the GPU thread's latest readings (supervisor/gpuwatch.py)
    progress: ProgressProbe = field(default_factory=ProgressProbe)  # the walker thread, for every phase
    freeze: FreezeWatch | None = None  # notices the supervisor itself was frozen (run.py makes it)
    redactor: Redactor | None = None
    state_dir: Path = Path(".")
    rebench: bool = False  # run machine-resumable phases (the bench) even if they passed here recently
    ship_lines: Callable[[str, str, list[bytes]], None] | None = None  # (source, label, lines) to the manager
    rng: random.Random = field(default_factory=random.Random)
    started: list[Child] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    on_verdict: list[Callable[[Verdict], None]] = field(default_factory=list)

    def export_env(self, name: str, value: str) -> None:
        """Children started from now on get ``name=value`` in their environment (running ones keep theirs)."""
        self.base_env[name] = value

    def available_memory(self, cap: int | None = None) -> int | None:
        """The machine's memory for children: the tightest cgroup limit, else MemTotal; at most ``cap``
        (a phase's memory_max)."""
        return capped(self.memory.available_memory() if self.memory is not None else mem_total(), cap)

    def record(self, verdict: Verdict) -> None:
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
        tell_listeners(self, "verdict listener", self.on_verdict, verdict, phase=verdict.phase)

    def verdict_of(self, child: Child) -> Verdict | None:
        """The latest verdict recorded for ``child`` (by pid), if it was reaped."""
        return next((x for x in reversed(self.verdicts) if x.pid == child.pid), None)


def tell_listeners(rt: Runtime, kind: str, listeners: list[Callable[..., None]], *args: Any,
                   phase: str | None = None) -> None:
    """Every listener hears of it, whichever raised before it: a broken listener (reporting, the
    status file) is logged once and costs what it was for, never the lifecycle."""
    for listener in list(listeners):
        try:
            listener(*args)
        except Exception as exc:
            rt.loop.faults.report(f"the {kind} {name_of(listener)}", exc, phase=phase)


def stop_in_order(rt: Runtime, children: list[Child], reason: str, then: Callable[[], None]) -> None:
    """Stop each child's tree in the order given (reverse start order), wave after wave; then ``then``.

    A wave is one child, or the daemons of one phase that come one after another: they have no order
    among themselves but their start's, so they are signalled together, in that order, and waited for
    together (200 daemons stop in their grace period, not one after the other). The next wave starts
    once the whole wave is gone: a phase's command is gone before its daemons get their signal, and a
    later phase before an earlier one.
    """
    _Waves(rt, stop_waves(children), reason, then).next()


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

    def __init__(self, rt: Runtime, waves: list[list[Child]], reason: str, then: Callable[[], None]) -> None:
        self._rt, self._waves, self._reason, self._then = rt, waves, reason, then
        self._pending = 0  # stops of the current wave not yet over
        self._starting = False  # the current wave's stops are being begun (some may end at once)

    def next(self) -> None:
        # A loop, not a call per wave: children already gone end their stop at once, and a chain of
        # those must not recurse once per child.
        while self._waves:
            wave = self._waves.pop(0)
            self._pending, self._starting = len(wave), True
            for child in wave:
                child.stop(self._rt.loop, self._rt.log, self._reason, self._one_stopped)
            self._starting = False
            if self._pending:
                return  # the wave's last stop to end goes on from here
        self._then()

    def _one_stopped(self) -> None:
        self._pending -= 1
        if not self._pending and not self._starting:
            self.next()
