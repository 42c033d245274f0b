"""One bug never takes the supervisor down: an exception in one callback is contained where it is raised.

The loop's own rules are tested in-process on a real EventLoop (real pipes, a real thread). The
supervisor's are tested end to end: a real supervisor with real children, started through a small
launcher that injects one fault into one place (a parser, the output reader, a timer, a listener)
before ``main()`` runs. Without containment each of these crashed run(); its shutdown sweep then
SIGKILLed the children, whose verdicts read ``reason=signal`` as if someone else had killed them.
"""

from __future__ import annotations

import functools
import math
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import (
    PY,
    REPO,
    Result,
    Runner,
    clean_env,
    finish,
    one_verdict,
    pid_alive,
    py_script,
    sh,
    toml_list,
    toml_str,
)

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.engine.loop import MAX_SLEEP_S, READER_FAULTS_MAX, EventLoop, Faults, contained
from supervisor.exits import EXIT_INTERNAL_ERROR

# ---------------------------------------------------------------- the loop itself


class Said:
    """A log that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def tracebacks(self) -> int:
        return sum("Traceback (most recent call last)" in line for line in self.lines)


@pytest.fixture
def loop() -> EventLoop:
    loop = EventLoop()
    yield loop
    loop.close()


def boom() -> None:
    raise RuntimeError("boom from a callback")


def test_a_raising_timer_does_not_stop_the_next(loop: EventLoop) -> None:
    said = Said()
    loop.faults.log = said
    ran: list[str] = []
    loop.call_later(0, boom)
    loop.call_later(0, lambda: ran.append("second"))
    loop.run_once(max_wait=0)
    assert ran == ["second"]
    assert said.lines[0].startswith("internal error in a timer (boom): RuntimeError: boom from a callback")
    assert said.tracebacks() == 1


def test_a_raising_reader_goes_to_the_handler_registered_with_it(loop: EventLoop) -> None:
    import os

    r, w = os.pipe()
    try:
        seen: list[Exception] = []
        loop.add_reader(r, boom, on_error=seen.append)
        os.write(w, b"x")
        loop.run_once(max_wait=1)
        assert [str(e) for e in seen] == ["boom from a callback"]
    finally:
        loop.remove_reader(r)
        os.close(r)
        os.close(w)


def test_a_raising_thread_call_is_contained_and_the_loop_goes_on(loop: EventLoop) -> None:
    said = Said()
    loop.faults.log = said
    ran: list[str] = []
    thread = threading.Thread(target=lambda: (loop.call_soon_threadsafe(boom),
                                              loop.call_soon_threadsafe(lambda: ran.append("after"))))
    thread.start()
    thread.join()
    loop.run_once(max_wait=1)
    assert ran == ["after"]
    assert "a call from a thread" in said.lines[0] and said.tracebacks() == 1


def test_a_thread_call_made_of_a_partial_is_named_by_its_function_not_its_arguments(loop: EventLoop) -> None:
    """The outbox's thread hands the loop partial(self._refused, call, exc): a bug there was said with the whole
    call, payload and all, and each call made the report a new one (a traceback every time, never counted)."""
    said = Said()
    loop.faults.log = said

    def refused(call: dict[str, str], why: str) -> None:
        raise RuntimeError("a bug in refused")

    for n in range(3):
        loop.call_soon_threadsafe(functools.partial(refused, {"kind": "bench-done", "reason": "x" * 1000}, f"#{n}"))
    loop.run_once(max_wait=1)
    firsts = [line for line in said.lines if line.startswith("internal error")]
    assert firsts and all("xxxx" not in line and "bench-done" not in line for line in firsts), firsts
    assert "(test_a_thread_call_made_of_a_partial_is_named_by_its_function_not_its_arguments.<locals>.refused)" \
        in firsts[0], firsts
    assert said.tracebacks() == 1, said.lines


def test_a_broken_error_handler_is_said_together_with_what_it_was_handling(loop: EventLoop) -> None:
    said = Said()
    loop.faults.log = said

    def broken_handler(exc: Exception) -> None:
        raise ValueError("the handler broke too")

    loop.call_later(0, boom, on_error=broken_handler)
    loop.run_once(max_wait=0)
    firsts = [line for line in said.lines if line.startswith("internal error")]
    assert len(firsts) == 2, said.lines
    assert "the error handler of a timer" in firsts[0] and "ValueError: the handler broke too" in firsts[0]
    assert "RuntimeError: boom from a callback" in firsts[1]


def test_the_same_fault_is_logged_with_its_traceback_once_then_counted() -> None:
    said = Said()
    faults = Faults(said)
    for _ in range(100):
        try:
            raise RuntimeError("again and again")
        except RuntimeError as exc:
            faults.report("a tap", exc)
    assert said.tracebacks() == 1
    repeats = [line for line in said.lines if " again: " in line]
    assert [re.search(r"\((\d+) times", line).group(1) for line in repeats] == ["10", "100"]
    assert faults.count("a tap") == 100


def test_contained_never_raises_and_is_not_reentered_by_its_own_handler() -> None:
    calls: list[str] = []
    handled: list[Exception] = []

    def tap(line: str) -> None:
        calls.append(line)
        raise RuntimeError(line)

    guarded = contained(tap, lambda exc: (handled.append(exc), guarded("from the handler")))
    guarded("one")
    guarded("two")
    assert calls == ["one", "two"]  # the handler's own call did not reach the broken tap
    assert [str(e) for e in handled] == ["one", "two"]


@pytest.mark.parametrize("delay", [2_200_000, 1e300, math.inf, math.nan, 10**400],
                         ids=["25.5-days", "1e300", "inf", "nan", "10**400"])
def test_huge_timers_never_overflow_select(loop: EventLoop, delay: float) -> None:
    fired: list[str] = []
    loop.call_later(delay, lambda: fired.append("far"))
    loop.call_soon_threadsafe(lambda: fired.append("now"))  # select returns at once, after its timeout check
    loop.run_once()  # epoll refuses 2**31 ms and more with OverflowError
    assert fired == ["now"]
    assert 0 <= loop._next_timeout() <= MAX_SLEEP_S


def test_a_negative_delay_fires_at_once(loop: EventLoop) -> None:
    fired: list[str] = []
    loop.call_later(-5, lambda: fired.append("due"))
    loop.run_once(max_wait=0)
    assert fired == ["due"]


# ---------------------------------------------------------------- the supervisor, faults injected

LAUNCHER = """\
import sys
{inject}
from supervisor.app.cli import main
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def run_with_fault(sup: Runner, config: Path, inject: str, timeout: float = 60) -> Result:
    """Run the real supervisor on ``config`` with ``inject`` (Python) executed before main()."""
    launcher = sup.tmp / "launch_with_fault.py"
    launcher.write_text(LAUNCHER.format(inject=inject))
    # The launcher runs from tmp: without PYTHONPATH it would import an installed supervisor, not this tree's.
    proc = subprocess.Popen([PY, str(launcher), str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=clean_env({"PYTHONPATH": str(REPO)}), cwd=REPO,
                            start_new_session=True)
    sup.procs.append(proc)
    return finish(proc, time.monotonic(), timeout)


def tracebacks_in_log(sup: Runner) -> int:
    return (sup.log_dir / "supervisor.log").read_text().count("Traceback (most recent call last)")


# A command that prints, then waits to be stopped (so only the supervisor can end it).
PRINT_THEN_WAIT = """
import sys, time
for line in sys.argv[1:]:
    print(line, flush=True)
time.sleep(60)
"""

SLEEPER = sh("exec sleep 60")


def check_phase_failed_internally(result: Result, sup: Runner, phase: str, where: str,
                                  stopped: list[str], marker: Path) -> None:
    output = result.output
    assert result.returncode == EXIT_INTERNAL_ERROR, output
    failed = one_verdict(output, phase, phase, kind="FAILED")  # the phase's own: no pid, no wait status
    assert " reason=internal_error " in failed and " pid=" not in failed, failed
    assert "injected fault" in failed and where in failed, failed
    for child in stopped:  # the supervisor stopped them on purpose: never "signal"
        assert " reason=stopped " in one_verdict(output, phase, child, kind="ended")
    assert "reason=signal" not in output
    assert f"phase {phase}: stopping → failed" in output
    assert not marker.exists(), "the phase after the failed one ran"
    assert tracebacks_in_log(sup) == 1, output  # the traceback once, whatever the fault repeated
    assert "leftover process" not in output  # stopped in order, not swept up at exit
    assert f"exiting with status {EXIT_INTERNAL_ERROR}" in output


def test_a_parser_that_raises_fails_its_phase_not_the_supervisor(sup: Runner) -> None:
    """The cuzk-bench parser raising on a line: the bench phase fails with internal_error, its daemon and
    its command are stopped (reason stopped), and the loop goes on to a clean shutdown."""
    marker = sup.tmp / "after.marker"
    command = py_script(sup.tmp, "bench", PRINT_THEN_WAIT, "  [1/2] COMPLETED — 1.0s", "BOOM", "BOOM again")
    config = sup.write(f"""
        [[phases]]
        name = "bench"
        command = {command}
        parse = "cuzk-bench"

        [[phases.daemons]]
        name = "daemon"
        command = {SLEEPER}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    inject = """
import supervisor.prover.bench as bench
_real = bench.BenchParser.feed_line
def feed_line(self, line):
    if "BOOM" in line:
        raise RuntimeError("injected fault in the parser")
    _real(self, line)
bench.BenchParser.feed_line = feed_line
"""
    result = run_with_fault(sup, config, inject)
    check_phase_failed_internally(result, sup, "bench", "bench output parser", ["bench", "daemon"], marker)
    assert "bench_failed" not in result.output


def test_any_reader_of_a_childs_output_is_contained_whoever_added_it(sup: Runner) -> None:
    """A reader added the plain way (one more of ``ChildOutput``'s ``readers``), as the next one will be:
    still contained."""
    marker = sup.tmp / "after.marker"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {py_script(sup.tmp, "talker", PRINT_THEN_WAIT, "hello", "BOOM")}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    inject = """
import supervisor.engine.logs as logs
_real_init = logs.ChildOutput.__init__
def new_parser(lines):
    if any(b"BOOM" in line for line in lines):
        raise ValueError("injected fault in a new parser")
def __init__(self, *args, readers=(), **kwargs):
    _real_init(self, *args, readers=[*readers, new_parser], **kwargs)
logs.ChildOutput.__init__ = __init__
"""
    result = run_with_fault(sup, config, inject)
    check_phase_failed_internally(result, sup, "p", "the output tap new_parser", ["p"], marker)


def test_a_reader_callback_that_raises_fails_its_phase(sup: Runner) -> None:
    marker = sup.tmp / "after.marker"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {py_script(sup.tmp, "talker", PRINT_THEN_WAIT, "hello", "BOOM")}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    inject = """
import supervisor.engine.logs as logs
_real = logs.ChildOutput.feed
def feed(self, stream, data):
    if b"BOOM" in data:
        raise RuntimeError("injected fault in reading output")
    _real(self, stream, data)
logs.ChildOutput.feed = feed
"""
    result = run_with_fault(sup, config, inject)
    check_phase_failed_internally(result, sup, "p", "output of p", ["p"], marker)


def test_a_timer_callback_that_raises_fails_its_phase(sup: Runner) -> None:
    """The stall check (a timer) raising on its first tick: the phase fails with internal_error."""
    marker = sup.tmp / "after.marker"
    progress = sup.tmp / "progress"
    progress.mkdir()
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {SLEEPER}
        stall_s = 5
        progress_path = {toml_str(str(progress))}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    inject = """
import supervisor.evidence.stall as stall
def stalled(self, now, *unknown):  # asked by the stall check's timer only, on its first tick
    raise RuntimeError("injected fault in the stall check")
stall.StallSigns.stalled = stalled
"""
    result = run_with_fault(sup, config, inject)
    check_phase_failed_internally(result, sup, "p", "stall check", ["p"], marker)


def test_a_contained_faults_traceback_reaches_the_manager_and_the_verdict_once(sup: Runner) -> None:
    """The supervisor's own quoted lines are held back from the manager's setup tab only when they quote
    a FAILED verdict (pushed durably on its own): a contained fault's traceback, quoted the same way,
    still reaches the manager."""
    progress = sup.tmp / "progress"
    progress.mkdir()
    mgr = dev_manager(quiet=True).start()
    try:
        config = sup.write(f"""
            [manager]
            url = {toml_str(mgr.url)}
            label = "C.traceback"
            give_up_on_failure = false

            [[phases]]
            name = "p"
            command = {SLEEPER}
            stall_s = 5
            progress_path = {toml_str(str(progress))}
            """)
        inject = """
import supervisor.evidence.stall as stall
def stalled(self, now, *unknown):
    raise RuntimeError("injected fault in the stall check")
stall.StallSigns.stalled = stalled
"""
        result = run_with_fault(sup, config, inject)
        assert result.returncode == EXIT_INTERNAL_ERROR, result.output
        [setup] = [logs["setup"] for logs in mgr.state.snapshot()["logs"].values()]
    finally:
        mgr.stop()
    assert "[supervisor]   | Traceback (most recent call last):" in setup, setup
    assert "RuntimeError: injected fault in the stall check" in setup, setup
    assert setup.count("FAILED: phase=p child=p ") == 1, setup


def test_listeners_that_raise_are_logged_once_and_the_lifecycle_goes_on(sup: Runner, manager: DevManager) -> None:
    """A lifecycle listener and a verdict listener (the reporter's: a manager is configured, since with none
    the reporter hears nothing) raising every time: each is logged with its traceback once, and every phase
    still runs to completion, exit 0."""
    marker = sup.tmp / "after.marker"
    config = sup.write(f"""
        [manager]
        url = {toml_str(manager.url)}
        label = "C.listeners"

        [[phases]]
        name = "p"
        command = {sh("echo working")}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    inject = """
import supervisor.manager.reporting as reporting
def phase_changed(self, phase):
    raise RuntimeError("injected fault in a phase listener")
def verdict(self, verdict):
    raise RuntimeError("injected fault in a verdict listener")
reporting.Reporter.phase_changed = phase_changed
reporting.Reporter.verdict = verdict
"""
    result = run_with_fault(sup, config, inject)
    assert result.returncode == 0, result.output
    assert marker.exists()
    assert "lifecycle complete" in result.output
    assert tracebacks_in_log(sup) == 2, result.output  # one per listener, not one per call
    firsts = [line for line in result.output.splitlines() if "] internal error in " in line]
    assert len(firsts) == 2, firsts  # neither is said again (each raised fewer than 10 times)
    assert re.search(r"internal error in the listener \S*phase_changed \(phase p\)", result.output), result.output
    assert re.search(r"internal error in the verdict listener \S*verdict \(phase p\)", result.output), result.output


def test_a_stop_sequence_that_raises_still_ends_the_child_and_the_run(sup: Runner) -> None:
    """The grace timer of a stop raising (SIGKILL never sent that way): the child, which ignores SIGTERM,
    is SIGKILLed anyway and the stop completes, so the lifecycle ends instead of waiting forever."""
    pidfile = sup.tmp / "pid"
    stubborn = py_script(sup.tmp, "stubborn", """
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_pid(sys.argv[1])
        time.sleep(60)
    """, pidfile)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {stubborn}
        timeout_s = 1
        stop_grace_s = 1
        """)
    inject = """
import supervisor.engine.process as process
def _kill(self, loop, log):
    raise RuntimeError("injected fault in the stop sequence")
process.Child._kill = _kill
"""
    result = run_with_fault(sup, config, inject, timeout=40)
    assert "internal error in stopping p/p: RuntimeError: injected fault in the stop sequence" in result.output
    assert not pid_alive(int(pidfile.read_text()))
    assert " reason=timeout " in one_verdict(result.output, "p", "p", kind="FAILED")
    assert result.returncode == 124, result.output  # a deadline exits as timeout(1) does, SIGKILL or not
    assert tracebacks_in_log(sup) == 1


def test_a_stop_that_raises_at_once_still_ends_the_child(sup: Runner) -> None:
    """Child.stop raising before it signalled anything: the child is SIGKILLed, the phase still ends."""
    pidfile = sup.tmp / "pid"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {py_script(sup.tmp, "sleeper", "import sys, time; write_pid(sys.argv[1]); time.sleep(60)",
                             pidfile)}
        timeout_s = 1
        """)
    inject = """
import supervisor.engine.process as process
def _begin_stop(self, loop, log, reason):
    raise RuntimeError("injected fault in starting a stop")
process.Child._begin_stop = _begin_stop
"""
    result = run_with_fault(sup, config, inject, timeout=40)
    assert "internal error in stopping p/p: RuntimeError: injected fault in starting a stop" in result.output
    assert not pid_alive(int(pidfile.read_text()))
    assert " reason=timeout " in one_verdict(result.output, "p", "p", kind="FAILED")
    assert result.returncode == 124, result.output


def test_the_run_ends_with_its_status_even_if_ending_the_phases_after_the_shutdown_raises(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh("exit 3")}
        """)
    inject = """
import supervisor.lifecycle.phase as phase
def end_after_shutdown(self):
    raise RuntimeError("injected fault in ending the phases")
phase.Phase.end_after_shutdown = end_after_shutdown
"""
    result = run_with_fault(sup, config, inject, timeout=40)
    assert result.returncode == 3, result.output
    said = "internal error in the end of the shutdown: RuntimeError: injected fault in ending the phases"
    assert said in result.output, result.output
    assert tracebacks_in_log(sup) == 1


def test_shipping_taps_that_raise_cost_lines_never_the_phase(sup: Runner) -> None:
    """The log shipper's taps (a child's lines, the supervisor's own) raising on every line: logged once
    each, the phases complete. The supervisor's own-line tap raising must not recurse through the log."""
    with socket.socket() as s:  # a manager that is not there: reporting is on, nothing answers
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    marker = sup.tmp / "after.marker"
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:{port}"
        label = "C.test"

        [[phases]]
        name = "p"
        command = {sh("echo one; sleep 0.1; echo two; sleep 0.1; echo three")}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    inject = """
import supervisor.manager.reporting as reporting
def ship_lines(self, source, label, lines):
    raise RuntimeError("injected fault in shipping lines")
def ship_own_line(self, message):
    raise RuntimeError("injected fault in shipping own lines")
reporting.Reporter.ship_lines = ship_lines
reporting.Reporter.ship_own_line = ship_own_line
"""
    result = run_with_fault(sup, config, inject)
    assert result.returncode == 0, result.output
    assert marker.exists() and "lifecycle complete" in result.output
    assert re.search(r"internal error in shipping the output of p/p \(phase p\): RuntimeError", result.output)
    assert "internal error in shipping the supervisor's own lines: RuntimeError" in result.output
    firsts = [line for line in result.output.splitlines() if "] internal error in shipping the output of" in line]
    assert len(firsts) == 1, firsts  # once, though p/p's three lines came in three reads


def test_a_reader_nobody_answers_for_that_keeps_raising_is_dropped_not_spun_on(loop: EventLoop) -> None:
    """An fd it never drains stays readable: without a limit the loop would spin on it for good."""
    import os

    said = Said()
    loop.faults.log = said
    r, w = os.pipe()
    try:
        loop.add_reader(r, boom)
        os.write(w, b"never read")
        for _ in range(READER_FAULTS_MAX + 5):
            loop.run_once(max_wait=0)
        assert any(line.endswith(f"raised {READER_FAULTS_MAX} times in a row: no longer watched")
                   for line in said.lines), said.lines
        assert said.tracebacks() == 1
        fired: list[str] = []
        loop.call_later(0, lambda: fired.append("timer"))
        loop.run_once(max_wait=0)  # the loop goes on with the rest
        assert fired == ["timer"]
    finally:
        os.close(r)
        os.close(w)


def test_a_reader_that_raises_now_and_then_is_kept(loop: EventLoop) -> None:
    import os

    r, w = os.pipe()
    calls: list[int] = []

    def flaky() -> None:
        os.read(r, 1)
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("every other time")

    try:
        loop.faults.log = Said()
        loop.add_reader(r, flaky)
        for _ in range(READER_FAULTS_MAX * 2):
            os.write(w, b"x")
            loop.run_once(max_wait=0)
        assert len(calls) == READER_FAULTS_MAX * 2  # never dropped: it succeeds between failures
    finally:
        loop.remove_reader(r)
        os.close(r)
        os.close(w)
