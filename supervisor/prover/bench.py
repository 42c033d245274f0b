"""Reading cuzk-bench's output: it exits 0 even when proofs failed, so success is read here.

Its header, printed as its own clock starts::

    === Batch Benchmark ===
    proof type:  porep
    count:       12
    concurrency: 3

Per proof:   ``  [3/12] COMPLETED — 151.9s (prove=41234 ms, queue=10 ms)`` (with ``-j`` above 1 none comes
until every proof was submitted, then in submission order: standins/cuzk_bench.py)
then::

    === Batch Summary ===
    total time:    1834.2s
    completed:     12
    failed:        0
    ...
    throughput:    0.393 proofs/min (152.8s/proof)

The manager's rate is proofs per hour = proofs/min × 60, taken from the counts the line is worked out of where they
give it (completed / total time × 3600: more exact than its 3 decimals). Any FAILED, CANCELLED
or TIMEOUT proof, ``failed: N`` with N > 0, or a missing summary fails the
bench; a missing summary is never a rate of 0 reported as success. A summary line
whose number cannot be read (``throughput: 1.2.3 proofs/min``) fails it too, named;
the parser never raises on what a child prints.

A proof that got no answer at all (the daemon gone, or its connection broken mid-proof) has no status:
cuzk-bench returns that error from ``main``, which Rust prints on stderr, and exits 1 with no summary
(standins/cuzk_bench.py)::

    Error: Prove RPC failed

    Caused by:
        ...

Its ``Error:`` line is kept (``BenchResult.error``), and said with the failure: the exit status alone reads
"exited with code 1", and a missing summary alone does not say that the daemon gave no answer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..text.ansi import strip_ansi

_PROOF_RE = re.compile(r"^\s*\[(\d+)/(\d+)\]\s+(COMPLETED|FAILED|CANCELLED|TIMEOUT)\b")
_COUNT_RE = re.compile(r"^\s*count:\s*(\d+)\s*$")
_FIELD_RE = re.compile(r"^\s*(total time|completed|failed|throughput):\s*(.*)$")
# A plain decimal, maybe with the unit "s", then a space or the end: "1834.2s" and "0.393 proofs/min"
# read, "1.2.3", "1e999" or "12abc" do not.
_NUMBER_RE = re.compile(r"(\d+(?:\.\d+)?)s?(?=\s|$)")
BAD_STATUSES = ("FAILED", "CANCELLED", "TIMEOUT")
# How far the summary's figures may be from the true ones, as cuzk-bench rounds them ("{:.1}s", "{:.3} proofs/min").
TOTAL_TIME_ROUNDING = 0.05
THROUGHPUT_ROUNDING = 0.0005
# An unreadable summary line is quoted in the verdict up to this many characters.
QUOTE_CHARS = 120
# The error line Rust prints for an error returned from main (cuzk-bench's transport errors among them).
_ERROR_RE = re.compile(r"^Error: (.+)$")
# The contexts of cuzk-bench's errors when the daemon gave no answer (cuzk-bench main.rs: do_prove's, and
# make_tcp_client's or make_uds_client's).
NO_ANSWER_CONTEXTS = ("Prove RPC failed", "failed to connect to daemon")


def said_error(error: str | None) -> str | None:
    """What cuzk-bench's own ``Error:`` line says of its end, in a verdict's words; None without one."""
    if error is None:
        return None
    if error.startswith(NO_ANSWER_CONTEXTS):
        return (f"cuzk-bench got no answer from cuzk-daemon (Error: {error}): the daemon was gone or broke "
                "the connection")
    return f"cuzk-bench ended with Error: {error}"


def _error_of(line: str) -> str | None:
    found = _ERROR_RE.match(line.strip())
    return found.group(1).strip()[:QUOTE_CHARS] if found else None


@dataclass
class BenchResult:
    proofs: dict[str, int] = field(default_factory=dict)  # status word → count of per-proof lines
    expected: int | None = None  # the N of the header's count, or of [k/N]
    started: bool = False  # its header seen: its own clock runs from there
    summary_seen: bool = False
    completed: int | None = None
    failed: int | None = None
    total_time_s: float | None = None
    proofs_per_min: float | None = None
    unreadable: list[str] = field(default_factory=list)  # summary lines whose number could not be read
    error: str | None = None  # its own "Error: ..." line (stderr), the first: why it ended without a summary

    @property
    def rate_per_hour(self) -> float | None:
        """Proofs an hour: the throughput line's proofs a minute × 60, or the same worked out again from the counts
        it is made of (completed / total time, cuzk-bench main.rs) where they say it more exactly: the line keeps 3
        decimals, ±0.03 an hour, and 12 proofs in 863.9 s (50.006/h) read 49.98 from "0.833 proofs/min", below a
        min_rate of 50 the bench had met. Counts that do not give the line's figure leave the line's."""
        per_min, completed, total = self.proofs_per_min, self.completed, self.total_time_s
        if per_min is None:
            return None
        # Each figure is said rounded (the total time to 0.1 s): the true one is within half a step either way.
        finer = total is not None and TOTAL_TIME_ROUNDING * per_min < THROUGHPUT_ROUNDING * total
        if completed and total and total > TOTAL_TIME_ROUNDING and finer:
            fastest = completed / (total - TOTAL_TIME_ROUNDING) * 60
            slowest = completed / (total + TOTAL_TIME_ROUNDING) * 60
            if slowest - THROUGHPUT_ROUNDING <= per_min <= fastest + THROUGHPUT_ROUNDING:
                return round(completed / total * 3600, 3)
        return round(per_min * 60, 3)

    def problem(self) -> str | None:
        """None when the bench passed by its own output; else why not, with the counts."""
        bad = {s: n for s, n in self.proofs.items() if s in BAD_STATUSES and n}
        counts = self.describe()
        if not self.summary_seen:
            said = said_error(self.error)
            return f"{said + ', ' if said else ''}no '=== Batch Summary ===' in cuzk-bench's output ({counts})"
        if bad:
            listed = ", ".join(f"{n} {s}" for s, n in sorted(bad.items()))
            return f"{listed} ({counts})"
        if self.failed:
            return f"summary says failed: {self.failed} ({counts})"
        if self.unreadable:
            return f"unreadable summary line: {self.unreadable[0]!r} ({counts})"
        if self.proofs_per_min is None:
            return f"summary has no throughput line ({counts})"
        if not self.completed:
            return f"no proof completed ({counts})"
        return None

    def failure_said(self) -> str | None:
        """What its output says of a failed exit: its own ``Error:`` line (lifecycle/hooks.py ExplainsFailure)."""
        return said_error(self.error)

    def describe(self) -> str:
        words = ", ".join(f"{s.lower()}={n}" for s, n in sorted(self.proofs.items())) or "no proof lines"
        rate = f", rate={self.rate_per_hour}/h" if self.rate_per_hour is not None else ""
        return f"{words}{rate}"


class _LineParser:
    """Fed as the output arrives (an output tap): each line, colours stripped, to ``feed_line``."""

    def feed(self, lines: list[bytes]) -> None:
        for raw in lines:
            self.feed_line(strip_ansi(raw).decode("utf-8", errors="replace"))

    def feed_line(self, line: str) -> None:
        raise NotImplementedError


class BenchParser(_LineParser):
    """Fed line by line as the output arrives; nothing is lost to a ring buffer's size."""

    def __init__(self) -> None:
        self.result = BenchResult()
        self._in_summary = False
        self._in_header = False

    def feed_line(self, line: str) -> None:
        r = self.result
        if "=== Batch Benchmark ===" in line:
            r.started = self._in_header = True
            return
        if "=== Batch Summary ===" in line:
            r.summary_seen = self._in_summary = True
            self._in_header = False
            return
        if r.error is None and (error := _error_of(line)) is not None:
            r.error = error
            self._in_header = self._in_summary = False
            return
        proof = _PROOF_RE.match(line)  # (first: a proof line ends the header, blank line or not)
        if self._in_header and proof is None:
            if not line.strip():
                self._in_header = False
            elif (count := _COUNT_RE.match(line)) is not None:
                r.expected = _count(count.group(1))
            return
        self._in_header = False
        if proof:
            r.proofs[proof.group(3)] = r.proofs.get(proof.group(3), 0) + 1
            r.expected = _count(proof.group(2))
            return
        if not self._in_summary:
            return
        found = _FIELD_RE.match(line)
        if not found:
            return
        key, number = found.group(1), _number(found.group(2))
        if number is None or (key in ("completed", "failed") and not number.is_integer()):
            r.unreadable.append(line.strip()[:QUOTE_CHARS])
        elif key == "total time":
            r.total_time_s = number
        elif key == "completed":
            r.completed = int(number)
        elif key == "failed":
            r.failed = int(number)
        elif key == "throughput":
            r.proofs_per_min = number


def _number(text: str) -> float | None:
    """The number a summary value starts with; None when there is none, or it is not finite."""
    found = _NUMBER_RE.match(text)
    if found is None:
        return None
    number = float(found.group(1))  # a digits-and-dot string always converts; too many digits give inf
    return number if math.isfinite(number) else None


def _count(text: str) -> int | None:
    number = _number(text)
    return int(number) if number is not None and number.is_integer() else None


# ---------------------------------------------------------------- cuzk-bench single (the warm-up)
#
# ``cuzk-bench single`` prints no per-proof line and no summary, but one result block::
#
#     === Proof Result ===
#     status:    COMPLETED            (or FAILED, CANCELLED, TIMEOUT, UNKNOWN)
#     job_id:    ...
#     timings:   total=... ms (...)   (COMPLETED only; else ``error:     <message>``)
#
# and it EXITS 0 WHATEVER THE STATUS: only a proof that got no answer at all exits 1, its ``Error: ...`` on
# stderr (as ``batch``'s, above; the seeds' warm-up died so, its daemon gone mid-proof), which is kept and said.
# So the warm-up passes only on a result block whose status is COMPLETED. A ``[k/N] STATUS``
# proof line (what ``batch`` prints) is read too, so either output shape is judged the same.

_RESULT_HEADER = "=== Proof Result ==="
_RESULT_FIELD_RE = re.compile(r"^\s*(status|error):\s*(.*?)\s*$")
GOOD_STATUS = "COMPLETED"


@dataclass
class SingleResult:
    statuses: list[str] = field(default_factory=list)  # every status read, in order
    error: str | None = None
    exit_error: str | None = None  # its own "Error: ..." line (stderr): no result came

    def problem(self) -> str | None:
        """None when the one proof completed by the tool's own output; else why not."""
        if not self.statuses:
            said = said_error(self.exit_error)
            return f"{said + ', ' if said else ''}no '{_RESULT_HEADER}' with a status in cuzk-bench's output"
        bad = [s for s in self.statuses if s != GOOD_STATUS]
        if bad:
            error = f" (error: {self.error})" if self.error else ""
            return f"the proof ended {bad[0]}{error}"
        return None

    def failure_said(self) -> str | None:
        """What its output says of a failed exit: its own ``Error:`` line (lifecycle/hooks.py ExplainsFailure)."""
        return said_error(self.exit_error)

    def describe(self) -> str:
        return f"status={'/'.join(self.statuses) or 'none'}" + (f", error={self.error}" if self.error else "")


class SingleProofParser(_LineParser):
    """``parse = "cuzk-single"``: fed line by line like BenchParser, judged by SingleResult.problem()."""

    def __init__(self) -> None:
        self.result = SingleResult()
        self._in_result = False

    def feed_line(self, line: str) -> None:
        r = self.result
        if _RESULT_HEADER in line:
            self._in_result = True
            return
        if r.exit_error is None and (error := _error_of(line)) is not None:
            r.exit_error = error
            self._in_result = False
            return
        proof = _PROOF_RE.match(line)
        if proof:
            self._in_result = True  # an "    error: ..." line may follow it
            r.statuses.append(proof.group(3))
            return
        found = _RESULT_FIELD_RE.match(line) if self._in_result else None
        if found is None:
            return
        key, value = found.group(1), found.group(2)
        if key == "status":
            r.statuses.append(value.split()[0].upper() if value else "UNKNOWN")
        elif key == "error" and r.error is None:
            r.error = value
