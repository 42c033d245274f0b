"""The lifecycle: an ordered list of phases, each an explicit state machine.

A phase runs in attempts. An attempt starts the phase's daemons one by one
(each waited for until ready), then its command. The attempt ends when the
command exits, a daemon dies, a deadline passes or the supervisor shuts down;
its children are then stopped in reverse start order and the phase decides,
from the verdict that ended the attempt, what comes next: done, another try
after a backoff, or failed for good.

Every state change goes through ``Phase.transition``; every timer and thread
callback checks that it still belongs to the current attempt and state, and
does nothing if not (a late callback must never act on a newer attempt).
"""

from __future__ import annotations

import enum
import random
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import verdict as v
from .backoff import backoff_delay, burst_exceeded, within_window
from .cgroups import mem_total
from .config import ChildSpec, PhaseSpec, Plan
from .exits import EXIT_INTERNAL_ERROR
from .gpu import Gpus, activity_changed
from .logs import ChildOutput, Console, LogFile
from .loop import ErrorHandler, EventLoop, Timer, contained, is_contained, name_of, summary
from .memory import MemoryEvidence
from .process import Child, SpawnError, child_setup, kill_pids, spawn
from .prover import cuzkconf
from .prover.bench import BenchParser, BenchResult, SingleProofParser
from .prover.cuzkconf import CuzkSettings
from .readiness import ReadinessWait
from .reaping import ExitStatus, Reaper
from .redact import Redactor
from .stall import StallWatch, check_interval, tree_size
from .units import fmt_bytes
from .verdict import Verdict

Log = Callable[[str], None]


class PhaseState(enum.StrEnum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # daemons being started and waited for
    RUNNING = "running"  # the command runs
    STOPPING = "stopping"  # the attempt is over; its children are being stopped
    BACKOFF = "backoff"  # waiting before the next attempt
    DONE = "done"  # completed (oneshot exit 0, or a service that ended cleanly)
    FAILED = "failed"  # failed for good
    STOPPED = "stopped"  # ended by a supervisor shutdown


_ALLOWED: dict[PhaseState, set[PhaseState]] = {
    PhaseState.PENDING: {PhaseState.STARTING, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.STARTING: {PhaseState.RUNNING, PhaseState.STOPPING},
    PhaseState.RUNNING: {PhaseState.STOPPING},
    PhaseState.STOPPING: {PhaseState.BACKOFF, PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.BACKOFF: {PhaseState.STARTING, PhaseState.FAILED, PhaseState.STOPPED},
    PhaseState.DONE: set(),
    PhaseState.FAILED: set(),
    PhaseState.STOPPED: set(),
}
FINAL_STATES = frozenset({PhaseState.DONE, PhaseState.FAILED, PhaseState.STOPPED})
# Verdicts kept per phase in Runtime.verdicts (the status view, status.json and lookups by pid).
VERDICTS_KEPT_PER_PHASE = 20


@dataclass
class Runtime:
    """What phases share: the loop, the reaper, the logs, and the start order of every child."""

    loop: EventLoop
    reaper: Reaper
    console: Console
    log: Log
    log_dir: Path
    ring_lines: int
    log_file_max_bytes: int
    base_env: dict[str, str]
    child_oom_score_adj: int | None = None  # what children set their oom_score_adj to (run.py decides)
    memory: MemoryEvidence | None = None
    gpus: Gpus | None = None
    redactor: Redactor | None = None
    cuzk: CuzkSettings | None = None
    state_dir: Path = Path(".")
    rebench: bool = False  # run machine-resumable phases (the bench) even if they passed here recently
    ship_lines: Callable[[str, list[bytes]], None] | None = None  # children's output to the manager
    rng: random.Random = field(default_factory=random.Random)
    started: list[Child] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    on_verdict: list[Callable[[Verdict], None]] = field(default_factory=list)

    def available_memory(self) -> int | None:
        """The machine's memory for children: the tightest cgroup limit, else MemTotal."""
        return self.memory.available_memory() if self.memory is not None else mem_total()

    def record(self, verdict: Verdict) -> None:
        self.verdicts.append(verdict)
        # The latest few per phase: a service restarting in a loop must not grow memory (and
        # status.json) without end; a lookup by pid only ever wants a verdict just recorded.
        same_phase = [i for i, x in enumerate(self.verdicts) if x.phase == verdict.phase]
        if len(same_phase) > VERDICTS_KEPT_PER_PHASE:
            del self.verdicts[same_phase[0]]
        if verdict.success or verdict.reason == v.STOPPED:
            self.log(f"ended: {verdict.line()}")
        else:
            self.log(f"FAILED: {verdict.line()}")
            for line in verdict.last_lines[-5:]:
                self.log(f"  | {line}")
        tell_listeners(self, "verdict listener", self.on_verdict, verdict, phase=verdict.phase)


class Phase:
    def __init__(self, spec: PhaseSpec, rt: Runtime, on_change: Callable[[Phase], None]) -> None:
        self.spec = spec
        self.rt = rt
        self._on_change = on_change
        self.state = PhaseState.PENDING
        self.since = time.time()
        self.why = "not started"
        self.attempt = 0
        self.children: list[Child] = []  # this attempt's, in start order
        self.kept: list[Child] = []  # daemons with lifetime = "lifecycle", handed on at success
        self.outcome: Verdict | None = None  # what ended the current attempt
        self.up = False  # a service whose command runs (and answered its ready check)
        self.was_up = False
        self._consecutive_failures = 0
        self._restart_times: list[float] = []
        self._attempt_mono = 0.0
        self._deadline: Timer | None = None
        self._backoff: Timer | None = None
        self._ready: ReadinessWait | None = None
        self._aborting = False
        self.extra_env: dict[str, str] = {}  # what the supervisor tells the phase (memory budget)
        self.facts: dict[str, Any] = {}  # what a later start needs to resume (persisted in status.json)
        self.previous: dict[str, Any] = {}  # this phase's facts from the last run, if any
        self.hold: str | None = None  # a DONE phase the lifecycle may not go past yet, and why
        self.started = False  # the lifecycle reached it (a phase stopped before that never started)
        self.bench_result: BenchResult | None = None  # parse = "cuzk-bench": what the output said
        self._bench: BenchParser | SingleProofParser | None = None
        self._broken: Verdict | None = None  # the supervisor's own bug failed this phase (internal_error)
        self._stop_over = False  # this attempt's children are all stopped (see fail_internally)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def command_child(self) -> Child | None:
        return next((c for c in self.children if c.spec is self.spec.command), None)

    # ------------------------------------------------------------ transitions

    def transition(self, new: PhaseState, why: str) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"phase {self.name}: no transition {self.state} → {new}")
        old, self.state, self.since, self.why = self.state, new, time.time(), why
        if new is not PhaseState.RUNNING or self.spec.kind != "service":
            self.up = False
        self.rt.log(f"phase {self.name}: {old} → {new} ({why})")
        self._on_change(self)

    def start(self) -> None:
        self.started = True
        resumed = self._resumable()
        if resumed is not None and self.previous.get("bench"):
            try:
                self.bench_result = BenchResult(**self.previous["bench"])
            except TypeError:
                self.rt.log(f"phase {self.name}: the saved bench result is unreadable: running it again")
                resumed = None
        if resumed is not None:
            self.facts = dict(self.previous)
            self.transition(PhaseState.DONE, f"resumed: {resumed}")
            return
        if not self._memory_preflight():
            return
        if self.spec.timeout_s is not None:
            self._deadline = self.rt.loop.call_later(self.spec.timeout_s, self._deadline_passed,
                                                     on_error=self.fault_handler("the deadline timer"))
        self._start_attempt()

    def _resumable(self) -> str | None:
        """Why this phase need not run again (done before, evidence still valid), or None."""
        prev, spec = self.previous, self.spec
        if spec.resume == "no" or not prev.get("done_at"):
            return None
        if spec.resume == "outputs":
            before = prev.get("outputs")
            now = output_files(spec.progress_path) if spec.progress_path else None
            if before and now is not None and all(now.get(name) == size for name, size in before.items()):
                return f"its {len(before)} output file(s) in {spec.progress_path} are all still there"
            return None
        if self.rt.rebench:
            return None
        age = time.time() - float(prev["done_at"])
        if age > spec.resume_max_age_s:
            self.rt.log(f"phase {self.name}: done {age:.0f}s ago, older than resume_max_age_s: running it again")
            return None
        if prev.get("machine") != machine_fingerprint(self.rt):
            self.rt.log(f"phase {self.name}: done before on a different machine (GPUs or memory): running it again")
            return None
        return f"done {age:.0f}s ago on this same machine (use --rebench to run it anyway)"

    def _record_facts(self) -> None:
        self.facts = {"done_at": time.time(), "machine": machine_fingerprint(self.rt)}
        if self.spec.progress_path:
            self.facts["outputs"] = output_files(self.spec.progress_path)
        if self.bench_result is not None:
            self.facts["bench"] = vars(self.bench_result)

    def _available_memory(self) -> int | None:
        """What this phase can have: the machine's (cgroup limit or MemTotal), capped by its memory_max."""
        available = self.rt.available_memory()
        if self.spec.memory_max is None:
            return available
        return self.spec.memory_max if available is None else min(available, self.spec.memory_max)

    def _memory_preflight(self) -> bool:
        """Refuse at once a phase that cannot fit in memory, rather than be OOM-killed 10 minutes in."""
        available = self._available_memory()
        if available is not None:
            self.extra_env["SUPERVISOR_MEMORY_AVAILABLE_BYTES"] = str(available)
        need = self.spec.min_memory
        if need is None:
            return True
        if available is None:
            self.rt.log(f"phase {self.name}: memory preflight skipped: neither a cgroup limit nor MemTotal readable")
            return True
        if available < need:
            detail = (f"needs min_memory={fmt_bytes(need)} ({need} bytes) but only {fmt_bytes(available)} "
                      f"({available} bytes) is available (cgroup limit, MemTotal or the phase's memory_max)")
            self.outcome = v.without_exit(self.name, self.name, v.INSUFFICIENT_MEMORY, 1, detail, attempt=0)
            self.rt.record(self.outcome)
            self.transition(PhaseState.FAILED, detail)
            return False
        self.rt.log(f"phase {self.name}: memory preflight ok: {fmt_bytes(available)} available, "
                    f"min_memory {fmt_bytes(need)}")
        return True

    def _prepare(self) -> bool:
        """Per-attempt preparation (cuzk.toml for this machine); False when the phase cannot run."""
        if self.spec.prepare != "cuzk-config" or self.rt.cuzk is None:
            return True
        settings = self.rt.cuzk
        available = self._available_memory()  # the same figure the preflight holds the phase to
        gpus = self.rt.gpus.sample() if self.rt.gpus is not None else []
        try:
            generated = cuzkconf.generate(settings, available or 0, gpus)
            cuzkconf.write(generated, settings.config_path, self.rt.state_dir / "cuzk.generated.toml")
        except (cuzkconf.DoesNotFit, ValueError) as exc:
            self.outcome = v.without_exit(self.name, self.name, v.INSUFFICIENT_MEMORY, 1, str(exc),
                                          attempt=self.attempt)
            self.rt.record(self.outcome)
            self._finish(PhaseState.FAILED, str(exc))
            return False
        except OSError as exc:
            detail = f"cannot write {settings.config_path}: {exc.strerror or exc}"
            self.outcome = v.without_exit(self.name, self.name, v.SPAWN_FAILED, 1, detail, attempt=self.attempt)
            self.rt.record(self.outcome)
            self._finish(PhaseState.FAILED, detail)
            return False
        self.extra_env.update({"CUZK_CONFIG": settings.config_path, "CUZK_ADDR": settings.listen,
                               "CUZK_STATUS_LISTEN": settings.status_listen,
                               "CUZK_BENCH_CONCURRENCY": str(generated.bench_concurrency)})
        self.rt.log(f"phase {self.name}: wrote {settings.config_path}: {generated.summary()}")
        for line in filter(None, generated.text.splitlines()):
            self.rt.log(f"  cuzk.toml | {line}")
        return True

    def _start_attempt(self) -> None:
        if not self._prepare():
            return
        self.attempt += 1
        self.children = []
        self.outcome = None
        self._attempt_mono = time.monotonic()
        if self.rt.memory is not None:
            self.rt.memory.reset_peak(self.name)
        self.transition(PhaseState.STARTING, f"attempt {self.attempt}")
        if self.spec.stall_s is not None:
            self._watch_for_stall(self.attempt)
        self._start_daemon(0, self.attempt)

    def _start_daemon(self, index: int, attempt: int) -> None:
        if attempt != self.attempt or self.state is not PhaseState.STARTING:
            return  # a late readiness answer for an attempt that is already over
        if index == len(self.spec.daemons):
            self._start_command()
            return
        spec = self.spec.daemons[index]
        child = self._spawn(spec)
        if child is None:
            return
        if spec.ready is None:
            self._start_daemon(index + 1, attempt)
            return
        self.rt.log(f"waiting for {spec.label} to be ready: {spec.ready.describe()} "
                    f"(at most {spec.ready_timeout_s:g}s)")
        self._ready = ReadinessWait(
            self.rt.loop, spec.ready, spec.ready_timeout_s,
            on_ready=self._guarded(f"the readiness wait of {spec.label}",
                                   lambda: self._daemon_ready(child, index, attempt)),
            on_timeout=self._guarded(f"the readiness wait of {spec.label}",
                                     lambda why: self._not_ready(child, attempt, why)),
        )

    def _daemon_ready(self, child: Child, index: int, attempt: int) -> None:
        if attempt == self.attempt and self.state is PhaseState.STARTING:
            self.rt.log(f"{child.label} is ready ({child.spec.ready.describe() if child.spec.ready else ''})")
            self._start_daemon(index + 1, attempt)

    def _not_ready(self, child: Child, attempt: int, why: str) -> None:
        if attempt != self.attempt or self.state not in (PhaseState.STARTING, PhaseState.RUNNING):
            return
        detail = f"{child.label} not ready after {child.spec.ready_timeout_s:g}s: {why}"
        child.stop_reason = v.TIMEOUT
        self._end_attempt(v.without_exit(
            self.name, child.spec.name, v.TIMEOUT, 1, detail, attempt=attempt,
            started_at=child.started_at, last_lines=child.output.last_lines(),
        ))

    def _start_command(self) -> None:
        child = self._spawn(self.spec.command)
        if child is None:
            return
        self.transition(PhaseState.RUNNING, f"{child.label} pid {child.pid}")
        if self.spec.kind != "service":
            return
        ready = self.spec.command.ready
        if ready is None:
            self._service_up()
            return
        attempt = self.attempt
        self._ready = ReadinessWait(
            self.rt.loop, ready, self.spec.command.ready_timeout_s,
            on_ready=self._guarded(f"the readiness wait of {child.label}", lambda: self._service_up()
                                   if attempt == self.attempt and self.state is PhaseState.RUNNING else None),
            on_timeout=self._guarded(f"the readiness wait of {child.label}",
                                     lambda why: self._not_ready(child, attempt, why)),
        )

    def _service_up(self) -> None:
        self.up = self.was_up = True
        self.rt.log(f"phase {self.name}: service is up")
        self._on_change(self)

    def _spawn(self, spec: ChildSpec) -> Child | None:
        rt = self.rt
        output = ChildOutput(spec.label, rt.console, LogFile(self._log_path(spec), rt.log_file_max_bytes, rt.log),
                             rt.ring_lines, rt.redactor)
        env = {**rt.base_env, **self.extra_env, **spec.env}
        placement = rt.memory.place(self.name, self.spec.memory_max) if rt.memory is not None else None
        procs = str(placement.cgroup.procs_file()) if placement and placement.cgroup and placement.scope == "phase" \
            else None
        try:
            child = spawn(spec, env, output, child_setup(rt.child_oom_score_adj, procs))
        except SpawnError as exc:
            output.file.close()
            self._end_attempt(v.without_exit(self.name, spec.name, v.SPAWN_FAILED, exc.status, exc.reason,
                                             attempt=self.attempt))
            return None
        child.placement = placement
        if spec is self.spec.command and self.spec.parse == "cuzk-bench":
            self._bench = BenchParser()
            self.bench_result = self._bench.result
            # What the parser reads decides the phase: a parser that raises fails it (internal_error).
            output.taps.append(self._guarded("the cuzk-bench output parser", self._bench.feed))
        elif spec is self.spec.command and self.spec.parse == "cuzk-single":
            self._bench = SingleProofParser()
            output.taps.append(self._guarded("the cuzk-bench single output parser", self._bench.feed))
        if rt.ship_lines is not None:
            # Shipping is best effort: a shipper that raises costs lines to the manager, never the phase.
            output.taps.append(contained(
                lambda lines, source=spec.log_source: rt.ship_lines(source, lines),
                lambda exc: rt.loop.faults.report(f"shipping the output of {spec.label}", exc, phase=self.name)))
        # Whoever added a reader of the output: a parser that raises fails the phase (what it reads
        # decides it), never the loop. (The shipper's tap above is contained to cost only lines.)
        output.taps[:] = [tap if is_contained(tap) else self._guarded(f"the output tap {name_of(tap)}", tap)
                          for tap in output.taps]
        rt.reaper.watch(child.pid, self._guarded(f"the exit of {spec.label}",
                                                 lambda pid, status: self._child_exited(child, status)))
        child.attach_output(rt.loop, on_eof=lambda c: c.output.file.close() if not c.running else None,
                            on_error=self.fault_handler(f"the output of {spec.label}"))
        self.children.append(child)
        rt.started.append(child)
        rt.log(f"started {spec.label}: pid {child.pid}: {shown_command(spec.command)}")
        return child

    def _log_path(self, spec: ChildSpec) -> Path:
        name = spec.phase if spec.name == spec.phase else f"{spec.phase}.{spec.name}"
        return self.rt.log_dir / f"{name}.log"

    # ------------------------------------------------------------ events

    def _child_exited(self, child: Child, status: ExitStatus) -> None:
        child.exited(status)
        child.drain_output()
        if not child.output_open:
            child.output.file.close()
        is_daemon = child.spec is not self.spec.command
        memory = self.rt.memory.report(child.placement) if self.rt.memory and child.placement else None
        verdict = v.from_exit(
            self.name, child.spec.name, child.pid, status, stop_reason=child.stop_reason,
            daemon=is_daemon, attempt=self.attempt, started_at=child.started_at,
            last_lines=child.output.last_lines(), memory=memory, stop_detail=child.stop_detail,
            victims=tuple(f"{x.child} (pid {x.pid})" for x in self.rt.verdicts if x.phase == self.name
                          and x.reason == v.OOM_KILLED and x.pid != child.pid and x.ended_at >= child.started_at),
        )
        if not is_daemon and verdict.success and self._bench is not None and child.stop_reason is None:
            # Only a bench that ended by itself is judged by its output: one the supervisor stopped
            # (its daemon died, shutdown) never printed a summary, and that is not its failure.
            verdict = self._judge_bench(verdict)
        self.rt.record(verdict)
        if child.stop_reason is not None or self._aborting:
            return  # we asked for this; the stop in progress takes it from here
        if child in self.kept:
            self._on_change(self)  # a kept daemon died: the lifecycle decides
            return
        if child in self.children and self.state in (PhaseState.STARTING, PhaseState.RUNNING):
            self._end_attempt(verdict)

    def _judge_bench(self, verdict: Verdict) -> Verdict:
        """cuzk-bench exits 0 even when proofs failed: its own output decides."""
        assert self._bench is not None
        result = self._bench.result
        problem = result.problem()
        what = "bench" if self.spec.parse == "cuzk-bench" else "warm-up proof"
        if problem is None:
            self.rt.log(f"phase {self.name}: {what} passed: {result.describe()}")
            return verdict
        return replace(verdict, reason=v.BENCH_FAILED, success=False, status=1, detail=f"{what} failed: {problem}")

    def _deadline_passed(self) -> None:
        if self.state in FINAL_STATES or self._aborting:
            return
        detail = f"phase deadline timeout_s={self.spec.timeout_s:g} passed"
        self.rt.log(f"phase {self.name}: {detail}")
        if self.state is PhaseState.BACKOFF:
            if self._backoff is not None:
                self._backoff.cancel()
            self.outcome = v.without_exit(self.name, self.name, v.TIMEOUT, 1, detail, attempt=self.attempt)
            self.rt.record(self.outcome)
            self.transition(PhaseState.FAILED, detail)
            return
        self._abort_attempt(v.TIMEOUT, detail)
        # In STOPPING the attempt is ending anyway; its outcome decides.

    def _abort_attempt(self, reason: str, detail: str) -> None:
        """The supervisor ends the attempt (deadline, stall): the command's verdict carries why."""
        if self.state not in (PhaseState.STARTING, PhaseState.RUNNING):
            return
        for child in self.children:
            if child.stop_reason is None:
                child.stop_reason, child.stop_detail = reason, detail
        command = self.command_child
        if command is None or not command.running:  # still waiting for daemons
            self._end_attempt(v.without_exit(self.name, self.name, reason, 1, detail, attempt=self.attempt))
        else:
            self._end_attempt(None, why=detail)

    def _watch_for_stall(self, attempt: int) -> None:
        """Look every little while whether output, GPUs and progress_path have all gone silent."""
        assert self.spec.stall_s is not None
        gpus = self.rt.gpus
        now = time.monotonic()
        last_gpu = gpus.sample() if gpus is not None else []
        watch = StallWatch(self.spec.stall_s, now, gpus_visible=bool(last_gpu),
                           watches_path=self.spec.progress_path is not None)
        if self.spec.progress_path is not None:
            watch.saw_progress_size(tree_size(self.spec.progress_path), now)
        interval = check_interval(self.spec.stall_s)

        def check() -> None:
            nonlocal last_gpu
            if attempt != self.attempt or self.state not in (PhaseState.STARTING, PhaseState.RUNNING):
                return
            now = time.monotonic()
            for child in self.children:
                if child.output.last_output_at:
                    watch.saw_output(child.output.last_output_at)
            if watch.gpus_visible and gpus is not None:
                sample = gpus.sample()
                watch.saw_gpu(activity_changed(last_gpu, sample), now)
                last_gpu = sample
            if self.spec.progress_path is not None:
                watch.saw_progress_size(tree_size(self.spec.progress_path), now)
            silent = watch.stalled(now)
            if silent is None:
                self.rt.loop.call_later(interval, check, on_error=on_error)
                return
            self.rt.log(f"phase {self.name}: stalled: {silent} (stall_s={self.spec.stall_s:g})")
            self._abort_attempt(v.STALLED, f"stalled: {silent}")

        on_error = self.fault_handler("the stall check")
        self.rt.loop.call_later(interval, check, on_error=on_error)

    def _end_attempt(self, outcome: Verdict | None, why: str = "") -> None:
        """The attempt is over: stop its children (reverse start order), then decide."""
        if self.state not in (PhaseState.STARTING, PhaseState.RUNNING):
            return
        if self._ready is not None:
            self._ready.cancel()
        self.outcome = outcome
        if outcome is not None and outcome.pid is None:
            self.rt.record(outcome)  # no child will be reaped for it: record it now
        if outcome is not None and outcome.success and self.spec.kind == "oneshot":
            # The phase succeeded: daemons with lifetime = "lifecycle" live on into the later phases.
            self.kept = [c for c in self.children if c.spec.lifetime == "lifecycle" and c.running]
        self._stop_over = False
        self.transition(PhaseState.STOPPING, why or (outcome.detail if outcome else ""))
        stop_one_by_one(self.rt, [c for c in reversed(self.children) if c not in self.kept],
                        "phase attempt over", self._guarded("the end of an attempt", self._attempt_stopped))

    def _attempt_stopped(self) -> None:
        if self.state is not PhaseState.STOPPING:
            return
        self._stop_over = True
        finished = set(map(id, self.children)) - set(map(id, self.kept))
        self.rt.started = [c for c in self.rt.started if id(c) not in finished]
        if self.rt.memory is not None and not self.kept:
            # Whatever is still in the phase's cgroup escaped every other way of finding it
            # (double fork + setsid + a cleared environment): it goes too.
            kill_pids(self.rt.memory.leftover_pids(self.name), self.rt.log,
                      f"still in phase {self.name}'s cgroup after its children stopped (escaped the process tree)")
        outcome = self.outcome
        if outcome is None:  # the deadline ended it: the command's verdict says how it ended
            command = self.command_child
            outcome = next((x for x in reversed(self.rt.verdicts) if command and x.pid == command.pid), None)
            if outcome is None:  # pragma: no cover - the command is always reaped before this point
                outcome = v.without_exit(self.name, self.name, v.TIMEOUT, 1, "deadline", attempt=self.attempt)
            self.outcome = outcome
        if self._aborting:
            self.transition(PhaseState.STOPPED, "supervisor shutdown")
            return
        if outcome.reason == v.INTERNAL_ERROR:  # a bug of ours: retrying would only hide it
            self._finish(PhaseState.FAILED, outcome.detail)
        elif outcome.success and self.spec.kind == "oneshot":
            self._finish(PhaseState.DONE, f"completed in {self.attempt} attempt(s)")
        elif self.spec.kind == "oneshot":
            self._retry_or_fail(outcome)
        else:
            self._restart_or_end(outcome)

    def _retry_or_fail(self, outcome: Verdict) -> None:
        if outcome.reason == v.TIMEOUT and self._deadline_expired():
            self._finish(PhaseState.FAILED, f"{outcome.reason}: {outcome.detail}")
        elif self.attempt > self.spec.retries:
            tries = "no retries configured" if not self.spec.retries else f"all {self.spec.retries} retries used"
            self._finish(PhaseState.FAILED, f"{outcome.reason} ({tries})")
        else:
            self._schedule_next_attempt(f"{outcome.reason}; retry {self.attempt} of {self.spec.retries}")

    def _restart_or_end(self, outcome: Verdict) -> None:
        policy = self.spec.restart
        if policy == "no" or (policy == "on-failure" and outcome.success):
            self._finish(PhaseState.DONE if outcome.success else PhaseState.FAILED,
                         f"service ended: {outcome.reason} (restart = {policy!r})")
            return
        now = time.monotonic()
        if burst_exceeded(self._restart_times, now, self.spec.restart_burst, self.spec.restart_window_s):
            self._finish(PhaseState.FAILED, f"{outcome.reason}; restarted {self.spec.restart_burst} times within "
                                            f"{self.spec.restart_window_s:g}s (restart_burst): giving up")
            return
        self._restart_times = [*within_window(self._restart_times, now, self.spec.restart_window_s), now]
        self._schedule_next_attempt(f"{outcome.reason}; restart = {policy!r}")

    def _schedule_next_attempt(self, why: str) -> None:
        ran_for = time.monotonic() - self._attempt_mono
        # An attempt that ran well for a while earns a fresh start of the backoff.
        if ran_for >= self.spec.backoff_reset_s > 0:
            self._consecutive_failures = 0
        self._consecutive_failures += 1
        delay = backoff_delay(self._consecutive_failures, self.spec.backoff_s, self.spec.backoff_factor,
                              self.spec.backoff_max_s, self.spec.backoff_jitter, self.rt.rng.random())
        self.transition(PhaseState.BACKOFF, f"{why}; next attempt in {delay:.2f}s")
        self._backoff = self.rt.loop.call_later(delay, self._backoff_over,
                                                on_error=self.fault_handler("the backoff timer"))

    def _backoff_over(self) -> None:
        if self.state is PhaseState.BACKOFF and not self._aborting:
            self._start_attempt()

    def _deadline_expired(self) -> bool:
        return self._deadline is not None and self._deadline.when <= time.monotonic()

    def _finish(self, state: PhaseState, why: str) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if state is PhaseState.DONE:
            self._record_facts()
        if not self.kept and self.rt.memory is not None:
            self.rt.memory.release_phase(self.name)
        self.transition(state, why)

    # ------------------------------------------------------------ the supervisor's own bugs

    def fault_handler(self, what: str) -> ErrorHandler:
        """The error handler for a callback this phase registers: ``what`` names the callback."""
        return lambda exc: self.fail_internally(what, exc)

    def _guarded(self, what: str, callback: Callable[..., object]) -> Callable[..., None]:
        """``callback`` made unable to raise into its caller (a tap, a watcher, a thread's answer)."""
        return contained(callback, self.fault_handler(what))

    def fail_internally(self, what: str, exc: Exception) -> None:
        """A bug of the supervisor's own while handling this phase (``what`` raised ``exc``).

        Logged once with its traceback; the phase fails for good with reason internal_error
        (retrying would only hide the bug) and the lifecycle takes it from there. Its children
        are stopped on purpose, so their verdicts read ``stopped``: it is not their failure.
        """
        self.rt.loop.faults.report(f"phase {self.name}: {what}", exc)
        if self.state in FINAL_STATES or self._broken is not None or self._aborting:
            return  # failed already, or the shutdown ends it anyway: the log line above is all
        detail = f"internal error in {what}: {summary(exc)} (a supervisor bug: the traceback is in supervisor.log)"
        self._broken = v.without_exit(self.name, self.name, v.INTERNAL_ERROR, EXIT_INTERNAL_ERROR, detail,
                                      attempt=self.attempt)
        if self.state in (PhaseState.STARTING, PhaseState.RUNNING):
            for child in self.children:
                if child.stop_reason is None:
                    child.stop_reason, child.stop_detail = v.STOPPED, detail
            self._end_attempt(self._broken)  # records it; _attempt_stopped then fails the phase
            return
        self.outcome = self._broken
        self.rt.record(self._broken)
        if self.state is PhaseState.STOPPING and not self._stop_over:
            return  # the stop in progress ends in _attempt_stopped, which sees the outcome
        if self._backoff is not None:
            self._backoff.cancel()
        self._finish(PhaseState.FAILED, detail)

    # ------------------------------------------------------------ shutdown

    def abort(self) -> None:
        """The supervisor is shutting down: no new attempts; children are stopped by the lifecycle."""
        self._aborting = True
        for timer in (self._deadline, self._backoff):
            if timer is not None:
                timer.cancel()
        if self._ready is not None:
            self._ready.cancel()

    def settle_after_shutdown(self) -> None:
        if self.state in (PhaseState.STARTING, PhaseState.RUNNING):
            self.transition(PhaseState.STOPPING, "supervisor shutdown")
        if self.state not in FINAL_STATES:
            self.transition(PhaseState.STOPPED, "supervisor shutdown")

    def live_children(self) -> list[Child]:
        return [c for c in self.children + self.kept if c.running]


class Lifecycle:
    """Runs the phases in order and decides when the whole run is over, and with which status."""

    def __init__(self, plan: Plan, rt: Runtime, on_finished: Callable[[int], None]) -> None:
        self.plan = plan
        self.rt = rt
        self.phases = [Phase(spec, rt, self._phase_changed) for spec in plan.phases]
        self._on_finished = on_finished
        self.listeners: list[Callable[[Phase], None]] = []  # every phase transition (reporting, status)
        self.on_shutdown: list[Callable[[str, int], None]] = []
        self.shutdown_reason = ""
        self.shutting_down = False
        self.exit_status: int | None = None
        self.failure: Verdict | None = None

    def start(self) -> None:
        self._advance()

    def current(self) -> Phase | None:
        """The phase the lifecycle is at: the last one started."""
        started = [p for p in self.phases if p.started]
        return started[-1] if started else None

    def _advance(self) -> None:
        if self.shutting_down:
            return
        for phase in self.phases:
            if phase.state is PhaseState.PENDING:
                contained(phase.start, phase.fault_handler("its start"))()
                return
            if phase.hold is not None:
                return  # done, but the lifecycle may not go past it yet (see Phase.hold)
            if phase.state is PhaseState.DONE:
                continue
            if phase.spec.kind == "service" and phase.was_up:
                continue
            return  # this phase is still on its way
        if all(p.state is PhaseState.DONE for p in self.phases):
            self.rt.log("lifecycle complete: every phase done")
            self.shutdown("lifecycle complete", 0)

    def release_hold(self, phase: Phase) -> None:
        if phase.hold is not None:
            self.rt.log(f"phase {phase.name}: hold released ({phase.hold})")
            phase.hold = None
            self._advance()

    def _phase_changed(self, phase: Phase) -> None:
        tell_listeners(self.rt, "listener", self.listeners, phase, phase=phase.name)
        if self.shutting_down:
            return
        if phase.state is PhaseState.FAILED:
            self.failure = phase.outcome
            status = phase.outcome.status if phase.outcome else 1
            self.shutdown(f"phase {phase.name} failed", status or 1)
            return
        dead_kept = [c for c in phase.kept if not c.running]
        if dead_kept:
            child = dead_kept[0]
            self.failure = next((x for x in reversed(self.rt.verdicts) if x.pid == child.pid), None)
            status = self.failure.status if self.failure else 1
            self.shutdown(f"{child.label} (kept for the rest of the lifecycle) died", status or 1)
            return
        if phase.state is PhaseState.DONE or phase.up:
            self._advance()

    def forward(self, signum: int) -> list[Child]:
        """Send a signal to the command of every phase that runs one; returns who got it."""
        sent = []
        for phase in self.phases:
            child = phase.command_child
            if phase.state is PhaseState.RUNNING and child is not None and child.running:
                child.send_group_signal(signum)
                sent.append(child)
        return sent

    def shutdown(self, why: str, status: int) -> None:
        """Stop everything in reverse start order, then report ``status``."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self.exit_status = status
        self.shutdown_reason = why
        self.rt.log(f"shutting down: {why}")
        for phase in self.phases:
            phase.abort()
        # Child.stop signals at once and scans the tree after; one that is gone costs nothing.
        stop_one_by_one(self.rt, list(reversed(self.rt.started)), "supervisor shutdown",
                        contained(self._finished, self._finish_anyway))
        # After the first stop signal is out: listeners may write to disk (the outbox fsyncs).
        tell_listeners(self.rt, "shutdown listener", self.on_shutdown, why, status)

    def kill_everything_now(self) -> None:
        """A second shutdown request: no more grace for anyone."""
        for child in self.rt.started:
            child.kill_now()

    def _finished(self) -> None:
        for phase in self.phases:
            phase.settle_after_shutdown()
        assert self.exit_status is not None
        self._on_finished(self.exit_status)

    def _finish_anyway(self, exc: Exception) -> None:
        """Settling the phases raised: the run still ends, with the status it was ending with."""
        self.rt.loop.faults.report("the end of the shutdown", exc)
        self._on_finished(self.exit_status if self.exit_status is not None else EXIT_INTERNAL_ERROR)


def tell_listeners(rt: Runtime, kind: str, listeners: list[Callable[..., None]], *args: Any,
                   phase: str | None = None) -> None:
    """Every listener hears of it, whichever raised before it: a broken listener (reporting, the
    status file) is logged once and costs what it was for, never the lifecycle."""
    for listener in list(listeners):
        try:
            listener(*args)
        except Exception as exc:
            rt.loop.faults.report(f"the {kind} {name_of(listener)}", exc, phase=phase)


def stop_one_by_one(rt: Runtime, children: list[Child], reason: str, then: Callable[[], None]) -> None:
    """Stop each child's tree in the order given, the next only once the previous is gone; then ``then``."""
    remaining = list(children)

    def next_one() -> None:
        if not remaining:
            then()
            return
        remaining.pop(0).stop(rt.loop, rt.log, reason, next_one)

    next_one()


def output_files(path: str) -> dict[str, int] | None:
    """Relative path → size of every file under ``path`` (lock and partial files left out)."""
    root = Path(path)
    if not root.is_dir():
        return None
    files = {}
    for entry in root.rglob("*"):
        if entry.is_file() and entry.suffix not in (".lock", ".tmp", ".part"):
            try:
                files[str(entry.relative_to(root))] = entry.stat().st_size
            except OSError:
                continue
    return files


def machine_fingerprint(rt: Runtime) -> dict[str, Any]:
    """What makes a benchmark result valid here: the same GPUs and the same memory limit."""
    gpus = rt.gpus.sample() if rt.gpus is not None else []
    return {"gpus": [[g.name, g.memory_total] for g in gpus], "memory": rt.available_memory()}


def shown_command(argv: tuple[str, ...]) -> str:
    """The argv as one shell-quoted line: a newline inside an argument must not split a log line."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in shlex.join(argv))


# ---------------------------------------------------------------- P3 shims: P1 implements these
# Issue 11 gives the lifecycle verbs for what reporting used to write by hand (phase.hold,
# rt.base_env) and renames Phase.bench_result to Phase.parsed. P1 writes the real ones in
# parallel; these stand in so that reporting can call them now. The lead drops this block at merge.


def _hold(self: Lifecycle, phase: Phase, why: str) -> None:
    """The phase is done but the lifecycle may not go past it yet."""
    phase.hold = why


def _release(self: Lifecycle, phase: Phase) -> None:
    """The hold is over; the lifecycle advances."""
    self.release_hold(phase)


def _export_env(self: Runtime, name: str, value: str) -> None:
    """Children started from now on get ``name=value``."""
    self.base_env[name] = value


def _parsed(self: Phase) -> BenchResult | None:
    return self.bench_result


Lifecycle.hold = _hold  # type: ignore[attr-defined]
Lifecycle.release = _release  # type: ignore[attr-defined]
Runtime.export_env = _export_env  # type: ignore[attr-defined]
Phase.parsed = property(_parsed)  # type: ignore[attr-defined]
# ---------------------------------------------------------------- end of the P3 shims
