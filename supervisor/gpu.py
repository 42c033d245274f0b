"""GPU evidence as plain records, and the NVML calls that gather it (``import pynvml``, nvidia-ml-py).

Used for stall detection (did any GPU's utilisation or memory use change?), for the status view,
for cuzk.toml and resume (which GPUs), and for the fitness check before anything starts
(``inventory_of``: is every GPU reachable, and free of other processes?). Where NVML is absent (no
driver, no GPU, a dev machine) the answer is "no GPU", said once, never an error.

The functions that call NVML (``open_nvml``, ``sample_all``, ``inventory_of``) run only on the one
GPU thread (supervisor/gpuwatch.py), each call through its ``Caller``, which times it: an NVML
call can hang (Xid 119, a crashed driver), and the loop must never be the one waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# call(name, gpu_index or None, function, *args): makes one NVML call, timed by the GPU thread.
Caller = Callable[..., Any]


@dataclass(frozen=True)
class HungCall:
    """An NVML call that has not returned: which (``nvmlDeviceGetUtilizationRates (GPU 0)``), since when."""

    call: str
    since: float  # monotonic
    since_wall: float  # time.time(), for people and status.json

    def describe(self, now: float) -> str:
        return f"{self.call} has not returned for {now - self.since:.1f}s"

    def since_clock(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.since_wall))

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"call": self.call, "since": self.since_wall, "for_s": round(now - self.since, 1)}


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as the fitness check sees it; ``error`` says why it could not be read."""

    index: int
    name: str = ""
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes
    processes: tuple[int, ...] | None = ()  # pids of compute processes on it; None: NVML cannot list them
    error: str | None = None


@dataclass(frozen=True)
class GpuInventory:
    """Every GPU NVML counts, readable or not; ``nvml`` False (with ``why``) when NVML itself is absent;
    ``unresponsive``: NVML did not answer (the devices are then unknown, not absent)."""

    nvml: bool
    why: str
    devices: tuple[GpuDevice, ...] = ()
    unresponsive: HungCall | None = None


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization: int  # percent, last sample period
    memory_used: int  # bytes
    memory_total: int  # bytes


@dataclass(frozen=True)
class GpuReading:
    """One sample of every GPU, as the GPU thread published it: ``at`` (monotonic) when, ``seq`` its number."""

    seq: int
    at: float
    samples: tuple[GpuSample, ...]


@dataclass
class Nvml:
    """NVML, opened: the module, one handle per GPU index (None where NVML gave none) and each GPU's name."""

    module: Any
    handles: list[Any]
    names: list[str]
    handle_errors: dict[int, str]

    @property
    def reachable(self) -> bool:
        return any(h is not None for h in self.handles)


def open_nvml(call: Caller) -> tuple[Nvml | None, str]:
    """NVML initialised, every GPU's handle and name; (None, why) where there is no NVML."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"no GPU: pynvml not installed ({exc})"
    try:
        call("nvmlInit", None, pynvml.nvmlInit)
        count = int(call("nvmlDeviceGetCount", None, pynvml.nvmlDeviceGetCount))
    except Exception as exc:  # pynvml.NVMLError and its per-code subclasses
        return None, f"no GPU: NVML unavailable ({describe_nvml_error(exc)})"
    nvml = Nvml(pynvml, [], [], {})
    for index in range(count):
        handle, name = None, ""
        try:
            handle = call("nvmlDeviceGetHandleByIndex", index, pynvml.nvmlDeviceGetHandleByIndex, index)
        except Exception as exc:  # a GPU that cannot be reached is noted, not fatal to the others
            nvml.handle_errors[index] = describe_nvml_error(exc)
        if handle is not None:
            try:
                name = _text(call("nvmlDeviceGetName", index, pynvml.nvmlDeviceGetName, handle))
            except Exception:  # nameless, still sampled: what it does is what counts
                name = ""
        nvml.handles.append(handle)
        nvml.names.append(name)
    return nvml, f"{count} GPU(s) via NVML" if count else "no GPU: NVML sees 0 devices"


def sample_all(nvml: Nvml, call: Caller) -> tuple[GpuSample, ...]:
    """One sample per reachable GPU; a GPU fallen off the bus is left out of this sample."""
    samples = []
    for index, handle in enumerate(nvml.handles):
        if handle is None:
            continue
        try:
            util = call("nvmlDeviceGetUtilizationRates", index, nvml.module.nvmlDeviceGetUtilizationRates, handle)
            mem = call("nvmlDeviceGetMemoryInfo", index, nvml.module.nvmlDeviceGetMemoryInfo, handle)
        except Exception:  # lost, reset in progress: the next sample tries again
            continue
        samples.append(GpuSample(index, nvml.names[index], int(util.gpu), int(mem.used), int(mem.total)))
    return tuple(samples)


def inventory_of(nvml: Nvml | None, why: str, call: Caller) -> GpuInventory:
    """Every GPU NVML counts: reachable (handle and memory info), memory used, compute processes on it."""
    if nvml is None:
        return GpuInventory(False, why)
    return GpuInventory(True, why, tuple(_device(nvml, i, h, call) for i, h in enumerate(nvml.handles)))


def _device(nvml: Nvml, index: int, handle: Any, call: Caller) -> GpuDevice:
    if handle is None:
        return GpuDevice(index, error=f"no handle: {nvml.handle_errors.get(index, 'unknown error')}")
    try:
        mem = call("nvmlDeviceGetMemoryInfo", index, nvml.module.nvmlDeviceGetMemoryInfo, handle)
    except Exception as exc:  # fallen off the bus, Xid error, reset in progress
        return GpuDevice(index, error=f"memory info unreadable: {describe_nvml_error(exc)}")
    processes: tuple[int, ...] | None
    try:
        listed = call("nvmlDeviceGetComputeRunningProcesses", index,
                      nvml.module.nvmlDeviceGetComputeRunningProcesses, handle)
        processes = tuple(int(p.pid) for p in listed)
    except Exception:  # not supported on this GPU or driver: the memory figure still tells
        processes = None
    return GpuDevice(index, nvml.names[index], int(mem.total), int(mem.used), processes)


def _text(name: Any) -> str:
    return name if isinstance(name, str) else bytes(name).decode(errors="replace")


def describe_nvml_error(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def activity_changed(before: list[GpuSample] | tuple[GpuSample, ...],
                     after: list[GpuSample] | tuple[GpuSample, ...]) -> bool:
    """Did any GPU work between two samples: non-zero utilisation or a change of memory use."""
    previous = {s.index: s for s in before}
    for sample in after:
        if sample.utilization > 0:
            return True
        old = previous.get(sample.index)
        if old is not None and old.memory_used != sample.memory_used:
            return True
    return False
