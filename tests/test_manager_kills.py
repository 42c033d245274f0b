"""The manager's own kill, learnt whatever the outbox is busy with (manager/sender.py, rowwatch.py).

Its row is read every ``row_check_s`` while nothing else is delivered, and before each try of a lifecycle call.
A call of another kind retried for as long as the manager refuses it (a durable log push its log route answers
503, a Retry-After) held that read up: a kill from its UI went unnoticed, the instance ran on. Real supervisors
against the dev-manager on 127.0.0.1; its faults (``POST /dev/faults``) make the log route fail.
"""

from __future__ import annotations

from typing import Any

import requests
from helpers import Console, Runner, sh, toml_str

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_KILLED

WAIT_S = 60  # upper bounds against hanging, never measures
UI_KILL = "manually killed via UI"


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
