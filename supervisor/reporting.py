"""Reporting to the fleet manager: what the lifecycle tells it, failures, logs, events.

Calls, in the order the lifecycle makes them: ``/register`` first (its uuid and
runner_id are kept in ``state_dir`` and given to every later child as
``INSTANCE_UUID`` and ``RUNNER_ID``), then ``/param-done``, ``/bench-done`` with
the rate, ``/running``; which phase triggers which is the phase's ``report`` key.
Every call, and every failure report, is written to the persisted outbox first
and delivered by the sender thread (sender.py), in order, at least once: the
work never waits on the manager, and a SIGKILL of the supervisor loses nothing.

The one place the lifecycle does wait is the bench gate (prover/gate.py):
production does not start until the manager has answered ``bench-done``.

A lifecycle that fails for good before production gives the instance up: the
manager's API destroys an instance on one call only, ``bench-done`` with a rate
below min_rate, so that is sent with rate 0, after the failure's reason lines.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .ansi import strip_ansi
from .config import ManagerSpec
from .exitflush import FINISH_MIN_S, GIVE_UP_FLUSH_S, ExitFlush
from .lifecycle import Lifecycle
from .logship import Shipper, event_line, events_sender, log_push_sender
from .loop import contained, summary
from .manager import ManagerClient
from .outbox import Outbox
from .phase import Phase
from .prover.gate import BenchGate
from .redact import Redactor, shown_url
from .runtime import ChildKit
from .sender import Sender
from .states import PhaseState
from .verdict import STOPPED, Verdict

# The give-up's optional ``reason`` field (bench_done_reason): one line, cut to this many characters.
REASON_MAX_CHARS = 1000
# The supervisor's own lines held before the log shipper exists (a handful in practice).
EARLY_LINES_MAX = 1000
# Own lines that Reporter.verdict pushes durably (the FAILED line, then its quoted child lines):
# shipping them from the log tap too would show each failure twice in the manager's setup tab.
# Quoted lines are skipped only right after a FAILED line: a contained fault's traceback is quoted
# the same way, and the manager must see that one.
FAILED_PREFIX = "FAILED: "
QUOTED_PREFIX = "  | "

Log = Callable[[str], None]
# Runs the loop while the exit flush lasts: (the flush, until what) → returns once ``until()`` is true.
FlushWait = Callable[[ExitFlush, Callable[[], bool]], None]


class EarlyLines:
    """The supervisor's own lines from its very first one (role, memory evidence, GPUs, resume),
    held in order until the Reporter takes them: the log tap exists before the Reporter can."""

    def __init__(self) -> None:
        self._held: list[str] | None = []
        self._forward: Callable[[str], None] | None = None

    def tap(self, message: str) -> None:
        if self._forward is not None:
            self._forward(message)
        elif self._held is not None:
            self._held.append(message)
            del self._held[:-EARLY_LINES_MAX]

    def hand_to(self, forward: Callable[[str], None] | None) -> None:
        """Replay what was held into ``forward``, then pass every later line straight on; None: drop them."""
        held, self._held = self._held or [], None
        self._forward = forward
        if forward is not None:
            for message in held:
                forward(message)


class Reporter:
    """What the lifecycle tells the manager: its phase calls, failures, logs and events.

    Every call goes into the outbox (made in ``start``), which the Sender delivers; the lifecycle's
    listeners call in from the loop's thread only.
    """

    def __init__(self, spec: ManagerSpec, state_dir: Path, rt: ChildKit, redactor: Redactor,
                 early: EarlyLines | None = None) -> None:
        self.spec = spec
        self.rt = rt
        self._log = rt.log
        self._redactor = redactor
        self.enabled = spec.url is not None
        self.outbox: Outbox | None = None
        self._sender: Sender | None = None  # delivers the outbox (made with it, in start)
        self._gate: BenchGate | None = None
        self._lifecycle: Lifecycle | None = None
        self._logs: Shipper | None = None
        self._events: Shipper | None = None
        self._reported: set[str] = set()
        self._in_verdict = False  # the own lines now shipped are a FAILED line and its quoted lines
        self._giving_up = False  # a give-up is queued: the exit waits longer for it (GIVE_UP_FLUSH_S)
        self._state_dir = state_dir
        # The supervisor's own lines, held by ``early`` until start() has made the shipper.
        self._early = early
        if early is not None and not self.enabled:
            early.hand_to(None)

    # ------------------------------------------------------------ start and stop

    def start(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle
        if not self.enabled:
            self._log("manager reporting off: no [manager] url and no MANAGER_URL")
            return
        assert self.spec.url is not None
        self.outbox = Outbox(self._state_dir / "outbox.sqlite3", self._log)
        if self.outbox.corrupt_note:
            self._log(self.outbox.corrupt_note)
        token = os.environ.get(self.spec.token_env) if self.spec.token_env else None
        client = ManagerClient(self.spec, token, warn=self._log)
        self._gate = BenchGate(self.spec, lifecycle, self.rt.loop, self._log)
        self._sender = Sender(self.spec, self.outbox, client, self.rt.loop, self._log,
                              on_identity=self._export_identity, on_bench_answer=self._gate.answered,
                              on_bench_refused=self._gate.refused)
        self._sender.restore_identity()
        self._log(f"manager: {shown_url(self.spec.url)} as label {self.spec.label!r}, min_rate {self.spec.min_rate:g}; "
                  f"outbox {self.outbox.path} ({self.outbox.pending()} call(s) pending)")
        self._logs = Shipper("log shipping", log_push_sender(client, lambda: self.uuid), lambda: bool(self.uuid),
                             self.spec.log_push_interval_s, self.spec.log_backlog_bytes, self._log)
        if self._early is not None:
            # A shipper that raises costs the manager lines, never the supervisor's own log.
            self._early.hand_to(contained(self.ship_own_line, lambda exc: self.rt.loop.faults.report(
                "shipping the supervisor's own lines", exc)))
        if not self._start_thread("log shipping", self._logs.start, "the children's output is not shipped"):
            self._logs = None
        if self.spec.events_url:
            events_client = ManagerClient(_with_url(self.spec, self.spec.events_url), token, warn=self._log)
            self._events = Shipper("events", events_sender(events_client), lambda: True,
                                   self.spec.log_push_interval_s, self.spec.log_backlog_bytes, self._log)
            if not self._start_thread("events", self._events.start, "no events are sent"):
                self._events = None
        self._start_thread("the outbox's sender", self._sender.start,
                           "reporting is off: every call stays in the outbox for the next start")
        self.event("supervisor", state="started", pid=os.getpid())

    def _start_thread(self, what: str, start: Callable[[], None], costs: str) -> bool:
        """A thread that cannot start (pids.max, RLIMIT_NPROC, no memory) costs what it was for, said once."""
        try:
            start()
        except RuntimeError as exc:  # "can't start new thread"
            self._log(f"manager: cannot start the thread of {what} ({summary(exc)}): {costs}")
            return False
        return True

    @property
    def uuid(self) -> str | None:
        """What the manager calls this instance; None until a register was answered (here or earlier)."""
        return self._sender.uuid if self._sender is not None else None

    def stop(self, status: int, why: str, wait: FlushWait) -> None:
        """The supervisor is exiting: say so, let the outbox drain while ``wait`` runs the loop (see
        exitflush.py for how long), then end the threads and close the outbox.

        The loop must still run meanwhile: the sender's retries and answers are handed back into it."""
        if not self.enabled or self.outbox is None or self._sender is None:
            return
        sender, outbox = self._sender, self.outbox
        self.push_text("setup", f"prover-supervisor exiting with status {status}: {why}")
        self.event("supervisor", state="exiting", status=status, why=why)
        giving_up = self._giving_up and bool(outbox.pending_of("bench-done"))
        flush = ExitFlush(outbox.pending, sender.alive, status, giving_up)
        if giving_up and sender.alive():
            self._log(f"manager: waiting up to {GIVE_UP_FLUSH_S:g}s for the give-up to be delivered")
        sender.wake()
        wait(flush, flush.over)
        left = outbox.pending()
        if left:
            self._log(f"manager: {left} call(s) not delivered yet; they stay in the outbox for the next start")
        sender.ask_to_stop()
        shippers = self._stop_shippers(flush.seconds_left())
        floor = time.monotonic() + FINISH_MIN_S
        wait(flush, lambda: flush.ended_by is not None or not (shippers() or sender.alive())
             or time.monotonic() >= max(flush.deadline, floor))
        outbox.close()

    def _stop_shippers(self, within_s: float) -> Callable[[], bool]:
        """Each shipper's last push (each stop blocks), on a thread of its own so that the loop keeps
        running; inline where no thread can be had. Returns "still at it"."""
        logs, events = self._logs, self._events
        stoppers: list[Callable[[], None]] = []
        if logs is not None:
            stoppers.append(lambda: logs.stop(max(FINISH_MIN_S, within_s)))
        if events is not None:
            stoppers.append(lambda: events.stop(1.0))
        if not stoppers:
            return lambda: False
        thread = threading.Thread(target=lambda: [stop() for stop in stoppers], name="exit:shippers", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            for stop in stoppers:
                stop()
            return lambda: False
        return thread.is_alive

    # ------------------------------------------------------------ what the lifecycle tells us

    def phase_changed(self, phase: Phase) -> None:
        self.event("transition", phase=phase.name, state=str(phase.state), why=phase.why, attempt=phase.attempt,
                   up=phase.up)
        if not self.enabled:
            return
        report = phase.spec.report
        if report == "param-done" and phase.state is PhaseState.DONE:
            self._queue_once("param-done", {})
        elif report == "bench-done" and phase.state is PhaseState.DONE and self._bench_already_reported(phase):
            pass
        elif report == "bench-done" and phase.state is PhaseState.DONE:
            rate = getattr(phase.parsed, "rate_per_hour", None)
            self._queue_once("bench-done", {"rate": rate if rate is not None else 0.0})
            self._hold_production(phase)
        elif report == "running" and phase.up:
            self._queue_once("running", {})

    def _bench_already_reported(self, phase: Phase) -> bool:
        """After a restart: this uuid's bench-done is already queued, or was accepted. Sending another
        would move a running instance back to bench_done (and a slower re-run could get it killed)."""
        assert self.outbox is not None
        answer = self.outbox.delivered_answer("bench-done")
        if isinstance(answer, dict) and answer.get("passed") is True:
            self._log("manager: bench-done was delivered and passed before this restart; not sent again")
            return True
        if self.outbox.pending_of("bench-done"):
            self._log("manager: a bench-done from before this restart is still queued; waiting for its answer")
            self._reported.add("bench-done")
            self._hold_production(phase)
            return True
        return False

    def _hold_production(self, phase: Phase) -> None:
        assert self._gate is not None
        self._gate.hold(phase)

    def give_up(self, why: str, status: int) -> None:
        """The lifecycle failed for good before production: ask the manager to destroy the instance now.

        Called as the lifecycle shuts down, after the failure's verdict and the "stopping" line went
        into the outbox: the manager has the reason in its log before the instance is gone. Without
        this it keeps paying for the instance until its 45 or 90 min timeout."""
        lifecycle = self._lifecycle
        failure = lifecycle.failure if lifecycle is not None else None
        if not self.enabled or self.outbox is None or lifecycle is None or failure is None or status == 0:
            return  # no failure (a stop signal, a completed run, the manager's own rejection): nothing to give up
        if not self.spec.give_up_on_failure:
            self._log("manager: not giving the instance up (give_up_on_failure = false); the manager's timeout "
                      "will end it")
            return
        if reached_production(lifecycle):
            return
        answer = self.outbox.delivered_answer("bench-done")
        if isinstance(answer, dict) and answer.get("passed") is False:
            return  # the manager already marked it killed
        # A bench that passed does not keep an instance that will never prove: production never came
        # up and the supervisor is exiting, and today's manager has no timeout for bench_done. It kills
        # on any bench-done below min_rate, whatever the state, so a second one gives it up too.
        passed_before = "bench-done" in self._reported or isinstance(answer, dict)
        self._reported.discard("bench-done")
        self._giving_up = True
        reason = self._redactor.text(failure.line())[:REASON_MAX_CHARS]
        self._queue_once("bench-done", {"rate": 0.0, "failed": True, "reason": reason})
        after = "; the bench had passed, but production never came up" if passed_before else ""
        self._log(f"manager: giving the instance up ({why}): bench-done with rate 0 after the reason line{after}")

    def verdict(self, verdict: Verdict) -> None:
        self.event("verdict", **verdict.to_dict())
        if verdict.success or verdict.reason == STOPPED:
            return
        lines = [f"prover-supervisor: FAILED: {verdict.line()}"]
        # The child's own lines, as the manager's dashboard must show them: no colour codes.
        lines += [f"  | {_plain(line)}" for line in verdict.last_lines]
        self.push_text("setup", "\n".join(lines))

    def push_text(self, source: str, text: str) -> None:
        """A durable log push (failures, the supervisor's exit): through the outbox, never dropped."""
        if self.enabled and self.outbox is not None:
            self._move_queued_lines(source)
            self.outbox.add("log", {"source": source, "text": self._redactor.text(text).rstrip("\n") + "\n"})
            self._wake_sender()

    def _move_queued_lines(self, source: str) -> None:
        """Lines of ``source`` still waiting in the log shipper go into the outbox first, so the durable
        line arrives after what was logged before it (the two travel by different threads)."""
        if self._logs is None or self.outbox is None:
            return
        for chunk in self._logs.take_all(source):
            self.outbox.add("log", {"source": source, "text": chunk})

    def ship_lines(self, source: str, label: str, lines: list[bytes]) -> None:
        """A child's output lines (masked where they entered, logs.ChildOutput): best effort, batched,
        bounded. Each carries the child's label as the console shows it (``[phase/name] ...``): a child
        that prints what reads like the supervisor's own line (``[supervisor] FAILED: ...``) cannot
        pass for it in the manager's tabs."""
        if self._logs is not None:
            head = f"[{label}] "
            self._logs.add(source, [head + strip_ansi(line).decode("utf-8", errors="replace") for line in lines])

    def ship_own_line(self, message: str) -> None:
        if message.startswith(FAILED_PREFIX):
            self._in_verdict = True
        elif not (self._in_verdict and message.startswith(QUOTED_PREFIX)):
            self._in_verdict = False
        if self._in_verdict:
            return  # Reporter.verdict pushes it, durably
        if self._logs is not None:
            self._logs.add("setup", [f"[supervisor] {message}"])

    def event(self, kind: str, **fields: Any) -> None:
        if self._events is not None:
            self._events.add("events", [event_line(kind, label=self.spec.label, uuid=self.uuid, **fields)])

    def _queue_once(self, kind: str, payload: dict[str, Any]) -> None:
        assert self.outbox is not None
        if kind in self._reported:
            return
        self._reported.add(kind)
        self.outbox.add(kind, payload)
        self._wake_sender()
        self._log(f"manager: {kind} queued" + (f" (rate {payload['rate']:g}/h)" if "rate" in payload else ""))

    def _wake_sender(self) -> None:
        if self._sender is not None:
            self._sender.wake()

    def _export_identity(self, uuid: str, runner_id: str | None) -> None:
        """Children started from now on know who they are to the manager."""
        self.rt.export_env("INSTANCE_UUID", uuid)
        if runner_id:
            self.rt.export_env("RUNNER_ID", runner_id)

    # ------------------------------------------------------------ for the status view

    def status(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False}
        sender = self._sender
        return {
            "enabled": True, "url": shown_url(self.spec.url or ""), "label": self.spec.label, "uuid": self.uuid,
            "runner_id": sender.runner_id if sender else None,
            "outbox_pending": self.outbox.pending() if self.outbox else None,
            "last_delivered": sender.last_delivered if sender else None,
            "last_error": self._redactor.text(sender.last_error) if sender and sender.last_error else None,
            "log_backlog": self._logs.backlog() if self._logs else {},
        }


def reached_production(lifecycle: Lifecycle) -> bool:
    """Did the production service (``report = "running"``, else the last service) ever come up?"""
    return any(p.up or p.was_up for p in lifecycle.production())


def _plain(line: str) -> str:
    return strip_ansi(line.encode("utf-8", errors="replace")).decode("utf-8", errors="replace")


def _with_url(spec: ManagerSpec, url: str) -> ManagerSpec:
    return replace(spec, url=url)
