"""Which cuzk-daemon build the stand-in plays (standins/cuzk_generations.py), in-process.

Promises: ``STANDIN_CUZK_GENERATION`` names the build (unified by default; ``feb-2026`` is partition-workers;
anything else is a usage error naming the value); a unified build warns about ``partition_workers`` and ignores
it; a partition-workers build lets at most pw proofs synthesize
at once, each at a peak of baseline + per-worker x pw, and is OOM-killed at its first synthesis when the
machine's memory (``STANDIN_DAEMON_MEMORY``) is below that peak. The kill itself is exercised in a real child.
"""

from __future__ import annotations

import subprocess
import textwrap
import threading

import pytest
from helpers import PY, REPO

from supervisor.prover.standins import cuzk_generations as gen
from supervisor.prover.standins.knobs import UsageError

GIB = gen.GIB


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STANDIN_CUZK_GENERATION", "STANDIN_PW_BASELINE",
                 "STANDIN_PW_PER_WORKER", "STANDIN_DAEMON_MEMORY"):
        monkeypatch.delenv(name, raising=False)


def test_generation_defaults_to_unified_and_reads_names_and_the_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen.generation() == "unified"
    monkeypatch.setenv("STANDIN_CUZK_GENERATION", "   ")
    assert gen.generation() == "unified"
    monkeypatch.setenv("STANDIN_CUZK_GENERATION", " Partition-Workers ")
    assert gen.generation() == gen.PW_GENERATION
    monkeypatch.setenv("STANDIN_CUZK_GENERATION", "FEB-2026")
    assert gen.generation() == gen.PW_GENERATION


def test_an_unknown_generation_is_a_usage_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_CUZK_GENERATION", "mar-2027")
    with pytest.raises(UsageError) as caught:
        gen.generation()
    assert "STANDIN_CUZK_GENERATION='mar-2027'" in str(caught.value)
    assert "partition-workers" in str(caught.value)


def test_unified_build_warns_about_partition_workers_and_ignores_it() -> None:
    logged: list[tuple[str, str]] = []
    gen.ignore_partition_workers({"partition_workers": 4}, lambda lvl, msg: logged.append((lvl, msg)))
    assert len(logged) == 1 and logged[0][0] == "warn"
    assert "partition_workers is deprecated and ignored" in logged[0][1]


def test_unified_build_says_nothing_when_the_key_is_absent() -> None:
    logged: list[tuple[str, str]] = []
    gen.ignore_partition_workers({"other": 1}, lambda lvl, msg: logged.append((lvl, msg)))
    assert logged == []


def test_partition_workers_defaults_and_refuses_a_bad_count() -> None:
    assert gen.PartitionWorkers({}).count == gen.DEFAULT_PARTITION_WORKERS
    assert gen.PartitionWorkers({"partition_workers": 5}).count == 5
    for bad in (0, -2, "2", 1.5, None):
        with pytest.raises(ValueError, match="invalid \\[synthesis\\] partition_workers"):
            gen.PartitionWorkers({"partition_workers": bad})


def test_peak_is_baseline_plus_per_worker_times_count(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen.PartitionWorkers({"partition_workers": 2}).peak() == 69 * GIB + 2 * 20 * GIB
    monkeypatch.setenv("STANDIN_PW_BASELINE", "1GiB")
    monkeypatch.setenv("STANDIN_PW_PER_WORKER", "1048576")
    assert gen.PartitionWorkers({"partition_workers": 3}).peak() == GIB + 3 * 1024 * 1024


class CountingWorkers(gen.PartitionWorkers):
    """Counts the proofs inside a slot: the memory check runs first thing in one."""

    def __init__(self, synthesis: dict) -> None:
        super().__init__(synthesis)
        self.lock = threading.Lock()
        self.inside = self.most = 0
        self.entered = threading.Semaphore(0)

    def _oom_if_over_memory(self, on_oom) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        self.entered.release()
        super()._oom_if_over_memory(on_oom)


def test_no_more_than_count_proofs_synthesize_at_once() -> None:
    pw = CountingWorkers({"partition_workers": 2})
    stop = threading.Event()
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(pw.synthesize(stop, 30, lambda _: None)))
               for _ in range(4)]
    for t in threads:
        t.start()
    assert pw.entered.acquire(timeout=10) and pw.entered.acquire(timeout=10)
    assert not pw.entered.acquire(timeout=0.3)  # two hold the slots: the others wait
    assert pw.most == 2
    stop.set()
    for t in threads:
        t.join(10)
    # Those inside were cut short by the shutdown; those still waiting gave up without a slot.
    assert results == [False] * 4


def test_synthesize_completes_when_not_stopped_and_frees_its_slot() -> None:
    pw = gen.PartitionWorkers({"partition_workers": 1})
    stop = threading.Event()
    assert pw.synthesize(stop, 0, lambda _: None) is True
    assert pw.synthesize(stop, 0, lambda _: None) is True  # the slot came back


def test_no_oom_when_the_machine_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_DAEMON_MEMORY", "200GiB")
    called: list[str] = []
    assert gen.PartitionWorkers({"partition_workers": 2}).synthesize(threading.Event(), 0, called.append)
    assert called == []


def test_a_peak_above_the_machines_memory_kills_the_daemon_at_its_first_synthesis() -> None:
    code = textwrap.dedent("""
        import os, threading
        from supervisor.prover.standins import cuzk_generations as gen
        os.environ["STANDIN_DAEMON_MEMORY"] = "100GiB"
        pw = gen.PartitionWorkers({"partition_workers": 2})  # 69 + 40 = 109 GiB > 100 GiB
        pw.synthesize(threading.Event(), 0, lambda why: print("oom", why, flush=True))
        print("survived", flush=True)
    """)
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == -9, done.stderr
    assert done.stdout.splitlines() == [f"oom peak={109 * GIB} memory={100 * GIB}"]
