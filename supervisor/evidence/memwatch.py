"""Memory warned before the kill: each phase whose children run is watched against its memory limit.

An OOM kill comes without warning to the operator, though the usage was near the limit for minutes
(the seeds' instance died on its first uncached proof). So at every tick (engine/tick.py's TICK_S: cgroupfs
and /proc/meminfo reads do not block, so this runs on the loop) the memory of each phase with live
children is read: its own cgroup (per-phase mode), else the supervisor's, else (cgroups = "off") what is
under the limits over the supervisor's cgroup, else the machine's (MemTotal less MemAvailable). The figure
is the working set (usage less inactive file cache, as the kubelet counts it: a cache the kernel can drop is
no threat), the limit the fullest of the cgroup's own and those above it, each judged by all that is under
it (``fullest_limit``: the kill comes at the first one full, not at the smallest), else MemTotal.
PSI is added where it is readable (v2 ``memory.pressure``, else ``/proc/pressure/memory``; EOPNOTSUPP: none).

Crossing the phase's ``memory_warn`` (a fraction of the limit, default 0.9; 0: never) is said once
per crossing as ``memory_high``, with the usage, the limit and the phase: to the console and
supervisor.log, durably to the manager's ``setup`` log, and in status (``memory.warnings``). It is
said again only after the usage fell MEMORY_REARM_MARGIN below the threshold (a phase that hovers
at it is not said every second). An ``oom_killed`` verdict that follows names when it was warned
(verdict.exit_verdict reads ``MemoryEvidence.warned``).

Whatever a cgroup file holds, a read that fails (or raises) is no reading of that phase, counted on the
watch's state (watchstate.py: said once when blind for MEMORY_BLIND_S), and the watch goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..engine.logs import Unshipped
from ..text.show import fmt_bytes
from .cgroups import MemoryCgroup, read_pressure
from .memory import Limit, MemoryEvidence, MemoryWarning
from .watchstate import WatchState, said_error

MEMORY_HIGH = "memory_high"
# Once said, memory_high is said again only after the usage fell this far (a fraction of the limit)
# below memory_warn: hysteresis, so that a usage hovering at the threshold is one line, not one a tick.
MEMORY_REARM_MARGIN = 0.05
MACHINE_PRESSURE = Path("/proc/pressure/memory")
# No reading of a running phase's memory for this long is said (once).
MEMORY_BLIND_S = 30.0


@dataclass(frozen=True)
class MemoryUse:
    used: int  # bytes: the working set
    limit: int  # bytes
    where: str  # "its cgroup", "the supervisor's cgroup", "the machine", or "the limit above <one of those> (...)"
    pressure: str | None = None  # PSI, where readable

    @property
    def fraction(self) -> float:
        return self.used / self.limit if self.limit > 0 else 0.0


def crossed(armed: bool, fraction: float, warn: float) -> tuple[bool, bool]:
    """(say memory_high now, armed afterwards): said once when ``fraction`` reaches ``warn`` while armed;
    re-armed once it fell MEMORY_REARM_MARGIN below. ``warn`` 0: never."""
    if warn <= 0:
        return False, armed
    if armed and fraction >= warn:
        return True, False
    if not armed and fraction < warn - MEMORY_REARM_MARGIN:
        return False, True
    return False, armed


def memory_high_line(phase: str, use: MemoryUse, warn: float) -> str:
    pressure = f"; pressure {use.pressure}" if use.pressure else ""
    return (f"{MEMORY_HIGH}: phase {phase} uses {use.fraction * 100:.0f}% of its memory limit "
            f"({fmt_bytes(use.used)} of {fmt_bytes(use.limit)}, {use.where}; memory_warn={warn:g}){pressure}")


class WatchedPhase(Protocol):
    """What the watch reads of a phase (supervisor.lifecycle.phase.Phase)."""

    @property
    def spec(self) -> object: ...  # its PhaseSpec: memory_warn

    @property
    def name(self) -> str: ...

    @property
    def attempt(self) -> int: ...  # its attempt's number: a new one is counted from zero (its cgroup made anew)

    def live_children(self) -> Sequence[object]: ...


class MemoryWatch:
    """The tick's watcher (``check``): memory_high once per crossing, for every phase with live children."""

    def __init__(self, phases: Callable[[], Iterable[WatchedPhase]], memory: MemoryEvidence,
                 push: Callable[[str], None] | None = None, meminfo: Path | str = "/proc/meminfo") -> None:
        self._phases, self._memory, self._push, self._meminfo = phases, memory, push, meminfo
        self._armed: dict[str, tuple[int, bool]] = {}  # phase → (its attempt, armed)
        self.state = WatchState("memory watch", MEMORY_BLIND_S)

    def check(self, now: float | None = None) -> list[str]:
        lines: list[str] = []
        watched, missed = 0, []
        for phase in self._phases():
            warn = float(getattr(phase.spec, "memory_warn", 0.0))
            if warn <= 0 or not phase.live_children():
                continue
            watched += 1
            try:  # whatever the cgroup files hold: no reading of this phase, never an exception
                use = self.use_of(phase.name)
            except Exception as exc:
                missed.append(f"phase {phase.name}: {said_error(exc)}")
                continue
            if use is None:
                missed.append(f"phase {phase.name}: its memory is unreadable")
                continue
            # A new attempt is a new climb from zero (its cgroup made anew): armed again, whether or not a tick
            # saw it low (a restart at once to the same height went unsaid, and its OOM kill had no warning cited).
            attempt, armed = self._armed.get(phase.name, (phase.attempt, True))
            say, armed = crossed(armed or attempt != phase.attempt, use.fraction, warn)
            self._armed[phase.name] = (phase.attempt, armed)
            if say:
                line = memory_high_line(phase.name, use, warn)
                self._memory.warned[phase.name] = MemoryWarning(time.time(), use.fraction, use.limit, line)
                lines.append(Unshipped(line))  # the durable push below carries it to the manager
                if self._push is not None:
                    self._push(f"prover-supervisor: {line}")
        self._note(watched, missed)
        return lines

    def _note(self, watched: int, missed: list[str]) -> None:
        if not watched:
            self.state.idle("no running phase to watch")
        elif missed:
            self.state.miss("; ".join(missed))
        else:
            self.state.read()

    def use_of(self, phase: str) -> MemoryUse | None:
        """The phase's memory now (``memory_use``)."""
        return memory_use(self._memory, phase, self._meminfo)


def memory_use(memory: MemoryEvidence, phase: str, meminfo: Path | str = "/proc/meminfo") -> MemoryUse | None:
    """The phase's memory now: its cgroup's (or the supervisor's) working set against the fullest limit over it,
    else what is under the limits over the supervisor's cgroup (cgroups = "off": read, never watched), else the
    machine's (the watch's reading, and what a plugin's ``machine`` view shows)."""
    cgroup, where = memory.cgroup_of(phase)
    used = cgroup.working_set() if cgroup is not None else None
    fullest = fullest_limit(memory, cgroup, used, meminfo) if used is not None or cgroup is None else None
    if fullest is None:
        return None
    used_there, limit = fullest
    mount = ", set above the cgroup mount" if limit.above_mount else ""
    if cgroup is None:
        machine = read_pressure(MACHINE_PRESSURE)
        if limit.holder is None:
            return MemoryUse(used_there, limit.size, "the machine", machine)
        # With the evidence off the container's limit still kills: a phase at 91% of it went unwarned, judged
        # against MemTotal. What is under it counts, the supervisor and every phase. (The machine's PSI: said so.)
        return MemoryUse(used_there, limit.size, f"the limit over the supervisor's cgroup{mount}, all that is under "
                         "it counted", f"(machine) {machine}" if machine else None)
    if used is not None and (limit.holder is None or limit.holder.path != cgroup.path):  # (the container's, machine's)
        own = cgroup.limit()
        its = "; it has none of its own" if not own else \
            f" < its own {fmt_bytes(own)}" if limit.size < own else f"; its own {fmt_bytes(own)} is less full"
        where = f"the limit above {where} ({fmt_bytes(limit.size)}{mount}{its})"
        if used_there > used:
            # What else lives under that limit fills it too (the supervisor, a kept daemon, another phase,
            # the container's other processes): the phase's own share read 45% of a container at 100%.
            where = f"{where}, all that is under it counted"
    pressure = read_pressure(cgroup.path / "memory.pressure") if cgroup.version == "v2" else None
    if pressure is None:  # v1 has none of its own: the machine's, said as such
        machine = read_pressure(MACHINE_PRESSURE)
        pressure = f"(machine) {machine}" if machine else None
    return MemoryUse(used_there, limit.size, where, pressure)


class Limits(Protocol):
    """What ``fullest_limit`` reads of memory.MemoryEvidence."""

    def limits_over(self, cgroup: MemoryCgroup | None = None, meminfo: Path | str = ...) -> list[Limit]: ...

    def used_under(self, where: MemoryCgroup | None, meminfo: Path | str = ...) -> int | None: ...


def fullest_limit(memory: Limits, cgroup: MemoryCgroup | None, used: int | None,
                  meminfo: Path | str = "/proc/meminfo") -> tuple[int, Limit] | None:
    """The limit over ``cgroup`` (None: over the supervisor's) nearest to being reached, with what is under it now:
    its own judged by ``used`` (its working set), each above it by all that is under it (the supervisor, a kept
    daemon, other phases, the container's other processes; never less than ``used``). The kill comes at the first
    one full, not at the smallest: a phase at 80% of its own 300 MiB was killed by a 512 MiB container that another
    phase filled, with no word of it. None: no limit, or nothing under one could be read."""
    fullest: tuple[int, Limit] | None = None
    for limit in memory.limits_over(cgroup, meminfo):
        if cgroup is not None and limit.holder is not None and limit.holder.path == cgroup.path:
            under = used
        else:  # (read only where it is above: a reading that fails is still at least the cgroup's own)
            readings = [n for n in (used, memory.used_under(limit.holder, meminfo)) if n is not None]
            under = max(readings, default=None)
        if under is not None and (fullest is None or under * fullest[1].size > fullest[0] * limit.size):
            fullest = (under, limit)
    return fullest
