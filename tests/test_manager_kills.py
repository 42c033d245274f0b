"""The manager's own kill, learnt whatever the outbox is busy with (manager/sender.py, rowwatch.py).

Its row is read every ``row_check_s`` while nothing else is delivered, and before each try of a lifecycle call.
A call of another kind retried for as long as the manager refuses it (a durable log push its log route answers
503, a Retry-After) held that read up: a kill from its UI went unnoticed, the instance ran on. A row whose
times the supervisor cannot take as the manager's UTC text (ISO 8601 naming another zone) was refused whole, its
``killed`` state with it. And a kill learnt in the exit flush, before the last lifecycle call of a run that had
completed, left the run's status 0. Real supervisors against the dev-manager on 127.0.0.1; its faults (``POST
/dev/faults``) make the log route fail, or answer ``GET /status`` with the row as such a manager writes it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import requests
from helpers import Console, Runner, sh, toml_str, wait_for

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_KILLED
from supervisor.manager.row import utc_text
from supervisor.state import files as state_files

WAIT_S = 60  # upper bounds against hanging, never measures
UI_KILL = "manually killed via UI"
FETCH_TIMEOUT = "param fetch timeout (90min)"


def post(mgr: DevManager, path: str, body: dict[str, Any]) -> None:
    answer = requests.post(mgr.url + path, json=body, timeout=5)
    assert answer.status_code == 200, answer.text


def calls(mgr: DevManager, path: str) -> list[int]:
    return [c["status"] for c in mgr.state.snapshot()["calls"] if c["path"] == path]


def test_a_kill_while_a_log_push_is_retried_is_learnt_at_the_next_row_read(sup: Runner, manager: DevManager) -> None:
    # The fetch's first attempt fails: its verdict goes to the manager as a durable push, which its log route
    # answers 503 from then on. The second attempt runs on; the manager's UI kills the row meanwhile.
    mark = sup.tmp / "failed-once"
    cfg = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.4712"
        log_push_interval_s = 0.2
        row_check_s = 5

        [[phases]]
        name = "fetch"
        command = {sh(f"if [ -e {mark} ]; then echo again; exec sleep 120; fi; touch {mark}; exit 3")}
        retries = 1
        backoff_s = 0.1
        report = "param-done"
        """)
    post(manager, "/dev/faults", {"status": 503, "count": -1, "path": "/api/log-push"})
    proc = Console(sup, cfg)
    proc.wait_text("[fetch/fetch] again", WAIT_S)
    proc.wait_text("manager: log not delivered (POST /api/log-push: HTTP 503", WAIT_S)  # the verdict's push, retried
    [uuid] = manager.state.snapshot()["instances"]
    post(manager, "/api/kill", {"uuid": uuid, "vast_id": 4712})
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()
    out = proc.text()
    assert "manager: the manager killed this instance at " in out and f" UTC: {UI_KILL}; nothing that could " \
        "un-kill it goes out" in out, out
    assert "shutting down: the manager killed this instance at " in out, out
    assert calls(manager, "/param-done") == [], "a killed row got a lifecycle call"
    assert calls(manager, "/api/log-push") and set(calls(manager, "/api/log-push")) == {503}


def fetch_config(sup: Runner, manager: DevManager, label: str, go: Path, extra: str = "") -> Path:
    """One phase, reporting param-done once ``go`` exists; the termination log in the test's directory."""
    cfg = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = {toml_str(label)}
        log_push_interval_s = 0.2
        {extra}

        [[phases]]
        name = "fetch"
        command = {sh(f"while [ ! -e {go} ]; do sleep 0.05; done; echo fetched")}
        report = "param-done"
        """)
    log = toml_str(str(sup.tmp / "termination-log"))
    cfg.write_text(cfg.read_text().replace("[supervisor]\n", f"[supervisor]\ntermination_log = {log}\n", 1))
    return cfg


def test_a_killed_row_whose_times_name_another_zone_still_ends_the_instance(sup: Runner,
                                                                            manager: DevManager) -> None:
    # The manager's GET /status writes its times as ISO 8601 in its own zone ("2026-12-03T20:31:00+02:00", a Go
    # time.Time's JSON) rather than SQLite's UTC text. The row's state is the manager's word all the same.
    go = sup.tmp / "go"
    proc = Console(sup, fetch_config(sup, manager, "C.4713", go, "row_check_s = 5"))
    proc.wait_text("manager: registered: uuid", WAIT_S)
    [row] = manager.state.snapshot()["instances"].values()
    zone = timezone(timedelta(hours=2))
    killed_at = float(int(row["registered_at"]) + 1)
    answer = [{"uuid": row["uuid"], "label": row["label"], "runner_id": row["runner_id"], "state": "killed",
               "registered_at": datetime.fromtimestamp(int(row["registered_at"]), zone).isoformat(),
               "killed_at": datetime.fromtimestamp(killed_at, zone).isoformat(), "kill_reason": FETCH_TIMEOUT}]
    assert answer[0]["killed_at"].endswith("+02:00"), answer
    post(manager, "/dev/faults", {"path": "/status", "count": -1, "answer": answer})
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()  # (the fetch still waits for go: the periodic read)
    out = proc.text()
    line = f"the manager killed this instance at {utc_text(killed_at)} UTC: {FETCH_TIMEOUT}"
    assert f"manager: {line}; nothing that could un-kill it goes out" in out, out
    assert calls(manager, "/param-done") == [], "a killed row got a lifecycle call"
    seen = json.loads(state_files.path(sup.state_dir, state_files.FIRST_SEEN).read_text())
    assert seen["manager_registered_at"] == int(row["registered_at"]), seen  # read in its zone, not 2 h off


def test_a_kill_learnt_in_the_exit_flush_of_a_completed_run_is_its_exit_status(sup: Runner,
                                                                              manager: DevManager) -> None:
    # The row is read at the registration, then every 300 s: the UI's kill comes between, and the run completes
    # before the next read. Its param-done, the last call, reads the row in the exit flush: not sent, and the run
    # that "completed" exits as killed, the manager's reason in its termination log and status.json.
    go = sup.tmp / "go"
    (sup.tmp / "termination-log").write_text("")
    proc = Console(sup, fetch_config(sup, manager, "C.4714", go))
    proc.wait_text("manager: registered: uuid", WAIT_S)
    [row] = manager.state.snapshot()["instances"].values()
    wait_for(lambda: len(manager.state.snapshot()["reads"]) >= 1, WAIT_S)
    post(manager, "/api/kill", {"uuid": row["uuid"], "vast_id": 4714})
    go.touch()
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()
    out = proc.text()
    assert "lifecycle complete: every phase done" in out, out
    assert "manager: param-done not sent: the manager killed this instance at " in out, out
    assert "exiting with status 80 after all: the manager killed this instance at " in out, out
    assert f"{UI_KILL} (learnt during the exit flush)" in out, out
    assert calls(manager, "/param-done") == []
    log = (sup.tmp / "termination-log").read_text()
    assert log.startswith("exit status 80: the manager killed this instance at ") and log.endswith(UI_KILL), log
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())
    assert snap["lifecycle"]["exit_status"] == EXIT_KILLED, snap["lifecycle"]
    # Never sent, so no attempt: the ledger said "1 attempt(s)", and an operator read it as received.
    [param_done] = [e for e in snap["manager"]["ledger"] if e["kind"] == "param-done"]
    assert (param_done["state"], param_done["attempts"]) == ("failed", 0), param_done
    assert param_done["last_error"].startswith("not sent: the manager killed this instance at "), param_done
