"""Starting a child: fork, set it up, exec, and wait a bounded time to learn how the exec went.

The child is forked here rather than through ``subprocess.Popen``, because Popen waits, with no bound,
until the exec has run or failed, and an exec can hang. A command, or its working directory, on a FUSE or
NFS mount whose server stopped answering blocks ``chdir`` or ``execve`` in the kernel; under Popen the
supervisor's loop would block with it: no status answered, no signal handled, no report sent, for as
long as the mount hangs. Here the loop waits at most the command's ``exec_wait_s`` (5 s unless the config
says more, for a command on a slow mount). A child that has not exec'd by then is killed and the start
fails, saying so (the retry policy decides what follows). Time the whole supervisor was stopped (SIGSTOP,
``docker pause``) does not count: the child was stopped with it, or its exec ran meanwhile.

The child says how its exec went as Popen's does, over a close-on-exec pipe: the pipe closing with
nothing on it means the exec ran; ``<stage> <errno> <text>`` on it means a step failed, and the child
exits 127 at once (this function reaps it). ENOENT is 127 and the rest 126, as a shell reports them; a
script whose ``#!`` interpreter is missing (ENOENT from the kernel, though the script is there) is said
as that, "bad interpreter" as bash said it before 5.1, and 126: the command was found but cannot run
(bash 5.2 says 127, "required file not found", which sends the reader looking for the script). A ``#!``
line ending in CR LF, a script saved on Windows, is said as that.

Between fork and exec the child runs Python, so it calls nothing that may take a lock another thread
held at the fork: where to look for the program (``PATH``) is worked out before the fork, and the child
only tries ``execve`` on each place. Every signal is blocked across the fork: the child must never run
the supervisor's handler, which would write the signal into the supervisor's own wake-up descriptor (a
Ctrl-C to the process group in that window was taken twice: the second one a kill-now).

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
import stat
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from ..config import ChildSpec
from .clock import SYSTEM_CLOCK, Clock
from .logs import ChildOutput
from .process import Child
from .trees import TAG_ENV, tag_for

# How the loop waits for the exec: in slices, each one checked for having come back late. A slice that
# returns more than PAUSED_MIN_S late means the supervisor itself was stopped (SIGSTOP, a cgroup freeze),
# and that time is given back to the wait.
WAIT_SLICE_S = 0.5
PAUSED_MIN_S = 1.0
# How long a killed child that never exec'd is waited for here; past it the reaper reaps it when it goes
# (a process blocked in a filesystem that does not let SIGKILL in stays until the filesystem answers).
KILLED_REAP_WAIT_S = 0.2
# The most of a child's failure report read: the stage, the errno and the error's text.
REPORT_MAX = 4096
# Every signal whose disposition a child can be given: all but SIGKILL and SIGSTOP (glibc's
# own real-time signals are not in valid_signals()).
RESETTABLE_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))

_tag_seq = itertools.count(1)


class SpawnError(Exception):
    """The command could not be started; ``status`` is what a shell would report. ``stuck``: the pid of a child
    SIGKILLed before its exec that did not go (the reaper's to reap, when it goes at last)."""

    def __init__(self, status: int, reason: str, stuck: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.stuck = stuck


def spawn(spec: ChildSpec, env: Mapping[str, str], output: ChildOutput,
          setup: Callable[[], None] | None = None, clock: Clock = SYSTEM_CLOCK,
          paused: Callable[[float], None] | None = None) -> Child:
    """Start ``spec.command`` in a new process group with piped output; raise SpawnError if it can't.

    ``setup`` runs in the child between fork and exec (child_setup: its cgroup, its OOM score); ``paused`` hears
    the seconds the supervisor was stopped while it waited for the exec (EventLoop.holding's Hold.paused)."""
    exec_wait_s = spec.exec_wait_s
    tag = tag_for(next(_tag_seq))
    argv = list(spec.command)
    child_env = {**env, TAG_ENV: tag}
    places = _places(argv[0], child_env)
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
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            with warnings.catch_warnings():
                # Python 3.12 warns of fork() in a process with threads: the child runs only calls that take
                # no Python-level lock before its exec (as a Popen preexec_fn has to), so it cannot deadlock.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
                if pid == 0:  # (inside the block: leaving it takes the warnings module's lock on 3.14)
                    _become(places, argv, child_env, spec.cwd, setup, (null, out_w, err_w), report_w, max_fd)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (a signal that came meanwhile is taken now)
            if collecting:
                gc.enable()
    except OSError as exc:
        _close(opened)
        raise SpawnError(126, f"{argv[0]}: cannot start a process: {exc.strerror or exc}") from None
    _close([out_w, err_w, report_w, null])
    try:
        report = _await_exec(report_r, exec_wait_s, paused)
    finally:
        os.close(report_r)
    if report is None:
        _close([out_r, err_r])
        gone = _kill_unexeced(pid)
        fate = " killed" if gone else ": SIGKILL sent, not gone yet (stuck in the kernel)"
        raise SpawnError(126, f"{argv[0]}: exec did not return within {exec_wait_s:g}s (a hung filesystem under "
                              f"the command or its working directory?); pid {pid}{fate}", None if gone else pid)
    if report:
        _close([out_r, err_r])
        _reap(pid)
        raise _failure(argv[0], _from(places, spec.cwd), spec.cwd, report)
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


def _become(places: Sequence[str], argv: list[str], env: Mapping[str, str], cwd: str | None,
            setup: Callable[[], None] | None, stdio: tuple[int, int, int], report: int, max_fd: int) -> NoReturn:
    """Turn the forked child into ``argv``; on any failure, say which step failed on ``report`` and exit 127.

    It starts with every signal blocked (spawn blocked them across the fork)."""
    stage = "setup"
    try:
        # The supervisor's wake-up descriptor is not the child's to write to, whatever comes later.
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        os.setpgid(0, 0)
        _reset_signals()  # ... and unblocks them: from here a signal acts on the child as on any process
        # None of these is 0, 1 or 2, which dup2 overwrites: those are always open in the supervisor, at
        # worst on /dev/null (text/stdio.py's keep_std_fds_open, cli.main's second act, after holding the signals).
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        _close_inherited(report, max_fd)
        if setup is not None:
            setup()
        if cwd is not None:
            stage = "cwd"
            os.chdir(cwd)  # may block on a hung mount: the supervisor stops waiting at exec_wait_s
        stage = "exec"
        _exec(places, argv, env)
    except BaseException as exc:
        code = exc.errno if isinstance(exc, OSError) and exc.errno else 0
        text = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__
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


def _exec(places: Sequence[str], argv: list[str], env: Mapping[str, str]) -> NoReturn:
    """execve the first place that runs, as execvpe does: the error said is the first that is not "no such
    file" (a program found but not executable), else the last."""
    first: OSError | None = None
    last: OSError = FileNotFoundError(errno.ENOENT, "No such file or directory")
    for path in places:
        try:
            os.execve(path, argv, env)
        except OSError as exc:
            last = exc
            if first is None and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                first = exc
    raise first or last


def _reset_signals() -> None:
    """Default disposition for every signal and an empty mask, as a clean exec would have.

    An ignored disposition survives exec: under ``nohup`` (the manager's onstart command) SIGHUP comes
    ignored, as SIGQUIT does from some job-control shells, and a child would shrug off its own SIGHUP or
    SIGQUIT. A signal that cannot be set is left as it is.

    A signal pending here came in the fork's window, sent to the supervisor's process group (the child
    was in it until setpgid): it was the supervisor's, which has its own copy. Ignoring a signal drops it,
    so it goes before the mask is lifted. (One sent to the child's own new group between its setpgid and
    here would go too: nobody knows that group yet but the supervisor, which is waiting for the exec.)
    """
    pending = signal.sigpending()
    for signum in RESETTABLE_SIGNALS:
        with contextlib.suppress(OSError, ValueError):
            if signum in pending:
                signal.signal(signum, signal.SIG_IGN)
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- in the supervisor


def _places(program: str, env: Mapping[str, str]) -> list[str]:
    """Where the exec looks for ``program``: itself if it names a path, else each directory of the child's
    PATH (the default path where it has none), in order."""
    if os.path.dirname(program):
        return [program]
    return [os.path.join(where, program) for where in os.get_exec_path(env)]


def _await_exec(report: int, wait_s: float, paused: Callable[[float], None] | None = None) -> bytes | None:
    """The child's failure report (b"" when its exec ran), or None when it said nothing within ``wait_s``
    of the supervisor's running time (``paused`` hears each stretch it was stopped)."""
    deadline = time.monotonic() + wait_s
    poller = select.poll()  # not select(): the supervisor's descriptors may number past FD_SETSIZE
    poller.register(report, select.POLLIN)
    chunks: list[bytes] = []
    while True:
        before = time.monotonic()
        asked = min(max(deadline - before, 0.0), WAIT_SLICE_S)
        ready = poller.poll(asked * 1000)
        late = time.monotonic() - before - asked
        if late > PAUSED_MIN_S:
            deadline += late  # the supervisor was stopped, not waiting: that time is not the exec's
            if paused is not None:
                paused(late)
        if not ready:
            if time.monotonic() >= deadline:
                return None
            continue
        data = os.read(report, REPORT_MAX)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _from(places: Sequence[str], cwd: str | None) -> list[str]:
    """The places as the supervisor reaches them: a relative one (``./run.sh``, a PATH of ``.``) is the child's,
    under its working directory."""
    return [os.path.join(cwd, place) if cwd is not None else place for place in places]


def _missing_interpreter(places: Sequence[str]) -> str | None:
    """Why an exec that said ENOENT found the program all the same: its ``#!`` interpreter is missing (the
    kernel reports it as the program's own ENOENT). Returns what a shell would say of it, or None.

    The kernel ends the interpreter's name at a space, a tab or the line's end: a CR before the LF (a
    script saved with Windows line ends) is part of the name it looks for."""
    for path in places:
        try:
            with open(path, "rb") as fh:
                first = fh.readline(256)
        except OSError:
            continue
        if not first.startswith(b"#!"):
            continue
        words = first[2:].rstrip(b"\n").replace(b"\t", b" ").split(b" ")
        name = next((word for word in words if word), b"").decode(errors="replace")
        if name.endswith("\r"):
            return (f"bad interpreter: {name[:-1]}^M: not found (the script's lines end in CR LF: it was saved "
                    "with Windows line ends)")
        return f"bad interpreter: {name or '(none)'}: not found"
    return None


def _why_denied(places: Sequence[str], cwd: str | None) -> str:
    """Why an exec was refused (EACCES) where the program was found: "not executable" sent the reader to chmod a
    file already rwx on a volume mounted noexec, or a directory."""
    for place in places:
        path = os.path.join(cwd or "", place)  # (a relative path is the child's, from its working directory)
        try:
            mode = os.stat(path).st_mode
            noexec = bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            return "is a directory"
        if mode & 0o111 and noexec:
            return "permission denied (on a filesystem mounted noexec)"
        break
    return "permission denied (not executable)"


def _failure(program: str, places: Sequence[str], cwd: str | None, report: bytes) -> SpawnError:
    """The SpawnError a child's report stands for: what a shell would print and exit with."""
    stage, _, rest = report.decode(errors="replace").partition(" ")
    number, _, text = rest.partition(" ")
    code = int(number) if number.isdigit() else 0
    if stage == "cwd":
        if code == errno.ENOENT or (code == errno.ENOTDIR and not os.path.exists(cwd or "")):
            return SpawnError(126, f"working directory {cwd!r} does not exist")
        if code == errno.ENOTDIR:  # (the path is there, a file: "does not exist" sent the reader looking for it)
            return SpawnError(126, f"working directory {cwd!r} is not a directory")
        return SpawnError(126, f"cannot enter working directory {cwd!r}: {text}")
    if stage == "exec":
        # (ENOTDIR from a search of PATH: a PATH entry is a file. Not found, as a shell says.)
        if code == errno.ENOENT or (code == errno.ENOTDIR and not os.path.dirname(program)):
            interpreter = _missing_interpreter(places)
            if interpreter is not None:
                return SpawnError(126, f"{program}: {interpreter}")
            return SpawnError(127, f"{program}: command not found")
        if code in (errno.EACCES, errno.EPERM):
            return SpawnError(126, f"{program}: {_why_denied(places, cwd)}")
        return SpawnError(126, f"{program}: cannot execute: {text}")
    return SpawnError(126, f"{program}: could not set the child up (cgroup?): {text}")


def _reap(pid: int) -> None:
    """Wait for a child that reported a failed step: it exits right after saying so."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _kill_unexeced(pid: int) -> bool:
    """SIGKILL a child stuck before its exec, and reap it if it goes within KILLED_REAP_WAIT_S (most waits in a
    hung FUSE or NFS mount let SIGKILL in); True when it went. One that stays (a FUSE request its server read,
    and never answers, is waited for past SIGKILL) is the reaper's when it goes."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILLED_REAP_WAIT_S
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            return True
        time.sleep(0.01)
    return False


def _pipe(opened: list[int]) -> tuple[int, int]:
    """A close-on-exec pipe, its ends added to ``opened`` (closed together if the spawn fails)."""
    r, w = os.pipe()
    opened += (r, w)
    return r, w


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
