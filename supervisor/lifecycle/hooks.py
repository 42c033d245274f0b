"""What a phase may be given beyond running its children: the generic Phase only calls these.

Three hooks, each chosen once from the phase's spec (supervisor/prover/hooks.py holds the prover's):

- ``prepare``, before each attempt: the extra environment the attempt's children get, or a
  Refusal that fails the phase (the machine cannot run it);
- ``output``, a reader of the command's output: a fresh parser per attempt, whose result judges a
  command that exited 0 (some tools exit 0 whatever happened) and is shown as ``phase.parsed``. A result
  that also reads a download's progress from the output (``ReadsProgress``: aria2c's readout) feeds the
  phase's progress (progresswatch.py); one that reads the command's own word on a failed exit
  (``ExplainsFailure``: cuzk-bench's ``Error:`` line) has it said in that exit's verdict; a parser that knows
  some lines for no sign of life (``MarksIdleLines``: a readout that repeats its figures) has the stall watch
  count only the others as the command's output (``OutputLife``);
- ``settle``, a reader of the daemons' output: after the command succeeded, the daemons are kept (the phase
  SETTLING) while it says they still do something the command started (a cache the first request builds
  on a thread of its own, say), for at most the phase's settle_timeout_s. A daemon's death or a fault a watch
  finds fails the attempt then; the settle's end, its bound, the deadline, a stall or too_slow stops the daemons
  as after any success.

The core's own step before a phase's first attempt is one of these: ``memory_preflight`` (told only a
HookContext, never the Phase) says what memory the children have, and refuses a phase whose min_memory
cannot fit, at once rather than OOM-killed 10 minutes in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, overload, runtime_checkable

from ..evidence.transfer import ProgressReading as ProgressReading
from ..text import Log
from ..text.show import fmt_bytes
from . import verdict as v
from .verdict import Verdict

if TYPE_CHECKING:
    from ..evidence.gpu import GpuSample


class Refusal(NamedTuple):
    """Why the phase cannot run: the reason and detail of the verdict that fails it."""

    reason: str
    detail: str


class Parsed(Protocol):
    """What a parser read: None from ``problem()`` when the output says the command succeeded."""

    def problem(self) -> str | None: ...

    def describe(self) -> str: ...


@runtime_checkable
class ReadsProgress(Protocol):
    def progress(self) -> ProgressReading | None: ...  # None: it said nothing of its progress yet


@runtime_checkable
class ExplainsFailure(Protocol):
    def failure_said(self) -> str | None: ...  # what the command said of its failed exit; None: nothing


class OutputParser(Protocol):
    """Fed the command's output lines as they arrive; its ``result`` fills in as it reads."""

    result: Any  # a Parsed

    def feed(self, lines: list[bytes]) -> None: ...


@runtime_checkable
class MarksIdleLines(Protocol):
    """An OutputParser that knows some lines for no sign of life, and counts them as it reads: a progress readout
    whose figures did not move since the last (and no speed), the block a program prints on a timer around such
    readouts. Every line it does not mark (one it does not know, an error, a readout that moved) is life."""

    result: Any
    idle_lines: int  # how many of the lines it read so far were idle

    def feed(self, lines: list[bytes]) -> None: ...


class OutputLife:
    """A parser that marks idle lines, as the phase's reader of its command's output, and when that output last was
    a sign of life: the one place where what a parser reads and the stall watch meet (attempt.py).

    A read (the lines one read of the pipe brought) is a sign of life if some line of it is not idle. One whose lines
    are all idle is none: a program stuck for good that prints the same figures every minute (a downloader waiting
    on a gateway that never answers) would otherwise never be stalled. The bytes of a line not ended yet are judged
    with it, when it ends. A command whose parser marks nothing is judged by its every byte, as before."""

    def __init__(self, parser: MarksIdleLines) -> None:
        self.parser = parser
        self.result: Any = parser.result  # (a parser's result is made once, and filled in as it reads)
        self.life_at: float | None = None  # monotonic: the last read with a line that was no idle one
        self.idle_at: float | None = None  # ... the last read whose lines were all idle

    def feed(self, lines: list[bytes]) -> None:
        idle = self.parser.idle_lines
        self.parser.feed(lines)
        # The clock of ChildOutput.last_output_at (time.monotonic), which this stands in for the command's.
        if self.parser.idle_lines - idle < len(lines):
            self.life_at = time.monotonic()
        elif lines:
            self.idle_at = time.monotonic()


@dataclass(frozen=True)
class OutputHook:
    what: str  # what the output tells of, in the log and the verdict: "bench", "warm-up proof"
    parser_name: str  # names the parser when it raises (a supervisor bug): "the cuzk-bench output parser"
    make_parser: Callable[[], OutputParser]  # a fresh parser (``new_parser`` hands it out)
    failed_reason: str  # the verdict's reason when the output says the command failed
    # The facts key a result is saved under for the next start (a resumed phase still knows it),
    # and how it is read back (a TypeError means the saved one is unreadable): None keeps nothing.
    fact: str | None = None
    restore: Callable[[dict[str, Any]], Parsed] | None = None

    def new_parser(self) -> OutputParser:
        """A fresh parser for an attempt's command; one that marks idle lines read through OutputLife, which the
        stall watch asks when the command's output last was a sign of life."""
        parser = self.make_parser()
        return OutputLife(parser) if isinstance(parser, MarksIdleLines) else parser

    def judge(self, verdict: Verdict, result: Parsed, log: Log) -> Verdict:
        """The verdict of a command that exited: one that succeeded fails all the same when its output says
        it did (such tools exit 0 whatever happened); one that exited non-zero keeps its reason, with what its
        output said of it (``ExplainsFailure``), which the status alone ("exited with code 1") does not tell."""
        if not verdict.success:
            said = result.failure_said() if isinstance(result, ExplainsFailure) else None
            if said and verdict.reason == v.EXIT_CODE:
                return replace(verdict, detail=f"{verdict.detail}; {said}")
            return verdict
        problem = result.problem()
        if problem is None:
            log(f"phase {verdict.phase}: {self.what} passed: {result.describe()}")
            return verdict
        return replace(verdict, reason=self.failed_reason, success=False, status=1,
                       detail=f"{self.what} failed: {problem}")


class SettleWatch(Protocol):
    """Fed the attempt's daemons' output lines as they arrive (each line whole, as the parsers are)."""

    def feed(self, lines: list[bytes]) -> None: ...

    def pending(self) -> str | None: ...  # what the daemons still do for the command; None: nothing (stop them)


@dataclass(frozen=True)
class SettleHook:
    what: str  # what is waited for, in the log and status: "cuzk-daemon's PCE save"
    new_watch: Callable[[], SettleWatch]  # a fresh one per attempt
    cut_short: str  # what it costs when the bound stops the daemons first, said in the log


@dataclass(frozen=True)
class HookContext:
    """What a hook is told of the phase it runs for, and all it may use: never the Phase itself."""

    phase: str  # the phase's name
    memory_available: int | None  # what the phase may have: the cgroup limit or MemTotal, capped by its memory_max
    gpus: tuple[GpuSample, ...]  # the GPU thread's latest sample (empty: none yet, or no GPU); never a call to NVML
    state_dir: Path
    log: Log
    gpus_left_out: tuple[tuple[int, str], ...] = ()  # (index, why) of each GPU NVML counts that ``gpus`` lacks


# Before the phase runs: what its children get in their environment, or why it cannot run.
Prepare = Callable[[HookContext], "dict[str, str] | Refusal"]


@dataclass(frozen=True)
class PhaseHooks:
    prepare: Prepare | None = None  # before each attempt
    output: OutputHook | None = None
    settle: SettleHook | None = None
    # What ``prepare`` makes the children's environment and files from (a plugin's settings, JSON data): part of
    # what the phase runs, for resume (resume.py ``ran``); None: nothing beyond its spec.
    prepared_from: Any = None


NO_HOOKS = PhaseHooks()


# ---------------------------------------------------------------- the memory preflight


def memory_preflight(ctx: HookContext, min_memory: int | None) -> dict[str, str] | Refusal:
    """Before the phase's first attempt: its children are told what memory they have, and a phase whose
    ``min_memory`` cannot fit is refused at once."""
    available = ctx.memory_available
    shortfall = memory_shortfall(ctx.phase, min_memory, available, ctx.log)
    if shortfall is not None:
        return Refusal(v.INSUFFICIENT_MEMORY, shortfall)
    return {} if available is None else {"SUPERVISOR_MEMORY_AVAILABLE_BYTES": str(available)}


@overload
def capped(available: int, cap: int | None) -> int: ...
@overload
def capped(available: int | None, cap: int | None) -> int | None: ...
def capped(available: int | None, cap: int | None) -> int | None:
    """What a phase can have: ``available`` (cgroup limit or MemTotal), at most its memory_max ``cap``."""
    if cap is None:
        return available
    return cap if available is None else min(available, cap)


def too_little_memory(need: int, available: int) -> str:
    """The refusal of a min_memory that does not fit, naming both numbers (the preflight's and fitness's)."""
    return (f"needs min_memory={fmt_bytes(need)} ({need} bytes) but only {fmt_bytes(available)} "
            f"({available} bytes) is available (cgroup limit, MemTotal or the phase's memory_max)")


def memory_shortfall(name: str, need: int | None, available: int | None, log: Log) -> str | None:
    """Why a phase that needs ``need`` bytes (min_memory) cannot fit in ``available``, or None (it fits,
    or either is unknown): refused at once rather than OOM-killed 10 minutes in."""
    if need is None:
        return None
    if available is None:
        log(f"phase {name}: memory preflight skipped: neither a cgroup limit nor MemTotal readable")
        return None
    if available < need:
        return too_little_memory(need, available)
    log(f"phase {name}: memory preflight ok: {fmt_bytes(available)} available, min_memory {fmt_bytes(need)}")
    return None
