"""A SIGKILL mid-fetch, mid-bench and in production on the built-in demo, then the resume: nothing left behind, no
step run twice. The core's resume tests are tests/test_resume.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from helpers import Console, Runner, free_port, outbox_rows, wait_for

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.prover.demo import demo_config

SPEED = 0.05


STATES = ["registered", "params_done", "bench_done", "running"]


def demo(sup: Runner, manager_url: str) -> Path:
    """The demo lifecycle with resume on: the fetch by its outputs, the bench by this machine."""
    text = demo_config(sup.tmp, speed=SPEED, run_seconds=120.0, manager_url=manager_url)
    for report, resume in (("param-done", "outputs"), ("bench-done", "machine")):
        assert f'report = "{report}"\n' in text
        text = text.replace(f'report = "{report}"\n', f'report = "{report}"\nresume = "{resume}"\n')
    config = sup.tmp / "demo.toml"
    config.write_text(text)
    return config


def persisted(sup: Runner) -> dict[str, Any]:
    return json.loads((sup.state_dir / "status.json").read_text())


def phase_state(sup: Runner, name: str) -> str | None:
    try:
        return next(p["state"] for p in persisted(sup)["phases"] if p["name"] == name)
    except (OSError, ValueError, StopIteration):
        return None


def calls(mgr: DevManager, path: str) -> list[dict[str, Any]]:
    return [c for c in mgr.state.snapshot()["calls"] if c["path"] == path and c["status"] == 200]


def instances(mgr: DevManager) -> list[dict[str, Any]]:
    return list(mgr.state.snapshot()["instances"].values())


def history(mgr: DevManager) -> list[str]:
    insts = instances(mgr)
    return insts[0]["history"] if len(insts) == 1 else []


def params(sup: Runner) -> dict[str, int]:
    root = sup.tmp / "params"
    return {p.name: p.stat().st_size for p in root.glob("*") if p.is_file() and p.suffix != ".lock"} \
        if root.is_dir() else {}


def hold(procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGSTOP each: a stopped process cannot end on its own, and SIGKILL still ends it. Returns those held (one
    may have ended before its SIGSTOP came)."""
    held = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.suspend()
            if proc.status() != psutil.STATUS_ZOMBIE:
                held.append(proc)
    return held


def all_dead(procs: list[psutil.Process]) -> bool:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def test_sigkill_mid_fetch_mid_bench_in_production_then_resume(
        sup: Runner, orphans: Callable[[int], list[psutil.Process]]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = demo(sup, url)
    mgr: DevManager | None = None
    try:
        # ---- run 1: the manager is down; SIGKILL while the fetch runs
        run1 = Console(sup, config, "run1", env={"STANDIN_PARAM_CHUNK_S": "0.25"})
        wait_for(lambda: params(sup) and phase_state(sup, "paramfetch") == "running", 20, 0.05)
        run1.sigkill()
        partial = params(sup)
        # mid-fetch: curio fetches every file at once and aria2c preallocates each, so a size says nothing; a
        # control file beside one says it is not complete
        assert any(name.endswith(".aria2") for name in partial), partial
        assert [kind for _, kind, state in outbox_rows(sup, logs=False) if state == "pending"] == ["register"]
        left1 = orphans(run1.pid)  # its fetch lives on: nothing above a SIGKILLed supervisor stops it
        # ... until its next line meets the pipe of the dead console (a broken pipe ends it, as it ends the real
        # curio); held stopped, it can only be ended by run 2, which must then say so
        left1 = hold(left1)

        # ---- run 2: the manager is up; the fetch runs again and completes; SIGKILL while the bench runs
        mgr = dev_manager(port=port, quiet=True).start()
        run2 = Console(sup, config, "run2", env={"STANDIN_PROOF_S": "1.0"})
        run2.wait_text("[bench/bench]", 30)
        wait_for(lambda: history(mgr) == ["registered", "params_done"], 10, 0.05)
        assert phase_state(sup, "bench") == "running"
        out = run2.text()
        assert "phase paramfetch: pending → starting" in out and "resumed" not in out, out
        assert "parameter and key-fetching complete" in out
        assert all_dead(left1), f"run 1's fetch still runs beside run 2: {left1}"
        assert not left1 or "left by a supervisor that died without stopping them" in out, out
        assert len(instances(mgr)) == 1 and len(calls(mgr, "/register")) == 1
        assert outbox_rows(sup, logs=False)[0][1:] == ("register", "delivered")  # queued while the manager was down
        uuid = instances(mgr)[0]["uuid"]
        run2.sigkill()
        left2 = orphans(run2.pid)

        # ---- run 3: the fetch is not repeated (param-done sent again), the bench runs again; SIGKILL in production
        run3 = Console(sup, config, "run3")
        run3.wait_text("phase curio: service is up", 30)
        wait_for(lambda: history(mgr)[-1:] == ["running"], 10, 0.05)
        out = run3.text()
        assert re.search(r"phase paramfetch: pending → done \(resumed: its 3 output file\(s\) in \S+ are all "
                         r"still there\)", out), out
        assert "Fetching" not in out
        assert "phase bench: pending → starting" in out and "phase bench: running → stopping" in out, out
        assert "=== Batch Summary ===" in out
        assert f"manager: reusing uuid {uuid}" in out
        wait_for(lambda: len(calls(mgr, "/param-done")) >= 2, 5, 0.05)  # sent again: idempotent
        assert history(mgr) == STATES, history(mgr)
        assert all_dead(left2), f"run 2's daemon or bench still runs beside run 3: {left2}"
        run3.sigkill()
        left3 = hold(orphans(run3.pid))  # curio and its cuzk-daemon, holding their ports (held as run 1's are)

        # ---- run 4: everything resumes; the service starts again (its ports are free again); one instance
        run4 = Console(sup, config, "run4")
        run4.wait_text("phase curio: service is up", 30)
        out = run4.text()
        assert "phase paramfetch: pending → done (resumed: its 3 output file(s)" in out, out
        assert re.search(r"phase bench: pending → done \(resumed: done \d+s before this start "
                         r"\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\) on this same machine", out), out
        assert "FAILED" not in out and "Traceback" not in out, out
        assert all_dead(left3), f"run 3's curio or daemon still runs beside run 4: {left3}"
        assert not left3 or "left by a supervisor that died without stopping them" in out, out
        run4.wait_text("manager: running queued")
        wait_for(lambda: outbox_rows(sup, logs=False)[-1][1:] == ("running", "delivered"), 10, 0.05)
        assert len(instances(mgr)) == 1 and instances(mgr)[0]["uuid"] == uuid
        assert len(calls(mgr, "/register")) == 1
        assert instances(mgr)[0]["state"] == "running"
        assert history(mgr).count("params_done") == 1
        # One output file gone: the next start fetches (only) it again.
        fetched = {name: size for name, size in params(sup).items() if name.endswith((".params", ".vk"))}
        assert len(fetched) == 3 and set(fetched.values()) == {2097152}, params(sup)
        gone = sorted(fetched)[0]
        (sup.tmp / "params" / gone).unlink()
        os.kill(run4.pid, signal.SIGTERM)
        assert run4.finish() == 128 + signal.SIGTERM

        # ---- run 5
        run5 = Console(sup, config, "run5")
        run5.wait_text("phase curio: service is up", 30)
        out = run5.text()
        assert "phase paramfetch: pending → starting" in out and "phase paramfetch: running → stopping" in out
        fetched = re.findall(r"Fetching \S+/params/(\S+) from", out)
        assert fetched == [gone], out
        assert params(sup)[gone] == 2097152
        assert re.search(r"phase bench: pending → done \(resumed: done \d+s before this start", out), out
        os.kill(run5.pid, signal.SIGTERM)
        assert run5.finish() == 128 + signal.SIGTERM
        assert len(instances(mgr)) == 1 and len(calls(mgr, "/register")) == 1
        assert not [row for row in outbox_rows(sup, logs=False) if row[2] != "delivered"], outbox_rows(sup, logs=False)
        # Nothing repeated in effect: the manager went through each state once. (A call delivered twice in a
        # row, at least once, is fine; a resumed bench's bench-done moving a running instance back is not.)
        changes = [s for i, s in enumerate(history(mgr)) if i == 0 or history(mgr)[i - 1] != s]
        assert changes == STATES, history(mgr)
    finally:
        if mgr is not None:
            mgr.stop()
