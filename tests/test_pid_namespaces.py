"""Supervisors in two PID namespaces of one machine: a container's, PID 1 of its own, and the host's, on the
same state_dir path (the default /var/lib/prover-supervisor of both), each on a volume of its own.

A pid only means something in the namespace that gave it: the host must neither take the container's children
(their tag names pid 1, the container's) for a dead supervisor's survivors, nor say them left alive by one. And
a bare ``status`` on the host, led by the pointer in a /run the container shares, finds the container's
supervisor by its socket, its pid 1 being no pid here.

Real supervisors, real PID namespaces (``unshare``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import psutil
from helpers import (
    PY,
    REPO,
    Runner,
    clean_env,
    kill_tree,
    needs_unshare,
    read,
    sh,
    supervisor_pid,
    toml_str,
    wait_for,
)

from supervisor.engine.trees import STATE_DIR_ENV, TAG_ENV, kill_survivors_of_dead_supervisors, left_alive_by
from supervisor.status.file import RUNTIME_DIR_ENV, unpoint


def start_in_namespace(sup: Runner, name: str, argv: list[str],
                       state_dir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """``argv`` as PID 1 of a PID namespace of its own, with a volume of its own mounted on ``state_dir`` (a
    container's); its console in ``<tmp>/<name>.txt``."""
    own = sup.tmp / f"{name}-volume"
    own.mkdir()
    console = sup.tmp / f"{name}.txt"
    inner = f"mount --bind {shlex.quote(str(own))} {shlex.quote(str(state_dir))} && exec \"$@\""
    with open(console, "wb") as out:
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inner, "sh", *argv],
                                stdout=out, stderr=subprocess.STDOUT, env=sup.env(), cwd=REPO,
                                start_new_session=True)
    sup.procs.append(proc)  # (its cleanup kills unshare and the namespace with it)
    return proc, console


def tagged_for(state_dir: Path, name: str) -> list[psutil.Process]:
    """Live processes called ``name`` that carry a supervisor's tag for ``state_dir``, as seen from here."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if proc.name() == name and TAG_ENV in env and env.get(STATE_DIR_ENV) == str(state_dir):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM the namespace's PID 1 (unshare passes no signal on), and wait for it."""
    inside = wait_for(lambda: psutil.Process(proc.pid).children(), 10)
    assert isinstance(inside, list) and len(inside) == 1
    inside[0].send_signal(signal.SIGTERM)
    proc.wait(60)


@needs_unshare
def test_a_live_supervisors_children_in_another_pid_namespace_are_no_survivors_of_a_dead_one(sup: Runner) -> None:
    sup.state_dir.mkdir()
    container_config = sup.tmp / "container.toml"
    container_config.write_text(textwrap.dedent(f"""\
        [supervisor]
        state_dir = {toml_str(str(sup.state_dir))}
        log_dir = {toml_str(str(sup.tmp / "container-logs"))}
        stop_grace_s = 2

        [[phases]]
        name = "prove"
        kind = "service"
        command = {sh("echo up; exec sleep 1000")}
        """))
    container, console = start_in_namespace(sup, "container", [PY, "-m", "supervisor", "run", "--config",
                                                               str(container_config)], sup.state_dir)
    found = wait_for(lambda: tagged_for(sup.state_dir, "sleep"), 30)
    assert isinstance(found, list) and len(found) == 1, read(console)
    working = found[0]
    assert working.environ()[TAG_ENV].startswith("1."), working.environ()[TAG_ENV]  # pid 1, of its namespace

    # Status from the host, on the state of a supervisor that was pid 1 (here: another process): none of it.
    assert left_alive_by(1, str(sup.state_dir)) == []

    said: list[str] = []
    assert kill_survivors_of_dead_supervisors(str(sup.state_dir), said.append, max_s=1) == 0, said
    host = sup.write("""
        [[phases]]
        name = "one"
        command = ["true"]
        """)
    result = sup.run(host, timeout=60)
    assert result.returncode == 0, result.output
    assert "left by a supervisor that died" not in result.output, result.output
    assert working.is_running() and working.status() != psutil.STATUS_ZOMBIE
    assert "SIGKILL" not in read(console) and "FAILED" not in read(console), read(console)
    stop(container)
    assert container.returncode == 143, read(console)


@needs_unshare
def test_the_sweep_judges_a_tag_by_the_namespace_its_pid_is_of(tmp_path: Path) -> None:
    """Tags of a supervisor that is gone (a pid no process has) for one state_dir, in and out of our namespace."""
    state_dir = str(tmp_path / "state")
    ours = os.stat("/proc/self/ns/pid").st_ino
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1

    def sleeper(tag: str, namespace: bool) -> subprocess.Popen[bytes]:
        argv = ["unshare", "--pid", "--fork", "sleep", "1000"] if namespace else ["sleep", "1000"]
        return subprocess.Popen(argv, env={"PATH": os.environ["PATH"], TAG_ENV: tag, STATE_DIR_ENV: state_dir},
                                start_new_session=True)

    cases = {
        # A supervisor before tags named their namespace, pid 1 of a container: its pid says nothing here.
        "old tag, another namespace": (sleeper("1.7", namespace=True), False),
        "old tag, ours": (sleeper(f"{gone}.7", namespace=False), True),
        "tag of ours": (sleeper(f"{gone}.{ours}.1", namespace=False), True),
        # A child of a gone supervisor of ours that made a PID namespace of its own: its tag still says whose.
        "tag of ours, its process in a namespace it made": (sleeper(f"{gone}.{ours}.2", namespace=True), True),
        "tag of another namespace": (sleeper(f"1.{ours + 1}.3", namespace=False), False),
    }
    sleeping: dict[str, psutil.Process] = {}
    try:
        for what, (proc, _) in cases.items():
            sleeping[what] = the_sleep(proc)
        said: list[str] = []
        kill_survivors_of_dead_supervisors(state_dir, said.append, max_s=2)
        for what, (_proc, swept) in cases.items():
            alive = sleeping[what].is_running() and sleeping[what].status() != psutil.STATUS_ZOMBIE
            assert alive != swept, f"{what}: {'left alive' if alive else 'killed'}; {said}"
    finally:
        for proc, _ in cases.values():
            kill_tree(proc.pid)
            proc.wait(10)
        for left in sleeping.values():  # (a namespace's init outlives its unshare, killed by the sweep)
            with contextlib.suppress(psutil.Error):
                left.kill()


def the_sleep(proc: subprocess.Popen[bytes]) -> psutil.Process:
    """The ``sleep`` that ``proc`` is, or that it forked (unshare's)."""
    def find() -> list[psutil.Process]:
        top = psutil.Process(proc.pid)
        return [p for p in [top, *top.children()] if p.name() == "sleep"]
    found = wait_for(find, 10)
    assert isinstance(found, list) and len(found) == 1, found
    return found[0]


@needs_unshare
def test_a_bare_status_finds_the_supervisor_that_is_pid_1_of_another_namespace(sup: Runner, tmp_path: Path) -> None:
    """The container's supervisor points at itself in a runtime directory the host shares: its pid is 1 there,
    and the host's pid 1 is no supervisor; its socket answers all the same."""
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run")}
    config = sup.write(f"""
        [[phases]]
        name = "p"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """)
    proc = sup.start(config, pid1=True, env=dict(runtime))
    pointer = tmp_path / "run" / "current"
    asked = ("--json", "--state-dir", str(sup.state_dir))
    wait_for(lambda: pointer.exists() and status_cli(*asked, env=runtime)[0] == 0, 30)
    assert json.loads(pointer.read_text())["pid"] == 1
    rc, out = status_cli("--json", env=runtime)  # bare: the pointer is all it has
    assert rc == 0, out
    snap = json.loads(out)
    assert snap["live"] is True and snap["pid"] == 1 and [p["name"] for p in snap["phases"]] == ["p"], out
    rc, text = status_cli(env=runtime)
    assert rc == 0 and "not running" not in text, text
    stop(proc)
    assert proc.returncode == 143
    rc, text = status_cli(env=runtime)
    assert rc == 3 and "no prover-supervisor is running" in text, text


@needs_unshare
def test_a_container_supervisor_that_does_not_answer_is_not_gone_by_the_hosts_process_table(sup: Runner) -> None:
    """Its status.json says pid 1, which is no pid here: the host's pid 1 is no supervisor, and none of what it
    started carries a tag of this namespace. Frozen (SIGSTOP), it answers nothing, and is alive all the same: it is
    of another PID namespace, not answering, never gone."""
    config = sup.write(f"""
        [[phases]]
        name = "p"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """)
    proc, console = sup.start_to_file(config, pid1=True)
    asked = ("--json", "--state-dir", str(sup.state_dir))
    wait_for(lambda: status_cli(*asked, env={})[0] == 0, 30)
    saved = sup.state_dir / "status.json"
    wait_for(lambda: saved.exists() and json.loads(saved.read_text()).get("pid_ns") is not None, 30)
    inside = supervisor_pid(proc, pid1=True)
    assert json.loads(saved.read_text())["pid_ns"] == os.stat(f"/proc/{inside}/ns/pid").st_ino
    os.kill(inside, signal.SIGSTOP)
    try:
        rc, out = status_cli(*asked, env={})
        _, text = status_cli("--state-dir", str(sup.state_dir), env={})
    finally:
        os.kill(inside, signal.SIGCONT)
    assert rc == 3, out
    snap = json.loads(out)
    assert snap["supervisor"] == "not answering" and snap["live"] is False and snap["pid"] == 1, out
    assert "GONE" not in text and "pid 1 of another PID namespace, not answering" in text, text
    stop(proc)
    assert proc.returncode == 143, read(console)


def status_cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run([PY, "-m", "supervisor", "status", *args], capture_output=True, text=True,
                          env=clean_env(env), cwd=REPO, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_a_pointer_of_another_namespace_that_does_not_answer_is_named_as_that(tmp_path: Path) -> None:
    """Its pid says nothing here (this machine's pid 1 may be anything): only its socket could have said it runs."""
    runtime = {RUNTIME_DIR_ENV: str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    state_dir = tmp_path / "state"
    other = os.stat("/proc/self/ns/pid").st_ino + 1
    (tmp_path / "run" / "current").write_text(json.dumps(
        {"pid": os.getpid(), "pid_ns": other, "state_dir": str(state_dir), "socket": str(state_dir / "status.sock")}))
    rc, text = status_cli(env=runtime)
    assert rc == 3, text
    assert (f"the last supervisor started here (pid {os.getpid()} of another PID namespace, not answering) had "
            f"state_dir {state_dir}") in text, text


def test_the_exit_removes_only_its_own_pointer_not_that_of_the_same_pid_in_another_namespace(tmp_path: Path) -> None:
    """Two containers share /run: both supervisors are pid 1, and the first to exit must not unpoint the other."""
    pointer = tmp_path / "current"
    ours = os.stat("/proc/self/ns/pid").st_ino
    for ns, kept in ((ours + 1, True), (ours, False)):
        pointer.write_text(json.dumps({"pid": os.getpid(), "pid_ns": ns, "state_dir": "/s", "socket": "/s/x.sock"}))
        unpoint(pointer)
        assert pointer.exists() == kept, ns
