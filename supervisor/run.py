"""The init process, start to end: ``run`` reads like tini's ``main``, one named step a line.

1. ``take_the_lock``: state_dir and log_dir usable, state_dir's lock held (a second supervisor
   exits 75);
2. ``become_init``: claim the init role (PID 1 or subreaper), protect ourselves from the OOM
   killer, open the console and supervisor.log (the first line says which role we took), and
   point a fatal fault's last words at supervisor.log;
3. ``build_core``: the event loop, the reaper, the memory evidence;
4. ``route_signals``: every signal into the loop, with its meaning (signals.py); from here a stop
   signal during a startup step is remembered, and the steps after it are skipped;
5. ``kill_survivors_of_dead_supervisors``: end what a SIGKILLed predecessor of this state_dir left
   running (found by its tag), before anything of ours starts;
6. ``empty_leftover_cgroups``: end what such a predecessor left in its phase cgroups (found
   through the memory evidence, so after it);
7. ``build_lifecycle``: GPU evidence, the runtime, the manager reporter, the lifecycle (with what
   the last run learnt, for resume);
8. ``wire_observers``: the reporter's listeners, status.json, the status socket, health and metrics;
9. ``serve``: start the reporter and the clock's tick, check fitness off the loop (an unfit
   machine starts nothing; the loop serves signals and status meanwhile), start the lifecycle,
   loop until it is over;
10. ``tear_down`` (whatever happened): kill and reap what is left, save the state, the
    termination log, "exiting with status N", the manager's exit flush with the loop still
    running (signals handled, the sender's answers taken), then close what was opened; each step
    contains its own failure. Returns the lifecycle's exit status.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from . import fitness
from . import status as status_mod
from .config import Plan
from .exits import EXIT_OK
from .freeze import start_the_tick
from .gpuwatch import Gpus
from .lifecycle import Lifecycle
from .logs import Console, LogFile, SupervisorLog
from .loop import EventLoop, summary
from .memory import MemoryEvidence
from .offloop import NoThread
from .prover.hooks import hooks_for
from .reaping import ExitStatus, Reaper, claim_init_role, protect_from_oom_killer
from .redact import Redactor, url_secrets
from .reporting import EarlyLines, Reporter
from .resume import restore_facts
from .runtime import ChildKit, MachineEvidence, Runtime
from .signals import SignalInbox, SignalRouter, last_words_to, signal_name
from .survivors import STATE_DIR_ENV, kill_cgroup, kill_survivors_of_dead_supervisors
from .teardown import tear_down

T = TypeVar("T")
# In state_dir: the phase cgroups made, so that the next start can empty those a SIGKILL left behind.
CGROUP_LEDGER = "cgroups"
# Orphans reaped in one pass beyond this many are summarised, not listed one by one.
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
    """The lifecycle and what serves it; ``outcome`` gets the exit status once the lifecycle is over."""

    rt: Runtime
    reporter: Reporter
    lifecycle: Lifecycle
    outcome: dict[str, int] = field(default_factory=dict)


@dataclass
class Observers:
    """What watches the lifecycle from outside: status.json, the status socket, health and metrics."""

    state_file: status_mod.StateFile
    status_server: status_mod.StatusServer | None  # None: the socket could not be made (said)
    health: Any  # a HealthServer, or None when http_port is 0 or taken


@dataclass
class Signals:
    """The inbox that brings signals into the loop, and the router that gives each its meaning."""

    inbox: SignalInbox
    router: SignalRouter

    def carry_on(self, loop: EventLoop) -> bool:
        """Between startup steps: take in what was signalled meanwhile; False once a stop was asked for."""
        loop.run_once(max_wait=0)
        return self.router.stop_requested is None


def run(plan: Plan, *, console_fd: int | None = None, rebench: bool = False,
        on_start: Callable[[Lifecycle], None] | None = None) -> int:
    """Supervise ``plan`` until it completes, fails or is stopped; return the exit status."""
    started_at = time.time()
    lock_fd = take_the_lock(plan)
    host = become_init(plan, console_fd, started_at)
    core = setting_up(host, "make the event loop", lambda: build_core(plan, host))
    signals = setting_up(host, "set up signal handling", lambda: route_signals(core, host.log))
    if signals.carry_on(core.loop):
        setting_up(host, "look for what a dead supervisor left running",
                   lambda: kill_survivors_of_dead_supervisors(str(host.state_dir), host.log))
    if signals.carry_on(core.loop):
        setting_up(host, "empty a dead supervisor's cgroups", lambda: empty_leftover_cgroups(core.memory, host.log))
    signals.carry_on(core.loop)
    sup = setting_up(host, "build the lifecycle", lambda: build_lifecycle(plan, host, core, rebench))
    observers = wire_observers(plan, host, core, sup, signals.router)
    try:
        serve(plan, host, core, sup, signals.router, on_start)
    finally:
        status = tear_down(plan, host, core, sup, observers, signals, lock_fd)  # (see teardown.py)
    return status


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
    prepare_dirs(plan)
    return take_lock(plan.supervisor.state_dir)


def prepare_dirs(plan: Plan) -> None:
    for key, path in (("supervisor.state_dir", plan.supervisor.state_dir),
                      ("supervisor.log_dir", plan.supervisor.log_dir)):
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            raise SetupError(f"{key}: cannot use {path}: {exc.strerror or exc}") from None


def take_lock(state_dir: str) -> int:
    """Hold ``state_dir/supervisor.lock`` for our whole life; the kernel drops it when we die."""
    path = os.path.join(state_dir, "supervisor.lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:  # (EMFILE under a tiny ulimit -n, a state_dir gone read-only)
        raise SetupError(f"supervisor.state_dir: cannot open {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"another prover-supervisor (pid {holder}) already runs the lifecycle from "
                             f"{state_dir}; not starting a second one") from None
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
    console = Console(console_fd, enabled=plan.supervisor.console)
    log_dir = Path(plan.supervisor.log_dir)
    log = SupervisorLog(console, LogFile(log_dir / "supervisor.log", plan.supervisor.log_file_max_bytes))
    redactor = secrets_of(plan)
    log.redactor = redactor
    early_lines = EarlyLines()  # from the first line on: the manager gets them once the uuid is known
    log.taps.append(early_lines.tap)
    console.notify = log  # a console lost later (EPIPE, a full disk) is said once, in supervisor.log
    log(f"prover-supervisor pid {os.getpid()} as {role}; {oom}; config: {plan.source}; "
        f"{len(plan.phases)} phase(s): {', '.join(p.name for p in plan.phases)}")
    if console.lost_at_start:
        log(f"console: {console.lost_at_start}; console lines are lost (supervisor.log has the supervisor's own)")
    point_last_words_at(log_dir / "supervisor.log", log)
    return Host(started_at, role, child_oom_score_adj, console, log, redactor, early_lines,
                Path(plan.supervisor.state_dir), log_dir)


def point_last_words_at(path: Path, log: SupervisorLog) -> None:
    """A fatal fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS, SIGTRAP) writes every thread's traceback
    to supervisor.log through an fd of its own (the log's own fd changes when it rolls over), then dies; the
    children it leaves are named in status.json and ended by the next start. Until this fd exists (and where
    it cannot be had) the last words go to stderr (cli.main)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        log(f"cannot open {path} for a fatal fault's last words ({exc.strerror or exc}); they go to stderr")
        return
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
    reaper = Reaper(on_orphan=_orphan_logger(host.log))
    memory = MemoryEvidence(loop, host.log, plan.supervisor.cgroups, plan.supervisor.cgroup_root,
                            ledger=host.state_dir / CGROUP_LEDGER)
    host.log(memory.describe())
    return Core(loop, reaper, memory)


def route_signals(core: Core, log: SupervisorLog) -> Signals:
    """From here to the exit every signal has its meaning (signals.py); they were held since main began."""
    router = SignalRouter(core.reaper, log)
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


def empty_leftover_cgroups(memory: MemoryEvidence, log: Callable[[str], None]) -> None:
    """What a SIGKILLed predecessor's escapees left (they cleared their environment: no tag finds them,
    only the phase cgroups they were born in): kill them, then remove the emptied cgroups."""
    for owner, stale in memory.leftover_cgroups():
        if kill_cgroup(stale.procs_file(), log, f"left in {stale.path} by supervisor pid {owner}, which died"):
            stale.remove()


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


def build_lifecycle(plan: Plan, host: Host, core: Core, rebench: bool) -> Supervision:
    gpus = sample_gpus()
    spawning = ChildKit(
        loop=core.loop, reaper=core.reaper, console=host.console, log=host.log, log_dir=host.log_dir,
        ring_lines=plan.supervisor.ring_lines, log_file_max_bytes=plan.supervisor.log_file_max_bytes,
        base_env={**os.environ, STATE_DIR_ENV: str(host.state_dir)},
        # The OOM killer must pick one of the children, never us.
        child_oom_score_adj=host.child_oom_score_adj, memory=core.memory, redactor=host.redactor,
    )
    rt = Runtime.of(spawning, MachineEvidence(memory=core.memory, gpus=gpus), state_dir=host.state_dir,
                    rebench=rebench)
    reporter = Reporter(plan.manager, host.state_dir, spawning, host.redactor, host.early_lines)
    if reporter.enabled:
        spawning.ship_lines = reporter.ship_lines
    outcome: dict[str, int] = {}

    def finished(status: int) -> None:
        outcome["status"] = status
        core.loop.stop()

    lifecycle = Lifecycle(plan, rt, finished, hooks_for(plan))
    restore_facts(lifecycle, host.state_dir, host.log)
    return Supervision(rt, reporter, lifecycle, outcome)


def sample_gpus() -> Gpus:
    """The GPU thread, started at once: it opens NVML (or finds none) and takes a first sample while the
    rest starts, for the stall watch, cuzk.toml, resume, fitness and status; ``check_fitness`` says what
    it found before the first phase."""
    gpus = Gpus()
    gpus.start()
    return gpus


# ---------------------------------------------------------------- 8. observers


def wire_observers(plan: Plan, host: Host, core: Core, sup: Supervision, router: SignalRouter) -> Observers:
    lifecycle, rt, reporter = sup.lifecycle, sup.rt, sup.reporter
    lifecycle.listeners.append(reporter.phase_changed)
    rt.verdicts.on_verdict.append(reporter.verdict)

    def take_snapshot(usage: bool = True) -> dict[str, Any]:
        snap = status_mod.snapshot(role=host.role, started_at=host.started_at, config=plan.source,
                                   lifecycle=lifecycle, rt=rt, reporter=reporter, usage=usage)
        if router.flush is not None:  # the lifecycle is over; the exit waits for the manager
            snap["exiting"] = {"status": router.flush.status, "flush_left_s": round(router.flush.seconds_left(), 1),
                               "giving_up": router.flush.giving_up}
        return snap

    # status.json at every change (coalesced past a burst, see StateFile); a full disk is said once.
    state_file = status_mod.StateFile(host.state_dir, core.loop, host.log, lambda: take_snapshot(usage=False))
    lifecycle.listeners.append(state_file.changed)
    rt.verdicts.on_verdict.append(state_file.changed)
    status_server = start_status_socket(core.loop, host.state_dir, take_snapshot, host.log)
    health = start_health(plan, core.loop, lifecycle, take_snapshot, host.log)
    lifecycle.on_shutdown.append(lambda why, status: reporter.push_text(
        "setup", f"prover-supervisor stopping: {why}") if status != EXIT_OK else None)
    # After the reason lines above: the manager must have the why before it destroys the instance.
    lifecycle.on_shutdown.append(reporter.give_up)
    return Observers(state_file, status_server, health)


def start_status_socket(loop: EventLoop, state_dir: Path, take_snapshot: Callable[..., dict[str, Any]],
                        log: SupervisorLog) -> status_mod.StatusServer | None:
    try:
        return status_mod.StatusServer(loop, state_dir, take_snapshot, log)
    except OSError as exc:  # (no fd left, a path too long for a unix socket)
        log(f"status: cannot listen on {state_dir / 'status.sock'} ({exc.strerror or exc}); "
            "`prover-supervisor status` shows status.json only")
        return None


def start_health(plan: Plan, loop: EventLoop, lifecycle: Lifecycle, take_snapshot: Callable[..., dict[str, Any]],
                 log: SupervisorLog) -> Any:
    """Health and metrics on 127.0.0.1:http_port, fed by a heartbeat of the loop."""
    port = plan.supervisor.http_port
    if not port:
        return None
    from .health import HEARTBEAT_S, HealthServer, HealthState, metrics_text  # only when asked for

    state = HealthState()
    try:
        server = HealthServer(port, state)
    except OSError as exc:
        log(f"health: cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}); /healthz and /metrics are off")
        return None
    except RuntimeError as exc:  # no thread to serve it
        log(f"health: cannot serve 127.0.0.1:{port} ({summary(exc)}); /healthz and /metrics are off")
        return None
    production = lifecycle.production()

    def beat() -> None:
        loop.call_later(HEARTBEAT_S, beat)  # first: a beat that raises (contained by the loop) is not the last
        ready = bool(production) and all(p.up for p in production)
        state.publish(ready, metrics_text(take_snapshot(usage=False)))

    beat()
    log(f"health: http://127.0.0.1:{server.port}/healthz, /readyz, /metrics")
    return server


# ---------------------------------------------------------------- 9. serve


def serve(plan: Plan, host: Host, core: Core, sup: Supervision, router: SignalRouter,
          on_start: Callable[[Lifecycle], None] | None) -> None:
    """Start the lifecycle on a fit machine (asked off the loop), then loop until it is over."""
    router.lifecycle = sup.lifecycle  # a stop signal now stops it (the loop takes them in from here)
    if router.stop_requested is not None:  # asked to stop during the startup steps: start nothing
        sup.lifecycle.shutdown(*router.stop_requested)
        return
    evidence = sup.rt.evidence
    gpus_said = say_gpu_evidence(evidence.gpus, host.log)  # before the manager's lines: the setup tab's order
    start_reporting(sup, core.loop, host.log)
    # The tick: a freeze of the supervisor is noticed, the off-loop watchers say what they saw.
    evidence.freeze = start_the_tick(core.loop, host.log, [evidence.progress.check, *(
        [evidence.gpus.check] if evidence.gpus is not None else [])])

    def fitness_known(fit: bool) -> None:
        if fit:
            sup.lifecycle.start()
        if on_start is not None:
            on_start(sup.lifecycle)

    check_fitness(plan, sup.rt, sup.lifecycle, host.log, fitness_known, gpus_said)
    if "status" not in sup.outcome:  # a lifecycle over at once: no loop to run
        core.loop.run()


def start_reporting(sup: Supervision, loop: EventLoop, log: SupervisorLog) -> None:
    """A reporter that cannot start (no fd for its outbox or a module it imports) costs the reporting, not the run."""
    try:
        sup.reporter.start(sup.lifecycle)
    except Exception as exc:
        if not isinstance(exc, OSError):
            loop.faults.report("starting the manager reporting", exc)  # a bug: its traceback in supervisor.log
        log(f"manager reporting off: it could not start ({summary(exc)})")
        sup.reporter.enabled = False


def say_gpu_evidence(gpus: Gpus | None, log: SupervisorLog) -> bool:
    """What the GPU thread found, if it has opened NVML yet (never waited for); True if it was said."""
    if gpus is None:
        return True
    if gpus.opened.is_set():
        log(f"GPU evidence: {gpus.describe()}")
        return True
    log("GPU evidence: NVML is being opened (its answer is said before the first phase)")
    return False


def check_fitness(plan: Plan, rt: Runtime, lifecycle: Lifecycle, log: SupervisorLog,
                  then: Callable[[bool], None], gpus_said: bool = True) -> None:
    """Check before the first phase (the download) that the machine can run them all; refuse at once if not.
    The evidence comes from off the loop, bounded (fitness.check): meanwhile a SIGTERM stops the run
    cleanly, nothing started. ``then(fit)`` follows the decision (not a shutdown that came first)."""
    gpus = rt.evidence.gpus or Gpus()

    def decide(findings: list[fitness.Finding], evidence: fitness.Evidence | None) -> None:
        if lifecycle.shutting_down:
            return  # stopped while the evidence came (SIGTERM): nothing starts
        if not gpus_said:
            log(f"GPU evidence: {gpus.describe()}")
        if not findings:
            log(fitness.describe(evidence) if evidence is not None else "fitness: not checked (see above)")
            then(True)
            return
        verdict = fitness.refusal(findings)
        rt.verdicts.record(verdict)
        lifecycle.failure = verdict
        lifecycle.shutdown(f"this machine cannot run the lifecycle ({verdict.reason})", verdict.status)
        then(False)

    def broken(exc: Exception) -> None:  # a bug of the check's own; the phases' own preflights still hold
        if isinstance(exc, NoThread):
            log(f"fitness: not checked: {exc}; the phases' own memory preflights still hold")
        else:
            rt.loop.faults.report("the fitness check", exc)
        decide([], None)

    fitness.check(rt.loop, plan, rt.evidence.memory, gpus, decide, on_error=broken, bound_s=fitness.FITNESS_BOUND_S)
