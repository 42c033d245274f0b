"""The manager's own view of this instance: its row in ``GET /status``, read and checked like any answer.

The manager decides things the lifecycle calls never hear of (shared/domain/manager-api.md): it kills a row from its
UI, after 90 min in ``registered`` ("param fetch timeout (90min)") or 45 min in ``params_done``
("benchmark timeout (45min)"), for a bad host or an instance gone from Vast. Its ``GET /status`` lists the
whole fleet, newest runner first, each row with ``uuid, label, runner_id, state, registered_at,
param_done_at, killed_at, kill_reason`` and the fields of the protocol spoken over it (the optional ones left
out when null), its times SQLite's ``CURRENT_TIMESTAMP``: ``YYYY-MM-DD HH:MM:SS``, UTC, whole seconds.

The core reads the generic part of a row; a plugin's protocol declares what it adds (``RowFields``: its
states, times and numbers, through ManagerLink.add_row_fields; the prover's: the benchmark's state, its time
and rate, the min_rate), which is checked the same way and kept in ``Row.extra``.

``find_row`` picks this instance's row out of that answer, holding each field to what the manager
writes: a state of its own (or a plugin's), a time of its format, a number that is finite, a reason of one
bounded line. A time later than now (beyond CLOCK_SKEW_S of two clocks' disagreement) is impossible: it is
dropped, never used as a deadline's anchor, and said (the watch says each such note once). So is a time that
is not one the supervisor can place for sure: not the manager's UTC text, nor ISO 8601 naming its own zone
(``2026-12-01T12:31:00+02:00``, read in that zone: a Go time.Time's JSON); a naive time in any other shape
is not guessed at. A time is what deadlines count from, never what the row says happened: a row refused
whole for one time's form hid its ``killed`` state, and the kill with it. A row that fails its shape
otherwise (its uuid, its state, a number, the reason) is no evidence at all. Pure: the look-up itself is
rowwatch.py's.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..state.firstseen import CLOCK_SKEW_S
from .answers import UUID_RE, answered

KILLED = "killed"
# The core's states: a plugin's (RowFields.states) come between the fetch's end and production.
ROW_STATES = ("registered", "params_done", "running", KILLED)
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # SQLite's CURRENT_TIMESTAMP, UTC
TIME_FIELDS = ("registered_at", "param_done_at", "killed_at")
# The manager's clock may run behind or ahead of ours (its answers' Date says by how much): its row's times are
# read on our clock where the two differ by this much or more. A lag of an hour made a fresh registration read
# as an hour old, and a download whose 90 minutes had just begun was given up as too slow at once. (Less is
# left alone: Date's whole seconds would only move every time by a second of noise.)
CLOCK_OFFSET_MIN_S = 5.0
# Nor before 2024: no manager row was written then (a time of 1970 is a zero, not a registration).
MANAGER_TIME_MIN = 1704067200.0  # 2024-01-01 00:00:00 UTC
# The whole fleet in one answer: 7 days of killed rows included. Far more than 64 KiB, still bounded.
STATUS_MAX_BYTES = 4 * 1024 * 1024
# A kill reason is the manager's one line ("param fetch timeout (90min)"); a longer one is cut.
KILL_REASON_MAX_CHARS = 300
# The longest ISO 8601 time read ("2026-12-01T12:31:00.123456+02:00" is 32): anything longer is not parsed.
ISO_TIME_MAX_CHARS = 40
TIME_FORMS = "YYYY-MM-DD HH:MM:SS UTC, or ISO 8601 with its zone"


class RowError(ValueError):
    """The answer, or our row in it, is not what the manager writes: one line saying what."""


@dataclass(frozen=True)
class RowFields:
    """What a plugin's protocol adds to the row: its states, its times (held to the manager's format, as the
    core's are) and its numbers (finite, from 0 to their maximum), each read into ``Row.extra`` by name."""

    states: tuple[str, ...] = ()
    times: tuple[str, ...] = ()
    numbers: Mapping[str, float] = field(default_factory=dict)  # name → the largest value the manager could hold

    def merged(self, other: RowFields) -> RowFields:
        return RowFields((*self.states, *other.states), (*self.times, *other.times), {**self.numbers, **other.numbers})

    def row_states(self) -> tuple[str, ...]:
        """Every state a row may be in: the core's, with these between the fetch's end and production."""
        return (*ROW_STATES[:2], *self.states, *ROW_STATES[2:])


NO_ROW_FIELDS = RowFields()


@dataclass(frozen=True)
class Row:
    """This instance as the manager has it; a time is epoch seconds (None: not set, or refused). ``extra``: the
    fields a plugin's protocol declared (RowFields), by name; one the row leaves out is None."""

    uuid: str
    state: str
    registered_at: float | None = None
    param_done_at: float | None = None
    killed_at: float | None = None
    kill_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def killed(self) -> bool:
        """Killed by the state, or by the kill's own fields in any state: a call after the kill moves the row on
        (bench-done has no state check: a passing rate turns a killed row back to bench_done, and ``/running``
        then succeeds) while its killed_at and kill_reason stay, and the machine is being destroyed. Only a kill
        sets them, and nothing clears them (shared/domain/manager-api.md)."""
        return self.state == KILLED or self.killed_at is not None or self.kill_reason is not None

    def kill_line(self) -> str:
        """The one line a kill is said in: the manager's reason and when, on our clock, as every time of the row is
        read (its killed_at moved by the manager's clock offset where that is CLOCK_OFFSET_MIN_S or more: the log
        says that offset once), and the state the row was moved to after it, where a call did."""
        when = f" at {utc_text(self.killed_at)} UTC" if self.killed_at is not None else ""
        moved = f" (its row moved to {self.state} after the kill)" if self.state != KILLED else ""
        return f"the manager killed this instance{when}: {self.kill_reason or 'no kill_reason given'}{moved}"

    def to_dict(self) -> dict[str, Any]:
        """The row as status shows it: the plugin's fields beside the core's."""
        fields = asdict(self)
        extra = fields.pop("extra")
        return {**fields, **extra}


class RowNote(str):
    """A field of the row refused (a time from the future), as its line says it; ``about`` is what it is said
    about (uuid, field, value): said once for that, though the line names the moment it was read."""

    about: tuple[Any, ...]

    def __new__(cls, text: str, about: tuple[Any, ...]) -> RowNote:
        note = super().__new__(cls, text)
        note.about = about
        return note


def utc_text(epoch: float) -> str:
    """An epoch time in the manager's format (UTC)."""
    return time.strftime(TIME_FORMAT, time.gmtime(epoch))


def manager_time(value: Any, name: str, now: float, offset_s: float = 0.0) -> float:
    """A row's time (``YYYY-MM-DD HH:MM:SS``, UTC) as epoch seconds on our clock (``offset_s``: the manager's
    clock less ours, taken off where it is CLOCK_OFFSET_MIN_S or more); RowError when it is not one, or when it
    is later than ``now`` beyond CLOCK_SKEW_S (impossible: the manager wrote it in the past). An ISO 8601 time
    naming its zone is read in it."""
    epoch = _utc_text(value)
    if epoch is None:
        epoch = _zoned(value)
    if epoch is None:
        raise RowError(f"{name} is not a time as the manager writes it ({TIME_FORMS}): {answered(value)}")
    if epoch < MANAGER_TIME_MIN:
        raise RowError(f"{name} {value} UTC is before any manager ran: impossible, not used")
    if abs(offset_s) >= CLOCK_OFFSET_MIN_S:
        epoch -= offset_s
    if epoch > now + CLOCK_SKEW_S:
        raise RowError(f"{name} {value} UTC is later than now ({utc_text(now)} UTC): impossible, not used")
    return epoch


def _utc_text(value: Any) -> float | None:
    """The manager's own form (SQLite's CURRENT_TIMESTAMP, UTC) as epoch seconds; None: not that form."""
    if not isinstance(value, str) or len(value) != 19:
        return None
    try:
        return float(calendar.timegm(time.strptime(value, TIME_FORMAT)))
    except ValueError:
        return None


def _zoned(value: Any) -> float | None:
    """An ISO 8601 time that names its zone (``Z``, ``+02:00``) as epoch seconds; None for any other, a naive one
    included: its zone would be a guess, and a guess hours off would put a deadline hours off."""
    if not isinstance(value, str) or not 19 <= len(value) <= ISO_TIME_MAX_CHARS or not value.isascii():
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.utcoffset() is None:
        return None
    try:
        return stamp.timestamp()
    except (OverflowError, OSError, ValueError):  # (a year 1 at -14:00 leaves what an epoch can hold)
        return None


def _number(value: Any, name: str, maximum: float) -> float | None:
    if value is None:
        return None
    refused = RowError(f"{name} is not a number in 0..{maximum:g}: {answered(value)}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise refused
    try:  # JSON's integers have no bound: one of 400 digits is valid, and no float holds it
        number = float(value)
    except OverflowError:
        raise refused from None
    if not math.isfinite(number) or not 0 <= number <= maximum:
        raise refused
    return number


def rows_of(body: Any) -> list[Any]:
    """The fleet's rows: a JSON array (today's manager), or an object holding one under ``instances``."""
    if isinstance(body, dict) and isinstance(body.get("instances"), list):
        return list(body["instances"])
    if isinstance(body, list):
        return body
    raise RowError(f"GET /status answered neither a list of rows nor {{\"instances\": [...]}}: {answered(body)}")


def find_row(body: Any, uuid: str, now: float, fields: RowFields = NO_ROW_FIELDS,
             offset_s: float = 0.0) -> tuple[Row | None, list[RowNote]]:
    """This uuid's row in a ``GET /status`` answer (None: the manager does not list it), and the notes on
    fields refused (a time from the future): the row is used without them. RowError: no usable answer.
    ``fields``: what a plugin's protocol adds to the row, read and checked with the core's; ``offset_s``: the
    manager's clock less ours (its answer's Date), its times read on ours."""
    mine = [r for r in rows_of(body) if isinstance(r, dict) and r.get("uuid") == uuid]
    if not mine:
        return None, []
    if len(mine) > 1:
        raise RowError(f"GET /status lists uuid {uuid} {len(mine)} times")
    return row_from(mine[0], now, fields, offset_s)


def row_from(raw: dict[str, Any], now: float, fields: RowFields = NO_ROW_FIELDS,
             offset_s: float = 0.0) -> tuple[Row, list[RowNote]]:
    uuid = raw.get("uuid")
    if not isinstance(uuid, str) or not UUID_RE.fullmatch(uuid):
        raise RowError(f"a row's uuid is unusable: {answered(uuid)}")
    state = raw.get("state")
    states = fields.row_states()
    if state not in states:
        raise RowError(f"uuid {uuid}: state is not one of {', '.join(states)}: {answered(state)}")
    notes: list[RowNote] = []
    times: dict[str, float | None] = {}
    for name in (*TIME_FIELDS, *fields.times):
        try:
            times[name] = None if raw.get(name) in (None, "") else manager_time(raw[name], name, now, offset_s)
        except RowError as exc:  # (impossible, or not a time: no anchor, but the row's state still counts)
            times[name] = None
            said = str(exc) if "impossible" in str(exc) else f"{exc}: not used"
            notes.append(RowNote(f"the manager's row for {uuid}: {said}", about=(uuid, name, answered(raw[name]))))
    reason = raw.get("kill_reason")
    if reason is not None and not isinstance(reason, str):
        raise RowError(f"uuid {uuid}: kill_reason is not text: {answered(reason)}")
    if reason:
        reason = " ".join(reason.split())
        reason = "".join(c if c.isprintable() else "?" for c in reason)[:KILL_REASON_MAX_CHARS]
    extra: dict[str, Any] = {name: _number(raw.get(name), name, most) for name, most in fields.numbers.items()}
    extra.update((name, times[name]) for name in fields.times)
    return Row(uuid, state, times["registered_at"], times["param_done_at"], times["killed_at"], reason or None,
               extra), notes
