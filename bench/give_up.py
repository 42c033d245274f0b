#!/usr/bin/env python3
"""Failure → the manager shows the instance killed: how long does the give-up take?

    python bench/give_up.py            # 5 runs of each failure, prints the table
    python bench/give_up.py --runs 10

Runs the built-in prover profile (no config) with the stand-ins on PATH against an
in-process dev-manager, once per run, for seven failures before production: the
machine is unfit (fitness, insufficient_memory), the parameter fetch crashes, the
warm-up proof crashes, a link too slow for the manager's fetch clock (too_slow: 60 MiB
at 1 MiB/s from a local gateway, 30 s deadline, 5 s window; the real aria2c where
installed), a bench that can no longer pass min_rate (too_slow: 4 proofs of 3 s one
at a time against min_rate 3600/h), and two on the manager's clock, its row set
beforehand as its own decisions would have left it: a new container joining a row
registered 91 min ago (too_slow at the first look at the download), and a restart 46
min after the row's param_done_at (too_slow as the warm-up starts). The figure is the
dev-manager's ``killed_at`` (when it handled the give-up, ``bench-done`` with rate 0)
minus the failure verdict's ``ended_at`` (from ``state_dir/status.json``): both are
this machine's clock. It includes the outbox's fsyncs and the HTTP calls queued before
the give-up (registration, the row's look-up, the verdict's log push, the "stopping" line).

Then the manager's own kill (its UI's) of an instance in production: how long until the
supervisor, reading the row every 5 s (the least ``row_check_s``), has stopped everything
and exited 80 (the kill's time to the process's end, on this machine's monotonic clock).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LABELS = itertools.count(900001)
KILL_ROW_CHECK_S = 5.0  # the least row_check_s may be: the kill is learnt at the next look-up
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from supervisor.app.cli import dev_manager  # noqa: E402
from supervisor.devmanager.server import DevManager  # noqa: E402
from supervisor.exits import EXIT_KILLED  # noqa: E402
from supervisor.prover.demo import free_ports  # noqa: E402
from supervisor.prover.standins.paramserve import ParamServer  # noqa: E402

FAILURES = {
    "fitness (insufficient_memory)": {"PROVER_MIN_MEMORY": "1TiB"},
    "paramfetch crash (3 attempts)": {"STANDIN_FAIL_PARAMFETCH": "crash"},
    "warm-up crash": {"STANDIN_FAIL_CUZK_BENCH": "crash"},
    # IPFS_GATEWAY is the bench's own ParamServer (main).
    "slow link (too_slow)": {"STANDIN_PARAM_FILES": "3", "STANDIN_PARAM_BYTES": "20MiB", "STANDIN_PARAM_RATE": "1MiB",
                             "PROVER_PARAM_TOTAL": "60MiB", "PROVER_FETCH_DEADLINE_S": "30",
                             "PROVER_SLOW_WINDOW_S": "5"},
    "hopeless bench (too_slow)": {"MIN_RATE": "3600", "BENCH_CONCURRENCY": "1", "STANDIN_PROOF_S": "3",
                                  "BENCH_COUNT": "4"},
    # The manager's clock (its row, set before the run as its own decisions would have left it): a new
    # container joining a row registered 91 min ago, a restart 46 min after the row's param_done_at.
    "row past the fetch clock (too_slow)": {"STANDIN_PARAM_FILES": "3", "STANDIN_PARAM_BYTES": "20MiB",
                                            "STANDIN_PARAM_RATE": "1MiB", "PROVER_PARAM_TOTAL": "60MiB"},
    "row past the bench clock (too_slow)": {},
}
# What the dev-manager's row holds before the run (times as seconds before now): POST /dev/row.
ROWS = {"row past the fetch clock (too_slow)": {"registered_at": 5460},
        "row past the bench clock (too_slow)": {"state": "params_done", "registered_at": 3000, "param_done_at": 2760}}


def profile_env(root: Path, bin_dir: Path, manager: DevManager, label: str, extra: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("MANAGER_", "SUPERVISOR_", "STANDIN_", "CUZK_", "PROVER_", "FIL_PROOFS_", "MIN_RATE",
                                 "BENCH_", "IPFS_GATEWAY"))}
    return {**keep, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "MANAGER_URL": manager.url,
            "VAST_CONTAINERLABEL": label, "SUPERVISOR_STATE_DIR": str(root / "state"),
            "SUPERVISOR_LOG_DIR": str(root / "logs"), "FIL_PROOFS_PARAMETER_CACHE": str(root / "params"),
            "PROVER_MIN_MEMORY": "1GiB", "CUZK_BASELINE": "1GiB", "CUZK_PER_PARTITION": "512MiB",
            "PROVER_MIN_PARAM_DISK": "64MiB", "PROVER_REQUIRE_GPUS": "false", "BENCH_C1": str(bin_dir / "c1.json"),
            "STANDIN_SPEED": "0.1", **dict(zip(("CUZK_PORT", "CUZK_STATUS_PORT", "CURIO_PORT"),
                                               map(str, free_ports(3)), strict=True)), **extra}


def failure_time(state_dir: Path) -> float:
    snap = json.loads((state_dir / "status.json").read_text())
    failed = [v for v in snap["verdicts"] if not v["success"] and v["reason"] != "stopped"]
    return float(failed[-1]["ended_at"])


def seed_row(manager: DevManager, label: str, fields: dict[str, Any]) -> None:
    """The label's row as the manager's own decisions left it: registered (and moved) some time ago."""
    uuid = requests.post(manager.url + "/register", json={"label": label, "min_rate": 50}, timeout=5).json()["uuid"]
    now = time.time()
    body = {k: (now - v if k.endswith("_at") else v) for k, v in fields.items()}
    requests.post(manager.url + "/dev/row", json={"uuid": uuid, **body}, timeout=5).raise_for_status()


def one_run(scratch: Path, bin_dir: Path, manager: DevManager, name: str, extra: dict[str, str], n: int) -> float:
    label = f"C.{next(LABELS)}"  # the manager matches C.<digits> only
    root = scratch / f"{name.split()[0]}-{label}"  # a state_dir of its own (not given up by an earlier run)
    env = profile_env(root, bin_dir, manager, label, extra)
    if name in ROWS:
        seed_row(manager, label, ROWS[name])
    done = subprocess.run([sys.executable, "-m", "supervisor", "run"], env=env, cwd=REPO, capture_output=True,
                          timeout=120)
    if done.returncode == 0:
        raise SystemExit(f"{name}: the lifecycle did not fail:\n{done.stdout.decode()[-3000:]}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        inst = next((i for i in manager.state.snapshot()["instances"].values() if i["label"] == label), None)
        if inst is not None and inst["killed_at"] is not None:
            return float(inst["killed_at"]) - failure_time(root / "state")
        time.sleep(0.05)
    raise SystemExit(f"{name}: the dev-manager never showed {label} killed")


def kill_run(scratch: Path, bin_dir: Path, manager: DevManager, n: int) -> float:
    """The manager kills the instance in production (its UI's kill): seconds until the supervisor has exited."""
    root = scratch / f"kill-{n}"
    label = f"C.{next(LABELS)}"
    env = profile_env(root, bin_dir, manager, label, {"MANAGER_ROW_CHECK_S": str(KILL_ROW_CHECK_S)})
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            inst = next((i for i in manager.state.snapshot()["instances"].values() if i["label"] == label), None)
            if inst is not None and inst["state"] == "running":
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"kill: {label} never reached running")
        killed = time.monotonic()
        requests.post(manager.url + "/api/kill", json={"uuid": inst["uuid"]}, timeout=5).raise_for_status()
        status = proc.wait(timeout=KILL_ROW_CHECK_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if status != EXIT_KILLED:
        raise SystemExit(f"kill: exit status {status}, not {EXIT_KILLED}")
    return time.monotonic() - killed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="give-up-bench-") as tmp:
        scratch = Path(tmp)
        bin_dir = scratch / "bin"
        subprocess.run([sys.executable, "-m", "supervisor", "standins", "--bin-dir", str(bin_dir)], cwd=REPO,
                       check=True, capture_output=True)
        manager = dev_manager(port=0, quiet=True).start()
        gateway = ParamServer(20 * 1024 * 1024).start()
        try:
            print("| failure | runs | median | min | max |")
            print("|---|---|---|---|---|")
            for name, extra in FAILURES.items():
                extra = {"IPFS_GATEWAY": gateway.url, **extra}
                figures = [one_run(scratch, bin_dir, manager, name, extra, n) for n in range(args.runs)]
                ms = [f * 1000 for f in figures]
                print(f"| {name} | {len(ms)} | {statistics.median(ms):.0f} ms | {min(ms):.0f} ms | {max(ms):.0f} ms |",
                      flush=True)
            print(f"\n| the manager's kill in production → the supervisor exited {EXIT_KILLED} (row_check_s "
                  f"{KILL_ROW_CHECK_S:g}) | runs | median | min | max |\n|---|---|---|---|---|")
            kills = [kill_run(scratch, bin_dir, manager, n) for n in range(args.runs)]
            print(f"| UI kill | {len(kills)} | {statistics.median(kills):.1f} s | {min(kills):.1f} s | "
                  f"{max(kills):.1f} s |", flush=True)
        finally:
            gateway.close()
            manager.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
