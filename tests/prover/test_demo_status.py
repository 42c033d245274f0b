"""The demo says where its state is and the ``status`` command that shows it, and that command works: while
the demo runs (exit 0, the live supervisor answers) and, with ``--keep``, after it (exit 3, its last state)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, clean_env, kill_tree, wait_for

from supervisor.exits import EXIT_NOT_RUNNING

DEMO_TIMEOUT_S = 120
WATCH_RE = re.compile(r"^demo: state in (\S+): watch it from another shell with: (prover-supervisor status .+)$", re.M)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short name: the demo's state_dir under pytest's tmp_path would make the status
    socket's path longer than a unix socket's 107 bytes (and the demo refuse its own config)."""
    path = Path(tempfile.mkdtemp(prefix="demo-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """The demo through the real CLI, its console in a file, its temporary directory under ``tmp_path``."""
    console = tmp_path / "demo.out"
    with console.open("w") as out:
        proc = subprocess.Popen([PY, "-m", "supervisor", "demo", *args], stdout=out, stderr=subprocess.STDOUT,
                                text=True, env=clean_env({"TMPDIR": str(tmp_path)}), cwd=REPO,
                                start_new_session=True)
    return proc, console


def said_command(console: Path) -> tuple[str, list[str]]:
    """The state_dir the demo named and its status command, as argv for this checkout's CLI."""
    match = wait_for(lambda: WATCH_RE.search(console.read_text()), timeout=60)
    assert match, console.read_text()
    state_dir, command = match.group(1), match.group(2)  # type: ignore[union-attr]
    argv = shlex.split(command)
    assert argv[:3] == ["prover-supervisor", "status", "--state-dir"] and argv[3] == state_dir, command
    return state_dir, [PY, "-m", "supervisor", *argv[1:]]


def status(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=30)


def finished(proc: subprocess.Popen[str], console: Path) -> str:
    try:
        proc.wait(timeout=DEMO_TIMEOUT_S)
    finally:
        kill_tree(proc.pid)
    return console.read_text()


def test_the_demo_names_its_state_and_the_status_command_which_answers_while_it_runs_and_after(
        short_tmp: Path) -> None:
    tmp_path = short_tmp
    proc, console = start_demo(tmp_path, "--keep")
    try:
        state_dir, argv = said_command(console)
        assert Path(state_dir).is_relative_to(tmp_path), state_dir
        wait_for(lambda: (Path(state_dir) / "status.sock").exists(), timeout=60)
        during = status(argv)
    finally:
        out = finished(proc, console)
    assert proc.returncode == 0, out[-4000:]
    # Asked while it ran, the live supervisor answered (exit 0); had it just ended, its last state (exit 3).
    assert during.returncode in (0, EXIT_NOT_RUNNING), during.stdout + during.stderr
    assert "lifecycle" in during.stdout, during.stdout
    lines = out.splitlines()
    said = next(i for i, line in enumerate(lines) if WATCH_RE.match(line))
    assert said < next(i for i, line in enumerate(lines) if "phase paramfetch: pending → starting" in line), out
    assert f"its last state: prover-supervisor status --state-dir {state_dir}" in out, out[-2000:]
    after = status(argv)
    assert after.returncode == EXIT_NOT_RUNNING, after.stdout + after.stderr
    assert "no prover-supervisor is running" in after.stdout and "curio" in after.stdout, after.stdout


def test_without_keep_the_demo_says_it_removed_the_state(short_tmp: Path) -> None:
    tmp_path = short_tmp
    proc, console = start_demo(tmp_path)
    state_dir, _ = said_command(console)
    out = finished(proc, console)
    assert proc.returncode == 0, out[-4000:]
    assert "(removed with its state; --keep keeps them for: prover-supervisor status --state-dir" in out, out[-2000:]
    assert not Path(state_dir).exists()
    assert not any(p.name.startswith("prover-supervisor-demo-") for p in tmp_path.iterdir())  # all of it
