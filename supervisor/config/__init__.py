"""Config file → validated, frozen plan.

The lifecycle is described in TOML (read with ``tomllib``). Everything a run needs is checked here,
before anything starts: unknown keys, wrong types, impossible values and unset ``${VAR}`` references
are all refused with one line that names the key (``phases[1] (bench).daemons[0] (cuzk).ready: ...``). The result is
a tree of frozen dataclasses, so nothing later can change the plan by accident.

The package owns the file format of the generic supervisor: ``[supervisor]``, ``[manager]`` (the manager's
address, label and client), ``[[phases]]``. It knows no domain: what a plugin adds (a table of its own such
as ``[cuzk]``, keys in a core table, the kinds ``prepare``/``parse``/``ready``/``report`` may name) is declared
by the plugin with ``Key`` and the checkers below, and arrives as ``load_plan(path, plugin)``. It imports only
foundation modules (``units``, ``redact``, ``state_files``), never the layers above it.

By concern:

- ``model``: the plan's frozen dataclasses, ConfigError, and the named defaults;
- ``values``: the value checkers and the bounds every number and string is held to;
- ``keys``: ``Key``, checking a table against its keys, and what the config reads of a plugin;
- ``tables``: what each core table may hold, the kinds a phase may name, the named rules between keys;
- ``load``: reading the file safely, TOML, ``${VAR}`` expansion, assembling the plan.

Every public name importers use is re-exported here: ``from supervisor.config import load_plan``. The key
tables themselves are in ``tables`` (``PHASE_KEYS``...), for the tests that walk them.
"""

from .keys import ConfigPlugin, Key, take
from .load import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_TEXT,
    MAX_NESTING,
    MAX_SHOWN_PATH,
    default_label,
    load_plan,
    load_state_dir,
    parse_plan,
    read_config,
)
from .model import (
    CGROUP_MODES,
    DAEMON_LIFETIMES,
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_BACKOFF_JITTER,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_RESET_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_CGROUP_ROOT,
    DEFAULT_EXEC_WAIT_S,
    DEFAULT_LOG_BACKLOG_BYTES,
    DEFAULT_LOG_DIR,
    DEFAULT_LOG_FILE_MAX_BYTES,
    DEFAULT_LOG_PUSH_INTERVAL_S,
    DEFAULT_MANAGER_CONNECT_TIMEOUT_S,
    DEFAULT_MANAGER_READ_TIMEOUT_S,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_BURST,
    DEFAULT_RESTART_WINDOW_S,
    DEFAULT_RESUME_MAX_AGE_S,
    DEFAULT_RING_LINES,
    DEFAULT_STATE_DIR,
    DEFAULT_STOP_GRACE_S,
    DEFAULT_TERMINATION_LOG,
    MAX_EXEC_WAIT_S,
    PARAM_DONE,
    PHASE_KINDS,
    REPORTS,
    RESTART_POLICIES,
    RESUMES,
    RUNNING,
    ChildSpec,
    ConfigError,
    ManagerSpec,
    PhaseSpec,
    Plan,
    ReadyCheck,
    ReportWhen,
    SupervisorSpec,
)
from .values import (
    MAX_ARG_BYTES,
    MAX_BACKOFF_FACTOR,
    MAX_COUNT,
    MAX_LOG_BACKLOG_BYTES,
    MAX_LOG_FILE_MAX_BYTES,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    MAX_RESTART_BURST,
    MAX_RETRIES,
    MAX_RING_LINES,
    MAX_SECONDS,
    MAX_SECONDS_TEXT,
    MAX_SOCKET_PATH_BYTES,
    Checker,
    absolute_path,
    check_arg,
    check_bool,
    check_file_to_write,
    check_number,
    check_path,
    check_seconds,
    check_size,
    check_state_dir,
    check_table,
    host_port,
    http_url,
    join_key,
    one_of,
    parse_signal,
    whole_number,
    written,
)

__all__ = [
    "CGROUP_MODES", "DAEMON_LIFETIMES", "DEFAULT_BACKOFF_FACTOR", "DEFAULT_BACKOFF_JITTER", "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_BACKOFF_RESET_S", "DEFAULT_BACKOFF_S", "DEFAULT_CGROUP_ROOT", "DEFAULT_EXEC_WAIT_S",
    "DEFAULT_LOG_BACKLOG_BYTES",
    "DEFAULT_LOG_DIR", "DEFAULT_LOG_FILE_MAX_BYTES", "DEFAULT_LOG_PUSH_INTERVAL_S",
    "DEFAULT_MANAGER_CONNECT_TIMEOUT_S", "DEFAULT_MANAGER_READ_TIMEOUT_S", "DEFAULT_READY_TIMEOUT_S",
    "DEFAULT_RESTART_BURST", "DEFAULT_RESTART_WINDOW_S", "DEFAULT_RESUME_MAX_AGE_S", "DEFAULT_RING_LINES",
    "DEFAULT_STATE_DIR", "DEFAULT_STOP_GRACE_S", "DEFAULT_TERMINATION_LOG", "MAX_ARG_BYTES", "MAX_BACKOFF_FACTOR",
    "MAX_CONFIG_BYTES", "MAX_CONFIG_TEXT", "MAX_COUNT", "MAX_EXEC_WAIT_S", "MAX_LOG_BACKLOG_BYTES",
    "MAX_LOG_FILE_MAX_BYTES",
    "MAX_NAME_BYTES", "MAX_NESTING", "MAX_PATH_BYTES", "MAX_RESTART_BURST", "MAX_RETRIES", "MAX_RING_LINES",
    "MAX_SECONDS", "MAX_SECONDS_TEXT", "MAX_SHOWN_PATH", "MAX_SOCKET_PATH_BYTES", "PARAM_DONE", "PHASE_KINDS",
    "REPORTS", "RESTART_POLICIES", "RESUMES", "RUNNING", "Checker", "ChildSpec", "ConfigError", "ConfigPlugin", "Key",
    "ManagerSpec", "PhaseSpec", "Plan", "ReadyCheck", "ReportWhen", "SupervisorSpec", "absolute_path", "check_arg",
    "check_bool", "check_file_to_write",
    "check_number", "check_path", "check_seconds", "check_size", "check_state_dir", "check_table", "default_label",
    "host_port", "http_url", "join_key", "load_plan", "load_state_dir", "one_of",
    "parse_plan", "parse_signal", "read_config", "take", "whole_number", "written",
]
