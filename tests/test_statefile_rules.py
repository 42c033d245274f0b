"""supervisor.status.file in-process. StateFile on an EventLoop driven by a fake clock (tests/fakes.py): every
change written at once up to PERSIST_BURST in PERSIST_WINDOW_S, then coalesced into one write when the window
passes on the loop's clock (with what the snapshot is then, not what it was); a phase reaching a final state
written at once even in a burst; a write that fails said once, tried again at each change, and its recovery
said. load_persisted's reasons, and snapshot_problem naming the first place a snapshot read back differs.
tests/test_status.py covers the CLI's one line for wrong-shaped files; not repeated here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeClock

from supervisor.engine.loop import EventLoop
from supervisor.lifecycle import resume
from supervisor.lifecycle.states import PhaseState
from supervisor.state import files as state_files
from supervisor.state import firstseen, givenup
from supervisor.status.file import PERSIST_BURST, PERSIST_WINDOW_S, StateFile, load_persisted, snapshot_problem
from supervisor.status.model import Snapshot


class Harness:
    def __init__(self, state_dir: Path) -> None:
        self.clock = FakeClock()
        self.loop = EventLoop(clock=self.clock)
        self.said: list[str] = []
        self.builds = 0
        self.state_dir = state_dir
        self.file = StateFile(state_dir, self.loop, self.said.append, self.build)

    def build(self) -> Snapshot:
        self.builds += 1
        return Snapshot.from_json({"written_at": float(self.builds), "phases": []})

    def on_disk(self) -> float:
        return json.loads(self.file.path.read_text())["written_at"]

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.loop.run_once(max_wait=0)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.loop.close()


def test_each_change_is_written_at_once_up_to_the_burst(h: Harness) -> None:
    for i in range(PERSIST_BURST):
        h.file.changed()
        assert h.on_disk() == i + 1
    assert h.loop.next_due() is None


def test_past_the_burst_changes_wait_for_the_window_and_go_out_as_one(h: Harness) -> None:
    for _ in range(PERSIST_BURST):
        h.file.changed()
    for _ in range(5):
        h.file.changed()  # a service restarting in a tight loop
    assert h.builds == PERSIST_BURST, "not written now"
    assert h.loop.next_due() == pytest.approx(PERSIST_WINDOW_S), "one write waits for the window to pass"
    h.advance(PERSIST_WINDOW_S / 2)
    assert h.builds == PERSIST_BURST
    h.advance(PERSIST_WINDOW_S / 2)
    assert h.builds == PERSIST_BURST + 1 and h.on_disk() == PERSIST_BURST + 1, "the five changes as one write"
    assert h.loop.next_due() is None


def test_once_the_window_passed_on_the_loops_clock_a_change_is_written_at_once(h: Harness) -> None:
    for _ in range(PERSIST_BURST):
        h.file.changed()
    h.clock.now += PERSIST_WINDOW_S
    h.file.changed()
    assert h.builds == PERSIST_BURST + 1, "the burst's window is over: no wait"
    assert h.loop.next_due() is None


def test_a_final_state_is_written_at_once_even_in_a_burst(h: Harness) -> None:
    """What a SIGKILL right after it leaves for ``status`` must say how the phase ended."""
    for _ in range(PERSIST_BURST):
        h.file.changed()
    h.file.changed(SimpleNamespace(state=PhaseState.RUNNING))
    assert h.builds == PERSIST_BURST
    h.file.changed(SimpleNamespace(state=PhaseState.FAILED))
    assert h.builds == PERSIST_BURST + 1
    assert h.loop.next_due() is None, "the waiting write went out with it: no second one"


def test_a_write_that_fails_is_said_once_and_its_recovery_said(h: Harness) -> None:
    shutil.rmtree(h.state_dir)
    for _ in range(3):
        h.file.changed()
        h.clock.now += PERSIST_WINDOW_S
    assert len(h.said) == 1 and h.said[0].startswith(f"status: cannot write {h.file.path}: No such file or "
                                                     "directory; it is tried again at each change"), h.said
    h.state_dir.mkdir()
    h.file.changed()
    assert h.said[1:] == [f"status: {h.file.path} written again"]
    assert h.on_disk() == h.builds
    h.file.changed()
    assert len(h.said) == 2


def test_a_save_by_hand_cancels_the_waiting_write(h: Harness) -> None:
    for _ in range(PERSIST_BURST + 1):
        h.file.changed()
    assert h.loop.next_due() is not None
    h.file.save()
    assert h.loop.next_due() is None


def test_nothing_persisted_yet(tmp_path: Path) -> None:
    assert load_persisted(tmp_path) == (None, f"no {tmp_path / state_files.STATUS_FILE}")


# What every supervisor has written since the first: a JSON object without it is no snapshot (model.REQUIRED).
MINIMAL = {"pid": 42, "written_at": 2.0, "lifecycle": {}, "phases": []}


def test_a_persisted_snapshot_is_read_back(tmp_path: Path) -> None:
    snap = {**MINIMAL, "started_at": 1.0, "lifecycle": {"state": "running", "why": None, "current": "p"}}
    state_files.path(tmp_path, state_files.STATUS_FILE).write_text(json.dumps(snap))
    assert load_persisted(tmp_path) == (snap, None)


def test_unreadable_and_wrong_shaped_files_say_why(tmp_path: Path) -> None:
    path = state_files.path(tmp_path, state_files.STATUS_FILE)
    path.write_text("{half")
    data, why = load_persisted(tmp_path)
    assert data is None and why is not None and why.startswith(f"{path} is unreadable (JSONDecodeError: ")
    assert why.endswith("; ignoring it")
    path.write_text(json.dumps({**MINIMAL, "phases": [{"name": "p", "state": 3}]}))
    assert load_persisted(tmp_path) == (None, f"{path} does not hold a status snapshot (phases[0].state: whole "
                                              "number where string belongs); ignoring it")
    # An empty object, or another program's: no saved state, never a supervisor "pid None" that is gone.
    for other, missing in (({}, "pid"), ({"foo": 1}, "pid"), ({"pid": 7, "phases": []}, "written_at"),
                           ({**MINIMAL, "lifecycle": None}, "lifecycle")):
        path.write_text(json.dumps(other))
        data, why = load_persisted(tmp_path)
        assert data is None and why is not None and why.startswith(f"{path} does not hold a status snapshot "
                                                                   f"({missing}: "), (other, why)


@pytest.mark.parametrize(("data", "problem"), [
    ([], "a JSON array, not an object"),
    (None, "a JSON null, not an object"),
    ({"phases": [{"state": "running"}]}, "phases[0].name: missing"),
    ({"phases": [{"name": "p", "state": "s", "attempt": 1.5}]},
     "phases[0].attempt: number where whole number or null belongs"),
    ({"phases": [{"name": "p", "state": "s", "attempt": True}]},
     "phases[0].attempt: true where whole number or null belongs"),
    ({"written_at": float("inf")}, "written_at: inf is not a finite number"),
    ({"written_at": 10 ** 400}, "written_at: a number too big to be ours"),  # (math.isfinite raised on it)
    ({"pid": -(10 ** 30)}, "pid: a number too big to be ours"),
    ({"manager": {"enabled": 1}}, "manager.enabled: whole number where boolean or null belongs"),
    ({"children": [{"label": "p/c", "pid": 1, "state": "running", "usage": {"rss": 1.5}, "last_lines": []}]},
     "children[0].usage.rss: number where whole number or null belongs"),
    ({"children": [{"label": "p/c", "pid": 1, "state": "running", "last_lines": ["ok", 2]}]},
     "children[0].last_lines[1]: whole number where string belongs"),
    ({"gpus": {"samples": {}}}, "gpus.samples: not a list"),
    ({"memory": "per-phase"}, "memory: not an object"),
])
def test_the_first_place_a_snapshot_differs_is_named(data: Any, problem: str) -> None:
    assert snapshot_problem({**MINIMAL, **data} if isinstance(data, dict) else data) == problem


def test_sections_missing_or_null_where_null_belongs_are_no_problem() -> None:
    assert snapshot_problem(MINIMAL) is None
    child = {"label": "p/c", "pid": 1, "state": "running", "usage": None, "last_lines": [],
             "started_at": None, "last_output_at": 3}
    assert snapshot_problem({**MINIMAL, "children": [child], "manager": {"url": None},
                             "gpus": {"unresponsive": None}}) is None
    assert snapshot_problem({**MINIMAL, "unknown_key": object(), "verdicts": [{"line": "x", "extra": 1}]}) is None


def test_what_every_supervisor_writes_must_be_there() -> None:
    assert snapshot_problem({}) == "pid: missing"
    for key in MINIMAL:
        assert snapshot_problem({k: v for k, v in MINIMAL.items() if k != key}) == f"{key}: missing", key
    assert snapshot_problem({**MINIMAL, "pid": None}) == "pid: null where whole number belongs"


HUGE = "1" + "0" * 400  # a JSON number, whole, too big for a float


@pytest.mark.parametrize(("name", "text"), [
    ("resume.json", '{"version": 1, "phases": {"fetch": {"done_at": HUGE}}}'),
    ("first-seen.json", '{"first_start": HUGE}'),
    ("given-up.json", '{"at": HUGE, "reason": "x"}'),
])
def test_a_number_too_big_for_a_float_is_a_state_file_not_what_it_holds(tmp_path: Path, name: str, text: str) -> None:
    # float() and math.isfinite() raise OverflowError on it: it escaped the "one line, start clean" of a state
    # file, and the supervisor died with a traceback at every start until the file was deleted.
    (tmp_path / name).write_text(text.replace("HUGE", HUGE))
    said: list[str] = []
    if name == "resume.json":
        record = resume.load_record(tmp_path, ["fetch"], said.append)
        assert record.previous("fetch") == {} and "int too large to convert to float" in said[0], said
    elif name == "first-seen.json":
        firstseen.FirstSeen(tmp_path, said.append)  # (it raised)
        assert said == []  # JSON, but no times of ours: nothing of ours was lost, the clocks start afresh
    else:
        recalled = givenup.recall(tmp_path)  # (it raised): a record it cannot read still means given up
        assert recalled is not None and f"{name} is unreadable" in recalled.reason, recalled
