"""Stopping many at once (issue 14, part of class 7).

A phase with 200 daemons (``sleep``, no readiness check) that fails, and one that is shut down:
everything ends and is reaped, nothing is left, and the process table is read a bounded number of
times, not once per stopping child per poll (which made 200 daemons take 50 s to stop). The count
is taken by a hook in the supervisor's own process: every listing of ``/proc`` (psutil's and the
shared table's alike) is counted. In-process: the shared reading and how the stop is cut into waves.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import PY, REPO, Runner, clean_env, heavy, pid_alive, until, wait_for

from supervisor.config import parse_plan
from supervisor.engine.process import stop_waves
from supervisor.engine.trees import SNAPSHOT_MAX_AGE_S, TAG_ENV, ProcessTable

DAEMONS = 200
# A reading per stopping child per poll would be at least DAEMONS: the shared reading needs a few per
# wave and per batch of reaped children, and the start's and the exit's sweeps a few more.
SCANS_MAX = 50

# Runs the supervisor with every listing of /proc counted, and every batch of reaps (a waitpid loop that reaped one
# or more children, until it found none left): "<scans> <batches>" goes to a file at exit. A stop polls on a reading
# shared by every stop of its turn, and a reap asks for a reading taken after it (what the reaped leader forked
# last): one more reading a batch. On a quiet machine 200 daemons die in a few batches (8 readings in all); on a
# loaded one their deaths spread, up to one batch each. The bound is SCANS_MAX beyond one reading a batch: what a
# per-daemon or per-poll cost would break, whatever the machine's load.
LAUNCHER = """\
import os, sys
count = [0, 0]
listdir, waitpid = os.listdir, os.waitpid
in_batch = [False]
def counting_listdir(path="."):
    if os.fsdecode(path).rstrip("/") == "/proc":
        count[0] += 1
    return listdir(path)
def counting_waitpid(pid, options):
    got = waitpid(pid, options)
    if pid == -1:
        if got[0] > 0 and not in_batch[0]:
            count[1] += 1
        in_batch[0] = got[0] > 0
    return got
os.listdir, os.waitpid = counting_listdir, counting_waitpid
from supervisor.app.cli import main
try:
    status = main(["run", "--config", sys.argv[1]])
finally:
    with open(sys.argv[2], "w") as f:
        f.write(f"{count[0]} {count[1]}")
sys.exit(status)
"""


def many_daemons_config(sup: Runner, kind: str, command: str, daemon: str = '["sleep", "1000"]',
                        count: int = DAEMONS) -> Path:
    daemons = "".join(f"""
        [[phases.daemons]]
        name = "d{i}"
        command = {daemon}
        """ for i in range(count))
    return sup.write(f"""
        [[phases]]
        name = "many"
        kind = "{kind}"
        command = {command}
        """ + daemons)


def start_counted(sup: Runner, config: Path) -> tuple[subprocess.Popen[str], Path]:
    launcher = sup.tmp / "launch_counted.py"
    launcher.write_text(LAUNCHER)
    counted = sup.tmp / "scans"
    proc = subprocess.Popen([PY, str(launcher), str(config), str(counted)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=clean_env({"PYTHONPATH": str(REPO)}), cwd=REPO, start_new_session=True)
    sup.procs.append(proc)
    return proc, counted


def daemon_pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"started many/d\d+: pid (\d+)", output)]


def check_everything_ended(output: str, counted: Path) -> None:
    pids = daemon_pids(output)
    assert len(pids) == DAEMONS, output[-3000:]
    left = [pid for pid in pids if pid_alive(pid)]
    assert not left, f"{len(left)} daemon(s) still alive: {left[:10]}"
    stopped = re.findall(r"\] ended: phase=many child=d\d+ pid=\d+ reason=stopped ", output)
    assert len(stopped) == DAEMONS, output[-3000:]  # every one reaped, with its verdict
    assert "leftover process" not in output  # stopped by their stop, not swept up at the exit
    assert_scans_bounded(counted)


def assert_scans_bounded(counted: Path) -> None:
    scans, batches = map(int, counted.read_text().split())
    assert 0 < scans <= SCANS_MAX + batches, (f"the process table was read {scans} times to stop {DAEMONS} daemons "
                                             f"reaped in {batches} batch(es)")


def test_a_failing_phase_with_200_daemons_stops_them_all_with_a_bounded_number_of_scans(
        sup: Runner) -> None:
    config = many_daemons_config(sup, "oneshot", '["sh", "-c", "exit 3"]')
    proc, counted = start_counted(sup, config)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output[-3000:]
    assert "phase many: stopping → failed" in output
    check_everything_ended(output, counted)


def test_a_shutdown_with_200_daemons_stops_them_all_with_a_bounded_number_of_scans(sup: Runner) -> None:
    proc, counted = start_counted(sup, many_daemons_config(sup, "service", '["sleep", "1000"]'))
    up = until(proc, "phase many: service is up")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    output = up + rest
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    # Reverse start order still: the command first (its own wave), then the daemons, d199 first.
    stops = re.findall(r"stopping many/(\S+) \(supervisor shutdown\)", output)
    assert stops[:3] == ["many", f"d{DAEMONS - 1}", f"d{DAEMONS - 2}"], stops[:5]
    check_everything_ended(output, counted)


def test_a_second_sigterm_with_200_daemons_kills_them_all_and_the_run_ends(sup: Runner) -> None:
    """Daemons that ignore SIGTERM, so the second SIGTERM surely comes during the stop. Killed at once,
    they are all gone by the time the stop in order reaches them: a stop that ends at once must not call
    the next one from inside itself (200 deep, that was a RecursionError, and the shutdown never ended)."""
    stubborn = """["sh", "-c", "trap '' TERM; exec sleep 1000"]"""
    proc, counted = start_counted(sup, many_daemons_config(sup, "service", '["sleep", "1000"]', stubborn))
    output = until(proc, "phase many: service is up")
    proc.send_signal(signal.SIGTERM)
    output += until(proc, "shutting down: received SIGTERM")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    output += rest
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "SIGKILL to everything now" in output and "internal error" not in output, output[-3000:]
    pids = daemon_pids(output)
    assert len(pids) == DAEMONS and not [pid for pid in pids if pid_alive(pid)]
    assert_scans_bounded(counted)


@heavy
def test_a_phase_of_1000_daemons_starts_and_stops_cleanly(sup: Runner) -> None:
    """Started one after another in a loop, not a call per daemon: 240 and more were a RecursionError
    (and a misleading spawn_failed before it), the phase never started and the supervisor exited 70."""
    count = 1000
    proc = sup.start(many_daemons_config(sup, "service", '["sleep", "1000"]', count=count))
    up = until(proc, "phase many: service is up")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=240)
    output = up + rest
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "internal error" not in output and "RecursionError" not in output and "spawn_failed" not in output
    pids = daemon_pids(output)
    assert len(set(pids)) == count, output[-3000:]
    assert not [pid for pid in pids if pid_alive(pid)]
    stopped = re.findall(r"\] ended: phase=many child=d\d+ pid=\d+ reason=stopped ", output)
    assert len(stopped) == count, output[-3000:]
    assert "leftover process" not in output


# ---------------------------------------------------------------- in-process


PHASES = """
[[phases]]
name = "a"
command = ["true"]
[[phases.daemons]]
name = "a1"
command = ["true"]
[[phases.daemons]]
name = "a2"
command = ["true"]

[[phases]]
name = "b"
command = ["true"]
[[phases.daemons]]
name = "b1"
command = ["true"]
"""


def test_the_daemons_of_one_phase_one_after_another_are_one_wave() -> None:
    a, b = parse_plan(PHASES, "test.toml", {}).phases
    child = {spec.label: SimpleNamespace(spec=spec) for spec in (a.command, *a.daemons, b.command, *b.daemons)}
    order = ["b/b", "b/b1", "a/a2", "a/a1", "a/a"]  # reverse start order
    waves = stop_waves([child[label] for label in order])  # type: ignore[misc]
    assert [[c.spec.label for c in wave] for wave in waves] == [["b/b"], ["b/b1"], ["a/a2", "a/a1"], ["a/a"]]
    # A kept daemon of an earlier phase between two of a later one's: order is kept, so it cuts the wave.
    waves = stop_waves([child[label] for label in ["a/a2", "b/b1", "a/a1"]])  # type: ignore[misc]
    assert [[c.spec.label for c in wave] for wave in waves] == [["a/a2"], ["b/b1"], ["a/a1"]]


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A leader in its own group, and an escapee: in a session of its own, not below the leader,
    found only by the tag it carries (as a setsid'ed grandchild is, once its parent is gone)."""
    leader = subprocess.Popen(["sleep", "60"], process_group=0)
    escapee = subprocess.Popen(["sleep", "60"], start_new_session=True, env={**os.environ, TAG_ENV: "test.1"})
    # Popen returns once the exec began, before the kernel laid out the new environment: until then it reads
    # empty (the table reads it again then: test_a_process_caught_inside_exec_is_read_again).
    environ = Path(f"/proc/{escapee.pid}/environ")
    wait_for(lambda: TAG_ENV.encode() in environ.read_bytes(), 10)
    yield leader, escapee.pid
    for proc in (escapee, leader):
        proc.kill()
        proc.wait(10)


def test_a_reading_is_shared_while_fresh_and_renewed_when_asked(tree: tuple[subprocess.Popen[bytes], int]) -> None:
    leader, escapee = tree
    now = [1000.0]
    table = ProcessTable(clock=lambda: now[0])
    first = table.snapshot()
    assert {p.pid for p in first.tree(leader.pid, "test.1")} == {leader.pid, escapee}
    assert {p.pid for p in first.tree(leader.pid, "other")} == {leader.pid}  # the escapee: by its tag only
    assert table.snapshot() is first and table.scans == 1
    now[0] += SNAPSHOT_MAX_AGE_S / 2
    assert table.snapshot(newer_than=now[0] - SNAPSHOT_MAX_AGE_S) is first and table.scans == 1
    assert table.snapshot(newer_than=now[0]) is not first and table.scans == 2  # e.g. after a reap
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    os.kill(escapee, signal.SIGKILL)
    wait_for(lambda: not pid_alive(escapee), 10)  # a zombie until reaped: no longer in a reading
    third = table.snapshot()
    assert table.scans == 3 and {p.pid for p in third.tree(leader.pid, "test.1")} == {leader.pid}


def test_a_process_that_vanishes_while_the_table_is_read_is_left_out(tmp_path: Path) -> None:
    """A /proc of files: one of our children listed but gone before its stat is read, one unreadable
    environment, one zombie; the reading goes on and has the others."""
    me = os.getpid()
    proc = tmp_path / "proc"

    def entry(pid: int, ppid: int, state: str = "S", env: bytes | None = b"") -> None:
        d = proc / str(pid)
        d.mkdir(parents=True)
        fields = [state, str(ppid), str(pid)] + ["0"] * 16 + ["12345"]
        (d / "stat").write_text(f"{pid} (a (weird) name) {' '.join(fields)} 0 0\n")
        if env is not None:
            (d / "environ").write_bytes(env)

    (proc / "900").mkdir(parents=True)  # listed, then gone: no stat to read
    entry(901, me, env=b"A=1\0" + TAG_ENV.encode() + b"=t.1\0")
    entry(902, 901, env=None)  # its environment cannot be read
    entry(903, me, state="Z")
    entry(904, 1)  # not ours
    (proc / "self").mkdir()
    snap = ProcessTable(proc=str(proc)).snapshot()
    assert sorted(snap.procs) == [901, 902]
    assert snap.procs[901].tag == "t.1" and snap.procs[902].tag is None
    assert {p.pid for p in snap.tree(901, "t.1")} == {901, 902}


def test_a_process_caught_inside_exec_is_read_again(tmp_path: Path) -> None:
    """CI once read the table while a tagged process was inside execve: its environment read empty, and the
    reading kept "no tag" for the process's life, so an escapee would never have been found by its tag."""
    proc = tmp_path / "proc"
    stat = proc / "905" / "stat"
    stat.parent.mkdir(parents=True)
    stat.write_text(f"905 (sleep) S {os.getpid()} 905 " + "0 " * 16 + "777 0 0\n")
    environ = stat.with_name("environ")
    environ.write_bytes(b"")  # inside execve: no environment laid out yet
    now = [0.0]
    table = ProcessTable(clock=lambda: now[0], proc=str(proc))
    (proc / "self").mkdir()
    assert table.snapshot().procs[905].tag is None
    environ.write_bytes(b"A=1\0" + TAG_ENV.encode() + b"=t.2\0")  # the exec done
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[905].tag == "t.2"
    environ.write_bytes(b"A=1\0")  # (never so: an environment does not change; here, to see it is kept)
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[905].tag == "t.2", "a tag once read is kept for the process's life"

