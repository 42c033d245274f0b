"""What the reporter knows of the manager's own view of this instance (rowwatch.py reads it on the sender's
thread; this hears it on the loop's): the latest row, a kill, a registration again.

A killed row is the manager's final word: it is remembered like a give-up (givenup.py: a restart must not
run the instance again, since a lifecycle call of it could un-kill the row), said in one line with the manager's
``kill_reason`` and ``killed_at`` (the supervisor's log, the manager's setup log, status), and the
lifecycle is stopped (``stop_lifecycle``, which the composition root sets: observers.py, EXIT_KILLED). After a
registration again for a forgotten uuid, what was pushed under the old one goes again under the new one,
once (repush.py).

Who hears the row, in this order: the instance's clocks (``first_seen``: the manager's own times, once its row
says them; and that the manager's fleet no longer lists the row, whose clocks then stop), then the plugin's
listeners (``on_row``, in the order it added them). Who hears a kill: the plugin's
listeners first (``on_killed``: its give-up must not answer a killed row, so it hears the kill before the
lifecycle's stop could tell it of a shutdown), then ``stop_lifecycle``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..text import Log
from .callkinds import LOG
from .repush import REPUSH_CALLS, RecentLines, repush_text
from .row import Row
from .rowwatch import RowReading

if TYPE_CHECKING:
    from ..state.firstseen import FirstSeen
    from .outbox import Outbox


class HearsTheRow(Protocol):
    """What the sender tells, on the loop's thread, of the manager's own view (ManagerView, below)."""

    def heard_row(self, reading: RowReading) -> None: ...  # each look-up of our row

    def heard_kill(self, row: Row) -> None: ...  # the row said killed: once

    def registered_again(self, old: str, new: str) -> None: ...  # ``old`` forgotten, registered as ``new``


class Unheard:
    """Nobody hears the row (a sender in a test of its calls)."""

    def heard_row(self, reading: RowReading) -> None:
        pass

    def heard_kill(self, row: Row) -> None:
        pass

    def registered_again(self, old: str, new: str) -> None:
        pass


class ManagerView:
    def __init__(self, log: Log, push_text: Callable[[str, str], None], retire: Callable[[str], None],
                 outbox: Callable[[], Outbox | None]) -> None:
        self._log, self._push_text, self._retire, self._outbox = log, push_text, retire, outbox
        self.row: RowReading | None = None  # the latest look-up
        self.killed: Row | None = None
        self.recent = RecentLines()  # the supervisor's own last lines
        self.first_seen: FirstSeen | None = None  # the instance's clocks (the composition root sets it)
        self.stop_lifecycle: Callable[[Row], None] | None = None  # a kill's end (the composition root sets it)
        self._plugin_rows: list[Callable[[Row], None]] = []  # the plugin's (ManagerLink.on_row)
        self._plugin_kills: list[Callable[[Row], None]] = []  # the plugin's (ManagerLink.on_killed)
        self.deadlines: dict[str, float] = {}  # clock name → how long after it the manager kills (status shows it)

    def on_row(self, listener: Callable[[Row], None]) -> None:
        """The plugin hears each row read, after the clocks."""
        self._plugin_rows.append(listener)

    def on_killed(self, listener: Callable[[Row], None]) -> None:
        """The plugin hears a kill, before the lifecycle is stopped."""
        self._plugin_kills.append(listener)

    def heard_row(self, reading: RowReading) -> None:
        self.row = reading
        if reading.row is None:
            if reading.unlisted and self.first_seen is not None:  # (forgotten: no clock of the manager's runs)
                self.first_seen.heard_unlisted()
            return
        if self.first_seen is not None:
            self.first_seen.heard_row(reading.row)
        for listener in self._plugin_rows:
            listener(reading.row)

    def heard_kill(self, row: Row) -> None:
        self.killed = row
        line = row.kill_line()
        self._log(f"manager: {line}; nothing that could un-kill it goes out (no lifecycle call, no registration)")
        self._retire(line)
        self._push_text("setup", f"prover-supervisor: {line}")
        for listener in self._plugin_kills:
            listener(row)
        if self.stop_lifecycle is not None:
            self.stop_lifecycle(row)

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
