#!/usr/bin/env python3
"""Failure → the manager shows the instance killed: how long does the give-up take?

    python bench/give_up.py            # 5 runs of each failure, prints the table
    python bench/give_up.py --runs 10

Runs the built-in prover profile (no config) with the stand-ins on PATH against an
in-process dev-manager, once per run, for five failures before production: the
machine is unfit (fitness, insufficient_memory), the parameter fetch crashes, the
warm-up proof crashes, a link too slow for the manager's fetch clock (too_slow: 60 MiB
at 1 MiB/s from a local gateway, 30 s deadline, 5 s window; the real aria2c where
installed), a bench that can no longer pass min_rate (too_slow: 4 proofs of 3 s one
at a time against min_rate 3600/h). The figure is the dev-manager's ``killed_at`` (when it
handled the give-up, ``bench-done`` with rate 0) minus the failure verdict's
``ended_at`` (from ``state_dir/status.json``): both are this machine's clock.
It includes the outbox's fsyncs and the HTTP calls queued before the give-up
(registration, the verdict's log push, the "stopping" line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.devmanager import DevManager  # noqa: E402
from supervisor.prover.demo import free_port  # noqa: E402
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
}


def profile_env(root: Path, bin_dir: Path, manager: DevManager, label: str, extra: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("MANAGER_", "SUPERVISOR_", "STANDIN_", "CUZK_", "PROVER_", "FIL_PROOFS_", "MIN_RATE",
                                 "BENCH_", "IPFS_GATEWAY"))}
    return {**keep, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "MANAGER_URL": manager.url,
            "VAST_CONTAINERLABEL": label, "SUPERVISOR_STATE_DIR": str(root / "state"),
            "SUPERVISOR_LOG_DIR": str(root / "logs"), "FIL_PROOFS_PARAMETER_CACHE": str(root / "params"),
            "PROVER_MIN_MEMORY": "1GiB", "CUZK_BASELINE": "1GiB", "CUZK_PER_PARTITION": "512MiB",
            "PROVER_MIN_PARAM_DISK": "64MiB", "PROVER_REQUIRE_GPUS": "false", "BENCH_C1": str(bin_dir / "c1.json"),
            "STANDIN_SPEED": "0.1", "CUZK_PORT": str(free_port()), "CUZK_STATUS_PORT": str(free_port()),
            "CURIO_PORT": str(free_port()), **extra}


def failure_time(state_dir: Path) -> float:
    snap = json.loads((state_dir / "status.json").read_text())
    failed = [v for v in snap["verdicts"] if not v["success"] and v["reason"] != "stopped"]
    return float(failed[-1]["ended_at"])


def one_run(scratch: Path, bin_dir: Path, manager: DevManager, name: str, extra: dict[str, str], n: int) -> float:
    root = scratch / f"{name.split()[0]}-{n}"
    label = f"C.giveup-{name.split()[0]}-{n}"
    env = profile_env(root, bin_dir, manager, label, extra)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="give-up-bench-") as tmp:
        scratch = Path(tmp)
        bin_dir = scratch / "bin"
        subprocess.run([sys.executable, "-m", "supervisor", "standins", "--bin-dir", str(bin_dir)], cwd=REPO,
                       check=True, capture_output=True)
        manager = DevManager(port=0, quiet=True).start()
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
        finally:
            gateway.close()
            manager.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
