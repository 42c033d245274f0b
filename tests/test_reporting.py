"""Reporting to the manager end to end: real supervisor processes, real children, the dev-manager on 127.0.0.1.

Covers the order of calls (register → param-done → bench-done → running), the outbox (manager down, faults,
SIGKILL and restart), the bench verdict (passed: false, a failed bench), log shipping (sources, ANSI, a flood
while the manager is down) and secrets.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import (
    DROP_ENV,
    PY,
    Console,
    Runner,
    api_calls,
    free_port,
    only_instance,
    outbox_rows,
    pushed,
    sh,
    toml_list,
    toml_str,
    wait_for,
)

from supervisor.devmanager.faults import FaultPlan
from supervisor.devmanager.server import DevManager, DevManagerState, _Handler
from supervisor.manager.outbox import Outbox

STATES = ["registered", "params_done", "bench_done", "running"]

# A cuzk-bench look-alike: 3 proofs, 1.5 proofs/min → 90 proofs/h (min_rate 50 passes).
FAKE_BENCH = """\
n = 3
for i in range(1, n + 1):
    print(f"  [{i}/{n}] COMPLETED — 0.1s (prove=90 ms, queue=0 ms)", flush=True)
print()
print("=== Batch Summary ===")
print("total time:    0.3s")
print(f"completed:     {n}")
print("failed:        0")
print("throughput:    1.500 proofs/min (40.0s/proof)", flush=True)
"""
FAKE_RATE = 90.0


def fast_config(sup: Runner, url: str, *, manager: str = "", params: str | None = None,
                service: str = "${SVC_S:-0.5}", min_rate: float = 50, name: str = "config.toml") -> Path:
    """Three quick phases reporting param-done, bench-done (90/h) and running; the service sleeps ``service`` s."""
    bench = sup.tmp / "fake_bench.py"
    bench.write_text(FAKE_BENCH)
    body = f"""
[manager]
url = {toml_str(url)}
label = "C.test"
min_rate = {min_rate}
log_push_interval_s = 0.2
{manager}

[[phases]]
name = "params"
kind = "oneshot"
command = {params or sh("echo fetching params; sleep 0.1; echo params ok")}
report = "param-done"

[[phases]]
name = "bench"
kind = "oneshot"
command = {toml_list([PY, str(bench)])}
parse = "cuzk-bench"
report = "bench-done"
log_source = "benchout"

[[phases]]
name = "service"
kind = "service"
command = {sh("echo serving; exec sleep " + service)}
restart = "on-failure"
report = "running"
log_source = "curio"
"""
    return sup.write(body, name=name)


def in_order(calls: list[dict[str, Any]], paths: list[str]) -> bool:
    """The first successful call to each path came in this order."""
    firsts = []
    for path in paths:
        ok = [i for i, c in enumerate(calls) if c["path"] == path and 200 <= c["status"] < 300]
        if not ok:
            return False
        firsts.append(ok[0])
    return firsts == sorted(firsts)


# ---------------------------------------------------------------- the demo lifecycle, once for several tests


# ---------------------------------------------------------------- identity in children's environment


def test_children_get_instance_uuid_and_runner_id(sup: Runner,
                                                  managers: Callable[..., DevManager]) -> None:
    mgr = managers()
    record = sup.tmp / "identity.txt"
    config = sup.write(f"""
[manager]
url = {toml_str(mgr.url)}
label = "C.env"

[[phases]]
name = "wait"
kind = "oneshot"
command = {sh("sleep 1")}

[[phases]]
name = "record"
kind = "oneshot"
command = {sh(f'echo "$INSTANCE_UUID $RUNNER_ID" > {record}')}
""")
    result = sup.run(config, env={k: "" for k in DROP_ENV}, timeout=30)
    assert result.returncode == 0, result.output
    inst = only_instance(mgr)
    assert inst["label"] == "C.env"
    assert record.read_text().split() == [inst["uuid"], str(inst["runner_id"])]


# ---------------------------------------------------------------- the manager down, then up


# ---------------------------------------------------------------- faults


# fault → (what /dev/faults is told, what the retry line says, /register calls the manager answers at least)
FAULTS: dict[str, tuple[dict[str, Any], str, int]] = {
    "http-500": ({"status": 500, "count": 3}, "HTTP 500", 4),
    "slow": ({"delay_s": 2, "count": 1}, "timed out", 1),  # the slow answer goes to a closed socket: not noted
    "reset": ({"reset": True, "count": 2}, "ConnectionError", 3),
    "garbage": ({"garbage": True, "count": 2}, "not JSON", 3),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_faults_are_retried_until_delivered(sup: Runner, managers: Callable[..., DevManager],
                                            fault: str) -> None:
    import requests

    mgr = managers()
    spec, said, answered = FAULTS[fault]
    assert requests.post(mgr.url + "/dev/faults", json=spec, timeout=5).status_code == 200
    config = fast_config(sup, mgr.url, manager="read_timeout_s = 0.5\nconnect_timeout_s = 0.5",
                         service="${SVC_S:-60}")
    proc = Console(sup, config)
    wait_for(lambda: mgr.state.snapshot()["instances"] and only_instance(mgr)["history"] == STATES, 30, 0.1)
    proc.wait_text("manager: registered: uuid")
    out = proc.text()
    inst = only_instance(mgr)
    assert f"manager: registered: uuid {inst['uuid']}, runner_id {inst['runner_id']}" in out
    retry = [line for line in out.splitlines() if "manager: register not delivered" in line]
    assert retry and said in retry[0], out
    assert inst["rate"] == FAKE_RATE
    registers = api_calls(mgr, "/register")
    assert len(registers) >= answered
    assert in_order(api_calls(mgr), ["/register", "/param-done", "/bench-done", "/running"])
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(20) == 128 + signal.SIGTERM


@pytest.mark.parametrize("path", ["/param-done", "/running", "/api/log-push"])
def test_a_200_that_is_not_the_managers_done_is_retried_until_the_manager_handles_the_call(
        sup: Runner, managers: Callable[..., DevManager], path: str) -> None:
    """A proxy's 200 page (the dev manager's garbage fault: the call is never handled) was counted delivered for
    /param-done, /running and a log push: the row stayed registered (the fetch timeout ran on) or params_done
    (the bench timeout killed a producing instance), and the pushed lines were lost. Each is now sent again."""
    import requests

    mgr = managers()
    fault = {"garbage": True, "count": 1, "path": path}
    assert requests.post(mgr.url + "/dev/faults", json=fault, timeout=5).status_code == 200
    proc = Console(sup, fast_config(sup, mgr.url))
    assert proc.finish(40) == 0, proc.tail()
    answered = [c["status"] for c in api_calls(mgr, path)]
    assert len(answered) >= 2 and answered[0] == 200, answered  # the page, then the manager's own answer
    assert only_instance(mgr)["history"] == STATES
    assert not [r for r in outbox_rows(sup) if r[2] != "delivered"], outbox_rows(sup)
    logs = pushed(mgr)
    assert logs.get("setup", "").count("[supervisor] prover-supervisor pid ") == 1, logs  # (in the first push)
    assert logs.get("benchout", "").count("throughput:") == 1 and logs.get("curio", "").count("serving") == 1, logs
    if path != "/api/log-push":
        kind = path.strip("/")
        retry = [line for line in proc.text().splitlines() if f"manager: {kind} not delivered" in line]
        assert retry and "not JSON" in retry[0], proc.text()


def test_register_refused_once_is_retried_and_param_done_still_arrives(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    """A single 400 on /register: registration is retried with backoff, and nothing after it is dropped."""
    import requests

    mgr = managers()
    fault = {"status": 400, "count": 1, "path": "/register"}
    assert requests.post(mgr.url + "/dev/faults", json=fault, timeout=5).status_code == 200
    proc = Console(sup, fast_config(sup, mgr.url))
    assert proc.finish(40) == 0, proc.tail()
    out = proc.text()
    calls = [(c["path"], c["status"]) for c in api_calls(mgr) if c["path"] != "/api/log-push"]
    assert calls == [("/register", 400), ("/register", 200), ("/param-done", 200), ("/bench-done", 200),
                     ("/running", 200)], calls
    retry = [line for line in out.splitlines() if "manager: register not delivered" in line]
    assert retry and "/register refused: HTTP 400" in retry[0] and "injected fault" in retry[0], out
    assert "no uuid" not in out
    assert only_instance(mgr)["history"] == STATES
    assert not [r for r in outbox_rows(sup) if r[2] != "delivered"]


def test_register_goes_first_even_when_queued_behind_other_calls(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    """An outbox left with param-done pending and no uuid (an earlier start's register failed, or its answer
    was lost to a SIGKILL): the new register is queued behind param-done, yet delivered ahead of it."""
    from supervisor.manager.outbox import Outbox

    mgr = managers()
    sup.state_dir.mkdir(parents=True)
    box = Outbox(sup.state_dir / "outbox.sqlite3")
    box.put("label", "C.test")
    earlier = box.add("register", {"label": "C.test", "min_rate": 50})
    box.failed(earlier, "HTTP 400: refused by an older supervisor", sent=True)
    box.add("param-done", {})
    box.close()
    proc = Console(sup, fast_config(sup, mgr.url))
    assert proc.finish(40) == 0, proc.tail()
    calls = [(c["path"], c["status"]) for c in api_calls(mgr) if c["path"] != "/api/log-push"]
    assert calls[0] == ("/register", 200), calls
    assert calls[1] == ("/param-done", 200), calls
    assert only_instance(mgr)["history"] == STATES
    later = outbox_rows(sup)[1:]  # the older start's failed register aside, every call was delivered
    assert [kind for _, kind, _ in later[:2]] == ["param-done", "register"], later
    assert {state for _, _, state in later} == {"delivered"}, later


def _forget_after_registration(sup: Runner, mgr: DevManager, manager: str = "") -> Console:
    """Start a lifecycle whose first phase waits until the manager, restarted fresh, forgot the instance."""
    go = sup.tmp / "go"
    config = fast_config(sup, mgr.url, manager=manager,
                         params=sh(f"while [ ! -e {go} ]; do sleep 0.05; done; echo params ok"))
    proc = Console(sup, config)
    proc.wait_text("manager: registered: uuid")
    fresh = DevManagerState()  # as after a restart of the manager: it knows no instance
    mgr._server.state = fresh
    mgr.state = fresh
    go.touch()
    return proc


def test_unknown_uuid_is_registered_again_and_the_fleet_calls_go_under_the_new_one(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    """The manager restarted with an empty database: the label is registered again (once), and param-done,
    bench-done and running all reach the new row (tests/test_forgotten_uuid.py: the core's side)."""
    mgr = managers()
    proc = _forget_after_registration(sup, mgr, manager="bench_gate_s = 1")
    status = proc.finish(30)
    out = proc.text()
    assert out.count("registering again") == 1 and "404 instance not found" in out, out
    assert "refused for good" not in out, out
    assert status == 0, out
    assert "started service/service" in out and "lifecycle complete" in out
    assert only_instance(mgr)["history"] == STATES  # the new row went the whole way
    assert len(api_calls(mgr, "/register")) == 1  # (the fresh manager's list: the first register was before it)
    assert {state for _, _, state in outbox_rows(sup)} == {"delivered"}


def test_refused_bench_done_does_not_hold_production_for_the_whole_gate(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    """bench-done refused for good (404): no answer will ever come, so the bench gate (300 s) must not be waited out."""
    mgr = managers()
    with mgr.state.lock:  # every bench-done refused (a 404 that is not "instance not found": no register helps)
        mgr.state.faults = FaultPlan(status=404, count=-1, path="/bench-done")
    proc = Console(sup, fast_config(sup, mgr.url))
    proc.wait_text("manager: bench-done refused for good", 15)
    proc.wait_text("started service/service", 5)
    assert proc.finish(20) == 0, proc.tail()


# ---------------------------------------------------------------- SIGKILL with calls in the outbox


def test_sigkill_with_pending_calls_then_restart_delivers_them_once(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    port = free_port()
    config = fast_config(sup, f"http://127.0.0.1:{port}", manager="bench_gate_s = 0.5")
    first = Console(sup, config, env={"SVC_S": "120"}, name="console1")
    first.wait_text("manager: running queued")
    pending = [kind for _, kind, state in outbox_rows(sup) if state == "pending"]
    assert [k for k in pending if k != "log"] == ["register", "param-done", "bench-done", "running"]
    children = psutil.Process(first.pid).children(recursive=True)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(10)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()

    mgr = managers(port)
    second = Console(sup, config, env={"SVC_S": "0.5"}, name="console2")
    assert second.finish(40) == 0, second.tail()
    out = second.text()
    assert re.search(r"outbox \S+ \([4-9]\d* call\(s\) pending\)", out), out
    inst = only_instance(mgr)  # register was not repeated as a new instance
    assert inst["label"] == "C.test"
    assert len(api_calls(mgr, "/register")) == 1
    assert inst["history"] == STATES, f"state changes repeated: {inst['history']}"
    assert not [r for r in outbox_rows(sup) if r[2] != "delivered"]


def test_a_state_dir_of_another_label_sends_none_of_the_calls_it_left_pending(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    """The volume of instance C.111 (killed while the manager was away: its param-done, running and a report
    pending) attached to instance C.222: C.222 registers afresh and sends its own calls only. C.111's went out
    under C.222's uuid and moved its new row to running before its own fetch was done."""
    mgr = managers()
    sup.state_dir.mkdir(parents=True)
    box = Outbox(sup.state_dir / "outbox.sqlite3")
    box.put("label", "C.111")
    box.put("uuid", "u-of-c111")
    for kind, payload in [("param-done", {}), ("running", {}), ("log", {"source": "setup", "text": "C.111 failed\n"})]:
        box.add(kind, payload)
    box.close()
    config = sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "C.222"
        log_push_interval_s = 0.2

        [[phases]]
        name = "fetch"
        command = {sh("echo fetched")}
        report = "param-done"
        """)
    result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    inst = only_instance(mgr)
    assert inst["label"] == "C.222" and inst["history"] == ["registered", "params_done"], inst
    assert len(api_calls(mgr, "/param-done")) == 1 and not api_calls(mgr, "/running")  # its own param-done only
    assert ("manager: state_dir was registered as 'C.111', not 'C.222'; registering afresh; the 3 call(s) it left "
            "pending (param-done, running, log) are set aside, not sent under this instance's uuid") in result.output
    assert "C.111 failed" not in pushed(mgr)["setup"] and "[supervisor] manager: registered" in pushed(mgr)["setup"]
    states = [state for _, _, state in outbox_rows(sup)]
    assert states[:3] == ["failed"] * 3 and set(states[3:]) == {"delivered"}, outbox_rows(sup)


# ---------------------------------------------------------------- a flood of output while the manager is down


def test_flood_while_the_manager_is_down_stays_bounded(sup: Runner,
                                                       managers: Callable[..., DevManager]) -> None:
    port = free_port()
    lines, width = 50_000, 1000  # ~50 MB
    flood = f"""
import sys
pad = "f" * {width - 14}
w = sys.stdout.write
for i in range({lines}):
    w(f"flood {{i:07d}} {{pad}}\\n")
sys.stdout.flush()
"""
    script = sup.tmp / "flood.py"
    script.write_text(flood)
    config = sup.write(f"""
[manager]
url = "http://127.0.0.1:{port}"
label = "C.flood"
log_push_interval_s = 0.2

[[phases]]
name = "flood"
kind = "oneshot"
command = {toml_list([PY, str(script)])}
log_source = "curio"

[[phases]]
name = "idle"
kind = "service"
command = {sh("exec sleep 120")}
""")
    proc = Console(sup, config)
    peak = {"rss": 0}
    done = threading.Event()

    def sample() -> None:
        try:
            me = psutil.Process(proc.pid)
            while not done.is_set():
                peak["rss"] = max(peak["rss"], me.memory_info().rss)
                time.sleep(0.02)
        except psutil.Error:
            pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        proc.wait_text("started idle/idle", 60)
    finally:
        done.set()
        sampler.join(2)
    assert (sup.log_dir / "flood.log").stat().st_size >= lines * width
    assert 0 < peak["rss"] < 150 * 1024 * 1024, f"supervisor RSS peaked at {peak['rss'] / 2**20:.0f} MiB"

    mgr = managers(port)
    last = f"flood {lines - 1:07d} "
    wait_for(lambda: last in pushed(mgr).get("curio", ""), 45, 0.1)
    text = pushed(mgr)["curio"]
    first, *rest = text.rstrip("\n").split("\n")
    m = re.fullmatch(r"\[prover-supervisor: (\d+) older line\(s\) dropped from a full backlog "
                     r"\(log_backlog_bytes\)\]", first)
    assert m, f"the first push does not say what was dropped: {first[:200]!r}"
    dropped = int(m.group(1))
    assert 0 < dropped < lines
    assert all(line.startswith("[flood/flood] flood ") for line in rest)
    assert dropped + len(rest) == lines  # every line either pushed or counted
    assert rest[0] == f"[flood/flood] flood {dropped:07d} " + "f" * (width - 14)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.finish(20) == 128 + signal.SIGTERM


# ---------------------------------------------------------------- secrets


class _HeaderRecorder(_Handler):
    """The dev-manager's handler, noting each request's Authorization header."""

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.seen_auth.append((self.path, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        return ok


API_SECRET = "s3cr3t-value-123"
PHASE_SECRET = "pa55-phase-only-777"
MGR_SECRET = "mgr-tok-987654321"


def test_secrets_never_reach_a_log_and_the_token_is_sent(sup: Runner,
                                                         managers: Callable[..., DevManager]) -> None:
    mgr = managers()
    mgr._server.RequestHandlerClass = _HeaderRecorder
    mgr._server.seen_auth = []  # type: ignore[attr-defined]
    echo = 'echo "api=$API_TOKEN mgr=$MGR_TOKEN pw=$DB_PASSWORD arg=$1"'
    config = sup.write(f"""
[manager]
url = {toml_str(mgr.url)}
label = "C.secret"
token_env = "MGR_TOKEN"
log_push_interval_s = 0.2

[[phases]]
name = "leak"
kind = "oneshot"
command = {toml_list(["sh", "-c", echo + "; sleep 0.5", "leak", "${API_TOKEN}"])}
env = {{ API_TOKEN = "{API_SECRET}", DB_PASSWORD = "{PHASE_SECRET}" }}

[[phases]]
name = "fail"
kind = "oneshot"
command = {toml_list(["sh", "-c", echo + " >&2; exit 3", "fail", "${API_TOKEN}"])}
env = {{ API_TOKEN = "{API_SECRET}", DB_PASSWORD = "{PHASE_SECRET}" }}
""")
    proc = Console(sup, config, env={"MGR_TOKEN": MGR_SECRET, "API_TOKEN": API_SECRET})
    status = proc.finish(30)
    out = proc.text()
    assert status == 3, out
    assert "api=*** mgr=*** pw=*** arg=***" in out  # the child did print them, masked
    wait_for(lambda: "prover-supervisor: FAILED:" in pushed(mgr).get("setup", ""), 5, 0.05)
    places = {"console": out}
    for path in sorted(sup.log_dir.iterdir()):
        places[path.name] = path.read_bytes().decode("utf-8", errors="replace")
    for source, text in pushed(mgr).items():
        places[f"pushed {source}"] = text
    for path in sorted(sup.state_dir.glob("outbox.sqlite3*")):
        places[path.name] = path.read_bytes().decode("utf-8", errors="replace")
    assert {"supervisor.log", "leak.log", "fail.log"} <= set(places)
    assert "api=*** mgr=*** pw=*** arg=***" in places["pushed setup"]
    for secret in (API_SECRET, PHASE_SECRET, MGR_SECRET):
        leaks = [name for name, text in places.items() if secret in text]
        assert not leaks, f"{secret!r} appears in {leaks}"
    seen = mgr._server.seen_auth  # type: ignore[attr-defined]
    api = [(path, auth) for path, auth in seen if not path.startswith("/dev/")]
    assert api and {auth for _, auth in api} == {f"Bearer {MGR_SECRET}"}
    assert {path for path, _ in api} >= {"/register", "/api/log-push"}


# ---------------------------------------------------------------- reporting off


def test_no_url_means_reporting_off(sup: Runner) -> None:
    config = sup.write(f"""
[[phases]]
name = "only"
kind = "oneshot"
command = {sh("echo hello; echo INSTANCE_UUID=$${INSTANCE_UUID:-none}")}
""")
    result = sup.run(config, env={k: "" for k in DROP_ENV}, timeout=30)
    assert result.returncode == 0, result.output
    assert result.output.count("manager reporting off") == 1
    assert "INSTANCE_UUID=none" in result.output
    assert "lifecycle complete" in result.output
    assert not (sup.state_dir / "outbox.sqlite3").exists()


def test_exit_does_not_wait_long_for_a_manager_that_is_down(sup: Runner) -> None:
    """The calls stay in the outbox for the next start; `docker stop` gives a container only so long."""
    config = sup.write(f"""
[manager]
url = "http://127.0.0.1:{free_port()}"
label = "C.down"

[[phases]]
name = "quick"
command = {sh("echo done")}
""")
    result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    assert "call(s) not delivered yet; they stay in the outbox for the next start" in result.output
    # A few seconds of trying (connection refused answers at once), never the whole 10 s flush window.
    assert result.duration < 8, f"took {result.duration:.1f}s to exit with the manager down"
    pending = [kind for _, kind, state in outbox_rows(sup) if state == "pending"]
    assert pending[0] == "register" and "log" in pending, pending


# ---------------------------------------------------------------- what the setup tab holds: complete, clean, once

COLOURED_FAILURE = r"""
import sys
print("\x1b[32m INFO\x1b[0m loading \x1b[1mSRS\x1b[0m", flush=True)
print("\x1b[31mERROR\x1b[0m insufficient memory budget for SRS", flush=True)
sys.exit(3)
"""


def work_failing(sup: Runner, mgr: DevManager, label: str, script: str) -> Path:
    """A config of one phase "work" running the Python ``script`` (its output to the benchout tab), reporting to
    ``mgr`` as ``label``; not given up on its failure (a given-up instance is not run again:
    tests/prover/test_given_up.py)."""
    path = sup.tmp / "work.py"
    path.write_text(script)
    return sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "{label}"
        log_push_interval_s = 0.2
        give_up_on_failure = false

        [[phases]]
        name = "work"
        command = {toml_list([PY, str(path)])}
        log_source = "benchout"
        """)


def test_setup_tab_has_the_first_lines_one_clean_verdict_and_the_resume_lines(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    mgr = managers()
    config = work_failing(sup, mgr, "C.setup-tab", COLOURED_FAILURE)
    assert Console(sup, config, name="first").finish(40) == 3
    setup = pushed(mgr)["setup"]
    assert "\x1b" not in setup, "an escape code reached the manager"
    lines = setup.splitlines()
    # The supervisor's very first line (its role) first, then what it logged before the uuid was known.
    assert lines[0].startswith("[supervisor] prover-supervisor pid ") and " as " in lines[0], lines[:5]
    at = {key: next((i for i, line in enumerate(lines) if key in line), -1)
          for key in ("memory evidence:", f"manager: {mgr.url}", "FAILED: phase=work", "exiting with status 3")}
    assert all(i > 0 for i in at.values()), (at, setup)
    assert list(at.values()) == sorted(at.values()), f"lines out of order: {at}"
    # The verdict once (the durable push), with the child's last lines quoted without their colours.
    assert setup.count("FAILED: phase=work") == 1, setup
    assert "  | ERROR insufficient memory budget for SRS" in setup
    assert setup.count("insufficient memory budget for SRS") == 1, setup  # the child's own tab is benchout
    assert "\x1b" not in pushed(mgr)["benchout"]

    # A second start on the same state_dir: its resume line (the reused uuid) reaches the manager too.
    assert Console(sup, config, name="second").finish(40) == 3
    uuid = only_instance(mgr)["uuid"]
    again = pushed(mgr)["setup"]
    assert f"[supervisor] manager: reusing uuid {uuid}" in again, again[-3000:]
    assert again.count("FAILED: phase=work") == 2 and "\x1b" not in again


# A child whose last lines are long: its report is over 256 KiB, and what says why is its very last line.
LONG_LINES_FAILURE = r"""
import sys
for i in range(19):
    print(f"L{i:02d} " + "é" * 30000, flush=True)
print("PANIC: the real reason", flush=True)
sys.exit(1)
"""


def test_a_failure_report_past_256k_reaches_the_manager_whole_down_to_its_last_line(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    # In one push the manager kept its first 256 KiB: the verdict and 4 of the 20 lines, the reason dropped.
    mgr = managers()
    config = work_failing(sup, mgr, "C.long-report", LONG_LINES_FAILURE)
    result = sup.run(config, timeout=60)
    assert result.returncode == 1, result.output
    setup = pushed(mgr)["setup"]
    assert setup.count("prover-supervisor: FAILED: phase=work") == 1, setup[-3000:]
    report = setup[setup.index("prover-supervisor: FAILED: phase=work"):]
    quoted = [line for line in report.splitlines() if line.startswith("  | ")]
    assert quoted == [f"  | L{i:02d} " + "é" * 30000 for i in range(19)] + ["  | PANIC: the real reason"], \
        [line[:12] for line in quoted]


def test_a_command_of_bytes_that_are_not_utf8_is_reported_and_every_line_naming_it_shipped(
        sup: Runner, managers: Callable[..., DevManager]) -> None:
    # ${PROG} holds bytes that are not UTF-8 (Python keeps them as lone surrogates): the strict encodes of the
    # log shipper killed its thread at the first own line naming the program, and with it the failure's report
    # (its queued lines are moved into the outbox first) and the exit flush.
    mgr = managers()
    config = sup.write(f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = "C.bytes"
        log_push_interval_s = 0.2
        give_up_on_failure = false

        [[phases]]
        name = "fetch"
        command = ["${{PROG}}", "x"]
        retries = 1
        backoff_s = 0.1
        """)
    result = sup.run(config, env={"PROG": "/nonexistent/\udcff\udcfeprog"}, timeout=60)
    assert result.returncode == 127, result.output
    assert "internal error" not in result.output and "UnicodeEncodeError" not in result.output, result.output
    setup = pushed(mgr)["setup"]
    naming = [line.split("[supervisor] ", 1)[1] for line in result.output.splitlines()
              if "[supervisor] phase fetch: " in line]
    assert len(naming) >= 6 and any("/nonexistent/??prog" in line for line in naming), naming
    assert [line for line in naming if f"[supervisor] {line}" not in setup] == [], setup
    for said in ("prover-supervisor: FAILED: phase=fetch", "prover-supervisor stopping: phase fetch failed",
                 "prover-supervisor exiting with status 127"):
        assert said in setup, (said, setup)
