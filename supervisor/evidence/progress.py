"""The progress probe: one thread ("progress") that walks the watched paths for the loop.

A stall watch needs to know whether its ``progress_path`` grows. Walking the tree is slow where
it is big (150 000 files: about a second a walk) and never ends where its filesystem hangs (a
FUSE or NFS parameter cache: ``stat`` sits in state D, deaf to signals), so it is never done on
the loop. One thread, for every phase, measures each watched path (``watch``) every
PROGRESS_WALK_S (or as often as the watch asked, never more than half the time busy) and
publishes the bytes under it, its file count, when the walk ended and how long it took
(``latest``); the stall check reads the latest measure and never waits. A walk that takes
longer than SLOW_WALK_S is said once a path (``check``, from the loop's tick): while it is still
going, and again with its file count and seconds once it ends. A walk that fails (EIO, ESTALE, EMFILE of a
flaky mount) is said at once, once a path, with why: the walker is blind only after WALK_BLIND_S, and a
stall watch meanwhile has no measure of the path's writes (``unwalked`` says why). Should the thread still
fail (a bug of ours), it says so and starts again (watchstate.run_restarting), its walks of before the
failure forgotten.

A walk also publishes the newest write under the path (the latest mtime of its files): a preallocated
file does not grow, but each write into it moves its mtime, and the stall watch counts that as a sign of
life where a worker's own I/O counters cannot be read (another user's, without CAP_SYS_PTRACE).

A walk also says what a download has really got (progresswatch.py): a downloader that preallocates
(aria2c) gives a file its full size and blocks at once, so neither says anything while it runs; what
does is the bytes in COMPLETE files, a file being complete when no control file (``<file>.aria2``,
CONTROL_SUFFIXES) lies beside it, whatever its size, and nothing has written it for COMPLETE_QUIET_S;
a file that grows as it arrives (curio's Go fallback) counts by its allocated blocks once its writes
pause. The quiet is for aria2c's own order: it allocates a new file whole and only then writes the
control file beside it (measured: 0.6 ms later on ext4, longer on a loaded machine), and a walk between
the two would count the whole file done before a byte came (and a download's figure never goes down). Nor is
a file that an allocating downloader holds open (a watch's ``held``, from the I/O thread: iowatch.py), however
quiet: where fallocate is refused aria2c writes the file whole with zeros and flushes them (seconds of no write on
a slow disk) before its control file comes, and a walk then counted the zeros complete, and the control file's
coming read as the file removed.
The container's received bytes (``/proc/net/dev``, every
interface but loopback) are measured on the same thread (``watch_net``): a procfs read is quick, but
nothing is read on the loop.

Once a download's attempt has ended well, nothing writes its files any more, and the quiet waited for says
nothing: one more walk (``settle``) counts each file without a control file complete however lately it was
written, so that the figure a finished download keeps is its whole, not the last periodic walk's (a file
completed within COMPLETE_QUIET_S of it, or after it, left out).
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..engine.offloop import worker_thread
from .watchstate import THREAD_RESTART_MAX_S, THREAD_RESTART_S, WatchState, run_restarting, said_error

# How often a watched path is measured, unless its watch asks for more often (never more often
# than PROGRESS_WALK_MIN_S); a walk that took longer than that waits as long as it took before the next.
PROGRESS_WALK_S = 0.5
PROGRESS_WALK_MIN_S = 0.05
# A walk that takes longer than this is said (once a path): a big tree, or a hung mount.
SLOW_WALK_S = 2.0
# A walker whose walks have all failed (raised) for this long is said to be blind (watchstate.py); a walk
# that is only slow is said by ``check`` (a big tree's walk may take a minute: no blindness of its own).
WALK_BLIND_S = 300.0
# A download's control file beside a file says the file is not complete yet (aria2c keeps ``<file>.aria2``
# while it downloads and resumes from it, and removes it when the file is done).
CONTROL_SUFFIXES = (".aria2",)
# aria2c saves a control file by writing "<file>.aria2__temp", then renaming it over "<file>.aria2" (strace of
# aria2 1.36.0: at a file's start and every --auto-save-interval): a control file too, while it is there.
CONTROL_FILES = (*CONTROL_SUFFIXES, *(suffix + "__temp" for suffix in CONTROL_SUFFIXES))
# A file written this recently (by its mtime, either way of now) is not complete yet, control file or not:
# aria2c writes a new file's control file only once the file is allocated.
COMPLETE_QUIET_S = 2.0
# A file as the kernel names it: its st_dev and st_ino (a path may be written many ways; this is one file).
FileId = tuple[int, int]
# A file's mtime further ahead of the walk's own time than this was not written now (a cache copied with
# another clock's times): it is left out of the newest write, which it would hide behind it for good.
FUTURE_MTIME_S = 1.0
# The container's received bytes: one line an interface, the loopback's traffic is no download.
NET_DEV = "/proc/net/dev"
LOOPBACK = "lo"


@dataclass(frozen=True)
class TreeMeasure:
    """One walk of a watched path: ``size`` bytes under it (None: absent), ``files`` counted, ``at`` (monotonic)
    when the walk ended, ``took`` how long it took, ``seq`` the walk's number (a new one is new evidence);
    ``done`` the bytes of its complete files (no control file beside: ``tree_done``), ``done_files`` how
    many; ``newest`` the latest mtime of a file under it (wall time; None: no file), what shows a preallocated
    file being written. For ``watch_net``: ``size`` is the bytes received on every interface but loopback."""

    path: str
    size: int | None
    files: int
    at: float
    took: float
    seq: int
    done: int = 0
    done_files: int = 0
    newest: float | None = None


class Walk(NamedTuple):
    """What ``tree_done`` found under a path (TreeMeasure's fields of the same names)."""

    size: int | None
    files: int
    done: int
    done_files: int
    newest: float | None


class Settling:
    """A settled walk asked of the walker (``ProgressProbe.settle``): ``measure`` says whether it is walked yet and
    what it found (None: the walk failed); ``release`` once it is no longer waited for."""

    def __init__(self, probe: ProgressProbe, walk_id: int) -> None:
        self._probe, self._id = probe, walk_id

    def measure(self) -> tuple[bool, TreeMeasure | None]:
        return self._probe._settled_measure(self._id)

    def release(self) -> None:
        self._probe._release_settle(self._id)


class ProgressProbe:
    """The walker thread, started by the first ``watch``."""

    def __init__(self, *, slow_s: float = SLOW_WALK_S) -> None:
        self._slow_s = slow_s
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._watches: dict[int, tuple[str, float]] = {}  # watch id → (path, how often)
        self._held: dict[int, Callable[[], frozenset[FileId]]] = {}  # watch id → the files held open (``watch``)
        self._ids = itertools.count(1)
        self._measures: dict[str, TreeMeasure] = {}
        self._settles: dict[int, str] = {}  # settled walks asked (``settle``), not walked yet: id → path
        self._settled: dict[int, TreeMeasure | None] = {}  # their measures (None: the walk failed), until released
        self._seq = itertools.count(1)
        self._walking: tuple[str, float] | None = None  # the path being walked, since (monotonic)
        self._missed: dict[str, str] = {}  # watched paths whose latest walk failed → why (``unwalked``)
        self._said_missed: set[str] = set()  # paths said to have had a failed walk (loop side only)
        self._ended_slow: list[tuple[str, float, str]] = []  # slow walks ended: path, seconds, what they found
        self._said_going: set[str] = set()  # paths said to be walked for too long (loop side only)
        self._said_ended: set[str] = set()  # paths said to have had a slow walk (loop side only)
        self.state = WatchState("progress walker", WALK_BLIND_S)  # its own health: a walk that raised is a miss
        self.state.idle("no path watched")  # (until one is: no thread, nothing to walk)

    # ------------------------------------------------------------ the loop's side: never a wait

    def watch(self, path: str, every_s: float = PROGRESS_WALK_S,
              held: Callable[[], frozenset[FileId]] | None = None) -> Callable[[], None]:
        """Measure ``path`` at least every ``every_s`` until the returned function is called; ``held`` (called on
        the walker's thread) names the files an allocating downloader holds open, none of them complete."""
        return self._watch(os.fspath(path), every_s, held)

    def watch_net(self, every_s: float = PROGRESS_WALK_S) -> Callable[[], None]:
        """Measure the bytes received (NET_DEV; ``latest(NET_DEV)``) until the returned function is called."""
        return self._watch(NET_DEV, every_s)

    def _watch(self, path: str, every_s: float, held: Callable[[], frozenset[FileId]] | None = None
               ) -> Callable[[], None]:
        watch_id = next(self._ids)
        with self._cond:
            self._watches[watch_id] = (path, every_s)
            if held is not None:
                self._held[watch_id] = held
            self._wake_walker()  # a new path: measured at once (the watch's baseline)

        def release() -> None:
            with self._cond:
                self._watches.pop(watch_id, None)
                self._held.pop(watch_id, None)
                if not self._watched(path):  # its last watch: a later one (the next attempt's) starts from no
                    self._measures.pop(path, None)  # measure, never from this one's last, as if just taken
                    self._missed.pop(path, None)

        return release

    def _watched(self, path: str) -> bool:
        return any(p == path for p, _ in self._watches.values())

    def settle(self, path: str) -> Settling:
        """One walk of ``path`` as soon as the thread can, with no quiet waited for (COMPLETE_QUIET_S): for a path
        nothing writes any more (its download's attempt is over). Its measure is the handle's, once walked."""
        walk_id = next(self._ids)
        with self._cond:
            self._settles[walk_id] = os.fspath(path)
            self._wake_walker()
        return Settling(self, walk_id)

    def _wake_walker(self) -> None:
        """(under the lock) Something new to walk: the thread started by the first, woken for each."""
        if self._thread is None and not self._closed:
            self._thread = worker_thread("progress", self._run_restarting)
        self._cond.notify_all()

    def settling(self) -> bool:
        """A settled walk is asked and not released yet: its watch has not taken its last figures."""
        with self._cond:
            return bool(self._settles) or bool(self._settled)

    def _settled_measure(self, walk_id: int) -> tuple[bool, TreeMeasure | None]:
        with self._cond:
            return walk_id in self._settled, self._settled.get(walk_id)

    def _release_settle(self, walk_id: int) -> None:
        with self._cond:
            self._settles.pop(walk_id, None)
            self._settled.pop(walk_id, None)

    def latest(self, path: str) -> TreeMeasure | None:
        with self._cond:
            return self._measures.get(os.fspath(path))

    def unwalked(self, path: str, now: float | None = None) -> str:
        """Why ``path`` has no newer walk, as far as the walker knows: its latest walk failed (why), or a walk of
        it is still going (for how long); '' if neither (its walks are only slow, or not begun)."""
        now = time.monotonic() if now is None else now
        path = os.fspath(path)
        with self._cond:
            missed, walking = self._missed.get(path), self._walking
        if missed is not None:
            return f"its walks fail: {missed}"
        if walking is not None and walking[0] == path:
            return f"a walk of it going for {now - walking[1]:.1f}s"
        return ""

    def check(self, now: float | None = None) -> list[str]:
        """What the loop says about the walks now (the tick calls it), each at most once a path: a walk
        still going after SLOW_WALK_S, a slow walk that ended (with its file count and seconds), and a walk
        that failed (with why: a slow one that ended so says it already)."""
        now = time.monotonic() if now is None else now
        with self._cond:
            walking, ended, self._ended_slow = self._walking, self._ended_slow, []
            missed = dict(self._missed)
        lines = []
        for path, took, found in ended:
            if path not in self._said_ended:
                self._said_ended.add(path)
                if path in missed:  # (its failure is in this line: "cut short: ...")
                    self._said_missed.add(path)
                lines.append(f"progress: walking {path} took {took:.1f}s ({found}); its growth is seen that much "
                             "later")
        for path, why in missed.items():  # at once, not after WALK_BLIND_S: a stall watch sees no write there meanwhile
            if path not in self._said_missed:
                self._said_missed.add(path)
                lines.append(f"progress: walking {path} failed ({why}): no write there is seen until a walk ends "
                             "whole")
        if walking is not None and now - walking[1] >= self._slow_s and walking[0] not in self._said_going:
            self._said_going.add(walking[0])
            lines.append(f"progress: walking {walking[0]} has not finished after {now - walking[1]:.1f}s "
                         "(a big tree, or a hung mount?): no growth is seen there meanwhile")
        return lines

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------ the thread

    def _run_restarting(self) -> None:
        """The thread, contained (watchstate.run_restarting): a bug of ours outside a walk's own try (in making
        or publishing its measure) is said and counted, and the thread starts again after THREAD_RESTART_S (this
        module's name, read now), doubling; without it the walker died for good, and ``latest`` went on showing
        the walks of before (an earlier attempt's) as the latest."""
        run_restarting(self._run, self.state, "the progress walker", self._cond, lambda: self._closed,
                      self._forget_walks, restart_s=THREAD_RESTART_S, restart_max_s=THREAD_RESTART_MAX_S)

    def _forget_walks(self, exc: Exception) -> None:
        """(under the lock) After a failure: no walk of before it is the latest (each path is walked afresh
        when the thread starts again), and the walk it died in is not still going."""
        self._measures.clear()
        self._missed.clear()
        self._walking = None

    def _run(self) -> None:
        due: dict[str, float] = {}  # path → when it is to be measured next
        while True:
            picked = self._next_path(due)
            if picked is None:
                return
            path, settle_id = picked
            # A settled walk (``settle``) waits for no quiet, nor for a file held: nothing writes the tree any more.
            measure, took = self._walk(path, COMPLETE_QUIET_S if settle_id is None else 0.0, settle_id is None)
            with self._cond:
                if settle_id is not None:  # kept for its handle (None: it failed), unless released meanwhile
                    if self._settles.pop(settle_id, None) is not None:
                        self._settled[settle_id] = measure
                    continue
                if measure is not None and self._watched(path):  # (released while it was walked: dropped)
                    self._measures[path] = measure
                every = min((e for p, e in self._watches.values() if p == path), default=PROGRESS_WALK_S)
            # At most half the time busy: a tree that takes a second to walk is walked every two.
            ended = time.monotonic()
            due[path] = ended + max(PROGRESS_WALK_MIN_S, every, took)

    def _walk(self, path: str, quiet_s: float, holding: bool = True) -> tuple[TreeMeasure | None, float]:
        """One walk of ``path``, watched while it goes (``check`` says one going past SLOW_WALK_S: a big tree,
        a hung mount) and said if it ended slow: its measure (None: it failed, a miss said by the walker's
        health), and the seconds it took. ``holding``: the files its watches say are held are not complete."""
        started = time.monotonic()
        with self._cond:
            self._walking = (path, started)
            asked = [held for wid, held in self._held.items() if holding and self._watches.get(wid, ("",))[0] == path]
        self.state.wake()
        walked: Walk | None = None
        try:
            held = frozenset().union(*(ask() for ask in asked))  # (asked outside the lock: the I/O thread's own)
            walked = Walk(net_received(), 0, 0, 0, None) if path == NET_DEV else tree_done(path, quiet_s=quiet_s,
                                                                                           held=held)
        except Exception as exc:  # a bug, or a walk cut short (EIO, EMFILE): the path reads as unchanged, no
            missed = said_error(exc)  # measure (a short walk's size read as a shrink, then growth)
            self.state.miss(missed)
        else:
            self.state.read()
        ended = time.monotonic()
        measure = None if walked is None else TreeMeasure(path, walked.size, walked.files, ended, ended - started,
                                                          next(self._seq), walked.done, walked.done_files,
                                                          walked.newest)
        with self._cond:
            self._walking = None
            if measure is None and self._watched(path):  # (``unwalked``; said once by ``check``)
                self._missed[path] = missed
            elif measure is not None:
                self._missed.pop(path, None)
            if ended - started >= self._slow_s:
                found = f"{measure.files} files" if measure is not None else f"cut short: {missed}"
                self._ended_slow.append((path, ended - started, found))
        return measure, ended - started

    def _next_path(self, due: dict[str, float]) -> tuple[str, int | None] | None:
        """Sleep until a settled walk is asked (first: it is waited for) or a watched path is due (a new one at
        once): the path, and the settled walk's id (None: a periodic walk); None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._settles:
                    settle_id = min(self._settles)
                    return self._settles[settle_id], settle_id
                watched = {p for p, _ in self._watches.values()}
                for gone in set(due) - watched:
                    del due[gone]
                now = time.monotonic()
                ready = [p for p in watched if due.get(p, now) <= now]
                if ready:
                    return min(ready, key=lambda p: due.get(p, now)), None
                if not watched:
                    self.state.idle("no path watched")
                self._cond.wait(min(due.values()) - now if due else None)


def measure_tree(path: str | Path) -> tuple[int | None, int]:
    """Bytes under ``path`` (a file or a directory tree) and how many files; (None, 0) if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None, 0
    if not os.path.isdir(path):
        return st.st_size, 1
    total = files = 0
    stack = [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                            files += 1
                    except OSError:
                        continue
        except OSError:
            continue
    return total, files


def tree_done(path: str | Path, now: float | None = None, quiet_s: float = COMPLETE_QUIET_S,
              held: frozenset[FileId] = frozenset()) -> Walk:
    """``measure_tree``'s bytes and files under ``path``, the bytes and count of its complete files, and its
    newest write: a file with a control file beside it (CONTROL_SUFFIXES) is not complete whatever its size,
    nor is the control file, nor a file written within ``quiet_s`` of ``now`` (wall time; default: the
    time now; 0 where nothing writes any more), nor one in ``held`` (an allocating downloader holds it open); the
    others count by what is allocated to them (at most their size: a growing download's blocks), empty ones
    (locks) not at all. The newest write is the latest mtime of a file, one more than FUTURE_MTIME_S ahead of
    ``now`` left out. Blocks: off the loop only."""
    given = now
    now = time.time() if given is None else given
    try:
        st = os.stat(path)
    except OSError as exc:
        _partial(exc)
        return Walk(None, 0, 0, 0, None)
    if not os.path.isdir(path):
        # One file, judged as in a directory: with its control file beside it, it is not complete (aria2c
        # allocates the whole file at its start).
        done = 0 if file_incomplete(path) or _written_lately(st, now, quiet_s) or (st.st_dev, st.st_ino) in held \
            else min(st.st_size, st.st_blocks * 512)
        return Walk(st.st_size, 1, done, int(done > 0), _newer(None, st, now))
    total = files = done = done_files = 0
    newest: float | None = None
    stack = [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                listed = list(entries)
        except OSError as exc:
            _partial(exc)
            continue
        if given is None:  # the time of each directory's look: a walk of a big tree takes seconds, and a file
            now = time.time()  # written meanwhile must not read as one from the future, nor as quiet
        names = {entry.name for entry in listed}
        for entry in listed:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                _partial(exc)
                continue
            total += st.st_size
            files += 1
            newest = _newer(newest, st, now)
            if is_incomplete(entry.name, names) or _written_lately(st, now, quiet_s) or (st.st_dev, st.st_ino) in held:
                continue
            allocated = min(st.st_size, st.st_blocks * 512)
            if allocated > 0:
                done += allocated
                done_files += 1
    return Walk(total, files, done, done_files, newest)


# What a walk passes over and is whole all the same: a file gone since it was listed (aria2c removes its control
# file at a file's end), a path that is no directory, one not ours to read (the same every walk: no false growth).
_WALK_PASSES = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM})


def _partial(exc: OSError) -> None:
    """Anything else (EIO of a flaky mount, EMFILE, ESTALE) cut the walk short: raised, the walk is a miss."""
    if exc.errno not in _WALK_PASSES:
        raise exc


def _newer(newest: float | None, st: os.stat_result, now: float) -> float | None:
    """The newest write so far, ``st``'s mtime taken in unless it lies ahead of ``now`` (no write of now)."""
    if st.st_mtime > now + FUTURE_MTIME_S:
        return newest
    return st.st_mtime if newest is None else max(newest, st.st_mtime)


def _written_lately(st: os.stat_result, now: float, quiet_s: float) -> bool:
    """Written within ``quiet_s`` of ``now``: a file aria2c may not have put its control file beside yet.
    An mtime further in the future (a cache copied with another clock's times) says nothing of now."""
    return abs(now - st.st_mtime) < quiet_s


def is_incomplete(name: str, names_beside: set[str] | frozenset[str]) -> bool:
    """A control file, or a file with its control file beside it (``names_beside``: its directory's names)."""
    return name.endswith(CONTROL_FILES) or any(name + suffix in names_beside for suffix in CONTROL_SUFFIXES)


def file_incomplete(path: str | Path) -> bool:
    """``is_incomplete`` for one file named on its own (progress_path naming a file): its control file is looked
    for beside it, its directory not listed. Blocks: off the loop only."""
    path = os.fspath(path)
    return is_incomplete(os.path.basename(path), {os.path.basename(path) + suffix for suffix in CONTROL_SUFFIXES
                                                  if os.path.exists(path + suffix)})


def net_received(text: str | None = None) -> int | None:
    """Bytes received on every interface but loopback, from NET_DEV's text (read now if None); None: unreadable."""
    if text is None:
        try:
            with open(NET_DEV, errors="replace") as fh:  # a name of odd bytes must not cost the count
                text = fh.read()
        except OSError:
            return None
    total, seen = 0, False
    for line in text.splitlines()[2:]:  # two header lines
        name, sep, counters = line.partition(":")
        fields = counters.split()
        if not sep or not fields or not fields[0].isdigit():
            continue
        seen = True
        if name.strip() != LOOPBACK:
            total += int(fields[0])
    return total if seen else None


def tree_size(path: str | Path) -> int | None:
    """Bytes under ``path`` (a file or a directory tree); None if it does not exist. Blocks: off the loop only."""
    return measure_tree(path)[0]
