"""The manager's own view of this instance: its row in ``GET /status``, read and checked like any answer.

The manager decides things the lifecycle calls never hear of (manager-api.md): it kills a row from its
UI, after 90 min in ``registered`` ("param fetch timeout (90min)") or 45 min in ``params_done``
("benchmark timeout (45min)"), for a bad host or an instance gone from Vast. Its ``GET /status`` lists the
whole fleet, newest runner first, each row with ``uuid, label, runner_id, state, min_rate, registered_at,
param_done_at, bench_done_at, bench_rate, killed_at, kill_reason`` (the optional ones left out when null),
its times SQLite's ``CURRENT_TIMESTAMP``: ``YYYY-MM-DD HH:MM:SS``, UTC, whole seconds.

``find_row`` picks this instance's row out of that answer, holding each field to what the manager
writes: a state of its five, a time of its format, a number that is finite, a reason of one bounded
line. A time later than now (beyond CLOCK_SKEW_S of two clocks' disagreement) is impossible: it is
dropped, never used as a deadline's anchor, and said (the watch says each such note once). A row that
fails its shape is no evidence at all. Pure: the look-up itself is rowwatch.py's.
"""

from __future__ import annotations

import calendar
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..state.firstseen import CLOCK_SKEW_S
from .answers import UUID_RE, answered

KILLED = "killed"
ROW_STATES = ("registered", "params_done", "bench_done", "running", KILLED)
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # SQLite's CURRENT_TIMESTAMP, UTC
TIME_FIELDS = ("registered_at", "param_done_at", "bench_done_at", "killed_at")
# Nor before 2024: no manager row was written then (a time of 1970 is a zero, not a registration).
MANAGER_TIME_MIN = 1704067200.0  # 2024-01-01 00:00:00 UTC
# The whole fleet in one answer: 7 days of killed rows included. Far more than 64 KiB, still bounded.
STATUS_MAX_BYTES = 4 * 1024 * 1024
STATUS_MAX_TEXT = "4 MiB"
# A kill reason is the manager's one line ("param fetch timeout (90min)"); a longer one is cut.
KILL_REASON_MAX_CHARS = 300
# A min_rate the manager could hold: proofs per hour.
MIN_RATE_MAX = 1e6


class RowError(ValueError):
    """The answer, or our row in it, is not what the manager writes: one line saying what."""


@dataclass(frozen=True)
class Row:
    """This instance as the manager has it; a time is epoch seconds (None: not set, or refused)."""

    uuid: str
    state: str
    min_rate: float | None = None
    registered_at: float | None = None
    param_done_at: float | None = None
    bench_done_at: float | None = None
    killed_at: float | None = None
    kill_reason: str | None = None
    bench_rate: float | None = None

    @property
    def killed(self) -> bool:
        return self.state == KILLED

    def kill_line(self) -> str:
        """The one line a kill is said in: the manager's reason and when, in its own clock's words."""
        when = f" at {utc_text(self.killed_at)} UTC" if self.killed_at is not None else ""
        return f"the manager killed this instance{when}: {self.kill_reason or 'no kill_reason given'}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def utc_text(epoch: float) -> str:
    """An epoch time in the manager's format (UTC)."""
    return time.strftime(TIME_FORMAT, time.gmtime(epoch))


def manager_time(value: Any, name: str, now: float) -> float:
    """A row's time (``YYYY-MM-DD HH:MM:SS``, UTC) as epoch seconds; RowError when it is not one, or when it
    is later than ``now`` beyond CLOCK_SKEW_S (impossible: the manager wrote it in the past)."""
    if not isinstance(value, str) or len(value) != 19:
        raise RowError(f"{name} is not a time as the manager writes it (YYYY-MM-DD HH:MM:SS): {answered(value)}")
    try:
        epoch = float(calendar.timegm(time.strptime(value, TIME_FORMAT)))
    except ValueError:
        raise RowError(f"{name} is not a time as the manager writes it (YYYY-MM-DD HH:MM:SS): "
                       f"{answered(value)}") from None
    if epoch < MANAGER_TIME_MIN:
        raise RowError(f"{name} {value} UTC is before any manager ran: impossible, not used")
    if epoch > now + CLOCK_SKEW_S:
        raise RowError(f"{name} {value} UTC is later than now ({utc_text(now)} UTC): impossible, not used")
    return epoch


def _number(value: Any, name: str, maximum: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= maximum:
        raise RowError(f"{name} is not a number in 0..{maximum:g}: {answered(value)}")
    return float(value)


def rows_of(body: Any) -> list[Any]:
    """The fleet's rows: a JSON array (today's manager), or an object holding one under ``instances``."""
    if isinstance(body, dict) and isinstance(body.get("instances"), list):
        return list(body["instances"])
    if isinstance(body, list):
        return body
    raise RowError(f"GET /status answered neither a list of rows nor {{\"instances\": [...]}}: {answered(body)}")


def find_row(body: Any, uuid: str, now: float) -> tuple[Row | None, list[str]]:
    """This uuid's row in a ``GET /status`` answer (None: the manager does not list it), and the notes on
    fields refused (a time from the future): the row is used without them. RowError: no usable answer."""
    mine = [r for r in rows_of(body) if isinstance(r, dict) and r.get("uuid") == uuid]
    if not mine:
        return None, []
    if len(mine) > 1:
        raise RowError(f"GET /status lists uuid {uuid} {len(mine)} times")
    return row_from(mine[0], now)


def row_from(raw: dict[str, Any], now: float) -> tuple[Row, list[str]]:
    uuid = raw.get("uuid")
    if not isinstance(uuid, str) or not UUID_RE.fullmatch(uuid):
        raise RowError(f"a row's uuid is unusable: {answered(uuid)}")
    state = raw.get("state")
    if state not in ROW_STATES:
        raise RowError(f"uuid {uuid}: state is not one of {', '.join(ROW_STATES)}: {answered(state)}")
    notes: list[str] = []
    times: dict[str, float | None] = {}
    for name in TIME_FIELDS:
        try:
            times[name] = None if raw.get(name) in (None, "") else manager_time(raw[name], name, now)
        except RowError as exc:
            if "impossible" not in str(exc):
                raise
            times[name] = None
            notes.append(f"the manager's row for {uuid}: {exc}")
    reason = raw.get("kill_reason")
    if reason is not None and not isinstance(reason, str):
        raise RowError(f"uuid {uuid}: kill_reason is not text: {answered(reason)}")
    if reason:
        reason = " ".join(reason.split())
        reason = "".join(c if c.isprintable() else "?" for c in reason)[:KILL_REASON_MAX_CHARS]
    return Row(uuid, state, _number(raw.get("min_rate"), "min_rate", MIN_RATE_MAX),
               times["registered_at"], times["param_done_at"], times["bench_done_at"], times["killed_at"],
               reason or None, _number(raw.get("bench_rate"), "bench_rate", MIN_RATE_MAX)), notes
