"""A daemon that dies and the client it fails: the cause is decided before its effect.

The kernel closes a dying process's files (its sockets) in the middle of its exit, before it tells the
parent, and frees its memory before both. So a client whose server dies sees the connection break, fails and
can be reaped first: the CI once saw the demo's crashed cuzk-daemon (exit 3) named "stopped", the bench's
"no answer" (exit 1) the phase's failure, and the run's status 1. Now a command that fails while a daemon of
its attempt is dying waits (boundedly) for that daemon, whose death ends the attempt.

The dying daemon is made deterministic, not raced: its main thread leaves by the bare exit syscall while
another thread lives on, so the process is a zombie leader (state Z in /proc) for as long as the test wants,
and the command fails only once it sees that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PY, Runner, verdicts

from supervisor.engine.reaping import ExitStatus, Reaper
from supervisor.engine.trees import dying

SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(os.uname().machine)
needs_sys_exit = pytest.mark.skipif(SYS_EXIT is None, reason=f"no exit syscall number known for {os.uname().machine}")

# A daemon that starts dying and takes ``linger`` seconds to finish: its leader thread exits alone (the process
# shows Z), its other thread, deaf to SIGINT and SIGTERM, ends the process with status 3. ``marker``: written
# just before the leader goes.
DYING = """\
import ctypes, os, signal, sys, threading, time
linger, marker = float(sys.argv[1]), sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT, signal.SIGTERM}})
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
def finish():
    time.sleep(linger)
    os._exit(3)
threading.Thread(target=finish).start()
print("daemon: crashing", flush=True)
open(marker, "w").close()
ctypes.CDLL(None).syscall({sys_exit}, 0)
"""


def dying_daemon(tmp: Path) -> Path:
    script = tmp / "dying.py"
    script.write_text(DYING.format(sys_exit=SYS_EXIT))
    return script


@needs_sys_exit
def test_dying_reads_the_kernel_s_word(tmp_path: Path) -> None:
    live = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    marker = tmp_path / "gone"
    going = subprocess.Popen([PY, str(dying_daemon(tmp_path)), "5", str(marker)])
    try:
        deadline = time.monotonic() + 10
        while not (marker.exists() and dying(going.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dying(going.pid), "a zombie leader is dying"
        assert not dying(live.pid), "a sleeping process is not"
        assert not dying(os.getpid())
    finally:
        for proc in (live, going):
            proc.kill()
            proc.wait()
    assert not dying(live.pid), "a reaped pid is no one's"


@needs_sys_exit
def test_reap_dying_waits_for_a_dying_child_and_leaves_a_live_one(tmp_path: Path) -> None:
    told: list[tuple[int, ExitStatus]] = []
    orphans: list[int] = []
    reaper = Reaper(on_orphan=lambda pid, _status: orphans.append(pid))
    live = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    marker = tmp_path / "gone"
    going = subprocess.Popen([PY, str(dying_daemon(tmp_path)), "0.3", str(marker)])
    try:
        for proc in (live, going):
            reaper.watch(proc.pid, lambda pid, status: told.append((pid, status)))
        started = time.monotonic()
        assert reaper.reap_dying(live.pid, 5) is False and not told
        assert time.monotonic() - started < 1, "a live child is not waited for"
        deadline = time.monotonic() + 10
        while not (marker.exists() and dying(going.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reaper.reap_dying(going.pid, 10) is True
        assert told == [(going.pid, ExitStatus(3, None))]
        assert reaper.reap_dying(going.pid, 10) is False, "reaped: no one's any more"
    finally:
        live.kill()
        live.wait()
        going.returncode = 3  # (reaped above, by the reaper: Popen must not wait for it)
    assert orphans == []


@needs_sys_exit
def test_a_command_that_fails_as_its_daemon_dies_fails_of_the_daemon(sup: Runner, tmp_path: Path) -> None:
    """The bench of the demo's daemon-crash, without the race: the command fails (1) once its daemon is dying,
    and the daemon takes 0.4 s more to be reaped. Its death is the attempt's failure and the run's status (3);
    it is no "stopped" daemon. The command's exit is recorded first, as it was reaped; the daemon's decides."""
    marker = tmp_path / "crashed"
    config = sup.write(f"""
        [[phases]]
        name = "bench"
        kind = "oneshot"
        command = ["sh", "-c", "while [ ! -e {marker} ]; do sleep 0.01; done; sleep 0.05; echo no answer; exit 1"]

        [[phases.daemons]]
        name = "daemon"
        command = ["{sys.executable}", "{dying_daemon(tmp_path)}", "0.4", "{marker}", "0.3"]
        """)
    result = sup.run(config)
    assert result.returncode == 3, result.output
    failed = [(f["child"], f["reason"], f["exit_code"]) for f in verdicts(result.output, "FAILED")]
    assert failed == [("bench", "exit_code", "1"), ("daemon", "daemon_died", "3")], result.output
    assert verdicts(result.output, "ended") == [], "neither is a child the supervisor stopped"
    assert "phase bench: stopping → failed (daemon_died" in result.output, result.output


# ---------------------------------------------------------------- dying(): /proc/<pid>/stat read in-process


def stat_with(state: bytes, flags: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the name, as trees.stat_fields returns them: state, then ppid,
    pgrp, session, tty, tpgid, and the flags at index 6."""
    return [state, b"1", b"4242", b"4242", b"0", b"-1", str(flags).encode(), b"0", b"0"]


@pytest.mark.parametrize(("state", "flags", "ends"), [
    (b"R", 0x4, True),  # PF_EXITING: still freeing a big address space, not a zombie yet
    (b"D", 0x4 | 0x400000, True),  # the flag among others
    (b"Z", 0, True), (b"X", 0, True),  # a zombie not reaped yet, or one being reaped
    (b"R", 0, False), (b"S", 0x400000, False),  # alive: other flags are no sign of an end
])
def test_dying_reads_the_exiting_flag_as_well_as_the_zombie_state(
        monkeypatch: pytest.MonkeyPatch, state: bytes, flags: int, ends: bool) -> None:
    from supervisor.engine import trees

    monkeypatch.setattr(trees, "stat_fields", lambda pid: stat_with(state, flags))
    assert dying(4242) is ends


def test_dying_is_false_for_a_process_gone_or_a_stat_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.engine import trees

    for fields in (None, [b"R"], [b"R", b"1", b"1", b"1", b"0", b"-1", b"flags?"]):
        monkeypatch.setattr(trees, "stat_fields", lambda pid, fields=fields: fields)
        assert dying(4242) is False, fields
