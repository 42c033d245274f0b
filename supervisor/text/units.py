"""Numbers as people write them in configs: sizes and plain digits (show.py's ``fmt_bytes`` shows sizes back), and
a float written back as plain digits.

Parsing is strict on purpose: ``str.isdigit()`` accepts "²" and "١" (which ``int``
then refuses with a traceback), and ``float("1e999")`` is infinity. Everything here
accepts ASCII digits only, stays finite and bounded, and refuses anything else with
a ``ValueError`` whose message quotes the text and says what was expected.
"""

from __future__ import annotations

import math
import re

from .show import shown

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
PIB = 1 << 50
# The largest size anything in this project asks for is a machine's memory; 1 PiB is far above
# any machine and far below what a cgroup file (a signed 64-bit number) can hold.
MAX_SIZE = PIB
MAX_SIZE_TEXT = "1PiB"

SIZE_UNITS = {
    "": 1, "b": 1,
    "k": KIB, "kb": 1000, "kib": KIB,
    "m": MIB, "mb": 1000**2, "mib": MIB,
    "g": GIB, "gb": 1000**3, "gib": GIB,
    "t": TIB, "tb": 1000**4, "tib": TIB,
    "p": PIB, "pb": 1000**5, "pib": PIB,  # (the cap itself is a size: "1PiB" was "not a size")
}
# A number of ASCII digits with an optional fraction, then an optional unit: no sign, no exponent.
_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*([A-Za-z]*)")
# More digits than this is not a size anyone meant (and int() refuses 4300 digits anyway).
_MAX_SIZE_DIGITS = 30


def is_ascii_digits(text: str) -> bool:
    """True for "0".."9" only: unlike ``str.isdigit()``, never for "²", "١" or "𝟗"."""
    return text.isascii() and text.isdigit()


def plain_decimal(number: float) -> str:
    """``number`` in the fewest digits that read back as it, with no exponent (6e8 is "600000000", 1e20
    "100000000000000000000", 1e-5 "0.00001"): as a child reads a number its environment is given."""
    from decimal import Decimal  # (a config with a float in an env only)

    return format(Decimal(repr(number + 0.0)), "f").removesuffix(".0")  # (+ 0.0: -0.0 is "0")


def parse_size(text: str | int) -> int:
    """``"128GiB"``, ``"512MiB"``, ``"64M"``, ``"1.5G"`` or a number of bytes → bytes, at most MAX_SIZE."""
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise ValueError(f"{shown(text)} is not a size (e.g. \"128GiB\", \"512MiB\")")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{text} is negative")
        if text > MAX_SIZE:
            raise ValueError(f"{shown(text)} bytes is more than the {MAX_SIZE_TEXT} a size may be")
        return text
    if text.strip().startswith("-"):
        raise ValueError(f"{shown(text)} is negative")
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None or match.group(2).lower() not in SIZE_UNITS:
        raise ValueError(f"{shown(text)} is not a size (e.g. \"128GiB\", \"512MiB\")")
    number, unit = match.groups()
    if len(number) > _MAX_SIZE_DIGITS:
        raise ValueError(f"{shown(text)} has too many digits to be a size")
    if SIZE_UNITS[unit.lower()] == 1 and not float(number).is_integer():  # (int() would cut it to whole bytes)
        hint = f" (a bare number is bytes: did you mean \"{number}GiB\"?)" if not unit else ""
        raise ValueError(f"{shown(text)} is not a whole number of bytes{hint}")
    value = float(number) * SIZE_UNITS[unit.lower()]
    if not math.isfinite(value) or value > MAX_SIZE:
        raise ValueError(f"{shown(text)} is more than the {MAX_SIZE_TEXT} a size may be")
    return int(value)
