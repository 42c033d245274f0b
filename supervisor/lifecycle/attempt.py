"""One attempt of a phase, as a record made afresh for each (number 0: before the first).

Beside the phase's state (supervisor/lifecycle/states.py) this is all an attempt knows: when it began, its
children in start order, the start of its children under way (starting.py) and its output parser,
when its service came up, whether its children are all stopped, and what ended it (or the
supervisor's own bug that did). A new attempt starts with a new record, so nothing of the last one
can leak into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import ChildSpec
from ..engine.process import Child
from ..evidence.progresswatch import ProgressWatch
from .hooks import OutputParser, ProgressReading, ReadsProgress
from .starting import AttemptStart
from .verdict import Verdict


@dataclass
class Attempt:
    number: int  # 1, 2, ...; 0 before the first
    started: float  # monotonic (the phase's clock): when it began
    children: list[Child] = field(default_factory=list)  # in start order
    outcome: Verdict | None = None  # what ended it (or refused the next one: prepare, a deadline in backoff)
    up_at: float | None = None  # monotonic: when its service came up (command running, ready check passed)
    stop_over: bool = False  # its children are all stopped: what ended it decides what comes next
    broken: Verdict | None = None  # a bug of the supervisor's own failed it (internal_error)
    parser: OutputParser | None = None  # the reader of its command's output (the output hook's)
    progress: ProgressWatch | None = None  # its progress figures (a phase with progress_total)
    start: AttemptStart | None = None  # its children being started in order (daemons, readiness, command)

    def command(self, spec: ChildSpec) -> Child | None:
        """Its child started for ``spec`` (the phase's command), if started yet."""
        return next((c for c in self.children if c.spec is spec), None)

    def ran_for(self, now: float) -> float:
        return now - self.started

    def cancel_start(self) -> None:
        """No more of its children is started, and no readiness answer is heard any more."""
        if self.start is not None:
            self.start.cancel()

    def mark_stopped_for(self, reason: str, detail: str) -> None:
        """The verdicts of its children about to be stopped say why (unless one already does)."""
        for child in self.children:
            if child.stop_reason is None:
                child.stop_reason, child.stop_detail = reason, detail

    def progress_reading(self) -> ProgressReading | None:
        """What its command's output parser read of the download (a result that ReadsProgress), if any."""
        result = self.parser.result if self.parser is not None else None
        return result.progress() if isinstance(result, ReadsProgress) else None

    def drain(self) -> None:
        """Read what its children already printed (output waiting in a pipe is a sign of life)."""
        for child in self.children:
            child.drain_output()

    def roots(self) -> list[tuple[int, str]]:
        """Its children's pids and tags: the trees whose I/O is its sign of life (iowatch.py)."""
        return [(c.pid, c.tag) for c in self.children]

    def last_outputs(self) -> list[float]:
        """When each of its children last printed (monotonic), those that ever did."""
        return [c.output.last_output_at for c in self.children if c.output.last_output_at]
