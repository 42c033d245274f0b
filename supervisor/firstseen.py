"""The instance's own clock: when it first started and when the manager first registered it, kept in
state_dir (statepaths.FIRST_SEEN) across restarts, so a phase's ``progress_deadline_s`` counts from there.

The manager's 90-minute fetch timeout runs from the first registration, whatever the supervisor does: a
restart must not start a fresh deadline (docs/manager.md). Until a registration was answered (or without
a manager) the deadline counts from the first start, which comes before it: the earlier, the safer. Each
time is written once, the first time it is known; a file that cannot be read is started afresh (said).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from . import statepaths
from .atomicfile import read_regular_file, write_atomically

# The file holds two numbers; anything bigger is not ours.
FIRST_SEEN_MAX_BYTES = 4096
FIRST_START = "first_start"
FIRST_REGISTERED = "first_registered"


class FirstSeen:
    """The two times (epoch seconds), loaded at start; the first start written at once if it was not known."""

    def __init__(self, state_dir: Path, log: Callable[[str], None], now: Callable[[], float] = time.time) -> None:
        self._path = statepaths.path(state_dir, statepaths.FIRST_SEEN)
        self._log, self._now = log, now
        self._times = self._load()
        if FIRST_START not in self._times:
            self._times[FIRST_START] = now()
            self._save()

    def anchor(self) -> tuple[float, str]:
        """Where a deadline counts from, and what that is (for the verdict): the first registration, or start."""
        if FIRST_REGISTERED in self._times:
            return self._times[FIRST_REGISTERED], "the first registration"
        return self._times[FIRST_START], "the first start"

    def registered(self) -> None:
        """The manager answered a registration (now, or one kept from an earlier start): the first counts."""
        if FIRST_REGISTERED not in self._times:
            self._times[FIRST_REGISTERED] = self._now()
            self._save()

    def _load(self) -> dict[str, float]:
        try:
            raw = json.loads(read_regular_file(self._path, FIRST_SEEN_MAX_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._log(f"first-seen: cannot read {self._path} ({exc}): deadlines count from this start")
            return {}
        if not isinstance(raw, dict):
            return {}
        return {k: float(raw[k]) for k in (FIRST_START, FIRST_REGISTERED)
                if isinstance(raw.get(k), int | float) and not isinstance(raw.get(k), bool)
                and math.isfinite(raw[k]) and raw[k] > 0}

    def _save(self) -> None:
        try:
            write_atomically(self._path, json.dumps(self._times).encode())
        except OSError as exc:  # a full or read-only state_dir costs the memory across restarts, not the run
            self._log(f"first-seen: cannot write {self._path} ({exc.strerror or exc}): a restart counts afresh")
