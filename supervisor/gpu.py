"""GPU evidence through NVML (``import pynvml``, from nvidia-ml-py), loaded lazily.

Used for stall detection (did any GPU's utilisation or memory use change?) and
for the status view. Where NVML is absent (no driver, no GPU, a dev machine)
the answer is "no GPU", said once, never an error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


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
        self._handles: list[Any] = []
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
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except ImportError as exc:
            self.why = f"no GPU: pynvml not installed ({exc})"
            return
        except Exception as exc:  # pynvml.NVMLError and its per-code subclasses
            self.why = f"no GPU: NVML unavailable ({describe_nvml_error(exc)})"
            return
        self._nvml = pynvml
        self.available = bool(self._handles)
        self.why = f"{count} GPU(s) via NVML" if count else "no GPU: NVML sees 0 devices"

    def sample(self) -> list[GpuSample]:
        """One sample per GPU; empty when there is no GPU."""
        with self._lock:
            self._init()
            if not self.available:
                return []
            nvml = self._nvml
            samples = []
            for index, handle in enumerate(self._handles):
                try:
                    util = nvml.nvmlDeviceGetUtilizationRates(handle)
                    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                    name = nvml.nvmlDeviceGetName(handle)
                except Exception:  # a GPU fallen off the bus: leave it out of this sample
                    continue
                samples.append(GpuSample(index, name if isinstance(name, str) else name.decode(),
                                         int(util.gpu), int(mem.used), int(mem.total)))
            return samples


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
