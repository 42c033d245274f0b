"""One attempt's progress, watched on the loop: its figures for status, /metrics and the manager's log,
and the end of a download that can no longer make its deadline (reason ``too_slow``).

For a phase with ``progress_total``. Every PROGRESS_TICK_S it reads, without waiting, what was measured
elsewhere: the bytes the attempt's process trees (and its phase's own cgroup's processes) have written since it
began (the I/O thread: iowatch.py), the progress walker's latest walk of ``progress_path`` (the bytes of its
complete files: progress.py) and of the container's received bytes, and what the command's output parser read (a
result that ``ReadsProgress``: aria2c's readout, from the prover's parser). What is done (``done_bytes``) is the
largest of what each says:

- the cache's complete files when the attempt began + what the trees have written since: live on any
  link, loopback included, whatever the program prints (aria2c's readout is block-buffered into a pipe and
  arrives in bursts, a minute apart and when a file is done; its preallocated file is full size at once). A file resumed
  with ``--continue`` counts only what this attempt writes of it until it is complete. What an allocating
  downloader wrote to allocate its file is not counted (iowatch.py's ``allocated``: aria2c's zeros where the
  filesystem refuses fallocate, the whole file at disk speed before a byte is got), nor in the rate;
- the cache's complete files now (a file is complete once no ``.aria2`` lies beside it and nothing wrote
  it for a moment: a resumed file counts whole from then on; a growing file counts by its allocated
  blocks whenever its writes pause; progress.py's COMPLETE_QUIET_S);
- with the command's own reading: those files + the file under way as the program says (a burst of the
  readout may correct the figure upwards);
- without one: what was there at the start + the bytes received since (every interface but loopback).

Each is a whole estimate on its own, never a sum of two, so nothing counts twice; and the figure never
goes down within an attempt but by the bytes of a file removed (``_thrown_away``: a bad checksum, the file
fetched again), which no longer count: only those, the other files in flight keep theirs (curio fetches every
file at once). The rate is of what the link moved in this attempt: the trees' bytes written or the bytes
received since it began, the larger, while either is read afresh; a figure that grows by bytes found rather
than moved is no rate (a file resumed with ``--continue``: aria2c's first readout of it, a minute late, counts
the part got before, and read as a rate it hid a link too slow to make the deadline). Without a fresh
measure of movement, the figure's own growth is the rate. The rate and the observation window count the link's
time: not the seconds in which an allocating downloader allocates its file and nothing is got (``_link_time``),
and from when the download began to move (``_began``): the silence before its first bytes (a gateway slow to
answer, aria2c retrying its connection, a retry attempt) is no rate, nor are the bytes its processes write
meanwhile (a line of output, the spawn's own setup writes), and a window that moved less than MOVING_MIN_B_S a
second is none either (transfer.py's ``judged_rate``). Silence is the stall watch's: a download that never
moves is ended by it, else by the deadline once it passes. Nor is the time the supervisor was frozen the link's
(``_waking``: tick.py's FreezeWatch); after a thaw nothing is judged until the readings are from after it.
The figures and the deadline rule are transfer.py's.

The deadline counts from the manager's clock: its row's ``registered_at`` once a row said it (a row
registered anew, its old one forgotten, is later than our first registration, and the manager's 90 minutes
run from it), else the instance's first registration, else the first start (firstseen.py's
FirstSeen.clock), ``progress_deadline_s`` on: a restart does not reset it, and one already past (a row
registered long ago) ends the download at once, before the observation window. A progress line is logged
every PROGRESS_LOG_S (it reaches the manager's ``setup`` log as every supervisor
line does); the status shows the figures at every look.

An attempt that ends well (``finish``) gets its last figures from one settled walk of ``progress_path`` (progress.py's
``settle``): with no writer left, a file without a control file is complete at once. Without it, a finished
download kept the figures of its last tick, a second or more old, which had not yet counted the files completed
within COMPLETE_QUIET_S of the end: the status showed a done phase at 91%, with a rate and an ETA. An attempt
that ended otherwise keeps what its last tick found, with no ETA (nor one stopped by a shutdown, its outcome not
decided yet): a failed phase, one waiting out its backoff, or one stopped said in status and /metrics how long a
download that had stopped would take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from ..config import PhaseSpec
from ..engine.loop import ErrorHandler, EventLoop
from ..engine.tick import FreezeWatch
from ..state.firstseen import FIRST_REGISTERED, MANAGER_REGISTERED, SOURCES, FirstSeen
from ..text import Log
from ..text.show import fmt_bytes, span
from .cgroups import MemoryCgroup
from .iowatch import IoProbe, IoWatch, Root, TreeIo
from .progress import NET_DEV, FileId, ProgressProbe, Settling, TreeMeasure
from .transfer import (
    MOVING_MIN_B_S,
    RATE_WINDOW_S,
    Progress,
    ProgressReading,
    RateWindow,
    figures,
    judged_rate,
    progress_text,
    too_slow,
)

# How often the figures are made afresh (and the deadline looked at).
PROGRESS_TICK_S = 1.0
# A cache that shrinks by less than this with no less of it complete lost a control file: aria2c deletes
# <file>.aria2 (a few KiB) as it completes, and the walks count the file complete only once it has been quiet
# (progress.py's COMPLETE_QUIET_S). No file was removed.
CONTROL_FILE_MAX = 1 << 20
# Walks after the command said a file was thrown away, before a walk that never saw it go means no walk counted it
# complete (it was checked, deleted and preallocated anew between two walks): from then it is not held back.
UNSEEN_WALKS = 2
# The measures of movement (the trees' bytes written, the bytes received) are fresh while a new reading came
# within this long; a stale one (its thread blind) moves nothing, and read as a rate it would end a download.
MOVED_FRESH_S = 5.0
# The rate is read from the movement once its samples span at least this much of the window: a rate over a few
# seconds is noise (aria2c writes its disk cache in bursts of up to 16 MiB).
MOVED_SPAN_MIN = 0.5
# How often an attempt that ended well looks whether its settled walk is done, and for how long at most (a big
# tree's walk takes seconds, a hung mount's never ends: the figures then stay those of the last tick).
SETTLED_LOOK_S = 0.1
SETTLED_WAIT_S = 60.0
# How often a progress line goes to the log (and so to the manager's setup tab): every few minutes,
# not every second.
PROGRESS_LOG_S = 180.0

# The anchors that are the manager's clock (its row's registered_at, or our first registration).
MANAGER_CLOCKS = (SOURCES[MANAGER_REGISTERED], SOURCES[FIRST_REGISTERED])


def done_bytes(cache: TreeMeasure | None, reading: ProgressReading | None, net_gain: int | None,
               cache_start: int, written: int | None = None, unseen: int = 0) -> int:
    """What is done, the largest of what each source says (see the module's docstring): ``cache`` the latest
    walk of progress_path (None: none watched), ``net_gain`` the bytes received since the attempt began
    (None: unknown), ``cache_start`` the cache's complete bytes when it began, ``written`` the bytes the
    attempt's trees have written since it began (None: unknown), ``unseen`` the bytes the command said it threw
    away that the walks have not seen go yet (a walk a moment old still counts them complete)."""
    cache_done = max(0, cache.done - unseen) if cache is not None and cache.size is not None else None
    if reading is not None:
        said = (cache_done + reading.in_flight_bytes) if cache_done is not None else reading.done_bytes
    else:
        said = cache_done or 0
        if net_gain is not None:
            said = max(said, cache_start + net_gain)
    return max(said, cache_start + written) if written is not None else said


class ProgressEvidence(Protocol):
    """What a progress watch reads, measured elsewhere and never waited for (lifecycle/runtime.py's
    MachineEvidence), and the instance's clocks its deadline counts from. Read-only: any may be absent (None)."""

    @property
    def progress(self) -> ProgressProbe | None: ...  # the walker of progress_path and of the received bytes

    @property
    def io(self) -> IoProbe | None: ...  # the I/O thread's totals

    @property
    def first_seen(self) -> FirstSeen | None: ...

    @property
    def allocators(self) -> frozenset[str]: ...  # the allocating downloaders' process names (iowatch.py)

    @property
    def freeze(self) -> FreezeWatch | None: ...  # the tick: a freeze of the supervisor itself (engine/tick.py)


class DownloadingAttempt(Protocol):
    """The attempt a progress watch follows, and its phase's ear for what it finds (lifecycle/attempt.py's
    Watched)."""

    def roots(self) -> list[Root]: ...  # its process trees, whose written bytes count

    def cgroup(self) -> MemoryCgroup | None: ...  # its phase's own cgroup, whose processes' count too (None: none)

    def reading(self) -> ProgressReading | None: ...  # what its command's output parser read of the download

    def current(self) -> bool: ...  # still its phase's running attempt (else the watch stops)

    def too_slow(self, why: str) -> None: ...  # it can no longer make progress_deadline_s

    def fault(self, what: str, exc: Exception) -> None: ...  # a bug of the watch's own (it fails the phase)


class ProgressWatch:
    """Made at an attempt's start for a phase with progress_total; stops once the attempt is not ``current()``."""

    def __init__(self, spec: PhaseSpec, loop: EventLoop, log: Log, evidence: ProgressEvidence,
                 attempt: DownloadingAttempt) -> None:
        probe, io = evidence.progress, evidence.io
        self._spec, self._loop, self._log, self._probe, self._first_seen = spec, loop, log, probe, evidence.first_seen
        self._attempt, self._freeze = attempt, evidence.freeze
        self._thaw_seen = self._freeze.thawed_at if self._freeze is not None else None
        self._waking_until: float | None = None  # after a thaw: until when readings taken since it are waited for
        self._on_error: ErrorHandler = self._failed
        self._started = loop.clock.monotonic()
        self._window = RateWindow(min(RATE_WINDOW_S, spec.progress_window_s))
        self._moved_window = RateWindow(self._window.window_s)  # what the link moved (the module's docstring)
        self._moved_fresh = False  # the latest tick had a fresh measure of movement
        self._fresh_seen: dict[str, tuple[int, float]] = {}  # a measure → (its latest reading's seq, when new)
        self._releases: list[Callable[[], None]] = []
        self._io: IoWatch | None = None
        if io is not None:  # (the attempt's trees began with it)
            self._io = io.watch(PROGRESS_TICK_S, from_zero=True, allocators=evidence.allocators)
            self._io.follow(attempt.roots(), attempt.cgroup())
            self._releases.append(self._io.release)
        if probe is not None:
            if spec.progress_path is not None:
                self._releases.append(probe.watch(spec.progress_path, PROGRESS_TICK_S, held=self._held))
            self._releases.append(probe.watch_net(PROGRESS_TICK_S))
        self._cache_start: int | None = None  # the cache's complete bytes at the first measure (0: no cache yet)
        self._net_start: int | None = None
        self._cache_seen: tuple[int, int] | None = None  # the cache's (size, done) at the latest walk
        self._restarts = 0  # the files the command said it deleted to fetch again, so far
        # The bytes of removed files, as the walks saw them go and as the command said them: one removal is
        # often seen both ways, in either order, so what is thrown away is the larger of the two sums, not both.
        self._walks_thrown = self._said_thrown = 0
        self._walk_removals = 0  # how many removals the walks saw
        self._unseen = 0  # bytes the command threw away that the walks have not seen go (yet)
        self._unseen_said = 0  # what the command had said thrown away when the walks began to be counted
        self._unseen_walks = 0  # the cache's walks since then (its own: the walker numbers all its paths' walks)
        self._cache_seq: int | None = None  # the cache's latest walk seen, by its number
        self._thrown = 0  # what no longer counts: max(_walks_thrown, _said_thrown)
        self._done = 0
        # The rate is of what the link brings, thrown away or not (``_got``: done + ``_thrown``): counted from
        # ``_done`` alone, a removal read as a link gone slow (its figure dropped, then grew from there) and the
        # deadline rule ended a download that could still make it.
        self._got = 0
        self._logged_at = self._started
        self._paused = 0.0  # the seconds that were not the link's (``_link_time``)
        self._last_tick: tuple[float, int, int | None] = (self._started, 0, 0)  # the last tick's time, got, moved
        # Where the download began to move, on the link's clock (None: not yet): the observation window and the
        # rates count from it (``_began``). The movement's measure at the last tick, and at the last tick that
        # moved nothing, as (the link's time, which measure: "moved" or "got", its bytes); both the attempt's
        # start at first (what it moved counts from zero there).
        self._moving_since: float | None = None
        self._last_move = self._still = (self._started, "moved", 0)
        self._first_moved_at: float | None = None  # the first tick after the still one that saw it move
        self.progress: Progress | None = None  # the latest figures (None: no evidence yet)
        self._said_deadline = False
        self._settling: Settling | None = None  # the settled walk waited for after the attempt ended well
        self._finished = False
        loop.call_later(PROGRESS_TICK_S, self._tick, on_error=self._on_error)

    def figures(self) -> dict[str, object] | None:
        """The figures status shows. An attempt stopped with no outcome decided yet (a shutdown's stop: ``finish``
        comes only if it turns out to have completed) shows no ETA either: nothing downloads any more."""
        progress = self.progress
        if progress is None:
            return None
        if progress.eta_s and not self._finished and not self._attempt.current():
            progress = dataclasses.replace(progress, eta_s=None)
        return progress.to_dict()

    def gained(self) -> int:
        """The bytes this attempt got that the next one keeps (retry_while_progressing; 0 before the first
        measure): with progress_path, the cache's complete bytes now beyond those when it began (0 where there
        was no cache yet: curio makes it once the fetch has begun). What it wrote into a file left incomplete is
        not counted: curio deletes such a file itself when aria2c fails (its Go fallback appends past the
        preallocated end, the check fails, the file goes), so the next attempt starts it from zero, and an
        attempt that had only written counted as one that got further, for ever. Without progress_path, what
        it got by the other sources."""
        if self._cache_start is None:
            return 0
        if self._spec.progress_path is not None:
            return max(0, (self._cache_seen[1] if self._cache_seen is not None else 0) - self._cache_start)
        return max(0, self._done - self._cache_start)

    def finish(self, success: bool) -> None:
        """The attempt is over (its phase says so as it decides the outcome): the walks and reads are released,
        and its figures are those of a download that ended (``_final``); one that ended well waits for a settled
        walk of progress_path for its last figures (the module's docstring)."""
        if self._finished:
            return
        self._finished = True
        try:  # (called as the phase decides its outcome: a bug here costs the figures, never the phase's move)
            self._stop()
            if self.progress is None:
                return
            self._final(self.progress.files_done)
            path = self._spec.progress_path
            if success and self._probe is not None and path is not None:
                self._settling = self._probe.settle(path)
                self._look_later(self._loop.clock.monotonic() + SETTLED_WAIT_S)
        except Exception as exc:
            self._settle_failed(exc)

    def _look_later(self, deadline: float) -> None:
        """The next look at the settled walk, SETTLED_LOOK_S from now (it stops waiting at ``deadline``)."""
        self._loop.call_later(SETTLED_LOOK_S, lambda: self._look_settled(deadline), on_error=self._settle_failed)

    def _look_settled(self, deadline: float) -> None:
        settling = self._settling
        if settling is None:
            return
        walked, measure = settling.measure()
        if not walked and self._loop.clock.monotonic() < deadline:
            self._look_later(deadline)
            return
        settling.release()
        self._settling = None
        if measure is not None and measure.size is not None and self.progress is not None:
            self._settle_figures(measure)

    def _settle_figures(self, cache: TreeMeasure) -> None:
        """The last figures: what the settled walk found complete (never less than the figure was). Nothing the
        command said it threw away is kept off (``_unseen``): the walk came after every removal, and a file it
        finds complete is the one fetched again."""
        self._done = max(self._done, cache.done)
        self._final(cache.done_files)

    def _final(self, files_done: int | None) -> None:
        """The figures of a download that ended: the attempt's average rate (over the window the ticks read theirs
        from), and no time left to wait: 0 where the total is reached, none where it is not (nothing downloads any
        more: an ETA would stand in status and /metrics for good)."""
        progress = figures(self._done, self._spec.progress_total, self._rate_window().average(), files_done)
        total = progress.total_bytes
        self.progress = dataclasses.replace(progress, eta_s=0.0 if total is not None and self._done >= total else None)

    def _tick(self) -> None:
        if self._finished:
            return
        if not self._attempt.current():
            self._stop()
            return
        now = self._loop.clock.monotonic()
        if not self._waking(now) and self._measure(now):
            self._say(now)
            if self._judge(now):
                return
        self._loop.call_later(PROGRESS_TICK_S, self._tick, on_error=self._on_error)

    def _waking(self, now: float) -> bool:
        """True while the watch waits, after a freeze of the supervisor (tick.py's FreezeWatch, looked at first: its
        own tick may come after this one), for the I/O thread and the walker to read again: they were stopped with
        it, and their readings of before it, read over a time that spans it, were a link gone slow (a download at
        2 MiB/s was given up 3 ms after the thaw, at 788 KiB/s). The frozen time is not the link's: the rate
        windows, the observation window and where the download began move on by it; the deadline does not. A hold
        of the loop's own (a start's exec wait) is the link's time: the threads and the children went on in it. A
        reading that does not come (a blind thread) is waited for MOVED_FRESH_S at most: it would be stale by then."""
        freeze = self._freeze
        if freeze is None:
            return False
        freeze.notice(now)
        if freeze.thawed_at is not None and freeze.thawed_at != self._thaw_seen:
            self._thaw_seen = freeze.thawed_at
            self._paused += freeze.stopped_s
            last = self._last_tick  # (moved on with the link's clock: the freeze is no allocation either)
            self._last_tick = (last[0] + freeze.stopped_s, last[1], last[2])
            self._waking_until = freeze.thawed_at + MOVED_FRESH_S
        if self._waking_until is None:
            return False
        if now < self._waking_until and not self._read_since(freeze.thawed_at):
            return True
        self._waking_until = None
        return False

    def _read_since(self, at: float | None) -> bool:
        """Whether every reading the watch has had (the I/O thread's, the walks of progress_path and of the received
        bytes) is one taken at ``at`` or later."""
        if at is None:
            return True
        latest: list[TreeIo | TreeMeasure | None] = [self._io.latest() if self._io is not None else None]
        if self._probe is not None:
            paths = [NET_DEV] if self._spec.progress_path is None else [self._spec.progress_path, NET_DEV]
            latest += [self._probe.latest(path) for path in paths]
        return all(reading is None or reading.at >= at for reading in latest)

    def _measure(self, now: float) -> bool:
        """The figures from the latest evidence; False while a source watched has no first measure yet
        (its baseline: the cache's earlier files must not read as bytes received just now)."""
        cache = net = None
        if self._probe is not None:
            if self._spec.progress_path is not None:
                cache = self._probe.latest(self._spec.progress_path)
                if cache is None:
                    return False
            net = self._probe.latest(NET_DEV)
        io_reading = self._io_reading()
        written = io_reading.written - io_reading.allocated if io_reading is not None else None
        reading = self._attempt.reading()
        cache_start = self._cache_start if self._cache_start is not None else self._take_baseline(cache, net)
        cut = self._thrown_away(cache, reading)
        if cut:  # the removed file's bytes alone no longer count; the other files' keep theirs
            self._done = max(0, self._done - cut)
        net_gain = None
        if net is not None and net.size is not None and self._net_start is not None:
            net_gain = max(0, net.size - self._net_start - self._thrown)
        since = None if written is None else max(0, written - self._thrown)
        self._done = max(self._done, done_bytes(cache, reading, net_gain, cache_start, since, self._unseen))
        self._got = self._thrown + self._done  # (the link brought the thrown-away bytes too: they stay in the rate)
        moved = self._moved(now, io_reading, net)
        at = self._link_time(now, io_reading, moved)
        self._window.add(at, self._got)
        self._moved_fresh = moved is not None
        if moved is not None:
            self._moved_window.add(at, moved)
        self._began(at, moved)
        files = cache.done_files if cache is not None else (reading.done_files if reading is not None else None)
        self.progress = figures(self._done, self._spec.progress_total, self._rate_window().rate(), files)
        return True

    def _link_time(self, now: float, io: TreeIo | None, moved: int | None) -> float:
        """``now`` on the link's clock, which leaves out the ticks in which an allocating downloader allocated and
        nothing was got (``_paused``): the link was not in use. Counted, a fill of minutes (45 GiB of zeros on a slow
        disk, then their flush) read as minutes of a link that brought nothing, and the window just after it as a
        link far slower than it is: a download that could make its deadline was given up at its first bytes."""
        last, self._last_tick = self._last_tick, (now, self._got, moved)
        if io is not None and io.allocating and self._got <= last[1] and (
                moved is None or last[2] is None or moved <= last[2]):
            self._paused += now - last[0]
        return now - self._paused

    def _began(self, at: float, moved: int | None) -> None:
        """Whether the download began to move at the link's time ``at``: its movement (what the link moved, else the
        figure's growth) grew by a window's worth of MOVING_MIN_B_S since the last tick that moved less than that a
        second. Then the observation window counts from that tick (``_moving_since``), the last with nothing moving,
        and the rate from the first tick that saw it move: before them, the silence of a first byte that comes late
        (a slow gateway, aria2c retrying its connection, a retry attempt) or a line of output was no rate, and read
        as one, it ended a download that had not begun yet. (The data began somewhere between the two ticks: a rate
        counted from the still one read up to a tick's silence as the link's, a third of a 3 s window on a loaded
        machine, 8 KiB/s read as 5.3.)"""
        kind, value = ("moved", moved) if moved is not None else ("got", self._got)
        last, self._last_move = self._last_move, (at, kind, value)
        if self._moving_since is not None:
            return
        if kind != last[1] or value - last[2] <= MOVING_MIN_B_S * (at - last[0]):  # (another measure: from here)
            self._still, self._first_moved_at = (at, kind, value), None
            return
        if self._first_moved_at is None:
            self._first_moved_at = at
        if value - self._still[2] >= MOVING_MIN_B_S * self._window.window_s:
            self._moving_since = self._still[0]
            self._window.since(self._first_moved_at)
            self._moved_window.since(self._first_moved_at)

    def _moved(self, now: float, io: TreeIo | None, net: TreeMeasure | None) -> int | None:
        """What the link moved in this attempt, by the measures that count only this attempt's bytes, the thrown
        away included: the trees' bytes written (every process's counters read), the bytes received; the larger
        of those read afresh (None: neither)."""
        known = []
        if io is not None and not io.unreadable and self._fresh("io", io.seq, now):
            known.append(io.written - io.allocated)
        if net is not None and net.size is not None and self._net_start is not None and self._fresh("net", net.seq,
                                                                                                      now):
            known.append(max(0, net.size - self._net_start))
        return max(known) if known else None

    def _fresh(self, measure: str, seq: int, now: float) -> bool:
        """Whether ``measure``'s reading numbered ``seq`` came within MOVED_FRESH_S (a new number is a new one)."""
        seen = self._fresh_seen.get(measure)
        if seen is None or seen[0] != seq:
            self._fresh_seen[measure] = seen = (seq, now)
        return now - seen[1] <= MOVED_FRESH_S

    def _rate_window(self) -> RateWindow:
        """The window the rate is read from: the link's movement, while it is measured afresh over at least
        MOVED_SPAN_MIN of a window; else the figure's growth (the bytes found count in it too)."""
        moved = self._moved_window
        if self._moved_fresh and moved.covered() >= MOVED_SPAN_MIN * moved.window_s:
            return moved
        return self._window

    def _thrown_away(self, cache: TreeMeasure | None, reading: ProgressReading | None) -> int:
        """What comes off the figure for files removed since the measure before (0: none). What was got
        of a file deleted to be fetched again is no progress, or a file fetched twice reads as done (100% while
        it is fetched again, and no early word that the deadline cannot be made). Two ways to know:

        - the walks: less of the cache complete (a download whose digest did not match, deleted to be fetched
          again, preallocated anew at once: the complete bytes that went), or the cache smaller and no more of
          it complete (a partial one removed: the bytes that went). A download that completes is no removal
          (its control file goes, its bytes become complete);
        - the command's own word (its reading's ``restarts`` and ``thrown_bytes``): a file deleted after its
          check. The walks miss a file checked in less than progress.py's COMPLETE_QUIET_S, deleted and
          preallocated anew between two of them (never seen complete, never smaller); the line is not missed.

        One removal is mostly seen both ways, a tick or more apart in either order (curio says it before it
        deletes; the walks run on their own thread): each way's bytes are summed on their own, and what is
        thrown away is the larger sum, so that it counts once (and the figure loses it once). A cache that
        shrinks by a control file alone (CONTROL_FILE_MAX) is a download completing, no removal."""
        seen = (cache.size, cache.done) if cache is not None and cache.size is not None else None
        before, self._cache_seen = self._cache_seen, seen
        why, gone = "", 0
        if seen is not None and before is not None:
            if seen[1] < before[1]:
                gone = before[1] - seen[1]
                why = f"{self._spec.progress_path} has less complete (a file removed)"
            elif before[0] - seen[0] > CONTROL_FILE_MAX and seen[1] == before[1]:
                gone = before[0] - seen[0]
                why = f"{self._spec.progress_path} shrank (a file removed)"
        self._walks_thrown += gone
        self._walk_removals += 1 if gone else 0
        restarts = reading.restarts if reading is not None else 0
        said = reading.thrown_bytes if reading is not None else 0
        if restarts > self._restarts:
            why = why or "the command deletes a file to fetch it again"
            if said <= self._said_thrown and self._walk_removals < restarts:  # its size said by no one
                self._log(f"phase {self._spec.name}: {why}: its size is not known, so its bytes still count")
        self._restarts, self._said_thrown = max(restarts, self._restarts), max(said, self._said_thrown)
        thrown = max(self._walks_thrown, self._said_thrown) - self._thrown
        if thrown > 0:
            self._thrown += thrown
            self._log(f"phase {self._spec.name}: {why or 'a file was removed'}: its {fmt_bytes(thrown)} no longer "
                      "count")
        self._hold_unseen(cache)
        return thrown

    def _hold_unseen(self, cache: TreeMeasure | None) -> None:
        """What the command threw away that no walk saw go is kept off the walks' figure (``_unseen``), so that a
        walk a moment old, which still counts the file complete, does not hold the figure up (nor the rate: it
        read a spike, then a dip). Once UNSEEN_WALKS walks of the cache after the latest word none saw it go, no
        walk counted it complete: it is no longer held back. The walks are counted one by one, never by their
        numbers (the walker numbers the walks of every path it watches, the received bytes' too), and from the
        latest word (an earlier one still unseen waits with it: held a moment longer, never released early)."""
        fresh = cache is not None and cache.seq != self._cache_seq
        if cache is not None:
            self._cache_seq = cache.seq
        self._unseen = max(0, self._said_thrown - self._walks_thrown)
        if not self._unseen:
            self._unseen_said = self._unseen_walks = 0
            return
        if self._said_thrown != self._unseen_said:  # a word (again): the walks after it count from the next one
            self._unseen_said, self._unseen_walks = self._said_thrown, 0
            return
        self._unseen_walks += 1 if fresh else 0
        if self._unseen_walks >= UNSEEN_WALKS:
            self._walks_thrown, self._unseen = self._said_thrown, 0

    def _take_baseline(self, cache: TreeMeasure | None, net: TreeMeasure | None) -> int:
        """What counts from the first measure: the cache's complete bytes (0 where there was no cache yet: returned),
        the bytes received; the trees' bytes written count from their start (they began with the attempt)."""
        self._cache_start = cache.done if cache is not None and cache.size is not None else 0
        self._net_start = net.size if net is not None else None
        return self._cache_start

    def _held(self) -> frozenset[FileId]:
        """(the walker's thread) The files the attempt's allocating downloaders hold open, as last read."""
        latest = self._io.latest() if self._io is not None else None
        return latest.held if latest is not None else frozenset()

    def _io_reading(self) -> TreeIo | None:
        """The I/O thread's latest reading of the attempt's trees, with what they have written since it began
        (None: not read yet, or unreadable); the trees are handed to the I/O thread afresh each time (its children
        start one after another)."""
        if self._io is None:
            return None
        self._io.follow(self._attempt.roots(), self._attempt.cgroup())
        latest = self._io.latest()
        return latest if latest is not None and latest.readable else None

    def _say(self, now: float) -> None:
        if now - self._logged_at >= PROGRESS_LOG_S and self.progress is not None:
            self._logged_at = now
            self._log(f"phase {self._spec.name}: progress {progress_text(self.progress.to_dict())}")

    def _judge(self, now: float) -> bool:
        """After the observation window: True when the download cannot make its deadline (then it ends)."""
        spec, progress = self._spec, self.progress
        if spec.progress_deadline_s is None or progress is None:
            return False
        if self._first_seen is not None:
            anchor, since = self._first_seen.anchor()
        else:  # (a runtime made without one: tests of the phase alone)
            anchor, since = self._loop.clock.time() - (now - self._started), "this attempt's start"
        time_left = anchor + spec.progress_deadline_s - self._loop.clock.time()
        manager = since in MANAGER_CLOCKS
        said = (f"the manager's timeout (progress_deadline_s={spec.progress_deadline_s:g} from {since})" if manager
                else f"the deadline (progress_deadline_s={spec.progress_deadline_s:g} from {since})")
        if time_left <= 0:  # already past (a row registered long ago): no rate can help, so at once
            return self._end(f"{said} passed {span(-time_left)} ago, with {progress_text(progress.to_dict())}")
        # The window is of the link's time since the download began to move: silence is the stall watch's.
        if self._moving_since is None or now - self._paused - self._moving_since < spec.progress_window_s:
            return False
        if not self._said_deadline:
            self._said_deadline = True
            self._log(f"phase {spec.name}: {span(max(0.0, time_left))} left before {said}")
        detail = too_slow(progress, judged_rate(self._rate_window()), time_left, said)
        return False if detail is None else self._end(detail)

    def _end(self, detail: str) -> bool:
        spec = self._spec
        self._stop()
        self._log(f"phase {spec.name}: cannot make it in time: {detail}")
        self._attempt.too_slow(detail)
        return True

    def _failed(self, exc: Exception) -> None:
        """A bug of the watch's own: its walks and I/O reads are released, then the phase is told."""
        self._stop()
        self._attempt.fault("the progress watch", exc)

    def _settle_failed(self, exc: Exception) -> None:
        """A bug in finishing, or in the last look after the attempt ended well: said, and the figures stay as they
        were (the attempt is over, and its outcome decided: a figure is no reason to change it)."""
        if self._settling is not None:
            self._settling.release()
            self._settling = None
        self._log(f"phase {self._spec.name}: the progress watch's last look failed ({exc!r}): its figures stay as "
                  "they were")

    def _stop(self) -> None:
        for release in self._releases:
            release()
        self._releases = []
