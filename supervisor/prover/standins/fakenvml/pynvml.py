"""A stand-in of nvidia-ml-py's ``pynvml``: the real names, constants, return shapes and error classes.

With this directory first on ``PYTHONPATH``, ``import pynvml`` gets this module. Its GPUs and misbehaviour
come from the JSON control file ``$STANDIN_NVML_CONTROL``, read on every call. Every key is optional:

``gpus`` (list; default: one idle "NVIDIA H200"): one object a GPU: ``name``, ``memory_total`` and
    ``memory_used`` (bytes), ``utilization``, ``memory_utilization`` (percent), ``processes`` (pids on it),
    ``mig`` (true: MIG mode on, so its utilisation calls raise ``NVMLError_NotSupported`` as a real one's do).
``hang_s`` (seconds, default 0): every call blocks this long, like NVML under Xid 119 (about 45 s a call)
    or after a driver crash (forever: a large number). Lowering or removing it ends a hang under way.
``hang_calls`` (list of function names): only these calls hang; without it, every call.
``init_error`` (an error class's suffix: ``"Unknown"``, ``"LibraryNotFound"``, ``"DriverNotLoaded"``)
    ``nvmlInit`` raises ``NVMLError_<suffix>`` ("Unknown Error" after a host ``systemctl daemon-reload``).
``lost`` (GPU indexes): every call about those GPUs raises ``NVMLError_GpuIsLost`` (fallen off the bus).
``xid`` (list of ``{"gpu": index, "xid": code}``): Xid errors, each delivered once (per process) to a set for it.
``recovery_action`` (a number, or ``{"<gpu index>": number}``)
    What field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) reads; without it: NOT_SUPPORTED (an older driver).
``log`` (a path): each call appends ``<function> <thread name>``: which thread made which NVML call.
``garbage`` (function names): those calls answer the wrong type: utilisation ``gpu = "n/a"``, memory info
    None, count ``"n/a"``, name None, event data of garbage. ``device_count``: what ``nvmlDeviceGetCount`` says.
``not_found`` (GPU indexes): their calls raise ``NVMLError_NotFound``. ``errors`` (``{"<gpu index>": suffix}``):
    every call about that GPU raises ``NVMLError_<suffix>`` (``"ResetRequired"``, ``"GpuNotFound"``, any of the
    real module's). ``flaky`` (list of ``{"gpu", "call", "error", "times"}``): the first ``times`` (default 1)
    calls of ``call`` about that GPU in this process raise ``NVMLError_<error>``, the later ones answer (a GPU
    that answers badly once). ``xid_storm`` (``{"gpu", "xid"}``): every
    wait returns that Xid at once. ``wait_at_once`` (``"none"``, ``"timeout"``): it returns at once, no event.

Without the variable or the file, the machine has the default GPU; a file that is not a JSON object makes
every call raise ``NVMLError_Unknown`` (said on stderr). Calls before ``nvmlInit`` raise ``NVMLError_Uninitialized``.
"""

from __future__ import annotations

import json
import os
import string
import sys
import threading
import time
from ctypes import POINTER, Structure, Union, c_double, c_int64, c_uint, c_uint32, c_ulong, c_ulonglong, pointer
from typing import Any, ClassVar

CONTROL_ENV = "STANDIN_NVML_CONTROL"
# How often a hanging call looks at the control file again (so a test can shorten the hang).
HANG_RECHECK_S = 0.05
MIB = 1 << 20
DEFAULT_GPU = {"name": "NVIDIA H200", "memory_total": 143771 * MIB, "memory_used": 521 * MIB,
               "utilization": 0, "memory_utilization": 0, "processes": []}

# ---------------------------------------------------------------- the real module's constants

NVML_SUCCESS = 0
# The codes 1 to 21, in the real module's order ...
(NVML_ERROR_UNINITIALIZED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION,
 NVML_ERROR_ALREADY_INITIALIZED, NVML_ERROR_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INSUFFICIENT_POWER,
 NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_TIMEOUT, NVML_ERROR_IRQ_ISSUE, NVML_ERROR_LIBRARY_NOT_FOUND,
 NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_CORRUPTED_INFOROM, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED,
 NVML_ERROR_OPERATING_SYSTEM, NVML_ERROR_LIB_RM_VERSION_MISMATCH, NVML_ERROR_IN_USE, NVML_ERROR_MEMORY,
 NVML_ERROR_NO_DATA) = range(1, 22)
# ... and 22 to 30 (nvidia-ml-py 12+), which its string table leaves out ("NVML Error with code 28").
(NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, NVML_ERROR_INSUFFICIENT_RESOURCES, NVML_ERROR_FREQ_NOT_SUPPORTED,
 NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_DEPRECATED, NVML_ERROR_NOT_READY, NVML_ERROR_GPU_NOT_FOUND,
 NVML_ERROR_INVALID_STATE, NVML_ERROR_RESET_TYPE_NOT_SUPPORTED) = range(22, 31)
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96

NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset
NVML_VALUE_TYPE_UNSIGNED_INT = 1

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypeNone = 0x0000000000000000
nvmlEventTypeAll = (nvmlEventTypeNone | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError
                    | nvmlEventTypePState | nvmlEventTypeClock | nvmlEventTypeXidCriticalError)

# ---------------------------------------------------------------- errors, built as the real module builds them


class NVMLError(Exception):
    """``NVMLError(code)`` returns the per-code subclass (``NVMLError_Timeout`` for NVML_ERROR_TIMEOUT)."""

    value: int
    _valClassMapping: ClassVar[dict[int, type]] = {}
    _errcode_to_string: ClassVar[dict[int, str]] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized", NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size", NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue", NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found", NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost", NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory", NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(cls, value: int) -> NVMLError:
        if cls == NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:  # as the real one: by code (which makes it unhashable, as there)
        return self.value == other.value  # type: ignore[attr-defined]


def _extractNVMLErrorsAsClasses() -> None:
    """One subclass a code, named as the real module names them: NVML_ERROR_GPU_IS_LOST → NVMLError_GpuIsLost."""
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val: int) -> Any:
            def new(typ: type, *args: object) -> NVMLError:
                return NVMLError.__new__(typ, val)
            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


def nvmlExceptionClass(nvmlErrorCode: int) -> type:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


# ---------------------------------------------------------------- the real module's structures


class struct_c_nvmlDevice_t(Structure):
    _fields_ = [("index", c_uint)]  # opaque in the real library; here it says which GPU


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)


class struct_c_nvmlEventSet_t(Structure):
    _fields_ = [("id", c_uint)]


c_nvmlEventSet_t = POINTER(struct_c_nvmlEventSet_t)


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class c_nvmlEventData_t(Structure):
    _fields_ = [("device", c_nvmlDevice_t), ("eventType", c_ulonglong), ("eventData", c_ulonglong),
                ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint)]


class c_nvmlValue_t(Union):
    _fields_ = [("dVal", c_double), ("uiVal", c_uint), ("ulVal", c_ulong), ("ullVal", c_ulonglong), ("sllVal", c_int64)]


class c_nvmlFieldValue_t(Structure):
    _fields_ = [("fieldId", c_uint32), ("scopeId", c_uint32), ("timestamp", c_int64), ("latencyUsec", c_int64),
                ("valueType", c_uint), ("nvmlReturn", c_uint), ("value", c_nvmlValue_t)]


class nvmlFriendlyObject:
    def __init__(self, dictionary: dict[str, Any]) -> None:
        self.__dict__.update(dictionary)

    def __str__(self) -> str:
        return self.__dict__.__str__()


# ---------------------------------------------------------------- the control file, hangs and failures

_lock = threading.Lock()
_init_count = 0
_xid_delivered = 0  # how many of the control file's xid events this process has handed out
_flaky_raised: dict[int, int] = {}  # the control's ``flaky`` entry (its place) → how often it has raised here
_event_sets: dict[int, dict[int, int]] = {}  # event set id → GPU index → registered event mask
_handles: dict[int, Any] = {}  # GPU index → its handle: one per GPU, as the real library hands out


def _control() -> dict[str, Any]:
    path = os.environ.get(CONTROL_ENV)
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        print(f"stand-in pynvml: cannot read {path}: {exc}", file=sys.stderr, flush=True)
        raise NVMLError(NVML_ERROR_UNKNOWN) from None
    if not isinstance(data, dict):
        print(f"stand-in pynvml: {path} is not a JSON object", file=sys.stderr, flush=True)
        raise NVMLError(NVML_ERROR_UNKNOWN)
    return data


def _hangs(control: dict[str, Any], call: str) -> float:
    calls = control.get("hang_calls")
    return 0.0 if calls is not None and call not in calls else float(control.get("hang_s") or 0)


def _enter(call: str, index: int | None = None, *, needs_init: bool = True) -> dict[str, Any]:
    """Every call starts here: logged, hung as the control file says, refused when uninitialised or lost."""
    control = _control()
    if control.get("log"):
        with open(control["log"], "a") as f:
            f.write(f"{call} {threading.current_thread().name}\n")
    started = time.monotonic()
    while time.monotonic() - started < _hangs(control, call):
        time.sleep(HANG_RECHECK_S)
        control = _control()  # lowered or removed: the hang ends early
    if needs_init and _init_count == 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    for key, code in (("lost", NVML_ERROR_GPU_IS_LOST), ("not_found", NVML_ERROR_NOT_FOUND)):
        if index is not None and index in (control.get(key) or []):
            raise NVMLError(code)
    errors = control.get("errors")
    if index is not None and isinstance(errors, dict) and str(index) in errors:
        _raise_named(errors[str(index)])
    for place, flaky in enumerate(control.get("flaky") or []):
        if index is not None and flaky.get("gpu", 0) == index and flaky.get("call") == call:
            with _lock:
                raised = _flaky_raised.get(place, 0)
                if raised < int(flaky.get("times", 1)):
                    _flaky_raised[place] = raised + 1
                    _raise_named(flaky.get("error", "Unknown"))
    return control


def _raise_named(suffix: object) -> None:
    """``NVMLError_<suffix>`` (``NVMLError_Unknown`` where the real module has no such class)."""
    cls = getattr(sys.modules[__name__], f"NVMLError_{suffix}", None)
    if isinstance(cls, type) and issubclass(cls, NVMLError):
        raise cls()  # type: ignore[call-arg]  # (a per-code class takes no argument: its code is its own)
    raise NVMLError(NVML_ERROR_UNKNOWN)


def _count(control: dict[str, Any]) -> int:
    count = control.get("device_count")
    return int(count) if isinstance(count, int) else len(_gpus(control))


def _gpus(control: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = control.get("gpus")
    return [{**DEFAULT_GPU, **g} for g in gpus] if isinstance(gpus, list) else [dict(DEFAULT_GPU)]


def _gpu(handle: Any, call: str) -> dict[str, Any]:
    return _gpu_call(handle, call)[0]


def _gpu_call(handle: Any, call: str) -> tuple[dict[str, Any], bool]:
    """The GPU a handle names, and whether this call answers garbage (the control's ``garbage``)."""
    index = int(handle.contents.index)
    control = _enter(call, index)
    gpus = _gpus(control)
    if index >= _count(control):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)  # it was there when the handle was taken
    return (gpus[index] if index < len(gpus) else dict(DEFAULT_GPU)), call in (control.get("garbage") or [])


# ---------------------------------------------------------------- the calls


def nvmlInit() -> None:
    global _init_count
    control = _enter("nvmlInit", needs_init=False)
    error = control.get("init_error")
    if error:
        _raise_named(error)
    with _lock:
        _init_count += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _init_count
    _enter("nvmlShutdown")
    with _lock:
        _init_count = max(0, _init_count - 1)


def nvmlDeviceGetCount() -> Any:
    control = _enter("nvmlDeviceGetCount")
    return "n/a" if "nvmlDeviceGetCount" in (control.get("garbage") or []) else _count(control)


def nvmlDeviceGetHandleByIndex(index: int) -> Any:
    control = _enter("nvmlDeviceGetHandleByIndex", index)
    if not 0 <= index < _count(control):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    with _lock:
        return _handles.setdefault(index, pointer(struct_c_nvmlDevice_t(index)))


def nvmlDeviceGetName(handle: Any) -> Any:
    gpu, garbage = _gpu_call(handle, "nvmlDeviceGetName")
    return None if garbage else str(gpu["name"])


def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> Any:
    gpu, garbage = _gpu_call(handle, "nvmlDeviceGetMemoryInfo")
    if garbage:
        return None
    total, used = int(gpu["memory_total"]), int(gpu["memory_used"])
    return c_nvmlMemory_t(total=total, free=max(0, total - used), used=used)


def nvmlDeviceGetUtilizationRates(handle: Any) -> Any:
    gpu, garbage = _gpu_call(handle, "nvmlDeviceGetUtilizationRates")
    if gpu.get("mig"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if garbage:
        return nvmlFriendlyObject({"gpu": "n/a", "memory": "n/a"})
    return c_nvmlUtilization_t(gpu=int(gpu["utilization"]), memory=int(gpu["memory_utilization"]))


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[nvmlFriendlyObject]:
    gpu = _gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [nvmlFriendlyObject({"pid": int(pid), "usedGpuMemory": None, "gpuInstanceId": 0xFFFFFFFF,
                                "computeInstanceId": 0xFFFFFFFF}) for pid in gpu["processes"]]


def nvmlDeviceGetFieldValues(handle: Any, fieldIds: list[Any]) -> Any:
    """Field 230 has the control's ``recovery_action``; the rest answer NOT_SUPPORTED in ``nvmlReturn``."""
    index = int(handle.contents.index)
    control = _enter("nvmlDeviceGetFieldValues", index)
    action = control.get("recovery_action")
    action = action.get(str(index)) if isinstance(action, dict) else action
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for i, field_id in enumerate(fieldIds):
        values[i].fieldId = field_id[0] if isinstance(field_id, tuple) else field_id
        if values[i].fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and action is not None:
            values[i].valueType, values[i].nvmlReturn = NVML_VALUE_TYPE_UNSIGNED_INT, NVML_SUCCESS
            values[i].value.uiVal = int(action)
        else:
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return values


# ---------------------------------------------------------------- the event API (Xid errors)


def nvmlEventSetCreate() -> Any:
    _enter("nvmlEventSetCreate")
    with _lock:
        set_id = len(_event_sets) + 1
        _event_sets[set_id] = {}
    return pointer(struct_c_nvmlEventSet_t(set_id))


def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _gpu(handle, "nvmlDeviceGetSupportedEventTypes")
    return nvmlEventTypeAll


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    _gpu(handle, "nvmlDeviceRegisterEvents")
    with _lock:
        _event_sets[int(eventSet.contents.id)][int(handle.contents.index)] = int(eventTypes)


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> c_nvmlEventData_t | nvmlFriendlyObject:
    """The next Xid of a registered GPU; NVMLError_Timeout when none comes within ``timeoutms``."""
    global _xid_delivered
    started = time.monotonic()
    while True:
        control = _enter("nvmlEventSetWait_v2")
        if "nvmlEventSetWait_v2" in (control.get("garbage") or []):
            return nvmlFriendlyObject({"device": None, "eventType": "n/a", "eventData": None})
        if control.get("wait_at_once") == "timeout":
            raise NVMLError(NVML_ERROR_TIMEOUT)
        if control.get("wait_at_once") == "none":
            return c_nvmlEventData_t(eventType=nvmlEventTypeNone)
        events = control.get("xid") or []
        with _lock:
            if isinstance(control.get("xid_storm"), dict):
                return _xid_event(control["xid_storm"])
            registered = _event_sets.get(int(eventSet.contents.id), {})
            if _xid_delivered < len(events):
                event = events[_xid_delivered]
                if registered.get(int(event.get("gpu", 0)), 0) & nvmlEventTypeXidCriticalError:
                    _xid_delivered += 1
                    return _xid_event(event)
        if time.monotonic() - started >= timeoutms / 1000:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(HANG_RECHECK_S)


def _xid_event(event: dict[str, Any]) -> c_nvmlEventData_t:
    """An Xid event of ``{"gpu": index, "xid": code}`` (under ``_lock``: its GPU's one handle)."""
    index = int(event.get("gpu", 0))
    device = _handles.setdefault(index, pointer(struct_c_nvmlDevice_t(index)))
    return c_nvmlEventData_t(device=device, eventType=nvmlEventTypeXidCriticalError, eventData=int(event.get("xid", 0)),
                             gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def nvmlEventSetWait(eventSet: Any, timeoutms: int) -> c_nvmlEventData_t | nvmlFriendlyObject:
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: Any) -> None:
    _enter("nvmlEventSetFree")
    with _lock:
        _event_sets.pop(int(eventSet.contents.id), None)
