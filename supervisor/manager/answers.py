"""The manager's answers, checked like config before anything keeps or uses them.

What ``/register`` gives becomes ``INSTANCE_UUID`` in every later child's environment and a fact in
the outbox: a dict, a CR LF, a NUL or 200 KB there would be stored, exported, and make every later
spawn fail. So a uuid is 1..UUID_MAX_CHARS characters of a safe set (what a uuid, or the manager's
own ids, look like). A plugin checks the fields it adds to the answer (the prover's ``runner_id``)
with checks of its own, run here beside the uuid's. Each check is pure and raises ``AnswerError``
with one line saying what was wrong; the sender makes that a transient failure (retried, never kept).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..text.show import shown

UUID_MAX_CHARS = 128
# Letters, digits and the separators ids use: no whitespace, no control character, nothing a shell,
# an environment or a header would read differently.
UUID_RE = re.compile(rf"[A-Za-z0-9._:-]{{1,{UUID_MAX_CHARS}}}")

# A field's check: the value to keep (None: none given), or AnswerError naming the field.
FieldCheck = Callable[[Any], "str | None"]


class AnswerError(ValueError):
    """An answer the supervisor cannot use: one line saying what was wrong."""


@dataclass(frozen=True)
class Identity:
    """Who the manager says this instance is: its uuid, and the fields a plugin checks beside it."""

    uuid: str
    fields: Mapping[str, str | None] = field(default_factory=dict)


def answered(value: Any) -> str:
    """A value the manager answered, as our lines quote it: in ASCII (text/show.py), so nothing a peer sends
    can pass for something else in a line of ours."""
    return shown(value, ascii_only=True)


def check_uuid(value: Any) -> str:
    if not isinstance(value, str):
        raise AnswerError(f"not a string: {answered(value)}")
    if len(value) > UUID_MAX_CHARS:
        raise AnswerError(f"{len(value)} characters, more than {UUID_MAX_CHARS}: {answered(value)}")
    if not UUID_RE.fullmatch(value):
        raise AnswerError(f"not 1..{UUID_MAX_CHARS} of letters, digits, '-', '_', '.', ':': {answered(value)}")
    return value


def register_answer(body: Any, checks: Mapping[str, FieldCheck] | None = None) -> Identity:
    """``{"uuid": "...", ...}`` → Identity, with each field of ``checks`` checked (absent: None given);
    anything else is an AnswerError."""
    if not isinstance(body, dict):
        raise AnswerError(f"unusable answer: not a JSON object: {answered(body)}")
    if "uuid" not in body:
        raise AnswerError(f"unusable answer: no uuid in {answered(body)}")
    try:
        uuid = check_uuid(body["uuid"])
    except AnswerError as exc:
        raise AnswerError(f"unusable uuid: {exc}") from None
    fields: dict[str, str | None] = {}
    for name, check in (checks or {}).items():
        try:
            fields[name] = check(body.get(name))
        except AnswerError as exc:  # (its line names the field: "runner_id is not a whole number: ...")
            raise AnswerError(f"unusable {exc}") from None
    return Identity(uuid, fields)
