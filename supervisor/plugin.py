"""The plugin boundary: what a domain adds to the generic supervisor, in types the core owns.

The core (config, lifecycle, reporting, status) is a generic init and lifecycle supervisor. What makes
it a Filecoin proving one (cuzk.toml, cuzk-bench's output, the fleet protocol's bench-done, the built-in
profile) comes from one plugin, ``supervisor/prover/``, which fills a ``Plugin`` and is handed in by
the composition root: ``cli.py`` imports it (the only core module that does) and hands it to ``run.py``,
``startup.py`` and ``observers.py``, which know it only as a ``Plugin``. The core names nothing of the
prover: what it consults, it consults by the names a plugin registered. It reaches a plugin through these
fields only:

- ``sections``: top-level config tables it owns (``[cuzk]``), parsed by it into frozen settings that the
  plan carries in ``Plan.sections`` under the table's name. A top-level table nobody owns is an error.
- ``table_keys``: keys it adds to a core table (``[manager] min_rate``, ...), declared with the core's own
  ``Key`` (checker, default); checked with the table's own keys (unknown keys still refused, with a
  "did you mean" over both); their values are in ``Plan.extensions[table]``, under the keys' names.
- ``table_rules``: what those keys cannot say alone (an old name, a default from the environment):
  (their values, the environment) → their final values, or ConfigError naming the key.
- ``prepares``, ``parsers``, ``settles``, ``ready``, ``reports``: the kinds it adds to the phase keys ``prepare``,
  ``parse``, ``settle``, ``ready`` and ``report``; the config refuses a name that neither the core nor the plugin
  registered, with the same one-line error as any bad choice. A ``ready`` kind is made when the config
  is read; a ``prepare`` kind is made once per plan (at load too, so ``check`` refuses one that cannot be).
- ``prepare_inputs``: what each of its ``prepare`` kinds makes its children's environment and files from (its
  settings table, as JSON data): part of what a phase with that prepare runs (resume.py's ``ran``), so that a
  changed setting runs a resumed phase again as a changed command does.
- ``prepare_env``: what each of its ``prepare`` kinds sets in its phase's children's environment, each variable with
  the key it is computed from ("[table] key", the place to set it instead), or what else fixes it;
  ``register_env``: what it sets in every child's once the manager answered ``/register``, each variable with the
  answer's field. The config refuses an ``env`` that would set one of them in those children (config/tables.py
  ``check_set_env``): last in the child's environment, it would win silently.
- ``plan_rules``: what its kinds need of the whole plan (a report whose payload one parser reads), checked
  once the plan is read: ConfigError naming the phase's key, so ``check`` refuses it.
- ``reasons``: the verdict reasons it adds (its output parser's failure, its watch's finding), each with the
  status a failure for it exits with; a stop for one of them keeps it (verdict.py), and a reason of the
  core's cannot be added.
- ``fitness``: checks run beside the core's own (memory, disk, GPUs) before the first phase.
- ``disk_needs``: what its lifecycle will write where (``SpaceNeed``: a path and bytes, from the plan and the
  environment): the core's disk check measures them with state_dir's ``min_disk``.
- ``run_switches``: switches of ``run`` (``--<name>`` → ``RunSwitch``: its help, and the resume kind whose
  phases it runs again even where their evidence holds); ``cli.py`` adds them, the core hears ``Rerun``.
- ``clocks``: its names for the core's clocks of the instance (firstseen.py: the one after the fetch),
  the names ManagerLink.clock and status use.
- ``allocators``: the process names of the downloaders that allocate a file by writing it whole before they make
  its control file (where the filesystem refuses fallocate): what such a process writes before it holds a file
  with its control file beside it is no progress, and a file it holds open is not complete (evidence/iowatch.py).
- ``attach``: called once the lifecycle and the reporting exist, with what it may drive (wiring.py).
- ``profile``: the built-in config text ``run`` uses when none is given.

A plugin may import anything of the core; the core never imports a plugin but in the composition root.
This module imports the config (whose ``ConfigPlugin`` is the part of a ``Plugin`` it reads), the hooks'
types, resume's ``Rerun`` and the core's verdict reasons; nothing of the supervision or the reporting. It
imports them where they are used, so that declaring a plugin's ``RunSwitch`` costs no more than this module.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: none of these modules imports this one
    from .config.keys import Key
    from .config.model import PhaseSpec, Plan, ReadyCheck, ReportWhen, SupervisorSpec
    from .lifecycle.fitness import Evidence, Finding, SpaceNeed
    from .lifecycle.hooks import OutputHook, PhaseHooks, Prepare, SettleHook
    from .lifecycle.resume import Rerun
    from .wiring import Wiring

# A section's parser: (the table as read from TOML, the plan's [supervisor]) → its frozen settings, or
# ConfigError naming the key (``cuzk.memory_model: ...``).
SectionParser = Callable[[Any, "SupervisorSpec"], Any]
# ``prepare = "<kind>"``: made once per plan (bound to its sections), run before each attempt.
PrepareMaker = Callable[["Plan"], "Prepare"]
# What a ``prepare`` kind is made from, for resume: the plan → JSON data (its settings).
PrepareInputs = Callable[["Plan"], Any]
# ``ready = "<kind>"``: (the plan's sections, where the key is) → the real probe, or ConfigError.
ReadyMaker = Callable[[Mapping[str, Any], str], "ReadyCheck"]
# Before the first phase: every reason the machine cannot run the plan (empty: fit).
FitnessCheck = Callable[["Plan", "Evidence"], "list[Finding]"]
# The rules between a table extension's keys: (their values as checked, the environment) → their final values.
TableRule = Callable[[dict[str, Any], Mapping[str, str]], Mapping[str, Any]]
# What the plugin's kinds need of the whole plan: None, or ConfigError naming the key.
PlanRule = Callable[["Plan"], None]
# Before the first phase: what the lifecycle will write where, from the plan and the environment (empty: nothing).
DiskNeeds = Callable[["Plan", Mapping[str, str]], "Sequence[SpaceNeed]"]


@dataclass(frozen=True)
class RunSwitch:
    """A switch a plugin adds to ``run``: its help text, and the resume kind (resume.py: ``"machine"``,
    ``"outputs"``) whose phases it runs again even where their evidence still holds."""

    help: str
    reruns: str


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Plugin:
    name: str
    sections: Mapping[str, SectionParser] = field(default_factory=_empty)
    table_keys: Mapping[str, Mapping[str, Key]] = field(default_factory=_empty)  # table → key → config Key
    table_rules: Mapping[str, TableRule] = field(default_factory=_empty)  # table → its extension's rules
    prepares: Mapping[str, PrepareMaker] = field(default_factory=_empty)
    prepare_inputs: Mapping[str, PrepareInputs] = field(default_factory=_empty)  # kind → what it is made from
    parsers: Mapping[str, OutputHook] = field(default_factory=_empty)
    settles: Mapping[str, SettleHook] = field(default_factory=_empty)
    ready: Mapping[str, ReadyMaker] = field(default_factory=_empty)
    reports: Mapping[str, ReportWhen] = field(default_factory=_empty)  # kind → "done" (a oneshot) or "up"
    prepare_env: Mapping[str, Mapping[str, str]] = field(default_factory=_empty)  # kind → variable → its source
    register_env: Mapping[str, str] = field(default_factory=_empty)  # variable → the /register answer's field
    plan_rules: tuple[PlanRule, ...] = ()
    reasons: Mapping[str, int] = field(default_factory=_empty)  # reason → the status a failure for it exits with
    fitness: tuple[FitnessCheck, ...] = ()
    disk_needs: tuple[DiskNeeds, ...] = ()
    run_switches: Mapping[str, RunSwitch] = field(default_factory=_empty)  # "--<name>" → what it asks
    clocks: Mapping[str, str] = field(default_factory=_empty)  # a core clock (firstseen.py) → the plugin's name
    allocators: frozenset[str] = frozenset()  # process names (their ``comm``)
    attach: Callable[[Wiring], None] | None = None
    profile: Callable[[], str] | None = None

    def __post_init__(self) -> None:
        if self.reasons:
            from .lifecycle.verdict import REASONS

            taken = sorted(set(self.reasons) & set(REASONS))
            if taken:
                raise ValueError(f"plugin {self.name}: {', '.join(taken)}: a reason of the core's, not the plugin's")
        for switch in self.run_switches:
            if not switch.startswith("--") or len(switch) < 3:
                raise ValueError(f"plugin {self.name}: run switch {switch!r} is not --<name>")


# The generic supervisor: nothing added.
NO_PLUGIN = Plugin("none")


def rerun_of(plugin: Plugin, given: Collection[str]) -> Rerun:
    """What resume hears of the plugin's run switches: the resume kinds the ``given`` ones run again, and the
    switch that asks each kind (its hint in the log)."""
    from .lifecycle.resume import NO_RERUN, Rerun

    if not plugin.run_switches:
        return NO_RERUN
    kinds = frozenset(plugin.run_switches[flag].reruns for flag in given)
    return Rerun(kinds, MappingProxyType({switch.reruns: flag for flag, switch in plugin.run_switches.items()}))


def hooks_for(plugin: Plugin, plan: Plan) -> Callable[[PhaseSpec], PhaseHooks]:
    """The hooks each phase of ``plan`` asks for: its ``prepare`` kind made once for the plan (with what it is made
    from), its ``parse`` kind's reader, its ``settle`` kind. The config refused a kind the plugin does not register,
    and a prepare it cannot make."""
    from .lifecycle.hooks import PhaseHooks

    named = {p.prepare for p in plan.phases}
    prepares = {kind: make(plan) for kind, make in plugin.prepares.items() if kind in named}
    inputs = {kind: read(plan) for kind, read in plugin.prepare_inputs.items() if kind in named}

    def of(spec: PhaseSpec) -> PhaseHooks:
        return PhaseHooks(prepare=prepares[spec.prepare] if spec.prepare else None,
                          output=plugin.parsers[spec.parse] if spec.parse else None,
                          settle=plugin.settles[spec.settle] if spec.settle else None,
                          prepared_from=inputs.get(spec.prepare) if spec.prepare else None)

    return of
