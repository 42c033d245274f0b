#!/usr/bin/env python3
"""Benchmarks: prover-supervisor side by side with tini, dumb-init and supervisord.

    python bench/run.py            # every figure, writes docs/benchmarks.md (about 7-9 minutes)
    python bench/run.py --quick    # fewer iterations, smaller volumes (about 3 minutes)
    python bench/run.py --only 2,5 # some figures only: prints the table, leaves the doc alone

It installs what it lacks and says so: Debian's tini and dumb-init (apt-get),
a C compiler if there is none (apt-get), and supervisord + psutil from PyPI
into a separate venv ($BENCH_VENV, default /tmp/bench-venv), under whose Python
it then re-runs itself. Ours runs from the repository's .venv (or
$BENCH_OURS_PYTHON). Needs root (unshare --pid for the orphan storm).

Every figure is measured in the same run for all four tools, with the same
child program (bench/helper.c, compiled at start): timestamps are
CLOCK_MONOTONIC on both sides. Everything it starts lives under a scratch
directory in /dev/shm and is stopped, killed and removed at the end; the bench
makes itself a child subreaper so that nothing it started can escape it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import datetime
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "bench"
OUT_DIR = BENCH_DIR / "out"
DOC = REPO / "docs" / "benchmarks.md"
NOTES = BENCH_DIR / "notes.md"
RESULTS = BENCH_DIR / "results.json"  # the last full run: what docs/benchmarks.md shows
BENCH_VENV = Path(os.environ.get("BENCH_VENV", "/tmp/bench-venv"))
TOOLS = ("ours", "tini", "dumb-init", "supervisord")
OURS_LABEL = "prover-supervisor"
WARMUP = 2  # first runs of each series are dropped (first-time code paths, page cache)
MiB = 1 << 20
GiB = 1 << 30


def say(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


# ====================================================================== setup


def run_quiet(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def ours_python() -> str:
    explicit = os.environ.get("BENCH_OURS_PYTHON")
    if explicit:
        return explicit
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def ensure_apt(wanted: dict[str, str]) -> None:
    """binary -> Debian package: install the packages whose binary is missing."""
    missing = sorted({pkg for binary, pkg in wanted.items() if shutil.which(binary) is None})
    if not missing:
        return
    say(f"installing from Debian apt: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True, env=env)


def ensure_venv(base_python: str) -> Path:
    py = BENCH_VENV / "bin" / "python"
    if not py.exists():
        say(f"creating a venv for the peers at {BENCH_VENV} (from {base_python})")
        base = run_quiet([base_python, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"])
        subprocess.run([base.stdout.strip() or base_python, "-m", "venv", str(BENCH_VENV)], check=True)
    need = [pkg for pkg, mod in (("supervisor", "supervisor.supervisord"), ("psutil", "psutil"))
            if run_quiet([str(py), "-c", f"import {mod}"], cwd="/").returncode != 0]
    if need:
        say(f"installing from PyPI into {BENCH_VENV}: {' '.join(need)}")
        subprocess.run([str(py), "-m", "pip", "install", "-q", *need], check=True)
    return py


def bootstrap(argv: list[str], script: str = __file__) -> None:
    """Install what is missing, then re-run ``script`` under the bench venv's Python (it has psutil)."""
    if os.environ.get("BENCH_BOOTSTRAPPED") == "1":
        return
    if os.geteuid() != 0:
        sys.exit("bench/run.py needs root (apt-get, unshare --pid, oom_score_adj)")
    ensure_apt({"tini": "tini", "dumb-init": "dumb-init", "unshare": "util-linux"})
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        ensure_apt({"cc": "gcc", "gcc": "libc6-dev"})
    ours = ours_python()
    check = run_quiet([ours, "-c", "import supervisor.app.run"], cwd=REPO)
    if check.returncode != 0:
        sys.exit(f"cannot import the supervisor package with {ours}: {check.stdout.strip()[-400:]}\n"
                 "(create the repository's .venv as the README says, or set BENCH_OURS_PYTHON)")
    py = ensure_venv(ours)
    env = {**os.environ, "BENCH_BOOTSTRAPPED": "1", "BENCH_OURS_PYTHON": ours}
    os.execve(str(py), [str(py), str(Path(script).resolve()), *argv], env)


# ====================================================================== scratch space and processes

try:
    import psutil
except ImportError:  # before the bootstrap; the bench venv has it
    psutil = None  # type: ignore[assignment]

WORK = Path("/nonexistent")  # scratch on tmpfs: stamps, configs, ours' log_dir
DISK = Path("/nonexistent")  # scratch on disk: ours' state_dir (it fsyncs status.json there, as in production)
SRC = Path("/nonexistent")  # a copy of supervisor/ taken at the start: the run measures one version of it
HELPER = "/nonexistent"


def snapshot_ours() -> str:
    """Copy the working tree's supervisor/ into the scratch dir and run ours from there (cwd, hence sys.path[0]).

    Others edit supervisor/ while the benchmarks run: without the copy one run could
    measure two versions. Returns what was copied, for the document.
    """
    global SRC
    SRC = WORK / "src"
    shutil.copytree(REPO / "supervisor", SRC / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    compile_bytecode(SRC / "supervisor")
    os.chdir(SRC)
    rev = run_quiet(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = run_quiet(["git", "-C", str(REPO), "status", "--porcelain", "--", "supervisor"]).stdout.strip()
    return f"git {rev}{' + uncommitted changes in supervisor/' if dirty else ''}"


def compile_bytecode(package: Path) -> None:
    """Compile the copy once, as installing a package does: where PYTHONDONTWRITEBYTECODE is set (this VM sets
    it) every start of ours would otherwise compile ~260 modules from source, and figure 6 would time that."""
    run_quiet([os.environ.get("BENCH_OURS_PYTHON", ours_python()), "-m", "compileall", "-q", str(package)])


def make_subreaper() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(36, ctypes.c_ulong(1), 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        say("warning: could not become a child subreaper; strays may escape the cleanup")


def compile_helper() -> str:
    out = WORK / "helper"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-O3", "-Wall", "-o", str(out), str(BENCH_DIR / "helper.c")], check=True)
    return str(out)


def wait_for(pred: Callable[[], object], timeout: float, step: float = 0.0005) -> object:
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            return None
        time.sleep(step)


def read_stamps(path: Path) -> list[tuple[str, str]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out.append((" ".join(parts[:-1]), parts[-1]))
    return out


def stamp_value(path: Path, key: str) -> float | None:
    for k, value in read_stamps(path):
        if k == key:
            return float(value)
    return None


def stop(p: subprocess.Popen, graceful: bool = True, timeout: float = 15.0) -> None:
    """Stop a tool and everything below it; never leaves a zombie."""
    try:
        tree = psutil.Process(p.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    if p.poll() is None and graceful:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout)
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait()
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    reap_strays(0.2)


def reap_strays(wait_s: float = 2.0) -> None:
    """Kill whatever of ours is still around (orphans come back to us, a subreaper) and reap it."""
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    end = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > end:
                return
            time.sleep(0.01)


class LineWatcher(threading.Thread):
    """Reads a pipe, timestamps each read the moment it returns, hands lines on."""

    def __init__(self, fd: int, on_line: Callable[[bytes, float], None]) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.on_line = on_line

    def run(self) -> None:
        partial = b""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:
                break
            t = time.monotonic()
            if not data:
                break
            partial += data
            *lines, partial = partial.split(b"\n")
            for line in lines:
                self.on_line(line, t)
        os.close(self.fd)


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary_ms(lat_s: list[float]) -> dict:
    ms = [x * 1000 for x in lat_s]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "min_ms": min(ms) if ms else None,
            "max_ms": max(ms) if ms else None}


# ====================================================================== the tools


class Tool:
    name = ""
    restarts_children = False  # can run a child again and again in one process (W1)

    def wrap(self, child: list[str], tag: str, *, pid1: bool = False, kind: str = "service",
             restart: bool = False) -> list[str]:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError


class Tini(Tool):
    name = "tini"

    def wrap(self, child, tag, *, pid1=False, kind="service", restart=False):
        # -s: a subreaper when not PID 1, as ours is (tini warns without it)
        return ["tini", "--", *child] if pid1 else ["tini", "-s", "--", *child]

    def version(self):
        return run_quiet(["tini", "--version"]).stdout.strip()


class DumbInit(Tool):
    name = "dumb-init"

    def wrap(self, child, tag, *, pid1=False, kind="service", restart=False):
        return ["dumb-init", *child]

    def version(self):
        return run_quiet(["dumb-init", "--version"]).stdout.strip()


class Ours(Tool):
    name = "ours"
    restarts_children = True

    def __init__(self, python: str) -> None:
        self.python = python
        self.extra: dict[str, str] = {}

    def probe_keys(self) -> None:
        """Keep the supervisor's own files inside the scratch dir where the config allows it."""
        self.extra = {"termination_log": str(WORK / "ours-termination-log")}
        cfg = self._write([str(HELPER), "start", str(WORK / "probe")], "probe", "service", False)
        if run_quiet([self.python, "-m", "supervisor", "check", "--config", cfg]).returncode != 0:
            self.extra = {}

    def _write(self, child, tag, kind, restart) -> str:
        home = WORK / f"ours-{tag}"
        lines = [
            "[supervisor]",
            f"state_dir = {json.dumps(str(DISK / f'ours-{tag}' / 'state'))}",
            f"log_dir = {json.dumps(str(home / 'log'))}",
            "stop_grace_s = 2",
            *(f"{k} = {json.dumps(v)}" for k, v in self.extra.items()),
            "",
            "[[phases]]",
            f"name = {json.dumps(tag.split('-')[0])}",
            f"kind = {json.dumps(kind)}",
            f"command = {json.dumps(child)}",
        ]
        if kind == "service":
            lines.append(f"restart = {json.dumps('always' if restart else 'no')}")
        if restart:
            lines += ["backoff_s = 0.01", "backoff_max_s = 0.01", "backoff_jitter = 0",
                      "restart_burst = 1000", "restart_window_s = 1"]  # (the most a config may give)
        path = WORK / f"ours-{tag}.toml"
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def wrap(self, child, tag, *, pid1=False, kind="service", restart=False):
        cfg = self._write(child, tag, kind, restart)
        return [self.python, "-m", "supervisor", "run", "--config", cfg]

    snapshot = ""

    def version(self):
        v = run_quiet([self.python, "-m", "supervisor", "--version"]).stdout.strip()
        py = run_quiet([self.python, "-c", "import platform; print(platform.python_version())"]).stdout.strip()
        return f"{v} ({self.snapshot or 'working tree'}), CPython {py}"


class Supervisord(Tool):
    name = "supervisord"
    restarts_children = True

    def __init__(self, venv: Path) -> None:
        self.bin = str(venv / "bin" / "supervisord")

    def wrap(self, child, tag, *, pid1=False, kind="service", restart=False):
        # The usual container setup: nodaemon, its own log and the program's output on stdout.
        text = f"""[supervisord]
nodaemon=true
user=root
logfile=/dev/null
logfile_maxbytes=0
pidfile={WORK}/supervisord-{tag}.pid
childlogdir={WORK}
loglevel=info

[program:child]
command={shlex.join(child)}
autostart=true
autorestart={'true' if restart else 'false'}
startsecs=0
startretries=1000000
stopsignal=TERM
stopwaitsecs=2
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true
"""
        path = WORK / f"supervisord-{tag}.conf"
        path.write_text(text)
        return [self.bin, "-c", str(path)]

    def version(self):
        return "supervisord " + run_quiet([self.bin, "--version"]).stdout.strip()


# ====================================================================== 1. exit -> classified


def w1_fresh(tool: Tool, n: int, grand_s: float) -> list[float]:
    """tini / dumb-init exit when their child does: one fresh process per run; the observable is their exit."""
    lats = []
    for i in range(n + WARMUP):
        stamps = WORK / f"w1-{tool.name}-{grand_s}-{i}"
        r, w = os.pipe()
        p = subprocess.Popen(tool.wrap([HELPER, "exit", str(stamps), "10", "30", str(grand_s)], "w1"),
                             stdin=subprocess.DEVNULL, stdout=w, stderr=w)
        os.close(w)
        p.wait()
        t = time.monotonic()
        os.close(r)  # nobody reads it: a grandchild holding it open does not matter to them
        st = read_stamps(stamps)
        if st and i >= WARMUP:
            lats.append(t - float(st[-1][1]))
    reap_strays(0.5)
    return lats


def w1_restarting(tool: Tool, n: int, grand_s: float, timeout: float) -> list[float]:
    """Ours and supervisord restart the child again and again; each verdict / 'exited:' line is one run."""
    stamps = WORK / f"w1-{tool.name}-{grand_s}"
    # supervisord wakes on a 1 s timer: spread the child's life over a whole second so
    # its exits fall at every phase of that timer; ours and the others don't care.
    lo, hi = ("20", "1020") if tool.name == "supervisord" else ("10", "30")
    argv = tool.wrap([HELPER, "exit", str(stamps), lo, hi, str(grand_s)], "w1", restart=True)
    marker = b"exited: child " if tool.name == "supervisord" else b"ended: phase=w1 "
    seen: list[tuple[bytes, float]] = []
    enough = threading.Event()

    def on_line(line: bytes, t: float) -> None:
        if marker in line:
            seen.append((line, t))
            if len(seen) >= n + WARMUP:
                enough.set()

    r, w = os.pipe()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=w, stderr=w)
    os.close(w)
    watcher = LineWatcher(r, on_line)
    watcher.start()
    if not enough.wait(timeout):
        say(f"  {tool.name}: only {len(seen)} of {n + WARMUP} exits seen within {timeout:.0f}s")
    got = list(seen)
    stop(p)
    watcher.join(5)
    st = read_stamps(stamps)
    lats = []
    if tool.name == "supervisord":  # its line has no pid: runs are strictly one after another, match in order
        for (_, t), (_, t_child) in zip(got, st, strict=False):
            lats.append(t - float(t_child))
    else:
        by_pid = {int(k): float(v) for k, v in st if k.isdigit()}
        for line, t in got:
            m = re.search(rb"pid=(\d+)", line)
            if m and int(m.group(1)) in by_pid:
                lats.append(t - by_pid[int(m.group(1))])
    return lats[WARMUP:]


def bench_exit(tools: dict[str, Tool], q: Quotas) -> dict:
    res: dict = {"no_grandchild": {}, "grandchild": {}}
    for variant, grand in (("no_grandchild", 0.0), ("grandchild", 30.0)):
        for name, tool in tools.items():
            n = q.exit_runs_supervisord if name == "supervisord" else q.exit_runs
            say(f"1. exit -> classified ({variant.replace('_', ' ')}): {name}, {n} runs")
            if tool.restarts_children:
                lats = w1_restarting(tool, n, grand, timeout=30 + n * (1.4 if name == "supervisord" else 0.5))
            else:
                lats = w1_fresh(tool, n, grand)
            res[variant][name] = summary_ms(lats)
            show(res[variant][name])
    return res


_SERIES_T0 = [0.0]


def show(d: dict) -> None:
    took = time.monotonic() - _SERIES_T0[0] if _SERIES_T0[0] else 0.0
    _SERIES_T0[0] = time.monotonic()
    say("   " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items()) +
        (f"  [{took:.0f}s]" if took else ""))


# ====================================================================== 7. the child's exit -> the supervisor's exit


def bench_after_exit(tools: dict[str, Tool], q: Quotas) -> dict:
    """A one-phase lifecycle over: the child writes the time as its last act and exits 0; the supervisor's exit
    is seen by the bench's waitpid. Ours runs the phase as a oneshot, so its exit is the whole end of a run:
    the verdict, the teardown, the interpreter's shutdown. The tools take turns run by run, so that the
    machine's load falls on all of them alike."""
    runners = {name: tool for name, tool in tools.items() if name != "supervisord"}  # it never exits on its own
    lats: dict[str, list[float]] = {name: [] for name in runners}
    failures = dict.fromkeys(runners, 0)
    say(f"7. the child's exit -> the supervisor's exit: {', '.join(runners)}, {q.after_exit_runs} runs each, "
        "taking turns")
    for i in range(q.after_exit_runs + WARMUP):
        for name, tool in runners.items():
            stamps = WORK / f"w7-{name}-{i}"
            # The child lives 150-250 ms: ours has finished starting (its start-up is figure 6's) and idles.
            # A state_dir of its own each run, as a fresh container has: nothing to resume.
            argv = tool.wrap([HELPER, "exit", str(stamps), "150", "250", "0"], f"last-{i}", kind="oneshot")
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            # A blocking waitpid (Popen.wait with a timeout polls, with sleeps of up to 50 ms); a timer
            # kills a supervisor that never exits.
            guard = threading.Timer(30, lambda p=p: p.poll() is None and p.kill())
            guard.start()
            _, status = os.waitpid(p.pid, 0)
            t = time.monotonic()
            guard.cancel()
            p.returncode = os.waitstatus_to_exitcode(status)
            st = read_stamps(stamps)
            if not st or p.returncode != 0:
                failures[name] += 1
            elif i >= WARMUP:
                lats[name].append(t - float(st[-1][1]))
            if name == "ours":
                shutil.rmtree(DISK / f"ours-last-{i}", ignore_errors=True)
                shutil.rmtree(WORK / f"ours-last-{i}", ignore_errors=True)
    reap_strays(0.5)
    res = {name: {**summary_ms(v), "failures": failures[name]} for name, v in lats.items()}
    for name, r in res.items():
        say(f"   {name}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    return res


# ====================================================================== 2. SIGTERM -> child's handler


def bench_sigterm(tools: dict[str, Tool], q: Quotas) -> dict:
    """Ours, tini and dumb-init take turns run by run (a ratio to tini's figure means something only when the
    machine's load fell on both alike); supervisord's fewer, longer runs come after them."""
    turns = [name for name in tools if name != "supervisord"]
    lats: dict[str, list[float]] = {name: [] for name in tools}
    failures = dict.fromkeys(tools, 0)

    def one(name: str, i: int) -> None:
        stamp, ready = WORK / f"w2-{name}-{i}", WORK / f"w2-{name}-{i}.ready"
        p = subprocess.Popen(tools[name].wrap([HELPER, "term", str(stamp), str(ready)], "w2"),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for(ready.exists, 20):
            failures[name] += 1
            stop(p, graceful=False)
            return
        # settle into the idle wait; supervisord wakes on a 1 s timer: sample its whole phase
        time.sleep(random.uniform(0.05, 1.05) if name == "supervisord" else random.uniform(0.03, 0.06))
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        got = wait_for(lambda stamp=stamp: read_stamps(stamp), 10, step=0.001)
        if got and i >= WARMUP:
            lats[name].append(float(got[0][1]) - t0)
        elif not got:
            failures[name] += 1
        stop(p, timeout=15)

    if turns:
        say(f"2. SIGTERM -> child's handler: {', '.join(turns)}, {q.term_runs} runs each, taking turns")
        for i in range(q.term_runs + WARMUP):
            for name in turns:
                one(name, i)
    if "supervisord" in tools:
        say(f"2. SIGTERM -> child's handler: supervisord, {q.term_runs_supervisord} runs")
        for i in range(q.term_runs_supervisord + WARMUP):
            one("supervisord", i)
    res = {}
    for name in tools:
        res[name] = {**summary_ms(lats[name]), "failures": failures[name]}
        say(f"   {name}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in res[name].items()))
    return res


# ====================================================================== 3. orphan storm


def children_of(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return kids


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2: data.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return None


def bench_orphans(tools: dict[str, Tool], q: Quotas) -> dict:
    res = {}
    for name, tool in tools.items():
        say(f"3. orphan storm: {q.orphans} orphans under {name} as PID 1 of a new PID namespace")
        stamps = WORK / f"w3-{name}"
        argv = ["unshare", "--pid", "--fork", "--mount-proc",
                *tool.wrap([HELPER, "storm", str(q.orphans), str(stamps)], "w3", pid1=True)]
        with open(WORK / f"w3-{name}.out", "wb") as out:
            u = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        r: dict = {}
        try:
            kids = wait_for(lambda u=u: psutil.Process(u.pid).children(), 10, 0.005)
            if not kids:
                raise RuntimeError("unshare started nothing")
            pid1 = kids[0].pid
            t_rel = wait_for(lambda stamps=stamps: stamp_value(stamps, "released"), 180, 0.005)
            if t_rel is None:
                raise RuntimeError("the storm never released its orphans")
            created = next(int(k.split()[1]) for k, _ in read_stamps(stamps) if k.startswith("created"))
            storm_pid = int(next(v for k, v in read_stamps(stamps) if k == "pid"))
            # storm_pid is the namespace's pid; the host sees another: the storm is pid1's only
            # non-orphan child, the one that is sleeping in pause() -- find it by being alive at the end.
            samples: list[tuple[float, int]] = []
            zombies_1s = None
            alive_1s = None
            done_at = None
            baseline = None
            while True:
                now = time.monotonic()
                kids_now = children_of(pid1)
                if baseline is None:
                    baseline = 1  # the storm process itself stays alive (pause())
                left = max(0, len(kids_now) - baseline)
                samples.append((now - t_rel, left))
                if zombies_1s is None and now - t_rel >= 1.0:
                    states = [proc_state(k) for k in kids_now]
                    zombies_1s = sum(1 for s in states if s == "Z")
                    alive_1s = sum(1 for s in states if s and s != "Z") - baseline
                if left == 0 and len(samples) > 1:
                    done_at = now - t_rel
                    if zombies_1s is None:
                        zombies_1s, alive_1s = 0, 0
                    break
                if now - t_rel > q.storm_window_s:
                    break
                time.sleep(0.01)
            left_end = samples[-1][1]
            window = done_at if done_at is not None else samples[-1][0]
            r = {"created": created, "zombies_after_1s": zombies_1s, "orphans_alive_after_1s": alive_1s,
                 "all_reaped_after_s": done_at, "left_at_end": left_end, "observed_s": samples[-1][0],
                 "rate_per_s": (created - left_end) / window if window else None, "storm_pid_in_ns": storm_pid}
        except Exception as exc:
            r = {"error": str(exc)}
        finally:
            pid1_list = []
            with contextlib.suppress(psutil.Error):
                pid1_list = [c.pid for c in psutil.Process(u.pid).children()]
            for pid in pid1_list:  # the namespace's init: SIGTERM (stop what runs), then SIGKILL ends the namespace
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM if name != "supervisord" else signal.SIGKILL)
            try:
                u.wait(15)
            except subprocess.TimeoutExpired:
                for pid in pid1_list:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                u.wait(15)
            reap_strays(1.0)
        if name == "supervisord":
            text = (WORK / f"w3-{name}.out").read_bytes()
            r["unknown_pid_log_lines"] = text.count(b"reaped unknown pid")
        res[name] = r
        show(r)
    return res


# ====================================================================== 4. log pass-through


def bench_logs(tools: dict[str, Tool], q: Quotas, ours_py: str) -> dict:
    res: dict = {"pipe": {}, "devnull": {}, "bytes": q.log_bytes}
    for sink in ("pipe", "devnull"):
        for name, tool in tools.items():
            say(f"4. log pass-through, {q.log_bytes // MiB} MiB of 100-byte lines, stdout to {sink}: {name}")
            stamps, sink_st = WORK / f"w4-{name}-{sink}", WORK / f"w4-{name}-{sink}.sink"
            argv = tool.wrap([HELPER, "spew", str(q.log_bytes), "100", str(stamps)], "spew", kind="oneshot")
            s = None
            if sink == "pipe":
                r, w = os.pipe()
                s = subprocess.Popen([HELPER, "sink", str(sink_st)], stdin=r)
                os.close(r)
                out = w
            else:
                out = os.open("/dev/null", os.O_WRONLY)
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            os.close(out)
            peak = PeakRss(p.pid)
            if name == "supervisord":  # it does not exit when its program does
                wait_for(lambda stamps=stamps: stamp_value(stamps, "end"), 600, 0.01)
                if s is not None:
                    wait_for(lambda sink_st=sink_st: stamp_value(sink_st, "endmark"), 60, 0.01)
                p.send_signal(signal.SIGTERM)
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
            peak_rss = peak.stop()  # sampled: rusage's maxrss would count the fork from the bench
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = status
            t_exit = time.monotonic() if name != "supervisord" else None
            if s is not None:
                s.wait(120)
            t0, t1, child_cpu = (stamp_value(stamps, k) for k in ("start", "end", "cpu"))
            r = {"child_run_s": (t1 - t0) if t0 and t1 else None,
                 "supervisor_cpu_s": ru.ru_utime + ru.ru_stime - (child_cpu or 0.0),
                 "supervisor_peak_rss_mib": peak_rss / MiB}
            if t0 and t_exit:
                r["until_supervisor_exit_s"] = t_exit - t0
            if t0 is None:
                r["error"] = f"the child did not run (status {status})"
            elif s is not None:
                lines = int(next((v for k, v in read_stamps(sink_st) if k == "lines"), 0))
                t_end = stamp_value(sink_st, "endmark") or stamp_value(sink_st, "eof")
                expect = q.log_bytes // 100
                r.update({"lines_delivered": lines, "lines_expected": expect,
                          "delivered_pct": 100.0 * lines / expect,
                          "end_marker_seen": stamp_value(sink_st, "endmark") is not None,
                          "mb_per_s": lines * 100 / (t_end - t0) / 1e6})
            elif t1:
                r["mb_per_s"] = q.log_bytes / (t1 - t0) / 1e6
            r["supervisor_cpu_s_per_gib"] = r["supervisor_cpu_s"] * GiB / q.log_bytes
            res[sink][name] = r
            show(r)
            stop(p)
            if name == "ours":
                shutil.rmtree(WORK / "ours-spew" / "log", ignore_errors=True)
    if "ours" in tools:
        res["ours_file_cost"] = ours_file_cost(ours_py, q)
        show(res["ours_file_cost"])
    return res


class PeakRss(threading.Thread):
    """Samples one process's RSS every 20 ms (that process only, not its children)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.proc.memory_info().rss)
            self._done.wait(0.02)

    def stop(self) -> int:
        self._done.set()
        self.join(1)
        return self.peak


FILE_COST = r"""
import json, sys, time
from pathlib import Path
from supervisor.engine.logs import ChildOutput, Console, LogFile
total, d = int(sys.argv[1]), Path(sys.argv[2])
chunk = (b"line " + b"x" * 94 + b"\n") * 655   # what one read of a full pipe brings (64 KiB)
reps = total // len(chunk)
out = {}
f = LogFile(d / "file.log", 64 << 20)
c0, w0 = time.process_time(), time.perf_counter()
for _ in range(reps):
    f.write(chunk)
f.close()
out["file_cpu_s_per_gib"] = (time.process_time() - c0) * (1 << 30) / (reps * len(chunk))
out["file_wall_s_per_gib"] = (time.perf_counter() - w0) * (1 << 30) / (reps * len(chunk))
try:
    co = ChildOutput("spew/spew", Console(enabled=False), LogFile(d / "feed.log", 64 << 20), 200)
    c0 = time.process_time()
    for _ in range(reps):
        co.feed("stdout", chunk)
    out["feed_cpu_s_per_gib"] = (time.process_time() - c0) * (1 << 30) / (reps * len(chunk))
except Exception as exc:
    out["feed_error"] = repr(exc)
print(json.dumps(out))
"""


def ours_file_cost(ours_py: str, q: Quotas) -> dict:
    """The per-child log file alone, in-process, on the same tmpfs: its share of ours' cost per GiB."""
    say("4. ours: cost of the per-child log file (tmpfs) and of the whole feed path, in-process")
    d = WORK / "filecost"
    d.mkdir(exist_ok=True)
    r = run_quiet([ours_py, "-c", FILE_COST, str(min(q.log_bytes, 512 * MiB)), str(d)])  # cwd: the snapshot
    shutil.rmtree(d, ignore_errors=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": r.stdout[-300:]}


# ====================================================================== 5. idle


def task_ctx_switches(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def bench_idle(tools: dict[str, Tool], q: Quotas) -> dict:
    say(f"5. idle: all four side by side for {q.idle_s:.0f}s, each running `sleep infinity`")
    procs = {name: subprocess.Popen(tool.wrap(["/bin/sleep", "infinity"], "idle"), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, tool in tools.items()}
    res = {}
    try:
        time.sleep(3)
        before = {}
        for name, p in procs.items():
            ps = psutil.Process(p.pid)
            before[name] = (ps, ps.cpu_times(), task_ctx_switches(p.pid))
        t0 = time.monotonic()
        time.sleep(q.idle_s)
        wall = time.monotonic() - t0
        for name, (ps, cpu0, ctx0) in before.items():
            cpu1 = ps.cpu_times()
            mem = ps.memory_full_info()
            used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            res[name] = {"rss_mib": mem.rss / MiB, "uss_mib": mem.uss / MiB, "threads": ps.num_threads(),
                         "cpu_pct_of_core": 100.0 * used / wall,
                         "wakeups_per_s": (task_ctx_switches(ps.pid) - ctx0) / wall, "seconds": wall}
            say(f"   {name}: " + ", ".join(f"{k}={v:.3f}" for k, v in res[name].items()))
    finally:
        for p in procs.values():
            stop(p, timeout=5)
    return res


# ====================================================================== 6. exec -> first child


def bench_first_child(tools: dict[str, Tool], q: Quotas) -> dict:
    res = {}
    for name, tool in tools.items():
        n = q.start_runs_supervisord if name == "supervisord" else q.start_runs
        say(f"6. exec -> first child's exec: {name}, {n} runs")
        lats = []
        for i in range(n + WARMUP):
            stamps = WORK / f"w6-{name}-{i}"
            p = subprocess.Popen([HELPER, "stampexec", str(stamps),
                                  *tool.wrap([HELPER, "start", str(stamps)], "first")],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            got = wait_for(lambda stamps=stamps: len(read_stamps(stamps)) >= 2 and read_stamps(stamps), 20, 0.001)
            if got and i >= WARMUP:
                t_exec = float(dict(got)["exec"])
                t_child = float(next(v for k, v in got if k.isdigit()))
                lats.append(t_child - t_exec)
            stop(p, graceful=name != "supervisord", timeout=10)
        res[name] = summary_ms(lats)
        show(res[name])
    return res


# ====================================================================== quotas, targets, the document


class Quotas:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.exit_runs = 40 if quick else 200
        self.exit_runs_supervisord = 12 if quick else 25  # up to 2 s a run: it wakes once a second
        self.term_runs = 40 if quick else 200
        self.term_runs_supervisord = 8 if quick else 20
        self.orphans = 10_000
        self.storm_window_s = 5.0 if quick else 8.0
        self.log_bytes = 128 * MiB if quick else GiB
        self.idle_s = 15.0 if quick else 60.0
        self.start_runs = 10 if quick else 30
        self.start_runs_supervisord = 6 if quick else 15
        self.after_exit_runs = 10 if quick else 40


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def cell(d: dict | None, *keys: str, digits: int = 2, sep: str = " / ") -> str:
    if not d:
        return "–"
    if "error" in d:
        return "error"
    return sep.join(fmt(d.get(k), digits) for k in keys)


def judge(res: dict) -> list[tuple[str, str, bool | None, str]]:
    """(figure, target, met, why) for each target, from the results of one run."""
    out = []

    def get(*path):
        d = res
        for p in path:
            if not isinstance(d, dict) or p not in d:
                return None
            d = d[p]
        return d

    for variant, label in (("no_grandchild", "1a"), ("grandchild", "1b")):
        o, s = get("exit", variant, "ours", "p50_ms"), get("exit", variant, "supervisord", "p50_ms")
        if o is not None:
            ratio = s / o if s else None
            out.append((label, "p50 ≤ 2 ms and ≥ 100× faster than supervisord's p50",
                        o <= 2.0 and ratio is not None and ratio >= 100,
                        f"p50 {o:.2f} ms (≤ 2 ms: {'yes' if o <= 2 else 'no'}); supervisord's p50 "
                        f"{fmt(s)} ms = {fmt(ratio, 2 if ratio and ratio < 10 else 0)}× ours "
                        f"(≥ 100×: {'yes' if ratio and ratio >= 100 else 'no'})"))
    o, t = get("sigterm", "ours", "p50_ms"), get("sigterm", "tini", "p50_ms")
    if o is not None and t:
        out.append(("2", "p50 ≤ 2× tini's", o <= 2 * t, f"{o:.2f} ms vs tini {t:.2f} ms = {o / t:.1f}×"))
    z, rate = get("orphans", "ours", "zombies_after_1s"), get("orphans", "ours", "rate_per_s")
    if z is not None:
        out.append(("3a", "0 zombies 1 s after the release", z == 0, f"{z} zombies after 1 s"))
        out.append(("3b", "≥ 2,000 orphans reaped/s", (rate or 0) >= 2000, f"{fmt(rate, 0)}/s"))
    # Only through a pipe: to /dev/null tini's child writes straight into the null device.
    o, t = get("logs", "pipe", "ours", "mb_per_s"), get("logs", "pipe", "tini", "mb_per_s")
    if o is not None and t:
        out.append(("4a", "≥ 0.5× tini's pass-through", o >= 0.5 * t, f"{o:.0f} vs tini {t:.0f} MB/s = {o / t:.2f}×"))
    o, s = get("idle", "ours", "rss_mib"), get("idle", "supervisord", "rss_mib")
    if o is not None and s:
        out.append(("5a", "RSS ≤ 30 MiB and ≤ supervisord's", o <= 30 and o <= s,
                    f"{o:.1f} MiB (≤ 30: {'yes' if o <= 30 else 'no'}) vs supervisord's {s:.1f} MiB"))
    c = get("idle", "ours", "cpu_pct_of_core")
    if c is not None:
        out.append(("5b", "CPU < 0.5 % of a core", c < 0.5, f"{c:.3f} %"))
    f = get("first_child", "ours", "p50_ms")
    if f is not None:
        out.append(("6", "≤ 150 ms", f <= 150, f"p50 {f:.0f} ms"))
    o, t = get("after_exit", "ours", "p50_ms"), get("after_exit", "tini", "p50_ms")
    if o is not None and t is not None:
        out.append(("7", "p50 ≤ tini's + 50 ms", o <= t + 50,
                    f"p50 {o:.1f} ms vs tini {t:.1f} ms = tini + {o - t:.1f} ms"))
    return out


def table(res: dict) -> str:
    targets = {label: (target, met) for label, target, met, _ in judge(res)}

    def row(label: str, figure: str, key: tuple, fmt_row: Callable[[dict | None], str]) -> str:
        cells = []
        for tool in TOOLS:
            d = res
            for k in (*key, tool):
                d = d.get(k) if isinstance(d, dict) else None
            cells.append(fmt_row(d))
        target, met = targets.get(label, ("–", None))
        mark = "–" if met is None else ("yes" if met else "**no**")
        return f"| {label} | {figure} | " + " | ".join(cells) + f" | {target} | {mark} |"

    head = ("| # | figure | prover-supervisor (ours) | tini | dumb-init | supervisord | target (ours) | met? |\n"
            "|---|---|---|---|---|---|---|---|")
    rows = [head]
    if "exit" in res:
        rows.append(row("1a", "exit → reaped & classified, no grandchild: p50 / p99 ms", ("exit", "no_grandchild"),
                        lambda d: cell(d, "p50_ms", "p99_ms")))
        rows.append(row("1b", "… with a grandchild holding the stdout pipe: p50 / p99 ms", ("exit", "grandchild"),
                        lambda d: cell(d, "p50_ms", "p99_ms")))
    if "sigterm" in res:
        rows.append(row("2", "SIGTERM to the supervisor → child's handler: p50 / p99 ms", ("sigterm",),
                        lambda d: cell(d, "p50_ms", "p99_ms")))
    if "orphans" in res:
        n = next((d.get("created") for d in res["orphans"].values() if isinstance(d, dict) and d.get("created")), 0)
        rows.append(row("3a", f"orphan storm ({n:,} double-forked orphans, as PID 1): zombies 1 s after release",
                        ("orphans",), lambda d: cell(d, "zombies_after_1s", digits=0)))
        def rate(d: dict | None) -> str:
            if not d or "error" in d:
                return "error" if d else "–"
            done = d.get("all_reaped_after_s")
            when = fmt(done, 2) if done is not None else f"not all in {fmt(d.get('observed_s'), 0)} s"
            return f"{fmt(d.get('rate_per_s'), 0)} ({when})"

        rows.append(row("3b", "… reap rate, orphans/s (all reaped after s)", ("orphans",), rate))
    if "logs" in res:
        gib = res["logs"]["bytes"] / GiB
        size = f"{gib:g} GiB" if gib >= 1 else f"{res['logs']['bytes'] // MiB} MiB"
        rows.append(row("4a", f"log pass-through, {size} of 100-byte lines → pipe: MB/s of child lines delivered "
                              "(% of lines delivered)", ("logs", "pipe"),
                        lambda d: "–" if not d else "error" if "error" in d else
                        f"{fmt(d.get('mb_per_s'), 0)} ({fmt(d.get('delivered_pct'), 1)} %)"))
        rows.append(row("4b", "… child's own run time, s (pipe)", ("logs", "pipe"),
                        lambda d: cell(d, "child_run_s")))
        rows.append(row("4c", "… stdout → /dev/null: MB/s (child's run time, s)", ("logs", "devnull"),
                        lambda d: "–" if not d else "error" if "error" in d else
                        f"{fmt(d.get('mb_per_s'), 0)} ({fmt(d.get('child_run_s'))})"))
        cells = []
        for tool in TOOLS:
            a = res["logs"]["pipe"].get(tool, {})
            b = res["logs"]["devnull"].get(tool, {})
            cells.append(f"{fmt(a.get('supervisor_cpu_s_per_gib'))} / {fmt(b.get('supervisor_cpu_s_per_gib'))}")
        rows.append("| 4d | … supervisor's own CPU, s per GiB: pipe / /dev/null | " + " | ".join(cells) + " | – | – |")
        cells = []
        for tool in TOOLS:
            a = res["logs"]["pipe"].get(tool, {})
            cells.append(fmt(a.get("supervisor_peak_rss_mib"), 1))
        rows.append("| 4e | … supervisor's peak RSS during it, MiB (pipe) | " + " | ".join(cells) + " | – | – |")
        fc = res["logs"].get("ours_file_cost") or {}
        if fc and "error" not in fc:
            rows.append("| 4f | … ours only, in-process: CPU s per GiB of the per-child log file alone (tmpfs) / of "
                        "the whole per-chunk path (`ChildOutput.feed`) | "
                        f"{fmt(fc.get('file_cpu_s_per_gib'))} / {fmt(fc.get('feed_cpu_s_per_gib'))} "
                        "| – | – | – | – | – |")
    if "idle" in res:
        secs = res["idle"].get("ours", {}).get("seconds", 0)
        rows.append(row("5a", f"idle with a `sleep infinity` child, {secs:.0f} s: RSS MiB (USS)", ("idle",),
                        lambda d: "–" if not d else f"{fmt(d.get('rss_mib'), 1)} ({fmt(d.get('uss_mib'), 1)})"))
        rows.append(row("5b", "… CPU % of one core (wake-ups/s)", ("idle",),
                        lambda d: "–" if not d else
                        f"{fmt(d.get('cpu_pct_of_core'), 3)} ({fmt(d.get('wakeups_per_s'), 1)})"))
    if "first_child" in res:
        rows.append(row("6", "exec of the supervisor → first child's exec: p50 / p99 ms", ("first_child",),
                        lambda d: cell(d, "p50_ms", "p99_ms", digits=1)))
    if "after_exit" in res:
        rows.append(row("7", "a one-phase lifecycle (a oneshot) over: the child's exit → the supervisor's exit: "
                             "p50 / p99 ms", ("after_exit",), lambda d: cell(d, "p50_ms", "p99_ms", digits=1)))
    return "\n".join(rows)


def machine() -> dict:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(psutil.virtual_memory().total / GiB, 1),
            "kernel": platform.release(), "os": platform.freedesktop_os_release().get("PRETTY_NAME", "?"),
            "load_before": os.getloadavg()}


def write_doc(res: dict) -> None:
    m, v = res["meta"]["machine"], res["meta"]["versions"]
    checks = judge(res)
    misses = [c for c in checks if c[2] is False]
    notes = NOTES.read_text() if NOTES.exists() else ""
    lines = [
        "# Benchmarks",
        "",
        "prover-supervisor (ours) side by side with the init processes and the supervisor people would",
        "pick instead. Written by `python bench/run.py` from one run"
        f"{' (--quick: fewer iterations, smaller volumes)' if res['meta']['quick'] else ''}; "
        "every figure of every tool comes from that same run. Raw numbers: `bench/results.json`.",
        "",
        f"- **Date**: {res['meta']['date']}, run took {res['meta']['duration_s'] / 60:.1f} min",
        f"- **Machine**: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, {m['os']}, Linux {m['kernel']} "
        f"(a VM shared with other work: load average {', '.join(f'{x:.2f}' for x in m['load_before'])} before the run, "
        f"{', '.join(f'{x:.2f}' for x in m.get('load_after', ()))} after; the orphan storm itself makes 10,000 "
        "processes briefly runnable, which inflates the 1- and 5-minute figures)",
        f"- **Versions**: {v['ours']}; {v['tini']}; {v['dumb-init']}; {v['supervisord']} "
        f"(same CPython as ours, from PyPI)",
        "",
        "## Results",
        "",
        table(res),
        "",
        "Latencies are in milliseconds; p99 of n runs is interpolated between the two nearest runs (n per "
        "figure below). \"–\" means not applicable. The targets are ours; \"met?\" compares ours with them "
        "and with the peers' figures of the same run.",
        "",
        "### Targets",
        "",
        "| # | target | met? | figures |",
        "|---|---|---|---|",
        *[f"| {label} | {target} | {'yes' if met else '**no**'} | {why} |" for label, target, met, why in checks],
        "",
    ]
    if misses:
        lines += ["Missed: " + "; ".join(f"{label} ({why})" for label, _, _, why in misses) +
                  ". Why, and what would help: see *Notes* below.", ""]
    q = res["meta"]["quotas"]
    lines += [
        "## Method",
        "",
        "One child program for every tool, `bench/helper.c` (compiled with `cc -O3` at the start), so that "
        "a child's timestamps cost the same everywhere and nothing of Python's start-up is in them. Every "
        "timestamp on both sides is `CLOCK_MONOTONIC`. The bench is a child subreaper: whatever a run leaves "
        "behind comes back to it and is killed; everything lives under a scratch directory in /dev/shm. "
        f"The first {WARMUP} runs of each series are dropped. Ours runs as `python -m supervisor run --config F` "
        "from a copy of `supervisor/` taken when the run starts (the version above), "
        "with its defaults (per-phase memory cgroup, oom_score_adj, per-child log file in `log_dir`, here on "
        "tmpfs; `state_dir` on disk under /var/tmp, since it fsyncs `status.json` there as in production; "
        "only `stop_grace_s = 2` and `termination_log` set); tini runs with `-s` (a subreaper, as ours is) "
        "except as PID 1; dumb-init with its defaults; "
        "supervisord as in a container: `nodaemon=true`, its log and the program's output on stdout "
        "(`stdout_logfile=/dev/stdout`, `redirect_stderr`), `startsecs=0`.",
        "",
        f"1. **Exit → reaped and classified** ({q['exit_runs']} runs; supervisord {q['exit_runs_supervisord']}, "
        "each can take up to two seconds). The child sleeps a random 10–30 ms, appends its pid and the time to a "
        "file as its last act, and exits 0. *1b*: it first forks a grandchild that keeps stdout and stderr open "
        "for 30 s. Observable: **ours**, the verdict line `ended: phase=… pid=…` arriving on its stdout pipe, "
        "timestamped by a bench thread blocked in `read` on it (the child is a `service` with "
        "`restart = \"always\"` and a 10 ms backoff, so one supervisor yields every run; matched by pid). "
        "**tini / dumb-init** exit when their child does and print nothing: their exit, seen by the bench's "
        "`waitpid` (one fresh process per run). **supervisord**: its `exited: child (exit status 0; expected)` "
        "line on its stdout pipe (`autorestart=true`; matched in order). supervisord's child sleeps a random "
        "20–1020 ms instead, so that its exits fall at every phase of its 1-second poll timer.",
        f"2. **SIGTERM → the child's handler** ({q['term_runs']} runs; supervisord {q['term_runs_supervisord']}). "
        "Ours, tini and dumb-init take turns run by run; supervisord's runs come after. "
        "A fresh supervisor per run; once the child has written its ready file and the supervisor has idled "
        "30–60 ms (supervisord: 50–1050 ms, to sample its timer's phase), the bench notes the time and "
        "sends SIGTERM to the supervisor; the child's C handler writes the time (async-signal-safe) and exits.",
        f"3. **Orphan storm**: each tool is PID 1 of `unshare --pid --fork --mount-proc`; its child double-forks "
        f"{q['orphans']:,} orphans that block on a pipe, and once all exist closes the pipe (time noted): all "
        "exit at once and are re-parented to PID 1. The bench counts PID 1's children in "
        "`/proc/PID/task/*/children` every 10 ms (less the storm process, which stays alive), scans their "
        "states 1 s after the release (zombies = state Z), and takes the rate as orphans / time until none is "
        f"left (or reaped / {q['storm_window_s']:.0f} s when that never happens). The rate includes the "
        "kernel's work of running 10,000 exits on 2 cores, the same for every tool.",
        f"4. **Log pass-through**: the child writes {q['log_bytes'] // MiB} MiB of 100-byte lines in 64 KiB "
        "writes, the last one marked. *Pipe*: the supervisor's stdout is a pipe read by a C reader "
        "(`helper sink`, 1 MiB reads) that counts the child's lines and notes when the marked line arrives; "
        "MB/s = lines delivered × 100 B / (marked line's arrival − child's start), or the pipe's EOF if the "
        "marked line never arrives. *`/dev/null`*: MB/s = bytes / the child's own run time (the supervisor "
        "drains the pipe as it goes, so that is its processing time give or take a pipe buffer). Supervisor "
        "CPU from `wait4`'s rusage less the child's own `getrusage`; peak RSS of the supervisor process alone, "
        "sampled every 20 ms. Ours prefixes each line "
        "with a time and `[phase/name]` and also writes every byte to `log_dir/<phase>.log` (tmpfs here, "
        "rolled at 64 MiB); its console drops lines rather than block the child when the reader is slower "
        "(delivered % shows it). The per-child log file's own cost is measured in-process on the same tmpfs "
        "(`LogFile.write` of 64 KiB chunks, what one read of a full pipe brings) and the whole per-chunk path "
        "(`ChildOutput.feed`: file, line splitting, ring, console formatting) the same way.",
        f"5. **Idle**: all four side by side for {q['idle_s']:.0f} s, each supervising `sleep infinity`; psutil on "
        "the supervisor process only (not its child): RSS and USS at the end, user+system CPU over the "
        "window, wake-ups = voluntary + involuntary context switches of all its threads.",
        f"6. **Exec → first child** ({q['start_runs']} runs; supervisord {q['start_runs_supervisord']}): "
        "`helper stampexec` notes the time and execs the "
        "supervisor; the first child (`helper start`) notes the time first thing in `main`.",
        f"7. **The child's exit → the supervisor's exit** ({q.get('after_exit_runs', '–')} runs; ours, tini and "
        "dumb-init take turns run by run; supervisord does not exit when its program does). A fresh supervisor "
        "per run, ours with its own new `state_dir` and the phase a `oneshot` (one phase: its end is the "
        "lifecycle's); the child lives 150–250 ms, appends its pid and the time to a file as its last act and "
        "exits 0; the supervisor's exit is seen by the bench's `waitpid`. For ours that is the verdict, the "
        "whole teardown (what is left killed and reaped, the phase cgroup removed, `status.json` saved, "
        "the threads and files closed) and the interpreter's shutdown.",
        "",
    ]
    if notes:
        lines += ["## Notes", "", notes.strip(), ""]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(lines))
    say(f"wrote {DOC.relative_to(REPO)}")


# ====================================================================== main


def main(argv: list[str]) -> int:
    global WORK, DISK, HELPER
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations and smaller volumes (~3 min)")
    ap.add_argument("--only", default="", help="comma list of figures to run (1-7); the doc is then not written")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma list of tools (default: all four)")
    ap.add_argument("--doc-only", action="store_true",
                    help="rewrite docs/benchmarks.md from bench/results.json (e.g. after editing bench/notes.md)")
    args = ap.parse_args(argv)
    if args.doc_only:
        write_doc(json.loads(RESULTS.read_text()))
        return 0
    bootstrap(argv)
    only = {x.strip() for x in args.only.split(",") if x.strip()} or {"1", "2", "3", "4", "5", "6", "7"}
    q = Quotas(args.quick)
    started = time.monotonic()
    WORK = Path(tempfile.mkdtemp(prefix="prover-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    DISK = Path(tempfile.mkdtemp(prefix="prover-bench-", dir="/var/tmp"))
    make_subreaper()
    res: dict = {}
    try:
        HELPER = compile_helper()
        ours_py = os.environ.get("BENCH_OURS_PYTHON", ours_python())
        Ours.snapshot = snapshot_ours()
        every: dict[str, Tool] = {"ours": Ours(ours_py), "tini": Tini(), "dumb-init": DumbInit(),
                                  "supervisord": Supervisord(BENCH_VENV)}
        every["ours"].probe_keys()  # type: ignore[attr-defined]
        tools = {k: every[k] for k in args.tools.split(",") if k in every}
        res["meta"] = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
                       "machine": machine(), "versions": {k: t.version() for k, t in every.items()},
                       "quick": args.quick, "quotas": vars(q)}
        say("versions: " + "; ".join(f"{k}: {v}" for k, v in res["meta"]["versions"].items()))
        steps = [("1", "exit", lambda: bench_exit(tools, q)), ("2", "sigterm", lambda: bench_sigterm(tools, q)),
                 ("3", "orphans", lambda: bench_orphans(tools, q)),
                 ("4", "logs", lambda: bench_logs(tools, q, ours_py)),
                 ("5", "idle", lambda: bench_idle(tools, q)), ("6", "first_child", lambda: bench_first_child(tools, q)),
                 ("7", "after_exit", lambda: bench_after_exit(tools, q))]
        for key, name, fn in steps:
            if key in only:
                res[name] = fn()
                reap_strays(0.5)
    finally:
        reap_strays(2.0)
        os.chdir(REPO)
        shutil.rmtree(WORK, ignore_errors=True)
        shutil.rmtree(DISK, ignore_errors=True)
    res["meta"]["duration_s"] = time.monotonic() - started
    res["meta"]["machine"]["load_after"] = os.getloadavg()
    if len(only) == 7 and args.tools == ",".join(TOOLS):
        RESULTS.write_text(json.dumps(res, indent=2, default=str) + "\n")  # the doc's numbers, kept in git
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "results.json").write_text(json.dumps(res, indent=2, default=str))
    print()
    print(table(res))
    print()
    for label, target, met, why in judge(res):
        print(f"{label}: {'met' if met else 'MISSED'}: {target}: {why}")
    if len(only) == 7 and args.tools == ",".join(TOOLS):
        write_doc(res)
    say(f"done in {res['meta']['duration_s'] / 60:.1f} min; raw results in bench/out/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
