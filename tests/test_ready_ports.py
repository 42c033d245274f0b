"""Readiness is the daemon's own: a local ready port held by another process neither lets the daemon start
nor makes it ready (supervisor/engine/ports.py, lifecycle/attempt.py, readiness.py).

Real processes and real ports on 127.0.0.1: a stranger that holds the port before the start fails the
attempt ``port_in_use`` naming it (pid and name); a stranger that binds after the check but before the
daemon does is said once and never counts as ready; a daemon whose own child listens (a wrapper shell)
is ready as before; file and unix-socket readiness are untouched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers import (
    PY,
    REPO,
    Console,
    Runner,
    clean_env,
    failure,
    finish,
    first_line,
    free_port,
    kill_tree,
    py_script,
    sh,
    stranger_on,
    toml_list,
    toml_str,
    verdict_fields,
    verdict_lines,
)

from supervisor.config import ConfigError, ReadyCheck, parse_plan
from supervisor.engine import ports
from supervisor.engine.loop import EventLoop
from supervisor.exits import EXIT_FAILURE, EXIT_TIMEOUT

Stranger = Callable[[int], subprocess.Popen[bytes]]

LISTENER = """
    import socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    time.sleep(600)
"""


@pytest.fixture
def stranger() -> Iterator[Stranger]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> subprocess.Popen[bytes]:
        procs.append(stranger_on(port))
        return procs[-1]

    yield start
    for proc in procs:
        kill_tree(proc.pid)
        proc.wait(10)


def name_of(pid: int) -> str:
    return psutil.Process(pid).name()


def daemon_config(sup: Runner, port: int, daemon: str, *, extra: str = "", ready_timeout_s: float = 20) -> Path:
    return sup.write(f"""
        [[phases]]
        name = "web"
        command = {sh(f"touch {sup.tmp / 'command.ran'}")}
        {extra}
        [[phases.daemons]]
        name = "server"
        command = {daemon}
        ready = "tcp://127.0.0.1:{port}"
        ready_timeout_s = {ready_timeout_s}
        stop_grace_s = 1
    """)


# ---------------------------------------------------------------- the supervisor, for real


def test_a_holder_whose_name_holds_an_escape_is_named_escaped_in_the_log_and_in_status(sup: Runner) -> None:
    """Any bytes may name a process (prctl PR_SET_NAME): a holder named with ESC sequences (a clear screen, a colour)
    reached the terminal raw through the verdict's detail in the log and in status's "cause:" line."""
    port = free_port()
    holder = subprocess.Popen([PY, "-c", "import ctypes, socket, sys, time\n"
                               "ctypes.CDLL(None).prctl(15, b'\\x1b[2J\\x1b[31mEVIL', 0, 0, 0)\n"
                               "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
                               "print('listening', flush=True); time.sleep(600)\n", str(port)],
                              stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"listening\n"
        res = sup.run(daemon_config(sup, port, sh("exec sleep 30")), timeout=30)
        assert res.returncode == EXIT_FAILURE, res.output
        assert f"is already taken by pid {holder.pid} (\\x1b[2J\\x1b[31mEVIL)" in res.output, res.output
        assert "\x1b" not in res.output, res.output
        shown = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                               capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=30)
        assert "cause: port_in_use" in shown.stdout and "\\x1b[31mEVIL" in shown.stdout, shown.stdout
        assert "\x1b" not in shown.stdout, shown.stdout
    finally:
        holder.kill()
        holder.wait(10)


def test_a_port_held_before_the_start_fails_the_attempt_naming_its_holder(sup: Runner, stranger: Stranger) -> None:
    port = free_port()
    holder = stranger(port)
    started = sup.tmp / "daemon.started"
    config = daemon_config(sup, port, sh(f"touch {started}; exec sleep 30"))
    res = sup.run(config, timeout=30)
    assert res.returncode == EXIT_FAILURE, res.output
    v = failure(res.output)
    assert (v["phase"], v["child"], v["reason"]) == ("web", "server", "port_in_use"), res.output
    assert f"port 127.0.0.1:{port} is already taken by pid {holder.pid} ({name_of(holder.pid)})" in v["detail"]
    assert not started.exists(), "the daemon was started on a port another process holds"
    assert not (sup.tmp / "command.ran").exists()
    assert "is ready" not in res.output
    assert holder.poll() is None  # the stranger is not the supervisor's to stop


def bound_sockets_listed() -> bool:
    """Whether this kernel's /proc/net/tcp lists a socket bound without listening (Linux: state 07, CLOSE;
    gVisor lists none)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        inode = os.fstat(sock.fileno()).st_ino
        with open("/proc/net/tcp") as f:
            return any(line.split()[9] == str(inode) for line in f.read().splitlines()[1:])


def test_a_port_bound_without_listening_is_said_as_that(sup: Runner) -> None:
    """A socket bound to the port but not listening holds it as a listener does: it was blamed on "another
    user's or network namespace's process", though its holder was a process of ours in sight. It is named, said
    bound without listening, where the kernel lists it; where it does not, that is what is said."""
    port = free_port()
    holder = subprocess.Popen([PY, "-c", "import socket, sys, time\ns = socket.socket()\n"
                               "s.bind(('127.0.0.1', int(sys.argv[1])))\nprint('bound', flush=True)\n"
                               "time.sleep(600)", str(port)], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"bound\n"
        res = sup.run(daemon_config(sup, port, sh("exec sleep 30")), timeout=30)
    finally:
        kill_tree(holder.pid)
        holder.wait(10)
    assert res.returncode == EXIT_FAILURE, res.output
    v = failure(res.output)
    assert (v["child"], v["reason"]) == ("server", "port_in_use"), res.output
    assert "another user's or network namespace's process" not in v["detail"], v
    if bound_sockets_listed():
        said = (f"port 127.0.0.1:{port} is already taken by pid {holder.pid} ({name_of(holder.pid)}), "
                "its socket bound there without listening")
    else:
        said = (f"port 127.0.0.1:{port} is already taken (its holder is unknown: nothing listens there; a socket "
                "bound to it without listening, which /proc/net/tcp does not list here, or one closed since)")
    assert said in v["detail"], v


@pytest.mark.parametrize("wrapper", ["exec", "fork"])
def test_a_port_held_by_a_child_of_the_supervisor_names_that_child(sup: Runner, wrapper: str) -> None:
    """A service phase's command listens on the port a later phase's daemon waits for (a clash of the config's
    own, which check cannot see where the service declares no ready port): the holder was named as a stranger's
    pid. It is named by its label, the supervisor's own child, whether its leader or a process of its tree."""
    port = free_port()
    py_script(sup.tmp, "listener", LISTENER.replace("s.listen()\n", "s.listen()\n    open(sys.argv[2], 'w')\n"))
    listener = f"{PY} {sup.tmp / 'listener.py'} {port} {sup.tmp / 'svc.up'}"
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {sh({"exec": f"exec {listener}", "fork": f"{listener} & wait"}[wrapper])}
        ready = {toml_str(str(sup.tmp / "svc.up"))}
        stop_grace_s = 1

        [[phases]]
        name = "web"
        command = {sh("true")}
        [[phases.daemons]]
        name = "server"
        command = ["sleep", "30"]
        ready = "tcp://127.0.0.1:{port}"
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=40)
    assert res.returncode == EXIT_FAILURE, res.output
    v = verdict_fields(verdict_lines(res.output, "web", "server", "FAILED")[0])
    assert v["reason"] == "port_in_use", res.output
    svc = int(first_line(res.output, "started svc/svc: pid ").split("pid ", 1)[1].split(":", 1)[0])
    if wrapper == "exec":
        said = f"port 127.0.0.1:{port} is already taken by svc/svc, this supervisor's own child (pid {svc} ("
    else:
        said = f") of svc/svc's process tree, this supervisor's own child (pid {svc})"
    assert said in v["detail"], v


# The supervisor, with the holder scan failing as it fails on a machine out of file descriptors (listing /proc
# raises EMFILE); nothing else is changed.
OUT_OF_FDS_LAUNCHER = """\
import errno, sys
from supervisor.engine import ports
def holders(*args, **kwargs):
    raise OSError(errno.EMFILE, "Too many open files", "/proc")
ports.holders = holders
from supervisor.app.cli import main
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_a_holder_scan_that_fails_still_fails_the_attempt_port_in_use(sup: Runner, stranger: Stranger) -> None:
    """The look for the holder is an answer the attempt waits on: where the scan raises, the attempt still fails
    port_in_use, its holder unknown and the scan's failure said (it once sat in "starting" for good)."""
    port = free_port()
    stranger(port)
    started = sup.tmp / "daemon.started"
    config = daemon_config(sup, port, sh(f"touch {started}; exec sleep 30"))
    launcher = sup.tmp / "launch_out_of_fds.py"
    launcher.write_text(OUT_OF_FDS_LAUNCHER)
    proc = subprocess.Popen([PY, str(launcher), str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", cwd=REPO, start_new_session=True,
                            env=clean_env({"PYTHONPATH": str(REPO)}))  # this tree's supervisor, not an installed one
    sup.procs.append(proc)
    res = finish(proc, time.monotonic(), timeout=60)
    assert res.returncode == EXIT_FAILURE, res.output
    v = failure(res.output)
    assert (v["phase"], v["child"], v["reason"]) == ("web", "server", "port_in_use"), res.output
    assert (f"port 127.0.0.1:{port} is already taken (its holder is unknown: the look for it failed: "
            "OSError: [Errno 24] Too many open files") in v["detail"], v["detail"]
    assert "thread died" not in res.output, res.output
    assert not started.exists()


def test_a_holder_look_that_never_answers_answers_unknown_at_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan stuck in the kernel (a process whose fd table cannot be read) is not waited on past its bound."""
    release = threading.Event()
    monkeypatch.setattr(ports, "holder", lambda host, port: release.wait(60))
    monkeypatch.setattr(ports, "HOLDER_LOOK_BOUND_S", 0.2)
    loop, heard = EventLoop(), []
    try:
        ports.find_holder(loop, "127.0.0.1", 9, lambda found, unknown: heard.append((found, unknown)))
        loop.run_until(lambda: bool(heard), 0.1)
    finally:
        release.set()
    assert heard == [(None, "the look for it did not answer within 0.2s")]


def test_a_port_freed_before_the_next_attempt_lets_the_daemon_start(sup: Runner, stranger: Stranger) -> None:
    """port_in_use is one attempt's verdict: the phase's retries apply, and a port freed meanwhile is used."""
    port = free_port()
    holder = stranger(port)
    config = daemon_config(sup, port, py_script(sup.tmp, "listener", LISTENER, port),
                           extra="retries = 6\nbackoff_s = 0.3")
    console = Console(sup, config)
    console.wait_text("reason=port_in_use")
    kill_tree(holder.pid)
    holder.wait(10)
    assert console.finish(timeout=60) == 0, console.text()
    out = console.text()
    assert "web/server is ready" in out
    assert verdict_lines(out, "web", "server", "FAILED")[0].count("reason=port_in_use") == 1
    assert (sup.tmp / "command.ran").exists()


def test_a_stranger_that_binds_after_the_check_never_makes_the_daemon_ready(sup: Runner, stranger: Stranger) -> None:
    """The race: the port was free when checked; another process binds it before the daemon does. Its answer is
    said once and does not count; the wait times out naming the holder."""
    port = free_port()
    pidfile = sup.tmp / "daemon.pid"
    # The daemon waits for the stranger to win the race, then fails to bind (as cuzk-daemon does) and lingers.
    daemon = py_script(sup.tmp, "loser", """
        import os, socket, sys, time
        write_pid(sys.argv[2])
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.05)
        try:
            socket.socket().bind(("127.0.0.1", int(sys.argv[1])))
        except OSError as exc:
            print("daemon: failed to bind:", exc, flush=True)
        time.sleep(600)
    """, port, pidfile, sup.tmp / "stranger.up")
    config = daemon_config(sup, port, daemon, ready_timeout_s=3)
    console = Console(sup, config)
    console.wait_text("waiting for web/server to be ready")
    holder = stranger(port)
    (sup.tmp / "stranger.up").touch()
    assert console.finish(timeout=40) == EXIT_TIMEOUT, console.text()
    out = console.text()
    said = (f"port {port} answers, but pid {holder.pid} ({name_of(holder.pid)}) holds it, "
            "outside the process tree of this daemon")
    assert sum(said in line for line in out.splitlines() if "web/server: " in line) == 1, out
    not_ready = verdict_fields(verdict_lines(out, "web", "server", "FAILED")[0])  # the wait's, before the stop's
    assert not_ready["reason"] == "timeout" and "pid" not in not_ready, out
    assert said in not_ready["detail"], not_ready
    assert "is ready" not in out
    assert not (sup.tmp / "command.ran").exists()


SETPRIV = shutil.which("setpriv")
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]
# A listener that makes itself non-dumpable first (PR_SET_DUMPABLE 0, as a setuid program or a hardened daemon
# is): its /proc/<pid>/fd then belongs to root, unreadable to a supervisor that is not root, or is root without
# CAP_SYS_PTRACE (Docker's default set) where the daemon runs as another user.
HIDDEN_LISTENER = "import ctypes\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n" + textwrap.dedent(LISTENER)


def hidden_fd_tables() -> bool:
    """Whether the fd table of a non-dumpable process is refused to another process of its user (uid 65534):
    the test below is about the kernels that refuse it."""
    assert SETPRIV is not None
    code = "import ctypes, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nprint('hidden', flush=True)\ntime.sleep(30)"
    hidden = subprocess.Popen([SETPRIV, *NOBODY, PY, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert hidden.stdout is not None and hidden.stdout.readline() == "hidden\n", "setpriv could not start it"
        look = (f"import os\ntry:\n    os.listdir('/proc/{hidden.pid}/fd')\n"
                "except PermissionError:\n    print('refused')")
        probe = subprocess.run([SETPRIV, *NOBODY, PY, "-c", look], capture_output=True, text=True, timeout=30)
        assert probe.returncode == 0, probe.stderr
        return probe.stdout.strip() == "refused"
    finally:
        hidden.kill()
        hidden.wait()


@pytest.mark.skipif(SETPRIV is None, reason="no setpriv (util-linux) to run the supervisor as another user")
@pytest.mark.skipif(os.geteuid() != 0, reason="not root: cannot run the supervisor as another user (setpriv --reuid)")
def test_a_daemon_whose_fd_table_cannot_be_read_is_ready_by_its_answer(sup: Runner) -> None:
    """A supervisor that cannot read the daemon's fd table (Docker without CAP_SYS_PTRACE and a daemon run as
    another user by gosu or setpriv, or a non-dumpable daemon) cannot see who holds the port: the daemon's own
    answer was refused as "a process not visible here" and the phase failed timeout (124). Only a visible
    stranger is refused; an unseen holder of a port that was free before the start counts, said once."""
    if not hidden_fd_tables():
        pytest.skip("this kernel lets a process read the fd table of a non-dumpable one of its user")
    # The daemon's interpreter must be one uid 65534 may run (this one may live under root's 0700 home).
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if python is None:
        pytest.skip("no python3 in /usr/local/bin, /usr/bin or /bin for uid 65534 to run")
    port = free_port()
    with tempfile.TemporaryDirectory(dir="/tmp") as reachable:  # (pytest's tmp is root's alone: 0700)
        where = Path(reachable)
        where.chmod(0o777)  # (the supervisor, as uid 65534, writes its state and logs there)
        (where / "listener.py").write_text(HIDDEN_LISTENER)
        config = where / "config.toml"
        config.write_text(textwrap.dedent(f"""\
            [supervisor]
            state_dir = {toml_str(str(where / "state"))}
            log_dir = {toml_str(str(where / "logs"))}
            stop_grace_s = 2
            cgroups = "off"
            [[phases]]
            name = "web"
            command = {sh(f"touch {where / 'command.ran'}")}
            [[phases.daemons]]
            name = "server"
            command = {toml_list([python, str(where / "listener.py"), str(port)])}
            ready = "tcp://127.0.0.1:{port}"
            ready_timeout_s = 20
            stop_grace_s = 1
        """))
        proc = subprocess.Popen([SETPRIV, *NOBODY, PY, "-m", "supervisor", "run", "--config", str(config)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                cwd=REPO, start_new_session=True, env=clean_env())
        sup.procs.append(proc)
        res = finish(proc, time.monotonic(), timeout=60)
        ran = (where / "command.ran").exists()
    out = res.output
    assert res.returncode == 0, out
    assert "web/server is ready" in out and ran, out
    assert "outside the process tree" not in out, out
    said = [line for line in out.splitlines() if "web/server: " in line and f"port {port} answers" in line]
    assert len(said) == 1, out
    assert ("its holder cannot be seen here (the fd table of 1 process of this daemon's tree cannot be read: "
            "another user's or a non-dumpable process): taken as this daemon's") in said[0], said


# socket() made to fail in the supervisor as a machine makes it fail: EMFILE once a trigger file exists (out of
# file descriptors, from then on), EAFNOSUPPORT for IPv6 where asked (a kernel booted with ipv6.disable=1).
SOCKET_SHIM = """
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
int socket(int domain, int type, int protocol) {
    static int (*real)(int, int, int);
    const char *trigger = getenv("SHIM_TRIGGER");
    if (!real) real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    if (getenv("SHIM_NO_INET6") && domain == AF_INET6) { errno = EAFNOSUPPORT; return -1; }
    if (trigger && domain != AF_UNIX && access(trigger, F_OK) == 0) { errno = EMFILE; return -1; }
    return real(domain, type, protocol);
}
"""


@pytest.fixture
def socket_shim(tmp_path: Path) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the LD_PRELOAD shim that fails socket()")
    (tmp_path / "shim.c").write_text(SOCKET_SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "shim.so"), str(tmp_path / "shim.c"), "-ldl"],
                   check=True, timeout=60)
    return tmp_path / "shim.so"


def test_a_port_check_out_of_fds_fails_that_daemon_spawn_failed(sup: Runner, socket_shim: Path) -> None:
    """The free check's socket() failing EMFILE escaped as an exception: the phase failed internal_error (70)
    with a traceback, blamed on the readiness wait of the daemon before. Now the daemon whose port could not
    be checked is not started, and fails as a start out of descriptors does: spawn_failed, 126, one line."""
    port, gate, nofds = free_port(), sup.tmp / "gate", sup.tmp / "nofds"
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh("echo cmd ran")}
        [[phases.daemons]]
        name = "a"
        command = ["sleep", "60"]
        ready = {toml_str(str(gate))}
        stop_grace_s = 1
        [[phases.daemons]]
        name = "b"
        command = {toml_list([PY, "-m", "http.server", "--bind", "127.0.0.1", str(port)])}
        ready = "tcp://127.0.0.1:{port}"
        stop_grace_s = 1
    """)
    console = Console(sup, config, env={"LD_PRELOAD": str(socket_shim), "SHIM_TRIGGER": str(nofds)})
    console.wait_text("waiting for p/a to be ready")
    nofds.touch()
    gate.touch()
    assert console.finish(timeout=40) == 126, console.text()
    out = console.text()
    b = verdict_fields(verdict_lines(out, "p", "b", "FAILED")[0])
    assert b["reason"] == "spawn_failed", out
    assert b["detail"] == f"p/b not started: cannot check port 127.0.0.1:{port}: out of file descriptors", b
    assert "started p/b" not in out and "internal error" not in out and "Traceback" not in out, out


def test_a_port_of_an_address_family_the_kernel_lacks_is_not_checked(sup: Runner, socket_shim: Path) -> None:
    """No IPv6 in the kernel: the check's socket() fails EAFNOSUPPORT, which failed the phase internal_error
    (70). Nothing here can hold such a port: the daemon is started, and its readiness says what it can."""
    port = free_port()
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh("echo cmd ran")}
        [[phases.daemons]]
        name = "b"
        command = ["sleep", "60"]
        ready = "tcp://[::1]:{port}"
        ready_timeout_s = 2
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=40, env={"LD_PRELOAD": str(socket_shim), "SHIM_NO_INET6": "1"})
    assert res.returncode == EXIT_TIMEOUT, res.output
    assert "started p/b" in res.output, res.output
    b = verdict_fields(verdict_lines(res.output, "p", "b", "FAILED")[0])
    assert b["reason"] == "timeout" and "Address family not supported" in b["detail"], b
    assert "internal error" not in res.output and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("wrapper", ["exec", "fork", "setsid"])
def test_the_daemons_own_child_listening_makes_it_ready(sup: Runner, wrapper: str) -> None:
    """A wrapper shell that execs or forks the listener (or starts it in a session of its own): still its tree."""
    port = free_port()
    py_script(sup.tmp, "listener", LISTENER)
    listener = f"{PY} {sup.tmp / 'listener.py'} {port}"
    script = {"exec": f"exec {listener}", "fork": f"{listener} & wait",
              "setsid": f"setsid {listener} & sleep 600"}[wrapper]
    res = sup.run(daemon_config(sup, port, sh(script)), timeout=40)
    assert res.returncode == 0, res.output
    assert "web/server is ready" in res.output
    assert "outside the process tree" not in res.output
    assert (sup.tmp / "command.ran").exists()


def test_file_readiness_is_untouched(sup: Runner, stranger: Stranger) -> None:
    """Ready by a file: no port to check, no listener to own (a stranger holding some TCP port changes nothing;
    the unix-socket kind, only made by a plugin's kind, is tests/prover/test_cuzk_ports.py's)."""
    stranger(free_port())
    flag = sup.tmp / "d.ready"
    config = sup.write(f"""
        [[phases]]
        name = "local"
        command = {sh("echo saw it ready")}
        [[phases.daemons]]
        name = "file"
        command = {sh(f"touch {flag}; exec sleep 600")}
        ready = {toml_str(str(flag))}
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=40)
    assert res.returncode == 0, res.output
    assert "local/file is ready" in res.output and "saw it ready" in res.output


# ---------------------------------------------------------------- the pieces, in-process


def test_ready_checks_declare_their_local_ports() -> None:
    tcp = ReadyCheck("tcp", "127.0.0.1:9820", "127.0.0.1", 9820)
    http = ReadyCheck("http", "http://localhost:9821/status", "localhost", 9821)
    remote = ReadyCheck("tcp", "10.1.2.3:80", "10.1.2.3", 80)
    both = ReadyCheck("any", "x", alternatives=(http, ReadyCheck("unix", "/run/x.sock"), tcp, remote))
    assert both.ports() == [("localhost", 9821), ("127.0.0.1", 9820), ("10.1.2.3", 80)]
    assert ports.local_ports(both) == [("localhost", 9821), ("127.0.0.1", 9820)]
    assert ports.local_ports(ReadyCheck("file", "/run/x")) == []
    assert [ports.is_local(h) for h in ("127.0.0.5", "::1", "0.0.0.0", "localhost", "10.0.0.1", "example")] == \
        [True, True, True, True, False, False]


def test_taken_and_holder_find_a_listener_of_this_process() -> None:
    port = free_port()
    check = ReadyCheck("tcp", f"127.0.0.1:{port}", "127.0.0.1", port)
    assert ports.taken(check) is None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert ports.taken(check) == ("127.0.0.1", port)
        assert ports.taken(ReadyCheck("tcp", f"0.0.0.0:{port}", "0.0.0.0", port)) == ("0.0.0.0", port)
        assert ports.holder("127.0.0.1", port) == ports.Holder(os.getpid(), name_of(os.getpid()))
        said: list[str] = []
        assert ports.Ownership(os.getpid(), "no-tag", said.append)("127.0.0.1", port) is None
        child = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
        try:
            not_its = ports.Ownership(child.pid, "no-tag", said.append)
            why = (f"port {port} answers, but pid {os.getpid()} ({name_of(os.getpid())}) holds it, "
                   "outside the process tree of this daemon")
            assert not_its("127.0.0.1", port) == why
            assert not_its("127.0.0.1", port) == why
            assert said == [why]  # said once
        finally:
            child.kill()
            child.wait()
    assert ports.taken(check) is None


def test_holder_names_a_socket_bound_without_listening(tmp_path: Path) -> None:
    """Where /proc/net/tcp lists a bound socket (Linux, state 07) and no listener on the port, its holder is
    named as that; a listener on the port comes first; a port the tables show nothing on has no holder."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = "   {n}: 0100007F:{port:04X} 00000000:0000 {st} 00000000:00000000 00:00000000 00000000  0  0 {inode} 1 0\n"
    (proc / "net" / "tcp").write_text(head + row.format(n=0, port=18714, st="07", inode=5001)
                                      + row.format(n=1, port=18715, st="07", inode=5002)
                                      + row.format(n=2, port=18715, st="0A", inode=5003)
                                      + row.format(n=3, port=18716, st="06", inode=0))  # TIME_WAIT: nobody's
    for pid, inode, name in ((41, 5001, "binder"), (42, 5002, "binder2"), (43, 5003, "listener")):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fd" / "3").symlink_to(f"socket:[{inode}]")
        (proc / str(pid) / "comm").write_text(name + "\n")
    assert ports.holder("127.0.0.1", 18714, str(proc)) == ports.Holder(41, "binder", listening=False)
    assert ports.holder("127.0.0.1", 18715, str(proc)) == ports.Holder(43, "listener")
    assert ports.holder("127.0.0.1", 18716, str(proc)) is None
    assert ports.taken_detail("127.0.0.1", 18714, ports.Holder(41, "binder", listening=False)) == \
        "port 127.0.0.1:18714 is already taken by pid 41 (binder), its socket bound there without listening"
    assert ports.listed("127.0.0.1", 18714, str(proc)) and ports.listed("127.0.0.1", 18715, str(proc))
    assert not ports.listed("127.0.0.1", 18716, str(proc))


# ------------------------------------------------------------ choosing ports for daemons to listen on


def _ephemeral_start() -> int:
    with open(ports.EPHEMERAL_RANGE) as f:
        return int(f.read().split()[0])


def test_chosen_ports_lie_below_the_ephemeral_range() -> None:
    # A port from inside the range (bind to port 0) was taken by a parallel test's outgoing connection
    # between the demo choosing it and its cuzk daemon binding it: the bench failed port_in_use.
    low = _ephemeral_start()
    if low - ports.CHOSEN_PORT_FLOOR < 20:
        pytest.skip(f"this machine's ephemeral range starts at {low}: no room below it to choose from")
    chosen = ports.free_ports(8)
    assert len(set(chosen)) == 8
    assert all(ports.CHOSEN_PORT_FLOOR <= port < low for port in chosen), chosen


def test_a_port_in_use_or_already_chosen_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    low = _ephemeral_start()
    if low - ports.CHOSEN_PORT_FLOOR < 20:
        pytest.skip(f"this machine's ephemeral range starts at {low}: no room below it to choose from")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        free = ports.free_ports(1)[0]
        picks = iter([taken, free, free, taken, low - 1])
        monkeypatch.setattr(ports.random, "randrange", lambda start, stop: next(picks))
        assert ports.free_ports(2) == [free, low - 1]


def test_no_room_below_the_range_falls_back_to_the_kernel(tmp_path: Path) -> None:
    cramped = tmp_path / "ip_local_port_range"
    cramped.write_text(f"{ports.CHOSEN_PORT_FLOOR + 1}\t60999\n")
    unreadable = tmp_path / "absent"
    for path in (cramped, unreadable):
        chosen = ports.free_ports(3, range_path=str(path))
        assert len(set(chosen)) == 3
        assert all(port >= _ephemeral_start() for port in chosen), chosen  # the kernel's own choice


# ------------------------------------------------------------ ports that meet in the plan: refused by check


def plan_refusal(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_plan(text, "t.toml", {})
    return str(caught.value)


SERVICE = """
[[phases]]
name = "first"
command = ["true"]

[[phases]]
name = "web"
kind = "service"
command = ["sleep", "60"]
ready = "{web}"
"""
JOB = """
[[phases]]
name = "job"
command = ["true"]
"""
DAEMON = """
  [[phases.daemons]]
  name = "{name}"
  command = ["sleep", "60"]
  ready = "{ready}"
  lifetime = "{lifetime}"
"""


@pytest.mark.parametrize(("text", "said"), [
    ("[supervisor]\nhttp_port = 18765\n" + SERVICE.format(web="tcp://127.0.0.1:18765"),
     "t.toml: phases[1] (web).ready: port 18765 is also supervisor.http_port (the supervisor's own health port):"),
    (SERVICE.format(web="tcp://127.0.0.1:9000") + DAEMON.format(name="d", ready="http://127.0.0.1:9000/",
                                                                 lifetime="phase"),
     "t.toml: phases[1] (web).daemons[0] (d).ready: port 9000 is also the ready port of phases[1] (web):"),
    (SERVICE.format(web="tcp://localhost:9000") + DAEMON.format(name="d", ready="tcp://0.0.0.0:9000",
                                                                 lifetime="phase"),
     "t.toml: phases[1] (web).daemons[0] (d).ready: port 9000 is also the ready port of phases[1] (web):"),
    # A lifecycle daemon handed on by the first phase still listens while the service starts.
    (SERVICE.replace('command = ["true"]\n', 'command = ["true"]\n' + DAEMON.format(
        name="keep", ready="tcp://127.0.0.1:9100", lifetime="lifecycle"), 1).format(web="tcp://127.0.0.1:9100"),
     "t.toml: phases[1] (web).ready: port 9100 is also the ready port of phases[0] (first).daemons[0] (keep):"),
    # A later daemon of the same name is started beside the kept one, never handed it: check let it through, and
    # the run failed port_in_use once the first phase had run.
    (SERVICE.replace('command = ["true"]\n', 'command = ["true"]\n' + DAEMON.format(
        name="d", ready="tcp://127.0.0.1:9400", lifetime="lifecycle"), 1).format(web="tcp://127.0.0.1:9401")
     + DAEMON.format(name="d", ready="tcp://127.0.0.1:9400", lifetime="phase"),
     "t.toml: phases[1] (web).daemons[0] (d).ready: port 9400 is also the ready port of phases[0] (first).daemons[0] "
     "(d):"),
    # A service runs on beside every phase after it (the lifecycle goes past it once it is up): check let a later
    # daemon on its port through, and the run failed port_in_use once the service was up.
    (SERVICE.format(web="tcp://127.0.0.1:9500") + JOB
     + DAEMON.format(name="d", ready="http://127.0.0.1:9500/", lifetime="phase"),
     "t.toml: phases[2] (job).daemons[0] (d).ready: port 9500 is also the ready port of phases[1] (web):"),
    # ... its daemons with it (each of its attempts starts them again), past the phase right after it too.
    (SERVICE.format(web="tcp://127.0.0.1:9600") + DAEMON.format(name="helper", ready="tcp://127.0.0.1:9601",
                                                                 lifetime="phase")
     + JOB + '\n[[phases]]\nname = "api"\nkind = "service"\ncommand = ["sleep", "60"]\nready = "tcp://0.0.0.0:9601"\n',
     "t.toml: phases[3] (api).ready: port 9601 is also the ready port of phases[1] (web).daemons[0] (helper):"),
], ids=["http-port", "daemon-and-service", "loopback-and-every-address", "lifecycle-daemon-handed-on",
        "same-name-is-another-daemon", "service-beside-the-phases-after-it",
        "service-daemon-beside-the-phases-after-it"])
def test_two_listeners_of_one_port_at_once_are_refused_by_check(text: str, said: str) -> None:
    refusal = plan_refusal(text)
    assert refusal.startswith(said), refusal
    assert refusal.endswith("two children that run at once cannot both listen there"), refusal


def test_phases_after_one_another_may_use_one_port() -> None:
    # The prover's warm-up and bench each start their own cuzk daemon on the same port, one after the other;
    # another address of the machine, or another machine, is no clash.
    sequential = ('[[phases]]\nname = "a"\ncommand = ["true"]\n' + DAEMON.format(
        name="d", ready="tcp://127.0.0.1:9200", lifetime="phase") + SERVICE.format(web="tcp://127.0.0.1:9200"))
    other_hosts = SERVICE.format(web="tcp://127.0.0.1:9300") + DAEMON.format(
        name="d", ready="tcp://127.0.0.2:9300", lifetime="phase") + DAEMON.format(
        name="e", ready="tcp://gpu-box.internal:9300", lifetime="phase")
    for text in (sequential, other_hosts):
        assert parse_plan(text, "t.toml", {}).phases
