"""The tests' fixtures. Plain helpers (the supervisor runner, verdict parsing, cgroups...) are in helpers.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, Profile, SupervisorRunner

from supervisor.devmanager import DevManager


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[SupervisorRunner]:
    runner = SupervisorRunner(tmp_path)
    yield runner
    runner.cleanup()


# ================================================================ the built-in prover profile


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-ins under their real names, written by the CLI itself."""
    target = tmp_path_factory.mktemp("standins") / "bin"
    done = subprocess.run([PY, "-m", "supervisor", "standins", "--bin-dir", str(target)], capture_output=True,
                          text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for name in ("curio", "cuzk-daemon", "cuzk-bench", "paramfetch", "c1.json"):
        assert (target / name).exists(), done.stdout
    return target


@pytest.fixture
def manager() -> Iterator[DevManager]:
    """A dev-manager of the test's own, so its calls are the test's alone."""
    dev = DevManager(port=0, quiet=True).start()
    yield dev
    dev.stop()


_counter = iter(range(1_000_000))


@pytest.fixture
def profile(tmp_path: Path, bin_dir: Path, manager: DevManager) -> Iterator[Profile]:
    # C.<digits>: a label the manager can match (a derived one of any other form is refused).
    prof = Profile(tmp_path, bin_dir, manager, f"C.{os.getpid()}{next(_counter):04d}")
    yield prof
    prof.cleanup()
