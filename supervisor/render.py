"""What ``prover-supervisor status`` prints for a person: a snapshot (live, or status.json) as text.

A pure function of the snapshot and the time: the same text whether the snapshot came from the
running supervisor's socket or from the file it last wrote (``live`` says which).
"""

from __future__ import annotations

import math
import time
from typing import Any

from .transfer import progress_text
from .units import fmt_bytes


def _ago(t: Any, now: float) -> str:
    """How long ago epoch time ``t`` was, short (``42s``, ``3m05s``, ``2h10m``); ``?`` for what is no time."""
    if isinstance(t, bool) or not isinstance(t, int | float) or not t or not math.isfinite(t):
        return "?"
    s = max(0, int(now - t))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def phase_notes(ph: dict[str, Any]) -> list[str]:
    """The lines under a phase beside its state: what a plugin says of it (``summary``), its memory_high."""
    return [f"      {ph['summary']}"] if ph.get("summary") else []


def memory_notes(mem: dict[str, Any]) -> list[str]:
    """Each phase's last memory_high, with when it was said."""
    return [f"  {w['line']} (at {time.strftime('%H:%M:%S', time.localtime(w['at']))})"
            for w in (mem.get("warnings") or {}).values()]


def render(snap: dict[str, Any], live: bool, now: float | None = None) -> str:
    """The status text; ``now`` (epoch seconds, default the time) is what the ages are counted from."""
    now = time.time() if now is None else now
    out = []
    if live:
        up = _ago(snap.get("started_at"), now)
        out.append(f"prover-supervisor pid {snap.get('pid')} as {snap.get('role')}, up {up} "
                   f"(config: {snap.get('config')})")
    else:
        out.append(f"no prover-supervisor is running; last state written {_ago(snap.get('written_at'), now)} ago "
                   f"by pid {snap.get('pid')}")
    state = snap.get("lifecycle", {})
    out.append(f"lifecycle: {state.get('state')}" + (f" ({state.get('why')})" if state.get("why") else ""))
    current = state.get("current")
    if current:
        out.append(f"current phase: {current}")
    out.append("phases:")
    for ph in snap.get("phases", []):
        hold = f"; held: {ph['hold']}" if ph.get("hold") else ""
        out.append(f"  {ph['name']:<12} {ph['state']:<9} since {_ago(ph.get('since'), now)} ago, "
                   f"attempt {ph.get('attempt')}: {ph.get('why', '')}{hold}")
        progress = progress_text(ph.get("progress"))
        if progress:
            out.append(f"  {'':<12} progress {progress}")
        out.extend(phase_notes(ph))
    children = snap.get("children", [])
    out.append("children:" if children else "children: none running")
    for ch in children:
        usage = ch.get("usage") or {}
        rss = fmt_bytes(usage.get("rss")) if usage.get("rss") is not None else "?"
        out.append(f"  {ch['label']:<24} pid {ch['pid']:<7} {ch['state']:<8} up {_ago(ch.get('started_at'), now)}, "
                   f"{usage.get('processes', '?')} proc(s), cpu {usage.get('cpu_s', '?')}s, rss {rss}, "
                   f"last output {_ago(ch.get('last_output_at'), now)} ago")
        for line in ch.get("last_lines", [])[-3:]:
            out.append(f"      | {line[:160]}")
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
    mem = snap.get("memory", {})
    out.append(f"memory: {mem.get('mode')}; {mem.get('snapshot') or mem.get('why', '')}")
    out.extend(memory_notes(mem))
    mgr = snap.get("manager", {})
    if mgr.get("enabled"):
        last = mgr.get("last_delivered") or {}
        out.append(f"manager: {mgr.get('url')} uuid {mgr.get('uuid')}, outbox {mgr.get('outbox_pending')} pending, "
                   f"last delivered {last.get('kind', 'none')} {_ago(last.get('at'), now) + ' ago' if last else ''}"
                   + (f", last error: {mgr['last_error']}" if mgr.get("last_error") else ""))
    else:
        out.append("manager: reporting off")
    verdicts = snap.get("verdicts", [])
    if verdicts:
        out.append("verdicts (latest last):")
        for v in verdicts[-10:]:
            out.append(f"  {v.get('line')}")
    return "\n".join(out)
