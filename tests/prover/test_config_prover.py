"""The prover's config as the CLI loads it (its plugin's sections and keys: [cuzk], [manager]'s fleet extension, the
built-in profile): the loader's rules over the prover's tables. The loader's own tests are tests/test_config.py.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import PY, REPO, clean_env

from supervisor.config import (
    DEFAULT_STATE_DIR,
    MAX_EXEC_WAIT_S,
    MAX_SECONDS,
    ConfigError,
    ConfigPlugin,
    Plan,
    ReadyCheck,
    load_plan,
    parse_plan,
)
from supervisor.config.tables import DAEMON_KEYS, MANAGER_KEYS, PHASE_KEYS, SUPERVISOR_KEYS
from supervisor.prover.configkeys import CUZK_KEYS, FLEET_KEYS
from supervisor.prover.plugin import PLUGIN
from supervisor.prover.production import PRODUCTION_KEYS
from supervisor.text.show import shown


def parse(body: str, environ: dict[str, str] | None = None, plugin: ConfigPlugin | None = None) -> Plan:
    """The generic supervisor's config (no plugin), or with ``plugin`` (PLUGIN: the prover's, as the CLI loads it)."""
    return parse_plan(textwrap.dedent(body), "test.toml", environ or {}, plugin)


def parse_error(body: str, environ: dict[str, str] | None = None, plugin: ConfigPlugin | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(body, environ, plugin)
    return str(info.value)


def test_builtin_profile_loads() -> None:
    plan = load_plan(None, PLUGIN, environ={})
    assert plan.source == "built-in prover profile"
    assert [(p.name, p.kind) for p in plan.phases] == [
        ("paramfetch", "oneshot"), ("warmup", "oneshot"), ("bench", "oneshot"), ("curio", "service")]
    paramfetch, warmup, bench, curio = plan.phases
    assert paramfetch.command.command == ("curio", "fetch-params", "32GiB")
    assert paramfetch.timeout_s == 5100 and paramfetch.retries == 2
    assert paramfetch.command.env["FIL_PROOFS_PARAMETER_CACHE"] == "/var/tmp/filecoin-proof-parameters"
    assert paramfetch.report == "param-done" and bench.report == "bench-done" and curio.report == "running"
    assert bench.parse == "cuzk-bench" and warmup.parse == "cuzk-single"
    # Warm-up and bench together stay inside the manager's 45 min deadline; the fetch inside its 90 min.
    assert warmup.timeout_s + bench.timeout_s < 45 * 60 and paramfetch.timeout_s < 90 * 60
    for phase in (warmup, bench, curio):
        assert phase.prepare == "cuzk-config"
        assert [d.name for d in phase.daemons] == ["cuzk-daemon"]
        daemon = phase.daemons[0]
        assert daemon.stop_signal == signal.SIGINT
        # Either generation's proof of readiness: /status (from 13 Mar 2026) or the listen port (before).
        assert daemon.ready == ReadyCheck("any", "cuzk", alternatives=(
            ReadyCheck("http", "http://127.0.0.1:9821/status", "127.0.0.1", 9821),
            ReadyCheck("tcp", "127.0.0.1:9820", "127.0.0.1", 9820)))
        assert daemon.command == ("cuzk-daemon", "-c", "/var/lib/prover-supervisor/cuzk.toml")
    assert plan.sections["cuzk"].config_path == "/var/lib/prover-supervisor/cuzk.toml"
    assert curio.restart == "always" and curio.timeout_s is None  # (a clean exit proves nothing either)
    assert plan.supervisor.state_dir == "/var/lib/prover-supervisor"
    assert plan.supervisor.stop_grace_s == 30


def test_builtin_profile_takes_environment() -> None:
    plan = load_plan(None, PLUGIN, environ={"SECTOR_SIZE": "32G", "SUPERVISOR_LOG_DIR": "/tmp/l",
                                            "BENCH_COUNT": "3", "BENCH_CONCURRENCY": "2"})
    assert plan.phases[0].command.command[-1] == "32G"  # (32 GiB to curio, its go-units spelling)
    assert plan.supervisor.log_dir == "/tmp/l"
    bench = plan.phases[2].command.command
    assert "-c \"$CUZK_BENCH_COUNT\"" in bench[2] and bench[3:] == ("cuzk-bench",), bench
    assert plan.sections["cuzk"].bench_count == 3  # checked as [cuzk] bench_count, handed as $CUZK_BENCH_COUNT
    assert plan.sections["cuzk"].bench_concurrency == 2


@pytest.mark.parametrize(("variable", "raw", "said"), [
    ("BENCH_COUNT", "abc", "cuzk.bench_count: must be a whole number, got 'abc'"),
    ("BENCH_COUNT", "-5", "cuzk.bench_count: must be >= 1, got -5"),
    ("BENCH_COUNT", "0", "cuzk.bench_count: must be >= 1, got 0"),
    ("BENCH_COUNT", "10001", "cuzk.bench_count: must be at most 10000, got 10001"),
    ("BENCH_C1", "c1.json", "cuzk.bench_c1: 'c1.json' is not an absolute path"),
])
def test_the_bench_count_and_input_are_checked_before_anything_runs(variable: str, raw: str, said: str) -> None:
    """BENCH_COUNT=abc passed check and failed the bench (cuzk-bench's argparse, exit 2) after the download."""
    with pytest.raises(ConfigError) as info:
        load_plan(None, PLUGIN, environ={variable: raw})
    message = str(info.value)
    assert message.startswith(f"built-in prover profile: {said}") and "\n" not in message, message
    assert message.endswith(f"(from ${variable})"), message


def test_a_variable_set_empty_is_the_profiles_default() -> None:
    """A template's empty field (-e CUZK_BENCH_BIN=) passed check as "" and the warm-up ran `exec ""` (126): a
    failure for good, the instance given up. As a shell's ${VAR:-default}, empty is unset."""
    empty = {name: "" for name in ("CUZK_BENCH_BIN", "BENCH_C1", "SECTOR_SIZE", "CURIO_LAYERS", "BENCH_COUNT")}
    plan, default = load_plan(None, PLUGIN, environ=empty), load_plan(None, PLUGIN, environ={})
    assert plan.phases == default.phases and plan.sections == default.sections
    assert "cuzk-bench" in plan.phases[1].command.command, plan.phases[1].command.command


@pytest.mark.parametrize("raw", ["0.000001", "0.001", "0.1"])
def test_the_watch_interval_from_the_environment_has_a_floor(raw: str) -> None:
    """$PROVER_WATCH_S=0.000001 gave 300 requests a second to cuzk: refused, one line naming the key."""
    with pytest.raises(ConfigError) as info:
        load_plan(None, PLUGIN, environ={"PROVER_WATCH_S": raw})
    message = str(info.value)
    assert "production.watch_s: must be at least 0.2 seconds" in message and "\n" not in message, message
    assert load_plan(None, PLUGIN, environ={"PROVER_WATCH_S": "0.2"}).sections["production"].watch_s == 0.2


MINIMAL = """\
[[phases]]
name = "p"
command = ["true"]
"""


# The *_s keys with a most of their own, below MAX_SECONDS, and what it is.
TIGHTER = {"exec_wait_s": (MAX_EXEC_WAIT_S, "60 seconds")}


def test_every_seconds_key_is_bounded() -> None:
    """Each *_s key of every table refuses more than MAX_SECONDS (or its own, tighter most), so a key added later
    cannot forget it."""
    tables = {"supervisor": SUPERVISOR_KEYS, "phases": PHASE_KEYS, "daemons": DAEMON_KEYS,
              "manager": {**MANAGER_KEYS, **FLEET_KEYS}, "cuzk": CUZK_KEYS, "production": PRODUCTION_KEYS}
    seconds_keys = [(table, key) for table, keys in tables.items() for key in keys if key.endswith("_s")]
    assert len(seconds_keys) >= 17, seconds_keys
    for table, key in seconds_keys:
        check = tables[table][key].check
        most, said = TIGHTER.get(key, (MAX_SECONDS, "864000 seconds"))
        assert check(most, key) == most, f"{table}.{key} refuses its maximum itself"
        with pytest.raises(ConfigError, match=f"^{key}: must be at most {said}"):
            check(most * 1.001, key)
        with pytest.raises(ConfigError, match=f"^{key}: "):
            check(10**400, key)


def test_production_durations_are_held_to_the_documented_most() -> None:
    """[production]'s *_s keys were bounded below 10**9 s (31 years) where docs/configuration.md says 10 days."""
    for key in ("watch_s", "proof_failure_window_s"):
        assert parse_error(MINIMAL + f"[production]\n{key} = 999999999\n", plugin=PLUGIN) == \
            f"test.toml: production.{key}: must be at most 864000 seconds (10 days), got 999999999"
        assert getattr(parse(MINIMAL + f"[production]\n{key} = 864000\n", plugin=PLUGIN).sections["production"],
                       key) == 864000


REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def reference_row(table_key: str) -> list[str]:
    """The rows of docs/configuration.md's tables for ``table_key`` (a key in backquotes)."""
    return [line for line in REFERENCE.read_text().splitlines() if line.startswith(f"| `{table_key}` |")]


@pytest.mark.parametrize("kind", sorted(PLUGIN.parsers))
def test_every_parse_kind_is_in_the_reference(kind: str) -> None:
    """parse = "paramfetch" was accepted but named neither in the parse row nor among the prover's kinds."""
    assert f'`"{kind}"`' in reference_row("parse")[0]
    kinds = next(line for line in REFERENCE.read_text().splitlines() if "the kinds `prepare = " in line)
    assert f'"{kind}"' in kinds, kinds


def test_proof_failures_is_held_to_the_documented_most() -> None:
    """The reference said any whole number's 1000000; the key's own bound is 100000."""
    assert "`proof_failures` 100000" in REFERENCE.read_text()
    assert parse_error(MINIMAL + "[production]\nproof_failures = 100001\n", plugin=PLUGIN) == \
        "test.toml: production.proof_failures: must be at most 100000, got 100001"
    assert parse(MINIMAL + "[production]\nproof_failures = 100000\n", plugin=PLUGIN).sections[
        "production"].proof_failures == 100000


def test_a_ready_file_url_is_in_the_reference() -> None:
    """ready = "file:///path" is taken (test_config.py test_ready_kinds) where the reference said an absolute path."""
    assert all("file:///path" in row for row in reference_row("ready")), reference_row("ready")


@pytest.mark.parametrize("url", ["http://127.0.0.1:12300/debug/metrics", "https://curio.internal/debug/metrics"])
def test_curio_metrics_is_an_http_url(url: str) -> None:
    """A URL is taken as written (the refusals are in test_config.py)."""
    plan = parse(MINIMAL + f'[cuzk]\n[production]\ncurio_metrics = "{url}"\n', plugin=PLUGIN)
    assert plan.sections["production"].curio_metrics == url


@pytest.mark.parametrize(("raw", "said"), [
    # (curio reads a bare number as bytes: every .vk, no .params, exit 0; param-done said for the wrong set)
    ("32", "'32' has no unit, and curio reads a bare number as bytes (it would fetch no .params file and say done): "
           'did you mean "32GiB"?'),
    ("64GiB", "'64GiB' is not the set this plan proves with: 32GiB ([cuzk]'s bench, C1 and memory figures are "
              "PoRep 32G's)"),
    ("32XB", "'32XB' is not a size curio reads ('XB' is no unit (KiB, MiB, GiB, TiB, PiB)): write one like "
             '"32GiB"'),
    (" 32GiB", "' 32GiB' is not a size curio reads (' 32' is no number of bytes): write one like \"32GiB\""),
])
def test_the_fetchs_sector_size_is_checked_before_anything_runs(raw: str, said: str) -> None:
    """SECTOR_SIZE=32 passed check: curio's go-units reads it as 32 bytes, fetches no .params and exits 0, and the
    warm-up failed after the download. The profile proves PoRep 32G: its set, with its unit."""
    with pytest.raises(ConfigError) as info:
        load_plan(None, PLUGIN, environ={"SECTOR_SIZE": raw})
    assert str(info.value) == f"built-in prover profile: phases[0] (paramfetch).command[2]: {said} (from $SECTOR_SIZE)"
    for spelt in ("32GiB", "32G", "32gb", "32 GiB", str(32 << 30)):  # (all 32 GiB to curio)
        assert load_plan(None, PLUGIN, environ={"SECTOR_SIZE": spelt}).phases[0].command.command[2] == spelt


def test_without_cuzk_the_fetch_may_be_any_set_curio_has() -> None:
    fetch = '[[phases]]\nname = "f"\ncommand = ["curio", "fetch-params", "{}"]\n'
    for size in ("2KiB", "8MiB", "512MiB", "32GiB", "64GiB"):
        assert parse(fetch.format(size), plugin=PLUGIN).phases[0].command.command[2] == size
    assert parse_error(fetch.format("16GiB"), plugin=PLUGIN) == \
        "test.toml: phases[0] (f).command[2]: '16GiB' is no set curio has parameters for: 2KiB, 8MiB, 512MiB, " \
        "32GiB, 64GiB"
    assert parse_error(fetch.format("64"), plugin=PLUGIN).endswith('curio reads a bare number as bytes (it would '
                                                                 'fetch no .params file and say done): did you mean '
                                                                 '"64GiB"?')


def test_check_and_run_refuse_a_bare_sector_size_alike(tmp_path: Path) -> None:
    env = {**clean_env(), "SECTOR_SIZE": "32", "SUPERVISOR_STATE_DIR": str(tmp_path / "state"),
           "SUPERVISOR_LOG_DIR": str(tmp_path / "logs"), "PROVER_SUPERVISOR_RUNTIME_DIR": str(tmp_path / "run")}
    said = [subprocess.run([PY, "-m", "supervisor", command], capture_output=True, text=True, timeout=30, cwd=REPO,
                           env=env) for command in ("check", "run")]
    assert [done.returncode for done in said] == [2, 2], said
    assert said[0].stderr == said[1].stderr and said[0].stderr.count("\n") == 1, said
    assert "phases[0] (paramfetch).command[2]: '32' has no unit" in said[0].stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("cuzk", ["[cuzk]\n", '[cuzk]\nstatus_listen = ""\n', ""])
def test_no_curio_metrics_is_refused_even_beside_cuzks_status(cuzk: str) -> None:
    """cuzk's /status counts a failed proof only where a PoRep fails its self-check (cuzk-core engine.rs): a watch
    of it alone, taken with a [cuzk] whose status_listen was set, read every proof failing on a GPU error as
    healthy, for ever. check and run refuse it alike, in one line naming the key."""
    refusal = ('test.toml: production.curio_metrics: "" is refused: curio\'s metrics are the proofs watch\'s one '
               "count of failed proofs (cuzk's /status counts only a PoRep whose self-check failed, never a GPU or "
               "synthesis failure); give curio's /debug/metrics URL")
    assert parse_error(MINIMAL + f'{cuzk}[production]\ncurio_metrics = ""\n', plugin=PLUGIN) == refusal


def test_a_huge_watch_interval_is_shown_cut() -> None:
    """`PROVER_WATCH_S=<200k characters> prover-supervisor status`, or a file's: the whole value was echoed, a line
    of hundreds of KB."""
    huge = "y" * 200_000
    with pytest.raises(ConfigError) as info:
        load_plan(None, PLUGIN, environ={"PROVER_WATCH_S": huge})
    assert str(info.value) == (f"built-in prover profile: production.watch_s: must be a number, got {shown(huge)} "
                               "(from $PROVER_WATCH_S)")
    assert parse_error(MINIMAL + f'[production]\nproof_failure_window_s = "{huge}"\n', plugin=PLUGIN) == \
        f"test.toml: production.proof_failure_window_s: must be a number, got {shown(huge)}"
    assert len(shown(huge)) == 60


def test_digits_from_the_environment_count_as_numbers() -> None:
    plan = parse(MINIMAL + '[supervisor]\nhttp_port = "${PORT}"\n[cuzk]\nbench_concurrency = "${J}"\n',
                 {"PORT": " 8080 ", "J": "3"}, PLUGIN)
    assert plan.supervisor.http_port == 8080
    assert plan.sections["cuzk"].bench_concurrency == 3


@pytest.mark.parametrize("raw", ["nan", "inf", "1e999", "١٢", "-5", "5_0", "abc", "1" * 40])
def test_min_rate_from_environment_is_a_plain_number(raw: str) -> None:
    message = parse_error(MINIMAL, {"MIN_RATE": raw}, PLUGIN)
    assert message.startswith("test.toml: MIN_RATE (environment): "), message


def test_min_rate_from_environment_accepted() -> None:
    plan = parse(MINIMAL, {"MIN_RATE": " 12.5 "}, PLUGIN)
    assert plan.extensions["manager"]["min_rate"] == 12.5


@pytest.mark.parametrize(("environ", "manager"), [({"MIN_RATE": "0"}, ""), ({}, "[manager]\nmin_rate = 0\n")])
def test_a_min_rate_of_0_is_the_managers_50(environ: dict[str, str], manager: str) -> None:
    # shared/domain/manager-api.md: "min_rate <= 0 means 50". Taken as 0, the bench gate and the min_rate cut passed
    # every bench until the row was read, while the manager judged it by 50.
    plan = parse(MINIMAL + manager, environ, PLUGIN)
    assert plan.extensions["manager"]["min_rate"] == 50.0


@pytest.mark.parametrize(("overrides", "accepted"), [
    ('{ memory = { total_budget = "auto" } }', True),
    ('{ memory = { total_budget = "100GiB" } }', True),
    ('{ pipeline = { synthesis_concurrency = 4 }, other = { x = "y" } }', True),
    ('{ synthesis = { partition_workers = 2 } }', True),
    ('{ memory = { total_budget = "1e999" } }', False),
    ('{ pipeline = { synthesis_concurrency = true } }', False),
    ('{ synthesis = { partition_workers = 5000 } }', False),
    ('{ synthesis = 1 }', False),
])
def test_cuzk_overrides_checked_as_generate_reads_them(overrides: str, accepted: bool) -> None:
    body = f"[cuzk]\noverrides = {overrides}\n" + MINIMAL
    if accepted:
        assert "cuzk" in parse(body, plugin=PLUGIN).sections
    else:
        assert parse_error(body, plugin=PLUGIN).startswith("test.toml: cuzk.overrides.")


def test_override_values_from_a_variable_reach_cuzk_toml_as_what_they_spell() -> None:
    # "${CONC}" is text: cuzk refused cuzk.toml's synthesis_concurrency = "3" (after the parameter fetch), and
    # generate()'s memory fit, which reads only a number, passed it over. A text that spells nothing stays text.
    body = ('[cuzk]\noverrides = { pipeline = { synthesis_concurrency = "${CONC}" }, '
            'synthesis = { partition_workers = "${PW}" }, gpus = { gpu_workers_per_device = "${GW}" }, '
            'other = { ratio = "${R}", on = "${ON}", name = "${NAME}", listed = ["${PW}", "x"] } }\n' + MINIMAL)
    environ = {"CONC": "3", "PW": "8", "GW": "2", "R": "0.5", "ON": "true", "NAME": "fast"}
    overrides = parse(body, environ, plugin=PLUGIN).sections["cuzk"].overrides
    values = [overrides["pipeline"]["synthesis_concurrency"], overrides["synthesis"]["partition_workers"],
              overrides["gpus"]["gpu_workers_per_device"], *overrides["other"].values()]
    assert values == [3, 8, 2, 0.5, True, "fast", [8, "x"]]
    assert [type(v) for v in values] == [int, int, int, float, bool, str, list]


def test_an_empty_cuzk_table_is_the_settings_own_defaults() -> None:
    """[cuzk]'s key table takes its defaults from CuzkSettings: one set of them, whatever the table leaves out."""
    from supervisor.prover.cuzkconf import CuzkSettings

    plan = parse("[cuzk]\n" + MINIMAL, plugin=PLUGIN)
    assert plan.sections["cuzk"] == CuzkSettings(config_path=f"{DEFAULT_STATE_DIR}/cuzk.toml")


def test_the_fleet_keys_are_the_provers_extension_of_manager() -> None:
    """What the fleet protocol reads, under the file's own key names, in Plan.extensions["manager"]."""
    plan = parse("[manager]\nmin_rate = 7\nbench_gate_s = 9\nreport_bench_failure = false\n"
                 "bench_done_reason = true\nbench_deadline_s = 60\n" + MINIMAL, plugin=PLUGIN)
    assert dict(plan.extensions["manager"]) == {"min_rate": 7.0, "bench_gate_s": 9.0, "give_up_on_failure": False,
                                                "bench_done_reason": True, "bench_deadline_s": 60.0}
    defaults = parse(MINIMAL, plugin=PLUGIN)
    assert dict(defaults.extensions["manager"]) == {"min_rate": 50.0, "bench_gate_s": 300.0,
                                                    "give_up_on_failure": True, "bench_done_reason": False,
                                                    "bench_deadline_s": 2700.0}
    from supervisor.prover.fleet import FleetSettings, fleet_settings

    # What the fleet protocol reads:
    assert fleet_settings(defaults) == FleetSettings(50.0, 300.0, True, False, 2700.0)


def test_accepted_overrides_generate_without_error() -> None:
    """What config lets through, cuzkconf.generate() takes (on a machine big enough for it)."""
    from supervisor.prover.cuzkconf import generate

    for overrides in ('{ memory = { total_budget = "400GiB" }, pipeline = { synthesis_concurrency = 2 } }',
                      '{ synthesis = { partition_workers = 2 } }'):
        model = "partition-workers" if "partition_workers" in overrides else "unified"
        plan = parse(f'[cuzk]\nmemory_model = "{model}"\noverrides = {overrides}\n' + MINIMAL, plugin=PLUGIN)
        assert generate(plan.sections["cuzk"], 512 << 30, []).text


@pytest.mark.parametrize("parse_line", ["", 'parse = "cuzk-single"'])
def test_a_bench_done_phase_must_read_its_rate_with_cuzk_bench(parse_line: str) -> None:
    # bench-done carries the bench's rate: a phase that cannot read one would pass and be reported at no
    # rate, and the manager destroys an instance below min_rate. Refused at load, naming the key.
    body = f"""
        [[phases]]
        name = "bench"
        command = ["cuzk-bench"]
        report = "bench-done"
        {parse_line}
        """
    has = "no parse" if not parse_line else "parse = 'cuzk-single'"
    assert parse_error(body, plugin=PLUGIN) == (
        f'test.toml: phases[0] (bench).parse: report = "bench-done" carries the bench\'s rate, read by '
        f'parse = "cuzk-bench" (this phase has {has})')
    assert parse(body.replace(parse_line, "") + '        parse = "cuzk-bench"\n', plugin=PLUGIN).phases[0].parse \
        == "cuzk-bench"


@pytest.mark.parametrize(("listen", "status_listen", "refused"), [
    ("127.0.0.1:9000", "127.0.0.1:9000", True),
    ("http://127.0.0.1:9000", "0.0.0.0:9000", True),  # every address covers loopback
    ("127.0.0.1:9000", "localhost:9000", True),  # localhost is loopback's address
    ("[::]:9000", "[::1]:9000", True),
    ("0.0.0.0:9000", "127.0.0.2:9000", True),  # (listen's probe reaches it on 127.0.0.1; it binds every address)
    ("10.0.0.5:9000", "10.0.0.5:9000", True),  # the daemon's own binds: another address of this machine too
    ("0.0.0.0:9000", "cuzkhost:9000", True),  # (a name may be any address: the status bind resolves it)
    ("0.0.0.0:9000", "10.0.0.5:9000", True),
    ("127.0.0.1:9000", "127.0.0.1:9001", False),
    ("127.0.0.1:9000", "127.0.0.2:9000", False),
    ("0.0.0.0:9000", "[::1]:9000", False),  # every IPv4 address is no IPv6 one
    ("unix:///run/cuzk.sock", "127.0.0.1:9000", False),
    ("127.0.0.1:9000", "", False),  # no status API
])
def test_cuzks_api_and_status_need_two_ports(listen: str, status_listen: str, refused: bool) -> None:
    # One port for both: the daemon's second bind fails, after the parameter fetch.
    body = (f'[cuzk]\nlisten = "{listen}"\nstatus_listen = "{status_listen}"\n'
            '[[phases]]\nname = "a"\ncommand = ["true"]\n')
    if refused:
        assert parse_error(body, plugin=PLUGIN) == (f"test.toml: cuzk.status_listen: {shown(status_listen)} is "
                                                    "listen's port too: the daemon listens on each, so each needs "
                                                    "its own")
    else:
        assert parse(body, plugin=PLUGIN).sections["cuzk"].status_listen == status_listen


def test_the_command_line_hands_in_one_plugin_and_parses_its_run_switches() -> None:
    """cli.py reads run's switches from the Plugin it loads every plan with (they were read from the prover's
    switches module beside it: a switch the Plugin declared otherwise would never reach argparse)."""
    from supervisor.app import cli

    assert cli.plugin() is PLUGIN and cli.run_switches() is PLUGIN.run_switches
    args = cli.build_parser().parse_args(["run", *PLUGIN.run_switches])
    assert [s for s in PLUGIN.run_switches if getattr(args, cli.switch_dest(s))] == list(PLUGIN.run_switches)


def _as_read(body: str, environ: dict[str, str], value: Callable[[Plan], float]) -> float | str:
    """The number a config reads, else how it was refused: "no number" (the text spells none) or "bound"."""
    try:
        return value(parse(body, environ, PLUGIN))
    except ConfigError as exc:
        return "no number" if "not a number" in str(exc) or "must be a number" in str(exc) else "bound"


@pytest.mark.parametrize("text", ["7", "7.", "7.5", " 7.25 ", "007", "-7", "-7.", ".5", "+7", "7..", "nan", "inf",
                                  "1e3", "7_0", "0x7", "\u0667", "1" * 16])
def test_min_rate_and_a_number_from_a_variable_read_one_grammar(text: str) -> None:
    """$MIN_RATE (the prover's) and ``"${G}"`` where a number belongs (the core's) are both text that spells a
    plain decimal: "7." was a rate and no grace, "-7" a grace refused as negative and a rate refused as no number."""
    grace = _as_read('[supervisor]\nstop_grace_s = "${G}"\n' + MINIMAL, {"G": text},
                     lambda plan: plan.supervisor.stop_grace_s)
    rate = _as_read(MINIMAL, {"MIN_RATE": text}, lambda plan: plan.extensions["manager"]["min_rate"])
    assert grace == rate, (grace, rate)


@pytest.mark.parametrize("status_listen", ["tcp://127.0.0.1:9821", "https://127.0.0.1:9821", "ftp://h:1"])
def test_cuzks_status_listen_takes_no_other_scheme(status_listen: str) -> None:
    # Let through, it went into cuzk.toml as a bind cuzk cannot make, and the probe asked http://tcp://…/status.
    body = f'[cuzk]\nstatus_listen = "{status_listen}"\n[[phases]]\nname = "a"\ncommand = ["true"]\n'
    assert parse_error(body, plugin=PLUGIN) == (f"test.toml: cuzk.status_listen: {shown(status_listen)} must be "
                                                "host:port or http://host:port")
    fine = body.replace(status_listen, "http://127.0.0.1:9821")
    assert parse(fine, plugin=PLUGIN).sections["cuzk"].status_listen == "http://127.0.0.1:9821"
