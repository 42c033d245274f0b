"""rowwatch.py against the in-process dev-manager on 127.0.0.1: one bounded look-up at a time, one that failed
slowly not tried again for FAILED_AGAIN_S (one that failed at once is), the periodic read only once the manager
knows the instance, and /runner-id's word on forgotten (404) against killed (200). Then through the sender (a
real one, its outbox and loop): a row that cannot be read, for whatever reason, is no usable answer, never the
failure of the call it came before nor of the registration; a bug of ours met reading it is said, with its
traceback."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests

from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager
from supervisor.engine.loop import EventLoop
from supervisor.manager.callkinds import CallKinds
from supervisor.manager.client import ManagerClient
from supervisor.manager.outbox import Outbox
from supervisor.manager.row import RowFields
from supervisor.manager.rowwatch import FAILED_AGAIN_S, SLOW_FAILURE_S, RowWatch
from supervisor.manager.sender import Sender

WAIT_S = 30.0  # an upper bound against hanging, never a measure


def watch(mgr: DevManager, clock: list[float]) -> RowWatch:
    spec = ManagerSpec(url=mgr.url, connect_timeout_s=2, read_timeout_s=2)
    return RowWatch(ManagerClient(spec), 300.0, now=lambda: clock[0], mono=lambda: clock[0])


def register(mgr: DevManager, label: str = "C.12") -> str:
    return str(requests.post(mgr.url + "/register", json={"label": label}, timeout=5).json()["uuid"])


def test_the_row_is_read_and_a_killed_one_says_so(manager: DevManager) -> None:
    uuid = register(manager)
    clock = [time.time()]
    rows = watch(manager, clock)
    reading, notes = rows.read(uuid)
    assert reading.row is not None and reading.row.state == "registered" and not reading.killed and notes == []
    requests.post(manager.url + "/api/kill", json={"uuid": uuid}, timeout=5)
    reading, _ = rows.read(uuid)
    assert reading.killed and reading.shown().startswith("state killed (the manager killed this instance at ")
    assert reading.shown().endswith(": manually killed via UI)")


def test_a_uuid_not_listed_is_unknown_and_runner_id_tells_forgotten_from_killed(manager: DevManager) -> None:
    uuid = register(manager)
    rows = watch(manager, [time.time()])
    assert rows.gone(uuid) is False
    requests.post(manager.url + "/api/kill", json={"uuid": uuid}, timeout=5)
    assert rows.gone(uuid) is False  # a killed row is kept: not forgotten
    requests.post(manager.url + "/dev/forget", json={"uuid": uuid}, timeout=5)
    assert rows.gone(uuid) is True
    reading, _ = rows.read(uuid)
    assert reading.row is None and reading.unlisted and reading.shown().startswith("unknown to the manager")


def test_a_404_of_another_text_says_nothing_of_the_row(manager: DevManager) -> None:
    """A /runner-id route that is not there (a proxy's ``404 page not found``, a manager without the route) was
    read as the row gone: a killed label, its /running refused with the same 404 as a forgotten uuid's, was
    registered again. Only the manager's ``instance not found`` says the row is gone."""
    uuid = register(manager)
    rows = watch(manager, [time.time()])
    requests.post(manager.url + "/api/kill", json={"uuid": uuid}, timeout=5)
    fault = {"status": 404, "count": 1, "path": "/runner-id"}
    assert requests.post(manager.url + "/dev/faults", json=fault, timeout=5).status_code == 200
    assert rows.gone(uuid) is None  # (the fault's 404: {"error": "injected fault"})
    assert rows.gone(uuid) is False  # the manager's own answer: the killed row is kept


def test_a_look_up_that_failed_at_once_is_tried_again_at_the_next_call(manager: DevManager) -> None:
    # One 500 left the reads before the lifecycle calls undone for 30 s: a passing bench-done then un-killed a
    # row the UI had killed meanwhile (the reviewer's run). A failure that cost nothing spares nothing.
    uuid = register(manager)
    clock = [time.time()]
    rows = watch(manager, clock)
    requests.post(manager.url + "/dev/faults", json={"status": 500, "count": 1, "path": "/status"}, timeout=5)
    first, _ = rows.read(uuid)
    assert first.row is None and not first.unlisted and first.error is not None and "HTTP 500" in first.error
    requests.post(manager.url + "/api/kill", json={"uuid": uuid}, timeout=5)
    again, _ = rows.read(uuid)
    assert len(manager.state.snapshot()["reads"]) == 2
    assert again.row is not None and again.killed


class _BlackHole(BaseHTTPRequestHandler):
    """Every GET /status answered 504 only after a gateway's whole wait: ``clock`` (the watch's) moves on by
    that much while it is served."""

    clock: ClassVar[list[float]] = [0.0]
    served = 0

    def do_GET(self) -> None:
        _BlackHole.served += 1
        _BlackHole.clock[0] += 20 * SLOW_FAILURE_S
        body = b'{"error": "gateway timeout"}'
        self.send_response(504)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_look_up_that_failed_slowly_is_not_tried_again_for_a_while() -> None:
    # A black-holed GET /status costs each lifecycle call a whole deadline more: spared for FAILED_AGAIN_S.
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlackHole)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        clock = _BlackHole.clock = [time.time()]
        spec = ManagerSpec(url=f"http://127.0.0.1:{server.server_address[1]}", connect_timeout_s=2, read_timeout_s=2)
        rows = RowWatch(ManagerClient(spec), 300.0, now=lambda: clock[0], mono=lambda: clock[0])
        first, _ = rows.read("u")
        assert first.error is not None and "HTTP 504" in first.error and _BlackHole.served == 1
        clock[0] += FAILED_AGAIN_S - 1
        assert rows.read("u")[0] is first  # the manager was not asked: the call it came before goes at once
        assert _BlackHole.served == 1
        clock[0] += 2
        again, _ = rows.read("u")
        assert again is not first and _BlackHole.served == 2
    finally:
        server.shutdown()
        server.server_close()


def test_a_watch_that_cannot_read_says_so_at_once_again_for_another_cause_and_when_it_reads_again(
        manager: DevManager) -> None:
    """The row read is the only way to learn of the UI's kill or a forget before the next lifecycle call: a
    GET /status that always fails was only kept as "not read (...)" in status, and nothing was said."""
    uuid = register(manager)
    clock = [time.time()]
    rows = watch(manager, clock)
    faults = manager.url + "/dev/faults"
    requests.post(faults, json={"status": 404, "path": "/status"}, timeout=5)
    _, lines = rows.read(uuid)
    assert lines == ['row watch: no reading (GET /status: HTTP 404: {"error": "injected fault"}); the manager\'s '
                     "own kill or forget of this instance is learnt only at a lifecycle call's answer meanwhile"]
    clock[0] += FAILED_AGAIN_S + 1
    assert rows.read(uuid)[1] == [], "the same cause is said once"
    requests.post(faults, json={"huge_body_bytes": 5 * 1024 * 1024, "path": "/status"}, timeout=5)
    clock[0] += FAILED_AGAIN_S + 1
    assert rows.read(uuid)[1] == ["row watch: still no reading, for another cause (GET /status: answer larger "
                                  "than 4096 KiB)"]
    requests.post(faults, json={}, timeout=5)
    clock[0] += FAILED_AGAIN_S + 1
    reading, lines = rows.read(uuid)
    assert reading.row is not None and len(lines) == 1, lines
    assert re.fullmatch(r"row watch: reading again after \d+ s without one", lines[0]), lines
    assert rows.state.current == "reading" and rows.state.misses == 3


class _Varying(BaseHTTPRequestHandler):
    """Every GET /status answered 503 with a body of its own (a proxy's request id, a time)."""

    served = 0

    def do_GET(self) -> None:
        _Varying.served += 1
        body = json.dumps({"error": "upstream unavailable", "request_id": f"req-{_Varying.served}-{time.time()}"})
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_a_cause_is_the_answers_status_not_the_body_that_came_with_it() -> None:
    # A 503 whose body carries a request id was "another cause" at every read: the blind line said each time.
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Varying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        clock = [time.time()]
        spec = ManagerSpec(url=f"http://127.0.0.1:{server.server_address[1]}", connect_timeout_s=2, read_timeout_s=2)
        rows = RowWatch(ManagerClient(spec), 300.0, now=lambda: clock[0], mono=lambda: clock[0])
        said = []
        for _ in range(4):
            said += rows.read("u")[1]
            clock[0] += FAILED_AGAIN_S + 1
        assert _Varying.served == 4
        assert len(said) == 1 and said[0].startswith("row watch: no reading (GET /status: HTTP 503: "), said
    finally:
        server.shutdown()
        server.server_close()


def test_the_periodic_read_is_due_only_once_the_manager_knows_the_instance(manager: DevManager) -> None:
    clock = [time.time()]
    rows = watch(manager, clock)
    assert not rows.due()
    rows.soon()
    assert rows.due()
    rows.read(register(manager))
    assert not rows.due()
    clock[0] += 300.0
    assert rows.due()


def test_a_time_from_the_future_is_said_once_whenever_it_is_read_again(manager: DevManager) -> None:
    """The refusal's line names the moment it was read; the same field and value is said once all the same
    (two reads a second apart once said it twice)."""
    uuid = register(manager)
    clock = [time.time()]
    rows = watch(manager, clock)
    requests.post(manager.url + "/dev/row", json={"uuid": uuid, "registered_at": clock[0] + 3600}, timeout=5)
    reading, notes = rows.read(uuid)
    assert reading.row is not None and reading.row.registered_at is None
    assert len(notes) == 1 and "registered_at" in notes[0] and "impossible, not used" in notes[0], notes
    clock[0] += 1.5  # another second: the line would read differently
    assert rows.read(uuid)[1] == []
    clock[0] += 400
    assert rows.read(uuid)[1] == []


def test_a_time_written_while_a_slow_read_was_on_its_way_is_judged_at_its_answer(manager: DevManager) -> None:
    """A look-up may take a whole call deadline, and connect_timeout_s + read_timeout_s have no upper bound: a
    kill the manager wrote while the answer was on its way is no time from the future (one judged at the ask,
    300 s before, was refused, and its killed_at lost)."""
    uuid = register(manager)
    requests.post(manager.url + "/api/kill", json={"uuid": uuid}, timeout=5)
    asked = [time.time() - 300]  # the ask; every later look at the clock is the answer's time
    spec = ManagerSpec(url=manager.url, connect_timeout_s=2, read_timeout_s=2)
    rows = RowWatch(ManagerClient(spec), 300.0, now=lambda: asked.pop() if asked else time.time(), mono=time.monotonic)
    reading, notes = rows.read(uuid)
    assert notes == [] and reading.row is not None and reading.row.killed_at is not None, notes

def test_a_step_of_the_wall_clock_does_not_hold_up_the_reads(manager: DevManager) -> None:
    # The reads were paced on the wall clock: stepped back an hour (NTP, a VM resumed), no periodic read came for
    # an hour, and a failed one was held as the latest for as long.
    wall, mono = [time.time()], [1000.0]
    spec = ManagerSpec(url=manager.url, connect_timeout_s=2, read_timeout_s=2)
    rows = RowWatch(ManagerClient(spec), 300.0, now=lambda: wall[0], mono=lambda: mono[0])
    uuid = register(manager)
    rows.soon()
    rows.read(uuid)
    wall[0] -= 3600
    mono[0] += 300.0
    assert rows.due()
    requests.post(manager.url + "/dev/faults", json={"status": 500, "count": 1, "path": "/status"}, timeout=5)
    failed, _ = rows.read(uuid)
    assert failed.error is not None
    wall[0] -= 3600
    mono[0] += FAILED_AGAIN_S + 1
    again, _ = rows.read(uuid)
    assert again.error is None and again.row is not None and again.at == wall[0]



def test_a_manager_whose_clock_lags_ours_has_its_times_read_on_ours(tmp_path) -> None:
    """The manager's host runs two hours behind: its registered_at of a registration made now read as two hours
    ago, and a download whose 90 minutes had just begun was given up at once as too slow (its instance destroyed
    by the give-up's rate 0). Its answers' Date says how far behind it is, and its times are read on our clock."""
    import subprocess
    import sys

    lagging = subprocess.Popen(
        [sys.executable, "-c", "import time\n_real = time.time\ntime.time = lambda: _real() - 7200\n"
         "from supervisor.app.cli import dev_manager\nm = dev_manager(0, quiet=True)\nprint(m.url, flush=True)\n"
         "m._server.serve_forever()\n"], stdout=subprocess.PIPE, text=True)
    try:
        url = lagging.stdout.readline().strip() if lagging.stdout else ""
        uuid = str(requests.post(url + "/register", json={"label": "C.77"}, timeout=5).json()["uuid"])
        rows = RowWatch(ManagerClient(ManagerSpec(url=url, connect_timeout_s=2, read_timeout_s=2)), 300.0)
        reading, notes = rows.read(uuid)
        assert reading.row is not None and reading.row.registered_at is not None
        assert abs(reading.row.registered_at - time.time()) < 10, reading.row  # not 7200 s ago
        [note] = notes
        assert re.fullmatch(r"the manager's clock is 720[0-2]s behind ours \(its answer's Date\): its row's times "
                            r"are read on ours", str(note)), note
        assert rows.read(uuid)[1] == [], "said once"
    finally:
        lagging.kill()
        lagging.wait(10)


# ---------------------------------------------------------------- through the sender


class Sending:
    """A real Sender on its outbox and loop against the dev-manager, a plugin's number (``fields``) in its row;
    what it logs, the identities it exports, and what the loop's faults say (a contained bug's traceback)."""

    def __init__(self, mgr: DevManager, tmp_path: Path, fields: RowFields) -> None:
        self.mgr = mgr
        spec = ManagerSpec(url=mgr.url, label=LABEL, connect_timeout_s=2, read_timeout_s=2)
        self.loop = EventLoop()
        self.lines: list[str] = []
        self.faults: list[str] = []
        self.loop.faults.log = self.faults.append
        self.identities: list[str] = []
        calls = CallKinds()
        calls.row = fields
        self.outbox = Outbox(tmp_path / "outbox.sqlite3")
        self.sender = Sender(spec, self.outbox, ManagerClient(spec), self.loop, self.lines.append, calls,
                             on_identity=lambda uuid, fields: self.identities.append(uuid))

    def run_until(self, done: Any) -> None:
        deadline = time.monotonic() + WAIT_S
        self.loop.run_until(lambda: done() or time.monotonic() > deadline, 0.02)
        assert done(), f"not done within {WAIT_S:g}s; log: {self.lines}; faults: {self.faults}"

    def close(self) -> None:
        self.sender.ask_to_stop()
        self.sender.join(WAIT_S)
        self.outbox.close()
        self.loop.close()


LABEL = "C.13"


@pytest.fixture
def sending(manager: DevManager, tmp_path: Path) -> Iterator[Any]:
    made: list[Sending] = []

    def make(fields: RowFields) -> Sending:
        made.append(Sending(manager, tmp_path, fields))
        return made[-1]

    yield make
    for each in made:
        each.close()


def our_row_answers(mgr: DevManager, **fields: Any) -> str:
    """The label registered (the uuid the sender will be answered: registering is idempotent per label), and
    from now on GET /status answering our row with ``fields``."""
    uuid = register(mgr, LABEL)
    row = {"uuid": uuid, "label": LABEL, "runner_id": 1, "state": "registered", **fields}
    answer = requests.post(mgr.url + "/dev/faults", json={"path": "/status", "answer": [row], "count": -1}, timeout=5)
    assert answer.status_code == 200, answer.text
    return uuid


def delivered_param_done(s: Sending) -> None:
    """Registered, then param-done queued: both must be delivered whatever the row read says."""
    s.sender.restore_identity()
    param_done = s.outbox.add("param-done", {})
    s.sender.start()
    s.run_until(lambda: not s.outbox.is_pending(param_done))
    states = {row["kind"]: row["state"] for row in s.outbox.history()}
    assert states == {"register": "delivered", "param-done": "delivered"}, s.outbox.history()


def test_a_number_no_float_holds_is_no_usable_answer_not_a_failed_call(sending: Any, manager: DevManager) -> None:
    """A 400-digit min_rate (valid JSON) raised OverflowError out of the row's check: the registration's
    identity was never exported and param-done was failed for good as "a bug of ours"."""
    uuid = our_row_answers(manager, score=10**400)
    s = sending(RowFields(numbers={"score": 100.0}))
    delivered_param_done(s)
    assert s.identities == [uuid], s.lines
    assert manager.state.snapshot()["instances"][uuid]["state"] == "params_done"
    latest = s.sender.rows.latest
    assert latest is not None and latest.error is not None and "score is not a number in 0..100" in latest.error
    assert s.faults == [] and not any("failed for good" in line for line in s.lines), s.lines


def test_a_bug_of_ours_reading_the_row_is_said_and_fails_no_call(sending: Any, manager: DevManager) -> None:
    # A plugin's declaration that cannot work (its maximum is text): comparing a row's number with it raises.
    uuid = our_row_answers(manager, score=5)
    s = sending(RowFields(numbers={"score": "100"}))  # type: ignore[dict-item]
    delivered_param_done(s)
    assert s.identities == [uuid], s.lines
    s.run_until(lambda: bool(s.faults))
    said = s.faults[0]
    assert said.startswith("internal error in reading the manager's row: ") and said.endswith(
        "(contained; the supervisor goes on)"), s.faults
    assert any("supervisor/manager/row.py" in line for line in s.faults), "with its traceback"
    latest = s.sender.rows.latest
    assert latest is not None and latest.error is not None
    assert latest.error.startswith("GET /status: not read, a bug of ours: "), latest.error
    assert not any("failed for good" in line for line in s.lines), s.lines


def test_a_blind_row_watch_is_said_in_the_supervisors_log(sending: Any, manager: DevManager) -> None:
    requests.post(manager.url + "/dev/faults", json={"status": 404, "path": "/status"}, timeout=5)
    s = sending(RowFields())
    delivered_param_done(s)  # (read at the registration and before param-done: the same cause, said once)
    said = [line for line in s.lines if "row watch" in line]
    assert said == ['manager: row watch: no reading (GET /status: HTTP 404: {"error": "injected fault"}); the '
                    "manager's own kill or forget of this instance is learnt only at a lifecycle call's answer "
                    "meanwhile"], s.lines


def test_a_kill_right_after_one_failed_read_still_holds_back_the_next_lifecycle_call(
        sending: Any, manager: DevManager) -> None:
    """The reviewer's run, through the sender: the read at the registration met one 500, the UI killed the row a
    second later, and the next lifecycle call went out unread (a passing bench-done would have un-killed it)."""
    requests.post(manager.url + "/dev/faults", json={"status": 500, "count": 1, "path": "/status"}, timeout=5)
    s = sending(RowFields())
    s.sender.restore_identity()
    s.sender.start()
    s.run_until(lambda: s.sender.uuid is not None and s.sender.rows.latest is not None)
    latest = s.sender.rows.latest
    assert latest is not None and latest.error is not None and "HTTP 500" in latest.error
    requests.post(manager.url + "/api/kill", json={"uuid": s.sender.uuid}, timeout=5)
    param_done = s.outbox.add("param-done", {})
    s.sender.wake()
    s.run_until(lambda: not s.outbox.is_pending(param_done))
    states = {row["kind"]: row["state"] for row in s.outbox.history()}
    assert states == {"register": "delivered", "param-done": "failed"}, s.outbox.history()
    s.run_until(lambda: any(line.startswith("manager: param-done not sent: the manager killed this instance")
                            for line in s.lines))
