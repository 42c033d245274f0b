"""A value in a line: how every log line, status line and error shows a value it did not write itself.

A value may be anything (a config's string with a newline in it, a manager's answer of a megabyte, an int of
5000 digits), and the line that quotes it must stay one readable line. So there is one way to show one:

- ``shown``: the value quoted as Python writes it (``repr``: every character that does not print escaped, a
  newline, an escape code, a right-to-left mark, a lone surrogate from the environment), cut to a length with
  "...". ``bare`` leaves a plain word (printable, no white space) unquoted, for a name: a key, a path.
  ``ascii_only``, for what a peer sent (the manager's answers): every character outside ASCII escaped too, so
  nothing it sends can pass for something else in our line; a config's value is shown as its author wrote it
  (a TOML date or time as ISO 8601, not as Python's constructor call; a boolean ``true``, as TOML and JSON
  write it, not Python's ``True``);
- ``logged``: a value in a log line of the supervisor's own (an argv, a verdict's text): bare when it is one
  word, else in plain double quotes, control characters escaped: readable where shlex's ``'"'"'`` is not;
- ``escaped``: every character of a text that does not print written as its escape (``logged``'s, and a
  child's line in ``status``: ansi.plain);
- ``one_line``: a why of any size (an exception's text, an answer) as words on one line, cut;
- ``summary``: an exception, as a line says it: its type and the first line of its message;
- ``shown_bytes``: bytes a peer sent (an HTTP answer's body) decoded leniently, escaped where they do not
  print, the first of them only;
- ``cut``: the one way a text is cut to a length, with a mark where it was;
- ``fmt_bytes``: a number of bytes for people (units.py parses what people write);
- ``span``: a duration for people, short (``42s``, ``3m05s``, ``2h10m``): a status line's age, a log line's
  time left or ETA.

Specialisations live with their concept: a URL with its password masked (redact.shown_url).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

# A value quoted in an error is cut to this many characters: the line stays readable, the value recognisable.
SHOWN_CHARS = 60
# A path is shown whole (PATH_MAX): cut, it would name no file.
PATH_CHARS = 4096
CUT_MARK = "..."
# What an int too long for Python to print (more than sys.get_int_max_str_digits() digits) is shown as.
TOO_MANY_DIGITS = "a number with too many digits"
_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def cut(text: str, limit: int, mark: str = CUT_MARK) -> str:
    """``text`` in at most ``limit`` characters: cut short, ``mark`` at the end, where it is longer."""
    return text if len(text) <= limit else text[:limit - len(mark)] + mark


def shown(value: object, limit: int = SHOWN_CHARS, *, bare: bool = False, ascii_only: bool = False) -> str:
    """``value`` as a line may quote it: quoted (``repr``, or ``ascii`` with ``ascii_only``), at most ``limit``
    characters. ``bare``: a string that is a plain word (printable, non-empty, no space) is shown as it is."""
    if bare and isinstance(value, str) and value and value.isprintable() and not _has_space(value):
        return cut(value, limit)
    if isinstance(value, (datetime.date, datetime.time)):  # (datetime is a date)
        return cut(value.isoformat(), limit)
    if isinstance(value, bool):  # as TOML and JSON, where every value shown comes from, spell it
        return "true" if value else "false"
    try:
        text = ascii(value) if ascii_only else repr(value)
    except ValueError:  # an int of more digits than Python prints
        return TOO_MANY_DIGITS
    return cut(text, limit)


def logged(text: str) -> str:
    """A value as a log line of the supervisor's shows it: bare when it is one word, else in plain double quotes
    (a ``"`` or ``\\`` inside escaped with ``\\``); a control character (a newline) escaped, so the line stays one."""
    if not text or _has_space(text) or '"' in text or "'" in text or "\\" in text:
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped(text)


def escaped(text: str, keep: str = "") -> str:
    """``text`` with every character that does not print (a newline, ESC, a C1 control, a right-to-left mark)
    written as its escape, as ``repr`` writes it (``\\x1b``); those in ``keep`` stay as they are."""
    if text.isprintable():  # (the usual line: nothing to escape, no walk of its characters)
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def one_line(text: object, limit: int, mark: str = CUT_MARK) -> str:
    """``text`` (any object, as ``str()`` writes it) as words on one line (every run of white space, a newline
    among them, made one space), at most ``limit`` characters."""
    return cut(" ".join(str(text).split()), limit, mark)


def summary(exc: BaseException) -> str:
    """The exception on one line: its type and the first line of its message."""
    text = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def shown_bytes(data: bytes, limit: int = SHOWN_CHARS) -> str:
    """Bytes a peer sent as a line may show them: the first ``limit`` decoded leniently (UTF-8, a bad byte
    replaced), every character escaped as ``ascii`` writes it if any does not print, "..." where cut."""
    text = data[:limit].decode("utf-8", errors="replace")
    if not text.isprintable():
        text = ascii(text)[1:-1]
    return text if len(data) <= limit else text + CUT_MARK


def fmt_bytes(n: int | None) -> str:
    """Bytes for people: ``"1.5GiB"``, ``"64.0MiB"``, ``"1023B"``; ``"?"`` when unknown."""
    if n is None:
        return "?"
    for unit, size in _BYTE_UNITS:
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


def _has_space(text: str) -> bool:
    """Any white space in ``text`` (str.split's, which is str.isspace's)."""
    return text.split() != [text] if text else False


def span(seconds: Any) -> str:
    """A duration, short (``42s``, ``3m05s``, ``2h10m``), ``?`` for what is not one; a negative one is none
    (``0s``: a clock that stepped back)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "?"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
