"""supervisor.manager.repush, in-process: the one text pushed again under a new uuid (a heading, the old uuid's
durable pushes, then the supervisor's own last lines), bounded, and what it keeps when cut; the own lines kept
are the latest RECENT_LINES."""

from __future__ import annotations

from supervisor.manager.repush import RECENT_LINES, REPUSH_MAX_CHARS, RecentLines, repush_text


def test_the_text_is_a_heading_the_durable_pushes_then_the_recent_lines() -> None:
    text = repush_text("u-old", "u-new", ["FAILED: bench\n", "  ", "exiting\n"], ["registered", "said last"])
    assert text.splitlines() == [
        "prover-supervisor: registered again as u-new: the manager no longer knew u-old; what was pushed under it "
        "follows",
        "FAILED: bench", "exiting",
        "prover-supervisor: the supervisor's last 2 line(s) before that:",
        "[supervisor] registered", "[supervisor] said last"]


def test_a_text_past_the_bound_keeps_its_end_the_latest_lines() -> None:
    durable = [f"push {n} " + "d" * 1000 for n in range(100)]  # 100 KB of old pushes
    text = repush_text("u-old", "u-new", durable, ["the very last line"])
    assert len(text) == REPUSH_MAX_CHARS
    assert text.endswith("[supervisor] the very last line")
    assert "push 99 " in text and "push 0 " not in text


def test_recent_lines_keep_only_the_latest() -> None:
    recent = RecentLines()
    for n in range(RECENT_LINES + 10):
        recent.add(f"line {n}")
    assert recent.lines() == [f"line {n}" for n in range(10, RECENT_LINES + 10)]
