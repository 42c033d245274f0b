"""The one reaper: every wait for a child that ran goes through here (spawn.py waits only for a child whose
exec failed or hung, before anyone else knows its pid).

CPython's ``subprocess.Popen`` records ``returncode = 0`` when ``waitpid`` fails
with ECHILD, so a reaper beside ``Popen.wait()`` would turn a crashed phase into
a success. Here a single ``waitpid(-1, WNOHANG)`` loop owns every exit status
and hands it to whoever registered the PID; statuses of PIDs nobody owns
(re-parented orphans) are logged and dropped. It asks for stops and continues
too (``WUNTRACED | WCONTINUED``): a child stopped by a signal (SIGSTOP, or
SIGTTIN/SIGTTOU: a read or write of the terminal from its background process
group under ``docker run -it``) does nothing until it is continued, and that is
said, once each way, instead of a silence that only a stall watch would end.

It also decides the init role: PID 1 reaps the namespace by nature; anything
else asks the kernel to become a child subreaper so that orphans of its
children come back to it. Same code path either way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .signals import signal_name
from .trees import dying

PR_SET_CHILD_SUBREAPER = 36
OOM_SCORE_ADJ_MIN = -1000
# Where the supervisor may not lower its own score (no CAP_SYS_RESOURCE, as in a default
# container), its children raise theirs instead, which needs no privilege: the OOM killer
# still prefers them to the supervisor.
CHILD_OOM_SCORE_ADJ_UNPROTECTED = 500


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended, decoded like tini and bash do. What is derived from it is worked out once, here:
    every reader (the process's last line, its verdict, the exit status) reads fields, never asks again."""

    code: int | None  # exit code when it exited by itself
    signal: int | None  # the signal that killed it
    core_dumped: bool = False
    shell_status: int = field(init=False, compare=False)  # what a shell shows: the code, or 128 + the signal
    signal_name: str | None = field(init=False, compare=False, repr=False)  # "SIGKILL", None: not signalled
    success: bool = field(init=False, compare=False, repr=False)  # exited with 0

    def __post_init__(self) -> None:
        derived = {"shell_status": 128 + self.signal if self.signal is not None else (self.code or 0),
                   "signal_name": None if self.signal is None else signal_name(self.signal),
                   "success": self.code == 0}
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # (frozen: set once, as it is made)

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            return cls(None, os.WTERMSIG(status), os.WCOREDUMP(status))
        if os.WIFEXITED(status):
            return cls(os.WEXITSTATUS(status), None)
        raise ValueError(f"not a final wait status: {status:#x}")

    def describe(self) -> str:
        if self.signal is not None:
            core = ", core dumped" if self.core_dumped else ""
            return f"killed by {self.signal_name} (status {self.shell_status}{core})"
        return f"exited with code {self.code}"


# How often a dying child is looked at while it is waited for (reap_dying).
DYING_POLL_S = 0.002

StatusHandler = Callable[[int, ExitStatus], None]
# Told a registered child was stopped or continued: its label and the line that says so.
StopHandler = Callable[[str], None]
# Told of a child's job-control state: the signal that stopped it (SIGSTOP, SIGTSTP, ...), or None once continued.
JobHandler = Callable[[str | None], None]
# The stops that come of a terminal (the child is in a background process group of it), said as such.
_TERMINAL_STOPS = {"SIGTTIN": "it read from the terminal from the background",
                   "SIGTTOU": "it wrote to the terminal from the background"}


class Reaper:
    """Owns ``waitpid``: PIDs are registered with a handler that receives their status (and a label, by which
    their stops and continues are said to ``on_stop``, and a ``job`` handler their owner keeps them by)."""

    def __init__(self, on_orphan: StatusHandler, on_stop: StopHandler | None = None) -> None:
        # pid → its handler, its label, and who keeps its job-control state
        self._owners: dict[int, tuple[StatusHandler, str | None, JobHandler | None]] = {}
        self._on_orphan = on_orphan
        self._on_stop = on_stop

    def watch(self, pid: int, handler: StatusHandler, label: str | None = None, job: JobHandler | None = None) -> None:
        self._owners[pid] = (handler, label, job)

    def reap(self) -> None:
        """Collect every exited child until none is left waiting."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED | os.WCONTINUED)
            except ChildProcessError:
                return
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
            if pid == 0:
                return
            if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
                self._say_stop(pid, status)
                continue
            exit_status = ExitStatus.from_wait_status(status)
            handler = self._owners.pop(pid, (self._on_orphan,))[0]
            handler(pid, exit_status)

    def reap_dying(self, pid: int, wait_s: float) -> bool:
        """Reap ``pid`` out of turn if it is dying (the kernel is ending it: a zombie, or PF_EXITING set),
        waiting at most ``wait_s`` for its exit to complete; True when its handler was told here.

        Why: the kernel closes a dying process's files (its sockets, its pipes) in the middle of its exit,
        before it tells the parent (do_exit: exit_files, then exit_notify; freeing a big address space comes
        before both). A client of a server that dies sees the connection break, fails and can be reaped first:
        the effect before its cause. The caller asks this of the child it suspects, before it decides."""
        if pid not in self._owners or not dying(pid):
            return False
        deadline = time.monotonic() + wait_s
        while True:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return False
            if got == pid and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
                handler = self._owners.pop(pid)[0]
                handler(pid, ExitStatus.from_wait_status(status))
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(DYING_POLL_S)

    def _say_stop(self, pid: int, status: int) -> None:
        _, label, job = self._owners.get(pid, (None, None, None))
        name = None if os.WIFCONTINUED(status) else signal_name(os.WSTOPSIG(status))
        if job is not None:
            job(name)
        if label is None or self._on_stop is None:
            return  # (an orphan's stop, or nobody to tell)
        if name is None:
            self._on_stop(f"{label} (pid {pid}) was continued")
            return
        why = _TERMINAL_STOPS.get(name)
        self._on_stop(f"{label} (pid {pid}) was stopped by {name}{f' ({why})' if why else ''}: it does nothing "
                      "until it is continued (SIGCONT)")


# ---------------------------------------------------------------- init role


def claim_init_role() -> str:
    """Become the reaper of our subtree; returns "pid1" or "subreaper" (or why it could not)."""
    if os.getpid() == 1:
        return "pid1"
    if _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0:
        return "subreaper"
    return f"plain parent (PR_SET_CHILD_SUBREAPER failed: {os.strerror(ctypes.get_errno())})"


def _prctl(option: int, arg: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)  # the libc already loaded: no ldconfig lookup
    return int(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0))


def protect_from_oom_killer() -> tuple[str, int]:
    """Make the kernel's OOM killer pick a child, never the supervisor.

    Returns what was done, and the oom_score_adj children should set for themselves:
    0 when the supervisor went to -1000; else CHILD_OOM_SCORE_ADJ_UNPROTECTED, or the supervisor's own score
    where that is higher (never below it: the killer must still pick a child before the supervisor).
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ_MIN))
        return f"oom_score_adj {OOM_SCORE_ADJ_MIN}, children 0", 0
    except OSError as exc:
        reason = "not allowed" if exc.errno in (errno.EACCES, errno.EPERM) else exc.strerror
        child = max(CHILD_OOM_SCORE_ADJ_UNPROTECTED, _own_oom_score_adj())
        return f"oom_score_adj unchanged ({reason}); children raised to {child} instead", child


def _own_oom_score_adj() -> int:
    try:
        with open("/proc/self/oom_score_adj") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0
