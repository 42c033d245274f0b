"""The I/O thread and the progress walker held to the watches' rule (watchstate.py): a bug of ours that escapes a
round (here simulated: one call raising once, after the round's own containment) is said, counted, and the thread
starts again; nothing it measured before the failure is published as the latest afterwards.

Before, such a bug killed the thread for good: one line from the thread-death hook, then a watch shown as
``blind: no answer yet`` with no failure counted, every later attempt without I/O evidence (the thread was never
started again), and the walker's ``latest`` still the previous attempt's walk.
"""

from __future__ import annotations

import os
import subprocess
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from supervisor.engine.trees import TAG_ENV
from supervisor.evidence import iowatch, progress
from supervisor.evidence.iowatch import IoLedger, IoProbe, ProcIo, read_io
from supervisor.evidence.progress import ProgressProbe
from supervisor.evidence.watchstate import WatchState

# Generous: the machine is shared and loaded; every wait below is for a condition, never for a time.
WAIT_S = 30.0


def raising_once(real: Callable[..., Any], at_call: int, exc: Exception) -> Callable[..., Any]:
    """``real``, except that its ``at_call``-th call raises ``exc`` (a bug of ours, once)."""
    calls = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at_call:
            raise exc
        return real(*args, **kwargs)

    return wrapped


def restart_after(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType, seconds: float) -> None:
    """The thread of ``module`` starts again ``seconds`` after a failure (1 s in production, doubling). (Set
    even where the module has no such name: the code before the fix, where the test fails on the thread's
    death, not here.)"""
    monkeypatch.setattr(module, "THREAD_RESTART_S", seconds, raising=False)


def said_until(state: WatchState, wanted: str) -> list[str]:
    """What the watch says on its ticks until a line containing ``wanted`` comes (checked as the tick would)."""
    lines: list[str] = []
    wait_for(lambda: lines.extend(state.check()) or any(wanted in line for line in lines), timeout=WAIT_S)
    return lines


# ================================================================ the I/O thread


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    if read_io(os.getpid()) is None:
        pytest.skip("/proc/<pid>/io is not readable here (a kernel without task I/O accounting)")
    child = subprocess.Popen(["sh", "-c", "exec sleep 120"], env={**os.environ, TAG_ENV: "restarts.1"},
                             start_new_session=True)
    yield child
    child.kill()
    child.wait(10)


def test_an_io_thread_whose_round_raises_says_so_counts_it_and_reads_again(
        sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    restart_after(monkeypatch, iowatch, 0.2)
    monkeypatch.setattr(IoLedger, "add", raising_once(IoLedger.add, 3, KeyError("a bug in the I/O ledger")))
    probe = IoProbe()
    watch = probe.watch(0.05)
    try:
        watch.follow([(sleeper.pid, "restarts.1")])
        lines = said_until(probe.state, "stopped unexpectedly")
        assert lines == ["I/O watch: stopped unexpectedly (the I/O thread failed: KeyError: 'a bug in the I/O "
                         "ledger'); started again in 0.2 s"], lines
        assert probe.state.to_dict()["failures"] == 1
        watch.release()
        # The next attempt's watch: the same thread, started again, reads for it.
        watch = probe.watch(0.05)
        watch.follow([(sleeper.pid, "restarts.1")])
        first = wait_for(watch.latest, timeout=WAIT_S)
        wait_for(lambda: (latest := watch.latest()) is not None and latest.seq > first.seq, timeout=WAIT_S)
        assert probe._thread is not None and probe._thread.is_alive()
        assert probe.state.current == "reading" and probe.state.blind_why() is None
        assert probe.state.to_dict()["failures"] == 1
    finally:
        watch.release()
        probe.close()


def test_an_io_thread_that_failed_publishes_nothing_of_before_the_failure_and_ends_when_closed(
        sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    restart_after(monkeypatch, iowatch, 3600.0)  # (held in its wait: nothing new comes meanwhile)
    monkeypatch.setattr(IoLedger, "add", raising_once(IoLedger.add, 3, KeyError("a bug in the I/O ledger")))
    probe = IoProbe()
    watch = probe.watch(0.05)
    try:
        watch.follow([(sleeper.pid, "restarts.1")])
        wait_for(watch.latest, timeout=WAIT_S)
        said_until(probe.state, "stopped unexpectedly")
        assert watch.latest() is None, "a reading of before the failure still read as the latest"
    finally:
        watch.release()
        probe.close()
    thread = probe._thread
    assert thread is not None
    thread.join(WAIT_S)
    assert not thread.is_alive(), "a close did not end the wait before the restart"


def test_a_ledger_rebased_takes_its_next_reading_as_the_baseline_and_keeps_its_totals() -> None:
    # After a round that failed midway, the ledger's last reading is half taken in: the next reading is a new
    # baseline (never counted twice), and the totals a watch has read go on from where they were.
    ledger = IoLedger(from_zero=True)
    ledger.add([ProcIo(10, 1, (100, 50, 0, 0))])
    ledger.rebase()
    ledger.add([ProcIo(10, 1, (1000, 500, 0, 0))])
    assert (ledger.moved, ledger.written, ledger.readable) == (150, 50, True)
    ledger.add([ProcIo(10, 1, (1100, 550, 0, 0))])
    assert (ledger.moved, ledger.written) == (300, 100)


# ================================================================ the progress walker


def test_a_walker_whose_walk_raises_outside_its_try_says_so_and_walks_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    restart_after(monkeypatch, progress, 0.2)
    monkeypatch.setattr(progress, "TreeMeasure", raising_once(progress.TreeMeasure, 3,
                                                              KeyError("a bug building a measure")))
    (tmp_path / "f").write_bytes(b"x" * 5)
    probe = ProgressProbe()
    release = probe.watch(str(tmp_path), 0.05)
    try:
        lines = said_until(probe.state, "stopped unexpectedly")
        assert lines == ["progress walker: stopped unexpectedly (the progress walker failed: KeyError: 'a bug "
                         "building a measure'); started again in 0.2 s"], lines
        assert probe.state.to_dict()["failures"] == 1
        before = probe.latest(str(tmp_path))
        release()
        # The next attempt's watch of the same path: walked again, by the same thread started again.
        release = probe.watch(str(tmp_path), 0.05)
        (tmp_path / "g").write_bytes(b"y" * 7)
        walked = wait_for(lambda: (m := probe.latest(str(tmp_path))) is not None and m.size == 12 and m,
                          timeout=WAIT_S)
        assert before is None or walked.seq > before.seq
        assert probe._thread is not None and probe._thread.is_alive()
        assert probe.state.current == "reading" and probe.state.to_dict()["failures"] == 1
    finally:
        release()
        probe.close()


def test_a_walker_that_failed_shows_no_walk_of_before_the_failure_as_the_latest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    restart_after(monkeypatch, progress, 3600.0)  # (held in its wait: nothing new comes meanwhile)
    monkeypatch.setattr(progress, "TreeMeasure", raising_once(progress.TreeMeasure, 3,
                                                              KeyError("a bug building a measure")))
    probe = ProgressProbe()
    release = probe.watch(str(tmp_path), 0.05)
    try:
        wait_for(lambda: probe.latest(str(tmp_path)), timeout=WAIT_S)
        said_until(probe.state, "stopped unexpectedly")
        assert probe.latest(str(tmp_path)) is None, "the walk of before the failure still read as the latest"
        assert probe._walking is None, "a walk that ended in the failure would be said to be still going"
    finally:
        release()
        probe.close()
    thread = probe._thread
    assert thread is not None
    thread.join(WAIT_S)
    assert not thread.is_alive(), "a close did not end the wait before the restart"
