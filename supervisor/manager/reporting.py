"""Reporting to the fleet manager: what the lifecycle tells it, failures, logs, events.

The core speaks the generic part of the manager's API (docs/manager.md): ``/register`` first (the
uuid it answers is kept in ``state_dir`` and given to every later child as ``INSTANCE_UUID``), then
the phase calls that carry only the uuid, which a phase's ``report`` key triggers: ``param-done`` when
a oneshot is done, ``running`` when a service is up; and the log pushes. A plugin adds call kinds of
its own and fields to the register body and answer through the ManagerLink it is handed (wiring.py;
the prover's fleet protocol: prover/fleet.py). Every call, and every failure report, is written to
the persisted outbox first and delivered by the sender thread (sender.py), in order, at least once:
the work never waits on the manager, and a SIGKILL of the supervisor loses nothing.

Text reaches the manager already masked (redact.py): the supervisor's own lines where they are
logged, children's output where it is read, verdicts where they are recorded (verdict.VerdictRecord).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import INSTANCE_UUID_ENV, REPORTS, ManagerSpec
from ..config.endpoint import same_origin
from ..engine.exitflush import FINISH_MIN_S, GIVE_UP_FLUSH_S, ExitFlush
from ..engine.loop import EventLoop, contained
from ..exits import EXIT_OK
from ..lifecycle.states import PhaseLike, PhaseState, PhaseView, ShutdownView
from ..lifecycle.verdict import STOPPED, Verdict
from ..state import files as state_files
from ..state import givenup
from ..text import Log
from ..text.ansi import plain, strip_ansi
from ..text.redact import Redactor, shown_url
from ..text.show import summary
from .answers import FieldCheck
from .callkinds import CallKind, Payload
from .client import ManagerClient
from .ledger import LEDGER_CALLS, ledger
from .logship import EarlyLines, EventShipper, Shipper, events_sender, log_push_sender, push_bodies
from .row import Row, RowFields
from .sender import LOG, CallKinds, Sender
from .view import ManagerView

if TYPE_CHECKING:
    from ..evidence.watchstate import WatchState
    from .outbox import Outbox

# Runs the loop while the exit flush lasts: (the flush, until what) → returns once ``until()`` is true.
FlushWait = Callable[[ExitFlush, Callable[[], bool]], None]


def core_report_due(phase: PhaseView) -> str | None:
    """The core's call this transition triggers: ``param-done`` (a oneshot done), ``running`` (a service up).
    The kinds and their triggers are the config's table (config.REPORTS), the one the ``report`` key is checked
    against; a plugin's kinds (plugin.py ``reports``) are its own to make."""
    when = REPORTS.get(phase.report or "")
    if when == "done" and phase.state is PhaseState.DONE:
        return phase.report
    if when == "up" and phase.up:
        return phase.report
    return None


class Reporter:
    """What the lifecycle tells the manager: its phase calls, failures, logs and events.

    Every call goes into the outbox (made in ``start``), which the Sender delivers; the lifecycle's
    listeners call in from the loop's thread only.
    """

    def __init__(self, spec: ManagerSpec, state_dir: Path, loop: EventLoop, log: Log,
                 export_env: Callable[[str, str], None], redactor: Redactor, early: EarlyLines | None = None) -> None:
        self.spec = spec
        self._loop = loop
        self._log = log
        self._export_env = export_env
        self._redactor = redactor
        self._final_status: dict[str, Any] | None = None  # its status as it stopped (status() after the stop)
        self.enabled = spec.url is not None
        self.calls = CallKinds()  # every call kind the sender delivers (a plugin adds to them before start)
        # The plugin's hearers of the register answer's fields (hear_register_field), told after the clocks.
        self._register_fields_heard: list[Callable[[Mapping[str, str | None]], None]] = []
        self.outbox: Outbox | None = None
        self._sender: Sender | None = None  # delivers the outbox (made with it, in start)
        self._logs: Shipper | None = None
        self._events: EventShipper | None = None
        self._reported: set[str] = set()  # the core's report kinds queued by this start
        # Per log source, the id of the last durable push of it (outbox): while it is pending, the log shipper
        # holds that source's later lines behind it (logship.py says why holding). Written on the loop's thread,
        # read on the shipper's; an entry is never removed (a removal could race with a newer push's entry).
        self._last_durable: dict[str, int] = {}
        self._sender_runs = True  # the outbox's sender thread started (until start says it could not)
        self._exit_waits: list[tuple[int, str]] = []  # calls the exit flush waits longer for: (id, what)
        self._state_dir = state_dir
        # The manager's own view of this instance (manager/view.py): its row, a kill, a registration again.
        self.view = ManagerView(log, self.push_text, self.retire, lambda: self.outbox)
        # The supervisor's own lines, held by ``early`` until start() has made the shipper.
        self._early = early
        if early is not None and not self.enabled:
            early.hand_to(None)

    def watch_states(self) -> tuple[WatchState, ...]:
        """The watches of the manager's side that say their own lines (its row, read now and then, on the sender's
        thread), for status to show with the others."""
        return (self._sender.rows.state,) if self._sender is not None else ()

    def shipping_watches(self) -> tuple[WatchState, ...]:
        """The shippers' own watches (log shipping, event shipping: logship.py), said by the tick like the
        evidence's watches and shown with them; none before start, nor for a shipper whose thread did not start."""
        return tuple(shipper.state for shipper in (self._logs, self._events) if shipper is not None)

    def link(self) -> ReporterLink:
        """What a plugin may do with the manager (wiring.ManagerLink)."""
        return ReporterLink(self)

    # ------------------------------------------------------------ start and stop

    def start(self, given_up: givenup.GivenUp | None = None) -> None:
        """Open the outbox, know who we are, start the threads. ``given_up``: an earlier start gave this instance up
        (givenup.py): only what it left is delivered, the give-up's own call among it (Sender.retired_before)."""
        if not self.enabled:
            self._log("manager reporting off: no [manager] url and no MANAGER_URL")
            return
        assert self.spec.url is not None
        from .outbox import Outbox  # sqlite3 with it: 1 MiB that a supervisor with no manager never needs

        self.outbox = Outbox(state_files.path(self._state_dir, state_files.OUTBOX), self._log)
        if self.outbox.corrupt_note:
            self._log(self.outbox.corrupt_note)
        token = os.environ.get(self.spec.token_env) if self.spec.token_env else None
        client = ManagerClient(self.spec, token, warn=self._log)
        self._sender = Sender(self.spec, self.outbox, client, self._loop, self._log, self.calls,
                              on_identity=self._export_identity, on_delivered=self._manager_answers,
                              view=self.view, on_give_up_refused=self._give_up_refused)
        self._sender.restore_identity(given_up is not None)
        if given_up is not None:
            give_up = self._sender.retired_before(given_up.call, f"this instance was given up ({given_up.reason})",
                                                  given_up.names_its_call)
            if give_up is not None:
                self._exit_waits.append((give_up, "the give-up"))
        fields = "".join(f", {k} {_shown(v)}" for k, v in self._sender.identity().items() if k != "label")
        self._log(f"manager: {shown_url(self.spec.url)} as label {self.spec.label!r}{fields}; "
                  f"outbox {self.outbox.path} ({self.outbox.pending()} call(s) pending)")
        self._hold_behind_pending()
        self._logs = Shipper("log shipping", log_push_sender(client, lambda: self.uuid), lambda: bool(self.uuid),
                             self.spec.log_push_interval_s, self.spec.log_backlog_bytes, self._log,
                             on_back=self._sender.retry_now, held=self._holds, waits_on=self._why_no_uuid)
        if self._early is not None:
            # A shipper that raises costs the manager lines, never the supervisor's own log.
            self._early.hand_to(contained(self.ship_own_line, lambda exc: self._loop.faults.report(
                "shipping the supervisor's own lines", exc)))
        if not self._start_thread("log shipping", self._logs.start, "the children's output is not shipped"):
            self._logs = None
        if self.spec.events_url:
            # The token is the manager's: an events sink on another origin (Loki, a webhook) gets only the
            # credentials of its own URL, as an HTTP client drops Authorization on a redirect to another host.
            events_token = token if same_origin(self.spec.url, self.spec.events_url) else None
            events_client = ManagerClient(replace(self.spec, url=self.spec.events_url), events_token, warn=self._log)
            self._events = EventShipper(events_sender(events_client), self._event_stamp,
                                        self.spec.log_push_interval_s, self.spec.log_backlog_bytes, self._log)
            if not self._start_thread("events", self._events.start, "no events are sent"):
                self._events = None
        # Without its thread no durable push goes: a source held behind one would be held for the whole run.
        self._sender_runs = self._start_thread("the outbox's sender", self._sender.start,
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

    def _why_no_uuid(self) -> str:
        """Why the log pushes wait (the shipper's ``waits_on``, on its thread): no uuid yet, and the sender's latest
        error, which while no uuid is known is the register's (it goes first)."""
        error = self._sender.last_error if self._sender is not None else None
        return "no instance uuid yet: the manager has not answered /register" + (f" ({error})" if error else "")

    def reporting(self) -> bool:
        return self.enabled and self.outbox is not None

    def stop(self, status: int, why: str, wait: FlushWait) -> None:
        """The supervisor is exiting: say so, let the outbox drain while ``wait`` runs the loop (see
        exitflush.py for how long), then end the threads and close the outbox.

        The loop must still run meanwhile: the sender's retries and answers are handed back into it."""
        if not self.enabled or self.outbox is None or self._sender is None:
            return
        sender, outbox = self._sender, self.outbox
        self.push_text("setup", f"prover-supervisor exiting with status {status}: {why}")
        self.event("supervisor", state="exiting", status=status, why=why)
        waited_for = [what for call_id, what in self._exit_waits if outbox.is_pending(call_id)]
        flush = ExitFlush(outbox.pending, sender.alive, status, bool(waited_for),
                          failures=lambda: sender.failed_attempts,
                          waited_for=lambda: any(outbox.is_pending(call_id) for call_id, _ in self._exit_waits))
        if waited_for and sender.alive():
            self._log(f"manager: waiting up to {GIVE_UP_FLUSH_S:g}s for {waited_for[0]} to be delivered")
        # A call being retried goes now, and is retried often from now on: its wait (up to 30 s of backoff) would
        # outlast the flush, and a manager back meanwhile would hear nothing.
        sender.flushing()
        wait(flush, flush.over)
        sender.ask_to_stop()
        flush.finish()
        shippers = self._stop_shippers(flush)
        wait(flush, lambda: flush.finished() or not (shippers() or sender.alive()))
        left_s = flush.budget_left_s()
        if left_s is not None and flush.ended_by is None and (shippers() or sender.alive()):
            self._log(f"manager: the exit flush stopped at the stop budget's deadline, {abs(left_s):.2f}s "
                      f"{'before' if left_s >= 0 else 'past'} its end (docker stop's SIGKILL): the call or push in "
                      "flight is left to its thread")
        self._keep_held_lines()
        for shipper in (self._logs, self._events):
            if shipper is not None:
                shipper.say_lines_left()
        # Counted once the held lines are in (calls the next start delivers too); the lines said here follow them
        # where their source is held.
        left = outbox.pending()
        if left and outbox.in_memory:  # (the close tries the file once more, and says whether they are lost)
            self._log(f"manager: {left} call(s) not delivered yet, kept in memory ({outbox.path} cannot be written): "
                      "they reach the next start only if the file takes them at the close")
        elif left:
            self._log(f"manager: {left} call(s) not delivered yet; they stay in the outbox for the next start")
        self._keep_held_lines()
        self._final_status = self.status()  # what the exit's last status.json shows: the outbox is closed next
        outbox.close()

    def _keep_held_lines(self) -> None:
        """The exit: lines the shipper still holds behind a durable push the outbox did not deliver go into the
        outbox behind it, for the next start to deliver in order (the shipper would never push them)."""
        logs = self._logs
        if logs is None:
            return
        for source in logs.backlog():
            if self._holds(source):
                self._move_queued_lines(source)

    def _stop_shippers(self, flush: ExitFlush) -> Callable[[], bool]:
        """Each shipper's last push (each stop blocks), on a thread of its own so that the loop keeps
        running; inline where no thread can be had. Returns "still at it"."""
        logs, events = self._logs, self._events
        within_s = max(FINISH_MIN_S, flush.seconds_left())
        stoppers: list[Callable[[], None]] = []
        if logs is not None:
            stoppers.append(lambda: logs.stop(flush.finish_s(within_s)))
        if events is not None:
            stoppers.append(lambda: events.stop(flush.finish_s(1.0)))
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

    def phase_changed(self, phase: PhaseLike) -> None:
        view = PhaseView.of(phase)
        self.event("transition", phase=view.name, state=str(view.state), why=view.why, attempt=view.attempt,
                   up=view.up)
        kind = core_report_due(view) if self.enabled else None
        if kind is not None and kind not in self._reported:
            self._reported.add(kind)
            self.queue(kind, {})

    def shutdown_began(self, view: ShutdownView) -> None:
        """The lifecycle shuts down for a failure: the reason goes out first (a plugin's shutdown listeners,
        the give-up among them, come after this one)."""
        if view.status != EXIT_OK:
            self.push_text("setup", f"prover-supervisor stopping: {view.why}")

    def verdict(self, verdict: Verdict) -> None:
        self.event("verdict", **verdict.to_dict())
        if verdict.success or verdict.reason == STOPPED or not self.reporting():
            return  # (push_text would drop it: no line is made for a manager that is not told)
        lines = [f"prover-supervisor: FAILED: {verdict.line()}"]
        # The child's own lines, as the manager's dashboard must show them: no colour codes.
        lines += [f"  | {plain(line)}" for line in verdict.last_lines]
        self.push_text("setup", "\n".join(lines))

    # ------------------------------------------------------------ calls and lines

    def queue(self, kind: str, payload: Payload, *, said: str = "", exit_waits_for: str | None = None) -> None:
        """Into the outbox, then the sender is woken (see wiring.ManagerLink.queue)."""
        if not self.reporting():
            return
        assert self.outbox is not None
        call_id = self.outbox.add(kind, dict(payload))
        if exit_waits_for is not None:
            self._exit_waits.append((call_id, exit_waits_for))
        self._wake_sender()
        self._log(f"manager: {kind} queued{said}")

    def push_text(self, source: str, text: str) -> None:
        """A durable log push (failures, the supervisor's exit): through the outbox, never dropped. ``text``
        needs no mask here: a verdict masked where it entered, or the supervisor's own words about the
        shutdown (phase and child names, signal names, numbers)."""
        if self.enabled and self.outbox is not None:
            self._move_queued_lines(source)
            # In pushes the manager keeps whole: it drops what is past 256 KiB of one, and a verdict's reason is
            # in the last of the lines quoted under it.
            for body in push_bodies(text):
                self._add_durable(source, body)
            self._wake_sender()

    def _move_queued_lines(self, source: str) -> None:
        """Lines of ``source`` still waiting in the log shipper go into the outbox first, so the durable
        line arrives after what was logged before it (the two travel by different threads). Not without the
        outbox's thread: nothing holds the source then, and numbered lines left pending for the next start would
        come after the higher numbers the shipper pushes meanwhile (a manager that keeps the highest drops them)."""
        if self._logs is None or self.outbox is None or not self._sender_runs:
            return
        for chunk, seq in self._logs.take_all(source):
            self._add_durable(source, chunk, seq)

    def _add_durable(self, source: str, body: str, seq: str = "") -> None:
        """One durable push into the outbox; the shipper holds ``source`` until it is delivered. ``seq``: the
        numbers of the shipper's lines it carries (none for the supervisor's own words, never numbered)."""
        assert self.outbox is not None
        payload = {"source": source, "text": body} | ({"seq": seq} if seq else {})
        self._last_durable[source] = self.outbox.add(LOG, payload)

    def _hold_behind_pending(self) -> None:
        """The durable pushes an earlier start left pending come before this start's lines of their source."""
        assert self.outbox is not None
        for call in self.outbox.pending_calls(LOG):
            self._last_durable[str(call.payload.get("source", "setup"))] = call.id

    def _holds(self, source: str) -> bool:
        """The log shipper's ``held`` (its thread): a durable push of ``source`` is still in the outbox. The
        outbox delivers in order: once the last one is no longer pending, no earlier one is."""
        call_id = self._last_durable.get(source)
        outbox = self.outbox
        return call_id is not None and outbox is not None and self._sender_runs and outbox.holds(call_id)

    def ship_lines(self, source: str, label: str, lines: list[bytes]) -> None:
        """A child's output lines (masked where they entered, logs.ChildOutput): best effort, batched,
        bounded. Each carries the child's label as the console shows it (``[phase/name] ...``): a child
        that prints what reads like the supervisor's own line (``[supervisor] FAILED: ...``) cannot
        pass for it in the manager's tabs."""
        if self._logs is not None:
            head = f"[{label}] "
            self._logs.add(source, [head + strip_ansi(line).decode("utf-8", errors="replace") for line in lines])

    def ship_own_line(self, message: str) -> None:
        """One of the supervisor's own lines (masked where it was logged; the verdicts' lines never come
        here: logs.Unshipped)."""
        self.view.recent.add(message)
        if self._logs is not None:
            self._logs.add("setup", [f"[supervisor] {message}"])

    def event(self, kind: str, **fields: Any) -> None:
        if self._events is not None:
            self._events.event(kind, **fields)

    def _event_stamp(self) -> dict[str, Any]:
        """What every event carries besides its own fields (the events shipper's notes of drops too)."""
        return {"label": self.spec.label, "uuid": self.uuid}

    def _wake_sender(self) -> None:
        if self._sender is not None:
            self._sender.wake()

    def retire(self, reason: str, call: tuple[str, Payload] | None = None) -> None:
        """Given up for good (wiring.ManagerLink.retire, give_up): the marker first, durably, with the call that
        tells the manager (queued next, by give_up), then the sender knows."""
        try:
            givenup.remember(self._state_dir, reason, self.spec.label, call)
        except OSError as exc:
            self._log(f"manager: cannot remember the give-up in {givenup.marker(self._state_dir)} "
                      f"({exc.strerror or exc}): a restart on this state_dir would run the lifecycle again")
        if self._sender is not None:
            self._sender.retire(call)

    def _give_up_refused(self, kind: str, why: str) -> None:
        """The give-up's call was refused for good: the manager was not told, and nothing will destroy the machine.
        Said plainly, and in the marker, which said until now that the call asked the manager to."""
        line = f"the manager refused the give-up's {kind} for good ({why}): this instance was NOT destroyed"
        self._log(f"manager: {line}; nothing here asks again: destroy it by hand")
        try:
            givenup.amend(self._state_dir, line)
        except OSError as exc:
            self._log(f"manager: cannot say so in {givenup.marker(self._state_dir)} ({exc.strerror or exc})")

    def give_up(self, reason: str, kind: str, payload: Payload, *, said: str = "",
                exit_waits_for: str | None = None) -> None:
        """Retired, then the call that gives the instance up is queued (wiring.ManagerLink.give_up)."""
        if not self.reporting():
            return
        self.retire(reason, (kind, dict(payload)))
        self.queue(kind, payload, said=said, exit_waits_for=exit_waits_for)

    def _manager_answers(self) -> None:
        """A call was delivered (the sender's thread): the log shipper's backoff is over too."""
        logs = self._logs
        if logs is not None:
            logs.manager_answers()

    def _export_identity(self, uuid: str, fields: Mapping[str, str | None]) -> None:
        """Children started from now on know who they are to the manager; then, in this order, the instance's
        clocks hear that the manager knows it (registered now, or kept from before), and the plugin hears the
        register answer's fields it asked for (hear_register_field)."""
        self._export_env(INSTANCE_UUID_ENV, uuid)
        if self.view.first_seen is not None:
            self.view.first_seen.registered()
        for listener in self._register_fields_heard:
            listener(fields)

    def hear_register_field(self, name: str, check: FieldCheck, on_known: Callable[[str | None], None]) -> None:
        self.calls.add_answer_field(name, check)
        self._register_fields_heard.append(lambda fields: on_known(fields.get(name)))

    # ------------------------------------------------------------ for the status view

    def status(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False}
        if self._final_status is not None:  # stopped: its outbox is closed
            return self._final_status
        sender, logs = self._sender, self._logs
        push_error = logs.error if logs else None
        return {
            "enabled": True, "url": shown_url(self.spec.url or ""), "label": self.spec.label, "uuid": self.uuid,
            **{name: sender.fields.get(name) if sender else None for name in self.calls.answer_fields},
            "outbox_pending": self.outbox.pending() if self.outbox else None,
            "last_delivered": sender.last_delivered if sender else None,
            # The manager's own words (an answer's body), which come from outside: masked here.
            "last_error": self._redactor.text(sender.last_error) if sender and sender.last_error else None,
            "last_error_at": sender.last_error_at if sender and sender.last_error else None,
            "ledger": ledger(self.outbox.history(LEDGER_CALLS, without=LOG), self._redactor.text)
            if self.outbox else [],
            "log_backlog": self._logs.backlog() if self._logs else {},
            # The latest push the log shipper could not deliver (cleared by the next delivered; its watch, in
            # ``watches``, says since when none was), masked: the manager's own words. And what its full backlogs
            # dropped, per source.
            "log_push_error": self._redactor.text(push_error[0]) if push_error else None,
            "log_push_error_at": push_error[1] if push_error else None,
            "log_dropped": logs.dropped() if logs else {},
            **self.view.status(self._redactor.text),
        }


class ReporterLink:
    """wiring.ManagerLink over the Reporter: what a plugin may do with the manager, and nothing more."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter

    def reporting(self) -> bool:
        return self._reporter.reporting()

    def queue(self, kind: str, payload: Payload, *, said: str = "", exit_waits_for: str | None = None) -> None:
        self._reporter.queue(kind, payload, said=said, exit_waits_for=exit_waits_for)

    def delivered_answer(self, kind: str) -> Any:
        outbox = self._reporter.outbox
        return outbox.delivered_answer(kind) if outbox is not None else None

    def pending_of(self, kind: str) -> int:
        outbox = self._reporter.outbox
        return outbox.pending_of(kind) if outbox is not None else 0

    def handle(self, kind: str, call: CallKind) -> None:
        self._reporter.calls.add(kind, call)

    def add_register_fields(self, fields: Callable[[], Mapping[str, Any]]) -> None:
        self._reporter.calls.add_register_fields(fields)

    def hear_register_field(self, name: str, check: FieldCheck, on_known: Callable[[str | None], None]) -> None:
        self._reporter.hear_register_field(name, check, on_known)

    def add_row_fields(self, fields: RowFields) -> None:
        self._reporter.calls.row = self._reporter.calls.row.merged(fields)

    def push_text(self, source: str, text: str) -> None:
        self._reporter.push_text(source, text)

    def retire(self, reason: str) -> None:
        self._reporter.retire(reason)

    def give_up(self, reason: str, kind: str, payload: Payload, *, said: str = "",
                exit_waits_for: str | None = None) -> None:
        self._reporter.give_up(reason, kind, payload, said=said, exit_waits_for=exit_waits_for)

    def on_row(self, listener: Callable[[Row], None]) -> None:
        self._reporter.view.on_row(listener)

    def on_killed(self, listener: Callable[[Row], None]) -> None:
        self._reporter.view.on_killed(listener)

    def clock(self, name: str) -> tuple[float, str] | None:
        return self._reporter.view.clock(name)

    def deadline(self, name: str, seconds: float) -> None:
        self._reporter.view.deadlines[name] = seconds


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)

