"""The device check (tests/prover/device/: run.sh and its scripts) is ready before a device session spends its minutes
on it: the NVML check runs every step here through the stand-in pynvml and says "no GPU" through NVML's real error
path; the stall check runs both its cases through the stand-in; the cgroup v2 check says why it cannot run here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
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


STALL_SCRIPT = REPO / "tests" / "prover" / "device" / "stall_check.py"
CGROUP2_SCRIPT = REPO / "tests" / "prover" / "device" / "cgroup2_check.py"


def test_the_stall_check_runs_both_cases_through_the_standin_nvml(tmp_path: Path) -> None:
    """The busy child (no PyTorch here) plays the GPU through the stand-in's control file: the run whose only sign
    of life is the GPU ends 0, the idle one 124 (stalled); `status` was asked halfway and showed the GPU."""
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML), "STANDIN_NVML_CONTROL": str(tmp_path / "nvml.json")}
    run = subprocess.run([PY, str(STALL_SCRIPT), "--busy-s", "8", "--stall-s", "3"], capture_output=True,
                         text=True, timeout=120, env=env, cwd="/")
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "busy  exit 0 (expected 0)" in said and "idle  exit 124 (expected 124)" in said, said
    assert "status> gpu 0: NVIDIA H200 util 97%" in said, said  # (asked 4 s in: the GPU sampled since)
    assert "reason=stalled" in said and "done: busy pass, idle pass" in said, said


def test_the_cgroup2_check_says_in_one_line_why_it_cannot_run_here() -> None:
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("this machine mounts cgroup v2 at /sys/fs/cgroup: the check would run for real")
    run = subprocess.run([PY, str(CGROUP2_SCRIPT)], capture_output=True, text=True, timeout=60, cwd="/")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout.count("\n") == 1 and run.stdout.startswith("cgroup2_check: "), run.stdout
    assert "nothing to check on this machine" in run.stdout or "needs root" in run.stdout
