"""Secrets never reach a log: the manager token, any env value whose name looks secret, a URL's password.

Values are replaced by ``***`` in the supervisor's own lines, in children's
output (console, files, ring, pushed logs) and in the status view. A URL is
shown everywhere through ``shown_url`` (``http://user:***@host/``), and the
password in it (``url_secrets``) is one of the masked values besides.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

SECRET_NAME_RE = re.compile(r"(_KEY|_TOKEN|_PASSWORD|_PASSWD|_SECRET)$|^CONTAINER_API_KEY$", re.IGNORECASE)
MASK = "***"
# Shorter values would mask innocent text everywhere ("1", "yes").
MIN_SECRET_LEN = 4


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        unique = {s for s in secrets if s and len(s) >= MIN_SECRET_LEN}
        self._text = sorted(unique, key=len, reverse=True)  # longest first: no partial leftovers
        self._bytes = [s.encode() for s in self._text]

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
        for secret in self._bytes:
            if secret in data:
                data = data.replace(secret, MASK.encode())
        return data

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: (MASK if looks_secret(k) else self.text(v)) for k, v in env.items()}


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
