"""``prover-supervisor status``: ask the running supervisor, else read what it last wrote, and say which.

When no supervisor answers on the socket, status.json says what the last one wrote, and the writer's pid
says how it ended: a lifecycle that reached ``stopped`` was ended by its supervisor (it exited); one left
in any other state by a pid that is no longer a live prover-supervisor was ended from outside (``kill -9``,
the OOM killer): the supervisor is **gone**, and what it started may still run. Those are found by the
tag each child carries (trees.left_alive_by), never by the pid alone, so a reused pid is not named.
A writer that is alive but does not answer is said as such (one whose socket file is gone is waited for a moment
first: its tick makes the file again), and so is one of another PID namespace (a container's
pid 1, seen from the host): its pid and its children's tags say nothing here, only its socket could have. The
answer's ``supervisor`` key is one of ``running``, ``exited``, ``gone``, ``not answering``; ``survivors`` lists
what a gone one left alive. One dead that left its state unfinished, nothing alive and no socket file exited
(``unsaved``): its exit removes the socket file after its last save (a full disk fails that save), a SIGKILL
leaves it; where its last save says its socket was not listening (``listening``), that absence says nothing.
status.json is written once per transition batch, not per output line: a child's output since then is read
from its log file (masked as it was written; its time and last lines), so a supervisor SIGKILLed minutes
into a quiet phase does not show a child that printed every second as one that never printed.

``--watch`` redraws the text every ``--interval`` seconds (clearing the screen with ANSI only on a
terminal; into a pipe each frame follows the last, after a blank line) until Ctrl-C, which ends it with
0. A supervisor that goes away meanwhile is shown as it is found (gone, exited) and the watch goes on: a
restart of the container shows the next one coming up.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..engine.logs import LineSplitter
from ..engine.tick import TICK_S
from ..engine.trees import is_live_supervisor, left_alive_by, of_another_pid_namespace
from ..exits import EXIT_FAILURE, EXIT_NOT_RUNNING, EXIT_OK
from ..state import files as state_files
from ..text.show import PATH_CHARS, shown
from ..text.stdio import STDOUT, lost, say
from .file import load_persisted
from .model import EXITED, GONE, NOT_ANSWERING, RUNNING, ChildStatus, Fate, Snapshot, Survivor
from .render import render
from .snapshot import CHILD_LINES, shown_line
from .socket import NotYoursToAsk, not_yours, query

# ``--watch``'s default redraw interval, and the shortest one taken (each frame asks the supervisor).
WATCH_INTERVAL_S = 1.0
WATCH_INTERVAL_MIN_S = 0.1
# And at most a day: a redraw further off than that is no watch (and 1e10 s is past what sleep and the clock take).
WATCH_INTERVAL_MAX_S = 86400.0
# Clear the screen and go home (a terminal only).
CLEAR_SCREEN = "\x1b[H\x1b[2J"
# How much of the end of a child's log file is read for its last lines (a saved snapshot's child).
LOG_TAIL_BYTES = 16 * 1024
# A running supervisor whose socket file was removed makes it again at its next tick (socket.py's ``check``): a
# status asked meanwhile waits this long for it before it calls that supervisor not answering.
SOCKET_REMADE_WAIT_S = 2 * TICK_S
SOCKET_LOOK_S = 0.05

@dataclass(frozen=True)
class SeeAlso:
    """Another state_dir than the one a bare ``status`` shows, where a supervisor of this machine left its state
    (app/cli.py bare_status_dir): said under the story (``also: …``), in ``--json`` as ``see_also``."""

    state_dir: Path
    who: str  # whose it is: "the last supervisor started here (pid 4242, not running) had state_dir"
    pid: int | None = None  # that supervisor's, where known

    def said(self) -> str:
        named = shown(str(self.state_dir), PATH_CHARS, bare=True)  # (quoted where it has a space or an ESC)
        return f"{self.who} {named}: `status --state-dir {named}`"

    def to_json(self) -> dict[str, Any]:
        return {"state_dir": str(self.state_dir), "pid": self.pid, "why": self.said()}


def found(state_dir: Path) -> tuple[Snapshot | None, bool, str | None]:
    """(the snapshot, whether it is live, why there is none): the socket's answer, else status.json with
    what became of its writer (``supervisor``, ``survivors``)."""
    answer = query(state_dir)
    if answer is not None:
        return Snapshot.from_json(answer).found(Fate(RUNNING)), True, None
    try:
        saved, why = load_persisted(state_dir)
    except PermissionError:
        raise NotYoursToAsk(not_yours(state_files.path(state_dir, state_files.STATUS_FILE), "read")) from None
    if saved is None:
        return None, False, why
    snap = Snapshot.from_json(saved)
    fate = writer_fate(snap, str(state_dir))
    if fate.supervisor == NOT_ANSWERING and socket_remade(state_dir, snap):
        answer = query(state_dir)
        if answer is not None:
            return Snapshot.from_json(answer).found(Fate(RUNNING)), True, None
    return with_later_output(snap.found(fate)), False, None


def socket_remade(state_dir: Path, snap: Snapshot) -> bool:
    """Whether the socket file of a supervisor alive and not answering, gone (removed while it runs), is made again
    within SOCKET_REMADE_WAIT_S: its next tick does that. One whose last save says it was not listening has none to
    make again."""
    path = state_files.path(state_dir, state_files.STATUS_SOCKET)
    if snap.listening is False or os.path.lexists(path):  # (there and not answering: asked once is enough)
        return False
    deadline = time.monotonic() + SOCKET_REMADE_WAIT_S
    while not os.path.lexists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(SOCKET_LOOK_S)
    return True


def with_later_output(snap: Snapshot) -> Snapshot:
    """A saved snapshot's children with what each printed after it was written, read from its log file."""
    log_dir = snap.logs.dir if snap.logs is not None else None
    if not log_dir or not snap.children:
        return snap
    return replace(snap, children=tuple(_later_output(child, Path(log_dir)) for child in snap.children))


def _later_output(child: ChildStatus, log_dir: Path) -> ChildStatus:
    phase, _, name = (child.label or "").partition("/")  # (a label is phase/child)
    if not phase or not name or child.log_from is None:  # (a snapshot that does not say where its output begins)
        return child
    tail = _log_tail(log_dir / state_files.child_log_name(phase, name), child.log_from)
    if tail is None:
        return child
    at, lines = tail
    if (child.last_output_at is not None and at <= child.last_output_at) or at <= (child.started_at or 0):
        return child  # nothing since the snapshot, or nothing of this child's (the file is an earlier run's)
    return replace(child, last_output_at=at, last_lines=tuple(shown_line(line) for line in lines) or child.last_lines)


def _log_tail(path: Path, ours_from: int) -> tuple[float, list[str]] | None:
    """(its last write, the last lines from ``ours_from`` on) of a regular file; None for anything else (missing,
    a FIFO, unreadable): never blocks, reads LOG_TAIL_BYTES at most. A file shorter than ``ours_from`` was
    rolled over since: all of it is the child's."""
    try:
        info, cut, data = state_files.read_regular_tail(path, LOG_TAIL_BYTES, ours_from)
    except (OSError, ValueError):
        return None
    # Its lines end where the live status's end (at a lone \r too: a progress readout redrawn in place).
    lines = LineSplitter.lines_of(data)
    if cut and len(lines) > 1:
        lines = lines[1:]  # (the first is a part of a line)
    text = [line.decode("utf-8", errors="replace") for line in lines]
    return info.st_mtime, [line for line in text if line.strip()][-CHILD_LINES:]


def writer_fate(snap: Snapshot, state_dir: str) -> Fate:
    """What became of the supervisor that wrote ``snap`` and answers no more: exited, gone, or not answering.

    "stopped" is written by the exit itself: with ``exiting`` as its wait for the manager begins (the loop runs
    then, and the socket answers), without it once its exit is decided and done but for closing (the socket is
    closed first: a supervisor still alive then is in its last steps, not hung). One that is gone with the wait's
    state on disk was killed during it: its exit status never came. One whose state on disk is not final, that is
    dead, left nothing alive and whose socket file is gone (it was listening) exited without saving its last state
    (``unsaved``)."""
    pid, state = snap.pid, snap.lifecycle.state
    exited = state == "stopped" and snap.exiting is None
    if pid is None or pid <= 0:
        return Fate(EXITED if exited else GONE)
    if of_another_pid_namespace(snap.pid_ns):
        # (a container's pid 1 is no pid here, nor are its children's tags of this namespace: this process table
        # says nothing of it, and its socket did not answer)
        return Fate(EXITED if exited else NOT_ANSWERING, elsewhere=True)
    if is_live_supervisor(pid, snap.pid_start):
        return Fate(EXITED if exited else NOT_ANSWERING)
    survivors = tuple(Survivor.from_json(s) for s in left_alive_by(pid, state_dir, snap.pid_start))
    # An exit SIGKILLed what was left before it wrote "stopped": what is still alive outlived that (said, and left,
    # by an exit that went on). Otherwise it is what a supervisor killed before it got there left running.
    if exited:
        return Fate(EXITED, survivors=survivors)
    if not survivors and snap.listening is not False \
            and not os.path.lexists(state_files.path(state_dir, state_files.STATUS_SOCKET)):
        # Its socket file is gone: the exit removes it after its last save, a SIGKILL leaves it. That save failed (a
        # full disk, said in its log): it exited. (What it left alive would have made it gone. One whose socket was
        # not listening, never made or not yet, had no file to leave: its absence says nothing.)
        return Fate(EXITED, unsaved=True)
    return Fate(GONE, gone_since=snap.written_at, survivors=survivors)


def show(state_dir: Path, as_json: bool, hint: str = "", see_also: SeeAlso | None = None) -> int:
    """One answer: the text (or JSON) and the exit status (0 a supervisor answers, 3 none does, 1 we may not
    ask). ``hint`` is added where nothing is found (where else to look); ``see_also`` to every answer."""
    try:
        snap, live, why = found(state_dir)
    except NotYoursToAsk as exc:  # no answer that none runs: say we could not ask, and why
        say(no_snapshot_json(None, state_dir, str(exc), see_also) if as_json else str(exc) + _also_line(see_also))
        return EXIT_FAILURE
    if snap is None:
        socket_path = state_files.path(state_dir, state_files.STATUS_SOCKET)
        said = (f"no prover-supervisor is running (no answer on {shown(str(socket_path), PATH_CHARS, bare=True)}), "
                f"and no saved state: {why}{hint}")
        # --json is for machines: JSON whatever the answer, never a sentence they must parse.
        say(no_snapshot_json(False, state_dir, said, see_also) if as_json else said)
        return EXIT_NOT_RUNNING
    also = {"see_also": see_also.to_json()} if see_also is not None else {}
    if as_json:
        say(json.dumps({"running": live, "live": live, **snap.to_json(), **also}, indent=2, default=str))
    else:
        say(render(snap, live, also=see_also.said() if see_also is not None else ""))
    return EXIT_OK if live else EXIT_NOT_RUNNING


def no_snapshot_json(running: bool | None, state_dir: Path | None, why: str, see_also: SeeAlso | None = None) -> str:
    """``status --json``'s answer where it has no snapshot to show: ``running`` False when none runs, None when it
    could not be asked (not ours to ask; the command line or its state_dir refused: ``state_dir`` None), and why."""
    also = {"see_also": see_also.to_json()} if see_also is not None else {}
    return json.dumps({"running": running, "live": False, "supervisor": None, "survivors": [],
                       "state_dir": None if state_dir is None else str(state_dir), "why": why, **also}, indent=2)


def _also_line(see_also: SeeAlso | None) -> str:
    return f"\nalso: {see_also.said()}" if see_also is not None else ""


def watch(state_dir: Path, interval: float, hint: str = "", see_also: SeeAlso | None = None) -> int:
    """Redraw the text every ``interval`` seconds until Ctrl-C (exit 0)."""
    terminal = os.isatty(STDOUT)  # the fd, not sys.stdout: that is None when stdout came closed (>&-)
    try:
        while True:
            try:
                snap, live, why = found(state_dir)
                text = render(snap, live, also=see_also.said() if see_also is not None else "") \
                    if snap is not None else f"no prover-supervisor is running, no saved state: {why}{hint}"
            except NotYoursToAsk as exc:
                text = str(exc) + _also_line(see_also)
            footer = f"(status --watch, {time.strftime('%H:%M:%S')}, every {interval:g}s; Ctrl-C ends)"
            say(f"{CLEAR_SCREEN if terminal else ''}{text}\n{footer}" + ("" if terminal else "\n"))
            if lost(STDOUT):  # the reader went away (a closed pipe): nobody is watching
                return EXIT_OK
            time.sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK
