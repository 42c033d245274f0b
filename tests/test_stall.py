"""Stall detection: the pure ``StallSigns``, then real children that go silent, chatter, or grow a file.

A phase is stalled when every sign of progress (output, GPU activity where GPUs
are visible, growth of ``progress_path``) has been silent for ``stall_s``. Time
checks here are bounds guaranteed by design (a stall is never named before
``stall_s``) or generous upper bounds (the machine is noisy); the measured
times are printed (``pytest -s``).
"""

from __future__ import annotations

import os
import re
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeClock
from helpers import (
    PY,
    Runner,
    first_line,
    one_verdict,
    seconds_between,
    toml_list,
    toml_str,
    verdict_lines,
    wait_for,
)
from hungmount import hung_mount
from standin_nvml import NvmlControl
from standin_nvml import gpu as nvml_gpu

from supervisor.engine.loop import EventLoop
from supervisor.engine.tick import FreezeWatch
from supervisor.evidence.gpu import GpuReading, GpuSample
from supervisor.evidence.gpuwatch import Gpus
from supervisor.evidence.iowatch import TreeIo
from supervisor.evidence.progress import ProgressProbe, TreeMeasure, measure_tree, tree_size
from supervisor.evidence.stall import (
    IO_SIGN_MIN_BYTES,
    STALL_CHECK_MAX_S,
    STALL_CHECK_MIN_S,
    StallMonitor,
    StallSigns,
    check_interval,
)
from supervisor.evidence.transfer import ProgressReading
from supervisor.evidence.watchstate import WatchState
from supervisor.exits import EXIT_TIMEOUT
from supervisor.lifecycle.attempt import Attempt
from supervisor.lifecycle.hooks import OutputHook, OutputLife

# ================================================================ StallSigns, pure


def watch(stall_s: float = 1.0, *, gpus: bool = False, path: bool = False) -> StallSigns:
    return StallSigns(stall_s, started=100.0, gpus_visible=gpus, watches_path=path)


def test_nothing_seen_stalls_after_stall_s() -> None:
    w = watch()
    assert w.stalled(100.0) is None
    assert w.stalled(100.99) is None
    silent = w.stalled(101.0)
    assert silent == "no output for 1.0s (no GPU visible)"


def test_each_look_keeps_which_signs_it_could_not_measure_for_the_status_view() -> None:
    w = watch(10.0, gpus=True)
    w.note_unmeasured("GPU sampling blind: timed out", None)
    assert w.unmeasured == {"GPU activity": "GPU sampling blind: timed out"}
    w.note_unmeasured(None, "the I/O thread's latest reading is 6.0s old")
    assert w.unmeasured == {"I/O": "the I/O thread's latest reading is 6.0s old"}  # the latest look's, only
    unwalked = "no walk of /params for 6.0s: its walks fail: OSError: [Errno 5] EIO"
    w.note_unmeasured(None, None, unwalked)
    assert w.unmeasured == {"progress_path writes": unwalked}
    w.note_unmeasured(None, None)
    assert w.unmeasured == {}


def test_fresh_output_keeps_it_alive() -> None:
    w = watch()
    w.saw_output(100.8)
    assert w.stalled(101.5) is None
    w.saw_output(101.6)
    assert w.stalled(102.5) is None
    w.saw_output(100.1)  # an older observation never moves it back
    assert w.stalled(102.5) is None
    assert w.stalled(102.6) == "no output for 1.0s (no GPU visible)"


def test_output_that_said_nothing_moved_is_no_sign_but_is_said_beside_the_outputs_silence() -> None:
    w = watch()
    w.saw_output(100.5)
    w.saw_idle_output(100.4)  # (before the last sign: nothing to say)
    assert w.idle_output_age(100.9) is None
    w.saw_idle_output(101.0)
    w.saw_idle_output(None)  # (a look with no such output keeps what was seen)
    assert w.stalled(101.4) is None
    assert w.idle_output_age(101.4) == pytest.approx(0.4)
    assert w.stalled(101.5) == "no output for 1.0s (output since then said nothing moved, the latest 0.5s ago) " \
                               "(no GPU visible)"
    w.saw_output(101.2)  # a sign after it: the output's age says it all again
    assert w.idle_output_age(101.5) is None


class _IdleDots:
    """A parser that marks lines of dots as saying nothing moved (MarksIdleLines)."""

    def __init__(self) -> None:
        self.result = SimpleNamespace(lines=0)
        self.idle_lines = 0

    def feed(self, lines: list[bytes]) -> None:
        self.result.lines += len(lines)
        self.idle_lines += sum(1 for line in lines if line.strip(b".") == b"")


class _Plain:
    """A parser that marks nothing."""

    def __init__(self) -> None:
        self.result = SimpleNamespace()

    def feed(self, lines: list[bytes]) -> None:
        pass


def test_a_read_of_idle_lines_alone_is_no_output_of_the_command_and_its_daemons_bytes_still_are() -> None:
    reader = OutputHook("a fetch", "the test's parser", _IdleDots, "exit_code").new_parser()
    assert isinstance(reader, OutputLife) and reader.result.lines == 0
    command, daemon = SimpleNamespace(), SimpleNamespace()  # (their specs)
    children = [SimpleNamespace(spec=daemon, output=SimpleNamespace(last_output_at=40.0)),
                SimpleNamespace(spec=command, output=SimpleNamespace(last_output_at=time.monotonic()))]
    attempt = Attempt(1, 0.0, children=children, parser=reader)  # type: ignore[arg-type]
    assert attempt.last_outputs(command) == [40.0] and attempt.idle_output() is None  # nothing read yet
    reader.feed([b"...", b"", b"."])
    assert attempt.last_outputs(command) == [40.0], "a read of idle lines alone was output"
    assert attempt.idle_output() == reader.idle_at and reader.idle_at is not None
    reader.feed([b"...", b"1 MiB got", b"..."])
    assert reader.life_at is not None and reader.life_at >= reader.idle_at
    assert attempt.last_outputs(command) == [40.0, reader.life_at] and reader.result.lines == 6
    # A parser that marks nothing is read as it is: every byte of the command's is output, as ever.
    plain = OutputHook("a fetch", "the test's parser", _Plain, "exit_code").new_parser()
    assert isinstance(plain, _Plain)
    attempt.parser = plain
    assert attempt.last_outputs(command) == [40.0, children[1].output.last_output_at]
    assert attempt.idle_output() is None


def test_gpu_activity_counts_only_when_gpus_are_visible() -> None:
    blind = watch(gpus=False)
    blind.saw_gpu(True, 100.9)
    assert blind.stalled(101.2) is not None, "GPU activity counted although no GPU is visible"

    w = watch(gpus=True)
    w.saw_gpu(True, 100.9)
    assert w.stalled(101.2) is None
    w.saw_gpu(False, 101.5)  # an idle sample is no sign of life
    silent = w.stalled(101.9)
    assert silent is not None
    assert "no output for 1.9s" in silent and "no GPU activity for 1.0s" in silent
    assert "no GPU visible" not in silent


def test_progress_growth_counts_shrink_then_growth_counts() -> None:
    w = watch(path=True)
    w.saw_progress(None, None, 100.0)  # the baseline: absent is 0
    w.saw_progress(0, None, 100.3)
    assert w.stalled(101.0) is not None, "no growth yet, no output: stalled"
    w.saw_progress(4096, 5000.0, 101.0)
    assert w.stalled(101.9) is None, "growth is progress"
    w.saw_progress(4096, 5000.0, 102.0)  # the same size, no newer write: no progress
    silent = w.stalled(102.0)
    assert silent == "no output for 2.0s, no progress_path writes for 1.0s (no GPU visible)"
    w.saw_progress(100, 5000.0, 102.1)  # a bad file deleted: shrinking is not progress...
    assert w.stalled(102.1) is not None
    w.saw_progress(200, 5000.0, 102.2)  # ...but growth after it is
    assert w.stalled(103.1) is None
    assert w.stalled(103.2) is not None


def test_bytes_moved_are_a_sign_of_life_once_the_counters_can_be_read() -> None:
    w = StallSigns(1.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(5000, True, 100.2)  # the baseline: what the trees had moved before
    assert w.stalled(101.0) is not None, "the baseline counted as I/O"
    w = StallSigns(1.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(0, True, 100.1)
    w.saw_io(IO_SIGN_MIN_BYTES, True, 100.8)
    assert w.stalled(101.5) is None
    w.saw_io(IO_SIGN_MIN_BYTES, True, 101.2)  # alive, nothing moved: no sign
    assert w.stalled(101.8) == "no output for 1.8s, no I/O for 1.0s (no GPU visible)"
    assert w.ages(101.8) == pytest.approx({"output": 1.8, "I/O": 1.0})


def test_a_runtimes_trickle_of_bytes_is_no_sign_of_life() -> None:
    # Go rereads its cgroup CPU limit once a second (tens of bytes of rchar): a curio blocked for good in recv
    # moves that much and no more, and must still be stalled.
    w = StallSigns(10.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(0, True, 100.0)
    for second in range(1, 31):
        w.saw_io(40 * second, True, 100.0 + second)
    assert w.stalled(130.0) == "no output for 30.0s, no I/O for 30.0s (no GPU visible)"
    # Small reads that add up to real work within the window count, from the last reading counted.
    w.saw_io(IO_SIGN_MIN_BYTES - 1, True, 131.0)
    assert w.stalled(131.0) is not None
    w.saw_io(IO_SIGN_MIN_BYTES, True, 132.0)
    assert w.stalled(132.0) is None
    w.saw_io(2 * IO_SIGN_MIN_BYTES - 1, True, 140.0)
    assert w.stalled(142.0) == "no output for 42.0s, no I/O for 10.0s (no GPU visible)"


def test_unreadable_counters_are_no_evidence_and_say_so() -> None:
    w = StallSigns(1.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(0, False, 100.5)
    w.saw_io(10**9, False, 100.9)  # (an unreadable reading's numbers mean nothing)
    assert w.stalled(101.0) == "no output for 1.0s (I/O counters unreadable) (no GPU visible)"
    assert "I/O" not in w.ages(101.0)


def test_a_thaw_restarts_the_io_silence_too() -> None:
    w = StallSigns(1.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(0, True, 100.0)
    w.thawed(105.0)
    assert w.stalled(105.9) is None
    assert w.stalled(106.0) == "no output for 1.0s, no I/O for 1.0s (no GPU visible)"


def test_message_names_each_silent_sign() -> None:
    w = watch(2.0, gpus=True, path=True)
    w.saw_progress(10, None, 100.0)
    silent = w.stalled(103.0)
    assert silent == "no output for 3.0s, no GPU activity for 3.0s, no progress_path writes for 3.0s"


def test_check_interval_bounds() -> None:
    assert check_interval(1) == pytest.approx(0.1)
    assert check_interval(3600) == STALL_CHECK_MAX_S
    assert check_interval(0.01) == STALL_CHECK_MIN_S


def test_tree_size(tmp_path: Path) -> None:
    assert tree_size(tmp_path / "missing") is None
    (tmp_path / "a").write_bytes(b"x" * 10)
    assert tree_size(tmp_path / "a") == 10
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "f").write_bytes(b"y" * 5)
    (tmp_path / "d" / "e" / "g").write_bytes(b"z" * 7)
    assert tree_size(tmp_path / "d") == 12
    assert tree_size(tmp_path) == 22
    assert measure_tree(tmp_path / "d") == (12, 2)
    assert measure_tree(tmp_path / "missing") == (None, 0)


def test_a_thaw_and_unknown_gpu_evidence_are_in_the_verdict() -> None:
    w = watch(gpus=True)
    silent = w.stalled(101.5, "NVML unresponsive since 12:00:01 (nvmlInit has not returned for 7.0s)")
    assert silent == ("no output for 1.5s, no GPU activity for 1.5s (GPU evidence unavailable: NVML unresponsive "
                      "since 12:00:01 (nvmlInit has not returned for 7.0s))"), silent
    w.saw_gpu(True, 99.0)  # a reading taken before the watch began never moves its start back
    assert w.last_gpu == 100.0


def test_a_blind_io_thread_is_in_the_verdict_not_taken_for_silence() -> None:
    w = StallSigns(1.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(0, True, 100.0)
    silent = w.stalled(101.0, io_unknown="OSError: [Errno 24] Too many open files")
    assert silent == ("no output for 1.0s, no I/O for 1.0s (I/O evidence unavailable: OSError: [Errno 24] Too "
                      "many open files) (no GPU visible)"), silent


def test_a_progress_path_not_walked_lately_is_in_the_verdict_not_taken_for_silence() -> None:
    w = watch(path=True)
    w.saw_progress(0, None, 100.0)
    silent = w.stalled(101.0, progress_unknown="no walk of /params for 1.0s: its walks fail: OSError: [Errno 5] EIO")
    assert silent == ("no output for 1.0s, no progress_path writes for 1.0s (no GPU visible) (progress_path evidence "
                      "unavailable: no walk of /params for 1.0s: its walks fail: OSError: [Errno 5] EIO)"), silent


def test_processes_whose_counters_are_refused_are_in_the_verdict() -> None:
    # A worker run as another user (gosu) while the supervisor lacks CAP_SYS_PTRACE: its bytes are in no total,
    # and "no I/O for 35s" was said of a download that had written 35 MiB.
    w = StallSigns(1.0, started=100.0, gpus_visible=False, watches_path=False, watches_io=True)
    w.saw_io(0, True, 100.0, unreadable=1)
    assert w.stalled(101.0) == ("no output for 1.0s, no I/O for 1.0s (the I/O counters of 1 of its processes "
                                "unreadable: another user's, and no CAP_SYS_PTRACE) (no GPU visible)")
    w.saw_io(0, True, 101.0, unreadable=0)  # (it ended: the latest reading is whole again)
    assert w.stalled(102.0) == "no output for 2.0s, no I/O for 2.0s (no GPU visible)"


def test_a_walker_whose_walks_raise_is_said_blind_and_walks_on(tmp_path: Path, monkeypatch) -> None:
    import supervisor.evidence.progress as progress

    def broken(path: str, *args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the walk")

    monkeypatch.setattr(progress, "tree_done", broken)
    probe = ProgressProbe()
    assert probe.state.current == "idle"
    probe.state.window_s = 0.3
    release = probe.watch(str(tmp_path), every_s=0.05)
    try:
        wait_for(lambda: probe.state.misses >= 2, timeout=10)
        time.sleep(0.4)
        [line] = probe.state.check()
        assert line.startswith("progress walker: no reading for ") and line.endswith("RuntimeError: a bug in the walk")
        monkeypatch.undo()
        wait_for(lambda: probe.state.current == "reading", timeout=10)
        assert any("reading again" in said for said in probe.state.check())
    finally:
        release()
        probe.close()


def test_a_path_released_by_its_last_watch_has_no_measure_for_the_next_one(tmp_path: Path) -> None:
    # The next attempt's watch of the same path saw the last attempt's walk as the latest (taken when? before
    # the retry's backoff): it starts from no measure, and its first is a walk of its own.
    (tmp_path / "f").write_bytes(b"x" * 5)
    probe = ProgressProbe()
    try:
        release = probe.watch(str(tmp_path), every_s=0.05)
        first = wait_for(lambda: probe.latest(str(tmp_path)))
        other = probe.watch(str(tmp_path), every_s=0.05)  # a second watch of the path: it keeps its measure
        release()
        assert probe.latest(str(tmp_path)) is not None
        other()
        assert probe.latest(str(tmp_path)) is None, "the last watch released, its measure stayed the latest"
        again = probe.watch(str(tmp_path), every_s=0.05)
        try:
            mine = wait_for(lambda: probe.latest(str(tmp_path)))
            assert mine.seq > first.seq and mine.at >= first.at
        finally:
            again()
    finally:
        probe.close()


def test_a_walk_cut_short_publishes_nothing_and_the_last_measure_stands(tmp_path: Path, monkeypatch) -> None:
    # A failed walk was published as size None (then 0): a shrink, and the next whole walk read as growth, a
    # false sign of life that hid a real stall.
    import errno

    import supervisor.evidence.progress as progress

    (tmp_path / "f").write_bytes(b"x" * 5)
    probe = ProgressProbe()
    release = probe.watch(str(tmp_path), every_s=0.05)
    try:
        first = wait_for(lambda: probe.latest(str(tmp_path)))
        real_scandir = os.scandir

        def emfile(path: str) -> object:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(progress.os, "scandir", emfile)
        misses = probe.state.misses
        wait_for(lambda: probe.state.misses >= misses + 2, timeout=10)
        assert probe.latest(str(tmp_path)) == first, "a walk cut short published a measure"
        monkeypatch.setattr(progress.os, "scandir", real_scandir)
        wait_for(lambda: probe.latest(str(tmp_path)).seq != first.seq, timeout=10)
        assert probe.latest(str(tmp_path)).size == 5
    finally:
        release()
        probe.close()


def test_a_walk_that_fails_is_said_at_once_and_why_is_kept_until_a_walk_ends_whole(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    # A walk that raised was said by nothing until the walker was blind (WALK_BLIND_S, 300 s), and a stall watch
    # under a short stall_s took the path for silent meanwhile.
    import errno

    import supervisor.evidence.progress as progress

    (tmp_path / "f").write_bytes(b"x" * 5)
    probe = ProgressProbe()
    release = probe.watch(str(tmp_path), every_s=0.05)
    try:
        first = wait_for(lambda: probe.latest(str(tmp_path)))
        assert probe.unwalked(str(tmp_path)) == "" and probe.check() == []
        real_scandir = os.scandir

        def eio(path: str) -> object:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(progress.os, "scandir", eio)
        said = wait_for(lambda: probe.check(), timeout=10)
        assert said == [f"progress: walking {tmp_path} failed (OSError: [Errno 5] Input/output error): no write there "
                        "is seen until a walk ends whole"], said
        assert probe.unwalked(str(tmp_path)) == "its walks fail: OSError: [Errno 5] Input/output error"
        assert probe.state.current != "blind"  # (not for WALK_BLIND_S)
        misses = probe.state.misses
        wait_for(lambda: probe.state.misses >= misses + 2, timeout=10)
        assert probe.check() == [], "said once"
        monkeypatch.setattr(progress.os, "scandir", real_scandir)
        wait_for(lambda: probe.latest(str(tmp_path)).seq != first.seq, timeout=10)
        assert probe.unwalked(str(tmp_path)) == ""
    finally:
        release()
        probe.close()


def test_a_walk_passes_over_a_file_gone_since_it_was_listed_and_a_directory_not_ours(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    import errno

    import supervisor.evidence.progress as progress

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 5)
    (tmp_path / "g").write_bytes(b"y" * 7)
    real_scandir = progress.os.scandir

    def refusing(path: str) -> object:
        if path.endswith("/d"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(progress.os, "scandir", refusing)
    assert progress.tree_done(tmp_path, now=0.0)[:2] == (7, 1)  # whole all the same: the same every walk
    monkeypatch.setattr(progress.os, "scandir", lambda path: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError):
        progress.tree_done(tmp_path, now=0.0)


class _WantedGpus:
    """The GPU thread as a stall check sees it: it counts who wants samples now."""

    available = False

    def __init__(self) -> None:
        self.wanting = 0
        self.sampling = WatchState("GPU sampling", 30.0)  # (reading: its blindness is not what these test)

    def want(self, every_s: float) -> Callable[[], None]:
        self.wanting += 1

        def release() -> None:
            self.wanting -= 1

        return release

    def latest(self) -> None:
        return None

    def unresponsive(self, now: float) -> None:
        return None


class _QuietAttempt:
    """An attempt that prints nothing and has no process tree: its stall is decided by the other signs alone."""

    def __init__(self) -> None:
        self.stalls: list[str] = []

    def roots(self) -> list[tuple[int, str]]:
        return []

    def cgroup(self) -> None:  # (no cgroup of its own)
        return None

    def kept(self) -> list[Any]:  # (no phase before it kept a daemon)
        return []

    def last_outputs(self) -> list[float]:
        return []

    def idle_output(self) -> float | None:
        return None

    def drain(self) -> None:
        pass

    def current(self) -> bool:
        return not self.stalls

    def stalled(self, silent: str) -> None:
        self.stalls.append(silent)

    def fault(self, what: str, exc: Exception) -> None:
        raise AssertionError(f"{what}: {exc}")


class _BrokenAttempt(_QuietAttempt):
    """An attempt whose stall check raises (a bug of the check's own) at its first look."""

    def __init__(self) -> None:
        super().__init__()
        self.faults: list[tuple[str, Exception]] = []

    def last_outputs(self) -> list[float]:
        raise RuntimeError("a bug in the stall check")

    def current(self) -> bool:
        return True

    def stalled(self, silent: str) -> None:
        raise AssertionError("a check that raised found no stall")

    def fault(self, what: str, exc: Exception) -> None:
        self.faults.append((what, exc))


def test_a_stall_check_that_raises_releases_what_it_asked_for_before_the_phase_hears() -> None:
    # Its attempt fails for the bug, and no later check comes to release the GPU samples it wanted: the GPU
    # thread would sample at stall_s / 4 for the rest of the run.
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    try:
        gpus, attempt = _WantedGpus(), _BrokenAttempt()
        evidence = SimpleNamespace(gpus=gpus, progress=None, freeze=None, io=None)
        StallMonitor(loop, 10.0, None, evidence, attempt)
        assert gpus.wanting == 1
        clock.now += 10.0
        loop.run_once(max_wait=0)
        assert [(what, str(exc)) for what, exc in attempt.faults] == [("the stall check", "a bug in the stall check")]
        assert gpus.wanting == 0
    finally:
        loop.close()


class _BusyGpus(_WantedGpus):
    """A GPU at 90 % whose sampling thread fails at a moment the test chooses, and comes back."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.available, self.why, self._clock, self._seq = True, "", clock, 0

    def latest(self) -> GpuReading | None:  # type: ignore[override]
        if not self.available:
            return None
        self._seq += 1
        return GpuReading(self._seq, self._clock.now, (GpuSample(0, "H200", 90, 1 << 30, 141 << 30),))

    def fail(self) -> None:
        self.available, self.why = False, "no GPU evidence for now: the GPU thread failed (RuntimeError: boom)"


def run_checks(loop: EventLoop, clock: FakeClock, seconds: float, step: float = 0.1) -> None:
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step
        loop.run_once(max_wait=0)


def assert_one_stall(attempt: _QuietAttempt, pattern: str) -> None:
    """The attempt was told of one stall, whose words match ``pattern`` (ages to a tenth: the checks' steps)."""
    [silent] = attempt.stalls
    assert re.fullmatch(pattern, silent), silent


def test_a_gpu_thread_that_fails_does_not_stall_a_gpu_busy_child_at_once() -> None:
    # While the thread restarts, Gpus.available is False: the GPU sign and its fresh activity were dropped, and
    # the child was stalled at the next look, "(no GPU visible)", 0.9 s after the GPU last worked.
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    try:
        gpus, attempt = _BusyGpus(clock), _QuietAttempt()
        StallMonitor(loop, 3.0, None, SimpleNamespace(gpus=gpus, progress=None, freeze=None, io=None), attempt)
        run_checks(loop, clock, 5.0)
        assert attempt.stalls == []  # the GPU works
        gpus.fail()
        run_checks(loop, clock, 2.5)
        assert attempt.stalls == [], "stalled while the GPU had worked within stall_s"
        run_checks(loop, clock, 1.0)  # its silence now passes stall_s: a stall, said with why it is unknown
        assert_one_stall(attempt, r"no output for 8\.\ds, no GPU activity for 3\.\ds \(GPU evidence unavailable: "
                                  r"no GPU evidence for now: the GPU thread failed \(RuntimeError: boom\)\)")
    finally:
        loop.close()


class _GpusScripted(_WantedGpus):
    """The GPU thread as a stall watch sees it: the reading the test publishes (``show``), sampling reading."""

    def __init__(self) -> None:
        super().__init__()
        self.available, self.why, self.reading = True, "", None
        self._seq = 0

    def latest(self) -> GpuReading | None:  # type: ignore[override]
        return self.reading

    def show(self, at: float, *samples: GpuSample) -> None:
        self._seq += 1
        self.reading = GpuReading(self._seq, at, samples)


def test_a_gpu_left_out_of_a_reading_keeps_its_last_sample_as_the_baseline() -> None:
    # A reading without GPU 0 (its answer was no reading) became the baseline: when GPU 0 was read again, a
    # change of its memory use had nothing to be compared with, and its work did not count.
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    try:
        gpus, attempt = _GpusScripted(), _QuietAttempt()
        gpus.show(clock.now, GpuSample(0, "H200", 0, 1 << 30, 141 << 30), GpuSample(1, "H200", 0, 1 << 30, 141 << 30))
        StallMonitor(loop, 3.0, None, SimpleNamespace(gpus=gpus, progress=None, freeze=None, io=None), attempt)
        run_checks(loop, clock, 1.0)
        gpus.show(clock.now, GpuSample(1, "H200", 0, 1 << 30, 141 << 30))  # GPU 0 not read
        run_checks(loop, clock, 1.0)
        gpus.show(clock.now, GpuSample(0, "H200", 0, 2 << 30, 141 << 30), GpuSample(1, "H200", 0, 1 << 30, 141 << 30))
        run_checks(loop, clock, 2.0)
        assert attempt.stalls == [], "GPU 0's memory use changed since its last sample: that is work"
    finally:
        loop.close()


def run_loop_until(loop: EventLoop, done: Callable[[], bool], timeout: float = 30.0) -> None:
    """The real loop run until ``done()`` (looked at every 0.05 s), at most ``timeout`` (generous: a shared machine)."""
    deadline = time.monotonic() + timeout
    loop.run_until(lambda: done() or time.monotonic() > deadline, 0.05)
    assert done(), f"not done within {timeout}s"


@pytest.mark.parametrize("blind_s", [1.5, 3600.0], ids=["sampling-blind", "not-blind-yet"])
def test_a_stall_while_nvml_answers_garbage_says_gpu_evidence_unavailable(control: NvmlControl,
                                                                         blind_s: float) -> None:
    # NVML answering garbage (memory info None) for a GPU at 100 %: each sample was published without it, that
    # was read as a GPU at rest, and the verdict said "no GPU activity for 35.1s" with no word of the blindness.
    # Blind (past the sampling's window) or not yet (a stall_s shorter than GPU_BLIND_S), it is no measure.
    control.set(gpus=[nvml_gpu(util=100)])
    gpus = Gpus(blind_s=blind_s)
    loop, attempt = EventLoop(), _QuietAttempt()
    try:
        gpus.start()
        assert gpus.opened.wait(30) and gpus.available, gpus.why
        monitor = StallMonitor(loop, 4.0, None, SimpleNamespace(gpus=gpus, progress=None, freeze=None, io=None),
                               attempt)
        # The GPU seen at work, a second into the watch (not only a sample taken as it began):
        run_loop_until(loop, lambda: monitor.signs.last_gpu > monitor.signs.started + 1.0)
        control.set(garbage=["nvmlDeviceGetMemoryInfo"])

        def ticked_until_stalled() -> bool:
            gpus.sampling.check()  # (the tick's: past its window, the sampling is marked blind and said)
            return bool(attempt.stalls)

        run_loop_until(loop, ticked_until_stalled)
    finally:
        gpus.close()
        loop.close()
    [silent] = attempt.stalls
    bad = r"GPU 0: BadAnswer: memory\.total is None, not a whole number from 0 to \d+"
    unavailable = f"GPU sampling blind: {bad}" if blind_s < 4.0 else rf"no reading of GPU 0 for \d+\.\ds: {bad}"
    assert re.fullmatch(rf"no output for \d+\.\ds, no GPU activity for \d+\.\ds \(GPU evidence unavailable: "
                        rf"{unavailable}\)", silent), silent
    # What the status view shows beside the sign's age, the look's own words:
    assert set(monitor.signs.unmeasured) == {"GPU activity"}, monitor.signs.unmeasured
    assert re.fullmatch(unavailable, monitor.signs.unmeasured["GPU activity"]), monitor.signs.unmeasured


class _StaleIo:
    """The I/O thread as a stall watch sees it: one reading, then none (a thread held up, not blind yet)."""

    def __init__(self, clock: FakeClock) -> None:
        self.state = WatchState("I/O watch", 30.0, clock=lambda: clock.now)
        self.reading = TreeIo(1, clock.now, 0, 0, 1, True)

    def watch(self, every_s: float) -> SimpleNamespace:
        return SimpleNamespace(follow=lambda roots, cgroup=None: None, latest=lambda: self.reading,
                               release=lambda: None)


def test_an_io_reading_older_than_half_of_stall_s_is_no_measure_of_silence() -> None:
    # Under stall_s 5, an I/O thread held up (a read of a hung mount's /proc entry) is blind only after 30 s: its
    # one old reading was taken for 5 s of measured silence.
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    try:
        attempt = _QuietAttempt()
        StallMonitor(loop, 5.0, None, SimpleNamespace(gpus=None, progress=None, freeze=None, io=_StaleIo(clock)),
                     attempt)
        run_checks(loop, clock, 5.3)
        assert_one_stall(attempt, r"no output for 5\.\ds, no I/O for 5\.\ds \(I/O evidence unavailable: the I/O "
                                  r"thread's latest reading is 5\.\ds old\) \(no GPU visible\)")
    finally:
        loop.close()


class _FailingWalks:
    """The progress walker as a stall watch sees it: one walk of the path, then walks that fail (a flaky mount)."""

    def __init__(self, clock: FakeClock, path: str) -> None:
        self.state = WatchState("progress walker", 300.0, clock=lambda: clock.now)
        self.measure = TreeMeasure(path, 1 << 20, 1, clock.now, 0.01, 1, newest=5000.0)

    def watch(self, path: str, every_s: float) -> Callable[[], None]:
        return lambda: None

    def latest(self, path: str) -> TreeMeasure:
        return self.measure

    def unwalked(self, path: str, now: float) -> str:
        return "its walks fail: OSError: [Errno 116] Stale file handle"


def test_a_progress_path_whose_walks_fail_is_no_measure_of_silence() -> None:
    # Under stall_s 5, the walker whose walks of an NFS cache raise ESTALE is blind only after 300 s: a child
    # writing into its preallocated file there was stalled for "no progress_path writes for 5.0s", as if measured.
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    try:
        attempt = _QuietAttempt()
        evidence = SimpleNamespace(gpus=None, progress=_FailingWalks(clock, "/params"), freeze=None, io=None)
        monitor = StallMonitor(loop, 5.0, "/params", evidence, attempt)
        run_checks(loop, clock, 2.4)
        assert monitor.signs.unmeasured == {}, "a walk 2.4s old is fresh under stall_s 5"
        run_checks(loop, clock, 0.6)
        assert set(monitor.signs.unmeasured) == {"progress_path writes"}, monitor.signs.unmeasured
        assert re.fullmatch(r"no walk of /params for 2\.\ds: its walks fail: OSError: \[Errno 116\] Stale file handle",
                            monitor.signs.unmeasured["progress_path writes"]), monitor.signs.unmeasured
        run_checks(loop, clock, 2.3)
        assert_one_stall(attempt, r"no output for 5\.\ds, no progress_path writes for 5\.\ds \(no GPU visible\) "
                                  r"\(progress_path evidence unavailable: no walk of /params for 5\.\ds: its walks "
                                  r"fail: OSError: \[Errno 116\] Stale file handle\)")
    finally:
        loop.close()


class _CountedWalks:
    """The progress walker as a progress watch sees it: it counts the paths (and the received bytes) watched."""

    def __init__(self) -> None:
        self.watched = 0

    def _watch(self) -> Callable[[], None]:
        self.watched += 1

        def release() -> None:
            self.watched -= 1

        return release

    def watch(self, path: str, every_s: float, held: Callable[[], frozenset[tuple[int, int]]] | None = None
              ) -> Callable[[], None]:
        return self._watch()

    def watch_net(self, every_s: float) -> Callable[[], None]:
        return self._watch()


def test_a_progress_watch_that_raises_releases_its_walks_before_the_phase_hears(tmp_path: Path) -> None:
    from supervisor.config import parse_plan
    from supervisor.evidence.progresswatch import PROGRESS_TICK_S, ProgressWatch

    spec = parse_plan(f'[[phases]]\nname = "fetch"\ncommand = ["fake"]\nprogress_total = "1GiB"\n'
                      f'progress_path = "{tmp_path}"\nstall_s = 600\n', "test.toml", {}).phases[0]
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    try:
        walks, attempt = _CountedWalks(), _BrokenAttempt()
        attempt.current = lambda: (_ for _ in ()).throw(RuntimeError("a bug in the progress watch"))  # type: ignore[method-assign]
        ProgressWatch(spec, loop, lambda line: None,
                      SimpleNamespace(progress=walks, io=None, first_seen=None, freeze=None), attempt)
        assert walks.watched == 2  # progress_path, and the bytes received
        clock.now += PROGRESS_TICK_S
        loop.run_once(max_wait=0)
        assert [(what, str(exc)) for what, exc in attempt.faults] == [("the progress watch",
                                                                      "a bug in the progress watch")]
        assert walks.watched == 0
    finally:
        loop.close()

class _Download:
    """A download as a progress watch sees it: the cache's walks and the trees' bytes written, set by the test."""

    def __init__(self) -> None:
        self.cache: TreeMeasure | None = None
        self.written = 0
        self.seq = 0
        self.slow: list[str] = []
        self.said: ProgressReading | None = None  # what the command's parser read
        self.io_readable = True  # False: no process's I/O counters could be read (no written bytes known)
        self.io_seq: int | None = None  # the I/O thread's reading number, if not the walks' (a frozen one: blind)
        self.allocated = 0  # of ``written``: what an allocating downloader wrote before its control file (zeros)
        self.allocating = 0  # how many are allocating now
        self.held: frozenset[tuple[int, int]] = frozenset()  # the files it holds open
        self.allocators: frozenset[str] | None = None  # the downloaders the progress watch asked the I/O thread of
        self.held_seen: Callable[[], frozenset[tuple[int, int]]] | None = None  # what the walks were told is held
        self.read_at: float | None = None  # when its readings were taken (monotonic), where a test says

    def walk(self, size: int | None, done: int) -> None:
        self.seq += 2  # (the walker numbers the walks of all it watches: the received bytes' comes between)
        at = float(self.seq) if self.read_at is None else self.read_at
        self.cache = TreeMeasure("/cache", size, 1, at, 0.0, self.seq, done, 1 if done else 0, None)

    # the walker's side
    def watch(self, path: str, every_s: float, held: Callable[[], frozenset[tuple[int, int]]] | None = None
              ) -> Callable[[], None]:
        self.held_seen = held
        return lambda: None

    def watch_net(self, every_s: float) -> Callable[[], None]:
        return lambda: None

    def latest(self, path: str) -> TreeMeasure | None:
        return self.cache if path == "/cache" else None

    # the I/O thread's side
    def io_watch(self, every_s: float, *, from_zero: bool = False, allocators: frozenset[str] = frozenset()
                 ) -> SimpleNamespace:
        self.allocators = allocators
        return SimpleNamespace(follow=lambda roots, cgroup=None: None, release=lambda: None,
                               latest=lambda: TreeIo(self.seq if self.io_seq is None else self.io_seq,
                                                     0.0 if self.read_at is None else self.read_at,
                                                     self.written, self.written, 1, self.io_readable,
                                                     allocated=self.allocated, allocating=self.allocating,
                                                     held=self.held))

    # the attempt's side
    def roots(self) -> list[object]:
        return []

    def cgroup(self) -> None:  # (no cgroup of its own)
        return None

    def reading(self) -> ProgressReading | None:
        return self.said

    def current(self) -> bool:
        return True

    def too_slow(self, why: str) -> None:
        self.slow.append(why)

    def fault(self, what: str, exc: Exception) -> None:
        raise exc


MiB = 1 << 20


class _Watching:
    """A progress watch over a _Download on a fake clock: ``tick`` sets what the sources say, runs one tick of
    the watch and returns its figures."""

    def __init__(self, keys: str = "") -> None:
        from supervisor.config import parse_plan
        from supervisor.evidence.progresswatch import PROGRESS_TICK_S, ProgressWatch

        spec = parse_plan('[[phases]]\nname = "fetch"\ncommand = ["fake"]\nprogress_total = "32MiB"\n'
                          f'progress_path = "/cache"\n{keys}', "test.toml", {}).phases[0]
        self.step = PROGRESS_TICK_S
        self.clock, self.lines, self.download = FakeClock(), [], _Download()
        self.loop = EventLoop(clock=self.clock)
        self.freeze = FreezeWatch(self.lines.append, clock=self.clock)  # (the tick's: looked at by the watch itself)
        evidence = SimpleNamespace(progress=self.download, io=SimpleNamespace(watch=self.download.io_watch),
                                   first_seen=None, allocators=frozenset({"aria2c"}), freeze=self.freeze)
        self.download.walk(32 * MiB, 0)  # preallocated, nothing complete
        self.watch = ProgressWatch(spec, self.loop, self.lines.append, evidence, self.download)  # type: ignore[arg-type]

    def tick(self, written: int, size: int | None, done: int, said: ProgressReading | None = None
             ) -> dict[str, object]:
        self.download.written, self.download.said = written, said
        self.download.walk(size, done)
        self.clock.now += self.step
        self.loop.run_once(max_wait=0)
        figures = self.watch.figures()
        assert figures is not None
        return figures

    def close(self) -> None:
        self.loop.close()

    def __enter__(self) -> _Watching:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def test_a_file_removed_and_fetched_again_is_not_counted_twice() -> None:
    # curio deletes a file whose digest does not match and fetches it again: its bytes written the first time
    # counted on, the phase read 100% done while it fetched it again, and too_slow never came before the deadline.
    watching = _Watching()
    tick, lines = watching.tick, watching.lines
    try:
        assert tick(8 * MiB, 32 * MiB, 0)["done_bytes"] == 8 * MiB
        assert tick(32 * MiB, 32 * MiB + 4096, 0)["done_bytes"] == 32 * MiB  # (its control file beside it)
        assert tick(32 * MiB, 32 * MiB, 32 * MiB)["done_bytes"] == 32 * MiB, "a completed file is no removal"
        assert not any("no longer count" in line for line in lines), lines
        again = tick(32 * MiB, 0, 0)  # its digest did not match: removed
        assert again["done_bytes"] == 0, again
        assert lines == ["phase fetch: /cache has less complete (a file removed): its 32.0MiB no longer count"]
        assert tick(40 * MiB, 32 * MiB, 0)["done_bytes"] == 8 * MiB  # fetched again: what is written now counts
        # Complete again, its digest bad again, and preallocated anew before the next walk: no smaller, but less
        # of it complete (a real 45 GiB file's digest takes minutes: the walks see it complete).
        assert tick(64 * MiB, 32 * MiB, 32 * MiB)["done_bytes"] == 32 * MiB
        assert tick(64 * MiB, 32 * MiB, 0)["done_bytes"] == 0
        assert sum("no longer count" in line for line in lines) == 2, lines
        # A partial file removed (the cache smaller, no more of it complete): its bytes go too.
        assert tick(72 * MiB, 32 * MiB, 0)["done_bytes"] == 8 * MiB
        assert tick(72 * MiB, 28 * MiB, 0)["done_bytes"] == 4 * MiB
        assert lines[-1] == "phase fetch: /cache shrank (a file removed): its 4.0MiB no longer count"
    finally:
        watching.close()


def test_a_file_the_command_says_it_fetches_again_counts_again_though_no_walk_saw_it_go() -> None:
    # A file checked in less than COMPLETE_QUIET_S is never seen complete by a walk, and is deleted and
    # preallocated anew between two walks (never smaller either): the walks miss the removal (measured with the
    # real aria2c on a 32 MiB file), and its bytes written counted twice. curio's line says it.
    watching = _Watching()
    lines = watching.lines

    def tick(written: int, said: ProgressReading | None) -> object:
        return watching.tick(written, 32 * MiB, 0, said)["done_bytes"]  # preallocated, never seen complete

    try:
        assert tick(8 * MiB, None) == 8 * MiB
        assert tick(32 * MiB, ProgressReading(0, 32 * MiB, 1)) == 32 * MiB  # aria2c's burst: complete
        bad = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=32 * MiB)  # (aria2c said its size)
        assert tick(33 * MiB, bad) == MiB  # deleted, fetched again: its first 32 MiB no longer count
        assert lines == ["phase fetch: the command deletes a file to fetch it again: its 32.0MiB no longer count"]
        assert tick(41 * MiB, bad) == 9 * MiB  # only what is written of the new copy
        assert len(lines) == 1, "one restart, one word"
    finally:
        watching.close()


def test_a_file_fetched_again_keeps_the_link_s_rate_and_is_not_ended_while_it_can_make_it() -> None:
    # After a removal the figure drops and grows again from there: the rate read from it (the window's, and
    # the average since the start, which decides in the window's first seconds) was of a link gone slow, and
    # the deadline rule ended a download that could still make it (measured: "31.0MiB left at 28.4KiB/s" at
    # 1 MiB/s). The rate is of what the link brings, the thrown-away copy's bytes included.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 5\n") as watching:
        for second in range(1, 41):  # 1 MiB/s; the first copy is complete at 32 s, bad, and fetched again
            said = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=32 * MiB) if second >= 33 else None
            figures = watching.tick(second * MiB, 32 * MiB, 0, said)
        assert figures["done_bytes"] == 8 * MiB, figures  # the new copy's 8 MiB: from the 33rd on
        assert figures["rate_bytes_s"] == MiB, figures
        assert watching.download.slow == [], watching.download.slow  # 25 MiB left at 1 MiB/s: 25 s, 60 s left
        assert any("fetch it again" in line for line in watching.lines), watching.lines


def test_a_small_file_fetched_again_costs_its_own_bytes_not_those_of_the_files_in_flight() -> None:
    # curio fetches every file at once (lib/fastparamfetch: a goroutine each). A removal counted progress again
    # "from what is there now": the bytes written into the big file still in flight were dropped with the bad
    # small one's, the figure fell to the complete files, and the deadline rule ended a download that could make
    # it (review of 12-04: at 20 s of 32 MiB at 1 MiB/s, "32.0MiB left at 972.8KiB/s ... 19s left").
    with _Watching("progress_deadline_s = 40\nprogress_window_s = 5\n") as watching:
        for second in range(1, 20):  # a 1 MiB file (complete at 1 s) and a 31 MiB one, at 1 MiB/s in all
            figures = watching.tick(second * MiB, 32 * MiB, MiB if second >= 2 else 0)
        assert figures["done_bytes"] == 19 * MiB, figures
        figures = watching.tick(20 * MiB, 31 * MiB, 0, ProgressReading(0, 0, 0, restarts=1, thrown_bytes=MiB))
        assert figures["done_bytes"] == 19 * MiB, figures  # 20 written, the bad 1 MiB thrown away
        for second in range(21, 26):
            figures = watching.tick(second * MiB, 32 * MiB, 0, ProgressReading(0, 0, 0, 1, MiB))
        assert figures["done_bytes"] == 24 * MiB and figures["rate_bytes_s"] == MiB, figures
        assert watching.download.slow == [], watching.download.slow  # 8 MiB left at 1 MiB/s, 15 s to go
        assert sum("no longer count" in line for line in watching.lines) == 1, watching.lines


@pytest.mark.parametrize("walks_first", [True, False])
def test_one_removal_seen_by_the_walks_and_said_by_the_command_counts_once(walks_first: bool) -> None:
    # curio says it removes the file before it does; the walks run on their own thread: the same removal comes
    # both ways, a tick or more apart, in either order. Counted twice, a second reset lost the bytes written in
    # between, and the log said it twice. Said first, a walk a moment old still counted the file complete: the
    # figure held, and the rate read a spike, then a dip (review of 12-04: 256 KiB/s read 1484.8, then 0).
    with _Watching() as watching:
        for second in range(1, 25):  # 1 MiB/s; a 16 MiB file complete at 16 s, seen so by the walks from 17 s
            figures = watching.tick(second * MiB, 32 * MiB, 16 * MiB if second >= 17 else 0)
        said = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=16 * MiB)
        if walks_first:
            steps = [watching.tick(25 * MiB, 32 * MiB, 0), watching.tick(26 * MiB, 32 * MiB, 0, said)]
        else:  # (said, the walk a moment old; then gone from the walks)
            steps = [watching.tick(25 * MiB, 32 * MiB, 16 * MiB, said), watching.tick(26 * MiB, 32 * MiB, 0, said)]
        steps.append(watching.tick(27 * MiB, 32 * MiB, 0, said))
        assert [f["done_bytes"] for f in steps] == [9 * MiB, 10 * MiB, 11 * MiB], steps
        assert [f["rate_bytes_s"] for f in [figures, *steps]] == [MiB] * 4, "the link's rate, no spike, no dip"
        assert sum("no longer count" in line for line in watching.lines) == 1, watching.lines


def test_a_slow_download_is_not_judged_before_its_observation_window() -> None:
    # A download's first seconds say little of its rate (a connection warming up, a mirror picked): the deadline
    # rule waits progress_window_s before it may end one, however slow it starts.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 10\n") as watching:
        for tick in range(1, 10):  # 64 KiB/s: 32 MiB would take over 8 minutes, 100 s are left
            watching.tick(tick * 64 * 1024, 32 * MiB, 0)
        assert watching.download.slow == [], "ended before its window"
        for tick in range(10, 13):
            watching.tick(tick * 64 * 1024, 32 * MiB, 0)
        assert len(watching.download.slow) == 1, watching.download.slow


def test_a_zero_fill_is_no_progress_and_a_link_too_slow_behind_it_is_given_up_at_its_window() -> None:
    # aria2c where fallocate is refused (ZFS before 2.2, NFSv3, FUSE) writes the whole file with zeros first, at
    # disk speed: read as bytes got, they made the figure 100% at once and the rate the disk's, so a link far too
    # slow for the deadline was not given up (measured with the real aria2c: 256 MiB at 512 KiB/s, 120 s allowed,
    # 100% at 5 s and no too_slow). What the I/O thread says was allocation is taken off what was written.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 10\n") as watching:
        assert watching.download.allocators == frozenset({"aria2c"}), "the I/O thread is asked of the allocators"
        watching.download.held = frozenset({(1, 2)})
        assert watching.download.held_seen is not None
        watching.download.allocating = 1
        for second in range(1, 3):  # the fill: 16 MiB a second, nothing got
            watching.download.allocated = second * 16 * MiB
            figures = watching.tick(second * 16 * MiB, 32 * MiB, 0)
            assert figures["done_bytes"] == 0, figures
        watching.download.allocating = 0
        assert watching.download.held_seen() == frozenset({(1, 2)}), "the walks are told which file is held"
        for second in range(3, 30):  # then 64 KiB/s: 32 MiB would take over 8 minutes, 100 s are left
            figures = watching.tick(32 * MiB + (second - 2) * 64 * 1024, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert figures["done_bytes"] == (second - 2) * 64 * 1024, figures
        assert figures["rate_bytes_s"] == 64 * 1024, figures  # the link's, its 2 s of filling left out
        # At its window of the link's time: the 10 s after the 2 s of filling.
        assert second == 12 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert watching.download.slow[0].startswith("31.4MiB left at 64.0KiB/s: "), watching.download.slow


def test_a_link_fast_enough_behind_a_zero_fill_is_left_alone() -> None:
    # The same fill before a link that makes it: never given up because of the zeros taken off.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 10\n") as watching:
        watching.download.allocated = 32 * MiB
        for second in range(1, 34):  # the fill in the first second, then 1 MiB/s: 32 s of 100
            figures = watching.tick(32 * MiB + (second - 1) * MiB, 32 * MiB, 0)
        assert watching.download.slow == [], watching.download.slow
        assert figures["done_bytes"] == 32 * MiB and figures["rate_bytes_s"] == MiB, figures


def test_a_long_zero_fill_is_no_time_of_the_link_s_and_no_link_behind_it_is_judged_on_it() -> None:
    # A fill longer than the observation window (45 GiB of zeros on a slow disk: minutes, then their flush) got
    # nothing, and the link was not in use meanwhile: counted as the link's time, the window's rate just after it was
    # a few seconds' bytes over a minute, and a link that makes the deadline was given up at its first bytes. The
    # time an allocating downloader allocates while nothing is got is not the link's; the window counts without it.
    with _Watching("progress_deadline_s = 1000\nprogress_window_s = 20\n") as watching:
        watching.download.allocating = 1
        for second in range(1, 201):  # the fill and its flush: 200 s, no byte got
            watching.download.allocated = min(second, 100) * MiB // 4
            watching.tick(watching.download.allocated, 32 * MiB, 0)
        watching.download.allocating = 0
        fill = watching.download.allocated
        for second in range(1, 400):  # then 96 KiB/s: 32 MiB in 341 s, with 800 s left
            figures = watching.tick(fill + second * 96 * 1024, 32 * MiB, 0)
            assert watching.download.slow == [], (second, watching.download.slow)
            if figures["done_bytes"] >= 32 * MiB:
                break
        assert figures["rate_bytes_s"] == 96 * 1024, figures
    # And a link too slow behind the same fill is given up once the window has seen it, not at the deadline.
    with _Watching("progress_deadline_s = 1000\nprogress_window_s = 20\n") as watching:
        watching.download.allocating = 1
        for second in range(1, 201):
            watching.download.allocated = min(second, 100) * MiB // 4
            watching.tick(watching.download.allocated, 32 * MiB, 0)
        watching.download.allocating = 0
        for second in range(1, 100):  # 32 KiB/s: 32 MiB in 1024 s, with 800 s left
            watching.tick(fill + second * 32 * 1024, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert second == 20 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert " left at 32.0KiB/s: " in watching.download.slow[0], watching.download.slow


def test_bytes_a_resumed_file_had_before_are_no_rate() -> None:
    # aria2c --continue: its first readout of a resumed file comes a minute late (block-buffered into the pipe)
    # and counts the part got before. The figure rightly grows by it; read as a rate, that jump hid a link far too
    # slow to make the deadline for the rest of the attempt (measured with the real aria2c: 85% at 460 KiB/s with
    # about 95 s left, never given up). The rate is what the link moved: the trees' bytes written.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 20\n") as watching:
        for second in range(1, 22):  # 64 KiB/s; the readout at 10 s: 16 MiB resumed + what this attempt got
            said = ProgressReading(16 * MiB + second * 64 * 1024, 0, 0) if second >= 10 else None
            figures = watching.tick(second * 64 * 1024, 32 * MiB, 0, said)
            if watching.download.slow:
                break
        assert figures["done_bytes"] == 16 * MiB + second * 64 * 1024, figures  # the resumed part is done
        assert figures["rate_bytes_s"] == 64 * 1024, figures
        assert second == 20 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert watching.download.slow[0].startswith("14.8MiB left at 64.0KiB/s: "), watching.download.slow


def test_without_a_fresh_measure_of_movement_the_figure_is_the_rate() -> None:
    # The I/O thread blind (its reading stale), or another user's process in the trees (its counters refused): what
    # they say moved nothing, and read as a rate of 0 it would end a healthy download. The figure's growth rates.
    with _Watching("progress_deadline_s = 1000\nprogress_window_s = 10\n") as watching:
        watching.download.io_readable = False
        for second in range(1, 31):  # 1 MiB/s, as the walks see the cache's complete files grow
            figures = watching.tick(0, 32 * MiB, second * MiB)
        assert figures["rate_bytes_s"] == MiB and watching.download.slow == [], (figures, watching.download.slow)
    with _Watching("progress_deadline_s = 1000\nprogress_window_s = 10\n") as watching:
        for second in range(1, 31):  # the same, the I/O thread's last reading (of 2 MiB) stale from 3 s on
            watching.download.io_seq = 1000 + min(second, 3)
            figures = watching.tick(min(second, 2) * MiB, 32 * MiB, second * MiB)
        assert figures["rate_bytes_s"] == MiB and watching.download.slow == [], (figures, watching.download.slow)


SETUP_WRITES = 7  # what a spawned child has written before it runs: the supervisor's own setup (wchar 7)


def test_a_download_with_no_data_yet_is_not_judged_on_its_silence() -> None:
    # A gateway slow to send its first byte, aria2c retrying its connection, a retry attempt: no data for longer than
    # the window. Judged on every byte the tree wrote (the spawn's setup writes, a line of output), the rate was a
    # few bytes a second and the attempt was given up, never retried (measured with the real supervisor: "80.0MiB
    # left at 0B/s" at its window, "48.0MiB left at 85B/s" with the real aria2c's one NOTICE line). The window and
    # the rate begin where the data does.
    with _Watching("progress_deadline_s = 60\nprogress_window_s = 10\n") as watching:
        for _ in range(14):  # the setup's writes and one line of output, then nothing
            watching.tick(SETUP_WRITES + 22, 32 * MiB, 0)
        assert watching.download.slow == [], watching.download.slow
        for second in range(1, 33):  # then 1 MiB/s: 32 MiB in 32 s, done at 46 s of 60
            figures = watching.tick(SETUP_WRITES + 22 + second * MiB, 32 * MiB, 0)
            assert watching.download.slow == [], (second, watching.download.slow)
        assert figures["done_bytes"] == 32 * MiB + SETUP_WRITES + 22 and figures["rate_bytes_s"] == MiB, figures


@pytest.mark.parametrize("silent_s", [0, 14])
def test_a_link_too_slow_is_given_up_its_window_after_it_began_to_move(silent_s: int) -> None:
    # The silence before the data is no rate, but the data's own rate still is: 8 KiB/s against a deadline it cannot
    # make is given up one window after it began to move, whether it moved from the start or after a silence.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 10\n") as watching:
        for _ in range(silent_s):
            watching.tick(SETUP_WRITES, 32 * MiB, 0)
        for second in range(1, 40):  # 8 KiB/s: 32 MiB in over an hour
            watching.tick(SETUP_WRITES + second * 8 * 1024, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert second == 10 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert watching.download.slow[0].startswith("31.9MiB left at 8.0KiB/s: "), watching.download.slow


def test_a_link_that_begins_between_two_ticks_is_judged_on_its_own_rate_not_on_part_of_a_silent_tick() -> None:
    # The data began a quarter of a tick before the first tick that saw it. Counted from the still tick before, the
    # rate read that tick's silence as the link's (7.4 KiB/s for 8; on a loaded machine, 5.3 of a 3 s window): it is
    # counted from the first tick that saw the data move, and the window still from the still one.
    with _Watching("progress_deadline_s = 100\nprogress_window_s = 10\n") as watching:
        for _ in range(3):
            watching.tick(SETUP_WRITES, 32 * MiB, 0)
        for second in range(1, 40):  # 8 KiB/s from 0.75 s into the first of these ticks
            watching.tick(SETUP_WRITES + 2 * 1024 + (second - 1) * 8 * 1024, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert second == 10 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert watching.download.slow[0].startswith("31.9MiB left at 8.0KiB/s: "), watching.download.slow


def test_a_download_that_never_moves_is_ended_by_its_deadline_not_by_its_chatter() -> None:
    # Output alone (a line a second: aria2c's retries, curio's go-log) is no rate: judged as one, a link that moved
    # nothing read as a slow one. Without stall_s nothing else ends it: the deadline does, when it passes.
    with _Watching("progress_deadline_s = 20\nprogress_window_s = 5\n") as watching:
        for second in range(1, 40):
            watching.tick(SETUP_WRITES + second * 120, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert second == 20 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert watching.download.slow[0].startswith("the deadline (progress_deadline_s=20 from this attempt's "
                                                    "start) passed 0s ago"), watching.download.slow


def _frozen(watching: _Watching, seconds: float, written: int) -> None:
    """The supervisor frozen for ``seconds`` (its threads with it: the readings stay those of before), then one tick
    at the thaw; ``written``: what the next readings say the trees wrote (the children frozen too, or not)."""
    watching.clock.now += seconds
    watching.loop.run_once(max_wait=0)
    watching.download.written = written


@pytest.mark.parametrize("children", ["frozen-too", "running"])
def test_a_freeze_of_the_supervisor_is_no_time_of_the_link_s_and_is_judged_on_readings_after_it(children: str
                                                                                               ) -> None:
    # docker pause (the supervisor and its children stopped), or the supervisor alone: at the thaw the figures were
    # those of before it (its I/O thread and walker were stopped too) and the rate was read over the frozen time: a
    # download that made it at 2 MiB/s was given up (measured: "66.0MiB left at 788.5KiB/s: 85s, 50s left" 3 ms after
    # the thaw). The watch waits for readings taken after the thaw, and the frozen time is not the link's.
    with _Watching("progress_deadline_s = 60\nprogress_window_s = 5\n") as watching:
        for second in range(1, 9):  # 1 MiB/s
            watching.download.read_at = watching.clock.now + watching.step
            watching.tick(second * MiB, 32 * MiB, 0)
        running = children == "running"
        _frozen(watching, 12.0, (8 + 13 if running else 8) * MiB)
        assert any(line.startswith("the supervisor was frozen") for line in watching.lines), watching.lines
        assert watching.download.slow == [], watching.download.slow
        got = 8 + 13 if running else 8
        for second in range(1, 30 - got):  # on at 1 MiB/s: 32 MiB at 43 s or so, of 60
            watching.download.read_at = watching.clock.now + watching.step
            figures = watching.tick((got + second) * MiB, 32 * MiB, 0)
            assert watching.download.slow == [], (second, watching.download.slow)
        assert figures["done_bytes"] == 29 * MiB, figures
        if not running:
            assert figures["rate_bytes_s"] == MiB, figures  # the link's: the frozen time left out


def test_a_link_too_slow_is_given_up_at_its_window_of_the_link_s_time_across_a_freeze() -> None:
    # The frozen time is left out of the observation window and of the rate, not only of a fast link's: 32 KiB/s
    # frozen with its children 5 s into its window is given up 10 s of the link's time after it began, at 32 KiB/s
    # (read over the freeze, it was judged at the first tick after the thaw, on a quarter of its rate).
    with _Watching("progress_deadline_s = 1000\nprogress_window_s = 10\n") as watching:
        for second in range(1, 6):
            watching.download.read_at = watching.clock.now + watching.step
            watching.tick(second * 32 * 1024, 32 * MiB, 0)
        _frozen(watching, 20.0, 5 * 32 * 1024)
        for second in range(6, 30):
            watching.download.read_at = watching.clock.now + watching.step
            watching.tick(second * 32 * 1024, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert second == 10 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert " left at 32.0KiB/s: " in watching.download.slow[0], watching.download.slow


def test_a_hold_of_the_loop_is_the_link_s_time_not_a_freeze() -> None:
    # A start's exec wait holds the loop (EventLoop.holding) while the I/O thread, the walker and the download go on:
    # those seconds are the link's. Taken for a freeze, they were left out of its time while the bytes got in them
    # counted: 32 KiB/s read as 160 KiB/s after a 20 s hold, and a link too slow was given up late.
    from supervisor.engine.loop import Hold

    with _Watching("progress_deadline_s = 1000\nprogress_window_s = 10\n") as watching:
        holds: list[Hold] = []
        watching.freeze._holds = lambda: holds
        for second in range(1, 6):
            watching.download.read_at = watching.clock.now + watching.step
            watching.tick(second * 32 * 1024, 32 * MiB, 0)
        holds.append(Hold(watching.clock.now, "the start of x/y (waiting for its exec)", watching.clock.now + 20.0))
        _frozen(watching, 20.0, 25 * 32 * 1024)  # (the link went on at 32 KiB/s meanwhile)
        assert any(line.startswith("the supervisor's loop was held for 20.0s") for line in watching.lines), \
            watching.lines
        for second in range(26, 40):
            watching.download.read_at = watching.clock.now + watching.step
            watching.tick(second * 32 * 1024, 32 * MiB, 0)
            if watching.download.slow:
                break
        assert second < 30 and len(watching.download.slow) == 1, (second, watching.download.slow)
        assert " left at 32.0KiB/s: " in watching.download.slow[0], watching.download.slow


def test_readings_that_do_not_come_after_a_thaw_are_not_waited_for_past_their_freshness() -> None:
    # An I/O thread or walker that reads nothing after the thaw (blind) does not keep the watch from its deadline:
    # it waits for readings after the thaw MOVED_FRESH_S at most, then judges on what it has, and a deadline that
    # passed in the freeze ends the download.
    from supervisor.evidence.progresswatch import MOVED_FRESH_S

    with _Watching("progress_deadline_s = 40\nprogress_window_s = 10\n") as watching:
        for second in range(1, 6):
            watching.download.read_at = watching.clock.now + watching.step
            watching.tick(second * MiB, 32 * MiB, 0)
        assert watching.download.slow == [], "judged before its window"
        _frozen(watching, 40.0, 5 * MiB)
        waited = 0.0
        while not watching.download.slow and waited < 2 * MOVED_FRESH_S:
            watching.clock.now += watching.step
            watching.loop.run_once(max_wait=0)
            waited += watching.step
        assert waited <= MOVED_FRESH_S + watching.step, (waited, watching.download.slow)
        assert " passed " in watching.download.slow[0], watching.download.slow


def test_a_download_that_completes_is_no_removal() -> None:
    # aria2c deletes <file>.aria2 as it completes; the walks count the file complete only once it has been quiet
    # (COMPLETE_QUIET_S): one walk in between sees the cache a few KiB smaller and no more of it complete. Read
    # as a partial file removed, every completion took its control file's bytes off and said so (review of 12-04).
    with _Watching() as watching:
        watching.tick(8 * MiB, 32 * MiB + 4096, 0)
        assert watching.tick(32 * MiB, 32 * MiB, 0)["done_bytes"] == 32 * MiB  # the control file gone
        assert watching.tick(32 * MiB, 32 * MiB, 32 * MiB)["done_bytes"] == 32 * MiB  # then complete
        assert watching.lines == [], watching.lines


def test_a_walk_a_moment_old_does_not_release_what_was_said_thrown_away() -> None:
    # The walker numbers the walks of every path it watches: the hold counted the cache's walks by their numbers
    # and released after one (review of 12-04), and the walk that then saw the file go took it off again.
    with _Watching() as watching:
        for second in range(1, 21):
            watching.tick(second * MiB, 32 * MiB, 16 * MiB if second >= 17 else 0)
        said = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=16 * MiB)
        steps = [watching.tick(21 * MiB, 32 * MiB, 16 * MiB, said),  # said; the walk a moment old
                 watching.tick(22 * MiB, 32 * MiB, 16 * MiB, said),  # one more walk, begun before the delete
                 watching.tick(23 * MiB, 32 * MiB, 0, said)]  # gone
        assert [f["done_bytes"] for f in steps] == [5 * MiB, 6 * MiB, 7 * MiB], steps
        assert sum("no longer count" in line for line in watching.lines) == 1, watching.lines


def test_a_second_word_is_held_its_own_walks_not_the_first_one_s() -> None:
    # A file said thrown away (and never seen complete), then another one a walk later: the second rode on the
    # first one's count of walks, was released early, and taken off again when the walks saw it go.
    with _Watching() as watching:
        for second in range(1, 21):
            watching.tick(second * MiB, 32 * MiB, 8 * MiB if second >= 10 else 0)
        first = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=2 * MiB)  # (a file no walk saw complete)
        both = ProgressReading(0, 0, 0, restarts=2, thrown_bytes=10 * MiB)  # (then the 8 MiB one)
        watching.tick(21 * MiB, 32 * MiB, 8 * MiB, first)
        watching.tick(22 * MiB, 32 * MiB, 8 * MiB, both)
        watching.tick(23 * MiB, 32 * MiB, 8 * MiB, both)  # (a walk a moment old)
        done = watching.tick(24 * MiB, 32 * MiB, 0, both)["done_bytes"]  # the 8 MiB file gone
        assert done == 14 * MiB, done  # 24 written, 10 thrown away: once each
        assert sum("no longer count" in line for line in watching.lines) == 2, watching.lines


def test_a_file_said_thrown_away_that_no_walk_saw_complete_is_not_held_back_for_ever() -> None:
    # A file checked, deleted and preallocated anew between two walks was never counted complete by them: what
    # the command said of it is held off the walks' figure only until UNSEEN_WALKS walks have passed.
    from supervisor.evidence.progresswatch import UNSEEN_WALKS

    # (no I/O counters here: the walks' figure and the command's reading are all there is)
    with _Watching() as watching:
        watching.download.io_readable = False
        watching.tick(0, 32 * MiB, 16 * MiB, ProgressReading(0, 0, 0))  # 16 MiB complete
        said = ProgressReading(0, 0, 0, restarts=1, thrown_bytes=4 * MiB)  # a 4 MiB file no walk saw complete
        held = watching.tick(0, 32 * MiB, 16 * MiB, said)["done_bytes"]
        assert held == 12 * MiB, held  # (the walk may be a moment old: it is held off it)
        for _ in range(UNSEEN_WALKS):
            figures = watching.tick(0, 32 * MiB, 16 * MiB, said)
        assert figures["done_bytes"] == 16 * MiB, figures  # no walk saw it go: it never counted complete


def test_a_restart_of_no_known_size_is_said_and_takes_nothing_away() -> None:
    # Without aria2c (curio's Go fetch prints no readout) the command's line names a file but not its size: what
    # is done is not cut (a guess could end a healthy download as too_slow); the log says why it is kept.
    with _Watching() as watching:
        watching.tick(8 * MiB, 32 * MiB, 0)
        figures = watching.tick(9 * MiB, 32 * MiB, 0, ProgressReading(0, 0, 0, restarts=1))
        assert figures["done_bytes"] == 9 * MiB, figures
        assert watching.lines == ["phase fetch: the command deletes a file to fetch it again: its size is not "
                                  "known, so its bytes still count"]


def test_an_attempt_that_began_before_the_cache_existed_got_further_only_by_complete_files() -> None:
    # curio makes FIL_PROOFS_PARAMETER_CACHE once it runs: the watch's first walk finds nothing, and gained()
    # fell back to the bytes written, into a file curio deletes when aria2c fails, forgiving the attempt.
    with _Watching() as watching:
        watching.download.walk(None, 0)
        watching.tick(0, None, 0)
        watching.tick(6 * MiB, 32 * MiB, 0)
        assert watching.watch.gained() == 0
        watching.tick(8 * MiB, 32 * MiB, 8 * MiB)  # a file complete: that stays for the next attempt
        assert watching.watch.gained() == 8 * MiB


def test_an_attempt_got_further_only_by_the_complete_files_the_next_one_keeps() -> None:
    # retry_while_progressing forgives an attempt that got further. What it wrote into a file left incomplete
    # is gone with it (curio deletes a file aria2c gave up, its Go fallback having failed the check): an attempt
    # that had only written such bytes was forgiven, every time, for ever. A file it completed stays.
    for complete_at_end, kept in ((0, 0), (8 * MiB, 8 * MiB)):
        with _Watching() as watching:
            watching.download.walk(16 * MiB, 4 * MiB)  # a file complete from before, one preallocated
            for written, done in ((2 * MiB, 4 * MiB), (4 * MiB, 4 * MiB), (4 * MiB, 4 * MiB + complete_at_end)):
                watching.tick(written, 16 * MiB, done)
            assert watching.watch.gained() == kept, (complete_at_end, watching.watch.figures())


def test_the_probe_walks_on_its_own_thread_and_publishes_each_walk(tmp_path: Path) -> None:
    walkers_before = [t.name for t in threading.enumerate()].count("progress")  # (another test's, closing)
    probe = ProgressProbe()
    try:
        (tmp_path / "f").write_bytes(b"x" * 5)
        release = probe.watch(str(tmp_path), 0.05)
        first = wait_for(lambda: probe.latest(str(tmp_path)))
        assert (first.size, first.files) == (5, 1), first
        (tmp_path / "g").write_bytes(b"y" * 7)
        grown = wait_for(lambda: (m := probe.latest(str(tmp_path))) is not None and m.size == 12 and m)
        assert grown.seq > first.seq and grown.at > first.at and grown.files == 2
        assert [t.name for t in threading.enumerate()].count("progress") <= walkers_before + 1  # one, for both
        release()
        settled = probe.latest(str(tmp_path))
        (tmp_path / "h").write_bytes(b"z")
        time.sleep(0.3)
        assert probe.latest(str(tmp_path)) == settled, "walked although nobody watches it"
    finally:
        probe.close()


@pytest.mark.parametrize("settled", [False, True], ids=["periodic", "settled"])
def test_a_walk_of_a_hung_mount_is_said_once_while_it_hangs_and_when_it_ends(tmp_path: Path, settled: bool) -> None:
    # The settled walk (a download that ended well: its last figures) is watched as the periodic ones are: it
    # hung without a word before, and the walker with it.
    probe = ProgressProbe(slow_s=0.3)
    try:
        with hung_mount(tmp_path / "hung") as hung:
            settling = probe.settle(str(hung)) if settled else None
            if settling is None:
                probe.watch(str(hung))
            going = wait_for(lambda: probe.check(), timeout=10)
            assert len(going) == 1 and going[0].startswith(f"progress: walking {hung} has not finished after "), going
            assert "(a big tree, or a hung mount?)" in going[0]
            assert probe.latest(str(hung)) is None, "a walk that never ended published a size"
            assert settling is None or settling.measure() == (False, None), "a settled walk not done yet"
            assert probe.check() == [], "said once"
        ended = wait_for(lambda: probe.check(), timeout=10)  # the mount gone, the walk ends (ENOTCONN)
        assert len(ended) == 1 and ended[0].startswith(f"progress: walking {hung} took "), ended
        if settling is not None:
            assert settling.measure() == (True, None), "walked, and cut short: no measure"
            settling.release()
    finally:
        probe.close()


# ================================================================ end to end

STALL_S = 1.0
GRACE_S = 2.0


def script(tmp: Path, name: str, code: str) -> str:
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(code))
    return toml_list([PY, str(path)])


def stall_phase(command: str, *, extra: str = "") -> str:
    return f"""
        [[phases]]
        name = "p"
        stall_s = {STALL_S}
        command = {command}
        {extra}
        """


def test_silent_child_is_stalled(sup: Runner) -> None:
    cfg = sup.write(stall_phase(toml_list(["sleep", "30"])), stop_grace_s=GRACE_S)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    record = one_verdict(out, "p")
    assert " reason=stalled " in record, record
    assert "no output for" in record and "no GPU visible" in record, record
    assert "GPU evidence: no GPU" in out

    starting = first_line(out, "phase p: pending → starting")
    started = first_line(out, "started p/p: pid")
    stalled = first_line(out, "phase p: stalled: ")
    verdict = first_line(out, "reason=stalled")
    named_after = seconds_between(starting, stalled)
    verdict_after = seconds_between(started, verdict)
    print(f"stall named {named_after:.3f}s after the attempt started; verdict {verdict_after:.3f}s after the "
          f"child started; whole run {result.duration:.2f}s (stall_s={STALL_S:g}, grace={GRACE_S:g})")
    assert named_after >= STALL_S - 0.01, "a stall was named before stall_s had passed"
    assert verdict_after < STALL_S + 1.5, out
    assert result.duration < STALL_S + GRACE_S + 5, out


def test_chatty_child_is_never_stalled(sup: Runner) -> None:
    chatty = script(sup.tmp, "chatty", """\
        import time
        for i in range(15):
            print(f"tick {i}", flush=True)
            time.sleep(0.2)
        """)
    cfg = sup.write(stall_phase(chatty), stop_grace_s=GRACE_S)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == 0, out
    assert "reason=stalled" not in out and "phase p: stalled" not in out, out
    record = one_verdict(out, "p")
    assert " reason=exit_code exit_code=0 " in record, record
    assert result.duration >= 3.0


PARAMFETCH_LIKE = """\
    import os, sys, time
    target = os.path.join(sys.argv[1], "params.bin")
    for i in range({chunks}):
        with open(target, "ab") as f:
            f.write(b"p" * 65536)
        time.sleep(0.2)
    time.sleep({then_sleep})
    """


def paramfetch_like(tmp: Path, params: Path, chunks: int, then_sleep: float) -> str:
    path = tmp / "fetch.py"
    path.write_text(textwrap.dedent(PARAMFETCH_LIKE.format(chunks=chunks, then_sleep=then_sleep)))
    return toml_list([PY, str(path), str(params)])


def test_growing_progress_path_is_not_stalled(sup: Runner) -> None:
    params = sup.tmp / "params"
    params.mkdir()
    command = paramfetch_like(sup.tmp, params, chunks=15, then_sleep=0)
    cfg = sup.write(stall_phase(command, extra=f"progress_path = {toml_str(str(params))}"), stop_grace_s=GRACE_S)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == 0, out
    assert "reason=stalled" not in out and "phase p: stalled" not in out, out
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p")
    assert (params / "params.bin").stat().st_size == 15 * 65536


def test_progress_path_that_stops_growing_is_stalled(sup: Runner) -> None:
    params = sup.tmp / "params"
    params.mkdir()
    command = paramfetch_like(sup.tmp, params, chunks=5, then_sleep=30)
    cfg = sup.write(stall_phase(command, extra=f"progress_path = {toml_str(str(params))}"), stop_grace_s=GRACE_S)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    record = one_verdict(out, "p")
    assert " reason=stalled " in record, record
    assert "no progress_path writes for" in record and "no output for" in record, record
    starting = first_line(out, "phase p: pending → starting")
    stalled = first_line(out, "phase p: stalled: ")
    named_after = seconds_between(starting, stalled)
    print(f"stall named {named_after:.3f}s after the attempt started (growth for 0.8s+, stall_s={STALL_S:g})")
    # The last write comes at least 0.8 s after the child started: growth was seen, so the stall comes later.
    assert named_after >= 0.8 + STALL_S - 0.05, out
    assert named_after < 0.8 + STALL_S + 3, out


def test_a_progress_path_the_walker_cannot_walk_is_said_and_not_taken_for_silence(sup: Runner) -> None:
    # A tree nested deeper than PATH_MAX: every walk raises ENAMETOOLONG, as a flaky NFS cache's raise EIO or ESTALE.
    # The walker said nothing for 300 s, and the verdict claimed 1 s of measured silence of progress_path.
    params = sup.tmp / "params"
    params.mkdir()
    fd = os.open(params, os.O_RDONLY)
    try:
        for _ in range(40):
            os.mkdir("d" * 200, dir_fd=fd)
            deeper = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    cfg = sup.write(stall_phase(toml_list(["sleep", "30"]), extra=f"progress_path = {toml_str(str(params))}"),
                    stop_grace_s=GRACE_S)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    assert f"progress: walking {params} failed (OSError: [Errno 36] File name too long: " in out, out
    record = one_verdict(out, "p")
    assert re.search(rf"no progress_path writes for \d+\.\ds \(no GPU visible\) \(progress_path evidence "
                     rf"unavailable: no walk of {re.escape(str(params))} for \d+\.\ds: its walks fail: OSError: "
                     rf"\[Errno 36\] File name too long: ", record), record
    assert out.index("progress: walking") < out.index("phase p: stalled"), "the failed walks said after the verdict"


def test_a_stalled_oneshot_is_retried(sup: Runner) -> None:
    cfg = sup.write(stall_phase(toml_list(["sleep", "30"]), extra="retries = 1\nbackoff_s = 0.1\nbackoff_jitter = 0"),
                    stop_grace_s=GRACE_S)
    result = sup.run(cfg, timeout=40)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    records = verdict_lines(out, "p")
    assert len(records) == 2, records
    assert " attempt=1 " in records[0] and " attempt=2 " in records[1], records
    assert all(" reason=stalled " in r for r in records), records
    assert "stalled; retry 1 of 1" in out
    assert "phase p: stopping → failed (stalled (all 1 retries used))" in out


def test_a_write_into_a_file_that_does_not_grow_is_a_sign_of_life() -> None:
    """aria2c preallocates: its file has its full size at once, and only its mtime says it is being written (the
    sign that is left where the worker's I/O counters are another user's to read)."""
    w = watch(path=True)
    w.saw_progress(6 << 20, 5000.0, 100.0)  # the baseline: the file allocated whole
    w.saw_progress(6 << 20, 5000.5, 100.9)  # the same size, written since
    assert w.stalled(101.8) is None, "a newer write is progress"
    w.saw_progress(6 << 20, 5000.5, 101.5)  # nothing written since
    assert w.stalled(101.9) == "no output for 1.9s, no progress_path writes for 1.0s (no GPU visible)"
    w.saw_progress(6 << 20, 4000.0, 102.0)  # the newest file deleted: an older write is no progress...
    assert w.stalled(102.0) is not None
    w.saw_progress(6 << 20, 5001.0, 102.1)  # ...a write after the newest seen is
    assert w.stalled(103.0) is None
