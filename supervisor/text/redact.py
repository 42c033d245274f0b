"""Secrets never reach a log: the manager token, any env value whose name looks secret, a URL's password.

A secret is masked (``***``) once, where the text that may hold it enters the supervisor; everything
downstream gets it masked already and never masks again. The entry points:

- children's output: one ``SecretStream`` per pipe, as its bytes are read (logs.ChildOutput): the
  console, the per-child file, the ring of last lines (so every verdict's last lines), the output
  parsers and the log shipper all read masked bytes;
- the supervisor's own lines: ``SupervisorLog`` (logs.py), before the console, supervisor.log and the
  log shipper's tap (``Redactor.text``);
- verdicts, objects made of the supervisor's words, config values and masked child lines: where they are
  recorded (verdict.VerdictRecord), so the log, the status view and status.json, the durable FAILED push,
  a plugin's give-up reason and the termination log all read the masked record;
- what the manager (or the HTTP library) says: the client masks the URL's credentials in the errors
  it raises (manager/client.py), and the status view masks the last error it shows (Reporter.status).

A child's bytes come in reads cut wherever the pipe was: a secret written in two writes arrives
in two reads. So the stream holds back the end of a read that could still become a secret (at most
the longest secret less one byte of text, plus an escape sequence begun and not finished) and
releases it with the next read, at a line end, or when the pipe closes. A secret with escape codes
inside it (``pa\\x1b[1mss``) is masked too: each secret's pattern allows codes between its bytes,
and the codes are kept, after the mask, so the terminal's colours stay as the child set them.
A URL is shown everywhere through ``shown_url`` (``http://user:***@host/``), and the password in it
(``url_secrets``) is one of the masked values besides.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

from .ansi import ANSI_PATTERN, UNFINISHED_RE, codes_in, strip_ansi

# A name ending in one of these words (or being one: TOKEN, PASSWORD; not a bare KEY, too common a word).
SECRET_NAME_RE = re.compile(r"(^|_)(TOKEN|PASSWORD|PASSWD|SECRET)$|_KEY$|^CONTAINER_API_KEY$", re.IGNORECASE)
MASK = "***"
MASK_BYTES = MASK.encode()
# Shorter values would mask innocent text everywhere ("1", "yes").
MIN_SECRET_LEN = 4
# How far back from the end of a read a secret's beginning is looked for, in raw bytes: the text of
# the longest secret with escape codes between its characters. A held part never grows past it.
HOLD_SCAN_BYTES = 4096
LINE_ENDS_RE = re.compile(r"[\r\n]+")

_CODES = b"(?:" + ANSI_PATTERN + b")*"


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


class Redactor:
    """The secrets of one run, and masking them in text and in bytes."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Each line of a secret of several lines (a key, a value read with its line end) is one of its own: the
        # stream lets a line end through at once, and a key printed a line a write never comes whole.
        unique = {part for secret in secrets for part in (secret, *LINE_ENDS_RE.split(secret or ""))
                  if len(part) >= MIN_SECRET_LEN}
        self._text = sorted(unique, key=len, reverse=True)  # longest first: no partial leftovers
        self._bytes = [s.encode() for s in self._text]
        self._longest = len(self._bytes[0]) if self._bytes else 0
        self._firsts = sorted({s[:1] for s in self._bytes})
        # Each secret with any escape codes between its bytes; the longest first, as above.
        self._across_codes = re.compile(b"|".join(_CODES.join(re.escape(s[i:i + 1]) for i in range(len(s)))
                                                  for s in self._bytes)) if self._bytes else None

    @classmethod
    def from_environments(cls, envs: Iterable[Mapping[str, str]], extra_names: Iterable[str] = ()) -> Redactor:
        names = set(extra_names)
        values = []
        for env in envs:
            for name, value in env.items():
                if name in names or looks_secret(name):
                    values.append(value)
        return cls(values)

    def plus(self, secrets: Iterable[str]) -> Redactor:
        """This redactor, masking ``secrets`` too."""
        return Redactor([*self._text, *secrets])

    def __bool__(self) -> bool:
        return bool(self._text)

    def text(self, text: str) -> str:
        for secret in self._text:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def data(self, data: bytes) -> bytes:
        """``data`` with every secret in it masked, also one with escape codes inside it."""
        if b"\x1b" in data and self._across_codes is not None:
            # (the plain check first: a regex over every coloured read would cost the hot path)
            plain = strip_ansi(data)
            if any(secret in plain for secret in self._bytes):
                return self._across_codes.sub(_mask_keeping_codes, data)
            return data
        for secret in self._bytes:
            if secret in data:
                data = data.replace(secret, MASK_BYTES)
        return data

    def stream(self) -> SecretStream:
        return SecretStream(self)

    def hold_from(self, data: bytes) -> int:
        """Where the end of ``data`` that could still become a secret (with the next bytes) starts;
        ``len(data)`` when none could: an unfinished escape sequence, or the beginning of a secret
        (its text a proper prefix of one) in the line still open at the end."""
        end = len(data)
        open_line = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # no secret spans a line end
        if open_line == end or not self._bytes:
            return end
        start = max(open_line, end - HOLD_SCAN_BYTES)
        hold = end
        esc = data.rfind(b"\x1b", start)
        if esc >= 0 and UNFINISHED_RE.match(data, esc):
            hold = esc  # invisible, and what follows it may go on with a secret
        earliest = hold
        for first in self._firsts:
            at = hold
            while (at := data.rfind(first, start, at)) >= 0:
                text = strip_ansi(data[at:hold])
                if len(text) >= self._longest:
                    break  # further back the text only grows longer than any secret
                if any(len(secret) > len(text) and secret.startswith(text) for secret in self._bytes):
                    earliest = min(earliest, at)
        if earliest < hold and self._across_codes is not None:
            # Never inside a whole secret: one that ends with a first byte of a secret (its own: "3f…e3") is the
            # beginning of another to the look above, and the cut there passed its head on unmasked.
            for match in self._across_codes.finditer(data, start, end):
                if match.start() < earliest < match.end():
                    return match.start()
        return earliest


class SecretStream:
    """One pipe of a child's output, masked as it comes: ``feed`` returns what is safe to pass on
    (masked), holding back an end that could still become a secret; ``close`` releases the rest."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        data = self._held + data if self._held else data
        cut = self._redactor.hold_from(data)
        self._held = data[cut:]
        return self._redactor.data(data[:cut]) if cut else b""

    def held_shown(self) -> bytes:
        """What it holds back, as it may be shown before the pipe's end tells what it is (a verdict's last line while
        a grandchild holds the pipe): masked, as the next bytes may still make it a secret; nothing for an escape
        code begun alone, which shows nothing. Left where it is: ``feed`` and ``close`` release it as ever."""
        return MASK_BYTES if self._held and not UNFINISHED_RE.fullmatch(self._held) else b""

    def close(self) -> bytes:
        held, self._held = self._held, b""
        return self._redactor.data(held)


def _mask_keeping_codes(match: re.Match[bytes]) -> bytes:
    return MASK_BYTES + codes_in(match.group())


def _split_userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, @host...)`` of a URL with a userinfo part, else None. Textual, so that it also
    works on a URL that is invalid in some other way (an error message quotes it)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, _ = authority.rpartition("@")
    if not at:
        return None
    return scheme + sep, userinfo, rest[len(userinfo):]


def shown_url(url: str) -> str:
    """The URL as it may be shown: ``http://user:***@host/path`` (the password masked), else unchanged."""
    parts = _split_userinfo(url)
    if parts is None:
        return url
    head, userinfo, tail = parts
    user, colon, _ = userinfo.partition(":")
    return f"{head}{user}:{MASK}{tail}" if colon else f"{head}{MASK}{tail}"


def url_secrets(url: str | None) -> list[str]:
    """What of a URL must be masked wherever it turns up: its password and its whole userinfo, as written
    and percent-decoded (as a child may print it), and the basic-auth credential requests makes of it."""
    parts = _split_userinfo(url or "")
    if parts is None:
        return []
    userinfo = parts[1]
    password = userinfo.partition(":")[2]
    basic = base64.b64encode(unquote(userinfo).encode("utf-8", errors="replace")).decode()
    return [s for s in {userinfo, unquote(userinfo), password, unquote(password), basic} if s]
