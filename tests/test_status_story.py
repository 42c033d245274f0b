"""``status`` tells the instance's story to a person (issue 18, items 6-9), against real supervisors.

Asked as a separate process, in text and JSON: after a failure (the cause first: reason, the child's last lines
without colour codes, the exit status, the log files), after ``kill -9`` of the supervisor (gone, what it left
alive named by its tag, exit 3; a pid reused by another process not named; a child's progress redrawn with \r
read from its log file in the lines the live status showed), during its timers (the deadline, the
stall countdown and the ready wait moving between two reads; the grace before SIGKILL), with a phase's cgroup
limit from memory_max, the manager's last error cleared by the next delivery, and ``--watch`` redrawing into a
pipe until Ctrl-C. In-process: the timers as pure functions of what the phase exposes, and the text's parts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from helpers import PY, REPO, Console, Runner, clean_env, free_port, sh, toml_list, toml_str, wait_for

from supervisor.app.cli import dev_manager
from supervisor.lifecycle.states import PhaseState, Timeline
from supervisor.status.command import with_later_output
from supervisor.status.headline import failure_lines, headline
from supervisor.status.model import PhaseStatus, Snapshot
from supervisor.status.render import render, timer_lines
from supervisor.status.snapshot import CHILD_LINES, phase_timers, stop_timer
from supervisor.text.show import PATH_CHARS, shown

MIB = 1024 * 1024


def status(state_dir: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=30)
    return done.returncode, done.stdout + done.stderr


def status_json(state_dir: Path) -> tuple[int, dict[str, Any]]:
    rc, out = status(state_dir, "--json")
    try:
        return rc, json.loads(out)
    except ValueError:
        pytest.fail(f"status --json did not print JSON (exit {rc}):\n{out}")


def phase_of(snap: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in snap["phases"] if p["name"] == name)


def stop(run: Console) -> None:
    """SIGTERM to a supervisor (that may have ended already), and wait for its exit."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(run.pid, signal.SIGTERM)
    run.finish()


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- failure first

BIND_TAKEN = """
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as exc:
    print(f"\\x1b[31mERROR\\x1b[0m listen 127.0.0.1:{sys.argv[1]}: {exc.strerror}", flush=True)
    sys.exit(1)
"""


def test_after_a_failure_the_text_leads_with_the_cause(sup: Runner) -> None:
    """A real bind to a port that is taken fails; the cause (Address already in use) is in the text's first lines,
    without its colour codes, with the exit status and the log files; --json has the same failure record."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        script = sup.tmp / "bind.py"
        script.write_text(BIND_TAKEN)
        config = sup.write(f"""
            [[phases]]
            name = "fetch"
            command = {toml_list(["true"])}

            [[phases]]
            name = "serve"
            command = {toml_list([PY, str(script), str(port)])}
            """)
        result = sup.run(config, timeout=30)
    finally:
        holder.close()
    assert result.returncode == 1, result.output
    rc, text = status(sup.state_dir)
    assert rc == 3, text
    lines = text.splitlines()
    assert re.fullmatch(r"FAILED: serve exit_code \d+s ago; exit 1", lines[0]), text
    assert lines[1] == "  cause: exit_code exit_code=1: exited with code 1", text
    assert lines[2] == "  last lines of serve/serve:", text
    assert lines[3] == f"    | ERROR listen 127.0.0.1:{port}: Address already in use", text
    assert lines[4] == f"  logs: {sup.log_dir / 'serve.log'}, {sup.log_dir / 'supervisor.log'}", text
    assert "\x1b" not in text
    assert (sup.log_dir / "serve.log").exists() and (sup.log_dir / "supervisor.log").exists()
    rc, snap = status_json(sup.state_dir)
    assert rc == 3 and snap["supervisor"] == "exited" and snap["survivors"] == []
    failure = snap["lifecycle"]["failure"]
    assert failure["phase"] == "serve" and failure["reason"] == "exit_code" and failure["exit_code"] == 1, failure
    assert failure["last_lines"] == [f"ERROR listen 127.0.0.1:{port}: Address already in use"], failure
    assert failure["log_file"] == str(sup.log_dir / "serve.log")
    assert snap["lifecycle"]["exit_status"] == 1
    # The timeline: both phases started and ended, the first before the second.
    fetch, serve = phase_of(snap, "fetch"), phase_of(snap, "serve")
    assert fetch["started_at"] <= fetch["ended_at"] <= serve["started_at"] <= serve["ended_at"], (fetch, serve)
    assert re.search(r"^      started \d+s ago, took \d+s$", text, re.M), text


# ---------------------------------------------------------------- a dead supervisor is not running


HOSTILE = r"""
import sys, time
# A title set, a screen clear glued together around a colour code (taken out, it joins ESC to "[2J"), a C1 CSI.
sys.stdout.write("hello \x1b]0;PWNED\x07 \x1b\x1b[m[2J \x9b2J done\n")
sys.stdout.flush()
time.sleep(60)
"""


def test_nothing_a_child_prints_acts_on_the_terminal_of_who_reads_status(sup: Runner) -> None:
    """A running child's last lines and a failure's come out of ``status`` with their codes taken out and every
    character that still would act on a terminal written as its escape: a child's OSC title, a lone ESC left
    glued to "[2J" once the code between was taken out, a C1 CSI. They went raw into the operator's terminal."""
    script = sup.tmp / "hostile.py"
    script.write_text(HOSTILE)
    config = sup.write(f"""
        [[phases]]
        name = "serve"
        kind = "service"
        command = {toml_list([PY, str(script)])}
        """)
    run = Console(sup, config)
    try:
        run.wait_text("done")
        rc, text = status(sup.state_dir)
        _, snap = status_json(sup.state_dir)
    finally:
        stop(run)
    assert rc == 0, text
    shown = next(line for line in text.splitlines() if "hello" in line)
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text, text
    assert shown.endswith("| hello  \\x1b[2J \\x9b2J done"), shown
    assert snap["children"][0]["last_lines"][-1] == "hello  \\x1b[2J \\x9b2J done", snap["children"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux) to ask as another user")
def test_an_operator_who_may_not_ask_is_told_so_not_that_none_runs(sup: Runner) -> None:
    """The status socket is root's (0600, in a state_dir of root's): asked by another user, status said "no
    prover-supervisor is running" (and --json "running": false) of one that runs."""
    config = sup.write("""
        [[phases]]
        name = "serve"
        kind = "service"
        command = ["sh", "-c", "echo up; exec sleep 60"]
        """)
    run = Console(sup, config)
    try:
        run.wait_text("[serve/serve] up")
        other = [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY]
        if subprocess.run([*other, "-c", "import supervisor"], capture_output=True, timeout=30, env=clean_env(),
                          cwd="/").returncode != 0:
            pytest.skip("the package cannot be imported by uid 65534 here (a checkout only root may read)")
        asked = [*other, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)]
        text = subprocess.run(asked, capture_output=True, text=True, timeout=30, env=clean_env(), cwd="/")
        as_json = subprocess.run([*asked, "--json"], capture_output=True, text=True, timeout=30, env=clean_env(),
                                 cwd="/")
    finally:
        stop(run)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "is not yours to ask (permission denied); a prover-supervisor may be running" in text.stdout, text.stdout
    assert "no prover-supervisor is running" not in text.stdout
    answer = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and answer["running"] is None and "not yours to ask" in answer["why"], answer


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux) to ask as another user")
def test_a_saved_state_not_ours_to_read_is_told_so_not_that_there_is_none() -> None:
    # A supervisor gone, its status.json root's (0600): another user was told "no saved state".
    with tempfile.TemporaryDirectory(prefix="status-not-ours-") as top:  # (pytest's tmp_path is root's, 0700)
        state = Path(top) / "state"
        state.mkdir()
        (state / "status.json").write_text("{}")
        os.chmod(state / "status.json", 0o600)
        for path in (Path(top), state):
            os.chmod(path, 0o755)
        _assert_not_ours_to_read(state)


def _assert_not_ours_to_read(state: Path) -> None:
    other = [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY]
    if subprocess.run([*other, "-c", "import supervisor"], capture_output=True, timeout=30, env=clean_env(),
                      cwd="/").returncode != 0:
        pytest.skip("the package cannot be imported by uid 65534 here (a checkout only root may read)")
    result = subprocess.run([*other, "-m", "supervisor", "status", "--state-dir", str(state)], capture_output=True,
                            text=True, timeout=30, env=clean_env(), cwd="/")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.strip() == (f"cannot read: {state}/status.json is not yours to read (permission denied); "
                                     "a prover-supervisor may be running: run status as root, or as the user it "
                                     "runs as"), result.stdout


def test_a_state_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "state"
    a_file.write_text("not a directory\n")
    result = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(a_file)], capture_output=True,
                            text=True, timeout=30, env=clean_env(), cwd=REPO)
    assert (result.returncode, result.stdout) == (2, ""), result
    assert result.stderr == f"prover-supervisor: --state-dir: {shown(str(a_file))} is a file, not a directory\n"


@pytest.mark.parametrize(("args", "said"), [
    (["--state-dir", "{file}"], "--state-dir: {shown_file} is a file, not a directory"),
    (["--config", "{missing}"], "{missing}: no such file"),
    (["--watch", "--state-dir", "{tmp}"], "--watch redraws the text; --json is one answer for machines: not both")])
def test_status_json_refused_prints_json_too(tmp_path: Path, args: list[str], said: str) -> None:
    # --json always prints JSON: a refused command line printed nothing on stdout, its line on stderr alone.
    (tmp_path / "state").write_text("not a directory\n")
    names = {"file": str(tmp_path / "state"), "shown_file": shown(str(tmp_path / "state")),
             "missing": str(tmp_path / "none.toml"), "tmp": str(tmp_path)}
    done = subprocess.run([PY, "-m", "supervisor", "status", "--json", *(a.format(**names) for a in args)],
                          capture_output=True, text=True, timeout=30, env=clean_env(), cwd=REPO)
    why = said.format(**names)
    assert (done.returncode, done.stderr) == (2, f"prover-supervisor: {why}\n"), done
    assert json.loads(done.stdout) == {"running": None, "live": False, "supervisor": None, "survivors": [],
                                       "state_dir": None, "why": why}, done.stdout


def test_a_state_dir_with_an_escape_or_a_newline_is_quoted_where_nothing_is_found(tmp_path: Path) -> None:
    """The socket's and status.json's paths were printed raw: an ESC reached the terminal, a newline split the line."""
    odd = f"{tmp_path}/x\x1b[2Jy\nz"
    for args in ([], ["--json"]):
        result = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", odd, *args], capture_output=True,
                                text=True, timeout=30, env=clean_env(), cwd=REPO)
        said = result.stdout if not args else json.loads(result.stdout)["why"]
        assert result.returncode == 3, result
        socket_path, status_path = (shown(f"{odd}/{name}", PATH_CHARS) for name in ("status.sock", "status.json"))
        assert said.rstrip("\n") == (f"no prover-supervisor is running (no answer on {socket_path}), "
                                     f"and no saved state: no {status_path}"), result


def test_after_kill_9_the_supervisor_is_gone_and_what_it_left_is_named(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "work"
        kind = "service"
        command = {sh("echo working; exec sleep 60")}
        """)
    run = Console(sup, config)
    run.wait_text("[work/work] working")
    rc, snap = status_json(sup.state_dir)
    assert rc == 0 and snap["supervisor"] == "running", snap
    (child,) = [c["pid"] for c in snap["children"]]
    os.kill(run.pid, signal.SIGKILL)
    run.proc.wait(10)
    stranger = subprocess.Popen(["sleep", "60"])  # not ours: no tag
    try:
        rc, text = status(sup.state_dir)
        assert rc == 3, text
        lines = text.splitlines()
        assert re.fullmatch(rf"GONE: supervisor pid {run.pid} is not running and did not stop \(last state written "
                            r"\d+s ago\); 1 process\(es\) it started still alive", lines[0]), text
        assert lines[1] == "  still alive, started by it (the next start of this state_dir ends them):", text
        assert lines[2] == f"    pid {child} sleep (work/work)", text
        assert "lifecycle (last known, the supervisor is gone): running" in text
        assert "\nlifecycle: running" not in text, "a dead supervisor's lifecycle shown as running"
        assert re.search(rf"^  work/work\s+pid {child}\s+alive ", text, re.M), text
        rc, snap = status_json(sup.state_dir)
        assert rc == 3 and snap["supervisor"] == "gone" and snap["live"] is False, snap
        assert [(s["pid"], s["name"]) for s in snap["survivors"]] == [(child, "sleep")], snap["survivors"]
        assert snap["gone_since"] == snap["written_at"]

        # The pid is given to another process (written here into the last state as if reused): not named.
        kill_quietly(child)
        wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 10)
        path = sup.state_dir / "status.json"
        saved = json.loads(path.read_text())
        saved["children"][0]["pid"] = stranger.pid
        path.write_text(json.dumps(saved))
        rc, text = status(sup.state_dir)
        assert rc == 3, text
        assert "0 process(es) it started still alive" in text.splitlines()[0], text
        assert f"pid {stranger.pid} sleep" not in text, text
        assert re.search(rf"^  work/work\s+pid {stranger.pid}\s+gone ", text, re.M), text
        rc, snap = status_json(sup.state_dir)
        assert snap["supervisor"] == "gone" and snap["survivors"] == [], snap["survivors"]
    finally:
        kill_quietly(child)
        stranger.kill()
        stranger.wait(10)


def test_a_gone_supervisors_child_shows_its_redrawn_progress_as_the_live_status_did(sup: Runner) -> None:
    """A child that redraws its progress with \\r (aria2c, paramfetch) after the last status.json: its last lines,
    read from its log file once the supervisor is gone, are the lines the live status showed (a \\r ends a line
    there too), not the redraws run together into one."""
    gate = sup.tmp / "gate"
    fetch = sh(f"echo starting; while [ ! -e {gate} ]; do sleep 0.05; done; "
               "printf '\\r 10%%\\r 50%%\\r100%%\\r\\nfetched\\n'; "
               "printf 'verify 1/3\\rverify 2/3\\rverify 3/3\\n'; exec sleep 60")
    config = sup.write(f"""
        [[phases]]
        name = "fetch"
        kind = "service"
        command = {fetch}
        """)
    run = Console(sup, config)
    child = None
    try:
        wait_for(lambda: (sup.state_dir / "status.json").exists()
                 and phase_of(json.loads((sup.state_dir / "status.json").read_text()), "fetch")["up"], 30)
        gate.touch()  # (its progress comes after the status.json that shows it up)
        run.wait_text("[fetch/fetch] verify 3/3")
        expected = ["starting", " 10%", " 50%", "100%", "fetched", "verify 1/3", "verify 2/3", "verify 3/3"]
        rc, live = status_json(sup.state_dir)
        assert rc == 0 and live["supervisor"] == "running", live
        [shown_live] = live["children"]
        child = shown_live["pid"]
        assert shown_live["last_lines"] == expected, shown_live
        run.sigkill()
        rc, gone = status_json(sup.state_dir)
        assert rc == 3 and gone["supervisor"] == "gone", gone
        [shown_gone] = gone["children"]
        assert shown_gone["last_lines"] == expected, shown_gone
        rc, text = status(sup.state_dir)
        assert "      | verify 3/3\n" in text and "\\r" not in text, text
    finally:
        if child is not None:
            kill_quietly(child)


# ---------------------------------------------------------------- timers that run


def test_the_deadline_stall_and_ready_wait_count_while_a_daemon_is_waited_for(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        timeout_s = 120
        stall_s = 90
        command = {sh("exec sleep 60")}
          [[phases.daemons]]
          name = "helper"
          command = {sh("echo helper up; exec sleep 60")}
          ready = {toml_str(str(sup.tmp / "never"))}
          ready_timeout_s = 100
        """, stop_grace_s=1)
    run = Console(sup, config)
    try:
        run.wait_text("waiting for svc/helper to be ready")
        wait_for(lambda: "stall" in phase_of(status_json(sup.state_dir)[1], "svc")["timers"], 10, 0.1)
        first = phase_of(status_json(sup.state_dir)[1], "svc")["timers"]
        time.sleep(1.5)
        rc, snap = status_json(sup.state_dir)
        second = phase_of(snap, "svc")["timers"]
        assert rc == 0
        assert first["deadline"]["limit_s"] == second["deadline"]["limit_s"] == 120
        assert 0 < second["deadline"]["left_s"] < first["deadline"]["left_s"] <= 120, (first, second)
        assert second["stall"]["limit_s"] == 90
        assert second["stall"]["silent_s"] > first["stall"]["silent_s"], (first, second)
        assert second["stall"]["left_s"] == pytest.approx(90 - second["stall"]["silent_s"], abs=0.2)
        assert second["ready"]["child"] == "svc/helper" and second["ready"]["limit_s"] == 100
        assert second["ready"]["waited_s"] > first["ready"]["waited_s"], (first, second)
        rc, text = status(sup.state_dir)
        assert text.splitlines()[0].startswith("starting: svc, waiting for svc/helper to be ready ("), text
        timers = next(line for line in text.splitlines() if line.startswith("      timers: "))
        assert re.fullmatch(r"      timers: deadline \d+s left of timeout_s=120; stall: no sign of progress for "
                            r"\d+s of stall_s=90 \(\d+s left; output \d+s ago(; I/O \d+s ago)?\); "
                            r"ready wait: svc/helper \d+s of ready_timeout_s=100 "
                            r"\(\d+s left\)", timers), text
    finally:
        stop(run)


def stopping_a_deaf_service(sup: Runner, budget_s: float) -> Console:
    """A service that ignores SIGTERM (stop_grace_s 60), once it runs: the supervisor is sent SIGTERM, with a stop
    budget of ``budget_s``."""
    config = sup.write(sup.header(stop_grace_s=60, extra=f"stop_budget_s = {budget_s:g}") + textwrap.dedent(f"""
        [[phases]]
        name = "stubborn"
        kind = "service"
        command = {sh("trap '' TERM; echo deaf; while true; do sleep 0.1; done")}
        """), header=False)
    run = Console(sup, config)
    run.wait_text("[stubborn/stubborn] deaf")
    os.kill(run.pid, signal.SIGTERM)
    return run


def test_the_grace_before_sigkill_counts_down_while_a_child_ignores_sigterm(sup: Runner) -> None:
    # The stop budget (8 s by default) would cut the grace short: the two `status` reads below must land
    # while the child is still being waited for, however slowly they start on a busy machine.
    run = stopping_a_deaf_service(sup, budget_s=120)
    try:
        run.wait_text("stopping stubborn/stubborn")
        rc, snap = status_json(sup.state_dir)
        (child,) = snap["children"]
        assert rc == 0 and child["state"] == "stopping", child
        assert child["stop"]["grace_s"] == 60 and 0 < child["stop"]["kill_in_s"] <= 60, child
        rc, text = status(sup.state_dir)
        assert re.search(r"^  stubborn/stubborn .*SIGKILL in \d+s \(grace 60s\)$", text, re.M), text
    finally:
        stop(run)  # a second request: no more grace


def test_a_oneshot_that_exited_leaving_its_group_running_is_shown_stopping_with_what_it_left(sup: Runner) -> None:
    """It exited 0, leaving a process that ignores SIGTERM in its group: the next phase waits the whole grace. status
    showed "children: none running" with no countdown, and the log named the dead leader ("SIGTERM to pid N"),
    then said it was "still running after 12s grace" though it had ended. Now the child stays in status with the pids
    it left and the countdown, and the lines name its process group and those pids."""
    leaves = """sh -c "trap '' TERM; exec sleep 500" & echo $! > left.pid; echo fetched"""
    config = sup.write(f"""
        [[phases]]
        name = "fetch"
        command = {sh(leaves)}
        cwd = {toml_str(str(sup.tmp))}
        [[phases]]
        name = "serve"
        kind = "service"
        command = {sh("exec sleep 1000")}
        """, stop_grace_s=12)
    run = Console(sup, config)
    try:
        run.wait_text("stopping fetch/fetch")
        left = int((sup.tmp / "left.pid").read_text())
        leader = int(re.search(r"started fetch/fetch: pid (\d+)", run.text()).group(1))
        assert (f"stopping fetch/fetch (phase attempt over): SIGTERM to its process group {leader} (pid {leader} "
                f"exited; pid {left} still running), grace 12s") in run.text(), run.tail()
        rc, snap = status_json(sup.state_dir)
        (child,) = snap["children"]
        assert rc == 0 and child["label"] == "fetch/fetch" and child["state"] == "stopping", child
        assert child["pid"] == leader and child["left"] == [left] and child["usage"]["processes"] == 1, child
        assert child["stop"]["grace_s"] == 12 and 0 < child["stop"]["kill_in_s"] <= 12, child
        rc, text = status(sup.state_dir)
        assert re.search(r"^  fetch/fetch .*SIGKILL in \d+s \(grace 12s\)$", text, re.M), text
        assert f"\n      pid {leader} exited; stopping what it left: pid {left}\n" in text, text
        run.wait_text("phase serve: starting → running")
        assert (f"fetch/fetch: exited, and what it left still runs after 12s grace: SIGKILL to its process group "
                f"{leader} (pid {leader} exited; pid {left} still running)") in run.text(), run.tail()
        assert [c["label"] for c in status_json(sup.state_dir)[1]["children"]] == ["serve/serve"]
    finally:
        stop(run)


def test_the_grace_shown_is_the_one_the_stop_budget_left(sup: Runner) -> None:
    # A stop signal from outside comes with a budget (stop_budget_s): the grace is cut to fit it. status showed
    # stop_grace_s ("grace 60s") while SIGKILL was due seconds later.
    run = stopping_a_deaf_service(sup, budget_s=30)
    try:
        run.wait_text("(of 60s: the stop budget)")
        given = float(re.search(r"stopping stubborn/stubborn .*grace ([\d.]+)s \(of 60s", run.text()).group(1))
        assert given < 60
        rc, snap = status_json(sup.state_dir)
        (child,) = snap["children"]
        assert rc == 0 and child["state"] == "stopping", child
        assert child["stop"]["grace_s"] == pytest.approx(given, abs=0.1) and child["stop"]["kill_in_s"] <= given
    finally:
        stop(run)


def test_a_phase_shows_its_cgroup_limit_from_memory_max(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "capped"
        kind = "service"
        memory_max = "384MiB"
        command = {sh("echo capped; exec sleep 60")}
        """)
    run = Console(sup, config)
    try:
        run.wait_text("[capped/capped] capped")
        _, snap = status_json(sup.state_dir)
        if snap["memory"]["mode"] != "per-phase":
            pytest.skip(f"no per-phase cgroups here: {snap['memory']['why']}")
        memory = phase_of(snap, "capped")["memory"]
        assert memory["cgroup"] is True and memory["memory_max"] == 384 * MIB and memory["limit"] == 384 * MIB, memory
        assert memory["usage"] > 0
        _, text = status(sup.state_dir)
        assert re.search(r"^      memory: usage \S+, peak \S+, limit 384.0MiB \(memory_max 384.0MiB\)$", text,
                         re.M), text
    finally:
        stop(run)


# ---------------------------------------------------------------- the manager's last error, cleared


def test_the_managers_last_error_has_an_age_and_the_next_delivery_clears_it(sup: Runner) -> None:
    port = free_port()
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:{port}"
        label = "C.story"

        [[phases]]
        name = "svc"
        kind = "service"
        report = "running"
        command = {sh("echo serving; exec sleep 60")}
        """, stop_grace_s=1)
    run = Console(sup, config)
    mgr = None
    try:
        wait_for(lambda: status_json(sup.state_dir)[1].get("manager", {}).get("last_error"), 30, 0.2)
        _, text = status(sup.state_dir)
        (said,) = [line for line in text.splitlines() if line.startswith("  last error ")]
        assert re.fullmatch(r"  last error \d+s ago: .+", said), text
        ledger = status_json(sup.state_dir)[1]["manager"]["ledger"]
        assert ledger[0]["kind"] == "register" and ledger[0]["state"] == "pending", ledger
        mgr = dev_manager(port=port, quiet=True).start()
        wait_for(lambda: status_json(sup.state_dir)[1]["manager"].get("outbox_pending") == 0, 60, 0.2)
        _, snap = status_json(sup.state_dir)
        assert snap["manager"]["last_error"] is None and snap["manager"]["last_error_at"] is None, snap["manager"]
        assert [(e["kind"], e["state"]) for e in snap["manager"]["ledger"]] == [
            ("register", "delivered"), ("running", "delivered")], snap["manager"]["ledger"]
        assert snap["manager"]["ledger"][0]["answer"]["uuid"] == snap["manager"]["uuid"]
        _, text = status(sup.state_dir)
        assert "last error" not in text, text
        assert re.search(r"^    register\s+delivered \d+s ago, \d+ attempt\(s\), "
                         r"queued with label=C\.story.* -> uuid: \S+",
                         text, re.M), text
    finally:
        stop(run)
        if mgr is not None:
            mgr.stop()


# ---------------------------------------------------------------- --watch


def test_status_watch_redraws_into_a_pipe_until_ctrl_c(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {sh("echo up; exec sleep 60")}
        """, stop_grace_s=1)
    run = Console(sup, config)
    watcher = None
    try:
        run.wait_text("[svc/svc] up")
        watcher = subprocess.Popen([PY, "-m", "supervisor", "status", "--watch", "--interval", "0.3",
                                    "--state-dir", str(sup.state_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=REPO, env=clean_env())
        assert watcher.stdout is not None
        frames: list[list[str]] = [[]]
        deadline = time.monotonic() + 30
        while len(frames) < 3 and time.monotonic() < deadline:
            line = watcher.stdout.readline()
            if not line:
                break
            if line.startswith("(status --watch, "):
                frames.append([])
            elif line.strip():
                frames[-1].append(line.rstrip("\n"))
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=20)
        assert watcher.returncode == 0, err
        assert "Traceback" not in err and not any("\x1b[" in line for frame in frames for line in frame), frames
        first, second = frames[0], frames[1]
        assert first[0].startswith("running: svc up ") and second[0].startswith("running: svc up "), frames
        assert any(line.startswith("  svc/svc ") for line in second), second
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)
        os.kill(run.pid, signal.SIGTERM)
        run.finish()


def test_status_interval_without_watch_is_one_line_and_2(tmp_path: Path) -> None:
    for args, said in ((["--interval", "1"], "--interval goes with --watch"),
                       # (--config was dropped without a word: the state shown was --state-dir's)
                       (["--config", str(tmp_path / "c.toml")], "--state-dir names the state to show, --config a "
                                                                "config to read it from: not both")):
        rc, text = status(tmp_path, *args)
        assert rc == 2 and text.count("\n") == 1 and said in text and "Traceback" not in text, text
    for interval in ("0", "1e10", "inf", "nan", "\uff11", "\u0661"):  # (full-width and Arabic-Indic 1: not ASCII)
        rc, text = status(tmp_path, "--watch", "--interval", interval)
        assert rc == 2 and "--interval" in text and "Traceback" not in text, text
        assert f"{interval!r} is not a number of seconds from 0.1 to 86400" in text, text



def test_an_empty_state_dir_is_refused_not_taken_as_none_given(tmp_path: Path) -> None:
    # `status --state-dir "$UNSET"`: the user named a state_dir, only not one; showing the running supervisor
    # (or the profile's state_dir) instead would show another instance than the one asked for.
    done = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", ""], capture_output=True, text=True,
                          cwd=REPO, env=clean_env(), timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "prover-supervisor: --state-dir: must be a non-empty string, got ''\n"), done


@pytest.mark.parametrize("command", ["run", "check", "status"])
def test_an_empty_config_is_refused_not_taken_as_none_given(tmp_path: Path, command: str) -> None:
    # `run --config "$UNSET"`: the built-in profile in its place would register, download and give up an
    # instance; $SUPERVISOR_CONFIG in its place would read a file the user did not name.
    env = {**clean_env(), "SUPERVISOR_CONFIG": str(tmp_path / "other.toml"),
           "SUPERVISOR_STATE_DIR": str(tmp_path / "state"), "SUPERVISOR_LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run([PY, "-m", "supervisor", command, "--config", ""], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "prover-supervisor: --config: an empty path (name a file, or leave --config out for "
               "$SUPERVISOR_CONFIG or the built-in profile)\n"), done
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("command", ["run", "check", "status"])
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_supervisor_config_variable_is_refused_not_taken_as_unset(
        tmp_path: Path, command: str, value: str) -> None:
    # `SUPERVISOR_CONFIG=$UNSET run`: as with an empty --config, the built-in profile in its place would register,
    # download and give up an instance the user never meant to start.
    env = {**clean_env(), "SUPERVISOR_CONFIG": value,
           "SUPERVISOR_STATE_DIR": str(tmp_path / "state"), "SUPERVISOR_LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run([PY, "-m", "supervisor", command], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "prover-supervisor: $SUPERVISOR_CONFIG: set but empty (name a file, or unset it for the built-in "
               "profile)\n"), done
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("command", ["run", "check", "status"])
def test_a_config_named_by_the_variable_says_so_when_it_is_refused(tmp_path: Path, command: str) -> None:
    missing, bad = tmp_path / "nope.toml", tmp_path / "bad.toml"
    bad.write_text("x\n")
    for config, said in ((missing, "no such file"), (bad, "not valid TOML")):
        done = subprocess.run([PY, "-m", "supervisor", command], capture_output=True, text=True, cwd=REPO,
                              env={**clean_env(), "SUPERVISOR_CONFIG": str(config)}, timeout=30)
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.startswith(f"prover-supervisor: {config}: {said}"), done
        assert done.stderr.endswith(" (named by $SUPERVISOR_CONFIG)\n") and done.stderr.count("\n") == 1, done
        assert done.stderr.count(str(config)) == 1, done
    given = subprocess.run([PY, "-m", "supervisor", command, "--config", str(missing)], capture_output=True,
                           text=True, cwd=REPO, env=clean_env(), timeout=30)
    assert given.stderr == f"prover-supervisor: {missing}: no such file\n", given
    # A name the error shows escaped (an escape sequence in it) is still said to come from the variable.
    odd = tmp_path / "a\x1b]0;x\x07.toml"
    done = subprocess.run([PY, "-m", "supervisor", command], capture_output=True, text=True, cwd=REPO,
                          env={**clean_env(), "SUPERVISOR_CONFIG": str(odd)}, timeout=30)
    assert done.returncode == 2 and "\x1b" not in done.stderr, done
    assert done.stderr.endswith(": no such file (named by $SUPERVISOR_CONFIG)\n"), done


@pytest.mark.parametrize(("supervisor", "said"), [
    ('[supervisor]\nstatedir = "/tmp/elsewhere"\n', "supervisor.statedir: unknown key (did you mean 'state_dir'?)"),
    ("supervisor = 5\n", "supervisor: must be a table, got 5"),
    ('[supervisr]\nstate_dir = "/tmp/elsewhere"\n', "supervisr: unknown top-level key (did you mean 'supervisor'?)")])
def test_status_config_with_a_bad_supervisor_table_is_refused_as_check_refuses_it(
        tmp_path: Path, supervisor: str, said: str) -> None:
    # Read as no state_dir, it showed the default state_dir's supervisor as this config's.
    config = tmp_path / "c.toml"
    config.write_text(supervisor + '[[phases]]\nname = "a"\ncommand = ["true"]\n')
    answers = [subprocess.run([PY, "-m", "supervisor", command, "--config", str(config)], capture_output=True,
                              text=True, cwd=REPO, env=clean_env(), timeout=30) for command in ("status", "check")]
    for done in answers:
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"prover-supervisor: {config}: {said}\n"), done


_PHASE_A = '[[phases]]\nname = "a"\ncommand = ["true"]\n'


@pytest.mark.parametrize(("body", "said"), [
    ('[manager]\nstate_dir = "/tmp/elsewhere"\n' + _PHASE_A, "manager.state_dir"),
    ('[[phases]]\nname = "${N:-a}"\ncommand = ["true"]\nstate_dir = "/tmp/elsewhere"\n', "phases[0] (a).state_dir"),
    (_PHASE_A + '[[phases.daemons]]\nname = "d"\ncommand = ["true"]\nstate_dir = "/tmp/elsewhere"\n',
     "phases[0] (a).daemons[0] (d).state_dir")])
def test_status_config_with_state_dir_in_another_table_is_refused_as_check_refuses_it(
        tmp_path: Path, body: str, said: str) -> None:
    # check refused it; status read the default state_dir, and showed another supervisor's state as this one's.
    config = tmp_path / "c.toml"
    config.write_text(body)
    answers = [subprocess.run([PY, "-m", "supervisor", command, "--config", str(config)], capture_output=True,
                              text=True, cwd=REPO, env=clean_env(), timeout=30) for command in ("status", "check")]
    line = f"prover-supervisor: {config}: {said}: unknown key (it is a [supervisor] key: put it under [supervisor])\n"
    for done in answers:
        assert (done.returncode, done.stdout, done.stderr) == (2, "", line), done


def test_status_config_reads_its_state_dir_without_the_runs_variables(tmp_path: Path) -> None:
    # Only [supervisor]'s key names are checked: a value that needs the run's variables is not read.
    config = tmp_path / "c.toml"
    config.write_text(f'[supervisor]\nstate_dir = "{tmp_path}/st"\nlog_dir = "${{UNSET_LOGS}}"\n'
                      '[[phases]]\nname = "a"\ncommand = ["${UNSET_PROGRAM}"]\n')
    done = subprocess.run([PY, "-m", "supervisor", "status", "--config", str(config)], capture_output=True,
                          text=True, cwd=REPO, env=clean_env(), timeout=30)
    rc, text = done.returncode, done.stdout + done.stderr
    assert rc == 3 and f"no answer on {tmp_path}/st/status.sock" in text, text


# ---------------------------------------------------------------- in-process: the timers and the text's parts


def a_phase(state: PhaseState, *, deadline_at: float | None = None, backoff_until: float | None = None,
            last_sign: float | None = None, waiting: tuple[Any, float] | None = None,
            unmeasured: dict[str, str] | None = None, settle_until: float | None = None,
            idle_output_age: float | None = None) -> SimpleNamespace:
    stall = (SimpleNamespace(signs=SimpleNamespace(last_sign=lambda: last_sign,
                                                   ages=lambda now: {"output": now - last_sign, "I/O": 2.0},
                                                   idle_output_age=lambda now: idle_output_age,
                                                   unmeasured=unmeasured or {}))
             if last_sign is not None else None)
    return SimpleNamespace(name="p", spec=SimpleNamespace(timeout_s=600.0, stall_s=60.0, settle_timeout_s=300.0),
                           since=1.0, up=False, state=state,
                           pacing=SimpleNamespace(deadline_at=deadline_at, backoff_until=backoff_until, stall=stall,
                                                  settle_until=settle_until),
                           current_attempt=SimpleNamespace(start=SimpleNamespace(waiting=waiting)))


def test_a_sign_not_measured_now_is_said_beside_its_age() -> None:
    # GPU sampling blind: the GPUs' last activity is an age of what was last seen, not a silence measured; the
    # status view says so as the verdict would ("GPU evidence unavailable: GPU sampling blind: ...").
    blind = a_phase(PhaseState.RUNNING, last_sign=990.0, unmeasured={"I/O": "the I/O thread's reading is 40.0s old"})
    timers = phase_timers(blind, None, now=1000.0)
    assert timers.to_json()["stall"]["unmeasured"] == {"I/O": "the I/O thread's reading is 40.0s old"}
    shown = timer_lines(PhaseStatus(name="p", timers=timers), 1000.0, True)
    assert shown == ["timers: stall: no sign of progress for 10s of stall_s=60 (50s left; output 10s ago; "
                     "I/O 2s ago (not measured now: the I/O thread's reading is 40.0s old))"], shown
    measured = phase_timers(a_phase(PhaseState.RUNNING, last_sign=990.0), None, now=1000.0)
    assert "unmeasured" not in measured.to_json()["stall"]
    assert "not measured" not in timer_lines(PhaseStatus(name="p", timers=measured), 1000.0, True)[0]


def test_output_since_the_last_sign_that_said_nothing_moved_is_said_beside_the_outputs_age() -> None:
    # A downloader stuck on a dead gateway repeats its readout in a burst a minute: the children's last lines are
    # fresh, the output's age is not, and the status view says why (the parser marked that output idle).
    idle = phase_timers(a_phase(PhaseState.RUNNING, last_sign=990.0, idle_output_age=1.5), None, now=1000.0)
    assert idle.to_json()["stall"]["idle_output_s"] == 1.5
    shown = timer_lines(PhaseStatus(name="p", timers=idle), 1000.0, True)
    assert shown == ["timers: stall: no sign of progress for 10s of stall_s=60 (50s left; output 10s ago (since then "
                     "only output that said nothing moved, 1s ago); I/O 2s ago)"], shown
    quiet = phase_timers(a_phase(PhaseState.RUNNING, last_sign=990.0), None, now=1000.0)
    assert "idle_output_s" not in quiet.to_json()["stall"]
    assert "said nothing" not in timer_lines(PhaseStatus(name="p", timers=quiet), 1000.0, True)[0]


def test_the_timers_are_what_the_phase_exposes_counted_from_now() -> None:
    helper = SimpleNamespace(label="p/helper", spec=SimpleNamespace(ready_timeout_s=30.0))
    running = a_phase(PhaseState.STARTING, deadline_at=1500.0, last_sign=990.0, waiting=(helper, 980.0))
    assert phase_timers(running, None, now=1000.0).to_json() == {
        "deadline": {"limit_s": 600.0, "left_s": 500.0},
        "stall": {"limit_s": 60.0, "silent_s": 10.0, "left_s": 50.0, "signs": {"output": 10.0, "I/O": 2.0}},
        "ready": {"child": "p/helper", "limit_s": 30.0, "waited_s": 20.0, "left_s": 10.0},
    }
    # A deadline that passed shows 0 left, never a negative; a backoff shows the time to the next attempt.
    backing_off = a_phase(PhaseState.BACKOFF, deadline_at=900.0, backoff_until=1002.5, last_sign=1.0)
    assert phase_timers(backing_off, None, now=1000.0).to_json() == {"deadline": {"limit_s": 600.0, "left_s": 0.0},
                                                           "backoff": {"left_s": 2.5}}
    # A command done, its daemons kept (settle): how long they are kept at most.
    settling = a_phase(PhaseState.SETTLING, deadline_at=1500.0, settle_until=1030.0)
    timers = phase_timers(settling, None, now=1000.0)
    assert timers.to_json() == {"deadline": {"limit_s": 600.0, "left_s": 500.0},
                                "settle": {"limit_s": 300.0, "left_s": 30.0}}
    assert timer_lines(PhaseStatus(name="p", timers=timers), 1000.0, True) == [
        "timers: deadline 8m20s left of timeout_s=600; settle: daemons kept 30s more at most of settle_timeout_s=300"]
    # A done phase held by the bench gate: only the hold's time left.
    held = a_phase(PhaseState.DONE, deadline_at=1500.0)
    assert phase_timers(held, 1048.0, now=1000.0).to_json() == {"hold": {"left_s": 48.0}}
    assert phase_timers(a_phase(PhaseState.DONE, deadline_at=1500.0), None, now=1000.0).to_json() == {}
    stopping = stop_timer(SimpleNamespace(kill_at=1007.0), 10.0, now=1000.0)
    assert stopping is not None and stopping.to_json() == {"grace_s": 10.0, "kill_in_s": 7.0}
    assert stop_timer(SimpleNamespace(kill_at=None), 10.0, now=1000.0) is None


def test_the_timeline_keeps_the_first_start_and_the_end() -> None:
    timeline = Timeline()
    timeline.note(PhaseState.PENDING, 5.0, False, lambda: 0.0)
    assert vars(timeline) == {"started_at": None, "up_at": None, "up_since": None, "ended_at": None}
    for state, at in ((PhaseState.STARTING, 10.0), (PhaseState.BACKOFF, 12.0), (PhaseState.STARTING, 13.0),
                      (PhaseState.DONE, 20.0)):
        timeline.note(state, at, False, lambda: 0.0)
    assert vars(timeline) == {"started_at": 10.0, "up_at": None, "up_since": None, "ended_at": 20.0}


def test_a_phase_that_never_ran_has_no_start_in_the_timeline() -> None:
    # Resumed, refused or stopped before it was reached: status showed "started 0s ago, took 0s" for a curio
    # that never ran.
    for name, state in (("resumed", PhaseState.DONE), ("refused", PhaseState.FAILED), ("never", PhaseState.STOPPED)):
        timeline = Timeline()
        timeline.note(state, 20.0, False, lambda: 0.0)
        assert vars(timeline) == {"started_at": None, "up_at": None, "up_since": None, "ended_at": 20.0}, name


def test_the_timeline_keeps_the_first_time_up_on_the_clock_it_is_given() -> None:
    # A service comes up with no move of its own (it stays running): the time is the clock's, the same clock
    # as the phase's ``since``; a restart that comes up again keeps the first.
    clock = iter([30.0, 45.0])
    timeline = Timeline()
    for state, since, up in ((PhaseState.RUNNING, 25.0, False), (PhaseState.RUNNING, 25.0, True),
                             (PhaseState.BACKOFF, 40.0, False), (PhaseState.RUNNING, 44.0, True)):
        timeline.note(state, since, up, lambda: next(clock))
    # up_since moves: the headline's "up 3h" counts from the latest time up (a curio restarted a minute ago
    # read "up 3h" from its first time up).
    assert vars(timeline) == {"started_at": 25.0, "up_at": 30.0, "up_since": 45.0, "ended_at": None}


def test_the_headline_for_each_story() -> None:
    now = 10_000.0
    failed = {"pid": 7, "lifecycle": {"state": "stopped", "exit_status": 137, "failure": {
        "phase": "bench", "child": "bench", "reason": "oom_killed", "detail": "killed by the kernel OOM killer",
        "signal": "SIGKILL", "at": now - 125, "last_lines": ["a", "b"], "log_file": "/l/bench.log"}},
              "logs": {"supervisor": "/l/supervisor.log"}}
    assert headline(Snapshot.from_json(failed), False, now) == "FAILED: bench oom_killed 2m05s ago; exit 137"
    assert failure_lines(Snapshot.from_json(failed)) == [
        "  cause: oom_killed signal=SIGKILL: killed by the kernel OOM killer", "  last lines of bench/bench:",
        "    | a", "    | b", "  logs: /l/bench.log, /l/supervisor.log"]
    stopping = {**failed, "lifecycle": {**failed["lifecycle"], "state": "stopping"}}
    assert headline(Snapshot.from_json(stopping), True, now).endswith("; exit 137 follows")
    up = {"lifecycle": {"state": "running", "current": "curio"},
          "phases": [{"name": "curio", "state": "running", "up": True, "up_at": now - 11_520, "timers": {}}]}
    assert headline(Snapshot.from_json(up), True, now) == "running: curio up 3h12m"
    restarted = {**up, "phases": [{**up["phases"][0], "up_since": now - 61}]}  # type: ignore[dict-item]
    assert headline(Snapshot.from_json(restarted), True, now) == "running: curio up 61s"
    held = {"lifecycle": {"state": "running", "current": "bench"},
            "phases": [{"name": "bench", "state": "done", "hold": "waiting for the manager",
                        "timers": {"hold": {"left_s": 48.0}}}]}
    assert headline(Snapshot.from_json(held), True, now) == \
        "waiting: bench done, held: waiting for the manager (48s left)"
    gone = {"pid": 4242, "written_at": now - 300, "supervisor": "gone", "survivors": [{"pid": 1}, {"pid": 2}],
            "lifecycle": {"state": "running"}}
    assert headline(Snapshot.from_json(gone), False, now) == (
        "GONE: supervisor pid 4242 is not running and did not stop (last state written 5m00s ago); 2 process(es) it "
        "started still alive")
    done = {"lifecycle": {"state": "stopped", "why": "lifecycle complete", "exit_status": 0}}
    assert headline(Snapshot.from_json(done), False, now) == "done: lifecycle complete; exit 0"


def test_the_ledger_and_phase_lines_in_the_text() -> None:
    now = 10_000.0
    snap = {"pid": 1, "written_at": now, "lifecycle": {"state": "running", "current": "bench"},
            "phases": [{"name": "bench", "state": "done", "since": now - 60, "attempt": 1, "why": "ok",
                        "started_at": now - 100, "ended_at": now - 60, "timers": {},
                        "memory": {"memory_max": 384 * MIB, "cgroup": True, "usage": 10 * MIB, "peak": 20 * MIB,
                                   "limit": 384 * MIB, "oom_kills": 0}}],
            "children": [], "gpus": {"why": "no GPU"}, "memory": {"mode": "per-phase", "why": "w"},
            "manager": {"enabled": True, "url": "http://m", "uuid": "u-1", "outbox_pending": 0,
                        "last_delivered": {"kind": "bench-done", "at": now - 5},
                        "ledger": [{"kind": "bench-done", "state": "delivered", "attempts": 1, "created": now - 9,
                                    "finished": now - 5, "carried": {"rate": 12.5}, "answer": {"passed": False},
                                    "last_error": None}]},
            "verdicts": []}
    text = render(Snapshot.from_json(snap), live=True, now=now)
    assert "      started 100s ago, took 40s" in text.splitlines(), text
    assert "      memory: usage 10.0MiB, peak 20.0MiB, limit 384.0MiB (memory_max 384.0MiB)" in text.splitlines(), text
    assert ("    bench-done   delivered 5s ago, 1 attempt(s), queued with rate=12.5 -> passed: false"
            in text.splitlines())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ---------------------------------------------------------------- a saved snapshot's children, from their log files


def _saved_child(tmp_path: Path, last_output_at: float | None, log_from: int | None = 0,
                 started_at: float = 1.0) -> Snapshot:
    return Snapshot.from_json({"pid": 9, "logs": {"dir": str(tmp_path)}, "lifecycle": {"state": "running"},
                               "children": [{"label": "serve/ticker", "pid": 10, "phase": "serve",
                                             "state": "running", "last_output_at": last_output_at,
                                             "started_at": started_at, "last_lines": ["old"],
                                             "log_from": log_from}]})


def test_a_saved_childs_later_output_comes_from_its_log_file(tmp_path: Path) -> None:
    log = tmp_path / "serve.ticker.log"
    log.write_text("one\n\x1b[31mtwo\x1b[0m\n\nthree\n")
    os.utime(log, (5000.0, 5000.0))
    [child] = with_later_output(_saved_child(tmp_path, 4000.0)).children
    assert (child.last_output_at, child.last_lines) == (5000.0, ("one", "two", "three"))
    [never] = with_later_output(_saved_child(tmp_path, None)).children
    assert never.last_output_at == 5000.0
    [kept] = with_later_output(_saved_child(tmp_path, 6000.0)).children  # the snapshot knows a later line
    assert (kept.last_output_at, kept.last_lines) == (6000.0, ("old",))


def test_a_saved_childs_log_file_is_split_at_a_lone_carriage_return_as_its_live_output_is(tmp_path: Path) -> None:
    log = tmp_path / "serve.ticker.log"
    log.write_bytes(b"one\r\n\r 10%\r 55%\r\r100%\r\ndone\n\rverify 1/2\rverify 2/2")
    os.utime(log, (5000.0, 5000.0))
    [child] = with_later_output(_saved_child(tmp_path, 4000.0)).children
    assert child.last_lines == ("one", " 10%", " 55%", "100%", "done", "verify 1/2", "verify 2/2")
    # Read from its tail: the first line may be a part of one, be it ended by \n or by \r.
    log.write_bytes(b"".join(b"\r[#%05d 1.2GiB/2.0GiB CN:4 DL:50MiB]" % i for i in range(2000)) + b"\n")
    os.utime(log, (5000.0, 5000.0))
    [tail] = with_later_output(_saved_child(tmp_path, 4000.0)).children
    assert tail.last_lines == tuple(f"[#{i:05d} 1.2GiB/2.0GiB CN:4 DL:50MiB]" for i in range(1990, 2000)), tail


def test_a_saved_childs_log_file_is_read_bounded_and_never_blocks(tmp_path: Path) -> None:
    log = tmp_path / "serve.ticker.log"
    log.write_text("".join(f"line {i} {'x' * 100}\n" for i in range(5000)))  # far past LOG_TAIL_BYTES
    [child] = with_later_output(_saved_child(tmp_path, 1.0)).children
    assert len(child.last_lines) == CHILD_LINES and child.last_lines[-1].startswith("line 4999 ")
    log.unlink()
    os.mkfifo(log)  # (an open for reading would wait for a writer)
    [fifo] = with_later_output(_saved_child(tmp_path, 1.0)).children
    assert (fifo.last_output_at, fifo.last_lines) == (1.0, ("old",))
    log.unlink()
    [missing] = with_later_output(_saved_child(tmp_path, 1.0)).children
    assert missing.last_lines == ("old",)


def test_a_saved_childs_log_file_gives_only_its_own_output(tmp_path: Path) -> None:
    """The log file is appended to across runs: an earlier run's last line was shown as this child's output, at a
    time before it started."""
    log = tmp_path / "serve.ticker.log"
    log.write_text("EARLIER RUN LINE\n")
    ours = log.stat().st_size
    os.utime(log, (5000.0, 5000.0))
    [silent] = with_later_output(_saved_child(tmp_path, None, log_from=ours, started_at=6000.0)).children
    assert (silent.last_output_at, silent.last_lines) == (None, ("old",))  # nothing of its own since it started
    with log.open("a") as f:
        f.write("its own\n")
    os.utime(log, (7000.0, 7000.0))
    [printed] = with_later_output(_saved_child(tmp_path, None, log_from=ours, started_at=6000.0)).children
    assert (printed.last_output_at, printed.last_lines) == (7000.0, ("its own",))
    log.write_text("rolled over: all of it ours\n")  # (shorter than where its output began: rolled over since)
    os.utime(log, (8000.0, 8000.0))
    [rolled] = with_later_output(_saved_child(tmp_path, None, log_from=ours + 100, started_at=6000.0)).children
    assert rolled.last_lines == ("rolled over: all of it ours",)
    [unsaid] = with_later_output(_saved_child(tmp_path, None, log_from=None, started_at=6000.0)).children
    assert unsaid.last_lines == ("old",)  # (a snapshot of an earlier version: where its output begins is unknown)
