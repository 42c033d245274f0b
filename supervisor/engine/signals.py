"""Every signal the supervisor can be sent, what it means, and how it reaches the loop.

``MEANINGS`` gives each catchable signal (``signal.valid_signals()`` but SIGKILL and SIGSTOP) one
meaning for the whole run, from the first line of ``cli.main`` to the exit:

- STOP: every child stopped in reverse start order, exit 128 + n; a second stop signal of any
  kind while stopping SIGKILLs everything at once. During the exit flush the first one cuts the
  flush short and a second ends it (the exit status stays the lifecycle's).
- FORWARD: to the command of every phase that runs one (reload, rotate, user-defined).
- REAP: SIGCHLD wakes the one ``waitpid(-1)`` reaper.
- NOTE: said in one line, not obeyed (job control: the supervisor never stops itself).
- IGNORE: SIG_IGN, so the kernel drops it before it is ever delivered (nothing to say).
- FAULT: a fatal fault: faulthandler writes the last words (every thread's traceback) to
  supervisor.log, then the default action ends the process (a core where allowed). The children
  live on, named in status.json (written at every change) and by the next start, which ends them.
  As PID 1 of a namespace the kernel drops a signal sent from outside whose action is the default
  (init is protected from it; a real fault is forced, and still ends the process): after ``kill -SEGV 1``
  the handler has written the last words and raised the signal again at its default action (the handler
  spent), and the kernel drops that: the supervisor runs on. Nothing wakes the loop for it
  (faulthandler's handler is C's, with no wake-up byte; a Python-level handler would loop on a real
  fault, whose instruction faults again), so as PID 1 the inbox looks every FAULT_LOOK_S for a spent
  handler of SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT: that one came from outside. The handler is
  armed again and the signal taken as a stop (the rule below: its default action would have ended the
  process), said in one line first. SIGSYS and SIGTRAP, whose handlers re-arm
  themselves (faulthandler.register), leave only their tracebacks then: nothing says they came.

The rule, where no program gives a signal its own meaning: a signal whose default action would
end the process is a request to end it, honoured in order rather than by dying with the children
left running (tini forwards such signals to its one child; ours is a sequence of phases, so
"end" is the lifecycle's shutdown). That covers SIGQUIT (Ctrl-\\), SIGPWR (sysvinit's
powerfail), SIGXCPU (RLIMIT_CPU: the kernel's SIGKILL follows at the hard limit), the timer
signals the supervisor never arms (SIGALRM, SIGVTALRM, SIGPROF), SIGSTKFLT, SIGIO, and every
real-time signal (systemd gives SIGRTMIN+3/+4/+5 halt, poweroff and reboot, and containers made
for systemd stop with ``STOPSIGNAL SIGRTMIN+3``).

How they arrive: ``signal.set_wakeup_fd`` makes the C-level handler write the signal number to a
pipe that the selector watches (a pipe, made as large as the kernel lets: 1 MiB holds every signal that comes
while a start holds the loop for seconds, even an orphan storm's SIGCHLDs, where a socket pair's few hundred
bytes, or a pipe's default 64 KiB, would drop the stop signal that came after them); the Python-level
handlers only note when each came. A signal can therefore never interrupt the supervisor half-way
through an update of its own state, and SIGCHLD wakes the reaper at once. Before the inbox exists
(argparse, imports, the config) ``hold_signals`` keeps them blocked, so one sent then waits for the
loop instead of raising KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import fcntl
import functools
import operator
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..text import Log
from .stopbudget import StopBudget  # (a few lines, no import of its own: imported here, not on a stop's path)

if TYPE_CHECKING:  # (the CLI imports this module first thing: it must stay cheap to import)
    from .exitflush import ExitFlush
    from .loop import EventLoop, Timer



class _Labelled(Protocol):
    @property
    def label(self) -> str: ...


class Reaps(Protocol):
    """The reaper (supervisor/engine/reaping.py, which names signals with this module)."""

    def reap(self) -> None: ...


class Stoppable(Protocol):
    """What a signal may do to the lifecycle (lifecycle/lifecycle.py): this module is below it."""

    @property
    def shutting_down(self) -> bool: ...

    def forward(self, signum: int) -> Sequence[_Labelled]: ...

    def shutdown(self, why: str, status: int, budget: StopBudget | None = None) -> None: ...

    def kill_everything_now(self, wait_until: float | None = None) -> None: ...


class Meaning(enum.Enum):
    STOP = "stop in order"
    FORWARD = "forwarded to every running phase's command"
    REAP = "reap the children"
    NOTE = "not obeyed"
    IGNORE = "ignored"
    FAULT = "fatal fault"


S = signal.Signals
# Each signal's meaning, and why (said with it, in the log line it gets).
MEANINGS: dict[int, tuple[Meaning, str]] = {
    S.SIGTERM: (Meaning.STOP, "the stop request (docker stop, kill)"),
    S.SIGINT: (Meaning.STOP, "Ctrl-C"),
    S.SIGQUIT: (Meaning.STOP, "Ctrl-\\, a harder stop request"),
    S.SIGPWR: (Meaning.STOP, "the power is failing"),
    S.SIGXCPU: (Meaning.STOP, "the CPU time limit is reached; SIGKILL follows at the hard limit"),
    S.SIGALRM: (Meaning.STOP, "a timer signal the supervisor never arms"),
    S.SIGVTALRM: (Meaning.STOP, "a timer signal the supervisor never arms"),
    S.SIGPROF: (Meaning.STOP, "a timer signal the supervisor never arms"),
    S.SIGSTKFLT: (Meaning.STOP, "unused on Linux; its default would end the supervisor"),
    S.SIGIO: (Meaning.STOP, "the supervisor uses no signal-driven I/O; its default would end it"),
    S.SIGHUP: (Meaning.FORWARD, "reload; under nohup it comes ignored and stays so"),
    S.SIGUSR1: (Meaning.FORWARD, "user-defined"),
    S.SIGUSR2: (Meaning.FORWARD, "user-defined"),
    S.SIGWINCH: (Meaning.FORWARD, "the terminal was resized (as tini does)"),
    S.SIGCHLD: (Meaning.REAP, "a child changed state"),
    S.SIGTSTP: (Meaning.NOTE, "Ctrl-Z: the supervisor does not stop itself; SIGSTOP pauses it"),
    S.SIGCONT: (Meaning.NOTE, "it goes on (if something had stopped it; `timeout` sends one with its signal)"),
    S.SIGURG: (Meaning.NOTE, "the supervisor reads no out-of-band socket data"),
    # Python's own choice: a write to a closed pipe or socket fails with EPIPE where it is written.
    S.SIGPIPE: (Meaning.IGNORE, "a write to a closed pipe fails with EPIPE instead"),
    # Python's own choice too: a write past RLIMIT_FSIZE fails with EFBIG, which every log file
    # contains like a full disk (lines lost, said once), rather than ending the supervision.
    S.SIGXFSZ: (Meaning.IGNORE, "a write past the file size limit fails with EFBIG instead"),
    # As tini: a background supervisor writing to a terminal must not be stopped by the kernel.
    # (Caught instead of ignored, a terminal write would raise it again on every retry, forever.)
    S.SIGTTIN: (Meaning.IGNORE, "a background read from the terminal fails with EIO instead"),
    S.SIGTTOU: (Meaning.IGNORE, "a background write to the terminal goes through"),
    S.SIGSEGV: (Meaning.FAULT, "segmentation fault"),
    S.SIGBUS: (Meaning.FAULT, "bus error"),
    S.SIGFPE: (Meaning.FAULT, "arithmetic fault"),
    S.SIGILL: (Meaning.FAULT, "illegal instruction"),
    S.SIGABRT: (Meaning.FAULT, "abort()"),
    S.SIGSYS: (Meaning.FAULT, "bad system call"),
    S.SIGTRAP: (Meaning.FAULT, "trace trap"),
}
for _rt in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
    MEANINGS[_rt] = (Meaning.STOP, "a real-time signal (systemd's halt, poweroff, reboot: SIGRTMIN+3..5)")
del _rt


def with_meaning(meaning: Meaning) -> frozenset[int]:
    return frozenset(sig for sig, (m, _) in MEANINGS.items() if m is meaning)


STOPS = with_meaning(Meaning.STOP)
FORWARDED = with_meaning(Meaning.FORWARD)
NOTED = with_meaning(Meaning.NOTE)
IGNORED = with_meaning(Meaning.IGNORE)
FAULTS = with_meaning(Meaning.FAULT)
# What the inbox catches: every signal but the ignored ones and the faults (those must kill). A worker thread
# blocks them all, so that the loop's thread takes each (offloop.worker_thread).
CAUGHT = STOPS | FORWARDED | NOTED | {signal.SIGCHLD}
# faulthandler.enable() covers these; the other faults are registered one by one.
FAULTHANDLER_FATAL = frozenset({S.SIGSEGV, S.SIGBUS, S.SIGFPE, S.SIGILL, S.SIGABRT})


# signal.Signals(n).name, looked up once: the inbox names every signal it takes (SIGCHLD too) before handling it.
_NAMES = {sig.value: sig.name for sig in signal.Signals}


def signal_name(signum: int) -> str:
    name = _NAMES.get(signum)
    if name is not None:
        return name
    if signal.SIGRTMIN < signum < signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    return f"SIG{signum}"


def meaning_of(signum: int) -> tuple[Meaning, str]:
    return MEANINGS.get(signum, (Meaning.NOTE, "a signal with no meaning here"))


# ---------------------------------------------------------------- what a stop signal does, by stage


class Stage(enum.StrEnum):
    """Where the run is, as a stop signal sees it. (A StrEnum: as a dict's key it hashes in C, on the stop's path.)"""

    STARTING = "starting"  # before the lifecycle started: nothing of it runs yet
    RUNNING = "running"  # the lifecycle runs
    STOPPING = "stopping"  # the lifecycle stops its children
    FLUSHING = "flushing"  # the lifecycle is over; the exit waits for the manager


class Action(enum.Enum):
    REMEMBER = "start nothing, then exit"
    STOP_IN_ORDER = "stop every child in reverse start order"
    KILL_NOW = "SIGKILL to everything now"
    CUT_FLUSH = "cut the exit flush short"
    END_FLUSH = "end the exit flush now"


def stop_action(stage: Stage, again: bool) -> Action:
    """What a stop signal does at ``stage``; ``again``: one already came during this stage."""
    if stage is Stage.STARTING:
        return Action.REMEMBER
    if stage is Stage.RUNNING:
        return Action.STOP_IN_ORDER
    if stage is Stage.STOPPING:
        return Action.KILL_NOW
    return Action.END_FLUSH if again else Action.CUT_FLUSH


class SignalRouter:
    """What each signal does, as the run gets further: before the lifecycle starts a stop is only
    remembered (``stop_requested``: the startup steps look at it), then it stops the lifecycle, then
    it kills at once, and once the lifecycle is over it cuts the exit flush short."""

    def __init__(self, reaper: Reaps, log: Log, stop_budget_s: float | None = None,
                 held: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._reaper = reaper
        self._log = log
        # How a stop is run: its lines held until it is over (SupervisorLog.held), so that its signals go out
        # before anything is written and the console's thread woken (that thread would take the GIL first).
        self._held = held or (lambda act: act())
        self.stop_budget_s = stop_budget_s  # the whole stop after a stop signal from outside (stopbudget.py)
        self.budget: StopBudget | None = None  # set by the stop signal that stops the running lifecycle
        self.lifecycle: Stoppable | None = None  # set as the lifecycle starts
        self.flush: ExitFlush | None = None  # set while the exit flush runs
        self.stop_requested: tuple[str, int] | None = None  # (why, exit status) of a stop before the start
        self._stops: dict[Stage, int] = {}  # stop signals received, by stage
        self._first_stop: str | None = None  # the name of the first one

    def stage(self) -> Stage:
        if self.flush is not None:
            return Stage.FLUSHING
        if self.lifecycle is None:
            return Stage.STARTING
        return Stage.STOPPING if self.lifecycle.shutting_down else Stage.RUNNING

    def handle(self, signum: int) -> None:
        meaning, why = meaning_of(signum)
        name = signal_name(signum)
        came = arrived_at(signum)
        if meaning is Meaning.REAP:
            self._reaper.reap()
        elif meaning is Meaning.STOP:
            self._held(lambda: self._stop(signum, name, why, came))
        elif meaning is Meaning.FORWARD:
            sent = self.lifecycle.forward(signum) if self.lifecycle is not None else []
            names = ", ".join(c.label for c in sent) or "nobody (no phase command running)"
            self._log(f"{name} forwarded to {names}")
        elif meaning is Meaning.FAULT:  # (only as PID 1, one sent from outside: SignalInbox's look found it)
            self._log(f"{name} came from outside (a fault would have ended the supervisor): its last words are in "
                      "supervisor.log, and as PID 1 the kernel dropped it; taken as a stop signal, as its default "
                      "action would end the supervisor")
            self._held(lambda: self._stop(signum, name, why, came))
        else:  # NOTE, and whatever else a table change lets through: said, never obeyed
            self._log(f"{name}: not obeyed: {why}")

    def _stop(self, signum: int, name: str, why: str, came: float | None = None) -> None:
        stage = self.stage()
        first, self._first_stop = self._first_stop, self._first_stop or name
        action = stop_action(stage, again=self._stops.get(stage, 0) > 0)
        self._stops[stage] = self._stops.get(stage, 0) + 1
        if action is Action.REMEMBER:
            self.stop_requested = self.stop_requested or (f"received {name}", 128 + signum)
            self._log(f"{name} ({why}) while starting: nothing more is started; the supervisor exits with "
                      f"status {self.stop_requested[1]}")
        elif action is Action.STOP_IN_ORDER:
            assert self.lifecycle is not None
            self._log(f"{name} ({why}): every child is stopped in reverse start order; a second stop signal "
                      "kills at once")
            if self.stop_budget_s is not None:
                self.budget = StopBudget(self.stop_budget_s, name, since=came)
            self.lifecycle.shutdown(f"received {name}", 128 + signum, self.budget)
        elif action is Action.KILL_NOW:
            assert self.lifecycle is not None
            # (Two sent together come in the kernel's order, not the sender's: "after", never "again", for another.)
            after = "" if first is None else " again" if first == name else f" (after {first})"
            self._log(f"{name}{after} while stopping: SIGKILL to everything now")
            if self.budget is None and self.stop_budget_s is not None:
                # A stop the supervisor began itself (a failure) had none; docker stop kills at its timeout
                # all the same: the rest of the exit (a stuck tree's wait, the sweep, the flush) fits in one.
                self.budget = StopBudget(self.stop_budget_s, name, since=came)
            if self.budget is not None:
                self.budget.killed_now_by = name
            self.lifecycle.kill_everything_now(self.budget.wait_until if self.budget is not None else None)
        elif action is Action.CUT_FLUSH:
            assert self.flush is not None
            self._log(self.flush.cut(name, self.stop_budget_s, came))
        else:
            assert self.flush is not None
            self._log(self.flush.end(name))


# ---------------------------------------------------------------- from main's first line to the inbox


def hold_signals(started_with: set[int] | None = None) -> set[int]:
    """Block every caught signal (``cli.main``'s first step): one sent before the inbox exists waits
    for it; ``SignalInbox`` unblocks them once its wake-up fd is in place. Returns the mask before.
    ``started_with``: the mask the process started with, where its entry point blocked every signal before
    its imports (entrypoint.py, __main__.py): the caught ones stay blocked, the rest as it was."""
    if started_with is None:
        return signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
    signal.pthread_sigmask(signal.SIG_SETMASK, set(started_with) | CAUGHT)
    return set(started_with)


def release_signals(mask: set[int], end_on_stop: bool = True) -> None:
    """For the commands that make no inbox of ``run``'s: the mask they were started with again (a Ctrl-C held
    meanwhile is delivered now, as KeyboardInterrupt). As PID 1 the kernel drops a signal with no handler:
    with ``end_on_stop`` a SIGTERM or SIGHUP (``docker stop`` of ``docker run IMAGE status --watch``) ends the
    command with 128 + it, rather than being dropped until docker's SIGKILL (``demo`` makes an inbox of its own,
    which gives them their meaning: not it)."""
    if end_on_stop and os.getpid() == 1:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _end_command)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _end_command(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def last_words_to(fd: int) -> None:
    """A fatal fault writes every thread's traceback to ``fd``, then the default action ends us."""
    faulthandler.enable(file=fd, all_threads=True)
    _last_words[:] = [fd]
    for sig in FAULTS - FAULTHANDLER_FATAL:
        # chain: after the traceback the default action (death, a core) still follows.
        faulthandler.register(sig, file=fd, all_threads=True, chain=True)


# Where faulthandler writes (last_words_to's fd; none yet: stderr, as cli.main armed it), to arm it again.
_last_words: list[int] = []


def _arm_last_words_again() -> None:
    """faulthandler's fatal handlers put back, after one of them fired and was survived (as PID 1). Enabling
    alone does nothing: faulthandler still counts itself enabled."""
    faulthandler.disable()
    faulthandler.enable(file=_last_words[0] if _last_words else sys.stderr, all_threads=True)


def _caught_signals() -> frozenset[int] | None:
    """The signals this process has a handler for; None where it cannot be read."""
    mask = signal_mask("self", b"SigCgt:")
    return None if mask is None else frozenset(sig for sig in range(1, mask.bit_length() + 1) if mask >> (sig - 1) & 1)


def signal_mask(pid: int | str, *fields: bytes) -> int | None:
    """The signals /proc/<pid>/status lists under ``fields`` (``SigCgt:``: those it has a handler for; ``SigPnd:``,
    ``ShdPnd:``: those pending for it, its thread's and its process's), together, as a mask: bit n-1 for signal n.
    None where it cannot be read, or lists none of them."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            masks = [int(line.split()[1], 16) for line in status if line.startswith(fields)]
    except (OSError, ValueError, IndexError):
        return None
    return functools.reduce(operator.or_, masks) if masks else None


# ---------------------------------------------------------------- the inbox


# As PID 1, how often the inbox looks for a fault handler spent by a signal sent from outside (the module
# docstring, FAULT): a read of /proc/self/status.
FAULT_LOOK_S = 1.0

# What the wake-up pipe is asked to hold: a full pipe drops the byte of the next signal, whatever it is (a
# SIGTERM after a storm's SIGCHLDs), so it is made as large as an unprivileged process may (pipe-max-size's
# default); where the kernel refuses, it keeps Linux's default 64 KiB. One read takes at most WAKEUP_READ_BYTES:
# a drain reads again while a read comes back full (a bigger read buffer would be allocated at every signal).
WAKEUP_PIPE_BYTES = 1 << 20
WAKEUP_READ_BYTES = 65536


class SignalInbox:
    """Routes every caught signal through the event loop to ``on_signal``."""

    def __init__(self, loop: EventLoop, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # (EPERM past pipe-max-size or a user's pipe quota: 64 KiB it is)
            fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, WAKEUP_PIPE_BYTES)
        # Started under nohup (Vast's onstart), SIGHUP is ignored on purpose: keep it so.
        self.ignored = {sig for sig in (signal.SIGHUP,) if signal.getsignal(sig) == signal.SIG_IGN}
        for sig in CAUGHT - self.ignored:
            signal.signal(sig, _wake_only)
        for sig in IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        # Held since main's first line (hold_signals), or inherited blocked from a launcher: now ours.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, CAUGHT)
        self._loop = loop
        loop.add_reader(self._read_fd, self._drain)
        self._fault_look: Timer | None = None
        self._armed = FAULTHANDLER_FATAL & (_caught_signals() or frozenset()) if os.getpid() == 1 else frozenset()
        if self._armed:
            self._fault_look = loop.call_later(FAULT_LOOK_S, self._look_for_sent_faults)

    def _look_for_sent_faults(self) -> None:
        """As PID 1: a fault handler that fired and was survived (the default action is back) was a fault signal
        sent from outside (module docstring, FAULT): armed again, it is handed on as the signal it was."""
        caught = _caught_signals()
        spent = sorted(self._armed - caught) if caught is not None else []
        if spent:
            _arm_last_words_again()
        for signum in spent:
            try:
                self._on_signal(signum)
            except Exception as exc:
                self._loop.contain(exc, None, f"handling {signal_name(signum)}")
        self._fault_look = self._loop.call_later(FAULT_LOOK_S, self._look_for_sent_faults)

    def _drain(self) -> None:
        data = _read_all(self._read_fd)
        if not data:
            return
        reaped = False
        for signum in data:
            # One reap takes every exit there was before this read: an orphan storm's thousands of SIGCHLD
            # bytes are one reap, not thousands (an exit after it brings its own byte). A reap that raised
            # (an exit's handler) may have stopped short: the next SIGCHLD byte reaps again.
            if signum == signal.SIGCHLD and reaped:
                continue
            # Each signal on its own: one whose handling raised must not swallow the SIGCHLD after it.
            try:
                self._on_signal(signum)
                reaped = reaped or signum == signal.SIGCHLD
            except Exception as exc:
                self._loop.contain(exc, None, f"handling {signal_name(signum)}")

    def close(self, log: Log | None = None) -> None:
        """The exit status is decided: from here to the process's end a signal means nothing. The handlers
        stay (doing nothing) and the signals are blocked again, so that no thread still alive can meet a
        default action (SIGTERM's would turn the decided status into 143). A signal still in the pipe came in
        the loop's last turn, or while a call held it (a start waiting for its exec) that ended the run: never
        acted on, and said to ``log`` with when it came, rather than closed away unread."""
        signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
        if self._fault_look is not None:
            self._fault_look.cancel()
        signal.set_wakeup_fd(self._old_wakeup)
        late = _read_all(self._read_fd)  # (blocked first: no byte comes after this read)
        self._loop.remove_reader(self._read_fd)
        os.close(self._read_fd)
        os.close(self._write_fd)
        if log is None:
            return
        for signum in sorted(set(late) - {signal.SIGCHLD}):  # (each once; no call made for none)
            came = arrived_at(signum)
            when = f" {time.monotonic() - came:.1f}s ago" if came is not None else ""
            log(f"{signal_name(signum)} came{when}, but the exit status was decided before the loop read it: "
                "not acted on")


# When each signal not yet acted on first came (monotonic): the loop may act on it late, after a call that held
# it (a start waiting for its exec), and a stop's budget counts from the signal, as docker stop's timeout does.
_arrived: dict[int, float] = {}


def _read_all(fd: int) -> bytes:
    """Every signal byte waiting in the wake-up pipe, in order (b"" for none)."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, WAKEUP_READ_BYTES)
        except BlockingIOError:
            return data
        data += chunk
        if len(chunk) < WAKEUP_READ_BYTES:
            return data


def _wake_only(signum: int, frame: object) -> None:
    """The real work happens in the loop; this only has to exist so the fd gets its byte, and notes the time.
    (It runs on the main thread as soon as the signal comes, a blocking call there interrupted for it.)"""
    _arrived.setdefault(signum, time.monotonic())


def arrived_at(signum: int) -> float | None:
    """When ``signum`` came, if it has not been asked yet since it did (monotonic); None: unknown."""
    return _arrived.pop(signum, None)
