"""A persisted outbox: every manager call is written here first, then delivered in order.

SQLite from the standard library, WAL journal, synchronous=FULL: once ``add``
returns, the call survives a SIGKILL of the supervisor and a container restart
(same ``state_dir`` volume), and the next start delivers it. Delivery is at
least once, in order; the manager's calls are idempotent per uuid and state.
The same database keeps small facts the next start needs (the uuid). The outbox knows
nothing of what a call means: a call is a kind, a JSON payload and, once delivered,
the answer the kind's handler kept (sender.py). A state_dir another instance used before
(``begin_anew``) keeps its calls for the ledger, but what was delivered for it is not
this instance's: the questions about delivered calls see this instance's only.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..text import Log

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',   -- pending, delivered, failed
    attempts INTEGER NOT NULL DEFAULT 0,
    finished REAL,
    last_error TEXT,
    response TEXT
);
CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS calls_by_state ON calls (state, kind);
"""


@dataclass(frozen=True)
class Call:
    id: int
    kind: str
    payload: dict[str, Any]
    created: float
    attempts: int


# While the file cannot be written, it is tried again this often (from the next call on the outbox).
RETRY_WRITE_S = 5.0
# A copy of the file (into memory, when it cannot be written) waits this long at most for a lock another
# connection holds: sqlite's backup retries a busy file for ever.
COPY_WAIT_S = 2.0
# Finished calls (delivered, failed) kept for the ledger, the answers and the repush: the newest this many, and
# each kind's last delivered one whatever its age. Production pushes a summary every few minutes: without a bound
# the file would grow for as long as the instance proves. Older ones go every PRUNE_EVERY finishes.
KEEP_FINISHED = 1000
PRUNE_EVERY = 100
PRUNE = ("DELETE FROM calls WHERE state != 'pending' "
         "AND id < (SELECT min(id) FROM (SELECT id FROM calls WHERE state != 'pending' ORDER BY id DESC LIMIT ?)) "
         "AND id NOT IN (SELECT max(id) FROM calls WHERE state = 'delivered' GROUP BY kind)")
# Error names that say the file's content is damaged; anything else (full, I/O, locked) is passing.
CORRUPTION = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
# Where calls go once the outbox cannot be read at all (not even to copy it): far above any id the file
# can hold, so when both meet again the file's older calls still come first.
UNREADABLE_FIRST_ID = 1 << 40
OWN_FROM = "own_from"  # the fact: the first call id of the instance this outbox serves now (begin_anew)
HISTORY = ("id", "kind", "state", "attempts", "created", "finished", "last_error", "payload", "response")
CALL_COLUMNS = ("id", "kind", "payload", "created", "state", "attempts", "finished", "last_error", "response")
# A whole call row with its id (salvaged rows, and calls made in memory, keep theirs in the file); a row
# already there (a write reported failed that landed after all) is replaced, not refused.
INSERT_ROW = f"INSERT OR REPLACE INTO calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))})"

Note = Log  # where the outbox says what it found (the supervisor's log)


class ForeignTables(sqlite3.DatabaseError):
    """A database whose tables are not the outbox's (another program's file, an older layout): damage too, for
    every query on it would fail, and for ever (its calls table without a state column failed each call)."""


def is_corruption(exc: sqlite3.Error) -> bool:
    return isinstance(exc, ForeignTables) or str(getattr(exc, "sqlite_errorname", "")).startswith(CORRUPTION)


def describe(exc: sqlite3.Error) -> str:
    return f"{exc} ({getattr(exc, 'sqlite_errorname', exc.__class__.__name__)})"


class Outbox:
    """The calls and facts, on disk; in memory while the disk cannot take them.

    A full disk is not corruption: when a write fails (SQLITE_FULL, a disk I/O error), the
    whole outbox is copied into an in-memory database (reading still works on a full disk),
    every call goes on there, in order, and each change is kept to be written to the file
    later, in one transaction, once it takes writes again. A damaged file is another
    matter (``_salvage``): what is readable is kept, the rest moved aside.
    """

    def __init__(self, path: Path | str, note: Note | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._note: Note = note or (lambda _message: None)
        self.corrupt_note: str | None = None  # said by the caller at start (it has the log by then)
        self._disk: sqlite3.Connection | None = None
        self._memory: sqlite3.Connection | None = None  # set while the file cannot be written
        self._unwritten: list[tuple[str, tuple[Any, ...]]] = []  # changes made in memory, in order
        self._finished = 0  # calls finished by this start (every PRUNE_EVERY of them, the oldest go)
        self._retry_at = 0.0
        self._file_usable = True  # False: a damaged file that could not be moved aside
        self._closed = False
        self._open()
        self._own_from = 0  # calls below this id were another instance's (begin_anew)
        own_from = self.get(OWN_FROM)
        if own_from is not None and own_from.isascii() and own_from.isdigit():
            self._own_from = int(own_from)
        elif own_from is not None:  # (written by something else): nothing delivered so far is known to be ours
            self._note(f"outbox: its {OWN_FROM} fact {own_from[:40]!r} is no call id; the calls so far are taken "
                       "for another instance's")
            self.begin_anew()

    # ------------------------------------------------------------ opening, checking, salvaging

    def _open(self) -> None:
        try:
            db = self._connect()
        except sqlite3.Error as exc:
            if is_corruption(exc):
                self._salvage(None, describe(exc))
            else:
                self._spill(f"cannot open it: {describe(exc)}")
            return
        try:
            problems = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.Error as exc:
            if not is_corruption(exc):  # (a full disk can fail a read too: that is no reason to move it aside)
                self._disk = db
                self._spill(f"cannot read it: {describe(exc)}")
                return
            problems = [describe(exc)]
        if problems == ["ok"]:
            self._disk = db
        else:
            self._salvage(db, "; ".join(problems[:3]))

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        try:
            _check_tables(db)  # (first: a file that is not the outbox's is moved aside as it was, not made WAL)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(SCHEMA)
        except sqlite3.Error:
            _close_quietly(db)
            raise
        return db

    def _salvage(self, db: sqlite3.Connection | None, problem: str) -> None:
        """Damaged: keep every row still readable, move the file aside (with its WAL and SHM), start afresh."""
        calls, facts = read_what_is_readable(db) if db is not None else ([], [])
        if db is not None:
            _close_quietly(db)
        aside = self.path.with_name(self.path.name + f".corrupt-{int(time.time())}")
        try:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{self.path}{suffix}").replace(f"{aside}{suffix}")
        except OSError as exc:
            # It stays where it is, and is never written again in this run: the calls live in memory.
            self._file_usable = False
            aside_note = f"could not be moved aside ({exc.strerror or exc})"
        else:
            aside_note = f"moved to {aside}"
        pending = sum(1 for call in calls if call[4] == "pending")
        if calls or facts:
            self.corrupt_note = (f"outbox {self.path} is damaged ({problem}); {aside_note}; starting afresh with what "
                                 f"was readable: {len(calls)} call(s) ({pending} pending), {len(facts)} fact(s)")
        else:
            self.corrupt_note = f"outbox {self.path} was unreadable ({problem}); {aside_note}, starting clean"
        try:
            if not self._file_usable:
                raise sqlite3.OperationalError("the damaged file is still in its place")
            self._disk = self._connect()
        except sqlite3.Error as exc:
            self._spill(f"cannot create it afresh: {describe(exc)}")
        for call in calls:
            self._write(INSERT_ROW, tuple(call))
        for fact in facts:
            self._write("INSERT OR REPLACE INTO facts (key, value) VALUES (?, ?)", tuple(fact))

    # ------------------------------------------------------------ memory while the disk is full

    @property
    def _db(self) -> sqlite3.Connection:
        db = self._memory or self._disk
        assert db is not None
        return db

    @property
    def in_memory(self) -> bool:
        """Calls are kept in memory: the file cannot be written (said once, when it started)."""
        return self._memory is not None

    def _spill(self, why: str) -> None:
        """Go on in memory from what the file holds, and say so once."""
        memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        copied = self._copy_into(memory)
        memory.executescript(SCHEMA)
        if not copied:
            memory.execute("INSERT OR REPLACE INTO sqlite_sequence (name, seq) VALUES ('calls', ?)",
                           (UNREADABLE_FIRST_ID,))
        if self._disk is not None:
            _close_quietly(self._disk)
            self._disk = None
        self._memory = memory
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        pending = memory.execute("SELECT count(*) FROM calls WHERE state = 'pending'").fetchone()[0]
        self._note(f"outbox: cannot write {self.path}: {why}; its {pending} pending call(s) and every new one are "
                   f"kept in memory and delivered from there, in order; writing them to the file is tried every "
                   f"{RETRY_WRITE_S:g}s" + ("" if copied else " (the file could not even be read: its calls, if "
                                                          "any, go out once it can be)"))

    def _copy_into(self, memory: sqlite3.Connection) -> bool:
        """Copy the file into ``memory``: through the open connection, else (a file that cannot even map
        its shared memory on a full disk) in exclusive locking mode, which keeps the WAL index in the heap."""
        if self._disk is not None:
            try:
                self._disk.backup(memory, progress=_within(COPY_WAIT_S))
                return True
            except sqlite3.Error:
                pass
            _close_quietly(self._disk)
            self._disk = None
        if not self.path.is_file() or not self._file_usable:
            return False
        try:
            source = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=2)
        except sqlite3.Error:
            return False
        try:
            source.execute("PRAGMA locking_mode=EXCLUSIVE")
            source.backup(memory, progress=_within(COPY_WAIT_S))
            return True
        except sqlite3.Error:
            return False
        finally:
            _close_quietly(source)

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        """One change: to the file, or (once it failed) to memory, kept for the file."""
        if self._memory is None:
            try:
                self._db.execute(sql, params)
                return
            except sqlite3.Error as exc:
                self._spill(describe(exc))
        assert self._memory is not None
        self._memory.execute(sql, params)
        self._unwritten.append((sql, params))

    def _try_the_file_again(self) -> None:
        """Every RETRY_WRITE_S while in memory: write what was kept, in one transaction, then go back to it."""
        if self._memory is None or time.monotonic() < self._retry_at or not self._file_usable:
            return
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        try:
            disk = self._connect()
        except sqlite3.Error:
            return
        try:
            disk.execute("BEGIN IMMEDIATE")
            for sql, params in self._unwritten:
                disk.execute(sql, params)
            disk.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                disk.execute("ROLLBACK")
            _close_quietly(disk)
            return
        written = len(self._unwritten)
        self._unwritten.clear()
        _close_quietly(self._memory)
        self._memory, self._disk = None, disk
        self._note(f"outbox: {self.path} can be written again; the {written} change(s) kept in memory are in it now")

    # ------------------------------------------------------------ the calls

    def add(self, kind: str, payload: dict[str, Any] | None = None) -> int:
        with self._lock:
            return self._add_locked(kind, payload)

    def add_unless_pending(self, kind: str, payload: dict[str, Any], kinds: Collection[str]) -> int | None:
        """``kind`` added, unless a call of ``kinds`` is pending: one step, so that another thread's call comes
        before both or after both. None: one was pending, nothing added."""
        with self._lock:
            marks = ", ".join("?" * len(kinds))
            if kinds and self._read_locked(f"SELECT 1 FROM calls WHERE state = 'pending' AND kind IN ({marks}) "
                                           "LIMIT 1", tuple(kinds)):
                return None
            return self._add_locked(kind, payload)

    def _add_locked(self, kind: str, payload: dict[str, Any] | None) -> int:
        """(under the lock)"""
        self._try_the_file_again()
        params = (kind, json.dumps(payload or {}), time.time())
        if self._memory is None:
            try:
                cur = self._db.execute("INSERT INTO calls (kind, payload, created) VALUES (?, ?, ?)", params)
                return int(cur.lastrowid or 0)
            except sqlite3.Error as exc:
                self._spill(describe(exc))
        assert self._memory is not None
        # In memory the id is decided here, and written with the call: the file must give it the same one.
        call_id = int(self._memory.execute("INSERT INTO calls (kind, payload, created) VALUES (?, ?, ?)",
                                           params).lastrowid or 0)
        row = self._memory.execute(f"SELECT {', '.join(CALL_COLUMNS)} FROM calls WHERE id = ?",
                                   (call_id,)).fetchone()
        self._unwritten.append((INSERT_ROW, tuple(row)))
        return call_id

    def next_pending(self) -> Call | None:
        return self._first_pending("", ())

    def next_pending_of(self, kind: str) -> Call | None:
        """The oldest pending call of one kind, wherever it stands in the queue."""
        return self._first_pending(" AND kind = ?", (kind,))

    def next_pending_except(self, kind: str) -> Call | None:
        """The oldest pending call of any other kind, wherever it stands in the queue."""
        return self._first_pending(" AND kind != ?", (kind,))

    def _first_pending(self, where: str, params: tuple[Any, ...]) -> Call | None:
        # Through _read like every query: a file that cannot be read falls back to memory, never
        # raises into the sender thread.
        failed = None
        while True:
            row = self._read_one("SELECT id, kind, payload, created, attempts FROM calls "
                                 f"WHERE state = 'pending'{where} ORDER BY id LIMIT 1", params)
            if row is None or row[0] == failed:  # (one that could not be marked failed is not read for ever)
                return None
            call = self._usable(row)
            if call is not None:
                return call
            failed = row[0]

    def _usable(self, row: tuple[Any, ...]) -> Call | None:
        """The pending row's call; one that is none is failed, said in one line, and never asked again."""
        call = call_of(tuple(row))
        if call is None:
            self._note(f"outbox: call {row[0]!r} ({str(row[1])[:40]!r}) is unreadable (its payload is no JSON "
                       "object, or a field is of the wrong type); failed, not sent")
            self._finish(row[0], "failed", "unreadable: not a call this outbox wrote", None, sent=False)
        return call

    def attempted(self, call_id: int, error: str) -> None:
        with self._lock:
            self._try_the_file_again()
            self._write("UPDATE calls SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                        (error[:500], call_id))

    def delivered(self, call_id: int, response: Any = None, *, sent: bool = True) -> None:
        """``sent`` False: delivered by a try already counted (a give-up whose answer was lost: sender.py)."""
        self._finish(call_id, "delivered", None, response, sent=sent)

    def failed(self, call_id: int, error: str, *, sent: bool) -> None:
        """Failed for good. ``sent``: its last request went out (a refusal the manager answered); False for one
        not sent (a killed row, given up, set aside, no handler, a bug of ours on the way), which adds no attempt:
        status shows the attempts, and an operator reads one as a request the manager received."""
        self._finish(call_id, "failed", error, None, sent=sent)

    def fail_pending(self, error: str, which: Callable[[Call], bool]) -> list[str]:
        """Every pending call ``which`` chooses failed with ``error``, in one write: their kinds, oldest first."""
        chosen = [call for call in self._pending_where("", ()) if which(call)]
        if chosen:
            with self._lock:
                self._try_the_file_again()
                self._write(f"UPDATE calls SET state = 'failed', finished = ?, last_error = ? "
                            f"WHERE state = 'pending' AND id IN ({', '.join('?' * len(chosen))})",
                            (time.time(), error, *(call.id for call in chosen)))
        return [call.kind for call in chosen]

    def begin_anew(self) -> None:
        """The calls so far were another instance's (the state_dir of another label): from now on, the questions
        about delivered calls (delivered_answer, last_delivered_of, delivered_payloads, find) see only the calls
        added after this."""
        row = self._read_one("SELECT max(id) FROM calls")
        self._own_from = int(row[0] or 0) + 1 if row is not None else 0
        self.put(OWN_FROM, str(self._own_from))

    def find(self, kind: str, payload: dict[str, Any]) -> tuple[int, str] | None:
        """The latest call of this instance with this kind and exactly this payload: its id and state."""
        row = self._read_one("SELECT id, state FROM calls WHERE kind = ? AND payload = ? AND id >= ? "
                             "ORDER BY id DESC LIMIT 1", (kind, json.dumps(payload), self._own_from))
        return None if row is None else (int(row[0]), str(row[1]))

    def _finish(self, call_id: int, state: str, error: str | None, response: Any, *, sent: bool) -> None:
        with self._lock:
            self._try_the_file_again()
            self._write("UPDATE calls SET state = ?, finished = ?, attempts = attempts + ?, last_error = ?, "
                        "response = ? WHERE id = ?", (state, time.time(), int(sent), error, json.dumps(response),
                                                      call_id))
            self._finished += 1
            if self._finished % PRUNE_EVERY == 0:
                self._write(PRUNE, (KEEP_FINISHED,))

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """A query; a file that cannot even be read any more is left for memory, like a full one."""
        with self._lock:
            return self._read_locked(sql, params)

    def _read_locked(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        self._try_the_file_again()
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            if self._memory is not None:
                raise
            self._spill(describe(exc))
            return self._db.execute(sql, params).fetchall()

    def _read_one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        rows = self._read(sql, params)
        return rows[0] if rows else None

    def pending(self) -> int:
        return int(self._read_one("SELECT count(*) FROM calls WHERE state = 'pending'")[0])

    def pending_of(self, kind: str) -> int:
        return int(self._read_one("SELECT count(*) FROM calls WHERE kind = ? AND state = 'pending'", (kind,))[0])

    def is_pending(self, call_id: int) -> bool:
        """This call (``add``'s id) is still waiting to be delivered."""
        return self._read_one("SELECT 1 FROM calls WHERE id = ? AND state = 'pending'", (call_id,)) is not None

    def holds(self, call_id: int) -> bool:
        """``is_pending``, for a thread that may ask after the exit closed the outbox (the log shipper's last
        pushes). Closed, it answers True whatever the call's state, and is not opened again to say so (a read on
        the closed file would go on in memory): the exit is over, and what it may still hold waits for the next
        start, with nothing pushed around it."""
        with self._lock:
            if self._closed:
                return True
            return bool(self._read_locked("SELECT 1 FROM calls WHERE id = ? AND state = 'pending'", (call_id,)))

    def pending_calls(self, kind: str) -> list[Call]:
        """Every pending call of one kind, oldest first."""
        return self._pending_where(" AND kind = ?", (kind,))

    def _pending_where(self, where: str, params: tuple[Any, ...]) -> list[Call]:
        rows = self._read("SELECT id, kind, payload, created, attempts FROM calls "
                          f"WHERE state = 'pending'{where} ORDER BY id", params)
        return [call for call in map(self._usable, rows) if call is not None]

    def delivered_answer(self, kind: str) -> Any:
        """The manager's answer to this instance's last delivered call of this kind; None if none was delivered."""
        row = self._read_one("SELECT response FROM calls WHERE kind = ? AND state = 'delivered' AND id >= ? "
                             "ORDER BY id DESC LIMIT 1", (kind, self._own_from))
        return None if row is None else _loads(row[0] or "null") or {}

    def last_delivered_of(self, kinds: Collection[str]) -> Call | None:
        """This instance's latest delivered call of any of ``kinds`` (each kind's last one is kept, whatever its
        age)."""
        if not kinds:
            return None
        row = self._read_one("SELECT id, kind, payload, created, attempts FROM calls WHERE state = 'delivered' "
                             f"AND kind IN ({', '.join('?' * len(kinds))}) AND id >= ? ORDER BY id DESC LIMIT 1",
                             (*kinds, self._own_from))
        return None if row is None else call_of(tuple(row))

    def delivered_payloads(self, kind: str, limit: int) -> list[dict[str, Any]]:
        """The payloads of this instance's latest ``limit`` delivered calls of ``kind``, oldest first."""
        sql = ("SELECT payload FROM calls WHERE kind = ? AND state = 'delivered' AND id >= ? "
               "ORDER BY id DESC LIMIT ?")
        payloads = [_loads(row[0]) for row in reversed(self._read(sql, (kind, self._own_from, limit)))]
        return [payload for payload in payloads if isinstance(payload, dict)]

    def history(self, limit: int = 50, without: str = "") -> list[dict[str, Any]]:
        """The latest ``limit`` calls (but those of kind ``without``), oldest first, payload and answer as stored."""
        rows = self._read(f"SELECT {', '.join(HISTORY)} FROM calls WHERE kind != ? ORDER BY id DESC LIMIT ?",
                          (without, limit))
        return [dict(zip(HISTORY, row, strict=True)) for row in reversed(rows)]

    def get(self, key: str) -> str | None:
        row = self._read_one("SELECT value FROM facts WHERE key = ?", (key,))
        return None if row is None else str(row[0])

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._try_the_file_again()
            self._write("INSERT INTO facts (key, value) VALUES (?, ?) "
                                  "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._memory is not None:
                self._retry_at = 0.0
                self._try_the_file_again()
            if self._memory is not None:
                self._note(f"outbox: {len(self._unwritten)} change(s) kept in memory could not be written to "
                           f"{self.path} before exit; the calls among them are lost")
                _close_quietly(self._memory)
            if self._disk is not None:
                _close_quietly(self._disk)


def _within(seconds: float) -> Callable[[int, int, int], None]:
    """A backup's progress callback that gives up once ``seconds`` have passed (sqlite3 calls it at each step, a
    busy one included; what it raises ends the backup)."""
    deadline = time.monotonic() + seconds

    def progress(status: int, remaining: int, total: int) -> None:
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError(f"the file stayed locked for {seconds:g}s")

    return progress


def read_what_is_readable(db: sqlite3.Connection) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every call row and fact a damaged file still yields: table scans (no index), from both ends,
    so one bad page costs only the rows on it."""
    calls: dict[int, tuple[Any, ...]] = {}
    for order in ("ASC", "DESC"):
        with contextlib.suppress(sqlite3.Error):
            for row in db.execute(f"SELECT {', '.join(CALL_COLUMNS)} FROM calls ORDER BY id {order}"):
                calls[row[0]] = tuple(row)
    facts: dict[str, tuple[Any, ...]] = {}
    for order in ("ASC", "DESC"):
        with contextlib.suppress(sqlite3.Error):
            for row in db.execute(f"SELECT key, value FROM facts NOT INDEXED ORDER BY rowid {order}"):
                facts[row[0]] = tuple(row)
    return [calls[k] for k in sorted(calls)], list(facts.values())


# The columns each of the outbox's tables must have (a table not there yet is made by SCHEMA).
TABLE_COLUMNS = {"calls": CALL_COLUMNS, "facts": ("key", "value")}


def _check_tables(db: sqlite3.Connection) -> None:
    """ForeignTables where the file holds tables but no calls (another program's database: the outbox's would
    have been written into it), or a table of the outbox's name lacks one of its columns, or its calls are not
    keyed by a whole-number id (a row of NULL id could never be marked failed: the sender read it for ever)."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if tables - {"sqlite_sequence"} and "calls" not in tables:
        raise ForeignTables(f"not the outbox's tables: {', '.join(sorted(tables))[:80]}, and no calls")
    columns_of: dict[str, dict[str, tuple[Any, ...]]] = {}  # table → its columns' PRAGMA rows, by name
    for table, columns in TABLE_COLUMNS.items():
        found = columns_of[table] = {row[1]: row for row in db.execute(f"PRAGMA table_info({table})")}
        missing = [column for column in columns if column not in found]
        if found and missing:
            raise ForeignTables(f"not the outbox's tables: {table} has no column {', '.join(missing)}")
    key = columns_of["calls"].get("id")  # (its type, then whether it is the primary key: PRAGMA's 3rd and 6th)
    if columns_of["calls"] and not (key is not None and str(key[2]).upper() == "INTEGER" and key[5] == 1):
        raise ForeignTables("not the outbox's tables: calls is not keyed by an INTEGER PRIMARY KEY id")


def call_of(row: tuple[Any, ...]) -> Call | None:
    """A call from its row (id, kind, payload, created, attempts); None where the row is none (a payload that is
    not a JSON object, a kind that is no text: a file another program wrote into)."""
    call_id, kind, payload, created, attempts = row
    value = _loads(payload)
    if not isinstance(value, dict) or not isinstance(kind, str) or not isinstance(call_id, int) \
            or isinstance(created, bool) or not isinstance(created, int | float) or not isinstance(attempts, int):
        return None
    return Call(call_id, kind, value, float(created), attempts)


def _loads(text: Any) -> Any:
    """A stored JSON value; None where it is none."""
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _close_quietly(db: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        db.close()
