"""The first lines of ``prover-supervisor status``: the story in one line, then, when something went wrong, why.

An operator paging through a fleet at night reads the headline and knows: ``FAILED: bench/bench oom_killed
2m05s ago; exit 137``, ``running: curio up 3h12m``, ``GONE: supervisor pid 4242 ...; 2 process(es) still
alive``. Under a failure come its cause (reason, detail), the failing child's last lines (colour codes
stripped), the supervisor's exit status and the log files that have the rest; under a supervisor that is
gone, what it started that is still alive. Pure functions of the snapshot (and what ``status`` found out
about the supervisor: ``supervisor``, ``survivors``), and of the time.
"""

from __future__ import annotations

import json
import math
from typing import Any

# The failing child's last lines shown under the headline (status.json keeps more).
FAILURE_LINES_SHOWN = 5


def span(seconds: Any) -> str:
    """A duration, short (``42s``, ``3m05s``, ``2h10m``), ``?`` for what is not one."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "?"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def since(t: Any, now: float) -> str:
    """How long ago epoch time ``t`` was (``never`` for no time)."""
    if isinstance(t, bool) or not isinstance(t, int | float) or not t or not math.isfinite(t):
        return "never"
    return span(now - t) + " ago"


def shown_value(value: Any) -> str:
    """A value as JSON writes it (``false``, ``null``, ``12.5``), strings bare."""
    return value if isinstance(value, str) else json.dumps(value)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def headline(snap: dict[str, Any], live: bool, now: float) -> str:
    """One line: what the instance is doing, or how it ended, or that its supervisor is gone."""
    life = _dict(snap.get("lifecycle"))
    failure = _dict(life.get("failure"))
    status = life.get("exit_status")
    if snap.get("supervisor") == "gone":
        alive = len(_list(snap.get("survivors")))
        return (f"GONE: supervisor pid {snap.get('pid')} is not running and did not stop (last state written "
                f"{since(snap.get('written_at'), now)}); {alive} process(es) it started still alive")
    if snap.get("supervisor") == "not answering":
        return (f"NOT ANSWERING: supervisor pid {snap.get('pid')} is alive but its status socket does not answer; "
                f"last state written {since(snap.get('written_at'), now)}")
    ending = _ending(life.get("state"), status)
    if failure:
        who = failure.get("phase") if failure.get("child") == failure.get("phase") else \
            f"{failure.get('phase')}/{failure.get('child')}"
        return f"FAILED: {who} {failure.get('reason')} {since(failure.get('at'), now)}{ending}"
    if life.get("state") in ("stopping", "stopped"):
        word = "done" if status == 0 else "stopped"
        return f"{word}: {life.get('why') or 'the supervisor stopped'}{ending}"
    return _on_its_way(snap, now)


def _ending(state: Any, status: Any) -> str:
    if state == "stopped" and isinstance(status, int):
        return f"; exit {status}"
    if state == "stopping" and isinstance(status, int):
        return f"; stopping, exit {status} follows"
    return ""


def _on_its_way(snap: dict[str, Any], now: float) -> str:
    """A lifecycle under way: the phase it is at, how long, and what it waits for."""
    life = _dict(snap.get("lifecycle"))
    phases = [p for p in _list(snap.get("phases")) if isinstance(p, dict)]
    current = next((p for p in phases if p.get("name") == life.get("current")), None)
    if current is None:
        return "starting: no phase started yet"
    name, state, timers = current.get("name"), current.get("state"), _dict(current.get("timers"))
    if current.get("hold"):
        left = _dict(timers.get("hold")).get("left_s")
        return f"waiting: {name} done, held: {current['hold']}" + (f" ({span(left)} left)" if left is not None else "")
    if current.get("up"):
        return f"running: {name} up {span(now - current['up_at']) if current.get('up_at') else '?'}"
    if state == "backoff":
        left = _dict(timers.get("backoff")).get("left_s")
        return f"retrying: {name} attempt {current.get('attempt')} failed; next attempt in {span(left)}"
    ready = _dict(timers.get("ready"))
    if ready:
        return (f"starting: {name}, waiting for {ready.get('child')} to be ready "
                f"({span(ready.get('waited_s'))} of {span(ready.get('limit_s'))})")
    return f"{state}: {name}, attempt {current.get('attempt')}, since {since(current.get('since'), now)}"


def failure_lines(snap: dict[str, Any]) -> list[str]:
    """Under a failed lifecycle's headline: the cause, the failing child's last lines, where the logs are."""
    failure = _dict(_dict(snap.get("lifecycle")).get("failure"))
    killed = _dict(snap.get("manager")).get("killed")
    if killed:  # the manager's word on the instance: said first, whatever else failed
        return [f"  cause: {shown_value(killed)} (its row: state killed)", *failure_lines({**snap, "manager": {}})]
    if not failure:
        return []
    how = "".join(f" {k}={failure[k]}" for k in ("exit_code", "signal") if failure.get(k) is not None)
    out = [f"  cause: {failure.get('reason')}{how}" + (f": {failure['detail']}" if failure.get("detail") else "")]
    lines = [str(x) for x in _list(failure.get("last_lines"))][-FAILURE_LINES_SHOWN:]
    if lines:
        out.append(f"  last lines of {failure.get('phase')}/{failure.get('child')}:")
        out.extend(f"    | {line[:200]}" for line in lines)
    logs = [x for x in (failure.get("log_file"), _dict(snap.get("logs")).get("supervisor")) if x]
    if logs:
        out.append(f"  logs: {', '.join(str(x) for x in logs)}")
    return out


def gone_lines(snap: dict[str, Any]) -> list[str]:
    """Under a gone supervisor's headline: what it started that is still alive (by its tag: ours for sure)."""
    if snap.get("supervisor") != "gone":
        return []
    labels = {c.get("pid"): c.get("label") for c in _list(snap.get("children")) if isinstance(c, dict)}
    survivors = [s for s in _list(snap.get("survivors")) if isinstance(s, dict)]
    if not survivors:
        return ["  nothing it started is still alive; what follows is the last state it wrote (last known)"]
    out = ["  still alive, started by it (the next start of this state_dir ends them):"]
    for s in survivors:
        label = labels.get(s.get("pid"))
        out.append(f"    pid {s.get('pid')} {s.get('name')}" + (f" ({label})" if label else ""))
    out.append("  what follows is the last state it wrote (last known)")
    return out
