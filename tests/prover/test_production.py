"""Proofs counted in production (prover/production.py): the stand-in cuzk-daemon's real /status counters and
the stand-in curio's /debug/metrics, read while curio runs; the summary line at the manager and the counters in
``status --json``; proofs that keep failing with none completing fail production with ``proofs_failing``, its
restart policy applies, and the instance is given up at the dev-manager."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, REPO, Console, Runner, free_port, sh, toml_str, wait_for
from profilekit import standin_env

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.prover.production import ProofWindow, Reading, parse_curio, parse_cuzk, summary_line

# ---------------------------------------------------------------- pure


def reading(at: float, completed: int, failed: int) -> Reading:
    return Reading(at, completed, failed, source="cuzk")


def test_failures_with_none_completed_within_the_window_are_failing() -> None:
    window = ProofWindow(60.0)
    for at, done, failed in ((0, 10, 0), (10, 10, 1), (20, 10, 2)):
        window.add(reading(at, done, failed))
    assert window.in_window() == (0, 2) and window.failing(2) and not window.failing(3)
    window.add(reading(30, 11, 3))  # one completed: not failing, whatever fails beside it
    assert not window.failing(2)
    window.add(reading(100, 11, 5))  # the window moved past the completion
    assert window.in_window() == (0, 2) and window.failing(2)
    assert window.since_up() == (1, 5, 100)


def test_counters_that_go_down_start_the_count_again() -> None:
    window = ProofWindow(60.0)
    window.add(reading(0, 5, 4))
    window.add(reading(10, 0, 0))  # the daemon restarted
    window.add(reading(20, 0, 1))
    assert window.in_window() == (0, 1) and window.since_up() == (0, 1, 10)


def test_the_real_shapes_are_read() -> None:
    body = {"counters": {"total_completed": 7, "total_failed": 2, "completed_by_kind": {"porep": 7},
                         "failed_by_kind": {"porep": 2}, "queue_depth": 0},
            "memory": {"total_bytes": 100, "used_bytes": 40, "available_bytes": 60}}
    assert parse_cuzk(body) == (7, 2, (40, 100))
    assert parse_cuzk({"counters": {"proofs_completed": 3}}) is None  # the old stand-in's shape is no answer
    text = ('# TYPE curio_harmonytask_tasks_completed counter\n'
            'curio_harmonytask_tasks_completed{task_name="PoRep"} 4\n'
            'curio_harmonytask_tasks_completed{task_name="SDRTrees"} 9\n'
            'curio_harmonytask_tasks_failed{task_name="WdPost"} 1\n')
    assert parse_curio(text) == (4, 1)
    assert parse_curio("something_else 1\n") is None
    # Other labels around task_name, in any order; one named otherwise is not a task's.
    assert parse_curio('curio_harmonytask_tasks_completed{a="1",task_name="PoRep",b="x"} 3\n'
                       'curio_harmonytask_tasks_completed{xtask_name="PoRep"} 5\n') == (3, 0)
    window = ProofWindow(300.0)
    window.add(reading(0, 0, 0))
    window.add(reading(360, 10, 1))
    assert summary_line(window, {"memory_used": 3 << 30, "memory_limit": 4 << 30, "gpu_utilization": [97]}, None) == \
        ("production: proofs 10 completed / 1 failed in the last 5 min, 10 / 1 since up (cuzk /status); 100.0/h; "
         "memory 3.0GiB of 4.0GiB; GPU 97%")


# ---------------------------------------------------------------- a real supervisor with the stand-ins


@pytest.fixture(scope="module")
def devmgr() -> Iterator[DevManager]:
    mgr = dev_manager(quiet=True).start()
    yield mgr
    mgr.stop()


def production_config(sup: Runner, mgr: DevManager, label: str, *, restart_burst: int = 5,
                      curio_unresponsive_s: float = 600, restart: str = "on-failure",
                      restart_window_s: float = 300) -> Path:
    cuzk, status, curio = free_port(), free_port(), free_port()
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1

        [cuzk]
        listen = "http://127.0.0.1:{cuzk}"
        status_listen = "127.0.0.1:{status}"
        baseline = "1GiB"
        per_partition = "512MiB"

        [production]
        watch_s = 0.3
        proof_failures = 2
        proof_failure_window_s = 30
        curio_metrics = "http://127.0.0.1:{curio}/debug/metrics"
        curio_unresponsive_s = {curio_unresponsive_s}

        [[phases]]
        name = "fetch"
        command = {sh("true")}
        report = "param-done"

        [[phases]]
        name = "curio"
        kind = "service"
        prepare = "cuzk-config"
        restart = "{restart}"
        restart_burst = {restart_burst}
        restart_window_s = {restart_window_s}
        backoff_s = 0.1
        command = [{toml_str(PY)}, "-m", "supervisor.prover.standins.curio", "run", "--listen",
                   "127.0.0.1:{curio}", "--nosync"]
        ready = "tcp://127.0.0.1:{curio}"
        report = "running"

          [[phases.daemons]]
          name = "cuzk-daemon"
          command = [{toml_str(PY)}, "-m", "supervisor.prover.standins.cuzk_daemon", "-c",
                     {toml_str(str(sup.state_dir / "cuzk.toml"))}]
          ready = "cuzk"
          stop_signal = "SIGINT"
        """, stop_grace_s=2)


def instance_of(mgr: DevManager, label: str) -> dict[str, Any]:
    [inst] = [i for i in mgr.state.snapshot()["instances"].values() if i["label"] == label]
    return inst


def status_json(sup: Runner) -> dict[str, Any]:
    out = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                         capture_output=True, text=True, cwd=REPO, timeout=20)
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}


def curio_phase(sup: Runner) -> dict[str, Any]:
    snap = status_json(sup)
    return next((p for p in snap.get("phases", []) if p["name"] == "curio"), {})


def test_proofs_completing_are_counted_in_status_and_summed_up_at_the_manager(
        sup: Runner, devmgr: DevManager) -> None:
    label = f"C.production-ok-{os.getpid()}"
    env = standin_env(STANDIN_TASK_S="0.2", STANDIN_PROOF_S="0.1")
    console = Console(sup, production_config(sup, devmgr, label), env=env)
    console.wait_text("phase curio: service is up", timeout=40)
    wait_for(lambda: (curio_phase(sup).get("proofs_completed") or 0) >= 2, timeout=30, interval=0.3)
    phase = curio_phase(sup)
    assert phase["proofs_failed"] == 0 and phase["production"]["watch_s"] == 0.3, phase
    watch = status_json(sup)["watches"]["proofs watch"]  # the core's view of the plugin's watch (watchstate.py)
    assert watch["state"] == "reading" and watch["readings"] >= 2 and watch["window_s"] == 30, watch
    assert phase["summary"].startswith("production: proofs "), phase
    console.wait_text("production: proofs ", timeout=10)

    def summary_at_manager() -> bool:
        logs = devmgr.state.snapshot()["logs"].get(instance_of(devmgr, label).get("uuid"), {})
        return "prover-supervisor: production: proofs " in logs.get("setup", "")

    wait_for(summary_at_manager, timeout=15, interval=0.2)
    text = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=20).stdout
    assert "      production: proofs " in text, text
    assert "proofs watch reading" in text, text
    os.kill(console.pid, signal.SIGTERM)
    console.finish(timeout=40)
    assert "reason=proofs_failing" not in console.text()
    # Each summary once in the setup tab, as the durable push: its logged copy is not shipped too (Unshipped).
    setup = devmgr.state.snapshot()["logs"][instance_of(devmgr, label)["uuid"]]["setup"]
    assert setup.count("production: proofs ") == setup.count("prover-supervisor: production: proofs ") >= 1, setup


def test_proofs_that_keep_failing_fail_production_and_the_instance_is_given_up(
        sup: Runner, devmgr: DevManager, tmp_path: Path) -> None:
    label = f"C.production-failing-{os.getpid()}"
    fail = tmp_path / "fail-proofs"
    env = standin_env(STANDIN_TASK_S="0.2", STANDIN_PROOF_S="0.1", STANDIN_FAIL_PROOFS=str(fail))
    console = Console(sup, production_config(sup, devmgr, label, restart_burst=1), env=env)
    console.wait_text("phase curio: service is up", timeout=40)
    fail.touch()  # from now on every proof fails
    status = console.finish(timeout=60)
    out = console.text()
    assert status != 0, out
    failing = [line for line in out.splitlines() if "reason=proofs_failing" in line and "FAILED:" in line]
    assert failing, out
    # On a GPU error, as the real daemon's /status counts it: in no counter of cuzk's. curio's PoRep failures are
    # what is judged, and shown: the summary said "0 failed", status proofs_failed 0, while every proof failed.
    assert "PoRep proof(s) failed and none completed within 30s (proof_failures=2; curio counters)" in failing[0]
    phase = curio_phase(sup)
    assert phase["proofs_failed"] >= 2 and phase["production"]["failed_in_window"] >= 2, phase
    assert phase["production"]["counted_by"] == {"completed": "cuzk", "failed": "curio"}, phase
    assert "failed: curio's proving tasks)" in phase["summary"], phase
    assert "attempt 2" in out  # the restart policy applied before production failed for good
    assert "phase curio: stopping → failed (proofs_failing; restarted 1 times within 300s (restart_burst)" in out
    assert "giving the instance up (phase curio failed)" in out, out
    wait_for(lambda: instance_of(devmgr, label)["history"][-1] == "killed", timeout=10)
    assert instance_of(devmgr, label)["history"] == ["registered", "params_done", "running", "killed"]


def test_proofs_failing_restart_burst_times_in_a_row_gives_the_instance_up_however_far_apart(
        sup: Runner, devmgr: DevManager) -> None:
    """The profile's curio (restart = "always", 5 in 300 s) and its proofs watch (every 60 s): proofs_failing ends an
    attempt 120 s in at the earliest, so 5 restarts never fell within 300 s, and a curio whose every proof failed was
    restarted for ever, billed, its row running. Scaled down: each attempt outlives the 1 s window."""
    label = f"C.production-failing-always-{os.getpid()}"
    env = standin_env(STANDIN_TASK_S="0.2", STANDIN_PROOF_S="0.1", STANDIN_FAIL_PROOFS="1")
    config = production_config(sup, devmgr, label, restart_burst=2, restart="always", restart_window_s=1)
    console = Console(sup, config, env=env)
    status = console.finish(timeout=90)
    out = console.text()
    assert status != 0, out
    failing = [line for line in out.splitlines() if "child=curio " in line and "FAILED:" in line]
    assert [re.search(r" reason=(\w+) .* attempt=(\d)", line).groups() for line in failing] == [  # type: ignore[union-attr]
        ("proofs_failing", "1"), ("proofs_failing", "2"), ("proofs_failing", "3")], failing
    assert "restarted 2 times within" not in out, "the window tripped: the attempts were not far enough apart"
    assert ("phase curio: stopping → failed (proofs_failing; restarted 2 times in a row, each attempt ended by a "
            "watch's finding (restart_burst): giving up)") in out, out
    assert "giving the instance up (phase curio failed)" in out, out
    wait_for(lambda: instance_of(devmgr, label)["history"][-1] == "killed", timeout=10)


def test_a_hung_curio_fails_production_and_the_instance_is_given_up(sup: Runner, devmgr: DevManager) -> None:
    """curio hung (its port still accepts, its metrics never answer) ran for ever as "running", the manager's row
    too: its metrics were said blind once and nothing more. Past curio_unresponsive_s the attempt fails, the restart
    policy applies, and a curio that hangs again is given up."""
    label = f"C.production-hung-{os.getpid()}"
    env = standin_env(STANDIN_TASK_S="0.2", STANDIN_FAIL_CURIO="hang")
    console = Console(sup, production_config(sup, devmgr, label, restart_burst=1, curio_unresponsive_s=2), env=env)
    status = console.finish(timeout=90)
    out = console.text()
    assert status == 1, out
    failed = [line for line in out.splitlines() if "reason=curio_unresponsive" in line and "FAILED:" in line]
    assert failed and "curio's metrics gave no reading for " in failed[0], out
    assert "(curio_unresponsive_s=2): curio /debug/metrics: timed out" in failed[0], failed[0]
    assert "attempt 2" in out  # the restart policy applied before production failed for good
    assert "phase curio: stopping → failed (curio_unresponsive; restarted 1 times within 300s (restart_burst)" in out
    assert "giving the instance up (phase curio failed)" in out, out
    wait_for(lambda: instance_of(devmgr, label)["history"][-1] == "killed", timeout=10)


def test_the_watch_reads_curio_alone_without_a_cuzk_table(sup: Runner) -> None:
    """[production] without [cuzk]: curio's metrics are enough to count proofs (cuzk's /status is one source of
    two). The watch was attached only with a [cuzk], so this [production] was accepted by check and ignored by run:
    curio's proofs failed unseen until it ended by itself."""
    curio, dead = free_port(), free_port()  # (no cuzk-daemon listens on ``dead``: every PoRep curio sends fails)
    config = sup.write(f"""
        [production]
        watch_s = 0.3
        proof_failures = 2
        proof_failure_window_s = 30
        curio_metrics = "http://127.0.0.1:{curio}/debug/metrics"

        [[phases]]
        name = "curio"
        kind = "service"
        restart = "no"
        command = [{toml_str(PY)}, "-m", "supervisor.prover.standins.curio", "run", "--listen",
                   "127.0.0.1:{curio}", "--nosync"]
        env = {{ CURIO_CUZK_ADDRESS = "127.0.0.1:{dead}" }}
        ready = "tcp://127.0.0.1:{curio}"
        report = "running"
        """)
    result = sup.run(config, env=standin_env(STANDIN_TASK_S="0.2", STANDIN_RUN_SECONDS="30"), timeout=60)
    assert f"production watch: every 0.3s on phase curio (no cuzk status; curio http://127.0.0.1:{curio}/debug/" \
           "metrics)" in result.output, result.output
    failing = [line for line in result.output.splitlines() if "reason=proofs_failing" in line and "FAILED:" in line]
    assert failing and "(proof_failures=2; curio counters)" in failing[0], result.output
    # Judged task by task: the WinPost of each epoch, not won, completes whatever cuzk does (as the real curio's),
    # and summed with it the PoRep that always failed read as proofs completing.
    assert re.search(r"detail=\"\d+ PoRep proof\(s\) failed and none completed", failing[0]), failing[0]
    assert result.returncode == 1, result.output
    # Its completed figure (and the rate) is of proofs: a WinPost not won is none. It read one a task interval.
    phase = curio_phase(sup)
    assert phase["proofs_completed"] == 0 and phase["proofs_failed"] >= 2, phase
    assert phase["production"]["counted_by"] == {"completed": "curio", "failed": "curio"}, phase


def test_a_metrics_line_that_would_backtrack_is_read_in_passing() -> None:
    """Many task_name="…" and no closing brace: one pattern for the labels and the name backtracked quadratically
    (a 522 KiB line took 17 s, holding the GIL: the loop stood still). Bounded: a minute of it fails here."""
    import threading

    hostile = "curio_harmonytask_tasks_failed{" + 'task_name="PoRep",' * 60_000
    page = hostile + "\ncurio_harmonytask_tasks_completed{task_name=\"PoRep\"} 2\n"
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(parse_curio(page)), daemon=True)
    reader.start()
    reader.join(20)  # (an upper bound against hanging, never a measure)
    assert got == [(2, 0)], "the page was not read within 20 s"
