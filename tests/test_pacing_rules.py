"""supervisor.lifecycle.phase's Pacing on its own, on a real EventLoop with a fake clock (tests/fakes.py): the deadline
(none without timeout_s; due exactly timeout_s after it was set; expired from that moment; its callback run
once), the backoff timer and what the status view reads of both (gone once cancelled), ``after`` for each
kind of step (done and failed for good take no delay and count no restart; a service's retry is counted in
its restart window, a oneshot's is not), ``next_delay`` with the seeded jitter and its reset, and the
restart window dropping what fell out of it. tests/test_phase_timing.py drives the same rules through a
whole Phase; what is here is Pacing's own contract."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from fakes import FakeClock

from supervisor.config import PhaseSpec, parse_plan
from supervisor.engine.loop import EventLoop
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.attempt import Attempt, Watched
from supervisor.lifecycle.phase import Pacing
from supervisor.lifecycle.states import Next, backoff_delay

SEED = 7


def spec(kind: str = "oneshot", **keys: object) -> PhaseSpec:
    lines = "\n".join(f'{k} = "{val}"' if isinstance(val, str) else f"{k} = {str(val).lower()}" if isinstance(val, bool)
                      else f"{k} = {val!r}" for k, val in keys.items())
    return parse_plan(f'[[phases]]\nname = "p"\nkind = "{kind}"\ncommand = ["x"]\n{lines}\n', "t.toml", {}).phases[0]


@pytest.fixture
def loop() -> Iterator[EventLoop]:
    loop = EventLoop(clock=FakeClock())
    yield loop
    loop.close()


def advance(loop: EventLoop, to: float) -> None:
    clock = loop.clock
    assert isinstance(clock, FakeClock)
    while (due := loop.next_due()) is not None and due <= to:
        clock.now = max(clock.now, due)
        loop.run_once(max_wait=0)
    clock.now = max(clock.now, to)


def failed(reason: str = v.EXIT_CODE, attempt: int = 1) -> v.Verdict:
    return v.without_exit("p", "p", reason, 1, "exit 1", attempt=attempt)


def succeeded() -> v.Verdict:
    return v.Verdict("p", "p", 1, v.EXIT_CODE, True, 0, "exit 0")


def raise_(exc: Exception) -> None:
    raise exc


def test_no_timeout_no_deadline(loop: EventLoop) -> None:
    pacing = Pacing(spec(), loop, random.Random(SEED))
    pacing.start_deadline(lambda: None, raise_)
    assert pacing.deadline_at is None and not pacing.deadline_expired() and loop.next_due() is None


def test_the_deadline_is_due_timeout_s_after_it_was_set_and_runs_once(loop: EventLoop) -> None:
    pacing = Pacing(spec(timeout_s=30.0), loop, random.Random(SEED))
    advance(loop, 5.0)
    passed: list[float] = []
    pacing.start_deadline(lambda: passed.append(loop.clock.monotonic()), raise_)
    assert pacing.deadline_at == 35.0
    advance(loop, 34.999)
    assert passed == [] and not pacing.deadline_expired()
    advance(loop, 100.0)
    assert passed == [35.0] and pacing.deadline_expired()


def test_cancel_stops_both_timers_and_the_status_view_no_longer_shows_them(loop: EventLoop) -> None:
    pacing = Pacing(spec(timeout_s=10.0), loop, random.Random(SEED))
    ran: list[str] = []
    pacing.start_deadline(lambda: ran.append("deadline"), raise_)
    pacing.back_off(3.0, lambda: ran.append("backoff"), raise_)
    assert (pacing.deadline_at, pacing.backoff_until) == (10.0, 3.0)
    pacing.cancel()
    assert (pacing.deadline_at, pacing.backoff_until) == (None, None)
    advance(loop, 60.0)
    assert ran == [] and loop.next_due() is None


def test_the_backoff_timer_runs_its_callback_when_due(loop: EventLoop) -> None:
    pacing = Pacing(spec(), loop, random.Random(SEED))
    over: list[float] = []
    pacing.back_off(2.5, lambda: over.append(loop.clock.monotonic()), raise_)
    assert pacing.backoff_until == 2.5
    advance(loop, 10.0)
    assert over == [2.5]


def test_an_error_in_the_deadlines_callback_goes_to_its_handler(loop: EventLoop) -> None:
    pacing = Pacing(spec(timeout_s=1.0), loop, random.Random(SEED))
    errors: list[Exception] = []
    pacing.start_deadline(lambda: raise_(RuntimeError("boom")), errors.append)
    advance(loop, 2.0)
    assert [str(e) for e in errors] == ["boom"]


def test_a_oneshot_that_succeeds_is_done_with_no_delay(loop: EventLoop) -> None:
    pacing = Pacing(spec(retries=3), loop, random.Random(SEED))
    assert pacing.after(succeeded(), Attempt(1, 0.0)) == (Next.DONE, "completed in 1 attempt(s)", 0.0)
    assert pacing.consecutive_failures == 0 and pacing.restart_times == []


def test_a_oneshots_retry_waits_the_seeded_backoff_and_counts_no_restart(loop: EventLoop) -> None:
    s = spec(retries=3, backoff_s=2.0, backoff_factor=3.0, backoff_max_s=100.0, backoff_jitter=0.25)
    pacing = Pacing(s, loop, random.Random(SEED))
    rands = random.Random(SEED)
    for n in (1, 2, 3):
        step, why, delay = pacing.after(failed(attempt=n), Attempt(n, loop.clock.monotonic()))
        assert (step, why) == (Next.AGAIN, f"exit_code; retry {n} of 3")
        assert delay == backoff_delay(n, 2.0, 3.0, 100.0, 0.25, rands.random())
    assert pacing.consecutive_failures == 3 and pacing.restart_times == []
    step, why, delay = pacing.after(failed(attempt=4), Attempt(4, 0.0))
    assert (step, why, delay) == (Next.FAIL, "exit_code (all 3 retries used)", 0.0)


class Got:
    """An attempt's progress watch, as much as Pacing reads of it: what the attempt got."""

    def __init__(self, gained: int) -> None:
        self._gained = gained

    def gained(self) -> int:
        return self._gained


def attempt_that_got(n: int, gained: int) -> Attempt:
    return Attempt(n, 0.0, progress=Got(gained))  # type: ignore[arg-type]


def test_with_retry_while_progressing_an_attempt_that_got_further_is_not_counted(loop: EventLoop) -> None:
    """The real aria2c ends a link under 16 KiB/s after about 10 s (exit 5, "Too slow") instead of retrying it,
    and curio then loses that file: each slow patch of a 70-minute download cost a retry though each attempt
    completed files the next one keeps, and three patches gave the instance up. An attempt that got further is
    not counted; timeout_s bounds them. (What got further means: progresswatch.py's gained, tests/test_stall.py.)"""
    pacing = Pacing(spec(retries=1, retry_while_progressing=True, progress_total="1GiB", timeout_s=5000), loop,
                    random.Random(SEED))
    step, why, _ = pacing.after(failed(attempt=1), attempt_that_got(1, 1 << 20))
    assert (step, why) == (Next.AGAIN, "exit_code; 0 of 1 retries used, 1 attempt(s) that got further not counted")
    step, why, _ = pacing.after(failed(attempt=2), attempt_that_got(2, 5 << 20))
    assert (step, why) == (Next.AGAIN, "exit_code; 0 of 1 retries used, 2 attempt(s) that got further not counted")
    step, why, _ = pacing.after(failed(attempt=3), attempt_that_got(3, 0))  # got nothing: counted
    assert (step, why) == (Next.AGAIN, "exit_code; 1 of 1 retries used, 2 attempt(s) that got further not counted")
    assert pacing.fails_for_good(failed(attempt=4), attempt_that_got(4, 0))
    assert pacing.fails_for_good(failed(attempt=4), attempt_that_got(4, 4096)), "a failure's own lines: no progress"
    assert not pacing.fails_for_good(failed(attempt=4), attempt_that_got(4, 1 << 20)), "asked, nothing counted"
    step, why, _ = pacing.after(failed(attempt=4), attempt_that_got(4, 0))
    assert (step, why) == (Next.FAIL, "exit_code (all 1 retries used; 2 attempt(s) that got further not counted)")


def test_without_retry_while_progressing_every_attempt_counts(loop: EventLoop) -> None:
    pacing = Pacing(spec(retries=1, progress_total="1GiB"), loop, random.Random(SEED))
    assert pacing.after(failed(attempt=1), attempt_that_got(1, 1 << 20))[0] is Next.AGAIN
    assert pacing.after(failed(attempt=2), attempt_that_got(2, 1 << 20))[:2] == (
        Next.FAIL, "exit_code (all 1 retries used)")


def test_a_services_restart_is_counted_in_its_window(loop: EventLoop) -> None:
    s = spec("service", restart="always", restart_burst=2, restart_window_s=60.0, backoff_jitter=0.0)
    pacing = Pacing(s, loop, random.Random(SEED))
    advance(loop, 10.0)
    assert pacing.after(failed(), Attempt(1, 0.0))[0] is Next.AGAIN
    advance(loop, 20.0)
    assert pacing.after(failed(), Attempt(2, 15.0))[0] is Next.AGAIN
    assert pacing.restart_times == [10.0, 20.0]
    advance(loop, 30.0)
    step, why, delay = pacing.after(failed(), Attempt(3, 25.0))
    assert step is Next.FAIL and "restarted 2 times within 60s (restart_burst)" in why and delay == 0.0
    assert pacing.restart_times == [10.0, 20.0], "a restart that is not made is not counted"


def test_the_attempts_in_a_row_that_never_came_up_are_counted_and_one_up_starts_the_count_over(loop: EventLoop) -> None:
    s = spec("service", restart="always", restart_burst=2, restart_window_s=60.0, backoff_jitter=0.0)
    pacing = Pacing(s, loop, random.Random(SEED))
    ends = iter(range(100, 10_000, 100))  # each attempt 100 s: never two restarts within the 60 s window

    def end(up: bool) -> tuple[Next, str, float]:
        now = next(ends)
        advance(loop, float(now))
        return pacing.after(failed(), Attempt(1, now - 100.0, up_at=now - 50.0 if up else None))

    assert [end(up=False)[0], end(up=False)[0]] == [Next.AGAIN, Next.AGAIN] and pacing.never_up == 2
    assert not pacing.fails_for_good(failed(), Attempt(3, 0.0, up_at=1.0)), "one that came up would be restarted"
    assert pacing.fails_for_good(failed(), Attempt(3, 0.0)) and pacing.never_up == 2, "asked: nothing counted"
    assert end(up=True)[0] is Next.AGAIN and pacing.never_up == 0
    assert [end(up=False)[0], end(up=False)[0]] == [Next.AGAIN, Next.AGAIN]
    step, why, delay = end(up=False)
    assert (step, why, delay) == (
        Next.FAIL, "exit_code; restarted 2 times in a row without coming up (restart_burst): giving up", 0.0)


def found(reason: str, start: float, up: bool = True) -> Attempt:
    """An attempt begun at ``start`` that the supervisor ended for a watch's finding (``reason``)."""
    attempt = Attempt(1, start, up_at=start + 1.0 if up else None)
    attempt.mark_stopped_for(reason, "found")
    return attempt


def test_the_attempts_in_a_row_a_watch_ended_are_counted_and_only_one_up_that_ended_otherwise_breaks_the_row(
        loop: EventLoop) -> None:
    """NVML hung for good killed a curio that was still proving every 90 s, for ever: each attempt lived the 60 s
    the watch takes, so never 5 restarts within 300 s. How long an attempt lived never breaks the row."""
    s = spec("service", restart="always", restart_burst=2, restart_window_s=60.0, backoff_jitter=0.0,
             backoff_reset_s=10.0)
    pacing = Pacing(s, loop, random.Random(SEED))
    ends = iter(range(100, 10_000, 100))  # each attempt 100 s: never two restarts within the 60 s window

    def end(outcome: v.Verdict, attempt: Attempt) -> Next:
        advance(loop, float(next(ends)))
        return pacing.after(outcome, attempt)[0]

    hung = failed(v.GPU_UNRESPONSIVE)
    assert [end(hung, found(v.GPU_UNRESPONSIVE, 0.0)), end(hung, found(v.GPU_UNRESPONSIVE, 100.0))] == \
        [Next.AGAIN, Next.AGAIN] and pacing.found == 2
    assert not pacing.fails_for_good(failed(), Attempt(3, 0.0, up_at=1.0)), "one that ended otherwise is restarted"
    assert pacing.fails_for_good(hung, found(v.GPU_UNRESPONSIVE, 0.0)) and pacing.found == 2, "asked: nothing counted"
    assert end(failed(), Attempt(3, 200.0, up_at=201.0)) is Next.AGAIN and pacing.found == 0, "up, its own exit"
    assert end(hung, found(v.GPU_UNRESPONSIVE, 300.0)) is Next.AGAIN and pacing.found == 1
    assert end(failed(v.SPAWN_FAILED), Attempt(5, 400.0)) is Next.AGAIN and pacing.found == 1, "never up: never_up's"
    assert end(hung, found(v.GPU_UNRESPONSIVE, 450.0, up=False)) is Next.AGAIN and pacing.found == 1, \
        "a watch's finding before it came up: never_up's alone, as the docs say"
    assert end(failed(v.STALLED), found(v.STALLED, 500.0)) is Next.AGAIN and pacing.found == 2
    # A shutdown's stop (or a bug of ours) is no watch's finding, nor a child that failed on its own first.
    assert not pacing.fails_for_good(failed(v.STOPPED), found(v.STOPPED, 600.0))
    assert not pacing.fails_for_good(failed(), found(v.GPU_UNRESPONSIVE, 600.0)), "its own failure, before the stop"
    step, why, delay = pacing.after(hung, found(v.GPU_UNRESPONSIVE, 600.0))
    assert (step, why, delay) == (Next.FAIL, "gpu_unresponsive; restarted 2 times in a row, each attempt ended by a "
                                             "watch's finding (restart_burst): giving up", 0.0)


def test_a_failure_for_good_fails_at_once_whatever_the_retries(loop: EventLoop) -> None:
    pacing = Pacing(spec(retries=10), loop, random.Random(SEED))
    step, why, delay = pacing.after(failed(v.GPU_FAULT), Attempt(1, 0.0))
    assert (step, why, delay) == (Next.FAIL, "gpu_fault: exit 1", 0.0)
    assert pacing.consecutive_failures == 0


def test_a_timeout_after_the_deadline_expired_is_not_retried(loop: EventLoop) -> None:
    pacing = Pacing(spec(timeout_s=5.0, retries=10), loop, random.Random(SEED))
    pacing.start_deadline(lambda: None, raise_)
    advance(loop, 5.0)
    step, why, _ = pacing.after(failed(v.TIMEOUT), Attempt(1, 0.0))
    assert step is Next.FAIL and why == "timeout: exit 1"


def test_a_long_enough_attempt_starts_the_backoff_over(loop: EventLoop) -> None:
    pacing = Pacing(spec(backoff_s=1.0, backoff_factor=2.0, backoff_max_s=100.0, backoff_jitter=0.0,
                         backoff_reset_s=30.0), loop, random.Random(SEED))
    assert [pacing.next_delay(1.0) for _ in range(3)] == [1.0, 2.0, 4.0]
    assert pacing.next_delay(29.9) == 8.0, "just short of backoff_reset_s: no reset"
    assert pacing.next_delay(30.0) == 1.0 and pacing.consecutive_failures == 1


def test_backoff_reset_s_zero_never_resets(loop: EventLoop) -> None:
    pacing = Pacing(spec(backoff_s=1.0, backoff_factor=2.0, backoff_max_s=100.0, backoff_jitter=0.0,
                         backoff_reset_s=0.0), loop, random.Random(SEED))
    assert [pacing.next_delay(10_000.0) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]


def test_restarts_that_fell_out_of_the_window_are_forgotten(loop: EventLoop) -> None:
    pacing = Pacing(spec("service", restart="always", restart_window_s=60.0), loop, random.Random(SEED))
    for t in (0.0, 30.0, 59.0, 61.0, 130.0):
        pacing.restarted(t)
    assert pacing.restart_times == [130.0], "61 fell out at 121.0: the window is the last 60 s before now"
    pacing.restarted(150.0)
    assert pacing.restart_times == [130.0, 150.0]


def test_without_stall_s_or_progress_total_no_watch_is_made(loop: EventLoop) -> None:
    pacing = Pacing(spec(), loop, random.Random(SEED))
    attempt = Attempt(1, 0.0)
    never = object()
    watched = Watched(attempt, never)  # type: ignore[arg-type]
    pacing.watch_for_stall(never, watched)  # type: ignore[arg-type]
    attempt.progress = pacing.watch_progress(never, watched, lambda line: None)  # type: ignore[arg-type]
    assert pacing.stall is None and attempt.progress is None and loop.next_due() is None
