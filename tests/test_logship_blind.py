"""The log shipper is a watch (manager/logship.py, evidence/watchstate.py): a manager whose ``/api/log-push`` fails
while its other calls work (a 500 for the whole run) is said, once, with why; again when the cause changes, and
when pushes are delivered again; lines dropped from a full backlog are said at the first, counted in one line once
a push of theirs is delivered, and shown. The Shipper against the dev-manager stand-in on 127.0.0.1 (its faults on
the log route alone), with a short window; then a real supervisor run with the window it ships with: its
supervisor.log, ``status`` and ``status --json`` say it while the run goes on, and the calls are delivered
meanwhile.

Before this, a push not delivered was said nowhere (``Shipper.last_error`` was set and read by nobody): status
showed the manager as fine and only ``log_backlog`` growing, and a full backlog dropped lines without a word."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from helpers import PY, REPO, Runner, api_calls, clean_env, free_port, pushed, read, sh, toml_str, wait_for

from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager
from supervisor.manager.client import ManagerClient
from supervisor.manager.logship import Shipper, log_push_sender

WAIT_S = 60.0  # upper bounds against hanging, never measures
LOG_PUSH = "/api/log-push"


def fault(mgr: DevManager, **how: Any) -> None:
    """The dev-manager's log route fails as told, every push until told otherwise; ``{}``: no fault."""
    body = {**how, "path": LOG_PUSH, "count": -1} if how else {}
    assert requests.post(mgr.url + "/dev/faults", json=body, timeout=5).status_code == 200


def registered(mgr: DevManager, label: str = "C.9") -> str:
    answer = requests.post(mgr.url + "/register", json={"label": label, "min_rate": 1}, timeout=5)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["uuid"])


@pytest.fixture
def shipper_of(manager: DevManager) -> Iterator[Callable[..., Shipper]]:
    """Shippers pushing to the test's dev-manager under a registered uuid; each stopped at the end."""
    made: list[Shipper] = []
    uuid = registered(manager)

    def make(window_s: float = 1.0, backlog: int = 1 << 20) -> Shipper:
        client = ManagerClient(ManagerSpec(url=manager.url, label="C.9", read_timeout_s=5.0))
        shipper = Shipper("log shipping", log_push_sender(client, lambda: uuid), lambda: True, 0.05, backlog,
                          lambda line: None, window_s=window_s)
        made.append(shipper)
        return shipper

    yield make
    for shipper in made:
        shipper.stop(1.0)


class Tick:
    """What the loop's tick would say of a shipper's watch (Watches.check), gathered as it is said."""

    def __init__(self, shipper: Shipper) -> None:
        self.shipper, self.said = shipper, []

    def until(self, pattern: str) -> str:
        """Ticks until a line matching ``pattern`` is said (failing past WAIT_S); the line."""
        found: list[str] = []

        def look() -> bool:
            new = self.shipper.state.check()
            self.said += new
            found.extend(line for line in new if re.search(pattern, line))
            return bool(found)

        assert wait_for(look, timeout=WAIT_S), f"never said {pattern!r}; said: {self.said}"
        return found[0]

    def once(self) -> list[str]:
        """One tick: what it says now."""
        new = self.shipper.state.check()
        self.said += new
        return new

    def count(self, text: str) -> int:
        return sum(text in line for line in self.said)


def test_a_log_route_failing_is_said_once_again_for_another_cause_and_when_pushes_are_delivered_again(
        manager: DevManager, shipper_of: Callable[..., Shipper]) -> None:
    fault(manager, status=500)
    shipper = shipper_of(window_s=1.0)
    tick = Tick(shipper)
    assert shipper.state.current == "idle", "nothing pushed yet: not waiting for a push"
    shipper.add("setup", ["one", "two"])
    shipper.start()
    line = tick.until(r"no push delivered")
    assert re.fullmatch(r"log shipping: no push delivered for \d+ s \(its window is 1 s\): "
                        r"POST /api/log-push: HTTP 500: .*injected fault.*", line), line
    assert shipper.state.current == "blind"
    assert shipper.error is not None and "HTTP 500" in shipper.error[0]
    assert shipper.error[1] <= time.time()
    # Retried, and failing the same way: not said again.
    misses = shipper.state.misses
    wait_for(lambda: shipper.state.misses > misses, timeout=WAIT_S)
    assert tick.once() == [] and tick.count("no push delivered") == 1, tick.said
    # Another cause: said once more.
    fault(manager, status=503)
    shipper.manager_answers()  # (as the outbox's sender does when a call is delivered: the push goes now)
    again = tick.until(r"still no push delivered")
    assert re.fullmatch(r"log shipping: still no push delivered, for another cause "
                        r"\(POST /api/log-push: HTTP 503: .*\)", again), again
    # Delivered again: said, the error cleared, and the lines reach the manager.
    fault(manager)
    shipper.manager_answers()
    back = tick.until(r"delivering again")
    assert re.fullmatch(r"log shipping: delivering again after \d+ s", back), back
    assert shipper.error is None
    assert shipper.state.current == "reading"
    assert pushed(manager)["setup"] == "one\ntwo\n"
    assert tick.count("no push delivered") == 2 and tick.count("delivering again") == 1, tick.said
    statuses = [c["status"] for c in manager.state.snapshot()["calls"] if c["path"] == LOG_PUSH]
    assert statuses[0] == 500 and 503 in statuses and statuses[-1] == 204, statuses


def test_lines_dropped_from_a_full_backlog_are_said_at_the_first_counted_once_delivered_and_shown(
        manager: DevManager, shipper_of: Callable[..., Shipper]) -> None:
    fault(manager, status=500)
    shipper = shipper_of(window_s=3600.0, backlog=100)
    tick = Tick(shipper)
    lines = [f"line {i:04d}" for i in range(40)]  # 9 bytes each, a newline with it: 10 bytes as pushed
    shipper.add("setup", lines[:20])
    first = tick.until(r"dropping")
    assert first == ("log shipping: dropping the oldest lines of 'setup': its backlog is full (100B, "
                     "log_backlog_bytes); how many is said once a push of it is delivered"), first
    assert not shipper.ship_once()  # refused: the batch goes back, the backlog still full
    shipper.add("setup", lines[20:])
    assert tick.once() == [] and tick.count("dropping") == 1, tick.said  # once, not a line per drop
    assert shipper.dropped() == {"setup": {"lines": 30, "bytes": 300}}
    fault(manager)
    shipper.manager_answers()  # (the outbox's sender, a call delivered: the push goes now, not after its backoff)
    assert shipper.ship_once()
    counted = tick.until(r"were dropped")
    assert counted == ("log shipping: 30 line(s) of 'setup' (300B) were dropped from its full backlog "
                       "(log_backlog_bytes 100B)"), counted
    text = pushed(manager)["setup"]
    assert text.split("\n")[0].startswith("[prover-supervisor: 30 older line(s) dropped"), text
    assert text.split("\n")[1:] == [*lines[30:], ""], text
    assert shipper.dropped() == {"setup": {"lines": 30, "bytes": 300}}, "the totals stay, for status"


def test_a_run_whose_log_route_fails_says_it_in_its_log_and_status_while_its_calls_go(
        sup: Runner, manager: DevManager) -> None:
    """The reviewer's run: ``/api/log-push`` answers 500 from the start, every other route works."""
    fault(manager, status=500)
    config = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.17"
        log_push_interval_s = 0.2

        [[phases]]
        name = "work"
        kind = "service"
        command = {sh("while true; do echo line; sleep 0.2; done")}
        """)
    proc = sup.start(config)
    log = sup.log_dir / "supervisor.log"
    try:
        def shown() -> dict[str, Any] | None:
            answer = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                                    capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env())
            snap = json.loads(answer.stdout) if answer.stdout.startswith("{") else {}
            watch = snap.get("watches", {}).get("log shipping")
            return snap if watch and watch["misses"] >= 2 and snap["manager"].get("log_push_error") else None

        snap = wait_for(shown, timeout=WAIT_S, interval=0.5)
        assert isinstance(snap, dict)
        mgr = snap["manager"]
        assert "POST /api/log-push: HTTP 500" in mgr["log_push_error"], mgr
        assert mgr["log_push_error_at"] is not None and mgr["last_error"] is None, mgr  # the calls are fine
        window = snap["watches"]["log shipping"]["window_s"]  # (logship.SHIP_BLIND_S)
        assert isinstance(window, float) and window >= 10, "a manager restarting (seconds) is no blindness"
        text = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                              capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env()).stdout
        assert re.search(r"\n  log push not delivered .*: POST /api/log-push: HTTP 500", text), text
        assert re.search(r"watches: .*log shipping (reading|starting|BLIND)", text), text
        # Said in the supervisor's own log while the run goes on, once the window is past: once.
        wait_for(lambda: "log shipping: no push delivered for" in read(log), timeout=window + WAIT_S,
                 interval=0.5)
        said = [line for line in read(log).splitlines() if "log shipping: " in line]
        assert len(said) == 1 and re.search(rf"log shipping: no push delivered for \d+ s "
                                            rf"\(its window is {window:g} s\): POST /api/log-push: HTTP 500",
                                            said[0]), said
        # The manager takes pushes again: said, and the lines held meanwhile arrive.
        fault(manager)
        wait_for(lambda: "log shipping: delivering again after" in read(log), timeout=WAIT_S + 30, interval=0.5)
        wait_for(lambda: "[work/work] line" in pushed(manager).get("setup", ""), timeout=WAIT_S, interval=0.5)
        # The calls went meanwhile: registered, the row read.
        assert api_calls(manager, "/register") and manager.state.snapshot()["reads"] and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(WAIT_S)
    out = read(log)
    assert out.count("log shipping: no push delivered for") == 1, out
    assert out.count("log shipping: delivering again after") == 1, out


def test_lines_waiting_for_the_uuid_are_said_after_the_window_and_a_quick_registration_is_not(
        manager: DevManager) -> None:
    """An outage that begins before the registration (the manager down at the start): no push can go without the
    uuid, and the watch was left idle (``log shipping idle`` beside a full backlog dropping lines) for the whole
    outage. The wait is a miss like a push not delivered: said once the window is past, in the same words, and a
    registration answered within the window (the normal start) is not said at all."""
    uuid: list[str] = []
    client = ManagerClient(ManagerSpec(url=manager.url, label="C.9", read_timeout_s=5.0))

    def made(window_s: float) -> Shipper:
        return Shipper("log shipping", log_push_sender(client, lambda: uuid[0] if uuid else None), lambda: bool(uuid),
                       0.05, 1 << 20, lambda line: None, window_s=window_s,
                       waits_on=lambda: "no instance uuid yet: the manager has not answered /register "
                                        "(POST /register: ConnectionError: refused)")

    quiet = made(window_s=1.0)
    assert not quiet.ship_once() and quiet.state.current == "idle", "nothing waits: nothing to say"
    shipper = made(window_s=1.0)
    tick = Tick(shipper)
    shipper.add("setup", ["one", "two"])
    shipper.start()
    try:
        line = tick.until(r"no push delivered")
        assert line.startswith("log shipping: no push delivered for ") and line.endswith(
            "(its window is 1 s): no instance uuid yet: the manager has not answered /register "
            "(POST /register: ConnectionError: refused)"), line
        assert shipper.state.current == "blind" and shipper.state.misses == 1, "one miss a cause, not one a second"
        uuid.append(registered(manager))
        assert tick.until(r"delivering again").startswith("log shipping: delivering again after ")
        assert pushed(manager)["setup"] == "one\ntwo\n"
    finally:
        shipper.stop(1.0)
    # The normal start: registered well within the window, never said.
    uuid.clear()
    normal = made(window_s=3600.0)
    normal_tick = Tick(normal)
    normal.add("setup", ["three"])
    assert not normal.ship_once() and normal.state.current == "starting"
    uuid.append(registered(manager))
    assert normal.ship_once() and normal.state.current == "reading"
    assert normal_tick.once() == [], normal_tick.said


def test_a_run_whose_manager_is_down_from_the_start_shows_its_log_shipping_waiting_for_the_uuid(
        sup: Runner) -> None:
    """The hunter's run: nothing listens at the manager's URL from the start, and a chatty service fills a small
    backlog. Its log shipping was shown ``idle`` the whole outage, beside the lines it dropped: now it waits for a
    push, with why (the blind line itself comes once its 60 s window is past: the Shipper's test above)."""
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:{free_port()}"
        label = "C.18"
        log_backlog_bytes = 2000

        [[phases]]
        name = "work"
        kind = "service"
        command = {sh("while true; do echo line; sleep 0.1; done")}
        """)
    proc = sup.start(config)
    try:
        def shown() -> dict[str, Any] | None:
            answer = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                                    capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env())
            snap = json.loads(answer.stdout) if answer.stdout.startswith("{") else {}
            return snap if snap.get("manager", {}).get("log_dropped") else None

        snap = wait_for(shown, timeout=WAIT_S, interval=0.5)
        assert isinstance(snap, dict)
        watch = snap["watches"]["log shipping"]
        assert watch["state"] == "starting" and watch["misses"] == 1, watch
        assert watch["why"].startswith("no instance uuid yet: the manager has not answered /register "
                                       "(POST /register: ConnectionError: "), watch
        text = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                              capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env()).stdout
        assert re.search(r"watches: .*log shipping starting", text), text
    finally:
        proc.terminate()
        proc.wait(WAIT_S)
