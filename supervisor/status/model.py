"""The status snapshot's types: what status.json, the status socket, ``status`` (text and ``--json``) and
/metrics read, as frozen dataclasses.

``Snapshot`` is built in the loop from the live objects (snapshot.py), written as JSON (``to_json``: the keys
and values status.json and ``status --json`` have always had, which users and tests read) and rebuilt from
JSON (``from_json``). A saved status.json may come from an older supervisor, or a broken or hand-edited one:
``from_json`` takes any JSON, and a key that is missing or of the wrong type is read as unknown (None, or an
empty section), never an exception. (Whether a file is a snapshot at all is file.snapshot_problem's call:
that gate comes first.) Numbers keep their JSON type (an int stays an int), so that what the supervisor
wrote comes back out unchanged.

Some parts belong to the module that makes them and stay mappings inside the typed parts: a plugin's keys on
a phase (Wiring.add_status: ``summary``, ``metrics`` and the rest), the plugin's answer fields on the
manager, a verdict's record (verdict.Verdict.to_dict), a phase's facts and kept result, the manager's row,
what a manager call carried and its answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Self, TypeVar

# What ``status`` found of the supervisor that wrote a snapshot (Fate.supervisor).
RUNNING, EXITED, GONE, NOT_ANSWERING = "running", "exited", "gone", "not answering"

R = TypeVar("R", bound="_Record")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    """A finite JSON number as it was written (an int stays an int); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _lines(value: Any) -> tuple[str, ...]:
    return tuple(str(line) for line in _items(value))


def _records(value: Any, kind: type[R]) -> tuple[R, ...]:
    """Each JSON object of a list, read as ``kind``; what is not an object is left out."""
    return tuple(kind.from_json(item) for item in _items(value) if isinstance(item, dict))


def _section(value: Any, kind: type[R]) -> R | None:
    """A JSON object read as ``kind``; None for null, an empty object, or what is not an object."""
    return kind.from_json(value) if isinstance(value, dict) and value else None


def _json(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _json(item) for key, item in value.items()}
    return value


class _Record:
    """A part of the snapshot: its fields are its JSON keys, in order (a part with a rule of its own overrides
    ``to_json``)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(phase=_text(data.get("phase")), child=_text(data.get("child")), reason=_text(data.get("reason")),
                   detail=_text(data.get("detail")), status=_whole(data.get("status")),
                   exit_code=_whole(data.get("exit_code")), signal=_text(data.get("signal")),
                   at=_number(data.get("at")), line=_text(data.get("line")), last_lines=_lines(data.get("last_lines")),
                   log_file=_text(data.get("log_file")))


@dataclass(frozen=True)
class LifecycleStatus(_Record):
    state: str | None = None  # starting, running, stopping, stopped
    why: str | None = None
    exit_status: int | None = None
    current: str | None = None  # the current phase's name
    failure: Failure | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(state=_text(data.get("state")), why=_text(data.get("why")),
                   exit_status=_whole(data.get("exit_status")), current=_text(data.get("current")),
                   failure=_section(data.get("failure"), Failure))


# ---------------------------------------------------------------- a phase: its timers and its memory


@dataclass(frozen=True)
class DeadlineTimer(_Record):
    limit_s: float | None = None  # timeout_s
    left_s: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(limit_s=_number(data.get("limit_s")), left_s=_number(data.get("left_s")))


@dataclass(frozen=True)
class LeftTimer(_Record):
    """A timer that says only what it has left: the backoff to the next attempt, the lifecycle's hold."""

    left_s: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(left_s=_number(data.get("left_s")))


@dataclass(frozen=True)
class StallTimer(_Record):
    limit_s: float | None = None  # stall_s
    silent_s: float | None = None
    left_s: float | None = None
    signs: Mapping[str, float | None] = field(default_factory=dict)  # each sign of progress → its age, seconds

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(limit_s=_number(data.get("limit_s")), silent_s=_number(data.get("silent_s")),
                   left_s=_number(data.get("left_s")),
                   signs={str(what): _number(age) for what, age in _object(data.get("signs")).items()})


@dataclass(frozen=True)
class ReadyTimer(_Record):
    child: str | None = None  # the child waited for
    limit_s: float | None = None  # its ready_timeout_s
    waited_s: float | None = None
    left_s: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(child=_text(data.get("child")), limit_s=_number(data.get("limit_s")),
                   waited_s=_number(data.get("waited_s")), left_s=_number(data.get("left_s")))


@dataclass(frozen=True)
class Timers(_Record):
    """The timers running for a phase (timers.phase_timers); only those running are written."""

    deadline: DeadlineTimer | None = None
    backoff: LeftTimer | None = None
    stall: StallTimer | None = None
    ready: ReadyTimer | None = None
    hold: LeftTimer | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(deadline=_section(data.get("deadline"), DeadlineTimer),
                   backoff=_section(data.get("backoff"), LeftTimer), stall=_section(data.get("stall"), StallTimer),
                   ready=_section(data.get("ready"), ReadyTimer), hold=_section(data.get("hold"), LeftTimer))

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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(memory_max=_whole(data.get("memory_max")), cgroup=data.get("cgroup") is True,
                   usage=_whole(data.get("usage")), peak=_whole(data.get("peak")), limit=_whole(data.get("limit")),
                   oom_kills=_whole(data.get("oom_kills")))

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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(done_bytes=_whole(data.get("done_bytes")), total_bytes=_whole(data.get("total_bytes")),
                   rate_bytes_s=_number(data.get("rate_bytes_s")), eta_s=_number(data.get("eta_s")),
                   files_done=_whole(data.get("files_done")))


# The keys of a phase's object that are the core's; every other key is a plugin's (PhaseStatus.plugin).
_PHASE_KEYS = ("name", "kind", "state", "since", "why", "attempt", "up", "hold", "bench", "progress", "facts",
               "started_at", "up_at", "ended_at", "timers", "memory")


@dataclass(frozen=True)
class PhaseStatus(_Record):
    name: str | None = None
    kind: str | None = None  # oneshot, service
    state: str | None = None  # a PhaseState's value
    since: float | None = None
    why: str | None = None
    attempt: int | None = None
    up: bool | None = None
    hold: str | None = None  # why the lifecycle is held at it, while it is
    bench: Mapping[str, Any] | None = None  # the kept result (Phase.kept_result)
    progress: DownloadProgress | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)  # what resume keeps of it
    started_at: float | None = None  # the timeline (timers.Timeline): wall times
    up_at: float | None = None
    ended_at: float | None = None
    timers: Timers = field(default_factory=Timers)
    memory: PhaseMemory | None = None
    plugin: Mapping[str, Any] = field(default_factory=dict)  # what a plugin adds (Wiring.add_status), as it added

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        bench = data.get("bench")
        return cls(name=_text(data.get("name")), kind=_text(data.get("kind")), state=_text(data.get("state")),
                   since=_number(data.get("since")), why=_text(data.get("why")), attempt=_whole(data.get("attempt")),
                   up=_flag(data.get("up")), hold=_text(data.get("hold")),
                   bench=bench if isinstance(bench, dict) else None,
                   progress=_section(data.get("progress"), DownloadProgress), facts=_object(data.get("facts")),
                   started_at=_number(data.get("started_at")), up_at=_number(data.get("up_at")),
                   ended_at=_number(data.get("ended_at")), timers=Timers.from_json(_object(data.get("timers"))),
                   memory=_section(data.get("memory"), PhaseMemory),
                   plugin={key: value for key, value in data.items() if key not in _PHASE_KEYS})

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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(processes=_whole(data.get("processes")), cpu_s=_number(data.get("cpu_s")),
                   rss=_whole(data.get("rss")))


@dataclass(frozen=True)
class StopTimer(_Record):
    """A child being stopped: its grace (stop_grace_s) and how long until SIGKILL."""

    grace_s: float | None = None
    kill_in_s: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(grace_s=_number(data.get("grace_s")), kill_in_s=_number(data.get("kill_in_s")))


@dataclass(frozen=True)
class ChildStatus(_Record):
    label: str | None = None  # phase/child
    pid: int | None = None
    phase: str | None = None
    state: str | None = None  # running, stopping
    started_at: float | None = None
    last_output_at: float | None = None
    usage: Usage | None = None
    stop: StopTimer | None = None
    last_lines: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(label=_text(data.get("label")), pid=_whole(data.get("pid")), phase=_text(data.get("phase")),
                   state=_text(data.get("state")), started_at=_number(data.get("started_at")),
                   last_output_at=_number(data.get("last_output_at")),
                   usage=_section(data.get("usage"), Usage), stop=_section(data.get("stop"), StopTimer),
                   last_lines=_lines(data.get("last_lines")))


# ---------------------------------------------------------------- the machine: GPUs, watches, memory


@dataclass(frozen=True)
class GpuSampleStatus(_Record):
    """One GPU as the GPU thread last sampled it (gpu.GpuSample)."""

    index: int | None = None
    name: str | None = None
    utilization: float | None = None  # percent
    memory_used: int | None = None  # bytes
    memory_total: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(index=_whole(data.get("index")), name=_text(data.get("name")),
                   utilization=_number(data.get("utilization")), memory_used=_whole(data.get("memory_used")),
                   memory_total=_whole(data.get("memory_total")))


@dataclass(frozen=True)
class HungCallStatus(_Record):
    """An NVML call that has not returned (gpu.HungCall)."""

    call: str | None = None
    since: float | None = None  # wall time
    for_s: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(call=_text(data.get("call")), since=_number(data.get("since")), for_s=_number(data.get("for_s")))


@dataclass(frozen=True)
class GpuStatus(_Record):
    available: bool | None = None
    why: str | None = None
    samples: tuple[GpuSampleStatus, ...] = ()  # none in status.json (a sample costs time)
    unresponsive: HungCallStatus | None = None
    slow_calls: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(available=_flag(data.get("available")), why=_text(data.get("why")),
                   samples=_records(data.get("samples"), GpuSampleStatus),
                   unresponsive=_section(data.get("unresponsive"), HungCallStatus),
                   slow_calls=_whole(data.get("slow_calls")))


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(state=_text(data.get("state")), since=_number(data.get("since")),
                   last_reading_s_ago=_number(data.get("last_reading_s_ago")), why=_text(data.get("why")),
                   window_s=_number(data.get("window_s")), readings=_whole(data.get("readings")),
                   misses=_whole(data.get("misses")), failures=_whole(data.get("failures")))


@dataclass(frozen=True)
class MemoryHigh(_Record):
    """A phase's last memory_high (memwatch.py): when, how full, of which limit, the line said."""

    at: float | None = None
    fraction: float | None = None
    limit: int | None = None
    line: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(at=_number(data.get("at")), fraction=_number(data.get("fraction")),
                   limit=_whole(data.get("limit")), line=_text(data.get("line")))


@dataclass(frozen=True)
class MemoryStatus(_Record):
    """The memory evidence: its mode, and the supervisor's cgroup (``snapshot``: it in one line)."""

    mode: str | None = None
    why: str | None = None
    snapshot: str | None = None
    usage: int | None = None
    limit: int | None = None
    peak: int | None = None
    oom_kills: int | None = None
    warnings: Mapping[str, MemoryHigh] = field(default_factory=dict)  # by phase

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(mode=_text(data.get("mode")), why=_text(data.get("why")), snapshot=_text(data.get("snapshot")),
                   usage=_whole(data.get("usage")), limit=_whole(data.get("limit")), peak=_whole(data.get("peak")),
                   oom_kills=_whole(data.get("oom_kills")),
                   warnings={str(phase): MemoryHigh.from_json(w)
                             for phase, w in _object(data.get("warnings")).items() if isinstance(w, dict)})


@dataclass(frozen=True)
class LogFiles(_Record):
    dir: str | None = None
    supervisor: str | None = None  # the supervisor's own log file

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(dir=_text(data.get("dir")), supervisor=_text(data.get("supervisor")))


# ---------------------------------------------------------------- the manager


@dataclass(frozen=True)
class Delivered(_Record):
    """The manager's last delivered call."""

    kind: str | None = None
    id: int | None = None  # its outbox row
    at: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(kind=_text(data.get("kind")), id=_whole(data.get("id")), at=_number(data.get("at")))


@dataclass(frozen=True)
class LedgerEntry(_Record):
    """One call the manager was told (ledger.ledger): its state, attempts, what it carried and its answer."""

    id: int | None = None
    kind: str | None = None
    state: str | None = None
    attempts: int | None = None
    created: float | None = None
    finished: float | None = None
    carried: Mapping[str, Any] = field(default_factory=dict)  # the call's scalar values
    answer: Mapping[str, Any] = field(default_factory=dict)  # the answer's scalar values
    last_error: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(id=_whole(data.get("id")), kind=_text(data.get("kind")), state=_text(data.get("state")),
                   attempts=_whole(data.get("attempts")), created=_number(data.get("created")),
                   finished=_number(data.get("finished")), carried=_object(data.get("carried")),
                   answer=_object(data.get("answer")), last_error=_text(data.get("last_error")))


@dataclass(frozen=True)
class RowStatus(_Record):
    """The manager's row of this instance as last read (rowwatch.RowReading.to_dict)."""

    at: float | None = None
    row: Mapping[str, Any] | None = None  # the row's fields (row.Row)
    listed: bool | None = None
    error: str | None = None
    shown: str | None = None  # what status says of it

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        row = data.get("row")
        return cls(at=_number(data.get("at")), row=row if isinstance(row, dict) else None,
                   listed=_flag(data.get("listed")), error=_text(data.get("error")), shown=_text(data.get("shown")))


@dataclass(frozen=True)
class ClockStatus(_Record):
    """A clock the manager's deadlines run on (firstseen.FirstSeen): from when, what started it, its deadline."""

    at: float | None = None
    source: str | None = None
    deadline_s: float | None = None  # written only where the clock has a deadline

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(at=_number(data.get("at")), source=_text(data.get("source")),
                   deadline_s=_number(data.get("deadline_s")))

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        return written if self.deadline_s is not None else {"at": self.at, "source": self.source}


# The keys of the manager's object that are the reporting's; every other key is a plugin's register answer field.
_MANAGER_KEYS = ("enabled", "url", "label", "uuid", "outbox_pending", "last_delivered", "last_error",
                 "last_error_at", "ledger", "log_backlog", "row", "killed", "clocks")


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
    row: RowStatus | None = None
    killed: str | None = None  # the manager's kill of the instance, in one line
    clocks: Mapping[str, ClockStatus] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(enabled=data.get("enabled") is True, url=_text(data.get("url")), label=_text(data.get("label")),
                   uuid=_text(data.get("uuid")),
                   answers={key: value for key, value in data.items() if key not in _MANAGER_KEYS},
                   outbox_pending=_whole(data.get("outbox_pending")),
                   last_delivered=_section(data.get("last_delivered"), Delivered),
                   last_error=_text(data.get("last_error")), last_error_at=_number(data.get("last_error_at")),
                   ledger=_records(data.get("ledger"), LedgerEntry), log_backlog=_object(data.get("log_backlog")),
                   row=_section(data.get("row"), RowStatus), killed=_text(data.get("killed")),
                   clocks={str(name): ClockStatus.from_json(clock)
                           for name, clock in _object(data.get("clocks")).items() if isinstance(clock, dict)})

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

    line: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return _text(self.record.get("reason"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(line=_text(data.get("line")), record={k: v for k, v in data.items() if k != "line"})

    def to_json(self) -> dict[str, Any]:
        return {**self.record, "line": self.line}


@dataclass(frozen=True)
class Exiting(_Record):
    """The lifecycle is over and the exit waits for the manager (exitflush.ExitFlush)."""

    status: int | None = None
    flush_left_s: float | None = None
    giving_up: bool | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(status=_whole(data.get("status")), flush_left_s=_number(data.get("flush_left_s")),
                   giving_up=_flag(data.get("giving_up")))


@dataclass(frozen=True)
class Survivor(_Record):
    """A process a gone supervisor started that is still alive (survivors.left_alive_by)."""

    pid: int | None = None
    name: str | None = None
    tag: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(pid=_whole(data.get("pid")), name=_text(data.get("name")), tag=_text(data.get("tag")))


@dataclass(frozen=True)
class Fate(_Record):
    """What ``status`` found of the supervisor that wrote the snapshot (command.py), never written by it:
    ``supervisor`` is RUNNING, EXITED, GONE or NOT_ANSWERING; a gone one says since when, and what it left."""

    supervisor: str | None = None
    gone_since: float | None = None  # written for a gone one only
    survivors: tuple[Survivor, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(supervisor=_text(data.get("supervisor")), gone_since=_number(data.get("gone_since")),
                   survivors=_records(data.get("survivors"), Survivor))

    def to_json(self) -> dict[str, Any]:
        written = super().to_json()
        if self.supervisor != GONE:
            del written["gone_since"]
        return written


# ---------------------------------------------------------------- the whole


@dataclass(frozen=True)
class Snapshot(_Record):
    """Everything the status view shows (snapshot.snapshot builds it in the loop)."""

    version: int | None = None
    pid: int | None = None  # the supervisor's
    role: str | None = None
    started_at: float | None = None
    written_at: float | None = None
    config: str | None = None
    lifecycle: LifecycleStatus = field(default_factory=LifecycleStatus)
    phases: tuple[PhaseStatus, ...] = ()
    children: tuple[ChildStatus, ...] = ()
    gpus: GpuStatus = field(default_factory=GpuStatus)
    watches: Mapping[str, WatchStatus] = field(default_factory=dict)
    memory: MemoryStatus = field(default_factory=MemoryStatus)
    logs: LogFiles | None = None  # None: no log_dir (written as {})
    manager: ManagerStatus = field(default_factory=ManagerStatus)
    verdicts: tuple[VerdictStatus, ...] = ()
    exiting: Exiting | None = None  # written only while the exit waits for the manager
    fate: Fate | None = None  # what ``status`` found of the writer (command.py); its keys are written flat

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(version=_whole(data.get("version")), pid=_whole(data.get("pid")), role=_text(data.get("role")),
                   started_at=_number(data.get("started_at")), written_at=_number(data.get("written_at")),
                   config=_text(data.get("config")),
                   lifecycle=LifecycleStatus.from_json(_object(data.get("lifecycle"))),
                   phases=_records(data.get("phases"), PhaseStatus),
                   children=_records(data.get("children"), ChildStatus),
                   gpus=GpuStatus.from_json(_object(data.get("gpus"))),
                   watches={str(name): WatchStatus.from_json(w)
                            for name, w in _object(data.get("watches")).items() if isinstance(w, dict)},
                   memory=MemoryStatus.from_json(_object(data.get("memory"))),
                   logs=_section(data.get("logs"), LogFiles),
                   manager=ManagerStatus.from_json(_object(data.get("manager"))),
                   verdicts=_records(data.get("verdicts"), VerdictStatus),
                   exiting=_section(data.get("exiting"), Exiting),
                   fate=Fate.from_json(data) if "supervisor" in data else None)

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
