"""Stand-in for ``curio``, the production worker.

Usage::

    python -m supervisor.prover.standins.curio run [--listen 0.0.0.0:12300] [--layers a,b] [--name N] [--nosync]
    python -m supervisor.prover.standins.curio fetch-params <size>          # delegates to paramfetch.main
    python -m supervisor.prover.standins.curio cli --machine <host:port> wait-api [--timeout 30s]
    python -m supervisor.prover.standins.curio --version

``run`` logs its start-up (go-log lines, JSON when ``GOLOG_LOG_FMT=json``; env
``CURIO_LAYERS``, ``CURIO_NODE_NAME`` are the defaults of ``--layers``/``--name``, and
``CURIO_DB_HOST``/``CURIO_DB_PORT``/``CURIO_DB_NAME`` and ``FIL_PROOFS_PARAMETER_CACHE`` are
echoed), waits a moment for "chain sync" unless ``--nosync``, then listens on TCP
``--listen`` (every connection is accepted and closed: there is no health endpoint;
binding fails, exit 1, if the port is taken) and logs a task line every second (scaled).
SIGTERM / SIGINT: graceful shutdown: logs a line, keeps serving for the drain
(``STANDIN_DRAIN_S`` seconds, default 0.2 scaled; ``inf`` waits forever, like curio
waiting on a task that never ends), then exits 0; further SIGTERM/SIGINT are ignored
meanwhile. ``STANDIN_RUN_SECONDS=N``: shut down the same way by itself after N seconds.
``STANDIN_TASK_S`` sets the task-line interval. The API port answers ``GET /debug/metrics`` with
Prometheus text in curio's names (``curio_harmonytask_tasks_completed{task_name="PoRep"}``,
``..._tasks_failed``, ``..._tasks_started``, ``..._active_tasks``; harmony/harmonytask/metrics.go); any
other connection is closed. Every task interval it does one PoRep: with ``CURIO_CUZK_ADDRESS`` set (in place of
its ``[Cuzk] Address``, which the real curio reads from its config layers in its database, never from its
environment; the cuzk-config prepare exports the value for that layer), a real ``POST /prove`` to the cuzk-daemon,
counted completed or failed by its answer; without it, a simulated one that completes. The address is read as
curio's client reads it (lib/cuzk/client.go ``connect``): ``host:port`` (dialled as ``dns:///host:port``), or
``unix:///path``, or a gRPC target (``dns:///host:port``); any other scheme (``http://...``) names no resolver,
the target resolves to nothing, and every proof fails, said in an error line (``produced zero addresses``).
Every task interval stands for an epoch too: a WinPost not won, which completes with no proof at all (curio's
tasks/winning/winning_task.go ``persistNoWin``), counted completed whatever cuzk does, as the real one counts it.
Partway point for STANDIN_FAIL: right
after the first task line. ``cli ... wait-api`` polls a TCP connect to the machine
until it succeeds (exit 0) or the timeout passes (exit 1).
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from typing import Any

from . import cuzk_bench, failures, knobs, output

VERSION = "1.24.4+mainnet+git_standin"
LOGGER = "curio"
TASKS = ("PoRep", "SDRTrees", "WdPost", "WinPost", "UpdateProve", "CommitBatch")


class ShutdownRequested(Exception):
    """SIGTERM/SIGINT arrived (raised in the main thread by the handler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(failures.signal_name(signum))
        self.signum = signum


class _Parser(argparse.ArgumentParser):
    """urfave/cli style: usage errors exit 1."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        output.err(f"Incorrect Usage: {message}")
        raise SystemExit(1)


def _log(level: str, msg: str, caller: str = "cmd/curio/run.go:120", **fields: Any) -> None:
    output.golog(LOGGER, level, msg, caller=caller, **fields)


def _on_signal(signum: int, _frame: Any) -> None:
    raise ShutdownRequested(signum)


def _parse_listen(text: str) -> tuple[str, int]:
    kind, where = knobs.parse_addr(text)
    if kind != "tcp":
        raise ValueError(f"--listen must be host:port, got {text!r}")
    return where


def run(argv: list[str]) -> int:
    parser = _Parser(prog="curio run")
    parser.add_argument("--listen", default="0.0.0.0:12300")
    parser.add_argument("--layers", default=os.environ.get("CURIO_LAYERS", ""))
    parser.add_argument("--name", default=os.environ.get("CURIO_NODE_NAME", ""))
    parser.add_argument("--nosync", action="store_true")
    parser.add_argument("--manage-fdlimit", default="true")
    args = parser.parse_args(argv)
    try:
        host, port = _parse_listen(args.listen)
    except ValueError as exc:
        output.err(f"ERROR: {exc}")
        return 1
    try:
        failures.setup("curio")
    except knobs.UsageError as exc:
        output.err(f"ERROR: {exc}")
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        failures.handle_signal(sig, _on_signal)

    listener: socket.socket | None = None
    run_for = float("inf")
    if os.environ.get("STANDIN_RUN_SECONDS", "").strip():
        run_for = knobs.env_seconds("STANDIN_RUN_SECONDS", 0.0)
    deadline = time.monotonic() + run_for
    reason = ""
    try:
        layers = [x for x in args.layers.split(",") if x]
        name = args.name or socket.gethostname()
        _log("info", "Starting curio node", version=VERSION, name=name, layers=layers)
        _log("info", "Connecting to HarmonyDB", caller="harmonydb/harmonydb.go:110",
             host=os.environ.get("CURIO_DB_HOST", "127.0.0.1"), port=os.environ.get("CURIO_DB_PORT", "5433"),
             database=os.environ.get("CURIO_DB_NAME", "yugabyte"))
        _log("info", "parameter cache", caller="deps/deps.go:214",
             path=os.environ.get("FIL_PROOFS_PARAMETER_CACHE", "/var/tmp/filecoin-proof-parameters"))
        if not args.nosync:
            _log("info", "waiting for chain sync", caller="deps/deps.go:301")
            knobs.sleep(knobs.scaled(0.2))
            _log("info", "chain sync complete", caller="deps/deps.go:309")
        listener = _bind(host, port)
        if listener is None:
            return 1
        _log("info", "Curio API server listening", caller="rpc/rpc.go:318", address=args.listen)
        _log("info", "Curio started; waiting for tasks", name=name)
        reason = serve(listener, deadline)
    except ShutdownRequested as exc:
        reason = f"received {exc}"
    return shutdown(listener, reason)


def _bind(host: str, port: int) -> socket.socket | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        _log("error", f"starting API server: listen tcp {host}:{port}: {exc.strerror or exc}",
             caller="rpc/rpc.go:321")
        return None
    sock.setblocking(False)
    return sock


class Tasks:
    """curio's harmonytask counters, per task name (what /debug/metrics serves)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[str, int] = {}
        self.completed: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.active: dict[str, int] = {}

    def begin(self, name: str) -> None:
        with self.lock:
            self.started[name] = self.started.get(name, 0) + 1
            self.active[name] = self.active.get(name, 0) + 1

    def end(self, name: str, ok: bool) -> None:
        with self.lock:
            self.active[name] -= 1
            counts = self.completed if ok else self.failed
            counts[name] = counts.get(name, 0) + 1

    def metrics(self) -> str:
        lines = []
        with self.lock:
            for metric, counts in (("tasks_started", self.started), ("tasks_completed", self.completed),
                                   ("tasks_failed", self.failed), ("active_tasks", self.active)):
                lines.append(f"# TYPE curio_harmonytask_{metric} {'gauge' if metric == 'active_tasks' else 'counter'}")
                for name, count in sorted(counts.items()):
                    source = ',source="poller"' if metric == "tasks_started" else ""
                    lines.append(f'curio_harmonytask_{metric}{{task_name="{name}"{source}}} {count}')
        return "\n".join(lines) + "\n"


TASKS_STATE = Tasks()


def cuzk_target(address: str) -> tuple[str, Any] | None:
    """curio's [Cuzk] Address as its gRPC client dials it: where to connect, or None when the target resolves to
    nothing (a scheme gRPC has no resolver for, or no host:port after it)."""
    if address.startswith("unix://"):
        return "unix", address[len("unix://"):]
    if "://" not in address and not address.startswith("unix:"):
        address = f"dns:///{address}"
    scheme, _, rest = address.partition("://")
    if scheme != "dns":
        return None
    try:
        return knobs.parse_addr(rest.rpartition("/")[2])
    except ValueError:
        return None


def prove_porep(address: str, task_id: int) -> None:
    """One PoRep through the cuzk-daemon (its answer decides), or simulated without one."""
    TASKS_STATE.begin("PoRep")
    ok = True
    if address:
        target = cuzk_target(address)
        if target is None:
            ok = False
            _log("error", "cuzk prove failed", caller="cuzk/client.go:120", addr=address,
                 error="rpc error: code = Unavailable desc = name resolver error: produced zero addresses")
        else:
            body = {"type": "porep", "job": f"curio-porep-{task_id}"}
            answer = cuzk_bench.prove_once(target, body, knobs.scaled(30.0), False, address)
            ok = not isinstance(answer, cuzk_bench.NoAnswer) and answer.status == "COMPLETED"
    TASKS_STATE.end("PoRep", ok)


def _answer(conn: socket.socket) -> None:
    """GET /debug/metrics is answered; anything else (a readiness connect) is closed."""
    try:
        conn.settimeout(1.0)
        request = conn.recv(4096).decode(errors="replace")
        if request.startswith("GET /debug/metrics"):
            body = TASKS_STATE.metrics().encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    except OSError:
        pass
    finally:
        conn.close()


def _accept_for(listener: socket.socket, seconds: float) -> None:
    """Accept connections for ``seconds`` (``inf``: forever): /debug/metrics answered, the rest closed."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select([listener], [], [], min(left, 0.5))
        if ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.setblocking(True)
            failures.start_thread(threading.Thread(target=_answer, args=(conn,), daemon=True))


def serve(listener: socket.socket, deadline: float) -> str:
    """Serve, logging a task line every interval, until ``deadline``; returns why it stopped."""
    interval = max(0.01, knobs.env_seconds("STANDIN_TASK_S", 1.0))
    task_id = 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "run time (STANDIN_RUN_SECONDS) elapsed"
        _accept_for(listener, min(interval, deadline - now))
        if time.monotonic() >= deadline:
            return "run time (STANDIN_RUN_SECONDS) elapsed"
        task_id += 1
        # (Its SIGTERM handler raises in the main thread: the start holds it.)
        address = os.environ.get("CURIO_CUZK_ADDRESS", "").strip()
        failures.start_thread(threading.Thread(target=prove_porep, args=(address, task_id), daemon=True))
        TASKS_STATE.begin("WinPost")  # the epoch's WinPost, not won: done, no proof asked of anyone
        TASKS_STATE.end("WinPost", True)
        _log("info", "task completed", caller="harmonytask/task_type_handler.go:245",
             task=TASKS[task_id % len(TASKS)], id=task_id, took=f"{interval:.2f}s")
        failures.partway()


def shutdown(listener: socket.socket | None, reason: str) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        failures.handle_signal(sig, signal.SIG_IGN)
    output.unsilence()
    drain = knobs.env_seconds("STANDIN_DRAIN_S", 0.2)
    _log("warn", f"Shutting down gracefully ({reason}); waiting for running tasks",
         caller="cmd/curio/run.go:190")
    if listener is not None:
        _accept_for(listener, drain)
        listener.close()
    else:
        knobs.sleep(drain)
    _log("warn", "Graceful shutdown successful", caller="cmd/curio/run.go:199")
    return 0


def _parse_duration(text: str) -> float:
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"invalid duration {text!r}")
    for number, unit in parts:
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def cli(argv: list[str]) -> int:
    parser = _Parser(prog="curio cli")
    parser.add_argument("--machine", required=True, help="host:port of the curio API")
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait-api")
    wait.add_argument("--timeout", default="30s")
    args = parser.parse_args(argv)
    try:
        host, port = _parse_listen(args.machine)
        timeout = _parse_duration(args.timeout)
    except ValueError as exc:
        output.err(f"ERROR: {exc}")
        return 1
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return 0
        except OSError as exc:
            if time.monotonic() >= deadline:
                output.err(f"ERROR: timed out waiting for api to come online: {exc.strerror or exc}")
                return 1
            output.out(f"Not online yet... ({exc.strerror or exc})")
        time.sleep(max(0.01, min(knobs.scaled(1.0), deadline - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    output.init_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        output.out("usage: curio run|fetch-params|cli|--version ...")
        return 0 if args else 1
    command, rest = args[0], args[1:]
    if command in ("-v", "--version", "version"):
        output.out(f"curio version {VERSION}")
        return 0
    if command == "run":
        return run(rest)
    if command == "fetch-params":
        from . import paramfetch

        return paramfetch.main(args, prog="curio")
    if command == "cli":
        return cli(rest)
    output.err(f"No help topic for '{command}'")
    return 1


if __name__ == "__main__":
    sys.exit(main())
