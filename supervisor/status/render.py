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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..evidence.transfer import progress_text
from ..text.show import cut, fmt_bytes, one_line, span
from .headline import alive_lines, failure_lines, headline, shown_value, since
from .model import (
    NOT_ANSWERING,
    Delivered,
    GpuStatus,
    LedgerEntry,
    ManagerStatus,
    MemoryStatus,
    PhaseStatus,
    Snapshot,
    StallTimer,
    WatchStatus,
)

PhaseLines = Callable[[PhaseStatus, float, bool], list[str]]
# The ledger lines shown (the latest calls; status --json has every one the snapshot carries).
LEDGER_SHOWN = 8
# A why or an error, as the status view shows it: on one line, cut here.
ONE_LINE_CHARS = 300
# What a section says where the snapshot has no word for it (a saved file of an older or broken supervisor).
UNKNOWN = "?"


def _up(t: float | None, now: float) -> str:
    """How long something has been up since epoch time ``t`` (``42s``, ``3m05s``); ``never`` for no time."""
    return since(t, now).removesuffix(" ago")


def summary_lines(ph: PhaseStatus, now: float, live: bool) -> list[str]:
    """What a plugin says of the phase in one line (``summary``: the prover's production summary)."""
    summary = ph.plugin.get("summary")
    return [str(summary)] if summary else []


def progress_lines(ph: PhaseStatus, now: float, live: bool) -> list[str]:
    """The supervisor's own progress line for a download (bar, percent, rate, ETA: transfer.py)."""
    text = progress_text(ph.progress.to_json()) if ph.progress is not None else None
    return [f"progress {text}"] if text else []


def memory_notes(mem: MemoryStatus) -> list[str]:
    """Each phase's last memory_high, with when it was said."""
    return [f"  {w.line} (at {clock_text('%H:%M:%S', w.at)})" for w in mem.warnings.values()]


def clock_text(fmt: str, at: float | None, *, utc: bool = False) -> str:
    """A time of the snapshot on the clock (local, or UTC), UNKNOWN where none is or no clock can show it (a
    status.json edited by hand or spoilt: 1e20)."""
    if at is None:
        return UNKNOWN
    try:
        return time.strftime(fmt, time.gmtime(at) if utc else time.localtime(at))
    except (OverflowError, ValueError, OSError):
        return UNKNOWN


def render(snap: Snapshot, live: bool, now: float | None = None, also: str = "") -> str:
    """The status text; ``now`` (epoch seconds, default the time) is what the ages are counted from. ``also``: a
    line said under the story (a bare status's other state_dir: command.SeeAlso)."""
    now = time.time() if now is None else now
    gone = snap.gone
    # Not live: what it last wrote is only what was last known (a gone supervisor's lifecycle runs no more; a
    # hung one's may, unseen).
    hung = snap.fate is not None and snap.fate.supervisor == NOT_ANSWERING
    unsaved = snap.fate is not None and snap.fate.unsaved  # (its exit's last state never reached the file)
    out = [headline(snap, live, now), *failure_lines(snap), *alive_lines(snap), *([f"also: {also}"] if also else [])]
    if live:
        out.append(f"prover-supervisor pid {snap.pid} as {snap.role}, up {_up(snap.started_at, now)} "
                   f"(config: {snap.config})")
    elif hung:
        alive = "of another PID namespace," if snap.fate is not None and snap.fate.elsewhere else "is alive but"
        out.append(f"prover-supervisor pid {snap.pid} {alive} not answering; last state written "
                   f"{since(snap.written_at, now)}")
    else:
        out.append(f"no prover-supervisor is running; last state written {since(snap.written_at, now)} "
                   f"by pid {snap.pid}")
    life = snap.lifecycle
    said = f"{life.state}" + (f" ({life.why})" if life.why else "")
    known = " (last known, the supervisor is gone)" if gone else \
        " (last known, before the supervisor's exit)" if unsaved else " (last known)" if hung else ""
    out.append(f"lifecycle{known}: {said}")
    if life.current:
        out.append(f"current phase: {life.current}")
    out.append("phases (last known):" if gone or hung or unsaved else "phases:")
    for ph in snap.phases:
        hold = f"; held: {ph.hold}" if ph.hold else ""
        out.append(f"  {ph.name!s:<12} {ph.state!s:<9} since {since(ph.since, now)}, "
                   f"attempt {ph.attempt}: {ph.why if ph.why is not None else ''}{hold}")
        for lines_of in PHASE_LINES:
            out.extend(f"      {line}" for line in lines_of(ph, now, live and not gone))
    out.extend(_children(snap, now, gone or unsaved))
    gpus = snap.gpus
    if gpus.unresponsive is not None:
        out.append(f"gpus: NVML unresponsive: {gpus.unresponsive.call} has not returned for "
                   f"{gpus.unresponsive.for_s}s")
    if gpus.samples:
        stale = _stale_note(gpus)
        for g in gpus.samples:
            util = f"{g.utilization:g}%" if g.utilization is not None else "not measured"
            out.append(f"gpu {g.index}: {g.name} util {util} "
                       f"mem {fmt_bytes(g.memory_used)}/{fmt_bytes(g.memory_total)}{stale}")
    else:
        out.append(f"gpus: {gpus.why if gpus.why is not None else 'no GPU'}")
    out.extend(f"gpu {g.index}: left out ({g.why})" for g in gpus.left_out)
    out.extend(watch_lines(snap.watches, now, live and not gone))
    mem = snap.memory
    out.append(f"memory: {mem.mode}; {mem.snapshot or (mem.why if mem.why is not None else '')}")
    out.extend(memory_notes(mem))
    out.extend(_manager(snap.manager, now, live and not gone))
    if snap.verdicts:
        out.append("verdicts (latest last):")
        for v in snap.verdicts[-10:]:
            out.append(f"  {v.line}")
    return "\n".join(out)


def _stale_note(gpus: GpuStatus) -> str:
    """Figures no longer current (NVML hung, samples stopped) are shown as what they are: the last, and when."""
    if not gpus.samples_stale:
        return ""
    age = f" {gpus.sampled_s_ago:g}s ago" if gpus.sampled_s_ago is not None else ""  # (a hand-edited file)
    return f" (last sampled{age}: not current)"


def watch_lines(watches: Mapping[str, WatchStatus], now: float, live: bool = True) -> list[str]:
    """Each watch's own state in one line: reading, idle, BLIND since when (and why), stopped (and why); from a
    saved snapshot, as last known."""
    said = []
    for name, w in list(watches.items())[:20]:
        state, why = str(w.state)[:20], one_line(w.why, 160, mark="") if w.why else ""
        if state == "blind":
            said.append(f"{cut(name, 40)} BLIND since {since(w.since, now)}" + (f" ({why})" if why else ""))
        elif state == "stopped":
            said.append(f"{cut(name, 40)} stopped" + (f" ({why})" if why else ""))
        else:
            said.append(f"{cut(name, 40)} {state}")
    return [("watches: " if live else "watches (last known): ") + "; ".join(said)] if said else []


def _manager(mgr: ManagerStatus, now: float, live: bool = True) -> list[str]:
    """The manager reporting: where, who, what is pending and last delivered, its last error, its own view of
    the instance and the ledger of what it was told."""
    if not mgr.enabled:
        return ["manager: reporting off"]
    out = [f"manager: {mgr.url} uuid {mgr.uuid}, outbox {mgr.outbox_pending} pending, "
           f"last delivered {_delivered(mgr.last_delivered, now)}"]
    if mgr.last_error:  # one line, with its age; the next delivery clears it
        out.append(f"  last error {since(mgr.last_error_at, now)}: {_one_line(mgr.last_error)}")
    if mgr.log_push_error:  # the log shipper's, cleared by its next delivered push (its watch says since when)
        out.append(f"  log push not delivered {since(mgr.log_push_error_at, now)}: {_one_line(mgr.log_push_error)}")
    dropped = _dropped(mgr.log_dropped)
    if dropped:
        out.append(f"  log lines dropped (a full backlog): {dropped}")
    out.extend(_manager_view(mgr, now, live))
    out.extend(_ledger(mgr.ledger, now))
    return out


# A count read from a status.json is shown up to this (a file of garbage may hold a number of 400 digits).
_COUNT_MAX = 10**18


def _dropped(dropped: Mapping[str, Any]) -> str:
    """Per source, the lines its full backlog dropped: ``setup 120 (34.5KiB), web 3 (1.0KiB)``; a value not of
    that shape (a status.json of another version) is left out."""
    said = []
    for source, counted in list(dropped.items())[:10]:
        lines = counted.get("lines") if isinstance(counted, Mapping) else None
        size = counted.get("bytes") if isinstance(counted, Mapping) else None
        if all(isinstance(n, int) and 0 <= n <= _COUNT_MAX for n in (lines, size)):
            said.append(f"{cut(str(source), 40)} {lines} ({fmt_bytes(size)})")
    return ", ".join(said)


def _manager_view(mgr: ManagerStatus, now: float, live: bool = True) -> list[str]:
    """The manager's own view of the instance: its row as last read, and the clocks its deadlines run on.

    Not live (the supervisor gone, or status.json read), a deadline is its time of day, not a countdown: what
    became of the row since (given up, killed, still waiting) is not known here."""
    out = []
    if mgr.row is not None:
        out.append(f"  the manager's row: {_one_line(mgr.row.shown)} (read {since(mgr.row.at, now)})")
    for name, clock in mgr.clocks.items():
        if clock.at is None:
            continue
        when = clock_text("%Y-%m-%d %H:%M:%S", clock.at, utc=True)
        line = f"  {name} clock: from {when} UTC ({_one_line(clock.source)})"
        limit = clock.deadline_s
        if limit is not None:
            left = clock.at + limit - now
            if not live:
                when_due = f"at {clock_text('%H:%M:%S', clock.at + limit, utc=True)} UTC"
            else:
                when_due = f"{span(left)} left" if left > 0 else f"passed {span(-left)} ago"
            line += f", deadline {span(limit)}: {when_due}"
        out.append(line)
    return out


def _delivered(last: Delivered | None, now: float) -> str:
    """The manager's last delivered call and its age: ``none`` before the first."""
    if last is None:
        return "none"
    return f"{last.kind if last.kind is not None else UNKNOWN} {since(last.at, now)}"


def _g(value: float | None) -> str:
    return f"{value:g}" if value is not None else UNKNOWN


def _one_line(text: Any) -> str:
    return one_line(text, ONE_LINE_CHARS, mark="")


def _children(snap: Snapshot, now: float, gone: bool) -> list[str]:
    """Each child; ``gone``: its supervisor runs no more (gone, or exited without saving), so each is last known."""
    if not snap.children:
        return ["children: none running"]
    alive = {s.pid for s in snap.fate.survivors} if snap.fate is not None else set()
    out = ["children (last known: alive = still running now):" if gone else "children:"]
    for ch in snap.children:
        usage = ch.usage
        rss = fmt_bytes(usage.rss) if usage is not None and usage.rss is not None else UNKNOWN
        processes, cpu_s = (usage.processes, usage.cpu_s) if usage is not None else (UNKNOWN, UNKNOWN)
        state = ("alive" if alive.intersection((ch.pid, *ch.left)) else "gone") if gone else ch.state
        grace = f", SIGKILL in {span(ch.stop.kill_in_s)} (grace {span(ch.stop.grace_s)})" \
            if ch.stop is not None and not gone else ""
        # (one gone with its supervisor ended at some time unknown: its age, not an uptime that grows for ever)
        up = f"started {since(ch.started_at, now)}" if state == "gone" else f"up {_up(ch.started_at, now)}"
        out.append(f"  {ch.label!s:<24} pid {ch.pid!s:<7} {state!s:<8} {up}, "
                   f"{processes} proc(s), cpu {cpu_s}s, rss {rss}, "
                   f"last output {since(ch.last_output_at, now)}{grace}")
        if ch.left:  # (its pid exited: its stop waits for what it left in its tree)
            out.append(f"      pid {ch.pid} exited; stopping what it left: pid{'s' if len(ch.left) > 1 else ''} "
                       f"{', '.join(str(pid) for pid in ch.left[:8])}{', ...' if len(ch.left) > 8 else ''}")
        for line in ch.last_lines[-3:]:
            out.append(f"      | {cut(line, 160)}")
    return out


def _ledger(entries: Sequence[LedgerEntry], now: float) -> list[str]:
    """What the manager was told, latest last: kind, state, attempts, when, what it was queued
    with (not all of it is sent: docs/operations.md), its answer."""
    if not entries:
        return []
    out = ["  calls (latest last):"]
    for e in entries[-LEDGER_SHOWN:]:
        carried = " ".join(f"{k}={shown_value(v)}" for k, v in e.carried.items())
        answer = ", ".join(f"{k}: {shown_value(v)}" for k, v in e.answer.items())
        when = e.finished or e.created
        line = (f"    {e.kind!s:<12} {e.state!s:<9} {since(when, now)}, "
                f"{e.attempts} attempt(s)" + (f", queued with {carried}" if carried else "")
                + (f" -> {answer}" if answer else ""))
        if e.last_error and e.state != "delivered":
            line += f"; error: {one_line(e.last_error, 160, mark='')}"
        out.append(line)
    return out


def timeline_lines(ph: PhaseStatus, now: float, live: bool) -> list[str]:
    """When the phase started, and how long it took (ended) or has run so far."""
    started, ended, up = ph.started_at, ph.ended_at, ph.up_at
    if started is None:
        return []
    line = f"started {since(started, now)}"
    if ended is not None:
        line += f", took {span(ended - started)}"
    elif live:
        line += f", running for {span(now - started)}"
    if up is not None:
        line += f", up after {span(up - started)}"
    return [line]


def _unmeasured(stall: StallTimer, what: str) -> str:
    """Beside a sign's age, why its silence is no measure now (GPU sampling blind): as the verdict would say; beside
    the output's, that later output said nothing moved (the children's last lines, fresher, seem to belie it)."""
    why = stall.unmeasured.get(what)
    idle = f" (since then only output that said nothing moved, {span(stall.idle_output_s)} ago)" \
        if what == "output" and stall.idle_output_s is not None else ""
    return idle + (f" (not measured now: {_one_line(why)})" if why else "")


def timer_lines(ph: PhaseStatus, now: float, live: bool) -> list[str]:
    """The timers running for the phase (live only: a saved snapshot's timers ran out with its supervisor), in the
    order Timers has them."""
    timers = ph.timers
    if not live:
        return []
    said = []
    if timers.deadline is not None:
        said.append(f"deadline {span(timers.deadline.left_s)} left of timeout_s={_g(timers.deadline.limit_s)}")
    if timers.backoff is not None:
        said.append(f"next attempt in {span(timers.backoff.left_s)}")
    if timers.stall is not None:
        stall = timers.stall
        ages = "".join(f"; {what} {span(age)} ago" + _unmeasured(stall, what) for what, age in stall.signs.items())
        said.append(f"stall: no sign of progress for {span(stall.silent_s)} of stall_s={_g(stall.limit_s)} "
                    f"({span(stall.left_s)} left{ages})")
    if timers.ready is not None:
        ready = timers.ready
        said.append(f"ready wait: {ready.child} {span(ready.waited_s)} of "
                    f"ready_timeout_s={_g(ready.limit_s)} ({span(ready.left_s)} left)")
    if timers.settle is not None:
        said.append(f"settle: daemons kept {span(timers.settle.left_s)} more at most of "
                    f"settle_timeout_s={_g(timers.settle.limit_s)}")
    if timers.hold is not None:
        said.append(f"held {span(timers.hold.left_s)} more at most")
    return ["timers: " + "; ".join(said)] if said else []


def memory_lines(ph: PhaseStatus, now: float, live: bool) -> list[str]:
    """The phase's own cgroup against its memory_max (the limit the cgroup really has)."""
    mem = ph.memory
    if mem is None:
        return []
    if not mem.cgroup:
        return [f"memory_max {fmt_bytes(mem.memory_max)}: no cgroup of its own now (held to it by the preflight)"] \
            if live else []
    limit = fmt_bytes(mem.limit) if mem.limit is not None else "none"
    return [f"memory: usage {fmt_bytes(mem.usage)}, peak {fmt_bytes(mem.peak)}, limit {limit}"
            + (f" (memory_max {fmt_bytes(mem.memory_max)})" if mem.memory_max is not None else "")
            + (f", oom_kills {mem.oom_kills}" if mem.oom_kills else "")]


# What each phase shows under its line, in this order: a concern of its own adds one function here.
PHASE_LINES: list[PhaseLines] = [timeline_lines, progress_lines, timer_lines, memory_lines, summary_lines]
