"""A stop signal from outside is obeyed within ``[supervisor] stop_budget_s`` (stopbudget.py): ``docker stop``
sends SIGKILL 10 s after its SIGTERM, and a service that ignores SIGTERM with its 60 s grace must not cost
the supervisor its exit (the status line, the termination log, the exit flush, exit 143).

Real supervisors and real signals; the budget's arithmetic on a clock moved by hand.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from helpers import Runner, toml_list, toml_str, until, wait_for

from supervisor.engine.stopbudget import EXIT_SHARE_S, StopBudget

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
