"""Never silent: what runs, since when, and why, for a person and for machines.

The running supervisor answers on a unix socket ``state_dir/status.sock``
(mode 0600: the status names processes and paths) with one JSON snapshot per
connection, built in the loop so it is consistent. It also keeps
``state_dir/status.json``, replaced atomically on every transition and verdict,
so ``prover-supervisor status`` still says what happened when no supervisor runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from .loop import EventLoop
from .units import fmt_bytes

if TYPE_CHECKING:
    from .lifecycle import Lifecycle, Runtime
    from .reporting import Reporter

SOCKET_NAME = "status.sock"
STATE_NAME = "status.json"
SEND_TIMEOUT_S = 2.0
SNAPSHOT_VERSION = 1


class StatusServer:
    """Answers each connection on the unix socket with one snapshot, from the loop."""

    def __init__(self, loop: EventLoop, state_dir: Path, build: Callable[[], dict[str, Any]],
                 log: Callable[[str], None]) -> None:
        self.path = state_dir / SOCKET_NAME
        self._build = build
        self._loop = loop
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of an earlier (killed) supervisor
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # created 0600 from the start, not chmod'ed after
        try:
            self._sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        self._sock.listen(8)
        self._sock.setblocking(False)
        loop.add_reader(self._sock.fileno(), self._accept)
        self._log = log

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return
        with conn:
            try:
                data = json.dumps(self._build(), default=str).encode() + b"\n"
                conn.settimeout(SEND_TIMEOUT_S)
                conn.sendall(data)
            except (OSError, ValueError) as exc:
                self._log(f"status: could not answer a status request: {exc}")

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def persist(state_dir: Path, snapshot: dict[str, Any]) -> None:
    """Write status.json atomically: a reader (or the next start) never sees half a file."""
    target = state_dir / STATE_NAME
    tmp = target.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # like the socket: for root's eyes
    with os.fdopen(fd, "w") as f:
        json.dump(snapshot, f, default=str)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(target)


def load_persisted(state_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The last persisted snapshot, or None and why (missing, or corrupt: never fatal)."""
    path = state_dir / STATE_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"no {path}"
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc.__class__.__name__}); ignoring it"
    if not isinstance(data, dict):
        return None, f"{path} does not hold a status object; ignoring it"
    return data, None


def resume_facts(snap: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Phase name → the facts a later start resumes from; None if the file has another shape.

    Only well-formed facts pass: ``done_at`` a number, ``outputs`` a name → size table,
    ``bench`` and ``machine`` tables. Anything else means "start clean", never a crash.
    """
    phases = snap.get("phases")
    if not isinstance(phases, list):
        return None
    out: dict[str, dict[str, Any]] = {}
    for phase in phases:
        if not isinstance(phase, dict) or not isinstance(phase.get("name"), str):
            return None
        facts = phase.get("facts") or {}
        if not isinstance(facts, dict):
            return None
        done_at = facts.get("done_at")
        outputs = facts.get("outputs")
        if done_at is not None and (isinstance(done_at, bool) or not isinstance(done_at, int | float)):
            return None
        if outputs is not None and not (isinstance(outputs, dict) and all(
                isinstance(k, str) and isinstance(v, int) for k, v in outputs.items())):
            return None
        if any(facts.get(key) is not None and not isinstance(facts[key], dict) for key in ("bench", "machine")):
            return None
        out[phase["name"]] = facts
    return out


def query(state_dir: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """Ask the running supervisor; None when none answers on the socket."""
    path = state_dir / SOCKET_NAME
    if not path.exists():
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def tree_usage(pid: int) -> dict[str, Any]:
    """CPU seconds and RSS of a process and its descendants (psutil)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {"processes": 0, "cpu_s": None, "rss": None}
    cpu = rss = 0.0
    count = 0
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                rss += proc.memory_info().rss
                count += 1
        except psutil.Error:
            continue
    return {"processes": count, "cpu_s": round(cpu, 2), "rss": int(rss)}


# ---------------------------------------------------------------- rendering for a person


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "?"
    s = max(0, int(now - t))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def render(snap: dict[str, Any], live: bool) -> str:
    now = time.time()
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
    if gpus.get("samples"):
        for g in gpus["samples"]:
            out.append(f"gpu {g['index']}: {g['name']} util {g['utilization']}% "
                       f"mem {fmt_bytes(g['memory_used'])}/{fmt_bytes(g['memory_total'])}")
    else:
        out.append(f"gpus: {gpus.get('why', 'no GPU')}")
    mem = snap.get("memory", {})
    out.append(f"memory: {mem.get('mode')}; {mem.get('snapshot') or mem.get('why', '')}")
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


# ---------------------------------------------------------------- the snapshot


def snapshot(*, role: str, started_at: float, config: str, lifecycle: Lifecycle, rt: Runtime,
             reporter: Reporter, usage: bool = True) -> dict[str, Any]:
    """Everything the status view shows, from the loop's own objects (call it in the loop).

    ``usage=False`` (the persisted file) leaves out what costs time to measure: the
    children's CPU and RSS, and a GPU sample (NVML's first load takes milliseconds)."""
    redact = rt.redactor.text if rt.redactor else (lambda s: s)
    current = lifecycle.current()
    children = []
    for phase in lifecycle.phases:
        for child in phase.live_children():
            children.append({
                "label": child.label, "pid": child.pid, "phase": phase.name,
                "state": "stopping" if child.stop_reason else "running",
                "started_at": child.started_at,
                "last_output_at": (time.time() - (time.monotonic() - child.output.last_output_at))
                if child.output.last_output_at else None,
                "usage": tree_usage(child.pid) if usage else None,
                "last_lines": [redact(line) for line in child.output.last_lines(10)],
            })
    gpus = rt.gpus
    samples = [vars(s) for s in gpus.sample()] if gpus is not None and usage else []
    memory = rt.memory
    mem_snap = memory.shared.snapshot() if memory is not None and memory.shared is not None else None
    if lifecycle.shutting_down:
        life_state = "stopping" if lifecycle.exit_status is None or any(children) else "stopped"
    elif current is None:
        life_state = "starting"
    else:
        life_state = "running"
    return {
        "version": SNAPSHOT_VERSION,
        "pid": os.getpid(),
        "role": role,
        "started_at": started_at,
        "written_at": time.time(),
        "config": config,
        "lifecycle": {"state": life_state, "why": lifecycle.shutdown_reason,
                      "exit_status": lifecycle.exit_status,
                      "current": current.name if current else None},
        "phases": [{"name": p.name, "kind": p.spec.kind, "state": str(p.state), "since": p.since, "why": p.why,
                    "attempt": p.attempt, "up": p.up, "hold": p.hold,
                    "bench": vars(p.bench_result) if p.bench_result else None,
                    # A phase not reached in this run keeps what an earlier run learnt about it.
                    "facts": p.facts or p.previous} for p in lifecycle.phases],
        "children": children,
        "gpus": {"available": gpus.available if gpus is not None else False,
                 "why": gpus.why if gpus is not None else "not probed",
                 "samples": samples},
        "memory": {"mode": memory.mode if memory else "unavailable", "why": memory.why if memory else "",
                   "snapshot": mem_snap.describe() if mem_snap else None,
                   "usage": mem_snap.usage if mem_snap else None, "limit": mem_snap.limit if mem_snap else None,
                   "peak": mem_snap.peak if mem_snap else None, "oom_kills": mem_snap.oom_kills if mem_snap else None},
        "manager": reporter.status(),
        "verdicts": [{**x.to_dict(), "line": x.line(), "last_lines": [redact(s) for s in x.last_lines]}
                     for x in rt.verdicts[-50:]],
    }
