"""A persisted outbox: every manager call is written here first, then delivered in order.

SQLite from the standard library, WAL journal, synchronous=FULL: once ``add``
returns, the call survives a SIGKILL of the supervisor and a container restart
(same ``state_dir`` volume), and the next start delivers it. Delivery is at
least once, in order; the manager's calls are idempotent per uuid and state.
The same database keeps small facts the next start needs (the uuid).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
"""


@dataclass(frozen=True)
class Call:
    id: int
    kind: str
    payload: dict[str, Any]
    created: float
    attempts: int


class Outbox:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            db = self._connect()
            db.execute("SELECT count(*) FROM calls").fetchone()
            return db
        except sqlite3.DatabaseError as exc:
            # A corrupt file must never wedge the supervisor: keep it aside, start clean.
            aside = self.path.with_name(self.path.name + f".corrupt-{int(time.time())}")
            self.path.replace(aside)
            self.corrupt_note = f"outbox {self.path} was unreadable ({exc}); moved to {aside}, starting clean"
            return self._connect()

    corrupt_note: str | None = None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        return db

    def add(self, kind: str, payload: dict[str, Any] | None = None) -> int:
        with self._lock:
            cur = self._db.execute("INSERT INTO calls (kind, payload, created) VALUES (?, ?, ?)",
                                   (kind, json.dumps(payload or {}), time.time()))
            return int(cur.lastrowid or 0)

    def next_pending(self) -> Call | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, kind, payload, created, attempts FROM calls WHERE state = 'pending' ORDER BY id LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        return Call(row[0], row[1], json.loads(row[2]), row[3], row[4])

    def next_pending_of(self, kind: str) -> Call | None:
        """The oldest pending call of one kind, wherever it stands in the queue."""
        with self._lock:
            row = self._db.execute("SELECT id, kind, payload, created, attempts FROM calls "
                                   "WHERE state = 'pending' AND kind = ? ORDER BY id LIMIT 1", (kind,)).fetchone()
        return None if row is None else Call(row[0], row[1], json.loads(row[2]), row[3], row[4])

    def attempted(self, call_id: int, error: str) -> None:
        with self._lock:
            self._db.execute("UPDATE calls SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                             (error[:500], call_id))

    def delivered(self, call_id: int, response: Any = None) -> None:
        self._finish(call_id, "delivered", None, response)

    def failed(self, call_id: int, error: str) -> None:
        self._finish(call_id, "failed", error, None)

    def _finish(self, call_id: int, state: str, error: str | None, response: Any) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE calls SET state = ?, finished = ?, attempts = attempts + 1, last_error = ?, response = ? "
                "WHERE id = ?", (state, time.time(), error, json.dumps(response), call_id))

    def pending(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM calls WHERE state = 'pending'").fetchone()[0])

    def has(self, kind: str) -> bool:
        """A call of this kind is pending or was delivered (a failed one may be queued again)."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM calls WHERE kind = ? AND state != 'failed' LIMIT 1",
                                   (kind,)).fetchone()
        return row is not None

    def pending_of(self, kind: str) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM calls WHERE kind = ? AND state = 'pending'",
                                        (kind,)).fetchone()[0])

    def delivered_answer(self, kind: str) -> Any:
        """The manager's answer to the last delivered call of this kind; None if none was delivered."""
        with self._lock:
            row = self._db.execute("SELECT response FROM calls WHERE kind = ? AND state = 'delivered' "
                                   "ORDER BY id DESC LIMIT 1", (kind,)).fetchone()
        return None if row is None else json.loads(row[0] or "null") or {}

    def history(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, kind, state, attempts, created, finished, last_error FROM calls ORDER BY id DESC LIMIT ?",
                (limit,)).fetchall()
        keys = ("id", "kind", "state", "attempts", "created", "finished", "last_error")
        return [dict(zip(keys, row, strict=True)) for row in reversed(rows)]

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM facts WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO facts (key, value) VALUES (?, ?) "
                             "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def close(self) -> None:
        with self._lock:
            self._db.close()
