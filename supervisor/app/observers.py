"""Step 8 of run.py: what watches the lifecycle from outside, named in one record and wired to it.

Who reacts to what the lifecycle decides is the lifecycle's ``Observers`` (lifecycle/lifecycle.py), filled
here once, in the order they are told: resume.json, the instance's clocks, the reporter (on a shutdown
for a failure the manager is told why before it is told to give the instance up), the plugin, the first
writes of a shutdown (teardown.py's FirstWrites: status.json and the termination log, before any grace
runs), status.json (once per batch of changes). Where every snapshot is read from is named once, a
``Snapshotter`` (status/snapshot.py). Beside them: the status socket answers ``prover-supervisor status``;
health and metrics serve 127.0.0.1:http_port.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..config import Plan
from ..engine.logs import SupervisorLog
from ..engine.loop import EventLoop
from ..engine.signals import SignalRouter
from ..evidence.gpuwatch import Gpus
from ..evidence.memwatch import memory_use
from ..exits import EXIT_KILLED
from ..lifecycle.lifecycle import Lifecycle
from ..plugin import Plugin
from ..state import files as state_files
from ..status import file as status_file
from ..status import snapshot as snapshot_mod
from ..status.file import StateFile
from ..status.model import Snapshot
from ..status.snapshot import Snapshotter
from ..status.socket import StatusServer
from ..text.show import summary
from ..wiring import Wiring
from .startup import Core, Host, Outlets, Supervision
from .teardown import FirstWrites


def wire_observers(plan: Plan, plugin: Plugin, host: Host, core: Core, sup: Supervision,
                   router: SignalRouter) -> Outlets:
    lifecycle, rt, reporter = sup.lifecycle, sup.rt, sup.reporter
    observers = lifecycle.observers
    # Where every snapshot is read from (the status socket, status.json, /metrics): named once.
    take_snapshot = Snapshotter(role=host.role, started_at=host.started_at, config=plan.source, lifecycle=lifecycle,
                                gpus=rt.evidence.gpus, memory=rt.evidence.memory, verdicts=rt.verdicts,
                                resume=sup.record, watches=rt.evidence.watches,
                                manager=reporter if reporter.enabled else None, log_dir=plan.supervisor.log_dir,
                                flush=router)
    # The plugin attaches before the reporting starts; what it hears is told after the reporter (its give-up
    # after the reason lines: the manager must have the why before it destroys the instance).
    attach_plugin(plan, plugin, host, core, sup, take_snapshot.add_status)
    # The manager's word on the instance is final: a killed row stops the lifecycle in order (the view tells
    # the plugin first: its give-up must not answer a killed row); learnt in the exit flush of a run that
    # completed, it is the run's exit status.
    reporter.view.stop_lifecycle = lambda row: lifecycle.stop_from_outside(row.kill_line(), EXIT_KILLED)

    # status.json at every batch of changes (coalesced past a burst, see StateFile); a full disk is said once.
    state_file = StateFile(host.state_dir, core.loop, host.log, take_snapshot.persisted)
    # Every observer by name (the order they are told in is Observers'; the plugin's events were filled by
    # its attach above).
    observers.resume = sup.record
    observers.clocks = rt.evidence.first_seen
    if reporter.enabled:  # no manager: the reporter would hear everything and do nothing
        observers.reporter = reporter
    observers.first_writes = FirstWrites(plan, host, sup, state_file)
    observers.status = state_file
    status_server = start_status_socket(core.loop, host.state_dir, take_snapshot, host.log)
    take_snapshot.listening = status_server is not None
    health = start_health(plan, core.loop, lifecycle, take_snapshot, host.log, rt.evidence.gpus)
    return Outlets(state_file, status_server, health, point_here(host.state_dir, host.log))


def point_here(state_dir: Path, log: SupervisorLog) -> Path | None:
    """The well-known pointer names this supervisor: a bare ``status`` finds it whatever its state_dir."""
    try:
        return status_file.point_here(state_dir, state_files.path(state_dir, state_files.STATUS_SOCKET))
    except OSError as exc:
        log(f"status: cannot write the pointer {status_file.pointer_path()} ({exc.strerror or exc}); a bare "
            f"`prover-supervisor status` needs --state-dir {state_dir} to find this supervisor")
        return None


def attach_plugin(plan: Plan, plugin: Plugin, host: Host, core: Core, sup: Supervision,
                  add_status: Callable[[str, Callable[[], Mapping[str, Any]]], None]) -> None:
    """What the plugin may hear and drive (wiring.py), handed to it before the reporting starts."""
    if plugin.attach is None:
        return
    evidence = sup.rt.evidence
    def machine(phase: str) -> dict[str, Any]:
        use = memory_use(evidence.memory, phase) if evidence.memory is not None else None
        gpus = snapshot_mod.gpu_status(evidence.gpus) if evidence.gpus is not None else None
        # A reading that is no longer current is no utilisation now (a plugin's summary says it is unknown).
        current = gpus.samples if gpus is not None and not gpus.samples_stale else ()
        return {"memory_used": use.used if use else None, "memory_limit": use.limit if use else None,
                "gpu_utilization": [s.utilization for s in current]}

    wiring = Wiring(plan=plan, events=sup.lifecycle.observers.plugin,
                    production=sup.lifecycle,
                    manager=sup.reporter.link() if sup.reporter.enabled else None,
                    export_env=sup.rt.spawning.export_env, call_later=core.loop.call_later, log=host.log,
                    add_status=add_status, machine=machine,
                    watch_state=evidence.watches.new, thawed_at=lambda: evidence.watches.thawed_at())
    plugin.attach(wiring)


def start_status_socket(loop: EventLoop, state_dir: Path, take_snapshot: Callable[..., Snapshot],
                        log: SupervisorLog) -> StatusServer | None:
    try:
        return StatusServer(loop, state_dir, take_snapshot, log)
    except OSError as exc:  # (no fd left, a path too long for a unix socket)
        log(f"status: cannot listen on {state_files.path(state_dir, state_files.STATUS_SOCKET)} "
            f"({exc.strerror or exc}); "
            "`prover-supervisor status` shows status.json only")
        return None


def start_health(plan: Plan, loop: EventLoop, lifecycle: Lifecycle, take_snapshot: Callable[..., Snapshot],
                 log: SupervisorLog, gpus: Gpus | None = None) -> Any:
    """Health and metrics on 127.0.0.1:http_port, fed by a heartbeat of the loop. The GPUs are sampled while it
    serves (every GPU_SAMPLE_S, by the GPU thread), so /metrics has their latest figures: the persisted snapshot
    the beat reads leaves samples out (a scrape must not wait on NVML)."""
    port = plan.supervisor.http_port
    if not port:
        return None
    from ..status.health import HEARTBEAT_S, HealthServer, HealthState, metrics_text  # only when asked for

    state = HealthState()
    try:
        server = HealthServer(port, state, log)
    except OSError as exc:
        log(f"health: cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}); /healthz and /metrics are off")
        return None
    except RuntimeError as exc:  # no thread to serve it
        log(f"health: cannot serve 127.0.0.1:{port} ({summary(exc)}); /healthz and /metrics are off")
        return None
    production = lifecycle.production_phases()
    if gpus is not None:
        gpus.want()  # (for the run: health serves until the exit)

    def beat() -> None:
        loop.call_later(HEARTBEAT_S, beat)  # first: a beat that raises (contained by the loop) is not the last
        # Not ready once the shutdown began: production is being stopped, though it shows up until it ends.
        unready = "shutting down" if lifecycle.shutting_down else \
            None if production and all(p.up for p in production) else "production is not up"
        state.publish(unready, metrics_text(take_snapshot(usage=False),
                                            gpus=snapshot_mod.gpu_status(gpus) if gpus is not None else None))

    beat()
    log(f"health: http://127.0.0.1:{server.port}/healthz, /readyz, /metrics")
    return server
