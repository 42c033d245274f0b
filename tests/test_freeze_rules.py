"""supervisor.engine.tick's Tick on a real EventLoop with a fake clock (tests/fakes.py): every TICK_S the freeze
watch looks at the loop's clock and then each watcher speaks, in order, with the tick's time; the next tick is
set before the watchers run, so one that raises is not the last; the watch's clock starts when the tick
starts, not when the watch was made; a jump of the clock seen at a tick is a freeze, said once with its
length, and freezes are counted; a jump the loop's own bounded wait explains (EventLoop.holding) is said as that
and is no freeze, though the windows restart all the same. FreezeWatch's own jump rule is in tests/test_freeze.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakes import FakeClock

from supervisor.engine.loop import EventLoop
from supervisor.engine.tick import FREEZE_MIN_S, TICK_S, FreezeWatch, Tick, start_the_tick


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def loop(clock: FakeClock) -> Iterator[EventLoop]:
    loop = EventLoop(clock=clock)
    yield loop
    loop.close()


def ticks_until(loop: EventLoop, clock: FakeClock, t: float) -> None:
    """Run every tick due up to ``t``, each when it is due."""
    while (due := loop.next_due()) is not None and due <= t:
        clock.now = max(clock.now, due)
        loop.run_once(max_wait=0)


def test_each_watcher_speaks_at_each_tick_in_order_with_the_ticks_time(loop: EventLoop, clock: FakeClock) -> None:
    said: list[str] = []
    heard: list[tuple[str, float]] = []

    def first(now: float) -> list[str]:
        heard.append(("first", now))
        return [f"first at {now:g}"]

    def second(now: float) -> list[str]:
        heard.append(("second", now))
        return []

    freeze = FreezeWatch(said.append, clock=clock)
    Tick(loop, freeze, [first, second], said.append).start()
    ticks_until(loop, clock, 3 * TICK_S)
    assert heard == [("first", 1.0), ("second", 1.0), ("first", 2.0), ("second", 2.0), ("first", 3.0),
                     ("second", 3.0)]
    assert said == ["first at 1", "first at 2", "first at 3"]
    assert loop.next_due() == 4 * TICK_S, "always one tick ahead"


def test_a_watcher_that_raises_is_not_the_last_tick(loop: EventLoop, clock: FakeClock) -> None:
    faults: list[str] = []
    loop.faults.log = faults.append
    calls: list[float] = []

    def broken(now: float) -> list[str]:
        calls.append(now)
        raise RuntimeError("watcher bug")

    Tick(loop, FreezeWatch(lambda _: None, clock=clock), [broken], lambda _: None).start()
    ticks_until(loop, clock, 3 * TICK_S)
    assert calls == [1.0, 2.0, 3.0]
    assert faults and "RuntimeError: watcher bug" in faults[0], "contained and said by the loop's faults"


def test_the_watch_counts_from_the_ticks_start_not_from_its_making(loop: EventLoop, clock: FakeClock) -> None:
    """Between making the watch and starting the tick (preflight, the fitness checks) the loop may not run for
    longer than FREEZE_MIN_S: that is no freeze."""
    said: list[str] = []
    freeze = FreezeWatch(said.append, clock=clock)
    clock.now += 10 * FREEZE_MIN_S
    Tick(loop, freeze, [], said.append).start()
    ticks_until(loop, clock, clock.now + 2 * TICK_S)
    assert said == [] and freeze.freezes == 0 and freeze.thawed_at is None


def test_a_jump_seen_at_a_tick_is_a_freeze_said_once(loop: EventLoop, clock: FakeClock) -> None:
    said: list[str] = []
    freeze = start_the_tick(loop, said.append, [])
    ticks_until(loop, clock, 2.0)
    clock.now += 20.0  # the whole supervisor stopped: no tick ran meanwhile
    loop.run_once(max_wait=0)
    assert freeze.freezes == 1 and freeze.thawed_at == 22.0 and freeze.frozen_s == 20.0
    assert said == ["the supervisor was frozen (SIGSTOP, cgroup freezer, docker pause?) for 20.0s; "
                    "stall windows restart now, deadlines keep counting"]
    ticks_until(loop, clock, 30.0)
    assert len(said) == 1, "ticks after the thaw are on time again"


def test_freezes_are_counted_and_the_last_one_kept(loop: EventLoop, clock: FakeClock) -> None:
    freeze = start_the_tick(loop, lambda _: None, [])
    for gap in (5.0, 9.0):
        ticks_until(loop, clock, clock.now + 1.0)
        clock.now += gap
        loop.run_once(max_wait=0)
    assert freeze.freezes == 2 and freeze.frozen_s == 9.0 and freeze.thawed_at == clock.now


def test_the_watchers_still_speak_at_the_tick_right_after_a_freeze(loop: EventLoop, clock: FakeClock) -> None:
    heard: list[float] = []
    said: list[str] = []
    start_the_tick(loop, said.append, [lambda now: heard.append(now) or []])
    clock.now += 50.0
    loop.run_once(max_wait=0)
    assert heard == [50.0] and len(said) == 1, "the freeze is said first, then the watchers at the same tick"


def test_notice_without_a_time_reads_its_clock(clock: FakeClock) -> None:
    said: list[str] = []
    freeze = FreezeWatch(said.append, clock=clock, min_s=1.0)
    clock.now = 0.5
    assert freeze.notice() is None
    clock.now = 2.0
    assert freeze.notice() == 1.5 and freeze.last_seen == 2.0


def test_a_custom_interval(loop: EventLoop, clock: FakeClock) -> None:
    heard: list[float] = []
    Tick(loop, FreezeWatch(lambda _: None, clock=clock), [lambda now: heard.append(now) or []], lambda _: None,
         interval=0.25).start()
    ticks_until(loop, clock, 1.0)
    assert heard == [0.25, 0.5, 0.75, 1.0]


def test_a_jump_the_loops_own_hold_explains_is_said_as_that_not_as_a_freeze(loop: EventLoop,
                                                                           clock: FakeClock) -> None:
    said: list[str] = []
    freeze = start_the_tick(loop, said.append, [])
    ticks_until(loop, clock, 2.0)
    with loop.holding("the start of p/p"):
        clock.now += 5.0  # a spawn waited this long for its exec, on the loop's thread
    loop.run_once(max_wait=0)
    assert said == ["the supervisor's loop was held for 5.0s by the start of p/p; "
                    "stall windows restart now, deadlines keep counting"]
    assert freeze.freezes == 0, "the supervisor was not frozen"
    assert freeze.thawed_at == 7.0 and freeze.frozen_s == 5.0, "it did not look meanwhile: the windows restart"
    assert freeze.stopped_s == 0.0, "the supervisor was never stopped: its threads and children went on"


def test_a_jump_longer_than_the_hold_is_still_a_freeze(loop: EventLoop, clock: FakeClock) -> None:
    """The hold explains 5 s of the 30: the rest is a freeze (docker pause right after), said as one."""
    said: list[str] = []
    freeze = start_the_tick(loop, said.append, [])
    ticks_until(loop, clock, 2.0)
    with loop.holding("the start of p/p"):
        clock.now += 5.0
    clock.now += 25.0
    loop.run_once(max_wait=0)
    assert freeze.freezes == 1 and said[0].startswith("the supervisor was frozen (SIGSTOP")
    assert freeze.frozen_s == 30.0 and freeze.stopped_s == 25.0, "of the jump, the hold's 5 s went on"


def test_a_hold_before_the_last_look_explains_no_later_jump(loop: EventLoop, clock: FakeClock) -> None:
    said: list[str] = []
    freeze = start_the_tick(loop, said.append, [])
    with loop.holding("the start of p/p"):
        clock.now += 0.5
    ticks_until(loop, clock, 3.0)
    clock.now += 10.0
    loop.run_once(max_wait=0)
    assert freeze.freezes == 1 and said[0].startswith("the supervisor was frozen (SIGSTOP"), said


def test_a_pause_the_hold_noticed_is_a_freeze_within_it(loop: EventLoop, clock: FakeClock) -> None:
    """docker pause while a start waited for its exec: the wait gave the paused time back (Hold.paused), and the
    jump is the freeze it is, not the hold's."""
    said: list[str] = []
    freeze = start_the_tick(loop, said.append, [])
    ticks_until(loop, clock, 2.0)
    with loop.holding("the start of p/p") as hold:
        clock.now += 0.3
        clock.now += 60.0  # stopped: the wait came back 60 s late
        hold.paused(60.0)
        clock.now += 0.2
    loop.run_once(max_wait=0)
    assert freeze.freezes == 1 and said[0].startswith("the supervisor was frozen (SIGSTOP"), said
    assert abs(freeze.stopped_s - 60.0) < 1e-6, freeze.stopped_s


def test_several_holds_in_one_turn_explain_the_jump_together(loop: EventLoop, clock: FakeClock) -> None:
    """A phase of three daemons without a readiness check starts them in one turn, each start holding the
    loop 2 s: the 6 s jump is their sum, not a freeze (each alone explains less than the jump)."""
    said: list[str] = []
    freeze = start_the_tick(loop, said.append, [])
    ticks_until(loop, clock, 2.0)
    for name, took in (("a", 2.0), ("b", 2.5), ("c", 2.0)):
        with loop.holding(f"the start of p/{name}"):
            clock.now += took
    loop.run_once(max_wait=0)
    assert freeze.freezes == 0, said
    assert said == ["the supervisor's loop was held for 6.5s by the start of p/b and 2 more; "
                    "stall windows restart now, deadlines keep counting"]
