"""Config file → validated, frozen plan.

The lifecycle is described in TOML (read with ``tomllib``). Everything a run needs is checked here,
before anything starts: unknown keys, wrong types, impossible values and unset ``${VAR}`` references
are all refused with one line that names the key (``phases[1].daemons[0].ready: ...``). The result is
a tree of frozen dataclasses, so nothing later can change the plan by accident.

The package, by concern:

- ``model``: the plan's frozen dataclasses, ConfigError, and the named defaults;
- ``values``: the value checkers and the bounds every number and string is held to;
- ``tables``: what each TOML table may hold, and the named rules between its keys;
- ``load``: reading the file safely, TOML, ``${VAR}`` expansion, assembling the plan.

Every name importers use is re-exported here: ``from supervisor.config import load_plan``.
"""

from .load import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_TEXT,
    MAX_NESTING,
    MAX_SHOWN_PATH,
    default_label,
    load_plan,
    parse_plan,
    read_config,
)
from .model import (
    CGROUP_MODES,
    CUZK_READY,
    DAEMON_LIFETIMES,
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_BACKOFF_JITTER,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_RESET_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_BENCH_GATE_S,
    DEFAULT_CGROUP_ROOT,
    DEFAULT_LOG_BACKLOG_BYTES,
    DEFAULT_LOG_DIR,
    DEFAULT_LOG_FILE_MAX_BYTES,
    DEFAULT_LOG_PUSH_INTERVAL_S,
    DEFAULT_MANAGER_CONNECT_TIMEOUT_S,
    DEFAULT_MANAGER_READ_TIMEOUT_S,
    DEFAULT_MIN_RATE,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_BURST,
    DEFAULT_RESTART_WINDOW_S,
    DEFAULT_RESUME_MAX_AGE_S,
    DEFAULT_RING_LINES,
    DEFAULT_STATE_DIR,
    DEFAULT_STOP_GRACE_S,
    DEFAULT_TERMINATION_LOG,
    PARSERS,
    PHASE_KINDS,
    PREPARES,
    REPORTS,
    RESTART_POLICIES,
    RESUMES,
    ChildSpec,
    ConfigError,
    ManagerSpec,
    PhaseSpec,
    Plan,
    ReadyCheck,
    SupervisorSpec,
)

# The key tables: the tests walk them (every *_s key bounded, every key fuzzed).
from .tables import _CUZK_KEYS, _DAEMON_KEYS, _MANAGER_KEYS, _PHASE_KEYS, _SUPERVISOR_KEYS
from .values import (
    MAX_ARG_BYTES,
    MAX_BACKOFF_FACTOR,
    MAX_BENCH_CONCURRENCY,
    MAX_COUNT,
    MAX_LOG_BACKLOG_BYTES,
    MAX_LOG_FILE_MAX_BYTES,
    MAX_NAME_BYTES,
    MAX_OVERRIDE_WORKERS,
    MAX_PATH_BYTES,
    MAX_RESTART_BURST,
    MAX_RETRIES,
    MAX_RING_LINES,
    MAX_SECONDS,
    MAX_SECONDS_TEXT,
    MAX_SOCKET_PATH_BYTES,
    Checker,
    check_state_dir,
    parse_signal,
)

__all__ = [
    "CGROUP_MODES", "CUZK_READY", "DAEMON_LIFETIMES", "DEFAULT_BACKOFF_FACTOR", "DEFAULT_BACKOFF_JITTER",
    "DEFAULT_BACKOFF_MAX_S", "DEFAULT_BACKOFF_RESET_S", "DEFAULT_BACKOFF_S", "DEFAULT_BENCH_GATE_S",
    "DEFAULT_CGROUP_ROOT", "DEFAULT_LOG_BACKLOG_BYTES", "DEFAULT_LOG_DIR", "DEFAULT_LOG_FILE_MAX_BYTES",
    "DEFAULT_LOG_PUSH_INTERVAL_S", "DEFAULT_MANAGER_CONNECT_TIMEOUT_S", "DEFAULT_MANAGER_READ_TIMEOUT_S",
    "DEFAULT_MIN_RATE", "DEFAULT_READY_TIMEOUT_S", "DEFAULT_RESTART_BURST", "DEFAULT_RESTART_WINDOW_S",
    "DEFAULT_RESUME_MAX_AGE_S", "DEFAULT_RING_LINES", "DEFAULT_STATE_DIR", "DEFAULT_STOP_GRACE_S",
    "DEFAULT_TERMINATION_LOG", "MAX_ARG_BYTES", "MAX_BACKOFF_FACTOR", "MAX_BENCH_CONCURRENCY", "MAX_CONFIG_BYTES",
    "MAX_CONFIG_TEXT", "MAX_COUNT", "MAX_LOG_BACKLOG_BYTES", "MAX_LOG_FILE_MAX_BYTES", "MAX_NAME_BYTES",
    "MAX_NESTING", "MAX_OVERRIDE_WORKERS", "MAX_PATH_BYTES", "MAX_RESTART_BURST", "MAX_RETRIES", "MAX_RING_LINES",
    "MAX_SECONDS", "MAX_SECONDS_TEXT", "MAX_SHOWN_PATH", "MAX_SOCKET_PATH_BYTES", "PARSERS", "PHASE_KINDS",
    "PREPARES", "REPORTS", "RESTART_POLICIES", "RESUMES", "_CUZK_KEYS", "_DAEMON_KEYS", "_MANAGER_KEYS",
    "_PHASE_KEYS", "_SUPERVISOR_KEYS", "Checker", "ChildSpec", "ConfigError", "ManagerSpec", "PhaseSpec", "Plan",
    "ReadyCheck", "SupervisorSpec", "check_state_dir", "default_label", "load_plan", "parse_plan", "parse_signal",
    "read_config",
]
