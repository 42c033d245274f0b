"""What a plugin's ``attach`` is handed (plugin.py): narrow views and protocols that the core implements.

Never the Lifecycle, a Phase or the Reporter themselves. A plugin

- hears each phase transition as a read-only ``PhaseView``, the shutdown as a ``ShutdownView``, and every
  verdict as the ``Verdict`` object (``Events``);
- drives production by phase name through ``ProductionControl``: hold a DONE phase (the lifecycle does
  not go past it), release it, end a phase's running attempt with a reason, end the run with a status for a
  decision of the manager's;
- when a manager is configured (``Wiring.manager``; None when not), reaches it through ``ManagerLink``:
  queue a call (and say that the exit must wait for it), read what an earlier call's answer was and what
  is still pending, add a call kind to the outbox (``CallKind``), fields to the ``/register`` body and to
  what its answer is checked for, states and fields to what its row is read for (``RowFields``), push a
  durable log text, and retire the instance (given up for good);
- fails a running phase's attempt with a reason of its own (``ProductionControl.fail_phase``: its restart
  policy then decides);
- exports what later children's environment holds (``export_env``), sets timers on the loop
  (``call_later``), writes the supervisor's log, adds keys to a phase's status (``add_status``) and
  reads the machine's memory and GPUs as the core measures them (``machine``), and holds its own watches
  to the core's rule (``watch_state``: reading, blind, stopped, said and shown).

Every callback a plugin gives runs on the loop's thread, but a ``CallKind``'s ``attempt`` and ``keep``,
which run on the outbox's sender thread. The composition root (observers.py) builds the Wiring; its
``Events`` are the lifecycle's ``PluginEvents`` (lifecycle/lifecycle.py), told in their place among the
lifecycle's observers. This module imports foundations only, and those for types: it is part of the
plugin boundary (plugin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .evidence.watchstate import WatchState

# What a plugin hears and queues, defined where they belong and named here, at the plugin boundary.
from .lifecycle.states import PhaseView as PhaseView
from .lifecycle.states import ShutdownView as ShutdownView
from .manager.callkinds import CallKind as CallKind
from .manager.callkinds import Payload as Payload
from .manager.row import RowFields as RowFields
from .text import Log

if TYPE_CHECKING:  # types only
    from .config.model import Plan
    from .engine.loop import Timer
    from .lifecycle.verdict import Verdict
    from .manager.answers import FieldCheck
    from .manager.row import Row



# ---------------------------------------------------------------- what a plugin hears




class Events(Protocol):
    def on_transition(self, listener: Callable[[PhaseView], None]) -> None: ...

    def on_shutdown(self, listener: Callable[[ShutdownView], None]) -> None: ...

    def on_verdict(self, listener: Callable[[Verdict], None]) -> None: ...


# ---------------------------------------------------------------- what a plugin drives


class ProductionControl(Protocol):
    def hold(self, phase_name: str, why: str, for_s: float | None = None) -> None:
        """The lifecycle may not go past this DONE phase until ``release`` (``why`` shows in status; ``for_s``:
        how long the holder waits at most, status counts it down)."""

    def release(self, phase_name: str) -> None:
        """The hold is over: the lifecycle moves on."""

    def stop_from_outside(self, why: str, status: int) -> None:
        """A decision made outside the run (the manager's) ends it: everything stopped in reverse start order,
        then the exit with ``status``. Learnt once the run had completed (the exit flush still telling the
        manager), it is the run's status after all; a failure's status, or a stop signal's, came first and stays."""

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        """End the running attempt of phase ``name`` with ``reason`` (a verdict reason: the core's, or one the plugin
        registered in Plugin.reasons, e.g. the prover's ``proofs_failing``):
        its restart policy then decides, as for any failure. False: the phase runs no attempt now."""




class ManagerLink(Protocol):
    def reporting(self) -> bool:
        """The manager is being told: the outbox is open (False when reporting could not start)."""

    def queue(self, kind: str, payload: Payload, *, said: str = "", exit_waits_for: str | None = None) -> None:
        """Write a call into the outbox and wake its sender; logs "manager: <kind> queued<said>".
        ``exit_waits_for`` (what to call it in the log): the exit flush waits its longer window for it."""

    def delivered_answer(self, kind: str) -> Any:
        """The kept answer to the last delivered call of ``kind`` (this start or an earlier one); None if none."""

    def pending_of(self, kind: str) -> int:
        """How many calls of ``kind`` wait in the outbox (this start's or an earlier one's)."""

    def handle(self, kind: str, call: CallKind) -> None:
        """Add a call kind to the outbox's sender; before the reporting starts (attach)."""

    def add_register_fields(self, fields: Callable[[], Mapping[str, Any]]) -> None:
        """Fields the ``/register`` body carries after ``label``, in the order given."""

    def hear_register_field(self, name: str, check: FieldCheck, on_known: Callable[[str | None], None]) -> None:
        """A field of the ``/register`` answer beside the uuid: checked by ``check`` (an answer that fails it
        is retried like one without a uuid), kept with the uuid, and told to ``on_known`` whenever the
        identity is known (registered now, or kept from an earlier start)."""

    def add_row_fields(self, fields: RowFields) -> None:
        """States, times and numbers the manager's row holds for this plugin's protocol, read and checked with
        the core's fields (a row that fails them is no evidence) into ``Row.extra``; before the reporting starts."""

    def push_text(self, source: str, text: str) -> None:
        """A durable log push (through the outbox, never dropped), after what was logged before it."""

    def on_row(self, listener: Callable[[Row], None]) -> None:
        """``listener`` hears each row of this instance the manager's ``GET /status`` gave (manager/row.py Row:
        its state, times, and the fields added with add_row_fields); never a reason to wait, often none at all
        (rowwatch.py)."""

    def on_killed(self, listener: Callable[[Row], None]) -> None:
        """``listener`` hears, once, that the manager killed this instance (the lifecycle is being stopped)."""

    def clock(self, name: str) -> tuple[float, str] | None:
        """Where the manager's clock ``name`` (``"fetch"``, or the name the plugin gave a clock: Plugin.clocks,
        firstseen.py) started, epoch seconds, and what that is ("the manager's param_done_at"); None while
        nothing of it is known."""

    def deadline(self, name: str, seconds: float) -> None:
        """The manager kills the instance ``seconds`` after clock ``name`` started: status shows the time left."""

    def retire(self, reason: str) -> None:
        """This instance is given up for good (the manager destroys it: its answer said so): remembered in
        state_dir, so a later start does not run it again (givenup.py), and a uuid the manager forgets is not
        registered again."""

    def give_up(self, reason: str, kind: str, payload: Payload, *, said: str = "",
                exit_waits_for: str | None = None) -> None:
        """Ask the manager to destroy this instance with the call ``kind`` (``queue``'s arguments): retired as by
        ``retire``, the marker holding the call, then queued. A later start that finds the call neither pending nor
        sent (stopped between the two) queues it again; what else a lifecycle left pending is not sent then."""


@dataclass(frozen=True)
class Wiring:
    plan: Plan  # read-only: the plugin's own sections and table keys are in it
    events: Events
    production: ProductionControl
    manager: ManagerLink | None  # None: no manager configured
    export_env: Callable[[str, str], None]  # children started from now on get name=value
    call_later: Callable[[float, Callable[[], None]], Timer]
    log: Log
    # What status shows of a phase beside the core's keys: add_status(phase name, provider), the provider's
    # keys merged into that phase's JSON object (``summary``: a text line status shows; ``metrics``: numbers
    # /metrics serves as prover_supervisor_<name>{phase=...}). Called on the loop, at every snapshot.
    add_status: Callable[[str, Callable[[], Mapping[str, Any]]], None] = lambda name, provider: None
    # The machine as the core measures it for a phase, never a blocking call: ``memory_used``/``memory_limit``
    # (bytes: what is under the fullest limit over its cgroup, or over the supervisor's, else the machine's),
    # ``gpu_utilization`` (percent per GPU; empty once the GPUs' last reading is not current: NVML hung, samples
    # stopped).
    machine: Callable[[str], Mapping[str, Any]] = lambda name: {}
    # A watch of the plugin's own, held to the core's rule (watchstate.py): watch_state(name, window_s) is its
    # state, which it tells of each reading (read/miss); the tick says when it goes blind, status shows it.
    watch_state: Callable[[str, float], WatchState] = lambda name, window_s: WatchState(name, window_s)
    # The supervisor's last thaw (monotonic; None: never frozen, tick.py): a plugin's own clocks restart there, as
    # the core's windows do (docker pause is no silence of the program watched).
    thawed_at: Callable[[], float | None] = lambda: None
