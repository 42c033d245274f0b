"""The outbox's delivery thread: every call to the manager, in order, at least once.

The lifecycle never waits on the manager: the Reporter writes each call into the
persisted outbox and this thread delivers it, retrying with backoff while the
manager is down, so a SIGKILL of the supervisor loses nothing. Registration goes
first: while no uuid is known the register is sent ahead of the queue (every
other call names the uuid), and one the manager refuses (a 4xx) is retried with
backoff like one it never got; no call is sent, or given up, for want of a uuid.

What delivery learns (the uuid, the manager's answer to bench-done, a call
refused for good) is handed to the loop's thread: nothing here touches the
lifecycle. Every answer is checked (answers.py) before it is kept: a register answered
with an unusable uuid is retried like a manager that is down, and a uuid kept by an
earlier start is held to the same rule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .answers import AnswerError, bench_answer, check_runner_id, check_uuid, register_answer
from .config import ManagerSpec
from .loop import EventLoop
from .manager import LOG_PUSH_LIMIT, Answer, ManagerClient, PermanentError, TransientError
from .outbox import Call, Outbox

# Retries are logged on the first failure, then once every this many.
RETRY_LOG_EVERY = 10
# With nothing to deliver, the thread looks at the outbox again after this long even if not woken.
IDLE_WAIT_S = 1.0

Log = Callable[[str], None]


class Sender:
    """Delivers the outbox's calls on its own thread; it alone writes the identity the manager gave.

    ``on_identity(uuid, runner_id)``, ``on_bench_answer(passed, rate)`` and ``on_bench_refused()``
    are called in the loop's thread.
    """

    def __init__(self, spec: ManagerSpec, outbox: Outbox, client: ManagerClient, loop: EventLoop, log: Log, *,
                 on_identity: Callable[[str, str | None], None], on_bench_answer: Callable[[bool, float], None],
                 on_bench_refused: Callable[[], None]) -> None:
        self.spec = spec
        self.outbox = outbox
        self._client = client
        self._loop = loop
        self._log = log
        self._on_identity = on_identity
        self._on_bench_answer = on_bench_answer
        self._on_bench_refused = on_bench_refused
        self.uuid: str | None = None
        self.runner_id: str | None = None
        self.last_delivered: dict[str, Any] | None = None
        self.last_error: str | None = None
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
        self.uuid, self.runner_id = self._stored_identity()
        if self.uuid:
            self._log(f"manager: reusing uuid {self.uuid} (runner_id {self.runner_id}) from an earlier start")
            self._on_identity(self.uuid, self.runner_id)
        elif not self.outbox.pending_of("register"):
            # No uuid, whatever the outbox says was delivered before (a SIGKILL between the answer and
            # the uuid being kept, another label): register now, so children start knowing who they are.
            self._queue_register()

    def _stored_identity(self) -> tuple[str | None, str | None]:
        """The uuid and runner_id an earlier start kept, held to the rules a fresh answer is: one that fails
        them (a file from an older version, a manager that answered garbage then) is dropped, and registering
        again (idempotent per label) gets the real one."""
        uuid, runner_id = self.outbox.get("uuid") or None, self.outbox.get("runner_id") or None
        if uuid is None:
            return None, None
        try:
            return check_uuid(uuid), check_runner_id(runner_id)
        except AnswerError as exc:
            self._log(f"manager: the identity kept from an earlier start is unusable ({exc}); registering afresh")
            self.outbox.put("uuid", "")
            self.outbox.put("runner_id", "")
            return None, None

    def _queue_register(self) -> None:
        self.outbox.add("register", self._identity())

    def _identity(self) -> dict[str, Any]:
        return {"label": self.spec.label, "min_rate": self.spec.min_rate}

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
            retries = 0

            def on_retry(error: str, delay: float, call: Call = call) -> None:
                nonlocal retries
                retries += 1
                self.last_error = error
                self.outbox.attempted(call.id, error)
                if retries == 1 or retries % RETRY_LOG_EVERY == 0:
                    self._loop.call_soon_threadsafe(lambda: self._log(
                        f"manager: {call.kind} not delivered ({error}); retry {retries} in {delay:.1f}s"))

            try:
                answer = self._client.with_retries(lambda call=call: self._attempt(call), self._stop, on_retry)
            except PermanentError as exc:
                self.last_error = str(exc)
                self.outbox.failed(call.id, str(exc))
                self._loop.call_soon_threadsafe(lambda exc=exc, call=call: self._refused(call, exc))
                continue
            except TransientError:
                return  # stopping: the call stays pending in the outbox
            self.outbox.delivered(call.id, answer.body)
            self.last_delivered = {"kind": call.kind, "id": call.id, "at": time.time()}
            self._delivered(call, answer)

    def _next_call(self) -> Call | None:
        """The next call to deliver: in order, except that registration goes first while no uuid is known.

        Every other call needs the uuid, so none is sent (nor given up) before a register succeeded,
        wherever the register stands in the queue (an outbox of an earlier start, a lost uuid).
        """
        call = self.outbox.next_pending()
        if call is None or call.kind == "register" or self.uuid:
            return call
        register = self.outbox.next_pending_of("register")
        if register is None:
            self._queue_register()
            register = self.outbox.next_pending_of("register")
        return register

    # ------------------------------------------------------------ one call

    def _attempt(self, call: Call) -> Answer:
        if call.kind == "register":
            return self._register()
        if call.kind == "bench-done":
            return self._bench_done(call)
        if call.kind in ("param-done", "running"):
            return self._client.request("POST", f"/{call.kind}", json_body={"uuid": self.uuid}, want_json=False)
        if call.kind == "log":
            return self._client.request(
                "POST", "/api/log-push", data=call.payload.get("text", "").encode()[:LOG_PUSH_LIMIT],
                want_json=False, headers={"X-Instance-UUID": self.uuid or "",
                                          "X-Log-Source": call.payload.get("source", "setup"),
                                          "Content-Type": "text/plain; charset=utf-8"})
        raise PermanentError(0, f"unknown outbox call kind {call.kind!r}")

    def _register(self) -> Answer:
        # Who this start is, whatever an earlier start queued (its label may have been another).
        try:
            answer = self._client.request("POST", "/register", json_body=self._identity())
        except PermanentError as exc:
            # Refused (a 4xx): retried with the same backoff as a manager that is down, never dropped.
            # Nothing else can go without the uuid, and registering again is harmless (idempotent).
            raise TransientError(f"/register refused: HTTP {exc.status}: {exc.body[:200]}") from None
        try:
            identity = register_answer(answer.body)
        except AnswerError as exc:
            # Never kept, never exported: retried until the manager gives one a child can carry.
            raise TransientError(f"the manager answered /register with an {exc}") from None
        return Answer(answer.status, {"uuid": identity.uuid, "runner_id": identity.runner_id})

    def _bench_done(self, call: Call) -> Answer:
        body = {"uuid": self.uuid, "rate": call.payload.get("rate", 0.0)}
        if self.spec.bench_done_reason and call.payload.get("reason"):
            body["reason"] = call.payload["reason"]  # only for a manager that reads it (README)
        answer = self._client.request("POST", "/bench-done", json_body=body)
        try:
            passed = bench_answer(answer.body)
        except AnswerError as exc:
            raise TransientError(f"the manager answered /bench-done {exc}") from None
        return Answer(answer.status, {"passed": passed})

    # ------------------------------------------------------------ what an answer means

    def _delivered(self, call: Call, answer: Answer) -> None:
        if call.kind == "register":
            # What _register checked: a safe uuid, and digits or None.
            self.uuid, self.runner_id = answer.body["uuid"], answer.body["runner_id"]
            self.outbox.put("uuid", self.uuid)
            self.outbox.put("runner_id", self.runner_id or "")
            self._loop.call_soon_threadsafe(self._registered)
        elif call.kind == "bench-done" and not call.payload.get("failed"):
            # A give-up (failed) has no production to let through or stop: its answer changes nothing.
            passed = answer.body["passed"]
            rate = float(call.payload.get("rate", 0.0))
            self._loop.call_soon_threadsafe(lambda: self._on_bench_answer(passed, rate))

    def _refused(self, call: Call, exc: PermanentError) -> None:
        self._log(f"manager: {call.kind} refused for good: HTTP {exc.status}: {exc.body[:300]!r}")
        if call.kind == "bench-done":
            self._on_bench_refused()  # no answer will ever come

    def _registered(self) -> None:
        assert self.uuid is not None
        self._log(f"manager: registered: uuid {self.uuid}, runner_id {self.runner_id}")
        self._on_identity(self.uuid, self.runner_id)
