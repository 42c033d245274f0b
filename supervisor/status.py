"""Never silent: what runs, since when, and why, for a person and for machines.

A snapshot says it all; the running supervisor hands one to whoever asks on its
status socket (statussocket.py, whose names are importable from here too). It
also keeps ``state_dir/status.json``, replaced atomically on every transition and
verdict, so ``prover-supervisor status`` still says what happened when no
supervisor runs. What is read back (the file, or an answer on the socket) is
checked against the snapshot's shape before anything uses it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from .loop import EventLoop, Timer
from .states import FINAL_STATES

# The status socket's names, importable from here as before the split (run, cli, config, tests).
from .statussocket import SOCKET_NAME as SOCKET_NAME
from .statussocket import StatusServer as StatusServer
from .statussocket import ask
from .units import fmt_bytes

if TYPE_CHECKING:
    from .lifecycle import Lifecycle
    from .reporting import Reporter
    from .runtime import Runtime

STATE_NAME = "status.json"
SNAPSHOT_VERSION = 1
# status.json is rewritten at once on every change, up to PERSIST_BURST times in PERSIST_WINDOW_S; past
# that (a service restarting in a tight loop) the changes are coalesced into one write per window.
PERSIST_BURST = 20
PERSIST_WINDOW_S = 1.0
# What a snapshot carries at most (and status.json with it): the latest verdicts (the lifecycle keeps
# a few per phase), and each output line cut to this many characters (a line may be 64 KiB).
SNAPSHOT_VERDICTS = 50
SNAPSHOT_LINE_CHARS = 500
# A status.json bigger than this is not one we wrote (what is persisted is capped far below it).
STATE_MAX_READ_BYTES = 16 * 1024 * 1024


def persist(state_dir: Path, snapshot: dict[str, Any]) -> None:
    """Write status.json atomically: a reader (or the next start) never sees half a file."""
    target = state_dir / STATE_NAME
    tmp = target.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # like the socket: for root's eyes
        with os.fdopen(fd, "w") as f:
            json.dump(snapshot, f, default=str)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a half-written copy must not keep the space a full disk needs back
        raise


class StateFile:
    """Keeps status.json up to date without letting it cost the lifecycle anything.

    Every change is written at once, and a phase reaching a final state always is (a SIGKILL
    right after a phase completed must not lose the facts that let the next start skip it);
    but past ``PERSIST_BURST`` writes in ``PERSIST_WINDOW_S`` the other changes wait for the
    window to pass and go out as one write (a service restarting in a loop would otherwise
    fsync it several times a restart). A write that fails (a full disk) is said once, tried
    again at the next change, and said again once it works.
    """

    def __init__(self, state_dir: Path, loop: EventLoop, log: Callable[[str], None],
                 build: Callable[[], dict[str, Any]]) -> None:
        self.path = state_dir / STATE_NAME
        self._state_dir = state_dir
        self._loop = loop
        self._log = log
        self._build = build
        self._recent: deque[float] = deque(maxlen=PERSIST_BURST)  # monotonic times of the last writes
        self._later: Timer | None = None
        self._failing = False

    def changed(self, what: object = None) -> None:
        """A listener of transitions and verdicts: write now, or soon."""
        now = time.monotonic()
        window_open_at = self._recent[0] + PERSIST_WINDOW_S if len(self._recent) == PERSIST_BURST else now
        if _is_final(what) or window_open_at <= now:
            self.save()
        elif self._later is None:
            self._later = self._loop.call_later(window_open_at - now, self.save)

    def save(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        self._recent.append(time.monotonic())
        try:
            persist(self._state_dir, self._build())
        except OSError as exc:
            if not self._failing:
                self._failing = True
                self._log(f"status: cannot write {self.path}: {exc.strerror or exc}; it is tried again at each "
                          "change (the status socket still answers)")
            return
        if self._failing:
            self._failing = False
            self._log(f"status: {self.path} written again")


def _is_final(what: object) -> bool:
    """A phase that reached done, failed or stopped (duck-typed: verdicts call StateFile.changed too)."""
    return getattr(what, "state", None) in FINAL_STATES


def load_persisted(state_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The last persisted snapshot, or None and why (missing, unreadable, or not shaped like one: never fatal)."""
    path = state_dir / STATE_NAME
    try:
        data = json.loads(read_regular_file(path, STATE_MAX_READ_BYTES))
    except FileNotFoundError:
        return None, f"no {path}"
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"{path} is unreadable ({exc.__class__.__name__}: {exc}); ignoring it"
    problem = snapshot_problem(data)
    if problem is not None:
        return None, f"{path} does not hold a status snapshot ({problem}); ignoring it"
    return data, None


def read_regular_file(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them: a FIFO must not hang us, nor /dev/zero fill memory."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes, more than the {limit} a status snapshot can be")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


# What a snapshot read back (status.json, or an answer on the socket) must look like before anything
# reads it: key → a type, a tuple of types, a nested shape (dict), or [shape] for a list of them. A key
# missing is allowed where None is. Numbers must be finite (NaN compares false to everything).
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))
_OPT_DICT = (dict, type(None))


def _maybe(shape: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A section that may be null (a child's usage in the persisted file)."""
    return ("maybe", shape)


SNAPSHOT_SHAPE: dict[str, Any] = {
    "started_at": _OPT_NUM, "written_at": _OPT_NUM,
    "lifecycle": {"state": _OPT_STR, "why": _OPT_STR, "current": _OPT_STR},
    "phases": [{"name": str, "state": str, "why": _OPT_STR, "since": _OPT_NUM, "attempt": (int, type(None)),
                "hold": _OPT_STR, "facts": _OPT_DICT}],
    "children": [{"label": str, "pid": int, "state": str, "started_at": _OPT_NUM, "last_output_at": _OPT_NUM,
                  "usage": _maybe({"processes": (int, type(None)), "cpu_s": _OPT_NUM, "rss": (int, type(None))}),
                  "last_lines": [str]}],
    "gpus": {"why": _OPT_STR, "samples": [{"index": int, "name": str, "utilization": _NUM, "memory_used": int,
                                           "memory_total": int}], "unresponsive": _OPT_DICT},
    "memory": {"mode": _OPT_STR, "why": _OPT_STR, "snapshot": _OPT_STR},
    "manager": {"enabled": (bool, type(None)), "url": _OPT_STR, "uuid": _OPT_STR, "last_error": _OPT_STR,
                "outbox_pending": (int, type(None)), "last_delivered": _OPT_DICT},
    "verdicts": [{"line": str}],
}


def snapshot_problem(data: Any) -> str | None:
    """Where ``data`` differs from SNAPSHOT_SHAPE (the first place), or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    return _shape_problem(data, SNAPSHOT_SHAPE, "")


def _shape_problem(value: dict[str, Any], shape: dict[str, Any], where: str) -> str | None:
    for key, want in shape.items():
        name = f"{where}.{key}" if where else key
        if key not in value:
            if isinstance(want, tuple) and type(None) in want:
                continue
            if isinstance(want, dict | list) or (isinstance(want, tuple) and want[:1] == ("maybe",)):
                continue  # a whole section missing: shown as absent
            return f"{name}: missing"
        problem = _value_problem(value[key], want, name)
        if problem is not None:
            return problem
    return None


def _value_problem(value: Any, want: Any, name: str) -> str | None:
    if isinstance(want, tuple) and want[:1] == ("maybe",):
        return None if value is None else _value_problem(value, want[1], name)
    if isinstance(want, dict):
        return _shape_problem(value, want, name) if isinstance(value, dict) else f"{name}: not an object"
    if isinstance(want, list):
        if not isinstance(value, list):
            return f"{name}: not a list"
        for i, item in enumerate(value):
            problem = _value_problem(item, want[0], f"{name}[{i}]")
            if problem is not None:
                return problem
        return None
    kinds = want if isinstance(want, tuple) else (want,)
    wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
    if isinstance(value, bool) and bool not in kinds:
        return f"{name}: {value!r} where {wanted} belongs"
    if not isinstance(value, kinds):
        return f"{name}: {type(value).__name__} where {wanted} belongs"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name}: {value!r} is not a finite number"
    return None


def query(state_dir: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """Ask the running supervisor; None when none answers on the socket, or not with a snapshot."""
    answer = ask(state_dir, timeout)
    return answer if snapshot_problem(answer) is None else None


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


def _ago(t: Any, now: float) -> str:
    if isinstance(t, bool) or not isinstance(t, int | float) or not t or not math.isfinite(t):
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
    redact = rt.spawning.redactor.text if rt.spawning.redactor else (lambda s: s)
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
                "last_lines": [redact(line)[:SNAPSHOT_LINE_CHARS] for line in child.output.last_lines(10)],
            })
    gpus = rt.evidence.gpus
    # The GPU thread's latest sample (a request keeps samples coming for a while): never NVML itself.
    if gpus is not None and usage:
        gpus.want_for()
    samples = [vars(s) for s in gpus.samples()] if gpus is not None and usage else []
    hung = gpus.unresponsive() if gpus is not None else None
    memory = rt.evidence.memory
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
                    "attempt": p.attempt, "up": p.up, "hold": lifecycle.held(p.name),
                    "bench": vars(p.kept_result) if p.kept_result else None,
                    # A phase not reached in this run keeps what an earlier run learnt about it.
                    "facts": p.facts or p.previous} for p in lifecycle.phases],
        "children": children,
        "gpus": {"available": gpus.available if gpus is not None else False,
                 "why": gpus.why if gpus is not None else "not probed",
                 "samples": samples,
                 "unresponsive": hung.to_dict(time.monotonic()) if hung is not None else None,
                 "slow_calls": gpus.slow_calls if gpus is not None else 0},
        "memory": {"mode": memory.mode if memory else "unavailable", "why": memory.why if memory else "",
                   "snapshot": mem_snap.describe() if mem_snap else None,
                   "usage": mem_snap.usage if mem_snap else None, "limit": mem_snap.limit if mem_snap else None,
                   "peak": mem_snap.peak if mem_snap else None, "oom_kills": mem_snap.oom_kills if mem_snap else None},
        "manager": reporter.status(),
        "verdicts": [{**x.to_dict(), "line": x.line(),
                      "last_lines": [redact(s)[:SNAPSHOT_LINE_CHARS] for s in x.last_lines]}
                     for x in rt.verdicts[-SNAPSHOT_VERDICTS:]],
    }
