"""Stand-in for the Filecoin parameter fetch (``curio fetch-params`` / standalone ``paramfetch``).

Usage::

    python -m supervisor.prover.standins.paramfetch fetch-params <size>     # 32GiB, 2KiB, 8MiB (32: 32 bytes)
    python -m supervisor.prover.standins.paramfetch <sectorSizeBytes> <parameters.json> <srs.json>

``<size>`` is read as curio reads it, go-units ``RAMInBytes`` (knobs.parse_size): a bare number is bytes, no
error; a size no parameter set has (``32`` bytes, say) fetches its ``.vk`` files alone and exits 0, as curio does
(it skips only the ``.params`` files of other sizes, and every ``.vk`` is of some other size then). In the
standalone form the entries of parameters.json whose ``sector_size`` matches (plus every srs.json entry) name
the files; if the JSON files are missing or name nothing, generated names are used.

Files are written into ``$FIL_PROOFS_PARAMETER_CACHE`` (default
``/var/tmp/filecoin-proof-parameters``, created if missing) the way curio fetches them, every file at once
(a thread each, as curio's goroutines: their lines come mixed on the one stdout)
(``STANDIN_PARAM_DOWNLOADER``, see ``downloader``): by the real ``aria2c`` with curio's
flags (``--lowest-speed-limit 16K -m100 --retry-wait 10 --continue -x16 -s16 --dir D -o F
URL``, ``--max-download-limit`` from ``STANDIN_PARAM_RATE``) against ``$IPFS_GATEWAY`` (a
local server: ``paramserve``), its output passed through; without it, as aria2c would
(the file preallocated at once, ``<file>.aria2`` beside it until it is complete, one
readout line ``[#896ec2 8.2MiB/57MiB(14%) CN:1 DL:4.0MiB ETA:12s]`` a second, block-buffered into a
pipe as aria2c's (they arrive with each progress summary, every ``summary-interval`` of aria2c's configuration
file, 60 s by default, at the file's end, or 4 KiB at a time), ANSI-coloured NOTICE lines,
``Download complete: PATH``, the results table); or as curio's Go fallback
(``go``: nothing printed, the file grows). A partial file is resumed (from its control
file, else its length); a complete one (its size, and no control file) is reported
``Parameter file <path> is ok`` and skipped. Every file is checked for real, before and after its download:
its blake2b held to the content the gateway serves. Where aria2c fails (exit 5: a link under 16 KiB/s for
10 s), curio's Go fallback asks for a Range from where the file ends and appends whatever comes, its status
unread: the file aria2c preallocated gets a 416 and nothing, fails its check, is deleted and fetched again from
zero (aria2c removes the control file left beside no file); a second failure ends the fetch, exit 1 (curio's
``lib/fastparamfetch/paramfetch.go``, ``maybeFetchAsync`` and ``doFetch``). The directory's ``fetch.lock`` is taken with
flock; if another fetch holds it, the lock is retried every 10 s (scaled).
Output (go-log lines, logger ``paramfetch``)::

    checksum mismatch in param file <path>, <got> != <want>   (a file there before, incomplete or bad; WARN)
    Fetching <path> from <gateway>                            (each fetch of it: twice for one fetched again)
    GET <url>
    (aria2c's lines, or nothing for the Go fallback)
    aria2c fetch failed: exit status <N>                      (then the Go fallback; WARN)
    sanity checking fetched file failed, removing and retrying: checksum mismatch in param file <path>, <got> != <want>
                                                              (STANDIN_PARAM_CORRUPT only; ERROR)
    Parameter file <path> is ok
    parameter and key-fetching complete

Exit 0 when done. SIGTERM, SIGINT, SIGHUP: print a line, exit 1 (partial files stay).

Environment:
    FIL_PROOFS_PARAMETER_CACHE, IPFS_GATEWAY (URL prefix, default https://proofs.filecoin.io/ipfs/),
    TRUST_PARAMS=1 (skip the checksum check, so STANDIN_PARAM_CORRUPT does nothing),
    STANDIN_PARAM_FILES (files, default 3), STANDIN_PARAM_BYTES (bytes per file, default 1 MiB),
    STANDIN_PARAM_CHUNKS (chunks per file, default 4), STANDIN_PARAM_CHUNK_S (seconds per chunk,
    default 0.1 scaled), STANDIN_PARAM_RATE (bytes a second, ``1M``/``1MiB``: aria2c's
    --max-download-limit, and the pace without it, in place of the chunks), STANDIN_PARAM_DOWNLOADER,
    STANDIN_PARAM_CORRUPT (``1``: the first downloaded file fails its
    checksum once, is deleted and fetched again; ``always``: it fails twice and the fetch exits 1),
    STANDIN_PARAM_DEAD_GATEWAY (``1``: the simulated aria2c's gateway never answers: it prints the same
    ``0B/0B`` readout a second and a summary every summary interval until stopped),
    STANDIN_LOCK_RETRY_S (default 10 scaled), plus the common knobs (see ``knobs`` and ``failures``).
    Partway point for STANDIN_FAIL: after the first chunk (after aria2c's first file) (or, when nothing
    needs downloading, just before the final line).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any, NamedTuple, NoReturn

from . import aria2, failures, knobs, output

DEFAULT_CACHE = "/var/tmp/filecoin-proof-parameters"
DEFAULT_GATEWAY = "https://proofs.filecoin.io/ipfs/"
LOGGER = "paramfetch"
SIZE_HELP = 'specify as "32GiB", for instance'
# The sector sizes parameters.json has sets for (lotus build/proof-params): 2KiB, 8MiB, 512MiB, 32GiB, 64GiB.
SECTOR_SIZES = (2 << 10, 8 << 20, 512 << 20, 32 << 30, 64 << 30)
# With STANDIN_PARAM_RATE, a chunk is written every this many seconds.
RATE_TICK_S = 0.25

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
    """Deterministic fake parameter names for a sector size (same names on every run); for a size no parameter set
    has, the ``.vk`` names alone (curio fetches every ``.vk`` whatever the size, and ``.params`` of that size)."""
    params = []
    for i in range(count):
        if sector_size not in SECTOR_SIZES and _NAME_PATTERNS[i % len(_NAME_PATTERNS)].endswith(".params"):
            continue
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


def _chunk_bytes(offset: int, n: int) -> bytes:
    pattern = bytes(range(256))
    start = offset % 256
    reps = (n + start) // 256 + 1
    return (pattern * reps)[start:start + n]


class Fetcher:
    """Downloads (writes) the fake parameter files, all at once as curio does."""

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
        self._want: str | None = None  # the content's digest (made at the first check)
        # Bytes a second (``1M``, ``1MiB``): aria2c's --max-download-limit, and the simulation's pace.
        self.rate = knobs.env_size("STANDIN_PARAM_RATE", 0) or None
        # The simulated aria2c's gateway takes the connection and never answers (the real one: a dead local server).
        self.dead_gateway = os.environ.get("STANDIN_PARAM_DEAD_GATEWAY", "").strip() == "1"
        self._lock = threading.Lock()  # (the fetches' shared counts, and the aria2c's running)
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closing = False  # (set as the fetch ends: no aria2c starts after)

    def run(self) -> None:
        """Every file at once, as curio's maybeFetchAsync starts a goroutine for each (lib/fastparamfetch): their
        lines and those of the aria2c each starts come mixed on the one stdout. Once all are over, a failure of
        any ends the fetch (exit 1), as curio returns its errors after its wait. A stop signal's exit takes the
        aria2c's with it."""
        if not self.trust:
            self._digest()  # (made once, before the fetches that check against it)
        failed: list[Aborted] = []

        def fetch_one(param: Param) -> None:
            try:
                self.fetch(param)
            except Aborted as exc:
                failed.append(exc)
            except OSError as exc:
                failed.append(Aborted(f"fetching file {os.path.join(self.cache, param.name)} failed: {exc}"))

        fetches = [threading.Thread(target=fetch_one, args=(param,), name=f"fetch {param.name}", daemon=True)
                   for param in self.params]
        try:
            for fetch in fetches:
                failures.start_thread(fetch, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
            for fetch in fetches:
                while fetch.is_alive():
                    fetch.join(0.05)  # (short: the main thread takes the stop signals)
        finally:
            with self._lock:
                self._closing = True
                for proc in self._running:
                    proc.kill()
        if failed:
            raise failed[0]
        failures.partway()
        _log("info", "parameter and key-fetching complete")

    def fetch(self, param: Param) -> None:
        path = os.path.join(self.cache, param.name)
        if os.path.exists(path):
            found = self._mismatch(path)
            if found is None and self._complete(path):
                _log("info", f"Parameter file {path} is ok")
                return
            if found is not None:  # (curio only warns: the file stays, and aria2c --continue takes it up)
                _log("warn", found)
        url = self.gateway.rstrip("/") + "/" + param.cid
        for attempt in range(2):
            self._download(path, url)
            mismatch = self._mismatch(path) or self._forced_mismatch(attempt, param, path)
            if mismatch is not None:
                os.unlink(path)  # (its control file stays: aria2c removes it as defunct, and starts from zero)
                if attempt == 1:  # (curio says nothing now: the error is in what it exits with)
                    raise Aborted(f"re-checking file {path} failed: {mismatch}")
                _log("error", f"sanity checking fetched file failed, removing and retrying: {mismatch}")
                continue
            _log("info", f"Parameter file {path} is ok")
            return

    def _complete(self, path: str) -> bool:
        """Its full size and no control file beside it (a preallocated download has its size at once)."""
        try:
            return os.path.getsize(path) == self.size and not os.path.exists(path + aria2.CONTROL_SUFFIX)
        except OSError:
            return False

    def _mismatch(self, path: str) -> str | None:
        """curio's check, for real: the whole file read through blake2b and held to the content the gateway serves
        (paramserve's), printing nothing (minutes for the 45 GiB PoRep file: the phase's sign of life is its
        reads); what curio says of a file that fails it (None: it passed). A preallocated file that aria2c left
        incomplete fails it (zeros where nothing came), as does one the Go fallback appended to. TRUST_PARAMS=1
        skips it, as curio does."""
        if self.trust:
            return None
        digest = hashlib.blake2b()
        try:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
        except OSError as exc:
            return f"open {path}: {exc.strerror or exc}"
        got, want = digest.hexdigest()[:32], self._digest()
        return None if got == want else f"checksum mismatch in param file {path}, {got} != {want}"

    def _digest(self) -> str:
        """The first 16 bytes, in hex, of the blake2b-512 of the content served (curio's ``digest``), made once."""
        if self._want is None:
            digest, done = hashlib.blake2b(), 0
            while done < self.size:
                n = min(1 << 20, self.size - done)
                digest.update(_chunk_bytes(done, n))
                done += n
            self._want = digest.hexdigest()[:32]
        return self._want

    def _forced_mismatch(self, attempt: int, param: Param, path: str) -> str | None:
        """STANDIN_PARAM_CORRUPT's failed check, in curio's words."""
        if not self._checksum_fails(attempt):
            return None
        got = hashlib.blake2b(f"corrupt/{attempt}/{param.name}".encode()).hexdigest()[:32]
        return f"checksum mismatch in param file {path}, {got} != {self._digest()}"

    def _checksum_fails(self, attempt: int) -> bool:
        """STANDIN_PARAM_CORRUPT: fail the first download once (``1``) or twice (``always``)."""
        if self.trust or self.corrupt not in ("1", "true", "yes", "always"):
            return False
        with self._lock:
            if self.corrupted >= (2 if self.corrupt == "always" else 1) or (attempt == 0 and self.corrupted):
                return False
            self.corrupted += 1
            return True

    def _download(self, path: str, url: str) -> None:
        """One of curio's ``doFetch``: aria2c (or its shape), and where it fails, the Go fallback on what it left.
        It says what it fetches from which gateway, then the URL, each time (twice for a file fetched again)."""
        _log("info", f"Fetching {path} from {self.gateway}")
        _log("info", f"GET {url}")
        how = downloader()
        if how == "go":
            self._grow(path)
            return
        status = self._aria2c(path, url) if how == "aria2c" else self._simulate_aria2c(path)
        if status == 0:
            failures.partway()
            return
        _log("warn", f"aria2c fetch failed: exit status {status}")
        if how == "aria2c":
            self._go_range(path, url)
        else:
            self._grow(path)

    def _aria2c(self, path: str, url: str) -> int:
        """curio's way: the real aria2c with curio's flags, its output passed straight through; its exit status."""
        argv = ["aria2c", "--lowest-speed-limit", "16K", "-m100", "--retry-wait", "10", "--continue", "-x16",
                "-s16", "--dir", os.path.dirname(path), "-o", os.path.basename(path), url]
        if self.rate:
            argv.insert(1, f"--max-download-limit={self.rate}")
        sys.stdout.flush()
        with self._lock:
            if self._closing:
                raise Aborted(f"fetching file {path} failed: the fetch is ending")
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
            self._running.add(proc)
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._running.discard(proc)

    def _go_range(self, path: str, url: str) -> None:
        """curio's Go fallback after aria2c failed (``doFetch``): a Range from where the file ends, the answer's
        body appended whatever its status, printing nothing. aria2c preallocated the file to its full size, so
        the Range asks past its end: a 416 and nothing appended, and the check that follows fails (zeros where
        aria2c got nothing); the file is deleted and fetched again from zero."""
        with open(path, "ab") as fh:
            request = urllib.request.Request(url, headers={"Range": f"bytes={fh.tell()}-"})
            try:
                answer = urllib.request.urlopen(request, timeout=60)
            except urllib.error.HTTPError as exc:  # (Go's client hands any status over; curio copies its body)
                answer = exc
            except (urllib.error.URLError, OSError) as exc:
                raise Aborted(f"fetching file {path} failed: {exc}") from None
            with answer:
                shutil.copyfileobj(answer, fh)

    def _grow(self, path: str) -> None:
        """curio's Go fallback: a Range download from where the file ends, printing nothing; the file grows."""
        with open(path, "ab") as fh:
            done = fh.tell()
            if done > self.size:
                fh.truncate(0)
                done = 0
            for n in self._chunks(done):
                fh.write(_chunk_bytes(done, n))
                fh.flush()
                done += n
                failures.partway()

    def _simulate_aria2c(self, path: str) -> int:
        """What aria2c prints and leaves, without it: the file preallocated to its full size at once, a
        ``.aria2`` control file beside it while it is incomplete (here: the offset reached, as text), one
        readout line a second (and one a chunk), block-buffered into a pipe as aria2c's are (they arrive
        with each progress summary, every ``--summary-interval``, and with the next NOTICE line, when the file is
        done), the NOTICE lines, the results table. Against a dead gateway (STANDIN_PARAM_DEAD_GATEWAY) it waits
        for an answer for as long as it runs."""
        control = path + aria2.CONTROL_SUFFIX
        if os.path.exists(control) and not os.path.exists(path):  # (as aria2c: the download starts from zero)
            os.unlink(control)
            output.out(f"\n{aria2.stamp()} [{aria2.NOTICE}] Removed the defunct control file {control} because the "
                       f"download file {path} doesn't exist.")
        done = aria2.resumed_offset(path, control, self.size)
        gid = hashlib.sha256(path.encode()).hexdigest()[:6]
        output.out(f"\n{aria2.stamp()} [{aria2.NOTICE}] Downloading 1 item(s)")
        readouts = aria2.Readouts(path)
        if self.dead_gateway:
            self._unanswered(gid, readouts)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            length = os.fstat(fd).st_size
            if length != self.size:
                if length > self.size:  # (longer than the file: resumed_offset starts it over)
                    os.ftruncate(fd, 0)
                aria2.preallocate(fd, self.size)  # (a shorter one keeps what it has: --continue resumes at its end)
            aria2.write_control(control, done)
            started, said = time.monotonic(), 0.0
            for n in self._chunks(done):
                os.pwrite(fd, _chunk_bytes(done, n), done)
                done += n
                aria2.write_control(control, done)
                now = time.monotonic()
                if now - said >= 1.0 or self.rate is None:
                    said = now
                    readouts.readout(aria2.readout(gid, done, self.size, done / max(now - started, 1e-6)))
                if self.rate is not None and self.rate < aria2.LOWEST_SPEED and now - started >= aria2.TOO_SLOW_S:
                    readouts.add(aria2.too_slow(self.rate))  # as aria2c: given up, exit 5, left to --continue
                    readouts.flush()
                    output.out(aria2.results(gid, path, ok=False))
                    return 5
                failures.partway()
            os.fsync(fd)
        finally:
            os.close(fd)
            readouts.flush()  # (aria2c's buffer goes out with its next NOTICE, or at its exit)
        os.unlink(control)
        output.out(aria2.results(gid, path, ok=True))
        return 0

    @staticmethod
    def _unanswered(gid: str, readouts: aria2.Readouts) -> NoReturn:
        """aria2c against a gateway that takes the connection and never answers: no size, no file, the same readout
        a second and a summary every ``--summary-interval``, for as long as it runs. Its tries fail silently
        (measured with aria2 1.36.0: no line when a try times out), -m100 of them, each waiting out its --timeout
        (60 s): about two hours, past any timeout_s; and no body ever comes for --lowest-speed-limit to judge. The
        stand-in waits until it is stopped."""
        while True:
            time.sleep(1.0)
            readouts.readout(aria2.unanswered(gid))

    def _chunks(self, done: int) -> Iterator[int]:
        """The sizes written from ``done``, each after its wait: STANDIN_PARAM_RATE bytes a second (a chunk a
        quarter second), else the file in STANDIN_PARAM_CHUNKS chunks of STANDIN_PARAM_CHUNK_S each."""
        if self.rate is not None:
            step, wait = max(1, int(self.rate * RATE_TICK_S)), RATE_TICK_S
        else:
            step, wait = -(-self.size // self.chunks), self.chunk_s
        while done < self.size:
            knobs.sleep(wait)
            n = min(step, self.size - done)
            yield n
            done += n


def downloader() -> str:
    """How files are fetched (STANDIN_PARAM_DOWNLOADER): ``aria2c`` (the real one), ``simulated`` (its lines,
    without it), ``go`` (curio's silent fallback); ``auto`` (default): the real aria2c where it is installed
    and IPFS_GATEWAY names a server on this machine to fetch from (a test's ParamServer), else
    simulated (a stand-in never reaches out to the real gateway)."""
    chosen = os.environ.get("STANDIN_PARAM_DOWNLOADER", "").strip().lower() or "auto"
    if chosen in ("aria2c", "simulated", "go"):
        return chosen
    host = urllib.parse.urlsplit(os.environ.get("IPFS_GATEWAY", "").strip()).hostname or ""
    local = host == "localhost" or host == "::1" or host.startswith("127.")
    return "aria2c" if shutil.which("aria2c") and local else "simulated"


def _on_signal(signum: int, _frame: Any) -> None:
    output.unsilence()
    _log("warn", f"received {failures.signal_name(signum)}, aborting parameter fetch")
    raise SystemExit(1)


def _usage(prog: str) -> str:
    return (f"usage: {prog} fetch-params <size>   ({SIZE_HELP})\n"
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
            sector_size = knobs.parse_size(args[1])
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
