"""Config file → validated, frozen plan.

The lifecycle is described in TOML (read with ``tomllib``). Everything a run
needs is checked here, before anything starts: unknown keys, wrong types,
impossible values and unset ``${VAR}`` references are all refused with one line
that names the key (``phases[1].daemons[0].ready: ...``). The result is a tree
of frozen dataclasses, so nothing later can change the plan by accident.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import socket
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from .prover.cuzkconf import MEMORY_MODELS, PER_PARTITION, PW_BASELINE, PW_PER_WORKER, UNIFIED_BASELINE, CuzkSettings
from .units import is_ascii_digits, parse_size

# Named defaults: every timing value of the plan starts from one of these.
DEFAULT_STATE_DIR = "/var/lib/prover-supervisor"
DEFAULT_LOG_DIR = "/var/log/prover-supervisor"
DEFAULT_STOP_GRACE_S = 30.0
DEFAULT_RING_LINES = 200
DEFAULT_LOG_FILE_MAX_BYTES = 64 * 1024 * 1024
# Daemons such as cuzk-daemon load tens of GiB before they answer; a short
# default startup wait causes more failures than it prevents.
DEFAULT_READY_TIMEOUT_S = 900.0
DEFAULT_BACKOFF_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_BACKOFF_FACTOR = 2.0
DEFAULT_BACKOFF_JITTER = 0.1
DEFAULT_RESTART_BURST = 5
DEFAULT_RESTART_WINDOW_S = 300.0
DEFAULT_BACKOFF_RESET_S = 60.0

PHASE_KINDS = ("oneshot", "service")
RESTART_POLICIES = ("no", "on-failure", "always")
DAEMON_LIFETIMES = ("phase", "lifecycle")
CGROUP_MODES = ("auto", "shared", "off")
REPORTS = ("param-done", "bench-done", "running")
PREPARES = ("cuzk-config",)
RESUMES = ("no", "outputs", "machine")
DEFAULT_RESUME_MAX_AGE_S = 86400.0
PARSERS = ("cuzk-bench", "cuzk-single")  # a batch with its summary; one proof's result block
DEFAULT_MANAGER_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MANAGER_READ_TIMEOUT_S = 15.0
DEFAULT_MIN_RATE = 50.0
DEFAULT_LOG_PUSH_INTERVAL_S = 1.0
DEFAULT_LOG_BACKLOG_BYTES = 2 * 1024 * 1024
# How long production waits for the manager's verdict on the benchmark before it starts anyway.
DEFAULT_BENCH_GATE_S = 300.0
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
# Kubernetes shows this file's content in `kubectl describe` when a container fails.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# Bounds: every number a config gives has a sane maximum, so that nothing later overflows or waits forever.
# Timers: select() takes at most 2**31 - 1 ms (24.86 days), and a backoff with full jitter doubles its delay;
# 10 days keeps every timer inside that, and no real timeout, grace, window or age is longer.
MAX_SECONDS = 10 * 86400.0
MAX_SECONDS_TEXT = "864000 seconds (10 days)"
MAX_COUNT = 1_000_000  # a whole number without a bound of its own
MAX_RING_LINES = 100_000  # kept in memory per child
MAX_RETRIES = 1_000
MAX_RESTART_BURST = 1_000
MAX_BENCH_CONCURRENCY = 1_024
MAX_OVERRIDE_WORKERS = 1_024  # [cuzk.overrides] synthesis_concurrency, partition_workers
MAX_LOG_FILE_MAX_BYTES = 1 << 40
MAX_LOG_BACKLOG_BYTES = 1 << 30  # kept in memory per source while the manager is down
MAX_BACKOFF_FACTOR = 100.0  # backoff.py raises it to at most the 64th power: this stays a finite float
# The file itself: a config is a few KiB; more is a mistake (or /dev/zero) and is never read whole.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_TEXT = "1 MiB"
MAX_SHOWN_PATH = 300  # a longer config name is cut in errors, which stay one readable line
# Tables and arrays in each other: the deepest real key (phases[0].daemons[0].env.X) is 5 deep.
MAX_NESTING = 16
# What the kernel takes: one argv element or NAME=value (MAX_ARG_STRLEN less its NUL), a path (PATH_MAX
# less its NUL), one name in a path (NAME_MAX), and the status socket's path (sun_path less its NUL).
MAX_ARG_BYTES = 32 * 4096 - 1
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255
MAX_SOCKET_PATH_BYTES = 107

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# A plain decimal in ASCII: what float() would take, less "inf", "nan", exponents, "_" and non-ASCII digits.
_DECIMAL_RE = re.compile(r"[0-9]{1,15}(?:\.[0-9]{0,15})?")
_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A user mistake in the config: printed as one line, exit status 2."""


@dataclass(frozen=True)
class ReadyCheck:
    """How to tell that a child is ready: never a log line, always a real probe."""

    kind: str  # "tcp", "http", "file", "unix" (a stream socket accepts), or "any" of ``alternatives``
    target: str  # "host:port", the URL, or the path
    host: str = ""
    port: int = 0
    alternatives: tuple[ReadyCheck, ...] = ()  # kind "any": ready as soon as one of these is

    def describe(self) -> str:
        if self.kind == "any":
            return " or ".join(a.describe() for a in self.alternatives)
        return f"{self.kind}://{self.target}" if self.kind != "http" else self.target


# ``ready = "cuzk"``: the cuzk-daemon's own readiness, from the [cuzk] table (see cuzk_ready).
CUZK_READY = "cuzk"


@dataclass(frozen=True)
class ChildSpec:
    """One program to run: a phase's command or one of its daemons."""

    phase: str
    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    stop_signal: int
    stop_grace_s: float
    ready: ReadyCheck | None
    ready_timeout_s: float
    lifetime: str = "phase"  # daemons only: "phase" or "lifecycle"
    log_source: str = "setup"  # the manager dashboard tab its output is shipped under

    @property
    def label(self) -> str:
        return f"{self.phase}/{self.name}"


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    kind: str
    command: ChildSpec
    daemons: tuple[ChildSpec, ...]
    timeout_s: float | None
    retries: int
    restart: str
    backoff_s: float
    backoff_max_s: float
    backoff_factor: float
    backoff_jitter: float
    restart_burst: int
    restart_window_s: float
    backoff_reset_s: float
    stall_s: float | None = None
    progress_path: str | None = None
    min_memory: int | None = None
    memory_max: int | None = None
    report: str | None = None  # the manager call its success triggers
    parse: str | None = None  # read the command's output as this program's ("cuzk-bench")
    prepare: str | None = None  # before each attempt: "cuzk-config" writes cuzk.toml for this machine
    resume: str = "no"  # skip on restart: "outputs" still there, or done on this "machine" recently
    resume_max_age_s: float = DEFAULT_RESUME_MAX_AGE_S


@dataclass(frozen=True)
class ManagerSpec:
    """The fleet manager (manager-api.md). ``url`` None: reporting is off."""

    url: str | None = None
    label: str = ""
    min_rate: float = DEFAULT_MIN_RATE
    token_env: str | None = None
    events_url: str | None = None
    connect_timeout_s: float = DEFAULT_MANAGER_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_MANAGER_READ_TIMEOUT_S
    log_push_interval_s: float = DEFAULT_LOG_PUSH_INTERVAL_S
    log_backlog_bytes: int = DEFAULT_LOG_BACKLOG_BYTES
    bench_gate_s: float = DEFAULT_BENCH_GATE_S
    # A failure before production sends bench-done with rate 0: the manager destroys the instance now.
    give_up_on_failure: bool = True
    # Send the failure's reason in that bench-done (only for a manager that reads it).
    bench_done_reason: bool = False


@dataclass(frozen=True)
class SupervisorSpec:
    state_dir: str
    log_dir: str
    stop_grace_s: float
    ring_lines: int
    console: bool
    log_file_max_bytes: int
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cgroups: str = "auto"
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    http_port: int = 0  # health and metrics on 127.0.0.1; 0: off
    termination_log: str = DEFAULT_TERMINATION_LOG
    min_disk: int | None = None  # fitness: free bytes needed under state_dir
    min_param_disk: int | None = None  # fitness: free bytes needed under the parameter cache (less what is there)
    require_gpus: bool = False  # fitness: no usable GPU (NVML) means unfit


@dataclass(frozen=True)
class Plan:
    supervisor: SupervisorSpec
    phases: tuple[PhaseSpec, ...]
    source: str
    manager: ManagerSpec = field(default_factory=ManagerSpec)
    cuzk: CuzkSettings | None = None


# ---------------------------------------------------------------- loading


def load_plan(path: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Plan:
    """Read, expand and validate a config file; ``None`` means the built-in prover profile."""
    environ = os.environ if environ is None else environ
    if path is None:
        text = resources.files("supervisor").joinpath("prover/profile.toml").read_text()
        source = "built-in prover profile"
    else:
        source = _shown_path(path)
        text = read_config(path, source)
    return parse_plan(text, source, environ)


def read_config(path: str | os.PathLike[str], source: str) -> str:
    """The text of a config file: a regular file of at most MAX_CONFIG_BYTES of UTF-8, or one-line ConfigError.

    It is stat'ed before it is opened (a FIFO would block the open, a device may act on it), opened
    non-blocking all the same (the name may change in between), and read no further than the cap.
    """
    try:
        _check_config_file(os.stat(path), source)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ConfigError(f"{source}: cannot read: {_os_reason(exc)}") from None
    try:
        _check_config_file(os.fstat(fd), source)
        data = _read_at_most(fd, MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: cannot read: more than the {MAX_CONFIG_TEXT} a config may be")
    if not data.strip():
        raise ConfigError(f"{source}: the file is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})") from None


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_config_file(st: os.stat_result, source: str) -> None:
    """Only a regular file of sane size is read: a FIFO would hang, /dev/zero would never end."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "not a regular file")
        raise ConfigError(f"{source}: cannot read: {kind}, not a config file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: cannot read: {st.st_size} bytes, more than the {MAX_CONFIG_TEXT} a config "
                          "may be")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _os_reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _shown_path(path: str | os.PathLike[str]) -> str:
    """The config's name as errors show it: as given, or quoted when it holds a newline or odd bytes."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    shown = text if text and text.isprintable() else ascii(text)
    return shown if len(shown) <= MAX_SHOWN_PATH else shown[:MAX_SHOWN_PATH - 3] + "..."


def parse_plan(text: str, source: str, environ: Mapping[str, str]) -> Plan:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as exc:  # a number of more than 4300 digits: int() refuses it
        raise ConfigError(f"{source}: not valid TOML: {str(exc).split(';')[0]}") from None
    try:
        raw = _expand(raw, "", environ)
        return _plan(raw, source, environ)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:  # a safety net: _expand bounds the nesting before this can happen
        raise ConfigError(f"{source}: arrays or tables nested too deeply") from None


def _expand(value: Any, where: str, environ: Mapping[str, str], depth: int = 0) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in every string; ``$$`` is a literal ``$``.

    Every string is refused if it holds a NUL byte: none can be an argument, an environment value or a
    path (exec and open would fail at run time, long after ``check`` said ok).
    """
    if depth > MAX_NESTING:
        raise ConfigError(f"{_short(where)}: nested more than {MAX_NESTING} deep")
    if isinstance(value, str):
        expanded = _substitute(value, where, environ)
        if "\0" in expanded:
            raise ConfigError(f"{where}: contains a NUL character, which no argument, environment value or "
                              "path can hold")
        return expanded
    if isinstance(value, dict):
        return {_key(k, where): _expand(v, _join(where, k), environ, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", environ, depth + 1) for i, v in enumerate(value)]
    return value


def _key(key: str, where: str) -> str:
    if "\0" in key:
        raise ConfigError(f"{_join(where, key)}: a key with a NUL character")
    return key


def _short(where: str) -> str:
    return where if len(where) <= 80 else where[:77] + "..."


def _substitute(value: str, where: str, environ: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: ${{{name}}} is not set in the environment (give a default: ${{{name}:-…}})")

    # No ${VAR} ends after the last "}", so only "$$" is left to undo there. Cutting the text at it keeps this
    # linear: an unterminated "${X:-" would otherwise be scanned to the end again from every "$" before it.
    end = value.rfind("}") + 1
    return _VAR_RE.sub(one, value[:end]) + value[end:].replace("$$", "$")


def _join(where: str, key: str) -> str:
    # A key with odd characters (a newline, a space) is quoted so the error stays one line.
    shown = key if key.isprintable() and not any(c.isspace() for c in key) else repr(key)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{where}.{shown}" if where else shown


# ---------------------------------------------------------------- value checkers
# Each takes (value, where) and returns the converted value or raises ConfigError.

Checker = Callable[[Any, str], Any]


def _describe(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits cannot be shown
        return "a number with too many digits"
    return text if len(text) <= 60 else text[:57] + "..."


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a non-empty string, got {_describe(value)}")
    return value


def _arg(value: Any, where: str) -> str:
    """A string that becomes one argv element or environment value: the kernel's size limit applies."""
    text = _string(value, where)
    if _byte_length(text, where) > MAX_ARG_BYTES:
        raise ConfigError(f"{where}: longer than the {MAX_ARG_BYTES} bytes exec takes in one argument")
    return text


def _path(value: Any, where: str) -> str:
    """A filesystem path: within PATH_MAX, and no name in it longer than NAME_MAX (open would refuse)."""
    text = _string(value, where)
    if _byte_length(text, where) > MAX_PATH_BYTES:
        raise ConfigError(f"{where}: a path longer than {MAX_PATH_BYTES} bytes: {_describe(text)}")
    for part in text.split("/"):
        if _byte_length(part, where) > MAX_NAME_BYTES:
            raise ConfigError(f"{where}: {_describe(part)} is longer than the {MAX_NAME_BYTES} bytes a file "
                              "name may have")
    return text


def check_state_dir(value: Any, where: str) -> str:
    """state_dir holds the status socket, whose whole path the kernel limits to 107 bytes."""
    from .status import SOCKET_NAME  # here, not at the top: status may one day read the config

    text = _path(value, where)
    socket_path = os.path.join(text, SOCKET_NAME)
    if _byte_length(socket_path, where) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(f"{where}: too long for the status socket: {_describe(socket_path)} is more than "
                          f"{MAX_SOCKET_PATH_BYTES} bytes (a unix socket's limit)")
    return text


def _byte_length(text: str, where: str) -> int:
    try:
        return len(os.fsencode(text))
    except UnicodeEncodeError:
        raise ConfigError(f"{where}: {_describe(text)} cannot be encoded as a file name") from None


def _name(value: Any, where: str) -> str:
    value = _string(value, where)
    if not _NAME_RE.fullmatch(value):
        raise ConfigError(f"{where}: {_describe(value)} is not a valid name "
                          "(letters, digits, '_', '-', '.'; at most 63)")
    return value


def _command(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigError(f"{where}: must be a list of strings (argv), not one string: {_describe(value)}")
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a non-empty list of strings, got {_describe(value)}")
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise ConfigError(f"{where}[{i}]: must be a string, got {_describe(arg)}")
        if _byte_length(arg, f"{where}[{i}]") > MAX_ARG_BYTES:
            raise ConfigError(f"{where}[{i}]: longer than the {MAX_ARG_BYTES} bytes exec takes in one argument")
    if not value[0]:
        raise ConfigError(f"{where}[0]: the program name is empty")
    return tuple(value)


def _env(value: Any, where: str) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table of NAME = \"value\", got {_describe(value)}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"{_join(where, key)}: not a valid environment variable name")
        if isinstance(item, bool):
            out[key] = "1" if item else "0"
        elif isinstance(item, str | int | float):
            out[key] = str(item)
        else:
            raise ConfigError(f"{_join(where, key)}: must be a string or number, got {_describe(item)}")
        if _byte_length(f"{key}={out[key]}", _join(where, key)) > MAX_ARG_BYTES:
            raise ConfigError(f"{_join(where, key)}: longer than the {MAX_ARG_BYTES} bytes exec takes in one "
                              "environment variable")
    return MappingProxyType(out)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: must be a number, got {_describe(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        raise ConfigError(f"{where}: {_describe(value)} is too large") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"{where}: must be a finite number, got {number}")
    return number


def _seconds(value: Any, where: str) -> float:
    value = _number(value, where)
    if value < 0:
        raise ConfigError(f"{where}: must be >= 0 seconds, got {value:g}")
    return _at_most_max_seconds(value, where)


def _positive_seconds(value: Any, where: str) -> float:
    value = _number(value, where)
    if value <= 0:
        raise ConfigError(f"{where}: must be > 0 seconds, got {value:g}")
    return _at_most_max_seconds(value, where)


def _at_most_max_seconds(value: float, where: str) -> float:
    if value > MAX_SECONDS:
        raise ConfigError(f"{where}: must be at most {MAX_SECONDS_TEXT}, got {value:g}")
    return value


def _whole(minimum: int, maximum: int) -> Checker:
    """A whole number in [minimum, maximum]."""

    def check(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be a whole number, got {_describe(value)}")
        if value < minimum:
            raise ConfigError(f"{where}: must be >= {minimum}, got {_describe(value)}")
        if value > maximum:
            raise ConfigError(f"{where}: must be at most {maximum}, got {_describe(value)}")
        return value

    return check


_count = _whole(0, MAX_COUNT)
_positive_count = _whole(1, MAX_COUNT)


def _factor(value: Any, where: str) -> float:
    value = _number(value, where)
    if value < 1:
        raise ConfigError(f"{where}: must be >= 1, got {value:g}")
    if value > MAX_BACKOFF_FACTOR:
        raise ConfigError(f"{where}: must be at most {MAX_BACKOFF_FACTOR:g}, got {value:g}")
    return value


def _rate(value: Any, where: str) -> float:
    value = _number(value, where)
    if value < 0:
        raise ConfigError(f"{where}: must be >= 0 proofs/hour, got {value:g}")
    return value


def _fraction(value: Any, where: str) -> float:
    value = _number(value, where)
    if not 0 <= value <= 1:
        raise ConfigError(f"{where}: must be between 0 and 1, got {value:g}")
    return value


def _size(value: Any, where: str) -> int:
    """Bytes: a whole number, or a string with a unit ("128GiB", "512MiB", "64M")."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{where}: must be a size like \"128GiB\" or a number of bytes, got {_describe(value)}")
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if size <= 0:
        raise ConfigError(f"{where}: must be more than 0 bytes, got {_describe(value)}")
    return size


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, got {_describe(value)}")
    return value


def _choice(*options: str) -> Checker:
    def check(value: Any, where: str) -> str:
        if value not in options:
            listed = ", ".join(repr(o) for o in options)
            raise ConfigError(f"{where}: must be one of {listed}, got {_describe(value)}")
        return value

    return check


def parse_signal(value: Any, where: str = "signal") -> int:
    """``"SIGINT"``, ``"INT"`` or ``2`` → 2."""
    if isinstance(value, int) and not isinstance(value, bool):
        valid = {int(s) for s in signal.valid_signals()}
        if value in valid and value != 0:
            return value
        raise ConfigError(f"{where}: {value} is not a signal number")
    if isinstance(value, str):
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None) if not name.startswith("SIG_") else None
        if isinstance(sig, signal.Signals):
            return int(sig)
    raise ConfigError(f"{where}: {_describe(value)} is not a signal name (e.g. \"SIGTERM\", \"SIGINT\")")


def _ready(value: Any, where: str) -> ReadyCheck:
    text = _string(value, where)
    if text == CUZK_READY:
        return ReadyCheck(CUZK_READY, CUZK_READY)  # resolved against [cuzk] once it is read
    if text.startswith(("http://", "https://")):
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"{where}: {_describe(text)} is not a valid URL ({_short(str(exc))})") from None
        if not parts.hostname:
            raise ConfigError(f"{where}: {_describe(text)} has no host")
        if port == 0:
            raise ConfigError(f"{where}: {_describe(text)}: port 0 cannot be connected to")
        default_port = 443 if parts.scheme == "https" else 80
        return ReadyCheck("http", text, parts.hostname, default_port if port is None else port)
    if text.startswith("tcp://"):
        hostport = text[len("tcp://") :]
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not is_ascii_digits(port) or len(port) > 5 or not 0 < int(port) < 65536:
            raise ConfigError(f"{where}: {_describe(text)} must look like tcp://host:port")
        return ReadyCheck("tcp", hostport, host.strip("[]"), int(port))
    if text.startswith("file://"):
        path = text[len("file://") :]
        if not path.startswith("/"):
            raise ConfigError(f"{where}: {_describe(text)} must name an absolute path (file:///path)")
        return ReadyCheck("file", _path(path, where))
    if text.startswith("/"):
        return ReadyCheck("file", _path(text, where))
    raise ConfigError(f"{where}: {_describe(text)} must be tcp://host:port, http(s)://..., an absolute file path, "
                      f"or \"{CUZK_READY}\"")


def _resolve_cuzk_ready(phases: tuple[PhaseSpec, ...], cuzk: CuzkSettings | None) -> tuple[PhaseSpec, ...]:
    from .readiness import cuzk_ready  # readiness imports this module: resolved here, at load time

    def resolved(child: ChildSpec, where: str) -> ChildSpec:
        if child.ready is None or child.ready.kind != CUZK_READY:
            return child
        if cuzk is None:
            raise ConfigError(f"{where}.ready: \"{CUZK_READY}\" needs a [cuzk] table (it may be empty)")
        return replace(child, ready=cuzk_ready(cuzk))

    return tuple(replace(p, command=resolved(p.command, f"phases[{i}]"),
                         daemons=tuple(resolved(d, f"phases[{i}].daemons[{j}]") for j, d in enumerate(p.daemons)))
                 for i, p in enumerate(phases))


def _url(value: Any, where: str) -> str:
    text = _string(value, where)
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError as exc:
        raise ConfigError(f"{where}: {_describe(text)} is not a valid URL ({_short(str(exc))})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: {_describe(text)} must be an http:// or https:// URL with a host")
    return text.rstrip("/")


def _env_name(value: Any, where: str) -> str:
    text = _string(value, where)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        raise ConfigError(f"{where}: {_describe(text)} is not an environment variable name")
    return text


def _optional(check: Checker) -> Checker:
    return lambda value, where: None if value is None else check(value, where)


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class _Key:
    check: Checker
    default: Any = None
    required: bool = False


def _take(table: Any, where: str, keys: Mapping[str, _Key]) -> dict[str, Any]:
    """Check one TOML table against its keys: unknown keys are errors (typos must not pass)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {_describe(table)}")
    for key in table:
        if key not in keys:
            near = difflib.get_close_matches(key, list(keys), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{_join(where, key)}: unknown key{hint}")
    out: dict[str, Any] = {}
    for key, spec in keys.items():
        if key in table:
            out[key] = spec.check(table[key], _join(where, key))
        elif spec.required:
            raise ConfigError(f"{_join(where, key)}: required key is missing")
        else:
            out[key] = spec.default
    return out


_SUPERVISOR_KEYS = {
    "state_dir": _Key(check_state_dir, DEFAULT_STATE_DIR),
    "log_dir": _Key(_path, DEFAULT_LOG_DIR),
    "stop_grace_s": _Key(_seconds, DEFAULT_STOP_GRACE_S),
    "ring_lines": _Key(_whole(1, MAX_RING_LINES), DEFAULT_RING_LINES),
    "console": _Key(_bool, True),
    "log_file_max_bytes": _Key(_whole(0, MAX_LOG_FILE_MAX_BYTES), DEFAULT_LOG_FILE_MAX_BYTES),
    "env": _Key(_env, MappingProxyType({})),
    "cgroups": _Key(_choice(*CGROUP_MODES), "auto"),
    "cgroup_root": _Key(_path, DEFAULT_CGROUP_ROOT),
    "http_port": _Key(lambda v, w: _port(_int_text(v), w), 0),
    "termination_log": _Key(_path, DEFAULT_TERMINATION_LOG),
    "min_disk": _Key(_size),
    "min_param_disk": _Key(_size),
    "require_gpus": _Key(lambda v, w: _bool(_bool_text(v), w), False),
}


def _port(value: Any, where: str) -> int:
    value = _count(value, where)
    if value > 65535:
        raise ConfigError(f"{where}: {value} is not a TCP port (0 turns it off)")
    return value

_CHILD_KEYS = {
    "command": _Key(_command, required=True),
    "env": _Key(_env, MappingProxyType({})),
    "cwd": _Key(_path),
    "stop_signal": _Key(parse_signal, int(signal.SIGTERM)),
    "stop_grace_s": _Key(_seconds),
    "ready": _Key(_ready),
    "ready_timeout_s": _Key(_positive_seconds, DEFAULT_READY_TIMEOUT_S),
    "log_source": _Key(_name),
}

_DAEMON_KEYS = {
    "name": _Key(_name, required=True),
    **_CHILD_KEYS,
    "lifetime": _Key(_choice(*DAEMON_LIFETIMES), "phase"),
}

_PHASE_KEYS = {
    "name": _Key(_name, required=True),
    "kind": _Key(_choice(*PHASE_KINDS), "oneshot"),
    **_CHILD_KEYS,
    "daemons": _Key(lambda v, w: v, ()),
    "timeout_s": _Key(_optional(_positive_seconds)),
    "retries": _Key(_whole(0, MAX_RETRIES)),
    "restart": _Key(_choice(*RESTART_POLICIES)),
    "backoff_s": _Key(_seconds, DEFAULT_BACKOFF_S),
    "backoff_max_s": _Key(_seconds, DEFAULT_BACKOFF_MAX_S),
    "backoff_factor": _Key(_factor, DEFAULT_BACKOFF_FACTOR),
    "backoff_jitter": _Key(_fraction, DEFAULT_BACKOFF_JITTER),
    "restart_burst": _Key(_whole(1, MAX_RESTART_BURST), DEFAULT_RESTART_BURST),
    "restart_window_s": _Key(_positive_seconds, DEFAULT_RESTART_WINDOW_S),
    "backoff_reset_s": _Key(_seconds, DEFAULT_BACKOFF_RESET_S),
    "stall_s": _Key(_optional(_positive_seconds)),
    "progress_path": _Key(_path),
    "min_memory": _Key(_size),
    "memory_max": _Key(_size),
    "report": _Key(_choice(*REPORTS)),
    "parse": _Key(_choice(*PARSERS)),
    "prepare": _Key(_choice(*PREPARES)),
    "resume": _Key(_choice(*RESUMES), "no"),
    "resume_max_age_s": _Key(_positive_seconds, DEFAULT_RESUME_MAX_AGE_S),
}

_CUZK_KEYS = {
    "config_path": _Key(_path),
    "memory_model": _Key(_choice(*MEMORY_MODELS), "unified"),
    "listen": _Key(_arg, "http://127.0.0.1:9820"),
    # "" = the daemon serves no status API (ready is then its listen port alone).
    "status_listen": _Key(lambda v, w: "" if v == "" else _arg(v, w), "127.0.0.1:9821"),
    "param_cache": _Key(_path, "/var/tmp/filecoin-proof-parameters"),
    "safety_margin": _Key(_size, 5 << 30),
    "bench_concurrency": _Key(lambda v, w: _whole(1, MAX_BENCH_CONCURRENCY)(_int_text(v), w), 5),
    "baseline": _Key(_size, UNIFIED_BASELINE),
    "per_partition": _Key(_size, PER_PARTITION),
    "pw_baseline": _Key(_size, PW_BASELINE),
    "pw_per_worker": _Key(_size, PW_PER_WORKER),
    "overrides": _Key(lambda v, w: _overrides(v, w), None),
}

# [cuzk.overrides] values that cuzkconf.generate() reads to size the daemon (the rest is merged as given).
_OVERRIDE_TABLES = ("memory", "pipeline", "synthesis")
# More digits than any bound here has: such text stays text, and is refused as not a number.
_MAX_DIGITS = 30


def _int_text(value: Any) -> Any:
    """A whole number given as text (it came from ${VAR} expansion) counts as the number: ASCII digits only."""
    if isinstance(value, str) and is_ascii_digits(value.strip()) and len(value.strip()) <= _MAX_DIGITS:
        return int(value.strip())
    return value


def _overrides(value: Any, where: str) -> dict[str, Any]:
    """What generate() reads from the overrides is checked here, so that `check` refuses what `run` would."""
    table = _table(value, where)
    for name in _OVERRIDE_TABLES:
        if name in table:
            _table(table[name], _join(where, name))
    budget = table.get("memory", {}).get("total_budget")
    if budget is not None and budget != "auto":
        budget_where = _join(where, "memory.total_budget")
        if not isinstance(budget, str):
            raise ConfigError(f"{budget_where}: must be \"auto\" or a size like \"100GiB\", got {_describe(budget)}")
        _size(budget, budget_where)
    for name, key in (("pipeline", "synthesis_concurrency"), ("synthesis", "partition_workers")):
        workers = table.get(name, {}).get(key)
        if workers is not None:
            _whole(1, MAX_OVERRIDE_WORKERS)(workers, _join(where, f"{name}.{key}"))
    return table


def _bool_text(value: Any) -> Any:
    """true/false given as text (it came from ${VAR} expansion) counts as the boolean."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table, got {_describe(value)}")
    return value

_MANAGER_KEYS = {
    "url": _Key(_optional(_url)),
    "label": _Key(_string),
    "min_rate": _Key(_rate),
    "token_env": _Key(_env_name),
    "events_url": _Key(_optional(_url)),
    "connect_timeout_s": _Key(_positive_seconds, DEFAULT_MANAGER_CONNECT_TIMEOUT_S),
    "read_timeout_s": _Key(_positive_seconds, DEFAULT_MANAGER_READ_TIMEOUT_S),
    "log_push_interval_s": _Key(_positive_seconds, DEFAULT_LOG_PUSH_INTERVAL_S),
    "log_backlog_bytes": _Key(_whole(1, MAX_LOG_BACKLOG_BYTES), DEFAULT_LOG_BACKLOG_BYTES),
    "bench_gate_s": _Key(_seconds, DEFAULT_BENCH_GATE_S),
    "give_up_on_failure": _Key(_bool),
    "report_bench_failure": _Key(_bool),  # the old name of give_up_on_failure, still accepted
    "bench_done_reason": _Key(_bool, False),
}


def _plan(raw: dict[str, Any], source: str, environ: Mapping[str, str]) -> Plan:
    for key in raw:
        if key not in ("supervisor", "phases", "manager", "cuzk"):
            raise ConfigError(f"{_join('', key)}: unknown top-level key "
                              "(expected [supervisor], [manager], [cuzk], [[phases]])")
    sup = SupervisorSpec(**_take(raw.get("supervisor", {}), "supervisor", _SUPERVISOR_KEYS))
    manager = _manager(raw.get("manager", {}), environ)
    phases_raw = raw.get("phases")
    if phases_raw is None:
        raise ConfigError("phases: no [[phases]] defined: nothing to run")
    if not isinstance(phases_raw, list) or not phases_raw:
        raise ConfigError("phases: must be a non-empty array of tables ([[phases]])")
    phases = tuple(_phase(p, f"phases[{i}]", sup) for i, p in enumerate(phases_raw))
    _check_unique([p.name for p in phases], "phases", "phase name")
    reports = [p.report for p in phases if p.report is not None]
    for report in set(reports):
        if reports.count(report) > 1:
            raise ConfigError(f"phases: report = {report!r} is set on more than one phase")
    for i, phase in enumerate(phases):
        if phase.report == "running" and phase.kind != "service":
            raise ConfigError(f"phases[{i}].report: \"running\" is reported when a service is up; "
                              "this phase is a oneshot")
        if phase.report in ("param-done", "bench-done") and phase.kind != "oneshot":
            raise ConfigError(f"phases[{i}].report: {phase.report!r} is reported when a oneshot completes")
    cuzk = None
    if "cuzk" in raw:
        c = _take(raw["cuzk"], "cuzk", _CUZK_KEYS)
        c["config_path"] = c["config_path"] or str(Path(sup.state_dir) / "cuzk.toml")
        cuzk = CuzkSettings(**c)
    phases = _resolve_cuzk_ready(phases, cuzk)
    for i, phase in enumerate(phases):
        if phase.prepare == "cuzk-config" and cuzk is None:
            raise ConfigError(f"phases[{i}].prepare: \"cuzk-config\" needs a [cuzk] table (it may be empty)")
    return Plan(sup, phases, source, manager, cuzk)


def default_label(environ: Mapping[str, str]) -> str:
    """``$VAST_CONTAINERLABEL``, else ``C.$CONTAINER_ID``, else the hostname."""
    if environ.get("VAST_CONTAINERLABEL"):
        return environ["VAST_CONTAINERLABEL"]
    if environ.get("CONTAINER_ID"):
        return f"C.{environ['CONTAINER_ID']}"
    return socket.gethostname()


def _manager(table: Any, environ: Mapping[str, str]) -> ManagerSpec:
    v = _take(table, "manager", _MANAGER_KEYS)
    old_name = v.pop("report_bench_failure")
    if v["give_up_on_failure"] is None:
        v["give_up_on_failure"] = True if old_name is None else old_name
    elif old_name is not None and old_name != v["give_up_on_failure"]:
        raise ConfigError("manager.report_bench_failure: the old name of give_up_on_failure, set to the opposite "
                          "value; keep one of them")
    if environ.get("MANAGER_URL"):
        v["url"] = _url(environ["MANAGER_URL"], "MANAGER_URL (environment)")
    if v["token_env"] and not _header_safe(environ.get(v["token_env"], "")):
        # Never shown: it is a secret. An HTTP client would refuse it on the first call, in the middle of the run.
        raise ConfigError(f"manager.token_env: ${v['token_env']} holds characters an HTTP header cannot carry "
                          "(a newline, a control character or non-ASCII)")
    if v["label"] is None:
        v["label"] = default_label(environ)
    if v["min_rate"] is None:
        raw = environ.get("MIN_RATE")
        if not raw:
            v["min_rate"] = DEFAULT_MIN_RATE
        elif not _DECIMAL_RE.fullmatch(raw.strip()):
            raise ConfigError(f"MIN_RATE (environment): {_describe(raw)} is not a number of proofs/hour")
        else:
            v["min_rate"] = _rate(float(raw.strip()), "MIN_RATE (environment)")
    return ManagerSpec(**v)


def _header_safe(token: str) -> bool:
    return token.isascii() and token.isprintable()


def _child(values: dict[str, Any], phase: str, name: str, sup: SupervisorSpec, lifetime: str) -> ChildSpec:
    grace = values["stop_grace_s"]
    source = values["log_source"] or "setup"
    return ChildSpec(
        phase=phase,
        name=name,
        command=values["command"],
        env=MappingProxyType({**sup.env, **values["env"]}),
        cwd=values["cwd"],
        stop_signal=values["stop_signal"],
        stop_grace_s=sup.stop_grace_s if grace is None else grace,
        ready=values["ready"],
        ready_timeout_s=values["ready_timeout_s"],
        lifetime=lifetime,
        log_source=source,
    )


def _phase(table: Any, where: str, sup: SupervisorSpec) -> PhaseSpec:
    v = _take(table, where, _PHASE_KEYS)
    name, kind = v["name"], v["kind"]
    if kind == "oneshot":
        if v["restart"] is not None:
            raise ConfigError(f"{where}.restart: only for kind = \"service\" (a oneshot uses retries)")
        if v["ready"] is not None:
            raise ConfigError(f"{where}.ready: only for kind = \"service\" (a oneshot is done when it exits 0)")
    else:
        if v["retries"] is not None:
            raise ConfigError(f"{where}.retries: only for kind = \"oneshot\" (a service uses restart)")
        if v["timeout_s"] is not None:
            raise ConfigError(f"{where}.timeout_s: only for kind = \"oneshot\" (a service runs until stopped)")
    if v["resume"] == "outputs" and v["progress_path"] is None:
        raise ConfigError(f"{where}.resume: \"outputs\" needs progress_path (the outputs to find again)")
    if v["progress_path"] is not None and v["stall_s"] is None:
        raise ConfigError(f"{where}.progress_path: only meaningful with stall_s (how long no growth means stalled)")
    if v["backoff_max_s"] < v["backoff_s"]:
        raise ConfigError(f"{where}.backoff_max_s: {v['backoff_max_s']:g} is below backoff_s {v['backoff_s']:g}")
    daemons_raw = v["daemons"]
    if not isinstance(daemons_raw, list | tuple):
        raise ConfigError(f"{where}.daemons: must be an array of tables ([[phases.daemons]])")
    daemons = []
    for i, d in enumerate(daemons_raw):
        dwhere = f"{where}.daemons[{i}]"
        dv = _take(d, dwhere, _DAEMON_KEYS)
        if dv["name"] == name:
            raise ConfigError(f"{dwhere}.name: {name!r} is the phase's own name; give the daemon another")
        # A daemon sees the phase's environment too; its own keys win.
        dv["env"] = MappingProxyType({**v["env"], **dv["env"]})
        daemons.append(_child(dv, name, dv["name"], sup, dv["lifetime"]))
    _check_unique([d.name for d in daemons], f"{where}.daemons", "daemon name")
    return PhaseSpec(
        name=name,
        kind=kind,
        command=_child(v, name, name, sup, "phase"),
        daemons=tuple(daemons),
        timeout_s=v["timeout_s"],
        retries=v["retries"] or 0,
        restart=v["restart"] or "on-failure",
        backoff_s=v["backoff_s"],
        backoff_max_s=v["backoff_max_s"],
        backoff_factor=v["backoff_factor"],
        backoff_jitter=v["backoff_jitter"],
        restart_burst=v["restart_burst"],
        restart_window_s=v["restart_window_s"],
        backoff_reset_s=v["backoff_reset_s"],
        stall_s=v["stall_s"],
        progress_path=v["progress_path"],
        min_memory=v["min_memory"],
        memory_max=v["memory_max"],
        report=v["report"],
        parse=v["parse"],
        prepare=v["prepare"],
        resume=v["resume"],
        resume_max_age_s=v["resume_max_age_s"],
    )


def _check_unique(names: list[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{where}[{i}].name: duplicate {what} {name!r}")
        seen.add(name)
