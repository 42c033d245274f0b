"""The dev-manager's ``X-Log-Seq`` reading (supervisor/devmanager/server.py), in-process: each numbered line kept once.

Promises: a push without a well-formed header (``<run>:<source>:<first>-<last>``, 1 <= first <= last) is kept
whole; per uuid, run and source, lines up to the highest number kept are dropped from a push sent again (the
numbered lines are the body's last ones: a note before them came the first time too); what is dropped is
counted.
"""

from __future__ import annotations

from supervisor.devmanager.server import LineSequence


def body(*numbers: int, note: str = "") -> str:
    return note + "".join(f"line {n}\n" for n in numbers)


def test_a_push_without_a_usable_header_is_kept_whole() -> None:
    seq = LineSequence()
    for header in (None, "", "r:s", "r:s:0-3", "r:s:5-3", "r:s:x-2", "r:s:3", "r:s:-1-2"):
        assert seq.keep_new("u", header, "a\nb\n") == "a\nb\n", header
    assert seq.summary() == {"pushes": 8, "numbered": 0, "lines": 0, "duplicate_pushes": 0, "duplicate_lines": 0}
    assert seq.highest == {}


def test_a_push_sent_again_is_kept_once() -> None:
    seq = LineSequence()
    assert seq.keep_new("u", "run1:stdout:1-3", body(1, 2, 3)) == body(1, 2, 3)
    assert seq.keep_new("u", "run1:stdout:1-3", body(1, 2, 3)) == ""
    assert seq.summary() == {"pushes": 2, "numbered": 2, "lines": 6, "duplicate_pushes": 1, "duplicate_lines": 3}


def test_an_overlapping_push_keeps_only_the_lines_past_what_was_seen() -> None:
    seq = LineSequence()
    seq.keep_new("u", "r:s:1-3", body(1, 2, 3))
    assert seq.keep_new("u", "r:s:2-5", body(2, 3, 4, 5)) == body(4, 5)
    assert seq.highest == {("u", "r", "s"): 5}
    assert (seq.duplicate_pushes, seq.duplicate_lines) == (1, 2)


def test_a_note_before_the_numbered_lines_is_not_kept_again() -> None:
    seq = LineSequence()
    note = "[42 lines dropped]\n"
    assert seq.keep_new("u", "r:s:1-2", body(1, 2, note=note)) == body(1, 2, note=note)
    assert seq.keep_new("u", "r:s:2-3", body(2, 3, note=note)) == body(3)


def test_an_older_push_is_dropped_and_the_highest_stays() -> None:
    seq = LineSequence()
    seq.keep_new("u", "r:s:1-5", body(1, 2, 3, 4, 5))
    assert seq.keep_new("u", "r:s:2-3", body(2, 3)) == ""
    assert seq.highest[("u", "r", "s")] == 5
    assert seq.keep_new("u", "r:s:6-6", body(6)) == body(6)


def test_a_gap_is_kept_whole() -> None:
    seq = LineSequence()
    seq.keep_new("u", "r:s:1-3", body(1, 2, 3))
    assert seq.keep_new("u", "r:s:7-8", body(7, 8)) == body(7, 8)  # lines 4-6 lost on the way: nothing to drop
    assert seq.duplicate_pushes == 0 and seq.highest[("u", "r", "s")] == 8


def test_each_uuid_run_and_source_counts_apart() -> None:
    seq = LineSequence()
    seq.keep_new("u", "r:stdout:1-2", body(1, 2))
    assert seq.keep_new("u", "r:stderr:1-2", body(1, 2)) == body(1, 2)
    assert seq.keep_new("u", "r2:stdout:1-2", body(1, 2)) == body(1, 2)
    assert seq.keep_new("v", "r:stdout:1-2", body(1, 2)) == body(1, 2)
    assert seq.duplicate_pushes == 0 and len(seq.highest) == 4


def test_a_run_with_colons_in_it_is_read_from_the_right() -> None:
    seq = LineSequence()
    seq.keep_new("u", "2026-03-01T10:00:00Z:stdout:1-2", body(1, 2))
    assert seq.highest == {("u", "2026-03-01T10:00:00Z", "stdout"): 2}


def test_a_body_without_its_last_newline_gets_one_on_what_is_kept() -> None:
    seq = LineSequence()
    assert seq.keep_new("u", "r:s:1-2", "line 1\nline 2") == "line 1\nline 2"  # kept whole, as sent
    assert seq.keep_new("u", "r:s:2-3", "line 2\nline 3") == "line 3\n"
