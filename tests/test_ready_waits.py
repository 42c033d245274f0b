"""What a readiness wait counts, and what it says when nothing counted (supervisor/engine/readiness.py,
lifecycle/attempt.py).

A ``file`` check counts only a file made or changed since its daemon started: one left by an earlier attempt,
or by a supervisor that ran before on the same volume, is said ("exists but is older than this start") and
waited past, as a port held before the start is refused (tests/test_ready_ports.py). A daemon that is not
ready in time fails its attempt once: its stop, which follows, says that failure as its cause. An endpoint that
answers slowly but within ready_timeout_s counts: each probe after one that timed out is given longer.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers import Runner, free_port, one_verdict, py_script, sh, toml_str, verdict_fields, verdict_lines

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
    config = _waiting_for(sup, ready)
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
    config = _waiting_for(sup, never)
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


# ---------------------------------------------------------------- an endpoint slow to answer


SLOW_STATUS = """
    import sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(float(sys.argv[2]))
            try:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"up")
            except OSError:  # (the prober gave up on this one)
                pass

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Slow).serve_forever()
"""


def test_a_healthy_endpoint_slower_than_a_probes_first_timeout_is_ready(sup: Runner) -> None:
    """A /status that takes 3 s to answer (busy as the daemon warms up) answered within ready_timeout_s: ready.
    Each probe after one that timed out is given twice as long (2 s, then 4 s), up to the time left."""
    port = free_port()
    ran = sup.tmp / "command.ran"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh(f"touch {ran}")}
        [[phases.daemons]]
        name = "d"
        command = {py_script(sup.tmp, "slow", SLOW_STATUS, port, 3)}
        ready = "http://127.0.0.1:{port}/status"
        ready_timeout_s = 12
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=60)
    assert res.returncode == 0, res.output
    assert "p/d is ready" in res.output and ran.exists(), res.output


def test_probe_timeouts_grow_after_each_probe_that_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 s, then twice the last after each probe that timed out, never past the time left in the wait; back to
    2 s after an answer that was not a timeout."""
    given: list[float] = []

    def ask(check: ReadyCheck, timeout: float, owner: object = None, since: object = None) -> readiness.Answer:
        given.append(timeout)
        return readiness.Answer("refused" if len(given) == 6 else "timed out", timed_out=len(given) != 6)

    monkeypatch.setattr(readiness, "ask", ask)
    monkeypatch.setattr(readiness, "READY_POLL_S", 0.01)
    loop, heard = EventLoop(), []
    wait = readiness.ReadinessWait(loop, ReadyCheck("tcp", "127.0.0.1:9", "127.0.0.1", 9), 20,
                                   on_ready=lambda: heard.append("ready"), on_timeout=heard.append)
    try:
        loop.run_until(lambda: len(given) >= 8, 0.05)
    finally:
        wait.cancel()
    assert given[:4] == [2, 4, 8, 16], given
    assert 19 < given[4] < 20, given  # 32, but only the time left
    assert given[6:8] == [2, 4], given  # (the 6th was refused)


def test_a_wait_that_runs_out_between_probes_that_time_out_says_the_latest_answer() -> None:
    """A listener that takes the request and never answers: at the bound the probe under way is within its own
    timeout, so the latest answer is said ("timed out after 2s"), not a probe that "has not returned"."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)  # (never accepted: the kernel takes the connection and the request, nobody answers)
        port = mute.getsockname()[1]
        check = ReadyCheck("http", f"http://127.0.0.1:{port}/status", "127.0.0.1", port)
        loop, heard = EventLoop(), []
        readiness.ReadinessWait(loop, check, 3, on_ready=lambda: heard.append("ready"), on_timeout=heard.append)
        loop.run_until(lambda: bool(heard), 0.05)
    assert len(heard) == 1 and heard[0].startswith(f"not ready after 3s: {check.target}: timed out after "), heard
    assert "has not returned" not in heard[0], heard


def test_a_probe_under_way_for_a_while_is_said_beside_the_answer_before_it() -> None:
    """A daemon slow to listen, then never answering: the first probes are refused, and the probe under way at
    the bound has run most of its time. It is named ("has not returned"), with the refusal before it: the
    refusal alone would send the reader after a daemon that did listen."""
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    check = ReadyCheck("http", f"http://127.0.0.1:{port}/status", "127.0.0.1", port)
    loop, heard = EventLoop(), []
    readiness.ReadinessWait(loop, check, 1.5, on_ready=lambda: heard.append("ready"), on_timeout=heard.append)
    with socket.socket() as mute:
        mute.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listens_at = time.monotonic() + 0.3  # (refused until then)
        loop.run_until(lambda: time.monotonic() > listens_at, 0.05)
        mute.bind(("127.0.0.1", port))
        mute.listen(16)  # (never accepted: the request is taken and never answered)
        loop.run_until(lambda: bool(heard), 0.05)
    assert len(heard) == 1 and heard[0].startswith(f"not ready after 1.5s: {check.target}: a probe has not returned "
                                                   "after "), heard
    assert "; before it: " in heard[0] and "refused" in heard[0], heard


def _waiting_for(sup: Runner, ready: Path) -> Path:
    """A phase whose daemon (it never writes ``ready``) waits a second for ``ready``, then stops within one."""
    return sup.write(f"""
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
