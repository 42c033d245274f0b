"""What the manager was told: the outbox's latest calls as a ledger the status view shows.

One entry a call, oldest first: its kind, what it was queued with (the payload's small values, masked,
each cut short), the manager's answer as kept (``passed: false``), its state (pending, delivered,
failed), its attempts, when it was queued and finished, and its last error. The payload is the
supervisor's word for the call; its call kind sends what the manager reads of it (a bench-done's
``reason`` only with ``bench_done_reason``, its ``failed`` never). Log pushes are left out (their text is
the log itself, and they would crowd the calls out); the log shipper's backlog says how they fare. A
pure function of the outbox's rows (outbox.Outbox.history).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# How many of the latest calls the ledger shows, and how long a value it carries may be.
LEDGER_CALLS = 20
LEDGER_VALUE_CHARS = 200


def ledger(rows: Iterable[Mapping[str, Any]], mask: Callable[[str], str]) -> list[dict[str, Any]]:
    """The ledger of ``rows`` (outbox history rows: payload and response as stored JSON text)."""
    return [{"id": row.get("id"), "kind": row.get("kind"), "state": row.get("state"),
             "attempts": row.get("attempts"), "created": row.get("created"), "finished": row.get("finished"),
             "carried": _small(_parsed(row.get("payload")), mask), "answer": _small(_parsed(row.get("response")), mask),
             "last_error": mask(str(row["last_error"]))[:LEDGER_VALUE_CHARS] if row.get("last_error") else None}
            for row in rows]


def _parsed(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _small(value: Any, mask: Callable[[str], str]) -> dict[str, Any]:
    """The scalar values of a JSON object, strings masked and cut; anything else is left out."""
    if not isinstance(value, dict):
        return {}
    kept: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, str):
            kept[str(key)] = mask(item)[:LEDGER_VALUE_CHARS]
        elif item is None or isinstance(item, bool | int) or (isinstance(item, float) and math.isfinite(item)):
            kept[str(key)] = item
    return kept
