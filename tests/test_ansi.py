"""supervisor/text/ansi.py in-process: what counts as one escape sequence, stripping them, keeping only them, and an
escape sequence begun at the end of a read."""

from __future__ import annotations

import pytest

from supervisor.text.ansi import ANSI_RE, UNFINISHED_RE, codes_in, plain, strip_ansi

# What cuzk-daemon's log lines look like (tracing's colours).
CUZK_LINE = b"\x1b[2m2026-03-13T10:00:00Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mcuzk_daemon\x1b[0m\x1b[2m:\x1b[0m ready"


@pytest.mark.parametrize("code", [
    b"\x1b[0m", b"\x1b[1;31m", b"\x1b[38;5;208m", b"\x1b[2K", b"\x1b[?25l", b"\x1b[10;20H",  # CSI
    b"\x1b]0;title\x07", b"\x1b]8;;http://x/\x1b\\",  # OSC, ended by BEL or ST
    b"\x1bM", b"\x1bD", b"\x1b^",  # two-byte escapes (ESC and one of @ to _)
])
def test_each_kind_of_sequence_is_one_match_and_is_stripped_whole(code: bytes) -> None:
    assert ANSI_RE.fullmatch(code)
    assert strip_ansi(b"a" + code + b"b") == b"ab"
    assert codes_in(b"a" + code + b"b") == code


def test_a_coloured_log_line_strips_to_its_text() -> None:
    assert strip_ansi(CUZK_LINE) == b"2026-03-13T10:00:00Z  INFO cuzk_daemon: ready"


def test_codes_in_keeps_every_code_in_order_and_nothing_else() -> None:
    assert codes_in(CUZK_LINE) == b"\x1b[2m\x1b[0m\x1b[32m\x1b[0m\x1b[2m\x1b[0m\x1b[2m\x1b[0m"


def test_bytes_without_an_escape_are_returned_as_they_are() -> None:
    data = b"plain [brackets] and ]closing"
    assert strip_ansi(data) is data
    assert codes_in(data) == b""


def test_a_lone_escape_byte_with_nothing_recognisable_after_it_stays() -> None:
    """Only whole sequences go: a stray ESC before a digit is not a code."""
    assert strip_ansi(b"x\x1b1y") == b"x\x1b1y"


@pytest.mark.parametrize("tail", [b"\x1b", b"\x1b[", b"\x1b[38;5", b"\x1b[?25", b"\x1b]0;title", b"\x1b]8;;x\x1b"])
def test_a_sequence_begun_and_not_finished_at_the_end_is_unfinished(tail: bytes) -> None:
    data = b"text " + tail
    assert UNFINISHED_RE.search(data) and UNFINISHED_RE.search(data).start() == 5  # type: ignore[union-attr]


@pytest.mark.parametrize("data", [b"text", b"text \x1b[0m", b"\x1b]0;t\x07", b"\x1b[1m then text"])
def test_finished_sequences_and_plain_text_are_not_unfinished(data: bytes) -> None:
    assert UNFINISHED_RE.search(data) is None


@pytest.mark.parametrize(("line", "read"), [
    ("\x1b[31mred\x1b[0m", "red"),
    ("x \x1b\x1b[m[2J y", "x \\x1b[2J y"),  # the code taken out glues a lone ESC to "[2J": escaped, not live
    ("a\tb \x9b2J \x08 \u202e ok", "a\tb \\x9b2J \\x08 \\u202e ok"),  # C1 CSI, backspace, right-to-left mark
    ("caf\xe9 \U0001f600", "caf\xe9 \U0001f600"),  # what prints stays
])
def test_plain_leaves_nothing_that_acts_on_a_terminal(line: str, read: str) -> None:
    assert plain(line) == read
