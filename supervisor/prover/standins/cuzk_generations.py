"""Which build of cuzk-daemon the stand-in plays, and what ``[synthesis] partition_workers`` does in each.

``STANDIN_CUZK_GENERATION``: ``unified`` (the default: daemons from 13 Mar 2026) or
``partition-workers`` (alias ``feb-2026``: the builds from Feb to 13 Mar 2026, the seeds' image).
Those have NO status API: ``status_listen`` is a key they do not know, ignored like every unknown
key, so ready can only mean a connect to listen; ``[memory] total_budget`` is ignored and
``[synthesis] partition_workers`` (default 1 here) is obeyed: at most pw proofs synthesize at once,
each at a peak of ``STANDIN_PW_BASELINE`` + ``STANDIN_PW_PER_WORKER`` × pw (default 69 GiB + 20 GiB
× pw, logged at start); with ``STANDIN_DAEMON_MEMORY`` (size) set below that peak the daemon is
SIGKILLed at its first synthesis, as the seeds' instance was OOM-killed. ``[memory] pinned_budget``
and ``working_memory_budget`` are logged, nothing more.

A unified build warns about ``partition_workers`` and ignores it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from . import knobs

GIB = 1024**3
UNIFIED_GENERATION = "unified"
PW_GENERATION = "partition-workers"
GENERATION_ALIASES = {"unified": UNIFIED_GENERATION, "partition-workers": PW_GENERATION, "feb-2026": PW_GENERATION}
PW_BASELINE = 69 * GIB
PW_PER_WORKER = 20 * GIB
# Not in the facts: the stand-in's own choice when the key is absent.
DEFAULT_PARTITION_WORKERS = 1
# What a partition-workers build logs of the [memory] keys it knows.
LOGGED_MEMORY_KEYS = ("pinned_budget", "working_memory_budget")


def generation() -> str:
    raw = os.environ.get("STANDIN_CUZK_GENERATION", "").strip().lower() or UNIFIED_GENERATION
    if raw not in GENERATION_ALIASES:
        raise knobs.UsageError(f"STANDIN_CUZK_GENERATION={raw!r}: expected unified, partition-workers or feb-2026")
    return GENERATION_ALIASES[raw]


def ignore_partition_workers(synthesis: dict[str, Any], log: Callable[[str, str], None]) -> None:
    """A unified build's ``partition_workers``: warned about and ignored, as the real one does."""
    if synthesis.get("partition_workers") is not None:
        log("warn", "[synthesis] partition_workers is deprecated and ignored; "
                    "memory is governed by [memory] total_budget")


class PartitionWorkers:
    """A partition-workers build's synthesis: at most ``count`` proofs at once, each at the memory peak."""

    def __init__(self, synthesis: dict[str, Any]) -> None:
        count = synthesis.get("partition_workers", DEFAULT_PARTITION_WORKERS)
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"invalid [synthesis] partition_workers {count!r}")
        self.count = count
        self.slots = threading.Semaphore(count)

    def peak(self) -> int:
        base = knobs.env_size("STANDIN_PW_BASELINE", PW_BASELINE)
        per = knobs.env_size("STANDIN_PW_PER_WORKER", PW_PER_WORKER)
        return base + per * self.count

    def synthesize(self, stop: threading.Event, seconds: float, on_oom: Callable[[str], None]) -> bool:
        """Wait for a slot, then synthesize for ``seconds``; False when a shutdown cut it short."""
        while not self.slots.acquire(timeout=0.02):
            if stop.is_set():
                return False
        try:
            self._oom_if_over_memory(on_oom)
            return not stop.wait(seconds)
        finally:
            self.slots.release()

    def _oom_if_over_memory(self, on_oom: Callable[[str], None]) -> None:
        """The seeds' failure: a peak above the machine's memory gets the daemon OOM-killed mid-proof."""
        machine = knobs.env_size("STANDIN_DAEMON_MEMORY", 0)
        if machine and self.peak() > machine:
            on_oom(f"peak={self.peak()} memory={machine}")
            os.kill(os.getpid(), signal.SIGKILL)
