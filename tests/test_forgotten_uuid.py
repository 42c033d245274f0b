"""A uuid the manager no longer knows (404 ``instance not found``: a database reset, the 7-day cleanup).

The supervisor registers the label again, says so, gives the new uuid to later children, and delivers the
call that was refused (and the rest) under it. Not a loop: the same answer right after a fresh register is
refused for good. The dev-manager forgets on ``POST /dev/forget``. Core kinds only (param-done, running).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from helpers import Console, Runner, outbox_rows, sh, toml_str, wait_for

from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager
from supervisor.engine.loop import EventLoop
from supervisor.manager.callkinds import CallKinds
from supervisor.manager.client import ManagerClient
from supervisor.manager.outbox import Outbox
from supervisor.manager.sender import Sender

WAIT_S = 40  # upper bounds against hanging, never measures


def waiting(go: Path | None) -> str:
    return f"while [ ! -e {go} ]; do sleep 0.05; done; " if go is not None else ""


def config(sup: Runner, mgr: DevManager, go: Path | None = None, then: Path | None = None) -> Path:
    """A oneshot reporting param-done (waiting for ``go`` first), one that waits for ``then``, then a service
    reporting running that writes the INSTANCE_UUID it was started with."""
    seen = sup.tmp / "service.uuid"
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "C.4242"
        log_push_interval_s = 0.2

        [[phases]]
        name = "params"
        command = {sh(waiting(go) + "echo params ok")}
        report = "param-done"

        [[phases]]
        name = "between"
        command = {sh(waiting(then) + "echo on")}

        [[phases]]
        name = "service"
        kind = "service"
        command = {sh(f'echo "$INSTANCE_UUID" > {seen}; echo serving; exec sleep 0.5')}
        report = "running"
        """)


def calls(mgr: DevManager, *paths: str) -> list[tuple[str, int]]:
    return [(c["path"], c["status"]) for c in mgr.state.snapshot()["calls"] if c["path"] in paths]


def uuids(mgr: DevManager) -> list[str]:
    return list(mgr.state.snapshot()["instances"])


def forget(mgr: DevManager, **body: Any) -> None:
    assert requests.post(mgr.url + "/dev/forget", json=body, timeout=5).status_code == 200


def test_a_forgotten_uuid_is_registered_again_and_the_call_goes_under_the_new_one(
        sup: Runner, manager: DevManager) -> None:
    go, then = sup.tmp / "go", sup.tmp / "then"
    proc = Console(sup, config(sup, manager, go, then))
    proc.wait_text("manager: registered: uuid")
    [first] = uuids(manager)
    forget(manager)  # the manager's database was reset
    go.touch()
    proc.wait_text("registering again")
    wait_for(lambda: proc.text().count("manager: registered: uuid") == 2, WAIT_S)
    then.touch()  # the service starts after the new uuid is known
    assert proc.finish(WAIT_S) == 0, proc.tail()
    out = proc.text()
    assert (f"manager: the manager no longer knows uuid {first} (404 instance not found: its database was reset "
            "or the instance cleaned up); registering again") in out, out
    [second] = uuids(manager)
    assert second != first
    assert calls(manager, "/register", "/param-done", "/running") == [
        ("/register", 200), ("/param-done", 404), ("/register", 200), ("/param-done", 200), ("/running", 200)]
    assert manager.state.snapshot()["instances"][second]["history"] == ["registered", "params_done", "running"]
    assert (sup.tmp / "service.uuid").read_text().strip() == second  # later children know the new uuid
    assert "refused for good" not in out, out
    assert {state for _, _, state in outbox_rows(sup)} == {"delivered"}


def test_a_uuid_forgotten_right_before_running_is_told_from_a_kill_by_its_runner_id(
        sup: Runner, manager: DevManager) -> None:
    # /running answers an unknown uuid as it answers a killed row: 404 "instance not found or already killed"
    # (shared/domain/manager-api.md). Only /runner-id's 404 says the row is gone: registered again, running sent
    # under it.
    answer = requests.post(manager.url + "/running", json={"uuid": "never-registered"}, timeout=5)
    assert (answer.status_code, answer.json()) == (404, {"error": "instance not found or already killed"})
    go, then = sup.tmp / "go", sup.tmp / "then"
    go.touch()
    proc = Console(sup, config(sup, manager, go, then))
    wait_for(lambda: ("/param-done", 200) in calls(manager, "/param-done"), WAIT_S)
    [first] = uuids(manager)
    forget(manager)
    then.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()
    [second] = uuids(manager)
    assert second != first and "the manager killed this instance" not in proc.text(), proc.tail()
    assert calls(manager, "/register", "/param-done", "/running")[1:] == [  # (after the test's own /running)
        ("/register", 200), ("/param-done", 200), ("/running", 404), ("/register", 200), ("/running", 200)]
    assert manager.state.snapshot()["instances"][second]["history"] == ["registered", "running"]


def test_a_uuid_forgotten_again_right_after_registering_again_is_refused_for_good(
        sup: Runner, manager: DevManager) -> None:
    go = sup.tmp / "go"
    proc = Console(sup, config(sup, manager, go))
    proc.wait_text("manager: registered: uuid")
    forget(manager, always=True)  # every instance, and each new one right after its register
    go.touch()
    assert proc.finish(WAIT_S) == 0, proc.tail()  # the work goes on without the manager's rows
    out = proc.text()
    assert out.count("registering again") == 1, out
    assert "manager: param-done refused for good: HTTP 404" in out, out
    assert [path for path, _ in calls(manager, "/register", "/param-done")] == [
        "/register", "/param-done", "/register", "/param-done"]


def test_a_uuid_kept_from_an_earlier_start_that_the_manager_forgot(sup: Runner,
                                                                  manager: DevManager) -> None:
    first = Console(sup, config(sup, manager), name="first")
    assert first.finish(WAIT_S) == 0, first.tail()
    [kept] = uuids(manager)
    forget(manager, uuid=kept)  # the 7-day cleanup
    again = Console(sup, config(sup, manager), name="again")
    assert again.finish(WAIT_S) == 0, again.tail()
    out = again.text()
    assert f"manager: reusing uuid {kept}" in out and f"no longer knows uuid {kept}" in out, out
    [fresh] = uuids(manager)
    assert fresh != kept
    assert len(calls(manager, "/register")) == 2  # the first start's, then the one for the forgotten uuid


def run_until(loop: EventLoop, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    loop.run_until(lambda: done() or time.monotonic() > deadline, 0.02)
    assert done(), "not within WAIT_S"


def test_a_forget_brings_the_row_back_to_this_uuids_stage_not_an_earlier_rows(tmp_path: Path,
                                                                               manager: DevManager) -> None:
    """The state volume of another instance (label C.1) had got as far as running; this start (C.13) registers
    afresh and is still fetching when the manager forgets it: its new row is registered again and nothing more
    (running, the other row's stage, was sent under the new uuid: the row skipped the fetch's clock)."""
    box = Outbox(tmp_path / "outbox.sqlite3")
    box.put("label", "C.1")
    for kind in ("register", "param-done", "running"):
        box.delivered(box.add(kind, {}), {})
    box.close()
    spec = ManagerSpec(url=manager.url, label="C.13", connect_timeout_s=2, read_timeout_s=2, row_check_s=1)
    loop, lines = EventLoop(), list[str]()
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    sender = Sender(spec, outbox, ManagerClient(spec), loop, lines.append, CallKinds(), on_identity=lambda u, f: None)
    try:
        sender.restore_identity()
        sender.start()
        run_until(loop, lambda: bool(sender.uuid))
        first = sender.uuid
        forget(manager)
        run_until(loop, lambda: sender.uuid not in (None, first) and not outbox.pending())
        assert any(line.endswith("; registering again, once") for line in lines), lines
        [row] = manager.state.snapshot()["instances"].values()
        assert (row["label"], row["history"]) == ("C.13", ["registered"]), row
        assert calls(manager, "/register", "/param-done", "/running") == [("/register", 200), ("/register", 200)]
    finally:
        sender.ask_to_stop()
        sender.join(10)
        outbox.close()
        loop.close()


def test_a_register_answered_with_the_same_uuid_keeps_its_rows_stage(tmp_path: Path, manager: DevManager) -> None:
    """The manager answers a /register of a label it knows with the row it has (the same uuid, at running): a
    forget after that brings the row back to running, not to registered under the fetch's 90 min clock."""
    spec = ManagerSpec(url=manager.url, label="C.13", connect_timeout_s=2, read_timeout_s=2, row_check_s=1)

    def start() -> tuple[EventLoop, list[str], Outbox, Sender]:
        loop, lines, outbox = EventLoop(), list[str](), Outbox(tmp_path / "outbox.sqlite3")
        sender = Sender(spec, outbox, ManagerClient(spec), loop, lines.append, CallKinds(),
                        on_identity=lambda u, f: None)
        sender.restore_identity()
        sender.start()
        return loop, lines, outbox, sender

    def stop(loop: EventLoop, outbox: Outbox, sender: Sender) -> None:
        sender.ask_to_stop()
        sender.join(10)
        outbox.close()
        loop.close()

    loop, _, outbox, sender = start()
    try:
        run_until(loop, lambda: bool(sender.uuid))
        first = sender.uuid
        outbox.add("param-done", {})
        outbox.add("running", {})
        sender.wake()
        run_until(loop, lambda: not outbox.pending())
    finally:
        stop(loop, outbox, sender)
    spoilt = Outbox(tmp_path / "outbox.sqlite3")  # the stored uuid unusable (an older version's): registers again
    spoilt.put("uuid", "not a uuid!")
    spoilt.close()
    loop, lines, outbox, sender = start()
    try:
        run_until(loop, lambda: sender.uuid == first and not outbox.pending())
        forget(manager)
        run_until(loop, lambda: sender.uuid not in (None, first) and not outbox.pending())
        assert any(line.endswith("registering again, once, and running sent again under the new uuid")
                   for line in lines), lines
        [row] = manager.state.snapshot()["instances"].values()
        assert row["history"] == ["registered", "running"], row
    finally:
        stop(loop, outbox, sender)
