"""What the I/O thread costs (issue 21): reading /proc/<pid>/io for a tree of 200 processes once a second.

    python bench/iosample.py [--procs 200] [--seconds 30] [--allocators aria2c]

Starts a tree of real processes (one shell that starts ``--procs`` - 1 ``sleep`` children, all carrying one
tag, as a phase's child does), has ``IoProbe`` read it every IO_SAMPLE_S for ``--seconds``, and measures the
CPU the whole benchmark process used meanwhile (its main thread only sleeps: the rest is the I/O thread) as a
percentage of one core, and the time a full reading of the tree takes (the whole ProcessTable scan, done every
TREE_REFRESH_S, + every ``/proc/<pid>/io``). ``--allocators``: the watch names allocating downloaders, as a
download phase's does (the prover registers aria2c): between two whole scans the table is brought up to date at
every reading then (ProcessTable.reading: the listing of /proc and the stats of the processes new since), and an
allocator's open files are read; ``update_ms`` times one such reading (the update + every ``/proc/<pid>/io``).
``machine_procs``: the processes of the whole machine, which a whole scan reads. Prints one JSON line;
docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.engine.trees import TAG_ENV, ProcessTable
from supervisor.evidence.iowatch import IO_SAMPLE_S, IoProbe

TAG = "bench.io"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--allocators", action="append", default=[])
    args = parser.parse_args()
    script = f"for i in $(seq {args.procs - 1}); do sleep 600 & done; wait"
    tree = subprocess.Popen(["sh", "-c", script], env={**os.environ, TAG_ENV: TAG}, start_new_session=True)
    try:
        table = ProcessTable()
        deadline = time.monotonic() + 30
        while len(table.snapshot(newer_than=time.monotonic()).tree(tree.pid, TAG)) < args.procs:
            if time.monotonic() > deadline:
                raise SystemExit("the tree did not come up")
            time.sleep(0.1)
        probe = IoProbe()
        watch = probe.watch(IO_SAMPLE_S, allocators=frozenset(args.allocators))
        watch.follow([(tree.pid, TAG)])
        time.sleep(1.5)  # the first reading (the tags of 200 new processes are read once)
        before_cpu, before = cpu_s(), time.monotonic()
        first = watch.latest()
        time.sleep(args.seconds)
        used, wall = cpu_s() - before_cpu, time.monotonic() - before
        last = watch.latest()
        rounds = (last.seq - first.seq) if first is not None and last is not None else 0
        probe.close()
        # One reading alone, timed in this thread, with a fresh table each time as the thread's is warm.
        timings = []
        from supervisor.evidence.iowatch import _Reader  # the thread's own round, timed here

        for _ in range(20):
            started = time.perf_counter()
            snapshot = table.snapshot(newer_than=time.monotonic())
            _Reader("/proc").trees(snapshot.tree, ((tree.pid, TAG),))
            timings.append((time.perf_counter() - started) * 1000)
        timings.sort()
        # One reading between two whole scans, as an allocators' watch takes it: the table brought up to date.
        follower = ProcessTable(zombies=True)
        follower.snapshot()
        updates = []
        for _ in range(20):
            started = time.perf_counter()
            snapshot = follower.reading(math.inf, newcomers=True)  # (never a whole scan: the updates alone)
            _Reader("/proc").trees(snapshot.tree, ((tree.pid, TAG),), frozenset(args.allocators))
            updates.append((time.perf_counter() - started) * 1000)
        updates.sort()
        print(json.dumps({
            "procs": last.procs if last is not None else None,
            "allocators": sorted(args.allocators),
            "seconds": round(wall, 1),
            "rounds": rounds,
            "cpu_percent_of_one_core": round(100 * used / wall, 3),
            "full_scan_ms_p50": round(timings[len(timings) // 2], 2),
            "full_scan_ms_max": round(timings[-1], 2),
            "update_ms_p50": round(updates[len(updates) // 2], 2),
            "update_ms_max": round(updates[-1], 2),
            # (a whole scan reads every process of the machine: its cost grows with them, an update's hardly)
            "machine_procs": sum(name.isdigit() for name in os.listdir("/proc")),
        }))
    finally:
        os.killpg(tree.pid, signal.SIGKILL)
        tree.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
