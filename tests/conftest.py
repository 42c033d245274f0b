"""Shared test helpers: run the real supervisor as a real process against real children."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent


def toml_str(text: str) -> str:
    """A TOML basic string holding ``text`` exactly (newlines and other controls escaped)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    for ch in sorted({c for c in out if ord(c) < 0x20 or ord(c) == 0x7F}):
        out = out.replace(ch, {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\u{ord(ch):04x}"))
    return '"' + out + '"'


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(toml_str(i) for i in items) + "]"


def sh(script: str) -> str:
    """A TOML command array that runs ``script`` with /bin/sh."""
    return toml_list(["sh", "-c", script])


def pyc(code: str) -> str:
    """A TOML command array that runs Python ``code``."""
    return toml_list([PY, "-c", textwrap.dedent(code)])


# Written into scripts that need it: a pid file appears whole or not at all.
WRITE_PID = """
import os as _os
def write_pid(path, pid=None):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(pid or _os.getpid()))
    _os.replace(tmp, path)
"""


def py_script(tmp: Path, name: str, code: str, *args: object) -> str:
    """Write Python ``code`` (with ``write_pid``) to a file; return the TOML argv that runs it."""
    path = tmp / f"{name}.py"
    path.write_text(WRITE_PID + textwrap.dedent(code))
    return toml_list([PY, str(path), *map(str, args)])


@dataclass
class Result:
    returncode: int
    output: str
    duration: float


class SupervisorRunner:
    """Writes a config under tmp_path and runs ``python -m supervisor`` on it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state_dir = tmp_path / "state"
        self.log_dir = tmp_path / "logs"
        self.procs: list[subprocess.Popen[str]] = []

    def header(self, stop_grace_s: float = 2, extra: str = "") -> str:
        return textwrap.dedent(f"""\
            [supervisor]
            state_dir = {toml_str(str(self.state_dir))}
            log_dir = {toml_str(str(self.log_dir))}
            stop_grace_s = {stop_grace_s}
            {extra}
            """)

    def write(self, body: str, *, stop_grace_s: float = 2, name: str = "config.toml", header: bool = True) -> Path:
        path = self.tmp / name
        path.write_text((self.header(stop_grace_s) if header else "") + textwrap.dedent(body))
        return path

    def argv(self, config: Path, *, pid1: bool = False) -> list[str]:
        cmd = [PY, "-m", "supervisor", "run", "--config", str(config)]
        if pid1:
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
        return cmd

    def start(self, config: Path, *, pid1: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            # Children's bytes pass through unchanged: decode leniently, a test may print binary.
            self.argv(config, pid1=pid1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace",
            env={**os.environ, **(env or {})}, cwd=REPO, start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, config: Path, *, timeout: float = 60, pid1: bool = False,
            env: dict[str, str] | None = None) -> Result:
        started = time.monotonic()
        return finish(self.start(config, pid1=pid1, env=env), started, timeout)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait(10)


# What the test runner's environment must not leak into a supervisor under test.
DROP_ENV = ("MANAGER_URL", "MIN_RATE", "VAST_CONTAINERLABEL", "CONTAINER_ID", "SUPERVISOR_CONFIG")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and not k.startswith("STANDIN_")}
    env.update(extra or {})
    return env


class Console:
    """A supervisor whose console goes to a file, so a test can watch it while it runs."""

    def __init__(self, sup: SupervisorRunner, config: Path, name: str = "console", env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.path = sup.tmp / f"{name}.txt"
        with open(self.path, "wb") as out:
            self.proc = subprocess.Popen([*sup.argv(config), *args], stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(env), cwd=REPO, start_new_session=True)
        sup.procs.append(self.proc)  # type: ignore[arg-type]
        self.pid = self.proc.pid

    def text(self) -> str:
        return self.path.read_bytes().decode("utf-8", errors="replace")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def wait_text(self, needle: str, timeout: float = 30) -> None:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: needle in self.text() or self.proc.poll() is not None, timeout, 0.05)
        if needle not in self.text():
            pytest.fail(f"no {needle!r} within {timeout}s (exit status {self.proc.poll()}); console:\n{self.tail()}")

    def finish(self, timeout: float = 40) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.pid)
            self.proc.wait(10)
            pytest.fail(f"supervisor did not finish within {timeout}s; console:\n{self.tail()}")

    def sigkill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)


def finish(proc: subprocess.Popen[str], started: float, timeout: float = 60) -> Result:
    """Wait for a supervisor started at ``started`` and collect its output; fail (killing it) past ``timeout``."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f"supervisor did not finish within {timeout}s; output:\n{out}")
    return Result(proc.returncode, out, time.monotonic() - started)


def kill_tree(pid: int) -> None:
    """SIGKILL a process, its group and its descendants (test cleanup only)."""
    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        procs = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def pid_alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[SupervisorRunner]:
    runner = SupervisorRunner(tmp_path)
    yield runner
    runner.cleanup()


def can_unshare() -> str | None:
    """None if ``unshare --pid --fork --mount-proc`` works here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    if os.geteuid() != 0:
        return "not root: cannot create a PID namespace"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --pid failed: {probe.stderr.strip()}"
    return None


needs_unshare = pytest.mark.skipif(can_unshare() is not None, reason=f"no PID namespace: {can_unshare()}")
