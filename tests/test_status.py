"""``prover-supervisor status`` from another process, against a real running supervisor.

One supervisor is walked through each kind of phase (a oneshot that failed once and runs again, a daemon being
waited for, a service, a hung child) and asked at each point, in text and in JSON, by a separate process; then
it is stopped and asked again (the persisted state). Also: the manager line with a dev-manager, no state at all,
file modes, and secrets.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import stat
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from helpers import (
    PY,
    REPO,
    Console,
    Runner,
    clean_env,
    fill,
    kill_tree,
    sh,
    spoil,
    stale_socket,
    toml_list,
    toml_str,
    until,
    wait_for,
)

from supervisor.app.cli import dev_manager
from supervisor.engine.loop import EventLoop
from supervisor.evidence.watchstate import Watches
from supervisor.lifecycle.resume import ResumeRecord
from supervisor.lifecycle.states import PhaseState, Timeline
from supervisor.lifecycle.verdict import VERDICTS_KEPT_PER_PHASE, without_exit
from supervisor.status.file import snapshot_problem
from supervisor.status.model import Snapshot
from supervisor.status.render import render
from supervisor.status.snapshot import SNAPSHOT_LINE_CHARS, snapshot
from supervisor.status.socket import BACKLOG, StatusServer, ask, query

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
    """What every live status text says: the headline, then who, as what role, GPUs, memory, manager."""
    headline, who = text.splitlines()[:2]
    assert re.match(r"(running|starting|waiting|retrying): ", headline), text
    assert who.startswith(f"prover-supervisor pid {pid} as subreaper, up "), text
    assert re.search(r"^gpus: no GPU", text, re.M), text
    assert re.search(r"^memory: (per-phase|shared|unavailable); \S", text, re.M), text
    assert "manager: reporting off" in text, text
    assert SECRET not in text


def walkthrough_config(sup: Runner) -> Path:
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


def test_status_through_every_kind_of_phase_then_after_exit(sup: Runner) -> None:
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
        # (job control, seen by the reaper: it was shown "running")
        assert re.search(CHILD_RE.format(pid=svc["pid"], state="stopped by SIGSTOP"), line), line
        up = int(re.search(r" up (\d+)s,", line).group(1))  # type: ignore[union-attr]
        silent = int(re.search(r"last output (\d+)s ago", line).group(1))  # type: ignore[union-attr]
        assert up >= 2 and silent >= 2, line
        assert "      | serving 3" in text, text
        rc, snap, _ = status_json(state)
        hung = child(snap, "svc/svc")
        assert hung["state"] == "stopped by SIGSTOP", hung
        assert hung["last_output_at"] is not None and time.time() - hung["last_output_at"] >= 2, hung
    finally:
        os.kill(svc["pid"], signal.SIGCONT)

    # ---- stopped: the persisted state, exit 3
    os.kill(run.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    assert not sock.exists()
    rc, text, _ = status(state)
    assert rc == 3, text
    assert text.splitlines()[0] == f"stopped: received SIGTERM; exit {128 + signal.SIGTERM}", text
    assert text.splitlines()[1].startswith("no prover-supervisor is running; last state written "), text
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


def test_status_shows_the_manager(sup: Runner) -> None:
    mgr = dev_manager(quiet=True).start()
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


def sigkill_the_supervisor(run: Console, state_dir: Path) -> float:
    """SIGKILL the supervisor (what it started goes on: ended here, by the pids it last showed); returns when."""
    children = [c["pid"] for c in status_json(state_dir)[1]["children"]]
    os.kill(run.pid, signal.SIGKILL)
    run.proc.wait(10)
    killed_at = time.time()
    for pid in children:
        kill_tree(pid)
    return killed_at


def test_status_after_a_sigkill_reads_the_persisted_state(sup: Runner) -> None:
    """A SIGKILLed supervisor leaves its socket behind: status must not hang on it, and says it is not running."""
    config = sup.write(f"""
        [[phases]]
        name = "work"
        command = {sh("echo working; exec sleep 60")}
        """)
    run = Console(sup, config)
    run.wait_text("[work/work] working")
    sigkill_the_supervisor(run, sup.state_dir)
    assert (sup.state_dir / "status.sock").exists()  # stale: nobody answers
    rc, text, took = status(sup.state_dir)
    assert rc == 3, text
    assert took < 5
    assert text.startswith(f"GONE: supervisor pid {run.pid} is not running and did not stop"), text
    assert re.search(r"^no prover-supervisor is running; last state written ", text, re.M), text
    assert re.search(r"^  work\s+running\s+since", text, re.M), text


def test_status_after_a_sigkill_shows_what_a_child_printed_after_the_last_state_written(sup: Runner) -> None:
    """status.json is written per transition batch: a child that printed every second after its start, its
    supervisor then SIGKILLed, read "last output never" with no lines. Its log file says what it printed."""
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        command = {sh("exec sleep 60")}
        [[phases.daemons]]
        name = "ticker"
        command = {sh("i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done")}
        """)
    run = Console(sup, config)
    run.wait_text("[serve/ticker] tick 8")
    killed_at = sigkill_the_supervisor(run, sup.state_dir)
    saved = json.loads((sup.state_dir / "status.json").read_text())
    [written] = [c for c in saved["children"] if c["label"] == "serve/ticker"]
    assert not any(line.startswith("tick 8") for line in written["last_lines"]), written  # (written before it)
    rc, snap, out = status_json(sup.state_dir)
    assert rc == 3, out
    [ticker] = [c for c in snap["children"] if c["label"] == "serve/ticker"]
    last = int(ticker["last_lines"][-1].split()[1])
    assert last >= 8 and ticker["last_lines"][-2:] == [f"tick {last - 1}", f"tick {last}"], ticker
    assert ticker["last_output_at"] is not None and ticker["last_output_at"] <= killed_at + 1, ticker
    rc, text, _ = status(sup.state_dir)
    assert f"      | tick {last}" in text and not re.search(r"serve/ticker .* last output never", text), text


def test_a_phase_being_stopped_shows_stopping_while_a_daemon_takes_its_grace(sup: Runner) -> None:
    """SIGTERM: the service's command ends at once, its daemon ignores the signal and takes its grace. The phase
    read "running" and up (and its headline "stopped:") for that whole grace, its command long reaped."""
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("echo serving; exec sleep 60")}
        [[phases.daemons]]
        name = "helper"
        command = {sh("trap 'echo helper ignoring TERM' TERM; echo helping; while :; do sleep 0.1; done")}
        stop_grace_s = 30
        """)
    run = Console(sup, config)
    run.wait_text("[serve/helper] helping")
    run.wait_text("[serve/serve] serving")
    os.kill(run.pid, signal.SIGTERM)
    run.wait_text("helper ignoring TERM")
    try:
        rc, snap, out = status_json(sup.state_dir)
        assert rc == 0, out
        [serve] = snap["phases"]
        assert (serve["state"], serve["why"], serve["up"]) == ("stopping", "supervisor shutdown", False), serve
        assert [c["label"] for c in snap["children"]] == ["serve/helper"], snap["children"]
        rc, text, _ = status(sup.state_dir)
        assert text.splitlines()[0] == "stopping: received SIGTERM; exit 143 follows", text
    finally:
        os.kill(run.pid, signal.SIGTERM)  # (a second stop signal: SIGKILL to everything now)
    assert run.finish(30) == 143, run.tail()


def test_after_an_early_failure_the_current_phase_is_the_one_that_failed(sup: Runner) -> None:
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


# ---------------------------------------------------------------- what is read back is checked like config

NAN = float("nan")
BAD_STATE: dict[str, Any] = {
    "phases-a-number": b'{"version": 1, "phases": 3}',
    "phase-name-a-number": b'{"version": 1, "phases": [{"name": 5}]}',
    "nan-written-at": json.dumps({"version": 1, "written_at": NAN, "phases": []}).encode(),
    "verdicts-of-numbers": b'{"version": 1, "verdicts": [5]}',
    "lifecycle-a-list": b'{"version": 1, "lifecycle": []}',
    "rss-a-string": json.dumps({"children": [{"label": "p/c", "pid": 1, "state": "running",
                                              "usage": {"rss": "lots"}, "last_lines": []}]}).encode(),
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "a-list": b"[1, 2, 3]",
    # An object without what every supervisor writes (pid, written_at, lifecycle, phases): it read as a supervisor
    # "pid None" that is gone and "did not stop".
    "an-empty-object": b"{}",
    "another-programs-object": b'{"name": "not ours", "version": 3}',
}


def write_bad_state(state_dir: Path, kind: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    spoil(state_dir / "status.json", kind, BAD_STATE)


@pytest.mark.parametrize("kind", [*BAD_STATE, "fifo", "huge"])
def test_status_of_a_wrong_shaped_state_file_is_one_line(tmp_path: Path, kind: str) -> None:
    state_dir = tmp_path / "state"
    write_bad_state(state_dir, kind)
    rc, text, _ = status(state_dir)
    assert rc == 3, text
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "status.json" in lines[0] and "ignoring it" in lines[0], text
    assert "and no saved state: " in lines[0] and "GONE" not in text, text
    # --json is JSON even then (issue 10): the same one-line reason, as its "why".
    rc, text, _ = status(state_dir, "--json")
    assert rc == 3, text
    assert "Traceback" not in text, text
    answer = json.loads(text)
    assert answer["running"] is False and answer["live"] is False, answer
    assert "status.json" in answer["why"] and "ignoring it" in answer["why"] and "\n" not in answer["why"], answer


def test_a_nan_done_at_does_not_pass_the_resume_age_check(sup: Runner) -> None:
    """json reads NaN, and every comparison with NaN is false: "older than resume_max_age_s" never was."""
    marker = sup.tmp / "ran"
    config = sup.write(f"""
        [[phases]]
        name = "bench"
        resume = "machine"
        command = {sh(f"touch {marker}")}
        """)
    sup.state_dir.mkdir()
    (sup.state_dir / "status.json").write_text(json.dumps(
        {"version": 1, "phases": [{"name": "bench", "state": "done", "since": 1.0, "why": "", "attempt": 1,
                                   "facts": {"done_at": NAN, "machine": {}}}]}))
    result = sup.run(config, timeout=30)
    assert result.returncode == 0, result.output
    assert "Traceback" not in result.output
    said = [line for line in result.output.splitlines() if "starting clean" in line]
    assert len(said) == 1 and "status.json" in said[0], result.output
    assert marker.exists(), "the bench ran again: nothing resumed from a NaN"
    assert "resumed" not in result.output


# ---------------------------------------------------------------- a restart loop stays bounded

RESTARTS = 150
# Far above what the capped snapshot can reach (50 verdicts of 20 lines of 500 characters, and the rest).
STATE_FILE_BOUND = 1024 * 1024


def test_a_fast_restart_loop_keeps_verdicts_and_status_json_bounded(sup: Runner) -> None:
    """Each run of the service prints 20 lines of 8 KiB and fails; with no backoff it is restarted RESTARTS times
    before the burst limit fails it. Kept: the last few verdicts, each line cut; status.json stays small."""
    line = "x" * 8192
    config = sup.write(f"""
        [[phases]]
        name = "flappy"
        kind = "service"
        restart = "always"
        command = {sh(f"for i in $(seq 20); do echo {line}; done; exit 3")}
        backoff_s = 0
        backoff_max_s = 0
        backoff_jitter = 0
        restart_burst = {RESTARTS}
        restart_window_s = 3600
        """, header=False)
    config.write_text(sup.header(extra="console = false") + config.read_text())
    result = sup.run(config, timeout=180)
    assert result.returncode == 3, result.output[-2000:]
    snap = json.loads((sup.state_dir / "status.json").read_text())
    assert phase(snap, "flappy")["attempt"] == RESTARTS + 1, phase(snap, "flappy")
    size = (sup.state_dir / "status.json").stat().st_size
    assert size < STATE_FILE_BOUND, size
    kept = [v for v in snap["verdicts"] if v["phase"] == "flappy"]
    assert 0 < len(kept) <= VERDICTS_KEPT_PER_PHASE, len(kept)
    assert kept[-1]["attempt"] == RESTARTS + 1, "the latest verdicts are the ones kept"
    assert all(len(s) <= SNAPSHOT_LINE_CHARS for v in kept for s in v["last_lines"])
    assert "Traceback" not in (sup.log_dir / "supervisor.log").read_text()


# ---------------------------------------------------------------- clients that never read

NON_READERS = 5


def big_snapshot_config(sup: Runner) -> Path:
    """Two oneshots that fail 20 times each, printing 20 long lines a time, then succeed, and a service that runs:
    the snapshot carries 40 verdicts of 20 lines of 500 characters, more than a socket buffer holds."""
    def flaky(name: str) -> str:
        count = sup.tmp / f"{name}.count"
        return sh(f"echo x >> {count}; for i in $(seq 20); do echo {'y' * 600}; done; "
                  f"[ $(wc -l < {count}) -gt 20 ]")

    # (cgroups "shared": what is tested is the socket, not 40 per-phase cgroups made and removed in a second)
    return sup.write(sup.header(extra='cgroups = "shared"') + textwrap.dedent(f"""
        [[phases]]
        name = "first"
        command = {flaky("first")}
        retries = 25
        backoff_s = 0
        backoff_max_s = 0
        backoff_jitter = 0

        [[phases]]
        name = "second"
        command = {flaky("second")}
        retries = 25
        backoff_s = 0
        backoff_max_s = 0
        backoff_jitter = 0

        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("echo serving; exec sleep 60")}
        """), header=False)


def test_clients_that_never_read_do_not_stall_the_loop(sup: Runner) -> None:
    run = Console(sup, big_snapshot_config(sup))
    try:
        run.wait_text("[serve/serve] serving", 60)
        silent = []
        for _ in range(NON_READERS):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(sup.state_dir / "status.sock"))
            silent.append(client)
        # Asked after the five (the loop takes connections in order), answered while none of them has read a byte.
        snap = query(sup.state_dir)
        assert snap is not None, run.tail()
        assert len(json.dumps(snap)) > 256 * 1024, "the answer is bigger than a socket buffer: the test means it"
        assert len(snap["verdicts"]) == 40
        # The oldest non-readers made room for it: dropped, with the part of the answer the socket took at once.
        outcomes = []
        for client in silent:
            with client:
                client.settimeout(10)
                data = b"".join(iter(lambda c=client: c.recv(1 << 16), b""))
            outcomes.append("whole" if data.endswith(b"\n") and json.loads(data)["pid"] == run.pid else "dropped")
        assert outcomes[0] == "dropped", outcomes
        run.wait_text("status: dropped a client that did not read its answer")
        os.kill(run.pid, signal.SIGTERM)
        assert run.finish() == 128 + signal.SIGTERM
    finally:
        kill_tree(run.pid)


def test_many_status_calls_at_once_each_wait_their_turn(sup: Runner) -> None:
    """A unix socket's connect() fails at once, whatever its timeout, once the listener's queue is full: a dozen
    `status` calls during one busy turn of the loop were told "not answering" (exit 3) by a healthy supervisor.
    Here the loop is frozen (SIGSTOP) while more callers come than the queue holds; thawed, it answers them all."""
    config = sup.write("""
        [[phases]]
        name = "svc"
        kind = "service"
        command = ["sleep", "300"]
        """)
    proc = sup.start(config)
    until(proc, "phase svc: starting → running")
    callers = 2 * BACKLOG
    answers: list[Any] = []
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=lambda: answers.append(ask(sup.state_dir, timeout=30)))
                   for _ in range(callers)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # (every caller connected, queued, or trying again)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    for thread in threads:
        thread.join(60)
    assert len(answers) == callers
    assert all(isinstance(a, dict) and a.get("pid") == proc.pid for a in answers), \
        f"{sum(a is None for a in answers)} of {callers} callers got no answer"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM


def test_a_hung_writer_run_under_another_name_is_not_answering_not_gone(sup: Runner) -> None:
    """An image that runs the entry point under a name of its own (`python /app/init.py`, no "supervisor" in its
    command line): frozen, it was read as gone (and what it runs as left behind), since only a command line saying
    "supervisor" counted as one. The pid's start time, which status.json keeps, says it is the very writer."""
    init = sup.tmp / "init.py"
    init.write_text((REPO / "entrypoint.py").read_text())
    config = sup.write("""
        [[phases]]
        name = "svc"
        kind = "service"
        command = ["sleep", "300"]
        """)
    proc = subprocess.Popen([PY, str(init)], env=sup.env(SUPERVISOR_CONFIG=str(config)), cwd=sup.tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    sup.procs.append(proc)
    assert not any("supervisor" in part for part in [PY, str(init)]), "the test's own paths say it"
    try:
        wait_for(lambda: status_json(sup.state_dir)[0] == 0, 30)
        os.kill(proc.pid, signal.SIGSTOP)
        rc, text, _ = status(sup.state_dir)
        assert rc == 3, text
        assert text.startswith(f"NOT ANSWERING: supervisor pid {proc.pid} "), text
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM


def test_status_json_is_json_even_when_none_runs(tmp_path: Path, sup: Runner) -> None:
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


# ---------------------------------------------------------------- in-process: the snapshot and its text


def a_phase(name: str, state: PhaseState, *, facts: dict[str, Any] | None = None,
            children: tuple[Any, ...] = ()) -> SimpleNamespace:
    """What the snapshot reads of a phase (snapshot.PhaseView)."""
    return SimpleNamespace(name=name, spec=SimpleNamespace(kind="oneshot", memory_max=None, timeout_s=None,
                                                           stall_s=None, settle_timeout_s=300.0),
                           state=state, since=1000.0, why="why", attempt=1, up=False, facts=facts or {},
                           timeline=Timeline(),
                           parsed=None, kept_as=None, live_children=lambda: list(children),
                           pacing=SimpleNamespace(deadline_at=None, backoff_until=None, stall=None, settle_until=None),
                           current_attempt=SimpleNamespace(start=None), progress=None)


def test_the_snapshot_is_built_from_what_it_is_handed() -> None:
    """The snapshot reads only its arguments: a phase not reached shows the last run's facts (the resume record),
    a child's lines and a verdict's are cut (masked already where they entered), the shape is the one read back."""
    long_line = "y" * (SNAPSHOT_LINE_CHARS + 100)
    output = SimpleNamespace(last_output_at=time.monotonic() - 5, last_lines=lambda n=None: ["token is ***", long_line],
                             file=SimpleNamespace(ours_from=lambda: 1234))
    child = SimpleNamespace(label="work/work", pid=os.getpid(), started_at=time.time() - 9, stop_reason=None,
                            job_stopped=None, output=output, grace_s=10.0, kill_at=None, running=True)
    done_now = {"done_at": time.time(), "machine": {}}
    phases = [a_phase("fetch", PhaseState.DONE, facts=done_now), a_phase("work", PhaseState.RUNNING, children=(child,)),
              a_phase("bench", PhaseState.PENDING)]
    life = SimpleNamespace(phases=phases, shutting_down=False, exit_status=None, over=False, shutdown_reason="",
                           current=lambda: phases[1], failure=None,
                           held=lambda name: "held by a test" if name == "fetch" else None, hold_ends=lambda name: None)
    earlier = {"done_at": 1000.0, "machine": {"gpus": [], "memory": 1}}
    record = ResumeRecord(None, {"bench": earlier, "fetch": {"done_at": 1.0}})
    verdict = without_exit("work", "work", "timeout", 1, "deadline", attempt=1, last_lines=[long_line])
    snap = snapshot(role="subreaper", started_at=time.time() - 10, config="c.toml", lifecycle=life, gpus=None,
                    memory=None, verdicts=[verdict], manager={"enabled": False}, resume=record).to_json()
    assert snapshot_problem(json.loads(json.dumps(snap))) is None
    assert snap["lifecycle"] == {"state": "running", "why": "", "exit_status": None, "current": "work",
                                 "failure": None}
    assert [(p["name"], p["state"], p["facts"]) for p in snap["phases"]] == [
        ("fetch", "done", done_now), ("work", "running", {}), ("bench", "pending", earlier)]
    assert [p["hold"] for p in snap["phases"]] == ["held by a test", None, None]  # the lifecycle's, by name
    (shown,) = snap["children"]
    assert shown["phase"] == "work" and shown["usage"]["processes"] >= 1
    assert shown["last_lines"] == ["token is ***", long_line[:SNAPSHOT_LINE_CHARS]]
    assert 4 < time.time() - shown["last_output_at"] < 60
    assert snap["verdicts"][0]["last_lines"] == [long_line[:SNAPSHOT_LINE_CHARS]]
    assert snap["verdicts"][0]["line"] == verdict.line()
    assert snap["gpus"] == {"available": False, "why": "not probed", "samples": [], "left_out": [],
                            "unresponsive": None, "slow_calls": 0, "sampled_s_ago": None, "samples_stale": False}
    assert snap["memory"]["mode"] == "unavailable" and snap["manager"] == {"enabled": False}


def test_a_watch_that_is_never_blind_leaves_the_snapshot_valid() -> None:
    # A plugin's watch with a window of math.inf (wiring.watch_state: it is never blind) was written
    # "window_s": Infinity, and the gate refused the whole snapshot: status.json and the socket's answer both.
    watches = Watches()
    watches.new("forever", math.inf)
    watches.new("minute", 60.0)
    life = SimpleNamespace(phases=[], shutting_down=False, exit_status=None, over=False, shutdown_reason="",
                           current=lambda: None, failure=None, held=lambda name: None, hold_ends=lambda name: None)
    snap = snapshot(role="subreaper", started_at=time.time() - 10, config="c.toml", lifecycle=life, gpus=None,
                    memory=None, verdicts=[], manager={"enabled": False}, resume=ResumeRecord(None, {}),
                    watches=watches).to_json()
    assert snapshot_problem(json.loads(json.dumps(snap))) is None
    assert snap["watches"]["forever"]["window_s"] is None and snap["watches"]["minute"]["window_s"] == 60.0


def test_the_failures_log_file_is_named_only_where_a_child_wrote_one(tmp_path: Path) -> None:
    # A failure no child printed (the fitness check's refusal) was shown with "logs: <log_dir>/fitness.log", a
    # file that never existed; supervisor.log has its lines.
    phases = [a_phase("work", PhaseState.FAILED)]
    (tmp_path / "work.log").write_text("it ran\n")
    for phase, named in (("work", str(tmp_path / "work.log")), ("fitness", None)):
        failure = without_exit(phase, phase, "insufficient_memory", 1, "refused", attempt=0)
        life = SimpleNamespace(phases=phases, shutting_down=True, exit_status=1, over=True, shutdown_reason="failed",
                               current=lambda: None, failure=failure, held=lambda name: None,
                               hold_ends=lambda name: None)
        snap = snapshot(role="subreaper", started_at=time.time() - 10, config="c.toml", lifecycle=life, gpus=None,
                        memory=None, verdicts=[failure], manager={"enabled": False}, resume=ResumeRecord(None, {}),
                        log_dir=str(tmp_path))
        assert snap.lifecycle.failure is not None and snap.lifecycle.failure.log_file == named, phase


def test_the_text_of_a_saved_snapshot() -> None:
    now = 10_000.0
    snap = {"pid": 42, "written_at": now - 130, "lifecycle": {"state": "stopped", "why": "received SIGTERM",
                                                              "current": "svc"},
            "phases": [{"name": "prep", "state": "done", "since": now - 7300, "attempt": 2, "why": "completed"},
                       {"name": "svc", "state": "stopped", "since": now - 5, "attempt": 1, "why": "stopped",
                        "hold": "the manager has not answered"}],
            "children": [], "gpus": {"why": "no GPU: NVML unavailable"}, "memory": {"mode": "shared", "why": "w"},
            "manager": {"enabled": False}, "verdicts": [{"line": "phase=svc child=svc reason=stopped"}]}
    assert render(Snapshot.from_json(snap), live=False, now=now).splitlines() == [
        "stopped: received SIGTERM",
        "no prover-supervisor is running; last state written 2m10s ago by pid 42",
        "lifecycle: stopped (received SIGTERM)",
        "current phase: svc",
        "phases:",
        "  prep         done      since 2h01m ago, attempt 2: completed",
        "  svc          stopped   since 5s ago, attempt 1: stopped; held: the manager has not answered",
        "children: none running",
        "gpus: no GPU: NVML unavailable",
        "memory: shared; w",
        "manager: reporting off",
        "verdicts (latest last):",
        "  phase=svc child=svc reason=stopped",
    ]


def test_a_child_a_gone_supervisor_left_shows_an_uptime_only_while_it_is_alive() -> None:
    # The supervisor was SIGKILLed; of its two children one still runs, one ended since, at a time nobody saw:
    # it showed "gone up 6s", an uptime that grew at every call.
    now = 10_000.0
    snap = {"pid": 42, "written_at": now - 60, "supervisor": "gone", "gone_since": now - 60,
            "survivors": [{"pid": 101, "name": "sleep", "tag": "t"}],
            "lifecycle": {"state": "running", "why": "", "current": "svc"},
            "phases": [{"name": "svc", "state": "running", "since": now - 70, "attempt": 1, "why": "up"}],
            "children": [{"label": "svc/web", "pid": 101, "state": "running", "started_at": now - 70},
                         {"label": "svc/svc", "pid": 102, "state": "running", "started_at": now - 70}],
            "gpus": {"why": "no GPU"}, "memory": {"mode": "shared", "why": "w"}, "manager": {"enabled": False},
            "verdicts": []}
    lines = render(Snapshot.from_json(snap), live=False, now=now).splitlines()
    [web] = [line for line in lines if line.startswith("  svc/web ")]
    [svc] = [line for line in lines if line.startswith("  svc/svc ")]
    assert re.search(r"pid 101\s+alive\s+up 70s,", web), web
    assert re.search(r"pid 102\s+gone\s+started 70s ago,", svc) and " up " not in svc, svc


def test_status_json_after_the_exit_has_what_the_exit_flush_delivered(sup: Runner) -> None:
    # status.json is saved before the exit's manager flush (a SIGKILL during the flush must find the last state on
    # disk), and once more after it: before, a report the flush delivered stayed "pending" in it for good.
    mgr = dev_manager(quiet=True).start()
    try:
        requests.post(f"{mgr.url}/dev/faults", json={"delay_s": 0.5, "count": 1, "path": "/param-done"}, timeout=5)
        config = sup.write(f"""
            [manager]
            url = {toml_str(mgr.url)}
            label = "C.flush"

            [[phases]]
            name = "fetch"
            report = "param-done"
            command = {sh("echo done")}
            """)
        result = sup.run(config, timeout=60)
        assert result.returncode == 0, result.stdout
        assert [i["state"] for i in mgr.state.snapshot()["instances"].values()] == ["params_done"]
        _, snap, _ = status_json(sup.state_dir)
        assert snap["manager"]["outbox_pending"] == 0, snap["manager"]
    finally:
        mgr.stop()


def test_a_supervisor_killed_in_its_exit_flush_is_gone_not_exited(sup: Runner) -> None:
    # It failed (exit 9) and waits for the give-up to be delivered to a manager that never answers; SIGKILL (a
    # docker stop's) comes during that wait. status.json was saved before the wait with the lifecycle stopped,
    # and status called it exited, with an exit status 9 the process never returned (it died of the SIGKILL).
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:1"
        label = "C.12345"

        [[phases]]
        name = "job"
        command = {sh("echo work; exit 9")}
        """)
    run = Console(sup, config)
    run.wait_text("exiting with status 9")
    saved = sup.state_dir / "status.json"
    wait_for(lambda: saved.exists() and "exiting" in json.loads(saved.read_text()), timeout=20)
    os.kill(run.pid, signal.SIGKILL)
    run.proc.wait(10)
    rc, snap, _ = status_json(sup.state_dir)
    assert rc == 3 and snap["supervisor"] == "gone", snap
    rc, text, _ = status(sup.state_dir)
    first = text.splitlines()[0]
    assert first.startswith(f"GONE: supervisor pid {run.pid} was killed during its exit flush "), text
    assert "its exit status 9 never came; " in first and "call(s) for the manager were pending" in first, text


def test_the_fate_of_a_supervisor_that_wrote_stopped_is_read_with_its_exit_flush(tmp_path: Path) -> None:
    # Alive and not answering after it saved "stopped" without the flush's wait: its last steps (the socket is
    # closed first), not a hang. With the wait in it, alive: the flush runs the loop, so no answer is a hang;
    # dead: killed in it.
    from supervisor.status.command import writer_fate
    from supervisor.status.model import EXITED, GONE, NOT_ANSWERING

    # A SIGKILL leaves the socket file behind (the exit removes it): a supervisor killed anywhere leaves one.
    stale_socket(tmp_path / "status.sock")
    stopped = {"pid": 0, "written_at": time.time(), "lifecycle": {"state": "stopped", "exit_status": 3}}
    waiting = {**stopped, "exiting": {"status": 3, "flush_left_s": 50.0, "giving_up": True}}
    alive = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", "supervisor"])
    dead = subprocess.Popen([PY, "-c", "pass", "supervisor"])
    dead.wait(10)
    try:
        fates = {(name, which): writer_fate(Snapshot.from_json({**data, "pid": pid}), str(tmp_path)).supervisor
                 for name, data in (("stopped", stopped), ("waiting", waiting))
                 for which, pid in (("alive", alive.pid), ("dead", dead.pid))}
    finally:
        alive.kill()
        alive.wait(10)
    assert fates == {("stopped", "alive"): EXITED, ("stopped", "dead"): EXITED,
                     ("waiting", "alive"): NOT_ANSWERING, ("waiting", "dead"): GONE}, fates
    # Its socket file gone, the dead one exited: its last save (after the flush) failed, its exit went on.
    (tmp_path / "status.sock").unlink()
    fate = writer_fate(Snapshot.from_json({**waiting, "pid": dead.pid}), str(tmp_path))
    assert (fate.supervisor, fate.unsaved) == (EXITED, True), fate


def test_a_supervisor_whose_exit_could_not_save_its_state_exited_not_gone(
        sup: Runner, tmpfs: Callable[[Path, str], Path]) -> None:
    """A full state_dir: the exit's save of status.json fails (said in the log), and the file keeps "running". The
    exit removed its socket file (a SIGKILL leaves it), so status says it exited without saving, not that it is
    gone and did not stop."""
    tmpfs(sup.state_dir, "1m")
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """)
    run = Console(sup, config)
    run.wait_text("phase serve: starting → running")
    wait_for(lambda: status_json(sup.state_dir)[0] == 0, 30)
    fill(sup.state_dir)
    os.kill(run.pid, signal.SIGTERM)
    assert run.proc.wait(60) == 143, run.tail()
    assert "exiting with status 143" in run.text(), run.tail()
    assert json.loads((sup.state_dir / "status.json").read_text())["lifecycle"]["state"] != "stopped"
    rc, text, _ = status(sup.state_dir)
    assert rc == 3, text
    assert text.startswith(f"exited: supervisor pid {run.pid} exited, but could not save its last state (last "
                           "state written "), text
    assert f"its log says how it ended: {sup.log_dir / 'supervisor.log'}" in text.splitlines()[0], text
    assert "GONE" not in text and "did not stop" not in text, text
    assert "lifecycle (last known, before the supervisor's exit): running" in text, text
    rc, snap, out = status_json(sup.state_dir)
    assert rc == 3 and snap["supervisor"] == "exited" and snap["unsaved"] is True and snap["survivors"] == [], out
    assert snap["listening"] is True, out  # (its socket was made: the file's absence is its exit's doing)


def test_a_supervisor_whose_socket_was_never_made_is_gone_when_killed_with_nothing_alive(sup: Runner) -> None:
    """A supervisor whose status socket could not be made (said in its log: here a directory in its place, which the
    operator then removed; elsewhere no fd left) has no socket file for a SIGKILL to leave behind. Killed between two
    attempts (nothing alive), it read "exited, but could not save its last state", as if its exit had removed the
    file; it is gone, and its last save says its socket was not listening."""
    (sup.state_dir / "status.sock").mkdir(parents=True)
    config = sup.write(f"""
        [[phases]]
        name = "try"
        command = {sh("exit 1")}
        retries = 3
        backoff_s = 60
        backoff_max_s = 60
        """)
    run = Console(sup, config)
    run.wait_text("status: cannot listen on ")
    run.wait_text("phase try: stopping → backoff")
    wait_for(lambda: json.loads((sup.state_dir / "status.json").read_text())["phases"][0]["state"] == "backoff", 30)
    (sup.state_dir / "status.sock").rmdir()
    os.kill(run.pid, signal.SIGKILL)
    run.proc.wait(10)
    assert json.loads((sup.state_dir / "status.json").read_text())["listening"] is False
    rc, text, _ = status(sup.state_dir)
    assert rc == 3, text
    assert text.startswith(f"GONE: supervisor pid {run.pid} is not running and did not stop"), text
    assert "could not save its last state" not in text, text


def test_a_snapshot_that_cannot_be_built_closes_the_client_and_the_socket_answers_on(tmp_path: Path) -> None:
    """Whatever building the answer raised, the client's connection is closed (it waited for good on one leaked
    when the fault was not a TypeError or ValueError) and the next request is answered."""
    loop = EventLoop()
    said: list[str] = []
    builds = iter([RuntimeError("a bug of the snapshot's"), Snapshot(pid=7)])

    def build() -> Snapshot:
        got = next(builds)
        if isinstance(got, Exception):
            raise got
        return got

    server = StatusServer(loop, tmp_path, build, said.append)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(server.path))
            loop.run_once(max_wait=1)
            assert client.recv(100) == b"", "the connection was closed, not left open"
        assert said == ["status: could not answer a status request: RuntimeError: a bug of the snapshot's"]
        answers: list[Any] = []
        asker = threading.Thread(target=lambda: answers.append(ask(tmp_path)))
        asker.start()
        deadline = time.monotonic() + 5
        while asker.is_alive() and time.monotonic() < deadline:
            loop.run_once(max_wait=0.05)
        asker.join(5)
        assert answers and answers[0]["pid"] == 7, answers
    finally:
        server.close()
        loop.close()


def test_a_status_socket_removed_while_it_runs_is_made_again_and_said(sup: Runner) -> None:
    """An operator's `rm` (or a cleaner of state_dir) took the socket file: the supervisor listened on a file nobody
    could reach, said nothing, and `status` called it hung for the rest of its run. Its tick makes the file again;
    a status asked in the moment between waits for that, and gets the live answer."""
    config = sup.write("""
        [[phases]]
        name = "svc"
        kind = "service"
        command = ["sleep", "300"]
        """)
    run = Console(sup, config)
    try:
        run.wait_text("phase svc: starting → running")
        sock = sup.state_dir / "status.sock"
        wait_for(lambda: status_json(sup.state_dir)[0] == 0, 30)
        sock.unlink()
        rc, text, _ = status(sup.state_dir)  # (asked at once: its tick has not made it yet, most likely)
        assert rc == 0 and text.startswith("running: svc up "), text
        run.wait_text(f"status: {sock} was removed; listening on it again")
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        rc, snap, out = status_json(sup.state_dir)
        assert rc == 0 and snap["pid"] == run.pid, out
        os.kill(run.pid, signal.SIGTERM)
        assert run.finish() == 128 + signal.SIGTERM
        assert not sock.exists(), "the exit left the socket file it made again"
    finally:
        kill_tree(run.pid)


def test_a_status_socket_replaced_or_blocked_is_made_again_once_it_can(tmp_path: Path) -> None:
    """A file in the socket's place is removed, and the socket bound again; a directory there, which cannot be,
    is said once (whatever the ticks), and the socket is made once it is gone, said too."""
    loop = EventLoop()
    said: list[str] = []
    server = StatusServer(loop, tmp_path, lambda: Snapshot(pid=7), said.append)

    def answer() -> Any:
        answers: list[Any] = []
        asker = threading.Thread(target=lambda: answers.append(ask(tmp_path)))
        asker.start()
        deadline = time.monotonic() + 10
        while asker.is_alive() and time.monotonic() < deadline:
            loop.run_once(max_wait=0.05)
        asker.join(10)
        return answers[0]["pid"] if answers and answers[0] is not None else None

    try:
        assert server.check(0.0) == [] and answer() == 7
        server.path.unlink()
        server.path.write_text("not a socket")
        assert server.check(1.0) == [f"status: {server.path} was replaced by another file; listening on it again"]
        assert stat.S_ISSOCK(os.lstat(server.path).st_mode) and answer() == 7
        server.path.unlink()
        server.path.mkdir()
        assert server.check(2.0) == [f"status: {server.path} was replaced by another file, and cannot listen on it "
                                     "again (Is a directory); `prover-supervisor status` shows status.json only "
                                     "meanwhile (tried again every second)"]
        assert server.check(3.0) == [], "said once"
        server.path.rmdir()
        assert server.check(4.0) == [f"status: {server.path} was removed; listening on it again"]
        assert answer() == 7 and server.check(5.0) == []
    finally:
        server.close()
        loop.close()
    assert not server.path.exists()
