"""The sweeps never give up on a race (issue 14, class 9).

An escapee that forks short-lived processes in a tight loop: some of them vanish while the
supervisor lists its descendants, others are born after the listing. The exit sweep goes round
after round until none is left, in every run; the start's sweep of a dead supervisor's tagged
survivors does the same. In-process: a listed process that is already gone costs nothing, and
what survives the bound is said by pid and name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import PY, Runner, read_pid, toml_list, wait_for
from hungmount import held_mount

from supervisor.engine.trees import (
    STATE_DIR_ENV,
    TAG_ENV,
    kill_pids,
    kill_survivors_of_dead_supervisors,
    kill_until_none_left,
    killed_already,
    left_alive_by,
    own_pid_namespace,
    start_ticks,
    sweep_descendants,
    tag_start,
)

RUNS = 5
# A pid no process can have: signalling it is ESRCH, a tag naming it names a supervisor that is gone.
NO_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1

# Writes its pid, then forks short-lived children (each lives 50 ms) as fast as it can, up to 150 at
# a time, reaping them as they end, forever: whenever the supervisor lists its descendants, some of
# those listed are gone (reaped) a moment later, and new ones are born. (Before the fix, the exit
# sweep gave up on the first one gone in about half the runs.) Started with an empty environment, in a session
# of its own, by a parent that exits at once (see ESCAPE): out of its phase's group, its parent chain
# and its tag; only the exit sweep can find it.
TIGHT_FORKER = """
import os, sys, time
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(os.getpid()))
os.replace(tmp, sys.argv[1])
alive = 0
while True:
    if alive < 150:
        if os.fork() == 0:
            time.sleep(0.05)
            os._exit(0)
        alive += 1
    else:
        os.waitpid(-1, 0)
        alive -= 1
    while alive and os.waitpid(-1, os.WNOHANG)[0]:
        alive -= 1
"""

ESCAPE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", sys.argv[2], sys.argv[1]], {})
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
"""


def marked(marker: str) -> list[psutil.Process]:
    """Live processes whose command line names ``marker`` (the escapee and its children carry it)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and any(marker in part for part in proc.cmdline()):
                found.append(proc)
    return found


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[str]:
    """A path only this test's escapees name; whatever still names it at the end is killed."""
    path = str(tmp_path / "escapee.pid")
    yield path
    for proc in marked(path):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def escapee_config(sup: Runner, pidfile: str) -> Path:
    script = sup.tmp / "escape.py"
    script.write_text(textwrap.dedent(ESCAPE))
    # No per-phase cgroup: its leftovers would be killed at the phase's end, and this is about the exit sweep.
    return sup.write(sup.header(extra='cgroups = "off"') + textwrap.dedent(f"""
        [[phases]]
        name = "escape"
        command = {toml_list([PY, str(script), pidfile, TIGHT_FORKER])}
        """), header=False)


def test_the_exit_sweep_kills_a_tight_forking_escapee_in_every_run(sup: Runner, marker: str) -> None:
    config = escapee_config(sup, marker)
    for run in range(RUNS):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
        result = sup.run(config, timeout=60)
        assert result.returncode == 0, result.output
        escapee = int(Path(marker).read_text())
        left = marked(marker)
        assert not left, f"run {run + 1} of {RUNS}: still alive after the supervisor exited: " \
                         f"{[(p.pid, p.name()) for p in left]}; output:\n{result.output[-3000:]}"
        assert f"leftover process(es): {escapee} (" in result.output, result.output[-3000:]


# Tagged as a child of a supervisor that is gone: a new start for the same state_dir must end it and
# everything it forks while being killed. It keeps about 100 children alive, each for 60 s, forking a
# new one (and ending the oldest) every millisecond.
TAGGED_FORKER = """
import os, signal, sys, time
kids = []
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
    if len(kids) > 100:
        old = kids.pop(0)
        os.kill(old, signal.SIGKILL)
        os.waitpid(old, 0)
    time.sleep(0.001)
"""


def test_the_start_sweep_kills_a_dead_supervisors_survivor_and_what_it_forks(
        sup: Runner, marker: str) -> None:
    state_dir = str(sup.state_dir)
    env = {"PATH": os.environ.get("PATH", ""), "PROVER_SUPERVISOR_TAG": f"{NO_PID}.1",
           "PROVER_SUPERVISOR_STATE_DIR": state_dir}
    survivor = subprocess.Popen([PY, "-c", TAGGED_FORKER, marker], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        read_pid(Path(marker))
        wait_for(lambda: len(marked(marker)) > 50, 20, 0.05)
        config = sup.write(sup.header(extra='cgroups = "off"') + textwrap.dedent("""
            [[phases]]
            name = "after"
            command = ["true"]
            """), header=False)
        result = sup.run(config, timeout=60)
        assert result.returncode == 0, result.output
        assert "left by a supervisor that died without stopping them" in result.output, result.output
        left = marked(marker)
        assert not left, f"still alive: {[(p.pid, p.name()) for p in left]}; output:\n{result.output[-3000:]}"
    finally:
        with contextlib.suppress(OSError):
            survivor.kill()
        survivor.wait(10)


# ---------------------------------------------------------------- in-process


@pytest.mark.parametrize(("left_as", "asked_as"), [("sub/../real", "real"), ("real", "link")])
def test_the_start_sweep_and_status_read_one_state_dir_spelt_two_ways_as_one(
        tmp_path: Path, left_as: str, asked_as: str) -> None:
    """status named a survivor "the next start of this state_dir ends them", and that start, its state_dir spelt
    another way (``/s/sub/../real``, a symlink to it), left it alive: the sweep compared the text, status the
    folder."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    env = {"PATH": os.environ.get("PATH", ""), TAG_ENV: f"{NO_PID}.1", STATE_DIR_ENV: str(tmp_path / left_as)}
    survivor = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(survivor.pid).environ().get(TAG_ENV) is not None, 10, 0.01)
        asked = str(tmp_path / asked_as)
        assert [s["pid"] for s in left_alive_by(NO_PID, asked)] == [survivor.pid]
        lines: list[str] = []
        assert kill_survivors_of_dead_supervisors(asked, lines.append) == 1, lines
        assert survivor.wait(10) == -signal.SIGKILL
    finally:
        with contextlib.suppress(OSError):
            survivor.kill()
        survivor.wait(10)


def test_a_tag_whose_supervisor_pid_was_given_since_to_a_process_naming_it_is_a_dead_supervisors(
        tmp_path: Path) -> None:
    """The supervisor a tag names was SIGKILLed, and its pid given since to a ``tail -f …/supervisor.log``: a
    command line that says "supervisor". The tag's start time is not that process's, so what the tag marks is a
    dead supervisor's survivor: the start's sweep kills it, and status names it among what the supervisor that
    started at that time left. A tag whose start time is the live process's names a live supervisor: left alone;
    and status does not count it as the dead one's."""
    log = tmp_path / "supervisor.log"
    log.write_text("")
    tail = subprocess.Popen(["tail", "-f", str(log)], stdout=subprocess.DEVNULL)
    survivors: dict[str, subprocess.Popen[bytes]] = {}
    try:
        wait_for(lambda: start_ticks(tail.pid) is not None, 10, 0.01)
        theirs = start_ticks(tail.pid)
        assert theirs is not None
        dead = theirs - 1  # (a supervisor of that pid, started before it)
        for name, start in (("dead", dead), ("live", theirs)):
            tag = f"{tail.pid}.{own_pid_namespace()}.1.{start}"
            assert tag_start(tag) == start
            env = {"PATH": os.environ.get("PATH", ""), TAG_ENV: tag, STATE_DIR_ENV: str(tmp_path)}
            survivors[name] = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
        wait_for(lambda: all(psutil.Process(p.pid).environ().get(TAG_ENV) for p in survivors.values()), 10, 0.01)

        assert [s["pid"] for s in left_alive_by(tail.pid, str(tmp_path), dead)] == [survivors["dead"].pid]
        assert [s["pid"] for s in left_alive_by(tail.pid, str(tmp_path), theirs)] == [survivors["live"].pid]
        assert {s["pid"] for s in left_alive_by(tail.pid, str(tmp_path))} == {
            p.pid for p in survivors.values()}  # (no start time recorded: the pid alone, as before)
        lines: list[str] = []
        assert kill_survivors_of_dead_supervisors(str(tmp_path), lines.append) == 1, lines
        assert survivors["dead"].wait(10) == -signal.SIGKILL
        assert survivors["live"].poll() is None and tail.poll() is None
    finally:
        for proc in [*survivors.values(), tail]:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(10)


def test_a_listed_process_that_is_gone_is_skipped_and_the_rest_killed() -> None:
    alive = subprocess.Popen(["sleep", "60"])
    lines: list[str] = []
    rounds: list[dict[int, str]] = [{NO_PID: "gone", alive.pid: "sleep"}]  # the first: listed, then it vanished

    def find() -> dict[int, str]:
        if rounds:
            return rounds.pop()
        return {alive.pid: "sleep"} if alive.poll() is None else {}

    try:
        killed = kill_until_none_left(find, lines.append, "test process(es)", 10)
        assert alive.wait(10) == -signal.SIGKILL
        assert alive.pid in killed and lines == [f"killed {len(killed)} test process(es): " +
                                                 ", ".join(f"{pid} ({name})" for pid, name in killed.items())]
    finally:
        with contextlib.suppress(OSError):
            alive.kill()
        alive.wait(10)


def test_what_survives_the_bound_is_said_by_pid_and_name_and_never_as_killed() -> None:
    """A zombie cannot be killed: it stands in for a process stuck in uninterruptible sleep. It was said to have
    survived SIGKILL, then, in the next line, to have been killed (a reviewer's run)."""
    zombie = subprocess.Popen(["sleep", "0"])
    alive = subprocess.Popen(["sleep", "60"])
    wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 10)
    lines: list[str] = []

    def found() -> dict[int, str]:
        return {pid: "sleep" for pid in (zombie.pid, alive.pid) if pid == zombie.pid or alive.poll() is None}

    try:
        kill_until_none_left(found, lines.append, "test process(es)", 0.2)
    finally:
        zombie.wait(10)
        with contextlib.suppress(OSError):
            alive.kill()
        alive.wait(10)
    assert lines == [f"1 process(es) survived SIGKILL for 0.2s (uninterruptible sleep?): {zombie.pid} (sleep)",
                     f"killed 1 test process(es): {alive.pid} (sleep)"], lines


def test_the_exit_sweep_says_no_process_killed_before_it_as_killed_again(tmp_path: Path) -> None:
    # A phase's sweep SIGKILLed an escapee a moment before the exit's sweep, which found it not dead yet (a SIGKILL
    # takes a moment, longer in a wait on a hung mount) and said it again, 11 ms later, as a second one: "killed 1
    # leftover process(es)" with the same pid. It is waited for, and said once, by what killed it.
    with held_mount(tmp_path / "mnt") as held:
        stuck = subprocess.Popen(["stat", str(held.path / "x")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: held.held >= 1, 10)  # its request is the server's: SIGKILL waits for its answer
            lines: list[str] = []
            assert kill_pids([stuck.pid], lines.append, "still in phase p's cgroup") == [stuck.pid]
            assert killed_already(stuck.pid)
            release = threading.Timer(0.3, held.release)  # the answer never comes: the connection ends
            release.start()
            assert sweep_descendants(lines.append) == 1
            release.join()
            assert stuck.wait(10) == -signal.SIGKILL
        finally:
            with contextlib.suppress(OSError):
                stuck.kill()
    assert lines == [f"killed 1 process(es) still in phase p's cgroup: {stuck.pid} (stat)"], lines


def test_the_exit_sweep_in_process_kills_our_descendants_and_says_nothing_when_none_is_left() -> None:
    child = subprocess.Popen([PY, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"])
    try:
        # (its child exec'd sleep: before that it is a python of the same name as its parent)
        wait_for(lambda: [p.name() for p in psutil.Process(child.pid).children()] == ["sleep"], 10)
        grandchild = psutil.Process(child.pid).children()[0].pid
        lines: list[str] = []
        assert sweep_descendants(lines.append) == 2
        assert child.wait(10) == -signal.SIGKILL
        assert lines and lines[0].startswith("killed 2 leftover process(es): ") and f"{grandchild} (sleep)" in lines[0]
        assert sweep_descendants(lines.append) == 0 and len(lines) == 1  # nothing left: nothing said
    finally:
        with contextlib.suppress(OSError):
            child.kill()
        child.wait(10)
