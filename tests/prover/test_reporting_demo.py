"""The built-in demo (the prover's stand-ins, paramfetch → bench → curio) reporting to a real dev-manager: the fleet
protocol's calls in order, its logs, a bench the manager refuses or that fails. The core's reporting tests are
tests/test_reporting.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    PY,
    REPO,
    Console,
    Runner,
    api_calls,
    clean_env,
    free_port,
    kill_tree,
    only_instance,
    outbox_rows,
    pushed,
    wait_for,
)
from test_reporting import FAKE_RATE, fast_config

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.prover.demo import demo_config
from supervisor.prover.reasons import EXIT_BENCH_REJECTED

SPEED = "0.05"


STATES = ["registered", "params_done", "bench_done", "running"]


@dataclass
class DemoRun:
    status: int
    output: str
    snap: dict[str, Any]
    work: Path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    work = tmp_path_factory.mktemp("demo")
    mgr = dev_manager(quiet=True).start()
    config = work / "demo.toml"
    config.write_text(demo_config(work, speed=float(SPEED), run_seconds=1.0, manager_url=mgr.url))
    proc = subprocess.Popen([PY, "-m", "supervisor", "run", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=REPO, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        mgr.stop()
        pytest.fail(f"the demo lifecycle did not finish within 60s:\n{out}")
    snap = mgr.state.snapshot()
    mgr.stop()
    yield DemoRun(proc.returncode, out, snap, work)


def test_demo_reports_register_param_bench_running_in_order(demo_run: DemoRun) -> None:
    assert demo_run.status == 0, demo_run.output
    insts = list(demo_run.snap["instances"].values())
    assert len(insts) == 1
    inst = insts[0]
    assert inst["label"] == "C.demo"
    assert inst["history"] == STATES
    assert f"manager: registered: uuid {inst['uuid']}, runner_id {inst['runner_id']}" in demo_run.output
    # The rate is the bench summary's proofs/min × 60.
    bench_log = (demo_run.work / "logs" / "bench.log").read_text()
    per_min = float(re.search(r"throughput:\s+([0-9.]+) proofs/min", bench_log).group(1))  # type: ignore[union-attr]
    assert per_min > 0
    assert inst["rate"] > 0
    assert inst["rate"] == pytest.approx(per_min * 60, abs=1e-3)
    calls = [c for c in demo_run.snap["calls"] if c["path"] != "/api/log-push"]
    assert [c["path"] for c in calls] == ["/register", "/param-done", "/bench-done", "/running"]
    assert all(c["status"] == 200 for c in calls)
    # Pushes need the uuid: nothing came before /register.
    assert demo_run.snap["calls"][0]["path"] == "/register"


def test_demo_ships_logs_under_the_right_sources(demo_run: DemoRun) -> None:
    (_uuid, logs), = demo_run.snap["logs"].items()
    assert set(logs) == {"setup", "benchdaemon", "benchout", "cuzk", "curio"}
    pids = dict(re.findall(r"started (\S+): pid (\d+)", demo_run.output))
    # setup: the supervisor's own lines and paramfetch's output.
    assert "[supervisor] started paramfetch/paramfetch: pid" in logs["setup"]
    assert "parameter and key-fetching complete" in logs["setup"]
    assert "prover-supervisor exiting with status 0" in logs["setup"]
    # The bench phase's daemon and command, and production's daemon and command, each under its own tab.
    assert f"cuzk-daemon v0.1.0 starting (pid {pids['bench/cuzk-daemon']})" in logs["benchdaemon"]
    assert f"(pid {pids['curio/cuzk-daemon']})" not in logs["benchdaemon"]
    assert f"cuzk-daemon v0.1.0 starting (pid {pids['curio/cuzk-daemon']})" in logs["cuzk"]
    assert "=== Batch Summary ===" in logs["benchout"] and "[1/6] COMPLETED" in logs["benchout"]
    assert "Curio started" in logs["curio"]
    assert "[supervisor]" not in logs["curio"] + logs["benchout"] + logs["benchdaemon"] + logs["cuzk"]
    # Each child's pushed text is its log file's, line for line (ANSI aside), behind the child's label.
    curio_file = (demo_run.work / "logs" / "curio.log").read_text()
    assert logs["curio"] == "".join(f"[curio/curio] {line}\n" for line in curio_file.splitlines())


def test_demo_pushed_logs_have_no_ansi(demo_run: DemoRun) -> None:
    daemon_file = (demo_run.work / "logs" / "bench.cuzk-daemon.log").read_bytes()
    assert b"\x1b[" in daemon_file  # the stand-in daemon does colour its lines
    for source, text in next(iter(demo_run.snap["logs"].values())).items():
        assert "\x1b" not in text, source
        assert "[0m" not in text and "[2m" not in text, source
    plain = re.sub(rb"\x1b\[[0-9;]*m", b"", daemon_file).decode()
    shipped = next(iter(demo_run.snap["logs"].values()))["benchdaemon"]
    assert shipped == "".join(f"[bench/cuzk-daemon] {line}\n" for line in plain.splitlines())


def test_manager_down_for_the_whole_lifecycle_then_up(sup: Runner,
                                                      managers: Callable[..., DevManager]) -> None:
    port = free_port()  # nothing listens there until the manager "comes back"
    text = demo_config(sup.tmp, speed=float(SPEED), run_seconds=120.0, manager_url=f"http://127.0.0.1:{port}")
    assert "min_rate = 50\n" in text
    config = sup.tmp / "demo.toml"
    config.write_text(text.replace("min_rate = 50\n", "min_rate = 50\nbench_gate_s = 1\n"))
    proc = Console(sup, config)
    proc.wait_text("phase curio: service is up", 40)
    proc.wait_text("manager: running queued")  # logged once the call is in the outbox
    out = proc.text()
    assert "manager: register not delivered" in out
    assert "manager: no answer to bench-done after 1s; starting production anyway" in out
    pending = [kind for _, kind, state in outbox_rows(sup) if state == "pending" and kind != "log"]
    assert pending == ["register", "param-done", "bench-done", "running"]

    mgr = managers(port)
    wait_for(lambda: mgr.state.snapshot()["instances"]
             and only_instance(mgr)["history"] == STATES, timeout=45, interval=0.1)
    wait_for(lambda: {"setup", "benchdaemon", "benchout", "cuzk", "curio"} <= set(pushed(mgr)), 15, 0.1)
    wait_for(lambda: not [r for r in outbox_rows(sup) if r[2] == "pending"], 15, 0.1)
    logs = pushed(mgr)
    # What was printed while the manager was down got there too.
    assert "parameter and key-fetching complete" in logs["setup"]
    assert "=== Batch Summary ===" in logs["benchout"]
    assert "Curio started" in logs["curio"]
    calls = [c for c in api_calls(mgr) if c["path"] != "/api/log-push"]
    assert [c["path"] for c in calls] == ["/register", "/param-done", "/bench-done", "/running"], calls
    assert all(c["status"] == 200 for c in calls)
    assert api_calls(mgr)[0]["path"] == "/register"
    assert not [r for r in outbox_rows(sup) if r[2] == "failed"]

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(30) == 128 + signal.SIGTERM
    wait_for(lambda: "prover-supervisor stopping: received SIGTERM" in pushed(mgr)["setup"], 5, 0.05)
    assert only_instance(mgr)["history"] == STATES


def test_bench_rejected_by_the_manager_never_starts_production(sup: Runner,
                                                               managers: Callable[..., DevManager]) -> None:
    mgr = managers()
    text = demo_config(sup.tmp, speed=float(SPEED), run_seconds=30.0, manager_url=mgr.url)
    config = sup.tmp / "demo.toml"
    config.write_text(text.replace("min_rate = 50\n", "min_rate = 1e6\n"))  # (the most a config may ask)
    proc = Console(sup, config)
    status = proc.finish(60)
    out = proc.text()
    assert status == EXIT_BENCH_REJECTED, out
    assert "[curio/curio]" not in out and "started curio/curio" not in out
    assert "the manager rejected the benchmark" in out
    inst = only_instance(mgr)
    assert inst["state"] == "killed" and inst["history"] == ["registered", "params_done", "killed"]
    assert inst["min_rate"] == 1e6 and 0 < inst["rate"] < 1e6


def test_failed_bench_is_reported_at_once(sup: Runner, managers: Callable[..., DevManager]) -> None:
    mgr = managers()
    config = sup.tmp / "demo.toml"
    config.write_text(demo_config(sup.tmp, speed=float(SPEED), run_seconds=30.0, manager_url=mgr.url))
    proc = Console(sup, config, env={"STANDIN_BENCH_FAIL_PROOFS": "2"})
    status = proc.finish(60)
    out = proc.text()
    assert status != 0, out
    assert "reason=bench_failed" in out
    assert "started curio/curio" not in out
    inst = only_instance(mgr)
    assert inst["rate"] == 0
    assert inst["state"] == "killed" and inst["history"] == ["registered", "params_done", "killed"]
    setup = pushed(mgr)["setup"]
    assert "prover-supervisor: FAILED:" in setup and "reason=bench_failed" in setup
    # Reported through the outbox, not left to the manager's 45 min benchmark timeout.
    bench_done = api_calls(mgr, "/bench-done")
    assert len(bench_done) == 1 and bench_done[0]["status"] == 200


# ---------------------------------------------------------------- the bench verdict


def test_late_passed_false_stops_production(sup: Runner, managers: Callable[..., DevManager]) -> None:
    """The gate expired while the manager was down, production started; the late answer is passed: false (the
    prover's exit status: tests/test_reporting.py's quick lifecycle, moved here with it)."""
    port = free_port()
    config = fast_config(sup, f"http://127.0.0.1:{port}", manager="bench_gate_s = 0.5", min_rate=1000,
                         service="${SVC_S:-120}")
    proc = Console(sup, config)
    proc.wait_text("started service/service")
    assert "starting production anyway" in proc.text()
    mgr = managers(port)
    assert proc.finish(40) == EXIT_BENCH_REJECTED, proc.tail()
    out = proc.text()
    assert "the manager rejected the benchmark (rate 90/h < min_rate 1000)" in out
    inst = only_instance(mgr)
    assert inst["history"] == ["registered", "params_done", "killed"]
    assert inst["rate"] == FAKE_RATE and inst["min_rate"] == 1000
