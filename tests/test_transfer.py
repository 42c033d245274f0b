"""A phase's progress, in-process: the windowed rate, the figures, the too_slow rule at its boundary, the
walker's complete-file bytes (a file with a control file beside it is not complete), /proc/net/dev, the
instance's first-seen times across restarts, the status line and the metrics."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeClock

from supervisor.config import parse_plan
from supervisor.engine.loop import EventLoop
from supervisor.evidence.progress import (
    COMPLETE_QUIET_S,
    FUTURE_MTIME_S,
    NET_DEV,
    ProgressProbe,
    TreeMeasure,
    net_received,
    tree_done,
)
from supervisor.evidence.progresswatch import PROGRESS_TICK_S, SETTLED_LOOK_S, ProgressWatch, done_bytes
from supervisor.evidence.transfer import TOO_SLOW_MARGIN, RateWindow, figures, progress_text, too_slow
from supervisor.lifecycle.hooks import ProgressReading
from supervisor.state import files as state_files
from supervisor.state.firstseen import FirstSeen
from supervisor.status.health import metrics_text
from supervisor.status.model import Snapshot
from supervisor.status.render import render
from supervisor.text.show import span

MIB = 1 << 20
GIB = 1 << 30


def test_the_rate_is_the_bytes_gained_over_the_window() -> None:
    window = RateWindow(10.0)
    for t in range(0, 31):
        window.add(float(t), t * MIB if t < 20 else 20 * MIB + (t - 20) * MIB // 4)
    assert window.rate() == MIB * 2.5 / 10  # the last 10 s: 2.5 MiB
    assert abs(window.average() - (22.5 * MIB) / 30) < 1


def test_a_short_stall_of_the_link_does_not_make_it_too_slow() -> None:
    # 1 MiB/s for a minute, then 5 s of nothing: the window's rate dips, the attempt's average does not.
    window = RateWindow(60.0)
    for t in range(0, 61):
        window.add(float(t), t * MIB)
    for t in range(61, 66):
        window.add(float(t), 60 * MIB)
    judged = max(window.rate(), window.average())
    progress = figures(60 * MIB, 100 * MIB, window.rate())
    assert too_slow(progress, judged, time_left_s=50.0, deadline_said="the deadline") is None


def test_too_slow_at_its_boundary_and_naming_the_numbers() -> None:
    progress = figures(int(1.8 * GIB), 50 * GIB, 3.1 * MIB)
    left = 50 * GIB - int(1.8 * GIB)
    needs = left / (3.1 * MIB)
    # Exactly what it needs with the margin: it can still make it.
    assert too_slow(progress, 3.1 * MIB, needs * (1 + TOO_SLOW_MARGIN), "x") is None
    detail = too_slow(progress, 3.1 * MIB, 81 * 60, "the manager's timeout")
    assert detail == "48.2GiB left at 3.1MiB/s: 4h25m, 81m00s left before the manager's timeout"
    assert too_slow(progress, 0.0, 10, "x") is None  # a silent link is the stall watch's
    assert too_slow(figures(5, None, 1.0), 1.0, 0, "x") is None  # no total: nothing to judge


def test_figures_eta_and_a_total_that_was_too_low() -> None:
    assert figures(10 * MIB, 60 * MIB, MIB).eta_s == 50.0
    grown = figures(70 * MIB, 60 * MIB, MIB)
    assert grown.total_bytes == 70 * MIB and grown.eta_s == 0.0
    assert set(figures(1, 2, 1.0).to_dict()) >= {"done_bytes", "total_bytes", "rate_bytes_s", "eta_s"}
    # Before a download's first byte its processes write a few bytes (the shell's, a line of output): no time left
    # is worked out of them (status read "8B/52.0MiB 2B/s ETA 5690h53m"); the rate itself is still shown.
    silent = figures(8, 52 * MIB, 2.0)
    assert (silent.rate_bytes_s, silent.eta_s) == (2.0, None)
    assert figures(8, 52 * MIB, 1024.0).eta_s == (52 * MIB - 8) / 1024.0
    assert span(42) == "42s" and span(81 * 60) == "81m00s" and span(4 * 3600 + 25 * 60) == "4h25m"


def test_a_file_with_its_control_file_beside_it_is_not_complete(tmp_path: Path) -> None:
    done = tmp_path / "a.params"
    done.write_bytes(b"x" * 8192)
    under_way = tmp_path / "b.params"
    with open(under_way, "wb") as fh:  # preallocated to its full size, as aria2c does
        os.posix_fallocate(fh.fileno(), 0, 1 << 20)
    (tmp_path / "b.params.aria2").write_bytes(b"ctl")
    (tmp_path / "fetch.lock").write_bytes(b"")
    later = time.time() + 60  # looked at a minute on: nothing is being written any more
    size, files, complete, complete_files, _ = tree_done(tmp_path, later)
    assert complete == 8192 and complete_files == 1
    assert size == 8192 + (1 << 20) + 3 and files == 4
    (tmp_path / "b.params.aria2").unlink()
    assert tree_done(tmp_path, later)[2:4] == (8192 + (1 << 20), 2)


def test_one_file_with_its_control_file_beside_it_is_not_complete_either(tmp_path: Path) -> None:
    # progress_path naming one file: a preallocated one counted as complete (done = its whole size before a byte
    # came), so the download could never be too slow.
    under_way = tmp_path / "b.params"
    with open(under_way, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 1 << 20)
    (tmp_path / "b.params.aria2").write_bytes(b"ctl")
    later = time.time() + 60
    assert tree_done(under_way, later)[:4] == (1 << 20, 1, 0, 0)
    (tmp_path / "b.params.aria2").unlink()
    assert tree_done(under_way, later)[:4] == (1 << 20, 1, 1 << 20, 1)


@pytest.mark.parametrize("lone", [False, True], ids=["in-a-directory", "named-alone"])
def test_a_file_just_allocated_is_not_complete_before_its_control_file_comes(tmp_path: Path, lone: bool) -> None:
    """aria2c allocates a new file whole and writes its control file beside it only then (0.6 ms later here,
    more on a loaded machine): a walk between the two must not count the whole file done before a byte came,
    since a download's figure never goes down. A file written within COMPLETE_QUIET_S is not complete yet."""
    new = tmp_path / "c.params"
    with open(new, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 1 << 20)
    written = new.stat().st_mtime
    where = new if lone else tmp_path
    assert tree_done(where, written)[2:4] == (0, 0), "no control file yet, but just allocated"
    assert tree_done(where, written + COMPLETE_QUIET_S / 2)[2:4] == (0, 0)
    assert tree_done(where, written + COMPLETE_QUIET_S)[2:4] == (1 << 20, 1), "left alone since: complete"
    # A cache copied with another machine's clock, its times ahead of ours: its files are complete all the same.
    os.utime(new, (written + 3600, written + 3600))
    assert tree_done(where, written)[2:4] == (1 << 20, 1)


@pytest.mark.parametrize("lone", [False, True], ids=["in-a-directory", "named-alone"])
def test_a_file_its_allocating_downloader_holds_open_is_not_complete_however_quiet(tmp_path: Path, lone: bool) -> None:
    """aria2c where fallocate is refused writes its file whole with zeros, then flushes them (seconds on a slow
    disk, nothing written meanwhile), and makes its control file only after: a walk in that flush found a quiet
    file with no control file and counted it complete, 100% in status, then 'a file removed' once the control file
    came. A file the downloader holds open (``held``: its st_dev and st_ino) is being written, not complete."""
    filled = tmp_path / "f.params"
    filled.write_bytes(bytes(1 << 20))
    (tmp_path / "done.params").write_bytes(b"d" * 4096)
    st = filled.stat()
    held = frozenset({(st.st_dev, st.st_ino)})
    where = filled if lone else tmp_path
    later = time.time() + 60  # quiet for a minute
    assert tree_done(where, later, held=held)[2:4] == ((0, 0) if lone else (4096, 1))
    assert tree_done(where, later, held=frozenset())[2:4] == ((1 << 20, 1) if lone else ((1 << 20) + 4096, 2))
    assert tree_done(where, later, held=frozenset({(st.st_dev, st.st_ino + 1)}))[2] > 0, "another file held"


def test_a_walk_says_the_newest_write_under_the_path_and_leaves_out_one_from_the_future(tmp_path: Path) -> None:
    """A preallocated file does not grow while aria2c writes it; its mtime moves. A file whose mtime lies ahead of
    the walk (a cache copied with another clock's times) is no write of now, and would hide every later one."""
    assert tree_done(tmp_path / "absent").newest is None
    assert tree_done(tmp_path).newest is None, "no file, no write"
    older, newer = tmp_path / "a.params", tmp_path / "sub" / "b.params"
    newer.parent.mkdir()
    older.write_bytes(b"a")
    newer.write_bytes(b"b")
    os.utime(older, (1000.0, 1000.0))
    os.utime(newer, (2000.0, 2000.0))
    assert tree_done(tmp_path, 3000.0).newest == 2000.0, "the newest of the tree, a subdirectory's included"
    assert tree_done(older, 3000.0).newest == 1000.0, "a path naming one file"
    os.utime(newer, (3000.0 + FUTURE_MTIME_S + 1, 3000.0 + FUTURE_MTIME_S + 1))
    assert tree_done(tmp_path, 3000.0).newest == 1000.0, "a write from the future is left out"
    assert tree_done(tmp_path, 3000.0 + FUTURE_MTIME_S + 1).newest == 3000.0 + FUTURE_MTIME_S + 1


def test_a_long_walk_looks_at_the_clock_per_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A walk of a big tree takes seconds: a file written while it went on has an mtime past the walk's start, and
    compared with that start it read as one from the future, its write never seen."""
    from supervisor.evidence import progress

    (tmp_path / "sub").mkdir()
    written = tmp_path / "sub" / "a.params"
    written.write_bytes(b"a")
    os.utime(written, (5000.0, 5000.0))
    clock = itertools.chain([4990.0], itertools.repeat(5000.5))  # the walk began 10 s before the write, and
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))  # reached sub/ after it
    assert progress.tree_done(tmp_path).newest == 5000.0


def test_received_bytes_leave_out_the_loopback() -> None:
    text = ("Inter-|   Receive                            |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes\n"
            "    lo: 9000000     100    0    0    0     0          0         0  9000000\n"
            "  eth0: 1234567     900    0    0    0     0          0         0  555\n"
            "  eth1:    1000      10    0    0    0     0          0         0  5\n")
    assert net_received(text) == 1235567
    assert net_received("garbage") is None
    assert isinstance(net_received(), int | None)  # the real file reads (None only where there is none)


def test_what_is_done_from_each_source() -> None:
    cache = TreeMeasure("/c", 100 * MIB, 3, 0.0, 0.0, 1, done=40 * MIB, done_files=2)
    reading = ProgressReading(in_flight_bytes=5 * MIB, done_bytes=30 * MIB, done_files=1)
    assert done_bytes(cache, reading, None, 0) == 45 * MIB  # the complete files + the file under way
    assert done_bytes(None, reading, None, 0) == 30 * MIB
    net = TreeMeasure(NET_DEV, 0, 0, 0.0, 0.0, 1)
    assert net.size == 0
    assert done_bytes(cache, None, 50 * MIB, 10 * MIB) == 60 * MIB  # a program that prints nothing
    assert done_bytes(cache, None, None, 10 * MIB) == 40 * MIB
    # The trees' writes since the attempt began, on top of what was complete then: live while the readout is
    # held in aria2c's pipe buffer, and the larger estimate wins, never a sum of two.
    assert done_bytes(cache, None, None, 10 * MIB, written=45 * MIB) == 55 * MIB
    assert done_bytes(cache, reading, None, 0, written=50 * MIB) == 50 * MIB


def test_a_resumed_file_counts_neither_twice_nor_backwards() -> None:
    # 40 MiB complete when the attempt began, and a 20 MiB file resumed (--continue) at 8 MiB: its first 8 MiB
    # are not counted until it is complete (aria2c writes only the rest, 12 MiB), then it counts whole, once.
    before = TreeMeasure("/c", 60 * MIB, 3, 0.0, 0.0, 1, done=40 * MIB, done_files=2)
    assert done_bytes(before, None, None, 40 * MIB, written=6 * MIB) == 46 * MIB
    after = TreeMeasure("/c", 60 * MIB, 3, 0.0, 0.0, 2, done=60 * MIB, done_files=3)
    assert done_bytes(after, None, None, 40 * MIB, written=12 * MIB) == 60 * MIB  # not 40 + 12 + 20


def test_the_first_seen_times_outlive_a_restart(tmp_path: Path) -> None:
    clock = iter([1000.0, 1100.0, 5000.0, 6000.0])
    first = FirstSeen(tmp_path, print, now=lambda: next(clock))
    assert first.anchor() == (1000.0, "the first start")
    first.registered()
    assert first.anchor() == (1100.0, "the first registration")
    again = FirstSeen(tmp_path, print, now=lambda: next(clock))  # the next start
    again.registered()
    assert again.anchor() == (1100.0, "the first registration")
    saved = json.loads(state_files.path(tmp_path, state_files.FIRST_SEEN).read_text())
    assert saved == {"first_start": 1000.0, "first_registered": 1100.0}


def test_an_unreadable_first_seen_file_starts_afresh_and_says_so(tmp_path: Path) -> None:
    state_files.path(tmp_path, state_files.FIRST_SEEN).write_text("{not json")
    said: list[str] = []
    first = FirstSeen(tmp_path, said.append, now=lambda: 7.0)
    assert first.anchor() == (7.0, "the first start")
    assert said and "cannot read" in said[0]


def test_status_draws_its_own_progress_line_and_metrics_carry_the_figures() -> None:
    progress = figures(15 * GIB, 50 * GIB, 12 * MIB, files_done=3).to_dict()
    line = progress_text(progress)
    assert line is not None and line.startswith("[#########") and " 30% 15.0GiB/50.0GiB 12.0MiB/s ETA 49m46s" in line
    snap = {"lifecycle": {"state": "running", "current": "paramfetch"},
            "phases": [{"name": "paramfetch", "state": "running", "since": 0, "why": "", "attempt": 1,
                        "progress": progress}]}
    assert "progress [#" in render(Snapshot.from_json(snap), live=True, now=0)
    text = metrics_text(Snapshot.from_json(snap))
    assert f'prover_supervisor_phase_progress_done_bytes{{phase="paramfetch"}} {15 * GIB}' in text
    assert f'prover_supervisor_phase_progress_total_bytes{{phase="paramfetch"}} {50 * GIB}' in text
    assert 'prover_supervisor_phase_progress_eta_s{phase="paramfetch"}' in text


class _Fetch:
    """The attempt a progress watch follows, as much as it reads (a download with no process of its own here)."""

    def __init__(self) -> None:
        self.running = True
        self.said: ProgressReading | None = None  # what its command's output said of the download

    def roots(self) -> list[tuple[int, str]]:
        return []

    def cgroup(self) -> None:  # (no cgroup of its own)
        return None

    def reading(self) -> ProgressReading | None:
        return self.said

    def current(self) -> bool:
        return self.running

    def too_slow(self, why: str) -> None:
        raise AssertionError(f"a download that completes is not too slow: {why}")

    def fault(self, what: str, exc: Exception) -> None:
        raise AssertionError(f"{what}: {exc!r}")


@contextlib.contextmanager
def _watched_fetch(tmp_path: Path) -> Iterator[tuple[FakeClock, EventLoop, ProgressProbe, ProgressWatch, _Fetch,
                                                     list[str]]]:
    """Three 1 MiB files under tmp_path/cache: two done a minute ago, one written just now (no control file: its
    downloader put its last byte in a moment ago); a progress watch of it on a fake clock, the real walker (closed
    at the end, with the loop)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("a.params", "b.params", "c.vk"):
        (cache / name).write_bytes(b"\1" * MIB)
    for name in ("a.params", "b.params"):
        os.utime(cache / name, (time.time() - 60, time.time() - 60))
    spec = parse_plan(f'[[phases]]\nname = "fetch"\ncommand = ["fake"]\nprogress_total = "3MiB"\n'
                      f'progress_path = "{cache}"\n', "test.toml", {}).phases[0]
    clock, probe, fetch, lines = FakeClock(), ProgressProbe(), _Fetch(), []
    loop = EventLoop(clock=clock)
    evidence = SimpleNamespace(progress=probe, io=None, first_seen=None, freeze=None)
    watch = ProgressWatch(spec, loop, lines.append, evidence, fetch)
    try:
        yield clock, loop, probe, watch, fetch, lines
    finally:
        probe.close()
        loop.close()


def _run_until(clock: FakeClock, loop: EventLoop, step: float, done: Callable[[], bool]) -> None:
    """Steps of the fake clock, the loop run at each, until ``done`` (the walker runs on real time: 10 s at most)."""
    give_up = time.monotonic() + 10
    while not done():
        assert time.monotonic() < give_up, "the walker never measured"
        clock.now += step
        loop.run_once(max_wait=0)
        time.sleep(0.01)


@pytest.mark.parametrize("success", [True, False], ids=["ended-well", "failed"])
def test_a_download_that_ended_well_keeps_its_whole_figure_not_its_last_ticks(tmp_path: Path, success: bool) -> None:
    # The figures were those of the attempt's last tick, whose walk had not counted a file completed within
    # COMPLETE_QUIET_S of the end: the status showed the done phase at 67% (91-97% with the real aria2c), with a
    # rate and an ETA, for good. An attempt that ended well takes one settled walk (nothing writes any more).
    with _watched_fetch(tmp_path) as (clock, loop, probe, watch, fetch, lines):
        _run_until(clock, loop, PROGRESS_TICK_S, lambda: watch.progress is not None)
        last_tick = watch.figures()
        assert last_tick is not None and last_tick["done_bytes"] == 2 * MIB and last_tick["files_done"] == 2, last_tick
        fetch.running = False
        watch.finish(success)
        if success:
            _run_until(clock, loop, SETTLED_LOOK_S, lambda: watch.figures() != last_tick)
            assert watch.figures() == {"done_bytes": 3 * MIB, "total_bytes": 3 * MIB, "rate_bytes_s": None,
                                       "eta_s": 0.0, "files_done": 3}, watch.figures()
        else:  # a failed one keeps what its last tick saw: its files may still be written by what is being stopped
            for _ in range(20):
                clock.now += SETTLED_LOOK_S
                loop.run_once(max_wait=0)
            time.sleep(0.1)
            assert watch.figures() == last_tick
        clock.now += PROGRESS_TICK_S  # (the tick already due finds the watch finished)
        loop.run_once(max_wait=0)
        assert watch.figures() == (last_tick if not success else {**last_tick, "done_bytes": 3 * MIB, "files_done": 3,
                                                                  "eta_s": 0.0})
        assert loop.next_due() is None, "nothing more is looked at"
        with probe._cond:
            assert not probe._watches and not probe._settles and not probe._settled, "everything released"
        assert lines == []


def test_a_file_fetched_again_before_a_good_end_counts_once_in_the_last_figure(tmp_path: Path) -> None:
    # curio said it threw a file away to fetch it again, and no walk saw it go (fetched again within the quiet
    # time): the ticks keep its bytes off the walks' figure. The settled walk comes after every removal: a file it
    # finds complete is the copy fetched again, and counts (the figure read 2 MiB of 3 for a phase that was done).
    with _watched_fetch(tmp_path) as (clock, loop, _probe, watch, fetch, lines):
        _run_until(clock, loop, PROGRESS_TICK_S, lambda: watch.progress is not None)
        fetch.said = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=MIB)
        _run_until(clock, loop, PROGRESS_TICK_S, lambda: any("no longer count" in line for line in lines))
        before = watch.figures()
        assert before is not None and before["done_bytes"] < 3 * MIB, before
        fetch.running = False
        watch.finish(True)
        _run_until(clock, loop, SETTLED_LOOK_S, lambda: watch.figures() != before)
        assert watch.figures() == {"done_bytes": 3 * MIB, "total_bytes": 3 * MIB, "rate_bytes_s": 0.0,
                                   "eta_s": 0.0, "files_done": 3}, watch.figures()

def test_a_download_that_ended_otherwise_keeps_its_figure_but_no_eta(tmp_path: Path) -> None:
    # The attempt's last tick had a rate and an ETA; it failed (or was stopped): the failed phase, or the one in
    # its backoff, said in status and /metrics how long a download that no longer runs would take.
    with _watched_fetch(tmp_path) as (clock, loop, probe, watch, fetch, lines):
        _run_until(clock, loop, PROGRESS_TICK_S, lambda: watch.progress is not None)
        for n in range(40):  # a quarter MiB more complete at each tick, until the figures have an ETA
            last_tick = watch.figures()
            assert last_tick is not None
            if last_tick["eta_s"] is not None:
                break
            grown = tmp_path / "cache" / f"more-{n}.params"
            grown.write_bytes(b"\1" * (MIB // 4))
            os.utime(grown, (time.time() - 60, time.time() - 60))  # (complete at once: no quiet time to wait)
            _run_until(clock, loop, PROGRESS_TICK_S, lambda before=last_tick: watch.figures() != before)
        assert last_tick["eta_s"] and last_tick["eta_s"] > 0 and last_tick["rate_bytes_s"], last_tick
        fetch.running = False  # a shutdown's stop: the attempt is no longer current, its outcome not decided yet
        assert watch.figures() == {**last_tick, "eta_s": None}
        watch.finish(False)  # it failed
        ended = watch.figures()
        assert ended is not None and ended["eta_s"] is None, ended
        assert (ended["done_bytes"], ended["files_done"]) == (last_tick["done_bytes"], last_tick["files_done"])
        assert ended["rate_bytes_s"] is not None and ended["rate_bytes_s"] > 0, ended  # the attempt's average
        for _ in range(20):
            clock.now += SETTLED_LOOK_S
            loop.run_once(max_wait=0)
        assert watch.figures() == ended, "no settled walk for an attempt that did not end well"
        with probe._cond:
            assert not probe._watches and not probe._settles, "everything released"
        assert lines == []
