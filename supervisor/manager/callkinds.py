"""The kinds of call the outbox holds: the core's (``param-done``, ``running``, ``log``) and what a plugin adds.

Each kind has one handler (wiring.CallKind): how one attempt is made, and what its answer means. The
sender (sender.py) delivers them; ``register`` is the sender's own (it alone writes the identity).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import config
from .answers import FieldCheck
from .client import LOG_PUSH_LIMIT, SEQ_HEADER, Answer, ManagerClient, text_body
from .row import NO_ROW_FIELDS, RowFields

Payload = Mapping[str, Any]


@dataclass(frozen=True)
class CallKind:
    """One kind of outbox call: how one attempt is made, and what its outcome means.

    ``attempt(client, payload, uuid)`` makes the request (its route, its body from the payload and the
    uuid) and checks the answer: it returns the Answer whose body is kept in the outbox, or raises the
    client's TransientError (retried: the manager is down, or answered what cannot be used) or
    PermanentError (refused for good). ``keep(payload, body)`` runs on the sender thread before the next
    call goes out (what later calls need at once); ``delivered(payload, body)`` and ``refused(payload)``
    run on the loop's thread. ``checks_row``: a lifecycle call (it moves the manager's row): the row is read
    first, and a killed row gets none (rowwatch.py).

    ``again(payload, body)`` (the sender's thread) checks the answer to a lifecycle call sent again: one
    delivered before, sent once more under the new uuid of a row the manager forgot (its payload holds
    SENT_AGAIN). What its first answer decided stands and was said then, so ``delivered`` is not told again;
    ``again`` returns why this answer means that the manager killed the instance (the prover's bench-done
    answered ``passed: false`` by the new row), None when it does not. Without it, nothing is read into it."""

    attempt: Callable[[ManagerClient, Payload, str | None], Answer]
    keep: Callable[[Payload, Any], None] | None = None
    delivered: Callable[[Payload, Any], None] | None = None
    refused: Callable[[Payload], None] | None = None
    checks_row: bool = False
    again: Callable[[Payload, Any], str | None] | None = None


REGISTER = "register"
# The payload key of a lifecycle call sent again under a new uuid (sender.py _register_forgotten): the uuid it
# was first delivered under. Never sent: each kind builds its request from the keys it knows.
SENT_AGAIN = "sent_again_after"
LOG = "log"  # a durable log push: {"source", "text"}, and "seq" where it carries the shipper's numbered lines
RUNNING = config.RUNNING


def phase_call(kind: str) -> CallKind:
    """``POST /<kind>`` with the uuid: the core's phase reports (``param-done``, ``running``)."""

    def attempt(client: ManagerClient, payload: Payload, uuid: str | None) -> Answer:
        return client.request("POST", f"/{kind}", json_body={"uuid": uuid}, expect="ok")

    return CallKind(attempt, checks_row=True)


def _log_push(client: ManagerClient, payload: Payload, uuid: str | None) -> Answer:
    # Reporter.push_text queues push-sized bodies; the limit holds one an older version queued whole to what the
    # manager would keep of it.
    seq = payload.get("seq")
    return client.request(
        "POST", "/api/log-push", data=text_body(payload.get("text", ""), LOG_PUSH_LIMIT),
        expect="ok", headers={"X-Instance-UUID": uuid or "", "X-Log-Source": payload.get("source", "setup"),
                                  "Content-Type": "text/plain; charset=utf-8", **({SEQ_HEADER: seq} if seq else {})})


def core_kinds() -> dict[str, CallKind]:
    """A call for each of the core's report kinds (config.REPORTS, the one table of them), and the log push."""
    return {**{kind: phase_call(kind) for kind in config.REPORTS}, LOG: CallKind(_log_push)}


@dataclass
class CallKinds:
    """Every kind of call the outbox may hold (but ``register``, the sender's own), what the ``/register``
    body and answer carry beside the label and the uuid, and what the manager's row holds beside the core's
    fields (a plugin's: rowwatch.py reads them)."""

    kinds: dict[str, CallKind] = field(default_factory=core_kinds)
    answer_fields: dict[str, FieldCheck] = field(default_factory=dict)  # read; written by add_answer_field
    row: RowFields = NO_ROW_FIELDS
    _register_fields: list[Callable[[], Mapping[str, Any]]] = field(default_factory=list, init=False, repr=False)

    def add_register_fields(self, fields: Callable[[], Mapping[str, Any]]) -> None:
        """What the ``/register`` body carries beside the label: ``fields()``, read at each registration."""
        self._register_fields.append(fields)

    def add_answer_field(self, name: str, check: FieldCheck) -> None:
        """A field of the ``/register`` answer kept beside the uuid, once ``check`` passed it."""
        self.answer_fields[name] = check

    def register_body(self, label: str) -> dict[str, Any]:
        """The ``/register`` body: the label, then each plugin's fields, in the order they were added."""
        body: dict[str, Any] = {"label": label}
        for fields in self._register_fields:
            body.update(fields())
        return body

    def add(self, kind: str, call: CallKind) -> None:
        if kind == REGISTER or kind in self.kinds:
            raise ValueError(f"the outbox call kind {kind!r} has a handler already")
        self.kinds[kind] = call
