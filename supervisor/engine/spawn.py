"""Starting a child: fork, set it up, exec, and wait a bounded time to learn how the exec went.

The child is forked here rather than through ``subprocess.Popen``, because Popen waits, with no bound,
until the exec has run or failed, and an exec can hang. A command, or its working directory, on a FUSE or
NFS mount whose server stopped answering blocks ``chdir`` or ``execve`` in the kernel; under Popen the
supervisor's loop would block with it: no status answered, no signal handled, no report sent, for as
long as the mount hangs. Here the loop waits at most ``EXEC_WAIT_S``. A child that has not exec'd by
then is killed and the start fails, saying so (the retry policy decides what follows).

The child says how its exec went as Popen's does, over a close-on-exec pipe: the pipe closing with
nothing on it means the exec ran; ``<stage> <errno> <text>`` on it means a step failed, and the child
exits 127 at once (this function reaps it). ENOENT is 127 and the rest 126, as a shell reports them; a
script whose ``#!`` interpreter is missing (ENOENT from the kernel, though the script is there) is said
as that, 126, as bash says "bad interpreter".

Nobody else waits for a child: the reaper (reaping.py) owns ``waitpid`` for every child that ran. With
no Popen object there is no Popen ``_cleanup`` either, which could reap (and lose) an exit status.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import os
import select
import signal
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from ..config import ChildSpec
from .clock import SYSTEM_CLOCK, Clock
from .logs import ChildOutput
from .process import Child
from .trees import TAG_ENV

# An exec that runs takes milliseconds, even of a large binary (only its first page is read before
# execve returns); seconds mean the kernel is waiting on a filesystem. The loop waits this long at
# most: long enough for a machine thrashing under memory pressure, short enough that a hung mount
# costs one late status answer, not a silent supervisor.
EXEC_WAIT_S = 5.0
# How long a killed child that never exec'd is waited for here; past it the reaper reaps it as an orphan
# (a process blocked in a filesystem that does not let SIGKILL in stays until the filesystem answers).
KILLED_REAP_WAIT_S = 0.2
# The most of a child's failure report read: the stage, the errno and the error's text.
REPORT_MAX = 4096
# Every signal whose disposition a child can be given: all but SIGKILL and SIGSTOP (glibc's
# own real-time signals are not in valid_signals()).
RESETTABLE_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))

_tag_seq = itertools.count(1)


class SpawnError(Exception):
    """The command could not be started; ``status`` is what a shell would report."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def spawn(spec: ChildSpec, env: Mapping[str, str], output: ChildOutput,
          setup: Callable[[], None] | None = None, clock: Clock = SYSTEM_CLOCK) -> Child:
    """Start ``spec.command`` in a new process group with piped output; raise SpawnError if it can't.

    ``setup`` runs in the child between fork and exec (child_setup: its cgroup, its OOM score)."""
    exec_wait_s = EXEC_WAIT_S  # read at each start: a test shortens it
    tag = f"{os.getpid()}.{next(_tag_seq)}"
    argv = list(spec.command)
    child_env = {**env, TAG_ENV: tag}
    opened: list[int] = []
    try:
        out_r, out_w = _pipe(opened)
        err_r, err_w = _pipe(opened)
        report_r, report_w = _pipe(opened)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        opened.append(null)
        max_fd = os.sysconf("SC_OPEN_MAX")
        # No garbage collection in the child before its exec (as Popen does around a preexec_fn): a
        # finalizer run there could flush a buffered file of the supervisor's a second time.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with warnings.catch_warnings():
                # Python 3.12 warns of fork() in a process with threads: the child runs only calls that take
                # no Python-level lock before its exec (as a Popen preexec_fn has to), so it cannot deadlock.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                _become(argv, child_env, spec.cwd, setup, (null, out_w, err_w), report_w, max_fd)
        finally:
            if collecting:
                gc.enable()
    except OSError as exc:
        _close(opened)
        raise SpawnError(126, f"{argv[0]}: cannot start a process: {exc.strerror or exc}") from None
    _close([out_w, err_w, report_w, null])
    try:
        report = _await_exec(report_r, exec_wait_s)
    finally:
        os.close(report_r)
    if report is None:
        _close([out_r, err_r])
        _kill_unexeced(pid)
        raise SpawnError(126, f"{argv[0]}: exec did not return within {exec_wait_s:g}s (a hung filesystem under "
                              f"the command or its working directory?); pid {pid} killed")
    if report:
        _close([out_r, err_r])
        _reap(pid)
        raise _failure(argv[0], spec.cwd, report)
    return Child(spec=spec, pid=pid, tag=tag, output=output, pipes={"stdout": out_r, "stderr": err_r},
                 clock=clock, started_at=clock.time())


def child_setup(oom_score_adj: int | None, cgroup_procs: str | None) -> Callable[[], None]:
    """What a child does between fork and exec, besides its signals, group and descriptors (_become).

    It joins its cgroup itself, before exec, so every byte it and its descendants
    allocate is counted there; and it sets its oom_score_adj (back to 0 from the
    supervisor's -1000, or above the supervisor's) so the OOM killer picks it, not
    the supervisor. Only calls that take no lock: other threads may hold
    Python-level locks at fork time.
    """
    score = str(oom_score_adj).encode() if oom_score_adj is not None else None

    def setup() -> None:
        if score is not None:
            with contextlib.suppress(OSError):
                _write_file("/proc/self/oom_score_adj", score)
        if cgroup_procs is not None:
            _write_file(cgroup_procs, str(os.getpid()).encode())  # failing here fails the spawn, visibly

    return setup


# ---------------------------------------------------------------- in the child, between fork and exec


def _become(argv: list[str], env: Mapping[str, str], cwd: str | None, setup: Callable[[], None] | None,
            stdio: tuple[int, int, int], report: int, max_fd: int) -> NoReturn:
    """Turn the forked child into ``argv``; on any failure, say which step failed on ``report`` and exit 127."""
    stage = "setup"
    try:
        # Signals first: until they are reset, a signal would run the supervisor's own handler here.
        _reset_signals()
        os.setpgid(0, 0)
        # None of these is 0, 1 or 2, which dup2 overwrites: those are always open in the supervisor, at
        # worst on /dev/null (text/stdio.py's keep_std_fds_open, the first thing cli.main does).
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        _close_inherited(report, max_fd)
        if setup is not None:
            setup()
        if cwd is not None:
            stage = "cwd"
            os.chdir(cwd)  # may block on a hung mount: the supervisor stopped waiting at EXEC_WAIT_S
        stage = "exec"
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        code = exc.errno if isinstance(exc, OSError) and exc.errno else 0
        text = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__
        interpreter = _missing_interpreter(argv[0], env) if stage == "exec" and code == errno.ENOENT else None
        if interpreter is not None:
            stage, text = "interpreter", interpreter
        with contextlib.suppress(BaseException):
            os.write(report, f"{stage} {code} {text}".encode(errors="replace")[:REPORT_MAX])
    os._exit(127)


def _close_inherited(report: int, max_fd: int) -> None:
    """Close everything else the supervisor had open (fd 3 and up), but the report pipe. The open ones are
    listed from /proc/self/fd, as Popen does: os.closerange tries close_range(2), and where the kernel has
    none (before 5.9, not rare on rented hosts) it calls close() on every number up to the limit, a million
    calls in a container whose nofile is 1048576, on every start."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number, then
        os.closerange(3, report)
        os.closerange(report + 1, max_fd)
        return
    for fd in fds:
        if fd > 2 and fd != report:
            with contextlib.suppress(OSError):  # (the listing's own descriptor, already closed)
                os.close(fd)


def _missing_interpreter(program: str, env: Mapping[str, str]) -> str | None:
    """Why an exec that said ENOENT found the program all the same: its ``#!`` interpreter is missing (the
    kernel reports it as the program's own ENOENT). Returns that interpreter, or None."""
    dirs = [""] if "/" in program else os.get_exec_path(env)
    for where in dirs:
        path = os.path.join(where, program)
        try:
            with open(path, "rb") as fh:
                first = fh.readline(256)
        except OSError:
            continue
        if first.startswith(b"#!"):
            words = first[2:].split()
            return words[0].decode(errors="replace") if words else "(none)"
    return None


def _reset_signals() -> None:
    """Default disposition for every signal and an empty mask, as a clean exec would have.

    An ignored disposition survives exec: under ``nohup`` (the manager's onstart command) SIGHUP comes
    ignored, as SIGQUIT does from some job-control shells, and a child would shrug off its own SIGHUP or
    SIGQUIT. A signal that cannot be set is left as it is.
    """
    for signum in RESETTABLE_SIGNALS:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- in the supervisor


def _await_exec(report: int, wait_s: float) -> bytes | None:
    """The child's failure report (b"" when its exec ran), or None when it said nothing within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    poller = select.poll()  # not select(): the supervisor's descriptors may number past FD_SETSIZE
    poller.register(report, select.POLLIN)
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            return None
        data = os.read(report, REPORT_MAX)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _failure(program: str, cwd: str | None, report: bytes) -> SpawnError:
    """The SpawnError a child's report stands for: what a shell would print and exit with."""
    stage, _, rest = report.decode(errors="replace").partition(" ")
    number, _, text = rest.partition(" ")
    code = int(number) if number.isdigit() else 0
    if stage == "cwd":
        if code in (errno.ENOENT, errno.ENOTDIR):
            return SpawnError(126, f"working directory {cwd!r} does not exist")
        return SpawnError(126, f"cannot enter working directory {cwd!r}: {text}")
    if stage == "interpreter":
        return SpawnError(126, f"{program}: bad interpreter: {text}: not found")
    if stage == "exec":
        if code == errno.ENOENT:
            return SpawnError(127, f"{program}: command not found")
        if code in (errno.EACCES, errno.EPERM):
            return SpawnError(126, f"{program}: permission denied (not executable)")
        return SpawnError(126, f"{program}: cannot execute: {text}")
    return SpawnError(126, f"{program}: could not set the child up (cgroup?): {text}")


def _reap(pid: int) -> None:
    """Wait for a child that reported a failed step: it exits right after saying so."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _kill_unexeced(pid: int) -> None:
    """SIGKILL a child stuck before its exec, and reap it if it goes within KILLED_REAP_WAIT_S (a wait in a
    hung FUSE or NFS mount lets SIGKILL in); one that stays is the reaper's, as an orphan, when it goes."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILLED_REAP_WAIT_S
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)


def _pipe(opened: list[int]) -> tuple[int, int]:
    """A close-on-exec pipe, its ends added to ``opened`` (closed together if the spawn fails)."""
    r, w = os.pipe()
    opened += (r, w)
    return r, w


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
