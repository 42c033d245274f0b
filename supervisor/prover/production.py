"""Proofs counted in production: cuzk's ``/status`` counters and curio's harmonytask metrics, read while
production is up; a summary to the manager's ``setup`` log; ``proofs_failing`` when proofs keep failing.

Without this an instance whose every proof fails reads ``running`` forever. While the production
phase (``report = "running"``) is up, every ``watch_s`` a worker thread reads (HTTP, short timeouts,
never on the loop) cuzk's ``GET /status`` on ``[cuzk] status_listen`` (``counters.total_completed``,
``total_failed``) and curio's ``/debug/metrics`` (``curio_harmonytask_tasks_completed|failed`` of the
proving tasks) where its port answers. The two count different things: cuzk's ``/status`` counts a PoRep or
SnapDeals proof assembled, and as failed only a PoRep whose self-check failed (a GPU, synthesis or C1 failure
is in no counter of it); curio's count every proving task that failed, and as completed only the proofs of work
done (PROOF_TASKS: a WinPost completes every epoch, won or not, with no proof).
So failures are curio's count while it reads, completions cuzk's (COUNTED_BY); a config that reads no curio
metrics is refused (_metrics_url). The loop takes the reading at the next ``watch_s`` (so a slow answer never
holds it) and decides:

- ``proofs_failing``: ``proof_failures`` failures or more, and none completed, within the last
  ``proof_failure_window_s``, as the failed figures' source counts them: the production attempt fails with
  that reason (Wiring's fail_phase); its restart policy applies like any service failure, and when it is
  exhausted the lifecycle fails and the fleet protocol gives the instance up;
- ``curio_unresponsive``: curio's own metrics (its API port) gave no reading for ``curio_unresponsive_s`` since
  production came up or they last read: a hung curio, up to its ready probe (the port still accepts) and proving
  nothing; the attempt fails the same way, once an up (with proofs_failing);
- the summary line (soon after production is up, then every SUMMARY_S): proofs completed / failed in
  the window and since up, whose count each is, the rate per hour, memory used of the limit, GPU utilisation;
  pushed durably to the manager's ``setup`` log, and the same figures in status (the production phase's
  ``proofs_completed``, ``proofs_failed``, ``production`` with ``counted_by``; ``/metrics``). A failed figure that
  fell back to cuzk's count (curio's unread) is said so, with what that count misses.

Counters that go down (the daemon restarted with the attempt) start the count again.

The watch survives what it reads (watchstate.py's rule): any answer is contained (a malformed status line,
a 70 KB header, broken chunks, 200k nested ``[``: a reading of none, with why), every call has a total
deadline (READ_DEADLINE_S: a peer that drips a byte a second cannot hold the reader), a read that has not
come back is never doubled, and no reading for ``max(2 × watch_s, BLIND_MIN_S)`` is said once ("proofs
watch: no reading for 121 s (its window is 120 s): …"), and again when it reads. ``watch_s`` is at least
WATCH_MIN_S. With both sources read, each one is a watch of its own too (``cuzk status``, ``curio metrics``): one
that gives no counters while the other reads is said the same way ("curio metrics: no reading for 121 s (its
window is 120 s): … refused"), shown in status (``watches``; the production phase's ``production.sources``),
and said again when it reads. While neither reads they are idle: the proofs watch says it all, once.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..config import ConfigError, Key, SupervisorSpec, check_arg, http_url, take, whole_number
from ..config.tables import WINDOW_FLOOR, bounded_seconds
from ..engine.logs import Unshipped
from ..engine.offloop import worker_thread
from ..evidence.watchstate import WatchState, said_error, short
from ..text import Log
from ..text.show import fmt_bytes
from .reasons import CURIO_UNRESPONSIVE, PROOFS_FAILING

if TYPE_CHECKING:
    from ..wiring import PhaseView, Wiring

SECTION = "production"
# The summary line goes to the manager at most this often (the first one soon after production is up).
SUMMARY_S = 300.0
# One read of cuzk's or curio's HTTP answer waits at most this long, and one whole call (connect, status line,
# headers, body) at most READ_DEADLINE_S.
READ_TIMEOUT_S = 2.0
READ_DEADLINE_S = 5.0
# An answer is read to this size at most (a bigger one is no answer).
MAX_ANSWER_BYTES = 1 << 20
# A counter (or a size in bytes) an answer may hold at most: more is no count (and no float to divide).
MAX_COUNT = 10**18
# The proof kinds cuzk's counters may name (porep, snap, wdpost, winpost, ...): more is no answer of cuzk's.
MAX_KINDS = 64
# The shortest watch_s: more often is a flood of requests to cuzk, not a closer watch.
WATCH_MIN_S = 0.2
# No reading for max(2 × watch_s, this) is said (once).
BLIND_MIN_S = 30.0
# The readings a proof window keeps at most, about (one a window_s / this step, and the latest).
WINDOW_POINTS = 720
PROVING_TASKS = ("PoRep", "PSProve", "WdPost", "WinPost", "UpdateProve")
# Those whose completion is a proof of work done, curio's completed figure (cuzk's /status counts these too: a PoRep or
# SnapDeals proof assembled). A WinPost completes every epoch it does not win, with no proof (curio's winning_task.go
# persistNoWin); a WdPost is the miner's own upkeep, no PoSt in cuzk's count. Every proving task's failure counts.
PROOF_TASKS = ("PoRep", "PSProve", "UpdateProve")
# The sources, as a Reading names them, and the names of their own watches (status's ``watches``).
CUZK, CURIO = "cuzk", "curio"
SOURCE_WATCHES = {CUZK: "cuzk status", CURIO: "curio metrics"}
# Whose count each figure is, while that source reads (else the source read last's): (completed, failed).
# Completed: cuzk's, proofs its /status saw assembled, as the bench counted them (curio's: PROOF_TASKS). Failed:
# curio's, every proving task that failed; cuzk's /status counts only a PoRep whose self-check failed (cuzk-core
# engine.rs calls its job_completed there alone), never a GPU, synthesis or C1 failure.
COUNTED_BY = (CUZK, CURIO)
# Each source's count, as the summary line names it.
SOURCE_COUNTS = {CUZK: "cuzk /status", CURIO: "curio's proving tasks"}
# A line of curio's own metrics (its namespace), a sample or its # TYPE / # HELP: the page is curio's.
_CURIO_PAGE_RE = re.compile(r"^(# (TYPE|HELP) )?curio_", re.MULTILINE)
# The labels first, then the task name among them: one pattern for both backtracked quadratically on a line of many
# task_name="…" and no closing brace (a 216 KiB page held the GIL, so the loop, for seconds a read).
_METRIC_RE = re.compile(r'^curio_harmonytask_tasks_(completed|failed)\{([^}]*)\}\s+([0-9.e+]+)$')
_TASK_NAME_RE = re.compile(r'(?:^|,)\s*task_name="([^"]+)"')
# A sample line is a few hundred characters: a longer one is no metric of curio's (and is not matched at all).
METRIC_LINE_MAX = 4096


@dataclass(frozen=True)
class ProductionSettings:
    watch_s: float = 60.0
    proof_failures: int = 5
    proof_failure_window_s: float = 3600.0
    curio_metrics: str = "http://127.0.0.1:12300/debug/metrics"  # (never "" from a config: _metrics_url)
    # Ten reads of the default watch_s: a curio that answers now and then, however slowly, is never failed for it.
    curio_unresponsive_s: float = 600.0


# Seconds above 0, held like every other ``*_s`` key (the core's checker: at most MAX_SECONDS, the value in an error
# cut as every value is shown); text from ${VAR} (the profile's $PROVER_WATCH_S) counts as the number it says.
_interval = bounded_seconds((WATCH_MIN_S, "how often cuzk is asked"))


def _metrics_url(value: Any, where: str) -> str:
    """curio's metrics URL, read as a ready probe's http(s) URL is ("nope" and "ftp://x/y" passed check and made
    every reading fail). "" (not read) is refused: cuzk's /status alone counts a failed proof only where a PoRep
    fails its self-check, so a watch of it alone read every proof failing on a GPU error as healthy, for ever."""
    if value == "":
        raise ConfigError(f'{where}: "" is refused: curio\'s metrics are the proofs watch\'s one count of failed '
                          "proofs (cuzk's /status counts only a PoRep whose self-check failed, never a GPU or "
                          "synthesis failure); give curio's /debug/metrics URL")
    text = check_arg(value, where)
    http_url(text, where)
    return text


PRODUCTION_KEYS = {
    "watch_s": Key(_interval, ProductionSettings.watch_s),
    "proof_failures": Key(whole_number(1, 100_000), ProductionSettings.proof_failures),
    "proof_failure_window_s": Key(bounded_seconds(WINDOW_FLOOR), ProductionSettings.proof_failure_window_s),
    "curio_metrics": Key(_metrics_url, ProductionSettings.curio_metrics),
    "curio_unresponsive_s": Key(bounded_seconds(WINDOW_FLOOR), ProductionSettings.curio_unresponsive_s),
}


def production_section(table: Any, sup: SupervisorSpec) -> ProductionSettings:
    return ProductionSettings(**take(table, SECTION, PRODUCTION_KEYS))


# ---------------------------------------------------------------- reading (the worker thread)


@dataclass(frozen=True)
class Reading:
    at: float  # monotonic
    completed: int | None  # cuzk's total_completed, else curio's PROOF_TASKS completed
    failed: int | None  # cuzk's total_failed, else curio's proving tasks failed
    memory: tuple[int, int] | None = None  # cuzk's own (used, total)
    source: str = "none"
    error: str = ""
    beside: tuple[Reading, ...] = ()  # curio's, read with cuzk's: its tasks may fail where cuzk never sees them
    # Each proving task's own (name, completed, failed): curio's tasks, cuzk's proof kinds. Failing is judged task by
    # task (curio's WinPost completes every epoch, won or not, and summed with it a PoRep that always fails read as
    # proofs completing; cuzk's counts every kind it proves in its totals).
    tasks: tuple[tuple[str, int, int], ...] = ()
    # (source, why) of each source asked that gave nothing (an error, no answer, not its shape): with a reading of
    # the other one, that source alone is blind, and its watch says so (it used to be dropped without a word).
    unread: tuple[tuple[str, str], ...] = ()


def _count(value: Any) -> bool:
    """A counter or size as an answer may hold one: a whole number from 0 to MAX_COUNT."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def parse_cuzk(body: Any) -> tuple[int, int, tuple[int, int] | None] | None:
    """(completed, failed, (memory used, total) or None) of cuzk's /status; None: not its counters. Any JSON is
    read without raising: the reading thread would end on an exception and production go unwatched."""
    counters = body.get("counters") if isinstance(body, dict) else None
    if not isinstance(counters, dict) or not _count(counters.get("total_completed")):
        return None
    failed = counters.get("total_failed") or 0
    if not _count(failed):
        return None  # a failed count that is no number: no answer, rather than a guess that hides failures
    mem = body.get("memory")
    memory = (mem["used_bytes"], mem["total_bytes"]) if isinstance(mem, dict) \
        and _count(mem.get("used_bytes")) and _count(mem.get("total_bytes")) else None
    return counters["total_completed"], failed, memory


def cuzk_kinds(body: Any) -> tuple[tuple[str, int, int], ...]:
    """Each proof kind's (kind, completed, failed) from cuzk's ``completed_by_kind`` and ``failed_by_kind``, by
    kind; () where it has none (an older build), or where either is not a table of counts (never a guess)."""
    counters = body.get("counters") if isinstance(body, dict) else None
    done = counters.get("completed_by_kind") if isinstance(counters, dict) else None
    failed = counters.get("failed_by_kind") if isinstance(counters, dict) else None
    if not isinstance(done, dict) or not isinstance(failed, dict) or len(done) + len(failed) > MAX_KINDS:
        return ()
    tables = (done, failed)
    if not all(isinstance(kind, str) and _count(n) for table in tables for kind, n in table.items()):
        return ()
    return tuple((kind, done.get(kind, 0), failed.get(kind, 0)) for kind in sorted({*done, *failed}))


def parse_curio(text: str) -> tuple[int, int] | None:
    """Proving tasks completed and failed, summed over their names; None: no such metric."""
    tasks = parse_curio_tasks(text)
    return None if tasks is None else summed(tasks)


def summed(tasks: tuple[tuple[str, int, int], ...], done: tuple[str, ...] = PROVING_TASKS) -> tuple[int, int]:
    """(completed of the tasks named in ``done``, failed of every task)."""
    return sum(t[1] for t in tasks if t[0] in done), sum(t[2] for t in tasks)


def parse_curio_tasks(text: str) -> tuple[tuple[str, int, int], ...] | None:
    """Each proving task's (name, completed, failed), by name; None: no such metric. A value that is no finite
    number is skipped (never an exception, as parse_cuzk)."""
    found: dict[str, list[int]] = {}
    for line in text.splitlines():
        match = _METRIC_RE.match(line.strip()) if len(line) <= METRIC_LINE_MAX else None
        task = _TASK_NAME_RE.search(match.group(2)) if match else None
        if match and task and task.group(1) in PROVING_TASKS:
            try:
                value = float(match.group(3))
            except ValueError:
                continue
            if not math.isfinite(value) or not 0 <= value <= MAX_COUNT:
                continue
            found.setdefault(task.group(1), [0, 0])[match.group(1) == "failed"] += int(value)
    return tuple((name, done, failed) for name, (done, failed) in sorted(found.items())) if found else None


def _get(url: str) -> bytes:
    """The body of a 200 answer to GET ``url``, whole within READ_DEADLINE_S (the socket is cut when it passes:
    a peer that drips a byte a second never holds the reader longer); raises on anything else."""
    import http.client  # (with ssl and email: 5 MiB a supervisor without this watch never needs)

    from ..manager.deadline import Watchdog  # (requests with it: on the reading thread, never at start)

    deadline_s = READ_DEADLINE_S
    parts = urllib.parse.urlsplit(url)
    connection = (http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection)(
        parts.hostname or "", parts.port, timeout=READ_TIMEOUT_S)
    watchdog = Watchdog(deadline_s)
    watchdog.start()
    try:
        connection.connect()
        watchdog.watch(connection.sock)
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        answer = connection.getresponse()
        if answer.status != 200:
            raise ValueError(f"HTTP Error {answer.status}: {answer.reason[:80]}")
        body = answer.read(MAX_ANSWER_BYTES + 1)
        if len(body) > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of more than {MAX_ANSWER_BYTES} bytes")
        if answer.length:  # (bytes its Content-Length said that never came: a page cut short is no reading, or a
            # task missing from it read as its counter reset, and its history counted again when it came back)
            raise ValueError(f"an answer cut short: {len(body)} of {len(body) + answer.length} bytes")
        return body
    except Exception:
        if watchdog.fired:
            raise TimeoutError(f"no whole answer within {deadline_s:g}s") from None
        raise
    finally:
        watchdog.finish()
        connection.close()


def read_counters(status_url: str, metrics_url: str) -> Reading:
    """cuzk's counters, else curio's; whatever either answers (or does not), a Reading: none, with why. Both
    are read: curio's tasks may fail before they reach cuzk (its [Cuzk] Address, MaxPending), in cuzk where its
    /status counts no failure (a GPU or synthesis failure), or after (ProveTimeout), while cuzk's counters look
    like an idle GPU or a working one; curio's reading rides ``beside`` cuzk's. A source that gives nothing is
    in ``unread`` (with its why) whatever the other gave."""
    errors: list[str] = []
    unread: list[tuple[str, str]] = []
    cuzk = curio = None
    if status_url:
        cuzk, why = _read_cuzk(status_url)
        if cuzk is None:
            errors.append(why)
            unread.append((CUZK, why))
    if metrics_url:
        curio, why = _read_curio(metrics_url)
        if curio is None:
            errors.append(why)
            unread.append((CURIO, why))
    if cuzk is not None:
        return replace(cuzk, beside=(curio,) if curio is not None else (), unread=tuple(unread))
    if curio is not None:
        return replace(curio, unread=tuple(unread))
    return Reading(time.monotonic(), None, None, error="; ".join(errors), unread=tuple(unread))


def _read_cuzk(url: str) -> tuple[Reading | None, str]:
    """cuzk's counters at ``url``, or None and why not (any answer contained)."""
    try:
        body = json.loads(_get(url))
        counters, kinds = parse_cuzk(body), cuzk_kinds(body)
    except Exception as exc:  # any answer: a malformed status line, broken chunks, JSON nested too deep
        return None, f"cuzk /status: {_said(exc)}"
    if counters is None:
        return None, "cuzk /status has no counters"
    return Reading(time.monotonic(), counters[0], counters[1], counters[2], CUZK, tasks=kinds), ""


def _read_curio(url: str) -> tuple[Reading | None, str]:
    """curio's proving task counters at ``url``, or None and why not. Its page without them, curio's metrics
    all the same (its namespace, ``curio_``), is curio before its first proving task (it counts a task name only
    from its first): none completed, none failed, a reading as any other, read alone or beside cuzk's. A page
    with no curio metric at all is not curio's (another program on the port, a wrong path): no reading."""
    try:
        text = _get(url).decode(errors="replace")
        tasks = parse_curio_tasks(text)
    except Exception as exc:
        return None, f"curio /debug/metrics: {_said(exc)}"
    if tasks is None and not _CURIO_PAGE_RE.search(text):
        return None, "curio /debug/metrics has no proving task counters"
    tasks = tasks or ()
    return Reading(time.monotonic(), *summed(tasks, PROOF_TASKS), None, CURIO, tasks=tasks), ""


def _said(exc: Exception) -> str:
    """A failed read in a few words: an OS or value error by its text, anything else with its class."""
    return short(str(exc)) if isinstance(exc, OSError | ValueError) and str(exc) else said_error(exc)


# ---------------------------------------------------------------- deciding (pure)


class ProofWindow:
    """The readings since production came up, one series a source (cuzk's counters and curio's count other
    things: a read that falls back from one to the other must never subtract them); what failed and
    completed within the window, each figure from the source that counts it best (COUNTED_BY)."""

    def __init__(self, window_s: float, stale_s: float = BLIND_MIN_S, asked: tuple[str, ...] = ()) -> None:
        self.window_s = window_s
        self.asked = asked  # the sources read (a figure counted by another than its own is said so: _counted_by)
        self._stale_s = stale_s  # cuzk's series is the one shown while its last reading is no older than this
        self._series: dict[str, tuple[Reading, deque[Reading]]] = {}  # source → (its first reading, the window)
        self._source: str | None = None  # the source read last

    def add(self, reading: Reading) -> None:
        if reading.completed is None or reading.failed is None:
            return
        first, readings = self._series.get(reading.source, (reading, deque()))
        last = readings[-1] if readings else None
        if last is not None and (reading.completed < (last.completed or 0) or reading.failed < (last.failed or 0)):
            first, readings = reading, deque()  # the daemon restarted: its counters began again
        readings.append(reading)
        # The figures read the window's ends alone: between them one reading a step is kept (a day's window at
        # watch_s = 1 held 86,400 readings, 93 MiB of the init process).
        if len(readings) >= 3 and readings[-1].at - readings[-3].at < self.window_s / WINDOW_POINTS:
            del readings[-2]
        while len(readings) > 1 and reading.at - readings[1].at >= self.window_s:
            readings.popleft()
        self._series[reading.source], self._source = (first, readings), reading.source

    def _series_of(self, source: str) -> tuple[str, Reading, deque[Reading]] | None:
        """``source``'s series while it reads (its last reading no older than stale_s behind the latest of any),
        else the source read last's; with its name. One missed read switched a figure to the other source's."""
        latest = self._series.get(self._source) if self._source is not None else None
        own = self._series.get(source)
        if own is not None and latest is not None and latest[1][-1].at - own[1][-1].at <= self._stale_s:
            return source, *own
        return (self._source, *latest) if self._source is not None and latest is not None else None

    def counted_by(self) -> tuple[str | None, str | None]:
        """The sources the completed and the failed figures come from now (None: nothing read yet)."""
        done, failed = (self._series_of(COUNTED_BY[i]) for i in (0, 1))
        return (done[0] if done else None), (failed[0] if failed else None)

    @property
    def first(self) -> Reading | None:
        """The first reading of the completed figures' source (since it came up, or its daemon restarted)."""
        series = self._series_of(COUNTED_BY[0])
        return series[1] if series is not None else None

    @property
    def readings(self) -> deque[Reading]:
        """The readings in the window of the completed figures' source (read-only)."""
        series = self._series_of(COUNTED_BY[0])
        return series[2] if series is not None else deque()

    def in_window(self) -> tuple[int, int]:
        """(completed, failed) between the oldest reading in the window and the latest, each of its source."""
        done, failed = (self._series_of(COUNTED_BY[i]) for i in (0, 1))
        return (_between(done[2][0], done[2][-1])[0] if done else 0,
                _between(failed[2][0], failed[2][-1])[1] if failed else 0)

    def since_up(self) -> tuple[int, int, float]:
        """(completed, failed, seconds) since the first reading, each of its source; the seconds the completed's
        (the rate's)."""
        done, failed = (self._series_of(COUNTED_BY[i]) for i in (0, 1))
        if done is None or failed is None:
            return 0, 0, 0.0
        return (_between(done[1], done[2][-1])[0], _between(failed[1], failed[2][-1])[1],
                done[2][-1].at - done[1].at)

    def failing(self, failures: int) -> bool:
        return self.failing_detail(failures) is not None

    def failing_detail(self, failures: int) -> tuple[str, int, str | None] | None:
        """(source, failed, task) when the failed figures' source (curio's while it reads: COUNTED_BY) holds
        ``failures`` or more failed and none completed in the window, judged task by task (``task`` names the
        one) and in total; None: not failing. cuzk's /status alone never judges while curio's reads: its failed
        counter misses every failure but a PoRep's self-check, its completions a batched or slotted proof."""
        series = self._series_of(COUNTED_BY[1])
        if series is None:
            return None
        source, _, readings = series
        first, last = readings[0], readings[-1]
        completed, failed = _between(first, last)  # (and the totals, as ever: a superset of the tasks')
        if last.tasks:
            before = {name: (done, failed) for name, done, failed in first.tasks}
            for name, done, failed in last.tasks:
                was = before.get(name, (0, 0))
                if failed - was[1] >= failures and done == was[0]:
                    return source, failed - was[1], name
            # The total judged over every task, as its failed figure counts them all: a WdPost or a WinPost done is
            # no proof shown (PROOF_TASKS), but it is work the GPUs did, and a few of theirs failing is no give-up.
            completed = sum(t[1] for t in last.tasks) - sum(t[1] for t in first.tasks)
        if failed >= failures and completed == 0:
            return source, failed, None
        return None


def _between(base: Reading, last: Reading) -> tuple[int, int]:
    """(completed, failed) from one reading of a source to a later one."""
    return (last.completed or 0) - (base.completed or 0), (last.failed or 0) - (base.failed or 0)


def summary_line(window: ProofWindow, machine: dict[str, Any], memory: tuple[int, int] | None) -> str:
    w_done, w_failed = window.in_window()
    done, failed, seconds = window.since_up()
    rate = done / seconds * 3600 if seconds > 0 else 0.0
    used, limit = machine.get("memory_used"), machine.get("memory_limit")
    if used is None and memory is not None:
        used, limit = memory
    mem = f"memory {fmt_bytes(used)} of {fmt_bytes(limit)}" if used is not None and limit else "memory unknown"
    gpus = machine.get("gpu_utilization") or []
    gpu = "GPU " + ", ".join(f"{g}%" if g is not None else "not measured" for g in gpus) if gpus else \
        "GPU utilisation unknown"
    return (f"production: proofs {w_done} completed / {w_failed} failed in the last "
            f"{window.window_s / 60:g} min, {done} / {failed} since up{_counted_by(window)}; {rate:.1f}/h; {mem}; "
            f"{gpu}")


def _counted_by(window: ProofWindow) -> str:
    """Whose count the figures are, said: the two sources count different things (COUNTED_BY)."""
    done, failed = window.counted_by()
    if done is None or failed is None:
        return ""
    # (A failed figure fallen back to cuzk's reads as a healthy one: say so, and what cuzk's misses.)
    lost = f", as {SOURCE_COUNTS[CURIO]} give no reading: it counts no GPU or synthesis failure" \
        if failed != COUNTED_BY[1] and COUNTED_BY[1] in window.asked else ""
    if done == failed and not lost:
        return f" ({SOURCE_COUNTS[done]})"
    return f" (completed: {SOURCE_COUNTS[done]}; failed: {SOURCE_COUNTS[failed]}{lost})"


# ---------------------------------------------------------------- the watch (the loop)


class ProductionWatch:
    """Started when production comes up, stopped when it goes down; every watch_s on the loop."""

    def __init__(self, settings: ProductionSettings, status_url: str, wiring: Wiring,
                 blind_s: float | None = None) -> None:
        self._settings, self._status_url, self._wiring = settings, status_url, wiring
        self._phase: str | None = None
        self._lock = threading.Lock()
        self._latest: Reading | None = None  # written by the reading thread
        self._reading: float | None = None  # (monotonic) when the read in flight began; None: none is
        self._timer: Any = None
        window_s = max(2 * settings.watch_s, BLIND_MIN_S) if blind_s is None else blind_s
        self._blind_s = window_s
        # The sources read, by name; with both, each has a watch of its own (either can be lost while the other
        # reads); with one, the proofs watch is that source's.
        self._read = tuple(source for source, url in ((CUZK, self._status_url), (CURIO, settings.curio_metrics))
                           if url)
        self._window = self._new_window()
        self._failed = False  # this up's failure was told (the phase fails once; the window stays shown)
        self._curio_at = 0.0  # (monotonic) curio's last reading, or when production came up
        self._curio_misses = 0  # reads of curio's metrics that gave none since then
        self.state = wiring.watch_state("proofs watch", window_s)
        self.state.idle("production is not up")
        self._own = self._source_watches(wiring, window_s)
        self._next_summary = 0.0
        self._memory: tuple[int, int] | None = None
        self.summary = ""

    def _new_window(self) -> ProofWindow:
        """A window of its own (production up again, or failed): each figure its source's while that is not blind
        (COUNTED_BY)."""
        return ProofWindow(self._settings.proof_failure_window_s, self._blind_s, self._read)

    def _source_watches(self, wiring: Wiring, window_s: float) -> dict[str, WatchState]:
        """The sources' own watches, by source: one each with both read, none with one."""
        if len(self._read) < 2:
            return {}
        own = {source: wiring.watch_state(SOURCE_WATCHES[source], window_s) for source in self._read}
        for state in own.values():
            state.idle("production is not up")
        return own

    def transition(self, phase: PhaseView) -> None:
        if phase.report != "running":
            return
        if phase.up and self._phase is None:
            self._phase = phase.name
            self._window, self._failed, self._curio_at = self._new_window(), False, time.monotonic()
            self._curio_misses = 0
            self._next_summary = 0.0
            with self._lock:
                self._latest = None  # a read of the last time up is no reading of this one
            for state in (self.state, *self._own.values()):
                state.wake()
            self._schedule()
        elif not phase.up and self._phase is not None:
            self._phase = None
            for state in (self.state, *self._own.values()):
                state.idle("production is not up")
            if self._timer is not None:
                self._timer.cancel()

    def _schedule(self) -> None:
        # First: nothing below ends the watch. Never more often than WATCH_MIN_S, whatever made the settings.
        self._timer = self._wiring.call_later(max(WATCH_MIN_S, self._settings.watch_s), self._tick)
        self._start_read()

    def _start_read(self) -> None:
        with self._lock:
            started = self._reading
            if started is None:
                self._reading = time.monotonic()
        if started is not None:  # the last one has not come back: never a second one behind it
            if time.monotonic() - started > 2 * READ_DEADLINE_S + READ_TIMEOUT_S:  # past both calls' deadlines
                self._miss(f"the read begun {time.monotonic() - started:.0f} s ago has not come back")
            return

        def read() -> None:
            try:
                reading = read_counters(self._status_url, self._settings.curio_metrics)
            except Exception as exc:  # (read_counters contains every answer): a bug of ours is no reading
                reading = Reading(time.monotonic(), None, None, error=f"internal error: {said_error(exc)}")
            with self._lock:  # the next read may begin: never stuck "in flight"
                self._latest, self._reading = reading, None

        try:
            worker_thread("production-watch", read)
        except RuntimeError as exc:  # no thread to be had (pids.max): no reading this time, said when blind
            with self._lock:
                self._reading = None
            self._miss(f"no thread to read with ({exc})")

    def _tick(self) -> None:
        phase = self._phase
        if phase is None:
            return
        with self._lock:
            reading, self._latest = self._latest, None
        self._schedule()
        if reading is None:
            return
        try:
            self._decide(phase, reading)
        except Exception as exc:  # a bug of ours in deciding: said once, and the watch goes on at the next read
            self.state.failed(said_error(exc), "the watch goes on with the next reading")

    def _miss(self, why: str) -> None:
        """No reading at all: the proofs watch's miss; the sources' own watches wait (idle), or the whole
        watch's blindness would be said three times."""
        self.state.miss(why)
        for state in self._own.values():
            if state.current != "blind":  # one said blind stays so: its reading again is said when it reads
                state.idle("no source reads: the proofs watch says why")

    def _tell_sources(self, reading: Reading) -> None:
        """A reading of one source at least: each source's own watch reads, or misses with its own why."""
        unread = dict(reading.unread)
        for source, state in self._own.items():
            if source in unread:
                state.miss(unread[source], reading.at)
            else:
                state.read(reading.at)

    def _decide(self, phase: str, reading: Reading) -> None:
        if reading.completed is None or reading.failed is None:
            self._miss(reading.error or "no counters read")
        else:
            self.state.read(reading.at)
            self._tell_sources(reading)
        for beside in reading.beside:
            self._window.add(beside)
        self._window.add(reading)  # (last: the source read last is the reading's own, the one a blind one falls to)
        self._memory = reading.memory or self._memory
        self.summary = summary_line(self._window, dict(self._wiring.machine(phase)), self._memory)
        if reading.at >= self._next_summary and reading.completed is not None:
            self._next_summary = reading.at + SUMMARY_S
            self._say_summary()
        failing = self._window.failing_detail(self._settings.proof_failures)
        if failing is not None and not self._failed:  # (once an up: its window stays, for status to show why)
            self._failed = True
            source, failed, task = failing
            which = f"{task} proof(s)" if task is not None else "proof(s)"
            detail = (f"{failed} {which} failed and none completed within {self._settings.proof_failure_window_s:g}s "
                      f"(proof_failures={self._settings.proof_failures}; {source} counters)")
            self._wiring.production.fail_phase(phase, PROOFS_FAILING, detail)
        self._judge_curio(phase, reading)

    def _judge_curio(self, phase: str, reading: Reading) -> None:
        """curio_unresponsive once its metrics have given no reading for curio_unresponsive_s: curio serves them on its
        API port, so a curio that never answers them is hung (its process lives, its port accepts: up to the rest)."""
        why = dict(reading.unread).get(CURIO)
        if CURIO not in self._read or why is None:
            self._curio_at, self._curio_misses = max(self._curio_at, reading.at), 0
            return
        # Counted from the supervisor's last thaw at the earliest (a docker pause stopped curio and us alike), and
        # never on one read alone: the read in flight as the pause came ends past its deadline right after the thaw,
        # maybe before the tick has noticed the thaw.
        self._curio_misses += 1
        thawed = self._wiring.thawed_at()
        since = self._curio_at if thawed is None else max(self._curio_at, thawed)
        unanswered_s, bound_s = reading.at - since, self._settings.curio_unresponsive_s
        if unanswered_s >= bound_s and self._curio_misses >= 2 and not self._failed:
            self._failed = True
            self._wiring.production.fail_phase(phase, CURIO_UNRESPONSIVE, (
                f"curio's metrics gave no reading for {unanswered_s:.0f}s while it ran (curio_unresponsive_s="
                f"{bound_s:g}): {why}"))

    def _say_summary(self) -> None:
        """The summary line in the log and, durably, at the manager: the logged copy is Unshipped then (as the
        memory watch's and the verdict's lines are), or the setup tab would show each summary twice."""
        manager = self._wiring.manager
        if manager is None:
            self._wiring.log(self.summary)
            return
        self._wiring.log(Unshipped(self.summary))
        manager.push_text("setup", f"prover-supervisor: {self.summary}")

    def status(self) -> dict[str, Any]:
        """The production phase's keys in status: proofs_completed/failed since up, and the rest."""
        done, failed, seconds = self._window.since_up()
        w_done, w_failed = self._window.in_window()
        done_by, failed_by = self._window.counted_by()
        return {"proofs_completed": done, "proofs_failed": failed, "summary": self.summary or None,
                "production": {"window_s": self._window.window_s, "completed_in_window": w_done,
                               "failed_in_window": w_failed, "rate_per_hour": round(done / seconds * 3600, 2)
                               if seconds > 0 else None, "counted_by": {"completed": done_by, "failed": failed_by},
                               "watch_s": self._settings.watch_s,
                               "watch": self.state.current,
                               "sources": {source: self._own.get(source, self.state).current
                                           for source in self._read}},
                "metrics": {"proofs_completed": done, "proofs_failed": failed}}


def attach_watch(wiring: Wiring, status_url: str, production_phase: str | None,
                 settings: ProductionSettings, log: Log) -> ProductionWatch | None:
    """The watch on the production phase, heard through the wiring's events; None without one."""
    if production_phase is None:
        return None
    watch = ProductionWatch(settings, status_url, wiring)
    wiring.events.on_transition(watch.transition)
    wiring.add_status(production_phase, watch.status)
    log(f"production watch: every {settings.watch_s:g}s on phase {production_phase} "
        f"({status_url or 'no cuzk status'}; curio {settings.curio_metrics or 'not read'}); proofs_failing after "
        f"{settings.proof_failures} failure(s) with none completed within {settings.proof_failure_window_s:g}s; "
        f"curio_unresponsive after {settings.curio_unresponsive_s:g}s of its metrics unanswered")
    return watch
