"""Memory cgroups, v1 and v2 behind one interface: OOM-kill counters, limits, usage, peaks.

Exit status 137 only says "SIGKILL"; whether the kernel's OOM killer sent it is
read from the cgroup's ``oom_kill`` counter (v2 ``memory.events``, v1
``memory.oom_control``), before and after a child's life. The counter is
cumulative, so only a rise during the child's life counts. v2's counts a kill in
the victim's cgroup and every one above it; v1's only in the victim's own, so a
v1 cgroup's count is read from it and from every cgroup below it (``OomKills``).
So is v2's where the hierarchy is mounted with ``memory_localevents`` (Linux 5.2
on: each cgroup's ``memory.events`` then counts only its own), which ``discover``
reads from ``/proc/self/mountinfo``.

The supervisor's own memory cgroup is found from ``/proc/self/cgroup`` and the
cgroup mount (the root is injectable, so tests point it at a directory laid out
like cgroupfs). Where it can create child cgroups (v1 as root, v2 when the
subtree is delegated) each phase gets its own, so its verdict and peak are its
own; otherwise every child shares the supervisor's counter.

Every such file is read as evidence by ``read_small`` below: bounded, never waited on, text or ``BadValue``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..engine.trees import own_pid_namespace
from ..text.show import fmt_bytes, shown
from ..text.units import is_ascii_digits

DEFAULT_ROOT = Path("/sys/fs/cgroup")
# v1 reports "no limit" as a huge page-aligned number; anything above this is unlimited.
V1_UNLIMITED = 1 << 62

IN_MODIFY = 0x00000002
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC


# Told (the file, what is wrong with it) when a file holds a bad value: the owner says it, once.
OnBad = Callable[[Path, str], None]
# Phase cgroups are named per supervisor, ``prover-<pid>-<phase>`` (two supervisors in one cgroup must not share
# them). Each has its own verdicts: the supervisor's cgroup counts its OOM kills apart from theirs (MemoryCgroup).
PHASE_CGROUP_PREFIX = "prover-"
# The host's PID namespace (Linux's PROC_PID_INIT_INO). A supervisor in another one (pid 1 of `unshare --pid` on a
# host) may share its pid with another such in the same cgroup, whose memory_max would be set on its phase's
# cgroup and whose OOM kills counted as its own: its phase cgroups carry the namespace too, ``prover-<pid>.<ns>-``.
INIT_PID_NAMESPACE = 0xEFFFFFFC

# v1 counts an OOM kill only in the victim's own cgroup (Linux's memcg_memory_event goes up to the ancestors on
# the v2 hierarchy alone; measured on 6.18: a kill in a cgroup nested below ours, by its own limit or by ours,
# leaves ours at 0), and so does v2 mounted with memory_localevents (memcg_memory_event stops at the victim's
# cgroup there too), so such a count walks the cgroups below, as do a phase's sweep and removal (v1 or v2: a
# child may make a cgroup below its phase's). At most this many: past it the count is unknown, never a part
# taken for the whole (a child that makes hundreds of cgroups is not the kernel's doing).
SUBTREE_MAX = 256
# The processes named when others share the supervisor's v2 cgroup (a container may hold hundreds).
MAX_PIDS_SAID = 5


# ------------------------------------------------------------ a small file the kernel writes
# A small file the kernel writes (cgroupfs, /proc) is read as evidence: bounded, never waited on, text or
# refused. Such a file is a few lines of ASCII. What stands in its place may be anything (a bind mount, a test's
# directory, a FUSE filesystem): bytes that are not text, megabytes, a FIFO that never answers. None of that
# may cost more than the one reading: it is a ``BadValue``, which its reader says (once) and counts as
# evidence unavailable, never guessed.

# The most such a file may hold (memory.stat is about 2 KiB): more is no kernel's.
READ_LIMIT = 64 * 1024
# /proc/self/mountinfo is a line a mount: a container's holds a few dozen, a host's (a node of many containers)
# thousands. More than this is refused: memory_localevents is then unknown (discover reads it as absent).
MOUNTINFO_LIMIT = 4 << 20


class BadValue(ValueError):
    """A kernel file held what no kernel writes there: bytes that are not text, a word where a number goes,
    a FIFO or a device in its place. Its reading is unavailable (never guessed), said by the one told."""


def read_small(path: Path) -> str | None:
    """The text of a small kernel file (cgroupfs, /proc); None where it cannot be read (absent, refused).

    Read by ``read_bounded`` to at most READ_LIMIT. Bytes that are not UTF-8 raise BadValue: the kernel
    writes only text there, so whatever wrote them is not the kernel, and nothing in it is believed."""
    data = read_bounded(path, READ_LIMIT)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(f"holds bytes that are not text (at byte {exc.start})") from None


def read_bounded(path: Path, limit: int) -> bytes | None:
    """The bytes of a kernel file, at most ``limit`` of them (more raises BadValue); None where it cannot be
    read (absent, refused). Never waits on what stands in its place: opened non-blocking, and anything but a
    regular file (a FIFO, a device) is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadValue("is not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    if size > limit:
        raise BadValue(f"holds over {limit} bytes")
    return b"".join(chunks)


def kernel_number(text: str) -> int:
    """A kernel counter or size: ASCII digits (a v1 counter may be negative: -1 is "no limit" written back)."""
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):  # (never "²" or "١": units.is_ascii_digits, inline)
        raise BadValue(f"holds {shown(text, 40)} where a number goes")
    return int(text)


@dataclass(frozen=True)
class OomKills:
    """A cgroup's OOM-kill counters at one reading, each cgroup's own, by path: v2 one (``memory.events``
    counts the kills below it too), v1 (and v2 under ``memory_localevents``) the cgroup and every cgroup below
    it (each counts only its own)."""

    by_cgroup: Mapping[Path, int]

    @property
    def total(self) -> int:
        return sum(self.by_cgroup.values())


@dataclass(frozen=True)
class MemorySnapshot:
    oom_kills: int | None  # the total of ``oom``
    usage: int | None
    peak: int | None
    limit: int | None  # None: no limit
    oom: OomKills | None = None  # the counters the total was read from (a rise is measured on these)
    under_oom: bool | None = None  # v1: frozen at its limit, the OOM killer disabled (None: not v1, or unread)

    def describe(self) -> str:
        parts = [f"usage={fmt_bytes(self.usage)}", f"peak={fmt_bytes(self.peak)}",
                 f"limit={fmt_bytes(self.limit) if self.limit is not None else 'none'}",
                 f"oom_kills={'?' if self.oom_kills is None else self.oom_kills}"]
        return " ".join(parts)


class MemoryCgroup:
    """One memory cgroup directory; ``version`` is "v1" or "v2". ``on_bad`` hears each bad value read
    (its children are given the same); without it a bad value is just unavailable. ``phases_apart``: the
    phase cgroups right below (``is_phase_cgroup``) are not this one's to count OOM kills of (the supervisor's
    own cgroup in v1: each phase cgroup has its own verdicts); v2 reads one hierarchical counter and never
    looks below, unless ``local_events``: the v2 hierarchy is mounted with ``memory_localevents`` (``discover``
    reads it; its children are given the same), and its counter is read as v1's is, with those below."""

    def __init__(self, path: Path, version: str, on_bad: OnBad | None = None, phases_apart: bool = False,
                 local_events: bool = False) -> None:
        self.path = path
        self.version = version
        self.on_bad = on_bad
        self.phases_apart = phases_apart
        self.local_events = local_events

    def __repr__(self) -> str:
        return f"MemoryCgroup({self.version}, {self.path})"

    @property
    def counts_below(self) -> bool:
        """Whether its own OOM counter counts the kills in the cgroups below it too: v2's ``memory.events``,
        unless the hierarchy is mounted with ``memory_localevents``; never v1's."""
        return self.version == "v2" and not self.local_events

    # ------------------------------------------------------------ reading

    def oom_kills(self) -> int | None:
        """The OOM kills counted in this cgroup and below it; None where they cannot be read."""
        counts = self.oom_counts()
        return None if counts is None else counts.total

    def oom_counts(self) -> OomKills | None:
        """The counters a rise is measured on: v2's ``memory.events`` (never ``.local``: a kill in a cgroup
        a child made below this one is this one's too); where a counter counts only its own victims (v1's
        ``memory.oom_control``, v2's under ``memory_localevents``), it here and in each cgroup below. None
        where this cgroup's counter cannot be read."""
        if self.counts_below:
            own = self._keyed(self._events_file, "oom_kill")
            return None if own is None else OomKills({self.path: own})
        paths = self.subtree()
        if paths is None:
            return None
        counts: dict[Path, int] = {}
        for path in paths:
            name = str((path / self._events_file).relative_to(self.path))
            count = self._keyed(name, "oom_kill")
            if count is None and path == self.path:
                return None
            if count is not None:  # (None below: removed as it was read, its kills gone with it)
                counts[path] = count
        return OomKills(counts)

    def subtree(self) -> list[Path] | None:
        """This cgroup and every cgroup below it (the phase cgroups right below left out, with theirs, where
        ``phases_apart``), this one first; None past SUBTREE_MAX (said as a bad value: whatever made them, the
        counts are unknown)."""
        found, unread = [self.path], [self.path]
        while unread:
            path = unread.pop()
            for name in _subdirectories(path):
                if path == self.path and self.phases_apart and is_phase_cgroup(name):
                    continue
                if len(found) >= SUBTREE_MAX:
                    self._bad("", BadValue(f"has over {SUBTREE_MAX} cgroups below it"))
                    return None
                found.append(path / name)
                unread.append(path / name)
        return found

    def snapshot(self) -> MemorySnapshot:
        oom = self.oom_counts()
        if self.version == "v2":
            return MemorySnapshot(
                oom_kills=None if oom is None else oom.total,
                usage=self._int("memory.current"),
                peak=self._int("memory.peak"),
                limit=self.limit(),
                oom=oom,
            )
        return MemorySnapshot(
            oom_kills=None if oom is None else oom.total,
            usage=self._int("memory.usage_in_bytes"),
            peak=self._int("memory.max_usage_in_bytes"),
            limit=self.limit(),
            oom=oom,
            under_oom=None if (frozen := self._keyed("memory.oom_control", "under_oom")) is None else frozen > 0,
        )

    def limit(self) -> int | None:
        """The cgroup's memory limit (None: none, or unreadable), read alone: the machine's memory figure reads
        every ancestor's, and a snapshot would walk the cgroups below each for its OOM counters (the host's
        own root may hold hundreds: the walk gave up on it, and said so, at every start)."""
        if self.version == "v2":
            return self._int("memory.max")
        limit = self._int("memory.limit_in_bytes")
        return None if limit is None or limit >= V1_UNLIMITED else limit

    def limit_with_ancestors(self) -> int | None:
        """v1: the least limit of this cgroup and of every one above it, as the kernel works it out
        (``memory.stat``'s ``hierarchical_memory_limit``), those above the mount too, which cannot be read one
        by one from here; None: none, unreadable, or v2 (which has no such figure)."""
        if self.version != "v1":
            return None
        try:
            limit = _read_keyed(self.path / "memory.stat", "hierarchical_memory_limit")
        except BadValue as exc:
            self._bad("memory.stat", exc)
            return None
        return None if limit is None or limit >= V1_UNLIMITED else limit

    def limit_hits(self) -> int | None:
        """How many times this cgroup's own limit was reached: v1 ``memory.failcnt`` (a charge it refused, whether
        reclaim then made room or not), v2 ``memory.events.local`` ``oom`` (nothing left to reclaim: the OOM
        killer called at this limit). Which limit an OOM kill came at is the one whose count rose."""
        if self.version == "v1":
            return self._int("memory.failcnt")
        return self._keyed("memory.events.local", "oom")

    def working_set(self) -> int | None:
        """Usage less the inactive file cache (the kubelet's working set): what the kernel cannot just drop."""
        usage = self._int("memory.current" if self.version == "v2" else "memory.usage_in_bytes")
        if usage is None:
            return None
        key = "inactive_file" if self.version == "v2" else "total_inactive_file"
        try:
            inactive = _read_keyed(self.path / "memory.stat", key)
        except BadValue as exc:  # the cache's share is unknown: no working set, never the usage taken for one
            self._bad("memory.stat", exc)
            return None
        return max(0, usage - (inactive or 0))

    def readable(self) -> bool:
        """Whether its own OOM counter reads (never a walk below it: a crowded cgroup is still readable)."""
        return self._keyed(self._events_file, "oom_kill") is not None

    @property
    def _events_file(self) -> str:
        """The file its own OOM counter is in.

        Under ``memory_localevents`` v2's ``memory.events.local``, though ``memory.events`` holds the same
        counts there: ``.local`` is local by its own definition, not by the mount's, and the mount's may change
        under us (``mount -o remount`` sets or clears the option on a live hierarchy). Summed over the cgroups
        below, ``.local`` never counts a kill twice, whichever way it changed; ``memory.events`` would count one
        in each cgroup from the victim's up once the option is cleared. Both came with Linux 5.2, so where the
        option is, so is the file."""
        if self.version == "v1":
            return "memory.oom_control"
        return "memory.events.local" if self.local_events else "memory.events"

    def pids(self) -> list[int] | None:
        """The processes in this cgroup now; None where ``cgroup.procs`` cannot be read (or holds garbage)."""
        try:
            text = read_small(self.procs_file())
        except BadValue as exc:
            self._bad("cgroup.procs", exc)
            return None
        if text is None:
            return None
        words = text.split()
        if not all(is_ascii_digits(word) for word in words):
            self._bad("cgroup.procs", BadValue("holds a word that is not a pid"))
            return None
        return [int(word) for word in words]

    def _int(self, name: str) -> int | None:
        try:
            return _read_int(self.path / name)
        except BadValue as exc:
            self._bad(name, exc)
            return None

    def _keyed(self, name: str, key: str) -> int | None:
        try:
            return _read_keyed(self.path / name, key)
        except BadValue as exc:
            self._bad(name, exc)
            return None

    def _bad(self, name: str, exc: BadValue) -> None:
        if self.on_bad is not None:
            self.on_bad(self.path / name, str(exc))

    # ------------------------------------------------------------ children

    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def create_child(self, name: str, memory_max: int | None = None) -> MemoryCgroup:
        """Make a child cgroup (raises OSError where not allowed)."""
        child = MemoryCgroup(self.path / name, self.version, self.on_bad, local_events=self.local_events)
        child.path.mkdir(exist_ok=True)
        if self.version == "v1":
            # v1 hands a new cgroup its parent's oom_kill_disable (``docker run --oom-kill-disable``): a phase
            # at its memory_max would then freeze, not be killed, and a service wait for ever. Our limit kills.
            with contextlib.suppress(OSError):
                (child.path / "memory.oom_control").write_text("0")
        if memory_max is not None:
            target = "memory.max" if self.version == "v2" else "memory.limit_in_bytes"
            try:
                (child.path / target).write_text(str(memory_max))
            except OSError:
                child.remove()
                raise
        return child

    def pids_below(self) -> list[int] | None:
        """The processes in this cgroup and in every cgroup below it (a child may make one and move into it:
        it is still this cgroup's); None where this cgroup's own ``cgroup.procs`` cannot be read."""
        pids: list[int] = []
        for path in self.subtree() or [self.path]:  # (past the bound: this one's own, the rest unknown)
            own = MemoryCgroup(path, self.version, self.on_bad).pids()
            if own is None and path == self.path:
                return None
            pids += own or []
        return pids

    def remove(self) -> bool:
        """Remove this cgroup, and first the cgroups below it (rmdir refuses a cgroup that has one), once no
        process is in any: processes are moved out first by the caller, and where one is left (or the tree
        cannot be read) only this one's rmdir is tried, so nobody's cgroup below is touched. Whether it is gone."""
        empty = self.pids_below() == []
        for path in reversed((self.subtree() if empty else None) or [self.path]):  # (each before those below)
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True

    def move_all_to(self, target: MemoryCgroup) -> None:
        """Move every process of this cgroup and of the cgroups below it into ``target`` (so this one can be
        removed)."""
        for pid in self.pids_below() or []:
            with contextlib.suppress(OSError):
                target.procs_file().write_text(str(pid))

    # ------------------------------------------------------------ watching

    def open_watch(self) -> tuple[int, str] | None:
        """An fd that becomes readable when an OOM happens here, and how; None if unsupported.

        v2: inotify on ``memory.events`` (the kernel signals a modify when it changes).
        v1: an eventfd registered on ``memory.oom_control`` through ``cgroup.event_control``.
        """
        try:
            if self.version == "v2":
                # Under memory_localevents this file changes only for a kill in this cgroup itself: one in a
                # cgroup a child made below it fires nothing, and is counted (and logged) at the next reading,
                # the reap's at the latest, as v1's eventfd misses one by a limit below (memory.py).
                return _inotify_watch(self.path / "memory.events"), "inotify"
            return _v1_oom_eventfd(self.path), "eventfd"
        except OSError:
            return None

    @staticmethod
    def consume_watch(fd: int) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(fd, 4096)


# ---------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Discovery:
    cgroup: MemoryCgroup | None
    why: str  # how it was found, or why there is none


def discover(root: Path | str = DEFAULT_ROOT, proc_cgroup: Path | str = "/proc/self/cgroup",
             on_bad: OnBad | None = None, mountinfo: Path | str = "/proc/self/mountinfo") -> Discovery:
    """Find this process's memory cgroup under ``root`` (v2 unified, or v1 ``memory`` controller); for v2,
    whether ``mountinfo`` shows the mount at ``root`` with ``memory_localevents``.
    Blocks on the files (a hung cgroupfs hangs it): the caller runs it off the loop, with a bound."""
    root = Path(root)
    try:
        text = read_small(Path(proc_cgroup))
    except BadValue as exc:
        return Discovery(None, f"{proc_cgroup} {exc}")
    if text is None:
        return Discovery(None, f"cannot read {proc_cgroup}")
    lines = text.splitlines()
    v1_rel = v2_rel = None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2_rel = rel
        elif "memory" in controllers.split(","):
            v1_rel = rel
    candidates: list[MemoryCgroup] = []
    if v1_rel is not None and (root / "memory").is_dir():
        candidates += [MemoryCgroup(root / "memory" / v1_rel.lstrip("/"), "v1", on_bad),
                       MemoryCgroup(root / "memory", "v1", on_bad)]
    if v2_rel is not None and (root / "cgroup.controllers").exists():
        local_events = _mounted_with_local_events(root, Path(mountinfo), on_bad)
        candidates += [MemoryCgroup(root / v2_rel.lstrip("/"), "v2", on_bad, local_events=local_events),
                       MemoryCgroup(root, "v2", on_bad, local_events=local_events)]
    for cgroup in candidates:
        if cgroup.readable():
            local = " (memory_localevents: OOM kills counted over each cgroup below)" if cgroup.local_events else ""
            return Discovery(cgroup, f"cgroup {cgroup.version} at {cgroup.path}{local}")
    if not candidates:
        return Discovery(None, f"no memory cgroup under {root} (neither v2 nor a v1 memory controller)")
    tried = ", ".join(str(cgroup.path) for cgroup in candidates)
    return Discovery(None, f"memory cgroup files not readable (tried {tried})")


def _mounted_with_local_events(root: Path, mountinfo: Path, on_bad: OnBad | None) -> bool:
    """Whether ``mountinfo`` shows a cgroup2 mount at ``root`` whose super options (after the `` - ``:
    ``cgroup2 cgroup2 rw,nsdelegate,memory_localevents``) hold ``memory_localevents``. The option is the one v2
    hierarchy's, shown on each of its mounts; the one at ``root`` is read, as that is what discover reads (a
    test's directory is no mount: none there).

    Where mountinfo cannot be read, or shows no cgroup2 mount at ``root``: False, the hierarchical reading. It
    is the kernel's default and the reading every v2 kernel has (``memory.events.local`` came with 5.2); were
    the option on after all, it misses only a kill in a cgroup a child made below the phase's (a SIGKILL then,
    as before the option was known), and never counts a kill that was not in the cgroup."""
    try:
        text = read_bounded(mountinfo, MOUNTINFO_LIMIT)
    except BadValue as exc:
        if on_bad is not None:
            on_bad(mountinfo, str(exc))
        return False
    where = os.fsencode(os.path.realpath(root))
    super_options: list[bytes] = []
    for line in (text or b"").splitlines():
        # ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS; a space in a
        # path is written \040, so " - " is only ever the separator.
        mount, separator, filesystem = line.partition(b" - ")
        mount_fields, filesystem_fields = mount.split(b" "), filesystem.split(b" ")
        if not separator or len(mount_fields) < 5 or _unescape_mount_path(mount_fields[4]) != where:
            continue
        # The last mount at root is the one seen there (one mounted over another hides it).
        is_cgroup2 = len(filesystem_fields) >= 3 and filesystem_fields[0] == b"cgroup2"
        super_options = filesystem_fields[2].split(b",") if is_cgroup2 else []
    return b"memory_localevents" in super_options


def _unescape_mount_path(field: bytes) -> bytes:
    """A mountinfo path as the kernel escapes it (space, tab, newline and backslash as ``\\ooo``), unescaped."""
    return re.sub(rb"\\([0-3][0-7]{2})", lambda octal: bytes([int(octal[1], 8)]), field)


def enable_v2_delegation(cgroup: MemoryCgroup) -> MemoryCgroup:
    """v2's "no internal processes" rule: a cgroup that holds processes has no controller enabled below it. So
    the supervisor moves itself into a leaf of its own, then enables +memory below: possible where it is alone
    in its cgroup (PID 1 of a container). Started from Vast's onstart it shares the container's cgroup with
    sshd and the rest, which are not its to move: it moves nothing and says who is there.

    Returns the leaf the supervisor now lives in. Raises OSError where the subtree is not delegated to us or
    another process shares it; the supervisor is then where it was.
    """
    others = [pid for pid in cgroup.pids() or [] if pid != os.getpid()]
    if others:
        pids = ", ".join(map(str, others[:MAX_PIDS_SAID])) + (", ..." if len(others) > MAX_PIDS_SAID else "")
        raise OSError(errno.EBUSY, f"{len(others)} other process(es) in this cgroup (pid {pids}); cgroup v2 "
                                   "enables no controller below a cgroup that holds processes")
    leaf = cgroup.create_child("supervisor")
    leaf.procs_file().write_text(str(os.getpid()))
    try:
        (cgroup.path / "cgroup.subtree_control").write_text("+memory")
    except OSError:  # (one came in since the look, or +memory is not ours to enable): back where it was
        with contextlib.suppress(OSError):
            cgroup.procs_file().write_text(str(os.getpid()))
            leaf.remove()
        raise
    return leaf


# ---------------------------------------------------------------- memory of the machine


def mem_total(meminfo: Path | str = "/proc/meminfo") -> int | None:
    return _meminfo(meminfo).get("MemTotal")


def mem_used(meminfo: Path | str = "/proc/meminfo") -> int | None:
    """What the machine's memory holds that cannot be given back at once: MemTotal less MemAvailable."""
    fields = _meminfo(meminfo)
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        return None
    return max(0, fields["MemTotal"] - fields["MemAvailable"])


def _meminfo(meminfo: Path | str) -> dict[str, int]:
    fields = {}
    try:
        for line in (read_small(Path(meminfo)) or "").splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return fields


def read_pressure(path: Path) -> str | None:
    """PSI lines (``memory.pressure``, ``/proc/pressure/memory``) as one short text: ``some avg10=1.20
    full avg10=0.40``; None where there is none (v1, no file, or PSI disabled: EOPNOTSUPP on read)."""
    try:
        text = read_small(path)
    except BadValue:  # a garnish of the memory line: without it the line still stands
        return None
    return parse_pressure(text) if text is not None else None


def parse_pressure(text: str) -> str | None:
    parts = []
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        if kind in ("some", "full") and "avg10" in fields:
            parts.append(f"{kind} avg10={fields['avg10']}%")
    return " ".join(parts) or None


# ---------------------------------------------------------------- file helpers


def _subdirectories(path: Path) -> list[str]:
    """The names of the directories right in ``path`` (a cgroup's children); none where it cannot be listed
    (removed as it is read)."""
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _read_int(path: Path) -> int | None:
    text = read_small(path)
    if text is None:
        return None
    text = text.strip()
    return None if text == "max" else kernel_number(text)


def _read_keyed(path: Path, key: str) -> int | None:
    text = read_small(path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return kernel_number(value.strip())
    return None


_libc: ctypes.CDLL | None = None


def _libc_handle() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # the libc already loaded: no ldconfig lookup
    return _libc


def _inotify_watch(path: Path) -> int:
    if not path.exists():
        raise FileNotFoundError(str(path))
    libc = _libc_handle()
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    if libc.inotify_add_watch(fd, os.fsencode(path), IN_MODIFY) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"inotify_add_watch {path} failed")
    return fd


def _v1_oom_eventfd(path: Path) -> int:
    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    control = os.open(path / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with open(path / "cgroup.event_control", "w") as f:
            f.write(f"{efd} {control}")
    except OSError:
        os.close(efd)
        raise
    finally:
        os.close(control)
    return efd


def phase_cgroup_name(phase: str, pid: int | None = None) -> str:
    """The cgroup for ``phase`` of this supervisor (of the supervisor ``pid``, in our PID namespace):
    ``prover-<pid>-<phase>``, ``prover-<pid>.<ns>-<phase>`` outside the host's PID namespace (``.0``: one that
    cannot be read, never taken for the host's). The host's names carry no namespace: they are those supervisors
    made before names had one, on disk and in ledgers, and are read back as they always were."""
    ns, pid = own_pid_namespace(), os.getpid() if pid is None else pid
    owner = f"{pid}" if ns == INIT_PID_NAMESPACE else f"{pid}.{ns}"
    return f"{PHASE_CGROUP_PREFIX}{owner}-{phase}"


def is_phase_cgroup(name: str) -> bool:
    """A phase cgroup's name (phase_cgroup_name's), whichever supervisor made it."""
    return name.startswith(PHASE_CGROUP_PREFIX) and phase_cgroup_owner(name) != (0, 0)


def phase_cgroup_owner(name: str) -> tuple[int, int]:
    """The supervisor pid and PID namespace in a phase cgroup's name (phase_cgroup_name's); (0, 0) when it is
    not such a name."""
    pid, dot, ns = name[len(PHASE_CGROUP_PREFIX):].split("-", 1)[0].partition(".")
    if not is_ascii_digits(pid) or (dot and not is_ascii_digits(ns)):
        return 0, 0
    return int(pid), int(ns) if dot else INIT_PID_NAMESPACE
