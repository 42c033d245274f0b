"""The container image, for real: built with podman from the repo's Dockerfile and run.

The image is built on a minimal Debian base made with debootstrap (no registry needed; see
tests/container/images.py, which caches the base between runs). Then:

(a) ``podman run IMAGE demo``: the supervisor is PID 1 and the demo lifecycle completes;
(b) ``--memory 256m`` and a phase that allocates past it: the verdict is ``oom_killed``, decided from
    the cgroup counter inside the container, and the container's status is 137;
(c) ``podman stop -t 20`` with a service that ignores SIGTERM and ``stop_grace_s = 2``: the supervisor
    escalates to SIGKILL itself and the container exits 143 in about 2 s, long before podman's 20 s;
(h) ``podman stop`` with its default 10 s and ``stop_grace_s = 60``: the stop budget (8 s) fits the stop
    in, exit 143 with the whole exit; (i) ``status`` from a fresh container on a stopped one's state;
(d) ``/usr/local/bin/entrypoint.sh``, the path the fleet manager's onstart command starts: as an
    entrypoint it passes arguments and exit statuses through, and in the onstart style (``nohup ... &``
    under another PID 1) the supervisor runs as a subreaper and the demo completes.

Skipped, with the reason, where podman, runc or debootstrap are missing, when not root, or where the
base cannot be made (no mirror, no network). A Dockerfile that does not build fails the test.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import toml_list

from supervisor.exits import EXIT_CONFIG_ERROR

_spec = importlib.util.spec_from_file_location("prover_container_images",
                                               Path(__file__).parent / "container" / "images.py")
assert _spec is not None and _spec.loader is not None
images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(images)

# One xdist worker runs them all (one image build: pyproject.toml says why pytest < 9 for the groups). Even so, a
# build leaves a recent earlier image alone (images.drop_old_images): a run beside this one may be using it.
pytestmark = [pytest.mark.skipif(images.missing_prerequisite() is not None,
                                 reason=f"container test: {images.missing_prerequisite()}"),
              pytest.mark.xdist_group("container")]

Say = Callable[[str], None]


@pytest.fixture(scope="module")
def say(request: pytest.FixtureRequest) -> Say:
    """Timings go straight to the terminal (pytest -q would otherwise swallow them)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def emit(text: str) -> None:
        if reporter is None or capture is None:  # pragma: no cover
            print(f"[container] {text}", flush=True)
            return
        with capture.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(f"[container] {text}")

    return emit


@pytest.fixture(scope="module")
def image(say: Say) -> str:
    started = time.monotonic()
    try:
        image_id = images.build_image(say)
    except images.CannotBuild as exc:
        pytest.skip(f"container test: {exc}")
    say(f"image ready in {time.monotonic() - started:.1f}s")
    return image_id


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """A directory mounted read-only at /cfg in the containers."""
    path = tmp_path / "cfg"
    path.mkdir()
    path.chmod(0o755)
    return path


class Containers:
    """Names for this test's containers; every one is removed at the end, whatever happened."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def name(self, label: str) -> str:
        name = f"prover-sup-test-{os.getpid()}-{label}-{len(self.names)}"
        self.names.append(name)
        return name

    def remove_all(self) -> None:
        for name in self.names:
            images.podman("rm", "-f", "-t", "0", name, check=False, timeout=60)


@pytest.fixture
def containers() -> Iterator[Containers]:
    made = Containers()
    try:
        yield made
    finally:
        made.remove_all()


def run(*args: str, timeout: float = 180) -> tuple[int, str, float]:
    """``podman ARGS``: (exit status, stdout+stderr, seconds). Containers get no network but loopback."""
    if args[:1] == ("run",):
        args = ("run", "--network", "none", *args[1:])
    started = time.monotonic()
    # podman's conmon writes an ``oom`` marker into its working directory when a container is
    # OOM-killed: run it from a scratch directory of its own, removed after it (/tmp itself kept the marker).
    with tempfile.TemporaryDirectory(prefix="podman-cwd-", ignore_cleanup_errors=True) as scratch:
        proc = subprocess.run(["podman", *args], env=images.podman_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=scratch)
    return proc.returncode, proc.stdout, time.monotonic() - started


def wait_for_text(fetch: Callable[[], str], needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = fetch()
        if needle in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} did not show within {timeout:g}s; last output:\n{text[-4000:]}")


def memory_evidence(output: str) -> str:
    line = next((ln for ln in output.splitlines() if "memory evidence:" in ln), "")
    assert line, f"no 'memory evidence:' line:\n{output[:3000]}"
    return line


def write(cfg: Path, name: str, text: str) -> str:
    path = cfg / name
    path.write_text(textwrap.dedent(text))
    path.chmod(0o644)
    return f"/cfg/{name}"


# Allocates (and writes) 16 MiB after 16 MiB until the kernel's OOM killer stops it.
HOG = "hog = [b'x' * (16 << 20) for _ in iter(int, 1)]"


def test_image_config(image: str) -> None:
    """Exec-form ENTRYPOINT into the venv, SIGTERM as the stop signal."""
    rc, out, _ = run("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.StopSignal}}", image)
    assert rc == 0, out
    assert out.strip() == ('["/opt/prover-supervisor/bin/python","-I","/opt/prover-supervisor/entrypoint.py"] '
                           "SIGTERM"), out


def test_demo_as_pid1(image: str, say: Say) -> None:
    rc, out, took = run("run", "--rm", image, "demo")
    say(f"(a) demo as PID 1: status {rc} in {took:.1f}s")
    assert rc == 0, out[-6000:]
    assert re.search(r"prover-supervisor pid 1 as pid1", out), out[:3000]
    assert re.search(r"the manager saw \S+ go registered → params_done → bench_done → running", out), out[-3000:]
    assert "demo finished with exit status 0" in out, out[-3000:]


def test_builtin_profile_with_no_config(image: str, say: Say) -> None:
    """The job the user runs: `run` with no config, the stand-ins on PATH, a dev-manager beside it.

    sh starts the dev-manager and writes the stand-ins, runs the supervisor the image's way
    (``-I entrypoint.py run``), then asks the dev-manager what it saw."""
    py = "/opt/prover-supervisor/bin/python"
    script = (
        f"{py} -m supervisor dev-manager --port 1235 > /tmp/dev-manager.log 2>&1 & "
        f"{py} -m supervisor standins --bin-dir /tmp/bin > /dev/null && "
        "export PATH=/tmp/bin:$PATH MANAGER_URL=http://127.0.0.1:1235 VAST_CONTAINERLABEL=C.4242 "
        "BENCH_C1=/tmp/bin/c1.json PROVER_MIN_MEMORY=1GiB CUZK_BASELINE=1GiB CUZK_PER_PARTITION=512MiB "
        "PROVER_MIN_PARAM_DISK=64MiB PROVER_REQUIRE_GPUS=false "
        "STANDIN_SPEED=0.1 STANDIN_RUN_SECONDS=2 BENCH_COUNT=4 PROVER_CURIO_RESTART=on-failure && "
        "sleep 0.5 && "
        f"{py} -I /opt/prover-supervisor/entrypoint.py run; status=$?; "
        f"{py} -c \"import json,urllib.request; s=json.load(urllib.request.urlopen('http://127.0.0.1:1235/dev/state'));"
        "print('HISTORY', [i['history'] for i in s['instances'].values()])\"; exit $status"
    )
    rc, out, took = run("run", "--rm", "--entrypoint", "sh", image, "-c", script)
    say(f"(e) the built-in profile with stand-ins on PATH: status {rc} in {took:.1f}s")
    assert rc == 0, out[-6000:]
    for phase in ("paramfetch", "warmup", "bench", "curio"):
        assert re.search(rf"phase {phase}: \S+ → done", out), (phase, out[-4000:])
    assert "HISTORY [['registered', 'params_done', 'bench_done', 'running']]" in out, out[-3000:]


def test_oom_kill_inside_a_memory_limited_container(image: str, cfg: Path, say: Say) -> None:
    config = write(cfg, "oom.toml", f"""\
        [supervisor]
        stop_grace_s = 2

        [[phases]]
        name = "hog"
        kind = "oneshot"
        command = {toml_list(["python3", "-c", HOG])}
        """)
    rc, out, took = run("run", "--rm", "--memory", "256m", "--memory-swap", "256m", "-v", f"{cfg}:/cfg:ro",
                        image, "run", "--config", config)
    evidence = memory_evidence(out)
    say(f"(b) OOM under --memory 256m: status {rc} in {took:.1f}s; {evidence.split('] ', 1)[-1]}")
    assert re.search(r"memory evidence: (shared|per-phase) mode, cgroup v[12] at /sys/fs/cgroup", evidence), out
    verdict = next((ln for ln in out.splitlines() if "phase=hog child=hog" in ln), "")
    assert "reason=oom_killed" in verdict and "oom_kills=" in verdict, out[-4000:]
    assert "exiting with status 137" in out, out[-4000:]
    assert rc == 137, out[-4000:]


def test_docker_stop_escalates_within_stop_grace(image: str, cfg: Path, containers: Containers, say: Say) -> None:
    config = write(cfg, "stubborn.toml", """\
        [supervisor]
        stop_grace_s = 2

        [[phases]]
        name = "stubborn"
        kind = "service"
        restart = "no"
        command = ["sh", "-c", "trap '' TERM; echo stubborn-ready; while :; do sleep 1; done"]
        """)
    name = containers.name("stop")
    rc, out, _ = run("run", "-d", "--name", name, "-v", f"{cfg}:/cfg:ro", image, "run", "--config", config)
    assert rc == 0, out

    def logs() -> str:
        return run("logs", name, timeout=60)[1]

    wait_for_text(logs, "stubborn-ready", timeout=60)
    rc, out, took = run("stop", "-t", "20", name, timeout=60)
    assert rc == 0, out
    _, status, _ = run("inspect", "--format", "{{.State.ExitCode}}", name)
    text = logs()
    say(f"(c) podman stop -t 20, service ignoring SIGTERM, stop_grace_s = 2: exit {status.strip()} "
        f"after {took:.1f}s")
    assert status.strip() == "143", text[-4000:]
    assert took < 10, f"podman stop took {took:.1f}s: the supervisor did not escalate by itself\n{text[-4000:]}"
    escalation = [ln for ln in text.splitlines() if "stubborn" in ln and "grace" in ln and "SIGKILL" in ln]
    assert escalation, text[-4000:]
    assert "exiting with status 143" in text, text[-4000:]


def test_docker_stop_with_its_default_timeout_fits_the_stop_budget(image: str, cfg: Path, containers: Containers,
                                                                    say: Say) -> None:
    """``podman stop`` waits 10 s, as docker's does; curio's grace is 60 s. The stop budget (8 s) shrinks the
    grace: exit 143 with the whole exit (its line, the cut-short line), not podman's SIGKILL and 137."""
    config = write(cfg, "curio-like.toml", """\
        [supervisor]
        stop_grace_s = 60

        [[phases]]
        name = "stubborn"
        kind = "service"
        restart = "no"
        command = ["sh", "-c", "trap '' TERM; echo stubborn-ready; while :; do sleep 1; done"]
        """)
    name = containers.name("budget")
    rc, out, _ = run("run", "-d", "--name", name, "-v", f"{cfg}:/cfg:ro", image, "run", "--config", config)
    assert rc == 0, out

    def logs() -> str:
        return run("logs", name, timeout=60)[1]

    wait_for_text(logs, "stubborn-ready", timeout=60)
    rc, out, took = run("stop", name, timeout=60)  # podman's own default timeout: 10 s
    assert rc == 0, out
    _, status, _ = run("inspect", "--format", "{{.State.ExitCode}}", name)
    text = logs()
    say(f"(h) podman stop (10 s), service ignoring SIGTERM, stop_grace_s = 60: exit {status.strip()} "
        f"after {took:.1f}s")
    assert status.strip() == "143", text[-4000:]
    assert "exiting with status 143" in text, text[-4000:]
    cut = r"stop budget 8s \(SIGTERM from outside.*cut short: the grace of stubborn/stubborn 60s → "
    assert re.search(cut, text), text[-4000:]


def test_status_from_a_fresh_container_on_a_stopped_supervisors_state(image: str, cfg: Path, tmp_path: Path,
                                                                       say: Say) -> None:
    """``docker run --rm -v state:/var/lib/prover-supervisor IMAGE status``: PID 1 is the status command,
    and pid 1 is what the stopped supervisor recorded: it exited, it is not "alive but not answering"."""
    state = tmp_path / "state"
    state.mkdir()
    config = write(cfg, "once.toml", """\
        [[phases]]
        name = "once"
        command = ["true"]
        """)
    volume = f"{state}:/var/lib/prover-supervisor"
    rc, out, _ = run("run", "--rm", "-v", volume, "-v", f"{cfg}:/cfg:ro", image, "run", "--config", config)
    assert rc == 0, out[-4000:]
    rc, shown, _ = run("run", "--rm", "-v", volume, image, "status")
    say(f"(i) status from a fresh container on a stopped supervisor's state: exit {rc}")
    assert rc == 3, shown
    assert "NOT ANSWERING" not in shown and shown.startswith("done: "), shown


def test_entrypoint_shim_passes_arguments_and_status(image: str, cfg: Path) -> None:
    shim = "/usr/local/bin/entrypoint.sh"
    rc, out, _ = run("run", "--rm", "--entrypoint", shim, image, "--version")
    assert rc == 0 and re.search(r"prover-supervisor \d", out), out
    config = write(cfg, "ok.toml", """\
        [[phases]]
        name = "one"
        command = ["true"]
        """)
    rc, out, _ = run("run", "--rm", "-v", f"{cfg}:/cfg:ro", "--entrypoint", shim, image, "check", "--config", config)
    assert rc == 0 and "ok: 1 phase(s)" in out, out
    bad = write(cfg, "bad.toml", """\
        [[phases]]
        name = "one"
        command = ["true"]
        retries = -1
        """)
    rc, out, _ = run("run", "--rm", "-v", f"{cfg}:/cfg:ro", "--entrypoint", shim, image, "check", "--config", bad)
    assert rc == EXIT_CONFIG_ERROR and "retries" in out, out
    # The built-in prover profile, as installed in the image's venv, is a valid config.
    rc, out, _ = run("run", "--rm", "--entrypoint", "sh", image, "-c",
                     f"exec {shim} check --config /opt/prover-supervisor/lib/python3*/site-packages/"
                     "supervisor/prover/profile.toml")
    assert rc == 0 and "ok:" in out, out


def test_onstart_style_runs_as_subreaper(image: str, containers: Containers, say: Say) -> None:
    """Vast's --ssh mode: another PID 1 runs the manager's onstart command, ``nohup entrypoint.sh &``."""
    name = containers.name("onstart")
    onstart = "nohup /usr/local/bin/entrypoint.sh demo > /var/log/entrypoint.log 2>&1 &"
    started = time.monotonic()
    rc, out, _ = run("run", "-d", "--name", name, "--entrypoint", "sh", image, "-c", f"{onstart} sleep 120")
    assert rc == 0, out

    def log() -> str:
        return run("exec", name, "cat", "/var/log/entrypoint.log", timeout=60)[1]

    text = wait_for_text(log, "demo finished with exit status", timeout=90)
    say(f"(d) onstart style (nohup entrypoint.sh demo &): finished in {time.monotonic() - started:.1f}s")
    assert re.search(r"prover-supervisor pid \d+ as subreaper", text), text[:3000]
    assert not re.search(r"prover-supervisor pid 1 as", text), text[:3000]
    assert re.search(r"the manager saw \S+ go registered → params_done → bench_done → running", text), text[-3000:]
    assert "demo finished with exit status 0" in text, text[-3000:]
    # Nothing of the lifecycle outlives the supervisor: only the onstart's sh and sleep are left. The
    # supervisor prints "demo finished" a moment before its own exit: look until it is gone (or not).
    deadline = time.monotonic() + 30
    while True:
        _, ps, _ = run("exec", name, "ps", "-eo", "pid,ppid,stat,args")
        left = [ln for ln in ps.splitlines()[1:] if "python" in ln and "<defunct>" not in ln]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, ps


def test_exec_prover_supervisor_status_in_a_running_container(image: str, cfg: Path, containers: Containers,
                                                              say: Say) -> None:
    """The image puts ``prover-supervisor`` on PATH: ``docker exec CONTAINER prover-supervisor status`` works."""
    config = write(cfg, "steady.toml", """\
        [supervisor]
        state_dir = "/tmp/state"

        [[phases]]
        name = "steady"
        kind = "service"
        command = ["sh", "-c", "echo steady-ready; exec sleep 600"]
        """)
    name = containers.name("exec")
    rc, out, _ = run("run", "-d", "--name", name, "-v", f"{cfg}:/cfg:ro", image, "run", "--config", config)
    assert rc == 0, out
    wait_for_text(lambda: run("logs", name, timeout=60)[1], "steady-ready", timeout=60)
    rc, which, _ = run("exec", name, "sh", "-c", "command -v prover-supervisor", timeout=60)
    assert rc == 0 and which.strip() == "/usr/local/bin/prover-supervisor", which
    rc, shown, _ = run("exec", name, "prover-supervisor", "status", "--config", config, timeout=60)
    say(f"(g) podman exec … prover-supervisor status: exit {rc}")
    assert rc == 0, shown
    assert "steady" in shown, shown
    # Bare, with no --config: the supervisor's own state_dir (/tmp/state) is found through its pointer.
    rc, shown, _ = run("exec", name, "prover-supervisor", "status", timeout=60)
    assert rc == 0 and "steady" in shown, shown
    rc, bare, _ = run("exec", name, "prover-supervisor", timeout=60)
    assert rc == 2 and "usage: prover-supervisor" in bare, bare  # help, not a second lifecycle
    # A base image whose PYTHONPATH holds another `supervisor` (Debian's supervisord): the command on PATH runs
    # ours (-I), as the ENTRYPOINT does; the venv's own script, linked there before, imported that one.
    rc, _, _ = run("exec", name, "sh", "-c", "mkdir -p /tmp/shadow/supervisor && echo 'raise ImportError("
                   "\"the base image supervisor package\")' > /tmp/shadow/supervisor/__init__.py", timeout=60)
    assert rc == 0
    rc, shown, _ = run("exec", "-e", "PYTHONPATH=/tmp/shadow", name, "prover-supervisor", "status", timeout=60)
    assert rc == 0 and "steady" in shown, shown
