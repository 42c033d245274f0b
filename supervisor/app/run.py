"""The init process, start to end: ``run`` reads like tini's ``main``, one named step a line.

With cli.py, this is the composition root: the plan arrives loaded with a plugin (the prover's, from
cli.py), and the plugin is handed to what takes it: the lifecycle's phase hooks, the fitness check. The
steps live where their concern is: 1-4, 6 and 7 in startup.py, 5 in engine/trees.py (the sweep, called
from here), 8 in observers.py, 10 in teardown.py; 9 here.

1. ``take_the_lock``: state_dir and log_dir usable, state_dir's lock held (a second supervisor
   exits 75);
2. ``become_init``: claim the init role (PID 1 or subreaper), protect ourselves from the OOM
   killer, open the console and supervisor.log (the first line says which role we took), and
   point a fatal fault's last words at supervisor.log;
3. ``build_core``: the event loop, the reaper, the memory evidence;
4. ``route_signals``: every signal into the loop, with its meaning (signals.py); from here a stop
   signal during a startup step is remembered: steps 5 and 6 are skipped, 7 and 8 still build, and
   ``serve`` shuts down at once, starting nothing;
5. ``kill_survivors_of_dead_supervisors``: end what a SIGKILLed predecessor of this state_dir left
   running (found by its tag), before anything of ours starts;
6. ``empty_leftover_cgroups``: end what such a predecessor left in its phase cgroups (found
   through the memory evidence, so after it);
7. ``build_lifecycle``: GPU evidence, the runtime, the manager reporter, the lifecycle (with the
   plugin's phase hooks, and what the last run learnt, for resume);
8. ``wire_observers``: who observes the lifecycle (resume.json, the instance's clocks, the reporter, the
   plugin, a shutdown's first writes, status.json), the status socket, health and metrics;
9. ``serve``: start the reporter (an instance given up by an earlier start is refused here, changing no
   state), drop what a switch of ``run`` runs again from resume.json, start the clock's tick, check fitness off
   the loop (the core's checks and the plugin's; an unfit machine starts nothing; the loop serves signals and
   status meanwhile), start the lifecycle, loop until it is over;
10. ``tear_down`` (whatever happened): kill and reap what is left, save the state, the
    termination log, "exiting with status N", the manager's exit flush with the loop still
    running (signals handled, the sender's answers taken), then close what was opened; each step
    contains its own failure. Returns the lifecycle's exit status.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from ..config import Plan
from ..engine.logs import SupervisorLog
from ..engine.loop import EventLoop
from ..engine.offloop import NoThread
from ..engine.signals import SignalRouter
from ..engine.tick import start_the_tick
from ..engine.trees import kill_survivors_of_dead_supervisors
from ..evidence.gpuwatch import Gpus
from ..evidence.memwatch import MemoryWatch
from ..exits import EXIT_GIVEN_UP
from ..lifecycle import fitness
from ..lifecycle.gpuhealth import gpu_health_for
from ..lifecycle.lifecycle import Lifecycle
from ..lifecycle.runtime import Runtime
from ..plugin import Plugin
from ..state import givenup
from ..text.show import summary
from .observers import wire_observers
from .startup import (
    Core,
    Host,
    Outlets,
    Supervision,
    become_init,
    build_core,
    build_lifecycle,
    empty_leftover_cgroups,
    route_signals,
    setting_up,
    take_the_lock,
)
from .teardown import tear_down


def run(plan: Plan, plugin: Plugin, *, console_fd: int | None = None, switches: Collection[str] = (),
        fresh: bool = False, on_start: Callable[[Lifecycle], None] | None = None) -> int:
    """Supervise ``plan`` (loaded with ``plugin``) until it completes, fails or is stopped; return the exit status.
    ``switches``: the plugin's run switches given on the command line (Plugin.run_switches)."""
    started_at = time.time()
    lock_fd = take_the_lock(plan)
    host = become_init(plan, console_fd, started_at)
    core = setting_up(host, "make the event loop", lambda: build_core(plan, host))
    signals = setting_up(host, "set up signal handling",
                         lambda: route_signals(core, host.log, plan.supervisor.stop_budget_s))
    if signals.carry_on(core.loop):
        setting_up(host, "look for what a dead supervisor left running",
                   lambda: kill_survivors_of_dead_supervisors(str(host.state_dir), host.log))
    if signals.carry_on(core.loop):
        setting_up(host, "empty a dead supervisor's cgroups", lambda: empty_leftover_cgroups(core.memory, host.log))
    signals.carry_on(core.loop)
    if fresh:  # (before the lifecycle is built: the instance's clocks it loads must be the new row's, not the old's)
        start_over(host, plan.manager.instance)
    sup = setting_up(host, "build the lifecycle", lambda: build_lifecycle(plan, plugin, host, core, switches))
    outlets = wire_observers(plan, plugin, host, core, sup, signals.router)
    try:
        serve(plan, plugin, host, core, sup, signals.router, on_start, outlets)
    finally:
        status = tear_down(plan, host, core, sup, outlets, signals, lock_fd)  # (see teardown.py)
    return status


# ---------------------------------------------------------------- 9. serve


def serve(plan: Plan, plugin: Plugin, host: Host, core: Core, sup: Supervision, router: SignalRouter,
          on_start: Callable[[Lifecycle], None] | None, outlets: Outlets) -> None:
    """Start the lifecycle on a fit machine (asked off the loop), then loop until it is over."""
    router.lifecycle = sup.lifecycle  # a stop signal now stops it (the loop takes them in from here)
    if router.stop_requested is not None:  # asked to stop during the startup steps: start nothing
        sup.lifecycle.shutdown(*router.stop_requested)
        return
    evidence = sup.rt.evidence
    gpus_said = say_gpu_evidence(evidence.gpus, host.log)  # before the manager's lines: the setup tab's order
    given_up = given_up_before(host, plan.manager.instance)
    start_reporting(sup, core.loop, host.log, given_up)
    if given_up is not None:
        refuse_given_up(sup, core.loop, host.log, given_up)
        return
    # Only a start that runs the lifecycle forgets what a switch of ``run`` runs again (--rebench: the bench's pass
    # in resume.json): a refused one changes no state.
    sup.record.run_again([p.name for p in plan.phases if p.resume in sup.rt.rerun.kinds])
    # The tick: a freeze of the supervisor is noticed, the off-loop watchers say what they saw.
    evidence.freeze = start_the_tick(core.loop, host.log, watchers_of(sup, outlets))

    def fitness_known(fit: bool) -> None:
        if fit:
            sup.lifecycle.start()
        if on_start is not None:
            on_start(sup.lifecycle)

    check_fitness(plan, plugin, sup.rt, sup.lifecycle, host.log, fitness_known, gpus_said)
    if not sup.lifecycle.over:  # a lifecycle over at once: no loop to run
        core.loop.run()


def start_over(host: Host, label: str) -> None:
    """``--fresh``: an instance an earlier start gave up is forgotten, its clocks with it (and said)."""
    try:
        said = givenup.start_over(host.state_dir, label)
    except OSError as exc:
        host.log(f"--fresh: cannot start over in {host.state_dir}: {exc.strerror or exc}")
    else:
        host.log(said or "--fresh: nothing was given up in this state_dir; starting as usual")


def given_up_before(host: Host, label: str) -> givenup.GivenUp | None:
    """Was this state_dir's instance (``label``) given up by an earlier start? Another label's give-up is set aside
    (and said): that instance is not this one."""
    given_up = givenup.recall(host.state_dir, label)
    if given_up is None or given_up.of(label):
        return given_up
    try:
        host.log(givenup.set_aside(host.state_dir, given_up, label))
    except OSError as exc:  # (left in place, it would refuse the next start too: this one refuses)
        host.log(f"cannot set aside {givenup.marker(host.state_dir)}, instance {given_up.label!r}'s give-up "
                 f"({exc.strerror or exc}): taken as this one's")
        return given_up
    return givenup.recall(host.state_dir, label)  # (this label's own, set aside by another's start before)


def refuse_given_up(sup: Supervision, loop: EventLoop, log: SupervisorLog, given_up: givenup.GivenUp) -> None:
    """Start no phase: what is still pending in the outbox (the give-up itself, maybe: the Reporter queued it
    again if a SIGKILL had kept it out) goes out in the exit flush, and the lifecycle ends at once with
    EXIT_GIVEN_UP."""
    log(given_up.refusal())
    sup.lifecycle.shutdown(given_up.why_refused(time.time()), EXIT_GIVEN_UP)
    if not sup.lifecycle.over:
        loop.run()
def watchers_of(sup: Supervision, outlets: Outlets) -> list[Callable[[float], list[str]]]:
    """What speaks at each tick: the progress walker, the GPU thread (and the GPU health of the phases that
    use GPUs), the memory of every running phase against its memory_warn, the manager's log and event shipping,
    and the status socket (its file removed: made again)."""
    evidence, lifecycle, reporter = sup.rt.evidence, sup.lifecycle, sup.reporter
    watchers: list[Callable[[float], list[str]]] = [evidence.progress.check]
    if outlets.status_server is not None:
        watchers.append(outlets.status_server.check)
    if evidence.gpus is not None:
        watchers.append(evidence.gpus.check)
        evidence.watches.add(*evidence.gpus.states())
    health = gpu_health_for(lifecycle.phases, lifecycle, evidence.gpus, sup.rt.log)
    if health is not None:
        watchers.append(health.check)
        evidence.gpu_health = health  # (the phases that use GPUs ask it before each attempt)
    if evidence.memory is not None:
        push = (lambda text: reporter.push_text("setup", text)) if reporter.enabled else None
        memory = MemoryWatch(lambda: lifecycle.phases, evidence.memory, push)
        evidence.watches.add(memory.state)
        watchers.append(memory.check)
    # The threads the attempts' watches read from (a walker that can walk nothing, an I/O thread that can
    # read nothing) are watches too, said and shown as the others.
    evidence.watches.add(evidence.progress.state, *((evidence.io.state,) if evidence.io is not None else ()))
    # So are the manager's shippers (a log route that fails while the calls go is seen by nothing else).
    evidence.watches.add(*reporter.shipping_watches())
    # Last: what the watches above found of themselves this tick; a freeze of the supervisor is not their blindness,
    # nor NVML's hang.
    evidence.watches.thawed_at = lambda: evidence.freeze.thawed_at if evidence.freeze is not None else None
    if evidence.gpus is not None:
        evidence.gpus.thawed_at = evidence.watches.thawed_at
    watchers.append(evidence.watches.check)
    return watchers


def start_reporting(sup: Supervision, loop: EventLoop, log: SupervisorLog,
                    given_up: givenup.GivenUp | None = None) -> None:
    """A reporter that cannot start (no fd for its outbox or a module it imports) costs the reporting, not the run.
    ``given_up``: an earlier start gave this instance up (the reporter only delivers what is left)."""
    try:
        sup.reporter.start(given_up)
    except Exception as exc:
        if not isinstance(exc, OSError):
            loop.faults.report("starting the manager reporting", exc)  # a bug: its traceback in supervisor.log
        log(f"manager reporting off: it could not start ({summary(exc)})")
        sup.reporter.enabled = False
        return
    sup.rt.evidence.watches.show(*sup.reporter.watch_states())  # (the row watch: it says its own lines)


def say_gpu_evidence(gpus: Gpus | None, log: SupervisorLog) -> bool:
    """What the GPU thread found, if it has opened NVML yet (never waited for). True: no GPU line is owed before
    the first phase (it was said, or there is no GPU thread to say one); False: fitness says it once NVML answers."""
    if gpus is None:
        return True
    if gpus.opened.is_set():
        log(f"GPU evidence: {gpus.describe()}")
        return True
    log("GPU evidence: NVML is being opened (its answer is said before the first phase)")
    return False


def check_fitness(plan: Plan, plugin: Plugin, rt: Runtime, lifecycle: Lifecycle, log: SupervisorLog,
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
        verdict = rt.verdicts.record(fitness.refusal(findings))
        lifecycle.failure = verdict
        lifecycle.shutdown(f"this machine cannot run the lifecycle ({verdict.reason})", verdict.status)
        then(False)

    def broken(exc: Exception) -> None:  # a bug of the check's own; the phases' own preflights still hold
        if isinstance(exc, NoThread):
            log(f"fitness: not checked: {exc}; the phases' own memory preflights still hold")
        else:
            rt.loop.faults.report("the fitness check", exc)
        decide([], None)

    fitness.check(rt.loop, plan, rt.evidence.memory, gpus, decide, on_error=broken, bound_s=fitness.FITNESS_BOUND_S,
                  checks=plugin.fitness, needs=plugin.disk_needs)
