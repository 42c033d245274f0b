"""The demo's production faults through the real CLI: ``python -m supervisor demo --fail gpu`` and ``--fail proofs``.

``gpu``: the demo re-executes itself with the stand-in pynvml first on PYTHONPATH (the supervisor process sees
the stand-in's two GPUs, not this machine's), then writes Xid 79 into its control file once the dev-manager
has seen production running: production fails with ``gpu_fault`` naming the GPU and the Xid, is never
restarted, and the instance is given up (killed at the demo's dev-manager). ``proofs``: every proof fails,
production fails with ``proofs_failing``, is restarted under curio's restart policy (restart_burst = 2),
and once that is exhausted the instance is given up.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from helpers import PY, REPO, Result, clean_env, finish, first_line, verdict_lines

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_CONFIG_ERROR, EXIT_FAILURE
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.fitness import Finding, refusal
from supervisor.prover.demo import DEMO_GPUS, DemoUsageError, demo_gpu_count, outcome_lines

# Generous: each takes some seconds (the GPU fault ~6 s, the proofs ~10 s on an idle machine).
DEMO_TIMEOUT_S = 120
MANAGER_SAW_KILLED = "demo: the manager saw C.demo go registered → params_done → bench_done → running → killed"


def demo_env(**extra: str) -> dict[str, str]:
    """The test runner's environment without a PYTHONPATH of its own: the demo must find the stand-in itself."""
    env = clean_env(extra)
    env.pop("PYTHONPATH", None)
    env.pop("GPU_COUNT", None)  # the stand-in's two GPUs are all the demo expects
    return env


def demo(*args: str, env: dict[str, str] | None = None) -> Result:
    proc = subprocess.Popen([PY, "-m", "supervisor", "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", env=env or demo_env(), cwd=REPO,
                            start_new_session=True)
    return finish(proc, time.monotonic(), DEMO_TIMEOUT_S)


def failures_of(out: str, phase: str, child: str) -> list[str]:
    return verdict_lines(out, phase, child, kind="FAILED")


def assert_given_up(out: str, reason: str) -> None:
    assert "manager: giving the instance up (phase curio failed)" in out, out
    assert MANAGER_SAW_KILLED in out, out
    given_up = first_line(out, "demo: the instance was given up: the manager killed C.demo")
    assert f"reason={reason}" in given_up, given_up  # the manager's kill reason carries the verdict line
    assert "Traceback" not in out, out


def test_fail_gpu_fails_production_with_gpu_fault_and_gives_the_instance_up() -> None:
    result = demo("--fail", "gpu")
    out = result.output
    assert result.returncode == EXIT_FAILURE, out
    assert "demo: --fail gpu: running again with the stand-in pynvml first on PYTHONPATH" in out, out
    # The supervisor itself imported the stand-in: the control file's two GPUs, fitness and Xid events on them.
    assert "GPU evidence: 2 GPU(s) via NVML" in out, out
    assert "GPU health: Xid events watched on GPU 0, 1" in out, out
    lines = out.splitlines()
    running = lines.index(first_line(out, "dev-manager: POST /running -> 200"))
    injected = lines.index(first_line(out, "GPU 0 now reports Xid 79"))
    assert running < injected, out  # the Xid comes once production is up, not before
    [curio] = failures_of(out, "curio", "curio")
    assert " reason=gpu_fault " in curio and "GPU 0: Xid 79 (fallen off the bus)" in curio, curio
    assert "attempt=1 " in curio and "attempt 2" not in out, out  # never restarted: the GPU is gone
    assert not failures_of(out, "bench", "bench") and not failures_of(out, "paramfetch", "paramfetch"), out
    summary = first_line(out, "demo: production failed for good:")
    assert "phase curio reason=gpu_fault: GPU 0: Xid 79 (fallen off the bus)" in summary, summary
    assert_given_up(out, "gpu_fault")
    assert out.rstrip().splitlines()[-1].startswith(f"demo finished with exit status {EXIT_FAILURE};"), out


def test_fail_proofs_fails_production_with_proofs_failing_after_its_restarts_and_gives_the_instance_up() -> None:
    result = demo("--fail", "proofs")
    out = result.output
    assert result.returncode == EXIT_FAILURE, out
    # curio's proofs reach the daemon, and fail on its GPU: a failure the real daemon's /status never counts.
    assert "partition 0 GPU prove failed: CUDA error: unspecified launch failure (STANDIN_FAIL_PROOFS)" in out, out
    failed = failures_of(out, "curio", "curio")
    # One attempt and its restart_burst of 2 restarts, each failed by the production watch.
    assert [" reason=proofs_failing " in line for line in failed] == [True, True, True], failed
    assert [line.split(" attempt=", 1)[1].split(" ", 1)[0] for line in failed] == ["1", "2", "3"], failed
    # Found by the source that sees it: curio's PoRep task, failed (cuzk's /status stays at 0 / 0, as the real one).
    assert "PoRep proof(s) failed and none completed within 30s (proof_failures=2; curio counters)" in failed[-1]
    assert "phase curio: stopping → failed (proofs_failing; restarted 2 times within" in out, out
    assert "phase bench: bench passed" in out, out  # the bench's proofs did not fail
    summary = first_line(out, "demo: production failed for good:")
    assert "phase curio reason=proofs_failing: " in summary, summary
    assert "proof(s) failed and none completed" in summary, summary
    assert_given_up(out, "proofs_failing")


def test_a_production_fault_in_another_phase_is_refused() -> None:
    proc = subprocess.run([PY, "-m", "supervisor", "demo", "--fail", "gpu", "--phase", "bench"],
                          capture_output=True, text=True, env=demo_env(), cwd=REPO, timeout=60)
    assert proc.returncode == EXIT_CONFIG_ERROR, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--fail gpu" in lines[0] and "bench" in lines[0], proc.stderr
    assert proc.stdout == "", proc.stdout  # nothing ran, not even the re-execution


def test_a_reexecuted_demo_that_still_finds_no_standin_pynvml_stops_there() -> None:
    """Never a loop of re-executions: the marker is set, yet `import pynvml` finds no stand-in (no PYTHONPATH)."""
    proc = subprocess.run([PY, "-m", "supervisor", "demo", "--fail", "gpu"], capture_output=True, text=True,
                          env=demo_env(PROVER_DEMO_STANDIN_NVML="1"), cwd=REPO, timeout=60)
    assert proc.returncode == EXIT_FAILURE, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not find the stand-in" in lines[0], proc.stderr
    assert proc.stdout == "", proc.stdout


def test_gpu_count_0_with_fail_gpu_is_refused_before_anything_runs() -> None:
    """The fault is an Xid on GPU 0: with GPU_COUNT=0 the demo made its two stand-in GPUs all the same (0 read as
    unset), fitness found them against GPU_COUNT=0, and the Xid was never shown."""
    env = {**demo_env(), "GPU_COUNT": "0"}  # (demo_env drops the runner's own)
    proc = subprocess.run([PY, "-m", "supervisor", "demo", "--fail", "gpu"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)
    assert proc.returncode == EXIT_CONFIG_ERROR, proc
    assert proc.stderr.strip().splitlines() == [
        "prover-supervisor demo: --fail gpu: GPU_COUNT=0 says this machine has no GPU, and the fault is an Xid on "
        "GPU 0 (unset GPU_COUNT, or set it to 1 or more)"], proc.stderr
    assert proc.stdout == "", proc.stdout  # nothing ran, not even the re-execution


def test_the_closing_line_names_what_failed_before_production() -> None:
    """A failure before production (an unfit machine, a phase before curio) is no production failure: the line
    said "production failed for good: phase fitness"."""
    manager = DevManager(quiet=True).start()  # (which has seen no instance)
    try:
        unfit = refusal([Finding(v.GPU_UNAVAILABLE, "NVML sees 2 GPU(s) but GPU_COUNT=1")])
        assert outcome_lines(unfit, manager)[0] == (
            "demo: production never started: the machine's fitness check failed first: reason=gpu_unavailable: unfit "
            "before any phase started: NVML sees 2 GPU(s) but GPU_COUNT=1")
        bench = v.without_exit("bench", "bench", v.EXIT_CODE, 1, "exit 1", attempt=1)
        assert outcome_lines(bench, manager)[0] == (
            "demo: production never started: phase bench failed first: reason=exit_code: exit 1")
        curio = v.without_exit("curio", "curio", v.GPU_FAULT, 1, "GPU 0: Xid 79", attempt=1)
        assert outcome_lines(curio, manager)[0] == (
            "demo: production failed for good: phase curio reason=gpu_fault: GPU 0: Xid 79")
    finally:
        manager.stop()


def test_the_standin_has_as_many_gpus_as_the_machine_says() -> None:
    """Vast.ai sets $GPU_COUNT inside an instance and fitness compares NVML's count with it: the demo's GPUs
    follow it, so that `--fail gpu` is not found unfit on a real machine."""
    assert demo_gpu_count({"GPU_COUNT": "3"}) == 3
    assert demo_gpu_count({}) == DEMO_GPUS == 2
    assert demo_gpu_count({"GPU_COUNT": "two"}) == DEMO_GPUS
    with pytest.raises(DemoUsageError, match="GPU_COUNT=0"):
        demo_gpu_count({"GPU_COUNT": "0"})
