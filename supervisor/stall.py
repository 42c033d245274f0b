"""Stall detection: a phase is stalled when every sign of progress has been silent for ``stall_s``.

The signs: a byte of output from any of its processes; a GPU whose utilisation
is non-zero or whose memory use changed (where GPUs are visible); the watched
``progress_path`` growing (a parameter download). The decision is a small pure
object fed with observations, so it is tested without waiting; StallMonitor feeds
it from a running attempt every little while.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .gpu import Gpus, activity_changed
from .loop import ErrorHandler, EventLoop

# How often a phase with stall_s is looked at: often enough to name the stall
# within a second of stall_s, rarely enough to cost nothing.
STALL_CHECK_MAX_S = 0.5
STALL_CHECK_MIN_S = 0.05


def check_interval(stall_s: float) -> float:
    return max(STALL_CHECK_MIN_S, min(STALL_CHECK_MAX_S, stall_s / 10))


@dataclass
class StallWatch:
    stall_s: float
    started: float  # monotonic time the watch began (the attempt's start)
    gpus_visible: bool
    watches_path: bool
    last_output: float = field(init=False)
    last_gpu: float = field(init=False)
    last_progress: float = field(init=False)
    progress_size: int | None = None

    def __post_init__(self) -> None:
        self.last_output = self.last_gpu = self.last_progress = self.started

    def saw_output(self, at: float) -> None:
        self.last_output = max(self.last_output, at)

    def saw_gpu(self, active: bool, at: float) -> None:
        if active:
            self.last_gpu = at

    def saw_progress_size(self, size: int | None, at: float) -> None:
        """The watched path's size now (None: absent). Growth is progress; shrinking is not."""
        size = size or 0
        if self.progress_size is None:
            self.progress_size = size  # the baseline, taken when the watch starts
            return
        if size > self.progress_size:
            self.last_progress = at
        self.progress_size = size  # after a shrink (a bad file deleted), growth counts again

    def stalled(self, now: float) -> str | None:
        """None while any sign is fresh; else what was silent, for the verdict."""
        signs = [("output", self.last_output)]
        if self.gpus_visible:
            signs.append(("GPU activity", self.last_gpu))
        if self.watches_path:
            signs.append(("progress_path growth", self.last_progress))
        if any(now - seen < self.stall_s for _, seen in signs):
            return None
        silent = ", ".join(f"no {what} for {now - seen:.1f}s" for what, seen in signs)
        if not self.gpus_visible:
            silent += " (no GPU visible)"
        return silent


class StallMonitor:
    """Looks every little while, for one attempt, whether output, GPUs and progress_path have all gone
    silent; says so once through ``on_stall`` (what was silent), and stops looking once the attempt
    is no longer ``current()``."""

    def __init__(self, loop: EventLoop, stall_s: float, gpus: Gpus | None, progress_path: str | None, *,
                 last_outputs: Callable[[], list[float]], current: Callable[[], bool],
                 on_stall: Callable[[str], None], on_error: ErrorHandler) -> None:
        self._loop, self._gpus, self._progress_path = loop, gpus, progress_path
        self._last_outputs, self._current, self._on_stall, self._on_error = last_outputs, current, on_stall, on_error
        now = time.monotonic()
        self._last_gpu = gpus.sample() if gpus is not None else []
        self._watch = StallWatch(stall_s, now, gpus_visible=bool(self._last_gpu),
                                 watches_path=progress_path is not None)
        if progress_path is not None:
            self._watch.saw_progress_size(tree_size(progress_path), now)
        self._interval = check_interval(stall_s)
        self._loop.call_later(self._interval, self._check, on_error=on_error)

    def _check(self) -> None:
        if not self._current():
            return
        now, watch = time.monotonic(), self._watch
        for at in self._last_outputs():
            watch.saw_output(at)
        if watch.gpus_visible and self._gpus is not None:
            sample = self._gpus.sample()
            watch.saw_gpu(activity_changed(self._last_gpu, sample), now)
            self._last_gpu = sample
        if self._progress_path is not None:
            watch.saw_progress_size(tree_size(self._progress_path), now)
        silent = watch.stalled(now)
        if silent is None:
            self._loop.call_later(self._interval, self._check, on_error=self._on_error)
        else:
            self._on_stall(silent)


def tree_size(path: str | Path) -> int | None:
    """Bytes under ``path`` (a file or a directory tree); None if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not os.path.isdir(path):
        return st.st_size
    total = 0
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
                    except OSError:
                        continue
        except OSError:
            continue
    return total
