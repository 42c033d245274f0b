"""GPU health of the phases that use GPUs: a GPU that fails fails them, in every phase, production included.

A GPU that fails is otherwise not noticed: after Xid 79 (fallen off the bus) or 48 (double-bit ECC),
or "Failed to initialize NVML: Unknown Error" after a host reload, curio keeps running with no GPU,
no proof comes out, and such a container never recovers by itself (shared/domain/production.md).

The GPU thread (gpuwatch.py) waits for NVML's Xid events and tells a GPU (or NVML) that answers it is
lost; this module, a tick watcher on the loop, decides what that means for the phases whose
``gpu_health`` is on (default: ``[supervisor] require_gpus``):

- a fatal Xid (every Xid but the application faults gpu.APPLICATION_XIDS, as NVIDIA's device plugin
  decides, and those too where the driver's recovery action says the GPU needs a reset or a reboot), a lost
  GPU, NVML gone: the running attempt of each such phase fails with ``gpu_fault``
  naming the GPU, the Xid and the driver's recovery action; it is never retried (policy: the machine
  needs replacing), so the lifecycle fails and the fleet protocol gives the instance up. A fault
  found while no such phase runs (the download) is kept: the next attempt of such a phase is refused before
  its child starts (``refusal``, asked by the phase as it prepares), with the verdict the tick would have
  given it a second later, its child on a GPU that is gone.
- a non-fatal Xid (13, 31, 43, 45, 68, 109: the application's fault, on a GPU that needs no reset) is logged
  with its number.
- NVML unresponsive (a call that has not returned) for longer than GPU_UNRESPONSIVE_FAIL_S of the running
  attempt fails it with ``gpu_unresponsive`` (its retries or restart policy then decide: each attempt gets the
  whole bound, counted from its start, or every retry of a hang older than the bound failed at its first tick; a
  service's restart_burst of them in a row fail it, however far apart: NVML hung for good, states.py);
  the ``gpu_unresponsive`` warning after gpuwatch.NVML_CALL_TIMEOUT_S stays a warning.

While such a phase is yet to end (pending, backing off, running) it keeps the GPU thread sampling: a GPU lost
with no Xid (NVML's ``Unknown Error`` after a host reload) shows only in its samples, and with none taken while
the phase waited (a backoff, a phase before it that samples nothing) its next attempt started on the GPU that
is gone, refused by nothing.

Never a flood: each (GPU, Xid) is said at its first coming, then counted, and the count said once a
period ("Xid 13 on GPU 0: 41,233 more in the last 60 s", watchstate.Repeats); the first fatal fault is
the one every phase fails with, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..evidence.gpu import GpuFault
from ..evidence.gpuwatch import GPU_SAMPLE_S, Gpus
from ..evidence.watchstate import REPEATS_PERIOD_S, Repeats
from ..text import Log
from . import verdict as v
from .hooks import Refusal
from .states import ATTEMPT_RUNS, FINAL_STATES

# NVML hung this long (one call that has not returned) fails the attempts of the phases that use GPUs.
GPU_UNRESPONSIVE_FAIL_S = 60.0


class HealthTarget(Protocol):
    """What GPU health drives (the Lifecycle): its phases, and failing a running attempt with a reason."""

    @property
    def phases(self) -> Iterable[Any]: ...

    def fail_phase(self, name: str, reason: str, detail: str) -> bool: ...


class GpuHealth:
    """The tick's watcher (``check``): faults the GPU thread found, decided for the phases using GPUs."""

    def __init__(self, target: HealthTarget, gpus: Gpus, *, log: Log | None = None,
                 unresponsive_fail_s: float = GPU_UNRESPONSIVE_FAIL_S, repeat_s: float = REPEATS_PERIOD_S) -> None:
        self._target, self._gpus, self._fail_s = target, gpus, unresponsive_fail_s
        self._log = log  # where the faults a refusal took are said at once (None: at the next check)
        self._held: list[str] = []
        self._repeats = Repeats(repeat_s)
        self.fatal: GpuFault | None = None  # the first fatal fault: the GPU does not come back
        self._release: Callable[[], None] | None = None
        self._events_said = False
        gpus.watch_health()

    def check(self, now: float) -> list[str]:
        lines, self._held = [*self._held, *self._take_faults()], []
        if not self._events_said and self._gpus.opened.is_set() and self._gpus.events_why != "Xid events not watched":
            self._events_said = True
            lines.append(f"GPU health: {self._gpus.events_why}")
        using = [p for p in self._target.phases if p.spec.gpu_health and p.state not in FINAL_STATES]
        running = [p for p in using if p.state in ATTEMPT_RUNS]
        hung = self._gpus.unresponsive(now)
        for phase in running:
            if self.fatal is not None:
                self._target.fail_phase(phase.name, v.GPU_FAULT, fatal_detail(self.fatal))
            elif hung is not None and now - max(hung.since, phase.attempt_started) >= self._fail_s:
                self._target.fail_phase(phase.name, v.GPU_UNRESPONSIVE,
                                        f"{hung.describe(now)} (more than {self._fail_s:g}s of this attempt)")
        self._keep_sampling(bool(using))
        return lines

    def refusal(self, uses_gpus: bool) -> Refusal | None:
        """Before an attempt of a phase that uses GPUs: refused where a fatal fault is known (what the GPU thread
        found since the last tick taken first), as the tick would fail it, its child already started, a second
        later. None: it may start."""
        if not uses_gpus:
            return None
        lines = self._take_faults(wait_for_recovery=False)  # (a fault in hand refuses now, its action or not)
        if self._log is None:
            self._held.extend(lines)
        else:
            for line in lines:
                self._log(line)
        return Refusal(v.GPU_FAULT, fatal_detail(self.fatal)) if self.fatal is not None else None

    def _take_faults(self, wait_for_recovery: bool = True) -> list[str]:
        faults, dropped = self._gpus.take_all_faults(wait_for_recovery)
        lines = []
        for fault in faults:
            lines.extend(self._say(fault, 1))
        for (index, xid), count in dropped.items():
            # (only counted, without their recovery action: that of the fatal one of this GPU and Xid, if there is
            # one, or an application's storm on a GPU that needs a reset read "nothing fails" after its gpu_fault)
            fatal = self.fatal
            recovery = fatal.recovery if fatal is not None and (fatal.index, fatal.xid) == (index, xid) else None
            lines.extend(self._say(GpuFault(index, xid, "more of the same", recovery), count))
        return [*lines, *self._repeats.due()]

    def _say(self, fault: GpuFault, count: int) -> list[str]:
        """The fault's line at its first coming (the first fatal one decides), then only counted."""
        who = "NVML" if fault.index is None else f"GPU {fault.index}"
        what = "lost" if fault.xid is None else f"Xid {fault.xid}"
        if fault.fatal:
            self.fatal = self.fatal or fault
            line = f"{v.GPU_FAULT}: {fault.describe()}"
        else:
            line = f"GPU health: {fault.describe()} (Xid {fault.xid} logged; nothing fails)"
        # (an application's Xid said as logged, then handed again with a recovery action that made it fatal: said)
        return self._repeats.note(f"{fault.index} {fault.xid} {fault.fatal}", line, f"{what} on {who}", count)

    def _keep_sampling(self, wanted: bool) -> None:
        if wanted and self._release is None:
            self._release = self._gpus.want(GPU_SAMPLE_S)
        elif not wanted and self._release is not None:
            self._release()
            self._release = None


def fatal_detail(fault: GpuFault) -> str:
    """What a phase that uses GPUs fails with after ``fault``: its attempt ended, or refused before it started."""
    return f"{fault.describe()}; this machine needs replacing"


def gpu_health_for(phases: Iterable[Any], target: HealthTarget, gpus: Gpus | None,
                   log: Log | None = None) -> GpuHealth | None:
    """GPU health where a phase has ``gpu_health`` on and there is a GPU thread; None otherwise."""
    if gpus is None or not any(p.spec.gpu_health for p in phases):
        return None
    return GpuHealth(target, gpus, log=log)
