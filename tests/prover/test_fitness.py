"""Fitness before the download, and the instance given up at once when the lifecycle fails before production.

The decisions (supervisor/lifecycle/fitness.py ``assess``) are pure: they are checked with real-shaped
evidence (the seeds' 125 GB instance, H100/H200 figures as NVML reports them). The whole path
runs for real: the built-in prover profile with the stand-ins on PATH, the supervisor inside a
real v1 memory cgroup or with its parameter cache on a real, too small tmpfs, the real pynvml
failing on a machine without NVML, and the dev-manager over HTTP recording the give-up.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    PY,
    REPO,
    Result,
    Runner,
    in_cgroup_argv,
    kill_tree,
    last_failure,
    mounted_tmpfs,
    read,
    real_nvml_error,
    started,
    v1_cgroup,
)

from supervisor.config import load_plan
from supervisor.evidence.gpu import GpuDevice, GpuInventory, HungCall
from supervisor.evidence.gpuwatch import Gpus
from supervisor.exits import EXIT_FAILURE
from supervisor.lifecycle import fitness
from supervisor.prover.cuzkconf import GIB
from supervisor.prover.plugin import PARAM_CACHE_ENV, PLUGIN, param_cache, param_disk
from supervisor.text.units import MIB as MiB

H100 = 81559 * MiB  # what NVML reports as memory.total for an H100 80GB HBM3
H200 = 143771 * MiB  # and for an H200
IDLE_USED = 521 * MiB  # memory.used of an idle one (driver context, reserves), no process on it
SEEDS_MEMORY = 125 * 10**9  # the seeds' instance: "125 GB"


def profile_plan(**env: str) -> Any:
    """The built-in prover profile as a machine with these knobs would load it."""
    return load_plan(None, PLUGIN, {"SUPERVISOR_STATE_DIR": "/s", "SUPERVISOR_LOG_DIR": "/l", **env})


def memory_findings(plan: Any, available: int | None) -> list[fitness.Finding]:
    """What the fitness check says of memory alone, the prover's checks (cuzk.toml) included."""
    return fitness.assess(plan, fitness.Evidence(available), PLUGIN.fitness)


def idle_gpus(*totals: int) -> GpuInventory:
    return GpuInventory(True, f"{len(totals)} GPU(s) via NVML", tuple(
        GpuDevice(i, "NVIDIA H200" if total == H200 else "NVIDIA H100 80GB HBM3", total, IDLE_USED, ())
        for i, total in enumerate(totals)))


# ---------------------------------------------------------------- memory (pure)


def test_the_seeds_instance_is_refused_for_memory_naming_both_numbers() -> None:
    plan = profile_plan()
    findings = memory_findings(plan, SEEDS_MEMORY)
    assert len(findings) == 1, findings
    assert findings[0].reason == "insufficient_memory"
    detail = findings[0].detail
    assert "phase warmup needs min_memory=128.0GiB (137438953472 bytes)" in detail, detail
    assert f"but only 116.4GiB ({SEEDS_MEMORY} bytes) is available" in detail, detail


def test_the_largest_min_memory_is_the_one_named() -> None:
    plan = load_plan(None, PLUGIN, {"SUPERVISOR_STATE_DIR": "/s", "PROVER_MIN_MEMORY": "100GiB"})
    small, big = plan.phases[1], plan.phases[2]
    from dataclasses import replace
    phases = (plan.phases[0], replace(small, min_memory=100 * GIB), replace(big, min_memory=110 * GIB))
    findings = fitness.memory_findings(phases, 90 * GIB)
    assert [f.detail.split(" needs")[0] for f in findings] == ["phase bench"], findings
    # memory_max caps what a phase can have, like the phase's own preflight.
    capped = (replace(small, min_memory=10 * GIB, memory_max=8 * GIB),)
    assert "but only 8.0GiB" in fitness.memory_findings(capped, 90 * GIB)[0].detail


def test_what_cuzk_toml_generation_needs_is_checked_too() -> None:
    # min_memory lowered below what cuzk needs: generation itself refuses, with its own numbers.
    unified = profile_plan(PROVER_MIN_MEMORY="64GiB")
    refused = memory_findings(unified, 80 * GIB)
    assert [f.reason for f in refused] == ["insufficient_memory"]
    assert refused[0].detail.startswith("phase warmup: cuzk.toml: cuzk needs at least 83.6GiB"), refused
    assert "the budget is 75.0GiB" in refused[0].detail
    assert memory_findings(unified, 96 * GIB) == []

    pw = profile_plan(PROVER_MIN_MEMORY="64GiB", CUZK_MEMORY_MODEL="partition-workers")
    refused = memory_findings(pw, 90 * GIB)
    assert refused and "partition-workers cuzk needs at least 89.0GiB" in refused[0].detail, refused
    assert memory_findings(pw, 128 * GIB) == []


def test_unknown_memory_is_no_finding() -> None:
    plan = profile_plan()
    assert memory_findings(plan, None) == []


# ---------------------------------------------------------------- disk (pure)


def need(what: str, path: str, need_bytes: int, present: int, free: int | None, device: int | None) -> Any:
    return fitness.DiskNeed(what, path, need_bytes, present, free, device)


def test_disk_needs_discount_what_is_already_there() -> None:
    fresh = need("parameter cache", "/var/tmp/p", 85 * GIB, 0, 60 * GIB, 1)
    [finding] = fitness.disk_findings((fresh,))
    assert finding.reason == "insufficient_disk"
    assert finding.detail == ("parameter cache /var/tmp/p needs 85.0GiB but only 60.0GiB (64424509440 bytes) "
                              "is free there"), finding.detail
    # 44 GiB fetched before a restart: 41 GiB left to write fits in 60 GiB.
    resumed = need("parameter cache", "/var/tmp/p", 85 * GIB, 44 * GIB, 60 * GIB, 1)
    assert fitness.disk_findings((resumed,)) == []
    short = need("parameter cache", "/var/tmp/p", 85 * GIB, 44 * GIB, 40 * GIB, 1)
    assert "needs 41.0GiB (85.0GiB less 44.0GiB already there)" in fitness.disk_findings((short,))[0].detail


def test_two_paths_on_one_filesystem_must_fit_together() -> None:
    cache = need("parameter cache", "/data/p", 85 * GIB, 0, 85 * GIB + MiB, 7)
    state = need("state_dir", "/data/s", GIB, 0, 85 * GIB + MiB, 7)
    [finding] = fitness.disk_findings((cache, state))
    assert "(86.0GiB together on one filesystem)" in finding.detail, finding.detail
    apart = need("state_dir", "/other/s", GIB, 0, 2 * GIB, 8)
    assert fitness.disk_findings((cache, apart)) == []
    assert fitness.disk_findings((need("state_dir", "/x", GIB, 0, None, None),)) == []  # unreadable: not guessed


# ---------------------------------------------------------------- GPUs (pure, real-shaped NVML samples)


def test_idle_gpus_are_fit_and_gpu_count_must_match() -> None:
    assert fitness.gpu_findings(idle_gpus(H200), None) == []
    assert fitness.gpu_findings(idle_gpus(H100, H100), 2) == []
    [finding] = fitness.gpu_findings(idle_gpus(H100), 2)
    assert finding.reason == "gpu_unavailable"
    assert finding.detail == "NVML sees 1 GPU(s) but GPU_COUNT=2", finding.detail


def test_a_gpu_taken_by_another_process_or_unreachable_is_unfit() -> None:
    busy = GpuInventory(True, "2 GPU(s) via NVML", (
        GpuDevice(0, "NVIDIA H100 80GB HBM3", H100, IDLE_USED, ()),
        GpuDevice(1, "NVIDIA H100 80GB HBM3", H100, 61440 * MiB, (48213,)),
    ))
    [finding] = fitness.gpu_findings(busy, 2)
    assert "GPU 1 (NVIDIA H100 80GB HBM3) is in use by 1 other process(es) (pid 48213), 60.0GiB of 79.6GiB taken" \
        in finding.detail, finding.detail
    # Inside a container NVML often lists no process of another namespace: the memory used still tells.
    hidden = GpuInventory(True, "1 GPU(s) via NVML", (GpuDevice(0, "NVIDIA H200", H200, 30 * GIB, ()),))
    assert "GPU 0 (NVIDIA H200) has 30.0GiB of 140.4GiB taken (an idle GPU shows at most 1.0GiB)" \
        in fitness.gpu_findings(hidden, None)[0].detail
    lost = GpuInventory(True, "2 GPU(s) via NVML", (
        idle_gpus(H100).devices[0], GpuDevice(1, error="no handle: NVMLError_GpuIsLost: GPU is lost")))
    assert fitness.gpu_findings(lost, 2)[0].detail == "GPU 1 unreachable: no handle: NVMLError_GpuIsLost: GPU is lost"


def test_no_nvml_or_no_device_is_unfit_and_not_required_is_not_checked() -> None:
    absent = GpuInventory(False, "no GPU: NVML unavailable (NVMLError_LibraryNotFound: NVML Shared Library Not Found)")
    [finding] = fitness.gpu_findings(absent, None)
    assert finding.reason == "gpu_unavailable"
    assert "NVMLError_LibraryNotFound" in finding.detail and "require_gpus = false" in finding.detail
    assert "NVML sees 0 GPUs" in fitness.gpu_findings(GpuInventory(True, "no GPU: NVML sees 0 devices"), None)[0].detail
    assert fitness.gpu_findings(None, 4) == []


def test_an_inventory_nvml_did_not_answer_is_gpu_unresponsive() -> None:
    import time

    hung = HungCall("nvmlDeviceGetMemoryInfo (GPU 0)", time.monotonic() - 7.0, time.time() - 7.0)
    [finding] = fitness.gpu_findings(GpuInventory(True, "1 GPU(s) via NVML", unresponsive=hung), 1)
    assert finding.reason == "gpu_unresponsive"
    assert finding.detail.startswith("NVML unresponsive: nvmlDeviceGetMemoryInfo (GPU 0) has not returned for 7."), \
        finding.detail


def test_a_step_that_did_not_return_within_the_bound_is_the_finding() -> None:
    assert fitness.overdue_finding(("disk", "statvfs(/p)"), 30) == fitness.Finding(
        "insufficient_disk", "statvfs(/p) did not return within 30s (a hung mount?): its free space is unknown")
    gpu = fitness.overdue_finding(("gpu", "the GPU inventory"), 30)
    assert gpu == fitness.Finding("gpu_unresponsive", "NVML did not answer the GPU inventory within 30s"), gpu
    steps = fitness.Steps()
    plan = profile_plan(PROVER_MIN_PARAM_DISK="1MiB", PROVER_MIN_STATE_DISK="1MiB", PROVER_REQUIRE_GPUS="true")
    fitness.gather(plan, FixedMemory(None), InjectedGpus(idle_gpus(H200)), {}, steps=steps)
    assert steps.current() == ("gpu", "the GPU inventory"), "each step said before it is taken, the last one last"


def test_real_pynvml_without_nvml_gives_gpu_unavailable() -> None:
    error = real_nvml_error()
    if error is None:
        pytest.skip("NVML initialises on this machine: the no-NVML path cannot be seen here")
    gpus = Gpus()
    try:
        inventory = gpus.inventory(10)
    finally:
        gpus.close()
    assert inventory.nvml is False and inventory.devices == () and inventory.unresponsive is None
    assert type(error).__name__ in inventory.why, inventory.why
    [finding] = fitness.gpu_findings(inventory, None)
    assert finding.reason == "gpu_unavailable" and type(error).__name__ in finding.detail


# ---------------------------------------------------------------- gathering


class InjectedGpus:
    """A Gpus-like source: the inventory a machine with these GPUs would give."""

    def __init__(self, inventory: GpuInventory) -> None:
        self.inventory_given = inventory
        self.asked = 0

    def inventory(self, bound_s: float) -> GpuInventory:
        self.asked += 1
        return self.inventory_given


class FixedMemory:
    def __init__(self, available: int | None) -> None:
        self.available = available

    def available_memory(self) -> int | None:
        return self.available


def test_gather_counts_bytes_already_in_the_cache_and_asks_gpus_only_when_required(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "params", "8m") as cache:
        (cache / "v28-partial.params").write_bytes(b"\0" * (5 * MiB))
        plan = profile_plan(FIL_PROOFS_PARAMETER_CACHE=str(cache), PROVER_MIN_PARAM_DISK="7MiB",
                            PROVER_MIN_STATE_DISK="1MiB", PROVER_REQUIRE_GPUS="true")
        gpus = InjectedGpus(idle_gpus(H200))
        evidence = fitness.gather(plan, FixedMemory(200 * GIB), gpus, {"GPU_COUNT": "1"},
                                  needs=PLUGIN.disk_needs)
        param = evidence.disks[0]
        assert (param.what, param.path, param.need, param.present) == ("parameter cache", str(cache), 7 * MiB, 5 * MiB)
        assert param.free is not None and 2 * MiB <= param.free <= 3 * MiB, param
        assert evidence.disks[1].what == "state_dir" and evidence.disks[1].path == "/s"
        assert evidence.disks[1].device != param.device, "the tmpfs is its own filesystem"
        assert evidence.gpus is gpus.inventory_given and evidence.gpu_count_expected == 1
        assert fitness.assess(plan, evidence, PLUGIN.fitness) == []

        off = fitness.gather(profile_plan(PROVER_REQUIRE_GPUS="false"), FixedMemory(None), gpus, {})
        assert off.gpus is None and gpus.asked == 1, "GPUs not required: NVML is not asked"


@pytest.mark.parametrize("raw", ["two", "-1", "1.0"])
def test_a_gpu_count_that_is_no_count_is_said_not_skipped_silently(raw: str) -> None:
    """GPU_COUNT=two turned the count check off without a word."""
    gpus = InjectedGpus(idle_gpus(H200))
    evidence = fitness.gather(profile_plan(PROVER_REQUIRE_GPUS="true"), FixedMemory(200 * GIB), gpus,
                              {"GPU_COUNT": raw})
    assert evidence.gpu_count_expected is None and evidence.gpu_count_unread == raw
    assert f"GPU_COUNT={raw!r} is not a count: the GPUs were not counted against it" in fitness.describe(evidence)
    counted = fitness.gather(profile_plan(PROVER_REQUIRE_GPUS="true"), FixedMemory(200 * GIB), gpus,
                             {"GPU_COUNT": "1"})
    assert counted.gpu_count_unread is None and "GPU_COUNT" not in fitness.describe(counted)


def test_where_the_parameters_go_cuzk_then_the_environment_then_the_fetch() -> None:
    """Where the prover says the parameters go (its disk need): [cuzk] param_cache, else
    $FIL_PROOFS_PARAMETER_CACHE (the config's env, then the environment), else the fetch's progress_path."""
    from supervisor.config import parse_plan

    fetch = '[[phases]]\nname = "f"\ncommand = ["true"]\nreport = "param-done"\nstall_s = 5\nprogress_path = "/p"\n'
    env = {PARAM_CACHE_ENV: "/from/env"}
    with_cuzk = parse_plan('[cuzk]\nparam_cache = "/cuzk/params"\n' + fetch, "t.toml", {}, PLUGIN)
    assert param_cache(with_cuzk, env) == "/cuzk/params"
    without = parse_plan(fetch, "t.toml", {}, PLUGIN)
    assert param_cache(without, env) == "/from/env"
    assert param_cache(without, {}) == "/p"
    in_config = parse_plan(f'[supervisor]\nenv = {{ {PARAM_CACHE_ENV} = "/cfg" }}\n' + fetch, "t.toml", {}, PLUGIN)
    assert param_cache(in_config, env) == "/cfg"
    # The disk need: min_param_disk under it, and none without the key.
    needs = parse_plan('[supervisor]\nmin_param_disk = "1MiB"\n' + fetch, "t.toml", {}, PLUGIN)
    assert param_disk(needs, env) == [fitness.SpaceNeed("parameter cache", "/from/env", MiB)]
    assert param_disk(without, env) == []
    # Named only in a phase's env (the docs' example): min_param_disk was checked under nothing, without a word.
    in_a_phase = parse_plan('[supervisor]\nmin_param_disk = "1MiB"\n[[phases]]\nname = "f"\ncommand = ["true"]\n'
                            f'env = {{ {PARAM_CACHE_ENV} = "/phase" }}\n', "t.toml", {}, PLUGIN)
    assert param_cache(in_a_phase, {}) == "/phase"
    assert param_disk(in_a_phase, {}) == [fitness.SpaceNeed("parameter cache", "/phase", MiB)]


# ---------------------------------------------------------------- the whole thing, for real


@pytest.fixture
def machine(request: pytest.FixtureRequest) -> Runner:
    """One machine of the built-in profile (test_profile's fixture): stand-ins, dev-manager, own dirs."""
    return request.getfixturevalue("profile")


def start_in(prof: Runner, env: dict[str, str], cgroup: Path | None = None, name: str = "run") -> Result:
    """The built-in profile (no config), optionally from inside ``cgroup``; waits for its exit."""
    argv = [PY, "-m", "supervisor", "run"]
    console = prof.tmp / f"{name}.txt"
    with open(console, "wb") as out:
        proc = subprocess.Popen(in_cgroup_argv(cgroup, argv) if cgroup else argv, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    prof.procs.append(proc)
    try:
        proc.wait(40)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait(10)
        pytest.fail(f"supervisor did not finish within 40s:\n{read(console)[-6000:]}")
    return Result(proc.returncode, read(console), 0.0, proc.pid)


def given_up(prof: Runner, reason: str) -> dict[str, Any]:
    """The dev-manager killed the instance, and had the reason line before the give-up."""
    inst = prof.instance()
    assert inst["state"] == "killed", inst
    assert inst["kill_reason"] == "bench_rate 0.0 below min_rate 50.0", inst
    calls = [c for c in prof.manager.state.snapshot()["calls"]]
    paths = [c["path"] for c in calls]
    assert paths[0] == "/register", paths
    give_up = paths.index("/bench-done")
    said = [c.get("head", "") for c in calls[:give_up] if c["path"] == "/api/log-push"]
    assert any(h.startswith("prover-supervisor: FAILED: ") and f"reason={reason}" in h for h in said), said
    assert paths.count("/bench-done") == 1, paths
    return inst


def nothing_started(prof: Runner, out: str) -> None:
    assert started(out) == [], "nothing may be spawned on an unfit machine"
    assert not (prof.log_dir / "paramfetch.log").exists(), "the download was started"
    assert "phase paramfetch: pending → stopped" in out


def test_memory_cgroup_below_the_profile_minimum_is_refused_before_the_download(machine: Runner) -> None:
    with v1_cgroup("fitness", 256 * MiB) as cg:
        run = start_in(machine, machine.env(PROVER_MIN_MEMORY="512MiB"), cg)
    out = run.output
    assert run.returncode == EXIT_FAILURE, out[-6000:]
    line = last_failure(out, "fitness")
    assert "reason=insufficient_memory" in line, line
    assert "needs min_memory=512.0MiB (536870912 bytes) but only 256.0MiB (268435456 bytes)" in line, line
    nothing_started(machine, out)
    inst = given_up(machine, "insufficient_memory")
    assert inst["history"] == ["registered", "killed"], inst
    setup = machine.manager.state.snapshot()["logs"][inst["uuid"]]["setup"]
    assert "512.0MiB" in setup and "256.0MiB" in setup, setup[-2000:]


def test_a_too_small_tmpfs_parameter_cache_is_insufficient_disk(machine: Runner) -> None:
    with mounted_tmpfs(machine.tmp / "params", "1m"):
        run = start_in(machine, machine.env())  # the machine env asks for 64 MiB under the cache
    out = run.output
    assert run.returncode == EXIT_FAILURE, out[-6000:]
    line = last_failure(out, "fitness")
    assert "reason=insufficient_disk" in line, line
    assert f"parameter cache {machine.tmp / 'params'} needs 64.0MiB but only 1.0MiB (1048576 bytes) is free" \
        in line, line
    nothing_started(machine, out)
    given_up(machine, "insufficient_disk")


def test_absent_nvml_is_gpu_unavailable_unless_overridden(machine: Runner) -> None:
    error = real_nvml_error()
    if error is None:
        pytest.skip("NVML initialises on this machine: it is not absent here")
    run = start_in(machine, machine.env(PROVER_REQUIRE_GPUS="true"), name="required")
    out = run.output
    assert run.returncode == EXIT_FAILURE, out[-6000:]
    line = last_failure(out, "fitness")
    assert "reason=gpu_unavailable" in line and type(error).__name__ in line, line
    nothing_started(machine, out)
    given_up(machine, "gpu_unavailable")

    # The override (what the stand-in runs use): the same machine runs the whole lifecycle.
    machine.label += "1"  # another instance at the manager, still a label it can match (C.<digits>)
    fresh = {"SUPERVISOR_STATE_DIR": str(machine.tmp / "state2"), "SUPERVISOR_LOG_DIR": str(machine.tmp / "logs2")}
    run = start_in(machine, machine.env(PROVER_REQUIRE_GPUS="false", **fresh), name="override")
    assert run.returncode == 0, run.output[-6000:]
    assert "fitness: ok: " in run.output and "GPUs not required" in run.output
    assert machine.instance()["history"] == ["registered", "params_done", "bench_done", "running"]


def test_a_paramfetch_failure_gives_the_instance_up_at_once(machine: Runner) -> None:
    run = start_in(machine, machine.env(STANDIN_FAIL_PARAMFETCH="crash"))
    out = run.output
    assert run.returncode == 3, out[-6000:]
    assert "reason=exit_code" in last_failure(out, "paramfetch")
    inst = given_up(machine, "exit_code")
    assert inst["history"] == ["registered", "killed"], "not left in registered for the 90 min timeout"
    assert "manager: giving the instance up (phase paramfetch failed)" in out


def test_a_warmup_failure_gives_the_instance_up_at_once(machine: Runner) -> None:
    run = start_in(machine, machine.env(STANDIN_FAIL_CUZK_BENCH="crash"))
    out = run.output
    assert run.returncode == 3, out[-6000:]
    assert "reason=exit_code" in last_failure(out, "warmup")
    inst = given_up(machine, "exit_code")
    assert inst["history"] == ["registered", "params_done", "killed"], "not left in params_done for 45 min"


def test_a_crashed_daemon_gives_the_instance_up_at_once(machine: Runner) -> None:
    run = start_in(machine, machine.env(STANDIN_FAIL_CUZK_DAEMON="crash"))
    out = run.output
    assert run.returncode != 0, out[-6000:]
    failed = last_failure(out, "warmup")
    assert "child=cuzk-daemon" in failed and "reason=daemon_died" in failed, failed
    inst = given_up(machine, "daemon_died")
    assert inst["history"] == ["registered", "params_done", "killed"], inst


def test_fitness_keys_are_checked_like_every_other() -> None:
    from supervisor.config import ConfigError, parse_plan

    phases = '[[phases]]\nname = "a"\ncommand = ["true"]\n'
    plan = parse_plan('[supervisor]\nrequire_gpus = "${G:-true}"\nmin_param_disk = "85GiB"\nmin_disk = 1024\n'
                      + phases, "ok.toml", {}, PLUGIN)
    min_param_disk = plan.extensions["supervisor"]["min_param_disk"]  # the prover's key (its disk need)
    assert (plan.supervisor.require_gpus, min_param_disk, plan.supervisor.min_disk) == (True, 85 * GIB, 1024)
    assert parse_plan(phases, "default.toml", {}).supervisor.require_gpus is False
    for bad, message in (('require_gpus = "maybe"', "ok.toml: supervisor.require_gpus: must be true or false"),
                         ('min_param_disk = "lots"', "ok.toml: supervisor.min_param_disk: ")):
        with pytest.raises(ConfigError) as refused:
            parse_plan(f"[supervisor]\n{bad}\n" + phases, "ok.toml", {}, PLUGIN)
        assert str(refused.value).startswith(message) and "\n" not in str(refused.value), refused.value


@pytest.mark.parametrize(("raw", "expected"), [("4", 4), (" 2 ", 2), ("0", 0), ("64", 64), ("²", None), ("١", None),
                                              ("", None), ("x", None), ("65", None), ("100000000", None),
                                              ("9" * 5000, None)])
def test_gpu_count_from_the_environment_takes_ascii_digits_only(raw: str, expected: int | None) -> None:
    """"²" is a digit to str.isdigit() but not to int(): it used to raise out of the fitness check. So did 5000
    digits (int()'s limit), and the demo made a stand-in GPU for each of 100 million: a count no machine has is
    no count, said as such (unread_gpu_count)."""
    assert fitness.expected_gpu_count({"GPU_COUNT": raw}) == expected
    assert (fitness.unread_gpu_count({"GPU_COUNT": raw}) is None) == (expected is not None or not raw.strip())
