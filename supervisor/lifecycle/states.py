"""The states a phase can be in, and every way it moves between them, on one screen.

``Phase.transition`` (supervisor/lifecycle/phase.py) refuses any move not in ``_ALLOWED``; the diagram below
is the same table drawn, and tests/test_phase_states.py walks every cell of it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .verdict import Verdict


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
# RUNNING to the outside while its attempt's record (supervisor/lifecycle/attempt.py) says when it came up; what
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


class PhaseLike(Protocol):
    """What a PhaseView is made from (supervisor.lifecycle.phase.Phase)."""

    spec: Any  # its PhaseSpec: kind, report
    state: PhaseState
    why: str
    attempt: int
    up: bool
    was_up: bool
    parsed: Any

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class PhaseView:
    """A phase as a listener sees it at one transition: a copy, so nothing of the phase can be changed."""

    name: str
    kind: str  # "oneshot" | "service"
    state: PhaseState
    why: str
    attempt: int
    up: bool  # a service whose command runs and answered its ready check
    was_up: bool
    report: str | None  # the phase's ``report`` key: the manager call it triggers
    parsed: Any  # what its output parser read (None: no parser, or not run yet)

    @classmethod
    def of(cls, phase: PhaseLike) -> PhaseView:
        return cls(phase.name, phase.spec.kind, phase.state, phase.why, phase.attempt, phase.up, phase.was_up,
                   phase.spec.report, phase.parsed)


@dataclass(frozen=True)
class ShutdownView:
    """The lifecycle is shutting down: why, with which status, what failed it, and whether production was ever up."""

    why: str
    status: int
    failure: Verdict | None  # the verdict that failed the lifecycle (masked); None: a stop, a completed run, ...
    production_was_up: bool  # the production service (``report = "running"``, else the last service) came up
