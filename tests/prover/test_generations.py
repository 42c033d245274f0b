"""Two cuzk-daemon generations, one supervisor: readiness and memory without guessing the image's version.

Daemons from 13 Mar 2026 (unified memory manager) answer ``GET /status`` on status_listen; the
partition-workers builds before them (Feb to 13 Mar 2026, the seeds' image) have no status API, only
their listen port, and obey ``[synthesis] partition_workers`` (peak ≈ 69 + 20 × pw GiB). ``ready =
"cuzk"`` passes on either proof; the stand-in's ``STANDIN_CUZK_GENERATION=feb-2026`` is such a build.
Real stand-in daemons on free ports, probed with the supervisor's own probe.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, free_port, kill_tree, wait_for
from profilekit import standin_env

from supervisor.config import ConfigError, ReadyCheck, parse_plan
from supervisor.engine.readiness import probe
from supervisor.prover.cuzkconf import GIB, CuzkSettings, generate
from supervisor.prover.plugin import PLUGIN
from supervisor.prover.ready import cuzk_ready
from supervisor.text.show import shown

# cuzk-bench's PoRep input (--c1 is required; the stand-in daemon never reads it).
C1 = str(Path(__file__).parent / "c1.json")


class Daemon:
    """A stand-in cuzk-daemon with its output in a file."""

    def __init__(self, tmp: Path, config: str, **env: str) -> None:
        self.tmp = tmp
        self.cfg = tmp / "cuzk.toml"
        self.cfg.write_text(textwrap.dedent(config))
        self.log = tmp / "daemon.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.cuzk_daemon", "-c", str(self.cfg)],
                                         stdout=out, stderr=subprocess.STDOUT, env=standin_env(**env), cwd=REPO,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_bytes().decode("utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc.pid)
                self.proc.wait(5)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(config: str, **env: str) -> Daemon:
        where = tmp_path / f"d{len(started)}"
        where.mkdir()
        daemon = Daemon(where, config, **env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def settings(**kw: str) -> CuzkSettings:
    return CuzkSettings(config_path="/tmp/unused-cuzk.toml", **kw)  # type: ignore[arg-type]


def wait_ready(check: ReadyCheck, daemon: Daemon, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    why = probe(check)
    while why is not None:
        assert daemon.proc.poll() is None, f"the daemon exited {daemon.proc.returncode}:\n{daemon.output()}"
        assert time.monotonic() < deadline, f"not ready after {timeout}s: {why}\n{daemon.output()}"
        time.sleep(0.05)
        why = probe(check)


# ---------------------------------------------------------------- ready = "cuzk" in the config


def plan_with(cuzk: str, ready: str = "cuzk") -> object:
    return parse_plan(textwrap.dedent(f"""\
        [cuzk]
        {cuzk}

        [[phases]]
        name = "p"
        command = ["true"]

          [[phases.daemons]]
          name = "cuzk-daemon"
          command = ["true"]
          ready = "{ready}"
        """), "test", {}, PLUGIN)


@pytest.mark.parametrize(("cuzk", "described"), [
    ("", "http://127.0.0.1:9821/status or tcp://127.0.0.1:9820"),
    ('listen = "unix:///run/curio/cuzk.sock"', "http://127.0.0.1:9821/status or unix:///run/curio/cuzk.sock"),
    ('listen = "0.0.0.0:9900"\nstatus_listen = ""', "tcp://127.0.0.1:9900"),
    ('listen = "http://[::1]:9820"\nstatus_listen = "127.0.0.1:7"', "http://127.0.0.1:7/status or tcp://[::1]:9820"),
])
def test_cuzk_ready_is_status_or_the_listen_address(cuzk: str, described: str) -> None:
    plan = plan_with(cuzk)
    ready = plan.phases[0].daemons[0].ready  # type: ignore[attr-defined]
    assert ready.describe() == described
    assert ready == cuzk_ready(plan.sections["cuzk"])  # type: ignore[attr-defined]


def test_cuzk_ready_needs_a_cuzk_table() -> None:
    named = r'phases\[0\] \(p\)\.daemons\[0\] \(d\)\.ready'  # the place, with the phase's and daemon's names
    with pytest.raises(ConfigError, match=named + r': "cuzk" needs a \[cuzk\] table'):
        parse_plan('[[phases]]\nname = "p"\ncommand = ["true"]\n  [[phases.daemons]]\n  name = "d"\n'
                   '  command = ["true"]\n  ready = "cuzk"\n', "test", {}, PLUGIN)


@pytest.mark.parametrize(("cuzk", "key"), [
    ('listen = "unix://relative.sock"', "cuzk.listen"),
    ('listen = "nowhere"', "cuzk.listen"),
    ('pw_baseline = "lots"', "cuzk.pw_baseline"),
    ('pw_per_worker = -1', "cuzk.pw_per_worker"),
    ('status_listen = "nowhere"', "cuzk.status_listen"),
])
def test_bad_cuzk_values_name_their_key(cuzk: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^test: {key}: "):
        plan_with(cuzk)


def test_the_probe_shows_a_bad_address_cut() -> None:
    """A listen of 100 KB with ready = "cuzk" was echoed whole: one line of 100 KB."""
    huge = "x" * 100_000
    with pytest.raises(ConfigError) as refused:
        cuzk_ready(settings(listen=huge))
    assert str(refused.value) == f"cuzk.listen: {shown(huge)} must be unix:///path, IP:port or http://IP:port " \
                                 "(cuzk-daemon binds an IP address, not a host name)"
    with pytest.raises(ConfigError) as refused:
        cuzk_ready(settings(listen="unix://" + huge))
    assert str(refused.value) == f"cuzk.listen: {shown('unix://' + huge)} must name an absolute socket path " \
                                 "(unix:///path)"
    with pytest.raises(ConfigError) as refused:
        cuzk_ready(settings(status_listen=huge))
    assert str(refused.value) == f"cuzk.status_listen: {shown(huge)} must be host:port"


def test_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[cuzk]\nlisten = "unix://relative.sock"\n[[phases]]\nname = "p"\ncommand = ["true"]\n'
                      '  [[phases.daemons]]\n  name = "d"\n  command = ["true"]\n  ready = "cuzk"\n')
    done = subprocess.run([PY, "-m", "supervisor", "check", "--config", str(config)], capture_output=True,
                          text=True, timeout=30, cwd=REPO)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "cuzk.listen" in lines[0] and "Traceback" not in lines[0], lines


# ---------------------------------------------------------------- the probe against real stand-in daemons


def test_feb_2026_daemon_is_ready_by_its_listen_port_alone(daemons: Callable[..., Daemon]) -> None:
    port, status_port = free_port(), free_port()
    s = settings(listen=f"http://127.0.0.1:{port}", status_listen=f"127.0.0.1:{status_port}")
    d = daemons(f"""\
        [daemon]
        listen = "127.0.0.1:{port}"
        status_listen = "127.0.0.1:{status_port}"
        [synthesis]
        partition_workers = 2
        """, STANDIN_CUZK_GENERATION="feb-2026")
    check = cuzk_ready(s)
    wait_ready(check, d)
    # It never grows a status API: /status alone would have waited forever.
    http_only = check.alternatives[0]
    assert http_only.kind == "http" and probe(http_only) is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{status_port}/status", timeout=0.5)
    # The port accepts before the daemon logs that it listens (bind, serve, then the line): wait for the line.
    listening = f"proving service listening on 127.0.0.1:{port}"
    wait_for(lambda: listening in d.output(), 10, 0.05)
    out = d.output()
    assert "status service listening" not in out
    assert "synthesis: partition_workers=2 (estimated peak RSS ~ 109.00 GiB)" in out  # 69 + 20 × 2


def test_feb_2026_daemon_on_a_unix_socket(daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    sock = tmp_path / "run" / "cuzk.sock"
    check = cuzk_ready(settings(listen=f"unix://{sock}", status_listen=f"127.0.0.1:{free_port()}"))
    assert probe(check) is not None, "nothing listens yet"
    d = daemons(f'[daemon]\nlisten = "unix://{sock}"\n', STANDIN_CUZK_GENERATION="partition-workers")
    wait_ready(check, d)
    assert check.alternatives[1] == ReadyCheck("unix", str(sock))


def test_unified_daemon_is_ready_too(daemons: Callable[..., Daemon]) -> None:
    port, status_port = free_port(), free_port()
    d = daemons(f'[daemon]\nlisten = "127.0.0.1:{port}"\nstatus_listen = "127.0.0.1:{status_port}"\n')
    check = cuzk_ready(settings(listen=f"http://127.0.0.1:{port}", status_listen=f"127.0.0.1:{status_port}"))
    wait_ready(check, d)
    wait_for(lambda: probe(check.alternatives[0]) is None, 10, 0.05)  # and its /status answers


# ---------------------------------------------------------------- partition_workers is obeyed


def test_the_generated_file_runs_a_feb_2026_daemon_within_its_memory(daemons: Callable[..., Daemon],
                                                                         tmp_path: Path) -> None:
    """cuzk.toml for 125 GiB in partition-workers mode: pw 2, a peak of 109 GiB that fits; a proof completes."""
    port = free_port()
    s = settings(memory_model="partition-workers", listen=f"http://127.0.0.1:{port}", status_listen="")
    gen = generate(s, 125 * GIB, [])
    assert gen.partitions == 2
    d = daemons(gen.text, STANDIN_CUZK_GENERATION="feb-2026", STANDIN_DAEMON_MEMORY="125GiB")
    wait_ready(cuzk_ready(s), d)
    done = subprocess.run([PY, "-m", "supervisor.prover.standins.cuzk_bench", "-a", f"http://127.0.0.1:{port}",
                           "single", "-t", "porep", "--c1", C1], capture_output=True, text=True, timeout=30,
                          env=standin_env(), cwd=REPO)
    assert done.returncode == 0 and "status:    COMPLETED" in done.stdout, done.stdout + done.stderr
    assert d.proc.poll() is None


def test_the_seeds_partition_workers_10_on_125_gib_is_killed_at_its_first_proof(
        daemons: Callable[..., Daemon]) -> None:
    """What happened in the field: 69 + 20 × 10 = 269 GiB wanted on 125 GB, the daemon dies mid-proof."""
    port = free_port()
    d = daemons(f'[daemon]\nlisten = "127.0.0.1:{port}"\n[synthesis]\npartition_workers = 10\n',
                STANDIN_CUZK_GENERATION="feb-2026", STANDIN_DAEMON_MEMORY="125GiB")
    wait_ready(cuzk_ready(settings(listen=f"http://127.0.0.1:{port}", status_listen="")), d)
    done = subprocess.run([PY, "-m", "supervisor.prover.standins.cuzk_bench", "-a", f"http://127.0.0.1:{port}",
                           "single", "-t", "porep", "--c1", C1], capture_output=True, text=True, timeout=30,
                          env=standin_env(), cwd=REPO)
    # No answer (the connection broke mid-proof): do_prove's error, returned from main (cuzk-bench main.rs 1008).
    assert done.returncode == 1 and done.stderr.startswith("Error: Prove RPC failed\n\nCaused by:\n"), done.stderr
    assert d.proc.wait(10) == -signal.SIGKILL
    assert "estimated peak RSS ~ 269.00 GiB" in d.output()


def test_an_unknown_generation_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([PY, "-m", "supervisor.prover.standins.cuzk_daemon", "-c", str(tmp_path / "none.toml")],
                          capture_output=True, text=True, timeout=30, cwd=REPO,
                          env=standin_env(STANDIN_CUZK_GENERATION="march"))
    assert done.returncode == 2 and "STANDIN_CUZK_GENERATION" in done.stderr


def test_unknown_keys_are_ignored_by_both_generations(daemons: Callable[..., Daemon]) -> None:
    """The file written for one generation carries the other's keys too: neither daemon refuses it."""
    for generation in ("unified", "feb-2026"):
        port = free_port()
        s = settings(listen=f"http://127.0.0.1:{port}", status_listen=f"127.0.0.1:{free_port()}")
        gen = generate(s, 256 * GIB, [])
        assert "total_budget" in gen.text and "partition_workers" in gen.text
        d = daemons(gen.text, STANDIN_CUZK_GENERATION=generation)
        wait_ready(cuzk_ready(s), d)
        with contextlib.suppress(Exception):
            d.stop()
        assert d.proc.returncode == 0, d.output()
