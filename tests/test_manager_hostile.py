"""A manager that misbehaves on purpose (the dev-manager's faults): the client trusts nothing it is answered.

Real supervisor processes against the dev-manager on 127.0.0.1: a manager that drips its answers holds up neither
the other calls nor the exit beyond the call deadline; a redirect is not counted as delivered, and the call goes
once the manager behaves; a 100 MB answer is not read into memory; register answers a child cannot carry are never
exported; Retry-After is waited out; a password in the URL is shown nowhere.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import PY, REPO, Console, Runner, clean_env, outbox_rows, sh, toml_str, wait_for

from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager, _Handler
from supervisor.manager.answers import UUID_RE
from supervisor.manager.client import ManagerClient, TransientError

# A supervisor's peak RSS with a manager is ~35 MiB here; reading a 100 MB answer took it to ~390 MiB.
RSS_BOUND_BYTES = 80 * 1024 * 1024
HUGE_ANSWER_BYTES = 100_000_000


def faults(mgr: DevManager, **spec: Any) -> None:
    answer = requests.post(mgr.url + "/dev/faults", json=spec, timeout=5)
    assert answer.status_code == 200, answer.text


def calls(mgr: DevManager, path: str | None = None) -> list[dict[str, Any]]:
    return [c for c in mgr.state.snapshot()["calls"] if path is None or c["path"] == path]


def history(mgr: DevManager, label: str) -> list[str]:
    mine = [i for i in mgr.state.snapshot()["instances"].values() if i["label"] == label]
    return mine[0]["history"] if mine else []


def manager_table(url: str, label: str, read_timeout_s: float = 2) -> str:
    return (f"[manager]\nurl = {toml_str(url)}\nlabel = {toml_str(label)}\nlog_push_interval_s = 0.2\n"
            f"connect_timeout_s = 0.5\nread_timeout_s = {read_timeout_s}\n")


SERVICE = f"""
[[phases]]
name = "service"
kind = "service"
command = {sh("echo serving; exec sleep 120")}
report = "running"
"""


# ---------------------------------------------------------------- a manager that drips


def test_a_dripping_manager_holds_up_neither_the_calls_nor_the_exit(sup: Runner,
                                                                     manager: DevManager) -> None:
    """Every log push is answered at half a byte a second (a 46-byte answer: 90 s), each read well inside the
    read timeout: only the call deadline (0.5 + 3 s) ends it. The lifecycle's calls and the exit go on."""
    faults(manager, drip_bytes_per_s=0.5, path="/api/log-push")
    config = sup.write(manager_table(manager.url, "C.drip", read_timeout_s=3) + f"""
[[phases]]
name = "params"
kind = "oneshot"
command = {sh("echo fetching; sleep 0.5; echo fetched")}
report = "param-done"
""")
    # Before: the pushes held the client's one lock, so param-done waited for them, and the exit for ever.
    result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    assert "lifecycle complete" in result.output
    assert history(manager, "C.drip") == ["registered", "params_done"]
    assert calls(manager, "/api/log-push"), "no log push was even tried"
    delivered = [kind for _, kind, state in outbox_rows(sup) if state == "delivered"]
    assert delivered[:2] == ["register", "param-done"], delivered


def test_a_stuck_call_does_not_hold_up_another_threads_call(manager: DevManager) -> None:
    """The log shipper and the outbox sender share one client: each call has a connection of its own."""
    faults(manager, drip_bytes_per_s=1, path="/api/log-push")  # a 46-byte answer: 46 s
    client = ManagerClient(ManagerSpec(url=manager.url, label="C.two", connect_timeout_s=1.0, read_timeout_s=4.0))
    stuck_outcome: list[BaseException | None] = []

    def push() -> None:
        try:
            client.request("POST", "/api/log-push", data=b"line\n", expect="ok",
                           headers={"X-Instance-UUID": "u-1", "X-Log-Source": "setup"})
            stuck_outcome.append(None)
        except TransientError as exc:
            stuck_outcome.append(exc)

    stuck = threading.Thread(target=push, daemon=True)
    stuck.start()
    wait_for(lambda: calls(manager, "/api/log-push"), 10)  # its answer is dripping now
    answers: list[Any] = []
    other = threading.Thread(target=lambda: answers.append(
        client.request("POST", "/register", json_body={"label": "C.two", "min_rate": 1})), daemon=True)
    other.start()
    other.join(20)
    assert answers and answers[0].status == 200, "the register waited on the stuck push"
    assert stuck.is_alive(), "the dripped push ended before the register did: nothing was proven"
    stuck.join(30)
    assert not stuck.is_alive(), "the stuck push outlived its deadline"
    assert isinstance(stuck_outcome[0], TransientError)
    assert "no complete answer within 5s" in str(stuck_outcome[0])


# ---------------------------------------------------------------- redirects


@pytest.mark.parametrize(("path", "status"), [("/param-done", 302), ("/api/log-push", 307), ("/register", 301)])
def test_a_redirect_is_not_delivered_and_the_call_goes_once_the_manager_behaves(
        sup: Runner, manager: DevManager, path: str, status: int) -> None:
    faults(manager, redirect=status, location=f"{manager.url}/elsewhere{path}", count=2, path=path)
    label = f"C.redirect{status}"
    config = sup.write(manager_table(manager.url, label) + f"""
[[phases]]
name = "params"
kind = "oneshot"
command = {sh("echo marker-line-before-param-done")}
report = "param-done"
""" + SERVICE)
    proc = Console(sup, config)
    wait_for(lambda: history(manager, label) == ["registered", "params_done", "running"], 40, 0.1)
    wait_for(lambda: "marker-line-before-param-done" in json.dumps(manager.state.snapshot()["logs"]), 20, 0.1)
    wait_for(lambda: not [r for r in outbox_rows(sup) if r[2] == "pending"], 20, 0.1)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(30) == 128 + signal.SIGTERM
    out = proc.text()
    said = f"the manager answered {status} → {manager.url}/elsewhere{path}: redirects are not followed; " \
           "check [manager] url"
    assert [line for line in out.splitlines() if f"manager: POST {path}: {said}" in line], out
    assert out.count(f"[supervisor] manager: POST {path}: the manager answered") == 1, "said once, the first time"
    assert len([c for c in calls(manager, path) if c["status"] == status]) == 2
    assert not calls(manager, f"/elsewhere{path}"), "the redirect was followed"
    assert not [r for r in outbox_rows(sup) if r[2] == "failed"], "a redirected call was given up"


# ---------------------------------------------------------------- a huge answer


def peak_rss(pid: int) -> int:
    """The process's high-water RSS (VmHWM): what it ever held, not what it holds now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_a_huge_answer_is_not_read_into_memory(sup: Runner, manager: DevManager) -> None:
    faults(manager, huge_body_bytes=HUGE_ANSWER_BYTES, count=1, path="/register")
    config = sup.write(manager_table(manager.url, "C.huge") + SERVICE)
    proc = Console(sup, config)
    proc.wait_text("manager: registered: uuid", 40)
    peak = peak_rss(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(30) == 128 + signal.SIGTERM
    assert "manager: register not delivered (POST /register: answer larger than 64 KiB)" in proc.text()
    assert peak < RSS_BOUND_BYTES, f"the supervisor's RSS peaked at {peak / 2**20:.0f} MiB"


# ---------------------------------------------------------------- register answers a child cannot carry

UNUSABLE = "the manager answered /register with an unusable "
# name → (the answer, what the retry line says)
BAD_REGISTER_ANSWERS: dict[str, tuple[Any, str]] = {
    "a-dict": ({"uuid": {"a": 1}, "runner_id": 1}, UNUSABLE + "uuid: not a string"),
    "true": (True, UNUSABLE + "answer: not a JSON object"),
    "cr-lf": ({"uuid": "c0ffee\r\nX-Evil: 1", "runner_id": 1}, UNUSABLE + "uuid: not 1..128 of letters"),
    "nul": ({"uuid": "c0ffee\u0000tail", "runner_id": 1}, UNUSABLE + "uuid: not 1..128 of letters"),
    "129-chars": ({"uuid": "c" * 129, "runner_id": 1}, UNUSABLE + "uuid: 129 characters, more than 128"),
    "200-kb": ({"uuid": "c" * 200_000, "runner_id": 1}, "POST /register: answer larger than 64 KiB"),
    "runner-id-text": ({"uuid": "c0ffee", "runner_id": "NaN"}, UNUSABLE + "runner_id is not a whole number"),
    "runner-id-huge": ({"uuid": "c0ffee", "runner_id": 2**64}, UNUSABLE + "runner_id out of range"),
}


@pytest.mark.parametrize("bad", list(BAD_REGISTER_ANSWERS))
def test_a_bad_register_answer_is_never_kept_or_exported(sup: Runner, manager: DevManager,
                                                         bad: str) -> None:
    answer, said = BAD_REGISTER_ANSWERS[bad]
    faults(manager, answer=answer, count=1, path="/register")
    seen = sup.tmp / "seen.txt"
    # Each attempt notes what it was given; without a uuid yet it fails and is retried.
    record = sh(f'printf "%s|%s\\n" "$INSTANCE_UUID" "$RUNNER_ID" >> {seen}; [ -n "$INSTANCE_UUID" ]')
    config = sup.write(manager_table(manager.url, f"C.bad-{bad}") + f"""
[[phases]]
name = "record"
kind = "oneshot"
command = {record}
retries = 200
backoff_s = 0.1
backoff_max_s = 0.2
""")
    result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    inst = next(iter(manager.state.snapshot()["instances"].values()))
    lines = seen.read_text().splitlines()
    # Children were spawned every time (no exec failure), and saw nothing or the real identity.
    assert lines[-1] == f"{inst['uuid']}|{inst['runner_id']}", lines
    assert set(lines) <= {"|", lines[-1]}, f"a child was given {set(lines) - {'|', lines[-1]}}"
    assert f"manager: register not delivered ({said}" in result.output
    with_uuid = [line for line in result.output.splitlines() if "uuid" in line]
    assert not [line for line in with_uuid if "c0ffee" in line and "not delivered" not in line]
    import sqlite3

    with sqlite3.connect(sup.state_dir / "outbox.sqlite3") as db:
        facts = dict(db.execute("SELECT key, value FROM facts").fetchall())
    assert facts["uuid"] == inst["uuid"] and UUID_RE.fullmatch(facts["uuid"])


def test_a_bad_uuid_kept_by_an_earlier_start_is_dropped_and_registered_afresh(sup: Runner,
                                                                              manager: DevManager) -> None:
    import sqlite3

    from supervisor.manager.outbox import Outbox

    sup.state_dir.mkdir(parents=True)
    box = Outbox(sup.state_dir / "outbox.sqlite3", print)
    box.put("label", "C.kept")
    box.put("uuid", "left\nover")  # what an older supervisor kept of a garbage answer
    box.put("runner_id", "None")
    box.close()
    seen = sup.tmp / "seen.txt"
    record = sh(f'printf "%s\\n" "$INSTANCE_UUID" >> {seen}; [ -n "$INSTANCE_UUID" ]')
    config = sup.write(manager_table(manager.url, "C.kept") + f"""
[[phases]]
name = "record"
kind = "oneshot"
command = {record}
retries = 200
backoff_s = 0.1
backoff_max_s = 0.2
""")
    result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    assert "manager: the identity kept from an earlier start is unusable" in result.output
    assert "registering afresh" in result.output
    inst = next(iter(manager.state.snapshot()["instances"].values()))
    assert set(seen.read_text().splitlines()) <= {"", inst["uuid"]}
    with sqlite3.connect(sup.state_dir / "outbox.sqlite3") as db:
        assert dict(db.execute("SELECT key, value FROM facts").fetchall())["uuid"] == inst["uuid"]


# ---------------------------------------------------------------- Retry-After

RETRY_AFTER_S = 4


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_waited_out(sup: Runner, manager: DevManager, status: int) -> None:
    faults(manager, status=status, retry_after=RETRY_AFTER_S, count=1, path="/register")
    config = sup.write(manager_table(manager.url, f"C.later{status}") + SERVICE)
    proc = Console(sup, config)
    proc.wait_text("manager: registered: uuid", 40)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(30) == 128 + signal.SIGTERM
    first, second = calls(manager, "/register")[:2]
    assert (first["status"], second["status"]) == (status, 200)
    # A lower bound only (the backoff alone would have retried within 1.5 s); a little slack for the clocks.
    assert second["time"] - first["time"] >= RETRY_AFTER_S - 0.2, (first, second)
    assert f"retry 1 in {RETRY_AFTER_S}." in proc.text()



@pytest.mark.parametrize("status", [408, 425])
def test_a_call_answered_not_yet_is_sent_again(sup: Runner, manager: DevManager, status: int) -> None:
    """408 (the request came too slowly: a proxy in front of the manager) and 425 (too early) say the call was not
    taken: sent again, not failed for good. A param-done lost so would leave the row in registered, and the
    manager's 90-minute fetch clock would kill a healthy instance."""
    faults(manager, status=status, count=1, path="/param-done")
    label = f"C.notyet{status}"
    config = sup.write(manager_table(manager.url, label) + f"""
[[phases]]
name = "fetch"
command = {sh("echo fetched")}
report = "param-done"
""" + SERVICE)
    proc = Console(sup, config)
    wait_for(lambda: "running" in history(manager, label), 40)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(30) == 128 + signal.SIGTERM
    assert [c["status"] for c in calls(manager, "/param-done")] == [status, 200]
    assert history(manager, label) == ["registered", "params_done", "running"], history(manager, label)
    assert f"HTTP {status}" in proc.text() and "refused for good" not in proc.text(), proc.tail()

# ---------------------------------------------------------------- a password in the URL

PASSWORD = "Pa55w0rd-never-shown"
USER = "fleet"


class _AuthRecorder(_Handler):
    """The dev-manager's handler, noting each API call's Authorization header."""

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok and not self.path.startswith("/dev/"):
            self.server.seen_auth.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        return ok


def test_a_password_in_the_url_is_shown_nowhere_and_still_sent(sup: Runner, manager: DevManager) -> None:
    manager._server.RequestHandlerClass = _AuthRecorder
    manager._server.seen_auth = []  # type: ignore[attr-defined]
    host = manager.url.removeprefix("http://")
    url = f"http://{USER}:{PASSWORD}@{host}"
    # The manager redirects once to a Location that carries the password too: error lines quote it.
    faults(manager, redirect=302, location=f"{url}/moved", count=1, path="/register")
    config = sup.write(f"""
[manager]
label = "C.password"
log_push_interval_s = 0.2

[[phases]]
name = "leak"
kind = "oneshot"
command = {sh('echo "my manager is $MANAGER_URL"; echo "the password is ' + PASSWORD + '"')}
""" + SERVICE)
    proc = Console(sup, config, env={"MANAGER_URL": url})
    wait_for(lambda: history(manager, "C.password")[-1:] == ["running"], 40, 0.1)
    wait_for(lambda: "the password is" in json.dumps(manager.state.snapshot()["logs"]), 20, 0.1)
    places = {"status": _cli(sup, "status"), "status --json": _cli(sup, "status", "--json")}
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(30) == 128 + signal.SIGTERM
    out = proc.text()
    places["console"] = out
    places["status after exit"] = _cli(sup, "status")
    for root in (sup.state_dir, sup.log_dir):
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            places[str(path.relative_to(sup.tmp))] = path.read_bytes().decode("utf-8", errors="replace")
    snapshot = manager.state.snapshot()
    places["pushed logs"] = json.dumps(snapshot["logs"])
    places["calls"] = json.dumps(snapshot["calls"])
    assert {"state/status.json", "state/outbox.sqlite3", "logs/supervisor.log", "logs/leak.log"} <= set(places)
    leaks = [name for name, text in places.items() if PASSWORD in text]
    assert not leaks, f"the password appears in {leaks}"
    # Shown masked where a URL is shown; masked in what a child prints.
    assert f"manager: http://{USER}:***@{host} as label 'C.password'" in out
    assert f"manager: POST /register: the manager answered 302 → http://{USER}:***@{host}/moved" in out
    assert "the password is ***" in out and "my manager is http://***@" in out
    assert f"http://{USER}:***@{host}" in places["status"] and f"http://{USER}:***@{host}" in places["status --json"]
    # ... and it still works: every API call carried it as basic auth.
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert set(manager._server.seen_auth) == {basic}  # type: ignore[attr-defined]


def _cli(sup: Runner, *args: str) -> str:
    done = subprocess.run([PY, "-m", "supervisor", *args, "--state-dir", str(sup.state_dir)], capture_output=True,
                          text=True, errors="replace", env=clean_env(), cwd=REPO, timeout=30)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout + done.stderr
