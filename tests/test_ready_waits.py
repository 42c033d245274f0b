"""What a readiness wait counts, and what it says when nothing counted (supervisor/engine/readiness.py,
lifecycle/attempt.py).

A ``file`` check counts only a file made or changed since its daemon started: one left by an earlier attempt,
or by a supervisor that ran before on the same volume, is said ("exists but is older than this start") and
waited past, as a port held before the start is refused (tests/test_ready_ports.py). A daemon that is not
ready in time fails its attempt once: its stop, which follows, says that failure as its cause.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from helpers import Runner, one_verdict, sh, toml_str, verdict_fields, verdict_lines

from supervisor.config import ReadyCheck
from supervisor.engine import readiness
from supervisor.engine.loop import EventLoop
from supervisor.exits import EXIT_TIMEOUT

# ---------------------------------------------------------------- a file left from before


def stale_file_config(sup: Runner, ready: Path, *, retries: int) -> Path:
    # The daemon takes a while to write its file, and says so first (its line is in before its file, which is looked
    # for every 0.2 s).
    return sup.write(f"""
        [[phases]]
        name = "p"
        retries = {retries}
        backoff_s = 0.2
        command = {sh(f"exit {3 if retries else 0}")}
        [[phases.daemons]]
        name = "d"
        command = {sh(f"echo daemon warming up; sleep 1; echo daemon writes it; sleep 0.3; echo x > {ready}; "
                      "exec sleep 100")}
        ready = {toml_str(str(ready))}
        ready_timeout_s = 20
        stop_grace_s = 1
    """)


def said_in_order(output: str) -> list[str]:
    """The daemon's writes of the ready file (said as it begins one) and the supervisor's "is ready", in order."""
    return [("wrote" if "[p/d] daemon writes it" in line else "ready") for line in output.splitlines()
            if "[p/d] daemon writes it" in line or "p/d is ready" in line]


def test_a_ready_file_left_by_the_attempt_before_does_not_make_the_next_ready(sup: Runner) -> None:
    ready = sup.tmp / "d.ready"
    res = sup.run(stale_file_config(sup, ready, retries=1), timeout=60)
    assert res.returncode == 3, res.output
    # Each attempt's daemon is ready once it wrote its file, not at once on the first attempt's file.
    assert said_in_order(res.output) == ["wrote", "ready", "wrote", "ready"], res.output


def test_a_ready_file_left_by_a_supervisor_before_does_not_make_the_daemon_ready(sup: Runner) -> None:
    ready = sup.tmp / "d.ready"  # (on the volume both supervisors use)
    config = stale_file_config(sup, ready, retries=0)
    first = sup.run(config, timeout=60)
    assert first.returncode == 0 and ready.exists(), first.output
    again = sup.run(config, timeout=60)
    assert again.returncode == 0, again.output
    assert said_in_order(again.output) == ["wrote", "ready"], again.output


def test_a_file_older_than_the_start_is_said_when_the_wait_runs_out(sup: Runner) -> None:
    ready = sup.tmp / "d.ready"
    ready.write_text("from before\n")
    os.utime(ready, (time.time() - 30, time.time() - 30))
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = ["true"]
        [[phases.daemons]]
        name = "d"
        command = ["sleep", "100"]
        ready = {toml_str(str(ready))}
        ready_timeout_s = 1
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=60)
    assert res.returncode == EXIT_TIMEOUT, res.output
    v = verdict_fields(verdict_lines(res.output, "p", "d", "FAILED")[0])  # the wait's
    assert v["reason"] == "timeout", res.output
    assert f"p/d not ready after 1s: {ready} exists but is older than this start (changed " in v["detail"], v


def test_a_file_stamped_by_the_coarse_clock_just_before_the_start_counts(tmp_path: Path) -> None:
    """The kernel stamps a file with its coarse clock, a tick behind time.time(): a file the daemon wrote just
    after its start can read a few milliseconds before it, and still counts. One stamped well before does not."""
    path = tmp_path / "ready"
    path.touch()
    stamp = max(path.stat().st_mtime, path.stat().st_ctime)
    check = ReadyCheck("file", str(path))
    assert readiness.probe(check, since=stamp + 0.01) is None
    assert readiness.probe(check, since=None) is None  # (no start to be after: a file that exists)
    why = readiness.probe(check, since=stamp + 5)
    assert why is not None and why.startswith(f"{path} exists but is older than this start (changed 5.0s before it")
    assert readiness.probe(ReadyCheck("file", str(tmp_path / "absent")), since=stamp) == \
        f"{tmp_path / 'absent'} does not exist yet"


# ---------------------------------------------------------------- a daemon never ready: one failure, said once


def test_a_daemon_never_ready_fails_once_and_its_stop_says_why(sup: Runner) -> None:
    """The wait's verdict is the one failure; the daemon's end, the supervisor's stop for it, says it as its cause
    (a second FAILED line said "timeout" alone, and status listed it last for the daemon)."""
    never = sup.tmp / "never"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = ["true"]
        [[phases.daemons]]
        name = "d"
        command = ["sleep", "100"]
        ready = {toml_str(str(never))}
        ready_timeout_s = 1
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=60)
    assert res.returncode == EXIT_TIMEOUT, res.output
    failed = verdict_lines(res.output, kind="FAILED")
    assert len(failed) == 1, res.output
    v = verdict_fields(failed[0])
    assert (v["phase"], v["child"], v["reason"]) == ("p", "d", "timeout") and "pid" not in v, failed
    why = f"p/d not ready after 1s: {never} does not exist yet"
    assert v["detail"] == why, v
    end = verdict_fields(one_verdict(res.output, "p", "d", "ended"))
    assert end["reason"] == "stopped" and end["signal"] == "SIGTERM", end
    assert end["detail"] == f"{why}; killed by SIGTERM (status 143) after the supervisor stopped it", end


def test_a_wait_with_no_thread_to_probe_in_fails_at_once_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no thread can be started (pids.max), the wait fails at once: it says so, not that it waited its
    whole bound (a real run is tests/test_limits.py's)."""
    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    loop, heard = EventLoop(), []
    check = ReadyCheck("file", "/nowhere/ready")
    readiness.ReadinessWait(loop, check, 900, on_ready=lambda: heard.append("ready"), on_timeout=heard.append)
    loop.run_until(lambda: bool(heard), 0.05)
    assert heard == ["could not be waited for: no thread could be started to probe file:///nowhere/ready "
                     "(can't start new thread)"]
