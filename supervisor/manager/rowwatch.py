"""The look-ups of this instance's row in the manager (manager/row.py), made on the outbox's sender thread.

The row is evidence, never a reason to wait: one attempt each, bounded like every call (the client's
total deadline, an answer of at most STATUS_MAX_BYTES), and one that fails (a manager without
``GET /status``, down, answering garbage) leaves the call it came before to go as it would have. So does
one that meets a bug of ours while reading the answer: it is no usable answer, never the call's failure,
and the bug is said (``on_bug``: with its traceback, by the loop's faults). The sender (sender.py) reads
the row:

- once the manager knows the instance (registered now, or a uuid kept from an earlier start): its
  ``registered_at`` anchors the fetch deadline, a plugin's fields (RowFields) what the plugin decides;
- before each lifecycle call (a CallKind with ``checks_row``: ``param-done``, ``running``, a plugin's):
  a killed row gets none of them, since a lifecycle call could un-kill it (the prover's, with a passing rate);
  and right after each is delivered (unless another is next: its own read serves): where it moved the row,
  with the manager's time of it (the clocks that count from it, status), and a kill its answer meant (the
  give-up's);
- every ``row_check_s`` while nothing else is being delivered (the manager kills on its own, and
  forgets, at any time), and as often while a call waits between its tries (a log push its log route
  refuses, a Retry-After of minutes): a kill is learnt within that time, in production too.

The row read is the one way to learn of the manager's own decisions (its UI's kill, a forget) before the next
lifecycle call, so a watch that cannot read it says so, as every watch does (evidence/watchstate.py): its
first failed read at once, again when the cause changes (a 404, then an answer over the size cap), and a
line when it reads again; ``state`` keeps it (RowWatch.read hands the lines over with the notes).

``gone`` asks ``GET /runner-id``, the one route that tells a forgotten uuid (404 ``instance not found``; a
404 of another text, a route that is not there, says nothing) from a killed one (200:
the manager still has the row): the same 404 ``instance not found or already killed`` of ``/running``
means either. A note on a row (a time from the future) is said once per watch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..evidence.watchstate import WatchState
from ..text.show import cut, summary
from .client import ManagerClient, PermanentError, TransientError, error_cause
from .row import CLOCK_OFFSET_MIN_S, NO_ROW_FIELDS, STATUS_MAX_BYTES, Row, RowError, RowFields, RowNote, find_row

# What the manager answers (with 404) on any call naming a uuid it does not know (shared/domain/manager-api.md).
UNKNOWN_INSTANCE = "instance not found"

# A look-up that got no usable answer after this long (a manager or a route that black-holes, a deadline run out)
# would hold each call up as long again: the next is not tried for FAILED_AGAIN_S (the calls go meanwhile). One
# that failed sooner (an error answer, a refused connection) cost nothing, and the next is tried as usual: one 500
# must not leave the lifecycle calls unchecked for half a minute, in which a passing bench-done un-kills a row.
SLOW_FAILURE_S = 1.0
FAILED_AGAIN_S = 30.0
# What the watch cannot see while it is blind, said with its first failed read.
BLIND_MEANS = "the manager's own kill or forget of this instance is learnt only at a lifecycle call's answer meanwhile"

@dataclass(frozen=True)
class RowReading:
    """One look-up: when, the row (None: not listed, or no usable answer), and why there is none."""

    at: float
    row: Row | None
    unlisted: bool  # the manager answered a fleet that does not list this uuid
    error: str | None = None  # no usable answer (the manager down, no such route, garbage)

    @property
    def killed(self) -> bool:
        return self.row is not None and self.row.killed

    def shown(self) -> str:
        """How status says what the manager has of this instance."""
        if self.row is not None:
            return f"state {self.row.state}" + (f" ({self.row.kill_line()})" if self.row.killed else "")
        if self.unlisted:
            return "unknown to the manager (its GET /status does not list this uuid)"
        return f"not read ({self.error})"

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "row": self.row.to_dict() if self.row else None, "unlisted": self.unlisted,
                "error": self.error, "shown": self.shown()}


class RowWatch:
    """Reads the row for the sender (on its thread) and says when the next periodic read is due."""

    def __init__(self, client: ManagerClient, interval_s: float, now: Callable[[], float] = time.time,
                 fields: RowFields = NO_ROW_FIELDS, mono: Callable[[], float] = time.monotonic,
                 on_bug: Callable[[Exception], None] | None = None) -> None:
        # ``now``: the wall clock, the manager's (a reading's time, the row's times); ``mono``: the one the reads
        # are paced on, which a step of the wall clock (NTP, a VM resumed) does not move.
        self._client, self._interval_s, self._now, self._mono = client, interval_s, now, mono
        self._on_bug = on_bug  # who says a bug of ours met reading the row (None: it is raised, never swallowed)
        self._fields = fields  # what a plugin's protocol adds to the row
        self._next_at: float | None = None  # (mono) None: no periodic read until the manager knows us
        self._spare_until: float | None = None  # (mono) no look-up before this: the latest failed slowly
        self._said: set[tuple[Any, ...]] = set()  # what a note was said about (RowNote.about)
        self.latest: RowReading | None = None
        # Its own health: reads only now and then, so blind at its first failed read (no window to wait out).
        self.state = WatchState("row watch", math.inf, clock=mono)

    def soon(self) -> None:
        """The manager knows the instance: read the row now, then every interval."""
        self._next_at = self._mono()

    def due(self) -> bool:
        return self._next_at is not None and self._mono() >= self._next_at

    def due_in(self) -> float | None:
        """Seconds until the next periodic read is due (0: now); None: none until the manager knows us."""
        return None if self._next_at is None else max(0.0, self._next_at - self._mono())

    def read(self, uuid: str) -> tuple[RowReading, list[str]]:
        """One look-up (bounded, one attempt), and the lines to say of it: the notes on it not said before, and
        what the watch says of itself (blind, reading again). Within FAILED_AGAIN_S of one that got no answer
        after SLOW_FAILURE_S or more (a manager black-holed), the call it came before is not held up again."""
        now, mono = self._now(), self._mono()
        if self._next_at is not None:
            self._next_at = mono + self._interval_s
        latest = self.latest
        if latest is not None and self._spare_until is not None and mono < self._spare_until:
            return latest, []
        notes: list[RowNote] = []
        try:
            answer = self._client.request("GET", "/status", max_bytes=STATUS_MAX_BYTES)
            # The row is as of its answer, which may come a whole call deadline after the ask (connect_timeout_s +
            # read_timeout_s have no upper bound): a time written meanwhile is no time from the future.
            now = self._now()
            offset = answer.clock_offset_s or 0.0
            row, notes = find_row(answer.body, uuid, now, self._fields, offset)
            if abs(offset) >= CLOCK_OFFSET_MIN_S:  # (said again only when it moves by a minute)
                way = "behind" if offset < 0 else "ahead of"
                notes.append(RowNote(f"the manager's clock is {abs(offset):.0f}s {way} ours (its answer's Date): "
                                     "its row's times are read on ours", about=("clock", round(offset / 60))))
            reading = RowReading(now, row, unlisted=row is None)
        except (TransientError, PermanentError, RowError) as exc:
            reading = RowReading(now, None, unlisted=False, error=cut(_on_status(str(exc)), 300))
        except Exception as exc:
            reading = RowReading(now, None, unlisted=False, error=self._bug(exc))
        answered_at = self._mono()
        # (a deadline under SLOW_FAILURE_S: a look-up that ran out half of it was slow, as one of a second is)
        slow_failure = reading.error is not None and answered_at - mono >= min(SLOW_FAILURE_S,
                                                                                self._client.deadline_s / 2)
        self.latest, self._spare_until = reading, answered_at + FAILED_AGAIN_S if slow_failure else None
        self._tell(reading)
        new = [note for note in notes if note.about not in self._said]
        self._said.update(note.about for note in new)
        return reading, [*self.state.check(), *new]

    def _tell(self, reading: RowReading) -> None:
        """The watch's own health: a reading, or a miss (blind at once; said again only for another cause)."""
        if reading.error is None:
            self.state.read()
        else:
            self.state.blinded(reading.error, BLIND_MEANS, cause=error_cause(reading.error))

    def _bug(self, exc: Exception) -> str:
        """A bug of ours reading an answer (find_row, a plugin's RowFields): said by ``on_bug``, and the reading is
        no usable answer, like garbage from the manager; the call it came before is not failed for it."""
        if self._on_bug is None:
            raise exc
        self._on_bug(exc)
        return cut(f"GET /status: not read, a bug of ours: {summary(exc)}", 300)

    def gone(self, uuid: str) -> bool | None:
        """Does the manager no longer have this uuid? ``GET /runner-id``: 404 ``instance not found`` yes, 200 no (a
        killed row is kept), None when it cannot be told (down, another answer: a 404 of another text is a route
        that is not there, a proxy's ``404 page not found`` or a manager without /runner-id, which says nothing of
        the row; taken for "gone", it had a killed label registered again)."""
        try:
            self._client.request("GET", f"/runner-id?uuid={quote(uuid, safe='')}")
        except PermanentError as exc:
            return True if unknown_instance(exc) else None
        except TransientError:
            return None
        return False


def unknown_instance(exc: PermanentError) -> bool:
    """The manager's answer to a call naming a uuid it has no row for (not a killed one: that is kept)."""
    return exc.status == 404 and UNKNOWN_INSTANCE in exc.body.lower()


def _on_status(error: str) -> str:
    """An error of the look-up, naming it once: the client's own messages begin with the call already."""
    return error if error.startswith("GET /status") else f"GET /status: {error}"
