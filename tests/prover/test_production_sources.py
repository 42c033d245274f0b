"""The proofs watch (prover/production.py) with one of its two sources failing: cuzk's ``/status`` and curio's
``/debug/metrics`` are each a watch of their own (``cuzk status``, ``curio metrics``), said once when it has no
reading for its window while the other one reads, shown in status's ``watches``, and said again when it reads.

Curio's tasks can fail where cuzk never sees them (and cuzk's counters are the only ones of a bench-free
restart): a source lost while the other reads must not leave ``proofs_failing`` half-blind without a word. The
watch used to stay ``reading`` with no why, the failing source's error dropped. Both failing is the whole watch's
blindness: said once by the proofs watch alone, not three times.

Real servers on 127.0.0.1, a real EventLoop, the watches' tick (Watches.check) looked at on every pass.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from fakes import FailingProduction

from supervisor.engine.loop import EventLoop
from supervisor.evidence.watchstate import Watches
from supervisor.prover.production import CURIO, ProductionSettings, ProductionWatch, Reading
from supervisor.wiring import Wiring

STATUS = json.dumps({"counters": {"total_completed": 3, "total_failed": 0}}).encode()
METRICS = (b'curio_harmonytask_tasks_completed{task_name="PoRep"} 3\n'
           b'curio_harmonytask_tasks_failed{task_name="PoRep"} 0\n')
WAIT_S = 30.0  # generous: the machine is shared; each wait ends as soon as its condition holds


class Server:
    """cuzk and curio of the test's own on 127.0.0.1: ``routes`` (path → (code, body)) may change while it runs;
    ``stop`` leaves its port refusing connections, ``start`` answers there again."""

    def __init__(self, routes: dict[str, tuple[int, bytes]]) -> None:
        self.routes = routes
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self.start()

    def start(self) -> None:
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                code, body = routes.get(self.path, (404, b"not found"))
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.stop()


class Run:
    """The watch on a real loop, up as production, with every line its watches said."""

    def __init__(self, status_url: str, metrics_url: str, curio_unresponsive_s: float = 600.0) -> None:
        self.loop, self.watches, self.log, self.said = EventLoop(), Watches(), [], []
        self.production = FailingProduction()
        wiring = Wiring(plan=None, events=None, production=self.production, manager=None,  # type: ignore[arg-type]
                        export_env=lambda name, value: None, call_later=self.loop.call_later, log=self.log.append,
                        watch_state=self.watches.new)
        settings = ProductionSettings(watch_s=0.2, proof_failures=2, proof_failure_window_s=30,
                                      curio_metrics=metrics_url, curio_unresponsive_s=curio_unresponsive_s)
        self.watch = ProductionWatch(settings, status_url, wiring, blind_s=1.5)
        self.watch.transition(SimpleNamespace(name="curio", report="running", up=True))  # type: ignore[arg-type]

    def until(self, what: str, done: Callable[[], object]) -> None:
        deadline = time.monotonic() + WAIT_S

        def looked() -> bool:
            self.said.extend(self.watches.check())
            return bool(done()) or time.monotonic() > deadline

        self.loop.run_until(looked, 0.05)
        assert done(), f"not within {WAIT_S:g}s: {what}; said {self.said}; watches {self.watches.to_dict()}"

    def saying(self, start: str) -> list[str]:
        return [line for line in self.said if line.startswith(start)]


def test_curio_refusing_while_cuzk_reads_is_said_shown_and_said_again_when_it_reads(servers: list[Server]) -> None:
    servers.append(cuzk := Server({"/status": (200, STATUS)}))
    servers.append(curio := Server({"/debug/metrics": (200, METRICS)}))
    curio.stop()  # nothing listens on its port: every connection refused
    run = Run(cuzk.url("/status"), curio.url("/debug/metrics"))
    run.until("curio's metrics said blind", lambda: run.saying("curio metrics: no reading for "))
    [line] = run.saying("curio metrics: no reading for ")
    assert "curio /debug/metrics: " in line and "refused" in line.lower(), line
    watches = run.watches.to_dict()
    assert watches["proofs watch"]["state"] == "reading", watches  # cuzk still reads: the watch goes on
    assert watches["curio metrics"]["state"] == "blind" and "refused" in watches["curio metrics"]["why"].lower()
    assert watches["cuzk status"]["state"] == "reading", watches
    assert run.watch.status()["production"]["sources"] == {"cuzk": "reading", "curio": "blind"}
    curio.start()
    run.until("curio's metrics said reading again", lambda: run.saying("curio metrics: reading again after "))
    assert len(run.saying("curio metrics: no reading for ")) == 1, run.said  # said once, not at every read
    assert run.watches.to_dict()["curio metrics"]["state"] == "reading"
    assert not run.saying("proofs watch: ") and not run.saying("cuzk status: "), run.said


def test_cuzk_failing_while_curio_reads_is_said_and_said_again_when_it_reads(servers: list[Server]) -> None:
    servers.append(cuzk := Server({"/status": (500, b"boom")}))
    servers.append(curio := Server({"/debug/metrics": (200, METRICS)}))
    run = Run(cuzk.url("/status"), curio.url("/debug/metrics"))
    run.until("cuzk's status said blind", lambda: run.saying("cuzk status: no reading for "))
    [line] = run.saying("cuzk status: no reading for ")
    assert "cuzk /status: HTTP Error 500" in line, line
    assert run.watches.to_dict()["proofs watch"]["state"] == "reading"
    cuzk.routes["/status"] = (200, STATUS)
    run.until("cuzk's status said reading again", lambda: run.saying("cuzk status: reading again after "))
    assert run.watches.to_dict()["cuzk status"]["state"] == "reading"
    assert not run.saying("proofs watch: ") and not run.saying("curio metrics: "), run.said


def test_both_failing_is_said_once_by_the_proofs_watch_alone(servers: list[Server]) -> None:
    servers.append(cuzk := Server({"/status": (500, b"boom")}))
    servers.append(curio := Server({"/debug/metrics": (200, METRICS)}))
    curio.stop()
    run = Run(cuzk.url("/status"), curio.url("/debug/metrics"))
    run.until("the proofs watch said blind", lambda: run.saying("proofs watch: no reading for "))
    [line] = run.saying("proofs watch: no reading for ")
    assert "cuzk /status: HTTP Error 500" in line and "curio /debug/metrics: " in line, line
    # A few more passes: the sources' own watches stay quiet (the proofs watch said it all) and idle in status.
    misses = run.watches.to_dict()["proofs watch"]["misses"]
    run.until("5 more readings", lambda: run.watches.to_dict()["proofs watch"]["misses"] >= misses + 5)
    assert run.said == [line], run.said
    watches = run.watches.to_dict()
    assert watches["cuzk status"]["state"] == watches["curio metrics"]["state"] == "idle", watches


def test_one_source_only_has_no_watch_of_its_own(servers: list[Server]) -> None:
    servers.append(cuzk := Server({"/status": (200, STATUS)}))
    run = Run(cuzk.url("/status"), "")
    run.until("a reading", lambda: run.watches.to_dict()["proofs watch"]["readings"] >= 1)
    assert set(run.watches.to_dict()) == {"proofs watch"}  # the proofs watch is that source's watch
    assert run.watch.status()["production"]["sources"] == {"cuzk": "reading"}


def test_curio_answering_before_its_first_proving_task_is_not_blind(servers: list[Server]) -> None:
    """curio counts a task name only from its first task: a metrics page without proving tasks is curio read
    (nothing of it failed yet), not a lost source; a fresh production would say a false alarm otherwise."""
    servers.append(cuzk := Server({"/status": (200, STATUS)}))
    servers.append(curio := Server({"/debug/metrics": (200, b'curio_harmonytask_active_tasks{task_name="x"} 0\n')}))
    run = Run(cuzk.url("/status"), curio.url("/debug/metrics"))
    run.until("10 readings", lambda: run.watches.to_dict()["proofs watch"]["readings"] >= 10)
    assert run.said == [], run.said
    assert run.watches.to_dict()["curio metrics"]["state"] == "reading"


def test_curio_read_alone_before_its_first_proving_task_is_read_as_with_cuzk(servers: list[Server]) -> None:
    """One rule with cuzk or without: curio's page before its first proving task is none done, none failed. Read
    alone ([production] without [cuzk]) it was no reading, and the proofs watch went blind on a healthy curio."""
    servers.append(curio := Server({"/debug/metrics": (200, b'curio_harmonytask_active_tasks{task_name="x"} 0\n')}))
    run = Run("", curio.url("/debug/metrics"))
    run.until("10 readings", lambda: run.watches.to_dict()["proofs watch"]["readings"] >= 10)
    assert run.said == [], run.said
    assert run.watches.to_dict()["proofs watch"]["misses"] == 0


def test_a_page_with_no_curio_metric_is_no_reading_of_curio(servers: list[Server]) -> None:
    # (another program on the port: its page is not curio's before its first task, and is said as no reading)
    servers.append(other := Server({"/debug/metrics": (200, b"up 1\n")}))
    run = Run("", other.url("/debug/metrics"))
    run.until("a miss", lambda: run.watches.to_dict()["proofs watch"]["misses"] >= 1)
    assert run.watches.to_dict()["proofs watch"]["readings"] == 0


def test_a_source_said_lost_says_its_return_though_both_were_lost_between(servers: list[Server]) -> None:
    """curio lost alone is said; then cuzk is lost too (the proofs watch says it; the sources wait); then both
    read again: curio's return is said too, or its outage was never closed in the log."""
    servers.append(cuzk := Server({"/status": (200, STATUS)}))
    servers.append(curio := Server({"/debug/metrics": (200, METRICS)}))
    curio.stop()
    run = Run(cuzk.url("/status"), curio.url("/debug/metrics"))
    run.until("curio's metrics said blind", lambda: run.saying("curio metrics: no reading for "))
    cuzk.routes["/status"] = (500, b"boom")
    run.until("the proofs watch said blind", lambda: run.saying("proofs watch: no reading for "))
    cuzk.routes["/status"] = (200, STATUS)
    curio.start()
    run.until("curio's return said", lambda: run.saying("curio metrics: reading again after "))
    run.until("the proofs watch's return said", lambda: run.saying("proofs watch: reading again after "))
    assert len(run.saying("curio metrics: no reading for ")) == 1, run.said
    assert not run.saying("cuzk status: "), run.said  # (never said lost alone: nothing of it to close)


def test_production_failed_for_its_proofs_still_shows_them_failed(servers: list[Server]) -> None:
    """The window was replaced by an empty one as the phase was failed: status then read 0 proofs failed, 0 in
    the window, beside a verdict and a summary of proofs failing. It stays, and the phase is failed once."""
    failing = json.dumps({"counters": {"total_completed": 0, "total_failed": 5}}).encode()
    servers.append(cuzk := Server({"/status": (200, json.dumps({"counters": {"total_completed": 0,
                                                                              "total_failed": 0}}).encode())}))
    run = Run(cuzk.url("/status"), "")
    production = run.production
    run.until("a first reading", lambda: run.watch.status()["production"]["watch"] == "reading")
    cuzk.routes["/status"] = (200, failing)
    run.until("production failed", lambda: production.failed)
    run.until("two reads more", lambda: len(run.watch._window.readings) >= 4)
    shown = run.watch.status()
    assert shown["proofs_failed"] == 5 and shown["production"]["failed_in_window"] == 5, shown
    assert [reason for _, reason, _ in production.failed] == ["proofs_failing"], production.failed


def test_a_hung_curio_fails_production_once_its_metrics_go_unanswered_for_the_bound(servers: list[Server]) -> None:
    """A hung curio (its API port accepts, nothing answers) ran for ever as "running": its metrics said blind once,
    the failed figure quietly cuzk's (which counts no GPU failure), and nothing more. Past curio_unresponsive_s the
    attempt fails, once, with the why; the summary says whose the failed figure is meanwhile."""
    servers.append(cuzk := Server({"/status": (200, STATUS)}))
    hung = socket.create_server(("127.0.0.1", 0))  # listening, never accepting: every read times out
    try:
        run = Run(cuzk.url("/status"), f"http://127.0.0.1:{hung.getsockname()[1]}/debug/metrics",
                  curio_unresponsive_s=3.0)
        run.until("production failed", lambda: run.production.failed)
        [(phase, reason, detail)] = run.production.failed
        assert (phase, reason) == ("curio", "curio_unresponsive"), run.production.failed
        assert "curio's metrics gave no reading for " in detail and "(curio_unresponsive_s=3): " in detail, detail
        assert "curio /debug/metrics: " in detail and "timed out" in detail, detail
        assert run.watch.status()["production"]["counted_by"] == {"completed": "cuzk", "failed": "cuzk"}
        assert ("(completed: cuzk /status; failed: cuzk /status, as curio's proving tasks give no reading: it counts "
                "no GPU or synthesis failure)") in run.watch.summary, run.watch.summary
        reads = run.watches.to_dict()["proofs watch"]["readings"]
        run.until("2 more readings", lambda: run.watches.to_dict()["proofs watch"]["readings"] >= reads + 2)
        assert len(run.production.failed) == 1, run.production.failed  # once an up
    finally:
        hung.close()


def curio_run(metrics_url: str, thawed: list[float | None] | None = None
              ) -> tuple[ProductionWatch, FailingProduction, float]:
    """A proofs watch with curio's metrics bound at 120 s, up now; ``thawed``: the supervisor's last thaw, as told."""
    production = FailingProduction()
    wiring = Wiring(plan=None, events=None, production=production, manager=None,  # type: ignore[arg-type]
                    export_env=lambda name, value: None, call_later=EventLoop().call_later,
                    log=lambda line: None, watch_state=Watches().new,
                    thawed_at=lambda: thawed[0] if thawed else None)
    watch = ProductionWatch(ProductionSettings(watch_s=60, curio_metrics=metrics_url, curio_unresponsive_s=120), "",
                            wiring)
    up = time.monotonic()
    watch.transition(SimpleNamespace(name="curio", report="running", up=True))  # type: ignore[arg-type]
    return watch, production, up


def curio_unread(at: float) -> Reading:
    return Reading(at, None, None, error="x", unread=((CURIO, "curio /debug/metrics: timed out"),))


def test_curios_metrics_are_judged_unanswered_from_their_last_reading_and_only_when_read() -> None:
    """The bound counts from production's start, then from curio's last reading: misses that come and go are no
    hung curio. A watch that reads no curio metrics never judges it."""
    watch, production, up = curio_run("http://127.0.0.1:9/debug/metrics")  # (the discard port: nothing is read)
    watch._decide("curio", curio_unread(up + 100))
    watch._decide("curio", Reading(up + 110, 0, 0, source=CURIO))
    for at in (up + 150, up + 200, up + 229):
        watch._decide("curio", curio_unread(at))
    assert production.failed == [], "119 s since its last reading"
    watch._decide("curio", curio_unread(up + 231))
    assert [reason for _, reason, _ in production.failed] == ["curio_unresponsive"], production.failed
    watch, production, up = curio_run("")
    watch._decide("curio", Reading(up + 1000, 0, 0, source="cuzk", unread=((CURIO, "not asked"),)))
    assert production.failed == []


def test_a_docker_pause_is_no_time_curio_left_its_metrics_unanswered() -> None:
    """A pause of 15 min (docker pause, a Vast interruptible instance paused): the read in flight as it came ends
    past its deadline right after the thaw, and that one miss failed a healthy curio at once (900 s past the bound
    of 120). The time counts from the thaw, and one miss alone never fails it."""
    thawed: list[float | None] = [None]
    watch, production, up = curio_run("http://127.0.0.1:9/debug/metrics", thawed)
    watch._decide("curio", Reading(up + 30, 0, 0, source=CURIO))
    watch._decide("curio", curio_unread(up + 930))  # (before the tick has noticed the thaw)
    assert production.failed == [], "one miss, the one in flight as the pause came"
    thawed[0] = up + 929
    watch._decide("curio", curio_unread(up + 990))
    assert production.failed == [], "61 s since the thaw"
    watch._decide("curio", curio_unread(up + 1050))
    assert [reason for _, reason, _ in production.failed] == ["curio_unresponsive"], production.failed
