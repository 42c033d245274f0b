"""GPU evidence through NVML: "no GPU" said once with NVML's own error, samples, activity between samples.

On a machine without the NVML library the real ``pynvml`` raises
``NVMLError_LibraryNotFound``; ``Gpus`` must say "no GPU" with that error, never
fail. The with-GPU path is exercised with a stand-in ``pynvml`` module.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from helpers import SupervisorRunner, first_line, one_verdict, real_nvml_error, toml_list

from supervisor.gpu import Gpus, GpuSample, activity_changed, describe_nvml_error
from supervisor.units import MIB as MiB


def test_no_gpu_here_says_why_with_nvmls_real_error() -> None:
    error = real_nvml_error()
    if error is None:
        pytest.skip("NVML initialises on this machine (a GPU driver is present): the no-GPU path cannot be seen")
    print(f"real pynvml.nvmlInit() raised {type(error).__name__}: {error}")
    gpus = Gpus()
    assert gpus.why == "not probed yet"
    assert gpus.sample() == []
    assert gpus.available is False
    assert gpus.why.startswith("no GPU"), gpus.why
    assert type(error).__name__ in gpus.why, gpus.why
    if "NVMLError_LibraryNotFound" not in type(error).__name__:
        pytest.skip(f"NVML fails here with {type(error).__name__}, not NVMLError_LibraryNotFound (checked above)")
    assert "NVMLError_LibraryNotFound" in gpus.why
    assert gpus.sample() == []  # asked again: still no GPU, no new probe, no error


def test_describe_nvml_error_names_the_class_once() -> None:
    class NVMLError_Fake(Exception):  # named like pynvml's per-code classes
        pass

    assert describe_nvml_error(NVMLError_Fake("Driver Not Loaded")) == "NVMLError_Fake: Driver Not Loaded"
    assert describe_nvml_error(NVMLError_Fake()) == "NVMLError_Fake"
    assert describe_nvml_error(NVMLError_Fake("NVMLError_Fake: x")) == "NVMLError_Fake: x"


def test_pynvml_missing_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml → ImportError
    gpus = Gpus()
    assert gpus.sample() == []
    assert gpus.why.startswith("no GPU: pynvml not installed"), gpus.why


def fake_pynvml(devices: list[dict[str, Any]]) -> types.ModuleType:
    """A stand-in pynvml with ``devices`` (name, util, used, total; ``fail``: a GPU fallen off the bus)."""
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]

    def util(handle: dict[str, Any]) -> Any:
        if handle.get("fail"):
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=handle["util"], memory=0)

    mod.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=h["used"], total=h["total"], free=h["total"] - h["used"])
    mod.nvmlDeviceGetName = lambda h: h["name"]  # type: ignore[attr-defined]
    return mod


def test_samples_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [
        {"name": b"NVIDIA H100", "util": 0, "used": 100 * MiB, "total": 80 * 1024 * MiB},
        {"name": "NVIDIA L4", "util": 37, "used": 2048 * MiB, "total": 24 * 1024 * MiB},
        {"name": "lost", "fail": True},
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    gpus = Gpus()
    samples = gpus.sample()
    assert gpus.available is True
    assert gpus.why == "3 GPU(s) via NVML"
    assert samples == [
        GpuSample(0, "NVIDIA H100", 0, 100 * MiB, 80 * 1024 * MiB),
        GpuSample(1, "NVIDIA L4", 37, 2048 * MiB, 24 * 1024 * MiB),
    ]


def test_nvml_with_no_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    gpus = Gpus()
    assert gpus.sample() == []
    assert gpus.available is False
    assert gpus.why == "no GPU: NVML sees 0 devices"


def gpu(index: int, util: int = 0, used: int = 0) -> GpuSample:
    return GpuSample(index, f"gpu{index}", util, used, 80 * 1024 * MiB)


@pytest.mark.parametrize(("before", "after", "changed"), [
    ([], [], False),
    ([gpu(0)], [gpu(0)], False),  # idle, same memory
    ([gpu(0)], [gpu(0, util=1)], True),  # any utilisation is work
    ([gpu(0, util=90)], [gpu(0, util=0)], False),  # it was busy, now idle: no work in this sample
    ([gpu(0, used=MiB)], [gpu(0, used=2 * MiB)], True),  # memory use grew
    ([gpu(0, used=2 * MiB)], [gpu(0, used=MiB)], True),  # memory freed is activity too
    ([gpu(0), gpu(1, used=5)], [gpu(0), gpu(1, used=6)], True),  # the second GPU moved
    ([], [gpu(0, used=5)], False),  # a GPU seen for the first time, idle: nothing to compare
    ([], [gpu(0, util=3)], True),
    ([gpu(0, used=5)], [], False),  # a GPU gone from the sample is no activity
    ([gpu(1, used=5)], [gpu(0, used=6)], False),  # different GPUs are not compared
])
def test_activity_changed(before: list[GpuSample], after: list[GpuSample], changed: bool) -> None:
    assert activity_changed(before, after) is changed


def test_a_phase_with_stall_s_says_the_gpu_evidence_at_start(sup: SupervisorRunner) -> None:
    if real_nvml_error() is None:
        pytest.skip("NVML works here: the line would name the GPUs, not 'no GPU'")
    cfg = sup.write(f"""
        [[phases]]
        name = "quick"
        stall_s = 5
        command = {toml_list(["true"])}
        """)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == 0, out
    line = first_line(out, "GPU evidence:")
    assert "GPU evidence: no GPU" in line and "NVMLError" in line, line
    assert out.index("GPU evidence:") < out.index("phase quick: pending → starting")
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "quick")

