"""Every signal has a meaning, from the first line of ``main`` to the exit (issue 14, class 2).

The table in signals.py is checked against ``signal.valid_signals()``; then a real supervisor
(a subreaper, and PID 1 of its own PID namespace) receives a signal of each class while a
service runs: a stop signal stops it in order and exits 128 + n, a forwarded one reaches the
service, a noted one is said and not obeyed, an ignored one changes nothing, a fatal fault
leaves its last words in supervisor.log and the survivors are named. The windows before the
loop runs (the first instants of ``main``, emptying a dead supervisor's cgroup) are covered by
real signals sent into them, and SIGXCPU comes from a real RLIMIT_CPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import shlex
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from helpers import (
    PY,
    REPO,
    Runner,
    clean_env,
    finish,
    first_line,
    heavy,
    needs_unshare,
    one_verdict,
    pid_alive,
    py_script,
    read,
    read_pid,
    remove_cgroup,
    shell,
    start_in_cgroup,
    supervisor_pid,
    toml_list,
    toml_str,
    v1_cgroup,
    wait_for,
)

from supervisor.engine.signals import (
    CAUGHT,
    FAULTS,
    FORWARDED,
    IGNORED,
    MEANINGS,
    NOTED,
    STOPS,
    Action,
    Meaning,
    SignalRouter,
    Stage,
    signal_name,
    stop_action,
)
from supervisor.text.units import MIB

CATCHABLE = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
RT3 = signal.SIGRTMIN + 3  # systemd's "halt": the STOPSIGNAL of containers made for systemd

# Every signal Python lets a program catch, recorded (name per line) in argv[1]; the pid in argv[2]
# once the handlers are in place; SIGTERM (the service's stop signal) ends it with 0.
RECORDER = """
import signal, sys, time
log = sys.argv[1]

def handler(signum, frame):
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    with open(log, "a") as f:
        f.write(name + "\\n")
    if signum == signal.SIGTERM and sys.argv[3] == "exit-on-term":
        sys.exit(0)

for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}:
    signal.signal(sig, handler)
write_pid(sys.argv[2])
while True:
    time.sleep(0.05)
"""


def service_config(sup: Runner, *, on_term: str = "exit-on-term", stop_grace_s: float = 5) -> Path:
    return sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {py_script(sup.tmp, "recorder", RECORDER, sup.tmp / "got", sup.tmp / "svc.pid", on_term)}
        stop_grace_s = {stop_grace_s}
        """)


@pytest.fixture(autouse=True)
def nothing_of_the_test_left(sup: Runner) -> Iterator[None]:
    """Whatever a supervisor that died (or misbehaved) left of this test's programs is killed afterwards:
    each one runs from a file under the test's own directory."""
    yield
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(str(sup.tmp) in part for part in proc.info["cmdline"] or ()):
                proc.kill()


def received(sup: Runner) -> list[str]:
    """The signals the recorder got, in order, less the SIGCONT that goes with its stop signal (a stop sends one
    right after it, for a stopped child's sake; one that exits in its SIGTERM handler may be gone before it is
    handled). It may be written before SIGTERM too: Python runs a handler for a signal that comes while another
    handler runs inside it, at its next bytecode, so SIGCONT's line can land before SIGTERM's handler writes."""
    got = sup.tmp / "got"
    names = got.read_text().split() if got.exists() else []
    return [name for i, name in enumerate(names)
            if not (name == "SIGCONT" and "SIGTERM" in names[max(0, i - 1):i] + names[i + 1:i + 2])]


def start_service(sup: Runner, config: Path, pid1: bool = False) -> tuple[subprocess.Popen[str], int]:
    """The supervisor running the recorder as its service: (the process started, the supervisor's pid)."""
    proc = sup.start(config, pid1=pid1)
    read_pid(sup.tmp / "svc.pid")  # the recorder's handlers are in place (in PID 1 mode, a pid of its namespace)
    return proc, supervisor_pid(proc, pid1)


# ---------------------------------------------------------------- the table


def test_every_catchable_signal_has_exactly_one_meaning() -> None:
    assert set(MEANINGS) == CATCHABLE, sorted(map(signal_name, CATCHABLE ^ set(MEANINGS)))
    classes = [STOPS, FORWARDED, NOTED, IGNORED, FAULTS, frozenset({signal.SIGCHLD})]
    assert sum(map(len, classes)) == len(CATCHABLE), "a signal is in two classes"
    assert frozenset().union(*classes) == CATCHABLE
    # The inbox catches what it must act on or say; never an ignored one (the kernel drops those) nor a
    # fault (faulthandler writes the last words, then the default action must kill).
    assert STOPS | FORWARDED | NOTED | {signal.SIGCHLD} == CAUGHT
    assert CAUGHT.isdisjoint(IGNORED | FAULTS)
    for sig, (meaning, why) in MEANINGS.items():
        assert isinstance(meaning, Meaning) and why.strip(), signal_name(sig)


def test_the_conventional_meanings() -> None:
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGPWR, signal.SIGXCPU, signal.SIGALRM,
            signal.SIGVTALRM, signal.SIGPROF, RT3} <= STOPS
    assert set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1)) <= STOPS
    assert {signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH} == FORWARDED
    assert {signal.SIGTSTP, signal.SIGCONT, signal.SIGURG} == NOTED
    assert {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTTIN, signal.SIGTTOU} == IGNORED
    assert {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGSYS,
            signal.SIGTRAP} == FAULTS


def test_real_time_signals_are_named_as_systemd_names_them() -> None:
    assert signal_name(signal.SIGRTMIN) == "SIGRTMIN"
    assert signal_name(RT3) == "SIGRTMIN+3"
    assert signal_name(signal.SIGRTMAX) == "SIGRTMAX"
    assert signal_name(signal.SIGTERM) == "SIGTERM"


@pytest.mark.parametrize(("stage", "again", "action"), [
    (Stage.STARTING, False, Action.REMEMBER),
    (Stage.STARTING, True, Action.REMEMBER),
    (Stage.RUNNING, False, Action.STOP_IN_ORDER),
    (Stage.STOPPING, False, Action.KILL_NOW),
    (Stage.STOPPING, True, Action.KILL_NOW),
    (Stage.FLUSHING, False, Action.CUT_FLUSH),
    (Stage.FLUSHING, True, Action.END_FLUSH),
])
def test_what_a_stop_signal_does_at_each_stage(stage: Stage, again: bool, action: Action) -> None:
    assert stop_action(stage, again) is action


# ---------------------------------------------------------------- stop: in order, 128 + n

STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGPWR, signal.SIGXCPU, signal.SIGALRM,
                signal.SIGVTALRM, signal.SIGPROF, signal.SIGSTKFLT, signal.SIGIO, signal.SIGRTMIN, RT3,
                signal.SIGRTMAX]
PID1_STOP_SIGNALS = [signal.SIGQUIT, signal.SIGPWR, signal.SIGALRM, RT3]


def check_stopped_in_order(sup: Runner, result_code: int, out: str, signum: int) -> None:
    name = signal_name(signum)
    assert result_code == 128 + signum, out
    said = first_line(out, f"[supervisor] {name} (")
    assert "every child is stopped in reverse start order" in said, said
    assert f"shutting down: received {name}" in out
    assert received(sup) == ["SIGTERM"], "the service got other than its own stop signal"
    verdict = one_verdict(out, "svc")
    assert " reason=stopped " in verdict, verdict
    assert "Traceback" not in out


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=signal_name)
def test_a_stop_signal_stops_the_service_in_order_as_subreaper(sup: Runner, signum: int) -> None:
    proc, pid = start_service(sup, service_config(sup))
    child = read_pid(sup.tmp / "svc.pid")
    os.kill(pid, signum)
    result = finish(proc, time.monotonic(), 30)
    check_stopped_in_order(sup, result.returncode, result.output, signum)
    assert not pid_alive(child)


@needs_unshare
@pytest.mark.parametrize("signum", PID1_STOP_SIGNALS, ids=signal_name)
def test_a_stop_signal_stops_the_service_in_order_as_pid1(sup: Runner, signum: int) -> None:
    """As PID 1 a signal with no handler is dropped by the kernel: without one, each of these did nothing."""
    proc, pid = start_service(sup, service_config(sup), pid1=True)
    os.kill(pid, signum)
    result = finish(proc, time.monotonic(), 30)
    assert "as pid1;" in result.output.splitlines()[0], result.output
    check_stopped_in_order(sup, result.returncode, result.output, signum)


def test_a_second_stop_signal_of_another_kind_kills_at_once(sup: Runner) -> None:
    proc, pid = start_service(sup, service_config(sup, on_term="ignore-term", stop_grace_s=60))
    child = read_pid(sup.tmp / "svc.pid")
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: "SIGTERM" in received(sup), timeout=10)  # in its grace: it ignores its stop signal
    os.kill(pid, signal.SIGQUIT)
    result = finish(proc, time.monotonic(), 30)  # far less than the 60 s grace
    assert result.returncode == 128 + signal.SIGTERM, result.output  # the first one's status
    assert "SIGQUIT (after SIGTERM) while stopping: SIGKILL to everything now" in result.output
    assert received(sup) == ["SIGTERM"]
    assert not pid_alive(child)


# ---------------------------------------------------------------- forwarded, noted, ignored


def test_sigwinch_is_forwarded_like_hup_and_usr(sup: Runner) -> None:
    proc, pid = start_service(sup, service_config(sup))
    for sig in (signal.SIGWINCH, signal.SIGUSR1):
        os.kill(pid, sig)
        wait_for(lambda sig=sig: sig.name in received(sup), timeout=10)
    os.kill(pid, signal.SIGTERM)
    result = finish(proc, time.monotonic(), 30)
    assert result.returncode == 143, result.output
    assert "SIGWINCH forwarded to svc/svc" in result.output
    assert received(sup) == ["SIGWINCH", "SIGUSR1", "SIGTERM"]


def test_a_forwarded_signal_reaches_the_whole_process_group(sup: Runner) -> None:
    """A shell that does not exec its program: the program under it gets a forwarded signal too (it goes to the
    child's process group, as tini's -g would send it), not to the shell alone."""
    py_script(sup.tmp, "recorder", RECORDER)  # (the script alone: the shell runs it)
    program = shlex.join([PY, str(sup.tmp / "recorder.py"), str(sup.tmp / "got"), str(sup.tmp / "svc.pid"),
                          "exit-on-term"])
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {toml_list(["sh", "-c", f"trap : USR1 TERM; {program}; :"])}
        stop_grace_s = 5
        """)
    proc, pid = start_service(sup, config)
    os.kill(pid, signal.SIGUSR1)
    wait_for(lambda: "SIGUSR1" in received(sup), timeout=10)
    os.kill(pid, signal.SIGTERM)
    result = finish(proc, time.monotonic(), 30)
    assert result.returncode == 143, result.output
    assert "SIGUSR1 forwarded to svc/svc" in result.output, result.output
    assert received(sup) == ["SIGUSR1", "SIGTERM"]


def test_a_signal_is_still_forwarded_to_a_command_in_its_stop_grace(sup: Runner) -> None:
    """A stop signal came; the service handles SIGTERM and goes on in its grace (flushing, say). A SIGUSR1 from
    outside then was forwarded "to nobody (no phase command running)" while its command ran: its phase was
    already stopping."""
    proc, pid = start_service(sup, service_config(sup, on_term="stay", stop_grace_s=30))
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: "SIGTERM" in received(sup), timeout=10)
    os.kill(pid, signal.SIGUSR1)
    wait_for(lambda: "SIGUSR1" in received(sup), timeout=10)
    os.kill(pid, signal.SIGTERM)  # (a second stop signal: SIGKILL to everything now)
    result = finish(proc, time.monotonic(), 30)
    assert result.returncode == 143, result.output
    assert "SIGUSR1 forwarded to svc/svc" in result.output, result.output


def test_a_service_killed_by_a_forwarded_signal_is_told_apart_from_a_stray_kill(sup: Runner) -> None:
    """A service that does not handle SIGHUP dies of the one forwarded from outside: its verdict says the signal
    came from outside through the supervisor (the operator's reload, not a person's kill of the child)."""
    pidfile = sup.tmp / "svc.pid"
    cmd = py_script(sup.tmp, "plain", "import sys, time\nwrite_pid(sys.argv[1])\ntime.sleep(60)\n", pidfile)
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {cmd}
        restart = "no"
        """)
    proc = sup.start(config)
    read_pid(pidfile)
    os.kill(proc.pid, signal.SIGHUP)
    result = finish(proc, time.monotonic(), 30)
    assert result.returncode == 128 + signal.SIGHUP, result.output
    [failed] = [line for line in result.output.splitlines() if "FAILED: phase=svc child=svc" in line]
    assert "reason=signal signal=SIGHUP" in failed, failed
    assert re.search(r'detail="killed by SIGHUP \(status 129\), \d+\.\ds after a SIGHUP from outside was '
                     r'forwarded to it"', failed), failed


@pytest.mark.parametrize("pid1", [False, pytest.param(True, marks=needs_unshare)], ids=["subreaper", "pid1"])
def test_noted_and_ignored_signals_change_nothing(sup: Runner, pid1: bool) -> None:
    """SIGTSTP, SIGCONT, SIGURG: said, not obeyed. SIGTTIN, SIGTTOU, SIGPIPE, SIGXFSZ: ignored (their defaults
    would stop or kill the supervisor). The service gets none of them and the supervisor still stops on SIGTERM."""
    proc, pid = start_service(sup, service_config(sup), pid1=pid1)
    log = sup.log_dir / "supervisor.log"
    # One at a time: the kernel discards a pending SIGTSTP when SIGCONT comes (and the reverse).
    for sig in (signal.SIGTSTP, signal.SIGCONT, signal.SIGURG):
        os.kill(pid, sig)
        wait_for(lambda sig=sig: f"{sig.name}: not obeyed" in log.read_text(), timeout=10)
    for sig in (signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE, signal.SIGXFSZ):
        os.kill(pid, sig)
    os.kill(pid, signal.SIGTERM)
    result = finish(proc, time.monotonic(), 30)  # a stopped supervisor would not get here: SIGTERM waits
    assert result.returncode == 143, result.output
    assert "SIGTSTP: not obeyed: Ctrl-Z: the supervisor does not stop itself" in result.output
    assert received(sup) == ["SIGTERM"]
    for name in ("SIGTTIN", "SIGTTOU", "SIGPIPE", "SIGXFSZ"):
        assert name not in result.output, result.output


# ---------------------------------------------------------------- fatal faults: last words, survivors named


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGSYS], ids=signal_name)
def test_a_fatal_fault_leaves_last_words_and_names_the_survivors(sup: Runner, signum: int) -> None:
    """SIGSEGV through faulthandler.enable, SIGSYS through faulthandler.register (chained to its default)."""
    pidfile = sup.tmp / "svc.pid"
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {shell(f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 300")}
        """)
    proc = sup.start(config)
    child = read_pid(pidfile)
    try:
        state = sup.state_dir / "status.json"
        wait_for(lambda: state.exists() and json.loads(state.read_text())["children"], timeout=10)
        os.kill(proc.pid, signum)
        result = finish(proc, time.monotonic(), 30)
        assert result.returncode == -signum, result.output  # the default action: the fault is not hidden
        last_words = read(sup.log_dir / "supervisor.log")
        if signum == signal.SIGSEGV:
            assert "Fatal Python error: Segmentation fault" in last_words, last_words
        assert "Current thread" in last_words and "in serve" in last_words, last_words  # the loop, in serve
        assert 'Thread 0x' in last_words, "not every thread's traceback"
        # The survivor lives on (that is the resume design) and is named: in status.json...
        assert pid_alive(child)
        saved = json.loads(state.read_text())
        assert [(c["label"], c["pid"]) for c in saved["children"]] == [("svc/svc", child)], saved["children"]
        # ... by `status`, which shows what the dead supervisor last wrote ...
        shown = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                               capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env())
        assert shown.returncode == 3, shown.stdout + shown.stderr
        assert f"pid {child}" in shown.stdout and "svc/svc" in shown.stdout, shown.stdout
        # ... and by the next start, which ends it before anything else starts.
        again = sup.run(sup.write('[[phases]]\nname = "next"\ncommand = ["true"]\n', name="next.toml"), timeout=30)
        assert again.returncode == 0, again.output
        said = first_line(again.output, "left by a supervisor that died without stopping them")
        assert f"{child} (sleep)" in said, said
        assert not pid_alive(child)
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


@needs_unshare
@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGABRT], ids=signal_name)
def test_a_fault_signal_sent_to_pid1_from_outside_stops_it_in_order(sup: Runner, signum: int) -> None:
    """As PID 1 the kernel drops a default-action signal sent from outside: kill -SEGV wrote the last words, left
    the fault handler spent and the supervisor running, and a second one was dropped without a word. The spent
    handler is now noticed: said, armed again, and the signal taken as a stop (its default action ends the
    process); a second one, its last words written again, kills at once."""
    proc, pid = start_service(sup, service_config(sup, on_term="stay", stop_grace_s=60), pid1=True)
    os.kill(pid, signum)
    wait_for(lambda: "SIGTERM" in received(sup), timeout=10)  # stopped in order: the service got its stop signal
    os.kill(pid, signum)  # (it stays in its grace: the second one must find the handler armed again)
    result = finish(proc, time.monotonic(), 30)  # far less than the 60 s grace
    name = signal_name(signum)
    assert result.returncode == 128 + signum, result.output
    assert (f"{name} came from outside (a fault would have ended the supervisor): its last words are in "
            "supervisor.log, and as PID 1 the kernel dropped it") in result.output, result.output
    assert f"shutting down: received {name}" in result.output, result.output
    assert f"{name} again while stopping: SIGKILL to everything now" in result.output, result.output
    assert received(sup) == ["SIGTERM"]
    last_words = read(sup.log_dir / "supervisor.log")
    assert last_words.count("Fatal Python error: ") == 2 and "Current thread" in last_words, last_words


# ---------------------------------------------------------------- before the loop runs


def sig_blocked(pid: int, signum: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return bool(mask & (1 << (signum - 1)))


def test_ctrl_c_in_the_first_instants_waits_for_the_loop(sup: Runner) -> None:
    """main holds the signals first thing; a SIGINT sent then (before the config is even read) is no
    KeyboardInterrupt traceback: the loop takes it, the lifecycle never starts, 130."""
    marker = sup.tmp / "ran"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {toml_list(["touch", str(marker)])}
        """)
    proc = sup.start(config)
    wait_for(lambda: sig_blocked(proc.pid, signal.SIGINT) or proc.poll() is not None, timeout=20, interval=0.001)
    os.kill(proc.pid, signal.SIGINT)
    result = finish(proc, time.monotonic(), 30)
    assert result.returncode == 130, result.output
    assert "Traceback" not in result.output and "KeyboardInterrupt" not in result.output, result.output
    assert "SIGINT (Ctrl-C) while starting: nothing more is started" in result.output, result.output
    assert not marker.exists()


FREEZER = Path("/sys/fs/cgroup/freezer")


def test_a_stop_signal_while_a_dead_supervisors_cgroup_is_emptied(sup: Runner) -> None:
    """Emptying a predecessor's phase cgroup blocks (up to 10 s) while a process in it survives SIGKILL; here a
    frozen one does, for real. A SIGINT then waits, and nothing of the lifecycle starts after."""
    if not (FREEZER / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("no writable v1 freezer cgroup here")
    pidfile, marker = sup.tmp / "escapee.pid", sup.tmp / "ran"
    # No tag (env -i): only its phase cgroup finds it, so the next start has to empty that cgroup.
    first = sup.write(f"""
        [[phases]]
        name = "work"
        kind = "service"
        command = {shell(f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec env -i /bin/sleep 300")}
        """, name="first.toml")
    second = sup.write(f"""
        [[phases]]
        name = "next"
        command = {toml_list(["touch", str(marker)])}
        """, name="second.toml")
    frozen = FREEZER / f"pytest-frozen-{os.getpid()}"
    escapee = None
    with v1_cgroup("frozen", 256 * MIB) as cg:
        try:
            dead = start_in_cgroup(sup, first, cg)
            escapee = read_pid(pidfile)
            os.kill(dead.pid, signal.SIGKILL)
            dead.communicate(timeout=10)
            frozen.mkdir()
            (frozen / "cgroup.procs").write_text(str(escapee))
            (frozen / "freezer.state").write_text("FROZEN")
            wait_for(lambda: "FROZEN" in (frozen / "freezer.state").read_text(), timeout=10)
            proc = start_in_cgroup(sup, second, cg)
            assert proc.stdout is not None
            for line in proc.stdout:  # until it has signalled the frozen process and waits for it to die
                if f"by supervisor pid {dead.pid}, which died" in line:
                    break
            proc.send_signal(signal.SIGINT)
            result = finish(proc, time.monotonic(), 40)
            out = result.output
            assert result.returncode == 130, out
            assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
            assert "survived SIGKILL" in out, out  # it did wait out the frozen process...
            assert "SIGINT (Ctrl-C) while starting: nothing more is started" in out  # ... then obeyed
            assert not marker.exists()
        finally:
            if frozen.exists():
                (frozen / "freezer.state").write_text("THAWED")  # the pending SIGKILL lands
            if escapee is not None:
                with contextlib.suppress(OSError):
                    os.kill(escapee, signal.SIGKILL)
                wait_for(lambda: not pid_alive(escapee), timeout=10)
            if frozen.exists():
                remove_cgroup(frozen)


# ---------------------------------------------------------------- SIGXCPU from a real RLIMIT_CPU

FLOOD = """
import sys
line = "x" * 200 + "\\n"
while True:
    sys.stdout.write(line * 50)
    sys.stdout.flush()
"""


@heavy
def test_sigxcpu_from_a_real_cpu_limit_stops_in_order(sup: Runner) -> None:
    """The supervisor's own RLIMIT_CPU is set once its service runs (the service keeps its own, unlimited):
    reading the service's flood of output uses the supervisor's CPU until the kernel sends SIGXCPU."""
    config = sup.write(textwrap.dedent(f"""\
        [supervisor]
        state_dir = {toml_str(str(sup.state_dir))}
        log_dir = {toml_str(str(sup.log_dir))}
        console = false
        log_file_max_bytes = 1048576
        stop_grace_s = 5

        [[phases]]
        name = "flood"
        kind = "service"
        command = {toml_list([PY, "-c", FLOOD])}
        """), header=False)
    proc = sup.start(config)
    log = sup.log_dir / "supervisor.log"
    wait_for(lambda: log.exists() and "phase flood: service is up" in log.read_text(), timeout=20)
    times = psutil.Process(proc.pid).cpu_times()
    soft = math.ceil(times.user + times.system) + 1
    resource.prlimit(proc.pid, resource.RLIMIT_CPU, (soft, soft + 120))
    result = finish(proc, time.monotonic(), 120)
    said = log.read_text()
    assert result.returncode == 128 + signal.SIGXCPU, said
    assert "SIGXCPU (the CPU time limit is reached; SIGKILL follows at the hard limit): every child is stopped" \
        in said, said
    assert "shutting down: received SIGXCPU" in said
    assert "Traceback" not in said + result.output
    flood = int(first_line(said, "started flood/flood: pid ").split("pid ", 1)[1].split(":")[0])
    assert not pid_alive(flood)


INBOX = textwrap.dedent("""
    import signal
    from supervisor.engine.loop import EventLoop
    from supervisor.engine.signals import SignalInbox

    loop = EventLoop()
    heard = []
    inbox = SignalInbox(loop, heard.append)
    for signum in [signal.SIGCHLD] * 5 + [signal.SIGUSR1, signal.SIGUSR1, signal.SIGCHLD]:
        signal.raise_signal(signum)  # each delivered at once: one byte each in the wake-up pipe
    loop.run_once(max_wait=0)
    inbox.close()
    print(" ".join(signal.Signals(signum).name for signum in heard))
""")


def test_the_inbox_takes_a_burst_of_sigchld_as_one_reap_and_every_other_signal_as_it_came() -> None:
    """An orphan storm sends thousands of SIGCHLD: one reap takes every exit there was, so the bytes read at once
    are one reap, not thousands. Any other signal is taken as often as it came (a second stop signal means
    something), in order."""
    proc = subprocess.run([PY, "-c", INBOX], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["SIGCHLD", "SIGUSR1", "SIGUSR1"], proc.stdout + proc.stderr


INBOX_FLOOD = textwrap.dedent("""
    import signal
    from supervisor.engine.loop import EventLoop
    from supervisor.engine.signals import SignalInbox

    loop = EventLoop()
    heard = []
    inbox = SignalInbox(loop, heard.append)
    for _ in range(100_000):  # a storm's SIGCHLDs while the loop is held: more bytes than a default pipe holds
        signal.raise_signal(signal.SIGCHLD)
    signal.raise_signal(signal.SIGTERM)
    loop.run_once(max_wait=0)
    inbox.close()
    print(" ".join(signal.Signals(signum).name for signum in heard))
""")


def test_a_stop_signal_after_a_storm_of_sigchld_is_not_dropped_from_the_wake_up_pipe() -> None:
    """100,000 SIGCHLD bytes (an orphan storm while a start holds the loop) filled Linux's default 64 KiB pipe, and
    the C handler dropped the byte of the SIGTERM that came after them: `docker stop` went unheard until its
    SIGKILL. The pipe is made large enough, and a drain reads it to the end."""
    proc = subprocess.run([PY, "-c", INBOX_FLOOD], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["SIGCHLD", "SIGTERM"], proc.stdout[-300:] + proc.stderr


INBOX_RAISING = textwrap.dedent("""
    import signal
    from supervisor.engine.loop import EventLoop
    from supervisor.engine.signals import SignalInbox

    loop = EventLoop()
    calls = []

    def on_signal(signum):
        calls.append(signum)
        if len(calls) == 1:  # the first reap stops short: an exit's handler raised in it
            raise RuntimeError("a handler raised in the reap")

    inbox = SignalInbox(loop, on_signal)
    for _ in range(3):
        signal.raise_signal(signal.SIGCHLD)
    loop.run_once(max_wait=0)
    inbox.close()
    print(len(calls))
""")


def test_a_reap_that_raised_leaves_the_next_sigchld_of_the_burst_to_reap_again() -> None:
    """The burst is one reap only once a reap went through: one that raised (an exit's handler) may have left
    exits waiting, and the next SIGCHLD byte reaps again, as each byte did before the burst was one."""
    proc = subprocess.run([PY, "-c", INBOX_RAISING], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2"], proc.stdout + proc.stderr


def test_the_first_stop_signal_before_the_start_decides_the_exit_status() -> None:
    """`docker stop` (SIGTERM), then an impatient Ctrl-C while the startup steps run: the run exits as the first
    asked (143), and each signal is said with the status it will have."""
    said: list[str] = []
    router = SignalRouter(SimpleNamespace(reap=lambda: None), said.append)
    router.handle(signal.SIGTERM)
    router.handle(signal.SIGINT)
    assert router.stop_requested == ("received SIGTERM", 128 + signal.SIGTERM)
    assert len(said) == 2 and all(line.endswith("the supervisor exits with status 143") for line in said), said
    assert said[1].startswith("SIGINT ("), said
