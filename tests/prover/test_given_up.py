"""Given up stays given up: a restart on the same state_dir does not run a given-up instance again.

The real manager's bench-done has no state check: a restart that ran the lifecycle again under the same
uuid moved the killed row back to bench_done and running while the machine was being destroyed. The
give-up (and the manager's own passed: false) is remembered in state_dir; a later start delivers what is
still pending, says so in one line and exits 79 without starting a phase; ``run --fresh`` starts over.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import PY, REPO, Console, Runner, outbox_rows, sh, started, toml_str
from profilekit import BENCH_30_PER_H, ZERO_RATE_BENCH, fleet_config

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_GIVEN_UP
from supervisor.manager.outbox import Outbox
from supervisor.prover.reasons import EXIT_BENCH_REJECTED
from supervisor.state import files as state_files
from supervisor.state import givenup

WAIT_S = 90  # upper bounds against hanging, never measures


def config(sup: Runner, mgr: DevManager, label: str = "C.777") -> Path:
    """A fetch that fails with 4 (before production: the instance is given up), then a service."""
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        command = {sh("echo fetching; exit ${FETCH_STATUS:-4}")}
        report = "param-done"

        [[phases]]
        name = "service"
        kind = "service"
        command = {sh("echo serving; exec sleep 0.3")}
        report = "running"
        """)


def instances(mgr: DevManager) -> list[dict[str, Any]]:
    return list(mgr.state.snapshot()["instances"].values())


def paths(mgr: DevManager) -> list[str]:
    return [c["path"] for c in mgr.state.snapshot()["calls"] if c["path"] != "/api/log-push"]


def faults(mgr: DevManager, **body: Any) -> None:
    assert requests.post(mgr.url + "/dev/faults", json=body, timeout=5).status_code == 200


def test_a_given_up_instance_is_not_run_again_and_fresh_starts_over(sup: Runner,
                                                                   manager: DevManager) -> None:
    cfg = config(sup, manager)
    first = Console(sup, cfg, name="first")
    assert first.finish(WAIT_S) == 4, first.tail()
    assert "manager: giving the instance up" in first.text()
    assert (sup.state_dir / state_files.GIVEN_UP).exists()
    [inst] = instances(manager)
    assert inst["state"] == "killed"
    before = paths(manager)

    again = Console(sup, cfg, name="again", env={"FETCH_STATUS": "0"})  # it would pass now: it must not run
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    out = again.text()
    said = [line for line in out.splitlines() if "this instance was given up at " in line]
    assert len(said) == 1 and said[0].endswith("not running it again: start with --fresh or a new state_dir"), out
    assert "fetch: failed" in said[0] or "phase fetch failed" in said[0], said
    assert started(out) == [], out
    assert paths(manager) == before, "the given-up instance called the manager again"
    assert [i["state"] for i in instances(manager)] == ["killed"]

    fresh = Console(sup, cfg, name="fresh", env={"FETCH_STATUS": "0"}, args=("--fresh",))
    assert fresh.finish(WAIT_S) == 0, fresh.tail()
    out = fresh.text()
    assert "starting over (--fresh): the give-up (" in out and "registering afresh" in out, out
    assert not (sup.state_dir / state_files.GIVEN_UP).exists()
    states = sorted(i["state"] for i in instances(manager))
    assert states == ["killed", "running"], states  # a new row; the killed one stays killed


def test_a_refused_start_keeps_why_it_was_given_up_and_changes_no_state(sup: Runner, manager: DevManager) -> None:
    """A start refused with 79 said only "given up by an earlier start": status and the termination log lost why,
    restart after restart. And ``run --rebench`` refused still dropped the bench's pass from resume.json first."""
    term = sup.tmp / "termination-log"
    term.touch()
    cfg = sup.write(sup.header(extra=f"termination_log = {toml_str(str(term))}") + f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.783"
        min_rate = 1
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        command = {sh("echo fetched")}
        report = "param-done"

        [[phases]]
        name = "bench"
        command = {sh(f"printf '{BENCH_30_PER_H}'")}
        parse = "cuzk-bench"
        report = "bench-done"
        resume = "machine"

        [[phases]]
        name = "setup"
        command = {sh("echo setting up; exit 3")}
        """, header=False)
    first = Console(sup, cfg, name="first")
    assert first.finish(WAIT_S) == 3, first.tail()
    resumed = state_files.path(sup.state_dir, state_files.RESUME).read_bytes()
    assert b'"bench"' in resumed

    again = Console(sup, cfg, name="again", args=("--rebench",))
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert state_files.path(sup.state_dir, state_files.RESUME).read_bytes() == resumed  # the pass is still there
    why = re.compile(r"this instance was given up by an earlier start, \d+s before this one \(\d{4}-\d\d-\d\d "
                     r"\d\d:\d\d:\d\d UTC\): phase setup failed: exit_code; bench-done with rate 0 asked the "
                     r"manager to destroy it")
    assert re.fullmatch(r"exit status 79: " + why.pattern, term.read_text()), term.read_text()
    shown = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                           capture_output=True, text=True, timeout=30).stdout
    assert re.match(r"stopped: " + why.pattern + r"; exit 79\n", shown), shown


def test_a_stop_signal_during_a_failed_attempts_stop_gives_up_for_the_failure(sup: Runner,
                                                                              manager: DevManager) -> None:
    """The fetch failed for good while its daemon, deaf to SIGTERM, ran out its grace, and docker stop came then:
    the failure came first, so the give-up, the next start's refusal and status name it, not the signal (they said
    "received SIGTERM: exit_code")."""
    cfg = sup.write(sup.header(extra="stop_budget_s = 3") + f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.784"
        min_rate = 1

        [[phases]]
        name = "fetch"
        command = {sh("sleep 0.5; exit 5")}
          [[phases.daemons]]
          name = "deaf"
          command = {sh("trap '' TERM; echo deaf; while :; do sleep 0.1; done")}
          stop_grace_s = 30
        """, header=False)
    first = Console(sup, cfg, name="first")
    first.wait_text("stopping fetch/deaf (phase attempt over)", WAIT_S)
    os.kill(first.pid, signal.SIGTERM)
    assert first.finish(WAIT_S) == 5, first.tail()
    out = first.text()
    assert "shutting down: phase fetch failed (received SIGTERM while its attempt was being stopped)" in out, out
    assert "manager: giving the instance up (phase fetch failed)" in out, out
    marker = json.loads((sup.state_dir / state_files.GIVEN_UP).read_text())
    assert marker["reason"].startswith("phase fetch failed: exit_code; bench-done with rate 0"), marker

    again = Console(sup, cfg, name="again")
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert "(phase fetch failed: exit_code; " in again.text() and "SIGTERM" not in again.text(), again.tail()


def test_a_give_up_still_pending_goes_out_before_the_refusal(sup: Runner, manager: DevManager) -> None:
    cfg = config(sup, manager)
    faults(manager, status=503, count=-1, path="/bench-done")  # the give-up cannot be delivered
    first = Console(sup, cfg, name="first")
    first.wait_text("for the give-up to be delivered")
    os.kill(first.pid, signal.SIGKILL)  # killed before it got through
    first.proc.wait(10)
    assert (sup.state_dir / state_files.GIVEN_UP).exists(), "remembered before the call was delivered"
    assert [i["state"] for i in instances(manager)] == ["registered"]
    faults(manager)  # the manager answers again

    again = Console(sup, cfg, name="again", env={"FETCH_STATUS": "0"})
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    out = again.text()
    assert started(out) == [], out
    [inst] = instances(manager)
    assert inst["state"] == "killed" and inst["rate"] == 0, inst  # the give-up went out, under the same uuid
    assert paths(manager)[-1] == "/bench-done"
    assert "registered: uuid" not in out


def test_a_give_up_does_not_wait_for_good_behind_a_log_route_that_fails(sup: Runner, manager: DevManager) -> None:
    """The manager answers every /api/log-push with 500 (its log store broken) and every other route well. The
    give-up queued behind the reason lines' durable push waited behind it for the whole exit flush and was never
    delivered: the failed instance was left to the manager's 90 minutes. The give-up goes first now; the reason
    lines stay pending, tried after it."""
    faults(manager, path="/api/log-push", status=500, count=-1)
    first = Console(sup, config(sup, manager, label="C.780"))
    assert first.finish(WAIT_S) == 4, first.tail()
    out = first.text()
    assert re.search(r"manager: log push \d+ answered 3 times in a row that its route fails \(POST /api/log-push: "
                     r"HTTP 500: .*\): the calls behind it go first, then it again", out), out
    [inst] = instances(manager)
    assert inst["state"] == "killed", inst
    pending = [kind for _, kind, state in outbox_rows(sup) if state == "pending"]
    assert pending and set(pending) == {"log"}, pending


def production_fails(sup: Runner, mgr: DevManager, label: str) -> Path:
    """A fetch, then production that comes up and fails for good (not restarted): the instance is given up."""
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        command = {sh("echo fetched")}
        report = "param-done"

        [[phases]]
        name = "service"
        kind = "service"
        restart = "no"
        command = {sh("echo serving; sleep 1; exit 3")}
        report = "running"
        """)


@pytest.mark.parametrize("fails", ["fetch", "production"])
def test_after_a_give_up_the_manager_took_status_shows_the_row_killed_and_no_clock(
        sup: Runner, manager: DevManager, fails: str) -> None:
    """The row is read right after the give-up is delivered: status shows it killed, in the manager's words, and
    no clock of the manager's running. It showed the row as read before the give-up (registered, running) and the
    fetch clock running on, while the manager had killed the row. That kill is the give-up's consequence, not the
    run's cause: the cause status gives stays the failure (``manager.killed`` is for the manager's own kill)."""
    label = f"C.79{len(fails)}"
    cfg = config(sup, manager, label) if fails == "fetch" else production_fails(sup, manager, label)
    first = Console(sup, cfg)
    assert first.finish(WAIT_S) == (4 if fails == "fetch" else 3), first.tail()  # (the child's exit status)
    assert f"giving the instance up (phase {'fetch' if fails == 'fetch' else 'service'} failed)" in first.text()
    [inst] = instances(manager)
    assert inst["state"] == "killed", inst
    snap = json.loads(state_files.path(sup.state_dir, state_files.STATUS_FILE).read_text())["manager"]
    assert snap["row"]["row"]["state"] == "killed", snap["row"]
    assert snap["row"]["row"]["kill_reason"] == inst["kill_reason"], (snap["row"], inst)
    assert snap["clocks"] == {} and snap["killed"] is None, snap
    text = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO).stdout
    assert "\n  the manager's row: state killed (the manager killed this instance at " in text, text
    assert " clock: from " not in text and "cause: the manager killed" not in text, text


def test_fresh_runs_the_new_row_on_its_own_clocks(sup: Runner, manager: DevManager) -> None:
    """--fresh removed first-seen.json only after the lifecycle had loaded it: the old instance's times, two hours
    old, lived on in memory, were saved again, and a fetch deadline counted from them gave the new row up."""
    sup.state_dir.mkdir(parents=True, exist_ok=True)
    givenup.remember(sup.state_dir, "rate 0", "C.782")
    old = time.time() - 7200
    state_files.path(sup.state_dir, state_files.FIRST_SEEN).write_text(
        json.dumps({"first_start": old, "first_registered": old, "manager_registered_at": old}))
    fresh = Console(sup, config(sup, manager, label="C.782"), env={"FETCH_STATUS": "0"}, args=("--fresh",))
    assert fresh.finish(WAIT_S) == 0, fresh.tail()
    assert "starting over (--fresh): the give-up (rate 0) is forgotten" in fresh.text()
    kept = json.loads(state_files.path(sup.state_dir, state_files.FIRST_SEEN).read_text())
    assert kept["first_start"] > old + 7000 and kept.get("first_registered", old) > old + 7000, kept


def rejected_bench(sup: Runner, mgr: DevManager, label: str, gate_s: float, then: str = "") -> Path:
    """A bench of rate 0 under a min_rate no bench makes (the manager answers passed: false), then ``then``."""
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1000000
        bench_gate_s = {gate_s:g}

        [[phases]]
        name = "bench"
        command = {sh(f"printf '{ZERO_RATE_BENCH}'")}
        parse = "cuzk-bench"
        report = "bench-done"
        """ + then)


def test_passed_false_is_remembered_too(sup: Runner, manager: DevManager) -> None:
    """The manager itself killed the instance (a bench below min_rate): a restart must not un-kill it."""
    cfg = rejected_bench(sup, manager, "C.778", gate_s=5, then=f"""
        [[phases]]
        name = "service"
        kind = "service"
        command = {sh("exec sleep 0.3")}
        report = "running"
        """)
    first = Console(sup, cfg, name="first")
    assert first.finish(WAIT_S) == EXIT_BENCH_REJECTED, first.tail()
    assert (sup.state_dir / state_files.GIVEN_UP).exists(), first.tail()
    again = Console(sup, cfg, name="again")
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert "passed: false" in next(line for line in again.text().splitlines() if "was given up at" in line)


def test_passed_false_answered_during_the_exit_flush_is_the_runs_status(sup: Runner, manager: DevManager) -> None:
    """The bench is the last phase and the manager slow: the gate's second runs out, the run completes, and
    bench-done is answered ``passed: false`` during the exit flush. The manager is destroying the instance: the
    run exits 69 after all (the rejection was dropped, as a shutdown asked of a run already ending, and it
    exited 0 with the instance given up)."""
    assert requests.post(manager.url + "/dev/faults", json={"delay_s": 3, "path": "/bench-done", "count": 1},
                         timeout=5).status_code == 200
    cfg = rejected_bench(sup, manager, "C.779", gate_s=1)
    console = Console(sup, cfg)
    assert console.finish(WAIT_S) == EXIT_BENCH_REJECTED, console.tail()
    out = console.text()
    assert "exiting with status 0" in out and "the manager rejected the benchmark" in out, out
    assert f"exiting with status {EXIT_BENCH_REJECTED} after all: the manager rejected the benchmark" in out, out
    assert (sup.state_dir / state_files.GIVEN_UP).exists(), out


# ---------------------------------------------------------------- what a restart finds in the state_dir


def registered(mgr: DevManager, label: str) -> str:
    """A row the manager has for ``label`` (as an earlier start left it): its uuid."""
    answer = requests.post(mgr.url + "/register", json={"label": label, "min_rate": 1}, timeout=5)
    answer.raise_for_status()
    return str(answer.json()["uuid"])


def left_by_an_earlier_start(sup: Runner, label: str, uuid: str, *calls: tuple[str, dict[str, Any]]) -> None:
    """The outbox an earlier start left: its identity and the calls still pending."""
    sup.state_dir.mkdir(parents=True, exist_ok=True)
    box = Outbox(sup.state_dir / state_files.OUTBOX)
    box.put("label", label)
    box.put("uuid", uuid)
    for kind, payload in calls:
        box.add(kind, payload)
    box.close()


def test_a_lifecycle_call_left_pending_before_a_kill_is_not_sent_when_the_row_cannot_be_read(
        sup: Runner, manager: DevManager) -> None:
    """A bench that passed, its bench-done (and running) still pending while the manager was away; the manager
    killed the row and the supervisor learnt it (remembered), then was restarted. The restart's look-up before
    bench-done fails (the manager's GET /status answers 503): the bench-done went out all the same, and the
    manager, which has no state check on it, moved the killed row back to bench_done."""
    uuid = registered(manager, "C.777")
    requests.post(manager.url + "/dev/row", json={"uuid": uuid, "state": "killed", "kill_reason": "manual"},
                  timeout=5).raise_for_status()
    left_by_an_earlier_start(sup, "C.777", uuid, ("bench-done", {"rate": 120.0}), ("running", {}))
    givenup.remember(sup.state_dir, "the manager killed this instance (manual)", "C.777")  # (a kill: no call)
    faults(manager, status=503, count=-1, path="/status")
    before = paths(manager)

    again = Console(sup, config(sup, manager), name="again", env={"FETCH_STATUS": "0"})
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    out = again.text()
    assert started(out) == [], out
    assert paths(manager) == before, "a call left pending before the kill went out"
    assert [i["state"] for i in instances(manager)] == ["killed"]
    assert ("manager: 2 call(s) left pending before the give-up (bench-done, running) are not sent: they could "
            "move the row back") in out, out
    kinds = {kind: state for _, kind, state in outbox_rows(sup, logs=False)}
    assert kinds == {"bench-done": "failed", "running": "failed"}, kinds


def test_an_older_markers_pending_calls_all_go_as_they_did(sup: Runner, manager: DevManager) -> None:
    """A marker an older version wrote names no call: its give-up, still pending, cannot be told from the other
    calls, and goes out (the look-up before each call stays the guard), as before."""
    uuid = registered(manager, "C.777")
    left_by_an_earlier_start(sup, "C.777", uuid, ("bench-done", {"rate": 0.0, "failed": True, "reason": "r"}))
    givenup.marker(sup.state_dir).write_text(json.dumps({"at": time.time(), "reason": "phase fetch failed"}))

    again = Console(sup, config(sup, manager), name="again", env={"FETCH_STATUS": "0"})
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert "are not sent" not in again.text()
    [inst] = instances(manager)
    assert inst["state"] == "killed" and inst["rate"] == 0, inst


def test_a_give_up_remembered_but_never_queued_is_queued_by_the_next_start(sup: Runner,
                                                                            manager: DevManager) -> None:
    """The marker is written, with its call, before the call is queued: a SIGKILL between the two left a start
    with nothing pending, and the manager was never told (its row waited for its own timeout, billed). The next
    start queues it, delivers it, and a start after that does not send it again."""
    uuid = registered(manager, "C.777")
    left_by_an_earlier_start(sup, "C.777", uuid, ("bench-done", {"rate": 120.0}))
    give_up = {"rate": 0.0, "failed": True, "reason": "phase service failed for good"}
    givenup.remember(sup.state_dir, "production failed for good", "C.777", ("bench-done", give_up))

    again = Console(sup, config(sup, manager), name="again", env={"FETCH_STATUS": "0"})
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    out = again.text()
    assert ("manager: the give-up's bench-done was never queued (the supervisor was stopped between remembering "
            "it and queueing it): queued now") in out, out
    assert "manager: 1 call(s) left pending before the give-up (bench-done) are not sent" in out, out
    [inst] = instances(manager)
    assert inst["state"] == "killed" and inst["rate"] == 0, inst  # the give-up, not the passing rate before it
    assert paths(manager).count("/bench-done") == 1, paths(manager)

    third = Console(sup, config(sup, manager), name="third")
    assert third.finish(WAIT_S) == EXIT_GIVEN_UP, third.tail()
    assert "never queued" not in third.text()
    assert paths(manager).count("/bench-done") == 1, paths(manager)


def test_a_state_dir_of_another_label_benches_the_new_row(sup: Runner, manager: DevManager) -> None:
    """The volume of C.111, whose bench passed, attached to C.222: the bench's answer was C.111's row's. Read as
    this instance's, the new row was never benched: it went from params_done to running without a rate."""
    first = Console(sup, fleet_config(sup, manager.url, "C.111", BENCH_30_PER_H), name="first")
    assert first.finish(WAIT_S) == 0, first.tail()

    second = Console(sup, fleet_config(sup, manager.url, "C.222", BENCH_30_PER_H), name="second")
    assert second.finish(WAIT_S) == 0, second.tail()
    out = second.text()
    assert "bench-done was delivered and passed before this restart" not in out, out
    rows = {i["label"]: i for i in instances(manager)}
    assert rows["C.222"]["state"] == "running" and rows["C.222"]["rate"] == 30, rows["C.222"]
    assert "bench_done" in rows["C.222"]["history"], rows["C.222"]


def test_another_labels_give_up_does_not_strand_this_instance(sup: Runner, manager: DevManager) -> None:
    """C.777 was given up; its volume attached to C.888 (a new instance, a new row to the manager): C.888 was
    registered and then refused to run, exit 79, and waited for the manager's timeout. Its marker is set aside."""
    first = Console(sup, config(sup, manager, "C.777"), name="first")
    assert first.finish(WAIT_S) == 4, first.tail()

    second = Console(sup, config(sup, manager, "C.888"), name="second", env={"FETCH_STATUS": "0"})
    assert second.finish(WAIT_S) == 0, second.tail()
    out = second.text()
    assert ("this state_dir's instance 'C.777' was given up, not 'C.888' (a new instance): its record is set aside "
            f"as {state_files.GIVEN_UP}.C.777") in out, out
    assert not (sup.state_dir / state_files.GIVEN_UP).exists()
    rows = {i["label"]: i["state"] for i in instances(manager)}
    assert rows == {"C.777": "killed", "C.888": "running"}, rows
    calls = len(paths(manager))

    back = Console(sup, config(sup, manager, "C.777"), name="back", env={"FETCH_STATUS": "0"})
    assert back.finish(WAIT_S) == EXIT_GIVEN_UP, back.tail()  # C.777 back: still given up, not run again
    out = back.text()
    assert started(out) == [] and "this instance was given up at " in out, out
    assert paths(manager)[calls:] == [], "a given-up label was registered (a new row) or called again"
    assert "registering afresh" not in out, out  # (it said so, and then rightly registered nothing)
    assert "manager: state_dir was registered as 'C.888', not 'C.777'; its uuid is not this instance's" in out, out


def test_a_given_up_instance_whose_outbox_was_lost_registers_no_new_row(sup: Runner, manager: DevManager) -> None:
    """The give-up was delivered (the row killed), then the outbox lost (a damaged file set aside, a volume
    restored without it). The restart queued the give-up "never queued" and registered the label for it: a new
    row, killed at once, and a line claiming a SIGKILL that never happened."""
    first = Console(sup, config(sup, manager), name="first")
    assert first.finish(WAIT_S) == 4, first.tail()
    for name in ("outbox.sqlite3", "outbox.sqlite3-wal", "outbox.sqlite3-shm"):
        (sup.state_dir / name).unlink(missing_ok=True)
    calls = len(paths(manager))

    again = Console(sup, config(sup, manager), name="again", env={"FETCH_STATUS": "0"})
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    out = again.text()
    assert "never queued" not in out, out
    assert ("manager: the give-up's bench-done is not in this outbox, which does not know this instance: not sent "
            "(the manager's own timeout ends its row)") in out, out
    assert paths(manager)[calls:] == [], paths(manager)[calls:]
    assert [i["state"] for i in instances(manager)] == ["killed"]


# ---------------------------------------------------------------- a give-up that meets a forgotten row


def waits_then_fails(sup: Runner, mgr: DevManager, label: str = "C.790") -> Path:
    """A fetch that fails with 4 once the test lets it (touches ``go``): the instance is given up then."""
    go = sup.tmp / "go"
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        min_rate = 1
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        command = {sh(f"while [ ! -e {go} ]; do sleep 0.05; done; exit 4")}
        report = "param-done"
        """)


def test_a_give_up_that_meets_a_forgotten_row_registers_again_to_go(sup: Runner, manager: DevManager) -> None:
    """The manager's database was reset while the fetch ran; the fetch failed and the give-up was answered 404
    instance not found. It was refused for good, as a given-up instance is never registered again: nothing was
    destroyed (the real manager kills no unregistered instance whose Vast label is null, and its timeouts need a
    row), while the marker said the manager was asked. The give-up's own 404 registers the label again, once, and
    it goes under the new uuid (the real bench-done destroys the machine by its C.<id> label)."""
    cfg = waits_then_fails(sup, manager)
    first = Console(sup, cfg, name="first")
    first.wait_text("manager: registered: uuid")
    assert requests.post(manager.url + "/dev/forget", json={}, timeout=5).status_code == 200
    (sup.tmp / "go").touch()
    assert first.finish(WAIT_S) == 4, first.tail()
    out = first.text()
    calls = [path for path in paths(manager) if not path.startswith("/runner-id")]  # (the 404 told from a kill)
    assert calls == ["/register", "/bench-done", "/register", "/bench-done"], calls
    assert "refused for good" not in out, out
    assert re.search(r"manager: the manager no longer knows uuid \S+ \(404 instance not found: .*\); registering "
                     r"again \(its /runner-id answers 404: the row is gone, not killed\); given up: only so that "
                     r"the give-up goes under the new uuid", out), out
    [inst] = instances(manager)
    assert inst["label"] == "C.790" and inst["state"] == "killed" and inst["rate"] == 0, inst
    assert "asked the manager to destroy it" in givenup.recall(sup.state_dir).reason  # (and it did)


def test_a_give_up_the_manager_refuses_for_good_says_the_instance_was_not_destroyed(
        sup: Runner, manager: DevManager) -> None:
    """The manager forgets every row at once: the give-up, registered again once, is answered 404 again and
    refused for good. Nothing destroys the machine: that is said plainly, and the marker does not leave it at
    "asked the manager to destroy it" (a restart, refused, says it too)."""
    cfg = waits_then_fails(sup, manager)
    first = Console(sup, cfg, name="first")
    first.wait_text("manager: registered: uuid")
    assert requests.post(manager.url + "/dev/forget", json={"always": True}, timeout=5).status_code == 200
    (sup.tmp / "go").touch()
    assert first.finish(WAIT_S) == 4, first.tail()
    out = first.text()
    line = re.search(r"manager: the manager refused the give-up's bench-done for good \(HTTP 404: .*instance not "
                     r"found.*\): this instance was NOT destroyed; nothing here asks again: destroy it by hand", out)
    assert line, out
    reason = givenup.recall(sup.state_dir).reason
    assert re.search(r"asked the manager to destroy it; the manager refused the give-up's bench-done for good "
                     r"\(HTTP 404: .*\): this instance was NOT destroyed$", reason), reason

    again = Console(sup, cfg, name="again")
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert "this instance was NOT destroyed); not running it again" in again.text(), again.text()


def test_a_give_up_left_pending_under_a_forgotten_uuid_goes_under_a_new_one(sup: Runner, manager: DevManager) -> None:
    """The same after a restart: the give-up an earlier start left pending meets a uuid the manager forgot."""
    give_up = {"rate": 0.0, "failed": True, "reason": "phase fetch failed"}
    left_by_an_earlier_start(sup, "C.791", "0f0e0d0c-0b0a-4908-8706-050403020100", ("bench-done", give_up))
    givenup.remember(sup.state_dir, "phase fetch failed", "C.791", ("bench-done", give_up))

    again = Console(sup, waits_then_fails(sup, manager, label="C.791"), name="again")
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    [inst] = instances(manager)
    assert inst["label"] == "C.791" and inst["state"] == "killed" and inst["rate"] == 0, inst
    assert "refused for good" not in again.text(), again.text()


# ---------------------------------------------------------------- a give-up delivered, its answer lost


def test_a_give_up_whose_answer_was_lost_is_delivered_when_the_row_says_killed(sup: Runner,
                                                                                manager: DevManager) -> None:
    """The manager took the give-up and killed the row, but its answer never came (it dripped past the read
    timeout). The look-up before the retry found the row killed, and the give-up was called "not sent", failed in
    the ledger: the kill was the manager's answer to that very call. It is delivered, and said so."""
    cfg = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.792"
        min_rate = 50
        log_push_interval_s = 0.2
        connect_timeout_s = 1
        read_timeout_s = 1

        [[phases]]
        name = "fetch"
        command = {sh("echo fetching; exit 4")}
        report = "param-done"
        """)
    faults(manager, path="/bench-done", drip_bytes_per_s=5, count=1)
    first = Console(sup, cfg, name="first")
    assert first.finish(WAIT_S) == 4, first.tail()
    out = first.text()
    assert "not sent" not in out, out
    assert re.search(r"manager: bench-done delivered: the row is killed \(the manager killed this instance at "
                     r"\S+ \S+ UTC: bench_rate 0.0 below min_rate 50.0\); its answer did not come back", out), out
    assert {kind: state for _, kind, state in outbox_rows(sup, logs=False)}["bench-done"] == "delivered"
    assert paths(manager).count("/bench-done") == 1, paths(manager)


def test_a_give_up_tried_before_a_sigkill_is_delivered_when_the_row_says_killed(sup: Runner,
                                                                               manager: DevManager) -> None:
    """The same after a restart: the earlier start sent the give-up (one try counted) and was SIGKILLed before it
    recorded the answer; the row says killed."""
    uuid = registered(manager, "C.793")
    give_up = {"rate": 0.0, "failed": True, "reason": "phase fetch failed"}
    left_by_an_earlier_start(sup, "C.793", uuid, ("bench-done", give_up))
    box = Outbox(sup.state_dir / state_files.OUTBOX)
    [call] = box.pending_calls("bench-done")
    box.attempted(call.id, "POST /bench-done: no complete answer within 2s")
    box.close()
    givenup.remember(sup.state_dir, "phase fetch failed", "C.793", ("bench-done", give_up))
    requests.post(manager.url + "/bench-done", json={"uuid": uuid, "rate": 0.0}, timeout=5).raise_for_status()
    before = paths(manager)

    again = Console(sup, config(sup, manager, label="C.793"), name="again")
    assert again.finish(WAIT_S) == EXIT_GIVEN_UP, again.tail()
    assert "manager: bench-done delivered: the row is killed" in again.text(), again.text()
    assert {kind: state for _, kind, state in outbox_rows(sup, logs=False)}["bench-done"] == "delivered"
    assert paths(manager)[len(before):].count("/bench-done") == 0, paths(manager)
