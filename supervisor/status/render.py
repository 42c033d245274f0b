"""What ``prover-supervisor status`` prints for a person: a snapshot (live, or status.json) as text.

A pure function of the snapshot and the time: the same text whether the snapshot came from the
running supervisor's socket or from the file it last wrote (``live`` says which). First the story
(headline.py: one line, then a failure's cause or a gone supervisor's survivors), then the details:
who, the lifecycle, each phase (its state, then the lines of ``PHASE_LINES``: its timeline, its running
timers, its memory against memory_max), the children, GPUs, memory, the manager (and the ledger of what it
was told), the verdicts.

What another concern shows of a phase plugs in as one more function in ``PHASE_LINES``: it takes the
phase's part of the snapshot, the time and whether the snapshot is live, and returns its lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..evidence.transfer import progress_text
from ..text.show import one_line
from ..text.units import fmt_bytes
from .headline import failure_lines, gone_lines, headline, shown_value, since, span

PhaseLines = Callable[[dict[str, Any], float, bool], list[str]]
# The ledger lines shown (the latest calls; status --json has every one the snapshot carries).
LEDGER_SHOWN = 8
# A why or an error, as the status view shows it: on one line, cut here.
ONE_LINE_CHARS = 300


def _up(t: Any, now: float) -> str:
    """How long something has been up since epoch time ``t`` (``42s``, ``3m05s``); ``never`` for no time."""
    return since(t, now).removesuffix(" ago")


def summary_lines(ph: dict[str, Any], now: float, live: bool) -> list[str]:
    """What a plugin says of the phase in one line (``summary``: the prover's production summary)."""
    return [str(ph["summary"])] if ph.get("summary") else []


def progress_lines(ph: dict[str, Any], now: float, live: bool) -> list[str]:
    """The supervisor's own progress line for a download (bar, percent, rate, ETA: transfer.py)."""
    text = progress_text(ph.get("progress"))
    return [f"progress {text}"] if text else []


def memory_notes(mem: dict[str, Any]) -> list[str]:
    """Each phase's last memory_high, with when it was said."""
    return [f"  {w['line']} (at {time.strftime('%H:%M:%S', time.localtime(w['at']))})"
            for w in (mem.get("warnings") or {}).values()]


def render(snap: dict[str, Any], live: bool, now: float | None = None) -> str:
    """The status text; ``now`` (epoch seconds, default the time) is what the ages are counted from."""
    now = time.time() if now is None else now
    gone = snap.get("supervisor") == "gone"
    out = [headline(snap, live, now), *failure_lines(snap), *gone_lines(snap)]
    if live:
        up = _up(snap.get("started_at"), now)
        out.append(f"prover-supervisor pid {snap.get('pid')} as {snap.get('role')}, up {up} "
                   f"(config: {snap.get('config')})")
    else:
        out.append(f"no prover-supervisor is running; last state written {since(snap.get('written_at'), now)} "
                   f"by pid {snap.get('pid')}")
    state = snap.get("lifecycle", {})
    said = f"{state.get('state')}" + (f" ({state.get('why')})" if state.get("why") else "")
    # A dead supervisor's lifecycle runs no more: what it last wrote is only what was last known.
    out.append(f"lifecycle (last known, the supervisor is gone): {said}" if gone else f"lifecycle: {said}")
    current = state.get("current")
    if current:
        out.append(f"current phase: {current}")
    out.append("phases (last known):" if gone else "phases:")
    for ph in snap.get("phases", []):
        hold = f"; held: {ph['hold']}" if ph.get("hold") else ""
        out.append(f"  {ph['name']:<12} {ph['state']:<9} since {since(ph.get('since'), now)}, "
                   f"attempt {ph.get('attempt')}: {ph.get('why', '')}{hold}")
        for lines_of in PHASE_LINES:
            out.extend(f"      {line}" for line in lines_of(ph, now, live and not gone))
    out.extend(_children(snap, now, gone))
    gpus = snap.get("gpus", {})
    hung = gpus.get("unresponsive")
    if isinstance(hung, dict):
        out.append(f"gpus: NVML unresponsive: {hung.get('call')} has not returned for {hung.get('for_s')}s")
    if gpus.get("samples"):
        for g in gpus["samples"]:
            out.append(f"gpu {g['index']}: {g['name']} util {g['utilization']}% "
                       f"mem {fmt_bytes(g['memory_used'])}/{fmt_bytes(g['memory_total'])}")
    else:
        out.append(f"gpus: {gpus.get('why', 'no GPU')}")
    out.extend(watch_lines(snap.get("watches"), now, live and not gone))
    mem = snap.get("memory", {})
    out.append(f"memory: {mem.get('mode')}; {mem.get('snapshot') or mem.get('why', '')}")
    out.extend(memory_notes(mem))
    mgr = snap.get("manager", {})
    if mgr.get("enabled"):
        last = mgr.get("last_delivered") or {}
        out.append(f"manager: {mgr.get('url')} uuid {mgr.get('uuid')}, outbox {mgr.get('outbox_pending')} pending, "
                   f"last delivered {_delivered(last, now)}")
        if mgr.get("last_error"):  # one line, with its age; the next delivery clears it
            out.append(f"  last error {since(mgr.get('last_error_at'), now)}: {_one_line(mgr['last_error'])}")
        out.extend(_manager_view(mgr, now))
        out.extend(_ledger(mgr.get("ledger"), now))
    else:
        out.append("manager: reporting off")
    verdicts = snap.get("verdicts", [])
    if verdicts:
        out.append("verdicts (latest last):")
        for v in verdicts[-10:]:
            out.append(f"  {v.get('line')}")
    return "\n".join(out)


def watch_lines(watches: Any, now: float, live: bool = True) -> list[str]:
    """Each watch's own state in one line: reading, idle, BLIND since when (and why), stopped (and why); from a
    saved snapshot, as last known."""
    if not isinstance(watches, dict) or not watches:
        return []
    said = []
    for name, w in list(watches.items())[:20]:
        if not isinstance(w, dict):
            continue
        state, why = str(w.get("state"))[:20], _one_line(w.get("why"))[:160] if w.get("why") else ""
        if state == "blind":
            said.append(f"{str(name)[:40]} BLIND since {since(w.get('since'), now)}" + (f" ({why})" if why else ""))
        elif state == "stopped":
            said.append(f"{str(name)[:40]} stopped" + (f" ({why})" if why else ""))
        else:
            said.append(f"{str(name)[:40]} {state}")
    return [("watches: " if live else "watches (last known): ") + "; ".join(said)] if said else []


def _manager_view(mgr: dict[str, Any], now: float) -> list[str]:
    """The manager's own view of the instance: its row as last read, and the clocks its deadlines run on."""
    out = []
    row = mgr.get("row")
    if isinstance(row, dict):
        out.append(f"  the manager's row: {_one_line(row.get('shown'))} (read {since(row.get('at'), now)})")
    clocks = mgr.get("clocks")
    for name, clock in (clocks.items() if isinstance(clocks, dict) else []):
        if not isinstance(clock, dict) or not isinstance(clock.get("at"), int | float):
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(clock["at"]))
        line = f"  {name} clock: from {when} UTC ({_one_line(clock.get('source'))})"
        limit = clock.get("deadline_s")
        if isinstance(limit, int | float):
            left = clock["at"] + limit - now
            line += f", deadline {span(limit)}: " + (f"{span(left)} left" if left > 0 else f"passed {span(-left)} ago")
        out.append(line)
    return out


def _delivered(last: dict[str, Any], now: float) -> str:
    """The manager's last delivered call and its age: ``none`` before the first."""
    return f"{last.get('kind', '?')} {since(last.get('at'), now)}" if last else "none"


def _g(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else "?"


def _one_line(text: Any) -> str:
    return one_line(text, ONE_LINE_CHARS, mark="")


def _children(snap: dict[str, Any], now: float, gone: bool) -> list[str]:
    children = snap.get("children", [])
    if not children:
        return ["children: none running"]
    alive = {s.get("pid") for s in snap.get("survivors", []) if isinstance(s, dict)}
    out = ["children (last known: alive = still running now):" if gone else "children:"]
    for ch in children:
        usage = ch.get("usage") or {}
        rss = fmt_bytes(usage.get("rss")) if usage.get("rss") is not None else "?"
        state = ("alive" if ch.get("pid") in alive else "gone") if gone else ch["state"]
        stop = ch.get("stop") if isinstance(ch.get("stop"), dict) else None
        grace = f", SIGKILL in {span(stop.get('kill_in_s'))} (grace {span(stop.get('grace_s'))})" \
            if stop and not gone else ""
        out.append(f"  {ch['label']:<24} pid {ch['pid']:<7} {state:<8} up {_up(ch.get('started_at'), now)}, "
                   f"{usage.get('processes', '?')} proc(s), cpu {usage.get('cpu_s', '?')}s, rss {rss}, "
                   f"last output {since(ch.get('last_output_at'), now)}{grace}")
        for line in ch.get("last_lines", [])[-3:]:
            out.append(f"      | {line[:160]}")
    return out


def _ledger(entries: Any, now: float) -> list[str]:
    """What the manager was told, latest last: kind, state, attempts, when, what it carried, its answer."""
    if not isinstance(entries, list) or not entries:
        return []
    out = ["  calls (latest last):"]
    for e in [x for x in entries if isinstance(x, dict)][-LEDGER_SHOWN:]:
        carried = " ".join(f"{k}={shown_value(v)}" for k, v in (e.get("carried") or {}).items())
        answer = ", ".join(f"{k}: {shown_value(v)}" for k, v in (e.get("answer") or {}).items())
        when = e.get("finished") or e.get("created")
        line = (f"    {e.get('kind')!s:<12} {e.get('state')!s:<9} {since(when, now)}, "
                f"{e.get('attempts')} attempt(s)" + (f", carried {carried}" if carried else "")
                + (f" -> {answer}" if answer else ""))
        if e.get("last_error") and e.get("state") != "delivered":
            line += f"; error: {_one_line(e['last_error'])[:160]}"
        out.append(line)
    return out


def timeline_lines(ph: dict[str, Any], now: float, live: bool) -> list[str]:
    """When the phase started, and how long it took (ended) or has run so far."""
    started, ended, up = ph.get("started_at"), ph.get("ended_at"), ph.get("up_at")
    if not isinstance(started, int | float) or isinstance(started, bool):
        return []
    line = f"started {since(started, now)}"
    if isinstance(ended, int | float) and not isinstance(ended, bool):
        line += f", took {span(ended - started)}"
    elif live:
        line += f", running for {span(now - started)}"
    if isinstance(up, int | float) and not isinstance(up, bool):
        line += f", up after {span(up - started)}"
    return [line]


def timer_lines(ph: dict[str, Any], now: float, live: bool) -> list[str]:
    """The timers running for the phase (live only: a saved snapshot's timers ran out with its supervisor)."""
    timers = ph.get("timers") if isinstance(ph.get("timers"), dict) else {}
    if not live or not timers:
        return []
    said = []
    for name, t in timers.items():
        if not isinstance(t, dict):
            continue
        if name == "deadline":
            said.append(f"deadline {span(t.get('left_s'))} left of timeout_s={_g(t.get('limit_s'))}")
        elif name == "stall":
            signs = t.get("signs") if isinstance(t.get("signs"), dict) else {}
            ages = "".join(f"; {what} {span(age)} ago" for what, age in signs.items())
            said.append(f"stall: no sign of progress for {span(t.get('silent_s'))} of stall_s={_g(t.get('limit_s'))} "
                        f"({span(t.get('left_s'))} left{ages})")
        elif name == "ready":
            said.append(f"ready wait: {t.get('child')} {span(t.get('waited_s'))} of "
                        f"ready_timeout_s={_g(t.get('limit_s'))} ({span(t.get('left_s'))} left)")
        elif name == "backoff":
            said.append(f"next attempt in {span(t.get('left_s'))}")
        elif name == "hold":
            said.append(f"held {span(t.get('left_s'))} more at most")
    return ["timers: " + "; ".join(said)] if said else []


def memory_lines(ph: dict[str, Any], now: float, live: bool) -> list[str]:
    """The phase's own cgroup against its memory_max (the limit the cgroup really has)."""
    mem = ph.get("memory") if isinstance(ph.get("memory"), dict) else None
    if not mem:
        return []
    memory_max = mem.get("memory_max")
    if not mem.get("cgroup"):
        return [f"memory_max {fmt_bytes(memory_max)}: no cgroup of its own now (held to it by the preflight)"] \
            if live else []
    limit = fmt_bytes(mem["limit"]) if mem.get("limit") is not None else "none"
    return [f"memory: usage {fmt_bytes(mem.get('usage'))}, peak {fmt_bytes(mem.get('peak'))}, limit {limit}"
            + (f" (memory_max {fmt_bytes(memory_max)})" if memory_max is not None else "")
            + (f", oom_kills {mem['oom_kills']}" if mem.get("oom_kills") else "")]


# What each phase shows under its line, in this order: a concern of its own adds one function here.
PHASE_LINES: list[PhaseLines] = [timeline_lines, progress_lines, timer_lines, memory_lines, summary_lines]
