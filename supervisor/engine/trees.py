"""The supervisor's descendants beyond a child's own group: read from /proc once and shared, and swept.

**Reading** (``ProcessTable``). Stopping a child stops its tree: its process group, its descendants, and
whatever carries its tag (``TAG_ENV``: an escapee that left the group with ``setsid``). Knowing that tree means
reading every process's parent, group and environment. Read once per stopping child every ``STOP_POLL_S``, 200
daemons stopping together read the table 200 times a poll, and each read reads 200 environments: their stop took
50 s instead of their grace period. So the table is read once for everyone who asks at about the same moment: a
reading serves for ``SNAPSHOT_MAX_AGE_S`` (every stop polled in one loop turn), unless the one asking needs a
newer one (a child whose leader was reaped must see a reading from after the reap: an older one could miss what
the leader forked last). A process's tag is read once in its life (its environment does not change), once it has
one: a process caught inside execve reads with no environment yet, and is read again. Reading is never given up
on a race: a process that vanishes while it is read is left out. The I/O thread follows the trees every second and
reads the whole table only every few (``ProcessTable.reading``); in between, a watch that must know a new process
at once has the last reading brought up to date from the listing of /proc and a few processes' stats.

**Sweeping** (what escaped its child's tree or outlived its supervisor). A child's tree is stopped by its Child
(process.py); what the sweeps end is what that tree cannot reach. A supervisor that was SIGKILLed leaves its
children running, re-parented above it: the next supervisor of the same state_dir finds them by the tag every
child carries in its environment (``TAG_ENV``, inherited by its own children) and by ``STATE_DIR_ENV``. A process
that cleared its environment is found only by the phase cgroup it was born in (``kill_cgroup``, or the pids the
memory module reads there, ``kill_pids``). At the supervisor's exit, ``sweep_descendants`` makes sure nothing it
started outlives it. Both sweeps go round after round until nothing is left (``kill_until_none_left``): what
forks while it is being killed, or vanishes while the process table is read, never ends a sweep early. What is
swept gets SIGKILL at once: the graceful stop was its Child's (or died with its supervisor). The Child's own stop
shares ``signal_quietly`` and the patience constants with the sweeps.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..text import Log
from ..text.show import escaped
from ..text.units import is_ascii_digits
from .signals import signal_mask

# In every child's environment: "<supervisor pid>.<its PID namespace>.<sequence>.<its start time>" (tag_for),
# inherited by whatever it starts. The pid means something only in that namespace: a container's supervisor is pid 1
# of its own, and its children seen from the host carry "1.": the namespace says whose pid 1. A supervisor before it
# wrote "<pid>.<sequence>", which is read as a pid of the namespace its process runs in; that needs its process's
# namespace read (it may not be ours to read), so a tag always says its own, the host's too (unlike a phase
# cgroup's name).
# The start time (start_ticks; left out where it cannot be read) tells the supervisor from a later process given its
# pid: a tag without one (a supervisor's before it was written) is judged by the pid's command line alone.
TAG_ENV = "PROVER_SUPERVISOR_TAG"
# In every child's environment: the state_dir of the supervisor that started it.
STATE_DIR_ENV = "PROVER_SUPERVISOR_STATE_DIR"
# While processes are being stopped, how often to look whether any of them is left.
STOP_POLL_S = 0.05
# After SIGKILL, how long to wait for them to vanish before saying what is stuck.
KILL_WAIT_S = 10.0
# The sweeps at the supervisor's start and exit: how long they go on killing, round after round,
# and the pause between two rounds (what was killed gets a moment to die).
SWEEP_MAX_S = 5.0
SWEEP_ROUND_S = 0.01



def sweep_descendants(log: Log, max_s: float = SWEEP_MAX_S) -> int:
    """SIGKILL whatever descends from the supervisor: nothing may outlive it. Returns how many.

    Round after round (see ``kill_until_none_left``): a process that forks while it is killed
    leaves children behind, and they are re-parented to the supervisor for the next round."""
    return len(kill_until_none_left(live_descendants, log, "leftover process(es)", max_s))


def live_descendants() -> dict[int, str]:
    """pid → name of every live descendant of the supervisor (zombies are the reaper's). One that
    vanishes while the table is read is left out, never the end of the listing."""
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return {}  # (our own entry in /proc cannot be read: nothing to list)
    found: dict[int, str] = {}
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc.name()
        except psutil.Error:
            continue  # gone meanwhile
    return found


def kill_survivors_of_dead_supervisors(state_dir: str, log: Log, max_s: float = SWEEP_MAX_S) -> int:
    """Children of a supervisor that was SIGKILLed live on (re-parented above it) and hold its
    ports and GPUs: a new supervisor of the same state_dir ends them before it starts anything.
    A process counts when it was started for this state_dir and its tag names a supervisor pid
    of our PID namespace that is gone (or is no longer a prover-supervisor): one of another
    namespace is never counted (``tag_owner_here``). What they fork while they are killed
    carries the same tag: the rounds go on until none is left."""
    return len(kill_until_none_left(lambda: _survivors_of_dead_supervisors(state_dir), log,
                                    "process(es) left by a supervisor that died without stopping them", max_s))


def every_process() -> list[psutil.Process]:
    """Every process of the machine (psutil's list); OSError where /proc cannot list them: not mounted, or an
    empty one (psutil 7 then fails with an IndexError of its own, which is no reason to show a traceback)."""
    try:
        return list(psutil.process_iter(["pid"]))
    except (IndexError, psutil.Error):
        raise OSError("/proc lists no process (is it mounted?)") from None


def _survivors_of_dead_supervisors(state_dir: str) -> dict[int, str]:
    me = os.getpid()
    want = os.path.realpath(state_dir)
    found: dict[int, str] = {}
    for proc in every_process():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
            tag = env.get(TAG_ENV)
            if not tag or not _of_state_dir(env, want):
                continue
            owner = tag_owner_here(tag, proc.pid)
            if owner is None or owner == me or is_live_supervisor(owner, tag_start(tag)) \
                    or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            found[proc.pid] = proc.name()
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return found


def left_alive_by(supervisor_pid: int, state_dir: str, started: int | None = None) -> list[dict[str, object]]:
    """What a supervisor that is gone left running (for ``status``: named, never killed): every live process
    whose tag names ``supervisor_pid`` and that was started for ``state_dir``. The tag, not the pid alone,
    says a process is ours: a pid that the system gave to another process since is not named, nor a process
    whose tag names that pid in another PID namespace (a live container's pid 1 is no pid here), nor one whose
    tag names a supervisor of that pid started at another time than ``started`` (where both are known)."""
    want = os.path.realpath(state_dir)
    found: list[dict[str, object]] = []
    try:
        processes = every_process()
    except OSError:
        return found  # (nothing to be known of them here)
    for proc in processes:
        try:
            env = proc.environ()
            tag = env.get(TAG_ENV)
            if not tag or tag_owner_here(tag, proc.pid) != supervisor_pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if started is not None and tag_start(tag) not in (None, started):
                continue
            if not _of_state_dir(env, want):
                continue
            found.append({"pid": proc.pid, "name": proc.name(), "tag": tag})
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return found


def _of_state_dir(env: dict[str, str], want: str) -> bool:
    """Whether a process's environment says it was started for the state_dir ``want`` (resolved). Both sides are
    resolved: one folder spelt two ways (``/s/sub/../real``, a symlink to it) is one state_dir, as its lock in it
    makes it one supervisor's; the sweep at start and ``status`` must agree on it (status promised that the next
    start ends what the sweep then missed)."""
    given = env.get(STATE_DIR_ENV, "")
    return given != "" and os.path.realpath(given) == want  # ("" would resolve to our working directory)


def tag_for(seq: int) -> str:
    """The tag of this supervisor's ``seq``-th child (TAG_ENV)."""
    started = own_start_ticks()
    return f"{os.getpid()}.{own_pid_namespace()}.{seq}" + ("" if started is None else f".{started}")


def tag_start(tag: str) -> int | None:
    """The start time of the supervisor that ``tag`` names (tag_for's fourth part); None where it has none."""
    parts = tag.split(".")
    return int(parts[3]) if len(parts) == 4 and is_ascii_digits(parts[3]) else None


def tag_owner_here(tag: str, pid: int) -> int | None:
    """The supervisor pid that ``tag`` (of the process ``pid``) names, as a pid of our PID namespace (0: a tag that
    names none); None where it is a pid of another namespace. Such a process is never judged from here: it is
    alive, so its namespace's init is too (the kernel kills every process of a namespace whose init dies), and
    whether its supervisor lives can only be told inside it. A tag without its namespace (a supervisor before
    they had one) is of the namespace its process runs in, where that can be read."""
    owner, _, rest = tag.partition(".")
    ns, dot, _ = rest.partition(".")
    if dot and is_ascii_digits(ns):
        if int(ns) != own_pid_namespace():
            return None
    elif pid_namespace_of(pid) not in (None, own_pid_namespace()):
        return None
    return int(owner) if is_ascii_digits(owner) else 0


@functools.cache
def own_start_ticks() -> int | None:
    """When this process started (start_ticks; it never changes), for its tags, status.json and the pointer."""
    return start_ticks("self")


@functools.cache
def own_pid_namespace() -> int:
    """The inode of this process's PID namespace (it never changes), for the tags and the phase cgroups' names
    alike; 0 where it cannot be read (an old kernel, a /proc not mounted): a namespace unknown, never taken for
    another's, the host's above all (a container's supervisor that said the host's would have its pid 1 judged as
    the host's, its children as a dead supervisor's)."""
    return pid_namespace_of("self") or 0


def foreign_proc() -> str | None:
    """Why the /proc here is not this process's PID namespace's (None: it is, or it cannot be told: none mounted is
    the start-up sweep's to say). Every tree, stop and sweep reads it: a supervisor made PID 1 by ``unshare --pid
    --fork`` without ``--mount-proc`` read the host's, signalled pids it could not reach, named them survivors,
    and left its own children running."""
    try:
        seen = os.readlink("/proc/self")
    except OSError:
        return None
    if is_ascii_digits(seen) and int(seen) != os.getpid():
        return f"/proc is another PID namespace's (its /proc/self is pid {seen}; this process is pid {os.getpid()})"
    return None


def of_another_pid_namespace(ns: object) -> bool:
    """Whether ``ns``, a PID namespace a supervisor recorded (its pointer's, its status.json's), is another than
    ours: its pids say nothing of this process table. One not recorded (an older supervisor's) is taken for ours."""
    return isinstance(ns, int) and not isinstance(ns, bool) and ns != own_pid_namespace()


def pid_namespace_of(pid: int | str) -> int | None:
    """The inode of the PID namespace of the process ``pid``; None where it cannot be read (gone, not ours)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def kill_until_none_left(find: Callable[[], dict[int, str]], log: Log, what: str, max_s: float) -> dict[int, str]:
    """SIGKILL what ``find`` lists (pid → name), round after round, until two rounds in a row find
    nothing or ``max_s`` has passed; say what was killed (``what``) and, by pid and name, what
    survived (never both of one). Returns pid → name of every process signalled. One found on its way out of a
    kill before this sweep's (a phase's sweep's, a moment before the exit's) is waited for, said by that kill alone.

    One round is never enough: a process killed while it forks leaves a child the listing did not
    have, and psutil misses a process whose parent vanished as it read the table (that child is
    re-parented by the time of the next round, and found). The pause between rounds follows a
    round that killed something; after an empty one the next look comes at once: the kernel gives
    an orphan its new parent before its old one can vanish from the table, so the second look
    needs no wait (the sweep at every exit would otherwise sleep for nothing). A process that vanishes between the
    listing and its signal costs nothing. Blocks (at most ``max_s``): for the supervisor's start
    and end only, when the loop is not serving children."""
    deadline = time.monotonic() + max_s
    signalled: dict[int, str] = {}
    survived: dict[int, str] = {}
    ending: set[int] = set()  # killed before this sweep
    empty_rounds = 0
    while True:
        found = find()
        empty_rounds = 0 if found else empty_rounds + 1
        if empty_rounds >= 2:
            break
        if found and time.monotonic() > deadline:
            survived = found
            log(f"{len(found)} process(es) survived SIGKILL for {max_s:g}s (uninterruptible sleep?): "
                f"{_shown(found)}")
            break
        for pid, name in found.items():
            if pid not in signalled and killed_already(pid):
                ending.add(pid)
            signal_quietly(os.kill, pid, signal.SIGKILL)
            signalled.setdefault(pid, name)
        if found:  # what was killed gets a moment to die (and its orphans to come back) before the next look
            time.sleep(SWEEP_ROUND_S)
    killed = {pid: name for pid, name in signalled.items() if pid not in survived and pid not in ending}
    if killed:
        log(f"killed {len(killed)} {what}: {_shown(killed)}")
    return signalled


def _shown(procs: dict[int, str]) -> str:
    named = [f"{pid} ({escaped(name)})" for pid, name in procs.items()]  # (any bytes may name a process: an ESC too)
    return ", ".join(named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")


class StuckBeforeExec:
    """Children that spawn.py SIGKILLed before their exec and could not reap: stuck in the kernel (a FUSE request in
    its server's hands is waited for past SIGKILL), in their phase's cgroup, where every later sweep finds them. One
    run's (its ChildKit's, never the process's: a test's supervisor starts with none). Each is forgotten as it is
    reaped, before its pid can be another process's; the first sweep that finds one says it, a later one has no news
    (it is stuck as before, and its reap says when it goes)."""

    def __init__(self) -> None:
        self._said: dict[int, bool] = {}  # pid → a sweep said it

    def add(self, pid: int) -> None:
        """``pid``, a child SIGKILLed before its exec, outlived the kill: a sweep says it as that, never as an
        escapee."""
        self._said[pid] = False

    def reaped(self, pid: int) -> None:
        """``pid``, a child SIGKILLed before its exec and stuck since, is reaped at last."""
        self._said.pop(pid, None)

    def among(self, pids: list[int], log: Log) -> list[int]:
        """Those of ``pids`` stuck; those no sweep said yet are said."""
        stuck = [pid for pid in pids if pid in self._said]
        unsaid = {pid: _name_of(pid) for pid in stuck if not self._said[pid]}
        if unsaid:
            log(f"{len(unsaid)} process(es) killed before its exec, still stuck in the kernel (a hung mount?): "
                f"{_shown(unsaid)}")
            self._said.update(dict.fromkeys(unsaid, True))
        return stuck


def kill_pids(pids: list[int], log: Log, why: str, stuck: StuckBeforeExec | None = None) -> list[int]:
    """SIGKILL each of ``pids`` (found some way the process tree could not be: a cgroup); say which and why.
    Returns them, less those gone meanwhile. A child killed before its exec and stuck since (of ``stuck``) is no
    escapee, and another SIGKILL would change nothing: it is said as that, and returned too (it was dealt with)."""
    held = stuck.among(pids, log) if stuck is not None else []
    killed: list[int] = []
    named: list[str] = []
    for pid in pids:
        if pid in held:
            continue
        name = _name_of(pid)  # before the kill: a dead process has no name to read
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue  # gone meanwhile
        killed.append(pid)
        named.append(name)
    if killed:
        log(f"killed {len(killed)} process(es) {why}: {_shown(dict(zip(killed, named, strict=True)))}")
    return [*held, *killed]


def kill_cgroup(cgroup: Path, pids_in: Callable[[], list[int] | None], log: Log, why: str,
                wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL everything in a cgroup (``pids_in``: its processes, those of the cgroups below it included;
    None where they cannot be read) until none is left; True once none is (or the cgroup is gone).

    They are read again after each round: a member may fork between the read and its kill, and the child
    is born in the same cgroup. Blocks (for at most ``wait_s``): only for use before the event loop runs.
    """
    deadline = time.monotonic() + wait_s
    said = why
    signalled: set[int] = set()
    while True:
        pids = pids_in()
        if pids is None:
            if not cgroup.exists():
                return True
            log(f"cannot read the processes of {cgroup}; they are left alone")
            return False
        if not pids:
            return True
        if time.monotonic() > deadline:
            log(f"{cgroup}: {len(pids)} process(es) survived SIGKILL for {wait_s:g}s "
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


# The commands of the CLI that never supervise (a recorded pid now running one of them wrote nothing).
SHORT_COMMANDS = frozenset({"status", "check", "standins", "dev-manager"})


def is_live_supervisor(pid: int, started: int | None = None) -> bool:
    """``pid`` is a live prover-supervisor: alive, and supervising. Never this process (a ``status`` in a fresh
    container is PID 1, the very pid the last supervisor recorded there), nor a zombie, nor one of the processes
    a supervisor started, nor a prover-supervisor running a command that supervises nothing. ``started``: the
    pid's start time as its supervisor recorded it (start_ticks: in status.json, the pointer, a tag), where it
    did: a process of that pid started at another time is another, that the system gave the pid to since (its
    command line may well say "supervisor": a ``tail`` of its log), and one started in the same clock tick is the
    very one (an image may run it under any name: ``python /app/init.py``). Without one (a record from before it
    was written) the command line decides."""
    if pid == os.getpid():
        return False
    if started is not None and start_ticks(pid) != started:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None:
            return proc.status() != psutil.STATUS_ZOMBIE
        argv = proc.cmdline()
        return proc.status() != psutil.STATUS_ZOMBIE and TAG_ENV not in proc.environ() and \
            any("supervisor" in part for part in argv) and not _runs_short_command(argv)
    except (psutil.Error, OSError):
        return False


def start_ticks(pid: int | str) -> int | None:
    """When the process ``pid`` started, in clock ticks after boot (/proc's own figure, which no later process of
    the same pid shares); None where it is gone or cannot be read."""
    row = _stat_row(pid)
    return row[3] if row is not None else None


def _runs_short_command(argv: list[str]) -> bool:
    """A command line whose subcommand is one that supervises nothing: a word of SHORT_COMMANDS not given
    as an option's value (``--config status`` names a file)."""
    return any(arg in SHORT_COMMANDS and not argv[i - 1].startswith("-") for i, arg in enumerate(argv) if i > 0)


def signal_quietly(fn: Callable[[int, int], None], pid: int, sig: int) -> None:
    """Signal a pid or group that may be gone already (ESRCH) or not ours to signal (EPERM); other errors raise."""
    try:
        fn(pid, sig)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


# ---------------------------------------------------------------- the table, read once and shared

# A reading this recent is shared (half a stop poll: the stops polled in one loop turn share one).
SNAPSHOT_MAX_AGE_S = STOP_POLL_S / 2
# A process this young has its stat read at each update (ProcessTable.reading): what starts often execs again, or
# names itself, in its first moments (sh -c "exec ...", env, nice, a wrapper script), under load too; past that
# the next whole reading finds a new name. Each young member costs one stat read an update.
YOUNG_S = 5.0

_TAG_PREFIX = TAG_ENV.encode() + b"="


@dataclass(frozen=True)
class Proc:
    """One live process (or a zombie, in a table that keeps them): its pid, parent, process group and tag (None:
    none, or unreadable); ``name``, its ``comm`` as the same reading found it (not part of its identity)."""

    pid: int
    ppid: int
    pgid: int
    tag: str | None
    name: str = field(default="", compare=False)


class Descendants:
    """The supervisor's live descendants at one moment (monotonic ``taken_at``), indexed."""

    def __init__(self, procs: list[Proc], taken_at: float) -> None:
        self.taken_at = taken_at
        self.procs = {p.pid: p for p in procs}
        self._children: dict[int, list[Proc]] = {}
        self._groups: dict[int, list[Proc]] = {}
        self._tagged: dict[str, list[Proc]] = {}
        for p in procs:
            self._children.setdefault(p.ppid, []).append(p)
            self._groups.setdefault(p.pgid, []).append(p)
            if p.tag is not None:
                self._tagged.setdefault(p.tag, []).append(p)

    def tree(self, leader: int, tag: str) -> list[Proc]:
        """The live processes of one child's tree: its leader, its group, what carries its tag, and
        every descendant of those."""
        found: dict[int, Proc] = {}
        todo = [self.procs[leader]] if leader in self.procs else []
        todo += self._groups.get(leader, []) + self._tagged.get(tag, [])
        while todo:
            proc = todo.pop()
            if proc.pid not in found:
                found[proc.pid] = proc
                todo.extend(self._children.get(proc.pid, ()))
        return list(found.values())


def stat_fields(pid: int | str, proc: str = "/proc") -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after its command name (state first: ppid, pgid, ..., flags at 6, start
    time at 19); None if it vanished."""
    read = read_stat(pid, proc)
    return None if read is None else read[1]


def dying(pid: int) -> bool:
    """The kernel is ending ``pid`` (or has: a zombie not yet reaped), from /proc/<pid>/stat."""
    fields = stat_fields(pid)
    try:
        return fields is not None and (fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING != 0)
    except (IndexError, ValueError):
        return False


def killed_already(pid: int) -> bool:
    """``pid`` is on its way out of a kill: dying, or a SIGKILL waits for it (it has not run since, or its wait on a
    hung mount must end first)."""
    return dying(pid) or (signal_mask(pid, b"SigPnd:", b"ShdPnd:") or 0) & _SIGKILL_BIT != 0


def read_stat(pid: int | str, proc: str = "/proc") -> tuple[str, list[bytes]] | None:
    """/proc/<pid>/stat: its command name (``comm``) and the fields after it (stat_fields); None if it vanished."""
    try:  # (os.open: a third of open()'s cost, and the process table reads every process of the machine)
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    end = data.rfind(b")")  # "pid (comm) state ...": the name may hold anything, ")" and spaces included
    return data[data.find(b"(") + 1:end].decode(errors="replace"), data[end + 2:].split()


# /proc/<pid>/stat's flag PF_EXITING (the kernel began to end it: do_exit); SIGKILL's bit in its pending signals.
_PF_EXITING, _SIGKILL_BIT = 0x4, 1 << (signal.SIGKILL - 1)

# One process's row as a reading found it: state, ppid, pgid, start time (clock ticks since boot), name (comm).
_Row = tuple[str, int, int, int, str]


def _stat_row(pid: int | str, proc: str = "/proc") -> _Row | None:
    """Its row, from its stat; None where it vanished, or its stat is not one we can read."""
    read = read_stat(pid, proc)
    if read is None:
        return None
    comm, fields = read
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]), comm
    except (IndexError, ValueError):
        return None


def proc_alone(pid: int, proc: str = "/proc") -> Proc | None:
    """One process read by itself, outside any reading of the table (one found by the cgroup it is in, not by its
    parentage: iowatch.py), its tag unread; None where it vanished."""
    row = _stat_row(pid, proc)
    return None if row is None else Proc(pid, row[1], row[2], None, row[4])


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")  # the unit of a start time


def _boottime() -> float:
    """Seconds since boot, on the clock /proc's start times count on (in our time namespace, as they are)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class ProcessTable:
    """Readings of the process table, shared (see the module's docstring); ``scans`` counts the whole ones,
    ``updates`` the incremental ones (``reading``). ``zombies``: a zombie is in the readings too (the I/O thread's:
    its counters are read until the reap, iowatch.py), its tag as it was read while it lived; else it is left out
    (it is the reaper's, and signals cannot reach it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, proc: str = "/proc", *,
                 zombies: bool = False, boottime: Callable[[], float] = _boottime) -> None:
        self.scans = 0
        self.updates = 0
        self._clock = clock
        self._boottime = boottime
        self._proc = proc
        self._zombies = zombies
        self._last: Descendants | None = None  # the last whole reading (the one ``snapshot`` shares)
        self._current: Descendants | None = None  # the last reading, whole or incremental
        self._tags: dict[tuple[int, int], str | None] = {}  # (pid, start time) → its tag
        # What an incremental reading starts from: every pid the last reading listed, the rows of the
        # descendants it found (zombies too: their children hang below them), and our own name.
        self._listed: set[int] = set()
        self._rows: dict[int, _Row] = {}
        self._own_name: str | None = None

    def snapshot(self, newer_than: float = -math.inf) -> Descendants:
        """A whole reading taken after ``newer_than`` (monotonic) and at most SNAPSHOT_MAX_AGE_S old."""
        now = self._clock()
        last = self._last
        if last is None or last.taken_at < newer_than or now - last.taken_at > SNAPSHOT_MAX_AGE_S:
            last = self._read(now)
        return last

    def reading(self, full_every_s: float, *, newcomers: bool) -> Descendants:
        """A reading for one who follows the trees over time (the I/O thread): the whole table once the last whole
        reading is ``full_every_s`` old; in between, with ``newcomers``, the last reading brought up to date
        (``_update``), else the last reading as it was.

        What an update sees at once: a process born since the last reading (with its name and tag), a member
        re-parented (its parent gone), a member's new name while it is younger than YOUNG_S or carries its
        parent's name, and a process gone. What it leaves to the next whole reading, ``full_every_s`` at most:
        a pid reused between two readings, a setpgid, an exec (or a rename) in a process that is neither young nor
        named as its parent. Meant for a table that keeps zombies: a member that died since is kept as it was while
        it is listed (a table that leaves zombies out would have it in as a live one until the next whole reading)."""
        now = self._clock()
        if self._last is None or self._current is None or now - self._last.taken_at >= full_every_s:
            return self._read(now)
        if newcomers:
            self._current = self._update(now)
        return self._current

    def _listing(self) -> list[str]:
        return [name for name in os.listdir(self._proc) if name.isdigit()]

    def _read(self, now: float) -> Descendants:
        """The whole table: every process of the machine's stat, to find the supervisor's descendants."""
        self.scans += 1
        listed = self._listing()
        stats = {}
        for name in listed:
            row = _stat_row(name, self._proc)
            if row is not None:
                stats[int(name)] = row
        own = stats.get(os.getpid())
        self._own_name = None if own is None else own[4]
        self._listed = set(map(int, listed))
        self._last = self._current = self._descendants(stats, now)
        return self._last

    def _update(self, now: float) -> Descendants:
        """The last reading brought up to date at the cost of a listing of /proc and the stats of a few processes,
        not all of them (the whole table every second was most of the I/O thread's cost: docs/benchmarks.md).
        A process's stat is read again only where the last reading can be wrong about it in a way that matters
        within a second: the rules below; every other change waits for the next whole reading."""
        self.updates += 1
        me = os.getpid()
        listed = set(map(int, self._listing()))
        rows = {pid: row for pid, row in self._rows.items() if pid in listed}  # one gone from the listing is gone
        names = {pid: row[4] for pid, row in rows.items()}
        if self._own_name is not None:
            names[me] = self._own_name
        young_since = (self._boottime() - YOUNG_S) * _TICKS_PER_S  # a start time after it is young
        stale = listed - self._listed  # born since: its parent, group, name and start time are all unknown
        for pid, (_, ppid, _, started, comm) in rows.items():
            # Its parent is gone: the kernel gave it another (a subreaper of ours keeps it a descendant, init
            # does not). A fork not exec'd yet still carries its parent's name (Go's and sh's fork and exec leave
            # that window): its own comes with the exec. A young process may exec again (sh -c "exec ..."), or
            # name itself (prctl), soon after it started (YOUNG_S).
            if (ppid != me and ppid not in rows) or comm == names.get(ppid) or started >= young_since:
                stale.add(pid)
        for pid in stale:
            row = _stat_row(pid, self._proc)
            if row is None:
                rows.pop(pid, None)  # vanished since the listing
            else:
                rows[pid] = row  # (a stranger born since is left out by the walk from us)
        self._listed = listed
        return self._descendants(rows, now)

    def _descendants(self, stats: dict[int, _Row], now: float) -> Descendants:
        """The supervisor's descendants among ``stats`` (pid → row), their tags read where not known yet."""
        below: dict[int, list[int]] = {}
        for pid, (_, ppid, _, _, _) in stats.items():
            below.setdefault(ppid, []).append(pid)
        procs: list[Proc] = []
        rows: dict[int, _Row] = {}
        tags: dict[tuple[int, int], str | None] = {}
        todo = list(below.get(os.getpid(), ()))
        while todo:
            pid = todo.pop()
            state, ppid, pgid, started, comm = rows[pid] = stats[pid]
            todo.extend(below.get(pid, ()))
            key = (pid, started)
            if state == "Z":
                if self._zombies:  # (its environment went with its memory: no tag to read now)
                    tag = tags[key] = self._tags.get(key)
                    procs.append(Proc(pid, ppid, pgid, tag, comm))
                continue
            if key in self._tags:
                tag = tags[key] = self._tags[key]
            else:
                tag, settled = self._tag(pid)
                if settled:
                    tags[key] = tag
            procs.append(Proc(pid, ppid, pgid, tag, comm))
        self._tags = tags  # the processes gone since are forgotten
        self._rows = rows
        return Descendants(procs, now)

    def _tag(self, pid: int) -> tuple[str | None, bool]:
        """Its tag, and whether that is its tag for life. An empty environment is not: a process in the middle
        of execve has released its parent (vfork, the close-on-exec pipe) before the kernel lays its new
        environment out, and reads empty until then; it is read again at the next reading."""
        try:
            with open(f"{self._proc}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            return None, True  # vanished, or not ours to read
        for entry in env.split(b"\0"):
            if entry.startswith(_TAG_PREFIX):
                return entry[len(_TAG_PREFIX):].decode(errors="replace"), True
        return None, bool(env)


# The supervisor's one table: every Child asks it.
PROCESS_TABLE = ProcessTable()
