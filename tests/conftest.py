"""The tests' fixtures (the prover's own are in tests/prover/conftest.py). Plain helpers (the supervisor runner,
verdict parsing, cgroups...) are in helpers.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Runner

from supervisor.devmanager import DevManager


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Runner]:
    runner = Runner(tmp_path)
    yield runner
    runner.cleanup()


@pytest.fixture
def manager() -> Iterator[DevManager]:
    """A dev-manager of the test's own, so its calls are the test's alone."""
    dev = DevManager(port=0, quiet=True).start()
    yield dev
    dev.stop()
