"""The console may be lost (issue 14, class 6): a lost console costs console lines, never the run.

Every command runs as a real subprocess with its stdout (or stderr) closed (``>&-`` through a real
shell), on ``/dev/full`` (ENOSPC), into a pipe whose reader is gone (EPIPE) or that a real ``head``
closes early, and with ``PYTHONIOENCODING=ascii`` and a config path that is not ASCII: the exit
status is the command's own, and nothing is a traceback (nor Python's "Exception ignored" at exit).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from helpers import PY, REPO, Runner, clean_env, free_port, read, sh

from supervisor.engine.logs import Console

SINKS = ["closed", "full", "broken-pipe"]
DEV_FULL = Path("/dev/full")


def noisy(text: str) -> bool:
    return "Traceback" in text or "Exception ignored" in text or "Error" in text


@pytest.fixture
def broken_pipe() -> Iterator[int]:
    """The write end of a pipe whose read end is already closed: every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    yield write_end
    os.close(write_end)


def run_cli(args: list[str], sink: str, broken: int, *, stream: str = "stdout", env: dict[str, str] | None = None,
            timeout: float = 60) -> tuple[int, str]:
    """``python -m supervisor ARGS`` with its ``stream`` lost as ``sink``; returns (status, the other stream)."""
    argv = [PY, "-m", "supervisor", *args]
    fd = "1" if stream == "stdout" else "2"
    if sink == "closed":  # really closed: fd 1 (or 2) is not open at all in the program
        argv = ["sh", "-c", f'exec "$@" {fd}>&-', "sh", *argv]
        target: int | None = None
    else:
        target = os.open(DEV_FULL, os.O_WRONLY) if sink == "full" else broken
    other = subprocess.PIPE
    kwargs = {"stdout": target, "stderr": other} if stream == "stdout" else {"stdout": other, "stderr": target}
    try:
        done = subprocess.run(argv, text=True, errors="replace", env=clean_env(env), cwd=REPO, timeout=timeout,
                              **kwargs)  # type: ignore[call-overload]
    finally:
        if sink == "full" and target is not None:
            os.close(target)
    return done.returncode, (done.stderr if stream == "stdout" else done.stdout) or ""


def quick_config(sup: Runner, name: str = "config.toml") -> Path:
    return sup.write(f"""
        [[phases]]
        name = "hello"
        command = {sh("echo hello from the phase")}
        """, name=name)


# ---------------------------------------------------------------- run: the run goes on, the loss is said once


@pytest.mark.parametrize("sink", SINKS)
def test_run_goes_on_without_its_console(sup: Runner, sink: str, broken_pipe: int) -> None:
    status, stderr = run_cli(["run", "--config", str(quick_config(sup))], sink, broken_pipe)
    assert status == 0, stderr
    assert not noisy(stderr), stderr
    log = read(sup.log_dir / "supervisor.log")
    why = {"closed": "stdout is closed", "full": "cannot write stdout (No space left on device)",
           "broken-pipe": "cannot write stdout (Broken pipe)"}[sink]
    assert log.count(f"console: {why}") == 1, log
    assert "lifecycle complete" in log and "exiting with status 0" in log
    assert "hello from the phase" in read(sup.log_dir / "hello.log")


def test_demo_runs_with_stdout_closed(broken_pipe: int) -> None:
    status, stderr = run_cli(["demo"], "closed", broken_pipe, timeout=120)
    assert status == 0, stderr
    assert not noisy(stderr), stderr


# ---------------------------------------------------------------- the short commands: their status, no traceback


def command_args(sup: Runner, command: str) -> tuple[list[str], int]:
    config = quick_config(sup)
    return {
        "check": (["check", "--config", str(config)], 0),
        "status": (["status", "--state-dir", str(sup.state_dir)], 3),
        "status --json": (["status", "--json", "--state-dir", str(sup.state_dir)], 3),
        # Nobody to watch it: the first frame finds its reader gone, and the watch ends as Ctrl-C ends it.
        "status --watch": (["status", "--watch", "--state-dir", str(sup.state_dir)], 0),
        "standins": (["standins", "--bin-dir", str(sup.tmp / "bin")], 0),
        "--help": (["--help"], 0),
        "--version": (["--version"], 0),
    }[command]


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("command", ["check", "status", "status --json", "status --watch", "standins", "--help",
                                     "--version"])
def test_a_short_command_keeps_its_status_when_stdout_is_lost(sup: Runner, command: str, sink: str,
                                                              broken_pipe: int) -> None:
    args, expected = command_args(sup, command)
    status, stderr = run_cli(args, sink, broken_pipe)
    assert status == expected, stderr
    assert not noisy(stderr), stderr


@pytest.mark.parametrize("sink", SINKS)
def test_a_config_error_exits_2_even_when_its_line_cannot_be_written(sup: Runner, sink: str,
                                                                    broken_pipe: int) -> None:
    bad = sup.write('[[phases]]\nname = "x"\ncommand = []\n', name="bad.toml")
    for args in (["check", "--config", str(bad)], ["run", "--config", str(bad)],
                 ["check", "--config", str(sup.tmp / "missing.toml")]):
        status, stdout = run_cli(args, sink, broken_pipe, stream="stderr")
        assert status == 2, (args, stdout)
        assert not noisy(stdout), stdout


def test_status_into_a_pipe_that_head_closes_early(sup: Runner) -> None:
    status_cmd = subprocess.Popen([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), cwd=REPO)
    head = subprocess.run(["head", "-c", "10"], stdin=status_cmd.stdout, capture_output=True, timeout=30)
    assert status_cmd.stdout is not None
    status_cmd.stdout.close()
    _, stderr = status_cmd.communicate(timeout=30)
    assert len(head.stdout) == 10
    assert status_cmd.returncode == 3, stderr
    assert not noisy(stderr.decode()), stderr


# ---------------------------------------------------------------- a text the stream's encoding cannot show


@pytest.fixture
def non_ascii_dir(tmp_path: Path) -> Runner:
    home = tmp_path / "prüfung-é"
    home.mkdir()
    return Runner(home)


def test_an_ascii_console_and_a_non_ascii_path(non_ascii_dir: Runner) -> None:
    sup = non_ascii_dir
    config = quick_config(sup)
    ascii_env = {"PYTHONIOENCODING": "ascii"}
    checked = subprocess.run([PY, "-m", "supervisor", "check", "--config", str(config)], capture_output=True,
                             env=clean_env(ascii_env), cwd=REPO, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert b"pr\\xfcfung-\\xe9" in checked.stdout and b": ok: 1 phase(s)" in checked.stdout, checked.stdout
    ran = subprocess.run([PY, "-m", "supervisor", "run", "--config", str(config)], capture_output=True,
                         env=clean_env(ascii_env), cwd=REPO, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert not noisy(ran.stderr.decode()), ran.stderr
    shown = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sup.state_dir)],
                           capture_output=True, env=clean_env(ascii_env), cwd=REPO, timeout=60)
    assert shown.returncode == 3, shown.stdout + shown.stderr
    assert not noisy(shown.stderr.decode()), shown.stderr
    missing = subprocess.run([PY, "-m", "supervisor", "check", "--config", str(sup.tmp / "fehlt-ß.toml")],
                             capture_output=True, env=clean_env(ascii_env), cwd=REPO, timeout=60)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.count(b"\n") == 1 and b"\\xdf" in missing.stderr, missing.stderr


# ---------------------------------------------------------------- the dev-manager, and Ctrl-C for every command


def test_dev_manager_into_head_1_keeps_serving_and_ctrl_c_ends_it(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen([PY, "-m", "supervisor", "dev-manager", "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=clean_env(), cwd=REPO, start_new_session=True)
    try:
        head = subprocess.run(["head", "-1"], stdin=server.stdout, capture_output=True, timeout=30)
        assert server.stdout is not None
        server.stdout.close()  # head read its line and is gone: the pipe has no reader left
        assert head.stdout.startswith(b"dev-manager: serving the manager API")
        for label in ("C.one", "C.two"):  # each call printed into the broken pipe, each answered
            answer = requests.post(f"http://127.0.0.1:{port}/register", json={"label": label, "min_rate": 1},
                                   timeout=10)
            assert answer.status_code == 200, answer.text
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    assert server.returncode == 130, stderr
    assert stderr.decode().strip() == "prover-supervisor dev-manager: interrupted", stderr


def test_ctrl_c_during_status_is_one_line_and_130(tmp_path: Path) -> None:
    """`status` waits on the socket of a supervisor that does not answer (here: one that never does)."""
    state = tmp_path / "state"
    state.mkdir()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(state / "status.sock"))
    silent.listen(1)
    try:
        proc = subprocess.Popen([PY, "-m", "supervisor", "status", "--state-dir", str(state)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), cwd=REPO)
        conn, _ = silent.accept()  # it asked; it now waits for an answer that never comes
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        conn.close()
    finally:
        silent.close()
    assert proc.returncode == 130, err
    assert err.decode().strip() == "prover-supervisor status: interrupted", err
    assert out == b""


def test_ctrl_c_during_the_demo_stops_it_in_order() -> None:
    proc = subprocess.Popen([PY, "-m", "supervisor", "demo"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=clean_env(), cwd=REPO, start_new_session=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "phase paramfetch: starting → running" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out
    assert "shutting down: received SIGINT" in out and "demo finished with exit status 130" in out, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


# ---------------------------------------------------------------- stdout into a file (Vast's onstart)


def test_stdout_into_a_file_rolls_over_as_the_log_files_do(sup: Runner) -> None:
    # Vast starts it as `nohup ... > /var/log/entrypoint.log 2>&1 &`: the console (every child's line with its
    # prefix) would grow that file for as long as the instance proves. Past log_file_max_bytes it rolls to
    # `.1`, stdout and stderr alike onto the new file, as log_dir's files roll.
    config = sup.write(f"""
        [[phases]]
        name = "chatty"
        command = {sh("i=0; while [ $$i -lt 3000 ]; do echo line $$i of the chatty child; i=$$((i+1)); done")}
        """)
    config.write_text(config.read_text().replace("[supervisor]\n", "[supervisor]\nlog_file_max_bytes = 20000\n", 1))
    out = sup.tmp / "entrypoint.log"
    with open(out, "w") as sink:  # (the shell's `>`: no O_APPEND)
        ran = subprocess.run([PY, "-m", "supervisor", "run", "--config", str(config)], stdout=sink,
                             stderr=subprocess.STDOUT, env=clean_env(), cwd=REPO, timeout=120)
    assert ran.returncode == 0, read(out)[-3000:]
    rolled = out.with_name("entrypoint.log.1")
    assert rolled.exists(), "stdout into a file never rolled over"
    assert out.stat().st_size <= 20000 + 64 * 1024 and rolled.stat().st_size <= 20000 + 64 * 1024
    assert "exiting with status 0" in read(out)  # the supervisor's last lines are in the file it now writes
    assert read(sup.log_dir / "chatty.log").splitlines()[-1] == "line 2999 of the chatty child"


def test_a_backlog_written_in_one_batch_still_rolls_at_the_line_that_fills_the_file(tmp_path: Path) -> None:
    # CI once saw the writer thread starved while the loop queued a chatty child's whole output: the writer took it
    # in one batch and rolled only after it, so the file was 175 kB against a 20 kB roll. Held here on purpose:
    # the lines are queued while the writer cannot take them, then written as one batch.
    path = tmp_path / "entrypoint.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # (the shell's `>`: no O_APPEND)
    lines = [b"line %04d of the chatty child\n" % i for i in range(3000)]
    roll_at = 60_000
    try:
        console = Console(fd, roll_at=roll_at)
        with console._cond:  # the writer waits on this lock: nothing is taken until every line is queued
            for line in lines:
                console.put(line[:5], line[5:])  # (a prefix and its line, as the console's callers put them)
        console.close()
    finally:
        os.close(fd)
    rolled = path.with_name("entrypoint.log.1")
    assert rolled.exists(), "the batch never rolled the file over"
    longest = max(map(len, lines))
    assert roll_at <= rolled.stat().st_size < roll_at + longest
    assert rolled.read_bytes() + path.read_bytes() == b"".join(lines)  # no line lost, split or reordered


def test_a_childs_batch_of_lines_in_one_chunk_rolls_at_the_line_that_fills_the_file(tmp_path: Path) -> None:
    # A child's batch of lines reaches the console as one write of three parts: its prefix, the lines joined with
    # the prefix between them, the last newline (ChildOutput). CI saw 102 kB in entrypoint.log.1 against a 20 kB
    # roll: the roll waited for the end of the batch's chunk.
    path = tmp_path / "entrypoint.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    head = b"12:00:00.000 [chatty/chatty] "
    lines = [b"line %04d of the chatty child" % i for i in range(3000)]
    roll_at = 60_000
    try:
        console = Console(fd, roll_at=roll_at)
        console.put(head, (b"\n" + head).join(lines), b"\n")
        console.close()
    finally:
        os.close(fd)
    rolled = path.with_name("entrypoint.log.1").read_bytes()
    longest = len(head) + max(map(len, lines)) + 1
    assert roll_at <= len(rolled) < roll_at + longest and rolled.endswith(b"\n")
    assert path.read_bytes().startswith(head)  # the new file begins with a whole line
    whole = b"".join(head + line + b"\n" for line in lines)
    assert whole.endswith(rolled + path.read_bytes())  # (two rolls: the first file's lines are gone, no line torn)
