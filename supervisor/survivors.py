"""Finding and ending what escaped its child's tree or outlived its supervisor.

A child's tree is stopped by its Child (process.py); what these functions end is
what that tree cannot reach. A supervisor that was SIGKILLed leaves its children
running, re-parented above it: the next supervisor of the same state_dir finds
them by the tag every child carries in its environment (``TAG_ENV``, inherited
by its own children) and by ``STATE_DIR_ENV``. A process that cleared its
environment is found only by the phase cgroup it was born in (``kill_cgroup``,
or the pids the memory module reads there, ``kill_pids``). At the supervisor's
exit, ``sweep_descendants`` makes sure nothing it started outlives it.

What is ended here gets SIGKILL at once: the graceful stop was its Child's (or
died with its supervisor). The Child's own stop shares ``signal_quietly`` and the
patience constants with this module.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from .units import is_ascii_digits

# In every child's environment: "<supervisor pid>.<sequence>", inherited by whatever it starts.
TAG_ENV = "PROVER_SUPERVISOR_TAG"
# In every child's environment: the state_dir of the supervisor that started it.
STATE_DIR_ENV = "PROVER_SUPERVISOR_STATE_DIR"
# While processes are being stopped, how often to look whether any of them is left.
STOP_POLL_S = 0.05
# After SIGKILL, how long to wait for them to vanish before saying what is stuck.
KILL_WAIT_S = 10.0

Log = Callable[[str], None]


def sweep_descendants(log: Log) -> int:
    """SIGKILL whatever descends from the supervisor: nothing may outlive it."""
    try:
        left = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return 0
    for proc in left:
        signal_quietly(os.kill, proc.pid, signal.SIGKILL)
    if left:
        log(f"killed {len(left)} leftover process(es): {', '.join(str(p.pid) for p in left[:10])}")
    return len(left)


def kill_survivors_of_dead_supervisors(state_dir: str, log: Log) -> int:
    """Children of a supervisor that was SIGKILLed live on (re-parented above it) and hold its
    ports and GPUs: a new supervisor of the same state_dir ends them before it starts anything.
    A process counts when it was started for this state_dir and its tag names a supervisor pid
    that is gone (or is no longer a prover-supervisor)."""
    me = os.getpid()
    left = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        tag = env.get(TAG_ENV)
        if not tag or env.get(STATE_DIR_ENV) != state_dir:
            continue
        owner_text = tag.split(".", 1)[0]
        owner = int(owner_text) if is_ascii_digits(owner_text) else 0
        if owner == me or _is_live_supervisor(owner):
            continue
        left.append(proc.pid)
    return len(kill_pids(left, log, "left by a supervisor that died without stopping them"))


def kill_pids(pids: list[int], log: Log, why: str) -> list[int]:
    """SIGKILL each of ``pids`` (found some way the process tree could not be: a cgroup); say which and why."""
    killed: list[int] = []
    named: list[str] = []
    for pid in pids:
        name = _name_of(pid)  # before the kill: a dead process has no name to read
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue  # gone meanwhile
        killed.append(pid)
        named.append(f"{pid} ({name})")
    if killed:
        shown = ", ".join(named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")
        log(f"killed {len(killed)} process(es) {why}: {shown}")
    return killed


def kill_cgroup(procs_file: Path, log: Log, why: str, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL everything in a cgroup until its ``cgroup.procs`` is empty; True once it is.

    The file is read again after each round: a member may fork between the read and its kill,
    and the child is born in the same cgroup. Blocks (for at most ``wait_s``): only for use
    before the event loop runs.
    """
    deadline = time.monotonic() + wait_s
    said = why
    signalled: set[int] = set()
    while True:
        try:
            pids = [int(p) for p in procs_file.read_text().split()]
        except FileNotFoundError:
            return True
        except (OSError, ValueError) as exc:
            log(f"cannot read {procs_file}: {exc}; its processes are left alone")
            return False
        if not pids:
            return True
        if time.monotonic() > deadline:
            log(f"{procs_file.parent}: {len(pids)} process(es) survived SIGKILL for {wait_s:g}s "
                f"(uninterruptible sleep?): {', '.join(map(str, pids[:10]))}; cgroup left in place")
            return False
        # A killed process stays listed until it has died: each one is signalled (and said) once.
        signalled.update(kill_pids([p for p in pids if p not in signalled], log, said))
        time.sleep(STOP_POLL_S)
        said = f"{why} (forked meanwhile)"


def _name_of(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _is_live_supervisor(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and TAG_ENV not in proc.environ() and \
            any("supervisor" in part for part in proc.cmdline())
    except (psutil.Error, OSError):
        return False


def signal_quietly(fn: Callable[[int, int], None], pid: int, sig: int) -> None:
    """Signal a pid or group that may be gone already (ESRCH) or not ours to signal (EPERM); other errors raise."""
    try:
        fn(pid, sig)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise
