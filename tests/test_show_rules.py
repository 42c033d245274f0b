"""supervisor.text.show, in-process: a value in a line stays one readable line whatever it is (a newline, an escape
code, a lone surrogate, a megabyte, an int of 5000 digits): quoted and escaped (``shown``), bare where it is a
plain word (``bare``, ``logged``), words on one line (``one_line``), a peer's bytes decoded and escaped
(``shown_bytes``), and cut to a length with a mark (``cut``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from supervisor.text.show import CUT_MARK, SHOWN_CHARS, TOO_MANY_DIGITS, cut, logged, one_line, shown, shown_bytes


def test_cut_keeps_what_fits_and_marks_where_it_cut() -> None:
    assert cut("abcdef", 6) == "abcdef"
    assert cut("abcdefg", 6) == "abc..."
    assert cut("abcdefg", 6, "…") == "abcde…"
    assert cut("abcdefg", 3, "") == "abc"


@pytest.mark.parametrize(("value", "quoted"), [
    ("x", "'x'"), (1, "1"), (None, "None"), ([1], "[1]"), (True, "true"), (1.5, "1.5"),
    ("a\nb", "'a\\nb'"), ("\x1b[31m", "'\\x1b[31m'"), ("\udcff", "'\\udcff'"), ("\u202e", "'\\u202e'"),
])
def test_shown_quotes_with_every_character_that_does_not_print_escaped(value: Any, quoted: str) -> None:
    assert shown(value) == quoted
    assert shown(value, ascii_only=True) == quoted


def test_a_config_value_is_shown_as_written_a_peers_answer_in_ascii() -> None:
    assert shown("caf\xe9") == "'caf\xe9'"
    assert shown("caf\xe9", ascii_only=True) == "'caf\\xe9'"


def test_shown_cuts_to_its_length_and_an_int_too_long_to_print_says_so() -> None:
    assert shown("x" * 1000) == "'" + "x" * (SHOWN_CHARS - 1 - len(CUT_MARK)) + CUT_MARK
    assert len(shown("x" * 1000)) == SHOWN_CHARS
    assert len(shown("x" * 1000, 200)) == 200
    assert shown(10 ** 5000) == TOO_MANY_DIGITS


@pytest.mark.parametrize(("name", "named"), [
    ("phases", "phases"), ("/tmp/caf\xe9.toml", "/tmp/caf\xe9.toml"), ("a b", "'a b'"), ("a\nb", "'a\\nb'"),
    ("", "''"), ("\udcff", "'\\udcff'"),
])
def test_a_bare_name_is_shown_as_it_is_only_when_it_is_a_plain_word(name: str, named: str) -> None:
    assert shown(name, bare=True) == named


def test_a_bare_name_is_cut_too() -> None:
    assert shown("k" * 100, 10, bare=True) == "kkkkkkk..."


@pytest.mark.parametrize(("text", "said"), [
    ("exited", "exited"), ("", '""'), ("it's", '"it\'s"'), ("a b", '"a b"'),
    ('say "hi" \\ bye', '"say \\"hi\\" \\\\ bye"'),
    ("a\nb", '"a\\nb"'),  # a newline neither splits the line nor is shown raw
    ("a\x1bb", "a\\x1bb"),  # one word with an escape code: bare, the code escaped
])
def test_logged_is_bare_for_a_word_else_double_quoted_and_always_one_line(text: str, said: str) -> None:
    assert logged(text) == said


def test_one_line_makes_white_space_one_space_and_cuts() -> None:
    assert one_line("  a\n\tb  c ", 100) == "a b c"
    assert one_line(ValueError("x\ny"), 100) == "x y"
    assert one_line("a " * 100, 9, "…") == "a a a a …"
    assert one_line("abcdef", 3, "") == "abc"


@pytest.mark.parametrize(("data", "limit", "line"), [
    (b"service unavailable", 60, "service unavailable"),
    ("h\u00e9llo".encode(), 60, "h\u00e9llo"),  # printable: left as it came
    (b"bad \xff byte", 60, "bad \ufffd byte"),  # decoded leniently
    (b"two\nlines \x1b[31m", 60, "two\\nlines \\x1b[31m"),  # a control escaped: every non-ASCII with it
    (b"x" * 10, 4, "xxxx" + CUT_MARK),  # the first ``limit`` bytes, marked
])
def test_shown_bytes_is_a_peers_answer_as_one_line(data: bytes, limit: int, line: str) -> None:
    assert shown_bytes(data, limit) == line
    assert "\n" not in shown_bytes(data, limit)


def test_a_date_or_time_is_shown_as_iso_8601_as_toml_writes_it() -> None:
    assert shown(datetime.date(1979, 5, 27)) == "1979-05-27"
    assert shown(datetime.time(7, 32)) == "07:32:00"
    assert shown(datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.UTC)) == "1979-05-27T07:32:00+00:00"
