"""``status`` as a container runs it (issue 23, class 8): from a fresh container whose PID 1 is the ``status``
command itself, on the state of a supervisor that stopped there as PID 1; and bare, while a supervisor runs
with a state_dir of its own (found through the well-known pointer, status/file.py).

Real supervisors, a real PID namespace (``unshare``) for PID 1, the real CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from helpers import PY, REPO, Runner, clean_env, needs_unshare, sh, wait_for

from supervisor.engine.trees import is_live_supervisor, start_ticks
from supervisor.status.file import RUNTIME_DIR_ENV, pointed, pointer_path


def status_cli(*args: str, pid1: bool = False, env: dict[str, str] | None = None) -> tuple[int, str]:
    argv = [PY, "-m", "supervisor", "status", *args]
    if pid1:
        argv = ["unshare", "--pid", "--fork", "--mount-proc", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, env=clean_env(env), cwd=REPO, timeout=60)
    return done.returncode, done.stdout + done.stderr


def quick(sup: Runner) -> Path:
    return sup.write(f"""
        [[phases]]
        name = "hello"
        command = {sh("echo hello")}
        """)


# ---------------------------------------------------------------- status as PID 1 of a fresh container


@needs_unshare
def test_status_as_pid_1_on_the_state_of_a_supervisor_that_stopped_as_pid_1_says_it_exited(sup: Runner) -> None:
    """``docker run --rm -v state:/var/lib/prover-supervisor IMAGE status``: the pid the supervisor recorded
    is 1, and PID 1 is now the status command itself, which is no live supervisor."""
    result = sup.run(quick(sup), pid1=True)
    assert result.returncode == 0, result.output
    assert json.loads((sup.state_dir / "status.json").read_text())["pid"] == 1
    rc, out = status_cli("--json", "--state-dir", str(sup.state_dir), pid1=True)
    assert rc == 3, out
    snap = json.loads(out)
    assert snap["supervisor"] == "exited" and snap["live"] is False, out
    rc, text = status_cli("--state-dir", str(sup.state_dir), pid1=True)
    assert rc == 3 and "NOT ANSWERING" not in text and text.startswith("done: "), text


def test_a_recorded_pid_that_runs_a_command_supervising_nothing_is_no_live_supervisor(sup: Runner) -> None:
    """The pid in status.json reused by a `prover-supervisor status --watch` (of another state_dir)."""
    result = sup.run(quick(sup))
    assert result.returncode == 0, result.output
    watcher = subprocess.Popen([PY, "-m", "supervisor", "status", "--watch", "--state-dir", str(sup.tmp / "other")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env(), cwd=REPO)
    try:
        saved = sup.state_dir / "status.json"
        snap = json.loads(saved.read_text())
        saved.write_text(json.dumps({**snap, "pid": watcher.pid}))
        assert not is_live_supervisor(watcher.pid)
        assert not is_live_supervisor(os.getpid())
        rc, out = status_cli("--json", "--state-dir", str(sup.state_dir))
        assert rc == 3 and json.loads(out)["supervisor"] == "exited", out
    finally:
        watcher.kill()
        watcher.wait(10)


def test_a_recorded_pid_given_since_to_a_process_that_names_the_supervisor_is_no_live_supervisor(
        sup: Runner, tmp_path: Path) -> None:
    """A supervisor SIGKILLed while running, its pid given since to a ``tail -f .../supervisor.log``: a command
    line that says "supervisor". Its start time is not the one the supervisor recorded (in status.json and the
    pointer), so it is gone, not "alive but not answering"; the pointer to it is not followed. The same process
    with the recorded start time its own is taken for the supervisor (the time decides, not the command line);
    a record without one (an older supervisor's) is judged by the command line, as before."""
    result = sup.run(quick(sup))
    assert result.returncode == 0, result.output
    saved = sup.state_dir / "status.json"
    snap = json.loads(saved.read_text())
    own = snap["pid_start"]
    assert isinstance(own, int) and own > 0, snap
    log = tmp_path / "supervisor.log"
    log.write_text("")
    tail = subprocess.Popen(["tail", "-f", str(log)], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: start_ticks(tail.pid) is not None, 10)
        theirs = start_ticks(tail.pid)
        assert theirs != own
        running = {**snap, "pid": tail.pid, "lifecycle": {**snap["lifecycle"], "state": "running"}}
        fates = {}
        for name, record in (("another start", {**running, "pid_start": own}),
                             ("its own start", {**running, "pid_start": theirs}),
                             ("none recorded", {k: v for k, v in running.items() if k != "pid_start"})):
            saved.write_text(json.dumps(record))
            rc, out = status_cli("--json", "--state-dir", str(sup.state_dir))
            assert rc == 3, out
            fates[name] = json.loads(out)["supervisor"]
        assert fates == {"another start": "gone", "its own start": "not answering",
                         "none recorded": "not answering"}, fates

        pointer = tmp_path / "run" / "current"
        pointer.parent.mkdir()
        os.environ[RUNTIME_DIR_ENV], kept = str(pointer.parent), os.environ[RUNTIME_DIR_ENV]
        try:
            lives = {}
            for start in (own, theirs):
                pointer.write_text(json.dumps({"pid": tail.pid, "pid_start": start, "state_dir": str(sup.state_dir),
                                               "socket": str(tmp_path / "none.sock")}))
                found = pointed()
                assert found is not None and found.pid == tail.pid, found
                lives[start == own] = found.live
        finally:
            os.environ[RUNTIME_DIR_ENV] = kept
        assert lives == {True: False, False: True}, lives
    finally:
        tail.kill()
        tail.wait(10)


# ---------------------------------------------------------------- a bare status finds it


def test_a_bare_status_finds_the_running_supervisor_whatever_its_state_dir(sup: Runner, tmp_path: Path) -> None:
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run")}  # this test's own pointer, checked by name below
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """)
    proc = sup.start(config, env=runtime)
    pointer = tmp_path / "run" / "current"
    wait_for(lambda: pointer.exists() and status_cli("--json", "--state-dir", str(sup.state_dir))[0] == 0, 30)
    rc, out = status_cli("--json", env=runtime)  # no --config, no --state-dir, no SUPERVISOR_CONFIG
    assert rc == 0, out
    snap = json.loads(out)
    assert snap["live"] is True and snap["pid"] == proc.pid, out
    rc, text = status_cli(env=runtime)
    assert rc == 0 and "serve" in text, text
    # The built-in profile is not read while a supervisor runs: one it would refuse (a manager URL and no label
    # it can match, a bad knob) exited 2 and hid the supervisor that runs.
    rc, text = status_cli(env={**runtime, "MANAGER_URL": "http://127.0.0.1:1/", "VAST_CONTAINERLABEL": "not-a-label",
                               "PROVER_REQUIRE_GPUS": "yes please"})
    assert rc == 0 and "serve" in text, text

    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert not pointer.exists()  # removed at its exit: a bare status no longer follows it
    rc, text = status_cli(env=runtime)
    assert rc == 3, text
    assert "no prover-supervisor is running" in text, text
    assert "`status --config FILE` or `status --state-dir DIR`" in text, text


def test_a_pointer_left_by_a_dead_supervisor_is_named_not_followed(sup: Runner, tmp_path: Path) -> None:
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run")}
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """)
    proc = sup.start(config, env=runtime)
    pointer = tmp_path / "run" / "current"
    wait_for(pointer.exists, 30)
    proc.kill()  # SIGKILL: nothing runs after it, the pointer stays
    proc.wait(10)
    sup.cleanup()
    os.environ[RUNTIME_DIR_ENV], saved = runtime[RUNTIME_DIR_ENV], os.environ[RUNTIME_DIR_ENV]
    try:
        assert pointer_path() == pointer
        found = pointed()
        assert found is not None and found.pid == proc.pid and not found.live and found.state_dir == sup.state_dir
    finally:
        os.environ[RUNTIME_DIR_ENV] = saved
    rc, text = status_cli(env=runtime)
    assert rc == 3, text
    assert f"(pid {proc.pid}, not running) had state_dir {sup.state_dir}" in text, text
    assert f"`status --state-dir {sup.state_dir}`" in text, text


def test_a_relative_runtime_dir_writes_no_pointer_and_says_so(sup: Runner) -> None:
    """A relative $PROVER_SUPERVISOR_RUNTIME_DIR put the pointer under the run's working directory, where a bare
    status started anywhere else never looks: it is refused, said in one line, and the run goes on."""
    result = sup.run(quick(sup), env={RUNTIME_DIR_ENV: "relative/run"}, timeout=30)
    assert result.returncode == 0, result.output
    assert (f"status: cannot write the pointer relative/run/current (${RUNTIME_DIR_ENV} is not an absolute path); "
            "a bare `prover-supervisor status` needs --state-dir") in result.output, result.output
    assert not (REPO / "relative").exists() and not (Path.cwd() / "relative").exists()
