"""evidence.watchstate, pure (a clock the test moves): a watch is blind once it had no reading for longer than
its window, said once and again when it reads; idle is never blind; a failure is said once; a repeated line is
said at its first coming, then counted, the count said once a period. And the status text's line of them."""

from __future__ import annotations

import math
import threading

from supervisor.evidence.watchstate import (
    REPEATS_KEYS_MAX,
    WHY_CHARS,
    Repeats,
    Watches,
    WatchState,
    Words,
    ordinal,
    run_restarting,
)
from supervisor.status.model import Snapshot
from supervisor.status.render import watch_lines


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_reading_past_the_window_is_said_once_with_the_last_why_then_reading_again() -> None:
    clock = Clock()
    state = WatchState("proofs watch", 120.0, clock=clock)
    state.read()
    clock.now += 60
    state.miss("cuzk /status: timed out")
    assert state.check() == [] and state.current == "reading"
    clock.now += 61
    assert state.check() == ["proofs watch: no reading for 121 s (its window is 120 s): cuzk /status: timed out"]
    assert state.current == "blind"
    clock.now += 100
    state.miss("cuzk /status: timed out")
    assert state.check() == [], "blind is said once, not at every look"
    state.read()
    assert state.check() == ["proofs watch: reading again after 221 s without one"]
    assert state.to_dict()["state"] == "reading" and state.to_dict()["misses"] == 2


def test_a_freeze_of_the_supervisor_is_not_the_watchs_blindness() -> None:
    """Frozen from 105 to 150 (SIGSTOP, docker pause): the window counts from the thaw, as the stall windows do."""
    clock = Clock()
    state = WatchState("proofs watch", 30.0, clock=clock)
    state.read()
    clock.now = 170.0
    assert state.check(thawed_at=150.0) == []
    clock.now = 181.0
    assert state.check(thawed_at=150.0) == ["proofs watch: no reading for 31 s (its window is 30 s): no answer yet"]


def test_a_watch_that_never_read_is_blind_from_its_start() -> None:
    clock = Clock()
    state = WatchState("GPU sampling", 30.0, clock=clock)
    clock.now += 31
    [line] = state.check()
    assert line == "GPU sampling: no reading for 31 s (its window is 30 s): no answer yet"


def test_idle_is_never_blind_and_the_window_counts_from_the_wake() -> None:
    clock = Clock()
    state = WatchState("proofs watch", 10.0, clock=clock)
    state.idle("production is not up")
    clock.now += 1000
    assert state.check() == [] and state.current == "idle"
    state.wake()
    clock.now += 5
    assert state.check() == []
    clock.now += 6
    assert state.check()[0].startswith("proofs watch: no reading for 11 s")


def test_a_failure_is_said_once_and_a_why_is_short() -> None:
    state = WatchState("GPU sampling", 30.0, clock=Clock())
    state.failed("the GPU thread failed: TypeError: " + "x" * 5000, "started again in 1 s")
    [line] = state.check()
    assert line.startswith("GPU sampling: stopped unexpectedly (the GPU thread failed: TypeError: xxx")
    assert line.endswith("; started again in 1 s") and len(line) < WHY_CHARS + 80, len(line)
    assert state.check() == [] and state.failures == 1


def test_watches_speak_for_all_and_show_each() -> None:
    watches = Watches()
    clock = Clock()
    a, b = WatchState("a", 1.0, clock=clock), WatchState("b", 1.0, clock=clock)
    watches.add(a, b)
    a.read()
    b.stop("no GPU: NVML sees 0 devices")
    clock.now += 2
    assert watches.check() == ["a: no reading for 2 s (its window is 1 s): no answer yet"]
    shown = watches.to_dict()
    assert shown["a"]["state"] == "blind" and shown["b"] == {**shown["b"], "state": "stopped",
                                                             "why": "no GPU: NVML sees 0 devices"}


def test_a_watch_that_says_its_own_lines_is_shown_but_not_said_by_the_tick() -> None:
    # The manager's row watch says its lines where it reads (the sender's thread): the tick draining them too
    # would say one of them from another thread, without the sender's "manager: " before it.
    watches, clock = Watches(), Clock()
    row = WatchState("row watch", math.inf, clock=clock)
    watches.show(row)
    row.blinded("GET /status: HTTP 404", "the manager's kill is learnt later")
    assert watches.check() == []
    assert watches.to_dict()["row watch"]["state"] == "blind"
    assert row.check() == ["row watch: no reading (GET /status: HTTP 404); the manager's kill is learnt later"]


def test_a_repeated_line_is_said_once_then_counted_once_a_period() -> None:
    clock = Clock()
    repeats = Repeats(60.0, clock=clock)
    assert repeats.note("0 13", "GPU health: GPU 0: Xid 13 ...", "Xid 13 on GPU 0") == ["GPU health: GPU 0: Xid 13 ..."]
    for _ in range(41_233):
        assert repeats.note("0 13", "GPU health: GPU 0: Xid 13 ...", "Xid 13 on GPU 0") == []
    clock.now += 60
    assert repeats.due() == ["Xid 13 on GPU 0: 41,233 more in the last 60 s"]
    clock.now += 60
    assert repeats.due() == [], "a quiet period says nothing, and forgets the line"
    assert repeats.note("0 13", "again", "Xid 13 on GPU 0") == ["again"]


def test_a_repeat_said_each_time_is_said_with_its_count_and_time_until_its_periods_lines_are_spent() -> None:
    # A second hang of one NVML call within the period was only counted: the log read one hang where there were two.
    clock = Clock()
    repeats = Repeats(60.0, clock=clock)

    def hang() -> list[str]:
        return repeats.note("hung f", "f has not returned for 5.0s", "f hung again", said=3,
                            again=lambda times: f"f hung again ({times}): it has not returned for 5.0s")

    assert hang() == ["f has not returned for 5.0s"]
    clock.now += 40
    assert hang() == ["f hung again (2nd time in 40 s): it has not returned for 5.0s"]
    clock.now += 10
    assert hang() == ["f hung again (3rd time in 50 s): it has not returned for 5.0s"]
    clock.now += 5
    assert hang() == [], "three lines a period at most: the rest is counted"
    clock.now += 5
    assert repeats.due() == ["f hung again: 1 more in the last 60 s"]
    clock.now += 50
    assert hang() == ["f hung again (5th time in 110 s): it has not returned for 5.0s"], "a new period's lines"
    clock.now += 60
    assert repeats.due() == [], "a period with a repeat said keeps the count going, says nothing more"
    clock.now += 60
    assert repeats.due() == [] and hang() == ["f has not returned for 5.0s"], "a quiet period forgets the line"
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th", "112th"]


def test_repeated_lines_past_the_keys_bound_are_only_counted() -> None:
    repeats = Repeats(60.0, clock=Clock())
    said = [line for i in range(REPEATS_KEYS_MAX + 10) for line in repeats.note(str(i), f"line {i}")]
    assert len(said) == REPEATS_KEYS_MAX and repeats.dropped == 10


def test_the_status_line_of_the_watches() -> None:
    watches = {"GPU sampling": {"state": "reading"},
               "proofs watch": {"state": "blind", "since": 1000.0, "why": "cuzk /status: timed out"},
               "GPU Xid events": {"state": "stopped", "why": "no Xid events: no GPU supports them"},
               "odd": "not an object"}
    assert watch_lines(Snapshot.from_json({"watches": watches}).watches, 1130.0) == [
        "watches: GPU sampling reading; proofs watch BLIND since 2m10s ago (cuzk /status: timed out); "
        "GPU Xid events stopped (no Xid events: no GPU supports them)"]
    assert watch_lines({}, 0.0) == [] and watch_lines(Snapshot.from_json({"watches": None}).watches, 0.0) == []
    assert watch_lines(Snapshot.from_json({"watches": {"a": {"state": "reading"}}}).watches, 0.0, live=False) == [
        "watches (last known): a reading"]


def test_a_watch_that_reads_now_and_then_is_blind_at_its_first_miss_said_again_only_for_another_cause() -> None:
    clock = Clock()
    state = WatchState("row watch", math.inf, clock=clock)
    state.read()
    clock.now += 300
    state.blinded("GET /status: HTTP 404: not here", "a kill is not seen meanwhile")
    assert state.check() == ["row watch: no reading (GET /status: HTTP 404: not here); a kill is not seen meanwhile"]
    assert state.current == "blind" and state.blind_why() == "GET /status: HTTP 404: not here"
    clock.now += 300
    state.blinded("GET /status: HTTP 404: not here", "a kill is not seen meanwhile")
    assert state.check() == [], "the same cause is said once"
    state.blinded("GET /status: answer larger than 4 MiB", "a kill is not seen meanwhile")
    state.blinded("GET /status: answer larger than 4 MiB (object at 0x2)", "-", cause="GET /status: answer larger")
    state.blinded("GET /status: answer larger than 4 MiB (object at 0x3)", "-", cause="GET /status: answer larger")
    assert state.check() == ["row watch: still no reading, for another cause (GET /status: answer larger than 4 MiB)",
                             "row watch: still no reading, for another cause (GET /status: answer larger than 4 MiB "
                             "(object at 0x2))"]
    clock.now += 60
    state.read()
    assert state.check() == ["row watch: reading again after 660 s without one"]
    assert state.to_dict()["misses"] == 5 and state.to_dict()["window_s"] is None
    clock.now += 10_000
    assert state.check() == [], "never blind by time alone"


def test_a_watch_on_demand_counts_its_window_from_its_first_miss_and_says_another_cause_in_its_own_words() -> None:
    """The log shipper pushes only while lines wait: its last push may be an hour old when the next fails, and
    that hour is no blindness. Its misses carry their cause: a new one is said once it was said blind."""
    clock = Clock()
    words = Words(none="no push delivered", again="delivering again after {seconds:.0f} s")
    state = WatchState("log shipping", 60.0, clock=clock, words=words, on_demand=True)
    state.idle("nothing pushed yet")
    clock.now += 600
    assert state.check() == [] and state.current == "idle"
    state.read()
    clock.now += 3600  # a quiet hour
    assert state.check() == [] and state.current == "reading", "a quiet hour, looked at: no blindness either"
    state.miss("POST /api/log-push: HTTP 500: a", cause="POST /api/log-push: HTTP 500")
    assert state.check() == [] and state.current == "reading", "the window runs from the miss, not the push before"
    clock.now += 30
    state.miss("POST /api/log-push: HTTP 500: b", cause="POST /api/log-push: HTTP 500")
    assert state.check() == [], "a second miss does not move the window's start"
    clock.now += 31
    assert state.check() == ["log shipping: no push delivered for 61 s (its window is 60 s): "
                             "POST /api/log-push: HTTP 500: b"]
    state.miss("POST /api/log-push: HTTP 500: c", cause="POST /api/log-push: HTTP 500")
    assert state.check() == [], "the same cause, said once"
    state.miss("POST /api/log-push: connection refused", cause="POST /api/log-push: connection refused")
    state.miss("POST /api/log-push: connection refused", cause="POST /api/log-push: connection refused")
    assert state.check() == ["log shipping: still no push delivered, for another cause "
                             "(POST /api/log-push: connection refused)"]
    clock.now += 9
    state.read()
    assert state.check() == ["log shipping: delivering again after 70 s"]
    clock.now += 3600
    assert state.check() == [], "delivering again, then quiet: no blindness"
    state.miss("POST /api/log-push: HTTP 500: d", cause="POST /api/log-push: HTTP 500")
    assert state.check() == [], "a new wait, a new window"


def test_a_miss_without_a_cause_is_said_as_before() -> None:
    """The watches that give no cause (the GPU thread, the proofs): their blindness is said once, whatever the why."""
    clock = Clock()
    state = WatchState("proofs watch", 30.0, clock=clock)
    state.read()
    clock.now += 10
    state.miss("cuzk /status: timed out")
    clock.now += 21
    assert len(state.check()) == 1
    state.miss("cuzk /status: connection refused")
    assert state.check() == [] and state.why == "cuzk /status: connection refused"


def test_a_contained_thread_that_fails_is_said_reset_and_run_again_each_wait_doubled() -> None:
    # (Tiny waits: the doubling is read from the lines said, never timed.)
    state, cond, runs, resets = WatchState("I/O watch", 30.0), threading.Condition(), [], []

    def run() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise KeyError(f"bug {len(runs)}")

    run_restarting(run, state, "the I/O thread", cond, lambda: False, resets.append, restart_s=0.01, restart_max_s=0.02)
    assert len(runs) == 4 and [str(exc) for exc in resets] == ["'bug 1'", "'bug 2'", "'bug 3'"]
    assert state.check() == [f"I/O watch: stopped unexpectedly (the I/O thread failed: KeyError: 'bug {n}'); started "
                             f"again in {wait} s" for n, wait in ((1, "0.01"), (2, "0.02"), (3, "0.02"))]
    assert state.to_dict()["failures"] == 3


def test_a_contained_thread_closed_while_it_fails_is_not_run_again() -> None:
    state, cond, closed = WatchState("progress walker", 30.0), threading.Condition(), [False]

    def run() -> None:
        closed[0] = True  # closed while the run was failing: its failure is its owner's close, not a bug to say
        raise OSError("the pipe it read was closed")

    run_restarting(run, state, "the progress walker", cond, lambda: closed[0], lambda exc: None)
    assert state.check() == [] and state.failures == 0
