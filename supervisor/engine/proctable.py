"""The supervisor's descendants, read from /proc once and shared by every child being stopped.

Stopping a child stops its tree: its process group, its descendants, and whatever carries its
tag (``TAG_ENV``: an escapee that left the group with ``setsid``). Knowing that tree means reading
every process's parent, group and environment. Read once per stopping child every
``STOP_POLL_S``, 200 daemons stopping together read the table 200 times a poll, and each read
reads 200 environments: their stop took 50 s instead of their grace period. So the table is read
once for everyone who asks at about the same moment: a reading serves for ``SNAPSHOT_MAX_AGE_S``
(every stop polled in one loop turn), unless the one asking needs a newer one (a child whose
leader was reaped must see a reading from after the reap: an older one could miss what the
leader forked last). A process's tag is read once in its life (its environment does not change), once it has one: a
process caught inside execve reads with no environment yet, and is read again.

Reading is never given up on a race: a process that vanishes while it is read is left out.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from .survivors import STOP_POLL_S, TAG_ENV

# A reading this recent is shared (half a stop poll: the stops polled in one loop turn share one).
SNAPSHOT_MAX_AGE_S = STOP_POLL_S / 2

_TAG_PREFIX = TAG_ENV.encode() + b"="


@dataclass(frozen=True)
class Proc:
    """One live process: its pid, parent, process group and tag (None: none, or unreadable)."""

    pid: int
    ppid: int
    pgid: int
    tag: str | None


class Snapshot:
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


class ProcessTable:
    """Readings of the process table, shared (see the module's docstring); ``scans`` counts them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, proc: str = "/proc") -> None:
        self.scans = 0
        self._clock = clock
        self._proc = proc
        self._last: Snapshot | None = None
        self._tags: dict[tuple[int, str], str | None] = {}  # (pid, start time) → its tag

    def snapshot(self, newer_than: float = -math.inf) -> Snapshot:
        """A reading taken after ``newer_than`` (monotonic) and at most SNAPSHOT_MAX_AGE_S old."""
        now = self._clock()
        last = self._last
        if last is None or last.taken_at < newer_than or now - last.taken_at > SNAPSHOT_MAX_AGE_S:
            last = self._last = self._read(now)
        return last

    def _read(self, now: float) -> Snapshot:
        self.scans += 1
        stats = {}
        for name in os.listdir(self._proc):
            if name.isdigit() and (stat := self._stat(name)) is not None:
                stats[int(name)] = stat
        below: dict[int, list[int]] = {}
        for pid, (_, ppid, _, _) in stats.items():
            below.setdefault(ppid, []).append(pid)
        procs: list[Proc] = []
        tags: dict[tuple[int, str], str | None] = {}
        todo = list(below.get(os.getpid(), ()))
        while todo:
            pid = todo.pop()
            state, ppid, pgid, started = stats[pid]
            todo.extend(below.get(pid, ()))
            if state == "Z":
                continue  # a zombie is the reaper's, and signals cannot reach it
            key = (pid, started)
            if key in self._tags:
                tag = tags[key] = self._tags[key]
            else:
                tag, settled = self._tag(pid)
                if settled:
                    tags[key] = tag
            procs.append(Proc(pid, ppid, pgid, tag))
        self._tags = tags  # the processes gone since are forgotten
        return Snapshot(procs, now)

    def _stat(self, pid: str) -> tuple[str, int, int, str] | None:
        """(state, ppid, pgid, start time) from /proc/<pid>/stat; None if it vanished."""
        try:  # (os.open: a third of open()'s cost, and the table reads every process of the machine)
            fd = os.open(f"{self._proc}/{pid}/stat", os.O_RDONLY)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            return None
        fields = data[data.rfind(b")") + 2:].split()  # after "pid (comm) ": the name may hold anything
        try:
            return fields[0].decode(), int(fields[1]), int(fields[2]), fields[19].decode()
        except (IndexError, ValueError):
            return None

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
