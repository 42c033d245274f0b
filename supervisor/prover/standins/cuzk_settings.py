"""The stand-in cuzk-daemon's configuration, read as the real daemon reads its TOML, and its log lines.

Keys used: ``[daemon] listen`` (default ``unix:///run/curio/cuzk.sock``), read as the real daemon reads it
(cuzk-daemon main.rs): ``unix://<path>``, else a Rust ``SocketAddr``, an IP address and port and nothing else:
``http://127.0.0.1:9820`` or ``localhost:9820`` is a ``StartupError`` ("invalid listen address", exit 1), met
where the real one meets it, after the SRS load, as the listeners are bound; ``status_listen`` (default ``""``:
no status API), ``host:port`` with a name or an address, as Tokio binds it: one it cannot bind
(``http://...``) is said in an error line and the daemon goes on without its status API, as the real one's
status task does; ``[srs] param_cache``
(default ``$FIL_PROOFS_PARAMETER_CACHE`` or ``/var/tmp/filecoin-proof-parameters``), ``[memory]
total_budget`` / ``safety_margin``, ``[gpus] devices`` / ``gpu_workers_per_device`` (concurrent proofs =
devices x workers, default 1 x 2), ``[synthesis] partition_workers`` (see cuzk_generations),
``[pipeline] synthesis_concurrency`` (``enabled`` is not read), ``[logging]
level``. The log's filter is chosen as the real daemon chooses it (main.rs): ``RUST_LOG`` when it is set and every
directive in it parses, else ``--log-level``, else ``[logging] level``, else ``info``; each read as
tracing-subscriber's EnvFilter reads one (``Log``). A missing file is a warning
and the built-in defaults; a malformed one, or a value it cannot use, is a ``StartupError`` (exit 1); but a size
it cannot read is no error, as in the real one: 50 GiB (``cuzk_size``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Any

from . import cuzk_generations as generations
from . import knobs, output

DEFAULT_LISTEN = "unix:///run/curio/cuzk.sock"
DEFAULT_STATUS = ""
DEFAULT_CACHE = "/var/tmp/filecoin-proof-parameters"
# tracing's levels as its LevelFilter numbers them (a filter directive may give the number): off 0 ... trace 5.
LEVELS = {"off": 0, "error": 1, "warn": 2, "info": 3, "debug": 4, "trace": 5}
COLORS = {"trace": "35", "debug": "34", "info": "32", "warn": "33", "error": "31"}
TRACE = LEVELS["trace"]


class StartupError(Exception):
    """The daemon cannot start (exit 1)."""


class Log:
    """tracing-subscriber style coloured lines, filtered as its EnvFilter filters them: comma-separated directives,
    each ``level``, ``target`` (every level) or ``target=level``; a line's target takes the directive of the longest
    target it starts with (a later one of the same target replaces it), else the one with none; no directive, no
    line. ``strict`` (``RUST_LOG``): one bad directive refuses the whole filter (``None`` from ``parse``); else (the
    config's level) a bad one is skipped, said on stderr, and none left is ``error``. Spans and fields
    (``target[span]``) are past what the stand-in needs: such a directive applies to no line."""

    def __init__(self, text: str, strict: bool = False) -> None:
        directives = self.parse(text, strict)
        self.directives: dict[str | None, int] = directives if directives is not None else {None: LEVELS["error"]}

    @staticmethod
    def parse(text: str, strict: bool) -> dict[str | None, int] | None:
        """target (None: every target) → level; None when ``strict`` and a directive is bad."""
        found: dict[str | None, int] = {}
        dynamic = False
        for raw in filter(None, text.split(",")):
            directive = _directive(raw.strip())
            if directive is None:
                if strict:
                    return None
                output.err(f"ignoring `{raw}`: invalid filter directive")
            elif directive[1] is None:
                dynamic = True
            else:
                found[directive[0]] = directive[1]  # (the later one of a target, as EnvFilter keeps)
        if not found and not dynamic and not strict:
            found[None] = LEVELS["error"]  # (EnvFilter::new's default when nothing valid was given)
        return found

    def enabled(self, level: str, target: str) -> bool:
        named = [name for name in self.directives if name is not None and target.startswith(name)]
        chosen = max(named, key=len) if named else None
        return chosen in self.directives and LEVELS[level] <= self.directives[chosen]

    def __call__(self, level: str, msg: str, target: str = "cuzk_daemon") -> None:
        if not self.enabled(level, target):
            return
        output.out(f"\x1b[2m{output.now_iso()}\x1b[0m \x1b[{COLORS[level]}m{level.upper():>5}\x1b[0m "
                   f"\x1b[2m{target}\x1b[0m\x1b[2m:\x1b[0m {msg}")


@dataclass
class Settings:
    """What the daemon was configured with."""

    listen: tuple[str, Any] | None  # None: no address the real daemon could parse (start fails at the bind)
    listen_text: str
    status_listen: tuple[str, Any] | None  # None: no status API (disabled, unbindable, or a build without one)
    status_text: str
    param_cache: str
    devices: list[Any]
    workers_per_device: int
    synthesis_concurrency: Any
    budget: int  # bytes; 0 for a build without a unified budget
    pw: generations.PartitionWorkers | None = None  # a partition-workers build's synthesis

    @property
    def gpu_workers(self) -> int:
        return len(self.devices) * self.workers_per_device


def read_toml(path: str | None) -> tuple[dict[str, Any], str]:
    """The config file's tables (empty when there is none) and the line that says which."""
    if not path or not os.path.exists(path):
        return {}, f"config file {path} not found, using built-in defaults"
    import tomllib

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh), f"loaded config from {path}"
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise StartupError(f"failed to load config {path}: {exc}") from None


def log_for(level: str | None, cfg: dict[str, Any]) -> Log:
    """``RUST_LOG`` when set and whole (cuzk-daemon main.rs: ``EnvFilter::try_from_default_env()``), else
    ``--log-level``, else ``[logging] level``, else info (``EnvFilter::new``, lenient)."""
    rust_log = os.environ.get("RUST_LOG")
    if rust_log is not None and Log.parse(rust_log, strict=True) is not None:
        return Log(rust_log, strict=True)
    logging = _section(cfg, "logging")
    if not level and isinstance(logging.get("level"), str):
        return Log(logging["level"])
    return Log(level or "info")


def _directive(text: str) -> tuple[str | None, int | None] | None:
    """One directive as tracing-subscriber parses it (filter/env/directive.rs): (target or None, level); level None
    for one with a span or fields; None for a bad one (an empty one, a first character other than a letter, a digit,
    ``-``, ``:`` or ``_``, a level it does not know after ``=``)."""
    if not text or not (text[0].isalnum() or text[0] in "-:_["):
        return None
    if "[" in text:
        return None, None  # (a span or fields: no level of its own for a plain line)
    target, eq, level = text.partition("=")
    if eq:
        number = TRACE if level == "" else _level(level)
        return None if number is None else (target, number)
    number = _level(text)
    return (None, number) if number is not None else (text, TRACE)


def _level(text: str) -> int | None:
    """A LevelFilter as tracing reads one: a name in any case, or its number 0 (off) to 5 (trace)."""
    if text.isascii() and text.isdigit():
        return int(text) if int(text) <= TRACE else None
    return LEVELS.get(text.lower())


def settings(cfg: dict[str, Any], listen_flag: str | None, generation: str, log: Log) -> Settings:
    """The daemon's settings from its config (``-l`` overrides listen), said in the log as the real one says them."""
    daemon, memory, gpus = _section(cfg, "daemon"), _section(cfg, "memory"), _section(cfg, "gpus")
    synthesis, pipeline = _section(cfg, "synthesis"), _section(cfg, "pipeline")
    listen_text = listen_flag or str(daemon.get("listen", DEFAULT_LISTEN))
    status_text = str(daemon.get("status_listen", DEFAULT_STATUS))
    listen = daemon_listen(listen_text)
    status_listen = status_bind(status_text)
    devices = gpus.get("devices", [0])
    per_device = gpus.get("gpu_workers_per_device", 2)
    found = Settings(
        listen=listen, listen_text=listen_text, status_listen=status_listen, status_text=status_text,
        param_cache=str(_section(cfg, "srs").get("param_cache") or os.environ.get(
            "FIL_PROOFS_PARAMETER_CACHE", "").strip() or DEFAULT_CACHE),
        devices=devices if isinstance(devices, list) and devices else [0],
        workers_per_device=per_device if isinstance(per_device, int) and per_device > 0 else 2,
        synthesis_concurrency=pipeline.get("synthesis_concurrency", 1), budget=0)
    if generation == generations.PW_GENERATION:
        _partition_workers_build(found, synthesis, memory, log)
    else:
        found.budget = _budget(memory.get("total_budget", "auto"), memory.get("safety_margin", "5GiB"), log)
        generations.ignore_partition_workers(synthesis, log)
    return found


def daemon_listen(text: str) -> tuple[str, Any] | None:
    """``[daemon] listen`` as cuzk-daemon parses it: ``unix://<path>``, or ``IP:port`` / ``[IPv6]:port`` (a Rust
    ``SocketAddr``); None for anything else, which the real one refuses when it binds (``StartupError`` there)."""
    if text.startswith("unix://"):
        return "unix", text[len("unix://"):]
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        return None
    if not sep or (ip.version == 6) != bracketed or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        return None
    return "tcp", (str(ip), int(port))


def invalid_listen(text: str) -> StartupError:
    """What the real daemon returns from main for a listen it cannot parse."""
    return StartupError(f"invalid listen address: {text}: invalid socket address syntax")


def status_bind(text: str) -> tuple[str, Any] | None:
    """``[daemon] status_listen`` as the status task binds it (Tokio, a name resolved): None for "" (no status API);
    ("unbindable", text) for what it cannot bind, which the start says and goes on without."""
    if not text.strip():
        return None
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        return "unbindable", text
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return "unbindable", text
    return "tcp", (host, int(port))


def _section(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    value = cfg.get(name, {})
    return value if isinstance(value, dict) else {}


def _partition_workers_build(found: Settings, synthesis: dict[str, Any], memory: dict[str, Any], log: Log) -> None:
    """A Feb–13 Mar 2026 build (cuzk_generations): no status API (status_listen is a key it does
    not know, so it is ignored, as every unknown key), no unified budget (total_budget ignored),
    and ``partition_workers`` sets the memory peak."""
    found.status_listen = None
    try:
        found.pw = generations.PartitionWorkers(synthesis)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    for key in generations.LOGGED_MEMORY_KEYS:
        if key in memory:
            log("info", f"memory: {key} = {memory[key]}")
    log("info", f"synthesis: partition_workers={found.pw.count} "
                f"(estimated peak RSS ~ {knobs.human_bytes(found.pw.peak())})")


def cuzk_size(text: str) -> int:
    """A size as the real daemon reads one (cuzk-core config.rs ``parse_size``): a whole number of GiB, MiB, GB or
    MB, the unit as written, else a number of bytes; what it cannot read is 50 GiB (0 with MiB or MB), never an
    error: "200G", "300gib" or "250.5GiB" is a budget of 50 GiB."""
    text = text.strip()
    for unit, scale, fallback in (("GiB", 1 << 30, 50), ("MiB", 1 << 20, 0), ("GB", 10**9, 50), ("MB", 10**6, 0)):
        if text.endswith(unit):
            number = text[:-len(unit)].strip()
            return (int(number) if number.isascii() and number.isdigit() else fallback) * scale
    return int(text) if text.isascii() and text.isdigit() else 50 << 30


def _budget(total: Any, margin: Any, log: Log) -> int:
    if not isinstance(total, str) or not isinstance(margin, str):  # (serde: both are strings)
        raise StartupError(f"invalid type: [memory] total_budget {total!r} / safety_margin {margin!r}, expected a "
                           "string")
    margin_b = cuzk_size(margin)
    if total == "auto":
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        budget = max(0, phys - margin_b)
        how = f"auto (physical {knobs.human_bytes(phys)} - margin {knobs.human_bytes(margin_b)})"
    else:
        budget = cuzk_size(total)
        how = "configured"
    log("info", f"memory budget: {knobs.human_bytes(budget)} ({how})")
    minimum = knobs.env_size("STANDIN_DAEMON_MIN_BUDGET", 0)
    if minimum and budget < minimum:
        raise StartupError(f"insufficient memory budget for SRS: budget {knobs.human_bytes(budget)} "
                           f"< required {knobs.human_bytes(minimum)}")
    return budget
