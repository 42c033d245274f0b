"""The dev-manager's instance rows (devmanager.py): what its ``GET /status`` lists, and how tests change them.

As the real manager keeps them (manager-api.md): a row per registration, with its state and the times of
its moves (``registered_at``, ``param_done_at``, ``bench_done_at``, ``killed_at``), listed by ``GET /status``
newest runner first, each time as SQLite's ``CURRENT_TIMESTAMP`` writes it (``YYYY-MM-DD HH:MM:SS``, UTC,
whole seconds) and the optional fields left out when null. Kept here as epoch seconds (``GET /dev/state``
shows them so).

``POST /api/kill {"uuid", "vast_id"}`` kills a row as the manager's UI does ("manually killed via UI"); the
real one serves it on its UI listener, the dev-manager on its one. ``POST /dev/row {"uuid": U, ...}`` sets a
row's fields as the manager's own decisions would leave them (tests: a row registered 89 minutes ago, one
its monitor killed, another min_rate): ``state``, ``min_rate``, ``kill_reason``, and the times as epoch
seconds (``killed_at`` defaults to now when ``state`` becomes ``killed``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

STATES = ("registered", "params_done", "bench_done", "running", "killed")
TIMES = ("registered_at", "param_done_at", "bench_done_at", "killed_at")
UI_KILL_REASON = "manually killed via UI"  # the real manager's words


@dataclass
class Instance:
    uuid: str
    label: str
    runner_id: int
    min_rate: float
    state: str = "registered"
    rate: float | None = None
    kill_reason: str | None = None  # as the manager's DB column: why it was killed
    killed_at: float | None = None
    history: list[str] = field(default_factory=lambda: ["registered"])
    registered_at: float = field(default_factory=time.time)
    param_done_at: float | None = None
    bench_done_at: float | None = None

    def kill(self, reason: str, at: float | None = None) -> None:
        self.kill_reason, self.killed_at = reason, at if at is not None else time.time()
        self.move("killed")

    def move(self, state: str) -> None:
        if self.state != state:  # history lists changes in effect, as the real states do
            self.history.append(state)
        self.state = state
        stamp = {"params_done": "param_done_at", "bench_done": "bench_done_at"}.get(state)
        if stamp is not None and getattr(self, stamp) is None:
            setattr(self, stamp, time.time())


def sql_time(epoch: float) -> str:
    """SQLite's CURRENT_TIMESTAMP: UTC, whole seconds."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def status_row(inst: Instance) -> dict[str, Any]:
    """One row of ``GET /status``, as the real one writes it (nulls left out)."""
    row: dict[str, Any] = {"uuid": inst.uuid, "label": inst.label, "runner_id": inst.runner_id, "state": inst.state,
                           "min_rate": inst.min_rate}
    for name in TIMES:
        value = getattr(inst, name)
        if value is not None:
            row[name] = sql_time(value)
    if inst.rate is not None:
        row["bench_rate"] = inst.rate
    if inst.kill_reason is not None:
        row["kill_reason"] = inst.kill_reason
    return row


def status_rows(instances: list[Instance]) -> list[dict[str, Any]]:
    """The whole fleet, newest runner first."""
    return [status_row(i) for i in sorted(instances, key=lambda i: i.runner_id, reverse=True)]


def edit_row(inst: Instance, body: dict[str, Any]) -> None:
    """``POST /dev/row``: the fields given, checked (ValueError names a bad one; nothing is changed then)."""
    unknown = set(body) - {"uuid", "state", "min_rate", "kill_reason", *TIMES}
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
    if "state" in body and body["state"] not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, not {body['state']!r}")
    for name in TIMES:
        if name in body:
            value = body[name]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{name} must be epoch seconds or null, not {value!r}")
            setattr(inst, name, None if value is None else float(value))
    if "min_rate" in body:
        inst.min_rate = float(body["min_rate"])
    if "kill_reason" in body:
        inst.kill_reason = body["kill_reason"]
    if "state" in body:
        if body["state"] == "killed" and inst.state != "killed":
            inst.kill(inst.kill_reason or UI_KILL_REASON, inst.killed_at if "killed_at" in body else None)
        else:
            inst.move(body["state"])
