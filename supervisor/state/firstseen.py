"""The instance's clocks: when it first started, when the manager first registered it, when its fetch ended,
and the manager's own times of these (its row's ``registered_at``, ``param_done_at``: manager/row.py), kept in
state_dir (state_files.FIRST_SEEN) across restarts, so a deadline counts from there.

The manager's 90-minute fetch timeout runs from its row's ``registered_at``, and its 45-minute benchmark
timeout from ``param_done_at``, whatever the supervisor does: a restart, a new container or a fresh state_dir
joining an old row must not start a fresh deadline (docs/manager.md). So once a row was read, each clock is the
manager's own time, the one its deadline really counts from (a param-done delivered late, after an outage,
starts the manager's benchmark clock late: counting from the fetch's end would cut a bench that still has
time); until then, the supervisor's own record (the first registration answered; the param-done phase's
end), which comes first. Each clock says which it is. Until a registration was answered (or without a
manager) the fetch clock counts from the first start, which comes before it: the earlier, the safer. Each
own time is written once, the first time it is known; a manager's time is kept as its row last said it (a
row registered anew, its old uuid forgotten, runs its clocks anew).

A clock counts only while the manager's does (whoever judges on it checks the row's stage too: the prover's
benchmark clock judges on the fetch's end only once the param-done reached the manager). A row the manager no
longer lists (forgotten: its database reset) runs none: until a row is read again, its kept times anchor nothing
(the fetch counts from this start, the clock after it from none). Judged on them, a restart that found its row
forgotten failed the fetch at once on the old row's registered_at, while the label was being registered anew.

The file names the label it was kept for: a state_dir another instance used (another label: a new row to the
manager) holds none of this one's clocks; they start afresh (said). A file that cannot be read is started
afresh (said). A time in it that cannot be the instance's (later than
now beyond CLOCK_SKEW_S, or more than MAX_AGE_S before now: ``first_start = 1.0``) is refused in one line,
as resume.json's future times are: the clock it was counts from now on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..text import Log
from . import files as state_files
from .files import StateFileError, load_json, wall_time

# Two machines' wall clocks (ours, the manager's, an earlier container's) may disagree by this much before a
# time they wrote "from the future" is refused as impossible (here, and in the manager's row: manager/row.py).
CLOCK_SKEW_S = 120.0


class RowTimes(Protocol):
    """What this file hears of the manager's row (manager/row.py's Row): its state and its two times."""

    @property
    def state(self) -> str: ...

    @property
    def registered_at(self) -> float | None: ...

    @property
    def param_done_at(self) -> float | None: ...


# The file holds a few numbers; anything bigger is not ours.
FIRST_SEEN_MAX_BYTES = 4096
FIRST_START = "first_start"
FIRST_REGISTERED = "first_registered"
FIRST_PARAM_DONE = "first_param_done"  # the param-done phase ended (its call queued)
MANAGER_REGISTERED = "manager_registered_at"  # the row's registered_at
MANAGER_PARAM_DONE = "manager_param_done_at"  # the row's param_done_at
KEYS = (FIRST_START, FIRST_REGISTERED, FIRST_PARAM_DONE, MANAGER_REGISTERED, MANAGER_PARAM_DONE)
LABEL = "label"  # whose clocks they are (the manager's label; none without one)
# What each clock is, as a verdict or status says it.
SOURCES = {FIRST_START: "the first start", FIRST_REGISTERED: "the first registration",
           FIRST_PARAM_DONE: "the fetch's end (param-done)", MANAGER_REGISTERED: "the manager's registered_at",
           MANAGER_PARAM_DONE: "the manager's param_done_at"}
THIS_START = "this start"  # the fetch clock of a fetch run again once the manager's no longer runs
UNLISTED = ""  # the row's state while the manager's fleet does not list it (no state of the manager's)
# A kept time older than this is no instance's start (a zeroed field, another machine's file): refused.
MAX_AGE_S = 365 * 86400.0

# The clocks a deadline may count from, and which kept times each is the earliest of: the fetch's, from the
# registration; and the one that starts where the fetch ends (param-done), whose stage a plugin names (the
# prover's benchmark: Plugin.clocks gives it the name it is asked and shown by).
FETCH_CLOCK = "fetch"
AFTER_FETCH_CLOCK = "after-fetch"
CLOCKS = {FETCH_CLOCK: (MANAGER_REGISTERED, FIRST_REGISTERED),
          AFTER_FETCH_CLOCK: (MANAGER_PARAM_DONE, FIRST_PARAM_DONE)}


class FirstSeen:
    """The times (epoch seconds), loaded at start; the first start written at once if it was not known.
    ``names``: a clock (CLOCKS) → the name it is asked and shown by instead (a plugin's: Plugin.clocks). ``label``:
    the instance's (its manager label), kept with the times."""

    def __init__(self, state_dir: Path, log: Log, now: Callable[[], float] = time.time,
                 names: Mapping[str, str] | None = None, label: str = "") -> None:
        self._names = {clock: (names or {}).get(clock, clock) for clock in CLOCKS}  # clock → its name
        self._clocks = {name: clock for clock, name in self._names.items()}  # its name → the clock
        self._path = state_files.path(state_dir, state_files.FIRST_SEEN)
        self._log, self._now, self._label = log, now, label
        # (a full or read-only state_dir costs the memory across restarts, not the run: said once, and its end)
        self._writes = state_files.Rewrites(self._path, "first-seen", "a restart counts afresh", log)
        self._row_state: str | None = None  # the manager's row's state, as last read (not kept)
        self._this_start: float | None = None  # this start's time, where it was needed
        self._times = self._load()
        self._fetched_before = FIRST_PARAM_DONE in self._times  # a fetch ended here in an earlier start
        if FIRST_START not in self._times:
            self._times[FIRST_START] = self._this_start = now()
            self._save()

    def anchor(self) -> tuple[float, str]:
        """Where the fetch deadline counts from, and what that is (for the verdict): the manager's registered_at
        once a row said it (whether earlier than ours, a row joined late, or later, a row registered anew), else
        the first registration, else the first start. Once the row is past ``registered`` or no longer listed
        (or, with no row read, once a fetch ended here before) the manager's fetch clock no longer runs: a fetch
        run again (days into production, its cache lost) counts from this start, and so does one whose row the
        manager forgot, until the row registered anew is read."""
        if not self._fetch_clock_runs():
            if self._this_start is None:
                self._this_start = self._now()
            return self._this_start, THIS_START
        return self.clock(FETCH_CLOCK) or (self._times[FIRST_START], SOURCES[FIRST_START])

    def _fetch_clock_runs(self) -> bool:
        if self._row_state is not None:
            return self._row_state == "registered"
        return not self._fetched_before

    def _after_fetch_clock_runs(self) -> bool:
        """The manager's clock after the fetch runs while its row is ``params_done`` (with no row read: as far as
        this start knows)."""
        return self._row_state is None or self._row_state == "params_done"

    def clock(self, name: str) -> tuple[float, str] | None:
        """The clock ``name`` (FETCH_CLOCK, AFTER_FETCH_CLOCK, or the name a plugin gave it): the manager's time
        of it once a row said it, else the supervisor's own; and what it is. None: none known, or no row to run
        it (the manager no longer lists this instance's)."""
        if self._row_state == UNLISTED:
            return None
        for key in CLOCKS[self._clocks.get(name, name)]:  # (the manager's first)
            if key in self._times:
                return self._times[key], SOURCES[key]
        return None

    def registered(self) -> None:
        """The manager answered a registration (now, or one kept from an earlier start): the first counts."""
        self._first(FIRST_REGISTERED)

    def param_done(self) -> None:
        """The param-done phase ended: the clock after the fetch starts (the manager's, at its param_done_at)."""
        self._first(FIRST_PARAM_DONE)

    def heard_unlisted(self) -> None:
        """The manager's fleet does not list this instance's row: none of its clocks runs until one is read."""
        self._row_state = UNLISTED

    def heard_row(self, row: RowTimes) -> None:
        """The manager's row: its registered_at and param_done_at, kept as it says them."""
        self._row_state = row.state
        changed = False
        for key, value in ((MANAGER_REGISTERED, row.registered_at), (MANAGER_PARAM_DONE, row.param_done_at)):
            if value is not None and value != self._times.get(key):
                self._times[key] = value
                changed = True
        if changed:
            self._save()

    def status(self) -> dict[str, Any]:
        """Each clock known, for the status view: when it started and what that is."""
        out: dict[str, Any] = {}
        for kind, name in self._names.items():
            if kind == FETCH_CLOCK and not self._fetch_clock_runs():
                continue  # the fetch is behind (the row is past registered): its clock is of no use to show
            if kind == AFTER_FETCH_CLOCK and not self._after_fetch_clock_runs():
                continue  # the row is past that stage (running, killed) or not at it yet: no deadline runs
            clock = self.clock(name) if kind != FETCH_CLOCK else self.anchor()
            if clock is not None:
                out[name] = {"at": clock[0], "source": clock[1]}
        return out

    def _first(self, key: str) -> None:
        if key not in self._times:
            self._times[key] = self._now()
            self._save()

    def _load(self) -> dict[str, float]:
        try:
            return load_json(self._path, FIRST_SEEN_MAX_BYTES, "the instance's clocks", self._kept)
        except FileNotFoundError:
            return {}
        except StateFileError as exc:
            if exc.readable:
                return {}  # JSON, but no object of times: nothing of ours to say was lost
            self._log(f"first-seen: cannot read {self._path} ({exc.cause}): deadlines count from this start")
        except OSError as exc:
            self._log(f"first-seen: cannot read {self._path} ({exc}): deadlines count from this start")
        return {}

    def _kept(self, raw: dict[str, Any]) -> dict[str, float]:
        """The times of the file that can be this instance's; any other key or value is left out, one by one.
        None of another label's (a file that names none, or a start without one, is taken as this one's)."""
        owner = raw.get(LABEL)
        if isinstance(owner, str) and owner and self._label and owner != self._label:
            self._log(f"first-seen: {self._path} holds the clocks of instance {owner!r}, not {self._label!r}: "
                      "this instance's count from now on")
            return {}
        kept = {}
        for key in KEYS:
            with contextlib.suppress(KeyError, ValueError):  # (NaN, 1e300, a 400-digit number: no time of ours)
                kept[key] = wall_time(raw[key])
        return {k: t for k, t in kept.items() if t > 0 and self._possible(k, t)}

    def _possible(self, key: str, at: float) -> bool:
        """A kept time that could be this instance's; one that cannot is refused in one line."""
        now = self._now()
        if at > now + CLOCK_SKEW_S:
            why = f"is {at - now:.0f}s later than now"
        elif at < now - MAX_AGE_S:
            why = f"is {(now - at) / 86400:.0f} days before now"
        else:
            return True
        self._log(f"first-seen: {key} = {at:g} in {self._path} {why}: impossible, not used; {SOURCES[key]} "
                  "counts from what is known from now on")
        return False

    def _save(self) -> None:
        self._writes.save(lambda: {**self._times, **({LABEL: self._label} if self._label else {})})
