"""cuzk.toml generated from what the machine has, before each cuzk-daemon start (tomli-w).

Memory is what kills provers: the seeds' instance ran ``partition_workers = 10``
on 125 GB (≈ 269 GiB wanted) and was OOM-killed. So every memory-sized value is
derived from the memory actually available (the cgroup limit, else MemTotal)
minus a safety margin, with the figures of shared/domain/workloads.md:

- unified memory manager (daemons from 13 Mar 2026): ``[memory] total_budget``;
  about 70 GiB baseline (SRS + PCE) + about 13.6 GiB per partition in flight,
  which sizes the bench's ``-j``. ``[pipeline] synthesis_concurrency`` is not a
  count of partitions but of whole proofs synthesized at once (cuzk-core
  ``config.rs``: "N concurrent syntheses (memory: N × ~136 GiB for PoRep 32G)",
  1 the default, 2 for single-GPU machines of more than 400 GiB): a PoRep proof
  is PARTITIONS_PER_PROOF partitions, so it is as many proofs as the budget holds
  beyond the baseline, at least 1 (it read 13 on a 256 GiB machine: 1.7 TiB of
  syntheses asked of a 251 GiB budget);
- partition-workers builds (Feb–Mar 2026): ``[synthesis] partition_workers``
  with peak RSS ≈ 69 + 20 × pw GiB.

One file suits both generations, so nothing hangs on knowing which one the
image holds: neither rejects unknown keys, so ``[memory] total_budget`` with
``[pipeline] synthesis_concurrency`` (read by unified daemons, which warn about
and ignore ``partition_workers``) and ``[synthesis] partition_workers`` (read by
partition-workers builds, which ignore ``total_budget``) are always both written,
each sized on the same budget with its own generation's figures. The configured
``memory_model`` says which of the two must fit (else DoesNotFit) and which
figure sizes the bench. ``[memory] pinned_budget`` / ``working_memory_budget``
of the partition-workers builds are left to their defaults: the facts give what
the daemon uses in all (69 + 20 × pw GiB) but not how those two split it, and a
pinned budget set too small would fail the SRS load.

The bench's ``-j`` concurrency is scaled the same way. User values win, unless
they cannot fit: then they are refused with both numbers. Every figure is
settable ([cuzk] ``baseline``, ``per_partition``, ``pw_baseline``,
``pw_per_worker``) so the stand-ins can run the profile on a small machine.

Its ``[logging] level`` (an override's, else info) keeps the engine's PCE lines, which the warm-up waits on
(the daemon's log filter, at the end of this module).
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import MAX_SOCKET_PATH_BYTES
from ..evidence.gpu import GpuSample
from ..state.files import read_regular_file
from ..text.show import fmt_bytes
from ..text.units import parse_size

GIB = 1 << 30
MIB = 1 << 20
MEMORY_MODELS = ("unified", "partition-workers")
# shared/domain/workloads.md figures.
UNIFIED_BASELINE = 70 * GIB
PER_PARTITION = int(13.6 * GIB)
# A PoRep 32G proof's partitions (its ~136 GiB synthesis: cuzk-core config.rs's synthesis_concurrency).
PARTITIONS_PER_PROOF = 10
PW_BASELINE = 69 * GIB
PW_PER_WORKER = 20 * GIB
GPU_WORKERS_PER_DEVICE = 2


class DoesNotFit(Exception):
    """The machine cannot hold what is asked: the message carries both numbers."""


@dataclass(frozen=True)
class CuzkSettings:
    config_path: str
    memory_model: str = "unified"
    listen: str = "127.0.0.1:9820"
    status_listen: str = "127.0.0.1:9821"
    param_cache: str = "/var/tmp/filecoin-proof-parameters"
    safety_margin: int = 5 * GIB
    bench_concurrency: int = 5
    # The bench's proofs (``-c``) and its C1 input (``--c1``): checked with the rest, not first read by
    # cuzk-bench after the download (CUZK_BENCH_COUNT, CUZK_BENCH_C1).
    bench_count: int = 12
    bench_c1: str = "/data/zk/c1.json"
    overrides: dict[str, Any] | None = None
    # The shared/domain/workloads.md figures; settable so the stand-ins can run the profile on a small machine.
    baseline: int = UNIFIED_BASELINE
    per_partition: int = PER_PARTITION
    pw_baseline: int = PW_BASELINE
    pw_per_worker: int = PW_PER_WORKER


# [cuzk] listen is read by three programs, each in a form of its own (curio, extern/cuzk and lib/cuzk):
# - cuzk-daemon binds ``unix:///path`` or an IP address and port, parsed as a Rust SocketAddr: no scheme, no host
#   name (``http://127.0.0.1:9820`` or ``localhost:9820`` ends it at start, exit 1, "invalid listen address");
# - cuzk-bench's ``-a`` is a tonic endpoint URI, ``unix:///path`` or ``http://host:port`` (a bare host:port has
#   no scheme, and its connect fails);
# - curio's ``[Cuzk] Address`` is ``unix:///path`` or ``host:port`` (its client dials ``dns:///host:port``; an
#   ``http://`` address resolves to nothing, and every proof fails).
# So [cuzk] listen may be written as the daemon's form or as a URL (``http://IP:port``), and each reader is
# given its own: cuzk.toml the daemon's, CUZK_ADDR cuzk-bench's, CURIO_CUZK_ADDRESS curio's (the value for its
# [Cuzk] Address layer: curio reads its config layers from its database, not its environment, so whatever sets the
# layer takes it from there; the stand-in curio reads it in their place).
LISTEN_FORMS = "unix:///path, IP:port or http://IP:port (cuzk-daemon binds an IP address, not a host name)"
# A daemon listening on every address is reached on loopback.
_WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class CuzkAddress:
    """Where cuzk-daemon listens: a unix socket, or an IP address and port."""

    unix_path: str = ""
    ip: str = ""
    port: int = 0

    def _ip_port(self, ip: str) -> str:
        return f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}"

    def connect_ip(self) -> str:
        """The address a client on this machine connects to."""
        return "127.0.0.1" if self.ip in _WILDCARDS else self.ip

    def for_daemon(self) -> str:
        """cuzk.toml's ``[daemon] listen``."""
        return f"unix://{self.unix_path}" if self.unix_path else self._ip_port(self.ip)

    def for_bench(self) -> str:
        """cuzk-bench's ``-a`` (CUZK_ADDR)."""
        return f"unix://{self.unix_path}" if self.unix_path else f"http://{self._ip_port(self.connect_ip())}"

    def for_curio(self) -> str:
        """curio's ``[Cuzk] Address`` (CURIO_CUZK_ADDRESS)."""
        return f"unix://{self.unix_path}" if self.unix_path else self._ip_port(self.connect_ip())


def cuzk_address(listen: str) -> CuzkAddress:
    """[cuzk] listen read (see above); ValueError, saying the forms, for anything the daemon could not bind."""
    text = listen.strip()
    if text.startswith("unix://"):
        path = text[len("unix://"):]
        if not path.startswith("/"):
            raise ValueError("must name an absolute socket path (unix:///path)")
        if len(path.encode("utf-8", "surrogateescape")) > MAX_SOCKET_PATH_BYTES:
            raise ValueError(f"names a socket path of more than {MAX_SOCKET_PATH_BYTES} bytes, which no unix socket "
                             "can have (the daemon could never bind it)")
        return CuzkAddress(unix_path=path)
    rest = text.removeprefix("http://").removesuffix("/")
    host, sep, port = rest.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    zone = host[1:-1].partition("%")[2] if bracketed else ""
    numeric_zone = not zone or (zone.isascii() and zone.isdigit())  # (Rust's SocketAddrV6: fe80::1%2, not %eth0)
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host) if sep and numeric_zone else None
    except ValueError:
        ip = None
    port_ok = port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536
    if ip is None or (ip.version == 6) != bracketed or not port_ok:
        raise ValueError(f"must be {LISTEN_FORMS}")
    return CuzkAddress(ip=str(ip), port=int(port))


def status_address(status_listen: str) -> str:
    """cuzk.toml's ``[daemon] status_listen``: the ``host:port`` its status server binds (a Tokio bind, which a
    URL fails: the daemon then serves no /status, and says so only in its log), from [cuzk] status_listen,
    which may be written as ``http://host:port``; "" (no status API) stays ""."""
    return status_listen.strip().removeprefix("http://").rstrip("/")


@dataclass(frozen=True)
class Generated:
    config: dict[str, Any]
    text: str
    budget: int
    partitions: int  # partitions in flight (unified) or partition workers (pw builds)
    bench_concurrency: int
    memory_model: str = "unified"
    # RUST_LOG for the phase where the inherited one hides the engine's PCE lines (its log filter, below), and what
    # the log says of that or of cuzk.toml's level changed for them.
    rust_log: str | None = None
    log_said: str | None = None

    def summary(self) -> str:
        what = "partitions in flight" if self.memory_model == "unified" else "partition_workers"
        return (f"budget {fmt_bytes(self.budget)}, {self.partitions} {what}, bench -j {self.bench_concurrency}, "
                f"{len(self.config.get('gpus', {}).get('devices', []))} GPU(s)")


# The tables generate() writes ([gpus] where the machine has GPUs): an override of one of them that is no table
# would replace it whole (configkeys.py refuses it).
GENERATED_TABLES = ("daemon", "srs", "logging", "gpus", "memory", "pipeline", "synthesis")


def generate(settings: CuzkSettings, available: int, gpus: list[GpuSample], rust_log: str | None = None) -> Generated:
    """The cuzk.toml for this machine; raises DoesNotFit when the daemon cannot run in ``available``. ``rust_log``:
    the RUST_LOG the daemon inherits, which wins over cuzk.toml's level (its log filter, below)."""
    budget = available - settings.safety_margin
    overrides = settings.overrides or {}
    config: dict[str, Any] = {
        "daemon": {"listen": cuzk_address(settings.listen).for_daemon(),
                   "status_listen": status_address(settings.status_listen)},
        "srs": {"param_cache": settings.param_cache},
        "logging": {"level": "info"},
    }
    if gpus:
        config["gpus"] = {"devices": [g.index for g in gpus], "gpu_workers_per_device": GPU_WORKERS_PER_DEVICE}
    sized = budget  # what the summary says: the budget the daemon is told and sized for
    if settings.memory_model == "unified":
        # (an override's memory.total_budget where one is given, in whole MiB: the log said the automatic one)
        sized, partitions = _unified(config, budget, available, settings, overrides)
        # For a partition-workers build after all: as many workers as the same budget holds (the one the daemon
        # is told: an override's), at least one.
        _write_partition_workers(config, max(1, _workers_within(sized, settings)))
    else:
        partitions = _partition_workers(config, budget, available, settings, overrides)
        # For a unified daemon after all: the same budget, and the partitions it holds by its figures.
        _write_unified(config, budget // MIB * MIB, settings)
    import tomli_w  # only needed where cuzk.toml is generated

    merged = _merge(config, overrides)
    _budget_in_cuzks_words(merged, config, overrides)
    kept = keep_engine_lines(rust_log, merged["logging"]["level"])  # (a string: configkeys.py)
    merged["logging"]["level"] = kept.level
    bench_j = max(1, min(settings.bench_concurrency, partitions))
    return Generated(merged, tomli_w.dumps(merged), sized, partitions, bench_j, settings.memory_model,
                     kept.rust_log, kept.said)


def _unified(config: dict[str, Any], budget: int, available: int, settings: CuzkSettings,
             overrides: dict[str, Any]) -> tuple[int, int]:
    """The budget the daemon is told and sized for, and the partitions in flight it holds."""
    base, per = settings.baseline, settings.per_partition
    need = base + per
    if budget < need:
        raise DoesNotFit(f"cuzk needs at least {fmt_bytes(need)} (baseline {fmt_bytes(base)} + one "
                         f"partition {fmt_bytes(per)}) but the budget is {fmt_bytes(budget)} "
                         f"({fmt_bytes(available)} available - {fmt_bytes(settings.safety_margin)} safety margin)")
    user_budget = overrides.get("memory", {}).get("total_budget")
    if isinstance(user_budget, str) and user_budget != "auto":
        wanted = parse_size(user_budget)
        if wanted > available:
            raise DoesNotFit(f"[cuzk.overrides] memory.total_budget = {user_budget} ({fmt_bytes(wanted)}) is more "
                             f"than the {fmt_bytes(available)} available")
        if wanted < need:
            raise DoesNotFit(f"[cuzk.overrides] memory.total_budget = {user_budget} ({fmt_bytes(wanted)}) is below "
                             f"the {fmt_bytes(need)} cuzk needs (baseline + one partition)")
        budget = wanted
    # The daemon reads the budget in whole MiB: size the concurrency on what is written.
    budget = budget // MIB * MIB
    partitions = max(1, (budget - base) // per)
    user_conc = overrides.get("pipeline", {}).get("synthesis_concurrency")
    if isinstance(user_conc, int) and user_conc > proofs_within(budget, settings):  # (1, cuzk's default, always)
        peak = base + user_conc * PARTITIONS_PER_PROOF * per
        if peak > budget:
            raise DoesNotFit(f"[cuzk.overrides] pipeline.synthesis_concurrency = {user_conc} wants about "
                             f"{fmt_bytes(peak)} ({user_conc} whole proof(s) of {PARTITIONS_PER_PROOF} partitions "
                             f"at once) but the budget is {fmt_bytes(budget)}")
    _write_unified(config, budget, settings)
    return budget, int(partitions)


def _write_unified(config: dict[str, Any], budget: int, settings: CuzkSettings) -> None:
    config["memory"] = {"total_budget": size_text(budget), "safety_margin": size_text(settings.safety_margin)}
    config["pipeline"] = {"enabled": True, "synthesis_concurrency": proofs_within(budget, settings)}


def proofs_within(budget: int, settings: CuzkSettings) -> int:
    """Whole proofs synthesized at once within ``budget`` (synthesis_concurrency), at least 1 (cuzk's default)."""
    return max(1, (budget - settings.baseline) // (PARTITIONS_PER_PROOF * settings.per_partition))


def _partition_workers(config: dict[str, Any], budget: int, available: int, settings: CuzkSettings,
                       overrides: dict[str, Any]) -> int:
    base, per = settings.pw_baseline, settings.pw_per_worker
    figures = f"{fmt_bytes(base)} + {fmt_bytes(per)} × pw"
    user_pw = overrides.get("synthesis", {}).get("partition_workers")
    if isinstance(user_pw, int):
        peak = base + user_pw * per
        if peak > budget:
            raise DoesNotFit(f"[cuzk.overrides] synthesis.partition_workers = {user_pw} peaks at about "
                             f"{fmt_bytes(peak)} ({figures}) but the budget is {fmt_bytes(budget)} of "
                             f"{fmt_bytes(available)} available")
        pw = user_pw
    else:
        pw = _workers_within(budget, settings)
        if pw < 1:
            raise DoesNotFit(f"a partition-workers cuzk needs at least {fmt_bytes(base + per)} "
                             f"({figures}, pw = 1) but the budget is {fmt_bytes(budget)}")
    _write_partition_workers(config, int(pw))
    return int(pw)


def _workers_within(budget: int, settings: CuzkSettings) -> int:
    """Partition workers whose peak (pw_baseline + pw_per_worker × pw) fits ``budget``."""
    return math.floor((budget - settings.pw_baseline) / settings.pw_per_worker)


def _write_partition_workers(config: dict[str, Any], pw: int) -> None:
    config["synthesis"] = {"partition_workers": pw}


def size_text(n: int) -> str:
    """Bytes as cuzk reads them, exactly: whole GiB, else whole MiB, else bytes."""
    if n % GIB == 0:
        return f"{n // GIB}GiB"
    if n % MIB == 0:
        return f"{n // MIB}MiB"
    return str(n)


def _budget_in_cuzks_words(merged: dict[str, Any], config: dict[str, Any], overrides: dict[str, Any]) -> None:
    """An override's ``memory.total_budget`` as cuzk-daemon reads it. Its parse_size (cuzk-core config.rs) takes a
    whole number of GiB, MiB, GB or MB, or of bytes, and reads anything else ("200G", "300gib", "250.5GiB",
    "0.4TiB") as 50 GiB, too little for the SRS: every proof waited for budget after the whole download. Its
    "auto" is MemTotal less the margin, blind to the container's limit. So the override is written as the bytes
    the supervisor read it as (and checked, and sized the rest on), and "auto" as the budget worked out here."""
    user = overrides.get("memory", {}).get("total_budget")
    if isinstance(user, str):
        merged["memory"]["total_budget"] = (config["memory"]["total_budget"] if user == "auto"
                                            else size_text(parse_size(user) // MIB * MIB))


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def write(generated: Generated, path: str | Path, copy_to: str | Path | None = None) -> None:
    """Write atomically (a daemon must never read half a file); keep a copy in state_dir.

    A file that already holds this very text is left alone: a service restarted while
    state_dir is full must not fail for want of room to write the same bytes again. A
    write that fails takes its temporary file with it (it would hold the room back)."""
    for target in filter(None, (Path(path), Path(copy_to) if copy_to else None)):
        if _holds(target, generated.text):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_text(generated.text)
            tmp.replace(target)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def _holds(path: Path, text: str) -> bool:
    """Does ``path`` hold ``text`` already? Read as a regular file only (a FIFO there hung the loop, deaf to
    SIGTERM) and no further than ``text`` could be; anything else there is replaced by the write."""
    data = text.encode()
    try:
        return read_regular_file(path, len(data) + 1) == data
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------- the daemon's log filter

# cuzk-daemon's log filter, read as the daemon reads it, and what keeps its engine's PCE lines in it.
#
# The warm-up's settle (hooks.py ``PceWatch``) knows of the daemon's background PCE extraction only from its engine's
# lines, "background PCE extraction starting" and "... complete", logged at info under the tracing target
# ``cuzk_core::engine`` (curio extern/cuzk, cuzk-core engine.rs). A quieter filter (``warn``) hid them: the settle
# saw no extraction, stopped the daemon at once, and the PCE was lost without a word.
#
# Which filter the daemon uses (cuzk-daemon main.rs, tracing-subscriber 0.3): ``RUST_LOG`` when it is set and every
# directive in it parses (``EnvFilter::try_from_default_env``: empty, it lets nothing through); else its config's
# ``[logging] level`` (``--log-level`` in its place), where a bad directive is skipped and none left means ``error``
# (``EnvFilter::new``). A directive is ``level``, ``target`` (every level) or ``target=level``; a line's target takes
# the directive of the longest target it starts with, else the one with none. So ``<theirs>,cuzk_core::engine=info``
# shows the engine's info lines and leaves the user's filter as it was everywhere else; it is added only where their
# filter hides those lines, never lowering a more verbose one (``debug``).

ENGINE_TARGET = "cuzk_core::engine"
KEEP = f"{ENGINE_TARGET}=info"
RUST_LOG = "RUST_LOG"
# tracing's LevelFilter, as a directive may also give it, by number: off 0 ... trace 5.
_LEVELS = {"off": 0, "error": 1, "warn": 2, "info": 3, "debug": 4, "trace": 5}
_INFO, _TRACE = _LEVELS["info"], _LEVELS["trace"]


@dataclass(frozen=True)
class Kept:
    """The daemon's filter with its engine's lines kept: the RUST_LOG to give its phase (None: leave the inherited
    one be), cuzk.toml's ``[logging] level``, and what the log says of a change (None: none made)."""

    rust_log: str | None
    level: str
    said: str | None = None


def keep_engine_lines(rust_log: str | None, level: str) -> Kept:
    """The filter the daemon will use (``rust_log``, the inherited RUST_LOG, when it parses whole; else cuzk.toml's
    ``level``), with ``cuzk_core::engine=info`` added where it hides the engine's lines."""
    if rust_log is not None and (directives := _directives(rust_log, strict=True)) is not None:
        if _shows_engine_info(directives):
            return Kept(None, level)
        kept = f"{rust_log},{KEEP}" if rust_log.strip() else KEEP
        return Kept(kept, level, f"{RUST_LOG}={rust_log} hides cuzk-daemon's PCE lines (info, {ENGINE_TARGET}), "
                                 f"which the warm-up waits on: the phase gets {RUST_LOG}={kept}")
    directives = _directives(level, strict=False) or {}
    if _shows_engine_info(directives):
        return Kept(None, level)
    # (nothing valid in it: the daemon's level was error, and stays so beside the engine's lines)
    valid = any(_directive(raw.strip()) is not None for raw in filter(None, level.split(",")))
    kept = f"{level},{KEEP}" if valid else f"error,{KEEP}"
    return Kept(None, kept, f"cuzk's [logging] level {level!r} hides cuzk-daemon's PCE lines (info, {ENGINE_TARGET}), "
                            f"which the warm-up waits on: cuzk.toml has {kept!r}")


def _directives(text: str, strict: bool) -> dict[str | None, int] | None:
    """target (None: every target) → level, the later of one target kept; None when ``strict`` and one is bad."""
    found: dict[str | None, int] = {}
    for raw in filter(None, text.split(",")):
        directive = _directive(raw.strip())
        if directive is None:
            if strict:
                return None
        elif directive[1] is not None:  # (one with a span or fields filters lines in spans: the engine's are not)
            found[directive[0]] = directive[1]
    return found


def _directive(text: str) -> tuple[str | None, int | None] | None:
    """One directive as tracing-subscriber parses it (filter/env/directive.rs): (target or None, level); level None
    for one with a span or fields; None for a bad one."""
    if not text or not (text[0].isalnum() or text[0] in "-:_["):
        return None
    if "[" in text:
        return None, None  # (a span or fields: no level of its own for a plain line)
    target, eq, level = text.partition("=")
    if eq:
        number = _TRACE if level == "" else _level(level)
        return None if number is None else (target, number)
    number = _level(text)
    return (None, number) if number is not None else (text, _TRACE)


def _level(text: str) -> int | None:
    if text.isascii() and text.isdigit():
        return int(text) if int(text) <= _TRACE else None
    return _LEVELS.get(text.lower())


def _shows_engine_info(directives: dict[str | None, int]) -> bool:
    named = [target for target in directives if target is not None and ENGINE_TARGET.startswith(target)]
    chosen = max(named, key=len) if named else None
    return chosen in directives and directives[chosen] >= _INFO
