"""The well-known pointer to the running supervisor, so a bare ``prover-supervisor status`` finds it
whatever its state_dir.

``run --config F`` may give the supervisor a state_dir of its own, and a bare ``status`` knows only the
built-in profile's. So once its status socket listens the supervisor writes ``current`` in a runtime
directory every process of the machine (or container) agrees on: ``$PROVER_SUPERVISOR_RUNTIME_DIR``, else
``/run/prover-supervisor`` as root, else ``$XDG_RUNTIME_DIR/prover-supervisor``; with none of them there is
no pointer. It names the supervisor's pid, state_dir and socket, and is removed at the exit, only while it
still names this supervisor (a later one may have taken it over). A pointer whose pid is no live
supervisor (a SIGKILL left it) is not followed, only named, for its saved state. With several supervisors
on one machine it names the last one started; the others are found with ``--state-dir``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.survivors import is_live_supervisor
from ..state.atomic import load_json, save_json

RUNTIME_DIR_ENV = "PROVER_SUPERVISOR_RUNTIME_DIR"
ROOT_RUNTIME_DIR = Path("/run/prover-supervisor")
POINTER = "current"
# A pointer is a short JSON object; anything bigger is not ours.
POINTER_MAX_BYTES = 16 * 1024


@dataclass(frozen=True)
class Pointer:
    """What ``current`` says: who wrote it, where its state is, and whether it still runs."""

    pid: int
    state_dir: Path
    live: bool


def pointer_path() -> Path | None:
    """Where the pointer lives on this machine, or None where there is no runtime directory to agree on."""
    chosen = os.environ.get(RUNTIME_DIR_ENV)
    if chosen:
        return Path(chosen) / POINTER
    if os.geteuid() == 0:
        return ROOT_RUNTIME_DIR / POINTER
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "prover-supervisor" / POINTER if xdg else None


def point_here(state_dir: Path, socket: Path) -> Path | None:
    """Write the pointer to this supervisor; its path, or None where there is none (raises OSError)."""
    path = pointer_path()
    if path is None:
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "state_dir": str(state_dir), "socket": str(socket)}
    save_json(path, record)
    return path


def unpoint(path: Path) -> None:
    """Remove the pointer at the exit, if it still names this supervisor (raises OSError)."""
    found = _read(path)
    if found is not None and found.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def pointed() -> Pointer | None:
    """The supervisor the pointer names, live or not; None where there is no pointer (or it is not one)."""
    path = pointer_path()
    found = _read(path) if path is not None else None
    if found is None:
        return None
    pid, state_dir = found.get("pid"), found.get("state_dir")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(state_dir, str) \
            or not state_dir.startswith("/") or "\0" in state_dir:
        return None
    return Pointer(pid, Path(state_dir), is_live_supervisor(pid))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return load_json(path, POINTER_MAX_BYTES, "a pointer", dict)
    except (OSError, ValueError):  # none, unreadable, not a JSON object (StateFileError): no pointer
        return None
