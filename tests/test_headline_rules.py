"""supervisor.status.headline's pure lines for the stories tests/test_status_story.py does not tell: a supervisor that
does not answer, a lifecycle not started, a retry's backoff, a daemon not yet ready, a phase in another state, a
failing child that is not its phase's command, a stop without a failure; the failure's lines when they are many,
long or absent; the gone supervisor's survivors with and without labels; and a snapshot of the wrong shapes
(from another version, or spoilt) that must still give a line, never raise."""

from __future__ import annotations

import math

from supervisor.status.headline import (
    FAILURE_LINES_SHOWN,
    alive_lines,
    failure_lines,
    headline,
    shown_value,
    since,
)
from supervisor.status.model import Snapshot
from supervisor.status.render import render
from supervisor.text.show import span

NOW = 100_000.0
# Each story is the JSON status.json would hold, read back as ``status`` reads it.
read = Snapshot.from_json


def test_span_at_its_unit_boundaries() -> None:
    assert [span(s) for s in (0, 59.9, 119.99, 120, 185, 7199, 7200, 7260, 90000)] == [
        "0s", "59s", "119s", "2m00s", "3m05s", "119m59s", "2h00m", "2h01m", "25h00m"]


def test_span_of_what_is_not_a_duration() -> None:
    assert [span(v) for v in (None, "5", True, math.inf, math.nan, [1])] == ["?"] * 6
    assert span(-30) == "0s", "a clock that stepped back is no time at all, not a negative one"


def test_since_no_time_is_never() -> None:
    assert [since(v, NOW) for v in (None, 0, False, math.nan, "yesterday")] == ["never"] * 5
    assert since(NOW - 61, NOW) == "61s ago"


def test_shown_value_as_json_writes_it() -> None:
    assert [shown_value(v) for v in (False, None, 12.5, "bare", [1, "a"])] == ["false", "null", "12.5", "bare",
                                                                              '[1, "a"]']


def test_a_supervisor_that_does_not_answer() -> None:
    snap = {"supervisor": "not answering", "pid": 77, "written_at": NOW - 30, "lifecycle": {"state": "running"}}
    assert headline(read(snap), False, NOW) == ("NOT ANSWERING: supervisor pid 77 is alive but its status socket does "
                                               "not answer; last state written 30s ago")


def test_the_text_of_a_supervisor_that_does_not_answer_says_it_is_alive_and_shows_the_last_known() -> None:
    # It said "NOT ANSWERING: ... is alive", then "no prover-supervisor is running", then "lifecycle: running" as
    # if it were live.
    snap = {"supervisor": "not answering", "pid": 77, "written_at": NOW - 30,
            "lifecycle": {"state": "running"}, "phases": [{"name": "p", "state": "running"}]}
    lines = render(read(snap), False, NOW).splitlines()
    assert lines[1] == "prover-supervisor pid 77 is alive but not answering; last state written 30s ago", lines
    assert "lifecycle (last known): running" in lines and "phases (last known):" in lines, lines
    assert not any("no prover-supervisor is running" in line for line in lines), lines


def test_gone_comes_before_the_failure_it_wrote() -> None:
    """A supervisor that died mid-failure: that it is gone (and its survivors) is the news."""
    snap = {"supervisor": "gone", "pid": 5, "written_at": None, "survivors": [],
            "lifecycle": {"state": "stopping", "failure": {"phase": "p", "child": "p", "reason": "exited"}}}
    assert headline(read(snap), False, NOW).startswith("GONE: supervisor pid 5 is not running and did not stop (last "
                                                 "state written never); 0 process(es)")


def test_nothing_started_yet() -> None:
    assert headline(read({"lifecycle": {"state": "starting", "current": None}, "phases": []}), True, NOW) == \
        "starting: no phase started yet"
    assert headline(read({}), True, NOW) == "starting: no phase started yet"


def running(phase: dict[str, object]) -> dict[str, object]:
    return {"lifecycle": {"state": "running", "current": phase["name"]}, "phases": [phase]}


def test_a_retry_says_when_the_next_attempt_comes() -> None:
    snap = running({"name": "fetch", "state": "backoff", "attempt": 3, "timers": {"backoff": {"left_s": 125}}})
    assert headline(read(snap), True, NOW) == "retrying: fetch attempt 3 failed; next attempt in 2m05s"


def test_an_earlier_service_that_is_not_up_is_said_after_the_current_phase() -> None:
    """A crash loop behind a phase that runs: ``running: web up 6s`` hid that db was in its backoff."""
    web = {"name": "web", "kind": "service", "state": "running", "up": True, "up_since": NOW - 6}
    db = {"name": "db", "kind": "service", "state": "backoff", "attempt": 1, "up": False,
          "timers": {"backoff": {"left_s": 6}}}
    snap = {"lifecycle": {"state": "running", "current": "web"}, "phases": [db, web]}
    assert headline(read(snap), True, NOW) == "running: web up 6s; db restarting (attempt 2 in 6s)"
    # Its next attempt under way, or its last one ending; a oneshot done, a service up, one after it: not news.
    fetch = {"name": "fetch", "kind": "oneshot", "state": "done"}
    for state, said in (("starting", "db restarting (attempt 2, starting, not up yet)"),
                        ("stopping", "db stopping (attempt 2 ended)"), ("running", None)):
        again = {**db, "state": state, "attempt": 2, "up": state == "running", "timers": {}}
        later = {"name": "later", "kind": "service", "state": "pending"}
        snap = {"lifecycle": {"state": "running", "current": "web"}, "phases": [fetch, again, web, later]}
        assert headline(read(snap), True, NOW) == "running: web up 6s" + (f"; {said}" if said else ""), state
    # Many: the first few named, the rest counted, on one line.
    many = [{**db, "name": f"db{i}"} for i in range(5)]
    snap = {"lifecycle": {"state": "running", "current": "web"}, "phases": [*many, web]}
    assert headline(read(snap), True, NOW) == (
        "running: web up 6s; db0 restarting (attempt 2 in 6s); db1 restarting (attempt 2 in 6s); "
        "db2 restarting (attempt 2 in 6s); 2 more service(s) not up")


def test_a_settle_says_the_command_is_done_and_how_long_its_daemons_are_kept_at_most() -> None:
    snap = running({"name": "warmup", "state": "settling", "attempt": 1,
                    "timers": {"settle": {"limit_s": 300, "left_s": 250}}})
    assert headline(read(snap), True, NOW) == \
        "settling: warmup's command done; its daemons kept for what it started, 4m10s more at most"


def test_a_settle_ended_sooner_by_the_phases_deadline_says_the_deadline() -> None:
    # The deadline (timeout_s) ends the settle if it comes first: "at most" is the sooner of the two.
    snap = running({"name": "warmup", "state": "settling", "attempt": 1,
                    "timers": {"settle": {"limit_s": 300, "left_s": 250}, "deadline": {"limit_s": 900, "left_s": 60}}})
    assert headline(read(snap), True, NOW) == \
        "settling: warmup's command done; its daemons kept for what it started, 60s more at most"


def test_a_daemon_not_yet_ready_says_whom_it_waits_for_and_how_long() -> None:
    snap = running({"name": "bench", "state": "starting", "attempt": 1,
                    "timers": {"ready": {"child": "cuzk", "waited_s": 42, "limit_s": 600}}})
    assert headline(read(snap), True, NOW) == "starting: bench, waiting for cuzk to be ready (42s of 10m00s)"


def test_a_phase_in_any_other_state_says_its_attempt_and_since_when() -> None:
    snap = running({"name": "fetch", "state": "running", "attempt": 2, "since": NOW - 8, "timers": {}})
    assert headline(read(snap), True, NOW) == "running: fetch, attempt 2, since 8s ago"


def test_a_hold_without_a_timer_says_no_time_left() -> None:
    snap = running({"name": "bench", "state": "done", "hold": "until the manager says", "timers": {}})
    assert headline(read(snap), True, NOW) == "waiting: bench done, held: until the manager says"


def test_up_without_its_time_is_said_as_unknown() -> None:
    snap = running({"name": "curio", "state": "running", "up": True})
    assert headline(read(snap), True, NOW) == "running: curio up ?"


def test_the_failing_child_named_with_its_phase_when_they_differ() -> None:
    snap = {"lifecycle": {"state": "stopped", "exit_status": 1, "failure": {
        "phase": "bench", "child": "cuzk", "reason": "exited", "at": NOW - 5}}}
    assert headline(read(snap), False, NOW) == "FAILED: bench/cuzk exited 5s ago; exit 1"


def test_a_failure_still_under_way_has_no_exit_yet() -> None:
    snap = {"lifecycle": {"state": "running", "failure": {"phase": "p", "child": "p", "reason": "stalled",
                                                         "at": NOW - 1}}}
    assert headline(read(snap), True, NOW) == "FAILED: p stalled 1s ago"


def test_a_stop_without_a_failure_says_stopped_and_why() -> None:
    snap = {"lifecycle": {"state": "stopped", "why": "SIGTERM", "exit_status": 143}}
    assert headline(read(snap), False, NOW) == "stopped: SIGTERM; exit 143"
    assert headline(read({"lifecycle": {"state": "stopping"}}), True, NOW) == "stopping: the supervisor stops"
    stopping = {"lifecycle": {"state": "stopping", "why": "received SIGTERM", "exit_status": 143}}
    assert headline(read(stopping), True, NOW) == "stopping: received SIGTERM; exit 143 follows"
    complete = {"lifecycle": {"state": "stopping", "why": "lifecycle complete", "exit_status": 0}}
    assert headline(read(complete), True, NOW) == "stopping: lifecycle complete; exit 0 follows"


def test_an_exit_waiting_for_the_manager_says_so_while_it_waits() -> None:
    """The lifecycle is over; the supervisor still runs, delivering the outbox for up to its window."""
    snap = {"lifecycle": {"state": "stopped", "why": "lifecycle complete", "exit_status": 0},
            "exiting": {"status": 0, "flush_left_s": 5.7, "giving_up": False}, "manager": {"outbox_pending": 3}}
    assert headline(read(snap), True, NOW) == ("done: lifecycle complete; exit 0; the exit waits up to 5s more for "
                                               "the manager (3 call(s) pending)")
    giving_up = {**snap, "exiting": {"status": 4, "flush_left_s": 118.2, "giving_up": True},
                 "lifecycle": {"state": "stopped", "why": "phase fetch failed", "exit_status": 4}}
    assert headline(read(giving_up), True, NOW) == ("stopped: phase fetch failed; exit 4; the exit waits up to 118s "
                                                    "more for the give-up to be delivered (3 call(s) pending)")
    assert headline(read(snap), False, NOW) == "done: lifecycle complete; exit 0"  # saved: that wait is over


def test_failure_lines_show_only_the_last_few_each_cut_short() -> None:
    many = [f"line {i}" for i in range(20)] + ["x" * 500]
    snap = {"lifecycle": {"failure": {"phase": "p", "child": "c", "reason": "exited", "exit_code": 3,
                                      "last_lines": many}}}
    out = failure_lines(read(snap))
    assert out[0] == "  cause: exited exit_code=3"
    assert out[1] == "  last lines of p/c:"
    shown = out[2:]
    assert len(shown) == FAILURE_LINES_SHOWN
    assert shown[:-1] == [f"    | line {i}" for i in range(20)][-(FAILURE_LINES_SHOWN - 1):]
    assert shown[-1] == "    | " + "x" * 197 + "..."  # cut to 200, the cut marked
    assert not any(line.startswith("  logs:") for line in out), "no log file known: nothing said"


def test_failure_lines_without_lines_or_logs_are_the_cause_alone() -> None:
    snap = {"lifecycle": {"failure": {"phase": "p", "child": "p", "reason": "timeout", "detail": "after 600s",
                                      "last_lines": [], "signal": None}}}
    assert failure_lines(read(snap)) == ["  cause: timeout: after 600s"]


def test_no_failure_no_failure_lines() -> None:
    assert failure_lines(read({"lifecycle": {"state": "running"}})) == []
    assert failure_lines(read({})) == []


def test_the_supervisors_log_alone_is_named() -> None:
    snap = {"lifecycle": {"failure": {"phase": "p", "child": "p", "reason": "exited"}},
            "logs": {"supervisor": "/var/log/s.log"}}
    assert failure_lines(read(snap))[-1] == "  logs: /var/log/s.log"


def test_log_paths_with_an_escape_or_a_newline_are_quoted_on_one_line() -> None:
    """A log_dir's ESC reached the terminal (the screen cleared, the text red), its newline split the line."""
    odd = "/tmp/esc\x1b[2J\x1b[31mlogs"
    snap = {"lifecycle": {"failure": {"phase": "p", "child": "p", "reason": "exited", "log_file": f"{odd}/p.log"}},
            "logs": {"supervisor": "/var/log/a\nb/s.log"}}
    assert failure_lines(read(snap))[-1] == \
        "  logs: '/tmp/esc\\x1b[2J\\x1b[31mlogs/p.log', '/var/log/a\\nb/s.log'"


def test_alive_lines_name_each_survivor_with_its_label_where_known() -> None:
    snap = {"supervisor": "gone", "children": [{"pid": 10, "label": "bench/cuzk"}, "junk"],
            "survivors": [{"pid": 10, "name": "cuzk-daemon"}, {"pid": 11, "name": "sleep"}, "junk"]}
    assert alive_lines(read(snap)) == ["  still alive, started by it (the next start of this state_dir ends them):",
                                "    pid 10 cuzk-daemon (bench/cuzk)", "    pid 11 sleep",
                                "  what follows is the last state it wrote (last known)"]


def test_alive_lines_under_an_exit_that_left_what_outlived_sigkill() -> None:
    # It exited in order, saying that pid 10 outlived its SIGKILL: no "did not stop", no "last known".
    snap = {"supervisor": "exited", "children": [{"pid": 10, "label": "svc/svc"}],
            "survivors": [{"pid": 10, "name": "sleep"}]}
    assert alive_lines(read(snap)) == ["  still alive: outlived SIGKILL (uninterruptible sleep?), left by its exit "
                                       "(the next start of this state_dir ends them):", "    pid 10 sleep (svc/svc)"]
    assert alive_lines(read({"supervisor": "exited", "survivors": []})) == []


def test_alive_lines_with_nothing_alive_and_for_a_live_supervisor() -> None:
    assert alive_lines(read({"supervisor": "gone", "survivors": []})) == [
        "  nothing it started is still alive; what follows is the last state it wrote (last known)"]
    assert alive_lines(read({"supervisor": "running", "survivors": [{"pid": 1}]})) == []


def test_a_snapshot_of_the_wrong_shapes_still_gives_a_line() -> None:
    """status.json from another version, or hand-edited: every part may be anything; a line comes out."""
    odd = [{"lifecycle": []}, {"lifecycle": {"failure": "yes"}}, {"lifecycle": {"current": "p"}, "phases": "p"},
           {"lifecycle": {"current": "p"}, "phases": [None, 3, {"name": "p", "timers": []}]},
           {"supervisor": "gone", "survivors": "many"}]
    for snap in odd:
        line = headline(read(snap), True, NOW)
        assert line and "\n" not in line, snap
        assert all(isinstance(x, str) for x in failure_lines(read(snap)) + alive_lines(read(snap))), snap
