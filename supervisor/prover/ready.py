"""``ready = "cuzk"``: the cuzk-daemon's readiness, made from the plan's [cuzk] when the config is loaded.

A cuzk-daemon is ready when its HTTP ``/status`` answers on status_listen, or when its listen address
accepts a connection, whichever comes first. Daemons from 13 Mar 2026 have both; the partition-workers
builds before them (Feb to 13 Mar 2026) have no status API at all, only the gRPC listen port. Either is
proof of readiness (workloads.md), so the check needs no guess of the image's generation, and a wrong
CUZK_MEMORY_MODEL cannot leave it waiting forever. The probes themselves are the core's (readiness.py),
and so are the ports they name (``ReadyCheck.ports()``: listen and status_listen): the core checks them free
before the daemon starts and counts an answer only from the daemon's own listener (ports.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..config import ConfigError, ReadyCheck
from .configkeys import cuzk_settings
from .cuzkconf import CuzkSettings

KIND = "cuzk"


def make_cuzk_ready(sections: Mapping[str, Any], where: str) -> ReadyCheck:
    """The plugin's ReadyMaker: the probe of the daemon [cuzk] describes (which needs the table)."""
    return cuzk_ready(cuzk_settings(sections, KIND, where))


def cuzk_ready(cuzk: CuzkSettings) -> ReadyCheck:
    """Its /status on status_listen, or its listen address (see the module docstring)."""
    listen = _listen_check(cuzk.listen)
    status = cuzk.status_listen.strip().removeprefix("http://").rstrip("/")
    if not status:
        return listen
    host, port = _host_port(status, "cuzk.status_listen", cuzk.status_listen)
    url = f"http://{status}/status"
    return ReadyCheck("any", "cuzk", alternatives=(ReadyCheck("http", url, host, port), listen))


def _listen_check(listen: str) -> ReadyCheck:
    """cuzk's listen, ``unix:///path``, ``http://host:port`` or ``host:port``, as a connect check."""
    text = listen.strip()
    if text.startswith("unix://"):
        path = text[len("unix://") :]
        if not path.startswith("/"):
            raise ConfigError(f"cuzk.listen: {listen!r} must name an absolute socket path (unix:///path)")
        return ReadyCheck("unix", path)
    host, port = _host_port(text, "cuzk.listen", listen)
    # A daemon listening on every address is reached on loopback.
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return ReadyCheck("tcp", f"{host}:{port}", host, port)


def _host_port(text: str, key: str, shown: str) -> tuple[str, int]:
    try:
        parts = urlsplit(text if "://" in text else f"tcp://{text}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise ConfigError(f"{key}: {shown!r} must be unix:///path, http://host:port or host:port"
                          if key == "cuzk.listen" else f"{key}: {shown!r} must be host:port")
    return host, port
