"""rowwatch.py against the in-process dev-manager on 127.0.0.1: one bounded look-up at a time, a failed one
not tried again for FAILED_AGAIN_S, the periodic read only once the manager knows the instance, and
/runner-id's word on forgotten (404) against killed (200)."""

from __future__ import annotations

import re
import time

import requests

from supervisor.config import ManagerSpec
from supervisor.devmanager.server import DevManager
from supervisor.manager.client import ManagerClient
from supervisor.manager.rowwatch import FAILED_AGAIN_S, RowWatch


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
    assert reading.row is None and reading.listed and reading.shown().startswith("unknown to the manager")


def test_a_failed_look_up_is_not_tried_again_for_a_while(manager: DevManager) -> None:
    uuid = register(manager)
    clock = [time.time()]
    rows = watch(manager, clock)
    requests.post(manager.url + "/dev/faults", json={"status": 500, "count": 1, "path": "/status"}, timeout=5)
    first, _ = rows.read(uuid)
    assert first.row is None and not first.listed and first.error is not None and "HTTP 500" in first.error
    clock[0] += FAILED_AGAIN_S - 1
    assert rows.read(uuid)[0] is first  # the manager was not asked: the call it came before goes at once
    assert len(manager.state.snapshot()["reads"]) == 1
    clock[0] += 2
    again, _ = rows.read(uuid)
    assert again.row is not None and len(manager.state.snapshot()["reads"]) == 2


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
