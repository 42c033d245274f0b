"""The supervisor's start, steps 1 to 7 of run.py: each a function that does one thing and says so.

1. ``take_the_lock``: state_dir and log_dir usable, state_dir's lock held (a second supervisor exits 75, what it
   made removed again);
2. ``become_init``: the init role (PID 1 or subreaper), the OOM killer's aim away from us, the console and
   supervisor.log (its first line says which role we took), a fatal fault's last words into it;
3. ``build_core``: the event loop, the reaper, the memory evidence;
4. ``route_signals``: every signal into the loop, with its meaning (signals.py);
5. ``kill_survivors_of_dead_supervisors`` (trees.py) and 6. ``empty_leftover_cgroups``: what a SIGKILLed
   predecessor of this state_dir left running, ended before anything of ours starts;
7. ``build_lifecycle``: the GPU thread, the runtime, the manager reporter, the lifecycle with the plugin's
   phase hooks and what the last run learnt (resume); who observes it is named in step 8 (observers.py).

What they make is held in the small records below (``Host``, ``Core``, ``Signals``, ``Supervision``, and
step 8's ``Outlets``), which the observers (observers.py) and the exit (teardown.py) take too. A step that
fails for want of a resource is ``SetupError``: one line, exit 2, nothing of the lifecycle started
(``setting_up``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..config import PARAM_DONE, ConfigError, Plan, check_dir_to_make
from ..engine.logs import Console, LogFile, SupervisorLog, open_to_append
from ..engine.loop import EventLoop
from ..engine.reaping import ExitStatus, Reaper, claim_init_role, protect_from_oom_killer
from ..engine.signals import SignalInbox, SignalRouter, last_words_to, signal_name
from ..engine.trees import STATE_DIR_ENV, foreign_proc, kill_cgroup
from ..evidence.gpuwatch import Gpus
from ..evidence.memory import MemoryEvidence
from ..lifecycle import resume
from ..lifecycle.lifecycle import Lifecycle
from ..lifecycle.runtime import ChildKit, MachineEvidence, Runtime
from ..manager.logship import EarlyLines
from ..manager.reporting import Reporter
from ..plugin import Plugin, hooks_for, rerun_of
from ..state import files as state_files
from ..state.firstseen import FETCH_CLOCK, FirstSeen
from ..status.file import StateFile
from ..status.socket import StatusServer
from ..text import Log
from ..text.redact import Redactor, url_secrets
from ..text.show import PATH_CHARS, shown, summary

T = TypeVar("T")
# Orphans reaped beyond this many in the whole run are summarised (one line a thousand), not listed one by one.
ORPHANS_LISTED = 5


class SetupError(Exception):
    """The environment cannot host the run (e.g. log_dir not writable): exit 2, one line."""


class AlreadyRunning(Exception):
    """Another supervisor holds the lock in state_dir: exit 75, one line, nothing started."""


@dataclass
class Host:
    """What becoming init gives: our role, the console and log, and what every child inherits."""

    started_at: float
    role: str
    child_oom_score_adj: int | None
    console: Console
    log: SupervisorLog
    redactor: Redactor
    early_lines: EarlyLines  # the lines logged before the manager knows us, sent once it does
    state_dir: Path
    log_dir: Path


@dataclass
class Core:
    """The loop and what must exist before any child: the reaper and the memory evidence."""

    loop: EventLoop
    reaper: Reaper
    memory: MemoryEvidence


@dataclass
class Supervision:
    """The lifecycle and what serves it (the lifecycle holds the exit status, once it decided it)."""

    rt: Runtime
    reporter: Reporter
    lifecycle: Lifecycle
    record: resume.ResumeRecord  # what the last run learnt, and each phase's facts once done (resume.json)


@dataclass
class Signals:
    """The inbox that brings signals into the loop, and the router that gives each its meaning."""

    inbox: SignalInbox
    router: SignalRouter

    def carry_on(self, loop: EventLoop) -> bool:
        """Between startup steps: take in what was signalled meanwhile; False once a stop was asked for."""
        loop.run_once(max_wait=0)
        return self.router.stop_requested is None


@dataclass
class Outlets:
    """What shows the run from outside (made in step 8, observers.py): status.json, the status socket, health
    and metrics, the pointer."""

    state_file: StateFile
    status_server: StatusServer | None  # None: the socket could not be made (said)
    health: Any  # a HealthServer, or None when http_port is 0 or taken
    pointer: Path | None = None  # the well-known pointer to this supervisor (status/file.py), if written


def setting_up(host: Host, what: str, step: Callable[[], T]) -> T:
    """A startup step that fails for want of a resource (no fd left under a small ``ulimit -n``, /proc
    unreadable): the environment cannot host the run; one line, exit 2, nothing of the lifecycle started.
    The console's thread is ended first: a daemon thread still running at the interpreter's exit dies in
    pthread_exit, which must load libgcc_s, and with no fd left glibc aborts the process (SIGABRT)."""
    try:
        return step()
    except (OSError, SetupError) as exc:
        host.console.close()
        if isinstance(exc, SetupError):
            raise
        raise SetupError(f"cannot {what}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- 1. take the lock


def take_the_lock(plan: Plan) -> int:
    foreign = foreign_proc()  # (before anything is made: nothing of the run may start on a process table not ours)
    if foreign is not None:
        raise SetupError(f"{foreign}: every process tree would be read there; mount this PID namespace's /proc "
                         "(unshare --mount-proc; docker run mounts one)")
    try:
        made = prepare_dirs(plan)
        try:
            return take_lock(plan.supervisor.state_dir)
        except (AlreadyRunning, SetupError):  # (a second start with a new log_dir left it behind, empty)
            remove_empty(made)
            raise
    except SetupError as exc:  # (it names a key: the file is named with it, as a config error names it)
        raise SetupError(f"{plan.source}: {exc}") from None


def prepare_dirs(plan: Plan) -> list[Path]:
    """state_dir and log_dir made and writable; the directories this start made (parents too), outermost first,
    for a start that goes no further to remove again."""
    dirs = (("supervisor.state_dir", plan.supervisor.state_dir), ("supervisor.log_dir", plan.supervisor.log_dir))
    for key, path in dirs:  # both looked at before either is made: a log_dir that is a file leaves no state_dir
        try:  # (as check looked at them: what changed since is said as check says it; mkdir would say "File exists")
            check_dir_to_make(path, key)
        except ConfigError as exc:
            raise SetupError(str(exc)) from None
    made: list[Path] = []  # the directories this start made (parents too), outermost first
    for key, path in dirs:
        try:
            made += reversed([folder for folder in (Path(path), *Path(path).parents) if not os.path.lexists(folder)])
            Path(path).mkdir(parents=True, exist_ok=True)
            # A file made and gone, not os.access: root passes that everywhere, sysfs and read-only binds too.
            tempfile.TemporaryFile(dir=path).close()
        except OSError as exc:
            # A log_dir that cannot be used leaves no state_dir made for it.
            remove_empty(made)
            raise SetupError(f"{key}: cannot use {shown(path, PATH_CHARS, bare=True)}: {exc.strerror or exc}") from None
    return made


def remove_empty(made: list[Path]) -> None:
    """The directories a start made (outermost first), removed innermost first where still empty, never more."""
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()


def take_lock(state_dir: str) -> int:
    """Hold ``state_dir/supervisor.lock`` for our whole life; the kernel drops it when we die."""
    path = os.path.join(state_dir, state_files.LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # (EMFILE under a tiny ulimit -n, a state_dir gone read-only)
        raise SetupError(f"supervisor.state_dir: cannot open {shown(path, PATH_CHARS, bare=True)}: "
                         f"{exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"another prover-supervisor (pid {shown(holder, bare=True)}) already runs the lifecycle "
                             f"from {shown(state_dir, PATH_CHARS, bare=True)}; not starting a second one") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # a full state_dir: the pid in the file only names the holder, the lock is what counts
    return fd


# ---------------------------------------------------------------- 2. become init


def become_init(plan: Plan, console_fd: int | None, started_at: float) -> Host:
    role = claim_init_role()
    oom, child_oom_score_adj = protect_from_oom_killer()
    console = Console(console_fd, children=plan.supervisor.console, roll_at=plan.supervisor.log_file_max_bytes)
    log_dir = Path(plan.supervisor.log_dir)
    log_file = LogFile(log_dir / state_files.SUPERVISOR_LOG, plan.supervisor.log_file_max_bytes)
    early_lines = EarlyLines()  # from the first line on: the manager gets them once the uuid is known
    log = SupervisorLog(console, log_file, ship=early_lines.tap)
    redactor = secrets_of(plan)
    log.redactor = redactor if redactor else None  # no secrets: nothing to mask on every line
    console.notify = log  # a console lost later (EPIPE, a full disk) is said once, in supervisor.log
    log(f"prover-supervisor pid {os.getpid()} as {role}; {oom}; config: {plan.source}; "
        f"{len(plan.phases)} phase(s): {', '.join(p.name for p in plan.phases)}")
    if console.lost_at_start:
        log(f"console: {console.lost_at_start}; console lines are lost (supervisor.log has the supervisor's own)")
    point_last_words_at(log_file, log)
    return Host(started_at, role, child_oom_score_adj, console, log, redactor, early_lines,
                Path(plan.supervisor.state_dir), log_dir)


def point_last_words_at(log_file: LogFile, log: SupervisorLog) -> None:
    """A fatal fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS, SIGTRAP) writes every thread's traceback
    to supervisor.log through an fd of its own, kept on the log's present file as it rolls over (the log's own
    fd changes then), then dies; the children it leaves are named in status.json and ended by the next start.
    Until this fd exists (and where it cannot be had) the last words go to stderr (cli.main)."""
    path = log_file.path
    try:
        fd = open_to_append(path)
    except OSError as exc:
        log(f"cannot open {path} for a fatal fault's last words ({exc.strerror or exc}); they go to stderr")
        return
    log_file.keep_on_this_file(fd)
    last_words_to(fd)


def secrets_of(plan: Plan) -> Redactor:
    """Every value that must never be shown: the manager token, env values with secret-looking names, and the
    password in a manager URL."""
    envs = [os.environ, plan.supervisor.env]
    for phase in plan.phases:
        envs += [phase.command.env, *(d.env for d in phase.daemons)]
    extra = [plan.manager.token_env] if plan.manager.token_env else []
    urls = url_secrets(plan.manager.url) + url_secrets(plan.manager.events_url)
    return Redactor.from_environments(envs, extra).plus(urls)


# ---------------------------------------------------------------- 3-6. the core, signals, what a predecessor left


def build_core(plan: Plan, host: Host) -> Core:
    loop = EventLoop()
    loop.faults.log = host.log  # what a callback raised, with its traceback, goes to supervisor.log
    threading.excepthook = _thread_death_logger(loop, host.log)
    reaper = Reaper(on_orphan=_orphan_logger(host.log), on_stop=host.log)
    memory = MemoryEvidence(loop, host.log, plan.supervisor.cgroups, plan.supervisor.cgroup_root,
                            ledger=state_files.path(host.state_dir, state_files.CGROUP_LEDGER))
    host.log(memory.describe())
    return Core(loop, reaper, memory)


def route_signals(core: Core, log: SupervisorLog, stop_budget_s: float | None = None) -> Signals:
    """From here to the exit every signal has its meaning (signals.py); they were held since main began."""
    router = SignalRouter(core.reaper, log, stop_budget_s, held=log.held)
    inbox = SignalInbox(core.loop, router.handle)
    if inbox.ignored:
        log(f"{', '.join(map(signal_name, sorted(inbox.ignored)))} came ignored (nohup): kept ignored, never forwarded")
    return Signals(inbox, router)


def _thread_death_logger(loop: EventLoop, log: SupervisorLog) -> Callable[[threading.ExceptHookArgs], None]:
    """A thread killed by what it raised (the sender, a shipper) costs what it did, said in the log: one line
    for what the machine refused (no fd left), the traceback once for a bug; never a traceback on stderr."""

    def died(args: threading.ExceptHookArgs) -> None:
        exc = args.exc_value
        name = args.thread.name if args.thread is not None else "?"
        if exc is None or isinstance(exc, SystemExit):
            return
        if isinstance(exc, OSError):
            log(f"the {name} thread died: {summary(exc)}; what it did is off from here")
        else:
            loop.faults.report(f"the {name} thread (it died)", exc)

    return died


def empty_leftover_cgroups(memory: MemoryEvidence, log: Log) -> None:
    """What a SIGKILLed predecessor's escapees left (they cleared their environment: no tag finds them,
    only the phase cgroups they were born in): kill them, then remove the emptied cgroups."""
    for owner, stale in memory.leftover_cgroups():
        # Its processes and those of any cgroup a child made below it: all the phase's, as the run's own sweep
        # takes them (memory.leftover_pids); the cgroups below go with it.
        why = f"left in {stale.path} by supervisor pid {owner}, which died"
        if kill_cgroup(stale.path, stale.pids_below, log, why) and not stale.remove():
            log(f"{stale.path}: emptied but not removed (a cgroup below it in use?); left in place")


def _orphan_logger(log: SupervisorLog) -> Callable[[int, ExitStatus], None]:
    """Orphans re-parented to us are reaped and noted; a storm of them is summarised."""
    state = {"count": 0}

    def on_orphan(pid: int, status: ExitStatus) -> None:
        state["count"] += 1
        n = state["count"]
        if n <= ORPHANS_LISTED or n % 1000 == 0:
            log(f"reaped orphan pid {pid} ({status.describe()}); {n} orphan(s) reaped so far")

    return on_orphan


# ---------------------------------------------------------------- 7. build the lifecycle


def build_lifecycle(plan: Plan, plugin: Plugin, host: Host, core: Core,
                    switches: Collection[str] = ()) -> Supervision:
    gpus = sample_gpus()
    spawning = ChildKit(
        loop=core.loop, reaper=core.reaper, console=host.console, log=host.log, log_dir=host.log_dir,
        ring_lines=plan.supervisor.ring_lines, log_file_max_bytes=plan.supervisor.log_file_max_bytes,
        base_env={**os.environ, STATE_DIR_ENV: str(host.state_dir)},
        # The OOM killer must pick one of the children, never us.
        child_oom_score_adj=host.child_oom_score_adj, memory=core.memory, redactor=host.redactor,
    )
    # Before the register: the manager's clock starts after. Its clocks under the names the plugin gave them.
    first_seen = FirstSeen(host.state_dir, host.log, names=plugin.clocks, label=plan.manager.instance)
    rt = Runtime.of(spawning, MachineEvidence(memory=core.memory, gpus=gpus, first_seen=first_seen,
                                              allocators=plugin.allocators),
                    state_dir=host.state_dir, rerun=rerun_of(plugin, switches), reasons=plugin.reasons)
    reporter = Reporter(plan.manager, host.state_dir, core.loop, host.log, spawning.export_env, host.redactor,
                        host.early_lines)
    # The instance's clocks hear the registration and each row (the manager's own times, once its row says them).
    reporter.view.first_seen = first_seen
    fetch_s = next((p.progress_deadline_s for p in plan.phases if p.report == PARAM_DONE and p.progress_deadline_s),
                   None)
    if fetch_s is not None:
        reporter.view.deadlines[FETCH_CLOCK] = fetch_s
    if reporter.enabled:
        spawning.ship_lines = reporter.ship_lines
    else:  # no manager: the lines held for it are dropped, so none need pass through the holder
        host.log.stop_shipping()
    record = resume.load_record(host.state_dir, [p.name for p in plan.phases], host.log)
    # Its end stops the loop: the exit (teardown.py) reads the status it decided.
    lifecycle = Lifecycle(plan, rt, core.loop.stop, hooks_for(plugin, plan), record=record)
    return Supervision(rt, reporter, lifecycle, record)


def sample_gpus() -> Gpus:
    """The GPU thread, started at once: it opens NVML (or finds none) and takes a first sample while the
    rest starts, for the stall watch, cuzk.toml, resume, fitness and status; ``check_fitness`` says what
    it found before the first phase."""
    gpus = Gpus()
    gpus.start()
    return gpus
