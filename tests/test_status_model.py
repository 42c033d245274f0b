"""supervisor.status.model in-process: the typed snapshot and its JSON. What the supervisor writes (every section
filled: a failure, each timer, a phase's cgroup, a plugin's keys, a child in its grace, GPU samples and a hung call,
a memory_high, the manager's row, clocks and ledger, the exit waiting, a gone writer's survivors) comes back out of
``from_json``/``to_json`` key for key and in order; a snapshot survives JSON unchanged; and a file of an older or
broken supervisor (any key missing, or of any other type) is read without an exception and still shown as text,
headline and metrics."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from supervisor.status.file import snapshot_problem
from supervisor.status.headline import alive_lines, failure_lines, headline
from supervisor.status.health import metrics_text
from supervisor.status.model import GONE, Fate, PhaseStatus, Snapshot, Survivor, Timers
from supervisor.status.render import render

NOW = 1_800_000_000.0


def written() -> dict[str, Any]:
    """A snapshot as a supervisor writes it, with every section there is (status --json adds the writer's fate)."""
    return {
        "version": 1, "pid": 4242, "pid_ns": 4026531836, "pid_start": 1234567, "role": "subreaper",
        "started_at": NOW - 3600,
        "written_at": NOW - 5,
        "config": "/etc/prover/config.toml",
        "lifecycle": {"state": "stopping", "why": "bench failed", "exit_status": 1, "current": "bench",
                      "failure": {"phase": "bench", "child": "cuzk", "reason": "exited", "detail": "exited with code 3",
                                  "status": 1, "exit_code": 3, "signal": None, "at": NOW - 60,
                                  "line": "phase=bench child=cuzk reason=exited", "last_lines": ["a", "b"],
                                  "log_file": "/var/log/prover/bench.cuzk.log"}},
        "phases": [
            {"name": "fetch", "kind": "oneshot", "state": "done", "since": NOW - 900, "why": "completed",
             "attempt": 2, "up": False, "hold": "until the manager says",
             "progress": {"done_bytes": 10, "total_bytes": 20, "rate_bytes_s": 1.5, "eta_s": 6.7, "files_done": 1},
             "facts": {"done_at": NOW - 900, "machine": {"gpus": [], "memory": 1 << 34}},
             "started_at": NOW - 1000, "up_at": None, "up_since": None, "ended_at": NOW - 900,
             "timers": {"hold": {"left_s": 48.0}}, "memory": {"memory_max": 1 << 30, "cgroup": False}},
            {"name": "bench", "kind": "service", "state": "starting", "since": NOW - 60, "why": "attempt 3",
             "attempt": 3, "up": True, "hold": None, "progress": None,
             "facts": {}, "started_at": NOW - 800, "up_at": NOW - 700, "up_since": NOW - 650, "ended_at": None,
             "timers": {"deadline": {"limit_s": 600.0, "left_s": 500.0}, "backoff": {"left_s": 2.5},
                        "stall": {"limit_s": 60.0, "silent_s": 10.0, "left_s": 50.0,
                                  "signs": {"output": 10.0, "I/O": 2.0}},
                        "ready": {"child": "bench/cuzk", "limit_s": 30.0, "waited_s": 20.0, "left_s": 10.0}},
             "memory": {"memory_max": 1 << 30, "cgroup": True, "usage": 1 << 20, "peak": 1 << 21, "limit": 1 << 30,
                        "oom_kills": 1},
             # What its output parser keeps, under the fact's name (Phase.kept_as), then a plugin's own keys.
             "bench": {"rate": 12.5, "proofs": 4},
             "proofs_completed": 7, "summary": "7 proofs", "metrics": {"proofs_completed": 7},
             "production": {"window_s": 3600, "rate_per_hour": None}},
        ],
        "children": [{"label": "bench/cuzk", "pid": 77, "phase": "bench", "state": "stopping",
                      "started_at": NOW - 50, "last_output_at": None,
                      "usage": {"processes": 2, "cpu_s": 1.25, "rss": 1 << 24},
                      "stop": {"grace_s": 10.0, "kill_in_s": 7.0}, "last_lines": ["serving", "\x1b[31mred\x1b[0m"],
                      "log_from": 4096, "left": [78]}],
        "gpus": {"available": True, "why": "", "samples": [{"index": 0, "name": "H200", "utilization": 97,
                                                            "memory_used": 1 << 33, "memory_total": 1 << 37}],
                 "left_out": [{"index": 1, "why": "no handle: NVMLError_GpuIsLost: GPU is lost"}],
                 "unresponsive": {"call": "nvmlDeviceGetUtilizationRates (GPU 0)", "since": NOW - 40, "for_s": 40.0},
                 "slow_calls": 2, "sampled_s_ago": 41.5, "samples_stale": True},
        "watches": {"GPU sampling": {"state": "blind", "since": NOW - 100, "last_reading_s_ago": 100.0,
                                     "why": "timed out", "window_s": 30.0, "readings": 5, "misses": 2, "failures": 0},
                    "memory watch": {"state": "reading", "since": NOW - 3000, "last_reading_s_ago": None,
                                     "why": None, "window_s": 30.0, "readings": 300, "misses": 0, "failures": 0}},
        "memory": {"mode": "per-phase", "why": "cgroup v2", "snapshot": "usage=1.0GiB", "usage": 1 << 30,
                   "limit": 1 << 34, "peak": 1 << 31, "oom_kills": 0,
                   "warnings": {"bench": {"at": NOW - 70, "fraction": 0.951, "limit": 1 << 30,
                                          "line": "memory_high: bench at 95%"}}},
        "logs": {"dir": "/var/log/prover", "supervisor": "/var/log/prover/supervisor.log"},
        "manager": {"enabled": True, "url": "https://m.example", "label": "C.1", "uuid": "u-1", "runner_id": "r-9",
                    "outbox_pending": 1, "last_delivered": {"kind": "running", "id": 4, "at": NOW - 30},
                    "last_error": "503 from the manager", "last_error_at": NOW - 20,
                    "ledger": [{"id": 4, "kind": "running", "state": "delivered", "attempts": 1, "created": NOW - 31,
                                "finished": NOW - 30, "carried": {"rate": 12.5}, "answer": {"passed": False},
                                "last_error": None}],
                    "log_backlog": {"setup": 3},
                    "log_push_error": "POST /api/log-push: HTTP 500: {}", "log_push_error_at": NOW - 2,
                    "log_dropped": {"setup": {"lines": 7, "bytes": 420}},
                    "row": {"at": NOW - 15, "row": {"uuid": "u-1", "state": "killed"}, "unlisted": False, "error": None,
                            "shown": "state killed"},
                    "killed": "the manager killed this instance: too slow",
                    "clocks": {"fetch": {"at": NOW - 2000, "source": "the first start"},
                               "bench": {"at": NOW - 800, "source": "the manager's params_done_at",
                                         "deadline_s": 3600.0}}},
        "verdicts": [{"phase": "bench", "child": "cuzk", "pid": 77, "reason": "exited", "success": False,
                      "status": 1, "detail": "exited with code 3", "attempt": 2, "started_at": NOW - 200,
                      "ended_at": NOW - 60, "exit_code": 3, "signal": None, "core_dumped": False, "oom_kills": None,
                      "memory_peak": None, "memory_scope": "phase", "last_lines": ["a", "b"],
                      "line": "phase=bench child=cuzk reason=exited"}],
        "exiting": {"status": 1, "flush_left_s": 12.5, "giving_up": True},
        "listening": True,
        "supervisor": "gone", "gone_since": NOW - 5, "survivors": [{"pid": 77, "name": "cuzk", "tag": "4242.3"}],
    }


def test_what_the_supervisor_writes_comes_back_out_key_for_key_and_in_order() -> None:
    data = written()
    again = Snapshot.from_json(data).to_json()
    assert again == data
    assert json.dumps(again) == json.dumps(data), "the same keys in the same order"


def test_what_the_supervisor_writes_passes_the_gate_its_types_make() -> None:
    # The gate before from_json (file.snapshot_problem) is drawn from the same declared types: every section
    # the supervisor writes passes it, and a field of any part that is of another type is named, where it is.
    assert snapshot_problem(written()) is None
    # Every section may be missing but what every supervisor has written (an empty object is no snapshot).
    assert snapshot_problem({"pid": 1, "written_at": 2.0, "lifecycle": {}, "phases": []}) is None
    assert snapshot_problem({}) == "pid: missing"
    broken = written()
    broken["watches"]["GPU sampling"]["readings"] = "many"
    assert snapshot_problem(broken) == "watches.GPU sampling.readings: string where whole number or null belongs"
    broken = written()
    broken["manager"]["ledger"][0] = None
    assert snapshot_problem(broken) == "manager.ledger[0]: not an object"
    broken = written()
    del broken["verdicts"][0]["line"]
    assert snapshot_problem(broken) == "verdicts[0].line: missing"
    broken = written()
    broken["phases"][0]["timers"]["stall"] = {"limit_s": float("nan")}
    assert snapshot_problem(broken) == "phases[0].timers.stall.limit_s: nan is not a finite number"


def test_a_gpu_whose_utilisation_is_not_measured_passes_the_gate_and_is_shown_so() -> None:
    # A MIG GPU's sample has no utilisation: the socket's answer was refused as "not a snapshot", and status
    # called a live supervisor "not answering".
    data = written()
    data["gpus"]["samples"][0]["utilization"] = None
    assert snapshot_problem(data) is None
    snap = Snapshot.from_json(data)
    assert snap.gpus.samples[0].utilization is None
    assert "gpu 0: H200 util not measured mem " in render(snap, live=True, now=NOW)


def test_gpu_figures_that_are_not_current_are_shown_with_their_age() -> None:
    # NVML hung 40 s: the last figures were printed as if sampled now.
    shown = render(Snapshot.from_json(written()), live=True, now=NOW)
    assert "gpu 0: H200 util 97% mem 8.0GiB/128.0GiB (last sampled 41.5s ago: not current)" in shown, shown
    data = written()
    data["gpus"]["samples_stale"] = False
    assert "gpu 0: H200 util 97% mem 8.0GiB/128.0GiB\n" in render(Snapshot.from_json(data), live=True, now=NOW)


def test_a_gpu_the_samples_lack_is_shown_with_why() -> None:
    # A GPU lost as NVML opened was in no line: status said "2 GPU(s) via NVML" and listed GPU 0 alone.
    shown = render(Snapshot.from_json(written()), live=True, now=NOW)
    assert "\ngpu 1: left out (no handle: NVMLError_GpuIsLost: GPU is lost)\n" in shown, shown


def test_a_deadline_of_the_manager_counts_down_only_while_the_supervisor_lives() -> None:
    # Read back from status.json after the supervisor ended, what became of the row is not known: a countdown
    # would go on ticking for an instance long given up. Its deadline is shown as the time it falls instead.
    data = {k: v for k, v in written().items() if k not in ("supervisor", "gone_since", "survivors")}
    snap = Snapshot.from_json(data)
    assert ", deadline 60m00s: 46m40s left" in render(snap, live=True, now=NOW)
    gone = render(Snapshot.from_json(written()), live=True, now=NOW)  # read live, but the supervisor is gone
    bench = next(line for line in gone.splitlines() if line.startswith("  bench clock: from "))
    assert "left" not in bench and "ago" not in bench, bench
    due = time.strftime("%H:%M:%S", time.gmtime(NOW - 800 + 3600))
    assert render(snap, live=False, now=NOW).count(f", deadline 60m00s: at {due} UTC") == 1
    assert bench.endswith(f", deadline 60m00s: at {due} UTC"), bench


def test_a_snapshot_survives_json_unchanged() -> None:
    snap = Snapshot.from_json(written())
    assert Snapshot.from_json(json.loads(json.dumps(snap.to_json()))) == snap


def test_the_parts_read_as_attributes() -> None:
    snap = Snapshot.from_json(written())
    bench = snap.current_phase()
    assert bench is not None and bench.name == "bench" and bench.timers.ready is not None
    assert bench.timers.ready.child == "bench/cuzk" and bench.timers.stall is not None
    assert bench.plugin == {"bench": {"rate": 12.5, "proofs": 4},
                            "proofs_completed": 7, "summary": "7 proofs", "metrics": {"proofs_completed": 7},
                            "production": {"window_s": 3600, "rate_per_hour": None}}, \
        "the plugin's keys (its parser's kept result among them), as a mapping"
    assert snap.manager.answers == {"runner_id": "r-9"}, "the plugin's register answer fields"
    assert snap.manager.clocks["bench"].deadline_s == 3600.0 and snap.manager.clocks["fetch"].deadline_s is None
    assert snap.verdicts[0].reason == "exited" and snap.lifecycle.failure is not None
    assert snap.gone and snap.fate == Fate(GONE, NOW - 5, (Survivor(77, "cuzk", "4242.3"),))


def test_sections_written_only_when_there_is_something_to_say() -> None:
    """No log_dir is ``{}``; no exit waiting and no fate are no keys at all; reporting off is ``enabled`` alone; only
    the timers running are written; a fate other than gone has no ``gone_since``; a phase without a cgroup says so
    alone."""
    bare = Snapshot().to_json()
    assert bare["logs"] == {} and bare["manager"] == {"enabled": False}
    assert "exiting" not in bare and "supervisor" not in bare and "survivors" not in bare
    assert Timers().to_json() == {}
    running = Snapshot(fate=Fate("running")).to_json()
    assert running["supervisor"] == "running" and running["survivors"] == [] and "gone_since" not in running
    phase = PhaseStatus.from_json({"name": "p", "memory": {"memory_max": 5, "cgroup": False, "usage": 3}})
    assert phase.to_json()["memory"] == {"memory_max": 5, "cgroup": False}


def test_an_empty_or_foreign_file_reads_as_unknown() -> None:
    for data in ({}, {"phases": "p", "lifecycle": [], "manager": None, "gpus": 3, "watches": ["w"], "logs": "x"}):
        snap = Snapshot.from_json(data)
        assert snap.pid is None and snap.phases == () and snap.lifecycle.state is None
        assert not snap.manager.enabled and snap.gpus.samples == () and snap.watches == {} and snap.logs is None
    odd = Snapshot.from_json({"pid": True, "started_at": math.nan, "written_at": "yesterday",
                              "phases": [None, 3, {"name": 7, "attempt": 1.5, "timers": {"hold": []}}]})
    assert odd.pid is None and odd.started_at is None and odd.written_at is None, "a bool or NaN is no number"
    (phase,) = odd.phases
    assert phase.name is None and phase.attempt is None and phase.timers == Timers()


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value: each key of each object and each item of each list."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*path, i)
            yield from _paths(item, (*path, i))


# (the last three: times no clock can show, a number past a float's range: a hand-edited file; they raised)
SPOILERS: list[Any] = [None, "x", -3, 2.5, math.inf, math.nan, True, [], [None], {}, {"k": None},
                       1e20, -1e20, 10 ** 400]


def _spoilt(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    spoilt = copy.deepcopy(data)
    where: Any = spoilt
    for step in path[:-1]:
        where = where[step]
    where[path[-1]] = value
    return spoilt


@pytest.mark.parametrize("live", [True, False])
def test_a_broken_file_is_shown_whatever_is_wrong_where(live: bool) -> None:
    """Each place of a full snapshot spoilt in turn (another type, null, NaN, gone): read, and shown as text, its
    headline and failure lines, and /metrics, without an exception; what is still right is still said."""
    data = written()
    places = list(_paths(data))
    assert len(places) > 200, "the test spoils every place of a full snapshot"
    for path in places:
        for value in SPOILERS:
            spoilt = _spoilt(data, path, value)
            snap = Snapshot.from_json(spoilt)
            text = render(snap, live, NOW)
            assert text.splitlines()[0] == headline(snap, live, NOW), (path, value)
            assert all(isinstance(line, str) for line in failure_lines(snap) + alive_lines(snap)), (path, value)
            assert metrics_text(snap).startswith("# HELP prover_supervisor_up"), (path, value)
            if path[0] != "pid" and path[0] != "supervisor":
                assert "4242" in text.splitlines()[0] or not snap.gone, (path, value)
        removed = _spoilt(data, path, None)
        parent: Any = removed
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict):
            del parent[path[-1]]
            snap = Snapshot.from_json(removed)
            assert render(snap, live, NOW).splitlines()[0] == headline(snap, live, NOW), (path, "removed")
