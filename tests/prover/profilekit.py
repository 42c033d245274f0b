"""The prover's test kit: the built-in profile's environment knobs (so it runs here, on the stand-ins, with a
dev-manager of the test's own), a Runner set up for it, the environment of a stand-in run by hand, and what an
output parser of the plugin's reads of a text (``parsed``).

Only tests under tests/prover/ use it; the runner itself is helpers.Runner, the same class the ``sup`` fixture
gives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from helpers import REPO, Runner, free_ports, sh, toml_str

from supervisor.devmanager.server import DevManager
from supervisor.prover.plugin import PLUGIN
from supervisor.status.file import RUNTIME_DIR_ENV  # the tests' own (conftest.py): kept like PATH

# STANDIN_SPEED for the tests: every stand-in delay scaled down to a twentieth.
STANDIN_FAST = "0.05"
# What cuzk-bench prints at the end of a batch whose proofs all completed at no measurable speed: a bench
# that passes its parser (parse = "cuzk-bench") with rate 0/h, below any min_rate.
ZERO_RATE_BENCH = ("=== Batch Summary ===\ntotal time:    1.0s\ncompleted:     1\nfailed:        0\n"
                   "throughput:    0 proofs/min\n")
# cuzk-bench's summary of a batch whose one proof completed at 0.5 proofs/min: 30 proofs/h.
BENCH_30_PER_H = ("=== Batch Summary ===\ntotal time:    120.0s\ncompleted:     1\nfailed:        0\n"
                  "throughput:    0.5 proofs/min\n")


def fleet_config(sup: Runner, url: str, label: str, bench: str, *, min_rate: float = 1, service_s: float = 0.3,
                 bench_after_s: float = 0, row_check_s: float | None = None, between: str = "") -> Path:
    """The fleet protocol's whole lifecycle against a manager at ``url``: a fetch (param-done), a bench printing
    ``bench`` (cuzk-bench's summary; bench-done) after ``bench_after_s``, a oneshot running the shell command
    ``between`` if given, a service of ``service_s`` (running)."""
    wait = f"sleep {bench_after_s:g}; " if bench_after_s else ""
    row_check = f"row_check_s = {row_check_s:g}" if row_check_s is not None else ""
    middle = f"""
        [[phases]]
        name = "between"
        command = {sh(between)}
        """ if between else ""
    return sup.write(f"""
        [manager]
        url = {toml_str(url)}
        label = {toml_str(label)}
        min_rate = {min_rate:g}
        log_push_interval_s = 0.2
        {row_check}

        [[phases]]
        name = "fetch"
        command = {sh("echo fetched")}
        report = "param-done"

        [[phases]]
        name = "bench"
        command = {sh(f"{wait}printf '{bench}'")}
        parse = "cuzk-bench"
        report = "bench-done"
        {middle}
        [[phases]]
        name = "service"
        kind = "service"
        command = {sh(f"echo serving; exec sleep {service_s:g}")}
        report = "running"
        """)


def standin_env(**extra: str) -> dict[str, str]:
    """An environment for a stand-in run by hand: none of the runner's own knobs, the repo importable, fast."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STANDIN_", "GOLOG_", "CURIO_", "CUZK_", "RUST_LOG")) and k != "TRUST_PARAMS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["STANDIN_SPEED"] = STANDIN_FAST
    env.update(extra)
    return env


# The test runner's own environment must not steer the profile under test.
DROP_PREFIXES = ("MANAGER_", "MIN_RATE", "VAST_", "CONTAINER_", "SUPERVISOR_", "STANDIN_", "CUZK_", "CURIO_",
                 "BENCH_", "PROVER_", "FIL_PROOFS_", "SECTOR_SIZE", "MGR_", "API_TOKEN", "RUST_LOG")


def profile_env(runner: Runner, bin_dir: Path) -> dict[str, str]:
    """One machine: the runner's dirs, label and dev-manager, a parameter cache, the stand-ins first on PATH,
    fresh ports."""
    assert runner.manager is not None, "the profile reports to a dev-manager"
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP_PREFIXES) or k == RUNTIME_DIR_ENV}
    env.update({
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "MANAGER_URL": runner.manager.url,
        "VAST_CONTAINERLABEL": runner.label,
        "SUPERVISOR_STATE_DIR": str(runner.state_dir),
        "SUPERVISOR_LOG_DIR": str(runner.log_dir),
        "FIL_PROOFS_PARAMETER_CACHE": str(runner.tmp / "params"),
        "PROVER_MIN_MEMORY": "1GiB",
        # Fitness on a machine with no GPU and a small disk: stand-ins need neither.
        "PROVER_MIN_PARAM_DISK": "64MiB",
        "PROVER_REQUIRE_GPUS": "false",
        "CUZK_BASELINE": "1GiB",
        "CUZK_PER_PARTITION": "512MiB",
        "BENCH_C1": str(bin_dir / "c1.json"),
        "STANDIN_SPEED": "0.1",
        "STANDIN_RUN_SECONDS": "2",
        # The stand-in curio ends by itself after STANDIN_RUN_SECONDS, so that a run completes: not restarted. The
        # profile's own policy (always, as in production) has a test of its own (test_profile.py).
        "PROVER_CURIO_RESTART": "on-failure",
        "BENCH_COUNT": "4",
        **dict(zip(("CUZK_PORT", "CUZK_STATUS_PORT", "CURIO_PORT"), map(str, free_ports(3)), strict=True)),
    })
    return env


def profile_runner(root: Path, bin_dir: Path, manager: DevManager, label: str) -> Runner:
    """A Runner for the built-in profile: no config, every run's environment from ``profile_env`` (fresh ports)."""
    return Runner(root, base_env=lambda runner: profile_env(runner, bin_dir), manager=manager, label=label)


def parsed(kind: str, text: str) -> Any:
    """What the output parser of ``parse = kind`` reads of ``text``, made and fed as a phase makes and feeds it (the
    plugin's OutputHook: ``new_parser()``, then the command's lines as they arrive), one line a read."""
    parser = PLUGIN.parsers[kind].new_parser()
    for line in text.splitlines():
        parser.feed([line.encode()])
    return parser.result
