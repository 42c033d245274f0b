"""The states a phase can be in, and every way it moves between them, on one screen.

``Phase.transition`` (supervisor/phase.py) refuses any move not in ``_ALLOWED``; the diagram below
is the same table drawn, and tests/test_phase_states.py walks every cell of it.
"""

from __future__ import annotations

import enum


class PhaseState(enum.StrEnum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # daemons being started and waited for
    RUNNING = "running"  # the command runs
    STOPPING = "stopping"  # the attempt is over; its children are being stopped
    BACKOFF = "backoff"  # waiting before the next attempt
    DONE = "done"  # completed (oneshot exit 0, or a service that ended cleanly)
    FAILED = "failed"  # failed for good
    STOPPED = "stopped"  # ended by a supervisor shutdown


# Every state a phase can be in and every way it moves; Phase.transition refuses any other.
#
#           +----------------------- next attempt ------------------------+
#           v                                                             |
#  PENDING -----> STARTING -----------------> RUNNING                  BACKOFF ---> FAILED   deadline, our bug,
#   | | |  attempt   |    daemons ready,         |                       ^  |                 prepare refused
#   | | |            |    command started        |                       |  +------> STOPPED  shutdown
#   | | |            |                           |                       |
#   | | |            +-------> STOPPING <--------+                       |
#   | | |   spawn failed, not    | | | |    the command or a daemon      |
#   | | |   ready, a daemon      | | | |    ended, deadline, stall,      |
#   | | |   died, deadline,      | | | |    shutdown, our bug            |
#   | | |   stall, shutdown,     | | | |                                 |
#   | | |   our bug              | | | +-------- retry / restart --------+
#   | | |                        | | +-----> DONE     it succeeded (a service: it ended cleanly)
#   | | |                        | +-------> FAILED   no retries left, restart_burst, deadline, our bug
#   | | |                        +---------> STOPPED  supervisor shutdown
#   | | +-----> DONE     resumed: done in an earlier run, and its evidence still holds
#   | +-------> FAILED   memory preflight, prepare refused, our bug
#   +---------> STOPPED  the supervisor shut down before the lifecycle reached it
#
# DONE, FAILED and STOPPED are final. A phase has no flag beside its state: a service that is up stays
# RUNNING to the outside while its attempt's record (supervisor/attempt.py) says when it came up; what
# else the lifecycle decides by (how far it got, the phases it holds at, a shutdown) is the
# Lifecycle's own record, by phase name.
_ALLOWED: dict[PhaseState, set[PhaseState]] = {
    PhaseState.PENDING: {PhaseState.STARTING, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.STARTING: {PhaseState.RUNNING, PhaseState.STOPPING},
    PhaseState.RUNNING: {PhaseState.STOPPING},
    PhaseState.STOPPING: {PhaseState.BACKOFF, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.BACKOFF: {PhaseState.STARTING, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.DONE: set(),
    PhaseState.FAILED: set(),
    PhaseState.STOPPED: set(),
}
FINAL_STATES = frozenset({PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED})
ATTEMPT_RUNS = (PhaseState.STARTING, PhaseState.RUNNING)  # an attempt whose children are not being stopped
