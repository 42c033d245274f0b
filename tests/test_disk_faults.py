"""A full disk costs log lines and durability, never the lifecycle: real tmpfs mounts filled for real.

``log_dir`` and ``state_dir`` are put on small tmpfs mounts (root only: skipped elsewhere) and filled with a
file from the test, before the start or in the middle of a run; the supervisor must pass on the child's
exit status, say once what it cannot write, say when it can again, and lose no manager call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SupervisorRunner, py_script

from supervisor import logs
from supervisor.logs import LogFile

EXIT_CHILD = 4


def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``where``; None, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "not root: cannot mount a tmpfs"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()}"


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
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


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


def verdict_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "FAILED: phase=" in line or "ended: phase=" in line]


# ================================================================ log_dir


def test_logfile_on_a_full_disk_says_once_drops_and_says_when_it_works_again(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    disk = tmpfs(tmp_path / "logs", "64k")
    monkeypatch.setattr(logs, "RETRY_WRITE_S", 0.0)  # try again at every write: the test need not wait
    notes: list[str] = []
    log = LogFile(disk / "c.log", 0, notes.append)
    log.write(b"before\n")
    filler = fill(disk)
    for _ in range(50):
        log.write(b"x" * 1000 + b"\n")
    assert len(notes) == 1 and "cannot write" in notes[0] and "No space left" in notes[0], notes
    filler.unlink()
    log.write(b"after\n")
    assert len(notes) == 2 and "works again" in notes[1], notes
    lost = int(re.search(r"(\d+) byte\(s\) of output were lost", notes[1]).group(1))  # type: ignore[union-attr]
    assert lost > 0
    log.close()
    content = (disk / "c.log").read_bytes()
    assert content.startswith(b"before\n") and content.endswith(b"after\n")
    assert len(content) + lost == len(b"before\n") + 50 * 1001 + len(b"after\n")


def test_logfile_close_and_roll_on_a_full_disk_never_raise(tmp_path: Path,
                                                          tmpfs: Callable[[Path, str], Path]) -> None:
    disk = tmpfs(tmp_path / "logs", "64k")
    notes: list[str] = []
    log = LogFile(disk / "c.log", 8192, notes.append)
    log.write(b"a" * 8000)
    fill(disk)
    log.write(b"b" * 8000)  # past max_bytes: rolls (a rename works), then the write fails
    log.write(b"c" * 8000)  # within the retry interval: dropped without a word
    log.close()
    log.close()
    assert len(notes) == 1 and "cannot write" in notes[0], notes


def test_full_log_dir_costs_lines_not_the_lifecycle(sup: SupervisorRunner,
                                                    tmpfs: Callable[[Path, str], Path]) -> None:
    """A child prints far more than log_dir holds, then exits 4: the supervisor exits 4 with that verdict."""
    tmpfs(sup.log_dir, "64k")
    # Large writes (a pipe read takes up to 64 KiB at once): the file fills in the middle of one.
    chatty = py_script(sup.tmp, "chatty", """
        import os, sys
        for i in range(40):
            os.write(1, b"".join(b"line %d.%d " % (i, j) + b"y" * 200 + b"\\n" for j in range(300)))
        sys.exit(int(sys.argv[1]))
        """, EXIT_CHILD)
    config = sup.write(f"""
        [[phases]]
        name = "chatty"
        command = {chatty}
        """)
    result = sup.run(config, timeout=60)
    assert result.returncode == EXIT_CHILD, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    verdicts = verdict_lines(result.output)
    assert len(verdicts) == 1 and "reason=exit_code" in verdicts[0] and "phase=chatty" in verdicts[0], verdicts
    said = [line for line in result.output.splitlines() if "cannot write" in line]
    # Once per file that filled (the child's, and the supervisor's own): never once per line.
    assert 1 <= len(said) <= 2, said
    assert any("chatty.log" in line for line in said), said
    assert f"exiting with status {EXIT_CHILD}" in result.output
