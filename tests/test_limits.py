"""Limits (issue 14, class 7): no file descriptor left, no thread to be had, a state_dir gone read-only.

Each is a real limit on a real supervisor: ``RLIMIT_NOFILE`` set before it starts, a cgroup v1
``pids`` controller whose ``pids.max`` leaves no room for a thread (from the start, or from the
moment a daemon has been started), and a state_dir made read-only under the running supervisor.
None of them is a traceback: what cannot be done is said in one line, the rest goes on, and the
exit status is the lifecycle's (or 2, one line, when the run cannot even be set up).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    PY,
    REPO,
    Runner,
    clean_env,
    finish,
    free_port,
    mounted_tmpfs,
    pyc,
    read,
    read_pid,
    sh,
    toml_list,
    toml_str,
    verdict_lines,
    wait_for,
)

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager

PIDS = Path("/sys/fs/cgroup/pids")


@pytest.fixture
def manager() -> Iterator[DevManager]:
    dev = dev_manager(port=0, quiet=True).start()
    yield dev
    dev.stop()


def failing_with_manager(sup: Runner, mgr: DevManager, label: str, extra: str = "") -> Path:
    """One phase that fails with 4, reporting to ``mgr``; ``extra``: more [supervisor] keys."""
    body = textwrap.dedent(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1

        [[phases]]
        name = "fetch"
        command = {sh("echo fetching; exit 4")}
        report = "param-done"
        """)
    return sup.write(sup.header(extra=extra) + body, header=False)


def run_with_nofile(sup: Runner, config: Path, limit: int) -> tuple[int, str]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.Popen(sup.argv(config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=clean_env(), cwd=REPO, preexec_fn=lower, start_new_session=True)
    sup.procs.append(proc)
    result = finish(proc, time.monotonic(), 120)
    return result.returncode, result.output


def instance_history(mgr: DevManager, label: str) -> list[str]:
    found = [i["history"] for i in mgr.state.snapshot()["instances"].values() if i["label"] == label]
    return found[0] if found else []


# ---------------------------------------------------------------- no file descriptor left


def test_a_small_fd_limit_with_a_manager_still_reports_and_saves(sup: Runner, manager: DevManager) -> None:
    """32 fds: enough for the supervisor, its outbox, the manager client and a child; the exit sweep's /proc
    reads, status.json and the give-up all still happen."""
    status, out = run_with_nofile(sup, failing_with_manager(sup, manager, "C.nofile-32"), 32)
    assert status == 4, out
    assert "Traceback" not in out, out
    assert (sup.state_dir / "status.json").exists()
    assert instance_history(manager, "C.nofile-32") == ["registered", "killed"], out


@pytest.mark.parametrize("limit", [8, 12, 14, 16, 18, 20, 24])
def test_fewer_fds_never_make_a_traceback(sup: Runner, manager: DevManager, limit: int) -> None:
    """Below what a run needs, each limit fails somewhere else (the event loop, /proc, the outbox, the manager
    client's imports, the child's pipes, the exit sweep): always one line for it, and a status that says which
    kind of end it was: 2 (nothing could be set up), 126 (the child could not be started), 4 (the child's own)."""
    status, out = run_with_nofile(sup, failing_with_manager(sup, manager, f"C.nofile-{limit}"), limit)
    assert "Traceback" not in out and "Exception in thread" not in out, out
    assert status in (2, 4, 126), out
    if status == 2:
        assert out.strip().splitlines()[-1].startswith("prover-supervisor: "), out
    else:
        assert "exiting with status" in out, out
        assert (sup.state_dir / "status.json").exists() or "status: cannot write" in out, out


# ---------------------------------------------------------------- a state_dir that goes read-only under us


@pytest.mark.parametrize("with_manager", [False, True], ids=["alone", "with-manager"])
def test_a_read_only_state_dir_at_exit(sup: Runner, manager: DevManager, with_manager: bool) -> None:
    """The state_dir (a tmpfs) is made read-only while the supervisor runs. A plain ``mount -o remount,ro`` is
    refused while the supervisor holds its lock file open for writing, so the read-only view is a bind mount of
    the same tmpfs over it, remounted ro: every path the exit uses (the socket, status.json) is read-only,
    as on a disk the kernel remounted read-only after an I/O error."""
    sup.state_dir.mkdir()
    gate = sup.tmp / "go"
    code = 3 if with_manager else 0
    with mounted_tmpfs(sup.state_dir, "16m"):
        manager_keys = f'[manager]\nurl = {toml_str(manager.url)}\nlabel = "C.ro"\nmin_rate = 1\n' \
            if with_manager else ""
        config = sup.write(manager_keys + f"""
[[phases]]
name = "work"
command = {sh(f"while [ ! -e {gate} ]; do sleep 0.05; done; exit {code}")}
""")
        proc = sup.start(config)
        bound = False
        try:
            wait_for(lambda: (sup.state_dir / "status.sock").exists(), timeout=30)
            if with_manager:
                wait_for(lambda: instance_history(manager, "C.ro"), timeout=30)
            subprocess.run(["mount", "--bind", str(sup.state_dir), str(sup.state_dir)], check=True)
            bound = True
            # Refused ("mount point is busy") while the supervisor has a file of the bind open for writing, which
            # it does for an instant now and then (status.json's next version written and renamed): tried again.
            wait_for(lambda: subprocess.run(["mount", "-o", "remount,bind,ro", str(sup.state_dir)],
                                            capture_output=True).returncode == 0, timeout=30)
            with pytest.raises(OSError):
                (sup.state_dir / "probe").write_text("x")
            gate.touch()
            result = finish(proc, time.monotonic(), 90)
        finally:
            if bound:  # (busy for an instant too, as above)
                wait_for(lambda: subprocess.run(["umount", str(sup.state_dir)], capture_output=True).returncode == 0,
                         timeout=30)
    out = result.output
    assert result.returncode == code, out
    assert "Traceback" not in out, out
    assert f"status: cannot remove {sup.state_dir / 'status.sock'} (Read-only file system)" in out, out
    assert "status: cannot write" in out and "Read-only file system" in out, out
    assert f"exiting with status {code}" in out
    if with_manager:
        assert instance_history(manager, "C.ro") == ["registered", "killed"], out


# ---------------------------------------------------------------- no thread to be had


@contextlib.contextmanager
def pids_cgroup(name: str, limit: int | str) -> Iterator[Path]:
    if os.geteuid() != 0 or not (PIDS / "cgroup.procs").exists():
        pytest.skip("no v1 pids controller to limit threads with")
    path = PIDS / f"pytest-{name}-{os.getpid()}"
    path.mkdir()
    try:
        (path / "pids.max").write_text(str(limit))
        yield path
    finally:
        deadline = time.monotonic() + 20
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), 9)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def start_in_pids(sup: Runner, config: Path, cgroup: Path) -> subprocess.Popen[str]:
    script = f"echo $$ > {cgroup / 'cgroup.procs'} && exec \"$@\""
    proc = subprocess.Popen(["sh", "-c", script, "sh", *sup.argv(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", env=clean_env(), cwd=REPO,
                            start_new_session=True)
    sup.procs.append(proc)
    return proc


def test_no_thread_at_all_costs_the_console_and_the_reporting_not_the_run(sup: Runner,
                                                                          manager: DevManager) -> None:
    """pids.max = 1: the supervisor's main thread and nothing more (no thread, no child)."""
    config = failing_with_manager(sup, manager, "C.pids", extra=f"http_port = {free_port()}")
    with pids_cgroup("nothreads", 1) as cgroup:
        result = finish(start_in_pids(sup, config, cgroup), time.monotonic(), 60)
    out, log = result.output, read(sup.log_dir / "supervisor.log")
    assert "Traceback" not in out + log, out + log
    assert "console off: no thread to write it (can't start new thread)" in out  # on stderr, the console is off
    assert "manager: cannot start the thread of the outbox's sender (RuntimeError: can't start new thread): " \
           "reporting is off" in log, log
    assert "manager: cannot start the thread of log shipping" in log, log
    assert "health: cannot serve 127.0.0.1:" in log and "can't start new thread" in log, log
    assert "reason=spawn_failed" in log and "Resource temporarily unavailable" in log, log  # no child either
    assert result.returncode == 126, out + log
    assert (sup.state_dir / "status.json").exists()


# Writes its pid, then waits for a file: one task, never a thread nor a child (every task counts in pids.max).
WAIT_FOR_GATE = """
import os, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


def test_no_thread_for_a_readiness_wait_fails_the_phase_with_the_reason(sup: Runner) -> None:
    """pids.max is lowered, once the first phase runs, to exactly what is in use: when it ends its slot goes
    to the next phase's daemon, and the thread that would wait for that daemon's readiness cannot start."""
    pidfile, gate = sup.tmp / "first.pid", sup.tmp / "go"
    config = sup.write(f"""
        [[phases]]
        name = "first"
        command = {toml_list([PY, "-c", WAIT_FOR_GATE, str(pidfile), str(gate)])}

        [[phases]]
        name = "second"
        command = ["true"]
        [[phases.daemons]]
        name = "db"
        command = {pyc("import time; time.sleep(120)")}
        ready = {toml_str(str(sup.tmp / "never"))}
        ready_timeout_s = 60
        """)
    with pids_cgroup("noready", "max") as cgroup:
        proc = start_in_pids(sup, config, cgroup)
        read_pid(pidfile)
        (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text().strip())
        gate.touch()
        result = finish(proc, time.monotonic(), 60)
        (cgroup / "pids.max").write_text("max")
    out = result.output
    assert "Traceback" not in out, out
    verdict = verdict_lines(out, "second", "db", kind="FAILED")[0]  # (its stop after it is a verdict of its own)
    assert " reason=timeout " in verdict and "no thread could be started to probe" in verdict, verdict
    assert "second/db could not be waited for: " in verdict and "not ready after" not in verdict, verdict  # (at once)
    assert result.returncode == 124, out  # a ready timeout is a timeout: timeout(1)'s status


# A manager call made with no thread to be had: the process joins a pids cgroup whose pids.max is its one task.
NO_THREAD_CALL = textwrap.dedent("""
    import json, sys, threading, time
    from supervisor.config import ManagerSpec
    from supervisor.manager.client import ManagerClient
    said = []
    client = ManagerClient(ManagerSpec(url=sys.argv[1], label="C.t", read_timeout_s=5.0), warn=said.append)
    client.request("GET", "/status")  # (what a call imports, imported)
    while threading.active_count() > 1:  # the first call's deadline thread, cancelled, ends
        time.sleep(0.01)
    with open(sys.argv[2], "w") as procs:
        procs.write("0")  # this process joins the cgroup: no second task fits
    try:
        threading.Thread(target=lambda: None).start()
        refused = False
    except RuntimeError:
        refused = True
    answers = [client.request("GET", "/status").status for _ in range(2)]
    print(json.dumps({"refused": refused, "answers": answers, "said": said}))
""")


def test_a_manager_call_with_no_thread_for_its_deadline_still_goes_out(manager: DevManager) -> None:
    # pids.max reached (a child's burst of threads): the call's deadline thread cannot start. Before, the
    # RuntimeError escaped every call: the sender failed the report for good after 3 tries ("a bug of ours")
    # and the log shipper's thread died, its batch dropped. The call goes on, cut by its socket timeouts alone.
    with pids_cgroup("nodeadline", 1) as cgroup:
        ran = subprocess.run([PY, "-c", NO_THREAD_CALL, manager.url, str(cgroup / "cgroup.procs")],
                             capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["refused"], "the cgroup let a thread start: nothing was tested"
    assert found["answers"] == [200, 200]
    assert len(found["said"]) == 1 and "no thread for a call's" in found["said"][0], found["said"]
