"""A phase's decisions that need no process, from its spec and what it knows: whether it fits in
memory before it starts (told only a HookContext, never the Phase), and what comes after an
attempt. Pure (but for a log line), so tested in-process."""

from __future__ import annotations

import enum

from ..config import PhaseSpec
from ..text import Log
from ..text.units import fmt_bytes
from . import verdict as v
from .backoff import burst_exceeded
from .hooks import HookContext, Refusal
from .verdict import Verdict


class Next(enum.Enum):
    DONE = "done"
    FAIL = "fail"  # for good
    AGAIN = "again"  # another attempt after a backoff (a oneshot's retry, a service's restart)


def after_attempt(spec: PhaseSpec, outcome: Verdict, attempt: int, *, deadline_expired: bool,
                  restart_times: list[float], now: float) -> tuple[Next, str]:
    """What follows the attempt ``outcome`` ended, and why. ``restart_times``: when the service was
    restarted before (monotonic), against its restart_burst."""
    if outcome.reason in v.FOR_GOOD:  # a bug of ours, a GPU gone: another attempt cannot succeed
        why = outcome.detail if outcome.reason == v.INTERNAL_ERROR else f"{outcome.reason}: {outcome.detail}"
        return Next.FAIL, why
    if spec.kind == "oneshot":
        return _retry_or_fail(spec, outcome, attempt, deadline_expired)
    policy = spec.restart
    if policy == "no" or (policy == "on-failure" and outcome.success):
        return Next.DONE if outcome.success else Next.FAIL, f"service ended: {outcome.reason} (restart = {policy!r})"
    if burst_exceeded(restart_times, now, spec.restart_burst, spec.restart_window_s):
        return Next.FAIL, (f"{outcome.reason}; restarted {spec.restart_burst} times within "
                           f"{spec.restart_window_s:g}s (restart_burst): giving up")
    return Next.AGAIN, f"{outcome.reason}; restart = {policy!r}"


def _retry_or_fail(spec: PhaseSpec, outcome: Verdict, attempt: int, deadline_expired: bool) -> tuple[Next, str]:
    if outcome.success:
        return Next.DONE, f"completed in {attempt} attempt(s)"
    if outcome.reason == v.TIMEOUT and deadline_expired:
        return Next.FAIL, f"{outcome.reason}: {outcome.detail}"
    if attempt > spec.retries:
        tries = "no retries configured" if not spec.retries else f"all {spec.retries} retries used"
        return Next.FAIL, f"{outcome.reason} ({tries})"
    return Next.AGAIN, f"{outcome.reason}; retry {attempt} of {spec.retries}"


def memory_preflight(ctx: HookContext, min_memory: int | None) -> dict[str, str] | Refusal:
    """Before the phase's first attempt: its children are told what memory they have, and a phase whose
    ``min_memory`` cannot fit is refused at once."""
    available = ctx.memory_available
    shortfall = memory_shortfall(ctx.phase, min_memory, available, ctx.log)
    if shortfall is not None:
        return Refusal(v.INSUFFICIENT_MEMORY, shortfall)
    return {} if available is None else {"SUPERVISOR_MEMORY_AVAILABLE_BYTES": str(available)}


def capped(available: int | None, cap: int | None) -> int | None:
    """What a phase can have: ``available`` (cgroup limit or MemTotal), at most its memory_max ``cap``."""
    if cap is None:
        return available
    return cap if available is None else min(available, cap)


def too_little_memory(need: int, available: int) -> str:
    """The refusal of a min_memory that does not fit, naming both numbers (the preflight's and fitness's)."""
    return (f"needs min_memory={fmt_bytes(need)} ({need} bytes) but only {fmt_bytes(available)} "
            f"({available} bytes) is available (cgroup limit, MemTotal or the phase's memory_max)")


def memory_shortfall(name: str, need: int | None, available: int | None, log: Log) -> str | None:
    """Why a phase that needs ``need`` bytes (min_memory) cannot fit in ``available``, or None (it fits,
    or either is unknown): refused at once rather than OOM-killed 10 minutes in."""
    if need is None:
        return None
    if available is None:
        log(f"phase {name}: memory preflight skipped: neither a cgroup limit nor MemTotal readable")
        return None
    if available < need:
        return too_little_memory(need, available)
    log(f"phase {name}: memory preflight ok: {fmt_bytes(available)} available, min_memory {fmt_bytes(need)}")
    return None
