"""Reporting to the fleet manager: register, phase calls, failures, logs, events.

Calls, in the order the lifecycle makes them: ``/register`` first (its uuid and
runner_id are kept in ``state_dir`` and given to every later child as
``INSTANCE_UUID`` and ``RUNNER_ID``), then ``/param-done``, ``/bench-done`` with
the rate, ``/running``; which phase triggers which is the phase's ``report`` key.
Every call, and every failure report, is written to the persisted outbox first
and delivered by a sender thread, in order, at least once: the work never waits
on the manager, and a SIGKILL of the supervisor loses nothing. Registration
goes first: while no uuid is known the register is sent ahead of the queue, and
one the manager refuses (a 4xx) is retried with backoff like one it never got;
no call is sent, or given up, for want of a uuid.

The one place the lifecycle does wait: production does not start until the
manager has answered ``bench-done`` (``passed: false`` means the manager is
destroying the instance), or until ``bench_gate_s`` passed without an answer.

A lifecycle that fails for good before production gives the instance up: the
manager's API destroys an instance on one call only, ``bench-done`` with a rate
below min_rate, so that is sent with rate 0, after the failure's reason lines.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import ManagerSpec
from .exits import EXIT_BENCH_REJECTED
from .logs import strip_ansi
from .logship import Shipper, event_line, events_sender, log_push_sender
from .loop import contained
from .manager import Answer, ManagerClient, PermanentError, TransientError
from .outbox import Call, Outbox
from .redact import Redactor
from .verdict import STOPPED, Verdict

if TYPE_CHECKING:
    from .lifecycle import Lifecycle, Phase, Runtime

# The supervisor's exit status when the manager rejected the benchmark (passed: false).
# How long the supervisor's exit waits for the outbox to drain before leaving the rest for the next start.
EXIT_FLUSH_S = 10.0
EXIT_STALL_S = 2.0
# Retries are logged on the first failure, then once every this many.
RETRY_LOG_EVERY = 10
# The give-up's optional ``reason`` field (bench_done_reason): one line, cut to this many characters.
REASON_MAX_CHARS = 1000
# The supervisor's own lines held before the log shipper exists (a handful in practice).
EARLY_LINES_MAX = 1000
# Own lines that Reporter.verdict pushes durably (the FAILED line and its quoted child lines):
# shipping them from the log tap too would show each failure twice in the manager's setup tab.
DURABLE_VERDICT_PREFIXES = ("FAILED: ", "  | ")

Log = Callable[[str], None]


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
    def __init__(self, spec: ManagerSpec, state_dir: Path, rt: Runtime, redactor: Redactor,
                 early: EarlyLines | None = None) -> None:
        self.spec = spec
        self.rt = rt
        self._log = rt.log
        self._redactor = redactor
        self.enabled = spec.url is not None
        self.outbox: Outbox | None = None
        self.uuid: str | None = None
        self.runner_id: str | None = None
        self.last_delivered: dict[str, Any] | None = None
        self.last_error: str | None = None
        self.rejected = False
        self._lifecycle: Lifecycle | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._logs: Shipper | None = None
        self._events: Shipper | None = None
        self._gate_timer = None
        self._reported: set[str] = set()
        self._state_dir = state_dir
        # Own lines logged before start() made the shipper: queued there once it exists.
        self._own_before_start: list[str] = []
        if early is not None:
            # A shipper that raises costs the manager lines, never the supervisor's own log.
            ship = contained(self.ship_own_line,
                             lambda exc: rt.loop.faults.report("shipping the supervisor's own lines", exc))
            early.hand_to(ship if self.enabled else None)

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
        client = ManagerClient(self.spec, token)
        self._client = client
        self._restore_identity()
        self._log(f"manager: {self.spec.url} as label {self.spec.label!r}, min_rate {self.spec.min_rate:g}; "
                  f"outbox {self.outbox.path} ({self.outbox.pending()} call(s) pending)")
        self._logs = Shipper("log shipping", log_push_sender(client, lambda: self.uuid), lambda: bool(self.uuid),
                             self.spec.log_push_interval_s, self.spec.log_backlog_bytes, self._log)
        self._logs.add("setup", self._own_before_start)
        self._own_before_start = []
        self._logs.start()
        if self.spec.events_url:
            events_client = ManagerClient(_with_url(self.spec, self.spec.events_url), token)
            self._events = Shipper("events", events_sender(events_client), lambda: True,
                                   self.spec.log_push_interval_s, self.spec.log_backlog_bytes, self._log)
            self._events.start()
        self._thread = threading.Thread(target=self._deliver_forever, name="outbox", daemon=True)
        self._thread.start()
        self.event("supervisor", state="started", pid=os.getpid())

    def _restore_identity(self) -> None:
        assert self.outbox is not None
        stored_label = self.outbox.get("label")
        if stored_label is not None and stored_label != self.spec.label:
            # The state volume belonged to another instance: its uuid is not ours.
            self._log(f"manager: state_dir was registered as {stored_label!r}, not {self.spec.label!r}; "
                      "registering afresh")
            self.outbox.put("uuid", "")
        self.outbox.put("label", self.spec.label)
        self.uuid = self.outbox.get("uuid") or None
        self.runner_id = self.outbox.get("runner_id") or None
        if self.uuid:
            self._log(f"manager: reusing uuid {self.uuid} (runner_id {self.runner_id}) from an earlier start")
            self._export_identity()
        elif not self.outbox.pending_of("register"):
            # No uuid, whatever the outbox says was delivered before (a SIGKILL between the answer and
            # the uuid being kept, another label): register now, so children start knowing who they are.
            self._queue_register()

    def _queue_register(self) -> None:
        assert self.outbox is not None
        self.outbox.add("register", {"label": self.spec.label, "min_rate": self.spec.min_rate})

    def stop(self, status: int, why: str) -> None:
        """The supervisor is exiting: say so, then give the outbox a little time to drain."""
        if not self.enabled or self.outbox is None:
            return
        self.push_text("setup", f"prover-supervisor exiting with status {status}: {why}")
        self.event("supervisor", state="exiting", status=status, why=why)
        deadline = time.monotonic() + EXIT_FLUSH_S
        # Wait while calls are going out; a manager that is down gets EXIT_STALL_S, not the whole
        # EXIT_FLUSH_S (`docker stop` gives the container only so long, and the outbox keeps them).
        progress_at, left_before = time.monotonic(), self.outbox.pending()
        while left_before and time.monotonic() < deadline and self._thread and self._thread.is_alive():
            self._wake.set()
            time.sleep(0.05)
            left = self.outbox.pending()
            if left < left_before:
                progress_at, left_before = time.monotonic(), left
            elif time.monotonic() - progress_at > EXIT_STALL_S:
                break
        left = self.outbox.pending()
        if left:
            self._log(f"manager: {left} call(s) not delivered yet; they stay in the outbox for the next start")
        self._stop.set()
        self._wake.set()
        if self._logs is not None:
            self._logs.stop(max(0.5, deadline - time.monotonic()))
        if self._events is not None:
            self._events.stop(1.0)
        if self._thread is not None:
            self._thread.join(2.0)
        self.outbox.close()

    # ------------------------------------------------------------ what the lifecycle tells us

    def phase_changed(self, phase: Phase) -> None:
        from .lifecycle import PhaseState

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
            rate = phase.bench_result.rate_per_hour if phase.bench_result else None
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
        if "bench-done" in self._reported or (isinstance(answer, dict) and answer.get("passed") is True):
            self._log("manager: bench-done was already sent for this instance; not sending it again to give it up")
            return
        reason = self._redactor.text(failure.line())[:REASON_MAX_CHARS]
        self._queue_once("bench-done", {"rate": 0.0, "failed": True, "reason": reason})
        self._log(f"manager: giving the instance up ({why}): bench-done with rate 0 after the reason line")

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
            self._wake.set()

    def _move_queued_lines(self, source: str) -> None:
        """Lines of ``source`` still waiting in the log shipper go into the outbox first, so the durable
        line arrives after what was logged before it (the two travel by different threads)."""
        if self._logs is None or self.outbox is None:
            return
        for chunk in self._logs.take_all(source):
            self.outbox.add("log", {"source": source, "text": chunk})

    def ship_lines(self, source: str, lines: list[bytes]) -> None:
        """Children's output: best effort, batched, bounded."""
        if self._logs is not None:
            # Masked again after stripping: a colour code inside a secret would have hidden it from the first pass.
            text = [self._redactor.text(strip_ansi(line).decode("utf-8", errors="replace")) for line in lines]
            self._logs.add(source, text)

    def ship_own_line(self, message: str) -> None:
        if message.startswith(DURABLE_VERDICT_PREFIXES):
            return  # Reporter.verdict pushes it, durably
        line = f"[supervisor] {message}"
        if self._logs is not None:
            self._logs.add("setup", [line])
        else:
            self._own_before_start.append(line)
            del self._own_before_start[:-EARLY_LINES_MAX]

    def event(self, kind: str, **fields: Any) -> None:
        if self._events is not None:
            self._events.add("events", [event_line(kind, label=self.spec.label, uuid=self.uuid, **fields)])

    def _queue_once(self, kind: str, payload: dict[str, Any]) -> None:
        assert self.outbox is not None
        if kind in self._reported:
            return
        self._reported.add(kind)
        self.outbox.add(kind, payload)
        self._wake.set()
        self._log(f"manager: {kind} queued" + (f" (rate {payload['rate']:g}/h)" if "rate" in payload else ""))

    # ------------------------------------------------------------ the bench gate

    def _hold_production(self, phase: Phase) -> None:
        if self.spec.bench_gate_s <= 0:
            return
        phase.hold = "waiting for the manager's answer to bench-done"
        self._gate_timer = self.rt.loop.call_later(self.spec.bench_gate_s, lambda: self._gate_expired(phase))

    def _gate_expired(self, phase: Phase) -> None:
        if phase.hold is not None:
            self._log(f"manager: no answer to bench-done after {self.spec.bench_gate_s:g}s; starting production "
                      "anyway (a later passed: false still stops it)")
            self._release(phase)

    def _release(self, phase: Phase) -> None:
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        if self._lifecycle is not None:
            self._lifecycle.release_hold(phase)

    def _bench_answered(self, passed: bool, rate: float) -> None:
        lifecycle = self._lifecycle
        if lifecycle is None:
            return
        phase = next((p for p in lifecycle.phases if p.spec.report == "bench-done"), None)
        if passed:
            self._log(f"manager: benchmark passed (rate {rate:g}/h >= min_rate {self.spec.min_rate:g})")
            if phase is not None:
                self._release(phase)
            return
        self.rejected = True
        why = (f"the manager rejected the benchmark (rate {rate:g}/h < min_rate {self.spec.min_rate:g}) and is "
               "destroying this instance: not starting production")
        self._log(why)
        lifecycle.shutdown(why, EXIT_BENCH_REJECTED)

    # ------------------------------------------------------------ the sender thread

    def _deliver_forever(self) -> None:
        assert self.outbox is not None
        while not self._stop.is_set():
            call = self._next_call()
            if call is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            retries = 0

            def on_retry(error: str, delay: float, call: Call = call) -> None:
                nonlocal retries
                retries += 1
                self.last_error = error
                self.outbox.attempted(call.id, error) if self.outbox else None
                if retries == 1 or retries % RETRY_LOG_EVERY == 0:
                    self.rt.loop.call_soon_threadsafe(lambda: self._log(
                        f"manager: {call.kind} not delivered ({error}); retry {retries} in {delay:.1f}s"))

            try:
                answer = self._client.with_retries(lambda call=call: self._attempt(call), self._stop, on_retry)
            except PermanentError as exc:
                self.last_error = str(exc)
                self.outbox.failed(call.id, str(exc))
                self.rt.loop.call_soon_threadsafe(lambda exc=exc, call=call: self._refused(call, exc))
                continue
            except TransientError:
                return  # stopping: the call stays pending in the outbox
            self.outbox.delivered(call.id, answer.body)
            self.last_delivered = {"kind": call.kind, "id": call.id, "at": time.time()}
            self._delivered(call, answer)

    def _next_call(self) -> Call | None:
        """The next call to deliver: in order, except that registration goes first while no uuid is known.

        Every other call needs the uuid, so none is sent (nor given up) before a register succeeded,
        wherever the register stands in the queue (an outbox of an earlier start, a lost uuid).
        """
        assert self.outbox is not None
        call = self.outbox.next_pending()
        if call is None or call.kind == "register" or self.uuid:
            return call
        register = self.outbox.next_pending_of("register")
        if register is None:
            self._queue_register()
            register = self.outbox.next_pending_of("register")
        return register

    def _attempt(self, call: Call) -> Answer:
        client = self._client
        if call.kind == "register":
            # Who this start is, whatever an earlier start queued (its label may have been another).
            identity = {"label": self.spec.label, "min_rate": self.spec.min_rate}
            try:
                answer = client.request("POST", "/register", json_body=identity)
            except PermanentError as exc:
                # Refused (a 4xx): retried with the same backoff as a manager that is down, never dropped.
                # Nothing else can go without the uuid, and registering again is harmless (idempotent).
                raise TransientError(f"/register refused: HTTP {exc.status}: {exc.body[:200]}") from None
            body = answer.body if isinstance(answer.body, dict) else {}
            if not body.get("uuid"):
                raise TransientError(f"/register answered without a uuid: {str(answer.body)[:100]!r}")
            return answer
        if call.kind == "bench-done":
            body = {"uuid": self.uuid, "rate": call.payload.get("rate", 0.0)}
            if self.spec.bench_done_reason and call.payload.get("reason"):
                body["reason"] = call.payload["reason"]  # only for a manager that reads it (README)
            answer = client.request("POST", "/bench-done", json_body=body)
            if not isinstance(answer.body, dict) or not isinstance(answer.body.get("passed"), bool):
                raise TransientError(f"/bench-done answered without 'passed': {str(answer.body)[:100]!r}")
            return answer
        if call.kind in ("param-done", "running"):
            return client.request("POST", f"/{call.kind}", json_body={"uuid": self.uuid}, want_json=False)
        if call.kind == "log":
            return client.request("POST", "/api/log-push", data=call.payload.get("text", "").encode()[: 256 * 1024],
                                  want_json=False, headers={"X-Instance-UUID": self.uuid or "",
                                                            "X-Log-Source": call.payload.get("source", "setup"),
                                                            "Content-Type": "text/plain; charset=utf-8"})
        raise PermanentError(0, f"unknown outbox call kind {call.kind!r}")

    def _delivered(self, call: Call, answer: Answer) -> None:
        assert self.outbox is not None
        if call.kind == "register":
            body = answer.body
            self.uuid = str(body["uuid"])
            self.runner_id = str(body.get("runner_id", ""))
            self.outbox.put("uuid", self.uuid)
            self.outbox.put("runner_id", self.runner_id)
            self.rt.loop.call_soon_threadsafe(self._registered)
        elif call.kind == "bench-done" and not call.payload.get("failed"):
            passed = bool(answer.body["passed"])
            rate = float(call.payload.get("rate", 0.0))
            self.rt.loop.call_soon_threadsafe(lambda: self._bench_answered(passed, rate))

    def _refused(self, call: Call, exc: PermanentError) -> None:
        self._log(f"manager: {call.kind} refused for good: HTTP {exc.status}: {exc.body[:300]!r}")
        if call.kind == "bench-done" and self._lifecycle is not None:
            # No answer will ever come: do not hold production for the whole gate.
            for phase in self._lifecycle.phases:
                if phase.spec.report == "bench-done" and phase.hold is not None:
                    self._log("manager: starting production without the manager's verdict on the bench")
                    self._release(phase)

    def _registered(self) -> None:
        self._log(f"manager: registered: uuid {self.uuid}, runner_id {self.runner_id}")
        self._export_identity()

    def _export_identity(self) -> None:
        """Children started from now on know who they are to the manager."""
        if self.uuid:
            self.rt.base_env["INSTANCE_UUID"] = self.uuid
        if self.runner_id:
            self.rt.base_env["RUNNER_ID"] = self.runner_id

    # ------------------------------------------------------------ for the status view

    def status(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False}
        return {
            "enabled": True, "url": self.spec.url, "label": self.spec.label, "uuid": self.uuid,
            "runner_id": self.runner_id, "outbox_pending": self.outbox.pending() if self.outbox else None,
            "last_delivered": self.last_delivered, "last_error": self.last_error,
            "log_backlog": self._logs.backlog() if self._logs else {},
        }


def reached_production(lifecycle: Lifecycle) -> bool:
    """Did the production service (``report = "running"``, else the last service) ever come up?"""
    production = [p for p in lifecycle.phases if p.spec.report == "running"] or \
        [p for p in lifecycle.phases if p.spec.kind == "service"][-1:]
    return any(p.up or p.was_up for p in production)
def _plain(line: str) -> str:
    return strip_ansi(line.encode("utf-8", errors="replace")).decode("utf-8", errors="replace")


def _with_url(spec: ManagerSpec, url: str) -> ManagerSpec:
    from dataclasses import replace

    return replace(spec, url=url)
