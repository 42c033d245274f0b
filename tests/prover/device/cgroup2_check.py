"""OOM verdicts on a real cgroup v2 hierarchy: one prepared check for a machine that mounts one (the device's does).

    python tests/prover/device/cgroup2_check.py

Run by hand as root, never by CI (pytest does not collect it: no test_ prefix; this machine's kernel mounts
cgroup v1, where tests/test_oom.py covers the same ground, and v2 is tested here against a cgroupfs-like
directory only). For each case it makes a fresh cgroup under the v2 root, starts the supervisor alone in it
(moved there between fork and exec, so nothing else is in it), and runs one oneshot phase whose child
allocates memory 32 MiB at a time, touching every page, until the kernel kills it:

- ``per-phase``: ``cgroups = "auto"`` and the phase's ``memory_max`` of 192 MiB: the supervisor must move itself
  into a leaf, enable ``+memory`` below, put the phase in a cgroup of its own and name the kill ``oom_killed``;
- ``shared``: ``cgroups = "shared"``, the case's cgroup itself limited to 384 MiB: one counter for all;
- ``crowded``: ``cgroups = "auto"`` where another process shares the supervisor's cgroup (as under Vast's
  onstart, beside sshd): cgroup v2 lets no cgroup with processes of its own have controllers below it, so it
  must fall back to shared mode, say why, and still name the kill (the cgroup limited to 384 MiB).

Each case prints the supervisor's exit status, its memory-evidence line, the verdict line and the cgroups
left behind; ``pass`` when the status is 137 and the verdict ``oom_killed``. Exit 0 when every case passed,
2 when there is no writable cgroup v2 memory controller here (said in one line).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROOT = Path("/sys/fs/cgroup")
LIMIT = 384 << 20

HOG = r"""
import sys, time
chunks = []
for step in range(1, 257):
    chunk = bytearray(32 << 20)
    for offset in range(0, len(chunk), 4096):
        chunk[offset] = 1
    chunks.append(chunk)
    print(f"hog: {step * 32} MiB", flush=True)
    time.sleep(0.02)
print("hog: never killed", flush=True)
"""


def v2_memory_root() -> str | None:
    """Why this machine cannot run the check, or None where it can."""
    if not (ROOT / "cgroup.controllers").exists():
        return f"no cgroup v2 at {ROOT}"
    if "memory" not in (ROOT / "cgroup.controllers").read_text().split():
        return "the v2 root has no memory controller"
    if "memory" not in (ROOT / "cgroup.subtree_control").read_text().split():
        try:
            (ROOT / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            return f"cannot enable +memory below {ROOT}: {exc.strerror}"
    return None


def config(tmp: Path, case: str, mode: str, memory_max: str | None) -> Path:
    script = tmp / "hog.py"
    script.write_text(HOG)
    path = tmp / f"{case}.toml"
    path.write_text(
        "[supervisor]\n"
        f'state_dir = "{tmp / case / "state"}"\n'
        f'log_dir = "{tmp / case / "logs"}"\n'
        f'cgroups = "{mode}"\n\n'
        "[[phases]]\n"
        'name = "hog"\n'
        f'command = ["{sys.executable}", "{script}"]\n'
        + (f'memory_max = "{memory_max}"\n' if memory_max else "")
        + "retries = 0\n")
    return path


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path.parent)) for p in [path, *path.rglob("*")] if p.is_dir())


def remove(path: Path) -> None:
    """Empty and remove a case's cgroup, the deepest first (its processes moved to the root)."""
    for leaf in sorted((p for p in [path, *path.rglob("*")] if p.is_dir()), key=lambda p: -len(p.parts)):
        for pid in (leaf / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (ROOT / "cgroup.procs").write_text(pid)
        try:
            leaf.rmdir()
        except OSError as exc:
            print(f"      could not remove {leaf}: {exc.strerror}")


def run_case(tmp: Path, case: str, mode: str, memory_max: str | None, limit: int | None, crowded: bool) -> bool:
    cgroup = ROOT / f"supervisor-check-{os.getpid()}-{case}"
    cgroup.mkdir()
    neighbour = None
    try:
        if limit is not None:
            (cgroup / "memory.max").write_text(str(limit))
            if (cgroup / "memory.swap.max").exists():
                (cgroup / "memory.swap.max").write_text("0")
        if crowded:
            neighbour = subprocess.Popen(["sleep", "120"],
                                         preexec_fn=lambda: (cgroup / "cgroup.procs").write_text("0"))
        path = config(tmp, case, mode, memory_max)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(path)], env=env,
                              cwd=tmp, capture_output=True, text=True, timeout=120,
                              preexec_fn=lambda: (cgroup / "cgroup.procs").write_text("0"))
        took = time.monotonic() - started
        out = proc.stdout + proc.stderr
        said = [line for line in out.splitlines() if "memory evidence" in line or "reason=" in line
                or "OOM KILL" in line or "cgroup" in line]
        ok = proc.returncode == 137 and any("reason=oom_killed" in line for line in said)
        print(f"{case:<9} exit {proc.returncode} after {took:.1f}s  {'pass' if ok else 'FAIL'}", flush=True)
        for line in said:
            print(f"      | {line[:260]}")
        if not ok:
            for line in out.splitlines()[-15:]:
                print(f"      > {line[:260]}")
        print(f"      cgroups after the run: {', '.join(tree(cgroup))}")
        return ok
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
        remove(cgroup)


def main() -> int:
    if os.geteuid() != 0:
        print("cgroup2_check: needs root (it makes cgroups)")
        return 2
    why = v2_memory_root()
    if why is not None:
        print(f"cgroup2_check: {why}: nothing to check on this machine")
        return 2
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["per-phase"] = run_case(Path(tmp), "per-phase", "auto", "192MiB", None, crowded=False)
        results["shared"] = run_case(Path(tmp), "shared", "shared", None, LIMIT, crowded=False)
        results["crowded"] = run_case(Path(tmp), "crowded", "auto", None, LIMIT, crowded=True)
    print("done: " + ", ".join(f"{case} {'pass' if ok else 'FAIL'}" for case, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
