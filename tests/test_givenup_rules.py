"""supervisor.state.givenup on a real state_dir: the marker remembered and recalled (its reason tidied and bounded), a
marker that cannot be read still meaning given up (spoilt JSON, wrong shape, a directory, a dangling link, a file
far too big), the refusal line, and ``--fresh``'s start_over (the marker gone, the outbox and its SQLite journal
set aside under the same suffix; nothing done where nothing was given up)."""

from __future__ import annotations

import calendar
import json
import os
import re
import stat
import time
from pathlib import Path

import pytest

from supervisor.state import files as state_files
from supervisor.state import givenup
from supervisor.state.givenup import MARKER_MAX_BYTES, REASON_MAX_CHARS, SET_ASIDE_SUFFIX, GivenUp


def test_nothing_given_up_recalls_none(tmp_path: Path) -> None:
    assert givenup.recall(tmp_path) is None


def test_a_remembered_give_up_is_recalled_with_its_time_and_reason(tmp_path: Path) -> None:
    before = time.time()
    kept = givenup.remember(tmp_path, "bench-done rate=0: below min_rate")
    after = time.time()
    assert before <= kept.at <= after
    assert givenup.recall(tmp_path) == kept == GivenUp(kept.at, "bench-done rate=0: below min_rate")
    marker = state_files.path(tmp_path, state_files.GIVEN_UP)
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600
    assert json.loads(marker.read_text()) == {"at": kept.at, "reason": kept.reason, "call": None}


def test_the_reason_is_one_line_and_bounded(tmp_path: Path) -> None:
    """A plugin's words may be a manager's multi-line answer: kept as one line, cut at REASON_MAX_CHARS."""
    kept = givenup.remember(tmp_path, "passed:\n  false\t(manager)  " + "x" * 1000)
    assert kept.reason.startswith("passed: false (manager) x")
    assert len(kept.reason) == REASON_MAX_CHARS and "\n" not in kept.reason
    assert givenup.recall(tmp_path) == kept


def test_a_later_give_up_replaces_the_first(tmp_path: Path) -> None:
    givenup.remember(tmp_path, "first")
    second = givenup.remember(tmp_path, "second")
    assert givenup.recall(tmp_path) == second


def test_a_marker_written_by_hand_with_a_long_reason_is_cut_on_recall(tmp_path: Path) -> None:
    givenup.marker(tmp_path).write_text(json.dumps({"at": 5, "reason": "y" * 2000}))
    recalled = givenup.recall(tmp_path)
    assert recalled == GivenUp(5.0, "y" * REASON_MAX_CHARS, names_its_call=False)  # (no "call": an older one's)


@pytest.mark.parametrize(("content", "error"), [
    ("{not json", "JSONDecodeError"),
    ('["at", "reason"]', "TypeError"),
    ('{"at": 1}', "KeyError"),
    ('{"at": "yesterday", "reason": "r"}', "ValueError"),
    # times no clock can show: time.localtime raised on them, and the run died with a traceback at every start
    ('{"at": NaN, "reason": "r"}', "ValueError"), ('{"at": "nan", "reason": "r"}', "ValueError"),
    ('{"at": Infinity, "reason": "r"}', "ValueError"), ('{"at": 1e300, "reason": "r"}', "ValueError"),
    ('{"at": -1e300, "reason": "r"}', "ValueError"),
    ("\udcff", "UnicodeDecodeError"),
    ("[" * 5000 + "]" * 5000, "RecursionError"),
])
def test_a_spoilt_marker_still_means_given_up(tmp_path: Path, content: str, error: str) -> None:
    """Starting the lifecycle again is the harm the marker guards against: unreadable is not "not given up"."""
    marker = givenup.marker(tmp_path)
    marker.write_bytes(content.encode("utf-8", "surrogateescape"))
    os.utime(marker, (1_700_000_000, 1_700_000_000))
    recalled = givenup.recall(tmp_path)
    assert recalled == GivenUp(1_700_000_000.0, f"its record {marker} is unreadable: {error}")
    assert recalled.refusal().startswith("this instance was given up at "), recalled


def test_a_marker_too_big_to_be_ours_still_means_given_up(tmp_path: Path) -> None:
    givenup.marker(tmp_path).write_bytes(b" " * (MARKER_MAX_BYTES + 1))
    recalled = givenup.recall(tmp_path)
    assert recalled is not None and recalled.reason.endswith("is unreadable: ValueError")


def test_a_directory_or_a_dangling_link_at_the_marker_still_means_given_up(tmp_path: Path) -> None:
    givenup.marker(tmp_path).mkdir()
    recalled = givenup.recall(tmp_path)
    assert recalled is not None and recalled.reason.endswith("is unreadable: ValueError")
    givenup.marker(tmp_path).rmdir()
    givenup.marker(tmp_path).symlink_to(tmp_path / "nowhere")
    recalled = givenup.recall(tmp_path)
    assert recalled is not None and recalled.reason.endswith("is unreadable: FileNotFoundError")


def test_the_refusal_names_when_why_and_the_way_out() -> None:
    at = time.mktime((2026, 3, 4, 5, 6, 7, 0, 0, -1))
    line = GivenUp(at, "bench rate below min_rate").refusal()
    assert line == ("this instance was given up at 2026-03-04 05:06:07 (bench rate below min_rate); not running it "
                    "again: start with --fresh or a new state_dir")


def test_a_refused_starts_reason_keeps_when_and_why_it_was_given_up() -> None:
    at = float(calendar.timegm((2026, 3, 4, 5, 6, 7)))
    why = GivenUp(at, "phase warmup failed: exit_code").why_refused(at + 7500)
    assert why == ("this instance was given up by an earlier start, 2h05m before this one (2026-03-04 05:06:07 UTC): "
                   "phase warmup failed: exit_code")


def test_start_over_where_nothing_was_given_up_does_nothing(tmp_path: Path) -> None:
    outbox = state_files.path(tmp_path, state_files.OUTBOX)
    outbox.write_bytes(b"pending calls")
    assert givenup.start_over(tmp_path) is None
    assert outbox.read_bytes() == b"pending calls"
    assert sorted(p.name for p in tmp_path.iterdir()) == [outbox.name]


def test_start_over_forgets_the_give_up_and_sets_the_outbox_and_its_journal_aside(tmp_path: Path) -> None:
    givenup.remember(tmp_path, "rate 0")
    outbox = state_files.path(tmp_path, state_files.OUTBOX)
    for suffix, data in (("", b"db"), ("-wal", b"wal"), ("-shm", b"shm")):
        outbox.with_name(outbox.name + suffix).write_bytes(data)
    said = givenup.start_over(tmp_path)
    assert said == (f"starting over (--fresh): the give-up (rate 0) is forgotten; its outbox set aside as "
                    f"{outbox.name}{SET_ASIDE_SUFFIX}; registering afresh")
    assert givenup.recall(tmp_path) is None
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {
        f"{outbox.name}{SET_ASIDE_SUFFIX}": b"db", f"{outbox.name}{SET_ASIDE_SUFFIX}-wal": b"wal",
        f"{outbox.name}{SET_ASIDE_SUFFIX}-shm": b"shm"}


def test_start_over_with_an_outbox_but_no_journal_moves_just_the_outbox(tmp_path: Path) -> None:
    givenup.remember(tmp_path, "rate 0")
    outbox = state_files.path(tmp_path, state_files.OUTBOX)
    outbox.write_bytes(b"db")
    givenup.start_over(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{outbox.name}{SET_ASIDE_SUFFIX}"]


def test_start_over_without_an_outbox_says_nothing_was_set_aside(tmp_path: Path) -> None:
    givenup.remember(tmp_path, "passed: false")
    said = givenup.start_over(tmp_path)
    assert said is not None and "set aside" not in said and "passed: false" in said
    assert list(tmp_path.iterdir()) == []


def test_start_over_sets_another_labels_give_up_aside_and_forgets_only_its_own(tmp_path: Path) -> None:
    # The marker is C.888's: --fresh of C.777 deleted it, and C.888, back on the state_dir, ran again.
    givenup.remember(tmp_path, "bench too slow", "C.888")
    said = givenup.start_over(tmp_path, "C.777")
    assert said is not None and "'C.888' was given up, not 'C.777'" in said and "set aside" in said, said
    assert "'C.777' was not given up here; starting as usual" in said, said
    kept = givenup.recall(tmp_path, "C.888")
    assert kept is not None and kept.reason == "bench too slow", "that label, back, is still refused"
    # C.777's own, set aside by another's start before: that one --fresh forgets.
    givenup.remember(tmp_path, "rate 0", "C.777")
    givenup.set_aside(tmp_path, givenup.recall(tmp_path, "C.999"), "C.999")  # type: ignore[arg-type]
    said = givenup.start_over(tmp_path, "C.777")
    assert said is not None and "the give-up (rate 0) is forgotten" in said, said
    assert givenup.recall(tmp_path, "C.777") is None and givenup.recall(tmp_path, "C.888") is not None


def test_a_second_fresh_start_replaces_the_older_set_aside_outbox(tmp_path: Path) -> None:
    outbox = state_files.path(tmp_path, state_files.OUTBOX)
    for generation in (b"first", b"second"):
        givenup.remember(tmp_path, "again")
        outbox.write_bytes(generation)
        givenup.start_over(tmp_path)
    assert outbox.with_name(outbox.name + SET_ASIDE_SUFFIX).read_bytes() == b"second"
    assert not outbox.exists()


def test_start_over_forgets_a_spoilt_marker_too(tmp_path: Path) -> None:
    givenup.marker(tmp_path).write_text("{spoilt")
    said = givenup.start_over(tmp_path)
    assert said is not None and re.search(r"the give-up \(its record .* is unreadable: JSONDecodeError\)", said)
    assert givenup.recall(tmp_path) is None


def test_start_over_forgets_the_old_instances_clocks(tmp_path: Path) -> None:
    seen = state_files.path(tmp_path, state_files.FIRST_SEEN)
    seen.write_text(json.dumps({"first_start": 1.0e9, "manager_registered_at": 1.0e9}))
    givenup.remember(tmp_path, "the manager killed this instance at 2026-12-01 11:59:00 UTC: manually killed via UI")
    said = givenup.start_over(tmp_path)
    assert said is not None and "manually killed via UI" in said
    assert not seen.exists()  # the new row's deadlines run from its own registered_at
    assert givenup.start_over(tmp_path) is None


# ---------------------------------------------------------------- whose give-up, and the call that tells the manager


def test_the_label_and_the_call_are_remembered_with_the_give_up(tmp_path: Path) -> None:
    call = ("bench-done", {"rate": 0.0, "failed": True, "reason": "phase fetch failed"})
    kept = givenup.remember(tmp_path, "fetch failed", "C.777", call)
    assert givenup.recall(tmp_path) == kept == GivenUp(kept.at, "fetch failed", "C.777", call)
    assert json.loads(givenup.marker(tmp_path).read_text()) == {
        "at": kept.at, "reason": "fetch failed", "label": "C.777",
        "call": {"kind": "bench-done", "payload": {"rate": 0.0, "failed": True, "reason": "phase fetch failed"}}}


@pytest.mark.parametrize("call", [
    "bench-done", ["bench-done", {}], {"kind": 5, "payload": {}}, {"kind": "bench-done", "payload": [0]},
    {"kind": "bench-done"}, None])
def test_a_call_of_the_wrong_shape_is_left_out_and_the_marker_still_holds(tmp_path: Path, call: object) -> None:
    givenup.marker(tmp_path).write_text(json.dumps({"at": 5, "reason": "r", "label": "C.1", "call": call}))
    assert givenup.recall(tmp_path) == GivenUp(5.0, "r", "C.1", None)


@pytest.mark.parametrize(("label", "written", "ours"), [
    ("C.777", "C.777", True),
    ("C.888", "C.777", False),
    ("C.888", None, True),  # a marker of an earlier version names no label: taken as ours
    ("C.888", "", True),
    ("", "C.777", True),  # a start without a manager names no instance: refused, as it always was
])
def test_a_marker_is_this_labels_unless_both_name_another(tmp_path: Path, label: str, written: str | None,
                                                          ours: bool) -> None:
    record = {"at": 5, "reason": "r"} | ({"label": written} if written is not None else {})
    givenup.marker(tmp_path).write_text(json.dumps(record))
    recalled = givenup.recall(tmp_path)
    assert recalled is not None and recalled.of(label) is ours


def test_another_labels_marker_is_set_aside_under_its_label_and_still_refuses_it(tmp_path: Path) -> None:
    kept = givenup.remember(tmp_path, "fetch failed", "C.777")
    said = givenup.set_aside(tmp_path, kept, "C.888")
    assert said == ("this state_dir's instance 'C.777' was given up, not 'C.888' (a new instance): its record is "
                    "set aside as given-up.json.C.777")
    assert givenup.recall(tmp_path) is None and givenup.recall(tmp_path, "C.888") is None
    assert givenup.recall(tmp_path, "C.777") == kept  # (C.777 back on this state_dir: still given up)
    later = givenup.remember(tmp_path, "bench too slow", "C.888")  # C.888 given up too, then set aside in turn
    givenup.set_aside(tmp_path, later, "C.777")
    assert givenup.recall(tmp_path, "C.777") == kept and givenup.recall(tmp_path, "C.888") == later  # none lost
    assert givenup.start_over(tmp_path, "C.777") is not None  # --fresh forgets C.777's, wherever it is
    assert givenup.recall(tmp_path, "C.777") is None and givenup.recall(tmp_path, "C.888") == later


@pytest.mark.parametrize(("label", "name"), [
    ("C.1/../x", "given-up.json.C.1%2F..%2Fx"),  # (no path through a label)
    ("h" * 200, "given-up.json.sha256-" + "0" * 64),  # (a label too long for a file name: its hash)
])
def test_a_set_aside_marker_is_named_by_its_label_safely(tmp_path: Path, label: str, name: str) -> None:
    path = givenup.aside(tmp_path, label)
    assert path.parent == tmp_path
    if "sha256" in name:
        assert re.fullmatch(r"given-up\.json\.sha256-[0-9a-f]{64}", path.name), path.name
    else:
        assert path.name == name
