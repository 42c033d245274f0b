"""The loop never waits on the world: a hung NVML, a hung mount and a big tree are all dealt with off the loop.

Each test makes the world really misbehave: the stand-in pynvml (supervisor/prover/standins/fakenvml)
with every call blocking 120 s, a FUSE mount whose server never answers (tests/hungmount.py: statvfs
and stat block in state D, as on a hung FUSE or NFS parameter cache), a progress tree of 150 000 files.
Meanwhile the supervisor must reap and judge its children, answer ``status``, obey SIGTERM, and turn each
bound that passes into a finding: ``gpu_unresponsive`` naming the NVML call, ``insufficient_disk`` naming
the statvfs. Seconds are printed; they decide nothing but generous bounds against hanging forever.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import (
    PY,
    REPO,
    Runner,
    clean_env,
    first_line,
    heavy,
    kill_tree,
    last_failure,
    one_verdict,
    py_script,
    read,
    seconds_between,
    sh,
    started,
    toml_list,
    toml_str,
    wait_for,
)
from hungmount import held_mount, hung_mount
from standin_nvml import NvmlControl, fake_nvml_env, gpu

from supervisor.engine.loop import EventLoop
from supervisor.engine.offloop import run_bounded, worker_thread
from supervisor.engine.signals import CAUGHT
from supervisor.exits import EXIT_FAILURE

HANG_S = 120  # what the stand-in's calls block for: far longer than any test may take

# The supervisor under test, with ``inject`` (Python: a named constant made shorter) run before main().
LAUNCHER = """\
import sys
{inject}
from supervisor.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Launched:
    """A supervisor started through LAUNCHER, its console in a file the test can watch."""

    def __init__(self, sup: Runner, config: Path, env: dict[str, str], inject: str = "",
                 name: str = "console") -> None:
        launcher = sup.tmp / f"launch-{name}.py"
        launcher.write_text(LAUNCHER.format(inject=textwrap.dedent(inject)))
        self.path = sup.tmp / f"{name}.txt"
        self.started = time.monotonic()
        pythonpath = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO)]))
        with open(self.path, "wb") as out:
            self.proc = subprocess.Popen([PY, str(launcher), "run", "--config", str(config)], stdout=out,
                                         stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                         env=clean_env({**env, "PYTHONPATH": pythonpath}))
        sup.procs.append(self.proc)  # type: ignore[arg-type]

    def text(self) -> str:
        return read(self.path)

    def wait_text(self, needle: str, timeout: float = 30) -> None:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: needle in self.text() or self.proc.poll() is not None, timeout, 0.05)
        if needle not in self.text():
            pytest.fail(f"no {needle!r} within {timeout}s (exit status {self.proc.poll()}):\n{self.text()[-4000:]}")

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            self.proc.wait(10)
            pytest.fail(f"the supervisor did not finish within {timeout}s:\n{self.text()[-4000:]}")

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@pytest.fixture
def nvml(tmp_path: Path) -> NvmlControl:
    return NvmlControl(tmp_path / "nvml.json", log=str(tmp_path / "nvml-calls.log"))


def status_json(sup: Runner, env: dict[str, str]) -> tuple[int, dict, float]:
    began = time.monotonic()
    done = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env(env))
    return done.returncode, json.loads(done.stdout), time.monotonic() - began


def status_text(sup: Runner, env: dict[str, str]) -> str:
    done = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env(env))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


FOREVER_TICKER = """
import time
while True:
    print("tick", flush=True)
    time.sleep(0.5)
"""
FAST_TICKER = """
import time
for i in range(60):
    print("tick", i, flush=True)
    time.sleep(0.1)
"""


def only_the_gpu_thread_called_nvml(nvml: NvmlControl) -> None:
    calls = nvml.calls()
    assert calls, "the supervisor made no NVML call at all"
    elsewhere = [(call, thread) for call, thread in calls if thread != "gpu"]
    assert elsewhere == [], f"NVML called off the GPU thread: {elsewhere}"


# ================================================================ the bounded answer, in-process


def run_until(loop: EventLoop, done: list[object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not done and time.monotonic() < deadline:
        loop.run_once(max_wait=0.05)


def test_an_answer_before_its_bound_is_acted_on_once_on_the_loop() -> None:
    loop = EventLoop()
    try:
        got: list[object] = []
        run_bounded(loop, "job", lambda: threading.current_thread().name, 10, got.append, lambda: got.append("late"))
        run_until(loop, got)
        assert got == ["job"], "the work ran on its own thread, its answer came back to the loop"
    finally:
        loop.close()


def test_a_bound_that_passes_is_acted_on_once_and_the_late_answer_dropped() -> None:
    loop = EventLoop()
    release = threading.Event()
    try:
        got: list[object] = []
        run_bounded(loop, "hung", lambda: release.wait(10) and "answer", 0.1, got.append, lambda: got.append("overdue"))
        run_until(loop, got)
        assert got == ["overdue"]
        release.set()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            loop.run_once(max_wait=0.05)
        assert got == ["overdue"], "an answer after the bound is dropped"
    finally:
        release.set()
        loop.close()


def test_what_the_work_raised_goes_to_its_error_handler() -> None:
    loop = EventLoop()
    try:
        errors: list[Exception] = []

        def work() -> None:
            raise OSError(5, "Input/output error")

        run_bounded(loop, "job", work, 10, lambda _: errors.append(AssertionError("answered")),
                    lambda: errors.append(AssertionError("overdue")), on_error=errors.append)
        run_until(loop, errors)
        assert len(errors) == 1 and isinstance(errors[0], OSError), errors
    finally:
        loop.close()


def test_a_worker_thread_leaves_the_loops_signals_to_the_loop() -> None:
    blocked: list[set[int]] = []
    thread = worker_thread("probe", lambda: blocked.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    thread.join(10)
    assert thread.daemon and blocked and set(CAUGHT) <= blocked[0], blocked


# ================================================================ NVML hangs


def test_a_child_is_reaped_and_judged_while_every_nvml_call_hangs(sup: Runner, nvml: NvmlControl) -> None:
    nvml.set(hang_s=HANG_S)
    config = sup.write(f"""
        [[phases]]
        name = "quick"
        stall_s = 30
        command = {sh("sleep 1; echo done")}
        """)
    run = Launched(sup, config, fake_nvml_env(nvml))
    assert run.finish(60) == 0, run.text()[-4000:]
    out = run.text()
    print(f"whole run {run.seconds:.1f}s with every NVML call hanging {HANG_S}s")
    record = one_verdict(out, "quick")
    assert " reason=exit_code exit_code=0 " in record, record
    child = first_line(out, "started quick/quick: pid")
    verdict = first_line(out, "ended: phase=quick")
    print(f"the child's verdict came {seconds_between(child, verdict):.2f}s after it started (it slept 1s)")
    assert seconds_between(child, verdict) < 20, out
    assert "gpu_unresponsive: nvmlInit has not returned for " in out, out
    evidence = first_line(out, "GPU evidence: unknown; NVML unresponsive (nvmlInit has not returned for ")
    assert out.index(evidence) < out.index("phase quick: pending → starting"), out
    only_the_gpu_thread_called_nvml(nvml)


def test_status_answers_and_names_the_hung_call_while_nvml_hangs(sup: Runner, nvml: NvmlControl) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "work"
        stall_s = 60
        command = {py_script(sup.tmp, "ticker", FOREVER_TICKER)}
        """)
    env = fake_nvml_env(nvml)
    run = Launched(sup, config, env)
    run.wait_text("GPU evidence: 1 GPU(s) via NVML")
    run.wait_text("started work/work: pid")
    nvml.set(hang_s=HANG_S, hang_calls=["nvmlDeviceGetUtilizationRates"])  # the driver hangs mid-run
    run.wait_text("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned for ", timeout=30)

    rc, snap, took = status_json(sup, env)
    print(f"status answered in {took:.2f}s while NVML hung")
    assert rc == 0 and snap["live"] is True, snap
    hung = snap["gpus"]["unresponsive"]
    assert hung["call"] == "nvmlDeviceGetUtilizationRates (GPU 0)" and hung["for_s"] >= 5, hung
    assert snap["gpus"]["samples"] and snap["gpus"]["samples"][0]["name"] == "NVIDIA H200", snap["gpus"]
    text = status_text(sup, env)
    assert "gpus: NVML unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned for " in text, text

    nvml.set(hang_s=0)  # the driver recovers: the hung call returns, and that is said too
    run.wait_text("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) returned after ", timeout=30)
    assert status_json(sup, env)[1]["gpus"]["unresponsive"] is None
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish(30) == 128 + signal.SIGTERM, run.text()[-4000:]
    out = run.text()
    assert out.count("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned") == 1, "said once"
    assert "reason=stalled" not in out, out[-4000:]
    only_the_gpu_thread_called_nvml(nvml)


def test_the_same_call_hung_again_within_the_minute_is_said_again_with_its_count(sup: Runner,
                                                                                nvml: NvmlControl) -> None:
    """A second hang of the same call within the minute was only counted, said (as "1 more") a minute later at the
    earliest: an operator reading the log saw one hang where the GPU hung twice."""
    config = sup.write(f"""
        [[phases]]
        name = "work"
        stall_s = 60
        command = {py_script(sup.tmp, "ticker", FOREVER_TICKER)}
        """)
    run = Launched(sup, config, fake_nvml_env(nvml), inject="""
        import supervisor.evidence.gpuwatch
        supervisor.evidence.gpuwatch.NVML_CALL_TIMEOUT_S = 1.0  # (5 s in production)
        """)
    run.wait_text("started work/work: pid")
    hung = "gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned for "
    nvml.set(hang_s=HANG_S, hang_calls=["nvmlDeviceGetUtilizationRates"])
    run.wait_text(hung, timeout=30)
    nvml.set(hang_s=0)
    run.wait_text("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) returned after ", timeout=30)
    nvml.set(hang_s=HANG_S)  # the same call hangs again, seconds later
    run.wait_text("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) hung again (2nd time in ", timeout=30)
    nvml.set(hang_s=0)
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish(30) == 128 + signal.SIGTERM, run.text()[-4000:]
    out = run.text()
    again = first_line(out, "hung again (2nd time in ")
    assert re.search(r" hung again \(2nd time in \d+ s\): it has not returned for \d+\.\ds$", again), again
    assert out.count(hung) == 1 and out.count("hung again (") == 1, out[-4000:]
    only_the_gpu_thread_called_nvml(nvml)


def test_a_busy_gpu_keeps_a_silent_phase_alive(sup: Runner, nvml: NvmlControl) -> None:
    """GPU evidence from the GPU thread's samples: a working GPU is a sign of life where output is silent."""
    nvml.set(gpus=[gpu(util=87)])
    config = sup.write(f"""
        [[phases]]
        name = "prove"
        stall_s = 2
        command = {sh("sleep 5")}
        """)
    run = Launched(sup, config, fake_nvml_env(nvml))
    assert run.finish(60) == 0, run.text()[-4000:]
    out = run.text()
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "prove") and "stalled" not in out, out
    only_the_gpu_thread_called_nvml(nvml)


def test_a_stall_while_nvml_hangs_says_the_gpu_evidence_was_unknown(sup: Runner,
                                                                    nvml: NvmlControl) -> None:
    """A hung GPU is no sign of work, and the stall decision does not wait for it: it says why GPU evidence
    is missing."""
    nvml.set(gpus=[gpu(util=87)], hang_s=HANG_S, hang_calls=["nvmlDeviceGetUtilizationRates"])
    config = sup.write(f"""
        [[phases]]
        name = "prove"
        stall_s = 2
        command = {sh("sleep 60")}
        """)
    run = Launched(sup, config, fake_nvml_env(nvml))
    assert run.finish(60) != 0, run.text()[-4000:]
    out = run.text()
    record = one_verdict(out, "prove")
    assert " reason=stalled " in record, record
    assert "no output for " in record and "no GPU activity for " in record, record
    assert "(GPU evidence unavailable: NVML unresponsive since " in record, record
    assert "(nvmlDeviceGetUtilizationRates (GPU 0) has not returned for " in record, record


def test_require_gpus_with_nvml_hung_refuses_gpu_unresponsive(sup: Runner, nvml: NvmlControl) -> None:
    nvml.set(hang_s=HANG_S)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh("echo ran")}
        """)
    config.write_text(config.read_text().replace("[supervisor]\n", "[supervisor]\nrequire_gpus = true\n", 1))
    run = Launched(sup, config, fake_nvml_env(nvml))
    assert run.finish(60) == EXIT_FAILURE, run.text()[-4000:]
    out = run.text()
    print(f"refused after {run.seconds:.1f}s")
    line = last_failure(out, "fitness")
    assert "reason=gpu_unresponsive" in line, line
    assert "NVML unresponsive: nvmlInit has not returned for " in line, line
    assert started(out) == [] and "phase p: pending → stopped" in out, out


# ================================================================ a hung mount


def hung_cache_config(sup: Runner, cache: Path) -> Path:
    path = sup.write(f"""
        [[phases]]
        name = "fetch"
        command = {sh("echo fetching")}
        """)
    extra = f'min_param_disk = "1MiB"\nenv = {{ FIL_PROOFS_PARAMETER_CACHE = {toml_str(str(cache))} }}\n'
    path.write_text(path.read_text().replace("[supervisor]\n", "[supervisor]\n" + extra, 1))
    return path


def test_a_hung_parameter_cache_mount_is_insufficient_disk_not_a_hang(sup: Runner) -> None:
    with hung_mount(sup.tmp / "params") as cache:
        run = Launched(sup, hung_cache_config(sup, cache), {}, inject="""
            import supervisor.lifecycle.fitness
            supervisor.lifecycle.fitness.FITNESS_BOUND_S = 3.0  # the test's own: 30 s in production
        """)
        returncode = run.finish(60)
    out = run.text()
    print(f"refused after {run.seconds:.1f}s")
    assert returncode == EXIT_FAILURE, out[-4000:]
    line = last_failure(out, "fitness")
    assert "reason=insufficient_disk" in line, line
    assert f"statvfs({cache}) did not return within 3s (a hung mount?): its free space is unknown" in line, line
    assert started(out) == [] and "phase fetch: pending → stopped" in out, out


def test_sigterm_while_fitness_hangs_on_a_mount_stops_the_run_cleanly(sup: Runner) -> None:
    with hung_mount(sup.tmp / "params") as cache:
        run = Launched(sup, hung_cache_config(sup, cache), {})
        run.wait_text("GPU evidence:")  # said just before the fitness check starts
        time.sleep(0.5)  # the check's thread is in statvfs now, in state D
        os.kill(run.proc.pid, signal.SIGTERM)
        returncode = run.finish(30)
    out = run.text()
    print(f"stopped {run.seconds:.1f}s after the start")
    assert returncode == 128 + signal.SIGTERM, out[-4000:]
    assert "shutting down: received SIGTERM" in out, out
    assert started(out) == [] and "phase fetch: pending → stopped" in out, out
    assert "phase=fitness" not in out, "the check that never answered decided nothing"


@pytest.mark.parametrize("where", ["command", "cwd"])
def test_a_start_on_a_hung_mount_fails_within_its_bound_instead_of_freezing_the_loop(sup: Runner,
                                                                                      where: str) -> None:
    """The command, or its working directory, is on a mount that never answers: execve or chdir blocks in
    the kernel. Popen would wait for that exec for good, and the supervisor with it (no status, no signal,
    no report: the first version did). The start fails at the bound, saying why; the next phase of a
    retry policy, or the exit, follows."""
    with hung_mount(sup.tmp / "mnt") as hung:
        command = [str(hung / "bin" / "prog")] if where == "command" else ["sh", "-c", "echo should not run"]
        extra = f"cwd = {toml_str(str(hung))}" if where == "cwd" else ""
        # Longer than freeze.FREEZE_MIN_S: the loop's own wait must not be taken for a freeze of the supervisor.
        config = sup.write(f"""
            [[phases]]
            name = "p"
            command = {toml_list(command)}
            exec_wait_s = 4
            {extra}
            """)
        run = Launched(sup, config, {})
        returncode = run.finish(60)
    out = run.text()
    print(f"gave up after {run.seconds:.1f}s")
    assert returncode == 126, out[-4000:]
    line = last_failure(out, "p")
    assert "reason=spawn_failed" in line and "exec did not return within 4s" in line, line
    assert "a hung filesystem under the command or its working directory?" in line, line
    assert re.search(r"; pid \d+ killed\"", line), line  # (this wait lets SIGKILL in: the child is gone, reaped)
    assert "should not run" not in out
    assert "the supervisor was frozen" not in out, "its own bounded wait is no freeze"
    assert "Traceback" not in out, out


def test_a_stop_signal_while_a_hung_exec_holds_the_loop_is_said_when_that_start_ends_the_run(sup: Runner) -> None:
    """docker stop while the one start waits for its exec: the loop reads the signal only after the wait, and the
    start's failure, found at the same moment, had ended the run (its status decided, 126). The signal was closed
    away unread: no line said it ever came."""
    with hung_mount(sup.tmp / "mnt") as hung:
        config = sup.write(f"""
            [[phases]]
            name = "p"
            command = {sh("echo should not run")}
            cwd = {toml_str(str(hung))}
            exec_wait_s = 4
            """)
        run = Launched(sup, config, {})
        run.wait_text("phase p: pending → starting")
        time.sleep(1.5)
        run.proc.send_signal(signal.SIGTERM)
        returncode = run.finish(60)
    out = run.text()
    assert returncode == 126 and "reason=spawn_failed" in last_failure(out, "p"), out[-4000:]
    said = [line for line in out.splitlines() if "SIGTERM" in line]
    assert len(said) == 1 and re.search(r"SIGTERM came \d+\.\ds ago, but the exit status was decided before the "
                                        r"loop read it: not acted on", said[0]), out[-4000:]
    assert "Traceback" not in out, out


def test_a_start_killed_before_its_exec_and_stuck_in_the_kernel_is_said_as_that_not_as_an_escapee(
        sup: Runner) -> None:
    """The working directory is on a mount whose server took the chdir's request and never answers: past the
    bound the child is SIGKILLed, but a FUSE request in the server's hands is waited for even then, and the child
    stays (state D, SIGKILL pending) in the phase's cgroup. It was said as "killed" by the start's failure, as an
    escapee of the process tree by the phase's sweep (and killed again), and as an orphan when it went at last."""
    with held_mount(sup.tmp / "mnt") as held:
        config = _stuck_on(sup, held.path, "retries = 1\nbackoff_s = 30")
        run = Launched(sup, config, {})
        run.wait_text("still stuck in the kernel")
        shown = status_text(sup, {})
        held.release()  # the request ends (ENOTCONN) and the child, SIGKILLed long since, with it
        run.wait_text("is gone at last")
        run.proc.send_signal(signal.SIGTERM)  # (rather than the backoff's 30 s)
        returncode = run.finish(60)
    out = run.text()
    assert returncode == 128 + signal.SIGTERM, out[-4000:]
    line = last_failure(out, "p")
    found = re.search(r"; pid (\d+): SIGKILL sent, not gone yet \(stuck in the kernel\)", line)
    assert found and "exec did not return within 1s" in line and "reason=spawn_failed" in line, line
    pid = found[1]
    assert f"pid {pid}: SIGKILL sent, not gone yet" in shown and f"pid {pid} killed" not in shown, shown
    assert re.search(rf"1 process\(es\) killed before its exec, still stuck in the kernel \(a hung mount\?\): "
                     rf"{pid} \(", out), out[-4000:]
    assert f"p/p: pid {pid}, killed before its exec, is gone at last (killed by SIGKILL" in out, out[-4000:]
    assert "escaped" not in out and "orphan" not in out and "should not run" not in out, out[-4000:]
    assert "Traceback" not in out, out


_STUCK = r"; pid (\d+): SIGKILL sent, not gone yet \(stuck in the kernel\)"


def _stuck_on(sup: Runner, held: Path, retrying: str) -> Path:
    """A phase whose working directory is on ``held`` (a held mount: its chdir never returns), with ``retrying``."""
    return sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh("echo should not run")}
        cwd = {toml_str(str(held))}
        exec_wait_s = 1
        """ + retrying)


def test_a_start_stuck_before_its_exec_is_said_stuck_by_the_first_sweep_that_finds_it_only(sup: Runner) -> None:
    """Two attempts' starts, each killed before its exec and stuck on the same held mount: each attempt's sweep
    finds every stuck child in the phase's cgroup, the first one's too. Each is said stuck once, by the first sweep
    that finds it: the second sweep said the first child again (it was stuck as before: no news)."""
    with held_mount(sup.tmp / "mnt") as held:
        # (the third attempt waits 30 s: the SIGTERM comes first)
        config = _stuck_on(sup, held.path, "retries = 2\nbackoff_s = 0.3\nbackoff_factor = 100")
        run = Launched(sup, config, {})
        wait_for(lambda: len(set(re.findall(_STUCK, run.text()))) >= 2 or run.proc.poll() is not None, 30)
        time.sleep(0.5)  # (the second attempt's sweep follows its failure's line)
        held.release()
        wait_for(lambda: run.text().count("is gone at last") >= 2 or run.proc.poll() is not None, 30)
        run.proc.send_signal(signal.SIGTERM)
        returncode = run.finish(60)
    out = run.text()
    assert returncode == 128 + signal.SIGTERM, out[-4000:]
    pids = re.findall(_STUCK, out)
    assert len(set(pids)) == 2, out[-4000:]
    said = [line for line in out.splitlines() if "killed before its exec, still stuck in the kernel" in line]
    assert len(said) == 2, said
    for line, pid in zip(said, sorted(set(pids), key=pids.index), strict=True):
        assert re.search(rf"1 process\(es\) killed before its exec, still stuck in the kernel \(a hung mount\?\): "
                         rf"{pid} \(", line), said
    assert "escaped" not in out and "orphan" not in out and "should not run" not in out, out[-4000:]
    assert "Traceback" not in out, out


def test_a_hung_exec_is_retried_by_the_phases_policy(sup: Runner) -> None:
    """A failed start is a failed attempt like any other: the phase's retries apply, and each is bounded."""
    with hung_mount(sup.tmp / "mnt") as hung:
        config = sup.write(f"""
            [[phases]]
            name = "p"
            command = {toml_list([str(hung / "prog")])}
            retries = 1
            backoff_s = 0.1
            exec_wait_s = 2
            """)
        run = Launched(sup, config, {})
        returncode = run.finish(60)
    out = run.text()
    assert returncode == 126, out[-4000:]
    failures = [line for line in out.splitlines() if "reason=spawn_failed" in line and "FAILED" in line]
    assert len(failures) == 2 and "attempt=1" in failures[0] and "attempt=2" in failures[1], out[-4000:]


def test_a_hung_progress_path_does_not_stop_the_loop(sup: Runner) -> None:
    with hung_mount(sup.tmp / "params") as hung:
        config = sup.write(f"""
            [[phases]]
            name = "fetch"
            stall_s = 30
            progress_path = {toml_str(str(hung))}
            command = {sh("echo fetching; sleep 3; echo fetched")}
            """)
        run = Launched(sup, config, {}, inject="""
            import supervisor.lifecycle.resume
            supervisor.lifecycle.resume.SURVEY_BOUND_S = 2.0  # the test's own: 30 s in production
        """)
        returncode = run.finish(60)
    out = run.text()
    print(f"whole run {run.seconds:.1f}s with the progress path on a hung mount")
    assert returncode == 0, out[-4000:]
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "fetch"), out
    assert f"progress: walking {hung} has not finished after " in out, out
    assert f"phase fetch: its output files in {hung} were not listed within 2s (a hung mount?)" in out, out


# ================================================================ a big tree

WALK_RECORDER = """
    import threading, supervisor.evidence.progress as progress
    _real = progress.tree_done
    def tree_done(path, *args, **kwargs):
        with open({log!r}, "a") as f:
            f.write(threading.current_thread().name + "\\n")
        return _real(path, *args, **kwargs)
    progress.tree_done = tree_done
"""


# Ticks every 0.1s until the supervisor has walked the tree twice (a loaded machine walks 150,000 files slower than
# the 6s of FAST_TICKER), 60 at least, 2 minutes at most; then says how many it printed.
WALKED_TICKER = """
import os, sys, time
walks = sys.argv[1]
i = 0
while i < 1200 and (i < 60 or not os.path.exists(walks) or len(open(walks).read().split()) < 2):
    print("tick", i, flush=True)
    time.sleep(0.1)
    i += 1
print("ticked", i, flush=True)
"""


@heavy
def test_a_big_progress_tree_is_walked_off_the_loop(sup: Runner) -> None:
    tree = sup.tmp / "tree"
    began = time.monotonic()
    for d in range(150):
        folder = tree / f"d{d:03d}"
        folder.mkdir(parents=True)
        for i in range(1000):
            os.close(os.open(folder / f"f{i:04d}", os.O_CREAT | os.O_WRONLY, 0o644))
    print(f"150000 files made in {time.monotonic() - began:.1f}s")
    walks = sup.tmp / "walks.log"
    config = sup.write(f"""
        [[phases]]
        name = "work"
        stall_s = 30
        progress_path = {toml_str(str(tree))}
        command = {py_script(sup.tmp, "ticker", WALKED_TICKER, str(walks))}
        """)
    run = Launched(sup, config, {}, inject=WALK_RECORDER.format(log=str(walks)))
    run.wait_text("] tick 5")
    answers = []
    while run.proc.poll() is None and "] ticked " not in run.text():
        _, snap, took = status_json(sup, {})
        answers.append((snap.get("live"), round(took, 2)))
    returncode = run.finish(120)
    out = run.text()
    print(f"status answers during the walks: {answers}; whole run {run.seconds:.1f}s")
    assert returncode == 0, out[-4000:]
    assert answers and all(live for live, _ in answers), answers
    threads = walks.read_text().split()
    assert len(threads) >= 2 and set(threads) == {"progress"}, f"walks made on {threads}"
    stamps = [line for line in out.splitlines() if "[work/work] tick " in line]
    gaps = [seconds_between(a, b) for a, b in itertools.pairwise(stamps)]
    print(f"{len(stamps)} child lines, the longest gap between two {max(gaps):.2f}s (it prints every 0.1s)")
    ticked = int(first_line(out, "] ticked ").split("] ticked ", 1)[1])
    assert len(stamps) == ticked and max(gaps) < 5, out[-4000:]
