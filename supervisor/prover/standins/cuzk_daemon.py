"""Stand-in for ``cuzk-daemon``, the GPU proving engine.

Usage::

    python -m supervisor.prover.standins.cuzk_daemon -c <config.toml> [-l <listen>] [--log-level L] [--version]

Reads the TOML if it exists: its keys, and what a missing or malformed file does, in cuzk_settings.
``-l`` overrides listen.

Behaviour, as the real daemon: ANSI-coloured tracing log lines; ``cuzk-daemon ready`` is
logged BEFORE the sockets are bound (0.3 s scaled later, ``STANDIN_BIND_DELAY_S``), so
ready means ``GET /status`` answers on status_listen or a connect to listen succeeds.
``POST /prove`` on listen (JSON body ``{"type": "porep", "job": "...", "c1": "..."}``)
queues for a GPU worker, simulates a proof and answers
``{"job", "status": "COMPLETED"|"CANCELLED", "prove_ms", "queue_ms"}``. The first proof
after a cold start starts the PCE's extraction on a thread of its own, as the real engine does, and
goes on: "background PCE extraction starting for PoRep 32G", then the file written to
``<param_cache>/pce-porep-32g.tmp`` and renamed ``.bin`` ("PCE saved to disk"; a missing directory
is "failed to save PCE to disk (non-fatal)"), then "background PCE extraction complete". Nothing
waits for it, the shutdown neither: stopped before, the PCE is lost. Later starts load it;
``CUZK_DISABLE_PCE=1`` turns it off. Each
proof prints ``TIMELINE,<ms since start>,<event>,<job>,<detail>`` lines. ``GET /status`` on
status_listen answers JSON in the real daemon's shape (curio ``extern/cuzk/cuzk-core/src/status.rs``):
``uptime_secs``, ``memory {total_bytes, used_bytes, available_bytes}``, ``synthesis``, ``pipelines [...]``,
``gpu_workers [...]``, ``allocations``, ``counters {total_completed, total_failed, completed_by_kind,
failed_by_kind, queue_depth}``, ``buffers``. Its counters count what the real one's count, and no more
(STATUS_KINDS, below): a PoRep or SnapDeals proof completed; a PoRep whose self-check failed. A proof that
fails any other way, and every PoSt proof, is in no counter of ``/status``.

``STANDIN_FAIL_PROOFS``: ``1`` makes every proof fail (answered ``FAILED``); a path makes proofs fail while that
file exists. ``STANDIN_FAIL_PROOFS_AS`` says how: ``gpu`` (the default: the partition's GPU prove fails, the
common way a bad GPU fails proofs; counted nowhere in ``/status``) or ``self-check`` (the assembled PoRep does
not verify; counted in ``total_failed`` and ``failed_by_kind``; a kind the real one does not self-check fails
as ``gpu``).

Generations (``STANDIN_CUZK_GENERATION``, ``unified`` or ``partition-workers``): see cuzk_generations.
The HTTP servers and their routes: cuzk_http.

Signals: SIGTERM: default action, dies at once, no cleanup. SIGINT as ``STANDIN_CUZK_SIGINT`` says:

* ``exit`` (the default; kinder than the real one): graceful shutdown (in-flight proofs answer CANCELLED,
  servers closed, exit 0; a second SIGINT exits 130 at once).
* ``serve-on`` (the real one): curio's extern/cuzk/cuzk-daemon/src/main.rs (read at e0294b0) installs its
  only handler, ``tokio::signal::ctrl_c()`` in a spawned task, right after it logs ``cuzk-daemon ready``
  (233-239 on a unix socket, 260-266 on TCP): before that SIGINT's default action kills it. The handler
  logs ``received SIGINT, shutting down`` and calls ``engine.shutdown()`` (cuzk-core/src/engine.rs 3720-3727:
  ``shutting down cuzk engine``, then the workers are told to stop picking up jobs; "currently running
  proofs will be allowed to finish"), and that is all: ``Server::serve`` has no shutdown signal wired
  (268-277), so the process keeps its listeners and serves on, never exiting, until SIGKILL or SIGTERM. The
  stand-in logs the two lines (not the workers' own "received shutdown signal" lines), lets a proof that
  holds a GPU worker finish, and leaves every proof still queued, or submitted since, waiting for ever, as the
  real one's RPC does (its ``submit`` still queues them). ``/status`` answers on. A later SIGINT does nothing
  (tokio's handler stays installed).

Environment: ``STANDIN_PROOF_S`` (seconds per proof, default 1.0 scaled), ``STANDIN_PCE_S``
(PCE extraction, default 0.5 scaled; its save takes half as long again), ``STANDIN_SRS_LOAD_S``
(startup SRS load, default 0.3 scaled), ``STANDIN_BIND_DELAY_S``, ``STANDIN_REQUIRE_PARAMS=1``
(fail at start, exit 1, unless param_cache holds a ``*.params`` file), ``STANDIN_DAEMON_MIN_BUDGET``
(size; a smaller memory budget fails at start with "insufficient memory budget for SRS", exit 1),
``STANDIN_CUZK_VERSION`` (``--version`` output), plus the common
knobs; the partway point is after ``STANDIN_FAIL_AFTER`` (default 1) proofs completed, 0
meaning during the first proof's PCE extraction (the real field failure).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import cuzk_generations as generations
from . import cuzk_settings, failures, knobs, output
from .cuzk_generations import GIB
from .cuzk_http import Server, make_server
from .cuzk_settings import Log, Settings, StartupError

PCE_FILE = "pce-porep-32g.bin"
MAIN_NAP_S = 0.1
SRS_BYTES = 44 * GIB
PCE_BYTES = 26 * GIB
PARTITION_BYTES = int(13.6 * GIB)

# What the real /status counts (curio extern/cuzk cuzk-core/src/engine.rs, read at e0294b0): its StatusTracker's
# job_completed is called only where a partitioned proof is assembled (625, 634): a PoRep or SnapDeals proof done,
# or a PoRep whose assembled proof fails its self-check. A partition's GPU prove failure or panic (655-700), a C1
# parse or synthesis failure, the slotted and batched paths and every PoSt proof (the monolithic path) reach only
# the gRPC counters (record_failure, record_completion), which the stand-in does not serve. The kinds /status
# counts, by the stand-in's name, as it names them (cuzk-core/src/types.rs, ProofKind's Display):
STATUS_KINDS = {"porep": "porep-c2", "snap": "snap-update"}
# The one kind the real engine self-checks (its assembled PoRep, verified before it is answered).
SELF_CHECKED = "porep"
# STANDIN_FAIL_PROOFS_AS: how a proof fails (the module's docstring).
FAIL_GPU, FAIL_SELF_CHECK = "gpu", "self-check"
FAIL_MODES = (FAIL_GPU, FAIL_SELF_CHECK)


# STANDIN_CUZK_SIGINT: what SIGINT does (the module's docstring).
SIGINT_EXIT = "exit"
SIGINT_SERVE_ON = "serve-on"
SIGINT_MODES = (SIGINT_EXIT, SIGINT_SERVE_ON)


def allocation(size: int) -> dict[str, Any]:
    """An entry of ``/status``'s ``allocations`` (status.rs ``SrsEntry``/``PceEntry``): the 32 GiB PoRep circuit's."""
    return {"circuit_id": "porep-32g", "bytes": size, "last_used_secs_ago": 0.0, "evictable": False}


class Interrupted(Exception):
    """SIGINT arrived (raised in the main thread by the handler)."""


def fail_mode() -> str:
    """``STANDIN_FAIL_PROOFS_AS``: ``gpu`` (the default) or ``self-check``; anything else is a UsageError."""
    raw = os.environ.get("STANDIN_FAIL_PROOFS_AS", "").strip().lower() or FAIL_GPU
    if raw not in FAIL_MODES:
        raise knobs.UsageError(f"STANDIN_FAIL_PROOFS_AS={raw!r}: expected {' or '.join(FAIL_MODES)}")
    return raw


def failure(kind: str, mode: str) -> tuple[str, bool]:
    """A failed proof's error, as the real engine answers it, and whether its /status counts it: only a PoRep
    whose self-check failed (engine.rs 634); a partition's GPU failure never (655-700)."""
    if mode == FAIL_SELF_CHECK and kind == SELF_CHECKED:
        return ("PoRep proof self-check failed: assembled proof did not verify (sector=0, miner=0) "
                "(STANDIN_FAIL_PROOFS)"), True
    return "partition 0 GPU prove failed: CUDA error: unspecified launch failure (STANDIN_FAIL_PROOFS)", False


def sigint_mode() -> str:
    """``STANDIN_CUZK_SIGINT``: ``exit`` (the default) or ``serve-on``; anything else is a UsageError."""
    raw = os.environ.get("STANDIN_CUZK_SIGINT", "").strip().lower() or SIGINT_EXIT
    if raw not in SIGINT_MODES:
        raise knobs.UsageError(f"STANDIN_CUZK_SIGINT={raw!r}: expected {' or '.join(SIGINT_MODES)}")
    return raw


class Daemon:
    """Config, simulated state, servers."""

    cfg: Settings  # (load_config: its settings)
    gpu_sem: threading.Semaphore  # (load_config: one slot per GPU worker)

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.log: Log = cuzk_settings.log_for(args.log_level, {})
        self.lock = threading.Lock()
        self.pce_lock = threading.Lock()
        self.stop = threading.Event()  # exit: the shutdown cancels what runs or waits
        self.engine_stopped = threading.Event()  # serve-on: the engine's workers take no more proofs
        self.sigint = sigint_mode()
        self.servers: list[Server] = []
        self.unix_paths: list[str] = []
        self.received = self.proofs_done = 0
        self.completed = self.failed = 0  # /status's counters: only what the real one counts (STATUS_KINDS)
        self.completed_by_kind: dict[str, int] = {}
        self.failed_by_kind: dict[str, int] = {}
        self.jobs: dict[str, tuple[str, float]] = {}  # in flight: job → (kind, started, monotonic)
        self.fail_proofs = os.environ.get("STANDIN_FAIL_PROOFS", "").strip()
        self.fail_as = fail_mode()
        self.in_flight = self.queued = self.busy = 0
        self.pce_loaded = False
        self.pce_extracting = False  # its background extraction started (once a run)
        self.fail_after = max(0, knobs.env_int("STANDIN_FAIL_AFTER", 1))
        self.proof_s = knobs.env_seconds("STANDIN_PROOF_S", 1.0)
        self.pce_s = knobs.env_seconds("STANDIN_PCE_S", 0.5)
        self.pce_disabled = os.environ.get("CUZK_DISABLE_PCE", "").strip() not in ("", "0", "false")
        self.version = os.environ.get("STANDIN_CUZK_VERSION", "").strip() or "0.1.0"
        self.generation = generations.generation()

    # ------------------------------------------------------------ startup

    def load_config(self) -> None:
        cfg, loaded = cuzk_settings.read_toml(self.args.config)
        self.log = cuzk_settings.log_for(self.args.log_level, cfg)
        self.log("info", f"cuzk-daemon v{self.version} starting (pid {os.getpid()})")
        self.log("info" if cfg else "warn", loaded)
        self.cfg = cuzk_settings.settings(cfg, self.args.listen, self.generation, self.log)
        self.gpu_sem = threading.Semaphore(self.cfg.gpu_workers)

    def _read_params(self) -> None:
        """The real daemon reads the SRS (tens of GiB of .params) into pinned memory without a line: read them
        too, so that what the supervisor sees of this silent stretch is the real one's reads."""
        try:
            names = sorted(n for n in os.listdir(self.cfg.param_cache) if n.endswith((".params", ".srs")))
        except OSError:
            return
        for name in names:
            try:
                with open(os.path.join(self.cfg.param_cache, name), "rb") as fh:
                    while fh.read(1 << 20):
                        pass
            except OSError:
                continue

    def start(self) -> None:
        self.load_config()
        if os.environ.get("STANDIN_REQUIRE_PARAMS", "").strip() in ("1", "true", "yes"):
            try:
                names = os.listdir(self.cfg.param_cache)
            except OSError:
                names = []
            if not any(n.endswith(".params") for n in names):
                raise StartupError(f"failed to load SRS: no parameter files in {self.cfg.param_cache}")
        self.log("info", f"loading SRS from {self.cfg.param_cache} into pinned memory")
        self._read_params()
        knobs.sleep(knobs.env_seconds("STANDIN_SRS_LOAD_S", 0.3))
        self.log("info", f"SRS loaded ({knobs.human_bytes(SRS_BYTES)} pinned)")
        pce_path = os.path.join(self.cfg.param_cache, PCE_FILE)
        if self.pce_disabled:
            self.log("info", "PCE disabled (CUZK_DISABLE_PCE=1)")
        elif os.path.exists(pce_path):
            self.pce_loaded = True
            self.log("info", f"loaded PCE from {pce_path}")
        else:
            self.log("info", f"no PCE cache at {pce_path}; it will be extracted on the first proof")
        self.log("info", f"gpu workers: {self.cfg.gpu_workers} (devices={self.cfg.devices}, "
                         f"per_device={self.cfg.workers_per_device})")
        self.log("info", "cuzk-daemon ready")
        if self.sigint == SIGINT_SERVE_ON:
            # The real one's ctrl_c task, spawned here; it binds and serves whatever that task does.
            failures.handle_signal(signal.SIGINT, lambda *_: self.stop_engine())
        knobs.sleep(knobs.env_seconds("STANDIN_BIND_DELAY_S", 0.3))
        if self.cfg.listen is None:
            raise cuzk_settings.invalid_listen(self.cfg.listen_text)
        for addr, role, text in ((self.cfg.listen, "main", self.cfg.listen_text),
                                 (self.cfg.status_listen, "status", self.cfg.status_text)):
            if addr is None:
                continue
            if addr[0] == "unbindable":  # the real one's status task logs it and ends; the daemon serves on
                self.log("error", f"failed to bind status HTTP server addr={text} error=failed to lookup address "
                                  "information: Name or service not known")
                continue
            try:
                server = make_server(addr, role, self)
            except OSError as exc:
                raise StartupError(f"failed to bind {text}: {exc}") from None
            if addr[0] == "unix":
                self.unix_paths.append(addr[1])
            # (Its SIGINT handler raises in the main thread: the start holds it.)
            failures.start_thread(threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                                   name=f"serve-{role}", daemon=True))
            self.servers.append(server)  # only once serving: shutdown() would wait forever otherwise
            what = "proving service" if role == "main" else "status service"
            self.log("info", f"{what} listening on {text}")

    # ------------------------------------------------------------ work

    def timeline(self, event: str, job: str, detail: str = "") -> None:
        ms = int((time.monotonic() - self.t0) * 1000)
        output.out(f"TIMELINE,{ms},{event},{job},{detail}")

    def prove(self, body: dict[str, Any], answer: Callable[[dict[str, Any]], None]) -> None:
        kind = str(body.get("type") or "porep")
        with self.lock:
            self.received += 1
            self.in_flight += 1
            number = self.received
        job = str(body.get("job") or f"{kind}-{number}")
        with self.lock:
            self.jobs[job] = (kind, time.monotonic())
        try:
            result = self._run_proof(job, kind)
            counted = kind in STATUS_KINDS  # (a proof of this kind done is in /status's counters)
            if result["status"] == "COMPLETED" and self._failing():
                error, counted = failure(kind, self.fail_as)
                result = {**result, "status": "FAILED", "error": error}
        finally:
            with self.lock:
                self.in_flight -= 1
                self.jobs.pop(job, None)
        status = result["status"]
        with self.lock:
            done = status == "COMPLETED"
            if done:
                self.proofs_done += 1
            label = STATUS_KINDS.get(kind, kind)
            if counted and done:
                self.completed += 1
                self.completed_by_kind[label] = self.completed_by_kind.get(label, 0) + 1
            elif counted and status == "FAILED":  # (a cancelled proof is in no counter, as in the real /status)
                self.failed += 1
                self.failed_by_kind[label] = self.failed_by_kind.get(label, 0) + 1
            completed = self.proofs_done
        answer(result)
        if status == "COMPLETED":
            self.timeline("completed", job, f"prove_ms={result['prove_ms']}")
            self.log("info", f"proof completed job={job} type={kind} prove_ms={result['prove_ms']} "
                             f"queue_ms={result['queue_ms']}")
            if self.fail_after > 0 and completed >= self.fail_after:
                failures.partway()
        elif status == "FAILED":
            self.timeline("failed", job, result["error"])
            self.log("error", f"proof failed job={job} type={kind}: {result['error']}")
        else:
            self.timeline("cancelled", job, "shutdown")
            self.log("warn", f"proof cancelled job={job}: daemon shutting down")

    def _failing(self) -> bool:
        """STANDIN_FAIL_PROOFS: "1" every proof fails; a path: while that file exists."""
        if self.fail_proofs.startswith("/"):
            return os.path.exists(self.fail_proofs)
        return self.fail_proofs not in ("", "0", "false")

    def _run_proof(self, job: str, kind: str) -> dict[str, Any]:
        queued_at = time.monotonic()
        self.timeline("received", job, f"type={kind}")

        def cancelled(prove_ms: int = 0) -> dict[str, Any]:
            return {"job": job, "status": "CANCELLED", "prove_ms": prove_ms,
                    "queue_ms": int((time.monotonic() - queued_at) * 1000), "error": "daemon shutting down"}

        with self.lock:
            self.queued += 1
        while not self._take_gpu():
            if self.stop.is_set():
                with self.lock:
                    self.queued -= 1
                return cancelled()
        start = time.monotonic()
        queue_ms = int((start - queued_at) * 1000)
        with self.lock:
            self.queued -= 1
            self.busy += 1
        try:
            self.timeline("queued", job, f"queue_ms={queue_ms}")
            self._maybe_extract_pce(job)
            self.timeline("synth_start", job, "partitions=10")
            if not self._synthesize():
                return cancelled(int((time.monotonic() - start) * 1000))
            self.timeline("synth_done", job, "")
            self.timeline("gpu_start", job, f"device={self.cfg.devices[0]}")
            if self.stop.wait(self.proof_s * 0.6):
                return cancelled(int((time.monotonic() - start) * 1000))
            self.timeline("gpu_done", job, "")
        finally:
            with self.lock:
                self.busy -= 1
            self.gpu_sem.release()
        prove_ms = int((time.monotonic() - start) * 1000)
        return {"job": job, "status": "COMPLETED", "prove_ms": prove_ms, "queue_ms": queue_ms}

    def _take_gpu(self) -> bool:
        """A GPU worker's slot for a queued proof, within a short wait; never once the engine was stopped
        (serve-on): its workers left their loops, so the proof waits on, as the real one's RPC does."""
        if self.engine_stopped.is_set():
            self.stop.wait(0.02)
            return False
        if not self.gpu_sem.acquire(timeout=0.02):
            return False
        if self.engine_stopped.is_set():  # stopped while it waited: the worker did not take it
            self.gpu_sem.release()
            return False
        return True

    def _synthesize(self) -> bool:
        """False when a shutdown cut it short. A partition-workers build synthesizes at most
        ``partition_workers`` proofs at once, each at its memory peak."""
        if self.cfg.pw is None:
            return not self.stop.wait(self.proof_s * 0.4)
        return self.cfg.pw.synthesize(self.stop, self.proof_s * 0.4,
                                  lambda detail: self.timeline("synth_oom", "synthesis", detail))

    def _maybe_extract_pce(self, job: str) -> None:
        """As the real engine (cuzk-core engine.rs): the first proof with no PCE cached starts its extraction on a
        thread of its own and goes on without waiting for it. The daemon's shutdown does not wait for it either:
        the process ends with it, a save cut short leaving its ``.tmp``."""
        if self.pce_disabled or self.pce_loaded:
            if self.fail_after == 0:
                failures.partway()
            return
        with self.pce_lock:
            if self.pce_loaded or self.pce_extracting:
                return
            self.pce_extracting = True
        # (Said here, not on the thread, where the real one says it: a failure right after must not lose it.)
        self.log("info", "background PCE extraction starting for PoRep 32G", "cuzk_core::engine")
        threading.Thread(target=self._extract_pce, name="pce", daemon=True).start()
        if self.fail_after == 0:
            failures.partway()  # (the field failure: the daemon dies as its first proof's extraction runs)

    def _extract_pce(self) -> None:
        """Extract (STANDIN_PCE_S), then write ``<param_cache>/pce-porep-32g.tmp`` and rename it ``.bin``
        (cuzk-pce disk.rs ``save_to_disk``; half as long again), saying what the real one says."""
        started = time.monotonic()
        time.sleep(self.pce_s)  # (not cut by a SIGINT: the real thread goes on while the process lives)
        self.log("info", f"PCE extraction complete circuit_id=porep-32g "
                         f"extract_ms={int((time.monotonic() - started) * 1000)}", "cuzk_core::pipeline")
        path = os.path.join(self.cfg.param_cache, PCE_FILE)
        tmp = os.path.splitext(path)[0] + ".tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(b"PCE-standin\n" + bytes(4084))
                time.sleep(self.pce_s / 2)  # (the real one writes ~26 GiB)
            os.rename(tmp, path)
        except OSError as exc:
            self.log("warn", f"failed to save PCE to disk (non-fatal) circuit_id=porep-32g error={exc}",
                     "cuzk_core::pipeline")
        else:
            self.log("info", f"PCE saved to disk (raw format) path={path} file_size_gib=0.0", "cuzk_pce::disk")
            self.log("info", f"PCE saved to disk circuit_id=porep-32g path={path}", "cuzk_core::pipeline")
        self.pce_loaded = True
        self.log("info", "PCE cached circuit_id=porep-32g", "cuzk_core::pipeline")
        self.log("info", "background PCE extraction complete", "cuzk_core::engine")

    def status(self) -> dict[str, Any]:
        """The real daemon's ``/status`` shape (cuzk-core/src/status.rs), with the stand-in's figures."""
        now = time.monotonic()
        with self.lock:
            busy, queued = self.busy, self.queued
            jobs = dict(self.jobs)
            counters = {"total_completed": self.completed, "total_failed": self.failed,
                        "completed_by_kind": dict(self.completed_by_kind),
                        "failed_by_kind": dict(self.failed_by_kind), "queue_depth": queued}
        used = SRS_BYTES + (PCE_BYTES if self.pce_loaded else 0) + busy * PARTITION_BYTES
        budget = self.cfg.budget
        active = list(jobs.items())[:busy]
        workers = [{"worker_id": i, "gpu_ordinal": self.cfg.devices[i // self.cfg.workers_per_device],
                    "state": "proving" if i < busy else "idle",
                    "current_job": active[i][0] if i < len(active) else None,
                    "current_partition": 0 if i < busy else None,
                    "busy_secs": round(now - active[i][1][1], 3) if i < len(active) else None}
                   for i in range(self.cfg.gpu_workers)]
        return {
            "uptime_secs": int(now - self.t0),
            "memory": {"total_bytes": budget, "used_bytes": used, "available_bytes": max(0, budget - used)},
            "synthesis": {"max_concurrent": self.cfg.synthesis_concurrency, "active": busy},
            # (Only the partitioned proofs, as the real one registers them: status.rs register_job.)
            "pipelines": [{"job_id": job, "proof_kind": STATUS_KINDS[kind], "started_secs_ago": round(now - started, 3),
                           "total_partitions": 10, "partitions_done": 0, "partitions": []}
                          for job, (kind, started) in jobs.items() if kind in STATUS_KINDS],
            "gpu_workers": workers,
            "allocations": {"srs": [allocation(SRS_BYTES)], "pce": [allocation(PCE_BYTES)] if self.pce_loaded else []},
            "counters": counters,
            "buffers": {"synth_in_flight": busy, "provers_in_flight": busy, "aux_in_flight": 0, "shells_in_flight": 0,
                        "pending_handles": 0},
        }

    # ------------------------------------------------------------ shutdown

    def stop_engine(self) -> None:
        """serve-on's SIGINT handler: the real daemon's SIGINT task (main.rs 236-238, engine.rs 3724-3727), two
        lines, no more proofs taken; the servers and the process stay. Its handler stays installed: a later
        SIGINT does nothing."""
        signal.signal(signal.SIGINT, lambda *_: None)
        output.unsilence()
        self.log("info", "received SIGINT, shutting down")
        self.log("info", "shutting down cuzk engine", target="cuzk_core::engine")
        self.engine_stopped.set()

    def shutdown(self) -> int:
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        output.unsilence()
        self.log("info", "received SIGINT, shutting down gracefully")
        self.stop.set()
        deadline = time.monotonic() + max(0.5, knobs.scaled(1.0))
        while time.monotonic() < deadline:
            with self.lock:
                if self.in_flight == 0:
                    break
            time.sleep(0.01)
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for path in self.unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.log("info", "cuzk-daemon stopped")
        return 0


def _on_sigint(_signum: int, _frame: Any) -> None:
    raise Interrupted()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cuzk-daemon", description="cuzk proving daemon (stand-in)")
    parser.add_argument("-c", "--config", default="cuzk.toml", help="path to the TOML config")
    parser.add_argument("-l", "--listen", default=None, help="listen address (overrides [daemon] listen)")
    # (any filter, as the real one takes: a level, or directives such as "warn,cuzk_core::engine=info")
    parser.add_argument("--log-level", default=None, help="log filter (RUST_LOG wins over it)")
    parser.add_argument("-V", "--version", action="store_true", help="print the version and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    output.init_streams()
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.version:
        output.out(f"cuzk-daemon {os.environ.get('STANDIN_CUZK_VERSION', '').strip() or '0.1.0'}")
        return 0
    try:
        failures.setup("cuzk-daemon")
        generations.generation()
        sigint = sigint_mode()
        fail_mode()
    except knobs.UsageError as exc:
        output.err(f"error: {exc}")
        return 2
    # SIGTERM keeps its default action on purpose; so does SIGINT until ready, as the real one's (serve-on).
    failures.handle_signal(signal.SIGINT, _on_sigint if sigint == SIGINT_EXIT else signal.SIG_DFL)
    daemon = Daemon(args)
    try:
        try:
            daemon.start()
        except StartupError as exc:
            daemon.log("error", str(exc))
            return 1
        while True:
            # Short naps: a SIGINT the kernel hands to a server thread only sets Python's flag, and
            # the main thread runs the handler when it next wakes (a long sleep would hide it).
            time.sleep(MAIN_NAP_S)
    except Interrupted:  # (exit only: serve-on's handler raises nothing, and this loop naps on)
        return daemon.shutdown()


if __name__ == "__main__":
    sys.exit(main())
