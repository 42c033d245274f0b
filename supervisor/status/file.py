"""status.json: the last snapshot on disk, for ``prover-supervisor status`` when no supervisor runs.

``StateFile`` keeps ``state_dir/status.json`` up to date, replaced atomically once per batch of the
lifecycle's news (the Observers call ``changed`` at the end of the loop's turn; coalesced past a burst);
``load_persisted`` reads it back, and ``snapshot_problem``
checks that what was read (the file, or an answer on the status socket) has the snapshot's shape
before anything uses it. It is the status view's file only: what a later start resumes from is
resume.py's own record.

And the pointer (``point_here``, ``unpoint``, ``pointers``): the well-known file that leads a bare
``prover-supervisor status`` to the running supervisor, whatever its state_dir.

``run --config F`` may give the supervisor a state_dir of its own, and a bare ``status`` knows only the
built-in profile's. So once its observers are wired the supervisor writes ``current`` (its socket listening
or not: without one, ``status`` shows the state_dir's status.json) in a runtime
directory every process of the machine (or container) agrees on: ``$PROVER_SUPERVISOR_RUNTIME_DIR``, else
``/run/prover-supervisor`` as root, else ``$XDG_RUNTIME_DIR/prover-supervisor``; with none of them there is
no pointer. It names the supervisor's pid, its PID namespace and start time, state_dir and socket, and under it
(``under``) the supervisors it replaced that still ran then, newest first: a trial ``run --config other.toml`` or
a ``demo`` beside the real one takes the pointer, and at its exit puts back the newest of those still running
(else removes it), only while it still names this supervisor (a later one may have taken it over, and keeps
the ones under it). A pointer whose pid is no live supervisor (or one started at another time: the pid was given
to another process since) and whose socket takes no connection (a SIGKILL left it) is not live: a bare status
shows the newest live one under it, or one that answers in the built-in profile's state_dir, naming the dead one
beside it; with none, its saved state (app/cli.py bare_status_dir). A pid of another PID namespace (a
container's supervisor is pid 1 of its own, and /run may be the host's) says nothing here: such a supervisor
is live only by its socket. With several supervisors running on one machine it names the last one started, and
keeps the others under it: a bare status shows the newest and names the next; the others are found with
``--state-dir``. Each start and exit reads the pointer, then writes it: two in the same instant may lose one
of them from it (no lock: a supervisor frozen while holding one would hold every other's start), and
``--state-dir`` finds it still.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.loop import EventLoop, Timer
from ..engine.trees import is_live_supervisor, of_another_pid_namespace, own_pid_namespace, own_start_ticks
from ..lifecycle.states import FINAL_STATES
from ..state import files as state_files
from ..state.files import Rewrites, StateFileError, load_json, not_an_object, save_json
from ..text import Log
from ..text.show import PATH_CHARS, shown
from .model import Snapshot, shape_problem

# status.json is rewritten at once on every batch of changes (the Observers' one call at the end of the loop's
# turn), up to PERSIST_BURST times in PERSIST_WINDOW_S; past that (a service restarting in a tight loop) the
# batches are coalesced into one write per window.
PERSIST_BURST = 20
PERSIST_WINDOW_S = 1.0
# A status.json bigger than this is not one we wrote (what is persisted is capped far below it).
STATE_MAX_READ_BYTES = 16 * 1024 * 1024


def persist(path: Path, snapshot: Snapshot) -> None:
    """Write status.json (``path``) atomically: a reader never sees half a file."""
    save_json(path, snapshot.to_json())


class StateFile:
    """Keeps status.json up to date without letting it cost the lifecycle anything.

    Every batch of changes is written at once, and a phase reaching a final state always is (what a
    SIGKILL right after it leaves for ``status`` must say how the phase ended); but past
    ``PERSIST_BURST`` writes in ``PERSIST_WINDOW_S`` the other changes wait for the window to
    pass and go out as one write (a service restarting in a loop would otherwise fsync it
    several times a restart). A write that fails (a full disk) is said once, tried again at
    the next change, and said again once it works.
    """

    def __init__(self, state_dir: Path, loop: EventLoop, log: Log,
                 build: Callable[[], Snapshot]) -> None:
        self.path = state_files.path(state_dir, state_files.STATUS_FILE)
        self._loop = loop
        self._log = log
        self._build = build
        self._recent: deque[float] = deque(maxlen=PERSIST_BURST)  # monotonic times of the last writes
        self._later: Timer | None = None
        self._writes = Rewrites(self.path, "status", "it is tried again at each change (the status socket still "
                                "answers)", log, write=persist)

    def changed(self, what: object = None) -> None:
        """The lifecycle's news, once per batch (``what``: a phase that reached a final state, or None): write now,
        or soon."""
        now = self._loop.clock.monotonic()  # the loop's clock: its timer is what writes a coalesced change
        window_open_at = self._recent[0] + PERSIST_WINDOW_S if len(self._recent) == PERSIST_BURST else now
        if _is_final(what) or window_open_at <= now:
            self.save()
        elif self._later is None:
            self._later = self._loop.call_later(window_open_at - now, self.save)

    def save(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        self._recent.append(self._loop.clock.monotonic())
        self._writes.save(self._build)


def _is_final(what: object) -> bool:
    """A phase that reached done, failed or stopped (duck-typed: the Observers pass a phase, or None)."""
    return getattr(what, "state", None) in FINAL_STATES


def load_persisted(state_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The last persisted snapshot as JSON (Snapshot.from_json reads it), or None and why (missing, unreadable,
    or not shaped like one: never fatal). Raises PermissionError where it is not ours to read: that is no
    absence of state, and the caller says so."""
    path = state_files.path(state_dir, state_files.STATUS_FILE)
    try:
        return load_json(path, STATE_MAX_READ_BYTES, "a status snapshot", _snapshot), None
    except FileNotFoundError:
        return None, f"no {shown(str(path), PATH_CHARS, bare=True)}"
    except StateFileError as exc:
        if isinstance(exc.cause, PermissionError):
            raise exc.cause from None
        return None, f"{exc}; ignoring it"


def _snapshot(data: dict[str, Any]) -> dict[str, Any]:
    """``data``, shaped like a snapshot; raises ValueError saying where it is not."""
    problem = snapshot_problem(data)
    if problem is not None:
        raise ValueError(problem)
    return data


def snapshot_problem(data: Any) -> str | None:
    """Where ``data`` (status.json, or an answer on the socket) is not a snapshot's JSON (the first place), or
    None: the declared types of model.Snapshot say (model.shape_problem)."""
    if not isinstance(data, dict):
        return not_an_object(data)
    return shape_problem(Snapshot, data)


# ---------------------------------------------------------------- the pointer to the running supervisor

RUNTIME_DIR_ENV = "PROVER_SUPERVISOR_RUNTIME_DIR"
ROOT_RUNTIME_DIR = Path("/run/prover-supervisor")
POINTER = "current"
# A pointer is a short JSON object; anything bigger is not ours.
POINTER_MAX_BYTES = 16 * 1024
# The supervisors kept under the pointer at most (each still ran when the pointer was written; more than this
# many side by side on one machine is no supervisor's case).
POINTER_UNDER_MAX = 16
# How long a bare status waits for the pointer's socket to take its connection.
POINTER_CONNECT_S = 2.0


@dataclass(frozen=True)
class Pointer:
    """What ``current`` says: who wrote it, where its state is, and whether it still runs."""

    pid: int
    state_dir: Path
    live: bool
    elsewhere: bool = False  # its pid is of another PID namespace than ours


def pointer_path() -> Path | None:
    """Where the pointer lives on this machine, or None where there is no runtime directory to agree on."""
    chosen = os.environ.get(RUNTIME_DIR_ENV)
    if chosen:
        return Path(chosen) / POINTER
    if os.geteuid() == 0:
        return ROOT_RUNTIME_DIR / POINTER
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "prover-supervisor" / POINTER if xdg else None


def point_here(state_dir: Path, socket_path: Path) -> Path | None:
    """Write the pointer to this supervisor, over the ones it finds still running; its path, or None where there
    is none (raises OSError)."""
    path = pointer_path()
    if path is None:
        return None
    if not path.is_absolute():  # (a bare status run from another directory would look for it elsewhere)
        raise OSError(errno.EINVAL, f"${RUNTIME_DIR_ENV} is not an absolute path")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "pid_ns": own_pid_namespace(), "pid_start": own_start_ticks(),
              "state_dir": str(state_dir), "socket": str(socket_path),
              "under": _still_running(_records(_read(path)), str(state_dir))}
    save_json(path, record)
    return path


def unpoint(path: Path) -> None:
    """At the exit, if the pointer still names this supervisor: put back the newest one it replaced that still
    runs, else remove it (raises OSError)."""
    ours = own_pid_namespace()  # (a pid 1 of another namespace, a container's, is not this one)
    found = _read(path)
    if found is None or found.get("pid") != os.getpid() or found.get("pid_ns", ours) != ours:
        return
    if found.get("under"):  # (none, the usual exit: nothing more is asked of any other module)
        earlier = _still_running(_records(found)[1:], found.get("state_dir"))
        if earlier:
            save_json(path, {**earlier[0], "under": earlier[1:]})
            return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def pointers() -> list[Pointer]:
    """The supervisor the pointer names, then those under it (each live or not), newest first; empty where there
    is no pointer."""
    path = pointer_path()
    found = [_pointer(record) for record in _records(_read(path) if path is not None else None)]
    return [one for one in found if one is not None]


def _pointer(found: dict[str, Any]) -> Pointer | None:
    """One record of the pointer, judged live or not; None where it is not one."""
    pid, state_dir = found.get("pid"), found.get("state_dir")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(state_dir, str) \
            or not state_dir.startswith("/") or "\0" in state_dir:
        return None
    elsewhere = of_another_pid_namespace(found.get("pid_ns"))
    started = found.get("pid_start")  # (None where it wrote none, an older supervisor: its command line decides)
    if not isinstance(started, int) or isinstance(started, bool):
        started = None
    live = (not elsewhere and is_live_supervisor(pid, started)) or takes_connections(found.get("socket"))
    return Pointer(pid, Path(state_dir), live, elsewhere)


def _records(found: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A pointer's records, newest first: the one it names, then those under it (none where there is none)."""
    if found is None:
        return []
    under = found.get("under")
    earlier = [one for one in under if isinstance(one, dict)] if isinstance(under, list) else []
    return [found, *earlier]


def _still_running(records: list[dict[str, Any]], state_dir: object) -> list[dict[str, Any]]:
    """Those of ``records`` whose supervisor still runs, as they were written (without what was under them), at
    most POINTER_UNDER_MAX; never one of ``state_dir``, the writer's own (its lock allows no other there, and its
    socket may be the writer's own, listening)."""
    kept: list[dict[str, Any]] = []
    for record in records:
        if len(kept) == POINTER_UNDER_MAX:
            break
        judged = _pointer(record) if record.get("state_dir") != state_dir else None
        if judged is not None and judged.live:
            kept.append({key: value for key, value in record.items() if key != "under"})
    return kept


def takes_connections(path: object) -> bool:
    """Something listens on the status socket ``path``: a supervisor runs there, whatever its PID namespace (one
    SIGKILLed left its socket file, which refuses). A listener whose backlog is full is one too."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(POINTER_CONNECT_S)
            sock.connect(path)
    except (BlockingIOError, TimeoutError):
        return True
    except OSError:
        return False
    return True


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return load_json(path, POINTER_MAX_BYTES, "a pointer", dict)
    except (OSError, ValueError):  # none, unreadable, not a JSON object (StateFileError): no pointer
        return None
