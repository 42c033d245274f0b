"""The dev-manager's reading of ``X-Log-Seq``: each numbered log line kept once (devmanager.py).

Part of the stand-in of the external fleet manager, a tool: it imports nothing of the supervisor. Today's
manager ignores the header; the dev-manager keeps, per uuid, run and source, the highest line number it
has, so a push sent again after a read timeout (which it had in fact received) is not stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# (logship.SEQ_HEADER: the dev-manager shares none of the supervisor's protocol code)
SEQ_HEADER = "X-Log-Seq"


@dataclass
class LineSequence:
    """What ``X-Log-Seq`` (``<run>:<source>:<first>-<last>``) let through: the highest line number kept per
    uuid, run and source, and how much came again (a push retried after a timeout it had in fact made)."""

    highest: dict[tuple[str, str, str], int] = field(default_factory=dict)
    pushes: int = 0
    numbered: int = 0  # pushes that carried the header
    duplicate_pushes: int = 0  # pushes with at least one line already kept
    duplicate_lines: int = 0
    lines: int = 0  # numbered lines received, duplicates included

    def keep_new(self, uuid: str, header: str | None, text: str) -> str:
        """The part of a pushed body not received before (all of it without a well-formed header)."""
        self.pushes += 1
        numbers = _parse_seq(header)
        if numbers is None:
            return text
        run, source, first, last = numbers
        self.numbered += 1
        self.lines += last - first + 1
        key = (uuid, run, source)
        seen = self.highest.get(key, 0)
        self.highest[key] = max(seen, last)
        if seen < first:
            return text
        repeated = min(seen, last) - first + 1
        self.duplicate_pushes += 1
        self.duplicate_lines += repeated
        lines = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
        # The numbered lines are the last last-first+1 of the body (a "dropped" note may come first, and
        # came the first time too): keep only the ones past what was seen.
        fresh = lines[len(lines) - (last - first + 1) + repeated:] if last > seen else []
        return "".join(line + "\n" for line in fresh)

    def summary(self) -> dict[str, int]:
        return {"pushes": self.pushes, "numbered": self.numbered, "lines": self.lines,
                "duplicate_pushes": self.duplicate_pushes, "duplicate_lines": self.duplicate_lines}


def _parse_seq(header: str | None) -> tuple[str, str, int, int] | None:
    if not header:
        return None
    try:
        run, source, span = header.rsplit(":", 2)
        first, last = (int(n) for n in span.split("-", 1))
    except ValueError:
        return None
    return (run, source, first, last) if 1 <= first <= last else None
