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
        return parse_size(raw, require_unit=False)
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


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?)(b?)\s*$", re.IGNORECASE)
_UNIT_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def parse_size(text: str, require_unit: bool = True) -> int:
    """Bytes-with-units as go-units ``RAMInBytes`` reads them (all binary: 1KB = 1KiB = 1024).

    With ``require_unit`` a bare number is refused, as ``curio fetch-params 32`` is.
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"invalid size: {text!r}")
    number, prefix, binary, byte = match.groups()
    if require_unit and not (prefix or byte):
        raise ValueError(f"invalid size: {text!r}: missing unit")
    if binary and not prefix:
        raise ValueError(f"invalid size: {text!r}")
    return int(float(number) * 1024 ** _UNIT_POWER[prefix.lower()])


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
