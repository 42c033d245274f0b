"""The prover's fixtures: the stand-ins' bin dir and the built-in profile's runner (``profile``).

``sup`` and ``manager`` come from tests/conftest.py; ``profile`` is the same Runner class as ``sup``, set up
for the built-in profile (tests/prover/profilekit.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, Runner
from profilekit import profile_runner

from supervisor.devmanager.server import DevManager


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


_counter = iter(range(1_000_000))


@pytest.fixture
def profile(tmp_path: Path, bin_dir: Path, manager: DevManager) -> Iterator[Runner]:
    # C.<digits>: a label the manager can match (a derived one of any other form is refused).
    prof = profile_runner(tmp_path, bin_dir, manager, f"C.{os.getpid()}{next(_counter):04d}")
    yield prof
    prof.cleanup()
