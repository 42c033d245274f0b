"""The real NVML through the project's own code, on a machine with a GPU: one short, prepared check (issue 21).

    python tests/prover/device/nvml_check.py [--event-wait-s 5]

Run by hand, never by CI (pytest does not collect it: no test_ prefix). On a machine with a GPU it opens
NVML the way the supervisor does (``supervisor.evidence.gpu``), takes the inventory the fitness check reads, samples
utilisation and memory twice, registers for Xid events and waits one bounded event period, runs the
fitness check of the built-in profile against what it found, and generates cuzk.toml from those samples.
Each step prints one line with its time (ms) and what it found; a step that raised prints its error and
the others still run. Every step is bounded (a thread and a join with a timeout): a hung driver shows as
a step that did not return, never as a hung check. Exit 0 when every step ran, 1 when one failed or hung.

Where there is no GPU it says so (``no GPU: …``) after the first step and still runs the fitness and
cuzk.toml steps on "no GPU". With the stand-in pynvml first on PYTHONPATH
(``PYTHONPATH=supervisor/prover/standins/fakenvml``) every step runs here, which is how this script is
checked before a device session spends its minutes on it (tests/prover/test_device_script.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from supervisor.config import load_plan
from supervisor.evidence import gpu, gpuevents  # (the repository's own code, wherever the script is run from)
from supervisor.evidence.cgroups import mem_total
from supervisor.lifecycle.fitness import Evidence, assess, expected_gpu_count
from supervisor.prover.configkeys import cuzk_settings
from supervisor.prover.cuzkconf import DoesNotFit, generate
from supervisor.prover.plugin import PLUGIN

STEP_BOUND_S = 30.0
failed: list[str] = []


def call(name: str, index: int | None, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)  # the GPU thread's caller times each call; here the whole step is bounded instead


def step(name: str, work: Callable[[], str], bound_s: float = STEP_BOUND_S) -> None:
    """Run ``work`` on a thread for at most ``bound_s``; print its line: name, ms, what it said."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["said"] = work()
        except Exception as exc:  # the check reports every failure and goes on
            result["error"] = f"{type(exc).__name__}: {exc}"

    started = time.monotonic()
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(bound_s)
    took = (time.monotonic() - started) * 1000
    if thread.is_alive():
        failed.append(name)
        print(f"{name:<10} {took:9.1f} ms  HUNG: did not return within {bound_s:g}s", flush=True)
    elif "error" in result:
        failed.append(name)
        print(f"{name:<10} {took:9.1f} ms  FAILED: {result['error']}", flush=True)
    else:
        print(f"{name:<10} {took:9.1f} ms  {result['said']}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--event-wait-s", type=float, default=5.0, help="how long to wait for an Xid event")
    args = parser.parse_args()
    found: dict[str, Any] = {"nvml": None, "why": "not opened", "samples": (), "inventory": None}
    print(f"{'step':<10} {'time':>12}  found", flush=True)

    def open_nvml() -> str:
        found["nvml"], found["why"] = gpu.open_nvml(call)
        nvml = found["nvml"]
        names = ", ".join(f"{i}: {n or '?'}" for i, n in enumerate(nvml.names)) if nvml is not None else ""
        return f"{found['why']}" + (f" [{names}]" if names else "")

    def inventory() -> str:
        inv = gpu.inventory_of(found["nvml"], found["why"], call)
        found["inventory"] = inv
        if not inv.nvml:
            return inv.why
        return "; ".join(f"GPU {d.index} {d.name}: used={d.memory_used} total={d.memory_total} "
                         f"compute_procs={d.processes}" + (f" error={d.error}" if d.error else "")
                         for d in inv.devices) or inv.why

    def sample(label: str) -> Callable[[], str]:
        def take() -> str:
            if found["nvml"] is None:
                return "no GPU: nothing to sample"
            bad: list[str] = []
            samples = gpu.sample_all(found["nvml"], call, bad=lambda index, why: bad.append(f"GPU {index}: {why}"))
            found["samples"] = samples
            said = [f"GPU {s.index} util={s.utilization}% used={s.memory_used} of {s.memory_total}" for s in samples]
            return f"{label}: " + "; ".join([*said, *(f"no reading: {b}" for b in bad)])
        return take

    def events() -> str:
        if found["nvml"] is None:
            return "no GPU: no events to register for"
        handle, why = gpuevents.open_events(found["nvml"], call)
        if handle is None:
            return f"not registered: {why}"
        fault = gpuevents.wait_event(found["nvml"], handle, int(args.event_wait_s * 1000), call)
        return f"registered ({why}); waited {args.event_wait_s:g}s: " + (fault.describe() if fault else "no event")

    def fitness() -> str:
        plan = load_plan(None, PLUGIN, environ=os.environ)
        evidence = Evidence(available_memory=mem_total(), disks=(), gpus=found["inventory"],
                            gpu_count_expected=expected_gpu_count(os.environ))
        findings = assess(plan, evidence, PLUGIN.fitness)
        return "fit" if not findings else "; ".join(f"{f.reason}: {f.detail}" for f in findings)

    def cuzk_toml() -> str:
        plan = load_plan(None, PLUGIN, environ=os.environ)
        settings = cuzk_settings(plan.sections, "cuzk-config")
        try:
            made = generate(settings, mem_total() or 0, list(found["samples"]))
        except DoesNotFit as exc:
            return f"does not fit this machine: {exc}"
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cuzk.toml"
            path.write_text(made.text)
            devices = tomllib.loads(path.read_text()).get("gpus", {}).get("devices", "?")  # (tomli-w folds lists)
            return f"{len(made.text)} bytes; devices = {devices}; {made.summary()}"

    step("open", open_nvml)
    step("inventory", inventory)
    step("sample", sample("first"))
    step("sample2", sample("second"))
    step("events", events, bound_s=args.event_wait_s + STEP_BOUND_S)
    step("fitness", fitness)
    step("cuzk.toml", cuzk_toml)
    print(f"done: {7 - len(failed)} of 7 steps ran" + (f"; failed or hung: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
