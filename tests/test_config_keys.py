"""config/keys.py and the value checkers a Key is made of, in-process: ``take`` refuses unknown keys with a hint
and missing required ones, fills defaults, checks each value under its full dotted name; each checker refuses a
wrong type or an out-of-range value in one line naming the key and the value."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.config import ConfigError, Key, take
from supervisor.config.values import (
    EnvText,
    check_bool,
    check_number,
    check_seconds,
    check_size,
    join_key,
    one_of,
    parse_signal,
    whole_number,
)
from supervisor.text.show import shown

RETRY_KEYS = {"retries": Key(whole_number(0, 5), 0), "name": Key(one_of("a", "b"), "a")}


def refused(check: Any, *args: Any) -> str:
    with pytest.raises(ConfigError) as info:
        check(*args)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------- take


def test_an_unknown_key_close_to_a_known_one_is_refused_with_a_hint() -> None:
    assert refused(take, {"retires": 1}, "phases[1]", RETRY_KEYS) == \
        "phases[1].retires: unknown key (did you mean 'retries'?)"


def test_an_unknown_key_like_none_is_refused_without_a_hint() -> None:
    assert refused(take, {"zzzz": 1}, "phases[1]", RETRY_KEYS) == "phases[1].zzzz: unknown key"


def test_a_missing_required_key_is_named() -> None:
    keys = {"command": Key(one_of("x"), required=True)}
    assert refused(take, {}, "phases[0]", keys) == "phases[0].command: required key is missing"


def test_a_table_that_is_not_a_table_is_refused() -> None:
    assert refused(take, [], "supervisor", RETRY_KEYS) == "supervisor: must be a table, got []"


def test_absent_keys_take_their_defaults_and_present_ones_their_checked_value() -> None:
    assert take({"retries": 2}, "", RETRY_KEYS) == {"retries": 2, "name": "a"}
    assert take({}, "x", RETRY_KEYS) == {"retries": 0, "name": "a"}


def test_a_value_is_checked_under_its_full_dotted_name() -> None:
    assert refused(take, {"retries": 9}, "phases[1]", RETRY_KEYS) == "phases[1].retries: must be at most 5, got 9"


def test_every_key_is_checked_even_when_the_first_is_fine() -> None:
    assert refused(take, {"retries": 1, "name": "c"}, "p", RETRY_KEYS) == "p.name: must be one of 'a', 'b', got 'c'"


def test_an_unknown_key_is_said_before_a_bad_value() -> None:
    """A typo is the likelier mistake: it is what the user hears first."""
    assert "unknown key" in refused(take, {"retries": 99, "nmae": "a"}, "p", RETRY_KEYS)


def test_take_hands_back_only_declared_keys() -> None:
    assert set(take({"retries": 1}, "p", RETRY_KEYS)) == set(RETRY_KEYS)


@pytest.mark.parametrize(("where", "key", "joined"), [
    ("", "a", "a"),
    ("phases[1]", "a", "phases[1].a"),
    ("x", "a b", "x.'a b'"),  # a key TOML would need quoted is shown quoted
])
def test_join_key(where: str, key: str, joined: str) -> None:
    assert join_key(where, key) == joined


# ---------------------------------------------------------------- checkers


@pytest.mark.parametrize(("value", "said"), [
    (True, "k: must be a whole number, got true"),  # a bool is no number, though Python says it is an int
    (2.0, "k: must be a whole number written as one (no point, no exponent), got 2.0"),
    (1e3, "k: must be a whole number written as one (no point, no exponent), got 1000.0"),
    ("3", "k: must be a whole number, got '3' (text: write it without quotes)"),
    ("x", "k: must be a whole number, got 'x'"),
    (-1, "k: must be >= 0, got -1"),
    (6, "k: must be at most 5, got 6"),
])
def test_whole_number_refuses(value: Any, said: str) -> None:
    assert refused(whole_number(0, 5), value, "k") == said


@pytest.mark.parametrize("value", [0, 3, 5])
def test_whole_number_takes_its_bounds_and_between(value: int) -> None:
    assert whole_number(0, 5)(value, "k") == value


def test_one_of_names_every_choice() -> None:
    assert one_of("a", "b")("a", "k") == "a"
    assert refused(one_of("a", "b"), "c", "k") == "k: must be one of 'a', 'b', got 'c'"
    assert refused(one_of("a", "b"), 1, "k") == "k: must be one of 'a', 'b', got 1"


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_check_bool_takes_only_a_toml_boolean(value: Any) -> None:
    assert refused(check_bool, value, "k") == f"k: must be true or false, got {shown(value)}"


def test_check_bool_tells_quoted_true_to_lose_its_quotes() -> None:
    assert refused(check_bool, "true", "k") == "k: must be true or false, got 'true' (text: write it without quotes)"


def test_check_bool_takes_true_and_false() -> None:
    assert check_bool(True, "k") is True and check_bool(False, "k") is False


@pytest.mark.parametrize(("value", "size"), [("1GiB", 1 << 30), ("512MiB", 512 << 20), (5, 5), ("64M", 64 << 20)])
def test_check_size_takes_sizes_and_bytes(value: Any, size: int) -> None:
    assert check_size(value, "k") == size


@pytest.mark.parametrize(("value", "said"), [
    ("-1", "k: '-1' is negative"),
    ("2EiB", "k: '2EiB' is not a size (e.g. \"128GiB\", \"512MiB\")"),
    ("2PiB", "k: '2PiB' is more than the 1PiB a size may be"),
    ("1.5", "k: '1.5' is not a whole number of bytes (a bare number is bytes: did you mean \"1.5GiB\"?)"),
])
def test_check_size_refuses_in_one_line_naming_the_key(value: Any, said: str) -> None:
    assert refused(check_size, value, "k") == said


@pytest.mark.parametrize(("value", "said"), [
    (float("nan"), "k: must be a finite number, got nan"),
    (float("inf"), "k: must be a finite number, got inf"),
    ("5", "k: must be a number, got '5' (text: write it without quotes)"),
    (True, "k: must be a number, got true"),
    (-1, "k: must be >= 0 seconds, got -1"),
])
def test_check_seconds_refuses(value: Any, said: str) -> None:
    assert refused(check_seconds, value, "k") == said


def test_check_seconds_takes_zero_and_fractions() -> None:
    assert check_seconds(0, "k") == 0.0 and check_seconds(0.25, "k") == 0.25


def test_check_number_wants_a_number_not_its_text() -> None:
    assert check_number(1.5, "k") == 1.5
    assert refused(check_number, "1.5", "k") == "k: must be a number, got '1.5' (text: write it without quotes)"
    assert refused(check_number, "1.5s", "k") == "k: must be a number, got '1.5s'"


@pytest.mark.parametrize(("text", "number"), [("30", 30.0), (" 1.5 ", 1.5), ("-1", -1.0)])
def test_text_from_the_environment_is_the_number_it_spells(text: str, number: float) -> None:
    # The environment holds only text: "${GRACE_S:-30}" is 30 wherever a number belongs.
    assert check_number(EnvText(text), "k") == number


def test_text_from_the_environment_is_the_boolean_or_whole_number_it_spells() -> None:
    assert check_bool(EnvText(" True "), "k") is True and check_bool(EnvText("false"), "k") is False
    assert whole_number(0, 5)(EnvText("3"), "k") == 3
    assert refused(whole_number(0, 5), EnvText("-1"), "k") == "k: must be >= 0, got -1"
    assert refused(whole_number(0, 5), EnvText("2.0"), "k") == "k: must be a whole number, got '2.0'"
    assert refused(check_number, EnvText("30s"), "k") == "k: must be a number, got '30s'"
    assert refused(check_bool, EnvText("yes"), "k") == "k: must be true or false, got 'yes'"


@pytest.mark.parametrize(("value", "signum"), [("SIGTERM", 15), ("term", 15), ("SIGINT", 2), (9, 9)])
def test_parse_signal_takes_names_in_any_case_and_numbers(value: Any, signum: int) -> None:
    assert parse_signal(value) == signum


def test_parse_signal_takes_a_number_from_the_environment() -> None:
    assert parse_signal(EnvText("15"), "k") == 15 and parse_signal(EnvText("term"), "k") == 15
    assert refused(parse_signal, "15", "k") == "k: '15' is not a signal name (e.g. \"SIGTERM\", \"SIGINT\")"


def test_parse_signal_refuses_an_unknown_name_and_signal_zero() -> None:
    assert refused(parse_signal, "SIGNOPE") == "signal: 'SIGNOPE' is not a signal name (e.g. \"SIGTERM\", \"SIGINT\")"
    assert refused(parse_signal, 0) == "signal: 0 is not a signal number"


@pytest.mark.parametrize(("value", "quoted"), [(1, "1"), ("x", "'x'"), ([1], "[1]"), (None, "None"), (True, "true")])
def test_describe_shows_a_value_as_the_error_quotes_it(value: Any, quoted: str) -> None:
    assert shown(value) == quoted
