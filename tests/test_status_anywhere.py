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
import textwrap
from pathlib import Path

from helpers import PY, REPO, Runner, clean_env, needs_unshare, sh, stale_socket, wait_for

from supervisor.engine.trees import is_live_supervisor, start_ticks
from supervisor.status.file import RUNTIME_DIR_ENV, pointer_path, pointers


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
    stale_socket(sup.state_dir / "status.sock")  # (what the SIGKILL of a running supervisor leaves)
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
                found = next(iter(pointers()), None)
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


def killed_with_a_pointer(sup: Runner, runtime: dict[str, str]) -> subprocess.Popen[str]:
    """A supervisor of its own state_dir, SIGKILLed while its service runs: its pointer and the service stay."""
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """)
    proc = sup.start(config, env=runtime)
    pointer = Path(runtime[RUNTIME_DIR_ENV]) / "current"
    wait_for(lambda: pointer.exists() and status_cli("--json", "--state-dir", str(sup.state_dir))[0] == 0, 30)
    proc.kill()  # SIGKILL: nothing runs after it, the pointer stays
    proc.wait(10)
    os.environ[RUNTIME_DIR_ENV], saved = runtime[RUNTIME_DIR_ENV], os.environ[RUNTIME_DIR_ENV]
    try:
        assert pointer_path() == pointer
        found = next(iter(pointers()), None)
        assert found is not None and found.pid == proc.pid and not found.live and found.state_dir == sup.state_dir
    finally:
        os.environ[RUNTIME_DIR_ENV] = saved
    return proc


def in_the_profile_dir(sup: Runner, profile: Path, body: str) -> Path:
    """A config whose state_dir is the built-in profile's (``$SUPERVISOR_STATE_DIR``)."""
    return sup.write(f"""
        [supervisor]
        state_dir = "{profile}"
        log_dir = "{sup.tmp / "profile-logs"}"
        stop_grace_s = 2
        """ + textwrap.dedent(body), header=False, name="profile.toml")


def test_a_pointer_left_by_a_dead_supervisor_is_followed_to_what_it_left(sup: Runner, tmp_path: Path) -> None:
    """The last supervisor started here was SIGKILLed: a bare status tells its story (gone, and the service it left
    running), not the older, finished one of the built-in profile's state_dir, which it names."""
    profile = tmp_path / "profile-state"
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run"), "SUPERVISOR_STATE_DIR": str(profile)}
    earlier = sup.run(in_the_profile_dir(sup, profile, f"""
        [[phases]]
        name = "hello"
        command = {sh("echo hello")}
        """), env=runtime)
    assert earlier.returncode == 0 and (profile / "status.json").exists(), earlier.output
    proc = killed_with_a_pointer(sup, runtime)
    try:
        rc, text = status_cli(env=runtime)
        assert rc == 3, text
        assert text.startswith(f"GONE: supervisor pid {proc.pid} is not running"), text
        assert "1 process(es) it started still alive" in text and "(serve/serve)" in text, text
        assert (f"also: this is state_dir {sup.state_dir}, of the last supervisor started here (pid {proc.pid}, not "
                f"running); another supervisor's saved state is in the built-in profile's state_dir {profile}: "
                f"`status --state-dir {profile}`") in text, text
        rc, out = status_cli("--json", env=runtime)
        snap = json.loads(out)
        assert rc == 3 and snap["supervisor"] == "gone" and snap["pid"] == proc.pid, out
        assert [s["name"] for s in snap["survivors"]] == ["sleep"], out
        assert snap["see_also"]["state_dir"] == str(profile), out
    finally:
        sup.cleanup()


def test_a_pointer_left_by_a_dead_supervisor_is_named_beside_one_that_runs(sup: Runner, tmp_path: Path) -> None:
    """A supervisor started before it still runs in the built-in profile's state_dir: that one is shown, and the
    dead one named, with where to look."""
    profile = tmp_path / "profile-state"
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run"), "SUPERVISOR_STATE_DIR": str(profile)}
    proc = killed_with_a_pointer(sup, runtime)
    sup.cleanup()
    # (a pointer of its own: started before the dead one, whose pointer took the place of its)
    running = sup.start(in_the_profile_dir(sup, profile, f"""
        [[phases]]
        name = "web"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """), env={**runtime, RUNTIME_DIR_ENV: str(tmp_path / "before")})
    try:
        wait_for(lambda: status_cli("--json", "--state-dir", str(profile))[0] == 0, 30)
        rc, text = status_cli(env=runtime)
        assert rc == 0 and text.startswith("running: web up"), text
        said = (f"the last supervisor started here (pid {proc.pid}, not running) had state_dir {sup.state_dir}: "
                f"`status --state-dir {sup.state_dir}`")
        assert f"\nalso: {said}\n" in text, text
        rc, out = status_cli("--json", env=runtime)
        assert rc == 0 and json.loads(out)["see_also"] == {"state_dir": str(sup.state_dir), "pid": proc.pid,
                                                           "why": said}, out
    finally:
        running.send_signal(signal.SIGTERM)
        running.communicate(timeout=60)
    # Nothing saved in the profile's state_dir, nothing running there: the dead one is followed, nothing else named.
    (profile / "status.json").unlink()
    rc, text = status_cli(env=runtime)
    assert rc == 3 and text.startswith(f"GONE: supervisor pid {proc.pid}") and "\nalso:" not in text, text


def serving(runner: Runner, runtime: dict[str, str]) -> subprocess.Popen[str]:
    """A supervisor of the runner's own state_dir whose service runs, once its socket answers."""
    proc = runner.start(runner.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """), env=runtime)
    wait_for(lambda: status_cli("--json", "--state-dir", str(runner.state_dir))[0] == 0, 30)
    return proc


def bare_pid(runtime: dict[str, str]) -> tuple[int | None, dict[str, object]]:
    """The pid a bare ``status --json`` shows, and what it names beside it."""
    rc, out = status_cli("--json", env=runtime)
    snap = json.loads(out)
    return snap.get("pid"), {"rc": rc, "live": snap["live"], "see_also": snap.get("see_also")}


def test_a_bare_status_finds_the_running_supervisor_whichever_started_or_ended_last(sup: Runner,
                                                                                   tmp_path: Path) -> None:
    """A trial run (or a demo) of another state_dir beside the running supervisor took the one pointer and removed
    it at its exit: a bare status said no supervisor was running. It now puts back the one it replaced; two
    running at once, the newest is shown and the other named; the newest SIGKILLed, the other is shown and the
    dead one named."""
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run")}
    trial, newer = Runner(tmp_path / "trial"), Runner(tmp_path / "newer")
    for runner in (trial, newer):
        runner.tmp.mkdir()
    first = serving(sup, runtime)
    try:
        done = trial.run(quick(trial), env=runtime)
        assert done.returncode == 0, done.output
        assert bare_pid(runtime) == (first.pid, {"rc": 0, "live": True, "see_also": None})
        rc, text = status_cli(env=runtime)
        assert rc == 0 and "no prover-supervisor is running" not in text and "\nalso:" not in text, text

        second = serving(newer, runtime)
        said = (f"another supervisor runs here (pid {first.pid}) with state_dir {sup.state_dir}: "
                f"`status --state-dir {sup.state_dir}`")
        assert bare_pid(runtime) == (second.pid, {"rc": 0, "live": True, "see_also": {
            "state_dir": str(sup.state_dir), "pid": first.pid, "why": said}})
        rc, text = status_cli(env=runtime)
        assert rc == 0 and f"\nalso: {said}\n" in text, text

        second.kill()  # SIGKILL: its pointer stays, and its service runs on
        second.wait(10)
        said = (f"the last supervisor started here (pid {second.pid}, not running) had state_dir "
                f"{newer.state_dir}: `status --state-dir {newer.state_dir}`")
        assert bare_pid(runtime) == (first.pid, {"rc": 0, "live": True, "see_also": {
            "state_dir": str(newer.state_dir), "pid": second.pid, "why": said}})
    finally:
        newer.cleanup()
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 143
    # Its exit leaves the pointer of the dead one it did not write: that one's story is told, as before.
    assert json.loads((tmp_path / "run" / "current").read_text())["pid"] == second.pid
    rc, text = status_cli(env=runtime)
    assert rc == 3 and text.startswith(f"GONE: supervisor pid {second.pid}"), text


def test_a_relative_runtime_dir_writes_no_pointer_and_says_so(sup: Runner) -> None:
    """A relative $PROVER_SUPERVISOR_RUNTIME_DIR put the pointer under the run's working directory, where a bare
    status started anywhere else never looks: it is refused, said in one line, and the run goes on."""
    result = sup.run(quick(sup), env={RUNTIME_DIR_ENV: "relative/run"}, timeout=30)
    assert result.returncode == 0, result.output
    assert (f"status: cannot write the pointer relative/run/current (${RUNTIME_DIR_ENV} is not an absolute path); "
            "a bare `prover-supervisor status` needs --state-dir") in result.output, result.output
    assert not (REPO / "relative").exists() and not (Path.cwd() / "relative").exists()
