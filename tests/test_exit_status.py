"""The supervisor's exit status is the status of the phase that failed the lifecycle.

Real children, real wait statuses: exit codes (a real supervisor, as PID 1 and as a subreaper, for a spread
of codes; the verdict of every code 0..255 in-process, from its real wait status), deaths by signal (128 + n,
with the signal named in the verdict and a core dump reported only when one was really written), spawn
failures (127, 126), and the ECHILD trap (a crashed phase must never be reported as a success).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import (
    PY,
    REPO,
    Result,
    Runner,
    clean_env,
    finish,
    needs_unshare,
    one_verdict,
    sh,
    shell,
    toml_list,
    toml_str,
    verdict_lines,
)

from supervisor.engine.reaping import ExitStatus, Reaper
from supervisor.exits import EXIT_TIMEOUT
from supervisor.lifecycle.verdict import EXIT_CODE, from_exit


def failing_then_marker(runner: Runner, command: str, marker: Path, extra: str = "",
                        name: str = "p") -> Path:
    """A config: phase ``name`` runs ``command``; phase ``after`` creates ``marker`` (only if it succeeded)."""
    return runner.write(f"""
        [[phases]]
        name = "{name}"
        command = {command}
        {extra}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """, stop_grace_s=1)


def run_exit_codes(base: Path, codes: list[int], *, pid1: bool) -> dict[int, tuple[Result, bool]]:
    """One supervisor per code, four at a time; each gets its own directory. Returns result and marker."""
    runners = {}
    for code in codes:
        directory = base / f"code{code}"
        directory.mkdir()
        runners[code] = Runner(directory)

    def one(code: int) -> tuple[Result, bool]:
        runner = runners[code]
        marker = runner.tmp / "after.marker"
        # Each its own phase name: the supervisors run side by side (same-name phases share a cgroup
        # name; that case has its own test below).
        config = failing_then_marker(runner, sh(f"exit {code}"), marker, name=f"p{code}")
        result = runner.run(config, timeout=30, pid1=pid1)
        return result, marker.exists()

    try:
        with ThreadPoolExecutor(4) as pool:
            return dict(zip(codes, pool.map(one, codes), strict=True))
    finally:
        for runner in runners.values():
            runner.cleanup()


def check_exit_code_result(code: int, result: Result, marker: bool, phase: str = "p") -> None:
    assert result.returncode == code, f"code {code}: supervisor exited {result.returncode}:\n{result.output}"
    assert "Traceback" not in result.output
    verdict = one_verdict(result.output, phase)
    if code == 0:
        assert marker, f"code 0: the next phase did not run:\n{result.output}"
        assert "reason=exit_code exit_code=0 " in verdict
        assert "lifecycle complete" in result.output
    else:
        assert not marker, f"code {code}: the phase after a failed one ran:\n{result.output}"
        assert f"reason=exit_code exit_code={code} " in verdict
        assert f"phase {phase}: stopping → failed" in result.output
    assert f"exiting with status {code}" in result.output


# ---------------------------------------------------------------- exit codes


# The codes a real supervisor is run for: the ends, the shell's own (125..128), and those that read like a
# signal's (128 + n). Every code's verdict is decided in-process too (test_every_exit_code_is_the_phases_status).
EXIT_CODES = [0, 1, 2, 3, 42, 125, 126, 127, 128, 137, 143, 254, 255]


@pytest.mark.parametrize("code", EXIT_CODES)
def test_exit_code_becomes_supervisor_status(sup: Runner, code: int) -> None:
    marker = sup.tmp / "after.marker"
    result = sup.run(failing_then_marker(sup, shell(f"exit {code}"), marker), timeout=30)
    check_exit_code_result(code, result, marker.exists())
    assert result.output.splitlines()[0].split(" [supervisor] ")[1].startswith("prover-supervisor pid ")


@needs_unshare
def test_exit_codes_as_pid1(sup: Runner) -> None:
    """As real PID 1: the supervisor's exit status equals the failed phase's code. The same spread of codes as
    the subreaper's above; what each of 0..255 becomes is the verdict's (test_every_exit_code_is_the_phases_status),
    the same for every code: 256 supervisors would check no more of PID 1 than these do."""
    started = time.monotonic()
    results = run_exit_codes(sup.tmp, EXIT_CODES, pid1=True)
    elapsed = time.monotonic() - started
    for code, (result, marker) in results.items():
        assert " as pid1;" in result.output.splitlines()[0], result.output
        check_exit_code_result(code, result, marker, phase=f"p{code}")
    print(f"{len(EXIT_CODES)} supervisors as PID 1 in {elapsed:.1f}s "
          f"({elapsed / len(EXIT_CODES) * 4:.2f}s each, 4 at a time)")


def test_every_exit_code_is_the_phases_status() -> None:
    """Each of 0..255, from a real child's wait status: the verdict is the child's code, and so the status the
    supervisor exits with (0 only for 0, when the lifecycle goes on), never another code."""
    for code in range(256):
        status = ExitStatus.from_wait_status(_wait_statuses_of_every_exit()[code])
        verdict = from_exit("p", "p", 1, status, stop_reason=None, daemon=False, attempt=1, started_at=0.0,
                            last_lines=[])
        assert verdict.success is (code == 0), (code, verdict)
        assert (verdict.reason, verdict.exit_code, verdict.status) == (EXIT_CODE, code, code), (code, verdict)
        assert verdict.detail == f"exited with code {code}", (code, verdict)


# ---------------------------------------------------------------- signals

KILLING_SIGNALS = ["SIGKILL", "SIGSEGV", "SIGABRT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGBUS", "SIGINT",
                   "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGALRM", "SIGFPE", "SIGILL"]


def _signal_config(sup: Runner, signame: str, marker: Path, core_limit: str = "0") -> Path:
    # The shell kills itself: nothing else is involved in the death but the kernel.
    script = f"ulimit -c {core_limit}; echo about to die; kill -{signame[3:]} $$; echo survived; exit 0"
    return failing_then_marker(sup, shell(script), marker, extra=f"cwd = {toml_str(str(sup.tmp))}")


@pytest.mark.parametrize("pid1", [False, pytest.param(True, marks=needs_unshare)], ids=["subreaper", "pid1"])
@pytest.mark.parametrize("signame", KILLING_SIGNALS)
def test_killed_by_signal(sup: Runner, signame: str, pid1: bool) -> None:
    signum = int(getattr(signal, signame))
    marker = sup.tmp / "after.marker"
    result = sup.run(_signal_config(sup, signame, marker), timeout=30, pid1=pid1)
    assert result.returncode == 128 + signum, result.output
    assert not marker.exists()
    assert "[p/p] survived" not in result.output
    assert "[p/p] about to die" in result.output
    verdict = one_verdict(result.output, "p")
    assert f" reason=signal signal={signame} " in verdict, verdict
    assert "exit_code=" not in verdict
    # RLIMIT_CORE is 0 in the child: no core can be dumped, so none may be claimed.
    assert "core_dumped" not in verdict
    assert "core dumped" not in verdict
    assert not list(sup.tmp.glob("core*"))
    assert f"killed by {signame} (status {128 + signum})" in verdict
    assert f"exiting with status {128 + signum}" in result.output
    assert "Traceback" not in result.output


# What ``nohup`` and some job-control shells leave to what they start: SIGHUP (nohup) and SIGQUIT
# ignored; and a harness may leave signals blocked. Ignored dispositions and the mask survive exec.
IGNORING_LAUNCHER = """
import os, signal, sys
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGQUIT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGTERM})
os.execv(sys.executable, [sys.executable, "-m", "supervisor", "run", "--config", sys.argv[1]])
"""


def start_with_signals_ignored(sup: Runner, config: Path, how: str) -> subprocess.Popen[str]:
    """The supervisor started as the manager's onstart starts it: under the real ``nohup``, or through a
    launcher that also ignores SIGQUIT and blocks SIGUSR2 and SIGTERM."""
    if how == "nohup":
        if shutil.which("nohup") is None:
            pytest.skip("nohup(1) is not installed")
        argv = ["nohup", *sup.argv(config)]
    else:
        launcher = sup.tmp / "ignoring_launcher.py"
        launcher.write_text(IGNORING_LAUNCHER)
        argv = [PY, str(launcher), str(config)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=clean_env(), cwd=REPO, start_new_session=True)
    sup.procs.append(proc)
    return proc


@pytest.mark.parametrize(("how", "signame"), [("nohup", "SIGHUP"), ("launcher", "SIGHUP"), ("launcher", "SIGQUIT")])
def test_a_child_dies_of_its_own_signal_even_when_the_supervisor_started_with_it_ignored(
        sup: Runner, how: str, signame: str) -> None:
    """Issue 10, item 12: the child's own ``kill -HUP $$`` / ``kill -QUIT $$`` must kill it."""
    signum = int(getattr(signal, signame))
    marker = sup.tmp / "after.marker"
    result = finish(start_with_signals_ignored(sup, _signal_config(sup, signame, marker), how), time.monotonic(), 30)
    assert result.returncode == 128 + signum, result.output
    assert "[p/p] survived" not in result.output
    verdict = one_verdict(result.output, "p")
    assert f" reason=signal signal={signame} " in verdict, verdict
    assert not marker.exists()


def status_field(output: str, name: str) -> str:
    found = re.findall(rf"\[p/p\] {name}:\s+(\S+)", output)
    assert len(found) == 1, f"no single {name} line in:\n{output}"
    return found[0]


@pytest.mark.parametrize("how", ["nohup", "launcher"])
def test_children_start_with_no_signal_ignored_or_blocked(sup: Runner, how: str) -> None:
    """cat, exec'd straight by the supervisor, shows what it was given: SigIgn and SigBlk all zero."""
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {toml_list(["cat", "/proc/self/status"])}
        """)
    result = finish(start_with_signals_ignored(sup, config, how), time.monotonic(), 30)
    assert result.returncode == 0, result.output
    assert int(status_field(result.output, "SigIgn"), 16) == 0, result.output
    assert int(status_field(result.output, "SigBlk"), 16) == 0, result.output


def test_a_supervisor_started_with_sigterm_blocked_still_stops_on_it(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "p"
        kind = "service"
        command = {shell("echo serving; exec sleep 60")}
        """)
    proc = start_with_signals_ignored(sup, config, "launcher")
    started = time.monotonic()
    assert proc.stdout is not None
    for line in proc.stdout:
        if "[p/p] serving" in line:
            break
    proc.send_signal(signal.SIGTERM)
    result = finish(proc, started, 30)
    assert result.returncode == 128 + signal.SIGTERM, result.output
    assert "shutting down: received SIGTERM" in result.output


@pytest.mark.parametrize("signame", ["SIGSEGV", "SIGABRT", "SIGQUIT"])
def test_core_dump_reported_only_when_dumped(sup: Runner, signame: str) -> None:
    """With RLIMIT_CORE raised the kernel writes a core (core_pattern permitting): then, and only then, say so."""
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    if hard == 0:
        pytest.skip("hard RLIMIT_CORE is 0: no process here can dump core")
    signum = int(getattr(signal, signame))
    marker = sup.tmp / "after.marker"
    result = sup.run(_signal_config(sup, signame, marker, core_limit="unlimited"), timeout=30)
    assert result.returncode == 128 + signum, result.output
    verdict = one_verdict(result.output, "p")
    assert f" reason=signal signal={signame} " in verdict
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    cores = list(sup.tmp.glob("core*"))
    # A pipe handler takes the core elsewhere: then the wait status is the only evidence; check it directly.
    dumped = _dumps_core(signum, sup.tmp) if pattern.startswith("|") else bool(cores)
    if dumped:
        assert " core_dumped=yes " in verdict, verdict
        assert f"(status {128 + signum}, core dumped)" in verdict
    else:
        assert "core_dumped" not in verdict and "core dumped" not in verdict, verdict
    print(f"core_pattern={pattern!r}: core dumped={dumped} ({[c.name for c in cores]})")


def _dumps_core(signum: int, cwd: Path) -> bool:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        _die_by(signum, core=True, cwd=cwd)
    _, status = os.waitpid(pid, 0)
    return os.WCOREDUMP(status)


# ---------------------------------------------------------------- spawn failures


def _spawn_failure(sup: Runner, command: list[str], *, cwd: str | None = None, extra: str = "",
                   pid1: bool = False) -> tuple[Result, str, bool]:
    marker = sup.tmp / "after.marker"
    extra = f"cwd = {toml_str(cwd)}" if cwd is not None else extra
    result = sup.run(failing_then_marker(sup, toml_list(command), marker, extra=extra), timeout=30, pid1=pid1)
    assert "Traceback" not in result.output, result.output
    assert not re.search(r"\b(?:FileNotFound|Permission|OS|Subprocess)Error\b", result.output), result.output
    return result, one_verdict(result.output, "p"), marker.exists()


@pytest.mark.parametrize("pid1", [False, pytest.param(True, marks=needs_unshare)], ids=["subreaper", "pid1"])
def test_command_not_found_is_127(sup: Runner, pid1: bool) -> None:
    missing = str(sup.tmp / "no-such-program")
    result, verdict, marker = _spawn_failure(sup, [missing, "--flag"], pid1=pid1)
    assert result.returncode == 127, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict
    assert "command not found" in verdict
    assert missing in verdict
    assert "pid=" not in verdict  # nothing was started
    assert "exiting with status 127" in result.output


def test_program_not_on_path_is_127(sup: Runner) -> None:
    result, verdict, marker = _spawn_failure(sup, ["surely-no-such-program-xyzzy"])
    assert result.returncode == 127, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict and "command not found" in verdict


def test_not_executable_is_126(sup: Runner) -> None:
    script = sup.tmp / "not-executable.sh"
    script.write_text("#!/bin/sh\necho should not run\n")
    script.chmod(0o644)  # no x bit at all: even root may not execute it
    result, verdict, marker = _spawn_failure(sup, [str(script)])
    assert result.returncode == 126, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict
    assert "permission denied" in verdict
    assert "[p/p] should not run" not in result.output


@pytest.mark.parametrize("named", ["by-path", "on-PATH"])
def test_a_script_whose_interpreter_is_missing_is_126_and_says_so(sup: Runner, named: str) -> None:
    """The kernel answers ENOENT for a missing ``#!`` interpreter, as for a missing program: "command not
    found" would send the reader looking for the script, which is there. Said as bash says it."""
    bin_dir = sup.tmp / "bin"
    bin_dir.mkdir()
    script = bin_dir / "fetch-params"
    script.write_text("#!/opt/no-such-python/bin/python3 -u\nprint('should not run')\n")
    script.chmod(0o755)
    command = [str(script)] if named == "by-path" else ["fetch-params"]
    extra = f"env = {{ PATH = {toml_str(f'{bin_dir}:/usr/bin:/bin')} }}" if named == "on-PATH" else ""
    result, verdict, marker = _spawn_failure(sup, command, extra=extra)
    assert result.returncode == 126, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict
    assert "bad interpreter: /opt/no-such-python/bin/python3: not found" in verdict, verdict
    assert "command not found" not in verdict


def test_a_relative_script_in_its_working_directory_whose_interpreter_is_missing_is_126(sup: Runner) -> None:
    """``./run.sh`` with ``cwd``: the script is looked at where the child ran it (its working directory), not
    where the supervisor runs: there is no run.sh there, and "command not found" would be said."""
    work = sup.tmp / "work"
    work.mkdir()
    script = work / "run.sh"
    script.write_text("#!/opt/no-such-shell -e\necho should not run\n")
    script.chmod(0o755)
    result, verdict, marker = _spawn_failure(sup, ["./run.sh"], cwd=str(work))
    assert result.returncode == 126, result.output
    assert not marker
    assert "./run.sh: bad interpreter: /opt/no-such-shell: not found" in verdict, verdict


def test_a_script_saved_with_windows_line_ends_says_so(sup: Runner) -> None:
    """``#!/bin/sh\r\n``: the kernel looks for an interpreter named "/bin/sh\r", which is not there. Said as
    bash says it (the CR shown as ^M), with the cause, not as a missing /bin/sh (which is there)."""
    script = sup.tmp / "fetch-params"
    script.write_bytes(b"#!/bin/sh\r\necho should not run\r\n")
    script.chmod(0o755)
    result, verdict, marker = _spawn_failure(sup, [str(script)])
    assert result.returncode == 126, result.output
    assert not marker
    assert "bad interpreter: /bin/sh^M: not found (the script's lines end in CR LF" in verdict, verdict


def _path_with_a_file_for_a_directory(tmp: Path) -> str:
    not_a_dir = tmp / "bin"
    not_a_dir.write_text("a file where a directory of programs was meant\n")
    return str(not_a_dir)


def _path_with_a_non_executable_first(tmp: Path) -> str:
    first, second = tmp / "a", tmp / "b"
    first.mkdir()
    second.mkdir()
    (first / "fetch-params").write_text("#!/bin/sh\necho should not run\n")  # not executable
    return f"{first}:{second}"


@pytest.mark.parametrize(("make_path", "status", "said"), [
    # The exec through an entry that is a file fails ENOTDIR: not found there, as a shell says (not "cannot
    # execute: Not a directory").
    (_path_with_a_file_for_a_directory, 127, "fetch-params: command not found"),
    # As execvp: the first directory holding the name but not executable is the error said, though a later
    # directory holds nothing: not "command not found".
    (_path_with_a_non_executable_first, 126, "fetch-params: permission denied (not executable)"),
], ids=["a-file-on-PATH", "not-executable-earlier-on-PATH"])
def test_what_a_search_of_path_finds_is_said_as_a_shell_says_it(sup: Runner, make_path: Callable[[Path], str],
                                                                 status: int, said: str) -> None:
    extra = f"env = {{ PATH = {toml_str(make_path(sup.tmp))} }}"
    result, verdict, marker = _spawn_failure(sup, ["fetch-params"], extra=extra)
    assert result.returncode == status, result.output
    assert not marker
    assert said in verdict, verdict


def test_directory_as_command_is_126(sup: Runner) -> None:
    result, verdict, marker = _spawn_failure(sup, [str(sup.tmp)])
    assert result.returncode == 126, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict
    assert f"{sup.tmp}: is a directory" in verdict, verdict  # (not "permission denied (not executable)")


def test_a_program_on_a_noexec_mount_says_so(sup: Runner, tmpfs: Callable[[Path, str], Path]) -> None:
    # "permission denied (not executable)" sent the operator to chmod a file already rwx, on a volume mounted noexec.
    where = tmpfs(sup.tmp / "vol", "1m")
    remount = subprocess.run(["mount", "-o", "remount,noexec", str(where)], capture_output=True, text=True)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount a tmpfs noexec: {remount.stderr.strip()}")
    script = where / "fetch-params"
    script.write_text("#!/bin/sh\necho should not run\n")
    script.chmod(0o755)
    result, verdict, marker = _spawn_failure(sup, [str(script)])
    assert result.returncode == 126, result.output
    assert not marker
    assert f"{script}: permission denied (on a filesystem mounted noexec)" in verdict, verdict


def test_exec_format_error_is_126(sup: Runner) -> None:
    garbage = sup.tmp / "garbage"
    garbage.write_bytes(b"\x7fELF\x00\x01\x02not really a program\n")
    garbage.chmod(garbage.stat().st_mode | stat.S_IXUSR)
    result, verdict, marker = _spawn_failure(sup, [str(garbage)])
    assert result.returncode == 126, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict
    assert "cannot execute" in verdict


@pytest.mark.parametrize("pid1", [False, pytest.param(True, marks=needs_unshare)], ids=["subreaper", "pid1"])
def test_missing_cwd_is_126(sup: Runner, pid1: bool) -> None:
    missing = str(sup.tmp / "no-such-dir")
    result, verdict, marker = _spawn_failure(sup, ["sh", "-c", "echo should not run"], cwd=missing, pid1=pid1)
    assert result.returncode == 126, result.output
    assert not marker
    assert " reason=spawn_failed " in verdict
    assert "does not exist" in verdict and "no-such-dir" in verdict
    assert "[p/p] should not run" not in result.output


def test_a_cwd_that_is_a_file_is_said_as_that(sup: Runner) -> None:
    # ENOTDIR: was "does not exist", and the reader went looking for a path that is there.
    a_file = sup.tmp / "a-file"
    a_file.write_text("")
    result, verdict, _ = _spawn_failure(sup, ["true"], cwd=str(a_file))
    assert result.returncode == 126, result.output
    assert f"working directory {str(a_file)!r} is not a directory" in verdict, verdict
    result, verdict, _ = _spawn_failure(sup, ["true"], cwd=str(a_file / "below"))
    assert "does not exist" in verdict, verdict  # (a file on the way: nothing there, as a shell says)


# ---------------------------------------------------------------- the ECHILD trap


@pytest.mark.parametrize("pid1", [False, pytest.param(True, marks=needs_unshare)], ids=["subreaper", "pid1"])
@pytest.mark.parametrize("orphans", [0, 50], ids=["plain", "with-orphans"])
def test_crashed_phase_is_never_success(sup: Runner, pid1: bool, orphans: int) -> None:
    """``sh -c 'exit 1'`` fails the lifecycle even while the reaper is busy with orphans of the same phase."""
    marker = sup.tmp / "after.marker"
    storm = f'for i in $(seq {orphans}); do (sh -c "exit 0" &); done; ' if orphans else ""
    result = sup.run(failing_then_marker(sup, shell(f"{storm}exit 1"), marker), timeout=30, pid1=pid1)
    assert result.returncode == 1, result.output
    assert not marker.exists(), result.output
    verdict = one_verdict(result.output, "p")
    assert " reason=exit_code exit_code=1 " in verdict, verdict
    assert "lifecycle complete" not in result.output
    assert not verdict_lines(result.output, "after")  # the next phase never started
    assert "phase after: pending → stopped" in result.output


def test_exit_0_after_timeout_sigterm_is_not_success(sup: Runner) -> None:
    """The deadline passes; the command catches the SIGTERM and exits 0: still a failure, never exit 0."""
    marker = sup.tmp / "after.marker"
    script = "trap 'echo got TERM; exit 0' TERM; echo running; sleep 30 & wait; echo not reached"
    config = failing_then_marker(sup, shell(script), marker, extra="timeout_s = 0.5")
    result = sup.run(config, timeout=30)
    assert result.returncode != 0, result.output
    assert result.returncode == EXIT_TIMEOUT, result.output  # a deadline exits 124, whatever the child said
    assert not marker.exists(), result.output
    assert "got TERM" in result.output  # it really was the supervisor's SIGTERM it answered with 0
    verdict = one_verdict(result.output, "p")
    assert " reason=timeout " in verdict and " exit_code=0 " in verdict, verdict
    assert "lifecycle complete" not in result.output
    assert "Traceback" not in result.output


def test_exit_0_after_forwarded_sigterm_on_shutdown_exits_143(sup: Runner) -> None:
    """SIGTERM to the supervisor while a phase runs: the phase exits 0 on it, the supervisor still exits 143."""
    marker = sup.tmp / "after.marker"
    ready = sup.tmp / "ready"
    script = f"trap 'echo got TERM; exit 0' TERM; touch {ready}; sleep 30 & wait"
    proc = sup.start(failing_then_marker(sup, shell(script), marker))
    wait_for_path(ready)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143, out
    assert not marker.exists()
    assert "got TERM" in out
    assert "lifecycle complete" not in out


def test_two_supervisors_side_by_side_keep_their_own_status(sup: Runner, tmp_path: Path) -> None:
    """Two supervisors in the same cgroup, with a phase of the same name: each exits with its own phase's status.

    A's phase ``p`` fails twice with 5 (one retry); B's phase ``p`` succeeds, in between A's two attempts.
    Nothing B does to its own phase may change how A's phase ends.
    """
    started, go = tmp_path / "a-started", tmp_path / "go"
    runner_b = Runner(tmp_path / "b")
    (tmp_path / "b").mkdir()
    config_a = sup.write(f"""
        [[phases]]
        name = "p"
        command = {shell(f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; exit 5")}
        retries = 1
        backoff_s = 0.05
        backoff_max_s = 0.05
        timeout_s = 20
        """, stop_grace_s=1)
    config_b = runner_b.write("""
        [[phases]]
        name = "p"
        command = ["true"]
        """, stop_grace_s=1)
    proc_a = sup.start(config_a)
    try:
        wait_for_path(started)
        result_b = runner_b.run(config_b, timeout=30)
        go.touch()
        out_a, _ = proc_a.communicate(timeout=30)
    finally:
        runner_b.cleanup()
    assert result_b.returncode == 0, result_b.output
    attempts = verdict_lines(out_a, "p")
    assert proc_a.returncode == 5, out_a
    assert len(attempts) == 2 and all(" reason=exit_code exit_code=5 " in a for a in attempts), out_a


def wait_for_path(path: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.02)


# ---------------------------------------------------------------- ExitStatus from real wait statuses


def _die_by(signum: int, *, core: bool = False, cwd: Path | None = None) -> None:  # pragma: no cover - child
    try:
        import faulthandler

        faulthandler.disable()
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY if core else 0,
                                                  resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if cwd is not None:
            os.chdir(cwd)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        time.sleep(5)
    finally:
        os._exit(99)


def _wait_status_of_exit(code: int) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _wait_status_of_signal(signum: int, *, core: bool = False, cwd: Path | None = None) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        _die_by(signum, core=core, cwd=cwd)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize("code", [0, 1, 2, 42, 126, 127, 128, 255])
def test_exit_status_from_real_exit(code: int) -> None:
    status = ExitStatus.from_wait_status(_wait_status_of_exit(code))
    assert status == ExitStatus(code, None, False)
    assert status.shell_status == code
    assert status.success is (code == 0)
    assert status.signal_name is None
    assert status.describe() == f"exited with code {code}"


@functools.cache
def _wait_statuses_of_every_exit() -> tuple[int, ...]:
    """The real wait status of a child that exited with each code of 0..255 (made once: 256 forks)."""
    return tuple(_wait_status_of_exit(code) for code in range(256))


def test_exit_status_all_codes_from_real_exits() -> None:
    for code in range(256):
        status = ExitStatus.from_wait_status(_wait_statuses_of_every_exit()[code])
        assert (status.code, status.signal, status.shell_status) == (code, None, code)


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGTERM", "SIGSEGV", "SIGABRT", "SIGUSR1", "SIGBUS", "SIGINT",
                                     "SIGHUP", "SIGPIPE"])
def test_exit_status_from_real_signal(signame: str) -> None:
    signum = int(getattr(signal, signame))
    status = ExitStatus.from_wait_status(_wait_status_of_signal(signum))
    assert status.code is None
    assert status.signal == signum
    assert status.core_dumped is False  # RLIMIT_CORE 0 in the child
    assert status.success is False
    assert status.shell_status == 128 + signum
    assert status.signal_name == signame
    assert status.describe() == f"killed by {signame} (status {128 + signum})"


def test_a_signal_forwarded_from_outside_is_said_beside_the_end_it_may_have_caused() -> None:
    def detail(status: ExitStatus, forwarded: dict[int, float]) -> str:
        return from_exit("p", "p", 1, status, stop_reason=None, daemon=False, attempt=1, started_at=0.0,
                         last_lines=[], forwarded=forwarded).detail

    hup = ExitStatus.from_wait_status(_wait_status_of_signal(signal.SIGHUP))
    said = ", 0.2s after a SIGHUP from outside was forwarded to it"
    assert detail(hup, {signal.SIGHUP: 0.2}) == "killed by SIGHUP (status 129)" + said
    assert detail(hup, {signal.SIGUSR1: 0.2}) == detail(hup, {}) == "killed by SIGHUP (status 129)", "another one"
    wrapped = ExitStatus.from_wait_status(_wait_statuses_of_every_exit()[129])  # (a shell's `trap 'exit 129' HUP`)
    assert detail(wrapped, {signal.SIGHUP: 0.2}) == "exited with code 129" + said
    assert detail(wrapped, {}) == "exited with code 129"


def test_exit_status_core_dumped_from_real_crash(tmp_path: Path) -> None:
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        pytest.skip("hard RLIMIT_CORE is 0: no process here can dump core")
    raw = _wait_status_of_signal(signal.SIGSEGV, core=True, cwd=tmp_path)
    status = ExitStatus.from_wait_status(raw)
    assert status.signal == signal.SIGSEGV and status.signal_name == "SIGSEGV"
    assert status.core_dumped is os.WCOREDUMP(raw)
    if not status.core_dumped:
        pytest.skip(f"the kernel did not dump a core here (core_pattern "
                    f"{Path('/proc/sys/kernel/core_pattern').read_text().strip()!r})")
    assert status.shell_status == 139
    assert status.describe() == "killed by SIGSEGV (status 139, core dumped)"


def test_exit_status_stopped_is_not_final() -> None:
    """A stop report (WUNTRACED) is not how a process ended: refused, not mistaken for an exit."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.kill(os.getpid(), signal.SIGSTOP)
        finally:
            os._exit(0)
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        with pytest.raises(ValueError, match="not a final wait status"):
            ExitStatus.from_wait_status(status)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_signal_name_of_unnamed_signal() -> None:
    status = ExitStatus(None, 64, False)  # a real-time signal number without a Signals name
    assert status.shell_status == 192
    assert status.signal_name in ("SIGRTMAX", "SIG64")
    assert "status 192" in status.describe()


def test_python_exit_codes_via_supervisor(sup: Runner) -> None:
    """A Python child (not only sh): ``sys.exit(n)`` and an uncaught exception (1) pass through."""
    marker = sup.tmp / "after.marker"
    config = failing_then_marker(sup, toml_list([PY, "-c", "raise SystemExit(77)"]), marker)
    result = sup.run(config, timeout=30)
    assert result.returncode == 77, result.output
    assert not marker.exists()
    assert " reason=exit_code exit_code=77 " in one_verdict(result.output, "p")


def test_the_reaper_says_a_registered_childs_stop_and_continue_and_reaps_its_exit_alone() -> None:
    """waitpid with WUNTRACED | WCONTINUED: a stop and a continue are said, once each, by the child's label; they
    are no exit (the owner hears only of the exit); an orphan's stop is nobody's to say."""
    said: list[str] = []
    exits: list[ExitStatus] = []
    reaper = Reaper(on_orphan=lambda pid, status: None, on_stop=said.append)
    child = subprocess.Popen(["sleep", "30"])
    try:
        jobs: list[str | None] = []  # (the Child keeps them: status shows it stopped, a stall's verdict says why)
        reaper.watch(child.pid, lambda pid, status: exits.append(status), "p/sleeper", jobs.append)

        def reaped_until(done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 10
            while not done() and time.monotonic() < deadline:
                reaper.reap()
                time.sleep(0.01)

        os.kill(child.pid, signal.SIGSTOP)
        reaped_until(lambda: len(said) == 1)
        os.kill(child.pid, signal.SIGCONT)
        reaped_until(lambda: len(said) == 2)
        assert said == [f"p/sleeper (pid {child.pid}) was stopped by SIGSTOP: it does nothing until it is continued "
                        "(SIGCONT)", f"p/sleeper (pid {child.pid}) was continued"]
        assert exits == [] and jobs == ["SIGSTOP", None]
        os.kill(child.pid, signal.SIGKILL)
        reaped_until(lambda: bool(exits))
        assert exits == [ExitStatus(None, signal.SIGKILL)] and len(said) == 2
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.returncode = 0  # (reaped by the Reaper: Popen must not wait for it)
