"""Terminal escape sequences in children's output: what one looks like, and taking them out.

cuzk-daemon colours its logs. The console keeps the codes; what is shipped to the manager or read
by a parser has them stripped; the secret masking (redact.py) sees through them.
"""

from __future__ import annotations

import re

from .show import escaped

# One escape sequence: CSI (colours, cursor moves), OSC (titles, hyperlinks: ended by BEL or ST), or
# a two-byte escape.
ANSI_PATTERN = rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"
ANSI_RE = re.compile(ANSI_PATTERN)
# An escape sequence begun but not finished where the bytes end (its rest is in the next read).
UNFINISHED_RE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?\Z")


def strip_ansi(data: bytes) -> bytes:
    return ANSI_RE.sub(b"", data) if b"\x1b" in data else data


def plain(line: str) -> str:
    """A line of a child's as a person reads it (status, the manager's setup log): its escape codes taken out,
    and every character that still does not print (a lone ESC, which a code taken out from between it and its
    rest left behind; a C1 CSI, a backspace, a carriage return, a right-to-left mark) written as its escape,
    ``\\x1b``: nothing a child prints acts on the reader's terminal. A tab stays. (Bytes that were no UTF-8,
    kept as surrogate escapes, come out as U+FFFD.)"""
    return escaped(strip_ansi(line.encode("utf-8", "surrogateescape")).decode("utf-8", "replace"), keep="\t")


def codes_in(data: bytes) -> bytes:
    """The escape sequences of ``data``, joined, without the text between them."""
    return b"".join(ANSI_RE.findall(data)) if b"\x1b" in data else b""
