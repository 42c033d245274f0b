"""supervisor.manager.logship against a real HTTP server on 127.0.0.1 (a recorder of the test's own: what each push
carried, its headers, and the status it is answered with): the X-Log-Seq numbers (consecutive per source and
per run, dropped lines' numbers skipped, the same numbers on a push sent again), a manager's 5xx keeping the
batch and a 4xx dropping it, the events sender's ndjson, a batch big enough waking the thread long before its
interval, ``stop`` flushing what is left, not hanging on a manager that is down, and never pushing around a
push the thread is still inside (a slow manager at the exit), a held source waiting with its numbers while the
others ship, ``take_all`` handing the queue over in order, ``manager_answers`` only counting a reset it made;
and EarlyLines held, bounded, replayed in order and then passed on. tests/test_manager.py covers the push limit,
the backlog note, Retry-After and redirects; not repeated here."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from helpers import wait_for

from supervisor.config import ManagerSpec
from supervisor.manager import logship
from supervisor.manager.client import LOG_PUSH_LIMIT, SEQ_HEADER, ManagerClient, TransientError, text_body
from supervisor.manager.logship import (
    BATCH_BYTES,
    EARLY_LINES_MAX,
    PUSH_MAX_BYTES,
    EarlyLines,
    Shipper,
    event_line,
    events_sender,
    log_push_sender,
    push_bodies,
)

UUID = "u-rules-1"
WAIT_S = 30.0  # an upper bound against hanging, never a measure


class _Handler(BaseHTTPRequestHandler):
    server: Recorder
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        with self.server.lock:
            hold, self.server.hold_next = self.server.hold_next, False
        if hold:  # a slow manager: this push is answered once the test says so (with the answers set by then)
            self.server.holding.set()
            self.server.release.wait(WAIT_S)
        with self.server.lock:
            status = self.server.answers.pop(0) if self.server.answers else 204
            self.server.pushes.append({"path": self.path, "body": body, "status": status,
                                       "headers": {k.lower(): v for k, v in self.headers.items()}})
        self.send_response(status)
        if status == 204:
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        answer = b'{"error":"as told"}'
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.pushes: list[dict[str, Any]] = []
        self.answers: list[int] = []  # the statuses the next pushes get (then 204)
        self.hold_next = False  # the next push waits for ``release`` (``holding`` is set once it is here)
        self.holding, self.release = threading.Event(), threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def taken(self) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.pushes if p["status"] == 204]

    def lines(self, source: str) -> list[str]:
        return [line for p in self.taken() if p["headers"].get("x-log-source") == source
                for line in p["body"].rstrip("\n").split("\n")]


@pytest.fixture
def server() -> Iterator[Recorder]:
    srv = Recorder()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logship, "PUSH_RETRY_S", 0.0)


def client(server: Recorder, url: str | None = None) -> ManagerClient:
    return ManagerClient(ManagerSpec(url=url or server.url, label="C.1", read_timeout_s=5.0))


def shipper_to(server: Recorder, *, interval_s: float = 3600.0, backlog: int = 1 << 24,
               said: list[str] | None = None) -> Shipper:
    return Shipper("log shipping", log_push_sender(client(server), lambda: UUID), lambda: True, interval_s, backlog,
                   (said if said is not None else []).append)


def seq(push: dict[str, Any]) -> tuple[str, str, int, int]:
    run, source, span = push["headers"][SEQ_HEADER.lower()].split(":")
    first, last = span.split("-")
    return run, source, int(first), int(last)


def test_a_push_carries_its_instance_source_and_line_numbers(server: Recorder) -> None:
    shipper = shipper_to(server)
    shipper.add("setup", ["one", "two"])
    assert shipper.ship_once()
    (push,) = server.taken()
    assert push["path"] == "/api/log-push" and push["body"] == "one\ntwo\n"
    assert push["headers"]["x-instance-uuid"] == UUID and push["headers"]["x-log-source"] == "setup"
    assert push["headers"]["content-type"] == "text/plain; charset=utf-8"
    assert seq(push) == (shipper.run_id, "setup", 1, 2)


def test_line_numbers_run_on_per_source_across_pushes(server: Recorder) -> None:
    shipper = shipper_to(server)
    shipper.add("setup", ["a", "b"])
    shipper.add("curio", ["c"])
    assert shipper.ship_once()
    shipper.add("setup", ["d"])
    shipper.add("curio", ["e", "f", "g"])
    assert shipper.ship_once()
    numbers = sorted((s[1], s[2], s[3]) for s in map(seq, server.taken()))
    assert numbers == [("curio", 1, 1), ("curio", 2, 4), ("setup", 1, 2), ("setup", 3, 3)]


def test_each_supervisor_process_numbers_under_its_own_run() -> None:
    runs = {Shipper("x", lambda *a: None, lambda: True, 1.0, 10, print).run_id for _ in range(20)}
    assert len(runs) == 20


def test_dropped_lines_keep_their_numbers(server: Recorder) -> None:
    """A receiver keeping the highest number seen must not mistake the lines after a drop for old ones."""
    shipper = shipper_to(server, backlog=100)
    shipper.add("curio", [f"{i:03d}" + "x" * 16 for i in range(10)])  # 20 bytes a line: the first 5 dropped
    assert shipper.ship_once()
    (push,) = server.taken()
    assert push["body"].split("\n")[0] == "[prover-supervisor: 5 older line(s) dropped from a full backlog " \
                                          "(log_backlog_bytes)]"
    assert seq(push)[2:] == (6, 10)


def test_the_backlog_is_bounded_in_the_bytes_a_push_carries_not_in_characters(server: Recorder,
                                                                               no_retry_wait: None) -> None:
    """A line of multibyte UTF-8 weighs its bytes: 30 characters of "é" are 60 bytes on the wire (61 with the
    newline). Counted in characters (31 each), three such lines (183 bytes) fitted a backlog of 100 bytes."""
    line = "é" * 30
    weight = len(text_body(line)) + 1
    shipper = shipper_to(server, backlog=100)
    server.answers = [503]  # the manager away: the batch goes back to the front of the queue
    shipper.add("curio", [f"{line}{i}" for i in range(3)])
    assert shipper.backlog() == {"curio": weight + 1}, "two of the three dropped: each weighs 62 bytes"
    assert not shipper.ship_once()
    assert shipper.backlog() == {"curio": weight + 1}, "put back as it weighs"
    shipper.add("curio", ["ascii"])
    assert shipper.backlog() == {"curio": weight + 1 + len("ascii\n")}
    assert shipper.ship_once()
    (push,) = server.taken()
    assert push["body"].split("\n")[1:] == [f"{line}2", "ascii", ""], push["body"]
    assert push["body"].startswith("[prover-supervisor: 2 older line(s) dropped"), push["body"]
    assert seq(push)[2:] == (3, 4)


def test_a_5xx_keeps_the_batch_and_the_retry_carries_the_same_numbers(server: Recorder, no_retry_wait: None) -> None:
    shipper = shipper_to(server)
    server.answers = [500]
    shipper.add("setup", ["kept", "through"])
    assert not shipper.ship_once()
    assert shipper.error is not None and "HTTP 500" in shipper.error[0]
    shipper.add("setup", ["more"])
    assert shipper.ship_once()
    refused, taken = server.pushes
    assert refused["status"] == 500 and taken["body"] == "kept\nthrough\nmore\n"
    assert seq(refused)[2:] == (1, 2) and seq(taken)[2:] == (1, 3), "the same first number, and the new line after"
    assert shipper.pushed == 1 and shipper.backlog() == {}


def test_a_4xx_drops_the_batch_says_so_once_and_goes_on(server: Recorder) -> None:
    said: list[str] = []
    shipper = shipper_to(server, said=said)
    server.answers = [404, 404]
    shipper.add("setup", ["refused one"])
    assert shipper.ship_once()
    shipper.add("setup", ["refused two"])
    assert shipper.ship_once()
    shipper.add("setup", ["taken"])
    assert shipper.ship_once()
    assert server.lines("setup") == ["taken"]
    assert seq(server.taken()[0])[2:] == (3, 3), "the refused lines' numbers are not given again"
    assert len(said) == 1 and said[0].startswith("log shipping: the manager refused a push for 'setup' (")


def test_a_uuid_dropped_during_a_pass_keeps_the_later_batches_for_the_next_registration(
        server: Recorder, no_retry_wait: None) -> None:
    # The sender thread drops a uuid the manager forgot while the shipper is in the middle of a pass (it looked
    # at ready() once, before it): a push with an empty X-Instance-UUID is a 400, dropped for good. It waits.
    uuids = iter(["u-1", None])
    current: list[str | None] = []

    def uuid() -> str | None:
        current.append(next(uuids, current[-1] if current else None))
        return current[-1]

    said: list[str] = []
    shipper = Shipper("log shipping", log_push_sender(client(server), uuid), lambda: True, 3600.0, 1 << 24,
                      said.append)
    shipper.add("benchout", ["bench line 1"])
    shipper.add("cuzk", ["cuzk line 1"])
    assert not shipper.ship_once()  # the second source's push found no uuid: kept
    assert [p["headers"]["x-instance-uuid"] for p in server.pushes] == ["u-1"]
    assert shipper.backlog() == {"cuzk": len("cuzk line 1\n")} and not said
    uuids = iter(["u-2"])  # registered again
    assert shipper.ship_once()
    assert server.lines("cuzk") == ["cuzk line 1"] and server.pushes[-1]["headers"]["x-instance-uuid"] == "u-2"


def test_the_events_sender_posts_ndjson_to_the_events_url(server: Recorder) -> None:
    shipper = Shipper("events", events_sender(client(server, server.url + "/hook/events")), lambda: True, 3600.0,
                      1 << 20, print)
    lines = [event_line("phase", phase="bench", state="running"), event_line("verdict", reason="exit_code")]
    shipper.add("events", lines)
    assert shipper.ship_once()
    (push,) = server.taken()
    assert push["path"] == "/hook/events" and push["headers"]["content-type"] == "application/x-ndjson"
    assert [json.loads(x)["type"] for x in push["body"].splitlines()] == ["phase", "verdict"]
    assert SEQ_HEADER.lower() in push["headers"] and "x-instance-uuid" not in push["headers"]


def test_an_event_line_is_one_sorted_json_object_with_its_type_and_time() -> None:
    before = time.time()
    line = event_line("verdict", reason="oom_killed", pid=7, path=__import__("pathlib").Path("/x"))
    data = json.loads(line)
    assert "\n" not in line and list(data) == sorted(data)
    assert data["type"] == "verdict" and data["reason"] == "oom_killed" and data["pid"] == 7
    assert data["path"] == "/x", "what JSON cannot hold is written as its text"
    assert before - 0.01 <= data["time"] <= time.time() + 0.01


def test_an_event_over_its_bound_has_its_last_lines_cut_to_fit_short_ones_whole() -> None:
    """A verdict's last lines (20 of up to 64 KiB, and JSON writes a control character or one outside ASCII in up
    to 12 bytes) made one event line of up to megabytes: the events shipper cut it mid-object at the push limit."""
    long_lines = ["x" * 60000, "\x01" * 30000, "é" * 30000, "😀" * 20000, "ascii " * 9000]
    line = event_line("verdict", label="C.1", last_lines=[*long_lines, "fatal: disk quota exceeded"])
    data = json.loads(line)
    assert len(line) <= logship.EVENT_MAX_BYTES and line.isascii()
    assert data["last_lines_cut"] == 5 and data["last_lines"][-1] == "fatal: disk quota exceeded"
    for was, cut in zip(long_lines, data["last_lines"][:-1], strict=True):
        assert cut.endswith("...") and was.startswith(cut[:-3]) and len(cut) > 1000, cut[:20]
    small = event_line("verdict", last_lines=["a", "b"])
    assert json.loads(small)["last_lines"] == ["a", "b"] and "last_lines_cut" not in json.loads(small)


def events_to(server: Recorder, said: list[str], uuid: str | None = UUID) -> logship.EventShipper:
    return logship.EventShipper(events_sender(client(server, server.url + "/events")),
                                lambda: {"label": "C.1", "uuid": uuid}, 3600.0, 1024, said.append)


def test_events_dropped_from_a_full_backlog_are_said_by_a_json_event_and_in_the_log(server: Recorder) -> None:
    """The events shipper sent the text shipper's note ("[prover-supervisor: 4 older line(s) dropped while the manager
    was unreachable]": no JSON, and not why) and said nothing of the drop before the exit: now a ``dropped`` event
    with the counts and the cause leads the push, and the log says it at the stop at the latest."""
    said: list[str] = []
    events = events_to(server, said)
    assert events._backlog == logship.EVENTS_BACKLOG_MIN, "a backlog smaller than a few big events is raised"
    big = ["q" * 50000] * 20
    for attempt in range(1, 7):  # six verdicts of ~64 KiB, never pushed: the oldest two go
        events.event("verdict", attempt=attempt, last_lines=big)
    assert events.ship_once()
    lines = [json.loads(line) for push in server.taken() for line in push["body"].splitlines()]
    note = lines[0]
    assert {k: note[k] for k in ("type", "label", "uuid", "lines")} == {
        "type": "dropped", "label": "C.1", "uuid": UUID, "lines": 2}
    assert 2 * 60000 < note["bytes"] <= 2 * logship.EVENT_MAX_BYTES and note["why"] == "its backlog was full (256.0KiB)"
    assert [e["attempt"] for e in lines[1:]] == [3, 4, 5, 6]
    events.stop(5.0)
    assert said[0] == ("event shipping: dropping the oldest lines of 'events': its backlog is full (256.0KiB, "
                       "log_backlog_bytes); how many is said once a push of it is delivered")
    assert said[1].startswith("event shipping: 2 line(s) of 'events' (")


def test_an_event_too_big_to_fit_is_sent_as_a_dropped_event_never_cut(server: Recorder) -> None:
    said: list[str] = []
    events = events_to(server, said, uuid=None)
    events.event("transition", why="w" * logship.EVENT_MAX_BYTES)  # (no last lines to cut)
    events.event("transition", why="small")
    assert events.ship_once()
    lines = [json.loads(line) for push in server.taken() for line in push["body"].splitlines()]
    assert [e["type"] for e in lines] == ["dropped", "transition"]
    assert lines[0]["lines"] == 1 and lines[0]["why"].startswith("a transition event of 64.1KiB, over the 64.0KiB")
    events.stop(5.0)
    assert said == [f"event shipping: dropped {lines[0]['why']}"]


def test_events_left_undelivered_at_the_exit_are_said_lost(server: Recorder) -> None:
    said: list[str] = []
    events = events_to(server, said)
    server.answers = [503] * 10  # the sink is away until the end
    events.event("supervisor", state="exiting")
    events.stop(1.0)
    events.say_lines_left()
    assert said[-1].startswith("event shipping: 1 event(s) (") and said[-1].endswith(
        "not delivered at the exit: lost (events are best effort: none is kept for the next start)")


def test_a_full_batch_wakes_the_thread_long_before_its_interval(server: Recorder) -> None:
    shipper = shipper_to(server, interval_s=3600.0)
    shipper.start()
    try:
        shipper.add("curio", ["small"])  # below BATCH_BYTES: waits for the interval (an hour)
        shipper.add("curio", ["y" * 1000 for _ in range(BATCH_BYTES // 1000 + 1)])
        wait_for(lambda: server.taken(), 20)
        assert server.lines("curio")[0] == "small"
    finally:
        shipper.stop(5.0)
    assert server.lines("curio")[1:] == ["y" * 1000] * (BATCH_BYTES // 1000 + 1)


def test_stop_pushes_what_is_left(server: Recorder) -> None:
    shipper = shipper_to(server, interval_s=3600.0)
    shipper.start()
    shipper.add("setup", ["exiting"])
    shipper.stop(5.0)
    assert server.lines("setup") == ["exiting"] and shipper.backlog() == {}


def test_stop_does_not_hang_on_a_manager_that_is_down(server: Recorder) -> None:
    """Every push refused (503): stop tries once, keeps the lines, and returns; the bound is never waited out."""
    server.answers = [503] * 100
    shipper = shipper_to(server, interval_s=3600.0)
    shipper.add("setup", ["never delivered"])
    began = time.monotonic()
    shipper.stop(60.0)
    assert time.monotonic() - began < 30, "stop waited out its flush bound against a manager that refuses"
    assert len(server.pushes) == 1 and shipper.backlog() == {"setup": len("never delivered") + 1}


@pytest.mark.parametrize("fails", [True, False], ids=["the-slow-push-fails", "the-slow-push-succeeds"])
def test_stop_while_the_thread_is_inside_a_slow_push_loses_nothing_and_keeps_the_order(server: Recorder,
                                                                                        fails: bool) -> None:
    # The exit (Reporter.stop) with a slow manager: the thread is inside the push of batch A when stop's join
    # runs out. Lines added since (B) must neither be pushed by stop meanwhile (A's push failing would then
    # land B's batch and lose A; A taken late would land behind B) nor lost: a later flush delivers A, B.
    server.hold_next = True
    shipper = shipper_to(server, interval_s=0.05)
    shipper.add("curio", [f"A{i}" for i in range(5)])
    shipper.start()
    assert server.holding.wait(WAIT_S), "batch A was never pushed"
    shipper.add("curio", [f"B{i}" for i in range(5)])
    shipper.stop(0.2)  # returns while A's push is still held by the manager
    server.answers = [500] if fails else []
    server.release.set()
    shipper.stop(WAIT_S)  # the thread (or, once it has ended, stop) pushes what is left
    assert server.lines("curio") == [f"A{i}" for i in range(5)] + [f"B{i}" for i in range(5)]
    assert shipper.backlog() == {}


def test_the_manager_answering_during_the_exit_flush_does_not_end_it() -> None:
    # The exit's last pushes: while one goes, the supervisor logs its exit line (another source, taken by the
    # flush's next pass) and the sender delivers a call (manager_answers, from its thread). That ended the
    # flush at once (its deadline was reset with the backoff): the exit line was never pushed.
    pushed: list[tuple[str, str]] = []
    shipper: Shipper | None = None

    def push(source: str, body: str, seq: str) -> None:
        if not pushed:
            pushed.append(("", "refused"))
            raise TransientError("the manager is away")
        pushed.append((source, body))
        if len(pushed) == 2 and shipper is not None:
            shipper.add("setup", ["prover-supervisor exiting with status 1"])
            shipper.manager_answers()  # a call delivered meanwhile: the manager is back

    shipper = Shipper("log shipping", push, lambda: True, 3600.0, 1 << 20, [].append)
    shipper.add("curio", ["the last line"])
    assert not shipper.ship_once()  # refused: backing off
    shipper.stop(WAIT_S)  # (never started: stop flushes here, as at an exit whose thread had ended)
    assert pushed[1:] == [("curio", "the last line\n"), ("setup", "prover-supervisor exiting with status 1\n")]
    assert shipper.backlog() == {}


def test_a_bug_of_ours_inside_a_push_is_said_and_the_shipping_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception no manager answer makes (a bug of ours in a push) ended the thread for good: a traceback once,
    the watch's last state kept, and no line pushed again for the rest of the run."""
    monkeypatch.setattr(logship, "THREAD_RESTART_S", 0.05)
    tried: list[str] = []
    sent: list[str] = []

    def push(source: str, body: str, seq: str) -> None:
        tried.append(body)
        if len(tried) == 1:
            raise RuntimeError("a bug of ours")
        sent.append(body)

    shipper = Shipper("log shipping", push, lambda: True, 0.05, 1 << 20, [].append)
    shipper.start()
    try:
        shipper.add("setup", ["one"])
        said: list[str] = []
        assert wait_for(lambda: said.extend(shipper.state.check()) or said, timeout=WAIT_S), said
        assert "the log shipping thread failed: RuntimeError: a bug of ours" in said[0], said
        shipper.add("setup", ["two"])
        assert wait_for(lambda: any("two" in body for body in sent), timeout=WAIT_S), (tried, sent)
        shipper.add("setup", ["three"])
    finally:
        shipper.stop(5.0)
    assert any("three" in body for body in sent), sent  # (the stop's last pushes: made by the thread's end)


def test_a_bug_of_ours_after_the_stop_leaves_the_last_pushes_to_the_stop() -> None:
    """The thread that fails in its last pushes ends there (no wait to start again past the stop): the stop makes
    the rest of them (the batch the bug was in is dropped), at once."""
    sent: list[str] = []

    def push(source: str, body: str, seq: str) -> None:
        if source == "bad":
            raise RuntimeError("a bug of ours")
        sent.append(body)

    shipper = Shipper("log shipping", push, lambda: True, 3600.0, 1 << 20, [].append)
    shipper.start()
    shipper.add("bad", ["dropped"])
    shipper.add("setup", ["last"])
    started = time.monotonic()
    shipper.stop(5.0)
    assert any("last" in body for body in sent), sent
    assert time.monotonic() - started < 4.0  # (bounded by the stop, never by a restart's wait)


def test_not_ready_stop_leaves_the_lines_queued(server: Recorder) -> None:
    shipper = Shipper("log shipping", log_push_sender(client(server), lambda: None), lambda: False, 3600.0, 1 << 20,
                      print)
    shipper.add("setup", ["no uuid yet"])
    shipper.stop(5.0)
    assert server.pushes == [] and shipper.backlog() == {"setup": len("no uuid yet") + 1}


def test_take_all_hands_the_queue_over_and_later_numbers_follow_it(server: Recorder) -> None:
    shipper = shipper_to(server)
    shipper.add("setup", ["a", "b", "c"])
    run = shipper.run_id
    assert shipper.take_all("setup") == [("a\nb\nc\n", f"{run}:setup:1-3")], "with their numbers"
    assert shipper.take_all("setup") == [] and shipper.take_all("nobody") == []
    shipper.add("setup", ["d"])
    assert shipper.ship_once()
    assert seq(server.taken()[0])[2:] == (4, 4), "the lines taken another way keep their numbers"


class _HeldPush:
    """A push that waits, once it has its batch, until the test lets it end: delivered, or failed for now."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.sending, self.go = threading.Event(), threading.Event()
        self.sent: list[tuple[str, str]] = []

    def __call__(self, source: str, body: str, seq: str) -> None:
        self.sending.set()
        self.go.wait(10)
        if self.fails:
            raise TransientError("the manager is away")
        self.sent.append((seq, body))


@pytest.mark.parametrize("fails", [True, False], ids=["the-push-fails", "the-push-succeeds"])
def test_take_all_during_a_push_takes_its_batch_first_and_a_failed_push_does_not_come_back(fails: bool) -> None:
    # The durable road (Reporter.push_text: a failure's verdict) takes the queued lines while the shipper's
    # thread is pushing the oldest of them: that batch comes first in what take_all hands over, and a push
    # that then fails does not put it back behind the verdict (it was sent, out of order, afterwards).
    push = _HeldPush(fails)
    shipper = Shipper("log shipping", push, lambda: True, 3600.0, 1 << 24, [].append)
    shipper.add("setup", ["1", "2"])
    thread = threading.Thread(target=shipper.ship_once)
    thread.start()
    try:
        assert push.sending.wait(10)
        shipper.add("setup", ["3"])
        run = shipper.run_id
        assert shipper.take_all("setup") == [("1\n2\n", f"{run}:setup:1-2"), ("3\n", f"{run}:setup:3-3")]
    finally:
        push.go.set()
        thread.join(10)
    assert shipper.backlog() == {}, "the failed batch came back behind what was taken"
    assert shipper.take_all("setup") == []
    shipper.add("setup", ["4"])
    push.fails, push.sent = False, []
    shipper.manager_answers()  # (the outbox delivered the verdict: a failed push's backoff is cut short)
    assert shipper.ship_once()
    assert push.sent == [(f"{shipper.run_id}:setup:4-4", "4\n")], "the numbers run on after what was taken"


def test_a_held_source_keeps_its_lines_and_numbers_while_the_others_ship(server: Recorder) -> None:
    held = {"setup"}  # (the Reporter's: a durable push of setup is still in the outbox)
    shipper = Shipper("log shipping", log_push_sender(client(server), lambda: UUID), lambda: True, 3600.0, 1 << 24,
                      [].append, held=lambda source: source in held)
    shipper.add("setup", ["s1", "s2"])
    shipper.add("curio", ["c1"])
    assert not shipper.ship_once(), "a held source is kept for later"
    assert server.lines("curio") == ["c1"] and server.lines("setup") == []
    assert shipper.backlog() == {"setup": 6}
    held.clear()
    assert shipper.ship_once()
    assert server.lines("setup") == ["s1", "s2"] and seq(server.taken()[-1])[1:] == ("setup", 1, 2)


def test_an_empty_add_queues_nothing() -> None:
    shipper = Shipper("x", lambda *a: None, lambda: True, 1.0, 100, print)
    shipper.add("setup", [])
    assert shipper.backlog() == {}


def test_manager_answers_resets_only_a_backoff_that_is_running(server: Recorder) -> None:
    shipper = shipper_to(server)
    shipper.manager_answers()
    assert shipper.backoff_resets == 0, "not backing off: nothing to reset"
    server.answers = [503]
    shipper.add("setup", ["during the outage"])
    assert not shipper.ship_once()
    assert not shipper.ship_once() and len(server.pushes) == 1, "backing off: no push yet"
    shipper.manager_answers()
    assert shipper.backoff_resets == 1
    assert shipper.ship_once() and server.lines("setup") == ["during the outage"]
    shipper.manager_answers()
    assert shipper.backoff_resets == 1, "the delivered push ended the backoff already"


def waits_after_refusals(shipper: Shipper, refusals: int) -> list[float]:
    """``refusals`` ship_once calls the manager refuses: the wait each set before the next push, read off the
    shipper's own clock (its retry time less the moment of the call: never slept through, so no load can
    stretch it), each then cut short as if it had passed. Rounded to the millisecond the calls take."""
    waits = []
    for _ in range(refusals):
        before = time.monotonic()
        assert not shipper.ship_once()
        after = time.monotonic()
        assert after - before < 0.5, "a refusal took too long to read a wait off it"
        waits.append(shipper._retry_at - before)
        shipper._retry_at = 0.0
    return [round(wait * 2) / 2 for wait in waits]  # (the call's own time, under 0.25 s, rounded off)


def test_the_wait_after_a_refused_push_doubles_while_they_are_refused(server: Recorder) -> None:
    shipper = shipper_to(server)
    server.answers = [503, 503, 503]
    shipper.add("setup", ["one"])
    first = logship.PUSH_RETRY_S
    assert waits_after_refusals(shipper, 3) == [first, 2 * first, 4 * first]
    assert shipper.ship_once() and server.lines("setup") == ["one"] and len(server.pushes) == 4


def test_a_delivered_push_ends_the_backoff_so_the_next_outage_starts_at_the_first_wait_again(
        server: Recorder) -> None:
    # The wait doubles while pushes are refused, and starts again from PUSH_RETRY_S once one is delivered: a
    # manager that was away for a while, then refuses one push much later, is not left alone for the grown wait.
    shipper = shipper_to(server)
    server.answers = [503, 503]
    shipper.add("setup", ["one"])
    assert waits_after_refusals(shipper, 2) == [logship.PUSH_RETRY_S, 2 * logship.PUSH_RETRY_S]
    assert shipper.ship_once() and server.lines("setup") == ["one"]
    server.answers = [503]
    shipper.add("setup", ["two"])
    assert waits_after_refusals(shipper, 1) == [logship.PUSH_RETRY_S], "the grown wait went with the push delivered"
    assert shipper.ship_once() and server.lines("setup") == ["one", "two"]


def test_a_push_taken_after_a_refused_one_tells_that_the_manager_is_back_once(server: Recorder,
                                                                             no_retry_wait: None) -> None:
    # The outbox's sender, waiting out its own backoff (up to 30 s), hears it: its call goes at once
    # (tests/test_logship_catchup.py runs the two together).
    back: list[int] = []
    shipper = Shipper("log shipping", log_push_sender(client(server), lambda: UUID), lambda: True, 3600.0, 1 << 24,
                      [].append, on_back=lambda: back.append(1))
    shipper.add("setup", ["before the outage"])
    assert shipper.ship_once() and back == [], "no push refused yet: nothing to tell"
    server.answers = [503, 503]
    shipper.add("setup", ["during the outage"])
    assert not shipper.ship_once() and not shipper.ship_once()
    assert shipper.ship_once() and back == [1]
    shipper.add("setup", ["after it"])
    assert shipper.ship_once() and back == [1], "told once per outage"
    assert server.lines("setup") == ["before the outage", "during the outage", "after it"]


# ---------------------------------------------------------------- what a push carries: whole lines, whole characters

def test_a_text_past_the_push_limit_goes_in_bodies_of_whole_lines_down_to_its_last() -> None:
    # A failure's report: its verdict line, then the child's last lines quoted, the reason in the last of them.
    # In one push the manager kept its first 256 KiB and dropped the reason.
    quoted = [f"  | L{i:02d} " + "é" * 30000 for i in range(19)] + ["  | PANIC: the real reason"]
    text = "\n".join(["prover-supervisor: FAILED: phase=work reason=exit_code", *quoted])
    bodies = push_bodies(text)
    assert len(bodies) == 5 and all(len(text_body(body)) <= PUSH_MAX_BYTES for body in bodies)
    assert "".join(bodies) == text + "\n", "every line, whole, in order"
    assert bodies[0].startswith("prover-supervisor: FAILED: ") and bodies[-1].endswith("  | PANIC: the real reason\n")
    assert push_bodies("one line\n\n") == ["one line\n"] and push_bodies("") == ["\n"]


def test_a_line_past_the_push_limit_is_cut_after_a_whole_character() -> None:
    (body,) = push_bodies("x" + "é" * 200000)  # 400001 bytes: no cut can fall between two of them
    assert body == "x" + "é" * ((PUSH_MAX_BYTES - 2) // 2) + "\n"
    assert text_body("x" + "é" * 200000, LOG_PUSH_LIMIT).decode() == "x" + "é" * ((LOG_PUSH_LIMIT - 1) // 2)
    assert text_body("aé", 2) == b"a" and text_body("aé", 3) == "aé".encode() and text_body("aé") == "aé".encode()


def test_lines_holding_what_utf8_cannot_are_pushed_with_it_replaced_and_the_shipping_goes_on(
        server: Recorder) -> None:
    # A command of ${PROG}, whose bytes are not UTF-8, named in the supervisor's own lines: Python keeps such bytes
    # as lone surrogates, and a strict encode raised, in the shipper's thread (it died) and in take_all (the
    # failure's report and the exit flush with it).
    named = "phase fetch: starting → stopping (/nonexistent/\udcff\udcfeprog: command not found)"
    shipper = shipper_to(server)
    shipper.add("setup", [named, "next"])
    assert shipper.ship_once()
    shipper.add("setup", [named])
    assert [body for body, _ in shipper.take_all("setup")] == [named + "\n"], \
        "taken as it is: the outbox's push replaces it in turn"
    assert text_body(named) == "phase fetch: starting → stopping (/nonexistent/??prog: command not found)".encode()
    assert push_bodies(named) == [named + "\n"]
    assert server.lines("setup") == ["phase fetch: starting → stopping (/nonexistent/??prog: command not found)",
                                     "next"]


def test_early_lines_are_held_in_order_and_replayed_then_passed_on() -> None:
    early = EarlyLines()
    for line in ("role: init", "memory evidence: shared", "gpus: none"):
        early.tap(line)
    got: list[str] = []
    early.hand_to(got.append)
    assert got == ["role: init", "memory evidence: shared", "gpus: none"]
    early.tap("after")
    assert got[-1] == "after" and len(got) == 4


def test_early_lines_keep_the_latest_when_too_many() -> None:
    early = EarlyLines()
    for i in range(EARLY_LINES_MAX + 50):
        early.tap(f"line {i}")
    got: list[str] = []
    early.hand_to(got.append)
    assert len(got) == EARLY_LINES_MAX and got[0] == "line 50" and got[-1] == f"line {EARLY_LINES_MAX + 49}"


def test_early_lines_handed_to_none_are_dropped_and_so_are_later_ones() -> None:
    """No manager: nobody takes them; they must not pile up for the rest of the run."""
    early = EarlyLines()
    early.tap("held")
    early.hand_to(None)
    for i in range(EARLY_LINES_MAX * 2):
        early.tap(f"later {i}")
    got: list[str] = []
    early.hand_to(got.append)
    assert got == [], "nothing was kept after the first hand-over"
    early.tap("now forwarded")
    assert got == ["now forwarded"]


def test_a_second_hand_over_does_not_replay_again() -> None:
    early = EarlyLines()
    early.tap("once")
    first: list[str] = []
    second: list[str] = []
    early.hand_to(first.append)
    early.hand_to(second.append)
    early.tap("next")
    assert first == ["once"] and second == ["next"]
