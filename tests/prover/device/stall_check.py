"""Does the stall watch see a silent GPU worker as alive, through the real NVML? One prepared device check.

    python tests/prover/device/stall_check.py [--busy-s 25] [--stall-s 8]

Run by hand, never by CI (pytest does not collect it: no test_ prefix). It runs the supervisor itself, as a
process with a config of one oneshot phase and ``stall_s``, twice:

- ``busy``: the child prints nothing and, once started, reads and writes nothing either; it multiplies
  matrices on GPU 0 for ``--busy-s`` seconds (PyTorch), then exits 0. The GPU's utilisation is its only sign of
  life, so the run must end 0, not stalled. Halfway through, ``prover-supervisor status`` is asked what runs.
- ``idle``: the child sleeps silently as long; nothing moves on the GPU. The run must end 124 (stalled).

Each run prints its exit status, how long it took, the phase's verdict from status.json and the supervisor's
log lines about the stall and the GPU; then ``pass`` or ``FAIL`` against what is expected. Exit 0 when both
came out as expected.

Without PyTorch or a GPU the busy child says so and, where the stand-in pynvml is in use
(``$STANDIN_NVML_CONTROL``), plays the GPU's part by writing a utilisation into its control file: that is
how this script is checked before a device session spends its minutes on it
(tests/prover/test_device_script.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# The busy child: silent on every channel the stall watch reads but the GPU. Imports (file reads) come first,
# then a pause longer than nothing, then only GPU work.
BUSY_CHILD = r"""
import json, os, sys, time
seconds = float(sys.argv[1])
try:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
except Exception as exc:
    control = os.environ.get("STANDIN_NVML_CONTROL")
    if not control:
        print(f"busy child: no GPU work possible: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
    # The stand-in pynvml's GPU shows the utilisation this file says (read on every call).
    with open(control, "w") as f:
        json.dump({"gpus": [{"utilization": 97}]}, f)
    time.sleep(seconds)
    with open(control, "w") as f:
        json.dump({"gpus": [{"utilization": 0}]}, f)
"""

IDLE_CHILD = "import sys, time; time.sleep(float(sys.argv[1]))"


def config(tmp: Path, name: str, child: str, seconds: float, stall_s: float) -> Path:
    script = tmp / f"{name}.py"
    script.write_text(child)
    path = tmp / f"{name}.toml"
    path.write_text(
        "[supervisor]\n"
        f'state_dir = "{tmp / name / "state"}"\n'
        f'log_dir = "{tmp / name / "logs"}"\n'
        "require_gpus = true\n\n"
        "[[phases]]\n"
        f'name = "{name}"\n'
        f'command = ["{sys.executable}", "{script}", "{seconds:g}"]\n'
        f"stall_s = {stall_s:g}\n"
        "retries = 0\n")
    return path


def supervisor(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", *args]


def run_one(tmp: Path, name: str, child: str, seconds: float, stall_s: float, expect: int) -> bool:
    path = config(tmp, name, child, seconds, stall_s)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    proc = subprocess.Popen(supervisor("run", "--config", str(path)), env=env, cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    status_text = ""
    if name == "busy":  # what `status` says of a silent child whose GPU works
        time.sleep(min(seconds / 2, stall_s * 1.5))
        asked = subprocess.run(supervisor("status", "--config", str(path)), env=env, capture_output=True,
                               text=True, timeout=30)
        status_text = asked.stdout + asked.stderr
    out, _ = proc.communicate(timeout=seconds + stall_s + 120)
    took = time.monotonic() - started
    verdict = "?"
    status_file = tmp / name / "state" / "status.json"
    if status_file.exists():
        snapshot = json.loads(status_file.read_text())
        phase = next((p for p in snapshot.get("phases", []) if p.get("name") == name), {})
        verdict = json.dumps(phase.get("verdict") or phase.get("state"))[:300]
    ok = proc.returncode == expect
    print(f"{name:<5} exit {proc.returncode} (expected {expect}) after {took:.1f}s  "
          f"{'pass' if ok else 'FAIL'}", flush=True)
    print(f"      verdict: {verdict}")
    for line in out.splitlines():
        if any(word in line for word in ("stall", "GPU", "gpu", "NVML", "exited", "ended", "busy child")):
            print(f"      | {line[:220]}")
    for line in status_text.splitlines():
        print(f"      status> {line[:220]}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-s", type=float, default=25.0, help="how long each child runs")
    parser.add_argument("--stall-s", type=float, default=8.0, help="the phase's stall_s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        busy = run_one(Path(tmp), "busy", BUSY_CHILD, args.busy_s, args.stall_s, expect=0)
        idle = run_one(Path(tmp), "idle", IDLE_CHILD, args.busy_s, args.stall_s, expect=124)
    print(f"done: busy {'pass' if busy else 'FAIL'}, idle {'pass' if idle else 'FAIL'}")
    return 0 if busy and idle else 1


if __name__ == "__main__":
    sys.exit(main())
