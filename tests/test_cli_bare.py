"""A bare ``prover-supervisor`` (no command) prints its help and exits 2: it never starts a lifecycle.

(``docker exec CONTAINER prover-supervisor`` beside a running supervisor must not start a second one; the
image's CMD and entrypoint say ``run`` themselves.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import PY, REPO, clean_env

from supervisor.exits import EXIT_CONFIG_ERROR


def test_a_bare_command_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    env = clean_env({"SUPERVISOR_STATE_DIR": str(tmp_path / "state"), "SUPERVISOR_LOG_DIR": str(tmp_path / "logs")})
    done = subprocess.run([PY, "-m", "supervisor"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == EXIT_CONFIG_ERROR, done.stdout + done.stderr
    assert done.stderr.startswith("usage: prover-supervisor"), done.stderr
    for command in ("run", "status", "check", "demo", "dev-manager"):
        assert command in done.stderr, done.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists(), "a lifecycle was started"
