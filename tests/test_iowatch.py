"""The I/O thread's accounting (iowatch.py): the pure ledger of a tree's bytes, then the real thread reading
real processes' /proc/<pid>/io (a shell that writes through children it reaps, a parent writing after a helper it
leaves a zombie or has auto-reaped, a tree that goes quiet, a process that only reads, a downloader that allocates
its file by writing zeros before its control file, and the whole process table read only every TREE_REFRESH_S for
a watch that names such downloaders, and a process that left the trees, found by its phase's cgroup)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for

from supervisor.engine.trees import TAG_ENV, ProcessTable
from supervisor.evidence.cgroups import MemoryCgroup
from supervisor.evidence.iowatch import IoLedger, IoProbe, ProcIo, parse_io, read_files, read_io
from supervisor.evidence.progress import FileId

MIB = 1 << 20


def proc(pid: int, ppid: int, rchar: int = 0, wchar: int = 0, read_bytes: int = 0, write_bytes: int = 0,
         backed: set[FileId] | None = None, filling: set[FileId] = frozenset()) -> ProcIo:  # type: ignore[assignment]
    return ProcIo(pid, ppid, (rchar, wchar, read_bytes, write_bytes),
                  None if backed is None else frozenset(backed), frozenset(filling))


# An allocating downloader's files (st_dev, st_ino).
F1, F2, F3, F4 = (1, 1), (1, 2), (1, 3), (1, 4)


# ================================================================ the ledger, pure


def test_the_first_reading_is_the_baseline() -> None:
    ledger = IoLedger()
    ledger.add([proc(10, 1, rchar=5 * MIB, wchar=3 * MIB)])
    assert (ledger.moved, ledger.written, ledger.readable) == (0, 0, True)
    ledger.add([proc(10, 1, rchar=5 * MIB + 100, wchar=3 * MIB + 50)])
    assert (ledger.moved, ledger.written) == (150, 50)


def test_from_zero_the_first_reading_counts_whole() -> None:
    """An attempt's trees began with it: a downloader's first MiB, written before the first reading, is the
    attempt's (it was lost to the baseline, and a failed attempt that had got a MiB further read as none)."""
    ledger = IoLedger(from_zero=True)
    ledger.add([proc(10, 1, rchar=5 * MIB, wchar=3 * MIB)])
    assert (ledger.moved, ledger.written) == (8 * MIB, 3 * MIB)
    ledger.add([proc(10, 1, rchar=5 * MIB + 100, wchar=3 * MIB + 50)])
    assert (ledger.moved, ledger.written) == (8 * MIB + 150, 3 * MIB + 50)


def test_a_process_that_appears_counts_all_its_bytes_and_one_that_goes_keeps_what_it_had() -> None:
    ledger = IoLedger()
    ledger.add([proc(10, 1)])
    ledger.add([proc(10, 1), proc(11, 10, wchar=1000)])  # forked after the baseline: it began at zero
    assert ledger.written == 1000
    ledger.add([proc(10, 1)])  # 11 went (the supervisor reaped it: its parent 10 did not take it in)
    assert ledger.written == 1000


def test_a_child_reaped_by_its_parent_in_the_tree_is_not_counted_twice() -> None:
    # The kernel adds a reaped child's counters to its parent's: sh's jump is head's bytes again.
    ledger = IoLedger()
    ledger.add([proc(10, 1, wchar=100)])
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=MIB)])
    ledger.add([proc(10, 1, wchar=100 + MIB + 4096)])  # 11 reaped by 10: 4096 more since the last reading
    assert ledger.written == MIB + 4096


def test_a_child_gone_before_its_parent_takes_it_in_is_counted_once_within_the_readings_it_is_looked_for() -> None:
    # A child gone from the readings before its parent's counters hold it (zombies were left out of the table, the
    # child gone long before its reap) had its 14 MiB counted twice (27 MiB for 14 written). It is looked for in
    # its parent's counters in the reading it went in and the next two (DEBT_READINGS).
    ledger = IoLedger()
    ledger.add([proc(10, 1, wchar=100)])
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=14 * MIB)])
    ledger.add([proc(10, 1, wchar=100)])  # 11 gone from the readings, its counters not in 10's yet
    ledger.add([proc(10, 1, wchar=100)])
    assert ledger.written == 14 * MIB
    ledger.add([proc(10, 1, wchar=100 + 14 * MIB)])  # reaped: its counters in 10's now
    assert ledger.written == 14 * MIB
    ledger.add([proc(10, 1, wchar=100 + 14 * MIB + 4096)])  # 10's own bytes count again
    assert ledger.written == 14 * MIB + 4096


def test_a_child_auto_reaped_never_takes_its_parents_own_bytes() -> None:
    """A parent that ignores SIGCHLD has its children reaped by the kernel, their counters added to nobody's: what
    such a child wrote was taken out of its parent's later growth, a parent's steady 256 KiB a reading swallowed
    for 32 readings by an 8 MiB helper (stalled). A child whose counters the parent's growth never holds whole in
    the readings after it went was not reaped by it: its growth is its own."""
    ledger = IoLedger()
    ledger.add([proc(10, 1, wchar=100)])
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=8 * MIB)])
    for i in range(1, 6):  # 11 auto-reaped: gone, and 10's counters never take it in
        ledger.add([proc(10, 1, wchar=100 + i * 256 * 1024)])
        assert ledger.written == 8 * MIB + i * 256 * 1024
    ledger.add([proc(10, 1, wchar=100 + 5 * 256 * 1024 + 8 * MIB)])  # 10's own burst, long after: all its own
    assert ledger.written == 16 * MIB + 5 * 256 * 1024


def test_a_child_reaped_as_its_parent_is_read_is_counted_once_at_the_next_reading() -> None:
    # The parent read before the reap, the child gone before its own read in the same round: the parent's counters
    # take the child's in at the next reading, with the bytes the child wrote since it was last read.
    ledger = IoLedger()
    ledger.add([proc(10, 1, wchar=100)])
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, rchar=MIB, wchar=2 * MIB)])
    ledger.add([proc(10, 1, wchar=100 + 4096)])  # 11 gone, 10 read before its reap: its own 4096 count
    assert (ledger.moved, ledger.written) == (3 * MIB + 4096, 2 * MIB + 4096)
    ledger.add([proc(10, 1, rchar=MIB + 512, wchar=100 + 4096 + 2 * MIB + 1000)])  # 11 wrote 1000 more, read 512
    assert (ledger.moved, ledger.written) == (3 * MIB + 4096 + 1512, 2 * MIB + 5096)


def test_a_process_whose_counters_are_refused_has_not_gone() -> None:
    """A helper that becomes another user's (its counters refused to a supervisor without CAP_SYS_PTRACE) is still
    there: it was taken for gone, its bytes a debt its parent never paid, the parent's own work swallowed."""
    ledger = IoLedger()
    ledger.add([proc(10, 1, wchar=100)])
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=8 * MIB)])
    for i in range(1, 6):
        ledger.add([proc(10, 1, wchar=100 + i * 256 * 1024)], refused=[11])
        assert ledger.written == 8 * MIB + i * 256 * 1024
    ledger.add([proc(10, 1, wchar=100 + 5 * 256 * 1024), proc(11, 10, wchar=9 * MIB)])  # readable again: its MiB
    assert ledger.written == 9 * MIB + 5 * 256 * 1024
    ledger.add([proc(10, 1, wchar=100 + 5 * 256 * 1024)], refused=[11])  # refused again, then reaped by 10:
    ledger.add([proc(10, 1, wchar=100 + 5 * 256 * 1024 + 9 * MIB + 4096)])  # its 9 MiB in 10's, counted once
    assert ledger.written == 9 * MIB + 5 * 256 * 1024 + 4096


def test_what_a_parent_owes_goes_with_it_or_with_its_pid() -> None:
    ledger = IoLedger()
    ledger.add([proc(10, 1)])
    ledger.add([proc(10, 1), proc(11, 10, wchar=MIB)])
    ledger.add([proc(10, 1)])  # 11 gone, 10 owes its MiB
    ledger.add([proc(12, 1)])  # 10 gone too (never reaped 11): nothing is owed any more
    ledger.add([proc(12, 1), proc(10, 1, wchar=MIB)])  # a new process under pid 10: all its bytes are its own
    assert ledger.written == 2 * MIB


def test_a_counter_that_goes_back_is_a_new_process_under_a_reused_pid() -> None:
    ledger = IoLedger()
    ledger.add([proc(10, 1, rchar=9000)])
    ledger.add([proc(10, 1, rchar=300)])  # not a loss of 8700 bytes: another process, 300 bytes of its own
    assert ledger.moved == 300


def test_what_an_allocating_downloader_writes_before_its_control_file_is_allocation_not_data() -> None:
    """aria2c on a filesystem without fallocate writes its file whole with zeros, and makes its control file only
    then (measured: 2 GiB of zeros in 10 s, then 1 s of fsync, then the control file, then the first byte got).
    Its bytes written before it holds a file with its control file beside it are allocation; each reading's bytes
    are judged by what it had held by the reading before (a new process: nothing yet), so the fill's last stretch,
    written in the reading where its control file came, is allocation too; once it held it, what it writes is the
    download's to its end. Another process's bytes are data."""
    ledger = IoLedger(from_zero=True)
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=300 * MIB, backed=set(), filling={F1})])  # filling
    assert (ledger.written, ledger.allocated, ledger.allocating) == (100 + 300 * MIB, 300 * MIB, 1)
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=512 * MIB, backed=set(), filling={F1})])  # flushing
    assert (ledger.allocated, ledger.allocating) == (512 * MIB, 1)
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=512 * MIB + 66, backed={F1})])  # its control file
    assert (ledger.written, ledger.allocated, ledger.allocating) == (100 + 512 * MIB + 66, 512 * MIB + 66, 0)
    ledger.add([proc(10, 1, wchar=100), proc(11, 10, wchar=513 * MIB, backed={F1})])  # its first MiB got
    assert (ledger.written, ledger.allocated) == (100 + 513 * MIB, 512 * MIB + 66)
    ledger.add([proc(10, 1, wchar=200), proc(11, 10, wchar=514 * MIB, backed=None)])  # its files unread now
    assert (ledger.written, ledger.allocated) == (200 + 514 * MIB, 512 * MIB + 66)
    # Its file complete: the control file removed, its results printed; still the download's, no allocation.
    ledger.add([proc(10, 1, wchar=200), proc(11, 10, wchar=514 * MIB + 500, backed=set(), filling={F1})])
    assert (ledger.allocated, ledger.allocating) == (512 * MIB + 66, 0)
    # One first seen already holding its control file (a download resumed, or a fill done before it was found):
    # what it wrote before it was seen is not known to be data.
    ledger.add([proc(10, 1, wchar=200), proc(12, 10, wchar=MIB, backed={F3})])
    assert ledger.allocated == 513 * MIB + 66
    ledger.add([proc(10, 1, wchar=200), proc(12, 10, wchar=2 * MIB, backed={F3})])
    assert ledger.allocated == 513 * MIB + 66
    # Its pid taken by another (its counters went back): that one starts afresh, allocating until its control file.
    ledger.add([proc(10, 1, wchar=200), proc(12, 10, wchar=MIB, backed=set(), filling={F4})])
    assert (ledger.allocated, ledger.allocating) == (514 * MIB + 66, 1)


def test_a_downloader_fetching_files_in_turn_allocates_each_and_its_zeros_are_never_data() -> None:
    """One aria2c fetching a list (``-i``) where fallocate is refused zero-fills each file in its turn. Once it had
    held its first file with its control file, every later write was taken for data: the second file's zeros
    counted as got (a 200 MiB file at 100% in seconds, the too-slow link caught only at its deadline)."""
    ledger = IoLedger(from_zero=True)
    ledger.add([proc(11, 1, wchar=8 * MIB, backed=set(), filling={F1})])  # the first file's zeros
    ledger.add([proc(11, 1, wchar=8 * MIB + 66, backed={F1})])  # its control file
    ledger.add([proc(11, 1, wchar=16 * MIB, backed={F1})])  # its data
    assert (ledger.allocated, ledger.allocating) == (8 * MIB + 66, 0)
    ledger.add([proc(11, 1, wchar=16 * MIB + 100, backed=set(), filling={F1})])  # done: its control file removed
    assert (ledger.allocated, ledger.allocating) == (8 * MIB + 66, 0)
    ledger.add([proc(11, 1, wchar=216 * MIB, backed=set(), filling={F2})])  # the next file's zeros
    assert (ledger.allocated, ledger.allocating) == (208 * MIB - 34, 1)  # (and the first's last 100 bytes)
    ledger.add([proc(11, 1, wchar=216 * MIB + 66, backed={F2})])  # its control file
    ledger.add([proc(11, 1, wchar=217 * MIB, backed={F2})])  # its first MiB got
    assert (ledger.written, ledger.allocated, ledger.allocating) == (217 * MIB, 208 * MIB + 32, 0)
    # A small file's zeros and control file both between two readings (measured with the real aria2c: 48 MiB
    # zero-filled in under half a second): a file new to the reading is judged as one never seen with its own.
    ledger.add([proc(11, 1, wchar=265 * MIB, backed={F3})])
    assert (ledger.allocated, ledger.allocating) == (256 * MIB + 32, 0)
    ledger.add([proc(11, 1, wchar=266 * MIB, backed={F3})])
    assert (ledger.written, ledger.allocated) == (266 * MIB, 256 * MIB + 32)


def test_the_files_an_allocator_may_allocate_are_those_it_writes_in_place(tmp_path: Path) -> None:
    """A log open for appending, a list open for reading, a control file (or its save, ``.aria2__temp``, written at
    every --auto-save-interval): none is a file being allocated (a log held for the whole run would have had every
    byte taken for allocation, a save caught by a reading that reading's data)."""
    for name in ("g.params", "g.params.aria2", "list.txt"):
        (tmp_path / name).write_bytes(b"")
    with open(tmp_path / "f.params", "wb") as written, open(tmp_path / "g.params", "r+b") as in_place, \
            open(tmp_path / "run.log", "ab") as log, open(tmp_path / "list.txt", "rb") as listed, \
            open(tmp_path / "g.params.aria2", "r+b") as control, \
            open(tmp_path / "g.params.aria2__temp", "wb") as saving:  # (aria2c's save of its control file)
        files = read_files(os.getpid())
        ids = {name: (os.fstat(fh.fileno()).st_dev, os.fstat(fh.fileno()).st_ino)
               for name, fh in (("written", written), ("in place", in_place), ("log", log), ("list", listed),
                                ("control", control), ("saving", saving))}
    assert files is not None
    mine = set(ids.values())  # (the test process holds files of its own: its output redirected to one, by a CI)
    assert (files.filling & mine, files.backed & mine) == ({ids["written"]}, {ids["in place"]}), (files, ids)
    assert mine <= files.held


def test_nothing_readable_is_no_evidence() -> None:
    ledger = IoLedger()
    ledger.add([])
    ledger.add([])
    assert (ledger.moved, ledger.readable) == (0, False)


def test_parse_io_reads_the_kernel_text_and_refuses_garbage() -> None:
    text = (b"rchar: 244939\nwchar: 8389856\nsyscr: 120\nsyscw: 40\nread_bytes: 0\nwrite_bytes: 8417280\n"
            b"cancelled_write_bytes: 0\n")
    assert parse_io(text) == (244939, 8389856, 0, 8417280)
    assert parse_io(b"rchar: 1\nwchar: x\nread_bytes: 0\nwrite_bytes: 0\n") is None
    assert parse_io(b"\xff\xfe garbage") is None
    assert read_io(-1) is None


# ================================================================ the thread, on real processes


def io_readable() -> None:
    if read_io(os.getpid()) is None:
        pytest.skip("/proc/<pid>/io is not readable here (a kernel without task I/O accounting)")


def spawn(script: str, tag: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", script], env={**os.environ, TAG_ENV: tag}, start_new_session=True)


def test_a_shell_writing_through_children_it_reaps_counts_each_byte_once(tmp_path: Path) -> None:
    io_readable()
    target = tmp_path / "out"
    child = spawn(f"sleep 0.5; head -c {MIB} /dev/zero > {target}; sleep 0.3; "
                  f"head -c {MIB} /dev/zero > {target}; sleep 0.5", "iotest.1")
    probe = IoProbe()
    watch = probe.watch(0.2)
    try:
        watch.follow([(child.pid, "iotest.1")])
        child.wait(20)
        wait_for(lambda: (latest := watch.latest()) is not None and latest.procs == 0, 5, 0.05)
        latest = watch.latest()
        assert latest is not None and latest.readable
        # Two heads wrote 1 MiB each; the shell that reaped them took their counters in (not counted again);
        # the shell's own redirections add no data.
        assert 2 * MIB <= latest.written < 2 * MIB + 64 * 1024, latest
        assert latest.moved >= 4 * MIB  # read from /dev/zero too
    finally:
        watch.release()
        probe.close()
        if child.poll() is None:
            child.kill()


@pytest.mark.parametrize("helper", ["zombie", "auto-reaped", "reaped"])
def test_a_parents_own_bytes_after_a_helper_it_does_not_reap_are_counted(
        tmp_path: Path, helper: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper writes 1 MiB and ends; its parent then writes 512 KiB. A helper left a zombie (never waited for)
    left the process table as one and was a debt of its parent's; one auto-reaped (SIGCHLD ignored) was one for
    good: either way the parent's 512 KiB were taken for the helper's bytes coming back, and counted as nothing.
    Reaped at once, its MiB is in the parent's counters, and counted once."""
    io_readable()
    monkeypatch.setattr("supervisor.evidence.iowatch.TREE_REFRESH_S", 0.2)  # (the zombie found as soon as it is one)
    done = tmp_path / "done"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, signal, time
if {helper!r} == "auto-reaped":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    time.sleep(0.6)
    with open({str(tmp_path / "helper.bin")!r}, "wb") as out:
        out.write(bytes(1 << 20))
    time.sleep(0.6)
    os._exit(0)
if {helper!r} == "reaped":
    os.waitpid(pid, 0)
time.sleep(2)  # (the zombie read a few times)
with open({str(tmp_path / "parent.bin")!r}, "wb") as out:
    for _ in range(8):
        out.write(bytes(1 << 16))
        out.flush()
        time.sleep(0.1)
os.close(os.open({str(done)!r}, os.O_CREAT | os.O_WRONLY))
time.sleep(30)
"""], env={**os.environ, TAG_ENV: "iotest.5"}, start_new_session=True)
    probe = IoProbe()
    watch = probe.watch(0.2, from_zero=True)
    try:
        watch.follow([(parent.pid, "iotest.5")])
        wait_for(done.exists, 20, 0.05)
        time.sleep(0.6)
        latest = watch.latest()
        assert latest is not None and latest.readable
        assert latest.procs == (2 if helper == "zombie" else 1), latest  # a zombie is read until its reap
        assert 1.5 * MIB <= latest.written < 1.5 * MIB + 64 * 1024, latest
    finally:
        watch.release()
        probe.close()
        parent.kill()
        parent.wait(5)


def test_a_quiet_tree_moves_nothing_and_a_reader_moves_bytes(tmp_path: Path) -> None:
    io_readable()
    data = tmp_path / "data"
    data.write_bytes(os.urandom(4 * MIB))
    quiet = spawn("exec sleep 30", "iotest.2")
    reader = subprocess.Popen([sys.executable, "-c", f"""
import hashlib, time
end = time.monotonic() + 30
while time.monotonic() < end:
    with open({str(data)!r}, "rb") as fh:
        hashlib.blake2b(fh.read()).hexdigest()
    time.sleep(0.05)
"""], env={**os.environ, TAG_ENV: "iotest.3"}, start_new_session=True)
    probe = IoProbe()
    quiet_watch, reader_watch = probe.watch(0.2), probe.watch(0.2)
    try:
        quiet_watch.follow([(quiet.pid, "iotest.2")])
        reader_watch.follow([(reader.pid, "iotest.3")])
        wait_for(lambda: (r := reader_watch.latest()) is not None and r.moved > 8 * MIB, 15, 0.05)
        time.sleep(1.0)
        quiet_latest, reader_latest = quiet_watch.latest(), reader_watch.latest()
        assert quiet_latest is not None and quiet_latest.readable and quiet_latest.procs == 1
        assert quiet_latest.moved == 0, quiet_latest  # asleep: alive, but no byte moved
        assert reader_latest is not None and reader_latest.written < MIB  # it only reads
    finally:
        quiet_watch.release()
        reader_watch.release()
        probe.close()
        for p in (quiet, reader):
            p.kill()
            p.wait(5)


def test_a_process_its_cgroup_alone_knows_counts_for_every_watch_given_the_cgroup(tmp_path: Path) -> None:
    """A daemon that left the trees with its environment cleared (setsid, env -i: no group, no parent, no tag) is
    found by the phase's cgroup (its cgroup.procs, as the phase's sweep reads it): its bytes are the stall watch's
    and the download figure's (from_zero), and no watch that was not given the cgroup counts them."""
    io_readable()
    pidfile = tmp_path / "writer.pid"
    writer = tmp_path / "writer.py"
    writer.write_text(f"""
import os, time
with open({str(pidfile) + ".tmp"!r}, "w") as f:
    f.write(str(os.getpid()))
os.replace({str(pidfile) + ".tmp"!r}, {str(pidfile)!r})
with open({str(tmp_path / "out.bin")!r}, "wb") as out:
    for _ in range(100):
        out.seek(0)
        out.write(bytes(1 << 18))
        out.flush()
        time.sleep(0.1)
""")
    # (its parent gone at once: re-parented outside our descendants, as a daemon is without a subreaper)
    subprocess.run(["sh", "-c", f"setsid env -i {sys.executable} {writer} >/dev/null 2>&1 &"], check=True)
    wait_for(pidfile.exists, 10, 0.05)
    escapee = int(pidfile.read_text())
    cgroup = tmp_path / "prover-1-work"  # laid out as a v1 phase cgroup: only cgroup.procs is read
    cgroup.mkdir()
    root = spawn("exec sleep 30", "iotest.7")
    (cgroup / "cgroup.procs").write_text(f"{root.pid}\n{escapee}\n")
    probe = IoProbe()
    stall, download, trees_only = probe.watch(0.2), probe.watch(0.2, from_zero=True), probe.watch(0.2)
    try:
        stall.follow([(root.pid, "iotest.7")], MemoryCgroup(cgroup, "v1"))
        download.follow([(root.pid, "iotest.7")], MemoryCgroup(cgroup, "v1"))
        trees_only.follow([(root.pid, "iotest.7")])
        wait_for(lambda: all((r := w.latest()) is not None and r.written >= 2 * MIB for w in (stall, download)),
                 15, 0.05)
        for watch in (stall, download):
            latest = watch.latest()
            assert latest is not None and latest.procs == 2, latest  # the sleeper, and the writer its cgroup knows
        alone = trees_only.latest()
        assert alone is not None and alone.procs == 1 and alone.written == 0, alone
    finally:
        for watch in (stall, download, trees_only):
            watch.release()
        probe.close()
        root.kill()
        root.wait(5)
        os.kill(escapee, signal.SIGKILL)


def test_a_downloader_that_fills_its_file_with_zeros_before_its_control_file_is_seen_allocating(
        tmp_path: Path) -> None:
    """A process named as an allocating downloader (here a small one, its name set as aria2c's, doing what aria2c
    does where fallocate is refused): the file written whole with zeros, a slow flush, the control file, then the
    data. The I/O thread says its zeros are allocation, the data not, and which file it holds open meanwhile."""
    io_readable()
    target = tmp_path / "f.params"
    downloader = subprocess.Popen([sys.executable, "-c", f"""
import ctypes, os, time
ctypes.CDLL(None).prctl(15, b"aria2c", 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm says aria2c
fd = os.open({str(target)!r}, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(16):
    os.write(fd, bytes(1 << 20))
time.sleep(1.5)  # the flush of the zeros: no write, no control file yet
with open({str(target) + ".aria2"!r}, "wb") as ctl:
    ctl.write(b"ctl")
time.sleep(1.5)
for i in range(4):
    os.pwrite(fd, b"d" * (1 << 20), i << 20)
    time.sleep(0.3)
time.sleep(30)
"""], env={**os.environ, TAG_ENV: "iotest.4"}, start_new_session=True, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # (its one file: the download)
    probe = IoProbe()
    watch = probe.watch(0.2, from_zero=True, allocators=frozenset({"aria2c"}))
    others = probe.watch(0.2, from_zero=True)  # no allocator named: every byte is written
    try:
        watch.follow([(downloader.pid, "iotest.4")])
        others.follow([(downloader.pid, "iotest.4")])
        wait_for(lambda: (r := watch.latest()) is not None and r.written >= 16 * MIB, 20, 0.05)
        flushing = watch.latest()
        assert flushing is not None and flushing.allocating == 1 and flushing.allocated >= 16 * MIB, flushing
        wait_for(lambda: (r := watch.latest()) is not None and r.written >= 20 * MIB, 20, 0.05)
        time.sleep(0.5)
        latest, plain = watch.latest(), others.latest()
        assert latest is not None and plain is not None
        assert 16 * MIB <= latest.allocated < 16 * MIB + 4096, latest  # the zeros (and the control file's bytes)
        assert latest.written - latest.allocated == 4 * MIB and latest.allocating == 0, latest  # the data
        assert plain.allocated == 0 and plain.written == latest.written, plain
        st = target.stat()
        assert latest.held == frozenset({(st.st_dev, st.st_ino)}), latest
        assert plain.held == frozenset(), plain
    finally:
        watch.release()
        others.release()
        probe.close()
        downloader.kill()
        downloader.wait(5)


def test_a_watch_that_names_allocators_reads_the_whole_table_only_every_tree_refresh() -> None:
    """Between two whole readings (TREE_REFRESH_S) its table is brought up to date at each reading: newcomers and
    the few processes whose name may have changed are read, not every process of the machine (1% of a core and
    more: docs/benchmarks.md)."""
    tables: list[ProcessTable] = []

    def table() -> ProcessTable:
        tables.append(ProcessTable(zombies=True))
        return tables[-1]

    child = spawn("exec sleep 30", "iotest.6")
    probe = IoProbe(table=table)
    watch = probe.watch(0.2, allocators=frozenset({"aria2c"}))
    try:
        watch.follow([(child.pid, "iotest.6")])
        wait_for(lambda: (r := watch.latest()) is not None and r.seq >= 5, 10, 0.05)  # five readings, a second
        assert len(tables) == 1 and tables[0].scans == 1, tables[0].scans
    finally:
        watch.release()
        probe.close()
        child.kill()
        child.wait(5)


# ================================================================ the thread's own health


class _BrokenTable:
    """A process table whose every reading raises (a bug, or no file descriptor left for /proc)."""

    def snapshot(self, newer_than: float = 0.0) -> None:
        raise OSError(24, "Too many open files")


def test_an_io_thread_that_reads_nothing_is_said_blind_once_and_says_why() -> None:
    probe = IoProbe(table=_BrokenTable)
    assert probe.state.current == "idle"  # nothing followed yet: never blind, however long
    assert probe.state.check(time.monotonic() + 3600) == []
    probe.state.window_s = 0.3
    watch = probe.watch(every_s=0.05)
    try:
        watch.follow([(os.getpid(), "no-tag")])
        wait_for(lambda: probe.state.misses >= 2, timeout=10)
        assert watch.latest() is None  # no reading made up
        time.sleep(0.4)
        lines = probe.state.check()
        assert lines == [lines[0]] and lines[0].startswith("I/O watch: no reading for ")
        assert lines[0].endswith("(its window is 0.3 s): OSError: [Errno 24] Too many open files"), lines
        assert probe.state.blind_why() == "OSError: [Errno 24] Too many open files"
        assert probe.state.check() == []  # said once
        assert probe._thread is not None and probe._thread.is_alive()  # the only reader goes on
    finally:
        watch.release()
        probe.close()


def test_an_io_thread_that_reads_is_reading_and_idle_once_nothing_is_followed() -> None:
    probe = IoProbe()
    watch = probe.watch(every_s=0.05)
    try:
        watch.follow([(os.getpid(), "no-tag")])
        wait_for(lambda: probe.state.readings >= 1, timeout=10)
        assert probe.state.current == "reading" and probe.state.blind_why() is None
        watch.follow([])
        wait_for(lambda: probe.state.current == "idle", timeout=10)
    finally:
        watch.release()
        probe.close()
