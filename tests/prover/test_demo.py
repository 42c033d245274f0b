"""The demo through the real CLI: ``python -m supervisor demo --fail MODE --phase P`` as a subprocess.

Each failure must be reported for the phase it was given, with the reason a real one would get, and
the demo must end by itself: a hung service is caught by its stall limit, an allocation runs into the
phase's own cgroup limit (a real kernel OOM kill where per-phase cgroups can be made), and a
stand-in whose client hung up says nothing (no traceback).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import (
    PY,
    REPO,
    Result,
    clean_env,
    finish,
    first_line,
    free_port,
    is_listening,
    kill_tree,
    verdict_lines,
    wait_for,
)

from supervisor.exits import EXIT_CONFIG_ERROR

# Generous: the slowest case (ignore-term in curio: three attempts, each a stall then a grace) takes ~25 s.
DEMO_TIMEOUT_S = 120
PHASES = ("paramfetch", "bench", "curio")


def demo(*args: str, timeout: float = DEMO_TIMEOUT_S, env: dict[str, str] | None = None) -> Result:
    proc = subprocess.Popen([PY, "-m", "supervisor", "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", env=env or clean_env(), cwd=REPO,
                            start_new_session=True)
    return finish(proc, time.monotonic(), timeout)


def reasons(out: str, phase: str, child: str | None = None) -> set[str]:
    """The reasons of the verdicts of ``phase`` (and ``child``): failures and ends alike."""
    return {record.split(" reason=", 1)[1].split(" ", 1)[0] for record in verdict_lines(out, phase, child)}


def assert_quiet(out: str) -> None:
    assert "Traceback" not in out and "BrokenPipeError" not in out, out


@pytest.mark.parametrize("phase", ["bench", "curio"])
def test_daemon_crash_fails_the_phase_it_is_given(phase: str) -> None:
    result = demo("--fail", "daemon-crash", "--phase", phase)
    out = result.output
    assert result.returncode == 3, out
    assert reasons(out, phase, "cuzk-daemon") == {"daemon_died"}, out
    other = "curio" if phase == "bench" else "bench"
    assert "daemon_died" not in reasons(out, other, "cuzk-daemon"), f"the {other} phase's daemon crashed:\n{out}"
    if phase == "curio":
        assert "phase bench: bench passed" in out, out
    assert_quiet(out)


def test_daemon_crash_in_a_phase_without_a_daemon_is_refused() -> None:
    proc = subprocess.run([PY, "-m", "supervisor", "demo", "--fail", "daemon-crash", "--phase", "paramfetch"],
                          capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=60)
    assert proc.returncode == EXIT_CONFIG_ERROR, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "daemon-crash" in lines[0] and "paramfetch" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert "started" not in proc.stdout  # nothing ran


def test_phase_without_fail_is_refused() -> None:
    """`demo --phase curio` alone ran the whole demo with nothing failing, --phase dropped without a word; refused
    as `status --interval` without `--watch` is."""
    proc = subprocess.run([PY, "-m", "supervisor", "demo", "--phase", "curio"], capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=60)
    assert proc.returncode == EXIT_CONFIG_ERROR, proc
    assert proc.stderr == "prover-supervisor demo: --phase goes with --fail\n", proc.stderr
    assert proc.stdout == ""  # nothing ran


def test_a_tmpdir_too_long_for_the_status_socket_moves_the_demo_under_tmp(tmp_path: Path) -> None:
    """Under a $TMPDIR of 84 bytes the state_dir's status socket is past a unix socket's 107: the demo refused with
    "demo config: supervisor.state_dir: too long", a key the user never wrote. It goes under /tmp, and says why."""
    long_tmp = tmp_path / ("t" * max(1, 84 - len(str(tmp_path)) - 1))
    long_tmp.mkdir()
    result = demo(env=clean_env({"TMPDIR": str(long_tmp)}))
    out = result.output
    assert result.returncode == 0, out
    assert out.startswith(f"demo: the temporary directory '{long_tmp}' ($TMPDIR) is too long for the status socket "
                          "of a state dir under it (a socket's path is at most 107 bytes): the demo's directory is "
                          "under /tmp instead\n"), out
    state = first_line(out, "demo: state in ").split()[3].rstrip(":")
    assert state.startswith("/tmp/prover-supervisor-demo-") and state.endswith("/state"), out
    assert not Path(state).parent.exists(), out  # removed with its state, as under $TMPDIR
    assert list(long_tmp.iterdir()) == [], out  # nothing left where it first tried
    assert_quiet(out)


@pytest.mark.parametrize("phase", PHASES)
def test_oom_in_any_phase_is_a_real_oom_kill(phase: str) -> None:
    result = demo("--fail", "oom", "--phase", phase)
    out = result.output
    evidence = first_line(out, "memory evidence:")
    if "per-phase mode" not in evidence:
        # Without a phase cgroup the stand-in stops itself at its cap, and the verdict honestly says "signal".
        print(f"skipping: {evidence}")
        pytest.skip(f"no per-phase cgroup here, no kernel OOM kill to see: {evidence}")
    assert result.returncode == 137, out
    assert reasons(out, phase, phase) == {"oom_killed"}, out
    assert "OOM KILL in cgroup" in out
    assert_quiet(out)


@pytest.mark.parametrize(("mode", "status"), [("hang", 124), ("ignore-term", 124)])
def test_a_hung_service_is_caught_by_its_stall_limit(mode: str, status: int) -> None:
    result = demo("--fail", mode, "--phase", "curio")
    out = result.output
    assert result.returncode == status, out
    assert "phase curio: stalled: no output for" in out, out
    assert reasons(out, "curio", "curio") == {"stalled"}, out
    assert "phase curio: stopping → failed (stalled" in out, out
    assert_quiet(out)


@pytest.mark.parametrize(("mode", "phase"), [("crash", "bench"), ("daemon-crash", "bench"), ("crash", "curio")])
def test_crash_demos_show_no_traceback(mode: str, phase: str) -> None:
    result = demo("--fail", mode, "--phase", phase)
    assert result.returncode == 3, result.output
    assert_quiet(result.output)


def test_a_segv_on_the_fetchs_file_thread_fails_the_fetch() -> None:
    """paramfetch reaches its failure point on a file thread: the segv demo printed a ValueError traceback there
    and then succeeded, exit 0."""
    result = demo("--fail", "segv", "--phase", "paramfetch")
    out = result.output
    assert result.returncode == 128 + signal.SIGSEGV, out
    assert reasons(out, "paramfetch", "paramfetch") == {"signal"}, out
    assert "phase paramfetch: stopping → failed (signal" in out, out
    assert_quiet(out)


def test_daemon_says_nothing_when_a_client_hangs_up(tmp_path: Path) -> None:
    """A proof whose client is gone before the answer (the bench crashed) is dropped without a traceback."""
    listen, status = free_port(), free_port()
    config = tmp_path / "cuzk.toml"
    config.write_text(f'[daemon]\nlisten = "127.0.0.1:{listen}"\nstatus_listen = "127.0.0.1:{status}"\n')
    env = clean_env({"STANDIN_SPEED": "0.05", "STANDIN_PROOF_S": "0.3", "CUZK_DISABLE_PCE": "1"})
    daemon = subprocess.Popen([PY, "-m", "supervisor.prover.standins.cuzk_daemon", "-c", str(config)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                              start_new_session=True)
    try:
        wait_for(lambda: is_listening(status), timeout=20, interval=0.05)
        for _ in range(3):
            body = json.dumps({"type": "porep", "job": "gone"}).encode()
            with socket.create_connection(("127.0.0.1", listen), timeout=5) as conn:
                conn.sendall(b"POST /prove HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
                # Hang up at once, with a reset: the daemon's answer meets a closed socket.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        wait_for(lambda: _completed(status) == 3, timeout=20, interval=0.05)
        time.sleep(0.3)  # counted just before each answer is written (to nobody): let the writes happen
        os.kill(daemon.pid, signal.SIGINT)
        out, _ = daemon.communicate(timeout=20)
    finally:
        if daemon.poll() is None:
            kill_tree(daemon.pid)
            daemon.communicate()
    assert daemon.returncode == 0, out
    assert_quiet(out)


def _completed(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as answer:
        return int(json.load(answer)["counters"]["total_completed"])


