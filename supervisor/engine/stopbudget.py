"""A stop signal from outside is obeyed within a budget: ``docker stop`` sends SIGKILL 10 s after its SIGTERM.

Vast stops an instance with ``docker stop`` (podman's is the same), whose timeout it chooses: 10 s unless
told. A child's ``stop_grace_s`` (30 s by default, 60 s for curio) does not fit in that, and a supervisor
SIGKILLed at 10 s loses its whole exit: no "exiting with status" line, no termination log, no exit flush,
exit 137. So a stop signal that comes while the lifecycle runs gives the whole stop, the exit included,
``[supervisor] stop_budget_s`` (8 s) from the moment it came (its handler notes it: the loop may act on it
later, held by a start waiting for its exec):

- the state (status.json) and the termination log are written at once, before any grace runs (the
  give-up, if one is due, is in the outbox already: the shutdown's listeners queue it);
- the children's stop gets the budget less ``EXIT_SHARE_S``, shared out between its waves: each child's
  grace is its own, or its wave's share of what is left if that is shorter (a wave done early leaves
  more for the next); past the budget less ``CLOSE_S * 2`` a tree that survives SIGKILL is not waited for;
- the exit flush gets what is left until ``CLOSE_S`` before the end (``flush_deadline``; exitflush.py's
  ``within_budget``), its finish included (the sender's end, the shippers' last push: their minimum counts
  inside the budget), the console's last lines what is left then, less half of it (``console_s``);
- one line, before "exiting with status N", says what was cut short.

A stop the supervisor decides itself (a failure, the lifecycle done) has no budget: graces and the flush
are as configured. A second stop signal still kills at once; a stop signal during a stop the supervisor
began itself kills at once too, and gives the rest of the exit (a stuck tree's wait, the sweep, the flush)
the budget from that signal: docker stop's SIGKILL comes at its timeout whoever began the stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Of the budget, what the exit after the children keeps: the sweep, the state, the termination log, the flush.
EXIT_SHARE_S = 2.0
# What the exit keeps after the flush, to close what it opened and exit.
CLOSE_S = 0.5
# The exit's sweep goes on at least this long whatever is left of the budget (a round that kills).
SWEEP_MIN_S = 0.1
# A share this close to a child's own grace is its own grace: the microseconds between the signal and the stop's
# start are no cut (a 6 s grace under an 8 s budget read "6s → 6.0s", cut short).
GRACE_SLACK_S = 0.01
# How many children a cut-short line names (1,000 daemons are one count, not 1,000 names).
NAMED_MAX = 3


class StopBudget:
    """One stop's budget, from the stop signal that set it (monotonic seconds on ``clock``)."""

    def __init__(self, budget_s: float, signame: str, clock: Callable[[], float] = time.monotonic,
                 since: float | None = None) -> None:
        """``since``: when the signal came (monotonic), if the loop acted on it later (it was held: a start
        waiting for its exec); docker's SIGKILL counts from then."""
        self.budget_s, self.signame, self._clock = budget_s, signame, clock
        now = clock()
        self.deadline = (now if since is None else min(since, now)) + budget_s
        self.children_deadline = self.deadline - min(EXIT_SHARE_S, budget_s / 4)
        self.wait_until = self.deadline - 2 * CLOSE_S  # a tree that survives SIGKILL: waited for until then
        self._cut: dict[str, tuple[float, float]] = {}  # child → (its own grace, the grace it got)
        self.killed_now_by: str | None = None  # a second stop signal that ended every grace at once

    def grace(self, label: str, own_s: float, waves_left: int) -> float:
        """The grace of a child whose stop begins now, in a wave with ``waves_left - 1`` more after it."""
        share = max(0.0, self.children_deadline - self._clock()) / max(1, waves_left)
        if share >= own_s - GRACE_SLACK_S:
            return own_s
        self._cut[label] = (own_s, share)
        return share

    def sweep_s(self, own_s: float) -> float:
        """How long the exit's sweep of what is left may go on: its own bound, or what is left until
        ``wait_until`` (a tree stuck in uninterruptible sleep is SIGKILLed in vain: the exit must go on),
        at least one round's worth."""
        return max(SWEEP_MIN_S, min(own_s, self.wait_until - self._clock()))

    def console_s(self, own_s: float) -> float:
        """How long the console's last lines may hold the exit (a stdout that does not drain: a log driver that
        blocks): its own bound, or what the budget has left before docker's SIGKILL, less half the closing."""
        return max(0.0, min(own_s, self.deadline - CLOSE_S / 2 - self._clock()))

    def flush_deadline(self) -> float:
        """The latest the exit flush may wait until (monotonic)."""
        return self.deadline - CLOSE_S

    def cut_short(self) -> str:
        """The one line of what the budget cut short (said before "exiting with status N")."""
        head = (f"stop budget {self.budget_s:g}s ({self.signame} from outside: docker stop kills at its timeout, "
                f"10 s unless told; [supervisor] stop_budget_s)")
        flush = max(0.0, self.flush_deadline() - self._clock())
        said = []
        if self._cut:
            named = [f"{label} {own:g}s → {got:.1f}s" for label, (own, got) in list(self._cut.items())[:NAMED_MAX]]
            more = len(self._cut) - len(named)
            said.append("cut short: the grace of " + ", ".join(named) + (f" and {more} more" if more else ""))
        if self.killed_now_by is not None:  # (whatever grace was left then ended there)
            said.append(f"{self.killed_now_by} while stopping ended what grace was left (SIGKILL to everything)")
        return f"{head}: {'; '.join(said) or 'no grace was cut'}; the exit flush gets {flush:.1f}s at most"
