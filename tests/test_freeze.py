"""A freeze of the supervisor is not a stall: SIGSTOP and the cgroup v1 freezer, for real; deadlines keep counting.

The pure parts (``FreezeWatch``, ``StallSigns.thawed``) are checked in-process with made-up clocks. Then
the real supervisor is frozen while its child works: with SIGSTOP (the child goes on printing into its
pipe) and with the v1 freezer (supervisor and child frozen together, as ``docker pause`` does), each for
longer than ``stall_s``; right after the thaw the child must not be killed as stalled, and the freeze is
said with how long it was. A deadline that passed during a freeze fires right after the thaw.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    PACED_WRITER,
    REPO,
    Console,
    Runner,
    clean_env,
    clock_of,
    first_line,
    free_port,
    one_verdict,
    py_script,
    read,
    remove_cgroup,
    toml_str,
    verdict_fields,
    wait_for,
)

from supervisor.engine.tick import FREEZE_MIN_S, FreezeWatch
from supervisor.evidence.stall import StallSigns
from supervisor.exits import EXIT_TIMEOUT

STALL_S = 2.0
FROZEN_FOR_S = 3 * STALL_S  # well past stall_s, and past FREEZE_MIN_S

# ================================================================ pure


def test_a_jump_of_the_clock_is_a_freeze_said_once() -> None:
    said: list[str] = []
    watch = FreezeWatch(said.append, now=100.0)
    assert watch.notice(101.0) is None and watch.notice(101.0 + FREEZE_MIN_S) is None  # a late tick is no freeze
    assert watch.thawed_at is None and said == []
    assert watch.notice(150.0) == pytest.approx(150.0 - 101.0 - FREEZE_MIN_S)
    assert watch.thawed_at == 150.0 and watch.freezes == 1
    assert said == ["the supervisor was frozen (SIGSTOP, cgroup freezer, docker pause?) for 46.0s; "
                    "stall windows restart now, deadlines keep counting"], said
    assert watch.notice(150.5) is None and len(said) == 1, "one freeze, one line"
    assert watch.notice(149.0) is None, "an earlier look (another caller's clock) is no freeze"


def test_a_thaw_restarts_every_stall_window_and_never_moves_one_back() -> None:
    watch = StallSigns(2.0, started=100.0, gpus_visible=True, watches_path=True)
    watch.saw_progress(10, None, 100.0)
    assert watch.stalled(140.0) is not None, "40 s of silence (a freeze, unknown to the watch) reads as a stall"
    watch.thawed(140.0)
    assert watch.stalled(141.9) is None, "the window restarts at the thaw"
    assert watch.stalled(142.0) == "no output for 2.0s, no GPU activity for 2.0s, no progress_path writes for 2.0s"
    watch.saw_output(143.0)
    watch.thawed(120.0)  # an older thaw never moves a sign back
    assert watch.last_output == 143.0


# ================================================================ the real supervisor, frozen

TICKER = """
    import sys, time
    for i in range(int(sys.argv[1])):
        print(f"tick {i}", flush=True)
        time.sleep(0.2)
    """


def ticker_config(sup: Runner, ticks: int, extra: str = "") -> Path:
    return sup.write(f"""
        [[phases]]
        name = "work"
        stall_s = {STALL_S}
        command = {py_script(sup.tmp, "ticker", TICKER, ticks)}
        {extra}
        """)


def frozen_line(out: str) -> str:
    line = first_line(out, "the supervisor was frozen")
    assert "stall windows restart now, deadlines keep counting" in line, line
    seconds = float(line.split(" for ")[1].split("s;")[0])
    assert seconds >= FROZEN_FOR_S - 1, f"the freeze was {FROZEN_FOR_S}s, said {seconds}s: {line}"
    return line


def test_sigstop_longer_than_stall_s_is_not_a_stall(sup: Runner) -> None:
    """The supervisor alone is stopped; its child goes on printing into the pipe all along."""
    console = Console(sup, ticker_config(sup, 60))
    console.wait_text("tick 3")
    os.kill(console.pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_FOR_S)
    finally:
        os.kill(console.pid, signal.SIGCONT)
    assert console.finish(60) == 0, console.tail()
    out = console.text()
    assert "reason=stalled" not in out and "phase work: stalled" not in out, out[-4000:]
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "work")
    print(frozen_line(out))


FREEZER = Path("/sys/fs/cgroup/freezer")


@contextlib.contextmanager
def freezer_cgroup(name: str) -> Iterator[Path]:
    """A v1 freezer cgroup of the test's own (skips where none can be made); thawed, emptied and removed after."""
    if os.geteuid() != 0:
        pytest.skip("not root: cannot make a freezer cgroup")
    if not (FREEZER / "cgroup.procs").exists():
        pytest.skip(f"no cgroup v1 freezer mounted at {FREEZER}")
    path = FREEZER / f"pytest-{name}-{os.getpid()}"
    with contextlib.suppress(OSError):
        (path / "freezer.state").write_text("THAWED")
    remove_cgroup(path)
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a freezer cgroup under {FREEZER}: {exc.strerror or exc}")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            (path / "freezer.state").write_text("THAWED")
        remove_cgroup(path)


def test_the_cgroup_freezer_longer_than_stall_s_is_not_a_stall(sup: Runner) -> None:
    """Supervisor and child frozen together (docker pause): the child printed nothing while frozen."""
    config = ticker_config(sup, 60)
    with freezer_cgroup("freeze") as cgroup:
        out_path = sup.tmp / "console.txt"
        script = f"echo $$ > {cgroup / 'cgroup.procs'} && exec \"$@\""
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(["sh", "-c", script, "sh", *sup.argv(config)], stdout=out,
                                    stderr=subprocess.STDOUT, env=clean_env(), cwd=REPO, start_new_session=True)
        sup.procs.append(proc)  # type: ignore[arg-type]
        wait_for(lambda: "tick 3" in read(out_path) or proc.poll() is not None, 30)
        assert "tick 3" in read(out_path), read(out_path)
        members = (cgroup / "cgroup.procs").read_text().split()
        assert str(proc.pid) in members and len(members) >= 2, f"supervisor and child in the cgroup: {members}"
        (cgroup / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (cgroup / "freezer.state").read_text().strip() == "FROZEN", 10)
        lines_frozen = read(out_path).count("] tick ")
        time.sleep(FROZEN_FOR_S)
        assert read(out_path).count("] tick ") == lines_frozen, "the child printed while frozen"
        (cgroup / "freezer.state").write_text("THAWED")
        try:
            returncode = proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the supervisor did not finish after the thaw:\n{read(out_path)[-4000:]}")
    out = read(out_path)
    assert returncode == 0, out[-4000:]
    assert "reason=stalled" not in out and "phase work: stalled" not in out, out[-4000:]
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "work")
    print(frozen_line(out))


def test_a_deadline_that_passed_during_a_freeze_fires_right_after_the_thaw(sup: Runner) -> None:
    """Deadlines keep counting across a freeze (the manager's do): timeout_s passes while the supervisor is
    stopped; right after the thaw the phase fails ``timeout``, not ``stalled``, and not timeout_s later."""
    timeout_s = 4
    console = Console(sup, ticker_config(sup, 600, extra=f"timeout_s = {timeout_s}"))
    console.wait_text("tick 3")
    os.kill(console.pid, signal.SIGSTOP)
    try:
        time.sleep(timeout_s + FROZEN_FOR_S)
    finally:
        os.kill(console.pid, signal.SIGCONT)
    assert console.finish(60) != 0, console.tail()
    out = console.text()
    record = one_verdict(out, "work")
    assert " reason=timeout " in record and "phase deadline timeout_s=4 passed" in record, record
    assert "reason=stalled" not in out, out[-4000:]
    lines = out.splitlines()
    frozen = lines.index(frozen_line(out))
    deadline = lines.index(first_line(out, "phase work: phase deadline timeout_s=4 passed"))
    # What the child printed while the supervisor was stopped waits in the pipe and is read at the thaw, before
    # the deadline is decided (drain first): those lines carry the thaw's time. Had the freeze pushed the deadline
    # back, the child would have gone on printing for timeout_s after the thaw (a tick every 0.2 s).
    thawed_at = clock_of(lines[frozen])
    after_thaw = [line for line in lines[min(frozen, deadline):max(frozen, deadline)]
                  if "] tick " in line and clock_of(line) - thawed_at > 1.0]
    assert len(after_thaw) < 5, f"the deadline came {len(after_thaw)} child lines after the thaw:\n" + "\n".join(
        lines[frozen - 2:deadline + 2])


# ================================================================ a readiness wait across a freeze

LISTENS_LATE = """
    import socket, sys, time
    time.sleep(float(sys.argv[2]))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    time.sleep(100)
    """


@pytest.mark.parametrize("listens", [True, False], ids=["listens-in-the-freeze", "never-listens"])
def test_a_readiness_wait_asks_again_after_a_freeze_before_it_fails(sup: Runner, listens: bool) -> None:
    """The daemon listens 2 s in; the supervisor is stopped at 1 s, its probing thread with it, and thawed past
    ready_timeout_s. The wait failed at the thaw on the refusal from before the freeze ("not ready after 4s:
    Connection refused") although the daemon had listened for seconds. It now probes once more first: ready;
    and a daemon that never listens still fails, on that fresh answer, saying so."""
    port = free_port()
    config = sup.write(f"""
        [[phases]]
        name = "one"
        command = ["sh", "-c", "sleep 1"]
        [[phases.daemons]]
        name = "d"
        command = {py_script(sup.tmp, "late", LISTENS_LATE, port, 2 if listens else 1000)}
        ready = "tcp://127.0.0.1:{port}"
        ready_timeout_s = 4
        stop_grace_s = 1
        """)
    console = Console(sup, config)
    console.wait_text("waiting for one/d to be ready")
    time.sleep(1)
    os.kill(console.pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_FOR_S)
    finally:
        os.kill(console.pid, signal.SIGCONT)
    code = console.finish(60)
    out = console.text()
    print(frozen_line(out))
    if listens:
        assert code == 0, out[-4000:]
        assert "one/d is ready" in out, out[-4000:]
        assert " reason=exit_code exit_code=0 " in one_verdict(out, "one", "one"), out[-4000:]
        return
    assert code == EXIT_TIMEOUT, out[-4000:]
    record = verdict_fields(one_verdict(out, "one", "d", "FAILED"))
    assert record["reason"] == "timeout", record
    # On a fresh answer either way: the wait's own probe after the thaw ("asked again"), or its thread's, when the
    # thread ran one after the thaw before the loop's bound fired (seen under load): both came after the freeze.
    assert re.fullmatch(rf"one/d not ready after 4s: tcp://127\.0\.0\.1:{port}: Connection refused"
                        r"( \(asked again after the supervisor was frozen\))?", record["detail"]), record


# ================================================================ a download's rate across a freeze


@pytest.mark.parametrize("children", ["frozen-too", "running"])
def test_a_download_is_judged_after_a_freeze_on_its_rate_not_on_the_frozen_time(sup: Runner, children: str) -> None:
    """At the thaw the progress watch read the figures of before the freeze (its I/O thread and walker were stopped
    too) over a time that spanned it: a download at 2 MiB/s that could make its deadline was given up 3 ms after the
    thaw ("66.0MiB left at 788.5KiB/s: 85s, 50s left"), the supervisor frozen with its child (docker pause) or alone
    (the child downloading all along). It now waits for readings taken after the thaw, and the frozen time is not the
    link's; the deadline keeps counting."""
    size = 96 << 20  # 24 s at 4 MiB/s with 45 allowed; read over the freeze, 84 MiB left at about 1.3 MiB/s
    cache, pid_file = sup.tmp / "cache", sup.tmp / "download.pid"
    cache.mkdir()
    config = sup.write(f"""
        [[phases]]
        name = "fetch"
        command = {py_script(sup.tmp, "download", PACED_WRITER, cache, 4 << 20, size, 0)}
        env = {{ PACED_PID = {toml_str(str(pid_file))} }}
        progress_path = "{cache}"
        progress_total = {size}
        progress_deadline_s = 45
        progress_window_s = 2
        """)
    console = Console(sup, config)
    wait_for(lambda: (cache / "params.bin").exists() and (cache / "params.bin").stat().st_size >= 12 << 20, 30)
    frozen = [console.pid] + ([int(read(pid_file))] if children == "frozen-too" else [])
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_FOR_S)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    code = console.finish(60)
    out = console.text()
    assert "cannot make it in time" not in out and "reason=too_slow" not in out, out[-4000:]
    assert code == 0, out[-4000:]
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "fetch"), out[-4000:]
    print(frozen_line(out))
