"""The GPU thread's Xid side: NVML's event set opened once, waited on between samples, every answer contained.

An Xid critical error (79: fallen off the bus, 48: double-bit ECC...) comes as an NVML event; a GPU (or NVML)
that answers it is lost comes from the samples. Both become a ``GpuFault`` that the loop's GPU health
(gpuhealth.py) takes and decides on. What the event API answers is trusted no further than checked:

- event data that is no event (garbage types, an Xid beyond any code) is one bad reading, counted on the
  watch's state (watchstate.py), never an exception that ends the thread; an event API that fails is
  tried again after EVENT_RETRY_S, and blind past its window is said;
- a wait that returns at once with no event (a driver that ignores the timeout) is padded to EVENT_FLOOR_S:
  never a spin; an event storm is taken at most one event per EVENT_STORM_FLOOR_S, and what the loop has
  not taken is kept to FAULTS_MAX faults and a count of the rest.

Only the GPU thread (gpuwatch.py) calls this module's functions; ``take`` is the loop's side.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..text.show import shown
from .gpu import (
    FI_RECOVERY_ACTION,
    XID_CRITICAL,
    BadAnswer,
    Caller,
    GpuFault,
    Nvml,
    bounded,
    describe_nvml_error,
    is_lost_error,
)
from .watchstate import WatchState, said_error

# A wait that returned with no event sooner than this is padded to it (a wait that ignores its timeout).
EVENT_FLOOR_S = 0.05
# After a wait that failed (not a timeout, not a lost GPU) the next one comes this much later.
EVENT_RETRY_S = 1.0
# Between two events at least this long: an Xid storm (thousands a second) costs the thread little.
EVENT_STORM_FLOOR_S = 0.002
# Faults kept for the loop to take; past it, only counted (by GPU and Xid).
FAULTS_MAX = 1000
# A fault whose recovery action is being read waits for it this long at most before the loop takes it without:
# the read takes milliseconds, and a tick that took the fault in between said it without its action.
RECOVERY_WAIT_S = 1.0
# The largest Xid code believed (NVIDIA's catalog is in the low hundreds).
MAX_XID = 0xFFFF


class XidWatch:
    """The Xid event set of the GPU thread, and the faults found (by its events and its samples)."""

    def __init__(self, blind_s: float, pause: Callable[[float], None]) -> None:
        self.state = WatchState("GPU Xid events", blind_s)
        self.state.idle("Xid events not watched")
        self.why = "Xid events not watched"
        self.events: Any = None
        self.tried = False
        self._pause = pause
        self._lock = threading.Lock()
        self._faults: list[GpuFault] = []
        self._asking: tuple[GpuFault, float] | None = None  # the fault whose recovery action is being read, since
        self._dropped: Counter[tuple[int | None, int | None]] = Counter()
        self._lost: set[int | None] = set()  # (the thread's) GPUs told lost already (None: NVML itself)

    def open(self, nvml: Nvml, call: Caller) -> None:
        """Open the event set (once); without one, health rests on the sampling (said in ``why``)."""
        self.tried = True
        if nvml.reachable:
            self.events, self.why = open_events(nvml, call)
        if self.events is None:
            self.state.stop(self.why)
        else:
            self.state.wake()

    def wait(self, nvml: Nvml, wait_s: float, call: Caller) -> None:
        """One bounded wait for an Xid; whatever comes back, the watch goes on (never a spin)."""
        if wait_s < 0.01 or self.events is None:
            return  # a sample is due: it comes first
        started = time.monotonic()
        try:
            fault = wait_event(nvml, self.events, int(wait_s * 1000), call)
        except Exception as exc:  # a lost NVML, an event API that broke, an answer that is none
            if is_lost_error(exc):
                self.lost(None, exc)
                self.events, self.why = None, f"Xid events no longer watched: {describe_nvml_error(exc)}"
                self.state.stop(self.why)
                return
            self.state.miss(f"nvmlEventSetWait_v2: {said_error(exc)}")
            self._pause(EVENT_RETRY_S - (time.monotonic() - started))
            return
        self.state.read()
        if fault is not None:
            # In hand before its recovery action is asked: NVML may never answer that (it hangs after a driver
            # crash), and the fault must reach the loop whatever it does.
            self.found(fault, asking=True)
            try:
                self._add_recovery(nvml, fault, call)
            finally:
                with self._lock:
                    self._asking = None
        floor = EVENT_FLOOR_S if fault is None else EVENT_STORM_FLOOR_S
        self._pause(floor - (time.monotonic() - started))

    def lost(self, index: int | None, exc: Exception) -> None:
        """A GPU (None: NVML itself) answered that it is lost: told once."""
        if index not in self._lost:
            self._lost.add(index)
            self.found(GpuFault(index, None, describe_nvml_error(exc)))

    def _add_recovery(self, nvml: Nvml, fault: GpuFault, call: Caller) -> None:
        """The driver's recovery action, added to ``fault`` while the loop has not taken it (it waits for the read,
        RECOVERY_WAIT_S at most: ``take``); one taken before (a read that hung) is said without it, unless the
        action makes it fatal (an application's Xid on a GPU that now needs a reset): then it is handed again."""
        handle = nvml.handles[fault.index] if fault.index is not None else None
        action = recovery_action(nvml, fault.index, handle, call)
        if action is None:
            return
        known = replace(fault, recovery=action)
        with self._lock:
            for i, kept in enumerate(self._faults):
                if kept is fault:
                    self._faults[i] = known
                    return
        if known.fatal and not fault.fatal:
            self.found(known)

    def found(self, fault: GpuFault, asking: bool = False) -> None:
        """``asking``: its recovery action is read next (in the same hold of the lock: a take in between said the
        fault without it)."""
        with self._lock:
            if len(self._faults) < FAULTS_MAX:
                self._faults.append(fault)
                if asking:
                    self._asking = (fault, time.monotonic())
            else:
                self._dropped[(fault.index, fault.xid)] += 1

    def take(self, wait_for_recovery: bool = True) -> tuple[list[GpuFault], dict[tuple[int | None, int | None], int]]:
        """(the loop's side) The faults found since the last call, and how many more of each were only counted; but
        the one whose recovery action is being read, and those after it, for RECOVERY_WAIT_S at most (unless
        ``wait_for_recovery`` is False: a start that a fatal one refuses is not held back for a line's detail)."""
        with self._lock:
            faults, self._faults = self._faults, []
            asking = self._asking
            if wait_for_recovery and asking is not None and time.monotonic() - asking[1] < RECOVERY_WAIT_S:
                cut = next((i for i, fault in enumerate(faults) if fault is asking[0]), len(faults))
                faults, self._faults = faults[:cut], faults[cut:]
            dropped, self._dropped = dict(self._dropped), Counter()
        return faults, dropped


def open_events(nvml: Nvml, call: Caller) -> tuple[Any, str]:
    """An event set with Xid critical errors registered on every GPU that supports them: (set or None, why)."""
    module = nvml.module
    try:
        events = call("nvmlEventSetCreate", None, module.nvmlEventSetCreate)
    except Exception as exc:  # an old driver, no event support: health then rests on the sampling alone
        return None, f"no Xid events: {describe_nvml_error(exc)}"
    registered = []
    for index, handle in enumerate(nvml.handles):
        if handle is None:
            continue
        try:
            supported = int(call("nvmlDeviceGetSupportedEventTypes", index,
                                 module.nvmlDeviceGetSupportedEventTypes, handle))
            if supported & XID_CRITICAL:
                call("nvmlDeviceRegisterEvents", index, module.nvmlDeviceRegisterEvents, handle, XID_CRITICAL, events)
                registered.append(index)
        except Exception:  # not supported on this GPU: its sampling still tells a lost one
            continue
    if not registered:
        return events, "no Xid events: no GPU supports them"
    return events, f"Xid events watched on GPU {', '.join(map(str, registered))}"


def wait_event(nvml: Nvml, events: Any, timeout_ms: int, call: Caller) -> GpuFault | None:
    """The next Xid within ``timeout_ms`` (None: none came), without its recovery action (asked apart:
    recovery_action). A lost GPU or NVML raises (is_lost_error); the caller decides."""
    module = nvml.module
    try:
        data = call("nvmlEventSetWait_v2", None, module.nvmlEventSetWait_v2, events, timeout_ms)
    except Exception as exc:
        if type(exc).__name__ == "NVMLError_Timeout":
            return None
        raise
    event_type = getattr(data, "eventType", None)
    if isinstance(event_type, bool) or not isinstance(event_type, int):
        raise BadAnswer(f"event data of no type ({shown(event_type, 40)})")
    if not event_type & XID_CRITICAL:
        return None
    xid = bounded(getattr(data, "eventData", None), MAX_XID, "the Xid")
    return GpuFault(_index_of(nvml, getattr(data, "device", None)), xid, "")


def recovery_action(nvml: Nvml, index: int | None, handle: Any, call: Caller) -> int | None:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION of the GPU; None where the driver has no such field."""
    if handle is None:
        return None
    try:
        values = call("nvmlDeviceGetFieldValues", index, nvml.module.nvmlDeviceGetFieldValues, handle,
                      [FI_RECOVERY_ACTION])
        value = values[0]
        return int(value.value.uiVal) if int(value.nvmlReturn) == 0 else None
    except Exception:  # an older driver: no such field
        return None


def _index_of(nvml: Nvml, device: Any) -> int | None:
    """The index of the GPU an event names (its handle, compared by address as NVML's handles are)."""
    for index, handle in enumerate(nvml.handles):
        if handle is not None and _same_handle(handle, device):
            return index
    return None


def _same_handle(a: Any, b: Any) -> bool:
    """NVML hands out one handle per GPU: an event's device is the same pointer."""
    try:
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        try:
            return bool(a == b)
        except Exception:  # an event's garbage device compares to nothing
            return False
