"""cuzk.toml's GPUs, with the real supervisor and the stand-in pynvml: ``prepare = "cuzk-config"`` writes
``[gpus] devices`` from the GPU thread's latest reading, which on a run where nothing samples again (no stall_s,
no gpu_health, no status asked) is the first one, taken as the supervisor starts.

The issue: one NVML error of one GPU in that first round left the GPU out of the reading, and so out of cuzk.toml
for the whole run, without a word. Now a GPU whose answer is no reading is asked again before the round is
published: a one-off error costs nothing; a GPU that fails again (or has no handle) is left out, and the prepare
hook says which and why.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from helpers import Runner, sh
from standin_nvml import NvmlControl, fake_nvml_env
from standin_nvml import gpu as nvml_gpu


def cuzk_phase(sup: Runner) -> Path:
    return sup.write(f"""
        [cuzk]
        baseline = "1GiB"
        per_partition = "512MiB"

        [[phases]]
        name = "warmup"
        prepare = "cuzk-config"
        command = {sh("true")}
        """)


def devices(sup: Runner) -> list[int]:
    written = tomllib.loads((sup.state_dir / "cuzk.toml").read_text())
    return list(written.get("gpus", {}).get("devices", []))


def test_a_gpu_that_answers_badly_once_in_the_first_sample_is_in_cuzk_toml(sup: Runner, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json", gpus=[nvml_gpu(), nvml_gpu()],
                          flaky=[{"gpu": 1, "call": "nvmlDeviceGetMemoryInfo", "error": "Timeout"}])
    result = sup.run(cuzk_phase(sup), env=fake_nvml_env(control), timeout=60)
    assert result.returncode == 0, result.output
    assert devices(sup) == [0, 1], result.output
    assert ", 2 GPU(s)" in result.output and "left out" not in result.output, result.output


def test_a_gpu_that_fails_again_is_left_out_of_cuzk_toml_and_said(sup: Runner, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json", gpus=[nvml_gpu(), nvml_gpu(), nvml_gpu()], lost=[2],
                          flaky=[{"gpu": 1, "call": "nvmlDeviceGetMemoryInfo", "error": "Timeout", "times": 1000}])
    result = sup.run(cuzk_phase(sup), env=fake_nvml_env(control), timeout=60)
    assert result.returncode == 0, result.output
    assert devices(sup) == [0], result.output
    out = result.output
    assert "phase warmup: cuzk.toml leaves out GPU 1 (unreadable: NVMLError_Timeout: Timeout), GPU 2 (no handle: " \
           "NVMLError_GpuIsLost: GPU is lost): cuzk runs without them" in out, out
