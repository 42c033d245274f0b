"""How many of the package's modules one child exit wakes (issue 24's measure), counted, not timed.

    python bench/wakes.py            # the figures and the ten busiest modules
    python bench/wakes.py --modules  # every module woken, with its calls

Runs the real supervisor (``python -m supervisor run``) on a one-phase config whose child exits 3, no
manager, with a ``sitecustomize`` on PYTHONPATH that puts a ``sys.setprofile`` hook on its main thread. From
the first call into the reaper (``Reaper.reap``: the child's exit reached the loop) to the process's exit it
counts the calls into ``supervisor/``: how many, how many modules they touch, the switches from one module
to another, and the A→B→A bounces (a call into B, then straight back into A). Prints one JSON line.
Counts repeat from run to run (they are the code's path, not the machine's speed), so they may be compared
across commits; docs/architecture.md keeps the figures. One count moves with the machine: the calls into
engine/trees.py, which reads every process of /proc once per look (so ``calls`` moves by a few dozen).

The supervisor measured runs in a memory cgroup of its own, made below this process's (``isolated`` in the
output): its exit reads the cgroups below its own, and another supervisor's phase cgroups there (a test of the
suite running beside it, in the same cgroup) would add a module and a bounce to the count. Where none can be
made (no root, no writable memory controller) it runs where it is, and ``isolated`` is false.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HOOK = textwrap.dedent("""
    import atexit, json, os, sys, threading

    _PKG = os.path.join({repo!r}, "supervisor") + os.sep
    _state = {{"on": False, "calls": 0, "modules": {{}}, "switches": 0, "bounces": 0, "trail": []}}

    def _module(code):
        path = code.co_filename
        return path[len(_PKG):] if path.startswith(_PKG) else None

    def _hook(frame, event, arg):
        if event != "call":
            return
        module = _module(frame.f_code)
        if module is None:
            return
        if not _state["on"]:
            if module != os.path.join("engine", "reaping.py") or frame.f_code.co_name != "reap":
                return
            _state["on"] = True
        _state["calls"] += 1
        _state["modules"][module] = _state["modules"].get(module, 0) + 1
        trail = _state["trail"]
        if trail and trail[-1] != module:
            _state["switches"] += 1
            if len(trail) >= 2 and trail[-2] == module:
                _state["bounces"] += 1
        if not trail or trail[-1] != module:
            trail.append(module)
            del trail[:-2]

    def _dump():
        out = os.environ.get("WAKES_OUT")
        if out:
            with open(out, "w") as fh:
                json.dump({{k: v for k, v in _state.items() if k != "trail"}}, fh)

    if threading.current_thread() is threading.main_thread() and os.environ.get("WAKES_OUT"):
        sys.setprofile(_hook)
        atexit.register(_dump)
""")


def own_memory_cgroup() -> Path | None:
    """A new, empty memory cgroup below this process's (cgroup v1's memory controller, else the v2 hierarchy);
    None where it cannot be made."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            parent = Path("/sys/fs/cgroup") / path.lstrip("/")
        else:
            continue
        try:
            (mine := parent / f"wakes-{os.getpid()}").mkdir()
        except OSError:
            return None
        return mine
    return None


def join(cgroup: Path | None) -> None:
    """In the child, before the exec: into the cgroup of the measure's own (a failure leaves it where it is)."""
    if cgroup is not None:
        with contextlib.suppress(OSError):
            (cgroup / "cgroup.procs").write_text("0")


def main() -> int:
    cgroup = own_memory_cgroup()
    try:
        return measure(cgroup)
    finally:
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def measure(cgroup: Path | None) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        site, out = Path(tmp) / "site", Path(tmp) / "wakes.json"
        site.mkdir()
        (site / "sitecustomize.py").write_text(HOOK.format(repo=str(REPO)))
        config = Path(tmp) / "config.toml"
        config.write_text(textwrap.dedent(f"""
            [supervisor]
            state_dir = "{tmp}/state"
            log_dir = "{tmp}/logs"

            [[phases]]
            name = "p"
            command = ["sh", "-c", "sleep 0.5; exit 3"]
            """))
        env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "WAKES_OUT": str(out)}
        env.pop("MANAGER_URL", None)
        run = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(config)], env=env,
                             capture_output=True, text=True, timeout=60, preexec_fn=lambda: join(cgroup))
        isolated = cgroup is not None and "memory evidence: per-phase mode" in run.stdout + run.stderr and \
            str(cgroup) in run.stdout + run.stderr
        if not out.exists():
            print(run.stdout[-2000:], run.stderr[-2000:], file=sys.stderr)
            return 1
        found = json.loads(out.read_text())
        modules = found.pop("modules")
        found.pop("on")
        shown = len(modules) if "--modules" in sys.argv[1:] else 10
        print(json.dumps({"exit_status": run.returncode, "isolated": isolated, **found, "modules_woken": len(modules),
                          "busiest": sorted(modules.items(), key=lambda kv: -kv[1])[:shown]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
