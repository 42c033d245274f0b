"""Who reacts to what the lifecycle decides: ``Observers``, one record of named places (resume.json, the
instance's clocks, the reporter, the plugin, the timeline, the first writes of a shutdown, status.json), told
in the order its fields are written; the composition root fills them (app/observers.py). ``PluginEvents`` is
the plugin's place: its listeners hear frozen views. ``tell_each``: one that raises costs only itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engine.loop import EventLoop, Faults, Timer, name_of
from .states import FINAL_STATES, NOBODY, Deaf, PhaseLike, PhaseView, ShutdownView
from .verdict import Verdict


class Hears(Protocol):
    """An observer of the lifecycle: what it hears of a phase's move (or its service up, or a kept daemon
    dead), of a verdict recorded, of the shutdown. Each observer has the three, the ones it has no use for
    doing nothing (``Deaf``)."""

    def phase_changed(self, phase: Any) -> None: ...

    def verdict(self, verdict: Verdict) -> None: ...

    def shutting_down(self, view: ShutdownView) -> None: ...


class StatusFile(Protocol):
    """status.json (status/file.py's StateFile): told once per batch of changes; ``what``, a phase that
    reached its end, is written at once even past the file's burst."""

    def changed(self, what: object = None) -> None: ...


class PluginEvents(Deaf):
    """What a plugin hears (wiring.Events): its listeners, added at its ``attach``, hear frozen views,
    never the Phase. The failure in a ShutdownView is the recorded verdict, masked where it was recorded
    (VerdictRecord): a give-up may quote it to the manager as it is."""

    def __init__(self, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        self._transition: list[Callable[[PhaseView], None]] = []
        self._shutdown: list[Callable[[ShutdownView], None]] = []
        self._verdict: list[Callable[[Verdict], None]] = []

    # What the plugin calls (wiring.Events).
    def on_transition(self, listener: Callable[[PhaseView], None]) -> None:
        self._transition.append(listener)

    def on_shutdown(self, listener: Callable[[ShutdownView], None]) -> None:
        self._shutdown.append(listener)

    def on_verdict(self, listener: Callable[[Verdict], None]) -> None:
        self._verdict.append(listener)

    # What the observers tell it: each listener in the order it was added, one that raises costing only itself.
    def phase_changed(self, phase: PhaseLike) -> None:
        if self._transition:
            view = PhaseView.of(phase)
            tell_each(self.faults, "listener", self._transition, view, phase=view.name)

    def verdict(self, verdict: Verdict) -> None:
        tell_each(self.faults, "verdict listener", self._verdict, verdict, phase=verdict.phase)

    def shutting_down(self, view: ShutdownView) -> None:
        tell_each(self.faults, "shutdown listener", self._shutdown, view)


@dataclass
class Observers:
    """Who reacts to what the lifecycle decides, each by name, told in the order of the fields below (the
    composition root fills them: app/observers.py; a place left empty hears nothing):

    - ``resume``: first, so that a phase's facts are kept before anything else reads them;
    - ``clocks``: a ``param-done`` phase done ends the fetch and starts the benchmark's clock;
    - ``reporter``: the manager hears the why before the plugin's give-up (a shutdown's reason lines first);
    - ``plugin``: after the reporter, before status.json (which shows the plugin's bench hold);
    - ``timeline``: when each phase started, came up and ended, before status.json shows it;
    - ``first_writes``: at a shutdown under a stop signal's budget, status.json and the termination log are
      written before any child's grace runs (SIGKILL may end the budget);
    - ``status``: last, and once per batch of changes: the changes one event brings (a verdict, the
      attempt's end, the phase's, the lifecycle's shutdown) are written as one status.json at the end of
      the loop's turn, not one each; the batch that ends the run is the exit's to write (teardown.py).
    """

    loop: EventLoop | None = None  # where the status.json of a batch is written from (None: told at once)
    faults: Faults = field(default_factory=Faults)  # where an observer that raises is said (the loop's)
    resume: Hears = NOBODY
    clocks: Hears = NOBODY
    reporter: Hears = NOBODY
    plugin: PluginEvents = field(default_factory=PluginEvents)
    timeline: Hears = NOBODY
    first_writes: Hears = NOBODY
    status: StatusFile | None = None
    _status_due: Timer | None = field(default=None, init=False, repr=False)
    _status_final: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.plugin.faults = self.faults

    def phase_changed(self, phase: Any) -> None:
        # (a place left empty is not called, nor a plugin that listens to no transition)
        plugin = self.plugin if self.plugin._transition else NOBODY
        hearing = [o.phase_changed for o in (self.resume, self.clocks, self.reporter, plugin, self.timeline)
                   if o is not NOBODY]
        tell_each(self.faults, "listener", hearing, phase, phase=phase.spec.name)
        self._status_changed(phase)

    def verdict(self, verdict: Verdict) -> None:
        plugin = self.plugin if self.plugin._verdict else NOBODY
        hearing = [o.verdict for o in (self.reporter, plugin) if o is not NOBODY]
        tell_each(self.faults, "verdict listener", hearing, verdict, phase=verdict.phase)
        self._status_changed(verdict)

    def shutting_down(self, view: ShutdownView) -> None:
        """After the first stop signal is out: these may write to disk (the outbox fsyncs)."""
        plugin = self.plugin if self.plugin._shutdown else NOBODY
        hearing = [o.shutting_down for o in (self.reporter, plugin, self.first_writes) if o is not NOBODY]
        tell_each(self.faults, "shutdown listener", hearing, view)

    def run_over(self) -> None:
        """The lifecycle is over: the exit writes status.json after its sweep (teardown.py), with this last
        batch in it, so the batch's own write is not made."""
        if self._status_due is not None:
            self._status_due.cancel()
            self._status_due = None

    def _status_changed(self, what: object) -> None:
        """status.json is due at the end of this turn of the loop, once for every change until then; a phase
        that reached its end is what it is told of (written at once, even past the file's burst)."""
        if self.status is None:
            return
        if getattr(what, "state", None) in FINAL_STATES:
            self._status_final = what
        if self.loop is None:
            self._write_status()
        elif self._status_due is None:
            self._status_due = self.loop.call_later(0, self._write_status)

    def _write_status(self) -> None:
        self._status_due, final, self._status_final = None, self._status_final, None
        if self.status is not None:
            tell_each(self.faults, "listener", (self.status.changed,), final)


def tell_each(faults: Faults, kind: str, listeners: Iterable[Callable[[Any], None]], what: Any,
              phase: str | None = None) -> None:
    """Every listener hears of ``what``, in order, whichever raised before it: one that raises (reporting,
    the status file, a plugin's) is logged once and costs what it was for, never the lifecycle."""
    for listener in listeners:
        try:
            listener(what)
        except Exception as exc:
            faults.report(f"the {kind} {name_of(listener)}", exc, phase=phase)
