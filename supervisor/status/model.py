"""The status snapshot's types: what status.json, the status socket, ``status`` (text and ``--json``) and
/metrics read, as frozen dataclasses.

``Snapshot`` is built in the loop from the live objects (snapshot.py), written as JSON (``to_json``: the keys
and values status.json and ``status --json`` have always had, which users and tests read) and rebuilt from
JSON (``from_json``). A saved status.json may come from an older supervisor, or a broken or hand-edited one:
``from_json`` takes any JSON, and a key that is missing or of the wrong type is read as unknown (None, or an
empty section), never an exception: each field is read as its declared type says (``_reader``), so a field
added is read without a line more. (Whether a file is a snapshot at all is ``shape_problem``'s call, from
the same declared types: that gate comes first, file.snapshot_problem.) Numbers keep their JSON type (an int
stays an int), so that what the supervisor wrote comes back out unchanged.

Some parts belong to the module that makes them and stay mappings inside the typed parts: a plugin's keys on
a phase (Wiring.add_status: ``summary``, ``metrics`` and the rest), the plugin's answer fields on the
manager, a verdict's record (verdict.Verdict.to_dict), a phase's facts and kept result, the manager's row,
what a manager call carried and its answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from types import MappingProxyType, UnionType
from typing import Any, Self, Union, get_args, get_origin, get_type_hints

from ..state.files import json_kind
from ..text.show import shown

# What ``status`` found of the supervisor that wrote a snapshot (Fate.supervisor).
RUNNING, EXITED, GONE, NOT_ANSWERING = "running", "exited", "gone", "not answering"

Reader = Callable[[Any], Any]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# No number the supervisor writes is bigger than this (bytes, seconds, counts fit 64 bits); JSON holds any whole
# number, and one past a float's range made math.isfinite raise.
NUMBER_MAX = float(1 << 63)


def json_number(value: Any) -> float | None:
    """A finite JSON number as it was written (an int stays an int), at most NUMBER_MAX either way; None for
    anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if abs(value) <= NUMBER_MAX else None  # (NaN and the infinities fail it too)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= NUMBER_MAX else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# How a field declared ``X | None`` is read, for each scalar X: anything else is None.
_SCALARS: dict[Any, Reader] = {str: _text, int: _whole, float: json_number, bool: _flag}


def _reader(hint: Any) -> Reader:
    """How a field of the declared type ``hint`` is read from JSON: whatever is not of the type reads as unknown
    (None; an empty tuple or mapping; a part read from an empty object). A part (a _Record) reads its own fields
    the same way; a list keeps its objects (or its lines, as text, or its whole numbers); ``X | None`` is None for
    null, an empty object and any other type; a plain bool is True only for true."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        (inner,) = [arg for arg in args if arg is not type(None)]
        if _is_record(inner):
            return lambda value: inner.from_json(value) if isinstance(value, dict) and value else None
        if get_origin(inner) is Mapping:
            return lambda value: value if isinstance(value, dict) else None
        return _SCALARS[inner]
    if hint is bool:
        return lambda value: value is True
    if origin is tuple:
        item = args[0]
        if item is str:
            return lambda value: tuple(str(line) for line in value) if isinstance(value, list) else ()
        if item is int:
            return lambda value: tuple(n for n in map(_whole, value) if n is not None) \
                if isinstance(value, list) else ()
        return lambda value: tuple(item.from_json(x) for x in value if isinstance(x, dict)) \
            if isinstance(value, list) else ()
    if origin is Mapping:
        item = args[1]
        if item is Any:
            return _object
        if _is_record(item):
            return lambda value: {str(k): item.from_json(v) for k, v in _object(value).items() if isinstance(v, dict)}
        read = _reader(item)
        return lambda value: {str(k): read(v) for k, v in _object(value).items()}
    if _is_record(hint):
        return lambda value: hint.from_json(_object(value))
    raise TypeError(f"no JSON reading for a field of type {hint!r}")


# A field a snapshot read back must have (``shape_problem``): what names a phase, a child, a GPU sample, a verdict.
REQUIRED = MappingProxyType({"required": True})
# What a JSON value of a scalar field may be (a float field takes an int: JSON does not tell them apart).
_KINDS: dict[Any, tuple[type, ...]] = {str: (str,), int: (int,), float: (int, float), bool: (bool,)}
_WANTED = {str: "string", int: "whole number", float: "number", bool: "boolean"}  # (in JSON's words)


def shape_problem(kind: type[_Record], data: Mapping[str, Any], where: str = "") -> str | None:
    """Where ``data`` is not JSON of ``kind`` (the first place), or None: the gate before ``from_json`` (which
    reads anything) for what was read back, a status.json or a socket's answer (file.snapshot_problem). Each
    field present must be of its declared type (a part an object, a tuple a list, numbers finite); a field
    marked REQUIRED must be there and not null; any other may be missing or null. Keys that are no field (a
    plugin's) are not looked at."""
    hints = _hints(kind)
    for f in fields(kind):  # type: ignore[arg-type]
        name = f"{where}.{f.name}" if where else f.name
        required = bool(f.metadata.get("required"))
        if f.name not in data:
            if required:
                return f"{name}: missing"
            continue
        problem = _field_problem(hints[f.name], data[f.name], name, required)
        if problem is not None:
            return problem
    return None


def _field_problem(hint: Any, value: Any, name: str, required: bool) -> str | None:
    if get_origin(hint) in (Union, UnionType):
        (hint,) = [arg for arg in get_args(hint) if arg is not type(None)]
    if value is None and not required:
        return None
    origin, args = get_origin(hint), get_args(hint)
    if _is_record(hint):
        return shape_problem(hint, value, name) if isinstance(value, dict) else f"{name}: not an object"
    if origin is tuple:
        if not isinstance(value, list):
            return f"{name}: not a list"
        # (an item is never null: a list holds lines or objects)
        problems = (_field_problem(args[0], item, f"{name}[{i}]", True) for i, item in enumerate(value))
        return next((p for p in problems if p is not None), None)
    if origin is Mapping:
        if not isinstance(value, dict):
            return f"{name}: not an object"
        if args[1] is Any:
            return None
        problems = (_field_problem(args[1], item, f"{name}.{key}", False) for key, item in value.items())
        return next((p for p in problems if p is not None), None)
    kinds = _KINDS[hint]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        found = shown(value) if isinstance(value, bool) else json_kind(value)  # (true or false: the value says it)
        return f"{name}: {found} where {_WANTED[hint]}{'' if required else ' or null'} belongs"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name}: {value!r} is not a finite number"
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > NUMBER_MAX:
        return f"{name}: a number too big to be ours"
    return None


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, _Record)


def _json(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _json(item) for key, item in value.items()}
    return value


class _Record:
    """A part of the snapshot: its fields are its JSON keys, in order, each read as its declared type says
    (_reader). A part with a rule of its own overrides ``from_json`` or ``to_json``."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(**{name: read(data.get(name)) for name, read in _readers(cls).items()})

    def to_json(self) -> dict[str, Any]:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


def _others(kind: type[_Record], data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are none of ``kind``'s fields (a plugin's, a verdict's record), as they are."""
    known = _readers(kind)
    return {key: value for key, value in data.items() if key not in known}


def _hints_of(kind: type) -> dict[str, Any]:
    """Each field's declared type (the annotations evaluated once per part: the readers and the gate use them)."""
    return get_type_hints(kind)


def _readers_of(kind: type) -> dict[str, Reader]:
    """Each field of ``kind`` and how it is read (worked out once per part)."""
    hints = _hints(kind)
    return {f.name: _reader(hints[f.name]) for f in fields(kind)}


# Once per part. (Typed by hand: mypy takes a dataclass's class, whose instances are unhashable, for unhashable.)
_hints: Callable[[type], dict[str, Any]] = cache(_hints_of)
_readers: Callable[[type], dict[str, Reader]] = cache(_readers_of)


# ---------------------------------------------------------------- the lifecycle


@dataclass(frozen=True)
class Failure(_Record):
    """The verdict that failed the lifecycle, for ``status`` to lead with, and the log file that has the rest."""

    phase: str | None = None
    child: str | None = None
    reason: str | None = None
    detail: str | None = None
    status: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    at: float | None = None
    line: str | None = None
    last_lines: tuple[str, ...] = ()
    log_file: str | None = None


@dataclass(frozen=True)
class LifecycleStatus(_Record):
    state: str | None = None  # starting, running, stopping, stopped
    why: str | None = None
    exit_status: int | None = None
    current: str | None = None  # the current phase's name
    failure: Failure | None = None


# ---------------------------------------------------------------- a phase: its timers and its memory


@dataclass(frozen=True)
class DeadlineTimer(_Record):
    limit_s: float | None = None  # timeout_s
    left_s: float | None = None


@dataclass(frozen=True)
class LeftTimer(_Record):
    """A timer that says only what it has left: the backoff to the next attempt, the lifecycle's hold."""

    left_s: float | None = None


@dataclass(frozen=True)
class StallTimer(_Record):
    limit_s: float | None = None  # stall_s
    silent_s: float | None = None
    left_s: float | None = None
    signs: Mapping[str, float | None] = field(default_factory=dict)  # each sign of progress → its age, seconds
    unmeasured: Mapping[str, str | None] = field(default_factory=dict)  # a sign whose silence is no measure now → why
    idle_output_s: float | None = None  # the age of the output since the last that was a sign, that said nothing moved

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        if not self.unmeasured:  # written only when a sign is not measured: the usual stall timer is as it was
            del written["unmeasured"]
        if self.idle_output_s is None:  # (and only while output said nothing moved)
            del written["idle_output_s"]
        return written


@dataclass(frozen=True)
class ReadyTimer(_Record):
    child: str | None = None  # the child waited for
    limit_s: float | None = None  # its ready_timeout_s
    waited_s: float | None = None
    left_s: float | None = None


@dataclass(frozen=True)
class Timers(_Record):
    """The timers running for a phase (snapshot.phase_timers); only those running are written."""

    deadline: DeadlineTimer | None = None
    backoff: LeftTimer | None = None
    stall: StallTimer | None = None
    ready: ReadyTimer | None = None
    settle: DeadlineTimer | None = None  # the daemons kept after the command (settle_timeout_s)
    hold: LeftTimer | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: timer for name, timer in super().to_json().items() if timer is not None}


@dataclass(frozen=True)
class PhaseMemory(_Record):
    """The phase's own cgroup against its memory_max; ``cgroup`` False: it has none now (the rest is unwritten)."""

    memory_max: int | None = None
    cgroup: bool = False
    usage: int | None = None
    peak: int | None = None
    limit: int | None = None
    oom_kills: int | None = None

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        return written if self.cgroup else {"memory_max": self.memory_max, "cgroup": False}


@dataclass(frozen=True)
class DownloadProgress(_Record):
    """A download's figures (transfer.Progress.to_dict: exactly these keys), drawn by transfer.progress_text."""

    done_bytes: int | None = None
    total_bytes: int | None = None
    rate_bytes_s: float | None = None  # None: not measured yet
    eta_s: float | None = None  # None: no total, or no rate
    files_done: int | None = None


@dataclass(frozen=True)
class PhaseStatus(_Record):
    name: str | None = field(default=None, metadata=REQUIRED)
    kind: str | None = None  # oneshot, service
    state: str | None = field(default=None, metadata=REQUIRED)  # a PhaseState's value
    since: float | None = None
    why: str | None = None
    attempt: int | None = None
    up: bool | None = None
    hold: str | None = None  # why the lifecycle is held at it, while it is
    progress: DownloadProgress | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)  # what resume keeps of it
    started_at: float | None = None  # the phase's timeline (states.Timeline): wall times
    up_at: float | None = None  # the first time it came up
    up_since: float | None = None  # when the attempt up now came up (a restart starts it anew); None: not up
    ended_at: float | None = None
    timers: Timers = field(default_factory=Timers)
    memory: PhaseMemory | None = None
    # What a plugin adds (Wiring.add_status), as it added, and its output parser's kept result under the
    # fact's name (Phase.kept_as): written flat in the phase's object, last.
    plugin: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return replace(super().from_json(data), plugin=_others(cls, data))

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        plugin = written.pop("plugin")
        return {**written, **plugin}  # the plugin's keys flat in the phase's object, last


# ---------------------------------------------------------------- the children


@dataclass(frozen=True)
class Usage(_Record):
    """CPU seconds and RSS of a child's process tree (psutil): left out of status.json (it costs time)."""

    processes: int | None = None
    cpu_s: float | None = None
    rss: int | None = None


@dataclass(frozen=True)
class StopTimer(_Record):
    """A child being stopped: its grace (stop_grace_s, or less under a stop budget) and how long until SIGKILL."""

    grace_s: float | None = None
    kill_in_s: float | None = None


@dataclass(frozen=True)
class ChildStatus(_Record):
    label: str | None = field(default=None, metadata=REQUIRED)  # phase/child
    pid: int | None = field(default=None, metadata=REQUIRED)
    phase: str | None = None
    state: str | None = field(default=None, metadata=REQUIRED)  # running, stopping, stopped by SIGSTOP (job control)
    started_at: float | None = None
    last_output_at: float | None = None
    usage: Usage | None = None
    stop: StopTimer | None = None
    last_lines: tuple[str, ...] = ()
    log_from: int | None = None  # where its output begins in its log file (an earlier run's comes before)
    left: tuple[int, ...] = ()  # its pid exited, its stop under way: the pids of its tree still running


# ---------------------------------------------------------------- the machine: GPUs, watches, memory


@dataclass(frozen=True)
class GpuSampleStatus(_Record):
    """One GPU as the GPU thread last sampled it (gpu.GpuSample)."""

    index: int | None = field(default=None, metadata=REQUIRED)
    name: str | None = field(default=None, metadata=REQUIRED)
    utilization: float | None = None  # percent; null: NVML does not measure it on this GPU (MIG mode on)
    memory_used: int | None = field(default=None, metadata=REQUIRED)  # bytes
    memory_total: int | None = field(default=None, metadata=REQUIRED)


@dataclass(frozen=True)
class HungCallStatus(_Record):
    """An NVML call that has not returned (gpu.HungCall)."""

    call: str | None = None
    since: float | None = None  # wall time
    for_s: float | None = None


@dataclass(frozen=True)
class GpuLeftOut(_Record):
    """A GPU NVML counts that the samples lack, and why (gpu.GpuReading.left_out): no handle, lost, unreadable."""

    index: int | None = field(default=None, metadata=REQUIRED)
    why: str | None = field(default=None, metadata=REQUIRED)


@dataclass(frozen=True)
class GpuStatus(_Record):
    available: bool | None = None
    why: str | None = None
    samples: tuple[GpuSampleStatus, ...] = ()  # none in status.json (a sample costs time)
    left_out: tuple[GpuLeftOut, ...] = ()  # the GPUs the samples lack, with why (as the samples: live only)
    unresponsive: HungCallStatus | None = None
    slow_calls: int | None = None
    sampled_s_ago: float | None = None  # the samples' age when the snapshot was taken; null: none shown
    # The samples are no longer current (too old, or an NVML call hangs since): shown with their age, never as now.
    samples_stale: bool = False


@dataclass(frozen=True)
class WatchStatus(_Record):
    """One watch's own state (watchstate.WatchState.to_dict)."""

    state: str | None = None  # reading, blind, idle, stopped, starting
    since: float | None = None  # wall time
    last_reading_s_ago: float | None = None
    why: str | None = None
    window_s: float | None = None
    readings: int | None = None
    misses: int | None = None
    failures: int | None = None


@dataclass(frozen=True)
class MemoryHigh(_Record):
    """A phase's last memory_high (memwatch.py): when, how full, of which limit, the line said."""

    at: float | None = None
    fraction: float | None = None
    limit: int | None = None
    line: str | None = None


@dataclass(frozen=True)
class MemoryStatus(_Record):
    """The memory evidence: its mode, and the cgroup that holds the container's memory (``snapshot``: it in one
    line; MemoryEvidence.container_snapshot)."""

    mode: str | None = None
    why: str | None = None
    snapshot: str | None = None
    usage: int | None = None
    limit: int | None = None
    peak: int | None = None
    oom_kills: int | None = None
    warnings: Mapping[str, MemoryHigh] = field(default_factory=dict)  # by phase


@dataclass(frozen=True)
class LogFiles(_Record):
    dir: str | None = None
    supervisor: str | None = None  # the supervisor's own log file


# ---------------------------------------------------------------- the manager


@dataclass(frozen=True)
class Delivered(_Record):
    """The manager's last delivered call."""

    kind: str | None = None
    id: int | None = None  # its outbox row
    at: float | None = None


@dataclass(frozen=True)
class LedgerEntry(_Record):
    """One call the manager was told (ledger.ledger): its state, attempts, what it was queued with, its answer."""

    id: int | None = None
    kind: str | None = None
    state: str | None = None
    attempts: int | None = None
    created: float | None = None
    finished: float | None = None
    carried: Mapping[str, Any] = field(default_factory=dict)  # the queued payload's scalar values
    answer: Mapping[str, Any] = field(default_factory=dict)  # the answer's scalar values
    last_error: str | None = None


@dataclass(frozen=True)
class RowStatus(_Record):
    """The manager's row of this instance as last read (rowwatch.RowReading.to_dict)."""

    at: float | None = None
    row: Mapping[str, Any] | None = None  # the row's fields (row.Row)
    unlisted: bool | None = None  # the manager's list answered without this uuid
    error: str | None = None
    shown: str | None = None  # what status says of it


@dataclass(frozen=True)
class ClockStatus(_Record):
    """A clock the manager's deadlines run on (firstseen.FirstSeen): from when, what started it, its deadline."""

    at: float | None = None
    source: str | None = None
    deadline_s: float | None = None  # written only where the clock has a deadline

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        return written if self.deadline_s is not None else {"at": self.at, "source": self.source}


@dataclass(frozen=True)
class ManagerStatus(_Record):
    """The manager reporting (reporting.Reporter.status); with reporting off, only ``enabled`` is written."""

    enabled: bool = False
    url: str | None = None
    label: str | None = None
    uuid: str | None = None
    answers: Mapping[str, Any] = field(default_factory=dict)  # a plugin's register answer fields, by name
    outbox_pending: int | None = None
    last_delivered: Delivered | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    ledger: tuple[LedgerEntry, ...] = ()
    log_backlog: Mapping[str, Any] = field(default_factory=dict)
    log_push_error: str | None = None  # the latest log push not delivered (None once one is)
    log_push_error_at: float | None = None
    log_dropped: Mapping[str, Any] = field(default_factory=dict)  # per source: {"lines", "bytes"} dropped
    row: RowStatus | None = None
    killed: str | None = None  # the manager's kill of the instance, in one line
    clocks: Mapping[str, ClockStatus] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return replace(super().from_json(data), answers=_others(cls, data))

    def to_json(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False}
        written = super().to_json()
        answers = written.pop("answers")
        identity = {key: written.pop(key) for key in ("enabled", "url", "label", "uuid")}
        return {**identity, **answers, **written}  # the answer fields next to the uuid, as the reporting writes


# ---------------------------------------------------------------- verdicts, the exit, the writer's fate


@dataclass(frozen=True)
class VerdictStatus(_Record):
    """A verdict: its line, and its record as the lifecycle keeps it (verdict.Verdict.to_dict, lines cut)."""

    line: str | None = field(default=None, metadata=REQUIRED)
    record: Mapping[str, Any] = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return _text(self.record.get("reason"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return replace(super().from_json(data), record=_others(cls, data))

    def to_json(self) -> dict[str, Any]:
        return {**self.record, "line": self.line}


@dataclass(frozen=True)
class Exiting(_Record):
    """The lifecycle is over and the exit waits for the manager (exitflush.ExitFlush)."""

    status: int | None = None
    flush_left_s: float | None = None
    giving_up: bool | None = None


@dataclass(frozen=True)
class Survivor(_Record):
    """A process a gone supervisor started that is still alive (trees.left_alive_by)."""

    pid: int | None = None
    name: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Fate(_Record):
    """What ``status`` found of the supervisor that wrote the snapshot (command.py), never written by it:
    ``supervisor`` is RUNNING, EXITED, GONE or NOT_ANSWERING; a gone one says since when, and what it left."""

    supervisor: str | None = None
    gone_since: float | None = None  # written for a gone one only
    survivors: tuple[Survivor, ...] = ()
    # Its pid is of another PID namespace than the reader's: whether it lives cannot be told here (written if so).
    elsewhere: bool = False
    # It exited, but its exit could not save its last state (a full disk): the snapshot is of before (written if so).
    unsaved: bool = False

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        if self.supervisor != GONE:
            del written["gone_since"]
        for flag in ("elsewhere", "unsaved"):
            if not written[flag]:
                del written[flag]
        return written


# ---------------------------------------------------------------- the whole


@dataclass(frozen=True)
class Snapshot(_Record):
    """Everything the status view shows (snapshot.snapshot builds it in the loop). What every supervisor has written
    since the first is REQUIRED: a JSON object without it (``{}``, another program's) is no snapshot."""

    version: int | None = None
    pid: int | None = field(default=None, metadata=REQUIRED)  # the supervisor's
    # The PID namespace ``pid`` is of (a container's supervisor is pid 1 of its own); None: a supervisor before it was
    # written, whose pid is taken for one of the reader's namespace.
    pid_ns: int | None = None
    # When ``pid`` started (trees.start_ticks): a live process of that pid started at another time is not the writer.
    # None: a supervisor before it was written, whose pid is judged by its command line alone.
    pid_start: int | None = None
    role: str | None = None
    started_at: float | None = None
    written_at: float | None = field(default=None, metadata=REQUIRED)
    config: str | None = None
    lifecycle: LifecycleStatus = field(default_factory=LifecycleStatus, metadata=REQUIRED)
    phases: tuple[PhaseStatus, ...] = field(default=(), metadata=REQUIRED)
    children: tuple[ChildStatus, ...] = ()
    gpus: GpuStatus = field(default_factory=GpuStatus)
    watches: Mapping[str, WatchStatus] = field(default_factory=dict)
    memory: MemoryStatus = field(default_factory=MemoryStatus)
    logs: LogFiles | None = None  # None: no log_dir (written as {})
    manager: ManagerStatus = field(default_factory=ManagerStatus)
    verdicts: tuple[VerdictStatus, ...] = ()
    exiting: Exiting | None = None  # written only while the exit waits for the manager
    # Its status socket was listening when this was written: only then does the socket file's absence say its exit
    # removed it (command.writer_fate). None: a supervisor before it was written.
    listening: bool | None = None
    fate: Fate | None = None  # what ``status`` found of the writer (command.py); its keys are written flat

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return replace(super().from_json(data), fate=Fate.from_json(data) if "supervisor" in data else None)

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        written["logs"] = written["logs"] or {}
        if written["exiting"] is None:
            del written["exiting"]
        fate = written.pop("fate")
        return {**written, **(fate or {})}

    @property
    def gone(self) -> bool:
        """Its supervisor is gone: killed from outside, what it started perhaps still running."""
        return self.fate is not None and self.fate.supervisor == GONE

    def current_phase(self) -> PhaseStatus | None:
        """The phase the lifecycle is at (by the lifecycle's ``current``), if it is among the phases."""
        return next((p for p in self.phases if p.name == self.lifecycle.current), None) \
            if self.lifecycle.current is not None else None

    def found(self, fate: Fate) -> Snapshot:
        """The snapshot with what ``status`` found of its writer."""
        return replace(self, fate=fate)
