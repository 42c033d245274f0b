"""The init process, start to end: read like a script (after tini's ``main``).

claim the init role → protect ourselves from the OOM killer → open the logs →
route signals into the loop → start the lifecycle → loop until it is over →
kill whatever is left → exit with the lifecycle's status.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import fitness
from . import status as status_mod
from .config import Plan
from .gpu import Gpus
from .lifecycle import Lifecycle, Runtime
from .logs import Console, LogFile, SupervisorLog
from .loop import EventLoop
from .memory import MemoryEvidence
from .process import STATE_DIR_ENV, kill_cgroup, kill_survivors_of_dead_supervisors, sweep_descendants
from .reaping import ExitStatus, Reaper, claim_init_role, protect_from_oom_killer
from .redact import Redactor
from .reporting import EarlyLines, Reporter
from .signals import FORWARDED, SHUTDOWN, SignalInbox, signal_name

# In state_dir: the phase cgroups made, so that the next start can empty those a SIGKILL left behind.
CGROUP_LEDGER = "cgroups"
# Orphans reaped in one pass beyond this many are summarised, not listed one by one.
ORPHANS_LISTED = 5


class SetupError(Exception):
    """The environment cannot host the run (e.g. log_dir not writable): exit 2, one line."""


class AlreadyRunning(Exception):
    """Another supervisor holds the lock in state_dir: exit 75, one line, nothing started."""


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


def prepare_dirs(plan: Plan) -> None:
    for key, path in (("supervisor.state_dir", plan.supervisor.state_dir),
                      ("supervisor.log_dir", plan.supervisor.log_dir)):
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            raise SetupError(f"{key}: cannot use {path}: {exc.strerror or exc}") from None


def empty_leftover_cgroups(memory: MemoryEvidence, log: Callable[[str], None]) -> None:
    """What a SIGKILLed predecessor's escapees left (they cleared their environment: no tag finds them,
    only the phase cgroups they were born in): kill them, then remove the emptied cgroups."""
    for owner, stale in memory.leftover_cgroups():
        if kill_cgroup(stale.procs_file(), log, f"left in {stale.path} by supervisor pid {owner}, which died"):
            stale.remove()


def run(plan: Plan, *, console_fd: int | None = None, rebench: bool = False,
        on_start: Callable[[Lifecycle], None] | None = None) -> int:
    """Supervise ``plan`` until it completes, fails or is stopped; return the exit status."""
    started_at = time.time()
    prepare_dirs(plan)
    lock_fd = take_lock(plan.supervisor.state_dir)
    role = claim_init_role()
    oom, child_oom_score_adj = protect_from_oom_killer()
    console = Console(console_fd, enabled=plan.supervisor.console)
    log_dir = Path(plan.supervisor.log_dir)
    state_dir = Path(plan.supervisor.state_dir)
    log = SupervisorLog(console, LogFile(log_dir / "supervisor.log", plan.supervisor.log_file_max_bytes))
    redactor = secrets_of(plan)
    log.redactor = redactor
    early_lines = EarlyLines()  # from the first line on: the manager gets them once the uuid is known
    log.taps.append(early_lines.tap)
    log(f"prover-supervisor pid {os.getpid()} as {role}; {oom}; config: {plan.source}; "
        f"{len(plan.phases)} phase(s): {', '.join(p.name for p in plan.phases)}")

    kill_survivors_of_dead_supervisors(str(state_dir), log)
    loop = EventLoop()
    loop.faults.log = log  # what a callback raised, with its traceback, goes to supervisor.log
    reaper = Reaper(on_orphan=_orphan_logger(log))
    memory = MemoryEvidence(loop, log, plan.supervisor.cgroups, plan.supervisor.cgroup_root,
                            ledger=state_dir / CGROUP_LEDGER)
    log(memory.describe())
    empty_leftover_cgroups(memory, log)
    gpus = Gpus()
    if any(p.stall_s is not None or p.prepare == "cuzk-config" for p in plan.phases):
        gpus.sample()
        log(f"GPU evidence: {gpus.why}")
    rt = Runtime(
        loop=loop, reaper=reaper, console=console, log=log, log_dir=log_dir,
        ring_lines=plan.supervisor.ring_lines, log_file_max_bytes=plan.supervisor.log_file_max_bytes,
        base_env={**os.environ, STATE_DIR_ENV: str(state_dir)},
        # The OOM killer must pick one of the children, never us.
        child_oom_score_adj=child_oom_score_adj,
        memory=memory, gpus=gpus, redactor=redactor, cuzk=plan.cuzk, state_dir=state_dir, rebench=rebench,
    )
    reporter = Reporter(plan.manager, state_dir, rt, redactor, early_lines)
    if reporter.enabled:
        rt.ship_lines = reporter.ship_lines
    outcome: dict[str, int] = {}

    def finished(status: int) -> None:
        outcome["status"] = status
        loop.stop()

    lifecycle = Lifecycle(plan, rt, finished)
    restore_facts(lifecycle, state_dir, log)
    lifecycle.listeners.append(reporter.phase_changed)
    rt.on_verdict.append(reporter.verdict)

    def take_snapshot(usage: bool = True) -> dict[str, Any]:
        return status_mod.snapshot(role=role, started_at=started_at, config=plan.source, lifecycle=lifecycle, rt=rt,
                                   reporter=reporter, usage=usage)

    # status.json at every change (coalesced past a burst, see StateFile); a full disk is said once.
    state_file = status_mod.StateFile(state_dir, loop, log, lambda: take_snapshot(usage=False))
    lifecycle.listeners.append(state_file.changed)
    rt.on_verdict.append(state_file.changed)
    status_server = status_mod.StatusServer(loop, state_dir, take_snapshot, log)
    health = start_health(plan, loop, lifecycle, take_snapshot, log)
    lifecycle.on_shutdown.append(lambda why, status: reporter.push_text(
        "setup", f"prover-supervisor stopping: {why}") if status != 0 else None)
    # After the reason lines above: the manager must have the why before it destroys the instance.
    lifecycle.on_shutdown.append(reporter.give_up)
    inbox = SignalInbox(loop, lambda signum: handle_signal(signum, lifecycle, reaper, log))
    try:
        reporter.start(lifecycle)
        if fit_for_the_lifecycle(plan, rt, lifecycle, log):
            lifecycle.start()
        if on_start is not None:
            on_start(lifecycle)
        if "status" not in outcome:
            loop.run()
    finally:
        sweep_descendants(log)
        reaper.reap()
        memory.close()
        status_server.close()
        if health is not None:
            health.close()
        inbox.close()
        loop.close()
    status = outcome.get("status", 1)
    state_file.save()
    if status != 0:
        write_termination_log(plan.supervisor.termination_log, lifecycle, status, log)
    log(f"exiting with status {status}")
    reporter.stop(status, lifecycle.shutdown_reason or "the supervisor stopped")
    console.close()
    os.close(lock_fd)
    return status


def fit_for_the_lifecycle(plan: Plan, rt: Runtime, lifecycle: Lifecycle, log: SupervisorLog) -> bool:
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


def restore_facts(lifecycle: Lifecycle, state_dir: Path, log: SupervisorLog) -> None:
    """Hand each phase what the last run learnt (resume); a corrupt state file means a clean start."""
    previous, why = status_mod.load_persisted(state_dir)
    if previous is None:
        if why and not why.startswith("no "):
            log(f"state: {why}; starting clean")
        return
    facts = status_mod.resume_facts(previous)
    if facts is None:
        log(f"state: {state_dir / status_mod.STATE_NAME} does not have the expected shape; starting clean")
        return
    for phase in lifecycle.phases:
        phase.previous = facts.get(phase.name, {})


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
    production = [p for p in lifecycle.phases if p.spec.report == "running"] or \
        [p for p in lifecycle.phases if p.spec.kind == "service"][-1:]

    def beat() -> None:
        loop.call_later(HEARTBEAT_S, beat)  # first: a beat that raises (contained by the loop) is not the last
        ready = bool(production) and all(p.up for p in production)
        state.publish(ready, metrics_text(take_snapshot(usage=False)))

    beat()
    log(f"health: http://127.0.0.1:{server.port}/healthz, /readyz, /metrics")
    return server


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
            f.write(text.encode()[:4096].decode(errors="ignore"))
    except OSError as exc:
        log(f"cannot write {path}: {exc.strerror or exc}")


def secrets_of(plan: Plan) -> Redactor:
    """Every value that must never be shown: the manager token, and env values with secret-looking names."""
    envs = [os.environ, plan.supervisor.env]
    for phase in plan.phases:
        envs += [phase.command.env, *(d.env for d in phase.daemons)]
    extra = [plan.manager.token_env] if plan.manager.token_env else []
    return Redactor.from_environments(envs, extra)


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


def _orphan_logger(log: SupervisorLog) -> Callable[[int, ExitStatus], None]:
    """Orphans re-parented to us are reaped and noted; a storm of them is summarised."""
    state = {"count": 0}

    def on_orphan(pid: int, status: ExitStatus) -> None:
        state["count"] += 1
        n = state["count"]
        if n <= ORPHANS_LISTED or n % 1000 == 0:
            log(f"reaped orphan pid {pid} ({status.describe()}); {n} orphan(s) reaped so far")

    return on_orphan
