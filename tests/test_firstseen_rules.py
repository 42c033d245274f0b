"""supervisor.state.firstseen on a real state_dir: each time written once, the first time it is known, and kept across
starts (a later start neither rewrites the first start nor a registration); values in the file that are not a
usable time (bool, NaN, 0, negative, a string) are ignored one by one; a file of the wrong shape starts afresh; a
state_dir that cannot be written costs the memory, not the run, and is said. tests/test_transfer.py covers the
plain restart and unreadable JSON; not repeated here."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.manager.row import Row
from supervisor.manager.rowwatch import RowReading
from supervisor.manager.view import ManagerView
from supervisor.state import files as state_files
from supervisor.state.firstseen import (
    AFTER_FETCH_CLOCK,
    FIRST_REGISTERED,
    FIRST_SEEN_MAX_BYTES,
    FIRST_START,
    MANAGER_REGISTERED,
    FirstSeen,
)


def saved(state_dir: Path) -> dict[str, float]:
    return json.loads(state_files.path(state_dir, state_files.FIRST_SEEN).read_text())


def write(state_dir: Path, text: str) -> None:
    state_files.path(state_dir, state_files.FIRST_SEEN).write_text(text)


def test_the_first_start_is_written_at_once(tmp_path: Path) -> None:
    FirstSeen(tmp_path, print, now=lambda: 50.0)
    assert saved(tmp_path) == {FIRST_START: 50.0}


def test_a_later_start_does_not_rewrite_the_file(tmp_path: Path) -> None:
    FirstSeen(tmp_path, print, now=lambda: 50.0)
    path = state_files.path(tmp_path, state_files.FIRST_SEEN)
    inode = path.stat().st_ino
    again = FirstSeen(tmp_path, print, now=lambda: 999.0)
    assert again.anchor() == (50.0, "the first start")
    assert path.stat().st_ino == inode, "nothing new was known: not written again"


def test_a_second_registration_keeps_the_first(tmp_path: Path) -> None:
    clock = iter([10.0, 20.0, 30.0])
    seen = FirstSeen(tmp_path, print, now=lambda: next(clock))
    seen.registered()
    seen.registered()  # the manager answered a register again (a forgotten uuid): the deadline does not move
    assert seen.anchor() == (20.0, "the first registration")
    assert saved(tmp_path) == {FIRST_START: 10.0, FIRST_REGISTERED: 20.0}


def test_the_label_is_kept_with_the_clocks(tmp_path: Path) -> None:
    FirstSeen(tmp_path, print, now=lambda: 50.0, label="C.777").registered()
    assert saved(tmp_path)["label"] == "C.777"
    assert FirstSeen(tmp_path, print, now=lambda: 90.0, label="C.777").anchor() == (50.0, "the first registration")


def test_another_labels_clocks_are_not_this_instances(tmp_path: Path) -> None:
    """The volume of C.777 attached to C.888 (a new row): C.777's registration would start C.888's fetch deadline
    hours early, and a healthy fetch be given up."""
    old = FirstSeen(tmp_path, print, now=lambda: 50.0, label="C.777")
    old.registered()
    old.param_done()
    said: list[str] = []
    new = FirstSeen(tmp_path, said.append, now=lambda: 9000.0, label="C.888")
    assert new.anchor() == (9000.0, "the first start")
    assert new.clock(AFTER_FETCH_CLOCK) is None
    assert saved(tmp_path) == {FIRST_START: 9000.0, "label": "C.888"}
    assert said == [f"first-seen: {state_files.path(tmp_path, state_files.FIRST_SEEN)} holds the clocks of "
                    "instance 'C.777', not 'C.888': this instance's count from now on"]


def test_clocks_that_name_no_label_or_a_start_without_one_are_kept(tmp_path: Path) -> None:
    write(tmp_path, json.dumps({FIRST_START: 40.0}))  # (an earlier version's file)
    assert FirstSeen(tmp_path, print, now=lambda: 90.0, label="C.888").anchor() == (40.0, "the first start")
    assert saved(tmp_path) == {FIRST_START: 40.0}  # (nothing new known: not written)
    FirstSeen(tmp_path, print, now=lambda: 95.0, label="C.888").registered()
    assert saved(tmp_path)["label"] == "C.888"
    assert FirstSeen(tmp_path, print, now=lambda: 99.0).anchor() == (95.0, "the first registration")


def test_a_registration_known_without_a_first_start_keeps_it_and_adds_the_start(tmp_path: Path) -> None:
    write(tmp_path, json.dumps({FIRST_REGISTERED: 300.0}))
    seen = FirstSeen(tmp_path, print, now=lambda: 400.0)
    assert seen.anchor() == (300.0, "the first registration")
    assert saved(tmp_path) == {FIRST_REGISTERED: 300.0, FIRST_START: 400.0}


def test_values_that_are_not_a_time_are_ignored_one_by_one(tmp_path: Path) -> None:
    for bad in ("true", '"1000"', "0", "-5", "null", "[1]"):
        write(tmp_path, f'{{"{FIRST_START}": {bad}, "{FIRST_REGISTERED}": 77}}')
        said: list[str] = []
        seen = FirstSeen(tmp_path, said.append, now=lambda: 500.0)
        assert seen.anchor() == (77.0, "the first registration"), bad
        assert saved(tmp_path) == {FIRST_REGISTERED: 77.0, FIRST_START: 500.0}, bad
        assert said == [], "a value left out is not an error to say"


def test_a_nan_or_infinite_time_is_ignored(tmp_path: Path) -> None:
    write(tmp_path, f'{{"{FIRST_START}": NaN, "{FIRST_REGISTERED}": Infinity}}')
    seen = FirstSeen(tmp_path, print, now=lambda: 8.0)
    assert seen.anchor() == (8.0, "the first start")


def test_a_file_that_is_not_an_object_starts_afresh_quietly(tmp_path: Path) -> None:
    write(tmp_path, "[1000, 2000]")
    said: list[str] = []
    seen = FirstSeen(tmp_path, said.append, now=lambda: 9.0)
    assert seen.anchor() == (9.0, "the first start") and said == []
    assert saved(tmp_path) == {FIRST_START: 9.0}


def test_other_keys_in_the_file_are_not_kept(tmp_path: Path) -> None:
    write(tmp_path, json.dumps({FIRST_START: 5.0, "extra": 1}))
    seen = FirstSeen(tmp_path, print, now=lambda: 6.0)
    seen.registered()
    assert saved(tmp_path) == {FIRST_START: 5.0, FIRST_REGISTERED: 6.0}


def test_a_file_too_big_to_be_ours_is_said_and_started_afresh(tmp_path: Path) -> None:
    write(tmp_path, " " * (FIRST_SEEN_MAX_BYTES + 1))
    said: list[str] = []
    seen = FirstSeen(tmp_path, said.append, now=lambda: 3.0)
    assert seen.anchor() == (3.0, "the first start")
    assert len(said) == 1 and said[0].startswith("first-seen: cannot read ") and "count from this start" in said[0]


def test_json_nested_past_the_parsers_depth_is_said_and_started_afresh(tmp_path: Path) -> None:
    write(tmp_path, "[" * 2000 + "]" * 2000)
    said: list[str] = []
    seen = FirstSeen(tmp_path, said.append, now=lambda: 3.0)
    assert seen.anchor() == (3.0, "the first start")
    assert len(said) == 1 and said[0].startswith("first-seen: cannot read ") and "count from this start" in said[0]


def test_a_directory_in_its_place_is_said_and_the_run_goes_on(tmp_path: Path) -> None:
    """Unreadable and unwritable: both said, neither raises; the times still count within this run."""
    state_files.path(tmp_path, state_files.FIRST_SEEN).mkdir()
    said: list[str] = []
    clock = iter([1.0, 2.0])
    seen = FirstSeen(tmp_path, said.append, now=lambda: next(clock))
    seen.registered()
    assert seen.anchor() == (2.0, "the first registration")
    assert said[0].startswith("first-seen: cannot read") and "not a regular file" in said[0]
    # The write failed at the start and again at the registration: said once (at every save, a full disk's line
    # came again with every clock the run moved).
    assert len(said) == 2 and said[1].startswith("first-seen: cannot write") and "a restart counts afresh" in said[1]


def test_a_missing_state_dir_costs_the_memory_not_the_run(tmp_path: Path) -> None:
    said: list[str] = []
    seen = FirstSeen(tmp_path / "gone", said.append, now=lambda: 4.0)
    assert seen.anchor() == (4.0, "the first start")
    assert said == [f"first-seen: cannot write {tmp_path / 'gone' / state_files.FIRST_SEEN}: No such file or "
                    "directory; a restart counts afresh"]


def test_a_write_that_fails_is_said_once_and_again_when_it_works(tmp_path: Path) -> None:
    said: list[str] = []
    target = state_files.path(tmp_path, state_files.FIRST_SEEN)
    target.mkdir()  # (a directory in its place: every write fails)
    clock = iter([1.0, 2.0, 3.0])
    seen = FirstSeen(tmp_path, said.append, now=lambda: next(clock))
    seen.registered()  # (its second write that fails)
    assert [line for line in said if "cannot write" in line] == [
        f"first-seen: cannot write {target}: Is a directory; a restart counts afresh"], said
    target.rmdir()
    seen.param_done()
    assert said[-1] == f"first-seen: {target} written again", said


# ---------------------------------------------------------------- impossible times, the manager's clocks


def test_a_time_in_the_future_or_absurdly_old_is_refused_in_one_line(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    write(tmp_path, json.dumps({FIRST_START: now + 3600, FIRST_REGISTERED: 1.0}))
    said: list[str] = []
    seen = FirstSeen(tmp_path, said.append, now=lambda: now)
    assert seen.anchor() == (now, "the first start")  # counted from this start
    assert len(said) == 2, said
    assert said[0].startswith(f"first-seen: {FIRST_START} = ") and "3600s later than now: impossible, not used" \
        in said[0], said
    assert said[1].startswith(f"first-seen: {FIRST_REGISTERED} = 1 in ") and "days before now: impossible" \
        in said[1], said
    assert saved(tmp_path) == {FIRST_START: now}


def test_a_time_within_the_skew_is_kept(tmp_path: Path) -> None:
    write(tmp_path, json.dumps({FIRST_START: 1060.0}))
    said: list[str] = []
    assert FirstSeen(tmp_path, said.append, now=lambda: 1000.0).anchor() == (1060.0, "the first start")
    assert said == []


def test_the_fetch_clock_is_the_managers_registered_at_once_a_row_said_it(tmp_path: Path) -> None:
    seen = FirstSeen(tmp_path, print, now=lambda: 10_000.0)
    seen.registered()
    seen.heard_row(Row("u", "registered", registered_at=10_000.0 - 89 * 60))  # a row joined long after it began
    assert seen.anchor() == (10_000.0 - 89 * 60, "the manager's registered_at")
    assert saved(tmp_path)[MANAGER_REGISTERED] == 10_000.0 - 89 * 60  # kept across restarts
    again = FirstSeen(tmp_path, print, now=lambda: 10_100.0)
    assert again.anchor() == (10_000.0 - 89 * 60, "the manager's registered_at")
    # A row registered anew (the old uuid forgotten): the manager's fetch timeout runs from the new row's time.
    again.heard_row(Row("u2", "registered", registered_at=10_000.0 - 60))
    assert again.anchor() == (10_000.0 - 60, "the manager's registered_at")


def test_the_managers_time_counts_even_where_ours_came_first(tmp_path: Path) -> None:
    # The manager's 90 minutes run from its own registered_at: a deadline counted from ours (a second earlier
    # here; minutes, when the answer to our registration was lost) would cut what the manager still allows.
    seen = FirstSeen(tmp_path, print, now=lambda: 500.0)
    seen.registered()
    assert seen.anchor() == (500.0, "the first registration")
    seen.heard_row(Row("u", "registered", registered_at=501.0))
    assert seen.anchor() == (501.0, "the manager's registered_at")


def test_a_param_done_delivered_late_starts_the_bench_clock_at_the_managers_time(tmp_path: Path) -> None:
    # The fetch ended at 2000, the manager was down and took the param-done 40 minutes later: its 45-minute
    # benchmark timeout runs from then, and so does the clock that predicts it.
    seen = FirstSeen(tmp_path, print, now=lambda: 2000.0, names={AFTER_FETCH_CLOCK: "bench"})
    seen.param_done()
    assert seen.clock("bench") == (2000.0, "the fetch's end (param-done)")
    seen.heard_row(Row("u", "params_done", param_done_at=2000.0 + 40 * 60))
    assert seen.clock("bench") == (2000.0 + 40 * 60, "the manager's param_done_at")


# The name a plugin gives the clock after the fetch (Plugin.clocks: the prover's is its benchmark's).
BENCH_CLOCK = "bench"
NAMES = {AFTER_FETCH_CLOCK: BENCH_CLOCK}


def test_the_bench_clock_is_the_fetchs_end_until_a_row_says_the_managers_param_done_at(tmp_path: Path) -> None:
    seen = FirstSeen(tmp_path, print, now=lambda: 2000.0, names=NAMES)
    assert seen.clock(BENCH_CLOCK) is None
    seen.param_done()
    assert seen.clock(BENCH_CLOCK) == (2000.0, "the fetch's end (param-done)")
    seen.heard_row(Row("u", "params_done", param_done_at=1990.0))
    assert seen.clock(BENCH_CLOCK) == (1990.0, "the manager's param_done_at")
    # The row is past registered: the fetch's clock no longer runs, and is not shown.
    assert seen.status() == {"bench": {"at": 1990.0, "source": "the manager's param_done_at"}}
    restarted = FirstSeen(tmp_path, print, now=lambda: 2500.0, names=NAMES)  # a restart mid-bench: no fresh budget
    assert restarted.clock(BENCH_CLOCK) == (1990.0, "the manager's param_done_at")
    unnamed = FirstSeen(tmp_path, print, now=lambda: 2500.0)  # no plugin named it: the core's own name
    assert unnamed.status() == {AFTER_FETCH_CLOCK: {"at": 1990.0, "source": "the manager's param_done_at"}}


def test_the_clock_after_the_fetch_is_shown_only_while_the_row_is_at_that_stage(tmp_path: Path) -> None:
    # In production (the row running) the benchmark's deadline no longer applies: status must not show it
    # as "passed 71h ago". The clock itself is still there for whoever asks it.
    seen = FirstSeen(tmp_path, print, now=lambda: 2000.0, names=NAMES)
    seen.param_done()
    assert seen.status() == {"fetch": {"at": 2000.0, "source": "the first start"},
                             "bench": {"at": 2000.0, "source": "the fetch's end (param-done)"}}
    seen.heard_row(Row("u", "params_done", param_done_at=1990.0))
    assert list(seen.status()) == ["bench"]
    seen.heard_row(Row("u", "running", param_done_at=1990.0))
    assert seen.status() == {}
    assert seen.clock(BENCH_CLOCK) == (1990.0, "the manager's param_done_at")

def test_a_fetch_run_again_once_the_managers_fetch_clock_stopped_counts_from_this_start(tmp_path: Path) -> None:
    first = FirstSeen(tmp_path, print, now=lambda: 1000.0)
    first.registered()
    assert first.anchor() == (1000.0, "the first registration")
    first.param_done()  # the fetch ended; days later the container starts again and its cache is gone
    later = FirstSeen(tmp_path, print, now=lambda: 1000.0 + 3 * 86400)
    assert later.anchor() == (1000.0 + 3 * 86400, "this start")  # not given up at once on a clock long stopped
    later.heard_row(Row("u", "running"))
    assert later.anchor() == (1000.0 + 3 * 86400, "this start")


def test_a_row_the_manager_no_longer_lists_runs_no_clock_until_one_is_read(tmp_path: Path) -> None:
    """A restart finds its row forgotten (the manager's database reset) past the old row's deadline: the old row's
    registered_at and param_done_at anchor nothing while the label is registered anew. Judged on them, the fetch
    failed too_slow at once, before the new row was read."""
    first = FirstSeen(tmp_path, print, now=lambda: 1000.0, names=NAMES)
    first.registered()
    first.heard_row(Row("u", "registered", registered_at=1000.0))
    later = FirstSeen(tmp_path, print, now=lambda: 1000.0 + 91 * 60, names=NAMES)
    assert later.anchor() == (1000.0, "the manager's registered_at")  # (no row read yet: the kept one)
    view = ManagerView(print, lambda source, text: None, lambda reason: None, lambda: None)
    view.first_seen = later
    view.heard_row(RowReading(1000.0 + 91 * 60, None, unlisted=True))  # this start's first read: not listed
    assert later.anchor() == (1000.0 + 91 * 60, "this start")
    assert later.clock(BENCH_CLOCK) is None and later.status() == {}
    later.heard_row(Row("u2", "registered", registered_at=1000.0 + 91 * 60 - 2))  # the label registered anew
    assert later.anchor() == (1000.0 + 91 * 60 - 2, "the manager's registered_at")
