"""Status text and verdict lines read as a person would write them: a time that never came is "never" (not
"?"), and a command or a detail with an apostrophe is shown in plain double quotes (no shlex ``'"'"'``)."""

from __future__ import annotations

from helpers import Runner, failure, first_line, toml_list, verdict_lines

from supervisor.status.model import Snapshot
from supervisor.status.render import render
from supervisor.text.show import logged


def _live_snapshot(now: float, last: dict[str, object]) -> dict[str, object]:
    child = {"label": "svc/svc", "pid": 7, "state": "running", "started_at": now - 30, "last_output_at": None,
             "usage": {"processes": 1, "cpu_s": 0.1, "rss": 1 << 20}, "last_lines": []}
    return {"pid": 42, "role": "subreaper", "started_at": now - 40, "config": "c.toml",
            "lifecycle": {"state": "running", "why": "", "current": "svc"},
            "phases": [{"name": "svc", "state": "running", "since": now - 30, "attempt": 1, "why": "up"}],
            "children": [child], "gpus": {"why": "no GPU"}, "memory": {"mode": "shared", "why": "w"},
            "manager": {"enabled": True, "url": "http://127.0.0.1:1", "uuid": "u", "outbox_pending": 0,
                        "last_delivered": last}}


def test_a_child_that_never_wrote_reads_last_output_never() -> None:
    now = 10_000.0
    text = render(Snapshot.from_json(_live_snapshot(now, {})), live=True, now=now)
    (line,) = [x for x in text.splitlines() if x.startswith("  svc/svc")]
    assert line.endswith("last output never"), text
    assert "up 30s," in line, line
    assert "?" not in line, line


def test_a_manager_never_delivered_to_reads_none_and_a_delivery_its_age() -> None:
    now = 10_000.0
    text = render(Snapshot.from_json(_live_snapshot(now, {})), live=True, now=now)
    assert "last delivered none" in text and "last delivered none " not in text, text
    text = render(Snapshot.from_json(_live_snapshot(now, {"kind": "register", "at": now - 12})), live=True, now=now)
    assert "last delivered register 12s ago" in text, text


def test_a_phase_or_a_saved_state_with_no_time_reads_never() -> None:
    now = 10_000.0
    snap = _live_snapshot(now, {})
    snap["phases"] = [{"name": "svc", "state": "pending", "since": None, "attempt": 0, "why": "not started"}]
    text = render(Snapshot.from_json(snap), True, now)
    assert "  svc          pending   since never, attempt 0: not started" in text.splitlines()
    snap["written_at"] = None
    assert "last state written never by pid 42" in render(Snapshot.from_json(snap), False, now)


def test_a_value_is_shown_bare_or_in_plain_double_quotes() -> None:
    assert logged("exited") == "exited"
    assert logged("the phase's command") == '"the phase\'s command"'
    assert logged('say "hi" \\ bye') == '"say \\"hi\\" \\\\ bye"'
    assert logged("") == '""'


def test_an_apostrophe_in_a_failing_command_leaves_no_shell_quoting_in_the_verdict(sup: Runner) -> None:
    missing = str(sup.tmp / "phase's tool")
    config = sup.write(f"""
        [[phases]]
        name = "missing"
        command = {toml_list([missing, "it's"])}
        """)
    result = sup.run(config, timeout=30)
    assert result.returncode == 127, result.output  # (command not found, as a shell says it)
    assert "'\"'\"'" not in result.output, result.output
    (line,) = verdict_lines(result.output, "missing", kind="FAILED")
    assert line.endswith(f'detail="{missing}: command not found"'), line
    assert failure(result.output)["detail"] == f"{missing}: command not found"


def test_an_apostrophe_in_a_command_is_shown_in_double_quotes_when_it_starts(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "quoted"
        command = {toml_list(["sh", "-c", 'echo "$0"; exit 3', "the phase's output"])}
        """)
    result = sup.run(config, timeout=30)
    assert result.returncode == 3, result.output
    assert "'\"'\"'" not in result.output, result.output
    started = first_line(result.output, "started quoted/quoted: pid")
    assert started.endswith('sh -c "echo \\"$0\\"; exit 3" "the phase\'s output"'), started
    assert failure(result.output)["detail"] == "exited with code 3"


def test_a_long_last_line_is_shown_cut_with_a_mark() -> None:
    # A child's last line was cut at 160 characters with nothing to say so: the reader took it for the whole line.
    now = 10_000.0
    snap = _live_snapshot(now, {})
    snap["children"][0]["last_lines"] = ["short", "x" * 400]  # type: ignore[index]
    text = render(Snapshot.from_json(snap), live=True, now=now)
    shown = [x for x in text.splitlines() if x.startswith("      | ")]
    assert shown == ["      | short", "      | " + "x" * 157 + "..."], text
