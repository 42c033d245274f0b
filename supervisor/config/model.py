"""What a config becomes: the plan, a tree of frozen dataclasses, and the defaults it starts from.

Nothing later can change the plan by accident; every timing value starts from a named default. What a
plugin adds to the file (its own tables, its keys in a core table) the plan carries as the plugin made it,
in ``Plan.sections`` and ``Plan.extensions``: the core never looks inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

# Named defaults: every timing value of the plan starts from one of these.
DEFAULT_STATE_DIR = "/var/lib/prover-supervisor"
DEFAULT_LOG_DIR = "/var/log/prover-supervisor"
DEFAULT_STOP_GRACE_S = 30.0
# A stop signal from outside (docker stop: SIGKILL 10 s after its SIGTERM) is done within this, the exit's
# writes and flush included (stopbudget.py); each child's grace is shrunk to fit.
DEFAULT_STOP_BUDGET_S = 8.0
DEFAULT_RING_LINES = 200
DEFAULT_LOG_FILE_MAX_BYTES = 64 * 1024 * 1024
# Daemons such as cuzk-daemon load tens of GiB before they answer; a short
# default startup wait causes more failures than it prevents.
DEFAULT_READY_TIMEOUT_S = 900.0
# How long a start waits for its exec (engine/spawn.py), the loop held meanwhile. An exec that runs takes
# milliseconds, even of a large binary (execve reads its first page); seconds mean the kernel waits on a
# filesystem. Long enough for a machine thrashing under memory pressure, short enough that a hung mount
# costs one late status answer, not a silent supervisor. A command on a slow network mount (s3fs, gcsfuse
# with a cold cache) says more in its own ``exec_wait_s``.
DEFAULT_EXEC_WAIT_S = 5.0
# Its most: the loop is held the whole wait, and docker stop's SIGKILL comes 10 s after its SIGTERM. Past
# this a stop signal during a hung start would be acted on too late for any orderly stop.
MAX_EXEC_WAIT_S = 60.0
DEFAULT_BACKOFF_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_BACKOFF_FACTOR = 2.0
DEFAULT_BACKOFF_JITTER = 0.1
DEFAULT_RESTART_BURST = 5
DEFAULT_RESTART_WINDOW_S = 300.0
DEFAULT_BACKOFF_RESET_S = 60.0

PHASE_KINDS = ("oneshot", "service")
RESTART_POLICIES = ("no", "on-failure", "always")
DAEMON_LIFETIMES = ("phase", "lifecycle")
CGROUP_MODES = ("auto", "shared", "off")
# ``report = "<kind>"``, the core's own: made when a oneshot is "done", or when a service is "up" (a plugin adds more).
# The one table of them: the config checks the key against it, and the reporting (manager/reporting.py) makes
# each call at the moment it names.
ReportWhen = Literal["done", "up"]
PARAM_DONE = "param-done"  # the fetch phase's: its end starts the clock after it (state/firstseen.py)
RUNNING = "running"  # the production phase's (Lifecycle.production_phases)
REPORTS: Mapping[str, ReportWhen] = MappingProxyType({PARAM_DONE: "done", RUNNING: "up"})
# What the reporting sets in every child's environment once the manager answered /register: the variable → the
# answer's field it holds. A config's env may not set one where there is a manager (tables.py ``check_set_env``).
INSTANCE_UUID_ENV = "INSTANCE_UUID"
REGISTER_ENV: Mapping[str, str] = MappingProxyType({INSTANCE_UUID_ENV: "uuid"})
RESUMES = ("no", "outputs", "machine")
DEFAULT_RESUME_MAX_AGE_S = 86400.0
# How long a oneshot's daemons are kept after its command succeeded, for what they finish (``settle``).
DEFAULT_SETTLE_TIMEOUT_S = 300.0
# How long a download is watched before its rate may say it cannot make progress_deadline_s.
DEFAULT_PROGRESS_WINDOW_S = 120.0
DEFAULT_MANAGER_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MANAGER_READ_TIMEOUT_S = 15.0
DEFAULT_LOG_PUSH_INTERVAL_S = 1.0
DEFAULT_LOG_BACKLOG_BYTES = 2 * 1024 * 1024
# How often the manager's row of this instance is read (rowwatch.py); each read is the whole fleet's list.
DEFAULT_ROW_CHECK_S = 300.0
MIN_ROW_CHECK_S = 5.0
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
# memory_high is said past this fraction of a phase's memory limit (the OOM kill comes at 1.0).
DEFAULT_MEMORY_WARN = 0.9
# Kubernetes shows this file's content in `kubectl describe` when a container fails.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"


class ConfigError(Exception):
    """A user mistake in the config: printed as one line, exit status 2."""


@dataclass(frozen=True)
class ReadyCheck:
    """How to tell that a child is ready: never a log line, always a real probe."""

    kind: str  # "tcp", "http", "file", "unix" (a stream socket accepts), or "any" of ``alternatives``
    target: str  # "host:port", the URL, or the path
    host: str = ""
    port: int = 0
    alternatives: tuple[ReadyCheck, ...] = ()  # kind "any": ready as soon as one of these is

    def ports(self) -> list[tuple[str, int]]:
        """The (host, port) pairs its probes connect to (tcp, http, and those of its alternatives): what the
        supervisor checks is free before the child starts and, once one answers, held by the child's own
        tree (ports.py). A plugin's kind declares its ports by being made of these probes."""
        if self.kind == "any":
            return [pair for alternative in self.alternatives for pair in alternative.ports()]
        return [(self.host, self.port)] if self.kind in ("tcp", "http") and self.port else []

    def describe(self) -> str:
        if self.kind == "any":
            return " or ".join(a.describe() for a in self.alternatives)
        return f"{self.kind}://{self.target}" if self.kind != "http" else self.target


@dataclass(frozen=True)
class ChildSpec:
    """One program to run: a phase's command or one of its daemons."""

    phase: str
    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    stop_signal: int
    stop_grace_s: float
    ready: ReadyCheck | None
    ready_timeout_s: float
    exec_wait_s: float = DEFAULT_EXEC_WAIT_S  # the start fails if the exec has not run by then
    lifetime: str = "phase"  # daemons only: "phase" or "lifecycle"
    log_source: str = "setup"  # the manager dashboard tab its output is shipped under

    @property
    def label(self) -> str:
        return f"{self.phase}/{self.name}"


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    kind: str
    command: ChildSpec
    daemons: tuple[ChildSpec, ...]
    timeout_s: float | None
    retries: int
    restart: str
    backoff_s: float
    backoff_max_s: float
    backoff_factor: float
    backoff_jitter: float
    restart_burst: int
    restart_window_s: float
    backoff_reset_s: float
    stall_s: float | None = None
    progress_path: str | None = None
    min_memory: int | None = None
    memory_max: int | None = None
    report: str | None = None  # the manager call its success triggers
    parse: str | None = None  # read the command's output with this parser (a plugin's: "cuzk-bench")
    prepare: str | None = None  # before each attempt, this hook (a plugin's: "cuzk-config" writes cuzk.toml)
    # After the command succeeded, its daemons are kept until this hook (a plugin's) reads in their output that
    # what they do for it is over, for at most settle_timeout_s (lifecycle/phase.py, SETTLING).
    settle: str | None = None
    settle_timeout_s: float = DEFAULT_SETTLE_TIMEOUT_S
    resume: str = "no"  # skip on restart: "outputs" still there, or done on this "machine" recently
    resume_max_age_s: float = DEFAULT_RESUME_MAX_AGE_S
    # Progress (progresswatch.py): the bytes expected, the deadline from the instance's first registration
    # (or first start; firstseen.py) it must make, and how long it is watched before that is judged.
    progress_total: int | None = None
    progress_deadline_s: float | None = None
    progress_window_s: float = DEFAULT_PROGRESS_WINDOW_S
    memory_warn: float = DEFAULT_MEMORY_WARN  # memory_high past this fraction of its limit (0: never)
    gpu_health: bool = False  # a fatal GPU fault or NVML hung for long fails its attempt (gpuhealth.py)
    # An attempt that got further (its download's done bytes rose) is not counted against ``retries``: a
    # resumable download is retried as long as each attempt gets somewhere, within timeout_s.
    retry_while_progressing: bool = False


@dataclass(frozen=True)
class ManagerSpec:
    """The fleet manager (shared/domain/manager-api.md). ``url`` None: reporting is off."""

    url: str | None = None
    label: str = ""
    token_env: str | None = None
    events_url: str | None = None
    connect_timeout_s: float = DEFAULT_MANAGER_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_MANAGER_READ_TIMEOUT_S
    log_push_interval_s: float = DEFAULT_LOG_PUSH_INTERVAL_S
    log_backlog_bytes: int = DEFAULT_LOG_BACKLOG_BYTES
    row_check_s: float = DEFAULT_ROW_CHECK_S

    @property
    def instance(self) -> str:
        """Whose the state_dir's records are (given-up.json, first-seen.json): the label told to the manager; ""
        without one (the hostname a label falls back to changes with each new container: no instance's name)."""
        return self.label if self.url else ""


@dataclass(frozen=True)
class SupervisorSpec:
    state_dir: str
    log_dir: str
    stop_grace_s: float
    ring_lines: int
    console: bool
    log_file_max_bytes: int
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cgroups: str = "auto"
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    http_port: int = 0  # health and metrics on 127.0.0.1; 0: off
    termination_log: str = DEFAULT_TERMINATION_LOG
    min_disk: int | None = None  # fitness: free bytes needed under state_dir
    require_gpus: bool = False  # fitness: no usable GPU (NVML) means unfit
    memory_warn: float = DEFAULT_MEMORY_WARN  # every phase's memory_warn unless it says its own
    stop_budget_s: float = DEFAULT_STOP_BUDGET_S  # the whole stop after a stop signal from outside


@dataclass(frozen=True)
class Plan:
    supervisor: SupervisorSpec
    phases: tuple[PhaseSpec, ...]
    source: str
    manager: ManagerSpec = field(default_factory=ManagerSpec)
    # A plugin's own top-level tables: the table's name → the settings its parser made ("cuzk" → CuzkSettings).
    sections: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # A plugin's keys in a core table: the table's name → {key: value} as the file names them ("manager" →
    # {"min_rate": 50.0, ...}).
    extensions: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    # A key whose whole value is one ${VAR} (or ${VAR:-default}): its place → the variable ("supervisor.require_gpus"
    # → "PROVER_REQUIRE_GPUS"), so that a refusal can say which knob to turn rather than which key to edit.
    env_keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The file the plan was read from (None: a built-in profile, a text): what the supervisor writes never replaces it.
    config_file: str | None = None
