"""The fleet manager's HTTP API (manager-api.md), as a client with timeouts and retries.

Every call has a connect and a read timeout. Connection errors, timeouts, 5xx
and 429 are transient: retried with exponential backoff and jitter (tenacity)
until delivered or the supervisor stops. Any other 4xx is permanent: logged
with the body, not retried. A 2xx whose body the call needs but cannot parse
(garbage) is transient too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import ManagerSpec

# requests and tenacity are imported when a client is made, not with this module: a
# supervisor without a manager should not pay their start-up time and memory.

# Retry pacing for manager calls (seconds): 0.5, 1, 2, ... capped, with jitter.
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 30.0
RETRY_JITTER_S = 1.0
# The manager reads at most 256 KiB of one log push and silently drops the rest.
LOG_PUSH_LIMIT = 256 * 1024
USER_AGENT = "prover-supervisor"


class TransientError(Exception):
    """Worth retrying: the manager is down, slow, overloaded, or answered garbage."""


class PermanentError(Exception):
    """A 4xx other than 429: retrying the same call cannot help."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # parsed JSON, or None (204, or no JSON wanted)


class ManagerClient:
    def __init__(self, spec: ManagerSpec, token: str | None = None) -> None:
        assert spec.url is not None
        self.base = spec.url
        import requests

        self._requests = requests
        self.timeout = (spec.connect_timeout_s, spec.read_timeout_s)
        self._session = requests.Session()
        self._session.headers["User-Agent"] = USER_AGENT
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._lock = threading.Lock()  # one Session per thread would do too; calls are rare

    def request(self, method: str, path: str, *, json_body: dict[str, Any] | None = None,
                data: bytes | None = None, headers: dict[str, str] | None = None,
                want_json: bool = True) -> Answer:
        """One attempt. Raises TransientError or PermanentError."""
        url = self.base + path
        requests = self._requests
        try:
            with self._lock:
                response = self._session.request(method, url, json=json_body, data=data, headers=headers,
                                                 timeout=self.timeout)
        except requests.Timeout as exc:
            raise TransientError(f"{method} {path}: timed out ({exc.__class__.__name__})") from None
        except requests.RequestException as exc:
            raise TransientError(f"{method} {path}: {exc.__class__.__name__}: {_short(exc)}") from None
        status = response.status_code
        if status == 429 or status >= 500:
            raise TransientError(f"{method} {path}: HTTP {status}: {response.text[:200]}")
        if status >= 400:
            raise PermanentError(status, response.text)
        if not want_json or status == 204:
            return Answer(status, None)
        try:
            return Answer(status, response.json())
        except (ValueError, json.JSONDecodeError):
            raise TransientError(f"{method} {path}: HTTP {status} with a body that is not JSON: "
                                 f"{response.text[:100]!r}") from None

    def with_retries(self, attempt: Callable[[], Answer], stop: threading.Event,
                     on_retry: Callable[[str, float], None]) -> Answer:
        """Repeat ``attempt`` while it fails transiently, until it succeeds or ``stop`` is set."""
        import tenacity

        def before_sleep(state: Any) -> None:  # a tenacity.RetryCallState
            exc = state.outcome.exception() if state.outcome else None
            on_retry(str(exc), state.next_action.sleep if state.next_action else 0.0)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientError),
            wait=tenacity.wait_exponential_jitter(multiplier=RETRY_INITIAL_S, max=RETRY_MAX_S, jitter=RETRY_JITTER_S),
            stop=tenacity.stop_when_event_set(stop),
            sleep=stop.wait,
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)

    def close(self) -> None:
        self._session.close()


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."
