"""A phase's pure decisions, in-process: what follows an attempt, and the memory preflight's figure."""

from __future__ import annotations

from dataclasses import replace

from supervisor.config import PhaseSpec, parse_plan
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.hooks import memory_shortfall
from supervisor.lifecycle.states import Next, after_attempt
from supervisor.lifecycle.verdict import Verdict

ONESHOT_TWO_RETRIES = """
[[phases]]
name = "p"
command = ["true"]
retries = 2
"""
SERVICE_NO_BURST = """
[[phases]]
name = "p"
kind = "service"
command = ["true"]
restart = "{restart}"
"""
SERVICE = SERVICE_NO_BURST + """restart_burst = 2
restart_window_s = 60
"""


def spec_of(toml: str) -> PhaseSpec:
    return parse_plan(toml, "test.toml", {}).phases[0]


def failed(reason: str = v.EXIT_CODE) -> Verdict:
    return v.without_exit("p", "p", reason, 1, "it broke", attempt=1)


def succeeded() -> Verdict:
    return replace(failed(), success=True, status=0, detail="")


def after(spec: PhaseSpec, outcome: Verdict, attempt: int = 1, *, expired: bool = False,
          restarts: tuple[float, ...] = (), never_up: int = 0, found: int = 0) -> tuple[Next, str]:
    return after_attempt(spec, outcome, attempt, deadline_expired=expired, restart_times=list(restarts), now=100.0,
                         never_up=never_up, found=found)


def test_a_oneshot_that_succeeded_is_done() -> None:
    assert after(spec_of(ONESHOT_TWO_RETRIES), succeeded(), 3) == (Next.DONE, "completed in 3 attempt(s)")


def test_a_oneshot_retries_until_its_retries_are_used() -> None:
    spec = spec_of(ONESHOT_TWO_RETRIES)
    assert after(spec, failed(), 1) == (Next.AGAIN, "exit_code; retry 1 of 2")
    assert after(spec, failed(), 2) == (Next.AGAIN, "exit_code; retry 2 of 2")
    assert after(spec, failed(), 3) == (Next.FAIL, "exit_code (all 2 retries used)")


def test_a_timeout_once_the_phase_deadline_passed_is_not_retried() -> None:
    spec = spec_of(ONESHOT_TWO_RETRIES)
    assert after(spec, failed(v.TIMEOUT), expired=False)[0] is Next.AGAIN  # a child's own ready timeout
    assert after(spec, failed(v.TIMEOUT), expired=True) == (Next.FAIL, "timeout: it broke")


def test_an_internal_error_is_never_retried_nor_restarted() -> None:
    for spec in (spec_of(ONESHOT_TWO_RETRIES), spec_of(SERVICE.format(restart="always"))):
        assert after(spec, failed(v.INTERNAL_ERROR)) == (Next.FAIL, "it broke")


def test_a_service_follows_its_restart_policy() -> None:
    on_failure = spec_of(SERVICE.format(restart="on-failure"))
    assert after(on_failure, succeeded()) == (Next.DONE, "service ended cleanly (restart = 'on-failure')")
    assert after(on_failure, failed()) == (Next.AGAIN, "exit_code; restart = 'on-failure'")
    never = spec_of(SERVICE_NO_BURST.format(restart="no"))  # (a burst means nothing without restarts: refused)
    assert after(never, failed()) == (Next.FAIL, "service ended: exit_code (restart = 'no')")


def test_a_service_restarted_restart_burst_times_within_the_window_gives_up() -> None:
    spec = spec_of(SERVICE.format(restart="always"))
    assert after(spec, failed(), restarts=(10.0, 90.0))[0] is Next.AGAIN  # 10.0 is outside the 60 s window
    step, why = after(spec, failed(), restarts=(50.0, 90.0))
    assert step is Next.FAIL and "restarted 2 times within 60s (restart_burst): giving up" in why


def test_a_service_restarted_restart_burst_times_in_a_row_without_coming_up_gives_up_whatever_the_window() -> None:
    # Its restarts far apart (each attempt a long ready wait): the window never trips, and it was restarted for good.
    spec = spec_of(SERVICE.format(restart="always"))
    assert after(spec, failed(), restarts=(90.0,), never_up=2)[0] is Next.AGAIN  # the first attempt, 2 restarts
    assert after(spec, failed(), restarts=(90.0,), never_up=3) == (
        Next.FAIL, "exit_code; restarted 2 times in a row without coming up (restart_burst): giving up")
    assert after(spec, succeeded(), restarts=(90.0,), never_up=3)[0] is Next.FAIL  # (a clean end under "always")
    assert after(spec, failed(), restarts=(50.0, 90.0), never_up=3) == (  # both: the window says it, as before
        Next.FAIL, "exit_code; restarted 2 times within 60s (restart_burst): giving up")


def test_a_service_a_watch_ended_restart_burst_times_in_a_row_gives_up_whatever_the_window() -> None:
    # Each attempt lives as long as the watch takes to judge (NVML hung 60 s of it, a plugin's watch minutes): the
    # window never trips, and a fault a restart does not cure was restarted for good. Each came up: never_up is 0.
    spec = spec_of(SERVICE.format(restart="on-failure"))
    assert after(spec, failed(v.GPU_UNRESPONSIVE), restarts=(90.0,), found=2)[0] is Next.AGAIN
    assert after(spec, failed(v.GPU_UNRESPONSIVE), restarts=(90.0,), found=3) == (
        Next.FAIL, "gpu_unresponsive; restarted 2 times in a row, each attempt ended by a watch's finding "
                   "(restart_burst): giving up")
    assert after(spec, failed(v.STALLED), restarts=(90.0,), found=3)[0] is Next.FAIL
    assert after(spec, failed(v.GPU_UNRESPONSIVE), restarts=(50.0, 90.0), found=3) == (  # both: the window says it
        Next.FAIL, "gpu_unresponsive; restarted 2 times within 60s (restart_burst): giving up")


def test_the_memory_preflight_refuses_only_what_cannot_fit() -> None:
    said: list[str] = []
    assert memory_shortfall("p", None, 100, said.append) is None  # no min_memory: nothing to check
    assert memory_shortfall("p", 100, None, said.append) is None  # nothing readable: skipped, and said
    assert memory_shortfall("p", 100, 100, said.append) is None
    refusal = memory_shortfall("p", 101, 100, said.append)
    assert refusal is not None and "needs min_memory=" in refusal and "(101 bytes)" in refusal
    assert [line.split(": ", 1)[1].split(":")[0] for line in said] == ["memory preflight skipped",
                                                                      "memory preflight ok"]


def test_a_oneshot_whose_deadline_passed_while_it_was_stopped_is_not_retried() -> None:
    # timeout_s ran out while the attempt's children were being stopped (its own verdict is not ``timeout``):
    # no attempt may start after the phase's deadline, whatever retries are left.
    spec = spec_of(ONESHOT_TWO_RETRIES + "timeout_s = 60\n")
    step, why = after(spec, failed(), 1, expired=True)
    assert (step, why) == (Next.FAIL, "exit_code; the phase deadline timeout_s=60 passed: no retry")
    assert after(spec, failed(), 1)[0] is Next.AGAIN
