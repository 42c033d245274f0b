"""Stall detection: a phase is stalled when every sign of life has been silent for ``stall_s``.

The signs: a byte of output from any of its processes (of its command's, where its parser marks lines that say
nothing moved, a read with some other line: lifecycle/hooks.py's OutputLife); bytes read or written by any of them (the
kernel's I/O counters, summed over the attempt's trees and its phase's own cgroup by the I/O thread:
iowatch.py; IO_SIGN_MIN_BYTES of them, not a runtime's housekeeping); a GPU whose
utilisation is non-zero or whose memory use changed (where GPUs are visible); the watched
``progress_path`` written: growing, or a file under it written (a parameter download into a preallocated
file, its mtime moving); and the storage bytes of the daemons the phases before it kept (``lifetime =
"lifecycle"``). Output alone is not enough: real programs buffer
their output into a pipe (aria2c), preallocate (the file is full size at once) and work for minutes
without a line (curio hashing its parameters, cuzk loading its SRS). Being alive is no sign, nor is
CPU time: a process blocked in ``recv`` on a dead connection, or spinning, is stalled
(docs/verdicts.md).

A kept daemon is often what a later phase waits on (a client of it, silent while the daemon works), so the
bytes it moves count, and a client waiting on it is not stalled. Its output does not: a daemon's heartbeat,
a line or a chatty log's bytes, is no work, and it would keep every later phase alive, one that hangs too (the
missed stall, which is worse than the false one). So its bytes read from and written to storage (read_bytes,
write_bytes: output into a pipe is none of them, whichever process of its tree carries it on) are its sign,
named apart (``I/O of kept a/worker``), with its own IO_SIGN_MIN_BYTES.

The decision is a small pure object fed with observations, so it is tested without waiting;
StallMonitor feeds it from a running attempt every little while, with what was measured off the loop:
the GPU thread's latest reading (supervisor/evidence/gpuwatch.py), the I/O thread's latest totals and the
progress probe's latest walk (supervisor/evidence/progress.py). It never waits for any. Its time is the loop's
clock (tests/test_phase_timing.py moves a fake one).

Before it decides it drains what the children printed (output waiting in a pipe is
a sign of life) and looks at the clock: a freeze of the supervisor itself
(supervisor/engine/tick.py) restarts the window at the thaw. While NVML is unresponsive,
GPU evidence is unknown: no activity is credited (a hung GPU is no sign of work,
and waiting for it would block the decision), and the verdict says so. So it is while GPU sampling is blind,
or a GPU seen before has not been in a reading for half of stall_s (NVML answering garbage for it: the GPU
thread publishes its readings without it): a GPU left out of a reading is neither active nor at rest, and its
last sample stays what its next one is compared with. The I/O thread's totals and the walks of progress_path
are the same: while the thread or the walker is blind, or its latest reading (walk) is older than half of
stall_s (walks that fail on a flaky mount, one hung on it), that sign is not measured: nothing is credited, and
the verdict and the status view say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..engine.loop import ErrorHandler, EventLoop
from ..engine.process import Child
from ..engine.tick import FreezeWatch
from .cgroups import MemoryCgroup
from .gpu import GpuReading, GpuSample, activity_changed
from .gpuwatch import Gpus
from .iowatch import IoProbe, IoWatch, Root
from .progress import ProgressProbe

# How often a phase with stall_s is looked at: often enough to name the stall
# within a second of stall_s, rarely enough to cost nothing.
STALL_CHECK_MAX_S = 0.5
STALL_CHECK_MIN_S = 0.05


# Bytes the trees must move since the last credited reading for I/O to be a sign of life. A runtime's own
# housekeeping is no work: Go (curio's) rereads its cgroup CPU limit once a second to size GOMAXPROCS, tens of
# bytes of rchar a read, so a download blocked for good in recv would never be stalled. Any real work moves
# far more: a link at 1.7 KiB/s moves 1 MiB per 600 s, a hasher GiBs.
IO_SIGN_MIN_BYTES = 64 << 10


def check_interval(stall_s: float) -> float:
    return max(STALL_CHECK_MIN_S, min(STALL_CHECK_MAX_S, stall_s / 10))


def kept_sign(labels: list[str]) -> str:
    """The name of the kept daemons' I/O among the signs, naming them (a verdict lists signs with commas)."""
    named = " and ".join(labels) if len(labels) <= 2 else f"{labels[0]} and {len(labels) - 1} more"
    return f"I/O of kept {named}"


@dataclass
class StallSigns:
    """What one attempt's StallMonitor has seen of each sign of life, and when, and the pure rules that read
    it: the monitor feeds it readings and asks it whether the attempt is stalled (tests/test_stall.py, in-process)."""

    stall_s: float
    started: float  # monotonic time the watch began (the attempt's start)
    gpus_visible: bool
    watches_path: bool
    watches_io: bool = False  # the I/O thread reads the attempt's trees
    io_visible: bool = False  # ... and could read their counters (else they are no sign: no evidence)
    last_output: float = field(init=False)
    last_gpu: float = field(init=False)
    last_progress: float = field(init=False)
    last_io: float = field(init=False)
    last_kept_io: float = field(init=False)
    progress_size: int | None = None
    progress_newest: float | None = None  # the newest write under progress_path at the latest walk (wall time)
    io_moved: int | None = None  # the trees' bytes moved at the latest reading (None: none yet)
    io_credited: int = 0  # ... at the reading last counted as a sign (or the baseline)
    io_unreadable: int = 0  # the processes whose counters were refused at the latest reading (iowatch.TreeIo)
    kept: str | None = None  # the kept daemons' sign (kept_sign), where the phases before kept any
    kept_visible: bool = False  # ... and their counters could be read
    kept_work: int | None = None  # their storage bytes at the latest reading (None: none yet)
    kept_credited: int = 0  # ... at the reading last counted as a sign (or the baseline)
    idle_output: float | None = None  # the command's latest output that said nothing moved (monotonic; None: none)
    # Each sign whose silence is no measure at the latest look, and why (GPU sampling blind, the I/O thread's
    # reading old): the status view says so beside its age, as the verdict would.
    unmeasured: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.last_output = self.last_gpu = self.last_progress = self.last_io = self.last_kept_io = self.started

    def saw_output(self, at: float) -> None:
        self.last_output = max(self.last_output, at)

    def saw_idle_output(self, at: float | None) -> None:
        """The command printed at ``at`` only lines its parser marks as saying nothing moved: no sign of life, but
        said beside the output's silence (the status view, the verdict), which it would seem to belie."""
        if at is not None:
            self.idle_output = max(self.idle_output or at, at)

    def idle_output_age(self, now: float) -> float | None:
        """How long ago the command last printed only lines that said nothing moved, where that came after the last
        output that was a sign of life; None: none since."""
        if self.idle_output is None or self.idle_output <= self.last_output:
            return None
        return max(0.0, now - self.idle_output)

    def saw_gpu(self, active: bool, at: float) -> None:
        if active:
            self.last_gpu = max(self.last_gpu, at)

    def thawed(self, at: float) -> None:
        """The supervisor itself was frozen until ``at``: every sign's silence starts again there."""
        self.last_output = max(self.last_output, at)
        self.last_gpu = max(self.last_gpu, at)
        self.last_progress = max(self.last_progress, at)
        self.last_io = max(self.last_io, at)
        self.last_kept_io = max(self.last_kept_io, at)

    def saw_io(self, moved: int, readable: bool, at: float, unreadable: int = 0) -> None:
        """The trees' bytes read and written since the watch began, as the I/O thread read them at ``at``:
        IO_SIGN_MIN_BYTES more than at the last reading counted is a sign of life (the first reading is the
        baseline). ``unreadable``: how many of the trees' processes refused their counters (their bytes are in
        no total: said in the verdict)."""
        self.io_unreadable = unreadable
        if not readable:
            return
        self.io_visible = True
        if self.io_moved is None:
            self.io_moved = self.io_credited = moved
            return
        self.io_moved = max(self.io_moved, moved)
        if self.io_moved - self.io_credited >= IO_SIGN_MIN_BYTES:
            self.last_io = max(self.last_io, at)
            self.io_credited = self.io_moved

    def saw_kept_io(self, stored: int, readable: bool, at: float) -> None:
        """The kept daemons' trees' bytes read from or written to storage, as the I/O thread read them at ``at``
        (iowatch.TreeIo.stored: their output is none of it, whatever carries it into the pipe, ``| tee`` too):
        IO_SIGN_MIN_BYTES more than at the last reading counted is a sign of life (the first reading is the
        baseline)."""
        if not readable:
            return
        self.kept_visible = True
        if self.kept_work is None:
            self.kept_work = self.kept_credited = stored
            return
        self.kept_work = max(self.kept_work, stored)
        if self.kept_work - self.kept_credited >= IO_SIGN_MIN_BYTES:
            self.last_kept_io = max(self.last_kept_io, at)
            self.kept_credited = self.kept_work

    def saw_progress(self, size: int | None, newest: float | None, at: float) -> None:
        """The watched path's size (None: absent) and newest write (an mtime; None: no file) as the walk that
        ended at ``at`` found them. Growth is a sign, and so is a newer write (a preallocated file written
        into does not grow); shrinking is not (a bad file deleted: growth counts again after it)."""
        size = size or 0
        if self.progress_size is None:
            self.progress_size, self.progress_newest = size, newest  # the baseline, taken when the watch starts
            return
        wrote = newest is not None and (self.progress_newest is None or newest > self.progress_newest)
        if size > self.progress_size or wrote:
            self.last_progress = max(self.last_progress, at)
        self.progress_size = size
        if wrote:
            self.progress_newest = newest

    def last_sign(self) -> float:
        """When the freshest of the signs it counts was last seen (monotonic): the stall countdown runs from it."""
        return max(seen for _, seen in self._signs())

    def _signs(self) -> list[tuple[str, float]]:
        signs = [("output", self.last_output)]
        if self.io_visible:
            signs.append(("I/O", self.last_io))
        if self.kept is not None and self.kept_visible:
            signs.append((self.kept, self.last_kept_io))
        if self.gpus_visible:
            signs.append(("GPU activity", self.last_gpu))
        if self.watches_path:
            signs.append(("progress_path writes", self.last_progress))
        return signs

    def ages(self, now: float) -> dict[str, float]:
        """How long each sign it counts has been silent at ``now`` (for the status view), by name."""
        return {what: max(0.0, now - seen) for what, seen in self._signs()}

    def note_unmeasured(self, gpu_unknown: str | None, io_unknown: str | None,
                        progress_unknown: str | None = None) -> None:
        """What the latest look could not measure, and why (the status view says it beside the sign's age)."""
        unknown = [("I/O", io_unknown), ("GPU activity", gpu_unknown), ("progress_path writes", progress_unknown)]
        if self.kept is not None:
            unknown.append((self.kept, io_unknown))  # (read by the same I/O thread)
        self.unmeasured = {what: why for what, why in unknown if why is not None}

    def stalled(self, now: float, gpu_unknown: str | None = None, io_unknown: str | None = None,
                progress_unknown: str | None = None) -> str | None:
        """None while any sign is fresh; else what was silent, for the verdict. ``gpu_unknown``: why
        there is no GPU evidence now (NVML unresponsive), said in place of "no GPU visible"; ``io_unknown``:
        why the I/O thread reads nothing now (its silence is then no measure); ``progress_unknown``: why no walk
        of progress_path is recent (the same)."""
        signs = self._signs()
        if any(now - seen < self.stall_s for _, seen in signs):
            return None
        silent = ", ".join(f"no {what} for {now - seen:.1f}s" for what, seen in signs)
        idle = self.idle_output_age(now)
        if idle is not None:
            silent += f" (output since then said nothing moved, the latest {idle:.1f}s ago)"
        if io_unknown is not None:
            silent += f" (I/O evidence unavailable: {io_unknown})"
        elif self.watches_io and not self.io_visible:
            silent += " (I/O counters unreadable)"
        elif self.io_unreadable:
            silent += (f" (the I/O counters of {self.io_unreadable} of its processes unreadable: another user's, "
                       "and no CAP_SYS_PTRACE)")
        if gpu_unknown is not None:
            silent += f" (GPU evidence unavailable: {gpu_unknown})"
        elif not self.gpus_visible:
            silent += " (no GPU visible)"
        if progress_unknown is not None:
            silent += f" (progress_path evidence unavailable: {progress_unknown})"
        return silent


class StallEvidence(Protocol):
    """What a stall watch reads, measured elsewhere and never waited for (lifecycle/runtime.py's MachineEvidence).
    Read-only: any of them may be absent (None) where the machine's has one."""

    @property
    def gpus(self) -> Gpus | None: ...  # the GPU thread's readings

    @property
    def progress(self) -> ProgressProbe | None: ...  # the walker of progress_path

    @property
    def io(self) -> IoProbe | None: ...  # the I/O thread's totals

    @property
    def freeze(self) -> FreezeWatch | None: ...  # the tick: a freeze of the supervisor itself


class StallingAttempt(Protocol):
    """The attempt a stall watch looks at, and its phase's ear for what the watch finds (lifecycle/attempt.py's
    Watched)."""

    def roots(self) -> list[Root]: ...  # its process trees, whose I/O is a sign of life

    def cgroup(self) -> MemoryCgroup | None: ...  # its phase's own cgroup, whose processes' I/O is too (None: none)

    def kept(self) -> list[Child]: ...  # the daemons the phases before it kept, alive: their work is a sign too

    def last_outputs(self) -> list[float]: ...  # when each child last printed a sign of life (monotonic)

    def idle_output(self) -> float | None: ...  # when its command last printed only lines that said nothing moved

    def drain(self) -> None: ...  # read what the children printed, and look at the clock, before deciding

    def current(self) -> bool: ...  # still its phase's running attempt (else the watch stops)

    def stalled(self, silent: str) -> None: ...  # every sign was silent for stall_s: what was

    def fault(self, what: str, exc: Exception) -> None: ...  # a bug of the watch's own (it fails the phase)


class StallMonitor:
    """Looks every little while, for one attempt, whether output, I/O, GPUs and progress_path have all gone
    silent; says so once (``attempt.stalled``, what was silent), and stops looking (and wanting GPU samples
    and walks) once the attempt is no longer ``current()``."""

    def __init__(self, loop: EventLoop, stall_s: float, progress_path: str | None, evidence: StallEvidence,
                 attempt: StallingAttempt) -> None:
        gpus, probe, freeze, io = evidence.gpus, evidence.progress, evidence.freeze, evidence.io
        self._loop, self._gpus, self._probe, self._freeze, self._io_probe = loop, gpus, probe, freeze, io
        self._attempt = attempt
        self._progress_path = progress_path if probe is not None else None
        self._on_error: ErrorHandler = self._failed
        now = loop.clock.monotonic()
        self._releases: list[Callable[[], None]] = []
        self._gpu_seq: int | None = None  # the GPU thread's reading last fed
        self._gpu_last: dict[int, GpuSample] = {}  # each GPU's latest sample (what its next one is compared with)
        self._gpu_read_at: dict[int, float] = {}  # when each GPU was last in a reading (monotonic)
        if gpus is not None:
            self._releases.append(gpus.want(stall_s / 4))
            baseline = gpus.latest()  # what changes after it is activity
            if baseline is not None:
                self._remember_gpus(baseline)
        if probe is not None and progress_path is not None:
            self._releases.append(probe.watch(progress_path, check_interval(stall_s)))
        self._progress_seq: int | None = None
        self._io: IoWatch | None = None
        self._io_seq: int | None = None
        self._io_at: float | None = None  # when the I/O thread's latest reading was taken (monotonic)
        if io is not None:
            self._io = io.watch(check_interval(stall_s) * 2)
            self._io.follow(attempt.roots(), attempt.cgroup())
            self._releases.append(self._io.release)
        # The kept daemons, as the attempt begins (they are fixed by then: a kept daemon that dies ends the run).
        self._kept = attempt.kept() if io is not None else []
        self._kept_io: IoWatch | None = None
        self._kept_seq: int | None = None
        if io is not None and self._kept:
            self._kept_io = io.watch(check_interval(stall_s) * 2)  # (a watch of its own: its sign is its own)
            self._kept_io.follow([(c.pid, c.tag) for c in self._kept])
            self._releases.append(self._kept_io.release)
        self._thaw_seen = freeze.thawed_at if freeze is not None else None
        self._signs = StallSigns(stall_s, now, gpus_visible=gpus is not None and gpus.available,
                                 watches_path=self._progress_path is not None, watches_io=io is not None,
                                 kept=kept_sign([c.label for c in self._kept]) if self._kept else None)
        self._interval = check_interval(stall_s)
        self._loop.call_later(self._interval, self._check, on_error=self._on_error)

    @property
    def signs(self) -> StallSigns:
        """What it has seen so far (read-only, for the status view's stall countdown)."""
        return self._signs

    def _check(self) -> None:
        if self._attempt.current():
            self._attempt.drain()  # what the children printed is read before anything is decided
        if not self._attempt.current():  # (the drain fed the output parser, which may have ended the attempt)
            self._stop_wanting()
            return
        now, watch = self._loop.clock.monotonic(), self._signs
        self._saw_thaw(now)
        for at in self._attempt.last_outputs():
            watch.saw_output(at)
        watch.saw_idle_output(self._attempt.idle_output())
        gpu_unknown = self._saw_gpus(now)
        self._saw_io()
        self._saw_kept_io()
        self._saw_progress()
        io_unknown = self._io_unknown(now)
        progress_unknown = self._progress_unknown(now)
        watch.note_unmeasured(gpu_unknown, io_unknown, progress_unknown)
        silent = watch.stalled(now, gpu_unknown, io_unknown, progress_unknown)
        if silent is None:
            self._loop.call_later(self._interval, self._check, on_error=self._on_error)
        else:
            self._stop_wanting()
            self._attempt.stalled(silent)

    def _saw_thaw(self, now: float) -> None:
        if self._freeze is None:
            return
        self._freeze.notice(now)
        if self._freeze.thawed_at != self._thaw_seen:
            self._thaw_seen = self._freeze.thawed_at
            if self._thaw_seen is not None:
                self._signs.thawed(self._thaw_seen)

    def _io_unknown(self, now: float) -> str | None:
        """Why the I/O silence is no measure now, if it is not: the I/O thread blind (its own window), or its
        latest reading older than half of stall_s (a thread held up that is not blind yet, under a short
        stall_s: the silence it would claim was not measured)."""
        if self._io_probe is None or self._io is None:
            return None
        blind = self._io_probe.state.blind_why()
        if blind is not None:
            return blind
        last = self._io_at if self._io_at is not None else self._signs.started
        if now - last > self._signs.stall_s / 2:
            return f"the I/O thread's latest reading is {now - last:.1f}s old"
        return None

    def _progress_unknown(self, now: float) -> str | None:
        """Why the silence of progress_path is no measure now, if it is not: the walker blind (its own window), or
        no walk of the path ended in half of stall_s (its walks fail: a flaky mount's EIO; or one hangs on a
        mount), as for the I/O thread: a write there would not have been seen."""
        probe, path = self._probe, self._progress_path
        if probe is None or path is None:
            return None
        blind = probe.state.blind_why()
        if blind is not None:
            return f"{probe.state.name} blind: {blind}"
        measure = probe.latest(path)
        last = measure.at if measure is not None else self._signs.started
        if now - last <= self._signs.stall_s / 2:
            return None
        why = probe.unwalked(path, now)
        return f"no walk of {path} for {now - last:.1f}s" + (f": {why}" if why else "")

    def _saw_gpus(self, now: float) -> str | None:
        """Feed the GPU thread's newest reading; why GPU evidence is unknown (NVML hung; the GPUs seen before
        are not now: the GPU thread failed and restarts; GPU sampling blind, or a GPU not read lately), if it
        is. GPUs that were seen stay a sign, with their last activity: a watch that fails must not make a
        GPU-busy child stalled at once."""
        gpus = self._gpus
        if gpus is None:
            return None
        gone = None
        if gpus.available:
            self._signs.gpus_visible = True
        elif self._signs.gpus_visible:
            gone = gpus.why or "the GPUs seen before are not now"
        self._take_gpu_reading(gpus.latest())
        hung = gpus.unresponsive(now)
        if hung is not None:
            return f"NVML unresponsive since {hung.since_clock()} ({hung.describe(now)})"
        return gone or self._gpus_unread(gpus, now)

    def _take_gpu_reading(self, reading: GpuReading | None) -> None:
        """A new reading's GPUs, each compared with its own latest sample: activity, or none. A GPU left out of it
        (its answer was no reading) says neither: it keeps its last sample, so that its next one is compared
        with that, not with nothing (a change of its memory use would go unseen)."""
        if reading is None or reading.seq == self._gpu_seq:
            return
        self._signs.saw_gpu(activity_changed(tuple(self._gpu_last.values()), reading.samples), reading.at)
        self._remember_gpus(reading)

    def _remember_gpus(self, reading: GpuReading) -> None:
        """Each GPU of ``reading``: its sample, and that it was read then."""
        self._gpu_seq = reading.seq
        for sample in reading.samples:
            self._gpu_last[sample.index] = sample
            self._gpu_read_at[sample.index] = reading.at

    def _gpus_unread(self, gpus: Gpus, now: float) -> str | None:
        """Why the GPUs' silence is no measure now, if it is not: GPU sampling blind (past its own window), or a
        GPU seen before not in a reading for half of stall_s (NVML answering garbage for it, under a stall_s
        shorter than the sampling's window): the silence the verdict would claim was not measured."""
        if not self._signs.gpus_visible:
            return None
        blind = gpus.sampling.blind_why()
        if blind is not None:
            return f"GPU sampling blind: {blind}"
        unread = sorted(i for i, at in self._gpu_read_at.items() if now - at > self._signs.stall_s / 2)
        if not unread:
            return None
        since = min(self._gpu_read_at[i] for i in unread)
        named = f"GPU {unread[0]}" if len(unread) == 1 else "GPUs " + ", ".join(map(str, unread))
        why = gpus.sampling.why
        return f"no reading of {named} for {now - since:.1f}s" + (f": {why}" if why else "")

    def _saw_io(self) -> None:
        """Feed the I/O thread's newest totals, and hand it the attempt's trees as they are now."""
        if self._io is None:
            return
        self._io.follow(self._attempt.roots(), self._attempt.cgroup())
        reading = self._io.latest()
        if reading is not None:
            self._io_at = reading.at  # (read by _io_unknown, after this, in the same look)
        if reading is not None and reading.seq != self._io_seq:
            self._io_seq = reading.seq
            self._signs.saw_io(reading.moved, reading.readable, reading.at, reading.unreadable)

    def _saw_kept_io(self) -> None:
        """Feed the I/O thread's newest storage totals of the kept daemons' trees."""
        if self._kept_io is None:
            return
        reading = self._kept_io.latest()
        if reading is not None and reading.seq != self._kept_seq:
            self._kept_seq = reading.seq
            self._signs.saw_kept_io(reading.stored, reading.readable, reading.at)

    def _saw_progress(self) -> None:
        if self._probe is None or self._progress_path is None:
            return
        measure = self._probe.latest(self._progress_path)
        if measure is not None and measure.seq != self._progress_seq:
            self._progress_seq = measure.seq
            self._signs.saw_progress(measure.size, measure.newest, measure.at)

    def _failed(self, exc: Exception) -> None:
        """A bug of the check's own: what it asked for (GPU samples, walks, the I/O thread) is released, then
        the phase is told (it fails the attempt; no later check runs to release them)."""
        self._stop_wanting()
        self._attempt.fault("the stall check", exc)

    def _stop_wanting(self) -> None:
        for release in self._releases:
            release()
        self._releases = []
