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

A uuid the manager no longer knows (404 ``instance not found``, and its ``/runner-id`` answers the same: its
database was reset, or the 7-day cleanup removed the row) is dropped: the label is registered again (the
manager gives a new uuid, which later children get), and the call is sent again with it, then the rest of
the queue; the owner hears it (``registered_again``: what was pushed under the old uuid goes again). Not
a loop: the same answer right after a fresh register is refused for good, and an instance given up
(``retire``) or killed is never registered again (the manager would hand a destroyed machine a new row), but for
the give-up's own call: answered 404 ``instance not found``, it destroyed nothing (there was no row to kill), so
the label is registered again, once, and the give-up goes under the new uuid. One refused for good all the same
is said (``on_give_up_refused``): nothing destroys the machine then.
A killed row answers ``/running`` with the same 404 (``or already killed``), but ``/runner-id`` with 200.

The manager's own view (rowwatch.py): the row is read once the manager knows the instance, before each
lifecycle call (``CallKind.checks_row``) and each of its retries, right after each is delivered (but for one with
another next), and every ``row_check_s`` while idle or while a call waits between its tries. A killed row ends it
(``on_killed``, once): no lifecycle call goes out any more, and no re-registration. A row the periodic read
finds gone (not listed, and its ``/runner-id`` answers 404 ``instance not found``), at any stage, is registered
again the same way, once a stage, and the last lifecycle call delivered goes again under the new uuid. Its
answer does not decide again what its first answer decided (a plugin's ``delivered`` is not told twice); only an
answer that means the manager killed the new row (``CallKind.again``) counts, and ends the instance as a killed
row does.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from ..config import ManagerSpec
from ..engine.loop import EventLoop
from ..text import Log
from ..text.show import cut, shown, summary
from .answers import AnswerError, check_uuid, register_answer
from .callkinds import LOG, REGISTER, SENT_AGAIN, CallKind, CallKinds, Payload
from .client import Answer, ManagerClient, PermanentError, TransientError
from .row import KILLED, Row
from .rowwatch import UNKNOWN_INSTANCE, RowReading, RowWatch, unknown_instance
from .view import HearsTheRow, Unheard

if TYPE_CHECKING:  # (sqlite3 with it: the outbox is opened only once a manager is configured, reporting.py)
    from .outbox import Call, Outbox

# Retries are logged on the first failure, then once every this many.
RETRY_LOG_EVERY = 10
# With nothing to deliver, the thread looks at the outbox again after this long even if not woken.
IDLE_WAIT_S = 1.0
# A 404 whose meaning /runner-id could not tell (the manager down again): the call waits this long, then goes again.
CONFIRM_RETRY_S = 5.0
# A bug of ours while delivering a call (a plugin's body that raises, the outbox's own error): the thread lives
# on, waits this long and tries again; a call that meets a bug this many times in a row is failed, so the
# calls behind it go (in order, nothing could ever pass it).
BUG_WAIT_S = 5.0
BUG_TRIES = 3
# A durable log push that the manager itself answered with one of these this many times in a row has a route that
# fails while the manager is up (a 500 of /api/log-push, its log store broken): the lifecycle calls behind it go
# first (a give-up must not wait for good behind the reason lines it follows), and it is tried again after them.
# A manager down (no answer, 502/503/504 from a proxy, 429) keeps the order: every call would wait alike.
ROUTE_FAILED = (500, 501, 505)
LOG_ROUTE_TRIES = 3
# Once the exit flush has begun, a call is tried again at least this often, whatever its backoff (up to
# RETRY_MAX_S) or a Retry-After would wait: the flush waits at most GIVE_UP_FLUSH_S (60 s) for a give-up, and
# with the backoff's 30 s a manager back in its last half was never tried again. A give-up the manager does not
# hear is an instance paid for until its timeout; a few calls 5 s apart for a minute are no storm.
FLUSH_RETRY_MAX_S = 5.0


class _NotSent(Exception):
    """A row-checking call found the row killed before a retry: it is not sent again (raised out of the retries)."""


class _Overtaken(Exception):
    """A log push whose route fails lets the calls behind it go first (raised out of its retries; it stays pending)."""


# The facts key of the last lifecycle call (param-done, running, a plugin's bench-done) delivered, with the uuid
# it went under ("<uuid> <kind>"): where that row stands. A forgotten row is brought back there
# (_register_forgotten); calls another uuid's row took (a state_dir of another label, a start --fresh) are not
# this row's, and a /register answered with the same uuid keeps it.
ROW_STAGE = "row_stage"


class Sender:
    """Delivers the outbox's calls on its own thread; it alone writes the identity the manager gave.

    ``on_identity(uuid, fields)`` (the answer's checked fields beside the uuid), ``view`` (what the row
    says) and each kind's ``delivered`` and ``refused`` are called in the loop's thread; ``on_delivered`` on
    this one, after each call the manager took.
    """

    def __init__(self, spec: ManagerSpec, outbox: Outbox, client: ManagerClient, loop: EventLoop, log: Log,
                 calls: CallKinds, *, on_identity: Callable[[str, Mapping[str, str | None]], None],
                 on_delivered: Callable[[], None] | None = None, view: HearsTheRow | None = None,
                 on_give_up_refused: Callable[[str, str], None] | None = None) -> None:
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
        self._retired = False  # given up for good: a forgotten uuid is not registered again (but for the give-up)
        self._given_up = False  # retired by ``retire`` (not by a kill read): a kill read since is not news
        self._give_up: tuple[str, dict[str, Any]] | None = None  # the call that gives it up (kind, payload): retire
        self._on_give_up_refused = on_give_up_refused  # (kind, why), on the loop's thread
        # Given up, with no uuid here and no give-up to deliver: nothing is worth a new row (retired_before).
        self._never_register = False
        self._ours_before = False  # the outbox held this label's identity when this start found it (restore_identity)
        self.last_error_at: float | None = None  # epoch: when last_error happened
        self.failed_attempts = 0  # attempts that failed and were retried (the exit flush: a manager down, not slow)
        self._stop = threading.Event()
        self._wake = threading.Event()
        # Cuts a retry's wait (its backoff, up to RETRY_MAX_S, or a Retry-After) short: the stop, the exit flush's
        # start, the manager answering the log pushes again (retry_now).
        self._hurry = threading.Event()
        self._flushing = False  # the exit flush has begun (flushing): retries wait at most FLUSH_RETRY_MAX_S
        self._overtakable = False  # a log push whose route fails waits between its tries: a call queued cuts it (wake)
        self._thread: threading.Thread | None = None
        self._in_hand: Call | None = None  # the call being delivered (the thread's own: a bug fails it in time)
        self._overtaken: int | None = None  # a log push whose route fails: the calls behind it go first
        # The manager's own view (rowwatch.py): read on this thread, heard on the loop's.
        self.rows = RowWatch(client, spec.row_check_s, fields=calls.row, on_bug=self._row_bug)
        self.killed: Row | None = None  # the row said killed: no lifecycle call goes out any more
        self._view: HearsTheRow = view if view is not None else Unheard()
        self._forgotten_uuid: str | None = None  # dropped for a forget; its successor is told once registered
        # The stages (the last lifecycle call delivered; None: none yet) at which the periodic read found the uuid
        # forgotten and registered it again: once each, so a manager that forgets every row is not asked again
        # and again, yet a second reset later on (a fetch's, then production's) is not left unregistered.
        self._registered_by_watch: set[str | None] = set()

    # ------------------------------------------------------------ who we are to the manager

    def restore_identity(self, given_up: bool = False) -> None:
        """The uuid an earlier start registered under this label, if any; else a register is queued. ``given_up``:
        an earlier start gave this label up (retired_before decides next whether it is registered at all)."""
        stored_label = self.outbox.get("label")
        self._ours_before = stored_label == self.spec.label and bool(self.outbox.get("uuid")
                                                                     or self.outbox.pending_of(REGISTER))
        if stored_label is not None and stored_label != self.spec.label:
            # The state volume belonged to another instance: its uuid is not ours, nor is what it left pending (its
            # param-done or running would move our new row past our own fetch, its log pushes land in our tabs).
            # Every call of this start comes later; a register is kept: it is sent as who this start is.
            left = self.outbox.fail_pending(f"set aside: queued as {stored_label!r}, the label this state_dir had "
                                            f"before {self.spec.label!r}", lambda call: call.kind != REGISTER)
            self.outbox.begin_anew()  # (what it delivered, its bench-done's answer among it, is not ours either)
            aside = (f"; the {len(left)} call(s) it left pending ({', '.join(_counted(left))}) are set aside, "
                     "not sent under this instance's uuid" if left else "")
            then = "its uuid is not this instance's" if given_up else "registering afresh"
            self._log(f"manager: state_dir was registered as {stored_label!r}, not {self.spec.label!r}; {then}{aside}")
            self.outbox.put("uuid", "")
            self.outbox.put(ROW_STAGE, "")  # (nor is where its row stood: not even an older outbox's history)
        self.outbox.put("label", self.spec.label)
        self.uuid, self.fields = self._stored_identity()
        if self.uuid:
            shown = f" ({', '.join(f'{k} {v}' for k, v in self.fields.items())})" if self.fields else ""
            self._log(f"manager: reusing uuid {self.uuid}{shown} from an earlier start")
            self._on_identity(self.uuid, dict(self.fields))
            self.rows.soon()
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
        return self._calls.register_body(self.spec.label)

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._deliver_forever, name="outbox", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Something was added to the outbox: deliver it now rather than at the next idle look. A call other than a
        log push, queued while a log push whose route fails waits out its backoff (up to RETRY_MAX_S), goes now: the
        calls behind such a push go first (ROUTE_FAILED), and a report must not wait for its next try."""
        self._wake.set()
        if self._overtakable and self.outbox.next_pending_except(LOG) is not None:
            self._hurry.set()

    def retry_now(self) -> None:
        """The call being retried goes now, not once its wait runs out (any thread): the manager answered again.
        Once: a failure waits as it would."""
        self._hurry.set()
        self._wake.set()

    def flushing(self) -> None:
        """The exit flush has begun (any thread): the call being retried goes now, and every retry from now on
        waits at most FLUSH_RETRY_MAX_S, so a manager back at any moment of the flush is heard in time."""
        self._flushing = True
        self.retry_now()

    def _longest_wait(self) -> float | None:
        """The most a retry may wait now (None: what the backoff or a Retry-After says)."""
        return FLUSH_RETRY_MAX_S if self._flushing else None

    def _retry_wait(self, seconds: float, overtakable: bool = False) -> None:
        """The wait between two tries of a call, cut short by a hurry (retry_now, the stop; ``overtakable``, a log
        push whose route fails: a call queued behind it, wake). The periodic read of
        the row goes on meanwhile: a call of any kind may be retried for as long as the manager refuses it (a
        durable log push its log route answers 503, a Retry-After of 300 s, again and again), and the manager's
        own kill must not wait for it. A kill read here stops the lifecycle (_killed_by); a lifecycle call in
        retry is then not sent (its next try reads ``killed``)."""
        end = time.monotonic() + seconds
        self._overtakable = overtakable
        if overtakable and self.outbox.next_pending_except(LOG) is not None:
            end = 0.0  # (queued before the wait began, its wake found no wait to cut; one queued since cuts it so)
        while (left := end - time.monotonic()) > 0:
            due_in = self.rows.due_in() if self.uuid and self.killed is None else None
            if self._hurry.wait(left if due_in is None else min(left, due_in)):
                break
            if self.uuid and self.killed is None and self.rows.due():
                self._read_row()
        self._overtakable = False
        self._hurry.clear()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ask_to_stop(self) -> None:
        """Stop after the call in flight; what is not delivered stays pending in the outbox."""
        self._stop.set()
        self._hurry.set()  # (a retry's wait ends now: the stop is looked at once it does)
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _deliver_forever(self) -> None:
        # The only deliverer of the run's reports: a bug of ours in one call is said and outlived, never its end.
        bugs: tuple[int | None, int] = (None, 0)  # the call that met a bug, how many times in a row
        while not self._stop.is_set():
            self._in_hand = None
            try:
                if not self._deliver_next():
                    return  # stopping: the call stays pending in the outbox
            except Exception as exc:
                call_id = self._in_hand.id if self._in_hand is not None else None
                bugs = (call_id, bugs[1] + 1 if bugs[0] == call_id else 1)
                self._bug(exc, bugs[1])
                self._stop.wait(BUG_WAIT_S)
            else:
                bugs = (None, 0)

    def _bug(self, exc: Exception, times: int) -> None:
        """A bug met while delivering (said with its traceback once, by the loop's faults); the call in hand
        is failed once it met one BUG_TRIES times in a row. What the machine refused (no fd left, a full
        disk: an OSError) is no bug and not the call's: one line now and then, and the call waits."""
        call = self._in_hand
        self.last_error, self.last_error_at = summary(exc), time.time()
        if isinstance(exc, OSError):
            if times == 1 or times % RETRY_LOG_EVERY == 0:
                self._loop.call_soon_threadsafe(lambda: self._log(
                    f"manager: delivery held up ({summary(exc)}); trying again in {BUG_WAIT_S:g}s"))
            return
        self._loop.call_soon_threadsafe(lambda: self._loop.faults.report("the outbox sender", exc))
        if call is None or times < BUG_TRIES or call.kind == REGISTER:
            return  # (a register is never given up: every other call needs the uuid; it goes again)
        try:
            # (no attempt counted: the bug may have come before the request went, a plugin's body that raised;
            # the tries that failed before it were counted as they failed)
            self.outbox.failed(call.id, f"a bug of ours: {summary(exc)}", sent=False)
        except Exception:
            return  # the outbox itself is what fails: the call stays, and is tried again
        self._loop.call_soon_threadsafe(lambda: self._log(
            f"manager: {call.kind} failed for good: a bug of ours met {times} times ({cut(summary(exc), 200)}); "
            "the calls behind it go on"))

    def _deliver_next(self) -> bool:
        """Deliver the next call (or wait a little for one); False once asked to stop."""
        call = self._next_call()
        if call is None:
            self._watch_row()
            self._wake.wait(IDLE_WAIT_S)
            self._wake.clear()
            return True
        self._in_hand = call
        if call.kind not in self._kinds:
            self._unknown(call)
            return True
        checks_row = self._kinds[call.kind].checks_row
        if checks_row and self._killed_before(call, call.attempts > 0):
            return True
        retries = 0
        broken = 0  # a log push's answers in a row that say its route fails (ROUTE_FAILED)
        self._hurry.clear()  # (a hurry meant for a call already delivered does not cut this one's first wait)

        def on_retry(error: str, delay: float, call: Call = call) -> None:
            nonlocal retries
            retries += 1
            self.failed_attempts += 1
            self.last_error, self.last_error_at = error, time.time()
            self.outbox.attempted(call.id, error)
            if retries == 1 or retries % RETRY_LOG_EVERY == 0:
                # (the line made now: said on the loop later, ``retries`` may have moved on meanwhile)
                line = f"manager: {call.kind} not delivered ({error}); retry {retries} in {delay:.1f}s"
                self._loop.call_soon_threadsafe(lambda: self._log(line))

        def overtakable() -> bool:  # a log push whose route fails: the calls behind it go first (ROUTE_FAILED)
            return call.kind == LOG and (broken >= LOG_ROUTE_TRIES or self._overtaken == call.id)

        def attempt(call: Call = call) -> Answer:
            nonlocal broken
            # tenacity tries once more after a sleep the stop cut short: not once the stop is asked, or a delivery
            # could land in an outbox already closed (the call stays pending for the next start).
            if self._stop.is_set():
                raise TransientError("stopping")
            if overtakable() and self.outbox.next_pending_except(LOG) is not None:
                raise _Overtaken
            # Each retry of a call that checks the row reads it again first: a retry may come minutes later,
            # and a bench-done sent after the manager killed the row meanwhile would un-kill it.
            if checks_row and retries and self._killed_before(call, tried=True):
                raise _NotSent
            try:
                return self._attempt(call)
            except TransientError as exc:
                broken = broken + 1 if exc.status in ROUTE_FAILED else 0
                raise

        try:
            answer = self._client.with_retries(attempt, self._stop, on_retry,
                                               lambda seconds: self._retry_wait(seconds, overtakable()),
                                               self._longest_wait)
        except _NotSent:
            return True  # the row was killed while the call was retried: done with, and said (_killed_before)
        except _Overtaken:
            if self._overtaken != call.id:
                self._overtaken = call.id
                line = (f"manager: log push {call.id} answered {broken} times in a row that its route fails "
                        f"({cut(self.last_error or '', 200)}): the calls behind it go first, then it again")
                self._loop.call_soon_threadsafe(lambda: self._log(line))
            return True  # it stays pending, at the head of the queue: _next_call passes it while others wait
        except PermanentError as exc:
            self.last_error, self.last_error_at = str(exc), time.time()
            if self._forgotten(call, exc):
                return True  # the call stays pending: it goes again once registered anew
            self.outbox.failed(call.id, str(exc), sent=True)
            self._loop.call_soon_threadsafe(partial(self._refused, call, exc))
            return True
        except TransientError:
            return False  # stopping: the call stays pending in the outbox
        self.outbox.delivered(call.id, answer.body)
        if call.kind != REGISTER:
            self._registered_again = False
        self.last_delivered = {"kind": call.kind, "id": call.id, "at": time.time()}
        self.last_error = self.last_error_at = None  # a delivery clears the error: the manager is back
        self._delivered(call, answer)
        if self._on_delivered is not None:
            self._on_delivered()
        return True

    def _next_call(self) -> Call | None:
        """The next call to deliver: in order, except that registration goes first while no uuid is known, and
        that the calls behind a log push whose route fails go before it (ROUTE_FAILED).

        Every other call needs the uuid, so none is sent (nor given up) before a register succeeded,
        wherever the register stands in the queue (an outbox of an earlier start, a lost uuid).
        """
        call = self.outbox.next_pending()
        while call is not None and not self.uuid and self._never_register:
            self.outbox.failed(call.id, "not sent: given up, with no uuid here (not registered again)", sent=False)
            call = self.outbox.next_pending()
        if call is not None and self.uuid and call.id == self._overtaken:
            call = self.outbox.next_pending_except(LOG) or call  # (its route fails: the calls behind it go first)
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
        self.outbox.failed(call.id, error, sent=False)
        self._loop.call_soon_threadsafe(lambda: self._log(
            f"manager: outbox call {call.id} refused for good: {error} (written by another version?)"))

    def retire(self, give_up: tuple[str, Mapping[str, Any]] | None = None) -> None:
        """This instance was given up (any thread; before ``give_up``, its call's kind and payload, is queued): a uuid
        the manager forgot is not registered again, but for that call (_forgotten)."""
        if give_up is not None:
            self._give_up = (give_up[0], dict(give_up[1]))
        self._retired = self._given_up = True

    def _gives_up(self, call: Call) -> bool:
        return self._give_up is not None and (call.kind, call.payload) == self._give_up

    def retired_before(self, give_up: tuple[str, dict[str, Any]] | None, why: str, named: bool = True) -> int | None:
        """An earlier start gave this instance up (givenup.py), before the thread starts: it is retired, and no
        lifecycle call that start left pending goes out but the give-up's own (``give_up``: its kind and payload).
        A bench-done that passed, queued before the manager killed the row, would move it back, were the look-up
        before it to fail. The give-up's call is queued again if the outbox, this instance's, never held it (a SIGKILL
        between the marker and the queue). With no uuid here and no give-up to deliver, the label is never registered
        (a new row, only to be left). Returns the give-up's id while it is pending (the exit flush waits for it).
        ``named`` False: the marker does not say which call gave it up (an older version's): the pending calls all
        go, as then."""
        self.retire(give_up if named else None)
        if not named:
            return None
        kept = self.outbox.find(*give_up) if give_up is not None else None
        if give_up is not None and kept is None:
            if self._ours_before:
                kept = (self.outbox.add(*give_up), "pending")
                self._log(f"manager: the give-up's {give_up[0]} was never queued (the supervisor was stopped between "
                          "remembering it and queueing it): queued now")
            else:  # (a new outbox, or another label's: no uuid of this instance to send it under)
                self._log(f"manager: the give-up's {give_up[0]} is not in this outbox, which does not know this "
                          "instance: not sent (the manager's own timeout ends its row)")
        keep_id = kept[0] if kept is not None and kept[1] == "pending" else None
        row_kinds = set(self._lifecycle_kinds())
        left = self.outbox.fail_pending(f"not sent: {why}", lambda call: call.kind in row_kinds and call.id != keep_id)
        if left:
            self._log(f"manager: {len(left)} call(s) left pending before the give-up ({', '.join(_counted(left))}) "
                      "are not sent: they could move the row back")
        if not self.uuid and keep_id is None:
            # Registering would give the label a new row (a killed one's label is registered anew) only to leave it.
            self._never_register = True
            self.outbox.fail_pending(f"not sent: {why}; no uuid here, and nothing to deliver worth a new row",
                                     lambda call: call.kind == REGISTER)
        return keep_id

    def _forgotten(self, call: Call, exc: PermanentError) -> bool:
        """A 404 ``instance not found`` (``or already killed``, on /running): True when handled here. Only a
        uuid the manager no longer has (its /runner-id answers 404 ``instance not found``) is dropped, so that the
        label is registered again before the call goes again (see the module docstring); a killed row (its /runner-id
        answers 200) ends the instance; one that cannot be told waits and goes again. False: a refusal."""
        if call.kind in (REGISTER, LOG) or self._registered_again or (self._retired and not self._gives_up(call)) \
                or not unknown_instance(exc) or not self.uuid:
            return False
        gone = self.rows.gone(self.uuid)
        if gone is None:
            self.outbox.attempted(call.id, f"{exc}; /runner-id could not tell a forgotten uuid from a killed one")
            self._stop.wait(CONFIRM_RETRY_S)
            return True
        if not gone:  # the manager has the row and refused a lifecycle call: killed (shared/domain/manager-api.md)
            if self._read_row().row is None and self.killed is None:  # GET /status could not say why
                self._killed_by(Row(self.uuid, KILLED, kill_reason=f"not read: {call.kind} answered HTTP 404 "
                                    f"{shown(exc.body, 80)} while its /runner-id still has the row"), always=True)
            if self.killed is None:
                return False
            self.outbox.failed(call.id, f"{exc}: {self.killed.kill_line()}", sent=True)
            return True
        self.outbox.attempted(call.id, str(exc))
        given_up = "; given up: only so that the give-up goes under the new uuid" if self._retired else ""
        self._drop_uuid(f"404 {UNKNOWN_INSTANCE}: its database was reset or the instance cleaned up",
                        f" (its /runner-id answers 404: the row is gone, not killed){given_up}")
        return True

    def _drop_uuid(self, why: str, after: str = "") -> None:
        """Forget the uuid (and its fields) the manager forgot: the label is registered again, once."""
        self._registered_again = True
        forgotten, self.uuid, self.fields = self.uuid, None, {}
        self._forgotten_uuid = forgotten
        for name in ("uuid", *self._calls.answer_fields):
            self.outbox.put(name, "")
        if not self.outbox.pending_of(REGISTER):  # (with nothing else queued, nothing would ask for it: _next_call)
            self._queue_register()
        self._loop.call_soon_threadsafe(lambda: self._log(
            f"manager: the manager no longer knows uuid {forgotten} ({why}); registering again{after}"))

    # ------------------------------------------------------------ the manager's own view (rowwatch.py)

    def _read_row(self) -> RowReading:
        """One look-up of our row; the loop hears it (and a kill, once)."""
        assert self.uuid is not None
        reading, notes = self.rows.read(self.uuid)
        for note in notes:
            self._loop.call_soon_threadsafe(partial(self._log, f"manager: {note}"))
        self._loop.call_soon_threadsafe(lambda: self._view.heard_row(reading))
        if reading.row is not None and reading.row.killed and self.killed is None:
            self._killed_by(reading.row)
        return reading

    def _row_bug(self, exc: Exception) -> None:
        """A bug of ours reading the row (rowwatch.py: the reading counts as no usable answer): said with its
        traceback, once, then counted, by the loop's faults, as any contained bug is."""
        self._loop.call_soon_threadsafe(lambda: self._loop.faults.report("reading the manager's row", exc))

    def _killed_by(self, row: Row, always: bool = False) -> None:
        """Nothing that could un-kill the row goes out from now on. The view hears the kill, on the loop's thread,
        unless (``always`` False) the instance was given up by then: here, by an earlier start, or on an answer the
        plugin took for the manager's no (the prover's passed: false, heard just before the read after it): the
        kill is its consequence, not news to tell."""
        self.killed, self._retired = row, True
        self._loop.call_soon_threadsafe(lambda: self._view.heard_kill(row) if always or not self._given_up else None)

    def _killed_before(self, call: Call, tried: bool) -> bool:  # (before its first attempt, and before each retry)
        """Before a lifecycle call: the row is read, and a killed one gets no call (its bench-done would
        un-kill it; the manager's word on it is final). True: the call is done with, not sent (again). The give-up
        ``tried`` before (a try counted, by this start or an earlier one) is delivered: the kill is the manager's
        answer to it, the answer itself lost (cut off by our timeout, or by a SIGKILL before it was recorded)."""
        if self.uuid and self.killed is None:
            self._read_row()
        if self.killed is None:
            return False
        line = self.killed.kill_line()
        if tried and self._gives_up(call):
            self.outbox.delivered(call.id, {"row": KILLED}, sent=False)  # (the try that got there was counted)
            said = f"manager: {call.kind} delivered: the row is killed ({line}); its answer did not come back"
        else:
            self.outbox.failed(call.id, f"not sent: {line}", sent=False)
            said = f"manager: {call.kind} not sent: {line}"
        self._loop.call_soon_threadsafe(lambda: self._log(said))
        return True

    def _watch_row(self) -> None:
        """Nothing to deliver: the periodic look-up, when due. A uuid the manager forgot, at any stage, is
        registered again (_register_forgotten): nothing else would notice in time. The log pushes answer 204
        for any uuid, and the next lifecycle call may be an hour off (a fetch lasts up to 90 min, and a label
        seen on Vast but never registered is killed after 15). Once a stage; after that status shows it
        unknown to the manager."""
        if not self.uuid or not self.rows.due():
            return
        reading = self._read_row()
        if not reading.unlisted or self._retired or self._registered_again:
            return  # (registered again already, and nothing delivered since: the same forget, not a new one)
        stage = self._row_stage()
        last = self.outbox.last_delivered_of([stage]) if stage is not None else None
        if stage not in self._registered_by_watch and self.rows.gone(self.uuid) is True:
            self._register_forgotten(last)

    def _row_stage(self) -> str | None:
        """The last lifecycle call delivered under the uuid now kept (None: none yet). The manager answers a
        /register of a label it knows with the same uuid: that row's stage still holds."""
        stored = self.outbox.get(ROW_STAGE)
        if stored is None:  # (an outbox of a version that kept no stage: its uuid's calls are all it has)
            return getattr(self.outbox.last_delivered_of(self._lifecycle_kinds()), "kind", None)
        uuid, _, kind = stored.partition(" ")
        return kind if uuid == self.uuid and kind else None

    def _lifecycle_kinds(self) -> list[str]:
        """The calls that move the manager's row (param-done, running, a plugin's bench-done)."""
        return [name for name, kind in self._kinds.items() if kind.checks_row]

    def _register_forgotten(self, last: Call | None) -> None:
        """The row is gone (GET /status does not list it, its /runner-id answers 404): the label is registered
        again and the last lifecycle call delivered sent again under the new uuid, so that the new row (in
        ``registered``) stands where the old one did; ``running`` and ``bench-done`` are taken in any state."""
        self._registered_by_watch.add(last.kind if last is not None else None)
        forgotten = self.uuid
        if not self.outbox.pending_of(REGISTER):  # (queued first: the outbox, and status's ledger, in sending order)
            self._queue_register()
        # After the register, which goes first; marked, so that its answer does not decide again (_delivered). Not
        # where a later lifecycle call was queued meanwhile (the look-up took two calls): sent after it, the old
        # stage's call would move the new row back (bench-done is taken in any state, running too); the later
        # call alone stands, as after a 404 on it.
        sent_again = last is not None and self.outbox.add_unless_pending(
            last.kind, {**last.payload, SENT_AGAIN: forgotten}, self._lifecycle_kinds()) is not None
        again = f", once, and {last.kind} sent again under the new uuid" if last is not None and sent_again else (
            ", once")
        self._drop_uuid("forgotten: its GET /status does not list it, its /runner-id answers 404", again)

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
            raise TransientError(f"/register refused: HTTP {exc.status}: {cut(exc.body, 200)}") from None
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
        # The manager knows us: its row is read now (its registered_at, a plugin's fields), whatever is queued
        # next (a lifecycle call right behind the register would otherwise take this read's place), then every
        # row_check_s.
        self.rows.soon()
        self._read_row()

    # ------------------------------------------------------------ what an answer means

    def _delivered(self, call: Call, answer: Answer) -> None:
        kind = self._kinds[call.kind]
        if kind.checks_row:  # a lifecycle call: the row under this uuid stands there now
            self.outbox.put(ROW_STAGE, f"{self.uuid} {call.kind}")
        if kind.keep is not None:
            kind.keep(call.payload, answer.body)  # before the next call goes out (it may need it)
        delivered = kind.delivered
        if call.payload.get(SENT_AGAIN):
            self._delivered_again(call, kind, answer)
        elif delivered is not None:
            self._loop.call_soon_threadsafe(lambda: delivered(call.payload, answer.body))
        # Where it moved the row, at the manager's time, heard now; a lifecycle call next reads it before it goes.
        after = self.outbox.next_pending_except(LOG)
        reads_next = after is not None and after.kind in self._lifecycle_kinds()
        if kind.checks_row and self.uuid and self.killed is None and not reads_next:
            self._read_row()

    def _delivered_again(self, call: Call, kind: CallKind, answer: Answer) -> None:
        """A lifecycle call sent again under the new uuid of a forgotten row (_register_forgotten) was answered.
        Its first answer decided what it meant, and that was said and acted on then (the prover's gate let
        production through on bench-done's passed: true): telling ``delivered`` again would decide and say it all
        again. Only what the new row makes of it counts: an answer that means a kill (``kind.again``: bench-done
        answered passed: false, the new row's min_rate above the rate the old one passed) ends the instance as
        any kill its row shows does, in the manager's own words where its row says them."""
        why = kind.again(call.payload, answer.body) if kind.again is not None else None
        if why is None:
            line = (f"manager: {call.kind} delivered again under uuid {self.uuid}; what its first answer under "
                    f"{call.payload.get(SENT_AGAIN)} decided stands")
            self._loop.call_soon_threadsafe(lambda: self._log(line))
            return
        if self.killed is None and self.uuid:
            self._read_row()  # (the row's kill_reason and killed_at: the manager's own words for it)
        if self.killed is None:  # the row not read, or not saying killed yet: the answer's word is the manager's
            self._killed_by(Row(self.uuid or "", KILLED, kill_reason=why))

    def _refused(self, call: Call, exc: PermanentError) -> None:
        self._log(f"manager: {call.kind} refused for good: HTTP {exc.status}: {shown(exc.body, 300)}")
        kind = self._kinds.get(call.kind)
        if kind is not None and kind.refused is not None:
            kind.refused(call.payload)  # e.g. no answer will ever come to wait for
        if self._gives_up(call) and self._on_give_up_refused is not None:
            self._on_give_up_refused(call.kind, f"HTTP {exc.status}: {shown(exc.body, 120)}")

    def _registered(self) -> None:
        assert self.uuid is not None
        shown = "".join(f", {k} {v}" for k, v in self.fields.items())
        self._log(f"manager: registered: uuid {self.uuid}{shown}")
        self._on_identity(self.uuid, dict(self.fields))
        forgotten, self._forgotten_uuid = self._forgotten_uuid, None
        if forgotten is not None:
            self._view.registered_again(forgotten, self.uuid)


def _counted(kinds: list[str]) -> list[str]:
    """Each kind once, in the order first met, with how many there were: ``["param-done", "3 log"]``."""
    return [kind if n == 1 else f"{n} {kind}" for kind, n in Counter(kinds).items()]
