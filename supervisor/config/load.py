"""Config file → validated, frozen plan: read the file safely, parse TOML, expand ``${VAR}``, assemble.

Everything a run needs is checked before anything starts: unknown keys, wrong types, impossible
values and unset ``${VAR}`` references are all refused with one line that names the key
(``phases[1] (bench).daemons[0] (cuzk).ready: ...``). What a plugin adds is checked the same way, by the plugin:
its own top-level tables (``Plugin.sections``), its keys in a core table (``table_keys``, with the
table's own), and the kinds a phase may name (a kind nobody registered is a bad choice, like any).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import stat
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NoReturn

from ..text.redact import looks_secret, url_secrets
from ..text.show import cut, shown
from .endpoint import _url, check_derived_label, check_label, same_origin
from .keys import ConfigPlugin, Key, known_keys, take, unknown_hint
from .model import DEFAULT_STATE_DIR, ChildSpec, ConfigError, ManagerSpec, PhaseSpec, Plan, SupervisorSpec
from .tables import (
    CORE_TABLES,
    DAEMON_KEYS,
    MANAGER_KEYS,
    PHASE_KEYS,
    SUPERVISOR_KEYS,
    check_backoff_order,
    check_daemon_name,
    check_kept_daemons,
    check_kind_keys,
    check_log_names,
    check_memory_max_applies,
    check_memory_order,
    check_needed_keys,
    check_own_dirs_apart,
    check_ports,
    check_progress_keys,
    check_reports,
    check_set_env,
    check_settle,
    check_unique,
    homes,
    kinds_of,
    with_kinds,
)
from .values import ASIDE_CHARS, EnvText, check_not_owned, check_state_dir, join_key, named

# The file itself: a config is a few KiB; more is a mistake (or /dev/zero) and is never read whole.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_TEXT = "1 MiB"
MAX_SHOWN_PATH = 300  # a longer config name is cut in errors, which stay one readable line
# Tables and arrays in each other: the deepest real key (phases[0].daemons[0].env.X) is 5 deep.
MAX_NESTING = 16
# "$$", a reference, or (the last branch) a "${" that begins no reference: refused, never kept as text.
_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")
_SHOWN_REFERENCE = 40  # how much of a bad "${..." its error shows


def load_plan(path: str | os.PathLike[str] | None, plugin: ConfigPlugin | None = None,
              environ: Mapping[str, str] | None = None) -> Plan:
    """Read, expand and validate a config file; ``None`` means the plugin's built-in profile.
    ``plugin`` None (or supervisor/plugin.py ``NO_PLUGIN``): the generic supervisor, nothing added."""
    environ = os.environ if environ is None else environ
    text, source = _config_text(path, plugin)
    return parse_plan(text, source, environ, plugin, os.fspath(path) if path is not None else None)


def load_state_dir(path: str | os.PathLike[str] | None, plugin: ConfigPlugin | None = None,
                   environ: Mapping[str, str] | None = None) -> str:
    """A config's ``[supervisor] state_dir`` alone (``None``: the plugin's profile), checked as ``load_plan``
    checks it: what ``status`` needs. No other value is read, so a shell without the run's secrets and
    variables (a token, a ``${PROG}``) may still ask where the supervisor keeps its state; but the names ``run``
    would refuse around it are refused here too: a top-level key no one registered (a misspelt ``[supervisor]``),
    a [supervisor] that is no table or has an unknown key (a misspelt ``state_dir``), a ``state_dir`` put in
    [manager], a phase or a daemon. None is read as the default state_dir (another supervisor's state shown as
    this one's)."""
    environ = os.environ if environ is None else environ
    text, source = _config_text(path, plugin)
    mine = plugin if plugin is not None else _NOTHING
    document = _toml(text, source)  # (its refusal names the source already)
    try:
        _check_top_level(document, mine)
        table = known_keys(document.get("supervisor", {}), "supervisor",
                           {*SUPERVISOR_KEYS, *mine.table_keys.get("supervisor", {})}, homes(mine)["supervisor"])
        _state_dir_elsewhere(document, mine, environ)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    value = table.get("state_dir", DEFAULT_STATE_DIR)
    where, env_keys = "supervisor.state_dir", dict[str, str]()
    try:
        return check_state_dir(_expand(value, where, environ, env_keys), where)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}{_from_variable(str(exc), env_keys)}") from None


def _state_dir_elsewhere(document: Mapping[str, Any], plugin: ConfigPlugin, environ: Mapping[str, str]) -> None:
    """A ``state_dir`` in [manager], a phase or a daemon, refused in the words ``_plan`` refuses it with (take's
    "it is a [supervisor] key"), their other keys left to ``run``. A plugin's own tables are the plugin's to read."""
    places, own = homes(plugin), {"manager": MANAGER_KEYS, "phase": PHASE_KEYS, "daemon": DAEMON_KEYS}
    tables = [(document.get("manager"), "manager", "manager")]
    phases = document.get("phases")
    for i, phase in enumerate(phases if isinstance(phases, list) else []):
        where = _named_expanded(f"phases[{i}]", phase, environ)
        daemons = phase.get("daemons") if isinstance(phase, dict) else None
        tables += [(phase, where, "phase"), *((daemon, _named_expanded(f"{where}.daemons[{j}]", daemon, environ),
                                               "daemon") for j, daemon in enumerate(
                                                   daemons if isinstance(daemons, list) else []))]
    for table, where, kind in tables:
        if isinstance(table, dict) and "state_dir" in table:
            known_keys({"state_dir": None}, where, {*own[kind], *plugin.table_keys.get(kind, {})}, places[kind])


def config_secrets(path: str | os.PathLike[str] | None, plugin: ConfigPlugin | None = None,
                   environ: Mapping[str, str] | None = None) -> list[str]:
    """What a refusal of this config (``None``: the plugin's profile) must not show, beside the environment's
    values with secret-looking names: its env values with such names, expanded as the run expands them, the
    token that ``token_env`` names, the manager URLs' passwords; as the run masks them (startup.secrets_of), for
    the CLI to mask every config error with before it prints it: a value may be refused long before the run
    knows its secrets. Best effort: a file that cannot be read, or is no TOML, has none of its own."""
    environ = os.environ if environ is None else environ
    try:
        document = tomllib.loads(_config_text(path, plugin)[0])
    except (ConfigError, ValueError, RecursionError):  # (its refusal names no value of it)
        return []
    manager = document.get("manager")
    manager = manager if isinstance(manager, dict) else {}
    found = list(_secret_values(document, environ, 0))
    token_env = manager.get("token_env")
    if isinstance(token_env, str) and environ.get(token_env):
        found.append(environ[token_env])
    for url in (manager.get("url"), manager.get("events_url"), environ.get("MANAGER_URL")):
        if isinstance(url, str):
            found += url_secrets(_expanded(url, environ))
    return found


def _secret_values(value: Any, environ: Mapping[str, str], depth: int, secret: bool = False) -> Iterator[str]:
    """Every value under an ``env`` table's secret-looking name in ``value``, whatever its type (a table where a
    string belongs is refused quoting it), strings expanded; tables and arrays looked into to MAX_NESTING."""
    if depth > MAX_NESTING:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "env" and isinstance(item, dict) and not secret:
                for name, inner in item.items():
                    yield from _secret_values(inner, environ, depth + 2, looks_secret(name))
            else:
                yield from _secret_values(item, environ, depth + 1, secret)
    elif isinstance(value, list):
        for item in value:
            yield from _secret_values(item, environ, depth + 1, secret)
    elif secret:
        yield _expanded(value, environ) if isinstance(value, str) else str(value)


def _expanded(text: str, environ: Mapping[str, str]) -> str:
    """``text`` expanded as the run would, else as written (a refused reference: the refusal says which)."""
    try:
        return _substitute(text, "", environ)
    except ConfigError:
        return text


def _config_text(path: str | os.PathLike[str] | None, plugin: ConfigPlugin | None) -> tuple[str, str]:
    """The config's text and how errors name it: the file at ``path``, else the plugin's built-in profile."""
    if path is None:
        if plugin is None or plugin.profile is None:
            raise ConfigError("no config given (--config or $SUPERVISOR_CONFIG) and no built-in profile")
        return plugin.profile(), f"built-in {plugin.name} profile"
    source = shown_path(path)
    return read_config(path, source), source


# ---------------------------------------------------------------- reading the file


def read_config(path: str | os.PathLike[str], source: str) -> str:
    """The text of a config file: a regular file of at most MAX_CONFIG_BYTES of UTF-8, or one-line ConfigError.

    It is stat'ed before it is opened (a FIFO would block the open, a device may act on it), opened
    non-blocking all the same (the name may change in between), and read no further than the cap.
    """
    try:
        _check_config_file(os.stat(path), source)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ConfigError(f"{source}: cannot read: {_os_reason(exc)}") from None
    try:
        _check_config_file(os.fstat(fd), source)
        data = _read_at_most(fd, MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: cannot read: more than the {MAX_CONFIG_TEXT} a config may be")
    if not data.strip():
        raise ConfigError(f"{source}: the file is empty")
    try:  # (a byte-order mark, as Windows editors save UTF-8, is read past: TOML's parser calls it line 1's error)
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})") from None


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_config_file(st: os.stat_result, source: str) -> None:
    """Only a regular file of sane size is read: a FIFO would hang, /dev/zero would never end."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "not a regular file")
        raise ConfigError(f"{source}: cannot read: {kind}, not a config file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: cannot read: {st.st_size} bytes, more than the {MAX_CONFIG_TEXT} a config "
                          "may be")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _os_reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def shown_path(path: str | os.PathLike[str]) -> str:
    """The config's name as errors show it: as given, or quoted when it holds a newline or odd bytes."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    return shown(text, MAX_SHOWN_PATH, bare=True)


# ---------------------------------------------------------------- TOML and ${VAR}


def parse_plan(text: str, source: str, environ: Mapping[str, str], plugin: ConfigPlugin | None = None,
               config_file: str | None = None) -> Plan:
    """``text``, read from ``config_file`` (None: a built-in profile), as a Plan; errors name ``source``."""
    raw = _toml(text, source)
    env_keys: dict[str, str] = {}  # the place of a key read whole from ${VAR} → VAR (Plan.env_keys)
    try:
        raw = _expand(raw, "", environ, env_keys)
        plan = _plan(raw, source, environ, plugin if plugin is not None else _NOTHING, config_file)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}{_from_variable(str(exc), env_keys)}") from None
    except RecursionError:  # a safety net: _expand bounds the nesting before this can happen
        raise ConfigError(f"{source}: arrays or tables nested too deeply") from None
    return dataclasses.replace(plan, env_keys=MappingProxyType(env_keys))


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as exc:  # a number of more than 4300 digits: int() refuses it
        raise ConfigError(f"{source}: not valid TOML: {str(exc).split(';')[0]}") from None


def _from_variable(refusal: str, env_keys: Mapping[str, str]) -> str:
    """" (from $VAR)" where ``refusal`` is of a key read whole from ${VAR}: the knob to turn is the variable
    (the built-in profile's keys are in a file the operator never wrote). A rule between two keys names the other
    one's too: ``(from $A; supervisor.state_dir from $B)``."""
    places = [place for place in env_keys if place and refusal.startswith(f"{place}:")]
    own = max(places, key=len) if places else ""
    said = [f"from ${shown(env_keys[own], bare=True)}"] if own else []
    said += [f"{place} from ${shown(name, bare=True)}" for place, name in env_keys.items()
             if place and place != own and f" {place} " in refusal.partition(": ")[2]]
    return f" ({'; '.join(said)})" if said else ""


def _expand(value: Any, where: str, environ: Mapping[str, str], env_keys: dict[str, str], depth: int = 0) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in every string; ``$$`` is a literal ``$``. A string that is one
    reference whole is noted in ``env_keys`` (its place → the variable: ``Plan.env_keys``); one with any reference
    is EnvText (values.py: where a number or boolean belongs, text that spells one counts).

    Every string is refused if it holds a NUL byte: none can be an argument, an environment value or a
    path (exec and open would fail at run time, long after ``check`` said ok).
    """
    if depth > MAX_NESTING:
        raise ConfigError(f"{cut(where, ASIDE_CHARS)}: nested more than {MAX_NESTING} deep")
    if isinstance(value, str):
        whole = _VAR_RE.fullmatch(value)
        expanded = _substitute(value, where, environ)
        if "\0" in expanded:
            raise ConfigError(f"{where}: contains a NUL character, which no argument, environment value or "
                              "path can hold")
        if whole is not None and whole.group(1):
            env_keys[where] = whole.group(1)
        if any(reference.group(1) for reference in _VAR_RE.finditer(value)):
            return EnvText(expanded)  # (from the environment, whole or in part: a number or boolean it spells counts)
        return expanded
    if isinstance(value, dict):
        return {_key(k, where): _expand(v, join_key(where, k), environ, env_keys, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, _named_expanded(f"{where}[{i}]", v, environ), environ, env_keys, depth + 1)
                for i, v in enumerate(value)]
    return value


def _named_expanded(where: str, table: Any, environ: Mapping[str, str]) -> str:
    """An array's table as errors will name it: by its name as expanded (``name = "${N:-a}"`` is ``(a)``), as
    the plan's rules name it, so that a place noted in ``env_keys`` is the one its refusal begins with. A name
    that does not expand is its own error, at the plain place, when the table is expanded."""
    name = table.get("name") if isinstance(table, dict) else None
    if not isinstance(name, str):
        return where
    try:
        return named(where, {"name": _substitute(name, where, environ)})
    except ConfigError:
        return where


def _key(key: str, where: str) -> str:
    if "\0" in key:
        raise ConfigError(f"{join_key(where, key)}: a key with a NUL character")
    return key


def _substitute(value: str, where: str, environ: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name is None:
            _not_a_reference(value, match.start(), where)
        if default is not None:  # read as any text is: "$$" is "$"; a "${" (a reference within it) is refused
            default = _plain(default, lambda at: _not_a_reference(value, match.start(), where))
        # As a shell's (and docker compose's) ${VAR:-default}: the default stands for a variable unset or empty
        # (a template's empty field, -e CUZK_BENCH_BIN=, ran `exec ""` and gave the instance up).
        if environ.get(name):
            return environ[name]
        if default is not None:
            return default
        if name in environ:
            return ""
        named = shown(name, bare=True)  # (a name of 100 KB made a line of 200 KB)
        raise ConfigError(f"{where}: ${{{named}}} is not set in the environment (give a default: ${{{named}:-…}})")

    # No ${VAR} ends after the last "}", so only "$$" is left to undo there. Cutting the text at it keeps this
    # linear: an unterminated "${X:-" would otherwise be scanned to the end again from every "$" before it.
    end = value.rfind("}") + 1
    tail = _plain(value[end:], lambda at: _not_a_reference(value, end + at, where))
    return _VAR_RE.sub(one, value[:end]) + tail


def _plain(text: str, refuse: Callable[[int], NoReturn]) -> str:
    """``text``, holding no "}" (so no reference), with each "$$" made "$"; ``refuse`` is called with the place
    of a "${" in it (the only other thing a "$" may begin)."""
    return re.sub(r"\$\$|\$\{", lambda m: "$" if m.group(0) == "$$" else refuse(m.start()), text)


def _not_a_reference(value: str, at: int, where: str) -> NoReturn:
    """``value[at:]`` begins with "${" but no reference the supervisor expands (unterminated, a shell's own
    form such as ``${X-d}`` or ``${X%.gz}``, a reference within a default): taken as text it would reach the
    child half expanded."""
    fragment = value[at:at + _SHOWN_REFERENCE] + ("…" if len(value) > at + _SHOWN_REFERENCE else "")
    raise ConfigError(f"{where}: {shown(fragment)} is not a ${{NAME}} or ${{NAME:-default}} reference (write $$ "
                      "for a literal $, $${ for a shell's own ${)")


# ---------------------------------------------------------------- assembling the plan


def _plan(raw: dict[str, Any], source: str, environ: Mapping[str, str], plugin: ConfigPlugin,
          config_file: str | None) -> Plan:
    """The tables in a fixed order: [supervisor], [manager], the plugin's own, then the phases, whose
    kind keys may name what the plugin's tables configure (``ready = "cuzk"``)."""
    sections = _check_top_level(raw, plugin)
    places = homes(plugin)
    values, extensions = _table(raw.get("supervisor", {}), "supervisor", SUPERVISOR_KEYS, plugin, environ, places)
    sup = SupervisorSpec(**values)
    manager = _manager(raw.get("manager", {}), environ, plugin, extensions, places)
    settings = MappingProxyType({name: parse(raw[name], sup) for name, parse in sections.items() if name in raw})
    kinds = kinds_of(plugin, settings)
    keys = with_kinds(PHASE_KEYS, kinds), with_kinds(DAEMON_KEYS, kinds)
    phases_raw = raw.get("phases")
    if phases_raw is None:
        raise ConfigError("phases: no [[phases]] defined: nothing to run")
    if not isinstance(phases_raw, list) or not phases_raw:
        raise ConfigError("phases: must be a non-empty array of tables ([[phases]])")
    phases = tuple(_phase(p, named(f"phases[{i}]", p), sup, *keys, places) for i, p in enumerate(phases_raw))
    check_unique([p.name for p in phases], "phases", "phase name")
    check_log_names(phases, sup.log_dir)
    check_ports(phases, sup.http_port)
    check_reports(phases, kinds.reports)
    plan = Plan(sup, phases, source, manager, settings, MappingProxyType(extensions), config_file=config_file)
    # Once the phases are known (none of these may be one of their log files either). state_dir and log_dir may be
    # one directory, or one inside the other; but one named as the other's file (log_dir = "<state_dir>/status.json")
    # would take that file's place, or fail the start only after both were made.
    for key, what in (("state_dir", "state_dir"), ("log_dir", "log_dir"), ("termination_log", "the termination log")):
        check_not_owned(getattr(sup, key), f"supervisor.{key}", what, plan)
    check_own_dirs_apart(plan)
    check_prepares(plan, plugin)
    check_set_env(plan, plugin)
    for rule in plugin.plan_rules:
        rule(plan)
    return plan


def _check_top_level(raw: Mapping[str, Any], plugin: ConfigPlugin) -> dict[str, Any]:
    """Refuse a top-level key that is no core table and none of the plugin's; return the plugin's own tables
    (name → its parser). ``load_state_dir`` runs it too: a misspelt ``[supervisr]`` must not read as no
    [supervisor] at all, the default state_dir (another supervisor's state shown as this one's)."""
    sections = {name: parse for name, parse in plugin.sections.items() if name not in CORE_TABLES}
    places = homes(plugin)
    for key in raw:
        if key not in CORE_TABLES and key not in sections:
            home = unknown_hint(key, (*CORE_TABLES, *sections), places[""])  # (a table's place, else a near one)
            tables = ", ".join(["[supervisor]", "[manager]", *(f"[{name}]" for name in sections), "[[phases]]"])
            raise ConfigError(f"{join_key('', key)}: unknown top-level key{home or f' (expected {tables})'}")
    return sections


def _table(table: Any, name: str, keys: Mapping[str, Key], plugin: ConfigPlugin, environ: Mapping[str, str],
           places: Mapping[str, Mapping[str, Collection[str]]]) -> tuple[dict[str, Any], dict[str, Mapping[str, Any]]]:
    """A core table's values, and the plugin's extra keys in it (checked with the table's own: a typo is told
    "did you mean" over both), after the plugin's rules between them: (the core's values, {name: the plugin's})."""
    added = plugin.table_keys.get(name, {})
    values = take(table, name, {**keys, **added}, places[name])
    core = {key: values[key] for key in keys}
    if name not in plugin.table_keys:
        return core, {}
    mine = {key: values[key] for key in added if key not in keys}
    rule = plugin.table_rules.get(name)
    return core, {name: MappingProxyType(dict(rule(mine, environ) if rule is not None else mine))}


def check_prepares(plan: Plan, plugin: ConfigPlugin) -> None:
    """Each ``prepare`` named is made once here, for this plan, so that ``check`` refuses one the plugin
    cannot make (``"cuzk-config" needs a [cuzk] table``) rather than ``run`` failing when it builds the hooks."""
    for i, phase in enumerate(plan.phases):
        if phase.prepare is not None:
            try:
                plugin.prepares[phase.prepare](plan)
            except ConfigError as exc:
                raise ConfigError(f"phases[{i}] ({phase.name}).prepare: {exc}") from None


def _phase(table: Any, where: str, sup: SupervisorSpec, phase_keys: Mapping[str, Key],
           daemon_keys: Mapping[str, Key], places: Mapping[str, Mapping[str, Collection[str]]]) -> PhaseSpec:
    v = take(table, where, phase_keys, places["phase"])
    name = v["name"]
    check_kind_keys(v, where, given=table)
    check_needed_keys(v, where, given=table)
    check_progress_keys(v, where)
    check_backoff_order(v, where)
    check_memory_order(v, where)
    check_memory_max_applies(v, where, sup.cgroups)
    daemons = _daemons(v, where, sup, daemon_keys, places["daemon"])
    check_kept_daemons(v, daemons, where)
    check_settle(v, daemons, where)
    return PhaseSpec(
        name=name,
        kind=v["kind"],
        command=_child(v, name, name, sup, "phase"),
        daemons=daemons,
        timeout_s=v["timeout_s"],
        retries=v["retries"] or 0,
        retry_while_progressing=v["retry_while_progressing"],
        restart=v["restart"] or "on-failure",
        backoff_s=v["backoff_s"],
        backoff_max_s=v["backoff_max_s"],
        backoff_factor=v["backoff_factor"],
        backoff_jitter=v["backoff_jitter"],
        restart_burst=v["restart_burst"],
        restart_window_s=v["restart_window_s"],
        backoff_reset_s=v["backoff_reset_s"],
        stall_s=v["stall_s"],
        progress_path=v["progress_path"],
        min_memory=v["min_memory"],
        memory_max=v["memory_max"],
        report=v["report"],
        parse=v["parse"],
        prepare=v["prepare"],
        settle=v["settle"],
        settle_timeout_s=v["settle_timeout_s"],
        resume=v["resume"],
        resume_max_age_s=v["resume_max_age_s"],
        progress_total=v["progress_total"],
        progress_deadline_s=v["progress_deadline_s"],
        progress_window_s=v["progress_window_s"],
        memory_warn=sup.memory_warn if v["memory_warn"] is None else v["memory_warn"],
        gpu_health=sup.require_gpus if v["gpu_health"] is None else v["gpu_health"],
    )


def _daemons(v: Mapping[str, Any], where: str, sup: SupervisorSpec, daemon_keys: Mapping[str, Key],
             elsewhere: Mapping[str, Collection[str]]) -> tuple[ChildSpec, ...]:
    name, daemons_raw = v["name"], v["daemons"]
    if not isinstance(daemons_raw, list | tuple):
        raise ConfigError(f"{where}.daemons: must be an array of tables ([[phases.daemons]])")
    daemons = []
    for i, d in enumerate(daemons_raw):
        dwhere = named(f"{where}.daemons[{i}]", d)
        dv = take(d, dwhere, daemon_keys, elsewhere)
        check_daemon_name(dv, name, dwhere)
        check_needed_keys(dv, dwhere, given=d)
        # A daemon sees the phase's environment too; its own keys win.
        dv["env"] = MappingProxyType({**v["env"], **dv["env"]})
        daemons.append(_child(dv, name, dv["name"], sup, dv["lifetime"]))
    check_unique([d.name for d in daemons], f"{where}.daemons", "daemon name")
    return tuple(daemons)


def _child(values: Mapping[str, Any], phase: str, name: str, sup: SupervisorSpec, lifetime: str) -> ChildSpec:
    grace = values["stop_grace_s"]
    return ChildSpec(
        phase=phase,
        name=name,
        command=values["command"],
        env=MappingProxyType({**sup.env, **values["env"]}),
        cwd=values["cwd"],
        stop_signal=values["stop_signal"],
        stop_grace_s=sup.stop_grace_s if grace is None else grace,
        ready=values["ready"],
        ready_timeout_s=values["ready_timeout_s"],
        exec_wait_s=values["exec_wait_s"],
        lifetime=lifetime,
        log_source=values["log_source"] or "setup",
    )


# ---------------------------------------------------------------- [manager] and what the environment adds


def _manager(table: Any, environ: Mapping[str, str], plugin: ConfigPlugin, extensions: dict[str, Mapping[str, Any]],
             places: Mapping[str, Mapping[str, Collection[str]]]) -> ManagerSpec:
    """[manager]: the manager's address, the label, the client's timeouts; the plugin's keys go to ``extensions``."""
    v, added = _table(table, "manager", MANAGER_KEYS, plugin, environ, places)
    if environ.get("MANAGER_URL"):
        v["url"] = _url(environ["MANAGER_URL"], "MANAGER_URL (environment)")
    if v["url"] and v["token_env"] and not environ.get(v["token_env"]):
        # Calls without the token would be sent without a word, and refused by a manager that wants it.
        raise ConfigError(f"manager.token_env: ${shown(v['token_env'], bare=True)} is not set (or empty): no token "
                          "to send")
    if v["token_env"] and not _header_safe(environ.get(v["token_env"], "")):
        # Never shown: it is a secret. An HTTP client would refuse it on the first call, in the middle of the run.
        raise ConfigError(f"manager.token_env: ${shown(v['token_env'], bare=True)} holds characters an HTTP header "
                          "cannot carry (a newline, a control character or non-ASCII)")
    _one_authorization(v)
    if v["events_url"] and not v["url"]:  # (the reporting, and the events with it, is off without a manager)
        raise ConfigError("manager.events_url: needs manager.url (or $MANAGER_URL): without a manager no event is "
                          "shipped")
    explicit = v["label"] is not None
    label, where = (v["label"], "manager.label") if explicit else label_source(environ)
    # Only a manager is told the label (in JSON, kept in the outbox): without one, a strange label harms nothing.
    # One it derived must be one the manager can match; one set explicitly is the operator's to choose.
    if v["url"]:
        v["label"] = check_label(label, where) if explicit else check_derived_label(check_label(label, where), where)
    extensions.update(added)
    return ManagerSpec(**v)


def _one_authorization(v: Mapping[str, Any]) -> None:
    """A token and a URL's user:password would both set the Authorization header (the URL's would win, silently).
    The token goes to the manager's own origin only (same_origin): an events_url elsewhere carries its own
    credentials alone, and may have both there."""
    if not v["token_env"]:
        return
    if v["url"] and url_secrets(v["url"]):
        raise ConfigError("manager.token_env: the url carries a user:password too, and both would set the "
                          "Authorization header; give one of them")
    if v["events_url"] and url_secrets(v["events_url"]) and same_origin(v["url"], v["events_url"]):
        raise ConfigError("manager.token_env: the events_url carries a user:password too, and is on the manager's "
                          "own scheme, host and port, where the token is sent as well: both would set the "
                          "Authorization header; give one of them")


def label_source(environ: Mapping[str, str]) -> tuple[str, str]:
    """The default label and where it came from, as a config error names it: os.environ keeps bytes that are
    not UTF-8 as surrogate escapes, which would fail mid-run (the outbox, JSON) if not refused at load."""
    if environ.get("VAST_CONTAINERLABEL"):
        return environ["VAST_CONTAINERLABEL"], "VAST_CONTAINERLABEL (environment)"
    if environ.get("CONTAINER_ID"):
        return f"C.{environ['CONTAINER_ID']}", "CONTAINER_ID (environment)"
    return socket.gethostname(), "the hostname (no VAST_CONTAINERLABEL or CONTAINER_ID)"


def _header_safe(token: str) -> bool:
    return token.isascii() and token.isprintable()


_NONE_ADDED: MappingProxyType[str, Any] = MappingProxyType({})


class _NoPlugin:
    """The generic supervisor: no table, key or kind added (what supervisor/plugin.py ``NO_PLUGIN`` says too)."""

    name = "none"
    sections = table_keys = table_rules = prepares = parsers = settles = ready = reports = _NONE_ADDED
    prepare_env = register_env = _NONE_ADDED
    plan_rules = ()
    profile = None


_NOTHING: ConfigPlugin = _NoPlugin()
