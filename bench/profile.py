#!/usr/bin/env python3
"""Where ours spends its time on the paths the benchmarks found slow.

    python bench/profile.py [sigterm|side|side16|exit|lastexit|startup|logs|rss|feed|feedpatch|equiv ...]
                                                       # default: all of them but side16
    PROFILE_AGAINST=REV python bench/profile.py side   # ours now and at git REV, side by side
    PROFILE_AGAINST=REV python bench/profile.py side16 # the same for figures 1a and 6

Not part of `bench/run.py`. Runs prover-supervisor as the benchmarks do, but
through bench/probe.py, which puts timing probes around named functions (no
change to supervisor/), or under py-spy (installed from PyPI into the bench
venv, $BENCH_VENV, default /tmp/bench-venv). Prints a summary per scenario and
writes the raw data under bench/out/profile/.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench


def boot() -> None:
    bench.bootstrap(sys.argv[1:], script=__file__)  # re-runs this file under the bench venv


OUT = bench.OUT_DIR / "profile"
PROBE = str(Path(__file__).resolve().with_name("probe.py"))


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1000:.2f} ms"


def probe_run(argv: list[str], probes: list[str], events_path: Path, console: bool = False,
              **popen) -> subprocess.Popen:
    env = {**os.environ, "PROBE_OUT": str(events_path), "PROBES": ",".join(probes),
           "PROBE_CONSOLE": "1" if console else "0"}
    return subprocess.Popen([OURS_PY, PROBE, *argv], env=env, cwd=bench.SRC, stdin=subprocess.DEVNULL, **popen)


def events(path: Path) -> list[tuple[str, float]]:
    try:
        return [(k, t) for k, t in json.loads(path.read_text())]
    except (OSError, ValueError):
        return []


def cfg_args(tool: bench.Ours, child: list[str], tag: str, **kw) -> list[str]:
    argv = tool.wrap(child, tag, **kw)
    return argv[argv.index("run"):]  # "run --config F"


# ---------------------------------------------------------------------- SIGTERM


def sources() -> dict[str, Path]:
    """Which versions of ours run side by side: the snapshot the run took, and with $PROFILE_AGAINST=REV
    (a git revision) that revision's supervisor/ too, so that a change is measured against what it
    changes in the same run, on the same load."""
    out = {"ours": bench.SRC}
    rev = os.environ.get("PROFILE_AGAINST")
    if rev:
        alt = bench.WORK / f"src-{rev}"
        if not alt.exists():
            alt.mkdir()
            archive = subprocess.run(["git", "-C", str(bench.REPO), "archive", rev, "supervisor"], check=True,
                                     stdout=subprocess.PIPE).stdout
            subprocess.run(["tar", "-x", "-C", str(alt)], input=archive, check=True)
            bench.compile_bytecode(alt / "supervisor")
        out[f"ours@{rev}"] = alt
    return out


def side_by_side(tool: bench.Ours, label: str, src: Path | None, child: list[str], tag: str,
                 **kw) -> subprocess.Popen:
    """One supervisor: ours (from ``src``) as the benchmarks run it, no probes, or tini or dumb-init."""
    if src is None:
        wrapper = bench.Tini() if label == "tini" else bench.DumbInit()
        return subprocess.Popen(wrapper.wrap(child, tag), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    return subprocess.Popen(tool.wrap(child, tag, **kw), cwd=src, env={**os.environ, "PYTHONPATH": str(src)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def prof_side(tool: bench.Ours, runs: int) -> dict:
    """bench/run.py's figures 2 (SIGTERM -> the child's handler) and 7 (the child's exit -> the supervisor's
    exit), no probes, every version of ours (``sources``), tini and dumb-init taking turns run by run: on a
    shared machine, only figures taken side by side compare."""
    labels: dict[str, Path | None] = {**sources(), "tini": None, "dumb-init": None}
    term: dict[str, list[float]] = {k: [] for k in labels}
    last: dict[str, list[float]] = {k: [] for k in labels}
    for i in range(runs + bench.WARMUP):
        for label, src in labels.items():
            key = label.replace("@", "-")
            stamp, ready = bench.WORK / f"p2b-{key}-{i}", bench.WORK / f"p2b-{key}-{i}.ready"
            p = side_by_side(tool, label, src, [bench.HELPER, "term", str(stamp), str(ready)], "w2")
            bench.wait_for(ready.exists, 20)
            time.sleep(random.uniform(0.03, 0.06))  # as bench/run.py: settled into the idle wait
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            got = bench.wait_for(lambda stamp=stamp: bench.read_stamps(stamp), 10, 0.001)
            p.wait(15)
            if got and i >= bench.WARMUP:
                term[label].append(float(got[0][1]) - t0)
            stamps = bench.WORK / f"p7b-{key}-{i}"
            p = side_by_side(tool, label, src, [bench.HELPER, "exit", str(stamps), "150", "250", "0"],
                             f"last-{i}", kind="oneshot")
            os.waitpid(p.pid, 0)  # blocking: Popen.wait with a timeout polls
            t = time.monotonic()
            p.returncode = 0
            st = bench.read_stamps(stamps)
            if st and i >= bench.WARMUP:
                last[label].append(t - float(st[-1][1]))
            shutil.rmtree(bench.DISK / f"ours-last-{i}", ignore_errors=True)
            shutil.rmtree(bench.WORK / f"ours-last-{i}", ignore_errors=True)

    def fig(v: list[float]) -> dict:
        return {"p50_ms": round(bench.pct(v, 50) * 1000, 3), "p99_ms": round(bench.pct(v, 99) * 1000, 3),
                "n": len(v)} if v else {}

    return {"sigterm": {k: fig(v) for k, v in term.items()}, "after_exit": {k: fig(v) for k, v in last.items()},
            "load_after": os.getloadavg()}


class _As:
    """Run what bench/run.py starts (it starts ours with the process's cwd and environment) from ``src``."""

    def __init__(self, src: Path | None) -> None:
        self.src = src

    def __enter__(self):
        if self.src is not None:
            self.cwd, self.pp = os.getcwd(), os.environ.get("PYTHONPATH")
            os.chdir(self.src)
            os.environ["PYTHONPATH"] = str(self.src)
        return self

    def __exit__(self, *exc):
        if self.src is not None:
            os.chdir(self.cwd)
            if self.pp is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = self.pp


def prof_side16(tool: bench.Ours, exit_runs: int = 80, start_runs: int = 30, block: int = 10) -> dict:
    """bench/run.py's figures 1a (the child's exit -> reaped & classified, no grandchild) and 6 (exec of the
    supervisor -> the first child's exec), by bench/run.py's own functions, no probes, every version of ours
    (``sources``), tini and dumb-init taking turns: 1a in blocks of ``block`` runs (ours restarts its child in one
    process, as bench/run.py measures it; each block drops its first WARMUP runs), the order rotated each
    round; 6 run by run."""
    labels: dict[str, Path | None] = {**sources(), "tini": None, "dumb-init": None}
    order = list(labels)
    tools: dict[str, bench.Tool] = {}
    for label in order:
        t = bench.Tini() if label == "tini" else bench.DumbInit() if label == "dumb-init" else bench.Ours(tool.python)
        if isinstance(t, bench.Ours):
            t.extra = dict(tool.extra)
        tools[label] = t
    exits: dict[str, list[float]] = {k: [] for k in labels}
    for r in range(-(-exit_runs // block)):
        for label in order[r % len(order):] + order[:r % len(order)]:
            t, src = tools[label], labels[label]
            t.name = f"{label.replace('@', '-')}-r{r}"  # the stamps file's name: one per block
            with _As(src):
                if isinstance(t, bench.Ours):
                    shutil.rmtree(bench.DISK / "ours-w1", ignore_errors=True)
                    shutil.rmtree(bench.WORK / "ours-w1", ignore_errors=True)
                    exits[label] += bench.w1_restarting(t, block, 0.0, timeout=30 + block * 0.5)
                else:
                    exits[label] += bench.w1_fresh(t, block, 0.0)
    first: dict[str, list[float]] = {k: [] for k in labels}
    for i in range(start_runs + bench.WARMUP):
        for label in order[i % len(order):] + order[:i % len(order)]:
            t, src = tools[label], labels[label]
            stamps = bench.WORK / f"w6s-{label.replace('@', '-')}-{i}"
            with _As(src):  # as bench_first_child, one run
                p = subprocess.Popen([bench.HELPER, "stampexec", str(stamps),
                                      *t.wrap([bench.HELPER, "start", str(stamps)], "first")],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            got = bench.wait_for(lambda stamps=stamps: len(bench.read_stamps(stamps)) >= 2
                                 and bench.read_stamps(stamps), 20, 0.001)
            if got and i >= bench.WARMUP:
                t_exec = float(dict(got)["exec"])
                t_child = float(next(v for k, v in got if k.isdigit()))
                first[label].append(t_child - t_exec)
            bench.stop(p, graceful=True, timeout=10)
            shutil.rmtree(bench.DISK / "ours-first", ignore_errors=True)

    def fig(v: list[float]) -> dict:
        return {"p50_ms": round(bench.pct(v, 50) * 1000, 3), "p99_ms": round(bench.pct(v, 99) * 1000, 3),
                "n": len(v)} if v else {}

    return {"exit_1a": {k: fig(v) for k, v in exits.items()}, "first_child_6": {k: fig(v) for k, v in first.items()},
            "load_before": LOAD_BEFORE, "load_after": os.getloadavg()}


def prof_sigterm(tool: bench.Ours, runs: int) -> dict:
    probes = ["supervisor.engine.signals:SignalRouter.handle", "supervisor.lifecycle.lifecycle:Lifecycle.shutdown",
              "supervisor.engine.trees:ProcessTable._read", "supervisor.engine.process:Child.stop", "os:killpg",
              "supervisor.status.file:persist", "supervisor.engine.logs:SupervisorLog.__call__"]
    rows = []
    for i in range(runs):
        stamp, ready, ev = bench.WORK / f"p2-{i}", bench.WORK / f"p2-{i}.ready", bench.WORK / f"p2-{i}.json"
        for f in (stamp, ready, ev):
            f.unlink(missing_ok=True)
        p = probe_run(cfg_args(tool, [bench.HELPER, "term", str(stamp), str(ready)], "w2"), probes, ev,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bench.wait_for(ready.exists, 20)
        time.sleep(0.075)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        got = bench.wait_for(lambda stamp=stamp: bench.read_stamps(stamp), 10, 0.001)
        p.wait(15)
        evs = [(k, t) for k, t in events(ev) if t >= t0]
        if not got or not evs:
            continue
        t_h = float(got[0][1])

        def first(name, evs=evs):
            return next((t for k, t in evs if k == name), None)

        kill = first("os.killpg:in")
        before = [(k, t) for k, t in evs if kill is None or t <= kill]

        def spent(name, before=before):
            ins = [t for k, t in before if k == name + ":in"]
            outs = [t for k, t in before if k == name + ":out"]
            return sum(o - i for i, o in zip(ins, outs, strict=False)), len(ins)

        tree_s, tree_n = spent("trees.ProcessTable._read")
        persist_s, persist_n = spent("file.persist")
        log_s, log_n = spent("logs.SupervisorLog.__call__")
        rows.append({"wake": first("signals.SignalRouter.handle:in") - t0, "to_killpg": (kill or t_h) - t0,
                     "handler": t_h - t0, "table_read_before_kill": tree_s, "table_read_calls": tree_n,
                     "persist_before_kill": persist_s, "persist_calls": persist_n,
                     "log_before_kill": log_s, "log_calls": log_n, "killpg_to_handler": t_h - (kill or t_h)})
    (OUT / "sigterm.json").write_text(json.dumps(rows, indent=1))
    keys = rows[0].keys() if rows else []
    return {k: med([r[k] for r in rows]) for k in keys} | {"runs": len(rows)}


# ---------------------------------------------------------------------- exit -> verdict


def prof_exit(tool: bench.Ours, runs: int) -> dict:
    probes = ["supervisor.engine.reaping:Reaper.reap", "supervisor.lifecycle.phase:Phase._child_exited",
              "supervisor.engine.process:Child.drain_output", "supervisor.evidence.memory:MemoryEvidence.report",
              "supervisor.lifecycle.verdict:VerdictRecord.record", "supervisor.status.file:persist",
              "supervisor.engine.trees:ProcessTable._read"]
    stamps, ev = bench.WORK / "p1", bench.WORK / "p1.json"
    lines: list[tuple[bytes, float]] = []
    r, w = os.pipe()
    p = probe_run(cfg_args(tool, [bench.HELPER, "exit", str(stamps), "20", "60", "0"], "w1", restart=True), probes, ev,
                  console=True, stdout=w, stderr=w)
    os.close(w)
    watcher = bench.LineWatcher(r, lambda line, t: lines.append((line, t)) if b"ended: phase=w1" in line else None)
    watcher.start()
    bench.wait_for(lambda: len(lines) >= runs + 2, 120, 0.05)
    p.send_signal(signal.SIGTERM)
    p.wait(20)
    watcher.join(5)
    evs = events(ev)
    by_pid = {int(k): float(v) for k, v in bench.read_stamps(stamps) if k.isdigit()}
    import re

    rows = []
    for line, t_read in lines[2:]:
        pid = int(re.search(rb"pid=(\d+)", line).group(1))
        t_c = by_pid.get(pid)
        if t_c is None:
            continue
        after = [(k, t) for k, t in evs if t >= t_c]

        def first(name, after=after):
            return next((t for k, t in after if k == name), None)

        ex_in, ex_out = first("phase.Phase._child_exited:in"), first("phase.Phase._child_exited:out")
        rec_in = first("verdict.VerdictRecord.record:in")
        written = first("console_verdict_written")
        inside = [(k, t) for k, t in after if ex_in and ex_out and ex_in <= t <= ex_out]

        def spent(name, inside=inside):
            ins = [t for k, t in inside if k == name + ":in"]
            outs = [t for k, t in inside if k == name + ":out"]
            return sum(o - i for i, o in zip(ins, outs, strict=False))

        rows.append({"to_reap": first("reaping.Reaper.reap:in") - t_c, "to_child_exited": ex_in - t_c,
                     "drain_output": spent("process.Child.drain_output"),
                     "memory_report": spent("memory.MemoryEvidence.report"),
                     "to_record": rec_in - t_c, "console_written": (written or t_read) - t_c,
                     "bench_read": t_read - t_c, "persist_in_exit_path": spent("file.persist"),
                     "child_exited_total": ex_out - ex_in})
    (OUT / "exit.json").write_text(json.dumps(rows, indent=1))
    keys = rows[0].keys() if rows else []
    return {k: med([r[k] for r in rows]) for k in keys} | {"runs": len(rows)}


# ---------------------------------------------------------------------- the child's exit -> the supervisor's exit

LASTEXIT_STEPS = [  # (probe, what it is); teardown.py's steps in their order, and what comes before them
    ("supervisor.engine.reaping:Reaper.reap", "the reaper"),
    ("supervisor.lifecycle.phase:Phase._child_exited", "the phase's verdict"),
    ("supervisor.evidence.memory:MemoryEvidence.report", "the cgroup's OOM counter and peak"),
    ("supervisor.engine.trees:ProcessTable._read", "a /proc scan (the attempt's tree)"),
    ("supervisor.status.file:persist", "status.json written and fsynced"),
    ("supervisor.app.run:serve", "the loop, until the lifecycle is over"),
    ("supervisor.app.teardown:tear_down", "the teardown, whole"),
    ("supervisor.app.teardown:sweep_descendants", "teardown 1: kill what is left (a /proc scan)"),
    ("supervisor.evidence.memory:MemoryEvidence.close", "teardown 1: remove the phase cgroups"),
    ("supervisor.status.file:StateFile.save", "teardown 2: save status.json"),
    ("supervisor.manager.reporting:Reporter.stop", "teardown 4: the manager's exit flush"),
    ("supervisor.engine.loop:EventLoop.close", "teardown 5: close the loop"),
    ("supervisor.engine.logs:Console.close", "teardown 5: close the console (its thread joined)"),
    ("supervisor.app.run:run", "run() whole"),
]


def prof_lastexit(tool: bench.Ours, runs: int) -> dict:
    """A one-phase oneshot over: from the child's last act to the supervisor's exit (bench/run.py's figure 7),
    ours through the probes and tini beside it, taking turns. Per step: the median time from the child's
    exit to the step's start, and the median time spent in it; then what follows main()'s return."""
    rows, tini = [], []
    for i in range(runs + bench.WARMUP):
        stamps, ev = bench.WORK / f"p7-{i}", bench.WORK / f"p7-{i}.json"
        child = [bench.HELPER, "exit", str(stamps), "150", "250", "0"]
        p = probe_run(cfg_args(tool, child, f"last-{i}", kind="oneshot"), [s for s, _ in LASTEXIT_STEPS], ev,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.waitpid(p.pid, 0)
        t_exit = time.monotonic()
        p.returncode = 0
        st = bench.read_stamps(stamps)
        evs = events(ev)
        tstamps = bench.WORK / f"p7t-{i}"
        t = subprocess.Popen(bench.Tini().wrap([*child[:2], str(tstamps), *child[3:]], "w7"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.waitpid(t.pid, 0)
        t_tini = time.monotonic()
        t.returncode = 0
        tst = bench.read_stamps(tstamps)
        shutil.rmtree(bench.DISK / f"ours-last-{i}", ignore_errors=True)
        shutil.rmtree(bench.WORK / f"ours-last-{i}", ignore_errors=True)
        if i < bench.WARMUP or not st or not evs:
            continue
        if tst:
            tini.append(t_tini - float(tst[-1][1]))
        t_c = float(st[-1][1])
        after = [(k, t) for k, t in evs if t >= t_c]
        row = {"total": t_exit - t_c}
        for spec, _ in LASTEXIT_STEPS:
            label = spec.split(":")[0].rsplit(".", 1)[-1] + "." + spec.split(":")[1]
            ins = [t for k, t in after if k == label + ":in"]
            outs = [t for k, t in after if k == label + ":out"]
            row[label + " from the child's exit"] = (ins[0] - t_c) if ins else None
            row[label + " spent"] = sum(o - i for i, o in zip(ins, outs, strict=False)) if outs else None
            row[label + " calls"] = len(ins)
        main_ret = next((t for k, t in evs if k == "main_returned"), None)
        row["main() returned -> exit seen by waitpid"] = (t_exit - main_ret) if main_ret else None
        rows.append(row)
    (OUT / "lastexit.json").write_text(json.dumps(rows, indent=1))
    keys = rows[0].keys() if rows else []
    res = {k: med([r[k] for r in rows if r[k] is not None]) for k in keys}
    return res | {"tini total": med(tini), "runs": len(rows)}


# ---------------------------------------------------------------------- startup


def prof_startup(tool: bench.Ours, runs: int) -> dict:
    probes = ["supervisor.config:load_plan", "supervisor.app.run:run", "supervisor.app.startup:prepare_dirs",
              "supervisor.app.startup:take_lock", "supervisor.app.run:kill_survivors_of_dead_supervisors",
              "supervisor.app.startup:secrets_of", "supervisor.app.startup:claim_init_role",
              "supervisor.app.startup:protect_from_oom_killer", "supervisor.engine.logs:Console.__init__",
              "supervisor.app.observers:start_health", "supervisor.evidence.gpuwatch:Gpus.__init__",
              "supervisor.lifecycle.hooks:memory_preflight", "supervisor.lifecycle.phase:Phase.transition",
              "supervisor.manager.reporting:Reporter.start", "supervisor.engine.logs:SupervisorLog.__call__",
              "supervisor.status.snapshot:snapshot", "supervisor.manager.reporting:Reporter.phase_changed",
              "supervisor.evidence.memory:MemoryEvidence.new_attempt",
              "supervisor.lifecycle.phase:Pacing.watch_for_stall",
              "supervisor.evidence.memory:MemoryEvidence.__init__", "supervisor.manager.reporting:Reporter.__init__",
              "supervisor.lifecycle.resume:load_record", "supervisor.status.socket:StatusServer.__init__",
              "supervisor.lifecycle.lifecycle:Lifecycle.start", "supervisor.evidence.memory:MemoryEvidence.place",
              "supervisor.lifecycle.children:spawn", "subprocess:Popen.__init__", "supervisor.status.file:persist"]
    rows = []
    for i in range(runs):
        stamps, ev = bench.WORK / f"p6-{i}", bench.WORK / f"p6-{i}.json"
        for f in (stamps, ev):
            f.unlink(missing_ok=True)
        args = cfg_args(tool, [bench.HELPER, "start", str(stamps)], "first")
        env = {**os.environ, "PROBE_OUT": str(ev), "PROBES": ",".join(probes)}
        p = subprocess.Popen([bench.HELPER, "stampexec", str(stamps), OURS_PY, PROBE, *args], env=env,
                             cwd=bench.SRC, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        got = bench.wait_for(lambda stamps=stamps: len(bench.read_stamps(stamps)) >= 2 and bench.read_stamps(stamps),
                             20, 0.001)
        p.send_signal(signal.SIGTERM)
        p.wait(15)
        evs = events(ev)
        if not got or not evs:
            continue
        t_exec = float(dict(got)["exec"])
        t_child = float(next(v for k, v in got if k.isdigit()))

        def first(name, evs=evs):
            return next((t for k, t in evs if k == name), None)

        def dur(name, evs=evs, t_child=t_child):
            ins = [t for k, t in evs if k == name + ":in" and t <= t_child]
            outs = [t for k, t in evs if k == name + ":out" and t <= t_child]
            return sum(o - i for i, o in zip(ins, outs, strict=False))

        row = {"interpreter_start": first("interpreter_ready") - t_exec,
               "imports": first("imports_done") - first("interpreter_ready"),
               "load_plan": dur("config.load_plan"),
               "run_until_spawn": (first("children.spawn:in") or t_child) - first("run.run:in"),
               "spawn": dur("children.spawn"), "popen": dur("subprocess.Popen.__init__"),
               "exec_to_child": t_child - t_exec}
        for name in probes[2:]:
            short = name.split(":")[1]
            if short not in ("run", "spawn", "Popen.__init__", "load_plan"):
                row[short] = dur(name.split(":")[0].rsplit(".", 1)[-1] + "." + short)
        rows.append(row)
    (OUT / "startup.json").write_text(json.dumps(rows, indent=1))
    keys = rows[0].keys() if rows else []
    res = {k: med([r[k] for r in rows]) for k in keys} | {"runs": len(rows)}
    # what the imports are made of
    imp = subprocess.run([OURS_PY, "-X", "importtime", "-c",
                          "import supervisor.app.cli, supervisor.app.run, supervisor.prover.plugin"], cwd=bench.SRC,
                         stderr=subprocess.PIPE, text=True).stderr
    (OUT / "importtime.txt").write_text(imp)
    self_us: dict[str, int] = {}
    for line in imp.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line.split("|")
        try:
            self_us[parts[2].strip()] = int(parts[0].split(":")[1]), int(parts[1])
        except ValueError:
            continue
    top = sorted(((cum, name) for name, (_, cum) in self_us.items() if name.count(".") == 0 or
                  name.startswith("supervisor.")), reverse=True)[:18]
    res["imports_cumulative_top_ms"] = {name: cum / 1000 for cum, name in top}
    return res


# ---------------------------------------------------------------------- logs (py-spy)


def py_spy() -> str:
    exe = bench.BENCH_VENV / "bin" / "py-spy"
    if not exe.exists():
        print("[profile] installing from PyPI into", bench.BENCH_VENV, ": py-spy", flush=True)
        subprocess.run([str(bench.BENCH_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "py-spy"], check=True)
    return str(exe)


def prof_logs(tool: bench.Ours, nbytes: int) -> dict:
    spy = py_spy()
    stamps, sink_st = bench.WORK / "p4", bench.WORK / "p4.sink"
    argv = tool.wrap([bench.HELPER, "spew", str(nbytes), "100", str(stamps)], "spew", kind="oneshot")
    r, w = os.pipe()
    s = subprocess.Popen([bench.HELPER, "sink", str(sink_st)], stdin=r)
    os.close(r)
    raw = OUT / "logs.pyspy.txt"
    p = subprocess.Popen(argv, cwd=bench.SRC, stdin=subprocess.DEVNULL, stdout=w, stderr=w)
    os.close(w)
    time.sleep(0.4)  # past start-up: the child starts spewing once the supervisor has spawned it
    spy_p = subprocess.Popen([spy, "record", "--pid", str(p.pid), "--rate", "250", "--threads", "--idle",
                              "--format", "raw", "--output", str(raw), "--nonblocking"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.wait(600)
    spy_p.wait(60)
    s.wait(60)
    t0, t1 = bench.stamp_value(stamps, "start"), bench.stamp_value(stamps, "end")
    stacks = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        stacks[stack] += int(n)
    total = sum(stacks.values())
    per_thread: collections.Counter = collections.Counter()
    self_time: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        thread = frames[1] if len(frames) > 1 and frames[1].startswith("thread") else frames[0]
        body = [f for f in frames if " (" in f]
        per_thread[thread.split(" ")[0] + " " + ("main" if "<module>" in stack else "console"
                                                 if "_write_forever" in stack else "other")] += n
        if body:
            self_time[_short(body[-1])] += n
        for f in set(map(_short, body)):
            inclusive[f] += n

    def pct(c: collections.Counter, k: int) -> dict:
        return {name: round(100.0 * n / total, 1) for name, n in c.most_common(k)}

    return {"child_run_s": (t1 - t0) if t0 and t1 else None, "samples": total,
            "threads_pct": pct(per_thread, 6), "self_pct_top": pct(self_time, 15),
            "inclusive_pct": {k: round(100.0 * inclusive[k] / total, 1) for k in sorted(inclusive, key=inclusive.get,
                                                                                     reverse=True)
                              if any(s in k for s in ("feed", "write", "_emit", "split", "put", "_read",
                                                      "select", "run_once", "clock", "_write_forever", "join",
                                                      "wait", "redact", "taps"))}}


def _short(frame: str) -> str:
    # "feed (supervisor/engine/logs.py:193)" -> "feed (logs.py:193)"
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name


# ---------------------------------------------------------------------- feed prototype


FEED = r"""
import json, sys, time
from pathlib import Path
from supervisor.engine.logs import ChildOutput, Console, LogFile, clock
total, d = int(sys.argv[1]), Path(sys.argv[2])
chunk = (b"line " + b"x" * 94 + b"\n") * 655
reps = total // len(chunk)
res = {}

class Sink:  # a Console that keeps nothing but counts: the console thread's own cost is not measured here
    n = 0
    def put(self, *parts, own=False):
        self.n += sum(map(len, parts))

def run(label, feed):
    c0 = time.process_time()
    for _ in range(reps):
        feed(chunk)
    res[label] = (time.process_time() - c0) * (1 << 30) / (reps * len(chunk))

co = ChildOutput("spew/spew", Sink(), LogFile(d / "a.log", 64 << 20), 200)
run("current ChildOutput.feed", lambda c: co.feed("stdout", c))

# The proposal: no per-line Python objects for the console. Prefix every line with one
# bytes.replace over the chunk; split only the tail the ring keeps; bytes go to the file
# unchanged, without a flush per chunk (flushed when the loop goes idle).
from collections import deque
f = open(d / "b.log", "ab", buffering=1 << 20)
ring = deque(maxlen=200)
sink = Sink()
partial = [b""]
def proposed(data, head_label=b" [spew/spew] "):
    f.write(data)
    data = partial[0] + data if partial[0] else data
    cut = data.rfind(b"\n") + 1
    whole, partial[0] = data[:cut], data[cut:]
    if not whole:
        return
    head = b"\n" + clock() + head_label
    sink.put(head[1:] + whole[:-1].replace(b"\n", head) + b"\n")
    ring.extend(whole.rsplit(b"\n", 201)[-201:-1])
run("proposed: replace + tail split + buffered file", proposed)
f.close()

# The file alone, as now (write + flush per chunk) and buffered.
lf = LogFile(d / "c.log", 64 << 20)
run("LogFile.write alone (flush per chunk)", lf.write)
g = open(d / "e.log", "ab", buffering=1 << 20)
run("file write alone, buffered", g.write)
g.close()
print(json.dumps(res))
"""


def prof_feed(nbytes: int) -> dict:
    d = bench.WORK / "feed"
    d.mkdir(exist_ok=True)
    r = subprocess.run([OURS_PY, "-c", FEED, str(nbytes), str(d)], cwd=bench.SRC, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    shutil.rmtree(d, ignore_errors=True)
    try:
        return {k: round(v, 3) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    except (ValueError, IndexError):
        return {"error": r.stdout[-500:]}


# ---------------------------------------------------------------------- the feed proposal, end to end


def logs_through_probe(tool: bench.Ours, nbytes: int, patch: str, i: int) -> dict:
    stamps, sink_st = bench.WORK / f"p4b-{patch}-{i}", bench.WORK / f"p4b-{patch}-{i}.sink"
    args = cfg_args(tool, [bench.HELPER, "spew", str(nbytes), "100", str(stamps)], "spew", kind="oneshot")
    r, w = os.pipe()
    s = subprocess.Popen([bench.HELPER, "sink", str(sink_st)], stdin=r)
    os.close(r)
    env = {**os.environ, "PROBE_OUT": str(bench.WORK / "p4b.json"), "PROBE_PATCH": patch}
    p = subprocess.Popen([OURS_PY, PROBE, *args], env=env, cwd=bench.SRC, stdin=subprocess.DEVNULL, stdout=w,
                         stderr=w)
    os.close(w)
    _, _, ru = os.wait4(p.pid, 0)
    p.returncode = 0
    s.wait(60)
    t0, t1, cpu = (bench.stamp_value(stamps, k) for k in ("start", "end", "cpu"))
    lines = int(next((v for k, v in bench.read_stamps(sink_st) if k == "lines"), 0))
    t_end = bench.stamp_value(sink_st, "endmark") or bench.stamp_value(sink_st, "eof")
    shutil.rmtree(bench.WORK / "ours-spew" / "log", ignore_errors=True)
    return {"mb_per_s": lines * 100 / (t_end - t0) / 1e6, "delivered_pct": 100.0 * lines / (nbytes // 100),
            "child_run_s": t1 - t0, "supervisor_cpu_s": ru.ru_utime + ru.ru_stime - (cpu or 0)}


def prof_feedpatch(tool: bench.Ours, nbytes: int, rounds: int = 3) -> dict:
    """Current feed vs the proposal, alternating, same harness, through a pipe to the C reader."""
    variants = {"current": "", "proposed (fastfeed)": "fastfeed"}
    out: dict[str, list[dict]] = {k: [] for k in variants}
    for i in range(rounds):
        for label, patch in variants.items():
            out[label].append(logs_through_probe(tool, nbytes, patch, i))
    return {k: {m: round(med([r[m] for r in v]), 3) for m in v[0]} for k, v in out.items()} | {"rounds": rounds}


# ---------------------------------------------------------------------- the proposals' output = today's output


EQUIV = r"""
import random, sys
from supervisor.engine import logs
careful_split, careful_emit = logs.LineSplitter.feed, logs.ChildOutput._emit
src = open(sys.argv[1]).read()
ns = {"time": __import__("time")}
exec(src[src.index("def install_fast_feed"):src.index("def dump")], ns)
class Cap:
    def __init__(s): s.b = []
    def put(s, *parts, own=False): s.b.append(b"".join(parts))
class F:
    def write(s, d, stream=""): pass
    def close(s): pass
logs.clock = lambda: b"12:00:00.000"
rng = random.Random(1)
parts = []
for i in range(20000):
    k = rng.random()
    if k < 0.001: parts.append(b"y" * rng.randint(60000, 200000) + b"\n")   # over MAX_LINE_BYTES
    elif k < 0.01: parts.append(b"cr line\r\n")
    elif k < 0.015: parts.append(b"40%\r41%\r42%\n")   # a redraw: a lone \r ends a line
    else: parts.append(b"l%d " % i + b"x" * rng.randint(0, 300) + b"\n")
data = b"".join(parts) + b"tail-no-newline"
def run(patch):
    careful_feed = logs.ChildOutput.feed
    if patch: ns[patch]()
    c = Cap(); o = logs.ChildOutput("a/b", c, F(), 200)
    pos = 0; r = random.Random(2)
    while pos < len(data):
        n = r.choice([1, 50, 4096, 65536, 65536, 262144]); o.feed("stdout", data[pos:pos+n]); pos += n
    o.close_stream("stdout")
    logs.ChildOutput.feed = careful_feed; logs.LineSplitter.feed = careful_split; logs.ChildOutput._emit = careful_emit
    return b"".join(c.b), list(o.ring)
a = run(None)
for p in ("install_fast_feed",):
    b = run(p); print(p, "console_equal=%s ring_equal=%s" % (a[0] == b[0], a[1] == b[1]))
"""


def prof_equiv() -> dict:
    """Feed 3.6 MB of mixed lines (over-long, CRLF, redraws, unterminated tail) in random read sizes through
    today's ChildOutput and the proposal: same console bytes, same ring?"""
    r = subprocess.run([OURS_PY, "-c", EQUIV, PROBE], cwd=bench.SRC, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return {line.split()[0]: " ".join(line.split()[1:]) for line in r.stdout.splitlines() if line.strip()}


# ---------------------------------------------------------------------- idle RSS


RSS = r"""
import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
import threading
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
print(round(rss(), 2), len(sys.modules))
"""


def prof_rss() -> dict:
    sets = {
        "bare interpreter": [],
        "everything `run` imports now (supervisor.app.cli, supervisor.app.run, the prover's plugin)":
            ["supervisor.app.cli", "supervisor.app.run", "supervisor.prover.plugin"],
        "psutil": ["psutil"],
        "requests (+urllib3, ssl, email, http.client)": ["requests"],
        "tenacity": ["tenacity"],
        "sqlite3": ["sqlite3"],
        "http.server": ["http.server"],
        "ssl": ["ssl"],
        "tomli_w": ["tomli_w"],
        "http.client": ["http.client"],
        "urllib.request": ["urllib.request"],
        "core without the manager/HTTP parts: config, loop, process, reaping, logs, signals, memory, verdict":
            ["supervisor.config", "supervisor.engine.loop", "supervisor.engine.process", "supervisor.engine.reaping",
             "supervisor.engine.logs",
             "supervisor.engine.signals", "supervisor.evidence.memory", "supervisor.lifecycle.verdict"],
    }
    out = {}
    for label, mods in sets.items():
        r = subprocess.run([OURS_PY, "-c", RSS, *mods], cwd=bench.SRC, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        try:
            rss, nmods = r.stdout.split()
            out[label] = {"rss_mib": float(rss), "modules": int(nmods)}
        except ValueError:
            out[label] = {"error": r.stdout[-300:]}
    return out


# ---------------------------------------------------------------------- main

OURS_PY = ""
LOAD_BEFORE = os.getloadavg()


def main() -> int:
    global OURS_PY
    boot()
    which = sys.argv[1:] or ["sigterm", "side", "exit", "lastexit", "startup", "logs", "feed",
                             "feedpatch", "equiv", "rss"]
    OURS_PY = os.environ.get("BENCH_OURS_PYTHON", bench.ours_python())
    OUT.mkdir(parents=True, exist_ok=True)
    bench.WORK = Path(tempfile.mkdtemp(prefix="prover-profile-", dir="/dev/shm"))
    bench.DISK = Path(tempfile.mkdtemp(prefix="prover-profile-", dir="/var/tmp"))
    bench.make_subreaper()
    results = {}
    try:
        bench.HELPER = bench.compile_helper()
        bench.Ours.snapshot = bench.snapshot_ours()  # the profiled version of supervisor/, whatever others commit
        os.environ["PYTHONPATH"] = str(bench.SRC)  # probe.py is a script: sys.path[0] is bench/, not the cwd
        print(f"[profile] prover-supervisor {bench.Ours.snapshot}", flush=True)
        results["version"] = bench.Ours.snapshot
        tool = bench.Ours(OURS_PY)
        tool.probe_keys()
        steps = {"sigterm": lambda: prof_sigterm(tool, 40), "exit": lambda: prof_exit(tool, 60),
                 "startup": lambda: prof_startup(tool, 20), "logs": lambda: prof_logs(tool, bench.GiB),
                 "feed": lambda: prof_feed(512 * bench.MiB), "rss": prof_rss,
                 "feedpatch": lambda: prof_feedpatch(tool, bench.GiB),
                 "side": lambda: prof_side(tool, 40), "equiv": prof_equiv,
                 "side16": lambda: prof_side16(tool, 80, 30),
                 "lastexit": lambda: prof_lastexit(tool, 20)}
        for name in which:
            print(f"[profile] {name}", flush=True)
            results[name] = steps[name]()
            print(json.dumps(results[name], indent=1, default=str), flush=True)
            bench.reap_strays(0.5)
    finally:
        bench.reap_strays(2.0)
        os.chdir(bench.REPO)
        shutil.rmtree(bench.WORK, ignore_errors=True)
        shutil.rmtree(bench.DISK, ignore_errors=True)
    # the summary the notes quote, kept in git (the raw samples stay in bench/out/profile/): what this run
    # measured replaces its keys, the other scenarios' figures stay as they were
    prev = {}
    for earlier in (bench.BENCH_DIR / "profile-summary.json", OUT / "summary.json"):
        if earlier.exists():
            prev |= json.loads(earlier.read_text())
    results["versions"] = prev.get("versions", {}) | dict.fromkeys(which, results.get("version"))  # per scenario
    (OUT / "summary.json").write_text(json.dumps(prev | results, indent=1, default=str))
    (bench.BENCH_DIR / "profile-summary.json").write_text(json.dumps(prev | results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
