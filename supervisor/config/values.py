"""Value checkers: each takes ``(value, where)`` and returns the converted value or raises ConfigError.

``where`` is the key's place in the file (``phases[1] (bench).daemons[0] (cuzk).ready``), so every refusal is one
line that names it. The bounds below keep every number sane, so that nothing later overflows or
waits forever, and every string within what the kernel takes.

The public ones (``check_path``, ``check_size``, ``one_of``, ``whole_number``, ``join_key``...)
are what a plugin declares its own keys with, so its refusals read like the core's; ``_*`` are the core's.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import signal
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import SplitResult, urlsplit

from ..state.files import STATUS_SOCKET, child_log_name, own_file
from ..text.redact import looks_secret
from ..text.show import cut, fmt_bytes, shown
from ..text.units import MIB, is_ascii_digits, parse_size, plain_decimal
from .model import ConfigError, Plan, ReadyCheck

# Timers: select() takes at most 2**31 - 1 ms (24.86 days), and a backoff with full jitter doubles its delay;
# 10 days keeps every timer inside that, and no real timeout, grace, window or age is longer.
MAX_SECONDS = 10 * 86400.0
MAX_SECONDS_TEXT = "864000 seconds (10 days)"
# A place in the config or a library's reason, quoted inside an error line, is cut to this many characters.
ASIDE_CHARS = 80
MAX_COUNT = 1_000_000  # a whole number without a bound of its own
MAX_RING_LINES = 100_000  # kept in memory per child
MAX_RETRIES = 1_000
MAX_RESTART_BURST = 1_000
MAX_LOG_FILE_MAX_BYTES = 1 << 40
MAX_LOG_BACKLOG_BYTES = 1 << 30  # kept in memory per source while the manager is down
# memory_max: a cgroup limit below this OOM-kills the phase as it starts (an interpreter alone needs more); a bare
# number is bytes, and "memory_max = 1" was meant as 1GiB.
MIN_MEMORY_MAX = 4 * MIB
MIN_MEMORY_MAX_TEXT = "4MiB"
MAX_BACKOFF_FACTOR = 100.0  # states.backoff_delay raises it to at most the 64th power: this stays a finite float
# What the kernel takes: one argv element or NAME=value (MAX_ARG_STRLEN less its NUL), a path (PATH_MAX
# less its NUL), one name in a path (NAME_MAX), and the status socket's path (sun_path less its NUL).
MAX_ARG_BYTES = 32 * 4096 - 1
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255
MAX_SOCKET_PATH_BYTES = 107
# More digits than any bound here has: such text stays text, and is refused as not a number.
_MAX_DIGITS = 30
# A whole float below this is shown as the integer it is (exact in a double); above, as its repr (1e+300).
_WHOLE_FLOAT_SHOWN = 1e16

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# A host connected to by name (an address is read by ipaddress): what DNS and /etc/hosts names are made of, each
# label 1 to 63 characters, 253 in all (a final dot aside). "h..", or a label of 64, is refused by every connect.
_HOST_LABEL_RE = re.compile(r"[A-Za-z0-9_-]{1,63}")
_HOST_NAME_MAX = 253
_PORT_DIGITS = 5  # 65535: more digits ("00000080") is no port anyone wrote
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The variables the supervisor puts in every child's environment itself: the tag and the state_dir by which its
# trees, and what a killed supervisor left running, are found (engine/trees.py), and the memory budget
# (lifecycle/hooks.py). A config's env that set one would blind that, silently.
_OWN_ENV_PREFIX = "PROVER_SUPERVISOR_"
_OWN_ENV = frozenset({"SUPERVISOR_MEMORY_AVAILABLE_BYTES"})

Checker = Callable[[Any, str], Any]


# ---------------------------------------------------------------- saying where and what


def join_key(where: str, key: str) -> str:
    # A key with odd characters (a newline, a space) is quoted so the error stays one line.
    named = shown(key, bare=True)
    return f"{where}.{named}" if where else named


def named(where: str, table: Any) -> str:
    """An array's table as errors name it: ``phases[1]`` → ``phases[1] (bench)`` when it has a valid name (one
    that is not valid is itself the error, at the plain place)."""
    name = table.get("name") if isinstance(table, dict) else None
    return f"{where} ({name})" if isinstance(name, str) and _NAME_RE.fullmatch(name) else where


# ---------------------------------------------------------------- strings, paths, argv


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a non-empty string, got {shown(value)}")
    return value


def check_arg(value: Any, where: str) -> str:
    """A string that becomes one argv element or environment value: the kernel's size limit applies."""
    text = _string(value, where)
    if _byte_length(text, where) > MAX_ARG_BYTES:
        raise ConfigError(f"{where}: longer than the {MAX_ARG_BYTES} bytes exec takes in one argument")
    return text


def check_path(value: Any, where: str) -> str:
    """A filesystem path: within PATH_MAX, and no name in it longer than NAME_MAX (open would refuse)."""
    text = _string(value, where)
    if _byte_length(text, where) > MAX_PATH_BYTES:
        raise ConfigError(f"{where}: a path longer than {MAX_PATH_BYTES} bytes: {shown(text)}")
    for part in text.split("/"):
        if _byte_length(part, where) > MAX_NAME_BYTES:
            raise ConfigError(f"{where}: {shown(part)} is longer than the {MAX_NAME_BYTES} bytes a file "
                              "name may have")
    return text


def absolute_path(why: str) -> Checker:
    """A path the supervisor, or a program it hands it to, reads: absolute, as a relative one would be resolved
    against a working directory the file does not know (the image's WORKDIR, a child's own ``cwd``, a shell's);
    ``why`` says who reads it, for the refusal."""

    def check(value: Any, where: str) -> str:
        text = check_path(value, where)
        if not os.path.isabs(text):
            raise ConfigError(f"{where}: {shown(text)} is not an absolute path ({why})")
        return text

    return check


def check_file_to_write(path: str, where: str, what: str) -> str:
    """``path``, where ``what`` is written as a file: not an existing directory or other file that is not a regular
    one (a FIFO, a device, a socket: written over, /dev/null would be replaced, a FIFO would hang the write), and
    not under a file (its nearest existing parent is a directory), found now rather than when the write fails,
    maybe hours into the run. What cannot be looked at (no permission) is left to the write."""
    if os.path.isdir(path):
        raise ConfigError(f"{where}: {shown(path)} is a directory; give the path of {what}, a file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ConfigError(f"{where}: {shown(path)} is not a regular file (a device, a FIFO or a socket); give "
                          f"{what} a path of its own")
    _refuse_under_a_file(path, where)
    return path


def check_dir_to_make(path: str, where: str) -> str:
    """``path``, a directory the supervisor makes at start (state_dir, log_dir): not an existing file, nor a
    symbolic link to nothing (mkdir cannot make its target), nor under either, found by ``check`` rather than by a
    start that had made the other directory already. The start looks again with this, just before it makes them."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{where}: {shown(path)} is {_no_directory(path)}")
    _refuse_under_a_file(path, where)
    return path


def _refuse_under_a_file(path: str, where: str) -> None:
    """Its nearest existing parent is a directory (what cannot be looked at is left to the write)."""
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent) and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if parent and os.path.lexists(parent) and not os.path.isdir(parent):
        raise ConfigError(f"{where}: {shown(path)} is under {shown(parent)}, which is {_no_directory(parent)}")


def _no_directory(path: str) -> str:
    """What ``path``, there but no directory, is instead, for a refusal."""
    if os.path.islink(path) and not os.path.exists(path):
        try:
            return f"a symbolic link to {shown(os.readlink(path))}, which does not exist"
        except OSError:
            return "a symbolic link to nothing"
    return "a file, not a directory"


def check_not_owned(path: str, where: str, what: str, plan: Plan) -> None:
    """``path``, where the supervisor (or a program it runs) writes ``what``, is none of the files it keeps
    (state_dir's, its supervisor.log, each child's log: state_files.own_file) nor the config file it runs from:
    written over, the lock would let a second supervisor in, the outbox would lose its calls, a child's log the
    output that tells why it failed, the config would hold a verdict line."""
    sup = plan.supervisor
    logs = {child_log_name(phase.name, child.name): child.label
            for phase in plan.phases for child in (phase.command, *phase.daemons)}
    own = own_file(sup.state_dir, sup.log_dir, path, logs)
    if own is not None and own in logs:
        raise ConfigError(f"{where}: {shown(path)} is the log file of {logs[own]}; give {what} a path of its own")
    if own is not None:
        raise ConfigError(f"{where}: {shown(path)} is the supervisor's own {own}; give {what} a path of its own")
    if plan.config_file is not None and os.path.exists(path) and _same_file(path, plan.config_file):
        raise ConfigError(f"{where}: {shown(path)} is the config file itself; give {what} a path of its own")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_state_dir(value: Any, where: str) -> str:
    """state_dir holds the status socket, whose whole path the kernel limits to 107 bytes; it is absolute, as the
    pointer to it is read from anywhere (a bare ``status``, the next start's sweep of what a dead run left)."""
    text = check_path(value, where)
    if not os.path.isabs(text):
        raise ConfigError(f"{where}: {shown(text)} is not an absolute path (status finds the supervisor by it from "
                          "any directory)")
    socket_path = os.path.join(text, STATUS_SOCKET)
    if _byte_length(socket_path, where) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(f"{where}: too long for the status socket: {shown(socket_path)} is more than "
                          f"{MAX_SOCKET_PATH_BYTES} bytes (a unix socket's limit)")
    return check_dir_to_make(text, where)


def _byte_length(text: str, where: str) -> int:
    try:
        return len(os.fsencode(text))
    except UnicodeEncodeError:
        raise ConfigError(f"{where}: {shown(text)} cannot be encoded as a file name") from None


def _name(value: Any, where: str) -> str:
    value = _string(value, where)
    if not _NAME_RE.fullmatch(value):
        raise ConfigError(f"{where}: {shown(value)} is not a valid name "
                          "(letters, digits, '_', '-', '.'; at most 63)")
    return value


def _command(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigError(f"{where}: must be a list of strings (argv), not one string: {shown(value)}")
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a non-empty list of strings, got {shown(value)}")
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise ConfigError(f"{where}[{i}]: must be a string, got {shown(arg)}")
        if _byte_length(arg, f"{where}[{i}]") > MAX_ARG_BYTES:
            raise ConfigError(f"{where}[{i}]: longer than the {MAX_ARG_BYTES} bytes exec takes in one argument")
    if not value[0]:
        raise ConfigError(f"{where}[0]: the program name is empty")
    return tuple(value)


def _env(value: Any, where: str) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table of NAME = \"value\", got {shown(value)}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not _ENV_NAME_RE.fullmatch(key):
            raise ConfigError(f"{join_key(where, key)}: not a valid environment variable name")
        if key.startswith(_OWN_ENV_PREFIX) or key in _OWN_ENV:
            raise ConfigError(f"{join_key(where, key)}: the supervisor sets this variable itself, for every child")
        if isinstance(item, bool):
            out[key] = "1" if item else "0"
        elif isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(f"{join_key(where, key)}: must be a string or a finite number, got {_quoted(key, item)}")
        elif isinstance(item, str | int | float):
            out[key] = plain_decimal(item) if isinstance(item, float) else str(item)
        else:
            raise ConfigError(f"{join_key(where, key)}: must be a string or number, got {_quoted(key, item)}")
        if _byte_length(f"{key}={out[key]}", join_key(where, key)) > MAX_ARG_BYTES:
            raise ConfigError(f"{join_key(where, key)}: longer than the {MAX_ARG_BYTES} bytes exec takes in one "
                              "environment variable")
    return MappingProxyType(out)


def _quoted(key: str, item: Any) -> str:
    """A refused env value as its error quotes it; under a secret-looking name (redact), its kind alone."""
    kind = {dict: "a table", list: "an array", float: "a number"}.get(type(item), "a date or time")
    return f"{kind} (not shown: the name looks secret)" if looks_secret(key) else shown(item)


def _env_name(value: Any, where: str) -> str:
    text = _string(value, where)
    if not _ENV_NAME_RE.fullmatch(text):
        raise ConfigError(f"{where}: {shown(text)} is not an environment variable name")
    return text


# ---------------------------------------------------------------- numbers


class EnvText(str):
    """Text a ``${VAR}`` gave whole (``retries = "${RETRIES:-2}"``): the environment holds only text, so where a
    number or a boolean belongs, text that spells one counts as it. Text written in the file stays text: a
    quoted number there is refused (``"30"``: write it without quotes)."""


def check_number(value: Any, where: str) -> float:
    if isinstance(value, EnvText):
        value = _number_text(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: must be a number, got {shown(value)}{_unquote_hint(value, _number_text)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        raise ConfigError(f"{where}: {shown(value)} is too large") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"{where}: must be a finite number, got {number}")
    return number


def written(value: Any) -> str:
    """A number as the file (or the environment) wrote it: ``600000000`` stays so (``:g`` would say ``6e+08``), a
    whole float too (``6e8`` and ``600000000.0`` read the same to TOML), another float is its repr, text from
    ``${VAR}`` its own text."""
    if isinstance(value, str):
        return value.strip() if len(value.strip()) <= 60 else shown(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < _WHOLE_FLOAT_SHOWN:
        return str(int(value))
    return shown(value)


def check_seconds(value: Any, where: str) -> float:
    number = check_number(value, where)
    if number < 0:
        raise ConfigError(f"{where}: must be >= 0 seconds, got {written(value)}")
    return _at_most_max_seconds(number, value, where)


def _positive_seconds(value: Any, where: str) -> float:
    number = check_number(value, where)
    if number <= 0:
        raise ConfigError(f"{where}: must be > 0 seconds, got {written(value)}")
    return _at_most_max_seconds(number, value, where)


def _at_most_max_seconds(number: float, value: Any, where: str) -> float:
    if number > MAX_SECONDS:
        raise ConfigError(f"{where}: must be at most {MAX_SECONDS_TEXT}, got {written(value)}")
    return number


def whole_number(minimum: int, maximum: int) -> Checker:
    """A whole number in [minimum, maximum]."""

    def check(value: Any, where: str) -> int:
        if isinstance(value, EnvText):
            value = _int_text(value)
        if isinstance(value, float):  # (1e3 and 2.0 are whole, but TOML reads them as floats)
            raise ConfigError(f"{where}: must be a whole number written as one (no point, no exponent), "
                              f"got {shown(value)}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be a whole number, got {shown(value)}"
                              f"{_unquote_hint(value, _number_text)}")
        if value < minimum:
            raise ConfigError(f"{where}: must be >= {minimum}, got {shown(value)}")
        if value > maximum:
            raise ConfigError(f"{where}: must be at most {maximum}, got {shown(value)}")
        return value

    return check


_tcp_port = whole_number(0, 65535)


def _port(value: Any, where: str) -> int:
    """A TCP port to listen on, 0 (off) to 65535, in one check (a huge one was held to any count's bound first:
    "must be at most 1000000")."""
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= 65535:
        raise ConfigError(f"{where}: {shown(value)} is not a TCP port (0 to 65535; 0 turns it off)")
    return _tcp_port(value, where)


def _factor(value: Any, where: str) -> float:
    number = check_number(value, where)
    if number < 1:
        raise ConfigError(f"{where}: must be >= 1, got {written(value)}")
    if number > MAX_BACKOFF_FACTOR:
        raise ConfigError(f"{where}: must be at most {MAX_BACKOFF_FACTOR:g}, got {written(value)}")
    return number


def _fraction(value: Any, where: str) -> float:
    number = check_number(value, where)
    if not 0 <= number <= 1:
        raise ConfigError(f"{where}: must be between 0 and 1, got {written(value)}")
    return number


def check_size(value: Any, where: str) -> int:
    """Bytes: a whole number, or a string with a unit ("128GiB", "512MiB", "64M")."""
    size = _size(value, where)
    if size <= 0:
        raise ConfigError(f"{where}: must be more than 0 bytes, got {shown(value)}")
    return size


def bounded_size(minimum: int, maximum: int) -> Checker:
    """A size as ``check_size`` reads it, from ``minimum`` (0: 0 too, where it means off) to ``maximum`` bytes."""

    def check(value: Any, where: str) -> int:
        size = _size(value, where)
        if size < minimum:
            raise ConfigError(f"{where}: must be at least {minimum} bytes, got {shown(value)}")
        if size > maximum:
            raise ConfigError(f"{where}: must be at most {fmt_bytes(maximum)} ({maximum} bytes), got {shown(value)}")
        return size

    return check


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{where}: must be a size like \"128GiB\" or a number of bytes, got {shown(value)}")
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_memory_max(value: Any, where: str) -> int:
    """``memory_max``: a size of at least MIN_MEMORY_MAX (``min_memory``, a floor the preflight checks, takes any:
    a small one only always passes)."""
    size = check_size(value, where)
    if size < MIN_MEMORY_MAX:
        bare = isinstance(value, int) or is_ascii_digits(value.strip())
        why = (f"a bare number is bytes: did you mean \"{value.strip() if isinstance(value, str) else value}GiB\"?"
               if bare else "a smaller limit OOM-kills the phase as it starts")
        raise ConfigError(f"{where}: must be at least {MIN_MEMORY_MAX_TEXT} ({why}), got {shown(value)}")
    return size


def _int_text(value: Any) -> Any:
    """A whole number given as text (from ${VAR} expansion) counts as the number: ASCII digits, a sign allowed
    (so that "-1" is refused as below a bound, not as no number)."""
    if isinstance(value, str):
        text = value.strip()
        digits = text.removeprefix("-")
        if is_ascii_digits(digits) and len(digits) <= _MAX_DIGITS:
            return int(text)
    return value


def _number_text(value: Any) -> Any:
    """A plain decimal given as text (from ${VAR} expansion: "0.9", "60", "-1", "7.") counts as the number."""
    if isinstance(value, str) and _DECIMAL_TEXT_RE.fullmatch(value.strip()):
        return float(value.strip())
    return value


# The one grammar of a number spelt in text (``${VAR}``, or an environment variable a plugin reads itself): a
# plain decimal in ASCII, what float() takes less "inf", "nan", exponents, "_", "+", a bare ".5" and other digits
# than 0-9; a "-" (so that "-1" is refused by the key's bound, not as no number); "7." is 7.
_DECIMAL_TEXT_RE = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{0,15})?")


def spelled(value: Any) -> Any:
    """What a value is where no key says what belongs (a table merged as given, [cuzk] overrides): text from
    ${VAR} that spells a whole number, a decimal or true/false is that; anything else is itself, within lists
    and tables too."""
    if isinstance(value, EnvText):
        for read in (_int_text, _number_text, _bool_text):
            typed = read(value)
            if not isinstance(typed, str):
                return typed
        return str(value)
    if isinstance(value, dict):
        return {key: spelled(item) for key, item in value.items()}
    if isinstance(value, list):
        return [spelled(item) for item in value]
    return value


def _unquote_hint(value: Any, read: Callable[[Any], Any]) -> str:
    """What a refused number or boolean says when it is text written in the file that ``read`` (``_number_text``,
    ``_bool_text``) takes for one."""
    written_text = isinstance(value, str) and not isinstance(value, EnvText)
    return " (text: write it without quotes)" if written_text and not isinstance(read(value), str) else ""


def check_warn_fraction(value: Any, where: str) -> float:
    """``memory_warn``: the fraction of the memory limit whose crossing is warned (0: never)."""
    return _fraction(value, where)


# ---------------------------------------------------------------- booleans, choices, tables


# ``stop_budget_s``: under 2 s the children get no grace and the exit no flush (the top is every seconds key's).
MIN_STOP_BUDGET_S = 2.0


def check_stop_budget(value: Any, where: str) -> float:
    """``stop_budget_s``: the whole stop after a stop signal from outside, in seconds (stopbudget.py)."""
    number = check_seconds(value, where)
    if number < MIN_STOP_BUDGET_S:
        raise ConfigError(f"{where}: must be at least {MIN_STOP_BUDGET_S:g} seconds "
                          f"(docker stop waits 10 s by default: 8 fits), got {written(value)}")
    return number


def check_bool(value: Any, where: str) -> bool:
    if isinstance(value, EnvText):
        value = _bool_text(value)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, got {shown(value)}{_unquote_hint(value, _bool_text)}")
    return value


def _bool_text(value: Any) -> Any:
    """true/false given as text (it came from ${VAR} expansion) counts as the boolean."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def one_of(*options: str) -> Checker:
    """One of ``options`` (none at all: a kind only a plugin registers, and none is plugged in)."""

    def check(value: Any, where: str) -> str:
        if value not in options:
            listed = ", ".join(repr(o) for o in options) or "none (no plugin registers any)"
            raise ConfigError(f"{where}: must be one of {listed}, got {shown(value)}")
        return value

    return check


def check_table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table, got {shown(value)}")
    return value


def _optional(check: Checker) -> Checker:
    return lambda value, where: None if value is None else check(value, where)


# ---------------------------------------------------------------- signals, probes, URLs


def parse_signal(value: Any, where: str = "signal") -> int:
    """``"SIGINT"``, ``"INT"`` or ``2`` → 2 (``"2"`` from ${VAR} too)."""
    if isinstance(value, EnvText):
        value = _int_text(value)
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
    raise ConfigError(f"{where}: {shown(value)} is not a signal name (e.g. \"SIGTERM\", \"SIGINT\")")


def check_stop_signal(value: Any, where: str) -> int:
    """``stop_signal``: a signal that asks a child to stop. SIGSTOP cannot: no process can catch it, it only
    freezes the child, which then sits out its whole grace before SIGKILL (SIGKILL itself is a stop, abrupt)."""
    signum = parse_signal(value, where)
    if signum == signal.SIGSTOP:
        raise ConfigError(f"{where}: SIGSTOP stops nothing: it freezes the child (no process can catch it) for its "
                          "whole grace, then SIGKILL; use \"SIGTERM\" (the default) or the signal it stops on")
    return signum


def ready_checker(kinds: Mapping[str, Callable[[str], ReadyCheck]] = MappingProxyType({})) -> Checker:
    """``ready``: a probe's URL or path, or a kind a plugin registered (``kinds``: its name → the probe it makes,
    given where the key is)."""

    def check(value: Any, where: str) -> ReadyCheck:
        text = _string(value, where)
        if text in kinds:
            return kinds[text](where)
        return _probe(text, where, kinds)

    return check


def refuse_url_characters(text: str, where: str, quoted: str) -> None:
    """A URL the supervisor calls holds only printable ASCII, no whitespace or backslash: anything else fails
    every call at run time (http.client refuses it) and is better refused now. ``quoted``: the URL as the error
    shows it."""
    bad = next((c for c in text if not (c.isascii() and c.isprintable()) or c.isspace() or c == "\\"), None)
    if bad is not None:
        raise ConfigError(f"{where}: {quoted} holds {bad!a}: a URL may hold only printable ASCII, no "
                          "whitespace or backslash (percent-encode it)")


def host_port(text: str, refusal: str) -> tuple[str, int]:
    """The host and port of ``host:port`` or ``scheme://host:port`` (an IPv6 host in brackets, ``[::1]:80``), as
    a connect takes them: a ``ready = "tcp://..."`` probe, [cuzk] listen. ConfigError ``refusal`` (the caller's
    words, naming the key) for anything else: no host, or one that is neither a name nor an address ("a b",
    "ho/st"); no port 1-65535 (in at most 5 ASCII digits); a user, a path, a query or a fragment, which no
    connect reads."""
    try:
        parts = urlsplit(text if "://" in text else f"tcp://{text}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port out of range or no number ("²" too), a bad [IPv6]
        raise ConfigError(refusal) from None
    if not host or not port or _port_too_long(parts) or "@" in parts.netloc \
            or parts.path not in ("", "/") or "?" in text or "#" in text:
        raise ConfigError(refusal)
    if not is_host(host):
        raise ConfigError(refusal)
    return host, port


def check_url_port(parts: SplitResult, where: str, quoted: str) -> None:
    """An http(s) URL's port, where it names one (``parts``: urllib's reading, its port already read, so in range):
    not 0, and in at most 5 digits, as ``host_port`` takes one: the manager's URL and a ready URL had taken
    "00000080" (urllib reads it as 80), which a ``tcp://`` probe refused."""
    if parts.port == 0:
        raise ConfigError(f"{where}: {quoted}: port 0 cannot be connected to")
    if _port_too_long(parts):
        raise ConfigError(f"{where}: {quoted}: the port has more than {_PORT_DIGITS} digits (a port is 1-65535)")


def _port_too_long(parts: SplitResult) -> bool:
    """Whether the port ``parts`` names is written in more than _PORT_DIGITS digits (its text ends the netloc)."""
    return parts.port is not None and len(parts.netloc.rpartition(":")[2]) > _PORT_DIGITS


def check_host(host: str, where: str, quoted: str) -> None:
    """A URL's host (``quoted``: the URL as the error shows it) that no connect could ever reach is refused now."""
    if not is_host(host):
        raise ConfigError(f"{where}: {quoted}: {shown(host)} is no host name (labels of 1 to 63 letters, digits, "
                          "'-' or '_', 253 characters in all) nor an IP address: every connect would fail")


def is_host(host: str) -> bool:
    """A name DNS or /etc/hosts could hold (labels of 1 to 63 characters, 253 in all), or an IP address."""
    name = host.removesuffix(".")
    if len(name) <= _HOST_NAME_MAX and all(_HOST_LABEL_RE.fullmatch(label) for label in name.split(".")):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def local_endpoint(host: str, port: int) -> tuple[str, int] | None:
    """``host:port`` if it is this machine's for sure (a loopback address, "localhost", every address), else None:
    a probe of a name or of another address may reach another machine."""
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        return None
    return (str(address), port) if address.is_loopback or address.is_unspecified else None


def endpoints_meet(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Two (host, port) that two listeners on this machine cannot both bind: one port, and one address, or one
    that covers the other ("::" every address, IPv4's too as Linux binds it by default; "0.0.0.0" every IPv4
    address, or a name, which may be one). "localhost" is 127.0.0.1."""
    if a[1] != b[1]:
        return False
    hosts = [("127.0.0.1" if host == "localhost" else host.strip("[]")) for host in (a[0], b[0])]
    if hosts[0] == hosts[1]:
        return True
    return any(host == "::" or (host == "0.0.0.0" and ":" not in other)
               for host, other in (hosts, hosts[::-1]))


def http_url(text: str, where: str) -> tuple[str, int]:
    """An http(s) URL the supervisor GETs (a ready probe, the production watch's curio metrics): its host and port
    (80 or 443 where it says none); ConfigError at ``where`` for another scheme, no host, port 0, or a character
    http.client refuses."""
    if not text.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: {shown(text)} must be an http:// or https:// URL with a host")
    refuse_url_characters(text, where, shown(text))
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{where}: {shown(text)} is not a valid URL ({cut(str(exc), ASIDE_CHARS)})") from None
    if parts.username is not None or parts.password is not None:  # (the URL is not shown: it holds the password)
        raise ConfigError(f"{where}: the URL carries a user or password (user:password@), which no probe sends and "
                          "the log would show: leave it out")
    if not parts.hostname:
        raise ConfigError(f"{where}: {shown(text)} has no host")
    check_host(parts.hostname, where, shown(text))
    check_url_port(parts, where, shown(text))
    return parts.hostname, (443 if parts.scheme == "https" else 80) if port is None else port


def _probe(text: str, where: str, kinds: Mapping[str, object]) -> ReadyCheck:
    if text.startswith(("http://", "https://")):
        return ReadyCheck("http", text, *http_url(text, where))
    if text.startswith("tcp://"):
        host, port = host_port(text, f"{where}: {shown(text)} must look like tcp://host:port")
        return ReadyCheck("tcp", text[len("tcp://") :], host, port)
    if text.startswith("file://"):
        path = text[len("file://") :]
        if not path.startswith("/"):
            raise ConfigError(f"{where}: {shown(text)} must name an absolute path (file:///path)")
        return ReadyCheck("file", check_path(path, where))
    if text.startswith("/"):
        return ReadyCheck("file", check_path(text, where))
    added = "".join(f', or "{kind}"' for kind in kinds)
    raise ConfigError(f"{where}: {shown(text)} must be tcp://host:port, http(s)://..., "
                      f"{'an' if added else 'or an'} absolute file path{added}")
