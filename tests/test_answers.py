"""Pure checks, in-process: the manager's answers (answers.py), Retry-After (manager.py), URLs shown and masked
(redact.py). The hostile manager end to end is tests/test_manager_hostile.py; the fuzz, tests/test_manager_fuzz.py.
"""

from __future__ import annotations

import base64
from email.utils import formatdate
from typing import Any

import pytest

from supervisor.manager.answers import UUID_MAX_CHARS, AnswerError, Identity, check_uuid, register_answer
from supervisor.manager.client import RETRY_AFTER_MAX_S, next_wait_s, retry_after_s
from supervisor.text.redact import MASK, Redactor, shown_url, url_secrets

# ---------------------------------------------------------------- /register


@pytest.mark.parametrize("uuid", ["4f1c2a9e-0b7d-4c55-9a1e-2f3b4c5d6e7f", "7", "C.32710471", "inst_9:a.b-c",
                                  "a" * UUID_MAX_CHARS])
def test_a_uuid_of_the_safe_set_is_taken(uuid: str) -> None:
    assert check_uuid(uuid) == uuid
    assert register_answer({"uuid": uuid, "runner_id": 7}) == Identity(uuid)  # (a field no check asked for)


@pytest.mark.parametrize(("uuid", "said"), [
    ({"a": 1}, "not a string"), (True, "not a string"), (7, "not a string"), (None, "not a string"),
    ("", "not 1..128"), ("a\r\nb", "not 1..128"), ("a\nb", "not 1..128"), ("a\x00b", "not 1..128"),
    ("a b", "not 1..128"), ("a\tb", "not 1..128"), ("ümlaut", "not 1..128"), ("a/b", "not 1..128"),
    ("$(reboot)", "not 1..128"), ("a" * (UUID_MAX_CHARS + 1), "129 characters"), ("a" * 200_000, "200000 characters"),
    ("abc\n", "not 1..128"),
])
def test_an_unusable_uuid_is_refused_in_one_line(uuid: Any, said: str) -> None:
    with pytest.raises(AnswerError) as info:
        register_answer({"uuid": uuid, "runner_id": 1})
    message = str(info.value)
    assert message.startswith("unusable uuid: ") and said in message, message
    assert "\n" not in message and "\r" not in message and "\x00" not in message and len(message) < 200


@pytest.mark.parametrize(("body", "said"), [
    (True, "unusable answer: not a JSON object: true"), ([], "unusable answer: not a JSON object"),
    ("uuid", "unusable answer: not a JSON object"), ({}, "unusable answer: no uuid"),
    ({"runner_id": 7}, "unusable answer: no uuid"),
])
def test_a_register_answer_that_is_no_object_with_a_uuid_is_refused(body: Any, said: str) -> None:
    with pytest.raises(AnswerError, match=said):
        register_answer(body)


def test_a_bad_value_is_shown_short_and_printable() -> None:
    with pytest.raises(AnswerError) as info:
        check_uuid("x" * 10_000 + "\x00")
    assert len(str(info.value)) < 120


# ---------------------------------------------------------------- Retry-After

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("header", "seconds"), [
    ("5", 5.0), (" 5 ", 5.0), ("0", 0.0), ("301", RETRY_AFTER_MAX_S), ("9" * 5000, RETRY_AFTER_MAX_S),
    (formatdate(NOW + 42, usegmt=True), 42.0), (formatdate(NOW - 42, usegmt=True), 0.0),
    (formatdate(NOW + 10**6, usegmt=True), RETRY_AFTER_MAX_S),
    (None, None), ("", None), ("soon", None), ("-5", None), ("5.5", None), ("1e3", None), ("٥", None),
    ("Mon, 99 Foo 2026 99:99:99 GMT", None), ("Fri, 31 Dec 99999 23:59:59 GMT", None), ("\x00", None),
])
def test_retry_after_is_seconds_or_an_http_date_and_bounded(header: str | None, seconds: float | None) -> None:
    assert retry_after_s(header, NOW) == (None if seconds is None else pytest.approx(seconds, abs=1.0))


@pytest.mark.parametrize(("backoff", "asked", "wait"), [(2.0, None, 2.0), (2.0, 10.0, 10.0), (20.0, 10.0, 20.0),
                                                        (2.0, 10_000.0, RETRY_AFTER_MAX_S), (2.0, 0.0, 2.0)])
def test_the_wait_is_the_backoff_or_what_was_asked_if_longer(backoff: float, asked: float | None,
                                                             wait: float) -> None:
    assert next_wait_s(backoff, asked) == wait


# ---------------------------------------------------------------- URLs shown, passwords masked


@pytest.mark.parametrize(("url", "shown"), [
    ("http://127.0.0.1:1235", "http://127.0.0.1:1235"),
    ("https://fleet:s3cret@mgr.example:8443/api", f"https://fleet:{MASK}@mgr.example:8443/api"),
    ("http://fleet:p%40ss@h/", f"http://fleet:{MASK}@h/"),
    ("http://fleet:@h", f"http://fleet:{MASK}@h"),
    ("http://token-as-user@h", f"http://{MASK}@h"),
    ("http://u:pw@h/a@b", f"http://u:{MASK}@h/a@b"),
    ("not a url", "not a url"),
])
def test_shown_url_masks_the_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_url_secrets_are_the_password_and_the_userinfo_in_every_form() -> None:
    secrets = set(url_secrets("http://fleet:p%40ss-word@h:1/x"))
    basic = base64.b64encode(b"fleet:p@ss-word").decode()
    assert secrets == {"fleet:p%40ss-word", "fleet:p@ss-word", "p%40ss-word", "p@ss-word", basic}
    assert url_secrets("http://h:1/x") == [] and url_secrets(None) == []
    masked = Redactor(["tok-123456"]).plus(url_secrets("http://fleet:p%40ss-word@h"))
    line = "GET http://fleet:p%40ss-word@h with p@ss-word, tok-123456, Authorization: Basic " + basic
    assert masked.text(line) == f"GET http://{MASK}@h with {MASK}, {MASK}, Authorization: Basic {MASK}"
