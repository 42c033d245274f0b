"""A phase's children: one started with its output wired (log file, ring, readers, shipper) and
watched for its exit, and the verdict of one that exited."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import verdict as v
from .config import ChildSpec
from .logs import ChildOutput, LogFile
from .loop import contained, is_contained, name_of
from .process import Child, SpawnError, child_setup, spawn
from .reaping import ExitStatus
from .verdict import Verdict

if TYPE_CHECKING:
    from .phase import Phase


def start_child(phase: Phase, spec: ChildSpec, reader: Callable[[list[bytes]], None] | None,
                on_exit: Callable[[Child, ExitStatus], None]) -> Child:
    """Spawn ``spec`` in ``phase``'s environment and cgroup, its output read by ``reader`` (if any) and
    shipped, ``on_exit`` called when it is reaped. Raises SpawnError (nothing left open)."""
    rt = phase.rt
    output = ChildOutput(spec.label, rt.console, LogFile(log_path(rt.log_dir, spec), rt.log_file_max_bytes, rt.log),
                         rt.ring_lines, rt.redactor)
    env = {**rt.base_env, **phase.extra_env, **spec.env}
    placement = rt.memory.place(phase.name, phase.spec.memory_max) if rt.memory is not None else None
    procs = str(placement.cgroup.procs_file()) if placement and placement.cgroup and placement.scope == "phase" \
        else None
    try:
        child = spawn(spec, env, output, child_setup(rt.child_oom_score_adj, procs))
    except SpawnError:
        output.file.close()
        raise
    child.placement = placement
    if reader is not None:
        output.taps.append(reader)
    if rt.ship_lines is not None:
        ship = rt.ship_lines
        # Shipping is best effort: a shipper that raises costs lines to the manager, never the phase.
        output.taps.append(contained(
            lambda lines, source=spec.log_source, label=spec.label: ship(source, label, lines),
            lambda exc: rt.loop.faults.report(f"shipping the output of {spec.label}", exc, phase=phase.name)))
    # Whoever added a reader of the output: a parser that raises fails the phase (what it reads
    # decides it), never the loop. (The shipper's tap above is contained to cost only lines.)
    output.taps[:] = [tap if is_contained(tap) else phase.guarded(f"the output tap {name_of(tap)}", tap)
                      for tap in output.taps]
    rt.reaper.watch(child.pid, phase.guarded(f"the exit of {spec.label}",
                                             lambda pid, status: on_exit(child, status)))
    child.attach_output(rt.loop, on_eof=lambda c: c.output.file.close() if not c.running else None,
                        on_error=phase.fault_handler(f"the output of {spec.label}"))
    rt.log(f"started {spec.label}: pid {child.pid}: {shown_command(spec.command)}")
    return child


def exit_verdict(phase: Phase, child: Child, status: ExitStatus) -> Verdict:
    """``child`` of ``phase`` was reaped: its last output read, its log closed, how it ended judged."""
    rt = phase.rt
    child.exited(status)
    child.drain_output()
    if not child.output_open:
        child.output.file.close()
    memory = rt.memory.report(child.placement) if rt.memory and child.placement else None
    return v.from_exit(
        phase.name, child.spec.name, child.pid, status, stop_reason=child.stop_reason,
        daemon=child.spec is not phase.spec.command, attempt=phase.attempt, started_at=child.started_at,
        last_lines=child.output.last_lines(), memory=memory, stop_detail=child.stop_detail,
        victims=tuple(f"{x.child} (pid {x.pid})" for x in rt.verdicts if x.phase == phase.name
                      and x.reason == v.OOM_KILLED and x.pid != child.pid and x.ended_at >= child.started_at),
    )


def log_path(log_dir: Path, spec: ChildSpec) -> Path:
    name = spec.phase if spec.name == spec.phase else f"{spec.phase}.{spec.name}"
    return log_dir / f"{name}.log"


def shown_command(argv: tuple[str, ...]) -> str:
    """The argv as one shell-quoted line: a newline inside an argument must not split a log line."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in shlex.join(argv))
