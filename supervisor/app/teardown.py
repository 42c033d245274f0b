"""The supervisor's exit, one step a line, in this order (run.py's step 10):

1. nothing of ours is left alive: SIGKILL to every descendant, reap, remove the phase cgroups;
2. the last state on disk: a download that ended well given its last figures first (the loop runs for its
   settled walk, LAST_FIGURES_WAIT_S at most); status.json (with a manager, as its exit flush begins, step 4),
   the termination log on failure (both written already when a stop signal from outside came: stopbudget.py);
3. what a stop budget cut short, one line; "exiting with status N";
4. the manager's exit flush (exitflush.py), with the loop still running: status.json saved as it begins, with
   the wait in it (a supervisor SIGKILLed in it is told from one whose exit ended); signals keep their
   meaning, the reaper runs, the status socket answers, the sender's retries and answers are
   handed back into the loop; a kill the manager's row said meanwhile, of a run that had completed,
   is its status after all (said, and the termination log written); then status.json again, with
   what the flush delivered, and without the wait;
5. close what was opened: the status socket, the pointer to it (status/file.py), health, the signal
   inbox, the loop, supervisor.log (one still failing says what it lost), the console; the lock goes
   last; then the interpreter's exit is spared its last walks of the heap.

Under a stop signal's budget the exit's first writes come earlier, at the shutdown itself (``FirstWrites``,
one of the lifecycle's observers): status.json and the termination log, before any child's grace runs.

Each step contains its own failure (a read-only state_dir under the socket or status.json, no
file descriptor left, a bug): said in one line, the rest of the exit goes on, and the exit status
is the one the lifecycle decided.
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..engine.exitflush import FLUSH_POLL_S, ExitFlush
from ..engine.loop import EventLoop
from ..engine.trees import SWEEP_MAX_S, sweep_descendants
from ..exits import EXIT_OK
from ..lifecycle.states import Deaf, ShutdownView
from ..state.files import open_regular
from ..status.file import unpoint
from ..text.show import summary

if TYPE_CHECKING:
    from ..config import Plan
    from ..engine.logs import SupervisorLog
    from ..evidence.progress import ProgressProbe
    from ..lifecycle.lifecycle import Lifecycle
    from ..manager.reporting import FlushWait
    from ..status.file import StateFile
    from .startup import Core, Host, Outlets, Signals, Supervision

# The console's last lines may hold the exit this long at most (a stdout that does not drain); less under a stop
# budget (stopbudget.py): what it has left.
CONSOLE_CLOSE_S = 5.0
# The Kubernetes termination log is cut to this (kubelet shows at most 4 KiB of it).
TERMINATION_LOG_MAX_BYTES = 4096
# A download that ended well takes its last figures from one settled walk of its progress_path, on the walker's
# thread, taken in by the loop (progresswatch.py): a download that was the run's last phase ended with the run,
# and status.json kept its last tick's figures (90% and no file complete, of a fetch that was). The loop runs for
# them this long at most: a hung mount's walk never ends, and the figures then stay the last tick's.
LAST_FIGURES_WAIT_S = 2.0
LAST_FIGURES_POLL_S = 0.05


def tear_down(plan: Plan, host: Host, core: Core, sup: Supervision, outlets: Outlets, signals: Signals,
              lock_fd: int) -> int:
    """Whatever happened, end the run in the order above; returns the lifecycle's exit status (EXIT_FAILURE if
    it never got to decide one)."""
    status = sup.lifecycle.status_at_exit()
    log = host.log
    budget = signals.router.budget
    sweep_s = budget.sweep_s(SWEEP_MAX_S) if budget is not None else SWEEP_MAX_S
    # The sweep blocks the loop (SWEEP_MAX_S on a process that outlives SIGKILL): a hold of the loop's, so that the
    # freeze watch (tick.py), looking again in the exit flush, does not take it for the supervisor frozen.
    held = core.loop.holding("the exit's sweep of what is left")
    steps: list[Step] = [("holding the loop for the sweep", held.__enter__),
                         ("killing what is left", sweep_descendants, log, sweep_s), ("reaping", core.reaper.reap),
                         ("removing the phase cgroups", core.memory.close),
                         ("ending the sweep's hold", held.__exit__, None, None, None)]
    for phase in plan.phases:  # (a loop, not a generator: no call of this module's, wakes.py counts them)
        if phase.progress_path is not None:
            figures_s = budget.sweep_s(LAST_FIGURES_WAIT_S) if budget is not None else LAST_FIGURES_WAIT_S
            steps.append(("waiting for a download's last figures", wait_for_last_figures, core.loop,
                          sup.rt.evidence.progress, figures_s))
            break
    if not sup.reporter.enabled:  # (with a manager, saved as the exit flush begins: its wait in it)
        steps.append(("saving status.json", outlets.state_file.save))
    if status != EXIT_OK:
        steps.append(("writing the termination log", write_termination_log, plan.supervisor.termination_log,
                      sup.lifecycle, status, log))
    if budget is not None:  # a stop signal from outside: say what its budget cut short (said when it comes)
        steps.append(("saying what the stop budget cut short", lambda: log(budget.cut_short())))
    steps.append(("saying the exit status", log, f"exiting with status {status}"))
    if sup.reporter.enabled:  # (no manager: nothing to flush)
        why = sup.lifecycle.shutdown_reason or "the supervisor stopped"
        steps.append(("the manager's exit flush", sup.reporter.stop, status, why,
                      flush_with_the_loop(core.loop, signals, outlets.state_file.save, log)))
        steps.append(("reading the exit status after the flush", status_after_flush, plan, sup.lifecycle, status,
                      log))
        # What the flush delivered: status.json was saved before it (a SIGKILL meanwhile finds the last state).
        steps.append(("saving status.json after the flush", outlets.state_file.save))
    if outlets.status_server is not None:
        steps.append(("closing the status socket", outlets.status_server.close))
    if outlets.pointer is not None:
        steps.append(("removing the pointer to this supervisor", unpoint, outlets.pointer))
    if outlets.health is not None:
        steps.append(("closing health", outlets.health.close))
    steps += [("closing signal handling", signals.inbox.close, log), ("closing the loop", core.loop.close)]
    for what, action, *args in steps:  # each contains its own failure: said, and the exit goes on
        try:  # (inline, not a call of this module's: each step would bounce back here, wakes.py counts them)
            action(*args)
        except Exception as exc:
            log(step_failed(what, exc))
    if host.log.file is not None:  # a file failing still: the console hears the bytes it lost, as for a child's
        host.log.file.close()
    host.console.close(budget.console_s(CONSOLE_CLOSE_S) if budget is not None else CONSOLE_CLOSE_S)
    os.close(lock_fd)
    no_last_walk_of_the_heap()
    return sup.lifecycle.status_at_exit()  # (its one holder: the flush may have learnt of the manager's kill)


def wait_for_last_figures(loop: EventLoop, walker: ProgressProbe, wait_s: float) -> None:
    """Run the loop until every download that ended well has its last figures, ``wait_s`` at most
    (LAST_FIGURES_WAIT_S, less under a stop budget: what it has left)."""
    until = loop.clock.monotonic() + wait_s
    loop.run_until(lambda: not walker.settling() or loop.clock.monotonic() >= until, LAST_FIGURES_POLL_S)


def status_after_flush(plan: Plan, lifecycle: Lifecycle, said: int, log: SupervisorLog) -> None:
    """The flush may have learnt what the run's status could not know: a run that completed, whose manager had
    killed the instance meanwhile (its row, read before a last lifecycle call; Lifecycle.stop_from_outside). Not
    a success then: the new status is said, and the termination log written, as for any status but 0."""
    status = lifecycle.status_at_exit()
    if status == said:  # (``said``: the status "exiting with status N" said before the flush)
        return
    log(f"exiting with status {status} after all: {lifecycle.shutdown_reason} (learnt during the exit flush)")
    write_termination_log(plan.supervisor.termination_log, lifecycle, status, log)


def no_last_walk_of_the_heap() -> None:
    """The run is over: at the interpreter's exit, freeze what is still alive before the finalization.

    Finalization collects garbage several times, and each full collection walks every object of the
    ~200 modules a run imports: 40-50 ms between the teardown's last line and the process's exit
    (bench/profile.py lastexit), longer than the whole teardown. Frozen objects are left out of those
    walks and their memory goes back with the process. Nothing is lost: the teardown closed what had
    a last act (the logs write straight to file descriptors, with no buffer to flush), and what the
    module dicts alone hold is still freed, in order, as the interpreter clears them. Done at the
    exit, not here: a test that calls ``run`` in-process keeps collecting as before."""
    atexit.unregister(gc.freeze)  # once per process, however many runs it made
    atexit.register(gc.freeze)


# One step of the exit: what it is (said if it fails), the call and its arguments.
Step = tuple[Any, ...]


def step_failed(what: str, exc: Exception) -> str:
    """The line of a step of the exit that failed: said, and the exit goes on."""
    return f"exit: {what} failed ({summary(exc)}); the rest of the exit goes on"


def flush_with_the_loop(loop: EventLoop, signals: Signals, save: Callable[[], None], log: SupervisorLog) -> FlushWait:
    """The exit flush waits by running the loop: a stop signal meanwhile cuts the flush short (the router
    knows the flush), the reaper runs, the status socket answers, the sender's answers are taken in. status.json
    is saved as it begins, with the wait in it (``exiting``): a SIGKILL meanwhile finds the last state, and
    ``status`` tells a supervisor killed in its flush from one whose exit ended."""
    saved = False

    def wait(flush: ExitFlush, until: Callable[[], bool]) -> None:
        nonlocal saved
        signals.router.flush = flush
        if not saved:
            saved = True
            try:
                save()
            except Exception as exc:  # (contained as each step of the exit is)
                log(step_failed("saving status.json", exc))
        budget = signals.router.budget
        if budget is not None:  # docker stop's SIGKILL comes at the budget's end: the flush ends before it
            flush.within_budget(budget.deadline)
        try:
            loop.run_until(until, FLUSH_POLL_S)
        finally:  # (the status saved after it says the exit no longer waits)
            signals.router.flush = None

    return wait


class FirstWrites(Deaf):
    """A stop signal from outside has a budget (stopbudget.py), and SIGKILL may end it: at the shutdown the
    state and the termination log are written at once, before any child's grace runs (the exit writes them
    again). Told only of a shutdown under a budget (the Observers decide)."""

    def __init__(self, plan: Plan, host: Host, sup: Supervision, state_file: StateFile) -> None:
        self._plan, self._host, self._sup, self._state_file = plan, host, sup, state_file

    def shutdown_began(self, view: ShutdownView) -> None:
        self._state_file.save()
        if view.status != EXIT_OK:
            write_termination_log(self._plan.supervisor.termination_log, self._sup.lifecycle, view.status,
                                  self._host.log)


def write_termination_log(path: str, lifecycle: Lifecycle, status: int, log: SupervisorLog) -> None:
    """Kubernetes shows this file when the container fails: the verdict line, at most 4 KiB."""
    if not os.path.exists(path):
        return
    failure = lifecycle.failure
    # The failure was masked where it was recorded (verdict.VerdictRecord); the reason is the supervisor's words.
    text = failure.line() if failure is not None else f"exit status {status}: {lifecycle.shutdown_reason}"
    try:  # (a regular file only: a FIFO there would hang the exit, deaf to every signal but SIGKILL)
        with os.fdopen(open_regular(path, os.O_WRONLY | os.O_TRUNC), "w") as f:
            f.write(text.encode()[:TERMINATION_LOG_MAX_BYTES].decode(errors="ignore"))
    except OSError as exc:
        log(f"cannot write {path}: {exc.strerror or exc}")
