"""``ready = "cuzk"``: the cuzk-daemon's readiness, made from the plan's [cuzk] when the config is loaded.

A cuzk-daemon is ready when its HTTP ``/status`` answers on status_listen, or when its listen address
accepts a connection, whichever comes first. Daemons from 13 Mar 2026 have both; the partition-workers
builds before them (Feb to 13 Mar 2026) have no status API at all, only the gRPC listen port. Either is
proof of readiness (shared/domain/workloads.md), so the check needs no guess of the image's generation, and a wrong
CUZK_MEMORY_MODEL cannot leave it waiting forever. The probes themselves are the core's (readiness.py),
and so are the ports they name (``ReadyCheck.ports()``: listen and status_listen): the core checks them free
before the daemon starts and counts an answer only from the daemon's own listener (ports.py). The addresses
are read as configkeys.py reads them when [cuzk] is parsed: one reading, so what ``check`` passes is probed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ReadyCheck
from .configkeys import cuzk_settings, listen_probe, status_probe
from .cuzkconf import CuzkSettings

KIND = "cuzk"


def make_cuzk_ready(sections: Mapping[str, Any], where: str) -> ReadyCheck:
    """The plugin's ReadyMaker: the probe of the daemon [cuzk] describes (which needs the table)."""
    return cuzk_ready(cuzk_settings(sections, KIND, where))


def cuzk_ready(cuzk: CuzkSettings) -> ReadyCheck:
    """Its /status on status_listen, or its listen address (see the module docstring)."""
    listen = listen_probe(cuzk.listen, "cuzk.listen")
    status = status_probe(cuzk.status_listen, "cuzk.status_listen")
    if status is None:
        return listen
    return ReadyCheck("any", "cuzk", alternatives=(status, listen))
