"""Restart and retry pacing: small pure functions, easy to test on their own."""

from __future__ import annotations

from collections.abc import Iterable


def backoff_delay(failures: int, base: float, factor: float, cap: float, jitter: float, rand: float) -> float:
    """Seconds to wait before the next try after ``failures`` consecutive failures (1, 2, ...).

    base × factor^(failures-1), capped at ``cap``, then spread by ±``jitter``
    (a fraction) using ``rand`` in [0, 1) so that a fleet restarted together
    does not retry in lockstep. Never negative, never above ``cap``.
    """
    if failures < 1:
        return 0.0
    exponent = min(failures - 1, 64)  # beyond this the cap has long won; avoid float overflow
    raw = min(cap, base * factor**exponent)
    spread = raw * jitter * (2.0 * rand - 1.0)
    return max(0.0, min(cap, raw + spread))


def within_window(times: Iterable[float], now: float, window: float) -> list[float]:
    """The times that fall inside the last ``window`` seconds before ``now``."""
    return [t for t in times if now - t < window]


def burst_exceeded(restart_times: Iterable[float], now: float, burst: int, window: float) -> bool:
    """True when ``burst`` restarts already happened inside the window: no more restarts."""
    return len(within_window(restart_times, now, window)) >= burst
