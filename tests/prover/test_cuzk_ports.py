"""``ready = "cuzk"`` and its ports: the cuzk-daemon's listen and status_listen, declared to the core by the
probe the plugin makes (``ReadyCheck.ports()``), are checked free before the stand-in cuzk-daemon starts.

The issue: a port already taken by another process satisfied ``ready = "cuzk"`` in 11 ms, and the daemon then
failed to bind. Now the attempt fails ``port_in_use`` naming the port and its holder, and the daemon is never
started; a cuzk-daemon on a unix socket has no port to check and is ready as before.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import PY, Runner, failure, free_port, kill_tree, sh, stranger_on, toml_str

from supervisor.exits import EXIT_FAILURE


def cuzk_phase(sup: Runner, listen: str, status_listen: str) -> Path:
    return sup.write(f"""
        [cuzk]
        listen = {toml_str(listen)}
        status_listen = {toml_str(status_listen)}
        baseline = "1GiB"
        per_partition = "512MiB"

        [[phases]]
        name = "prove"
        prepare = "cuzk-config"
        command = {sh("echo the daemon answered")}
          [[phases.daemons]]
          name = "cuzk-daemon"
          command = [{toml_str(PY)}, "-m", "supervisor.prover.standins.cuzk_daemon", "-c",
                     {toml_str(str(sup.state_dir / "cuzk.toml"))}]
          ready = "cuzk"
          ready_timeout_s = 20
          stop_signal = "SIGINT"
        """, stop_grace_s=2)


@pytest.fixture
def held() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        kill_tree(proc.pid)
        proc.wait(10)


@pytest.mark.parametrize("taken", ["listen", "status_listen"])
def test_a_taken_cuzk_port_fails_the_attempt_naming_its_holder(sup: Runner, held: list[subprocess.Popen[bytes]],
                                                                taken: str) -> None:
    listen, status = free_port(), free_port()
    port = listen if taken == "listen" else status
    held.append(stranger_on(port))
    holder = held[-1]
    res = sup.run(cuzk_phase(sup, f"http://127.0.0.1:{listen}", f"127.0.0.1:{status}"), timeout=40)
    assert res.returncode == EXIT_FAILURE, res.output
    v = failure(res.output)
    assert (v["phase"], v["child"], v["reason"]) == ("prove", "cuzk-daemon", "port_in_use"), res.output
    name = psutil.Process(holder.pid).name()
    assert f"port 127.0.0.1:{port} is already taken by pid {holder.pid} ({name})" in v["detail"], v
    assert "started prove/cuzk-daemon" not in res.output, "the cuzk-daemon was started on a taken port"
    assert "is ready" not in res.output and "the daemon answered" not in res.output


def test_a_cuzk_daemon_on_a_unix_socket_has_no_port_to_check(sup: Runner, held: list[subprocess.Popen[bytes]],
                                                             tmp_path: Path) -> None:
    held.append(stranger_on(free_port()))  # someone else's port, nothing to do with it
    sock = tmp_path / "run" / "cuzk.sock"
    sock.parent.mkdir()
    res = sup.run(cuzk_phase(sup, f"unix://{sock}", ""), timeout=40)
    assert res.returncode == 0, res.output
    assert "prove/cuzk-daemon is ready (unix://" in res.output
    assert "the daemon answered" in res.output


def test_a_cuzk_daemon_on_free_ports_is_ready_by_its_own_listeners(sup: Runner) -> None:
    res = sup.run(cuzk_phase(sup, f"http://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"), timeout=40)
    assert res.returncode == 0, res.output
    assert "prove/cuzk-daemon is ready" in res.output and "the daemon answered" in res.output
    assert "outside the process tree" not in res.output
