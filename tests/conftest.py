"""The tests' fixtures (the prover's own are in tests/prover/conftest.py). Plain helpers (the supervisor runner,
verdict parsing, cgroups...) are in helpers.py."""

from __future__ import annotations

import atexit
import compileall
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

# The tests start thousands of Pythons from this checkout (every supervisor and stand-in runs with the repository
# as its working directory, so its `supervisor` is this one's source tree, not the installed copy). Where
# PYTHONDONTWRITEBYTECODE is set (these machines set it), none of them may write its bytecode, and each compiled
# every module it imports from source again: about 0.2 s of CPU a supervisor. Compiled here once, by the pytest
# process that starts the run (under pytest-xdist the controller, before it starts its workers; a file already
# compiled is skipped), they all read it. The variable only forbids writing: compileall writes all the same.
if not os.environ.get("PYTEST_XDIST_WORKER"):
    for _tree in ("supervisor", "tests"):
        compileall.compile_dir(Path(__file__).resolve().parent.parent / _tree, quiet=1)

import psutil
import pytest
from helpers import Runner, left_behind, mount_tmpfs, unmount, worker_memory_cgroup
from standin_nvml import NvmlControl, fake_pynvml

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.status.file import RUNTIME_DIR_ENV

# Every supervisor a test starts points at itself (status/file.py); a bare `status` follows the pointer. The
# tests' pointers go to a directory of this session's own, never /run/prover-supervisor of the machine, so a
# test's supervisor is not found by another session's bare `status`, nor the machine's by a test's. Under
# pytest-xdist the workers inherit the controller's directory, and each takes a folder of its own in it: a
# bare `status` of one worker's test must not follow the pointer of a supervisor another worker runs.
if RUNTIME_DIR_ENV not in os.environ:  # (made by the process that starts the suite, removed as it ends: each run
    # left one behind in /tmp, hundreds in a day of runs)
    os.environ[RUNTIME_DIR_ENV] = tempfile.mkdtemp(prefix="prover-supervisor-tests-")
    atexit.register(shutil.rmtree, os.environ[RUNTIME_DIR_ENV], ignore_errors=True)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ[RUNTIME_DIR_ENV] = tempfile.mkdtemp(prefix=f"{os.environ['PYTEST_XDIST_WORKER']}-",
                                                   dir=os.environ[RUNTIME_DIR_ENV])


# A suite started in the background of a script (`pytest &` where the shell has no job control, as `nohup … &`
# in a script) inherits SIGINT and SIGQUIT ignored, and hands them on so to every process it starts: Python then
# makes no KeyboardInterrupt of a Ctrl-C, and the tests that send one to `status` or `dev-manager` would wait on
# a signal that is dropped. They are given back their defaults here, as a terminal's foreground job has them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="session", autouse=True)
def worker_cgroup() -> Iterator[None]:
    """Under pytest-xdist, each worker's supervisors make their cgroups in a memory cgroup of the worker's own
    (helpers.worker_memory_cgroup says why); in one process the suite runs where it was started."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        yield
        return
    with worker_memory_cgroup(worker):
        yield


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Runner]:
    runner = Runner(tmp_path)
    yield runner
    runner.cleanup()


@pytest.fixture
def manager() -> Iterator[DevManager]:
    """A dev-manager of the test's own, so its calls are the test's alone."""
    dev = dev_manager(port=0, quiet=True).start()
    yield dev
    dev.stop()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[Path, str], Path]]:
    """Mount small tmpfs filesystems (unmounted at the end, lazily if something still holds them)."""
    mounted: list[Path] = []

    def mount(where: Path, size: str) -> Path:
        why = mount_tmpfs(where, size)
        if why is not None:
            pytest.skip(why)
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        unmount(where)


@pytest.fixture
def orphans(sup: Runner) -> Iterator[Callable[[int], list[psutil.Process]]]:
    """``orphans(pid)``: what the SIGKILLed supervisor ``pid`` left running; all of it is killed at the end."""
    dead: list[int] = []

    def survivors(pid: int) -> list[psutil.Process]:
        dead.append(pid)
        return left_behind(sup.state_dir, pid)

    yield survivors
    sup.cleanup()
    for pid in [*dead, None]:
        for proc in left_behind(sup.state_dir, pid):
            with contextlib.suppress(psutil.Error):
                proc.kill()


@pytest.fixture
def managers() -> Iterator[Callable[..., DevManager]]:
    """Start dev-managers (quiet, on a given port or any); all stopped at the end."""
    started: list[DevManager] = []

    def start(port: int = 0) -> DevManager:
        mgr = dev_manager(port=port, quiet=True).start()
        started.append(mgr)
        return mgr

    yield start
    for mgr in started:
        mgr.stop()


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlControl:
    """The stand-in pynvml in place of the real module for this test, steered by its control file."""
    ctl = NvmlControl(tmp_path / "nvml.json", log=str(tmp_path / "nvml-calls.log"))
    fake_pynvml(monkeypatch, ctl)
    return ctl
