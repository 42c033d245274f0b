"""Stopping: the supervisor is told to stop (SIGTERM / SIGINT) and nothing may survive it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from helpers import Runner, pid_alive, py_script, read_pid, toml_str, until, wait_for


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


# Records every signal it gets (name and time) in argv[1], writes its pid to argv[2], exits on
# the first signal named in argv[3] (comma-separated; "-" for none).
RECORDER = """
import signal, sys, time
log, pidfile, who = sys.argv[1], sys.argv[2], sys.argv[4]
exit_on = set(sys.argv[3].split(","))

def handler(signum, frame):
    name = signal.Signals(signum).name
    with open(log, "a") as f:
        f.write(f"{who} {name} {time.time():.6f}\\n")
    if name in exit_on:
        sys.exit(0)

for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, handler)
write_pid(pidfile)
while True:
    time.sleep(0.05)
"""


def test_sigterm_stops_children_in_reverse_order_with_their_stop_signal(sup: Runner) -> None:
    log, cmd_pid, db_pid = sup.tmp / "signals", sup.tmp / "cmd.pid", sup.tmp / "db.pid"
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {py_script(sup.tmp, "cmd", RECORDER, log, cmd_pid, "SIGTERM", "command")}
        stop_grace_s = 5
        [[phases.daemons]]
        name = "db"
        command = {py_script(sup.tmp, "db", RECORDER, log, db_pid, "SIGINT", "daemon")}
        stop_signal = "SIGINT"
        stop_grace_s = 5
        ready = {toml_str(str(db_pid))}
        ready_timeout_s = 20
    """)
    proc = sup.start(config)
    pids = [read_pid(db_pid), read_pid(cmd_pid)]
    time.sleep(0.2)  # both have installed their handlers (they do before writing the pid file)
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    records = [line.split() for line in log.read_text().splitlines()]
    # each child got exactly its own stop signal, the command first, then the daemon
    assert [r[:2] for r in records] == [["command", "SIGTERM"], ["daemon", "SIGINT"]], records
    assert float(records[0][2]) <= float(records[1][2])
    assert time.monotonic() - started < 5, "a stop waited out a grace although the child exited at once"
    assert not any(pid_alive(p) for p in pids)
    assert "SIGKILL" not in out


def test_child_ignoring_sigterm_is_killed_after_grace(sup: Runner) -> None:
    pidfile = sup.tmp / "pid"
    grace = 1.0
    cmd = py_script(sup.tmp, "stubborn", """
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_pid(sys.argv[1])
        time.sleep(60)
    """, pidfile)
    config = sup.write(f"""
        [[phases]]
        name = "stubborn"
        command = {cmd}
    """, stop_grace_s=grace)
    proc = sup.start(config)
    pid = read_pid(pidfile)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    while pid_alive(pid) and time.monotonic() - t0 < 20:
        time.sleep(0.01)
    died_after = time.monotonic() - t0
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143, out
    assert not pid_alive(pid)
    assert died_after >= grace, f"killed after {died_after:.2f}s, before the {grace}s grace"
    assert died_after < grace + 3, f"killed only after {died_after:.2f}s"
    assert "SIGKILL" in out


@pytest.mark.parametrize(("stop", "said"), [
    (signal.SIGSTOP, "was stopped by SIGSTOP: it does nothing until it is continued (SIGCONT)"),
    (signal.SIGTTIN, "was stopped by SIGTTIN (it read from the terminal from the background): it does nothing "
                     "until it is continued (SIGCONT)"),
])
def test_a_stopped_child_is_said_and_continued_so_that_its_own_clean_stop_runs(sup: Runner, stop: int,
                                                                             said: str) -> None:
    """A child stopped (SIGSTOP, SIGTTIN from a tty it read) does nothing, and said nothing of it: only a stall
    watch would end the silence. Its stop is said. And it keeps SIGTERM pending until it is continued: without a
    SIGCONT it waited out its whole grace and was SIGKILLed, its handler never run. systemd sends SIGCONT after
    the stop signal; so does the supervisor."""
    log, cmd_pid = sup.tmp / "signals", sup.tmp / "cmd.pid"
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {py_script(sup.tmp, "cmd", RECORDER, log, cmd_pid, "SIGTERM", "command")}
        stop_grace_s = 20
    """)
    proc = sup.start(config)
    pid = read_pid(cmd_pid)
    time.sleep(0.2)  # its handlers are installed (before it writes its pid file)
    os.kill(pid, stop)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 10)
    time.sleep(0.2)  # (the supervisor hears of the stop: SIGCHLD)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out
    assert [line.split()[:2] for line in log.read_text().splitlines()] == [["command", "SIGTERM"]], out
    assert "SIGKILL" not in out, out
    assert f"[supervisor] svc/svc (pid {pid}) {said}" in out, out  # (its continue and its exit come together:
    # the kernel may report the exit alone)
    assert not pid_alive(pid)


def test_setsid_grandchild_is_stopped_too(sup: Runner) -> None:
    gc_pid, cmd_pid = sup.tmp / "gc.pid", sup.tmp / "cmd.pid"
    # A middle process starts the grandchild in a session of its own and exits: the grandchild has
    # left both the process group and the parent chain (it is re-parented to the supervisor). It
    # ignores SIGTERM too, so only the SIGKILL after the grace ends it.
    cmd = py_script(sup.tmp, "escaper", """
        import os, subprocess, sys, time
        mid = os.fork()
        if mid == 0:
            p = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"], start_new_session=True)
            write_pid(sys.argv[1], p.pid)
            os._exit(0)
        os.waitpid(mid, 0)
        write_pid(sys.argv[2])
        time.sleep(60)
    """, gc_pid, cmd_pid)
    config = sup.write(f"""
        [[phases]]
        name = "esc"
        kind = "service"
        command = {cmd}
    """, stop_grace_s=0.5)
    proc = sup.start(config)
    cmd, gc = read_pid(cmd_pid), read_pid(gc_pid)
    assert os.getpgid(gc) != os.getpgid(cmd) and os.getsid(gc) == gc
    wait_for(lambda: psutil.Process(gc).ppid() != cmd and psutil.Process(gc).name() == "sleep", timeout=10)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert not pid_alive(gc), "the setsid grandchild survived"
    assert not pid_alive(cmd)
    # the stop found it, not the last-resort sweep at exit
    assert "leftover" not in out, out
    # Each line names whom its signal went to: the group at once, and the one outside it by its pid.
    assert f"SIGTERM to process group {cmd} and 1 process(es) of its tree outside the group [{gc}], grace" in out, out
    assert f"SIGKILL to 1 process(es) of its tree outside the group [{gc}]" in out, out


def test_the_stop_line_names_the_group_its_signal_went_to_not_one_pid(sup: Runner) -> None:
    """The stop signal goes to the whole process group in one killpg; the line said "pid N" when the group's
    members were all gone by the time the tree was read after it, as if one process had been sent it."""
    config = sup.write("""
        [[phases]]
        name = "grp"
        kind = "service"
        command = ["sh", "-c", "sleep 300 & sleep 301 & wait"]
    """)
    proc = sup.start(config)
    started = until(proc, "phase grp: starting → running")
    pid = int(started.split("started grp/grp: pid ", 1)[1].split(":", 1)[0])
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert f"stopping grp/grp (supervisor shutdown): SIGTERM to process group {pid}, grace" in out, out


def test_second_sigterm_during_grace_kills_at_once(sup: Runner) -> None:
    log, pidfile = sup.tmp / "signals", sup.tmp / "pid"
    config = sup.write(f"""
        [[phases]]
        name = "slowstop"
        command = {py_script(sup.tmp, "rec", RECORDER, log, pidfile, "-", "command")}
        stop_grace_s = 30
    """)
    proc = sup.start(config)
    pid = read_pid(pidfile)
    os.kill(proc.pid, signal.SIGTERM)
    wait_for(lambda: log.exists() and "SIGTERM" in log.read_text(), timeout=10)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    took = time.monotonic() - t0
    assert proc.returncode == 143, out
    assert took < 10, f"the second SIGTERM did not cut the 30 s grace short ({took:.1f}s)"
    assert not pid_alive(pid)
    assert "SIGTERM again while stopping: SIGKILL to everything now" in out



def test_a_second_sigterm_names_a_daemon_it_killed_before_its_wave_stopped_by_the_shutdown(sup: Runner) -> None:
    # The service ignores SIGTERM, so its daemon's wave is not yet told to stop when the second SIGTERM kills
    # everything: that SIGKILL is the shutdown's, not a daemon that died while its phase needed it (a failure
    # the manager would have been told of).
    config = sup.write("""
        [[phases]]
        name = "serve"
        kind = "service"
        command = ["sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.2; done"]
          [[phases.daemons]]
          name = "d"
          command = ["sh", "-c", "exec sleep 3600"]
    """, stop_grace_s=30)
    proc = sup.start(config)
    output = until(proc, "trapped")  # (its SIGTERM ignored: the daemon's wave waits for it)
    proc.send_signal(signal.SIGTERM)
    output += until(proc, "stopping serve/serve (supervisor shutdown)")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    output += rest
    assert proc.returncode == 143, output[-3000:]
    assert "SIGKILL to everything now" in output, output[-3000:]
    assert "stopping serve/d " not in output.split("SIGKILL to everything now")[0], "its wave had begun"
    ended = [line for line in output.splitlines() if "] ended: phase=serve child=" in line]
    assert len(ended) == 2, output[-3000:]
    assert all(" reason=stopped " in line for line in ended), ended
    assert "daemon_died" not in output and "while its phase needed it" not in output, output[-3000:]


def test_sigint_exits_130(sup: Runner) -> None:
    pidfile = sup.tmp / "pid"
    cmd = py_script(sup.tmp, "idle", "import sys, time\nwrite_pid(sys.argv[1])\ntime.sleep(60)\n", pidfile)
    config = sup.write(f"""
        [[phases]]
        name = "idle"
        command = {cmd}
    """, stop_grace_s=2)
    proc = sup.start(config)
    pid = read_pid(pidfile)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 130, out
    assert not pid_alive(pid)
    assert "received SIGINT" in out


SPAWNER = """
import os, signal, subprocess, sys, time
pids, role = sys.argv[1], sys.argv[2]

def ignore_term():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

if role == "daemon":
    signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
else:
    ignore_term()  # this one has to be SIGKILLed
kids = [
    subprocess.Popen(["sleep", "60"]),
    subprocess.Popen(["sleep", "60"], preexec_fn=ignore_term),
    subprocess.Popen(["sleep", "60"], start_new_session=True),
    subprocess.Popen(["sh", "-c", "sleep 60 & echo $! > " + pids + "." + role + ".bg; sleep 60"]),
]
bg_file = pids + "." + role + ".bg"
while not (os.path.exists(bg_file) and open(bg_file).read().endswith("\\n")):  # written whole
    time.sleep(0.01)
with open(bg_file) as f:
    bg = int(f.read())
with open(pids + "." + role + ".tmp", "w") as f:
    f.write(" ".join(str(p) for p in [os.getpid(), bg, *(k.pid for k in kids)]))
os.replace(pids + "." + role + ".tmp", pids + "." + role)
while True:
    time.sleep(0.1)
"""


def test_nothing_survives_a_shutdown(sup: Runner) -> None:
    pids = sup.tmp / "pids"
    config = sup.write(f"""
        [[phases]]
        name = "setup"
        command = ["true"]

        [[phases]]
        name = "svc"
        kind = "service"
        command = {py_script(sup.tmp, "spawner", SPAWNER, pids, "command")}
        [[phases.daemons]]
        name = "db"
        command = {py_script(sup.tmp, "spawner_d", SPAWNER, pids, "daemon")}
        stop_signal = "SIGINT"
        ready = {toml_str(str(pids) + ".daemon")}
        ready_timeout_s = 20
    """, stop_grace_s=0.5)
    proc = sup.start(config)
    wait_for(lambda: Path(f"{pids}.command").exists(), timeout=20)
    recorded = [int(p) for role in ("daemon", "command") for p in Path(f"{pids}.{role}").read_text().split()]
    assert len(recorded) == 12
    tree = set(descendants(proc.pid))
    assert set(recorded) <= tree, f"the test's pid bookkeeping is off: {sorted(recorded)} vs {sorted(tree)}"
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    survivors = [p for p in tree | set(recorded) if pid_alive(p)]
    assert not survivors, f"still alive after the supervisor exited: {survivors}"
    assert "leftover" not in out, out
