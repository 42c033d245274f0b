"""Hostile manager answers, fuzzed: whatever comes back, the client and the sender raise nothing but
TransientError or PermanentError, keep no uuid that fails the check, and hold a bounded amount of memory.

A raw TCP server on 127.0.0.1 answers each call with bytes made from a seeded generator: random statuses (and
status lines that are none), headers that lie (Content-Length too big, too small, twice, negative; Retry-After and
Location garbage; encodings not asked for; too many headers, a header too long), bodies of random bytes, deep JSON,
huge numbers, NaN, register answers with hostile uuids and runner ids, answers cut short or far too long, now and
then one that stalls past the call deadline. They go to the real ``ManagerClient`` and the real ``Sender`` (with a
real outbox). The answer checks get a fuzz of their own, in-process. The seed is fixed: a failure replays.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import ManagerSpec
from supervisor.engine.loop import EventLoop
from supervisor.manager.answers import UUID_RE, AnswerError, register_answer
from supervisor.manager.client import (
    MAX_ANSWER_BYTES,
    RETRY_AFTER_MAX_S,
    Expect,
    ManagerClient,
    PermanentError,
    TransientError,
)
from supervisor.manager.outbox import Call, Outbox
from supervisor.manager.sender import CallKinds, Sender
from supervisor.prover.fleet import RUNNER_ID, FleetSettings, bench_answer, bench_done_call, check_runner_id

SEED = 20261214
CASES = 400
ANSWER_CHECK_CASES = 10_000
CONNECT_TIMEOUT_S = 0.5
READ_TIMEOUT_S = 0.3
STALL_S = 2.0  # past the call deadline (0.8 s): the client must not wait for it
DRIP_PAUSE_S = 0.1
# What one call may hold at its peak: a bounded answer, parsed. A body read whole would be HUGE_BYTES.
MEMORY_BOUND_BYTES = 8 * 1024 * 1024
HUGE_BLOCK = memoryview(b"7" * (1 << 20))  # sent again and again: the server allocates nothing per byte
HUGE_BLOCKS = 32
KINDS = ("register", "bench-done", "param-done", "running", "log")


# ---------------------------------------------------------------- what the server sends


class Reply:
    """One hostile answer: bytes to write, then maybe a huge body streamed, a stall, or just a close."""

    def __init__(self, head: bytes, huge: bool = False, stall: bool = False, drip: bool = False) -> None:
        self.head = head
        self.huge = huge
        self.stall = stall
        self.drip = drip  # the head a byte at a time, each well inside the read timeout: only the deadline ends it


def _status_line(rng: random.Random) -> bytes:
    status = rng.choice([200, 200, 200, 201, 204, 301, 302, 303, 307, 308, 400, 404, 405, 429, 500, 503, 599,
                         101, 199, 600, 999, rng.randrange(0, 1200)])
    if rng.random() < 0.8:
        return rng.choice([f"HTTP/1.1 {status} Whatever\r\n", f"HTTP/1.0 {status} OK\r\n", f"HTTP/1.1 {status}\r\n"]
                          ).encode()
    return rng.choice([  # no status line at all
        b"HTTP/1.1 abc OK\r\n", b"HTTP/9.9 200 OK\r\n", b"ICY 200 OK\r\n",
        b"\r\n", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) + b"\r\n",
        f"HTTP/1.1 {status} {'R' * 70_000}\r\n".encode(),
    ])


def _retry_after(rng: random.Random) -> str:
    return rng.choice(["5", "0", "-5", "1e3", "9" * rng.randrange(1, 6000), "soon", "Fri, 31 Dec 99999 23:59:59 GMT",
                       "Wed, 21 Oct 2015 07:28:00 GMT", "Thu, 01 Jan 2099 00:00:00 GMT", "\x7f\x01", "٥", ""])


def _location(rng: random.Random) -> str:
    return rng.choice(["/elsewhere", "http://u:pw@x/y", "", "javascript:alert(1)", "x" * 20_000, "\x00\x1b[31m",
                       "".join(chr(rng.randrange(0x20, 0x100)) for _ in range(rng.randrange(1, 200)))])


def _uuid(rng: random.Random) -> Any:
    return rng.choice([
        "4f1c2a9e-0b7d-4c55-9a1e-2f3b4c5d6e7f", "u-1", "", " ", "a\r\nb", "a\x00b", "a\nb", "é", "../../etc",
        "a" * rng.choice([127, 128, 129, 5000]), rng.randrange(-10, 10**30), None, True, 1.5, [], {"a": 1},
        "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 30))),
    ])


def _runner_id(rng: random.Random) -> Any:
    return rng.choice([7, 0, -1, 2**63 - 1, 2**63, 2**200, "12", "NaN", "1e3", " 7", True, None, 1.5, "", [7]])


def _body(rng: random.Random) -> bytes:
    pick = rng.randrange(12)
    if pick == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 4096)))
    if pick == 1:
        depth = rng.choice([100, 2000, 60_000])
        return (b"[" * depth + b"]" * depth)[: MAX_ANSWER_BYTES]
    if pick == 2:
        return rng.choice([b"1e999999", b"9" * 5000, b"-0", b"NaN", b"Infinity", b"-Infinity", b'{"uuid": NaN}',
                           b'{"passed": Infinity}', b"null", b"true", b'"uuid"', b"[]", b"{}"])
    if pick == 3:
        return b"[" + b"{}," * 20_000 + b"{}]"  # a bounded answer that parses into many objects
    if pick == 4:
        return b"x" * (MAX_ANSWER_BYTES + rng.choice([1, 1000, 200_000]))
    if pick == 5:
        return gzip.compress(b'{"uuid": "u-1", "runner_id": 7}')
    if pick in (6, 7, 8):
        body: dict[str, Any] = {"uuid": _uuid(rng)}
        if rng.random() < 0.8:
            body["runner_id"] = _runner_id(rng)
        return json.dumps(body).encode()
    if pick == 9:
        return json.dumps({"ok": True, "passed": rng.choice([True, False, 1, 0, "true", None, []])}).encode()
    if pick == 10:
        return b'{"uuid": "u-1", "runner_id": 7, "uuid": "a\\r\\nb"}'  # a key given twice: the last one wins
    return b""


def hostile_reply(rng: random.Random) -> Reply:
    """Status line, headers and body, each hostile at random; sometimes a huge body, a cut, or a stall."""
    body = _body(rng)
    head = [_status_line(rng)]
    length = rng.choice(["right", "right", "right", "bigger", "smaller", "none", "negative", "garbage", "twice",
                         "huge-digits", "chunked", "bad-chunks"])
    lengths = {"right": str(len(body)), "bigger": str(len(body) + rng.randrange(1, 10_000)),
               "smaller": str(max(0, len(body) - rng.randrange(1, 50))), "negative": "-1", "garbage": "12abc",
               "huge-digits": "9" * rng.choice([20, 5000])}
    if length in lengths:
        head.append(f"Content-Length: {lengths[length]}\r\n".encode())
    elif length == "twice":
        head.append(f"Content-Length: {len(body)}\r\nContent-Length: {len(body) + 5}\r\n".encode())
    elif length == "chunked":
        head.append(b"Transfer-Encoding: chunked\r\n")
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if body else b"0\r\n\r\n"
    elif length == "bad-chunks":
        head.append(b"Transfer-Encoding: chunked\r\n")
        body = b"zz\r\n" + body[:100]
    if rng.random() < 0.3:
        head.append(f"Retry-After: {_retry_after(rng)}\r\n".encode("latin-1", errors="replace"))
    if rng.random() < 0.3:
        head.append(f"Location: {_location(rng)}\r\n".encode("latin-1", errors="replace"))
    if rng.random() < 0.1:
        head.append(f"Content-Encoding: {rng.choice(['gzip', 'deflate', 'br', 'identity', 'x' * 100])}\r\n".encode())
    if rng.random() < 0.03:
        head.append(b"".join(b"X-Many-%d: 1\r\n" % i for i in range(150)))
    if rng.random() < 0.03:
        head.append(b"X-Long: " + b"l" * 70_000 + b"\r\n")
    if rng.random() < 0.05:
        head.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))) + b"\r\n")
    huge = rng.random() < 0.03
    if huge:
        head.append(f"Content-Length: {HUGE_BLOCKS * len(HUGE_BLOCK)}\r\n".encode())
    data = b"".join(head) + b"\r\n" + (b"" if huge else body)
    if rng.random() < 0.05:
        data = data[: rng.randrange(0, len(data) + 1)]  # the manager died mid-answer
    return Reply(data, huge=huge, stall=rng.random() < 0.01, drip=rng.random() < 0.01)


class HostileServer:
    """Answers each connection's one request with ``self.reply``; records nothing, trusts nothing."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.reply = Reply(b"HTTP/1.1 204 No Content\r\n\r\n")
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hostile-manager", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn, self.reply), daemon=True).start()

    def _answer(self, conn: socket.socket, reply: Reply) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            _read_request(conn)
            if reply.drip:
                for i in range(len(reply.head)):
                    conn.sendall(reply.head[i:i + 1])
                    if self._stopping.wait(DRIP_PAUSE_S):
                        return
            else:
                conn.sendall(reply.head)
            if reply.huge:
                for _ in range(HUGE_BLOCKS):
                    conn.sendall(HUGE_BLOCK)
            if reply.stall:
                self._stopping.wait(STALL_S)

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        rest += chunk


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    yield server
    server.stop()


# ---------------------------------------------------------------- the client and the sender against it


def _spec(port: int) -> ManagerSpec:
    return ManagerSpec(url=f"http://127.0.0.1:{port}", label="C.fuzz",
                       connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S)


def _assert_one_line(exc: Exception) -> None:
    text = str(exc)
    assert text.isprintable() and len(text) <= 1000, f"{type(exc).__name__} is not one short line: {text[:300]!r}"


def test_hostile_answers_raise_only_the_clients_errors_and_keep_no_bad_uuid(hostile: HostileServer,
                                                                         tmp_path: Path) -> None:
    rng = random.Random(SEED)
    spec = _spec(hostile.port)
    client = ManagerClient(spec)
    loop = EventLoop()
    outbox = Outbox(tmp_path / "outbox.sqlite3", lambda line: None)
    lines: list[str] = []
    calls = CallKinds()  # the core's kinds, and the prover's bench-done and runner_id
    calls.add("bench-done", bench_done_call(FleetSettings(1.0, 0.0, True, False), lambda passed, rate: None,
                                            lambda: None))
    calls.add_answer_field(RUNNER_ID, check_runner_id)
    sender = Sender(spec, outbox, client, loop, lines.append, calls, on_identity=lambda uuid, fields: None)
    sender.uuid = "u-0"
    outcomes: dict[str, int] = {}
    try:
        for case in range(CASES):
            kind = KINDS[case % len(KINDS)]
            hostile.reply = hostile_reply(rng)
            call = Call(case + 1, kind, {"rate": 61.5, "text": "a line\n", "source": "setup"}, time.time(), 0)
            tracemalloc.start()
            try:
                answer = sender._attempt(call)
            except (TransientError, PermanentError) as exc:
                _assert_one_line(exc)
                retry_after = getattr(exc, "retry_after_s", None)
                assert retry_after is None or 0 <= retry_after <= RETRY_AFTER_MAX_S, retry_after
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                if "no complete answer within" in str(exc):
                    outcomes["cut at the deadline"] = outcomes.get("cut at the deadline", 0) + 1
                continue
            finally:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                assert peak < MEMORY_BOUND_BYTES, f"case {case}: {peak} bytes held for one answer"
            outcomes["delivered"] = outcomes.get("delivered", 0) + 1
            sender._delivered(call, answer)
            if kind == "register":
                assert sender.uuid is not None and UUID_RE.fullmatch(sender.uuid), f"case {case}: {sender.uuid!r}"
                assert outbox.get("uuid") == sender.uuid
                runner_id = outbox.get("runner_id")
                assert runner_id == "" or (runner_id or "").isdigit(), f"case {case}: runner_id {runner_id!r}"
            if kind == "bench-done":
                assert isinstance(answer.body["passed"], bool)
            loop.run_once(0)  # what delivery handed to the loop's thread
    finally:
        outbox.close()
        loop.close()
    # The fuzz reached every road: answers refused both ways, and some delivered.
    assert outcomes.get("TransientError", 0) > CASES // 4, outcomes
    assert outcomes.get("PermanentError", 0) > 0 and outcomes.get("delivered", 0) > 0, outcomes
    assert outcomes.get("cut at the deadline", 0) > 0, outcomes


def test_the_client_alone_takes_every_hostile_answer_as_one_of_its_errors(hostile: HostileServer) -> None:
    rng = random.Random(SEED + 1)
    client = ManagerClient(_spec(hostile.port))
    for case in range(CASES // 2):
        hostile.reply = hostile_reply(rng)
        expect: Expect = ("json", "ok", "any")[case % 3]
        try:
            answer = client.request("POST", "/register", json_body={"label": "C.fuzz"}, expect=expect)
        except (TransientError, PermanentError) as exc:
            _assert_one_line(exc)
            continue
        assert 200 <= answer.status < 300, f"case {case}: {answer}"
        if expect == "ok":
            assert answer.status == 204 or answer.body.get("ok") is True, f"case {case}: {answer}"
        assert expect != "any" or answer.body is None


# ---------------------------------------------------------------- the answer checks, in-process


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 4 else 6)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.choice([0, -1, 7, 2**63 - 1, 2**63, 10**40, rng.randrange(-2**70, 2**70)])
    if pick == 2:
        return rng.choice([1.5, float("nan"), float("inf"), -0.0, 1e308])
    if pick in (3, 4, 5):
        alphabet = rng.choice(["abcdef0123456789-", "\x00\r\n\t :._-/\\\"'$`é\u2028\udcff", "".join(
            chr(rng.randrange(0x110000)) for _ in range(20))])
        return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 8, 36, 128, 129, 1000])))
    if pick == 6:
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["uuid", "runner_id", "passed", "ok", "x"]
    return {rng.choice(keys): _json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_the_answer_checks_refuse_in_one_line_or_give_a_safe_value() -> None:
    rng = random.Random(SEED + 2)
    taken = 0
    for _ in range(ANSWER_CHECK_CASES):
        value = _json_value(rng)
        if rng.random() < 0.5:
            value = {"uuid": _json_value(rng), "runner_id": _json_value(rng)} if rng.random() < 0.7 else value
        try:
            identity = register_answer(value, {RUNNER_ID: check_runner_id})
        except AnswerError as exc:
            assert str(exc).isprintable() and len(str(exc)) < 200, repr(str(exc))
        else:
            taken += 1
            assert UUID_RE.fullmatch(identity.uuid), identity
            runner_id = identity.fields[RUNNER_ID]
            assert runner_id is None or (runner_id.isascii() and runner_id.isdigit())
        try:
            assert isinstance(bench_answer(value), bool)
        except AnswerError as exc:
            assert str(exc).isprintable()
    assert taken > 0, "no generated answer was ever good: the fuzz tests only refusals"
