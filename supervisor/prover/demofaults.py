"""The demo's production faults: ``--fail gpu`` (a GPU falls off the bus) and ``--fail proofs`` (every proof fails).

The other ``--fail`` modes make one stand-in program misbehave; these two break what production depends on
while every program keeps running, which only the supervisor's watches can see:

- ``gpu``: the supervisor process itself must import the stand-in ``pynvml`` (fakenvml/), so the demo
  re-executes itself with that directory first on ``PYTHONPATH`` before anything starts (``reexec``). Its
  control file gives the machine idle GPUs ($GPU_COUNT of them, else DEMO_GPUS), so ``require_gpus``
  (fitness) and ``gpu_health`` (production) are on; once the manager has seen the instance ``running``,
  ``XidAtProduction`` writes a fatal Xid (FATAL_XID) into it: production fails with ``gpu_fault``, is
  never restarted, and the instance is given up.
- ``proofs``: the curio phase's cuzk-daemon fails every proof (``STANDIN_FAIL_PROOFS=1``), curio sends it a
  PoRep every task interval (``CUZK_ADDR``), and the production watch reads the daemon's counters every
  DEMO_WATCH_S: production fails with ``proofs_failing``, is restarted under curio's restart policy, and
  once that is exhausted the instance is given up.

In both the curio stand-in runs far longer than the fault takes (FAULT_RUN_SECONDS): the fault ends production,
and the demo's last lines say which verdict did and what the manager did with the instance.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..devmanager.server import DevManager
from ..lifecycle.fitness import expected_gpu_count
from ..lifecycle.verdict import Verdict
from ..text.stdio import say
from .standins import fakenvml

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
    """What a production fault adds to the demo's TOML, place by place."""

    supervisor_keys: str = ""  # lines of [supervisor]
    manager_keys: str = ""  # lines of [manager]
    tables: str = ""  # whole tables, before the phases
    paramfetch_keys: str = ""  # lines of the paramfetch phase
    curio_env: dict[str, str] = field(default_factory=dict)


def fault_config(fail: str, cuzk_listen: int, cuzk_status: int, curio_port: int, param_cache: Path) -> FaultConfig:
    """The TOML a production fault needs. Both send the failure's verdict line with the give-up
    (``bench_done_reason``), so the manager's kill reason says what failed."""
    manager = "bench_done_reason = true\n"
    if fail == "gpu":
        # The download uses no GPU (as in the profile); the bench and production do.
        return FaultConfig(supervisor_keys="require_gpus = true\n", manager_keys=manager,
                           paramfetch_keys="gpu_health = false\n")
    tables = f"""
[cuzk]
listen = "http://127.0.0.1:{cuzk_listen}"
status_listen = "127.0.0.1:{cuzk_status}"
param_cache = {json.dumps(str(param_cache))}

[production]
watch_s = {DEMO_WATCH_S}
proof_failures = {DEMO_PROOF_FAILURES}
proof_failure_window_s = {DEMO_PROOF_FAILURE_WINDOW_S}
curio_metrics = "http://127.0.0.1:{curio_port}/debug/metrics"
"""
    return FaultConfig(manager_keys=manager, tables=tables,
                       curio_env={"STANDIN_FAIL_PROOFS": "1", "CUZK_ADDR": f"http://127.0.0.1:{cuzk_listen}"})


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
    """The stand-in's control file, replaced whole: it reads it on every call, never half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(control))
    os.replace(tmp, path)


def demo_gpu_count(environ: Mapping[str, str]) -> int:
    """As many stand-in GPUs as the machine says it has ($GPU_COUNT: fitness compares the two), else DEMO_GPUS."""
    return expected_gpu_count(environ) or DEMO_GPUS


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
    """What failed production, and what the manager did with the instance."""
    lines = [f"demo: production failed for good: phase {failure.phase} reason={failure.reason}: {failure.detail}"
             if failure is not None else "demo: production did not fail"]
    for inst in manager.state.snapshot()["instances"].values():
        if inst["state"] == "killed":
            lines.append(f"demo: the instance was given up: the manager killed {inst['label']} "
                         f"({inst['kill_reason']})")
        else:
            lines.append(f"demo: the instance was not given up: {inst['label']} is {inst['state']} at the manager")
    return lines
