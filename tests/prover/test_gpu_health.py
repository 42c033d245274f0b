"""GPU health (gpuwatch.py's events, gpuhealth.py's decisions) with the stand-in pynvml: a fatal Xid (79) fails
the phase that uses GPUs with ``gpu_fault`` naming the GPU, the Xid and the recovery action, and the instance is
given up at the dev-manager, production included; Xid 13 is logged and nothing fails; a lost GPU is a
``gpu_fault`` too; NVML hung past its bound fails the attempt with ``gpu_unresponsive``."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import Console, Runner, free_port, last_failure, one_verdict, pyc, sh, toml_str, wait_for
from standin_nvml import NvmlControl, fake_nvml_env

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.evidence import gpuevents
from supervisor.evidence.gpu import GpuFault
from supervisor.evidence.gpuwatch import Gpus
from supervisor.exits import EXIT_FAILURE
from supervisor.lifecycle.gpuhealth import GpuHealth
from supervisor.lifecycle.hooks import Refusal
from supervisor.lifecycle.states import PhaseState


@pytest.fixture
def gpus() -> Iterator[Gpus]:
    watch = Gpus()
    yield watch
    watch.close()


def faults_of(gpus: Gpus, count: int = 1, timeout: float = 10) -> list[GpuFault]:
    found: list[GpuFault] = []

    def enough() -> bool:
        found.extend(gpus.take_all_faults()[0])
        return len(found) >= count

    wait_for(enough, timeout=timeout)
    return found


# ---------------------------------------------------------------- the GPU thread, in-process


def _ended(gpus: Gpus) -> None:
    """The GPU thread ended: a thread still in a hung call after its test is the next test's second one."""
    gpus.close()
    if gpus._thread is not None:
        gpus._thread.join(10)



def test_a_fatal_xid_is_found_with_its_gpu_and_recovery_action(control: NvmlControl, gpus: Gpus) -> None:
    control.set(gpus=[{}, {}], recovery_action={"1": 2})
    gpus.watch_health()
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    assert gpus.events_why == "Xid events watched on GPU 0, 1"
    control.set(xid=[{"gpu": 1, "xid": 79}])
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid, fault.recovery, fault.fatal) == (1, 79, 2, True)
    assert fault.describe() == "GPU 1: Xid 79 (fallen off the bus); recovery action: node reboot"
    calls = [name for name, _ in control.calls()]
    assert "nvmlDeviceRegisterEvents" in calls and "nvmlDeviceGetFieldValues" in calls
    assert {thread for _, thread in control.calls()} == {"gpu"}  # every NVML call on the one GPU thread


def test_xid_13_is_an_application_fault_and_no_field_means_no_recovery_action(control: NvmlControl,
                                                                               gpus: Gpus) -> None:
    control.set(xid=[{"gpu": 0, "xid": 13}])
    gpus.watch_health()
    [fault] = faults_of(gpus)
    assert (fault.xid, fault.fatal, fault.recovery) == (13, False, None)
    assert fault.describe() == "GPU 0: Xid 13 (graphics engine exception): an application fault, not the GPU's"


def test_a_lost_gpu_is_a_fault_told_once(control: NvmlControl, gpus: Gpus) -> None:
    gpus.watch_health()
    release = gpus.want(0.1)
    wait_for(lambda: gpus.samples(), timeout=10)
    control.set(lost=[0])
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid, fault.fatal) == (0, None, True)
    assert fault.describe() == "GPU 0: lost (NVMLError_GpuIsLost: GPU is lost)"
    time.sleep(0.5)
    assert gpus.take_all_faults()[0] == []  # said once, though every later sample finds it lost
    release()


def test_a_fault_waits_for_its_recovery_action_before_the_loop_takes_it(control: NvmlControl, gpus: Gpus) -> None:
    # Handed over before its recovery action was read, a fault taken by a tick in between was said without it
    # (a flake of the check above under load): the loop now waits for the read, RECOVERY_WAIT_S at most.
    gpus.watch_health()
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    control.set(xid=[{"gpu": 0, "xid": 48}], recovery_action=1, hang_s=gpuevents.RECOVERY_WAIT_S / 2,
                hang_calls=["nvmlDeviceGetFieldValues"])
    try:
        [fault] = faults_of(gpus)
        assert (fault.xid, fault.recovery) == (48, 1), fault
    finally:
        control.set(hang_s=0)  # (a GPU thread hung past the test would be the next test's second one)
        _ended(gpus)


def test_a_start_is_refused_at_once_by_a_fault_whose_recovery_action_is_still_being_read(control: NvmlControl,
                                                                                          gpus: Gpus) -> None:
    # The loop waits for a fault's recovery action (RECOVERY_WAIT_S at most) to say it in the line; the refusal of a
    # phase about to start must not: held back with the rest, an Xid 79 in that second let the child start on the
    # GPU that is gone.
    health = GpuHealth(Target(("curio", True, PhaseState.PENDING)), gpus)
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    control.set(xid=[{"gpu": 0, "xid": 79}], hang_s=gpuevents.RECOVERY_WAIT_S + 5,
                hang_calls=["nvmlDeviceGetFieldValues"])
    try:
        wait_for(lambda: gpus._xid._asking is not None, timeout=10)  # (in hand, its action being read)
        refusal = health.refusal(True)
        assert gpus._xid._asking is not None  # (still being read: the refusal did not wait for it)
    finally:
        control.set(hang_s=0)
        _ended(gpus)
    assert refusal is not None and refusal.reason == "gpu_fault", refusal
    assert refusal.detail.startswith("GPU 0: Xid 79 (fallen off the bus)"), refusal


# ---------------------------------------------------------------- the decisions, in-process


class Target:
    """The Lifecycle as GPU health sees it: phases, and fail_phase recorded."""

    def __init__(self, *phases: tuple[str, bool, PhaseState]) -> None:
        self.phases = [SimpleNamespace(name=n, spec=SimpleNamespace(gpu_health=h), state=s, attempt_started=0.0)
                       for n, h, s in phases]
        self.failed: list[tuple[str, str, str]] = []

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        self.failed.append((name, reason, detail))
        return True


def test_a_fatal_fault_fails_the_running_gpu_phases_and_waits_for_the_next_one(control: NvmlControl,
                                                                                gpus: Gpus) -> None:
    target = Target(("fetch", False, PhaseState.RUNNING), ("curio", True, PhaseState.PENDING))
    control.set(gpus=[{}, {}], recovery_action={"0": 1, "1": 0})  # (two GPUs as NVML opens: both watched)
    health = GpuHealth(target, gpus)
    wait_for(lambda: gpus.events_why == "Xid events watched on GPU 0, 1", timeout=10)
    control.set(xid=[{"gpu": 1, "xid": 13}, {"gpu": 0, "xid": 48}])
    lines: list[str] = []
    wait_for(lambda: lines.extend(health.check(time.monotonic())) or health.fatal is not None, timeout=10)
    assert "GPU health: GPU 1: Xid 13 (graphics engine exception): an application fault, not the GPU's; recovery " \
           "action: none (Xid 13 logged; nothing fails)" in lines, lines
    assert "gpu_fault: GPU 0: Xid 48 (double-bit ECC error); recovery action: GPU reset" in lines, lines
    assert target.failed == []  # the download uses no GPU: the fault is kept
    target.phases[1].state = PhaseState.STARTING
    health.check(time.monotonic())
    assert target.failed == [("curio", "gpu_fault", "GPU 0: Xid 48 (double-bit ECC error); recovery action: GPU "
                                                    "reset; this machine needs replacing")]


@pytest.mark.parametrize("action", [1, 2, 4])
def test_an_application_xid_on_a_gpu_that_needs_a_reset_is_fatal(control: NvmlControl, gpus: Gpus,
                                                                   action: int) -> None:
    """The recovery action is the GPU's state, not the Xid's: Xid 13 on a GPU the driver says needs a reset (or a
    reboot) was logged with "nothing fails", and curio ran on with every proof on that GPU failing."""
    target = Target(("curio", True, PhaseState.RUNNING))
    health = GpuHealth(target, gpus)
    control.set(xid=[{"gpu": 0, "xid": 13}], recovery_action=action)
    lines: list[str] = []
    wait_for(lambda: lines.extend(health.check(time.monotonic())) or target.failed, timeout=10)
    [(name, reason, detail)] = target.failed
    assert (name, reason) == ("curio", "gpu_fault"), target.failed
    assert detail.startswith("GPU 0: Xid 13 (graphics engine exception): an application fault, on a GPU that needs "
                             "recovering; recovery action: "), detail
    assert f"gpu_fault: {detail.removesuffix('; this machine needs replacing')}" in lines, lines


def test_an_application_xid_taken_before_its_recovery_action_is_handed_again_once_that_makes_it_fatal(
        control: NvmlControl, gpus: Gpus) -> None:
    """The Xid is handed over before its recovery action is read, a read that may hang (the loop waits for it
    RECOVERY_WAIT_S at most): a tick that took it meanwhile logged Xid 13 as nothing to fail, and the GPU reset
    that came after was lost with it."""
    target = Target(("curio", True, PhaseState.RUNNING))
    health = GpuHealth(target, gpus)
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    control.set(xid=[{"gpu": 0, "xid": 13}], recovery_action=1, hang_s=gpuevents.RECOVERY_WAIT_S + 2,
                hang_calls=["nvmlDeviceGetFieldValues"])
    lines: list[str] = []
    try:
        wait_for(lambda: lines.extend(health.check(time.monotonic())) or any("Xid 13" in line for line in lines),
                 timeout=10)
    finally:
        control.set(hang_s=0)  # (the action comes now: the rest of the test is what follows from it)
    assert lines[-1] == ("GPU health: GPU 0: Xid 13 (graphics engine exception): an application fault, not the GPU's "
                         "(Xid 13 logged; nothing fails)"), lines
    assert target.failed == []
    wait_for(lambda: lines.extend(health.check(time.monotonic())) or target.failed, timeout=10)
    assert target.failed == [("curio", "gpu_fault", "GPU 0: Xid 13 (graphics engine exception): an application "
                                                    "fault, on a GPU that needs recovering; recovery action: GPU "
                                                    "reset; this machine needs replacing")], target.failed
    assert lines[-1] == ("gpu_fault: GPU 0: Xid 13 (graphics engine exception): an application fault, on a GPU that "
                         "needs recovering; recovery action: GPU reset"), lines


def test_a_fatal_fault_refuses_the_next_attempt_of_a_gpu_phase_before_it_starts(control: NvmlControl,
                                                                                  gpus: Gpus) -> None:
    # The refusal asks the GPU thread's faults itself: one found since the last tick is said first, then refuses.
    said: list[str] = []
    health = GpuHealth(Target(("curio", True, PhaseState.PENDING)), gpus, log=said.append)
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    assert health.refusal(True) is None, "no fault: it may start"
    control.set(xid=[{"gpu": 0, "xid": 13}, {"gpu": 0, "xid": 79}])
    wait_for(lambda: health.refusal(False) is None and health.refusal(True) is not None, timeout=10)
    assert health.refusal(False) is None, "a phase that uses no GPU is never refused"
    assert health.refusal(True) == Refusal("gpu_fault", "GPU 0: Xid 79 (fallen off the bus); this machine needs "
                                                        "replacing")
    assert "gpu_fault: GPU 0: Xid 79 (fallen off the bus)" in said, said
    assert [line for line in health.check(time.monotonic()) if "Xid" in line and "watched" not in line] == [], \
        "said once, by the refusal"


def test_faults_a_refusal_took_without_a_log_are_said_at_the_next_check(control: NvmlControl, gpus: Gpus) -> None:
    health = GpuHealth(Target(("curio", True, PhaseState.PENDING)), gpus)
    control.set(xid=[{"gpu": 0, "xid": 79}])
    wait_for(lambda: health.refusal(True) is not None, timeout=10)
    assert [line for line in health.check(time.monotonic()) if "watched" not in line] == [
        "gpu_fault: GPU 0: Xid 79 (fallen off the bus)"]


@pytest.mark.parametrize("waiting", [PhaseState.PENDING, PhaseState.BACKOFF])
def test_a_gpu_lost_with_no_xid_while_a_gpu_phase_waits_refuses_its_next_attempt(control: NvmlControl, gpus: Gpus,
                                                                                  waiting: PhaseState) -> None:
    """Nothing sampled while the GPU phase waited (its backoff, or a phase before it that samples nothing), so a
    GPU lost with no Xid (NVML's Unknown Error after a host reload) was not found: the next attempt started its
    child on it. Samples go on while a phase that uses GPUs is yet to end, and the lost GPU refuses the attempt."""
    health = GpuHealth(Target(("fetch", False, PhaseState.RUNNING), ("curio", True, waiting)), gpus)
    wait_for(lambda: health.check(time.monotonic()) is not None and gpus.samples(), timeout=10)
    control.set(errors={"0": "Unknown"})
    wait_for(lambda: health.check(time.monotonic()) is not None and health.fatal is not None, timeout=10)
    refusal = health.refusal(True)
    assert refusal is not None and refusal.reason == "gpu_fault" and "GPU 0: lost (" in refusal.detail, refusal


@contextlib.contextmanager
def failed_by_a_hang(control: NvmlControl) -> Iterator[tuple[Gpus, Target, GpuHealth]]:
    """GPU health of one running phase, its bound 0.5 s, NVML hung until it failed the phase's attempt."""
    gpus = Gpus(call_timeout_s=0.2)
    try:
        target = Target(("curio", True, PhaseState.RUNNING))
        health = GpuHealth(target, gpus, unresponsive_fail_s=0.5)
        wait_for(lambda: gpus.opened.is_set(), timeout=10)
        control.set(hang_s=30, hang_calls=["nvmlEventSetWait_v2", "nvmlDeviceGetUtilizationRates"])
        wait_for(lambda: health.check(time.monotonic()) is not None and target.failed, timeout=10)
        yield gpus, target, health
    finally:
        control.set(hang_s=0)
        _ended(gpus)


def test_nvml_hung_past_its_bound_fails_the_attempt_with_gpu_unresponsive(control: NvmlControl) -> None:
    with failed_by_a_hang(control) as (_gpus, target, _health):
        [(name, reason, detail)] = target.failed[:1]
        assert (name, reason) == ("curio", "gpu_unresponsive")
        assert "has not returned for" in detail and "(more than 0.5s of this attempt)" in detail, detail


def test_each_attempt_gets_the_whole_bound_of_a_hang_that_began_before_it(control: NvmlControl) -> None:
    """The bound was counted from the hung call's start: once NVML had hung for 60 s, every retry or restart was
    failed at its first tick, its child started and killed within a second, and the policy decided nothing."""
    with failed_by_a_hang(control) as (gpus, target, health):
        hung = gpus.unresponsive(time.monotonic())
        assert hung is not None
        retry = time.monotonic()
        target.phases[0].attempt_started, target.failed = retry, []  # the next attempt begins, the hang goes on
        health.check(retry + 0.4)
        assert target.failed == [], "an attempt begun under an old hang failed before its own bound"
        health.check(retry + 0.5)
        [(name, reason, _)] = target.failed
        assert (name, reason) == ("curio", "gpu_unresponsive")
        assert gpus.unresponsive(time.monotonic()) is not None and hung.since < retry


# ---------------------------------------------------------------- a real supervisor, the dev-manager


@pytest.fixture(scope="module")
def devmgr() -> Iterator[DevManager]:
    mgr = dev_manager(quiet=True).start()
    yield mgr
    mgr.stop()


SERVE = """
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", PORT)); s.listen()
while True:
    time.sleep(1)
"""


def production_config(sup: Runner, mgr: DevManager, label: str, port: int) -> Path:
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1

        [[phases]]
        name = "fetch"
        command = {sh("true")}
        report = "param-done"

        [[phases]]
        name = "prod"
        kind = "service"
        gpu_health = true
        restart = "always"
        command = {pyc(SERVE.replace("PORT", str(port)))}
        ready = "tcp://127.0.0.1:{port}"
        report = "running"
        """, stop_grace_s=1)


def instance_of(mgr: DevManager, label: str) -> dict[str, Any]:
    [inst] = [i for i in mgr.state.snapshot()["instances"].values() if i["label"] == label]
    return inst


def test_xid_79_in_production_fails_it_with_gpu_fault_and_gives_the_instance_up(
        sup: Runner, devmgr: DevManager, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json", recovery_action=2)
    label = f"C.gpu-fault-{os.getpid()}"
    console = Console(sup, production_config(sup, devmgr, label, free_port()), env=fake_nvml_env(control))
    console.wait_text("phase prod: service is up")
    control.set(xid=[{"gpu": 0, "xid": 79}])
    status = console.finish(timeout=40)
    out = console.text()
    assert status != 0, out
    record = one_verdict(out, "prod")
    assert " reason=gpu_fault " in record, record
    assert "GPU 0: Xid 79 (fallen off the bus); recovery action: node reboot" in record, record
    assert "attempt 2" not in out  # never restarted (restart = "always"): the GPU is gone
    assert "giving the instance up (phase prod failed)" in out, out
    wait_for(lambda: instance_of(devmgr, label)["history"][-1] == "killed", timeout=10)
    assert instance_of(devmgr, label)["history"] == ["registered", "params_done", "running", "killed"]


def test_xid_13_is_logged_and_nothing_fails(sup: Runner, devmgr: DevManager, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json")
    label = f"C.gpu-xid13-{os.getpid()}"
    console = Console(sup, production_config(sup, devmgr, label, free_port()), env=fake_nvml_env(control))
    console.wait_text("phase prod: service is up")
    control.set(xid=[{"gpu": 0, "xid": 13}])
    console.wait_text("(Xid 13 logged; nothing fails)")
    time.sleep(1.5)  # a tick or two more: still nothing fails
    os.kill(console.proc.pid, signal.SIGTERM)
    status = console.finish(timeout=40)
    out = console.text()
    assert status == 143, out  # (the SIGTERM's 128 + 15: a stop is never said as a success)
    assert "gpu_fault" not in out and "FAILED" not in out, out
    assert instance_of(devmgr, label)["history"] == ["registered", "params_done", "running"]


def test_a_gpu_lost_during_a_oneshot_fails_it_with_gpu_fault(sup: Runner, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json")
    flag = tmp_path / "go"
    cfg = sup.write(f"""
        [[phases]]
        name = "warmup"
        gpu_health = true
        retries = 3
        command = {pyc(f"import time, pathlib; pathlib.Path({str(flag)!r}).touch(); time.sleep(60)")}
        """, stop_grace_s=1)
    console = Console(sup, cfg, env=fake_nvml_env(control))
    wait_for(flag.exists, timeout=20)
    control.set(lost=[0])
    status = console.finish(timeout=40)
    out = console.text()
    assert status != 0, out
    record = one_verdict(out, "warmup")
    assert " reason=gpu_fault " in record and "GPU 0: lost (NVMLError_GpuIsLost: GPU is lost)" in record, record
    assert "attempt 2" not in out  # never retried: no attempt on this machine can succeed


def test_a_fatal_xid_known_before_a_gpu_phase_starts_fails_it_at_once_without_its_child(sup: Runner,
                                                                                        tmp_path: Path) -> None:
    """Xid 79 comes during the download (no GPU use: the fault is kept). The warm-up then started its child on the
    GPU that is gone, and failed a tick later: now it fails before it starts, with the same verdict."""
    control = NvmlControl(tmp_path / "nvml.json", recovery_action=2)
    go, ran = tmp_path / "go", tmp_path / "warmup-ran"
    fetch = f"import time, pathlib\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    cfg = sup.write(f"""
        [[phases]]
        name = "fetch"
        gpu_health = false
        command = {pyc(fetch)}

        [[phases]]
        name = "warmup"
        gpu_health = true
        retries = 3
        command = {pyc(f"import pathlib, time; pathlib.Path({str(ran)!r}).touch(); time.sleep(60)")}
        """, stop_grace_s=1)
    console = Console(sup, cfg, env=fake_nvml_env(control))
    console.wait_text("phase fetch: starting → running")
    control.set(xid=[{"gpu": 0, "xid": 79}])
    console.wait_text("gpu_fault: GPU 0: Xid 79 (fallen off the bus); recovery action: node reboot")
    go.touch()
    status = console.finish(timeout=40)
    out = console.text()
    assert status == EXIT_FAILURE, out
    assert not ran.exists() and "started warmup/warmup" not in out, "the warm-up's child ran on a GPU that is gone"
    record = one_verdict(out, "warmup")
    assert " reason=gpu_fault " in record, record
    assert "GPU 0: Xid 79 (fallen off the bus); recovery action: node reboot; this machine needs replacing" in record
    assert "phase warmup: pending → failed" in out, out
    assert "attempt 2" not in out and "phase fetch: " in out


def test_a_fatal_xid_in_a_gpu_phases_backoff_refuses_its_next_attempt(sup: Runner, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json")
    cfg = sup.write(f"""
        [[phases]]
        name = "warmup"
        gpu_health = true
        retries = 3
        backoff_s = 4
        command = {sh("echo proving; exit 1")}
        """, stop_grace_s=1)
    console = Console(sup, cfg, env=fake_nvml_env(control))
    console.wait_text("phase warmup: stopping → backoff")
    control.set(xid=[{"gpu": 0, "xid": 48}])
    status = console.finish(timeout=40)
    out = console.text()
    assert status == EXIT_FAILURE, out
    assert out.count("started warmup/warmup") == 1, "a second attempt started on a GPU that is gone"
    assert out.index("gpu_fault: GPU 0: Xid 48 (double-bit ECC error)") < out.index("phase warmup: backoff → failed")
    assert last_failure(out, "warmup").endswith(
        ' reason=gpu_fault attempt=1 detail="GPU 0: Xid 48 (double-bit ECC error); this machine needs replacing"'), out
