"""The files of ``state_dir`` and ``log_dir``: each named once, and every state file written whole or not at all
and read back bounded.

**Names.** ``state_dir`` is the supervisor's memory across restarts (a volume): every module that reads or writes
a file there takes its name from here, as the config does (to bound the socket's path, and to refuse children
whose log files would be one). ``log_dir``'s names are here too: the supervisor's own log, and a child's.

**Writing and reading.** Every state file (status.json: status/file.py, resume.json: lifecycle/resume.py,
given-up.json: givenup.py, first-seen.json: firstseen.py) is replaced atomically, so a reader or the next start
never sees half a file, and is read back knowing it may be anything at all: a FIFO someone put there, /dev/zero
behind a link, a file far bigger than we ever write, JSON nested past the parser's depth, a JSON array, a record
of another shape. ``load_json`` reads one (bounded, a regular file, a JSON object, then the file's own ``parse``
of it) and says in one line why what is there cannot be used; ``save_json`` writes one; ``Rewrites`` writes one
again and again, a failure (a full disk) said once and its recovery once. What a bad file means (start clean,
still given up, count afresh) and how it is said is each file's own. A foundation: the standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from ..text import Log
from ..text.show import PATH_CHARS, shown

LOCK = "supervisor.lock"  # held for the supervisor's whole life: a second one exits 75
STATUS_FILE = "status.json"  # the last snapshot, for `status` when none runs
STATUS_SOCKET = "status.sock"  # the running supervisor answers `status` here (0600)
OUTBOX = "outbox.sqlite3"  # every manager call, written before it is sent
CGROUP_LEDGER = "cgroups"  # the phase cgroups made, so the next start can empty what a SIGKILL left
RESUME = "resume.json"  # what each done phase left for the next start (resume.py)
GIVEN_UP = "given-up.json"  # this instance was given up: a later start does not run it again (givenup.py)
FIRST_SEEN = "first-seen.json"  # the instance's clocks: first start, registration, the manager's times (firstseen.py)

# status.json's layout, its "version". 1: written by the supervisors that kept each phase's facts there alone (for
# resume to read back), and by the first ones that kept them in resume.json (their facts say what each phase ran).
# 2 on: written beside a resume.json, its facts a view of that one: a resume.json missing was removed (resume.py).
STATUS_VERSION = 2


# Every name above: state_dir's own files. What grows beside one is its own too (the outbox's -wal and -shm, a
# write's .<name>.<pid>.tmp, a set-aside given-up.json.<label>).
OWN_FILES = (LOCK, STATUS_FILE, STATUS_SOCKET, OUTBOX, CGROUP_LEDGER, RESUME, GIVEN_UP, FIRST_SEEN)


def path(state_dir: str | Path, name: str) -> Path:
    """``name`` (one of the constants above) under ``state_dir``."""
    return Path(state_dir) / name


# ---------------------------------------------------------------- log_dir

SUPERVISOR_LOG = "supervisor.log"  # the supervisor's own lines
ROLLED = ".1"  # a log file past log_file_max_bytes is renamed to <name>.1 (engine/logs.py roll_over)


def child_log_name(phase: str, child: str) -> str:
    """The file in log_dir a child's output goes to: ``<phase>.log`` for the phase's command, else
    ``<phase>.<child>.log`` (a daemon)."""
    return f"{phase}.log" if child == phase else f"{phase}.{child}.log"


def own_file(state_dir: str | Path, log_dir: str | Path, target: str | Path,
             child_logs: Collection[str] = ()) -> str | None:
    """Which of the supervisor's own files ``target`` is (or grows from), in state_dir, or in log_dir: its
    supervisor.log or a child's log named in ``child_logs`` (``child_log_name``), either rolled over to
    ``<name>.1`` too; None: none of them. Symbolic links in the directories are followed."""
    name, folder = os.path.basename(target), os.path.realpath(os.path.dirname(os.path.abspath(target)))
    if folder == os.path.realpath(log_dir):
        logged = next((own for own in (SUPERVISOR_LOG, *child_logs) if name in (own, f"{own}{ROLLED}")), None)
        if logged is not None:
            return logged
    if folder != os.path.realpath(state_dir):
        return None
    bare = name[1:] if name.startswith(".") else name  # (a write's temporary copy)
    return next((own for own in OWN_FILES if bare == own or bare.startswith((f"{own}.", f"{own}-"))), None)


# ---------------------------------------------------------------- written whole, read bounded

T = TypeVar("T")


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, fsynced first: a crash leaves the old file or the new one, never a
    mix. Mode 0600 (like the status socket: what state_dir holds is for root's eyes). Raises OSError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a half-written copy must not keep the space a full disk needs back
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """The rename made durable: until its directory is fsynced, a host's crash may lose it (and a give-up marker
    lost runs a given-up instance again). A directory that cannot be opened or synced (a filesystem that refuses
    fsync on one) leaves the rename as durable as the filesystem makes it."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# The times a state file holds are seconds since the epoch, written by this program: one before the epoch or past
# this (the year 2286) is a spoilt file, and would make time.localtime raise.
WALL_TIME_MAX = 1e10


def wall_time(value: Any) -> float:
    """A time a state file holds (seconds since the epoch), as a float; raises ValueError where it is no number,
    not finite, or out of range (a hand-edited or spoilt file: "yesterday", NaN, 1e300, a huge whole number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a time must be a number, not {type(value).__name__}")
    if not 0 <= value <= WALL_TIME_MAX:  # (compared as it is: a whole number past a float's range, NaN, fail)
        raise ValueError("a time out of range")
    return float(value)


def open_regular(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """An fd on ``path`` opened with ``flags`` (close-on-exec added), where ``path`` is a regular file or is created
    as one. Anything else there (a FIFO, a device, a socket) is refused, OSError "not a regular file": a FIFO
    would hang the open itself and every write, and the loop with them, deaf to SIGTERM."""
    # Looked at first (a FIFO with no reader fails a non-blocking open for writing with ENXIO, which says nothing
    # of a FIFO), then again on the fd: what was opened is what was looked at.
    with contextlib.suppress(FileNotFoundError):
        _refuse_irregular(os.stat(path), path)
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    try:
        _refuse_irregular(os.fstat(fd), path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_irregular(info: os.stat_result, path: str | Path) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))


def read_regular_file(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them: a FIFO must not hang us, nor /dev/zero fill memory.
    Raises OSError (FileNotFoundError where there is none) or ValueError (not a regular file, too big)."""
    fd, info = _open_regular_to_read(path)
    try:
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes, more than the {limit} it can be")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def read_regular_tail(path: Path, limit: int, not_before: int) -> tuple[os.stat_result, bool, bytes]:
    """The end of a regular file (a log another writer appends to): at most ``limit`` bytes, none before offset
    ``not_before`` unless the file is now shorter than that (rolled over, replaced: all of it is new). Returns
    its stat, whether the limit cut into what was asked for (the first line may be a part), the bytes. Never
    follows a symbolic link. Raises OSError or ValueError (not a regular file)."""
    fd, info = _open_regular_to_read(path, os.O_NOFOLLOW)
    try:
        begins = not_before if info.st_size >= not_before else 0
        start = max(begins, info.st_size - limit)
        os.lseek(fd, start, os.SEEK_SET)
        return info, start > begins, os.read(fd, limit)
    finally:
        os.close(fd)


def _open_regular_to_read(path: Path, flags: int = 0) -> tuple[int, os.stat_result]:
    """An fd to read ``path`` (a FIFO's open does not block), and its stat; ValueError for anything but a regular
    file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words: null, boolean, whole number, number, string, array or object."""
    kinds = ((type(None), "null"), (bool, "boolean"), (int, "whole number"), (float, "number"), (str, "string"),
             (list, "array"), (dict, "object"))
    return next((name for python, name in kinds if isinstance(value, python)), type(value).__name__)


def not_an_object(data: Any) -> str:
    """What a JSON document that should be an object is, in JSON's words ("a JSON array, not an object")."""
    return f"a JSON {json_kind(data)}, not an object"


class StateFileError(ValueError):
    """A state file that is there but of no use, and why in one line (``str()``, the path first): it cannot be
    read as JSON (``readable`` false: not a regular file, too big, not JSON), or it is JSON but not what the
    file holds (the first place it differs). ``cause`` is the exception that found it."""

    def __init__(self, path: Path, cause: Exception, holds: str, *, readable: bool) -> None:
        self.path, self.cause, self.readable = path, cause, readable
        named = shown(str(path), PATH_CHARS, bare=True)  # (status prints it: an ESC in a state_dir stays text)
        super().__init__(f"{named} does not hold {holds} ({cause})" if readable
                         else f"{named} is unreadable ({type(cause).__name__}: {cause})")


def load_json(path: Path, limit: int, holds: str, parse: Callable[[dict[str, Any]], T]) -> T:
    """What the state file at ``path`` holds: at most ``limit`` bytes of a regular file, a JSON object, made into
    the file's value by ``parse`` (which raises ValueError, TypeError, KeyError or OverflowError, a whole number
    too big for a float, where the object is not what the file holds: ``holds`` says what that is, e.g. "a status
    snapshot"). Raises FileNotFoundError where there is none, or StateFileError."""
    try:
        data = json.loads(read_regular_file(path, limit))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, RecursionError) as exc:  # (RecursionError: JSON nested past the parser's depth)
        raise StateFileError(path, exc, holds, readable=False) from None
    if not isinstance(data, dict):
        raise StateFileError(path, TypeError(not_an_object(data)), holds, readable=True)
    try:
        return parse(data)
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise StateFileError(path, exc, holds, readable=True) from None


def save_json(path: Path, data: Any) -> None:
    """Replace the state file at ``path`` with ``data`` as JSON (atomically, fsynced, 0600); a value JSON has no
    form for is written as its text. Raises OSError."""
    write_atomically(path, json.dumps(data, default=str).encode())


class Rewrites:
    """A state file written again at each change (status.json, resume.json): a write that fails (a full disk)
    is said once, with what follows from it meanwhile, and said again once it works; never raised."""

    def __init__(self, path: Path, who: str, meanwhile: str, log: Log,
                 write: Callable[[Path, Any], None] = save_json) -> None:
        self.path, self._who, self._meanwhile, self._log, self._write = path, who, meanwhile, log, write
        self._failing = False

    def save(self, data: Callable[[], Any]) -> None:
        """Write what ``data()`` gives with ``write`` (made inside the attempt: a failure to make it is the
        write's)."""
        try:
            self._write(self.path, data())
        except OSError as exc:
            if not self._failing:
                self._failing = True
                self._log(f"{self._who}: cannot write {self.path}: {exc.strerror or exc}; {self._meanwhile}")
            return
        if self._failing:
            self._failing = False
            self._log(f"{self._who}: {self.path} written again")
