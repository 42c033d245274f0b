"""The exit flush: how long the supervisor's exit waits for the manager to hear the last of it.

When the lifecycle is over the outbox may still hold calls: the failure's reason lines, a call the
exit must wait for (queued with ``exit_waits_for``: the prover's give-up), the "exiting" line. The
exit waits for them while the loop runs (``EventLoop.run_until``): the sender's retries and answers
are handed back into the loop, signals keep their meaning and the status socket answers. Its start cuts
short the wait of a call being retried (Reporter.stop: the sender's backoff grows to 30 s, longer than
the flush): the manager, if back, hears at once, and one that is still away fails the attempt, so the
stall rule below ends the flush after EXIT_STALL_S instead of its whole window. It waits:

- until the outbox is empty, or EXIT_FLUSH_S at most, and only EXIT_STALL_S once no call went out
  for that long and an attempt failed since: a manager that is down does not hold up ``docker stop``
  (what is left stays in the outbox for the next start), and one that is slow but answers is waited
  for (its calls take seconds each; none failed);
- for a call the exit must wait for (``giving_up``), GIVE_UP_FLUSH_S with no stall rule: an instance
  given up that the manager never hears of is paid for until its timeout, and no ``docker stop``
  deadline runs; once it is delivered, what is left waits as above (EXIT_FLUSH_S more at most): a log
  push whose route fails, that it went ahead of (manager/sender.py), held the exit the whole window;
- after a stop signal during the flush, FLUSH_AFTER_TERM_S more at most (``docker stop``'s
  SIGKILL follows 10 s after its SIGTERM), counted from when it came: one that came during the exit's sweep
  before it (the loop did not run) is taken as the flush begins; a second stop signal ends it now.

Then the finish: the sender's end and the log shippers' last push, FINISH_MIN_S at least, past the
deadline if need be; under a stop budget (stopbudget.py: a stop signal's, from the lifecycle or during
the flush) never past CLOSE_S before its end, the minimum included: docker stop's SIGKILL comes there.

Either way the exit status is the one the lifecycle decided, never 128 + the signal that cut the
flush short: the lifecycle was already over when it came.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .stopbudget import CLOSE_S

EXIT_FLUSH_S = 10.0
EXIT_STALL_S = 2.0
GIVE_UP_FLUSH_S = 60.0
FLUSH_AFTER_TERM_S = 5.0
# The sender announces no delivery on any fd: the loop looks at the outbox at least this often.
FLUSH_POLL_S = 0.05
# Once the outbox is done: the log shippers' last push and the sender's end get at least this long.
FINISH_MIN_S = 0.5


class ExitFlush:
    """One exit's wait for the outbox: its deadline, its stall rule, and what a stop signal does to it."""

    def __init__(self, pending: Callable[[], int], sender_alive: Callable[[], bool], status: int,
                 giving_up: bool, clock: Callable[[], float] = time.monotonic,
                 failures: Callable[[], int] = lambda: 0, waited_for: Callable[[], bool] = lambda: True) -> None:
        self.status = status
        self.giving_up = giving_up
        self._waited_for = waited_for  # the call the exit waits for is still pending (while giving_up)
        self._pending = pending
        self._sender_alive = sender_alive
        self._clock = clock
        now = self.began = clock()
        self.window_s = GIVE_UP_FLUSH_S if giving_up else EXIT_FLUSH_S
        self.deadline = now + self.window_s
        self._left = pending()
        self._progress_at = now
        self._failures = failures  # the sender's failed attempts so far: one since the progress makes a stall
        self._failures_then = failures()
        self.ended_by: str | None = None  # the second one, that ended it
        # When docker stop's SIGKILL is due (monotonic), under a stop budget (stopbudget.py): nothing of the flush,
        # the finish's minimum included, goes on past CLOSE_S before it.
        self.budget_end: float | None = None
        self._finish_floor = 0.0  # the finish's minimum end (FINISH_MIN_S after the wait), once it began

    def over(self) -> bool:
        """The outbox is empty, or nobody delivers it any more, or the wait is up."""
        if self.time_is_up() or not self._sender_alive():
            return True
        left = self._pending()
        if not left:
            return True
        now = self._clock()
        if self.giving_up and not self._waited_for():  # delivered: the rest waits as in any exit
            self.giving_up = False
            self.deadline = min(self.deadline, now + EXIT_FLUSH_S)
            self._progress_at, self._failures_then = now, self._failures()
        if left < self._left:
            self._left, self._progress_at, self._failures_then = left, now, self._failures()
        stalled = now - self._progress_at > EXIT_STALL_S and self._failures() > self._failures_then
        return not self.giving_up and stalled

    def time_is_up(self) -> bool:
        return self.ended_by is not None or self._clock() >= self.deadline

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - self._clock())

    def within_budget(self, end: float) -> None:
        """A stop budget ends at ``end`` (monotonic: docker stop's SIGKILL): the flush ends CLOSE_S before it."""
        self.budget_end = end if self.budget_end is None else min(self.budget_end, end)
        self.deadline = min(self.deadline, self.budget_end - CLOSE_S)

    def cut(self, signame: str, budget_s: float | None = None, came: float | None = None) -> str:
        """The first stop signal during the flush: FLUSH_AFTER_TERM_S more at most (within a stop budget of
        ``budget_s``, stopbudget.py: what it leaves after its closing), counted from when it ``came`` (monotonic):
        one that came while the exit's sweep held the loop is taken only now, and docker's SIGKILL counts from
        then. Returns the line to say."""
        now = self._clock()
        since = now if came is None else min(came, now)
        if budget_s is not None:
            self.within_budget(since + budget_s)
        self.deadline = min(self.deadline, since + FLUSH_AFTER_TERM_S)
        when = "during the exit flush" if since >= self.began else f"{now - since:.1f}s ago, before the exit flush"
        return (f"{signame} {when}: giving the manager {round(self.seconds_left(), 1):g}s more, "
                f"then exiting with status {self.status}")

    def finish(self) -> None:
        """The wait is over: the sender's end and the log shippers' last push begin now (Reporter.stop)."""
        self._finish_floor = self._clock() + FINISH_MIN_S

    def finish_s(self, own_s: float) -> float:
        """How long a step of the finish whose own bound is ``own_s`` may block: under a stop budget, no later
        than the flush's end in it (a step run inline, with no thread to be had, blocks the exit)."""
        if self.budget_end is None:
            return own_s
        return max(0.0, min(own_s, self.budget_end - CLOSE_S - self._clock()))

    def finished(self) -> bool:
        """The finish is over: at the deadline, or FINISH_MIN_S after its start if that is later (a manager that
        answered the last call within the deadline still gets the shippers' last push), but under a stop budget
        never past CLOSE_S before its end: the minimum is counted inside the budget, not after it."""
        until = max(self.deadline, self._finish_floor)
        if self.budget_end is not None:
            until = min(until, self.budget_end - CLOSE_S)
        return self.ended_by is not None or self._clock() >= until

    def budget_left_s(self) -> float | None:
        """Under a stop budget whose flush deadline has come: how long before the budget's end it is now (docker
        stop's SIGKILL; negative past it). None otherwise."""
        if self.budget_end is None or self._clock() < self.budget_end - CLOSE_S:
            return None
        return self.budget_end - self._clock()

    def end(self, signame: str) -> str:
        """A second stop signal during the flush: no more waiting. Returns the line to say."""
        self.ended_by = signame
        return f"{signame} again during the exit flush: exiting now with status {self.status}"
