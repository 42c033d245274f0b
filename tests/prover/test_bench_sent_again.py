"""A bench-done sent again under a new uuid: the manager forgot the row it had passed (its database reset), the
row watch registered the label again, and the last lifecycle call delivered, bench-done, went again so that the
new row stands where the old one did (manager/sender.py ``_register_forgotten``).

Its answer does not decide again: the gate heard the first one, and "benchmark passed" was said once. But it is
read: ``passed: false`` from the new row (registered with this instance's min_rate, above the old row's that the
rate had passed) is the manager killing the instance and destroying its machine, and the supervisor stops with
the manager's own kill_reason and EXIT_KILLED, as for any kill its row shows. A real supervisor against the
dev-manager, which forgets on ``POST /dev/forget``.
"""

from __future__ import annotations

import os
from itertools import count
from pathlib import Path
from typing import Any

import requests
from helpers import Console, Runner, wait_for
from profilekit import BENCH_30_PER_H, fleet_config

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_KILLED

WAIT_S = 90  # upper bounds against hanging, never measures
_labels = count(1)


def config(sup: Runner, manager: DevManager, label: str, min_rate: float, go: Path) -> Path:
    """fetch → bench (30/h) → a phase waiting for ``go`` (bench-done is the last lifecycle call delivered
    meanwhile) → a short service reporting running."""
    return fleet_config(sup, manager.url, label, BENCH_30_PER_H, min_rate=min_rate, service_s=0.5, row_check_s=5,
                        between=f"while [ ! -e {go} ]; do sleep 0.05; done; echo on")


def bench_done_answers(manager: DevManager) -> list[int]:
    return [c["status"] for c in manager.state.snapshot()["calls"] if c["path"] == "/bench-done"]


def forget_once_bench_done_passed(console: Console, manager: DevManager) -> None:
    """The row passed the bench, then the manager's database is reset; waits for bench-done to go again."""
    console.wait_text("manager: benchmark passed (rate 30/h", WAIT_S)
    assert requests.post(manager.url + "/dev/forget", json={}, timeout=5).status_code == 200
    wait_for(lambda: len(bench_done_answers(manager)) == 2 or console.proc.poll() is not None, WAIT_S, 0.05)
    assert bench_done_answers(manager) == [200, 200], console.tail()


def label() -> str:
    return f"C.{os.getpid()}{next(_labels):03d}"


def test_a_bench_done_sent_again_and_passed_again_is_not_announced_again(sup: Runner, manager: DevManager) -> None:
    go = sup.tmp / "go"
    console = Console(sup, config(sup, manager, label(), 10, go))
    forget_once_bench_done_passed(console, manager)
    go.touch()
    assert console.finish(WAIT_S) == 0, console.tail()
    out = console.text()
    assert out.count("manager: benchmark passed") == 1, out
    assert "manager: bench-done delivered again under uuid " in out and " decided stands" in out, out
    [row] = manager.state.snapshot()["instances"].values()
    assert row["history"] == ["registered", "bench_done", "running"], row


def test_a_bench_done_sent_again_and_answered_passed_false_is_the_managers_kill(sup: Runner,
                                                                                manager: DevManager) -> None:
    # The label's first registration kept min_rate 1: the bench's 30/h passed. Its row forgotten, the label is
    # registered again with this instance's min_rate, 100, and the new row answers the same rate passed: false.
    name = label()
    first = requests.post(manager.url + "/register", json={"label": name, "min_rate": 1}, timeout=5).json()
    go = sup.tmp / "go"
    console = Console(sup, config(sup, manager, name, 100, go))
    forget_once_bench_done_passed(console, manager)
    status = console.finish(WAIT_S)
    out = console.text()
    assert status == EXIT_KILLED, out
    assert out.count("manager: benchmark passed") == 1 and "rejected the benchmark" not in out, out
    assert "the manager killed this instance at " in out and ": bench_rate 30.0 below min_rate 100.0" in out, out
    instances: dict[str, Any] = manager.state.snapshot()["instances"]
    [(uuid, row)] = instances.items()
    assert uuid != first["uuid"] and row["state"] == "killed" and row["min_rate"] == 100.0, row
    assert not go.exists() and "serving" not in out, "production started on a killed instance"
