"""``prover-supervisor status`` from another process, against a real running supervisor.

One supervisor is walked through each kind of phase (a oneshot that failed once and runs again, a daemon being
waited for, a service, a hung child) and asked at each point, in text and in JSON, by a separate process; then
it is stopped and asked again (the persisted state). Also: the manager line with a dev-manager, no state at all,
file modes, and secrets.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, REPO, Console, SupervisorRunner, clean_env, kill_tree, sh, toml_list, toml_str, wait_for

from supervisor.devmanager import DevManager
from supervisor.status import query

SECRET = "abcd-secret-9999"
NUMBER = (int, float)


def status(state_dir: Path, *args: str) -> tuple[int, str, float]:
    """Run ``prover-supervisor status`` as a separate process: (exit status, stdout + stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=20)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def status_json(state_dir: Path) -> tuple[int, dict[str, Any], str]:
    rc, out, _ = status(state_dir, "--json")
    try:
        return rc, json.loads(out), out
    except ValueError:
        pytest.fail(f"status --json did not print JSON (exit {rc}):\n{out}")


def check_schema(snap: dict[str, Any]) -> None:
    """The JSON snapshot's required keys and their types."""
    top = {"version": int, "pid": int, "role": str, "started_at": NUMBER, "lifecycle": dict, "phases": list,
           "children": list, "gpus": dict, "memory": dict, "manager": dict, "verdicts": list, "live": bool}
    for key, kind in top.items():
        assert key in snap, f"status --json lacks {key!r}: {sorted(snap)}"
        assert isinstance(snap[key], kind) and (kind is bool or not isinstance(snap[key], bool)), (key, snap[key])
    assert snap["version"] >= 1
    life = snap["lifecycle"]
    assert isinstance(life["state"], str)
    assert "current" in life and (life["current"] is None or isinstance(life["current"], str))
    for ph in snap["phases"]:
        assert isinstance(ph["name"], str) and ph["kind"] in ("oneshot", "service"), ph
        assert isinstance(ph["state"], str) and isinstance(ph["since"], NUMBER), ph
        assert isinstance(ph["why"], str) and isinstance(ph["attempt"], int), ph
    for ch in snap["children"]:
        assert isinstance(ch["label"], str) and isinstance(ch["pid"], int) and isinstance(ch["state"], str), ch
        assert isinstance(ch["started_at"], NUMBER), ch
        usage = ch["usage"]
        assert isinstance(usage["processes"], int) and usage["processes"] >= 1, ch
        assert isinstance(usage["cpu_s"], NUMBER) and isinstance(usage["rss"], int) and usage["rss"] > 0, ch
        assert isinstance(ch["last_lines"], list) and all(isinstance(line, str) for line in ch["last_lines"]), ch
    gpus = snap["gpus"]
    assert isinstance(gpus["available"], bool) and isinstance(gpus["why"], str) and isinstance(gpus["samples"], list)
    assert isinstance(snap["memory"]["mode"], str)
    assert isinstance(snap["manager"]["enabled"], bool)
    for verdict in snap["verdicts"]:
        assert isinstance(verdict["line"], str) and isinstance(verdict["reason"], str), verdict
        assert isinstance(verdict["phase"], str) and isinstance(verdict["success"], bool), verdict
        assert isinstance(verdict["status"], int), verdict


def phase(snap: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in snap["phases"] if p["name"] == name)


def child(snap: dict[str, Any], label: str) -> dict[str, Any]:
    found = [c for c in snap["children"] if c["label"] == label]
    assert found, f"no child {label!r} in {[c['label'] for c in snap['children']]}"
    return found[0]


def child_line(text: str, label: str) -> str:
    lines = [line for line in text.splitlines() if line.strip().startswith(label + " ")]
    assert lines, f"no line for child {label!r} in:\n{text}"
    return lines[0]


CHILD_RE = r"pid {pid}\s+{state}\s+up \d+s, \d+ proc\(s\), cpu [0-9.]+s, rss [0-9.]+ ?[KMG]i?B"


def check_common_text(text: str, pid: int) -> None:
    """What every live status text says: who, as what role, GPUs, memory, manager."""
    assert text.startswith(f"prover-supervisor pid {pid} as subreaper, up "), text
    assert re.search(r"^gpus: no GPU", text, re.M), text
    assert re.search(r"^memory: (per-phase|shared|unavailable); \S", text, re.M), text
    assert "manager: reporting off" in text, text
    assert SECRET not in text


def walkthrough_config(sup: SupervisorRunner) -> Path:
    t = sup.tmp
    return sup.write(f"""
        [[phases]]
        name = "prep"
        retries = 1
        backoff_s = 0.1
        env = {{ X_TOKEN = "{SECRET}" }}
        command = {sh(f"echo token is $$X_TOKEN; echo prep working; "
                      f"if [ ! -e {t}/failed-once ]; then touch {t}/failed-once; exit 7; fi; "
                      f"while [ ! -e {t}/gate1 ]; do sleep 0.05; done; echo prep done")}

        [[phases]]
        name = "svc"
        kind = "service"
        restart = "no"
        command = {sh("echo serving 1; echo serving 2; echo serving 3; exec sleep 60")}
          [[phases.daemons]]
          name = "helper"
          command = {sh("echo helper started; exec sleep 60")}
          ready = {toml_str(str(t / "helper-ready"))}
          ready_timeout_s = 60
        """, stop_grace_s=1)


def test_status_through_every_kind_of_phase_then_after_exit(sup: SupervisorRunner) -> None:
    config = walkthrough_config(sup)
    run = Console(sup, config)
    state = sup.state_dir

    # ---- a oneshot runs (its second attempt; the first exited 7)
    run.wait_text("[prep/prep] prep working")
    wait_for(lambda: "attempt=1" in run.text() and (sup.tmp / "failed-once").exists(), 10)
    run.wait_text("phase prep: starting → running (prep/prep pid")
    wait_for(lambda: run.text().count("[prep/prep] prep working") >= 2, 10)
    sock = state / "status.sock"
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state / "status.json").st_mode) == 0o600
    rc, text, took = status(state)
    assert rc == 0, text
    assert took < 5, f"status took {took:.1f}s"
    check_common_text(text, run.pid)
    assert "lifecycle: running" in text
    assert "current phase: prep" in text
    assert re.search(r"^  prep\s+running\s+since \d+s ago, attempt 2: prep/prep pid \d+", text, re.M), text
    assert re.search(r"^  svc\s+pending\s+since \d+s ago, attempt 0: not started", text, re.M), text
    rc, snap, raw = status_json(state)
    assert rc == 0
    check_schema(snap)
    assert snap["live"] is True and snap["pid"] == run.pid and snap["role"] == "subreaper"
    assert snap["lifecycle"] == {**snap["lifecycle"], "state": "running", "current": "prep"}
    prep = child(snap, "prep/prep")
    assert re.search(CHILD_RE.format(pid=prep["pid"], state="running"), child_line(text, "prep/prep")), text
    assert "token is ***" in prep["last_lines"] and "prep working" in prep["last_lines"], prep
    assert "      | token is ***" in text
    failed = [v for v in snap["verdicts"] if not v["success"]]
    assert len(failed) == 1 and failed[0]["reason"] == "exit_code" and failed[0]["exit_code"] == 7, snap["verdicts"]
    assert "reason=exit_code exit_code=7" in failed[0]["line"]
    assert "verdicts (latest last):" in text and "phase=prep child=prep" in text and "exit_code=7" in text
    assert SECRET not in raw and SECRET not in (state / "status.json").read_text()
    assert snap["gpus"]["available"] is False and snap["gpus"]["why"].startswith("no GPU"), snap["gpus"]
    assert snap["manager"] == {"enabled": False}

    # ---- a daemon is being waited for (not ready yet)
    (sup.tmp / "gate1").touch()
    run.wait_text("waiting for svc/helper to be ready")
    run.wait_text("[svc/helper] helper started")
    rc, text, _ = status(state)
    assert rc == 0, text
    check_common_text(text, run.pid)
    assert "current phase: svc" in text
    assert re.search(r"^  prep\s+done\s+since \d+s ago, attempt 2: completed in 2 attempt\(s\)", text, re.M), text
    assert re.search(r"^  svc\s+starting\s+since \d+s ago, attempt 1: attempt 1", text, re.M), text
    rc, snap, raw = status_json(state)
    check_schema(snap)
    assert phase(snap, "svc")["state"] == "starting" and phase(snap, "prep")["state"] == "done"
    assert [c["label"] for c in snap["children"]] == ["svc/helper"], snap["children"]
    helper = child(snap, "svc/helper")
    assert re.search(CHILD_RE.format(pid=helper["pid"], state="running"), child_line(text, "svc/helper")), text
    ended = [v for v in snap["verdicts"] if v["phase"] == "prep"]
    assert [(v["exit_code"], v["success"]) for v in ended] == [(7, False), (0, True)], ended
    assert re.search(r"phase=prep child=prep pid=\d+ reason=exit_code exit_code=0 .*attempt=2", text), text
    assert SECRET not in raw

    # ---- a service runs
    (sup.tmp / "helper-ready").touch()
    run.wait_text("[svc/svc] serving 3")
    wait_for(lambda: status_json(state)[1]["phases"][1]["up"], 10, 0.2)
    rc, text, _ = status(state)
    check_common_text(text, run.pid)
    assert re.search(r"^  svc\s+running\s+since \d+s ago, attempt 1: svc/svc pid \d+", text, re.M), text
    rc, snap, raw = status_json(state)
    check_schema(snap)
    assert {c["label"] for c in snap["children"]} == {"svc/helper", "svc/svc"}
    svc = child(snap, "svc/svc")
    assert svc["last_lines"][-3:] == ["serving 1", "serving 2", "serving 3"]

    # ---- the service's child hangs silently (stopped: no output, no CPU): status still answers at once
    os.kill(svc["pid"], signal.SIGSTOP)
    try:
        time.sleep(2.2)
        started = time.monotonic()
        answer = query(state, timeout=10)  # the socket itself, from this (another) process
        took = time.monotonic() - started
        assert answer is not None and took < 2.0, f"the status socket took {took:.2f}s while a child hangs"
        rc, text, took = status(state)
        assert rc == 0, text
        assert took < 4.0, f"status took {took:.2f}s while a child hangs"
        line = child_line(text, "svc/svc")
        assert re.search(CHILD_RE.format(pid=svc["pid"], state="running"), line), line
        up = int(re.search(r" up (\d+)s,", line).group(1))  # type: ignore[union-attr]
        silent = int(re.search(r"last output (\d+)s ago", line).group(1))  # type: ignore[union-attr]
        assert up >= 2 and silent >= 2, line
        assert "      | serving 3" in text, text
        rc, snap, _ = status_json(state)
        hung = child(snap, "svc/svc")
        assert hung["last_output_at"] is not None and time.time() - hung["last_output_at"] >= 2, hung
    finally:
        os.kill(svc["pid"], signal.SIGCONT)

    # ---- stopped: the persisted state, exit 3
    os.kill(run.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    assert not sock.exists()
    rc, text, _ = status(state)
    assert rc == 3, text
    assert text.startswith("no prover-supervisor is running; last state written "), text
    assert f"by pid {run.pid}" in text
    assert "lifecycle: stopped (received SIGTERM)" in text, text
    assert "verdicts (latest last):" in text
    assert re.search(r"phase=prep child=prep pid=\d+ reason=exit_code exit_code=7", text), text
    assert re.search(r"phase=svc child=svc pid=\d+ reason=stopped", text), text
    assert "children: none running" in text
    assert SECRET not in text
    rc, snap, raw = status_json(state)
    assert rc == 3
    check_schema(snap)
    assert snap["live"] is False and snap["lifecycle"]["state"] == "stopped"
    assert SECRET not in raw
    assert stat.S_IMODE(os.stat(state / "status.json").st_mode) == 0o600
    assert SECRET not in (state / "status.json").read_text()


def test_status_shows_the_manager(sup: SupervisorRunner) -> None:
    mgr = DevManager(quiet=True).start()
    try:
        config = sup.write(f"""
            [manager]
            url = {toml_str(mgr.url)}
            label = "C.status"

            [[phases]]
            name = "svc"
            kind = "service"
            report = "running"
            command = {sh("echo serving; exec sleep 60")}
            """, stop_grace_s=1)
        run = Console(sup, config)
        wait_for(lambda: any(i["state"] == "running" for i in mgr.state.snapshot()["instances"].values()), 15, 0.1)
        inst = next(iter(mgr.state.snapshot()["instances"].values()))
        wait_for(lambda: status_json(sup.state_dir)[1]["manager"].get("outbox_pending") == 0, 10, 0.2)
        rc, text, _ = status(sup.state_dir)
        assert rc == 0, text
        line = next((x for x in text.splitlines() if x.startswith("manager: ")), "")
        assert re.fullmatch(rf"manager: {re.escape(mgr.url)} uuid {inst['uuid']}, outbox 0 pending, "
                            r"last delivered (register|running) \d+s ago", line), text
        rc, snap, _ = status_json(sup.state_dir)
        check_schema(snap)
        manager = snap["manager"]
        assert manager["enabled"] is True and manager["uuid"] == inst["uuid"] and manager["label"] == "C.status"
        assert manager["last_delivered"]["kind"] in ("register", "running")
        os.kill(run.pid, signal.SIGTERM)
        assert run.finish() == 128 + signal.SIGTERM
    finally:
        mgr.stop()


def test_status_with_no_state_at_all(tmp_path: Path) -> None:
    empty = tmp_path / "state"
    empty.mkdir()
    for state_dir in (empty, tmp_path / "missing"):
        rc, text, _ = status(state_dir)
        assert rc == 3, text
        assert text.strip() == (f"no prover-supervisor is running (no answer on {state_dir / 'status.sock'}), "
                                f"and no saved state: no {state_dir / 'status.json'}")
        rc, text, _ = status(state_dir, "--json")
        assert rc == 3 and "no prover-supervisor is running" in text and "Traceback" not in text


def test_status_after_a_sigkill_reads_the_persisted_state(sup: SupervisorRunner) -> None:
    """A SIGKILLed supervisor leaves its socket behind: status must not hang on it, and says it is not running."""
    config = sup.write(f"""
        [[phases]]
        name = "work"
        command = {sh("echo working; exec sleep 60")}
        """)
    run = Console(sup, config)
    run.wait_text("[work/work] working")
    children = [c["pid"] for c in status_json(sup.state_dir)[1]["children"]]
    os.kill(run.pid, signal.SIGKILL)
    run.proc.wait(10)
    for pid in children:
        kill_tree(pid)
    assert (sup.state_dir / "status.sock").exists()  # stale: nobody answers
    rc, text, took = status(sup.state_dir)
    assert rc == 3, text
    assert took < 5
    assert text.startswith("no prover-supervisor is running; last state written "), text
    assert re.search(r"^  work\s+running\s+since", text, re.M), text


def test_after_an_early_failure_the_current_phase_is_the_one_that_failed(sup: SupervisorRunner) -> None:
    """Phases never reached are "stopped" by the shutdown, but the lifecycle was not at them."""
    config = sup.write(f"""
[[phases]]
name = "early"
command = {sh("exit 3")}

[[phases]]
name = "late"
command = {sh("true")}
""")
    assert sup.run(config, timeout=30).returncode == 3
    rc, snap, out = status_json(sup.state_dir)
    assert rc == 3, out
    assert snap["lifecycle"]["current"] == "early", out
    assert [(p["name"], p["state"]) for p in snap["phases"]] == [("early", "failed"), ("late", "stopped")], out


def test_status_json_is_json_even_when_none_runs(tmp_path: Path, sup: SupervisorRunner) -> None:
    """``status --json`` is for machines: with no supervisor and no saved state it still prints JSON, exit 3."""
    for state_dir in (tmp_path / "empty", tmp_path / "missing"):
        if state_dir.name == "empty":
            state_dir.mkdir()
        rc, snap, _ = status_json(state_dir)
        assert rc == 3
        assert snap["running"] is False and snap["live"] is False
        assert snap["state_dir"] == str(state_dir)
        assert snap["why"] == (f"no prover-supervisor is running (no answer on {state_dir / 'status.sock'}), "
                               f"and no saved state: no {state_dir / 'status.json'}")
    # With a saved state, the same flag says it is not running, beside the last state written.
    result = sup.run(sup.write(f"""
        [[phases]]
        name = "once"
        command = {toml_list(["true"])}
        """), timeout=30)
    assert result.returncode == 0, result.output
    rc, snap, _ = status_json(sup.state_dir)
    assert rc == 3
    check_schema(snap)
    assert snap["running"] is False and snap["live"] is False
    assert [ph["name"] for ph in snap["phases"]] == ["once"]
