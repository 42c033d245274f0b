"""Hostile config input: whatever is thrown at it, the answer is exit status 2 and one line, never a traceback.

The classes of issue 10 (random bytes, huge numbers, NUL, deep nesting, odd file types) go to the real command line,
``python -m supervisor check --config F`` as a subprocess, and a few of them to ``run`` and ``status --config`` too.
A seeded in-process fuzz then throws many more hostile values at every key of every table, where nothing but a
one-line ``ConfigError`` may come out. The seed is fixed: a failure replays.
"""

from __future__ import annotations

import datetime
import os
import random
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, clean_env, kill_tree, toml_str

from supervisor.config import MAX_CONFIG_BYTES, ConfigError, parse_plan
from supervisor.config.tables import DAEMON_KEYS, MANAGER_KEYS, PHASE_KEYS, SUPERVISOR_KEYS
from supervisor.prover.configkeys import CUZK_KEYS, FLEET_KEYS
from supervisor.prover.plugin import PLUGIN

PROG = "prover-supervisor"
SEED = 20261201
CLI_TIMEOUT_S = 20
# Subprocesses started at once: enough to keep the runtime short, few enough for a small shared machine.
PARALLEL = 6
IN_PROCESS_CASES = 3000

VALID = '[[phases]]\nname = "p"\ncommand = ["true"]\n'


# ---------------------------------------------------------------- helpers


def run_all(argvs: list[list[str]], env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Run the CLI once per argv, PARALLEL at a time; one that does not end in CLI_TIMEOUT_S fails the test."""
    results: list[subprocess.CompletedProcess[str]] = []
    for start in range(0, len(argvs), PARALLEL):
        batch = [
            subprocess.Popen([PY, "-m", "supervisor", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True, encoding="utf-8", errors="replace",
                             env=env or clean_env(), cwd=REPO, start_new_session=True)
            for argv in argvs[start:start + PARALLEL]
        ]
        try:
            for proc, argv in zip(batch, argvs[start:start + PARALLEL], strict=True):
                try:
                    out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{' '.join(argv)!r} still runs after {CLI_TIMEOUT_S}s: it hangs on its input")
                results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
        finally:
            for proc in batch:
                if proc.poll() is None:
                    kill_tree(proc.pid)
                    proc.communicate()
    return results


def assert_refused(result: subprocess.CompletedProcess[str], expected: str = "") -> None:
    """Exit 2, nothing on stdout, exactly one line on stderr (containing ``expected``), no traceback anywhere."""
    what = " ".join(map(str, result.args))[:200]
    assert "Traceback" not in result.stderr + result.stdout, f"{what}: traceback:\n{result.stderr[-3000:]}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"{what}: {len(lines)} lines on stderr, expected one:\n{result.stderr[-3000:]}"
    assert lines[0].startswith(f"{PROG}: "), f"{what}: {lines[0]}"
    assert expected in lines[0], f"{what}: expected {expected!r} in: {lines[0]}"
    assert result.returncode == 2, f"{what}: exit status {result.returncode}, expected 2: {lines[0]}"
    assert result.stdout == "", f"{what}: stdout should be empty, got {result.stdout[:300]!r}"


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    path.write_bytes(data)
    return path


def check_all(paths: list[Path]) -> list[subprocess.CompletedProcess[str]]:
    return run_all([["check", "--config", str(p)] for p in paths])


# ---------------------------------------------------------------- the classes, at the command line


def test_random_bytes(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    paths = [write(tmp_path, f"bytes{i}.toml", rng.randbytes(rng.choice([1, 7, 100, 4096, 65536])))
             for i in range(10)]
    # Text that is valid UTF-8 but nothing like TOML, and TOML-looking lines with random values.
    alphabet = "abc=[]{}\"'.,#\n\t ²١𝟗\u2028\x85\x7f0123456789$"
    paths += [write(tmp_path, f"text{i}.toml", "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 2000))))
              for i in range(6)]
    for result in check_all(paths):
        assert_refused(result)


HUGE_NUMBERS = {
    "ring-lines": ("[supervisor]\nring_lines = 99999999999999999999\n" + VALID, "supervisor.ring_lines"),
    "timeout-25-days": (VALID + "timeout_s = 2200000\n", "phases[0] (p).timeout_s"),
    "timeout-1e300": (VALID + "timeout_s = 1e300\n", "phases[0] (p).timeout_s"),
    "timeout-beyond-float": (VALID + "timeout_s = 1" + "0" * 400 + "\n", "phases[0] (p).timeout_s"),
    "size-1e999": (VALID + 'min_memory = "1e999"\n', "phases[0] (p).min_memory"),
    "size-many-digits": (VALID + 'memory_max = "' + "9" * 5000 + 'GiB"\n', "phases[0] (p).memory_max"),
    "int-5000-digits": (VALID + "retries = " + "9" * 5000 + "\n", "not valid TOML"),
    "superscript-port": ("[supervisor]\nhttp_port = \"${NOPE_UNSET:-²}\"\n" + VALID, "supervisor.http_port"),
    "backoff-factor": (VALID + 'kind = "service"\nbackoff_factor = 1e300\n', "phases[0] (p).backoff_factor"),
}


def test_huge_numbers(tmp_path: Path) -> None:
    paths = [write(tmp_path, f"{name}.toml", body) for name, (body, _) in HUGE_NUMBERS.items()]
    for result, (_, expected) in zip(check_all(paths), HUGE_NUMBERS.values(), strict=True):
        assert_refused(result, expected)


NUL_BODIES = {
    "command": ('[[phases]]\nname = "p"\ncommand = ["true", "a\\u0000b"]\n', "phases[0] (p).command[1]"),
    "env": (VALID + 'env = { A = "\\u0000" }\n', "phases[0] (p).env.A"),
    "cwd": (VALID + 'cwd = "/tmp\\u0000"\n', "phases[0] (p).cwd"),
    "state-dir": ('[supervisor]\nstate_dir = "/tmp/s\\u0000"\n' + VALID, "supervisor.state_dir"),
    "log-dir": ('[supervisor]\nlog_dir = "/tmp/l\\u0000"\n' + VALID, "supervisor.log_dir"),
    "cuzk-path": ('[cuzk]\nconfig_path = "/c\\u0000"\n' + VALID, "cuzk.config_path"),
    "key": (VALID + '"a\\u0000" = 1\n', "phases[0]"),
}


def test_nul(tmp_path: Path) -> None:
    paths = [write(tmp_path, f"nul-{name}.toml", body) for name, (body, _) in NUL_BODIES.items()]
    for result, (_, expected) in zip(check_all(paths), NUL_BODIES.values(), strict=True):
        assert_refused(result, expected)


DEEP_BODIES = {
    "arrays-5000": VALID + "x = " + "[" * 5000 + "]" * 5000 + "\n",
    "arrays-200": VALID + "x = " + "[" * 200 + "]" * 200 + "\n",
    "inline-tables-3000": VALID + "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
    "dotted-keys-3000": ".".join(["a"] * 3000) + " = 1\n" + VALID,
    "table-headers-500": "[" + ".".join(["t"] * 500) + "]\n" + VALID,
    "array-tables-unclosed": "x = " + "[" * 100000 + "\n" + VALID,
}


def test_deep_nesting(tmp_path: Path) -> None:
    paths = [write(tmp_path, f"deep-{name}.toml", body) for name, body in DEEP_BODIES.items()]
    for result in check_all(paths):
        assert_refused(result)
        assert len(result.stderr) < 300, result.stderr


def test_unterminated_variables_do_not_hang(tmp_path: Path) -> None:
    """Close to 1 MiB of "${X:-" with no "}": the expansion once scanned to the end from every "$" (20 minutes).
    Refused in one line as the first "${" that begins no reference, its text cut."""
    body = VALID + 'cwd = "' + "${X:-" * ((MAX_CONFIG_BYTES - 200) // 5) + '"\n'
    (result,) = check_all([write(tmp_path, "unterminated.toml", body)])
    assert_refused(result, "phases[0] (p).cwd: '${X:-${X:-")
    assert "is not a ${NAME} or ${NAME:-default} reference" in result.stderr and len(result.stderr) < 400, \
        result.stderr[:500]


@pytest.fixture
def odd_files(tmp_path: Path) -> Iterator[dict[str, tuple[Path, str]]]:
    """Things that are not a config file, each with what its one line must say."""
    files: dict[str, tuple[Path, str]] = {}
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    files["fifo"] = (fifo, "a FIFO")
    directory = tmp_path / "dir.toml"
    directory.mkdir()
    files["directory"] = (directory, "a directory")
    files["dev-zero"] = (Path("/dev/zero"), "a character device")
    (tmp_path / "to-zero.toml").symlink_to("/dev/zero")
    files["link-to-dev-zero"] = (tmp_path / "to-zero.toml", "a character device")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    files["symlink-loop"] = (tmp_path / "loop1", "cannot read")
    # Unreadable even for root: a regular file whose read fails (EIO).
    files["read-fails"] = (Path("/proc/self/mem"), "cannot read")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    files["over-the-size-cap"] = (big, "cannot read")
    files["empty"] = (write(tmp_path, "empty.toml", b""), "empty")
    files["blank"] = (write(tmp_path, "blank.toml", b" \n\t\n"), "empty")
    files["latin-1"] = (write(tmp_path, "latin1.toml", VALID.replace("p", "\xe9").encode("latin-1")), "not UTF-8")
    files["utf-16"] = (write(tmp_path, "utf16.toml", VALID.encode("utf-16")), "not UTF-8")
    sock_path = tmp_path / "sock.toml"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    files["socket"] = (sock_path, "a socket")
    if os.geteuid() != 0:
        unreadable = write(tmp_path, "unreadable.toml", VALID)
        unreadable.chmod(0)
        files["no-permission"] = (unreadable, "cannot read")
    try:
        yield files
    finally:
        sock.close()


def test_odd_file_types(odd_files: dict[str, tuple[Path, str]]) -> None:
    results = check_all([path for path, _ in odd_files.values()])
    for result, (_, expected) in zip(results, odd_files.values(), strict=True):
        assert_refused(result, expected)


def test_run_and_status_refuse_them_too(tmp_path: Path, odd_files: dict[str, tuple[Path, str]]) -> None:
    """``run`` refuses what ``check`` refuses, before it creates anything; ``status --config`` too."""
    state, logs = tmp_path / "state", tmp_path / "logs"
    dirs = f"[supervisor]\nstate_dir = {toml_str(str(state))}\nlog_dir = {toml_str(str(logs))}\n"
    marker = tmp_path / "marker"
    ran = f'[[phases]]\nname = "m"\ncommand = ["touch", {toml_str(str(marker))}]\n'
    bodies = [
        dirs + ran + '[[phases]]\nname = "p"\ncommand = ["true", "a\\u0000b"]\n',
        dirs + ran + '[[phases]]\nname = "p"\ncommand = ["true"]\ntimeout_s = 2200000\n',
        dirs + ran + "x = " + "[" * 5000 + "]" * 5000 + "\n",
        dirs + ran + '[[phases]]\nname = "p"\ncommand = ["true"]\nmin_memory = "1e999"\n',
        dirs + "[cuzk]\noverrides = { memory = { total_budget = \"abc\" } }\n" + ran,
    ]
    configs = [write(tmp_path, f"run{i}.toml", body) for i, body in enumerate(bodies)]
    odd = [odd_files[name][0] for name in ("fifo", "dev-zero", "symlink-loop", "directory")]
    argvs = [["run", "--config", str(p)] for p in configs + odd]
    argvs += [["status", "--config", str(p)] for p in odd]
    for result in run_all(argvs):
        assert_refused(result)
    # $SUPERVISOR_CONFIG is read the same way.
    (result,) = run_all([["run"]], env=clean_env({"SUPERVISOR_CONFIG": str(odd_files["fifo"][0])}))
    assert_refused(result, "a FIFO")
    assert not marker.exists(), "a phase ran although the config is bad"
    assert not state.exists() and not logs.exists(), "run created its directories although the config is bad"


# ---------------------------------------------------------------- the seeded fuzz, in process
# With the prover plugin, as the command line loads a config: its [cuzk] and its [manager] keys are fuzzed too.

TABLES = {
    "top": ("{line}\n" + VALID, {"supervisor": None, "manager": None, "cuzk": None, "phases": None}),
    "supervisor": ("[supervisor]\n{line}\n" + VALID, SUPERVISOR_KEYS),
    "manager": ("[manager]\n{line}\n" + VALID, {**MANAGER_KEYS, **FLEET_KEYS}),
    "cuzk": ("[cuzk]\n{line}\n" + VALID, CUZK_KEYS),
    "oneshot": (VALID + "{line}\n", PHASE_KEYS),
    "service": (VALID + 'kind = "service"\n{line}\n', PHASE_KEYS),
    "daemon": (VALID + 'kind = "service"\n[[phases.daemons]]\nname = "d"\ncommand = ["true"]\n{line}\n', DAEMON_KEYS),
}
ODD_TEXT = ["²", "١٢", "𝟗", "\x00", "\u2028", "\x85", "\x7f", "\n", "${X}", "${X:-", "$$", "${NOPE:-²}", "1e999",
            "nan", "-1", "0", "tcp://", "http://[", "/", "//", "GiB", "auto", "SIGKILL", "\ufeff", "\udcff"]


def hostile(rng: random.Random, depth: int = 0) -> object:
    """One hostile TOML value: huge, tiny, negative, odd text, wrong types, deep structures."""
    kind = rng.randrange(9 if depth < 40 else 6)
    if kind == 0:
        return rng.choice([0, -1, 1, 2**31, 2**63, -(2**63), 10**20, 10**400, rng.randint(-10**6, 10**6)])
    if kind == 1:
        return rng.choice([float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 5e-324, 0.5, 1e9,
                           rng.uniform(-1e6, 1e6)])
    if kind == 2:
        return rng.choice([True, False, datetime.datetime(1979, 5, 27, 7, 32), datetime.date(2026, 1, 1)])
    if kind in (3, 4, 5):
        parts = [rng.choice(ODD_TEXT) if rng.random() < 0.5 else str(rng.randint(0, 99999)) for _ in range(3)]
        text = "".join(parts)
        return text * rng.choice([1, 1, 1, 300, 5000])
    if kind in (6, 7):
        return [hostile(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {rng.choice(["a", "memory", "total_budget", "pipeline", "x\x00"]): hostile(rng, depth + 1)
            for _ in range(rng.randint(0, 2))}


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return toml_str(value).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{toml_str(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def test_seeded_fuzz_of_every_key() -> None:
    rng = random.Random(SEED)
    environ = {"X": "²", "PORT": "١٢"}
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(IN_PROCESS_CASES):
        template, keys = TABLES[rng.choice(list(TABLES))]
        key = rng.choice([*keys, "timout_s", "k" * 300, "a\nb", "\u2028", "\x85", "", "é"])
        text = template.format(line=f"{toml_str(key)} = {toml_value(hostile(rng))}")
        try:
            parse_plan(text, "fuzz.toml", environ, PLUGIN)
        except ConfigError as exc:
            message = str(exc)
            assert len(message.splitlines()) == 1 and len(message) < 1000, f"case {case}: {message!r}\n{text[:500]}"
            outcomes["refused"] += 1
        except Exception as exc:  # anything else would reach the user as a traceback
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}\n{text[:1000]}")
        else:
            outcomes["accepted"] += 1
    # The fuzz must reach past the checkers, not only be refused at the door.
    assert outcomes["refused"] > IN_PROCESS_CASES // 2 and outcomes["accepted"] > 0, outcomes


# ---------------------------------------------------------------- the rest of the command line


def test_command_line_values_refused_in_one_line(tmp_path: Path) -> None:
    too_long = "/" + "d" * 300
    argvs = [["status", "--state-dir", too_long], ["status", "--state-dir", "/tmp/" + "s" * 100],
             ["standins", "--bin-dir", "/dev/null/bin"], ["check", "--config", too_long]]
    expected = ["--state-dir:", "--state-dir: too long for the status socket", "--bin-dir /dev/null/bin:",
                "File name too long"]
    for result, what in zip(run_all(argvs), expected, strict=True):
        assert_refused(result, what)


@pytest.mark.parametrize("port", ["99999999", "-5", "²", "65536", "0x50"])
def test_dev_manager_port_is_checked_by_argparse(port: str) -> None:
    (result,) = run_all([["dev-manager", "--port", port]])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert f"argument --port: {port!r} is not a TCP port" in result.stderr, result.stderr
