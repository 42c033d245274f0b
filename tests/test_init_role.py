"""The init role: reap every orphan (as real PID 1 or as a child subreaper), stay out of
the OOM killer's way, and leave no process behind when the supervisor exits.

Everything here runs the real supervisor on real processes; PID 1 mode uses a new
PID namespace (``unshare --pid --fork --mount-proc``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import (
    PY,
    REPO,
    Runner,
    kill_tree,
    needs_unshare,
    pid_alive,
    read_pid,
    supervisor_pid,
    toml_list,
    wait_for,
)

from supervisor import __version__

CHILD_LINE_RE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \[([^\]]+)\] (.*)$")
FIRST_LINE_RE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \[supervisor\] prover-supervisor pid (\d+) as (pid1|subreaper); "
                           r"(oom_score_adj -1000, children 0|oom_score_adj unchanged \([^)]+\); "
                           r"children raised to (\d+) instead); ")

PID1 = [False, pytest.param(True, marks=needs_unshare)]
PID1_IDS = ["subreaper", "pid1"]


def lines_of(output: str, label: str) -> list[str]:
    """What the child ``label`` (``phase/name``) printed, in order, from the supervisor's console."""
    out = []
    for line in output.splitlines():
        match = CHILD_LINE_RE.match(line)
        if match and match.group(1) == label:
            out.append(match.group(2))
    return out


def banner(output: str) -> re.Match[str]:
    """The supervisor's first console line (pid, role, oom_score_adj), parsed."""
    first = output.splitlines()[0] if output else ""
    match = FIRST_LINE_RE.match(first)
    assert match, f"unexpected first line: {first!r}"
    return match


def script(sup: Runner, name: str, body: str) -> list[str]:
    """Write a /bin/sh script under the test's directory; returns its command (no ``$`` escaping needed)."""
    path = sup.tmp / name
    path.write_text("set -e\n" + textwrap.dedent(body))
    return ["sh", str(path)]


def processes_with(token: str) -> list[psutil.Process]:
    """Live (not zombie) processes anywhere on the machine whose command line holds ``token``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and token in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def unique_sleep() -> str:
    """A sleep duration no other process on the machine uses: its command line identifies our orphans."""
    return f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06d}"


# ---------------------------------------------------------------- 1. as real PID 1: no zombie is left

ZOMBIE_COUNTER = """\
import os, time

def scan():
    zombies = sleepers = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        name = data[data.index("(") + 1 : data.rindex(")")]
        state = data[data.rindex(")") + 2]
        zombies += state == "Z"
        sleepers += state != "Z" and name == "sleep"
    return zombies, sleepers

# Orphans still asleep may linger a moment; a zombie that stays is one nobody reaps.
deadline = time.monotonic() + 5
while True:
    zombies, sleepers = scan()
    if (zombies == 0 and sleepers == 0) or time.monotonic() > deadline:
        break
    time.sleep(0.05)
visible = len([e for e in os.listdir("/proc") if e.isdigit()])
print(f"pid {os.getpid()}; zombies={zombies} sleepers={sleepers} visible={visible}")
"""


@needs_unshare
def test_pid1_reaps_an_orphan_storm(sup: Runner) -> None:
    counter = sup.tmp / "count_zombies.py"
    counter.write_text(ZOMBIE_COUNTER)
    command = script(sup, "storm.sh", f"""\
        for i in $(seq 200); do (sh -c "sleep 0.1" &); done
        echo "forked 200 orphans"
        sleep 1
        {PY} {counter}
        """)
    config = sup.write(f"""
        [[phases]]
        name = "storm"
        command = {toml_list(command)}
        timeout_s = 30
        """, stop_grace_s=1)
    result = sup.run(config, pid1=True, timeout=60)
    match = banner(result.output)
    assert match.group(1) == "1" and match.group(2) == "pid1", result.output
    printed = lines_of(result.output, "storm/storm")
    assert "forked 200 orphans" in printed, result.output
    counts = [re.search(r"zombies=(\d+) sleepers=(\d+) visible=(\d+)", line) for line in printed]
    counts = [c for c in counts if c]
    assert len(counts) == 1, result.output
    zombies, sleepers, visible = (int(x) for x in counts[0].groups())
    print(f"{visible} processes visible in the namespace")
    assert zombies == 0, f"{zombies} zombie(s) left in the namespace:\n{result.output}"
    assert sleepers == 0
    assert result.returncode == 0, result.output
    assert "reaped orphan pid" in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- 2. not PID 1: a subreaper


def test_subreaper_adopts_orphans_and_takes_them_down(sup: Runner) -> None:
    plain, detached, stubborn = (sup.tmp / f"{n}.pid" for n in ("plain", "setsid", "stubborn"))
    token = unique_sleep()
    command = script(sup, "service.sh", f"""\
        (sh -c 'echo $$ > {plain}; exec sleep {token}' &)
        (setsid sh -c 'echo $$ > {detached}; exec sleep {token}' &)
        (setsid sh -c 'trap "" TERM; echo $$ > {stubborn}; exec sleep {token}' &)
        echo "grandchildren started"
        exec sleep 300
        """)
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {toml_list(command)}
        """, stop_grace_s=0.5)
    proc = sup.start(config)
    pids: list[int] = []
    try:
        pids = [read_pid(p) for p in (plain, detached, stubborn)]
        for pid in pids:
            # The double fork's middle process is gone: the kernel hands the grandchild to the subreaper.
            wait_for(lambda pid=pid: psutil.Process(pid).ppid() == proc.pid, timeout=10)
        assert os.getsid(pids[1]) == pids[1] and os.getsid(pids[2]) == pids[2]  # they really left the session
        assert os.getpgid(pids[1]) != os.getpgid(pids[0])
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        survivors = [psutil.Process(p) for p in pids if pid_alive(p)]
        kill_all(survivors + processes_with(token))
    match = banner(out)
    assert match.group(1) == str(proc.pid) and match.group(2) == "subreaper", out
    assert proc.returncode == 143, out
    assert not survivors, f"still alive after the supervisor exited: {[p.pid for p in survivors]}\n{out}"
    assert not processes_with(token)
    assert "received SIGTERM" in out
    assert "Traceback" not in out


# ---------------------------------------------------------------- 3. reaped orphans are logged


@pytest.mark.parametrize("pid1", PID1, ids=PID1_IDS)
def test_reaped_orphan_is_logged(sup: Runner, pid1: bool) -> None:
    exits, killed = sup.tmp / "exits.pid", sup.tmp / "killed.pid"
    command = script(sup, "orphans.sh", f"""\
        (sh -c 'echo $$ > {exits}; exec sleep 0.2' &)
        (sh -c 'echo $$ > {killed}; sleep 0.2; kill -KILL $$' &)
        sleep 1.5
        echo "phase done"
        """)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {toml_list(command)}
        timeout_s = 20
        """, stop_grace_s=1)
    result = sup.run(config, pid1=pid1, timeout=30)
    assert result.returncode == 0, result.output
    assert banner(result.output).group(2) == ("pid1" if pid1 else "subreaper")
    exits_pid, killed_pid = int(exits.read_text()), int(killed.read_text())
    assert f"reaped orphan pid {exits_pid} (exited with code 0)" in result.output, result.output
    assert f"reaped orphan pid {killed_pid} (killed by SIGKILL (status 137))" in result.output, result.output
    # The orphans' statuses are theirs alone: the phase's own verdict is unaffected.
    assert "reason=exit_code exit_code=0" in result.output
    assert "lifecycle complete" in result.output
    assert "phase done" in lines_of(result.output, "p/p")


# ---------------------------------------------------------------- 4. oom_score_adj


@pytest.mark.parametrize("pid1", PID1, ids=PID1_IDS)
def test_oom_score_adj(sup: Runner, pid1: bool) -> None:
    command = script(sup, "oom.sh", """\
        echo "child=$(cat /proc/self/oom_score_adj)"
        echo "parent=$(cat /proc/$PPID/oom_score_adj)"
        """)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {toml_list(command)}
        """)
    result = sup.run(config, pid1=pid1, timeout=30)
    assert result.returncode == 0, result.output
    oom = banner(result.output).group(3)
    printed = dict(line.split("=", 1) for line in lines_of(result.output, "p/p") if "=" in line)
    assert set(printed) == {"child", "parent"}, result.output
    if oom.startswith("oom_score_adj -1000"):
        assert printed["parent"] == "-1000", result.output  # the supervisor itself is protected ...
        assert printed["child"] == "0", result.output  # ... and its children are not
        return
    # Not allowed to lower its own score (as here, or in a default container): the supervisor
    # keeps what it inherited and its children raise theirs above it instead (no privilege needed).
    ours = Path("/proc/self/oom_score_adj").read_text().strip()
    raised = banner(result.output).group(4)
    assert printed["parent"] == ours, result.output
    assert printed["child"] == raised and int(raised) > int(ours), result.output
    print(f"this sandbox does not let the supervisor lower its oom_score_adj: {oom}; the child runs at {raised}")


# ---------------------------------------------------------------- 5. no orphan survives the supervisor


@pytest.mark.parametrize("pid1", PID1, ids=PID1_IDS)
@pytest.mark.parametrize("ending", ["completed", "failed", "sigterm"])
def test_no_orphan_survives(sup: Runner, ending: str, pid1: bool) -> None:
    token = unique_sleep()
    names = ("plain", "setsid", "stubborn", "deep", "untagged")
    files = [sup.tmp / f"{n}.pid" for n in names]
    plain, detached, stubborn, deep, untagged = files
    sleep = shutil.which("sleep")
    ready = sup.tmp / "ready"
    finish = {"completed": "exit 0", "failed": "exit 3", "sigterm": "exec sleep 300"}[ending]
    command = script(sup, "spawner.sh", f"""\
        (sh -c 'echo $$ > {plain}; exec sleep {token}' &)
        (setsid sh -c 'echo $$ > {detached}; exec sleep {token}' &)
        (setsid sh -c 'trap "" TERM; echo $$ > {stubborn}; exec sleep {token}' &)
        (setsid sh -c '(setsid sh -c "echo \\$$ > {deep}; exec sleep {token}" &); exec sleep {token}' &)
        # A clean environment: not even the supervisor's tag is left to find it by.
        (setsid env -i /bin/sh -c 'echo $$ > {untagged}; exec {sleep} {token}' &)
        for f in {' '.join(str(f) for f in files)}; do
            while [ ! -s "$f" ]; do sleep 0.02; done
            kill -0 "$(cat "$f")"
        done
        echo "all {len(files)} orphans alive"
        touch {ready}
        {finish}
        """)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        kind = "{'service' if ending == 'sigterm' else 'oneshot'}"
        command = {toml_list(command)}
        """, stop_grace_s=0.5)
    proc = sup.start(config, pid1=pid1)
    try:
        if ending == "sigterm":
            wait_for(ready.exists, timeout=15)
            wait_for(lambda: len(processes_with(token)) >= 6, timeout=10)
            # unshare(1) does not pass signals on: send it to the supervisor (the namespace's PID 1) itself.
            os.kill(supervisor_pid(proc, pid1), signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        out = ""
        pytest.fail("the supervisor did not exit")
    finally:
        left = processes_with(token)
        kill_all(left)
    expected = {"completed": 0, "failed": 3, "sigterm": 143}[ending]
    assert proc.returncode == expected, out
    assert f"all {len(files)} orphans alive" in lines_of(out, "p/p"), out
    assert not left, f"alive after the supervisor exited: {[(p.pid, p.info['cmdline']) for p in left]}\n{out}"
    if not pid1:  # the pids in the files are ours to check only outside a PID namespace
        pids = [int(f.read_text()) for f in files]
        assert not [p for p in pids if pid_alive(p)], out
    assert "Traceback" not in out


def test_started_with_its_standard_descriptors_closed_each_child_still_gets_its_own(sup: Runner) -> None:
    """A launcher may start the supervisor with stdin, stdout and stderr closed (a daemonizing wrapper, a
    ``<&- >&-`` in an onstart script): its first pipe is then numbered 0, 1 or 2, the very numbers a child's
    output is moved onto before exec. Each child's stdout and stderr still reach its log file, each its own,
    and its stdin is /dev/null."""
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {toml_list(["sh", "-c", "echo to-stdout; echo to-stderr >&2; read x; echo read=$?"])}
        """)
    done = subprocess.run(["sh", "-c", 'exec "$0" -m supervisor run --config "$1" <&- >&- 2>&-', PY, str(config)],
                          cwd=REPO, timeout=60)
    assert done.returncode == 0
    log = (sup.log_dir / "p.log").read_text()
    assert "to-stdout" in log and "to-stderr" in log and "read=1" in log, log  # read=1: end of file at once
    supervisor_log = (sup.log_dir / "supervisor.log").read_text()
    assert "phase p: stopping → done" in supervisor_log, supervisor_log


def test_a_child_inherits_none_of_the_supervisors_descriptors(sup: Runner) -> None:
    """Only its stdin, stdout and stderr: not what the supervisor opened (its own are close-on-exec), nor what
    its launcher left open to it (an onstart script's, a terminal's), which it would otherwise hand on to every
    child and grandchild for their whole lives."""
    lister = "import os; print('fds', sorted(int(n) for n in os.listdir('/proc/self/fd')))"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {toml_list([PY, "-c", lister])}
        """)
    with open(sup.tmp / "launcher-leak", "w") as leaked:
        os.set_inheritable(leaked.fileno(), True)
        done = subprocess.run([PY, "-m", "supervisor", "run", "--config", str(config)], cwd=REPO, timeout=60,
                              pass_fds=(leaked.fileno(),), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # 3: the listing's own descriptor, the lowest free one where nothing else was left open.
    assert "[p/p] fds [0, 1, 2, 3]" in done.stdout, done.stdout


def _touching_phase(sup: Runner) -> tuple[Path, Path]:
    """A one-phase config whose child touches a marker: (the marker, the config); the marker says it started."""
    marker = sup.tmp / "ran"
    return marker, sup.write(f"""
        [[phases]]
        name = "a"
        command = ["touch", "{marker}"]
        """)


@needs_unshare
def test_without_proc_the_start_says_so_in_one_line(sup: Runner) -> None:
    # No /proc mounted (or an empty one): psutil's process list failed with an IndexError of its own, a traceback
    # from the start-up sweep. The environment cannot host a run: one line, exit 2, nothing started.
    marker, config = _touching_phase(sup)
    inner = f"umount -l /proc && exec {PY} -m supervisor run --config {config}"
    result = subprocess.run(["unshare", "--mount", "--pid", "--fork", "sh", "-c", inner], capture_output=True,
                            text=True, timeout=60, cwd=REPO, env=sup.env())
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == ("prover-supervisor: cannot look for what a dead supervisor left "
                                              "running: /proc lists no process (is it mounted?)"), result.stderr
    assert not marker.exists()


@needs_unshare
def test_as_pid_1_on_another_namespaces_proc_the_start_says_so_in_one_line(sup: Runner) -> None:
    # unshare --pid --fork without --mount-proc: the supervisor (pid 1) read the host's /proc, signalled host pids
    # it could not reach, named them survivors of SIGKILL, "killed 51 leftover process(es)" of the host's at its
    # exit, and left its own children running. Nothing can be supervised there: one line, exit 2, nothing started.
    marker, config = _touching_phase(sup)
    result = subprocess.run(["unshare", "--pid", "--fork", *sup.argv(config)], capture_output=True, text=True,
                            timeout=60, cwd=REPO, env=sup.env())
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.splitlines()[-1]
    assert re.fullmatch(r"prover-supervisor: /proc is another PID namespace's \(its /proc/self is pid \d+; this "
                        r"process is pid 1\): every process tree would be read there; mount this PID namespace's "
                        r"/proc \(unshare --mount-proc; docker run mounts one\)", line), result.stderr
    assert not marker.exists() and not sup.state_dir.exists()


# ---------------------------------------------------------------- signals before main, and the other commands

MASK_AT_IMPORT = """\
import importlib.abc, runpy, signal, sys

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "supervisor.app":
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            print("blocked at the package's import:", sorted(int(s) for s in blocked), flush=True)  # (a JSON list)
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, Watch())
sys.argv = [sys.argv[1], "--version"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("run", ["runpy.run_path(sys.argv[0], run_name='__main__')",
                                 "runpy.run_module('supervisor', run_name='__main__', alter_sys=True)",
                                 "from supervisor.__main__ import main; sys.exit(main())"],
                         ids=["entrypoint.py", "python -m supervisor", "the prover-supervisor script"])
def test_the_stop_signals_wait_from_before_the_package_is_imported(run: str) -> None:
    # As PID 1 the kernel drops a signal with no handler: a SIGTERM in the tens of ms the imports take (docker
    # stop right after docker run) was lost, and docker waited out its 10 s to SIGKILL.
    code = MASK_AT_IMPORT.replace("runpy.run_path(sys.argv[0], run_name=\"__main__\")", run)
    result = subprocess.run([PY, "-c", code, str(REPO / "entrypoint.py")], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("blocked at the package's import:"))
    blocked = set(json.loads(line.split(":", 1)[1]))
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT} <= blocked, blocked
    assert result.stdout.rstrip().endswith(f"prover-supervisor {__version__}"), result.stdout


@needs_unshare
def test_a_command_other_than_run_as_pid_1_ends_on_sigterm() -> None:
    # docker run IMAGE dev-manager (or status --watch): the command made no inbox, and as PID 1 the kernel
    # dropped the SIGTERM of docker stop; it ran on until docker's SIGKILL.
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", PY, "-m", "supervisor", "dev-manager",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        pid = supervisor_pid(proc, True)
        wait_for(lambda: any(c.laddr for c in psutil.Process(pid).net_connections("tcp")), timeout=30)
        os.kill(pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM, proc.stdout.read() if proc.stdout else ""
    finally:
        kill_tree(proc.pid)
        proc.wait(10)
