"""Key specs, checking a table against them, and what the config reads of a plugin.

A table's keys are declared, not coded: each ``Key`` is a checker, a default, and whether it is required.
The core declares its tables with them (tables.py) and a plugin declares its own the same way: its top-level
tables (``[cuzk]``) and the keys it adds to a core table (``[manager] min_rate``). ``take`` checks a table
against such keys: an unknown key is an error with a "did you mean" hint, so typos never pass, or, for a key of
another table (``restart`` on a daemon), the table it belongs in.

``ConfigPlugin`` is the part of a plugin (supervisor/plugin.py ``Plugin``) the config reads: the config
imports nothing above itself, so it names what it needs here and any ``Plugin`` has it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from .model import ConfigError, ReadyCheck, ReportWhen, SupervisorSpec
from .values import Checker, check_table, join_key


@dataclass(frozen=True)
class Key:
    check: Checker
    default: Any = None
    required: bool = False


def take(table: Any, where: str, keys: Mapping[str, Key],
         elsewhere: Mapping[str, Collection[str]] = MappingProxyType({})) -> dict[str, Any]:
    """Check one TOML table against its keys: unknown keys are errors (typos must not pass). ``elsewhere``: the
    other tables' keys, by where they belong (``"a phase key: put it under [[phases]]"``), so that a key put in
    the wrong table is told where it goes rather than a near spelling of this table's."""
    table = known_keys(table, where, keys, elsewhere)
    out: dict[str, Any] = {}
    for key, spec in keys.items():
        if key in table:
            out[key] = spec.check(table[key], join_key(where, key))
        elif spec.required:
            raise ConfigError(f"{join_key(where, key)}: required key is missing")
        else:
            out[key] = spec.default
    return out


def known_keys(table: Any, where: str, keys: Collection[str],
               elsewhere: Mapping[str, Collection[str]] = MappingProxyType({})) -> dict[str, Any]:
    """``table``, a TOML table whose every key is one of ``keys``; else the one-line error for the first that is
    not (its right table, or a near spelling). Its values are left to the caller."""
    table = check_table(table, where)
    for key in table:
        if key not in keys:
            raise ConfigError(f"{join_key(where, key)}: unknown key{unknown_hint(key, keys, elsewhere)}")
    return table


def unknown_hint(key: str, keys: Collection[str], elsewhere: Mapping[str, Collection[str]]) -> str:
    """What an unknown key is told: the table it belongs to, else a near spelling of one of ``keys``."""
    home = next((place for place, theirs in elsewhere.items() if key in theirs), None)
    if home is not None:
        return f" (it is {home})"
    import difflib  # for a config with a typo only

    near = difflib.get_close_matches(key, list(keys), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


class ConfigPlugin(Protocol):
    """What the config reads of a plugin (supervisor/plugin.py says what each field means)."""

    @property
    def name(self) -> str: ...

    @property
    def sections(self) -> Mapping[str, Callable[[Any, SupervisorSpec], Any]]: ...

    @property
    def table_keys(self) -> Mapping[str, Mapping[str, Key]]: ...

    @property
    def table_rules(self) -> Mapping[str, Callable[[dict[str, Any], Mapping[str, str]], Mapping[str, Any]]]: ...

    @property
    def prepares(self) -> Mapping[str, Callable[[Any], object]]: ...  # kind → made from the Plan

    @property
    def parsers(self) -> Mapping[str, object]: ...

    @property
    def settles(self) -> Mapping[str, object]: ...

    @property
    def ready(self) -> Mapping[str, Callable[[Mapping[str, Any], str], ReadyCheck]]: ...

    @property
    def reports(self) -> Mapping[str, ReportWhen]: ...

    @property
    def prepare_env(self) -> Mapping[str, Mapping[str, str]]: ...

    @property
    def register_env(self) -> Mapping[str, str]: ...

    @property
    def plan_rules(self) -> tuple[Callable[[Any], None], ...]: ...  # each given the Plan

    @property
    def profile(self) -> Callable[[], str] | None: ...
