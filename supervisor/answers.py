"""The manager's answers, checked like config before anything keeps or uses them.

What ``/register`` gives becomes ``INSTANCE_UUID`` and ``RUNNER_ID`` in every later child's
environment and a fact in the outbox: a dict, a CR LF, a NUL or 200 KB there would be stored,
exported, and make every later spawn fail. So a uuid is 1..UUID_MAX_CHARS characters of a safe
set (what a uuid, or the manager's own ids, look like), a runner_id a whole number within the
manager's integer, ``passed`` a bool. Each check is pure and raises ``AnswerError`` with one line
saying what was wrong; the sender makes that a transient failure (retried, never kept).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

UUID_MAX_CHARS = 128
# Letters, digits and the separators ids use: no whitespace, no control character, nothing a shell,
# an environment or a header would read differently.
UUID_RE = re.compile(rf"[A-Za-z0-9._:-]{{1,{UUID_MAX_CHARS}}}")
# The manager keeps runner ids in an SQLite integer column.
RUNNER_ID_MAX = 2**63 - 1
RUNNER_ID_MAX_DIGITS = len(str(RUNNER_ID_MAX))
SHOWN_CHARS = 60  # of a bad value, in the error line


class AnswerError(ValueError):
    """An answer the supervisor cannot use: one line saying what was wrong."""


@dataclass(frozen=True)
class Identity:
    """Who the manager says this instance is."""

    uuid: str
    runner_id: str | None  # digits, or None when the manager gave none


def shown(value: Any) -> str:
    """A bad value as an error line may quote it: repr, printable ASCII, cut."""
    try:
        text = ascii(value)
    except ValueError:  # an int of more than 4300 digits
        return "a number with too many digits"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def check_uuid(value: Any) -> str:
    if not isinstance(value, str):
        raise AnswerError(f"not a string: {shown(value)}")
    if len(value) > UUID_MAX_CHARS:
        raise AnswerError(f"{len(value)} characters, more than {UUID_MAX_CHARS}: {shown(value)}")
    if not UUID_RE.fullmatch(value):
        raise AnswerError(f"not 1..{UUID_MAX_CHARS} of letters, digits, '-', '_', '.', ':': {shown(value)}")
    return value


def check_runner_id(value: Any) -> str | None:
    """A whole number in 0..RUNNER_ID_MAX, or ASCII digits of one; None or absent: no runner id."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise AnswerError(f"runner_id is not a whole number: {shown(value)}")
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= RUNNER_ID_MAX_DIGITS):
            raise AnswerError(f"runner_id is not a whole number: {shown(value)}")
        value = int(value)
    if not 0 <= value <= RUNNER_ID_MAX:
        raise AnswerError(f"runner_id out of range 0..{RUNNER_ID_MAX}: {shown(value)}")
    return str(value)


def register_answer(body: Any) -> Identity:
    """``{"uuid": "...", "runner_id": 7}`` → Identity; anything else is an AnswerError."""
    if not isinstance(body, dict):
        raise AnswerError(f"unusable answer: not a JSON object: {shown(body)}")
    if "uuid" not in body:
        raise AnswerError(f"unusable answer: no uuid in {shown(body)}")
    try:
        uuid = check_uuid(body["uuid"])
    except AnswerError as exc:
        raise AnswerError(f"unusable uuid: {exc}") from None
    try:
        runner_id = check_runner_id(body.get("runner_id"))
    except AnswerError as exc:
        raise AnswerError(f"unusable {exc}") from None
    return Identity(uuid, runner_id)


def bench_answer(body: Any) -> bool:
    """``/bench-done``'s ``{"ok": true, "passed": true}`` → passed; it must be a JSON boolean."""
    if not isinstance(body, dict) or not isinstance(body.get("passed"), bool):
        raise AnswerError(f"without a boolean 'passed': {shown(body)}")
    return body["passed"]
