"""The label must be one the manager can match: a derived label (VAST_CONTAINERLABEL, C.$CONTAINER_ID, the
hostname) is ``C.<digits>`` or the config is refused in one line, exit 2, before anything starts; one set
explicitly in ``[manager] label`` is the operator's choice. Without a manager nobody is told the label.

Measured against the real manager: an instance registered under a hostname is marked killed "instance
disappeared from vast" 18 s later, and a give-up can never destroy it.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from helpers import PY, REPO, Runner, clean_env, sh

from supervisor.config import ConfigError, parse_plan

MINIMAL = """
[[phases]]
name = "p"
command = ["true"]
"""
WITH_MANAGER = '[manager]\nurl = "http://127.0.0.1:1235"\n' + MINIMAL


def label(body: str, environ: dict[str, str]) -> str:
    return parse_plan(textwrap.dedent(body), "test.toml", environ, None).manager.label


@pytest.mark.parametrize(("environ", "kept"), [
    ({"VAST_CONTAINERLABEL": "C.32710471"}, "C.32710471"), ({"CONTAINER_ID": "32710471"}, "C.32710471"),
    ({"VAST_CONTAINERLABEL": "C.7", "CONTAINER_ID": "8"}, "C.7"),
])
def test_a_derived_label_of_the_form_c_digits_is_taken(environ: dict[str, str], kept: str) -> None:
    assert label(WITH_MANAGER, environ) == kept


@pytest.mark.parametrize(("environ", "where", "shown"), [
    ({}, "the hostname (no VAST_CONTAINERLABEL or CONTAINER_ID)", None),
    ({"VAST_CONTAINERLABEL": "gpu-box-3"}, "VAST_CONTAINERLABEL (environment)", "'gpu-box-3'"),
    ({"VAST_CONTAINERLABEL": "C.12a"}, "VAST_CONTAINERLABEL (environment)", "'C.12a'"),
    ({"CONTAINER_ID": "abc"}, "CONTAINER_ID (environment)", "'C.abc'"),
])
def test_a_derived_label_the_manager_cannot_match_is_refused(environ: dict[str, str], where: str,
                                                             shown: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        label(WITH_MANAGER, environ)
    message = str(info.value)
    assert message.startswith(f"test.toml: {where}: "), message
    assert "is not a label the manager can match (C.<digits>" in message, message
    assert message.endswith("set VAST_CONTAINERLABEL or CONTAINER_ID, or [manager] label explicitly"), message
    if shown is not None:
        assert shown in message, message


def test_an_explicit_label_is_the_operators_choice() -> None:
    body = '[manager]\nurl = "http://127.0.0.1:1235"\nlabel = "rig-7"\n' + MINIMAL
    assert label(body, {}) == "rig-7"


def test_without_a_manager_any_label_harms_nothing() -> None:
    plan = parse_plan(MINIMAL, "test.toml", {"VAST_CONTAINERLABEL": "gpu-box-3"}, None)  # not refused
    assert plan.manager.url is None


def test_run_refuses_a_hostname_label_in_one_line_and_starts_nothing(sup: Runner) -> None:
    marker = sup.tmp / "ran"
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:1"

        [[phases]]
        name = "p"
        command = {sh(f"touch {marker}")}
        """)
    done = subprocess.run([PY, "-m", "supervisor", "run", "--config", str(config)], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a label the manager can match" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not marker.exists()


@pytest.mark.parametrize(("body", "environ", "where"), [
    (WITH_MANAGER, {"VAST_CONTAINERLABEL": "C.99999999999999999999"}, "VAST_CONTAINERLABEL"),
    (WITH_MANAGER, {"CONTAINER_ID": "9223372036854775808"}, "CONTAINER_ID"),
    ('[manager]\nurl = "http://127.0.0.1:1235"\nlabel = "C.99999999999999999999"\n' + MINIMAL, {}, "manager.label"),
])
def test_a_label_whose_id_overflows_the_managers_integer_is_refused(body: str, environ: dict[str, str],
                                                                   where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        label(body, environ)
    message = str(caught.value)
    named = message.partition(" (environment)")[0].partition(": '")[0]  # the part before the value
    assert where in named and "does not fit the manager's 64-bit integer" in message, message
    assert str(2**63 - 1) in message, message


def test_the_largest_id_the_manager_can_hold_is_taken() -> None:
    assert label(WITH_MANAGER, {"VAST_CONTAINERLABEL": f"C.{2**63 - 1}"}) == f"C.{2**63 - 1}"
