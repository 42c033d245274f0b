"""A stop signal from outside is obeyed within ``[supervisor] stop_budget_s`` (stopbudget.py): ``docker stop``
sends SIGKILL 10 s after its SIGTERM, and a service that ignores SIGTERM with its 60 s grace must not cost
the supervisor its exit (the status line, the termination log, the exit flush, exit 143).

Real supervisors and real signals; the budget's arithmetic on a clock moved by hand.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import (
    PY,
    REPO,
    Runner,
    clean_env,
    first_line,
    free_port,
    pid_alive,
    remove_cgroup,
    stranger_on,
    toml_list,
    toml_str,
    until,
    wait_for,
)

from supervisor.engine import signals
from supervisor.engine.signals import SignalRouter
from supervisor.engine.stopbudget import CLOSE_S, EXIT_SHARE_S, SWEEP_MIN_S, StopBudget
from supervisor.engine.trees import KILL_WAIT_S

STUBBORN = ["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"]


def stubborn_config(sup: Runner, budget: float, term_log: Path, daemons: int = 0) -> Path:
    """A service and its daemons that ignore SIGTERM, each with a 60 s grace, under ``budget``."""
    daemon_tables = "".join(f"""
        [[phases.daemons]]
        name = "d{i}"
        command = {toml_list(STUBBORN)}
        stop_grace_s = 60
        """ for i in range(daemons))
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {toml_list(STUBBORN)}
        stop_grace_s = 60
        """ + daemon_tables, stop_grace_s=60)
    term_log.write_text("")  # (the termination log is written only where the file exists, as in kubernetes)
    config.write_text(config.read_text().replace(
        "[supervisor]\n", f"[supervisor]\nstop_budget_s = {budget}\ntermination_log = {toml_str(str(term_log))}\n", 1))
    return config


def test_sigterm_from_outside_ends_within_the_budget_with_its_whole_exit(sup: Runner) -> None:
    term_log = sup.tmp / "termination-log"
    proc = sup.start(stubborn_config(sup, 6, term_log, daemons=2))
    output = until(proc, "phase serve: service is up")
    # A stubborn child ignores SIGTERM once its trap is set, and says "up" after it: a SIGTERM sent as soon as
    # the service is up (its readiness is its start) could end it before the trap, on a loaded machine (seen once).
    while not all(f"[serve/{name}] up" in output for name in ("d0", "d1", "serve")):
        output += until(proc, "] up")
    proc.send_signal(signal.SIGTERM)
    output += until(proc, "stopping serve/serve")
    # The state and the termination log are on disk before any grace runs out: a SIGKILL now keeps them.
    wait_for(lambda: term_log.read_text() != "", timeout=3)
    assert proc.poll() is None, "the supervisor ended before its children's grace"
    assert term_log.read_text() == "exit status 143: received SIGTERM"
    saved = json.loads((sup.state_dir / "status.json").read_text())
    assert saved["lifecycle"]["state"] in ("stopping", "stopped"), saved["lifecycle"]
    rest, _ = proc.communicate(timeout=30)  # their own grace is 60 s: only the budget ends it in time
    output += rest
    assert proc.returncode == 143, output[-3000:]
    # Each wave's grace was its share of the budget, said where it was given and at SIGKILL.
    assert re.search(r"stopping serve/serve \(supervisor shutdown\): SIGTERM to .*, grace \d\.\ds "
                     r"\(of 60s: the stop budget\)", output), output[-3000:]
    assert re.search(r"serve/serve: still running after \d\.\ds \(of 60s: the stop budget\) grace: SIGKILL",
                     output), output[-3000:]
    cut = [line for line in output.splitlines() if "stop budget 6s (SIGTERM from outside" in line]
    assert len(cut) == 1, output[-3000:]  # said once, before the exit's line
    assert "cut short: the grace of serve/serve 60s → " in cut[0] and "serve/d1 60s → " in cut[0], cut[0]
    assert "the exit flush gets" in cut[0], cut[0]
    lines = output.splitlines()
    assert lines.index(cut[0]) < next(i for i, line in enumerate(lines) if "exiting with status 143" in line)


def test_a_stop_the_supervisor_decides_has_no_budget(sup: Runner) -> None:
    """A failure's stop is the supervisor's own: no docker deadline runs, graces are as configured."""
    config = sup.write(f"""
        [[phases]]
        name = "fails"
        command = {toml_list(["sh", "-c", "sleep 0.3; exit 3"])}
        [[phases.daemons]]
        name = "d"
        command = {toml_list(["sleep", "1000"])}
        """, stop_grace_s=2)
    result = sup.run(config, timeout=60)
    assert result.returncode == 3, result.output
    assert "stop budget" not in result.output, result.output
    assert re.search(r"stopping fails/d \(.*\): SIGTERM to .*, grace 2s$", result.output, re.M), result.output


def test_a_command_already_reaped_takes_no_share_of_the_budget_and_is_not_named_as_cut(sup: Runner) -> None:
    # The phase's command had exited; its daemon was stopping (the attempt over) when docker stop came. The line
    # named the command's grace as cut ("job/job 10s → 3.0s"), and its empty wave halved the daemon's share.
    config = sup.write(f"""
        [[phases]]
        name = "job"
        command = {toml_list(["sh", "-c", "sleep 0.5; exit 3"])}

        [[phases.daemons]]
        name = "d"
        command = {toml_list(["sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"])}
        """, stop_grace_s=10)
    config.write_text(config.read_text().replace("[supervisor]\n", "[supervisor]\nstop_budget_s = 8\n", 1))
    proc = sup.start(config)
    output = until(proc, "stopping job/d (phase attempt over)")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    output += rest
    assert proc.returncode == 3, output[-3000:]  # the failure's, which came first
    [line] = [x for x in output.splitlines() if "stop budget 8s" in x]
    assert "job/job" not in line, line
    got = re.search(r"cut short: the grace of job/d 10s → (\d+\.\d)s", line)
    assert got is not None and float(got.group(1)) > (8 - EXIT_SHARE_S) / 2, line  # the one wave's whole share


def test_a_manager_that_never_answers_costs_the_exit_no_more_than_the_budget(sup: Runner) -> None:
    # A manager that takes the calls and never answers holds the sender's call in flight to the end. The flush
    # ended at its deadline (CLOSE_S before the budget's end), then the sender's end and the shippers' last push
    # got FINISH_MIN_S more past it: the exit ended 8.2 s after docker stop's SIGTERM under an 8 s budget
    # (a reviewer's run), and a budget set a little under docker stop's timeout was SIGKILLed in its exit.
    silent = stranger_on(free_port())  # (listens: the kernel takes the connection; nobody reads or answers)
    try:
        config = sup.write(f"""
            [manager]
            url = "http://127.0.0.1:{silent.args[-1]}"
            label = "C.123"
            read_timeout_s = 120

            [[phases]]
            name = "serve"
            kind = "service"
            command = {toml_list(STUBBORN)}
            """, stop_grace_s=30)
        config.write_text(config.read_text().replace("[supervisor]\n", "[supervisor]\nstop_budget_s = 4\n", 1))
        proc = sup.start(config)
        output = until(proc, "[serve/serve] up")
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        silent.kill()
        silent.wait()
    output += rest
    assert proc.returncode == 143, output[-3000:]
    # The sender's call was still in flight: the flush's end was the budget's, and said where it fell.
    line = first_line(output, "manager: the exit flush stopped at the stop budget's deadline")
    found = re.search(r"deadline, (\d+\.\d\d)s (before|past) its end", line)
    assert found is not None and found.group(2) == "before" and float(found.group(1)) > 0, line
    assert "call(s) not delivered yet; they stay in the outbox for the next start" in output, output[-3000:]
    lines = output.splitlines()
    assert lines.index(line) > next(i for i, x in enumerate(lines) if "exiting with status 143" in x), output[-3000:]


# ---------------------------------------------------------------- in-process: the budget's arithmetic


def test_the_budget_shares_what_is_left_between_the_waves_and_names_what_it_cut() -> None:
    now = [100.0]
    budget = StopBudget(8, "SIGTERM", clock=lambda: now[0])
    children_s = 8 - EXIT_SHARE_S
    assert budget.grace("a/short", 1.0, waves_left=3) == 1.0  # its own grace fits its share: untouched
    assert budget.grace("a/a", 30.0, waves_left=3) == children_s / 3
    now[0] += 0.5  # that wave was done early: the next ones share more
    assert budget.grace("b/b", 60.0, waves_left=2) == (children_s - 0.5) / 2
    now[0] += 100
    assert budget.grace("c/c", 10.0, waves_left=1) == 0.0  # past the children's deadline: SIGKILL at once
    for i in range(5):
        budget.grace(f"d/d{i}", 30.0, waves_left=1)
    line = budget.cut_short()
    assert line.startswith("stop budget 8s (SIGTERM from outside: ")
    assert "cut short: the grace of a/a 30s → 2.0s, b/b 60s → 2.8s, c/c 10s → 0.0s and 5 more" in line, line
    assert line.endswith("the exit flush gets 0.0s at most"), line
    assert StopBudget(8, "SIGINT", clock=lambda: 0.0).cut_short().endswith(
        "no grace was cut; the exit flush gets 7.5s at most")
    # A second stop signal then ends what was left: said after the cuts, which stay (they were lost).
    budget.killed_now_by = "SIGINT"
    assert "and 5 more; SIGINT while stopping ended what grace was left (SIGKILL to everything); the exit flush" \
        in budget.cut_short(), budget.cut_short()


def test_a_grace_that_fits_the_budget_but_for_the_microseconds_since_the_signal_is_not_cut() -> None:
    now = [100.0]
    budget = StopBudget(8, "SIGTERM", clock=lambda: now[0])
    now[0] += 2e-6  # the stop begins a few microseconds after the signal set the budget
    assert budget.grace("p/p", 8 - EXIT_SHARE_S, waves_left=1) == 8 - EXIT_SHARE_S
    assert "no grace was cut" in budget.cut_short(), budget.cut_short()


def test_the_exit_sweep_gets_what_is_left_until_a_stuck_tree_is_no_longer_waited_for() -> None:
    now = [100.0]
    budget = StopBudget(8, "SIGTERM", clock=lambda: now[0])
    assert budget.sweep_s(5.0) == 5.0  # early: its own bound
    now[0] += 5.0
    assert budget.sweep_s(5.0) == 2.0  # wait_until is 1 s before the end: 3 s left of 8, less 1
    now[0] += 10.0
    assert budget.sweep_s(5.0) == SWEEP_MIN_S  # spent: one round still kills what it can


def test_the_budget_counts_from_when_the_signal_came_not_when_the_loop_acted_on_it() -> None:
    """docker stop's SIGKILL comes its timeout after its SIGTERM, whenever the loop got to it (a start held the
    loop for its exec): the budget is counted from the signal's arrival, as the signal handler noted it."""
    budget = StopBudget(8, "SIGTERM", clock=lambda: 105.0, since=100.0)
    assert budget.deadline == 108.0 and budget.flush_deadline() == 108.0 - CLOSE_S
    assert StopBudget(8, "SIGTERM", clock=lambda: 105.0).deadline == 113.0, "no arrival known: from now"
    assert StopBudget(8, "SIGTERM", clock=lambda: 105.0, since=106.0).deadline == 113.0, "never later than now"


def test_a_stop_signal_acted_on_late_gives_its_budget_from_its_arrival() -> None:
    """Through the real handler and router: the signal came, the loop was held 0.3 s, then acted on it."""
    told: list[StopBudget | None] = []

    class Lifecycle:
        shutting_down = False

        def shutdown(self, why: str, status: int, budget: StopBudget | None = None) -> None:
            told.append(budget)

    router = SignalRouter(SimpleNamespace(reap=lambda: None), lambda line: None, stop_budget_s=8.0)
    router.lifecycle = Lifecycle()  # type: ignore[assignment]
    came = time.monotonic()
    signals._wake_only(signal.SIGTERM, None)  # what the signal's arrival runs
    time.sleep(0.3)  # the loop, held
    router.handle(signal.SIGTERM)
    assert told and told[0] is not None
    assert came <= told[0].deadline - 8.0 < came + 0.2, (came, told[0].deadline)
    assert signals.arrived_at(signal.SIGTERM) is None, "acted on: its arrival is forgotten"


def test_the_consoles_last_lines_hold_the_exit_no_later_than_the_budget() -> None:
    # A stdout that does not drain (a log driver that blocks) held the exit 5 s after the budgeted flush: docker's
    # SIGKILL came first and the exit status was 137.
    now = [100.0]
    budget = StopBudget(8, "SIGTERM", clock=lambda: now[0])
    assert budget.console_s(5.0) == 5.0  # early: its own bound
    now[0] += 6.0
    assert budget.console_s(5.0) == pytest.approx(2.0 - CLOSE_S / 2)
    now[0] += 10.0
    assert budget.console_s(5.0) == 0.0


# ---------------------------------------------------------------- a tree SIGKILL cannot end (uninterruptible sleep)

FREEZER = Path("/sys/fs/cgroup/freezer")


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """``pid`` in a v1 freezer cgroup, FROZEN: in state D as the kernel shows it, deaf to SIGKILL until thawed
    (what a process stuck on a GPU fallen off the bus, or on a hung mount, does). Thawed and killed after."""
    if not (FREEZER / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("no writable v1 freezer cgroup here (root and /sys/fs/cgroup/freezer are needed)")
    cg = FREEZER / f"pytest-stuck-{os.getpid()}-{pid}"
    cg.mkdir()
    try:
        (cg / "cgroup.procs").write_text(str(pid))
        (cg / "freezer.state").write_text("FROZEN")
        wait_for(lambda: "FROZEN" in (cg / "freezer.state").read_text(), timeout=10)
        yield
    finally:
        (cg / "freezer.state").write_text("THAWED")  # the pending SIGKILL lands
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), timeout=10)
        remove_cgroup(cg)


def stuck_service(sup: Runner, pidfile: Path, *, then_fail: bool = False, cgroups: str = "off",
                  worker: bool = False) -> Path:
    """A service whose process will be frozen; with ``then_fail``, a later phase that fails, so that the
    supervisor begins the stop itself (and the stuck service is in it)."""
    failing = f"""
        [[phases]]
        name = "fails"
        command = {toml_list(["sh", "-c", "sleep 0.5; exit 3"])}
        """ if then_fail else ""
    pid_then_sleep = f"echo $$$$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 300"  # ($$: a $)
    if worker:  # the process to freeze is a worker under the command, which a SIGTERM ends (reaped, then)
        pid_then_sleep = f"sleep 300 & echo $$! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && wait"
    config = sup.write(f"""
        [[phases]]
        name = "stuck"
        kind = "service"
        command = {toml_list(["sh", "-c", pid_then_sleep])}
        stop_grace_s = 60
        """ + failing)
    keys = f'stop_budget_s = 4\ncgroups = "{cgroups}"\n'
    config.write_text(config.read_text().replace("[supervisor]\n", "[supervisor]\n" + keys, 1))
    return config


def test_a_tree_stuck_past_sigkill_in_its_phase_cgroup_is_said_as_that_never_as_an_escapee_killed(
        sup: Runner) -> None:
    # With a phase cgroup, the phase's sweep then named the frozen command as a process that "escaped the process
    # tree" and was killed, and the cgroup it could not remove was left without a word (a reviewer's run).
    if not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory controller here: no phase cgroup to sweep")
    pidfile = sup.tmp / "stuck.pid"
    proc = sup.start(stuck_service(sup, pidfile, cgroups="auto"))
    output = until(proc, "phase stuck: service is up")
    stuck = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))
    with frozen(stuck):
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    output += rest
    assert proc.returncode == 143, output[-3000:]
    assert "survived SIGKILL" in output, output[-3000:]
    assert not re.search(rf"killed \d+ .*\b{stuck} \(sleep\)", output), output[-3000:]
    # Its phase cgroup is removed (the frozen process moved out to ours), or said to be left: never left unsaid.
    found = re.search(r"memory evidence: per-phase mode, cgroup v\d at (\S+);", output)
    assert found is not None, output[-3000:]
    left = list(Path(found.group(1)).glob(f"prover-{proc.pid}-*"))
    assert all(f"phase stuck: cannot remove {path}" in output for path in left), (left, output[-3000:])


def test_a_worker_stuck_past_sigkill_under_a_command_that_ended_is_left_by_an_exit_status_tells_as_one(
        sup: Runner) -> None:
    # Only the unreaped leaders were listed: a stuck worker under a command that had ended made status say GONE
    # and "did not stop" after an orderly exit 143 (a reviewer's run).
    pidfile = sup.tmp / "stuck.pid"
    proc = sup.start(stuck_service(sup, pidfile, worker=True))
    until(proc, "phase stuck: service is up")
    stuck = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))
    with frozen(stuck):
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        shown = json.loads(status_of(sup, "--json"))
    assert proc.returncode == 143, rest[-3000:]
    assert shown["supervisor"] == "exited" and shown["lifecycle"]["state"] == "stopped", shown
    assert [s["pid"] for s in shown["survivors"]] == [stuck], shown


def test_a_tree_stuck_past_sigkill_costs_the_exit_no_more_than_the_budget(sup: Runner) -> None:
    # docker stop: SIGTERM, then SIGKILL at its timeout. The stuck service is waited for until the budget's
    # wait_until; the exit's sweep then gets what is left (one round), not its own 5 s: the exit's lines,
    # status.json and the flush all come before docker's SIGKILL would.
    pidfile = sup.tmp / "stuck.pid"
    proc = sup.start(stuck_service(sup, pidfile))
    output = until(proc, "phase stuck: service is up")
    stuck = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))
    with frozen(stuck):
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        # The exit went on in order, leaving what outlived its SIGKILL: status said the supervisor was GONE and
        # "did not stop", as after a kill -9 (a reviewer's run).
        shown = json.loads(status_of(sup, "--json"))
        text = status_of(sup)
    output += rest
    assert proc.returncode == 143, output[-3000:]
    assert "the stop budget is spent: not waited for" in output, output[-3000:]
    assert re.search(rf"1 process\(es\) survived SIGKILL for {SWEEP_MIN_S:g}s", output), output[-3000:]
    assert "exiting with status 143" in output
    assert shown["supervisor"] == "exited" and shown["lifecycle"]["state"] == "stopped", shown
    assert [s["pid"] for s in shown["survivors"]] == [stuck], shown
    assert text.startswith("stopped: received SIGTERM"), text
    assert text.splitlines()[1:3] == [
        "  still alive: outlived SIGKILL (uninterruptible sleep?), left by its exit (the next start of this state_dir "
        "ends them):", f"    pid {stuck} sleep (stuck/stuck)"], text
    assert "GONE" not in text and "did not stop" not in text, text


def status_of(sup: Runner, *flags: str) -> str:
    return subprocess.run([PY, "-m", "supervisor", "status", *flags, "--state-dir", str(sup.state_dir)],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env()).stdout


def test_a_stop_signal_during_the_supervisors_own_stop_gets_a_budget_too(sup: Runner) -> None:
    # A phase fails, so the supervisor stops everything itself (no budget: graces as configured); docker stop
    # comes meanwhile. It kills at once, and the stuck service's wait and the sweep fit in a budget from that
    # signal, not KILL_WAIT_S (10 s) and SWEEP_MAX_S (5 s) after it.
    pidfile = sup.tmp / "stuck.pid"
    proc = sup.start(stuck_service(sup, pidfile, then_fail=True))
    output = until(proc, "phase stuck: service is up")
    with frozen(int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))):
        output += until(proc, "stopping stuck/stuck")
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    output += rest
    assert proc.returncode == 3, output[-3000:]  # the failure's status: the stop was the failure's
    assert "SIGTERM while stopping: SIGKILL to everything now" in output, output[-3000:]
    assert "the stop budget is spent: not waited for" in output, output[-3000:]
    assert f"survived SIGKILL for {KILL_WAIT_S:g}s" not in output, output[-3000:]
    assert re.search(rf"1 process\(es\) survived SIGKILL for {SWEEP_MIN_S:g}s", output), output[-3000:]
    # Its SIGKILL ended the stuck service's 60 s grace: the budget's line said "no grace was cut".
    assert re.search(r"stop budget 4s \(SIGTERM from outside.*\): SIGTERM while stopping ended what grace was left "
                     r"\(SIGKILL to everything\)", output), output[-3000:]


def test_a_stop_signal_during_the_exits_sweep_counts_from_when_it_came(sup: Runner) -> None:
    # A oneshot fails (the supervisor's own stop: no budget) and leaves a process that survives SIGKILL, so the
    # exit's sweep blocks its 5 s; docker stop's SIGTERM comes as that sweep begins. The loop takes it only as the
    # exit flush begins (a give-up to a manager that is down: a 60 s wait), and gave the manager 5 s more from
    # then: the exit came 10.5 s after the SIGTERM, past docker's SIGKILL.
    pidfile, gate = sup.tmp / "stuck.pid", sup.tmp / "fail-now"
    # (the sleep is left by a subshell that ends at once: no phase's stop waits for it, only the exit's sweep)
    leave_one = (f"(setsid sleep 300 & echo $$! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}); "  # ($$: a $)
                 f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 3")
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:{free_port()}"
        label = "C.791"

        [[phases]]
        name = "fails"
        command = {toml_list(["sh", "-c", leave_one])}
        """)
    config.write_text(config.read_text().replace("[supervisor]\n", '[supervisor]\ncgroups = "off"\n', 1))
    proc = sup.start(config)
    output = until(proc, "phase fails: starting → running")
    with frozen(int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))):
        gate.touch()
        output += until(proc, "shutting down: phase fails failed")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    output += rest
    assert proc.returncode == 3, output[-3000:]
    assert "survived SIGKILL for 5s" in output, output[-3000:]  # the sweep held the loop its whole bound
    assert re.search(r"SIGTERM \d+\.\ds ago, before the exit flush: giving the manager 0s more, then exiting with "
                     r"status 3", output), output[-3000:]
    # The sweep held the loop, and the freeze watch, looking again in the flush, said the supervisor was frozen
    # (SIGSTOP, docker pause?) for those 5 s, to the manager too: it is said as the hold it was.
    assert "frozen" not in output, output[-3000:]
    assert re.search(r"the supervisor's loop was held for 5\.\ds by the exit's sweep of what is left", output), \
        output[-3000:]
    # docker's SIGKILL comes 10 s after its SIGTERM; the budget (8 s) ends the flush at 7.5 s at the latest, and the
    # exit's closing takes well under the margin left, even on a loaded machine.
    assert took < 9.5, (took, output[-3000:])
