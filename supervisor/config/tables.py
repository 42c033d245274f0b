"""What each TOML table may hold, and the rules between its keys.

The key tables are declarative: a key, its checker and its default (keys.py ``Key``). An unknown key is
an error with a "did you mean" hint (typos must not pass). The kind keys of a phase (``report``, ``parse``,
``prepare``, ``ready``) accept the core's kinds and those its plugin registers (``kinds_of``). What one key
alone cannot say (a oneshot has no ``restart``, ``resume = "outputs"`` needs ``progress_path``...) is a
named rule below, applied by load.py in the order the file is read, so the first mistake in the file is
the one reported.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from types import MappingProxyType
from typing import Any

from ..state.files import ROLLED, SUPERVISOR_LOG, child_log_name
from ..text.show import fmt_bytes, shown
from .endpoint import _url
from .keys import ConfigPlugin, Key
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
    DEFAULT_MEMORY_WARN,
    DEFAULT_PROGRESS_WINDOW_S,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_BURST,
    DEFAULT_RESTART_WINDOW_S,
    DEFAULT_RESUME_MAX_AGE_S,
    DEFAULT_RING_LINES,
    DEFAULT_ROW_CHECK_S,
    DEFAULT_SETTLE_TIMEOUT_S,
    DEFAULT_STATE_DIR,
    DEFAULT_STOP_BUDGET_S,
    DEFAULT_STOP_GRACE_S,
    DEFAULT_TERMINATION_LOG,
    MAX_EXEC_WAIT_S,
    MIN_ROW_CHECK_S,
    PHASE_KINDS,
    REGISTER_ENV,
    REPORTS,
    RESTART_POLICIES,
    RESUMES,
    ChildSpec,
    ConfigError,
    PhaseSpec,
    Plan,
    ReadyCheck,
    ReportWhen,
)
from .values import (
    MAX_LOG_BACKLOG_BYTES,
    MAX_LOG_FILE_MAX_BYTES,
    MAX_PATH_BYTES,
    MAX_RESTART_BURST,
    MAX_RETRIES,
    MAX_RING_LINES,
    _command,
    _env,
    _env_name,
    _factor,
    _fraction,
    _name,
    _optional,
    _port,
    _positive_seconds,
    _string,
    absolute_path,
    bounded_size,
    check_bool,
    check_dir_to_make,
    check_file_to_write,
    check_memory_max,
    check_not_owned,
    check_path,
    check_seconds,
    check_size,
    check_state_dir,
    check_stop_budget,
    check_stop_signal,
    check_warn_fraction,
    endpoints_meet,
    join_key,
    local_endpoint,
    one_of,
    ready_checker,
    whole_number,
    written,
)

# ---------------------------------------------------------------- the interval knobs' floors

# The shortest period an interval knob may set: more often is a spin (a push loop, a stall watch), not a
# closer watch. ``check`` refuses less with one line naming the key.
LOG_PUSH_INTERVAL_MIN_S = 0.1
STALL_MIN_S = 1.0
# The shortest wait a timeout may set (an exec, a readiness wait, a manager call's connect or read, a phase's
# deadline): each takes milliseconds on a healthy machine, more under load, and a shorter timeout fails every
# one of them (timeout_s = 1e-9 killed its command at once). A window a figure is judged over has the same floor.
TIMEOUT_MIN_S = 0.1
TIMEOUT_FLOOR = (TIMEOUT_MIN_S, "a shorter wait fails on a healthy machine")
WINDOW_FLOOR = (TIMEOUT_MIN_S, "a shorter window holds nothing to judge by")


def bounded_seconds(at_least: tuple[float, str] | None = None,
                    at_most: tuple[float, str] | None = None) -> Callable[[Any, str], float]:
    """Seconds above 0, at least and at most the bounds given, each with why (what a shorter or longer one
    would be)."""

    def check(value: Any, where: str) -> float:
        number = _positive_seconds(value, where)
        if at_least is not None and number < at_least[0]:
            raise ConfigError(f"{where}: must be at least {at_least[0]:g} seconds ({at_least[1]}), "
                              f"got {written(value)}")
        if at_most is not None and number > at_most[0]:
            raise ConfigError(f"{where}: must be at most {at_most[0]:g} seconds ({at_most[1]}), got {written(value)}")
        return number

    return check


# ---------------------------------------------------------------- the tables

_log_dir_path = absolute_path("status names the log files by it, for a reader in any directory")


def _log_dir(value: Any, where: str) -> str:
    return check_dir_to_make(_log_dir_path(value, where), where)


_termination_log_path = absolute_path("Kubernetes reads it at its terminationMessagePath, an absolute path")


def _termination_log(value: Any, where: str) -> str:
    """Written on a failure if it exists (teardown.py), where Kubernetes reads it: a directory there took no
    verdict, and said so only at the end."""
    return check_file_to_write(_termination_log_path(value, where), where, "the termination log")

SUPERVISOR_KEYS = {
    "state_dir": Key(check_state_dir, DEFAULT_STATE_DIR),
    "log_dir": Key(_log_dir, DEFAULT_LOG_DIR),
    "stop_grace_s": Key(check_seconds, DEFAULT_STOP_GRACE_S),
    "stop_budget_s": Key(check_stop_budget, DEFAULT_STOP_BUDGET_S),
    "ring_lines": Key(whole_number(1, MAX_RING_LINES), DEFAULT_RING_LINES),
    "console": Key(check_bool, True),
    "log_file_max_bytes": Key(bounded_size(0, MAX_LOG_FILE_MAX_BYTES), DEFAULT_LOG_FILE_MAX_BYTES),  # 0: never rolled
    "env": Key(_env, MappingProxyType({})),
    "cgroups": Key(one_of(*CGROUP_MODES), "auto"),
    "cgroup_root": Key(absolute_path("the cgroup filesystem's mount point, as /sys/fs/cgroup is"), DEFAULT_CGROUP_ROOT),
    "http_port": Key(_port, 0),
    "termination_log": Key(_termination_log, DEFAULT_TERMINATION_LOG),
    "min_disk": Key(check_size),
    "require_gpus": Key(check_bool, False),
    # memory_high is said when a phase's memory crosses this fraction of its limit (phases may say otherwise).
    "memory_warn": Key(check_warn_fraction, DEFAULT_MEMORY_WARN),
}

_CHILD_KEYS = {
    "command": Key(_command, required=True),
    "env": Key(_env, MappingProxyType({})),
    # A child's cwd may be relative: like a relative program in its command, it is the operator's to give from
    # where the supervisor is started (the image's WORKDIR), and only the child's own start resolves it (the
    # supervisor never changes its directory). A path the supervisor reads itself, or another program does from
    # its own cwd (progress_path, [cuzk] config_path), is absolute. Never looked at here (a file there, a directory
    # missing): a cwd on a hung mount would freeze the load in the kernel; the start's bounded exec wait says it.
    "cwd": Key(check_path),
    "stop_signal": Key(check_stop_signal, int(signal.SIGTERM)),
    "stop_grace_s": Key(check_seconds),
    "ready": Key(ready_checker()),
    "ready_timeout_s": Key(bounded_seconds(TIMEOUT_FLOOR), DEFAULT_READY_TIMEOUT_S),
    "exec_wait_s": Key(bounded_seconds(TIMEOUT_FLOOR, (MAX_EXEC_WAIT_S, "the supervisor's loop is held for the "
                                                                         "whole wait")), DEFAULT_EXEC_WAIT_S),
    "log_source": Key(_name),
}

DAEMON_KEYS = {
    "name": Key(_name, required=True),
    **_CHILD_KEYS,
    "lifetime": Key(one_of(*DAEMON_LIFETIMES), "phase"),
}

PHASE_KEYS = {
    "name": Key(_name, required=True),
    "kind": Key(one_of(*PHASE_KINDS), "oneshot"),
    **_CHILD_KEYS,
    "daemons": Key(lambda v, w: v, ()),
    "timeout_s": Key(_optional(bounded_seconds(TIMEOUT_FLOOR))),
    "retries": Key(whole_number(0, MAX_RETRIES)),
    "retry_while_progressing": Key(check_bool, False),
    "restart": Key(one_of(*RESTART_POLICIES)),
    "backoff_s": Key(check_seconds, DEFAULT_BACKOFF_S),
    "backoff_max_s": Key(check_seconds, DEFAULT_BACKOFF_MAX_S),
    "backoff_factor": Key(_factor, DEFAULT_BACKOFF_FACTOR),
    "backoff_jitter": Key(_fraction, DEFAULT_BACKOFF_JITTER),
    "restart_burst": Key(whole_number(1, MAX_RESTART_BURST), DEFAULT_RESTART_BURST),
    "restart_window_s": Key(_positive_seconds, DEFAULT_RESTART_WINDOW_S),
    "backoff_reset_s": Key(check_seconds, DEFAULT_BACKOFF_RESET_S),
    "stall_s": Key(_optional(bounded_seconds((STALL_MIN_S, "a shorter silence is no stall")))),
    "progress_path": Key(absolute_path("the child writes it from its cwd, the supervisor watches it from its own")),
    "progress_total": Key(check_size),
    "progress_deadline_s": Key(_optional(bounded_seconds(TIMEOUT_FLOOR))),
    "progress_window_s": Key(bounded_seconds(WINDOW_FLOOR), DEFAULT_PROGRESS_WINDOW_S),
    "min_memory": Key(check_size),
    "memory_max": Key(check_memory_max),
    "memory_warn": Key(_optional(check_warn_fraction)),  # None: [supervisor] memory_warn
    "gpu_health": Key(_optional(check_bool)),  # None: [supervisor] require_gpus
    # The core's kinds; load.py adds a plugin's (kinds_of, with_kinds).
    "report": Key(one_of(*REPORTS)),
    "parse": Key(one_of()),
    "prepare": Key(one_of()),
    "settle": Key(one_of()),
    "settle_timeout_s": Key(_positive_seconds, DEFAULT_SETTLE_TIMEOUT_S),
    "resume": Key(one_of(*RESUMES), "no"),
    "resume_max_age_s": Key(_positive_seconds, DEFAULT_RESUME_MAX_AGE_S),
}

# How often the manager's row is read: each read is the whole fleet's list, so not more than every few seconds.
_row_check_s = bounded_seconds((MIN_ROW_CHECK_S, "each look-up reads the whole fleet's GET /status"))


MANAGER_KEYS = {
    "url": Key(_optional(_url)),
    "label": Key(_string),
    "token_env": Key(_env_name),
    "events_url": Key(_optional(_url)),
    "connect_timeout_s": Key(bounded_seconds(TIMEOUT_FLOOR), DEFAULT_MANAGER_CONNECT_TIMEOUT_S),
    "read_timeout_s": Key(bounded_seconds(TIMEOUT_FLOOR), DEFAULT_MANAGER_READ_TIMEOUT_S),
    "log_push_interval_s": Key(bounded_seconds((LOG_PUSH_INTERVAL_MIN_S, "more often is a flood of pushes")),
                               DEFAULT_LOG_PUSH_INTERVAL_S),
    "log_backlog_bytes": Key(bounded_size(1, MAX_LOG_BACKLOG_BYTES), DEFAULT_LOG_BACKLOG_BYTES),
    "row_check_s": Key(_row_check_s, DEFAULT_ROW_CHECK_S),
}
# What a plugin's section or extra keys may not be named: the core's own tables.
CORE_TABLES = ("supervisor", "manager", "phases")
# Where each core table's keys go, as a key put in another table is told (keys.py ``take``).
_HOMES = {"supervisor": "a [supervisor] key: put it under [supervisor]",
          "manager": "a [manager] key: put it under [manager]",
          "phase": "a phase key: put it under [[phases]]",
          "daemon": "a daemon key: put it under [[phases.daemons]]"}


def homes(plugin: ConfigPlugin) -> dict[str, dict[str, Collection[str]]]:
    """For each core table (``supervisor``, ``manager``, ``phase``, ``daemon``, and ``""`` for the top level): the
    other tables' keys (the plugin's added ones with them) by where they belong."""
    keys = {"supervisor": SUPERVISOR_KEYS, "manager": MANAGER_KEYS, "phase": PHASE_KEYS, "daemon": DAEMON_KEYS}
    every = {table: {*own, *plugin.table_keys.get(table, {})} for table, own in keys.items()}
    out: dict[str, dict[str, Collection[str]]] = {
        table: {_HOMES[other]: theirs - every[table] for other, theirs in every.items() if other != table}
        for table in every}
    out[""] = {_HOMES[table]: theirs for table, theirs in every.items()}
    return out


# ---------------------------------------------------------------- the kinds the core and its plugin register


@dataclass(frozen=True)
class Kinds:
    """What ``report``, ``parse``, ``prepare``, ``settle`` and ``ready`` accept: the core's kinds, then the plugin's."""

    reports: Mapping[str, ReportWhen]  # the name → when it is made, listed in the order the lifecycle makes them
    parsers: tuple[str, ...]
    prepares: tuple[str, ...]
    settles: tuple[str, ...]
    ready: Mapping[str, Callable[[str], ReadyCheck]]  # the name → its probe, made where the key is


def kinds_of(plugin: ConfigPlugin, sections: Mapping[str, Any]) -> Kinds:
    """The kinds a phase may name with ``plugin``; its ``ready`` kinds are bound to the plan's ``sections``."""
    reports = {**REPORTS, **plugin.reports}
    order = {"done": 0, "up": 1}  # a oneshot is done before a service is up
    return Kinds(reports=MappingProxyType(dict(sorted(reports.items(), key=lambda item: order[item[1]]))),
                 parsers=tuple(plugin.parsers), prepares=tuple(plugin.prepares), settles=tuple(plugin.settles),
                 ready=MappingProxyType({name: partial(make, sections) for name, make in plugin.ready.items()}))


def with_kinds(keys: Mapping[str, Key], kinds: Kinds) -> dict[str, Key]:
    """``keys`` (a phase's or a daemon's) with the kind keys they have accepting ``kinds``, in the same order."""
    kind_keys = {"report": Key(one_of(*kinds.reports)), "parse": Key(one_of(*kinds.parsers)),
                 "prepare": Key(one_of(*kinds.prepares)), "settle": Key(one_of(*kinds.settles)),
                 "ready": Key(ready_checker(kinds.ready))}
    return {name: kind_keys.get(name, key) for name, key in keys.items()}


# ---------------------------------------------------------------- rules within one phase


def check_kind_keys(v: Mapping[str, Any], where: str, given: Collection[str] = ()) -> None:
    """A oneshot retries and has a deadline; a service restarts and can be ready: neither takes the other's keys.
    ``given``: the keys the table wrote (those with a default are in ``v`` either way)."""
    if v["kind"] == "oneshot":
        if v["restart"] is not None:
            raise ConfigError(f"{where}.restart: only for kind = \"service\" (a oneshot uses retries)")
        for key in ("restart_burst", "restart_window_s"):
            if key in given:
                raise ConfigError(f"{where}.{key}: only for kind = \"service\" (a oneshot's tries are its retries)")
        if v["ready"] is not None:
            raise ConfigError(f"{where}.ready: only for kind = \"service\" or a daemon (a oneshot is done when it "
                              "exits 0; a daemon's ready goes under its [[phases.daemons]])")
        if "ready_timeout_s" in given:  # (its daemons' go under each [[phases.daemons]], with their ready)
            raise ConfigError(f"{where}.ready_timeout_s: only for kind = \"service\" or a daemon, with ready (a "
                              "oneshot is done when it exits 0)")
    else:
        if v["retries"] is not None:
            raise ConfigError(f"{where}.retries: only for kind = \"oneshot\" (a service uses restart)")
        if v["settle"] is not None:
            raise ConfigError(f"{where}.settle: only for kind = \"oneshot\" (a service's daemons live as long as it)")
        if v["timeout_s"] is not None:
            raise ConfigError(f"{where}.timeout_s: only for kind = \"oneshot\" (a service runs until stopped)")
        if v["resume"] not in (None, "no"):  # (one that once ended cleanly was skipped at every later start)
            raise ConfigError(f"{where}.resume: only for kind = \"oneshot\" (a service is there to stay up: one "
                              "resumed as done would never start again)")


# A key that bounds or tunes what another key turns on, and means nothing without it: (the key, whether what it needs
# is there, what it needs). Written without it, it was accepted and did nothing, and its writer believed it did.
_NEEDS: tuple[tuple[str, Callable[[Mapping[str, Any]], bool], str], ...] = (
    ("ready_timeout_s", lambda v: v["ready"] is not None, "only with ready (it bounds the wait for it)"),
    ("restart_burst", lambda v: v["restart"] != "no", 'not with restart = "no" (it counts restarts)'),
    ("restart_window_s", lambda v: v["restart"] != "no", 'not with restart = "no" (it is restart_burst\'s window)'),
    ("progress_window_s", lambda v: v["progress_deadline_s"] is not None, "only with progress_deadline_s (how long "
     "the rate is watched before it may say the deadline cannot be made)"),
    ("settle_timeout_s", lambda v: v["settle"] is not None, "only with settle (it bounds how long the daemons are "
     "kept)"),
    ("resume_max_age_s", lambda v: v["resume"] == "machine", 'only with resume = "machine" (how long ago the phase '
     "may have been done to be skipped)"),
)


def check_needed_keys(v: Mapping[str, Any], where: str, given: Collection[str]) -> None:
    """Each key of ``given`` (the keys a phase's or a daemon's table wrote) whose meaning needs another: refused
    without it (_NEEDS), in the order the keys are in the file."""
    for key in given:
        need = next((row for row in _NEEDS if row[0] == key), None)
        if need is not None and not need[1](v):
            raise ConfigError(f"{where}.{key}: {need[2]}")


def check_kept_daemons(v: Mapping[str, Any], daemons: Collection[ChildSpec], where: str) -> None:
    """A daemon with lifetime = "lifecycle" is handed on by a oneshot that succeeds: a phase resumed as done starts
    no children, and the later phases would run without it. A service hands none on: each of its attempts stops
    its daemons as it ends (its clean end, a restart), so one meant to outlive it was stopped while the phases
    after it still used it."""
    if v["kind"] == "service":
        for i, daemon in enumerate(daemons):
            if daemon.lifetime == "lifecycle":
                raise ConfigError(f"{where}.daemons[{i}] ({daemon.name}).lifetime: \"lifecycle\" is for a oneshot "
                                  "phase's daemons; a service's daemons live as long as it does")
    kept = [d.name for d in daemons if d.lifetime == "lifecycle"]
    if kept and v["resume"] not in (None, "no"):
        raise ConfigError(f"{where}.resume: a phase resumed as done starts no children, and its lifecycle daemon "
                          f"{kept[0]!r} would not run for the phases after it; set resume = \"no\"")


def check_settle(v: Mapping[str, Any], daemons: Collection[ChildSpec], where: str) -> None:
    """``settle`` keeps a oneshot's daemons after its command: it needs one that stops with the phase."""
    if v["settle"] is not None and not any(d.lifetime == "phase" for d in daemons):
        raise ConfigError(f"{where}.settle: needs a daemon (it keeps the phase's daemons after its command until "
                          "what they do for it is over); this phase has none that stops with it")


def check_progress_keys(v: Mapping[str, Any], where: str) -> None:
    """resume = "outputs" finds the outputs again under progress_path. progress_path needs no stall_s: the stall
    watch is one of its readers, with resume, the progress figures (progress_total) and a plugin (the prover's
    takes it for where its download goes, where nothing else names that)."""
    if v["resume"] == "outputs" and v["progress_path"] is None:
        raise ConfigError(f"{where}.resume: \"outputs\" needs progress_path (the outputs to find again)")
    if v["progress_deadline_s"] is not None and v["progress_total"] is None:
        raise ConfigError(f"{where}.progress_deadline_s: needs progress_total (what is left is judged against it)")
    if v["retry_while_progressing"] and (v["kind"] != "oneshot" or v["progress_total"] is None
                                         or v["timeout_s"] is None):
        raise ConfigError(f"{where}.retry_while_progressing: needs a oneshot with progress_total (what an attempt "
                          "got is measured by) and timeout_s (what bounds the attempts not counted)")


def check_backoff_order(v: Mapping[str, Any], where: str) -> None:
    if v["backoff_max_s"] < v["backoff_s"]:
        raise ConfigError(f"{where}.backoff_max_s: {written(v['backoff_max_s'])} is below backoff_s "
                          f"{written(v['backoff_s'])}")


def check_memory_order(v: Mapping[str, Any], where: str) -> None:
    """The memory a phase may have (memory_max) bounds what its preflight finds for it: a min_memory above it
    would refuse every start (insufficient_memory), whatever the machine has."""
    if v["min_memory"] is not None and v["memory_max"] is not None and v["min_memory"] > v["memory_max"]:
        raise ConfigError(f"{where}.min_memory: {fmt_bytes(v['min_memory'])} is above memory_max "
                          f"{fmt_bytes(v['memory_max'])}: the phase could never start")


def check_memory_max_applies(v: Mapping[str, Any], where: str, cgroups: str) -> None:
    """memory_max is the limit of the phase's own cgroup, which only cgroups = "auto" makes: with "off" or "shared"
    it was never set (said at run time, while the phase allocated past it). With "auto" the host decides, at run
    time (which says so where it cannot be made)."""
    if v["memory_max"] is not None and cgroups != "auto":
        raise ConfigError(f'{where}.memory_max: not with supervisor.cgroups = "{cgroups}" (it is the limit of the '
                          'phase\'s own cgroup, which only cgroups = "auto" makes)')


def check_daemon_name(daemon: Mapping[str, Any], phase: str, where: str) -> None:
    """A daemon's label is phase/name: named like its phase, it could not be told from the phase's command."""
    if daemon["name"] == phase:
        raise ConfigError(f"{where}.name: {phase!r} is the phase's own name; give the daemon another")


def check_unique(names: list[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{where}[{i}] ({name}).name: duplicate {what} {name!r}")
        seen.add(name)


# ---------------------------------------------------------------- rules between phases


def check_log_names(phases: tuple[PhaseSpec, ...], log_dir: str) -> None:
    """Each child writes its own file in log_dir, the supervisor its own: names that meet (a phase named
    "supervisor"; phase "a.b" and daemon "b" of phase "a") would mix two outputs in one file. The longest of them,
    rolled over (``<name>.1``), must fit PATH_MAX in log_dir: a log_dir that does not fit it passed check, and no
    log file could be opened (File name too long), every line dropped."""
    owners = {SUPERVISOR_LOG: "the supervisor's own lines"}
    for i, phase in enumerate(phases):
        for child in (phase.command, *phase.daemons):
            name = child_log_name(phase.name, child.name)
            label = f"{phase.name}/{child.name}"
            if name in owners:
                raise ConfigError(f"phases[{i}] ({phase.name}): {label}'s output would go to {name}, the file of "
                                  f"{owners[name]}; rename one")
            owners[name] = label
    name = max(owners, key=lambda name: len(os.fsencode(name))) + ROLLED
    size = len(os.fsencode(os.path.join(log_dir, name)))
    if size > MAX_PATH_BYTES:
        raise ConfigError(f"supervisor.log_dir: too long for its log files: {name} in it is a path of {size} "
                          f"bytes, more than the {MAX_PATH_BYTES} a path may have")


def check_ports(phases: tuple[PhaseSpec, ...], http_port: int) -> None:
    """No two children that run at once wait for one local port, nor one for the supervisor's own http_port:
    only one process can listen there, so the second would fail port_in_use once the phases before it ran
    (a download of an hour, in the prover's lifecycle). At once: a phase's command and its daemons, with every
    lifecycle daemon of the phases before it (each its own process, whatever its name: a later daemon of the same
    name is started beside it, never handed it) and every child of a service before it: the lifecycle goes past a
    service once it is up, so each later phase runs beside it while it is up, its daemons with it (each of its
    attempts starts them again)."""
    kept: list[tuple[str, ChildSpec]] = []  # what runs on beside the later phases: (its place, its spec)
    for i, phase in enumerate(phases):
        where = f"phases[{i}] ({phase.name})"
        own = [(where, phase.command), *((f"{where}.daemons[{j}] ({d.name})", d) for j, d in enumerate(phase.daemons))]
        at_once = [*kept, *own]
        taken: dict[tuple[str, int], tuple[str, str]] = {}  # (host, port) → (its child's place, how it is said)
        if http_port:
            taken[("127.0.0.1", http_port)] = ("", "supervisor.http_port (the supervisor's own health port)")
        for place, child in at_once:
            for host, port in _local_ports(child):
                clash = next((said for endpoint, (owner, said) in taken.items()
                              if endpoints_meet(endpoint, (host, port)) and owner != place), None)
                if clash is not None and (place, child) in own:
                    raise ConfigError(f"{place}.ready: port {port} is also {clash}: two children that run at "
                                      "once cannot both listen there")
                taken.setdefault((host, port), (place, f"the ready port of {place}"))
        kept += own if phase.kind == "service" else [(place, d) for place, d in own[1:] if d.lifetime == "lifecycle"]


def _local_ports(child: ChildSpec) -> list[tuple[str, int]]:
    """The local endpoints (values.local_endpoint) a child's ready check probes."""
    pairs = child.ready.ports() if child.ready is not None else []
    return [endpoint for host, port in pairs if (endpoint := local_endpoint(host, port)) is not None]


def check_reports(phases: tuple[PhaseSpec, ...], kinds: Mapping[str, ReportWhen]) -> None:
    """Each manager call is made by one phase, of the kind whose success it means, and in the order the kinds are
    listed: the phases run in their order, and the manager takes its reports in the lifecycle's (one made out of
    it is ignored, or moves the instance back: a step it already passed reported after the one it is in)."""
    reports = [p.report for p in phases if p.report is not None]
    for report in set(reports):
        if reports.count(report) > 1:
            raise ConfigError(f"phases: report = {report!r} is set on more than one phase")
    order = list(kinds)
    made = [(i, p.name, order.index(p.report)) for i, p in enumerate(phases) if p.report in order]
    for (before_at, before, earlier), (i, name, rank) in pairwise(made):
        if rank < earlier:
            raise ConfigError(f"phases[{i}] ({name}).report: {order[rank]!r} would be made after phases"
                              f"[{before_at}] ({before})'s {order[earlier]!r}; the manager takes them in the "
                              f"order {', '.join(repr(k) for k in order)}: move the phase before {before!r}")
    for i, phase in enumerate(phases):
        when = kinds.get(phase.report) if phase.report is not None else None
        if when == "up" and phase.kind != "service":
            raise ConfigError(f"phases[{i}] ({phase.name}).report: \"{phase.report}\" is reported when a service "
                              f"is up; this phase is a {phase.kind}")
        if when == "done" and phase.kind != "oneshot":
            raise ConfigError(f"phases[{i}] ({phase.name}).report: {phase.report!r} is reported when a oneshot "
                              "completes")


def check_own_dirs_apart(plan: Plan) -> None:
    """What tells how a phase does is not where the supervisor writes its own files. A ``progress_path`` that is
    state_dir or log_dir, or holds one, saw supervisor.log and status.json written as the download's progress (the
    stall never fired; resume = "outputs" took them for its outputs, changed at every start); one that is such a
    file is refused as any path the supervisor's files are (check_not_owned). A ready file in state_dir or log_dir
    (or one of them itself, whose mtime each file made in it moves) may be one the supervisor writes, and the
    child counted as ready at once. Only these two directories: the supervisor writes nothing below them.
    The phase's paths are compared as written, never looked at: one on a hung mount would hang ``check`` (the run
    finds such a mount off the loop, bounded)."""
    sup = plan.supervisor
    dirs = {key: {os.path.abspath(getattr(sup, key)), os.path.realpath(getattr(sup, key))}
            for key in ("state_dir", "log_dir")}
    for i, phase in enumerate(plan.phases):
        where = f"phases[{i}] ({phase.name})"
        if phase.progress_path is not None:
            mine = os.path.abspath(phase.progress_path)
            for key, folders in dirs.items():
                if any(os.path.commonpath((mine, folder)) == mine for folder in folders):
                    raise ConfigError(f"{where}.progress_path: {shown(phase.progress_path)} "
                                      f"{'is' if mine in folders else 'holds'} supervisor.{key} "
                                      f"{shown(getattr(sup, key))}: the supervisor's own files would count as the "
                                      "phase's")
                if os.path.dirname(mine) in folders:  # (then only our own directory is looked at)
                    check_not_owned(phase.progress_path, f"{where}.progress_path", "the phase's progress", plan)
        children = [(where, phase.command), *((f"{where}.daemons[{j}] ({d.name})", d)
                                              for j, d in enumerate(phase.daemons))]
        for place, child in children:
            if child.ready is None or child.ready.kind != "file":
                continue
            ready = os.path.abspath(child.ready.target)
            for key, folders in dirs.items():
                if ready in folders or os.path.dirname(ready) in folders:
                    raise ConfigError(f"{place}.ready: {shown(child.ready.target)} is "
                                      f"{'' if ready in folders else 'in '}supervisor.{key} "
                                      f"{shown(getattr(sup, key))}: the supervisor's own files would count as the "
                                      "child's ready file")


def check_set_env(plan: Plan, plugin: ConfigPlugin) -> None:
    """A variable the supervisor sets for a child from other keys (a plugin's ``prepare``, from its table) or from
    the manager's answer (with a manager) is not an ``env``'s to set: the config's env comes last in the child's
    environment, so it won without a word, and the child ran on a value the supervisor neither checked nor
    probed (a count of 0 past its key's bound, an address other than the one the ready probe waited for). The
    core's own (values.py ``_OWN_ENV``) are refused wherever they are written."""
    answered = {**REGISTER_ENV, **plugin.register_env} if plan.manager.url else {}
    given = {name: f"the supervisor sets this from the manager's /register answer ({field}); leave it out"
             for name, field in answered.items()}

    def set_in(phase: PhaseSpec) -> dict[str, str]:  # variable → who sets it, and what to set instead
        made = plugin.prepare_env.get(phase.prepare, {}) if phase.prepare is not None else {}
        # (a value computed from a key: that key is the place to set it; one that no key sets: none is)
        return {**given, **{name: f'prepare = "{phase.prepare}" sets this from {source}; '
                                  f'{"set that instead" if source.startswith("[") else "leave it out"}'
                            for name, source in made.items()}}

    owned = [set_in(phase) for phase in plan.phases]
    for name in plan.supervisor.env:  # (it reaches every child: a phase of a prepare too)
        said = given.get(name) or next((f"in phase {phase.name}, {mine[name]}"
                                        for phase, mine in zip(plan.phases, owned, strict=True) if name in mine), None)
        if said is not None:
            raise ConfigError(f"{join_key('supervisor.env', name)}: {said}")
    for i, (phase, mine) in enumerate(zip(plan.phases, owned, strict=True)):
        where = f"phases[{i}] ({phase.name})"
        # [supervisor] env is merged into each phase's, and a phase's into each of its daemons': each place is named
        # for the variables it adds.
        _refuse_set(phase.command.env, plan.supervisor.env, mine, f"{where}.env")
        for j, daemon in enumerate(phase.daemons):
            _refuse_set(daemon.env, phase.command.env, mine, f"{where}.daemons[{j}] ({daemon.name}).env")


def _refuse_set(env: Mapping[str, str], inherited: Mapping[str, str], owned: Mapping[str, str], where: str) -> None:
    name = next((name for name in env if name in owned and name not in inherited), None)
    if name is not None:
        raise ConfigError(f"{join_key(where, name)}: {owned[name]}")
