"""Health and metrics over HTTP on 127.0.0.1 (off unless ``[supervisor] http_port`` is set).

``/healthz``: the event loop is alive (its heartbeat is recent). ``/readyz``:
the production phase is up. ``/metrics``: Prometheus text format, written by
hand (the format is small; a client library would not earn its place).
The loop publishes what these answer on each heartbeat; the HTTP thread only
reads it, so a stuck loop shows as a failing /healthz rather than a hang.

A connection costs a thread while it is served, so connections are held to what the status socket
holds its clients to: one that sends nothing for ``IDLE_S`` is closed, none is kept past
``CONNECTION_LIFE_S`` however it drips, and at most ``CONNECTIONS_MAX`` are served at once (past that
the oldest is dropped: a pile of idle ones must not keep out the probe that asks). Drops are said in
the log, the first and every ``DROPS_SAID_EVERY``-th. An accept that fails (out of file descriptors) rests
the serving thread ``ACCEPT_BACKOFF_S`` and is said once, as the status socket's is (socket.AcceptTrouble).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..evidence.watchstate import BLIND
from .model import GpuStatus, Snapshot, json_number
from .socket import ACCEPT_BACKOFF_S, AcceptTrouble, client_left

HEARTBEAT_S = 1.0
# /healthz fails when the loop has not ticked for this long.
STALE_AFTER_S = 10.0
# A connection that sends nothing (no request, or no more of one) for this long is closed.
IDLE_S = 5.0
# No connection is kept longer than this, however slowly it drips its request.
CONNECTION_LIFE_S = 10.0
# The most connections served at once (a thread each); past that the oldest is dropped.
CONNECTIONS_MAX = 16
DROPS_SAID_EVERY = 100


class HealthState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_tick = time.monotonic()
        self.unready: str | None = "production is not up"  # why /readyz says not ready; None: ready
        self.metrics = ""

    def publish(self, unready: str | None, metrics: str) -> None:
        with self.lock:
            self.last_tick = time.monotonic()
            self.unready = unready
            self.metrics = metrics


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = IDLE_S  # each read and write of the connection (StreamRequestHandler sets it on the socket)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            age = time.monotonic() - state.last_tick
            unready, metrics = state.unready, state.metrics
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            ok = age < STALE_AFTER_S
            self._answer(200 if ok else 503, f"{'ok' if ok else 'stale'}: loop heartbeat {age:.1f}s ago\n")
        elif path == "/readyz":
            self._answer(503, f"not ready: {unready}\n") if unready else self._answer(200, "ready\n")
        elif path == "/metrics":
            self._answer(200, metrics, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._answer(404, "not found\n")

    def _answer(self, status: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, port: int, state: HealthState, log: Callable[[str], None] | None) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.state = state
        self._log = log
        self._served: dict[socket.socket, float] = {}  # being served → when accepted (monotonic), oldest first
        self._served_lock = threading.Lock()
        self._dropped = 0
        self._say_at = 1  # the drop count at which the next line is due: the first, then every hundredth
        self._trouble = AcceptTrouble("health", log or (lambda _line: None))
        self._closing = threading.Event()  # set by shutdown: a rest after a failed accept ends at once

    def get_request(self) -> tuple[socket.socket, Any]:
        """The next connection. A failed accept (out of file descriptors) leaves it queued and the socket
        readable: serve_forever would try again at once, at full CPU, saying nothing. The serving thread
        rests ACCEPT_BACKOFF_S first, and the trouble is said once (socketserver drops the error)."""
        try:
            request = super().get_request()
        except OSError as exc:
            if not client_left(exc):
                self._trouble.failing(exc)
                self._closing.wait(ACCEPT_BACKOFF_S)
            raise
        self._trouble.accepted()
        return request

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the new connection, once there is room: the oldest is dropped to make it."""
        with self._served_lock:
            self._drop_while(lambda: len(self._served) >= CONNECTIONS_MAX)
            self._served[request] = time.monotonic()
        self._say_drops()
        super().process_request(request, client_address)

    def service_actions(self) -> None:
        """Each turn of serve_forever (every half second): a connection past its life is dropped."""
        now = time.monotonic()
        with self._served_lock:
            self._drop_while(lambda: now - next(iter(self._served.values())) > CONNECTION_LIFE_S)
        self._say_drops()

    def _drop_while(self, crowded: Callable[[], bool]) -> None:
        """Drop the oldest connections while ``crowded()`` (the lock held). Its thread's read or write
        then fails at once, and it ends (closing the socket in shutdown_request)."""
        while self._served and crowded():
            oldest = next(iter(self._served))
            del self._served[oldest]
            with contextlib.suppress(OSError):
                oldest.shutdown(socket.SHUT_RDWR)
            self._dropped += 1

    def _say_drops(self) -> None:
        with self._served_lock:
            total, due = self._dropped, self._dropped >= self._say_at
            if due:
                self._say_at = (total // DROPS_SAID_EVERY + 1) * DROPS_SAID_EVERY
        if due and self._log is not None:
            self._log(f"health: dropped a connection to 127.0.0.1:{self.server_address[1]} (at most "
                      f"{CONNECTIONS_MAX} at once, each {CONNECTION_LIFE_S:g}s at most); {total} dropped so far")

    def shutdown_request(self, request: Any) -> None:
        with self._served_lock:
            self._served.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that could not be served (no thread for it, a client gone or dropped, idle too long):
        that client goes without an answer; socketserver's default would print a traceback to stderr."""


class HealthServer:
    def __init__(self, port: int, state: HealthState, log: Callable[[str], None] | None = None) -> None:
        """Raises OSError (cannot listen) or RuntimeError (no thread to serve it), with nothing left open.
        ``log`` hears the connections dropped (from the serving thread)."""
        self._server = _Server(port, state, log)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            self._server.server_close()
            raise

    def close(self) -> None:
        if self._thread.is_alive():  # (shutdown waits for serve_forever to notice: it must be running)
            self._server.shutdown()
        self._server.server_close()


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Exact: byte counts must not lose digits to a short float format."""
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


# A download's figures (a phase's ``progress``: model.DownloadProgress), each a gauge of its own.
PROGRESS_FIGURES = (("done_bytes", "Bytes a phase has done of its download (its progress)."),
                    ("total_bytes", "Bytes a phase's download is expected to total (progress_total)."),
                    ("rate_bytes_s", "A phase's download rate, bytes a second over its window."),
                    ("eta_s", "Seconds until a phase's download is done, at that rate."))


def metrics_text(snap: Snapshot, gpus: GpuStatus | None = None) -> str:
    """Prometheus exposition text from a status snapshot; ``gpus``: the GPUs as last read, where the snapshot
    left their figures out (the heartbeat's)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, object], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            rendered = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            shown = _number(value)
            lines.append(f"{name}{{{rendered}}} {shown}" if rendered else f"{name} {shown}")

    phases = snap.phases
    metric("prover_supervisor_up", "gauge", "The supervisor's loop is running.", [({}, 1)])
    metric("prover_supervisor_phase_info", "gauge", "Each phase's current state (1 for the state it is in).",
           [({"phase": p.name, "state": p.state}, 1) for p in phases])
    metric("prover_supervisor_phase_attempts", "gauge", "Attempts started per phase (restarts + 1).",
           [({"phase": p.name}, p.attempt or 0) for p in phases])
    for key, help_text in PROGRESS_FIGURES:
        metric(f"prover_supervisor_phase_progress_{key}", "gauge", help_text,
               [({"phase": p.name}, figure) for p in phases
                if p.progress is not None and (figure := getattr(p.progress, key)) is not None])
    added: dict[str, list[tuple[dict[str, object], float]]] = {}  # what a plugin adds (Wiring.add_status)
    for p in phases:
        plugin_metrics = p.plugin.get("metrics")
        for name, value in (plugin_metrics.items() if isinstance(plugin_metrics, dict) else ()):
            if (number := json_number(value)) is not None:  # (a number, not NaN, within a float's range)
                added.setdefault(name, []).append(({"phase": p.name}, float(number)))
    for name, samples in sorted(added.items()):
        metric(f"prover_supervisor_{name}", "gauge", f"{name} per phase (the plugin's).", samples)
    reasons = Counter(v.reason for v in snap.verdicts)
    metric("prover_supervisor_verdicts", "gauge", "Ended children by reason (last 50 kept).",
           [({"reason": r}, n) for r, n in sorted(reasons.items(), key=lambda item: str(item[0]))])
    mem = snap.memory
    for key, value, help_text in (("oom_kills", mem.oom_kills, "OOM kills seen in this run, in every cgroup watched."),
                                  ("usage", mem.usage, "Memory use of the container's cgroup, bytes."),
                                  ("limit", mem.limit, "Least memory limit over the container's cgroup, bytes.")):
        if value is not None:
            metric(f"prover_supervisor_memory_{key}", "gauge", help_text, [({}, float(value))])
    if snap.manager.enabled:
        metric("prover_supervisor_outbox_pending", "gauge", "Manager calls not delivered yet.",
               [({}, float(snap.manager.outbox_pending or 0))])
    gpu = snap.gpus if gpus is None else gpus
    # A reading that is no longer current (NVML hung, samples stopped) is left out: a scrape must never read
    # frozen figures as now. Its age says how old the last one is.
    current = () if gpu.samples_stale else gpu.samples
    metric("prover_supervisor_gpu_utilization_percent", "gauge", "GPU utilisation per GPU (NVML).",
           [({"gpu": g.index}, g.utilization) for g in current if g.utilization is not None])
    metric("prover_supervisor_gpu_memory_used_bytes", "gauge", "GPU memory used per GPU (NVML).",
           [({"gpu": g.index}, g.memory_used) for g in current if g.memory_used is not None])
    metric("prover_supervisor_gpu_sample_age_seconds", "gauge",
           "Seconds since the GPUs were last sampled; the per-GPU figures are left out once it is not current.",
           [({}, gpu.sampled_s_ago)] if gpu.sampled_s_ago is not None else [])
    metric("prover_supervisor_watch_blind", "gauge", "1 for a watch that is blind (no reading within its window).",
           [({"watch": name}, 1 if w.state == BLIND else 0) for name, w in snap.watches.items()])
    return "\n".join(lines) + "\n"
