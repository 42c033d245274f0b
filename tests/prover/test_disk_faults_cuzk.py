"""cuzk.toml on a full disk: the prover's generated config is written whole or not at all (tests/test_disk_faults.py
holds the core's disk faults).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    fill,
)

from supervisor.prover import cuzkconf
from supervisor.prover.cuzkconf import CuzkSettings


def test_cuzk_toml_on_a_full_disk(tmp_path: Path, tmpfs: Callable[[Path, str], Path]) -> None:
    """The same text again (a service restarted) needs no room; a new text fails cleanly, no temporary file left."""
    disk = tmpfs(tmp_path / "state", "256k")
    settings = CuzkSettings(config_path=str(disk / "cuzk.toml"))
    first = cuzkconf.generate(settings, 256 * cuzkconf.GIB, [])
    cuzkconf.write(first, disk / "cuzk.toml", disk / "cuzk.generated.toml")
    fill(disk)
    cuzkconf.write(first, disk / "cuzk.toml", disk / "cuzk.generated.toml")  # unchanged: nothing to write
    other = cuzkconf.generate(settings, 512 * cuzkconf.GIB, [])
    assert other.text != first.text
    with pytest.raises(OSError) as failed:
        cuzkconf.write(other, disk / "cuzk.toml")
    assert failed.value.errno == errno.ENOSPC
    assert (disk / "cuzk.toml").read_text() == first.text, "the daemon's file is whole, the old one"
    assert not list(disk.glob("*.tmp"))
