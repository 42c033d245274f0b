"""This state_dir's instance was given up: remembered across restarts, so a given-up run is not run again.

A plugin that gives the instance up to the manager (the prover's fleet protocol: bench-done with rate 0,
or the manager's own ``passed: false``) says so through ``ManagerLink.give_up`` or ``retire``; the Reporter
writes this marker (``given-up.json``, atomically and fsynced) before the call that gives it up is queued, and
the marker holds that call: a start that finds it neither pending nor sent (a SIGKILL between the two writes)
queues it again, so the manager is told all the same. The real
manager's ``bench-done`` has no state check: a restart that ran the lifecycle again on the same uuid would
move the killed row back to ``bench_done`` and ``running`` while the machine is being destroyed.

So a later start on this state_dir says so in one line and exits EXIT_GIVEN_UP without starting any phase,
after delivering what is still pending in the outbox (the give-up itself may be among it; a lifecycle call
queued before the give-up is not sent: it could move the row back). ``run --fresh``
starts over: the marker goes, and the given-up instance's outbox (its uuid, its pending calls) is set aside
(renamed), so the label is registered afresh and nothing of the old instance is sent under the new uuid,
and its clocks (first-seen.json) go: the new row's deadlines are its own.
A kill the manager decided (manager/view.py) is remembered the same way, its kill line the reason.
The marker names the label it was written for: a state_dir reused by another instance (another label: a new
row to the manager) is not that instance's give-up; its marker is set aside under its own label's name
(``aside``) and said, and still refuses that label should it come back to this state_dir.
Core and generic: it knows nothing of benchmarks; the plugin's words are the reason.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..text.show import one_line, span
from . import files as state_files
from .files import StateFileError, load_json, save_json

MARKER_MAX_BYTES = 16 * 1024
REASON_MAX_CHARS = 500
SET_ASIDE_SUFFIX = ".given-up"  # the old outbox, renamed by --fresh
# Another instance's marker, renamed by a start under a new label: given-up.json.<its label, %-quoted>, or a hash
# of a label too long for a file name.
ASIDE_NAME_MAX_CHARS = 120


@dataclass(frozen=True)
class GivenUp:
    at: float  # time.time() when it was given up
    reason: str
    label: str | None = None  # the instance given up (the manager's label); None: a marker of an older version
    call: tuple[str, dict[str, Any]] | None = None  # the call that tells the manager (kind, payload); None: none
    # The marker says which call gave the instance up (``call``, None for a kill): False for one an older version
    # wrote, whose give-up may wait among the pending calls unnamed (none of them can be told from it then).
    names_its_call: bool = True

    def of(self, label: str | None) -> bool:
        """The marker is this label's (one that names none, or a start that has none, is taken as ours: running a
        given-up instance again is the harm, an instance refused wrongly is one line to --fresh)."""
        return self.label is None or not label or self.label == label

    def refusal(self) -> str:
        """The one line a later start says before it exits."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        return (f"this instance was given up at {when} ({self.reason}); not running it again: "
                "start with --fresh or a new state_dir")

    def why_refused(self, now: float) -> str:
        """Why a later start (at ``now``) runs nothing, as its shutdown reason: the exit's line, the termination log
        and status say it. The marker's time and reason in it: a refused start that said only "given up by an
        earlier start" overwrote the story of why (status.json, the termination log), restart after restart."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.at))
        return (f"this instance was given up by an earlier start, {span(now - self.at)} before this one ({when} "
                f"UTC): {self.reason}")


def marker(state_dir: str | Path) -> Path:
    return state_files.path(state_dir, state_files.GIVEN_UP)


def remember(state_dir: str | Path, reason: str, label: str | None = None,
             call: tuple[str, Mapping[str, Any]] | None = None, at: float | None = None) -> GivenUp:
    """Write the marker (durably: before the give-up's call is queued). Raises OSError."""
    kept = (call[0], dict(call[1])) if call is not None else None
    record = GivenUp(time.time() if at is None else at, one_line(reason, REASON_MAX_CHARS, mark=""), label or None,
                     kept)
    data: dict[str, Any] = {"at": record.at, "reason": record.reason}
    if record.label is not None:
        data["label"] = record.label
    data["call"] = {"kind": kept[0], "payload": kept[1]} if kept is not None else None
    save_json(marker(state_dir), data)
    return record


def amend(state_dir: str | Path, note: str) -> None:
    """Add ``note`` to the marker's reason, whole (the reason is cut to make room), keeping its time, label and call:
    the give-up's call was refused for good, and the reason says it asked the manager. Raises OSError."""
    given_up = _recall(marker(state_dir))
    if given_up is not None:
        reason = one_line(given_up.reason, max(REASON_MAX_CHARS - len(note) - 2, 0), mark="")
        remember(state_dir, f"{reason}; {note}", given_up.label, given_up.call, at=given_up.at)


def aside(state_dir: str | Path, label: str) -> Path:
    """Where a start under another label sets ``label``'s marker aside."""
    name = urllib.parse.quote(label, safe="")
    if len(name) > ASIDE_NAME_MAX_CHARS:
        import hashlib  # (here, not at the top: it maps OpenSSL's libcrypto, 3 MiB of an idle supervisor's RSS)

        name = "sha256-" + hashlib.sha256(label.encode()).hexdigest()
    return marker(state_dir).with_name(f"{state_files.GIVEN_UP}.{name}")


def recall(state_dir: str | Path, label: str = "") -> GivenUp | None:
    """The marker, if this state_dir's instance was given up; else, with ``label``, that label's marker set aside by
    another label's start (it was given up here, went, and came back). One that cannot be read (spoilt, not a
    file) still means given up: starting the lifecycle again is the harm this guards against."""
    found = _recall(marker(state_dir))
    if found is None and label:
        found = _recall(aside(state_dir, label))
    return found


def _recall(path: Path) -> GivenUp | None:
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return load_json(path, MARKER_MAX_BYTES, "a give-up record", _given_up)
    except (OSError, StateFileError) as exc:  # (OSError: a dangling link, a state_dir we may not read)
        cause = exc.cause if isinstance(exc, StateFileError) else exc
        with contextlib.suppress(OSError):
            return GivenUp(path.lstat().st_mtime, f"its record {path} is unreadable: {type(cause).__name__}")
        return GivenUp(time.time(), f"its record {path} is unreadable")


def _given_up(data: dict[str, Any]) -> GivenUp:
    """The marker's record; raises KeyError, TypeError or ValueError where it has no time (or one no clock can
    show: "nan", 1e300) or no reason. A label or call of the wrong shape is left out (the marker still holds)."""
    label = data.get("label")
    call = data.get("call")
    kept_call = None
    if isinstance(call, dict) and isinstance(call.get("kind"), str) and isinstance(call.get("payload"), dict):
        kept_call = (call["kind"], call["payload"])
    return GivenUp(state_files.wall_time(data["at"]), str(data["reason"])[:REASON_MAX_CHARS],
                   label if isinstance(label, str) and label else None, kept_call, "call" in data)


def set_aside(state_dir: str | Path, given_up: GivenUp, label: str) -> str:
    """Another instance's marker (``given_up.of(label)`` is False, so it names its label): renamed aside under that
    label's name, so that this label runs; returns the line that says so. Raises OSError."""
    assert given_up.label is not None
    path = aside(state_dir, given_up.label)
    marker(state_dir).replace(path)
    return (f"this state_dir's instance {given_up.label!r} was given up, not {label!r} (a new instance): its record "
            f"is set aside as {path.name}")


def start_over(state_dir: str | Path, label: str = "") -> str | None:
    """``--fresh``: forget the give-up (this state_dir's, and ``label``'s set aside) and set the old instance's outbox
    aside; returns what was done (None: nothing was given up here). Raises OSError. Another label's give-up is not
    this start's to forget: it is set aside, as any start of ``label`` does (that label, back, is still refused)."""
    given_up = recall(state_dir, label)
    if given_up is not None and not given_up.of(label):
        said = set_aside(state_dir, given_up, label)
        ours = start_over(state_dir, label)  # (``label``'s own, set aside by another's start before, if any)
        return f"{said}; {ours or f'--fresh: {label!r} was not given up here; starting as usual'}"
    if given_up is None:
        return None
    # The clocks first: a SIGKILL before the marker goes must not leave the old instance's times with no marker.
    # A new registration is a new row: its deadlines run from its own registered_at, not the old instance's.
    state_files.path(state_dir, state_files.FIRST_SEEN).unlink(missing_ok=True)
    outbox = state_files.path(state_dir, state_files.OUTBOX)
    outbox_aside = ""
    if outbox.exists():
        for suffix in ("", "-wal", "-shm"):  # SQLite's journal goes with it (a SIGKILL may have left one)
            part = outbox.with_name(outbox.name + suffix)
            if part.exists():
                part.replace(outbox.with_name(outbox.name + SET_ASIDE_SUFFIX + suffix))
        outbox_aside = f"; its outbox set aside as {outbox.name}{SET_ASIDE_SUFFIX}"
    marker(state_dir).unlink(missing_ok=True)
    if label:
        aside(state_dir, label).unlink(missing_ok=True)
    return f"starting over (--fresh): the give-up ({given_up.reason}) is forgotten{outbox_aside}; registering afresh"
