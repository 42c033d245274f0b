"""``prover-supervisor demo``: the whole lifecycle on this machine, in seconds.

The real paramfetch, cuzk and curio need a GPU and tens of GiB of parameters;
the demo runs the stand-ins shipped in ``supervisor.prover.standins`` instead, with
the same flags, output lines and signal behaviour, from a temporary directory.
``--fail`` makes one of them misbehave, to show how a failure is reported; ``--fail gpu`` and
``--fail proofs`` break production itself (the production faults, at the end of this module): the other
``--fail`` modes make one stand-in program misbehave; these two break what production depends on while
every program keeps running, which only the supervisor's watches can see:

- ``gpu``: the supervisor process itself must import the stand-in ``pynvml`` (fakenvml/), so the demo
  re-executes itself with that directory first on ``PYTHONPATH`` before anything starts (``reexec``). Its
  control file gives the machine idle GPUs ($GPU_COUNT of them, else DEMO_GPUS; 0 is refused), so ``require_gpus``
  (fitness) and ``gpu_health`` (production) are on; once the manager has seen the instance ``running``,
  ``XidAtProduction`` writes a fatal Xid (FATAL_XID) into it: production fails with ``gpu_fault``, is
  never restarted, and the instance is given up.
- ``proofs``: the curio phase's cuzk-daemon fails every proof on its GPU (``STANDIN_FAIL_PROOFS=1``), curio sends
  it a PoRep every task interval (``CURIO_CUZK_ADDRESS``, its [Cuzk] Address), and the production watch reads the
  counters every DEMO_WATCH_S: cuzk's /status counts no such failure (as the real one's), curio's PoRep task counts
  each; production fails with ``proofs_failing`` on curio's counters, is restarted under curio's restart policy,
  and once that is exhausted the instance is given up.

In both the curio stand-in runs far longer than the fault takes (FAULT_RUN_SECONDS): the fault ends production,
and the demo's last lines say which verdict did and what the manager did with the instance.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

import tomli_w

from ..config import MAX_SHOWN_PATH, MAX_SOCKET_PATH_BYTES, ConfigError, Plan, check_state_dir, parse_plan
from ..devmanager.server import DevManager
from ..engine.ports import free_ports
from ..exits import EXIT_CONFIG_ERROR as EXIT_USAGE
from ..exits import EXIT_FAILURE
from ..lifecycle.fitness import FITNESS, GPU_COUNT_ENV, expected_gpu_count
from ..lifecycle.lifecycle import Lifecycle
from ..lifecycle.verdict import Verdict
from ..plugin import Plugin
from ..state.files import write_atomically
from ..text.show import shown
from ..text.stdio import say
from .devfleet import DEV_FLEET
from .plugin import PLUGIN
from .standins import fakenvml
from .standins.install import C1_JSON

# Which stand-in plays the failing program of each phase, for --fail.
_FAIL_TARGET = {"paramfetch": "PARAMFETCH", "bench": "CUZK_BENCH", "curio": "CURIO"}
# Where --fail plays without --phase.
DEFAULT_FAIL_PHASE = "bench"
# The phases that have a cuzk-daemon, for --fail daemon-crash.
DAEMON_PHASES = ("bench", "curio")
# Every phase gets its own cgroup limit (where cgroups are writable): `--fail oom` then ends in a real
# kernel OOM kill whichever phase fails (elsewhere the stand-in stops itself at STANDIN_OOM_LIMIT, and
# the verdict honestly says "signal"). The stand-ins need a few tens of MiB.
DEMO_MEMORY_MAX = "384MiB"
DEMO_OOM_LIMIT = "1GiB"
# The demo's directory: under the temporary directory, else (one too long for the status socket's path) here.
WORKDIR_PREFIX = "prover-supervisor-demo-"
SHORT_TMP = "/tmp"
# The service prints a task line every second at full speed: this long without a byte is a hang
# (`--fail hang` / `ignore-term` in curio would otherwise run forever).
DEMO_SERVICE_STALL_S = 3


class DemoUsageError(ValueError):
    """A --fail / --phase pair the demo cannot play."""


def demo_config(workdir: Path, fail: str | None = None, fail_phase: str = DEFAULT_FAIL_PHASE,
                speed: float = 0.2, run_seconds: float = 4.0, manager_url: str | None = None) -> str:
    """The demo's TOML: three phases of stand-ins, ports chosen free, state in ``workdir``."""
    if fail == "daemon-crash" and fail_phase not in DAEMON_PHASES:
        raise DemoUsageError(f"--fail daemon-crash: phase {fail_phase} has no daemon "
                             f"(--phase {' or '.join(DAEMON_PHASES)})")
    py = sys.executable
    listen, status, curio = free_ports(3)
    fault = FaultConfig()
    if fail in PRODUCTION_FAULTS:
        fault = fault_config(fail, listen, status, curio, workdir / "params")
        run_seconds = max(run_seconds, FAULT_RUN_SECONDS)
    cuzk_toml = workdir / "cuzk.toml"
    c1 = workdir / "c1.json"  # (cuzk-bench's PoRep input: --c1 is required; the stand-in daemon reads it not)
    c1.write_text(C1_JSON)
    cuzk_toml.write_text(tomli_w.dumps({"daemon": {"listen": f"127.0.0.1:{listen}",
                                                   "status_listen": f"127.0.0.1:{status}"}}))
    env = {"STANDIN_SPEED": str(speed), "STANDIN_PARAM_FILES": "3", "STANDIN_PARAM_BYTES": "2097152",
           "FIL_PROOFS_PARAMETER_CACHE": str(workdir / "params"), "STANDIN_RUN_SECONDS": str(run_seconds),
           "STANDIN_OOM_LIMIT": DEMO_OOM_LIMIT}
    # The failure knob goes to the failing phase only (its daemon reads the phase's env too).
    fails: dict[str, dict[str, str]] = {name: {} for name in _FAIL_TARGET}
    if fail in PRODUCTION_FAULTS:
        fails[FAULT_PHASE] = fault.curio_env
    elif fail is not None:
        knob = ("STANDIN_FAIL_CUZK_DAEMON", "crash") if fail == "daemon-crash" else \
            (f"STANDIN_FAIL_{_FAIL_TARGET[fail_phase]}", fail)
        fails[fail_phase] = dict([knob])

    def daemon(log_source: str) -> dict[str, Any]:
        return {"name": "cuzk-daemon",
                "command": [py, "-m", "supervisor.prover.standins.cuzk_daemon", "-c", str(cuzk_toml)],
                "ready": f"http://127.0.0.1:{status}/status", "stop_signal": "SIGINT", "stop_grace_s": 5,
                "log_source": log_source}

    def phase(name: str, keys: dict[str, Any], *daemons: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, **keys, **({"env": fails[name]} if fails[name] else {}),
                **({"daemons": list(daemons)} if daemons else {})}

    curio_cmd = [py, "-m", "supervisor.prover.standins.curio", "run", "--listen", f"127.0.0.1:{curio}",
                 "--layers", "gpu"]
    if fail == "daemon-crash" and fail_phase == "curio":
        curio_cmd = _with_one_proof(curio_cmd, f"http://127.0.0.1:{listen}", c1)
    config: dict[str, Any] = {}
    if manager_url:
        config["manager"] = {"url": manager_url, "label": "C.demo", "min_rate": 50, **fault.manager}
    config["supervisor"] = {"state_dir": str(workdir / "state"), "log_dir": str(workdir / "logs"), "stop_grace_s": 3,
                            "env": env, **fault.supervisor}
    config.update(fault.tables)
    config["phases"] = [
        phase("paramfetch", {
            "kind": "oneshot", "command": [py, "-m", "supervisor.prover.standins.curio", "fetch-params", "32GiB"],
            "timeout_s": 60, "retries": 1, "backoff_s": 0.5, "stall_s": 5, "progress_path": str(workdir / "params"),
            "memory_max": DEMO_MEMORY_MAX, "report": "param-done", **fault.paramfetch}),
        phase("bench", {
            "kind": "oneshot", "command": [py, "-m", "supervisor.prover.standins.cuzk_bench", "-a",
                                           f"http://127.0.0.1:{listen}", "batch", "-t", "porep", "--c1", str(c1),
                                           "-c", "6", "-j", "3"],
            "timeout_s": 60, "memory_max": DEMO_MEMORY_MAX, "parse": "cuzk-bench", "report": "bench-done",
            "log_source": "benchout"}, daemon("benchdaemon")),
        phase("curio", {
            "kind": "service", "command": curio_cmd, "ready": f"tcp://127.0.0.1:{curio}", "restart": "on-failure",
            "restart_burst": 2, "backoff_s": 0.5, "stall_s": DEMO_SERVICE_STALL_S, "memory_max": DEMO_MEMORY_MAX,
            "report": "running", "log_source": "curio"}, daemon("cuzk")),
    ]
    return tomli_w.dumps(config)


def demo_workdir() -> Path:
    """The demo's directory, under the temporary directory ($TMPDIR, else tempfile's choice). Its state_dir holds
    the status socket, whose path a unix socket limits to 107 bytes: under a $TMPDIR too long for that (the demo
    refused with an error about supervisor.state_dir, a key the user never wrote), it goes under /tmp instead,
    and says so."""
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    try:
        check_state_dir(str(workdir / "state"), "the demo's state_dir")
    except ConfigError:
        workdir.rmdir()
        base, workdir = workdir.parent, Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX, dir=SHORT_TMP))
        say(f"demo: the temporary directory {shown(str(base), MAX_SHOWN_PATH)} ($TMPDIR) is too long for the status "
            f"socket of a state dir under it (a socket's path is at most {MAX_SOCKET_PATH_BYTES} bytes): the demo's "
            f"directory is under {SHORT_TMP} instead")
    return workdir


def _with_one_proof(curio_cmd: list[str], daemon_url: str, c1: Path) -> list[str]:
    """The stand-in curio sends its cuzk-daemon no work (the real one does, for its GPU tasks): for a daemon
    crash in production, one cuzk-bench proof sent beside curio stands in for that work."""
    proof = [sys.executable, "-m", "supervisor.prover.standins.cuzk_bench", "-a", daemon_url, "single", "-t", "porep",
             "--c1", str(c1)]
    script = f"{shlex.join(proof)} >/dev/null 2>&1 & exec {shlex.join(curio_cmd)}"
    return ["sh", "-c", script]


def demo_phase(fail: str | None, fail_phase: str | None) -> str:
    """The phase ``--fail`` plays in: ``--phase`` (default bench); production for a production fault."""
    if fail is None and fail_phase is not None:  # (it names where --fail plays: alone it was dropped without a word)
        raise DemoUsageError("--phase goes with --fail")
    if fail in PRODUCTION_FAULTS:
        if fail_phase not in (None, FAULT_PHASE):
            raise DemoUsageError(f"--fail {fail}: fails production (phase {FAULT_PHASE}), not phase {fail_phase} "
                                 f"(leave --phase out)")
        return FAULT_PHASE
    return fail_phase or DEFAULT_FAIL_PHASE


def status_command(prog: str, state_dir: str) -> str:
    """The command that shows the demo's state from another shell (cli.py ``status --state-dir``)."""
    return f"{prog} status --state-dir {shlex.quote(state_dir)}"


class Supervise(Protocol):
    """The supervisor's run (app/run.py's ``run``), handed in by the command line: the plugin sits below the
    composition root and never imports it."""

    def __call__(self, plan: Plan, plugin: Plugin, *,
                 on_start: Callable[[Lifecycle], None] | None = None) -> int: ...


def run_demo(supervise: Supervise, fail: str | None = None, fail_phase: str | None = None, keep: bool = False,
             prog: str = "prover-supervisor") -> int:
    """Run the demo lifecycle (``supervise``: the supervisor's run) against an in-process dev-manager, then show
    what the manager saw. It says first where its state is and the ``status`` command (of ``prog``, the CLI)
    that shows it from another shell."""
    try:
        phase = demo_phase(fail, fail_phase)
        if fail == "gpu":
            demo_gpu_count(os.environ)  # (refused before anything starts, the re-execution too)
    except DemoUsageError as exc:
        say(f"prover-supervisor demo: {exc}", err=True)
        return EXIT_USAGE
    if fail == "gpu" and not standin_nvml_first():
        if os.environ.get(REEXEC_ENV):  # re-executed already: never a loop of them
            say(f"prover-supervisor demo: --fail gpu: `import pynvml` does not find the stand-in in "
                f"{FAKENVML_DIR}, though it is first on PYTHONPATH", err=True)
            return EXIT_FAILURE
        reexec(["--fail", "gpu", *(["--keep"] if keep else [])])
    try:
        workdir = demo_workdir()
    except OSError as exc:
        say(f"prover-supervisor demo: cannot make its directory: {exc.strerror or exc}", err=True)
        return EXIT_FAILURE
    manager = DevManager(quiet=False, extension=DEV_FLEET).start()
    xid: XidAtProduction | None = None
    try:
        if fail == "gpu":
            xid = XidAtProduction(healthy_gpus(workdir), manager)
        try:
            text = demo_config(workdir, fail, phase, manager_url=manager.url)
        except DemoUsageError as exc:
            say(f"prover-supervisor demo: {exc}", err=True)
            return EXIT_USAGE
        plan = parse_plan(text, "demo config", {}, PLUGIN)
        if xid is not None:
            xid.start()
        watch = status_command(prog, plan.supervisor.state_dir)
        say(f"demo: state in {plan.supervisor.state_dir}: watch it from another shell with: {watch}")
        lifecycles: list[Lifecycle] = []
        status = supervise(plan, PLUGIN, on_start=lifecycles.append)
        seen = manager.state.snapshot()
        for inst in seen["instances"].values():
            say(f"demo: the manager saw {inst['label']} go {' → '.join(inst['history'])}"
                + (f" (rate {inst['rate']:g}/h)" if inst["rate"] is not None else ""))
        if fail in PRODUCTION_FAULTS:
            for line in outcome_lines(lifecycles[0].failure if lifecycles else None, manager):
                say(line)
        # Kept, the state still answers status (exit 3: the last state); removed, the command would find nothing.
        kept = f"; its last state: {watch}" if keep else f" (removed with its state; --keep keeps them for: {watch})"
        say(f"demo finished with exit status {status}; logs in {workdir / 'logs'}{kept}")
        return status
    finally:
        if xid is not None:
            xid.stop()
        manager.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------- the production faults (--fail gpu, --fail proofs)

PRODUCTION_FAULTS = ("gpu", "proofs")
# Where these faults are played: production is the curio phase.
FAULT_PHASE = "curio"
FAKENVML_DIR = fakenvml.DIRECTORY
CONTROL_ENV = "STANDIN_NVML_CONTROL"  # the stand-in pynvml's control file (fakenvml/pynvml.py)
# Set on the re-executed demo: the stand-in pynvml must now be what `import pynvml` finds (never a second exec).
REEXEC_ENV = "PROVER_DEMO_STANDIN_NVML"
DEMO_GPUS = 2  # where $GPU_COUNT (set by Vast.ai inside an instance) does not say how many
FATAL_XID = 79  # fallen off the bus
GPU_RECOVERY_ACTION = 2  # what the driver asks for after it (field 230): node reboot
# How often the Xid injector looks whether the manager has seen production running.
INJECT_POLL_S = 0.1
# --fail proofs: the production watch scaled down from the profile's minutes ($PROVER_WATCH_S,
# $PROVER_PROOF_FAILURES, $PROVER_PROOF_FAILURE_WINDOW_S) to the demo's seconds.
DEMO_WATCH_S = 0.3
DEMO_PROOF_FAILURES = 2
DEMO_PROOF_FAILURE_WINDOW_S = 30
# The curio stand-in's own run time in these modes: far past the fault, so that the fault ends production.
FAULT_RUN_SECONDS = 120.0


@dataclass(frozen=True)
class FaultConfig:
    """What a production fault adds to the demo's config, place by place."""

    supervisor: dict[str, Any] = field(default_factory=dict)  # keys of [supervisor]
    manager: dict[str, Any] = field(default_factory=dict)  # keys of [manager]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # whole tables, before the phases
    paramfetch: dict[str, Any] = field(default_factory=dict)  # keys of the paramfetch phase
    curio_env: dict[str, str] = field(default_factory=dict)


def fault_config(fail: str, cuzk_listen: int, cuzk_status: int, curio_port: int, param_cache: Path) -> FaultConfig:
    """The config a production fault needs. Both send the failure's verdict line with the give-up
    (``bench_done_reason``), so the manager's kill reason says what failed."""
    manager = {"bench_done_reason": True}
    if fail == "gpu":
        # The download uses no GPU (as in the profile); the bench and production do.
        return FaultConfig(supervisor={"require_gpus": True}, manager=manager, paramfetch={"gpu_health": False})
    tables: dict[str, dict[str, Any]] = {
        "cuzk": {"listen": f"127.0.0.1:{cuzk_listen}", "status_listen": f"127.0.0.1:{cuzk_status}",
                 "param_cache": str(param_cache)},
        "production": {"watch_s": DEMO_WATCH_S, "proof_failures": DEMO_PROOF_FAILURES,
                       "proof_failure_window_s": DEMO_PROOF_FAILURE_WINDOW_S,
                       "curio_metrics": f"http://127.0.0.1:{curio_port}/debug/metrics"}}
    return FaultConfig(manager=manager, tables=tables,
                       curio_env={"STANDIN_FAIL_PROOFS": "1", "CURIO_CUZK_ADDRESS": f"127.0.0.1:{cuzk_listen}"})


# ---------------------------------------------------------------- --fail gpu: the stand-in pynvml


def standin_nvml_first() -> bool:
    """Whether ``import pynvml`` here finds the stand-in (fakenvml/ first on sys.path)."""
    spec = importlib.util.find_spec("pynvml") if "pynvml" not in sys.modules else None
    origin = spec.origin if spec is not None else getattr(sys.modules.get("pynvml"), "__file__", None)
    return origin is not None and Path(origin).resolve().parent == FAKENVML_DIR


def reexec(argv: list[str]) -> NoReturn:
    """Run the demo again (``python -m supervisor demo ARGV``) with the stand-in pynvml first on PYTHONPATH:
    the supervisor's own GPU thread must import it, and nothing of the supervisor has started yet."""
    package_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (str(FAKENVML_DIR), package_root, os.environ.get("PYTHONPATH", "")) if p)
    say(f"demo: --fail gpu: running again with the stand-in pynvml first on PYTHONPATH ({FAKENVML_DIR})")
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, "PYTHONPATH": pythonpath, REEXEC_ENV: "1"}
    os.execve(sys.executable, [sys.executable, "-m", "supervisor", "demo", *argv], env)


def write_control(path: Path, **control: Any) -> None:
    """The stand-in's control file, replaced whole (fsynced, renamed: state/files.py): it reads it on every call,
    never half written."""
    write_atomically(path, json.dumps(control).encode())


def demo_gpu_count(environ: Mapping[str, str]) -> int:
    """As many stand-in GPUs as the machine says it has ($GPU_COUNT: fitness compares the two), else DEMO_GPUS.
    GPU_COUNT=0 is refused (DemoUsageError): the fault is an Xid on GPU 0, and with none there is no GPU to fail
    (with two, fitness found NVML's two against GPU_COUNT=0 and the fault never played)."""
    count = expected_gpu_count(environ)
    if count == 0:
        raise DemoUsageError(f"--fail gpu: {GPU_COUNT_ENV}=0 says this machine has no GPU, and the fault is an Xid on "
                             f"GPU 0 (unset {GPU_COUNT_ENV}, or set it to 1 or more)")
    return DEMO_GPUS if count is None else count


def healthy_gpus(workdir: Path) -> Path:
    """Idle GPUs in a control file, named in the environment the stand-in reads it from."""
    path = workdir / "nvml.json"
    write_control(path, **_gpus())
    os.environ[CONTROL_ENV] = str(path)
    return path


def _gpus() -> dict[str, Any]:
    return {"gpus": [{} for _ in range(demo_gpu_count(os.environ))], "recovery_action": GPU_RECOVERY_ACTION}


class XidAtProduction:
    """Once the manager has seen the instance ``running`` (production is up), Xid FATAL_XID on GPU 0."""

    def __init__(self, control: Path, manager: DevManager) -> None:
        self._control, self._manager = control, manager
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="demo-xid", daemon=True)

    def start(self) -> XidAtProduction:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _production_up(self) -> bool:
        state = self._manager.state
        with state.lock:
            return any(inst.state == "running" for inst in state.instances.values())

    def _watch(self) -> None:
        while not self._stop.wait(INJECT_POLL_S):
            if self._production_up():
                say(f"demo: the manager sees production running: GPU 0 now reports Xid {FATAL_XID} "
                    "(written to the stand-in pynvml's control file)")
                write_control(self._control, **_gpus(), xid=[{"gpu": 0, "xid": FATAL_XID}])
                return


# ---------------------------------------------------------------- the demo's last word


def outcome_lines(failure: Verdict | None, manager: DevManager) -> list[str]:
    """What failed production (or what failed before it could start), and what the manager did with the instance."""
    if failure is None:
        said = "demo: production did not fail"
    elif failure.phase == FAULT_PHASE:
        said = f"demo: production failed for good: phase {failure.phase} reason={failure.reason}: {failure.detail}"
    else:
        what = "the machine's fitness check" if failure.phase == FITNESS else f"phase {failure.phase}"
        said = f"demo: production never started: {what} failed first: reason={failure.reason}: {failure.detail}"
    lines = [said]
    for inst in manager.state.snapshot()["instances"].values():
        if inst["state"] == "killed":
            lines.append(f"demo: the instance was given up: the manager killed {inst['label']} "
                         f"({inst['kill_reason']})")
        else:
            lines.append(f"demo: the instance was not given up: {inst['label']} is {inst['state']} at the manager")
    return lines
