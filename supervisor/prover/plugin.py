"""The prover as a plugin of the generic supervisor: ``PLUGIN``, what cli.py loads the plan with and run.py runs.

What it adds, field by field (supervisor/plugin.py says what each means to the core):

- ``sections``: ``[cuzk]`` (configkeys.py), the settings cuzk.toml is generated from, and ``[production]``
  (production.py), the proofs watch's;
- ``table_keys``/``table_rules``: the fleet protocol's keys in ``[manager]`` (``min_rate``, ``$MIN_RATE``,
  ``bench_gate_s``, ``bench_deadline_s``, ``give_up_on_failure`` or its old name ``report_bench_failure``,
  ``bench_done_reason``), and ``[supervisor] min_param_disk``;
- ``prepares``: ``cuzk-config`` (hooks.py), made from the whole [cuzk] (``prepare_inputs``: what resume digests);
  ``parsers``: ``cuzk-bench``, ``cuzk-single``, ``paramfetch``;
  ``settles``: ``cuzk-pce``, the warm-up's daemon kept until its background PCE extraction ends (hooks.py);
- ``ready``: ``cuzk`` (ready.py); ``reports``: ``bench-done``, made when its oneshot is done;
- ``prepare_env``: what ``cuzk-config`` hands its phase's children (``CUZK_ADDR``...), each from its [cuzk] key
  (``CUDA_DEVICE_ORDER`` from none: the GPU numbering cuzk.toml is written in);
  ``register_env``: ``RUNNER_ID``, from the manager's /register answer; an ``env`` may set neither there;
- ``plan_rules``: bench-done needs cuzk-bench's parser; cuzk.toml is never written over the supervisor's own
  files or the config (``[production] curio_metrics = ""`` is refused by its key: production.py); ``curio
  fetch-params`` is given a size with its unit, of a set curio has (32GiB with a [cuzk]: configkeys.py);
- ``reasons``: ``bench_failed``, ``proofs_failing`` and ``curio_unresponsive``, each exiting 1 (reasons.py);
- ``fitness``: what cuzk.toml generation needs, on the memory the phase may have (below);
- ``disk_needs``: ``min_param_disk`` under the parameter cache ([cuzk] param_cache, else
  ``$FIL_PROOFS_PARAMETER_CACHE``, else the param-done phase's progress_path);
- ``run_switches``: ``--rebench``, which runs the ``resume = "machine"`` phases (the bench) again (switches.py);
- ``clocks``: the core's clock after the fetch is the benchmark's, ``bench`` (benchlimits.py);
- ``allocators``: ``aria2c``, whose zeros where fallocate is refused are no progress (fetchlines.py);
- ``profile``: profile.toml, run when no config is given.

- ``attach``: the fleet protocol (fleet.py): bench-done and its gate, the give-up, ``min_rate`` in the
  register body, ``runner_id``; the bench cut (benchlimits.py): a bench that can no longer pass min_rate
  is stopped too_slow (and so given up); and the production watch (production.py): proofs counted while
  curio runs, the summary line, ``proofs_failing``, ``curio_unresponsive``; its settings in ``[production]``; on
  with a ``[cuzk]`` or a ``[production]``; it always reads curio's metrics (the one count of every failed proof),
  and cuzk's /status beside them where there is one.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

from ..config import PARAM_DONE, RUNNING, ConfigError, Plan
from ..lifecycle import verdict as v
from ..lifecycle.fitness import Evidence, Finding, SpaceNeed
from ..lifecycle.hooks import capped
from ..plugin import Plugin
from ..state.firstseen import AFTER_FETCH_CLOCK
from ..wiring import Wiring
from . import benchlimits, cuzkconf, fleet, production
from .configkeys import (
    FLEET_KEYS,
    PARAM_DISK_KEYS,
    SECTION,
    cuzk_paths_are_their_own,
    cuzk_section,
    fetch_size_is_a_parameter_set,
    fleet_rules,
)
from .fetchlines import ALLOCATORS
from .fleet import BENCH_DONE, RUNNER_ID, RUNNER_ID_ENV
from .hooks import (
    BENCH_PARSER,
    CUZK_CONFIG,
    CUZK_CONFIG_ENV,
    PARSERS,
    PCE_HOOK,
    PCE_SETTLE,
    cuzk_config_inputs,
    make_cuzk_config,
)
from .ready import KIND as CUZK_READY
from .ready import make_cuzk_ready
from .reasons import REASONS
from .switches import RUN_SWITCHES

PARAM_CACHE_ENV = "FIL_PROOFS_PARAMETER_CACHE"


def bench_done_carries_a_rate(plan: Plan) -> None:
    """bench-done carries the bench's rate, which only cuzk-bench's parser reads: a bench phase without it
    would pass and be reported at no rate, and the manager destroys an instance below min_rate."""
    for i, phase in enumerate(plan.phases):
        if phase.report == BENCH_DONE and phase.parse != BENCH_PARSER:
            has = f"parse = {phase.parse!r}" if phase.parse is not None else "no parse"
            raise ConfigError(f'phases[{i}] ({phase.name}).parse: report = "{BENCH_DONE}" carries the bench\'s '
                              f'rate, read by parse = "{BENCH_PARSER}" (this phase has {has})')


def cuzk_toml_fits(plan: Plan, evidence: Evidence) -> list[Finding]:
    """The first ``prepare = "cuzk-config"`` phase whose cuzk.toml cannot be generated on the memory it may
    have: the very generation the phase runs before each daemon start, on the same figure."""
    settings = plan.sections.get(SECTION)
    if settings is None or evidence.available_memory is None:
        return []  # no [cuzk]; or nothing to compare with (the phase preflight says so when it runs)
    for phase in plan.phases:
        if phase.prepare != CUZK_CONFIG:
            continue
        try:
            cuzkconf.generate(settings, capped(evidence.available_memory, phase.memory_max), [])
        except (cuzkconf.DoesNotFit, ValueError) as exc:
            return [Finding(v.INSUFFICIENT_MEMORY, f"phase {phase.name}: cuzk.toml: {exc}")]
    return []


def param_cache(plan: Plan, environ: Mapping[str, str]) -> str | None:
    """Where the parameters go: where cuzk reads them from ([cuzk] param_cache), else
    $FIL_PROOFS_PARAMETER_CACHE (the config's [supervisor] env, then the environment, then the first phase's env
    that sets it: the docs' example sets it there, and min_param_disk went unchecked), else the fetch's
    progress_path (the ``report = "param-done"`` phase's); None: nowhere said."""
    settings = plan.sections.get(SECTION)
    if settings is not None:
        return settings.param_cache
    named = plan.supervisor.env.get(PARAM_CACHE_ENV) or environ.get(PARAM_CACHE_ENV) or next(
        (p.command.env[PARAM_CACHE_ENV] for p in plan.phases if p.command.env.get(PARAM_CACHE_ENV)), None)
    if named:
        return named
    fetch = next((p for p in plan.phases if p.report == PARAM_DONE and p.progress_path), None)
    return fetch.progress_path if fetch is not None else None


def param_disk(plan: Plan, environ: Mapping[str, str]) -> list[SpaceNeed]:
    """The prover's disk need: ``[supervisor] min_param_disk`` under the parameter cache (none without it, or
    without a cache)."""
    need = plan.extensions.get("supervisor", {}).get("min_param_disk")
    cache = param_cache(plan, environ) if need is not None else None
    return [SpaceNeed("parameter cache", cache, need)] if cache is not None and need is not None else []


def attach(wiring: Wiring) -> None:
    """The fleet protocol, the bench cut and the benchmark clock (which give up through it), then the production
    watch on the ``report = "running"`` phase, with a [cuzk] (its /status, curio's metrics beside it) or a
    [production] (curio's metrics alone do: without [cuzk] there is no cuzk /status to read)."""
    fleet.attach(wiring)
    benchlimits.attach_cut(wiring)
    benchlimits.attach_clock(wiring)
    cuzk = wiring.plan.sections.get(SECTION)
    settings = wiring.plan.sections.get(production.SECTION)
    if cuzk is None and settings is None:
        return
    settings = settings or production.ProductionSettings()
    # A partition-workers daemon (Feb to 13 Mar 2026) serves no status API: read, its source was blind for the
    # whole of production on a healthy instance.
    status = cuzkconf.status_address(cuzk.status_listen) if cuzk is not None \
        and cuzk.memory_model != "partition-workers" else ""
    phase = next((p.name for p in wiring.plan.phases if p.report == RUNNING), None)
    production.attach_watch(wiring, f"http://{status}/status" if status else "", phase, settings, wiring.log)


def profile() -> str:
    """The built-in prover profile (profile.toml)."""
    return resources.files(__package__).joinpath("profile.toml").read_text()


PLUGIN = Plugin(
    name="prover",
    sections=MappingProxyType({SECTION: cuzk_section, production.SECTION: production.production_section}),
    table_keys=MappingProxyType({"manager": FLEET_KEYS, "supervisor": PARAM_DISK_KEYS}),
    table_rules=MappingProxyType({"manager": fleet_rules}),
    prepares=MappingProxyType({CUZK_CONFIG: make_cuzk_config}),
    prepare_inputs=MappingProxyType({CUZK_CONFIG: cuzk_config_inputs}),
    parsers=MappingProxyType(PARSERS),
    settles=MappingProxyType({PCE_SETTLE: PCE_HOOK}),
    ready=MappingProxyType({CUZK_READY: make_cuzk_ready}),
    reports=MappingProxyType({BENCH_DONE: "done"}),
    prepare_env=MappingProxyType({CUZK_CONFIG: MappingProxyType(CUZK_CONFIG_ENV)}),
    register_env=MappingProxyType({RUNNER_ID_ENV: RUNNER_ID}),
    plan_rules=(bench_done_carries_a_rate, cuzk_paths_are_their_own, fetch_size_is_a_parameter_set),
    reasons=REASONS,
    fitness=(cuzk_toml_fits,),
    disk_needs=(param_disk,),
    run_switches=RUN_SWITCHES,
    clocks=MappingProxyType({AFTER_FETCH_CLOCK: benchlimits.BENCH_CLOCK}),
    allocators=ALLOCATORS,
    attach=attach,
    profile=profile,
)
