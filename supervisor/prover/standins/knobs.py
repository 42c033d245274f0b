"""The stand-ins' knobs and timing: durations, sizes, addresses, as the real programs read them.

``STANDIN_SPEED`` (float, default 1.0)
    Multiplies every *built-in* simulated duration (proof time, chunk interval, ...).
    Tests use e.g. 0.05. Durations given explicitly through a ``STANDIN_*_S`` /
    ``STANDIN_RUN_SECONDS`` knob are wall-clock seconds and are NOT scaled.

A knob that cannot be read is warned about (stderr) and its default used; a bad command line is a
``UsageError`` (the program prints it and exits non-zero).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from .output import err


class UsageError(Exception):
    """A bad command line or knob: the caller prints it and exits non-zero."""


def speed() -> float:
    """``STANDIN_SPEED``: factor applied to built-in durations (default 1.0)."""
    try:
        value = float(os.environ.get("STANDIN_SPEED", "1") or "1")
    except ValueError:
        return 1.0
    return value if value >= 0 else 1.0


def scaled(seconds: float) -> float:
    """A built-in duration scaled by ``STANDIN_SPEED``."""
    return seconds * speed()


def env_seconds(name: str, default: float) -> float:
    """Wall-clock seconds from env ``name`` if set (may be ``inf``), else ``default`` scaled."""
    raw = os.environ.get(name, "").strip()
    if raw:
        try:
            value = float(raw)
            if value >= 0:
                return value
        except ValueError:
            pass
        err(f"warning: ignoring {name}={raw!r} (want seconds)")
    return scaled(default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        err(f"warning: ignoring {name}={raw!r} (want an integer)")
        return default


def env_size(name: str, default: int) -> int:
    """Bytes from env ``name`` (a number, or bytes-with-units such as ``8MiB``)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_size(raw)
    except ValueError:
        err(f"warning: ignoring {name}={raw!r} (want a size such as 1048576 or 1MiB)")
        return default


def sleep(seconds: float) -> None:
    """Sleep wall-clock seconds; ``inf`` sleeps forever."""
    if seconds == float("inf"):
        sleep_forever()
    if seconds > 0:
        time.sleep(seconds)


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


# go-units v0.5.0 parseSize: what Go's strconv.ParseFloat takes (less hex floats, Inf and NaN), and the unit letters.
_GO_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_UNIT_POWER = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """Bytes-with-units as go-units ``RAMInBytes`` (v0.5.0) reads them, which curio's ``fetch-params`` uses: a number,
    an optional space, then ``b``, or k/m/g/t/p with an optional ``b`` or ``ib``, in any case, all binary
    (1KB = 1KiB = 1024). A bare number is bytes (``curio fetch-params 32`` is 32 bytes, no error)."""
    sep = max(text.rfind(ch) for ch in "0123456789. ")
    if sep < 0:
        raise ValueError(f"invalid size: '{text}'")
    number, suffix = (text[:sep], text[sep + 1:]) if text[sep] == " " else (text[:sep + 1], text[sep + 1:])
    if not _GO_FLOAT.fullmatch(number):
        raise ValueError(f'strconv.ParseFloat: parsing "{number}": invalid syntax')
    size = float(number)
    if size < 0:
        raise ValueError(f"invalid size: '{text}'")
    unit = suffix.lower()
    if unit in ("", "b"):
        return int(size)
    if len(unit) > 3 or unit[0] not in _UNIT_POWER or unit[1:] not in ("", "b", "ib"):
        raise ValueError(f"invalid suffix: '{unit}'")
    return int(size * 1024 ** _UNIT_POWER[unit[0]])


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} TiB"


def parse_addr(text: str) -> tuple[str, Any]:
    """Listen/connect address.

    ``unix:///p`` -> ("unix", "/p"); ``http://h:p`` or ``h:p`` -> ("tcp", (h, p)).
    """
    raw = text.strip()
    if raw.startswith("unix://"):
        path = raw[len("unix://"):]
        if not path:
            raise ValueError(f"invalid listen address {text!r}")
        return "unix", path
    for prefix in ("http://", "https://", "tcp://", "grpc://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):]
            break
    raw = raw.split("/", 1)[0]
    host, sep, port = raw.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise ValueError(f"invalid listen address {text!r}")
    return "tcp", (host.strip("[]") or "0.0.0.0", int(port))
