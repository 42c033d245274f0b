"""The clock, injectable: what reads the time asks a Clock, so a test can move time by hand.

``monotonic`` measures durations (deadlines, backoffs, stall windows: immune to a clock that is stepped);
``time`` stamps what a person reads (since when, status.json). Production uses ``SYSTEM_CLOCK``; the phase's
timing rules are tested in-process with a clock a test advances (tests/fakes.py FakeClock), as Pebble's
servstate tests do.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The machine's clocks: the builtins themselves (asked on every event, so no call of ours in between)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


SYSTEM_CLOCK = SystemClock()
