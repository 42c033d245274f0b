"""Memory evidence for verdicts: which cgroup each phase runs in, OOM counters, the preflight.

Modes (said once at start):
- ``per-phase``: each phase runs in a child cgroup of the supervisor's own, so
  its OOM counter and its peak are its alone (made anew for each attempt:
  ``new_attempt`` says why);
- ``shared``: every child shares the supervisor's cgroup counter (a rise during a
  child's life may then come from a sibling: said in the verdict);
- ``unavailable``: no readable memory cgroup; OOM is "unknown", never guessed.

The counters are watched while children run (v2: inotify on ``memory.events``;
v1: an eventfd on ``memory.oom_control``; a poll every ``OOM_POLL_S`` where
neither can be registered), so an OOM kill of any descendant is logged the
moment it happens, with the cgroup's usage and peak. (v1 notifies the cgroup under
OOM and those below it, never those above: a kill by the limit of a cgroup a child
made below ours is counted in its verdict, but logged only at that reading. So is
any kill in a cgroup below ours under v2's ``memory_localevents``: our
``memory.events`` changes only for our own.)

Every phase cgroup made is first written to a ledger in ``state_dir``, so the
next start (whatever its mode) can be told which ones a SIGKILL left behind, and which processes are
still in a phase's cgroup after its children stopped. Ending them is the process
module's: this one only says what is left.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from ..engine.loop import EventLoop, Timer
from ..engine.offloop import NoThread, Overdue, answer_within
from ..engine.trees import own_pid_namespace
from ..state.files import read_regular_file, write_atomically
from ..text import Log
from ..text.show import fmt_bytes
from .cgroups import (
    PHASE_CGROUP_PREFIX,
    MemoryCgroup,
    MemorySnapshot,
    OomKills,
    discover,
    enable_v2_delegation,
    mem_total,
    mem_used,
    phase_cgroup_name,
    phase_cgroup_owner,
)

OOM_POLL_S = 0.25
# How long the start waits for the cgroup files to be found and read (a hung cgroupfs never answers).
CGROUP_FIND_BOUND_S = 5.0
# The ledger of phase cgroups (state_dir/cgroups) is read up to this: a line a cgroup, a few per phase.
LEDGER_MAX_BYTES = 1 << 20



class Found(NamedTuple):
    """What the cgroup files said at start: the supervisor's cgroup, where phase cgroups go, the mode."""

    shared: MemoryCgroup | None
    parent: MemoryCgroup | None
    mode: str
    why: str
    inherited: list[MemoryCgroup]


class Limit(NamedTuple):
    """A memory limit that can kill in a cgroup: its size, and what holds it, a cgroup up the tree (all that is
    under it counts towards it) or the machine (None: MemTotal). ``above_mount``: v1's least limit of the cgroups
    above the mount (memory.stat), whose holder cannot be seen from here: read at the top one seen."""

    size: int
    holder: MemoryCgroup | None
    above_mount: bool = False

    def named(self, own: MemoryCgroup | None = None) -> str:
        """How an OOM line names it (``own``: the cgroup the kill was counted in)."""
        if self.holder is None:
            return f"the machine's {fmt_bytes(self.size)}"
        if self.above_mount:
            return f"{fmt_bytes(self.size)}, set above the cgroup mount"
        if own is not None and self.holder.path == own.path:
            return f"its own {fmt_bytes(self.size)}"
        return f"{fmt_bytes(self.size)} of {self.holder.path}"


@dataclass(frozen=True)
class Placement:
    """Where a child runs, and the OOM counter reading when it started."""

    cgroup: MemoryCgroup | None
    scope: str  # "phase", "shared" or "none"
    oom_baseline: OomKills | None


@dataclass(frozen=True)
class MemoryReport:
    """What the cgroup says about a child's life: OOM kills during it, the peak."""

    oom_kills: int | None  # None: unknown (no readable cgroup)
    peak: int | None
    scope: str
    snapshot: MemorySnapshot | None


@dataclass(frozen=True)
class MemoryWarning:
    """The last ``memory_high`` said for a phase (memwatch.py): when (wall time), how full, of which limit."""

    at: float
    fraction: float
    limit: int
    line: str

    def note(self) -> str:
        """What an OOM verdict that follows adds: ``warned at 12:03:41: memory_high 92% of 384MiB``."""
        return (f"warned at {time.strftime('%H:%M:%S', time.localtime(self.at))}: memory_high "
                f"{self.fraction * 100:.0f}% of {fmt_bytes(self.limit)}")


class MemoryEvidence:
    def __init__(self, loop: EventLoop, log: Log, mode: str = "auto", root: Path | str = "/sys/fs/cgroup",
                 proc_cgroup: Path | str = "/proc/self/cgroup", ledger: Path | str | None = None,
                 bound_s: float = CGROUP_FIND_BOUND_S, mountinfo: Path | str = "/proc/self/mountinfo") -> None:
        self._loop = loop
        self._log = log
        # The phase cgroups this state_dir's supervisors made (see leftover_cgroups); None: not kept.
        self._ledger = Path(ledger) if ledger is not None else None
        self._inherited: list[MemoryCgroup] = []
        self.shared: MemoryCgroup | None = None
        self.mode = "unavailable"
        self._phase_cgroups: dict[str, MemoryCgroup] = {}
        self._noted: set[Path] = set()  # the phase cgroups written to the ledger (once each, made again or not)
        # Phase cgroups whose peak is an earlier attempt's (v2, where it could not be made anew): left out.
        self._earlier_peak: set[Path] = set()
        self._watches: dict[str, tuple[MemoryCgroup, int | None]] = {}  # path → (cgroup, fd or None: polled)
        self._last_kills: dict[str, OomKills] = {}  # path → its counters at the last look
        # path → the times each limit over it was reached (Limit's holder → count), at its watch or its last kill
        self._last_hits: dict[str, dict[Path, int | None]] = {}
        # The OOM kills seen in this run, in every cgroup watched (the phases', made anew each attempt, and the
        # supervisor's): what status and /metrics count; no one cgroup's counter holds them all.
        self.oom_kills_seen = 0
        self.kill_seen_at: dict[Path, float] = {}  # cgroup → when (wall time) its counter was last seen rising
        self._said_frozen: set[str] = set()  # paths said frozen under OOM (v1: under_oom), until it ends
        self._poll_timer: Timer | None = None
        self._parent: MemoryCgroup | None = None  # where phase cgroups are made (per-phase mode)
        self._said_no_limit: set[str] = set()
        self.warned: dict[str, MemoryWarning] = {}  # phase → its last memory_high (memwatch.py writes it)
        self._bad_said: set[str] = set()  # the cgroup files whose bad value was said (once each)
        self._limited_by: MemoryCgroup | None = None  # with the evidence off: where the limits are read (only)
        self.container: MemoryCgroup | None = None  # (container_snapshot)
        if mode == "off":
            self.why = "cgroup evidence turned off (supervisor.cgroups = \"off\"): OOM kills are unknown"
            # The container's limit is still what the preflight and the children's budget must hold to (else
            # MemTotal: a 300 MiB container passed a min_memory of 1 GiB): read, never watched.
            with contextlib.suppress(Overdue, NoThread):
                self._limited_by, self._inherited = answer_within(
                    "cgroups", lambda: self._find_off(root, proc_cgroup, mountinfo), bound_s)
            return
        try:  # the files are read off the loop, with a bound: a file that blocks must not hang the start
            found = answer_within("cgroups", lambda: self._find(mode, root, proc_cgroup, mountinfo), bound_s)
        except (Overdue, NoThread) as exc:
            self.why = f"the cgroup files under {root}: {exc}: OOM kills are unknown, never guessed"
            return
        self.shared, self._parent, self.mode, self.why, self._inherited = found
        # Where the container's memory is counted whole: the supervisor's cgroup, the phase cgroups below it (v1);
        # on v2 once delegated the leaf's parent (the leaf holds the supervisor alone, the phases are its siblings).
        self.container = self._parent or self.shared
        if self.shared is not None:
            self._watch(self.shared)

    def describe(self) -> str:
        if self.mode == "unavailable":
            return f"memory evidence: {self.why}"
        limit = self.available_memory()
        return (f"memory evidence: {self.mode} mode, {self.why}; "
                f"memory available {fmt_bytes(limit)}")

    def _find_off(self, root: Path | str, proc_cgroup: Path | str,
                  mountinfo: Path | str) -> tuple[MemoryCgroup | None, list[MemoryCgroup]]:
        """With the evidence off: the supervisor's cgroup, to read its limits only, and the phase cgroups a dead
        predecessor of another mode made beside it, still its to empty (no tag finds what escaped into them)."""
        found = discover(root, proc_cgroup, None, mountinfo).cgroup
        if found is None:
            return None, []
        ours = MemoryCgroup(found.path, found.version)
        return ours, self._take_over_ledger(ours)

    def _find(self, mode: str, root: Path | str, proc_cgroup: Path | str, mountinfo: Path | str) -> Found:
        """The supervisor's cgroup, and whether each phase can have its own (on a thread: the files may hang)."""
        found = discover(root, proc_cgroup, self._say_bad, mountinfo)
        if found.cgroup is None:
            return Found(None, None, "unavailable", f"{found.why}: OOM kills are unknown, never guessed", [])
        # v1 (and v2 under memory_localevents) counts the supervisor's cgroup with the cgroups below it (cgroups.py
        # says why), but never the phase cgroups there (ours, or another supervisor's beside us): each has its own
        # verdicts.
        shared = MemoryCgroup(found.cgroup.path, found.cgroup.version, self._say_bad, phases_apart=True,
                              local_events=found.cgroup.local_events)
        # A dead predecessor's phase cgroups are emptied whatever this start's mode (no tag finds what escaped
        # into them): they are right below the cgroup we start in, where a per-phase start makes its own.
        home = shared
        if mode != "auto":
            return Found(shared, None, "shared", found.why, self._take_over_ledger(home))
        try:
            if shared.version == "v2":
                shared = enable_v2_delegation(shared)
                # Phase cgroups must be siblings of our leaf, under the delegated parent.
                parent = MemoryCgroup(shared.path.parent, "v2", self._say_bad, local_events=shared.local_events)
            else:
                parent = shared
            probe = parent.create_child(phase_cgroup_name("probe"))
            probe.remove()
        except OSError as exc:
            why = f"{found.why}; per-phase cgroups not possible here ({exc.strerror or exc}), sharing one counter"
            return Found(shared, None, "shared", why, self._take_over_ledger(home))
        inherited = self._take_over_ledger(parent)
        self._remove_empty_stale(parent, inherited)
        return Found(shared, parent, "per-phase", found.why, inherited)

    def _say_bad(self, path: Path, why: str) -> None:
        """A cgroup file holds a bad value: its reading is unavailable, said once a file (it is read each tick)."""
        if str(path) not in self._bad_said:
            self._bad_said.add(str(path))
            self._log(f"memory evidence: {path} {why}: that reading is unavailable from here on, never guessed")

    # ------------------------------------------------------------ placement

    def place(self, phase: str, memory_max: int | None) -> Placement:
        """The cgroup a new child of ``phase`` goes into, with its counter baseline."""
        if self.mode == "per-phase" and self._parent is not None:
            cgroup = self._phase_cgroups.get(phase)
            if cgroup is None:
                name = phase_cgroup_name(phase)
                self._note_in_ledger(self._parent.path / name)  # before it exists: a SIGKILL may follow
                try:
                    cgroup = self._parent.create_child(name, memory_max)
                except OSError as exc:
                    self._log(f"cannot create a cgroup for phase {phase} ({exc.strerror or exc}); "
                              "it shares the supervisor's counter")
                    cgroup = None
                if cgroup is not None:
                    self._phase_cgroups[phase] = cgroup
                    self._watch(cgroup)
            if cgroup is not None:
                return Placement(cgroup, "phase", cgroup.oom_counts())
        if memory_max is not None and phase not in self._said_no_limit:
            self._said_no_limit.add(phase)
            self._log(f"phase {phase}: memory_max={fmt_bytes(memory_max)} cannot be applied: no per-phase cgroup "
                      f"({self.mode} mode); the preflight still holds the phase to it")
        if self.shared is not None:
            return Placement(self.shared, "shared", self.shared.oom_counts())
        return Placement(None, "none", None)

    def cgroup_of(self, phase: str) -> tuple[MemoryCgroup | None, str]:
        """The cgroup ``phase``'s children are counted in, and what to call it; (None, "") without one."""
        cgroup = self._phase_cgroups.get(phase)
        if cgroup is not None:
            return cgroup, "its cgroup"
        return (self.shared, "the supervisor's cgroup") if self.shared is not None else (None, "")

    def own_cgroup(self, phase: str) -> MemoryCgroup | None:
        """``phase``'s own cgroup, where it has one (per-phase mode): every process in it is the phase's, one that
        left its children's trees with its environment cleared too (the I/O thread reads it); None where there is
        none (its children share the supervisor's, with everything else)."""
        return self._phase_cgroups.get(phase)

    def new_attempt(self, phase: str) -> None:
        """A new attempt of ``phase`` starts: its peak and its OOM counters must be its own, never an earlier
        attempt's.

        The phase's cgroup is removed, and its next child makes it anew (``place``), rather than its peak
        reset: v1 resets its watermark (``memory.max_usage_in_bytes`` ← 0), but v2's ``memory.peak`` takes a
        reset only from Linux 6.12, and then only as read through the one open file that wrote it, while the
        hosts this runs on are mostly older. A cgroup made anew starts every counter at 0 on every kernel, v1
        and v2 (the peak, the OOM kills, memory.events), with its limit written again. That needs it empty, as
        it is between attempts (the children stopped, the escapees swept); where a process is left (one that
        outlived its SIGKILL), v1's watermark is reset instead, and v2's peak is left out of the attempt's
        readings (it is an earlier attempt's)."""
        cgroup = self._phase_cgroups.get(phase)
        if cgroup is None:
            return  # (none yet: the attempt's first child makes it)
        self._earlier_peak.discard(cgroup.path)
        if cgroup.remove():
            self._unwatch(cgroup)
            del self._phase_cgroups[phase]
        elif not (cgroup.version == "v1" and _reset_v1_watermark(cgroup)):
            self._earlier_peak.add(cgroup.path)

    def report(self, placement: Placement) -> MemoryReport:
        """Read the counter again when the child is reaped: the rise is what happened in its life."""
        if placement.cgroup is None:
            return MemoryReport(None, None, placement.scope, None)
        snap = placement.cgroup.snapshot()
        kills = None
        if snap.oom is not None and placement.oom_baseline is not None:
            kills = kills_since(snap.oom, placement.oom_baseline)
        self._check_counter(placement.cgroup, snap)  # log it now if the watch has not yet
        return MemoryReport(kills, self._attempts_peak(placement.cgroup, snap), placement.scope, snap)

    def _attempts_peak(self, cgroup: MemoryCgroup, snap: MemorySnapshot) -> int | None:
        """The peak ``snap`` read, unless it is an earlier attempt's (new_attempt): then none."""
        return None if cgroup.path in self._earlier_peak else snap.peak

    def leftover_cgroups(self) -> list[tuple[int, MemoryCgroup]]:
        """Phase cgroups an earlier supervisor of this state_dir made and that still exist, each with
        that supervisor's pid (from the name). It is gone: the state_dir's lock is ours. What to do
        with what they hold is the caller's: this module only says what is left.

        Only cgroups from the ledger count, never a look-alike name: beside us may live another
        supervisor (another state_dir, maybe another PID namespace, maybe our own pid) whose
        cgroups are not ours to empty."""
        return [(phase_cgroup_owner(cgroup.path.name)[0], cgroup) for cgroup in self._inherited
                if cgroup.path.is_dir()]

    def _remove_empty_stale(self, parent: MemoryCgroup, inherited_cgroups: list[MemoryCgroup]) -> None:
        """EMPTY phase cgroups named for a pid that is dead here: remove them, or they pile up under the
        parent (a SIGKILLed supervisor of another state_dir never comes back for its own). Only empty
        ones: rmdir refuses a cgroup that holds a process, so another supervisor's work is never touched. Only
        those of our PID namespace: a pid of another one says nothing here."""
        inherited, here = {str(cg.path) for cg in inherited_cgroups}, own_pid_namespace()
        for entry in parent.path.glob(f"{PHASE_CGROUP_PREFIX}*-*"):  # (is_phase_cgroup's names)
            pid, ns = phase_cgroup_owner(entry.name)
            if str(entry) in inherited or pid in (0, os.getpid()) or ns != here:
                continue
            if not os.path.exists(f"/proc/{pid}"):
                MemoryCgroup(entry, parent.version).remove()  # fails (and stays) if not empty

    def _take_over_ledger(self, parent: MemoryCgroup) -> list[MemoryCgroup]:
        """Read the ledger an earlier start left; keep in it only the cgroups that still exist."""
        if self._ledger is None:
            return []
        try:  # (as every state file: a FIFO must not hang us, nor /dev/zero fill memory)
            lines = read_regular_file(self._ledger, LEDGER_MAX_BYTES).decode().splitlines()
        except FileNotFoundError:
            lines = []
        except (OSError, ValueError) as exc:  # (UnicodeDecodeError is a ValueError)
            self._log(f"cannot read {self._ledger} ({exc}): cgroups of an earlier start are not looked for")
            lines = []
        inherited = []
        for line in dict.fromkeys(lines):  # in order, once each
            path = Path(line)
            # Only a phase cgroup right under ours: the file names what may be killed, so nothing else.
            if path.parent == parent.path and path.name.startswith(PHASE_CGROUP_PREFIX) and path.is_dir():
                inherited.append(MemoryCgroup(path, parent.version, self._say_bad))
        try:  # written whole: what was there (a FIFO, a link) is replaced by a regular file
            write_atomically(self._ledger, "".join(f"{cg.path}\n" for cg in inherited).encode())
        except OSError as exc:
            self._log(f"cannot write {self._ledger} ({exc.strerror or exc})")
        return inherited

    def _note_in_ledger(self, path: Path) -> None:
        if self._ledger is None or path in self._noted:  # (a phase cgroup made again, each attempt: noted once)
            return
        self._noted.add(path)
        try:  # (non-blocking: a FIFO put there since is refused, never waited on)
            fd = os.open(self._ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{path}\n")
        except OSError as exc:
            self._log(f"cannot write {self._ledger} ({exc.strerror or exc}): a SIGKILL would leave {path} "
                      "for nobody to empty")

    def leftover_pids(self, phase: str) -> list[int]:
        """Processes still in the phase's cgroup or below it (after its children were stopped: they escaped
        the tree)."""
        cgroup = self._phase_cgroups.get(phase)
        if cgroup is None:
            return []
        return cgroup.pids_below() or []

    def phase_snapshot(self, phase: str) -> MemorySnapshot | None:
        """The readings of the phase's own cgroup (usage, peak, its limit: memory_max), while it has one: the
        attempt's (new_attempt makes it anew for each)."""
        cgroup = self._phase_cgroups.get(phase)
        if cgroup is None:
            return None
        snap = cgroup.snapshot()
        return replace(snap, peak=self._attempts_peak(cgroup, snap))

    def release_phase(self, phase: str) -> None:
        """The phase is over: remove its cgroup (anything left in it goes back to ours)."""
        cgroup = self._phase_cgroups.pop(phase, None)
        if cgroup is None:
            return
        self._earlier_peak.discard(cgroup.path)
        self._unwatch(cgroup)
        if self.shared is not None:
            cgroup.move_all_to(self.shared)
        if not cgroup.remove():  # (a process that outlived SIGKILL, and could not be moved out)
            left = cgroup.pids_below()
            self._log(f"phase {phase}: cannot remove {cgroup.path}" + (f" ({len(left)} process(es) still in it: "
                      f"{', '.join(map(str, left[:10]))})" if left else "") + "; left in place for the next start")

    def close(self) -> None:
        for phase in list(self._phase_cgroups):
            self.release_phase(phase)
        for key in list(self._watches):
            self._unwatch(self._watches[key][0])
        if self._poll_timer is not None:
            self._poll_timer.cancel()

    def container_snapshot(self) -> MemorySnapshot | None:
        """What status and /metrics show of memory: the cgroup that holds all of it seen from here (``container``),
        the least limit over it (those above it, and above the mount, too), the OOM kills seen in this run (no one
        cgroup's counter holds them all); None without a cgroup."""
        if self.container is None:
            return None
        # (Loops, not comprehensions, here and in the walk: status.json is written on the exit path, where a call
        # of this module's between two of cgroups.py's is one more bounce, as bench/wakes.py counts them.)
        least = None
        for limit in self._limits_up_the_tree(self.container):
            least = limit.size if least is None else min(least, limit.size)
        return replace(self.container.snapshot(), limit=least, oom_kills=self.oom_kills_seen)

    # ------------------------------------------------------------ preflight

    def available_memory(self) -> int | None:
        """What the cgroup allows (the tightest limit up the v1 hierarchy), or MemTotal."""
        return self.tightest_limit()[0]

    @staticmethod
    def used_under(where: MemoryCgroup | None, meminfo: Path | str = "/proc/meminfo") -> int | None:
        """What is used under a limit ``tightest_limit`` found, now: its cgroup's working set, or the machine's
        MemTotal less MemAvailable (``where`` None). Every process under it counts towards its kill, the
        supervisor's, the other phases' and the rest of the container's too."""
        return where.working_set() if where is not None else mem_used(meminfo)

    def tightest_limit(self, meminfo: Path | str = "/proc/meminfo") -> tuple[int | None, MemoryCgroup | None]:
        """The tightest limit over the supervisor's cgroup, up the hierarchy (on v1 above the mount too), or
        MemTotal; and the cgroup that sets it, or the top one seen for one above the mount (None: the machine)."""
        least = min(self.limits_over(None, meminfo), key=lambda limit: limit.size, default=None)
        return (least.size, least.holder) if least is not None else (None, None)

    def limits_over(self, cgroup: MemoryCgroup | None = None, meminfo: Path | str = "/proc/meminfo") -> list[Limit]:
        """Every limit that can kill in ``cgroup`` (None: the supervisor's), from its own up the tree (on v1 above the
        mount too), else the machine's MemTotal: a cgroup limit at or above it is never reached before the machine is
        full, and with one below it the machine is not what kills."""
        start = cgroup or self.shared or self._limited_by
        total = mem_total(meminfo)
        limits = [limit for limit in (self._limits_up_the_tree(start) if start is not None else [])
                  if total is None or limit.size < total]
        return limits or ([Limit(total, None)] if total else [])

    @staticmethod
    def _limits_up_the_tree(cgroup: MemoryCgroup) -> list[Limit]:
        limits, top, least = [], cgroup, None
        path = cgroup.path
        for _ in range(32):
            top = MemoryCgroup(path, cgroup.version, cgroup.on_bad)
            if (limit := top.limit()) is not None:
                limits.append(Limit(limit, top))
                least = limit if least is None else min(least, limit)
            if path.parent == path or not (path.parent / "cgroup.procs").exists():
                break
            path = path.parent
        # The top cgroup seen is where the mount begins, not where the limits end: a container sees its own
        # cgroup as the root, and the limit may be on one above it (Docker's --cgroup-parent on a limited slice,
        # a runtime nested in another). v1 works out the least of them all; what is under that limit is read at
        # the top cgroup seen, the most of it there is to read. v2 has no such figure (docs/configuration.md).
        hidden = top.limit_with_ancestors()
        if hidden is not None and (least is None or hidden < least):
            limits.append(Limit(hidden, top, above_mount=True))
        return limits

    def _hits_over(self, cgroup: MemoryCgroup) -> dict[Path, int | None]:
        """How many times each cgroup limit over ``cgroup`` was reached so far (MemoryCgroup.limit_hits)."""
        return {limit.holder.path: limit.holder.limit_hits() for limit in self.limits_over(cgroup)
                if limit.holder is not None and not limit.above_mount}

    def _limit_reached(self, cgroup: MemoryCgroup, snap: MemorySnapshot, before: OomKills) -> str:
        """Which limit an OOM kill counted in ``cgroup`` came at, for its line: the nearest the victim whose count
        of times reached rose since the last look (from the victim's own cgroup, where one below was counted apart),
        never the smallest by size (a phase at 80% of its own 300 MiB is killed by a 512 MiB container that others
        fill); else the one limit left that has no count to read (set above the cgroup mount, or the machine's)."""
        key = str(cgroup.path)
        rose = [path for path, count in (snap.oom.by_cgroup if snap.oom else {}).items()
                if count > before.by_cgroup.get(path, 0)]
        victims = MemoryCgroup(rose[0], cgroup.version, cgroup.on_bad) if rose else cgroup
        limits = self.limits_over(victims)
        earlier, now = self._last_hits.get(key, {}), self._hits_over(victims)
        self._last_hits[key] = now if victims is cgroup else self._hits_over(cgroup)  # (the next kill's baseline)
        for limit in limits:
            if limit.holder is None or limit.above_mount:
                continue
            count, was = now.get(limit.holder.path), earlier.get(limit.holder.path, 0)  # (one made since: from 0)
            if count is not None and was is not None and count > was:
                return f"; the limit reached: {limit.named(cgroup)}"
        unread = [limit for limit in limits if limit.holder is None or limit.above_mount
                  or now.get(limit.holder.path) is None or earlier.get(limit.holder.path, 0) is None]
        if len(unread) == 1:
            return f"; the limit reached: {unread[0].named(cgroup)}"
        if unread:
            return f"; the limit reached: one of {', '.join(limit.named(cgroup) for limit in unread)}"
        return "; no limit seen over it was reached (one above the cgroup mount, unseen from here?)"

    # ------------------------------------------------------------ watching

    def _watch(self, cgroup: MemoryCgroup) -> None:
        key = str(cgroup.path)
        if key in self._watches:
            return
        counts = cgroup.oom_counts()
        if counts is not None:
            self._last_kills[key] = counts
        self._last_hits[key] = self._hits_over(cgroup)
        opened = cgroup.open_watch()
        if opened is None:
            self._watches[key] = (cgroup, None)
            self._ensure_poll()
            return
        fd, _how = opened
        self._watches[key] = (cgroup, fd)
        self._loop.add_reader(fd, lambda: self._on_watch_event(cgroup, fd))

    def _unwatch(self, cgroup: MemoryCgroup) -> None:
        entry = self._watches.pop(str(cgroup.path), None)
        self._last_hits.pop(str(cgroup.path), None)
        if entry is not None and entry[1] is not None:
            self._loop.remove_reader(entry[1])
            os.close(entry[1])

    def _on_watch_event(self, cgroup: MemoryCgroup, fd: int) -> None:
        MemoryCgroup.consume_watch(fd)
        self._check_counter(cgroup)

    def _ensure_poll(self) -> None:
        if self._poll_timer is None:
            self._poll_timer = self._loop.call_later(OOM_POLL_S, self._poll)

    def _poll(self) -> None:
        # Re-armed first, as the tick is: a look that raises (a bug of ours; the loop says it) must not end
        # the polling of every cgroup without an OOM eventfd for the rest of the run.
        self._poll_timer = None
        polled = [cg for cg, fd in self._watches.values() if fd is None]
        if polled:
            self._ensure_poll()
        for cgroup in polled:
            self._check_counter(cgroup)

    def _check_counter(self, cgroup: MemoryCgroup, snap: MemorySnapshot | None = None) -> None:
        """Say an OOM kill the cgroup's counter shows since the last look (``snap``: a reading just taken)."""
        key = str(cgroup.path)
        snap = snap or cgroup.snapshot()
        if snap.oom is None:
            return
        before = self._last_kills.get(key, snap.oom)
        if rose := kills_since(snap.oom, before):
            self.oom_kills_seen += rose
            self.kill_seen_at[cgroup.path] = time.time()
            # Its own limit is not always the one that killed: one above it (the container's, or the machine's)
            # may be reached first, or be the only one (a phase without memory_max).
            self._log(f"OOM KILL in cgroup {cgroup.path}: oom_kill {before.total} → {snap.oom.total}; "
                      f"{snap.describe()}{self._limit_reached(cgroup, snap, before)}")
        self._last_kills[key] = snap.oom
        if snap.under_oom and key not in self._said_frozen:  # (v1: an OOM eventfd fires for it too)
            self._said_frozen.add(key)
            self._log(f"OOM in cgroup {cgroup.path} with the OOM killer disabled (oom_kill_disable 1, here or above; "
                      f"under_oom 1): its processes are frozen until memory is freed, none is killed; "
                      f"{snap.describe()}")
        elif snap.under_oom is False:
            self._said_frozen.discard(key)


def _reset_v1_watermark(cgroup: MemoryCgroup) -> bool:
    """v1's peak reset to the usage now (0 written: the kernel resets it); whether the kernel took it."""
    try:
        (cgroup.path / "memory.max_usage_in_bytes").write_text("0")
    except OSError:
        return False
    return True


def kills_since(now: OomKills, before: OomKills) -> int:
    """The OOM kills counted since ``before``, each cgroup's rise apart: a cgroup made since counts from 0,
    and one removed since (its counter gone with it) never hides a rise in another, as a difference of sums
    would. (Judged here, where each rise becomes a verdict's or a log line's, from what cgroups.py read.)"""
    return sum(max(0, count - before.by_cgroup.get(path, 0)) for path, count in now.by_cgroup.items())
