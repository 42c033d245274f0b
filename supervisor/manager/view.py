"""What the reporter knows of the manager's own view of this instance (rowwatch.py reads it on the sender's
thread; this hears it on the loop's): the latest row, a kill, a registration again.

A killed row is the manager's final word: it is remembered like a give-up (givenup.py: a restart must not
run the instance again, since a lifecycle call of it could un-kill the row), said in one line with the manager's
``kill_reason`` and ``killed_at`` (the supervisor's log, the manager's setup log, status), and the
lifecycle is stopped by whoever listens (observers.py: EXIT_KILLED). After a registration again for a
forgotten uuid, what was pushed under the old one goes again under the new one, once (repush.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..text import Log
from .callkinds import LOG
from .repush import REPUSH_CALLS, RecentLines, repush_text
from .row import Row
from .rowwatch import RowReading

if TYPE_CHECKING:
    from ..state.firstseen import FirstSeen
    from .outbox import Outbox



class ManagerView:
    def __init__(self, log: Log, push_text: Callable[[str, str], None], retire: Callable[[str], None],
                 outbox: Callable[[], Outbox | None]) -> None:
        self._log, self._push_text, self._retire, self._outbox = log, push_text, retire, outbox
        self.row: RowReading | None = None  # the latest look-up
        self.killed: Row | None = None
        self.row_listeners: list[Callable[[Row], None]] = []
        self.kill_listeners: list[Callable[[Row], None]] = []
        self.recent = RecentLines()  # the supervisor's own last lines
        self.first_seen: FirstSeen | None = None  # the instance's clocks (the composition root sets it)
        self.deadlines: dict[str, float] = {}  # clock name → how long after it the manager kills (status shows it)

    def heard_row(self, reading: RowReading) -> None:
        self.row = reading
        if reading.row is not None:
            for listener in self.row_listeners:
                listener(reading.row)

    def heard_kill(self, row: Row) -> None:
        self.killed = row
        line = row.kill_line()
        self._log(f"manager: {line}; nothing that could un-kill it goes out (no lifecycle call, no registration)")
        self._retire(line)
        self._push_text("setup", f"prover-supervisor: {line}")
        for listener in self.kill_listeners:
            listener(row)

    def registered_again(self, old: str, new: str) -> None:
        """The manager forgot ``old``: what was pushed under it goes again under ``new``, once."""
        outbox = self._outbox()
        if outbox is not None:
            durable = [p.get("text", "") for p in outbox.delivered_payloads(LOG, REPUSH_CALLS)]
            self._push_text("setup", repush_text(old, new, durable, self.recent.lines()))

    def clock(self, name: str) -> tuple[float, str] | None:
        return self.first_seen.clock(name) if self.first_seen is not None else None

    def status(self, mask: Callable[[str], str]) -> dict[str, Any]:
        """For the status view; ``mask``: the manager's words come from outside (a kill_reason), masked here."""
        clocks = self.first_seen.status() if self.first_seen is not None else {}
        for name, clock in clocks.items():
            if name in self.deadlines:
                clock["deadline_s"] = self.deadlines[name]
        row = self.row.to_dict() if self.row is not None else None
        if row is not None:
            row["shown"] = mask(row["shown"])
            if row["row"] is not None and row["row"]["kill_reason"]:
                row["row"]["kill_reason"] = mask(row["row"]["kill_reason"])
        return {"row": row, "killed": mask(self.killed.kill_line()) if self.killed is not None else None,
                "clocks": clocks}
