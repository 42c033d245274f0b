"""A phase's progress as figures: bytes done of the expected total, a windowed rate, the ETA, and whether it
can still make its deadline. Pure (no clock of its own, no I/O): progresswatch.py feeds it on the loop, tests
feed it in-process.

The figures (``Progress``): ``done_bytes`` of ``total_bytes`` (the phase's ``progress_total``; None: not
known; never less than what is done), ``rate_bytes_s`` over the last RATE_WINDOW_S (at most the observation
window), ``eta_s`` at that rate, and the complete files counted. ``status --json`` shows exactly the four
byte figures (and the files) as the phase's ``progress``; /metrics the same; ``progress_text`` is the status
text's line, the supervisor's own (a bar, percent, bytes, rate, ETA), never a child's quoted readout.

The deadline rule (``too_slow``): once the window has passed, a download whose remaining bytes at the rate,
plus TOO_SLOW_MARGIN of that, need longer than the time left before the deadline cannot make it. The rate
it is judged on (``judged_rate``) is the better of the windowed one and the average since the download began to
move, so that a short stall of the link, or a pause with no bytes at all (curio checks each file's blake2b before
the next: minutes on a 45 GiB file) does not read as a slow link; a link that slowed for good shows in the window
soon enough. Never decided without a total, before the window, on a window that moved less than MOVING_MIN_B_S a
second: that is no rate but silence (a line of output, the spawn's own setup writes), the stall watch's; judged as
a rate, an attempt whose first byte came late was given up at a few bytes a second.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..text.show import fmt_bytes, span


class ProgressReading(NamedTuple):
    """What a command's own output says of its download in this attempt (an output parser's ``progress()``)."""

    in_flight_bytes: int  # of the file under way (not complete yet)
    done_bytes: int  # of the files it completed in this attempt, and in_flight_bytes
    done_files: int  # files it completed, or found complete, in this attempt
    # Files it said it threw away to fetch again (a digest that did not match), and their bytes as far as it
    # said them (0 where it never gave a file's size): what was got of them is no progress (progresswatch.py).
    restarts: int = 0
    thrown_bytes: int = 0

# The rate is the bytes gained over about this long (shorter where the observation window is shorter).
RATE_WINDOW_S = 60.0
# A download that moves less than this a second moves nothing: what its processes write of their output (a line a
# second: aria2c's retries and its NOTICE, curio's go-log), and the spawn's own setup writes (a child's wchar is 7
# before it runs), are below it; a link that could make any deadline is far above it (45 GiB at 1 KiB/s: 18 months).
MOVING_MIN_B_S = 1024.0
# What a download must have in hand beyond its ETA: a rate that wobbles, the checksum after each file.
TOO_SLOW_MARGIN = 0.10
# The status line's bar, in characters.
BAR_WIDTH = 30


@dataclass(frozen=True)
class Progress:
    done_bytes: int
    total_bytes: int | None
    rate_bytes_s: float | None  # None: not measured yet (under two samples)
    eta_s: float | None  # None: no total, or no rate
    files_done: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The phase's ``progress`` object (status --json): exactly these keys."""
        return {"done_bytes": self.done_bytes, "total_bytes": self.total_bytes,
                "rate_bytes_s": None if self.rate_bytes_s is None else round(self.rate_bytes_s, 1),
                "eta_s": None if self.eta_s is None else round(self.eta_s, 1), "files_done": self.files_done}


class RateWindow:
    """(time, bytes done) samples of one attempt: the rate over the last ``window_s``, and since the first."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._first: tuple[float, int] | None = None

    def add(self, at: float, done: int) -> None:
        if self._first is None:
            self._first = (at, done)
        self._samples.append((at, done))
        # Keep one sample at or before the window's start: the rate spans the whole window.
        while len(self._samples) > 2 and self._samples[1][0] <= at - self.window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Bytes a second over the window (None: under two samples, no time between them)."""
        return _rate(self._samples[0], self._samples[-1]) if self._samples else None

    def average(self) -> float | None:
        """Bytes a second since the first sample."""
        return _rate(self._first, self._samples[-1]) if self._first is not None and self._samples else None

    def covered(self) -> float:
        """Seconds from the first sample to the latest (0: none yet)."""
        return self._samples[-1][0] - self._first[0] if self._first is not None and self._samples else 0.0

    def since(self, at: float) -> None:
        """Forget the samples before ``at``: the rate and the average count from the first one kept."""
        while self._samples and self._samples[0][0] < at:
            self._samples.popleft()
        self._first = self._samples[0] if self._samples else None


def _rate(a: tuple[float, int], b: tuple[float, int]) -> float | None:
    if b[0] - a[0] <= 0:
        return None
    return max(0.0, (b[1] - a[1]) / (b[0] - a[0]))


def figures(done: int, total: int | None, rate: float | None, files_done: int | None = None) -> Progress:
    """The figures from what is done, the expected total (None: unknown) and the rate. A rate below MOVING_MIN_B_S
    moves nothing (the deadline rule's word too) and gives no time left: the few bytes a download's processes
    write before its first byte (the shell's, a line of output) read "2B/s, ETA 5690h" in status and /metrics."""
    if total is not None:
        total = max(total, done)  # an estimate that was too low: what is done is the least the total is
    eta = None
    if total is not None and rate is not None and rate >= MOVING_MIN_B_S:
        eta = (total - done) / rate
    elif total is not None and done >= total:
        eta = 0.0
    return Progress(done, total, rate, eta, files_done)


def judged_rate(window: RateWindow) -> float | None:
    """The rate the deadline rule judges on: the better of the window's and the average (the module's docstring);
    None while the window moved less than MOVING_MIN_B_S a second (no rate: silence is the stall watch's)."""
    rate = window.rate()
    if rate is None or rate < MOVING_MIN_B_S:
        return None
    average = window.average()
    return rate if average is None else max(rate, average)


def too_slow(progress: Progress, rate: float | None, time_left_s: float, deadline_said: str) -> str | None:
    """Why this download cannot make its deadline (the verdict's detail), or None: it still can, or it is
    not known. ``rate``: the rate it is judged on; ``time_left_s``: until the deadline (may be below 0)."""
    if progress.total_bytes is None or rate is None or rate <= 0:
        return None
    left = progress.total_bytes - progress.done_bytes
    if left <= 0:
        return None
    needs = left / rate
    if needs * (1 + TOO_SLOW_MARGIN) <= time_left_s:
        return None
    return (f"{fmt_bytes(left)} left at {fmt_bytes(int(rate))}/s: {span(needs)}, "
            f"{span(max(0.0, time_left_s))} left before {deadline_said}")


def progress_text(progress: Any) -> str | None:
    """The status text's progress line for a phase's ``progress`` object (None: nothing to draw):
    ``[#########.....] 31% 15.5GiB/50.0GiB 12.0MiB/s ETA 48m10s``."""
    if not isinstance(progress, dict) or not isinstance(progress.get("done_bytes"), int):
        return None
    done, total = progress["done_bytes"], progress.get("total_bytes")
    rate, eta = progress.get("rate_bytes_s"), progress.get("eta_s")
    if isinstance(total, int) and total > 0:
        frac = min(1.0, done / total)
        filled = int(frac * BAR_WIDTH)
        head = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {frac * 100:.0f}% {fmt_bytes(done)}/{fmt_bytes(total)}"
    else:
        head = f"{fmt_bytes(done)} of an unknown total"
    speed = f" {fmt_bytes(int(rate))}/s" if isinstance(rate, int | float) else " rate ?"
    until = f" ETA {span(eta)}" if isinstance(eta, int | float) else ""
    files = progress.get("files_done")
    files_said = f", {files} file(s) complete" if isinstance(files, int) else ""
    return f"{head}{speed}{until}{files_said}"
