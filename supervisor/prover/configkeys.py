"""The prover's part of the config file: the ``[cuzk]`` table, and the fleet protocol's keys in ``[manager]``.

Declared with the core's own ``Key`` and checkers, and checked with them (supervisor/config): an unknown key
is refused with a "did you mean", a bad value in one line naming the key, like any of the core's.

- ``[cuzk]`` becomes ``CuzkSettings`` (cuzkconf.py), in ``Plan.sections["cuzk"]``. The defaults are the
  dataclass's own: the key table reads them from it, so they are written once. ``listen`` and
  ``status_listen`` are read here as ``ready = "cuzk"`` probes them (``listen_probe``, ``status_probe``, which
  ready.py builds its check from), whichever phase uses the table: cuzk.toml, ``CUZK_ADDR`` and the
  production watch take them too, so an address no probe could reach is refused by ``check``;
- ``[manager]`` gains ``min_rate`` (else ``$MIN_RATE``, else 50), ``bench_gate_s``, ``bench_deadline_s``,
  ``give_up_on_failure`` (or its old name ``report_bench_failure``) and ``bench_done_reason``: the file
  format is unchanged, and the values are in ``Plan.extensions["manager"]`` under the keys' own names;
- ``[supervisor]`` gains ``min_param_disk``: the free space the parameter cache needs (the prover's disk need,
  plugin.py), in ``Plan.extensions["supervisor"]``;
- a phase's ``curio fetch-params <size>`` is given a size curio has parameters for (at the end of this module).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import (
    ConfigError,
    EnvText,
    Key,
    Plan,
    ReadyCheck,
    SupervisorSpec,
    absolute_path,
    check_arg,
    check_bool,
    check_file_to_write,
    check_not_owned,
    check_number,
    check_seconds,
    check_size,
    check_table,
    endpoints_meet,
    host_port,
    join_key,
    one_of,
    spelled,
    take,
    whole_number,
    written,
)
from ..config.tables import TIMEOUT_FLOOR, TIMEOUT_MIN_S
from ..text.show import shown
from .cuzkconf import GENERATED_TABLES, MEMORY_MODELS, CuzkSettings, cuzk_address, status_address

SECTION = "cuzk"
MAX_BENCH_CONCURRENCY = 1_024
MAX_BENCH_COUNT = 10_000  # proofs in one bench: a day of 32 GiB PoReps on the fastest GPU is far fewer
MAX_OVERRIDE_WORKERS = 1_024  # [cuzk.overrides] synthesis_concurrency, partition_workers
TOML_INT_MIN, TOML_INT_MAX = -(2**63), 2**63 - 1
# [cuzk.overrides] values that cuzkconf.generate() reads to size the daemon (the rest is merged as given).
_OVERRIDE_WORKERS = (("pipeline", "synthesis_concurrency"), ("synthesis", "partition_workers"))
# What generate() writes from [cuzk]'s own keys, which others read there: [daemon]'s addresses (the ready probe,
# CUZK_ADDR, CUZK_STATUS_LISTEN and the production watch: an override would move the daemon where none of them
# looks, never seen ready) and [srs] param_cache (the parameter cache's disk check, plugin.py param_cache: an
# override would have cuzk read parameters from where none were counted). (table, key) → [cuzk] key, its readers.
_OWN_KEYS = {("daemon", "listen"): ("listen", "the ready probe and CUZK_ADDR"),
             ("daemon", "status_listen"): ("status_listen", "the ready probe, CUZK_STATUS_LISTEN and the production "
                                                            "watch"),
             ("srs", "param_cache"): ("param_cache", "the fitness checks of min_param_disk")}

DEFAULT_MIN_RATE = 50.0
# A min_rate (or a rate) the manager could hold: proofs per hour.
MIN_RATE_MAX = 1e6
# How long production waits for the manager's verdict on the benchmark before it starts anyway.
DEFAULT_BENCH_GATE_S = 300.0
# The manager kills a row still in params_done 45 min after its param_done_at ("benchmark timeout (45min)"):
# the warm-up and the bench share that budget (benchlimits.py); 0: no such clock.
DEFAULT_BENCH_DEADLINE_S = 2700.0
MIN_RATE_ENV = "MIN_RATE"


# ---------------------------------------------------------------- [cuzk]


def _overrides(value: Any, where: str) -> dict[str, Any]:
    """What generate() reads from the overrides is checked here, so that `check` refuses what `run` would. A
    value from ${VAR} is what it spells (the environment holds only text; cuzk refuses "3" where 3 belongs)."""
    table = spelled(check_table(value, where))
    for name in GENERATED_TABLES:  # (one that is no table would replace the generated one whole)
        if name in table:
            check_table(table[name], join_key(where, name))
    for (name, key), (own, readers) in _OWN_KEYS.items():
        if key in table.get(name, {}):
            raise ConfigError(f"{join_key(where, f'{name}.{key}')}: set [cuzk] {own} instead ({readers} read that "
                              "one, not cuzk.toml's)")
    budget = table.get("memory", {}).get("total_budget")
    if budget is not None and budget != "auto":
        budget_where = join_key(where, "memory.total_budget")
        if not isinstance(budget, str):
            raise ConfigError(f"{budget_where}: must be \"auto\" or a size like \"100GiB\", got {shown(budget)}")
        check_size(budget, budget_where)
    level = table.get("logging", {}).get("level")
    if level is not None and not isinstance(level, str):  # (cuzk-daemon reads a filter string: it refuses its config)
        raise ConfigError(f"{join_key(where, 'logging.level')}: must be a level like \"warn\" or a filter like "
                          f"\"warn,cuzk_core=debug\", got {shown(level)}")
    for name, key in _OVERRIDE_WORKERS:
        workers = table.get(name, {}).get(key)
        if workers is not None:
            whole_number(1, MAX_OVERRIDE_WORKERS)(workers, join_key(where, f"{name}.{key}"))
    _toml_integers(table, where)
    return table


def _toml_integers(value: Any, where: str) -> None:
    """Every integer in what is merged into cuzk.toml fits TOML's 64 bits: Python's reader takes any, the
    daemon's refuses the whole file at its start, after the parameter fetch."""
    if isinstance(value, dict):
        for key, item in value.items():
            _toml_integers(item, join_key(where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _toml_integers(item, f"{where}[{i}]")
    elif isinstance(value, int) and not isinstance(value, bool) and not TOML_INT_MIN <= value <= TOML_INT_MAX:
        raise ConfigError(f"{where}: {shown(value)} does not fit a TOML integer (64 bits), which cuzk-daemon reads")


def listen_probe(listen: str, where: str) -> ReadyCheck:
    """cuzk's listen (cuzkconf.py's forms: ``unix:///path``, ``IP:port``, ``http://IP:port``) as a connect check;
    ConfigError at ``where`` for anything else."""
    try:
        address = cuzk_address(listen)
    except ValueError as exc:
        raise ConfigError(f"{where}: {shown(listen)} {exc}") from None
    if address.unix_path:
        return ReadyCheck("unix", address.unix_path)
    host = address.connect_ip()
    return ReadyCheck("tcp", address.for_curio(), host, address.port)


def status_probe(status_listen: str, where: str) -> ReadyCheck | None:
    """cuzk's status_listen, ``host:port`` (or ``http://host:port``), as its ``GET /status``; None for "" (the
    daemon serves no status API); ConfigError at ``where`` for anything else."""
    if status_listen == "":
        return None
    status = status_address(status_listen)
    if "://" in status:  # (tcp://, https://: cuzk's bind takes none, and the probe would ask http://tcp://…)
        raise ConfigError(f"{where}: {shown(status_listen)} must be host:port or http://host:port")
    host, port = host_port(status, f"{where}: {shown(status_listen)} must be host:port")
    return ReadyCheck("http", f"http://{status}/status", host, port)


def _listen(value: Any, where: str) -> str:
    """[cuzk] listen, read as the probe reads it whether or not a daemon has ready = "cuzk": cuzk.toml, CUZK_ADDR
    and CURIO_CUZK_ADDRESS each take it in their reader's form (cuzkconf.py), so what one cannot read is refused.
    A socket path may hold nothing but a socket (a stale one of an earlier daemon): cuzk-daemon removes what is
    there before it binds, a file too (cuzk_paths_are_their_own says which files it may never be)."""
    text = check_arg(value, where)
    listen_probe(text, where)
    socket_path = cuzk_address(text).unix_path
    try:
        mode = os.lstat(socket_path).st_mode if socket_path else None
    except OSError:  # (nothing there, or not to be looked at: left to the daemon's bind)
        mode = None
    if mode is not None and not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "a file"
        raise ConfigError(f"{where}: {shown(socket_path)} is {kind}, not a socket: cuzk-daemon removes what is at "
                          "its socket path before it binds; give it a path of its own")
    return text


def _status_listen(value: Any, where: str) -> str:
    """[cuzk] status_listen, read as the probe and the production watch read it; "" = the daemon serves no status
    API (ready is then its listen port alone)."""
    text = "" if value == "" else check_arg(value, where)
    status_probe(text, where)
    return text


def _default(name: str) -> Any:
    """The CuzkSettings default of ``name``: the one place it is written."""
    return next(f.default for f in dataclasses.fields(CuzkSettings) if f.name == name)


CUZK_KEYS = {
    # None: state_dir/cuzk.toml. Written by the supervisor from its cwd, read by the daemon (CUZK_CONFIG) from its.
    "config_path": Key(absolute_path("the supervisor writes it, the daemon reads it, each from its own cwd")),
    "memory_model": Key(one_of(*MEMORY_MODELS), _default("memory_model")),
    "listen": Key(_listen, _default("listen")),
    "status_listen": Key(_status_listen, _default("status_listen")),
    "param_cache": Key(absolute_path("cuzk reads it from its cwd, the disk check from the supervisor's"),
                       _default("param_cache")),
    "safety_margin": Key(check_size, _default("safety_margin")),
    "bench_concurrency": Key(whole_number(1, MAX_BENCH_CONCURRENCY),
                             _default("bench_concurrency")),
    "bench_count": Key(whole_number(1, MAX_BENCH_COUNT), _default("bench_count")),
    "bench_c1": Key(absolute_path("cuzk-bench reads it from its own cwd"), _default("bench_c1")),
    "baseline": Key(check_size, _default("baseline")),
    "per_partition": Key(check_size, _default("per_partition")),
    "pw_baseline": Key(check_size, _default("pw_baseline")),
    "pw_per_worker": Key(check_size, _default("pw_per_worker")),
    "overrides": Key(_overrides, _default("overrides")),
}


def cuzk_section(table: Any, sup: SupervisorSpec) -> CuzkSettings:
    """[cuzk]; cuzk.toml is written into state_dir unless config_path says where."""
    c = take(table, SECTION, CUZK_KEYS)
    c["config_path"] = c["config_path"] or str(Path(sup.state_dir) / "cuzk.toml")
    # (a directory there failed the write of cuzk.toml only after the parameter fetch, naming no key)
    check_file_to_write(c["config_path"], f"{SECTION}.config_path", "cuzk.toml")
    _check_own_ports(c["listen"], c["status_listen"])
    return CuzkSettings(**c)


def _check_own_ports(listen: str, status_listen: str) -> None:
    """The daemon serves its API on listen and its status on status_listen: two sockets, two ports (one port for
    both fails its second bind, after the parameter fetch)."""
    address = cuzk_address(listen)
    if status_listen == "" or address.unix_path:
        return
    # (the daemon's own binds, whatever the address: another machine's is no question here)
    api = (address.ip, address.port)
    status = host_port(status_address(status_listen), f"{SECTION}.status_listen")
    if endpoints_meet(api, status):
        raise ConfigError(f"{SECTION}.status_listen: {shown(status_listen)} is listen's port too: the daemon "
                          "listens on each, so each needs its own")


def cuzk_settings(sections: Mapping[str, Any], kind: str, where: str = "") -> CuzkSettings:
    """The plan's [cuzk], which the kind ``kind`` (``ready = "cuzk"``, ``prepare = "cuzk-config"``) is made from;
    ConfigError at ``where`` (or, without it, for the caller to place) when the plan has none."""
    settings = sections.get(SECTION)
    if settings is None:
        place = f"{where}: " if where else ""
        raise ConfigError(f"{place}\"{kind}\" needs a [cuzk] table (it may be empty)")
    return settings


# ---------------------------------------------------------------- [manager]: the fleet protocol


def check_rate(value: Any, where: str) -> float:
    number = check_number(value, where)
    if number < 0:
        raise ConfigError(f"{where}: must be >= 0 proofs/hour, got {written(value)}")
    if number > MIN_RATE_MAX:  # (no bench passes it: the instance would be given up after its whole fetch)
        raise ConfigError(f"{where}: must be at most {MIN_RATE_MAX:g} proofs/hour (what the manager holds), got "
                          f"{written(value)}")
    return number


def check_clock(value: Any, where: str) -> float:
    """A deadline that 0 turns off (bench_deadline_s): else at least TIMEOUT_MIN_S, as every wait."""
    number = check_seconds(value, where)
    if 0 < number < TIMEOUT_MIN_S:
        raise ConfigError(f"{where}: must be 0 (no such clock) or at least {TIMEOUT_MIN_S:g} seconds "
                          f"({TIMEOUT_FLOOR[1]}), got {written(value)}")
    return number


FLEET_KEYS = {
    "min_rate": Key(check_rate),  # None: $MIN_RATE, else DEFAULT_MIN_RATE
    "bench_gate_s": Key(check_seconds, DEFAULT_BENCH_GATE_S),
    "bench_deadline_s": Key(check_clock, DEFAULT_BENCH_DEADLINE_S),
    # A failure for good (before production or in it) sends bench-done with rate 0: the manager destroys the
    # instance now.
    "give_up_on_failure": Key(check_bool),
    "report_bench_failure": Key(check_bool),  # the old name of give_up_on_failure, still accepted
    # Send the failure's reason in that bench-done (only for a manager that reads it).
    "bench_done_reason": Key(check_bool, False),
}


# [supervisor]: fitness: free bytes the parameter cache needs (less what it already holds; plugin.py param_disk).
PARAM_DISK_KEYS = {"min_param_disk": Key(check_size)}


def cuzk_paths_are_their_own(plan: Plan) -> None:
    """cuzk.toml is written over whatever is at config_path, and cuzk-daemon removes what is at a unix listen
    path before it binds and as it stops: neither is one of the supervisor's own files (its lock, its outbox, a
    child's log) nor the config file the plan was read from, nor the other (the daemon would remove its
    cuzk.toml)."""
    settings = plan.sections.get(SECTION)
    if settings is None:
        return
    check_not_owned(settings.config_path, f"{SECTION}.config_path", "cuzk.toml", plan)
    socket_path = cuzk_address(settings.listen).unix_path
    if socket_path:
        check_not_owned(socket_path, f"{SECTION}.listen", "cuzk's socket", plan)
        if os.path.realpath(socket_path) == os.path.realpath(settings.config_path):
            raise ConfigError(f"{SECTION}.listen: {shown(socket_path)} is config_path too: cuzk-daemon removes what "
                              "is at its socket path; give cuzk's socket a path of its own")


def fleet_rules(v: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """What the fleet keys of [manager] cannot say alone: the give-up's old name, $MIN_RATE."""
    v = dict(v)
    _resolve_give_up_alias(v)
    if v["min_rate"] is None:
        v["min_rate"] = _min_rate_from(environ)
    if v["min_rate"] == 0:  # the manager's "min_rate <= 0 means 50" (shared/domain/manager-api.md): judged as it judges
        v["min_rate"] = DEFAULT_MIN_RATE
    return v


def _resolve_give_up_alias(v: dict[str, Any]) -> None:
    """report_bench_failure is give_up_on_failure's old name: either may be set, both only alike."""
    old_name = v.pop("report_bench_failure")
    if v["give_up_on_failure"] is None:
        v["give_up_on_failure"] = True if old_name is None else old_name
    elif old_name is not None and old_name != v["give_up_on_failure"]:
        raise ConfigError("manager.report_bench_failure: the old name of give_up_on_failure, set to the opposite "
                          "value; keep one of them")


def _min_rate_from(environ: Mapping[str, str]) -> float:
    """``$MIN_RATE`` when [manager] says no min_rate, else the default: text from the environment, read as the
    core reads text from ``${VAR}`` where a number belongs (one grammar: a plain decimal)."""
    raw = environ.get(MIN_RATE_ENV)
    if not raw:
        return DEFAULT_MIN_RATE
    return check_rate(EnvText(raw), "MIN_RATE (environment)")


# ---------------------------------------------------------------- curio fetch-params' size

# ``curio fetch-params <size>``'s size, read as curio reads it, checked before anything runs.
#
# curio (cmd/curio/main.go ``fetchParamCmd``) reads the size with go-units ``RAMInBytes`` (v0.5.0 ``parseSize``):
# a number, an optional space, an optional suffix ``b``, or ``k``/``m``/``g``/``t``/``p`` then an optional ``b`` or
# ``ib``, any case, every unit binary (``32GB`` is 32 GiB). A bare number is bytes: ``SECTOR_SIZE=32`` fetched the
# sets of 32 bytes, which are none, so every ``.vk`` and the SRS file and no ``.params`` (lib/fastparamfetch
# ``GetParams`` skips a ``.params`` of another size only), and exited 0: param-done was reported for the wrong set,
# and the warm-up failed after it. So the size must name a set curio has (lotus build/proof-params/parameters.json:
# 2KiB, 8MiB, 512MiB, 32GiB, 64GiB), with its unit (or as its whole number of bytes); where the plan has a
# ``[cuzk]``, 32GiB: its bench, C1, PCE and memory figures are PoRep 32G's.

FETCH_PARAMS = "fetch-params"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# The sector sizes curio has parameters for, as written in its help ("specify as \"32GiB\"").
PARAMETER_SETS = {2 * KIB: "2KiB", 8 * MIB: "8MiB", 512 * MIB: "512MiB", 32 * GIB: "32GiB", 64 * GIB: "64GiB"}
CUZK_SET = 32 * GIB
_UNITS = {"k": KIB, "m": MIB, "g": GIB, "t": 1 << 40, "p": 1 << 50}
# What Go's strconv.ParseFloat takes here, less hexadecimal floats and Inf/NaN (no sector size is written so).
_GO_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def curio_size(text: str) -> tuple[int, bool]:
    """Bytes, and whether a unit was given, as go-units ``RAMInBytes`` reads ``text``; ValueError otherwise."""
    sep = max(text.rfind(ch) for ch in "0123456789. ")
    if sep < 0:
        raise ValueError("no number in it")
    number, suffix = (text[:sep], text[sep + 1:]) if text[sep] == " " else (text[:sep + 1], text[sep + 1:])
    if not _GO_FLOAT.fullmatch(number) or not math.isfinite(size := float(number)) or size < 0:
        raise ValueError(f"{shown(number)} is no number of bytes")
    unit = suffix.lower()
    if unit in ("", "b"):
        return int(size), unit == "b"
    if unit[0] not in _UNITS or unit[1:] not in ("", "b", "ib"):
        raise ValueError(f"{shown(suffix)} is no unit (KiB, MiB, GiB, TiB, PiB)")
    return int(size * _UNITS[unit[0]]), True


def fetch_size_is_a_parameter_set(plan: Plan) -> None:
    """A ``<curio> fetch-params <size>`` phase fetches a set curio has: the one [cuzk] proves, where there is one."""
    for i, phase in enumerate(plan.phases):
        command = phase.command.command
        if len(command) != 3 or command[1] != FETCH_PARAMS:
            continue
        # (the place the loader names a ${VAR} by: "(from $SECTOR_SIZE)" follows in the built-in profile)
        where, text = f"phases[{i}] ({phase.name}).command[2]", command[2]
        try:
            size, has_unit = curio_size(text)
        except ValueError as exc:
            raise ConfigError(f'{where}: {shown(text)} is not a size curio reads ({exc}): write one like "32GiB"') \
                from None
        wanted = {CUZK_SET: PARAMETER_SETS[CUZK_SET]} if SECTION in plan.sections else PARAMETER_SETS
        if size in wanted:
            continue
        sets = ", ".join(wanted.values())
        if not has_unit:
            named = f'did you mean "{text}GiB"?' if size * GIB in wanted else f"write one of {sets}"
            raise ConfigError(f"{where}: {shown(text)} has no unit, and curio reads a bare number as bytes (it would "
                              f"fetch no .params file and say done): {named}")
        if len(wanted) > 1:
            raise ConfigError(f"{where}: {shown(text)} is no set curio has parameters for: {sets}")
        raise ConfigError(f"{where}: {shown(text)} is not the set this plan proves with: {sets} ([cuzk]'s bench, C1 "
                          "and memory figures are PoRep 32G's)")
