"""Stand-in for ``cuzk-bench``, the proving benchmark client of cuzk-daemon.

Usage::

    python -m supervisor.prover.standins.cuzk_bench [-a http://127.0.0.1:9820] batch -t porep --c1 <c1.json> \\
        -c <count> -j <concurrency>
    python -m supervisor.prover.standins.cuzk_bench [-a ADDR] single -t porep --c1 <c1.json>

``-a`` (default ``http://127.0.0.1:9820``, or ``unix:///path``) comes before the subcommand, as the real
one's top-level flag (after it: a usage error, exit 2). It is
read as the real tool reads it (a tonic endpoint, main.rs 415-455): a bare ``host:port`` is a URI with no
scheme, which hyper's connector refuses at the first connect, so the tool exits 1 with ``Error: failed to
connect to daemon at 127.0.0.1:9820`` (the header printed first, by ``batch``); what is no URI at all is
``Error: invalid daemon address: <addr>``. ``-t`` is required (clap: a usage error, exit 2). Before anything
is printed or connected, as the real one (proof_kind_from_str, build_proof_params), it exits 1 with ``Error:``
and: an unknown proof type; a PoRep with no ``--c1`` ("--c1 required for PoRep proof type"), a PoSt or
SnapDeals with no ``--vanilla``; a file it cannot read (``failed to read <path>`` and its OS error). Each proof
is a ``POST /prove`` to the daemon; ``-j`` are in flight at once.
``batch`` first prints its header (the real tool's, just before it starts its clock)::

    === Batch Benchmark ===
    proof type:  porep
    count:       12
    concurrency: 3

then one line per proof::

      [3/12] COMPLETED — 151.9s (prove=41234 ms, queue=10 ms)

in the real tool's order (extern/cuzk cuzk-bench ``main.rs``): with ``-j 1`` each as it ends; with ``-j``
above 1, none until every proof was submitted (a proof is submitted as one in flight ends: count − j of them
are done by then), then in submission order, each once it ended: a bench of 12 at ``-j 3`` is silent
until 9 proofs are done, then prints those 9 at once.

(status words COMPLETED, FAILED, CANCELLED, TIMEOUT: the line alone, no error line even for a proof the
daemon answered FAILED, main.rs 561-569 and 597-605, read at curio e0294b0). ``batch`` then prints::

    === Batch Summary ===
    total time:    1834.2s
    completed:     12
    failed:        0
    wall time:     avg=152.3s min=150.1s max=155.0s
    prove time:    avg=41.2s min=40.9s max=41.6s
    throughput:    0.393 proofs/min (152.8s/proof)

and EXITS 0 EVEN WHEN PROOFS FAILED (``failed`` counts every proof not COMPLETED; the wall, prove and
throughput lines cover the completed proofs, and are not printed at all when none completed: main.rs
610-641). ``single`` runs one proof (the warm-up) and prints, as the
real tool (extern/cuzk cuzk-bench ``print_result``), a result block instead of a proof line::

    === Proof Result ===
    status:    COMPLETED
    job_id:    warmup-...
    timings:   total=1000 ms (queue=0 ms, srs=0 ms, synth=400 ms, gpu=600 ms)
    wall time: 1003 ms
    proof:     192 bytes (hex: ...)

with ``error:     <reason>`` in place of the last three lines when the status is FAILED,
CANCELLED or TIMEOUT. Like the real tool it EXITS 0 WHATEVER THE STATUS.

A proof that gets NO ANSWER (the daemon gone: nothing listens, or the connection broke mid-proof) has no
status at all: the real tool's ``connect(..).await?`` and ``do_prove(..).await?`` (main.rs 507-508 for
``single``, 556-557 for ``batch -j 1``, 586-587 under ``handle.await??`` at 595 above it) return the error
from ``main``, which Rust prints on stderr as ``Error: {:?}`` (anyhow's chain), exiting 1::

    Error: Prove RPC failed

    Caused by:
        0: status: Unknown, message: "transport error", details: [], metadata: MetadataMap { headers: {} }
        1: transport error
        2: Connection reset by peer (os error 104)

(``failed to connect to daemon at <addr>``, main.rs 420, when the connect itself failed; ``failed to connect
to daemon via unix socket``, 442, on a socket). That first line is the source's own context (``do_prove``'s
``.context("Prove RPC failed")``, 1008); the causes under it are tonic's and hyper's words, which change with
their versions and with how the connection broke: the stand-in gives one such shape, and nothing may rely on
it. ``batch`` prints no line for that proof and NO SUMMARY: with ``-j 1`` the proofs before it have their
lines; with ``-j`` above 1 the proofs before it in submission order do (every later one fails at its connect
at once, the daemon being gone), and what is still in flight dies with the process. Usage errors exit 2.
SIGINT and SIGTERM keep their default actions (die by the signal).

Environment: ``STANDIN_BENCH_FAIL_PROOFS=N`` (proofs number 1..N, in submission order,
report FAILED even if the daemon completed them; for ``single``, any N >= 1 fails its one proof,
its block saying ``error:     proof failed: ...``),
``STANDIN_BENCH_TIMEOUT_S`` (per-proof deadline in seconds, default none; past it the proof
is TIMEOUT), plus the common knobs; the partway point is right after the first proof line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, NoReturn

from . import failures, knobs, output

DEFAULT_ADDR = "http://127.0.0.1:9820"
STATUS_WORDS = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
# do_prove's context (main.rs 1008), and tonic's Status of an RPC whose connection broke, as its Display reads.
PROVE_FAILED = "Prove RPC failed"
BROKEN_RPC_STATUS = 'status: Unknown, message: "transport error", details: [], metadata: MetadataMap { headers: {} }'


class Result(NamedTuple):
    status: str
    wall_s: float
    prove_ms: int
    queue_ms: int
    error: str


class NoAnswer(NamedTuple):
    """No answer from the daemon: the error the real tool returns from ``main`` (its anyhow context, its causes)."""

    context: str
    causes: tuple[str, ...]

    def lines(self) -> list[str]:
        """As Rust prints an error ``main`` returned: ``Error: {:?}``, anyhow's Debug form."""
        if not self.causes:
            return [f"Error: {self.context}"]
        if len(self.causes) == 1:
            causes = [f"    {self.causes[0]}"]
        else:
            causes = [f"    {i}: {cause}" for i, cause in enumerate(self.causes)]
        return [f"Error: {self.context}", "", "Caused by:", *causes]


def _os_words(exc: BaseException) -> str:
    """An OS error in Rust's words (``Connection refused (os error 111)``); else what Python says of it."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        return f"{exc.strerror} (os error {exc.errno})"
    return str(exc) or type(exc).__name__


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost")
        self._path = path
        self._deadline = timeout

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._deadline)
        sock.connect(self._path)
        self.sock = sock


def endpoint(text: str) -> tuple[str, Any] | NoAnswer:
    """``-a`` as the real tool reads it (see the module docstring): where to connect, or the error it returns at
    its first connect."""
    raw = text.strip()
    if raw.startswith("unix://"):
        return "unix", raw[len("unix://"):]
    scheme, sep, rest = raw.partition("://")
    if sep and scheme in ("http", "https"):
        port = "443" if scheme == "https" else "80"
        hostport = rest.split("/", 1)[0]
        try:
            return knobs.parse_addr(hostport if hostport.rpartition("]")[2].count(":") else f"{hostport}:{port}")
        except ValueError:
            pass
    elif not sep and re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-_]+):[0-9]+", raw):
        return NoAnswer(f"failed to connect to daemon at {text}", ("transport error", "invalid URL, scheme is missing"))
    return NoAnswer(f"invalid daemon address: {text}", ("invalid format",))


def _connection(addr: tuple[str, Any], timeout: float | None) -> http.client.HTTPConnection:
    kind, where = addr
    if kind == "unix":
        return _UnixConnection(where, timeout)
    host = "127.0.0.1" if where[0] in ("0.0.0.0", "::") else where[0]
    if timeout is None:
        return http.client.HTTPConnection(host, where[1])
    return http.client.HTTPConnection(host, where[1], timeout=timeout)


def _connect_failed(addr: tuple[str, Any], text: str, exc: BaseException) -> NoAnswer:
    """make_tcp_client's or make_uds_client's error (main.rs 415-448): the connect to the daemon failed."""
    if addr[0] == "unix":
        return NoAnswer("failed to connect to daemon via unix socket", ("transport error", _os_words(exc)))
    return NoAnswer(f"failed to connect to daemon at {text}", ("transport error", "tcp connect error", _os_words(exc)))


def prove_once(addr: tuple[str, Any], body: dict[str, Any], timeout: float | None, fail: bool,
               addr_text: str = DEFAULT_ADDR) -> Result | NoAnswer:
    """One proof: a fresh connection (as the real tool connects per proof), the request, its answer; never
    raises. NoAnswer when the daemon gave none (``addr_text``: the address as given, which the error names)."""
    started = time.monotonic()

    def result(status: str, error: str = "", prove_ms: int = 0, queue_ms: int = 0) -> Result:
        return Result(status, time.monotonic() - started, prove_ms, queue_ms, error)

    conn = _connection(addr, timeout)
    try:
        try:
            conn.connect()
        except TimeoutError:
            return result("TIMEOUT", f"deadline exceeded after {timeout:g}s")
        except OSError as exc:
            return _connect_failed(addr, addr_text, exc)
        conn.request("POST", "/prove", body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    except TimeoutError:
        return result("TIMEOUT", f"deadline exceeded after {timeout:g}s")
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, http.client.RemoteDisconnected):
            cause = "connection closed before message completed"  # hyper's words for a connection gone mid-answer
        else:
            cause = _os_words(exc)
        return NoAnswer(PROVE_FAILED, (BROKEN_RPC_STATUS, "transport error", cause))
    finally:
        conn.close()
    if response.status != 200:
        text = data[:200].decode(errors="replace")
        return result("FAILED", f"status: {response.status} {response.reason}: {text}")
    try:
        answer = json.loads(data)
        status = str(answer.get("status", "FAILED")).upper()
        prove_ms, queue_ms = int(answer.get("prove_ms", 0)), int(answer.get("queue_ms", 0))
    except (ValueError, AttributeError, TypeError):
        return result("FAILED", "invalid response from daemon")
    if status not in STATUS_WORDS:
        status = "FAILED"
    error = "" if status == "COMPLETED" else str(answer.get("error") or status.lower())
    if fail and status == "COMPLETED":
        status, error = "FAILED", "proof failed: simulated failure (STANDIN_BENCH_FAIL_PROOFS)"
    return result(status, error, prove_ms, queue_ms)


def proof_line(k: int, n: int, res: Result) -> str:
    return f"  [{k}/{n}] {res.status} — {res.wall_s:.1f}s (prove={res.prove_ms} ms, queue={res.queue_ms} ms)"


def _stats(values: list[float]) -> str:
    return f"avg={sum(values) / len(values):.1f}s min={min(values):.1f}s max={max(values):.1f}s"


def summary(results: list[Result], total_s: float) -> list[str]:
    """The summary block; its statistics only when a proof completed (the real tool's ``if !completed.is_empty()``)."""
    done = [r for r in results if r.status == "COMPLETED"]
    lines = [
        "",
        "=== Batch Summary ===",
        f"{'total time:':<15}{total_s:.1f}s",
        f"{'completed:':<15}{len(done)}",
        f"{'failed:':<15}{len(results) - len(done)}",
    ]
    if not done:
        return lines
    per_min = len(done) / (total_s / 60) if total_s > 0 else 0.0
    return [*lines,
            f"{'wall time:':<15}{_stats([r.wall_s for r in done])}",
            f"{'prove time:':<15}{_stats([r.prove_ms / 1000 for r in done])}",
            f"{'throughput:':<15}{per_min:.3f} proofs/min ({total_s / len(done):.1f}s/proof)"]


def run_batch(addr: tuple[str, Any], addr_text: str, kind: str, c1: str | None, count: int,
              jobs: int) -> tuple[list[Result], NoAnswer | None]:
    """The proofs, ``jobs`` in flight, reported in the real tool's order (the module's docstring); the first
    proof with no answer (in that order) ends the batch there, its NoAnswer returned with the results before it."""
    fail_n = max(0, knobs.env_int("STANDIN_BENCH_FAIL_PROOFS", 0))
    timeout = _timeout()
    results: list[Result] = []
    tag = f"{os.getpid()}-{int(time.time())}"

    def prove(i: int) -> Result | NoAnswer:
        body = {"type": kind, "c1": c1, "job": f"bench-{tag}-{i + 1}"}
        return prove_once(addr, body, timeout, i < fail_n, addr_text)

    def report(i: int, res: Result) -> None:
        results.append(res)
        output.out(proof_line(i + 1, count, res))
        failures.partway()

    if jobs <= 1:
        for i in range(count):
            res = prove(i)
            if isinstance(res, NoAnswer):
                return results, res
            report(i, res)
        return results, None
    slots = threading.Semaphore(jobs)  # the real tool's tokio Semaphore: a submission waits for a free one

    def held(i: int) -> Result | NoAnswer:
        try:
            return prove(i)
        finally:
            slots.release()  # an error too frees its permit (the task's captured one is dropped)

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="proof")
    try:
        futures: list[Future[Result | NoAnswer]] = []
        for i in range(count):
            slots.acquire()
            futures.append(pool.submit(held, i))
        for i, future in enumerate(futures):  # only now, in submission order
            res = future.result()
            if isinstance(res, NoAnswer):
                return results, res  # (the caller exits at once: what is still in flight is not waited for)
            report(i, res)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return results, None


def fail_without_answer(no_answer: NoAnswer) -> NoReturn:
    """Print the error as Rust prints one ``main`` returned, and exit 1 at once: the real tool's runtime drops
    the proofs still in flight, it does not wait for them."""
    for line in no_answer.lines():
        output.err(line)
    output.flush_all()
    os._exit(1)


def run_single(addr: tuple[str, Any], addr_text: str, kind: str, c1: str | None) -> int:
    """One proof, its result block; exit 0 whatever its status, 1 only when no answer came."""
    job = f"warmup-{os.getpid()}-{int(time.time())}"
    fail = knobs.env_int("STANDIN_BENCH_FAIL_PROOFS", 0) > 0
    res = prove_once(addr, {"type": kind, "c1": c1, "job": job}, _timeout(), fail, addr_text)
    if isinstance(res, NoAnswer):
        fail_without_answer(res)
    for line in result_block(job, res):
        output.out(line)
    failures.partway()
    return 0


def result_block(job: str, res: Result) -> list[str]:
    lines = ["", "=== Proof Result ===", f"{'status:':<11}{res.status}", f"{'job_id:':<11}{job}"]
    if res.status != "COMPLETED":
        return [*lines, f"{'error:':<11}{res.error}"]
    synth = res.prove_ms * 2 // 5
    return [*lines,
            f"{'timings:':<11}total={res.prove_ms + res.queue_ms} ms (queue={res.queue_ms} ms, srs=0 ms, "
            f"synth={synth} ms, gpu={res.prove_ms - synth} ms)",
            f"{'wall time:':<11}{int(res.wall_s * 1000)} ms",
            f"{'proof:':<11}192 bytes (hex: {'ab' * 192})"]


def _timeout() -> float | None:
    raw = os.environ.get("STANDIN_BENCH_TIMEOUT_S", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


# proof_kind_from_str (main.rs 404): the names each proof type goes by.
PROOF_KINDS = {"porep": ("porep", "porep-c2", "seal-commit"), "snap": ("snap", "snap-deals", "update"),
               "wpost": ("wpost", "window-post", "windowpost"), "winning": ("winning", "winning-post", "winningpost")}


def proof_input(proof_type: str, c1: str | None, vanilla: str | None) -> NoAnswer | None:
    """What the real tool returns from main before it prints or connects anything (proof_kind_from_str, then
    build_proof_params): an unknown proof type; a PoRep without ``--c1``, a PoSt or SnapDeals without
    ``--vanilla``; a file it cannot read. None: it goes on."""
    kind = next((k for k, names in PROOF_KINDS.items() if proof_type.lower() in names), None)
    if kind is None:
        return NoAnswer(f"unknown proof type: {proof_type}. Use: porep, snap, wpost, winning", ())
    path = c1 if kind == "porep" else vanilla
    if path is None:
        return NoAnswer("--c1 required for PoRep proof type" if kind == "porep" else
                        "--vanilla required for PoSt/SnapDeals proof types", ())
    try:
        with open(path, "rb"):  # (a directory: "Is a directory", as Rust's std::fs::read says it)
            pass
    except OSError as exc:
        return NoAnswer(f"failed to read {path}", (_os_words(exc),))
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cuzk-bench", description="cuzk benchmark client (stand-in)")
    parser.add_argument("-a", "--addr", default=DEFAULT_ADDR, help="daemon address")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("batch", "single"):
        p = sub.add_parser(name)
        p.add_argument("-t", "--type", dest="proof_type", required=True, help="porep, snap, wpost, winning")
        p.add_argument("--c1", default=None, help="C1 output (JSON) to prove from (PoRep)")
        p.add_argument("--vanilla", default=None, help="vanilla proofs (JSON) to prove from (PoSt, SnapDeals)")
        if name == "batch":
            p.add_argument("-c", "--count", type=int, default=1)
            p.add_argument("-j", "--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "batch" and (args.count < 1 or args.concurrency < 1):
        parser.error("-c and -j must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    output.init_streams()
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    addr = endpoint(args.addr)
    refused = proof_input(args.proof_type, args.c1, args.vanilla)
    if refused is not None:
        fail_without_answer(refused)
    try:
        failures.setup("cuzk-bench")
    except knobs.UsageError as exc:
        output.err(f"error: {exc}")
        return 2
    failures.handle_signal(signal.SIGINT, signal.SIG_DFL)  # a Rust binary: Ctrl-C kills it outright

    if args.command == "single":
        if isinstance(addr, NoAnswer):
            fail_without_answer(addr)
        return run_single(addr, args.addr, args.proof_type, args.c1)

    for line in ("=== Batch Benchmark ===", f"proof type:  {args.proof_type}", f"count:       {args.count}",
                 f"concurrency: {args.concurrency}", ""):
        output.out(line)
    if isinstance(addr, NoAnswer):
        fail_without_answer(addr)
    started = time.monotonic()
    results, no_answer = run_batch(addr, args.addr, args.proof_type, args.c1, args.count, args.concurrency)
    if no_answer is not None:
        fail_without_answer(no_answer)  # no summary: main.rs returns before it
    total = time.monotonic() - started
    for line in summary(results, total):
        output.out(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
