"""bench/profile.py's probes and bench/probe.py's patch still fit the code they measure.

The profile puts timing probes around named functions (``module:qualname``) and can swap in a proposed
``ChildOutput.feed``; both are written against supervisor/ internals, so a rename there silently breaks them
(a probe that cannot be installed, a patch reading attributes that are gone). Checked here: every name
resolves, the patch gives today's console bytes and ring, and a real run under probe.py with every probe
installed records them.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import textwrap
from pathlib import Path

from helpers import PY, REPO, clean_env

PROFILE = REPO / "bench" / "profile.py"
PROBE = REPO / "bench" / "probe.py"


def probe_names() -> list[str]:
    """Every ``module:qualname`` the profile hands probe.py (event labels like ``x.y:in`` left out)."""
    names = set(re.findall(r'"([a-z_][\w.]*:[\w.]+)"', PROFILE.read_text()))
    return sorted(n for n in names if not n.endswith((":in", ":out")))


def test_every_probe_names_code_that_exists() -> None:
    names = probe_names()
    assert len(names) > 20, names
    missing = []
    for name in names:
        module, _, path = name.partition(":")
        owner: object = importlib.import_module(module)
        for part in path.split("."):
            if not hasattr(owner, part):
                missing.append(name)
                break
            owner = getattr(owner, part)
    assert not missing, f"bench/profile.py probes code that is not there: {missing}"


def test_the_proposed_feed_gives_todays_console_bytes_and_ring() -> None:
    """profile.py's own check (``python bench/profile.py equiv``): mixed input in random read sizes."""
    source = PROFILE.read_text()
    start = source.index('EQUIV = r"""') + len('EQUIV = r"""')
    script = source[start:source.index('"""', start)]
    done = subprocess.run([PY, "-c", script, str(PROBE)], cwd=REPO, env=clean_env({"PYTHONPATH": str(REPO)}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["install_fast_feed", "console_equal=True", "ring_equal=True"], done.stdout


def test_a_run_under_probe_py_records_every_probe(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(textwrap.dedent(f"""\
        [supervisor]
        state_dir = "{tmp_path / 'state'}"
        log_dir = "{tmp_path / 'logs'}"

        [[phases]]
        name = "first"
        command = ["sh", "-c", "for i in 1 2 3; do echo line $i; done"]

        [[phases]]
        name = "second"
        command = ["sh", "-c", "echo two"]
        """))
    events = tmp_path / "events.json"
    env = clean_env({"PYTHONPATH": str(REPO), "PROBE_OUT": str(events), "PROBES": ",".join(probe_names()),
                     "PROBE_CONSOLE": "1", "PROBE_PATCH": "fastfeed"})
    done = subprocess.run([PY, str(PROBE), "run", "--config", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[first/first] line 3" in done.stdout, done.stdout
    seen = {name for name, _ in json.loads(events.read_text())}
    for label in ("file.persist:in", "snapshot.snapshot:out", "resume.load_record:in",
                  "socket.StatusServer.__init__:in", "phase.Phase.transition:in",
                  "verdict.VerdictRecord.record:in",
                  "children.spawn:in", "console_verdict_written"):
        assert label in seen, (label, sorted(seen))
