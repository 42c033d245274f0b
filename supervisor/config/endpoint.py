"""How the manager is reached and who this instance is to it: the manager's URL and the label, checked at load.

A URL a call would get wrong (a query, a fragment, whitespace, a control character) passed ``check``
and then failed every call; a label that is not UTF-8 failed mid-run. Both are refused here, in one
line naming the key, and an error never shows a URL's password.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from ..text.redact import MASK, shown_url
from ..text.show import cut, shown
from .model import ConfigError
from .values import ASIDE_CHARS, _string, check_host, check_url_port, refuse_url_characters


def _url(value: Any, where: str) -> str:
    """The manager's base URL: http(s), a host, a port in range, maybe a path prefix (the calls' paths are
    appended to it), nothing a call would then get wrong (a query, a fragment, whitespace, a control
    character, a backslash, non-ASCII). A ``user:password@`` becomes basic auth (requests sends it);
    errors show the URL with the password masked."""
    text = _string(value, where)
    quoted = shown(_url_for_error(text))
    refuse_url_characters(text, where, quoted)
    if "?" in text or "#" in text:
        raise ConfigError(f"{where}: {quoted} has a query or fragment ('?' or '#'): the calls' paths are appended "
                          "to the URL, so it can only be scheme://host[:port][/path]")
    try:
        parts = urlsplit(text)
        _ = parts.port  # (reading it is what checks it: a port out of range, or no number)
    except ValueError as exc:
        # urllib quotes what it could not read: with an '@' about, that may be a piece of a password. So the
        # reason is read again from the URL with its user and password masked: the host's or port's own (a port
        # of 99999), else the credentials' (a '/' or '@' in the password).
        reason = _masked_url_fault(text) if "@" in text else str(exc)
        raise ConfigError(f"{where}: {quoted} is not a valid URL ({cut(reason, ASIDE_CHARS)})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: {quoted} must be an http:// or https:// URL with a host")
    check_url_port(parts, where, quoted)
    if "@" in parts.path:
        raise ConfigError(f"{where}: {quoted} has an '@' after the host: a password holding '/' or '@' must "
                          "percent-encode them (%2F, %40)")
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
    if userinfo is not None and ":" not in userinfo:
        raise ConfigError(f"{where}: {quoted}: a user without a password (user@host) sends no credentials; write "
                          "user:password@host, or use manager.token_env")
    # Last: only once no '@' is left after the host is the host what urllib read (before, a password holding a
    # '/' left a piece of itself there, and the refusal showed it as the host).
    check_host(parts.hostname, where, quoted)
    return text.rstrip("/")


# The port a URL without one is reached on, by its scheme (the two _url takes).
_DEFAULT_PORTS = {"http": 80, "https": 443}


def same_origin(url: str | None, other: str | None) -> bool:
    """Whether two URLs (each one _url took, or None) are one origin: scheme, host and port alike (a port left out
    is its scheme's). The manager's token goes to its own origin only, as an HTTP client drops Authorization on a
    redirect to another host: an events_url elsewhere (Loki, a webhook) is another party."""
    return bool(url and other) and _origin(url or "") == _origin(other or "")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)  # (the scheme and the host come lowercased)
    return parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)


def _masked_url_fault(text: str) -> str:
    """Why a URL with credentials cannot be read, said from its masked form alone."""
    try:
        _ = urlsplit(_url_for_error(text)).port  # (reading it is what checks it)
    except ValueError as exc:
        return str(exc)
    return "percent-encode any '/', '@' or ':' in the user or password"


def _url_for_error(text: str) -> str:
    """A URL that may be invalid, as an error shows it: everything before its last '@' masked (a password
    holding '/' ends the host early, and no parser can then tell where it stops)."""
    head, sep, rest = text.partition("://")
    return f"{head}{sep}{MASK}@{rest.rpartition('@')[2]}" if sep and "@" in rest else shown_url(text)


MAX_LABEL_CHARS = 256
# The manager matches a Vast instance by the numeric id in its label: any other derived label gets a healthy
# instance marked killed ("instance disappeared from vast") and a give-up that destroys nothing.
MATCHABLE_LABEL = re.compile(r"C\.[0-9]+")
# The manager parses that id into a signed 64-bit integer: a bigger one overflows its parser.
LABEL_ID_MAX = 2**63 - 1


def check_label(value: Any, where: str) -> str:
    """The instance's label (``C.<id>``, a hostname): sent in JSON, kept in the outbox, shown on every line."""
    text = _string(value, where)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # os.environ holds undecodable bytes as surrogate escapes
        raise ConfigError(f"{where}: {shown(text)} is not valid UTF-8") from None
    if not text.isprintable():
        raise ConfigError(f"{where}: {shown(text)} holds a control character")
    if not text.strip():  # ("" is refused as any empty string is)
        raise ConfigError(f"{where}: {shown(text)} is only spaces: it names no instance")
    if len(text) > MAX_LABEL_CHARS:
        raise ConfigError(f"{where}: {len(text)} characters, more than the {MAX_LABEL_CHARS} a label may have")
    if MATCHABLE_LABEL.fullmatch(text) is not None and int(text[2:]) > LABEL_ID_MAX:
        # Explicit or derived: a C.<digits> label is one the manager parses, and this one it cannot.
        raise ConfigError(f"{where}: {shown(text)}: its id does not fit the manager's 64-bit integer "
                          f"(at most {LABEL_ID_MAX})")
    return text


def check_derived_label(label: str, where: str) -> str:
    """A label taken from the environment or the hostname (no ``[manager] label``) must be ``C.<digits>``."""
    if MATCHABLE_LABEL.fullmatch(label) is None:
        raise ConfigError(f"{where}: {shown(label)} is not a label the manager can match (C.<digits>, as Vast "
                          "sets VAST_CONTAINERLABEL): set VAST_CONTAINERLABEL or CONTAINER_ID, or [manager] label "
                          "explicitly")
    return label
