"""The I/O thread: the bytes each attempt's process tree reads and writes, from the kernel's own counters.

Real programs work without a word: aria2c block-buffers its readout into a pipe (in bursts a minute
apart) and preallocates its file (full size at once), curio hashes 45 GiB of parameters before it prints a
line, cuzk loads its SRS into pinned memory in silence. What shows their work is the kernel's accounting
of each process, ``/proc/<pid>/io``: ``rchar``/``wchar`` (every byte passed to read and write calls) and
``read_bytes``/``write_bytes`` (what reached storage: a page fault of a mapped file too). Their growth,
summed over every process of an attempt's trees, is a sign of life (stall.py) and, for writes, what a
download has received (progresswatch.py). An attempt's processes are its children's trees (each child's process
group, descendants and tag, as a stop finds them: trees.py) and, where its phase has a cgroup of its own (per-phase
mode), every process in that cgroup or below it (``MemoryCgroup.pids_below``, as the phase's sweep reads it): a
daemon that left the trees with its environment cleared (``setsid`` with ``env -i``, ``sudo``, ``su -``) carries
no tag, and only its cgroup still knows it is the attempt's. Each process counts once (the ledger keys on pid).

Only bytes count, never being alive: a process blocked in ``recv`` on a dead connection moves nothing, and
a process that spins burns CPU but moves nothing either (docs/verdicts.md says why CPU time is no sign).
Bytes arriving on a socket read with ``recv`` are not in ``rchar``; aria2c's show as its writes to the file.

Not every byte written is a byte got. A downloader that allocates its file by writing it whole before it makes
the file's control file (a watch's ``allocators``, by process name, as the plugin registered them: aria2c where
the filesystem refuses fallocate, whose zeros go at disk speed before a byte is received) writes allocation while
it holds a file it writes that has never had its control file beside it (progress.py's CONTROL_SUFFIXES), and the
download's bytes once it does, file after file (one aria2c fetching a list allocates each file in its turn): the
first are its watch's ``allocated``, life for the stall watch, no progress for the download's figure. Only a file
open for writing, not for appending (a log), and not a control file itself, is one it may allocate. Published beside
them: how many such processes are allocating now (``allocating``), during which a link is not in use
(progresswatch.py), and the files they hold open (``held``), none of which the walk counts complete (progress.py).

One thread ("io") reads, for every watch (``watch``), the trees of the roots the loop hands it
(``IoWatch.follow``: each child's pid and tag, as a stop finds its tree: trees.py), and the processes of the phase
cgroup it hands with them (its ``cgroup.procs`` read on this thread, never on the loop), every IO_SAMPLE_S
(or as often as a watch asks, never more than IO_SAMPLE_MIN_S), and publishes the totals (``latest``);
the loop never reads /proc for it and never waits. The accounting (``IoLedger``) is pure: a process that
appears counts all its bytes (a new process starts at zero), one that goes counts what it had, and one
reaped by its parent inside the tree is not counted twice (the kernel adds a reaped child's counters to
its parent's, at the reap only: a zombie is read until then). A child's bytes are taken out of its parent's
growth only where that growth holds them, in the reading it went in or the next two, never out of the
parent's own work: a child auto-reaped (its parent ignores SIGCHLD) gives its parent nothing, and one whose
counters are refused (another user's now) has not gone. Should the thread still fail (a bug of ours), it says
so and starts again (watchstate.run_restarting), each watch's totals going on from a new baseline.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..engine.offloop import worker_thread
from ..engine.trees import Descendants, ProcessTable, proc_alone
from .cgroups import MemoryCgroup, OnBad
from .progress import CONTROL_FILES, CONTROL_SUFFIXES, FileId
from .watchstate import THREAD_RESTART_MAX_S, THREAD_RESTART_S, WatchState, run_restarting, said_error

# How often the watched trees are read, unless a watch asks for more often (never more often than
# IO_SAMPLE_MIN_S: a tree of 200 processes costs well under 1% of a core at once a second, bench/iosample.py).
IO_SAMPLE_S = 1.0
IO_SAMPLE_MIN_S = 0.2
# Who is in the trees is read from the whole process table this often (and at once when a watch's roots change);
# in between only the members' counters are read. A process born since counts all its bytes once it is found
# (it began at zero), and one born and reaped by its parent in between shows in that parent's counters. A watch
# that names allocating downloaders has them found at each of its readings: one found late had its file unknown to
# the walks meanwhile, free to be counted complete while its zeros were flushed (progress.py). For it the table is
# brought up to date in between (ProcessTable.reading: the newcomers' stats and a few more, not the whole table's,
# which cost it more than 1% of a core): a new aria2c is known by its name at the next reading, and an exec into
# one is too while its process is young or still carries its parent's name (curio's fork, not exec'd yet).
TREE_REFRESH_S = 5.0
# The thread that has read nothing for this long, while an attempt is followed, is said to be blind (its
# watch state, watchstate.py), and a stall it would have seen says so.
IO_BLIND_S = 30.0
# A child gone from the trees is looked for in its parent's counters (the kernel adds them at the reap) over this many
# readings, the one it went in first: a parent read before the reap in the same round has them at the next. One never
# found there was not reaped by it (auto-reaped: its parent ignores SIGCHLD, nothing added) and is forgotten.
DEBT_READINGS = 3
# At most this many pids whose refused counters were said are remembered (a churn of short-lived workers of
# another user must not grow the set without end; past it, a refusal may be said again).
REFUSALS_SAID_MAX = 4096

# The counters read, in /proc/<pid>/io's words.
COUNTERS = ("rchar", "wchar", "read_bytes", "write_bytes")
_WCHAR = COUNTERS.index("wchar")
_STORAGE = (COUNTERS.index("read_bytes"), COUNTERS.index("write_bytes"))  # what pipes and sockets never touch

Counters = tuple[int, int, int, int]
Root = tuple[int, str]  # a child's pid and its tag (TAG_ENV): its tree, as a stop finds it


@dataclass
class _Debt:
    """A child gone from the trees: its last counters (counted already), looked for in its parent's growth for
    ``readings`` more readings."""

    counters: Counters
    readings: int = DEBT_READINGS


@dataclass(frozen=True)
class ProcIo:
    """One process's counters at one reading (COUNTERS' order), with its parent then; for an allocating downloader
    only, of the files it writes: ``backed``, those with their control file beside them (None: no such downloader,
    or its open files unread), and ``filling``, those with none."""

    pid: int
    ppid: int
    counters: Counters
    backed: frozenset[FileId] | None = None
    filling: frozenset[FileId] = frozenset()


@dataclass(frozen=True)
class TreeIo:
    """The watched trees' totals since the watch began: ``moved`` bytes read and written (every counter),
    ``written`` bytes written (``wchar``), ``procs`` the processes read at ``at`` (monotonic), ``seq`` the
    reading's number (a new one is new evidence); ``readable`` False while no process's counters could be
    read (no evidence: a kernel without I/O accounting, or not ours to read); ``unreadable``
    the processes of the trees whose counters were refused (another user's, without CAP_SYS_PTRACE): their
    bytes are in no total. ``allocated``: of ``written``, what the watch's allocating downloaders wrote before they
    held a file with its control file beside it; ``allocating``: how many of them are allocating now; ``held``: the
    files they hold open now. ``stored``: of ``moved``, the bytes read from or written to storage (read_bytes,
    write_bytes), which output into a pipe or a socket's traffic never is, whoever carries it on."""

    seq: int
    at: float
    moved: int
    written: int
    procs: int
    readable: bool
    unreadable: int = 0
    allocated: int = 0
    allocating: int = 0
    held: frozenset[FileId] = frozenset()
    stored: int = 0


class IoLedger:
    """The running totals of one watch's trees, from one reading after another (pure; tested alone).
    ``from_zero``: the trees began with the watch (an attempt's children), so every byte of theirs is the watch's,
    those of the first reading too (a downloader's first MiB, written before the first reading, was lost to the
    baseline); else the first reading is the baseline."""

    def __init__(self, from_zero: bool = False) -> None:
        self._last: dict[int, ProcIo] | None = {} if from_zero else None  # None: the next reading is the baseline
        # Per parent, its children gone from the trees whose counters were not yet seen in its own (the kernel adds
        # them at the reap: a parent read before it in the same round has them at the next reading).
        self._owed: dict[int, list[_Debt]] = {}
        self.moved = 0
        self.written = 0
        self.stored = 0  # of ``moved``: read_bytes and write_bytes (TreeIo.stored)
        self.allocated = 0  # of ``written``: an allocating downloader's, before its control file (ProcIo.backed)
        self.allocating = 0  # the allocating downloaders allocating now
        self._backed: dict[int, set[FileId]] = {}  # per allocating downloader, the files seen with their control file
        self._zeroing: set[int] = set()  # those that held, at the reading before, a file never seen with one
        self._writing: dict[int, frozenset[FileId]] = {}  # per allocating downloader, the files it wrote then
        self.readable = False

    def add(self, procs: Iterable[ProcIo], refused: Iterable[int] = ()) -> None:
        """One reading: ``procs`` the processes of the trees read, ``refused`` those there whose counters were not
        ours to read (still there: not gone, their last counters kept for when they can be read again)."""
        now = {p.pid: p for p in procs}
        self.readable = self.readable or bool(now)
        last = self._last
        kept = {pid: last[pid] for pid in refused if last is not None and pid in last and pid not in now}
        self._last = {**kept, **now}
        for pid in [pid for pid in (*self._backed, *self._writing) if pid not in self._last]:
            self._forget_files(pid)  # (a process gone: its pid may come back as another's)
        if last is None:  # the baseline: what the trees had done before the watch began is not this watch's
            self._count_allocating(now)
            return
        self._owe(last, self._last)
        for pid, proc in now.items():
            before = last.get(pid)
            if before is not None and any(n < b for n, b in zip(proc.counters, before.counters, strict=True)):
                before = None  # a counter went back: a new process under a reused pid
                self._owed.pop(pid, None)
            if before is None:
                self._forget_files(pid)
            base = before.counters if before is not None else (0, 0, 0, 0)
            deltas = [max(0, n - b) for n, b in zip(proc.counters, base, strict=True)]
            self._pay(pid, deltas)
            self.moved += sum(deltas)
            self.written += deltas[_WCHAR]
            self.stored += sum(deltas[i] for i in _STORAGE)
            # Judged by what it held at the reading before and at this one (a process new to the ledger: nothing
            # known): the reading in which a file's control file came also holds the last of its zeros, and so does
            # the one in which a file it writes is new (its next file, zero-filled and given its control file
            # between two readings, as a small one is), and what it wrote before it was first seen is not known to
            # be data. At most a reading's data is taken for allocation that way, never a zero for data. A file that
            # held its control file is written with the download's bytes to its end (its control file removed as it
            # completes, its results printed).
            if proc.backed is not None and (before is None or pid in self._zeroing or self._fills_new(pid, proc)
                                            or not proc.backed | proc.filling <= self._writing.get(pid, frozenset())):
                self.allocated += deltas[_WCHAR]
        self._age()
        self._count_allocating(now)

    def _count_allocating(self, now: dict[int, ProcIo]) -> None:
        for pid, proc in now.items():
            if proc.backed:
                self._backed.setdefault(pid, set()).update(proc.backed)
            if proc.backed is not None:  # (its files unread this time: the last known are kept)
                self._writing[pid] = proc.backed | proc.filling
        self._zeroing = {pid for pid, proc in now.items() if self._fills_new(pid, proc)}
        self.allocating = len(self._zeroing)

    def _forget_files(self, pid: int) -> None:
        """What was known of ``pid``'s files: gone with it, or never its (a new process under a reused pid)."""
        self._backed.pop(pid, None)
        self._writing.pop(pid, None)

    def _fills_new(self, pid: int, proc: ProcIo) -> bool:
        """An allocating downloader holds a file it writes that was never seen with its control file."""
        return proc.backed is not None and bool(proc.filling - self._backed.get(pid, set()))

    def rebase(self) -> None:
        """Take the next reading as a new baseline, the totals kept: after a round that failed midway (the last
        reading half taken in, what is owed unknown), a byte is lost rather than counted twice, and the totals a
        watch has read never go back."""
        self._last, self._owed = None, {}

    def _owe(self, last: dict[int, ProcIo], now: dict[int, ProcIo]) -> None:
        """For each parent still here, the last counters of its children gone since (reaped by it, or auto-reaped:
        ``_pay`` tells); what a parent gone owes is forgotten."""
        for pid, gone in last.items():
            if pid not in now and gone.ppid in now and gone.ppid in last:
                self._owed.setdefault(gone.ppid, []).append(_Debt(gone.counters))
        for parent in [p for p in self._owed if p not in now]:
            del self._owed[parent]

    def _pay(self, pid: int, deltas: list[int]) -> None:
        """Take out of a parent's growth (``deltas``, in place) each child gone whose counters it holds whole: a
        reap adds every counter of the child's, at least what was last read of it. A child not held is not taken
        in part (it was not reaped by this parent yet, or never will be): the growth is the parent's own work."""
        debts = self._owed.get(pid, [])
        for debt in list(debts):
            if all(delta >= owed for delta, owed in zip(deltas, debt.counters, strict=True)):
                deltas[:] = [delta - owed for delta, owed in zip(deltas, debt.counters, strict=True)]
                debts.remove(debt)

    def _age(self) -> None:
        """After a reading: a child looked for in DEBT_READINGS readings and never found in its parent's counters
        was not reaped by it (auto-reaped: nothing added) and is forgotten."""
        for parent, debts in list(self._owed.items()):
            for debt in debts:
                debt.readings -= 1
            debts[:] = [debt for debt in debts if debt.readings > 0]
            if not debts:
                del self._owed[parent]


def parse_io(data: bytes) -> Counters | None:
    """COUNTERS from /proc/<pid>/io's text (``rchar: N`` a line, in the kernel's fixed order, read by
    position: this runs for every process of every tree every second); None where it is not that text."""
    fields = data.split()
    try:
        if (fields[0], fields[2], fields[8], fields[10]) != _KEYS:
            return None
        return (int(fields[1]), int(fields[3]), int(fields[9]), int(fields[11]))
    except (IndexError, ValueError):
        return None


_KEYS = (b"rchar:", b"wchar:", b"read_bytes:", b"write_bytes:")


class OpenFiles(NamedTuple):
    """The regular files a process holds open (``held``: st_dev, st_ino), and of those it writes (not a control
    file, not one open for appending), those with their control file beside them (``backed``) and those with none
    (``filling``)."""

    backed: frozenset[FileId]
    filling: frozenset[FileId]
    held: frozenset[FileId]


def read_files(pid: int, proc: str = "/proc") -> OpenFiles | None:
    """The files a process holds open; None where its descriptors cannot be listed (vanished, or not ours)."""
    fds = f"{proc}/{pid}/fd"
    try:
        listed = os.listdir(fds)
    except OSError:
        return None
    held: set[FileId] = set()
    backed: set[FileId] = set()
    filling: set[FileId] = set()
    for fd in listed:
        try:
            target = os.readlink(f"{fds}/{fd}")
            if not target.startswith("/"):  # a pipe, a socket, an anonymous inode
                continue
            st = os.stat(f"{fds}/{fd}")
        except OSError:  # closed since it was listed
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        file_id = (st.st_dev, st.st_ino)
        held.add(file_id)
        if target.endswith(" (deleted)"):  # no name left to put a control file beside: nothing to allocate
            continue
        if target.endswith(CONTROL_FILES) or not _writes_in_place(f"{proc}/{pid}/fdinfo/{fd}"):
            continue  # (a control file is none of the download's; a log, or a list read, is allocated by no one)
        if any(os.path.exists(target + suffix) for suffix in CONTROL_SUFFIXES):
            backed.add(file_id)
        else:
            filling.add(file_id)
    return OpenFiles(frozenset(backed), frozenset(filling), frozenset(held))


def _writes_in_place(fdinfo: str) -> bool:
    """The descriptor is open for writing, and not for appending (its ``flags:``, in octal)."""
    try:
        with open(fdinfo, "rb") as fh:
            text = fh.read(4096)
    except OSError:  # closed since it was listed
        return False
    for line in text.splitlines():
        if line.startswith(b"flags:"):
            try:
                flags = int(line[6:].strip(), 8)
            except ValueError:
                return False
            return flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR) and not flags & os.O_APPEND
    return False


def read_io(pid: int, proc: str = "/proc") -> Counters | None:
    """One process's counters; None if it vanished (or they are not the kernel's text). Raises PermissionError
    where they are not ours to read: another user's process while the supervisor lacks CAP_SYS_PTRACE (Docker's
    default), the kernel refusing the read itself. (Not cgroups.read_small: this is always procfs under our own
    /proc, read for every process every second, so no fstat and no decode.)"""
    try:
        fd = os.open(f"{proc}/{pid}/io", os.O_RDONLY)
    except PermissionError:
        raise
    except OSError:
        return None
    try:
        return parse_io(os.read(fd, 4096))
    except PermissionError:
        raise
    except OSError:
        return None
    finally:
        os.close(fd)


class _Reader:
    """One round's reads: a process in the trees of two watches (a phase's stall and progress watches) is
    read once, and so is a phase cgroup's list of processes. ``on_bad`` hears a cgroup file that holds a bad value."""

    def __init__(self, proc: str, on_bad: OnBad | None = None) -> None:
        self._proc, self._on_bad = proc, on_bad
        self._in_cgroup: dict[Path, list[int]] = {}  # a phase cgroup's processes, and those of the cgroups below it
        self._read: dict[int, Counters | None] = {}
        self._files: dict[int, OpenFiles | None] = {}  # an allocating downloader's open files
        self.refused: set[int] = set()  # the processes whose counters were not ours to read

    def trees(self, table: Descendants, roots: tuple[Root, ...], cgroup: MemoryCgroup | None = None,
              allocators: frozenset[str] = frozenset()) -> tuple[list[ProcIo], frozenset[int], frozenset[FileId]]:
        """The processes of the trees and of ``cgroup`` (the phase's own, or None) with their counters, those of them
        that refused theirs, and the files those named in ``allocators`` hold open (their open files read only for a
        watch that names some; a name, ``comm``, is the process table's, from the same reading, or the process's own
        stat for one the table does not hold: born since it was read, or re-parented outside our descendants)."""
        members = {proc.pid: proc for pid, tag in roots for proc in table.tree(pid, tag)}
        for pid in self._cgroup_pids(cgroup) if cgroup is not None else ():
            if pid not in members and (found := table.procs.get(pid) or proc_alone(pid, self._proc)) is not None:
                members[pid] = found
        procs = []
        held: set[FileId] = set()
        for pid, member in members.items():
            if pid not in self._read:
                try:
                    self._read[pid] = read_io(pid, self._proc)
                except PermissionError:
                    self._read[pid] = None
                    self.refused.add(pid)
            counters = self._read[pid]
            if counters is None:
                continue
            files = self._open_files(pid) if member.name in allocators else None
            if files is not None:
                held |= files.held
            procs.append(ProcIo(pid, member.ppid, counters, None if files is None else files.backed,
                                files.filling if files is not None else frozenset()))
        return procs, frozenset(pid for pid in members if pid in self.refused), frozenset(held)

    def _cgroup_pids(self, cgroup: MemoryCgroup) -> list[int]:
        """The processes in ``cgroup`` and below it (a child may make a cgroup below its phase's and move there),
        read once a round; none where it cannot be read (removed between two attempts, or garbage: said once)."""
        if cgroup.path not in self._in_cgroup:
            ours = MemoryCgroup(cgroup.path, cgroup.version, self._on_bad)  # (this thread's ear, not the loop's)
            self._in_cgroup[cgroup.path] = ours.pids_below() or []
        return self._in_cgroup[cgroup.path]

    def _open_files(self, pid: int) -> OpenFiles | None:
        if pid not in self._files:
            self._files[pid] = read_files(pid, self._proc)
        return self._files[pid]


class IoWatch:
    """One watch's handle, on the loop: ``follow`` the trees to read, ``latest`` totals, ``release``."""

    def __init__(self, probe: IoProbe, watch_id: int) -> None:
        self._probe, self._id = probe, watch_id

    def follow(self, roots: Iterable[Root], cgroup: MemoryCgroup | None = None) -> None:
        """The trees to read from now on (the attempt's children so far: called again as more start), and the
        cgroup whose processes are the attempt's too (its phase's own; None where the phase has none)."""
        self._probe._follow(self._id, tuple(roots), cgroup)

    def latest(self) -> TreeIo | None:
        return self._probe._latest(self._id)

    def release(self) -> None:
        self._probe._release(self._id)


@dataclass
class _Watched:
    every_s: float
    roots: tuple[Root, ...] = ()
    cgroup: MemoryCgroup | None = None  # the phase's own cgroup: its processes are the attempt's (IoWatch.follow)
    ledger: IoLedger = field(default_factory=IoLedger)
    latest: TreeIo | None = None
    allocators: frozenset[str] = frozenset()  # the names of the allocating downloaders it asks of (TreeIo)


class IoProbe:
    """The I/O thread, started by the first ``watch``."""

    def __init__(self, table: Callable[[], ProcessTable] = lambda: ProcessTable(zombies=True),
                 proc: str = "/proc") -> None:
        self._make_table, self._proc = table, proc
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._watches: dict[int, _Watched] = {}
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self.state = WatchState("I/O watch", IO_BLIND_S)  # its own health: a round that raised is a miss
        self.state.idle("no attempt followed")  # (until one is: no thread, nothing to read)
        self._refusals_said: set[int] = set()  # the pids whose refused counters were said (once each)
        self._bad_said: set[Path] = set()  # the cgroup files whose bad value was said (once each; the thread's own)

    def watch(self, every_s: float = IO_SAMPLE_S, *, from_zero: bool = False,
              allocators: frozenset[str] = frozenset()) -> IoWatch:
        """A watch read at least every ``every_s``; ``from_zero``: its trees' bytes count from their start
        (IoLedger); ``allocators``: the process names of the allocating downloaders whose allocation it tells apart
        (the module's docstring)."""
        with self._cond:
            watch_id = next(self._ids)
            self._watches[watch_id] = _Watched(max(IO_SAMPLE_MIN_S, every_s), ledger=IoLedger(from_zero),
                                               allocators=allocators)
            if self._thread is None and not self._closed:
                self._thread = worker_thread("io", self._run_restarting)
            self._cond.notify_all()
        return IoWatch(self, watch_id)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _follow(self, watch_id: int, roots: tuple[Root, ...], cgroup: MemoryCgroup | None) -> None:
        with self._cond:
            watched = self._watches.get(watch_id)
            if watched is not None and (watched.roots, watched.cgroup) != (roots, cgroup):
                watched.roots, watched.cgroup = roots, cgroup
                self._cond.notify_all()  # new trees: read at once (their baseline)

    def _latest(self, watch_id: int) -> TreeIo | None:
        with self._cond:
            watched = self._watches.get(watch_id)
            return watched.latest if watched is not None else None

    def _release(self, watch_id: int) -> None:
        with self._cond:
            self._watches.pop(watch_id, None)

    # ------------------------------------------------------------ the thread

    def _run_restarting(self) -> None:
        """The thread, contained (watchstate.run_restarting): a bug of ours outside a round's own try (in the
        accounting, in publishing) is said and counted, and the thread starts again after THREAD_RESTART_S (this
        module's name, read now), doubling; without it the thread died for good, every later attempt unwatched."""
        run_restarting(self._run, self.state, "the I/O thread", self._cond, lambda: self._closed,
                      self._forget_readings, restart_s=THREAD_RESTART_S, restart_max_s=THREAD_RESTART_MAX_S)

    def _forget_readings(self, exc: Exception) -> None:
        """(under the lock) After a failure: no watch's totals of before it stand as its latest (a stall watch
        then sees its I/O evidence age, not a frozen reading), and each ledger starts from a new baseline."""
        for watched in self._watches.values():
            watched.latest = None
            watched.ledger.rebase()

    def _run(self) -> None:
        # The thread's own (the loop's table is the stops'), zombies kept: a child's counters stay readable until
        # its reap, when its parent's take them in; left out before, the child read as gone long before that.
        table = self._make_table()
        snapshot: Descendants | None = None  # the trees' members, as last read from the process table
        scanned: dict[int, tuple[tuple[Root, ...], MemoryCgroup | None]] = {}  # the roots (and cgroups) it was read for
        while self._wait():
            with self._cond:
                asked = {wid: (w.roots, w.cgroup) for wid, w in self._watches.items() if w.roots or w.cgroup}
                names = {wid: self._watches[wid].allocators for wid in asked}
            if not asked:
                self.state.idle("no attempt followed")
                continue
            self.state.wake()
            try:
                if snapshot is None or asked != scanned:
                    snapshot, scanned = table.snapshot(newer_than=time.monotonic()), asked
                else:  # (the whole table every TREE_REFRESH_S; newcomers at each reading for an allocators' watch)
                    snapshot = table.reading(TREE_REFRESH_S, newcomers=any(names.values()))
                read = _Reader(self._proc, self._say_bad)
                readings = {wid: read.trees(snapshot, roots, cgroup, names[wid])
                            for wid, (roots, cgroup) in asked.items()}
            except Exception as exc:  # a bug must not end the only reader: this round reads as no reading
                self.state.miss(said_error(exc))
                continue
            self.state.read()
            self._say_refused(read.refused)
            now = time.monotonic()
            with self._cond:
                for wid, (procs, refused, held) in readings.items():
                    watched = self._watches.get(wid)
                    if watched is None:
                        continue
                    watched.ledger.add(procs, refused)
                    ledger = watched.ledger
                    watched.latest = TreeIo(next(self._seq), now, ledger.moved, ledger.written, len(procs),
                                            ledger.readable, len(refused), ledger.allocated, ledger.allocating,
                                            held, ledger.stored)

    def _say_refused(self, refused: set[int]) -> None:
        """Processes whose counters are not ours to read are said, each once: their reads and writes are no sign
        of life, and a stall found meanwhile says so (stall.py)."""
        new = sorted(refused - self._refusals_said)
        if not new:
            return
        if len(self._refusals_said) >= REFUSALS_SAID_MAX:
            self._refusals_said.clear()
        self._refusals_said.update(new)
        shown = ", ".join(map(str, new[:5])) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
        self.state.say(f"I/O watch: the I/O counters of pid {shown} cannot be read (another user's process, and "
                       "the supervisor lacks CAP_SYS_PTRACE): its reads and writes are no sign of life")

    def _say_bad(self, path: Path, why: str) -> None:
        """(the thread) A phase cgroup's file holds a bad value: the processes only it knows are not read, said once."""
        if path not in self._bad_said:
            self._bad_said.add(path)
            self.state.say(f"I/O watch: {path} {why}: the processes of the phase's cgroup outside its trees are not "
                           "read")

    def _wait(self) -> bool:
        """Sleep one period (the shortest a watch asked for; at once when the roots changed); False once closed."""
        with self._cond:
            if self._closed:
                return False
            if not any(w.roots or w.cgroup for w in self._watches.values()):
                self._cond.wait()  # nothing to read until a watch follows a tree
            else:
                self._cond.wait(min(w.every_s for w in self._watches.values()))
            return not self._closed
