"""supervisor.evidence.transfer's pure figures, at their edges: the rate window (one sample, no time between samples,
bytes that went back, a window kept to its length), the ETA's cases, ``too_slow`` when nothing is left or the
deadline already passed, and the
status line for every shape a ``progress`` object may have (including one from a newer or older supervisor).
tests/test_transfer.py covers the main rate, the deadline boundary and the full line; not repeated here."""

from __future__ import annotations

from supervisor.evidence.transfer import (
    BAR_WIDTH,
    MOVING_MIN_B_S,
    Progress,
    RateWindow,
    figures,
    judged_rate,
    progress_text,
    too_slow,
)

MIB = 1 << 20
GIB = 1 << 30


def test_a_window_of_one_sample_has_no_rate_yet() -> None:
    window = RateWindow(10.0)
    assert window.rate() is None and window.average() is None
    window.add(5.0, 100)
    assert window.rate() is None and window.average() is None


def test_two_samples_at_the_same_moment_have_no_rate() -> None:
    window = RateWindow(10.0)
    window.add(5.0, 100)
    window.add(5.0, 200)
    assert window.rate() is None and window.average() is None


def test_bytes_that_went_back_are_a_rate_of_zero_not_negative() -> None:
    """A partial file deleted and fetched again (aria2c's restart): done bytes fall; the rate is 0, never < 0."""
    window = RateWindow(10.0)
    window.add(0.0, 500 * MIB)
    window.add(5.0, 100 * MIB)
    assert window.rate() == 0.0 and window.average() == 0.0


def test_the_window_keeps_one_sample_at_or_before_its_start() -> None:
    """The rate spans the whole window: samples every 1 s, a 10 s window: the rate is the last 10 s exactly."""
    window = RateWindow(10.0)
    for t in range(100):
        window.add(float(t), t * t)  # speeding up: the window's rate is well above the average
    assert window.rate() == (99 * 99 - 89 * 89) / 10
    assert window.average() == 99 * 99 / 99


def test_sparse_samples_wider_than_the_window_still_give_a_rate() -> None:
    """Samples 30 s apart, a 10 s window: the last two are kept (two at least), the rate is theirs."""
    window = RateWindow(10.0)
    for t, done in ((0.0, 0), (30.0, 300), (60.0, 900)):
        window.add(t, done)
    assert window.rate() == 20.0
    assert window.average() == 15.0


def test_the_average_counts_from_the_first_sample_ever() -> None:
    window = RateWindow(5.0)
    window.add(100.0, 1000)
    for t in range(101, 200):
        window.add(float(t), 1000 + (t - 100) * 10)
    assert window.average() == 10.0


def test_a_window_restarted_where_movement_began_counts_its_average_from_there() -> None:
    window = RateWindow(60.0)
    for t in range(20):  # 20 s of silence, then 1 MiB/s
        window.add(float(t), 7)
    for t in range(20, 31):
        window.add(float(t), 7 + (t - 19) * MIB)
    assert window.average() is not None and window.average() < MIB / 2, "diluted by the silence"
    assert window.rate() == window.average()
    window.since(19.0)
    assert window.average() == MIB and window.rate() == MIB and window.covered() == 11.0
    window.since(100.0)  # (all of it before: nothing left, the next sample begins afresh)
    assert window.rate() is None and window.average() is None
    window.add(101.0, 0)
    window.add(102.0, MIB)
    assert window.average() == MIB


def test_a_window_that_moved_under_the_floor_is_no_rate_to_judge_on() -> None:
    """Output lines, the spawn's setup writes: a window that moved less than MOVING_MIN_B_S a second has no rate
    (silence is the stall watch's); one that moved more is judged on the better of its rate and the average."""
    window = RateWindow(10.0)
    for t in range(11):
        window.add(float(t), 7 + t * 100)  # a line a second
    assert window.rate() == 100.0 and judged_rate(window) is None
    quiet = RateWindow(10.0)
    quiet.add(0.0, 0)
    quiet.add(10.0, 0)
    assert judged_rate(quiet) is None
    assert judged_rate(RateWindow(10.0)) is None
    slow = RateWindow(10.0)
    for t in range(11):
        slow.add(float(t), int(t * MOVING_MIN_B_S * 8))  # 8 KiB/s: slow, but a rate
    assert judged_rate(slow) == MOVING_MIN_B_S * 8
    slowed = RateWindow(10.0)
    for t in range(31):  # 1 MiB/s for 20 s, then 8 KiB/s: the average is the better
        slowed.add(float(t), t * MIB if t <= 20 else 20 * MIB + (t - 20) * 8 * 1024)
    assert judged_rate(slowed) == slowed.average() and slowed.average() > slowed.rate()


def test_without_a_total_there_is_no_eta() -> None:
    progress = figures(10 * MIB, None, MIB)
    assert (progress.total_bytes, progress.eta_s) == (None, None)


def test_without_a_rate_there_is_no_eta_until_it_is_done() -> None:
    assert figures(10, 100, None).eta_s is None
    assert figures(10, 100, 0.0).eta_s is None
    assert figures(100, 100, None).eta_s == 0.0
    assert figures(100, 100, 0.0).eta_s == 0.0


def test_files_done_is_carried_through() -> None:
    assert figures(1, 2, 1.0, files_done=7).files_done == 7
    assert figures(1, 2, 1.0).files_done is None


def test_the_status_object_has_exactly_its_keys_rounded() -> None:
    progress = Progress(5, 10, 1234.5678, 4.04999, 2)
    assert progress.to_dict() == {"done_bytes": 5, "total_bytes": 10, "rate_bytes_s": 1234.6, "eta_s": 4.0,
                                  "files_done": 2}
    assert Progress(5, None, None, None).to_dict() == {"done_bytes": 5, "total_bytes": None, "rate_bytes_s": None,
                                                       "eta_s": None, "files_done": None}


def test_nothing_left_to_fetch_is_never_too_slow() -> None:
    done = figures(50 * GIB, 50 * GIB, MIB)
    assert too_slow(done, MIB, -100.0, "the deadline") is None


def test_no_rate_to_judge_on_is_never_too_slow() -> None:
    assert too_slow(figures(1, 100, None), None, 0.0, "x") is None
    assert too_slow(figures(1, 100, 1.0), -1.0, 0.0, "x") is None


def test_a_deadline_already_passed_says_no_time_left_not_a_negative_one() -> None:
    detail = too_slow(figures(0, 10 * MIB, MIB), MIB, -300.0, "the manager's timeout")
    assert detail == "10.0MiB left at 1.0MiB/s: 10s, 0s left before the manager's timeout"


def test_too_slow_just_inside_and_just_outside_the_margin() -> None:
    progress = figures(0, 100 * MIB, MIB)  # needs 100 s; with the 10 % margin 110 s
    assert too_slow(progress, MIB, 110.5, "x") is None
    assert too_slow(progress, MIB, 109.0, "x") is not None
    assert too_slow(progress, MIB, 100.0, "x") is not None, "the ETA alone is not enough: no margin left"


def test_the_rate_judged_is_the_one_given_not_the_figures() -> None:
    """progresswatch judges on the better of the window's rate and the average: too_slow takes that rate."""
    progress = figures(0, 100 * MIB, 0.1 * MIB)  # the window says 1000 s
    assert too_slow(progress, 10 * MIB, 60.0, "x") is None  # but the average says 10 s


def test_no_line_for_what_is_not_a_progress_object() -> None:
    for progress in (None, [], "31%", {}, {"done_bytes": None}, {"done_bytes": "5"}, {"done_bytes": 1.5}):
        assert progress_text(progress) is None, progress


def test_an_unknown_total_draws_no_bar() -> None:
    line = progress_text({"done_bytes": 3 * MIB, "total_bytes": None, "rate_bytes_s": None, "eta_s": None})
    assert line == "3.0MiB of an unknown total rate ?"


def test_a_zero_or_odd_total_is_an_unknown_one() -> None:
    for total in (0, -5, "50GiB", 1.5):
        assert progress_text({"done_bytes": 1, "total_bytes": total}) == "1B of an unknown total rate ?", total


def test_the_bar_is_full_and_stops_at_100_percent() -> None:
    line = progress_text({"done_bytes": 120, "total_bytes": 100, "rate_bytes_s": 0, "eta_s": 0})
    assert line == f"[{'#' * BAR_WIDTH}] 120% 120B/100B 0B/s ETA 0s".replace("120%", "100%")


def test_an_empty_bar_and_the_files_complete() -> None:
    line = progress_text({"done_bytes": 0, "total_bytes": GIB, "rate_bytes_s": 2.0 * MIB, "eta_s": 512.0,
                          "files_done": 0})
    assert line == f"[{'.' * BAR_WIDTH}] 0% 0B/1.0GiB 2.0MiB/s ETA 8m32s, 0 file(s) complete"


def test_a_half_bar_has_half_its_width() -> None:
    line = progress_text({"done_bytes": 50, "total_bytes": 100})
    assert line is not None and line.startswith(f"[{'#' * (BAR_WIDTH // 2)}{'.' * (BAR_WIDTH - BAR_WIDTH // 2)}] 50%")
    assert line.endswith(" rate ?"), "no rate: said as unknown; no ETA: nothing said"
