"""GPU evidence as plain records, and the NVML calls that gather it (``import pynvml``, nvidia-ml-py).

Used for stall detection (did any GPU's utilisation or memory use change?), for the status view,
for cuzk.toml and resume (which GPUs), and for the fitness check before anything starts
(``inventory_of``: is every GPU reachable, and free of other processes?). Where NVML is absent (no
driver, no GPU, a dev machine) the answer is "no GPU", said once, never an error.

The functions that call NVML (``open_nvml``, ``sample_all``, ``inventory_of``) run only on the one
GPU thread (supervisor/evidence/gpuwatch.py), each call through its ``Caller``, which times it: an NVML
call can hang (Xid 119, a crashed driver), and the loop must never be the one waiting.

NVML's answers are trusted no further than they are checked: a count no machine has (MAX_GPUS) is no
GPU, said; a value of the wrong type or out of bounds (utilisation "n/a", a memory info of None) is no
reading of that GPU, never an exception that ends the thread; a name is cut to GPU_NAME_CHARS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..text.show import one_line, shown

# call(name, gpu_index or None, function, *args): makes one NVML call, timed by the GPU thread.
Caller = Callable[..., Any]
# The most GPUs a machine has (NVML itself supports 64 per host): a count above it is NVML's mistake.
MAX_GPUS = 64
# A GPU's name as NVML gives it at most (NVML_DEVICE_NAME_V2_BUFFER_SIZE); a longer one is cut.
GPU_NAME_CHARS = 96
# The most memory one GPU can report (16 TiB; an H200 has 141 GiB): more is no reading.
MAX_GPU_MEMORY = 1 << 44
# Compute processes read from one GPU at most (a list of millions is no list).
MAX_GPU_PROCESSES = 1024
# A bad answer of one GPU: (index, why); the GPU thread counts it as no reading of that GPU.
BadReading = Callable[[int, str], None]
# A GPU whose answer was no reading is asked again this much later, in the same round: one bad answer must not
# leave it out of the reading that cuzk.toml, resume's fingerprint and status read (the first round is all they
# have where nothing samples again). Only one that fails again is left out. So is a GPU's handle at the opening:
# one that NVML did not give at the first ask left the GPU out for the whole run, and the fitness check refused it.
GPU_RETRY_S = 0.2


class BadAnswer(ValueError):
    """An answer of NVML that is no answer: the wrong type, out of bounds."""


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
    utilization: int | None  # percent, last sample period; None: NVML does not measure it here (a MIG GPU)
    memory_used: int  # bytes
    memory_total: int  # bytes


@dataclass(frozen=True)
class GpuReading:
    """One sample of every GPU, as the GPU thread published it: ``at`` (monotonic) when, ``seq`` its number."""

    seq: int
    at: float
    samples: tuple[GpuSample, ...]
    left_out: tuple[tuple[int, str], ...] = ()  # (index, why) of each GPU NVML counts that is not in ``samples``


@dataclass
class Nvml:
    """NVML, opened: the module, one handle per GPU index (None where NVML gave none) and each GPU's name;
    ``lost``: the GPUs whose handle NVML refused with its word that they are gone (lost_at_opening)."""

    module: Any
    handles: list[Any]
    names: list[str]
    handle_errors: dict[int, str]
    lost: dict[int, Exception] = field(default_factory=dict)

    @property
    def reachable(self) -> bool:
        return any(h is not None for h in self.handles)


def open_nvml(call: Caller, pause: Callable[[float], None] = time.sleep) -> tuple[Nvml | None, str]:
    """NVML initialised, every GPU's handle and name; (None, why) where there is no NVML. A handle NVML does not
    give is asked again GPU_RETRY_S later (``pause``), unless NVML said the GPU is gone (``Nvml.lost``)."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"no GPU: pynvml not installed ({exc})"
    try:
        call("nvmlInit", None, pynvml.nvmlInit)
        answer = call("nvmlDeviceGetCount", None, pynvml.nvmlDeviceGetCount)
    except Exception as exc:  # pynvml.NVMLError and its per-code subclasses
        return None, f"no GPU: NVML unavailable ({describe_nvml_error(exc)})"
    if isinstance(answer, bool) or not isinstance(answer, int) or answer < 0:
        return None, f"no GPU: NVML's device count is no number ({shown(answer, 40)})"
    if answer > MAX_GPUS:
        return None, f"no GPU: NVML counts {answer} GPUs, more than any machine has (at most {MAX_GPUS})"
    count = answer
    nvml = Nvml(pynvml, [], [], {})
    for index in range(count):
        handle, name = None, ""
        for last_try in (False, True):
            try:
                handle = call("nvmlDeviceGetHandleByIndex", index, pynvml.nvmlDeviceGetHandleByIndex, index)
                nvml.handle_errors.pop(index, None)
                break
            except Exception as exc:  # a GPU that cannot be reached is noted, not fatal to the others
                nvml.handle_errors[index] = describe_nvml_error(exc)
                if lost_at_opening(exc) and (last_try or type(exc).__name__ not in LOST_IF_AGAIN):
                    nvml.lost[index] = exc
                    break
                if not last_try:
                    pause(GPU_RETRY_S)
        if handle is not None:
            try:
                name = _text(call("nvmlDeviceGetName", index, pynvml.nvmlDeviceGetName, handle))
            except Exception:  # nameless, still sampled: what it does is what counts
                name = ""
        nvml.handles.append(handle)
        nvml.names.append(name)
    return nvml, f"{count} GPU(s) via NVML" if count else "no GPU: NVML sees 0 devices"


def sample_all(nvml: Nvml, call: Caller, lost: Callable[[int, Exception], None] | None = None,
               bad: BadReading | None = None, pause: Callable[[float], None] = time.sleep) -> tuple[GpuSample, ...]:
    """One sample per reachable GPU; a GPU fallen off the bus is left out of this sample (and told to ``lost``;
    for NVML's Unknown Error, only when it answers so twice: LOST_IF_AGAIN), as is one whose answer is no reading
    twice, GPU_RETRY_S apart (told to ``bad``): whatever NVML answers, never an exception. A GPU whose utilisation
    NVML does not measure (NotSupported: MIG mode on) is sampled by its memory alone: left out, it would be left
    out of cuzk.toml's devices and the machine's fingerprint too."""
    samples: dict[int, GpuSample] = {}
    asking = [index for index, handle in enumerate(nvml.handles) if handle is not None]
    for last_try in (False, True):
        failed: list[int] = []
        for index in asking:
            try:
                samples[index] = _sample(nvml, index, nvml.handles[index], call)
            except Exception as exc:  # lost, reset in progress, an answer that is none
                gone = is_lost_error(exc) and (last_try or type(exc).__name__ not in LOST_IF_AGAIN)
                if gone and lost is not None:
                    lost(index, exc)
                if gone or last_try:  # (a lost GPU is asked no more: it does not come back)
                    if bad is not None:  # a lost GPU too: no reading of it
                        bad(index, describe_nvml_error(exc))
                else:
                    failed.append(index)
        if not failed:
            break
        pause(GPU_RETRY_S)
        asking = failed
    return tuple(samples[index] for index in sorted(samples))


def _sample(nvml: Nvml, index: int, handle: Any, call: Caller) -> GpuSample:
    mem = call("nvmlDeviceGetMemoryInfo", index, nvml.module.nvmlDeviceGetMemoryInfo, handle)
    total = bounded(getattr(mem, "total", None), MAX_GPU_MEMORY, "memory.total")
    used = bounded(getattr(mem, "used", None), total, "memory.used")
    return GpuSample(index, nvml.names[index], _utilization(nvml, index, handle, call), used, total)


def _utilization(nvml: Nvml, index: int, handle: Any, call: Caller) -> int | None:
    """The GPU's utilisation in percent; None where NVML says it does not measure it (NotSupported)."""
    try:
        util = call("nvmlDeviceGetUtilizationRates", index, nvml.module.nvmlDeviceGetUtilizationRates, handle)
    except Exception as exc:
        if type(exc).__name__ == "NVMLError_NotSupported":
            return None
        raise
    return bounded(getattr(util, "gpu", None), 100, "utilization.gpu")


def bounded(value: Any, most: int, what: str) -> int:
    """``value`` as a whole number from 0 to ``most``; BadAnswer otherwise (NVML's word is checked, not trusted)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise BadAnswer(f"{what} is {shown(value, 40)}, not a whole number from 0 to {most}")
    return value


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
        total = bounded(getattr(mem, "total", None), MAX_GPU_MEMORY, "memory.total")
        used = bounded(getattr(mem, "used", None), total, "memory.used")
    except Exception as exc:  # fallen off the bus, Xid error, reset in progress, an answer that is none
        return GpuDevice(index, error=f"memory info unreadable: {describe_nvml_error(exc)}")
    processes: tuple[int, ...] | None
    try:
        listed = call("nvmlDeviceGetComputeRunningProcesses", index,
                      nvml.module.nvmlDeviceGetComputeRunningProcesses, handle)
        processes = tuple(int(p.pid) for p in list(listed)[:MAX_GPU_PROCESSES])
    except Exception:  # not supported on this GPU or driver (or no list): the memory figure still tells
        processes = None
    return GpuDevice(index, nvml.names[index], total, used, processes)


def _text(name: Any) -> str:
    """A GPU's name, printable and at most GPU_NAME_CHARS (a 5 MB name must not make status 10 MB)."""
    if not isinstance(name, str | bytes | bytearray):
        raise BadAnswer(f"a name of {type(name).__name__}")
    text = name if isinstance(name, str) else bytes(name[:GPU_NAME_CHARS * 4]).decode(errors="replace")
    return "".join(c if c.isprintable() else "?" for c in text[:GPU_NAME_CHARS])


def describe_nvml_error(exc: Exception) -> str:
    text = one_line(exc, 200) or type(exc).__name__  # (a binding's own error may say anything, of any size)
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def activity_changed(before: list[GpuSample] | tuple[GpuSample, ...],
                     after: list[GpuSample] | tuple[GpuSample, ...]) -> bool:
    """Did any GPU work between two samples: non-zero utilisation or a change of memory use (alone where the
    utilisation is not measured)."""
    previous = {s.index: s for s in before}
    for sample in after:
        if sample.utilization:
            return True
        old = previous.get(sample.index)
        if old is not None and old.memory_used != sample.memory_used:
            return True
    return False


# ---------------------------------------------------------------- GPU health: Xid events, lost GPUs (the GPU thread)

# Xids that are the application's fault, not the GPU's: NVIDIA's device plugin (internal/rm/health.go) marks
# a GPU unhealthy for every other Xid.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
XID_NAMES = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remapper failure",
    68: "video processor exception", 74: "NVLink error", 79: "fallen off the bus", 92: "high single-bit ECC rate",
    94: "contained ECC error", 95: "uncontained ECC error", 109: "context switch timeout", 119: "GSP RPC timeout",
}
# nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]) on recent drivers.
FI_RECOVERY_ACTION = 230
RECOVERY_ACTIONS = {0: "none", 1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset"}
# The field is the GPU's state, not the Xid's: one that needs a reset or a reboot (which no container can make) is
# of no more use to this one, whichever Xid came first, an application's fault included.
RECOVERY_NEEDS_RESET = frozenset({1, 2, 4})
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


@dataclass(frozen=True)
class GpuFault:
    """What the GPU thread found wrong with a GPU: an Xid event (``xid``), or the GPU lost (``xid`` None)."""

    index: int | None  # None: NVML itself (every GPU)
    xid: int | None
    detail: str  # for a lost GPU: NVML's error
    recovery: int | None = None  # the driver's recovery action, where it has the field

    @property
    def fatal(self) -> bool:
        return self.xid is None or self.xid not in APPLICATION_XIDS or self.recovery in RECOVERY_NEEDS_RESET

    def describe(self) -> str:
        """``GPU 0: Xid 79 (fallen off the bus); recovery action: node reboot``."""
        who = "NVML" if self.index is None else f"GPU {self.index}"
        if self.xid is None:
            what = f"lost ({self.detail})"
        else:
            what = f"Xid {self.xid} ({XID_NAMES.get(self.xid, 'see NVIDIA Xid catalog')})"
            if not self.fatal:
                what += ": an application fault, not the GPU's"
            elif self.xid in APPLICATION_XIDS:  # (its recovery action, said after, made it the GPU's)
                what += ": an application fault, on a GPU that needs recovering"
        if self.recovery is not None:
            what += f"; recovery action: {RECOVERY_ACTIONS.get(self.recovery, f'code {self.recovery}')}"
        return f"{who}: {what}"


# NVML's words that a GPU (or NVML itself) is gone, for this container: GPU is lost; "Unknown Error" after a host
# reload; NotFound or GpuNotFound from a GPU that answered before (gone from the driver's view); ResetRequired
# (it needs a reset no container can make); DriverNotLoaded (the driver unloaded under us).
LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_Unknown", "NVMLError_NotFound", "NVMLError_GpuNotFound",
               "NVMLError_ResetRequired", "NVMLError_DriverNotLoaded")


# Of those, the one NVML also gives for whatever it cannot name: a GPU is called lost for it only when the same GPU
# answers it again, GPU_RETRY_S later (a host reload's stays; a one-off must not give up the instance).
LOST_IF_AGAIN = ("NVMLError_Unknown",)


def is_lost_error(exc: Exception) -> bool:
    """NVML's word that a GPU (or NVML itself) is gone (LOST_ERRORS)."""
    return type(exc).__name__ in LOST_ERRORS


def lost_at_opening(exc: Exception) -> bool:
    """NVML's word, as it gives a GPU's handle, that the GPU is gone: not its NotFound, which from a GPU that never
    answered may only mean an index NVML counts and cannot reach, nor Driver Not Loaded, a fault only once the
    driver had answered (docs/verdicts.md): such a GPU is left out, with why, and no fault."""
    return is_lost_error(exc) and type(exc).__name__ not in (
        "NVMLError_NotFound", "NVMLError_GpuNotFound", "NVMLError_DriverNotLoaded")
