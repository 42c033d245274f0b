"""``status`` and the fleet protocol (issue 18, items 8-9): the manager's ledger after a bench-done answered
``passed: false``, and the bench gate's hold counting down while the manager does not answer, with the built-in
prover profile, its stand-ins and a real dev-manager."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import requests
from helpers import PY, REPO, Runner, clean_env, kill_tree, wait_for

from supervisor.prover.reasons import EXIT_BENCH_REJECTED


def status(state_dir: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=30)
    return done.returncode, done.stdout + done.stderr


def snapshot(state_dir: Path) -> dict[str, Any]:
    _, out = status(state_dir, "--json")
    return json.loads(out)


def test_the_ledger_shows_the_bench_done_rate_and_its_passed_false(profile: Runner) -> None:
    run = profile.run(env=profile.env(MIN_RATE="1000000"), timeout=90)  # (the most a config may ask)
    assert run.returncode == EXIT_BENCH_REJECTED, run.output[-3000:]
    snap = snapshot(profile.state_dir)
    ledger = snap["manager"]["ledger"]
    (bench,) = [e for e in ledger if e["kind"] == "bench-done"]
    assert bench["state"] == "delivered" and bench["answer"] == {"passed": False}, bench
    assert 0 < bench["carried"]["rate"] < 1_000_000 and bench["attempts"] >= 1, bench
    assert bench["created"] <= bench["finished"], bench
    assert [e["kind"] for e in ledger][:2] == ["register", "param-done"], ledger
    assert all(e["kind"] != "log" for e in ledger), "log pushes crowd the calls out"
    rc, text = status(profile.state_dir)
    assert rc == 3, text
    assert re.search(r"^    bench-done\s+delivered \d+s ago, \d+ attempt\(s\), "
                     r"queued with rate=[0-9.]+ -> passed: false$", text, re.M), text
    assert text.splitlines()[0] == f"stopped: {snap['lifecycle']['why']}; exit {EXIT_BENCH_REJECTED}", text


def test_the_bench_gate_counts_down_while_the_manager_does_not_answer(profile: Runner) -> None:
    # Every bench-done is answered 503 until the test ends: the gate holds production for bench_gate_s (300 s).
    requests.post(profile.manager.url + "/dev/faults", json={"path": "/bench-done", "status": 503, "count": -1},
                  timeout=10).raise_for_status()
    proc, _ = profile.start_to_file(env=profile.env(), name="gate")
    try:
        def held() -> dict[str, Any] | None:
            with contextlib.suppress(ValueError, StopIteration):
                snap = snapshot(profile.state_dir)
                return next(p for p in snap.get("phases", []) if p.get("hold") and "hold" in p.get("timers", {}))
            return None

        first = wait_for(held, 90, 0.3)
        assert isinstance(first, dict)
        time.sleep(1.2)
        second = held()
        assert second is not None and second["name"] == first["name"]
        assert 0 < second["timers"]["hold"]["left_s"] < first["timers"]["hold"]["left_s"] <= 300, (first, second)
        rc, text = status(profile.state_dir)
        assert rc == 0, text
        assert re.match(rf"waiting: {first['name']} done, held: .+ \(\d+m\d\ds left\)$", text.splitlines()[0]), text
        assert re.search(r"^      timers: held \d+m\d\ds more at most$", text, re.M), text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)
