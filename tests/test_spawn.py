"""A start's own moments (supervisor/engine/spawn.py), each in a process of its own: the fork's window,
before the child leaves the supervisor's process group, and the bounded wait for the exec while the
supervisor itself is stopped.

The full runs (a hung mount, a missing interpreter, a retried start) are in test_offloop.py and
test_exit_status.py; these reach what a full run cannot aim at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

from helpers import PY, REPO

# Stands in for the supervisor around one start: its wake-up descriptor set, a handler for SIGUSR1, and the
# child's setpgid made to come after a signal to the group (a Ctrl-C at the terminal, kill -- -PGID), which
# is the window the signal must not be taken twice in.
FORK_WINDOW = textwrap.dedent("""
    import os
    import signal
    import time
    from supervisor.config.model import ChildSpec
    from supervisor.engine import spawn

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    real_setpgid = os.setpgid

    def setpgid_after_a_group_signal(pid, pgrp):  # runs in the child, still in the supervisor's group
        os.killpg(os.getpgrp(), signal.SIGUSR1)
        real_setpgid(pid, pgrp)

    os.setpgid = setpgid_after_a_group_signal
    spec = ChildSpec(phase="p", name="p", command=("sh", "-c", "exit 7"), env={}, cwd=None,
                     stop_signal=signal.SIGTERM, stop_grace_s=1.0, ready=None, ready_timeout_s=1.0)
    child = spawn.spawn(spec, dict(os.environ), output=None)
    os.setpgid = real_setpgid
    _, status = os.waitpid(child.pid, 0)
    time.sleep(0.2)
    try:
        woken = list(os.read(wake_r, 64))
    except BlockingIOError:
        woken = []
    print("child", os.waitstatus_to_exitcode(status), "woken", woken, flush=True)
""")


def test_a_group_signal_in_the_forks_window_reaches_the_supervisor_once_and_the_child_not_at_all() -> None:
    """The child runs the supervisor's Python until its exec. A signal sent to the supervisor's process group
    before the child's setpgid reaches the child too: its handler (the supervisor's) wrote the signal into the
    supervisor's wake-up descriptor, so the supervisor took it twice (a Ctrl-C, then "again": SIGKILL to
    everything). Now the child holds every signal blocked until it left the group, off the descriptor, and
    drops what came meanwhile: the supervisor is woken once and the child runs its command untouched."""
    proc = subprocess.run([PY, "-c", FORK_WINDOW], cwd=REPO, capture_output=True, text=True, timeout=30,
                          start_new_session=True)  # the group signal stays inside the test's own group
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "7", "woken", f"[{int(signal.SIGUSR1)}]"], proc.stdout + proc.stderr


AWAIT = textwrap.dedent("""
    import sys
    from supervisor.engine.spawn import _await_exec

    print("waiting", flush=True)
    print("got", repr(_await_exec(int(sys.argv[1]), float(sys.argv[2]))), flush=True)
""")


def test_time_the_supervisor_was_stopped_does_not_count_against_the_exec() -> None:
    """SIGSTOP (or docker pause) while a start waits for its exec: the wait's clock went on, the supervisor did
    not. Counted, the healthy child would be killed as a hung exec at SIGCONT. The wait gives that time back:
    the exec that ran just after the thaw is taken as run (its report pipe closed with nothing on it)."""
    wait_s, stopped_s = 3.0, 5.0
    report_r, report_w = os.pipe()
    proc = subprocess.Popen([PY, "-c", AWAIT, str(report_r), str(wait_s)], cwd=REPO, pass_fds=(report_r,),
                            stdout=subprocess.PIPE, text=True)
    os.close(report_r)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(stopped_s)  # longer than the whole wait
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.3)
        os.close(report_w)  # the child's exec ran: its end of the pipe closed, nothing said
        report_w = -1
        out, _ = proc.communicate(timeout=20)
    finally:
        if report_w >= 0:
            os.close(report_w)
        proc.kill()
        proc.wait()
    assert out == "got b''\n", f"the wait gave up on a running exec: {out!r}"
