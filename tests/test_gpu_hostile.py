"""The GPU thread in a hostile world (the stand-in pynvml's hostile modes): it survives what it watches, says when
it goes blind, and never floods or spins.

- An answer of the wrong type (utilisation "n/a", memory info None), garbage event data: one bad reading is no
  reading; the thread goes on, and a real Xid 79 afterwards is still found.
- A watch that cannot read for longer than its window says so once, and again when it reads again.
- An event wait that returns at once never spins; an Xid storm is one line and a count, a fatal storm one
  ``gpu_fault`` line.
- A count no machine has is refused (said), a GPU that starts answering NotFound is lost, a 5 MB name is cut.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import PY, REPO, Runner, clean_env, one_verdict, pyc, wait_for
from standin_nvml import NvmlControl, fake_nvml_env
from standin_nvml import gpu as nvml_gpu

from supervisor.config import parse_plan
from supervisor.engine.loop import EventLoop
from supervisor.evidence import gpuwatch
from supervisor.evidence.gpu import GPU_NAME_CHARS, MAX_GPUS, GpuFault
from supervisor.evidence.gpuwatch import Gpus
from supervisor.exits import EXIT_TIMEOUT
from supervisor.lifecycle import fitness
from supervisor.lifecycle.gpuhealth import GpuHealth
from supervisor.lifecycle.states import PhaseState


@pytest.fixture
def gpus() -> Iterator[Gpus]:
    watch = Gpus(blind_s=0.5)
    yield watch
    watch.close()


def faults_of(gpus: Gpus, timeout: float = 10) -> list[GpuFault]:
    found: list[GpuFault] = []
    wait_for(lambda: found.extend(gpus.take_all_faults()[0]) or found, timeout=timeout)
    return found


def calls_of(control: NvmlControl, name: str) -> int:
    return sum(1 for call, _ in control.calls() if call == name)


class Target:
    """The Lifecycle as GPU health sees it: one running phase that uses GPUs, fail_phase recorded."""

    def __init__(self) -> None:
        self.phases = [SimpleNamespace(name="curio", spec=SimpleNamespace(gpu_health=True), state=PhaseState.RUNNING,
                                       attempt_started=0.0)]
        self.failed: list[tuple[str, str, str]] = []

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        self.failed.append((name, reason, detail))
        return True


# ---------------------------------------------------------------- any answer contained; the watch goes on


@pytest.mark.parametrize("call", ["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo"])
def test_an_answer_of_the_wrong_type_is_no_reading_and_the_thread_goes_on(control: NvmlControl, gpus: Gpus,
                                                                           call: str) -> None:
    gpus.watch_health()
    release = gpus.want(0.1)
    wait_for(lambda: gpus.samples(), timeout=10)
    control.set(garbage=[call])
    wait_for(lambda: gpus.sampling.misses >= 3, timeout=10)
    assert gpus._thread is not None and gpus._thread.is_alive(), "one bad answer ended the GPU thread"
    control.set(garbage=[], gpus=[nvml_gpu(util=42)])
    wait_for(lambda: gpus.samples() and gpus.samples()[0].utilization == 42, timeout=10)
    control.set(xid=[{"gpu": 0, "xid": 79}])
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid, fault.fatal) == (0, 79, True), "after a bad answer a real Xid 79 went unseen"
    release()


def test_a_fatal_xid_is_in_hand_though_its_recovery_action_is_never_answered(control: NvmlControl,
                                                                             gpus: Gpus) -> None:
    """The recovery action was read before the fault was handed over: with that read hung (NVML after a driver
    crash), Xid 79 was never said, and the phase failed a minute later as gpu_unresponsive, retried."""
    gpus.watch_health()
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    control.set(xid=[{"gpu": 0, "xid": 79}], hang_s=30, hang_calls=["nvmlDeviceGetFieldValues"])
    try:
        [fault] = faults_of(gpus)
        assert (fault.index, fault.xid, fault.fatal, fault.recovery) == (0, 79, True, None), fault
    finally:
        control.set(hang_s=0)


@pytest.mark.parametrize("error", ["Timeout", "Unknown"])
def test_a_handle_not_given_at_the_first_ask_is_asked_again(control: NvmlControl, error: str) -> None:
    """One Timeout of nvmlDeviceGetHandleByIndex as NVML opened left GPU 1 out for the whole run, and the fitness
    check refused the machine (gpu_unavailable): the same one-off error of a sample is asked again. One Unknown
    Error (NVML's word for a GPU gone after a host reload, and for whatever it cannot name) lost the GPU: a fatal
    fault, where it answered 0.2 s later."""
    control.set(gpus=[nvml_gpu(), nvml_gpu()],
                flaky=[{"gpu": 1, "call": "nvmlDeviceGetHandleByIndex", "error": error, "times": 1}])
    gpus = Gpus()
    try:
        gpus.watch_health()
        wait_for(gpus.opened.is_set, timeout=10)
        assert gpus.take_all_faults()[0] == []
        reading = gpus.latest()
        assert reading is not None and [s.index for s in reading.samples] == [0, 1] and reading.left_out == (), reading
        assert calls_of(control, "nvmlDeviceGetHandleByIndex") == 3  # GPU 0 once, GPU 1 twice
    finally:
        gpus.close()


def test_a_gpu_lost_as_nvml_opens_is_a_fault_and_left_out_with_why(control: NvmlControl) -> None:
    """A GPU whose handle NVML refused with GpuIsLost was no fault and in no line: status said "2 GPU(s) via NVML"
    and listed GPU 0 alone, and a gpu_health phase ran on. It is a lost GPU, asked no more, said where it is
    left out."""
    control.set(gpus=[nvml_gpu(), nvml_gpu()], lost=[1])
    gpus = Gpus()
    try:
        gpus.watch_health()
        wait_for(gpus.opened.is_set, timeout=10)
        [fault] = faults_of(gpus)
        assert (fault.index, fault.xid, fault.fatal) == (1, None, True) and "GpuIsLost" in fault.detail, fault
        reading = gpus.latest()
        assert reading is not None and [s.index for s in reading.samples] == [0], reading
        [(index, why)] = reading.left_out
        assert index == 1 and why.startswith("no handle: NVMLError_GpuIsLost"), why
        assert calls_of(control, "nvmlDeviceGetHandleByIndex") == 2  # a lost GPU is not asked again
    finally:
        gpus.close()


@pytest.mark.parametrize("error", ["NotFound", "DriverNotLoaded"])
def test_a_handle_refused_with_no_word_of_loss_is_left_out_with_no_fault(control: NvmlControl, error: str) -> None:
    """A GPU that never answered is not lost by NotFound (an index NVML counts and cannot reach), nor by Driver Not
    Loaded, a fault only once the driver had answered (docs/verdicts.md): left out, with why, and no fault."""
    control.set(gpus=[nvml_gpu(), nvml_gpu()], errors={"1": error})
    gpus = Gpus()
    try:
        gpus.watch_health()
        wait_for(gpus.opened.is_set, timeout=10)
        reading = gpus.latest()
        assert reading is not None and [index for index, _ in reading.left_out] == [1], reading
        time.sleep(0.5)  # (a fault would be in hand by now: the opening tells one at once)
        assert gpus.take_all_faults()[0] == []
    finally:
        gpus.close()


def test_garbage_event_data_is_no_reading_and_xids_are_still_watched(control: NvmlControl, gpus: Gpus) -> None:
    gpus.watch_health()
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    control.set(garbage=["nvmlEventSetWait_v2"])
    wait_for(lambda: gpus.xid_events.misses >= 2, timeout=10)
    control.set(garbage=[], xid=[{"gpu": 0, "xid": 79}])
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid) == (0, 79), "garbage event data ended the Xid watch"
    assert gpus.events_why.startswith("Xid events watched"), gpus.events_why


def test_a_blind_watch_says_so_once_and_again_when_it_reads(control: NvmlControl, gpus: Gpus) -> None:
    release = gpus.want(0.1)
    wait_for(lambda: gpus.samples(), timeout=10)
    control.set(garbage=["nvmlDeviceGetUtilizationRates"])
    lines: list[str] = []
    wait_for(lambda: lines.extend(gpus.sampling.check()) or lines, timeout=10)
    [blind] = lines
    assert blind.startswith("GPU sampling: no reading for ") and "GPU 0" in blind, blind
    assert gpus.sampling.to_dict()["state"] == "blind"
    time.sleep(1.0)
    assert gpus.sampling.check() == [], "a blind watch is said once, not at every look"
    control.set(garbage=[])
    wait_for(lambda: lines.extend(gpus.sampling.check()) or len(lines) > 1, timeout=10)
    assert lines[1].startswith("GPU sampling: reading again after "), lines
    assert gpus.sampling.to_dict()["state"] == "reading"
    release()


# ---------------------------------------------------------------- never a spin, never a flood


@pytest.mark.parametrize("mode", ["none", "timeout"])
def test_an_event_wait_that_returns_at_once_does_not_spin(control: NvmlControl, gpus: Gpus, mode: str) -> None:
    gpus.watch_health()
    wait_for(lambda: gpus.events_why.startswith("Xid events watched"), timeout=10)
    control.set(wait_at_once=mode)
    time.sleep(0.3)
    before = calls_of(control, "nvmlEventSetWait_v2")
    time.sleep(1.0)
    waits = calls_of(control, "nvmlEventSetWait_v2") - before
    print(f"{waits} event waits in 1 s with a wait that returns at once ({mode})")
    assert waits <= 40, f"{waits} event waits a second: the GPU thread spins"


def test_an_xid_storm_is_one_line_and_a_count(control: NvmlControl, gpus: Gpus) -> None:
    target = Target()
    health = GpuHealth(target, gpus, repeat_s=1.0)
    control.set(xid_storm={"gpu": 0, "xid": 13})
    lines: list[str] = []
    started = time.monotonic()
    while time.monotonic() - started < 2.5:
        lines.extend(health.check(time.monotonic()))
        time.sleep(0.1)
    xid_lines = [line for line in lines if "Xid 13" in line]
    print(f"{len(xid_lines)} Xid 13 lines in 2.5 s of a storm: {xid_lines[:3]}")
    assert 2 <= len(xid_lines) <= 5, xid_lines[:10]
    assert xid_lines[0].startswith("GPU health: GPU 0: Xid 13 (graphics engine exception)"), xid_lines[0]
    assert any(line.startswith("Xid 13 on GPU 0: ") and " more in the last " in line for line in xid_lines), xid_lines
    assert target.failed == []


def test_a_fatal_storm_is_one_gpu_fault_line(control: NvmlControl, gpus: Gpus) -> None:
    target = Target()
    health = GpuHealth(target, gpus, repeat_s=60.0)
    control.set(xid_storm={"gpu": 0, "xid": 79})
    lines: list[str] = []
    started = time.monotonic()
    while time.monotonic() - started < 1.5:
        lines.extend(health.check(time.monotonic()))
        time.sleep(0.1)
    faults = [line for line in lines if line.startswith("gpu_fault:")]
    assert len(faults) == 1, f"{len(faults)} gpu_fault lines: {faults[:3]}"
    assert faults[0] == "gpu_fault: GPU 0: Xid 79 (fallen off the bus)", faults[0]
    assert target.failed and {reason for _, reason, _ in target.failed} == {"gpu_fault"}


def test_an_application_storm_on_a_gpu_that_needs_a_reset_is_one_gpu_fault_line(control: NvmlControl,
                                                                                  gpus: Gpus) -> None:
    # Past FAULTS_MAX the storm's faults are only counted, without their recovery action: they read "Xid 13 logged;
    # nothing fails" right after the gpu_fault the first ones made.
    target = Target()
    health = GpuHealth(target, gpus, repeat_s=60.0)
    control.set(xid_storm={"gpu": 0, "xid": 13}, recovery_action=1)
    lines: list[str] = []
    try:
        wait_for(lambda: gpus._xid._dropped, timeout=20)  # (past FAULTS_MAX untaken: the rest only counted)
        lines.extend(health.check(time.monotonic()))
    finally:
        control.set(xid_storm=None)
        gpus.close()
        if gpus._thread is not None:  # (still in its storm after the test, it was the next test's second one)
            gpus._thread.join(10)
    xid_lines = [line for line in lines if "Xid 13" in line]
    assert xid_lines and all(line.startswith("gpu_fault: GPU 0: Xid 13 ") for line in xid_lines), xid_lines[:3]
    assert len(xid_lines) == 1, xid_lines[:3]
    assert target.failed and {reason for _, reason, _ in target.failed} == {"gpu_fault"}


# ---------------------------------------------------------------- numbers from outside, bounded


def test_a_device_count_no_machine_has_is_refused_and_said(control: NvmlControl, gpus: Gpus) -> None:
    control.set(device_count=5_000_000)
    gpus.start()
    assert gpus.opened.wait(10), "NVML's count of 5000000 GPUs kept the GPU thread busy"
    assert gpus.available is False
    assert gpus.why == f"no GPU: NVML counts 5000000 GPUs, more than any machine has (at most {MAX_GPUS})", gpus.why
    assert calls_of(control, "nvmlDeviceGetHandleByIndex") == 0


def test_a_watch_nobody_wants_samples_of_is_idle_never_blind(control: NvmlControl, gpus: Gpus) -> None:
    # A plain run (no stall_s, no gpu_health, no http_port): the thread samples once at the start, then waits for a
    # request with nothing to do. It never said so, and a window after the start it read "no reading for 30 s"
    # and BLIND, on every machine with a GPU.
    gpus.start()
    assert gpus.opened.wait(10) and gpus.available
    time.sleep(1.0)  # (twice the fixture's window)
    assert gpus.sampling.check() == [] and gpus.sampling.to_dict()["state"] == "idle", gpus.sampling.to_dict()
    release = gpus.want(0.1)  # wanted again: reading
    wait_for(lambda: gpus.sampling.to_dict()["state"] == "reading", timeout=10)
    release()
    time.sleep(1.0)
    assert gpus.sampling.check() == [] and gpus.sampling.to_dict()["state"] == "idle", gpus.sampling.to_dict()


def test_a_machine_whose_nvml_sees_no_gpu_has_no_sampling_to_go_blind(control: NvmlControl, gpus: Gpus) -> None:
    # NVML opens but counts 0 devices: "no GPU" was said, and a phase with stall_s wanting samples then read BLIND
    # a window later, for samples that can never come.
    control.set(device_count=0)
    release = gpus.want(0.1)
    assert gpus.opened.wait(10) and gpus.available is False
    time.sleep(1.0)
    assert gpus.sampling.check() == [], gpus.sampling.to_dict()
    assert gpus.sampling.to_dict()["state"] == "stopped", gpus.sampling.to_dict()
    release()


def test_a_count_of_the_wrong_type_is_no_gpu(control: NvmlControl, gpus: Gpus) -> None:
    control.set(garbage=["nvmlDeviceGetCount"])
    gpus.start()
    assert gpus.opened.wait(10)
    assert gpus.why == "no GPU: NVML's device count is no number ('n/a')", gpus.why


def test_a_gpu_that_starts_answering_not_found_is_lost(control: NvmlControl, gpus: Gpus) -> None:
    control.set(gpus=[nvml_gpu(), nvml_gpu()])
    gpus.watch_health()
    release = gpus.want(0.1)
    wait_for(lambda: len(gpus.samples()) == 2, timeout=10)
    control.set(not_found=[1])
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid, fault.fatal) == (1, None, True)
    assert fault.describe() == "GPU 1: lost (NVMLError_NotFound: Not Found)"
    release()



def test_one_unknown_error_of_a_gpu_is_asked_again_and_only_a_second_one_loses_it(control: NvmlControl,
                                                                                  gpus: Gpus) -> None:
    # "Unknown Error" is NVML's word for a GPU gone after a host reload, and for whatever it cannot name: one of
    # them gave the instance up (a fatal fault) where the same call answered 0.2 s later. Said twice, it is lost.
    control.set(gpus=[nvml_gpu(), nvml_gpu()])
    gpus.watch_health()
    release = gpus.want(0.1)
    wait_for(lambda: len(gpus.samples()) == 2, timeout=10)
    control.set(gpus=[nvml_gpu(), nvml_gpu()],
                flaky=[{"gpu": 1, "call": "nvmlDeviceGetMemoryInfo", "error": "Unknown", "times": 1}])
    wait_for(lambda: calls_of(control, "nvmlDeviceGetMemoryInfo") >= 12, timeout=10)  # (rounds after it)
    assert gpus.take_all_faults()[0] == []
    assert [s.index for s in gpus.samples()] == [0, 1]
    control.set(gpus=[nvml_gpu(), nvml_gpu()], errors={"1": "Unknown"})
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid, fault.fatal) == (1, None, True)
    assert fault.describe() == "GPU 1: lost (NVMLError_Unknown: Unknown Error)"
    release()


@pytest.mark.parametrize(("suffix", "said"), [("ResetRequired", "GPU requires restart"),
                                              ("GpuNotFound", "NVML Error with code 28"),
                                              ("DriverNotLoaded", "Driver Not Loaded")])
def test_a_gpu_that_needs_a_reset_or_is_gone_from_the_driver_is_lost(control: NvmlControl, gpus: Gpus,
                                                                       suffix: str, said: str) -> None:
    # NVML's other words for a GPU no container can use again: a reset it cannot make, a GPU the driver no
    # longer finds, the driver unloaded. Read as a bad sample only, production went on counting on it.
    control.set(gpus=[nvml_gpu(), nvml_gpu()])
    gpus.watch_health()
    release = gpus.want(0.1)
    wait_for(lambda: len(gpus.samples()) == 2, timeout=10)
    control.set(errors={"1": suffix})
    [fault] = faults_of(gpus)
    assert (fault.index, fault.xid, fault.fatal) == (1, None, True)
    assert fault.describe() == f"GPU 1: lost (NVMLError_{suffix}: {said})"
    release()

def test_a_huge_gpu_name_is_cut(control: NvmlControl, gpus: Gpus) -> None:
    control.set(gpus=[nvml_gpu(name="H" * (5 << 20))])
    gpus.start()
    assert gpus.opened.wait(20)
    [sample] = gpus.samples()
    assert len(sample.name) <= GPU_NAME_CHARS and sample.name.startswith("HHHH"), len(sample.name)


def test_a_slow_nvml_is_no_finding_where_gpus_are_not_required(control: NvmlControl) -> None:
    """NVML's first answer is awaited only to be said: slow (here 3 s, never hung by its own bound), it must not
    fail the fitness check with gpu_unresponsive when no phase needs a GPU."""
    control.set(hang_s=3, hang_calls=["nvmlDeviceGetCount"])
    gpus = Gpus(call_timeout_s=100)
    plan = parse_plan('[[phases]]\nname = "job"\ncommand = ["true"]\n', "test.toml", {})
    assert plan.supervisor.require_gpus is False
    loop, decided = EventLoop(), []
    try:
        gpus.start()
        fitness.check(loop, plan, None, gpus, lambda findings, evidence: decided.append(findings),
                      on_error=lambda exc: decided.append([exc]), bound_s=2.0)
        loop.run_until(lambda: bool(decided), 0.1)
    finally:
        control.set(hang_s=0)
        gpus.close()
    assert decided == [[]], decided


# ---------------------------------------------------------------- a real supervisor: said once, shown in status

LAUNCHER = """\
import sys
import supervisor.evidence.gpuwatch
supervisor.evidence.gpuwatch.GPU_BLIND_S = 1.0  # the test's own: 30 s in production
from supervisor.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def launch_blind_soon(sup: Runner, tmp_path: Path, cfg: Path, control: NvmlControl
                      ) -> tuple[subprocess.Popen[bytes], Path]:
    """``run --config cfg`` through LAUNCHER on the stand-in NVML ``control`` drives: its output in the file
    returned, the process handed to ``sup`` to clean up."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    out_path = tmp_path / "launched.txt"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([PY, str(launcher), "run", "--config", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                cwd=REPO, start_new_session=True, env=clean_env(fake_nvml_env(control)))
    sup.procs.append(proc)  # type: ignore[arg-type]
    return proc, out_path


def test_a_blind_gpu_watch_is_said_once_and_shown_by_status(sup: Runner, tmp_path: Path) -> None:
    control = NvmlControl(tmp_path / "nvml.json")
    flag = tmp_path / "up"
    cfg = sup.write(f"""
        [[phases]]
        name = "prove"
        gpu_health = true
        command = {pyc(f"import time, pathlib; pathlib.Path({str(flag)!r}).touch(); time.sleep(60)")}
        """, stop_grace_s=1)
    proc, out_path = launch_blind_soon(sup, tmp_path, cfg, control)
    text = lambda: out_path.read_text(errors="replace")  # noqa: E731
    wait_for(flag.exists, timeout=30)
    control.set(garbage=["nvmlDeviceGetUtilizationRates"])
    wait_for(lambda: "GPU sampling: no reading for " in text(), timeout=20)
    snap = json.loads(subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                                     capture_output=True, text=True, cwd=REPO, timeout=20).stdout)
    sampling = snap["watches"]["GPU sampling"]
    assert sampling["state"] == "blind" and "GPU 0: BadAnswer: utilization.gpu is 'n/a'" in sampling["why"], sampling
    assert snap["watches"]["GPU Xid events"]["state"] == "reading", snap["watches"]
    shown = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                           capture_output=True, text=True, cwd=REPO, timeout=20).stdout
    assert "watches: GPU sampling BLIND since " in shown, shown
    control.set(garbage=[])
    wait_for(lambda: "GPU sampling: reading again after " in text(), timeout=20)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(40)
    out = text()
    assert out.count("GPU sampling: no reading for ") == 1, out
    assert "Traceback" not in out and "internal error" not in out, out


def test_a_gpu_thread_that_fails_says_so_and_starts_again(control: NvmlControl, gpus: Gpus,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug of ours in the thread (here: the sampling raising once, as no NVML answer can make it now) is said on
    the next tick and the thread starts again: samples and Xid events come back."""
    real, calls = gpuwatch.sample_all, []

    def fails_once(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is not gpus._thread:  # (an earlier test's thread, ending late: not counted)
            return real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a bug of ours")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpuwatch, "THREAD_RESTART_S", 0.2)
    monkeypatch.setattr(gpuwatch, "sample_all", fails_once)
    gpus.watch_health()
    release = gpus.want(0.1)
    # (the stand-in NVML opened: a failure here says why, where the wait below would only time out)
    assert gpus.opened.wait(10) and gpus.available, (gpus.why, gpus.sampling.check())
    lines: list[str] = []
    wait_for(lambda: lines.extend(gpus.sampling.check()) or lines, timeout=10)
    assert lines == ["GPU sampling: stopped unexpectedly (the GPU thread failed: RuntimeError: a bug of ours); "
                     "started again in 0.2 s"], lines
    wait_for(lambda: len(calls) >= 6 and gpus.available, timeout=10)
    control.set(xid=[{"gpu": 0, "xid": 79}])
    [fault] = faults_of(gpus)
    assert fault.xid == 79
    release()


def test_figures_from_before_the_gpu_thread_failed_are_not_shown_as_now(control: NvmlControl, gpus: Gpus,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the thread starts again, "no GPU evidence for now" stood beside the last utilisation read before the
    failure, not stale: status, /metrics and the plugin's machine() showed it as now."""
    real, calls = gpuwatch.sample_all, []

    def fails_third(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is not gpus._thread:  # (an earlier test's thread, ending late: not counted)
            return real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a bug of ours")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpuwatch, "THREAD_RESTART_S", 30.0)  # (it stays down for the test)
    monkeypatch.setattr(gpuwatch, "sample_all", fails_third)
    control.set(gpus=[nvml_gpu(util=87)])
    release = gpus.want(0.1)
    wait_for(lambda: gpus.samples(), timeout=10)
    wait_for(lambda: not gpus.available, timeout=10)
    assert gpus.why.startswith("no GPU evidence for now: the GPU thread failed"), gpus.why
    assert gpus.latest() is None and gpus.samples() == ()
    release()


def test_the_time_the_supervisor_was_frozen_is_no_time_nvml_took(control: NvmlControl) -> None:
    """docker pause (SIGSTOP) stops the GPU thread inside its call with the rest: after the thaw, the call's age
    counted the pause, and a 65 s pause failed the phase gpu_unresponsive (8 s: a false "returned after 8.1s"
    and a slow call counted). A call counts from the thaw at the earliest; one that spanned it is no slow call."""
    gpus = Gpus(call_timeout_s=0.5)
    thawed: list[float | None] = [None]
    gpus.thawed_at = lambda: thawed[0]
    try:
        control.set(hang_s=30, hang_calls=["nvmlDeviceGetUtilizationRates"])
        release = gpus.want(0.1)
        hung = wait_for(lambda: gpus.unresponsive(), timeout=10)
        assert hung is not None
        now = time.monotonic()
        thawed[0] = now - 0.2  # the supervisor was frozen until a moment ago: the call is 0.2 s old, not more
        assert gpus.unresponsive(now) is None
        later = gpus.unresponsive(now + 0.4)
        assert later is not None and later.since == thawed[0] and later.describe(now + 0.4).endswith("for 0.6s")
        assert [line for line in gpus.check(now) if "gpu_unresponsive" in line] == []
        control.set(hang_s=0)  # it returns: it began before the thaw, so its time is not NVML's
        wait_for(lambda: gpus.unresponsive() is None and control.calls(), timeout=40)
        time.sleep(0.3)
        assert [line for line in gpus.check() if "returned after" in line] == [] and gpus.slow_calls == 0
        release()
    finally:
        gpus.close()


def test_a_driver_slow_on_every_call_is_one_line_a_call_then_a_count(control: NvmlControl) -> None:
    gpus = Gpus(call_timeout_s=0.2)
    try:
        release = gpus.want(0.1)
        assert gpus.opened.wait(10)
        control.set(hang_s=0.3, hang_calls=["nvmlDeviceGetUtilizationRates"])
        lines: list[str] = []
        started = time.monotonic()
        while time.monotonic() - started < 3:
            lines.extend(gpus.check())
            time.sleep(0.05)
        returned = [line for line in lines if "returned after" in line]
        print(f"{len(lines)} lines in 3 s of every sample slow: {lines[:4]}")
        assert len(returned) == 1, returned
        assert gpus.slow_calls >= 5, "each slow call is still counted"
        release()
    finally:
        control.set(hang_s=0)
        gpus.close()


def test_a_stall_while_gpu_sampling_is_blind_says_so_in_its_verdict(sup: Runner, tmp_path: Path) -> None:
    """The reviewer's run, shortened (GPU_BLIND_S 1 s, stall_s 6): a GPU at 100 % whose memory info turns to
    garbage. Each failed sample was published without the GPU and read as a GPU at rest: the verdict said
    "no GPU activity for 35.1s" while the GPU watch was blind, with no word of it."""
    control = NvmlControl(tmp_path / "nvml.json", gpus=[nvml_gpu(util=100)])
    flag = tmp_path / "up"
    cfg = sup.write(f"""
        [[phases]]
        name = "prove"
        stall_s = 6
        command = {pyc(f"import time, pathlib; time.sleep(2); pathlib.Path({str(flag)!r}).touch(); time.sleep(120)")}
        """, stop_grace_s=1)
    proc, out_path = launch_blind_soon(sup, tmp_path, cfg, control)
    wait_for(flag.exists, timeout=30)
    control.set(garbage=["nvmlDeviceGetMemoryInfo"])  # from now on no reading of the GPU, busy as it is
    assert proc.wait(120) == EXIT_TIMEOUT
    out = out_path.read_text(errors="replace")
    record = one_verdict(out, "prove")
    assert " reason=stalled " in record, record
    assert ("(GPU evidence unavailable: GPU sampling blind: GPU 0: BadAnswer: memory.total is None, not a whole "
            "number from 0 to ") in record, record
