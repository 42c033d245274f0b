"""What a config becomes: the plan, a tree of frozen dataclasses, and the defaults it starts from.

Nothing later can change the plan by accident; every timing value starts from a named default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..prover.cuzkconf import CuzkSettings

# Named defaults: every timing value of the plan starts from one of these.
DEFAULT_STATE_DIR = "/var/lib/prover-supervisor"
DEFAULT_LOG_DIR = "/var/log/prover-supervisor"
DEFAULT_STOP_GRACE_S = 30.0
DEFAULT_RING_LINES = 200
DEFAULT_LOG_FILE_MAX_BYTES = 64 * 1024 * 1024
# Daemons such as cuzk-daemon load tens of GiB before they answer; a short
# default startup wait causes more failures than it prevents.
DEFAULT_READY_TIMEOUT_S = 900.0
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
REPORTS = ("param-done", "bench-done", "running")
PREPARES = ("cuzk-config",)
RESUMES = ("no", "outputs", "machine")
DEFAULT_RESUME_MAX_AGE_S = 86400.0
PARSERS = ("cuzk-bench", "cuzk-single")  # a batch with its summary; one proof's result block
DEFAULT_MANAGER_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MANAGER_READ_TIMEOUT_S = 15.0
DEFAULT_MIN_RATE = 50.0
DEFAULT_LOG_PUSH_INTERVAL_S = 1.0
DEFAULT_LOG_BACKLOG_BYTES = 2 * 1024 * 1024
# How long production waits for the manager's verdict on the benchmark before it starts anyway.
DEFAULT_BENCH_GATE_S = 300.0
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
# Kubernetes shows this file's content in `kubectl describe` when a container fails.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# ``ready = "cuzk"``: the cuzk-daemon's own readiness, from the [cuzk] table (see readiness.cuzk_ready).
CUZK_READY = "cuzk"


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
    parse: str | None = None  # read the command's output as this program's ("cuzk-bench")
    prepare: str | None = None  # before each attempt: "cuzk-config" writes cuzk.toml for this machine
    resume: str = "no"  # skip on restart: "outputs" still there, or done on this "machine" recently
    resume_max_age_s: float = DEFAULT_RESUME_MAX_AGE_S


@dataclass(frozen=True)
class ManagerSpec:
    """The fleet manager (manager-api.md). ``url`` None: reporting is off."""

    url: str | None = None
    label: str = ""
    min_rate: float = DEFAULT_MIN_RATE
    token_env: str | None = None
    events_url: str | None = None
    connect_timeout_s: float = DEFAULT_MANAGER_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_MANAGER_READ_TIMEOUT_S
    log_push_interval_s: float = DEFAULT_LOG_PUSH_INTERVAL_S
    log_backlog_bytes: int = DEFAULT_LOG_BACKLOG_BYTES
    bench_gate_s: float = DEFAULT_BENCH_GATE_S
    # A failure before production sends bench-done with rate 0: the manager destroys the instance now.
    give_up_on_failure: bool = True
    # Send the failure's reason in that bench-done (only for a manager that reads it).
    bench_done_reason: bool = False


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
    min_param_disk: int | None = None  # fitness: free bytes needed under the parameter cache (less what is there)
    require_gpus: bool = False  # fitness: no usable GPU (NVML) means unfit


@dataclass(frozen=True)
class Plan:
    supervisor: SupervisorSpec
    phases: tuple[PhaseSpec, ...]
    source: str
    manager: ManagerSpec = field(default_factory=ManagerSpec)
    cuzk: CuzkSettings | None = None
