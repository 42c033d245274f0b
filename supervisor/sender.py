"""The outbox's delivery thread: every call to the manager, in order, at least once.

The lifecycle never waits on the manager: the Reporter writes each call into the
persisted outbox and this thread delivers it, retrying with backoff while the
manager is down, so a SIGKILL of the supervisor loses nothing. Registration goes
first: while no uuid is known the register is sent ahead of the queue (every
other call names the uuid), and one the manager refuses (a 4xx) is retried with
backoff like one it never got; no call is sent, or given up, for want of a uuid.

Each call kind has one handler (wiring.CallKind), registered in ``CallKinds``: the
core's ``register`` (the sender's own: it alone writes the identity), ``param-done``,
``running`` and ``log``, and what a plugin adds. The handler makes the request, checks
the answer (answers.py) and says what a delivered answer or a refusal means; those
are handed to the loop's thread: nothing here touches the lifecycle. A call of a kind
nobody handles (an outbox written by another version) is refused for good, in one line.
A register answered with an unusable uuid is retried like a manager that is down, and
a uuid kept by an earlier start is held to the same rule.

A uuid the manager no longer knows (404 ``instance not found``: its database was reset, or the 7-day
cleanup removed the row) is dropped: the label is registered again (the manager gives a new uuid, which
later children get), and the call is sent again with it, then the rest of the queue. Not a loop: the
same answer right after a fresh register is refused for good, and an instance given up (``retire``)
is never registered again (the manager would hand a destroyed machine a new row).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .answers import AnswerError, FieldCheck, check_uuid, register_answer
from .config import ManagerSpec
from .loop import EventLoop
from .manager import LOG_PUSH_LIMIT, Answer, ManagerClient, PermanentError, TransientError
from .outbox import Call, Outbox
from .wiring import CallKind, Payload

REGISTER = "register"
LOG = "log"  # a durable log push: {"source", "text"}

# Retries are logged on the first failure, then once every this many.
RETRY_LOG_EVERY = 10
# With nothing to deliver, the thread looks at the outbox again after this long even if not woken.
IDLE_WAIT_S = 1.0
# What the manager answers (with 404) on any call naming a uuid it does not know (manager-api.md).
UNKNOWN_INSTANCE = "instance not found"

Log = Callable[[str], None]



def phase_call(kind: str) -> CallKind:
    """``POST /<kind>`` with the uuid: the core's phase reports (``param-done``, ``running``)."""

    def attempt(client: ManagerClient, payload: Payload, uuid: str | None) -> Answer:
        return client.request("POST", f"/{kind}", json_body={"uuid": uuid}, want_json=False)

    return CallKind(attempt)


def _log_push(client: ManagerClient, payload: Payload, uuid: str | None) -> Answer:
    return client.request(
        "POST", "/api/log-push", data=payload.get("text", "").encode()[:LOG_PUSH_LIMIT],
        want_json=False, headers={"X-Instance-UUID": uuid or "", "X-Log-Source": payload.get("source", "setup"),
                                  "Content-Type": "text/plain; charset=utf-8"})


def core_kinds() -> dict[str, CallKind]:
    return {"param-done": phase_call("param-done"), "running": phase_call("running"), LOG: CallKind(_log_push)}


@dataclass
class CallKinds:
    """Every kind of call the outbox may hold (but ``register``, the sender's own), and what the
    ``/register`` body and answer carry beside the label and the uuid (a plugin's fields)."""

    kinds: dict[str, CallKind] = field(default_factory=core_kinds)
    register_fields: list[Callable[[], Mapping[str, Any]]] = field(default_factory=list)
    answer_fields: dict[str, FieldCheck] = field(default_factory=dict)

    def add(self, kind: str, call: CallKind) -> None:
        if kind == REGISTER or kind in self.kinds:
            raise ValueError(f"the outbox call kind {kind!r} has a handler already")
        self.kinds[kind] = call


class Sender:
    """Delivers the outbox's calls on its own thread; it alone writes the identity the manager gave.

    ``on_identity(uuid, fields)`` (the answer's checked fields beside the uuid) and each kind's
    ``delivered`` and ``refused`` are called in the loop's thread.
    """

    def __init__(self, spec: ManagerSpec, outbox: Outbox, client: ManagerClient, loop: EventLoop, log: Log,
                 calls: CallKinds, *, on_identity: Callable[[str, Mapping[str, str | None]], None],
                 on_delivered: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self.outbox = outbox
        self._client = client
        self._loop = loop
        self._log = log
        self._calls = calls
        self._kinds = {REGISTER: CallKind(lambda client, payload, uuid: self._register(), keep=self._keep_identity,
                                          delivered=lambda payload, body: self._registered()), **calls.kinds}
        self._on_identity = on_identity
        self._on_delivered = on_delivered  # on this thread, after each delivered call: the manager answers
        self.uuid: str | None = None
        self.fields: dict[str, str | None] = {}  # what the register answer gave beside the uuid (checked)
        self.last_delivered: dict[str, Any] | None = None
        self.last_error: str | None = None
        # Registered again for a forgotten uuid, and no call delivered under the new one yet: the same 404
        # now means registering cannot help, and it is refused for good.
        self._registered_again = False
        self._retired = False  # given up for good: a forgotten uuid is not registered again
        self.last_error_at: float | None = None  # epoch: when last_error happened
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ who we are to the manager

    def restore_identity(self) -> None:
        """The uuid an earlier start registered under this label, if any; else a register is queued."""
        stored_label = self.outbox.get("label")
        if stored_label is not None and stored_label != self.spec.label:
            # The state volume belonged to another instance: its uuid is not ours.
            self._log(f"manager: state_dir was registered as {stored_label!r}, not {self.spec.label!r}; "
                      "registering afresh")
            self.outbox.put("uuid", "")
        self.outbox.put("label", self.spec.label)
        self.uuid, self.fields = self._stored_identity()
        if self.uuid:
            shown = f" ({', '.join(f'{k} {v}' for k, v in self.fields.items())})" if self.fields else ""
            self._log(f"manager: reusing uuid {self.uuid}{shown} from an earlier start")
            self._on_identity(self.uuid, dict(self.fields))
        elif not self.outbox.pending_of(REGISTER):
            # No uuid, whatever the outbox says was delivered before (a SIGKILL between the answer and
            # the uuid being kept, another label): register now, so children start knowing who they are.
            self._queue_register()

    def _stored_identity(self) -> tuple[str | None, dict[str, str | None]]:
        """The uuid and fields an earlier start kept, held to the rules a fresh answer is: one that fails
        them (a file from an older version, a manager that answered garbage then) is dropped, and registering
        again (idempotent per label) gets the real one."""
        uuid = self.outbox.get("uuid") or None
        if uuid is None:
            return None, {}
        try:
            return check_uuid(uuid), {name: check(self.outbox.get(name) or None)
                                      for name, check in self._calls.answer_fields.items()}
        except AnswerError as exc:
            self._log(f"manager: the identity kept from an earlier start is unusable ({exc}); registering afresh")
            for name in ("uuid", *self._calls.answer_fields):
                self.outbox.put(name, "")
            return None, {}

    def _queue_register(self) -> None:
        self.outbox.add(REGISTER, self.identity())

    def identity(self) -> dict[str, Any]:
        """The ``/register`` body: the label, then each plugin's fields."""
        body: dict[str, Any] = {"label": self.spec.label}
        for fields in self._calls.register_fields:
            body.update(fields())
        return body

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._deliver_forever, name="outbox", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Something was added to the outbox: deliver it now rather than at the next idle look."""
        self._wake.set()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ask_to_stop(self) -> None:
        """Stop after the call in flight; what is not delivered stays pending in the outbox."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _deliver_forever(self) -> None:
        while not self._stop.is_set():
            call = self._next_call()
            if call is None:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            if call.kind not in self._kinds:
                self._unknown(call)
                continue
            retries = 0

            def on_retry(error: str, delay: float, call: Call = call) -> None:
                nonlocal retries
                retries += 1
                self.last_error, self.last_error_at = error, time.time()
                self.outbox.attempted(call.id, error)
                if retries == 1 or retries % RETRY_LOG_EVERY == 0:
                    self._loop.call_soon_threadsafe(lambda: self._log(
                        f"manager: {call.kind} not delivered ({error}); retry {retries} in {delay:.1f}s"))

            try:
                answer = self._client.with_retries(lambda call=call: self._attempt(call), self._stop, on_retry)
            except PermanentError as exc:
                self.last_error, self.last_error_at = str(exc), time.time()
                if self._forgotten(call, exc):
                    continue  # the call stays pending: it goes again once registered anew
                self.outbox.failed(call.id, str(exc))
                self._loop.call_soon_threadsafe(lambda exc=exc, call=call: self._refused(call, exc))
                continue
            except TransientError:
                return  # stopping: the call stays pending in the outbox
            self.outbox.delivered(call.id, answer.body)
            if call.kind != REGISTER:
                self._registered_again = False
            self.last_delivered = {"kind": call.kind, "id": call.id, "at": time.time()}
            self.last_error = self.last_error_at = None  # a delivery clears the error: the manager is back
            self._delivered(call, answer)
            if self._on_delivered is not None:
                self._on_delivered()

    def _next_call(self) -> Call | None:
        """The next call to deliver: in order, except that registration goes first while no uuid is known.

        Every other call needs the uuid, so none is sent (nor given up) before a register succeeded,
        wherever the register stands in the queue (an outbox of an earlier start, a lost uuid).
        """
        call = self.outbox.next_pending()
        if call is None or call.kind == REGISTER or self.uuid:
            return call
        register = self.outbox.next_pending_of(REGISTER)
        if register is None:
            self._queue_register()
            register = self.outbox.next_pending_of(REGISTER)
        return register

    def _unknown(self, call: Call) -> None:
        """A kind nothing here handles (written by another version, or a plugin not loaded now): sending it
        again cannot help, and it must not hold up the calls behind it."""
        error = f"no handler for the call kind {call.kind!r}"
        self.outbox.failed(call.id, error)
        self._loop.call_soon_threadsafe(lambda: self._log(
            f"manager: outbox call {call.id} refused for good: {error} (written by another version?)"))

    def retire(self) -> None:
        """This instance was given up (any thread): a uuid the manager forgot is not registered again."""
        self._retired = True

    def _forgotten(self, call: Call, exc: PermanentError) -> bool:
        """The manager no longer knows our uuid: drop it, so that the label is registered again before the
        call goes again (see the module docstring). False: a refusal like any other."""
        if call.kind == REGISTER or self._registered_again or self._retired or not unknown_instance(exc) \
                or not self.uuid:
            return False
        self._registered_again = True
        forgotten, self.uuid, self.fields = self.uuid, None, {}
        for name in ("uuid", *self._calls.answer_fields):
            self.outbox.put(name, "")
        self.outbox.attempted(call.id, str(exc))
        self._loop.call_soon_threadsafe(lambda: self._log(
            f"manager: the manager no longer knows uuid {forgotten} (404 {UNKNOWN_INSTANCE}: its database was "
            f"reset or the instance cleaned up); registering again"))
        return True

    # ------------------------------------------------------------ one call

    def _attempt(self, call: Call) -> Answer:
        kind = self._kinds.get(call.kind)
        if kind is None:
            raise PermanentError(0, f"no handler for the call kind {call.kind!r}")
        return kind.attempt(self._client, call.payload, self.uuid)

    def _register(self) -> Answer:
        # Who this start is, whatever an earlier start queued (its label may have been another).
        try:
            answer = self._client.request("POST", "/register", json_body=self.identity())
        except PermanentError as exc:
            # Refused (a 4xx): retried with the same backoff as a manager that is down, never dropped.
            # Nothing else can go without the uuid, and registering again is harmless (idempotent).
            raise TransientError(f"/register refused: HTTP {exc.status}: {exc.body[:200]}") from None
        try:
            identity = register_answer(answer.body, self._calls.answer_fields)
        except AnswerError as exc:
            # Never kept, never exported: retried until the manager gives one a child can carry.
            raise TransientError(f"the manager answered /register with an {exc}") from None
        return Answer(answer.status, {"uuid": identity.uuid, **identity.fields})

    def _keep_identity(self, payload: Payload, body: Any) -> None:
        """What _register checked: a safe uuid, and each field as its check kept it."""
        self.uuid = body["uuid"]
        self.fields = {name: body.get(name) for name in self._calls.answer_fields}
        self.outbox.put("uuid", body["uuid"])
        for name, value in self.fields.items():
            self.outbox.put(name, value or "")

    # ------------------------------------------------------------ what an answer means

    def _delivered(self, call: Call, answer: Answer) -> None:
        kind = self._kinds[call.kind]
        if kind.keep is not None:
            kind.keep(call.payload, answer.body)  # before the next call goes out (it may need it)
        delivered = kind.delivered
        if delivered is not None:
            self._loop.call_soon_threadsafe(lambda: delivered(call.payload, answer.body))

    def _refused(self, call: Call, exc: PermanentError) -> None:
        self._log(f"manager: {call.kind} refused for good: HTTP {exc.status}: {exc.body[:300]!r}")
        kind = self._kinds.get(call.kind)
        if kind is not None and kind.refused is not None:
            kind.refused(call.payload)  # e.g. no answer will ever come to wait for

    def _registered(self) -> None:
        assert self.uuid is not None
        shown = "".join(f", {k} {v}" for k, v in self.fields.items())
        self._log(f"manager: registered: uuid {self.uuid}{shown}")
        self._on_identity(self.uuid, dict(self.fields))


def unknown_instance(exc: PermanentError) -> bool:
    """The manager's answer to a call naming a uuid it has no row for (not a killed one: that is kept)."""
    return exc.status == 404 and UNKNOWN_INSTANCE in exc.body.lower()
