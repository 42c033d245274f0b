"""The bench cut (prover/benchlimits.py), in-process on a fake clock and hand-run timers.

tests/prover/test_fetch_progress.py covers the boundary (``hopeless`` at N / min_rate, the cut at it); these
cover which phases are watched at all, that a look for an attempt that is over does nothing (a new attempt,
a phase that stopped running, a bench whose summary is in), that a bench whose N is unknown is never cut,
that the cut happens once and the looks stop, and that ``attach_cut`` adds it only where a manager judges.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from supervisor.lifecycle.states import PhaseState
from supervisor.prover.bench import BenchResult
from supervisor.prover.benchlimits import BENCH_CUT_CHECK_S, BenchCut, attach_cut, hopeless
from supervisor.prover.fleet import BENCH_DONE
from supervisor.wiring import PhaseView, Wiring


class Production:
    def __init__(self) -> None:
        self.failed: list[tuple[str, str, str]] = []

    def hold(self, phase_name: str, why: str) -> None: ...

    def release(self, phase_name: str) -> None: ...

    def stop_from_outside(self, why: str, status: int) -> None: ...

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        self.failed.append((name, reason, detail))
        return True


class Rig:
    """A BenchCut with its timers kept (delay, callback) and a clock the test moves."""

    def __init__(self, min_rate: float = 3600.0) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.production = Production()
        self.cut = BenchCut(min_rate, self.production, lambda d, cb: self.timers.append((d, cb)),  # type: ignore
                            now=lambda: self.now)

    def view(self, state: PhaseState = PhaseState.RUNNING, parsed: Any = None, attempt: int = 1,
             report: str | None = BENCH_DONE, name: str = "bench") -> PhaseView:
        return PhaseView(name, "oneshot", state, "", attempt, False, False, report, parsed)

    def run_timers(self, at: float) -> None:
        """Move the clock to ``at`` and run the looks due (each may ask for the next)."""
        self.now = at
        due, self.timers = self.timers, []
        for _, cb in due:
            cb()


def test_only_a_running_bench_done_phase_with_a_bench_result_is_watched() -> None:
    rig = Rig()
    rig.cut.transition(rig.view(report=None, parsed=BenchResult()))
    rig.cut.transition(rig.view(report="other", parsed=BenchResult()))
    rig.cut.transition(rig.view(state=PhaseState.STARTING, parsed=BenchResult()))
    rig.cut.transition(rig.view(parsed=None))  # no parser's result yet
    rig.cut.transition(rig.view(parsed={"proofs": 3}))
    assert rig.timers == []
    rig.cut.transition(rig.view(parsed=BenchResult()))
    assert [d for d, _ in rig.timers] == [BENCH_CUT_CHECK_S]


def test_a_bench_that_left_running_is_looked_at_no_more() -> None:
    rig = Rig()
    result = BenchResult(proofs={"COMPLETED": 1}, expected=4)
    rig.cut.transition(rig.view(parsed=result))
    rig.cut.transition(rig.view(state=PhaseState.STOPPING, parsed=result))
    rig.run_timers(10_000.0)
    rig.run_timers(20_000.0)
    assert rig.production.failed == [] and rig.timers == []


def test_a_look_for_an_earlier_attempt_does_nothing_and_the_new_one_counts_afresh() -> None:
    rig = Rig()
    first = BenchResult(proofs={"COMPLETED": 1}, expected=4)
    rig.cut.transition(rig.view(parsed=first, attempt=1))
    rig.run_timers(2.0)  # first proof line of attempt 1 seen at t=2
    second = BenchResult()
    rig.cut.transition(rig.view(parsed=second, attempt=2))
    assert len(rig.timers) == 2  # attempt 1's next look, attempt 2's first
    second.proofs["COMPLETED"], second.expected = 1, 4
    rig.run_timers(100.0)  # attempt 1 would be hopeless by now (98 s > 4 s); attempt 2 starts counting here
    assert rig.production.failed == []
    assert len(rig.timers) == 1  # only attempt 2 goes on being looked at
    rig.run_timers(104.0)
    assert rig.production.failed == []
    rig.run_timers(104.5)
    assert [(n, r) for n, r, _ in rig.production.failed] == [("bench", "too_slow")]


def test_a_bench_whose_summary_is_in_is_judged_by_it_not_cut() -> None:
    rig = Rig()
    result = BenchResult(proofs={"COMPLETED": 1}, expected=4)
    rig.cut.transition(rig.view(parsed=result))
    rig.run_timers(2.0)
    result.summary_seen = True
    rig.run_timers(10_000.0)
    assert rig.production.failed == [] and rig.timers == []


def test_a_bench_of_unknown_n_is_never_cut_but_still_watched() -> None:
    rig = Rig()
    result = BenchResult(proofs={"FAILED": 2})  # proof lines without a [k/N]
    rig.cut.transition(rig.view(parsed=result))
    for at in (2.0, 1_000.0, 100_000.0):
        rig.run_timers(at)
    assert rig.production.failed == [] and len(rig.timers) == 1


def test_failed_proofs_start_the_count_and_only_completed_ones_are_done() -> None:
    rig = Rig(min_rate=3600.0)
    result = BenchResult(proofs={"FAILED": 1}, expected=2)  # 2 proofs at 3600/h: 2 s at most
    rig.cut.transition(rig.view(parsed=result, name="cuzk-bench"))
    rig.run_timers(5.0)  # the first proof line (a failure) starts the count
    rig.run_timers(7.5)
    assert len(rig.production.failed) == 1
    name, reason, why = rig.production.failed[0]
    assert (name, reason) == ("cuzk-bench", "too_slow")
    assert "0 of 2 proofs done" in why
    assert rig.timers == []
    rig.run_timers(50.0)  # nothing more is looked at, nothing failed twice
    assert len(rig.production.failed) == 1


def test_hopeless_knows_nothing_without_n_rate_or_time() -> None:
    assert hopeless(0, 0, 10_000.0, 50.0) is None
    assert hopeless(-1, 0, 10_000.0, 50.0) is None
    assert hopeless(10, 0, 0.0, 50.0) is None
    assert hopeless(10, 0, 10_000.0, -5.0) is None


def test_hopeless_says_the_best_rate_still_possible_and_the_limit() -> None:
    # 10 proofs at 20/h: 30 min at most; after 40 min the best is 10 / (40/60 h) = 15/h.
    why = hopeless(10, 3, 40 * 60.0, 20.0)
    assert why == ("the bench cannot pass any more: 40.0 min since it began, 3 of 10 proofs done; "
                   "the best rate still possible is 15.0/h < min_rate 20/h (10 proofs needed 30.0 min at most)")


def test_attach_adds_the_cut_only_where_a_manager_judges() -> None:
    listeners: list[Any] = []
    timers: list[Callable[[], None]] = []
    production = Production()

    def wiring(manager: Any) -> Wiring:
        plan = SimpleNamespace(extensions={"manager": {"min_rate": 1800.0}})
        return Wiring(plan=plan, events=SimpleNamespace(on_transition=listeners.append),  # type: ignore[arg-type]
                      production=production, manager=manager, export_env=lambda k, v: None,
                      call_later=lambda d, cb: timers.append(cb), log=lambda line: None)  # type: ignore

    attach_cut(wiring(None))
    assert listeners == []
    rows: list[Any] = []
    attach_cut(wiring(SimpleNamespace(on_row=rows.append)))  # a ManagerLink: the cut hears the manager's row too
    assert len(listeners) == 1 and len(rows) == 1
    # The attached cut hears the transitions and looks on the wiring's timers.
    result = BenchResult(proofs={"COMPLETED": 1}, expected=1)
    listeners[0](PhaseView("bench", "oneshot", PhaseState.RUNNING, "", 1, False, False, BENCH_DONE, result))
    timers.pop()()  # the first proof line: the count starts (at the real clock's now)
    assert production.failed == [] and len(timers) == 1
