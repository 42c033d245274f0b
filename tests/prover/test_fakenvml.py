"""The stand-in pynvml keeps nvidia-ml-py's names, constants, shapes and error classes, and does what its
control file says: GPUs, hangs a test can shorten, an init error, lost GPUs, Xid events.

Its names and errors are compared with the real module installed here (which, without a driver, can
only be imported, not used); its behaviour is driven through the control file, in-process and as the
``pynvml`` a real subprocess imports from PYTHONPATH.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
import types
from pathlib import Path

import pytest
from helpers import PY, REPO
from standin_nvml import FAKE_PYNVML, NvmlControl, fake_nvml_env, fake_pynvml, gpu

NAMES = ["NVMLError", "NVMLError_LibraryNotFound", "NVMLError_Timeout", "NVMLError_GpuIsLost", "NVMLError_Unknown",
         "NVMLError_Uninitialized", "NVMLError_InvalidArgument", "NVMLError_DriverNotLoaded", "nvmlInit",
         "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
         "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetComputeRunningProcesses",
         "nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2",
         "nvmlEventSetFree", "nvmlEventTypeXidCriticalError", "NVML_ERROR_TIMEOUT", "NVML_ERROR_GPU_IS_LOST",
         "NVML_ERROR_UNKNOWN", "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_SUCCESS", "c_nvmlMemory_t", "c_nvmlUtilization_t",
         "c_nvmlEventData_t", "c_nvmlDevice_t", "nvmlFriendlyObject", "nvmlExceptionClass"]


@pytest.fixture
def real() -> types.ModuleType:
    module = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    assert Path(module.__file__).resolve() != FAKE_PYNVML, "the stand-in shadows the real module here"
    return module


@pytest.fixture
def control(tmp_path: Path) -> NvmlControl:
    return NvmlControl(tmp_path / "nvml.json")


@pytest.fixture
def fake(control: NvmlControl, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    return fake_pynvml(monkeypatch, control)


def test_the_names_are_the_real_modules(real: types.ModuleType, fake: types.ModuleType) -> None:
    missing_real = [n for n in NAMES if not hasattr(real, n)]
    missing_fake = [n for n in NAMES if not hasattr(fake, n)]
    assert missing_real == [], f"the list names what nvidia-ml-py does not have: {missing_real}"
    assert missing_fake == [], missing_fake
    for name in NAMES:
        if name.startswith("NVML_") or name.startswith("nvmlEventType"):
            assert getattr(fake, name) == getattr(real, name), name


@pytest.mark.parametrize("code", ["NVML_ERROR_TIMEOUT", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN",
                                  "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_UNINITIALIZED"])
def test_errors_are_built_as_the_real_ones(real: types.ModuleType, fake: types.ModuleType, code: str) -> None:
    real_error, fake_error = real.NVMLError(getattr(real, code)), fake.NVMLError(getattr(fake, code))
    assert type(fake_error).__name__ == type(real_error).__name__, (type(fake_error), type(real_error))
    assert str(fake_error) == str(real_error)
    assert isinstance(fake_error, fake.NVMLError) and fake_error.value == real_error.value
    by_class = getattr(fake, type(real_error).__name__)()  # NVMLError_Timeout() needs no argument, as there
    assert type(by_class) is type(fake_error) and by_class == fake_error
    assert fake.nvmlExceptionClass(getattr(fake, code)) is type(fake_error)


def test_structures_have_the_real_fields(real: types.ModuleType, fake: types.ModuleType) -> None:
    for name in ("c_nvmlMemory_t", "c_nvmlUtilization_t", "c_nvmlEventData_t"):
        assert [f[0] for f in getattr(fake, name)._fields_] == [f[0] for f in getattr(real, name)._fields_], name
    assert issubclass(fake.c_nvmlDevice_t, ctypes._Pointer)


def test_gpus_memory_utilization_processes(fake: types.ModuleType, control: NvmlControl) -> None:
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    control.set(gpus=[gpu("NVIDIA H100 80GB HBM3", 81559 << 20, 2 << 30, util=37, processes=(4242,)), gpu()])
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 2
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    mem = fake.nvmlDeviceGetMemoryInfo(handle)
    assert (mem.total, mem.used, mem.free) == (81559 << 20, 2 << 30, (81559 << 20) - (2 << 30))
    assert fake.nvmlDeviceGetUtilizationRates(handle).gpu == 37
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(handle)] == [4242]
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(2)
    control.set(lost=[1])
    with pytest.raises(fake.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(1)
    fake.nvmlShutdown()


def test_init_error_and_no_control_file(fake: types.ModuleType, control: NvmlControl) -> None:
    control.set(init_error="Unknown")
    with pytest.raises(fake.NVMLError_Unknown) as raised:
        fake.nvmlInit()
    assert str(raised.value) == "Unknown Error"
    control.path.unlink()  # no file: the default machine, one idle H200
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 1
    assert fake.nvmlDeviceGetName(fake.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H200"
    control.path.write_text("[1, 2]")
    with pytest.raises(fake.NVMLError_Unknown):
        fake.nvmlDeviceGetCount()


def test_a_hang_blocks_the_named_calls_and_a_test_can_shorten_it(fake: types.ModuleType,
                                                                  control: NvmlControl) -> None:
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    control.set(hang_s=120, hang_calls=["nvmlDeviceGetUtilizationRates"])
    assert fake.nvmlDeviceGetMemoryInfo(handle).total > 0, "a call not named does not hang"
    answered: list[object] = []
    caller = threading.Thread(target=lambda: answered.append(fake.nvmlDeviceGetUtilizationRates(handle)), daemon=True)
    caller.start()
    caller.join(0.5)
    assert caller.is_alive() and answered == [], "the named call did not hang"
    shortened = time.monotonic()
    control.set(hang_s=0)
    caller.join(10)
    assert not caller.is_alive() and len(answered) == 1, "lowering hang_s did not end the hang"
    print(f"the hang ended {time.monotonic() - shortened:.3f}s after hang_s was lowered")


def test_xid_events_are_delivered_once_then_the_wait_times_out(fake: types.ModuleType, control: NvmlControl) -> None:
    control.set(gpus=[gpu(), gpu()], xid=[{"gpu": 1, "xid": 79}])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    events = fake.nvmlEventSetCreate()
    assert fake.nvmlDeviceGetSupportedEventTypes(handle) & fake.nvmlEventTypeXidCriticalError
    fake.nvmlDeviceRegisterEvents(handle, fake.nvmlEventTypeXidCriticalError, events)
    event = fake.nvmlEventSetWait_v2(events, 1000)
    assert (event.eventType, event.eventData, event.device.contents.index) == \
        (fake.nvmlEventTypeXidCriticalError, 79, 1)
    with pytest.raises(fake.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(events, 100)
    fake.nvmlEventSetFree(events)


def test_a_subprocess_imports_it_from_pythonpath_and_logs_its_calls(control: NvmlControl, tmp_path: Path) -> None:
    control.set(log=str(tmp_path / "calls.log"), gpus=[gpu("NVIDIA L4")])
    code = "import pynvml; pynvml.nvmlInit(); print(pynvml.__file__); print(pynvml.nvmlDeviceGetCount())"
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO,
                          env={**os.environ, **fake_nvml_env(control)})
    assert done.returncode == 0, done.stderr
    path, count = done.stdout.split()
    assert Path(path).resolve() == FAKE_PYNVML and count == "1"
    assert control.calls() == [("nvmlInit", "MainThread"), ("nvmlDeviceGetCount", "MainThread")]


def test_it_is_installed_with_the_package() -> None:
    """pyproject's package discovery (``include = ["supervisor*"]``) finds it, so the demo has it installed."""
    setuptools = pytest.importorskip("setuptools")
    packages = setuptools.find_packages(str(REPO), include=["supervisor*"])
    assert "supervisor.prover.standins.fakenvml" in packages, packages


def test_the_hostile_modes_answer_as_the_docstring_says(fake: types.ModuleType, control: NvmlControl) -> None:
    """Wrong types, a count no machine has, NotFound, a storm, a wait that returns at once: the modes the GPU
    thread's hostile tests (tests/test_gpu_hostile.py) stand on."""
    fake.nvmlInit()
    control.set(garbage=["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCount",
                         "nvmlDeviceGetName"], device_count=5_000_000)
    handle = fake.nvmlDeviceGetHandleByIndex(4_999_999)
    assert fake.nvmlDeviceGetUtilizationRates(handle).gpu == "n/a"
    assert fake.nvmlDeviceGetMemoryInfo(handle) is None and fake.nvmlDeviceGetName(handle) is None
    assert fake.nvmlDeviceGetCount() == "n/a"
    control.set(garbage=[])
    assert fake.nvmlDeviceGetCount() == 5_000_000
    control.set(device_count=None, not_found=[0])
    with pytest.raises(fake.NVMLError_NotFound):
        fake.nvmlDeviceGetMemoryInfo(fake.nvmlDeviceGetHandleByIndex(0))
    control.set(not_found=[], xid_storm={"gpu": 0, "xid": 13})
    events = fake.nvmlEventSetCreate()
    started = time.monotonic()
    assert [fake.nvmlEventSetWait_v2(events, 1000).eventData for _ in range(50)] == [13] * 50
    assert time.monotonic() - started < 5
    control.set(xid_storm=None, wait_at_once="none")
    assert fake.nvmlEventSetWait_v2(events, 10_000).eventType == fake.nvmlEventTypeNone
    control.set(wait_at_once="timeout")
    started = time.monotonic()
    with pytest.raises(fake.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(events, 10_000)
    assert time.monotonic() - started < 1
    control.set(wait_at_once=None, garbage=["nvmlEventSetWait_v2"])
    assert fake.nvmlEventSetWait_v2(events, 10_000).eventType == "n/a"


def test_a_flaky_call_fails_its_times_then_answers(fake: types.ModuleType, control: NvmlControl) -> None:
    """``flaky``: a GPU that answers one call badly a few times (tests/test_gpu.py's one-off error in a sample)."""
    control.set(gpus=[gpu(), gpu()], flaky=[{"gpu": 1, "call": "nvmlDeviceGetMemoryInfo", "error": "Timeout",
                                             "times": 2}])
    fake.nvmlInit()
    first, second = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetMemoryInfo(first).total > 0, "another GPU answers"
    assert fake.nvmlDeviceGetUtilizationRates(second).gpu == 0, "another call of the GPU answers"
    for _ in range(2):
        with pytest.raises(fake.NVMLError_Timeout):
            fake.nvmlDeviceGetMemoryInfo(second)
    assert fake.nvmlDeviceGetMemoryInfo(second).total > 0, "past its times the call answers"
