"""The proofs watch (prover/production.py) against a hostile cuzk on 127.0.0.1: it survives what it reads, never
hangs on a peer that drips, and says when it goes blind.

- A malformed status line, a 70 KB header, broken chunked encoding, 200k nested ``[``: each is a reading of
  none with why, never an exception (the reading thread used to die on them, and with it the watch).
- A first answer that is garbage, then counters that fail: ``proofs_failing`` still comes (there is a second read).
- A peer that drips one byte at a time is cut at the call's total deadline.
- A peer that answers too late for every read: the watch says once that it has no reading ("proofs watch: no
  reading for …"), and again when it reads.
- ``watch_s`` below its minimum is refused with one line naming the key.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from fakes import FailingProduction

from supervisor.config import ConfigError
from supervisor.engine.loop import EventLoop
from supervisor.evidence.watchstate import Watches
from supervisor.prover import production
from supervisor.prover.production import ProductionSettings, ProductionWatch, production_section, read_counters
from supervisor.wiring import Wiring

Answer = Callable[[socket.socket], None]


def sends(data: bytes) -> Answer:
    def answer(conn: socket.socket) -> None:
        conn.sendall(data)
    return answer


def body(status: int, payload: bytes) -> Answer:
    head = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(payload))
    return sends(head + payload)


def counters(completed: int, failed: int) -> Answer:
    return body(200, json.dumps({"counters": {"total_completed": completed, "total_failed": failed}}).encode())


def drips(every_s: float) -> Answer:
    def answer(conn: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
            conn.sendall(bytes([byte]))
            time.sleep(every_s)
    return answer


def late(after_s: float, then: Answer) -> Answer:
    def answer(conn: socket.socket) -> None:
        time.sleep(after_s)
        then(conn)
    return answer


class Peer:
    """A cuzk of the test's own on 127.0.0.1: each connection gets the next answer (the last one, once they run out)."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.served = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/status"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            answer = self.answers[min(self.served, len(self.answers) - 1)]
            self.served += 1
            threading.Thread(target=self._answer, args=(conn, answer), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket, answer: Answer) -> None:
        try:
            conn.recv(65536)
            answer(conn)
        except OSError:
            pass  # the reader cut it: what the test wants
        finally:
            conn.close()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for peer in made:
        peer.close()


HOSTILE = {
    "malformed status line": sends(b"HTTP/1.1 two-hundred OK\r\n\r\n"),
    "70 KB header": sends(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"),
    "broken chunked encoding": sends(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"),
    "200k nested brackets": body(200, b"[" * 200_000),
    "no answer at all": sends(b""),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_any_answer_is_a_reading_of_none_with_why(peers: list[Peer], name: str) -> None:
    peers.append(peer := Peer(HOSTILE[name]))
    got = read_counters(peer.url, "")
    print(f"{name}: {got.error}")
    assert (got.completed, got.failed, got.source) == (None, None, "none")
    assert got.error.startswith("cuzk /status: ") and len(got.error) < 400, got.error


def test_a_page_cut_short_of_its_content_length_is_no_reading(peers: list[Peer]) -> None:
    # curio's metrics page, its connection closed 600 bytes in: what came still parsed (WinPost's lines, PoRep's
    # gone), read as PoRep's counters reset, and PoRep's whole history counted again once it came back.
    page = b"".join(b'curio_harmonytask_tasks_completed{task_name="%s"} %d\n' % (name, 40 + i)
                    for i, name in enumerate([b"WinPost"] * 12 + [b"PoRep"] * 12))
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(page)
    peers.append(peer := Peer(sends(head + page[:600])))
    got = read_counters("", peer.url)
    assert (got.completed, got.source) == (None, "none"), got
    assert "an answer cut short: 600 of " in got.error, got.error
    peers.append(whole := Peer(sends(head + page)))
    assert read_counters("", whole.url).completed == sum(40 + i for i in range(12, 24))  # (PoRep's: no WinPost)


def test_a_dripping_peer_is_cut_at_the_total_deadline(peers: list[Peer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(production, "READ_DEADLINE_S", 1.0)
    peers.append(peer := Peer(drips(0.2)))
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(read_counters(peer.url, "")), daemon=True)
    started = time.monotonic()
    reader.start()
    reader.join(8)
    assert not reader.is_alive(), "a peer dripping a byte every 0.2 s held the reader past 8 s"
    print(f"cut after {time.monotonic() - started:.1f}s")
    [reading] = got
    assert "no whole answer within 1s" in reading.error, reading.error  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the watch, in-process on a real loop


def watch_of(url: str, loop: EventLoop, watches: Watches, log: list[str], *, blind_s: float | None = None,
             ) -> tuple[ProductionWatch, FailingProduction]:
    target = FailingProduction()
    wiring = Wiring(plan=None, events=None, production=target, manager=None,  # type: ignore[arg-type]
                    export_env=lambda name, value: None, call_later=loop.call_later, log=log.append,
                    watch_state=watches.new)
    settings = ProductionSettings(watch_s=0.2, proof_failures=2, proof_failure_window_s=30, curio_metrics="")
    watch = ProductionWatch(settings, url, wiring, blind_s=blind_s)
    watch.transition(SimpleNamespace(name="curio", report="running", up=True))  # type: ignore[arg-type]
    return watch, target


def test_a_garbage_first_answer_then_failing_counters_still_fail_production(peers: list[Peer]) -> None:
    peers.append(peer := Peer(HOSTILE["malformed status line"], counters(0, 0), counters(0, 1), counters(0, 3)))
    loop, watches, log = EventLoop(), Watches(), []
    watch, target = watch_of(peer.url, loop, watches, log)
    deadline = time.monotonic() + 15
    loop.run_until(lambda: bool(target.failed) or time.monotonic() > deadline, 0.05)
    assert target.failed, f"no proofs_failing after a malformed first answer ({peer.served} reads): {log}"
    [(phase, reason, detail)] = target.failed[:1]
    assert (phase, reason) == ("curio", "proofs_failing") and "cuzk counters" in detail, detail
    assert watch.state.misses >= 1


def test_a_peer_too_slow_for_every_read_is_said_once_blind_then_reading_again(
        peers: list[Peer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(production, "READ_DEADLINE_S", 0.5)
    slow = late(4.0, counters(1, 0))
    peers.append(peer := Peer(slow, slow, slow, slow, slow, slow, slow, slow, slow, slow, counters(2, 0)))
    loop, watches, log = EventLoop(), Watches(), []
    watch, _ = watch_of(peer.url, loop, watches, log, blind_s=1.5)
    said: list[str] = []
    deadline = time.monotonic() + 20

    def done() -> bool:
        said.extend(watches.check())
        return any("reading again" in line for line in said) or time.monotonic() > deadline

    loop.run_until(done, 0.05)
    blind = [line for line in said if "no reading for" in line]
    assert len(blind) == 1, said
    assert blind[0].startswith("proofs watch: no reading for ") and "cuzk /status: " in blind[0], blind[0]
    assert "no whole answer within 0.5s" in blind[0] or "has not come back" in blind[0], blind[0]
    assert any(line.startswith("proofs watch: reading again after ") for line in said), said
    assert watch.state.current == "reading"


# ---------------------------------------------------------------- the interval's floor


@pytest.mark.parametrize("value", [0.001, "0.000001", 0])
def test_watch_s_below_its_minimum_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError) as refused:
        production_section({"watch_s": value}, None)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message and "watch_s" in message, message


def test_a_bug_in_deciding_is_said_once_and_the_watch_goes_on(peers: list[Peer]) -> None:
    """What the core hands the watch raising once (here its machine figures): said as the watch stopping
    unexpectedly, and the next reading is decided as ever: proofs_failing comes."""
    peers.append(peer := Peer(counters(0, 0), counters(0, 1), counters(0, 3)))
    loop, watches, log = EventLoop(), Watches(), []
    raised: list[int] = []

    def machine(phase: str) -> dict[str, object]:
        if not raised:
            raised.append(1)
            raise RuntimeError("a bug of ours")
        return {}

    target = FailingProduction()
    wiring = Wiring(plan=None, events=None, production=target, manager=None,  # type: ignore[arg-type]
                    export_env=lambda name, value: None, call_later=loop.call_later, log=log.append,
                    machine=machine, watch_state=watches.new)
    settings = ProductionSettings(watch_s=0.2, proof_failures=2, proof_failure_window_s=30, curio_metrics="")
    watch = ProductionWatch(settings, peer.url, wiring)
    watch.transition(SimpleNamespace(name="curio", report="running", up=True))  # type: ignore[arg-type]
    said: list[str] = []
    deadline = time.monotonic() + 15
    loop.run_until(lambda: said.extend(watches.check()) or bool(target.failed) or time.monotonic() > deadline, 0.05)
    assert target.failed and target.failed[0][1] == "proofs_failing", (target.failed, log)
    assert said == ["proofs watch: stopped unexpectedly (RuntimeError: a bug of ours); the watch goes on with the "
                    "next reading"], said
