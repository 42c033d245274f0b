"""The device check (tests/prover/device/nvml_check.py) is ready before a device session spends its minutes on it: it
runs every step here through the stand-in pynvml, and says "no GPU" through NVML's real error path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from helpers import PY, REPO

SCRIPT = REPO / "tests" / "prover" / "device" / "nvml_check.py"
FAKE_NVML = REPO / "supervisor" / "prover" / "standins" / "fakenvml"
STEPS = ("open", "inventory", "sample", "sample2", "events", "fitness", "cuzk.toml")
SMALL = {"PROVER_MIN_MEMORY": "1GiB", "CUZK_BASELINE": "1GiB", "CUZK_PER_PARTITION": "512MiB",
         "CUZK_SAFETY_MARGIN": "1GiB", "PROVER_MIN_PARAM_DISK": "1MiB"}


def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, str(SCRIPT), "--event-wait-s", "0.5"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, cwd="/")


def step_lines(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines()[1:] if line and line.split()[0] in STEPS}


def test_every_step_runs_through_the_standin_nvml(tmp_path: Path) -> None:
    control = tmp_path / "nvml.json"
    control.write_text(json.dumps({"gpus": [{}, {}]}))  # two idle H200s
    run = check({**SMALL, "PYTHONPATH": str(FAKE_NVML), "GPU_COUNT": "2", "STANDIN_NVML_CONTROL": str(control)})
    assert run.returncode == 0, run.stdout + run.stderr
    lines = step_lines(run.stdout)
    assert set(lines) == set(STEPS), run.stdout
    assert "2 GPU(s) via NVML" in lines["open"]
    assert "GPU 1" in lines["inventory"] and "util=" in lines["sample"]
    assert "registered" in lines["events"] and "no event" in lines["events"]
    assert lines["fitness"].endswith(" fit"), lines["fitness"]
    assert "partitions in flight" in lines["cuzk.toml"], lines["cuzk.toml"]
    assert all(" ms  " in line for line in lines.values())
    assert "done: 7 of 7 steps ran" in run.stdout


def test_without_nvml_it_says_no_gpu_and_still_runs_each_step() -> None:
    run = check({**SMALL, "PROVER_REQUIRE_GPUS": "false"})
    lines = step_lines(run.stdout)
    assert set(lines) == set(STEPS), run.stdout
    assert "no GPU" in lines["open"] and "no GPU" in lines["sample"], run.stdout
    assert run.returncode == 0, run.stdout + run.stderr
