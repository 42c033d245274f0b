"""The manager's own view (manager/row.py, rowwatch.py): its row, read from ``GET /status``, decides.

Real supervisors against the dev-manager on 127.0.0.1, which serves ``GET /status`` and the UI's kill as the
real one does (its times ``YYYY-MM-DD HH:MM:SS`` UTC) and lets a test set a row as the manager's monitor would
(``POST /dev/row``). A killed row ends the instance (exit 80) with no lifecycle call that could un-kill it; a
404 on ``/running`` from a killed row is not taken for a forgotten uuid; a row registered longer ago than the
fetch deadline is given up at once; a uuid forgotten at any stage (during the fetch, after ``param-done``,
after ``running``) is registered again, once, and the last lifecycle call delivered sent again under the new one.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import PY, REPO, Console, Runner, sh, toml_str, wait_for

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_GIVEN_UP, EXIT_KILLED, EXIT_TIMEOUT
from supervisor.state import files as state_files
from supervisor.status.socket import query

WAIT_S = 60  # upper bounds against hanging, never measures
LABEL = "C.4711"
FETCH_TIMEOUT = "param fetch timeout (90min)"


def waiting(go: Path) -> str:
    return f"while [ ! -e {go} ]; do sleep 0.05; done; "


def config(sup: Runner, mgr: DevManager, go: Path, then: Path | None = None, extra: str = "",
           service: str = "echo serving; exec sleep 0.5") -> Path:
    """A fetch reporting param-done once ``go`` exists, a step waiting for ``then``, a service reporting running."""
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "{LABEL}"
        log_push_interval_s = 0.2
        {extra}

        [[phases]]
        name = "fetch"
        command = {sh(waiting(go) + "echo fetched")}
        report = "param-done"

        [[phases]]
        name = "between"
        command = {sh((waiting(then) if then else "") + "echo on")}

        [[phases]]
        name = "service"
        kind = "service"
        command = {sh(service)}
        report = "running"
        """)


def post(mgr: DevManager, path: str, body: dict[str, Any]) -> None:
    answer = requests.post(mgr.url + path, json=body, timeout=5)
    assert answer.status_code == 200, answer.text


def instances(mgr: DevManager) -> list[dict[str, Any]]:
    return list(mgr.state.snapshot()["instances"].values())


def lifecycle_calls(mgr: DevManager) -> list[tuple[str, int]]:
    return [(c["path"], c["status"]) for c in mgr.state.snapshot()["calls"]
            if c["path"] in ("/register", "/param-done", "/bench-done", "/running")]


def reads(mgr: DevManager) -> int:
    return len(mgr.state.snapshot()["reads"])


def row_read(sup: Runner) -> dict[str, Any] | None:
    """The row as the running supervisor last read it (its status socket); None: none read, or none running."""
    snap = query(sup.state_dir) or {}
    reading = (snap.get("manager") or {}).get("row") or {}
    return reading.get("row")


def read_back(sup: Runner, state: str) -> None:
    """Wait until the supervisor has read its row in ``state``: a change the test makes next lands after that read
    (the one right after a lifecycle call)."""
    wait_for(lambda: (row_read(sup) or {}).get("state") == state, WAIT_S)


def test_a_kill_mid_fetch_ends_the_instance_and_no_call_un_kills_it(sup: Runner, manager: DevManager) -> None:
    go = sup.tmp / "go"
    proc = Console(sup, config(sup, manager, go))
    proc.wait_text("manager: registered: uuid")
    wait_for(lambda: reads(manager) >= 1, WAIT_S)  # read once the manager knows the instance
    [row] = instances(manager)
    post(manager, "/dev/row", {"uuid": row["uuid"], "state": "killed", "kill_reason": FETCH_TIMEOUT})
    go.touch()
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()
    out = proc.text()
    assert lifecycle_calls(manager) == [("/register", 200)], lifecycle_calls(manager)  # no param-done, no more
    killed_at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(instances(manager)[0]["killed_at"]))
    line = f"the manager killed this instance at {killed_at} UTC: {FETCH_TIMEOUT}"
    assert f"manager: {line}; nothing that could un-kill it goes out" in out, out
    assert f"manager: param-done not sent: {line}" in out, out
    assert f"shutting down: {line}" in out and "exiting with status 80" in out, out
    assert f"prover-supervisor: {line}" in manager.state.snapshot()["logs"][row["uuid"]]["setup"]
    assert instances(manager)[0]["state"] == "killed" and instances(manager)[0]["kill_reason"] == FETCH_TIMEOUT
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())
    assert snap["manager"]["killed"] == line, snap["manager"]
    assert snap["manager"]["row"]["row"]["state"] == "killed"
    shown = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                           capture_output=True, text=True, timeout=30, cwd=REPO).stdout
    assert shown.startswith(f"stopped: {line}; exit 80\n"), shown
    assert f"\n  cause: {line} (its row: state killed)\n" in shown, shown
    # Kept like a give-up: a restart runs nothing, and says whose word it was.
    again = Console(sup, config(sup, manager, go), name="again")
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert "this instance was given up at" in again.text() and FETCH_TIMEOUT in again.text(), again.tail()
    assert lifecycle_calls(manager) == [("/register", 200)]


def test_a_kill_from_the_ui_before_running_sends_no_running(sup: Runner, manager: DevManager) -> None:
    go, then = sup.tmp / "go", sup.tmp / "then"
    log = sup.tmp / "termination-log"
    log.write_text("")
    cfg = config(sup, manager, go, then)
    cfg.write_text(cfg.read_text().replace("[supervisor]\n", f"[supervisor]\ntermination_log = "
                                                              f"{toml_str(str(log))}\n", 1))
    proc = Console(sup, cfg)
    go.touch()
    wait_for(lambda: ("/param-done", 200) in lifecycle_calls(manager), WAIT_S)
    read_back(sup, "params_done")  # (the kill lands after the read that follows param-done: learnt before running)
    [row] = instances(manager)
    post(manager, "/api/kill", {"uuid": row["uuid"], "vast_id": 4711})
    then.touch()
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()
    assert lifecycle_calls(manager) == [("/register", 200), ("/param-done", 200)], lifecycle_calls(manager)
    assert "manager: running not sent: the manager killed this instance at " in proc.text(), proc.tail()
    assert log.read_text().startswith("exit status 80: the manager killed this instance at "), log.read_text()
    assert log.read_text().endswith(": manually killed via UI"), log.read_text()
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())
    assert snap["lifecycle"]["exit_status"] == EXIT_KILLED


def test_a_row_a_call_moved_on_after_its_kill_still_ends_the_instance(sup: Runner, manager: DevManager) -> None:
    """shared/domain/manager-api.md: a call after the kill (bench-done, which has no state check) moves a killed row
    back, and /running would then succeed, while killed_at and kill_reason stay and the machine is being destroyed.
    The row's kill fields say it was killed, whatever its state: no /running, exit 80."""
    go, then = sup.tmp / "go", sup.tmp / "then"
    proc = Console(sup, config(sup, manager, go, then))
    go.touch()
    wait_for(lambda: ("/param-done", 200) in lifecycle_calls(manager), WAIT_S)
    read_back(sup, "params_done")  # (the kill lands after the read that follows param-done: learnt before running)
    [row] = instances(manager)
    post(manager, "/dev/row", {"uuid": row["uuid"], "state": "params_done", "killed_at": time.time() - 30,
                               "kill_reason": "benchmark timeout (45min)"})
    then.touch()
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()
    assert lifecycle_calls(manager) == [("/register", 200), ("/param-done", 200)], lifecycle_calls(manager)
    out = proc.text()
    assert "manager: running not sent: the manager killed this instance at " in out, proc.tail()
    assert ": benchmark timeout (45min) (its row moved to params_done after the kill)" in out, proc.tail()
    assert instances(manager)[0]["state"] == "params_done"

def test_a_404_on_running_from_a_killed_row_is_not_taken_for_a_forgotten_uuid(sup: Runner,
                                                                              manager: DevManager) -> None:
    go, then = sup.tmp / "go", sup.tmp / "then"
    proc = Console(sup, config(sup, manager, go, then))
    go.touch()
    wait_for(lambda: ("/param-done", 200) in lifecycle_calls(manager), WAIT_S)
    [row] = instances(manager)
    # GET /status answers nothing usable from now on: only /running's 404 and /runner-id can tell.
    post(manager, "/dev/faults", {"status": 500, "count": -1, "path": "/status"})
    post(manager, "/api/kill", {"uuid": row["uuid"]})
    then.touch()
    assert proc.finish(WAIT_S) == EXIT_KILLED, proc.tail()
    out = proc.text()
    assert lifecycle_calls(manager) == [("/register", 200), ("/param-done", 200), ("/running", 404)]
    assert [c["status"] for c in manager.state.snapshot()["calls"] if c["path"].startswith("/runner-id?")] == [200]
    assert "registering again" not in out and len(instances(manager)) == 1, out
    assert "the manager killed this instance: not read: running answered HTTP 404" in out, out


def test_where_a_lifecycle_call_moved_the_row_is_read_at_once(sup: Runner, manager: DevManager) -> None:
    """The row is read right after each lifecycle call is delivered: status and the clocks go by where it moved the
    row, with the manager's time of it. Until the next periodic read (row_check_s, 300 s by default) a benching
    instance showed its row still registered, the fetch clock running on past its deadline and no clock after the
    fetch, and the prover's benchmark clock judged nothing."""
    go, then = sup.tmp / "go", sup.tmp / "then"
    proc = Console(sup, config(sup, manager, go, then))
    proc.wait_text("manager: registered: uuid")
    read_back(sup, "registered")
    go.touch()
    read_back(sup, "params_done")  # (WAIT_S bounds it; the periodic read was 300 s off)
    snap = query(sup.state_dir)
    assert snap is not None
    [row] = instances(manager)
    clocks = snap["manager"]["clocks"]
    assert "fetch" not in clocks, clocks  # the manager's fetch clock has stopped
    # The clock after the fetch (under the name the plugin gives it) counts from the row's own param_done_at.
    assert [(c["at"], c["source"]) for c in clocks.values()] == [(float(int(row["param_done_at"])),
                                                                   "the manager's param_done_at")], clocks
    then.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())
    assert snap["manager"]["row"]["row"]["state"] == "running", snap["manager"]["row"]
    assert snap["manager"]["clocks"] == {}, snap["manager"]["clocks"]


def test_a_lifecycle_call_queued_behind_another_reads_the_row_once_between_them(
        sup: Runner, manager: DevManager) -> None:
    """The read after a delivered call is left out where a lifecycle call comes next: that call reads the row before
    it goes, and a second GET in between only cost time (two per call within a give-up's 60 s against a slow
    manager). param-done is answered late, so running is queued behind it."""
    post(manager, "/dev/faults", {"path": "/param-done", "delay_s": 1.0, "count": 1})
    go = sup.tmp / "go"
    go.touch()
    proc = Console(sup, config(sup, manager, go))
    assert proc.finish(WAIT_S) == 0, proc.tail()
    snap = manager.state.snapshot()
    paths = [call["path"] for call in snap["calls"]]
    done, running = paths.index("/param-done") + 1, paths.index("/running") + 1  # (calls recorded by then)
    between = [read for read in snap["reads"] if done <= read["after"] < running]
    assert len(between) == 1, (paths, snap["reads"])


@pytest.mark.parametrize("ago_s", [5460, 5400 + 3600])
def test_a_row_registered_longer_ago_than_the_fetch_deadline_is_given_up_at_once(
        sup: Runner, manager: DevManager, ago_s: int) -> None:
    # The label's row was registered 91 (or 150) minutes ago: a new container (a fresh state_dir) joins it.
    first = requests.post(manager.url + "/register", json={"label": LABEL, "min_rate": 1}, timeout=5).json()
    post(manager, "/dev/row", {"uuid": first["uuid"], "registered_at": time.time() - ago_s})
    cache = sup.tmp / "cache"
    cache.mkdir()
    cfg = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "{LABEL}"
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        command = {sh("echo fetching; exec sleep 60")}
        report = "param-done"
        progress_path = {toml_str(str(cache))}
        progress_total = "1GiB"
        progress_deadline_s = 5400
        progress_window_s = 120
        stall_s = 600
        """)
    # The give-up's answer is held a while: status shows the fetch clock meanwhile (once the manager took the
    # give-up, the row is killed and no clock runs).
    post(manager, "/dev/faults", {"delay_s": 5, "path": "/bench-done", "count": 1})
    started = time.monotonic()
    proc = Console(sup, cfg)
    clock = wait_for(lambda: fetch_clock_of(sup, "the manager's registered_at"), WAIT_S)
    assert proc.finish(WAIT_S) == EXIT_TIMEOUT, proc.tail()
    assert time.monotonic() - started < 50, "not after the observation window, nor the fetch's own end"
    out = proc.text()
    assert "reason=too_slow" in out and "the manager's timeout (progress_deadline_s=5400 from the manager's " \
        "registered_at) passed" in out, out
    seen = json.loads(state_files.path(sup.state_dir, state_files.FIRST_SEEN).read_text())
    assert abs(seen["manager_registered_at"] - (time.time() - ago_s)) < 60, seen
    assert isinstance(clock, dict) and clock["source"] == "the manager's registered_at", clock
    assert clock["deadline_s"] == 5400
    [row] = instances(manager)
    assert row["uuid"] == first["uuid"] and row["state"] == "killed"  # the give-up went to the same row
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())
    assert snap["manager"]["row"]["row"]["state"] == "killed" and snap["manager"]["clocks"] == {}, snap["manager"]


def fetch_clock_of(sup: Runner, source: str) -> dict[str, Any] | None:
    """The fetch clock the running supervisor shows, once it counts from ``source``."""
    clock = (((query(sup.state_dir) or {}).get("manager") or {}).get("clocks") or {}).get("fetch")
    return clock if isinstance(clock, dict) and clock.get("source") == source else None


def test_a_uuid_forgotten_after_running_is_registered_again_once(sup: Runner, manager: DevManager) -> None:
    go = sup.tmp / "go"
    go.touch()
    proc = Console(sup, config(sup, manager, go, extra="row_check_s = 5", service="echo serving; exec sleep 120"))
    wait_for(lambda: ("/running", 200) in lifecycle_calls(manager), WAIT_S)
    [old] = [i["uuid"] for i in instances(manager)]
    post(manager, "/dev/forget", {})  # the manager's database was reset while the instance proves
    proc.wait_text("registering again", WAIT_S)
    wait_for(lambda: lifecycle_calls(manager).count(("/running", 200)) == 2, WAIT_S)
    [new] = [i["uuid"] for i in instances(manager)]
    assert new != old
    assert instances(manager)[0]["history"] == ["registered", "running"]
    out = proc.text()
    assert (f"manager: the manager no longer knows uuid {old} (forgotten: its GET /status does not "
            "list it, its /runner-id answers 404); registering again, once, and running sent again") in out, out
    wait_for(lambda: "registered again as" in manager.state.snapshot()["logs"].get(new, {}).get("setup", ""), WAIT_S)
    repushed = manager.state.snapshot()["logs"][new]["setup"]
    assert f"prover-supervisor: registered again as {new}: the manager no longer knew {old}" in repushed
    assert "[supervisor] manager: registered: uuid" in repushed  # the recent tail, under the new uuid
    # Forgotten again: not registered again a second time; shown as unknown to the manager.
    post(manager, "/dev/forget", {})
    reads_before = reads(manager)
    wait_for(lambda: reads(manager) >= reads_before + 2, WAIT_S)
    assert lifecycle_calls(manager).count(("/register", 200)) == 2
    live = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    snap = json.loads(live.stdout)
    assert snap["manager"]["row"]["shown"].startswith("unknown to the manager"), snap["manager"]["row"]
    text = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO).stdout
    assert "  the manager's row: unknown to the manager (its GET /status does not list this uuid)" in text, text
    # No row: none of the manager's clocks runs for it, and the forgotten row's registered_at is shown as none.
    assert "fetch clock:" not in text and "the manager's registered_at" not in text, text
    proc.proc.terminate()
    assert proc.finish(WAIT_S) == 143, proc.tail()


def test_a_uuid_forgotten_during_the_fetch_is_registered_again_at_the_next_read(sup: Runner,
                                                                              manager: DevManager) -> None:
    """Before any lifecycle call: the label is registered again at the next periodic read, not at param-done
    (up to 90 min later; a label on Vast that the manager never registered is killed after 15 min)."""
    go = sup.tmp / "go"
    proc = Console(sup, config(sup, manager, go, extra="row_check_s = 5"))
    proc.wait_text("manager: registered: uuid")
    wait_for(lambda: reads(manager) >= 1, WAIT_S)
    [old] = [i["uuid"] for i in instances(manager)]
    post(manager, "/dev/forget", {})  # the manager's database was reset while the fetch runs
    proc.wait_text("registering again", WAIT_S)
    wait_for(lambda: len(instances(manager)) == 1, WAIT_S)
    [new] = [i["uuid"] for i in instances(manager)]
    assert new != old and instances(manager)[0]["state"] == "registered"
    # (the dev-manager logs a call once it has answered it: the new row can be seen a moment before its call)
    wait_for(lambda: len(lifecycle_calls(manager)) >= 2, WAIT_S)
    assert lifecycle_calls(manager) == [("/register", 200), ("/register", 200)], "the fetch is still on"
    out = proc.text()
    assert (f"manager: the manager no longer knows uuid {old} (forgotten: its GET /status does not list it, its "
            "/runner-id answers 404); registering again, once\n") in out, out
    go.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()
    assert lifecycle_calls(manager) == [("/register", 200), ("/register", 200), ("/param-done", 200),
                                        ("/running", 200)], lifecycle_calls(manager)
    assert instances(manager)[0]["history"] == ["registered", "params_done", "running"]
    assert "refused for good" not in proc.text(), proc.tail()


def test_a_uuid_forgotten_after_param_done_is_registered_again_and_param_done_sent_again(
        sup: Runner, manager: DevManager) -> None:
    go, then = sup.tmp / "go", sup.tmp / "then"
    go.touch()
    proc = Console(sup, config(sup, manager, go, then, extra="row_check_s = 5"))
    wait_for(lambda: ("/param-done", 200) in lifecycle_calls(manager), WAIT_S)
    [old] = [i["uuid"] for i in instances(manager)]
    post(manager, "/dev/forget", {})  # reset while the next step runs: the new row must not sit in registered
    proc.wait_text("registering again", WAIT_S)
    wait_for(lambda: lifecycle_calls(manager).count(("/param-done", 200)) == 2, WAIT_S)
    [row] = instances(manager)
    assert row["uuid"] != old and row["state"] == "params_done", row
    assert (f"manager: the manager no longer knows uuid {old} (forgotten: its GET /status does not list it, its "
            "/runner-id answers 404); registering again, once, and param-done sent again under the new uuid"
            ) in proc.text(), proc.tail()
    then.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()
    assert lifecycle_calls(manager) == [("/register", 200), ("/param-done", 200), ("/register", 200),
                                        ("/param-done", 200), ("/running", 200)], lifecycle_calls(manager)
    assert instances(manager)[0]["history"] == ["registered", "params_done", "running"]
    # The outbox (and status's ledger, which lists it) keeps them in the order they went: the new register was
    # queued after the call sent again under it, and the ledger read out of order.
    with contextlib.closing(sqlite3.connect(state_files.path(sup.state_dir, state_files.OUTBOX))) as db:
        queued = [kind for (kind,) in db.execute("SELECT kind FROM calls WHERE kind != 'log' ORDER BY id")]
    assert queued == ["register", "param-done", "register", "param-done", "running"], queued


def test_a_row_watch_that_cannot_read_is_a_watch_status_shows_blind(sup: Runner, manager: DevManager) -> None:
    # It was said in the log, but status's watches never listed it: the only way to learn of the UI's kill or a
    # forget between lifecycle calls looked as well as any.
    go = sup.tmp / "go"
    proc = Console(sup, config(sup, manager, go, extra="row_check_s = 5"))
    proc.wait_text("manager: registered: uuid")
    post(manager, "/dev/faults", {"status": 404, "path": "/status"})
    proc.wait_text("row watch: no reading (GET /status: HTTP 404", WAIT_S)
    live = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    watch = json.loads(live.stdout)["watches"]["row watch"]
    assert watch["state"] == "blind" and watch["why"].startswith("GET /status: HTTP 404"), watch
    post(manager, "/dev/faults", {})
    go.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()


def test_a_row_time_from_the_future_is_refused_once_and_never_an_anchor(sup: Runner, manager: DevManager) -> None:
    first = requests.post(manager.url + "/register", json={"label": LABEL, "min_rate": 1}, timeout=5).json()
    post(manager, "/dev/row", {"uuid": first["uuid"], "registered_at": time.time() + 3600})
    go = sup.tmp / "go"
    go.touch()
    proc = Console(sup, config(sup, manager, go))
    assert proc.finish(WAIT_S) == 0, proc.tail()
    out = proc.text()
    assert reads(manager) >= 3  # at identity, before param-done, before running
    assert out.count("impossible, not used") == 1, out
    assert f"manager: the manager's row for {first['uuid']}: registered_at " in out, out
    seen = json.loads(state_files.path(sup.state_dir, state_files.FIRST_SEEN).read_text())
    assert "manager_registered_at" not in seen and "first_registered" in seen, seen


def test_after_registering_again_the_failure_reason_and_the_recent_tail_go_under_the_new_uuid(
        sup: Runner, manager: DevManager) -> None:
    go, tried = sup.tmp / "go", sup.tmp / "tried"
    cfg = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "{LABEL}"
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        # Fails once (its reason is pushed under the first uuid), then waits for go and reports param-done.
        command = {sh(f"if [ ! -e {tried} ]; then touch {tried}; echo first try broke; exit 3; fi; "
                      + waiting(go) + "echo fetched")}
        retries = 1
        backoff_s = 0.1
        report = "param-done"
        """)
    proc = Console(sup, cfg)
    proc.wait_text("reason=exit_code exit_code=3")
    [old] = [i["uuid"] for i in instances(manager)]
    wait_for(lambda: "FAILED: phase=fetch" in manager.state.snapshot()["logs"].get(old, {}).get("setup", ""), WAIT_S)
    post(manager, "/dev/forget", {})
    go.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()
    [new] = [i["uuid"] for i in instances(manager)]
    assert new != old and "(its /runner-id answers 404: the row is gone, not killed)" in proc.text(), proc.tail()
    setup = manager.state.snapshot()["logs"][new]["setup"]
    assert setup.count(f"prover-supervisor: registered again as {new}: the manager no longer knew {old}") == 1
    repushed = setup.partition("registered again as")[2]
    assert "prover-supervisor: FAILED: phase=fetch child=fetch" in repushed and "| first try broke" in repushed
    assert "[supervisor] manager: registered: uuid" in repushed, repushed
