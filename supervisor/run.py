"""The init process, start to end: ``run`` reads like tini's ``main``, one named step a line.

1. ``take_the_lock``: state_dir and log_dir usable, state_dir's lock held (a second supervisor
   exits 75);
2. ``become_init``: claim the init role (PID 1 or subreaper), protect ourselves from the OOM
   killer, open the console and supervisor.log (the first line says which role we took);
3. ``kill_survivors_of_dead_supervisors``: end what a SIGKILLed predecessor of this state_dir left
   running (found by its tag), before anything of ours starts;
4. ``build_core``: the event loop, the reaper, the memory evidence;
5. ``empty_leftover_cgroups``: end what such a predecessor left in its phase cgroups (found
   through the memory evidence, so after it);
6. ``build_lifecycle``: GPU evidence, the runtime, the manager reporter, the lifecycle (with what
   the last run learnt, for resume);
7. ``wire_observers``: the reporter's listeners, status.json, the status socket, health and metrics;
8. ``route_signals``: every handled signal into the loop;
9. ``serve``: start the reporter, check fitness (an unfit machine starts nothing), start the
   lifecycle, loop until it is over;
10. tear down: ``sweep_and_close`` (whatever happened: kill what is left, close what was
    opened), then ``report_the_end`` (save the state, the termination log, the manager's last
    word) and return the lifecycle's exit status.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import fitness
from . import status as status_mod
from .config import Plan
from .exits import EXIT_FAILURE, EXIT_OK
from .gpu import Gpus
from .lifecycle import Lifecycle, Runtime
from .logs import Console, LogFile, SupervisorLog
from .loop import EventLoop
from .memory import MemoryEvidence
from .prover.hooks import hooks_for
from .reaping import ExitStatus, Reaper, claim_init_role, protect_from_oom_killer
from .redact import Redactor, url_secrets
from .reporting import EarlyLines, Reporter
from .resume import restore_facts
from .signals import FORWARDED, SHUTDOWN, SignalInbox, signal_name
from .survivors import STATE_DIR_ENV, kill_cgroup, kill_survivors_of_dead_supervisors, sweep_descendants

# In state_dir: the phase cgroups made, so that the next start can empty those a SIGKILL left behind.
CGROUP_LEDGER = "cgroups"
# Orphans reaped in one pass beyond this many are summarised, not listed one by one.
ORPHANS_LISTED = 5
# The Kubernetes termination log is cut to this (kubelet shows at most 4 KiB of it).
TERMINATION_LOG_MAX_BYTES = 4096


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
    status_server: status_mod.StatusServer
    health: Any  # a HealthServer, or None when http_port is 0 or taken


def run(plan: Plan, *, console_fd: int | None = None, rebench: bool = False,
        on_start: Callable[[Lifecycle], None] | None = None) -> int:
    """Supervise ``plan`` until it completes, fails or is stopped; return the exit status."""
    started_at = time.time()
    lock_fd = take_the_lock(plan)
    host = become_init(plan, console_fd, started_at)
    kill_survivors_of_dead_supervisors(str(host.state_dir), host.log)
    core = build_core(plan, host)
    empty_leftover_cgroups(core.memory, host.log)
    sup = build_lifecycle(plan, host, core, rebench)
    observers = wire_observers(plan, host, core, sup)
    inbox = route_signals(core, sup, host.log)
    try:
        serve(plan, host, core, sup, on_start)
    finally:
        sweep_and_close(core, observers, inbox, host.log)
    return report_the_end(plan, host, sup, observers, lock_fd)


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
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
    log(f"prover-supervisor pid {os.getpid()} as {role}; {oom}; config: {plan.source}; "
        f"{len(plan.phases)} phase(s): {', '.join(p.name for p in plan.phases)}")
    return Host(started_at, role, child_oom_score_adj, console, log, redactor, early_lines,
                Path(plan.supervisor.state_dir), log_dir)


def secrets_of(plan: Plan) -> Redactor:
    """Every value that must never be shown: the manager token, env values with secret-looking names, and the
    password in a manager URL."""
    envs = [os.environ, plan.supervisor.env]
    for phase in plan.phases:
        envs += [phase.command.env, *(d.env for d in phase.daemons)]
    extra = [plan.manager.token_env] if plan.manager.token_env else []
    urls = url_secrets(plan.manager.url) + url_secrets(plan.manager.events_url)
    return Redactor.from_environments(envs, extra).plus(urls)


# ---------------------------------------------------------------- 3-5. the core, and what a predecessor left


def build_core(plan: Plan, host: Host) -> Core:
    loop = EventLoop()
    loop.faults.log = host.log  # what a callback raised, with its traceback, goes to supervisor.log
    reaper = Reaper(on_orphan=_orphan_logger(host.log))
    memory = MemoryEvidence(loop, host.log, plan.supervisor.cgroups, plan.supervisor.cgroup_root,
                            ledger=host.state_dir / CGROUP_LEDGER)
    host.log(memory.describe())
    return Core(loop, reaper, memory)


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


# ---------------------------------------------------------------- 6. build the lifecycle


def build_lifecycle(plan: Plan, host: Host, core: Core, rebench: bool) -> Supervision:
    gpus = sample_gpus(plan, host.log)
    rt = Runtime(
        loop=core.loop, reaper=core.reaper, console=host.console, log=host.log, log_dir=host.log_dir,
        ring_lines=plan.supervisor.ring_lines, log_file_max_bytes=plan.supervisor.log_file_max_bytes,
        base_env={**os.environ, STATE_DIR_ENV: str(host.state_dir)},
        # The OOM killer must pick one of the children, never us.
        child_oom_score_adj=host.child_oom_score_adj,
        memory=core.memory, gpus=gpus, redactor=host.redactor, cuzk=plan.cuzk, state_dir=host.state_dir,
        rebench=rebench,
    )
    reporter = Reporter(plan.manager, host.state_dir, rt, host.redactor, host.early_lines)
    if reporter.enabled:
        rt.ship_lines = reporter.ship_lines
    outcome: dict[str, int] = {}

    def finished(status: int) -> None:
        outcome["status"] = status
        core.loop.stop()

    lifecycle = Lifecycle(plan, rt, finished, hooks_for)
    restore_facts(lifecycle, host.state_dir, host.log)
    return Supervision(rt, reporter, lifecycle, outcome)


def sample_gpus(plan: Plan, log: SupervisorLog) -> Gpus:
    """Read the GPUs once at start where a phase needs them: stall evidence, or sizing cuzk.toml."""
    gpus = Gpus()
    if any(p.stall_s is not None or p.prepare == "cuzk-config" for p in plan.phases):
        gpus.sample()
        log(f"GPU evidence: {gpus.why}")
    return gpus


# ---------------------------------------------------------------- 7-8. observers and signals


def wire_observers(plan: Plan, host: Host, core: Core, sup: Supervision) -> Observers:
    lifecycle, rt, reporter = sup.lifecycle, sup.rt, sup.reporter
    lifecycle.listeners.append(reporter.phase_changed)
    rt.on_verdict.append(reporter.verdict)

    def take_snapshot(usage: bool = True) -> dict[str, Any]:
        return status_mod.snapshot(role=host.role, started_at=host.started_at, config=plan.source,
                                   lifecycle=lifecycle, rt=rt, reporter=reporter, usage=usage)

    # status.json at every change (coalesced past a burst, see StateFile); a full disk is said once.
    state_file = status_mod.StateFile(host.state_dir, core.loop, host.log, lambda: take_snapshot(usage=False))
    lifecycle.listeners.append(state_file.changed)
    rt.on_verdict.append(state_file.changed)
    status_server = status_mod.StatusServer(core.loop, host.state_dir, take_snapshot, host.log)
    health = start_health(plan, core.loop, lifecycle, take_snapshot, host.log)
    lifecycle.on_shutdown.append(lambda why, status: reporter.push_text(
        "setup", f"prover-supervisor stopping: {why}") if status != EXIT_OK else None)
    # After the reason lines above: the manager must have the why before it destroys the instance.
    lifecycle.on_shutdown.append(reporter.give_up)
    return Observers(state_file, status_server, health)


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
        log(f"health: cannot listen on 127.0.0.1:{port} ({exc.strerror}); /healthz and /metrics are off")
        return None
    production = lifecycle.production()

    def beat() -> None:
        loop.call_later(HEARTBEAT_S, beat)  # first: a beat that raises (contained by the loop) is not the last
        ready = bool(production) and all(p.up for p in production)
        state.publish(ready, metrics_text(take_snapshot(usage=False)))

    beat()
    log(f"health: http://127.0.0.1:{server.port}/healthz, /readyz, /metrics")
    return server


def route_signals(core: Core, sup: Supervision, log: SupervisorLog) -> SignalInbox:
    return SignalInbox(core.loop, lambda signum: handle_signal(signum, sup.lifecycle, core.reaper, log))


def handle_signal(signum: int, lifecycle: Lifecycle, reaper: Reaper, log: SupervisorLog) -> None:
    if signum == signal.SIGCHLD:
        reaper.reap()
    elif signum in SHUTDOWN:
        if lifecycle.shutting_down:
            log(f"{signal_name(signum)} again while stopping: SIGKILL to everything now")
            lifecycle.kill_everything_now()
        else:
            lifecycle.shutdown(f"received {signal_name(signum)}", 128 + signum)
    elif signum in FORWARDED:
        sent = lifecycle.forward(signum)
        names = ", ".join(c.label for c in sent) or "nobody (no phase command running)"
        log(f"{signal_name(signum)} forwarded to {names}")


# ---------------------------------------------------------------- 9. serve


def serve(plan: Plan, host: Host, core: Core, sup: Supervision,
          on_start: Callable[[Lifecycle], None] | None) -> None:
    """Start the lifecycle on a fit machine, then loop until it is over."""
    sup.reporter.start(sup.lifecycle)
    if check_fitness(plan, sup.rt, sup.lifecycle, host.log):
        sup.lifecycle.start()
    if on_start is not None:
        on_start(sup.lifecycle)
    if "status" not in sup.outcome:  # an unfit machine, or a lifecycle over at once: no loop to run
        core.loop.run()


def check_fitness(plan: Plan, rt: Runtime, lifecycle: Lifecycle, log: SupervisorLog) -> bool:
    """Check before the first phase (the download) that the machine can run them all; refuse at once if not."""
    evidence = fitness.gather(plan, rt.memory, rt.gpus or Gpus())
    findings = fitness.assess(plan.phases, plan.cuzk, evidence)
    if not findings:
        log(fitness.describe(evidence))
        return True
    verdict = fitness.refusal(findings)
    rt.record(verdict)
    lifecycle.failure = verdict
    lifecycle.shutdown(f"this machine cannot run the lifecycle ({verdict.reason})", verdict.status)
    return False


# ---------------------------------------------------------------- 10. tear down


def sweep_and_close(core: Core, observers: Observers, inbox: SignalInbox, log: SupervisorLog) -> None:
    """Whatever is still alive of ours is killed and reaped; then every fd and thread we opened is closed."""
    sweep_descendants(log)
    core.reaper.reap()
    core.memory.close()
    observers.status_server.close()
    if observers.health is not None:
        observers.health.close()
    inbox.close()
    core.loop.close()


def report_the_end(plan: Plan, host: Host, sup: Supervision, observers: Observers, lock_fd: int) -> int:
    """The last state on disk, the termination log on failure, the last word to the log and the manager;
    the lock goes last. Returns the exit status (EXIT_FAILURE if the lifecycle never gave one)."""
    status = sup.outcome.get("status", EXIT_FAILURE)
    observers.state_file.save()
    if status != EXIT_OK:
        write_termination_log(plan.supervisor.termination_log, sup.lifecycle, status, host.log)
    host.log(f"exiting with status {status}")
    sup.reporter.stop(status, sup.lifecycle.shutdown_reason or "the supervisor stopped")
    host.console.close()
    os.close(lock_fd)
    return status


def write_termination_log(path: str, lifecycle: Lifecycle, status: int, log: SupervisorLog) -> None:
    """Kubernetes shows this file when the container fails: the verdict line, at most 4 KiB."""
    if not os.path.exists(path):
        return
    failure = lifecycle.failure
    text = failure.line() if failure is not None else f"exit status {status}: {lifecycle.shutdown_reason}"
    if log.redactor:
        text = log.redactor.text(text)
    try:
        with open(path, "w") as f:
            f.write(text.encode()[:TERMINATION_LOG_MAX_BYTES].decode(errors="ignore"))
    except OSError as exc:
        log(f"cannot write {path}: {exc.strerror or exc}")
