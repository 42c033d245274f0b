"""A phase's children: one started with its output wired (log file, ring, readers, shipper) and
watched for its exit (the verdict of one that exited is verdict.py's ``exit_verdict``). Each is told of
its phase only what a ``ChildContext`` holds, never the Phase."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..config import ChildSpec
from ..engine.logs import ChildOutput, LogFile, Reader
from ..engine.loop import ErrorHandler, contained
from ..engine.process import Child
from ..engine.reaping import ExitStatus
from ..engine.spawn import SpawnError, child_setup, spawn
from ..state.files import child_log_name
from ..text.show import logged
from .runtime import ChildKit


@dataclass(frozen=True)
class ChildContext:
    """What starting a child is told of its phase (never the Phase itself): its name, its cgroup's cap,
    the environment the supervisor adds (memory budget, hooks), and the handler of a callback's bug."""

    phase: str
    memory_max: int | None
    env: Mapping[str, str]
    fault_handler: Callable[[str], ErrorHandler]  # what raised → what fails the phase (internal_error)

    def guarded(self, what: str, callback: Callable[..., object]) -> Callable[..., None]:
        return contained(callback, self.fault_handler(what))


OnExit = Callable[[Child, int, ExitStatus], None]  # the reaper's (pid, status), its child bound first
# How a phase starts a child (start_child with its ChildKit bound; a test's fake children).
Spawn = Callable[[ChildSpec, ChildContext, Reader | None, OnExit], Child]


def start_child(kit: ChildKit, spec: ChildSpec, ctx: ChildContext, reader: Reader | None, on_exit: OnExit) -> Child:
    """Spawn ``spec`` in its phase's environment and cgroup, its output read by ``reader`` (if any) and
    shipped, ``on_exit`` called when it is reaped. Raises SpawnError (nothing left open)."""
    readers: list[Reader] = []
    if kit.ship_lines is not None:
        ship, faults = kit.ship_lines, kit.loop.faults
        # Shipping is best effort: a shipper that raises costs lines to the manager, never the phase. It goes
        # first: what the reader after it makes the supervisor say is shipped after the lines that caused it.
        readers.append(contained(
            partial(ship, spec.log_source, spec.label),
            lambda exc: faults.report(f"shipping the output of {spec.label}", exc, phase=ctx.phase)))
    if reader is not None:
        readers.append(reader)
    # Any other reader (a parser) that raises fails the phase (what it reads decides it), never the loop.
    output = ChildOutput(spec.label, kit.console, LogFile(log_path(kit.log_dir, spec), kit.log_file_max_bytes,
                                                          kit.log), kit.ring_lines, kit.redactor,
                         readers=readers, on_fault=ctx.fault_handler)
    env = {**kit.base_env, **ctx.env, **spec.env}
    placement = kit.memory.place(ctx.phase, ctx.memory_max) if kit.memory is not None else None
    procs = str(placement.cgroup.procs_file()) if placement and placement.cgroup and placement.scope == "phase" \
        else None
    try:
        with kit.loop.holding(f"the start of {spec.label} (waiting for its exec)") as hold:
            child = spawn(spec, env, output, child_setup(kit.child_oom_score_adj, procs), kit.clock, hold.paused)
    except SpawnError as exc:
        output.file.close()
        if exc.stuck is not None:  # (killed before its exec, it did not go: its sweep and its end say it as that)
            kit.stuck.add(exc.stuck)
            kit.reaper.watch(exc.stuck, partial(_gone_at_last, kit, spec.label), spec.label)
        raise
    child.placement = placement
    kit.reaper.watch(child.pid, ctx.guarded(f"the exit of {spec.label}", partial(on_exit, child)), spec.label,
                     child.job_control)
    child.attach_output(kit.loop, on_eof=lambda c: c.output.file.close() if not c.running else None,
                        on_error=ctx.fault_handler(f"the output of {spec.label}"))
    mask = kit.redactor.text if kit.redactor is not None else None
    kit.log(f"started {spec.label}: pid {child.pid}: {shown_command(spec.command, mask)}")
    return child


def _gone_at_last(kit: ChildKit, label: str, pid: int, status: ExitStatus) -> None:
    """A child SIGKILLed before its exec, stuck in the kernel since, is reaped: no orphan, and no escapee now."""
    kit.stuck.reaped(pid)
    kit.log(f"{label}: pid {pid}, killed before its exec, is gone at last ({status.describe()})")


def log_path(log_dir: Path, spec: ChildSpec) -> Path:
    return log_dir / child_log_name(spec.phase, spec.name)


def shown_command(argv: tuple[str, ...], mask: Callable[[str], str] | None = None) -> str:
    """The argv as one line, each argument as verdict lines show a value (text/show.py ``logged``): a newline
    inside an argument must not split a log line. Each is masked first (``mask``): the log masks the line as
    written, where a secret with a quote or a backslash is escaped, no longer itself, and was shown."""
    return " ".join(logged(mask(arg) if mask is not None else arg) for arg in argv)
