"""The stand-in programs behave like the real workloads: lines, files, signals, failures.

Every stand-in runs as a real subprocess (``python -m supervisor.prover.standins.<name>``) with a
small STANDIN_SPEED; every process started here is killed in a fixture finalizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, free_port, is_listening
from profilekit import standin_env

PROOF_LINE = re.compile(
    r"^  \[(\d+)/(\d+)\] (COMPLETED|FAILED|CANCELLED|TIMEOUT) — \d+\.\ds \(prove=\d+ ms, queue=\d+ ms\)$"
)


def command(module: str, *args: str) -> list[str]:
    return [PY, "-m", f"supervisor.prover.standins.{module}", *args]


# cuzk-bench's PoRep input (--c1 is required; the stand-in daemon never reads it), as the CLI installs it.
C1 = str(Path(__file__).parent / "c1.json")


def run_standin(module: str, *args: str, env: dict[str, str],
                timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run(command(module, *args), env=env, cwd=REPO, capture_output=True, text=True,
                          encoding="utf-8", timeout=timeout)


class Proc:
    """A running stand-in whose merged output is collected line by line by a thread."""

    def __init__(self, module: str, args: tuple[str, ...], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(command(module, *args), env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, encoding="utf-8")
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _drain(self, timeout: float) -> bool:
        """Move queued lines to self.lines; False at EOF."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return True
        if item is None:
            self._queue.put(None)
            return False
        self.lines.append(item)
        return True

    def wait_for(self, pattern: str, timeout: float = 10) -> str:
        regex = re.compile(pattern)
        seen = 0
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines[seen:]:
                if regex.search(line):
                    return line
            seen = len(self.lines)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} in:\n{self.output}")
            if not self._drain(min(left, 0.1)) and len(self.lines) == seen:
                raise AssertionError(f"EOF before a line matching {pattern!r} in:\n{self.output}")

    def wait(self, timeout: float = 10) -> int:
        rc = self.popen.wait(timeout)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and self._drain(0.05):
            pass
        return rc

    def settle(self, seconds: float) -> None:
        """Collect output for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._drain(0.02)

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def cleanup(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        self._reader.join(2)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def _spawn(module: str, *args: str, env: dict[str, str]) -> Proc:
        proc = Proc(module, args, env)
        procs.append(proc)
        return proc

    try:
        yield _spawn
    finally:
        for proc in procs:
            proc.cleanup()


@pytest.fixture
def stray_pids() -> Iterator[list[int]]:
    """PIDs of escaped grandchildren, killed at the end."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_daemon(spawn: Callable[..., Proc], tmp_path: Path, listen: str | None = None,
                 **env_extra: str) -> tuple[Proc, int, int]:
    port, status_port = free_port(), free_port()
    config = tmp_path / "cuzk.toml"
    config.write_text(f'[daemon]\nlisten = "127.0.0.1:{port}"\n'
                      f'status_listen = "127.0.0.1:{status_port}"\n')
    args = ["-c", str(config)] + (["-l", listen] if listen else [])
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), **env_extra)
    proc = spawn("cuzk_daemon", *args, env=env)
    return proc, port, status_port


def wait_status(status_port: int, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{status_port}/status", timeout=1) as resp:
                return json.load(resp)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# ------------------------------------------------------------------ paramfetch


def test_paramfetch_go_fallback_grows_files_printing_no_progress(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    # curio's Go fallback (no aria2c): a Range download that prints nothing while the file grows.
    # (aria2c's own shape, preallocated with a control file: tests/prover/test_fetch_progress.py.)
    cache = tmp_path / "params"
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_FILES="2", STANDIN_PARAM_DOWNLOADER="go",
                      STANDIN_PARAM_BYTES="64KiB", STANDIN_PARAM_CHUNKS="4", STANDIN_PARAM_CHUNK_S="0.05")
    proc = spawn("paramfetch", "fetch-params", "2KiB", env=env)
    seen_totals = set()
    deadline = time.monotonic() + 10
    while proc.popen.poll() is None and time.monotonic() < deadline:
        if cache.is_dir():
            seen_totals.add(sum(p.stat().st_size for p in cache.iterdir() if p.suffix in (".params", ".vk")))
        time.sleep(0.005)
    assert proc.wait() == 0, proc.output
    full = 2 * 64 * 1024
    assert any(0 < total < full for total in seen_totals), seen_totals
    assert len([t for t in seen_totals if t > 0]) >= 3, seen_totals
    files = sorted(p for p in cache.iterdir() if p.suffix in (".params", ".vk"))
    assert [p.stat().st_size for p in files] == [64 * 1024] * 2
    out = proc.output
    assert re.search(r"Fetching \S+\.params from https://proofs\.filecoin\.io/ipfs/$", out, re.MULTILINE)
    assert re.search(r"\tGET https://\S+", out)
    assert "%" not in out and "[#" not in out  # no readout of any kind
    assert len(re.findall(r"Parameter file \S+ is ok", out)) == 2
    assert proc.lines[-1].endswith("parameter and key-fetching complete")


def test_paramfetch_skips_complete_files_and_resumes_partial_ones(tmp_path: Path) -> None:
    cache = tmp_path / "params"
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_BYTES="32KiB")
    first = run_standin("paramfetch", "fetch-params", "8MiB", env=env)
    assert first.returncode == 0, first.stderr
    files = sorted(p for p in cache.iterdir() if p.suffix in (".params", ".vk"))
    assert len(files) == 3
    partial = files[0]
    partial.write_bytes(partial.read_bytes()[:10000])
    second = run_standin("paramfetch", "fetch-params", "8MiB", env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("Fetching ") == 1
    assert f"Fetching {partial} from" in second.stdout
    assert second.stdout.count(" is ok") == 3
    assert partial.stat().st_size == 32 * 1024


def test_paramfetch_reads_a_bare_number_as_bytes_as_curio_does(tmp_path: Path) -> None:
    """curio reads the size with go-units RAMInBytes: a bare 32 is 32 bytes, no error; no set is that size, so
    it fetches the .vk files alone and says it is done (the stand-in refused it, exit 1, "as curio does")."""
    cache = tmp_path / "params"
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_FILES="6", STANDIN_PARAM_BYTES="4096")
    result = run_standin("paramfetch", "fetch-params", "32", env=env)
    assert result.returncode == 0, result.stderr
    assert "parameter and key-fetching complete" in result.stdout
    fetched = sorted(p.suffix for p in cache.iterdir() if p.suffix in (".params", ".vk"))
    assert fetched == [".vk"] * 3, fetched
    bad = run_standin("paramfetch", "fetch-params", "32XB", env=env)
    assert bad.returncode == 1
    assert bad.stderr == 'ERROR: error parsing sector size (specify as "32GiB", for instance): invalid suffix: \'xb\'\n'


@pytest.mark.parametrize(("text", "size"), [
    ("32GiB", 32 << 30), ("32G", 32 << 30), ("32gb", 32 << 30), ("32 GiB", 32 << 30), ("2KiB", 2048), ("32", 32),
    ("32b", 32), ("1.5MiB", 3 << 19), ("8m", 8 << 20), ("34359738368", 32 << 30),
    ("32XB", None), ("32GiBs", None), ("32gi", None), (" 32GiB", None), ("32GiB ", None), ("-32GiB", None),
    ("GiB", None), ("", None), ("32EiB", None),
])
def test_sizes_are_read_as_go_units_reads_them_and_as_the_supervisor_does(text: str, size: int | None) -> None:
    """The stand-in's reading (curio's: go-units v0.5.0 RAMInBytes) and the supervisor's check of the fetch's
    size (configkeys.py) agree on what curio would fetch."""
    from supervisor.prover.configkeys import curio_size
    from supervisor.prover.standins.knobs import parse_size

    if size is None:
        with pytest.raises(ValueError):
            parse_size(text)
        with pytest.raises(ValueError):
            curio_size(text)
    else:
        assert parse_size(text) == curio_size(text)[0] == size


def test_paramfetch_standalone_form_uses_the_json_names(tmp_path: Path) -> None:
    params_json = tmp_path / "parameters.json"
    params_json.write_text(json.dumps({
        "v28-a.params": {"cid": "QmA", "digest": "00", "sector_size": 2048},
        "v28-a.vk": {"cid": "QmB", "digest": "00", "sector_size": 2048},
        "v28-other.params": {"cid": "QmC", "digest": "00", "sector_size": 34359738368},
    }))
    srs_json = tmp_path / "srs.json"
    srs_json.write_text(json.dumps({"v28-fil-inner-product-v1.srs": {"cid": "QmD", "digest": "00"}}))
    cache = tmp_path / "params"
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_BYTES="4096",
                      IPFS_GATEWAY="http://gw.example/ipfs/")
    result = run_standin("paramfetch", "2048", str(params_json), str(srs_json), env=env)
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in cache.iterdir() if p.name != "fetch.lock")
    assert names == ["v28-a.params", "v28-a.vk", "v28-fil-inner-product-v1.srs"]
    assert f"Fetching {cache / 'v28-a.params'} from http://gw.example/ipfs/\n" in result.stdout
    assert "GET http://gw.example/ipfs/QmA\n" in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_paramfetch_exits_1_on_signals(tmp_path: Path, spawn: Callable[..., Proc], signum: int) -> None:
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), STANDIN_PARAM_CHUNK_S="30")
    proc = spawn("paramfetch", "fetch-params", "2KiB", env=env)
    proc.wait_for(r"\tGET ")
    proc.signal(signum)
    assert proc.wait() == 1
    assert f"received {signal.Signals(signum).name}, aborting parameter fetch" in proc.output


def test_paramfetch_checksum_mismatch_refetches_once_or_fails(tmp_path: Path) -> None:
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "a"), STANDIN_PARAM_BYTES="4096",
                      STANDIN_PARAM_CORRUPT="1")
    once = run_standin("paramfetch", "fetch-params", "2KiB", env=env)
    assert once.returncode == 0
    # curio's own words (lib/fastparamfetch/paramfetch.go): the line the progress watch counts again from.
    assert once.stdout.count("sanity checking fetched file failed, removing and retrying: checksum mismatch "
                             "in param file") == 1
    # doFetch says what it fetches each time: the bad file twice, the others once (3 files in all).
    assert once.stdout.count("Fetching ") == 4 and once.stdout.count("\tGET ") == 4, once.stdout
    env.update(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "b"), STANDIN_PARAM_CORRUPT="always")
    always = run_standin("paramfetch", "fetch-params", "2KiB", env=env)
    assert always.returncode == 1
    assert always.stdout.count("checksum mismatch in param file") == 1  # the second is said only at the exit
    assert "ERROR: re-checking file " in always.stderr and "checksum mismatch in param file" in always.stderr
    env.update(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "c"), TRUST_PARAMS="1")
    trusted = run_standin("paramfetch", "fetch-params", "2KiB", env=env)
    assert trusted.returncode == 0 and "checksum mismatch" not in trusted.stdout


def test_curio_fetch_params_delegates(tmp_path: Path) -> None:
    cache = tmp_path / "params"
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_BYTES="4096")
    ok = run_standin("curio", "fetch-params", "32GiB", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "parameter and key-fetching complete" in ok.stdout
    assert len([p for p in cache.iterdir() if p.suffix in (".params", ".vk")]) == 3
    bytes_32 = run_standin("curio", "fetch-params", "32", env=env)  # (32 bytes: curio says no more of it either)
    assert bytes_32.returncode == 0 and "parameter and key-fetching complete" in bytes_32.stdout, bytes_32.stderr


# ------------------------------------------------------------------ cuzk-daemon and cuzk-bench


def test_daemon_logs_ready_before_it_answers_then_serves_status(tmp_path: Path,
                                                                spawn: Callable[..., Proc]) -> None:
    proc, port, status_port = start_daemon(spawn, tmp_path, STANDIN_BIND_DELAY_S="0.5")
    line = proc.wait_for(r"cuzk-daemon ready")
    assert "\x1b[32m" in line and "INFO" in line
    assert not is_listening(status_port), "status port answered before the bind delay"
    assert not is_listening(port)
    status = wait_status(status_port)
    assert {"uptime_secs", "memory", "synthesis", "pipelines", "gpu_workers", "allocations", "counters",
            "buffers"} <= set(status)
    assert set(status["memory"]) == {"total_bytes", "used_bytes", "available_bytes"}
    assert status["counters"] == {"total_completed": 0, "total_failed": 0, "completed_by_kind": {},
                                  "failed_by_kind": {}, "queue_depth": 0}
    # The rest as status.rs serializes it (SrsEntry, GpuWorkerSnapshot, BuffersSnapshot): an idle worker's
    # busy_secs is null, never 0.
    assert [set(entry) for entry in status["allocations"]["srs"]] == [
        {"circuit_id", "bytes", "last_used_secs_ago", "evictable"}]
    assert status["allocations"]["pce"] == []  # (none extracted or loaded yet)
    assert status["gpu_workers"][0]["state"] == "idle" and status["gpu_workers"][0]["busy_secs"] is None
    assert set(status["buffers"]) == {"synth_in_flight", "provers_in_flight", "aux_in_flight", "shells_in_flight",
                                      "pending_handles"}
    assert is_listening(port)


def test_daemon_sigint_is_graceful(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    proc, _, status_port = start_daemon(spawn, tmp_path)
    wait_status(status_port)
    proc.signal(signal.SIGINT)
    assert proc.wait() == 0
    assert "shutting down gracefully" in proc.output
    assert proc.lines[-1].endswith("cuzk-daemon stopped")
    assert not is_listening(status_port)


def test_daemon_sigterm_kills_it_at_once(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    proc, _, status_port = start_daemon(spawn, tmp_path)
    wait_status(status_port)
    proc.signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM
    assert "shutting down" not in proc.output


# What the daemon's config says, read as the real daemon reads it (cuzk_settings): each case stops it before it
# binds anything (a failure at start, exit 1), after the lines that show what it read.
DAEMON_STARTS: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "missing-config": ("", {"STANDIN_DAEMON_MIN_BUDGET": "1PiB"},
                       [r"WARN.*config file \S+ not found, using built-in defaults",
                        r"memory budget: .* \(auto \(physical .* - margin 5\.00 GiB\)\)",
                        r"ERROR.*insufficient memory budget for SRS: budget .* < required 1024\.00 TiB"]),
    "malformed-toml": ("[daemon\nlisten = 1", {}, [r"ERROR.*failed to load config \S+cuzk\.toml: "]),
    "bad-listen": ('[daemon]\nlisten = "nowhere"\n', {}, [r"ERROR.*invalid listen address: nowhere: invalid socket"]),
    # (the form the supervisor wrote into cuzk.toml until 12-04: the real daemon ends at start on it)
    "url-listen": ('[daemon]\nlisten = "http://127.0.0.1:9"\n', {},
                   [r"ERROR.*invalid listen address: http://127\.0\.0\.1:9: invalid socket address syntax"]),
    # A size it cannot read is no error to the real daemon (cuzk-core config.rs parse_size): 50 GiB, after the whole
    # download too little for the SRS ("200G", "250.5GiB": the stand-in ended at its start on them, kinder).
    "unread-budget": ('[memory]\ntotal_budget = "200G"\n', {"STANDIN_DAEMON_MIN_BUDGET": "64GiB"},
                      [r"INFO.*memory budget: 50\.00 GiB \(configured\)",
                       r"ERROR.*insufficient memory budget for SRS: budget 50\.00 GiB < required 64\.00 GiB"]),
    "unread-margin": ('[memory]\nsafety_margin = "lots"\n', {"STANDIN_DAEMON_MIN_BUDGET": "1PiB"},
                      [r"INFO.*memory budget: .* \(auto \(physical .* - margin 50\.00 GiB\)\)",
                       r"ERROR.*insufficient memory budget for SRS"]),
    "budget-not-text": ('[memory]\ntotal_budget = 5\n', {}, [r"ERROR.*invalid type: \[memory\] total_budget 5"]),
    "budget-too-small": ('[memory]\ntotal_budget = "10GiB"\n', {"STANDIN_DAEMON_MIN_BUDGET": "64GiB"},
                         [r"INFO.*memory budget: 10\.00 GiB \(configured\)",
                          r"ERROR.*insufficient memory budget for SRS: budget 10\.00 GiB < required 64\.00 GiB"]),
    "no-params": ('[memory]\ntotal_budget = "400GiB"\n[synthesis]\npartition_workers = 3\n',
                  {"STANDIN_REQUIRE_PARAMS": "1"},
                  [r"WARN.*\[synthesis\] partition_workers is deprecated and ignored",
                   r"ERROR.*failed to load SRS: no parameter files in \S+params"]),
    "pw-generation": ('[memory]\npinned_budget = "50GiB"\n[synthesis]\npartition_workers = 2\n',
                      {"STANDIN_REQUIRE_PARAMS": "1", "STANDIN_CUZK_GENERATION": "partition-workers"},
                      [r"INFO.*memory: pinned_budget = 50GiB",
                       r"INFO.*synthesis: partition_workers=2 \(estimated peak RSS ~ 109\.00 GiB\)",
                       r"ERROR.*failed to load SRS"]),
    "pw-generation-bad-count": ("[synthesis]\npartition_workers = 0\n", {"STANDIN_CUZK_GENERATION": "feb-2026"},
                                [r"ERROR.*invalid \[synthesis\] partition_workers 0"]),
}


@pytest.mark.parametrize("case", list(DAEMON_STARTS))
def test_daemon_reads_its_config_as_the_real_one(tmp_path: Path, case: str) -> None:
    text, env, expected = DAEMON_STARTS[case]
    config = tmp_path / "cuzk.toml"
    if text:
        config.write_text(text)
    (tmp_path / "params").mkdir()
    done = run_standin("cuzk_daemon", "-c", str(config),
                       env=standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), **env))
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in done.stdout.splitlines()]
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    found = [next((i for i, line in enumerate(lines) if re.search(pattern, line)), None) for pattern in expected]
    assert None not in found and found == sorted(found), (expected, lines)  # each said, in this order
    assert not any("listening on" in line for line in lines), lines


def test_daemon_log_level_from_its_config(tmp_path: Path) -> None:
    """``[logging] level = "warn"`` silences the info lines; ``--log-level`` wins over it, and RUST_LOG over both."""
    config = tmp_path / "cuzk.toml"
    config.write_text('[logging]\nlevel = "warn"\n[memory]\ntotal_budget = "400GiB"\n')
    (tmp_path / "params").mkdir()
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), STANDIN_REQUIRE_PARAMS="1")
    quiet = run_standin("cuzk_daemon", "-c", str(config), env=env)
    assert quiet.returncode == 1 and "failed to load SRS" in quiet.stdout, quiet.stdout
    assert "starting (pid" not in quiet.stdout and "memory budget" not in quiet.stdout, quiet.stdout
    loud = run_standin("cuzk_daemon", "-c", str(config), "--log-level", "debug", env=env)
    assert loud.returncode == 1 and "starting (pid" in loud.stdout and "memory budget: 400.00 GiB" in loud.stdout
    hushed = run_standin("cuzk_daemon", "-c", str(config), "--log-level", "debug", env={**env, "RUST_LOG": "error"})
    assert hushed.returncode == 1 and "failed to load SRS" in hushed.stdout, hushed.stdout
    assert "starting (pid" not in hushed.stdout and "memory budget" not in hushed.stdout, hushed.stdout


def test_bench_reports_each_proof_and_exits_0_despite_failures(tmp_path: Path,
                                                               spawn: Callable[..., Proc]) -> None:
    daemon, port, status_port = start_daemon(spawn, tmp_path)
    wait_status(status_port)
    c1 = tmp_path / "c1.json"
    c1.write_text("{}")
    bench = run_standin("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "batch", "-t", "porep", "--c1", C1,
                        "--c1", str(c1), "-c", "4", "-j", "2",
                        env=standin_env(STANDIN_BENCH_FAIL_PROOFS="2"))
    assert bench.returncode == 0, bench.stderr
    lines = bench.stdout.splitlines()
    proofs = [m for m in map(PROOF_LINE.match, lines) if m]
    assert sorted(int(m.group(1)) for m in proofs) == [1, 2, 3, 4]
    assert sorted(m.group(3) for m in proofs) == ["COMPLETED", "COMPLETED", "FAILED", "FAILED"]
    # As the real tool (main.rs): its header as its clock starts; with -j above 1 the proofs are printed in
    # submission order once all were submitted (the first two, made to fail, first), not as each ends.
    assert lines[:5] == ["=== Batch Benchmark ===", "proof type:  porep", "count:       4", "concurrency: 2", ""]
    assert [(int(m.group(1)), m.group(3)) for m in proofs] == [
        (1, "FAILED"), (2, "FAILED"), (3, "COMPLETED"), (4, "COMPLETED")], lines
    summary = lines[lines.index("=== Batch Summary ===") + 1:]
    assert re.fullmatch(r"total time:    \d+\.\ds", summary[0])
    assert summary[1] == "completed:     2"
    assert summary[2] == "failed:        2"
    assert re.fullmatch(r"wall time:     avg=\d+\.\ds min=\d+\.\ds max=\d+\.\ds", summary[3])
    assert re.fullmatch(r"prove time:    avg=\d+\.\ds min=\d+\.\ds max=\d+\.\ds", summary[4])
    assert re.fullmatch(r"throughput:    \d+\.\d{3} proofs/min \(\d+\.\ds/proof\)", summary[5])
    status = wait_status(status_port)
    assert status["counters"]["total_completed"] == 4
    daemon.wait_for(r"^TIMELINE,\d+,completed,bench-\S+,prove_ms=\d+$")
    daemon.wait_for(r"background PCE extraction starting for PoRep 32G")
    assert (tmp_path / "params").exists() is False  # no cache dir: PCE not saved, and nothing created


@pytest.mark.parametrize("fail_as", ["", "gpu", "self-check"])
def test_daemon_status_counts_only_what_the_real_one_counts(fail_as: str, tmp_path: Path,
                                                             spawn: Callable[..., Proc]) -> None:
    """The real /status (cuzk-core engine.rs, at curio e0294b0) counts a proof only where a partitioned one is
    assembled (its StatusTracker.job_completed, 625 and 634): a PoRep or SnapDeals done, or a PoRep that failed its
    self-check. A partition's GPU failure (the default way the stand-in fails proofs) and every PoSt proof are in
    no counter of it: the stand-in counted every proof, so the watch's verdict was tested on a kinder daemon."""
    fail = tmp_path / "fail-proofs"
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_FAIL_PROOFS=str(fail),
                                             STANDIN_FAIL_PROOFS_AS=fail_as)
    wait_status(status_port)
    vanilla = tmp_path / "vanilla.json"
    vanilla.write_text("{}")

    def single(kind: str) -> str:
        given = ["--c1", C1] if kind == "porep" else ["--vanilla", str(vanilla)]
        done = run_standin("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "single", "-t", kind, *given,
                           env=standin_env())
        assert done.returncode == 0, done.stderr
        return done.stdout

    for kind in ("porep", "snap", "wpost", "winning"):
        assert "status:    COMPLETED" in single(kind), kind
    fail.touch()
    failed = {kind: single(kind) for kind in ("porep", "snap", "wpost")}
    gpu = "error:     partition 0 GPU prove failed: CUDA error: unspecified launch failure (STANDIN_FAIL_PROOFS)"
    assert gpu in failed["snap"] and gpu in failed["wpost"], failed  # (no self-check of a kind but PoRep)
    self_check = fail_as == "self-check"
    assert ("PoRep proof self-check failed: assembled proof did not verify" if self_check else gpu) in failed["porep"]
    # Named as the real one names its kinds (cuzk-core types.rs: ProofKind's Display).
    assert wait_status(status_port)["counters"] == {
        "total_completed": 2, "total_failed": int(self_check), "completed_by_kind": {"porep-c2": 1, "snap-update": 1},
        "failed_by_kind": {"porep-c2": 1} if self_check else {}, "queue_depth": 0}
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == 0
    bad = run_standin("cuzk_daemon", "-c", str(tmp_path / "none.toml"), env=standin_env(STANDIN_FAIL_PROOFS_AS="bad"))
    assert bad.returncode == 2 and "STANDIN_FAIL_PROOFS_AS='bad': expected gpu or self-check" in bad.stderr


def test_bench_without_a_daemon_exits_1_with_no_summary(tmp_path: Path) -> None:
    """No daemon: no proof gets an answer, so none has a status. The real tool's ``connect(..).await?``
    (main.rs 556, 586) returns the error from main: Rust prints it and exits 1, no proof line, no summary. (The
    stand-in once printed a FAILED line per proof, a summary and exit 0: a bench that reads as proofs failing.)"""
    addr = f"http://127.0.0.1:{free_port()}"
    connect_error = [f"Error: failed to connect to daemon at {addr}", "", "Caused by:", "    0: transport error",
                     "    1: tcp connect error", "    2: Connection refused (os error 111)"]
    for jobs in ("1", "2"):
        batch = run_standin("cuzk_bench", "-a", addr, "batch", "-t", "porep", "--c1", C1, "-c", "2", "-j", jobs,
                            env=standin_env())
        assert batch.returncode == 1, (jobs, batch.stdout, batch.stderr)
        assert batch.stdout.splitlines() == ["=== Batch Benchmark ===", "proof type:  porep", "count:       2",
                                             f"concurrency: {jobs}", ""], batch.stdout
        assert batch.stderr.splitlines() == connect_error, batch.stderr
    single = run_standin("cuzk_bench", "-a", addr, "single", "-t", "porep", "--c1", C1, env=standin_env())
    assert single.returncode == 1, "no answer at all: the real tool's error exit"
    assert single.stderr.splitlines() == connect_error and single.stdout == "", single
    missing = run_standin("cuzk_bench", "-a", addr, "batch", "-t", "porep", "--c1", str(tmp_path / "nope.json"),
                          env=standin_env())
    # (build_proof_params reads it before the header: std::fs::read's error under its context)
    assert missing.returncode == 1 and missing.stdout == "", missing
    assert missing.stderr.splitlines() == [f"Error: failed to read {tmp_path / 'nope.json'}", "", "Caused by:",
                                           "    No such file or directory (os error 2)"], missing.stderr
    folder = run_standin("cuzk_bench", "-a", addr, "single", "-t", "porep", "--c1", str(tmp_path),
                         env=standin_env())
    assert folder.returncode == 1 and folder.stderr.splitlines()[0] == f"Error: failed to read {tmp_path}", folder


@pytest.mark.parametrize(("args", "error"), [
    (["-t", "porep"], ["Error: --c1 required for PoRep proof type"]),
    (["-t", "seal-commit"], ["Error: --c1 required for PoRep proof type"]),  # (porep's other names)
    (["-t", "wpost", "--c1", C1], ["Error: --vanilla required for PoSt/SnapDeals proof types"]),
    (["-t", "porep2", "--c1", C1], ["Error: unknown proof type: porep2. Use: porep, snap, wpost, winning"]),
])
def test_bench_refuses_a_proof_it_has_no_input_for_before_it_prints_anything(args: list[str],
                                                                             error: list[str]) -> None:
    """cuzk-bench main.rs: proof_kind_from_str, then build_proof_params (--c1 for a PoRep, --vanilla for the
    others), both before the header and before any connect: Error: on stderr, exit 1. The stand-in once proved
    a PoRep from no --c1 at all."""
    addr = f"http://127.0.0.1:{free_port()}"  # (never reached)
    for command in ("batch", "single"):
        done = run_standin("cuzk_bench", "-a", addr, command, *args, env=standin_env())
        assert (done.returncode, done.stdout, done.stderr.splitlines()) == (1, "", error), done
    untyped = run_standin("cuzk_bench", "-a", addr, "single", "--c1", C1, env=standin_env())
    assert untyped.returncode == 2 and "-t" in untyped.stderr, "a usage error, as clap's for a required flag"
    late = run_standin("cuzk_bench", "single", "-t", "porep", "--c1", C1, "-a", addr, env=standin_env())
    assert late.returncode == 2, "-a is the top-level flag's: after the subcommand, clap refuses it"


@pytest.mark.parametrize(("addr", "error"), [
    # (a URI with no scheme: hyper's connector refuses it at the first connect)
    ("127.0.0.1:9820", ["Error: failed to connect to daemon at 127.0.0.1:9820", "", "Caused by:",
                        "    0: transport error", "    1: invalid URL, scheme is missing"]),
    ("localhost:9820", ["Error: failed to connect to daemon at localhost:9820", "", "Caused by:",
                        "    0: transport error", "    1: invalid URL, scheme is missing"]),
    ("not an address", ["Error: invalid daemon address: not an address", "", "Caused by:", "    invalid format"]),
])
def test_bench_reads_its_address_as_the_real_tool(addr: str, error: list[str]) -> None:
    """cuzk-bench's ``-a`` is a tonic endpoint (main.rs 415-455): ``http://host:port`` or ``unix:///path``. The
    stand-in once took a bare ``host:port`` too, which the real one never connects to."""
    batch = run_standin("cuzk_bench", "-a", addr, "batch", "-t", "porep", "--c1", C1, "-c", "2", "-j", "2",
                        env=standin_env())
    assert batch.returncode == 1 and batch.stderr.splitlines() == error, batch
    assert batch.stdout.splitlines() == ["=== Batch Benchmark ===", "proof type:  porep", "count:       2",
                                         "concurrency: 2", ""], batch.stdout
    single = run_standin("cuzk_bench", "-a", addr, "single", "-t", "porep", "--c1", C1, env=standin_env())
    assert single.returncode == 1 and single.stderr.splitlines() == error and single.stdout == "", single


def test_curio_reads_its_cuzk_address_as_its_client(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    """curio's [Cuzk] Address is host:port (its client dials ``dns:///host:port``) or unix:///path; an
    ``http://`` address names no gRPC resolver and every proof fails (lib/cuzk/client.go connect)."""
    from supervisor.prover.standins.curio import cuzk_target
    assert cuzk_target("127.0.0.1:9820") == ("tcp", ("127.0.0.1", 9820))
    assert cuzk_target("dns:///127.0.0.1:9820") == ("tcp", ("127.0.0.1", 9820))
    assert cuzk_target("unix:///run/curio/cuzk.sock") == ("unix", "/run/curio/cuzk.sock")
    for refused in ("http://127.0.0.1:9820", "https://127.0.0.1:9820", "tcp://127.0.0.1:9820", "dns:///nowhere"):
        assert cuzk_target(refused) is None, refused
    (tmp_path / "params").mkdir()
    _, port, _ = start_daemon(spawn, tmp_path)
    # (a proof every 0.3 s: the daemon, 2 proofs at once, keeps up under load; a proof queued past curio's
    # timeout would count failed beside the completed ones)
    for address, completed in ((f"127.0.0.1:{port}", True), (f"http://127.0.0.1:{port}", False)):
        curio_port = free_port()
        curio = spawn("curio", "run", "--listen", f"127.0.0.1:{curio_port}", "--nosync",
                      env=standin_env(CURIO_CUZK_ADDRESS=address, STANDIN_TASK_S="0.3"))
        curio.wait_for(r"task completed")
        metrics = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and 'tasks_completed{task_name="PoRep"}' not in metrics \
                and 'tasks_failed{task_name="PoRep"}' not in metrics:
            with urllib.request.urlopen(f"http://127.0.0.1:{curio_port}/debug/metrics", timeout=5) as answer:
                metrics = answer.read().decode()
            time.sleep(0.05)
        counted = 'tasks_completed{task_name="PoRep"}' if completed else 'tasks_failed{task_name="PoRep"}'
        other = 'tasks_failed{task_name="PoRep"}' if completed else 'tasks_completed{task_name="PoRep"}'
        assert counted in metrics and other not in metrics, (address, metrics)
        if not completed:
            assert "produced zero addresses" in curio.wait_for(r"cuzk prove failed"), curio.output
        curio.signal(signal.SIGTERM)
        assert curio.wait() == 0


def test_daemon_crash_mid_bench(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    """The daemon dies after its first proof: the real batch prints that proof's line, then the error of the
    next connect, and exits 1 with no summary (the stand-in once went on with a FAILED line per proof, a summary
    and exit 0)."""
    (tmp_path / "params").mkdir()
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_FAIL_CUZK_DAEMON="crash",
                                             STANDIN_FAIL_AFTER="1")
    wait_status(status_port)
    bench = run_standin("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "batch", "-t", "porep", "--c1", C1,
                        "-c", "3", "-j", "1", env=standin_env())
    assert bench.returncode == 1, bench.stdout + bench.stderr
    proofs = [m.group(3) for m in map(PROOF_LINE.match, bench.stdout.splitlines()) if m]
    assert proofs == ["COMPLETED"] and "=== Batch Summary ===" not in bench.stdout, bench.stdout
    # The next proof's connect, or its RPC, as the crash falls (the daemon dies just after its answer).
    assert bench.stderr.startswith(("Error: failed to connect to daemon at http://127.0.0.1:",
                                    "Error: Prove RPC failed\n")), bench.stderr
    assert daemon.wait() == 3
    assert "panicked" in daemon.output


def test_the_pce_is_extracted_on_a_thread_of_its_own_and_lost_with_a_daemon_stopped_first(
        tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    """As the real engine: the first proof starts the PCE's extraction and does not wait for it; the shutdown does
    not either, so a daemon stopped first leaves no PCE (its next start extracts it again)."""
    (tmp_path / "params").mkdir()
    pce = tmp_path / "params" / "pce-porep-32g.bin"
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_PCE_S="30")
    wait_status(status_port)
    proof = run_standin("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "single", "-t", "porep", "--c1", C1,
                        env=standin_env())
    assert proof.returncode == 0 and "COMPLETED" in proof.stdout, proof.stdout + proof.stderr
    daemon.wait_for(r"background PCE extraction starting for PoRep 32G")
    assert not pce.exists() and "background PCE extraction complete" not in daemon.output
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == 0
    assert not pce.exists() and "background PCE extraction complete" not in daemon.output


def test_the_pce_is_saved_through_a_tmp_file_then_said_complete(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    (tmp_path / "params").mkdir()
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_PCE_S="0.4")
    wait_status(status_port)
    proof = run_standin("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "single", "-t", "porep", "--c1", C1,
                        env=standin_env())
    assert proof.returncode == 0, proof.stdout + proof.stderr
    daemon.wait_for(r"background PCE extraction complete$")
    assert [p.name for p in (tmp_path / "params").iterdir()] == ["pce-porep-32g.bin"]  # (the .tmp renamed)
    said = daemon.output
    order = ["background PCE extraction starting", "PCE extraction complete circuit_id=porep-32g",
             "PCE saved to disk (raw format)", "PCE saved to disk circuit_id", "PCE cached",
             "background PCE extraction complete"]
    assert [said.index(line) for line in order] == sorted(said.index(line) for line in order), said
    assert wait_status(status_port)["allocations"]["pce"], "the PCE is not in /status's allocations"
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == 0


def test_daemon_on_a_unix_socket(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    sock = tmp_path / "cuzk.sock"
    daemon, _, status_port = start_daemon(spawn, tmp_path, listen=f"unix://{sock}")
    wait_status(status_port)
    single = run_standin("cuzk_bench", "-a", f"unix://{sock}", "single", "-t", "porep", "--c1", C1,
                         env=standin_env())
    assert single.returncode == 0, single.stdout + single.stderr
    assert "=== Proof Result ===\nstatus:    COMPLETED\n" in single.stdout
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == 0
    assert not sock.exists()


# ------------------------------------------------------------------ curio


def test_curio_run_listens_and_stops_gracefully_on_sigterm(spawn: Callable[..., Proc]) -> None:
    port = free_port()
    proc = spawn("curio", "run", "--listen", f"127.0.0.1:{port}", "--layers", "gpu,post", "--nosync",
                 env=standin_env())
    proc.wait_for(r"Curio API server listening")
    assert is_listening(port)
    wait = run_standin("curio", "cli", "--machine", f"127.0.0.1:{port}", "wait-api", env=standin_env())
    assert wait.returncode == 0
    proc.wait_for(r"task completed")
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
    assert "Shutting down gracefully (received SIGTERM)" in proc.output
    assert proc.lines[-1].endswith("Graceful shutdown successful")


def test_curio_run_seconds_ends_by_itself_with_json_logs() -> None:
    env = standin_env(STANDIN_RUN_SECONDS="0.3", GOLOG_LOG_FMT="json", CURIO_NODE_NAME="node-7")
    result = run_standin("curio", "run", "--listen", f"127.0.0.1:{free_port()}", env=env)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[0]["msg"] == "Starting curio node" and records[0]["name"] == "node-7"
    assert any(r["msg"] == "task completed" for r in records)
    assert records[-1]["msg"] == "Graceful shutdown successful"


def test_curio_drain_delays_the_exit(spawn: Callable[..., Proc]) -> None:
    proc = spawn("curio", "run", "--listen", f"127.0.0.1:{free_port()}", "--nosync",
                 env=standin_env(STANDIN_DRAIN_S="inf"))
    proc.wait_for(r"Curio API server listening")
    proc.signal(signal.SIGINT)
    proc.wait_for(r"Shutting down gracefully \(received SIGINT\)")
    proc.signal(signal.SIGTERM)  # ignored while draining
    with pytest.raises(subprocess.TimeoutExpired):
        proc.popen.wait(0.3)


def test_curio_refuses_a_taken_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_standin("curio", "run", "--listen", f"127.0.0.1:{port}", "--nosync", env=standin_env())
    assert result.returncode == 1
    assert "starting API server" in result.stdout


# ------------------------------------------------------------------ failure knobs


@pytest.mark.parametrize(("fail", "expected"), [
    ("crash", 3), ("exit:7", 7), ("segv", -signal.SIGSEGV), ("oom", -signal.SIGKILL),
])
def test_failure_modes_end_the_program(fail: str, expected: int) -> None:
    env = standin_env(STANDIN_FAIL=fail, STANDIN_OOM_LIMIT="64MiB")
    result = run_standin("curio", "run", "--listen", f"127.0.0.1:{free_port()}", "--nosync", env=env)
    assert result.returncode == expected, result.stdout + result.stderr
    assert "task completed" in result.stdout  # it got partway first
    if fail == "crash":
        assert "panic: simulated crash" in result.stderr
    if fail == "oom":
        assert "allocating memory in 16 MiB chunks" in result.stdout


def test_segv_on_a_thread_kills_the_program(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    """The daemon's failure point is on a request thread (paramfetch's on a file thread), where Python refuses
    ``signal.signal``: the stand-in printed a ValueError traceback and went on serving, never dying. It dies of
    SIGSEGV from any thread, faulthandler (PYTHONFAULTHANDLER) or not, with no Python dump."""
    (tmp_path / "params").mkdir()
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_FAIL_CUZK_DAEMON="segv", STANDIN_FAIL_AFTER="1",
                                             PYTHONFAULTHANDLER="1")
    wait_status(status_port)
    run_standin("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "single", "-t", "porep", "--c1", C1,
                env=standin_env())
    assert daemon.wait() == -signal.SIGSEGV, daemon.output
    assert "Traceback" not in daemon.output and "Fatal Python error" not in daemon.output, daemon.output


def test_ignore_term_survives_sigterm_and_sigint(spawn: Callable[..., Proc]) -> None:
    proc = spawn("curio", "run", "--listen", f"127.0.0.1:{free_port()}", "--nosync",
                 env=standin_env(STANDIN_FAIL="ignore-term"))
    proc.wait_for(r"Curio API server listening")
    proc.signal(signal.SIGTERM)
    proc.signal(signal.SIGINT)
    time.sleep(0.3)
    assert proc.popen.poll() is None
    proc.popen.kill()
    assert proc.wait() == -signal.SIGKILL


def test_hang_goes_silent_but_still_honours_sigterm(spawn: Callable[..., Proc]) -> None:
    proc = spawn("curio", "run", "--listen", f"127.0.0.1:{free_port()}", "--nosync",
                 env=standin_env(STANDIN_FAIL="hang"))
    proc.wait_for(r"task completed")
    proc.settle(0.4)  # ~8 task intervals
    assert proc.output.count("task completed") == 1
    assert proc.popen.poll() is None
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
    assert "Shutting down gracefully" in proc.output


def test_hung_daemon_stops_answering(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_FAIL="hang", STANDIN_FAIL_AFTER="0")
    wait_status(status_port)
    bench = spawn("cuzk_bench", "-a", f"http://127.0.0.1:{port}", "single", "-t", "porep", "--c1", C1,
                  env=standin_env())
    daemon.wait_for(r"background PCE extraction starting for PoRep 32G")

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{status_port}/status", timeout=0.3).close()
        except OSError:
            return False
        return True

    # The hang begins just after that line is written: a probe in between may still be answered.
    deadline = time.monotonic() + 10
    while answers() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{status_port}/status", timeout=0.3)
    assert bench.popen.poll() is None
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == 0
    assert bench.wait() in (0, 1)


def test_daemon_sigint_serve_on_logs_stops_its_engine_and_serves_on_until_sigkill(
        tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    """STANDIN_CUZK_SIGINT=serve-on, the real daemon (main.rs 260-277, engine.rs 3724-3727): SIGINT logs two lines
    and stops the engine's workers, nothing more. The proof on a GPU worker then finishes, one submitted after
    waits for ever, /status answers on, a second SIGINT does nothing; only SIGKILL (or SIGTERM) ends it."""
    (tmp_path / "params").mkdir()
    daemon, port, status_port = start_daemon(spawn, tmp_path, STANDIN_CUZK_SIGINT="serve-on",
                                             STANDIN_PROOF_S="1.5")
    wait_status(status_port)
    addr = f"http://127.0.0.1:{port}"
    running = spawn("cuzk_bench", "-a", addr, "single", "-t", "porep", "--c1", C1, env=standin_env())
    daemon.wait_for(r"TIMELINE,\d+,gpu_start,")
    daemon.signal(signal.SIGINT)
    daemon.wait_for(r"cuzk_daemon\b.* received SIGINT, shutting down$")
    daemon.wait_for(r"cuzk_core::engine\b.* shutting down cuzk engine$")
    assert running.wait(10) == 0 and "status:    COMPLETED" in running.output, running.output
    late = spawn("cuzk_bench", "-a", addr, "single", "-t", "porep", "--c1", C1, env=standin_env())
    daemon.wait_for(r"TIMELINE,\d+,received,warmup-")
    daemon.signal(signal.SIGINT)
    daemon.settle(1.0)
    assert daemon.popen.poll() is None and late.popen.poll() is None, "it serves on; the late proof waits"
    assert wait_status(status_port)["counters"]["queue_depth"] == 1
    assert daemon.output.count("received SIGINT") == 1 and "cuzk-daemon stopped" not in daemon.output
    daemon.popen.kill()
    assert daemon.wait() == -signal.SIGKILL
    assert late.wait(10) == 1 and late.output.startswith("Error: Prove RPC failed"), late.output


def test_daemon_sigint_serve_on_before_ready_kills_it(tmp_path: Path, spawn: Callable[..., Proc]) -> None:
    """The real daemon installs its SIGINT handler after "cuzk-daemon ready": before, SIGINT's default action."""
    daemon, _, _ = start_daemon(spawn, tmp_path, STANDIN_CUZK_SIGINT="serve-on", STANDIN_SRS_LOAD_S="5")
    daemon.wait_for(r"loading SRS")
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == -signal.SIGINT
    bad = run_standin("cuzk_daemon", "-c", str(tmp_path / "none.toml"),
                      env=standin_env(STANDIN_CUZK_SIGINT="drain"))
    assert bad.returncode == 2 and "STANDIN_CUZK_SIGINT" in bad.stderr


def test_orphan_escapes_the_session(tmp_path: Path, spawn: Callable[..., Proc],
                                    stray_pids: list[int]) -> None:
    pidfile = tmp_path / "orphan.pid"
    env = standin_env(STANDIN_FAIL="orphan", STANDIN_ORPHAN_PIDFILE=str(pidfile), STANDIN_ORPHAN_MAX_S="30",
                      FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), STANDIN_PARAM_BYTES="4096")
    proc = spawn("paramfetch", "fetch-params", "2KiB", env=env)
    line = proc.wait_for(r"spawned helper process pid=\d+")
    orphan = int(line.rsplit("=", 1)[1])
    stray_pids.append(orphan)
    assert int(pidfile.read_text()) == orphan
    proc.wait_for(r"parameter and key-fetching complete")  # carried on normally
    assert proc.popen.wait(5) == 0
    assert os.getsid(orphan) == orphan != os.getsid(0)  # the stand-in itself stayed in our session
    os.kill(orphan, 0)  # still alive after its parent exited


def test_program_specific_fail_knob_and_fail_times(tmp_path: Path) -> None:
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "p"), STANDIN_PARAM_BYTES="4096",
                      STANDIN_FAIL_CURIO="crash")
    assert run_standin("paramfetch", "fetch-params", "2KiB", env=env).returncode == 0
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "q"), STANDIN_PARAM_BYTES="4096",
                      STANDIN_FAIL="exit:5", STANDIN_FAIL_TIMES="1", STANDIN_FAIL_STATE=str(tmp_path / "n"))
    assert run_standin("paramfetch", "fetch-params", "2KiB", env=env).returncode == 5
    assert run_standin("paramfetch", "fetch-params", "2KiB", env=env).returncode == 0
    env["STANDIN_FAIL"] = "explode"
    bad = run_standin("paramfetch", "fetch-params", "2KiB", env=env)
    assert bad.returncode == 2 and "unknown STANDIN_FAIL mode" in bad.stderr


# SIGINT comes while the daemon starts its first server thread: right after the thread exists, before
# Thread.start's bookkeeping is done (the window a real Ctrl-C can hit).
SIGINT_IN_THREAD_START = """
import os, signal, sys, threading, time
_real = threading._start_new_thread
_sent = []
def _start_then_sigint(*args, **kwargs):
    ident = _real(*args, **kwargs)
    if not _sent:
        _sent.append(ident)
        time.sleep(0.2)  # the new thread is under way (its own bookkeeping done) when the signal comes
        os.kill(os.getpid(), signal.SIGINT)
    return ident
threading._start_new_thread = _start_then_sigint
from supervisor.prover.standins import cuzk_daemon
sys.exit(cuzk_daemon.main(sys.argv[1:]))
"""


def test_cuzk_daemon_takes_a_sigint_during_a_thread_start_as_a_graceful_stop(tmp_path: Path) -> None:
    """Its SIGINT handler raises in the main thread: raised inside Thread.start, the new thread died with a
    KeyError traceback, or the start raised KeyError in its place and the daemon crashed instead of shutting
    down. The stand-ins start their threads with the stop signals held (failures.start_thread)."""
    config = tmp_path / "cuzk.toml"
    config.write_text(f'[daemon]\nlisten = "127.0.0.1:{free_port()}"\n'
                      f'status_listen = "127.0.0.1:{free_port()}"\n')
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"))
    proc = subprocess.run([PY, "-c", SIGINT_IN_THREAD_START, "-c", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=30)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "KeyError" not in out, out
    assert proc.returncode == 0, out
