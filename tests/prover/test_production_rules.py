"""Production's pure parts (prover/production.py): the proof window, the real shapes of cuzk's ``/status`` and
curio's ``/debug/metrics``, reading them from real servers on 127.0.0.1, and the summary line.

tests/prover/test_production.py covers the window's main rule, a restart, one shape each and one summary; these
cover the edges: readings without counters, an empty window, the window's base, the failed counter alone going
down, the shapes' odd members (an answer of any shape is a reading, never an exception: the reading runs on a
worker thread, which an exception would end, leaving production unwatched for good), where each figure of the
summary comes from, and which source a reading names.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from supervisor.engine.reaping import ExitStatus
from supervisor.exits import EXIT_FAILURE
from supervisor.lifecycle.verdict import STOPPED, failure_status, from_exit
from supervisor.prover.plugin import PLUGIN
from supervisor.prover.production import (
    BLIND_MIN_S,
    ProofWindow,
    Reading,
    cuzk_kinds,
    parse_curio,
    parse_curio_tasks,
    parse_cuzk,
    read_counters,
    summary_line,
)
from supervisor.prover.reasons import BENCH_FAILED, PROOFS_FAILING

GIB = 1 << 30


def reading(at: float, completed: int | None, failed: int | None) -> Reading:
    return Reading(at, completed, failed, source="cuzk")


# ---------------------------------------------------------------- the window


def test_an_empty_window_counts_nothing_and_is_not_failing() -> None:
    window = ProofWindow(60.0)
    assert window.in_window() == (0, 0) and window.since_up() == (0, 0, 0.0) and not window.failing(1)


def test_a_reading_without_counters_is_not_counted() -> None:
    window = ProofWindow(60.0)
    window.add(reading(0, None, None))
    window.add(reading(5, 3, None))
    assert window.first is None and not window.readings
    window.add(reading(10, 3, 1))
    window.add(reading(20, None, None))  # a failed read between two good ones changes nothing
    window.add(reading(30, 3, 4))
    assert window.in_window() == (0, 3) and window.since_up() == (0, 3, 20.0)


def test_curios_tasks_failing_while_cuzk_looks_well_is_failing() -> None:
    # curio's [Cuzk] Address naming no daemon (or its ProveTimeout shorter than a proof): its proving tasks fail
    # while cuzk's counters stay still (an idle GPU) or rise. Only cuzk's were read: days in production, no proof.
    for cuzk_done in (0, 9):
        window = ProofWindow(600.0)
        for i in range(6):
            window.add(Reading(60.0 * i, 0, 5 * i, source="curio"))
            window.add(Reading(60.0 * i, cuzk_done * i, 0, source="cuzk"))  # (last: the figures shown are its)
        assert (window.failing_detail(5) or ("",))[0] == "curio" and window.failing(5), cuzk_done
        # The failed figure is curio's: cuzk's 0 read as no proof failing beside 25 that did.
        assert window.in_window() == (cuzk_done * 5, 25) and window.failing_detail(5) == ("curio", 25, None)
        assert window.counted_by() == ("cuzk", "curio")


def test_every_proof_failing_on_a_gpu_error_shows_and_fails_as_the_real_daemon_counts_it() -> None:
    # The real cuzk's /status counts a failure only where a PoRep fails its self-check (cuzk-core engine.rs: its
    # StatusTracker.job_completed is called there alone): a partition's GPU prove failure leaves it 0 / 0 while
    # curio's PoRep fails 0 → 6. The summary said "0 completed / 0 failed"; status proofs_failed 0.
    window = ProofWindow(3600.0)
    for minute in range(7):
        tasks = parse_curio_tasks(curio_page(0, minute, 2 * minute))
        assert tasks is not None
        window.add(Reading(minute * 60.0, 2 * minute, minute, source="curio", tasks=tasks))
        window.add(Reading(minute * 60.0, 0, 0, source="cuzk", tasks=cuzk_kinds({"counters": {
            "total_completed": 0, "total_failed": 0, "completed_by_kind": {}, "failed_by_kind": {}}})))
    assert window.in_window() == (0, 6) and window.since_up() == (0, 6, 360.0)
    assert window.failing_detail(5) == ("curio", 6, "PoRep")
    line = summary_line(window, {}, None)
    assert line.startswith("production: proofs 0 completed / 6 failed in the last 60 min, 0 / 6 since up (completed: "
                           "cuzk /status; failed: curio's proving tasks); 0.0/h; "), line


def test_cuzks_failures_alone_never_judge_while_curios_metrics_read() -> None:
    # cuzk's /status: PoRep self-check failures, and none of the proofs it answered another way (batched, slotted)
    # counted completed; curio's PoRep completes all the same. Judged on cuzk's alone it read as failing.
    window = ProofWindow(3600.0)
    for minute in range(7):
        tasks = parse_curio_tasks(curio_page(3 * minute, minute, 2 * minute))
        assert tasks is not None
        window.add(Reading(minute * 60.0, 5 * minute, minute, source="curio", tasks=tasks))
        window.add(Reading(minute * 60.0, 0, minute, source="cuzk"))
    assert window.failing_detail(5) is None and window.in_window() == (0, 6)
    # curio's metrics blind past stale_s: cuzk's count is all there is, and judges (its failures are real ones).
    window.add(Reading(420.0 + BLIND_MIN_S + 1, 0, 7, source="cuzk"))
    assert window.counted_by() == ("cuzk", "cuzk") and window.failing_detail(5) == ("cuzk", 7, None)


def test_one_missed_read_of_cuzk_does_not_switch_the_figures_to_curios() -> None:
    # cuzk 10 → 12, curio 10 → 12 PoRep and 500 → 520 WinPost; cuzk's /status answers 500 once: every figure
    # became curio's (2 → 22 → 2 proofs, and the rate with it), WinPost's every-epoch completions among them.
    window = ProofWindow(3600.0, stale_s=30.0)
    for at, cuzk_done, curio_done in ((0.0, 10, 510), (10.0, 12, 532)):
        window.add(Reading(at, curio_done, 0, source="curio"))
        window.add(Reading(at, cuzk_done, 0, source="cuzk"))
    assert window.in_window() == (2, 0)
    window.add(Reading(20.0, 532, 0, source="curio"))  # cuzk missed this read
    assert window.in_window() == (2, 0) and window.since_up()[:2] == (2, 0), "cuzk's figures stay shown"
    window.add(Reading(50.0, 540, 0, source="curio"))  # cuzk blind past stale_s: curio's are all there is
    assert window.in_window() == (30, 0)


def curio_page(porep_done: int, porep_failed: int, winpost_done: int) -> str:
    return ("# TYPE curio_harmonytask_tasks_completed counter\n"
            f'curio_harmonytask_tasks_completed{{task_name="PoRep"}} {porep_done}\n'
            f'curio_harmonytask_tasks_completed{{task_name="WinPost"}} {winpost_done}\n'
            "# TYPE curio_harmonytask_tasks_failed counter\n"
            f'curio_harmonytask_tasks_failed{{task_name="PoRep"}} {porep_failed}\n')


def test_a_proving_task_that_always_fails_is_not_hidden_by_another_that_completes() -> None:
    # curio's WinPost completes every 30 s epoch, won or not (winning_task.go: persistNoWin is done). Summed with
    # it, a PoRep that failed every time read as proofs completing: a partition-workers build (curio's metrics its
    # only source) proved nothing for days. Each task is judged on its own.
    window = ProofWindow(3600.0)
    for minute in range(11):  # a PoRep failure a minute, two WinPost completions, no PoRep ever completed
        tasks = parse_curio_tasks(curio_page(0, minute, 2 * minute))
        assert tasks is not None
        window.add(Reading(minute * 60.0, 2 * minute, minute, source="curio", tasks=tasks))
    assert window.in_window() == (20, 10), "the totals are still the sums"
    assert window.failing_detail(5) == ("curio", 10, "PoRep") and (window.failing_detail(5) or ("",))[0] == "curio"
    healthy = ProofWindow(3600.0)
    for minute in range(11):  # the same failures, but PoRep completes too now and then: not failing
        tasks = parse_curio_tasks(curio_page(minute // 3, minute, 2 * minute))
        assert tasks is not None
        healthy.add(Reading(minute * 60.0, 2 * minute + minute // 3, minute, source="curio", tasks=tasks))
    assert healthy.failing_detail(5) is None

def test_cuzks_proof_kinds_are_judged_one_by_one() -> None:
    # cuzk's totals count every kind it proves: a PoRep that always fails beside PoSt proofs that complete read as
    # proofs completing. Its completed_by_kind and failed_by_kind say each kind's own.
    def body(minute: int) -> dict[str, object]:
        return {"counters": {"total_completed": 3 * minute, "total_failed": minute,
                             "completed_by_kind": {"winpost": 3 * minute}, "failed_by_kind": {"porep": minute}}}

    window = ProofWindow(3600.0)
    for minute in range(7):
        counters = parse_cuzk(body(minute))
        assert counters is not None
        window.add(Reading(minute * 60.0, counters[0], counters[1], source="cuzk", tasks=cuzk_kinds(body(minute))))
    assert cuzk_kinds(body(2)) == (("porep", 0, 2), ("winpost", 6, 0))
    assert window.failing_detail(5) == ("cuzk", 6, "porep")
    # Tables that are not tables of counts say nothing by kind (never a guess): the totals alone judge.
    for odd in ({"porep": -1}, {"porep": "2"}, {1: 2}, [("porep", 2)], {f"k{i}": 1 for i in range(65)}):
        assert cuzk_kinds({"counters": {"completed_by_kind": {}, "failed_by_kind": odd}}) == (), odd
    assert cuzk_kinds({"counters": {"total_completed": 1}}) == ()

def test_both_sources_failing_name_curios_counters_whichever_series_began_first() -> None:
    # curio read from its first minute (none done yet), cuzk only later, or the other way round: the verdict named
    # the series that happened to begin first. Both failing, it names curio's, the count of every failed proof.
    for curio_first in (True, False):
        window = ProofWindow(600.0)
        window.add(Reading(0.0, 0, 0, source="curio" if curio_first else "cuzk"))
        for i in range(1, 6):
            window.add(Reading(60.0 * i, 0, 3 * i, source="curio"))
            window.add(Reading(60.0 * i, 0, 10 + 3 * i, source="cuzk"))
        assert (window.failing_detail(5) or ("",))[0] == "curio", curio_first


def test_a_read_that_falls_back_to_curio_never_subtracts_cuzks_counters() -> None:
    # cuzk's /status times out every other minute and curio's metrics answer instead: their totals count other
    # things (cuzk 500 completed, curio 40). Each keeps its own series: a proof failing every minute, none
    # completing, is still seen as failing, never as hundreds of phantom completions or a reset.
    window = ProofWindow(3600.0)
    failing_at = None
    for i in range(12):
        at, failed = 60.0 * (i + 1), i + 1
        window.add(Reading(at, 500, failed, source="cuzk") if i % 2 == 0 else Reading(at, 40, failed, source="curio"))
        assert window.in_window()[0] == 0, "completions made up from two sources' counters"
        if failing_at is None and window.failing(5):
            failing_at = i
    assert failing_at == 6  # cuzk's own 4th reading: 6 failures since its first, none completed
    assert window.in_window() == (0, 10)  # curio's series (read last): failed 2 → 12
    assert window.since_up() == (0, 10, 600.0)

def test_the_window_keeps_one_reading_at_or_past_its_edge_as_the_base() -> None:
    window = ProofWindow(15.0)
    for at, failed in ((0, 0), (10, 1), (20, 2), (30, 5)):
        window.add(reading(at, 0, failed))
    # The base is the newest reading at least window_s before the latest: the counts cover the whole window.
    assert [r.at for r in window.readings] == [10, 20, 30]
    assert window.in_window() == (0, 4)
    assert window.since_up() == (0, 5, 30.0)  # since up counts from the first reading, whatever the window


def test_the_failed_counter_alone_going_down_starts_the_count_again() -> None:
    window = ProofWindow(60.0)
    window.add(reading(0, 2, 9))
    window.add(reading(10, 2, 0))
    window.add(reading(20, 2, 3))
    assert window.in_window() == (0, 3) and window.since_up() == (0, 3, 10.0)
    assert window.failing(3) and not window.failing(4)


# ---------------------------------------------------------------- the shapes


def test_cuzk_status_with_no_failed_counter_or_no_memory() -> None:
    assert parse_cuzk({"counters": {"total_completed": 4}}) == (4, 0, None)
    assert parse_cuzk({"counters": {"total_completed": 4, "total_failed": None}, "memory": None}) == (4, 0, None)
    assert parse_cuzk({"counters": {"total_completed": 4}, "memory": {"used_bytes": 5}}) == (4, 0, None)
    assert parse_cuzk({"counters": {"total_completed": 4}, "memory": {"used_bytes": 5, "total_bytes": "9"}}) == \
        (4, 0, None)


def test_cuzk_status_that_is_not_the_shape_is_no_answer() -> None:
    for body in (None, [], "ready", {"counters": []}, {"counters": {"total_completed": "7"}}, {}):
        assert parse_cuzk(body) is None, body


def test_cuzk_status_of_any_odd_shape_never_raises() -> None:
    # Memory of the wrong type: the counters without it. A failed counter that is no number: no answer (a
    # guess of 0 would hide failures), so curio's counters are read instead.
    assert parse_cuzk({"counters": {"total_completed": 4}, "memory": [1, 2]}) == (4, 0, None)
    assert parse_cuzk({"counters": {"total_completed": 4}, "memory": "64GiB"}) == (4, 0, None)
    assert parse_cuzk({"counters": {"total_completed": 4, "total_failed": [1]}}) is None
    assert parse_cuzk({"counters": {"total_completed": 4, "total_failed": "many"}}) is None


def test_curio_metrics_summed_over_the_proving_tasks_with_any_label_order() -> None:
    text = ('curio_harmonytask_tasks_completed{machine="m1",task_name="PoRep"} 2\n'
            'curio_harmonytask_tasks_completed{task_name="PoRep",machine="m2"} 3\n'
            '  curio_harmonytask_tasks_completed{task_name="WinPost"} 1.0e+00  \n'
            'curio_harmonytask_tasks_completed{task_name="TreeRC"} 50\n'
            'curio_harmonytask_tasks_failed{task_name="UpdateProve"} 2\n'
            'curio_harmonytask_tasks_failed{task_name="PSProve"} 0\n')
    assert parse_curio(text) == (6, 2)
    # Only non-proving tasks: no answer, not (0, 0).
    assert parse_curio('curio_harmonytask_tasks_completed{task_name="SDR"} 5\n') is None
    # A proving task seen with zero counts is an answer.
    assert parse_curio('curio_harmonytask_tasks_failed{task_name="WdPost"} 0\n') == (0, 0)


def test_curio_metrics_with_an_unreadable_value_never_raise() -> None:
    text = ('curio_harmonytask_tasks_completed{task_name="PoRep"} 1e+400\n'
            'curio_harmonytask_tasks_completed{task_name="PoRep"} ...\n'
            'curio_harmonytask_tasks_completed{task_name="PoRep"} 2\n')
    assert parse_curio(text) == (2, 0)


# ---------------------------------------------------------------- reading from real servers


@contextlib.contextmanager
def answering(routes: dict[str, tuple[int, bytes]]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            code, body = routes.get(self.path, (404, b"not found"))
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


STATUS = json.dumps({"counters": {"total_completed": 7, "total_failed": 1},
                     "memory": {"used_bytes": 40, "total_bytes": 100}}).encode()
METRICS = b'curio_harmonytask_tasks_completed{task_name="PoRep"} 3\n'


def test_cuzk_is_read_first_and_curio_beside_it() -> None:
    with answering({"/status": (200, STATUS), "/debug/metrics": (200, METRICS)}) as url:
        got = read_counters(f"{url}/status", f"{url}/debug/metrics")
        assert (got.source, got.completed, got.failed, got.memory, got.error) == ("cuzk", 7, 1, (40, 100), "")
        assert [(b.source, b.completed, b.failed) for b in got.beside] == [("curio", 3, 0)]
        assert got.tasks == () and got.beside[0].tasks == (("PoRep", 3, 0),)  # (STATUS names no kinds)
        got = read_counters("", f"{url}/debug/metrics")  # status_listen "": no cuzk status API
        assert (got.source, got.completed, got.failed, got.memory) == ("curio", 3, 0, None)


def test_curios_completed_figure_is_of_proofs_and_its_failed_of_every_proving_task() -> None:
    """Read without cuzk's /status (a partition-workers build), curio's completed figure and the rate were every
    proving task's: a WinPost not won every epoch, while every PoRep failed, read as 20 proofs completed, 3458/h."""
    page = (b'curio_harmonytask_tasks_completed{task_name="WinPost"} 20\n'
            b'curio_harmonytask_tasks_completed{task_name="WdPost"} 2\n'
            b'curio_harmonytask_tasks_completed{task_name="PoRep"} 0\n'
            b'curio_harmonytask_tasks_failed{task_name="PoRep"} 20\n'
            b'curio_harmonytask_tasks_failed{task_name="WinPost"} 1\n')
    with answering({"/debug/metrics": (200, page)}) as url:
        got = read_counters("", f"{url}/debug/metrics")
    assert (got.source, got.completed, got.failed) == ("curio", 0, 21), got
    window = ProofWindow(3600.0)
    window.add(replace(got, at=0.0, completed=0, failed=0, tasks=()))
    window.add(replace(got, at=360.0))
    assert window.since_up() == (0, 21, 360.0) and window.failing_detail(5) == ("curio", 20, "PoRep")
    assert summary_line(window, {}, None).startswith(
        "production: proofs 0 completed / 21 failed in the last 60 min, 0 / 21 since up (curio's proving tasks); "
        "0.0/h; ")
    proofs = (b'curio_harmonytask_tasks_completed{task_name="PoRep"} 3\n'
              b'curio_harmonytask_tasks_completed{task_name="PSProve"} 4\n'
              b'curio_harmonytask_tasks_completed{task_name="UpdateProve"} 5\n')
    with answering({"/debug/metrics": (200, proofs + page)}) as url:
        assert read_counters("", f"{url}/debug/metrics").completed == 12


def test_a_few_failures_spread_over_tasks_while_posts_complete_are_no_proofs_failing() -> None:
    """No PoRep to prove (none failed, none done), WdPost and WinPost done every epoch, a few of them failing: the
    total rule counted the failures of every task against the completions of the proofs alone (PROOF_TASKS), and
    gave the instance up. It weighs every task's completions against every task's failures."""
    def posts(at: float, done: int, failed: int) -> Reading:
        tasks = (("WdPost", done, failed), ("WinPost", done, failed), ("PoRep", 0, 0))
        return Reading(at, 0, 2 * failed, None, "curio", tasks=tasks)

    window = ProofWindow(3600.0)
    window.add(posts(0.0, 10, 0))
    window.add(posts(360.0, 22, 3))
    assert window.failing_detail(5) is None


def test_cuzks_kinds_come_with_its_reading() -> None:
    kinds = json.dumps({"counters": {"total_completed": 4, "total_failed": 2, "completed_by_kind": {"winpost": 4},
                                     "failed_by_kind": {"porep": 2}}}).encode()
    with answering({"/status": (200, kinds)}) as url:
        got = read_counters(f"{url}/status", "")
    assert (got.source, got.completed, got.failed, got.tasks) == ("cuzk", 4, 2, (("porep", 0, 2), ("winpost", 4, 0)))


def test_a_cuzk_answer_without_counters_falls_back_to_curio() -> None:
    with answering({"/status": (200, b'{"state": "ready"}'), "/debug/metrics": (200, METRICS)}) as url:
        got = read_counters(f"{url}/status", f"{url}/debug/metrics")
    assert (got.source, got.completed) == ("curio", 3)


def test_nothing_readable_is_a_reading_of_none_that_says_why() -> None:
    with answering({"/status": (200, b"not json"), "/debug/metrics": (200, b"up 1\n")}) as url:
        got = read_counters(f"{url}/status", f"{url}/debug/metrics")
        assert (got.completed, got.failed, got.source) == (None, None, "none")
        assert got.error.startswith("cuzk /status: ")
        assert got.error.endswith("; curio /debug/metrics has no proving task counters")
        got = read_counters(f"{url}/nothing", "")
        assert got.completed is None and got.error.startswith("cuzk /status: HTTP Error 404")
    empty = read_counters("", "")  # neither configured: nothing read, no error to tell
    assert (empty.completed, empty.failed, empty.source, empty.error) == (None, None, "none", "")


def test_an_odd_cuzk_answer_from_a_server_is_still_a_reading() -> None:
    odd = json.dumps({"counters": {"total_completed": 2}, "memory": ["used", 1]}).encode()
    with answering({"/status": (200, odd)}) as url:
        got = read_counters(f"{url}/status", "")
    assert (got.source, got.completed, got.failed, got.memory) == ("cuzk", 2, 0, None)


# ---------------------------------------------------------------- the summary line


def window_of(*points: tuple[float, int, int], window_s: float = 600.0) -> ProofWindow:
    window = ProofWindow(window_s)
    for at, done, failed in points:
        window.add(reading(at, done, failed))
    return window


def test_the_summary_takes_cuzks_memory_when_the_core_has_none() -> None:
    line = summary_line(window_of((0, 0, 0), (1800, 5, 0)), {}, (10 * GIB, 40 * GIB))
    assert line == ("production: proofs 5 completed / 0 failed in the last 10 min, 5 / 0 since up (cuzk /status); "
                    "10.0/h; memory 10.0GiB of 40.0GiB; GPU utilisation unknown")


def test_the_cores_memory_wins_and_each_gpu_is_listed() -> None:
    machine = {"memory_used": 3 * GIB, "memory_limit": 4 * GIB, "gpu_utilization": [90, 0, 55]}
    line = summary_line(window_of((0, 0, 0)), machine, (10 * GIB, 40 * GIB))
    assert line.endswith("; 0.0/h; memory 3.0GiB of 4.0GiB; GPU 90%, 0%, 55%")


def test_memory_without_a_limit_is_unknown() -> None:
    assert "memory unknown" in summary_line(window_of(), {"memory_used": GIB, "memory_limit": 0}, None)
    assert "memory unknown" in summary_line(window_of(), {}, None)
    assert summary_line(window_of(), {}, None).startswith(
        "production: proofs 0 completed / 0 failed in the last 10 min, 0 / 0 since up; 0.0/h; ")


# ---------------------------------------------------------------- proofs_failing, a reason the prover registers


def test_proofs_failing_is_a_watchers_finding_whatever_curio_did_on_the_stop() -> None:
    """The status test_timeout_exit.py holds the core's findings to: registered by the prover (Plugin.reasons)."""
    assert failure_status(PROOFS_FAILING, 0, PLUGIN.reasons) == failure_status(PROOFS_FAILING, 143, PLUGIN.reasons) \
        == EXIT_FAILURE
    assert failure_status(BENCH_FAILED, 7, PLUGIN.reasons) == EXIT_FAILURE
    # Curio stopped for it dies of the SIGTERM: the verdict keeps the prover's reason and exits 1.
    killed = ExitStatus.from_wait_status(15)  # killed by SIGTERM
    stopped = from_exit("curio", "curio", 4242, killed, stop_reason=PROOFS_FAILING, daemon=False, attempt=1,
                        started_at=0.0, last_lines=[], stop_detail="3 proofs failed", added=PLUGIN.reasons)
    assert (stopped.reason, stopped.success, stopped.status) == (PROOFS_FAILING, False, EXIT_FAILURE)
    unknown = from_exit("curio", "curio", 4242, killed, stop_reason=PROOFS_FAILING, daemon=False, attempt=1,
                        started_at=0.0, last_lines=[])
    assert unknown.reason == STOPPED, "without the prover's reasons it is no reason the core knows"


def test_a_long_window_of_frequent_readings_keeps_a_bounded_few() -> None:
    """A day's window read every second kept every reading (93 MiB); its figures read its ends alone."""
    window = ProofWindow(86400.0)
    for second in range(0, 2 * 86400, 2):
        window.add(Reading(float(second), second // 60, second // 3600, source="cuzk"))
    assert len(window.readings) <= 2 * 720 + 2, len(window.readings)
    done, failed = window.in_window()
    assert abs(done - 86400 // 60) <= 2 and abs(failed - 24) <= 1, (done, failed)
    assert window.since_up()[:2] == ((2 * 86400 - 2) // 60, (2 * 86400 - 2) // 3600)
