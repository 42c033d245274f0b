"""Config refusals a person can act on: the phase (and daemon) named by its name as well as its place, a key
put in the wrong table told the table it belongs in, and a number echoed as it was written (not ``6e+08``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_plan, parse_plan

FIRST = '[[phases]]\nname = "fetch"\ncommand = ["true"]\n'
BENCH = '[[phases]]\nname = "bench"\nkind = "service"\ncommand = ["true"]\n'
DAEMON = '[[phases.daemons]]\nname = "cuzk"\ncommand = ["true"]\n'


def refused(text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_plan(text, "t.toml", environ or {})
    return str(caught.value)


def test_a_phase_key_refused_names_the_phase() -> None:
    assert refused(FIRST + BENCH + 'restart = "sometimes"\n') == (
        "t.toml: phases[1] (bench).restart: must be one of 'no', 'on-failure', 'always', got 'sometimes'")


def test_a_daemon_key_refused_names_the_phase_and_the_daemon() -> None:
    assert refused(FIRST + BENCH + DAEMON + 'ready = "ftp://x"\n').startswith(
        "t.toml: phases[1] (bench).daemons[0] (cuzk).ready: 'ftp://x' must be tcp://host:port")


def test_an_unset_variable_in_a_phase_names_the_phase() -> None:
    assert refused(FIRST + BENCH + 'cwd = "${NOPE}"\n').startswith("t.toml: phases[1] (bench).cwd: ${NOPE} is not set")


def test_a_phase_without_a_valid_name_is_named_by_its_place_alone() -> None:
    assert refused(FIRST + '[[phases]]\nname = "a b"\ncommand = ["true"]\n').startswith("t.toml: phases[1].name: ")
    assert refused(FIRST + '[[phases]]\ncommand = ["true"]\n') == "t.toml: phases[1].name: required key is missing"


def test_rules_between_phases_name_the_phase() -> None:
    assert refused(FIRST + FIRST) == "t.toml: phases[1] (fetch).name: duplicate phase name 'fetch'"
    assert refused(FIRST + BENCH + 'report = "param-done"\n') == (
        "t.toml: phases[1] (bench).report: 'param-done' is reported when a oneshot completes")


@pytest.mark.parametrize(("text", "said"), [
    (FIRST + BENCH + DAEMON + 'restart = "always"\n',
     "phases[1] (bench).daemons[0] (cuzk).restart: unknown key (it is a phase key: put it under [[phases]])"),
    ("[supervisor]\nretries = 2\n" + FIRST,
     "supervisor.retries: unknown key (it is a phase key: put it under [[phases]])"),
    (FIRST + 'state_dir = "/tmp/s"\n',
     "phases[0] (fetch).state_dir: unknown key (it is a [supervisor] key: put it under [supervisor])"),
    (FIRST + 'lifetime = "phase"\n',
     "phases[0] (fetch).lifetime: unknown key (it is a daemon key: put it under [[phases.daemons]])"),
    (FIRST + 'url = "http://127.0.0.1:1"\n',
     "phases[0] (fetch).url: unknown key (it is a [manager] key: put it under [manager])"),
    ("[manager]\nstop_grace_s = 3\n" + FIRST,
     "manager.stop_grace_s: unknown key (it is a [supervisor] key: put it under [supervisor])"),
    ('restart = "always"\n' + FIRST, "restart: unknown top-level key (it is a phase key: put it under [[phases]])"),
    (FIRST + "retrys = 1\n", "phases[0] (fetch).retrys: unknown key (did you mean 'retries'?)"),
], ids=["phase-key-on-daemon", "phase-key-in-supervisor", "supervisor-key-on-phase", "daemon-key-on-phase",
        "manager-key-on-phase", "supervisor-key-in-manager", "phase-key-at-top", "typo-still-near"])
def test_a_key_in_the_wrong_table_is_told_where_it_belongs(text: str, said: str) -> None:
    assert refused(text) == f"t.toml: {said}"


def test_a_ready_on_a_oneshot_says_a_daemon_takes_it() -> None:
    message = refused(FIRST + 'ready = "tcp://127.0.0.1:1"\n')
    assert message.startswith('t.toml: phases[0] (fetch).ready: only for kind = "service" or a daemon'), message
    assert "[[phases.daemons]]" in message


@pytest.mark.parametrize(("line", "environ", "shown"), [
    ("timeout_s = 600000000", {}, "got 600000000"),
    ("timeout_s = 6e8", {}, "got 600000000"),
    ("timeout_s = 1e300", {}, "got 1e+300"),
    ("timeout_s = -2.5", {}, "got -2.5"),
    ('progress_total = 1\nprogress_deadline_s = "${DEADLINE}"', {"DEADLINE": "600000000"},
     "got 600000000 (from $DEADLINE)"),
], ids=["int", "float-exponent", "float-huge", "float-fraction", "from-the-environment"])
def test_a_number_refused_is_echoed_as_written(line: str, environ: dict[str, str], shown: str) -> None:
    message = refused(FIRST + line + "\n", environ)
    assert message.endswith(shown), message
    assert "e+08" not in message


def test_a_backoff_order_is_told_in_the_numbers_written() -> None:
    assert refused(BENCH + "backoff_s = 600000\nbackoff_max_s = 5\n") == (
        "t.toml: phases[0] (bench).backoff_max_s: 5 is below backoff_s 600000")


def test_a_key_read_whole_from_a_variable_is_noted_with_it() -> None:
    plan = parse_plan('[supervisor]\nrequire_gpus = "${GPUS:-true}"\nstate_dir = "/s/${X:-a}"\n' + FIRST
                      + 'progress_total = "${TOTAL}"\nstall_s = 1\nprogress_path = "/p"\n', "t.toml", {"TOTAL": "9"})
    assert dict(plan.env_keys) == {"supervisor.require_gpus": "GPUS", "phases[0] (fetch).progress_total": "TOTAL"}


def test_a_phase_named_from_a_variable_keeps_the_hint_of_its_keys() -> None:
    # The places were noted by the name as written ("${N:-a}", no valid name: "phases[0]"), the refusal named
    # them by the name it gives ("phases[0] (a)"): the "(from $VAR)" the docs promise was lost.
    body = ('[[phases]]\nname = "${N:-a}"\ncommand = ["true"]\nretries = "${R:--1}"\n'
            '[[phases.daemons]]\nname = "${D:-d}"\ncommand = ["true"]\n')
    assert refused(body) == "t.toml: phases[0] (a).retries: must be >= 0, got -1 (from $R)"
    assert refused(body, {"N": "b"}) == "t.toml: phases[0] (b).retries: must be >= 0, got -1 (from $R)"
    daemon = body.replace('retries = "${R:--1}"', 'kind = "service"') + 'ready = "/r"\nready_timeout_s = "${T:-0}"\n'
    assert refused(daemon) == "t.toml: phases[0] (a).daemons[0] (d).ready_timeout_s: must be > 0 seconds, got 0 " \
        "(from $T)"
    plan = parse_plan(body.replace("-1", "2"), "t.toml", {"N": "b"})
    assert dict(plan.env_keys) == {"phases[0] (b).name": "N", "phases[0] (b).retries": "R",
                                   "phases[0] (b).daemons[0] (d).name": "D"}
    # A name that cannot be expanded is refused at its plain place, as before.
    assert refused('[[phases]]\nname = "${N}"\ncommand = ["true"]\n') == (
        "t.toml: phases[0].name: ${N} is not set in the environment (give a default: ${N:-…})")


def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a BOM: TOML's parser called it "Invalid statement (at line 1, column 1)"
    of a line that read `[supervisor]`."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + FIRST.encode())
    assert [p.name for p in load_plan(path).phases] == ["fetch"]
    path.write_bytes(b"\xef\xbb\xbf" + FIRST.encode() + b"retries = -1\n")
    with pytest.raises(ConfigError) as caught:
        load_plan(path)
    assert "phases[0] (fetch).retries" in str(caught.value), str(caught.value)


@pytest.mark.parametrize(("written_as", "said"), [
    ("1979-05-27T07:32:00Z", "1979-05-27T07:32:00+00:00"), ("1979-05-27", "1979-05-27"), ("07:32:00", "07:32:00"),
])
def test_a_toml_date_or_time_where_none_belongs_is_echoed_as_a_date_not_as_python_code(written_as: str,
                                                                                      said: str) -> None:
    assert refused(FIRST + f"stop_grace_s = {written_as}\n") == (
        f"t.toml: phases[0] (fetch).stop_grace_s: must be a number, got {said}")
    assert refused(f'[[phases]]\nname = "fetch"\ncommand = ["true", {written_as}]\n') == (
        f"t.toml: phases[0] (fetch).command[1]: must be a string, got {said}")


def test_retry_while_progressing_needs_what_measures_and_what_bounds_it() -> None:
    said = ("t.toml: phases[0] (fetch).retry_while_progressing: needs a oneshot with progress_total (what an "
            "attempt got is measured by) and timeout_s (what bounds the attempts not counted)")
    assert refused(FIRST + "retry_while_progressing = true\n") == said
    assert refused(FIRST + 'retry_while_progressing = true\nprogress_total = "1GiB"\n') == said
    parse_plan(FIRST + 'retry_while_progressing = true\nprogress_total = "1GiB"\ntimeout_s = 60\n', "t.toml", {})
