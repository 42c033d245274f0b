"""The first lines of ``prover-supervisor status``: the story in one line, then, when something went wrong, why.

An operator paging through a fleet at night reads the headline and knows: ``FAILED: bench oom_killed 2m05s
ago; exit 137`` (a child named like its phase shows the phase alone), ``running: curio up 3h12m``,
``GONE: supervisor pid 4242 ...; 2 process(es) still alive``, ``exited: supervisor pid 4242 exited, but could not
save its last state ...`` (a full disk failed its exit's save). Under a failure come its cause (reason,
detail), the failing child's last lines (colour codes stripped), the supervisor's exit status and the log
files that have the rest; under a supervisor that is gone, what it started that is still alive (under one
that exited, what outlived its SIGKILL). Pure functions of the snapshot (and what ``status`` found out about
the supervisor: ``supervisor``, ``survivors``), and of the time.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from ..text.show import PATH_CHARS, cut, escaped, shown, span
from .model import EXITED, NOT_ANSWERING, ManagerStatus, PhaseStatus, Snapshot

# The failing child's last lines shown under the headline (status.json keeps more).
FAILURE_LINES_SHOWN = 5


def since(t: Any, now: float) -> str:
    """How long ago epoch time ``t`` was (``never`` for no time)."""
    if isinstance(t, bool) or not isinstance(t, int | float) or not t or not math.isfinite(t):
        return "never"
    return span(now - t) + " ago"


def shown_value(value: Any) -> str:
    """A value as JSON writes it (``false``, ``null``, ``12.5``), strings bare."""
    return value if isinstance(value, str) else json.dumps(value)


def headline(snap: Snapshot, live: bool, now: float) -> str:
    """One line: what the instance is doing, or how it ended, or that its supervisor is gone."""
    life, fate = snap.lifecycle, snap.fate
    failure, status = life.failure, life.exit_status
    if snap.gone:
        alive = len(fate.survivors) if fate is not None else 0
        if snap.exiting is not None:  # (saved as its exit began to wait for the manager: it never ended that wait)
            pending = snap.manager.outbox_pending
            calls = f"; {pending} call(s) for the manager were pending" if pending else ""
            return (f"GONE: supervisor pid {snap.pid} was killed during its exit flush (last state written "
                    f"{since(snap.written_at, now)}): its exit status {snap.exiting.status} never came{calls}; "
                    f"{alive} process(es) it started still alive")
        return (f"GONE: supervisor pid {snap.pid} is not running and did not stop (last state written "
                f"{since(snap.written_at, now)}); {alive} process(es) it started still alive")
    if fate is not None and fate.unsaved:
        log = f"; its log says how it ended: {_log_named(snap)}" if _log_named(snap) else ""
        return (f"exited: supervisor pid {snap.pid} exited, but could not save its last state (last state written "
                f"{since(snap.written_at, now)}){log}")
    if fate is not None and fate.supervisor == NOT_ANSWERING:
        lives = "of another PID namespace, not answering (whether it lives cannot be told from here):" \
            if fate.elsewhere else "is alive but"
        return (f"NOT ANSWERING: supervisor pid {snap.pid} {lives} its status socket does not answer; "
                f"last state written {since(snap.written_at, now)}")
    ending = _ending(life.state, status)
    if snap.exiting is not None and live:  # (a saved one: the exit it was waiting for is over)
        ending = f"{ending}; {exit_waits(snap)}"
    if failure is not None:
        who = failure.phase if failure.child == failure.phase else f"{failure.phase}/{failure.child}"
        return f"FAILED: {who} {failure.reason} {since(failure.at, now)}{ending}"
    if life.state in ("stopping", "stopped"):
        if life.state == "stopping":  # (not "done" or "stopped" yet: a child may still take its grace)
            return f"stopping: {life.why or 'the supervisor stops'}{ending}"
        return f"{'done' if status == 0 else 'stopped'}: {life.why or 'the supervisor stopped'}{ending}"
    return _on_its_way(snap, now)


def _ending(state: str | None, status: int | None) -> str:
    if state == "stopped" and status is not None:
        return f"; exit {status}"
    if state == "stopping" and status is not None:
        return f"; exit {status} follows"
    return ""


def exit_waits(snap: Snapshot) -> str:
    """The exit waiting for the manager (the lifecycle is over, the supervisor still runs): for what, how long."""
    exiting, pending = snap.exiting, snap.manager.outbox_pending
    assert exiting is not None
    what = "the give-up to be delivered" if exiting.giving_up else "the manager"
    calls = f" ({pending} call(s) pending)" if pending else ""
    return f"the exit waits up to {span(exiting.flush_left_s)} more for {what}{calls}"


def _on_its_way(snap: Snapshot, now: float) -> str:
    """A lifecycle under way: the phase it is at, how long, and what it waits for; then each earlier service that
    is not up (restarting: a crash loop behind a phase that runs is news too)."""
    current = snap.current_phase()
    if current is None:
        return "starting: no phase started yet"
    behind = _earlier_not_up(snap, current)
    said = [_not_up(p) for p in behind[:NOT_UP_NAMED]]
    if len(behind) > NOT_UP_NAMED:  # (one line: a fleet's log keeps the headline)
        said.append(f"{len(behind) - NOT_UP_NAMED} more service(s) not up")
    return "; ".join([_current(current, now), *said])


# An earlier service is named in the headline in these states (done, failed, stopped: over, not restarting).
NOT_UP_STATES = ("starting", "running", "stopping", "backoff")
# The most earlier services the headline names one by one; the rest are counted.
NOT_UP_NAMED = 3


def _earlier_not_up(snap: Snapshot, current: PhaseStatus) -> list[PhaseStatus]:
    """The services before ``current`` that are not up now (a restart under way): the lifecycle went past each
    once it was up."""
    index = snap.phases.index(current)
    return [p for p in snap.phases[:index] if p.kind == "service" and p.state in NOT_UP_STATES and not p.up]


def _not_up(ph: PhaseStatus) -> str:
    """An earlier service not up, in a few words: ``db restarting (attempt 2 in 6s)``."""
    if ph.state == "backoff":
        left = ph.timers.backoff.left_s if ph.timers.backoff is not None else None
        after = ph.attempt + 1 if ph.attempt is not None else "?"
        return f"{ph.name} restarting (attempt {after} in {span(left)})"
    if ph.state == "stopping":
        return f"{ph.name} stopping (attempt {ph.attempt} ended)"
    return f"{ph.name} restarting (attempt {ph.attempt}, {ph.state}, not up yet)"


def _current(current: PhaseStatus, now: float) -> str:
    """The phase the lifecycle is at: up for how long, or what it waits for."""
    name, state, timers = current.name, current.state, current.timers
    if current.hold:
        left = timers.hold.left_s if timers.hold is not None else None
        return f"waiting: {name} done, held: {current.hold}" + (f" ({span(left)} left)" if left is not None else "")
    if current.up:
        up_since = current.up_since or current.up_at  # (a status.json of before up_since: the first time up)
        return f"running: {name} up {span(now - up_since) if up_since else '?'}"
    if state == "backoff":
        left = timers.backoff.left_s if timers.backoff is not None else None
        return f"retrying: {name} attempt {current.attempt} failed; next attempt in {span(left)}"
    if state == "settling":  # (the deadline, if sooner, ends it first)
        left = min((t.left_s for t in (timers.settle, timers.deadline) if t is not None and t.left_s is not None),
                   default=None)
        return (f"settling: {name}'s command done; its daemons kept for what it started, "
                f"{span(left)} more at most")
    ready = timers.ready
    if ready is not None:
        return (f"starting: {name}, waiting for {ready.child} to be ready "
                f"({span(ready.waited_s)} of {span(ready.limit_s)})")
    return f"{state}: {name}, attempt {current.attempt}, since {since(current.since, now)}"


def failure_lines(snap: Snapshot) -> list[str]:
    """Under a failed lifecycle's headline: the cause, the failing child's last lines, where the logs are."""
    failure = snap.lifecycle.failure
    killed = snap.manager.killed
    if killed:  # the manager's word on the instance: said first, whatever else failed
        return [f"  cause: {shown_value(killed)} (its row: state killed)",
                *failure_lines(replace(snap, manager=ManagerStatus()))]
    if failure is None:
        return []
    how = "".join(f" {name}={value}" for name, value in (("exit_code", failure.exit_code), ("signal", failure.signal))
                  if value is not None)
    out = [f"  cause: {failure.reason}{how}" + (f": {escaped(failure.detail)}" if failure.detail else "")]
    lines = list(failure.last_lines[-FAILURE_LINES_SHOWN:])
    if lines:
        out.append(f"  last lines of {failure.phase}/{failure.child}:")
        out.extend(f"    | {cut(line, 200)}" for line in lines)
    logs = [x for x in (failure.log_file, snap.logs.supervisor if snap.logs is not None else None) if x]
    if logs:
        out.append(f"  logs: {', '.join(shown(log, PATH_CHARS, bare=True) for log in logs)}")  # (a log_dir with ESC)
    return out


def _log_named(snap: Snapshot) -> str:
    """The supervisor's log file as a line shows it (quoted where it has a space or an ESC), or "" for none."""
    log = snap.logs.supervisor if snap.logs is not None else None
    return shown(log, PATH_CHARS, bare=True) if log else ""


def alive_lines(snap: Snapshot) -> list[str]:
    """Under the headline, what the supervisor started that is still alive (by its tag: ours for sure): what a
    gone one left, or what outlived its SIGKILL under one that exited (said in its log, and left)."""
    fate = snap.fate
    if fate is not None and fate.unsaved:  # (it left nothing alive: else it would be gone)
        return ["  what follows is the last state it wrote before its exit (last known)"]
    if fate is None or not (snap.gone or (fate.supervisor == EXITED and fate.survivors)):
        return []
    labels = {c.pid: c.label for c in snap.children}
    if not fate.survivors:
        return ["  nothing it started is still alive; what follows is the last state it wrote (last known)"]
    out = ["  still alive, started by it (the next start of this state_dir ends them):" if snap.gone else
           "  still alive: outlived SIGKILL (uninterruptible sleep?), left by its exit (the next start of this "
           "state_dir ends them):"]
    for s in fate.survivors:
        label = labels.get(s.pid)
        out.append(f"    pid {s.pid} {s.name}" + (f" ({label})" if label else ""))
    if snap.gone:
        out.append("  what follows is the last state it wrote (last known)")
    return out
