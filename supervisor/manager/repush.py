"""What was pushed under a uuid the manager forgot, pushed again under the new one, once.

The manager keeps log lines per uuid (in memory), and its dashboard shows the current row's: after a
registration again (sender.py: a forgotten uuid) a failure's reason and what the supervisor said last would
be under a uuid nobody looks at any more. So the reporter pushes, once per registration again, one text
under the new uuid: the durable pushes delivered under the old one (failures, the stopping and exiting
lines, memory_high, production summaries; the latest REPUSH_CALLS) and the supervisor's own last lines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

# The durable pushes (outbox ``log`` calls) and own lines pushed again; the whole text is cut to this.
REPUSH_CALLS = 5
RECENT_LINES = 40
REPUSH_MAX_CHARS = 64 * 1024


class RecentLines:
    """The supervisor's own last lines, as shipped (already masked)."""

    def __init__(self, keep: int = RECENT_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=keep)

    def add(self, line: str) -> None:
        self._lines.append(line)

    def lines(self) -> list[str]:
        return list(self._lines)


def repush_text(old: str, new: str, durable: Iterable[str], recent: Iterable[str]) -> str:
    """The one text pushed under ``new``: a heading, then the old uuid's durable pushes, then the recent tail."""
    parts = [f"prover-supervisor: registered again as {new}: the manager no longer knew {old}; what was pushed "
             "under it follows"]
    parts += [text.rstrip("\n") for text in durable if text.strip()]
    tail = [f"[supervisor] {line}" for line in recent]
    if tail:
        parts.append(f"prover-supervisor: the supervisor's last {len(tail)} line(s) before that:")
        parts += tail
    text = "\n".join(parts)
    return text if len(text) <= REPUSH_MAX_CHARS else text[-REPUSH_MAX_CHARS:]
