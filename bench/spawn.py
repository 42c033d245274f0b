"""How long the loop is held by one start: ``spawn()`` called → the Child returned (its exec confirmed).

    python bench/spawn.py                   # this checkout
    python bench/spawn.py /path/to/checkout # this checkout and another, taking turns

Starts ``/bin/true`` RUNS times in-process (the supervisor's own spawn, with its child_setup) and prints the
p50 and p90 in ms, one line a checkout; the first WARMUP runs are left out. Before engine/spawn.py (git
5107fd7 and earlier) the same call was ``subprocess.Popen`` with a preexec_fn; bench/notes.md has both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS, WARMUP = 300, 20

MEASURE = """
import os, signal, sys, time
from supervisor.config import ChildSpec
try:
    from supervisor.engine.spawn import child_setup, spawn
except ImportError:  # before engine/spawn.py
    from supervisor.engine.process import child_setup, spawn
spec = ChildSpec("p", "p", ("/bin/true",), {{}}, None, signal.SIGTERM, 1.0, None, 1.0)
took = []
for _ in range({runs}):
    began = time.perf_counter()
    child = spawn(spec, {{"PATH": "/usr/bin:/bin"}}, None, child_setup(None, None))
    took.append(time.perf_counter() - began)
    os.waitpid(child.pid, 0)
    for fd in (getattr(child, "pipes", None) or {{}}).values():
        os.close(fd)
took = sorted(took[{warmup}:])
print(f"p50 {{took[len(took) // 2] * 1e3:.3f}} ms, p90 {{took[int(len(took) * 0.9)] * 1e3:.3f}} ms")
"""


def measure(checkout: Path) -> str:
    done = subprocess.run([sys.executable, "-c", MEASURE.format(runs=RUNS, warmup=WARMUP)], cwd=checkout,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(checkout)})
    return done.stdout.strip() or done.stderr.strip()[-400:]


def main(argv: list[str]) -> int:
    checkouts = [REPO, *(Path(a).resolve() for a in argv)]
    for _ in range(2):  # taking turns: the machine's load falls on each alike
        for checkout in checkouts:
            print(f"{checkout}: {measure(checkout)}", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
