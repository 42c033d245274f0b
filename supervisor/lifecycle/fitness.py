"""Fitness: can this machine run the whole lifecycle? Asked once, before any phase starts.

An instance is paid by the hour. One that cannot prove (too little memory for the
bench, too little disk for the parameters, a GPU missing or taken) must be refused
before the 85-minute parameter download, not after it. So everything the whole
lifecycle will need is checked up front, against what the machine has:

- memory: each phase's ``min_memory`` against the memory available (cgroup limit or MemTotal),
  capped by the phase's ``memory_max``; and what the plugin's checks find (the prover's: what its
  daemon's generated config needs), said once: the plan's own need first;
- disk: free space under ``state_dir`` (``min_disk``) and under every path a plugin says the
  lifecycle fills (``SpaceNeed``: the prover's parameter cache), less the bytes already there
  (a resumed download needs less); two paths on one filesystem must fit together;
- GPUs (``require_gpus``): NVML present, as many GPUs as ``$GPU_COUNT`` says, each
  reachable, none already running another process's work.

A plugin adds checks of its own (``Plugin.fitness``: the plan and the evidence → findings) and the disk its
lifecycle needs (``Plugin.disk_needs``: the plan and the environment → a path and bytes each); this module
imports no plugin, it is handed them.

``assess`` decides from evidence alone (pure, tested with real-shaped samples);
``gather`` collects the evidence from the machine. Gathering blocks where the machine does: a
statvfs or a walk of a hung FUSE or NFS mount never returns (and cannot be interrupted), an NVML
call under Xid 119 takes 45 s. So it runs off the loop (run.py ``check_fitness``), bounded by
FITNESS_BOUND_S, and says what it is doing (``Steps``): a bound that passes is a finding about
that step (``overdue_finding``), never something to wait out.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config import PhaseSpec, Plan
from ..engine.loop import ErrorHandler, EventLoop
from ..engine.offloop import run_bounded
from ..evidence.gpu import MAX_GPUS, GpuInventory, HungCall
from ..evidence.progress import tree_size
from ..text.show import fmt_bytes, shown
from ..text.units import is_ascii_digits
from . import verdict as v
from .hooks import capped, too_little_memory

GPU_COUNT_ENV = "GPU_COUNT"  # set by Vast.ai inside an instance
FITNESS = "fitness"  # the phase and child an unfit machine's verdict names (no phase of the plan had started)
# An idle GPU shows some memory used with no process on it (driver context, ECC and row-remap
# reserves: a few hundred MiB on an H100/H200). More than this is somebody else's work.
GPU_IDLE_USED_MAX = 1 << 30
# How a config with require_gpus set in the file turns it off (one read from ${VAR} names the variable instead).
GPU_OVERRIDE_KEY = " (set [supervisor] require_gpus = false where no GPU is needed)"
# The longest the evidence may take to gather (off the loop); past it, what it was doing is the finding.
FITNESS_BOUND_S = 30.0
# GPUs not required: the wait for NVML's first answer ends this long before the check's bound (never a finding).
OPTIONAL_WAIT_MARGIN_S = 1.0
GPU_NOT_REQUIRED = "gpu (not required)"  # the step's kind while NVML is awaited only to say what it found


@dataclass(frozen=True)
class Finding:
    """One reason the machine is unfit; ``detail`` names what is needed and what there is."""

    reason: str
    detail: str


@dataclass(frozen=True)
class DiskNeed:
    """Space the lifecycle will write under ``path``, and what its filesystem has free."""

    what: str  # "state_dir", or what a plugin calls it ("parameter cache")
    path: str
    need: int  # bytes the lifecycle writes there in all
    present: int  # bytes already there that count towards ``need`` (a resumed download)
    free: int | None  # bytes free on its filesystem; None: unreadable
    device: int | None  # st_dev: needs on one filesystem add up

    @property
    def left(self) -> int:
        return max(0, self.need - self.present)


@dataclass(frozen=True)
class SpaceNeed:
    """What a plugin says the lifecycle will write under ``path``: ``need`` bytes in all (the bytes already
    there count towards it: a resumed download needs less). The core measures the free space and the rest."""

    what: str  # how the finding names it: "parameter cache"
    path: str
    need: int


@dataclass(frozen=True)
class Evidence:
    available_memory: int | None  # cgroup limit or MemTotal; None: unreadable
    disks: tuple[DiskNeed, ...] = ()
    gpus: GpuInventory | None = None  # None: GPUs are not required, not probed
    gpu_count_expected: int | None = None  # $GPU_COUNT
    gpu_count_unread: str | None = None  # $GPU_COUNT where it is set but no count: said, and nothing compared


class GpuSource(Protocol):
    """What gathering needs of ``gpuwatch.Gpus``: an inventory within a bound (a test may hand in its own)."""

    def inventory(self, bound_s: float) -> GpuInventory: ...


class GpuThread(GpuSource, Protocol):
    """``gpuwatch.Gpus`` as ``check`` uses it: also its first answer (opened, absent or hung)."""

    @property
    def started(self) -> bool: ...

    def wait_opened(self, bound_s: float) -> HungCall | None: ...


class MemorySource(Protocol):
    def available_memory(self) -> int | None: ...


# A plugin's check (supervisor/plugin.py FitnessCheck): every reason it finds, from the plan and the evidence.
Check = Callable[["Plan", Evidence], "list[Finding]"]
# A plugin's disk needs (supervisor/plugin.py DiskNeeds): the plan and the environment → what it will write where.
Needs = Callable[["Plan", Mapping[str, str]], "Sequence[SpaceNeed]"]


# ---------------------------------------------------------------- deciding


def assess(plan: Plan, evidence: Evidence, checks: Sequence[Check] = ()) -> list[Finding]:
    """Every reason the machine cannot run these phases to production; empty: fit. Memory is said once: the
    largest ``min_memory`` that does not fit, else the first memory finding of a plugin's check."""
    added = [finding for check in checks for finding in check(plan, evidence)]
    memory = memory_findings(plan.phases, evidence.available_memory)
    return [
        *(memory or [f for f in added if f.reason == v.INSUFFICIENT_MEMORY][:1]),
        *disk_findings(evidence.disks),
        *gpu_findings(evidence.gpus, evidence.gpu_count_expected, override=gpu_override(plan)),
        *(f for f in added if f.reason != v.INSUFFICIENT_MEMORY),
    ]


def memory_findings(phases: tuple[PhaseSpec, ...], available: int | None) -> list[Finding]:
    """At most one finding: the largest ``min_memory`` that does not fit."""
    if available is None:
        return []  # nothing to compare with; the phase preflight says so when it runs
    too_big: list[tuple[int, Finding]] = []
    for phase in phases:
        limit = capped(available, phase.memory_max)
        need = phase.min_memory
        if need is not None and limit < need:
            shortfall = f"phase {phase.name} {too_little_memory(need, limit)}"
            too_big.append((need, Finding(v.INSUFFICIENT_MEMORY, shortfall)))
    return [max(too_big, key=lambda item: item[0])[1]] if too_big else []


def disk_findings(disks: tuple[DiskNeed, ...]) -> list[Finding]:
    """One finding per filesystem whose free space is below what the paths on it need together."""
    by_device: dict[object, list[DiskNeed]] = {}
    for disk in disks:
        by_device.setdefault(disk.device if disk.device is not None else disk.path, []).append(disk)
    findings = []
    for group in by_device.values():
        free = group[0].free
        left = sum(d.left for d in group)
        if free is None or free >= left:
            continue
        parts = [f"{d.what} {d.path} needs {fmt_bytes(d.left)} ({fmt_bytes(d.need)} less {fmt_bytes(d.present)} "
                 "already there)" if d.present else f"{d.what} {d.path} needs {fmt_bytes(d.need)}" for d in group]
        together = f" ({fmt_bytes(left)} together on one filesystem)" if len(group) > 1 else ""
        findings.append(Finding(v.INSUFFICIENT_DISK, f"{' and '.join(parts)}{together} but only {fmt_bytes(free)} "
                                                     f"({free} bytes) is free there"))
    return findings


def gpu_override(plan: Plan) -> str:
    """How this config turns the GPU requirement off, as the refusal tells it: the environment variable its
    ``require_gpus`` is read from (``require_gpus = "${PROVER_REQUIRE_GPUS:-true}"``), else the key itself."""
    var = plan.env_keys.get("supervisor.require_gpus")
    return f" (set {var}=false to run without GPUs)" if var else GPU_OVERRIDE_KEY


def gpu_findings(gpus: GpuInventory | None, expected: int | None,
                 idle_used_max: int = GPU_IDLE_USED_MAX, override: str | None = None) -> list[Finding]:
    """GPUs the lifecycle needs: NVML present, the expected count, each reachable and not taken. ``override``:
    how to turn the requirement off (``gpu_override``; the key by default)."""
    if gpus is None:
        return []
    override = GPU_OVERRIDE_KEY if override is None else override
    if gpus.unresponsive is not None:
        return [Finding(v.GPU_UNRESPONSIVE, f"NVML unresponsive: {gpus.unresponsive.describe(time.monotonic())}; "
                                            f"this lifecycle needs GPUs{override}")]
    if not gpus.nvml:
        return [Finding(v.GPU_UNAVAILABLE, f"{gpus.why}; this lifecycle needs GPUs{override}")]
    count = len(gpus.devices)
    if count == 0:
        return [Finding(v.GPU_UNAVAILABLE, f"NVML sees 0 GPUs; this lifecycle needs GPUs{override}")]
    problems = []
    if expected is not None and count != expected:
        problems.append(f"NVML sees {count} GPU(s) but {GPU_COUNT_ENV}={expected}")
    for gpu in gpus.devices:
        label = f"GPU {gpu.index}" + (f" ({gpu.name})" if gpu.name else "")
        if gpu.error is not None:
            problems.append(f"{label} unreachable: {gpu.error}")
        elif gpu.processes:
            pids = ", ".join(map(str, gpu.processes[:5]))
            problems.append(f"{label} is in use by {len(gpu.processes)} other process(es) (pid {pids}), "
                            f"{fmt_bytes(gpu.memory_used or 0)} of {fmt_bytes(gpu.memory_total or 0)} taken")
        elif gpu.memory_used is not None and gpu.memory_used > idle_used_max:
            problems.append(f"{label} has {fmt_bytes(gpu.memory_used)} of {fmt_bytes(gpu.memory_total or 0)} taken "
                            f"(an idle GPU shows at most {fmt_bytes(idle_used_max)})")
    return [Finding(v.GPU_UNAVAILABLE, "; ".join(problems))] if problems else []


def refusal(findings: list[Finding]) -> v.Verdict:
    """The verdict of an unfit machine: the first finding's reason, every finding's detail."""
    return v.without_exit(FITNESS, FITNESS, findings[0].reason, 1,
                          "unfit before any phase started: " + "; ".join(f.detail for f in findings), attempt=0)


# ---------------------------------------------------------------- gathering


class Steps:
    """What the gathering thread is doing now (``kind`` "memory", "disk" or "gpu", and the call), so
    that the loop can name a call that has not returned when the bound passes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: tuple[str, str] = ("memory", "reading the memory available")

    def doing(self, kind: str, call: str) -> None:
        with self._lock:
            self._now = (kind, call)

    def current(self) -> tuple[str, str]:
        with self._lock:
            return self._now


def gather(plan: Plan, memory: MemorySource | None, gpus: GpuSource, environ: Mapping[str, str] = os.environ,
           steps: Steps | None = None, bound_s: float = FITNESS_BOUND_S, needs: Sequence[Needs] = (),
           ) -> Evidence:
    """The machine's side of the check: memory, free disk under the paths the lifecycle fills (``needs``: the
    plugin's, then state_dir), GPUs. Blocks (a hung mount, a hung driver): run it off the loop."""
    sup = plan.supervisor
    steps = steps or Steps()
    available = memory.available_memory() if memory is not None else None
    disks = []
    for space in (space for said in needs for space in said(plan, environ)):
        steps.doing("disk", f"statvfs({space.path})")
        free, device = free_space(space.path)
        # Bytes already there count: a resumed or finished download needs that much less.
        steps.doing("disk", f"walking {space.path} (the bytes already there)")
        disks.append(DiskNeed(space.what, space.path, space.need, tree_size(space.path) or 0, free, device))
    if sup.min_disk is not None:
        steps.doing("disk", f"statvfs({sup.state_dir})")
        disks.append(DiskNeed("state_dir", sup.state_dir, sup.min_disk, 0, *free_space(sup.state_dir)))
    inventory = None
    if sup.require_gpus:
        steps.doing("gpu", "the GPU inventory")
        inventory = gpus.inventory(bound_s)
    return Evidence(available_memory=available, disks=tuple(disks), gpus=inventory,
                    gpu_count_expected=expected_gpu_count(environ), gpu_count_unread=unread_gpu_count(environ))


def check(loop: EventLoop, plan: Plan, memory: MemorySource | None, gpus: GpuThread,
          then: Callable[[list[Finding], Evidence | None], None], on_error: ErrorHandler,
          bound_s: float = FITNESS_BOUND_S, checks: Sequence[Check] = (), needs: Sequence[Needs] = (),
          ) -> None:
    """Gather on a thread of its own, at most ``bound_s``, then ``then(findings, evidence)`` on the loop;
    past the bound, the finding is the step that did not return (``overdue_finding``), evidence None.
    Where the GPU thread runs, its first answer is awaited too (said before the first phase). ``checks`` and
    ``needs``: what the plugin adds (its checks, the disk it says its lifecycle needs)."""
    steps = Steps()

    began = time.monotonic()

    def work() -> Evidence:
        evidence = gather(plan, memory, gpus, steps=steps, bound_s=bound_s, needs=needs)
        if gpus.started:
            required = plan.supervisor.require_gpus
            steps.doing("gpu" if required else GPU_NOT_REQUIRED, "opening NVML")
            # Returns once opened, absent, or hung past NVML's own bound. GPUs not required: a slow NVML is
            # no finding, so the wait ends before the check's own bound does.
            left = bound_s - (time.monotonic() - began)
            gpus.wait_opened(bound_s if required else max(0.0, left - OPTIONAL_WAIT_MARGIN_S))
        return evidence

    def overdue() -> None:
        step = steps.current()
        then([] if step[0] == GPU_NOT_REQUIRED else [overdue_finding(step, bound_s)], None)

    run_bounded(loop, "fitness", work, bound_s,
                lambda evidence: then(assess(plan, evidence, checks), evidence), overdue, on_error=on_error)


def overdue_finding(step: tuple[str, str], bound_s: float) -> Finding:
    """The finding when gathering did not finish within ``bound_s``, from the step it was at (GPUs that are not
    required are never one: check() decides without them)."""
    kind, call = step
    if kind == "disk":
        return Finding(v.INSUFFICIENT_DISK, f"{call} did not return within {bound_s:g}s (a hung mount?): "
                                            "its free space is unknown")
    if kind == "gpu":
        return Finding(v.GPU_UNRESPONSIVE, f"NVML did not answer {call} within {bound_s:g}s")
    return Finding(v.INSUFFICIENT_MEMORY, f"{call} did not finish within {bound_s:g}s: the memory is unknown")


def free_space(path: str) -> tuple[int | None, int | None]:
    """Bytes free on the filesystem where ``path`` is (or will be: its nearest existing parent) and its
    st_dev; (None, None) where unreadable. Blocks on a hung mount: off the loop only."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing) and existing != os.path.dirname(existing):
        existing = os.path.dirname(existing)
    try:
        st = os.statvfs(existing)
        device = os.stat(existing).st_dev
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize, device


def expected_gpu_count(environ: Mapping[str, str]) -> int | None:
    """$GPU_COUNT, where it is a count a machine can have (0 to MAX_GPUS; 5000 digits raised out of int(), the
    fitness check unchecked, and the demo made a stand-in GPU for each of 100 million)."""
    raw = environ.get(GPU_COUNT_ENV, "").strip()
    # ("²" is a digit to isdigit(), not to int())
    return int(raw) if is_ascii_digits(raw) and len(raw) <= 4 and int(raw) <= MAX_GPUS else None


def unread_gpu_count(environ: Mapping[str, str]) -> str | None:
    """$GPU_COUNT where it is set but is no count ("two", "-1", more than any machine has): the count cannot be
    compared, which is said."""
    raw = environ.get(GPU_COUNT_ENV)
    return raw if raw is not None and raw.strip() and expected_gpu_count(environ) is None else None


def describe(evidence: Evidence) -> str:
    """One line for the log of a machine found fit: what was compared."""
    parts = [f"memory {fmt_bytes(evidence.available_memory)}" if evidence.available_memory is not None
             else "memory unknown"]
    parts += [f"{d.what} {fmt_bytes(d.free)} free (needs {fmt_bytes(d.left)})" for d in evidence.disks
              if d.free is not None]
    if evidence.gpus is None:
        parts.append("GPUs not required")
    else:
        parts.append(evidence.gpus.why)
        if evidence.gpu_count_unread is not None:
            parts.append(f"{GPU_COUNT_ENV}={shown(evidence.gpu_count_unread)} is not a count: the GPUs were not "
                         "counted against it")
    return "fitness: ok: " + ", ".join(parts)
