"""The lifecycle end to end: real supervisor, real children (small sh / python programs)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from helpers import (
    PY,
    Runner,
    failure,
    free_port,
    pid_alive,
    py_script,
    read_pid,
    sh,
    toml_list,
    toml_str,
    verdicts,
    wait_for,
)

from supervisor.exits import EXIT_TIMEOUT

# ---------------------------------------------------------------- helpers

def proc_state(pid: int) -> str:
    """'gone', or the state letter from /proc (Z for a zombie nobody reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


# A phase command that exits 0 only if the pid in argv[1] no longer exists (not even as a zombie).
CHECK_GONE = """
import sys
pid = int(open(sys.argv[1]).read())
try:
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
print(f"pid {pid}: {state}")
sys.exit(0 if state == "gone" else 1)
"""

CHECK_ALIVE = """
import sys
pid = int(open(sys.argv[1]).read())
try:
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
print(f"pid {pid}: {state}")
sys.exit(1 if state in ("gone", "Z") else 0)
"""

# A daemon that writes its pid to argv[1] and waits to be stopped.
SLEEPER = """
import sys, time
write_pid(sys.argv[1])
time.sleep(60)
"""


# ---------------------------------------------------------------- order and oneshots


def test_phases_run_in_order(sup: Runner) -> None:
    order = sup.tmp / "order"
    config = sup.write(f"""
        [[phases]]
        name = "first"
        command = {sh(f"echo first-start >> {order}; sleep 0.2; echo first-end >> {order}")}

        [[phases]]
        name = "second"
        command = {sh(f"grep -q first-end {order} || exit 1; echo second >> {order}")}

        [[phases]]
        name = "third"
        command = {sh(f"grep -q second {order} || exit 1; echo third >> {order}")}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert order.read_text().split() == ["first-start", "first-end", "second", "third"]
    assert "lifecycle complete" in res.output
    ended = verdicts(res.output, "ended")
    assert [v["phase"] for v in ended] == ["first", "second", "third"]
    assert all(v["reason"] == "exit_code" and v["exit_code"] == "0" for v in ended)


def test_oneshot_retries_with_backoff_then_succeeds(sup: Runner) -> None:
    count, times = sup.tmp / "count", sup.tmp / "times"
    cmd = sh(f'n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; '
             f'date +%s.%N >> {times}; echo "attempt $n"; [ "$n" -ge 3 ]')
    config = sup.write(f"""
        [[phases]]
        name = "flaky"
        command = {cmd}
        retries = 2
        backoff_s = 0.1
        backoff_factor = 2
        backoff_jitter = 0
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert count.read_text().strip() == "3"
    starts = [float(t) for t in times.read_text().split()]
    assert len(starts) == 3
    # the backoff is waited out: 0.1 s, then 0.2 s (a lower bound by design)
    assert starts[1] - starts[0] >= 0.1
    assert starts[2] - starts[1] >= 0.2
    assert "backoff 0.10s" in res.output and "backoff 0.20s" in res.output
    assert "completed in 3 attempt(s)" in res.output
    assert [v["attempt"] for v in verdicts(res.output)] == ["1", "2"]


def test_oneshot_retries_exhausted_fails_with_last_status(sup: Runner) -> None:
    runs, after = sup.tmp / "runs", sup.tmp / "after"
    config = sup.write(f"""
        [[phases]]
        name = "broken"
        command = {sh(f'echo run >> {runs}; n=$(wc -l < {runs}); echo "failing run $n"; exit $((6 + n))')}
        retries = 2
        backoff_s = 0.05

        [[phases]]
        name = "after"
        command = {sh(f"touch {after}")}
    """)
    res = sup.run(config, timeout=30)
    assert len(runs.read_text().split()) == 3
    # the last attempt's status: 6 + 3
    assert res.returncode == 9, res.output
    last = failure(res.output)
    assert last["phase"] == "broken" and last["reason"] == "exit_code"
    assert last["exit_code"] == "9" and last["attempt"] == "3"
    assert "failing run 3" in res.output
    assert "all 2 retries used" in res.output
    assert not after.exists(), "a phase after a failed one ran"


@pytest.mark.parametrize("ignores_term", [False, True], ids=["dies-on-term", "ignores-term"])
def test_oneshot_timeout(sup: Runner, ignores_term: bool) -> None:
    pidfile = sup.tmp / "pid"
    cmd = py_script(sup.tmp, "slow", f"""
        import signal, sys, time
        if {ignores_term}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_pid(sys.argv[1])
        print("sleeping", flush=True)
        time.sleep(30)
    """, pidfile)
    timeout_s, grace = 0.5, 0.5
    config = sup.write(f"""
        [[phases]]
        name = "slow"
        command = {cmd}
        timeout_s = {timeout_s}
        stop_grace_s = {grace}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == EXIT_TIMEOUT, res.output  # as timeout(1), whether it died on SIGTERM or was killed
    v = failure(res.output)
    assert v["phase"] == "slow" and v["reason"] == "timeout", res.output
    pid = int(pidfile.read_text())
    assert not pid_alive(pid)
    assert res.duration < timeout_s + grace + 5, res.output
    if ignores_term:
        assert res.duration >= timeout_s + grace  # it had to wait out the grace
        assert "SIGKILL" in res.output


# ---------------------------------------------------------------- readiness


def test_daemon_tcp_readiness(sup: Runner) -> None:
    port = free_port()
    listening = sup.tmp / "listening"
    daemon = py_script(sup.tmp, "server", """
        import socket, sys, time
        port = int(sys.argv[1])
        time.sleep(0.5)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        write_pid(sys.argv[2], int(time.time() * 1000))
        while True:
            c, _ = s.accept()
            c.close()
    """, port, listening)
    cmd = py_script(sup.tmp, "client", """
        import socket, sys
        try:
            socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
        except OSError as exc:
            print("connection failed:", exc)
            sys.exit(1)
        print("connected to the daemon")
    """, port)
    config = sup.write(f"""
        [[phases]]
        name = "tcp"
        command = {cmd}
        [[phases.daemons]]
        name = "server"
        command = {daemon}
        ready = "tcp://127.0.0.1:{port}"
        ready_timeout_s = 20
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=40)
    assert res.returncode == 0, res.output
    assert "connected to the daemon" in res.output
    assert listening.exists()
    assert re.search(r"tcp/server is ready", res.output)


@pytest.mark.parametrize(("delay", "not_yet"), [(0.5, 0), (0.0, 3)], ids=["late-listener", "503-then-200"])
def test_daemon_http_readiness(sup: Runner, delay: float, not_yet: int) -> None:
    port = free_port()
    served_503 = sup.tmp / "served_503"
    daemon = py_script(sup.tmp, "web", """
        import http.server, sys, time
        port, delay, not_yet, served_file = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        time.sleep(delay)
        served = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/status":
                    code = 404
                elif served[0] < not_yet:
                    served[0] += 1
                    write_pid(served_file, served[0])
                    code = 503
                else:
                    code = 200
                body = b"ok\\n" if code == 200 else b"not yet\\n"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """, port, delay, not_yet, served_503)
    cmd = py_script(sup.tmp, "client", """
        import http.client, sys
        try:  # http.client: no proxy settings from the environment get in the way
            conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=2)
            conn.request("GET", "/status")
            status = conn.getresponse().status
        except Exception as exc:
            print("request failed:", exc)
            sys.exit(1)
        print("daemon answered", status)
        sys.exit(0 if status == 200 else 1)
    """, port)
    config = sup.write(f"""
        [[phases]]
        name = "http"
        command = {cmd}
        [[phases.daemons]]
        name = "web"
        command = {daemon}
        ready = "http://127.0.0.1:{port}/status"
        ready_timeout_s = 20
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=40)
    assert res.returncode == 0, res.output
    assert "daemon answered 200" in res.output
    if not_yet:
        assert served_503.read_text() == str(not_yet)  # every 503 was seen and waited past


def test_daemon_file_readiness(sup: Runner) -> None:
    ready = sup.tmp / "daemon.ready"
    config = sup.write(f"""
        [[phases]]
        name = "filewait"
        command = {sh(f"test -f {ready} && echo saw the ready file")}
        [[phases.daemons]]
        name = "maker"
        command = {sh(f"sleep 0.5; touch {ready}; exec sleep 30")}
        ready = {toml_str(str(ready))}
        ready_timeout_s = 20
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert "saw the ready file" in res.output


def test_daemon_never_ready_times_out(sup: Runner) -> None:
    port = free_port()  # nobody will listen there
    pidfile, ran = sup.tmp / "daemon.pid", sup.tmp / "command.ran"
    config = sup.write(f"""
        [[phases]]
        name = "wait"
        command = {sh(f"touch {ran}")}
        [[phases.daemons]]
        name = "mute"
        command = {py_script(sup.tmp, "mute", SLEEPER, pidfile)}
        ready = "tcp://127.0.0.1:{port}"
        ready_timeout_s = 0.5
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == EXIT_TIMEOUT, res.output
    v = failure(res.output)
    assert v["phase"] == "wait" and v["reason"] == "timeout", res.output
    assert not ran.exists(), "the command started although its daemon never got ready"
    assert not pid_alive(int(pidfile.read_text()))
    assert res.duration < 10


@pytest.mark.parametrize("ready_timeout_s", [3, 1.5])
def test_a_readiness_probe_that_never_returns_still_times_out(sup: Runner, ready_timeout_s: float) -> None:
    """A probe may block for good: an HTTP answer that comes a byte every half second keeps http.client reading
    its status line for hours (each byte within the socket's timeout). The bound is the loop's: the phase fails
    at ready_timeout_s saying the probe has not returned, instead of sitting in "starting" until a signal (with
    a bound shorter than a probe's own timeout too: it gave the answer before the probe under way)."""
    port = free_port()
    ran = sup.tmp / "command.ran"
    dribbler = py_script(sup.tmp, "dribble", """
        import socket, sys, threading, time
        server = socket.create_server(("127.0.0.1", int(sys.argv[1])))

        def dribble(conn):
            try:
                while True:
                    conn.sendall(b"H")
                    time.sleep(0.5)
            except OSError:
                pass

        while True:
            conn, _ = server.accept()
            threading.Thread(target=dribble, args=(conn,), daemon=True).start()
        """, port)
    config = sup.write(f"""
        [[phases]]
        name = "wait"
        command = {sh(f"touch {ran}")}
        [[phases.daemons]]
        name = "dribbler"
        command = {dribbler}
        ready = "http://127.0.0.1:{port}/status"
        ready_timeout_s = {ready_timeout_s}
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=60)
    assert res.returncode == EXIT_TIMEOUT, res.output
    v = failure(res.output)
    assert v["phase"] == "wait" and v["reason"] == "timeout", res.output
    assert f"wait/dribbler not ready after {ready_timeout_s:g}s: http://127.0.0.1:" in res.output, res.output
    assert "a probe has not returned after " in res.output, res.output
    assert not ran.exists(), "the command started although its daemon never got ready"


def test_a_file_readiness_check_on_a_hung_mount_times_out(sup: Runner) -> None:
    """A ``file`` check under a FUSE or NFS mount that stopped answering blocks its stat in the kernel for good:
    the phase still fails at ready_timeout_s, and says so."""
    from hungmount import hung_mount

    with hung_mount(sup.tmp / "mnt") as mnt:
        config = sup.write(f"""
            [[phases]]
            name = "wait"
            command = ["true"]
            [[phases.daemons]]
            name = "d"
            command = ["sleep", "60"]
            ready = {toml_str(str(mnt / "ready"))}
            ready_timeout_s = 3
            stop_grace_s = 1
        """)
        res = sup.run(config, timeout=60)
    assert res.returncode == EXIT_TIMEOUT, res.output
    v = failure(res.output)
    assert v["phase"] == "wait" and v["reason"] == "timeout", res.output
    assert "a probe has not returned after " in res.output, res.output


def test_daemon_dies_mid_phase(sup: Runner) -> None:
    cmd_pid = sup.tmp / "cmd.pid"
    config = sup.write(f"""
        [[phases]]
        name = "work"
        command = {sh(f"echo $$$$ > {cmd_pid}.tmp; mv {cmd_pid}.tmp {cmd_pid}; exec sleep 30")}  # $$$$: sh's $$
        stop_grace_s = 1
        [[phases.daemons]]
        name = "fragile"
        command = {sh("sleep 0.5; echo giving up; exit 5")}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 5, res.output
    v = failure(res.output)
    assert v["phase"] == "work" and v["child"] == "fragile", res.output
    assert v["reason"] == "daemon_died" and v["exit_code"] == "5"
    assert res.duration < 10, "the phase waited for its command instead of failing at once"
    assert not pid_alive(int(cmd_pid.read_text()))
    assert "stopping work/work" in res.output


BENCH_WITHOUT_SUMMARY = """
import time
print("  [1/12] COMPLETED — 151.9s (prove=41234 ms, queue=10 ms)", flush=True)
time.sleep(30)  # its daemon dies before it gets to the summary
"""


def test_a_bench_stopped_because_its_daemon_died_is_stopped_not_bench_failed(sup: Runner) -> None:
    """The bench command never printed a summary because the supervisor stopped it: that is not its
    failure. The daemon's death (daemon_died) is the phase's verdict; the bench's own reads stopped."""
    config = sup.write(f"""
        [[phases]]
        name = "bench"
        command = {py_script(sup.tmp, "bench", BENCH_WITHOUT_SUMMARY)}
        parse = "cuzk-bench"
        stop_grace_s = 1
        [[phases.daemons]]
        name = "cuzk"
        command = {sh("sleep 0.5; echo daemon crashed; exit 5")}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 5, res.output
    v = failure(res.output)
    assert (v["child"], v["reason"]) == ("cuzk", "daemon_died"), res.output
    assert "bench_failed" not in res.output
    bench = [x for x in verdicts(res.output, "ended") if x["child"] == "bench"]
    assert len(bench) == 1 and bench[0]["reason"] == "stopped", res.output


def test_the_longest_deadline_config_allows_runs_and_25_days_is_refused(sup: Runner) -> None:
    """Issue 10, item 5: 2**31 ms and more made select() raise OverflowError at once. The config now
    bounds every seconds key (25 days is refused in one line); the loop clamps its sleep besides
    (tests/test_containment.py); the largest deadline the config allows runs."""
    from supervisor.config import MAX_SECONDS

    refused = sup.run(sup.write(f"""
        [[phases]]
        name = "long"
        command = {sh("echo quick")}
        timeout_s = 2200000
    """), timeout=30)
    assert refused.returncode == 2 and "Traceback" not in refused.output, refused.output
    assert "phases[0] (long).timeout_s: must be at most" in refused.output, refused.output
    marker = sup.tmp / "after.marker"
    config = sup.write(f"""
        [[phases]]
        name = "long"
        command = {sh("echo quick")}
        timeout_s = {MAX_SECONDS}
        backoff_max_s = {MAX_SECONDS}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert "Traceback" not in res.output and marker.exists()


def test_daemons_stopped_after_their_phase(sup: Runner) -> None:
    d1, d2 = sup.tmp / "d1.pid", sup.tmp / "d2.pid"
    config = sup.write(f"""
        [[phases]]
        name = "withd"
        command = {sh(f"for i in $(seq 200); do [ -s {d1} ] && [ -s {d2} ] && exit 0; sleep 0.05; done; exit 1")}
        [[phases.daemons]]
        name = "one"
        command = {py_script(sup.tmp, "d1", SLEEPER, d1)}
        stop_grace_s = 1
        [[phases.daemons]]
        name = "two"
        command = {py_script(sup.tmp, "d2", SLEEPER, d2)}
        stop_grace_s = 1

        [[phases]]
        name = "check1"
        command = {py_script(sup.tmp, "check1", CHECK_GONE, d1)}

        [[phases]]
        name = "check2"
        command = {py_script(sup.tmp, "check2", CHECK_GONE, d2)}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert res.output.count(": gone") == 2


def test_lifecycle_daemon_survives_into_next_phase(sup: Runner) -> None:
    keeper = sup.tmp / "keeper.pid"
    config = sup.write(f"""
        [[phases]]
        name = "boot"
        command = {sh(f"for i in $(seq 200); do [ -s {keeper} ] && exit 0; sleep 0.05; done; exit 1")}
        [[phases.daemons]]
        name = "keeper"
        command = {py_script(sup.tmp, "keeper", SLEEPER, keeper)}
        lifetime = "lifecycle"
        stop_grace_s = 1

        [[phases]]
        name = "use"
        command = {py_script(sup.tmp, "alive", CHECK_ALIVE, keeper)}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    pid = int(keeper.read_text())
    assert f"pid {pid}: gone" not in res.output
    assert not pid_alive(pid), "the lifecycle daemon outlived the supervisor"
    assert proc_state(pid) == "gone"
    # it was stopped only after the last phase was done
    assert res.output.index("phase use: stopping → done") < res.output.index("stopping boot/keeper")


# ---------------------------------------------------------------- services


def test_service_on_failure_restarts_with_growing_delays_then_gives_up(sup: Runner) -> None:
    runs = sup.tmp / "runs"
    burst = 3
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        restart = "on-failure"
        command = {sh(f"date +%s.%N >> {runs}; echo crashing; exit 1")}
        restart_burst = {burst}
        restart_window_s = 60
        backoff_s = 0.1
        backoff_factor = 2
        backoff_jitter = 0
        backoff_max_s = 10
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 1, res.output
    starts = [float(t) for t in runs.read_text().split()]
    assert len(starts) == burst + 1, res.output  # the first run, then `burst` restarts
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for gap, delay in zip(gaps, [0.1, 0.2, 0.4], strict=True):
        assert gap >= delay, gaps
    for delay in ("0.10", "0.20", "0.40"):
        assert f"backoff {delay}s" in res.output
    assert "restart_burst" in res.output
    v = failure(res.output)
    assert v["phase"] == "svc" and v["exit_code"] == "1"


def test_service_always_restarts_after_exit_0(sup: Runner) -> None:
    runs, pidfile = sup.tmp / "runs", sup.tmp / "pid"
    cmd = sh(f"echo x >> {runs}; [ $(wc -l < {runs}) -ge 3 ] || exit 0; "
             f"echo $$$$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 30")  # $$$$ in the config: sh's $$
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        restart = "always"
        command = {cmd}
        backoff_s = 0.05
        stop_grace_s = 1
    """)
    proc = sup.start(config)
    pid = read_pid(pidfile, timeout=20)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143, out
    assert len(runs.read_text().split()) == 3
    assert "restart = 'always'" in out
    assert not pid_alive(pid)


@pytest.mark.parametrize("policy", ["no", "on-failure"])
def test_service_clean_exit_not_restarted_completes(sup: Runner, policy: str) -> None:
    runs = sup.tmp / "runs"
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        restart = "{policy}"
        command = {sh(f"echo x >> {runs}; sleep 0.2; exit 0")}
        backoff_s = 0.05
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert len(runs.read_text().split()) == 1
    assert "lifecycle complete" in res.output


def test_service_failing_with_restart_no_fails(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        restart = "no"
        command = {sh("exit 4")}
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 4, res.output
    assert failure(res.output)["reason"] == "exit_code"


def test_service_up_lets_next_phase_start_while_it_runs(sup: Runner) -> None:
    ready, svc_pid, next_ran = sup.tmp / "svc.ready", sup.tmp / "svc.pid", sup.tmp / "next.ran"
    svc = py_script(sup.tmp, "svc", """
        import sys, time
        write_pid(sys.argv[2])
        time.sleep(0.3)
        write_pid(sys.argv[1])  # ready
        time.sleep(60)
    """, ready, svc_pid)
    check = py_script(sup.tmp, "next", """
        import os, sys
        os.kill(int(open(sys.argv[1]).read()), 0)  # the service still runs (raises if not)
        open(sys.argv[2], "w").close()
    """, svc_pid, next_ran)
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {svc}
        ready = {toml_str(str(ready))}
        ready_timeout_s = 20
        stop_grace_s = 1

        [[phases]]
        name = "next"
        command = {check}
    """)
    proc = sup.start(config)
    try:
        wait_for(next_ran.exists, timeout=20)
        pid = int(svc_pid.read_text())
        time.sleep(0.2)
        assert pid_alive(pid), "the service stopped when the next phase ran"
        assert proc.poll() is None, "the supervisor ended while a service is up"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143, out
    assert out.index("phase svc: service is up") < out.index("phase next: pending → starting")
    assert not pid_alive(pid)


# ---------------------------------------------------------------- environment and signals


def test_env_expansion_and_phase_env_reach_children(sup: Runner) -> None:
    out_cmd, out_daemon = sup.tmp / "cmd.json", sup.tmp / "daemon.json"
    dump = """
        import json, os, sys
        keys = ["PHASE_VAR", "DEFAULTED", "DOLLAR", "OWN", "SUP_TEST_VALUE", "PROVER_SUPERVISOR_TAG"]
        record = {"argv": sys.argv[2:], "env": {k: os.environ.get(k) for k in keys}}
        with open(sys.argv[1] + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        if len(sys.argv) > 3 and sys.argv[3] == "stay":
            import time
            time.sleep(60)
    """
    daemon_cmd = py_script(sup.tmp, "dump", dump, out_daemon, "${SUP_TEST_VALUE}", "stay")
    command = toml_list([PY, str(sup.tmp / "dump.py"), str(out_cmd), "${SUP_TEST_VALUE}", "x-${SUP_TEST_UNSET:-dflt}"])
    config = sup.write(f"""
        [[phases]]
        name = "envy"
        command = {command}
        env.PHASE_VAR = "phase-${{SUP_TEST_VALUE}}"
        env.DEFAULTED = "${{SUP_TEST_UNSET:-fallback}}"
        env.DOLLAR = "$$HOME"
        [[phases.daemons]]
        name = "d"
        command = {daemon_cmd}
        env = {{ OWN = "own-${{SUP_TEST_VALUE}}" }}
        ready = {toml_str(str(out_daemon))}
        ready_timeout_s = 20
        stop_grace_s = 1
    """)
    env = {"SUP_TEST_VALUE": "v42"}
    assert "SUP_TEST_UNSET" not in os.environ
    res = sup.run(config, timeout=30, env=env)
    assert res.returncode == 0, res.output
    cmd = json.loads(out_cmd.read_text())
    daemon = json.loads(out_daemon.read_text())
    assert cmd["argv"] == ["v42", "x-dflt"]
    assert cmd["env"]["PHASE_VAR"] == "phase-v42"
    assert cmd["env"]["DEFAULTED"] == "fallback"
    assert cmd["env"]["DOLLAR"] == "$HOME"
    assert cmd["env"]["SUP_TEST_VALUE"] == "v42"  # the supervisor's own environment is inherited
    assert cmd["env"]["OWN"] is None  # a daemon's own env is its own
    assert daemon["argv"] == ["v42", "stay"]
    assert daemon["env"]["PHASE_VAR"] == "phase-v42"  # a daemon sees its phase's env
    assert daemon["env"]["OWN"] == "own-v42"
    assert cmd["env"]["PROVER_SUPERVISOR_TAG"] and daemon["env"]["PROVER_SUPERVISOR_TAG"]
    assert cmd["env"]["PROVER_SUPERVISOR_TAG"] != daemon["env"]["PROVER_SUPERVISOR_TAG"]


def test_signals_forwarded_to_running_command(sup: Runner) -> None:
    got, ready = sup.tmp / "got", sup.tmp / "ready"
    cmd = py_script(sup.tmp, "trap", """
        import signal, sys, time
        out, wanted = sys.argv[1], {"SIGHUP", "SIGUSR1", "SIGUSR2"}
        seen = set()

        def handler(signum, frame):
            name = signal.Signals(signum).name
            seen.add(name)
            with open(out, "a") as f:
                f.write(name + "\\n")

        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, handler)
        write_pid(sys.argv[2])
        deadline = time.monotonic() + 20
        while seen != wanted and time.monotonic() < deadline:
            time.sleep(0.02)
        print("got", sorted(seen), flush=True)
        sys.exit(0 if seen == wanted else 1)
    """, got, ready)
    config = sup.write(f"""
        [[phases]]
        name = "sig"
        command = {cmd}
    """)
    proc = sup.start(config)  # if anything below fails, the fixture kills the whole tree
    wait_for(ready.exists, timeout=20)
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        os.kill(proc.pid, sig)
        wait_for(lambda sig=sig: got.exists() and sig.name in got.read_text().split(), timeout=10)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert got.read_text().split() == ["SIGHUP", "SIGUSR1", "SIGUSR2"]
    for name in ("SIGHUP", "SIGUSR1", "SIGUSR2"):
        assert f"{name} forwarded to sig/sig" in out
