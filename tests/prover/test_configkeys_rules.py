"""The prover's config keys (prover/configkeys.py) as the loader applies them, in-process.

tests/prover/test_config_prover.py covers the profile, $MIN_RATE's syntax, the override tables' main cases
and the defaults; these cover the rest of what the module promises: the file's min_rate wins over $MIN_RATE
(even 0, even with an unreadable $MIN_RATE), a negative rate is refused, the give-up's two names agreeing, the
cuzk.toml path from state_dir, an unknown [cuzk] key's "did you mean", the overrides' own one-line errors, the
daemon's addresses (checked whichever phase uses [cuzk], shown cut, never moved by the overrides), and a kind that
needs [cuzk] when the plan has none.
"""

from __future__ import annotations

import pytest

from supervisor.config import ConfigError, Plan, parse_plan
from supervisor.prover.configkeys import DEFAULT_MIN_RATE, check_rate, cuzk_settings
from supervisor.prover.cuzkconf import CuzkSettings
from supervisor.prover.plugin import PLUGIN
from supervisor.text.show import shown

PHASES = '[[phases]]\nname = "p"\ncommand = ["true"]\n'


def plan(body: str, environ: dict[str, str] | None = None) -> Plan:
    return parse_plan(body + PHASES, "t.toml", environ or {}, PLUGIN)


def refusal(body: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        plan(body, environ)
    return str(caught.value)


def fleet(body: str, environ: dict[str, str] | None = None) -> dict[str, object]:
    return dict(plan(body, environ).extensions["manager"])


def test_the_files_min_rate_wins_over_the_environment() -> None:
    assert fleet("[manager]\nmin_rate = 3\n", {"MIN_RATE": "9"})["min_rate"] == 3.0
    # 0 is the file's, and the manager reads it as 50 (shared/domain/manager-api.md): so do we.
    assert fleet("[manager]\nmin_rate = 0\n", {"MIN_RATE": "9"})["min_rate"] == DEFAULT_MIN_RATE
    # $MIN_RATE is not read at all when the file says: an unreadable one is no error then.
    assert fleet("[manager]\nmin_rate = 3\n", {"MIN_RATE": "abc"})["min_rate"] == 3.0


def test_min_rate_from_an_empty_or_zero_environment() -> None:
    assert fleet("", {"MIN_RATE": ""})["min_rate"] == DEFAULT_MIN_RATE
    assert fleet("", {"MIN_RATE": "0"})["min_rate"] == DEFAULT_MIN_RATE  # the manager's 50
    assert fleet("", {"MIN_RATE": "7."})["min_rate"] == 7.0


def test_a_negative_min_rate_is_refused_in_one_line() -> None:
    assert refusal("[manager]\nmin_rate = -1\n") == "t.toml: manager.min_rate: must be >= 0 proofs/hour, got -1"
    with pytest.raises(ConfigError, match=r"^here: must be >= 0 proofs/hour, got -0\.5$"):
        check_rate(-0.5, "here")
    assert check_rate(0, "here") == 0


def test_the_give_ups_two_names_may_both_be_set_alike() -> None:
    assert fleet("[manager]\nreport_bench_failure = true\ngive_up_on_failure = true\n")["give_up_on_failure"] is True
    assert fleet("[manager]\nreport_bench_failure = false\ngive_up_on_failure = false\n")["give_up_on_failure"] is False
    assert fleet("[manager]\ngive_up_on_failure = false\n")["give_up_on_failure"] is False
    assert "report_bench_failure" not in fleet("[manager]\nreport_bench_failure = true\n")


def test_cuzk_toml_goes_in_state_dir_unless_config_path_says_where() -> None:
    assert plan('[supervisor]\nstate_dir = "/srv/state"\n[cuzk]\n').sections["cuzk"].config_path == \
        "/srv/state/cuzk.toml"
    assert plan('[cuzk]\nconfig_path = "/etc/cuzk.toml"\n').sections["cuzk"].config_path == "/etc/cuzk.toml"


def test_status_listen_may_be_empty_but_listen_may_not() -> None:
    assert plan('[cuzk]\nstatus_listen = ""\n').sections["cuzk"].status_listen == ""
    assert refusal('[cuzk]\nlisten = ""\n') == "t.toml: cuzk.listen: must be a non-empty string, got ''"


def test_an_unknown_cuzk_key_gets_a_did_you_mean() -> None:
    assert refusal("[cuzk]\nbench_concurency = 2\n") == \
        "t.toml: cuzk.bench_concurency: unknown key (did you mean 'bench_concurrency'?)"


def test_bench_concurrency_is_bounded() -> None:
    assert refusal("[cuzk]\nbench_concurrency = 0\n").startswith("t.toml: cuzk.bench_concurrency: ")
    assert refusal("[cuzk]\nbench_concurrency = 1025\n") == \
        "t.toml: cuzk.bench_concurrency: must be at most 1024, got 1025"
    assert plan("[cuzk]\nbench_concurrency = 1024\n").sections["cuzk"].bench_concurrency == 1024


def test_the_overrides_errors_name_the_key_inside_them() -> None:
    assert refusal("[cuzk]\noverrides = { memory = { total_budget = 100 } }\n") == \
        't.toml: cuzk.overrides.memory.total_budget: must be "auto" or a size like "100GiB", got 100'
    assert refusal("[cuzk]\noverrides = { synthesis = { partition_workers = 0 } }\n") == \
        "t.toml: cuzk.overrides.synthesis.partition_workers: must be >= 1, got 0"
    assert refusal("[cuzk]\noverrides = { memory = 3 }\n") == "t.toml: cuzk.overrides.memory: must be a table, got 3"
    assert refusal("[cuzk]\noverrides = 3\n").startswith("t.toml: cuzk.overrides: must be a table")


def test_the_daemons_addresses_cannot_be_overridden() -> None:
    """[cuzk.overrides.daemon] listen changed cuzk.toml alone: the ready probe, CUZK_ADDR and the production watch
    kept [cuzk]'s, so the daemon was never seen ready. Refused, naming the key to set instead."""
    assert refusal('[cuzk.overrides.daemon]\nlisten = "127.0.0.1:7777"\n') == \
        "t.toml: cuzk.overrides.daemon.listen: set [cuzk] listen instead (the ready probe and CUZK_ADDR read " \
        "that one, not cuzk.toml's)"
    assert refusal('[cuzk.overrides.daemon]\nstatus_listen = "127.0.0.1:7778"\n') == \
        "t.toml: cuzk.overrides.daemon.status_listen: set [cuzk] status_listen instead (the ready probe, " \
        "CUZK_STATUS_LISTEN and the production watch read that one, not cuzk.toml's)"
    # A daemon that is no table would replace [daemon] whole, addresses and all.
    assert refusal('[cuzk]\noverrides = { daemon = "x" }\n') == \
        "t.toml: cuzk.overrides.daemon: must be a table, got 'x'"
    assert plan("[cuzk.overrides.daemon]\nworkers = 2\n").sections["cuzk"].overrides == {"daemon": {"workers": 2}}


LISTEN_FORMS = "must be unix:///path, IP:port or http://IP:port (cuzk-daemon binds an IP address, not a host name)"


@pytest.mark.parametrize(("key", "value", "said"), [
    ("listen", "garbage", LISTEN_FORMS),
    ("listen", "unix://relative.sock", "must name an absolute socket path (unix:///path)"),
    ("listen", "127.0.0.1:0", LISTEN_FORMS),
    ("listen", "a b:9820", LISTEN_FORMS),  # (the ready probe's rule)
    # cuzk-daemon binds a Rust SocketAddr: a host name, or a scheme it does not speak, ends it at start.
    ("listen", "localhost:9820", LISTEN_FORMS),
    ("listen", "http://localhost:9820", LISTEN_FORMS),
    ("listen", "https://127.0.0.1:9820", LISTEN_FORMS),
    ("listen", "tcp://127.0.0.1:9820", LISTEN_FORMS),
    ("listen", "::1:9820", LISTEN_FORMS),
    # (Rust's SocketAddrV6 takes a scope id in ASCII digits only: "²" is a digit to Python alone)
    ("listen", "[fe80::1%eth0]:9820", LISTEN_FORMS),
    ("listen", "[fe80::1%\u00b2]:9820", LISTEN_FORMS),
    ("status_listen", "127.0.0.1:9821/x", "must be host:port"),
    ("status_listen", "127.0.0.1:99999", "must be host:port"),
    ("status_listen", "nowhere", "must be host:port"),
    ("status_listen", "  ", "must be host:port"),
])
def test_the_addresses_are_checked_whichever_phase_uses_cuzk(key: str, value: str, said: str) -> None:
    """Only a ready = "cuzk" daemon read them: with prepare = "cuzk-config" alone (or no phase using [cuzk]),
    listen = "garbage" passed `check` and went into cuzk.toml and CUZK_ADDR."""
    prepared = '[[phases]]\nname = "q"\ncommand = ["true"]\nprepare = "cuzk-config"\n'
    assert refusal(f'[cuzk]\n{key} = "{value}"\n' + prepared) == f"t.toml: cuzk.{key}: {value!r} {said}"
    assert refusal(f'[cuzk]\n{key} = "{value}"\n') == f"t.toml: cuzk.{key}: {value!r} {said}"


def test_every_address_the_probe_reads_passes() -> None:
    for listen in ("unix:///run/cuzk.sock", "http://127.0.0.1:9820", "0.0.0.0:9900", "http://[::1]:9820",
                   "127.0.0.1:9820", "[::]:9820", "[fe80::1%2]:9820"):
        assert plan(f'[cuzk]\nlisten = "{listen}"\n').sections["cuzk"].listen == listen
    for status in ("127.0.0.1:9821", "http://localhost:9821/", ""):
        assert plan(f'[cuzk]\nstatus_listen = "{status}"\n').sections["cuzk"].status_listen == status


def test_a_unix_socket_path_longer_than_any_socket_can_have_is_refused() -> None:
    """The kernel binds no unix socket path over 107 bytes: the daemon could never listen, and its ready probe
    waited out its timeout (state_dir's socket has the same check)."""
    path = "/tmp/" + "a" * 100 + ".sock"
    assert refusal(f'[cuzk]\nlisten = "unix://{path}"\n') == f"t.toml: cuzk.listen: {shown('unix://' + path)} names " \
        "a socket path of more than 107 bytes, which no unix socket can have (the daemon could never bind it)"
    fits = "/tmp/" + "a" * 97 + ".sock"  # (107 bytes)
    assert plan(f'[cuzk]\nlisten = "unix://{fits}"\n').sections["cuzk"].listen == f"unix://{fits}"


def test_a_huge_address_is_shown_cut() -> None:
    huge = "x" * 100_000
    assert refusal(f'[cuzk]\nlisten = "{huge}"\n') == \
        f"t.toml: cuzk.listen: {shown(huge)} {LISTEN_FORMS}"
    assert refusal(f'[cuzk]\nstatus_listen = "{huge}"\n') == \
        f"t.toml: cuzk.status_listen: {shown(huge)} must be host:port"


def test_overrides_outside_what_generate_reads_pass_as_given() -> None:
    taken = plan('[cuzk]\noverrides = { gpus = { devices = [0, 1] }, logging = { level = "debug" } }\n')
    assert taken.sections["cuzk"].overrides == {"gpus": {"devices": [0, 1]}, "logging": {"level": "debug"}}


def test_a_kind_that_needs_cuzk_says_so_where_it_is_used() -> None:
    with pytest.raises(ConfigError, match=r'^phases\[0\]\.ready: "cuzk" needs a \[cuzk\] table \(it may be empty\)$'):
        cuzk_settings({}, "cuzk", "phases[0].ready")
    with pytest.raises(ConfigError, match=r'^"cuzk-config" needs a \[cuzk\] table'):
        cuzk_settings({}, "cuzk-config")
    settings = CuzkSettings(config_path="/x/cuzk.toml")
    assert cuzk_settings({"cuzk": settings}, "cuzk") is settings
