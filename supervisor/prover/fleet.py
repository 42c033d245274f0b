"""The fleet protocol: what the prover adds to the core's manager reporting (docs/manager.md).

The core registers the instance (``/register``: label → uuid) and sends ``param-done``, ``running``
and the log pushes. The prover adds, through the Wiring it is attached with (wiring.py):

- ``min_rate`` in the ``/register`` body, and the answer's ``runner_id`` (a whole number, checked
  like the uuid), kept with it and given to every later child as ``RUNNER_ID``;
- the report kind ``bench-done``: when the bench phase is done, its rate (from the bench parser's
  result) goes to the manager, once per instance: not again after a restart if it was delivered
  and passed, or is still queued (a second one would move a running instance back to bench_done);
- the bench gate (gate.py): production waits for the manager's answer, ``bench_gate_s`` at most;
  ``passed: false`` shuts the run down with EXIT_BENCH_REJECTED. A bench-done sent again under the new
  uuid of a forgotten row (sender.py) is not judged again: its ``passed: false`` is the new row's kill
  (its min_rate above the old row's), ended as the manager's kill (EXIT_KILLED, its kill_reason);
- the give-up: a lifecycle that fails for good asks the manager to destroy the instance now: before
  production was ever up, and after it was up too (production failed past its restart policy,
  proofs kept failing, a GPU fault: an instance billed for days that proves nothing is worth less
  than a new one). Its API destroys an instance on one call only, ``bench-done`` with a
  rate below min_rate, so that is sent with rate 0, after the failure's reason lines, and the exit
  flush waits longer for it (exitflush.GIVE_UP_FLUSH_S). Not after ``passed: false`` (the manager
  killed it already), not with ``give_up_on_failure = false``. With ``bench_done_reason`` the
  failure's verdict line goes along in a ``reason`` field, for a manager that reads it. A give-up, and
  the manager's ``passed: false``, retire the instance (ManagerLink.retire: remembered in state_dir, so
  a restart does not run it again: the manager's bench-done has no state check and would un-kill it);
- production that ends cleanly and is not restarted (``restart = "on-failure"`` or ``"no"``: the profile's curio
  has ``"always"``) is said to the manager's setup log at once: nothing proves any more, and its row, which no
  call but the give-up changes, still says running.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import RUNNING
from ..lifecycle.states import PhaseState
from ..manager.answers import AnswerError, answered
from ..manager.client import Answer, ManagerClient, TransientError
from ..text import Log
from ..wiring import CallKind, Payload, RowFields
from .configkeys import DEFAULT_MIN_RATE, MIN_RATE_MAX
from .gate import BenchGate

if TYPE_CHECKING:
    from ..config.model import Plan
    from ..manager.row import Row
    from ..wiring import ManagerLink, PhaseView, ShutdownView, Wiring

BENCH_DONE = "bench-done"
RUNNER_ID = "runner_id"
RUNNER_ID_ENV = "RUNNER_ID"  # what every child started after the answer finds it in (Plugin.register_env)
# The give-up's optional ``reason`` field (bench_done_reason): one line, cut to this many characters.
REASON_MAX_CHARS = 1000
# The manager keeps runner ids in an SQLite integer column.
RUNNER_ID_MAX = 2**63 - 1
RUNNER_ID_MAX_DIGITS = len(str(RUNNER_ID_MAX))
# What the fleet protocol adds to the manager's row (shared/domain/manager-api.md): the benchmark's state and its
# time, the rate the bench reported, the min_rate the label first registered with (read into Row.extra by these names).
MIN_RATE = "min_rate"
FLEET_ROW = RowFields(states=("bench_done",), times=("bench_done_at",),
                      numbers={MIN_RATE: MIN_RATE_MAX, "bench_rate": MIN_RATE_MAX})


def row_min_rate(row: Row) -> float | None:
    """The min_rate the manager's row holds (None: the row does not say); one of 0 or less is its 50, as it
    reads it (shared/domain/manager-api.md: "min_rate <= 0 means 50")."""
    rate = row.extra.get(MIN_RATE)
    return DEFAULT_MIN_RATE if rate is not None and rate <= 0 else rate


@dataclass(frozen=True)
class FleetSettings:
    """The fleet protocol's keys of ``[manager]`` (and ``$MIN_RATE``)."""

    min_rate: float
    bench_gate_s: float
    give_up_on_failure: bool
    bench_done_reason: bool
    bench_deadline_s: float = 0.0  # the manager's benchmark timeout (benchlimits.py); 0: none


def fleet_settings(plan: Plan) -> FleetSettings:
    """The one place the prover reads its keys of the plan's [manager] table (configkeys.FLEET_KEYS, checked
    at load; without them, as for a plan loaded without the prover, nobody speaks the fleet protocol)."""
    keys = plan.extensions.get("manager", {})
    return FleetSettings(float(keys.get(MIN_RATE, DEFAULT_MIN_RATE)), float(keys.get("bench_gate_s", 0.0)),
                         bool(keys.get("give_up_on_failure", False)), bool(keys.get("bench_done_reason", False)),
                         float(keys.get("bench_deadline_s", 0.0)))


# ---------------------------------------------------------------- the answers, checked (answers.py's rules)


def check_runner_id(value: Any) -> str | None:
    """A whole number in 0..RUNNER_ID_MAX, or ASCII digits of one; None or absent: no runner id. A JSON number
    written with a point (``7.0``, a manager whose number is a float) is the whole number it is."""
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise AnswerError(f"runner_id is not a whole number: {answered(value)}")
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= RUNNER_ID_MAX_DIGITS):
            raise AnswerError(f"runner_id is not a whole number: {answered(value)}")
        value = int(value)
    if not 0 <= value <= RUNNER_ID_MAX:
        raise AnswerError(f"runner_id out of range 0..{RUNNER_ID_MAX}: {answered(value)}")
    return str(value)


def bench_answer(body: Any) -> bool:
    """``/bench-done``'s ``{"ok": true, "passed": true}`` → passed; it must be a JSON boolean."""
    if not isinstance(body, dict) or not isinstance(body.get("passed"), bool):
        raise AnswerError(f"without a boolean 'passed': {answered(body)}")
    return body["passed"]


def bench_done_call(settings: FleetSettings, answered: Callable[[bool, float], None],
                    refused: Callable[[], None], rejected: Callable[[str], None] = lambda why: None) -> CallKind:
    """The outbox's ``bench-done``: the rate (and the reason, if asked), the answer's ``passed``, and what it
    means: ``answered(passed, rate)``, or ``refused()`` when refused for good (no answer will ever come);
    ``rejected(why)`` on ``passed: false`` (the manager killed the instance: it is retired)."""

    def attempt(client: ManagerClient, payload: Payload, uuid: str | None) -> Answer:
        body = {"uuid": uuid, "rate": payload.get("rate", 0.0)}
        if settings.bench_done_reason and payload.get("reason"):
            body["reason"] = payload["reason"]  # only for a manager that reads it (docs/manager.md)
        answer = client.request("POST", "/bench-done", json_body=body)
        try:
            passed = bench_answer(answer.body)
        except AnswerError as exc:
            raise TransientError(f"the manager answered /bench-done {exc}") from None
        return Answer(answer.status, {"passed": passed})

    def delivered(payload: Payload, kept: Any) -> None:
        if kept["passed"] is False and not payload.get("failed"):  # (a give-up was retired as it was queued)
            rejected(f"the manager answered bench-done passed: false (rate {float(payload.get('rate', 0.0)):g}/h)")
        if not payload.get("failed"):  # a give-up has no production to let through or stop
            answered(kept["passed"], float(payload.get("rate", 0.0)))

    def again(payload: Payload, kept: Any) -> str | None:
        """Sent again under a new uuid (the manager forgot the row it passed on): the gate heard its first answer
        and is not told again; passed: false from the new row (its min_rate, this instance's, above the old row's
        that the rate passed) is the manager's kill of it, and of the machine."""
        if kept["passed"]:
            return None
        return (f"bench-done, sent again under the new uuid of a forgotten row, was answered passed: false (rate "
                f"{float(payload.get('rate', 0.0)):g}/h): the manager kills the instance on it")

    # A lifecycle call: the row is read first, and a killed row gets none (its passing rate would un-kill it).
    return CallKind(attempt, delivered=delivered, refused=lambda payload: refused(), checks_row=True, again=again)


# ---------------------------------------------------------------- the give-up, decided


class GiveUp(enum.Enum):
    NO_FAILURE = "no failure"  # a stop signal, a completed run, the manager's own rejection
    SWITCHED_OFF = "give_up_on_failure = false"
    ALREADY_KILLED = "the manager answered passed: false"
    GIVE_UP = "give up"


def decide_give_up(failed: bool, give_up_on_failure: bool, last_answer: Any) -> GiveUp:
    """Whether a lifecycle shutting down gives the instance up: ``failed`` (a failure for good, status not 0),
    the switch, and the manager's last answer to bench-done (None: none). Whether production was ever up
    no longer matters: production that failed for good after it was up is given up too."""
    if not failed:
        return GiveUp.NO_FAILURE
    if not give_up_on_failure:
        return GiveUp.SWITCHED_OFF
    if isinstance(last_answer, dict) and last_answer.get("passed") is False:
        return GiveUp.ALREADY_KILLED
    return GiveUp.GIVE_UP


# ---------------------------------------------------------------- the protocol, driven by the lifecycle's events


class Fleet:
    """bench-done, its gate and the give-up, for one run; hears the lifecycle through the Wiring."""

    def __init__(self, settings: FleetSettings, link: ManagerLink, gate: BenchGate,
                 log: Log) -> None:
        self._settings = settings
        self._link = link
        self._gate = gate
        self._log = log
        self._queued = False  # this start queued a bench-done, or found one of an earlier start pending
        self._killed: str | None = None  # the manager's row said killed: its kill line

    def transition(self, phase: PhaseView) -> None:
        """The bench phase is done: report its rate and hold production for the answer. Production that ended
        cleanly, not to be restarted, is said to the manager."""
        if phase.state is not PhaseState.DONE or not self._link.reporting():
            return
        if phase.report == RUNNING and phase.was_up:
            # (restart = "on-failure" or "no": nothing proves from now on, and the manager's row, which only a
            # give-up changes, still says running; its setup log is where it hears it)
            self._log(f"manager: production is over: phase {phase.name}: {phase.why}; this instance proves no "
                      "more, and the manager's row still says running")
            return
        if phase.report != BENCH_DONE:
            return
        if self._already_reported(phase.name):
            return
        rate = getattr(phase.parsed, "rate_per_hour", None)
        if rate is None:  # (the config refuses such a phase: a parse other than cuzk-bench's)
            # A rate of 0 would have the manager destroy an instance whose bench passed: not sent.
            self._log(f"manager: phase {phase.name} is done but its output gave no rate; bench-done not sent")
            return
        if not self._queued:
            self._queued = True
            self._link.queue(BENCH_DONE, {"rate": rate}, said=f" (rate {rate:g}/h)")
        self._gate.hold(phase.name)

    def _already_reported(self, phase_name: str) -> bool:
        """After a restart: this uuid's bench-done is already queued, or was accepted. Sending another
        would move a running instance back to bench_done (and a slower re-run could get it killed)."""
        answer = self._link.delivered_answer(BENCH_DONE)
        if isinstance(answer, dict) and answer.get("passed") is True:
            self._log("manager: bench-done was delivered and passed before this restart; not sent again")
            return True
        if self._link.pending_of(BENCH_DONE):
            self._log("manager: a bench-done from before this restart is still queued; waiting for its answer")
            self._queued = True
            self._gate.hold(phase_name)
            return True
        return False

    def killed(self, row: Row) -> None:
        """The manager killed the instance (its row): no bench-done of ours goes out any more."""
        self._killed = row.kill_line()

    def shut_down(self, view: ShutdownView) -> None:
        """The lifecycle failed for good (before production, or after it was up): ask the manager to destroy
        the instance now.

        Called as the lifecycle shuts down, after the failure's verdict and the "stopping" line went
        into the outbox: the manager has the reason in its log before the instance is gone. Without
        this it keeps paying for the instance until its 45 or 90 min timeout."""
        if not self._link.reporting():
            return
        if self._killed is not None:  # its word is final: a bench-done now would only overwrite its kill_reason
            self._log(f"manager: not giving the instance up: {self._killed}")
            return
        answer = self._link.delivered_answer(BENCH_DONE)
        decision = decide_give_up(view.failure is not None and view.status != 0, self._settings.give_up_on_failure,
                                  answer)
        if decision is GiveUp.SWITCHED_OFF:
            self._log("manager: not giving the instance up (give_up_on_failure = false); the manager's timeout "
                      "will end it")
        if decision is not GiveUp.GIVE_UP or view.failure is None:
            return
        # A bench that passed does not keep an instance that will never prove: production never came
        # up and the supervisor is exiting, and today's manager has no timeout for bench_done. It kills
        # on any bench-done below min_rate, whatever the state, so a second one gives it up too.
        passed_before = self._queued or isinstance(answer, dict)
        reason = view.failure.line()[:REASON_MAX_CHARS]  # (masked: the verdict was, where it was recorded)
        # Remembered with its call before the call is queued: a restart must not run (and un-kill) this instance
        # again, and queues the call if a SIGKILL came between the two.
        payload = {"rate": 0.0, "failed": True, "reason": reason}
        self._queued = True
        self._link.give_up(f"{view.why}: {view.failure.reason}; bench-done with rate 0 asked the manager to "
                           "destroy it", BENCH_DONE, payload, said=" (rate 0/h)", exit_waits_for="the give-up")
        if view.production_was_up:
            after = "; production was up, and failed for good"
        else:
            after = "; the bench had passed, but production never came up" if passed_before else ""
        self._log(f"manager: giving the instance up ({view.why}): bench-done with rate 0 after the reason line{after}")


def attach(wiring: Wiring) -> None:
    """The prover's Plugin.attach: the fleet protocol on the core's reporting (nothing without a manager)."""
    link = wiring.manager
    if link is None:
        return
    settings = fleet_settings(wiring.plan)
    gate = BenchGate(settings.bench_gate_s, settings.min_rate, wiring.production, wiring.call_later, wiring.log)
    fleet = Fleet(settings, link, gate, wiring.log)
    link.handle(BENCH_DONE, bench_done_call(settings, gate.answered, gate.refused, link.retire))
    link.add_register_fields(lambda: {MIN_RATE: settings.min_rate})
    link.add_row_fields(FLEET_ROW)
    link.hear_register_field(RUNNER_ID, check_runner_id,
                             lambda runner_id: wiring.export_env(RUNNER_ID_ENV, runner_id) if runner_id else None)
    link.on_killed(fleet.killed)
    link.on_row(lambda row: gate.heard_min_rate(row_min_rate(row)))  # the manager judges by its row's min_rate
    wiring.events.on_transition(fleet.transition)
    wiring.events.on_shutdown(fleet.shut_down)
