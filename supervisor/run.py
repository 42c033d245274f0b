"""The init process, start to end: read like a script (after tini's ``main``).

claim the init role → protect ourselves from the OOM killer → open the logs →
route signals into the loop → start the lifecycle → loop until it is over →
kill whatever is left → exit with the lifecycle's status.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from .config import Plan
from .gpu import Gpus
from .lifecycle import Lifecycle, Runtime
from .logs import Console, LogFile, SupervisorLog
from .loop import EventLoop
from .memory import MemoryEvidence
from .process import sweep_descendants
from .reaping import ExitStatus, Reaper, claim_init_role, protect_from_oom_killer
from .redact import Redactor
from .reporting import Reporter
from .signals import FORWARDED, SHUTDOWN, SignalInbox, signal_name

EXIT_CONFIG_ERROR = 2
# Orphans reaped in one pass beyond this many are summarised, not listed one by one.
ORPHANS_LISTED = 5


class SetupError(Exception):
    """The environment cannot host the run (e.g. log_dir not writable): exit 2, one line."""


def prepare_dirs(plan: Plan) -> None:
    for key, path in (("supervisor.state_dir", plan.supervisor.state_dir),
                      ("supervisor.log_dir", plan.supervisor.log_dir)):
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as exc:
            raise SetupError(f"{key}: cannot use {path}: {exc.strerror or exc}") from None


def run(plan: Plan, *, console_fd: int | None = None,
        on_start: Callable[[Lifecycle], None] | None = None) -> int:
    """Supervise ``plan`` until it completes, fails or is stopped; return the exit status."""
    prepare_dirs(plan)
    role = claim_init_role()
    oom = protect_from_oom_killer()
    console = Console(console_fd, enabled=plan.supervisor.console)
    log_dir = Path(plan.supervisor.log_dir)
    log = SupervisorLog(console, LogFile(log_dir / "supervisor.log", plan.supervisor.log_file_max_bytes))
    redactor = secrets_of(plan)
    log.redactor = redactor
    log(f"prover-supervisor pid {os.getpid()} as {role}; {oom}; config: {plan.source}; "
        f"{len(plan.phases)} phase(s): {', '.join(p.name for p in plan.phases)}")

    loop = EventLoop()
    reaper = Reaper(on_orphan=_orphan_logger(log))
    memory = MemoryEvidence(loop, log, plan.supervisor.cgroups, plan.supervisor.cgroup_root)
    log(memory.describe())
    gpus = Gpus()
    if any(p.stall_s is not None for p in plan.phases):
        gpus.sample()
        log(f"GPU evidence: {gpus.why}")
    rt = Runtime(
        loop=loop, reaper=reaper, console=console, log=log, log_dir=log_dir,
        ring_lines=plan.supervisor.ring_lines, log_file_max_bytes=plan.supervisor.log_file_max_bytes,
        base_env=dict(os.environ),
        # Children start at oom_score_adj 0 again: the OOM killer must pick one of them, not us.
        reset_oom_score=oom.startswith("oom_score_adj -"),
        memory=memory, gpus=gpus, redactor=redactor,
    )
    reporter = Reporter(plan.manager, Path(plan.supervisor.state_dir), rt, redactor)
    if reporter.enabled:
        rt.ship_lines = reporter.ship_lines
        log.taps.append(reporter.ship_own_line)
    outcome: dict[str, int] = {}

    def finished(status: int) -> None:
        outcome["status"] = status
        loop.stop()

    lifecycle = Lifecycle(plan, rt, finished)
    lifecycle.listeners.append(reporter.phase_changed)
    rt.on_verdict.append(reporter.verdict)
    lifecycle.on_shutdown.append(lambda why, status: reporter.push_text(
        "setup", f"prover-supervisor stopping: {why}") if status != 0 else None)
    inbox = SignalInbox(loop, lambda signum: handle_signal(signum, lifecycle, reaper, log))
    try:
        reporter.start(lifecycle)
        lifecycle.start()
        if on_start is not None:
            on_start(lifecycle)
        if "status" not in outcome:
            loop.run()
    finally:
        sweep_descendants(log)
        reaper.reap()
        memory.close()
        inbox.close()
        loop.close()
    status = outcome.get("status", 1)
    log(f"exiting with status {status}")
    reporter.stop(status, lifecycle.shutdown_reason or "the supervisor stopped")
    console.close()
    return status


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
