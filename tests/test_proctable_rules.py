"""supervisor.engine.trees in-process: Descendants.tree on tables of the test's own (a leader already gone whose group
lives on, a tagged escapee's own descendants, a pid loop that must not hang), and ProcessTable readings of a
/proc laid out in a temp dir (grandchildren found, a zombie left out but its children kept, or kept with its tag
where the table keeps zombies, a malformed stat left out, a tag read once per process life and again for a
reused pid, a tag that is not UTF-8), the I/O thread's readings brought up to date between whole ones (a newcomer,
a fork that execs, a young process renamed, a member re-parented, one gone, and what waits for the whole reading),
plus one reading of the real /proc with a real child.
tests/test_many_daemons.py covers sharing and renewal of readings and a process vanishing mid-read; not repeated
here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import wait_for

from supervisor.engine.trees import SNAPSHOT_MAX_AGE_S, TAG_ENV, Descendants, Proc, ProcessTable

ME = os.getpid()


def pids(procs: list[Proc]) -> set[int]:
    return {p.pid for p in procs}


def test_a_leader_that_is_gone_still_has_its_group_and_their_children() -> None:
    """The leader was reaped; what it forked into its group (and their children, whatever their group) remains."""
    snap = Descendants([Proc(11, ME, 10, None), Proc(12, 11, 12, None), Proc(13, ME, 13, None)], 0.0)
    assert pids(snap.tree(10, "t.10")) == {11, 12}


def test_a_tagged_escapee_brings_its_own_descendants() -> None:
    snap = Descendants([Proc(10, ME, 10, "t.10"), Proc(20, 1, 20, "t.10"), Proc(21, 20, 20, None),
                     Proc(22, 21, 22, None), Proc(30, ME, 30, "t.30")], 0.0)
    assert pids(snap.tree(10, "t.10")) == {10, 20, 21, 22}
    assert pids(snap.tree(30, "t.30")) == {30}, "another child's tree is not this one's"


def test_an_unknown_leader_with_no_group_or_tag_is_an_empty_tree() -> None:
    snap = Descendants([Proc(10, ME, 10, "t.10")], 0.0)
    assert snap.tree(99, "t.99") == []


def test_each_process_is_in_a_tree_once_even_through_a_parent_loop() -> None:
    """A table read while pids were reused can show a loop of parents: the walk ends, nobody counted twice."""
    snap = Descendants([Proc(10, 11, 10, "t"), Proc(11, 10, 10, "t")], 0.0)
    tree = snap.tree(10, "t")
    assert sorted(p.pid for p in tree) == [10, 11]


def test_the_snapshot_indexes_by_pid() -> None:
    procs = [Proc(10, ME, 10, None), Proc(11, 10, 10, "x")]
    snap = Descendants(procs, 42.0)
    assert snap.taken_at == 42.0 and snap.procs == {10: procs[0], 11: procs[1]}


class FakeProc:
    """A /proc of files: ``add`` writes one process's stat and environ as the kernel lays them out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "self").mkdir(parents=True)

    def add(self, pid: int, ppid: int, *, pgid: int | None = None, state: str = "S", started: int = 100,
            env: bytes | None = b"PATH=/bin\0", comm: str = "sleep") -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        fields = [state, str(ppid), str(pgid if pgid is not None else pid)] + ["0"] * 16 + [str(started)]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0\n")
        if env is not None:
            (d / "environ").write_bytes(env)
        elif (d / "environ").exists():
            (d / "environ").unlink()

    def remove(self, pid: int) -> None:
        d = self.root / str(pid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()

    def table(self) -> tuple[ProcessTable, list[float]]:
        now = [0.0]
        return ProcessTable(clock=lambda: now[0], proc=str(self.root)), now


def tagged(tag: str) -> bytes:
    return b"A=1\0" + TAG_ENV.encode() + b"=" + tag.encode() + b"\0B=2\0"


def test_grandchildren_are_descendants_and_strangers_are_not(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME)
    proc.add(101, 100)
    proc.add(102, 101)
    proc.add(200, 1)  # not below the supervisor
    proc.add(201, 200)
    table, _ = proc.table()
    assert sorted(table.snapshot().procs) == [100, 101, 102]


def test_a_zombie_is_left_out_but_its_children_are_kept(tmp_path: Path) -> None:
    """A zombie cannot be signalled; what it forked before dying can, and still shows it as parent until
    reparented."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, state="Z")
    proc.add(101, 100)
    table, _ = proc.table()
    assert sorted(table.snapshot().procs) == [101]


def test_a_table_that_keeps_zombies_has_each_with_the_tag_it_had_alive(tmp_path: Path) -> None:
    """The I/O thread's table: a zombie's counters are read until its reap (iowatch.py). Its environment went with
    its memory (it reads empty): the tag is the one read while it lived, none for one first seen dead."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"))
    now = [0.0]
    table = ProcessTable(clock=lambda: now[0], proc=str(proc.root), zombies=True)
    assert table.snapshot().procs[100].tag == "t.1"
    proc.add(100, ME, state="Z", env=b"")
    proc.add(101, 100)  # (forked before 100 died, not reparented yet)
    proc.add(102, ME, state="Z", env=b"")
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    snap = table.snapshot()
    assert snap.procs == {100: Proc(100, ME, 100, "t.1"), 101: Proc(101, 100, 101, None),
                          102: Proc(102, ME, 102, None)}
    assert pids(snap.tree(100, "t.1")) == {100, 101}


def test_a_name_with_parentheses_and_spaces_is_read_past(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, pgid=77, comm="x) S 1 1 (evil")
    table, _ = proc.table()
    assert table.snapshot().procs[100] == Proc(100, ME, 77, None)
    assert table.snapshot().procs[100].name == "x) S 1 1 (evil", "the name is all between the first ( and last )"


def test_a_malformed_stat_is_left_out(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME)
    proc.add(101, ME)
    (proc.root / "101" / "stat").write_text("101 (short) S 1\n")
    (proc.root / "102").mkdir()
    (proc.root / "102" / "stat").write_text("102 (bad) S notanumber 1 0\n")
    table, _ = proc.table()
    assert sorted(table.snapshot().procs) == [100]


def test_a_tag_is_read_once_in_a_process_life(tmp_path: Path) -> None:
    """Its environment does not change: a later reading keeps the tag even if the file now says otherwise."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"))
    table, now = proc.table()
    assert table.snapshot().procs[100].tag == "t.1"
    (proc.root / "100" / "environ").write_bytes(tagged("t.2"))
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[100].tag == "t.1" and table.scans == 2


def test_a_reused_pid_has_its_tag_read_again(tmp_path: Path) -> None:
    """Same pid, another start time: another process, whose environment is read afresh."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"), started=100)
    table, now = proc.table()
    assert table.snapshot().procs[100].tag == "t.1"
    proc.add(100, ME, env=tagged("t.9"), started=555)
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[100].tag == "t.9"


def test_a_process_gone_from_a_reading_is_forgotten(tmp_path: Path) -> None:
    """The tag cache holds only the processes of the last reading: one that left and came back with the same
    pid and start time (another /proc namespace's numbering, a fake) is read again."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"))
    table, now = proc.table()
    table.snapshot()
    proc.remove(100)
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs == {}
    proc.add(100, ME, env=tagged("t.3"))
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[100].tag == "t.3"


def test_a_tag_that_is_not_utf8_is_read_with_replacement(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=TAG_ENV.encode() + b"=t.\xff\0")
    table, _ = proc.table()
    assert table.snapshot().procs[100].tag == "t.\ufffd"


def test_an_environment_without_the_tag_or_an_empty_one_is_no_tag(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=b"")
    proc.add(101, ME, env=b"NOT_" + TAG_ENV.encode() + b"=x\0" + TAG_ENV.encode() + b"X=y\0")
    table, _ = proc.table()
    snap = table.snapshot()
    assert snap.procs[100].tag is None and snap.procs[101].tag is None


def test_a_reading_of_the_real_proc_finds_a_real_child_and_its_tag(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "30"], env={**os.environ, TAG_ENV: "rules.1"}, process_group=0)
    try:
        # Popen returns once the exec closed its close-on-exec pipe, a moment before the kernel lays the new
        # environment out: a reading in that moment finds no tag yet (never another one), and the next finds it.
        table, readings = ProcessTable(), []  # (read anew once the last is SNAPSHOT_MAX_AGE_S old)
        assert wait_for(lambda: readings.append(table.snapshot()) or readings[-1].procs[child.pid].tag, timeout=10)
        assert {reading.procs[child.pid].tag for reading in readings} <= {None, "rules.1"}
        snap = readings[-1]
        assert snap.procs[child.pid] == Proc(child.pid, ME, child.pid, "rules.1")
        assert pids(snap.tree(child.pid, "rules.1")) == {child.pid}
    finally:
        child.kill()
        child.wait(10)
    assert child.pid not in ProcessTable().snapshot().procs, "reaped: gone from a fresh reading"


# ---------------------------------------------------------------- readings brought up to date (ProcessTable.reading)

EVERY = 5.0  # the whole table's period in these tests (the I/O thread's TREE_REFRESH_S)
BOOTED = 1000.0  # the fake boot clock at the fake monotonic clock's 0: a process started at FakeProc's 1 s is old


def follower(proc: FakeProc) -> tuple[ProcessTable, list[float]]:
    """The I/O thread's kind of table (zombies kept), on a fake clock and a boot clock that follows it."""
    now = [0.0]
    return ProcessTable(clock=lambda: now[0], proc=str(proc.root), zombies=True,
                        boottime=lambda: BOOTED + now[0]), now


def read_at(table: ProcessTable, now: list[float], t: float) -> dict[int, Proc]:
    now[0] = t
    return table.reading(EVERY, newcomers=True).procs


def test_a_process_born_between_whole_readings_is_found_at_the_next_update_with_its_name_and_tag(
        tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, comm="curio")
    table, now = follower(proc)
    assert sorted(read_at(table, now, 0.0)) == [100] and table.scans == 1
    proc.add(101, 100, comm="aria2c", env=tagged("t.1"))
    proc.add(102, 101, comm="sleep", env=b"")  # (caught inside its execve: no environment yet)
    proc.add(300, 1, comm="aria2c")  # a stranger's
    procs = read_at(table, now, 1.0)
    assert sorted(procs) == [100, 101, 102] and table.scans == 1 and table.updates == 1
    assert procs[101] == Proc(101, 100, 101, "t.1") and procs[101].name == "aria2c"
    assert procs[102].tag is None
    (proc.root / "102" / "environ").write_bytes(tagged("t.1"))
    assert read_at(table, now, 2.0)[102].tag == "t.1", "a tag not settled is read again at the next update"


def test_a_fork_that_still_has_its_parents_name_is_seen_renamed_once_it_execs(tmp_path: Path) -> None:
    """Go's fork and exec (curio starting aria2c) leave a moment in which the child carries its parent's name."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, comm="curio")
    table, now = follower(proc)
    read_at(table, now, 0.0)
    proc.add(101, 100, comm="curio")
    assert read_at(table, now, 1.0)[101].name == "curio"
    proc.add(101, 100, comm="aria2c")  # its exec
    assert read_at(table, now, 2.0)[101].name == "aria2c" and table.scans == 1


def test_a_young_process_is_seen_renamed_at_the_next_update(tmp_path: Path) -> None:
    """sh -c "exec aria2c ...", or a process that names itself: soon after its first reading, with a name of its
    own already. Youth is by its start time (clock ticks since boot)."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, comm="python")
    table, now = follower(proc)
    read_at(table, now, 0.0)
    started = int((BOOTED + 0.5) * os.sysconf("SC_CLK_TCK"))
    proc.add(101, 100, comm="sh", started=started)
    assert read_at(table, now, 1.0)[101].name == "sh"
    proc.add(101, 100, comm="aria2c", started=started)
    assert read_at(table, now, 2.0)[101].name == "aria2c" and table.scans == 1


def test_a_rename_no_rule_covers_waits_for_the_whole_reading_every_period(tmp_path: Path) -> None:
    """An old process, named otherwise than its parent, that execs (or a stranger whose pid a member's child took
    between two readings): nothing says it changed but the whole reading, which comes every EVERY seconds."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, comm="python")
    proc.add(101, 100, comm="sh")
    proc.add(200, 1, comm="cron")
    table, now = follower(proc)
    read_at(table, now, 0.0)
    proc.add(101, 100, comm="aria2c")
    proc.add(200, 101, comm="aria2c", started=555)  # (pid 200 reused below a member)
    for t in (1.0, 2.0, 3.0, 4.0):
        procs = read_at(table, now, t)
        assert procs[101].name == "sh" and 200 not in procs
    procs = read_at(table, now, 5.0)
    assert procs[101].name == "aria2c" and procs[200].name == "aria2c"
    assert table.scans == 2 and table.updates == 4
    for t in (6.0, 7.0, 8.0, 9.0, 10.0):
        read_at(table, now, t)
    assert table.scans == 3 and table.updates == 8


def test_a_reparented_member_gets_its_new_parent_and_a_process_gone_is_dropped(tmp_path: Path) -> None:
    """Its parent gone, the kernel gives it another: us (a subreaper: still ours), or init (no longer ours)."""
    proc = FakeProc(tmp_path / "proc")  # (old, each named otherwise than its parent: no other rule reads them)
    proc.add(100, ME, comm="sh")
    proc.add(101, 100, comm="python")
    proc.add(102, 101)
    proc.add(103, 101)
    proc.add(104, 100, state="Z", comm="true")
    table, now = follower(proc)
    assert sorted(read_at(table, now, 0.0)) == [100, 101, 102, 103, 104]
    proc.remove(101)
    proc.add(102, ME)
    proc.add(103, 1)
    procs = read_at(table, now, 1.0)
    assert sorted(procs) == [100, 102, 104], "a zombie stays while it is listed"
    assert procs[102].ppid == ME and table.scans == 1
    proc.remove(104)  # reaped
    assert sorted(read_at(table, now, 2.0)) == [100, 102]


def test_between_whole_readings_a_follower_without_newcomers_keeps_the_last_and_snapshots_share_only_whole_ones(
        tmp_path: Path) -> None:
    """A watch that names no allocating downloader waits for the whole reading; a stop (snapshot) never takes an
    update for a whole reading."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME)
    table, now = follower(proc)
    first = table.reading(EVERY, newcomers=False)
    proc.add(101, 100)
    now[0] = 1.0
    assert table.reading(EVERY, newcomers=False) is first and table.updates == 0
    assert sorted(table.reading(EVERY, newcomers=True).procs) == [100, 101] and table.scans == 1
    assert sorted(table.snapshot().procs) == [100, 101] and table.scans == 2
