"""cuzk.toml on a full disk: the prover's generated config is written whole or not at all (tests/test_disk_faults.py
holds the core's disk faults).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import (
    mount_tmpfs,
    unmount,
)

from supervisor.prover import cuzkconf
from supervisor.prover.cuzkconf import CuzkSettings


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
