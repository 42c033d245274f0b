"""The dev-manager's instance rows (devmanager/server.py): what its ``GET /status`` lists, and how tests change them.

As the real manager keeps them (shared/domain/manager-api.md): a row per registration, with its state and the times of
its moves (``registered_at``, ``param_done_at``, ``killed_at``), listed by ``GET /status`` newest runner
first, each time as SQLite's ``CURRENT_TIMESTAMP`` writes it (``YYYY-MM-DD HH:MM:SS``, UTC, whole seconds)
and the optional fields left out when null. Kept here as epoch seconds (``GET /dev/state`` shows them so).

What the protocol spoken over it adds to a row (the prover's fleet protocol: its benchmark's state and time,
the rate, the min_rate) is a plugin's ``RowRules``, handed in with its routes (server.py ``DevExtension``):
its states and the time each first entry stamps, and its fields (set by a registration, listed by ``GET
/status``, set by ``POST /dev/row``), kept in ``Instance.extra``.

``POST /api/kill {"uuid", "vast_id"}`` kills a row as the manager's UI does ("manually killed via UI"); the
real one serves it on its UI listener, the dev-manager on its one. ``POST /dev/row {"uuid": U, ...}`` sets a
row's fields as the manager's own decisions would leave them (tests: a row registered 89 minutes ago, one
its monitor killed, a plugin's field): ``state``, ``kill_reason``, a plugin's settable fields, and the times
as epoch seconds (``killed_at`` defaults to now when ``state`` becomes ``killed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# The core's states: a plugin's (RowRules.states) come between the fetch's end and production.
STATES = ("registered", "params_done", "running", "killed")
TIMES = ("registered_at", "param_done_at", "killed_at")
STAMPS = {"params_done": "param_done_at"}  # a state → the time its first entry sets
UI_KILL_REASON = "manually killed via UI"  # the real manager's words


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class RowRules:
    """What a plugin's protocol adds to the rows: its states, the time field each first entry stamps (listed
    by ``GET /status`` as the core's times are, settable by ``POST /dev/row``), and its fields: a new row's,
    from its ``/register`` body; what ``GET /status`` lists them as (when not null); how ``POST /dev/row``
    reads the ones it may set (ValueError or TypeError: refused)."""

    states: tuple[str, ...] = ()
    stamps: Mapping[str, str] = field(default_factory=_empty)  # state → its time field
    registered: Callable[[Mapping[str, Any]], dict[str, Any]] = lambda body: {}
    listed: Mapping[str, str] = field(default_factory=_empty)  # field → its name in GET /status
    settable: Mapping[str, Callable[[Any], Any]] = field(default_factory=_empty)  # field → how /dev/row reads it

    def all_states(self) -> tuple[str, ...]:
        return (*STATES[:2], *self.states, *STATES[2:])

    def all_times(self) -> tuple[str, ...]:
        return (*TIMES[:2], *self.stamps.values(), *TIMES[2:])


NO_ROW_RULES = RowRules()


def go_float64(value: Any, field: str) -> float:
    """A number as the real manager's JSON decoding (Go's, into a float64) takes it: 0 when absent or null;
    anything but a JSON number (``"61.5"``, ``true``) is refused, as Go's decoder refuses it: ValueError, which
    its route answers with 400."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go struct field .{field} of type "
                         "float64")
    return float(value)


@dataclass
class Instance:
    uuid: str
    label: str
    runner_id: int
    state: str = "registered"
    kill_reason: str | None = None  # as the manager's DB column: why it was killed
    killed_at: float | None = None
    history: list[str] = field(default_factory=lambda: ["registered"])
    registered_at: float = field(default_factory=time.time)
    param_done_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # a plugin's fields and times (RowRules), by name
    rules: RowRules = field(default=NO_ROW_RULES, repr=False, compare=False)

    def kill(self, reason: str, at: float | None = None) -> None:
        self.kill_reason, self.killed_at = reason, at if at is not None else time.time()
        self.move("killed")

    def move(self, state: str) -> None:
        if self.state != state:  # history lists changes in effect, as the real states do
            self.history.append(state)
        self.state = state
        stamp = STAMPS.get(state) or self.rules.stamps.get(state)
        if stamp is not None and self.time(stamp) is None:
            self.set_time(stamp, time.time())

    def time(self, name: str) -> float | None:
        return getattr(self, name) if name in TIMES else self.extra.get(name)

    def set_time(self, name: str, value: float | None) -> None:
        if name in TIMES:
            setattr(self, name, value)
        else:
            self.extra[name] = value

    def to_dict(self) -> dict[str, Any]:
        """As ``GET /dev/state`` shows it: the plugin's fields beside the core's (its times null until set)."""
        core = {name: getattr(self, name) for name in ("uuid", "label", "runner_id", "state", "kill_reason",
                                                       "killed_at", "registered_at", "param_done_at")}
        return {**core, "history": list(self.history), **dict.fromkeys(self.rules.stamps.values()), **self.extra}


def sql_time(epoch: float) -> str:
    """SQLite's CURRENT_TIMESTAMP: UTC, whole seconds."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def status_row(inst: Instance) -> dict[str, Any]:
    """One row of ``GET /status``, as the real one writes it (nulls left out)."""
    row: dict[str, Any] = {"uuid": inst.uuid, "label": inst.label, "runner_id": inst.runner_id, "state": inst.state}
    for name in inst.rules.all_times():
        value = inst.time(name)
        if value is not None:
            row[name] = sql_time(value)
    for name, listed in inst.rules.listed.items():
        if inst.extra.get(name) is not None:
            row[listed] = inst.extra[name]
    if inst.kill_reason is not None:
        row["kill_reason"] = inst.kill_reason
    return row


def status_rows(instances: list[Instance]) -> list[dict[str, Any]]:
    """The whole fleet, newest runner first."""
    return [status_row(i) for i in sorted(instances, key=lambda i: i.runner_id, reverse=True)]


def edit_row(inst: Instance, body: dict[str, Any]) -> None:
    """``POST /dev/row``: the fields given, checked (ValueError names a bad one; nothing is changed then)."""
    rules = inst.rules
    times, states = rules.all_times(), rules.all_states()
    unknown = set(body) - {"uuid", "state", "kill_reason", *times, *rules.settable}
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
    if "state" in body and body["state"] not in states:
        raise ValueError(f"state must be one of {', '.join(states)}, not {body['state']!r}")
    for name in times:
        if name in body:
            value = body[name]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{name} must be epoch seconds or null, not {value!r}")
    settable = {name: read(body[name]) for name, read in rules.settable.items() if name in body}
    for name in times:
        if name in body:
            inst.set_time(name, None if body[name] is None else float(body[name]))
    inst.extra.update(settable)
    if "kill_reason" in body:
        inst.kill_reason = body["kill_reason"]
    if "state" in body:
        if body["state"] == "killed" and inst.state != "killed":
            inst.kill(inst.kill_reason or UI_KILL_REASON, inst.killed_at if "killed_at" in body else None)
        else:
            inst.move(body["state"])
