"""Stand-in for the Filecoin parameter fetch (``curio fetch-params`` / standalone ``paramfetch``).

Usage::

    python -m supervisor.prover.standins.paramfetch fetch-params <size>     # size with units: 32GiB, 2KiB, 8MiB
    python -m supervisor.prover.standins.paramfetch <sectorSizeBytes> <parameters.json> <srs.json>

A bare number as ``<size>`` is refused (exit 1), as curio does. In the standalone form the
entries of parameters.json whose ``sector_size`` matches (plus every srs.json entry) name
the files; if the JSON files are missing or name nothing, generated names are used.

Files are written into ``$FIL_PROOFS_PARAMETER_CACHE`` (default
``/var/tmp/filecoin-proof-parameters``, created if missing), each growing chunk by chunk
so progress shows as bytes growing in the directory. A partial file is resumed (as with
an HTTP Range request); a complete one is reported ``Parameter file <path> is ok`` and
skipped. The directory's ``fetch.lock`` is taken with flock; if another fetch holds it,
the lock is retried every 10 s (scaled). Output (go-log lines, logger ``paramfetch``)::

    Fetching <path> from <url>
    GET <url>
    <done> / <total> [=====>-----]  25.00% <rate>/s      (progress-bar lines)
    checksum mismatch in param file <path>, <got> != <want>   (STANDIN_PARAM_CORRUPT only)
    Parameter file <path> is ok
    parameter and key-fetching complete

Exit 0 when done. SIGTERM, SIGINT, SIGHUP: print a line, exit 1 (partial files stay).

Environment:
    FIL_PROOFS_PARAMETER_CACHE, IPFS_GATEWAY (URL prefix, default https://proofs.filecoin.io/ipfs/),
    TRUST_PARAMS=1 (skip the checksum check, so STANDIN_PARAM_CORRUPT does nothing),
    STANDIN_PARAM_FILES (files, default 3), STANDIN_PARAM_BYTES (bytes per file, default 1 MiB),
    STANDIN_PARAM_CHUNKS (chunks per file, default 4), STANDIN_PARAM_CHUNK_S (seconds per chunk,
    default 0.1 scaled), STANDIN_PARAM_CORRUPT (``1``: the first downloaded file fails its
    checksum once, is deleted and fetched again; ``always``: it fails twice and the fetch exits 1),
    STANDIN_LOCK_RETRY_S (default 10 scaled), plus the common knobs (see ``knobs`` and ``failures``).
    Partway point for STANDIN_FAIL: after the first progress-bar line (or, when nothing
    needs downloading, just before the final line).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from typing import Any, NamedTuple

from . import failures, knobs, output

DEFAULT_CACHE = "/var/tmp/filecoin-proof-parameters"
DEFAULT_GATEWAY = "https://proofs.filecoin.io/ipfs/"
LOGGER = "paramfetch"
SIZE_HELP = 'specify as "32GiB", for instance'

_NAME_PATTERNS = (
    "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-{h}.params",
    "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-{h}.vk",
    "v28-proof-of-spacetime-fallback-merkletree-poseidon_hasher-8-8-0-{h}.params",
    "v28-proof-of-spacetime-fallback-merkletree-poseidon_hasher-8-8-0-{h}.vk",
    "v28-empty-sector-update-merkletree-poseidon_hasher-8-8-0-{h}.params",
    "v28-empty-sector-update-merkletree-poseidon_hasher-8-8-0-{h}.vk",
)


class Param(NamedTuple):
    name: str
    cid: str


class Aborted(Exception):
    """The fetch failed for good (exit 1)."""


def _log(level: str, msg: str) -> None:
    line = 100 + sum(map(ord, msg.split(" ", 1)[0])) % 200  # stable per kind of message
    output.golog(LOGGER, level, msg, caller=f"go-paramfetch@v0.0.4/paramfetch.go:{line}")


def generated_params(sector_size: int, count: int) -> list[Param]:
    """Deterministic fake parameter names for a sector size (same names on every run)."""
    params = []
    for i in range(count):
        digest = hashlib.sha256(f"{sector_size}/{i}".encode()).hexdigest()
        pattern = _NAME_PATTERNS[i % len(_NAME_PATTERNS)]
        name = pattern.format(h=digest)
        if i >= len(_NAME_PATTERNS):
            name = name.replace("v28-", f"v28-{i // len(_NAME_PATTERNS)}-", 1)
        params.append(Param(name, "Qm" + digest[:44]))
    return params


def params_from_json(sector_size: int, params_path: str, srs_path: str) -> list[Param]:
    """Names from parameters.json entries of this sector size plus srs.json entries ([] if none)."""
    found: list[Param] = []
    for path, match_size in ((params_path, True), (srs_path, False)):
        try:
            with open(path) as fh:
                table: Any = json.load(fh)
        except (OSError, ValueError) as exc:
            _log("warn", f"reading {path}: {exc}; using generated parameter names")
            continue
        if not isinstance(table, dict):
            continue
        for name, info in table.items():
            if not isinstance(info, dict):
                continue
            if match_size and info.get("sector_size") != sector_size:
                continue
            cid = str(info.get("cid") or "Qm" + hashlib.sha256(name.encode()).hexdigest()[:44])
            found.append(Param(name, cid))
    return found


def _progress_line(done: int, total: int, started: float) -> str:
    width = 40
    frac = done / total if total else 1.0
    filled = int(frac * width)
    bar = "=" * filled + (">" if filled < width else "") + "-" * max(0, width - filled - 1)
    rate = done / max(time.monotonic() - started, 1e-6)
    return (f"{knobs.human_bytes(done)} / {knobs.human_bytes(total)} [{bar}] "
            f"{frac * 100:6.2f}% {knobs.human_bytes(rate)}/s")


def _chunk_bytes(offset: int, n: int) -> bytes:
    pattern = bytes(range(256))
    start = offset % 256
    reps = (n + start) // 256 + 1
    return (pattern * reps)[start:start + n]


class Fetcher:
    """Downloads (writes) the fake parameter files one by one."""

    def __init__(self, cache: str, params: list[Param]) -> None:
        self.cache = cache
        self.params = params
        self.size = max(1, knobs.env_size("STANDIN_PARAM_BYTES", 1024 * 1024))
        self.chunks = max(1, knobs.env_int("STANDIN_PARAM_CHUNKS", 4))
        self.chunk_s = knobs.env_seconds("STANDIN_PARAM_CHUNK_S", 0.1)
        self.gateway = os.environ.get("IPFS_GATEWAY", "").strip() or DEFAULT_GATEWAY
        self.trust = os.environ.get("TRUST_PARAMS", "").strip() == "1"
        self.corrupt = os.environ.get("STANDIN_PARAM_CORRUPT", "").strip().lower()
        self.corrupted = 0

    def run(self) -> None:
        for param in self.params:
            self.fetch(param)
        failures.partway()
        _log("info", "parameter and key-fetching complete")

    def fetch(self, param: Param) -> None:
        path = os.path.join(self.cache, param.name)
        if self._complete(path):
            _log("info", f"Parameter file {path} is ok")
            return
        url = self.gateway.rstrip("/") + "/" + param.cid
        _log("info", f"Fetching {path} from {url}")
        for attempt in range(2):
            self._download(path, url)
            if self._checksum_fails(attempt):
                want = hashlib.blake2b(param.name.encode()).hexdigest()[:32]
                got = hashlib.blake2b(f"corrupt/{attempt}/{param.name}".encode()).hexdigest()[:32]
                _log("warn", f"checksum mismatch in param file {path}, {got} != {want}")
                os.unlink(path)
                if attempt == 1:
                    raise Aborted(f"fetching param file {path} failed: checksum mismatch")
                continue
            _log("info", f"Parameter file {path} is ok")
            return

    def _complete(self, path: str) -> bool:
        try:
            return os.path.getsize(path) == self.size
        except OSError:
            return False

    def _checksum_fails(self, attempt: int) -> bool:
        """STANDIN_PARAM_CORRUPT: fail the first download once (``1``) or twice (``always``)."""
        if self.trust or self.corrupt not in ("1", "true", "yes", "always"):
            return False
        if self.corrupted >= (2 if self.corrupt == "always" else 1):
            return False
        self.corrupted += 1
        return True

    def _download(self, path: str, url: str) -> None:
        _log("info", f"GET {url}")
        with open(path, "ab") as fh:
            done = fh.tell()
            if done > self.size:
                fh.truncate(0)
                done = 0
            step = -(-self.size // self.chunks)
            started = time.monotonic()
            while done < self.size:
                knobs.sleep(self.chunk_s)
                n = min(step, self.size - done)
                fh.write(_chunk_bytes(done, n))
                fh.flush()
                done += n
                output.out(_progress_line(done, self.size, started))
                failures.partway()


def _on_signal(signum: int, _frame: Any) -> None:
    output.unsilence()
    _log("warn", f"received {failures.signal_name(signum)}, aborting parameter fetch")
    raise SystemExit(1)


def _usage(prog: str) -> str:
    return (f"usage: {prog} fetch-params <size>   (size with units, {SIZE_HELP})\n"
            f"       {prog} <sectorSizeBytes> <parameters.json> <srs.json>")


def main(argv: list[str] | None = None, prog: str = "paramfetch") -> int:
    """Entry point; ``curio fetch-params`` calls it with ``["fetch-params", size]``."""
    output.init_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        output.out(_usage(prog))
        return 0
    if args and args[0] == "fetch-params":
        if len(args) != 2:
            output.err(f"ERROR: must pass sector size to fetch params ({SIZE_HELP})")
            return 1
        try:
            sector_size = knobs.parse_size(args[1], require_unit=True)
        except ValueError as exc:
            output.err(f"ERROR: error parsing sector size ({SIZE_HELP}): {exc}")
            return 1
        json_paths: tuple[str, str] | None = None
    elif len(args) == 3:
        if not (args[0].isascii() and args[0].isdigit()):
            output.err(f"ERROR: sector size must be a number of bytes, got {args[0]!r}")
            return 1
        sector_size = int(args[0])
        json_paths = (args[1], args[2])
    else:
        output.err(_usage(prog))
        return 1

    try:
        failures.setup("paramfetch")
    except knobs.UsageError as exc:
        output.err(f"ERROR: {exc}")
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        failures.handle_signal(sig, _on_signal)

    count = max(1, knobs.env_int("STANDIN_PARAM_FILES", 3))
    params = params_from_json(sector_size, *json_paths) if json_paths else []
    if not params:
        params = generated_params(sector_size, count)
    cache = os.environ.get("FIL_PROOFS_PARAMETER_CACHE", "").strip() or DEFAULT_CACHE
    try:
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, "fetch.lock"), "a") as lock:
            _lock(lock)
            Fetcher(cache, params).run()
    except Aborted as exc:
        output.err(f"ERROR: {exc}")
        return 1
    except OSError as exc:
        output.err(f"ERROR: fetching params: {exc}")
        return 1
    return 0


def _lock(fh: Any) -> None:
    import fcntl

    retry = knobs.env_seconds("STANDIN_LOCK_RETRY_S", 10.0)
    while True:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError as exc:
            _log("warn", f"acquiring filesystem fetch lock: {exc.strerror}; will retry in {retry:g}s")
            knobs.sleep(retry)


if __name__ == "__main__":
    sys.exit(main())
