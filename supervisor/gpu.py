"""GPU evidence through NVML (``import pynvml``, from nvidia-ml-py), loaded lazily.

Used for stall detection (did any GPU's utilisation or memory use change?), for
the status view, and for the fitness check before anything starts (``inventory``:
is every GPU reachable, and free of other processes?). Where NVML is absent (no
driver, no GPU, a dev machine) the answer is "no GPU", said once, never an error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


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
    """Every GPU NVML counts, readable or not; ``nvml`` False (with ``why``) when NVML itself is absent."""

    nvml: bool
    why: str
    devices: tuple[GpuDevice, ...] = ()


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization: int  # percent, last sample period
    memory_used: int  # bytes
    memory_total: int  # bytes


class Gpus:
    """Lazily initialised NVML; ``available`` is False with ``why`` when there is none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._handles: list[Any] = []  # None where NVML could not give a handle for that index
        self._handle_errors: dict[int, str] = {}
        self._tried = False
        self.available = False
        self.why = "not probed yet"

    def _init(self) -> None:
        if self._tried:
            return
        self._tried = True
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [self._handle(pynvml, i) for i in range(count)]
        except ImportError as exc:
            self.why = f"no GPU: pynvml not installed ({exc})"
            return
        except Exception as exc:  # pynvml.NVMLError and its per-code subclasses
            self.why = f"no GPU: NVML unavailable ({describe_nvml_error(exc)})"
            return
        self._nvml = pynvml
        self.available = any(h is not None for h in self._handles)
        self.why = f"{count} GPU(s) via NVML" if count else "no GPU: NVML sees 0 devices"

    def _handle(self, nvml: Any, index: int) -> Any:
        """One GPU's handle; a GPU that cannot be reached is noted, not fatal to the others."""
        try:
            return nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # pynvml.NVMLError and its per-code subclasses
            self._handle_errors[index] = describe_nvml_error(exc)
            return None

    def sample(self) -> list[GpuSample]:
        """One sample per GPU; empty when there is no GPU."""
        with self._lock:
            self._init()
            if not self.available:
                return []
            nvml = self._nvml
            samples = []
            for index, handle in enumerate(self._handles):
                if handle is None:
                    continue
                try:
                    util = nvml.nvmlDeviceGetUtilizationRates(handle)
                    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                    name = nvml.nvmlDeviceGetName(handle)
                except Exception:  # a GPU fallen off the bus: leave it out of this sample
                    continue
                samples.append(GpuSample(index, name if isinstance(name, str) else name.decode(),
                                         int(util.gpu), int(mem.used), int(mem.total)))
            return samples


    def inventory(self) -> GpuInventory:
        """Every GPU NVML counts: reachable (handle and memory info), memory used, compute processes on it."""
        with self._lock:
            self._init()
            if self._nvml is None:
                return GpuInventory(False, self.why)
            return GpuInventory(True, self.why, tuple(self._device(i, h) for i, h in enumerate(self._handles)))

    def _device(self, index: int, handle: Any) -> GpuDevice:
        nvml = self._nvml
        if handle is None:
            return GpuDevice(index, error=f"no handle: {self._handle_errors.get(index, 'unknown error')}")
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
        except Exception as exc:  # fallen off the bus, Xid error, reset in progress
            return GpuDevice(index, error=f"memory info unreadable: {describe_nvml_error(exc)}")
        processes: tuple[int, ...] | None
        try:
            processes = tuple(int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:  # not supported on this GPU or driver: the memory figure still tells
            processes = None
        return GpuDevice(index, name if isinstance(name, str) else name.decode(), int(mem.total), int(mem.used),
                         processes)


def describe_nvml_error(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def activity_changed(before: list[GpuSample], after: list[GpuSample]) -> bool:
    """Did any GPU work between two samples: non-zero utilisation or a change of memory use."""
    previous = {s.index: s for s in before}
    for sample in after:
        if sample.utilization > 0:
            return True
        old = previous.get(sample.index)
        if old is not None and old.memory_used != sample.memory_used:
            return True
    return False
