"""The bench's timers (prover/benchlimits.py: the manager's benchmark clock, the min_rate cut) on a real EventLoop,
with one look raising once (a bug of ours, simulated): the loop contains it and says it once, and the looks go on,
so the deadline and the cut still fire. They used to ask for their next look only at the end of a look: one raise
ended them for good, the bench then ran past the manager's deadline with nothing said again and nothing cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from fakes import FailingProduction

from supervisor.engine.loop import EventLoop
from supervisor.lifecycle.states import PhaseState
from supervisor.prover import benchlimits
from supervisor.prover.bench import BenchResult
from supervisor.prover.fleet import BENCH_DONE
from supervisor.wiring import PhaseView

WAIT_S = 30.0  # generous: the machine is shared; each wait ends as soon as its condition holds


def raising_once(value: Callable[[], object], at_call: int) -> Callable[..., object]:
    """``value()`` at every call but the ``at_call``-th, which raises (the simulated bug)."""
    calls = [0]

    def call(*args: object) -> object:
        calls[0] += 1
        if calls[0] == at_call:
            raise ValueError("simulated bug")
        return value()
    return call


def run_until_failed(loop: EventLoop, production: FailingProduction) -> None:
    deadline = time.monotonic() + WAIT_S
    loop.run_until(lambda: bool(production.failed) or time.monotonic() > deadline, 0.05)


def internal_errors(said: list[str]) -> list[str]:
    return [line for line in said if line.startswith("internal error in ")]


@pytest.fixture(autouse=True)
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchlimits, "BENCH_CLOCK_CHECK_S", 0.1)  # (5 s and 2 s: pacing only)
    monkeypatch.setattr(benchlimits, "BENCH_CUT_CHECK_S", 0.1)


def test_the_benchmark_clock_fires_after_one_look_raised() -> None:
    loop, production, said = EventLoop(), FailingProduction(), []
    loop.faults.log = said.append
    started = [time.time()]  # the deadline's start: now at first, then (from the 3rd look) 100 s ago
    looks = [0]

    def clock() -> tuple[float, str]:
        looks[0] += 1
        if looks[0] == 3:
            started[0] = time.time() - 100.0
        return started[0], "the manager's param_done_at"

    link = SimpleNamespace(clock=raising_once(clock, at_call=2), delivered_answer=lambda kind: None)
    bench_clock = benchlimits.BenchClock(2.0, {"bench"}, link, production, loop.call_later)  # type: ignore[arg-type]
    bench_clock.heard_row(SimpleNamespace(state=benchlimits.PARAMS_DONE))  # type: ignore[arg-type]
    bench_clock.transition(PhaseView("bench", "oneshot", PhaseState.RUNNING, "", 1, False, False, None, None))
    run_until_failed(loop, production)
    assert [(name, reason) for name, reason, _ in production.failed] == [("bench", "too_slow")], said
    assert "benchmark timeout passed" in production.failed[0][2]
    [line] = internal_errors(said)  # the raise, said once by the loop
    assert "BenchClock.check" in line and "simulated bug" in line, line


def test_the_min_rate_cut_fires_after_one_look_raised() -> None:
    loop, production, said = EventLoop(), FailingProduction(), []
    loop.faults.log = said.append
    began = time.monotonic() - 1200.0  # the bench began 20 min ago: 12 proofs at 50/h needed 14.4 min at most
    times = iter([began])  # the first good look takes the bench's start; every later one the time now
    now = raising_once(lambda: next(times, None) or time.monotonic(), at_call=1)
    cut = benchlimits.BenchCut(50.0, production, loop.call_later, now=now)  # type: ignore[arg-type]
    parsed = BenchResult(expected=12, started=True)
    cut.transition(PhaseView("bench", "oneshot", PhaseState.RUNNING, "", 1, False, False, BENCH_DONE, parsed))
    run_until_failed(loop, production)
    assert [(name, reason) for name, reason, _ in production.failed] == [("bench", "too_slow")], said
    assert "the bench cannot pass any more" in production.failed[0][2]
    [line] = internal_errors(said)
    assert "BenchCut" in line and "simulated bug" in line, line


def test_a_look_that_raises_every_time_is_said_once_and_looked_at_again() -> None:
    """A look that always raises is still asked for again (each look may be the one that fires), and the loop says
    it once with its traceback, then only a count now and then: never a line a look."""
    loop, said = EventLoop(), []
    loop.faults.log = said.append
    calls = [0]

    def clock(name: str) -> tuple[float, str]:
        calls[0] += 1
        raise ValueError("simulated bug")

    link = SimpleNamespace(clock=clock, delivered_answer=lambda kind: None)
    bench_clock = benchlimits.BenchClock(2.0, {"bench"}, link, FailingProduction(), loop.call_later)  # type: ignore[arg-type]
    bench_clock.heard_row(SimpleNamespace(state=benchlimits.PARAMS_DONE))  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # the first look is the transition's own (its listener contains it)
        bench_clock.transition(PhaseView("bench", "oneshot", PhaseState.RUNNING, "", 1, False, False, None, None))
    deadline = time.monotonic() + WAIT_S
    loop.run_until(lambda: calls[0] >= 15 or time.monotonic() > deadline, 0.05)
    assert calls[0] >= 15, f"the looks stopped after {calls[0]}: {said}"
    first = [line for line in said if line.endswith("(contained; the supervisor goes on)")]
    assert len(first) == 1 and "BenchClock.check" in first[0], said
    assert len(internal_errors(said)) <= 2, said  # the first, and at most the count at 10
