"""What each TOML table may hold, and the rules between its keys.

The key tables are declarative: a key, its checker and its default. An unknown key is an error with
a "did you mean" hint (typos must not pass). What one key alone cannot say (a oneshot has no
``restart``, ``resume = "outputs"`` needs ``progress_path``...) is a named rule below, applied by
load.py in the order the file is read, so the first mistake in the file is the one reported.
"""

from __future__ import annotations

import difflib
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..prover.cuzkconf import MEMORY_MODELS, PER_PARTITION, PW_BASELINE, PW_PER_WORKER, UNIFIED_BASELINE, CuzkSettings
from .endpoint import _url
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
    PhaseSpec,
)
from .values import (
    MAX_BENCH_CONCURRENCY,
    MAX_LOG_BACKLOG_BYTES,
    MAX_LOG_FILE_MAX_BYTES,
    MAX_OVERRIDE_WORKERS,
    MAX_RESTART_BURST,
    MAX_RETRIES,
    MAX_RING_LINES,
    Checker,
    _arg,
    _bool,
    _bool_text,
    _choice,
    _command,
    _describe,
    _env,
    _env_name,
    _factor,
    _fraction,
    _int_text,
    _join,
    _name,
    _optional,
    _path,
    _port,
    _positive_seconds,
    _rate,
    _ready,
    _seconds,
    _size,
    _string,
    _table,
    _whole,
    check_state_dir,
    parse_signal,
)


@dataclass(frozen=True)
class _Key:
    check: Checker
    default: Any = None
    required: bool = False


def _take(table: Any, where: str, keys: Mapping[str, _Key]) -> dict[str, Any]:
    """Check one TOML table against its keys: unknown keys are errors (typos must not pass)."""
    table = _table(table, where)
    for key in table:
        if key not in keys:
            near = difflib.get_close_matches(key, list(keys), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{_join(where, key)}: unknown key{hint}")
    out: dict[str, Any] = {}
    for key, spec in keys.items():
        if key in table:
            out[key] = spec.check(table[key], _join(where, key))
        elif spec.required:
            raise ConfigError(f"{_join(where, key)}: required key is missing")
        else:
            out[key] = spec.default
    return out


# ---------------------------------------------------------------- the tables

_SUPERVISOR_KEYS = {
    "state_dir": _Key(check_state_dir, DEFAULT_STATE_DIR),
    "log_dir": _Key(_path, DEFAULT_LOG_DIR),
    "stop_grace_s": _Key(_seconds, DEFAULT_STOP_GRACE_S),
    "ring_lines": _Key(_whole(1, MAX_RING_LINES), DEFAULT_RING_LINES),
    "console": _Key(_bool, True),
    "log_file_max_bytes": _Key(_whole(0, MAX_LOG_FILE_MAX_BYTES), DEFAULT_LOG_FILE_MAX_BYTES),
    "env": _Key(_env, MappingProxyType({})),
    "cgroups": _Key(_choice(*CGROUP_MODES), "auto"),
    "cgroup_root": _Key(_path, DEFAULT_CGROUP_ROOT),
    "http_port": _Key(lambda v, w: _port(_int_text(v), w), 0),
    "termination_log": _Key(_path, DEFAULT_TERMINATION_LOG),
    "min_disk": _Key(_size),
    "min_param_disk": _Key(_size),
    "require_gpus": _Key(lambda v, w: _bool(_bool_text(v), w), False),
}

_CHILD_KEYS = {
    "command": _Key(_command, required=True),
    "env": _Key(_env, MappingProxyType({})),
    "cwd": _Key(_path),
    "stop_signal": _Key(parse_signal, int(signal.SIGTERM)),
    "stop_grace_s": _Key(_seconds),
    "ready": _Key(_ready),
    "ready_timeout_s": _Key(_positive_seconds, DEFAULT_READY_TIMEOUT_S),
    "log_source": _Key(_name),
}

_DAEMON_KEYS = {
    "name": _Key(_name, required=True),
    **_CHILD_KEYS,
    "lifetime": _Key(_choice(*DAEMON_LIFETIMES), "phase"),
}

_PHASE_KEYS = {
    "name": _Key(_name, required=True),
    "kind": _Key(_choice(*PHASE_KINDS), "oneshot"),
    **_CHILD_KEYS,
    "daemons": _Key(lambda v, w: v, ()),
    "timeout_s": _Key(_optional(_positive_seconds)),
    "retries": _Key(_whole(0, MAX_RETRIES)),
    "restart": _Key(_choice(*RESTART_POLICIES)),
    "backoff_s": _Key(_seconds, DEFAULT_BACKOFF_S),
    "backoff_max_s": _Key(_seconds, DEFAULT_BACKOFF_MAX_S),
    "backoff_factor": _Key(_factor, DEFAULT_BACKOFF_FACTOR),
    "backoff_jitter": _Key(_fraction, DEFAULT_BACKOFF_JITTER),
    "restart_burst": _Key(_whole(1, MAX_RESTART_BURST), DEFAULT_RESTART_BURST),
    "restart_window_s": _Key(_positive_seconds, DEFAULT_RESTART_WINDOW_S),
    "backoff_reset_s": _Key(_seconds, DEFAULT_BACKOFF_RESET_S),
    "stall_s": _Key(_optional(_positive_seconds)),
    "progress_path": _Key(_path),
    "min_memory": _Key(_size),
    "memory_max": _Key(_size),
    "report": _Key(_choice(*REPORTS)),
    "parse": _Key(_choice(*PARSERS)),
    "prepare": _Key(_choice(*PREPARES)),
    "resume": _Key(_choice(*RESUMES), "no"),
    "resume_max_age_s": _Key(_positive_seconds, DEFAULT_RESUME_MAX_AGE_S),
}

_CUZK_KEYS = {
    "config_path": _Key(_path),
    "memory_model": _Key(_choice(*MEMORY_MODELS), "unified"),
    "listen": _Key(_arg, "http://127.0.0.1:9820"),
    # "" = the daemon serves no status API (ready is then its listen port alone).
    "status_listen": _Key(lambda v, w: "" if v == "" else _arg(v, w), "127.0.0.1:9821"),
    "param_cache": _Key(_path, "/var/tmp/filecoin-proof-parameters"),
    "safety_margin": _Key(_size, 5 << 30),
    "bench_concurrency": _Key(lambda v, w: _whole(1, MAX_BENCH_CONCURRENCY)(_int_text(v), w), 5),
    "baseline": _Key(_size, UNIFIED_BASELINE),
    "per_partition": _Key(_size, PER_PARTITION),
    "pw_baseline": _Key(_size, PW_BASELINE),
    "pw_per_worker": _Key(_size, PW_PER_WORKER),
    "overrides": _Key(lambda v, w: _overrides(v, w), None),
}

_MANAGER_KEYS = {
    "url": _Key(_optional(_url)),
    "label": _Key(_string),
    "min_rate": _Key(_rate),
    "token_env": _Key(_env_name),
    "events_url": _Key(_optional(_url)),
    "connect_timeout_s": _Key(_positive_seconds, DEFAULT_MANAGER_CONNECT_TIMEOUT_S),
    "read_timeout_s": _Key(_positive_seconds, DEFAULT_MANAGER_READ_TIMEOUT_S),
    "log_push_interval_s": _Key(_positive_seconds, DEFAULT_LOG_PUSH_INTERVAL_S),
    "log_backlog_bytes": _Key(_whole(1, MAX_LOG_BACKLOG_BYTES), DEFAULT_LOG_BACKLOG_BYTES),
    "bench_gate_s": _Key(_seconds, DEFAULT_BENCH_GATE_S),
    "give_up_on_failure": _Key(_bool),
    "report_bench_failure": _Key(_bool),  # the old name of give_up_on_failure, still accepted
    "bench_done_reason": _Key(_bool, False),
}

# [cuzk.overrides] values that cuzkconf.generate() reads to size the daemon (the rest is merged as given).
_OVERRIDE_TABLES = ("memory", "pipeline", "synthesis")
_OVERRIDE_WORKERS = (("pipeline", "synthesis_concurrency"), ("synthesis", "partition_workers"))


def _overrides(value: Any, where: str) -> dict[str, Any]:
    """What generate() reads from the overrides is checked here, so that `check` refuses what `run` would."""
    table = _table(value, where)
    for name in _OVERRIDE_TABLES:
        if name in table:
            _table(table[name], _join(where, name))
    budget = table.get("memory", {}).get("total_budget")
    if budget is not None and budget != "auto":
        budget_where = _join(where, "memory.total_budget")
        if not isinstance(budget, str):
            raise ConfigError(f"{budget_where}: must be \"auto\" or a size like \"100GiB\", got {_describe(budget)}")
        _size(budget, budget_where)
    for name, key in _OVERRIDE_WORKERS:
        workers = table.get(name, {}).get(key)
        if workers is not None:
            _whole(1, MAX_OVERRIDE_WORKERS)(workers, _join(where, f"{name}.{key}"))
    return table


# ---------------------------------------------------------------- rules within one phase


def check_kind_keys(v: Mapping[str, Any], where: str) -> None:
    """A oneshot retries and has a deadline; a service restarts and can be ready: neither takes the other's keys."""
    if v["kind"] == "oneshot":
        if v["restart"] is not None:
            raise ConfigError(f"{where}.restart: only for kind = \"service\" (a oneshot uses retries)")
        if v["ready"] is not None:
            raise ConfigError(f"{where}.ready: only for kind = \"service\" (a oneshot is done when it exits 0)")
    else:
        if v["retries"] is not None:
            raise ConfigError(f"{where}.retries: only for kind = \"oneshot\" (a service uses restart)")
        if v["timeout_s"] is not None:
            raise ConfigError(f"{where}.timeout_s: only for kind = \"oneshot\" (a service runs until stopped)")


def check_progress_keys(v: Mapping[str, Any], where: str) -> None:
    """resume = "outputs" finds the outputs again under progress_path; progress_path is watched by stall_s."""
    if v["resume"] == "outputs" and v["progress_path"] is None:
        raise ConfigError(f"{where}.resume: \"outputs\" needs progress_path (the outputs to find again)")
    if v["progress_path"] is not None and v["stall_s"] is None:
        raise ConfigError(f"{where}.progress_path: only meaningful with stall_s (how long no growth means stalled)")


def check_backoff_order(v: Mapping[str, Any], where: str) -> None:
    if v["backoff_max_s"] < v["backoff_s"]:
        raise ConfigError(f"{where}.backoff_max_s: {v['backoff_max_s']:g} is below backoff_s {v['backoff_s']:g}")


def check_daemon_name(daemon: Mapping[str, Any], phase: str, where: str) -> None:
    """A daemon's label is phase/name: named like its phase, it could not be told from the phase's command."""
    if daemon["name"] == phase:
        raise ConfigError(f"{where}.name: {phase!r} is the phase's own name; give the daemon another")


def check_unique(names: list[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{where}[{i}].name: duplicate {what} {name!r}")
        seen.add(name)


# ---------------------------------------------------------------- rules between phases, [manager] and [cuzk]


def check_reports(phases: tuple[PhaseSpec, ...]) -> None:
    """Each manager call is made by one phase, of the kind whose success it means."""
    reports = [p.report for p in phases if p.report is not None]
    for report in set(reports):
        if reports.count(report) > 1:
            raise ConfigError(f"phases: report = {report!r} is set on more than one phase")
    for i, phase in enumerate(phases):
        if phase.report == "running" and phase.kind != "service":
            raise ConfigError(f"phases[{i}].report: \"running\" is reported when a service is up; "
                              "this phase is a oneshot")
        if phase.report in ("param-done", "bench-done") and phase.kind != "oneshot":
            raise ConfigError(f"phases[{i}].report: {phase.report!r} is reported when a oneshot completes")


def resolve_give_up_alias(v: dict[str, Any]) -> None:
    """report_bench_failure is give_up_on_failure's old name: either may be set, both only alike."""
    old_name = v.pop("report_bench_failure")
    if v["give_up_on_failure"] is None:
        v["give_up_on_failure"] = True if old_name is None else old_name
    elif old_name is not None and old_name != v["give_up_on_failure"]:
        raise ConfigError("manager.report_bench_failure: the old name of give_up_on_failure, set to the opposite "
                          "value; keep one of them")


def cuzk_settings(table: Any, state_dir: str) -> CuzkSettings:
    """[cuzk]; cuzk.toml is written into state_dir unless config_path says where."""
    c = _take(table, "cuzk", _CUZK_KEYS)
    c["config_path"] = c["config_path"] or str(Path(state_dir) / "cuzk.toml")
    return CuzkSettings(**c)


def resolve_cuzk_ready(phases: tuple[PhaseSpec, ...], cuzk: CuzkSettings | None) -> tuple[PhaseSpec, ...]:
    """``ready = "cuzk"`` becomes the probe of the daemon that [cuzk] describes (which needs the table)."""
    from ..readiness import cuzk_ready  # readiness imports this package: resolved here, at load time

    def resolved(child: ChildSpec, where: str) -> ChildSpec:
        if child.ready is None or child.ready.kind != CUZK_READY:
            return child
        if cuzk is None:
            raise ConfigError(f"{where}.ready: \"{CUZK_READY}\" needs a [cuzk] table (it may be empty)")
        return replace(child, ready=cuzk_ready(cuzk))

    return tuple(replace(p, command=resolved(p.command, f"phases[{i}]"),
                         daemons=tuple(resolved(d, f"phases[{i}].daemons[{j}]") for j, d in enumerate(p.daemons)))
                 for i, p in enumerate(phases))


def check_cuzk_needs(phases: tuple[PhaseSpec, ...], cuzk: CuzkSettings | None) -> None:
    """prepare = "cuzk-config" writes cuzk.toml from [cuzk]."""
    for i, phase in enumerate(phases):
        if phase.prepare == "cuzk-config" and cuzk is None:
            raise ConfigError(f"phases[{i}].prepare: \"cuzk-config\" needs a [cuzk] table (it may be empty)")
