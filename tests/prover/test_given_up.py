"""Given up stays given up: a restart on the same state_dir does not run a given-up instance again.

The real manager's bench-done has no state check: a restart that ran the lifecycle again under the same
uuid moved the killed row back to bench_done and running while the machine was being destroyed. The
give-up (and the manager's own passed: false) is remembered in state_dir; a later start delivers what is
still pending, says so in one line and exits 79 without starting a phase; ``run --fresh`` starts over.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import requests
from helpers import Console, Runner, sh, started, toml_str
from profilekit import ZERO_RATE_BENCH

from supervisor.devmanager.server import DevManager
from supervisor.exits import EXIT_GIVEN_UP
from supervisor.prover.reasons import EXIT_BENCH_REJECTED
from supervisor.state import files as state_files

WAIT_S = 90  # upper bounds against hanging, never measures


def config(sup: Runner, mgr: DevManager, fail: bool = True) -> Path:
    """A fetch that fails with 4 (before production: the instance is given up), then a service."""
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "C.777"
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


def test_passed_false_is_remembered_too(sup: Runner, manager: DevManager) -> None:
    """The manager itself killed the instance (a bench below min_rate): a restart must not un-kill it."""
    cfg = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.778"
        min_rate = 1000000
        bench_gate_s = 5

        [[phases]]
        name = "bench"
        command = {sh(f"printf '{ZERO_RATE_BENCH}'")}
        parse = "cuzk-bench"
        report = "bench-done"

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
