"""The core without the prover, and what a plugin may add to it (supervisor/plugin.py).

Without a plugin the core is a complete generic supervisor: the prover's table, keys and kinds are refused like
any unknown one, in one line. A plugin defined here (``WIDGET``: a ``[widget]`` table, a ``[manager]`` key with
a rule that reads the environment, a ``prepare``, a ``ready``, a ``report`` kind, a fitness check, a profile)
gets all of it checked by the core's own machinery, and a real supervisor runs a lifecycle with it, or with no
plugin at all. This module imports nothing of ``supervisor.prover``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from supervisor.config import (
    ConfigError,
    Key,
    Plan,
    ReadyCheck,
    SupervisorSpec,
    check_arg,
    check_path,
    load_plan,
    one_of,
    parse_plan,
    take,
)
from supervisor.engine.reaping import ExitStatus
from supervisor.lifecycle import fitness
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.hooks import HookContext, Prepare
from supervisor.lifecycle.resume import NO_RERUN, Rerun
from supervisor.plugin import NO_PLUGIN, Plugin, RunSwitch, hooks_for, rerun_of

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 60

MINIMAL = '[[phases]]\nname = "p"\ncommand = ["true"]\n'


# ---------------------------------------------------------------- the test plugin


@dataclass(frozen=True)
class Widget:
    colour: str
    ready_path: str | None


WIDGET_KEYS = {"colour": Key(one_of("blue", "red"), "blue"), "ready_path": Key(check_path)}


def widget_section(table: Any, sup: SupervisorSpec) -> Widget:
    return Widget(**take(table, "widget", WIDGET_KEYS))


def tag_rule(values: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``[manager] tag``, else $WIDGET_TAG, else "untagged"."""
    return {"tag": values["tag"] or environ.get("WIDGET_TAG") or "untagged"}


def widget_of(sections: Mapping[str, Any], kind: str) -> Widget:
    if "widget" not in sections:
        raise ConfigError(f'"{kind}" needs a [widget] table')
    return sections["widget"]


def widget_env(plan: Plan) -> Prepare:
    colour = widget_of(plan.sections, "widget-env").colour
    return lambda ctx: {"WIDGET_COLOUR": colour, "WIDGET_PHASE": ctx.phase}


def widget_ready(sections: Mapping[str, Any], where: str) -> ReadyCheck:
    try:
        path = widget_of(sections, "widget").ready_path
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if path is None:
        raise ConfigError("widget.ready_path: needed by ready = \"widget\"")
    return ReadyCheck("file", path)


def red_needs_more_memory(plan: Plan, evidence: fitness.Evidence) -> list[fitness.Finding]:
    """A memory finding of the plugin's own, and one of another kind: red widgets want a GPU too."""
    widget = plan.sections.get("widget")
    if widget is None or widget.colour != "red":
        return []
    return [fitness.Finding(v.INSUFFICIENT_MEMORY, "red widgets need more memory"),
            fitness.Finding(v.GPU_UNAVAILABLE, "red widgets need a GPU")]


def widget_disk(plan: Plan, environ: Mapping[str, str]) -> list[fitness.SpaceNeed]:
    """Widgets are kept under $WIDGET_DIR (else /widgets), a MiB of them: only with a [widget] table."""
    where = environ.get("WIDGET_DIR", "/widgets")
    return [fitness.SpaceNeed("widget store", where, 1 << 20)] if "widget" in plan.sections else []


WIDGET = Plugin(
    name="widget",
    sections=MappingProxyType({"widget": widget_section}),
    table_keys=MappingProxyType({"manager": {"tag": Key(check_arg)}}),
    table_rules=MappingProxyType({"manager": tag_rule}),
    prepares=MappingProxyType({"widget-env": widget_env}),
    ready=MappingProxyType({"widget": widget_ready}),
    reports=MappingProxyType({"widget-done": "done"}),
    prepare_env=MappingProxyType({"widget-env": {"WIDGET_COLOUR": "[widget] colour"}}),
    register_env=MappingProxyType({"WIDGET_SERIAL": "serial"}),
    fitness=(red_needs_more_memory,),
    reasons=MappingProxyType({"widget_jammed": 3}),
    disk_needs=(widget_disk,),
    run_switches=MappingProxyType({"--rewidget": RunSwitch("make the widgets again", reruns="machine")}),
    profile=lambda: '[widget]\ncolour = "red"\n' + MINIMAL,
)


def parse(text: str, plugin: Plugin | None = None, environ: dict[str, str] | None = None) -> Plan:
    return parse_plan(textwrap.dedent(text), "test.toml", environ or {}, plugin)


def refused(text: str, plugin: Plugin | None = None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, plugin, environ)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------- the core alone


def test_a_cuzk_table_without_a_plugin_is_an_unknown_top_level_key() -> None:
    message = refused("[cuzk]\n" + MINIMAL)
    assert message == "test.toml: cuzk: unknown top-level key (expected [supervisor], [manager], [[phases]])"
    assert refused("[cuzk]\n" + MINIMAL, NO_PLUGIN) == message


@pytest.mark.parametrize(("key", "value", "said"), [
    ("prepare", "cuzk-config", "must be one of none (no plugin registers any), got 'cuzk-config'"),
    ("parse", "cuzk-bench", "must be one of none (no plugin registers any), got 'cuzk-bench'"),
    ("report", "bench-done", "must be one of 'param-done', 'running', got 'bench-done'"),
])
def test_a_kind_only_the_prover_registers_is_an_unknown_choice_without_it(key: str, value: str, said: str) -> None:
    assert refused(MINIMAL + f'{key} = "{value}"\n') == f"test.toml: phases[0] (p).{key}: {said}"


def test_ready_cuzk_without_a_plugin_is_not_a_probe() -> None:
    message = refused(MINIMAL.replace('"p"\n', '"p"\nkind = "service"\n') + 'ready = "cuzk"\n')
    assert message == ("test.toml: phases[0] (p).ready: 'cuzk' must be tcp://host:port, http(s)://..., or an absolute "
                       "file path")


def test_the_fleet_keys_are_not_the_cores() -> None:
    """min_rate and its kin are the prover's [manager] keys: the core refuses them, $MIN_RATE means nothing to it."""
    assert refused("[manager]\nmin_rate = 5\n" + MINIMAL) == "test.toml: manager.min_rate: unknown key"
    plan = parse(MINIMAL, environ={"MIN_RATE": "not a number"})
    assert plan.extensions == {} and plan.sections == {}
    # Nobody speaks the fleet protocol: the core's [manager] spec has no rate, no gate, no give-up.
    assert not {"min_rate", "bench_gate_s", "give_up_on_failure", "bench_done_reason"} & set(vars(plan.manager))


def test_no_config_and_no_profile_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^no config given \(--config or \$SUPERVISOR_CONFIG\) and no built-in"):
        load_plan(None, NO_PLUGIN, {})


# ---------------------------------------------------------------- what a plugin adds


def test_a_plugin_adds_a_section_parsed_by_it() -> None:
    plan = parse('[widget]\ncolour = "red"\n' + MINIMAL, WIDGET)
    assert plan.sections == {"widget": Widget("red", None)}
    assert parse(MINIMAL, WIDGET).sections == {}, "an absent section is not made"
    assert refused('[widget]\ncolour = "green"\n' + MINIMAL, WIDGET) == (
        "test.toml: widget.colour: must be one of 'blue', 'red', got 'green'")
    assert refused('[widget]\ncolor = "red"\n' + MINIMAL, WIDGET) == (
        "test.toml: widget.color: unknown key (did you mean 'colour'?)")
    assert refused("[sprocket]\n" + MINIMAL, WIDGET) == (
        "test.toml: sprocket: unknown top-level key (expected [supervisor], [manager], [widget], [[phases]])")
    assert refused("[gadget]\n" + MINIMAL, WIDGET) == (
        "test.toml: gadget: unknown top-level key (did you mean 'widget'?)"), "a near one of the plugin's tables too"


def test_a_plugin_adds_a_key_to_a_core_table_with_its_rule() -> None:
    assert dict(parse('[manager]\ntag = "t1"\n' + MINIMAL, WIDGET).extensions["manager"]) == {"tag": "t1"}
    assert parse(MINIMAL, WIDGET, {"WIDGET_TAG": "t2"}).extensions["manager"]["tag"] == "t2"
    assert parse(MINIMAL, WIDGET).extensions["manager"]["tag"] == "untagged"
    # Checked with the table's own keys: a typo is told "did you mean" over both.
    assert refused('[manager]\ntagg = "x"\n' + MINIMAL, WIDGET) == (
        "test.toml: manager.tagg: unknown key (did you mean 'tag'?)")
    assert refused('[manager]\nlabl = "x"\n' + MINIMAL, WIDGET) == (
        "test.toml: manager.labl: unknown key (did you mean 'label'?)")
    assert refused('[manager]\ntag = ""\n' + MINIMAL, WIDGET).startswith("test.toml: manager.tag: must be a non-empty")
    with pytest.raises(ConfigError, match="unknown key"):
        parse('[manager]\ntag = "t1"\n' + MINIMAL)  # not without the plugin


def test_a_plugin_adds_a_prepare_kind_made_for_the_plan(tmp_path: Path) -> None:
    plan = parse('[widget]\ncolour = "red"\n' + MINIMAL + 'prepare = "widget-env"\n', WIDGET)
    hooks = hooks_for(WIDGET, plan)(plan.phases[0])
    assert hooks.prepare is not None and hooks.output is None
    ctx = HookContext("p", None, (), tmp_path, lambda line: None)
    assert hooks.prepare(ctx) == {"WIDGET_COLOUR": "red", "WIDGET_PHASE": "p"}
    # One the plugin cannot make for this plan is refused at load, where the key is: `check` says so, not `run`.
    assert refused(MINIMAL + 'prepare = "widget-env"\n', WIDGET) == (
        'test.toml: phases[0] (p).prepare: "widget-env" needs a [widget] table')
    assert refused(MINIMAL + 'prepare = "widget-gone"\n', WIDGET) == (
        "test.toml: phases[0] (p).prepare: must be one of 'widget-env', got 'widget-gone'")


def test_an_env_may_not_set_what_a_plugins_prepare_sets_in_its_phase() -> None:
    """The config's env comes last in a child's environment: a WIDGET_COLOUR there won over the prepare's, so the
    child ran on a value no key of [widget] said. Refused where it would reach a phase of that prepare, naming the
    key to set instead; a phase without it may set the name for its own use."""
    phase = '[widget]\ncolour = "red"\n' + MINIMAL + 'prepare = "widget-env"\n'
    assert refused(phase + 'env = { WIDGET_COLOUR = "blue" }\n', WIDGET) == (
        'test.toml: phases[0] (p).env.WIDGET_COLOUR: prepare = "widget-env" sets this from [widget] colour; set that '
        "instead")
    daemon = '[[phases.daemons]]\nname = "d"\ncommand = ["true"]\nenv = { WIDGET_COLOUR = "blue" }\n'
    assert refused(phase + daemon, WIDGET) == (
        'test.toml: phases[0] (p).daemons[0] (d).env.WIDGET_COLOUR: prepare = "widget-env" sets this from [widget] '
        "colour; set that instead")
    other = MINIMAL.replace('"p"', '"q"')
    assert refused('[supervisor]\nenv = { WIDGET_COLOUR = "blue" }\n' + other + phase, WIDGET) == (
        'test.toml: supervisor.env.WIDGET_COLOUR: in phase p, prepare = "widget-env" sets this from [widget] colour; '
        "set that instead")
    plan = parse(phase + other + 'env = { WIDGET_COLOUR = "blue" }\n', WIDGET)
    assert plan.phases[1].command.env["WIDGET_COLOUR"] == "blue"


def test_an_env_may_not_set_what_the_managers_answer_sets_where_there_is_a_manager() -> None:
    """INSTANCE_UUID (the core's) and a plugin's register_env are set in every child once the manager answered
    /register: an env's would hide the manager's. Without a manager nothing sets them, and an env may."""
    manager = '[manager]\nurl = "http://127.0.0.1:9"\nlabel = "C.1"\n'
    assert refused(manager + MINIMAL + 'env = { INSTANCE_UUID = "fake" }\n', WIDGET) == (
        "test.toml: phases[0] (p).env.INSTANCE_UUID: the supervisor sets this from the manager's /register answer "
        "(uuid); leave it out")
    assert refused('[supervisor]\nenv = { WIDGET_SERIAL = "7" }\n' + manager + MINIMAL, WIDGET) == (
        "test.toml: supervisor.env.WIDGET_SERIAL: the supervisor sets this from the manager's /register "
        "answer (serial); leave it out")
    # The manager named by $MANAGER_URL alone is a manager too: check and run read the same environment.
    assert refused(MINIMAL + 'env = { INSTANCE_UUID = "fake" }\n', WIDGET, {"MANAGER_URL": "http://127.0.0.1:9",
                                                                           "VAST_CONTAINERLABEL": "C.1"}).startswith(
        "test.toml: phases[0] (p).env.INSTANCE_UUID: the supervisor sets this")
    plan = parse(MINIMAL + 'env = { INSTANCE_UUID = "mine", WIDGET_SERIAL = "7" }\n', WIDGET)
    assert plan.phases[0].command.env["INSTANCE_UUID"] == "mine"


def test_a_plugin_adds_a_ready_kind_made_from_its_section() -> None:
    service = '[[phases]]\nname = "s"\nkind = "service"\ncommand = ["true"]\nready = "widget"\n'
    plan = parse('[widget]\nready_path = "/run/widget.ready"\n' + service, WIDGET)
    assert plan.phases[0].command.ready == ReadyCheck("file", "/run/widget.ready")
    assert refused(service, WIDGET) == 'test.toml: phases[0] (s).ready: "widget" needs a [widget] table'
    assert refused("[widget]\n" + service, WIDGET) == 'test.toml: widget.ready_path: needed by ready = "widget"'
    assert refused(service.replace('"widget"', '"nope"'), WIDGET) == (
        "test.toml: phases[0] (s).ready: 'nope' must be tcp://host:port, http(s)://..., an absolute file path, "
        'or "widget"')


def test_a_plugin_adds_a_report_kind_listed_and_held_to_its_phase_kind() -> None:
    assert parse(MINIMAL + 'report = "widget-done"\n', WIDGET).phases[0].report == "widget-done"
    # The list says them in the order the lifecycle makes them: what a oneshot's end makes, then a service's up.
    assert refused(MINIMAL + 'report = "x"\n', WIDGET) == (
        "test.toml: phases[0] (p).report: must be one of 'param-done', 'widget-done', 'running', got 'x'")
    service = MINIMAL.replace('"p"\n', '"p"\nkind = "service"\n') + 'report = "widget-done"\n'
    assert refused(service, WIDGET) == ("test.toml: phases[0] (p).report: 'widget-done' is reported when a oneshot "
                                        "completes")
    two = MINIMAL + 'report = "widget-done"\n' + MINIMAL.replace('"p"', '"q"') + 'report = "widget-done"\n'
    assert refused(two, WIDGET) == "test.toml: phases: report = 'widget-done' is set on more than one phase"


def test_the_phases_make_their_reports_in_the_order_the_kinds_are_listed() -> None:
    """The manager takes its reports in the lifecycle's order (manager-api.md: a /param-done past `registered` is
    ignored, a /bench-done after /running moves the instance back): phases that would make them out of the listed
    order are refused, naming both; gaps are fine (a phase need not report)."""
    service = '[[phases]]\nname = "s"\nkind = "service"\ncommand = ["true"]\nreport = "running"\n'
    late = MINIMAL.replace('"p"', '"late"') + 'report = "widget-done"\n'
    assert refused(service + late, WIDGET) == (
        "test.toml: phases[1] (late).report: 'widget-done' would be made after phases[0] (s)'s 'running'; the "
        "manager takes them in the order 'param-done', 'widget-done', 'running': move the phase before 's'")
    fetch = MINIMAL.replace('"p"', '"fetch"') + 'report = "param-done"\n'
    widget = MINIMAL.replace('"p"', '"w"') + 'report = "widget-done"\n'
    assert refused(widget + MINIMAL + fetch, WIDGET).startswith(
        "test.toml: phases[2] (fetch).report: 'param-done' would be made after phases[0] (w)'s 'widget-done';")
    plan = parse(fetch + MINIMAL + widget + service, WIDGET)
    assert [p.report for p in plan.phases] == ["param-done", None, "widget-done", "running"]


def test_a_plugins_reason_is_kept_through_a_stop_and_exits_with_its_status() -> None:
    killed = ExitStatus.from_wait_status(15)  # the child died of the SIGTERM it was stopped with
    stopped = v.from_exit("p", "p", 42, killed, stop_reason="widget_jammed", daemon=False, attempt=1, started_at=0.0,
                          last_lines=[], added=WIDGET.reasons)
    assert (stopped.reason, stopped.success, stopped.status) == ("widget_jammed", False, 3)
    early = v.without_exit("p", "p", "widget_jammed", 1, "jammed", attempt=1, added=WIDGET.reasons)
    assert (early.reason, early.status) == ("widget_jammed", 3)
    alone = v.from_exit("p", "p", 42, killed, stop_reason="widget_jammed", daemon=False, attempt=1, started_at=0.0,
                        last_lines=[])
    assert (alone.reason, alone.success) == (v.STOPPED, True), "the core alone does not know it: a plain stop"
    with pytest.raises(ValueError, match="timeout: a reason of the core's"):
        Plugin("bad", reasons=MappingProxyType({v.TIMEOUT: 1}))


def test_a_plugins_run_switch_runs_the_phases_of_its_resume_kind_again() -> None:
    assert rerun_of(WIDGET, ["--rewidget"]) == Rerun(frozenset({"machine"}), {"machine": "--rewidget"})
    not_given = rerun_of(WIDGET, [])
    assert not_given.kinds == frozenset() and not_given.switches == {"machine": "--rewidget"}, "its hint, all the same"
    assert rerun_of(NO_PLUGIN, []) == NO_RERUN
    with pytest.raises(ValueError, match="'rewidget' is not --<name>"):
        Plugin("bad", run_switches=MappingProxyType({"rewidget": RunSwitch("?", reruns="machine")}))


def test_a_plugin_profile_is_read_when_no_config_is_given() -> None:
    plan = load_plan(None, WIDGET, {})
    assert plan.source == "built-in widget profile" and plan.sections["widget"].colour == "red"


# ---------------------------------------------------------------- fitness with a plugin


def test_a_plugins_memory_finding_is_said_only_when_the_plans_own_need_fits() -> None:
    red = parse('[widget]\ncolour = "red"\n' + MINIMAL + 'min_memory = "2GiB"\n', WIDGET)
    short, enough = fitness.Evidence(1 << 30), fitness.Evidence(4 << 30)
    said = fitness.assess(red, short, WIDGET.fitness)
    assert [f.reason for f in said] == [v.INSUFFICIENT_MEMORY, v.GPU_UNAVAILABLE], said
    assert said[0].detail.startswith("phase p needs min_memory=2.0GiB"), said
    said = fitness.assess(red, enough, WIDGET.fitness)
    assert [f.detail for f in said] == ["red widgets need more memory", "red widgets need a GPU"]
    assert fitness.assess(red, enough) == [], "without the plugin's checks: fit"


class NoGpus:
    """GPUs are not required here: never asked."""

    def inventory(self, bound_s: float) -> Any:
        raise AssertionError("GPUs are not required: NVML is not asked")


def test_the_disk_a_plugin_needs_is_measured_with_the_cores(tmp_path: Path) -> None:
    """The plugin says what it writes where (a path and bytes); the core measures the free space and counts what
    is there already, beside state_dir's min_disk."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "old.widget").write_bytes(b"w" * 4096)
    plan = parse(f'[supervisor]\nstate_dir = "{tmp_path}/state"\nmin_disk = 2048\n[widget]\n' + MINIMAL, WIDGET)
    evidence = fitness.gather(plan, None, NoGpus(), {"WIDGET_DIR": str(store)}, needs=WIDGET.disk_needs)
    widget, state = evidence.disks
    assert (widget.what, widget.path, widget.need, widget.present) == ("widget store", str(store), 1 << 20, 4096)
    assert (state.what, state.need, state.present) == ("state_dir", 2048, 0)
    assert widget.free is not None and widget.device == state.device, "one filesystem: their needs add up"
    assert fitness.gather(parse(MINIMAL, WIDGET), None, NoGpus(), {}, needs=WIDGET.disk_needs).disks == (), \
        "no [widget]: the plugin needs no disk (and min_disk is not set)"
    assert [d.what for d in fitness.gather(plan, None, NoGpus(), {}).disks] == ["state_dir"], "no plugin asked"
    [finding] = fitness.disk_findings((fitness.DiskNeed("widget store", str(store), 1 << 20, 4096, 1000, 1),))
    assert finding.reason == v.INSUFFICIENT_DISK and finding.detail.startswith(f"widget store {store} needs 1020.0KiB")


# ---------------------------------------------------------------- a real supervisor, with the test plugin or none

RUNNER = """\
import sys
sys.path.insert(0, {tests!r})
from supervisor.config import load_plan
from supervisor.plugin import NO_PLUGIN
from supervisor.app.run import run
from test_plugin_boundary import WIDGET

plugin = WIDGET if sys.argv[2] == "widget" else NO_PLUGIN
sys.exit(run(load_plan(sys.argv[1], plugin), plugin))
"""


def run_supervisor(tmp_path: Path, body: str, plugin: str) -> tuple[int, str]:
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(tests=str(Path(__file__).parent)))
    config = tmp_path / f"{plugin}.toml"
    config.write_text(f'[supervisor]\nstate_dir = "{tmp_path}/state"\nlog_dir = "{tmp_path}/logs"\n'
                      'cgroups = "off"\nstop_grace_s = 2\n' + textwrap.dedent(body))
    env = {k: val for k, val in os.environ.items() if not k.startswith(("MANAGER_", "SUPERVISOR_"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, str(script), str(config), plugin], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    return proc.returncode, out


def widget_lifecycle(tmp_path: Path, colour: str) -> str:
    ready = tmp_path / "daemon.ready"
    return f"""\
        [widget]
        colour = "{colour}"
        ready_path = "{ready}"

        [[phases]]
        name = "job"
        prepare = "widget-env"
        command = ["sh", "-c", "test -e {ready} && echo \\"$WIDGET_COLOUR $WIDGET_PHASE\\" > {tmp_path}/seen"]

          [[phases.daemons]]
          name = "helper"
          command = ["sh", "-c", "sleep 0.3; touch {ready}; exec sleep 30"]
          ready = "widget"
        """


def test_a_real_run_with_the_test_plugin_uses_its_section_prepare_and_ready(tmp_path: Path) -> None:
    status, out = run_supervisor(tmp_path, widget_lifecycle(tmp_path, "blue"), "widget")
    assert status == 0, out[-4000:]
    # The command ran once the daemon was ready by the plugin's probe (the file), with the plugin's environment.
    assert (tmp_path / "seen").read_text() == "blue job\n", out[-4000:]
    assert "fitness: ok" in out, out[-4000:]


def test_a_real_run_is_refused_by_the_plugins_fitness_check_before_anything_starts(tmp_path: Path) -> None:
    status, out = run_supervisor(tmp_path, widget_lifecycle(tmp_path, "red"), "widget")
    assert status == 1, out[-4000:]
    assert ('FAILED: phase=fitness child=fitness reason=insufficient_memory attempt=0 detail="unfit before any '
            'phase started: red widgets need more memory; red widgets need a GPU"') in out, out[-4000:]
    assert not (tmp_path / "daemon.ready").exists() and not (tmp_path / "seen").exists(), "nothing may start"


def test_a_real_run_without_any_plugin(tmp_path: Path) -> None:
    status, out = run_supervisor(tmp_path, f"""\
        [[phases]]
        name = "job"
        command = ["sh", "-c", "echo generic > {tmp_path}/seen"]
        """, "none")
    assert status == 0, out[-4000:]
    assert (tmp_path / "seen").read_text() == "generic\n"


# ---------------------------------------------------------------- the boundary in the source

def prover_imports(source: str) -> list[tuple[int, str]]:
    """(line, what) of every import of ``supervisor.prover`` in ``source``, wherever it sits (in a function, under
    TYPE_CHECKING); code in a string (a child's program) is not an import of this module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names] if module == "supervisor" else [module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[:2] == ["supervisor", "prover"]]
    return found


def test_prover_imports_are_found_however_they_are_written() -> None:
    source = textwrap.dedent("""\
        import supervisor.prover.bench as bench
        from supervisor.prover import cuzkconf
        from supervisor import prover, config
        def f():
            from supervisor.prover.fleet import RUNNER_ID
        import supervisor.config, supervisor.proverish
        from supervisor import proverish
        CHILD = "import supervisor.prover.bench"
        """)
    assert prover_imports(source) == [(1, "supervisor.prover.bench"), (2, "supervisor.prover"),
                                      (3, "supervisor.prover"), (5, "supervisor.prover.fleet")]


def test_no_core_test_imports_the_prover() -> None:
    """The core's tests (tests/, outside tests/prover/) and their fixtures and helpers need no prover: a core
    without it is whole. The prover's tests live in tests/prover/."""
    tests = REPO / "tests"
    offenders = [f"{path.relative_to(REPO)}:{line}: imports {name}"
                 for path in sorted(tests.rglob("*.py")) if tests / "prover" not in path.parents
                 for line, name in prover_imports(path.read_text())]
    assert not offenders, "core tests import the prover (move them to tests/prover/):\n" + "\n".join(offenders)
