"""A bare ``prover-supervisor`` (no command) prints its help and exits 2: it never starts a lifecycle.

(``docker exec CONTAINER prover-supervisor`` beside a running supervisor must not start a second one; the
image's CMD and entrypoint say ``run`` themselves.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import PY, REPO, clean_env, toml_str

from supervisor.exits import EXIT_CONFIG_ERROR


def test_a_bare_command_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    env = clean_env({"SUPERVISOR_STATE_DIR": str(tmp_path / "state"), "SUPERVISOR_LOG_DIR": str(tmp_path / "logs")})
    done = subprocess.run([PY, "-m", "supervisor"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == EXIT_CONFIG_ERROR, done.stdout + done.stderr
    assert done.stderr.startswith("usage: prover-supervisor"), done.stderr
    for command in ("run", "status", "check", "demo", "dev-manager"):
        assert command in done.stderr, done.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists(), "a lifecycle was started"


def test_the_entrypoint_takes_options_alone_as_runs(tmp_path: Path) -> None:
    """``docker run IMAGE --config F`` replaces the image's CMD ``run`` with ``--config F``: the entrypoint (whose
    command is ``run`` when none is given) said ``invalid choice: 'F'``. Options alone are run's; options before
    another command are refused, saying where they go."""
    state = tmp_path / "state"
    config = tmp_path / "c.toml"
    config.write_text(f"[supervisor]\nstate_dir = {toml_str(str(state))}\n"
                      f"log_dir = {toml_str(str(tmp_path / 'logs'))}\nrequire_gpus = false\ncgroups = \"off\"\n"
                      '[[phases]]\nname = "a"\ncommand = ["true"]\n')
    entrypoint = [PY, str(REPO / "entrypoint.py")]
    done = subprocess.run([*entrypoint, "--config", str(config), "check"], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=60)
    assert (done.returncode, done.stdout) == (EXIT_CONFIG_ERROR, ""), done
    assert done.stderr == ("prover-supervisor: --config goes after the command: `prover-supervisor check --config …` "
                           "(see prover-supervisor --help)\n"), done.stderr
    assert not state.exists(), "a lifecycle was started"
    done = subprocess.run([*entrypoint, "--config", str(config)], capture_output=True, text=True, env=clean_env(),
                          cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lifecycle complete" in done.stdout and (state / "status.json").exists(), done.stdout
