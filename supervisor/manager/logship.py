"""Shipping output to the manager's ``/api/log-push``, and events to an optional ``events_url``.

Lines are queued per source (the manager dashboard's tab: ``setup`` for the supervisor's own lines,
each phase's ``log_source`` for its children's) as the Reporter hands them over: masked where they
entered the supervisor, escape codes stripped, labelled. A thread pushes them in batches: every
``log_push_interval_s`` or once ``BATCH_BYTES`` are waiting, never more than ``PUSH_MAX_BYTES`` per
push (the manager silently drops what is past 256 KiB), split on line boundaries. While the manager
is down each source keeps a bounded backlog: the oldest lines go first, and the next push says how
many. This is the best-effort road: what must arrive (the manager calls, a failure's verdict, the
"exiting" line) goes through the outbox, cut into push-sized bodies the same way (``push_bodies``), and
the lines still queued here for that source go into the outbox ahead of it (Reporter.push_text), so the
order holds. Every body is encoded one way (client.text_body): a lone surrogate from the environment is
replaced, never an error that ends the shipping. A call the outbox delivered means the manager is back:
the shipper's retry backoff is reset and it pushes at once (``manager_answers``), so the logs of an outage
arrive right behind its calls; the other way round, a push taken after one was refused tells the outbox's
sender (``on_back``), whose call then goes at once rather than after its own backoff. Pushes go through
the manager client's rules (client.py): a total deadline, a bounded answer, no redirect followed (a
redirected push is not delivered: it is kept and sent again), Retry-After honoured. The supervisor's own
first lines, logged before there is a shipper to hand them to, wait in ``EarlyLines``. The events for an
``events_url`` go the same way but as NDJSON (``EventShipper``): whole objects only, never cut, a drop said
by an event of its own rather than the text note.

A shipper is a watch (evidence/watchstate.py, ``state``: shown in status with the others, its lines said by the
loop's tick): no push delivered for ``SHIP_BLIND_S`` while lines wait is said once, with why (lines waiting for
the uuid, before the manager answered /register, count too); again when the cause changes, and when pushes are
delivered again. Lines dropped from a full backlog are said at the first,
counted (``dropped``: lines and bytes, in status), and the count said once a push of that source is delivered;
what the tick has not said by the stop (the exit's own drops: a failure's verdict comes at the end) is said there.

The two roads back off apart while the manager is away, and whichever tries first when it is back would
win: so a source is held (``held``, the Reporter's: the outbox still has a durable push of it pending) and
its later lines wait here, behind it, until the outbox delivered it. Holding, rather than routing those
lines into the outbox too, keeps one road for them: best effort, bounded by the backlog (the outbox on disk
has no bound, and would take every line of an outage with a write each); the Reporter moves what is still
held into the outbox at the exit, so that they are not lost either.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..evidence.watchstate import THREAD_RESTART_MAX_S, THREAD_RESTART_S, WatchState, Words, run_restarting
from ..text import Log
from ..text.show import CUT_MARK, cut, fmt_bytes
from .client import (
    LOG_PUSH_LIMIT,
    SEQ_HEADER,
    ManagerClient,
    PermanentError,
    TransientError,
    error_cause,
    next_wait_s,
    text_body,
)

# Leave room under the manager's 256 KiB cut for the "dropped" note and headers' sake.
PUSH_MAX_BYTES = LOG_PUSH_LIMIT - 4096
BATCH_BYTES = 64 * 1024
# One event line at most (event_line cuts a verdict's last lines to fit): well under a push, so that the events
# shipper never has to cut one (a cut line is no JSON).
EVENT_MAX_BYTES = 64 * 1024
# The events' backlog holds a few of the biggest events, even where log_backlog_bytes is smaller.
EVENTS_BACKLOG_MIN = 4 * EVENT_MAX_BYTES
EVENTS = "events"  # the events' one source (its numbers in SEQ_HEADER)
# After a failed push, wait this long (doubling to the cap) before the next try.
PUSH_RETRY_S = 1.0
PUSH_RETRY_MAX_S = 30.0
# A shipper's own watch: no push delivered for this long, while lines wait, is said once ("log shipping: no push
# delivered for 61 s (its window is 60 s): POST /api/log-push: HTTP 500: ..."). Lines wait every
# log_push_interval_s (1 s); after a failure the backoff doubles from PUSH_RETRY_S to PUSH_RETRY_MAX_S, so by
# 60 s a push was tried six times: a manager restarting (seconds), or one slow answer, is not said, and the
# backlog (2 MiB a source) still holds the minute of a chatty child's lines. It counts from the first push not
# delivered (a quiet hour before it is no blindness: WatchState's on_demand), never while nothing waits.
# It is said also when the manager is down for every call, not only when its log route alone fails (a 500 of
# /api/log-push that the calls never meet, where it is the only word): the outbox's sender says a failure only
# for a call it has pending (in production none, for hours) and the row watch at its next read (row_check_s,
# 300 s), so in production the shipper, pushing every second, is the first to know; and it alone says what the
# outage costs the logs. One line an outage and one when it ends, never one a push: beside the sender's and the
# row watch's lines it is the same outage seen from a third road, each line naming its own loss.
SHIP_BLIND_S = 60.0
# How a shipper's watch says it (evidence/watchstate.py): it delivers pushes, it does not read.
SHIPPING_WORDS = Words(none="no push delivered", again="delivering again after {seconds:.0f} s")


def _weight(line: str) -> int:
    """What one queued line weighs on the wire: its bytes as pushed (client.text_body) and its newline. The
    backlog is bounded in these, not in characters: a line of CJK text or emoji weighs up to four times its
    length, and a bound in characters let a backlog of them hold, and send, up to four times log_backlog_bytes."""
    return (len(line) if line.isascii() else len(text_body(line))) + 1


class _Queue:
    """One source's backlog: whole lines, their weight in bytes as pushed (``_weight``), how many were dropped,
    and the number of the first line (every line added to a source gets the next number, dropped or not)."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque()
        self.size = 0
        self.dropped = 0
        self.dropped_bytes = 0  # (the weight of the ``dropped`` lines)
        self.first = 1

    def extend(self, lines: list[str]) -> None:
        for line in lines:
            self.lines.append(line)
            self.size += _weight(line)

    def drop_oldest(self) -> int:
        """The oldest line goes (the backlog is full): returns its weight."""
        weight = _weight(self._pop())
        self.dropped += 1
        self.dropped_bytes += weight
        self.first += 1
        return weight

    def take(self, room: int) -> list[str]:
        """Whole lines off the front while they fit in ``room`` bytes as pushed (each with its newline), the
        numbering moved past them; one at least while any waits: a line over ``room`` on its own is cut to it,
        after a whole character."""
        taken: list[str] = []
        while self.lines and (size := _weight(self.lines[0])) <= room:
            taken.append(self._pop())
            room -= size
        if not taken and self.lines:
            taken.append(text_body(self._pop(), room - 1).decode())
        self.first += len(taken)
        return taken

    def _pop(self) -> str:
        line = self.lines.popleft()
        self.size -= _weight(line)
        return line


class _Flight:
    """The batch of one source being pushed now (the thread sends it outside the lock)."""

    def __init__(self, body: str, count: int, dropped: tuple[int, int], seq: str) -> None:
        self.body, self.count, self.dropped, self.seq = body, count, dropped, seq  # dropped: (lines, bytes)
        self.taken = False  # taken into the outbox meanwhile (take_all): a failed push does not put it back


class Shipper:
    """A background sender of text lines, batched per source; see the module docstring."""

    def __init__(self, name: str, send: Callable[[str, str, str], None], ready: Callable[[], bool],
                 interval_s: float, backlog_bytes: int, log: Log, on_back: Callable[[], None] | None = None,
                 held: Callable[[str], bool] | None = None, window_s: float = SHIP_BLIND_S,
                 waits_on: Callable[[], str] | None = None) -> None:
        self.name = name
        self._send = send  # (source, body, seq) → raises TransientError / PermanentError
        self._on_back = on_back  # on this thread, when a push is taken after one was refused: the manager is back
        # Names this supervisor process's line numbers: a restarted supervisor numbers from 1 again.
        import secrets  # (hashlib and OpenSSL's libcrypto with it: only once there is a manager to ship to)

        self.run_id = secrets.token_hex(4)
        self._ready = ready  # e.g. "the uuid is known": until then, only queue
        self._waits_on = waits_on  # why the pushes wait while not ready (its watch's miss: _not_ready)
        self._waiting_cause: str | None = None  # the cause of not being ready its watch was last told
        self._held = held  # (source) → its lines wait: something of it sent another way must arrive first
        self._interval = interval_s
        self._backlog = backlog_bytes
        self._log = log
        self._queues: dict[str, _Queue] = {}
        self._in_flight: dict[str, _Flight] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._retry_at = 0.0
        self._retry_delay = PUSH_RETRY_S
        self._flush_deadline = 0.0  # set by stop: the thread's last pushes end there
        self._refused = False  # a push was refused for now since the last one taken (on_back is told at the next)
        self._refused_logged: set[str] = set()
        self.pushed = 0  # pushes delivered
        self.backoff_resets = 0  # times a delivered manager call cut a retry backoff short
        self._error: tuple[str, float] | None = None  # the latest push not delivered, and when (epoch): one value
        # Its own health (module docstring): idle until a push is tried; blind past window_s without one delivered.
        self.state = WatchState(name, window_s, words=SHIPPING_WORDS, on_demand=True)
        self.state.idle("nothing pushed yet")
        self._dropped: dict[str, list[int]] = {}  # per source, lines and bytes dropped from its full backlog
        self._drops_unsaid: dict[str, list[int]] = {}  # per source, dropped since its count was last said
        self._restart = threading.Condition()  # a failed thread's wait to start again, cut short by the stop
        self._last_pushes_made = False  # the thread's own end made them (_run): the stop does not
        self._thread = threading.Thread(target=self._run_contained, name=f"ship:{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def error(self) -> tuple[str, float] | None:
        """Why the latest push was not delivered, and when (epoch); None once one is. One value: read from another
        thread (status), the two never belong to different pushes."""
        return self._error

    def add(self, source: str, lines: list[str]) -> None:
        """Queue lines (any thread); the oldest are dropped past the backlog."""
        if not lines:
            return
        with self._lock:
            queue = self._queues.setdefault(source, _Queue())
            queue.extend(lines)
            self._trim(source, queue)
            urgent = queue.size >= BATCH_BYTES
        if urgent:
            self._wake.set()

    def manager_answers(self) -> None:
        """The manager just took a call (any thread: the outbox's sender says so): the pushes it refused while
        it was away go now, not after the backoff they grew (up to PUSH_RETRY_MAX_S) runs out."""
        if self._retry_at == 0.0 and self._retry_delay == PUSH_RETRY_S:
            return  # not backing off: the next interval ships as usual
        self._retry_at = 0.0
        self._retry_delay = PUSH_RETRY_S
        self._refused = False  # (the sender that says so knows the manager is back)
        self.backoff_resets += 1
        self._wake.set()

    def backlog(self) -> dict[str, int]:
        with self._lock:
            return {source: q.size for source, q in self._queues.items() if q.size}

    def say_lines_left(self) -> None:
        """At the exit, once the held lines went into the outbox (Reporter.stop): what is still queued here is
        lost, the best-effort road's loss, said per source (lines and bytes as they would have been pushed)."""
        with self._lock:
            left = {source: (len(q.lines), q.size) for source, q in self._queues.items() if q.lines}
        for source, (lines, size) in left.items():
            self._log(f"{self.name}: {lines} line(s) of {source!r} ({fmt_bytes(size)}) not delivered at the exit: "
                      "lost (only a failure's verdict and the lines held behind a durable push are kept for the "
                      "next start)")

    def dropped(self) -> dict[str, dict[str, int]]:
        """Per source, the lines (and their bytes as pushed) dropped from its full backlog since the start."""
        with self._lock:
            return {source: {"lines": lines, "bytes": size} for source, (lines, size) in self._dropped.items()}

    def _trim(self, source: str, queue: _Queue) -> None:
        """(under the lock) The oldest lines of ``source`` go past the backlog, counted; the first said at once
        (a line for the tick: never logged from here, where the supervisor's own lines come in)."""
        while queue.size > self._backlog and queue.lines:
            weight = queue.drop_oldest()
            total = self._dropped.setdefault(source, [0, 0])
            total[0], total[1] = total[0] + 1, total[1] + weight
            unsaid = self._drops_unsaid.get(source)
            if unsaid is None:
                unsaid = self._drops_unsaid[source] = [0, 0]
                self.state.say(f"{self.name}: dropping the oldest lines of {source!r}: its backlog is full "
                               f"({fmt_bytes(self._backlog)}, log_backlog_bytes); how many is said once a push "
                               "of it is delivered")
            unsaid[0], unsaid[1] = unsaid[0] + 1, unsaid[1] + weight

    def _drops_said(self, source: str) -> None:
        """A push of ``source`` was delivered: what was dropped before it (its note said so there) is counted in
        one line, unless more was dropped meanwhile (the next push's note carries those: the count waits)."""
        with self._lock:
            queue = self._queues.get(source)
            if queue is not None and queue.dropped:
                return
            unsaid = self._drops_unsaid.pop(source, None)
        if unsaid is not None:
            self.state.say(self._drop_count(source, unsaid))

    def _drop_count(self, source: str, counted: list[int]) -> str:
        return (f"{self.name}: {counted[0]} line(s) of {source!r} ({fmt_bytes(counted[1])}) were dropped from its "
                f"full backlog (log_backlog_bytes {fmt_bytes(self._backlog)})")

    def _run_contained(self) -> None:
        """The thread, contained (watchstate.run_restarting): a bug of ours inside a push is said, that batch is
        dropped (_land), and the shipping starts again after THREAD_RESTART_S (this module's, read now), doubling;
        it ended the thread for good, with the watch's last state kept and no line pushed again. One after the stop
        ends it: the stop makes the last pushes."""
        run_restarting(self._run, self.state, f"the {self.name} thread", self._restart, self._stop.is_set,
                       lambda exc: None, restart_s=THREAD_RESTART_S, restart_max_s=THREAD_RESTART_MAX_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            self.ship_once()
        self._flush()
        self._last_pushes_made = True

    def ship_once(self) -> bool:
        """Push what is queued; False if some is kept for later: a push failed, or a source is held."""
        if not self._ready():
            self._not_ready()
            return False
        if time.monotonic() < self._retry_at:
            return False
        shipped = True
        for source in list(self._queues):
            while True:
                body, _, dropped, seq = self._take_numbered(source, flight=True)
                if not body:
                    break
                if self._held_back(source):
                    shipped = False
                    break
                try:
                    self._send(source, body, seq)
                except TransientError as exc:
                    self._land(source, failed=True)
                    self._missed(exc)
                    # A manager that asked for a pause (429/503 Retry-After) gets it.
                    self._retry_at = time.monotonic() + next_wait_s(self._retry_delay, exc.retry_after_s)
                    self._retry_delay = min(PUSH_RETRY_MAX_S, self._retry_delay * 2)
                    self._refused = True
                    return False
                except PermanentError as exc:
                    self._land(source, failed=False)
                    self._missed(exc)
                    if source not in self._refused_logged:
                        self._refused_logged.add(source)
                        self._log(f"{self.name}: the manager refused a push for {source!r} ({exc}); dropping it")
                    continue
                except BaseException:
                    self._land(source, failed=False)
                    raise
                self._land(source, failed=False)
                self.pushed += 1
                self._error, self._waiting_cause = None, None
                self.state.read()  # ("delivering again after N s", said by the tick, if it was said blind)
                if dropped or source in self._drops_unsaid:
                    self._drops_said(source)
                if self._refused and self._on_back is not None:
                    self._on_back()
                self._refused = False
                self._retry_at, self._retry_delay = 0.0, PUSH_RETRY_S
        return shipped

    def _missed(self, exc: Exception) -> None:
        """A push not delivered: kept as the latest error, and a miss of the watch (its cause: the answer's HTTP
        status, or the error's text; a new one is said again once the watch was said blind)."""
        error = str(exc)
        self._error, self._waiting_cause = (error, time.time()), None
        self.state.miss(error, cause=error_cause(error))

    def _not_ready(self) -> None:
        """No push can go yet (no uuid: the manager has not answered /register). While lines wait this is a miss of
        the watch, as a push not delivered is: an outage that begins before the registration (the manager down at
        the start) is said once the window is past, in the same words, and a full backlog beside an idle watch no
        longer hides it; a registration answered within the window (the normal start) is never said. Told once a
        cause (the misses count pushes tried, and none was), again when it changes."""
        if not self.backlog():
            return  # (nothing waits: no blindness, as for a quiet hour)
        why = self._waits_on() if self._waits_on is not None else "not ready to push yet"
        cause = error_cause(why)
        if cause != self._waiting_cause:
            self._waiting_cause = cause
            self.state.miss(why, cause=cause)

    def _held_back(self, source: str) -> bool:
        """True: ``source`` is held, and the batch just taken goes back to the front of its queue. Asked once
        the batch is taken, not before: a durable push made between a look and the take (Reporter.push_text,
        another thread) would otherwise be passed by the lines logged right after it; made after the take, it
        takes this batch ahead of itself (take_all)."""
        try:
            held = self._held is not None and self._held(source)
        except BaseException:
            self._land(source, failed=True)
            raise
        if held:
            self._land(source, failed=True)
        return held

    def _take_numbered(self, source: str, flight: bool = False) -> tuple[str, int, int, str]:
        """Up to PUSH_MAX_BYTES of whole lines (a "dropped" note first, if any were): the body, how many lines,
        how many were dropped before them, and the lines' numbers (SEQ_HEADER's value); ``flight``: the batch
        is pushed now (take_all takes it too, ahead of the lines behind it)."""
        with self._lock:
            queue = self._queues.get(source)
            if queue is None or not queue.lines:
                return "", 0, 0, ""
            first = queue.first
            parts: list[str] = []
            dropped = queue.dropped, queue.dropped_bytes
            queue.dropped = queue.dropped_bytes = 0
            if dropped[0]:
                parts.append(self._drop_note(*dropped))
            lines = queue.take(PUSH_MAX_BYTES - sum(len(part) + 1 for part in parts))  # (the note is ASCII)
            count = len(lines)
            body = "\n".join(parts + lines) + "\n"
            seq = f"{self.run_id}:{source}:{first}-{first + count - 1}"
            if flight:
                self._in_flight[source] = _Flight(body, count, dropped, seq)
            return body, count, dropped[0], seq

    def _drop_note(self, lines: int, size: int) -> str:
        """The line a push carries first when ``lines`` older lines (``size`` bytes) were dropped before it: one
        ASCII line (its weight is taken from the push's room as its length)."""
        # (whatever filled it: the manager away, or lines coming faster than pushes go, the manager up all along)
        return f"[prover-supervisor: {lines} older line(s) dropped from a full backlog (log_backlog_bytes)]"

    def _land(self, source: str, failed: bool) -> None:
        """The push of ``source``'s batch is over: a failed one goes back to the front of its queue, unless
        take_all took it into the outbox meanwhile (then it travels there, ahead of the rest)."""
        with self._lock:
            flight = self._in_flight.pop(source, None)
            if failed and flight is not None and not flight.taken:
                self._put_back(source, flight.body, flight.count, flight.dropped)

    def take_all(self, source: str) -> list[tuple[str, str]]:
        """Everything queued for ``source``, in push-sized bodies, each with its lines' numbers (SEQ_HEADER's
        value), taken off the queue (for a caller that sends it another way and must keep the order). A batch
        being pushed at this moment comes first: were its push to fail, it would otherwise go back behind what
        the caller sends (if the push succeeds, its lines reach the manager twice, with the same numbers: twice
        is better than out of order)."""
        with self._lock:
            bodies = []
            flight = self._in_flight.get(source)
            if flight is not None and not flight.taken:
                flight.taken = True
                bodies.append((flight.body, flight.seq))
            while True:
                body, _, _, seq = self._take_numbered(source)
                if not body:
                    return bodies
                bodies.append((body, seq))

    def _put_back(self, source: str, body: str, count: int, dropped: tuple[int, int]) -> None:
        lines = body.rstrip("\n").split("\n")
        if dropped[0]:
            lines = lines[1:]
        with self._lock:
            queue = self._queues.setdefault(source, _Queue())
            for line in reversed(lines[-count:] if count else []):
                queue.lines.appendleft(line)
                queue.size += _weight(line)
            queue.first -= count
            queue.dropped += dropped[0]
            queue.dropped_bytes += dropped[1]
            self._trim(source, queue)

    def stop(self, flush_timeout_s: float) -> None:
        """Stop the thread, which pushes what is left first (``_flush``), for ``flush_timeout_s`` at most.

        While the thread lives only the thread pushes: a slow manager at the exit can hold it inside a push past
        the join, and a push made here meanwhile would take the next batch of the same source, whose in-flight
        entry would then be the one the thread's push lands (a failed push lost, a late one landing behind the
        batch after it). A thread still inside a push once the time is up is left to it (a daemon: the exit
        ends it); its lines stay queued, in order. With no thread (never started, or ended) the push is here."""
        self._flush_deadline = time.monotonic() + flush_timeout_s
        self._stop.set()
        self._wake.set()
        with self._restart:
            self._restart.notify_all()
        if self._thread.is_alive():
            self._thread.join(flush_timeout_s)
        if not self._thread.is_alive() and not self._last_pushes_made:  # (never started, or ended by a failure)
            self._flush()
        self._say_drops_left()

    def _say_drops_left(self) -> None:
        """At the stop, what the watch still had for the tick (a backlog that began dropping, the count a delivered
        push brought), and the drops whose count no delivered push brought, are said here: no tick is left to say
        them (the verdict, the exit's events: their drops come at the end)."""
        for line in self.state.check():
            self._log(line)
        with self._lock:
            left, self._drops_unsaid = self._drops_unsaid, {}
        for source, counted in left.items():
            self._log(f"{self._drop_count(source, counted)} (counted at the exit)")

    def _flush(self) -> None:
        """The last pushes, until the stop's deadline. A running backoff is not waited out (the exit cannot wait
        that long); a failed push ends them (a manager still away would only be asked again and again)."""
        self._retry_at = 0.0
        while self.backlog() and time.monotonic() < self._flush_deadline:
            if not self.ship_once():
                break


def push_bodies(text: str) -> list[str]:
    """``text`` in the bodies of as many pushes as it needs, cut as the shipper cuts its batches (``_Queue.take``):
    its lines in order, split on line boundaries, at most PUSH_MAX_BYTES each. For the durable pushes
    (Reporter.push_text): the manager keeps the first 256 KiB of one body and drops the rest without a word, and
    a failure's reason is in the last of the child's lines quoted under its verdict."""
    queue = _Queue()
    queue.extend(text.rstrip("\n").split("\n"))
    bodies: list[str] = []
    while queue.lines:
        bodies.append("\n".join(queue.take(PUSH_MAX_BYTES)) + "\n")
    return bodies


def log_push_sender(client: ManagerClient, uuid: Callable[[], str | None]) -> Callable[[str, str, str], None]:
    def send(source: str, body: str, seq: str) -> None:
        instance = uuid()
        if instance is None:
            # The sender dropped a uuid the manager forgot between the shipper's look (ready) and this push: an
            # empty X-Instance-UUID is refused for good (400), so the batch waits for the next registration.
            raise TransientError("no instance uuid: waiting for the manager to register this instance again")
        client.request("POST", "/api/log-push", data=text_body(body), expect="ok",
                       headers={"X-Instance-UUID": instance, "X-Log-Source": source, SEQ_HEADER: seq,
                                "Content-Type": "text/plain; charset=utf-8"})

    return send


def events_sender(client: ManagerClient) -> Callable[[str, str, str], None]:
    """Events go to ``events_url`` as newline-delimited JSON, one object a line."""

    def send(source: str, body: str, seq: str) -> None:
        client.request("POST", "", data=text_body(body), expect="any",
                       headers={"Content-Type": "application/x-ndjson", SEQ_HEADER: seq})

    return send


def event_line(kind: str, **fields: Any) -> str:
    """One event as one JSON line (ASCII: its length is its weight). One over EVENT_MAX_BYTES has its
    ``last_lines`` (a verdict's: up to 20 lines of up to 64 KiB each, and escaping can make a line six times
    longer) cut to fit, each as ``cut`` marks it, short lines whole; ``last_lines_cut`` says how many were."""
    event = {"type": kind, "time": round(time.time(), 3), **fields}
    line = _json(event)
    lines = fields.get("last_lines")
    if len(line) <= EVENT_MAX_BYTES or not lines:
        return line
    room = EVENT_MAX_BYTES - len(_json(event | {"last_lines": [], "last_lines_cut": len(lines)}))
    fitted = _fit(list(lines), room)
    cut_lines = sum(was != now for was, now in zip(lines, fitted, strict=True))
    return _json(event | {"last_lines": fitted, "last_lines_cut": cut_lines})


def _json(event: dict[str, Any]) -> str:
    return json.dumps(event, default=str, sort_keys=True)


def _fit(lines: list[str], room: int) -> list[str]:
    """``lines`` in at most ``room`` bytes as a JSON list writes them: each line over a fair share cut to it, the
    share of the lines that need less given to the others (the reason is often a short last line)."""
    sizes = sorted(len(_json_str(line)) + 2 for line in lines)  # (each with its ", ")
    left, share = room, 0
    for kept, size in enumerate(sizes):
        share = max(0, left) // (len(sizes) - kept)
        if size > share:
            break
        left -= size
    else:
        return lines
    return [line if len(_json_str(line)) + 2 <= share else _cut_to(line, share - 2) for line in lines]


def _json_str(text: str) -> str:
    return json.dumps(text)


def _cut_to(line: str, limit: int) -> str:
    """``line`` cut (show.cut, its mark at the end) to the longest that writes as at most ``limit`` bytes of JSON
    (a character writes as 1 to 12: found by halving, not guessed)."""
    low, high = len(CUT_MARK) - 1, min(len(line), limit)  # (low: the longest known to fit; below the mark, none)
    while low < high:
        mid = (low + high + 1) // 2
        if len(_json_str(cut(line, mid))) <= limit:
            low = mid
        else:
            high = mid - 1
    return cut(line, low) if low >= len(CUT_MARK) else ""


class EventShipper(Shipper):
    """The events to ``events_url``: newline-delimited JSON, so every line it sends is one whole object. It shares
    the text shipper's batching and backlog, not its text: an event over EVENT_MAX_BYTES (event_line keeps a
    verdict under it) is never cut mid-object but sent as a ``dropped`` event in its place, and lines dropped from
    a full backlog are said by a ``dropped`` event ahead of the next push. Its backlog holds at least
    EVENTS_BACKLOG_MIN, whatever log_backlog_bytes says, so that a big verdict is not dropped for its size."""

    def __init__(self, send: Callable[[str, str, str], None], stamp: Callable[[], dict[str, Any]],
                 interval_s: float, backlog_bytes: int, log: Log) -> None:
        super().__init__("event shipping", send, lambda: True, interval_s, max(backlog_bytes, EVENTS_BACKLOG_MIN), log)
        self._stamp = stamp  # the fields every event carries: the label, the uuid (None before /register)

    def event(self, kind: str, **fields: Any) -> None:
        line = event_line(kind, **self._stamp(), **fields)
        if len(line) > EVENT_MAX_BYTES:
            why = f"a {kind} event of {fmt_bytes(len(line))}, over the {fmt_bytes(EVENT_MAX_BYTES)} an event may weigh"
            self.state.say(f"{self.name}: dropped {why}")
            line = event_line("dropped", **self._stamp(), lines=1, bytes=len(line) + 1, why=why)
        self.add(EVENTS, [line])

    def say_lines_left(self) -> None:
        """At the exit: the events not delivered (the sink away, or slow) are lost, said as such (none is kept)."""
        with self._lock:
            queue = self._queues.get(EVENTS)
            left = (len(queue.lines), queue.size) if queue is not None and queue.lines else None
        if left is not None:
            self._log(f"{self.name}: {left[0]} event(s) ({fmt_bytes(left[1])}) not delivered at the exit: lost "
                      "(events are best effort: none is kept for the next start)")

    def _drop_note(self, lines: int, size: int) -> str:
        return event_line("dropped", **self._stamp(), lines=lines, bytes=size,
                          why=f"its backlog was full ({fmt_bytes(self._backlog)})")


# The supervisor's own lines held before the log shipper exists (a handful in practice).
EARLY_LINES_MAX = 1000


class EarlyLines:
    """The supervisor's own lines from its very first one (role, memory evidence, GPUs, resume),
    held in order until the Reporter takes them: the log tap exists before the Reporter can."""

    def __init__(self) -> None:
        self._held: list[str] | None = []
        self._forward: Log | None = None

    def tap(self, message: str) -> None:
        if self._forward is not None:
            self._forward(message)
        elif self._held is not None:
            self._held.append(message)
            del self._held[:-EARLY_LINES_MAX]

    def hand_to(self, forward: Log | None) -> None:
        """Replay what was held into ``forward``, then pass every later line straight on; None: drop them."""
        held, self._held = self._held or [], None
        self._forward = forward
        if forward is not None:
            for message in held:
                forward(message)
