"""The tests' shared helpers: plain functions and constants (tests/conftest.py holds the fixtures).

Run the real supervisor as a real process against real children, write its config, read its
console (verdict lines, stamps), wait on processes and pid files, make v1 memory cgroups. What only
the prover's tests use (the built-in profile's knobs, the stand-ins' environment) is in
tests/prover/profilekit.py. Every test module imports what it shares from here, never
from another test module.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.devmanager.server import DevManager
from supervisor.engine.ports import free_ports
from supervisor.engine.trees import STATE_DIR_ENV, TAG_ENV, kill_survivors_of_dead_supervisors
from supervisor.text.units import MIB as MiB

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent


# ================================================================ config text


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


def shell(script: str) -> str:
    """Like ``sh()``, with every ``$`` escaped from the config's own ``${VAR}`` / ``$$`` expansion."""
    return sh(script.replace("$", "$$"))


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


# ================================================================ the supervisor as a process

def hup_as_default() -> None:
    """A Popen preexec_fn: SIGHUP back to its default in the supervisor under test. A suite run under
    ``nohup … &`` hands SIGHUP ignored to everything it starts, and the supervisor keeps an ignored SIGHUP
    ignored on purpose (Vast's onstart runs it under nohup): a test that sends SIGHUP must not inherit that."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@dataclass
class Result:
    """A supervisor that ended: its exit status, its console, how long it ran, its pid."""

    returncode: int
    output: str
    duration: float
    pid: int = 0


class Environ(dict[str, str]):
    """A whole environment made by ``Runner.env()``: a run given one uses it as it is, not over the base."""


class Runner:
    """``python -m supervisor run`` as a real process under one directory; ``cleanup`` kills what is left of it.

    One class, two set-ups (the ``sup`` and ``profile`` fixtures): ``Runner(tmp_path)`` writes a config
    (``write``) and runs on it (``run(config)``) in the test runner's own environment; a runner given
    ``base_env`` (the built-in profile's knobs: tests/prover/profilekit.py) runs with no config, steered by its
    environment alone (made afresh for each run, from the runner's dirs, label and manager as they are then),
    and with ``manager`` and ``label`` reads what its instance told that dev-manager.
    Either way ``env=`` of ``start``/``run`` is a few variables set over ``env()`` (a value None unsets one), or
    a whole environment that ``env()`` made (an ``Environ``: used as it is, so a test may delete from it). A
    ``Path`` among the arguments is a config (``--config``), a ``str`` an argument as it is.
    """

    def __init__(self, tmp_path: Path, *, base_env: Callable[[Runner], dict[str, str]] | None = None,
                 manager: DevManager | None = None, label: str = "") -> None:
        self.tmp = tmp_path
        self.state_dir = tmp_path / "state"
        self.log_dir = tmp_path / "logs"
        self.manager = manager
        self.label = label
        self.procs: list[subprocess.Popen[Any]] = []
        self._base_env = base_env or (lambda _runner: dict(os.environ))

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

    def env(self, **extra: str | None) -> Environ:
        """A whole environment for a run: the base (the runner's own, or the profile's knobs), ``extra`` over it."""
        return self._environ(extra)

    def _environ(self, extra: dict[str, str | None] | None) -> Environ:
        if isinstance(extra, Environ):
            return extra
        env: dict[str, str | None] = {**self._base_env(self), **(extra or {})}
        return Environ({k: v for k, v in env.items() if v is not None})

    def argv(self, *args: str | Path, pid1: bool = False) -> list[str]:
        cmd = [PY, "-m", "supervisor", "run"]
        for arg in args:
            cmd += ["--config", str(arg)] if isinstance(arg, Path) else [arg]
        if pid1:
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
        return cmd

    def start(self, *args: str | Path, pid1: bool = False,
              env: dict[str, str | None] | None = None) -> subprocess.Popen[str]:
        """Start it with its console on a pipe (``proc.stdout``)."""
        proc = subprocess.Popen(
            # Children's bytes pass through unchanged: decode leniently, a test may print binary.
            self.argv(*args, pid1=pid1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", env=self._environ(env), cwd=REPO, start_new_session=True, preexec_fn=hup_as_default,
        )
        self.procs.append(proc)
        return proc

    def start_to_file(self, *args: str | Path, pid1: bool = False, env: dict[str, str | None] | None = None,
                      name: str = "console") -> tuple[subprocess.Popen[bytes], Path]:
        """Start it with its console in ``<tmp>/<name>.txt``: nothing to drain, readable while it runs."""
        console = self.tmp / f"{name}.txt"
        with open(console, "wb") as out:
            proc = subprocess.Popen(self.argv(*args, pid1=pid1), stdout=out, stderr=subprocess.STDOUT,
                                    env=self._environ(env), cwd=REPO, start_new_session=True,
                                    preexec_fn=hup_as_default)
        self.procs.append(proc)
        return proc, console

    def run(self, *args: str | Path, timeout: float = 60, pid1: bool = False,
            env: dict[str, str | None] | None = None, name: str | None = None) -> Result:
        """Run it to its end (failing the test past ``timeout``); with ``name`` its console goes to a file."""
        started = time.monotonic()
        if name is None:
            return finish(self.start(*args, pid1=pid1, env=env), started, timeout)
        proc, console = self.start_to_file(*args, pid1=pid1, env=env, name=name)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)
            pytest.fail(f"supervisor did not finish within {timeout}s:\n{read(console)[-6000:]}")
        return Result(proc.returncode, read(console), time.monotonic() - started, proc.pid)

    def instance(self) -> dict[str, Any]:
        """The one instance this runner's label registered at its dev-manager."""
        assert self.manager is not None, "this runner has no dev-manager"
        mine = [i for i in self.manager.state.snapshot()["instances"].values() if i["label"] == self.label]
        assert len(mine) == 1, mine
        return mine[0]

    def calls(self, path: str) -> int:
        """How many calls to ``path`` its dev-manager received."""
        assert self.manager is not None, "this runner has no dev-manager"
        return sum(1 for c in self.manager.state.snapshot()["calls"] if c["path"] == path)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait(10)
        if any(proc.returncode is not None and proc.returncode < 0 for proc in self.procs):
            # A supervisor killed by a signal (a test's SIGKILL) left its children running, re-parented away
            # from it: what it tagged for this state_dir is ended as its next start would end it.
            kill_survivors_of_dead_supervisors(str(self.state_dir), lambda _line: None)


# What the test runner's environment must not leak into a supervisor under test.
DROP_ENV = ("MANAGER_URL", "MIN_RATE", "VAST_CONTAINERLABEL", "CONTAINER_ID", "SUPERVISOR_CONFIG")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and not k.startswith("STANDIN_")}
    env.update(extra or {})
    return env


class Console:
    """A supervisor whose console goes to a file, so a test can watch it while it runs."""

    def __init__(self, sup: Runner, config: Path, name: str = "console", env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.path = sup.tmp / f"{name}.txt"
        with open(self.path, "wb") as out:
            self.proc = subprocess.Popen([*sup.argv(config), *args], stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(env), cwd=REPO, start_new_session=True,
                                         preexec_fn=hup_as_default)
        sup.procs.append(self.proc)  # type: ignore[arg-type]
        self.pid = self.proc.pid

    def text(self) -> str:
        return read(self.path)

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
    return Result(proc.returncode, out, time.monotonic() - started, proc.pid)


# ================================================================ processes, pid files, ports

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


def until(proc: subprocess.Popen[str], text: str) -> str:
    """A supervisor's output until it says ``text`` (read as it comes: the pipe must not fill)."""
    assert proc.stdout is not None
    seen = ""
    while text not in seen:
        line = proc.stdout.readline()
        assert line, f"the supervisor ended before it said {text!r}:\n{seen[-3000:]}"
        seen += line
    return seen


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

# The suite runs on several workers (pyproject.toml's addopts). The few tests that load the machine themselves
# (a thousand daemons, a tree of 150,000 files, a CPU burnt to its limit) share one xdist group:
# they run one after another on one worker, so none of them makes another late.
heavy = pytest.mark.xdist_group("heavy")


def read_pid(path: Path, timeout: float = 20) -> int:
    """The pid a child wrote to ``path``, once the file holds one."""
    text = wait_for(lambda: path.exists() and path.read_text().strip(), timeout=timeout)
    return int(str(text))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    return free_ports(1)[0]


def is_listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stranger_on(port: int, host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    """Another process (not the supervisor's) listening on ``host:port``, once it is; the caller kills it."""
    proc = subprocess.Popen([PY, "-c", "import socket, sys, time\n"
                             "s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n"
                             "print('listening', flush=True); time.sleep(600)\n", host, str(port)],
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"listening\n", "the stranger could not listen"
    return proc


def read(path: Path) -> str:
    """A console file as text (children's bytes pass through unchanged: decoded leniently)."""
    return path.read_bytes().decode("utf-8", errors="replace")


# ================================================================ the console: verdict lines and stamps

# ``HH:MM:SS.mmm [supervisor] FAILED: phase=... reason=...`` (or ``ended:``): one per child that ended.
VERDICT_RE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \[supervisor\] (FAILED|ended): (phase=.*)$")
FIELD_RE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
CLOCK_RE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) ")


def verdict_lines(output: str, phase: str | None = None, child: str | None = None,
                  kind: str | None = None) -> list[str]:
    """The verdict records the supervisor logged (``phase=... reason=...``), in order; optionally only
    those of one phase, one child, one kind (``FAILED`` or ``ended``)."""
    found = []
    for line in output.splitlines():
        match = VERDICT_RE.match(line)
        if not match or (kind is not None and match.group(1) != kind):
            continue
        record = match.group(2)
        if phase is not None and not record.startswith(f"phase={phase} "):
            continue
        if child is not None and f" child={child} " not in record:
            continue
        found.append(record)
    return found


def one_verdict(output: str, phase: str, child: str | None = None, kind: str | None = None) -> str:
    lines = verdict_lines(output, phase, child, kind)
    assert len(lines) == 1, f"expected one {kind or ''} verdict for {phase}/{child}, got {lines}; output:\n{output}"
    return lines[0]


def last_failure(output: str, phase: str) -> str:
    """The last ``FAILED`` record of ``phase``."""
    lines = verdict_lines(output, phase, kind="FAILED")
    assert lines, f"no FAILED line for {phase}:\n{output[-4000:]}"
    return lines[-1]


def verdict_fields(record: str) -> dict[str, str]:
    """A verdict record's ``key=value`` pairs (a quoted value as the text it quotes: text/show.py ``logged``)."""
    return {key: _unquoted(value) for key, value in FIELD_RE.findall(record)}


def _unquoted(value: str) -> str:
    if not value.startswith('"'):
        return value
    return re.sub(r"\\(.)", r"\1", value[1:-1])


def verdicts(output: str, kind: str = "FAILED") -> list[dict[str, str]]:
    """The verdicts of one kind, as dicts."""
    return [verdict_fields(record) for record in verdict_lines(output, kind=kind)]


def failure(output: str) -> dict[str, str]:
    """The last ``FAILED`` verdict, as a dict."""
    found = verdicts(output, "FAILED")
    assert found, f"no FAILED verdict in:\n{output}"
    return found[-1]


def first_line(output: str, needle: str) -> str:
    for line in output.splitlines():
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} in output:\n{output}")


def clock_of(line: str) -> float:
    """Seconds since midnight of a console line's ``HH:MM:SS.mmm`` stamp."""
    match = CLOCK_RE.match(line)
    assert match, f"no timestamp in {line!r}"
    h, m, s, ms = (int(g) for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def seconds_between(earlier: str, later: str) -> float:
    """Time between two console lines by their stamps (a run that crosses midnight still counts right)."""
    return (clock_of(later) - clock_of(earlier)) % 86400


# ================================================================ the outbox

def outbox_rows(sup: Runner, *, logs: bool = True) -> list[tuple[int, str, str]]:
    """(id, kind, state) of every call (without the log pushes unless ``logs``), read with sqlite3 as
    another process would."""
    where = "" if logs else "WHERE kind != 'log' "
    with sqlite3.connect(f"file:{sup.state_dir / 'outbox.sqlite3'}?mode=ro", uri=True, timeout=5) as db:
        return db.execute(f"SELECT id, kind, state FROM calls {where}ORDER BY id").fetchall()


# ================================================================ tmpfs mounts (root)

def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``where``; None, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "not root: cannot mount a tmpfs"
    if shutil.which("mount") is None:
        return "mount(8) is not installed"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()}"


def bind_mount(source: Path, where: Path) -> str | None:
    """Bind-mount ``source`` on ``where`` (unmount it afterwards); None, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "not root: cannot bind-mount"
    if shutil.which("mount") is None:
        return "mount(8) is not installed"
    done = subprocess.run(["mount", "--bind", str(source), str(where)], capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount --bind failed: {done.stderr.strip()}"


def unmount(where: Path) -> None:
    """Unmount ``where``, lazily if something still holds it."""
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` on ``where`` for the ``with`` block (skips the test where none can be mounted)."""
    why = mount_tmpfs(where, size)
    if why is not None:
        pytest.skip(why)
    try:
        yield where
    finally:
        unmount(where)


# ================================================================ memory cgroups (v1, real)

V1_MOUNT = Path("/sys/fs/cgroup/memory")

# Allocates 4 MiB at a time, every byte written, until killed; gives up (exit 3) at 1 GiB, so a
# limit that is not applied can never put the machine at risk.
ALLOC_CODE = textwrap.dedent("""\
    import sys
    chunks = []
    while len(chunks) < 256:
        chunks.append(b"x" * (4 << 20))
    print("allocated 1 GiB without being stopped", flush=True)
    sys.exit(3)
    """)


def alloc_script(tmp: Path, name: str = "alloc.py") -> Path:
    path = tmp / name
    path.write_text(ALLOC_CODE)
    return path


def own_v1_memory_cgroup() -> Path | None:
    """This process's v1 memory cgroup directory, from /proc/self/cgroup (None if there is no such line)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if "memory" in controllers.split(","):
            return V1_MOUNT / rel.lstrip("/")
    return None


@functools.cache
def _probe_v1() -> tuple[Path | None, str]:
    if os.geteuid() != 0:
        return None, "not root: cannot create v1 memory cgroups"
    base = own_v1_memory_cgroup()
    if base is None:
        return None, "no v1 memory controller line in /proc/self/cgroup"
    if not (base / "memory.oom_control").exists():
        return None, f"{base}/memory.oom_control does not exist (v1 memory controller not mounted there)"
    probe = base / f"pytest-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return None, f"cannot create a child cgroup under {base}: {exc.strerror or exc}"
    problem = None
    try:
        (probe / "memory.limit_in_bytes").write_text(str(64 * MiB))
        if int((probe / "memory.limit_in_bytes").read_text()) != 64 * MiB:
            problem = f"memory.limit_in_bytes under {base} does not take a limit"
    except (OSError, ValueError) as exc:
        problem = f"cannot set a limit in a child cgroup under {base}: {exc}"
    try:
        probe.rmdir()
    except OSError as exc:
        problem = problem or f"cannot remove the child cgroup {probe}: {exc.strerror or exc}"
    if problem is not None:
        return None, problem
    return base, f"v1 memory cgroup {base} is writable"


def v1_memory_cgroup_or_skip() -> Path:
    """This process's own v1 memory cgroup, once a child cgroup was really made (with a limit) and removed there.

    Skips the calling test, with the reason printed (pytest -ra), where that is not possible.
    """
    base, why = _probe_v1()
    if base is None:
        print(f"skipping: {why}")
        pytest.skip(f"no writable v1 memory cgroup: {why}")
    return base


def remove_cgroup(path: Path, timeout: float = 10.0) -> None:
    """Remove a test cgroup: its sub-cgroups first, any process left moved out to the parent, then rmdir."""
    if not path.is_dir():
        return
    for sub in [p for p in path.iterdir() if p.is_dir()]:
        remove_cgroup(sub, timeout)
    parent_procs = path.parent / "cgroup.procs"
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    parent_procs.write_text(pid)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def v1_cgroup(name: str, limit: int) -> Iterator[Path]:
    """A child v1 memory cgroup of ours with ``memory.limit_in_bytes = limit``; removed afterwards."""
    assert limit <= 300 * MiB, "keep test limits small"
    base = v1_memory_cgroup_or_skip()
    path = base / f"pytest-{name}-{os.getpid()}"
    remove_cgroup(path)  # a leftover of an interrupted run
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        yield path
    finally:
        remove_cgroup(path)


@contextlib.contextmanager
def worker_memory_cgroup(worker: str) -> Iterator[Path | None]:
    """This process (a pytest-xdist worker) moved into a v1 memory cgroup of its own for the ``with`` block, and
    back out at the end (the cgroup removed, with whatever a test left in it).

    A supervisor makes its phase cgroups beside itself, named for its pid, and at its start removes the empty
    ones whose pid is dead *as it sees pids*: one in a PID namespace (``unshare``) takes a neighbour's new,
    still-empty phase cgroup for a dead supervisor's, and two such supervisors are both pid 1. Tests that run
    side by side on several workers must not meet there, so each worker's supervisors live in its own cgroup,
    as they did when the suite ran in one process. Yields None (and moves nothing) where there is no writable
    v1 memory cgroup: a supervisor there has no per-phase cgroups to share."""
    base, _why = _probe_v1()
    if base is None:
        yield None
        return
    path = base / f"pytest-{worker}-{os.getpid()}"
    remove_cgroup(path)  # a leftover of an interrupted run
    path.mkdir()
    try:
        (path / "cgroup.procs").write_text(str(os.getpid()))
        _probe_v1.cache_clear()  # the tests' own cgroups go in the worker's from here on
        yield path
    finally:
        remove_cgroup(path)  # every process in it (this one first) moved back out to ``base``
        _probe_v1.cache_clear()


def in_cgroup_argv(cgroup: Path, argv: list[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into ``cgroup`` (so everything it execs is counted there)."""
    script = f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))} && exec \"$@\""
    return ["sh", "-c", script, "sh", *argv]


def supervisor_pid(proc: subprocess.Popen[Any], pid1: bool) -> int:
    """The supervisor's pid as seen from here: under ``unshare --fork`` it is unshare's only child (unshare
    passes no signal on: a test signals this one)."""
    if not pid1:
        return proc.pid
    children = wait_for(lambda: psutil.Process(proc.pid).children(), timeout=10)
    assert isinstance(children, list) and len(children) == 1
    return children[0].pid


def start_in_cgroup(runner: Runner, config: Path, cgroup: Path) -> subprocess.Popen[str]:
    """Start ``python -m supervisor run`` inside ``cgroup`` (before it starts any child)."""
    proc = subprocess.Popen(
        in_cgroup_argv(cgroup, runner.argv(config)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=REPO, start_new_session=True,
    )
    runner.procs.append(proc)
    return proc


def run_in_cgroup(runner: Runner, config: Path, cgroup: Path, timeout: float = 60) -> Result:
    started = time.monotonic()
    return finish(start_in_cgroup(runner, config, cgroup), started, timeout)


# ================================================================ GPUs

def real_nvml_error() -> Exception | None:
    """What the real pynvml raises from nvmlInit here (None: NVML works, there is a driver)."""
    pynvml = pytest.importorskip("pynvml", reason="pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return exc
    pynvml.nvmlShutdown()
    return None


# ================================================================ children the supervisor started

STARTED_RE = re.compile(r"\[supervisor\] started (\S+): pid (\d+):", re.M)


def started(output: str) -> list[tuple[str, int]]:
    """(label, pid) of every child the supervisor said it started, in order."""
    return [(label, int(pid)) for label, pid in STARTED_RE.findall(output)]


# ================================================================ shared by core and prover tests


def stale_socket(path: Path) -> None:
    """The status socket file a SIGKILLed supervisor leaves (its exit removes it): bound once, listened on by none."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def fill(directory: Path, name: str = "filler") -> Path:
    """Write zeros into ``directory/name`` until the filesystem is full; the file is returned."""
    path = directory / name
    chunk = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    # The last partial pages too: nothing at all is left.
    with contextlib.suppress(OSError), open(path, "ab", buffering=0) as f:
        while True:
            f.write(b"\0")
    return path


def left_behind(state_dir: Path, supervisor_pid: int | None = None) -> list[psutil.Process]:
    """Live processes started by a supervisor of ``state_dir`` (or by the supervisor ``supervisor_pid``)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        tag = env.get(TAG_ENV)
        if not tag:
            continue
        if env.get(STATE_DIR_ENV) == str(state_dir) or tag.split(".", 1)[0] == str(supervisor_pid):
            found.append(proc)
    return found


def only_instance(mgr: DevManager) -> dict[str, Any]:
    insts = list(mgr.state.snapshot()["instances"].values())
    assert len(insts) == 1, f"expected one instance, the manager has {insts}"
    return insts[0]


def api_calls(mgr: DevManager, path: str | None = None) -> list[dict[str, Any]]:
    calls = mgr.state.snapshot()["calls"]
    return [c for c in calls if path is None or c["path"] == path]


def pushed(mgr: DevManager) -> dict[str, str]:
    """source → text, for the one instance's uuid."""
    logs = mgr.state.snapshot()["logs"]
    assert len(logs) <= 1, f"logs pushed under several uuids: {list(logs)}"
    return next(iter(logs.values()), {})


def spoil(path: Path, kind: str, contents: dict[str, bytes]) -> None:
    """Put a damaged state file at ``path``: a FIFO, a sparse 64 MiB file, or ``contents[kind]``."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer forever
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of zeros that take no disk
    else:
        path.write_bytes(contents[kind])


def status_now(sup: Runner) -> dict[str, Any]:
    """``status --json`` of ``sup``'s supervisor as it runs; {} while there is none to show yet (polled)."""
    shown = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                           capture_output=True, text=True, timeout=20)
    try:
        return json.loads(shown.stdout)
    except ValueError:
        return {}


# A download's stand-in, as the stall and freeze tests need it: writes ``size`` bytes into <dir>/params.bin at
# ``rate`` bytes a second, in eighths of a second, paced against its own start; ``late`` seconds of silence first
# (a slow first byte), after ``line`` on stdout if one is given. Its argv: dir, rate, size, late[, line]; its pid in
# the file $PACED_PID names, if set.
PACED_WRITER = """
    import os, sys, time
    if os.environ.get("PACED_PID"):
        write_pid(os.environ["PACED_PID"])
    rate, size, late = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    if sys.argv[5:]:
        print(sys.argv[5], flush=True)
    time.sleep(late)
    began, got = time.monotonic(), 0
    with open(os.path.join(sys.argv[1], "params.bin"), "wb") as fh:
        while got < size:
            fh.write(b"\\1" * (rate // 8))
            fh.flush()
            got += rate // 8
            time.sleep(max(0.0, began + got / rate - time.monotonic()))
    """


@contextlib.contextmanager
def dead_gateway() -> Iterator[str]:
    """A gateway that takes every connection and never answers (a hung IPFS gateway): its URL, on 127.0.0.1. A
    downloader there waits for headers that never come: no size, no body, no error."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    held: list[socket.socket] = []

    def take() -> None:
        with contextlib.suppress(OSError):  # (the server closed: the test is over)
            while True:
                held.append(server.accept()[0])

    taker = threading.Thread(target=take, name="dead gateway", daemon=True)
    taker.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # (wakes the accept)
        server.close()
        taker.join(5)
        for conn in held:
            conn.close()
