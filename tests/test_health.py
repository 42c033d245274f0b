"""Health and metrics over HTTP (``[supervisor] http_port``), and the termination log.

Real supervisors, real sockets on 127.0.0.1: /healthz, /readyz before and after production is up, /metrics as
Prometheus text, the port off or already taken; the verdict line in ``termination_log`` on a failure only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
from helpers import (
    PY,
    REPO,
    Console,
    Result,
    Runner,
    clean_env,
    free_port,
    in_cgroup_argv,
    sh,
    toml_str,
    v1_cgroup,
    wait_for,
)
from standin_nvml import NvmlControl, fake_nvml_env, gpu

from supervisor.status.health import CONNECTION_LIFE_S, CONNECTIONS_MAX, IDLE_S, HealthServer, HealthState, metrics_text
from supervisor.status.model import Snapshot

# A sample line of the Prometheus text format: name, optional {labels}, a float value.
SAMPLE_RE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\})?'
    r' (?P<value>[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$')
COMMENT_RE = re.compile(r"^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$")


def get(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of GET http://127.0.0.1:port/path; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def parse_metrics(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Check the Prometheus text format strictly; name → {sorted label pairs: value}."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    helped: set[str] = set()
    typed: dict[str, str] = {}
    for line in text.splitlines():
        assert line, "no empty lines"
        if line.startswith("#"):
            found = COMMENT_RE.match(line)
            assert found, f"bad comment line: {line!r}"
            kind, name, rest = found.groups()
            if kind == "HELP":
                assert name not in helped, f"HELP twice for {name}"
                helped.add(name)
            else:
                assert rest in ("gauge", "counter", "untyped", "summary", "histogram"), line
                assert name not in typed and name not in samples, f"TYPE for {name} after its samples or twice"
                typed[name] = rest
            continue
        found = SAMPLE_RE.match(line)
        assert found, f"not a Prometheus sample line: {line!r}"
        name = found.group("name")
        assert name in typed and name in helped, f"{name} has no HELP/TYPE before its samples"
        labels = tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', found.group("labels") or "")))
        series = samples.setdefault(name, {})
        assert labels not in series, f"duplicate series {line!r}"
        series[labels] = float(found.group("value"))
    return samples


def lifecycle_config(sup: Runner) -> Path:
    """A oneshot that fails once (exit 7) then passes, then a service that is up once a file exists."""
    t = sup.tmp
    return sup.write(f"""
        [[phases]]
        name = "flaky"
        retries = 1
        backoff_s = 0.2
        command = {sh(f"if [ ! -e {t}/failed-once ]; then touch {t}/failed-once; exit 7; fi; "
                      f"while [ ! -e {t}/go ]; do sleep 0.05; done")}

        [[phases]]
        name = "svc"
        kind = "service"
        command = {sh(f"echo serving; while [ ! -e {t}/up ]; do sleep 0.05; done; touch {t}/is-up; exec sleep 60")}
        ready = {toml_str(str(t / "is-up"))}
        """, stop_grace_s=1)


def with_port(config: Path, port: int) -> None:
    text = config.read_text()
    config.write_text(text.replace("[supervisor]\n", f"[supervisor]\nhttp_port = {port}\n", 1))


def test_healthz_readyz_metrics_through_the_lifecycle(sup: Runner) -> None:
    port = free_port()
    config = lifecycle_config(sup)
    with_port(config, port)
    run = Console(sup, config)
    run.wait_text(f"health: http://127.0.0.1:{port}/healthz, /readyz, /metrics")
    assert get(port, "/healthz")[0] == 200
    status, body = get(port, "/readyz")
    assert (status, body) == (503, "not ready: production is not up\n")

    # The first attempt failed (exit 7); the second runs: verdicts and attempts show it.
    run.wait_text("FAILED: phase=flaky child=flaky")
    wait_for(lambda: 'prover_supervisor_phase_attempts{phase="flaky"} 2' in get(port, "/metrics")[1], 10, 0.1)
    status, body = get(port, "/metrics")
    assert status == 200
    metrics = parse_metrics(body)
    assert metrics["prover_supervisor_up"] == {(): 1.0}
    assert metrics["prover_supervisor_phase_info"] == {(("phase", "flaky"), ("state", "running")): 1.0,
                                                       (("phase", "svc"), ("state", "pending")): 1.0}
    assert metrics["prover_supervisor_phase_attempts"] == {(("phase", "flaky"),): 2.0, (("phase", "svc"),): 0.0}
    assert metrics["prover_supervisor_verdicts"] == {(("reason", "exit_code"),): 1.0}
    assert get(port, "/readyz")[0] == 503
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/nothing")[0] == 404

    # The service runs but is not up yet: still not ready.
    (sup.tmp / "go").touch()
    run.wait_text("[svc/svc] serving")
    assert get(port, "/readyz")[0] == 503
    (sup.tmp / "up").touch()
    run.wait_text("phase svc: service is up")
    wait_for(lambda: get(port, "/readyz")[0] == 200, 5, 0.1)
    assert get(port, "/readyz") == (200, "ready\n")
    status, healthz = get(port, "/healthz")
    assert status == 200 and healthz.startswith("ok: loop heartbeat"), healthz
    wait_for(lambda: 'phase="svc",state="running"' in get(port, "/metrics")[1], 5, 0.1)
    metrics = parse_metrics(get(port, "/metrics")[1])
    # Two verdicts for flaky: exit 7, then exit 0 (both reason exit_code).
    assert metrics["prover_supervisor_verdicts"] == {(("reason", "exit_code"),): 2.0}
    assert metrics["prover_supervisor_phase_info"][(("phase", "flaky"), ("state", "done"))] == 1.0
    assert metrics["prover_supervisor_phase_attempts"][(("phase", "svc"),)] == 1.0

    os.kill(run.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM
    assert get(port, "/healthz")[0] == 0  # closed with the supervisor


def test_metrics_byte_counts_are_exact() -> None:
    """Byte counts are written whole: %g would turn 25232932864 into 2.52329e+10 (50 MB off)."""
    snap = {"phases": [], "verdicts": [], "manager": {"enabled": True, "outbox_pending": 1234567},
            "memory": {"usage": 1234567891, "limit": 25232932864, "oom_kills": 0}}
    text = metrics_text(Snapshot.from_json(snap))
    parse_metrics(text)
    assert "prover_supervisor_memory_usage 1234567891\n" in text, text
    assert "prover_supervisor_memory_limit 25232932864\n" in text, text
    assert "prover_supervisor_outbox_pending 1234567\n" in text, text


def test_readyz_follows_the_phase_that_reports_running(sup: Runner) -> None:
    """With report = "running" on a service, that one decides /readyz, not the last service."""
    port = free_port()
    config = sup.write(f"""
        [[phases]]
        name = "prod"
        kind = "service"
        report = "running"
        command = {sh("echo prod; exec sleep 60")}

        [[phases]]
        name = "sidecar"
        kind = "service"
        command = {sh("echo sidecar; exec sleep 60")}
        ready = {toml_str(str(sup.tmp / "never"))}
        """, stop_grace_s=1)
    with_port(config, port)
    run = Console(sup, config)
    run.wait_text("[sidecar/sidecar] sidecar")
    assert "phase sidecar: service is up" not in run.text()
    wait_for(lambda: get(port, "/readyz")[0] == 200, 5, 0.1)
    os.kill(run.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM


def test_port_zero_means_nothing_listens(sup: Runner) -> None:
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {sh("echo serving; exec sleep 60")}
        """, stop_grace_s=1)
    with_port(config, 0)
    run = Console(sup, config)
    run.wait_text("[svc/svc] serving")
    listening = [c for c in psutil.Process(run.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening == [], listening
    assert "health:" not in run.text()
    os.kill(run.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM


def test_port_taken_the_supervisor_runs_and_says_health_is_off(sup: Runner) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = sup.write(f"""
            [[phases]]
            name = "work"
            command = {sh("echo working")}
            """)
        with_port(config, port)
        result = sup.run(config, timeout=30)
    assert result.returncode == 0, result.output
    assert (f"health: cannot listen on 127.0.0.1:{port} (Address already in use); /healthz and /metrics are off"
            in result.output), result.output
    assert "lifecycle complete" in result.output


# ---------------------------------------------------------------- the termination log


def with_termination_log(config: Path, path: Path) -> None:
    text = config.read_text()
    config.write_text(text.replace("[supervisor]\n", f"[supervisor]\ntermination_log = {toml_str(str(path))}\n", 1))


def run_with_termination_log(sup: Runner, path: Path, name: str, script: str) -> Result:
    """One phase ``name`` running ``script`` under sh, with ``termination_log`` at ``path``, run to its end."""
    config = sup.write(f"""
        [[phases]]
        name = "{name}"
        command = {sh(script)}
        """)
    with_termination_log(config, path)
    return sup.run(config, timeout=30)


def test_termination_log_holds_the_verdict_on_failure(sup: Runner) -> None:
    log = sup.tmp / "termination-log"
    log.write_text("")
    result = run_with_termination_log(sup, log, "fails", "echo about to fail; exit 7")
    assert result.returncode == 7, result.output
    text = log.read_text()
    assert re.fullmatch(r"phase=fails child=fails pid=\d+ reason=exit_code exit_code=7 .*attempt=1 "
                        r'detail="exited with code 7"', text), text
    assert text in result.output  # the same line as the FAILED line of the log


def test_termination_log_is_cut_to_4096_bytes(sup: Runner) -> None:
    log = sup.tmp / "termination-log"
    log.write_text("")
    # A detail that names this cwd: 4032 bytes, within PATH_MAX (config refuses more), over 4 KiB with its verdict.
    huge = "/nonexistent/" + "/".join(["é" * 100] * 20)
    config = sup.write(f"""
        [[phases]]
        name = "nowhere"
        cwd = {toml_str(huge)}
        command = ["true"]
        """)
    with_termination_log(config, log)
    result = sup.run(config, timeout=30)
    assert result.returncode == 126, result.output
    data = log.read_bytes()
    assert 3000 < len(data) <= 4096, len(data)
    text = data.decode("utf-8")  # cut on a character boundary
    assert text.startswith("phase=nowhere child=nowhere reason=spawn_failed"), text[:200]


def test_termination_log_untouched_on_success(sup: Runner) -> None:
    log = sup.tmp / "termination-log"
    log.write_text("")
    result = run_with_termination_log(sup, log, "fine", "echo fine")
    assert result.returncode == 0, result.output
    assert log.read_bytes() == b""


def test_termination_log_not_created_when_absent(sup: Runner) -> None:
    log = sup.tmp / "no-such-termination-log"
    result = run_with_termination_log(sup, log, "fails", "exit 7")
    assert result.returncode == 7, result.output
    assert not log.exists()


def handler_threads() -> list[threading.Thread]:
    """The health server's connection threads (socketserver names each after its target)."""
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


def test_1500_idle_connections_cost_a_bounded_number_of_threads_that_do_not_linger() -> None:
    """Each connection is a thread while served: a pile of idle ones (a port scanner, a client that
    connects and never asks) must not be a pile of threads, nor keep out the probe that asks."""
    said: list[str] = []
    state = HealthState()
    server = HealthServer(0, state, said.append)
    idle: list[socket.socket] = []
    peak = 0
    try:
        for _ in range(1500):  # bounded: each connect either completes or times out
            with contextlib.suppress(OSError):
                idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
            peak = max(peak, len(handler_threads()))
        assert len(idle) >= 1000, len(idle)  # the flood really came
        state.publish("production is not up", "")  # as the loop's heartbeat does
        status, body = get(server.port, "/healthz")  # asked amid the idle ones, answered
        assert status == 200 and body.startswith("ok"), (status, body)
        # A thread dropped to make room ends at once, but a few may be on their way out when counted.
        assert peak <= 2 * CONNECTIONS_MAX, peak
        assert said and said[0].startswith("health: dropped a connection"), said
        assert len(said) <= 1500 // 100 + 1, said  # the first drop, then every hundredth
        # Every client still holds its socket, idle: none keeps a thread past the idle bound.
        wait_for(lambda: not handler_threads(), timeout=IDLE_S + CONNECTION_LIFE_S)
    finally:
        for sock in idle:
            sock.close()
        server.close()


def test_metrics_carry_the_gpus_and_readyz_turns_at_the_shutdown(sup: Runner) -> None:
    # /metrics is built from the persisted snapshot, which leaves GPU samples out: the GPU gauges stayed empty
    # while `status` showed the GPU busy. And /readyz said "ready" through the shutdown, until production ended.
    control = NvmlControl(sup.tmp / "nvml.json", gpus=[gpu(util=77, used=4 << 30)])
    port = free_port()
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {sh("trap 'echo leaving; sleep 5; exit 0' TERM; echo serving; while true; do sleep 0.1; done")}
        """, stop_grace_s=10)
    with_port(config, port)
    run = Console(sup, config, env=fake_nvml_env(control))
    run.wait_text("[svc/svc] serving")
    wait_for(lambda: get(port, "/readyz")[0] == 200, 10, 0.1)
    wait_for(lambda: "prover_supervisor_gpu_utilization_percent{" in get(port, "/metrics")[1], 15, 0.2)
    metrics = parse_metrics(get(port, "/metrics")[1])
    assert metrics["prover_supervisor_gpu_utilization_percent"] == {(("gpu", "0"),): 77.0}
    assert metrics["prover_supervisor_gpu_memory_used_bytes"] == {(("gpu", "0"),): float(4 << 30)}
    os.kill(run.pid, signal.SIGTERM)
    run.wait_text("[svc/svc] leaving")  # production is being stopped: it takes 5 s to go
    wait_for(lambda: get(port, "/readyz")[0] == 503, 4, 0.1)  # (the next heartbeat, within HEARTBEAT_S)
    assert get(port, "/readyz") == (503, "not ready: shutting down\n")
    assert run.finish() == 128 + signal.SIGTERM


# The supervisor with a plugin that shows, in its phase's status, the machine's figures as a plugin reads them
# (what a production summary is written from).
MACHINE_LAUNCHER = """\
import sys
from supervisor.app.run import run
from supervisor.config import load_plan
from supervisor.plugin import Plugin

def attach(wiring):
    wiring.add_status("svc", lambda: {"machine": dict(wiring.machine("svc"))})

plugin = Plugin("machine-figures", attach=attach)
sys.exit(run(load_plan(sys.argv[1], plugin), plugin))
"""


def status_of(sup: Runner, *args: str) -> str:
    return subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=30).stdout


def test_a_plugins_machine_figures_are_the_containers_with_the_cgroup_evidence_off(sup: Runner) -> None:
    """cgroups = "off" reads no OOM counter, but the container's limit still kills: a plugin's machine figures (the
    production summary's "memory X of Y") showed the machine's MemTotal for a 256 MiB container."""
    with v1_cgroup("machine", 256 << 20) as cg:
        config = sup.write(f"""
            [[phases]]
            name = "svc"
            kind = "service"
            command = {sh("echo serving; exec sleep 120")}
            """, stop_grace_s=1)
        config.write_text(config.read_text().replace("[supervisor]\n", '[supervisor]\ncgroups = "off"\n', 1))
        launcher = sup.tmp / "launch.py"
        launcher.write_text(MACHINE_LAUNCHER)
        with open(sup.tmp / "console.txt", "wb") as out:
            proc = subprocess.Popen(in_cgroup_argv(cg, [PY, str(launcher), str(config)]), stdout=out,
                                    stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True, env=clean_env())
        sup.procs.append(proc)  # type: ignore[arg-type]

        def machine() -> dict[str, object] | None:
            with contextlib.suppress(ValueError, KeyError, IndexError):
                figures = json.loads(status_of(sup, "--json"))["phases"][0]["machine"]
                return figures if figures.get("memory_limit") is not None else None
            return None

        figures = wait_for(machine, 30, 0.2)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert isinstance(figures, dict) and figures["memory_limit"] == 256 << 20, figures
    assert 0 < figures["memory_used"] < 256 << 20, figures  # type: ignore[operator]


def test_gpu_figures_frozen_by_a_hung_nvml_are_never_served_as_current(sup: Runner) -> None:
    """NVML hangs (a driver crash): the last figures stayed in /metrics as current, status printed them with no
    age and a plugin's machine figures kept them. Now /metrics leaves them out and says the sample's age, status
    shows them with their age, a plugin reads no utilisation; once NVML answers again they are current again."""
    control = NvmlControl(sup.tmp / "nvml.json", gpus=[gpu(util=77, used=4 << 30)])
    port = free_port()
    config = sup.write(f"""
        [[phases]]
        name = "svc"
        kind = "service"
        command = {sh("echo serving; exec sleep 120")}
        """, stop_grace_s=1)
    with_port(config, port)
    launcher = sup.tmp / "launch.py"
    launcher.write_text(MACHINE_LAUNCHER)
    console = sup.tmp / "console.txt"
    with open(console, "wb") as out:
        proc = subprocess.Popen([PY, str(launcher), str(config)], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, env=clean_env(fake_nvml_env(control)))
    sup.procs.append(proc)  # type: ignore[arg-type]
    util = "prover_supervisor_gpu_utilization_percent{"
    wait_for(lambda: util in get(port, "/metrics")[1], 30, 0.2)
    machine = lambda: json.loads(status_of(sup, "--json"))["phases"][0]["machine"]  # noqa: E731
    assert machine()["gpu_utilization"] == [77]

    control.set(hang_s=1000)  # from now on every NVML call blocks, as after a driver crash
    wait_for(lambda: util not in get(port, "/metrics")[1], 60, 0.2)
    metrics = parse_metrics(get(port, "/metrics")[1])
    assert "prover_supervisor_gpu_memory_used_bytes" not in metrics, metrics
    assert metrics["prover_supervisor_gpu_sample_age_seconds"][()] > 0, metrics
    assert (("watch", "GPU sampling"),) in metrics["prover_supervisor_watch_blind"], metrics
    shown = status_of(sup)
    assert re.search(r"^gpu 0: NVIDIA H200 util 77% mem \S+ \(last sampled [0-9.]+s ago: not current\)$", shown,
                     re.M), shown
    snap = json.loads(status_of(sup, "--json"))
    assert snap["gpus"]["samples_stale"] is True and snap["gpus"]["sampled_s_ago"] > 0, snap["gpus"]
    assert snap["phases"][0]["machine"]["gpu_utilization"] == [], snap["phases"][0]["machine"]

    control.set(hang_s=0)  # NVML answers again: the figures are current again
    wait_for(lambda: util in get(port, "/metrics")[1], 60, 0.2)
    assert " (last sampled " not in status_of(sup)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(30)


def test_metrics_say_each_watch_blind_or_not_and_leave_stale_gpu_figures_out() -> None:
    sample = {"index": 0, "name": "H200", "utilization": 97, "memory_used": 1 << 33, "memory_total": 1 << 37}
    watches = {"GPU sampling": {"state": "blind", "window_s": 30.0}, "memory watch": {"state": "reading"}}
    stale = parse_metrics(metrics_text(Snapshot.from_json({"watches": watches, "gpus": {
        "samples": [sample], "sampled_s_ago": 40.0, "samples_stale": True}})))
    assert "prover_supervisor_gpu_utilization_percent" not in stale, stale
    assert stale["prover_supervisor_gpu_sample_age_seconds"] == {(): 40.0}
    assert stale["prover_supervisor_watch_blind"] == {(("watch", "GPU sampling"),): 1.0,
                                                      (("watch", "memory watch"),): 0.0}
    current = parse_metrics(metrics_text(Snapshot.from_json({"gpus": {"samples": [sample], "sampled_s_ago": 0.4}})))
    assert current["prover_supervisor_gpu_utilization_percent"] == {(("gpu", "0"),): 97.0}
    assert current["prover_supervisor_gpu_sample_age_seconds"] == {(): 0.4}


def test_a_fifo_as_termination_log_is_refused_not_waited_on(sup: Runner) -> None:
    """A FIFO with no reader hung the exit in open() for good, deaf to SIGTERM (SIGKILL alone ended it). One there
    at the start is refused by the config's check (test_config.py); this one is made while the run goes on."""
    log = sup.tmp / "termination-fifo"
    result = run_with_termination_log(sup, log, "fails", f"mkfifo {log}; exit 7")
    assert result.returncode == 7, result.output
    assert f"cannot write {log}: not a regular file" in result.output, result.output
    assert "exiting with status 7" in result.output
