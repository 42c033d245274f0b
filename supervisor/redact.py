"""Secrets never reach a log: the manager token and any env value whose name looks secret.

Values are replaced by ``***`` in the supervisor's own lines, in children's
output (console, files, ring, pushed logs) and in the status view.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

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
