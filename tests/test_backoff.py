"""Pure-function tests of restart and retry pacing (supervisor.lifecycle.states)."""

from __future__ import annotations

import random

import pytest

from supervisor.lifecycle.states import backoff_delay, burst_exceeded, within_window
from supervisor.manager.client import RETRY_INITIAL_S, RETRY_JITTER_S, RETRY_MAX_S, retry_wait_s

# ---------------------------------------------------------------- backoff_delay


def test_grows_by_factor_without_jitter() -> None:
    delays = [backoff_delay(n, base=0.5, factor=2.0, cap=1000.0, jitter=0.0, rand=0.9) for n in range(1, 7)]
    assert delays == pytest.approx([0.5, 1.0, 2.0, 4.0, 8.0, 16.0])


def test_other_factor() -> None:
    delays = [backoff_delay(n, base=1.0, factor=3.0, cap=1000.0, jitter=0.0, rand=0.0) for n in range(1, 5)]
    assert delays == pytest.approx([1.0, 3.0, 9.0, 27.0])


def test_factor_one_is_constant() -> None:
    assert {backoff_delay(n, 2.0, 1.0, 30.0, 0.0, 0.5) for n in range(1, 20)} == {2.0}


def test_first_failure_waits_base() -> None:
    assert backoff_delay(1, base=1.5, factor=10.0, cap=30.0, jitter=0.0, rand=0.3) == pytest.approx(1.5)


def test_capped() -> None:
    assert backoff_delay(5, base=1.0, factor=2.0, cap=10.0, jitter=0.0, rand=0.5) == pytest.approx(10.0)
    assert backoff_delay(4, base=1.0, factor=2.0, cap=10.0, jitter=0.0, rand=0.5) == pytest.approx(8.0)
    # base above the cap: the cap still wins
    assert backoff_delay(1, base=50.0, factor=2.0, cap=10.0, jitter=0.0, rand=0.5) == pytest.approx(10.0)


def test_huge_failure_counts_do_not_overflow() -> None:
    for n in (64, 65, 1000, 10**6, 10**12):
        assert backoff_delay(n, base=1.0, factor=2.0, cap=30.0, jitter=0.1, rand=0.99) <= 30.0
        assert backoff_delay(n, base=1.0, factor=2.0, cap=30.0, jitter=0.0, rand=0.5) == pytest.approx(30.0)
        assert backoff_delay(n, base=1.0, factor=10.0, cap=300.0, jitter=0.0, rand=0.5) == pytest.approx(300.0)


@pytest.mark.parametrize("failures", [0, -1, -100])
def test_no_failure_no_delay(failures: int) -> None:
    assert backoff_delay(failures, base=1.0, factor=2.0, cap=30.0, jitter=0.5, rand=0.9) == 0.0


def test_jitter_bounds_over_many_rand_values() -> None:
    rng = random.Random(1234)
    base, factor, cap, jitter = 1.0, 2.0, 30.0, 0.25
    for failures in range(1, 12):
        raw = min(cap, base * factor ** (failures - 1))
        seen = []
        for _ in range(2000):
            d = backoff_delay(failures, base, factor, cap, jitter, rng.random())
            assert raw * (1 - jitter) - 1e-9 <= d <= min(cap, raw * (1 + jitter)) + 1e-9
            assert 0.0 <= d <= cap
            seen.append(d)
        # the spread is really used: both sides of the raw delay occur
        assert min(seen) < raw * (1 - jitter / 2)
        if raw < cap:
            assert max(seen) > raw * (1 + jitter / 2)


def test_jitter_extremes() -> None:
    # rand = 0 → lowest, rand = 0.5 → exactly raw, rand → 1 → highest
    assert backoff_delay(3, 1.0, 2.0, 30.0, 0.1, 0.0) == pytest.approx(3.6)
    assert backoff_delay(3, 1.0, 2.0, 30.0, 0.1, 0.5) == pytest.approx(4.0)
    assert backoff_delay(3, 1.0, 2.0, 30.0, 0.1, 0.999999) == pytest.approx(4.4, abs=1e-4)


def test_full_jitter_never_negative_nor_above_cap() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        failures = rng.randint(1, 40)
        d = backoff_delay(failures, 0.5, 2.0, 8.0, 1.0, rng.random())
        assert 0.0 <= d <= 8.0
    assert backoff_delay(2, 1.0, 2.0, 30.0, 1.0, 0.0) == 0.0


def test_jitter_at_cap_stays_at_or_below_cap() -> None:
    for rand in (0.0, 0.25, 0.5, 0.75, 0.999):
        d = backoff_delay(20, 1.0, 2.0, 10.0, 0.2, rand)
        assert 8.0 - 1e-9 <= d <= 10.0


def test_zero_base_is_zero() -> None:
    assert backoff_delay(5, 0.0, 2.0, 10.0, 0.5, 0.9) == 0.0


# ---------------------------------------------------------------- within_window / burst_exceeded


def test_within_window_edges() -> None:
    now = 100.0
    times = [80.0, 89.999, 90.0, 90.001, 95.0, 100.0]
    # strictly inside the last 10 s: exactly ``window`` ago is outside
    assert within_window(times, now, 10.0) == [90.001, 95.0, 100.0]
    assert within_window([], now, 10.0) == []
    assert within_window(times, now, 1000.0) == times


def test_within_window_keeps_order_and_accepts_iterables() -> None:
    assert within_window(iter([99.0, 95.0, 50.0, 98.0]), 100.0, 10.0) == [99.0, 95.0, 98.0]


def test_burst_not_exceeded_below_burst() -> None:
    assert not burst_exceeded([], 100.0, 3, 60.0)
    assert not burst_exceeded([50.0, 90.0], 100.0, 3, 60.0)


def test_burst_exceeded_at_burst() -> None:
    assert burst_exceeded([50.0, 60.0, 90.0], 100.0, 3, 60.0)
    assert burst_exceeded([45.0, 50.0, 60.0, 90.0], 100.0, 3, 60.0)


def test_burst_old_restarts_do_not_count() -> None:
    # 40.0 is exactly one window before now: out of the window
    assert not burst_exceeded([10.0, 40.0, 60.0, 90.0], 100.0, 3, 60.0)
    assert burst_exceeded([10.0, 40.001, 60.0, 90.0], 100.0, 3, 60.0)


def test_burst_of_one() -> None:
    assert not burst_exceeded([], 10.0, 1, 5.0)
    assert burst_exceeded([9.0], 10.0, 1, 5.0)
    assert not burst_exceeded([5.0], 10.0, 1, 5.0)


def test_the_manager_clients_wait_doubles_with_jitter_up_to_its_cap() -> None:
    for attempts in range(1, 8):
        base = min(RETRY_MAX_S, RETRY_INITIAL_S * 2 ** (attempts - 1))
        waits = [retry_wait_s(attempts) for _ in range(200)]
        assert all(base <= w <= min(RETRY_MAX_S, base + RETRY_JITTER_S) for w in waits), (attempts, waits[:5])
    assert retry_wait_s(10_000) == RETRY_MAX_S  # no overflow, however long the outage
