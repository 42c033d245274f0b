"""manager/row.py: this instance's row in the manager's ``GET /status``, held to what the manager writes.

Its times are SQLite's CURRENT_TIMESTAMP (``YYYY-MM-DD HH:MM:SS``, UTC), or ISO 8601 naming its zone (read in
it); one later than now beyond the skew, or before any manager ran, is impossible, and one of any other form
cannot be placed: dropped with a note, never an anchor, the row's state kept (a kill must not hide behind a
time's form). A row of the wrong shape otherwise is no evidence at all (RowError). A plugin's protocol adds
states, times and numbers to a row (``RowFields``: here a test protocol's; the prover's in
tests/prover/test_manager_row_prover.py), held to the same rules."""

from __future__ import annotations

import calendar
import time

import pytest

from supervisor.manager.row import Row, RowError, RowFields, find_row, manager_time, utc_text
from supervisor.state.firstseen import CLOCK_SKEW_S

NOW = float(calendar.timegm((2026, 12, 1, 12, 0, 0)))
ROW = {"uuid": "u-1", "label": "C.7", "runner_id": 3, "state": "registered", "score": 60.0,
       "registered_at": "2026-12-01 10:31:00"}
# A test protocol's fields: a state of its own between the fetch and production, its time, a number.
TESTED = RowFields(states=("tested",), times=("tested_at",), numbers={"score": 100.0})


def test_the_row_is_found_by_uuid_and_its_times_read_as_utc() -> None:
    other = {**ROW, "uuid": "u-2", "state": "killed"}
    row, notes = find_row([other, ROW], "u-1", NOW)
    assert row == Row("u-1", "registered", registered_at=NOW - 89 * 60)  # a field nobody declared is not read
    assert notes == [] and not row.killed
    assert find_row({"instances": [ROW]}, "u-1", NOW)[0] == row  # an answer wrapped in an object, too


def test_a_plugins_fields_are_read_with_the_cores() -> None:
    row, notes = find_row([{**ROW, "state": "tested", "tested_at": "2026-12-01 11:00:00"}], "u-1", NOW, TESTED)
    assert row == Row("u-1", "tested", registered_at=NOW - 89 * 60,
                      extra={"score": 60.0, "tested_at": NOW - 3600}) and notes == []
    assert row.to_dict()["score"] == 60.0 and "extra" not in row.to_dict(), "status shows them beside the core's"
    assert find_row([ROW], "u-1", NOW, TESTED)[0] == Row("u-1", "registered", registered_at=NOW - 89 * 60,
                                                         extra={"score": 60.0, "tested_at": None})
    with pytest.raises(RowError, match="state is not one of registered, params_done, running, killed"):
        find_row([{**ROW, "state": "tested"}], "u-1", NOW)  # not without the protocol that declares it


def test_a_uuid_the_fleet_does_not_list_has_no_row() -> None:
    assert find_row([ROW], "u-9", NOW) == (None, [])
    assert find_row([], "u-9", NOW) == (None, [])


def test_a_killed_row_says_the_managers_reason_and_time_in_one_line() -> None:
    row, _ = find_row([{**ROW, "state": "killed", "killed_at": "2026-12-01 11:59:00",
                        "kill_reason": "param fetch timeout (90min)"}], "u-1", NOW)
    assert row is not None and row.killed
    assert row.kill_line() == "the manager killed this instance at 2026-12-01 11:59:00 UTC: param fetch timeout (90min)"
    assert Row("u-1", "killed").kill_line() == "the manager killed this instance: no kill_reason given"
    # A manager two hours behind ours wrote 09:59: the line says when on our clock, as the deadlines count it.
    behind, _ = find_row([{**ROW, "state": "killed", "killed_at": "2026-12-01 09:59:00",
                           "kill_reason": "manually killed via UI"}], "u-1", NOW, offset_s=-7200)
    assert behind is not None
    assert behind.kill_line() == "the manager killed this instance at 2026-12-01 11:59:00 UTC: manually killed via UI"



@pytest.mark.parametrize("state", ["params_done", "running"])
def test_a_row_moved_on_after_its_kill_is_still_killed(state: str) -> None:
    """shared/domain/manager-api.md: a call after the kill moves the row on (bench-done has no state check, and
    /running then succeeds), its killed_at and kill_reason kept while the machine is destroyed: the row is killed
    whatever its state, and its line says where the row was moved."""
    row, _ = find_row([{**ROW, "state": state, "killed_at": "2026-12-01 11:59:00",
                        "kill_reason": "benchmark timeout (45min)"}], "u-1", NOW)
    assert row is not None and row.killed
    assert row.kill_line() == ("the manager killed this instance at 2026-12-01 11:59:00 UTC: benchmark timeout "
                               f"(45min) (its row moved to {state} after the kill)")
    # Either field is the kill's: a killed_at refused (from the future) leaves the reason, and the reverse.
    assert find_row([{**ROW, "state": state, "kill_reason": "manually killed via UI"}], "u-1", NOW)[0].killed
    assert find_row([{**ROW, "state": state, "killed_at": "2026-12-01 11:59:00"}], "u-1", NOW)[0].killed
    assert not find_row([{**ROW, "state": state, "killed_at": "", "kill_reason": ""}], "u-1", NOW)[0].killed

@pytest.mark.parametrize("when", [utc_text(NOW + CLOCK_SKEW_S + 60), "2099-01-01 00:00:00", "1970-01-01 00:00:01"])
def test_an_impossible_time_is_dropped_with_a_note_and_the_row_kept(when: str) -> None:
    row, notes = find_row([{**ROW, "registered_at": when}], "u-1", NOW)
    assert row is not None and row.registered_at is None and row.state == "registered"
    assert len(notes) == 1 and "registered_at" in notes[0] and "impossible, not used" in notes[0], notes


@pytest.mark.parametrize(("name", "value"), [
    ("registered_at", "2026-12-01T10:31:00"),  # ISO 8601 naming no zone: which one would be a guess
    ("registered_at", "2026-12-01 10:31"), ("registered_at", 1764500000), ("registered_at", {"t": 1}),
    ("killed_at", "yesterday"), ("tested_at", "soon"), ("tested_at", "2026-12-01T10:31:00+99:00"),
])
def test_a_time_that_cannot_be_placed_is_dropped_with_a_note_and_the_row_kept(name: str, value: object) -> None:
    # Times are deadlines' anchors, never what decides the row: its state (killed, here) is the manager's word
    # whatever form its times take, and a row refused whole for one time hid its kill.
    raw = {**ROW, "state": "killed", "kill_reason": "manually killed via UI", name: value}
    row, notes = find_row([raw], "u-1", NOW, TESTED)
    assert row is not None and row.killed and row.kill_reason == "manually killed via UI"
    kept = {"registered_at": row.registered_at, "killed_at": row.killed_at, "tested_at": row.extra["tested_at"]}
    assert kept[name] is None, kept
    assert len(notes) == 1 and f"{name} is not a time as the manager writes it" in notes[0], notes
    assert notes[0].endswith(": not used"), notes


@pytest.mark.parametrize("written", ["2026-12-01T10:31:00Z", "2026-12-01T12:31:00+02:00", "2026-12-01 05:31:00-05:00",
                                     "2026-12-01T10:31:00.000+00:00"])
def test_a_time_naming_its_zone_is_read_in_it(written: str) -> None:
    row, notes = find_row([{**ROW, "registered_at": written}], "u-1", NOW)
    assert row is not None and row.registered_at == NOW - 89 * 60 and notes == [], (row, notes)


def test_a_time_within_the_skew_is_taken() -> None:
    assert manager_time(utc_text(NOW + 60), "registered_at", NOW) == NOW + 60


@pytest.mark.parametrize(("raw", "why"), [
    ({**ROW, "state": "lost"}, "state is not one of"),
    ({**ROW, "score": "fast"}, "score is not a number"),
    ({**ROW, "score": float("inf")}, "score is not a number"),
    ({**ROW, "score": 10**400}, "score is not a number in 0..100: 1000"),  # valid JSON, and no float holds it
    ({**ROW, "score": 101}, "score is not a number in 0..100"),
    ({**ROW, "kill_reason": ["x"]}, "kill_reason is not text"),
])
def test_a_row_of_the_wrong_shape_is_no_evidence(raw: dict[str, object], why: str) -> None:
    with pytest.raises(RowError, match=why):
        find_row([raw], "u-1", NOW, TESTED)


@pytest.mark.parametrize("body", [{"rows": []}, "all fine", 7, None])
def test_an_answer_that_is_no_list_of_rows_is_refused(body: object) -> None:
    with pytest.raises(RowError, match="neither a list of rows"):
        find_row(body, "u-1", NOW)


def test_a_uuid_listed_twice_is_refused() -> None:
    with pytest.raises(RowError, match="2 times"):
        find_row([ROW, ROW], "u-1", NOW)


def test_a_kill_reason_is_one_bounded_printable_line() -> None:
    row, _ = find_row([{**ROW, "state": "killed", "kill_reason": "bad\nhost\x1b[31m " + "x" * 1000}], "u-1", NOW)
    assert row is not None and row.kill_reason is not None
    assert "\n" not in row.kill_reason and "\x1b" not in row.kill_reason and len(row.kill_reason) == 300


def test_utc_text_is_the_managers_format() -> None:
    assert utc_text(NOW) == "2026-12-01 12:00:00"
    assert time.strftime("%Y", time.gmtime(manager_time("2026-12-01 12:00:00", "t", NOW))) == "2026"


def test_the_view_tells_the_clocks_then_the_plugin_of_a_row_and_the_plugin_before_the_lifecycle_of_a_kill() -> None:
    # Who hears the manager's row is named in the view, in one order (manager/view.py): the instance's clocks
    # (the manager's, where earlier than ours), then the plugin; a kill goes to the plugin first (its give-up
    # must not answer a killed row), then stops the lifecycle.
    from types import SimpleNamespace

    from supervisor.manager.rowwatch import RowReading
    from supervisor.manager.view import ManagerView

    heard: list[str] = []
    view = ManagerView(lambda line: heard.append(f"log {line[:24]}"), lambda source, text: heard.append("push"),
                       lambda why: heard.append("retire"), lambda: None)
    view.first_seen = SimpleNamespace(heard_row=lambda row: heard.append(f"clocks {row.state}"),
                                      heard_unlisted=lambda: heard.append("clocks unlisted"))
    view.on_row(lambda row: heard.append(f"plugin {row.state}"))
    view.on_killed(lambda row: heard.append("plugin killed"))
    view.stop_lifecycle = lambda row: heard.append("lifecycle stopped")
    view.heard_row(RowReading(1.0, Row("u", "registered"), unlisted=False))
    view.heard_row(RowReading(2.0, None, unlisted=True))  # no row: the clocks stop (forgotten), the plugin hears none
    assert heard == ["clocks registered", "plugin registered", "clocks unlisted"]
    heard.clear()
    view.heard_row(RowReading(3.0, None, unlisted=False, error="HTTP 500"))  # not read: nobody hears anything
    assert heard == []
    heard.clear()
    view.heard_kill(Row("u", "registered", kill_reason="rented out"))
    assert heard == ["log manager: the manager kil", "retire", "push", "plugin killed", "lifecycle stopped"]


@pytest.mark.parametrize(("written", "offset_s", "read_as"), [
    (NOW - 7200, -7200.0, NOW),  # a registration made now by a manager two hours behind
    (NOW - 3600, 3600.0, NOW - 7200),  # an hour ago on a clock an hour ahead: two hours ago on ours
    (NOW - 3600, -4.0, NOW - 3600), (NOW - 3600, 4.0, NOW - 3600),  # Date's rounding, left alone
], ids=["behind", "ahead", "within-5s-behind", "within-5s-ahead"])
def test_a_time_is_read_on_our_clock_where_the_managers_differs_by_5s_or_more(written: float, offset_s: float,
                                                                              read_as: float) -> None:
    assert manager_time(utc_text(written), "registered_at", NOW, offset_s) == read_as


def test_a_time_from_the_future_is_judged_on_our_clock() -> None:
    # A manager 2 h ahead wrote "now + 1 h" an hour ago: possible, and used; on its own clock it was impossible.
    assert manager_time(utc_text(NOW + 3600), "registered_at", NOW, 7200.0) == NOW - 3600
    with pytest.raises(RowError, match="impossible"):
        manager_time(utc_text(NOW + 3600), "registered_at", NOW, 0.0)
